//! The door checks: what ingest refuses, after the normalizers, because the
//! rest of runyard could not hold it (Postgres `bigint`/`integer` columns,
//! `text` and `jsonb` without NUL) or because it is unbounded where nothing
//! needs it to be (labels, builds, string lengths, delivery ids).
//!
//! Each check names the field as the sender wrote it (`workflow_job.id`,
//! `builds[3].name`, `X-GitHub-Delivery`), not as the event calls it, so a
//! 400 points at the offending input. The caps are documented in
//! docs/architecture.md, "Ingest HTTP API".

/// Bytes of any other string kept (names, refs, labels, workload values),
/// and workload attributes in one usage report: the caps every service
/// holds events to.
pub use runyard_events::limits::{MAX_TEXT_BYTES, MAX_WORKLOAD_ATTRIBUTES};
use runyard_events::{Body, Event, JobObserved, PipelineObserved, UsageReported};

/// Largest id, byte count or millicore figure accepted: what a Postgres
/// `bigint` holds.
pub const MAX_ID: u64 = i64::MAX as u64;
/// Largest attempt number accepted: what a Postgres `integer` holds.
pub const MAX_ATTEMPT: u32 = i32::MAX as u32;
/// Labels (GitHub) or runner tags (GitLab) per job.
pub const MAX_LABELS: usize = 64;
/// Builds in one GitLab Pipeline Hook.
pub const MAX_BUILDS: usize = 1000;
/// Bytes of a delivery id (`X-GitHub-Delivery`, `Idempotency-Key`,
/// `X-Gitlab-Event-UUID`) or hook id; delivery ids are also limited to
/// [`delivery_id_char`]s, since they become part of `Nats-Msg-Id`.
pub const MAX_DELIVERY_ID_BYTES: usize = 128;
/// Bytes of a URL kept (`html_url`, `web_url`).
pub const MAX_URL_BYTES: usize = 2048;

/// The characters a delivery id may hold: `[A-Za-z0-9._:-]`.
pub fn delivery_id_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

/// Why a delivery was refused: the field as the sender named it, and what
/// is wrong with it (safe to echo back).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) field: String,
    pub(crate) reason: String,
}

/// What kind of delivery the events came from, which decides the names of
/// their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// A GitHub `workflow_job` delivery.
    Github,
    /// A GitLab Job Hook.
    GitlabJob,
    /// A GitLab Pipeline Hook.
    GitlabPipeline,
    /// A usage report.
    Usage,
}

/// Checks every event of one delivery. `delivery_header` is the header the
/// delivery id came from (`X-GitHub-Delivery`, `Idempotency-Key`, ...).
pub(crate) fn check(shape: Shape, delivery_header: &str, events: &[Event]) -> Result<(), Refused> {
    // A Pipeline Hook's builds: the pipeline event lists every build id in
    // order (manual ones too), which gives each job event its index.
    let mut build_ids: &[u64] = &[];
    for event in events {
        if let Some(source) = &event.source
            && shape != Shape::Usage
        {
            delivery_id(delivery_header, &source.delivery_id)?;
            let hook = match shape {
                Shape::Github => "X-GitHub-Hook-ID",
                _ => "X-Gitlab-Webhook-UUID",
            };
            text(|| hook.to_owned(), &source.hook_id, MAX_DELIVERY_ID_BYTES)?;
        }
        match &event.body {
            Some(Body::JobObserved(job)) => {
                let build = build_ids
                    .iter()
                    .position(|id| Some(*id) == job.job.as_ref().map(|k| k.job_id));
                job_observed(&Names { shape, build }, job)?;
            }
            Some(Body::PipelineObserved(p)) => {
                pipeline_observed(p)?;
                build_ids = &p.job_ids;
            }
            Some(Body::UsageReported(u)) => usage_reported(u)?,
            // Ingest publishes nothing else.
            _ => {}
        }
    }
    Ok(())
}

/// A delivery id: 1–[`MAX_DELIVERY_ID_BYTES`] bytes of `[A-Za-z0-9._:-]`.
pub(crate) fn delivery_id(header: &str, id: &str) -> Result<(), Refused> {
    if id.len() > MAX_DELIVERY_ID_BYTES {
        return Err(refused(
            header,
            format!("longer than {MAX_DELIVERY_ID_BYTES} bytes"),
        ));
    }
    if !id.bytes().all(delivery_id_char) {
        return Err(refused(
            header,
            "may only hold the characters A-Z a-z 0-9 . _ : -",
        ));
    }
    Ok(())
}

