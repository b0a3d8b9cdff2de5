//! The runner scale-set client against the fake Actions service of
//! `runyard-testkit` (SCALESET.md): registration, scale sets, sessions, the
//! message queue, acquiring, JIT runners, retries and token expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runyard_forge::api::github::{GitHubAuth, GitHubClient, GitHubScope};
use runyard_forge::api::scaleset::{
    self, ActionsClient, Exception, JobMessageKind, NewScaleSet, RemoveRunner, ScaleSetMessage,
    ScaleSetPatch, Session, endpoint, exception, is_retryable, is_token_expired,
};
use runyard_forge::api::{ApiError, ClientOptions};
use runyard_testkit::fake_actions::{FakeActions, FakeScaleSetJob};
use runyard_testkit::fake_github::{AppKey, FakeGitHub};
use secrecy::{ExposeSecret, SecretString};

const PAT: &str = "ghp_scalesetpat0123456789";
const CONFIG_URL: &str = "https://github.com/acme";
const TIMEOUT: Duration = Duration::from_secs(5);
const NAME: &str = "ry-linux";

fn github(url: &str) -> GitHubClient {
    GitHubClient::new(url, GitHubAuth::Token(SecretString::from(PAT)), TIMEOUT).expect("github")
}

fn client_with(fake: &FakeActions, options: &ClientOptions) -> ActionsClient {
    ActionsClient::new(
        github(&fake.github_url()),
        GitHubScope::Org("acme".into()),
        CONFIG_URL,
        &fake.github_url(),
        options,
    )
    .expect("client")
    .with_retry_base(Duration::from_millis(5))
}

async fn start() -> (FakeActions, ActionsClient) {
    let fake = FakeActions::start().await;
    fake.require_token(PAT);
    fake.set_poll_hold(Duration::from_millis(100));
    let client = client_with(&fake, &ClientOptions::new(TIMEOUT));
    (fake, client)
}

/// A scale set called [`NAME`] in the default group and a session on it.
async fn scale_set_with_session(client: &ActionsClient) -> (i64, Session) {
    let set = client
        .create_scale_set(&NewScaleSet {
            name: NAME.into(),
            runner_group_id: 1,
            labels: vec![NAME.into(), "gpu".into()],
            disable_update: true,
        })
        .await
        .expect("create");
    let session = client
        .create_session(set.id, "host-1")
        .await
        .expect("session");
    (set.id, session)
}

/// Polls until a message comes (the fake answers 202 after its hold).
async fn next_message(client: &ActionsClient, session: &Session, last: i64) -> ScaleSetMessage {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(m) = client.get_message(session, last, 10).await.expect("poll") {
            return m;
        }
        assert!(Instant::now() < deadline, "no message");
    }
}

fn job() -> FakeScaleSetJob {
    FakeScaleSetJob::new("acme/app", "build", 99, &[NAME])
}

