//! ingest against a real nats-server: every route, answer code and rule of
//! the ingest contract.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use runyard_events::{Body, Conclusion, Event, Forge, JobStatus, Namespace};
use runyard_ingest::{App, Config};
use runyard_testkit::{
    NatsCluster, NatsServer, TestNats, decode_events, eventually, fixture, github_signature,
    stream_messages, try_stream_messages, unique_namespace,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

// Secrets as `openssl rand -hex 32` makes them (ingest refuses weak ones).
const GH_SECRET: &str = "13b075d250b02f21ffc8e1d1eeea8e4f40fd0b1da8b6b8a95cba25502f5c7007";
const GL_TOKEN: &str = "4e7d27121ad235a8357f11cb80685bf038d33c1094daf052c1869b4a41c81cac";
const USAGE_TOKEN: &str = "1b6e1deb7b9da1461b3ce8d8b4ae36fa9991f106c9be3f63495b31ec59200b00";

struct Harness {
    _nats: TestNats,
    ns: Namespace,
    base: String,
    http: reqwest::Client,
    nats: async_nats::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

fn test_config(nats_url: String, ns: &Namespace) -> Config {
    Config {
        bus: runyard_config::Bus {
            nats_url,
            namespace: ns.to_string(),
        },
        ingest_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        github_webhook_secret: Some(GH_SECRET.to_owned().into()),
        gitlab_webhook_token: Some(GL_TOKEN.to_owned().into()),
        usage_token: Some(USAGE_TOKEN.to_owned().into()),
        ingest_ack_timeout: Duration::from_secs(2),
        ..Config::default()
    }
}

impl Harness {
    async fn start() -> Self {
        Self::start_with(TestNats::get().await, |_| {}).await
    }

    async fn start_with(nats: TestNats, tweak: impl FnOnce(&mut Config)) -> Self {
        runyard_telemetry::install_crypto_provider();
        let ns = unique_namespace();
        let mut config = test_config(nats.url(), &ns);
        tweak(&mut config);
        let app = App::build(config).await.expect("app builds");
        let addr = app.local_addr();
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        // Every server of a cluster's comma-separated list.
        let servers: Vec<String> = nats.url().split(',').map(str::to_owned).collect();
        let client = async_nats::connect(servers).await.expect("nats client");
        Self {
            _nats: nats,
            ns,
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            nats: client,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    /// A GitHub delivery's request, signed over `signed` (its body), without
    /// the body and its content type.
    fn github_post(&self, event: &str, delivery: &str, signed: &[u8]) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}/webhooks/github", self.base))
            .header("X-GitHub-Event", event)
            .header("X-GitHub-Delivery", delivery)
            .header("X-GitHub-Hook-ID", "42")
            .header("X-Hub-Signature-256", github_signature(GH_SECRET, signed))
    }

    async fn github(&self, event: &str, delivery: &str, body: &str) -> (u16, Value) {
        let req = self
            .github_post(event, delivery, body.as_bytes())
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        send(req).await
    }

    async fn gitlab(&self, event: &str, key: &str, body: &str) -> (u16, Value) {
        let req = self
            .http
            .post(format!("{}/webhooks/gitlab", self.base))
            .header("X-Gitlab-Event", event)
            .header("Idempotency-Key", key)
            .header("X-Gitlab-Event-UUID", format!("uuid-{key}"))
            .header("X-Gitlab-Instance", "https://gitlab.example.com")
            .header("X-Gitlab-Token", GL_TOKEN)
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        send(req).await
    }

    async fn usage(&self, body: &str) -> (u16, Value) {
        self.usage_with(USAGE_TOKEN, body).await
    }

    async fn usage_with(&self, token: &str, body: &str) -> (u16, Value) {
        let req = self
            .http
            .post(format!("{}/v1/usage", self.base))
            .bearer_auth(token)
            .header("Content-Type", "application/json")
            .body(body.to_owned());
        send(req).await
    }

    async fn events(&self) -> Vec<async_nats::jetstream::Message> {
        stream_messages(&self.nats, &self.ns.events_stream()).await
    }

    async fn raw(&self) -> Vec<async_nats::jetstream::Message> {
        stream_messages(&self.nats, &self.ns.raw_stream()).await
    }

    async fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("join").expect("clean shutdown");
        }
    }
}

async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let resp = req.send().await.expect("request sent");
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

fn job(event: &Event) -> &runyard_events::JobObserved {
    match event.body.as_ref() {
        Some(Body::JobObserved(j)) => j,
        other => panic!("expected JobObserved, got {other:?}"),
    }
}

fn header<'a>(m: &'a async_nats::jetstream::Message, name: &str) -> Option<&'a str> {
    m.headers.as_ref()?.get(name).map(|v| v.as_str())
}

#[tokio::test]
async fn github_workflow_job_lifecycle_becomes_job_events() {
    let mut h = Harness::start().await;
    let cases = [
        ("queued", JobStatus::Queued),
        ("waiting", JobStatus::Waiting),
        ("in_progress", JobStatus::InProgress),
        ("completed", JobStatus::Completed),
    ];
    for (i, (action, _)) in cases.iter().enumerate() {
        let body = fixture(&format!("github_workflow_job_{action}.json"));
        let (status, answer) = h.github("workflow_job", &format!("d-{i}"), &body).await;
        assert_eq!(status, 202, "{action}: {answer}");
        assert_eq!(answer["event_id"], format!("github:d-{i}"));
        assert_eq!(answer["duplicate"], false);
    }
    let msgs = h.events().await;
    assert_eq!(msgs.len(), 4);
    let events = decode_events(&msgs);
    let payload: Value =
        serde_json::from_str(&fixture("github_workflow_job_completed.json")).unwrap();
    let job_id = payload["workflow_job"]["id"].as_u64().unwrap();
    for ((msg, event), (action, status)) in msgs.iter().zip(&events).zip(cases) {
        assert_eq!(
            msg.subject.as_str(),
            format!("{}.v1.job.github.{action}", h.ns),
            "subject"
        );
        assert_eq!(header(msg, "Nats-Msg-Id"), Some(event.id.as_str()));
        assert_eq!(header(msg, "Runyard-Event-Type"), Some("JobObserved"));
        assert!(header(msg, "traceparent").is_some_and(|t| t.starts_with("00-")));
        let j = job(event);
        assert_eq!(j.status(), status);
        let key = j.job.as_ref().unwrap();
        assert_eq!((key.forge(), key.job_id), (Forge::Github, job_id));
        assert_eq!(key.instance, "github.com");
        assert_eq!(
            j.pipeline_id,
            payload["workflow_job"]["run_id"].as_u64().unwrap()
        );
        assert_eq!(
            j.project,
            payload["repository"]["full_name"].as_str().unwrap()
        );
        assert!(!j.labels.is_empty());
        let source = event.source.as_ref().unwrap();
        assert_eq!(source.hook_id, "42");
        assert!(event.received_at.is_some() && event.occurred_at.is_some());
    }
    let done = job(&events[3]);
    assert_eq!(done.conclusion(), Conclusion::Failure);
    assert!(done.completed_at.is_some() && done.started_at.is_some());
    assert!(!done.runner_name.is_empty());
    // Every accepted delivery is also kept raw, without secrets.
    let raw = h.raw().await;
    assert_eq!(raw.len(), 4);
    assert_eq!(
        raw[0].payload.as_ref(),
        fixture("github_workflow_job_queued.json").as_bytes()
    );
    assert_eq!(header(&raw[0], "Http-x-github-delivery"), Some("d-0"));
    h.stop().await;
}

#[tokio::test]
async fn raw_delivery_keeps_request_headers_and_the_delivery_is_one_trace() {
    let mut h = Harness::start().await;
    let sender = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let req = h
        .http
        .post(format!("{}/webhooks/gitlab", h.base))
        .header("X-Gitlab-Event", "Job Hook")
        .header("Idempotency-Key", "hdr-1")
        .header("X-Gitlab-Instance", "https://gitlab.example.com")
        .header("X-Gitlab-Token", GL_TOKEN)
        .header("Content-Type", "application/json")
        .header("traceparent", sender)
        // On the allowlist and repeated: the last is kept.
        .header("X-Forwarded-For", "10.0.0.1")
        .header("X-Forwarded-For", "10.0.0.2")
        // Not on the allowlist: dropped, whatever it may carry.
        .header("X-Proxy-Hop", "edge-1")
        .header("Cookie", "session=s3cret")
        .header("X-Api-Key", "s3cret")
        .body(fixture("gitlab_job_failed.json"));
    let (status, answer) = send(req).await;
    assert_eq!(status, 202, "{answer}");
    let raw = h.raw().await;
    let events = h.events().await;
    assert_eq!((raw.len(), events.len()), (1, 1));
    let r = &raw[0];
    assert_eq!(header(r, "Nats-Msg-Id"), Some("raw:gitlab:hdr-1"));
    assert_eq!(header(r, "Runyard-Event-Type"), Some("RawDelivery"));
    assert_eq!(header(r, "Http-x-gitlab-event"), Some("Job Hook"));
    assert_eq!(header(r, "Http-idempotency-key"), Some("hdr-1"));
    assert_eq!(header(r, "Http-content-type"), Some("application/json"));
    assert_eq!(header(r, "Http-traceparent"), Some(sender));
    assert_eq!(header(r, "Http-x-forwarded-for"), Some("10.0.0.2"));
    for dropped in [
        "Http-x-gitlab-token",
        "Http-x-proxy-hop",
        "Http-cookie",
        "Http-x-api-key",
    ] {
        assert_eq!(header(r, dropped), None, "{dropped} is not kept");
    }
    // The sender's trace, continued in one new span that the raw delivery
    // and its events share.
    let tp = header(r, "traceparent").expect("traceparent");
    assert!(
        tp.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
        "{tp}"
    );
    assert_ne!(tp, sender);
    let e = &events[0];
    assert_eq!(header(e, "traceparent"), Some(tp));
    assert_eq!(header(e, "Runyard-Event-Type"), Some("JobObserved"));
    assert_eq!(header(e, "Nats-Msg-Id"), Some("gitlab:hdr-1:4711:failed"));
    h.stop().await;
}

#[tokio::test]
async fn github_form_encoded_delivery_is_accepted() {
    let mut h = Harness::start().await;
    let json_body = fixture("github_workflow_job_queued.json");
    let form = serde_urlencoded::to_string([("payload", json_body.as_str())]).unwrap();
    let req = h
        .github_post("workflow_job", "form-1", form.as_bytes())
        .header("Content-Type", "application/x-www-form-urlencoded")
        .body(form);
    let (status, answer) = send(req).await;
    assert_eq!(status, 202, "{answer}");
    let events = decode_events(&h.events().await);
    assert_eq!(job(&events[0]).status(), JobStatus::Queued);
    h.stop().await;
}

