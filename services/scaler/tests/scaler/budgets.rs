//! GitHub's rate-limit budgets against the scaler: a spent budget is waited
//! out however long it takes, in queue order, without failing an attempt or
//! giving a job up; one resource's budget does not hold back another's.

use std::time::Duration;

use runyard_events::{Body, Event, Forge, claim_key, instance_name};

use crate::support::{Scaler, Stack, pool_toml, until, until_async};

/// One series' value on the scaler's `/metrics`, when present.
async fn metric(scaler: &Scaler, series: &str) -> Option<f64> {
    scaler.metric(series).await
}

/// An hour: GitHub's hourly budget can take that long to come back.
const HOUR: Duration = Duration::from_secs(3600);

fn runner_of(job: u64) -> String {
    instance_name("linux", &claim_key(Forge::Github, "github.com", job, 1))
}

/// (attempt, reason, given up) of every `RunnerFailed`.
fn failures(events: &[Event]) -> Vec<(u32, String, bool)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerFailed(f)) => Some((f.attempt, f.reason.clone(), f.given_up)),
            _ => None,
        })
        .collect()
}

/// (runner, attempt) of every `RunnerCreated`.
fn created(events: &[Event]) -> Vec<(String, u32)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerCreated(c)) => {
                Some((c.runner.as_ref().map(|r| r.name.clone())?, c.attempt))
            }
            _ => None,
        })
        .collect()
}