#[tokio::test]
async fn one_job_end_to_end() {
    let (fake, client) = start().await;
    client.connect().await.expect("connect");
    assert_eq!(fake.registrations(), [CONFIG_URL]);
    assert_eq!(fake.registration_tokens_issued(), 1);

    let group = client
        .runner_group_by_name("Default")
        .await
        .expect("group")
        .expect("default group");
    assert_eq!((group.id, group.name.as_str()), (1, "Default"));
    assert!(
        client
            .runner_group_by_name("nope")
            .await
            .expect("group")
            .is_none()
    );
    assert!(
        client
            .scale_set_by_name(1, NAME)
            .await
            .expect("by name")
            .is_none()
    );

    let set = client
        .create_scale_set(&NewScaleSet {
            name: NAME.into(),
            runner_group_id: 1,
            labels: vec!["gpu".into(), "x64".into()],
            disable_update: false,
        })
        .await
        .expect("create");
    assert_eq!(set.name, NAME);
    assert_eq!(set.labels, [NAME, "gpu", "x64"], "name first");
    assert_eq!(fake.scale_sets()[0].labels, [NAME, "gpu", "x64"]);
    let found = client
        .scale_set_by_name(1, NAME)
        .await
        .expect("by name")
        .expect("found");
    assert_eq!(found.id, set.id);
    assert_eq!(
        client
            .scale_set(set.id)
            .await
            .expect("by id")
            .map(|s| s.name),
        Some(NAME.to_owned())
    );
    assert_eq!(client.list_scale_sets().await.expect("list").len(), 1);

    // One session per scale set.
    let session = client
        .create_session(set.id, "host-1")
        .await
        .expect("session");
    assert!(!session.session_id.is_empty());
    assert!(
        session.message_queue_url.contains('?'),
        "the fake's queue URL has a query"
    );
    let conflict = client
        .create_session(set.id, "host-2")
        .await
        .expect_err("second session");
    assert_eq!(
        exception(&conflict),
        Some(Exception::SessionConflict),
        "{conflict}"
    );
    assert_eq!(conflict.status(), Some(409));
    assert_eq!(fake.session_conflicts(), 1);

    // Nothing yet: 202.
    assert!(
        client
            .get_message(&session, 0, 7)
            .await
            .expect("poll")
            .is_none()
    );
    assert_eq!(fake.scale_sets()[0].max_capacity_seen, Some(7));

    // JobAvailable → acquire → JobAssigned.
    let job_id = fake.queue_job(set.id, job());
    let m = next_message(&client, &session, 0).await;
    assert_eq!(m.message_type, scaleset::JOB_MESSAGES);
    assert_eq!(m.jobs.len(), 1);
    let available = &m.jobs[0];
    assert_eq!(available.kind, JobMessageKind::Available);
    assert_eq!(available.job_id, job_id);
    assert_eq!(
        (
            available.owner_name.as_str(),
            available.repository_name.as_str()
        ),
        ("acme", "app")
    );
    assert_eq!(available.request_labels, [NAME]);
    assert_eq!(available.workflow_run_id, 99);
    assert_eq!(m.statistics.total_available_jobs, 1);
    client
        .delete_message(&session, m.message_id)
        .await
        .expect("ack");
    let acquired = client
        .acquire_jobs(set.id, &session, &[available.runner_request_id])
        .await
        .expect("acquire");
    assert_eq!(acquired, [available.runner_request_id]);
    let mut last = m.message_id;

    let m = next_message(&client, &session, last).await;
    assert!(m.message_id > last);
    assert_eq!(m.jobs[0].kind, JobMessageKind::Assigned);
    assert_eq!(m.jobs[0].job_id, job_id);
    assert_eq!(m.statistics.total_assigned_jobs, 1);
    client
        .delete_message(&session, m.message_id)
        .await
        .expect("ack");
    last = m.message_id;

    // A JIT runner comes online and takes the job.
    let jit = client
        .generate_jit_config(set.id, "ry-linux-1", "_work")
        .await
        .expect("jit");
    assert_eq!(jit.runner.name, "ry-linux-1");
    assert!(!format!("{jit:?}").contains(jit.encoded_jit_config.expose_secret()));
    let taken = client
        .generate_jit_config(set.id, "ry-linux-1", "_work")
        .await
        .expect_err("name taken");
    assert_eq!(exception(&taken), Some(Exception::RunnerExists), "{taken}");
    let by_name = client
        .runner_by_name("ry-linux-1")
        .await
        .expect("by name")
        .expect("runner");
    assert_eq!(by_name.id, jit.runner.id);
    assert_eq!(by_name.runner_scale_set_id, set.id);
    assert!(fake.runner_online_by_jit(jit.encoded_jit_config.expose_secret()));

    let m = next_message(&client, &session, last).await;
    let started = &m.jobs[0];
    assert_eq!(started.kind, JobMessageKind::Started);
    assert_eq!(started.runner_name, "ry-linux-1");
    assert_eq!(started.runner_id, Some(jit.runner.id));
    client
        .delete_message(&session, m.message_id)
        .await
        .expect("ack");
    last = m.message_id;
    let runner = client
        .runner(jit.runner.id)
        .await
        .expect("runner")
        .expect("listed");
    assert_eq!(runner.busy, Some(true));
    assert_eq!(client.list_runners().await.expect("list").len(), 1);

    fake.complete_job(&job_id, "succeeded");
    let m = next_message(&client, &session, last).await;
    let completed = &m.jobs[0];
    assert_eq!(completed.kind, JobMessageKind::Completed);
    assert_eq!(completed.result, "succeeded");
    assert_eq!(completed.runner_name, "ry-linux-1");
    assert_eq!(m.statistics.total_assigned_jobs, 0);
    client
        .delete_message(&session, m.message_id)
        .await
        .expect("ack");
    assert_eq!(fake.acks(), 4);
    // The ephemeral runner deregistered.
    assert!(
        client
            .runner(jit.runner.id)
            .await
            .expect("runner")
            .is_none()
    );
    assert_eq!(
        client.remove_runner(jit.runner.id).await.expect("remove"),
        RemoveRunner::NotFound
    );

    // Closing twice is fine (the second answers 400 session expired).
    client
        .delete_session(set.id, &session.session_id)
        .await
        .expect("close");
    client
        .delete_session(set.id, &session.session_id)
        .await
        .expect("close again");
    assert_eq!(fake.scale_sets()[0].sessions, 0);
    client
        .create_session(set.id, "host-2")
        .await
        .expect("free again");

    let calls = client.calls();
    assert_eq!(
        calls.get(endpoint::RUNNER_REGISTRATION),
        1,
        "one admin token"
    );
    assert_eq!(calls.get(endpoint::ACQUIRE_JOBS), 1);
    assert_eq!(calls.get(endpoint::DELETE_MESSAGE), 4);
}

