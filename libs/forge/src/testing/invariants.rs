//! What a normalizer's answer must satisfy, whatever the delivery: the
//! checks shared by the property tests (`tests/forge/prop.rs`) and the fuzz
//! targets (`fuzz/`). Each check panics with what is wrong.
//!
//! Beyond "no panic":
//! - a rejection names a field (short and printable, as it is echoed in the
//!   `400`) and a reason; a `415` names the `Content-Type` that was sent;
//! - an accepted event survives its protobuf encoding unchanged (so no NaN
//!   duration), its id is the documented deterministic one, its instance is
//!   a lower-case host, its timestamps lie in the plausibility window and
//!   convert back, and its durations are finite, non-negative and agree
//!   with its timestamps;
//! - every value an event carries is exactly what a full parse of the body
//!   holds: ids (past `i64::MAX` included), names, labels, workload. The
//!   normalizers do not clean or clamp; ingest's door checks, which run on
//!   their output, refuse a NUL or an id Postgres cannot hold, so they must
//!   see what the sender sent.

use std::collections::HashMap;

use prost::Message as _;
use runyard_events::{
    Body, Conclusion, Event, Forge, JobObserved, JobStatus, PipelineObserved, UsageReported,
    from_timestamp,
};
use serde_json::Value;
use time::macros::datetime;
use time::{Duration, OffsetDateTime};

use crate::{GithubDelivery, GitlabDelivery, Normalized, PayloadError};

/// Longest field name a rejection may echo.
const MAX_FIELD: usize = 256;
/// Longest `Ignored` reason (`event ` and 64 characters of the header).
const MAX_REASON_CHARS: usize = 80;

