//! Scale-set pools: `runyard pools` shows their sessions under the pools
//! table, and `runyard doctor` checks their Actions service admin
//! connection and labels with the scaler's GitHub variables. The stack is
//! the real one ([`crate::stack`]); the scaler holds a scale set's session
//! on the fake Actions service, brokered by the fake GitHub.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use runyard_testkit::fake_github::AppKey;
use serde_json::Value;

use crate::stack::{
    GITHUB_TOKEN, SCALER_FILE, Stack, Target, WAIT, checks, code, json, runyard, stderr, stdout,
};

/// A scale-set pool on the webhook pool's org.
const SCALE_SET_POOL: &str = r#"
[[pools]]
name = "cli-set"
forge = "github"
mode = "scale-set"
scope = { org = "octo-org" }
labels = ["linux", "x64"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2
"#;

/// The same pool asking for other labels than its scale set was made
/// with, a pool whose runner group does not exist, and one whose scale set
/// is not made yet.
const MISCONFIGURED: &str = r#"
[[pools]]
name = "cli-set"
forge = "github"
mode = "scale-set"
scope = { org = "octo-org" }
labels = ["linux", "gpu"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2

[[pools]]
name = "cli-grouped"
forge = "github"
mode = "scale-set"
runner_group = "no-such-group"
scope = { org = "octo-org" }
labels = []
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2

[[pools]]
name = "cli-later"
forge = "github"
mode = "scale-set"
scope = { org = "octo-org" }
labels = ["arm64"]
provider = "local"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }]
max_runners = 2
"#;

/// The stack with a webhook pool and [`SCALE_SET_POOL`], once the scaler
/// holds the scale set's session.
async fn stack() -> Stack {
    let stack = Stack::start_with_pools(&format!("{SCALER_FILE}{SCALE_SET_POOL}")).await;
    // Only the scaler's token from now on.
    stack.github.require_token(GITHUB_TOKEN);
    let active = runyard_testkit::eventually(WAIT, || async {
        let o = runyard(&stack.target, &["pools", "--json"]).await;
        let pools = json(&o);
        let set = pools["pools"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == "cli-set")?["scale_set"]
            .clone();
        (set["state"] == "active").then_some(())
    })
    .await;
    assert!(active.is_some(), "the scaler never held the session");
    stack
}

/// The target with the scaler's file and GitHub variables.
fn with(stack: &Stack, file: &std::path::Path, env: &[(&str, &str)]) -> Target {
    let mut t = stack.target.clone();
    t.env
        .push(("RUNYARD_SCALER_CONFIG".into(), file.display().to_string()));
    t.env
        .push(("RUNYARD_GITHUB_API_URL".into(), stack.github.url()));
    t.env
        .extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    t
}

