//! The instance callback/metadata API garm's install templates call: a
//! scaler in-process on a real nats-server (a namespace per test), instance
//! secrets put in its bucket and tokens minted as the engine does, and the
//! API asked over HTTP as an instance would.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine as _;
use reqwest::StatusCode;
use runyard_events::{Body, Event, Forge};
use runyard_scaler::metadata::{InstanceSecrets, InstanceTokens, SecretStore};
use runyard_scaler::{App, ScalerFile};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::support::{Stack, pool_toml, until_async};

/// The key `support::Stack::config` gives the scaler.
const KEY: &str = "e6ba5d7d4016a15dcba16e8905f88fea35bfdd5cfeeb02b8bb711d5885495b87";

const HOUR: Duration = Duration::from_secs(3600);

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The files of a runner's JIT configuration.
fn files(name: &str) -> [(&'static str, String); 3] {
    [
        (
            ".runner",
            format!(r#"{{"agentId": 1, "agentName": "{name}"}}"#),
        ),
        (
            ".credentials",
            format!(r#"{{"scheme": "OAuth", "for": "{name}"}}"#),
        ),
        (
            ".credentials_rsaparams",
            format!(r#"{{"d": "{name}-key"}}"#),
        ),
    ]
}

/// GitHub's `encoded_jit_config` for `name`: base64 of a JSON object of
/// base64 files.
fn encoded_jit(name: &str) -> String {
    let map: serde_json::Map<String, Value> = files(name)
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Value::String(b64(v.as_bytes()))))
        .collect();
    b64(Value::Object(map).to_string().as_bytes())
}

fn github_secrets(name: &str) -> InstanceSecrets {
    InstanceSecrets {
        name: name.into(),
        pool: "linux".into(),
        forge: Forge::Github,
        jit_config: encoded_jit(name),
        repo_url: "https://github.com/acme".into(),
        labels: vec![
            "self-hosted".into(),
            "linux".into(),
            "runyard-pool=linux".into(),
        ],
        runner_group: String::new(),
        nonce: String::new(),
    }
}

/// A scaler serving the API, and an instance's view of it.
struct Harness {
    stack: Stack,
    addr: SocketAddr,
    store: SecretStore,
    tokens: InstanceTokens,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Harness {
    async fn start() -> Self {
        Self::on(Stack::new(&pool_toml(2, 0, "")).await).await
    }

    async fn on(stack: Stack) -> Self {
        let file = ScalerFile::parse(&stack.file).expect("valid scaler file");
        let app = Box::pin(App::build(stack.config(), Some(file)))
            .await
            .expect("scaler builds");
        let addr = app
            .metadata_addr()
            .expect("the metadata API is served with a token key");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run(async move {
            let _ = rx.await;
        }));
        let store = SecretStore::open(&stack.bus, HOUR)
            .await
            .expect("instance secrets bucket");
        Self {
            stack,
            addr,
            store,
            tokens: InstanceTokens::new(&SecretString::from(KEY.to_owned())),
            http: reqwest::Client::new(),
            stop: Some(tx),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = self.task.await;
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn token(&self, name: &str) -> String {
        self.tokens.mint(name, "linux", HOUR).expect("token")
    }

    async fn get(&self, path: &str, token: Option<&str>) -> reqwest::Response {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send().await.expect("GET")
    }

    async fn get_text(&self, path: &str, token: &str) -> (StatusCode, String) {
        let resp = self.get(path, Some(token)).await;
        let status = resp.status();
        (status, resp.text().await.expect("body"))
    }

    /// POSTs `body` as garm's template does (`curl -d`: form-encoded type).
    async fn post(&self, path: &str, token: &str, body: &str) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(token)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body.to_owned())
            .send()
            .await
            .expect("POST")
    }

    /// Runner events of the namespace with their subjects.
    async fn runner_events(&self) -> Vec<(String, Event)> {
        let msgs = runyard_testkit::stream_messages(
            self.stack.bus.client(),
            &self.stack.ns.events_stream(),
        )
        .await;
        let events = runyard_testkit::decode_events(&msgs);
        msgs.iter()
            .map(|m| m.subject.to_string())
            .zip(events)
            .collect()
    }
}

#[tokio::test]
async fn an_instance_gets_its_jit_files_decoded_and_its_install_script() {
    let h = Harness::start().await;
    let name = "ry-linux-aaaaaaaaaa";
    h.store.put(&github_secrets(name)).await.expect("put");
    let token = h.token(name);

    for (file, content) in files(name) {
        let path = format!("/api/v1/metadata/credentials/{}", &file[1..]);
        for path in [path.clone(), format!("{path}/")] {
            let resp = h.get(&path, Some(&token)).await;
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            assert_eq!(
                resp.headers()["content-disposition"],
                format!("attachment; filename={file}").as_str()
            );
            assert_eq!(resp.text().await.unwrap(), content, "{path}: decoded");
        }
    }
    let (status, _) = h
        .get_text("/api/v1/metadata/credentials/nothing", &token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    for path in [
        "/api/v1/metadata/install-script",
        "/api/v1/metadata/install-script/",
    ] {
        let resp = h.get(path, Some(&token)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(
            resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/plain")
        );
        let script = resp.text().await.unwrap();
        assert!(script.starts_with("#!/bin/bash\n"));
        assert!(script.contains(&format!("RUNNER_NAME='{name}'")));
        assert!(script.contains(&format!("BEARER_TOKEN='{token}'")));
        assert!(script.contains("/api/v1/callbacks'\n"));
        assert!(script.contains("/api/v1/metadata'\n"));
        assert!(script.contains("credentials/credentials_rsaparams"));
        assert!(
            !script.contains(&encoded_jit(name)),
            "the JIT config is fetched, never embedded"
        );
    }

    let (status, service) = h
        .get_text("/api/v1/metadata/system/service-name/", &token)
        .await;
    assert_eq!(
        (status, service.as_str()),
        (StatusCode::OK, "actions.runner.acme")
    );
    let (status, unit) = h
        .get_text("/api/v1/metadata/systemd/unit-file?runAsUser=ci", &token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(unit.contains("ExecStart=/home/ci/actions-runner/runsvc.sh\n"));
    assert!(unit.contains("User=ci\n"));
    let (status, unit) = h
        .get_text("/api/v1/metadata/systemd/unit-file/", &token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(unit.contains("User=runner\n"), "garm's default user");
    let (status, _) = h
        .get_text(
            "/api/v1/metadata/systemd/unit-file?runAsUser=x%0AExecStartPre%3D%2Fbin%2Fsh",
            &token,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no unit file injection");

    let resp = h
        .get("/api/v1/metadata/system/cert-bundle", Some(&token))
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let bundle: Value = resp.json().await.unwrap();
    assert_eq!(bundle, json!({"root_certificates": {}}));

    let meta: Value = h
        .get("/api/v1/metadata/runner-metadata/", Some(&token))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(meta["runner_name"], name);
    assert_eq!(meta["forge_type"], "github");
    assert_eq!(meta["jit_enabled"], true);
    assert_eq!(meta["runner_registration_url"], "https://github.com/acme");
    assert!(
        meta["metadata_access"]["metadata_url"]
            .as_str()
            .unwrap()
            .ends_with("/api/v1/metadata")
    );

    // A JIT runner has no use for a registration token: refused, as garm.
    let (status, _) = h
        .get_text("/api/v1/metadata/runner-registration-token/", &token)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let resp = h
        .post(
            "/api/v1/callbacks/system-info/",
            &token,
            r#"{"os_name": "Ubuntu", "os_version": "24.04", "agent_id": null}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = h
        .post(
            "/api/v1/callbacks/status",
            &token,
            r#"{"status": "installing", "message": "downloading"}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = h
        .post("/api/v1/callbacks/status", &token, "{not json")
        .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    h.stop().await;
}

#[tokio::test]
async fn a_token_reads_only_the_instance_it_names() {
    let h = Harness::start().await;
    let (a, b) = ("ry-linux-aaaaaaaaaa", "ry-linux-bbbbbbbbbb");
    h.store.put(&github_secrets(a)).await.unwrap();
    h.store.put(&github_secrets(b)).await.unwrap();
    let (ta, tb) = (h.token(a), h.token(b));
    let runner_of = |n: &str| files(n)[0].1.clone();

    // Whatever a request names, the token decides whose data it gets.
    for path in [
        "/api/v1/metadata/credentials/runner",
        &format!("/api/v1/metadata/credentials/runner?instance={b}&name={b}"),
        &format!("/api/v1/metadata/credentials/runner/?runner_name={b}"),
    ] {
        let (status, body) = h.get_text(path, &ta).await;
        assert_eq!((status, body), (StatusCode::OK, runner_of(a)), "{path}");
        let (status, body) = h.get_text(path, &tb).await;
        assert_eq!((status, body), (StatusCode::OK, runner_of(b)), "{path}");
    }
    let (status, body) = h
        .get_text(&format!("/api/v1/metadata/credentials/runner/{b}"), &ta)
        .await;
    assert_ne!(status, StatusCode::OK, "no route takes an instance name");
    assert!(!body.contains(b));
    let (_, script) = h
        .get_text(&format!("/api/v1/metadata/install-script?name={b}"), &ta)
        .await;
    assert!(script.contains(a) && !script.contains(b));
    let meta: Value = h
        .get("/api/v1/metadata/runner-metadata", Some(&tb))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(meta["runner_name"], b);

    // A token for an instance of another pool than its secrets say.
    let other_pool = h.tokens.mint(a, "other", HOUR).unwrap();
    let (status, _) = h
        .get_text("/api/v1/metadata/credentials/runner", &other_pool)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Once B's secrets are removed (its runner deleted), B's token opens
    // nothing and A's still works.
    h.store.remove(b).await;
    let (status, _) = h.get_text("/api/v1/metadata/credentials/runner", &tb).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = h.get_text("/api/v1/metadata/credentials/runner", &ta).await;
    assert_eq!(status, StatusCode::OK);
    h.stop().await;
}

#[tokio::test]
async fn missing_bad_foreign_and_expired_tokens_get_401_and_no_hint() {
    let h = Harness::start().await;
    let name = "ry-linux-aaaaaaaaaa";
    h.store.put(&github_secrets(name)).await.unwrap();
    let expired = h
        .tokens
        .mint(name, "linux", Duration::from_secs(1))
        .unwrap();
    let foreign = InstanceTokens::new(&SecretString::from("another-key".to_owned()))
        .mint(name, "linux", HOUR)
        .unwrap();
    let unknown = h.token("ry-linux-cccccccccc");

    let paths = [
        "/api/v1/metadata/credentials/runner",
        "/api/v1/metadata/install-script/",
        "/api/v1/metadata/runner-metadata",
        "/api/v1/metadata/system/service-name",
        "/api/v1/metadata/systemd/unit-file?runAsUser=runner",
        "/api/v1/metadata/system/cert-bundle/",
        "/api/v1/metadata/runner-registration-token",
    ];
    let no_hint = json!({"error": "Authentication failed"});
    // A one-second token is refused once its second has passed (the
    // clock is the wall's: tokens carry whole seconds).
    crate::support::until_async("the one-second token expired", async || {
        let resp = h.http.get(h.url(paths[0])).bearer_auth(&expired).send();
        resp.await.unwrap().status() == StatusCode::UNAUTHORIZED
    })
    .await;
    for path in paths {
        let mut cases: Vec<(&str, reqwest::RequestBuilder)> = vec![
            ("no token", h.http.get(h.url(path))),
            ("garbage", h.http.get(h.url(path)).bearer_auth("garbage")),
            ("expired", h.http.get(h.url(path)).bearer_auth(&expired)),
            ("another key", h.http.get(h.url(path)).bearer_auth(&foreign)),
            ("no secrets", h.http.get(h.url(path)).bearer_auth(&unknown)),
        ];
        cases.push((
            "not bearer",
            h.http
                .get(h.url(path))
                .header("authorization", format!("Basic {}", h.token(name))),
        ));
        for (what, req) in cases {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{what} on {path}");
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body, no_hint, "{what} on {path}");
        }
    }
    for path in ["/api/v1/callbacks/status", "/api/v1/callbacks/system-info/"] {
        let resp = h.post(path, &expired, r#"{"status": "idle"}"#).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    assert!(
        h.runner_events().await.is_empty(),
        "a refused callback records nothing"
    );
    h.stop().await;
}

#[tokio::test]
async fn an_idle_callback_is_runner_online_and_ends_the_token() {
    let h = Harness::start().await;
    let name = "ry-linux-aaaaaaaaaa";
    h.store.put(&github_secrets(name)).await.unwrap();
    let token = h.token(name);
    let resp = h
        .post(
            "/api/v1/callbacks/status/",
            &token,
            r#"{"status": "idle", "message": "runner successfully installed", "agent_id": 7}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);

    let ns = h.stack.ns.to_string();
    let events = h.runner_events().await;
    let online: Vec<_> = events
        .iter()
        .filter(|(_, e)| matches!(e.body, Some(Body::RunnerOnline(_))))
        .collect();
    assert_eq!(online.len(), 1, "{events:?}");
    let (subject, event) = online[0];
    assert_eq!(subject, &format!("{ns}.v1.runner.linux.online"));
    assert_eq!(event.id, format!("runner:{name}:online"));
    let Some(Body::RunnerOnline(o)) = &event.body else {
        unreachable!()
    };
    assert_eq!(o.source, "callback");
    let r = o.runner.as_ref().unwrap();
    assert_eq!((r.name.as_str(), r.pool.as_str()), (name, "linux"));
    assert_eq!(r.provider, "local");
    assert_eq!(r.instance, "github.com");
    let expected_pool_id =
        runyard_scaler::pool_id(&runyard_scaler::controller_id(&h.stack.ns), "linux");
    assert_eq!(r.pool_id, expected_pool_id.to_string());

    // Installed: the instance's secrets are gone, its token opens nothing.
    assert!(h.store.get(name).await.unwrap().is_none());
    let (status, _) = h
        .get_text("/api/v1/metadata/credentials/runner", &token)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    h.stop().await;
}

/// Whether process `pid` still runs (a zombie does not count).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|s| s != "Z" && s != "X")
}

#[tokio::test]
async fn a_failed_callback_removes_the_instance_and_the_engine_retries() {
    let h = Harness::start().await;
    // A runner the engine made for a job (the process provider: a pid file
    // per instance).
    h.stack.queued(1).await;
    let mut name = String::new();
    until_async("the runner is created", async || {
        name = h
            .runner_events()
            .await
            .into_iter()
            .find_map(|(_, e)| match e.body {
                Some(Body::RunnerCreated(c)) => c.runner.map(|r| r.name),
                _ => None,
            })
            .unwrap_or_default();
        !name.is_empty()
    })
    .await;
    let pool_id = runyard_scaler::pool_id(&runyard_scaler::controller_id(&h.stack.ns), "linux");
    let pid_file = h
        .stack
        .state_dir
        .path()
        .join("local")
        .join(pool_id.to_string())
        .join(format!("{name}.pid"));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .expect("pid file")
        .trim()
        .parse()
        .unwrap();
    assert!(running(pid));

    let secrets = github_secrets(&name);
    h.store.put(&secrets).await.unwrap();
    let token = h.tokens.mint_for(&secrets, 1, HOUR).unwrap();
    let resp = h
        .post(
            "/api/v1/callbacks/status",
            &token,
            r#"{"status": "failed", "message": "failed to download tools"}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::OK);

    let ns = h.stack.ns.to_string();
    let mut failed = None;
    until_async("RunnerFailed from the callback", async || {
        failed = h.runner_events().await.into_iter().find(
            |(_, e)| matches!(&e.body, Some(Body::RunnerFailed(f)) if f.reason == "create_failed"),
        );
        failed.is_some()
    })
    .await;
    let (subject, event) = failed.unwrap();
    assert_eq!(subject, format!("{ns}.v1.runner.linux.failed"));
    assert_eq!(event.id, format!("runner:{name}:failed:1"));
    let Some(Body::RunnerFailed(f)) = &event.body else {
        unreachable!()
    };
    assert_eq!(f.attempt, 1);
    assert!(!f.given_up);
    assert!(f.error.contains("failed to download tools"), "{}", f.error);
    assert_eq!(f.runner.as_ref().unwrap().name, name);
    assert!(!running(pid), "the failed instance is removed");
    assert!(h.store.get(&name).await.unwrap().is_none());

    // The engine takes it as a failed attempt and makes the next one.
    until_async("the second attempt", async || {
        h.runner_events()
            .await
            .iter()
            .any(|(_, e)| matches!(&e.body, Some(Body::RunnerCreated(c)) if c.attempt == 2))
    })
    .await;
    // The same callback again finds no instance to speak for.
    let resp = h
        .post(
            "/api/v1/callbacks/status",
            &token,
            r#"{"status": "failed", "message": "again"}"#,
        )
        .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    h.stop().await;
}

#[tokio::test]
async fn a_gitlab_instance_gets_its_runner_token_and_no_jit_files() {
    let h = Harness::start().await;
    let name = "ry-linux-dddddddddd";
    h.store
        .put(&InstanceSecrets {
            name: name.into(),
            pool: "linux".into(),
            forge: Forge::Gitlab,
            jit_config: "glrt-runner-token".into(),
            repo_url: "https://gitlab.example.com".into(),
            labels: vec!["docker".into()],
            runner_group: String::new(),
            nonce: String::new(),
        })
        .await
        .unwrap();
    let token = h.token(name);
    for path in [
        "/api/v1/metadata/runner-registration-token",
        "/api/v1/metadata/runner-registration-token/",
    ] {
        let (status, body) = h.get_text(path, &token).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::OK, "glrt-runner-token")
        );
    }
    let (status, _) = h
        .get_text("/api/v1/metadata/credentials/runner", &token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, script) = h.get_text("/api/v1/metadata/install-script/", &token).await;
    assert!(script.contains("FORGE_URL='https://gitlab.example.com'"));
    assert!(script.contains("runner-registration-token/"));
    assert!(
        !script.contains("glrt-runner-token"),
        "fetched, never embedded"
    );
    let meta: Value = h
        .get("/api/v1/metadata/runner-metadata", Some(&token))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(meta["forge_type"], "gitlab");
    assert_eq!(meta["jit_enabled"], false);
    h.stop().await;
}

#[tokio::test]
async fn a_gitlab_instance_is_set_up_to_run_one_job_and_stop() {
    let h = Harness::start().await;
    let name = "ry-linux-eeeeeeeeee";
    h.store
        .put(&InstanceSecrets {
            name: name.into(),
            pool: "linux".into(),
            forge: Forge::Gitlab,
            jit_config: "glrt-runner-token".into(),
            repo_url: "https://gitlab.example.com".into(),
            labels: vec!["docker".into()],
            runner_group: String::new(),
            nonce: String::new(),
        })
        .await
        .unwrap();
    let token = h.token(name);
    let (status, unit) = h
        .get_text("/api/v1/metadata/systemd/unit-file?runAsUser=ci", &token)
        .await;
    assert_eq!(status, StatusCode::OK);
    let exec: Vec<&str> = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart")
        .split_whitespace()
        .collect();
    // `gitlab-runner run` would take job after job; run-single with one
    // build exits after its job, so deleting the runner then kills nothing.
    assert_eq!(exec[1], "run-single", "{unit}");
    let pos = |flag: &str| exec.iter().position(|a| *a == flag).expect(flag);
    assert_eq!(exec[pos("--max-builds") + 1], "1");
    let wait: u64 = exec[pos("--wait-timeout") + 1].parse().unwrap();
    assert!(wait > 0, "{unit}");
    assert!(!exec.contains(&"run"), "{unit}");
    assert!(!unit.contains("glrt-runner-token"), "no token in the unit");
    let (_, script) = h.get_text("/api/v1/metadata/install-script/", &token).await;
    assert!(
        script.contains("CI_SERVER_TOKEN="),
        "run-single reads its token from runner.env"
    );
    assert!(!script.contains(" register "), "{script}");
    assert!(!script.contains("glrt-runner-token"));
    let out = std::process::Command::new("bash")
        .args(["-n", "-c", &script])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    h.stop().await;
}

#[tokio::test]
async fn the_api_speaks_tls_without_asking_instances_for_a_certificate() {
    runyard_telemetry::install_crypto_provider();
    let stack = Stack::new(&pool_toml(2, 0, "")).await;
    let pki = runyard_testkit::pki::TestPki::new();
    let mut config = stack.config();
    config.tls.cert = Some(pki.server.cert.clone());
    config.tls.key = Some(pki.server.key.clone());
    // mTLS on the scaler's HTTP listener; the metadata API never asks.
    config.tls.client_ca = Some(pki.ca_file.clone());
    let file = ScalerFile::parse(&stack.file).expect("valid scaler file");
    let app = Box::pin(App::build(config, Some(file)))
        .await
        .expect("scaler builds");
    let port = app.metadata_addr().expect("metadata API").port();
    let http_port = app.local_addr().port();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run(async move {
        let _ = rx.await;
    }));
    let store = SecretStore::open(&stack.bus, HOUR).await.expect("bucket");
    store
        .put(&github_secrets("ry-linux-tls"))
        .await
        .expect("put");
    let token = InstanceTokens::new(&SecretString::from(KEY.to_owned()))
        .mint("ry-linux-tls", "linux", HOUR)
        .expect("token");
    // An instance has no client certificate.
    let client = pki.https_client(None);
    let url =
        |scheme: &str| format!("{scheme}://localhost:{port}/api/v1/metadata/credentials/runner");
    let resp = client
        .get(url("https"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("https GET");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.text().await.expect("body"), files("ry-linux-tls")[0].1);
    // Plain HTTP gets no answer from a TLS listener.
    let plain = client.get(url("http")).bearer_auth(&token).send().await;
    assert!(plain.map(|r| r.status() != StatusCode::OK).unwrap_or(true));
    // The HTTP listener wants a certificate the client CA signed.
    let healthz = format!("https://127.0.0.1:{http_port}/healthz");
    for (who, c) in [
        ("no certificate", pki.https_client(None)),
        ("another CA's", pki.https_client(Some(&pki.other_client))),
    ] {
        let refused = c.get(&healthz).send().await;
        assert!(refused.is_err(), "{who}: {refused:?}");
    }
    let ok = pki
        .https_client(Some(&pki.client))
        .get(&healthz)
        .send()
        .await
        .expect("mTLS GET");
    assert_eq!(ok.status(), StatusCode::OK);
    let _ = tx.send(());
    let _ = task.await;
}

#[tokio::test]
async fn tls_settings_that_cannot_work_refuse_to_start() {
    runyard_telemetry::install_crypto_provider();
    let stack = Stack::new(&pool_toml(2, 0, "")).await;
    let pki = runyard_testkit::pki::TestPki::new();
    let build = |tweak: &dyn Fn(&mut runyard_scaler::Config)| {
        let mut config = stack.config();
        tweak(&mut config);
        let file = ScalerFile::parse(&stack.file).expect("valid scaler file");
        async move {
            match Box::pin(App::build(config, Some(file))).await {
                Ok(_) => panic!("built"),
                Err(e) => format!("{e:#}"),
            }
        }
    };
    let e = build(&|c| c.tls.cert = Some(pki.server.cert.clone())).await;
    assert!(
        e.contains("RUNYARD_SCALER_TLS_CERT") && e.contains("RUNYARD_SCALER_TLS_KEY"),
        "{e}"
    );
    // TLS files for the allocator with a plaintext allocator URL.
    let e = build(&|c| c.allocator_ca_file = Some(pki.ca_file.clone())).await;
    assert!(
        e.contains("RUNYARD_ALLOCATOR_CA_FILE") && e.contains("RUNYARD_ALLOCATOR_URL"),
        "{e}"
    );
    let e = build(&|c| {
        c.allocator_url = "https://allocator.example:50051".into();
        c.allocator_client_cert = Some(pki.client.cert.clone());
    })
    .await;
    assert!(
        e.contains("RUNYARD_ALLOCATOR_CLIENT_CERT") && e.contains("RUNYARD_ALLOCATOR_CLIENT_KEY"),
        "{e}"
    );
}

#[tokio::test]
async fn weak_secrets_refuse_to_start_naming_the_variable() {
    runyard_telemetry::install_crypto_provider();
    let stack = Stack::new(&pool_toml(2, 0, "")).await;
    let build = |config: runyard_scaler::Config| {
        let file = ScalerFile::parse(&stack.file).expect("valid scaler file");
        async move { Box::pin(App::build(config, Some(file))).await.map(drop) }
    };
    type Slot = fn(&mut runyard_scaler::Config) -> &mut Option<SecretString>;
    let slots: [(&str, Slot); 2] = [
        ("RUNYARD_SCALER_INSTANCE_TOKEN_KEY", |c| {
            &mut c.scaler_instance_token_key
        }),
        ("RUNYARD_ALLOCATOR_CLIENT_TOKEN", |c| {
            &mut c.allocator_client_token
        }),
    ];
    for (var, slot) in slots {
        for (value, why) in [
            ("change-me", "is a known placeholder"),
            ("Secret-1", "is a known placeholder"),
            ("k7Q2mZ9xR4vB1nL8", "is 16 bytes long, shorter than 32"),
            ("", "is empty"),
        ] {
            let mut config = stack.config();
            *slot(&mut config) = Some(value.to_owned().into());
            let e = format!("{:#}", build(config).await.expect_err("refused"));
            assert!(e.contains(&format!("{var} {why}")), "{var}={value:?}: {e}");
            assert!(e.contains("openssl rand -hex 32"), "{e}");
        }
    }
    // RUNYARD_INSECURE_DEV=1 lets them through; forge tokens are never
    // judged (the stack's GitHub token is short).
    let mut config = stack.config();
    config.scaler_instance_token_key = Some("change-me".to_owned().into());
    config.insecure_dev = true;
    build(config).await.expect("insecure dev starts");
    build(stack.config())
        .await
        .expect("a short forge token starts");
}
