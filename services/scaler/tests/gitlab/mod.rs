//! GitLab runners against a real nats-server and the fake GitLab, whose
//! runners take jobs the way GitLab's do: a runner is never deleted while it
//! runs a job (GitLab's delete never says busy).

use runyard_events::{Body, Event, Forge, JobStatus, claim_key, instance_name};
use runyard_testkit::fake_github::RecordedRequest;
use runyard_testkit::fake_gitlab::{FakeGitLab, FakeGlJob, RunMode};

use crate::support::{self, Scaler, Stack, until};

/// Project 34's pool on `gitlab.example.com`: tags `docker, linux`, idle
/// runners go after a second.
const POOL: &str = r#"
[[pools]]
name = "gl-docker"
forge = "gitlab"
scope = { project_id = 34 }
instance = "gitlab.example.com"
labels = ["docker", "linux"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 3
idle_timeout = "1s"
bootstrap_timeout = "30s"
"#;

/// A Job Hook as ingest publishes it.
fn hook(id: &str, job: u64, status: JobStatus, runner: &str) -> Event {
    let mut e = support::job_event(id, job, status, runner, &[]);
    let src = e.source.as_mut().expect("source");
    src.forge = Forge::Gitlab as i32;
    src.instance = "gitlab.example.com".into();
    if let Some(Body::JobObserved(j)) = e.body.as_mut() {
        let key = j.job.as_mut().expect("key");
        key.forge = Forge::Gitlab as i32;
        key.instance = "gitlab.example.com".into();
        j.project_id = 34;
        j.project = "acme/app".into();
    }
    e
}

/// Publishes a Job Hook for `job` in `status` on `runner`.
async fn deliver(stack: &Stack, job: u64, status: JobStatus, runner: &str) {
    let id = format!("gitlab:{job}:{}", runyard_events::status_token(status));
    stack.publish(hook(&id, job, status, runner)).await;
}

/// The runner the pool makes for GitLab job `job`.
fn runner_for(job: u64) -> String {
    instance_name(
        "gl-docker",
        &claim_key(Forge::Gitlab, "gitlab.example.com", job, 1),
    )
}

async fn start(stack: &Stack, gitlab: &FakeGitLab) -> Scaler {
    let mut config = stack.config();
    config.gitlab_api_url = Some(gitlab.url());
    config.gitlab_token = Some("glpat-test".to_owned().into());
    stack.start_with(config).await
}

/// Requests naming runner `id` (`/api/v4/runners/<id>...`), in order.
fn about(gitlab: &FakeGitLab, id: u64) -> Vec<RecordedRequest> {
    let exact = format!("/api/v4/runners/{id}");
    let jobs = format!("/api/v4/runners/{id}/jobs");
    gitlab
        .requests()
        .into_iter()
        .filter(|r| r.path == exact || r.path == jobs)
        .collect()
}

/// `METHOD path` of each request.
fn calls(requests: &[RecordedRequest]) -> Vec<String> {
    requests
        .iter()
        .map(|r| {
            let q = if r.query.is_empty() {
                String::new()
            } else {
                format!("?{}", r.query.split("&per_page").next().unwrap_or(""))
            };
            format!("{} {}{q}", r.method, r.path)
        })
        .collect()
}

/// Sync cycles the scaler has begun: its provider listings of the pool.
async fn listings(scaler: &Scaler) -> u64 {
    let page = reqwest::get(format!("http://{}/metrics", scaler.addr))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("text");
    page.lines()
        .filter(|l| l.contains("provider_call_seconds_count") && l.contains("op=\"list\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until `n` more sync cycles have passed (each could have acted).
async fn cycles(scaler: &Scaler, n: u64) {
    let from = listings(scaler).await;
    let deadline = tokio::time::Instant::now() + support::WAIT;
    while listings(scaler).await < from + n + 1 {
        assert!(tokio::time::Instant::now() < deadline, "no sync cycles");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The one runner registered so far, once there is one.
async fn registered(gitlab: &FakeGitLab) -> u64 {
    until("a runner registered", || gitlab.runners().len() == 1).await;
    gitlab.runners()[0].id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_took_a_second_job_is_deleted_only_once_that_job_is_done() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    let a = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["docker"]));
    let scaler = start(&stack, &gitlab).await;
    deliver(&stack, a, JobStatus::Queued, "").await;
    let id = registered(&gitlab).await;
    let name = runner_for(a);
    assert_eq!(gitlab.runners()[0].description, name);
    // A runner that keeps taking jobs (a `gitlab-runner run` service, as
    // a hand-written process command could start).
    gitlab.start_runner(id, RunMode::Service).unwrap();
    assert_eq!(gitlab.pick_up(id), Some(a));
    deliver(&stack, a, JobStatus::InProgress, &name).await;
    // Its job ends and, before the scaler hears, it takes the next one.
    gitlab.finish_job(a, "success");
    let b = gitlab.add_job(34, FakeGlJob::pending(77, "test", &["docker"]));
    assert_eq!(gitlab.pick_up(id), Some(b));
    deliver(&stack, a, JobStatus::Completed, &name).await;
    until("the runner paused", || gitlab.paused(id)).await;
    cycles(&scaler, 3).await;
    assert_eq!(gitlab.count("DELETE", "/api/v4/runners/"), 0, "busy: kept");
    assert_eq!(gitlab.deleted_while_running(), 0);
    assert_eq!(gitlab.job(b).unwrap().status, "running");
    assert_eq!(stack.live_processes().len(), 1, "its instance stays too");
    // Paused, it is handed nothing more; once its job is done it goes.
    let c = gitlab.add_job(34, FakeGlJob::pending(77, "lint", &["docker"]));
    assert_eq!(gitlab.pick_up(id), None);
    gitlab.finish_job(b, "success");
    deliver(&stack, b, JobStatus::InProgress, &name).await;
    deliver(&stack, b, JobStatus::Completed, &name).await;
    until("deleted in GitLab", || gitlab.runners().is_empty()).await;
    until("its instance gone", || stack.live_processes().is_empty()).await;
    assert_eq!(gitlab.count("DELETE", "/api/v4/runners/"), 1);
    assert_eq!(gitlab.deleted_while_running(), 0);
    assert_eq!(gitlab.count("POST", "/api/v4/user/runners"), 1);
    assert_eq!(gitlab.job(c).unwrap().status, "pending");
    // The delete came after a pause and an empty running-jobs answer.
    let order = calls(&about(&gitlab, id));
    let last = order.len() - 1;
    assert_eq!(order[last], format!("DELETE /api/v4/runners/{id}"));
    assert_eq!(
        order[last - 1],
        format!("GET /api/v4/runners/{id}/jobs?status=running")
    );
    assert_eq!(order[last - 2], format!("PUT /api/v4/runners/{id}"));
    scaler.stop().await;
}