#[tokio::test]
async fn unacked_messages_come_back() {
    let (fake, client) = start().await;
    fake.set_acquire_required(false);
    let (id, session) = scale_set_with_session(&client).await;
    let job_id = fake.queue_job(id, job());
    let first = next_message(&client, &session, 0).await;
    assert_eq!(first.jobs[0].kind, JobMessageKind::Assigned);
    assert_eq!(first.jobs[0].job_id, job_id);
    // Not acked: the same message again.
    let again = next_message(&client, &session, 0).await;
    assert_eq!(again, first);
    client
        .delete_message(&session, first.message_id)
        .await
        .expect("ack");
    assert!(
        client
            .get_message(&session, first.message_id, 10)
            .await
            .expect("poll")
            .is_none()
    );
}

#[tokio::test]
async fn expired_session_tokens_need_a_refresh() {
    let (fake, client) = start().await;
    let (id, session) = scale_set_with_session(&client).await;
    fake.queue_job(id, job());
    let m = next_message(&client, &session, 0).await;
    let request_id = m.jobs[0].runner_request_id;

    fake.expire_session_tokens();
    let err = client
        .get_message(&session, 0, 10)
        .await
        .expect_err("expired");
    assert!(is_token_expired(&err), "{err}");
    let err = client
        .delete_message(&session, m.message_id)
        .await
        .expect_err("expired");
    assert!(is_token_expired(&err), "{err}");
    let err = client
        .acquire_jobs(id, &session, &[request_id])
        .await
        .expect_err("expired");
    assert!(is_token_expired(&err), "{err}");
    assert!(
        !err.to_string()
            .contains(session.message_queue_access_token.expose_secret())
    );

    let refreshed = client
        .refresh_session(id, &session.session_id)
        .await
        .expect("refresh");
    assert_eq!(refreshed.session_id, session.session_id);
    assert_ne!(
        refreshed.message_queue_access_token.expose_secret(),
        session.message_queue_access_token.expose_secret()
    );
    let again = next_message(&client, &refreshed, 0).await;
    assert_eq!(again.message_id, m.message_id, "redelivered");
    client
        .delete_message(&refreshed, m.message_id)
        .await
        .expect("ack");
    assert_eq!(
        client
            .acquire_jobs(id, &refreshed, &[request_id])
            .await
            .expect("acquire"),
        [request_id]
    );
    // Nothing to acquire: nothing sent.
    let before = client.calls().get(endpoint::ACQUIRE_JOBS);
    assert!(
        client
            .acquire_jobs(id, &refreshed, &[])
            .await
            .expect("none")
            .is_empty()
    );
    assert_eq!(client.calls().get(endpoint::ACQUIRE_JOBS), before);

    // A session the service dropped: refresh says so, closing is fine.
    fake.expire_sessions();
    let err = client
        .refresh_session(id, &session.session_id)
        .await
        .expect_err("gone");
    assert_eq!(exception(&err), Some(Exception::SessionNotFound), "{err}");
    client
        .delete_session(id, &session.session_id)
        .await
        .expect("close");
}

