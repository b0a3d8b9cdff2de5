//! OOM-killed jobs come back with more memory: the whole loop, with every
//! service as a real process (see `retry.rs`).

use std::collections::BTreeMap;

use runyard_events::Body;
use runyard_testkit::eventually;
use runyard_testkit::fake_actions::FakeScaleSetJob;
use serde_json::json;

use crate::retry::{Stack, WAIT, kind};

/// Short timers; no pools needed for GitLab pipeline retries.
const GITLAB_ONLY: &str = r#"
[retry]
wait_for_report = "3s"
poll_interval = "200ms"

[scaler]
lease_ttl = "2s"
tick = "100ms"
forge_timeout = "2s"
"#;

fn spack() -> BTreeMap<String, String> {
    [
        ("package", "py-torch"),
        ("version", "2.3.1"),
        ("compiler", "gcc"),
        ("compiler_version", "12.3.0"),
        ("variants", "+cuda~rocm"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// A usage report of GitLab job `job_id` for the Spack workload.
fn report(job_id: u64, peak: u64, limit: u64, oom: bool) -> serde_json::Value {
    json!({
        "forge": "gitlab", "instance": "gitlab.example.com", "job_id": job_id,
        "attempt": 1, "ref": "develop", "workload": spack(),
        "peak_memory_bytes": peak, "memory_limit_bytes": limit,
        "memory_request_bytes": limit / 2,
        "cpu_seconds": 100.0, "wall_seconds": 60.0,
        "oom_killed": oom, "exit_code": if oom { 137 } else { 0 },
        "cgroup": "v1",
    })
}

/// POSTs of a new pipeline the fake GitLab received.
fn pipeline_posts(stack: &Stack) -> Vec<(u64, String)> {
    stack
        .gitlab
        .pipelines()
        .into_iter()
        .filter(|p| p.created_by_api)
        .map(|p| {
            let of = p
                .variables
                .iter()
                .find(|(k, _)| k == "RUNYARD_RETRY_OF")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (p.id, of)
        })
        .collect()
}

async fn wait_for_posts(stack: &Stack, n: usize) -> Vec<(u64, String)> {
    let got = eventually(WAIT, || async {
        let posts = pipeline_posts(stack);
        (posts.len() >= n).then_some(posts)
    })
    .await;
    match got {
        Some(p) => p,
        None => panic!(
            "expected {n} retry pipelines, got {:?}\n--- scaler log ---\n{}",
            pipeline_posts(stack),
            stack.log("scaler")
        ),
    }
}

/// Kills `job_id` of `pipeline_id` at `limit`: the hook and the report, each
/// delivered three times, in the order given.
async fn kill(stack: &Stack, pipeline_id: u64, job_id: u64, limit: u64, report_first: bool) {
    for _ in 0..3 {
        if report_first {
            stack.usage(&report(job_id, limit, limit, true)).await;
            stack
                .gitlab_pipeline(
                    pipeline_id,
                    "failed",
                    &[(job_id, "failed", Some("script_failure"))],
                )
                .await;
        } else {
            stack
                .gitlab_pipeline(
                    pipeline_id,
                    "failed",
                    &[(job_id, "failed", Some("script_failure"))],
                )
                .await;
            stack.usage(&report(job_id, limit, limit, true)).await;
        }
    }
}

#[tokio::test]
async fn gitlab_oom_kills_get_one_new_pipeline_each_with_more_memory_until_the_limit() {
    let stack = Stack::start(GITLAB_ONLY).await;
    let workload = spack();
    // History: three good builds around 1 GB, on `develop` as their
    // pipelines' hooks confirm (a report trains only then).
    for (i, peak) in [900_000_000u64, 1_000_000_000, 950_000_000]
        .into_iter()
        .enumerate()
    {
        let job = 9000 + i as u64;
        stack
            .gitlab_pipeline(8000 + i as u64, "success", &[(job, "success", None)])
            .await;
        stack.usage(&report(job, peak, 4_000_000_000, false)).await;
    }
    let first = eventually(WAIT, || async {
        let r = stack.recommend(&workload, "develop").await;
        (r.basis.as_ref().is_some_and(|b| b.samples >= 3)).then_some(r)
    })
    .await
    .expect("the allocator learned the history");
    assert_eq!(first.retry_count, 0);

    // Kills 1..=3: one new pipeline each, for the failed one, with a limit
    // that grows by at least 20% each time. Between each kill and its
    // retry another pipeline builds the same spec and passes at the same
    // limit: the retry's generate step, naming the pipeline it retries
    // (`$RUNYARD_RETRY_OF`), is bumped all the same, and a build that is no
    // retry is not.
    let mut limit = first.memory_limit_bytes;
    let mut pipeline = 1234u64;
    for n in 1..=3u32 {
        let job = 4700 + u64::from(n);
        kill(&stack, pipeline, job, limit, n % 2 == 0).await;
        let other = 5700 + u64::from(n);
        stack
            .gitlab_pipeline(6700 + u64::from(n), "success", &[(other, "success", None)])
            .await;
        stack
            .usage(&report(other, limit * 9 / 10, limit, false))
            .await;
        let posts = wait_for_posts(&stack, n as usize).await;
        let (new_pipeline, retry_of) = posts.last().cloned().expect("a post");
        assert_eq!(
            retry_of,
            pipeline.to_string(),
            "RUNYARD_RETRY_OF names the failed pipeline"
        );
        let asked = runyard_allocator::proto::JobAttempt {
            forge: "gitlab".into(),
            instance: "gitlab.example.com".into(),
            pipeline_id: retry_of.parse().expect("a pipeline id"),
            ..Default::default()
        };
        let bumped = eventually(WAIT, || async {
            let r = stack
                .recommend_retry(&workload, "develop", Some(asked.clone()))
                .await;
            (r.retry_count == n).then_some(r)
        })
        .await
        .unwrap_or_else(|| panic!("retry_count never reached {n}"));
        assert!(
            bumped.memory_limit_bytes as f64 >= limit as f64 * 1.2,
            "kill {n}: limit {} after {limit}",
            bumped.memory_limit_bytes
        );
        assert!(bumped.basis.as_ref().is_some_and(|b| b.oom_bump));
        let fresh = stack.recommend(&workload, "develop").await;
        assert!(
            fresh.retry_count == 0 && fresh.memory_limit_bytes < bumped.memory_limit_bytes,
            "kill {n}: a build that is no retry got {fresh:?}"
        );
        limit = bumped.memory_limit_bytes;
        pipeline = new_pipeline;
    }
    // Kill 4: refused, no pipeline.
    kill(&stack, pipeline, 4704, limit, false).await;
    let refused = eventually(WAIT, || async {
        let events = stack.retry_events().await;
        events.iter().find_map(|e| match &e.body {
            Some(Body::RetryRefused(r)) if r.reason == "limit_reached" => Some(r.clone()),
            _ => None,
        })
    })
    .await
    .expect("the fourth kill is refused");
    assert_eq!(refused.jobs.len(), 1);
    // The passing builds in between broke the workload's streak: the
    // retries' lineage is what bounds them.
    assert_eq!(refused.jobs[0].oom_streak, 1);
    stack.settled().await;
    assert_eq!(pipeline_posts(&stack).len(), 3, "never a fourth pipeline");

    // Each failed pipeline: exactly one request and one issue on the log,
    // whatever the duplicates; both shas recorded.
    let events = stack.retry_events().await;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", kind(e), e.id))
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| k.starts_with("issued ")).count(),
        3,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| k.starts_with("requested ")).count(),
        3
    );
    for e in &events {
        if let Some(Body::RetryIssued(i)) = &e.body {
            let t = i.target.as_ref().expect("target");
            assert!(!t.sha.is_empty() && !i.new_sha.is_empty(), "{i:?}");
            assert!(i.new_pipeline_id > 0);
            assert_eq!(i.strategy, "pipeline");
        }
    }

    // The job-tracker projected every decision into `retries`.
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&stack.db.url)
        .await
        .expect("database");
    let rows = eventually(WAIT, || async {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT kind, count(*) FROM retries GROUP BY kind ORDER BY kind")
                .fetch_all(&db)
                .await
                .ok()?;
        (rows.iter().map(|(_, n)| n).sum::<i64>() >= 7).then_some(rows)
    })
    .await
    .expect("retries projected");
    assert_eq!(
        rows,
        [
            ("issued".to_owned(), 3),
            ("refused".to_owned(), 1),
            ("requested".to_owned(), 3)
        ]
    );
    db.close().await;

    // A success ends the streak: the bump stops.
    stack
        .usage(&report(4800, 1_000_000_000, limit, false))
        .await;
    let after = eventually(WAIT, || async {
        let r = stack.recommend(&workload, "develop").await;
        (r.retry_count == 0).then_some(r)
    })
    .await
    .expect("a success resets retry_count");
    assert!(
        !after
            .basis
            .as_ref()
            .is_some_and(|b| b.oom_bump || b.retries_exhausted)
    );
    stack.stop().await;
}

