//! The scaler's pools-and-providers file (`RUNYARD_SCALER_CONFIG`): its
//! schema and every rule it must follow. The scaler starts from it and
//! `runyard provider check` validates it, so it lives here, below both.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use runyard_events::{Forge, valid_pool_name};
pub use runyard_provider::ProviderConfig;
use serde::{Deserialize, Deserializer};

/// How a job that several pools of the same priority match picks one
/// (garm's pool balancer: `pack` and `round-robin`). Either way a job goes
/// to the highest priority that has room, and spills over to the next.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Round-robin among the tied pools (by job id, so every replica picks
    /// the same): load spread over them.
    #[default]
    Spread,
    /// Fill the tied pools in name order: the first until it is full, then
    /// the next.
    Pack,
}

/// `github` or `gitlab` as a pool names its forge.
fn forge_name<'de, D: Deserializer<'de>>(d: D) -> Result<Forge, D::Error> {
    let name = String::deserialize(d)?;
    runyard_events::parse_forge(&name)
        .ok_or_else(|| serde::de::Error::custom(format!("forge {name:?} is not github or gitlab")))
}

/// The pools-and-providers file (`RUNYARD_SCALER_CONFIG`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScalerFile {
    /// Providers by name.
    #[serde(default)]
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Pools.
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// GitHub App credentials.
    #[serde(default)]
    pub github: Option<GitHubSection>,
    /// GitLab credentials.
    #[serde(default)]
    pub gitlab: Option<GitLabSection>,
    /// Missed-event reconciliation.
    #[serde(default)]
    pub reconciler: Option<ReconcilerSection>,
    /// OOM retries (on by default with the defaults below).
    #[serde(default)]
    pub retry: RetrySection,
    /// The scaler's own timers.
    #[serde(default)]
    pub scaler: Timers,
}

/// `[github]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitHubSection {
    /// GitHub App id.
    pub app_id: Option<u64>,
    /// The App's private key (PEM).
    pub private_key_file: Option<PathBuf>,
    /// Installation id; found from each pool's scope when absent.
    pub installation_id: Option<u64>,
}

/// `[gitlab]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitLabSection {
    /// A file holding the API token.
    pub token_file: Option<PathBuf>,
    /// Base URL (without `/api/v4`).
    pub api_url: Option<String>,
}

/// `[reconciler]`: what is polled and redelivered when webhooks get lost.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReconcilerSection {
    /// How often.
    #[serde(with = "humantime_serde", default = "default_reconcile")]
    pub interval: Duration,
    /// Repositories (`owner/name`) polled for queued and running jobs.
    #[serde(default)]
    pub github_repos: Vec<String>,
    /// Hooks whose failed deliveries are redelivered.
    #[serde(default)]
    pub github_hooks: Vec<GitHubHook>,
    /// GitLab projects polled for pending jobs.
    #[serde(default)]
    pub gitlab_projects: Vec<u64>,
    /// Forge API calls the reconciler may spend per hour.
    #[serde(default = "default_budget")]
    pub api_budget_per_hour: u32,
}

fn default_reconcile() -> Duration {
    Duration::from_secs(60)
}

fn default_budget() -> u32 {
    600
}

/// The lease key the reconciling replica holds in `<NS>_LEASES` (no pool
/// may take this name while `[reconciler]` is configured).
pub const RECONCILER_LEASE: &str = "reconciler";

/// One `github_hooks` entry: `{ org = "acme", hook_id = 42 }`,
/// `{ repo = "acme/app", hook_id = 7 }` or `{ app = true }` (the GitHub
/// App's own webhook, read with the App's JWT).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "HookEntry")]
pub enum GitHubHook {
    /// An organization webhook.
    Org {
        /// Organization login.
        org: String,
        /// Hook id.
        hook_id: u64,
    },
    /// A repository webhook.
    Repo {
        /// Owner login.
        owner: String,
        /// Repository name.
        repo: String,
        /// Hook id.
        hook_id: u64,
    },
    /// The GitHub App's own webhook.
    App,
}

/// A `github_hooks` entry as written, before it is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HookEntry {
    org: Option<String>,
    repo: Option<String>,
    app: Option<bool>,
    hook_id: Option<u64>,
}

impl TryFrom<HookEntry> for GitHubHook {
    type Error = String;

    fn try_from(e: HookEntry) -> Result<Self, Self::Error> {
        const SHAPES: &str = "a hook is { org = \"...\", hook_id = N }, { repo = \"owner/name\", hook_id = N } or { app = true }";
        match (e.org, e.repo, e.app, e.hook_id) {
            (Some(org), None, None, Some(hook_id)) if !org.trim().is_empty() => {
                Ok(Self::Org { org, hook_id })
            }
            (None, Some(repo), None, Some(hook_id)) => match split_repo(&repo) {
                Some((owner, name)) => Ok(Self::Repo {
                    owner: owner.to_owned(),
                    repo: name.to_owned(),
                    hook_id,
                }),
                None => Err(format!("repo {repo:?} must be owner/name")),
            },
            (None, None, Some(true), None) => Ok(Self::App),
            _ => Err(SHAPES.to_owned()),
        }
    }
}

/// `owner/name` split in two, both non-empty.
pub fn split_repo(repo: &str) -> Option<(&str, &str)> {
    let (owner, name) = repo.split_once('/')?;
    (!owner.is_empty() && !name.is_empty() && !name.contains('/')).then_some((owner, name))
}

