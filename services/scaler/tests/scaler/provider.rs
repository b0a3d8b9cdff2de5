//! The `external` provider against a fake garm provider that checks every
//! call as garm-provider-common would (and stricter): the conformance
//! sequence under both interface versions, the bootstrap an instance gets
//! from a whole scaler (real nats-server, fake GitHub), each misbehaviour's
//! handling, and orphans, also those of a pool removed from the
//! configuration.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, Instant};

use base64::Engine as _;
use runyard_events::{Body, Event, Forge};
use runyard_scaler::metadata::{InstanceTokens, SecretStore};
use runyard_scaler::provider::{Bootstrap, CreateRequest, Provider, ProviderError};
use runyard_scaler::{Config, ScalerFile};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::fake::{self, FakeProvider, external_stack};
use crate::support::{Stack, pool_toml, until, until_async};

/// The key `support::Stack::config` gives the scaler.
const KEY: &str = "e6ba5d7d4016a15dcba16e8905f88fea35bfdd5cfeeb02b8bb711d5885495b87";

/// Host variables the tests let through (cargo sets them for every test
/// run); `PATH`, `HOME` and the rest must stay behind.
const PREFIX: &str = "CARGO_PKG_";

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

fn env<'a>(call: &'a Value, name: &str) -> Option<&'a str> {
    call["env"][name].as_str()
}

fn no_violations(fake: &FakeProvider) {
    assert!(
        fake.violations().is_empty(),
        "protocol violations: {:#?}",
        fake.violations()
    );
}

/// No call of the fake, nor a child it started, is left running.
async fn nothing_running(fake: &FakeProvider) {
    let pids: Vec<i32> = fake
        .call_pids()
        .into_iter()
        .chain(fake.children())
        .collect();
    until("every provider process gone", || {
        pids.iter().all(|p| !fake::alive(*p))
    })
    .await;
}

/// A provider built from configuration as the scaler builds it.
fn direct(fake: &FakeProvider, version: &str, exec_timeout: &str) -> Provider {
    let toml = fake.provider_toml("p", version, exec_timeout, &[PREFIX]);
    let file = ScalerFile::parse(&toml).expect("provider section");
    Provider::from_config(
        "p",
        &file.providers["p"],
        "ctl-1",
        std::path::Path::new("/tmp"),
    )
}

fn request(name: &str, pool_id: &str) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        pool: "linux".into(),
        pool_id: pool_id.into(),
        flavor: "small".into(),
        memory_bytes: 4 << 30,
        cpus: 2,
        image: "ubuntu:24.04".into(),
        labels: vec!["self-hosted".into(), "runyard-pool=linux".into()],
        jit_config: SecretString::from("jit".to_owned()),
        repo_url: "https://github.com/acme".into(),
        runner_group: String::new(),
        extra_specs: json!({"disk_gb": 20}),
        timeout: Duration::from_secs(20),
    }
}

