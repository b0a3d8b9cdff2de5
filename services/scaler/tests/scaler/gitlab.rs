//! GitLab runners against a real nats-server and the fake GitLab, whose
//! runners take jobs the way GitLab's do: a runner is never deleted while it
//! runs a job (GitLab's delete never says busy), idle confirmation asks
//! GitLab for the runner's jobs, and registrations the scaler does not know
//! are found and removed (paused, jobs asked, deleted).

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
    support::until_async("sync cycles", async || listings(scaler).await > from + n).await;
}

/// Waits until the scaler counts one runner online and idle (GitLab's
/// listing showed it online).
async fn online(scaler: &Scaler) {
    support::until_async("the runner online and idle", async || {
        scaler.pools().await["pools"][0]["idle"] == 1
    })
    .await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_confirmation_reads_the_runners_jobs_and_keeps_a_busy_one() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    let a = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["docker"]));
    let scaler = start(&stack, &gitlab).await;
    deliver(&stack, a, JobStatus::Queued, "").await;
    let id = registered(&gitlab).await;
    let name = runner_for(a);
    gitlab.start_runner(id, RunMode::SingleBuild).unwrap();
    online(&scaler).await;
    // Its job goes to another runner: ours is idle and surplus.
    gitlab.set_job_status(a, "success", None);
    deliver(&stack, a, JobStatus::InProgress, "k8s-runner-1").await;
    deliver(&stack, a, JobStatus::Completed, "k8s-runner-1").await;
    // GitLab hands it a job whose hook is not there yet.
    let c = gitlab.add_job(34, FakeGlJob::pending(78, "late", &["docker"]));
    assert_eq!(gitlab.pick_up(id), Some(c));
    let jobs_reads = || gitlab.count("GET", &format!("/api/v4/runners/{id}/jobs"));
    until("the idle confirmation asks for its jobs", || {
        jobs_reads() >= 1
    })
    .await;
    let runner_read = format!("GET /api/v4/runners/{id}");
    assert!(calls(&about(&gitlab, id)).contains(&runner_read));
    // Past the idle timeout and the busy-confirmation window (3 s).
    cycles(&scaler, 5).await;
    assert_eq!(gitlab.count("DELETE", "/api/v4/runners/"), 0, "busy: kept");
    assert_eq!(gitlab.deleted_while_running(), 0);
    assert_eq!(gitlab.job(c).unwrap().status, "running");
    gitlab.finish_job(c, "success");
    deliver(&stack, c, JobStatus::InProgress, &name).await;
    deliver(&stack, c, JobStatus::Completed, &name).await;
    until("deleted in GitLab", || gitlab.runners().is_empty()).await;
    assert_eq!(gitlab.deleted_while_running(), 0);
    assert_eq!(gitlab.count("DELETE", "/api/v4/runners/"), 1);
    assert_eq!(gitlab.count("POST", "/api/v4/user/runners"), 1);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_runner_is_confirmed_idle_with_gitlab_then_removed() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    let a = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["docker"]));
    let scaler = start(&stack, &gitlab).await;
    deliver(&stack, a, JobStatus::Queued, "").await;
    let id = registered(&gitlab).await;
    gitlab.start_runner(id, RunMode::SingleBuild).unwrap();
    online(&scaler).await;
    gitlab.set_job_status(a, "success", None);
    deliver(&stack, a, JobStatus::InProgress, "k8s-runner-1").await;
    deliver(&stack, a, JobStatus::Completed, "k8s-runner-1").await;
    until("deleted in GitLab", || gitlab.runners().is_empty()).await;
    until("its instance gone", || stack.live_processes().is_empty()).await;
    // Read (runner and jobs) before the removal, which paused it first.
    let order = calls(&about(&gitlab, id));
    let first_delete = order.iter().position(|c| c.starts_with("DELETE")).unwrap();
    let reads = order[..first_delete]
        .iter()
        .filter(|c| *c == &format!("GET /api/v4/runners/{id}/jobs?status=running"))
        .count();
    assert!(reads >= 3, "idle readings and the final check: {order:?}");
    assert!(order[..first_delete].contains(&format!("GET /api/v4/runners/{id}")));
    assert_eq!(order[first_delete - 2], format!("PUT /api/v4/runners/{id}"));
    assert_eq!(gitlab.deleted_while_running(), 0);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphan_registrations_are_paused_checked_and_removed_and_others_untouched() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    let tags = ["docker", "linux"];
    // Left by an earlier life of the scaler: one idle, one running a job.
    let idle = gitlab.add_runner("project_type", Some(34), "ry-gl-docker-0123456789", &tags);
    let busy = gitlab.add_runner("project_type", Some(34), "ry-gl-docker-abcdef0123", &tags);
    gitlab.start_runner(busy, RunMode::SingleBuild).unwrap();
    let job = gitlab.add_job(34, FakeGlJob::pending(90, "long", &["docker"]));
    assert_eq!(gitlab.pick_up(busy), Some(job));
    // Not runyard's, or another pool's: never touched.
    let theirs = gitlab.add_runner("project_type", Some(34), "k8s-runner-large-a", &tags);
    let other_pool = gitlab.add_runner("project_type", Some(34), "ry-gl-0123456789", &tags);
    let scaler = start(&stack, &gitlab).await;
    until("the idle orphan removed", || {
        gitlab.runners().iter().all(|r| r.id != idle)
    })
    .await;
    assert_eq!(
        calls(&about(&gitlab, idle)),
        [
            format!("PUT /api/v4/runners/{idle}"),
            format!("GET /api/v4/runners/{idle}/jobs?status=running"),
            format!("DELETE /api/v4/runners/{idle}"),
        ]
    );
    until("the busy orphan paused", || gitlab.paused(busy)).await;
    cycles(&scaler, 3).await;
    assert!(gitlab.runners().iter().any(|r| r.id == busy), "busy: kept");
    assert_eq!(gitlab.deleted_while_running(), 0);
    gitlab.finish_job(job, "success");
    until("the busy orphan removed once its job is done", || {
        gitlab.runners().iter().all(|r| r.id != busy)
    })
    .await;
    assert_eq!(gitlab.deleted_while_running(), 0);
    cycles(&scaler, 2).await;
    for id in [theirs, other_pool] {
        assert_eq!(about(&gitlab, id).len(), 0, "runner {id} touched");
    }
    assert_eq!(gitlab.runners().len(), 2);
    assert_eq!(gitlab.count("POST", "/api/v4/user/runners"), 0);
    // Listed by the pool's scope, type and tags.
    let listing = gitlab
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v4/projects/34/runners")
        .unwrap();
    assert!(
        listing
            .query
            .starts_with("type=project_type&tag_list=docker,linux"),
        "{}",
        listing.query
    );
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_whose_answer_was_lost_is_removed() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    let a = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["docker"]));
    // GitLab makes the runner, the answer is lost: the create fails and
    // is tried again, which registers the same description anew.
    gitlab.lose_next_answers(1, 502);
    let scaler = start(&stack, &gitlab).await;
    deliver(&stack, a, JobStatus::Queued, "").await;
    until("registered twice", || {
        gitlab.count("POST", "/api/v4/user/runners") == 2
    })
    .await;
    until("the lost one removed", || gitlab.runners().len() == 1).await;
    let first = gitlab.deleted_runners();
    assert_eq!(first.len(), 1);
    assert!(
        first[0] < gitlab.runners()[0].id,
        "the first registration went"
    );
    assert_eq!(gitlab.runners()[0].description, runner_for(a));
    assert_eq!(stack.live_processes().len(), 1, "the runner made stays");
    cycles(&scaler, 2).await;
    assert_eq!(gitlab.runners().len(), 1);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_registration_waits_out_gitlabs_limit_and_fails_no_attempt() {
    let stack = Stack::new(POOL).await;
    let gitlab = FakeGitLab::start().await;
    // GitLab's limit refuses the registration twelve times, each with
    // `Retry-After: 1`: more waits than a create used to allow itself.
    let register = "/api/v4/user/runners";
    gitlab.throttle("POST", register, 12, 1);
    let a = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["docker"]));
    let scaler = start(&stack, &gitlab).await;
    deliver(&stack, a, JobStatus::Queued, "").await;
    registered(&gitlab).await;
    assert_eq!(gitlab.runners()[0].description, runner_for(a));
    let answers: Vec<u16> = gitlab
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == register)
        .map(|r| r.status)
        .collect();
    assert_eq!(answers.len(), 13, "twelve refusals, then the registration");
    assert!(answers[..12].iter().all(|s| *s == 429), "{answers:?}");
    assert!((200..300).contains(&answers[12]), "{answers:?}");
    until("its instance running", || stack.live_processes().len() == 1).await;
    let events = stack.events().await;
    let failed = events
        .iter()
        .filter(|e| matches!(e.body, Some(Body::RunnerFailed(_))))
        .count();
    assert_eq!(failed, 0, "waiting for GitLab's limit is no failed attempt");
    let attempts: Vec<u32> = events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerCreated(c)) => Some(c.attempt),
            _ => None,
        })
        .collect();
    assert_eq!(attempts, [1], "made at the first attempt");
    scaler.stop().await;
}
