//! The reconciler against a real nats-server and the fake forges: jobs whose
//! webhooks were lost are found by polling and served (and their runners
//! reaped), failed deliveries are redelivered once, GitLab pending jobs get
//! runners, and the API budget holds.

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, Instant};

use runyard_events::{Body, Event, Forge, JobStatus, claim_key, instance_name, status_token};
use runyard_testkit::fake_github::{FakeDelivery, FakeHook, FakeJob};
use runyard_testkit::fake_gitlab::{FakeGitLab, FakeGlJob};

use crate::support::{self, Scaler, Stack, pool_toml, until, until_async};

/// The reconciler section every test starts from.
fn reconciler(body: &str) -> String {
    format!("\n[reconciler]\ninterval = \"1s\"\n{body}\n")
}

/// The runner the `linux` pool makes for GitHub job `job` (attempt 1).
fn runner_of(job: u64) -> String {
    instance_name("linux", &claim_key(Forge::Github, "github.com", job, 1))
}

/// A `workflow_job` webhook as ingest publishes it, for job `job` of run
/// `run` of `acme/app`.
async fn webhook(stack: &Stack, job: u64, run: u64, status: JobStatus, runner: &str) {
    let id = format!("github:hook-{job}-{}", status_token(status));
    let mut event = support::job_event(&id, job, status, runner, &["self-hosted", "linux"]);
    if let Some(Body::JobObserved(j)) = event.body.as_mut() {
        j.pipeline_id = run;
    }
    stack.publish(event).await;
}

/// One series' value on the scaler's `/metrics` (0 when absent).
async fn metric(scaler: &Scaler, series: &str) -> f64 {
    scaler.metric(series).await.unwrap_or(0.0)
}

fn cycles(outcome: &str) -> String {
    format!("runyard_scaler_reconciler_cycles_total{{outcome=\"{outcome}\"}}")
}

