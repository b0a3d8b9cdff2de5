//! The forge REST clients against the fake GitHub and GitLab servers of
//! `runyard-testkit` (which this also tests).

use std::time::{Duration, Instant};

use runyard_forge::api::github::{
    self, DeleteRunner, GitHubAuth, GitHubClient, GitHubScope, HookRef,
};
use runyard_forge::api::gitlab::{self, GitLabClient, RunnerType};
use runyard_forge::api::{ApiError, ClientOptions};
use runyard_testkit::fake_github::{
    AppKey, FakeDelivery, FakeGitHub, FakeHook, FakeJob, FakeRerun, decode_jit_config,
};
use runyard_testkit::fake_gitlab::{FakeGitLab, FakeGlJob, FakeGlRetry, RunMode};
use secrecy::{ExposeSecret, SecretString};

const PAT: &str = "ghp_patsecretvalue0123456789";
const GL_TOKEN: &str = "glpat-secretvalue0123456789";
const TIMEOUT: Duration = Duration::from_secs(5);

fn labels(ls: &[&str]) -> Vec<String> {
    ls.iter().map(|l| (*l).to_owned()).collect()
}

async fn github_pat() -> (FakeGitHub, GitHubClient) {
    let gh = FakeGitHub::start().await;
    gh.require_token(PAT);
    let client = GitHubClient::new(
        &gh.url(),
        GitHubAuth::Token(SecretString::from(PAT)),
        TIMEOUT,
    )
    .expect("client");
    (gh, client)
}

async fn github_app(installation_id: Option<u64>) -> (FakeGitHub, GitHubClient) {
    let key = AppKey::shared();
    let gh = FakeGitHub::start().await;
    gh.enable_app(77, &key.public_pem);
    let client = GitHubClient::new(
        &gh.url(),
        GitHubAuth::App {
            app_id: 77,
            private_key_pem: SecretString::from(key.private_pem.clone()),
            installation_id,
        },
        TIMEOUT,
    )
    .expect("client");
    (gh, client)
}

async fn gitlab() -> (FakeGitLab, GitLabClient) {
    let gl = FakeGitLab::start().await;
    gl.require_token(GL_TOKEN);
    let client =
        GitLabClient::new(&gl.url(), SecretString::from(GL_TOKEN), TIMEOUT).expect("client");
    (gl, client)
}

fn org(name: &str) -> GitHubScope {
    GitHubScope::Org(name.into())
}

#[tokio::test]
async fn jit_runners_at_three_scopes() {
    let (gh, client) = github_pat().await;
    let scopes = [
        GitHubScope::repo("acme", "app"),
        org("acme"),
        GitHubScope::Enterprise("bigco".into()),
    ];
    let mut last_id = 0;
    for (i, scope) in scopes.iter().enumerate() {
        let name = format!("ry-linux-{i}");
        let jit = client
            .generate_jitconfig(
                scope,
                &name,
                3,
                &labels(&["linux", "runyard-pool=linux"]),
                None,
            )
            .await
            .expect("jit");
        assert!(jit.runner_id > last_id, "ids increase");
        last_id = jit.runner_id;
        assert_eq!(jit.name, name);
        let info = decode_jit_config(jit.encoded_jit_config.expose_secret()).expect("fake config");
        assert_eq!(
            (info.runner_id, info.name.as_str()),
            (jit.runner_id, name.as_str())
        );
        assert_eq!(info.scope, scope.path_prefix());

        let runner = gh.runner(jit.runner_id).expect("registered");
        assert_eq!(runner.scope, scope.path_prefix());
        assert_eq!(runner.status, "offline");
        assert_eq!(runner.runner_group_id, 3);
        assert_eq!(
            runner.labels,
            ["self-hosted", "Linux", "X64", "runyard-pool=linux"],
            "defaults plus the requested labels, case-insensitively deduplicated"
        );
        assert_eq!(
            gh.count(
                "POST",
                &format!("{}/actions/runners/generate-jitconfig", scope.path_prefix())
            ),
            1
        );
    }
    let sent = gh.requests().into_iter().next().expect("a request");
    let body: serde_json::Value = serde_json::from_str(&sent.body).expect("json body");
    assert_eq!(body["work_folder"], "_work");
    assert_eq!(body["labels"][1], "runyard-pool=linux");

    // The secret config stays out of Debug output.
    let jit = client
        .generate_jitconfig(&org("acme"), "ry-debug", 1, &labels(&["x"]), Some("w"))
        .await
        .expect("jit");
    assert!(!format!("{jit:?}").contains(jit.encoded_jit_config.expose_secret()));

    let dup = client
        .generate_jitconfig(&org("acme"), "ry-linux-1", 1, &labels(&["x"]), None)
        .await
        .expect_err("duplicate name");
    assert_eq!(dup.status(), Some(409));
    assert!(!dup.is_transient());
    assert!(
        dup.to_string()
            .contains(github::endpoint::GENERATE_JITCONFIG),
        "{dup}"
    );
}

