//! GitLab Job Hook → `JobObserved`; Pipeline Hook → `PipelineObserved` plus
//! one `JobObserved` per build.

use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, PipelineObserved, ids,
};
use time::OffsetDateTime;

use crate::filter::KeySet;
use crate::json::Obj;
use crate::{
    Envelope, Members, Normalized, PayloadError, encoding, host_of, non_empty, parse_json,
    seconds_between, short, status_word,
};

/// Every object key the Job Hook and Pipeline Hook normalizers read, at any
/// depth: the only members the body is parsed into (see
/// [`crate::filter`]). Reading a key that is not listed here reads it as
/// absent; the `filter` tests catch it.
pub(crate) static KEYS: KeySet = KeySet::new(&[
    "allow_failure",
    "build_allow_failure",
    "build_created_at",
    "build_created_at_iso",
    "build_duration",
    "build_failure_reason",
    "build_finished_at",
    "build_finished_at_iso",
    "build_id",
    "build_name",
    "build_queued_duration",
    "build_stage",
    "build_started_at",
    "build_started_at_iso",
    "build_status",
    "builds",
    "created_at",
    "description",
    "duration",
    "failure_reason",
    "finished_at",
    "homepage",
    "id",
    "name",
    "object_attributes",
    "object_kind",
    "path_with_namespace",
    "pipeline_id",
    "project",
    "project_id",
    "project_name",
    "queued_duration",
    "ref",
    "repository",
    "retries_count",
    "runner",
    "sha",
    "source",
    "source_pipeline",
    "stage",
    "started_at",
    "status",
    "tag",
    "tags",
    "url",
    "web_url",
]);

/// One GitLab webhook delivery as ingest received it. The `X-Gitlab-Token`
/// is checked before this is built ([`crate::token_matches`]).
#[derive(Debug, Clone, Copy)]
pub struct GitlabDelivery<'a> {
    /// `X-Gitlab-Event`: `Job Hook` and `Pipeline Hook` are normalized, any
    /// other is ignored.
    pub event: Option<&'a str>,
    /// `Idempotency-Key`: the same across GitLab's retries of one delivery
    /// (GitLab ≥ 17.4), so the preferred dedup key.
    pub idempotency_key: Option<&'a str>,
    /// `X-Gitlab-Event-UUID`: the dedup key on older GitLab.
    pub event_uuid: Option<&'a str>,
    /// `X-Gitlab-Webhook-UUID`, recorded as `Source.hook_id`.
    pub webhook_uuid: Option<&'a str>,
    /// `X-Gitlab-Instance`: the instance's base URL, whose host names the
    /// instance.
    pub instance: Option<&'a str>,
    /// `Content-Type`; GitLab only sends JSON.
    pub content_type: Option<&'a str>,
    /// The raw body.
    pub body: &'a [u8],
    /// When ingest accepted the delivery.
    pub received_at: OffsetDateTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hook {
    Job,
    Pipeline,
}

/// Normalizes one GitLab delivery.
///
/// A Job Hook yields one `JobObserved` (id
/// `gitlab:<key>:<build_id>:<build_status>`), or is ignored for a `manual`
/// job, which is only waiting for someone to press play and occupies no
/// runner. A Pipeline Hook yields its `PipelineObserved` first, then one
/// `JobObserved` per non-manual build. Other hooks are ignored.
pub fn normalize_gitlab(d: &GitlabDelivery<'_>) -> Result<Normalized, PayloadError> {
    normalize(d, Members::Only(&KEYS))
}

/// [`normalize_gitlab`], building `members` of the body (the tests compare
/// [`Members::All`] with the allowlist).
pub(crate) fn normalize(
    d: &GitlabDelivery<'_>,
    members: Members,
) -> Result<Normalized, PayloadError> {
    let hook = match d.event {
        Some("Job Hook") => Hook::Job,
        Some("Pipeline Hook") => Hook::Pipeline,
        Some(other) => return Ok(Normalized::Ignored(format!("event {}", short(other)))),
        None => return Ok(Normalized::Ignored("event (none)".into())),
    };
    encoding(d.content_type, false)?;
    let key = non_empty(d.idempotency_key)
        .or_else(|| non_empty(d.event_uuid))
        .ok_or_else(|| {
            PayloadError::invalid("Idempotency-Key", "missing (and no X-Gitlab-Event-UUID)")
        })?;
    let value = parse_json(d.body, "body", members)?;
    let root = Obj::root(&value)?;
    let expected_kind = match hook {
        Hook::Job => "build",
        Hook::Pipeline => "pipeline",
    };
    // Absent is tolerated (the header already says what this is); a
    // contradiction means the body is not what the header claims.
    if let Some(kind) = root.opt_str("object_kind")?
        && kind != expected_kind
    {
        return Err(PayloadError::invalid(
            "object_kind",
            format!(
                "expected {expected_kind:?} for {}",
                short(d.event.unwrap_or_default())
            ),
        ));
    }
    match hook {
        Hook::Job => job_hook(d, key, &root),
        Hook::Pipeline => pipeline_hook(d, key, &root),
    }
}

/// What a GitLab status word means for runyard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mapped {
    /// `manual`: not recorded (see [`normalize_gitlab`]).
    Manual,
    Observed(JobStatus, Conclusion),
}

