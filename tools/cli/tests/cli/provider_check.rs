//! `runyard provider check` against the scaler's fake garm provider (every
//! step passes), against providers that get one thing wrong (exit 1, the
//! failing step named) and with bad arguments (exit 2).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Every step's label, in order, as the text report shows it.
const STEPS: [&str; 7] = [
    "GetVersion",
    "CreateInstance",
    "GetInstance",
    "ListInstances",
    "DeleteInstance",
    "DeleteInstance (again)",
    "ListInstances (gone)",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fake_provider() -> PathBuf {
    repo_root().join("services/scaler/tests/fixtures/fake-provider")
}

fn flaky_provider() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flaky-provider")
}

/// A scaler file with provider `name` running `exe` (config file
/// `config_file`) and a pool `linux` using it.
fn scaler_toml(name: &str, exe: &Path, config_file: &Path, version: &str) -> String {
    format!(
        r#"[providers.{name}]
kind = "external"
executable = {exe:?}
config_file = {config:?}
interface_version = "{version}"
exec_timeout = "10s"

[providers.other]
kind = "process"
command = ["/bin/sleep", "600"]

[[pools]]
name = "linux"
forge = "github"
scope = {{ org = "acme" }}
labels = ["self-hosted", "linux"]
provider = "{name}"
image = "ubuntu:24.04"
flavors = [{{ name = "small", memory = "4GiB", cpus = 2 }}, {{ name = "large", memory = "16GiB", cpus = 8 }}]
max_runners = 5
bootstrap_timeout = "30s"
extra_specs = {{ disk_gb = 20 }}
"#,
        exe = exe.display().to_string(),
        config = config_file.display().to_string(),
    )
}

