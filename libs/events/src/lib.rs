//! runyard's event log vocabulary: the protobuf types generated from
//! `proto/runyard/events/v1`, the subjects they travel on and the rules that
//! make event ids deterministic (so a duplicate dies in JetStream's dedup
//! window and again in the projection).

/// Generated protobuf types of `runyard.events.v1`.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/runyard.events.v1.rs"));
}

pub use v1::{
    AllocationIssued, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, JobUnserved,
    PipelineObserved, Recommended, RetryIssued, RetryJob, RetryRefused, RetryRequested,
    RetryTarget, RunnerAssigned, RunnerCreated, RunnerDeleted, RunnerFailed, RunnerOnline,
    RunnerRef, RunnerRequested, ScaleSetProgress, ScaleSetStatistics, Source, UsageIdentity,
    UsageReported, event::Body,
};

use std::fmt;

use sha2::{Digest as _, Sha256};

/// A namespace: subject prefix and the stem of stream and consumer names.
///
/// Several stacks (or tests) share one NATS server by using different
/// namespaces.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Namespace(String);

/// A namespace that is not a single NATS subject token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidNamespace(pub String);

impl fmt::Display for InvalidNamespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "namespace {:?} must be 1-64 characters of [A-Za-z0-9_-]",
            self.0
        )
    }
}

impl std::error::Error for InvalidNamespace {}

impl Namespace {
    /// Validates and wraps a namespace.
    pub fn new(ns: impl Into<String>) -> Result<Self, InvalidNamespace> {
        let ns = ns.into();
        let ok = !ns.is_empty()
            && ns.len() <= 64
            && ns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(ns))
        } else {
            Err(InvalidNamespace(ns))
        }
    }

    /// The namespace as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `<NS>_EVENTS`: the event log stream.
    pub fn events_stream(&self) -> String {
        format!("{}_EVENTS", self.0.to_ascii_uppercase())
    }

    /// `<NS>_RAW`: accepted raw deliveries, kept for replaying a normalizer fix.
    pub fn raw_stream(&self) -> String {
        format!("{}_RAW", self.0.to_ascii_uppercase())
    }

    /// `<ns>.v1.>`: every event subject.
    pub fn all_events(&self) -> String {
        format!("{}.v1.>", self.0)
    }

    /// `<ns>.raw.>`: every raw delivery subject.
    pub fn all_raw(&self) -> String {
        format!("{}.raw.>", self.0)
    }

    /// `<ns>.v1.job.<forge>.<status>`.
    pub fn job_subject(&self, forge: Forge, status: JobStatus) -> String {
        format!(
            "{}.v1.job.{}.{}",
            self.0,
            forge_token(forge),
            status_token(status)
        )
    }

    /// `<ns>.v1.pipeline.<forge>.<status>`; the status word is reduced to a
    /// safe subject token.
    pub fn pipeline_subject(&self, forge: Forge, status: &str) -> String {
        format!(
            "{}.v1.pipeline.{}.{}",
            self.0,
            forge_token(forge),
            subject_token(status)
        )
    }

    /// `<ns>.v1.usage.<forge>`.
    pub fn usage_subject(&self, forge: Forge) -> String {
        format!("{}.v1.usage.{}", self.0, forge_token(forge))
    }

    /// `<ns>.v1.deadletter`: messages a consumer could not apply.
    pub fn deadletter_subject(&self) -> String {
        format!("{}.v1.deadletter", self.0)
    }

    /// `<ns>.raw.<kind>` where kind is `github`, `gitlab` or `usage`.
    pub fn raw_subject(&self, kind: &str) -> String {
        format!("{}.raw.{}", self.0, subject_token(kind))
    }

    /// `<ns>.v1.allocation`.
    pub fn allocation_subject(&self) -> String {
        format!("{}.v1.allocation", self.0)
    }

    /// `<ns>.v1.runner.<pool>.<state>`, `state` one of [`RUNNER_STATES`].
    /// The pool name must pass [`valid_pool_name`] (it is a subject token);
    /// [`Namespace::subject_for`] checks that.
    pub fn runner_subject(&self, pool: &str, state: &str) -> String {
        format!("{}.v1.runner.{pool}.{state}", self.0)
    }

    /// `<ns>.v1.scaler.<forge>.unserved`.
    pub fn unserved_subject(&self, forge: Forge) -> String {
        format!("{}.v1.scaler.{}.unserved", self.0, forge_token(forge))
    }

    /// `<ns>.v1.scaleset.<pool>`: a scale-set listener's progress.
    pub fn scale_set_subject(&self, pool: &str) -> String {
        format!("{}.v1.scaleset.{pool}", self.0)
    }

    /// `<ns>.v1.retry.<forge>`.
    pub fn retry_subject(&self, forge: Forge) -> String {
        format!("{}.v1.retry.{}", self.0, forge_token(forge))
    }

    /// The subject an event travels on, derived from its body.
    pub fn subject_for(&self, event: &Event) -> Option<String> {
        let forge = || event.source.as_ref().map(|s| s.forge());
        Some(match event.body.as_ref()? {
            Body::JobObserved(job) => self.job_subject(forge()?, job.status()),
            Body::PipelineObserved(p) => self.pipeline_subject(forge()?, &p.status),
            Body::UsageReported(_) => self.usage_subject(forge()?),
            Body::AllocationIssued(_) => self.allocation_subject(),
            runner @ (Body::RunnerRequested(_)
            | Body::RunnerCreated(_)
            | Body::RunnerOnline(_)
            | Body::RunnerAssigned(_)
            | Body::RunnerFailed(_)
            | Body::RunnerDeleted(_)) => {
                let pool = &runner_ref(runner)?.pool;
                if !valid_pool_name(pool) {
                    return None;
                }
                self.runner_subject(pool, runner_state(runner)?)
            }
            retry @ (Body::RetryRequested(_) | Body::RetryIssued(_) | Body::RetryRefused(_)) => {
                self.retry_subject(retry_target(retry)?.forge())
            }
            Body::JobUnserved(u) => self.unserved_subject(u.job.as_ref()?.forge()),
            Body::ScaleSetProgress(p) => {
                if !valid_pool_name(&p.pool) {
                    return None;
                }
                self.scale_set_subject(&p.pool)
            }
        })
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `github`, `gitlab` (or `unknown`).
pub fn forge_token(forge: Forge) -> &'static str {
    match forge {
        Forge::Github => "github",
        Forge::Gitlab => "gitlab",
        Forge::Unspecified => "unknown",
    }
}