#[tokio::test]
async fn ping_and_other_events_are_ignored_without_publishing() {
    let mut h = Harness::start().await;
    let (status, answer) = h
        .github(
            "ping",
            "p-1",
            r#"{"zen":"Keep it logically awesome.","hook_id":1}"#,
        )
        .await;
    assert_eq!(status, 200);
    assert!(answer.get("ignored").is_some(), "{answer}");
    let (status, answer) = h.github("issues", "p-2", r#"{"action":"opened"}"#).await;
    assert_eq!(status, 200);
    assert!(answer.get("ignored").is_some(), "{answer}");
    let (status, answer) = h
        .gitlab("Job Hook", "m-1", &fixture("gitlab_job_manual.json"))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.get("ignored").is_some());
    let (status, _) = h
        .gitlab("Push Hook", "m-2", r#"{"object_kind":"push"}"#)
        .await;
    assert_eq!(status, 200);
    assert!(h.events().await.is_empty());
    assert!(h.raw().await.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn gitlab_job_hooks_map_statuses() {
    let mut h = Harness::start().await;
    let cases = [
        ("gitlab_job_pending.json", "queued", JobStatus::Queued),
        (
            "gitlab_job_running.json",
            "in_progress",
            JobStatus::InProgress,
        ),
        ("gitlab_job_failed.json", "completed", JobStatus::Completed),
    ];
    for (i, (file, _, _)) in cases.iter().enumerate() {
        let (status, answer) = h
            .gitlab("Job Hook", &format!("k-{i}"), &fixture(file))
            .await;
        assert_eq!(status, 202, "{file}: {answer}");
        let id = answer["event_id"].as_str().unwrap();
        assert!(id.starts_with(&format!("gitlab:k-{i}:")), "{id}");
    }
    let msgs = h.events().await;
    let events = decode_events(&msgs);
    assert_eq!(events.len(), 3);
    let payload: Value = serde_json::from_str(&fixture("gitlab_job_failed.json")).unwrap();
    for ((msg, event), (_, token, status)) in msgs.iter().zip(&events).zip(cases) {
        assert_eq!(
            msg.subject.as_str(),
            format!("{}.v1.job.gitlab.{token}", h.ns)
        );
        let j = job(event);
        assert_eq!(j.status(), status);
        let key = j.job.as_ref().unwrap();
        assert_eq!(key.instance, "gitlab.example.com");
        assert_eq!(key.job_id, payload["build_id"].as_u64().unwrap());
        assert_eq!(j.pipeline_id, payload["pipeline_id"].as_u64().unwrap());
    }
    let failed = job(&events[2]);
    assert_eq!(failed.conclusion(), Conclusion::Failure);
    assert_eq!(failed.failure_reason, "script_failure");
    assert_eq!(
        events[2].id,
        format!(
            "gitlab:k-2:{}:failed",
            payload["build_id"].as_u64().unwrap()
        )
    );
    h.stop().await;
}

#[tokio::test]
async fn gitlab_pipeline_hook_gives_pipeline_and_job_events() {
    let mut h = Harness::start().await;
    let body = fixture("gitlab_pipeline_failed.json");
    let (status, answer) = h.gitlab("Pipeline Hook", "pipe-1", &body).await;
    assert_eq!(status, 202, "{answer}");
    let payload: Value = serde_json::from_str(&body).unwrap();
    let pid = payload["object_attributes"]["id"].as_u64().unwrap();
    assert_eq!(
        answer["event_id"],
        format!("gitlab:pipe-1:pipeline:{pid}:failed")
    );
    let msgs = h.events().await;
    let events = decode_events(&msgs);
    // One pipeline event and one job event per non-manual build.
    let builds = payload["builds"].as_array().unwrap();
    let non_manual = builds.iter().filter(|b| b["status"] != "manual").count();
    assert_eq!(events.len(), 1 + non_manual);
    let Some(Body::PipelineObserved(p)) = events[0].body.as_ref() else {
        panic!("first event is the pipeline");
    };
    assert_eq!(p.pipeline_id, pid);
    assert_eq!(p.status, "failed");
    assert_eq!(
        msgs[0].subject.as_str(),
        format!("{}.v1.pipeline.gitlab.failed", h.ns)
    );
    let mut ids: Vec<_> = events.iter().map(|e| e.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), events.len(), "every event has its own id");
    for e in &events[1..] {
        assert_eq!(job(e).pipeline_id, pid);
    }
    h.stop().await;
}

#[tokio::test]
async fn usage_report_becomes_usage_event() {
    let mut h = Harness::start().await;
    let (status, answer) = h.usage(&fixture("usage_report.json")).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["event_id"], "usage:gitlab:gitlab.example.com:4711:1");
    let msgs = h.events().await;
    assert_eq!(
        msgs[0].subject.as_str(),
        format!("{}.v1.usage.gitlab", h.ns)
    );
    let events = decode_events(&msgs);
    let Some(Body::UsageReported(u)) = events[0].body.as_ref() else {
        panic!("usage event expected");
    };
    assert_eq!(u.peak_memory_bytes, 9_123_456_789);
    assert_eq!(u.memory_limit_bytes, Some(12_000_000_000));
    assert_eq!(
        u.workload.get("package").map(String::as_str),
        Some("py-torch")
    );
    assert_eq!(u.r#ref, "develop");
    assert!(!u.oom_killed);
    h.stop().await;
}

#[tokio::test]
async fn same_delivery_three_times_is_one_event() {
    let mut h = Harness::start().await;
    let body = fixture("github_workflow_job_queued.json");
    let mut dups = Vec::new();
    for _ in 0..3 {
        let (status, answer) = h.github("workflow_job", "same-delivery", &body).await;
        assert_eq!(status, 202);
        assert_eq!(answer["event_id"], "github:same-delivery");
        dups.push(answer["duplicate"].as_bool().unwrap());
    }
    assert_eq!(dups, [false, true, true]);
    let usage = fixture("usage_report.json");
    assert_eq!(h.usage(&usage).await.1["duplicate"], false);
    assert_eq!(h.usage(&usage).await.1["duplicate"], true);
    assert_eq!(h.events().await.len(), 2);
    assert_eq!(h.raw().await.len(), 2);
    h.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_clear_answer_and_publishes_nothing() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.ingest_max_body = bytesize::ByteSize::kib(64);
    })
    .await;
    let good = fixture("github_workflow_job_queued.json");
    let url = format!("{}/webhooks/github", h.base);
    let signed = |body: &str| github_signature(GH_SECRET, body.as_bytes());

    // Wrong and missing signatures: 401, checked before the body is parsed.
    let (s, a) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", "bad-1")
            .header(
                "X-Hub-Signature-256",
                github_signature("not-the-secret", good.as_bytes()),
            )
            .body(good.clone()),
    )
    .await;
    assert_eq!(s, 401, "{a}");
    let (s, _) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", "bad-2")
            .body("not even json"),
    )
    .await;
    assert_eq!(s, 401);

    // Body problems, each naming the field.
    let payload: Value = serde_json::from_str(&good).unwrap();
    let cases: Vec<(String, &str)> = vec![
        ("{not json".into(), "body"),
        ("[1,2,3]".into(), ""),
        (
            {
                let mut p = payload.clone();
                p["workflow_job"].as_object_mut().unwrap().remove("id");
                p.to_string()
            },
            "workflow_job.id",
        ),
        (
            {
                let mut p = payload.clone();
                p["workflow_job"]["id"] = json!("12345");
                p.to_string()
            },
            "workflow_job.id",
        ),
        (
            {
                let mut p = payload.clone();
                p["workflow_job"]["id"] = json!(-5);
                p.to_string()
            },
            "workflow_job.id",
        ),
        (
            {
                let mut p = payload.clone();
                p["workflow_job"]["created_at"] = json!("1970-01-01T00:00:00Z");
                p.to_string()
            },
            "workflow_job.created_at",
        ),
        (
            {
                let mut p = payload.clone();
                p["workflow_job"]["created_at"] = json!("yesterday-ish");
                p.to_string()
            },
            "workflow_job.created_at",
        ),
    ];
    for (i, (body, field)) in cases.iter().enumerate() {
        let (s, a) = send(
            h.http
                .post(&url)
                .header("X-GitHub-Event", "workflow_job")
                .header("X-GitHub-Delivery", format!("bad-body-{i}"))
                .header("X-Hub-Signature-256", signed(body))
                .header("Content-Type", "application/json")
                .body(body.clone()),
        )
        .await;
        assert_eq!(s, 400, "case {i}: {a}");
        assert!(a["error"].is_string(), "{a}");
        if !field.is_empty() {
            assert_eq!(a["field"], *field, "case {i}: {a}");
        }
    }
    // Missing delivery id.
    let (s, a) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-Hub-Signature-256", signed(&good))
            .body(good.clone()),
    )
    .await;
    assert_eq!(
        (s, a["field"].as_str()),
        (400, Some("X-GitHub-Delivery")),
        "{a}"
    );

    // Unsupported content type.
    let (s, _) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", "bad-ct")
            .header("X-Hub-Signature-256", signed(&good))
            .header("Content-Type", "text/xml")
            .body(good.clone()),
    )
    .await;
    assert_eq!(s, 415);

    // Over the body limit: declared length, and a chunked body with no length.
    let big = "x".repeat(100 * 1024);
    let (s, _) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", "big-1")
            .header("X-Hub-Signature-256", signed(&big))
            .body(big.clone()),
    )
    .await;
    assert_eq!(s, 413);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..100).map(|_| Ok(vec![b'x'; 1024])).collect();
    let (s, _) = send(
        h.http
            .post(&url)
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", "big-2")
            .header("X-Hub-Signature-256", signed(&big))
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks))),
    )
    .await;
    assert_eq!(s, 413);

    // GitLab: wrong token, missing build_id, id not a number.
    let gl = format!("{}/webhooks/gitlab", h.base);
    let (s, _) = send(
        h.http
            .post(&gl)
            .header("X-Gitlab-Event", "Job Hook")
            .header("X-Gitlab-Token", "wrong")
            .header("Idempotency-Key", "g-1")
            .body(fixture("gitlab_job_pending.json")),
    )
    .await;
    assert_eq!(s, 401);
    let mut gpay: Value = serde_json::from_str(&fixture("gitlab_job_pending.json")).unwrap();
    gpay.as_object_mut().unwrap().remove("build_id");
    let (s, a) = h.gitlab("Job Hook", "g-2", &gpay.to_string()).await;
    assert_eq!((s, a["field"].as_str()), (400, Some("build_id")), "{a}");
    gpay["build_id"] = json!("seven");
    let (s, a) = h.gitlab("Job Hook", "g-3", &gpay.to_string()).await;
    assert_eq!((s, a["field"].as_str()), (400, Some("build_id")), "{a}");

    // Usage: wrong token, negative size, non-numeric size, unknown forge, no job id.
    let (s, _) = send(
        h.http
            .post(format!("{}/v1/usage", h.base))
            .bearer_auth("wrong")
            .body(fixture("usage_report.json")),
    )
    .await;
    assert_eq!(s, 401);
    let usage: Value = serde_json::from_str(&fixture("usage_report.json")).unwrap();
    let bad_usage = [
        ("peak_memory_bytes", json!(-1)),
        ("peak_memory_bytes", json!("lots")),
        ("forge", json!("bitbucket")),
        ("job_id", Value::Null),
    ];
    for (field, value) in bad_usage {
        let mut u = usage.clone();
        if value.is_null() {
            u.as_object_mut().unwrap().remove(field);
        } else {
            u[field] = value;
        }
        let (s, a) = h.usage(&u.to_string()).await;
        assert_eq!((s, a["field"].as_str()), (400, Some(field)), "{a}");
    }

    assert!(
        h.events().await.is_empty(),
        "nothing published on bad input"
    );
    assert!(h.raw().await.is_empty());
    h.stop().await;
}

