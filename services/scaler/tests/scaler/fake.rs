//! The fake garm provider (`tests/fixtures/fake-provider`) from the test's
//! side: its state directory, its config file (faults it is to play) and
//! what it recorded (calls, protocol violations, instances, children).

use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::{Stack, pool_toml};

/// One fake provider's state directory.
#[derive(Debug)]
pub struct FakeProvider {
    /// Where it keeps everything (its config file included).
    pub dir: PathBuf,
}

/// The fake provider executable.
pub fn executable() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake-provider")
}

/// A stack whose `local` provider is the fake (interface `version`, the
/// pool's `bootstrap` timeout and `extra` settings), its state in a
/// directory of its own, and the fake. Runners come online on GitHub as
/// soon as they register (a background task plays the machines booting).
pub async fn external_stack(version: &str, bootstrap: &str, extra: &str) -> (Stack, FakeProvider) {
    let fake = FakeProvider::new(&[]);
    let providers = fake.provider_toml("local", version, "5s", &[]);
    let pools = pool_toml(5, 0, extra).replace(
        "bootstrap_timeout = \"30s\"",
        &format!("bootstrap_timeout = {bootstrap:?}"),
    );
    (Stack::with_provider(&pools, &providers).await, fake)
}

impl FakeProvider {
    /// A fresh state directory; host variables starting with one of
    /// `env_prefixes` are allowed in its environment.
    pub fn new(env_prefixes: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let fake = Self { dir };
        fake.write_config(&json!({"env_prefixes": env_prefixes, "faults": {}}));
        fake
    }

    /// `GARM_PROVIDER_CONFIG_FILE`.
    pub fn config_file(&self) -> PathBuf {
        self.dir.join("provider.json")
    }

    /// A `[providers.<name>]` section running this fake.
    pub fn provider_toml(
        &self,
        name: &str,
        version: &str,
        exec_timeout: &str,
        env_prefixes: &[&str],
    ) -> String {
        format!(
            "[providers.{name}]\nkind = \"external\"\nexecutable = {:?}\nconfig_file = {:?}\ninterface_version = {version:?}\nenvironment_variables = {env_prefixes:?}\nexec_timeout = {exec_timeout:?}\n",
            executable().display().to_string(),
            self.config_file().display().to_string(),
        )
    }

    fn lock(&self) -> File {
        let f = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("lock"))
            .expect("lock file");
        f.lock().expect("lock");
        f
    }

    fn write_config(&self, config: &Value) {
        let tmp = self.dir.join("provider.json.tmp");
        std::fs::write(&tmp, config.to_string()).expect("write config");
        std::fs::rename(tmp, self.config_file()).expect("rename config");
    }

    /// Queues `faults` for `command` (played one per call, in order).
    pub fn set_faults(&self, command: &str, faults: &[&str]) {
        let _lock = self.lock();
        let mut config: Value =
            serde_json::from_slice(&std::fs::read(self.config_file()).expect("config"))
                .expect("config JSON");
        config["faults"][command] = json!(faults);
        self.write_config(&config);
    }

    /// Faults of `command` not played yet.
    pub fn pending_faults(&self, command: &str) -> usize {
        let _lock = self.lock();
        let config: Value =
            serde_json::from_slice(&std::fs::read(self.config_file()).expect("config"))
                .expect("config JSON");
        config["faults"][command]
            .as_array()
            .map_or(0, std::vec::Vec::len)
    }

    /// Every call so far: `{command, env, stdin, pid}`.
    pub fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("calls.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Calls of one command.
    pub fn calls_of(&self, command: &str) -> Vec<Value> {
        self.calls()
            .into_iter()
            .filter(|c| c["command"] == command)
            .collect()
    }

    /// Protocol violations it saw (each failed its call).
    pub fn violations(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("violations.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Its instances (as stored, with `pool_id` and `controller_id`).
    pub fn instances(&self) -> Vec<Value> {
        let mut out: Vec<Value> = std::fs::read_dir(self.dir.join("instances"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                    .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
                    .collect()
            })
            .unwrap_or_default();
        out.sort_by(|a: &Value, b: &Value| a["name"].as_str().cmp(&b["name"].as_str()));
        out
    }

    /// Its instances' names.
    pub fn instance_names(&self) -> Vec<String> {
        self.instances()
            .iter()
            .filter_map(|i| i["name"].as_str().map(str::to_owned))
            .collect()
    }

    /// Sets an instance's status (the machine stopping, say).
    pub fn set_status(&self, name: &str, status: &str) {
        let path = self.dir.join("instances").join(format!("{name}.json"));
        let mut inst: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("instance")).expect("JSON");
        inst["status"] = json!(status);
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, inst.to_string()).expect("write");
        std::fs::rename(tmp, path).expect("rename");
    }

    /// Pids of the children `hang` started.
    pub fn children(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("children.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Pids of every call it served (hung ones included).
    pub fn call_pids(&self) -> Vec<i32> {
        self.calls()
            .iter()
            .filter_map(|c| c["pid"].as_i64())
            .filter_map(|p| i32::try_from(p).ok())
            .collect()
    }
}

/// True while `pid` runs and is the fake or a child it started (a zombie
/// waiting to be reaped, or a pid reused by something else, is not).
pub fn alive(pid: i32) -> bool {
    let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .is_ok_and(|c| c.contains("fake-provider") || c.contains("sleep 3600"));
    ours && std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_owned))
        })
        .is_some_and(|s| s != "Z" && s != "X")
}