/// Checks a GitHub delivery's answer.
pub fn github(d: &GithubDelivery<'_>, result: &Result<Normalized, PayloadError>) {
    let events = match result {
        Err(e) => return rejection(e, d.content_type),
        Ok(Normalized::Ignored(reason)) => {
            assert_ne!(d.event, Some("workflow_job"), "ignored: {reason}");
            return ignored(reason);
        }
        Ok(Normalized::Events(events)) => events,
    };
    assert_eq!(d.event, Some("workflow_job"));
    assert_eq!(events.len(), 1, "one event per workflow_job");
    let e = &events[0];
    let delivery = header(d.delivery_id).expect("accepted without X-GitHub-Delivery");
    assert_eq!(e.id, format!("github:{delivery}"));
    let j = common(e, Forge::Github, delivery, d.received_at);
    let source = e.source.as_ref().expect("source");
    assert_eq!(source.hook_id, header(d.hook_id).unwrap_or_default());

    let action = j.forge_status.as_str();
    let want = match action {
        "queued" => JobStatus::Queued,
        "waiting" => JobStatus::Waiting,
        "in_progress" => JobStatus::InProgress,
        "completed" => JobStatus::Completed,
        other => panic!("accepted action {other:?}"),
    };
    assert_eq!(j.status(), want);
    assert_occurred_at(e, j, want, d.received_at);
    // Derived from the timestamps, and only once the job really started.
    let at = |t: &Option<prost_types::Timestamp>| t.as_ref().and_then(from_timestamp);
    for (secs, from, to, allowed) in [
        (
            j.queued_duration_seconds,
            at(&j.created_at),
            at(&j.started_at),
            matches!(want, JobStatus::InProgress | JobStatus::Completed),
        ),
        (
            j.duration_seconds,
            at(&j.started_at),
            at(&j.completed_at),
            want == JobStatus::Completed,
        ),
    ] {
        let Some(secs) = secs else { continue };
        assert!(allowed, "duration {secs} for {action}");
        let (from, to) = (from.expect("derived from"), to.expect("derived to"));
        assert!(
            secs >= 0.0 && secs == (to - from).as_seconds_f64(),
            "duration {secs}"
        );
    }

    let Some(v) = github_json(d) else { return };
    assert_eq!(action, v["action"].as_str().unwrap_or_default());
    let w = &v["workflow_job"];
    assert_eq!(Some(job_id(j)), w["id"].as_u64());
    assert_eq!(j.conclusion(), github_conclusion(&w["conclusion"]));
    assert_eq!(
        u64::from(j.run_attempt),
        w["run_attempt"].as_u64().unwrap_or(0)
    );
    assert_eq!(j.pipeline_id, w["run_id"].as_u64().unwrap_or(0));
    assert_eq!(j.runner_id, w["runner_id"].as_u64());
    assert_eq!(j.runner_group_id, w["runner_group_id"].as_u64());
    assert_eq!(j.labels, strings(&w["labels"]));
    for (got, want) in [
        (&j.name, &w["name"]),
        (&j.workflow_name, &w["workflow_name"]),
        (&j.runner_name, &w["runner_name"]),
        (&j.runner_group_name, &w["runner_group_name"]),
        (&j.r#ref, &w["head_branch"]),
        (&j.sha, &w["head_sha"]),
        (&j.html_url, &w["html_url"]),
        (&j.project, &v["repository"]["full_name"]),
        (&j.organization, &v["organization"]["login"]),
        (&j.enterprise, &v["enterprise"]["slug"]),
    ] {
        assert_eq!(got, text(want));
    }
    assert_eq!(j.project_id, v["repository"]["id"].as_u64().unwrap_or(0));
}

/// Checks a GitLab delivery's answer.
pub fn gitlab(d: &GitlabDelivery<'_>, result: &Result<Normalized, PayloadError>) {
    let hook = d
        .event
        .filter(|e| matches!(*e, "Job Hook" | "Pipeline Hook"));
    let events = match result {
        Err(e) => return rejection(e, d.content_type),
        Ok(Normalized::Ignored(reason)) => {
            ignored(reason);
            if hook.is_some() {
                assert_eq!(d.event, Some("Job Hook"), "ignored: {reason}");
                assert_eq!(reason, "manual job");
                if let Some(v) = full_parse(d.body) {
                    assert_eq!(v["build_status"], "manual");
                }
            }
            return;
        }
        Ok(Normalized::Events(events)) => events,
    };
    let hook = hook.expect("events from a hook that is not normalized");
    let key = header(d.idempotency_key)
        .or_else(|| header(d.event_uuid))
        .expect("accepted without Idempotency-Key or X-Gitlab-Event-UUID");
    let v = full_parse(d.body);
    if hook == "Job Hook" {
        assert_eq!(events.len(), 1, "one event per Job Hook");
        let j = common(&events[0], Forge::Gitlab, key, d.received_at);
        gitlab_job(&events[0], j, key, d.received_at);
        assert_eq!(j.pipeline_status, "");
        if let Some(v) = &v {
            gitlab_build(j, v, &JOB_HOOK);
            assert_eq!(j.pipeline_id, v["pipeline_id"].as_u64().unwrap_or(0));
            assert_eq!(&j.r#ref, text(&v["ref"]));
            assert_eq!(&j.sha, text(&v["sha"]));
            assert_eq!(j.tag, v["tag"].as_bool().unwrap_or(false));
        }
        return;
    }

    let (first, jobs) = events.split_first().expect("never empty");
    let p = match &first.body {
        Some(Body::PipelineObserved(p)) => p,
        other => panic!("a Pipeline Hook starts with {other:?}"),
    };
    envelope(first, Forge::Gitlab, key, d.received_at);
    assert_eq!(
        first.id,
        format!("gitlab:{key}:pipeline:{}:{}", p.pipeline_id, p.status)
    );
    assert!(p.pipeline_id > 0);
    status_word(&p.status);
    assert_eq!(p.instance, first.source.as_ref().expect("source").instance);
    for secs in [p.duration_seconds, p.queued_duration_seconds]
        .into_iter()
        .flatten()
    {
        assert!(secs.is_finite() && secs >= 0.0, "duration {secs}");
    }
    for t in [&p.created_at, &p.finished_at].into_iter().flatten() {
        window(t, d.received_at);
    }
    let occurred = match p.status.as_str() {
        "success" | "failed" | "canceled" | "skipped" => p.finished_at,
        "created" | "pending" => p.created_at,
        _ => None,
    };
    assert_eq!(
        first.occurred_at,
        Some(occurred.unwrap_or(runyard_events::timestamp(d.received_at)))
    );
    assert!(jobs.len() <= p.job_ids.len());
    for e in jobs {
        let j = common(e, Forge::Gitlab, key, d.received_at);
        gitlab_job(e, j, key, d.received_at);
        assert!(p.job_ids.contains(&job_id(j)));
        assert_eq!(e.source, first.source);
        pipeline_context(j, p);
    }
    let Some(v) = v else { return };
    let a = &v["object_attributes"];
    assert_eq!(Some(p.pipeline_id), a["id"].as_u64());
    assert_eq!(p.status, text(&a["status"]).as_str());
    assert_eq!(&p.r#ref, text(&a["ref"]));
    assert_eq!(&p.sha, text(&a["sha"]));
    assert_eq!(&p.pipeline_source, text(&a["source"]));
    assert_eq!(&p.project, text(&v["project"]["path_with_namespace"]));
    assert_eq!(p.project_id, v["project"]["id"].as_u64().unwrap_or(0));
    let builds = v["builds"].as_array().cloned().unwrap_or_default();
    let ids: Vec<_> = builds.iter().map(|b| b["id"].as_u64()).collect();
    assert_eq!(p.job_ids.iter().copied().map(Some).collect::<Vec<_>>(), ids);
    let kept: Vec<_> = builds.iter().filter(|b| b["status"] != "manual").collect();
    assert_eq!(
        jobs.len(),
        kept.len(),
        "one JobObserved per non-manual build"
    );
    for (e, b) in jobs.iter().zip(kept) {
        let Some(Body::JobObserved(j)) = &e.body else {
            unreachable!("checked")
        };
        gitlab_build(j, b, &PIPELINE_BUILD);
    }
}

/// Checks a usage report's answer.
pub fn usage(
    content_type: Option<&str>,
    body: &[u8],
    received_at: OffsetDateTime,
    result: &Result<Event, PayloadError>,
) {
    let e = match result {
        Err(err) => return rejection(err, content_type),
        Ok(e) => e,
    };
    roundtrip(e);
    let u = match &e.body {
        Some(Body::UsageReported(u)) => u,
        other => panic!("a usage report became {other:?}"),
    };
    let key = u.job.as_ref().expect("job key");
    let forge = key.forge();
    assert!(matches!(forge, Forge::Github | Forge::Gitlab));
    host(&key.instance);
    assert!(key.job_id > 0 && u.attempt > 0);
    let forge_word = if forge == Forge::Github {
        "github"
    } else {
        "gitlab"
    };
    assert_eq!(
        e.id,
        format!(
            "usage:{forge_word}:{}:{}:{}",
            key.instance, key.job_id, u.attempt
        )
    );
    let source = e.source.as_ref().expect("source");
    assert_eq!(source.forge(), forge);
    assert_eq!(source.instance, key.instance);
    assert_eq!(source.delivery_id, e.id);
    assert_eq!(source.hook_id, "");
    assert_eq!(source.producer, "ingest");
    let rx = Some(runyard_events::timestamp(received_at));
    assert_eq!((e.occurred_at, e.received_at), (rx, rx));
    assert!(u.identity.is_none(), "identity is ingest's to set");
    assert!(matches!(u.cgroup.as_str(), "" | "v1" | "v2"));
    for x in [u.cpu_seconds, u.wall_seconds] {
        assert!(x.is_finite() && x >= 0.0, "{x}");
    }

    let v = full_parse(body).expect("accepted what a full parse rejects");
    assert_eq!(forge_word, v["forge"]);
    assert_eq!(Some(key.job_id), v["job_id"].as_u64());
    assert_eq!(u64::from(u.attempt), v["attempt"].as_u64().unwrap_or(1));
    usage_values(u, &v);
}

fn usage_values(u: &UsageReported, v: &Value) {
    assert_eq!(Some(u.peak_memory_bytes), v["peak_memory_bytes"].as_u64());
    assert_eq!(u.memory_request_bytes, v["memory_request_bytes"].as_u64());
    assert_eq!(u.memory_limit_bytes, v["memory_limit_bytes"].as_u64());
    assert_eq!(
        u.cpu_request_millicores,
        v["cpu_request_millicores"].as_u64()
    );
    assert_eq!(u.oom_killed, v["oom_killed"].as_bool().unwrap_or(false));
    assert_eq!(u.exit_code.map(i64::from), v["exit_code"].as_i64());
    assert_eq!(&u.r#ref, text(&v["ref"]));
    assert_eq!(&u.project, text(&v["project"]));
    let workload: HashMap<String, String> = v["workload"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().expect("accepted a non-string").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(u.workload, workload);
}

/// Where a build's fields sit in the body.
struct BuildKeys {
    id: &'static str,
    name: &'static str,
    stage: &'static str,
    status: &'static str,
    failure_reason: &'static str,
    allow_failure: &'static str,
}

const JOB_HOOK: BuildKeys = BuildKeys {
    id: "build_id",
    name: "build_name",
    stage: "build_stage",
    status: "build_status",
    failure_reason: "build_failure_reason",
    allow_failure: "build_allow_failure",
};

const PIPELINE_BUILD: BuildKeys = BuildKeys {
    id: "id",
    name: "name",
    stage: "stage",
    status: "status",
    failure_reason: "failure_reason",
    allow_failure: "allow_failure",
};

/// A GitLab `JobObserved` against the build it came from.
fn gitlab_build(j: &JobObserved, b: &Value, keys: &BuildKeys) {
    assert_eq!(Some(job_id(j)), b[keys.id].as_u64());
    assert_eq!(j.forge_status, text(&b[keys.status]).as_str());
    assert_eq!(&j.name, text(&b[keys.name]));
    assert_eq!(&j.stage, text(&b[keys.stage]));
    assert_eq!(
        j.allow_failure,
        b[keys.allow_failure].as_bool().unwrap_or(false)
    );
    let failed = matches!(j.conclusion(), Conclusion::Failure | Conclusion::Cancelled);
    let reason = if failed {
        text(&b[keys.failure_reason]).clone()
    } else {
        String::new()
    };
    assert_eq!(j.failure_reason, reason);
    let runner = &b["runner"];
    assert_eq!(j.runner_id, runner["id"].as_u64());
    assert_eq!(&j.runner_name, text(&runner["description"]));
    assert_eq!(j.labels, strings(&runner["tags"]));
    let attempt = b["retries_count"].as_u64().map_or(0, |n| n + 1);
    assert_eq!(u64::from(j.run_attempt), attempt);
}

/// What a Pipeline Hook's jobs inherit from the pipeline.
fn pipeline_context(j: &JobObserved, p: &PipelineObserved) {
    assert_eq!(j.pipeline_id, p.pipeline_id);
    assert_eq!(j.pipeline_status, p.status);
    assert_eq!((&j.r#ref, &j.sha, j.tag), (&p.r#ref, &p.sha, p.tag));
    assert_eq!((&j.project, j.project_id), (&p.project, p.project_id));
    let key = j.job.as_ref().expect("job key");
    assert_eq!(key.instance, p.instance);
}

/// What every GitLab `JobObserved` satisfies on its own.
fn gitlab_job(e: &Event, j: &JobObserved, key: &str, rx: OffsetDateTime) {
    let id = job_id(j);
    assert_eq!(e.id, format!("gitlab:{key}:{id}:{}", j.forge_status));
    status_word(&j.forge_status);
    let (status, conclusion) = gitlab_status(&j.forge_status);
    assert_eq!((j.status(), j.conclusion()), (status, conclusion));
    if !matches!(conclusion, Conclusion::Failure | Conclusion::Cancelled) {
        assert_eq!(j.failure_reason, "");
    }
    assert!(j.html_url.is_empty() || j.html_url.ends_with(&format!("/-/jobs/{id}")));
    assert_occurred_at(e, j, status, rx);
    // GitLab's own durations are passed on for any status.
    for secs in [j.queued_duration_seconds, j.duration_seconds]
        .into_iter()
        .flatten()
    {
        assert!(secs.is_finite() && secs >= 0.0, "duration {secs}");
    }
}

/// GitLab's status words, as the normalizer maps them.
fn gitlab_status(word: &str) -> (JobStatus, Conclusion) {
    match word {
        // Only `pending` is runnable; `created` waits for its stage.
        "pending" => (JobStatus::Queued, Conclusion::Unspecified),
        "running" => (JobStatus::InProgress, Conclusion::Unspecified),
        "success" => (JobStatus::Completed, Conclusion::Success),
        "failed" => (JobStatus::Completed, Conclusion::Failure),
        "canceled" => (JobStatus::Completed, Conclusion::Cancelled),
        "skipped" => (JobStatus::Completed, Conclusion::Skipped),
        "manual" => panic!("a manual build was recorded"),
        _ => (JobStatus::Waiting, Conclusion::Unspecified),
    }
}

fn github_conclusion(v: &Value) -> Conclusion {
    match v.as_str() {
        Some("success") => Conclusion::Success,
        Some("failure") => Conclusion::Failure,
        Some("cancelled") => Conclusion::Cancelled,
        Some("skipped") => Conclusion::Skipped,
        Some("timed_out") => Conclusion::TimedOut,
        Some("action_required") => Conclusion::ActionRequired,
        Some("neutral") => Conclusion::Neutral,
        _ => Conclusion::Unspecified,
    }
}

/// The envelope, the protobuf round trip and the job key of a
/// `JobObserved`; returns the job.
fn common<'e>(e: &'e Event, forge: Forge, delivery: &str, rx: OffsetDateTime) -> &'e JobObserved {
    envelope(e, forge, delivery, rx);
    let j = match &e.body {
        Some(Body::JobObserved(j)) => j,
        other => panic!("expected a JobObserved, got {other:?}"),
    };
    let key = j.job.as_ref().expect("job key");
    assert_eq!(key.forge(), forge);
    assert!(key.job_id > 0);
    assert_eq!(key.instance, e.source.as_ref().expect("source").instance);
    assert_ne!(j.status(), JobStatus::Unspecified);
    for t in [&j.created_at, &j.started_at, &j.completed_at]
        .into_iter()
        .flatten()
    {
        window(t, rx);
    }
    j
}

/// What every event of a delivery satisfies: its protobuf round trip, an
/// id fit for a header, and its source.
fn envelope(e: &Event, forge: Forge, delivery: &str, rx: OffsetDateTime) {
    roundtrip(e);
    if delivery.bytes().all(|b| b.is_ascii_graphic()) {
        // The id is the `Nats-Msg-Id` header.
        assert!(e.id.bytes().all(|b| b.is_ascii_graphic()), "id {:?}", e.id);
    }
    let source = e.source.as_ref().expect("source");
    assert_eq!(source.forge(), forge);
    assert_eq!(source.delivery_id, delivery);
    assert_eq!(source.producer, "ingest");
    host(&source.instance);
    assert_eq!(e.received_at, Some(runyard_events::timestamp(rx)));
    // Either `rx` or one of the body's timestamps, which are checked.
    from_timestamp(e.occurred_at.as_ref().expect("occurred_at")).expect("converts back");
}

/// The event is what its protobuf encoding decodes to.
fn roundtrip(e: &Event) {
    let decoded = Event::decode(e.encode_to_vec().as_slice()).expect("decodes");
    assert_eq!(&decoded, e, "protobuf round trip");
}

/// A timestamp that converts back and lies in `[2000-01-01, rx + 1 day]`.
fn window(t: &prost_types::Timestamp, rx: OffsetDateTime) {
    let t = from_timestamp(t).expect("a timestamp that converts back");
    assert!(t >= datetime!(2000-01-01 00:00:00 UTC), "{t} before 2000");
    if let Some(latest) = rx.checked_add(Duration::DAY) {
        assert!(t <= latest, "{t} more than a day after {rx}");
    }
}

/// An instance: a lower-case host name or IP literal, fit for an event id.
fn host(h: &str) {
    assert!(!h.is_empty() && h.len() <= 253, "host {h:?}");
    assert!(
        h.bytes().all(|b| b.is_ascii_lowercase()
            || b.is_ascii_digit()
            || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':')),
        "host {h:?}"
    );
    assert!(!h.ends_with('.'), "host {h:?}");
}

fn status_word(w: &str) {
    assert!(!w.is_empty() && w.len() <= 64, "status {w:?}");
    assert!(
        w.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
        "status {w:?}"
    );
}

fn rejection(e: &PayloadError, content_type: Option<&str>) {
    match e {
        PayloadError::UnsupportedMediaType(ct) => assert_eq!(Some(ct.as_str()), content_type),
        PayloadError::Invalid { field, reason } => {
            assert!(!field.is_empty() && !reason.is_empty(), "{e:?}");
            assert!(field.len() <= MAX_FIELD, "field of {} bytes", field.len());
            assert!(!field.chars().any(char::is_control), "field {field:?}");
        }
    }
}

fn ignored(reason: &str) {
    assert!(!reason.is_empty());
    assert!(
        reason.chars().count() <= MAX_REASON_CHARS,
        "reason {reason:?}"
    );
}

/// A header as the normalizers read it: trimmed, empty as absent.
fn header(h: Option<&str>) -> Option<&str> {
    h.map(str::trim).filter(|h| !h.is_empty())
}

fn job_id(j: &JobObserved) -> u64 {
    j.job.as_ref().expect("job key").job_id
}

/// The body parsed in full, `None` where that fails: the normalizers skip
/// members they do not read, which the full parse checks more strictly
/// (a number beyond `f64`, a lone surrogate, deep nesting).
fn full_parse(body: &[u8]) -> Option<Value> {
    serde_json::from_slice(body).ok()
}

/// The JSON of a GitHub delivery: the body, or its `payload` field.
fn github_json(d: &GithubDelivery<'_>) -> Option<Value> {
    let form = d
        .content_type
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|m| {
            m.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !form {
        return full_parse(d.body);
    }
    let fields: Vec<(String, String)> = serde_urlencoded::from_bytes(d.body).ok()?;
    let payload = fields.into_iter().find(|(k, _)| k == "payload")?.1;
    full_parse(payload.as_bytes())
}

/// A string member, `""` when absent or null (the normalizers reject any
/// other type, so an accepted event never meets one).
fn text(v: &Value) -> &String {
    static EMPTY: String = String::new();
    match v {
        Value::String(s) => s,
        Value::Null => &EMPTY,
        other => panic!("accepted {other} for a string"),
    }
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Null => Vec::new(),
        Value::Array(items) => items.iter().map(|s| text(s).clone()).collect(),
        other => panic!("accepted {other} for an array of strings"),
    }
}

/// A GitHub delivery answers the same whether its JSON came as the body or
/// form-encoded in `payload`, except that a body-level error names
/// `payload` instead of `body`.
pub fn github_form_matches_json(json: &GithubDelivery<'_>) {
    let Ok(text) = std::str::from_utf8(json.body) else {
        return;
    };
    let encoded = serde_urlencoded::to_string([("payload", text)]).expect("encodes");
    let form = GithubDelivery {
        content_type: Some("application/x-www-form-urlencoded"),
        body: encoded.as_bytes(),
        ..*json
    };
    let (a, b) = (
        crate::normalize_github(json),
        crate::normalize_github(&form),
    );
    match (&a, &b) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(a), Err(b)) => {
            let a = a.field().map(|f| if f == "body" { "payload" } else { f });
            assert_eq!(a, b.field(), "{a:?} / {b:?}");
        }
        _ => panic!("JSON {a:?}, form {b:?}"),
    }
}

/// A job event occurred when its status says (queued: created, in
/// progress: started, completed: completed), else when it was received.
fn assert_occurred_at(e: &Event, j: &JobObserved, status: JobStatus, received: OffsetDateTime) {
    let occurred = match status {
        JobStatus::Queued => j.created_at,
        JobStatus::InProgress => j.started_at,
        JobStatus::Completed => j.completed_at,
        _ => None,
    };
    assert_eq!(
        e.occurred_at,
        Some(occurred.unwrap_or(runyard_events::timestamp(received)))
    );
}