#[tokio::test]
async fn weak_secrets_refuse_to_start_naming_the_variable() {
    runyard_telemetry::install_crypto_provider();
    let ns = unique_namespace();
    type Slot = fn(&mut Config) -> &mut Option<secrecy::SecretString>;
    let slots: [(&str, Slot); 3] = [
        ("RUNYARD_GITHUB_WEBHOOK_SECRET", |c| {
            &mut c.github_webhook_secret
        }),
        ("RUNYARD_GITLAB_WEBHOOK_TOKEN", |c| {
            &mut c.gitlab_webhook_token
        }),
        ("RUNYARD_USAGE_TOKEN", |c| &mut c.usage_token),
    ];
    for (var, slot) in slots {
        for (value, why) in [
            ("change-me", "is a known placeholder"),
            ("Secret123", "is a known placeholder"),
            ("k7Q2mZ9xR4vB1nL8", "is 16 bytes long, shorter than 32"),
            ("", "is empty"),
        ] {
            // Nothing listens on the NATS URL: the check comes first.
            let mut c = test_config("nats://127.0.0.1:1".into(), &ns);
            *slot(&mut c) = Some(value.to_owned().into());
            let e = App::build(c).await.expect_err("a weak secret is refused");
            let e = format!("{e:#}");
            assert!(e.contains(&format!("{var} {why}")), "{var}={value:?}: {e}");
            assert!(e.contains("openssl rand -hex 32"), "{e}");
        }
    }
    // RUNYARD_INSECURE_DEV=1 lets them through.
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.insecure_dev = true;
        c.github_webhook_secret = Some("dev".to_owned().into());
        c.usage_token = Some("change-me".to_owned().into());
    })
    .await;
    let (s, _) = h
        .usage_with("change-me", &fixture("usage_report.json"))
        .await;
    assert_eq!(s, 202);
    h.stop().await;
}

#[tokio::test]
async fn unconfigured_secrets_answer_503_not_configured() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.github_webhook_secret = None;
        c.gitlab_webhook_token = None;
        c.usage_token = None;
    })
    .await;
    let body = fixture("github_workflow_job_queued.json");
    let (s, a) = h.github("workflow_job", "nc-1", &body).await;
    assert_eq!(s, 503);
    assert!(
        a["error"].as_str().unwrap().contains("not configured"),
        "{a}"
    );
    assert_eq!(
        h.gitlab("Job Hook", "nc-2", &fixture("gitlab_job_pending.json"))
            .await
            .0,
        503
    );
    assert_eq!(h.usage(&fixture("usage_report.json")).await.0, 503);
    assert!(h.events().await.is_empty());
    h.stop().await;
}

async fn poll_status(http: &reqwest::Client, url: &str, want: u16, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(r) = http.get(url).send().await
            && r.status().as_u16() == want
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn nats_down_means_503_and_recovery_without_restart() {
    let mut server = NatsServer::start().await;
    let url = server.url();
    let mut h = Harness::start_with(TestNats::Shared(url), |_| {}).await;
    let body = fixture("github_workflow_job_queued.json");
    assert_eq!(h.github("workflow_job", "up-1", &body).await.0, 202);
    assert!(
        poll_status(
            &h.http,
            &format!("{}/readyz", h.base),
            200,
            Duration::from_secs(5)
        )
        .await
    );

    server.stop().await;
    assert!(
        poll_status(
            &h.http,
            &format!("{}/readyz", h.base),
            503,
            Duration::from_secs(10)
        )
        .await,
        "readyz goes red"
    );
    let resp = h
        .http
        .post(format!("{}/webhooks/github", h.base))
        .header("X-GitHub-Event", "workflow_job")
        .header("X-GitHub-Delivery", "down-1")
        .header(
            "X-Hub-Signature-256",
            github_signature(GH_SECRET, body.as_bytes()),
        )
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().get("retry-after").is_some());

    server.start_again().await;
    assert!(
        poll_status(
            &h.http,
            &format!("{}/readyz", h.base),
            200,
            Duration::from_secs(20)
        )
        .await,
        "ingest recovers by itself"
    );
    assert_eq!(h.github("workflow_job", "back-1", &body).await.0, 202);
    let client = async_nats::connect(server.url()).await.unwrap();
    let events = decode_events(&stream_messages(&client, &h.ns.events_stream()).await);
    let ids: Vec<_> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        ["github:up-1", "github:back-1"],
        "nothing answered 503 was stored"
    );
    h.stop().await;
}