#[tokio::test]
async fn runner_listings_follow_every_page() {
    let (gh, client) = github_pat().await;
    for i in 0..250 {
        gh.add_runner("/orgs/acme", &format!("r-{i:03}"), &["linux"]);
    }
    gh.add_runner("/orgs/other", "elsewhere", &["linux"]);

    let runners = client.list_runners(&org("acme")).await.expect("list");
    assert_eq!(runners.len(), 250);
    assert_eq!(runners[249].name, "r-249");
    assert!(runners.iter().all(|r| !r.is_online() && !r.busy));
    assert_eq!(gh.count("GET", "/orgs/acme/actions/runners"), 3);

    // Without Link headers the client pages by total_count.
    gh.set_link_headers(false);
    let runners = client.list_runners(&org("acme")).await.expect("list");
    assert_eq!(runners.len(), 250);
    assert_eq!(gh.count("GET", "/orgs/acme/actions/runners"), 6);

    // An exactly full last page ends the listing without another request.
    for i in 250..300 {
        gh.add_runner("/orgs/acme", &format!("r-{i:03}"), &["linux"]);
    }
    let runners = client.list_runners(&org("acme")).await.expect("list");
    assert_eq!(runners.len(), 300);
    assert_eq!(gh.count("GET", "/orgs/acme/actions/runners"), 9);
}

#[tokio::test]
async fn get_and_delete_runners() {
    let (gh, client) = github_pat().await;
    let scope = GitHubScope::repo("acme", "app");
    let jit = client
        .generate_jitconfig(&scope, "ry-a", 1, &labels(&["linux"]), None)
        .await
        .expect("jit");
    let id = jit.runner_id;

    gh.set_online("ry-a");
    let r = client
        .get_runner(&scope, id)
        .await
        .expect("get")
        .expect("exists");
    assert!(r.is_online() && !r.busy);
    assert_eq!(
        client.get_runner(&org("acme"), id).await.expect("get"),
        None,
        "other scope"
    );
    assert_eq!(client.get_runner(&scope, 9999).await.expect("get"), None);

    // GitHub's busy flag lags; a delete is refused while the runner is really busy.
    gh.set_busy_lag(Duration::from_secs(60));
    gh.set_busy("ry-a", true);
    let listed = client.list_runners(&scope).await.expect("list");
    assert!(!listed[0].busy, "the API still reports the stale value");
    assert_eq!(
        client.delete_runner(&scope, id).await.expect("delete"),
        DeleteRunner::Busy
    );
    assert_eq!(gh.busy_refusals(), 1);

    gh.set_busy("ry-a", false);
    assert_eq!(
        client.delete_runner(&scope, id).await.expect("delete"),
        DeleteRunner::Deleted
    );
    assert_eq!(
        client.delete_runner(&scope, id).await.expect("delete"),
        DeleteRunner::NotFound
    );
    assert_eq!(gh.deleted_while_busy(), 0);
    assert!(gh.runners().is_empty());

    // The fake's model of a job handed out just as the delete arrives.
    let other = gh.add_runner("/repos/acme/app", "ry-b", &[]);
    gh.set_busy(other, true);
    gh.set_delete_checks_busy(false);
    assert_eq!(
        client.delete_runner(&scope, other).await.expect("delete"),
        DeleteRunner::Deleted
    );
    assert_eq!(gh.deleted_while_busy(), 1);
}

#[tokio::test]
async fn retry_after_refusals_make_the_next_call_wait() {
    for status in [429, 403] {
        let (gh, client) = github_pat().await;
        gh.fail_next(1, status, 1);
        let err = client
            .list_runners(&org("acme"))
            .await
            .expect_err("refused");
        match &err {
            ApiError::RateLimited { retry_after } => {
                assert_eq!(*retry_after, Duration::from_secs(1))
            }
            other => panic!("expected RateLimited, got {other:?}"),
        }
        assert!(err.is_transient());
        assert_eq!(client.calls().rate_limited, 1);

        let started = Instant::now();
        client
            .list_runners(&org("acme"))
            .await
            .expect("after waiting");
        assert!(
            started.elapsed() >= Duration::from_millis(900),
            "the second call waited for Retry-After ({:?})",
            started.elapsed()
        );
        let statuses: Vec<u16> = gh.requests().iter().map(|r| r.status).collect();
        assert_eq!(statuses, [status, 200], "nothing was sent during the wait");
    }
}

#[tokio::test]
async fn a_plain_403_is_not_a_rate_limit() {
    let (gh, client) = github_pat().await;
    gh.add_job("acme", "app", FakeJob::queued(1, "build", &["linux"]));
    let err = client
        .rerun_failed_jobs("acme", "app", 1)
        .await
        .expect_err("in progress");
    assert_eq!(err.status(), Some(403));
    assert!(!err.is_transient());
    // Not counted as a rate limit, and no "not before" was recorded.
    assert_eq!(client.calls().rate_limited, 0);
    client.get_run("acme", "app", 1).await.expect("run");
}

#[tokio::test]
async fn an_exhausted_budget_waits_for_the_reset() {
    let (gh, client) = github_pat().await;
    // A two-second window: the reset is 1-2 s away after the second call.
    gh.set_rate_limit(2, Duration::from_secs(2));
    let scope = org("acme");
    client.list_runners(&scope).await.expect("1st");
    assert_eq!(client.rate_limit_remaining(), Some(1));
    client.list_runners(&scope).await.expect("2nd");
    assert_eq!(client.rate_limit_remaining(), Some(0));

    let started = Instant::now();
    client
        .list_runners(&scope)
        .await
        .expect("3rd, after the reset");
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "waited for the reset ({:?})",
        started.elapsed()
    );
    assert!(
        gh.requests().iter().all(|r| r.status == 200),
        "never refused"
    );
    assert_eq!(client.rate_limit_remaining(), Some(1));
}

