//! Property tests: no input makes a normalizer panic, and whatever a
//! normalizer accepts is a well-formed event.
//!
//! Three kinds of input: arbitrary bytes, arbitrary JSON built from the
//! vocabulary of the real payloads (so it reaches deep into the
//! normalizers), and the fixtures with random fields replaced or removed.

use proptest::prelude::*;
use proptest::sample::Index;
use runyard_events::{Body, Event};
use runyard_forge::{
    GithubDelivery, GitlabDelivery, Normalized, PayloadError, normalize_github, normalize_gitlab,
    normalize_usage,
};
use serde_json::{Map, Number, Value};
use time::OffsetDateTime;
use time::macros::datetime;

const FIXTURE_RX: OffsetDateTime = datetime!(2024-06-01 12:20:00 UTC);

const GITHUB_FIXTURES: &[&str] = &[
    include_str!("fixtures/github_workflow_job_queued.json"),
    include_str!("fixtures/github_workflow_job_waiting.json"),
    include_str!("fixtures/github_workflow_job_in_progress.json"),
    include_str!("fixtures/github_workflow_job_completed.json"),
];
const GITLAB_JOB_FIXTURES: &[&str] = &[
    include_str!("fixtures/gitlab_job_pending.json"),
    include_str!("fixtures/gitlab_job_running.json"),
    include_str!("fixtures/gitlab_job_failed.json"),
    include_str!("fixtures/gitlab_job_manual.json"),
];
const GITLAB_PIPELINE: &str = include_str!("fixtures/gitlab_pipeline_failed.json");
const USAGE: &str = include_str!("fixtures/usage_report.json");

/// Keys the normalizers look for, so random objects hit real code paths.
const KEYS: &[&str] = &[
    "action",
    "workflow_job",
    "id",
    "run_id",
    "run_attempt",
    "name",
    "workflow_name",
    "labels",
    "conclusion",
    "runner_id",
    "runner_name",
    "runner_group_id",
    "runner_group_name",
    "head_branch",
    "head_sha",
    "created_at",
    "started_at",
    "completed_at",
    "html_url",
    "repository",
    "full_name",
    "organization",
    "login",
    "enterprise",
    "slug",
    "object_kind",
    "build_id",
    "build_name",
    "build_stage",
    "build_status",
    "build_created_at",
    "build_started_at",
    "build_finished_at",
    "build_created_at_iso",
    "build_finished_at_iso",
    "build_duration",
    "build_queued_duration",
    "build_failure_reason",
    "build_allow_failure",
    "retries_count",
    "pipeline_id",
    "project_id",
    "project_name",
    "project",
    "path_with_namespace",
    "web_url",
    "homepage",
    "ref",
    "sha",
    "tag",
    "runner",
    "description",
    "tags",
    "object_attributes",
    "status",
    "source",
    "finished_at",
    "duration",
    "queued_duration",
    "url",
    "builds",
    "stage",
    "failure_reason",
    "allow_failure",
    "forge",
    "instance",
    "job_id",
    "attempt",
    "workload",
    "peak_memory_bytes",
    "memory_request_bytes",
    "memory_limit_bytes",
    "cpu_seconds",
    "wall_seconds",
    "cpu_request_millicores",
    "oom_killed",
    "exit_code",
];

/// Values that mean something to the normalizers.
const WORDS: &[&str] = &[
    "queued",
    "waiting",
    "in_progress",
    "completed",
    "success",
    "failure",
    "cancelled",
    "created",
    "pending",
    "running",
    "failed",
    "canceled",
    "skipped",
    "manual",
    "waiting_for_resource",
    "build",
    "pipeline",
    "github",
    "gitlab",
    "gitlab.example.com",
    "https://gitlab.example.com/a/b",
    "https://[::1",
    "http://",
    "2024-06-01T12:00:00Z",
    "2024-06-01 12:00:00 UTC",
    "2024-06-01 12:00:00 +0100",
    "1999-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "-0001-01-01T00:00:00Z",
    "2024-02-30 12:00:00 UTC",
    "2024-06-01T12:00:00.999999999999Z",
    "",
    " ",
    "a\r\nb",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        prop_oneof![
            Just(0_u64),
            Just(1),
            Just(u64::from(u32::MAX)),
            Just(u64::MAX)
        ]
        .prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        prop::sample::select(WORDS).prop_map(|s| Value::String(s.to_owned())),
        any::<String>().prop_map(Value::String),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 96, 8, |inner| {
        let key = prop_oneof![
            4 => prop::sample::select(KEYS).prop_map(str::to_owned),
            1 => any::<String>(),
        ];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..10)
                .prop_map(|kvs| Value::Object(kvs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn content_type() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        3 => Just(None),
        3 => Just(Some("application/json".to_owned())),
        1 => Just(Some("application/json; charset=utf-8".to_owned())),
        1 => Just(Some("application/x-www-form-urlencoded".to_owned())),
        1 => any::<String>().prop_map(Some),
    ]
}

fn received_at() -> impl Strategy<Value = OffsetDateTime> {
    prop_oneof![
        3 => Just(FIXTURE_RX),
        1 => (-377_705_116_800_i64..=253_402_300_799)
            .prop_filter_map("in range", |s| OffsetDateTime::from_unix_timestamp(s).ok()),
        1 => Just(datetime!(9999-12-31 23:59:59.999999999 UTC)),
    ]
}

/// Every JSON pointer in `v` (the root excluded).
fn pointers(v: &Value, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, &p, out);
            }
        }
        _ => {}
    }
}

