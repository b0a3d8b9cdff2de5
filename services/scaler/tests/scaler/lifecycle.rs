//! Jobs that wait before they can run, as the forges run them (the fakes'
//! lifecycles, their webhooks through the forges' normalizers): a GitHub
//! deployment waiting for an approval, GitLab stages, resource groups and
//! delayed jobs. A job gets a runner when it becomes runnable, and not
//! before.

use std::collections::BTreeMap;

use runyard_events::Body;
use runyard_testkit::fake_github::FakeJob;
use runyard_testkit::fake_gitlab::{FakeGitLab, FakeGlStageJob};

use crate::support::{self, Scaler, Stack, pool_toml, until, until_async};

/// Runners requested, by the job they were made for.
async fn requested_for(stack: &Stack) -> BTreeMap<u64, usize> {
    let mut out = BTreeMap::new();
    for e in stack.runner_events("RunnerRequested").await {
        if let Some(Body::RunnerRequested(r)) = &e.body
            && let Some(job) = &r.job
        {
            *out.entry(job.job_id).or_default() += 1;
        }
    }
    out
}

/// Waits until a runner was requested for `job` and the scaler has
/// settled, and returns every job runners were requested for: a job folded
/// in before the sentinel has had its chance.
async fn served(stack: &Stack, scaler: &Scaler, job: u64) -> BTreeMap<u64, usize> {
    until_async("a runner for the sentinel job", async || {
        requested_for(stack).await.contains_key(&job)
    })
    .await;
    stack.settled(scaler).await;
    requested_for(stack).await
}