/// The lease key of the replica that retries OOM-killed jobs (a `.` no pool
/// name can hold, so it never meets a pool's lease).
pub const RETRIER_LEASE: &str = "task.retrier";

/// How an OOM-killed job is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// GitLab: a new pipeline for the ref, whose generate step asks the
    /// allocator again.
    Pipeline,
    /// GitLab: the job is retried (`POST .../jobs/:id/retry`).
    Job,
    /// GitHub: `rerun-failed-jobs` when every failed job was OOM-killed,
    /// else the OOM-killed jobs one at a time.
    Auto,
    /// No retries (`RetryRefused` with reason `strategy_off`).
    Off,
}

/// `[retry.projects.<key>]`: a GitLab project id or a GitHub `owner/repo`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectRetry {
    /// GitLab: `pipeline` | `job` | `off`; GitHub: `auto` | `off`.
    pub strategy: Strategy,
}

/// `[retry]`: OOM-killed jobs come back with more memory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySection {
    /// How long a failed job waits for its usage report.
    #[serde(with = "humantime_serde")]
    pub wait_for_report: Duration,
    /// GitLab: `pipeline` (default), `job` or `off`.
    pub gitlab_strategy: Strategy,
    /// GitHub: `auto` (default) or `off`.
    pub github_strategy: Strategy,
    /// Consecutive OOM kills of a workload that each get one retry.
    pub max_retries: u32,
    /// How often the state of a failed pipeline or run is read from the
    /// forge while a retry waits for it to finish.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// Per-project strategies.
    pub projects: BTreeMap<String, ProjectRetry>,
}

impl Default for RetrySection {
    fn default() -> Self {
        Self {
            wait_for_report: Duration::from_secs(120),
            gitlab_strategy: Strategy::Pipeline,
            github_strategy: Strategy::Auto,
            max_retries: 3,
            poll_interval: Duration::from_secs(15),
            projects: BTreeMap::new(),
        }
    }
}

impl RetrySection {
    /// The section's own rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !matches!(
            self.gitlab_strategy,
            Strategy::Pipeline | Strategy::Job | Strategy::Off
        ) {
            return Err(err(
                "retry.gitlab_strategy",
                "must be \"pipeline\", \"job\" or \"off\"",
            ));
        }
        if !matches!(self.github_strategy, Strategy::Auto | Strategy::Off) {
            return Err(err("retry.github_strategy", "must be \"auto\" or \"off\""));
        }
        if self.max_retries > 10 {
            return Err(err("retry.max_retries", "must be at most 10"));
        }
        if self.poll_interval < Duration::from_millis(100) {
            return Err(err("retry.poll_interval", "must be at least 100ms"));
        }
        for (key, project) in &self.projects {
            let field = format!("retry.projects.{key}.strategy");
            if key.parse::<u64>().is_ok() {
                if project.strategy == Strategy::Auto {
                    return Err(err(field, "a GitLab project takes pipeline, job or off"));
                }
            } else if split_repo(key).is_some() {
                if !matches!(project.strategy, Strategy::Auto | Strategy::Off) {
                    return Err(err(field, "a GitHub repository takes auto or off"));
                }
            } else {
                return Err(err(
                    format!("retry.projects.{key}"),
                    "must be a GitLab project id or a GitHub owner/repo",
                ));
            }
        }
        Ok(())
    }

    /// The strategy for a GitLab project (by id) or a GitHub repository.
    pub fn strategy(&self, forge: Forge, project_id: u64, repo: &str) -> Strategy {
        let key = match forge {
            Forge::Gitlab => project_id.to_string(),
            _ => repo.to_owned(),
        };
        match (self.projects.get(&key), forge) {
            (Some(p), _) => p.strategy,
            (None, Forge::Gitlab) => self.gitlab_strategy,
            (None, _) => self.github_strategy,
        }
    }
}

