//! Usage reports authenticated by CI identity tokens (`RUNYARD_USAGE_OIDC`)
//! against a real nats-server and fake issuers on loopback: what is
//! accepted, what is refused and why, and that the published event carries
//! the identity of the token, not the body's.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use runyard_events::{Body, Event, Forge, Namespace, UsageReported};
use runyard_ingest::{App, Config};
use runyard_testkit::fake_oidc::{FakeIssuer, SigningKey};
use runyard_testkit::{TestNats, decode_events, stream_messages, unique_namespace};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const AUDIENCE: &str = "runyard";
// As `openssl rand -hex 32` makes them (ingest refuses weak ones).
const SHARED: &str = "248162813eed1c100b2d2003cf1d7329ae3816b2c889eb651689b4ca39b86ec9";

/// Ingest with a GitLab-shaped and a GitHub-shaped issuer.
struct Harness {
    _nats: TestNats,
    nats: async_nats::Client,
    ns: Namespace,
    base: String,
    gitlab: FakeIssuer,
    github: FakeIssuer,
    stop: Option<oneshot::Sender<()>>,
}

impl Harness {
    async fn start(tweak: impl FnOnce(&mut Config, &str, &str)) -> Self {
        runyard_telemetry::install_crypto_provider();
        let nats = TestNats::get().await;
        let ns = unique_namespace();
        let gitlab = FakeIssuer::start("").await;
        let github = FakeIssuer::start("/_services/token").await;
        let mut config = Config {
            bus: runyard_config::Bus {
                nats_url: nats.url(),
                namespace: ns.to_string(),
            },
            ingest_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            usage_oidc: format!("{}={AUDIENCE},{}={AUDIENCE}", gitlab.url(), github.url()),
            ingest_ack_timeout: Duration::from_secs(2),
            ..Config::default()
        };
        tweak(&mut config, &gitlab.url(), &github.url());
        let app = App::build(config).await.unwrap();
        let base = format!("http://{}", app.local_addr());
        let (tx, rx) = oneshot::channel::<()>();
        tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        let client = async_nats::connect(nats.url()).await.unwrap();
        Self {
            _nats: nats,
            nats: client,
            ns,
            base,
            gitlab,
            github,
            stop: Some(tx),
        }
    }