/// Reads from `stream` until `buf` holds a blank line (the end of a
/// response head), with a deadline.
async fn read_head(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> String {
    use tokio::io::AsyncReadExt as _;
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut chunk = [0_u8; 1024];
            let n = stream.read(&mut chunk).await.expect("read");
            assert!(n > 0, "connection closed before a response head");
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("a response head within 10 s");
    String::from_utf8_lossy(buf).into_owned()
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_deliveries() {
    use tokio::io::AsyncWriteExt as _;

    let mut h = Harness::start().await;
    let body = fixture("github_workflow_job_queued.json");
    let addr = h.base.trim_start_matches("http://").to_owned();

    // One delivery held in flight: its head asks `Expect: 100-continue`, so
    // the server's `100 Continue` proves the handler is already reading the
    // body; the body is sent only once shutdown has begun.
    let mut held = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /webhooks/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: held-1\r\nX-Hub-Signature-256: {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\n\r\n",
        github_signature(GH_SECRET, body.as_bytes()),
        body.len()
    );
    held.write_all(head.as_bytes()).await.expect("write head");
    let mut buf = Vec::new();
    let interim = read_head(&mut held, &mut buf).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");

    // Others race the shutdown: each is answered 202 or refused.
    let mut tasks = Vec::new();
    for i in 0..40 {
        let http = h.http.clone();
        let url = format!("{}/webhooks/github", h.base);
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let answer = http
                .post(url)
                .header("X-GitHub-Event", "workflow_job")
                .header("X-GitHub-Delivery", format!("inflight-{i}"))
                .header(
                    "X-Hub-Signature-256",
                    github_signature(GH_SECRET, body.as_bytes()),
                )
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16());
            (format!("github:inflight-{i}"), answer)
        }));
    }
    tokio::task::yield_now().await;

    // Shutdown begins: the listener closes while `held` is mid-request.
    let _ = h.shutdown.take().expect("running").send(());
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(Instant::now() < deadline, "listener still open after 10 s");
        tokio::task::yield_now().await;
    }

    held.write_all(body.as_bytes()).await.unwrap();
    buf.clear();
    let response = read_head(&mut held, &mut buf).await;
    assert!(
        response.starts_with("HTTP/1.1 202 "),
        "the delivery in flight at shutdown is finished: {response}"
    );
    drop(held);

    h.stop().await;
    let mut accepted = vec!["github:held-1".to_owned()];
    for t in tasks {
        match t.await.unwrap() {
            (id, Ok(202)) => accepted.push(id),
            (_, Ok(other)) => panic!("unexpected answer {other} during shutdown"),
            (_, Err(_)) => {} // refused after the listener closed: the forge retries
        }
    }
    accepted.sort();
    let mut stored: Vec<String> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    stored.sort();
    assert_eq!(stored, accepted, "every 202 is in the stream, nothing else");
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let mut h = Harness::start().await;
    assert_eq!(
        h.http
            .get(format!("{}/healthz", h.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        h.http
            .get(format!("{}/readyz", h.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    h.github(
        "workflow_job",
        "m-1",
        &fixture("github_workflow_job_queued.json"),
    )
    .await;
    let text = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#"runyard_ingest_deliveries_total{forge="github",result="accepted"} 1"#),
        "{text}"
    );
    assert!(text.contains("runyard_ingest_publish_latency_seconds"));
    assert!(!text.contains(GH_SECRET));
    h.stop().await;
}

/// One hostile request of the door table and what it must get.
struct Hostile {
    name: String,
    method: reqwest::Method,
    path: &'static str,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    status: u16,
    /// The field the 400 must name, if the answer names one.
    field: Option<String>,
}

/// A JSON fixture with the value at `pointer` replaced.
fn with(fixture_name: &str, pointer: &str, value: Value) -> Value {
    let mut v: Value = serde_json::from_str(&fixture(fixture_name)).expect("test data");
    *v.pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer} in {fixture_name}")) = value;
    v
}

/// A JSON fixture with the object member at `pointer` removed.
fn without(fixture_name: &str, pointer: &str) -> Value {
    let mut v: Value = serde_json::from_str(&fixture(fixture_name)).expect("test data");
    let (parent, key) = pointer.rsplit_once('/').expect("test data");
    v.pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .and_then(|o| o.remove(key))
        .unwrap_or_else(|| panic!("{pointer} in {fixture_name}"));
    v
}

/// Past `i64::MAX`: what Postgres's `bigint` cannot hold.
const PAST_BIGINT: u64 = i64::MAX as u64 + 1;

#[allow(clippy::too_many_lines)]
fn hostile_table() -> Vec<Hostile> {
    let mut t = Vec::new();
    let gh_job = "github_workflow_job_queued.json";
    let gl_job = "gitlab_job_running.json";
    let gl_pipe = "gitlab_pipeline_failed.json";
    let report = "usage_report.json";

    // --- GitHub -------------------------------------------------------------
    let github =
        |name: &str, headers: Vec<(&str, String)>, body: Vec<u8>, status, field: Option<&str>| {
            Hostile {
                name: format!("github: {name}"),
                method: reqwest::Method::POST,
                path: "/webhooks/github",
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
                body,
                status,
                field: field.map(str::to_owned),
            }
        };
    // A correctly signed workflow_job delivery with `extra` headers.
    let signed = |name: &str,
                  delivery: &str,
                  body: Vec<u8>,
                  extra: Vec<(&str, String)>,
                  status,
                  field: Option<&str>| {
        let mut headers = vec![
            ("X-GitHub-Event", "workflow_job".to_owned()),
            ("X-GitHub-Delivery", delivery.to_owned()),
            ("X-GitHub-Hook-ID", "42".to_owned()),
            ("Content-Type", "application/json".to_owned()),
            ("X-Hub-Signature-256", github_signature(GH_SECRET, &body)),
        ];
        for (k, v) in extra {
            headers.retain(|(h, _)| *h != k);
            headers.push((k, v));
        }
        github(name, headers, body, status, field)
    };
    let good = fixture(gh_job).into_bytes();
    let json = |v: Value| v.to_string().into_bytes();

    t.push(github(
        "signature with another secret",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-GitHub-Delivery", "h-sig-1".into()),
            (
                "X-Hub-Signature-256",
                github_signature("not-the-secret", &good),
            ),
        ],
        good.clone(),
        401,
        None,
    ));
    t.push(github(
        "no signature",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-GitHub-Delivery", "h-sig-2".into()),
        ],
        good.clone(),
        401,
        None,
    ));
    t.push(github(
        "sha1 signature only",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-GitHub-Delivery", "h-sig-3".into()),
            (
                "X-Hub-Signature",
                "sha1=0123456789abcdef0123456789abcdef01234567".into(),
            ),
        ],
        good.clone(),
        401,
        None,
    ));
    t.push(github(
        "signature not hex",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-GitHub-Delivery", "h-sig-4".into()),
            ("X-Hub-Signature-256", "sha256=zz".into()),
        ],
        good.clone(),
        401,
        None,
    ));
    t.push(github(
        "signature of another body",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-GitHub-Delivery", "h-sig-5".into()),
            ("X-Hub-Signature-256", github_signature(GH_SECRET, b"{}")),
        ],
        good.clone(),
        401,
        None,
    ));
    t.push(signed(
        "xml content type",
        "h-ct-1",
        good.clone(),
        vec![("Content-Type", "text/xml".into())],
        415,
        None,
    ));
    t.push(signed(
        "truncated JSON",
        "h-json-1",
        good[..good.len() / 2].to_vec(),
        vec![],
        400,
        Some("body"),
    ));
    t.push(signed(
        "not JSON",
        "h-json-2",
        b"{not json".to_vec(),
        vec![],
        400,
        Some("body"),
    ));
    t.push(signed(
        "empty body",
        "h-json-3",
        Vec::new(),
        vec![],
        400,
        Some("body"),
    ));
    t.push(signed(
        "a JSON array",
        "h-json-4",
        b"[1,2,3]".to_vec(),
        vec![],
        400,
        Some("body"),
    ));
    t.push(signed(
        "form body without payload",
        "h-form-1",
        b"other=1".to_vec(),
        vec![("Content-Type", "application/x-www-form-urlencoded".into())],
        400,
        Some("payload"),
    ));
    t.push(signed(
        "form payload not JSON",
        "h-form-2",
        b"payload=%7Bnope".to_vec(),
        vec![("Content-Type", "application/x-www-form-urlencoded".into())],
        400,
        Some("payload"),
    ));
    for (name, pointer, value, field) in [
        (
            "job id a string",
            "/workflow_job/id",
            json!("1"),
            "workflow_job.id",
        ),
        (
            "job id negative",
            "/workflow_job/id",
            json!(-5),
            "workflow_job.id",
        ),
        (
            "job id a fraction",
            "/workflow_job/id",
            json!(1.5),
            "workflow_job.id",
        ),
        (
            "job id past bigint",
            "/workflow_job/id",
            json!(PAST_BIGINT),
            "workflow_job.id",
        ),
        (
            "job id u64::MAX",
            "/workflow_job/id",
            json!(u64::MAX),
            "workflow_job.id",
        ),
        (
            "repository id past bigint",
            "/repository/id",
            json!(PAST_BIGINT),
            "repository.id",
        ),
        (
            "run id past bigint",
            "/workflow_job/run_id",
            json!(PAST_BIGINT),
            "workflow_job.run_id",
        ),
        (
            "runner id past bigint",
            "/workflow_job/runner_id",
            json!(PAST_BIGINT),
            "workflow_job.runner_id",
        ),
        (
            "runner group id past bigint",
            "/workflow_job/runner_group_id",
            json!(u64::MAX),
            "workflow_job.runner_group_id",
        ),
        (
            "run attempt past integer",
            "/workflow_job/run_attempt",
            json!(1_u64 << 31),
            "workflow_job.run_attempt",
        ),
        (
            "run attempt past u32",
            "/workflow_job/run_attempt",
            json!(1_u64 << 32),
            "workflow_job.run_attempt",
        ),
        (
            "NUL in the job name",
            "/workflow_job/name",
            json!("build\u{0}"),
            "workflow_job.name",
        ),
        (
            "NUL in a label",
            "/workflow_job/labels/0",
            json!("self-hosted\u{0}"),
            "workflow_job.labels[0]",
        ),
        (
            "NUL in the branch",
            "/workflow_job/head_branch",
            json!("main\u{0}x"),
            "workflow_job.head_branch",
        ),
        (
            "NUL in the repository",
            "/repository/full_name",
            json!("\u{0}"),
            "repository.full_name",
        ),
        (
            "NUL in the workflow name",
            "/workflow_job/workflow_name",
            json!("ci\u{0}"),
            "workflow_job.workflow_name",
        ),
        (
            "65 labels",
            "/workflow_job/labels",
            json!((0..65).map(|i| format!("l{i}")).collect::<Vec<_>>()),
            "workflow_job.labels",
        ),
        (
            "10,000 labels",
            "/workflow_job/labels",
            json!(vec!["x"; 10_000]),
            "workflow_job.labels",
        ),
        (
            "a 2 KiB label",
            "/workflow_job/labels/1",
            json!("l".repeat(2048)),
            "workflow_job.labels[1]",
        ),
        (
            "a 1 MiB job name",
            "/workflow_job/name",
            json!("n".repeat(1 << 20)),
            "workflow_job.name",
        ),
        (
            "a 5,000 byte branch",
            "/workflow_job/head_branch",
            json!("b".repeat(5000)),
            "workflow_job.head_branch",
        ),
        (
            "a 3 KiB html_url",
            "/workflow_job/html_url",
            json!(format!("https://github.com/{}", "p".repeat(3000))),
            "workflow_job.html_url",
        ),
        (
            "labels not an array",
            "/workflow_job/labels",
            json!("linux"),
            "workflow_job.labels",
        ),
        (
            "a label not a string",
            "/workflow_job/labels/0",
            json!(7),
            "workflow_job.labels[0]",
        ),
        ("unknown action", "/action", json!("exploded"), "action"),
        (
            "workflow_job a string",
            "/workflow_job",
            json!("job"),
            "workflow_job",
        ),
        (
            "created_at in 1970",
            "/workflow_job/created_at",
            json!("1970-01-01T00:00:00Z"),
            "workflow_job.created_at",
        ),
        (
            "created_at not a time",
            "/workflow_job/created_at",
            json!("yesterday-ish"),
            "workflow_job.created_at",
        ),
        (
            "repository html_url of another instance",
            "/repository/html_url",
            json!("https://evil.example.com/a/b"),
            "repository.html_url",
        ),
    ] {
        t.push(signed(
            name,
            &format!("h-{}", t.len()),
            json(with(gh_job, pointer, value)),
            vec![],
            400,
            Some(field),
        ));
    }
    // 2^64: not even a u64.
    let huge = String::from_utf8(json(with(gh_job, "/workflow_job/id", json!("HUGE"))))
        .expect("test data")
        .replace("\"HUGE\"", "18446744073709551616");
    t.push(signed(
        "job id 2^64",
        "h-huge",
        huge.into_bytes(),
        vec![],
        400,
        Some("workflow_job.id"),
    ));
    t.push(signed(
        "no action",
        "h-noaction",
        json(without(gh_job, "/action")),
        vec![],
        400,
        Some("action"),
    ));
    t.push(signed(
        "no job id",
        "h-noid",
        json(without(gh_job, "/workflow_job/id")),
        vec![],
        400,
        Some("workflow_job.id"),
    ));
    t.push(signed(
        "delivery id of 129 bytes",
        &"d".repeat(129),
        good.clone(),
        vec![],
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "delivery id with a space",
        "a b",
        good.clone(),
        vec![],
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "delivery id with a slash",
        "a/b",
        good.clone(),
        vec![],
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "delivery id with a wildcard",
        "a.>",
        good.clone(),
        vec![],
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "delivery id with a quote",
        "a\"b",
        good.clone(),
        vec![],
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "hook id of 200 bytes",
        "h-hook",
        good.clone(),
        vec![("X-GitHub-Hook-ID", "9".repeat(200))],
        400,
        Some("X-GitHub-Hook-ID"),
    ));
    t.push(github(
        "no delivery id",
        vec![
            ("X-GitHub-Event", "workflow_job".into()),
            ("X-Hub-Signature-256", github_signature(GH_SECRET, &good)),
        ],
        good.clone(),
        400,
        Some("X-GitHub-Delivery"),
    ));
    t.push(signed(
        "an instance not configured",
        "h-ghes-1",
        good.clone(),
        vec![("X-GitHub-Enterprise-Host", "ghe.evil.example".into())],
        400,
        Some("X-GitHub-Enterprise-Host"),
    ));
    t.push(signed(
        "an instance that is no host",
        "h-ghes-2",
        good.clone(),
        vec![("X-GitHub-Enterprise-Host", "a b".into())],
        400,
        Some("X-GitHub-Enterprise-Host"),
    ));
    // Answered, but nothing to record.
    t.push(signed(
        "unknown event",
        "h-ev-1",
        good.clone(),
        vec![("X-GitHub-Event", "issues".into())],
        200,
        None,
    ));
    t.push(github(
        "no event header",
        vec![
            ("X-GitHub-Delivery", "h-ev-2".into()),
            ("X-Hub-Signature-256", github_signature(GH_SECRET, &good)),
        ],
        good.clone(),
        200,
        None,
    ));

    // --- GitLab -------------------------------------------------------------
    let gitlab = |name: &str,
                  event: &str,
                  key: Option<&str>,
                  token: Option<&str>,
                  body: Vec<u8>,
                  status,
                  field: Option<&str>| {
        let mut headers = vec![
            ("X-Gitlab-Event".to_owned(), event.to_owned()),
            (
                "X-Gitlab-Instance".to_owned(),
                "https://gitlab.example.com".to_owned(),
            ),
            ("Content-Type".to_owned(), "application/json".to_owned()),
        ];
        if let Some(k) = key {
            headers.push(("Idempotency-Key".to_owned(), k.to_owned()));
        }
        if let Some(t) = token {
            headers.push(("X-Gitlab-Token".to_owned(), t.to_owned()));
        }
        Hostile {
            name: format!("gitlab: {name}"),
            method: reqwest::Method::POST,
            path: "/webhooks/gitlab",
            headers,
            body,
            status,
            field: field.map(str::to_owned),
        }
    };
    let gl_good = fixture(gl_job).into_bytes();
    let tok = Some(GL_TOKEN);
    t.push(gitlab(
        "no token",
        "Job Hook",
        Some("g-1"),
        None,
        gl_good.clone(),
        401,
        None,
    ));
    t.push(gitlab(
        "wrong token",
        "Job Hook",
        Some("g-2"),
        Some("wrong"),
        gl_good.clone(),
        401,
        None,
    ));
    t.push(gitlab(
        "token with a trailing space",
        "Job Hook",
        Some("g-3"),
        Some(&format!("{GL_TOKEN}x")),
        gl_good.clone(),
        401,
        None,
    ));
    let mut ct = gitlab(
        "plain-text content type",
        "Job Hook",
        Some("g-4"),
        tok,
        gl_good.clone(),
        415,
        None,
    );
    ct.headers.retain(|(k, _)| k != "Content-Type");
    ct.headers
        .push(("Content-Type".into(), "text/plain".into()));
    t.push(ct);
    t.push(gitlab(
        "truncated JSON",
        "Job Hook",
        Some("g-5"),
        tok,
        gl_good[..40].to_vec(),
        400,
        Some("body"),
    ));
    t.push(gitlab(
        "no idempotency key",
        "Job Hook",
        None,
        tok,
        gl_good.clone(),
        400,
        Some("Idempotency-Key"),
    ));
    t.push(gitlab(
        "idempotency key with a space",
        "Job Hook",
        Some("a b"),
        tok,
        gl_good.clone(),
        400,
        Some("Idempotency-Key"),
    ));
    t.push(gitlab(
        "idempotency key of 200 bytes",
        "Job Hook",
        Some(&"k".repeat(200)),
        tok,
        gl_good.clone(),
        400,
        Some("Idempotency-Key"),
    ));
    for (name, pointer, value, field) in [
        (
            "build id past bigint",
            "/build_id",
            json!(PAST_BIGINT),
            "build_id",
        ),
        ("build id a string", "/build_id", json!("seven"), "build_id"),
        (
            "project id past bigint",
            "/project_id",
            json!(u64::MAX),
            "project_id",
        ),
        (
            "pipeline id past bigint",
            "/pipeline_id",
            json!(PAST_BIGINT),
            "pipeline_id",
        ),
        (
            "runner id past bigint",
            "/runner/id",
            json!(PAST_BIGINT),
            "runner.id",
        ),
        (
            "NUL in the build name",
            "/build_name",
            json!("rspec\u{0}"),
            "build_name",
        ),
        (
            "NUL in the stage",
            "/build_stage",
            json!("\u{0}test"),
            "build_stage",
        ),
        (
            "NUL in a runner tag",
            "/runner/tags/0",
            json!("spack\u{0}"),
            "runner.tags[0]",
        ),
        ("NUL in the ref", "/ref", json!("develop\u{0}"), "ref"),
        (
            "65 runner tags",
            "/runner/tags",
            json!((0..65).map(|i| format!("t{i}")).collect::<Vec<_>>()),
            "runner.tags",
        ),
        (
            "a 4 KiB build name",
            "/build_name",
            json!("n".repeat(4096)),
            "build_name",
        ),
        (
            "a status word with a space",
            "/build_status",
            json!("run ning"),
            "build_status",
        ),
        (
            "object kind of a pipeline",
            "/object_kind",
            json!("pipeline"),
            "object_kind",
        ),
    ] {
        t.push(gitlab(
            name,
            "Job Hook",
            Some(&format!("g-{}", t.len())),
            tok,
            json(with(gl_job, pointer, value)),
            400,
            Some(field),
        ));
    }
    t.push(gitlab(
        "no build id",
        "Job Hook",
        Some("g-noid"),
        tok,
        json(without(gl_job, "/build_id")),
        400,
        Some("build_id"),
    ));
    let mut flood: Value = serde_json::from_str(&fixture(gl_pipe)).expect("test data");
    let first = flood["builds"][0].clone();
    flood["builds"] = Value::Array(
        (0..1001)
            .map(|i| {
                let mut b = first.clone();
                b["id"] = json!(100_000 + i);
                b
            })
            .collect(),
    );
    t.push(gitlab(
        "1,001 builds",
        "Pipeline Hook",
        Some("g-flood"),
        tok,
        json(flood),
        400,
        Some("builds"),
    ));
    for (name, pointer, value, field) in [
        (
            "pipeline id past bigint",
            "/object_attributes/id",
            json!(PAST_BIGINT),
            "object_attributes.id",
        ),
        (
            "a build id past bigint",
            "/builds/1/id",
            json!(PAST_BIGINT),
            "builds[1].id",
        ),
        (
            "NUL in a build name",
            "/builds/1/name",
            json!("x\u{0}"),
            "builds[1].name",
        ),
        (
            "65 tags on a build",
            "/builds/0/runner/tags",
            json!(vec!["t"; 65]),
            "builds[0].runner.tags",
        ),
        (
            "NUL in the pipeline ref",
            "/object_attributes/ref",
            json!("\u{0}"),
            "object_attributes.ref",
        ),
        ("builds not an array", "/builds", json!({}), "builds"),
    ] {
        t.push(gitlab(
            name,
            "Pipeline Hook",
            Some(&format!("g-{}", t.len())),
            tok,
            json(with(gl_pipe, pointer, value)),
            400,
            Some(field),
        ));
    }
    t.push(gitlab(
        "a push hook",
        "Push Hook",
        Some("g-push"),
        tok,
        br#"{"object_kind":"push"}"#.to_vec(),
        200,
        None,
    ));

    // --- usage reports ------------------------------------------------------
    let usage = |name: &str, auth: Option<String>, body: Vec<u8>, status, field: Option<&str>| {
        let mut headers = vec![("Content-Type".to_owned(), "application/json".to_owned())];
        if let Some(a) = auth {
            headers.push(("Authorization".to_owned(), a));
        }
        Hostile {
            name: format!("usage: {name}"),
            method: reqwest::Method::POST,
            path: "/v1/usage",
            headers,
            body,
            status,
            field: field.map(str::to_owned),
        }
    };
    let bearer = || Some(format!("Bearer {USAGE_TOKEN}"));
    let report_good = fixture(report).into_bytes();
    t.push(usage("no token", None, report_good.clone(), 401, None));
    t.push(usage(
        "wrong token",
        Some("Bearer wrong".into()),
        report_good.clone(),
        401,
        None,
    ));
    t.push(usage(
        "basic auth",
        Some(format!("Basic {USAGE_TOKEN}")),
        report_good.clone(),
        401,
        None,
    ));
    let mut ct = usage(
        "plain-text content type",
        bearer(),
        report_good.clone(),
        415,
        None,
    );
    ct.headers.retain(|(k, _)| k != "Content-Type");
    ct.headers
        .push(("Content-Type".into(), "text/plain".into()));
    t.push(ct);
    t.push(usage(
        "truncated JSON",
        bearer(),
        report_good[..30].to_vec(),
        400,
        Some("body"),
    ));
    t.push(usage(
        "a JSON string",
        bearer(),
        b"\"report\"".to_vec(),
        400,
        Some("body"),
    ));
    for (name, pointer, value, field) in [
        (
            "peak 2^64-1",
            "/peak_memory_bytes",
            json!(u64::MAX),
            "peak_memory_bytes",
        ),
        (
            "peak past bigint",
            "/peak_memory_bytes",
            json!(PAST_BIGINT),
            "peak_memory_bytes",
        ),
        (
            "peak negative",
            "/peak_memory_bytes",
            json!(-1),
            "peak_memory_bytes",
        ),
        (
            "peak a string",
            "/peak_memory_bytes",
            json!("lots"),
            "peak_memory_bytes",
        ),
        (
            "limit past bigint",
            "/memory_limit_bytes",
            json!(PAST_BIGINT),
            "memory_limit_bytes",
        ),
        (
            "request past bigint",
            "/memory_request_bytes",
            json!(u64::MAX),
            "memory_request_bytes",
        ),
        (
            "millicores past bigint",
            "/cpu_request_millicores",
            json!(PAST_BIGINT),
            "cpu_request_millicores",
        ),
        (
            "job id past bigint",
            "/job_id",
            json!(PAST_BIGINT),
            "job_id",
        ),
        (
            "attempt past integer",
            "/attempt",
            json!(1_u64 << 31),
            "attempt",
        ),
        (
            "exit code past i32",
            "/exit_code",
            json!(1_u64 << 40),
            "exit_code",
        ),
        (
            "cpu seconds a string",
            "/cpu_seconds",
            json!("many"),
            "cpu_seconds",
        ),
        ("NUL in the ref", "/ref", json!("develop\u{0}"), "ref"),
        (
            "NUL in a workload value",
            "/workload/package",
            json!("py\u{0}torch"),
            "workload.package",
        ),
        (
            "a 2 KiB workload value",
            "/workload/package",
            json!("p".repeat(2048)),
            "workload.package",
        ),
        ("unknown forge", "/forge", json!("bitbucket"), "forge"),
        ("cgroup v3", "/cgroup", json!("v3"), "cgroup"),
        ("instance not a host", "/instance", json!("a b"), "instance"),
        (
            "workload not an object",
            "/workload",
            json!(["a"]),
            "workload",
        ),
    ] {
        t.push(usage(
            name,
            bearer(),
            json(with(report, pointer, value)),
            400,
            Some(field),
        ));
    }
    let mut nul_key: Value = serde_json::from_str(&fixture(report)).expect("test data");
    nul_key["workload"]["pack\u{0}age"] = json!("x");
    t.push(usage(
        "NUL in a workload key",
        bearer(),
        json(nul_key),
        400,
        Some("workload"),
    ));
    let mut wide: Value = serde_json::from_str(&fixture(report)).expect("test data");
    for i in 0..65 {
        wide["workload"][format!("k{i}")] = json!("v");
    }
    t.push(usage(
        "70 workload attributes",
        bearer(),
        json(wide),
        400,
        Some("workload"),
    ));
    t.push(usage(
        "no job id",
        bearer(),
        json(without(report, "/job_id")),
        400,
        Some("job_id"),
    ));
    t.push(usage(
        "no peak",
        bearer(),
        json(without(report, "/peak_memory_bytes")),
        400,
        Some("peak_memory_bytes"),
    ));
    t.push(usage(
        "5 MiB body",
        bearer(),
        vec![b' '; 5 << 20],
        413,
        Some("body"),
    ));

    // --- anything else ----------------------------------------------------
    for (method, path, status) in [
        (reqwest::Method::GET, "/webhooks/github", 405),
        (reqwest::Method::PUT, "/v1/usage", 405),
        (reqwest::Method::POST, "/webhooks/bitbucket", 404),
    ] {
        t.push(Hostile {
            name: format!("{method} {path}"),
            method,
            path,
            headers: Vec::new(),
            body: Vec::new(),
            status,
            field: None,
        });
    }
    t
}