#[tokio::test]
async fn five_kills_of_a_gitlab_job_that_names_no_workload_make_three_pipelines() {
    let stack = Stack::start(GITLAB_ONLY).await;
    // Each retry is a new pipeline with a new job id; the reports name no
    // workload (odd rounds) or another one each time (even rounds).
    let mut pipeline = 1234u64;
    for n in 1..=5u64 {
        let job = 4700 + n;
        let mut r = report(job, 2_000_000_000, 2_000_000_000, true);
        if n % 2 == 1 {
            r.as_object_mut().expect("object").remove("workload");
        } else {
            r["workload"] = json!({"package": format!("pkg-{n}")});
        }
        stack
            .gitlab_pipeline(
                pipeline,
                "failed",
                &[(job, "failed", Some("script_failure"))],
            )
            .await;
        stack.usage(&r).await;
        let decided = eventually(WAIT, || async {
            let posts = pipeline_posts(&stack);
            if posts.len() >= n as usize {
                return Some(posts.last().map(|p| p.0));
            }
            let refused = stack.retry_events().await.iter().any(|e| {
                matches!(&e.body, Some(Body::RetryRefused(r))
                    if r.jobs.iter().any(|j| j.job.as_ref().is_some_and(|k| k.job_id == job)))
            });
            refused.then_some(None)
        })
        .await
        .unwrap_or_else(|| panic!("kill {n} decided\n{}", stack.log("scaler")));
        if let Some(new) = decided {
            pipeline = new;
        }
    }
    stack.settled().await;
    assert_eq!(pipeline_posts(&stack).len(), 3, "three retries, not five");
    let refusals: Vec<String> = stack
        .retry_events()
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            Some(Body::RetryRefused(r)) => Some(format!("{} {}", r.reason, r.detail)),
            _ => None,
        })
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(
        refusals
            .iter()
            .all(|r| r.starts_with("limit_reached") && r.contains("retry lineage")),
        "{refusals:?}"
    );
    stack.stop().await;
}