#[tokio::test]
async fn a_reset_beyond_the_wait_bound_fails_unsent() {
    let gh = FakeGitHub::start().await;
    gh.set_rate_limit(1, Duration::from_secs(120));
    let client = GitHubClient::with_options(
        &gh.url(),
        GitHubAuth::Token(SecretString::from(PAT)),
        &ClientOptions::new(TIMEOUT).with_max_rate_limit_wait(Duration::from_millis(200)),
    )
    .expect("client");
    client.list_runners(&org("acme")).await.expect("1st");
    let err = client
        .list_runners(&org("acme"))
        .await
        .expect_err("budget gone");
    assert!(
        matches!(err, ApiError::RateLimited { retry_after } if retry_after > Duration::from_secs(60)),
        "{err:?}"
    );
    assert_eq!(gh.requests().len(), 1, "the refused call was not sent");
    assert_eq!(client.calls().get(github::endpoint::LIST_RUNNERS), 1);
}

#[tokio::test]
async fn app_tokens_are_fetched_once_cached_and_refreshed() {
    let (gh, client) = github_app(None).await;
    gh.add_installation("orgs/acme", 42);
    // Tokens live 62 s: the client replaces them a minute early, so after
    // a second or two.
    gh.set_token_ttl(Duration::from_secs(62));
    let scope = org("acme");
    for _ in 0..3 {
        client.list_runners(&scope).await.expect("list");
    }
    assert_eq!(gh.tokens_issued(), 1);
    assert_eq!(gh.count("GET", "/orgs/acme/installation"), 1);
    assert_eq!(gh.count("POST", "/app/installations/42/access_tokens"), 1);
    let calls = client.calls();
    assert_eq!(calls.get(github::endpoint::ACCESS_TOKEN), 1);
    assert_eq!(calls.get(github::endpoint::INSTALLATION), 1);
    assert_eq!(calls.get(github::endpoint::LIST_RUNNERS), 3);

    // Installation look-ups and token requests carry the JWT; API calls the token.
    for r in gh.requests() {
        let cred = r.credential.expect("authenticated");
        if r.path.starts_with("/app/") || r.path.ends_with("/installation") {
            assert_eq!(cred.matches('.').count(), 2, "a JWT: {}", r.path);
        } else {
            assert!(cred.starts_with("Bearer ghs_"), "{}", r.path);
        }
    }

    let deadline = Instant::now() + Duration::from_secs(10);
    while gh.tokens_issued() < 2 {
        assert!(Instant::now() < deadline, "the token was never refreshed");
        client.list_runners(&scope).await.expect("list");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        gh.count("GET", "/orgs/acme/installation"),
        1,
        "the installation stays cached"
    );

    // A token GitHub stops accepting is replaced at once.
    gh.revoke_tokens();
    client
        .list_runners(&scope)
        .await
        .expect("list with a fresh token");
    assert_eq!(gh.tokens_issued(), 3);
}

#[tokio::test]
async fn app_installations_per_scope_or_fixed() {
    let (gh, client) = github_app(None).await;
    gh.add_installation("orgs/acme", 1);
    gh.add_installation("orgs/beta", 2);
    gh.add_installation("enterprises/bigco", 3);
    for scope in [org("acme"), org("beta"), GitHubScope::repo("acme", "app")] {
        client
            .generate_jitconfig(&scope, "ry-x", 1, &labels(&["linux"]), None)
            .await
            .expect("jit with the scope's installation");
    }
    assert_eq!(
        gh.tokens_issued(),
        2,
        "acme/app uses the acme installation's token"
    );
    // Enterprise runner endpoints refuse installation tokens: not tried.
    let before = gh.requests().len();
    let err = client
        .generate_jitconfig(
            &GitHubScope::Enterprise("bigco".into()),
            "ry-x",
            1,
            &labels(&["linux"]),
            None,
        )
        .await
        .expect_err("an App cannot manage enterprise runners");
    assert!(matches!(err, ApiError::Auth(_)), "{err:?}");
    assert!(err.to_string().contains("personal access token"), "{err}");
    assert_eq!(gh.requests().len(), before, "nothing sent");
    assert_eq!(gh.count("GET", "/repos/acme/app/installation"), 1);
    let err = client
        .list_runners(&org("nobody"))
        .await
        .expect_err("not installed");
    assert!(err.is_not_found(), "{err}");

    let (gh, client) = github_app(Some(5)).await;
    gh.add_installation("orgs/acme", 5);
    client.list_runners(&org("acme")).await.expect("list");
    assert_eq!(
        gh.count("GET", "/orgs/acme/installation"),
        0,
        "no look-up needed"
    );
}

