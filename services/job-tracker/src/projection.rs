//! The pure core of the projection: turning events into rows and merging two
//! observations of the same job or pipeline, independent of arrival order.
//! The SQL in [`crate::apply`] does the same merge against stored rows.

use std::collections::HashMap;

use runyard_events::{
    Body, Conclusion, Event, Forge, JobObserved, JobStatus, PipelineObserved, UsageReported,
    forge_token, from_timestamp,
};
use runyard_store::workload;
use time::OffsetDateTime;

/// `(forge, instance, id)`.
pub type Key = (String, String, i64);

/// A job row (or the contribution of one observation to it); `id` is
/// assigned by Postgres.
pub type JobRow = runyard_store::entities::job::Model;
/// A pipeline row.
pub type PipelineRow = runyard_store::entities::pipeline::Model;
/// A usage sample row.
pub type UsageRow = runyard_store::entities::usage_sample::Model;

/// The rank of a job row.
pub fn job_rank(r: &JobRow) -> (i16, OffsetDateTime, &str) {
    (r.rank_status, r.rank_at, r.rank_event.as_str())
}

/// The rank of a pipeline row.
pub fn pipeline_rank(r: &PipelineRow) -> (i16, OffsetDateTime, &str) {
    (r.rank_status, r.rank_at, r.rank_event.as_str())
}

/// What a batch of (new) events does to the projection.
#[derive(Debug, Default, Clone)]
pub struct Delta {
    /// Merged job rows by key.
    pub jobs: HashMap<Key, JobRow>,
    /// Merged pipeline rows by key.
    pub pipelines: HashMap<Key, PipelineRow>,
    /// Usage samples by `(key, attempt)`; the first one wins.
    pub usage: HashMap<(Key, i32), UsageRow>,
}

/// Why an event cannot be projected (it is dead-lettered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unprojectable(pub String);

impl Delta {
    /// Adds one event's effect.
    pub fn add(&mut self, event: &Event) -> Result<(), Unprojectable> {
        let received = event
            .received_at
            .as_ref()
            .and_then(from_timestamp)
            .map(micros)
            .ok_or_else(|| Unprojectable("event without received_at".into()))?;
        let occurred = event
            .occurred_at
            .as_ref()
            .and_then(from_timestamp)
            .map(micros)
            .unwrap_or(received);
        match &event.body {
            Some(Body::JobObserved(j)) => {
                let row = job_row(&event.id, j, occurred, received)?;
                let key = (row.forge.clone(), row.instance.clone(), row.job_id);
                merge_into(&mut self.jobs, key, row, merge_jobs);
            }
            Some(Body::PipelineObserved(p)) => {
                let row = pipeline_row(&event.id, p, occurred, received)?;
                let key = (row.forge.clone(), row.instance.clone(), row.pipeline_id);
                merge_into(&mut self.pipelines, key, row, merge_pipelines);
            }
            Some(Body::UsageReported(u)) => {
                let row = usage_row(&event.id, u, occurred)?;
                let key = (
                    (row.forge.clone(), row.instance.clone(), row.job_id),
                    row.attempt,
                );
                self.usage.entry(key).or_insert(row);
            }
            // Allocations are analysed from the log itself; event types this
            // version does not know are applied as no-ops so they never block
            // the log.
            Some(Body::AllocationIssued(_)) | None => {}
        }
        Ok(())
    }

    /// Number of rows touched.
    pub fn rows(&self) -> usize {
        self.jobs.len() + self.pipelines.len() + self.usage.len()
    }
}

fn merge_into<R: Clone>(map: &mut HashMap<Key, R>, key: Key, row: R, merge: fn(&R, &R) -> R) {
    match map.get_mut(&key) {
        Some(existing) => *existing = merge(existing, &row),
        None => {
            map.insert(key, row);
        }
    }
}

/// Postgres keeps microseconds: truncate so Rust and SQL compare the same
/// values.
fn micros(t: OffsetDateTime) -> OffsetDateTime {
    let nanos = t.nanosecond();
    t.replace_nanosecond(nanos - nanos % 1_000).unwrap_or(t)
}

fn ts(t: Option<&prost_types::Timestamp>) -> Option<OffsetDateTime> {
    t.and_then(from_timestamp).map(micros)
}