#[tokio::test]
async fn hostile_requests_are_refused_at_the_door_and_publish_nothing() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.ingest_max_body = bytesize::ByteSize::mib(4);
    })
    .await;
    let table = hostile_table();
    assert!(table.len() >= 60, "{} cases", table.len());
    let mut wrong = Vec::new();
    for case in &table {
        let mut req = h
            .http
            .request(case.method.clone(), format!("{}{}", h.base, case.path))
            .body(case.body.clone());
        for (k, v) in &case.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let (status, answer) = send(req).await;
        let field = answer.get("field").and_then(Value::as_str);
        let named_ok = case.field.as_deref().is_none_or(|f| field == Some(f));
        let message_ok =
            status < 400 || status == 404 || status == 405 || answer["error"].is_string();
        if status != case.status || !named_ok || !message_ok {
            wrong.push(format!(
                "{}: want {} {:?}, got {status} {answer}",
                case.name, case.status, case.field
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} wrong:\n{}",
        wrong.len(),
        table.len(),
        wrong.join("\n")
    );

    // Nothing refused (or ignored) was published, raw or normalized.
    assert_eq!(
        h.events().await.len(),
        0,
        "events published for refused requests"
    );
    assert_eq!(
        h.raw().await.len(),
        0,
        "raw deliveries kept for refused requests"
    );
    // The service is alive and still takes a good delivery.
    assert_eq!(
        h.http
            .get(format!("{}/healthz", h.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let (s, a) = h
        .github(
            "workflow_job",
            "after-the-storm",
            &fixture("github_workflow_job_queued.json"),
        )
        .await;
    assert_eq!(s, 202, "{a}");
    assert_eq!(h.events().await.len(), 1);
    assert_eq!(h.raw().await.len(), 1);
    h.stop().await;
}

#[tokio::test]
async fn github_instances_are_an_allowlist() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.github_instances = "github.com, GHE.corp.example.".into();
    })
    .await;
    let body = fixture("github_workflow_job_queued.json");
    let post = |delivery: &str, host: Option<&str>| {
        let mut req = h
            .http
            .post(format!("{}/webhooks/github", h.base))
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", delivery)
            .header(
                "X-Hub-Signature-256",
                github_signature(GH_SECRET, body.as_bytes()),
            )
            .body(body.clone());
        if let Some(host) = host {
            req = req.header("X-GitHub-Enterprise-Host", host);
        }
        send(req)
    };
    let (s, a) = post("inst-1", None).await;
    assert_eq!(s, 202, "github.com: {a}");
    let (s, a) = post("inst-2", Some("ghe.corp.example")).await;
    assert_eq!(s, 202, "a listed instance: {a}");
    let (s, a) = post("inst-3", Some("ghe.other.example")).await;
    assert_eq!(
        (s, a["field"].as_str()),
        (400, Some("X-GitHub-Enterprise-Host")),
        "{a}"
    );
    let events = decode_events(&h.events().await);
    let instances: Vec<_> = events
        .iter()
        .map(|e| job(e).job.as_ref().unwrap().instance.clone())
        .collect();
    assert_eq!(instances, ["github.com", "ghe.corp.example"]);
    assert_eq!(h.raw().await.len(), 2, "nothing kept of the refused one");
    h.stop().await;
}

#[tokio::test]
async fn ingest_started_while_nats_is_down_answers_503_then_comes_up() {
    runyard_telemetry::install_crypto_provider();
    let mut server = NatsServer::start().await;
    server.stop().await;
    let ns = unique_namespace();
    let app = App::build(test_config(server.url(), &ns))
        .await
        .expect("builds with NATS down");
    let base = format!("http://{}", app.local_addr());
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    let http = reqwest::Client::new();
    let readyz = format!("{base}/readyz");
    assert_eq!(http.get(&readyz).send().await.unwrap().status(), 503);
    let body = fixture("github_workflow_job_queued.json");
    let post = |delivery: &'static str| {
        http.post(format!("{base}/webhooks/github"))
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", delivery)
            .header(
                "X-Hub-Signature-256",
                github_signature(GH_SECRET, body.as_bytes()),
            )
            .body(body.clone())
    };
    let resp = post("early-1").send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().get("retry-after").is_some());

    server.start_again().await;
    assert!(
        poll_status(&http, &readyz, 200, Duration::from_secs(20)).await,
        "ingest comes up once NATS does, without a restart"
    );
    assert_eq!(post("later-1").send().await.unwrap().status().as_u16(), 202);
    let client = async_nats::connect(server.url()).await.unwrap();
    let events = decode_events(&stream_messages(&client, &ns.events_stream()).await);
    let ids: Vec<_> = events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["github:later-1"], "nothing answered 503 was stored");
    let _ = tx.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_413_names_nats_max_payload_when_that_is_the_limit_hit() {
    let server = NatsServer::start_with_max_payload(32 * 1024).await;
    let mut h = Harness::start_with(TestNats::Shared(server.url()), |c| {
        c.ingest_max_body = bytesize::ByteSize::mib(1);
    })
    .await;
    // A body over the body limit: 413 naming the body and the setting.
    let big = "x".repeat(2 << 20);
    let (s, a) = h.github("workflow_job", "big-body", &big).await;
    assert_eq!((s, a["field"].as_str()), (413, Some("body")), "{a}");
    assert!(
        a["error"]
            .as_str()
            .unwrap()
            .contains("RUNYARD_INGEST_MAX_BODY"),
        "{a}"
    );
    // An event over NATS's max_payload (40 labels of 1000 bytes, each
    // within the door's limits): 413 naming max_payload, not the body limit.
    let labels: Vec<String> = (0..40)
        .map(|i| format!("{i:04}{}", "l".repeat(996)))
        .collect();
    let body = with(
        "github_workflow_job_queued.json",
        "/workflow_job/labels",
        json!(labels),
    )
    .to_string();
    let (s, a) = h.github("workflow_job", "big-event", &body).await;
    assert_eq!(s, 413, "{a}");
    let message = a["error"].as_str().unwrap();
    assert!(message.contains("max_payload"), "{a}");
    assert!(message.contains("32768"), "{a}");
    assert!(!message.contains("1048576"), "{a}");
    // A raw body over max_payload whose event is small: accepted, the raw
    // copy is skipped and counted.
    let padded = with(
        "github_workflow_job_queued.json",
        "/workflow_job/steps",
        json!(vec!["s".repeat(1000); 40]),
    )
    .to_string();
    let (s, a) = h.github("workflow_job", "big-raw", &padded).await;
    assert_eq!(s, 202, "{a}");
    let ids: Vec<_> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, ["github:big-raw"]);
    assert_eq!(h.raw().await.len(), 0);
    h.stop().await;
}