    /// Posts `body` with `Authorization: Bearer <bearer>` (none for `None`).
    async fn usage(&self, bearer: Option<&str>, body: &Value) -> (u16, Value, Option<String>) {
        let mut req = reqwest::Client::new()
            .post(format!("{}/v1/usage", self.base))
            .json(body);
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = resp.text().await.unwrap();
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body, retry_after)
    }

    async fn events(&self) -> Vec<Event> {
        decode_events(&stream_messages(&self.nats, &self.ns.events_stream()).await)
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn now() -> u64 {
    time::OffsetDateTime::now_utc().unix_timestamp() as u64
}

/// The claims of a GitLab job's token.
fn gitlab_claims(issuer: &str, job_id: u64) -> Value {
    json!({
        "iss": issuer, "aud": AUDIENCE, "sub": "project_path:spack/spack:ref_type:branch:ref:feature",
        "iat": now(), "nbf": now(), "exp": now() + 300,
        "project_id": "22", "project_path": "spack/spack", "namespace_path": "spack",
        "ref": "feature", "ref_type": "branch", "ref_protected": "false",
        "pipeline_id": "900", "job_id": job_id.to_string(),
    })
}

/// The body `runyard-report` sends for a GitLab job (without project/ref:
/// the token says them).
fn gitlab_report(job_id: u64) -> Value {
    json!({
        "forge": "gitlab", "instance": "https://127.0.0.1", "job_id": job_id, "attempt": 1,
        "workload": {"package": "zlib"}, "peak_memory_bytes": 1_000_000_000u64,
    })
}

fn usage(e: &Event) -> &UsageReported {
    match e.body.as_ref() {
        Some(Body::UsageReported(u)) => u,
        other => panic!("not a usage report: {other:?}"),
    }
}

#[tokio::test]
async fn a_verified_token_names_the_job_and_the_event_carries_its_identity() {
    let h = Harness::start(|_, _, _| {}).await;

    // GitLab: the report leaves out project and ref; the token says them.
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4711));
    let (status, answer, _) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["event_id"], "usage:gitlab:127.0.0.1:4711:1");

    // GitHub: the job is `check_run_id`, the ref `refs/heads/main` → `main`.
    let claims = json!({
        "iss": h.github.url(), "aud": AUDIENCE, "sub": "repo:acme/app:ref:refs/heads/main",
        "iat": now(), "nbf": now(), "exp": now() + 300,
        "repository": "acme/app", "repository_id": "7", "ref": "refs/heads/main",
        "run_id": "555", "run_attempt": "2", "check_run_id": "21870573124",
        "event_name": "push",
    });
    let body = json!({
        "forge": "github", "instance": "127.0.0.1", "job_id": 21_870_573_124u64, "attempt": 2,
        "ref": "main", "project": "acme/app", "peak_memory_bytes": 2_000_000_000u64,
    });
    let (status, answer, _) = h.usage(Some(&h.github.sign(&claims)), &body).await;
    assert_eq!(status, 202, "{answer}");

    let events = h.events().await;
    assert_eq!(events.len(), 2, "{events:?}");
    let gl = usage(&events[0]);
    let key = gl.job.as_ref().unwrap();
    assert_eq!(
        (key.forge(), key.instance.as_str(), key.job_id),
        (Forge::Gitlab, "127.0.0.1", 4711)
    );
    assert_eq!(
        (gl.project.as_str(), gl.r#ref.as_str()),
        ("spack/spack", "feature")
    );
    let id = gl.identity.as_ref().unwrap();
    assert_eq!(
        (id.method.as_str(), id.issuer.as_str()),
        ("oidc", h.gitlab.url().as_str())
    );
    assert!(id.subject.starts_with("project_path:spack/spack"));
    let gh = usage(&events[1]);
    assert_eq!(gh.job.as_ref().unwrap().job_id, 21_870_573_124);
    assert_eq!((gh.attempt, gh.r#ref.as_str()), (2, "main"));
    assert_eq!(gh.identity.as_ref().unwrap().method, "oidc");

    let metrics = h.metrics().await;
    assert!(
        metrics.contains(r#"runyard_ingest_usage_auth_total{method="oidc",result="accepted"} 2"#),
        "{metrics}"
    );
    // No credential in the event log, raw deliveries included.
    let raw = stream_messages(&h.nats, &h.ns.raw_stream()).await;
    for m in &raw {
        let headers = format!("{:?}", m.headers);
        assert!(
            !headers.contains(&token) && !headers.contains("eyJ"),
            "{headers}"
        );
    }
}

#[tokio::test]
async fn bad_tokens_are_refused_with_the_reason_and_publish_nothing() {
    let h = Harness::start(|_, _, _| {}).await;
    let iss = h.gitlab.url();
    let claims = |edit: &dyn Fn(&mut Value)| {
        let mut c = gitlab_claims(&iss, 4711);
        edit(&mut c);
        c
    };
    let body = gitlab_report(4711);
    // Same kid, another key: the signature does not verify.
    let impostor = SigningKey::generate("key-1").sign(&claims(&|_| {}));
    let cases: Vec<(&str, Option<String>, &str, &str)> = vec![
        (
            "no token",
            None,
            "missing bearer credential",
            r#"method="none",result="missing""#,
        ),
        (
            "not a JWT, shared token off",
            Some("some-opaque-token".into()),
            "RUNYARD_USAGE_TOKEN) is not enabled",
            r#"method="token",result="wrong""#,
        ),
        (
            "wrong signature",
            Some(impostor),
            "signature does not verify",
            r#"result="signature""#,
        ),
        (
            "expired",
            Some(h.gitlab.sign(&claims(&|c| {
                c["iat"] = json!(now() - 7200);
                c["nbf"] = json!(now() - 7200);
                c["exp"] = json!(now() - 3600);
            }))),
            "identity token expired",
            r#"result="expired""#,
        ),
        (
            "not yet valid",
            Some(h.gitlab.sign(&claims(&|c| c["nbf"] = json!(now() + 3600)))),
            "not valid yet",
            r#"result="not_yet_valid""#,
        ),
        (
            "another audience",
            Some(h.gitlab.sign(&claims(&|c| c["aud"] = json!("vault")))),
            "audience (aud)",
            r#"result="audience""#,
        ),
        (
            "an issuer not configured",
            Some(h.gitlab.sign(&claims(&|c| {
                c["iss"] = json!("https://gitlab.evil.example")
            }))),
            "issuer is not one RUNYARD_USAGE_OIDC accepts",
            r#"result="unknown_issuer""#,
        ),
        (
            // GitHub's issuer named, GitLab's key signed (same kid).
            "another issuer's key",
            Some(
                h.gitlab
                    .sign(&claims(&|c| c["iss"] = json!(h.github.url()))),
            ),
            "signature does not verify",
            r#"result="signature""#,
        ),
        (
            "a key the issuer never published",
            Some(SigningKey::generate("key-9").sign(&claims(&|_| {}))),
            "key its issuer does not publish",
            r#"result="unknown_key""#,
        ),
        (
            "a token naming no job",
            Some(h.gitlab.sign(&claims(&|c| {
                c.as_object_mut().unwrap().remove("job_id");
            }))),
            "claim job_id is missing",
            r#"result="claims""#,
        ),
    ];
    for (name, token, reason, series) in &cases {
        let (status, answer, _) = h.usage(token.as_deref(), &body).await;
        assert_eq!(status, 401, "{name}: {answer}");
        let message = answer["error"].as_str().unwrap();
        assert!(message.contains(reason), "{name}: {message}");
        if let Some(t) = token {
            assert!(
                !answer.to_string().contains(t.as_str()),
                "{name}: token echoed"
            );
        }
        let metrics = h.metrics().await;
        assert!(
            metrics.contains(series),
            "{name}: {series} missing in {metrics}"
        );
    }
    assert!(h.events().await.is_empty(), "nothing refused was published");
}

#[tokio::test]
async fn a_token_for_another_job_project_or_ref_is_403_naming_the_field() {
    let h = Harness::start(|_, _, _| {}).await;
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4711));
    let cases: &[(&str, Value)] = &[
        ("job_id", json!(4712)),
        ("project", json!("spack/other")),
        // A pull request's job claiming a protected ref.
        ("ref", json!("develop")),
        ("instance", json!("gitlab.example.com")),
        ("forge", json!("github")),
    ];
    for (field, value) in cases {
        let mut body = gitlab_report(4711);
        body[*field] = value.clone();
        let (status, answer, _) = h.usage(Some(&token), &body).await;
        assert_eq!(status, 403, "{field}: {answer}");
        assert_eq!(answer["field"], *field, "{answer}");
    }
    assert!(h.events().await.is_empty());
    // The report as the job really is goes in; the forged ones did not
    // take its place.
    let (status, answer, _) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!(
        (status, &answer["duplicate"]),
        (202, &json!(false)),
        "{answer}"
    );
    assert!(
        h.metrics()
            .await
            .contains(r#"runyard_ingest_usage_auth_total{method="oidc",result="forbidden"} 5"#)
    );
}

#[tokio::test]
async fn one_gitlab_token_files_one_report_whatever_attempt_it_names() {
    let h = Harness::start(|_, _, _| {}).await;
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4711));
    // A GitLab job id is one attempt: other numbers would each be a new
    // event id, so one token could file reports without end.
    for attempt in [2u64, 3, 2_147_483_647] {
        let mut body = gitlab_report(4711);
        body["attempt"] = json!(attempt);
        let (status, answer, _) = h.usage(Some(&token), &body).await;
        assert_eq!(status, 403, "attempt {attempt}: {answer}");
        assert_eq!(answer["field"], "attempt");
        assert!(
            answer["error"].as_str().unwrap().contains("must be 1"),
            "{answer}"
        );
    }
    assert!(h.events().await.is_empty(), "nothing refused was published");
    let (status, first, _) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!((status, &first["duplicate"]), (202, &json!(false)));
    // The same attempt again, claiming another workload: one report.
    let mut again = gitlab_report(4711);
    again["workload"] = json!({"package": "py-torch"});
    let (status, second, _) = h.usage(Some(&token), &again).await;
    assert_eq!(
        (status, &second["duplicate"]),
        (202, &json!(true)),
        "{second}"
    );
    let events = h.events().await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        usage(&events[0]).workload["package"],
        "zlib",
        "the first stays"
    );
}

