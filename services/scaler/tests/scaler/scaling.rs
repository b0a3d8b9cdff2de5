//! The scaler against a real nats-server, a fake GitHub on loopback and real
//! runner processes: one runner per job, never above max, never a busy
//! runner deleted, faults retried, replicas that fail over.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use runyard_events::{Body, JobStatus};

use crate::fake::{self, external_stack};
use crate::support::{self, Stack, pool_toml, until};

async fn wait_idle(scaler: &support::Scaler, n: u64) {
    support::until_async("idle runners", async || {
        scaler.pools().await["pools"][0]["idle"] == n
    })
    .await;
}

fn runner_names(events: &[runyard_events::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerRequested(r)) => r.runner.as_ref().map(|r| r.name.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_gets_one_right_named_runner_that_goes_when_the_job_is_done() {
    let stack = Stack::new(&pool_toml(5, 0, "")).await;
    let scaler = stack.start().await;
    stack.queued(101).await;
    until("a runner process", || stack.live_processes().len() == 1).await;
    let name = stack.live_processes().into_iter().next().unwrap();
    let key = runyard_events::claim_key(runyard_events::Forge::Github, "github.com", 101, 1);
    assert_eq!(name, runyard_events::instance_name("linux", &key));
    // Registered just in time on GitHub with the pool's labels.
    let gh = stack
        .github
        .runner(name.as_str())
        .expect("JIT runner on GitHub");
    assert!(
        gh.labels.iter().any(|l| l == "runyard-pool=linux"),
        "{:?}",
        gh.labels
    );
    assert_eq!(stack.jit_calls(), 1);
    // Decisions are events; the allocator is down, so the first flavor.
    let requested = stack.runner_events("RunnerRequested").await;
    assert_eq!(requested.len(), 1);
    let Some(Body::RunnerRequested(r)) = &requested[0].body else {
        unreachable!()
    };
    assert_eq!(
        (r.flavor.as_str(), r.allocator_unavailable),
        ("small", true)
    );
    assert_eq!(r.job.as_ref().map(|j| j.job_id), Some(101));
    assert!(
        requested[0].id.starts_with("runner:") && requested[0].id.ends_with(":requested"),
        "{}",
        requested[0].id
    );
    let pools = scaler.pools().await;
    assert_eq!(pools["pools"][0]["name"], "linux");
    assert_eq!(pools["pools"][0]["actual"], 1, "{pools}");

    stack.started(101, &name).await;
    stack.completed(101, &name).await;
    until("the runner gone", || stack.live_processes().is_empty()).await;
    // The instance goes first, then the event saying so.
    support::until_async("RunnerDeleted", async || {
        stack.runner_events("RunnerDeleted").await.len() == 1
    })
    .await;
    assert_eq!(stack.runner_events("RunnerAssigned").await.len(), 1);
    assert_eq!(stack.jit_calls(), 1, "no second runner");
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicated_and_out_of_order_events_create_nothing_extra() {
    let stack = Stack::new(&pool_toml(20, 0, "")).await;
    // Finished (or started) before their `queued` arrives: no runner.
    stack.completed(201, "someone-else").await;
    stack.queued(201).await;
    stack.started(202, "someone-else").await;
    stack.queued(202).await;
    // The same job seen through an org hook and a repo hook, three times
    // each, and JetStream redelivering the very same message.
    for _ in 0..3 {
        stack.queued(203).await;
        stack.queued(204).await;
    }
    let again = support::job_event("github:same", 205, JobStatus::Queued, "", &["linux"]);
    for _ in 0..3 {
        stack.publish(again.clone()).await;
    }
    let scaler = stack.start().await;
    until("three runners", || stack.live_processes().len() == 3).await;
    // Whatever else the log could make it do, it has done.
    stack.settled(&scaler).await;
    assert_eq!(stack.live_processes().len(), 3);
    assert_eq!(stack.jit_calls(), 3);
    let names = runner_names(&stack.runner_events("RunnerRequested").await);
    assert_eq!(names.len(), 3, "{names:?}");
    // A restart replays the log and creates nothing again.
    scaler.stop().await;
    let scaler = stack.start().await;
    stack.settled(&scaler).await;
    assert_eq!(stack.jit_calls(), 3);
    assert_eq!(stack.live_processes().len(), 3);
    scaler.stop().await;
}

/// Plays the forge: each live runner takes the oldest waiting job, runs it
/// briefly and finishes. Returns when every job has run exactly once.
async fn drain(stack: &Stack, jobs: &[u64], max: usize) -> usize {
    let mut waiting: Vec<u64> = jobs.to_vec();
    let mut running: BTreeMap<String, u64> = BTreeMap::new();
    let mut used: HashSet<String> = HashSet::new();
    let mut peak = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    while !waiting.is_empty() || !running.is_empty() {
        if tokio::time::Instant::now() > deadline {
            let events = stack.events().await;
            let mut story = Vec::new();
            for e in &events {
                let line = format!("{} {:?}", e.id, e.body);
                if waiting
                    .iter()
                    .any(|j| line.contains(&format!("job_id: {j} ")))
                    || e.id.starts_with("runner:") && !line.contains("RunnerRequested")
                {
                    story.push(line.chars().take(220).collect::<String>());
                }
            }
            panic!(
                "jobs left: {waiting:?} waiting, {} running; live {:?}\n{}",
                running.len(),
                stack.live_processes(),
                story.join("\n")
            );
        }
        let live = stack.live_processes();
        peak = peak.max(live.len());
        assert!(live.len() <= max, "{} runners alive, max {max}", live.len());
        // Finish what ran, then start new ones.
        for (runner, job) in std::mem::take(&mut running) {
            stack.completed(job, &runner).await;
        }
        for runner in live {
            if used.contains(&runner) || waiting.is_empty() {
                continue;
            }
            let job = waiting.remove(0);
            used.insert(runner.clone());
            stack.started(job, &runner).await;
            running.insert(runner, job);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_gets_exactly_max_runners_then_more_as_jobs_finish() {
    // The matrix burst: 500 jobs queued within seconds, 50 runners at most.
    const JOBS: u64 = 500;
    const MAX: usize = 50;
    let stack = Stack::new(&pool_toml(MAX as u32, 0, "")).await;
    let scaler = stack.start().await;
    let jobs: Vec<u64> = (1..=JOBS).map(|n| 10_000 + n).collect();
    for &j in &jobs {
        stack.queued(j).await;
    }
    until("max runners", || stack.live_processes().len() == MAX).await;
    stack.settled(&scaler).await;
    assert_eq!(stack.jit_calls(), MAX, "exactly max at first");
    let peak = drain(&stack, &jobs, MAX).await;
    assert_eq!(peak, MAX);
    until("every runner gone", || stack.live_processes().is_empty()).await;
    let names = runner_names(&stack.runner_events("RunnerRequested").await);
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(names.len(), JOBS as usize, "one runner per job");
    assert_eq!(unique.len(), names.len());
    assert_eq!(stack.jit_calls(), JOBS as usize);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_runner_is_never_deleted_even_when_github_says_it_is_idle() {
    let stack = Stack::new(&pool_toml(5, 0, "")).await;
    // GitHub's busy flag lags by 30 s (longer than the 3 s confirmation
    // window, so the API says "idle" throughout); deletes of really busy
    // runners get 422.
    stack.github.set_busy_lag(Duration::from_secs(30));
    let scaler = stack.start().await;
    stack.queued(301).await;
    until("a runner", || stack.live_processes().len() == 1).await;
    let name = stack.live_processes().into_iter().next().unwrap();
    stack.github.set_online(name.as_str());
    wait_idle(&scaler, 1).await;
    // The job is cancelled before the runner took it: the runner is free,
    // online and above min_idle: it goes after idle_timeout (1 s) once
    // GitHub confirms it idle for the 3 s window...
    stack.completed(301, "").await;
    // ... but GitHub hands it another job meanwhile (its webhook lost),
    // once the scaler has read it idle once, and the lagging API still
    // says idle.
    let id = stack.github.runner(name.as_str()).expect("registered").id;
    let reading = format!("/orgs/acme/actions/runners/{id}");
    let read_before = stack.github.count("GET", &reading);
    until("an idle reading of the runner", || {
        stack.github.count("GET", &reading) > read_before
    })
    .await;
    stack.github.set_busy(name.as_str(), true);
    // The scaler tries (the lagging API said idle through the window) and
    // takes GitHub's 422 as "busy": the instance stays, and stays.
    until("the delete attempted", || stack.github.busy_refusals() >= 1).await;
    stack.settled(&scaler).await;
    assert!(stack.live_processes().contains(&name), "busy runner kept");
    assert_eq!(
        stack.github.busy_refusals(),
        1,
        "422 is not retried as an error"
    );
    // When the job it took finishes, it goes.
    stack.github.set_busy(name.as_str(), false);
    stack.completed(399, &name).await;
    until("the runner removed", || stack.live_processes().is_empty()).await;
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_idle_is_kept_warm_and_an_idle_runner_gets_the_job() {
    let stack = Stack::new(&pool_toml(5, 2, "")).await;
    let scaler = stack.start().await;
    until("two warm runners", || stack.live_processes().len() == 2).await;
    for name in stack.live_processes() {
        stack.github.set_online(name.as_str());
    }
    // Wait until the scaler has seen them online.
    wait_idle(&scaler, 2).await;
    stack.queued(401).await;
    // One warm runner is about to be used: another is made to keep two...
    until("min_idle topped up", || stack.jit_calls() == 3).await;
    stack.settled(&scaler).await;
    // ... but none for the job itself while an idle runner could take it.
    let for_jobs = |evs: &[runyard_events::Event]| {
        evs.iter()
            .filter(
                |e| matches!(&e.body, Some(Body::RunnerRequested(r)) if r.reason == "queued_job"),
            )
            .count()
    };
    assert_eq!(for_jobs(&stack.runner_events("RunnerRequested").await), 0);
    let taker = stack.live_processes().into_iter().next().unwrap();
    stack.started(401, &taker).await;
    stack.completed(401, &taker).await;
    until("the used runner gone", || {
        !stack.live_processes().contains(&taker)
    })
    .await;
    stack.settled(&scaler).await;
    assert_eq!(stack.live_processes().len(), 2);
    assert_eq!(for_jobs(&stack.runner_events("RunnerRequested").await), 0);
    scaler.stop().await;
}

fn failed_attempts(events: &[runyard_events::Event]) -> Vec<(u32, String, bool)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerFailed(f)) => Some((f.attempt, f.reason.clone(), f.given_up)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_faults_are_retried_at_most_five_times_and_leak_nothing() {
    let (stack, fake) = external_stack("v0.1.0", "3s", "").await;
    fake.set_faults(
        "CreateInstance",
        &["exit1", "hang", "error_status", "malformed"],
    );
    let scaler = stack.start().await;
    stack.queued(501).await;
    let creates = || fake.calls_of("CreateInstance").len();
    until("an instance after four faults", || {
        creates() == 5 && fake.instance_names().len() == 1
    })
    .await;
    support::until_async("the success recorded", async || {
        !stack.runner_events("RunnerCreated").await.is_empty()
    })
    .await;
    // The machine boots and its runner connects (before the 3 s bootstrap
    // timeout would reap it).
    let name_501 = fake.instance_names()[0].clone();
    stack.github.set_online(name_501.as_str());
    let failed = failed_attempts(&stack.events().await);
    assert_eq!(
        failed.iter().map(|f| f.0).collect::<Vec<_>>(),
        [1, 2, 3, 4],
        "{failed:?}"
    );
    assert!(failed.iter().all(|f| f.1 == "create_failed" && !f.2));
    // The protocol: a clean environment with the GARM_* variables.
    let all = fake.calls();
    let first = all
        .iter()
        .find(|c| c["command"] == "CreateInstance")
        .unwrap();
    assert_eq!(first["env"]["GARM_COMMAND"], "CreateInstance");
    assert_eq!(first["env"]["GARM_INTERFACE_VERSION"], "v0.1.0");
    assert!(
        first["env"]["GARM_POOL_ID"]
            .as_str()
            .is_some_and(|s| s.len() == 36)
    );
    assert!(first["env"].get("PATH").is_none() && first["env"].get("HOME").is_none());
    let boot: serde_json::Value = serde_json::from_str(first["stdin"].as_str().unwrap()).unwrap();
    assert_eq!(boot["flavor"], "small");
    assert_eq!(boot["jit_config_enabled"], true);

    // Five faults in a row: the job is given up, with an event saying so,
    // and nothing is left behind on the provider or on GitHub.
    fake.set_faults("CreateInstance", &["exit1"; 5]);
    stack.queued(502).await;
    support::until_async("the job given up", async || {
        failed_attempts(&stack.events().await).iter().any(|f| f.2)
    })
    .await;
    assert_eq!(
        fake.instance_names().len(),
        1,
        "only the first job's instance"
    );
    let name_502 = runyard_events::instance_name(
        "linux",
        &runyard_events::claim_key(runyard_events::Forge::Github, "github.com", 502, 1),
    );
    assert!(
        stack.github.runner(name_502.as_str()).is_none(),
        "JIT registration removed"
    );
    assert_eq!(creates(), 10);
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    assert!(
        fake.children().into_iter().all(|pid| !fake::alive(pid)),
        "the hung call's child was killed with it"
    );
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_rate_limits_are_waited_out_and_every_job_is_served() {
    let stack = Stack::new(&pool_toml(20, 0, "")).await;
    stack.github.fail_next(4, 429, 1);
    let scaler = stack.start().await;
    for j in 601..=610 {
        stack.queued(j).await;
    }
    until("ten runners", || stack.live_processes().len() == 10).await;
    let events = stack.events().await;
    assert!(
        failed_attempts(&events).is_empty(),
        "rate limits are not failures"
    );
    assert_eq!(stack.runner_events("RunnerCreated").await.len(), 10);
    stack.github.fail_next(3, 403, 1);
    for j in 611..=615 {
        stack.queued(j).await;
    }
    until("fifteen runners", || stack.live_processes().len() == 15).await;
    scaler.stop().await;
}

/// A scaler process against the stack's fake GitHub.
fn spawn_replica(stack: &Stack, file: &std::path::Path) -> std::process::Child {
    support::spawn_replica(&stack.config(), file)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_one_killed_mid_burst_never_exceed_max_nor_double_a_job() {
    const JOBS: u64 = 120;
    const MAX: usize = 12;
    let stack = Stack::new(&pool_toml(MAX as u32, 0, "")).await;
    let file = stack.write_file();
    let mut replicas = support::Replicas((0..3).map(|_| spawn_replica(&stack, &file)).collect());
    let jobs: Vec<u64> = (1..=JOBS).map(|n| 20_000 + n).collect();
    for &j in &jobs[..60] {
        stack.queued(j).await;
    }
    until("runners from some replica", || {
        stack.live_processes().len() >= MAX / 2
    })
    .await;
    // SIGKILL the pool's lease holder (its lease value starts with its
    // pid), the process only: the runners it started live on.
    let js = stack.bus.jetstream();
    let leases = js
        .get_key_value(format!("{}_LEASES", stack.ns.as_str().to_ascii_uppercase()))
        .await
        .unwrap();
    let holder = leases.get("linux").await.unwrap().expect("a lease holder");
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
        .expect("holder is a replica");
    let victim = replicas.0.remove(at);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    for &j in &jobs[60..] {
        stack.queued(j).await;
    }
    let peak = drain(&stack, &jobs, MAX).await;
    assert!(peak <= MAX);
    until("every runner gone", || stack.live_processes().is_empty()).await;
    // No job had two runners made for it. Pool runners replace runners the
    // dead replica left half made whose jobs went to other runners: at most
    // one per create it had under way, so never more than max_runners.
    let requested = stack.runner_events("RunnerRequested").await;
    let mut per_job: BTreeMap<u64, usize> = BTreeMap::new();
    let mut replacements = 0;
    for e in &requested {
        if let Some(Body::RunnerRequested(r)) = &e.body {
            match &r.job {
                Some(j) => *per_job.entry(j.job_id).or_default() += 1,
                None => replacements += 1,
            }
        }
    }
    assert!(
        per_job.values().all(|n| *n == 1),
        "a job with two runners: {per_job:?}"
    );
    assert!(replacements <= MAX, "{replacements} replacement runners");
    let names = runner_names(&requested);
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "no runner requested twice");
    // Every runner was registered once on GitHub, bar those a dying replica
    // left half made (re-registered under the same name).
    assert!(
        stack.jit_calls() <= names.len() + MAX,
        "{} JIT calls",
        stack.jit_calls()
    );
    replicas.0.push(victim);
}

/// Every `runyard_scaler_*` family the scaler declares has a panel in
/// `deploy/grafana/dashboards/runyard.json`, and every scaler series a panel
/// queries exists with the suffix its type gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_covers_every_scaler_metric() {
    // A webhook pool and a scale-set pool: every family has series.
    let stack = Stack::new(&format!(
        "{}{}",
        pool_toml(2, 1, ""),
        crate::scaleset::scale_set_pool(1)
    ))
    .await;
    let actions = runyard_testkit::fake_actions::FakeActions::start().await;
    stack.github.connect_actions(&actions);
    let scaler = stack.start().await;
    until("a warm runner", || stack.live_processes().len() == 1).await;
    let page = reqwest::get(format!("http://{}/metrics", scaler.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let declared = runyard_testkit::dashboard::declared(&page);
    assert!(
        declared.contains_key("runyard_scaler_pool_desired_runners"),
        "{page}"
    );
    let exposed = runyard_testkit::dashboard::exposed(&declared);
    let dashboard = runyard_testkit::dashboard::dashboard();
    let mut used = HashSet::new();
    for (_, exprs) in runyard_testkit::dashboard::panels(&dashboard) {
        for expr in &exprs {
            let ours = runyard_testkit::dashboard::series_in(expr)
                .into_iter()
                .filter(|s| s.starts_with("runyard_scaler_"));
            for series in ours {
                let family = exposed.get(series).unwrap_or_else(|| {
                    panic!("{expr} queries {series}, which the scaler does not expose")
                });
                used.insert(family.clone());
            }
        }
    }
    let unused: Vec<&String> = declared.keys().filter(|f| !used.contains(*f)).collect();
    assert!(unused.is_empty(), "scaler metrics on no panel: {unused:?}");
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_job_is_matched_by_its_tags_and_gets_an_ephemeral_runner() {
    let pools = support::GITLAB_POOL;
    let stack = Stack::new(pools).await;
    let gitlab = runyard_testkit::fake_gitlab::FakeGitLab::start().await;
    let job_id = gitlab.add_job(
        34,
        runyard_testkit::fake_gitlab::FakeGlJob::pending(77, "compile", &["Docker"]),
    );
    let other = gitlab.add_job(
        34,
        runyard_testkit::fake_gitlab::FakeGlJob::pending(77, "gpu", &["gpu"]),
    );
    let mut config = stack.config();
    config.gitlab_api_url = Some(gitlab.url());
    config.gitlab_token = Some("glpat-test".to_owned().into());
    let scaler = stack.start_with(config).await;
    let gitlab_event = |id: &str, job: u64, status: JobStatus, runner: &str| {
        let mut e = support::job_event(id, job, status, runner, &[]);
        let src = e.source.as_mut().unwrap();
        src.forge = runyard_events::Forge::Gitlab as i32;
        src.instance = "gitlab.example.com".into();
        if let Some(Body::JobObserved(j)) = e.body.as_mut() {
            let key = j.job.as_mut().unwrap();
            key.forge = runyard_events::Forge::Gitlab as i32;
            key.instance = "gitlab.example.com".into();
            j.project_id = 34;
            j.project = "acme/app".into();
        }
        e
    };
    stack
        .publish(gitlab_event("gitlab:a", job_id, JobStatus::Queued, ""))
        .await;
    stack
        .publish(gitlab_event("gitlab:b", other, JobStatus::Queued, ""))
        .await;
    until("a runner for the docker job", || {
        stack.live_processes().len() == 1
    })
    .await;
    let runners = gitlab.runners();
    assert_eq!(runners.len(), 1, "none for the gpu job");
    assert_eq!(runners[0].tag_list, ["docker", "linux"]);
    assert!(!runners[0].run_untagged);
    assert_eq!(runners[0].project_id, Some(34));
    let name = stack.live_processes().into_iter().next().unwrap();
    stack
        .publish(gitlab_event(
            "gitlab:c",
            job_id,
            JobStatus::InProgress,
            &name,
        ))
        .await;
    stack
        .publish(gitlab_event(
            "gitlab:d",
            job_id,
            JobStatus::Completed,
            &name,
        ))
        .await;
    until("the runner gone", || stack.live_processes().is_empty()).await;
    until("deleted in GitLab", || gitlab.runners().is_empty()).await;
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_burst_is_reconciled_on_restart_and_orphans_are_removed() {
    const JOBS: u64 = 40;
    const MAX: usize = 10;
    let stack = Stack::new(&pool_toml(MAX as u32, 0, "")).await;
    // Left from an earlier life: an instance and a GitHub runner nothing owns.
    let pool_dir = stack.state_dir.path().join("local").join(
        runyard_scaler::pool_id(&runyard_scaler::controller_id(&stack.ns), "linux").to_string(),
    );
    std::fs::create_dir_all(&pool_dir).unwrap();
    use std::os::unix::process::CommandExt as _;
    let mut stray = std::process::Command::new("/bin/sleep")
        .arg("600")
        .process_group(0)
        .spawn()
        .unwrap();
    std::fs::write(
        pool_dir.join("ry-linux-0000000000.pid"),
        stray.id().to_string(),
    )
    .unwrap();
    let stray_gh =
        stack
            .github
            .add_runner("/orgs/acme", "ry-linux-ffffffffff", &["runyard-pool=linux"]);
    let scaler = stack.start().await;
    let jobs: Vec<u64> = (1..=JOBS).map(|n| 30_000 + n).collect();
    for &j in &jobs {
        stack.queued(j).await;
    }
    until("creates under way", || stack.live_processes().len() >= 4).await;
    // Crash: every operation in flight is dropped where it stands.
    scaler.kill();
    let scaler = stack.start().await;
    until("the stray instance removed", || {
        !stack.live_processes().contains("ry-linux-0000000000")
    })
    .await;
    until("the stray GitHub runner removed", || {
        stack.github.runner(stray_gh).is_none()
    })
    .await;
    let _ = stray.wait();
    let peak = drain(&stack, &jobs, MAX).await;
    assert!(peak <= MAX, "{peak}");
    until("every runner gone", || stack.live_processes().is_empty()).await;
    let names = runner_names(&stack.runner_events("RunnerRequested").await);
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "no runner requested twice");
    // Nothing of ours left on GitHub either.
    until("no runner left on GitHub", || {
        stack
            .github
            .runners()
            .iter()
            .all(|r| !r.labels.iter().any(|l| l == "runyard-pool=linux"))
    })
    .await;
    scaler.stop().await;
}

#[test]
fn the_shipped_scaler_file_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/scaler.toml");
    let file = runyard_scaler::ScalerFile::load(&path).expect("deploy/scaler.toml is valid");
    assert_eq!(file.pools.len(), 1);
    assert!(file.providers.contains_key(&file.pools[0].provider));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaler_starting_on_a_log_ending_in_other_events_catches_up_and_acts() {
    let stack = Stack::new(&pool_toml(5, 0, "")).await;
    stack.queued(901).await;
    // The log's last message is one the scaler does not follow.
    let now = runyard_events::timestamp(time::OffsetDateTime::now_utc());
    stack
        .publish(runyard_events::Event {
            id: "usage:github:github.com:1:1".into(),
            occurred_at: Some(now),
            received_at: Some(now),
            source: Some(runyard_events::Source {
                forge: runyard_events::Forge::Github as i32,
                instance: "github.com".into(),
                ..Default::default()
            }),
            body: Some(Body::UsageReported(runyard_events::UsageReported {
                job: Some(runyard_events::JobKey {
                    forge: runyard_events::Forge::Github as i32,
                    instance: "github.com".into(),
                    job_id: 1,
                }),
                attempt: 1,
                ..Default::default()
            })),
        })
        .await;
    let scaler = stack.start().await;
    until("a runner for the queued job", || {
        stack.live_processes().len() == 1
    })
    .await;
    let ready = reqwest::get(format!("http://{}/readyz", scaler.addr))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    scaler.stop().await;
}

/// Two pools for the same labels: `big` (priority 10, room for 2) and
/// `spare` (priority 0), both with the `local` provider.
fn two_pools(big_max: u32) -> String {
    format!(
        r#"
[[pools]]
name = "big"
forge = "github"
scope = {{ org = "acme" }}
labels = ["self-hosted", "linux"]
provider = "local"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}]
max_runners = {big_max}
priority = 10

[[pools]]
name = "spare"
forge = "github"
scope = {{ org = "acme" }}
labels = ["self-hosted", "linux"]
provider = "local"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}]
max_runners = 10
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spill_over_to_a_lower_priority_pool_when_the_top_one_is_full() {
    let stack = Stack::new(&two_pools(2)).await;
    let scaler = stack.start().await;
    for job in 1..=5 {
        stack.queued(job).await;
    }
    until("a runner for every job", || {
        stack.live_processes().len() == 5
    })
    .await;
    let mut per_pool: BTreeMap<String, usize> = BTreeMap::new();
    for e in stack.runner_events("RunnerRequested").await {
        if let Some(Body::RunnerRequested(r)) = &e.body {
            *per_pool
                .entry(
                    r.runner
                        .as_ref()
                        .map(|r| r.pool.clone())
                        .unwrap_or_default(),
                )
                .or_default() += 1;
        }
    }
    assert_eq!(
        per_pool,
        BTreeMap::from([("big".into(), 2), ("spare".into(), 3)]),
        "two in the full top pool, the rest spilled over"
    );
    let pools = scaler.pools().await;
    let queued: Vec<u64> = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["queued"].as_u64().unwrap())
        .collect();
    assert_eq!(queued.iter().sum::<u64>(), 5);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_no_pool_matches_is_said_once_and_gets_no_runner() {
    let stack = Stack::new(&pool_toml(10, 0, "")).await;
    let scaler = stack.start().await;
    stack
        .observe(5, JobStatus::Queued, "", &["self-hosted", "gpu"])
        .await;
    let unserved = async || {
        stack
            .events()
            .await
            .into_iter()
            .filter_map(|e| match e.body {
                Some(Body::JobUnserved(u)) => Some(u),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    support::until_async("the job said unserved", async || {
        !unserved().await.is_empty()
    })
    .await;
    // The same job again (a redelivery), and a second replica that reads
    // the log from the start: still said once.
    stack
        .observe(5, JobStatus::Queued, "", &["self-hosted", "gpu"])
        .await;
    let second = stack.start().await;
    stack.queued(6).await;
    until("a runner for the matching job", || stack.jit_calls() == 1).await;
    stack.settled(&scaler).await;
    stack.settled(&second).await;
    let said = unserved().await;
    assert_eq!(said.len(), 1, "{said:?}");
    let u = &said[0];
    assert_eq!(u.job.as_ref().map(|k| k.job_id), Some(5));
    assert_eq!(u.reason, "no_matching_pool");
    assert!(
        u.detail.contains("gpu") && u.detail.contains("linux"),
        "{}",
        u.detail
    );
    assert_eq!(stack.jit_calls(), 1, "no runner for the unmatched job");
    let series = "runyard_scaler_jobs_unserved_total{forge=\"github\",reason=\"no_matching_pool\"}";
    let counts = [
        scaler.metric(series).await.unwrap_or(0.0),
        second.metric(series).await.unwrap_or(0.0),
    ];
    assert_eq!(
        counts.iter().sum::<f64>(),
        1.0,
        "counted by one replica: {counts:?}"
    );
    second.stop().await;
    scaler.stop().await;
}

#[tokio::test]
async fn no_nats_password_in_the_debug_log() {
    let nats = runyard_testkit::nats_auth::SecuredNats::start().await;
    let log = runyard_testkit::nats_auth::debug_log_of(
        &nats,
        std::path::Path::new(env!("CARGO_BIN_EXE_runyard-scaler")),
        "scaler",
        &[
            (
                "RUNYARD_DATABASE_URL",
                "postgres://postgres@127.0.0.1:1/none",
            ),
            ("RUNYARD_SCALER_HTTP_LISTEN", "127.0.0.1:0"),
            ("RUNYARD_SCALER_METADATA_LISTEN", "127.0.0.1:0"),
        ],
        "scaler listening",
    )
    .await;
    runyard_testkit::nats_auth::assert_no_password(&nats, "scaler", &log);
    // It opened its buckets under its own user's permissions first.
    assert!(log.contains("scaler listening"), "{log}");
}
