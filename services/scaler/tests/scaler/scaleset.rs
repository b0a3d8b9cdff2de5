//! Scale-set pools against the fake Actions service: the scaler holds the
//! message session, turns messages into job events, makes one JIT runner of
//! the scale set per assigned job, and removes a runner only once its job
//! completed and the service agrees it is not busy. Runner processes are
//! real (`sleep`); a test plays the runners' part by telling the fake that
//! a live process connected (`boot`).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use runyard_events::{Body, JobStatus};
use runyard_scaler::{App, Config, ScalerFile};
use runyard_testkit::fake_actions::{FakeActions, FakeScaleSetJob};

use crate::support::{Replicas, Stack, spawn_replica, until};

/// A scale-set pool `big` on org `acme` with at most `max` runners.
pub fn scale_set_pool(max: u32) -> String {
    format!(
        r#"
[[pools]]
name = "big"
forge = "github"
mode = "scale-set"
scope = {{ org = "acme" }}
labels = ["linux", "x64"]
provider = "local"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}]
max_runners = {max}
idle_timeout = "30s"
bootstrap_timeout = "30s"
"#
    )
}

/// The listener's timers, short.
const LISTENER: &str = "scale_set_silence = \"5s\"\nscale_set_backoff = \"100ms\"\n";

/// A stack with a scale-set pool and the fake Actions service.
struct ScaleSetStack {
    stack: Stack,
    actions: FakeActions,
}

impl ScaleSetStack {
    async fn new(pools: &str) -> Self {
        let stack = Stack::new(pools).await;
        let actions = FakeActions::start().await;
        actions.set_poll_hold(Duration::from_millis(300));
        let mut s = Self { stack, actions };
        s.stack.file.push_str(LISTENER);
        s
    }

    fn config(&self) -> Config {
        Config {
            github_api_url: self.actions.github_url(),
            ..self.stack.config()
        }
    }

    async fn start(&self) -> crate::support::Scaler {
        self.stack.start_with(self.config()).await
    }

    /// The scale set's id, once the scaler made it.
    async fn scale_set_id(&self) -> i64 {
        let mut id = None;
        until("the scale set exists", || {
            id = self
                .actions
                .scale_sets()
                .into_iter()
                .find(|s| s.name == "big")
                .map(|s| s.id);
            id.is_some()
        })
        .await;
        id.unwrap_or_default()
    }

