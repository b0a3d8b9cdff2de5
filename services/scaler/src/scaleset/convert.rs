//! A scale set's job messages as `JobObserved` events, on the same subjects
//! as webhook observations, so the projection, the allocator's follower,
//! OOM retries and the console see them as they see webhook jobs.
//!
//! | message | event |
//! |---|---|
//! | `JobAvailable` | none (the listener acquires it; `JobAssigned` follows) |
//! | `JobAssigned` | `queued` |
//! | `JobStarted` | `in_progress` on `runnerName` |
//! | `JobCompleted` with a runner | `completed` with the result |
//! | `JobCompleted` without a runner | `waiting`: the service took the job back (it reassigns it up to three times, or it was cancelled before any runner took it) |
//!
//! Identity: a job is `(github, instance, job_id)` where `job_id` is its
//! REST twin's `workflow_job.id` ([`super::resolve`]) — the id its webhook,
//! its usage report and a re-run use, so a job seen both ways is one job —
//! and, when GitHub could not name it, the scale-set `jobId` when it is a
//! decimal number, else [`job_id_of`]: 2^62 plus 62 bits of its SHA-256,
//! far above any `workflow_job.id`. Event ids are
//! `github:scaleset:<scale set id>:<message id>:<index>`: a redelivered
//! message makes the same events (JetStream's dedup window and the
//! projection drop them), and a job assigned again after being taken back
//! is a new event.
//!
//! Workload: `{repo = owner/repo, workflow = the workflow's name, job =
//! jobDisplayName}`, the webhook key; the message names the workflow by file
//! only, so without a twin the workflow is the file's path from
//! jobWorkflowRef.

use std::collections::HashMap;
use std::time::Duration;

use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, ScaleSetProgress,
    ScaleSetStatistics, Source, timestamp,
};
use runyard_forge::api::scaleset::{JobMessage, JobMessageKind, ScaleSetMessage, Statistics};
use sha2::{Digest as _, Sha256};
use time::OffsetDateTime;

use super::resolve::Twin;

/// The `producer` of scale-set events.
pub const PRODUCER: &str = "scaleset";

/// What a message's events are made with.
#[derive(Debug, Clone)]
pub struct Context<'a> {
    /// The pool.
    pub pool: &'a str,
    /// The forge host (`github.com`, a GHES host).
    pub instance: &'a str,
    /// The scale set's id.
    pub scale_set_id: i64,
    /// When the message arrived.
    pub received: OffsetDateTime,
}