#[tokio::test]
async fn hook_deliveries_and_redelivery() {
    let (gh, client) = github_pat().await;
    let repo_hook = FakeHook::Repo {
        owner: "acme".into(),
        repo: "app".into(),
        hook_id: 7,
    };
    let org_hook = FakeHook::Org {
        org: "acme".into(),
        hook_id: 42,
    };
    let first = gh.add_delivery(
        repo_hook.clone(),
        FakeDelivery::workflow_job("g-1", "queued", 503),
    );
    let second = gh.add_delivery(
        repo_hook.clone(),
        FakeDelivery::workflow_job("g-2", "completed", 202),
    );
    let org_one = gh.add_delivery(
        org_hook.clone(),
        FakeDelivery::workflow_job("g-3", "queued", 0),
    );

    let hook = HookRef::Repo {
        owner: "acme".into(),
        repo: "app".into(),
        hook_id: 7,
    };
    let list = client.list_hook_deliveries(&hook, 50).await.expect("list");
    assert_eq!(
        list.iter().map(|d| d.id).collect::<Vec<_>>(),
        [second, first],
        "newest first"
    );
    assert!(list[1].failed() && !list[0].failed());
    assert_eq!(list[1].guid, "g-1");
    assert_eq!(list[1].action.as_deref(), Some("queued"));
    assert!(list[1].delivered_at.is_some());
    assert_eq!(
        client
            .list_hook_deliveries(&hook, 1)
            .await
            .expect("list")
            .len(),
        1
    );

    client.redeliver(&hook, first).await.expect("redeliver");
    let org_ref = HookRef::Org {
        org: "acme".into(),
        hook_id: 42,
    };
    let org_list = client
        .list_hook_deliveries(&org_ref, 100)
        .await
        .expect("org list");
    assert_eq!(org_list[0].status_code, 0);
    client
        .redeliver(&org_ref, org_one)
        .await
        .expect("redeliver");
    assert_eq!(gh.redeliveries(), [(repo_hook, first), (org_hook, org_one)]);
    assert_eq!(
        gh.count(
            "POST",
            &format!("/repos/acme/app/hooks/7/deliveries/{first}/attempts")
        ),
        1
    );
    let again = client.list_hook_deliveries(&hook, 100).await.expect("list");
    assert!(again[0].redelivery && again[0].guid == "g-1");

    let err = client.redeliver(&hook, 999_999).await.expect_err("unknown");
    assert!(err.is_not_found());
    assert!(
        err.to_string().contains(github::endpoint::REDELIVER),
        "{err}"
    );

    // The App's own hook needs App credentials.
    let err = client
        .list_hook_deliveries(&HookRef::App, 10)
        .await
        .expect_err("token client");
    assert!(matches!(err, ApiError::Auth(_)));
    assert_eq!(gh.count("GET", "/app/"), 0, "nothing sent");
}

#[tokio::test]
async fn the_app_hook_uses_the_jwt() {
    let (gh, client) = github_app(None).await;
    let id = gh.add_delivery(
        FakeHook::App,
        FakeDelivery::workflow_job("g-app", "queued", 500),
    );
    let list = client
        .list_hook_deliveries(&HookRef::App, 10)
        .await
        .expect("list");
    assert_eq!(list.len(), 1);
    client
        .redeliver(&HookRef::App, id)
        .await
        .expect("redeliver");
    assert_eq!(gh.redeliveries(), [(FakeHook::App, id)]);
    assert_eq!(gh.tokens_issued(), 0, "no installation token involved");
    for r in gh.requests() {
        let cred = r.credential.expect("authenticated");
        assert_eq!(cred.matches('.').count(), 2, "a JWT on {}", r.path);
    }
}