#[tokio::test]
async fn failures_that_are_not_oom_kills_are_refused_with_the_reason_and_never_retried() {
    let stack = Stack::start(GITLAB_ONLY).await;
    // Exit 1, a timeout, and one whose report never comes.
    stack
        .gitlab_pipeline(
            2001,
            "failed",
            &[
                (5001, "failed", Some("script_failure")),
                (5002, "failed", Some("job_execution_timeout")),
                (5003, "failed", Some("script_failure")),
            ],
        )
        .await;
    let mut exit1 = report(5001, 500_000_000, 4_000_000_000, false);
    exit1["exit_code"] = json!(1);
    stack.usage(&exit1).await;
    // The timed-out job's report says OOM-killed: the timeout still decides.
    stack
        .usage(&report(5002, 4_000_000_000, 4_000_000_000, true))
        .await;
    let refused = eventually(WAIT, || async {
        let events = stack.retry_events().await;
        let mut reasons: Vec<(u64, String)> = events
            .iter()
            .filter_map(|e| match &e.body {
                Some(Body::RetryRefused(r)) => Some((
                    r.jobs
                        .first()
                        .and_then(|j| j.job.as_ref())
                        .map_or(0, |k| k.job_id),
                    r.reason.clone(),
                )),
                _ => None,
            })
            .collect();
        reasons.sort();
        (reasons.len() >= 3).then_some(reasons)
    })
    .await
    .unwrap_or_else(|| panic!("three refusals\n{}", stack.log("scaler")));
    assert_eq!(
        refused,
        [
            (5001, "not_oom".to_owned()),
            (5002, "not_oom".to_owned()),
            (5003, "no_usage_report".to_owned()),
        ]
    );
    assert!(pipeline_posts(&stack).is_empty());
    assert!(stack.gitlab.retries().is_empty());
    stack.stop().await;
}

/// A GitHub pool of two flavors, short timers.
const GITHUB_POOL: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "60"]

[[pools]]
name = "linux"
forge = "github"
scope = { org = "acme" }
labels = ["self-hosted", "linux", "x64"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }, { name = "large", memory = "16GiB", cpus = 8 }]
max_runners = 5
bootstrap_timeout = "60s"

[retry]
wait_for_report = "5s"
poll_interval = "200ms"

[scaler]
lease_ttl = "2s"
tick = "100ms"
sync_interval = "1s"
forge_timeout = "2s"
allocator_timeout = "2s"
"#;

const GIB: u64 = 1 << 30;

fn gh_report(
    job_id: u64,
    attempt: u32,
    name: &str,
    peak: u64,
    limit: u64,
    exit: i32,
) -> serde_json::Value {
    json!({
        "forge": "github", "instance": "github.com", "job_id": job_id,
        "attempt": attempt, "ref": "main",
        "workload": {"repo": "acme/app", "workflow": "CI", "job": name},
        "peak_memory_bytes": peak, "memory_limit_bytes": limit,
        "cpu_seconds": 100.0, "wall_seconds": 60.0,
        "oom_killed": exit == 137, "exit_code": exit, "cgroup": "v2",
    })
}