#[tokio::test]
async fn only_listed_projects_report_and_each_within_its_rate() {
    let h = Harness::start(|c, gitlab, _| {
        c.usage_oidc_projects = format!("{gitlab}=spack/*");
        c.usage_oidc_rate = 2;
    })
    .await;
    let iss = h.gitlab.url();
    let other = |job: u64| {
        let mut c = gitlab_claims(&iss, job);
        c["project_path"] = json!("someone/else");
        h.gitlab.sign(&c)
    };
    let (status, answer, _) = h.usage(Some(&other(1)), &gitlab_report(1)).await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(answer["field"], "project");
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("someone/else") && message.contains("RUNYARD_USAGE_OIDC_PROJECTS"),
        "{message}"
    );
    // spack/spack is listed (spack/*): two reports a minute, then 429.
    for job in [2, 3] {
        let token = h.gitlab.sign(&gitlab_claims(&iss, job));
        let (status, answer, _) = h.usage(Some(&token), &gitlab_report(job)).await;
        assert_eq!(status, 202, "{answer}");
    }
    let token = h.gitlab.sign(&gitlab_claims(&iss, 4));
    let (status, answer, retry_after) = h.usage(Some(&token), &gitlab_report(4)).await;
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("RUNYARD_USAGE_OIDC_RATE"),
        "{answer}"
    );
    let wait: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=30).contains(&wait), "{wait}");
    let events = h.events().await;
    assert_eq!(events.len(), 2, "only the two within the rate");
    let metrics = h.metrics().await;
    for series in [
        r#"runyard_ingest_usage_auth_total{method="oidc",result="project_not_allowed"} 1"#,
        r#"runyard_ingest_usage_auth_total{method="oidc",result="rate_limited"} 1"#,
    ] {
        assert!(metrics.contains(series), "{series} missing in {metrics}");
    }
}

