//! Property tests of the normalizers' promises, on the entry points the
//! fuzz targets (`fuzz/`) drive, with the same checks
//! (`src/testing/invariants.rs`): real payloads with members given hostile
//! values (NUL, ids past `i64::MAX`, huge and negative numbers, long
//! strings, many labels), and exact answers for the members that matter.

use proptest::prelude::*;
use proptest::sample::Index;
use runyard_events::{Body, Event, JobObserved};
use runyard_forge::testing::generators::{
    self, FIXTURE_RX, GITHUB_FIXTURES, GITLAB_JOB_FIXTURES, GITLAB_PIPELINE, USAGE,
};
use runyard_forge::testing::invariants;
use runyard_forge::{
    GithubDelivery, GitlabDelivery, Normalized, PayloadError, normalize_github, normalize_gitlab,
    normalize_usage,
};
use serde_json::{Value, json};
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

const DELIVERY: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
const KEY: &str = "6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10";
const COMPLETED: &str = GITHUB_FIXTURES[3];
const FAILED: &str = GITLAB_JOB_FIXTURES[2];
/// Past what a Postgres `bigint` holds: carried, for the door to refuse.
const PAST_BIGINT: u64 = i64::MAX as u64 + 1;

fn github(body: &[u8]) -> GithubDelivery<'_> {
    GithubDelivery {
        event: Some("workflow_job"),
        delivery_id: Some(DELIVERY),
        hook_id: Some("292430182"),
        enterprise_host: None,
        content_type: Some("application/json"),
        body,
        received_at: FIXTURE_RX,
    }
}

fn gitlab<'a>(event: &'a str, body: &'a [u8]) -> GitlabDelivery<'a> {
    GitlabDelivery {
        event: Some(event),
        idempotency_key: Some(KEY),
        event_uuid: None,
        webhook_uuid: Some("a3f1c2d4"),
        instance: Some("https://gitlab.example.com"),
        content_type: None,
        body,
        received_at: FIXTURE_RX,
    }
}

/// Normalizes and checks a GitHub delivery.
fn run_github(d: &GithubDelivery<'_>) -> Result<Normalized, PayloadError> {
    let r = normalize_github(d);
    invariants::github(d, &r);
    r
}

fn run_gitlab(d: &GitlabDelivery<'_>) -> Result<Normalized, PayloadError> {
    let r = normalize_gitlab(d);
    invariants::gitlab(d, &r);
    r
}

fn run_usage(body: &[u8]) -> Result<Event, PayloadError> {
    let r = normalize_usage(None, body, FIXTURE_RX);
    invariants::usage(None, body, FIXTURE_RX, &r);
    r
}

/// The only job of an answer.
fn job(r: &Result<Normalized, PayloadError>) -> JobObserved {
    match r {
        Ok(Normalized::Events(events)) => match events.last().and_then(|e| e.body.as_ref()) {
            Some(Body::JobObserved(j)) => j.clone(),
            other => panic!("not a job: {other:?}"),
        },
        other => panic!("not accepted: {other:?}"),
    }
}

/// The field an answer's rejection names.
fn refused(r: &Result<Normalized, PayloadError>) -> String {
    match r {
        Err(e) => e.field().unwrap_or_default().to_owned(),
        Ok(n) => panic!("accepted: {n:?}"),
    }
}

/// `fixture` with `value` at `pointer`.
fn with(fixture: &str, pointer: &str, value: Value) -> Vec<u8> {
    let mut v: Value = serde_json::from_str(fixture).expect("fixtures are JSON");
    *v.pointer_mut(pointer).expect("pointer in fixture") = value;
    serde_json::to_vec(&v).expect("serializes")
}

/// Strings the rest of runyard cannot or need not hold: NUL, control
/// characters, long ones, any Unicode.
fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{0,8}\u{0}[a-z]{0,8}",
        "\\PC{0,16}",
        any::<String>(),
        (1000_usize..5000).prop_map(|n| "x".repeat(n)),
    ]
}

/// Values for any member: the vocabulary of the payloads and the extremes.
fn hostile() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => generators::leaf(),
        1 => hostile_string().prop_map(Value::String),
        1 => prop_oneof![
            Just(json!(PAST_BIGINT)),
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            Just(json!(-1)),
            Just(json!(0)),
            Just(json!(1e300)),
            Just(json!(-0.0)),
        ],
        1 => prop::collection::vec(hostile_string().prop_map(Value::String), 0..100)
            .prop_map(Value::Array),
        1 => generators::json(),
    ]
}

/// An id as JSON: integers of every size, and what is not an integer.
fn id_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(PAST_BIGINT)),
        Just(json!(u64::MAX)),
        Just(json!(0)),
        any::<f64>().prop_map(Value::from),
        "[0-9]{1,20}".prop_map(Value::String),
        Just(json!(true)),
    ]
}

/// The id a JSON value is accepted as, if any: a positive integer.
fn as_id(v: &Value) -> Option<u64> {
    v.as_u64().filter(|n| *n > 0)
}