fn gh_job(
    id: u64,
    attempt: u32,
    name: &str,
    status: &str,
    conclusion: Option<&str>,
) -> serde_json::Value {
    json!({
        "id": id, "run_id": 777, "run_attempt": attempt, "name": name,
        "workflow_name": "CI", "head_branch": "main",
        "labels": ["self-hosted", "linux", "x64"],
        "status": status, "conclusion": conclusion,
        "runner_id": null, "runner_name": null,
    })
}

#[tokio::test]
async fn github_reruns_only_the_oom_killed_job_once_the_run_completed_on_a_larger_runner() {
    let stack = Stack::start(GITHUB_POOL).await;
    let build = "build (x64)";
    let workload: BTreeMap<String, String> =
        [("repo", "acme/app"), ("workflow", "CI"), ("job", build)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    for (i, peak) in [900_000_000u64, 1_000_000_000, 950_000_000]
        .into_iter()
        .enumerate()
    {
        // The webhook names the job by its display name; the report, as
        // runyard-report's GitHub default does, by its YAML key
        // (`GITHUB_JOB`): samples are keyed from the webhook.
        let id = 70_001 + i as u64;
        let mut done = gh_job(id, 1, build, "completed", Some("success"));
        done["run_id"] = json!(600 + i);
        stack
            .github_job(&done, "completed", &format!("d-hist-{i}"))
            .await;
        stack
            .usage(&gh_report(id, 1, "build", peak, 4 * GIB, 0))
            .await;
    }
    eventually(WAIT, || async {
        let r = stack.recommend(&workload, "main").await;
        (r.basis.as_ref().is_some_and(|b| b.samples >= 3)).then_some(())
    })
    .await
    .expect("the allocator learned the history");

    // Run 777: the build (OOM-killed later), a lint job (fails on its own)
    // and a docs job still running.
    let gh = &stack.github;
    let fake = |name: &str| {
        let mut j = runyard_testkit::fake_github::FakeJob::queued(
            777,
            name,
            &["self-hosted", "linux", "x64"],
        );
        j.workflow_name = "CI".into();
        gh.add_job("acme", "app", j)
    };
    let (j, k, l) = (fake(build), fake("lint"), fake("docs"));
    stack
        .github_job(&gh_job(j, 1, build, "queued", None), "queued", "d-j-queued")
        .await;
    let first = eventually(WAIT, || async {
        stack.runner_requests().await.into_iter().find(|r| r.0 == j)
    })
    .await
    .unwrap_or_else(|| panic!("a runner for the build\n{}", stack.log("scaler")));
    assert_eq!(first.2, "small", "sized from a ~1 GB history");

    gh.set_job_status(l, "in_progress", None);
    gh.set_job_status(j, "completed", Some("failure"));
    gh.set_job_status(k, "completed", Some("failure"));
    stack
        .github_job(
            &gh_job(j, 1, build, "completed", Some("failure")),
            "completed",
            "d-j-done",
        )
        .await;
    stack
        .github_job(
            &gh_job(k, 1, "lint", "completed", Some("failure")),
            "completed",
            "d-k-done",
        )
        .await;
    stack
        .usage(&gh_report(j, 1, "build", 4 * GIB, 4 * GIB, 137))
        .await;
    stack
        .usage(&gh_report(k, 1, "lint", 100_000_000, 4 * GIB, 1))
        .await;

    // Another run builds the same job and passes at the same limit: the
    // workload's streak is over, and a build that is no retry is sized
    // from the history, yet the killed job's re-run is still its retry.
    let mut other = gh_job(70_100, 1, build, "completed", Some("success"));
    other["run_id"] = json!(778);
    stack.github_job(&other, "completed", "d-other-done").await;
    stack
        .usage(&gh_report(70_100, 1, "build", 1_000_000_000, 4 * GIB, 0))
        .await;
    let fresh = eventually(WAIT, || async {
        let r = stack.recommend(&workload, "main").await;
        (r.basis.as_ref().is_some_and(|b| b.samples >= 4)).then_some(r)
    })
    .await
    .expect("the allocator saw the passing build");
    assert!(
        fresh.retry_count == 0 && !fresh.basis.as_ref().is_some_and(|b| b.oom_bump),
        "{fresh:?}"
    );

    // GitHub queues the re-run as a new job of attempt 2: its runner is
    // the larger flavor, covering the bumped limit.
    let rerun = rerun_once_the_run_completed(&stack, l, j, build).await;
    stack
        .github_job(
            &gh_job(rerun, 2, build, "queued", None),
            "queued",
            "d-rerun-queued",
        )
        .await;
    let second = eventually(WAIT, || async {
        stack
            .runner_requests()
            .await
            .into_iter()
            .find(|r| r.0 == rerun)
    })
    .await
    .unwrap_or_else(|| panic!("a runner for the re-run\n{}", stack.log("scaler")));
    assert_eq!((second.1, second.2.as_str()), (2, "large"));

    let events = stack.retry_events().await;
    let kinds: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", kind(e), e.id))
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| k.starts_with("issued ")).count(),
        1,
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|k| k.starts_with("refused:not_oom ")),
        "{kinds:?}"
    );
    let issued = events.iter().find_map(|e| match &e.body {
        Some(Body::RetryIssued(i)) => Some(i.clone()),
        _ => None,
    });
    let issued = issued.expect("issued");
    assert_eq!(
        (issued.strategy.as_str(), issued.new_run_attempt),
        ("rerun_job", 2)
    );
    stack.stop().await;
}