/// A temp dir holding a provider config (JSON) and the scaler file.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(exe: &Path, provider_config: &Value, version: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config_file = dir.path().join("provider.json");
        std::fs::write(&config_file, provider_config.to_string()).unwrap();
        std::fs::write(
            dir.path().join("scaler.toml"),
            scaler_toml("fake", exe, &config_file, version),
        )
        .unwrap();
        Self { dir }
    }

    fn scaler_file(&self) -> PathBuf {
        self.dir.path().join("scaler.toml")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

fn runyard(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_runyard"));
    cmd.args(args)
        .env(runyard_cli::stack_env::FILE_VAR, "")
        .env_remove("RUNYARD_SCALER_CONFIG")
        .env_remove("RUNYARD_NAMESPACE");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn check(setup: &Setup, provider: &str, extra: &[&str]) -> Output {
    let config = setup.scaler_file();
    let mut args = vec![
        "provider",
        "check",
        provider,
        "--config",
        config.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    runyard(&args, &[])
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The report line of `label` (`  PASS  CreateInstance ...`).
fn line<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| {
            l.get(8..)
                .is_some_and(|rest| rest.starts_with(&format!("{label} ")))
        })
        .unwrap_or_else(|| panic!("no line for {label} in:\n{stdout}"))
}

fn fake_calls(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn leftovers(dir: &Path, sub: &str, ext: &str) -> Vec<String> {
    std::fs::read_dir(dir.join(sub))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(ext))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_fake_provider_passes_every_step_on_both_interface_versions() {
    for version in ["v0.1.0", "v0.1.1"] {
        let setup = Setup::new(
            &fake_provider(),
            &serde_json::json!({"env_prefixes": [], "faults": {}}),
            version,
        );
        let out = check(&setup, "fake", &[]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{version}\n{stdout}\n{stderr}");
        for label in STEPS {
            let l = line(&stdout, label);
            assert!(l.contains("PASS"), "{l}");
        }
        assert!(
            line(&stdout, "GetVersion").contains("version v0.0.1-fake"),
            "{stdout}"
        );
        assert!(line(&stdout, "CreateInstance").contains("status running"));
        assert!(line(&stdout, "CreateInstance").contains("provider_id fp-"));
        assert!(stdout.contains("PASSED"), "{stdout}");
        assert!(stdout.contains("pool         linux"), "{stdout}");

        // The fake saw the scaler's calls, none of them breaking the
        // protocol, and keeps nothing.
        let dir = setup.path();
        assert!(
            !dir.join("violations.log").exists(),
            "{}",
            std::fs::read_to_string(dir.join("violations.log")).unwrap_or_default()
        );
        let commands: Vec<String> = fake_calls(dir)
            .iter()
            .map(|c| c["command"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            commands,
            [
                "GetVersion",
                "CreateInstance",
                "GetInstance",
                "ListInstances",
                "DeleteInstance",
                "DeleteInstance",
                "ListInstances"
            ]
        );
        let calls = fake_calls(dir);
        let create = calls
            .iter()
            .find(|c| c["command"] == "CreateInstance")
            .unwrap();
        assert_eq!(create["env"]["GARM_INTERFACE_VERSION"], version);
        let boot: Value = serde_json::from_str(create["stdin"].as_str().unwrap()).unwrap();
        assert!(boot["name"].as_str().unwrap().starts_with("ry-check-"));
        assert_eq!(boot["flavor"], "small");
        assert_eq!(boot["image"], "ubuntu:24.04");
        assert_eq!(boot["extra_specs"]["disk_gb"], 20);
        assert_eq!(boot["instance-token"], "runyard-provider-check");
        assert!(
            boot["tools"][0]["download_url"]
                .as_str()
                .unwrap()
                .contains(".invalid/")
        );
        assert_eq!(leftovers(dir, "instances", ".json"), Vec::<String>::new());
    }
}

#[test]
fn the_json_report_lists_every_step_and_the_config_comes_from_the_environment() {
    let setup = Setup::new(
        &fake_provider(),
        &serde_json::json!({"env_prefixes": [], "faults": {}}),
        "v0.1.0",
    );
    let file = setup.scaler_file();
    let out = runyard(
        &["provider", "check", "fake", "--json", "--namespace", "ci"],
        &[("RUNYARD_SCALER_CONFIG", &file)],
    );
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["failed_steps"], serde_json::json!([]));
    assert_eq!(report["namespace"], "ci");
    assert_eq!(report["pool"], "linux");
    assert_eq!(report["pool_configured"], true);
    assert_eq!(report["pool_id"].as_str().unwrap().len(), 36);
    let steps = report["steps"].as_array().unwrap();
    let ids: Vec<&str> = steps.iter().map(|s| s["step"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            "version",
            "create",
            "get",
            "list",
            "delete",
            "delete_again",
            "list_gone"
        ]
    );
    assert_eq!(steps[1]["status"], "running");
    assert!(steps[1]["provider_id"].as_str().unwrap().starts_with("fp-"));
    assert!(steps[1]["duration_ms"].as_f64().unwrap() > 0.0);
    // The controller id the fake saw is the namespace's.
    let create = fake_calls(setup.path())
        .into_iter()
        .find(|c| c["command"] == "CreateInstance")
        .unwrap();
    assert_eq!(create["env"]["GARM_CONTROLLER_ID"], report["controller_id"]);
    assert_eq!(create["env"]["GARM_POOL_ID"], report["pool_id"]);
}

#[test]
fn a_misbehaving_provider_fails_naming_the_step() {
    for (mode, failing) in [
        ("delete_exit1", "DeleteInstance"),
        ("missing_delete_1", "DeleteInstance (again)"),
        ("get_bad_json", "GetInstance"),
        ("list_forgets", "ListInstances"),
        ("create_bad_json", "CreateInstance"),
    ] {
        let setup = Setup::new(
            &flaky_provider(),
            &serde_json::json!({ "mode": mode }),
            "v0.1.0",
        );
        let out = check(&setup, "fake", &[]);
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{mode}\n{stdout}\n{stderr}");
        assert!(
            line(&stdout, failing).contains("FAIL"),
            "{mode}: {failing} not failed\n{stdout}"
        );
        let verdict = stdout.lines().last().unwrap();
        assert!(
            verdict.starts_with("FAILED") && verdict.contains(failing),
            "{mode}: {verdict}"
        );
        match mode {
            "delete_exit1" => {
                assert!(line(&stdout, "DeleteInstance").contains("the backend refused the delete"));
                assert!(line(&stdout, "ListInstances (gone)").contains("FAIL"));
            }
            "missing_delete_1" => {
                assert!(line(&stdout, "DeleteInstance").contains("PASS"));
                assert!(line(&stdout, "ListInstances (gone)").contains("PASS"));
            }
            "get_bad_json" | "list_forgets" => {
                // The rest still runs, and cleans up.
                assert!(line(&stdout, "DeleteInstance").contains("PASS"));
                assert_eq!(
                    leftovers(setup.path(), ".", ".instance"),
                    Vec::<String>::new()
                );
            }
            "create_bad_json" => {
                assert!(line(&stdout, "CreateInstance").contains("malformed"));
                assert!(line(&stdout, "GetInstance").contains("SKIP"));
                // What the failed create made is removed by name.
                assert!(line(&stdout, "DeleteInstance (cleanup)").contains("PASS"));
                assert_eq!(
                    leftovers(setup.path(), ".", ".instance"),
                    Vec::<String>::new()
                );
            }
            _ => {}
        }

        let out = check(&setup, "fake", &["--json"]);
        assert_eq!(out.status.code(), Some(1), "{mode}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["passed"], false);
        assert!(
            report["failed_steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == failing),
            "{mode}: {report}"
        );
    }
}

#[test]
fn an_unknown_provider_or_a_bad_file_is_a_usage_error() {
    let setup = Setup::new(
        &fake_provider(),
        &serde_json::json!({"env_prefixes": [], "faults": {}}),
        "v0.1.0",
    );
    let out = check(&setup, "nonesuch", &[]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("no provider named \"nonesuch\""),
        "{stderr}"
    );
    assert!(stderr.contains("configured: fake, other"), "{stderr}");
    // Nothing was called.
    assert!(fake_calls(setup.path()).is_empty());

    let out = check(&setup, "nonesuch", &["--json"]);
    assert_eq!(out.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["error"].as_str().unwrap().contains("nonesuch"));

    // A pool of another provider.
    let out = check(&setup, "other", &["--pool", "linux"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("uses provider \"fake\""));

    // An executable that is not there.
    let text_before = std::fs::read_to_string(setup.scaler_file()).unwrap();
    let exe = fake_provider().display().to_string();
    std::fs::write(
        setup.scaler_file(),
        text_before.replace(&exe, "/nonexistent/garm-provider-nothing"),
    )
    .unwrap();
    let out = check(&setup, "fake", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("/nonexistent/garm-provider-nothing"),
        "{:?}",
        text(&out)
    );
    std::fs::write(setup.scaler_file(), text_before).unwrap();

    // A file the scaler would refuse.
    std::fs::write(
        setup.scaler_file(),
        std::fs::read_to_string(setup.scaler_file())
            .unwrap()
            .replace("max_runners = 5", "max_runners = 0"),
    )
    .unwrap();
    let out = check(&setup, "fake", &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("pools[0].max_runners"),
        "{:?}",
        text(&out)
    );

    // No file at all.
    let out = runyard(&["provider", "check", "fake"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("--config"), "{:?}", text(&out));
    let missing = setup.path().join("missing.toml");
    let out = runyard(
        &["provider", "check", "fake"],
        &[("RUNYARD_SCALER_CONFIG", &missing)],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("missing.toml"));
}