#[tokio::test]
async fn rotated_keys_are_fetched_again_but_not_for_every_unknown_kid() {
    // Refetch on an unknown kid at once.
    let h = Harness::start(|c, _, _| c.usage_oidc_refetch = Duration::ZERO).await;
    let claims = |job| gitlab_claims(&h.gitlab.url(), job);
    let (status, _, _) = h
        .usage(Some(&h.gitlab.sign(&claims(1))), &gitlab_report(1))
        .await;
    assert_eq!(status, 202);
    assert_eq!(h.gitlab.key_fetches(), 1, "keys are cached");
    let (status, _, _) = h
        .usage(Some(&h.gitlab.sign(&claims(2))), &gitlab_report(2))
        .await;
    assert_eq!(
        (status, h.gitlab.key_fetches()),
        (202, 1),
        "cached keys verify"
    );
    h.gitlab.rotate("key-2");
    let (status, answer, _) = h
        .usage(Some(&h.gitlab.sign(&claims(3))), &gitlab_report(3))
        .await;
    assert_eq!(status, 202, "the new key is fetched: {answer}");
    assert_eq!(h.gitlab.key_fetches(), 2);

    // Refetch at most hourly: a made-up kid costs the issuer nothing.
    let h = Harness::start(|c, _, _| c.usage_oidc_refetch = Duration::from_secs(3600)).await;
    let (status, _, _) = h
        .usage(
            Some(&h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 1))),
            &gitlab_report(1),
        )
        .await;
    assert_eq!(status, 202);
    let stranger = SigningKey::generate("made-up").sign(&gitlab_claims(&h.gitlab.url(), 2));
    for _ in 0..3 {
        let (status, answer, _) = h.usage(Some(&stranger), &gitlab_report(2)).await;
        assert_eq!(status, 401, "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .contains("does not publish")
        );
    }
    assert_eq!(
        h.gitlab.key_fetches(),
        1,
        "unknown kids within the interval fetch nothing"
    );
}