#[tokio::test]
async fn busy_runners_are_not_removed() {
    let (fake, client) = start().await;
    fake.set_acquire_required(false);
    let (id, session) = scale_set_with_session(&client).await;
    let idle = client
        .generate_jit_config(id, "ry-idle", "")
        .await
        .expect("jit");
    assert_eq!(
        client.remove_runner(idle.runner.id).await.expect("remove"),
        RemoveRunner::Removed
    );

    let job_id = fake.queue_job(id, job());
    let jit = client
        .generate_jit_config(id, "ry-busy", "_work")
        .await
        .expect("jit");
    // Assigned at the poll; the runner takes it when it connects.
    let m = next_message(&client, &session, 0).await;
    client
        .delete_message(&session, m.message_id)
        .await
        .expect("ack");
    assert!(fake.runner_online("ry-busy"));
    assert!(fake.runners().iter().any(|r| r.name == "ry-busy" && r.busy));

    assert_eq!(
        client.remove_runner(jit.runner.id).await.expect("remove"),
        RemoveRunner::Busy
    );
    assert_eq!(fake.busy_refusals(), 1);
    assert_eq!(fake.removed_while_busy(), 0);

    // Reported completed while it still runs: still busy.
    fake.send_completed_early(&job_id);
    assert_eq!(
        client.remove_runner(jit.runner.id).await.expect("remove"),
        RemoveRunner::Busy
    );
    fake.finish_job(&job_id);
    assert_eq!(
        client.remove_runner(jit.runner.id).await.expect("remove"),
        RemoveRunner::NotFound,
        "deregistered after its job"
    );
    assert_eq!(fake.removed_while_busy(), 0);
}

#[tokio::test]
async fn answers_with_a_bom_parse() {
    let (fake, client) = start().await;
    fake.set_bom(true);
    fake.set_acquire_required(false);
    client.connect().await.expect("connect");
    let (id, session) = scale_set_with_session(&client).await;
    assert!(client.scale_set(id).await.expect("get").is_some());
    fake.queue_job(id, job());
    let m = next_message(&client, &session, 0).await;
    assert_eq!(m.jobs[0].kind, JobMessageKind::Assigned);
    let jit = client
        .generate_jit_config(id, "ry-bom", "")
        .await
        .expect("jit");
    assert_eq!(jit.runner.name, "ry-bom");
    // Errors too: the type name is read through the BOM.
    let err = client
        .create_session(id, "other")
        .await
        .expect_err("conflict");
    assert_eq!(exception(&err), Some(Exception::SessionConflict), "{err}");
}

#[tokio::test]
async fn a_service_down_fails_then_recovers() {
    let (fake, client) = start().await;
    client.connect().await.expect("connect");
    fake.set_down(true);
    let err = client.list_scale_sets().await.expect_err("down");
    assert_eq!(err.status(), Some(503), "{err}");
    assert!(err.is_transient());
    // Four retries after the first try.
    assert_eq!(client.calls().get(endpoint::LIST_SCALE_SETS), 5);
    let err = client.connect().await.expect_err("registration down too");
    assert!(err.is_transient(), "{err}");

    fake.set_down(false);
    client.connect().await.expect("up");
    assert!(client.list_scale_sets().await.expect("up").is_empty());

    // Down for a moment: the retries get through.
    let fake = Arc::new(fake);
    fake.set_down(true);
    let up = {
        let fake = fake.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            fake.set_down(false);
        })
    };
    let slow = client.with_retry_base(Duration::from_millis(15));
    assert!(slow.list_scale_sets().await.expect("recovered").is_empty());
    up.await.expect("task");
}

