//! Runner groups checked at start: a pool naming a group its organization
//! does not have, or one that shuts out the pool's repository, is refused.

use runyard_scaler::{App, ScalerFile};
use runyard_testkit::fake_github::FakeRunnerGroup;

use crate::support::{Stack, pool_toml};

async fn build_error(stack: &Stack) -> String {
    let file = ScalerFile::parse(&stack.file).expect("valid file");
    let err = App::build(stack.config(), Some(file))
        .await
        .expect_err("refused");
    format!("{err:#}")
}

fn repo_pool(group: u64) -> String {
    pool_toml(2, 0, &format!("runner_group_id = {group}")).replace(
        "scope = { org = \"acme\" }",
        "scope = { repo = \"acme/app\" }",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_naming_a_runner_group_that_does_not_exist_is_refused_at_start() {
    let stack = Stack::new(&pool_toml(2, 0, "runner_group_id = 9")).await;
    stack.github.add_runner_group(
        "/orgs/acme",
        FakeRunnerGroup::selected(7, "secure", &["acme/app"]),
    );
    let text = build_error(&stack).await;
    assert!(
        text.contains("pool \"linux\"")
            && text.contains("runner_group_id 9 is not a runner group of org acme")
            && text.contains("1 Default, 7 secure"),
        "{text}"
    );
    assert_eq!(
        stack
            .github
            .count("GET", "/orgs/acme/actions/runner-groups"),
        1
    );
    assert_eq!(
        stack
            .github
            .count("POST", "/orgs/acme/actions/runners/generate-jitconfig"),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_shuts_out_the_pools_repository_is_refused_and_one_that_admits_it_starts() {
    let stack = Stack::new(&repo_pool(7)).await;
    stack.github.add_runner_group(
        "/orgs/acme",
        FakeRunnerGroup::selected(7, "secure", &["acme/vault"]),
    );
    let text = build_error(&stack).await;
    assert!(
        text.contains("pool \"linux\"")
            && text.contains("runner group 7 (secure) admits only selected repositories")
            && text.contains("acme/app is not one of them"),
        "{text}"
    );
    assert_eq!(
        stack
            .github
            .count("GET", "/orgs/acme/actions/runner-groups/7/repositories"),
        1
    );

    // Admitted: the scaler starts and serves the repository's job.
    stack.github.add_runner_group(
        "/orgs/acme",
        FakeRunnerGroup::selected(7, "secure", &["acme/vault", "acme/app"]),
    );
    let scaler = stack.start().await;
    stack.queued(951).await;
    crate::support::until("a runner in group 7", || {
        stack
            .github
            .runners()
            .iter()
            .any(|r| r.runner_group_id == 7 && r.scope == "/repos/acme/app")
    })
    .await;
    scaler.stop().await;
}

/// Two org pools for the same labels: `secure` (priority 10, runner group 7
/// that admits `acme/vault` only) and `shared` (the default group).
fn group_pools(with_shared: bool) -> String {
    let secure = pool_toml(5, 0, "runner_group_id = 7\npriority = 10")
        .replace("name = \"linux\"", "name = \"secure\"");
    let shared = pool_toml(5, 0, "").replace("name = \"linux\"", "name = \"shared\"");
    if with_shared {
        format!("{secure}\n{shared}")
    } else {
        secure
    }
}

async fn unserved(stack: &Stack) -> Vec<runyard_events::JobUnserved> {
    stack
        .events()
        .await
        .into_iter()
        .filter_map(|e| match e.body {
            Some(runyard_events::Body::JobUnserved(u)) => Some(u),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_goes_only_to_pools_whose_runner_group_admits_its_repository() {
    let stack = Stack::new(&group_pools(true)).await;
    stack.github.add_runner_group(
        "/orgs/acme",
        FakeRunnerGroup::selected(7, "secure", &["acme/vault"]),
    );
    let scaler = stack.start().await;
    // `acme/app` (every test job's repository) is not admitted by group 7:
    // the job skips the higher-priority pool for the one that can run it.
    stack.queued(961).await;
    crate::support::until("a runner for the job", || stack.jit_calls() == 1).await;
    let pools: Vec<String> = stack
        .runner_events("RunnerRequested")
        .await
        .iter()
        .filter_map(|e| match &e.body {
            Some(runyard_events::Body::RunnerRequested(r)) => {
                r.runner.as_ref().map(|r| r.pool.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(pools, ["shared"]);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_only_a_shut_out_pool_matches_is_said_unserved_and_holds_no_runner() {
    let stack = Stack::new(&group_pools(false)).await;
    stack.github.add_runner_group(
        "/orgs/acme",
        FakeRunnerGroup::selected(7, "secure", &["acme/vault"]),
    );
    let scaler = stack.start().await;
    stack.queued(962).await;
    crate::support::until_async("the job said unserved", async || {
        !unserved(&stack).await.is_empty()
    })
    .await;
    let said = unserved(&stack).await;
    assert_eq!(said.len(), 1);
    assert_eq!(said[0].reason, "runner_group");
    assert!(
        said[0].detail.contains("secure") && said[0].detail.contains("acme/app"),
        "{}",
        said[0].detail
    );
    assert_eq!(stack.jit_calls(), 0, "no runner that could never run it");
    scaler.stop().await;
}