async fn doctor(t: &Target) -> (i32, Value, String) {
    let o = runyard(t, &["doctor", "--json"]).await;
    let all = format!("{}{}", stdout(&o), stderr(&o));
    (code(&o), json(&o), all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_show_the_scale_set_session_under_the_pools_table() {
    let stack = stack().await;
    let set = &stack.actions.scale_sets()[0];
    assert_eq!(set.name, "cli-set");

    let o = runyard(&stack.target, &["pools"]).await;
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    let (pools, sets) = text
        .split_once(
            "\nscale sets (jobs: available/assigned/running; runners: registered/busy/idle)\n",
        )
        .unwrap_or_else(|| panic!("no scale sets table:\n{text}"));
    // The pools table as it always was, both pools in it.
    let pools: Vec<&str> = pools.lines().collect();
    assert!(
        pools[0].starts_with("POOL ") && pools[0].ends_with(" MAX"),
        "{text}"
    );
    assert_eq!(pools.len(), 3, "{text}");
    // The scale set's row: only the scale-set pool.
    let sets: Vec<Vec<&str>> = sets
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(sets.len(), 2, "{text}");
    assert_eq!(sets[0][..4], ["POOL", "SCALE", "SET", "ID"], "{text}");
    let id = set.id.to_string();
    assert_eq!(
        sets[1][..4],
        ["cli-set", "cli-set", id.as_str(), "active"],
        "{text}"
    );
    // No message yet; the service answered when the session was made; the
    // fake's counts; no error.
    assert_eq!(sets[1][4], "-", "{text}");
    assert!(sets[1][5].ends_with('s') && sets[1][6] == "ago", "{text}");
    assert_eq!(sets[1][7..], ["0/0/0", "0/0/0", "-"], "{text}");
    stack.db.drop_db().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_checks_each_scale_set_pools_admin_connection_and_labels() {
    let stack = stack().await;
    let file = stack.scaler_file.clone();

    // The scaler's token: every check passes.
    let t = with(&stack, &file, &[("RUNYARD_GITHUB_TOKEN", GITHUB_TOKEN)]);
    let (c, report, all) = doctor(&t).await;
    assert_eq!(c, 0, "{report:#}");
    let found = checks(&report);
    let (outcome, detail, _) = &found["scale_set.cli-set.admin"];
    assert_eq!(outcome, "ok", "{detail}");
    assert!(
        detail.contains("org octo-org") && detail.contains("https://github.com/octo-org"),
        "{detail}"
    );
    assert!(detail.contains("RUNYARD_GITHUB_TOKEN"), "{detail}");
    let (outcome, detail, _) = &found["scale_set.cli-set.labels"];
    assert_eq!(outcome, "ok", "{detail}");
    assert!(detail.contains("cli-set, linux, x64"), "{detail}");
    assert!(
        !found.keys().any(|k| k.starts_with("scale_set.cli-test")),
        "webhook pools have no such check: {found:#?}"
    );
    assert!(!all.contains(GITHUB_TOKEN), "{all}");
    // Read from a file as well (RUNYARD_GITHUB_TOKEN_FILE), as the scaler does.
    let token_file = file.with_file_name("github-token");
    std::fs::write(&token_file, format!("{GITHUB_TOKEN}\n")).unwrap();
    let t = with(
        &stack,
        &file,
        &[(
            "RUNYARD_GITHUB_TOKEN_FILE",
            &token_file.display().to_string(),
        )],
    );
    let (c, report, _) = doctor(&t).await;
    assert_eq!(c, 0, "{report:#}");

    // A GitHub App instead: refused until it is installed on the org.
    let key = AppKey::shared();
    stack.github.enable_app(4711, &key.public_pem);
    let key_file = file.with_file_name("app.pem");
    std::fs::write(&key_file, &key.private_pem).unwrap();
    let app = [
        ("RUNYARD_GITHUB_APP_ID", "4711"),
        (
            "RUNYARD_GITHUB_APP_PRIVATE_KEY_FILE",
            &key_file.display().to_string(),
        ),
    ];
    let (c, report, _) = doctor(&with(&stack, &file, &app)).await;
    assert_eq!(c, 1, "{report:#}");
    let (outcome, detail, fix) = &checks(&report)["scale_set.cli-set.admin"];
    assert_eq!(outcome, "fail", "{detail}");
    assert!(
        detail.contains("GitHub App 4711 is not installed on org octo-org"),
        "{detail}"
    );
    assert!(fix.contains("install the App"), "{fix}");
    stack.github.add_installation("orgs/octo-org", 99);
    let (c, report, _) = doctor(&with(&stack, &file, &app)).await;
    assert_eq!(c, 0, "{report:#}");
    let (outcome, detail, _) = &checks(&report)["scale_set.cli-set.admin"];
    assert_eq!(outcome, "ok", "{detail}");
    assert!(detail.ends_with("with GitHub App 4711"), "{detail}");

    // A wrong token: refused, the fix names the variable and the
    // permissions; the labels are not looked at.
    let wrong = "ghp_notTheScalersToken0000000000000000000";
    let t = with(&stack, &file, &[("RUNYARD_GITHUB_TOKEN", wrong)]);
    let (c, report, all) = doctor(&t).await;
    assert_eq!(c, 1, "{report:#}");
    let found = checks(&report);
    let (outcome, detail, fix) = &found["scale_set.cli-set.admin"];
    assert_eq!(outcome, "fail", "{detail}");
    assert!(
        detail.contains("401") && detail.contains("wrong, expired or revoked"),
        "{detail}"
    );
    assert!(
        fix.contains("RUNYARD_GITHUB_TOKEN") && fix.contains("Self-hosted runners: Read and write"),
        "{fix}"
    );
    assert_eq!(found["scale_set.cli-set.labels"].0, "skipped");
    assert!(!all.contains(wrong), "a credential was printed: {all}");
    // The text form says the same.
    let o = runyard(&t, &["doctor"]).await;
    let text = stdout(&o);
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL ") && l.contains("scale_set.cli-set.admin")),
        "{text}"
    );
    assert!(
        text.contains("To fix:\n") && text.contains("  scale_set.cli-set.admin: put a valid"),
        "{text}"
    );

    // No credentials at all: which variables to set.
    let t = with(&stack, &file, &[]);
    let (c, report, _) = doctor(&t).await;
    assert_eq!(c, 1, "{report:#}");
    let found = checks(&report);
    let (outcome, detail, fix) = &found["scale_set.cli-set.admin"];
    assert_eq!(outcome, "fail", "{detail}");
    assert!(detail.contains("no GitHub credentials"), "{detail}");
    assert!(
        fix.contains("RUNYARD_GITHUB_TOKEN") && fix.contains("RUNYARD_GITHUB_APP_ID"),
        "{fix}"
    );
    assert_eq!(found["scale_set.cli-set.labels"].0, "skipped");

    // Labels other than the scale set's, a runner group that does not
    // exist, a scale set not made yet.
    let other = file.with_file_name("misconfigured.toml");
    std::fs::write(&other, format!("{SCALER_FILE}{MISCONFIGURED}")).unwrap();
    let t = with(&stack, &other, &[("RUNYARD_GITHUB_TOKEN", GITHUB_TOKEN)]);
    let (c, report, _) = doctor(&t).await;
    assert_eq!(c, 1, "{report:#}");
    let found = checks(&report);
    for pool in ["cli-set", "cli-grouped", "cli-later"] {
        let (outcome, detail, _) = &found[&format!("scale_set.{pool}.admin")];
        assert_eq!(outcome, "ok", "{pool}: {detail}");
    }
    let (outcome, detail, fix) = &found["scale_set.cli-set.labels"];
    assert_eq!(outcome, "fail", "{detail}");
    assert!(
        detail.contains("cli-set, linux, x64") && detail.contains("cli-set, linux, gpu"),
        "{detail}"
    );
    assert!(fix.contains("scale_set_name"), "{fix}");
    let (outcome, detail, fix) = &found["scale_set.cli-grouped.labels"];
    assert_eq!(outcome, "fail", "{detail}");
    assert!(detail.contains("\"no-such-group\""), "{detail}");
    assert!(fix.contains("runner_group"), "{fix}");
    let (outcome, detail, _) = &found["scale_set.cli-later.labels"];
    assert_eq!(outcome, "ok", "{detail}");
    assert!(detail.contains("does not exist yet"), "{detail}");
    assert_eq!(
        stack.actions.scale_sets().len(),
        1,
        "the doctor created nothing"
    );

    // A file the scaler would refuse: one failure, named.
    let broken = file.with_file_name("broken.toml");
    std::fs::write(&broken, "[[pools]]\nname = 1\n").unwrap();
    let t = with(&stack, &broken, &[]);
    let (c, report, _) = doctor(&t).await;
    assert_eq!(c, 1, "{report:#}");
    let (outcome, detail, _) = &checks(&report)["scaler.config"];
    assert_eq!(outcome, "fail");
    assert!(detail.contains("broken.toml"), "{detail}");
    stack.db.drop_db().await;
}