/// `t` in one of the forms the forges send.
fn formatted(t: OffsetDateTime, form: u8) -> String {
    use time::format_description::well_known::Rfc3339;
    let ruby = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    match form % 3 {
        0 => t.format(&Rfc3339).expect("formats"),
        1 => format!("{} UTC", t.format(&ruby).expect("formats")),
        _ => {
            let local = t.to_offset(time::macros::offset!(+1));
            format!("{} +0100", local.format(&ruby).expect("formats"))
        }
    }
}

/// Pointers into the fixtures that the normalizers read, and some they
/// skip.
const GITHUB_POINTERS: &[&str] = &[
    "/action",
    "/workflow_job/id",
    "/workflow_job/run_id",
    "/workflow_job/run_attempt",
    "/workflow_job/name",
    "/workflow_job/workflow_name",
    "/workflow_job/labels",
    "/workflow_job/conclusion",
    "/workflow_job/runner_id",
    "/workflow_job/runner_name",
    "/workflow_job/runner_group_id",
    "/workflow_job/head_branch",
    "/workflow_job/created_at",
    "/workflow_job/started_at",
    "/workflow_job/completed_at",
    "/workflow_job/steps",
    "/repository/id",
    "/repository/full_name",
    "/repository/html_url",
    "/organization",
    "/enterprise/slug",
    "/sender",
];
const GITLAB_JOB_POINTERS: &[&str] = &[
    "/object_kind",
    "/build_id",
    "/build_name",
    "/build_stage",
    "/build_status",
    "/build_duration",
    "/build_failure_reason",
    "/build_finished_at_iso",
    "/retries_count",
    "/pipeline_id",
    "/project_id",
    "/runner/id",
    "/runner/tags",
    "/runner/description",
    "/project/web_url",
    "/commit",
];
const GITLAB_PIPELINE_POINTERS: &[&str] = &[
    "/object_attributes/id",
    "/object_attributes/status",
    "/object_attributes/duration",
    "/object_attributes/created_at",
    "/object_attributes/ref",
    "/project/id",
    "/project/web_url",
    "/builds",
    "/builds/0/id",
    "/builds/0/status",
    "/builds/1/runner",
    "/builds/1/name",
    "/builds/2/retries_count",
];
const USAGE_POINTERS: &[&str] = &[
    "/forge",
    "/instance",
    "/job_id",
    "/attempt",
    "/ref",
    "/workload",
    "/workload/package",
    "/peak_memory_bytes",
    "/memory_limit_bytes",
    "/cpu_seconds",
    "/exit_code",
    "/cgroup",
];