#[tokio::test]
async fn runs_jobs_and_reruns() {
    let (gh, client) = github_pat().await;
    // Run 10: a matrix of 120 jobs, some started. Run 11: queued only.
    let mut ids = Vec::new();
    for i in 0..120 {
        ids.push(gh.add_job(
            "acme",
            "app",
            FakeJob::queued(10, &format!("build ({i})"), &["linux"]),
        ));
    }
    gh.set_job_status(ids[0], "in_progress", None);
    gh.set_job_runner(ids[0], "ry-a");
    let lone = gh.add_job("acme", "app", FakeJob::queued(11, "lint", &["small"]));
    gh.add_job("other", "repo", FakeJob::queued(12, "x", &["linux"]));

    let queued = client
        .list_runs("acme", "app", "queued")
        .await
        .expect("queued");
    assert_eq!(queued.iter().map(|r| r.id).collect::<Vec<_>>(), [11]);
    let running = client
        .list_runs("acme", "app", "in_progress")
        .await
        .expect("running");
    assert_eq!(running.iter().map(|r| r.id).collect::<Vec<_>>(), [10]);
    assert!(
        gh.requests()
            .iter()
            .any(|r| r.query.contains("status=in_progress"))
    );

    let jobs = client.list_run_jobs("acme", "app", 10).await.expect("jobs");
    assert_eq!(jobs.len(), 120);
    assert!(
        gh.requests()
            .iter()
            .any(|r| r.query.contains("filter=latest"))
    );
    let started = jobs.iter().find(|j| j.id == ids[0]).expect("job");
    assert_eq!(started.status, "in_progress");
    assert_eq!(started.runner_name.as_deref(), Some("ry-a"));
    assert!(started.started_at.is_some() && started.created_at.is_some());
    let job = client.get_job("acme", "app", lone).await.expect("job");
    assert_eq!(
        (job.run_id, job.run_attempt, job.name.as_str()),
        (11, 1, "lint")
    );
    assert_eq!(job.labels, ["small"]);
    assert_eq!(job.workflow_name.as_deref(), Some("ci"));
    assert!(job.html_url.is_some());

    // Re-runs are refused while the run is in progress.
    let err = client
        .rerun_failed_jobs("acme", "app", 10)
        .await
        .expect_err("running");
    assert_eq!(err.status(), Some(403));

    gh.set_job_status(lone, "completed", Some("failure"));
    let run = client.get_run("acme", "app", 11).await.expect("run");
    assert_eq!(
        (run.status.as_str(), run.conclusion.as_deref()),
        ("completed", Some("failure"))
    );
    assert_eq!(run.run_attempt, 1);
    client
        .rerun_failed_jobs("acme", "app", 11)
        .await
        .expect("rerun");
    let run = client.get_run("acme", "app", 11).await.expect("run");
    assert_eq!((run.status.as_str(), run.run_attempt), ("queued", 2));
    let attempt2 = client.list_run_jobs("acme", "app", 11).await.expect("jobs");
    assert_eq!(attempt2.len(), 1);
    assert_ne!(attempt2[0].id, lone);
    assert_eq!(attempt2[0].run_attempt, 2);

    gh.set_job_status(attempt2[0].id, "completed", Some("failure"));
    client
        .rerun_job("acme", "app", attempt2[0].id)
        .await
        .expect("rerun job");
    assert_eq!(
        gh.reruns(),
        [
            FakeRerun::FailedJobs {
                repo: "acme/app".into(),
                run_id: 11
            },
            FakeRerun::Job {
                repo: "acme/app".into(),
                job_id: attempt2[0].id
            }
        ]
    );
    assert!(
        client
            .get_run("acme", "app", 999)
            .await
            .expect_err("missing")
            .is_not_found()
    );
}

#[tokio::test]
async fn calls_are_counted_per_endpoint() {
    let (_gh, client) = github_pat().await;
    let scope = org("acme");
    client.list_runners(&scope).await.expect("list");
    client.get_runner(&scope, 1).await.expect("get");
    client.delete_runner(&scope, 1).await.expect("delete");
    let calls = client.calls();
    assert_eq!(calls.get(github::endpoint::LIST_RUNNERS), 1);
    assert_eq!(calls.get(github::endpoint::GET_RUNNER), 1);
    assert_eq!(calls.get(github::endpoint::DELETE_RUNNER), 1);
    assert_eq!(calls.total(), 3);
    assert_eq!(
        calls.calls.len(),
        github::endpoint::ALL.len(),
        "every kind listed"
    );
    // Clones share the counters.
    client.clone().list_runners(&scope).await.expect("list");
    assert_eq!(client.calls().total(), 4);
}

#[tokio::test]
async fn no_secret_reaches_an_error_or_debug_output() {
    let mut errors: Vec<ApiError> = Vec::new();

    let (gh, _) = github_pat().await;
    let wrong = "ghp_wrongsecret987654321";
    let client = GitHubClient::new(
        &gh.url(),
        GitHubAuth::Token(SecretString::from(wrong)),
        TIMEOUT,
    )
    .expect("client");
    let err = client
        .list_runners(&org("acme"))
        .await
        .expect_err("bad credentials");
    assert_eq!(err.status(), Some(401));
    errors.push(err);
    assert!(!format!("{client:?}").contains(wrong));

    let key = AppKey::shared();
    let (gh, app_client) = github_app(None).await;
    gh.add_installation("orgs/acme", 1);
    app_client
        .list_runners(&org("acme"))
        .await
        .expect("token cached");
    gh.revoke_tokens();
    gh.enable_app(78, &key.public_pem); // the App's JWT no longer matches
    errors.push(
        app_client
            .list_runners(&org("acme"))
            .await
            .expect_err("jwt refused"),
    );
    assert!(!format!("{app_client:?}").contains("PRIVATE"));

    errors.push(
        GitHubClient::new(
            "https://user:hunter2@github.example.com",
            GitHubAuth::Token(SecretString::from(PAT)),
            TIMEOUT,
        )
        .expect_err("credentials in the URL"),
    );

    let (gl, _) = gitlab().await;
    let gl_client = GitLabClient::new(&gl.url(), SecretString::from("glpat-wrongsecret"), TIMEOUT)
        .expect("client");
    errors.push(gl_client.delete_runner(1).await.expect_err("bad token"));
    assert!(!format!("{gl_client:?}").contains("glpat"));

    // A connection refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    };
    let client = GitLabClient::new(
        &format!("http://{closed}"),
        SecretString::from(GL_TOKEN),
        TIMEOUT,
    )
    .expect("client");
    let err = client.get_job(1, 2).await.expect_err("refused");
    assert!(
        matches!(err, ApiError::Transport { .. }) && err.is_transient(),
        "{err:?}"
    );
    errors.push(err);

    for err in &errors {
        let mut text = format!("{err} {err:?}");
        let mut source = std::error::Error::source(err);
        while let Some(s) = source {
            text.push_str(&format!(" {s}"));
            source = s.source();
        }
        for secret in [
            PAT,
            wrong,
            GL_TOKEN,
            "glpat-wrongsecret",
            "hunter2",
            "ghs_",
            "PRIVATE KEY",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
    }
}

#[tokio::test]
async fn timeouts_are_transient_transport_errors() {
    // Accepts connections, never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            open.push(s);
        }
    });
    let client = GitHubClient::new(
        &format!("http://{addr}"),
        GitHubAuth::Token(SecretString::from(PAT)),
        Duration::from_millis(300),
    )
    .expect("client");
    let started = Instant::now();
    let err = client
        .list_runners(&org("acme"))
        .await
        .expect_err("timeout");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(matches!(err, ApiError::Transport { .. }), "{err:?}");
    assert!(err.to_string().contains("timeout"), "{err}");
    assert!(err.is_transient());
    hold.abort();
}