/// Waits until `log` holds `needle` (the binary writes as it goes).
async fn log_contains(log: &std::path::Path, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn the_binary_warns_of_a_small_max_payload_and_aggregates_repeated_refusals() {
    runyard_telemetry::install_crypto_provider();
    let server = NatsServer::start_with_max_payload(64 * 1024).await;
    let ns = unique_namespace();
    let port = runyard_testkit::free_port();
    let log = std::env::temp_dir().join(format!("runyard-ingest-{ns}.log"));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_runyard-ingest"))
        .env("RUNYARD_NATS_URL", server.url())
        .env("RUNYARD_NAMESPACE", ns.as_str())
        .env("RUNYARD_INGEST_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUNYARD_GITHUB_WEBHOOK_SECRET", GH_SECRET)
        .env("RUNYARD_INGEST_MAX_BODY", "1MiB")
        .env("RUST_LOG", "info")
        .env("RUNYARD_LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _child = Kill(child);
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    assert!(
        poll_status(
            &http,
            &format!("{base}/readyz"),
            200,
            Duration::from_secs(20)
        )
        .await,
        "ingest ready"
    );
    assert!(
        log_contains(&log, "max_payload is below RUNYARD_INGEST_MAX_BODY").await,
        "no start-up warning about max_payload"
    );

    // 500 deliveries with a bad signature, as a misconfigured hook sends.
    let body = fixture("github_workflow_job_queued.json");
    for i in 0..500 {
        let resp = http
            .post(format!("{base}/webhooks/github"))
            .header("X-GitHub-Event", "workflow_job")
            .header("X-GitHub-Delivery", format!("noisy-{i}"))
            .header(
                "X-Hub-Signature-256",
                github_signature("wrong", body.as_bytes()),
            )
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
    }
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"runyard_ingest_deliveries_total{forge="github",result="unauthorized"} 500"#
        ),
        "every refusal is counted: {metrics}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let lines = text
        .lines()
        .filter(|l| l.contains("delivery refused"))
        .count();
    assert!(
        (1..=2).contains(&lines),
        "500 refusals within seconds gave {lines} WARN lines:\n{text}"
    );
}

/// Opens a GitHub delivery of `len` body bytes and holds it inside the
/// handler: the server's `100 Continue` proves it was admitted and is
/// reading the body, which is not sent yet.
async fn hold_delivery(
    addr: &str,
    delivery: &str,
    signature: &str,
    len: usize,
) -> tokio::net::TcpStream {
    let head = format!(
        "POST /webhooks/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
         X-GitHub-Delivery: {delivery}\r\nX-Hub-Signature-256: {signature}\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n"
    );
    hold_request(addr, &head).await
}

/// The same for a GitLab Job Hook carrying the right token.
async fn hold_gitlab(addr: &str, key: &str, len: usize) -> tokio::net::TcpStream {
    let head = format!(
        "POST /webhooks/gitlab HTTP/1.1\r\nHost: {addr}\r\nX-Gitlab-Event: Job Hook\r\n\
         Idempotency-Key: {key}\r\nX-Gitlab-Token: {GL_TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {len}\r\n"
    );
    hold_request(addr, &head).await
}

/// Sends `head` (a request line and headers, without the blank line) with
/// `Expect: 100-continue` and waits for the `100 Continue`.
async fn hold_request(addr: &str, head: &str) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt as _;
    let mut held = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!("{head}Expect: 100-continue\r\n\r\n");
    held.write_all(head.as_bytes()).await.expect("write head");
    let mut buf = Vec::new();
    let interim = read_head(&mut held, &mut buf).await;
    assert!(interim.starts_with("HTTP/1.1 100 "), "{interim}");
    held
}

/// Sends the held delivery's body and returns the status line.
async fn release(mut held: tokio::net::TcpStream, body: &[u8]) -> String {
    use tokio::io::AsyncWriteExt as _;
    held.write_all(body).await.expect("write body");
    answer_of(held).await
}

/// The status line the server answers on `held` (after its `100 Continue`).
async fn answer_of(mut held: tokio::net::TcpStream) -> String {
    let mut buf = Vec::new();
    let head = read_head(&mut held, &mut buf).await;
    head.lines().next().unwrap_or_default().to_owned()
}