/// `[scaler]`: timers and limits of the scaling loop. Every one is
/// configurable so tests can run them short.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timers {
    /// How long a queued job that an idle runner could take waits for it
    /// before a new runner is created anyway.
    #[serde(with = "humantime_serde")]
    pub idle_backoff: Duration,
    /// How long an idle runner must stay idle on the forge, read twice at
    /// least this far apart, before it is deleted (the forge's busy flag lags).
    #[serde(with = "humantime_serde")]
    pub busy_confirmation: Duration,
    /// Pool lease TTL (the `<NS>_LEASES` bucket's max age).
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// Create attempts per runner before the job is given up.
    pub create_attempts: u32,
    /// First back-off after a failed create (doubles, with jitter).
    #[serde(with = "humantime_serde")]
    pub create_backoff: Duration,
    /// Longest back-off between create attempts.
    #[serde(with = "humantime_serde")]
    pub create_backoff_max: Duration,
    /// Policy evaluation period when nothing happens (events also wake it).
    #[serde(with = "humantime_serde")]
    pub tick: Duration,
    /// Provider and forge listing period (orphans, online detection).
    #[serde(with = "humantime_serde")]
    pub sync_interval: Duration,
    /// How far back the log is read at start.
    #[serde(with = "humantime_serde")]
    pub lookback: Duration,
    /// Timeout of one allocator call.
    #[serde(with = "humantime_serde")]
    pub allocator_timeout: Duration,
    /// Timeout of one forge API call.
    #[serde(with = "humantime_serde")]
    pub forge_timeout: Duration,
    /// While a create waits for a spent GitHub rate-limit budget, how often
    /// `GET /rate_limit` (not charged to any budget) is read to learn
    /// whether it came back.
    #[serde(with = "humantime_serde")]
    pub rate_limit_probe: Duration,
    /// Where the `process` provider keeps its pid files and logs.
    pub state_dir: Option<PathBuf>,
    /// How a job matched by several pools of one priority picks one:
    /// `spread` (round-robin, the default) or `pack` (fill in name order).
    /// Either way it goes to the highest priority with room.
    pub balance: Balance,
    /// Scale-set mode: the longest a message long poll may go without any
    /// answer (the service holds it about 50 s, then answers 202). A poll
    /// silent longer than this re-creates the session.
    #[serde(with = "humantime_serde")]
    pub scale_set_silence: Duration,
    /// Scale-set mode: the first wait after a failed session or poll
    /// (grows 1.5× per failure up to 30 s).
    #[serde(with = "humantime_serde")]
    pub scale_set_backoff: Duration,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            idle_backoff: Duration::from_secs(10),
            busy_confirmation: Duration::from_secs(30),
            lease_ttl: Duration::from_secs(10),
            create_attempts: 5,
            create_backoff: Duration::from_secs(2),
            create_backoff_max: Duration::from_secs(60),
            tick: Duration::from_millis(500),
            sync_interval: Duration::from_secs(30),
            lookback: Duration::from_secs(24 * 3600),
            allocator_timeout: Duration::from_millis(500),
            forge_timeout: Duration::from_secs(10),
            rate_limit_probe: Duration::from_secs(60),
            state_dir: None,
            balance: Balance::Spread,
            scale_set_silence: Duration::from_secs(70),
            scale_set_backoff: Duration::from_secs(5),
        }
    }
}

/// A runner size.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Flavor {
    /// Name handed to the provider.
    pub name: String,
    /// Memory.
    pub memory: ByteSize,
    /// CPUs.
    pub cpus: u32,
}

/// Where a pool's runners register.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scope {
    /// GitHub organization.
    pub org: Option<String>,
    /// GitHub repository `owner/name`.
    pub repo: Option<String>,
    /// GitHub enterprise slug.
    pub enterprise: Option<String>,
    /// GitLab group.
    pub group_id: Option<u64>,
    /// GitLab project.
    pub project_id: Option<u64>,
    /// GitLab instance-wide runners.
    pub instance: Option<bool>,
}

/// One `[[pools]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// `[a-z0-9_-]+`.
    pub name: String,
    /// `github` or `gitlab`.
    #[serde(deserialize_with = "forge_name")]
    pub forge: Forge,
    /// Where runners register.
    pub scope: Scope,
    /// GitHub runner group for JIT configs.
    #[serde(default = "default_group")]
    pub runner_group_id: u64,
    /// The pool's labels (GitHub) or tags (GitLab).
    pub labels: Vec<String>,
    /// Provider name.
    pub provider: String,
    /// Image handed to the provider.
    #[serde(default)]
    pub image: String,
    /// Sizes, smallest memory first.
    pub flavors: Vec<Flavor>,
    /// Idle runners kept warm.
    #[serde(default)]
    pub min_idle: u32,
    /// Most runners alive at once.
    pub max_runners: u32,
    /// Idle runners above `min_idle` go after this long.
    #[serde(with = "humantime_serde", default = "default_idle_timeout")]
    pub idle_timeout: Duration,
    /// Runners not online after this long are reaped.
    #[serde(with = "humantime_serde", default = "default_bootstrap_timeout")]
    pub bootstrap_timeout: Duration,
    /// Higher wins among matching pools.
    #[serde(default)]
    pub priority: i32,
    /// Forge host (default `github.com`, or the GitLab URL's host).
    #[serde(default)]
    pub instance: Option<String>,
    /// Extra specs handed to the provider as is (a table). External
    /// providers also get runyard's default `runner_install_template` in
    /// them unless the table has one (base64 of a Go text/template, as
    /// garm's providers read it).
    #[serde(default)]
    pub extra_specs: Option<toml::Value>,
    /// `linux` (default) or `windows`: the bootstrap JSON's `os_type`.
    #[serde(default = "default_os_type")]
    pub os_type: String,
    /// `amd64` (default), `arm64`, `arm` or `i386`: the bootstrap JSON's
    /// `arch` (providers pick the runner download from the tools by it).
    #[serde(default = "default_os_arch")]
    pub os_arch: String,
    /// What happens to an instance its provider lists as `stopped`:
    /// `replace` (default) or `start`.
    #[serde(default)]
    pub stopped: StoppedAction,
    /// How the pool learns of its jobs (GitHub): `webhook` (default) or
    /// `scale-set` (a runner scale set's message session: no inbound
    /// traffic).
    #[serde(default)]
    pub mode: PoolMode,
    /// `scale-set` mode: the scale set's name (default: the pool's name).
    /// It is the first label jobs name in `runs-on`; the pool's labels
    /// follow it. GitHub applies labels at creation only.
    #[serde(default)]
    pub scale_set_name: Option<String>,
    /// `scale-set` mode: the runner group by name (default: the default
    /// group, id 1). Takes the place of `runner_group_id` there.
    #[serde(default)]
    pub runner_group: Option<String>,
}