#[tokio::test]
async fn transport_retries() {
    let (fake, client) = start().await;
    client.connect().await.expect("connect");
    fake.fail_next(2, 500);
    client.list_scale_sets().await.expect("after two 500s");
    assert_eq!(client.calls().get(endpoint::LIST_SCALE_SETS), 3);

    fake.fail_next(1, 501);
    let err = client.list_scale_sets().await.expect_err("501");
    assert_eq!(err.status(), Some(501));
    assert_eq!(
        client.calls().get(endpoint::LIST_SCALE_SETS),
        4,
        "501 is not retried"
    );

    fake.fail_next(5, 429);
    let err = client.list_scale_sets().await.expect_err("429");
    assert!(matches!(err, ApiError::RateLimited { .. }), "{err}");
    assert_eq!(client.calls().rate_limited, 5);

    fake.fail_next(1, 404);
    let err = client.list_runners().await.expect_err("404");
    assert_eq!(err.status(), Some(404));
    assert_eq!(
        client.calls().get(endpoint::LIST_AGENTS),
        1,
        "4xx is not retried"
    );
}

#[tokio::test]
async fn registration_retries_auth_refusals() {
    let (fake, client) = start().await;
    fake.fail_next_registration(401);
    fake.fail_next_registration(403);
    client.connect().await.expect("connect");
    assert_eq!(client.calls().get(endpoint::RUNNER_REGISTRATION), 3);
    assert_eq!(fake.admin_tokens_issued(), 1);

    // A wrong credential fails at step B with GitHub's 401.
    let wrong = ActionsClient::new(
        GitHubClient::new(
            &fake.github_url(),
            GitHubAuth::Token(SecretString::from("ghp_wrong")),
            TIMEOUT,
        )
        .expect("github"),
        GitHubScope::Org("acme".into()),
        CONFIG_URL,
        &fake.github_url(),
        &ClientOptions::new(TIMEOUT),
    )
    .expect("client");
    let err = wrong.connect().await.expect_err("bad credentials");
    assert_eq!(err.status(), Some(401), "{err}");
    assert!(!err.to_string().contains("ghp_wrong"));
}

#[tokio::test]
async fn admin_tokens_are_renewed() {
    let (fake, client) = start().await;
    // Concurrent first calls register once.
    let calls = (0..8).map(|_| {
        let c = client.clone();
        async move { c.list_scale_sets().await }
    });
    for r in futures_join(calls).await {
        r.expect("list");
    }
    assert_eq!(fake.admin_tokens_issued(), 1);
    assert_eq!(fake.registration_tokens_issued(), 1);

    // A token the service no longer takes: registered again, call succeeds.
    fake.expire_admin_tokens();
    client.list_scale_sets().await.expect("after expiry");
    assert_eq!(fake.admin_tokens_issued(), 2);

    // Tokens within a minute of their `exp` are renewed before each call.
    fake.set_admin_token_ttl(Duration::from_secs(30));
    client.connect().await.expect("connect");
    let issued = fake.admin_tokens_issued();
    client.list_scale_sets().await.expect("list");
    client.list_scale_sets().await.expect("list");
    assert_eq!(fake.admin_tokens_issued(), issued + 2);

    fake.set_admin_token_ttl(Duration::from_secs(3600));
    client.connect().await.expect("connect");
    let issued = fake.admin_tokens_issued();
    client.list_scale_sets().await.expect("list");
    client.list_runners().await.expect("list");
    assert_eq!(fake.admin_tokens_issued(), issued);
}

/// Runs the futures concurrently (no `futures` dependency here).
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

#[tokio::test]
async fn the_long_poll_outlives_a_short_timeout() {
    let fake = FakeActions::start().await;
    fake.require_token(PAT);
    let client = client_with(&fake, &ClientOptions::new(Duration::from_millis(400)));
    let (_, session) = scale_set_with_session(&client).await;
    fake.set_poll_hold(Duration::from_millis(900));
    let started = Instant::now();
    assert!(
        client
            .get_message(&session, 0, 1)
            .await
            .expect("held poll")
            .is_none()
    );
    assert!(started.elapsed() >= Duration::from_millis(800));
}