fn event_ids(events: &[Event]) -> HashSet<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_queued_and_completed_webhooks_are_found_every_job_served_and_every_runner_reaped() {
    const JOBS: u64 = 40;
    const PER_RUN: u64 = 4;
    let mut stack = Stack::new(&pool_toml(50, 0, "")).await;
    stack
        .file
        .push_str(&reconciler("github_repos = [\"acme/app\"]"));
    let job = |i: u64| 40_000 + i;
    let run = |i: u64| 500 + (i - 1) / PER_RUN;
    // 5% of the `queued` and 5% of the `completed` deliveries never arrive.
    // Job 9's run ends with it (the run drops out of the listings); job 38's
    // run stays in progress while job 40 runs on.
    let lost_queued = [4, 17];
    let lost_completed = [9, 38];
    for i in 1..=JOBS {
        let mut j = FakeJob::queued(run(i), &format!("build {i}"), &["self-hosted", "linux"]);
        j.id = job(i);
        stack.github.add_job("acme", "app", j);
    }
    let scaler = stack.start().await;

    let started = Instant::now();
    for i in (1..=JOBS).filter(|i| !lost_queued.contains(i)) {
        webhook(&stack, job(i), run(i), JobStatus::Queued, "").await;
    }
    let everyone: HashSet<String> = (1..=JOBS).map(|i| runner_of(job(i))).collect();
    until("a runner for every job, lost queued ones included", || {
        stack.live_processes().is_superset(&everyone)
    })
    .await;
    let served_in = started.elapsed();
    eprintln!("every job served {served_in:?} after the webhooks");
    assert!(
        served_in < Duration::from_secs(20),
        "jobs waited {served_in:?}"
    );

    for i in 1..=JOBS {
        stack.github.set_job_runner(job(i), &runner_of(job(i)));
        stack.github.set_job_status(job(i), "in_progress", None);
        webhook(
            &stack,
            job(i),
            run(i),
            JobStatus::InProgress,
            &runner_of(job(i)),
        )
        .await;
    }
    for i in 1..JOBS {
        stack
            .github
            .set_job_status(job(i), "completed", Some("success"));
        if !lost_completed.contains(&i) {
            webhook(
                &stack,
                job(i),
                run(i),
                JobStatus::Completed,
                &runner_of(job(i)),
            )
            .await;
        }
    }
    let last = runner_of(job(JOBS));
    until(
        "every finished job's runner reaped, lost completions included",
        || stack.live_processes() == HashSet::from([last.clone()]),
    )
    .await;
    stack
        .github
        .set_job_status(job(JOBS), "completed", Some("success"));
    webhook(&stack, job(JOBS), run(JOBS), JobStatus::Completed, &last).await;
    until("every runner reaped", || stack.live_processes().is_empty()).await;

    let events = stack.events().await;
    let ids = event_ids(&events);
    for i in lost_queued {
        let id = format!("github:poll:github.com:{}:queued", job(i));
        assert!(ids.contains(&id), "{id} not published");
    }
    for i in lost_completed {
        let id = format!("github:poll:github.com:{}:completed", job(i));
        assert!(ids.contains(&id), "{id} not published");
    }
    for e in events.iter().filter(|e| e.id.contains(":poll:")) {
        assert_eq!(
            e.source.as_ref().map(|s| s.producer.as_str()),
            Some("reconciler")
        );
    }
    // One runner per job, however many times a job was told about.
    let requested = stack.runner_events("RunnerRequested").await;
    let jobs: BTreeSet<u64> = requested
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerRequested(r)) => r.job.as_ref().map(|j| j.job_id),
            _ => None,
        })
        .collect();
    assert_eq!(requested.len() as u64, JOBS);
    assert_eq!(jobs.len() as u64, JOBS);
    let found = metric(
        &scaler,
        "runyard_scaler_reconciler_found_total{kind=\"github_job\"}",
    )
    .await;
    assert!(found >= 4.0, "found {found}");
    assert!(metric(&scaler, &cycles("complete")).await >= 1.0);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_deliveries_of_org_and_repo_hooks_are_redelivered_once_by_numeric_id() {
    let mut stack = Stack::new(&pool_toml(5, 0, "")).await;
    stack.file.push_str(&reconciler(
        "github_hooks = [{ org = \"acme\", hook_id = 42 }, { repo = \"acme/app\", hook_id = 7 }]",
    ));
    let org = FakeHook::Org {
        org: "acme".into(),
        hook_id: 42,
    };
    let repo = FakeHook::Repo {
        owner: "acme".into(),
        repo: "app".into(),
        hook_id: 7,
    };
    let gh = &stack.github;
    gh.add_delivery(
        org.clone(),
        FakeDelivery::workflow_job("g-ok", "queued", 202),
    );
    let org_failed = gh.add_delivery(
        org.clone(),
        FakeDelivery::workflow_job("g-org-lost", "queued", 502),
    );
    // Failed once, then delivered: nothing to do.
    gh.add_delivery(
        org.clone(),
        FakeDelivery::workflow_job("g-retried", "completed", 500),
    );
    gh.add_delivery(
        org.clone(),
        FakeDelivery::workflow_job("g-retried", "completed", 200),
    );
    let repo_failed = gh.add_delivery(
        repo.clone(),
        FakeDelivery::workflow_job("g-repo-lost", "completed", 0),
    );
    gh.add_delivery(
        repo.clone(),
        FakeDelivery::workflow_job("g-repo-ok", "queued", 200),
    );
    let scaler = stack.start().await;

    until("both failures redelivered", || {
        stack.github.redeliveries().len() >= 2
    })
    .await;
    // A few more cycles: nothing more goes out.
    let after = metric(&scaler, &cycles("complete")).await;
    until_async("three more cycles", async || {
        metric(&scaler, &cycles("complete")).await >= after + 3.0
    })
    .await;
    let mut redelivered = stack.github.redeliveries();
    redelivered.sort_by_key(|(_, id)| *id);
    assert_eq!(
        redelivered,
        [(org.clone(), org_failed), (repo.clone(), repo_failed)]
    );
    assert_eq!(
        stack.github.count(
            "POST",
            &format!("/orgs/acme/hooks/42/deliveries/{org_failed}/attempts")
        ),
        1
    );
    assert_eq!(
        stack.github.count(
            "POST",
            &format!("/repos/acme/app/hooks/7/deliveries/{repo_failed}/attempts")
        ),
        1
    );
    assert_eq!(
        metric(
            &scaler,
            "runyard_scaler_reconciler_found_total{kind=\"redelivery\"}"
        )
        .await,
        2.0
    );
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gitlab_pending_job_whose_hook_was_lost_gets_a_runner() {
    let pools = support::GITLAB_POOL;
    let mut stack = Stack::new(pools).await;
    stack.file.push_str(&reconciler("gitlab_projects = [34]"));
    let gitlab = FakeGitLab::start().await;
    let job = gitlab.add_job(34, FakeGlJob::pending(77, "compile", &["Docker"]));
    let running = gitlab.add_job(34, FakeGlJob::pending(77, "lint", &["docker"]));
    gitlab.set_job_status(running, "running", None);
    let mut config = stack.config();
    config.gitlab_api_url = Some(gitlab.url());
    config.gitlab_token = Some("glpat-test".to_owned().into());
    let scaler = stack.start_with(config).await;

    until("a runner for the pending job", || {
        stack.live_processes().len() == 1 && gitlab.runners().len() == 1
    })
    .await;
    let runner = &gitlab.runners()[0];
    assert_eq!(runner.tag_list, ["docker", "linux"]);
    assert_eq!(runner.project_id, Some(34));

    let events = stack.events().await;
    let id = format!("gitlab:poll:gitlab.example.com:{job}:queued");
    let polled = events.iter().find(|e| e.id == id).expect("the poll event");
    let Some(Body::JobObserved(j)) = &polled.body else {
        panic!("not a JobObserved: {polled:?}");
    };
    assert_eq!(j.status(), JobStatus::Queued);
    assert_eq!(j.labels, ["Docker"]);
    assert_eq!((j.project_id, j.pipeline_id), (34, 77));
    assert!(
        !events
            .iter()
            .any(|e| e.id.contains(&format!(":{running}:"))),
        "a running job is not pending"
    );
    assert_eq!(
        metric(
            &scaler,
            "runyard_scaler_reconciler_found_total{kind=\"gitlab_job\"}"
        )
        .await,
        1.0
    );
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reconciler_stops_spending_when_its_budget_is_spent() {
    let mut stack = Stack::new(&pool_toml(10, 0, "")).await;
    stack.file.push_str(&reconciler(
        "github_repos = [\"acme/app\"]\napi_budget_per_hour = 3",
    ));
    for run in 1..=3 {
        stack.github.add_job(
            "acme",
            "app",
            FakeJob::queued(run, "build", &["self-hosted", "linux"]),
        );
    }
    let scaler = stack.start().await;
    until_async("three cycles cut short by the budget", async || {
        metric(&scaler, &cycles("budget_exhausted")).await >= 3.0
    })
    .await;
    // Both run listings and one run's jobs, then nothing more.
    assert_eq!(stack.github.count("GET", "/repos/acme/app/"), 3);
    assert_eq!(
        metric(
            &scaler,
            "runyard_scaler_reconciler_api_calls_total{forge=\"github\"}"
        )
        .await,
        3.0
    );
    assert_eq!(metric(&scaler, &cycles("complete")).await, 0.0);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_deployment_whose_queued_webhook_was_lost_gets_a_runner() {
    let mut stack = Stack::new(&pool_toml(10, 0, "")).await;
    stack
        .file
        .push_str(&reconciler("github_repos = [\"acme/app\"]"));
    let scaler = stack.start().await;
    let gh = &stack.github;
    let deploy = gh.add_waiting_job(
        "acme",
        "app",
        FakeJob::queued(900, "deploy", &["self-hosted", "linux"]),
    );
    stack.deliver_github(gh.take_webhooks()).await;
    gh.approve(deploy);
    // The `queued` delivery never arrives.
    assert_eq!(gh.take_webhooks().len(), 1);
    until("a runner for the approved job", || stack.jit_calls() == 1).await;
    let found: Vec<Event> = stack
        .events()
        .await
        .into_iter()
        .filter(|e| {
            e.source
                .as_ref()
                .is_some_and(|s| s.producer == "reconciler")
        })
        .collect();
    assert_eq!(found.len(), 1, "the reconciler published the lost queued");
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_every_failed_delivery_on_later_pages_is_redelivered_back_to_the_lookback()
{
    const FAILED: usize = 250;
    const TOO_OLD: usize = 120;
    let mut stack = Stack::new(&pool_toml(5, 0, "")).await;
    stack.file.push_str(&reconciler(
        "github_hooks = [{ org = \"acme\", hook_id = 42 }]\napi_budget_per_hour = 5000",
    ));
    let hook = FakeHook::Org {
        org: "acme".into(),
        hook_id: 42,
    };
    // Failed two days ago: older than the 24 h lookback (though GitHub
    // would still redeliver them), and listed after the recent ones.
    let two_days_ago = (time::OffsetDateTime::now_utc() - time::Duration::days(2))
        .format(&time::format_description::well_known::Rfc3339)
        .expect("rfc3339");
    let old: HashSet<u64> = (0..TOO_OLD)
        .map(|i| {
            let mut d = FakeDelivery::workflow_job(&format!("g-old-{i}"), "queued", 502);
            d.delivered_at = two_days_ago.clone();
            stack.github.add_delivery(hook.clone(), d)
        })
        .collect();
    // The outage: 250 deliveries ingest never answered, newest last.
    let failed: HashSet<u64> = (0..FAILED)
        .map(|i| {
            stack.github.add_delivery(
                hook.clone(),
                FakeDelivery::workflow_job(&format!("g-lost-{i}"), "queued", 503),
            )
        })
        .collect();
    let scaler = stack.start().await;

    until("every failed delivery redelivered", || {
        stack.github.redeliveries().len() >= FAILED
    })
    .await;
    // A few more cycles: nothing more goes out.
    let after = metric(&scaler, &cycles("complete")).await;
    until_async("three more cycles", async || {
        metric(&scaler, &cycles("complete")).await >= after + 3.0
    })
    .await;
    let redelivered: Vec<u64> = stack
        .github
        .redeliveries()
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert_eq!(redelivered.len(), FAILED, "each once");
    assert_eq!(
        redelivered.iter().copied().collect::<HashSet<_>>(),
        failed,
        "the 250 of the outage, on three pages"
    );
    assert!(
        redelivered.iter().all(|id| !old.contains(id)),
        "none older than the lookback"
    );
    // The first cycle read three pages: 100, 100, then the page where the
    // window ends (50 recent, 50 too old); never the fourth.
    let cursors: Vec<String> = stack
        .github
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path == "/orgs/acme/hooks/42/deliveries")
        .map(|r| r.query)
        .take(3)
        .collect();
    assert!(cursors[0].contains("per_page=100") && !cursors[0].contains("cursor="));
    assert!(
        cursors[1].contains("cursor=") && cursors[2].contains("cursor="),
        "{cursors:?}"
    );
    let pages_before_redelivering = stack
        .github
        .requests()
        .into_iter()
        .take_while(|r| r.method != "POST")
        .filter(|r| r.path == "/orgs/acme/hooks/42/deliveries")
        .count();
    assert_eq!(pages_before_redelivering, 3, "stopped at the window");
    assert_eq!(
        metric(
            &scaler,
            "runyard_scaler_reconciler_found_total{kind=\"redelivery\"}"
        )
        .await,
        FAILED as f64
    );
    scaler.stop().await;
}