// ---------------------------------------------------------------------------
// GitLab

#[tokio::test]
async fn gitlab_runners_are_created_and_deleted() {
    let (gl, client) = gitlab().await;
    let tags = labels(&["spack", "large"]);
    let a = client
        .create_runner(RunnerType::Instance, &tags, false, "ry-a")
        .await
        .expect("instance runner");
    let b = client
        .create_runner(RunnerType::Group(12), &tags, false, "ry-b")
        .await
        .expect("group runner");
    let c = client
        .create_runner(RunnerType::Project(34), &[], true, "ry-c")
        .await
        .expect("project runner");
    assert!(a.token.expose_secret().starts_with("glrt-"));
    assert!(!format!("{a:?}").contains(a.token.expose_secret()));

    let runners = gl.runners();
    assert_eq!(runners.len(), 3);
    assert_eq!(runners[0].runner_type, "instance_type");
    assert_eq!(runners[0].tag_list, tags);
    assert!(!runners[0].run_untagged);
    assert_eq!(
        (runners[1].runner_type.as_str(), runners[1].group_id),
        ("group_type", Some(12))
    );
    assert_eq!(
        (runners[2].runner_type.as_str(), runners[2].project_id),
        ("project_type", Some(34))
    );
    assert_eq!(runners[2].description, "ry-c");
    assert_eq!(runners[0].token, a.token.expose_secret());

    client.delete_runner(b.id).await.expect("delete");
    client
        .delete_runner(b.id)
        .await
        .expect("a missing runner counts as deleted");
    assert_eq!(
        gl.runners().iter().map(|r| r.id).collect::<Vec<_>>(),
        [a.id, c.id]
    );
    assert_eq!(gl.count("DELETE", "/api/v4/runners/"), 2);
    assert!(
        gl.requests()
            .iter()
            .all(|r| r.credential.as_deref() == Some(GL_TOKEN))
    );
}

#[tokio::test]
async fn gitlab_runners_are_read_paused_and_their_running_jobs_seen() {
    let (gl, client) = gitlab().await;
    let r = client
        .create_runner(
            RunnerType::Project(34),
            &labels(&["docker"]),
            false,
            "ry-p-0123456789",
        )
        .await
        .expect("runner");
    let info = client.get_runner(r.id).await.expect("get").expect("there");
    assert_eq!(info.description, "ry-p-0123456789");
    assert_eq!(
        (info.status.as_str(), info.online),
        ("never_contacted", false)
    );
    assert!(!info.is_paused());
    gl.start_runner(r.id, RunMode::Service).expect("start");
    let job = gl.add_job(34, FakeGlJob::pending(7, "build", &["docker"]));
    assert_eq!(gl.pick_up(r.id), Some(job));
    let running = client
        .running_jobs(r.id)
        .await
        .expect("jobs")
        .expect("there");
    assert_eq!(running.iter().map(|j| j.id).collect::<Vec<_>>(), [job]);
    assert!(client.pause_runner(r.id).await.expect("pause"));
    assert!(gl.paused(r.id));
    let info = client.get_runner(r.id).await.expect("get").expect("there");
    assert!(info.is_paused() && info.online);
    gl.finish_job(job, "success");
    assert_eq!(
        client.running_jobs(r.id).await.expect("jobs"),
        Some(Vec::new())
    );
    let put = gl
        .requests()
        .into_iter()
        .find(|q| q.method == "PUT")
        .expect("a PUT");
    assert_eq!(put.path, format!("/api/v4/runners/{}", r.id));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&put.body).expect("json"),
        serde_json::json!({"paused": true})
    );
    // A runner GitLab no longer has.
    client.delete_runner(r.id).await.expect("delete");
    assert_eq!(client.get_runner(r.id).await.expect("get"), None);
    assert!(
        !client
            .pause_runner(r.id)
            .await
            .expect("pause a missing runner")
    );
    assert_eq!(client.running_jobs(r.id).await.expect("jobs"), None);
    let calls = client.calls();
    assert_eq!(calls.get(gitlab::endpoint::PAUSE_RUNNER), 2);
    assert_eq!(calls.get(gitlab::endpoint::RUNNER_JOBS), 3);
}