/// How a GitHub pool learns of its jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PoolMode {
    /// `workflow_job` webhooks (and the reconciler's polls).
    #[default]
    Webhook,
    /// A runner scale set: the scaler holds the scale set's message session
    /// and long-polls the Actions service for the jobs assigned to it.
    ScaleSet,
}

/// What the scaler does with a runner whose instance its provider lists as
/// `stopped` (seen at two listings in a row).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoppedAction {
    /// The runner is removed (forge registration and instance) and made
    /// again: a stopped machine's ephemeral runner may have lost its job or
    /// its registration, so a fresh one is the safe default.
    #[default]
    Replace,
    /// The instance is started again (`StartInstance`); when that fails it
    /// is replaced.
    Start,
}

fn default_os_type() -> String {
    "linux".into()
}

fn default_os_arch() -> String {
    "amd64".into()
}

impl PoolConfig {
    /// The scale set's name in `scale-set` mode (`None` in webhook mode).
    pub fn scale_set(&self) -> Option<&str> {
        (self.mode == PoolMode::ScaleSet)
            .then(|| self.scale_set_name.as_deref().unwrap_or(&self.name))
    }

    /// The scale set's labels: its name first, then the pool's labels
    /// (each once, compared case-insensitively).
    pub fn scale_set_labels(&self) -> Vec<String> {
        let mut labels: Vec<String> = Vec::new();
        for l in self
            .scale_set()
            .into_iter()
            .chain(self.labels.iter().map(String::as_str))
        {
            if !labels.iter().any(|x| x.eq_ignore_ascii_case(l)) {
                labels.push(l.to_owned());
            }
        }
        labels
    }

    /// The pool's extra specs as JSON (`{}` when it has none).
    pub fn extra_specs_json(&self) -> serde_json::Value {
        self.extra_specs
            .as_ref()
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or_else(|| serde_json::json!({}))
    }
}

fn default_group() -> u64 {
    1
}

fn default_idle_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_bootstrap_timeout() -> Duration {
    Duration::from_secs(20 * 60)
}

/// A configuration the scaler refuses to start with.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct ConfigError {
    /// The offending field, e.g. `pools[1].min_idle`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        message: message.into(),
    }
}