fn map_status(word: &str) -> Mapped {
    use Conclusion as C;
    use JobStatus as S;
    match word {
        // `created`: a later stage's job, or one whose `needs:` are not met;
        // it turns `pending` (or `skipped`) when they are. Only `pending`
        // asks for a runner.
        "pending" => Mapped::Observed(S::Queued, C::Unspecified),
        "running" => Mapped::Observed(S::InProgress, C::Unspecified),
        "success" => Mapped::Observed(S::Completed, C::Success),
        "failed" => Mapped::Observed(S::Completed, C::Failure),
        "canceled" => Mapped::Observed(S::Completed, C::Cancelled),
        "skipped" => Mapped::Observed(S::Completed, C::Skipped),
        "manual" => Mapped::Manual,
        // `created`, `waiting_for_resource`, `preparing`, `scheduled`,
        // `canceling` and whatever GitLab adds next: the job exists but is
        // held back for a reason other than lack of a runner. `Waiting` is
        // the closest fact; it alternates with `pending` (ordered by when it
        // was seen), and nothing moves a job back from `running` or a
        // terminal state, so a late `canceling` after `running` does no harm.
        _ => Mapped::Observed(S::Waiting, C::Unspecified),
    }
}

/// Where a build's fields sit: the Job Hook prefixes them with `build_` at
/// the top level, Pipeline Hook `builds[]` entries do not.
struct Keys {
    id: &'static str,
    name: &'static str,
    stage: &'static str,
    status: &'static str,
    created_at: &'static str,
    started_at: &'static str,
    finished_at: &'static str,
    /// GitLab ≥ 16.x also sends unambiguous RFC 3339 copies (`*_iso`).
    iso_suffix: bool,
    duration: &'static str,
    queued_duration: &'static str,
    failure_reason: &'static str,
    allow_failure: &'static str,
}

const JOB_HOOK: Keys = Keys {
    id: "build_id",
    name: "build_name",
    stage: "build_stage",
    status: "build_status",
    created_at: "build_created_at",
    started_at: "build_started_at",
    finished_at: "build_finished_at",
    iso_suffix: true,
    duration: "build_duration",
    queued_duration: "build_queued_duration",
    failure_reason: "build_failure_reason",
    allow_failure: "build_allow_failure",
};

const PIPELINE_BUILD: Keys = Keys {
    id: "id",
    name: "name",
    stage: "stage",
    status: "status",
    created_at: "created_at",
    started_at: "started_at",
    finished_at: "finished_at",
    iso_suffix: false,
    duration: "duration",
    queued_duration: "queued_duration",
    failure_reason: "failure_reason",
    allow_failure: "allow_failure",
};

/// What a build inherits from its delivery rather than carrying itself.
struct Context<'a> {
    envelope: Envelope<'a>,
    project: String,
    project_id: u64,
    pipeline_id: u64,
    r#ref: String,
    sha: String,
    tag: bool,
    pipeline_status: String,
    /// The project's web URL, for linking to the job.
    web_url: Option<&'a str>,
}

fn job_hook(d: &GitlabDelivery<'_>, key: &str, root: &Obj<'_>) -> Result<Normalized, PayloadError> {
    let word = status_word(root.req_str(JOB_HOOK.status)?, JOB_HOOK.status)?;
    if map_status(word) == Mapped::Manual {
        return Ok(Normalized::Ignored("manual job".into()));
    }
    let project = root.opt_obj("project")?;
    let repository = root.opt_obj("repository")?;
    let mut urls = Vec::new();
    if let Some(p) = &project {
        urls.push((p, "web_url"));
    }
    if let Some(r) = &repository {
        urls.push((r, "homepage"));
    }
    let instance = instance(d.instance, &urls)?;
    let mut web_url = None;
    for (obj, key) in &urls {
        web_url = web_url.or(obj.opt_str(key)?);
    }

    let project_name = match &project {
        Some(p) => p.opt_str("path_with_namespace")?,
        None => None,
    };
    // Older hooks carry no `project` object; the repository homepage below
    // the instance URL is the same path, and `project_name` (a display name
    // like "Group / Project") is the last resort.
    let homepage = match &repository {
        Some(r) => r.opt_str("homepage")?,
        None => None,
    };
    let project_name = match project_name {
        Some(p) => p.to_owned(),
        None => match homepage.and_then(|h| path_below(non_empty(d.instance)?, h)) {
            Some(path) => path,
            None => root.str_or_empty("project_name")?,
        },
    };
    let project_id = match root.opt_id("project_id")? {
        Some(id) => id,
        None => match &project {
            Some(p) => p.opt_id("id")?.unwrap_or_default(),
            None => 0,
        },
    };
    let ctx = Context {
        envelope: envelope(d, &instance, key),
        project: project_name,
        project_id,
        pipeline_id: root.opt_id("pipeline_id")?.unwrap_or_default(),
        r#ref: root.str_or_empty("ref")?,
        sha: root.str_or_empty("sha")?,
        tag: root.opt_bool("tag")?.unwrap_or_default(),
        pipeline_status: String::new(),
        web_url,
    };
    match build(root, &JOB_HOOK, &ctx)? {
        Some(event) => Ok(Normalized::Events(vec![event])),
        // Unreachable: manual was answered above. Kept total rather than
        // asserting, since this is untrusted input.
        None => Ok(Normalized::Ignored("manual job".into())),
    }
}