#[tokio::test]
async fn gitlab_runner_listings_follow_the_scope_tags_and_every_page() {
    let (gl, client) = gitlab().await;
    let tags = labels(&["docker", "linux"]);
    for n in 0..130 {
        client
            .create_runner(
                RunnerType::Project(34),
                &tags,
                false,
                &format!("ry-p-{n:010}"),
            )
            .await
            .expect("runner");
    }
    gl.add_runner("project_type", Some(34), "other-tags", &["gpu"]);
    let group = gl.add_runner("group_type", Some(5), "grp", &["docker", "linux"]);
    let shared = gl.add_runner("instance_type", None, "shared", &["docker", "linux"]);
    gl.set_project_group(34, 5);
    let listed = client
        .list_runners(RunnerType::Project(34), &tags)
        .await
        .expect("list");
    assert_eq!(
        listed.len(),
        130,
        "two pages, project runners with both tags only"
    );
    assert!(listed.iter().all(|r| r.description.starts_with("ry-p-")));
    let lists: Vec<_> = gl
        .requests()
        .into_iter()
        .filter(|q| q.path == "/api/v4/projects/34/runners")
        .collect();
    assert_eq!(lists.len(), 2);
    assert!(
        lists[0].query.contains("type=project_type"),
        "{}",
        lists[0].query
    );
    assert!(
        lists[0].query.contains("tag_list=docker,linux"),
        "{}",
        lists[0].query
    );
    let g = client
        .list_runners(RunnerType::Group(5), &tags)
        .await
        .expect("group");
    assert_eq!(g.iter().map(|r| r.id).collect::<Vec<_>>(), [group]);
    let i = client
        .list_runners(RunnerType::Instance, &[])
        .await
        .expect("instance");
    assert_eq!(i.iter().map(|r| r.id).collect::<Vec<_>>(), [shared]);
    assert_eq!(client.calls().get(gitlab::endpoint::LIST_RUNNERS), 4);
}

#[tokio::test]
async fn gitlab_jobs_and_pending_pages() {
    let (gl, client) = gitlab().await;
    for i in 0..130 {
        gl.add_job(5, FakeGlJob::pending(900, &format!("spec {i}"), &["spack"]));
    }
    let running = gl.add_job(5, FakeGlJob::pending(900, "running", &[]));
    gl.set_job_status(running, "running", None);
    gl.add_job(6, FakeGlJob::pending(901, "other project", &[]));

    let pending = client.list_pending_jobs(5).await.expect("pending");
    assert_eq!(pending.len(), 130);
    assert!(
        pending
            .iter()
            .all(|j| j.status == "pending" && j.pipeline_id == Some(900))
    );
    assert_eq!(
        gl.count("GET", "/api/v4/projects/5/jobs"),
        2,
        "two pages of 100"
    );
    assert!(gl.requests()[0].query.contains("scope%5B%5D=pending"));

    let job = client.get_job(5, pending[0].id).await.expect("job");
    assert_eq!(job.tag_list, ["spack"]);
    assert_eq!(job.git_ref, "develop");
    let err = client
        .get_job(6, pending[0].id)
        .await
        .expect_err("other project");
    assert!(err.is_not_found());
    assert!(err.to_string().contains(gitlab::endpoint::GET_JOB));
}

#[tokio::test]
async fn gitlab_pipelines_and_retries() {
    let (gl, client) = gitlab().await;
    let vars = vec![
        ("RUNYARD_RETRY_OF".to_owned(), "900".to_owned()),
        ("KUBERNETES_MEMORY_LIMIT".to_owned(), "12G".to_owned()),
    ];
    let p = client
        .create_pipeline(5, "develop", &vars)
        .await
        .expect("pipeline");
    assert_eq!(p.git_ref, "develop");
    assert_eq!(p.sha.len(), 40);
    let created = gl
        .pipelines()
        .into_iter()
        .find(|x| x.id == p.id)
        .expect("recorded");
    assert!(created.created_by_api);
    assert_eq!(created.variables, vars);
    assert!(
        gl.requests()[0]
            .body
            .contains("\"variable_type\":\"env_var\"")
    );

    let failed = gl.add_job(5, FakeGlJob::pending(900, "build", &["spack"]));
    gl.set_job_status(failed, "failed", Some("script_failure"));
    let running = gl.add_job(5, FakeGlJob::pending(900, "test", &[]));
    gl.set_job_status(running, "running", None);

    let new_job = client.retry_job(5, failed).await.expect("retry job");
    assert_ne!(new_job.id, failed);
    assert_eq!(new_job.status, "pending");
    let err = client
        .retry_job(5, running)
        .await
        .expect_err("not retryable");
    assert_eq!(err.status(), Some(403));

    let retried = client.retry_pipeline(5, 900).await.expect("retry pipeline");
    assert_eq!(retried.id, 900);
    assert_eq!(
        gl.retries(),
        [
            FakeGlRetry::Job {
                project_id: 5,
                job_id: failed,
                new_job_id: new_job.id
            },
            FakeGlRetry::Pipeline {
                project_id: 5,
                pipeline_id: 900
            }
        ]
    );
    assert!(
        client
            .retry_pipeline(5, 12345)
            .await
            .expect_err("unknown")
            .is_not_found()
    );
}