/// Parses `github` / `gitlab`.
pub fn parse_forge(s: &str) -> Option<Forge> {
    match s {
        "github" => Some(Forge::Github),
        "gitlab" => Some(Forge::Gitlab),
        _ => None,
    }
}

/// `queued`, `waiting`, `in_progress`, `completed`.
pub fn status_token(status: JobStatus) -> &'static str {
    match status {
        JobStatus::Queued => "queued",
        JobStatus::Waiting => "waiting",
        JobStatus::InProgress => "in_progress",
        JobStatus::Completed => "completed",
        JobStatus::Unspecified => "unknown",
    }
}

/// A job observation's place in the forge's lifecycle, for ordering two
/// observations of one job (REFERENCE: "Job lifecycles"). A job does not walk
/// a ladder: `queued` and `waiting` alternate (a GitHub job waits for an
/// environment's approval, then queues; a GitLab job waits for a resource
/// group, its schedule or a runner's preparation, then turns `pending`), so
/// both share one stage, inside which the later observation wins. GitLab
/// `created` (a later stage, `needs:` not met) comes before every other
/// state; `in_progress` and the terminal states only move forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// Nothing known.
    Unknown = 0,
    /// GitLab `created`: not runnable yet, and never after anything else.
    Created = 1,
    /// `queued`/`pending` (runnable) or `waiting` and GitLab's held states.
    Pending = 2,
    /// A runner took it.
    Running = 3,
    /// Done.
    Done = 4,
}

impl Stage {
    /// The stage of an observation: its status and the forge's own word.
    pub fn of(status: JobStatus, forge_status: &str) -> Self {
        match status {
            JobStatus::Unspecified => Self::Unknown,
            JobStatus::Waiting if forge_status == "created" => Self::Created,
            JobStatus::Queued | JobStatus::Waiting => Self::Pending,
            JobStatus::InProgress => Self::Running,
            JobStatus::Completed => Self::Done,
        }
    }

