//! Synthetic but realistic events for tests and benchmarks: a job's
//! lifecycle as GitHub reports it, and its usage report; [`month`] makes a
//! busy site's whole month of them.

pub mod month;

use std::collections::HashMap;

use runyard_events::{
    Body, Conclusion, Event, Forge, JobKey, JobObserved, JobStatus, Recommended, RunnerAssigned,
    RunnerCreated, RunnerDeleted, RunnerOnline, RunnerRef, RunnerRequested, Source, UsageReported,
    ids, timestamp,
};
use time::{Duration, OffsetDateTime};

/// The instance synthetic jobs live on.
pub const INSTANCE: &str = "github.com";

fn envelope(id: String, occurred: OffsetDateTime, delivery: &str, body: Body) -> Event {
    Event {
        id,
        occurred_at: Some(timestamp(occurred)),
        received_at: Some(timestamp(occurred + Duration::milliseconds(150))),
        source: Some(Source {
            forge: Forge::Github as i32,
            instance: INSTANCE.into(),
            delivery_id: delivery.into(),
            hook_id: "1".into(),
            producer: "synth".into(),
        }),
        body: Some(body),
    }
}

/// [`job_event`] as the forge said it (`word`: `waiting`, GitLab `created`,
/// ...), received `secs` after [`base_time`]: for ordering tests, where
/// when an observation was made is what counts.
pub fn observation(job_id: u64, status: JobStatus, word: &str, secs: i64) -> Event {
    let mut e = job_event(job_id, status, base_time());
    e.id = format!("synth-{job_id}-{word}-{secs}");
    e.received_at = Some(timestamp(base_time() + Duration::seconds(secs)));
    if let Some(Body::JobObserved(j)) = e.body.as_mut() {
        j.forge_status = word.into();
    }
    e
}

/// One `JobObserved` of job `job_id` in `status`, as GitHub would report it
/// for a job created at `created`.
pub fn job_event(job_id: u64, status: JobStatus, created: OffsetDateTime) -> Event {
    let started = created + Duration::seconds(20 + (job_id % 40) as i64);
    let completed = started + Duration::seconds(60 + (job_id % 600) as i64);
    let (occurred, word) = match status {
        JobStatus::Queued | JobStatus::Unspecified => (created, "queued"),
        JobStatus::Waiting => (created + Duration::seconds(5), "waiting"),
        JobStatus::InProgress => (started, "in_progress"),
        JobStatus::Completed => (completed, "completed"),
    };
    let running = matches!(status, JobStatus::InProgress | JobStatus::Completed);
    let done = status == JobStatus::Completed;
    let delivery = format!("synth-{job_id}-{word}");
    let body = Body::JobObserved(JobObserved {
        job: Some(JobKey {
            forge: Forge::Github as i32,
            instance: INSTANCE.into(),
            job_id,
        }),
        project: format!("acme/repo-{}", job_id % 17),
        project_id: 1000 + job_id % 17,
        pipeline_id: 900_000 + job_id / 4,
        run_attempt: 1,
        name: format!("build ({})", job_id % 5),
        workflow_name: "CI".into(),
        labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
        status: status as i32,
        forge_status: word.into(),
        conclusion: if done {
            if job_id.is_multiple_of(7) {
                Conclusion::Failure as i32
            } else {
                Conclusion::Success as i32
            }
        } else {
            Conclusion::Unspecified as i32
        },
        runner_id: running.then_some(50 + job_id % 9),
        runner_name: if running {
            format!("runner-{}", job_id % 9)
        } else {
            String::new()
        },
        r#ref: "main".into(),
        sha: format!("{:040x}", job_id),
        created_at: Some(timestamp(created)),
        started_at: running.then(|| timestamp(started)),
        completed_at: done.then(|| timestamp(completed)),
        duration_seconds: done.then(|| (completed - started).as_seconds_f64()),
        html_url: format!("https://github.com/acme/repo/actions/runs/1/job/{job_id}"),
        organization: "acme".into(),
        ..Default::default()
    });
    envelope(ids::github(&delivery), occurred, &delivery, body)
}