const LABELS: &[&str] = &["self-hosted", "linux"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_approved_after_waiting_gets_its_runner() {
    let stack = Stack::new(&pool_toml(10, 0, "")).await;
    let scaler = stack.start().await;
    let gh = &stack.github;
    let deploy = gh.add_waiting_job("acme", "app", FakeJob::queued(70, "deploy", LABELS));
    let sentinel = gh.add_job("acme", "app", FakeJob::queued(71, "build", LABELS));
    stack.deliver_github(gh.take_webhooks()).await;
    let before = served(&stack, &scaler, sentinel).await;
    assert_eq!(
        before.get(&deploy),
        None,
        "no runner while the deployment waits for its approval"
    );
    assert_eq!(before.len(), 1);

    gh.approve(deploy);
    stack.deliver_github(gh.take_webhooks()).await;
    let after = served(&stack, &scaler, deploy).await;
    assert_eq!(after.get(&deploy), Some(&1), "one runner once approved");
    assert_eq!(stack.jit_calls(), 2);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_rejected_while_waiting_never_gets_a_runner() {
    let stack = Stack::new(&pool_toml(10, 0, "")).await;
    let scaler = stack.start().await;
    let gh = &stack.github;
    let deploy = gh.add_waiting_job("acme", "app", FakeJob::queued(70, "deploy", LABELS));
    gh.reject(deploy);
    let sentinel = gh.add_job("acme", "app", FakeJob::queued(71, "build", LABELS));
    stack.deliver_github(gh.take_webhooks()).await;
    let seen = served(&stack, &scaler, sentinel).await;
    assert_eq!(seen.get(&deploy), None);
    assert_eq!(stack.jit_calls(), 1);
    scaler.stop().await;
}

/// A scaler serving [`support::GITLAB_POOL`] (project 34) against `gitlab`.
async fn gitlab_stack(gitlab: &FakeGitLab) -> (Stack, support::Scaler) {
    let stack = Stack::new(support::GITLAB_POOL).await;
    let mut config = stack.config();
    config.gitlab_api_url = Some(gitlab.url());
    config.gitlab_token = Some("glpat-test".to_owned().into());
    let scaler = stack.start_with(config).await;
    (stack, scaler)
}

fn job(name: &str) -> FakeGlStageJob {
    FakeGlStageJob::new(name, &["docker"])
}

/// A registered runner of the pool that has no job yet takes `job`, as a
/// GitLab runner polling for work would (once one is registered).
async fn take(gitlab: &FakeGitLab, job: u64) {
    let free = || {
        gitlab
            .runners()
            .into_iter()
            .find(|r| gitlab.runner_jobs(r.id) == 0)
    };
    until("a registered runner with no job", || free().is_some()).await;
    let runner = free().expect("a free runner");
    gitlab.start_pipeline_job(job, runner.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_jobs_of_later_stages_get_runners_when_their_stage_starts() {
    let gitlab = FakeGitLab::start().await;
    let (stack, scaler) = gitlab_stack(&gitlab).await;
    let (_, ids) = gitlab.run_pipeline(
        34,
        "develop",
        &[
            ("build", vec![job("compile")]),
            ("test", vec![job("unit"), job("integration")]),
            ("deploy", vec![job("publish")]),
        ],
    );
    stack.deliver_gitlab(gitlab.take_webhooks()).await;
    let first = served(&stack, &scaler, ids[0]).await;
    assert_eq!(first.len(), 1, "only the first stage runs: {first:?}");
    assert_eq!(gitlab.runners().len(), 1);
    // Tags are read for runnable jobs only.
    let lookups = |id: u64| gitlab.count("GET", &format!("/api/v4/projects/34/jobs/{id}"));
    assert_eq!(lookups(ids[1]) + lookups(ids[2]) + lookups(ids[3]), 0);

    take(&gitlab, ids[0]).await;
    gitlab.finish_pipeline_job(ids[0], "success", None);
    stack.deliver_gitlab(gitlab.take_webhooks()).await;
    served(&stack, &scaler, ids[2]).await;
    let second = served(&stack, &scaler, ids[1]).await;
    assert_eq!(
        second.keys().copied().collect::<Vec<_>>(),
        ids[..3].to_vec(),
        "the test stage's two jobs now, not the deploy stage"
    );
    assert!(second.values().all(|n| *n == 1));

    // The test stage fails: the deploy job is skipped and never runs.
    take(&gitlab, ids[1]).await;
    take(&gitlab, ids[2]).await;
    gitlab.finish_pipeline_job(ids[1], "failed", Some("script_failure"));
    gitlab.finish_pipeline_job(ids[2], "success", None);
    assert_eq!(gitlab.job(ids[3]).map(|j| j.status), Some("skipped".into()));
    let (_, next) = gitlab.run_pipeline(34, "develop", &[("build", vec![job("compile")])]);
    stack.deliver_gitlab(gitlab.take_webhooks()).await;
    let last = served(&stack, &scaler, next[0]).await;
    assert_eq!(
        last.get(&ids[3]),
        None,
        "the skipped job never got a runner"
    );
    assert_eq!(last.len(), 4);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_jobs_held_by_a_resource_group_or_a_schedule_get_runners_when_released() {
    let gitlab = FakeGitLab::start().await;
    let (stack, scaler) = gitlab_stack(&gitlab).await;
    let group = |name: &str| job(name).in_resource_group("production");
    let (_, a) = gitlab.run_pipeline(34, "develop", &[("deploy", vec![group("deploy")])]);
    let (_, b) = gitlab.run_pipeline(34, "develop", &[("deploy", vec![group("deploy")])]);
    let (_, nightly) = gitlab.run_pipeline(34, "develop", &[("later", vec![job("n").delayed()])]);
    let (_, sentinel) = gitlab.run_pipeline(34, "develop", &[("build", vec![job("compile")])]);
    stack.deliver_gitlab(gitlab.take_webhooks()).await;
    let before = served(&stack, &scaler, sentinel[0]).await;
    assert_eq!(
        before.keys().copied().collect::<Vec<_>>(),
        [a[0], sentinel[0]],
        "the job waiting for the resource and the scheduled one wait"
    );

    take(&gitlab, a[0]).await;
    gitlab.finish_pipeline_job(a[0], "success", None);
    gitlab.run_scheduled(nightly[0]);
    stack.deliver_gitlab(gitlab.take_webhooks()).await;
    served(&stack, &scaler, b[0]).await;
    let after = served(&stack, &scaler, nightly[0]).await;
    assert_eq!(after.len(), 4);
    assert!(
        after.values().all(|n| *n == 1),
        "one runner each: {after:?}"
    );
    scaler.stop().await;
}
