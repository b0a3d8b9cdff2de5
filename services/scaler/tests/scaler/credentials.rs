//! Which GitHub credential serves which pool, checked against the fake
//! GitHub's rules: a GitHub App cannot manage enterprise runners.

use runyard_events::JobStatus;
use runyard_scaler::{App, ScalerFile};
use runyard_testkit::fake_github::AppKey;

use crate::support::{Stack, pool_toml, until};

const APP_ID: u64 = 77;

/// An enterprise pool beside the `linux` org pool, for jobs labelled
/// `self-hosted, enterprise`.
const ENTERPRISE_POOL: &str = r#"
[[pools]]
name = "ent"
forge = "github"
scope = { enterprise = "bigco" }
labels = ["self-hosted", "enterprise"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2
idle_timeout = "1s"
bootstrap_timeout = "30s"
"#;

/// The stack's settings with App credentials (and the token only when
/// `with_pat`).
fn app_config(stack: &Stack, with_pat: bool) -> runyard_scaler::Config {
    let key = stack.state_dir.path().join("app.pem");
    std::fs::write(&key, &AppKey::shared().private_pem).expect("write the key");
    let mut config = stack.config();
    config.github_app_id = Some(APP_ID);
    config.github_app_private_key_file = Some(key);
    if !with_pat {
        config.github_token = None;
    }
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enterprise_pool_with_app_credentials_only_is_refused_at_start() {
    let stack = Stack::new(&format!("{}{ENTERPRISE_POOL}", pool_toml(2, 0, ""))).await;
    stack
        .github
        .enable_app(APP_ID, &AppKey::shared().public_pem);
    let file = ScalerFile::parse(&stack.file).expect("valid file");
    let err = App::build(app_config(&stack, false), Some(file))
        .await
        .expect_err("refused");
    let text = format!("{err:#}");
    assert!(
        text.contains("pool \"ent\"")
            && text.contains("GitHub App cannot manage enterprise runners")
            && text.contains("RUNYARD_GITHUB_TOKEN"),
        "{text}"
    );
    assert!(
        stack.github.requests().is_empty(),
        "nothing sent: {:?}",
        stack.github.requests()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_and_an_app_the_enterprise_pool_uses_the_token_and_org_pools_the_app() {
    let stack = Stack::new(&format!("{}{ENTERPRISE_POOL}", pool_toml(2, 0, ""))).await;
    stack
        .github
        .enable_app(APP_ID, &AppKey::shared().public_pem);
    stack.github.add_installation("orgs/acme", 5);
    stack.github.require_token("test-token");
    let scaler = stack.start_with(app_config(&stack, true)).await;
    stack.queued(901).await;
    stack
        .observe(902, JobStatus::Queued, "", &["self-hosted", "enterprise"])
        .await;
    until("both runners", || stack.live_processes().len() == 2).await;
    let jits = |path: &str| -> Vec<String> {
        stack
            .github
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path == path)
            .map(|r| {
                let status = r.status;
                format!("{status} {}", r.credential.unwrap_or_default())
            })
            .collect()
    };
    assert_eq!(
        jits("/enterprises/bigco/actions/runners/generate-jitconfig"),
        ["201 Bearer test-token"],
        "the enterprise pool's JIT config carries the token"
    );
    let org = jits("/orgs/acme/actions/runners/generate-jitconfig");
    assert_eq!(org.len(), 1, "{org:?}");
    assert!(
        org[0].starts_with("201 Bearer ghs_"),
        "the org pool's JIT config carries the installation token: {org:?}"
    );
    assert_eq!(stack.github.tokens_issued(), 1);
    assert_eq!(
        stack.github.count("GET", "/enterprises/bigco/installation"),
        0
    );
    // Every enterprise call carried the token; no org call did.
    for r in stack.github.requests() {
        let credential = r.credential.clone().unwrap_or_default();
        if r.path.starts_with("/enterprises/") {
            assert_eq!(credential, "Bearer test-token", "{r:?}");
        } else if r.path.starts_with("/orgs/acme/actions") {
            assert!(credential.starts_with("Bearer ghs_"), "{r:?}");
        }
    }
    scaler.stop().await;
}