#[tokio::test]
async fn outage_answers_are_retryable() {
    let (fake, client) = start().await;
    let set = client
        .create_scale_set(&NewScaleSet {
            name: NAME.into(),
            runner_group_id: 1,
            ..NewScaleSet::default()
        })
        .await
        .expect("create");
    assert_eq!(set.labels, [NAME], "the name is the default label");

    fake.empty_queue_url_next_session();
    let err = client
        .create_session(set.id, "host")
        .await
        .expect_err("no queue url");
    assert!(is_retryable(&err), "{err}");
    // The unusable session was closed: no 409 on the retry.
    let session = client.create_session(set.id, "host").await.expect("retry");

    fake.empty_next_message();
    let err = client
        .get_message(&session, 0, 1)
        .await
        .expect_err("empty 200");
    assert!(is_retryable(&err), "{err}");
    assert!(
        client
            .get_message(&session, 0, 1)
            .await
            .expect("poll")
            .is_none()
    );
}

#[tokio::test]
async fn scale_sets_change_and_vanish() {
    let (fake, client) = start().await;
    let (id, session) = scale_set_with_session(&client).await;
    let group = fake.add_runner_group("Linux");
    let moved = client
        .update_scale_set(
            id,
            &ScaleSetPatch {
                name: Some("ry-linux-2".into()),
                runner_group_id: Some(group),
            },
        )
        .await
        .expect("update");
    assert_eq!(
        (moved.name.as_str(), moved.runner_group_id),
        ("ry-linux-2", group)
    );
    assert_eq!(moved.labels, [NAME, "gpu"], "labels are fixed at creation");
    assert!(
        client
            .scale_set_by_name(group, "ry-linux-2")
            .await
            .expect("by name")
            .is_some()
    );

    // Deleted by the service's garbage collection.
    fake.delete_scale_set_server_side(id);
    assert!(client.scale_set(id).await.expect("get").is_none());
    let err = client.create_session(id, "host").await.expect_err("gone");
    assert_eq!(exception(&err), Some(Exception::ScaleSetNotFound), "{err}");
    client
        .delete_session(id, &session.session_id)
        .await
        .expect("close after gc");

    let (id, _) = scale_set_with_session(&client).await;
    client.delete_scale_set(id).await.expect("delete");
    assert!(fake.scale_sets().is_empty());
    client.delete_scale_set(id).await.expect("delete again");
}

#[tokio::test]
async fn acquirable_jobs_are_listed() {
    let (fake, client) = start().await;
    let (id, session) = scale_set_with_session(&client).await;
    assert!(client.acquirable_jobs(id).await.expect("none").is_empty());
    fake.queue_job(id, job());
    let jobs = client.acquirable_jobs(id).await.expect("one");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].request_labels, [NAME]);
    client
        .acquire_jobs(id, &session, &[jobs[0].runner_request_id])
        .await
        .expect("acquire");
}

#[tokio::test]
async fn registration_tokens_at_three_scopes() {
    let fake = FakeActions::start().await;
    fake.require_token(PAT);
    let gh = github(&fake.github_url());
    for scope in [
        GitHubScope::Org("acme".into()),
        GitHubScope::repo("acme", "app"),
        GitHubScope::Enterprise("bigco".into()),
    ] {
        let token = gh.registration_token(&scope).await.expect("token");
        assert!(!token.expose_secret().is_empty());
    }
    assert_eq!(gh.calls().get("registration_token"), 3);
    assert_eq!(fake.registration_tokens_issued(), 3);
}

#[tokio::test]
async fn an_app_registers_through_the_rest_fake() {
    let key = AppKey::shared();
    let gh = FakeGitHub::start().await;
    gh.enable_app(77, &key.public_pem);
    gh.add_installation("orgs/acme", 42);
    let fake = FakeActions::start().await;
    gh.connect_actions(&fake);
    let app = GitHubClient::new(
        &gh.url(),
        GitHubAuth::App {
            app_id: 77,
            private_key_pem: SecretString::from(key.private_pem.clone()),
            installation_id: None,
        },
        TIMEOUT,
    )
    .expect("app");
    let client = ActionsClient::new(
        app.clone(),
        GitHubScope::Org("acme".into()),
        CONFIG_URL,
        &gh.url(),
        &ClientOptions::new(TIMEOUT),
    )
    .expect("client");
    client.connect().await.expect("connect");
    assert!(client.list_scale_sets().await.expect("list").is_empty());
    assert_eq!(fake.registrations(), [CONFIG_URL]);
    assert_eq!(app.calls().get("registration_token"), 1);
    assert!(!format!("{client:?}").contains("BEGIN"));
}