    /// Queues `n` jobs of run `run_id`; returns their scale-set job ids.
    fn queue(&self, set: i64, run_id: i64, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| {
                self.actions.queue_job(
                    set,
                    FakeScaleSetJob::new("acme/app", &format!("build {i}"), run_id, &["big"]),
                )
            })
            .collect()
    }

    /// Every live runner process connects (its JIT config is used).
    fn boot(&self) {
        for name in self.stack.live_processes() {
            self.actions.runner_online(&name);
        }
    }

    fn job_states(&self) -> BTreeMap<String, String> {
        self.actions
            .jobs()
            .into_iter()
            .map(|j| (j.job_id, j.state))
            .collect()
    }

    /// Plays the runners until every job in `jobs` completed: live
    /// processes connect, jobs that run finish at the next turn. Returns
    /// the most runner processes seen alive at once.
    async fn drain(&self, jobs: &[String], max: usize) -> usize {
        let wanted: HashSet<&String> = jobs.iter().collect();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
        let mut peak = 0;
        loop {
            let live = self.stack.live_processes().len();
            peak = peak.max(live);
            assert!(live <= max, "{live} runners alive, max {max}");
            let states = self.job_states();
            let left: Vec<(&String, &String)> = states
                .iter()
                .filter(|(id, st)| wanted.contains(id) && st.as_str() != "completed")
                .collect();
            if left.is_empty() {
                return peak;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "jobs left: {left:?}; live {:?}",
                self.stack.live_processes()
            );
            for (id, st) in &left {
                if st.as_str() == "running" {
                    self.actions.complete_job(id, "succeeded");
                }
            }
            self.boot();
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Job events the scale set's listener put in the log, by status.
    async fn job_events(&self) -> BTreeMap<&'static str, usize> {
        let mut by = BTreeMap::new();
        for e in self.stack.events().await {
            if let Some(Body::JobObserved(j)) = &e.body
                && !j.scale_set_pool.is_empty()
            {
                *by.entry(runyard_events::status_token(j.status()))
                    .or_default() += 1;
            }
        }
        by
    }

    /// How many events of each kind (runner events with their reason) the
    /// log holds: what a failed count assertion shows.
    async fn story(&self) -> BTreeMap<String, usize> {
        let mut story = BTreeMap::new();
        for e in self.stack.events().await {
            let kind = runyard_events::event_type(&e);
            let detail = match &e.body {
                Some(Body::RunnerRequested(r)) => format!("{kind} job={}", r.job.is_some()),
                Some(Body::RunnerFailed(r)) => format!("{kind} {}", r.reason),
                Some(Body::RunnerDeleted(r)) => format!("{kind} {}", r.reason),
                _ => kind.to_owned(),
            };
            *story.entry(detail).or_insert(0) += 1;
        }
        story
    }

    /// Runners requested per job id.
    async fn requested_per_job(&self) -> BTreeMap<u64, usize> {
        let mut per_job = BTreeMap::new();
        for e in self.stack.runner_events("RunnerRequested").await {
            if let Some(Body::RunnerRequested(r)) = &e.body
                && let Some(j) = &r.job
            {
                *per_job.entry(j.job_id).or_default() += 1;
            }
        }
        per_job
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_300_jobs_gets_one_runner_each_never_above_max() {
    const JOBS: usize = 300;
    const MAX: usize = 50;
    let s = ScaleSetStack::new(&scale_set_pool(MAX as u32)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let labels = s
        .actions
        .scale_sets()
        .into_iter()
        .find(|x| x.id == set)
        .map(|x| x.labels)
        .unwrap_or_default();
    assert_eq!(
        labels,
        ["big", "linux", "x64"],
        "name first, then the pool's labels"
    );
    let jobs = s.queue(set, 7, JOBS);
    let peak = s.drain(&jobs, MAX).await;
    assert!(peak <= MAX && peak > MAX / 2, "peak {peak}");
    until("every runner gone", || s.stack.live_processes().is_empty()).await;
    let story = s.story().await;
    // Every job got its runner; the service hands a job to whichever idle
    // runner of the set connects first, so a runner made for one job may
    // serve another, and a booting runner left over when the jobs ran out
    // goes at once (as in webhook mode): a few are made again.
    let jit = s.actions.jit_configs_issued();
    assert!(
        (JOBS as u64..=JOBS as u64 + 6).contains(&jit),
        "{jit} JIT runners for {JOBS} jobs: {story:?}"
    );
    // Runners made for a job that another runner took serve the next job
    // (the service hands a job to any idle runner of the set): none is
    // made twice for one job.
    let per_job = s.requested_per_job().await;
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    assert_eq!(s.actions.removed_while_busy(), 0);
    let events = s.job_events().await;
    assert_eq!(events.get("queued"), Some(&JOBS));
    assert_eq!(events.get("completed"), Some(&JOBS));
    // Acquired before assignment (the fake needs it, as GHES does), every
    // message acknowledged, one session, the capacity header sent.
    assert!(
        s.actions
            .count("POST", "/tenant/123/_apis/runtime/runnerscalesets/")
            > 0
    );
    assert_eq!(s.actions.sessions_created(), 1);
    let fake = s
        .actions
        .scale_sets()
        .into_iter()
        .find(|x| x.id == set)
        .unwrap();
    assert_eq!(fake.max_capacity_seen, Some(MAX as i64));
    let pools = scaler.pools().await;
    let view = &pools["pools"][0]["scale_set"];
    assert_eq!(view["state"], "active", "{view}");
    assert_eq!(view["id"], set);
    assert!(view["last_message_id"].as_i64().unwrap_or(0) > 0, "{view}");
    assert!(view["statistics"].is_object(), "{view}");
    assert_eq!(
        view["unseen_jobs"], 0,
        "the service and the log agree: {view}"
    );
    scaler.stop().await;
    assert_eq!(
        s.actions
            .scale_sets()
            .into_iter()
            .find(|x| x.id == set)
            .unwrap()
            .sessions,
        0,
        "the session is deleted on shutdown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_job_completed_never_removes_a_busy_runner() {
    let s = ScaleSetStack::new(&scale_set_pool(5)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let job = s.queue(set, 8, 1).remove(0);
    until("the job runs", || {
        s.boot();
        s.job_states().get(&job).map(String::as_str) == Some("running")
    })
    .await;
    let runner = s
        .actions
        .runners()
        .into_iter()
        .find(|r| r.job_id.as_deref() == Some(job.as_str()))
        .expect("a runner runs it");
    // The service says completed while the job still runs.
    s.actions.send_completed_early(&job);
    crate::support::until_async("the completion is in the log", async || {
        s.job_events().await.get("completed") == Some(&1)
    })
    .await;
    s.stack.settled(&scaler).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    s.stack.settled(&scaler).await;
    assert!(
        s.stack.live_processes().contains(&runner.name),
        "the runner was deleted while its job ran"
    );
    assert!(
        s.actions.busy_refusals() > 0,
        "the removal was tried and refused"
    );
    assert_eq!(s.actions.removed_while_busy(), 0);
    // The job really ends: the runner goes.
    s.actions.finish_job(&job);
    until("the runner is removed", || {
        !s.stack.live_processes().contains(&runner.name)
    })
    .await;
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_token_is_refreshed_without_a_new_session() {
    let s = ScaleSetStack::new(&scale_set_pool(10)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let first = s.queue(set, 9, 5);
    s.drain(&first, 10).await;
    s.actions.expire_session_tokens();
    let second = s.queue(set, 10, 5);
    s.drain(&second, 10).await;
    assert_eq!(s.actions.sessions_created(), 1, "refreshed, not made again");
    assert!(
        s.actions
            .count("PATCH", "/tenant/123/_apis/runtime/runnerscalesets/")
            >= 1,
        "the token was refreshed"
    );
    let jit = s.actions.jit_configs_issued();
    assert!(
        (10..=12).contains(&jit),
        "{jit} JIT runners for 10 jobs: {:?}",
        s.story().await
    );
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_seconds_without_the_actions_service_lose_nothing() {
    let s = ScaleSetStack::new(&scale_set_pool(10)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let before = s.queue(set, 11, 3);
    s.drain(&before, 10).await;
    s.actions.set_down(true);
    // Jobs queue while the service cannot be reached.
    let during = s.queue(set, 12, 4);
    tokio::time::sleep(Duration::from_secs(30)).await;
    s.actions.set_down(false);
    s.drain(&during, 10).await;
    let after = s.queue(set, 13, 3);
    s.drain(&after, 10).await;
    let jit = s.actions.jit_configs_issued();
    assert!(
        (10..=12).contains(&jit),
        "{jit} JIT runners for 10 jobs: {:?}",
        s.story().await
    );
    let per_job = s.requested_per_job().await;
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_neither_replays_nor_skips_messages() {
    let s = ScaleSetStack::new(&scale_set_pool(10)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let first = s.queue(set, 14, 4);
    s.drain(&first, 10).await;
    s.stack.settled(&scaler).await;
    scaler.stop().await;
    // Jobs arrive while no scaler runs.
    let second = s.queue(set, 15, 4);
    let scaler = s.start().await;
    s.drain(&second, 10).await;
    s.stack.settled(&scaler).await;
    let jit = s.actions.jit_configs_issued();
    assert!(
        (8..=10).contains(&jit),
        "{jit} JIT runners for 8 jobs: {:?}",
        s.story().await
    );
    let events = s.job_events().await;
    assert_eq!(events.get("queued"), Some(&8), "{events:?}");
    assert_eq!(s.actions.session_conflicts(), 0);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_taken_back_and_assigned_again_still_gets_a_runner() {
    let s = ScaleSetStack::new(&scale_set_pool(5)).await;
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let job = s.queue(set, 16, 1).remove(0);
    until("a runner for it", || s.stack.live_processes().len() == 1).await;
    // Its runner never connects in time: the service takes the job back and
    // assigns it again.
    s.actions.unassign(&job);
    until("assigned again", || {
        s.actions
            .jobs()
            .iter()
            .any(|j| j.job_id == job && j.times_assigned >= 2 && j.state == "assigned")
    })
    .await;
    s.drain(std::slice::from_ref(&job), 5).await;
    let events = s.job_events().await;
    assert_eq!(events.get("waiting"), Some(&1), "taken back: {events:?}");
    assert_eq!(events.get("completed"), Some(&1));
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_change_the_service_cannot_apply_refuses_to_start() {
    let s = ScaleSetStack::new(&scale_set_pool(5)).await;
    let scaler = s.start().await;
    s.scale_set_id().await;
    scaler.stop().await;
    let changed = s.stack.file.replace(
        r#"labels = ["linux", "x64"]"#,
        r#"labels = ["linux", "arm64"]"#,
    );
    let file = ScalerFile::parse(&changed).expect("valid file");
    let err = App::build(s.config(), Some(file))
        .await
        .expect_err("a label change is refused");
    let text = format!("{err:#}");
    assert!(text.contains("arm64") && text.contains("x64"), "{text}");
    assert!(text.contains("big"), "names the scale set: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_and_a_scale_set_for_the_same_jobs_make_one_job_and_one_runner_each() {
    // A webhook pool beside the scale set; the organization's webhook also
    // reports the scale set's jobs (their runs-on names the scale set).
    let pools = format!(
        "{}\n{}",
        scale_set_pool(10),
        crate::support::pool_toml(10, 0, "")
    );
    let s = ScaleSetStack::new(&pools).await;
    s.stack.github.connect_actions(&s.actions);
    let config = Config {
        github_api_url: s.stack.github.url(),
        ..s.stack.config()
    };
    let scaler = s.stack.start_with(config).await;
    let set = s.scale_set_id().await;
    // The same three jobs on both sides: REST jobs of run 17 (what the
    // webhook and usage reports name) and the scale set's messages.
    let mut rest = Vec::new();
    for i in 0..3 {
        let name = format!("build {i}");
        let mut job = runyard_testkit::fake_github::FakeJob::queued(17, &name, &["big"]);
        job.workflow_name = "CI".into();
        rest.push(s.stack.github.add_job("acme", "app", job));
    }
    let jobs = s.queue(set, 17, 3);
    for &id in &rest {
        s.stack.observe(id, JobStatus::Queued, "", &["big"]).await;
    }
    // A job only the webhook pool serves.
    s.stack.queued(90_100).await;
    until("four runners", || s.stack.live_processes().len() == 4).await;
    s.stack.settled(&scaler).await;
    assert_eq!(s.stack.live_processes().len(), 4, "one each, none twice");
    assert_eq!(s.actions.jit_configs_issued(), 3);
    assert_eq!(s.stack.jit_calls(), 1);
    // The scale set's events name the REST jobs, with the workflow's name:
    // one job each in the log, and the webhook key for sizing.
    let mut named = std::collections::BTreeSet::new();
    for e in s.stack.events().await {
        if let Some(Body::JobObserved(j)) = &e.body
            && !j.scale_set_pool.is_empty()
        {
            assert_eq!(j.workflow_name, "CI", "{j:?}");
            named.insert(j.job.as_ref().map_or(0, |k| k.job_id));
        }
    }
    assert_eq!(named, rest.iter().copied().collect());
    let per_job = s.requested_per_job().await;
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    s.drain(&jobs, 10).await;
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_holder_killed_mid_burst_is_taken_over_without_a_conflict() {
    const MAX: usize = 20;
    let s = ScaleSetStack::new(&scale_set_pool(MAX as u32)).await;
    let file = s.stack.write_file();
    let config = s.config();
    let mut replicas = Replicas((0..2).map(|_| spawn_replica(&config, &file)).collect());
    let set = s.scale_set_id().await;
    until("one session", || s.actions.sessions_created() == 1).await;
    let first = s.queue(set, 20, 60);
    // Play the runners until a third of the jobs are done, then SIGKILL
    // the pool's lease holder (its lease value starts with its pid).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while s
        .job_states()
        .values()
        .filter(|st| st.as_str() == "completed")
        .count()
        < 20
    {
        assert!(tokio::time::Instant::now() < deadline, "no progress");
        for (id, st) in s.job_states() {
            if st == "running" {
                s.actions.complete_job(&id, "succeeded");
            }
        }
        s.boot();
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let js = s.stack.bus.jetstream();
    let leases = js
        .get_key_value(format!(
            "{}_LEASES",
            s.stack.ns.as_str().to_ascii_uppercase()
        ))
        .await
        .expect("lease bucket");
    let holder = leases.get("big").await.unwrap().expect("a lease holder");
    let holder_pid: u32 = String::from_utf8_lossy(&holder)
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let at = replicas
        .0
        .iter()
        .position(|r| r.id() == holder_pid)
        .expect("the holder is a replica");
    let mut victim = replicas.0.remove(at);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let _ = victim.wait();
    let second = s.queue(set, 21, 60);
    let all: Vec<String> = first.into_iter().chain(second).collect();
    let peak = s.drain(&all, MAX).await;
    assert!(peak <= MAX);
    until("every runner gone", || s.stack.live_processes().is_empty()).await;
    assert_eq!(
        s.actions.session_conflicts(),
        0,
        "no 409: the dead holder's session was deleted by id"
    );
    assert_eq!(s.actions.sessions_created(), 2);
    let per_job = s.requested_per_job().await;
    assert!(
        per_job.values().all(|n| *n == 1),
        "a runner made twice: {per_job:?}"
    );
    let events = s.job_events().await;
    assert_eq!(events.get("completed"), Some(&120), "{events:?}");
    // At most the creates the dead replica had under way are made again.
    let jit = s.actions.jit_configs_issued();
    assert!((120..=120 + MAX as u64).contains(&jit), "{jit} JIT configs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_long_poll_makes_a_new_session_and_says_so() {
    let s = ScaleSetStack::new(&scale_set_pool(5)).await;
    // The service holds every poll far longer than `scale_set_silence`
    // (5 s here) without answering, as a stuck connection would.
    s.actions.set_poll_hold(Duration::from_secs(30));
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    until("one session", || s.actions.sessions_created() == 1).await;
    crate::support::until_async("the silence is noticed", async || {
        scaler
            .metric(
                "runyard_scaler_scale_set_sessions_recreated_total{pool=\"big\",reason=\"silent\"}",
            )
            .await
            .is_some_and(|v| v >= 1.0)
    })
    .await;
    until("a second session", || s.actions.sessions_created() >= 2).await;
    assert_eq!(
        s.actions.session_conflicts(),
        0,
        "the old session went first"
    );
    // The Actions service's calls are counted with GitHub's.
    crate::support::until_async("the sessions are counted", async || {
        scaler
            .metric("runyard_scaler_forge_api_calls_total{forge=\"github\",endpoint=\"create_session\"}")
            .await
            .is_some_and(|v| v >= 2.0)
    })
    .await;
    // The new session still gets the jobs.
    s.actions.set_poll_hold(Duration::from_millis(300));
    let jobs = s.queue(set, 30, 2);
    s.drain(&jobs, 5).await;
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_message_changes_nothing() {
    let s = ScaleSetStack::new(&scale_set_pool(10)).await;
    // Acknowledgements get lost and the service hands out what it never
    // saw acknowledged again, whatever `lastMessageId` says.
    s.actions.set_redeliver_unacked(true);
    s.actions.lose_next_acks(4);
    let scaler = s.start().await;
    let set = s.scale_set_id().await;
    let jobs = s.queue(set, 40, 6);
    s.drain(&jobs, 10).await;
    s.stack.settled(&scaler).await;
    let deletes = s.actions.count("DELETE", "/tenant/123/_apis/queue/");
    assert!(
        deletes >= s.actions.acks() as usize + 4,
        "the lost acknowledgements' messages came back and went again: {deletes} deletes, {} acks",
        s.actions.acks()
    );
    let events = s.job_events().await;
    assert_eq!(
        events.get("queued"),
        Some(&6),
        "one event per job: {events:?}"
    );
    assert_eq!(events.get("completed"), Some(&6), "{events:?}");
    let per_job = s.requested_per_job().await;
    assert_eq!(per_job.len(), 6);
    assert!(per_job.values().all(|n| *n == 1), "{per_job:?}");
    let jit = s.actions.jit_configs_issued();
    assert!(
        (6..=8).contains(&jit),
        "{jit} JIT runners for 6 jobs: {:?}",
        s.story().await
    );
    scaler.stop().await;
}