    /// The stage of a `JobObserved`.
    pub fn of_job(j: &JobObserved) -> Self {
        Self::of(j.status(), &j.forge_status)
    }

    /// The stored number (`jobs.rank_status`).
    pub fn number(self) -> i16 {
        self as i16
    }
}

/// When an observation of a job was made, for ordering it against another
/// of the same [`Stage`]. Runnable and held states carry no time of their own
/// in either forge's payload (a GitHub `queued` after an approval keeps the
/// job's `created_at`), so for them it is the time runyard received the
/// delivery (or polled the state); for the others the event's own time.
pub fn observed_at(event: &Event) -> Option<&prost_types::Timestamp> {
    let pending = matches!(
        &event.body,
        Some(Body::JobObserved(j)) if Stage::of_job(j) <= Stage::Pending
    );
    if pending {
        event.received_at.as_ref().or(event.occurred_at.as_ref())
    } else {
        event.occurred_at.as_ref().or(event.received_at.as_ref())
    }
}

/// Lower-cases and keeps `[a-z0-9_-]`, so a forge's word can sit in a subject.
fn subject_token(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    if t.is_empty() { "unknown".into() } else { t }
}

/// The value of the `Runyard-Event-Type` header for an event.
pub fn event_type(event: &Event) -> &'static str {
    match event.body {
        Some(Body::JobObserved(_)) => "JobObserved",
        Some(Body::PipelineObserved(_)) => "PipelineObserved",
        Some(Body::UsageReported(_)) => "UsageReported",
        Some(Body::AllocationIssued(_)) => "AllocationIssued",
        Some(Body::RunnerRequested(_)) => "RunnerRequested",
        Some(Body::RunnerCreated(_)) => "RunnerCreated",
        Some(Body::RunnerOnline(_)) => "RunnerOnline",
        Some(Body::RunnerAssigned(_)) => "RunnerAssigned",
        Some(Body::RunnerFailed(_)) => "RunnerFailed",
        Some(Body::RunnerDeleted(_)) => "RunnerDeleted",
        Some(Body::RetryRequested(_)) => "RetryRequested",
        Some(Body::RetryIssued(_)) => "RetryIssued",
        Some(Body::RetryRefused(_)) => "RetryRefused",
        Some(Body::JobUnserved(_)) => "JobUnserved",
        Some(Body::ScaleSetProgress(_)) => "ScaleSetProgress",
        None => "Unknown",
    }
}

/// The `<state>` tokens of runner subjects, in lifecycle order (`failed`
/// can happen after any of the first four).
pub const RUNNER_STATES: [&str; 6] = [
    "requested",
    "created",
    "online",
    "assigned",
    "failed",
    "deleted",
];

/// The `<state>` subject token of a runner event; `None` for other bodies.
pub fn runner_state(body: &Body) -> Option<&'static str> {
    Some(match body {
        Body::RunnerRequested(_) => "requested",
        Body::RunnerCreated(_) => "created",
        Body::RunnerOnline(_) => "online",
        Body::RunnerAssigned(_) => "assigned",
        Body::RunnerFailed(_) => "failed",
        Body::RunnerDeleted(_) => "deleted",
        _ => return None,
    })
}

/// The runner a runner event is about; `None` for other bodies and for a
/// runner event without its ref.
pub fn runner_ref(body: &Body) -> Option<&RunnerRef> {
    match body {
        Body::RunnerRequested(e) => e.runner.as_ref(),
        Body::RunnerCreated(e) => e.runner.as_ref(),
        Body::RunnerOnline(e) => e.runner.as_ref(),
        Body::RunnerAssigned(e) => e.runner.as_ref(),
        Body::RunnerFailed(e) => e.runner.as_ref(),
        Body::RunnerDeleted(e) => e.runner.as_ref(),
        _ => None,
    }
}

/// The target a retry event is about; `None` for other bodies and for a
/// retry event without its target.
pub fn retry_target(body: &Body) -> Option<&RetryTarget> {
    match body {
        Body::RetryRequested(e) => e.target.as_ref(),
        Body::RetryIssued(e) => e.target.as_ref(),
        Body::RetryRefused(e) => e.target.as_ref(),
        _ => None,
    }
}