#[tokio::test]
async fn gitlab_errors_are_retried_without_ever_making_two_pipelines() {
    let stack = Stack::start(GITLAB_ONLY).await;
    let issued = |pipeline: u64| {
        let stack = &stack;
        async move {
            eventually(WAIT, || async {
                stack
                    .retry_events()
                    .await
                    .into_iter()
                    .find_map(|e| match e.body {
                        Some(Body::RetryIssued(i))
                            if i.target.as_ref().is_some_and(|t| t.pipeline_id == pipeline) =>
                        {
                            Some(i)
                        }
                        _ => None,
                    })
            })
            .await
            .unwrap_or_else(|| panic!("pipeline {pipeline} retried\n{}", stack.log("scaler")))
        }
    };
    // (Pipeline ids below the fake's first, 500: GitLab numbers pipelines in
    // creation order, and the retrier looks only at newer ones.)
    // The answer to the create is lost after GitLab made the pipeline: the
    // retrier finds it (RUNYARD_RETRY_OF) instead of making another.
    stack.gitlab.lose_next_answers(1, 502);
    kill(&stack, 301, 6001, 2_000_000_000, false).await;
    let lost = issued(301).await;
    assert!(lost.adopted, "{lost:?}");
    assert_eq!(lost.errors.len(), 1, "{lost:?}");
    assert_eq!(pipeline_posts(&stack).len(), 1);

    // Two 503s before GitLab takes it: retried with back-off, recorded.
    stack.gitlab.fail_next_with(2, 503);
    kill(&stack, 302, 6002, 2_400_000_000, false).await;
    let flaky = issued(302).await;
    assert!(!flaky.adopted);
    assert_eq!(flaky.errors.len(), 2, "{flaky:?}");
    assert_eq!(pipeline_posts(&stack).len(), 2);

    // A 4xx is an answer: refused, not retried.
    stack.gitlab.fail_next_with(1, 400);
    kill(&stack, 303, 6003, 2_900_000_000, false).await;
    let refused = eventually(WAIT, || async {
        stack
            .retry_events()
            .await
            .into_iter()
            .find_map(|e| match e.body {
                Some(Body::RetryRefused(r)) if r.reason == "forge_rejected" => Some(r),
                _ => None,
            })
    })
    .await
    .expect("a refusal");
    assert_eq!(refused.forge_status, Some(400));
    stack.settled().await;
    assert_eq!(pipeline_posts(&stack).len(), 2);
    stack.stop().await;
}

/// A `RetryRequested` for pipeline `pipeline_id` as a replica that stopped
/// before it recorded the outcome left it, a minute ago.
async fn orphaned_request(stack: &Stack, pipeline_id: u64) {
    use runyard_events::{Event, Forge, JobKey, RetryJob, RetryRequested, RetryTarget, Source};
    let bus = runyard_bus::Bus::connect(&stack.nats.url(), stack.ns.clone(), "test", false)
        .await
        .expect("bus");
    let unit = runyard_events::ids::retry_unit_pipeline(pipeline_id);
    let id = runyard_events::ids::retry(Forge::Gitlab, "gitlab.example.com", &unit, "requested");
    let at =
        runyard_events::timestamp(time::OffsetDateTime::now_utc() - time::Duration::minutes(1));
    let event = Event {
        id: id.clone(),
        occurred_at: Some(at),
        received_at: Some(at),
        source: Some(Source {
            forge: Forge::Gitlab as i32,
            instance: "gitlab.example.com".into(),
            delivery_id: id,
            producer: "scaler".into(),
            ..Source::default()
        }),
        body: Some(Body::RetryRequested(RetryRequested {
            target: Some(RetryTarget {
                forge: Forge::Gitlab as i32,
                instance: "gitlab.example.com".into(),
                project_id: 34,
                project: "ci/spack-packages".into(),
                pipeline_id,
                r#ref: "develop".into(),
                sha: "abc".into(),
                unit,
                ..RetryTarget::default()
            }),
            strategy: "pipeline".into(),
            jobs: vec![RetryJob {
                job: Some(JobKey {
                    forge: Forge::Gitlab as i32,
                    instance: "gitlab.example.com".into(),
                    job_id: pipeline_id * 10,
                }),
                attempt: 1,
                oom_streak: 1,
                ..RetryJob::default()
            }],
        })),
    };
    bus.publish_event(&event, &runyard_bus::TraceParent::new_root())
        .await
        .expect("published");
}