/// The usage report of job `job_id`'s first attempt.
pub fn usage_event(job_id: u64, created: OffsetDateTime) -> Event {
    let workload: HashMap<String, String> = [
        ("package", format!("pkg-{}", job_id % 50)),
        ("version", "1.0".to_owned()),
        ("variants", "+shared~debug".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let id = ids::usage(Forge::Github, INSTANCE, job_id, 1);
    let body = Body::UsageReported(UsageReported {
        job: Some(JobKey {
            forge: Forge::Github as i32,
            instance: INSTANCE.into(),
            job_id,
        }),
        attempt: 1,
        r#ref: "main".into(),
        workload,
        peak_memory_bytes: 500_000_000 + (job_id % 97) * 10_000_000,
        memory_request_bytes: Some(1_000_000_000),
        memory_limit_bytes: Some(2_000_000_000),
        cpu_seconds: 120.5,
        wall_seconds: 60.25,
        cpu_request_millicores: Some(2000),
        oom_killed: job_id.is_multiple_of(31),
        exit_code: Some(0),
        project: format!("acme/repo-{}", job_id % 17),
        cgroup: "v2".into(),
        identity: None,
    });
    envelope(id.clone(), created + Duration::seconds(900), &id, body)
}

/// [`usage_event`] with a Spack workload spread over `workloads` of them
/// with a package repository's skew ([`month::skewed_workload`]: a few
/// built very often, a long tail built once or twice) instead of
/// `pkg-{job_id % 50}`.
pub fn usage_event_spread(job_id: u64, created: OffsetDateTime, workloads: usize) -> Event {
    let mut e = usage_event(job_id, created);
    if let Some(Body::UsageReported(u)) = e.body.as_mut() {
        let k = month::skewed_workload(job_id, workloads);
        u.workload = month::spack_workload(k, workloads).into_iter().collect();
    }
    e
}

/// The runner the scaler made for job `job_id` in `pool`: its name.
pub fn runner_name(pool: &str, job_id: u64) -> String {
    format!(
        "ry-{pool}-{:010x}",
        job_id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 24
    )
}

/// The runner events of job `job_id` (created at `created`) in `pool`, as
/// the scaler publishes them: requested (sized from the allocator's
/// answer), created, online, assigned, deleted once the job completed.
pub fn runner_events(job_id: u64, pool: &str, created: OffsetDateTime) -> Vec<Event> {
    let name = runner_name(pool, job_id);
    let runner = || {
        Some(RunnerRef {
            pool: pool.into(),
            name: name.clone(),
            pool_id: format!("pool-{pool}"),
            provider: "synth".into(),
            forge: Forge::Github as i32,
            instance: INSTANCE.into(),
        })
    };
    let job = || {
        Some(JobKey {
            forge: Forge::Github as i32,
            instance: INSTANCE.into(),
            job_id,
        })
    };
    let started = created + Duration::seconds(20 + (job_id % 40) as i64);
    let completed = started + Duration::seconds(60 + (job_id % 600) as i64);
    let limit = 2_000_000_000 + (job_id % 7) * 1_000_000_000;
    let at = |event: Body, t: OffsetDateTime| {
        let id = runyard_events::runner_event_id_for(&event).unwrap_or_default();
        let mut e = envelope(id.clone(), t, &id, event);
        if let Some(s) = e.source.as_mut() {
            s.producer = "scaler".into();
        }
        e
    };
    vec![
        at(
            Body::RunnerRequested(RunnerRequested {
                runner: runner(),
                job: job(),
                run_attempt: 1,
                claim_key: format!("github.github_com.{job_id}.1"),
                reason: "queued_job".into(),
                flavor: if limit > 4_000_000_000 {
                    "large"
                } else {
                    "small"
                }
                .into(),
                memory_bytes: if limit > 4_000_000_000 {
                    16 << 30
                } else {
                    4 << 30
                },
                cpus: 4,
                recommended_memory_limit_bytes: Some(limit),
                recommendation: Some(Recommended {
                    memory_limit_bytes: limit,
                    memory_request_bytes: limit / 2,
                    statistic: "lognormal-q0.970".into(),
                    samples: 5,
                    workload_samples: 5,
                    oom_probability: 0.03,
                    ..Recommended::default()
                }),
                labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
                ..RunnerRequested::default()
            }),
            created + Duration::milliseconds(300),
        ),
        at(
            Body::RunnerCreated(RunnerCreated {
                runner: runner(),
                provider_id: format!("i-{job_id}"),
                forge_runner_id: Some(job_id),
                attempt: 1,
                status: "running".into(),
            }),
            created + Duration::seconds(5),
        ),
        at(
            Body::RunnerOnline(RunnerOnline {
                runner: runner(),
                source: "callback".into(),
            }),
            created + Duration::seconds(15),
        ),
        at(
            Body::RunnerAssigned(RunnerAssigned {
                runner: runner(),
                job: job(),
            }),
            // The runner takes the job, then the forge says it runs.
            started - Duration::seconds(1),
        ),
        at(
            Body::RunnerDeleted(RunnerDeleted {
                runner: runner(),
                reason: "job_completed".into(),
            }),
            completed + Duration::seconds(3),
        ),
    ]
}

/// A job's whole story: queued, in progress, completed and its usage.
pub fn lifecycle(job_id: u64, created: OffsetDateTime) -> Vec<Event> {
    vec![
        job_event(job_id, JobStatus::Queued, created),
        job_event(job_id, JobStatus::InProgress, created),
        job_event(job_id, JobStatus::Completed, created),
        usage_event(job_id, created),
    ]
}

/// A fixed base time, so runs are reproducible.
pub fn base_time() -> OffsetDateTime {
    time::macros::datetime!(2026-11-01 12:00:00 UTC)
}