/// Why an OOM retry was refused: `RetryRefused.reason` (ARCHITECTURE.md,
/// "The event log").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryRefusal {
    /// The workload's streak or the job's retry lineage holds `max_retries`.
    LimitReached,
    /// The job failed for another reason than an OOM kill.
    NotOom,
    /// No usage report arrived to tell.
    NoUsageReport,
    /// GitHub no longer re-runs a run this old.
    RerunWindowExpired,
    /// GitHub's limit of attempts per run is reached.
    MaxAttempts,
    /// The forge refused the retry.
    ForgeRejected,
    /// Retries are off for the project.
    StrategyOff,
}

impl RetryRefusal {
    /// Every reason, in the contract's order.
    pub const ALL: [RetryRefusal; 7] = [
        RetryRefusal::LimitReached,
        RetryRefusal::NotOom,
        RetryRefusal::NoUsageReport,
        RetryRefusal::RerunWindowExpired,
        RetryRefusal::MaxAttempts,
        RetryRefusal::ForgeRejected,
        RetryRefusal::StrategyOff,
    ];

    /// The contract's string.
    pub const fn as_str(self) -> &'static str {
        match self {
            RetryRefusal::LimitReached => "limit_reached",
            RetryRefusal::NotOom => "not_oom",
            RetryRefusal::NoUsageReport => "no_usage_report",
            RetryRefusal::RerunWindowExpired => "rerun_window_expired",
            RetryRefusal::MaxAttempts => "max_attempts",
            RetryRefusal::ForgeRejected => "forge_rejected",
            RetryRefusal::StrategyOff => "strategy_off",
        }
    }

    /// The reason a `RetryRefused.reason` string names, if it is one.
    pub fn parse(reason: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == reason)
    }
}

impl std::fmt::Display for RetryRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `RetryRefused.reason` values, as strings.
pub const RETRY_REFUSAL_REASONS: [&str; 7] = {
    let mut names = [""; 7];
    let mut i = 0;
    while i < 7 {
        names[i] = RetryRefusal::ALL[i].as_str();
        i += 1;
    }
    names
};

/// Share of the limit a peak must reach for exit code 137 to count as an OOM
/// kill when the report has no cgroup data.
pub const OOM_PEAK_SHARE: f64 = 0.95;

/// Whether a job attempt was OOM-killed, by its usage report: the cgroup's
/// `oom_kill` count (`oom_killed`) is authoritative; only when the report has
/// no cgroup data (`cgroup` empty) does exit code 137 with a peak at
/// [`OOM_PEAK_SHARE`] of the limit or more count as one too.
pub fn oom_killed(u: &UsageReported) -> bool {
    if u.oom_killed {
        return true;
    }
    if !u.cgroup.is_empty() {
        return false;
    }
    match (u.exit_code, u.memory_limit_bytes) {
        (Some(137), Some(limit)) if limit > 0 => {
            u.peak_memory_bytes as f64 >= OOM_PEAK_SHARE * limit as f64
        }
        _ => false,
    }
}

/// `runner:<name>:<state>`, the deterministic id of a runner event. For the
/// states a runner can reach more than once, `state` carries what tells them
/// apart: `failed:<attempt>` and `assigned:<job_id>`
/// ([`runner_event_id_for`] builds those from the body).
pub fn runner_event_id(name: &str, state: &str) -> String {
    format!("runner:{name}:{state}")
}

/// The deterministic id of a runner event, from its body:
/// `runner:<name>:<state>`, except `runner:<name>:failed:<attempt>`
/// (`…:failed:<attempt>:given_up` when the job is given up),
/// `runner:<name>:created:<attempt>` for attempts after the first, and
/// `runner:<name>:assigned:<job_id>` (0 when the job is missing). `None` for
/// other bodies and for a runner event without its ref.
pub fn runner_event_id_for(body: &Body) -> Option<String> {
    let name = &runner_ref(body)?.name;
    Some(match body {
        // Giving up follows the last attempt's own failure: an id of its own.
        Body::RunnerFailed(f) if f.given_up => {
            runner_event_id(name, &format!("failed:{}:given_up", f.attempt))
        }
        Body::RunnerFailed(f) => runner_event_id(name, &format!("failed:{}", f.attempt)),
        // A later attempt's instance is a new fact, not a duplicate.
        Body::RunnerCreated(c) if c.attempt > 1 => {
            runner_event_id(name, &format!("created:{}", c.attempt))
        }
        Body::RunnerAssigned(a) => runner_event_id(
            name,
            &format!("assigned:{}", a.job.as_ref().map_or(0, |j| j.job_id)),
        ),
        other => runner_event_id(name, runner_state(other)?),
    })
}