#[tokio::test]
async fn a_retry_left_half_done_by_a_stopped_replica_is_finished_exactly_once() {
    let stack = Stack::start(GITLAB_ONLY).await;
    // Pipeline 401: the stopped replica's POST had landed.
    let landed = reqwest::Client::new()
        .post(format!(
            "{}/api/v4/projects/34/pipeline",
            stack.gitlab.url()
        ))
        .header("private-token", "t")
        .json(
            &json!({"ref": "develop", "variables": [{"key": "RUNYARD_RETRY_OF", "value": "401"}]}),
        )
        .send()
        .await
        .expect("post");
    assert!(landed.status().is_success());
    orphaned_request(&stack, 401).await;
    // Pipeline 402: it had not.
    orphaned_request(&stack, 402).await;
    let issued = eventually(WAIT, || async {
        let mut issued: Vec<(u64, bool)> = stack
            .retry_events()
            .await
            .into_iter()
            .filter_map(|e| match e.body {
                Some(Body::RetryIssued(i)) => {
                    Some((i.target.map_or(0, |t| t.pipeline_id), i.adopted))
                }
                _ => None,
            })
            .collect();
        issued.sort_unstable();
        (issued.len() >= 2).then_some(issued)
    })
    .await
    .unwrap_or_else(|| panic!("both finished\n{}", stack.log("scaler")));
    assert_eq!(issued, [(401, true), (402, false)]);
    stack.settled().await;
    let mut of: Vec<String> = pipeline_posts(&stack)
        .into_iter()
        .map(|(_, of)| of)
        .collect();
    of.sort();
    assert_eq!(of, ["401", "402"], "one pipeline each");
    stack.stop().await;
}

/// The first `RetryIssued` in the log, once there is one.
async fn first_issued(stack: &Stack) -> runyard_events::RetryIssued {
    eventually(WAIT, || async {
        stack
            .retry_events()
            .await
            .iter()
            .find_map(|e| match &e.body {
                Some(Body::RetryIssued(r)) => Some(r.clone()),
                _ => None,
            })
    })
    .await
    .unwrap_or_else(|| panic!("no retry issued\n{}", stack.log("scaler")))
}

/// One good build on `develop` (so the kill is under a known limit), then
/// job 4701 of pipeline 1234 killed at 2 GB: the retry issued for it.
async fn one_build_then_a_kill(stack: &Stack) -> runyard_events::RetryIssued {
    stack
        .gitlab_pipeline(8000, "success", &[(9000, "success", None)])
        .await;
    stack
        .usage(&report(9000, 1_000_000_000, 4_000_000_000, false))
        .await;
    kill(stack, 1234, 4701, 2_000_000_000, false).await;
    first_issued(stack).await
}

#[tokio::test]
async fn a_project_that_refuses_pipeline_variables_gets_its_retry_without_them() {
    let stack = Stack::start(GITLAB_ONLY).await;
    stack.gitlab.refuse_pipeline_variables(34);
    let issued = one_build_then_a_kill(&stack).await;
    let made: Vec<_> = stack
        .gitlab
        .pipelines()
        .into_iter()
        .filter(|p| p.created_by_api)
        .collect();
    assert_eq!(made.len(), 1, "one pipeline, made without variables");
    assert!(made[0].variables.is_empty());
    assert_eq!(
        issued.new_pipeline_id, made[0].id,
        "the log links the retry"
    );
    assert_eq!(
        issued.target.as_ref().map(|t| t.pipeline_id),
        Some(1234),
        "to the failed pipeline"
    );
    assert!(
        issued.note.contains("refused pipeline variables"),
        "{}",
        issued.note
    );
    // Deliveries of the same kill again change nothing.
    kill(&stack, 1234, 4701, 2_000_000_000, true).await;
    stack.settled().await;
    let posts = stack.gitlab.count("POST", "/api/v4/projects/34/pipeline");
    assert_eq!(posts, 2, "one refused with variables, one made without");
    stack.stop().await;
}