/// A metric's value in ingest's `/metrics` (0 when it has none yet).
async fn metric(h: &Harness, series: &str) -> u64 {
    let text = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .expect("metrics answered")
        .text()
        .await
        .expect("metrics read");
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_full_ingest_sheds_deliveries_at_once_with_retry_after() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.ingest_max_in_flight = 2;
        c.ingest_max_in_flight_bytes = bytesize::ByteSize::kib(1024);
    })
    .await;
    let addr = h.base.trim_start_matches("http://").to_owned();
    let body = fixture("github_workflow_job_queued.json");
    let job = fixture("gitlab_job_pending.json");

    // Two authenticated deliveries in flight: a third is shed, without
    // reading it, whoever sends it.
    let a = hold_gitlab(&addr, "held-a", job.len()).await;
    let b = hold_gitlab(&addr, "held-b", job.len()).await;
    let resp = h
        .github_post("workflow_job", "shed-1", body.as_bytes())
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert!(resp.headers().get("retry-after").is_some());
    let answer: Value = resp.json().await.unwrap();
    assert!(
        answer["error"].as_str().unwrap().contains("capacity"),
        "{answer}"
    );
    // Usage reports and GitLab share the budget.
    assert_eq!(h.usage(&fixture("usage_report.json")).await.0, 503);
    assert_eq!(h.gitlab("Job Hook", "shed-2", &job).await.0, 503);
    // A credential that is wrong is told so, even at capacity.
    assert_eq!(h.usage_with("wrong", "{}").await.0, 401);
    assert!(release(a, job.as_bytes()).await.contains(" 202 "));
    assert!(release(b, job.as_bytes()).await.contains(" 202 "));

    // Bytes are the memory bodies hold as they arrive: a delivery that has
    // sent 900 KiB of its 1000 leaves room for a small one, not for another
    // 200 KiB.
    let mut big = hold_gitlab(&addr, "held-big", 1000 * 1024).await;
    {
        use tokio::io::AsyncWriteExt as _;
        big.write_all(&vec![b' '; 900 * 1024]).await.unwrap();
    }
    eventually(Duration::from_secs(10), || async {
        (metric(&h, "runyard_ingest_in_flight_bytes").await >= 900 * 1024).then_some(())
    })
    .await
    .expect("the 900 KiB are held");
    let (s, a) = h
        .github(
            "workflow_job",
            "shed-3",
            &format!("{body}{}", " ".repeat(200 * 1024)),
        )
        .await;
    assert_eq!(s, 503, "{a}");
    let (s, a) = h.github("workflow_job", "small-1", &body).await;
    assert_eq!(s, 202, "{a}");
    // The held one's body is no Job Hook: 400, nothing kept.
    assert!(
        release(big, &vec![b' '; 100 * 1024])
            .await
            .contains(" 400 ")
    );

    let mut ids: Vec<_> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "github:small-1",
            "gitlab:held-a:4711:pending",
            "gitlab:held-b:4711:pending"
        ]
    );
    assert_eq!(
        metric(
            &h,
            r#"runyard_ingest_deliveries_total{forge="github",result="overloaded"}"#
        )
        .await,
        2
    );
    h.stop().await;
}

#[tokio::test]
async fn slow_bodies_keep_no_real_delivery_out() {
    use tokio::io::AsyncWriteExt as _;
    // The shipped limits: 512 deliveries, 64 MiB, 32 unverified per peer.
    let mut h = Harness::start().await;
    let addr = h.base.trim_start_matches("http://").to_owned();
    let body = fixture("github_workflow_job_queued.json");
    let wrong = github_signature("not the secret", body.as_bytes());

    // Bodies declared at the whole byte budget (25 + 25 + 14 MiB), signed
    // well-formed but wrong, trickling one byte: they hold next to nothing.
    let mut slow = Vec::new();
    for (i, mib) in [25, 25, 14].into_iter().enumerate() {
        let mut held = hold_delivery(&addr, &format!("big-{i}"), &wrong, mib << 20).await;
        held.write_all(b"{").await.unwrap();
        slow.push(held);
    }
    // Without the right token or bearer, nothing is admitted at all: the
    // answer comes before any body byte.
    for path in ["/webhooks/gitlab", "/v1/usage"] {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nX-Gitlab-Event: Job Hook\r\n\
             X-Gitlab-Token: wrong\r\nAuthorization: Bearer wrong\r\n\
             Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            25 << 20
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let answer = read_head(&mut conn, &mut buf).await;
        assert!(answer.starts_with("HTTP/1.1 401 "), "{path}: {answer}");
    }
    assert!(metric(&h, "runyard_ingest_in_flight_bytes").await < 1 << 20);

    // 600 slow small bodies from the same address.
    for i in 0..600 {
        let mut held = hold_delivery(&addr, &format!("small-{i}"), &wrong, body.len()).await;
        held.write_all(b"{").await.unwrap();
        slow.push(held);
    }

    // Real deliveries go in at once: GitHub (from the same address as the
    // slow ones), GitLab and a usage report.
    let started = Instant::now();
    let (s, a) = h.github("workflow_job", "real-1", &body).await;
    assert_eq!(s, 202, "{a}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let (s, a) = h
        .gitlab("Job Hook", "real-2", &fixture("gitlab_job_pending.json"))
        .await;
    assert_eq!(s, 202, "{a}");
    let (s, a) = h.usage(&fixture("usage_report.json")).await;
    assert_eq!(s, 202, "{a}");

    // Each unverified body past the address's 32 cut its oldest short:
    // 603 + the real one - 32.
    let cut = eventually(Duration::from_secs(10), || async {
        let n = metric(
            &h,
            r#"runyard_ingest_deliveries_total{forge="github",result="too_slow"}"#,
        )
        .await;
        (n == 572).then_some(n)
    })
    .await;
    assert_eq!(cut, Some(572));
    // The first ones were told why, and the connection closed.
    let first = slow.remove(0);
    let answer = answer_of(first).await;
    assert!(answer.contains(" 408 "), "{answer}");
    assert_eq!(decode_events(&h.events().await).len(), 3);
    drop(slow);
    h.stop().await;
}

#[tokio::test]
async fn connections_that_send_no_complete_head_are_closed() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.ingest_body_timeout = Duration::from_secs(1);
    })
    .await;
    let addr = h.base.trim_start_matches("http://").to_owned();
    // One trickles its headers and stops; one never sends a byte; one sent
    // a request and then sits idle on the kept-alive connection.
    let mut trickling = tokio::net::TcpStream::connect(&addr).await.unwrap();
    trickling
        .write_all(b"POST /webhooks/github HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: work")
        .await
        .unwrap();
    let mut silent = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let mut idle = tokio::net::TcpStream::connect(&addr).await.unwrap();
    idle.write_all(format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = Vec::new();
    assert!(
        read_head(&mut idle, &mut buf)
            .await
            .starts_with("HTTP/1.1 200 ")
    );
    let started = Instant::now();
    for (name, conn) in [
        ("trickling", &mut trickling),
        ("silent", &mut silent),
        ("idle", &mut idle),
    ] {
        let mut rest = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "{name}: still open after 5 s");
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    // Real deliveries are untouched.
    let (s, a) = h
        .github(
            "workflow_job",
            "after-1",
            &fixture("github_workflow_job_queued.json"),
        )
        .await;
    assert_eq!(s, 202, "{a}");
    h.stop().await;
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    use tokio::io::AsyncWriteExt as _;
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.ingest_body_timeout = Duration::from_secs(1);
    })
    .await;
    let addr = h.base.trim_start_matches("http://").to_owned();
    let job = fixture("gitlab_job_pending.json");
    // Authenticated, but sending half its body and then nothing.
    let mut held = hold_gitlab(&addr, "late-1", job.len()).await;
    held.write_all(&job.as_bytes()[..job.len() / 2])
        .await
        .unwrap();
    let started = Instant::now();
    let mut buf = Vec::new();
    let answer = read_head(&mut held, &mut buf).await;
    assert!(answer.starts_with("HTTP/1.1 408 "), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));
    {
        use tokio::io::AsyncReadExt as _;
        let _ = tokio::time::timeout(Duration::from_secs(2), held.read_to_end(&mut buf)).await;
    }
    let text = String::from_utf8_lossy(&buf);
    assert!(text.contains("RUNYARD_INGEST_BODY_TIMEOUT"), "{text}");
    // The same body in time goes in; the late one left nothing behind.
    let (s, a) = h.gitlab("Job Hook", "late-2", &job).await;
    assert_eq!(s, 202, "{a}");
    assert_eq!(decode_events(&h.events().await).len(), 1);
    assert_eq!(metric(&h, "runyard_ingest_in_flight").await, 0);
    h.stop().await;
}

#[tokio::test]
async fn an_unsigned_github_delivery_is_refused_before_its_body_is_read() {
    use tokio::io::AsyncWriteExt as _;
    let mut h = Harness::start().await;
    let addr = h.base.trim_start_matches("http://").to_owned();
    // A 20 MiB body announced, none of it sent: without a well-formed
    // signature the answer is 401 at once, not `100 Continue` (which would
    // mean the server wants the body).
    for (signature, why) in [
        (None, "signature or token missing"),
        (Some("sha256=zz"), "signature malformed"),
        (Some("sha1=0123"), "signature malformed"),
    ] {
        let mut conn = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        let signature = signature
            .map(|s| format!("X-Hub-Signature-256: {s}\r\n"))
            .unwrap_or_default();
        let head = format!(
            "POST /webhooks/github HTTP/1.1\r\nHost: {addr}\r\nX-GitHub-Event: workflow_job\r\n\
             X-GitHub-Delivery: unsigned-1\r\n{signature}Content-Type: application/json\r\n\
             Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            20 * 1024 * 1024
        );
        conn.write_all(head.as_bytes()).await.expect("write head");
        let mut buf = Vec::new();
        let answer = tokio::time::timeout(Duration::from_secs(5), read_head(&mut conn, &mut buf))
            .await
            .expect("answered without the body");
        assert!(answer.starts_with("HTTP/1.1 401 "), "{answer}");
        let text = String::from_utf8_lossy(&buf);
        assert!(text.contains(why), "{text}");
    }
    // A well-formed but wrong signature needs the whole body to be judged;
    // its body is hashed as it arrives and the delivery refused.
    let body = fixture("github_workflow_job_queued.json");
    let wrong = github_signature("another secret", body.as_bytes());
    let held = hold_delivery(&addr, "wrong-1", &wrong, body.len()).await;
    assert!(release(held, body.as_bytes()).await.contains(" 401 "));
    // Sent in small chunks, a signed body verifies as one sent at once.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> =
        body.as_bytes().chunks(7).map(|c| Ok(c.to_vec())).collect();
    let resp = h
        .github_post("workflow_job", "chunked-1", body.as_bytes())
        .header("Content-Type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .expect("sent");
    assert_eq!(resp.status().as_u16(), 202);
    let ids: Vec<_> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(ids, ["github:chunked-1"]);
    h.stop().await;
}

/// A signed `workflow_job` delivery of `body` to `url`, as a forge sends it
/// (and sends it again after a 503).
fn signed_delivery(
    http: &reqwest::Client,
    url: &str,
    delivery: &str,
    body: &str,
) -> reqwest::RequestBuilder {
    http.post(url)
        .header("X-GitHub-Event", "workflow_job")
        .header("X-GitHub-Delivery", delivery)
        .header(
            "X-Hub-Signature-256",
            github_signature(GH_SECRET, body.as_bytes()),
        )
        .body(body.to_owned())
}

/// Sends SIGSTOP or SIGCONT to a process this test started.
fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {sig} {pid}");
}