fn refused(field: impl Into<String>, reason: impl Into<String>) -> Refused {
    Refused {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A string that is kept: no NUL (Postgres `text` and `jsonb` cannot hold
/// one) and at most `max` bytes.
fn text(field: impl FnOnce() -> String, value: &str, max: usize) -> Result<(), Refused> {
    if value.contains('\0') {
        return Err(refused(field(), "must not contain NUL (\\u0000)"));
    }
    if value.len() > max {
        return Err(refused(field(), format!("longer than {max} bytes")));
    }
    Ok(())
}

/// An id or byte count that is kept in a Postgres `bigint`.
fn id(field: impl FnOnce() -> String, value: u64) -> Result<(), Refused> {
    if value > MAX_ID {
        return Err(refused(field(), format!("larger than {MAX_ID}")));
    }
    Ok(())
}

fn opt_id(field: impl FnOnce() -> String, value: Option<u64>) -> Result<(), Refused> {
    value.map_or(Ok(()), |v| id(field, v))
}

fn attempt(field: impl FnOnce() -> String, value: u32) -> Result<(), Refused> {
    if value > MAX_ATTEMPT {
        return Err(refused(field(), format!("larger than {MAX_ATTEMPT}")));
    }
    Ok(())
}

/// The sender's name of a `JobObserved` field, by the shape of the delivery
/// (and, in a Pipeline Hook, the build's index).
struct Names {
    shape: Shape,
    build: Option<usize>,
}

impl Names {
    fn of(&self, field: &str) -> String {
        let github = |f: &str| -> &'static str {
            match f {
                "job_id" => "workflow_job.id",
                "project" => "repository.full_name",
                "project_id" => "repository.id",
                "pipeline_id" => "workflow_job.run_id",
                "run_attempt" => "workflow_job.run_attempt",
                "name" => "workflow_job.name",
                "workflow_name" => "workflow_job.workflow_name",
                "labels" => "workflow_job.labels",
                "forge_status" => "action",
                "runner_id" => "workflow_job.runner_id",
                "runner_name" => "workflow_job.runner_name",
                "runner_group_id" => "workflow_job.runner_group_id",
                "runner_group_name" => "workflow_job.runner_group_name",
                "ref" => "workflow_job.head_branch",
                "sha" => "workflow_job.head_sha",
                "html_url" => "workflow_job.html_url",
                "organization" => "organization.login",
                "enterprise" => "enterprise.slug",
                _ => "body",
            }
        };
        let gitlab_job = |f: &str| -> &'static str {
            match f {
                "job_id" => "build_id",
                "name" => "build_name",
                "stage" => "build_stage",
                "failure_reason" => "build_failure_reason",
                "forge_status" => "build_status",
                "run_attempt" => "retries_count",
                "labels" => "runner.tags",
                "runner_id" => "runner.id",
                "runner_name" => "runner.description",
                "project" => "project.path_with_namespace",
                "project_id" => "project_id",
                "pipeline_id" => "pipeline_id",
                "ref" => "ref",
                "sha" => "sha",
                "html_url" => "project.web_url",
                _ => "body",
            }
        };
        match self.shape {
            Shape::Github => github(field).to_owned(),
            Shape::GitlabJob => gitlab_job(field).to_owned(),
            Shape::GitlabPipeline => {
                let build = |f: &str| match self.build {
                    Some(i) => format!("builds[{i}].{f}"),
                    None => format!("builds[].{f}"),
                };
                match field {
                    "job_id" => build("id"),
                    "name" => build("name"),
                    "stage" => build("stage"),
                    "failure_reason" => build("failure_reason"),
                    "forge_status" => build("status"),
                    "run_attempt" => build("retries_count"),
                    "labels" => build("runner.tags"),
                    "runner_id" => build("runner.id"),
                    "runner_name" => build("runner.description"),
                    other => pipeline_name(other).to_owned(),
                }
            }
            Shape::Usage => field.to_owned(),
        }
    }
}

/// The sender's name of a `PipelineObserved` field (or of what a Pipeline
/// Hook's jobs inherit from the pipeline).
fn pipeline_name(field: &str) -> &'static str {
    match field {
        "pipeline_id" => "object_attributes.id",
        "project_id" => "project.id",
        "project" => "project.path_with_namespace",
        "ref" => "object_attributes.ref",
        "sha" => "object_attributes.sha",
        "status" | "pipeline_status" => "object_attributes.status",
        "pipeline_source" => "object_attributes.source",
        "web_url" => "object_attributes.url",
        "html_url" => "project.web_url",
        _ => "body",
    }
}