#[tokio::test]
async fn a_job_strategy_retry_says_it_cannot_raise_the_job_s_own_memory_limit() {
    let stack =
        Stack::start(&GITLAB_ONLY.replace("[retry]\n", "[retry]\ngitlab_strategy = \"job\"\n"))
            .await;
    stack.gitlab.add_job(
        34,
        runyard_testkit::fake_gitlab::FakeGlJob {
            id: 4701,
            ..runyard_testkit::fake_gitlab::FakeGlJob::pending(1234, "build py-torch", &["docker"])
        },
    );
    stack
        .gitlab
        .set_job_status(4701, "failed", Some("script_failure"));
    let issued = one_build_then_a_kill(&stack).await;
    assert_eq!(issued.strategy, "job");
    assert_eq!(issued.new_job_ids.len(), 1);
    assert!(
        issued.note.contains("keeps its variables"),
        "{}",
        issued.note
    );
    stack.stop().await;
}

#[tokio::test]
async fn kills_in_two_child_pipelines_retry_their_parent_once() {
    let stack = Stack::start(GITLAB_ONLY).await;
    stack
        .gitlab_pipeline(8000, "success", &[(9000, "success", None)])
        .await;
    stack
        .usage(&report(9000, 1_000_000_000, 4_000_000_000, false))
        .await;
    // Generate pipeline 300 triggered children 301 and 302 (one stack
    // each); both had a build killed.
    for (child, job) in [(301u64, 6101u64), (302, 6102)] {
        stack
            .gitlab_child_pipeline(
                child,
                300,
                "failed",
                &[(job, "failed", Some("script_failure"))],
            )
            .await;
        stack
            .usage(&report(job, 2_000_000_000, 2_000_000_000, true))
            .await;
    }
    let posts = wait_for_posts(&stack, 1).await;
    assert_eq!(posts[0].1, "300", "RUNYARD_RETRY_OF names the parent");
    let issued = first_issued(&stack).await;
    assert_eq!(
        issued.target.as_ref().map(|t| t.unit.as_str()),
        Some("pipeline:300")
    );
    assert_eq!(
        issued.jobs.len(),
        2,
        "one retry covers both children's kills"
    );
    // The hooks again: still one pipeline.
    for (child, job) in [(301u64, 6101u64), (302, 6102)] {
        stack
            .gitlab_child_pipeline(
                child,
                300,
                "failed",
                &[(job, "failed", Some("script_failure"))],
            )
            .await;
    }
    stack.settled().await;
    assert_eq!(pipeline_posts(&stack).len(), 1);
    stack.stop().await;
}

/// Run 777 holds the OOM-killed job `killed` (named `build`) and `docs`,
/// still running: nothing is re-run until `docs` completes, then only the
/// killed job, once, as attempt 2. Returns the re-run's job id.
async fn rerun_once_the_run_completed(stack: &Stack, docs: u64, killed: u64, build: &str) -> u64 {
    let gh = &stack.github;
    stack.settled().await;
    assert!(gh.reruns().is_empty(), "{:?}", gh.reruns());
    gh.set_job_status(docs, "completed", Some("success"));
    let reruns = eventually(WAIT, || async {
        let r = gh.reruns();
        (!r.is_empty()).then_some(r)
    })
    .await
    .unwrap_or_else(|| panic!("a re-run\n{}", stack.log("scaler")));
    stack.settled().await;
    assert_eq!(
        gh.reruns(),
        [runyard_testkit::fake_github::FakeRerun::Job {
            repo: "acme/app".into(),
            job_id: killed
        }],
        "only the OOM-killed job, once, never rerun-failed-jobs (first: {reruns:?})"
    );
    let run = gh.run(777).expect("run");
    assert_eq!(run.run_attempt, 2);
    *run.jobs
        .iter()
        .find(|id| {
            gh.job(**id)
                .is_some_and(|x| x.name == build && x.run_attempt == 2)
        })
        .expect("the re-run job")
}

/// [`GITHUB_POOL`] as a scale set (`linux`): no webhook at all, every job
/// known from the scale set's messages.
fn scale_set_pool() -> String {
    GITHUB_POOL.replace(
        "forge = \"github\"\n",
        "forge = \"github\"\nmode = \"scale-set\"\n",
    ) + "scale_set_silence = \"5s\"\nscale_set_backoff = \"100ms\"\n"
}

/// Connects every runner that registered and has not yet: each takes the
/// oldest job assigned to its scale set.
fn boot_runners(stack: &Stack) {
    for a in stack.actions.runners() {
        if !a.online {
            stack.actions.runner_online(&a.name);
        }
    }
}

/// The scale-set job `job_id` (the service's id) in `state`.
async fn job_in_state(stack: &Stack, job_id: &str, state: &str) {
    let got = eventually(WAIT, || async {
        boot_runners(stack);
        stack
            .actions
            .jobs()
            .iter()
            .any(|j| j.job_id == job_id && j.state == state)
            .then_some(())
    })
    .await;
    assert!(
        got.is_some(),
        "job {job_id} never {state}: {:?}\n--- scaler log ---\n{}",
        stack.actions.jobs(),
        stack.log("scaler")
    );
}