/// Applies mutations to a fixture: each replaces (or, with `None`, removes)
/// the value at a randomly chosen pointer.
fn mutate(fixture: &str, mutations: &[(Index, Option<Value>)]) -> Vec<u8> {
    let mut v: Value = serde_json::from_str(fixture).expect("fixtures are JSON");
    for (index, replacement) in mutations {
        let mut all = Vec::new();
        pointers(&v, "", &mut all);
        if all.is_empty() {
            break;
        }
        let pointer = &all[index.index(all.len())];
        match replacement {
            Some(new) => {
                if let Some(slot) = v.pointer_mut(pointer) {
                    *slot = new.clone();
                }
            }
            None => {
                let (parent, key) = pointer.rsplit_once('/').expect("pointers have a slash");
                match v.pointer_mut(parent) {
                    Some(Value::Object(m)) => {
                        m.remove(&key.replace("~1", "/").replace("~0", "~"));
                    }
                    Some(Value::Array(items)) => {
                        if let Some(i) = key.parse::<usize>().ok().filter(|i| *i < items.len()) {
                            items.remove(i);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    serde_json::to_vec(&v).expect("serializes")
}

fn mutations() -> impl Strategy<Value = Vec<(Index, Option<Value>)>> {
    prop::collection::vec((any::<Index>(), prop::option::weighted(0.8, json())), 1..4)
}

fn check_event(e: &Event, rx: OffsetDateTime) -> Result<(), TestCaseError> {
    // Ids travel as the `Nats-Msg-Id` header: visible ASCII only.
    prop_assert!(!e.id.is_empty());
    prop_assert!(e.id.bytes().all(|b| b.is_ascii_graphic()), "id {:?}", e.id);
    prop_assert!(e.occurred_at.is_some());
    prop_assert_eq!(e.received_at, Some(runyard_events::timestamp(rx)));
    let source = e.source.as_ref().expect("source");
    prop_assert_eq!(source.producer.as_str(), "ingest");
    prop_assert!(!source.instance.is_empty());
    prop_assert!(!source.delivery_id.is_empty());
    prop_assert!(e.body.is_some());
    if let Some(Body::JobObserved(j)) = &e.body {
        let key = j.job.as_ref().expect("job key");
        prop_assert!(key.job_id > 0);
        prop_assert_eq!(&key.instance, &source.instance);
    }
    Ok(())
}

fn check(
    result: Result<Normalized, PayloadError>,
    rx: OffsetDateTime,
) -> Result<(), TestCaseError> {
    match result {
        Ok(Normalized::Events(events)) => {
            prop_assert!(!events.is_empty());
            for e in &events {
                check_event(e, rx)?;
            }
        }
        Ok(Normalized::Ignored(reason)) => prop_assert!(!reason.is_empty()),
        Err(PayloadError::Invalid { field, reason }) => {
            prop_assert!(!field.is_empty());
            prop_assert!(!reason.is_empty());
        }
        Err(PayloadError::UnsupportedMediaType(_)) => {}
    }
    Ok(())
}

fn github<'a>(
    event: Option<&'a str>,
    ct: Option<&'a str>,
    body: &'a [u8],
    rx: OffsetDateTime,
) -> GithubDelivery<'a> {
    GithubDelivery {
        event,
        delivery_id: Some("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        hook_id: Some("292430182"),
        enterprise_host: None,
        content_type: ct,
        body,
        received_at: rx,
    }
}

fn gitlab<'a>(
    event: Option<&'a str>,
    ct: Option<&'a str>,
    body: &'a [u8],
    rx: OffsetDateTime,
) -> GitlabDelivery<'a> {
    GitlabDelivery {
        event,
        idempotency_key: Some("6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10"),
        event_uuid: None,
        webhook_uuid: Some("a3f1c2d4"),
        instance: Some("https://gitlab.example.com"),
        content_type: ct,
        body,
        received_at: rx,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(
        body in prop::collection::vec(any::<u8>(), 0..512),
        ct in content_type(),
        rx in received_at(),
    ) {
        let ct = ct.as_deref();
        for event in ["workflow_job", "ping"] {
            check(normalize_github(&github(Some(event), ct, &body, rx)), rx)?;
        }
        for event in ["Job Hook", "Pipeline Hook"] {
            check(normalize_gitlab(&gitlab(Some(event), ct, &body, rx)), rx)?;
        }
        if let Ok(e) = normalize_usage(ct, &body, rx) {
            check_event(&e, rx)?;
        }
    }

    #[test]
    fn arbitrary_json_never_panics(value in json(), rx in received_at(), form in any::<bool>()) {
        let body = serde_json::to_vec(&value).expect("serializes");
        let encoded = serde_urlencoded::to_string([("payload", String::from_utf8_lossy(&body))])
            .expect("encodes");
        let gh = if form {
            github(Some("workflow_job"), Some("application/x-www-form-urlencoded"), encoded.as_bytes(), rx)
        } else {
            github(Some("workflow_job"), None, &body, rx)
        };
        check(normalize_github(&gh), rx)?;
        for event in ["Job Hook", "Pipeline Hook"] {
            check(normalize_gitlab(&gitlab(Some(event), None, &body, rx)), rx)?;
        }
        if let Ok(e) = normalize_usage(None, &body, rx) {
            check_event(&e, rx)?;
        }
    }

    #[test]
    fn mutated_github_fixtures_never_panic(
        which in any::<Index>(),
        muts in mutations(),
        rx in received_at(),
    ) {
        let body = mutate(GITHUB_FIXTURES[which.index(GITHUB_FIXTURES.len())], &muts);
        check(normalize_github(&github(Some("workflow_job"), None, &body, rx)), rx)?;
    }

    #[test]
    fn mutated_gitlab_fixtures_never_panic(
        which in any::<Index>(),
        muts in mutations(),
        rx in received_at(),
    ) {
        let body = mutate(GITLAB_JOB_FIXTURES[which.index(GITLAB_JOB_FIXTURES.len())], &muts);
        check(normalize_gitlab(&gitlab(Some("Job Hook"), None, &body, rx)), rx)?;
        let body = mutate(GITLAB_PIPELINE, &muts);
        let result = normalize_gitlab(&gitlab(Some("Pipeline Hook"), None, &body, rx));
        if let Ok(Normalized::Events(events)) = &result {
            let first_is_pipeline = matches!(events.first().and_then(|e| e.body.as_ref()), Some(Body::PipelineObserved(_)));
            prop_assert!(first_is_pipeline);
        }
        check(result, rx)?;
    }

    #[test]
    fn mutated_usage_reports_never_panic(muts in mutations(), rx in received_at()) {
        let body = mutate(USAGE, &muts);
        if let Ok(e) = normalize_usage(None, &body, rx) {
            check_event(&e, rx)?;
        }
    }
}

#[test]
fn unmutated_fixtures_are_accepted() {
    for fixture in GITHUB_FIXTURES {
        let d = github(Some("workflow_job"), None, fixture.as_bytes(), FIXTURE_RX);
        assert!(matches!(normalize_github(&d), Ok(Normalized::Events(_))));
    }
    for fixture in GITLAB_JOB_FIXTURES {
        let d = gitlab(Some("Job Hook"), None, fixture.as_bytes(), FIXTURE_RX);
        assert!(normalize_gitlab(&d).is_ok());
    }
    let d = gitlab(
        Some("Pipeline Hook"),
        None,
        GITLAB_PIPELINE.as_bytes(),
        FIXTURE_RX,
    );
    assert!(matches!(normalize_gitlab(&d), Ok(Normalized::Events(e)) if e.len() == 3));
    assert!(normalize_usage(None, USAGE.as_bytes(), FIXTURE_RX).is_ok());
}