fn job_observed(names: &Names, j: &JobObserved) -> Result<(), Refused> {
    let n = |f: &'static str| move || names.of(f);
    if let Some(key) = &j.job {
        id(n("job_id"), key.job_id)?;
    }
    id(n("project_id"), j.project_id)?;
    id(n("pipeline_id"), j.pipeline_id)?;
    opt_id(n("runner_id"), j.runner_id)?;
    opt_id(n("runner_group_id"), j.runner_group_id)?;
    attempt(n("run_attempt"), j.run_attempt)?;
    for (field, value) in [
        ("project", &j.project),
        ("name", &j.name),
        ("stage", &j.stage),
        ("workflow_name", &j.workflow_name),
        ("forge_status", &j.forge_status),
        ("failure_reason", &j.failure_reason),
        ("runner_name", &j.runner_name),
        ("runner_group_name", &j.runner_group_name),
        ("ref", &j.r#ref),
        ("sha", &j.sha),
        ("organization", &j.organization),
        ("enterprise", &j.enterprise),
        ("pipeline_status", &j.pipeline_status),
    ] {
        text(n(field), value, MAX_TEXT_BYTES)?;
    }
    text(n("html_url"), &j.html_url, MAX_URL_BYTES)?;
    if j.labels.len() > MAX_LABELS {
        return Err(refused(
            names.of("labels"),
            format!("more than {MAX_LABELS} labels"),
        ));
    }
    for (i, label) in j.labels.iter().enumerate() {
        text(
            || format!("{}[{i}]", names.of("labels")),
            label,
            MAX_TEXT_BYTES,
        )?;
    }
    Ok(())
}

fn pipeline_observed(p: &PipelineObserved) -> Result<(), Refused> {
    let n = |f: &'static str| move || pipeline_name(f).to_owned();
    if p.job_ids.len() > MAX_BUILDS {
        return Err(refused("builds", format!("more than {MAX_BUILDS} builds")));
    }
    id(n("pipeline_id"), p.pipeline_id)?;
    id(n("project_id"), p.project_id)?;
    for (i, build) in p.job_ids.iter().enumerate() {
        id(|| format!("builds[{i}].id"), *build)?;
    }
    for (field, value) in [
        ("project", &p.project),
        ("ref", &p.r#ref),
        ("sha", &p.sha),
        ("status", &p.status),
        ("pipeline_source", &p.pipeline_source),
    ] {
        text(n(field), value, MAX_TEXT_BYTES)?;
    }
    text(n("web_url"), &p.web_url, MAX_URL_BYTES)
}

fn usage_reported(u: &UsageReported) -> Result<(), Refused> {
    let n = |f: &'static str| move || f.to_owned();
    if let Some(key) = &u.job {
        id(n("job_id"), key.job_id)?;
    }
    attempt(n("attempt"), u.attempt)?;
    id(n("peak_memory_bytes"), u.peak_memory_bytes)?;
    opt_id(n("memory_request_bytes"), u.memory_request_bytes)?;
    opt_id(n("memory_limit_bytes"), u.memory_limit_bytes)?;
    opt_id(n("cpu_request_millicores"), u.cpu_request_millicores)?;
    text(n("ref"), &u.r#ref, MAX_TEXT_BYTES)?;
    text(n("project"), &u.project, MAX_TEXT_BYTES)?;
    if u.workload.len() > MAX_WORKLOAD_ATTRIBUTES {
        return Err(refused(
            "workload",
            format!("more than {MAX_WORKLOAD_ATTRIBUTES} attributes"),
        ));
    }
    for (key, value) in &u.workload {
        // A bad key cannot be echoed as part of a path: name the map.
        text(n("workload"), key, MAX_TEXT_BYTES)?;
        text(|| format!("workload.{key}"), value, MAX_TEXT_BYTES)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runyard_events::{JobKey, Source};

    fn job_event(job: JobObserved) -> Event {
        Event {
            id: "github:d-1".into(),
            source: Some(Source {
                delivery_id: "d-1".into(),
                ..Default::default()
            }),
            body: Some(Body::JobObserved(job)),
            ..Default::default()
        }
    }

    fn field(r: Result<(), Refused>) -> String {
        r.expect_err("refused").field
    }

    #[test]
    fn ids_above_bigint_are_named_as_the_sender_wrote_them() {
        let job = JobObserved {
            job: Some(JobKey {
                job_id: MAX_ID + 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = job_event(job.clone());
        assert_eq!(
            field(check(
                Shape::Github,
                "X-GitHub-Delivery",
                std::slice::from_ref(&e)
            )),
            "workflow_job.id"
        );
        assert_eq!(
            field(check(Shape::GitlabJob, "Idempotency-Key", &[e])),
            "build_id"
        );
        let ok = JobObserved {
            job: Some(JobKey {
                job_id: MAX_ID,
                ..Default::default()
            }),
            ..job
        };
        assert!(check(Shape::Github, "X-GitHub-Delivery", &[job_event(ok)]).is_ok());
    }

    #[test]
    fn pipeline_builds_get_their_index() {
        let pipeline = Event {
            body: Some(Body::PipelineObserved(PipelineObserved {
                job_ids: vec![10, 11, 12],
                ..Default::default()
            })),
            ..Default::default()
        };
        let build = job_event(JobObserved {
            job: Some(JobKey {
                job_id: 12,
                ..Default::default()
            }),
            name: "a\0b".into(),
            ..Default::default()
        });
        assert_eq!(
            field(check(
                Shape::GitlabPipeline,
                "Idempotency-Key",
                &[pipeline, build]
            )),
            "builds[2].name"
        );
    }

    #[test]
    fn delivery_ids_are_short_and_plain() {
        assert!(delivery_id("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958").is_ok());
        for bad in ["a b", "a/b", "a\"b", "ä", &"a".repeat(129)] {
            assert_eq!(
                field(delivery_id("X-GitHub-Delivery", bad)),
                "X-GitHub-Delivery"
            );
        }
    }
}