/// One of `fixtures` with hostile values at up to three of `pointers` (a
/// pointer the fixture lacks is left alone).
fn hostile_body(
    fixtures: &'static [&'static str],
    pointers: &'static [&'static str],
) -> impl Strategy<Value = Vec<u8>> {
    (
        any::<Index>(),
        prop::collection::vec((any::<Index>(), hostile()), 1..4),
    )
        .prop_map(move |(which, changes)| {
            let fixture = fixtures[which.index(fixtures.len())];
            let mut v: Value = serde_json::from_str(fixture).expect("fixtures are JSON");
            for (at, value) in changes {
                if let Some(slot) = v.pointer_mut(pointers[at.index(pointers.len())]) {
                    *slot = value;
                }
            }
            serde_json::to_vec(&v).expect("serializes")
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn github_answers_keep_their_promises(
        body in hostile_body(GITHUB_FIXTURES, GITHUB_POINTERS),
        enterprise in prop::option::of(prop::sample::select(&["GHES.corp.example:8443", "bad host", " "][..])),
    ) {
        let d = GithubDelivery { enterprise_host: enterprise, ..github(&body) };
        invariants::github_form_matches_json(&d);
        let _ = run_github(&d);
    }

    #[test]
    fn gitlab_job_answers_keep_their_promises(
        body in hostile_body(GITLAB_JOB_FIXTURES, GITLAB_JOB_POINTERS),
        instance in prop::option::of(prop::sample::select(&["https://GitLab.example.com:8443/gitlab", "not a url"][..])),
    ) {
        let _ = run_gitlab(&GitlabDelivery { instance, ..gitlab("Job Hook", &body) });
    }

    #[test]
    fn gitlab_pipeline_answers_keep_their_promises(
        body in hostile_body(&[GITLAB_PIPELINE], GITLAB_PIPELINE_POINTERS),
    ) {
        let _ = run_gitlab(&gitlab("Pipeline Hook", &body));
    }

    #[test]
    fn usage_answers_keep_their_promises(body in hostile_body(&[USAGE], USAGE_POINTERS)) {
        let _ = run_usage(&body);
    }

    #[test]
    fn random_json_answers_keep_their_promises(value in generators::json()) {
        let body = serde_json::to_vec(&value).expect("serializes");
        let _ = run_github(&github(&body));
        let _ = run_gitlab(&gitlab("Job Hook", &body));
        let _ = run_gitlab(&gitlab("Pipeline Hook", &body));
        let _ = run_usage(&body);
    }

    /// A job id is accepted exactly when it is a positive integer, and then
    /// carried as sent, past `i64::MAX` too (ingest refuses that at the
    /// door, naming the field); anything else is refused naming the field.
    #[test]
    fn job_ids_are_carried_or_refused_by_name(v in id_value()) {
        let body = with(COMPLETED, "/workflow_job/id", v.clone());
        let r = run_github(&github(&body));
        match as_id(&v) {
            Some(id) => prop_assert_eq!(job(&r).job.as_ref().map(|k| k.job_id), Some(id)),
            None => prop_assert_eq!(refused(&r), "workflow_job.id"),
        }

        let body = with(FAILED, "/build_id", v.clone());
        let r = run_gitlab(&gitlab("Job Hook", &body));
        match as_id(&v) {
            Some(id) => prop_assert_eq!(job(&r).job.as_ref().map(|k| k.job_id), Some(id)),
            None => prop_assert_eq!(refused(&r), "build_id"),
        }

        let body = with(GITLAB_PIPELINE, "/builds/1/id", v.clone());
        let r = run_gitlab(&gitlab("Pipeline Hook", &body));
        match as_id(&v) {
            Some(id) => {
                let Ok(Normalized::Events(events)) = &r else { panic!("{r:?}") };
                let Some(Body::PipelineObserved(p)) = &events[0].body else { panic!("{events:?}") };
                prop_assert_eq!(p.job_ids.get(1), Some(&id));
            }
            None => prop_assert_eq!(refused(&r), "builds[1].id"),
        }

        let body = with(USAGE, "/peak_memory_bytes", v.clone());
        match run_usage(&body) {
            Ok(e) => {
                let Some(Body::UsageReported(u)) = &e.body else { panic!("{e:?}") };
                prop_assert_eq!(Some(u.peak_memory_bytes), v.as_u64());
            }
            Err(e) => {
                prop_assert_eq!(v.as_u64(), None);
                prop_assert_eq!(e.field(), Some("peak_memory_bytes"));
            }
        }
    }

    /// Any string is carried exactly as sent, NUL and all (ingest's door
    /// refuses NUL, naming the field, so it must see it); another type is
    /// refused naming the field.
    #[test]
    fn strings_are_carried_verbatim(
        s in hostile_string(),
        labels in prop::collection::vec("[a-z0-9 ._-]{0,12}|[a-z]{0,4}\u{0}é", 0..80),
    ) {
        let body = with(COMPLETED, "/workflow_job/name", json!(s));
        prop_assert_eq!(&job(&run_github(&github(&body))).name, &s);
        let body = with(COMPLETED, "/workflow_job/labels", json!(labels));
        prop_assert_eq!(&job(&run_github(&github(&body))).labels, &labels);
        let body = with(COMPLETED, "/workflow_job/head_branch", json!(7));
        prop_assert_eq!(refused(&run_github(&github(&body))), "workflow_job.head_branch");

        let body = with(FAILED, "/build_name", json!(s));
        prop_assert_eq!(&job(&run_gitlab(&gitlab("Job Hook", &body))).name, &s);
        let body = with(FAILED, "/runner/tags", json!(labels));
        prop_assert_eq!(&job(&run_gitlab(&gitlab("Job Hook", &body))).labels, &labels);
        let body = with(FAILED, "/runner/description", json!([s]));
        prop_assert_eq!(refused(&run_gitlab(&gitlab("Job Hook", &body))), "runner.description");

        let body = with(USAGE, "/workload/package", json!(s));
        let e = run_usage(&body).expect("accepted");
        let Some(Body::UsageReported(u)) = &e.body else { panic!("{e:?}") };
        prop_assert_eq!(u.workload.get("package"), Some(&s));
    }

    /// A completion time is accepted in every forge format exactly when it
    /// lies in `[2000-01-01, received + 1 day]`, and then kept to the
    /// second; otherwise the error names the field.
    #[test]
    fn timestamps_are_kept_inside_the_window_only(
        secs in (datetime!(1995-01-01 00:00 UTC).unix_timestamp())..(datetime!(2030-01-01 00:00 UTC).unix_timestamp()),
        form in any::<u8>(),
    ) {
        let t = OffsetDateTime::from_unix_timestamp(secs).expect("in range");
        let inside = t >= datetime!(2000-01-01 00:00 UTC) && t <= FIXTURE_RX + Duration::DAY;
        let at = |j: JobObserved| j.completed_at.as_ref().and_then(runyard_events::from_timestamp);

        let body = with(COMPLETED, "/workflow_job/completed_at", json!(formatted(t, 0)));
        let r = run_github(&github(&body));
        if inside {
            prop_assert_eq!(at(job(&r)), Some(t));
        } else {
            prop_assert_eq!(refused(&r), "workflow_job.completed_at");
        }

        let body = with(FAILED, "/build_finished_at_iso", json!(formatted(t, form)));
        let r = run_gitlab(&gitlab("Job Hook", &body));
        if inside {
            prop_assert_eq!(at(job(&r)), Some(t));
        } else {
            prop_assert_eq!(refused(&r), "build_finished_at_iso");
        }
    }
}