#[tokio::test]
async fn an_issuer_whose_keys_cannot_be_fetched_means_503_not_401() {
    let h = Harness::start(|_, _, _| {}).await;
    h.gitlab.set_down(true);
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4711));
    let (status, answer, retry_after) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!(status, 503, "{answer}");
    assert!(retry_after.is_some(), "503 says when to retry");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("could not be fetched")
    );
    assert!(!answer.to_string().contains(&token));
    // Back up: the same report goes in once the failure's back-off (a
    // second) has passed.
    h.gitlab.set_down(false);
    let accepted = runyard_testkit::eventually(Duration::from_secs(5), || async {
        let (status, _, _) = h.usage(Some(&token), &gitlab_report(4711)).await;
        (status == 202).then_some(())
    })
    .await;
    assert!(accepted.is_some(), "accepted once the issuer is back");

    // An issuer nobody answers for at all.
    let closed = runyard_testkit::free_port();
    let issuer = format!("http://127.0.0.1:{closed}");
    let h = Harness::start(|c, _, _| c.usage_oidc = format!("{issuer}={AUDIENCE}")).await;
    let token = h.gitlab.sign(&gitlab_claims(&issuer, 4711));
    let (status, answer, retry_after) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!((status, retry_after.is_some()), (503, true), "{answer}");
    assert!(h.events().await.is_empty());
}

/// An issuer that accepts connections and never answers; counts them.
async fn silent_issuer() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(conn);
        }
    });
    (url, accepted)
}

#[tokio::test]
async fn an_issuer_that_does_not_answer_costs_one_wait_then_reports_fail_fast() {
    let (issuer, asked) = silent_issuer().await;
    let h = Harness::start(|c, _, _| {
        c.usage_oidc = format!("{issuer}={AUDIENCE}");
        c.usage_oidc_refetch = Duration::ZERO;
    })
    .await;
    let token = h.gitlab.sign(&gitlab_claims(&issuer, 4711));
    // Made before the clock starts: making a key takes long enough on a
    // busy machine to outlast the 1 s back-off the second part relies on.
    let stranger = SigningKey::generate("made-up").sign(&gitlab_claims(&issuer, 2));
    let started = std::time::Instant::now();
    // Eight reports at once share one fetch of the keys: one wait of at
    // most its 5 s deadline, not eight in a row.
    let answers = futures::future::join_all(
        (0..8).map(|_| async { h.usage(Some(&token), &gitlab_report(4711)).await }),
    )
    .await;
    for (status, answer, retry_after) in &answers {
        assert_eq!((*status, retry_after.is_some()), (503, true), "{answer}");
    }
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(9), "{waited:?}");
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    // While the failure is fresh, reports — with keys made up or not — are
    // answered at once and the issuer is not asked again.
    let started = std::time::Instant::now();
    for token in [&token, &stranger, &token] {
        let (status, answer, _) = h.usage(Some(token), &gitlab_report(4711)).await;
        assert_eq!(status, 503, "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(h.events().await.is_empty());
}

#[tokio::test]
async fn a_known_key_verifies_while_a_made_up_one_is_looked_for() {
    let h = Harness::start(|c, _, _| c.usage_oidc_refetch = Duration::ZERO).await;
    let claims = |job| gitlab_claims(&h.gitlab.url(), job);
    let (status, _, _) = h
        .usage(Some(&h.gitlab.sign(&claims(1))), &gitlab_report(1))
        .await;
    assert_eq!(status, 202);
    // The issuer goes silent: a token naming an unknown key starts a fetch
    // that hangs; reports signed with the cached key do not wait for it.
    h.gitlab.set_silent(true);
    let stranger = SigningKey::generate("made-up").sign(&claims(2));
    let report = gitlab_report(2);
    let looking = h.usage(Some(&stranger), &report);
    let known = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let (status, answer, _) = h
            .usage(Some(&h.gitlab.sign(&claims(3))), &gitlab_report(3))
            .await;
        (status, answer, started.elapsed())
    };
    let ((unknown, _, _), (status, answer, took)) = tokio::join!(looking, known);
    assert_eq!(status, 202, "{answer}");
    assert!(
        took < Duration::from_secs(2),
        "waited {took:?} on the fetch"
    );
    assert_eq!(unknown, 503, "the fetch for the unknown key failed");
}