fn pipeline_hook(
    d: &GitlabDelivery<'_>,
    key: &str,
    root: &Obj<'_>,
) -> Result<Normalized, PayloadError> {
    let rx = d.received_at;
    let attrs = root.req_obj("object_attributes")?;
    let pipeline_id = attrs.req_id("id")?;
    let status = status_word(attrs.req_str("status")?, &attrs.path("status"))?;
    let project = root.opt_obj("project")?;
    let urls: Vec<_> = project.iter().map(|p| (p, "web_url")).collect();
    let instance = instance(d.instance, &urls)?;
    let web_url = match &project {
        Some(p) => p.opt_str("web_url")?,
        None => None,
    };

    let created_at = attrs.opt_time("created_at", rx)?;
    let finished_at = attrs.opt_time("finished_at", rx)?;
    let occurred_at = match status {
        "success" | "failed" | "canceled" | "skipped" => finished_at,
        "created" | "pending" => created_at,
        // Running or held: the payload has no time for that transition.
        _ => None,
    }
    .unwrap_or(rx);

    let ctx = Context {
        envelope: envelope(d, &instance, key),
        project: match &project {
            Some(p) => p.str_or_empty("path_with_namespace")?,
            None => String::new(),
        },
        project_id: match &project {
            Some(p) => p.opt_id("id")?.unwrap_or_default(),
            None => 0,
        },
        pipeline_id,
        r#ref: attrs.str_or_empty("ref")?,
        sha: attrs.str_or_empty("sha")?,
        tag: attrs.opt_bool("tag")?.unwrap_or_default(),
        pipeline_status: status.to_owned(),
        web_url,
    };

    let builds = root.opt_obj_array("builds")?;
    let mut job_ids = Vec::with_capacity(builds.len());
    let mut jobs = Vec::with_capacity(builds.len());
    for b in &builds {
        // Every build id is reported, manual ones included: they are jobs of
        // this pipeline even though no event is recorded for them yet.
        job_ids.push(b.req_id(PIPELINE_BUILD.id)?);
        if let Some(event) = build(b, &PIPELINE_BUILD, &ctx)? {
            jobs.push(event);
        }
    }

    let web_url = match attrs.opt_str("url")? {
        Some(u) => u.to_owned(),
        None => web_url
            .map(|base| format!("{}/-/pipelines/{pipeline_id}", base.trim_end_matches('/')))
            .unwrap_or_default(),
    };
    // A child pipeline names its parent (`source_pipeline`, at the top level
    // or, in some versions, inside `object_attributes`).
    let parent = match root.opt_obj("source_pipeline")? {
        Some(sp) => Some(sp),
        None => attrs.opt_obj("source_pipeline")?,
    };
    let (parent_pipeline_id, parent_project_id) = match &parent {
        Some(sp) => (
            sp.opt_id("pipeline_id")?.unwrap_or_default(),
            match sp.opt_obj("project")? {
                Some(p) => p.opt_id("id")?.unwrap_or_default(),
                None => sp.opt_id("project_id")?.unwrap_or_default(),
            },
        ),
        None => (0, 0),
    };
    let observed = PipelineObserved {
        forge: Forge::Gitlab as i32,
        instance: instance.clone(),
        pipeline_id,
        project_id: ctx.project_id,
        project: ctx.project.clone(),
        r#ref: ctx.r#ref.clone(),
        sha: ctx.sha.clone(),
        tag: ctx.tag,
        status: status.to_owned(),
        pipeline_source: attrs.str_or_empty("source")?,
        created_at: created_at.map(runyard_events::timestamp),
        finished_at: finished_at.map(runyard_events::timestamp),
        duration_seconds: attrs.opt_f64("duration")?,
        queued_duration_seconds: attrs.opt_f64("queued_duration")?,
        job_ids,
        web_url,
        parent_pipeline_id,
        parent_project_id,
    };
    let pipeline = ctx.envelope.event(
        ids::gitlab_pipeline(key, pipeline_id, status),
        occurred_at,
        Body::PipelineObserved(observed),
    );
    let mut events = Vec::with_capacity(jobs.len().saturating_add(1));
    events.push(pipeline);
    events.extend(jobs);
    Ok(Normalized::Events(events))
}

fn envelope<'a>(d: &'a GitlabDelivery<'_>, instance: &'a str, key: &'a str) -> Envelope<'a> {
    Envelope {
        forge: Forge::Gitlab,
        instance,
        delivery_id: key,
        hook_id: non_empty(d.webhook_uuid).unwrap_or_default(),
        received_at: d.received_at,
    }
}