fn text(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

fn id64(v: u64, what: &str) -> Result<i64, Unprojectable> {
    i64::try_from(v).map_err(|_| Unprojectable(format!("{what} {v} out of range")))
}

fn forge_of(f: Forge) -> Result<String, Unprojectable> {
    match f {
        Forge::Unspecified => Err(Unprojectable("forge unspecified".into())),
        f => Ok(forge_token(f).to_owned()),
    }
}

/// The stored status number of a job status.
pub fn status_number(s: JobStatus) -> i16 {
    match s {
        JobStatus::Unspecified => 0,
        JobStatus::Queued => 1,
        JobStatus::Waiting => 2,
        JobStatus::InProgress => 3,
        JobStatus::Completed => 4,
    }
}

fn conclusion_word(c: Conclusion) -> Option<String> {
    let w = match c {
        Conclusion::Unspecified => return None,
        Conclusion::Success => "success",
        Conclusion::Failure => "failure",
        Conclusion::Cancelled => "cancelled",
        Conclusion::Skipped => "skipped",
        Conclusion::TimedOut => "timed_out",
        Conclusion::ActionRequired => "action_required",
        Conclusion::Neutral => "neutral",
    };
    Some(w.to_owned())
}

fn job_row(
    id: &str,
    j: &JobObserved,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
) -> Result<JobRow, Unprojectable> {
    let key = j
        .job
        .as_ref()
        .ok_or_else(|| Unprojectable("job event without job key".into()))?;
    let status = status_number(j.status());
    if status == 0 {
        return Err(Unprojectable("job status unspecified".into()));
    }
    let labels = (!j.labels.is_empty()).then(|| serde_json::json!(j.labels));
    Ok(JobRow {
        id: 0,
        forge: forge_of(key.forge())?,
        instance: key.instance.clone(),
        job_id: id64(key.job_id, "job_id")?,
        status,
        project: text(&j.project),
        project_id: (j.project_id != 0)
            .then(|| id64(j.project_id, "project_id"))
            .transpose()?,
        pipeline_id: (j.pipeline_id != 0)
            .then(|| id64(j.pipeline_id, "pipeline_id"))
            .transpose()?,
        run_attempt: (j.run_attempt != 0).then(|| i32::try_from(j.run_attempt).unwrap_or(i32::MAX)),
        name: text(&j.name),
        stage: text(&j.stage),
        workflow_name: text(&j.workflow_name),
        labels,
        forge_status: text(&j.forge_status),
        conclusion: conclusion_word(j.conclusion()),
        failure_reason: text(&j.failure_reason),
        runner_id: j.runner_id.map(|v| id64(v, "runner_id")).transpose()?,
        runner_name: text(&j.runner_name),
        runner_group_id: j
            .runner_group_id
            .map(|v| id64(v, "runner_group_id"))
            .transpose()?,
        runner_group_name: text(&j.runner_group_name),
        r#ref: text(&j.r#ref),
        sha: text(&j.sha),
        tag: Some(j.tag),
        html_url: text(&j.html_url),
        organization: text(&j.organization),
        enterprise: text(&j.enterprise),
        allow_failure: Some(j.allow_failure),
        duration_seconds: j.duration_seconds.filter(|d| d.is_finite()),
        queued_duration_seconds: j.queued_duration_seconds.filter(|d| d.is_finite()),
        created_at: ts(j.created_at.as_ref()),
        queued_at: (status == 1).then_some(occurred),
        started_at: ts(j.started_at.as_ref()),
        completed_at: ts(j.completed_at.as_ref()),
        first_seen_at: received,
        last_event_at: occurred,
        rank_status: status,
        rank_at: occurred,
        rank_event: id.to_owned(),
    })
}

/// Ordinal of a GitLab pipeline status: terminal states rank highest.
pub fn pipeline_status_rank(status: &str) -> i16 {
    match status {
        "created" => 1,
        "waiting_for_resource" | "scheduled" | "manual" => 2,
        "preparing" => 3,
        "pending" => 4,
        "running" => 5,
        "success" | "failed" | "canceled" | "skipped" => 6,
        _ => 0,
    }
}

fn pipeline_row(
    id: &str,
    p: &PipelineObserved,
    occurred: OffsetDateTime,
    received: OffsetDateTime,
) -> Result<PipelineRow, Unprojectable> {
    Ok(PipelineRow {
        id: 0,
        forge: forge_of(p.forge())?,
        instance: p.instance.clone(),
        pipeline_id: id64(p.pipeline_id, "pipeline_id")?,
        project_id: (p.project_id != 0)
            .then(|| id64(p.project_id, "project_id"))
            .transpose()?,
        project: text(&p.project),
        r#ref: text(&p.r#ref),
        sha: text(&p.sha),
        tag: Some(p.tag),
        status: p.status.clone(),
        pipeline_source: text(&p.pipeline_source),
        web_url: text(&p.web_url),
        duration_seconds: p.duration_seconds.filter(|d| d.is_finite()),
        queued_duration_seconds: p.queued_duration_seconds.filter(|d| d.is_finite()),
        created_at: ts(p.created_at.as_ref()),
        finished_at: ts(p.finished_at.as_ref()),
        first_seen_at: received,
        last_event_at: occurred,
        rank_status: pipeline_status_rank(&p.status),
        rank_at: occurred,
        rank_event: id.to_owned(),
    })
}

fn usage_row(
    id: &str,
    u: &UsageReported,
    occurred: OffsetDateTime,
) -> Result<UsageRow, Unprojectable> {
    let key = u
        .job
        .as_ref()
        .ok_or_else(|| Unprojectable("usage event without job key".into()))?;
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let workload: serde_json::Map<String, serde_json::Value> = u
        .workload
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    Ok(UsageRow {
        id: 0,
        forge: forge_of(key.forge())?,
        instance: key.instance.clone(),
        job_id: id64(key.job_id, "job_id")?,
        attempt: i32::try_from(u.attempt.max(1)).unwrap_or(i32::MAX),
        event_id: id.to_owned(),
        r#ref: text(&u.r#ref),
        project: text(&u.project),
        workload: serde_json::Value::Object(workload),
        workload_key: workload::key(u.workload.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        peak_memory_bytes: id64(u.peak_memory_bytes, "peak_memory_bytes")?,
        memory_request_bytes: u
            .memory_request_bytes
            .map(|v| id64(v, "memory_request_bytes"))
            .transpose()?,
        memory_limit_bytes: u
            .memory_limit_bytes
            .map(|v| id64(v, "memory_limit_bytes"))
            .transpose()?,
        cpu_seconds: finite(u.cpu_seconds),
        wall_seconds: finite(u.wall_seconds),
        cpu_request_millicores: u
            .cpu_request_millicores
            .map(|v| id64(v, "cpu_request_millicores"))
            .transpose()?,
        oom_killed: u.oom_killed,
        exit_code: u.exit_code,
        reported_at: occurred,
    })
}

fn min_opt(a: Option<OffsetDateTime>, b: Option<OffsetDateTime>) -> Option<OffsetDateTime> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Merges two observations of one job: status and `last_event_at` take the
/// maximum, timestamps the earliest value, descriptive fields come from the
/// higher-ranked observation, falling back to the other where it has none.
pub fn merge_jobs(a: &JobRow, b: &JobRow) -> JobRow {
    let (hi, lo) = if job_rank(a) >= job_rank(b) {
        (a, b)
    } else {
        (b, a)
    };
    macro_rules! pick {
        ($f:ident) => {
            hi.$f.clone().or_else(|| lo.$f.clone())
        };
    }
    JobRow {
        id: 0,
        forge: hi.forge.clone(),
        instance: hi.instance.clone(),
        job_id: hi.job_id,
        status: a.status.max(b.status),
        project: pick!(project),
        project_id: pick!(project_id),
        pipeline_id: pick!(pipeline_id),
        run_attempt: pick!(run_attempt),
        name: pick!(name),
        stage: pick!(stage),
        workflow_name: pick!(workflow_name),
        labels: pick!(labels),
        forge_status: pick!(forge_status),
        conclusion: pick!(conclusion),
        failure_reason: pick!(failure_reason),
        runner_id: pick!(runner_id),
        runner_name: pick!(runner_name),
        runner_group_id: pick!(runner_group_id),
        runner_group_name: pick!(runner_group_name),
        r#ref: pick!(r#ref),
        sha: pick!(sha),
        tag: pick!(tag),
        html_url: pick!(html_url),
        organization: pick!(organization),
        enterprise: pick!(enterprise),
        allow_failure: pick!(allow_failure),
        duration_seconds: pick!(duration_seconds),
        queued_duration_seconds: pick!(queued_duration_seconds),
        created_at: min_opt(a.created_at, b.created_at),
        queued_at: min_opt(a.queued_at, b.queued_at),
        started_at: min_opt(a.started_at, b.started_at),
        completed_at: min_opt(a.completed_at, b.completed_at),
        first_seen_at: a.first_seen_at.min(b.first_seen_at),
        last_event_at: a.last_event_at.max(b.last_event_at),
        rank_status: hi.rank_status,
        rank_at: hi.rank_at,
        rank_event: hi.rank_event.clone(),
    }
}

/// Merges two observations of one pipeline (same rules as jobs; the status
/// word comes with the rank).
pub fn merge_pipelines(a: &PipelineRow, b: &PipelineRow) -> PipelineRow {
    let (hi, lo) = if pipeline_rank(a) >= pipeline_rank(b) {
        (a, b)
    } else {
        (b, a)
    };
    macro_rules! pick {
        ($f:ident) => {
            hi.$f.clone().or_else(|| lo.$f.clone())
        };
    }
    PipelineRow {
        id: 0,
        forge: hi.forge.clone(),
        instance: hi.instance.clone(),
        pipeline_id: hi.pipeline_id,
        project_id: pick!(project_id),
        project: pick!(project),
        r#ref: pick!(r#ref),
        sha: pick!(sha),
        tag: pick!(tag),
        status: hi.status.clone(),
        pipeline_source: pick!(pipeline_source),
        web_url: pick!(web_url),
        duration_seconds: pick!(duration_seconds),
        queued_duration_seconds: pick!(queued_duration_seconds),
        created_at: min_opt(a.created_at, b.created_at),
        finished_at: pick!(finished_at),
        first_seen_at: a.first_seen_at.min(b.first_seen_at),
        last_event_at: a.last_event_at.max(b.last_event_at),
        rank_status: hi.rank_status,
        rank_at: hi.rank_at,
        rank_event: hi.rank_event.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use runyard_testkit::synth;

    fn fold(events: &[Event]) -> Delta {
        let mut d = Delta::default();
        for e in events {
            d.add(e).unwrap();
        }
        d
    }

    #[test]
    fn completed_before_queued_keeps_completed_and_fills_queued_at() {
        let t = synth::base_time();
        let done = synth::job_event(7, JobStatus::Completed, t);
        let queued = synth::job_event(7, JobStatus::Queued, t);
        let d = fold(&[done, queued]);
        let row = &d.jobs[&("github".to_owned(), "github.com".to_owned(), 7)];
        assert_eq!(row.status, 4);
        assert_eq!(row.queued_at, Some(t));
        assert_eq!(row.conclusion.as_deref(), Some("failure"));
        assert_eq!(row.runner_name.as_deref(), Some("runner-7"));
        assert!(row.completed_at.is_some());
    }

    #[test]
    fn unprojectable_events_are_named() {
        let mut e = synth::job_event(1, JobStatus::Queued, synth::base_time());
        e.received_at = None;
        assert!(Delta::default().add(&e).is_err());
        let mut e = synth::job_event(1, JobStatus::Queued, synth::base_time());
        if let Some(Body::JobObserved(j)) = e.body.as_mut() {
            j.job = None;
        }
        let err = Delta::default().add(&e).unwrap_err();
        assert!(err.0.contains("job key"), "{err}");
    }

    #[test]
    fn pipeline_status_comes_with_the_rank() {
        assert!(pipeline_status_rank("running") < pipeline_status_rank("failed"));
        assert!(pipeline_status_rank("created") < pipeline_status_rank("pending"));
    }

    proptest! {
        #[test]
        fn folding_does_not_depend_on_order(seed in any::<u64>(), jobs in 1u64..6) {
            use rand::seq::SliceRandom;
            use rand::SeedableRng;
            let t = synth::base_time();
            let mut events: Vec<Event> = (1..=jobs).flat_map(|j| synth::lifecycle(j, t)).collect();
            let in_order = fold(&events);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            events.shuffle(&mut rng);
            // Duplicates too.
            let dup = events[0].clone();
            events.push(dup);
            let shuffled = fold(&events);
            prop_assert_eq!(in_order.jobs, shuffled.jobs);
            prop_assert_eq!(in_order.usage, shuffled.usage);
        }
    }
}