fn bootstrap() -> Bootstrap {
    Bootstrap {
        tools: serde_json::from_value(json!([{
            "os": "linux", "architecture": "x64",
            "download_url": "https://example.com/r.tar.gz",
            "filename": "r.tar.gz", "sha256_checksum": "00"
        }]))
        .unwrap(),
        callback_url: "http://meta.test/api/v1/callbacks".into(),
        metadata_url: "http://meta.test/api/v1/metadata".into(),
        instance_token: SecretString::from("token".to_owned()),
        ..Bootstrap::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_sequence_passes_under_both_interface_versions() {
    for version in ["v0.1.0", "v0.1.1"] {
        let fake = FakeProvider::new(&[PREFIX]);
        let p = direct(&fake, version, "20s");
        let pool = "6f1c3a52-5d0e-5b8e-9a57-0a0c1d2e3f40";
        p.register_pool(pool, json!({"disk_gb": 20}));
        let created = p
            .create_with(&request("ry-linux-1", pool), &bootstrap())
            .await
            .expect("create");
        assert_eq!(created.name, "ry-linux-1");
        assert_eq!(created.status, "running");
        assert!(created.provider_id.starts_with("fp-"), "{created:?}");
        assert_eq!(created.addresses[0].address, "10.0.0.7");
        let got = p.get(pool, &created.provider_id).await.expect("get");
        assert_eq!(got, created);
        let listed = p.list(pool).await.expect("list");
        assert_eq!(listed, std::slice::from_ref(&created));
        assert!(p.list("another-pool").await.expect("list").is_empty());
        p.delete(pool, &created.provider_id).await.expect("delete");
        p.delete(pool, &created.provider_id)
            .await
            .expect("deleting a missing instance is a success");
        assert!(matches!(
            p.get(pool, &created.provider_id).await,
            Err(ProviderError::NotFound)
        ));
        assert!(p.list(pool).await.expect("list").is_empty());
        no_violations(&fake);

        // What went over the wire, command by command.
        let calls = fake.calls();
        let commands: Vec<&str> = calls
            .iter()
            .map(|c| c["command"].as_str().unwrap())
            .collect();
        assert_eq!(
            commands,
            [
                "CreateInstance",
                "GetInstance",
                "ListInstances",
                "ListInstances",
                "DeleteInstance",
                "DeleteInstance",
                "GetInstance",
                "ListInstances"
            ]
        );
        for c in &calls {
            assert_eq!(env(c, "GARM_INTERFACE_VERSION"), Some(version));
            assert_eq!(env(c, "GARM_CONTROLLER_ID"), Some("ctl-1"));
            assert!(env(c, "PATH").is_none() && env(c, "HOME").is_none(), "{c}");
            assert!(env(c, "CARGO_PKG_NAME").is_some(), "a listed prefix passes");
            assert!(
                env(c, "CARGO_MANIFEST_DIR").is_none(),
                "an unlisted one not"
            );
            let per_instance = c["command"] == "GetInstance" || c["command"] == "DeleteInstance";
            assert_eq!(env(c, "GARM_INSTANCE_ID").is_some(), per_instance, "{c}");
            if version == "v0.1.1" || !per_instance {
                assert!(env(c, "GARM_POOL_ID").is_some(), "{c}");
            } else {
                assert!(env(c, "GARM_POOL_ID").is_none(), "{c}");
            }
            let specs = env(c, "GARM_POOL_EXTRASPECS");
            assert_eq!(specs.is_some(), version == "v0.1.1", "{c}");
            if let Some(specs) = specs {
                let specs: Value = serde_json::from_slice(&b64(specs)).unwrap();
                if env(c, "GARM_POOL_ID") == Some(pool) {
                    assert_eq!(specs["disk_gb"], 20, "the pool's own: {c}");
                } else {
                    assert_eq!(specs, json!({}), "a pool not registered: {c}");
                }
                let with_template = specs.get("runner_install_template").is_some();
                assert_eq!(with_template, c["command"] == "CreateInstance", "{c}");
            }
            assert_eq!(c["stdin"] != "", c["command"] == "CreateInstance");
        }
        assert_eq!(
            env(&calls[1], "GARM_INSTANCE_ID"),
            Some(created.provider_id.as_str())
        );
        let boot: Value = serde_json::from_str(calls[0]["stdin"].as_str().unwrap()).unwrap();
        assert_eq!(boot["instance-token"], "token");
        assert_eq!(boot["tools"][0]["filename"], "r.tar.gz");
        assert_eq!(boot["extra_specs"]["disk_gb"], 20);
        nothing_running(&fake).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_timeout_is_killed_with_its_process_group() {
    let fake = FakeProvider::new(&[PREFIX]);
    let p = direct(&fake, "v0.1.1", "1s");
    let pool = "pool-1";
    fake.set_faults("ListInstances", &["hang"]);
    let started = Instant::now();
    let r = p.list(pool).await;
    assert!(
        matches!(r, Err(ProviderError::Timeout(d)) if d == Duration::from_secs(1)),
        "{r:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // A create is bounded by its own timeout (the pool's bootstrap timeout).
    fake.set_faults("CreateInstance", &["hang"]);
    let mut req = request("ry-linux-hung", pool);
    req.timeout = Duration::from_millis(1500);
    let r = p.create_with(&req, &bootstrap()).await;
    assert!(matches!(r, Err(ProviderError::Timeout(_))), "{r:?}");
    assert_eq!(fake.children().len(), 2, "each hung call started a child");
    nothing_running(&fake).await;
    // The hung create made its instance; deleting by name removes it.
    assert_eq!(fake.instance_names(), ["ry-linux-hung"]);
    p.delete(pool, "ry-linux-hung").await.expect("delete");
    assert!(fake.instance_names().is_empty());
    no_violations(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_answers_are_provider_errors() {
    let fake = FakeProvider::new(&[PREFIX]);
    let p = direct(&fake, "v0.1.0", "20s");
    let pool = "pool-1";
    let made = p
        .create_with(&request("ry-linux-1", pool), &bootstrap())
        .await
        .expect("create");
    fake.set_faults(
        "ListInstances",
        &["malformed", "empty", "bad_status", "bad_fault"],
    );
    for _ in 0..4 {
        let r = p.list(pool).await;
        assert!(matches!(r, Err(ProviderError::Malformed(_))), "{r:?}");
    }
    fake.set_faults("GetInstance", &["malformed", "bad_status", "bad_fault"]);
    for what in ["instance JSON", "status \"exploded\"", "not base64"] {
        let r = p.get(pool, &made.provider_id).await;
        match r {
            Err(ProviderError::Malformed(m)) => assert!(m.contains(what), "{m}"),
            other => panic!("{what}: {other:?}"),
        }
    }
    fake.set_faults("CreateInstance", &["no_id", "exit1"]);
    let r = p
        .create_with(&request("ry-linux-2", pool), &bootstrap())
        .await;
    assert!(matches!(r, Err(ProviderError::Malformed(_))), "{r:?}");
    let r = p
        .create_with(&request("ry-linux-3", pool), &bootstrap())
        .await;
    match r {
        Err(ProviderError::Exit { code: 1, stderr }) => {
            assert!(stderr.contains("quota exceeded"), "{stderr}");
        }
        other => panic!("{other:?}"),
    }
    // Exit 31 on create: the instance exists; it is adopted.
    fake.set_faults("CreateInstance", &["exit31"]);
    let adopted = p
        .create_with(&request("ry-linux-1", pool), &bootstrap())
        .await
        .expect("adopted");
    assert_eq!(adopted.provider_id, made.provider_id);
    // Exit 30 on delete is a success.
    fake.set_faults("DeleteInstance", &["exit30"]);
    p.delete(pool, &made.provider_id).await.expect("exit 30");
    // An instance in error: its provider id comes back to delete it by.
    fake.set_faults("CreateInstance", &["error_status"]);
    let r = p
        .create_with(&request("ry-linux-4", pool), &bootstrap())
        .await;
    match r {
        Err(ProviderError::InstanceError { provider_id, fault }) => {
            assert!(provider_id.starts_with("fp-"));
            assert_eq!(fault, "image not found");
        }
        other => panic!("{other:?}"),
    }
    no_violations(&fake);
    nothing_running(&fake).await;
}

fn config(stack: &Stack) -> Config {
    Config {
        scaler_metadata_url: Some("http://metadata.test:8084/".into()),
        ..stack.config()
    }
}

fn job_runner(job: u64) -> String {
    runyard_events::instance_name(
        "linux",
        &runyard_events::claim_key(Forge::Github, "github.com", job, 1),
    )
}

fn reasons(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerFailed(f)) => Some(("failed".into(), f.reason.clone())),
            Some(Body::RunnerDeleted(d)) => Some(("deleted".into(), d.reason.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_job_gets_an_instance_with_the_whole_bootstrap() {
    for version in ["v0.1.0", "v0.1.1"] {
        let (stack, fake) = external_stack(version, "30s", "extra_specs = { disk_gb = 20 }").await;
        let scaler = stack.start_with(config(&stack)).await;
        let store = SecretStore::open(&stack.bus, Duration::from_secs(3600))
            .await
            .unwrap();
        stack.queued(101).await;
        let name = job_runner(101);
        until("the instance", || fake.instance_names() == [name.clone()]).await;
        let create = fake.calls_of("CreateInstance").remove(0);
        let boot: Value = serde_json::from_str(create["stdin"].as_str().unwrap()).unwrap();
        assert_eq!(boot["name"], name.as_str());
        assert_eq!(
            boot["callback-url"],
            "http://metadata.test:8084/api/v1/callbacks"
        );
        assert_eq!(
            boot["metadata-url"],
            "http://metadata.test:8084/api/v1/metadata"
        );
        let claims = InstanceTokens::new(&SecretString::from(KEY.to_owned()))
            .verify(boot["instance-token"].as_str().unwrap())
            .expect("the token verifies with the key");
        assert_eq!(
            (claims.sub.as_str(), claims.pool.as_str()),
            (name.as_str(), "linux")
        );
        assert_eq!(claims.attempt, 1);
        assert_eq!(boot["tools"], Value::Array(stack.github.runner_downloads()));
        assert_eq!(boot["extra_specs"]["disk_gb"], 20);
        let template = b64(boot["extra_specs"]["runner_install_template"]
            .as_str()
            .unwrap());
        assert_eq!(
            String::from_utf8(template).unwrap(),
            runyard_scaler::provider::template::GITHUB_LINUX
        );
        assert_eq!(boot["repo_url"], "https://github.com/acme");
        assert_eq!(boot["jit_config_enabled"], true);
        assert_eq!(boot["labels"], Value::Null);
        assert_eq!(
            (boot["os_type"].as_str(), boot["arch"].as_str()),
            (Some("linux"), Some("amd64"))
        );
        assert_eq!(boot["flavor"], "small");
        let controller = runyard_scaler::controller_id(&stack.ns).to_string();
        let pool_id = runyard_scaler::pool_id(&runyard_scaler::controller_id(&stack.ns), "linux");
        assert_eq!(boot["pool_id"], pool_id.to_string());
        assert_eq!(
            env(&create, "GARM_CONTROLLER_ID"),
            Some(controller.as_str())
        );
        // The metadata API can serve the instance its JIT configuration.
        let secrets = store.get(&name).await.unwrap().expect("secrets stored");
        let jit = runyard_testkit::fake_github::decode_jit_config(&secrets.jit_config).unwrap();
        assert_eq!(jit.name, name);
        assert_eq!(secrets.forge, Forge::Github);

        // Online, takes the job, finishes: the instance and its secrets go.
        stack.github.set_online(name.as_str());
        until_async("RunnerOnline", async || {
            !stack.runner_events("RunnerOnline").await.is_empty()
        })
        .await;
        stack.started(101, &name).await;
        stack.completed(101, &name).await;
        until("the instance deleted", || fake.instance_names().is_empty()).await;
        until_async("RunnerDeleted", async || {
            !stack.runner_events("RunnerDeleted").await.is_empty()
        })
        .await;
        assert!(store.get(&name).await.unwrap().is_none(), "secrets removed");
        // A second job: the runner downloads come from the cache.
        stack.queued(102).await;
        until("the second instance", || {
            fake.instance_names() == [job_runner(102)]
        })
        .await;
        assert_eq!(
            stack
                .github
                .count("GET", "/orgs/acme/actions/runners/downloads"),
            1,
            "read once an hour"
        );
        let delete = fake.calls_of("DeleteInstance").remove(0);
        assert!(
            env(&delete, "GARM_INSTANCE_ID").unwrap().starts_with("fp-"),
            "by provider id"
        );
        no_violations(&fake);
        scaler.stop().await;
        nothing_running(&fake).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_a_failed_create_attempt_opens_nothing_of_the_next() {
    let (stack, fake) = external_stack("v0.1.1", "30s", "").await;
    // The first create fails after the provider was handed its token (a
    // machine of it may still boot); the second makes the instance.
    fake.set_faults("CreateInstance", &["exit1"]);
    let scaler = stack.start_with(config(&stack)).await;
    let metadata = scaler.metadata.expect("the metadata API is served");
    stack.queued(301).await;
    let name = job_runner(301);
    until("the second attempt's instance", || {
        fake.calls_of("CreateInstance").len() == 2 && fake.instance_names() == [name.clone()]
    })
    .await;
    let tokens: Vec<String> = fake
        .calls_of("CreateInstance")
        .iter()
        .map(|c| {
            let boot: Value = serde_json::from_str(c["stdin"].as_str().unwrap()).unwrap();
            boot["instance-token"].as_str().unwrap().to_owned()
        })
        .collect();
    let verify = InstanceTokens::new(&SecretString::from(KEY.to_owned()));
    let attempts: Vec<u32> = tokens
        .iter()
        .map(|t| verify.verify(t).unwrap().attempt)
        .collect();
    assert_eq!(attempts, [1, 2]);
    let (stale, current) = (&tokens[0], &tokens[1]);

    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{metadata}/api/v1/{path}");
    let get = async |path: &str, token: &str| {
        let r = http.get(url(path)).bearer_auth(token).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    };
    // The first attempt's token: refused on every route, saying why.
    for path in [
        "metadata/credentials/runner",
        "metadata/credentials/credentials_rsaparams",
        "metadata/install-script",
        "metadata/runner-metadata",
    ] {
        let (status, body) = get(path, stale).await;
        assert_eq!(status, 403, "{path}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            body["details"],
            runyard_scaler::metadata::api::STALE_ATTEMPT,
            "{path}"
        );
    }
    let r = http
        .post(url("callbacks/status"))
        .bearer_auth(stale)
        .body(r#"{"status": "failed", "message": "left over"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    // The second attempt's instance was not failed for it.
    stack.settled(&scaler).await;
    assert_eq!(fake.instance_names(), std::slice::from_ref(&name));
    let failed: Vec<u32> = stack
        .events()
        .await
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerFailed(f)) => Some(f.attempt),
            _ => None,
        })
        .collect();
    assert_eq!(failed, [1], "only the first attempt failed");

    // The second attempt's own token opens its data (the fake GitHub's
    // JIT configuration is no map of files, so its metadata and script).
    let (status, meta) = get("metadata/runner-metadata", current).await;
    assert_eq!(status, 200, "{meta}");
    let meta: Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(meta["runner_name"], name.as_str());
    let (status, script) = get("metadata/install-script", current).await;
    assert_eq!(status, 200, "{script}");
    assert!(script.contains(current.as_str()));
    no_violations(&fake);
    scaler.stop().await;
    nothing_running(&fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_misbehaviour_is_handled_and_nothing_leaks() {
    let (stack, fake) = external_stack("v0.1.1", "4s", "").await;
    // Answers that are not instances, an instance in error, a hung call:
    // each a failed attempt whose instance is deleted; the sixth works.
    fake.set_faults(
        "CreateInstance",
        &["bad_status", "no_id", "bad_fault", "error_status"],
    );
    let scaler = stack.start_with(config(&stack)).await;
    stack.queued(201).await;
    let name = job_runner(201);
    until("four failures, then an instance", || {
        fake.calls_of("CreateInstance").len() == 5 && fake.instance_names() == [name.clone()]
    })
    .await;
    // The machine boots (before the 4 s bootstrap timeout reaps it).
    stack.github.set_online(name.as_str());
    until_async("the created runner", async || {
        !stack.runner_events("RunnerCreated").await.is_empty()
    })
    .await;
    let failed = reasons(&stack.events().await);
    assert_eq!(
        failed,
        vec![("failed".into(), "create_failed".into()); 4],
        "{failed:?}"
    );
    let errors: Vec<String> = stack
        .events()
        .await
        .iter()
        .filter_map(|e| match &e.body {
            Some(Body::RunnerFailed(f)) => Some(f.error.clone()),
            _ => None,
        })
        .collect();
    assert!(errors[0].contains("exploded"), "{errors:?}");
    assert!(errors[2].contains("base64"), "{errors:?}");
    assert!(errors[3].contains("image not found"), "{errors:?}");
    // The instance in error was deleted by its provider id, the others by
    // name (no usable answer came back).
    let deletes: Vec<String> = fake
        .calls_of("DeleteInstance")
        .iter()
        .map(|c| env(c, "GARM_INSTANCE_ID").unwrap().to_owned())
        .collect();
    assert_eq!(deletes.len(), 4, "{deletes:?}");
    assert_eq!(deletes[..3], [name.clone(), name.clone(), name.clone()]);
    assert!(deletes[3].starts_with("fp-"), "{deletes:?}");

    // Exit 30 when the runner is deleted: a success (the runner is recorded
    // deleted); what the provider still has is then an orphan, and goes.
    fake.set_faults("DeleteInstance", &["exit30"]);
    stack.started(201, &name).await;
    stack.completed(201, &name).await;
    until_async("RunnerDeleted", async || {
        !stack.runner_events("RunnerDeleted").await.is_empty()
    })
    .await;
    until("the orphan deleted", || fake.instance_names().is_empty()).await;
    assert_eq!(fake.pending_faults("DeleteInstance"), 0);

    // A hung create is killed at the bootstrap timeout, with its child.
    fake.set_faults("CreateInstance", &["hang"]);
    stack.queued(202).await;
    until("the hung create retried", || {
        fake.calls_of("CreateInstance").len() == 7 && fake.instance_names() == [job_runner(202)]
    })
    .await;
    stack.github.set_online(job_runner(202).as_str());
    assert_eq!(fake.children().len(), 1);
    stack.started(202, &job_runner(202)).await;
    stack.completed(202, &job_runner(202)).await;
    until("scaled down", || fake.instance_names().is_empty()).await;
    no_violations(&fake);
    scaler.stop().await;
    nothing_running(&fake).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_is_started_once_then_replaced() {
    let (stack, fake) = external_stack("v0.1.1", "30s", "stopped = \"start\"").await;
    let scaler = stack.start_with(config(&stack)).await;
    stack.queued(301).await;
    let name = job_runner(301);
    until("the instance", || fake.instance_names() == [name.clone()]).await;
    stack.github.set_online(name.as_str());
    until_async("RunnerOnline", async || {
        !stack.runner_events("RunnerOnline").await.is_empty()
    })
    .await;
    let first = fake.instances()[0]["provider_id"].clone();
    fake.set_status(&name, "stopped");
    until("started again", || {
        fake.calls_of("StartInstance").len() == 1 && fake.instances()[0]["status"] == "running"
    })
    .await;
    assert_eq!(
        env(&fake.calls_of("StartInstance")[0], "GARM_INSTANCE_ID"),
        first.as_str()
    );
    // Stopped again: replaced (removed, made again under the same name).
    fake.set_status(&name, "stopped");
    until_async("replaced", async || {
        reasons(&stack.events().await).contains(&("failed".into(), "instance_stopped".into()))
    })
    .await;
    until("a new instance", || {
        fake.instances()
            .first()
            .is_some_and(|i| i["provider_id"] != first && i["status"] == "running")
    })
    .await;
    assert_eq!(fake.calls_of("StartInstance").len(), 1);
    assert_eq!(fake.calls_of("CreateInstance").len(), 2);
    no_violations(&fake);
    scaler.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_instances_of_a_pool_removed_from_the_configuration_are_deleted() {
    let fake = FakeProvider::new(&[]);
    let providers = fake.provider_toml("local", "v0.1.1", "5s", &[]);
    // Pool "old" takes the job (higher priority); "linux" stays.
    let old = pool_toml(5, 0, "priority = 10").replace("name = \"linux\"", "name = \"old\"");
    let both = format!("{old}\n{}", pool_toml(5, 0, ""));
    let mut stack = Stack::with_provider(&both, &providers).await;
    let scaler = stack.start_with(config(&stack)).await;
    stack.queued(401).await;
    let name = runyard_events::instance_name(
        "old",
        &runyard_events::claim_key(Forge::Github, "github.com", 401, 1),
    );
    until("the old pool's instance", || {
        fake.instance_names() == [name.clone()]
    })
    .await;
    until_async("RunnerCreated", async || {
        !stack.runner_events("RunnerCreated").await.is_empty()
    })
    .await;
    scaler.stop().await;

    // The pool goes from the configuration; its instance stays behind.
    let only_linux = stack.file.replace(&old, "");
    assert!(!only_linux.contains("\"old\""));
    stack.file = only_linux;
    let scaler = stack.start_with(config(&stack)).await;
    until("the removed pool's instance deleted", || {
        fake.instance_names().is_empty()
    })
    .await;
    let old_id =
        runyard_scaler::pool_id(&runyard_scaler::controller_id(&stack.ns), "old").to_string();
    let lists = fake.calls_of("ListInstances");
    assert!(
        lists
            .iter()
            .any(|c| env(c, "GARM_POOL_ID") == Some(old_id.as_str())),
        "the removed pool's id is listed"
    );
    let delete = fake.calls_of("DeleteInstance").pop().unwrap();
    assert_eq!(env(&delete, "GARM_POOL_ID"), Some(old_id.as_str()));
    until_async("RunnerDeleted pool_removed", async || {
        reasons(&stack.events().await).contains(&("deleted".into(), "pool_removed".into()))
    })
    .await;
    no_violations(&fake);
    scaler.stop().await;
    nothing_running(&fake).await;
}

/// An environment to run the fake with.
type Env = Vec<(&'static str, String)>;

/// Runs the fake directly with `env` (nothing else) and `stdin`.
fn run_fake(env: &[(&str, String)], stdin: &str) -> std::process::Output {
    use std::io::Write as _;
    let mut child = std::process::Command::new(fake::executable())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fake starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn the_fake_refuses_what_garm_would_and_more() {
    let fake = FakeProvider::new(&[]);
    let base = |command: &str, version: &str| -> Vec<(&'static str, String)> {
        vec![
            ("GARM_COMMAND", command.to_owned()),
            ("GARM_CONTROLLER_ID", "ctl".to_owned()),
            (
                "GARM_PROVIDER_CONFIG_FILE",
                fake.config_file().display().to_string(),
            ),
            ("GARM_INTERFACE_VERSION", version.to_owned()),
        ]
    };
    let specs = base64::engine::general_purpose::STANDARD.encode("{}");
    let with = |mut env: Vec<(&'static str, String)>, extra: &[(&'static str, &str)]| {
        env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
        env
    };
    // Right: a v0.1.0 list, a v0.1.1 delete of a missing instance (30).
    let ok = run_fake(
        &with(base("ListInstances", "v0.1.0"), &[("GARM_POOL_ID", "p")]),
        "",
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let missing = run_fake(
        &with(
            base("DeleteInstance", "v0.1.1"),
            &[
                ("GARM_POOL_ID", "p"),
                ("GARM_POOL_EXTRASPECS", &specs),
                ("GARM_INSTANCE_ID", "i"),
            ],
        ),
        "",
    );
    assert_eq!(missing.status.code(), Some(30));
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());

    let boot = |mutate: &dyn Fn(&mut Value)| {
        let mut b = json!({
            "name": "n", "tools": [], "repo_url": "https://github.com/acme",
            "callback-url": "http://m/api/v1/callbacks", "metadata-url": "http://m/api/v1/metadata",
            "instance-token": "t", "ssh-keys": [], "github-runner-group": "",
            "ca-cert-bundle": null, "arch": "amd64", "os_type": "linux", "flavor": "f",
            "image": "i", "labels": null, "pool_id": "p",
            "user_data_options": {"disable_updates_on_boot": false, "extra_packages": [], "enable_boot_debug": false},
            "jit_config_enabled": true,
            "proxy_config": {"http_proxy": "", "https_proxy": "", "no_proxy": ""}
        });
        mutate(&mut b);
        b.to_string()
    };
    let create = with(base("CreateInstance", "v0.1.0"), &[("GARM_POOL_ID", "p")]);
    let template = |t: &str| {
        let t = base64::engine::general_purpose::STANDARD.encode(t);
        move |b: &mut Value| b["extra_specs"] = json!({"runner_install_template": t})
    };
    let good = run_fake(
        &create,
        &boot(&template("#!/bin/bash\necho '{{ .RunnerName }}'\n")),
    );
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let wrong: Vec<(&str, Env, String)> = vec![
        (
            "no pool id on a v0.1.1 delete",
            with(
                base("DeleteInstance", "v0.1.1"),
                &[("GARM_POOL_EXTRASPECS", &specs), ("GARM_INSTANCE_ID", "i")],
            ),
            String::new(),
        ),
        (
            "a pool id on a v0.1.0 delete",
            with(
                base("DeleteInstance", "v0.1.0"),
                &[("GARM_POOL_ID", "p"), ("GARM_INSTANCE_ID", "i")],
            ),
            String::new(),
        ),
        (
            "PATH",
            with(
                base("ListInstances", "v0.1.0"),
                &[("GARM_POOL_ID", "p"), ("PATH", "/bin")],
            ),
            String::new(),
        ),
        (
            "extra specs not base64",
            with(
                base("ListInstances", "v0.1.1"),
                &[("GARM_POOL_ID", "p"), ("GARM_POOL_EXTRASPECS", "%%")],
            ),
            String::new(),
        ),
        (
            "stdin on a list",
            with(base("ListInstances", "v0.1.0"), &[("GARM_POOL_ID", "p")]),
            "{}".into(),
        ),
        (
            "a bootstrap without proxy_config",
            create.clone(),
            boot(&|b: &mut Value| {
                b.as_object_mut().unwrap().remove("proxy_config");
            }),
        ),
        (
            "a template with an unknown field",
            create.clone(),
            boot(&template("echo {{ .Bogus }}")),
        ),
        (
            "a template that is not bash",
            create.clone(),
            boot(&template("if then fi {{ .RunnerName }}")),
        ),
    ];
    for (i, (what, env, stdin)) in wrong.iter().enumerate() {
        let out = run_fake(env, stdin);
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("protocol violation"),
            "{what}"
        );
        assert_eq!(fake.violations().len(), i + 1, "{what}");
    }
}
