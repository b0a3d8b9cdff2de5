//! One delivery's trace through the whole stack, the services running as
//! real processes that export to a collector on loopback: a queued GitHub
//! job's webhook is one trace from ingest through the job-tracker and the
//! scaler to the allocator and provider calls that made its runner.

use std::time::Duration;

use runyard_bus::TraceParent;
use runyard_testkit::eventually;
use runyard_testkit::otlp::{AnyValue, Collector, Span, attribute, hex_id};
use serde_json::json;

use crate::retry::{Stack, WAIT};

const POOL: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "60"]

[[pools]]
name = "linux"
forge = "github"
scope = { org = "acme" }
labels = ["self-hosted", "linux"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 5

[scaler]
lease_ttl = "2s"
tick = "100ms"
sync_interval = "1s"
"#;

#[tokio::test]
async fn a_queued_jobs_trace_runs_from_ingest_to_the_provider_call() {
    let collector = Collector::start().await;
    let stack = Stack::start_with(
        POOL,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    )
    .await;
    let job_id = stack.github.add_job(
        "acme",
        "app",
        runyard_testkit::fake_github::FakeJob::queued(900, "build", &["self-hosted", "linux"]),
    );
    let sender = TraceParent::new_root();
    let job = json!({
        "id": job_id, "run_id": 900, "run_attempt": 1, "name": "build",
        "workflow_name": "CI", "head_branch": "main",
        "labels": ["self-hosted", "linux"], "status": "queued", "conclusion": null,
        "runner_id": null, "runner_name": null,
    });
    stack
        .github_job_with(
            &job,
            "queued",
            "d-traced",
            &[("traceparent", sender.to_string())],
        )
        .await;

    let trace = format!("{:032x}", sender.trace_id);
    let named = |spans: &[(String, Span)], name: &str| -> Vec<(String, Span)> {
        spans
            .iter()
            .filter(|(_, s)| hex_id(&s.trace_id) == trace && s.name == name)
            .cloned()
            .collect()
    };
    let wanted = [
        "ingest GitHub webhook",
        "job-tracker apply",
        "scaler observe",
        "scaler create runner",
        "allocator Recommend",
        "provider CreateInstance",
    ];
    let spans = eventually(WAIT, || async {
        let spans = collector.spans();
        // Spans reach the collector in batches, from four processes: wait
        // for the tracker's span of the queued job (a child of ingest's) too.
        let ingest = named(&spans, "ingest GitHub webhook");
        let tracked = named(&spans, "job-tracker apply")
            .iter()
            .any(|(_, s)| ingest.iter().any(|(_, i)| s.parent_span_id == i.span_id));
        (tracked && wanted.iter().all(|w| !named(&spans, w).is_empty())).then_some(spans)
    })
    .await
    .unwrap_or_else(|| {
        let seen: Vec<String> = collector
            .spans()
            .iter()
            .map(|(svc, s)| format!("{svc}: {} {}", s.name, hex_id(&s.trace_id)))
            .collect();
        panic!(
            "the trace's spans; seen {seen:#?}\nscaler log:\n{}",
            stack.log("scaler")
        )
    });
    let one = |name: &str| -> (String, Span) {
        named(&spans, name)
            .into_iter()
            .next()
            .unwrap_or_else(|| panic!("{name}"))
    };

    // Each hop is a child of the one before, across the processes.
    let (svc, ingest) = one("ingest GitHub webhook");
    assert_eq!(svc, "runyard-ingest");
    assert_eq!(
        hex_id(&ingest.parent_span_id),
        format!("{:016x}", sender.span_id)
    );
    let queued_hops = |name: &str| named(&spans, name);
    assert!(
        queued_hops("job-tracker apply")
            .iter()
            .any(|(svc, s)| svc == "runyard-job-tracker" && s.parent_span_id == ingest.span_id),
        "the tracker's span of the queued job is a child of ingest's"
    );
    let (svc, observe) = one("scaler observe");
    assert_eq!(svc, "runyard-scaler");
    assert_eq!(observe.parent_span_id, ingest.span_id);
    let (_, create) = one("scaler create runner");
    assert_eq!(create.parent_span_id, ingest.span_id);
    assert_eq!(
        attribute(&create, "runyard.job_id"),
        Some(AnyValue::IntValue(job_id as i64))
    );
    let (svc, recommend) = one("allocator Recommend");
    assert_eq!(svc, "runyard-allocator");
    assert_eq!(recommend.parent_span_id, create.span_id);
    let (_, provider) = one("provider CreateInstance");
    assert_eq!(provider.parent_span_id, create.span_id);
    assert_eq!(provider.status.clone().unwrap_or_default().code, 1, "OK");
    // The runner events the creation published are projected in its trace.
    let runner_applies = eventually(Duration::from_secs(20), || async {
        let n = named(&collector.spans(), "job-tracker apply")
            .iter()
            .filter(|(_, s)| s.parent_span_id == create.span_id)
            .count();
        (n >= 2).then_some(n)
    })
    .await;
    assert!(
        runner_applies.is_some(),
        "RunnerRequested and RunnerCreated projected as children of the creation"
    );
    stack.stop().await;
}