/// One build → its `JobObserved` event; `None` for a manual build.
fn build(b: &Obj<'_>, keys: &Keys, ctx: &Context<'_>) -> Result<Option<Event>, PayloadError> {
    let rx = ctx.envelope.received_at;
    let word = status_word(b.req_str(keys.status)?, &b.path(keys.status))?;
    let (status, conclusion) = match map_status(word) {
        Mapped::Manual => return Ok(None),
        Mapped::Observed(s, c) => (s, c),
    };
    let id = b.req_id(keys.id)?;
    let time = |key: &str| -> Result<Option<OffsetDateTime>, PayloadError> {
        if keys.iso_suffix
            && let Some(t) = b.opt_time(&format!("{key}_iso"), rx)?
        {
            return Ok(Some(t));
        }
        // The legacy copy is only read (and so only checked) when the
        // `*_iso` one is absent.
        b.opt_time(key, rx)
    };
    let created_at = time(keys.created_at)?;
    let started_at = time(keys.started_at)?;
    let finished_at = time(keys.finished_at)?;
    let occurred_at = match status {
        JobStatus::Queued => created_at,
        JobStatus::InProgress => started_at,
        JobStatus::Completed => finished_at,
        JobStatus::Waiting | JobStatus::Unspecified => None,
    }
    .unwrap_or(rx);

    let run_attempt = match b.opt_u64("retries_count")? {
        None => 0,
        Some(n) => n
            .checked_add(1)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| PayloadError::invalid(b.path("retries_count"), "too large"))?,
    };
    // GitLab's own durations when it sends them (they are exact, and for a
    // running job the time so far); otherwise derived from the timestamps.
    let duration_seconds = match b.opt_f64(keys.duration)? {
        Some(d) => Some(d),
        None if status == JobStatus::Completed => seconds_between(started_at, finished_at),
        None => None,
    };
    let queued_duration_seconds = b
        .opt_f64(keys.queued_duration)?
        .or_else(|| seconds_between(created_at, started_at));
    let runner = b.opt_obj("runner")?;
    let (runner_id, runner_name, labels) = match &runner {
        Some(r) => (
            r.opt_u64("id")?,
            r.str_or_empty("description")?,
            r.opt_str_array("tags")?,
        ),
        None => (None, String::new(), Vec::new()),
    };
    // GitLab reports `unknown_failure` on jobs that have not failed at all;
    // passing that on would make a running or successful job look broken.
    let failure_reason = match conclusion {
        Conclusion::Failure | Conclusion::Cancelled => b.str_or_empty(keys.failure_reason)?,
        _ => {
            b.opt_str(keys.failure_reason)?;
            String::new()
        }
    };

    let mut observed = JobObserved {
        job: Some(JobKey {
            forge: Forge::Gitlab as i32,
            instance: ctx.envelope.instance.to_owned(),
            job_id: id,
        }),
        project: ctx.project.clone(),
        project_id: ctx.project_id,
        pipeline_id: ctx.pipeline_id,
        run_attempt,
        name: b.str_or_empty(keys.name)?,
        stage: b.str_or_empty(keys.stage)?,
        labels,
        forge_status: word.to_owned(),
        failure_reason,
        runner_id,
        runner_name,
        r#ref: ctx.r#ref.clone(),
        sha: ctx.sha.clone(),
        tag: ctx.tag,
        created_at: created_at.map(runyard_events::timestamp),
        started_at: started_at.map(runyard_events::timestamp),
        completed_at: finished_at.map(runyard_events::timestamp),
        duration_seconds,
        queued_duration_seconds,
        allow_failure: b.opt_bool(keys.allow_failure)?.unwrap_or_default(),
        html_url: ctx
            .web_url
            .map(|base| format!("{}/-/jobs/{id}", base.trim_end_matches('/')))
            .unwrap_or_default(),
        pipeline_status: ctx.pipeline_status.clone(),
        ..Default::default()
    };
    observed.set_status(status);
    observed.set_conclusion(conclusion);
    let event = ctx.envelope.event(
        ids::gitlab_job(ctx.envelope.delivery_id, id, word),
        occurred_at,
        Body::JobObserved(observed),
    );
    Ok(Some(event))
}

/// `group/project` from `https://host/root/group/project` below the base URL
/// `https://host/root`, if the URL is below it.
fn path_below(base: &str, url: &str) -> Option<String> {
    let base = base.trim().trim_end_matches('/');
    let rest = url.trim().strip_prefix(base)?.strip_prefix('/')?;
    let path = rest.trim_end_matches('/');
    (!path.is_empty()).then(|| path.to_owned())
}

