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
    AllocationIssued, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, PipelineObserved,
    Source, UsageReported, event::Body,
};

use std::fmt;

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

    /// The subject an event travels on, derived from its body.
    pub fn subject_for(&self, event: &Event) -> Option<String> {
        let forge = || event.source.as_ref().map(|s| s.forge());
        Some(match event.body.as_ref()? {
            Body::JobObserved(job) => self.job_subject(forge()?, job.status()),
            Body::PipelineObserved(p) => self.pipeline_subject(forge()?, &p.status),
            Body::UsageReported(_) => self.usage_subject(forge()?),
            Body::AllocationIssued(_) => self.allocation_subject(),
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
        None => "Unknown",
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

    /// `<forge>:poll:<job_id>:<status>` for events the reconciler derives.
    pub fn poll(forge: Forge, job_id: u64, status: &str) -> String {
        format!("{}:poll:{job_id}:{status}", forge_token(forge))
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
            ids::poll(Forge::Github, 9, "queued"),
            "github:poll:9:queued"
        );
    }

    #[test]
    fn timestamps_round_trip() {
        let t = time::macros::datetime!(2024-01-01 12:00:00.123456789 UTC);
        assert_eq!(from_timestamp(&timestamp(t)), Some(t));
    }
}