impl ScalerFile {
    /// Parses and validates a file's text.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let file: Self = toml::from_str(text).map_err(|e| {
            // toml names the key in its message; keep the first line.
            let message = e.message().to_owned();
            let field = e
                .span()
                .map(|s| {
                    let line = text[..s.start].lines().count().max(1);
                    format!("line {line}")
                })
                .unwrap_or_else(|| "file".into());
            err(field, message)
        })?;
        file.validate()?;
        Ok(file)
    }

    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), e.to_string()))?;
        Self::parse(&text)
    }

    /// Every rule a file must follow.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, provider) in &self.providers {
            let field = format!("providers.{name}");
            match provider {
                ProviderConfig::External {
                    interface_version, ..
                } if !matches!(interface_version.as_str(), "v0.1.0" | "v0.1.1") => {
                    return Err(err(
                        format!("{field}.interface_version"),
                        format!("{interface_version:?} is not v0.1.0 or v0.1.1"),
                    ));
                }
                ProviderConfig::Process { command } if command.is_empty() => {
                    return Err(err(format!("{field}.command"), "is empty"));
                }
                _ => {}
            }
            if let ProviderConfig::External {
                environment_variables,
                ..
            } = provider
            {
                for (i, prefix) in environment_variables.iter().enumerate() {
                    if let Some(why) = refused_env_prefix(prefix) {
                        return Err(err(
                            format!("{field}.environment_variables[{i}]"),
                            format!(
                                "{prefix:?} {why}; name the provider's own prefix (as \"LXD_\")"
                            ),
                        ));
                    }
                }
            }
        }
        let mut names = HashSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let field = |f: &str| format!("pools[{i}].{f}");
            if !valid_pool_name(&pool.name) {
                return Err(err(
                    field("name"),
                    format!("{:?} must match [a-z0-9_-]{{1,63}}", pool.name),
                ));
            }
            if !names.insert(pool.name.as_str()) {
                return Err(err(
                    field("name"),
                    format!("duplicate pool name {:?}", pool.name),
                ));
            }
            if !self.providers.contains_key(&pool.provider) {
                return Err(err(
                    field("provider"),
                    format!("no provider named {:?}", pool.provider),
                ));
            }
            if pool.forge == Forge::Gitlab
                && let Some(ProviderConfig::Process { command }) =
                    self.providers.get(&pool.provider)
                && let Err(why) = single_build(command)
            {
                return Err(err(
                    format!("providers.{}.command", pool.provider),
                    format!("GitLab pool {:?}: {why}", pool.name),
                ));
            }
            let s = &pool.scope;
            let github = [&s.org, &s.repo, &s.enterprise]
                .iter()
                .filter(|v| v.is_some())
                .count();
            let gitlab = usize::from(s.group_id.is_some())
                + usize::from(s.project_id.is_some())
                + usize::from(s.instance == Some(true));
            match pool.forge {
                Forge::Github if github == 1 && gitlab == 0 => {}
                Forge::Github => {
                    return Err(err(
                        field("scope"),
                        "a GitHub pool needs exactly one of org, repo, enterprise",
                    ));
                }
                Forge::Gitlab if gitlab == 1 && github == 0 => {}
                Forge::Gitlab => {
                    return Err(err(
                        field("scope"),
                        "a GitLab pool needs exactly one of group_id, project_id, instance = true",
                    ));
                }
                Forge::Unspecified => {
                    return Err(err(field("forge"), "is not github or gitlab"));
                }
            }
            if let Some(repo) = &s.repo
                && repo.split('/').filter(|p| !p.is_empty()).count() != 2
            {
                return Err(err(field("scope.repo"), "must be owner/name"));
            }
            if pool.mode == PoolMode::ScaleSet {
                if pool.forge != Forge::Github {
                    return Err(err(
                        field("mode"),
                        "\"scale-set\" is a GitHub mode; a GitLab pool learns of its jobs from hooks",
                    ));
                }
                let name = pool.scale_set().unwrap_or_default();
                if name.is_empty()
                    || name.len() > 100
                    || name.chars().any(|c| c.is_control() || c == ',')
                {
                    return Err(err(
                        field("scale_set_name"),
                        format!(
                            "{name:?} must be 1 to 100 characters, no commas or control characters"
                        ),
                    ));
                }
            } else {
                if pool.scale_set_name.is_some() {
                    return Err(err(
                        field("scale_set_name"),
                        "is for mode = \"scale-set\" (this pool is in webhook mode)",
                    ));
                }
                if pool.runner_group.is_some() {
                    return Err(err(
                        field("runner_group"),
                        "is for mode = \"scale-set\"; webhook pools name their group by runner_group_id",
                    ));
                }
            }
            if pool.labels.is_empty() && pool.mode != PoolMode::ScaleSet {
                return Err(err(field("labels"), "is empty"));
            }
            if pool.flavors.is_empty() {
                return Err(err(field("flavors"), "is empty"));
            }
            if pool
                .flavors
                .windows(2)
                .any(|w| w[0].memory.as_u64() >= w[1].memory.as_u64())
            {
                return Err(err(
                    field("flavors"),
                    "must be sorted by memory, smallest first, without repeats",
                ));
            }
            if pool.max_runners == 0 {
                return Err(err(field("max_runners"), "must be at least 1"));
            }
            if !matches!(pool.os_type.as_str(), "linux" | "windows") {
                return Err(err(
                    field("os_type"),
                    format!("{:?} is not linux or windows", pool.os_type),
                ));
            }
            if !matches!(pool.os_arch.as_str(), "amd64" | "arm64" | "arm" | "i386") {
                return Err(err(
                    field("os_arch"),
                    format!("{:?} is not amd64, arm64, arm or i386", pool.os_arch),
                ));
            }
            if let Some(specs) = &pool.extra_specs {
                let Some(table) = specs.as_table() else {
                    return Err(err(field("extra_specs"), "must be a table"));
                };
                if let Some(t) = table.get("runner_install_template") {
                    use base64::Engine as _;
                    let decodes = t.as_str().is_some_and(|s| {
                        base64::engine::general_purpose::STANDARD
                            .decode(s.trim())
                            .is_ok()
                    });
                    if !decodes {
                        return Err(err(
                            field("extra_specs.runner_install_template"),
                            "must be a base64 string (providers decode it as bytes)",
                        ));
                    }
                }
            }
            if pool.min_idle > pool.max_runners {
                return Err(err(
                    field("min_idle"),
                    format!(
                        "{} is more than max_runners ({})",
                        pool.min_idle, pool.max_runners
                    ),
                ));
            }
        }
        let mut scale_sets = HashSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            if let Some(name) = pool.scale_set()
                && !scale_sets.insert((name.to_ascii_lowercase(), pool.scope.clone()))
            {
                return Err(err(
                    format!("pools[{i}].scale_set_name"),
                    format!(
                        "{name:?}: another pool already serves the scale set of that name in this scope (a scale set has one message session)"
                    ),
                ));
            }
        }
        if self.scaler.scale_set_silence < Duration::from_secs(1) {
            return Err(err("scaler.scale_set_silence", "must be at least 1s"));
        }
        if let Some(r) = &self.reconciler {
            r.validate(&self.pools)?;
        }
        self.retry.validate()?;
        Ok(())
    }
}

impl ReconcilerSection {
    /// The section's own rules (the lease key must not be a pool's name).
    pub fn validate(&self, pools: &[PoolConfig]) -> Result<(), ConfigError> {
        if self.interval < Duration::from_secs(1) {
            return Err(err("reconciler.interval", "must be at least 1s"));
        }
        if self.api_budget_per_hour == 0 {
            return Err(err("reconciler.api_budget_per_hour", "must be at least 1"));
        }
        for (i, repo) in self.github_repos.iter().enumerate() {
            if split_repo(repo).is_none() {
                return Err(err(
                    format!("reconciler.github_repos[{i}]"),
                    format!("{repo:?} must be owner/name"),
                ));
            }
        }
        if let Some(i) = pools.iter().position(|p| p.name == RECONCILER_LEASE) {
            return Err(err(
                format!("pools[{i}].name"),
                format!("{RECONCILER_LEASE:?} is the reconciler's lease key; rename the pool"),
            ));
        }
        Ok(())
    }
}