/// The key of a job's claim in `<NS>_CLAIMS`:
/// `<forge>.<instance with '.' replaced by '_'>.<job_id>.<run_attempt>`.
pub fn claim_key(forge: Forge, instance: &str, job_id: u64, run_attempt: u32) -> String {
    format!(
        "{}.{}.{job_id}.{run_attempt}",
        forge_token(forge),
        key_token(instance)
    )
}

/// `s` as one token of a KV key: dots separate the key's tokens, and
/// anything else a key may not hold (a port's `:`) goes the same way, to `_`.
pub fn key_token(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The deterministic instance name of the runner made for a claim:
/// `ry-<pool>-<first 10 hex chars of sha256(claim_key)>`, so whichever
/// scaler replica creates it, it is the same instance.
pub fn instance_name(pool: &str, claim_key: &str) -> String {
    let digest = Sha256::digest(claim_key.as_bytes());
    format!("ry-{pool}-{}", hex::encode(&digest[..5]))
}

/// Whether `name` can name a pool: 1-63 characters of `[a-z0-9_-]` (it is a
/// subject token and part of instance names).
pub fn valid_pool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// The caps every producer and consumer of events holds their free text
/// to: what ingest refuses at its door (docs/architecture.md, "Ingest HTTP
/// API"), so an event that passes them fits the projection and a NATS
/// message, and a consumer can refuse one that does not (a producer that
/// went around ingest).
pub mod limits {
    /// Bytes of a string kept that is not a URL or a delivery id: names,
    /// refs, projects, labels, workload keys and values.
    pub const MAX_TEXT_BYTES: usize = 1024;
    /// Workload attributes in one usage report.
    pub const MAX_WORKLOAD_ATTRIBUTES: usize = 64;

    /// Why `value` (the field `field`) is over the caps, if it is: longer
    /// than [`MAX_TEXT_BYTES`], or holding NUL (Postgres `text` and `jsonb`
    /// cannot). The message names the field and never echoes the value.
    pub fn text(field: &str, value: &str) -> Result<(), super::FieldError> {
        use super::FieldError;
        if value.len() > MAX_TEXT_BYTES {
            return Err(FieldError::new(
                field,
                format!("{} bytes, longer than {MAX_TEXT_BYTES}", value.len()),
            ));
        }
        if value.contains('\0') {
            return Err(FieldError::new(field, "must not contain NUL (\\u0000)"));
        }
        Ok(())
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn text_names_the_field_and_keeps_the_value_out() {
            assert_eq!(text("ref", &"a".repeat(MAX_TEXT_BYTES)), Ok(()));
            let long = "b".repeat(MAX_TEXT_BYTES + 1);
            let e = text("ref", &long).unwrap_err().to_string();
            assert_eq!(e, "ref: 1025 bytes, longer than 1024");
            let e = text("requests[2].ref", "a\0b").unwrap_err().to_string();
            assert!(
                e.starts_with("requests[2].ref: ") && e.contains("NUL"),
                "{e}"
            );
        }
    }
}

/// A value refused, naming its field: shown as `<field>: <message>`, the
/// way every runyard door words a refusal (a request field such as
/// `requests[2].ref`, a workload attribute, or an environment variable).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The field, e.g. `workload.package` or `RUNYARD_ALLOCATOR_TOKENS`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// `field` refused because of `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Deterministic event ids (ARCHITECTURE.md, "The event log").
pub mod ids {
    use super::{Forge, forge_token};

    /// `github:<X-GitHub-Delivery>`.
    pub fn github(delivery: &str) -> String {
        format!("github:{delivery}")
    }

    /// `gitlab:<Idempotency-Key or X-Gitlab-Event-UUID>:<build_id>:<status>`.
    pub fn gitlab_job(delivery: &str, build_id: u64, status: &str) -> String {
        format!("gitlab:{delivery}:{build_id}:{status}")
    }

    /// `gitlab:<delivery>:pipeline:<pipeline_id>:<status>`.
    pub fn gitlab_pipeline(delivery: &str, pipeline_id: u64, status: &str) -> String {
        format!("gitlab:{delivery}:pipeline:{pipeline_id}:{status}")
    }

    /// `usage:<forge>:<instance>:<job_id>:<attempt>`.
    pub fn usage(forge: Forge, instance: &str, job_id: u64, attempt: u32) -> String {
        format!("usage:{}:{instance}:{job_id}:{attempt}", forge_token(forge))
    }

    /// `<forge>:poll:<instance>:<job_id>:<status>` for events the
    /// reconciler derives from the forge's API (job ids are only unique
    /// within one instance).
    pub fn poll(forge: Forge, instance: &str, job_id: u64, status: &str) -> String {
        format!("{}:poll:{instance}:{job_id}:{status}", forge_token(forge))
    }

    /// `<forge>:<instance>:pipeline:<id>`, the unit of a GitLab pipeline
    /// retry (see [`retry`]).
    pub fn retry_unit_pipeline(pipeline_id: u64) -> String {
        format!("pipeline:{pipeline_id}")
    }

    /// `job:<id>:<attempt>`, the unit of a GitLab job retry.
    pub fn retry_unit_job(job_id: u64, attempt: u32) -> String {
        format!("job:{job_id}:{attempt}")
    }

    /// `run:<id>:<attempt>`, the unit of a GitHub run attempt's re-run.
    pub fn retry_unit_run(run_id: u64, attempt: u32) -> String {
        format!("run:{run_id}:{attempt}")
    }

    /// `retry:<forge>:<instance>:<unit>:<what>`: the id of a retry event,
    /// `what` being `requested`, `issued`, `refused`, or
    /// `job:<job_id>:requested|issued` for one of a run's one-at-a-time job
    /// re-runs. A refusal of one failed job attempt uses the unit
    /// [`retry_unit_job`].
    pub fn retry(forge: Forge, instance: &str, unit: &str, what: &str) -> String {
        format!("retry:{}:{instance}:{unit}:{what}", forge_token(forge))
    }

    /// `unserved:<forge>:<instance>:<job_id>:<run_attempt>:<reason>`: the
    /// scaler's word that it cannot serve a job, once per attempt and reason.
    pub fn unserved(
        forge: Forge,
        instance: &str,
        job_id: u64,
        attempt: u32,
        reason: &str,
    ) -> String {
        format!(
            "unserved:{}:{instance}:{job_id}:{attempt}:{reason}",
            forge_token(forge)
        )
    }

    /// `raw:<event id>`: the dedup id of a raw delivery in `<NS>_RAW`.
    pub fn raw(key: &str) -> String {
        format!("raw:{key}")
    }
}

/// Converts a `time` instant to a protobuf timestamp.
pub fn timestamp(t: time::OffsetDateTime) -> prost_types::Timestamp {
    let nanos = t.unix_timestamp_nanos();
    prost_types::Timestamp {
        seconds: nanos.div_euclid(1_000_000_000) as i64,
        nanos: nanos.rem_euclid(1_000_000_000) as i32,
    }
}

/// Converts a protobuf timestamp back to a `time` instant.
pub fn from_timestamp(t: &prost_types::Timestamp) -> Option<time::OffsetDateTime> {
    let nanos = i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos);
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_refusal_reasons_are_the_contract_s_strings() {
        assert_eq!(
            RETRY_REFUSAL_REASONS,
            [
                "limit_reached",
                "not_oom",
                "no_usage_report",
                "rerun_window_expired",
                "max_attempts",
                "forge_rejected",
                "strategy_off",
            ]
        );
        for reason in RetryRefusal::ALL {
            assert_eq!(RetryRefusal::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(RetryRefusal::parse("forge rejected"), None);
    }

    #[test]
    fn subjects_and_streams_follow_the_contract() {
        let ns = Namespace::new("runyard").unwrap();
        assert_eq!(ns.events_stream(), "RUNYARD_EVENTS");
        assert_eq!(ns.raw_stream(), "RUNYARD_RAW");
        assert_eq!(
            ns.job_subject(Forge::Github, JobStatus::InProgress),
            "runyard.v1.job.github.in_progress"
        );
        assert_eq!(
            ns.pipeline_subject(Forge::Gitlab, "Waiting.For resource"),
            "runyard.v1.pipeline.gitlab.waitingforresource"
        );
        assert_eq!(ns.usage_subject(Forge::Gitlab), "runyard.v1.usage.gitlab");
        assert_eq!(ns.all_events(), "runyard.v1.>");
    }

    #[test]
    fn namespaces_must_be_one_subject_token() {
        assert!(Namespace::new("t_1-a").is_ok());
        for bad in ["", "a.b", "a>", "a b", "*"] {
            assert!(Namespace::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ids_are_deterministic() {
        assert_eq!(ids::github("abc"), "github:abc");
        assert_eq!(ids::gitlab_job("k", 7, "failed"), "gitlab:k:7:failed");
        assert_eq!(
            ids::usage(Forge::Gitlab, "gitlab.example.com", 4711, 1),
            "usage:gitlab:gitlab.example.com:4711:1"
        );
        assert_eq!(
            ids::poll(Forge::Github, "github.com", 9, "queued"),
            "github:poll:github.com:9:queued"
        );
    }

    fn runner(pool: &str, name: &str) -> Option<RunnerRef> {
        Some(RunnerRef {
            pool: pool.into(),
            name: name.into(),
            pool_id: "6f1c6c1e-3d55-5d35-8c0f-2a0a3b1d9e77".into(),
            provider: "lxd".into(),
            forge: Forge::Github as i32,
            instance: "github.com".into(),
        })
    }

    fn job(job_id: u64) -> Option<JobKey> {
        Some(JobKey {
            forge: Forge::Github as i32,
            instance: "github.com".into(),
            job_id,
        })
    }

    /// One body of each runner event type, in [`RUNNER_STATES`] order.
    fn runner_bodies(pool: &str, name: &str) -> Vec<Body> {
        let r = || runner(pool, name);
        vec![
            Body::RunnerRequested(RunnerRequested {
                runner: r(),
                job: job(42),
                ..Default::default()
            }),
            Body::RunnerCreated(RunnerCreated {
                runner: r(),
                attempt: 1,
                ..Default::default()
            }),
            Body::RunnerOnline(RunnerOnline {
                runner: r(),
                source: "callback".into(),
            }),
            Body::RunnerAssigned(RunnerAssigned {
                runner: r(),
                job: job(42),
            }),
            Body::RunnerFailed(RunnerFailed {
                runner: r(),
                attempt: 2,
                ..Default::default()
            }),
            Body::RunnerDeleted(RunnerDeleted {
                runner: r(),
                reason: "job_completed".into(),
            }),
        ]
    }

    fn event(body: Body) -> Event {
        Event {
            id: "x".into(),
            body: Some(body),
            ..Default::default()
        }
    }

    #[test]
    fn runner_events_travel_on_their_pool_and_state() {
        let ns = Namespace::new("runyard").unwrap();
        assert_eq!(
            ns.runner_subject("linux-x64", "online"),
            "runyard.v1.runner.linux-x64.online"
        );
        let bodies = runner_bodies("linux_x64-2", "ry-linux_x64-2-f41ae93a4d");
        for (body, state) in bodies.into_iter().zip(RUNNER_STATES) {
            assert_eq!(runner_state(&body), Some(state));
            assert_eq!(
                ns.subject_for(&event(body)).as_deref(),
                Some(format!("runyard.v1.runner.linux_x64-2.{state}").as_str())
            );
        }
    }

    #[test]
    fn runner_events_without_a_ref_or_a_valid_pool_have_no_subject() {
        let ns = Namespace::new("runyard").unwrap();
        for pool in ["", "Linux", "a.b", "a>", "a b", "*"] {
            for body in runner_bodies(pool, "ry-x-0123456789") {
                assert_eq!(ns.subject_for(&event(body)), None, "pool {pool:?}");
            }
        }
        let no_ref = [
            Body::RunnerRequested(RunnerRequested::default()),
            Body::RunnerCreated(RunnerCreated::default()),
            Body::RunnerOnline(RunnerOnline::default()),
            Body::RunnerAssigned(RunnerAssigned::default()),
            Body::RunnerFailed(RunnerFailed::default()),
            Body::RunnerDeleted(RunnerDeleted::default()),
        ];
        for body in no_ref {
            assert!(runner_ref(&body).is_none());
            assert_eq!(runner_event_id_for(&body), None);
            assert_eq!(ns.subject_for(&event(body)), None);
        }
    }

    #[test]
    fn runner_event_types_name_the_message() {
        let names: Vec<&str> = runner_bodies("p", "n")
            .into_iter()
            .map(|b| event_type(&event(b)))
            .collect();
        assert_eq!(
            names,
            [
                "RunnerRequested",
                "RunnerCreated",
                "RunnerOnline",
                "RunnerAssigned",
                "RunnerFailed",
                "RunnerDeleted"
            ]
        );
        assert_eq!(event_type(&Event::default()), "Unknown");
    }

    #[test]
    fn runner_event_ids_are_deterministic() {
        assert_eq!(
            runner_event_id("ry-p-0123456789", "requested"),
            "runner:ry-p-0123456789:requested"
        );
        let ids: Vec<String> = runner_bodies("p", "ry-p-0123456789")
            .iter()
            .map(|b| runner_event_id_for(b).unwrap())
            .collect();
        assert_eq!(
            ids,
            [
                "runner:ry-p-0123456789:requested",
                "runner:ry-p-0123456789:created",
                "runner:ry-p-0123456789:online",
                "runner:ry-p-0123456789:assigned:42",
                "runner:ry-p-0123456789:failed:2",
                "runner:ry-p-0123456789:deleted",
            ]
        );
        assert_eq!(
            runner_event_id_for(&Body::AllocationIssued(AllocationIssued::default())),
            None
        );
    }

    #[test]
    fn claim_keys_flatten_the_instance() {
        assert_eq!(
            claim_key(Forge::Github, "github.com", 42, 1),
            "github.github_com.42.1"
        );
        assert_eq!(
            claim_key(Forge::Gitlab, "gitlab.example.com", 4711, 2),
            "gitlab.gitlab_example_com.4711.2"
        );
        // Four dot-separated tokens whatever the host.
        assert_eq!(
            claim_key(Forge::Gitlab, "ci.a.b.example.org", 1, 1)
                .split('.')
                .count(),
            4
        );
        // A port is no valid KV key character either.
        assert_eq!(
            claim_key(Forge::Gitlab, "gitlab.example.com:8443", 7, 1),
            "gitlab.gitlab_example_com_8443.7.1"
        );
    }

    #[test]
    fn instance_names_hash_the_claim_key() {
        // sha256("github.github_com.42.1") starts with f41ae93a4d.
        assert_eq!(
            instance_name("linux-x64", "github.github_com.42.1"),
            "ry-linux-x64-f41ae93a4d"
        );
        assert_eq!(
            instance_name(
                "big",
                &claim_key(Forge::Gitlab, "gitlab.example.com", 4711, 2)
            ),
            "ry-big-b43fcaa2ff"
        );
        // Another attempt of the same job is another instance.
        assert_ne!(
            instance_name("p", &claim_key(Forge::Github, "github.com", 42, 1)),
            instance_name("p", &claim_key(Forge::Github, "github.com", 42, 2))
        );
    }

    #[test]
    fn pool_names_are_short_lowercase_subject_tokens() {
        for good in ["a", "linux-x64", "gpu_a100", "0", &"a".repeat(63)] {
            assert!(valid_pool_name(good), "{good:?} refused");
        }
        for bad in [
            "",
            &"a".repeat(64),
            "Linux",
            "a.b",
            "a b",
            "a>",
            "*",
            "ä",
            "a/b",
        ] {
            assert!(!valid_pool_name(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn timestamps_round_trip() {
        let t = time::macros::datetime!(2024-01-01 12:00:00.123456789 UTC);
        assert_eq!(from_timestamp(&timestamp(t)), Some(t));
    }
}