/// The runner requested for REST job `rest_id`: `(attempt, flavor)`.
async fn runner_for(stack: &Stack, rest_id: u64) -> (u32, String) {
    eventually(WAIT, || async {
        stack
            .runner_requests()
            .await
            .into_iter()
            .find(|r| r.0 == rest_id)
            .map(|r| (r.1, r.2))
    })
    .await
    .unwrap_or_else(|| panic!("a runner for job {rest_id}\n{}", stack.log("scaler")))
}

#[tokio::test]
async fn a_scale_set_job_killed_by_oom_is_rerun_once_on_a_larger_runner() {
    let stack = Stack::start(&scale_set_pool()).await;
    let (gh, actions) = (&stack.github, &stack.actions);
    let set = eventually(WAIT, || async {
        actions
            .scale_sets()
            .into_iter()
            .find(|s| s.name == "linux")
            .map(|s| s.id)
    })
    .await
    .unwrap_or_else(|| panic!("the scale set\n{}", stack.log("scaler")));
    let build = "build (x64)";
    // A REST job of `run` and its scale-set message: what GitHub holds for
    // one job of a workflow whose `runs-on` names the scale set.
    let job = |run: u64, name: &str| {
        let mut j = runyard_testkit::fake_github::FakeJob::queued(run, name, &["linux"]);
        j.workflow_name = "CI".into();
        gh.add_job("acme", "app", j)
    };
    let message = |run: u64, name: &str| {
        actions.queue_job(
            set,
            FakeScaleSetJob::new("acme/app", name, run as i64, &["linux"]),
        )
    };

    // Three builds served by the scale set and reported: the history.
    for (i, peak) in [900_000_000u64, 1_000_000_000, 950_000_000]
        .into_iter()
        .enumerate()
    {
        let run = 600 + i as u64;
        let rest = job(run, build);
        let ss = message(run, build);
        runner_for(&stack, rest).await;
        job_in_state(&stack, &ss, "running").await;
        gh.set_job_status(rest, "completed", Some("success"));
        actions.complete_job(&ss, "succeeded");
        stack
            .usage(&gh_report(rest, 1, "build", peak, 4 * GIB, 0))
            .await;
    }
    let workload: BTreeMap<String, String> =
        [("repo", "acme/app"), ("workflow", "CI"), ("job", build)]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
    eventually(WAIT, || async {
        let r = stack.recommend(&workload, "main").await;
        (r.basis.as_ref().is_some_and(|b| b.samples >= 3)).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the allocator learned the scale set's jobs\n{}",
            stack.log("allocator")
        )
    });

    // Run 777: the build (killed) and lint (fails on its own) on the scale
    // set, and docs still running elsewhere.
    let (j, k, l) = (job(777, build), job(777, "lint"), job(777, "docs"));
    gh.set_job_status(l, "in_progress", None);
    let (sj, sk) = (message(777, build), message(777, "lint"));
    assert_eq!(
        runner_for(&stack, j).await,
        (1, "small".into()),
        "sized from a ~1 GB history"
    );
    runner_for(&stack, k).await;
    job_in_state(&stack, &sj, "running").await;
    job_in_state(&stack, &sk, "running").await;
    gh.set_job_status(j, "completed", Some("failure"));
    gh.set_job_status(k, "completed", Some("failure"));
    actions.complete_job(&sj, "failed");
    actions.complete_job(&sk, "failed");
    stack
        .usage(&gh_report(j, 1, "build", 4 * GIB, 4 * GIB, 137))
        .await;
    stack
        .usage(&gh_report(k, 1, "lint", 100_000_000, 4 * GIB, 1))
        .await;

    // GitHub queues the re-run as attempt 2 of run 777 and routes it to the
    // scale set again: its runner is the larger flavor.
    let rerun = rerun_once_the_run_completed(&stack, l, j, build).await;
    let again = message(777, build);
    assert_eq!(runner_for(&stack, rerun).await, (2, "large".into()));
    job_in_state(&stack, &again, "running").await;

    let requests = stack.runner_requests().await;
    for id in [j, k, rerun] {
        let n = requests.iter().filter(|r| r.0 == id).count();
        assert_eq!(n, 1, "one runner for job {id}: {requests:?}");
    }
    let kinds: Vec<String> = stack.retry_events().await.iter().map(kind).collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "issued").count(),
        1,
        "{kinds:?}"
    );
    assert!(kinds.iter().any(|k| k == "refused:not_oom"), "{kinds:?}");
    stack.stop().await;
}