#[tokio::test]
async fn the_shared_token_is_an_opt_in_next_to_identity_tokens() {
    // Both: the shared token still works, and the event says how the
    // report was authenticated.
    let h = Harness::start(|c, _, _| c.usage_token = Some(SHARED.to_owned().into())).await;
    let mut body = gitlab_report(4711);
    body["ref"] = json!("develop");
    let (status, answer, _) = h.usage(Some(SHARED), &body).await;
    assert_eq!(status, 202, "{answer}");
    let (status, _, _) = h.usage(Some("not-the-token"), &gitlab_report(4712)).await;
    assert_eq!(status, 401);
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4713));
    let (status, _, _) = h.usage(Some(&token), &gitlab_report(4713)).await;
    assert_eq!(status, 202);
    let events = h.events().await;
    let methods: Vec<_> = events
        .iter()
        .map(|e| usage(e).identity.as_ref().unwrap().method.clone())
        .collect();
    assert_eq!(methods, ["token", "oidc"]);
    assert_eq!(
        usage(&events[0]).r#ref,
        "develop",
        "self-declared with the shared token"
    );

    // Only identity tokens: the shared token is refused.
    let h = Harness::start(|_, _, _| {}).await;
    let (status, answer, _) = h.usage(Some(SHARED), &gitlab_report(4711)).await;
    assert_eq!(status, 401, "{answer}");
    assert!(h.events().await.is_empty());

    // Only the shared token (as before): a JWT is just a wrong token.
    let h = Harness::start(|c, _, _| {
        c.usage_oidc = String::new();
        c.usage_token = Some(SHARED.to_owned().into());
    })
    .await;
    let token = h.gitlab.sign(&gitlab_claims(&h.gitlab.url(), 4711));
    let (status, answer, _) = h.usage(Some(&token), &gitlab_report(4711)).await;
    assert_eq!(status, 401, "{answer}");
    assert_eq!(
        answer["error"],
        "Authorization: missing or wrong bearer token"
    );
}

#[tokio::test]
async fn a_bad_issuer_list_stops_ingest_naming_the_variable() {
    let nats = TestNats::get().await;
    let e = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: unique_namespace().to_string(),
        },
        ingest_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        usage_oidc: "http://gitlab.example.com=runyard".into(),
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains("RUNYARD_USAGE_OIDC"), "{e}");
    // GitLab.com gives tokens to anyone: it needs a project list.
    let e = App::build(Config {
        bus: runyard_config::Bus {
            nats_url: nats.url(),
            namespace: unique_namespace().to_string(),
        },
        ingest_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        usage_oidc: "https://gitlab.com=runyard".into(),
        ..Config::default()
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains("RUNYARD_USAGE_OIDC_PROJECTS"), "{e}");
}