#[tokio::test]
async fn gitlab_rate_limits() {
    let (gl, client) = gitlab().await;
    gl.fail_next(1, 1);
    let err = client.get_job(5, 1).await.expect_err("429");
    assert!(
        matches!(err, ApiError::RateLimited { retry_after } if retry_after == Duration::from_secs(1))
    );
    let started = Instant::now();
    let err = client.get_job(5, 1).await.expect_err("404 after the wait");
    assert!(err.is_not_found());
    assert!(started.elapsed() >= Duration::from_millis(900));

    gl.set_rate_limit(1, Duration::from_secs(2));
    client.delete_runner(1).await.expect("within budget");
    assert_eq!(client.rate_limit_remaining(), Some(0));
    let started = Instant::now();
    client.delete_runner(1).await.expect("after the reset");
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(
        gl.requests().iter().filter(|r| r.status == 429).count(),
        1,
        "only the injected refusal"
    );
    assert_eq!(client.calls().get(gitlab::endpoint::DELETE_RUNNER), 2);
}

#[tokio::test]
async fn core_and_registration_budgets_are_held_apart() {
    let gh = FakeGitHub::start().await;
    let client = GitHubClient::with_options(
        &gh.url(),
        GitHubAuth::Token(SecretString::from(PAT)),
        &ClientOptions::new(TIMEOUT).with_max_rate_limit_wait(Duration::from_millis(100)),
    )
    .expect("client");
    let scope = org("acme");
    gh.exhaust_rate_limit("actions_runner_registration", Duration::from_secs(3600));
    let err = client
        .generate_jitconfig(&scope, "r1", 1, &labels(&["self-hosted"]), None)
        .await
        .expect_err("registration spent");
    assert!(
        matches!(err, ApiError::RateLimited { retry_after } if retry_after > Duration::from_secs(3500)),
        "{err:?}"
    );
    // Known spent now: the next JIT config is not sent, core calls are.
    let err = client
        .generate_jitconfig(&scope, "r1", 1, &labels(&["self-hosted"]), None)
        .await
        .expect_err("still spent");
    assert!(matches!(err, ApiError::RateLimited { .. }));
    client
        .list_runners(&scope)
        .await
        .expect("core is not held back");
    assert_eq!(
        gh.count("POST", "/orgs/acme/actions/runners/generate-jitconfig"),
        1,
        "the second JIT config was held back unsent"
    );
    let budgets = client.rate_budgets();
    let of = |res: &str| budgets.iter().find(|b| b.resource == res).cloned();
    assert_eq!(
        of("actions_runner_registration").and_then(|b| b.remaining),
        Some(0)
    );
    assert!(of("core").and_then(|b| b.remaining).is_some_and(|r| r > 0));

    // GET /rate_limit costs nothing, is sent while a budget is spent and
    // learns when it came back.
    gh.advance_to_reset("actions_runner_registration");
    client
        .refresh_rate_limits(&scope)
        .await
        .expect("rate_limit");
    client
        .generate_jitconfig(&scope, "r1", 1, &labels(&["self-hosted"]), None)
        .await
        .expect("served after the reset");

    // The other way round.
    gh.exhaust_rate_limit("core", Duration::from_secs(3600));
    assert!(client.list_runners(&scope).await.is_err());
    assert!(client.list_runners(&scope).await.is_err());
    client
        .generate_jitconfig(&scope, "r2", 1, &labels(&["self-hosted"]), None)
        .await
        .expect("registration is not held back by core");
}

#[tokio::test]
async fn delivery_pages_follow_the_cursor() {
    let (gh, client) = github_pat().await;
    let hook = FakeHook::Org {
        org: "acme".into(),
        hook_id: 3,
    };
    for i in 0..150 {
        gh.add_delivery(
            hook.clone(),
            FakeDelivery::workflow_job(&format!("g{i}"), "queued", 502),
        );
    }
    let href = HookRef::Org {
        org: "acme".into(),
        hook_id: 3,
    };
    let first = client
        .list_hook_deliveries_page(&href, 100, None)
        .await
        .expect("page 1");
    assert_eq!(first.deliveries.len(), 100);
    assert_eq!(first.deliveries[0].guid, "g149");
    let cursor = first.next_cursor.expect("a next page");
    let second = client
        .list_hook_deliveries_page(&href, 100, Some(&cursor))
        .await
        .expect("page 2");
    assert_eq!(second.deliveries.len(), 50);
    assert_eq!(second.deliveries[0].guid, "g49");
    assert_eq!(second.next_cursor, None);
}

#[tokio::test]
async fn runner_groups_and_their_repositories() {
    let (gh, client) = github_pat().await;
    gh.add_runner_group(
        "/orgs/acme",
        runyard_testkit::fake_github::FakeRunnerGroup::selected(5, "sec", &["acme/a", "acme/b"]),
    );
    let groups = client
        .list_runner_groups(&org("acme"))
        .await
        .expect("groups");
    assert_eq!(
        groups
            .iter()
            .map(|g| (g.id, g.visibility.as_str()))
            .collect::<Vec<_>>(),
        [(1, "all"), (5, "selected")]
    );
    assert_eq!(
        client
            .list_runner_group_repos("acme", 5)
            .await
            .expect("repos"),
        ["acme/a", "acme/b"]
    );
}