/// Names in the JIT-config requests GitHub served, in order.
fn served_jit_names(stack: &Stack, path: &str) -> Vec<String> {
    stack
        .github
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == path && r.status == 201)
        .filter_map(|r| {
            serde_json::from_str::<serde_json::Value>(&r.body)
                .ok()?
                .get("name")?
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_registration_budget_is_waited_out_and_jobs_are_served_in_queue_order() {
    let stack = Stack::new(&pool_toml(10, 0, "")).await;
    let jit = "/orgs/acme/actions/runners/generate-jitconfig";
    stack
        .github
        .exhaust_rate_limit("actions_runner_registration", HOUR);
    let scaler = stack.start().await;
    let jobs = [701, 702, 703, 704];
    for (n, job) in jobs.iter().enumerate() {
        stack.queued(*job).await;
        until_async("the job's runner requested", async || {
            stack.runner_events("RunnerRequested").await.len() == n + 1
        })
        .await;
    }
    // The first create learned the budget is spent (one 403); the others
    // queue behind it unsent; GET /rate_limit (free) is read meanwhile.
    until("the rate limit read while waiting", || {
        stack.github.count("GET", "/rate_limit") >= 5
    })
    .await;
    // Meanwhile core calls (the runner listings) are not held back.
    let listed_before = stack.github.count("GET", "/orgs/acme/actions/runners");
    until("core calls go on", || {
        stack.github.count("GET", "/orgs/acme/actions/runners") > listed_before + 1
    })
    .await;
    assert_eq!(
        stack.github.count("POST", jit),
        1,
        "one refusal, then unsent"
    );
    // The budget and the waiting creates are on /metrics.
    let registration = "{credential=\"token\",resource=\"actions_runner_registration\"}";
    until_async("the spent budget on /metrics", async || {
        metric(
            &scaler,
            &format!("runyard_scaler_github_rate_limit_budget_remaining{registration}"),
        )
        .await
            == Some(0.0)
    })
    .await;
    let (_, _, reset) = stack.github.rate_limit("actions_runner_registration");
    assert_eq!(
        metric(
            &scaler,
            &format!("runyard_scaler_github_rate_limit_budget_reset_seconds{registration}")
        )
        .await,
        Some(reset as f64)
    );
    assert_eq!(
        metric(&scaler, "runyard_scaler_creates_waiting_for_rate_limit").await,
        Some(jobs.len() as f64)
    );
    // The queue says why: each create waits out the budget, until when.
    let view = scaler.queue().await;
    let waiting: Vec<&serde_json::Value> = view["jobs"].as_array().unwrap().iter().collect();
    assert_eq!(waiting.len(), jobs.len(), "{view:#}");
    for job in waiting {
        assert_eq!(job["reason"], "rate_limited", "{view:#}");
        let detail = job["detail"].as_str().unwrap();
        assert!(
            detail.contains("github's rate limit") && detail.contains("until 20"),
            "{detail}"
        );
        assert!(detail.contains("4 creates in line"), "{detail}");
    }
    let events = stack.events().await;
    assert_eq!(failures(&events), [], "waiting is no failed attempt");
    assert!(created(&events).is_empty());
    assert!(stack.live_processes().is_empty());

    // The budget comes back (an hour later for GitHub).
    stack.github.advance_to_reset("actions_runner_registration");
    until("every job's runner", || {
        stack.live_processes().len() == jobs.len()
    })
    .await;
    let expected: Vec<String> = jobs.iter().map(|j| runner_of(*j)).collect();
    assert_eq!(
        served_jit_names(&stack, jit),
        expected,
        "served in the order the jobs were queued"
    );
    assert_eq!(stack.github.count("POST", jit), 1 + jobs.len());
    let events = stack.events().await;
    assert_eq!(failures(&events), [], "no forge_error, nothing given up");
    let mut made = created(&events);
    made.sort();
    let mut want: Vec<(String, u32)> = expected.iter().map(|n| (n.clone(), 1)).collect();
    want.sort();
    assert_eq!(made, want, "one attempt each");
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_core_budget_holds_the_downloads_read_without_failing_or_reaping() {
    // Three seconds to come online once made: the wait must not eat them.
    let (stack, fake) = crate::fake::external_stack("v0.1.0", "3s", "").await;
    let downloads = "/orgs/acme/actions/runners/downloads";
    let jit = "/orgs/acme/actions/runners/generate-jitconfig";
    stack.github.exhaust_rate_limit("core", HOUR);
    let scaler = stack.start().await;
    stack.queued(801).await;
    // Longer than the bootstrap timeout: 40 reads 100 ms apart.
    until("the rate limit read while waiting", || {
        stack.github.count("GET", "/rate_limit") >= 40
    })
    .await;
    // The runner-group check at start was refused (403, core spent), so
    // the client knows: the downloads read waits unsent.
    assert_eq!(
        stack
            .github
            .requests()
            .iter()
            .filter(|r| r.status == 403)
            .count(),
        1,
        "one refusal, then nothing sent against the spent budget"
    );
    assert_eq!(stack.github.count("GET", downloads), 0);
    assert_eq!(stack.github.count("POST", jit), 0, "nothing registered yet");
    assert!(fake.calls_of("CreateInstance").is_empty());
    let events = stack.events().await;
    assert_eq!(
        failures(&events),
        [],
        "a rate-limited read is no forge_error"
    );

    stack.github.advance_to_reset("core");
    until_async("the runner created", async || {
        !created(&stack.events().await).is_empty()
    })
    .await;
    stack.github.set_online(runner_of(801).as_str());
    until_async("the runner seen online", async || {
        !stack.runner_events("RunnerOnline").await.is_empty()
    })
    .await;
    let events = stack.events().await;
    assert_eq!(created(&events), [(runner_of(801), 1)]);
    assert_eq!(
        failures(&events),
        [],
        "no forge_error, and the wait did not count against its bootstrap time"
    );
    assert_eq!(stack.github.count("GET", downloads), 1);
    assert_eq!(stack.github.count("POST", jit), 1);
    assert_eq!(fake.calls_of("CreateInstance").len(), 1);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_core_budget_does_not_hold_back_jit_configs() {
    let stack = Stack::new(&pool_toml(5, 0, "")).await;
    let jit = "/orgs/acme/actions/runners/generate-jitconfig";
    stack.github.exhaust_rate_limit("core", HOUR);
    let scaler = stack.start().await;
    for job in [811, 812] {
        stack.queued(job).await;
    }
    until("both runners", || stack.live_processes().len() == 2).await;
    let mut served = served_jit_names(&stack, jit);
    served.sort();
    let mut want = vec![runner_of(811), runner_of(812)];
    want.sort();
    assert_eq!(
        served, want,
        "JIT configs spend actions_runner_registration"
    );
    assert_eq!(stack.github.count("POST", jit), 2);
    let (_, core_left, _) = stack.github.rate_limit("core");
    assert_eq!(core_left, 0, "core stayed spent throughout");
    assert_eq!(failures(&stack.events().await), []);
    scaler.stop().await;
}