/// The instance host: `X-Gitlab-Instance` when sent (GitLab ≥ 15.x),
/// otherwise the host of the first project URL the body carries.
fn instance(header: Option<&str>, urls: &[(&Obj<'_>, &str)]) -> Result<String, PayloadError> {
    if let Some(h) = non_empty(header) {
        return host_of(h)
            .ok_or_else(|| PayloadError::invalid("X-Gitlab-Instance", "not a URL with a host"));
    }
    for (obj, key) in urls {
        if let Some(url) = obj.opt_str(key)? {
            return host_of(url)
                .ok_or_else(|| PayloadError::invalid(obj.path(key), "not a URL with a host"));
        }
    }
    Err(PayloadError::invalid(
        "X-Gitlab-Instance",
        "missing, and the body names no project URL",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{at, removed, replaced};

    #[test]
    fn paths_below_the_instance_url() {
        let base = "https://git.example.com/gitlab";
        assert_eq!(
            path_below(base, "https://git.example.com/gitlab/a/b/").as_deref(),
            Some("a/b")
        );
        assert_eq!(path_below(base, "https://git.example.com/gitlabx/a"), None);
        assert_eq!(path_below(base, "https://other.example.com/gitlab/a"), None);
        assert_eq!(path_below(base, "https://git.example.com/gitlab/"), None);
    }
    use serde_json::{Value as Json, json};
    use time::macros::datetime;

    const RX: OffsetDateTime = datetime!(2024-06-01 12:20:00 UTC);
    const KEY: &str = "6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10";
    const PENDING: &str = include_str!("../tests/fixtures/gitlab_job_pending.json");
    const RUNNING: &str = include_str!("../tests/fixtures/gitlab_job_running.json");
    const FAILED: &str = include_str!("../tests/fixtures/gitlab_job_failed.json");
    const MANUAL: &str = include_str!("../tests/fixtures/gitlab_job_manual.json");
    const PIPELINE: &str = include_str!("../tests/fixtures/gitlab_pipeline_failed.json");

    fn delivery<'a>(event: &'a str, body: &'a [u8]) -> GitlabDelivery<'a> {
        GitlabDelivery {
            event: Some(event),
            idempotency_key: Some(KEY),
            event_uuid: Some("0b9ab2d4-6e1c-4d61-8b1c-1f3c9f2a4b55"),
            webhook_uuid: Some("a3f1c2d4-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
            instance: Some("https://gitlab.example.com"),
            content_type: Some("application/json"),
            body,
            received_at: RX,
        }
    }

    fn job_delivery(body: &[u8]) -> GitlabDelivery<'_> {
        delivery("Job Hook", body)
    }

    fn events(d: &GitlabDelivery<'_>) -> Vec<Event> {
        match normalize_gitlab(d).expect("normalizes") {
            Normalized::Events(events) => events,
            Normalized::Ignored(why) => panic!("ignored: {why}"),
        }
    }

    fn one_job(d: &GitlabDelivery<'_>) -> (Event, JobObserved) {
        let mut all = events(d);
        assert_eq!(all.len(), 1);
        let e = all.pop().expect("one event");
        let j = job(&e).clone();
        (e, j)
    }

    fn job(e: &Event) -> &JobObserved {
        match &e.body {
            Some(Body::JobObserved(j)) => j,
            other => panic!("not a JobObserved: {other:?}"),
        }
    }

    fn invalid_field(d: &GitlabDelivery<'_>) -> String {
        match normalize_gitlab(d) {
            Err(e) => e.field().unwrap_or_default().to_owned(),
            Ok(n) => panic!("accepted: {n:?}"),
        }
    }

    #[test]
    fn pending_job_is_queued() {
        let (e, j) = one_job(&job_delivery(PENDING.as_bytes()));
        assert_eq!(e.id, format!("gitlab:{KEY}:4711:pending"));
        let src = e.source.as_ref().expect("source");
        assert_eq!(src.forge(), Forge::Gitlab);
        assert_eq!(src.instance, "gitlab.example.com");
        assert_eq!(src.delivery_id, KEY);
        assert_eq!(src.hook_id, "a3f1c2d4-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
        assert_eq!(src.producer, "ingest");
        assert_eq!(at(&e.received_at), Some(RX));
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:00:00 UTC)));

        let key = j.job.as_ref().expect("key");
        assert_eq!(
            (key.forge(), key.instance.as_str(), key.job_id),
            (Forge::Gitlab, "gitlab.example.com", 4711)
        );
        assert_eq!(j.status(), JobStatus::Queued);
        assert_eq!(j.forge_status, "pending");
        assert_eq!(j.conclusion(), Conclusion::Unspecified);
        assert_eq!(j.project, "ci/spack-packages");
        assert_eq!(j.project_id, 42);
        assert_eq!(j.pipeline_id, 1234);
        assert_eq!(j.run_attempt, 1);
        assert_eq!(j.name, "build py-torch");
        assert_eq!(j.stage, "build");
        assert_eq!(j.workflow_name, "");
        assert!(j.labels.is_empty());
        assert_eq!((j.runner_id, j.runner_name.as_str()), (None, ""));
        assert_eq!(j.r#ref, "develop");
        assert_eq!(j.sha, "2293ada6b400935a1378653304eaf6221e0fdb8f");
        assert!(!j.tag);
        assert!(!j.allow_failure);
        assert_eq!(j.queued_duration_seconds, Some(3.51));
        assert_eq!(j.duration_seconds, None);
        assert_eq!(j.failure_reason, "");
        assert_eq!(j.pipeline_status, "");
        assert_eq!(
            j.html_url,
            "https://gitlab.example.com/ci/spack-packages/-/jobs/4711"
        );
        assert_eq!(at(&j.created_at), Some(datetime!(2024-06-01 12:00:00 UTC)));
        assert_eq!((at(&j.started_at), at(&j.completed_at)), (None, None));
    }

    #[test]
    fn running_job_has_runner_and_tags() {
        let (e, j) = one_job(&job_delivery(RUNNING.as_bytes()));
        assert_eq!(e.id, format!("gitlab:{KEY}:4711:running"));
        assert_eq!(j.status(), JobStatus::InProgress);
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:01:05 UTC)));
        assert_eq!(j.runner_id, Some(17));
        assert_eq!(j.runner_name, "k8s-runner-large-a");
        assert_eq!(j.labels, ["spack", "x86_64", "large"]);
        assert_eq!(j.duration_seconds, Some(0.619811));
        assert_eq!(j.queued_duration_seconds, Some(65.2));
        // GitLab's `unknown_failure` default on a job that has not failed.
        assert_eq!(j.failure_reason, "");
    }

    #[test]
    fn failed_job_is_completed_with_reason() {
        let (e, j) = one_job(&job_delivery(FAILED.as_bytes()));
        assert_eq!(e.id, format!("gitlab:{KEY}:4711:failed"));
        assert_eq!(j.status(), JobStatus::Completed);
        assert_eq!(j.conclusion(), Conclusion::Failure);
        assert_eq!(j.failure_reason, "script_failure");
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:16:07 UTC)));
        assert_eq!(
            at(&j.completed_at),
            Some(datetime!(2024-06-01 12:16:07 UTC))
        );
        assert_eq!(j.duration_seconds, Some(902.0));
    }

    #[test]
    fn manual_job_is_ignored() {
        assert_eq!(
            normalize_gitlab(&job_delivery(MANUAL.as_bytes())),
            Ok(Normalized::Ignored("manual job".into()))
        );
    }

    #[test]
    fn every_build_status_maps() {
        use Conclusion as C;
        use JobStatus as S;
        for (word, status, conclusion) in [
            ("created", S::Waiting, C::Unspecified),
            ("pending", S::Queued, C::Unspecified),
            ("running", S::InProgress, C::Unspecified),
            ("success", S::Completed, C::Success),
            ("failed", S::Completed, C::Failure),
            ("canceled", S::Completed, C::Cancelled),
            ("skipped", S::Completed, C::Skipped),
            ("waiting_for_resource", S::Waiting, C::Unspecified),
            ("preparing", S::Waiting, C::Unspecified),
            ("scheduled", S::Waiting, C::Unspecified),
        ] {
            let body = replaced(FAILED, "/build_status", json!(word));
            let (e, j) = one_job(&job_delivery(&body));
            assert_eq!((j.status(), j.conclusion()), (status, conclusion), "{word}");
            assert_eq!(j.forge_status, word);
            assert_eq!(e.id, format!("gitlab:{KEY}:4711:{word}"));
        }
    }

    #[test]
    fn run_attempt_counts_retries() {
        let body = replaced(FAILED, "/retries_count", json!(2));
        assert_eq!(one_job(&job_delivery(&body)).1.run_attempt, 3);
        let body = removed(FAILED, "/retries_count");
        assert_eq!(one_job(&job_delivery(&body)).1.run_attempt, 0);
    }

    #[test]
    fn legacy_timestamps_are_used_without_iso_copies() {
        let body = removed(FAILED, "/build_finished_at_iso");
        let (e, _) = one_job(&job_delivery(&body));
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:16:07 UTC)));
        let body = replaced(FAILED, "/build_finished_at_iso", Json::Null);
        let body = String::from_utf8(body).expect("utf-8");
        let body = replaced(
            &body,
            "/build_finished_at",
            json!("2024-06-01 14:16:07 +0200"),
        );
        let (e, _) = one_job(&job_delivery(&body));
        assert_eq!(at(&e.occurred_at), Some(datetime!(2024-06-01 12:16:07 UTC)));
    }

    #[test]
    fn a_child_pipeline_names_its_parent() {
        let mut hook: serde_json::Value = serde_json::from_str(PIPELINE).unwrap();
        hook["object_attributes"]["source"] = json!("parent_pipeline");
        hook["source_pipeline"] = json!({
            "project": {"id": 41, "web_url": "https://gitlab.example.com/ci/spack-packages",
                        "path_with_namespace": "ci/spack-packages"},
            "job_id": 3401, "pipeline_id": 1200
        });
        let body = serde_json::to_vec(&hook).unwrap();
        let all = events(&delivery("Pipeline Hook", &body));
        let Some(Body::PipelineObserved(p)) = &all[0].body else {
            panic!("first is not a PipelineObserved");
        };
        assert_eq!(p.pipeline_source, "parent_pipeline");
        assert_eq!((p.parent_pipeline_id, p.parent_project_id), (1200, 41));
        // A top-level pipeline has none.
        let all = events(&delivery("Pipeline Hook", PIPELINE.as_bytes()));
        let Some(Body::PipelineObserved(p)) = &all[0].body else {
            panic!("first is not a PipelineObserved");
        };
        assert_eq!((p.parent_pipeline_id, p.parent_project_id), (0, 0));
    }

    #[test]
    fn pipeline_yields_pipeline_first_then_non_manual_builds() {
        let all = events(&delivery("Pipeline Hook", PIPELINE.as_bytes()));
        assert_eq!(
            all.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
            [
                format!("gitlab:{KEY}:pipeline:1234:failed"),
                format!("gitlab:{KEY}:4710:success"),
                format!("gitlab:{KEY}:4711:failed"),
            ]
        );
        let Some(Body::PipelineObserved(p)) = &all[0].body else {
            panic!("first is not a PipelineObserved");
        };
        assert_eq!(p.forge(), Forge::Gitlab);
        assert_eq!(p.instance, "gitlab.example.com");
        assert_eq!(p.pipeline_id, 1234);
        assert_eq!(p.project_id, 42);
        assert_eq!(p.project, "ci/spack-packages");
        assert_eq!(p.r#ref, "develop");
        assert_eq!(p.sha, "2293ada6b400935a1378653304eaf6221e0fdb8f");
        assert!(!p.tag);
        assert_eq!(p.status, "failed");
        assert_eq!(p.pipeline_source, "push");
        assert_eq!(at(&p.created_at), Some(datetime!(2024-06-01 11:58:30 UTC)));
        assert_eq!(at(&p.finished_at), Some(datetime!(2024-06-01 12:16:30 UTC)));
        assert_eq!(
            at(&all[0].occurred_at),
            Some(datetime!(2024-06-01 12:16:30 UTC))
        );
        assert_eq!(p.duration_seconds, Some(925.0));
        assert_eq!(p.queued_duration_seconds, Some(12.0));
        assert_eq!(p.job_ids, [4710, 4711, 4712]);
        assert_eq!(
            p.web_url,
            "https://gitlab.example.com/ci/spack-packages/-/pipelines/1234"
        );

        let ok = job(&all[1]);
        assert_eq!(
            (ok.status(), ok.conclusion()),
            (JobStatus::Completed, Conclusion::Success)
        );
        assert_eq!(ok.job.as_ref().map(|k| k.job_id), Some(4710));
        assert_eq!(ok.stage, "generate");
        assert_eq!(ok.failure_reason, "");

        let failed = job(&all[2]);
        assert_eq!(failed.job.as_ref().map(|k| k.job_id), Some(4711));
        assert_eq!(failed.conclusion(), Conclusion::Failure);
        assert_eq!(failed.failure_reason, "script_failure");
        assert_eq!(failed.pipeline_status, "failed");
        assert_eq!(failed.pipeline_id, 1234);
        assert_eq!(failed.project, "ci/spack-packages");
        assert_eq!(failed.project_id, 42);
        assert_eq!(failed.r#ref, "develop");
        assert_eq!(failed.labels, ["spack", "x86_64", "large"]);
        assert_eq!(failed.runner_id, Some(17));
        assert_eq!(failed.duration_seconds, Some(902.0));
        assert_eq!(failed.queued_duration_seconds, Some(65.2));
        assert_eq!(failed.run_attempt, 0);
        assert_eq!(
            at(&all[2].occurred_at),
            Some(datetime!(2024-06-01 12:16:07 UTC))
        );
        assert_eq!(
            failed.html_url,
            "https://gitlab.example.com/ci/spack-packages/-/jobs/4711"
        );
    }

    #[test]
    fn pipeline_without_builds_is_just_the_pipeline() {
        let body = removed(PIPELINE, "/builds");
        let all = events(&delivery("Pipeline Hook", &body));
        assert_eq!(all.len(), 1);
        let body = replaced(PIPELINE, "/builds", Json::Null);
        assert_eq!(events(&delivery("Pipeline Hook", &body)).len(), 1);
    }

    #[test]
    fn durations_fall_back_to_timestamps() {
        let body = replaced(PIPELINE, "/builds/1/duration", Json::Null);
        let body = String::from_utf8(body).expect("utf-8");
        let body = replaced(&body, "/builds/1/queued_duration", Json::Null);
        let all = events(&delivery("Pipeline Hook", &body));
        assert_eq!(job(&all[2]).duration_seconds, Some(902.0));
        assert_eq!(job(&all[2]).queued_duration_seconds, Some(65.0));
    }

    #[test]
    fn other_hooks_are_ignored() {
        let d = GitlabDelivery {
            event: Some("Push Hook"),
            ..job_delivery(b"garbage")
        };
        assert_eq!(
            normalize_gitlab(&d),
            Ok(Normalized::Ignored("event Push Hook".into()))
        );
        let d = GitlabDelivery {
            event: None,
            ..job_delivery(b"garbage")
        };
        assert!(matches!(normalize_gitlab(&d), Ok(Normalized::Ignored(_))));
    }

    #[test]
    fn dedup_key_prefers_idempotency_key() {
        let d = GitlabDelivery {
            idempotency_key: None,
            ..job_delivery(FAILED.as_bytes())
        };
        let (e, _) = one_job(&d);
        assert_eq!(
            e.id,
            "gitlab:0b9ab2d4-6e1c-4d61-8b1c-1f3c9f2a4b55:4711:failed"
        );
        assert_eq!(
            e.source.map(|s| s.delivery_id).as_deref(),
            Some("0b9ab2d4-6e1c-4d61-8b1c-1f3c9f2a4b55")
        );
        let d = GitlabDelivery {
            idempotency_key: Some(""),
            event_uuid: None,
            ..job_delivery(FAILED.as_bytes())
        };
        assert_eq!(invalid_field(&d), "Idempotency-Key");
    }

    #[test]
    fn instance_comes_from_header_else_project_url() {
        let d = GitlabDelivery {
            instance: Some("https://GitLab.Example.com:8443/"),
            ..job_delivery(FAILED.as_bytes())
        };
        assert_eq!(
            one_job(&d).0.source.map(|s| s.instance).as_deref(),
            Some("gitlab.example.com")
        );

        let body = replaced(
            FAILED,
            "/project/web_url",
            json!("https://git.other.example/ci/x"),
        );
        let d = GitlabDelivery {
            instance: None,
            ..job_delivery(&body)
        };
        assert_eq!(
            one_job(&d).0.source.map(|s| s.instance).as_deref(),
            Some("git.other.example")
        );

        // An older hook without `project`: the repository homepage.
        let body = removed(PENDING, "/project");
        let d = GitlabDelivery {
            instance: None,
            ..job_delivery(&body)
        };
        let (e, j) = one_job(&d);
        assert_eq!(
            e.source.map(|s| s.instance).as_deref(),
            Some("gitlab.example.com")
        );
        assert_eq!(j.project, "CI / spack-packages");
        assert_eq!(j.project_id, 42);
        // With the instance URL known, the homepage yields the real path.
        let d = GitlabDelivery {
            instance: Some("https://gitlab.example.com/"),
            ..job_delivery(&body)
        };
        assert_eq!(one_job(&d).1.project, "ci/spack-packages");

        let body = removed(PIPELINE, "/project");
        let d = GitlabDelivery {
            instance: None,
            ..delivery("Pipeline Hook", &body)
        };
        assert_eq!(invalid_field(&d), "X-Gitlab-Instance");

        let d = GitlabDelivery {
            instance: Some("not a url"),
            ..job_delivery(FAILED.as_bytes())
        };
        assert_eq!(invalid_field(&d), "X-Gitlab-Instance");
    }

    #[test]
    fn only_json_is_accepted() {
        for ct in ["text/plain", "application/x-www-form-urlencoded"] {
            let d = GitlabDelivery {
                content_type: Some(ct),
                ..job_delivery(FAILED.as_bytes())
            };
            assert_eq!(
                normalize_gitlab(&d),
                Err(PayloadError::UnsupportedMediaType(ct.into()))
            );
        }
        let d = GitlabDelivery {
            content_type: None,
            ..job_delivery(FAILED.as_bytes())
        };
        assert!(normalize_gitlab(&d).is_ok());
    }

    #[test]
    fn invalid_job_hooks_name_their_field() {
        assert_eq!(invalid_field(&job_delivery(b"{")), "body");
        assert_eq!(invalid_field(&job_delivery(b"\"build\"")), "body");
        let cases: &[(&str, Json, &str)] = &[
            ("/object_kind", json!("pipeline"), "object_kind"),
            ("/build_id", json!("4711"), "build_id"),
            ("/build_id", json!(-4711), "build_id"),
            ("/build_id", json!(4711.5), "build_id"),
            ("/build_id", json!(0), "build_id"),
            ("/build_id", Json::Null, "build_id"),
            ("/build_status", Json::Null, "build_status"),
            ("/build_status", json!(3), "build_status"),
            ("/build_status", json!("so\r\nrry"), "build_status"),
            ("/build_status", json!(""), "build_status"),
            (
                "/build_started_at_iso",
                json!("soon"),
                "build_started_at_iso",
            ),
            (
                "/build_finished_at_iso",
                json!("2030-01-01T00:00:00Z"),
                "build_finished_at_iso",
            ),
            (
                "/build_finished_at_iso",
                json!("1970-01-01T00:00:00Z"),
                "build_finished_at_iso",
            ),
            ("/build_duration", json!(-1), "build_duration"),
            (
                "/build_queued_duration",
                json!("65"),
                "build_queued_duration",
            ),
            ("/build_allow_failure", json!("no"), "build_allow_failure"),
            ("/retries_count", json!(-1), "retries_count"),
            ("/retries_count", json!(4294967295_u64), "retries_count"),
            ("/pipeline_id", json!("1234"), "pipeline_id"),
            ("/project_id", json!(-42), "project_id"),
            ("/tag", json!("false"), "tag"),
            ("/ref", json!(["develop"]), "ref"),
            ("/runner", json!("k8s"), "runner"),
            ("/runner/id", json!("17"), "runner.id"),
            ("/runner/tags", json!([1]), "runner.tags[0]"),
            ("/runner/description", json!(17), "runner.description"),
            ("/project", json!(42), "project"),
            (
                "/project/path_with_namespace",
                json!(1),
                "project.path_with_namespace",
            ),
        ];
        for (pointer, value, field) in cases {
            let body = replaced(FAILED, pointer, value.clone());
            assert_eq!(
                invalid_field(&job_delivery(&body)),
                *field,
                "{pointer} = {value}"
            );
        }
        // Without `*_iso` copies (older GitLab) the legacy fields are read.
        for (pointer, value, field) in [
            (
                "/build_created_at",
                json!("2024-06-01 12:00"),
                "build_created_at",
            ),
            (
                "/build_created_at",
                json!("2024-06-01 12:00:00 CEST"),
                "build_created_at",
            ),
            ("/build_created_at", json!(1717243200), "build_created_at"),
            (
                "/build_created_at",
                json!("2024-06-03 00:00:00 UTC"),
                "build_created_at",
            ),
        ] {
            let body = replaced(PENDING, pointer, value.clone());
            assert_eq!(
                invalid_field(&job_delivery(&body)),
                field,
                "{pointer} = {value}"
            );
        }
        let body = removed(FAILED, "/build_status");
        assert_eq!(invalid_field(&job_delivery(&body)), "build_status");
        let body = removed(FAILED, "/build_id");
        assert_eq!(invalid_field(&job_delivery(&body)), "build_id");
    }

    #[test]
    fn invalid_pipeline_hooks_name_their_field() {
        let cases: &[(&str, Json, &str)] = &[
            ("/object_kind", json!("build"), "object_kind"),
            ("/object_attributes", Json::Null, "object_attributes"),
            ("/object_attributes", json!([]), "object_attributes"),
            (
                "/object_attributes/id",
                json!("1234"),
                "object_attributes.id",
            ),
            ("/object_attributes/id", json!(0), "object_attributes.id"),
            (
                "/object_attributes/status",
                Json::Null,
                "object_attributes.status",
            ),
            (
                "/object_attributes/status",
                json!("fa iled"),
                "object_attributes.status",
            ),
            (
                "/object_attributes/created_at",
                json!("Saturday"),
                "object_attributes.created_at",
            ),
            (
                "/object_attributes/duration",
                json!(-925),
                "object_attributes.duration",
            ),
            (
                "/object_attributes/source",
                json!(1),
                "object_attributes.source",
            ),
            ("/project/id", json!("42"), "project.id"),
            ("/project/web_url", json!(false), "project.web_url"),
            ("/builds", json!({}), "builds"),
            ("/builds/0", json!(4710), "builds[0]"),
            ("/builds/0/id", json!("4710"), "builds[0].id"),
            ("/builds/2/id", json!(-1), "builds[2].id"),
            ("/builds/0/status", Json::Null, "builds[0].status"),
            (
                "/builds/1/created_at",
                json!("2024-06-01T12:00:00"),
                "builds[1].created_at",
            ),
            (
                "/builds/1/finished_at",
                json!("1999-01-01 00:00:00 UTC"),
                "builds[1].finished_at",
            ),
            (
                "/builds/1/runner/tags",
                json!("spack"),
                "builds[1].runner.tags",
            ),
            ("/builds/1/duration", json!("902"), "builds[1].duration"),
        ];
        for (pointer, value, field) in cases {
            let body = replaced(PIPELINE, pointer, value.clone());
            let d = delivery("Pipeline Hook", &body);
            assert_eq!(invalid_field(&d), *field, "{pointer} = {value}");
        }
    }
}