#[tokio::test]
async fn nats_frozen_under_load_then_retries_lose_and_double_nothing() {
    let server = NatsServer::start().await;
    let pid = server.pid().expect("running");
    let mut h = Harness::start_with(TestNats::Shared(server.url()), |c| {
        c.ingest_ack_timeout = Duration::from_secs(1);
    })
    .await;
    let body = fixture("github_workflow_job_queued.json");
    assert_eq!(h.github("workflow_job", "before", &body).await.0, 202);

    // Frozen with deliveries in flight: each waits for its ack, is answered
    // 503, and is retried (as a forge would) until it is answered 202.
    signal(pid, "-STOP");
    let mut senders = Vec::new();
    for i in 0..40 {
        let http = h.http.clone();
        let url = format!("{}/webhooks/github", h.base);
        let body = body.clone();
        senders.push(tokio::spawn(async move {
            let mut unavailable = 0;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let resp = signed_delivery(&http, &url, &format!("frozen-{i}"), &body)
                    .send()
                    .await
                    .expect("answered");
                match resp.status().as_u16() {
                    202 => {
                        let a: Value = resp.json().await.expect("json");
                        return (unavailable, a["duplicate"].as_bool().expect("flag"));
                    }
                    503 => {
                        assert!(resp.headers().get("retry-after").is_some());
                        unavailable += 1;
                    }
                    other => panic!("answered {other}"),
                }
                assert!(Instant::now() < deadline, "frozen-{i} never accepted");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    // Longer than the ack timeout, so deliveries are answered 503 while
    // their messages wait in the server's socket.
    tokio::time::sleep(Duration::from_secs(3)).await;
    signal(pid, "-CONT");
    let mut refused = 0;
    let mut duplicates = 0;
    for s in senders {
        let (unavailable, duplicate) = s.await.expect("sender");
        refused += unavailable;
        duplicates += usize::from(duplicate);
    }
    assert!(refused > 0, "the freeze was not felt");
    // A 503 does not mean "not stored": messages sent during the freeze
    // were stored once NATS went on, so their retries are duplicates.
    assert!(duplicates > 0, "no 503 turned out to be stored");
    let mut ids: Vec<_> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    let stored = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (stored, ids.len()),
        (41, 41),
        "each delivery stored exactly once"
    );
    assert_eq!(h.raw().await.len(), 41);
    println!("frozen: {refused} answers 503, {duplicates} of 40 accepted as duplicates");
    h.stop().await;
}

/// `n` signed `workflow_job` deliveries (`<prefix>-<i>`), started 50 ms
/// apart, each retried every 100 ms after a 503 until answered 202 (any
/// other answer fails the test), within `limit`. Each task returns how many
/// 503s its delivery got.
fn forge_senders(
    h: &Harness,
    prefix: &'static str,
    n: u64,
    limit: Duration,
) -> Vec<JoinHandle<u32>> {
    let body = fixture("github_workflow_job_queued.json");
    (0..n)
        .map(|i| {
            let http = h.http.clone();
            let url = format!("{}/webhooks/github", h.base);
            let body = body.clone();
            tokio::spawn(async move {
                let mut unavailable = 0;
                let deadline = Instant::now() + limit;
                tokio::time::sleep(Duration::from_millis(50 * i)).await;
                loop {
                    let resp = signed_delivery(&http, &url, &format!("{prefix}-{i}"), &body)
                        .send()
                        .await
                        .expect("answered");
                    match resp.status().as_u16() {
                        202 => return unavailable,
                        503 => unavailable += 1,
                        other => panic!("answered {other}"),
                    }
                    assert!(Instant::now() < deadline, "{prefix}-{i} never accepted");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        })
        .collect()
}

#[tokio::test]
async fn nats_killed_under_load_then_retries_lose_and_double_nothing() {
    let mut server = NatsServer::start().await;
    let mut h = Harness::start_with(TestNats::Shared(server.url()), |c| {
        c.ingest_ack_timeout = Duration::from_secs(1);
    })
    .await;
    // Senders keep going through the outage, retrying each 503 as a forge
    // would, until every delivery is answered 202.
    let senders = forge_senders(&h, "killed", 40, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.stop().await; // SIGKILL
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.start_again().await;
    let mut refused = 0;
    for s in senders {
        refused += s.await.expect("sender");
    }
    assert!(refused > 0, "the outage was not felt");
    let client = async_nats::connect(server.url()).await.unwrap();
    let mut ids: Vec<_> = decode_events(&stream_messages(&client, &h.ns.events_stream()).await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    let stored = ids.len();
    ids.sort();
    ids.dedup();
    assert_eq!(
        (stored, ids.len()),
        (40, 40),
        "each delivery stored exactly once"
    );
    println!("killed: {refused} answers 503, 40 of 40 stored once");
    h.stop().await;
}

#[tokio::test]
async fn a_full_event_log_refuses_new_deliveries_and_drops_none_it_accepted() {
    let mut h = Harness::start_with(TestNats::get().await, |c| {
        c.events_max_bytes = bytesize::ByteSize::kib(16);
        c.raw_max_bytes = bytesize::ByteSize::kib(8);
    })
    .await;
    let mut accepted = Vec::new();
    let mut refused = None;
    for job in 1..=500u64 {
        let body = with("usage_report.json", "/job_id", json!(job)).to_string();
        let (status, answer) = h.usage(&body).await;
        if status == 202 {
            accepted.push(answer["event_id"].as_str().unwrap_or_default().to_owned());
        } else {
            refused = Some((status, answer));
            break;
        }
    }
    let (status, answer) = refused.expect("16 KiB of events fill the log");
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .is_some_and(|e| e.contains("RUNYARD_EVENTS_MAX_BYTES")),
        "{answer}"
    );
    assert!(accepted.len() >= 10, "{} accepted", accepted.len());
    // Every delivery answered 202 is on the log, once, in order: a full
    // log refuses, it never makes room by dropping.
    let stored: Vec<String> = decode_events(&h.events().await)
        .into_iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(stored, accepted);
    // Raw deliveries give way, oldest first, within their own bound.
    let raw = h.raw().await;
    let raw_bytes: usize = raw.iter().map(|m| m.payload.len()).sum();
    assert!(raw_bytes <= 8 * 1024, "{raw_bytes} raw bytes");
    assert!(raw.len() < accepted.len(), "{} raw kept", raw.len());
    h.stop().await;
}

#[tokio::test]
async fn a_three_node_cluster_losing_its_leader_under_load_loses_nothing_acknowledged() {
    let mut cluster = NatsCluster::start().await;
    let mut h = Harness::start_with(TestNats::Shared(cluster.urls()), |c| {
        c.streams.replicas = 3;
        c.ingest_ack_timeout = Duration::from_secs(2);
    })
    .await;
    let ready = eventually(Duration::from_secs(30), || async {
        let r = h.http.get(format!("{}/readyz", h.base)).send().await.ok()?;
        (r.status() == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "ingest ready on the cluster");
    let js = async_nats::jetstream::new(h.nats.clone());
    let mut stream = js.get_stream(h.ns.events_stream()).await.unwrap();
    let info = stream.info().await.unwrap();
    assert_eq!(info.config.num_replicas, 3);
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("the events stream has a leader");
    let leader: usize = leader.trim_start_matches('n').parse().unwrap();
    // Senders spread over the loss of the stream's leader, retrying each
    // 503 as a forge would, until every delivery is answered 202.
    let senders = forge_senders(&h, "cluster", 60, Duration::from_secs(90));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.kill(leader).await; // SIGKILL, and it stays down
    let mut refused = 0;
    for s in senders {
        refused += s.await.expect("sender");
    }
    // What the two survivors hold: each delivery exactly once.
    let survivor = async_nats::connect(cluster.url((leader + 1) % 3))
        .await
        .unwrap();
    // Once the survivors have elected the stream's new leader, it can be
    // read (an election on a loaded 2-core machine has taken over 20 s).
    let msgs = eventually(Duration::from_secs(60), || async {
        try_stream_messages(&survivor, &h.ns.events_stream())
            .await
            .ok()
            .filter(|m| m.len() >= 60)
    })
    .await
    .expect("the survivors serve the stream");
    let ids: Vec<String> = decode_events(&msgs).into_iter().map(|e| e.id).collect();
    let stored = ids.len();
    let mut distinct = ids;
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        (stored, distinct.len()),
        (60, 60),
        "each delivery stored exactly once"
    );
    println!("cluster: leader n{leader} killed, {refused} answers 503, 60 of 60 stored once");
    h.stop().await;
}

/// A signed usage report over `client` to `base` (https): its status.
async fn usage_over(client: &reqwest::Client, base: &str) -> Result<u16, reqwest::Error> {
    let body = fixture("usage_report.json");
    let resp = client
        .post(format!("{base}/v1/usage"))
        .bearer_auth(USAGE_TOKEN)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await?;
    Ok(resp.status().as_u16())
}

#[tokio::test]
async fn tls_on_the_listener_and_mtls_with_a_client_ca() {
    let pki = runyard_testkit::pki::TestPki::new();
    let with_tls = |ca: Option<std::path::PathBuf>| {
        let (cert, key) = (pki.server.cert.clone(), pki.server.key.clone());
        move |c: &mut Config| {
            c.tls.cert = Some(cert);
            c.tls.key = Some(key);
            c.tls.client_ca = ca;
        }
    };

    let mut h = Harness::start_with(TestNats::get().await, with_tls(None)).await;
    let https = h.base.replace("http://", "https://");
    let status = usage_over(&pki.https_client(None), &https).await.unwrap();
    assert_eq!(status, 202, "a usage report over https is accepted");
    let plain = h
        .http
        .get(format!("{}/healthz", h.base))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "plaintext answered: {plain:?}");
    h.stop().await;

    let mut h =
        Harness::start_with(TestNats::get().await, with_tls(Some(pki.ca_file.clone()))).await;
    let https = h.base.replace("http://", "https://");
    for (who, identity) in [("none", None), ("another CA's", Some(&pki.other_client))] {
        let refused = usage_over(&pki.https_client(identity), &https).await;
        assert!(refused.is_err(), "client certificate {who}: {refused:?}");
    }
    let status = usage_over(&pki.https_client(Some(&pki.client)), &https)
        .await
        .unwrap();
    assert_eq!(status, 202);
    assert_eq!(
        h.events().await.len(),
        1,
        "the accepted report, nothing of the refused"
    );
    h.stop().await;

    // Half a setting refuses to start, naming both variables.
    let ns = unique_namespace();
    let mut config = test_config(TestNats::get().await.url(), &ns);
    config.tls.key = Some(pki.server.key.clone());
    let e = format!("{:#}", App::build(config).await.unwrap_err());
    assert!(
        e.contains("RUNYARD_INGEST_TLS_CERT") && e.contains("RUNYARD_INGEST_TLS_KEY"),
        "{e}"
    );
}