/// The projection's job id of a scale-set job (see the module docs).
pub fn job_id_of(scale_set_job_id: &str) -> u64 {
    if let Ok(n) = scale_set_job_id.parse::<u64>()
        && n < 1 << 62
    {
        return n;
    }
    let digest = Sha256::digest(scale_set_job_id.as_bytes());
    let mut bytes = [0_u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    (1 << 62) | (u64::from_be_bytes(bytes) >> 2)
}

/// The workflow file's path in a `jobWorkflowRef`
/// (`owner/repo/.github/workflows/ci.yml@refs/heads/main` →
/// `.github/workflows/ci.yml`).
pub fn workflow_path(job_workflow_ref: &str, owner: &str, repo: &str) -> String {
    let path = job_workflow_ref
        .rsplit_once('@')
        .map_or(job_workflow_ref, |(p, _)| p);
    let prefix = format!("{owner}/{repo}/");
    path.strip_prefix(&prefix)
        .or_else(|| {
            // Another repository's reusable workflow: keep its owner/repo.
            (path.len() > prefix.len() && path[..prefix.len()].eq_ignore_ascii_case(&prefix))
                .then(|| &path[prefix.len()..])
        })
        .unwrap_or(path)
        .to_owned()
}

/// The branch or tag a `jobWorkflowRef` names (`refs/heads/main` → `main`).
fn ref_name(job_workflow_ref: &str) -> (String, bool) {
    let Some((_, r)) = job_workflow_ref.rsplit_once('@') else {
        return (String::new(), false);
    };
    if let Some(tag) = r.strip_prefix("refs/tags/") {
        return (tag.to_owned(), true);
    }
    (r.strip_prefix("refs/heads/").unwrap_or(r).to_owned(), false)
}

fn conclusion(result: &str) -> Conclusion {
    match result.to_ascii_lowercase().as_str() {
        "succeeded" | "success" => Conclusion::Success,
        "failed" | "failure" => Conclusion::Failure,
        "canceled" | "cancelled" => Conclusion::Cancelled,
        "skipped" => Conclusion::Skipped,
        _ => Conclusion::Unspecified,
    }
}

/// The status a job message reports, `None` for `JobAvailable` and
/// unknown kinds.
fn status_of(job: &JobMessage) -> Option<JobStatus> {
    match &job.kind {
        JobMessageKind::Assigned => Some(JobStatus::Queued),
        JobMessageKind::Started => Some(JobStatus::InProgress),
        JobMessageKind::Completed if job.runner_name.is_empty() => Some(JobStatus::Waiting),
        JobMessageKind::Completed => Some(JobStatus::Completed),
        JobMessageKind::Available | JobMessageKind::Other(_) => None,
    }
}

fn forge_status(job: &JobMessage) -> String {
    match &job.kind {
        JobMessageKind::Assigned => "assigned".into(),
        JobMessageKind::Started => "started".into(),
        JobMessageKind::Completed if job.runner_name.is_empty() => {
            format!("unassigned:{}", job.result)
        }
        JobMessageKind::Completed => format!("completed:{}", job.result),
        JobMessageKind::Available => "available".into(),
        JobMessageKind::Other(k) => k.clone(),
    }
}

/// The events of one message's jobs, in message order; a job with a REST
/// twin in `twins` (by scale-set job id) is named as GitHub's REST API and
/// webhooks name it.
pub fn events(
    ctx: &Context<'_>,
    message: &ScaleSetMessage,
    twins: &HashMap<String, Twin>,
) -> Vec<Event> {
    message
        .jobs
        .iter()
        .enumerate()
        .filter_map(|(i, job)| event(ctx, message.message_id, i, job, twins.get(&job.job_id)))
        .collect()
}

fn event(
    ctx: &Context<'_>,
    message_id: i64,
    index: usize,
    job: &JobMessage,
    twin: Option<&Twin>,
) -> Option<Event> {
    let status = status_of(job)?;
    let id = format!("github:scaleset:{}:{message_id}:{index}", ctx.scale_set_id);
    // Events of one message keep their order: a later one is later.
    let at = ctx.received + Duration::from_nanos(u64::try_from(index).unwrap_or(0));
    let project = format!("{}/{}", job.owner_name, job.repository_name);
    let (git_ref, tag) = ref_name(&job.job_workflow_ref);
    let started = (status != JobStatus::Queued)
        .then(|| job.runner_assign_time.map(timestamp))
        .flatten();
    let completed = (status == JobStatus::Completed)
        .then(|| job.finish_time.or(Some(ctx.received)).map(timestamp))
        .flatten();
    let with_runner = matches!(status, JobStatus::InProgress | JobStatus::Completed);
    Some(Event {
        id: id.clone(),
        occurred_at: Some(timestamp(at)),
        received_at: Some(timestamp(ctx.received)),
        source: Some(Source {
            forge: Forge::Github as i32,
            instance: ctx.instance.to_owned(),
            delivery_id: format!("{}:{message_id}", ctx.scale_set_id),
            hook_id: String::new(),
            producer: PRODUCER.into(),
        }),
        body: Some(Body::JobObserved(JobObserved {
            job: Some(JobKey {
                forge: Forge::Github as i32,
                instance: ctx.instance.to_owned(),
                job_id: twin.map_or_else(|| job_id_of(&job.job_id), |t| t.job_id),
            }),
            project,
            pipeline_id: u64::try_from(job.workflow_run_id).unwrap_or(0),
            run_attempt: twin.map_or(1, |t| t.run_attempt),
            name: job.job_display_name.clone(),
            workflow_name: match twin {
                Some(t) if !t.workflow_name.is_empty() => t.workflow_name.clone(),
                _ => workflow_path(&job.job_workflow_ref, &job.owner_name, &job.repository_name),
            },
            labels: job.request_labels.clone(),
            status: status as i32,
            forge_status: forge_status(job),
            conclusion: if status == JobStatus::Completed {
                conclusion(&job.result) as i32
            } else {
                Conclusion::Unspecified as i32
            },
            runner_id: job
                .runner_id
                .filter(|_| with_runner)
                .and_then(|r| u64::try_from(r).ok()),
            runner_name: if with_runner {
                job.runner_name.clone()
            } else {
                String::new()
            },
            r#ref: git_ref,
            tag,
            created_at: job.queue_time.map(timestamp),
            started_at: started,
            completed_at: completed,
            organization: job.owner_name.clone(),
            scale_set_pool: ctx.pool.to_owned(),
            scale_set_job_id: job.job_id.clone(),
            ..Default::default()
        })),
    })
}

/// The statistics as the log keeps them.
pub fn statistics(s: &Statistics) -> ScaleSetStatistics {
    ScaleSetStatistics {
        available_jobs: s.total_available_jobs,
        acquired_jobs: s.total_acquired_jobs,
        assigned_jobs: s.total_assigned_jobs,
        running_jobs: s.total_running_jobs,
        registered_runners: s.total_registered_runners,
        busy_runners: s.total_busy_runners,
        idle_runners: s.total_idle_runners,
    }
}

/// The listener's progress event: `session_id` held by `owner`, messages
/// up to `last_message_id` in the log. Its id is unique per (session,
/// message), so each is kept.
pub fn progress(
    ctx: &Context<'_>,
    session_id: &str,
    owner: &str,
    last_message_id: i64,
    stats: &Statistics,
) -> Event {
    let id = format!(
        "scaleset:{}:{}:{session_id}:{last_message_id}",
        ctx.pool, ctx.scale_set_id
    );
    Event {
        id,
        occurred_at: Some(timestamp(ctx.received)),
        received_at: Some(timestamp(ctx.received)),
        source: Some(Source {
            forge: Forge::Github as i32,
            instance: ctx.instance.to_owned(),
            delivery_id: String::new(),
            hook_id: String::new(),
            producer: PRODUCER.into(),
        }),
        body: Some(Body::ScaleSetProgress(ScaleSetProgress {
            pool: ctx.pool.to_owned(),
            scale_set_id: ctx.scale_set_id,
            session_id: session_id.to_owned(),
            owner: owner.to_owned(),
            last_message_id,
            statistics: Some(statistics(stats)),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::tests_support::job;

    fn ctx() -> Context<'static> {
        Context {
            pool: "big",
            instance: "github.com",
            scale_set_id: 3,
            received: OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        }
    }

    fn observed(e: &Event) -> &JobObserved {
        match &e.body {
            Some(Body::JobObserved(j)) => j,
            other => panic!("not a job: {other:?}"),
        }
    }

    #[test]
    fn messages_become_statuses_with_stable_ids() {
        let message = ScaleSetMessage {
            message_id: 100_000_171,
            message_type: "RunnerScaleSetJobMessages".into(),
            jobs: vec![
                job(JobMessageKind::Available, ""),
                job(JobMessageKind::Assigned, ""),
                job(JobMessageKind::Started, "ry-big-0123456789"),
                job(JobMessageKind::Completed, "ry-big-0123456789"),
                job(JobMessageKind::Completed, ""),
            ],
            statistics: Statistics::default(),
        };
        let evs = events(&ctx(), &message, &HashMap::new());
        let statuses: Vec<JobStatus> = evs.iter().map(|e| observed(e).status()).collect();
        assert_eq!(
            statuses,
            [
                JobStatus::Queued,
                JobStatus::InProgress,
                JobStatus::Completed,
                JobStatus::Waiting
            ]
        );
        assert_eq!(evs[0].id, "github:scaleset:3:100000171:1");
        let j = observed(&evs[2]);
        assert_eq!(j.conclusion(), Conclusion::Success);
        assert_eq!(j.runner_name, "ry-big-0123456789");
        assert_eq!(j.project, "acme/app");
        assert_eq!(j.workflow_name, ".github/workflows/ci.yml");
        assert_eq!(j.r#ref, "main");
        assert_eq!(j.scale_set_pool, "big");
        assert!(observed(&evs[0]).runner_name.is_empty());
        // One job, one id, whatever the message.
        let ids: std::collections::HashSet<u64> = evs
            .iter()
            .map(|e| observed(e).job.as_ref().map_or(0, |k| k.job_id))
            .collect();
        assert_eq!(ids.len(), 1);
        let nanos = |e: &Event| e.occurred_at.as_ref().map(|t| (t.seconds, t.nanos));
        assert!(evs.windows(2).all(|w| nanos(&w[0]) < nanos(&w[1])));
        assert_eq!(
            events(&ctx(), &message, &HashMap::new()),
            evs,
            "a redelivery makes the same events"
        );
    }

    #[test]
    fn job_ids_keep_numbers_and_hash_the_rest_apart() {
        assert_eq!(job_id_of("51725241954"), 51_725_241_954);
        let a = job_id_of("8d2f6c1e-0000-4000-8000-000000000001");
        let b = job_id_of("8d2f6c1e-0000-4000-8000-000000000002");
        assert_ne!(a, b);
        assert!(a >= 1 << 62 && b >= 1 << 62);
        assert_eq!(a, job_id_of("8d2f6c1e-0000-4000-8000-000000000001"));
    }

    #[test]
    fn workflow_paths_and_refs() {
        assert_eq!(
            workflow_path(
                "acme/app/.github/workflows/ci.yml@refs/heads/main",
                "acme",
                "app"
            ),
            ".github/workflows/ci.yml"
        );
        assert_eq!(
            workflow_path("acme/shared/.github/workflows/build.yml@v1", "acme", "app"),
            "acme/shared/.github/workflows/build.yml"
        );
        assert_eq!(
            ref_name("a/b/.github/workflows/x.yml@refs/tags/v1.2"),
            ("v1.2".into(), true)
        );
    }
}

#[cfg(test)]
mod order {
    use super::*;
    use crate::core::world::{Phase, World};
    use runyard_events::{RunnerOnline, RunnerRef, RunnerRequested};

    fn runner_event(id: &str, body: Body) -> Event {
        Event {
            id: id.into(),
            occurred_at: Some(timestamp(
                OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1),
            )),
            body: Some(body),
            ..Default::default()
        }
    }

    #[test]
    fn a_completion_before_the_start_leaves_the_runner_done() {
        let rref = RunnerRef {
            pool: "big".into(),
            name: "ry-big-0123456789".into(),
            ..Default::default()
        };
        let mut world = World::default();
        let now = Duration::from_secs(1_800_000_100);
        let backoff = |_| Duration::from_secs(1);
        world.apply(
            &runner_event(
                "r1",
                Body::RunnerRequested(RunnerRequested {
                    runner: Some(rref.clone()),
                    ..Default::default()
                }),
            ),
            now,
            backoff,
        );
        world.apply(
            &runner_event(
                "r2",
                Body::RunnerOnline(RunnerOnline {
                    runner: Some(rref.clone()),
                    source: "forge_list".into(),
                }),
            ),
            now,
            backoff,
        );
        let ctx = |s: u64| Context {
            pool: "big",
            instance: "github.com",
            scale_set_id: 3,
            received: OffsetDateTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + s),
        };
        let message = |id: i64, kind: JobMessageKind| ScaleSetMessage {
            message_id: id,
            message_type: "RunnerScaleSetJobMessages".into(),
            jobs: vec![super::tests_support::job(kind, &rref.name)],
            statistics: Statistics::default(),
        };
        // The completion's message is handled before the start's.
        for e in events(
            &ctx(2),
            &message(2, JobMessageKind::Completed),
            &HashMap::new(),
        ) {
            world.apply(&e, now, backoff);
        }
        for e in events(
            &ctx(3),
            &message(1, JobMessageKind::Started),
            &HashMap::new(),
        ) {
            world.apply(&e, now, backoff);
        }
        let runner = &world.runners[&rref.name];
        assert_eq!(runner.phase, Phase::Assigned);
        assert!(
            runner.busy_with.is_empty(),
            "the start of a completed job does not make it busy again"
        );
        assert!(world.runner_done(runner));
    }
}

#[cfg(test)]
mod tests_support {
    use super::*;

    /// A job message of `kind` on `runner`.
    pub fn job(kind: JobMessageKind, runner: &str) -> JobMessage {
        JobMessage {
            kind,
            runner_request_id: 4711,
            job_id: "8d2f6c1e-0000-4000-8000-000000000001".into(),
            repository_name: "app".into(),
            owner_name: "acme".into(),
            job_workflow_ref: "acme/app/.github/workflows/ci.yml@refs/heads/main".into(),
            job_display_name: "build (linux, 3.11)".into(),
            workflow_run_id: 99,
            event_name: "push".into(),
            request_labels: vec!["big".into()],
            queue_time: None,
            scale_set_assign_time: None,
            runner_assign_time: None,
            finish_time: None,
            runner_id: (!runner.is_empty()).then_some(7),
            runner_name: runner.into(),
            result: if runner.is_empty() {
                "canceled".into()
            } else {
                "succeeded".into()
            },
        }
    }
}