/// Why an external provider's `environment_variables` prefix is refused,
/// if it is: `""` passes the whole host environment on, and a prefix that
/// could match a `RUNYARD_*` name (`"RUNYARD_".starts_with(prefix)`, as
/// `"R"`, `"RUN"`, `"RUNYARD_"`) or starts with `RUNYARD` would hand the
/// scaler's own settings, its secrets among them, to the provider.
fn refused_env_prefix(prefix: &str) -> Option<&'static str> {
    const OWN: &str = "RUNYARD_";
    if prefix.is_empty() {
        Some("is empty and would pass every host variable (runyard's secrets among them)")
    } else if OWN.starts_with(prefix) || prefix.starts_with("RUNYARD") {
        Some("would pass runyard's own RUNYARD_* variables (its secrets among them)")
    } else {
        None
    }
}

/// Whether a process provider's command runs a GitLab runner for one job
/// only: `gitlab-runner run-single ... --max-builds 1`. A service
/// (`gitlab-runner run`) goes on taking jobs after the one its runner was
/// made for, and GitLab deletes a runner without asking whether it is busy.
/// A command that starts no `gitlab-runner` itself (a wrapper) is taken as
/// it is: the scaler still pauses a runner and asks for its running jobs
/// before it deletes one.
fn single_build(command: &[String]) -> Result<(), String> {
    let Some(at) = command
        .iter()
        .position(|a| a.rsplit('/').next() == Some("gitlab-runner"))
    else {
        return Ok(());
    };
    let sub = command.get(at + 1).map_or("", String::as_str);
    if sub != "run-single" {
        return Err(format!(
            "`gitlab-runner {sub}` takes job after job; start `gitlab-runner run-single ... --max-builds 1`"
        ));
    }
    let args = &command[at + 2..];
    let one = args.iter().any(|a| a == "--max-builds=1")
        || args
            .windows(2)
            .any(|w| w[0] == "--max-builds" && w[1] == "1");
    if !one {
        return Err("`gitlab-runner run-single` needs `--max-builds 1` (else it takes jobs until it is stopped)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[providers.local]
kind = "process"
command = ["/bin/sleep", "600"]

[providers.lxd]
kind = "external"
executable = "/usr/local/bin/garm-provider-lxd"
config_file = "/etc/runyard/lxd.toml"
interface_version = "v0.1.1"
environment_variables = ["LXD_"]
exec_timeout = "2m"

[[pools]]
name = "linux-x64"
forge = "github"
scope = { org = "acme" }
runner_group_id = 1
labels = ["self-hosted", "linux", "x64"]
provider = "lxd"
image = "ubuntu:24.04"
flavors = [{ name = "small", memory = "4GiB", cpus = 2 }, { name = "large", memory = "16GiB", cpus = 8 }]
min_idle = 1
max_runners = 20
idle_timeout = "5m"
bootstrap_timeout = "20m"
priority = 10

[scaler]
lease_ttl = "2s"
"#;

    #[test]
    fn the_documented_example_parses() {
        let f = ScalerFile::parse(GOOD).expect("valid");
        assert_eq!(f.pools[0].flavors[1].memory, ByteSize::gib(16));
        assert_eq!(f.scaler.lease_ttl, Duration::from_secs(2));
        assert_eq!(f.scaler.idle_backoff, Duration::from_secs(10));
        assert_eq!(f.scaler.balance, Balance::Spread);
        let pack = ScalerFile::parse(&GOOD.replace("lease_ttl = \"2s\"", "balance = \"pack\""));
        assert_eq!(pack.expect("valid").scaler.balance, Balance::Pack);
        assert!(matches!(
            f.providers["lxd"],
            ProviderConfig::External { ref interface_version, .. } if interface_version == "v0.1.1"
        ));
    }

    fn refused(text: &str) -> ConfigError {
        ScalerFile::parse(text).expect_err("must be refused")
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        let e = refused(&GOOD.replace("priority = 10", "priority = 10\ncolour = 1"));
        assert!(e.message.contains("colour"), "{e}");
        let e = refused(&GOOD.replace("lease_ttl = \"2s\"", "balance = \"roundrobin\""));
        assert!(
            e.message.contains("roundrobin") && e.message.contains("spread"),
            "{e}"
        );
        let e = refused(&GOOD.replace("provider = \"lxd\"", "provider = \"nope\""));
        assert_eq!(e.field, "pools[0].provider");
        let e = refused(&GOOD.replace("min_idle = 1", "min_idle = 21"));
        assert_eq!(e.field, "pools[0].min_idle");
        let e = refused(&GOOD.replace(
            "{ name = \"small\", memory = \"4GiB\", cpus = 2 }, { name = \"large\", memory = \"16GiB\", cpus = 8 }",
            "{ name = \"large\", memory = \"16GiB\", cpus = 8 }, { name = \"small\", memory = \"4GiB\", cpus = 2 }",
        ));
        assert_eq!(e.field, "pools[0].flavors");
        let dup = format!(
            "{GOOD}\n{}",
            &GOOD[GOOD.find("[[pools]]").unwrap_or(0)..GOOD.find("[scaler]").unwrap_or(0)]
        );
        let e = refused(&dup);
        assert!(e.message.contains("duplicate pool name"), "{e}");
        let e = refused(&GOOD.replace("name = \"linux-x64\"", "name = \"Linux X64\""));
        assert_eq!(e.field, "pools[0].name");
        let e = refused(&GOOD.replace("scope = { org = \"acme\" }", "scope = { group_id = 3 }"));
        assert_eq!(e.field, "pools[0].scope");
        let e = refused(&GOOD.replace("v0.1.1", "v9"));
        assert_eq!(e.field, "providers.lxd.interface_version");
        let e = refused(&GOOD.replace("kind = \"process\"", "kind = \"teleport\""));
        assert!(e.message.contains("teleport"), "{e}");
        let e = refused(&GOOD.replace("forge = \"github\"", "forge = \"bitbucket\""));
        assert!(
            e.message.contains("\"bitbucket\" is not github or gitlab"),
            "{e}"
        );
    }

    #[test]
    fn scale_set_pools_are_github_pools_with_one_session_per_scale_set() {
        let set = GOOD.replace("runner_group_id = 1", "mode = \"scale-set\"");
        let f = ScalerFile::parse(&set).expect("valid");
        let pool = &f.pools[0];
        assert_eq!(pool.scale_set(), Some("linux-x64"), "named after the pool");
        assert_eq!(
            pool.scale_set_labels(),
            ["linux-x64", "self-hosted", "linux", "x64"]
        );
        assert_eq!(f.scaler.scale_set_silence, Duration::from_secs(70));
        let named = set.replace(
            "mode = \"scale-set\"",
            "mode = \"scale-set\"\nscale_set_name = \"Linux\"",
        );
        let f = ScalerFile::parse(&named).expect("valid");
        assert_eq!(
            f.pools[0].scale_set_labels(),
            ["Linux", "self-hosted", "x64"]
        );
        assert_eq!(
            ScalerFile::parse(GOOD).expect("valid").pools[0].scale_set(),
            None
        );
        let e = refused(
            &set.replace("forge = \"github\"", "forge = \"gitlab\"")
                .replace("scope = { org = \"acme\" }", "scope = { group_id = 3 }"),
        );
        assert_eq!(e.field, "pools[0].mode");
        let e = refused(&GOOD.replace("runner_group_id = 1", "scale_set_name = \"x\""));
        assert_eq!(e.field, "pools[0].scale_set_name");
        let e = refused(&GOOD.replace("runner_group_id = 1", "runner_group = \"ci\""));
        assert_eq!(e.field, "pools[0].runner_group");
        let e = refused(&set.replace(
            "mode = \"scale-set\"",
            "mode = \"scale-set\"\nscale_set_name = \"a,b\"",
        ));
        assert_eq!(e.field, "pools[0].scale_set_name");
        let e = refused(&set.replace("mode = \"scale-set\"", "mode = \"listener\""));
        assert!(e.message.contains("listener"), "{e}");
        // Two pools on one scale set would fight over its one session.
        let pool = &set[set.find("[[pools]]").unwrap_or(0)..set.find("[scaler]").unwrap_or(0)];
        let twice = format!(
            "{set}\n{}",
            pool.replace(
                "name = \"linux-x64\"",
                "name = \"other\"\nscale_set_name = \"LINUX-X64\""
            )
        );
        let e = refused(&twice);
        assert_eq!(e.field, "pools[1].scale_set_name");
        let e = refused(&set.replace("lease_ttl = \"2s\"", "scale_set_silence = \"100ms\""));
        assert_eq!(e.field, "scaler.scale_set_silence");
    }

    #[test]
    fn environment_prefixes_that_would_pass_runyards_own_variables_are_refused() {
        for bad in [
            "",
            "R",
            "RUN",
            "RUNYARD",
            "RUNYARD_",
            "RUNYARD_SCALER_",
            "RUNYARDX",
        ] {
            let file = GOOD.replace(
                "environment_variables = [\"LXD_\"]",
                &format!("environment_variables = [\"LXD_\", {bad:?}]"),
            );
            let e = refused(&file);
            assert_eq!(e.field, "providers.lxd.environment_variables[1]", "{bad:?}");
            let text = e.to_string();
            assert!(
                text.contains(&format!("{bad:?}")),
                "names the prefix: {text}"
            );
            assert!(text.contains("providers.lxd"), "names the provider: {text}");
        }
        for good in ["LXD_", "OS_", "RX", "RUNNER_", "runyard_"] {
            let file = GOOD.replace(
                "environment_variables = [\"LXD_\"]",
                &format!("environment_variables = [{good:?}]"),
            );
            assert!(ScalerFile::parse(&file).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn gitlab_runners_of_the_process_provider_take_one_job() {
        let gitlab = |command: &str| {
            GOOD.replace(
                "command = [\"/bin/sleep\", \"600\"]",
                &format!("command = {command}"),
            )
            .replace("scope = { org = \"acme\" }", "scope = { project_id = 34 }")
            .replace("forge = \"github\"", "forge = \"gitlab\"")
            .replace("provider = \"lxd\"", "provider = \"local\"")
        };
        for bad in [
            r#"["/usr/bin/gitlab-runner", "run", "--config", "c.toml"]"#,
            r#"["gitlab-runner", "run-single", "-u", "https://gl", "-t", "{jit_config}"]"#,
            r#"["gitlab-runner", "run-single", "--max-builds", "2"]"#,
        ] {
            let e = refused(&gitlab(bad));
            assert_eq!(e.field, "providers.local.command", "{bad}");
            assert!(
                e.message.contains("max-builds 1") || e.message.contains("run-single"),
                "{e}"
            );
        }
        for good in [
            r#"["/usr/bin/gitlab-runner", "run-single", "-t", "{jit_config}", "--max-builds", "1"]"#,
            r#"["gitlab-runner", "run-single", "--max-builds=1", "--wait-timeout", "600"]"#,
            r#"["/usr/local/bin/start-runner", "{jit_config}"]"#,
        ] {
            ScalerFile::parse(&gitlab(good)).expect(good);
        }
        // GitHub pools' commands are theirs.
        ScalerFile::parse(
            &GOOD
                .replace(
                    "command = [\"/bin/sleep\", \"600\"]",
                    r#"command = ["gitlab-runner", "run"]"#,
                )
                .replace("provider = \"lxd\"", "provider = \"local\""),
        )
        .expect("not a GitLab pool");
    }

    #[test]
    fn pool_options_for_external_providers_are_checked() {
        let f = ScalerFile::parse(GOOD).expect("valid");
        let pool = &f.pools[0];
        assert_eq!(
            (pool.os_type.as_str(), pool.os_arch.as_str(), pool.stopped),
            ("linux", "amd64", StoppedAction::Replace)
        );
        assert_eq!(pool.extra_specs_json(), serde_json::json!({}));
        let f = ScalerFile::parse(&GOOD.replace(
            "priority = 10",
            "priority = 10\nos_type = \"windows\"\nos_arch = \"arm64\"\nstopped = \"start\"\nextra_specs = { disk_gb = 20, runner_install_template = \"ZWNobwo=\" }",
        ))
        .expect("valid");
        let pool = &f.pools[0];
        assert_eq!(
            (pool.os_type.as_str(), pool.os_arch.as_str(), pool.stopped),
            ("windows", "arm64", StoppedAction::Start)
        );
        assert_eq!(pool.extra_specs_json()["disk_gb"], 20);
        for (line, field) in [
            ("os_type = \"beos\"", "pools[0].os_type"),
            ("os_arch = \"sparc\"", "pools[0].os_arch"),
            ("extra_specs = 3", "pools[0].extra_specs"),
            (
                "extra_specs = { runner_install_template = \"not base64!\" }",
                "pools[0].extra_specs.runner_install_template",
            ),
        ] {
            let e = refused(&GOOD.replace("priority = 10", &format!("priority = 10\n{line}")));
            assert_eq!(e.field, field, "{line}: {e}");
        }
        let e = refused(&GOOD.replace("priority = 10", "priority = 10\nstopped = \"ignore\""));
        assert!(e.message.contains("ignore"), "{e}");
    }

    const RECONCILER: &str = r#"
[reconciler]
interval = "60s"
github_repos = ["acme/app"]
github_hooks = [{ org = "acme", hook_id = 42 }, { repo = "acme/app", hook_id = 7 }, { app = true }]
gitlab_projects = [123]
api_budget_per_hour = 600
"#;

    #[test]
    fn the_documented_reconciler_parses_into_typed_hooks() {
        let f = ScalerFile::parse(&format!("{GOOD}{RECONCILER}")).expect("valid");
        let r = f.reconciler.expect("section");
        assert_eq!(r.interval, Duration::from_secs(60));
        assert_eq!(r.github_repos, ["acme/app"]);
        assert_eq!(
            r.github_hooks,
            [
                GitHubHook::Org {
                    org: "acme".into(),
                    hook_id: 42
                },
                GitHubHook::Repo {
                    owner: "acme".into(),
                    repo: "app".into(),
                    hook_id: 7
                },
                GitHubHook::App,
            ]
        );
        assert_eq!((r.gitlab_projects, r.api_budget_per_hour), (vec![123], 600));
        let minimal = ScalerFile::parse(&format!("{GOOD}\n[reconciler]\n")).expect("valid");
        let r = minimal.reconciler.expect("section");
        assert_eq!(
            (r.interval, r.api_budget_per_hour, r.github_hooks.len()),
            (Duration::from_secs(60), 600, 0)
        );
    }

    #[test]
    fn bad_reconciler_sections_are_refused() {
        let with =
            |from: &str, to: &str| refused(&format!("{GOOD}{}", RECONCILER.replace(from, to)));
        for (from, to, says) in [
            ("hook_id = 42 }", "hook_id = 42, colour = 1 }", "colour"),
            (
                "{ org = \"acme\", hook_id = 42 }",
                "{ org = \"acme\" }",
                "a hook is",
            ),
            ("{ app = true }", "{ app = true, hook_id = 3 }", "a hook is"),
            ("{ app = true }", "{ app = false }", "a hook is"),
            (
                "{ repo = \"acme/app\", hook_id = 7 }",
                "{ repo = \"app\", hook_id = 7 }",
                "owner/name",
            ),
            (
                "{ org = \"acme\", hook_id = 42 }",
                "{ org = \"acme\", repo = \"acme/app\", hook_id = 42 }",
                "a hook is",
            ),
            (
                "api_budget_per_hour = 600",
                "api_budget = 600",
                "api_budget",
            ),
        ] {
            let e = with(from, to);
            assert!(e.message.contains(says), "{to}: {e}");
        }
        let e = with("github_repos = [\"acme/app\"]", "github_repos = [\"acme\"]");
        assert_eq!(e.field, "reconciler.github_repos[0]");
        let e = with("interval = \"60s\"", "interval = \"0s\"");
        assert_eq!(e.field, "reconciler.interval");
        let e = with("api_budget_per_hour = 600", "api_budget_per_hour = 0");
        assert_eq!(e.field, "reconciler.api_budget_per_hour");
        let e = refused(&format!(
            "{}{RECONCILER}",
            GOOD.replace("name = \"linux-x64\"", "name = \"reconciler\"")
        ));
        assert_eq!(e.field, "pools[0].name");
    }
}
