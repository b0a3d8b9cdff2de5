//! `runyard provider check`: runs one configured provider through the calls
//! the scaler makes, in the scaler's order and with the scaler's code
//! (`runyard_provider::Provider`), against the real backend:
//!
//! 1. `GetVersion`;
//! 2. `CreateInstance` of `ry-check-<hex>` in the chosen pool (its id, image,
//!    smallest flavor, extra specs, OS), with a placeholder JIT config and
//!    instance token, so no runner registers anywhere;
//! 3. `GetInstance` by the provider id the create answered;
//! 4. `ListInstances` of the pool: the instance is listed;
//! 5. `DeleteInstance`;
//! 6. `DeleteInstance` again: a missing instance must be a success;
//! 7. `ListInstances`: the instance is gone (polled for `--wait-gone`
//!    seconds, for backends that delete asynchronously).
//!
//! A failed create skips the rest and deletes whatever it may have left
//! (by provider id when the provider named one, else by name). Ctrl-C
//! stops the step under way (its process group is killed) and deletes the
//! instance by name.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use runyard_events::{Forge, Namespace, valid_pool_name};
use runyard_forge::api::github::RunnerDownload;
use runyard_provider::{
    Bootstrap, CreateRequest, Instance, Provider, ProviderConfig, ProviderError,
};
use runyard_scaler_config::{PoolConfig, ScalerFile};
use secrecy::SecretString;
use serde::Serialize;

use crate::{CheckArgs, out};

/// The JIT config (and instance token) the check's instance gets: not a
/// real one, so a runner started with it registers nowhere.
pub const PLACEHOLDER: &str = "runyard-provider-check";

/// The pool used when none is named and none uses the provider.
const DEFAULT_POOL: &str = "runyard-check";

/// Every step passed.
const EXIT_PASSED: u8 = 0;
/// A step failed.
const EXIT_FAILED: u8 = 1;
/// Usage or configuration error.
const EXIT_USAGE: u8 = 2;

/// One step of the sequence: its id (for scripts), the provider command
/// it sends, how it is shown and what it checks.
#[derive(Debug, Clone, Copy)]
struct Kind {
    id: &'static str,
    call: &'static str,
    label: &'static str,
}

const VERSION: Kind = Kind {
    id: "version",
    call: "GetVersion",
    label: "GetVersion",
};
const CREATE: Kind = Kind {
    id: "create",
    call: "CreateInstance",
    label: "CreateInstance",
};
const GET: Kind = Kind {
    id: "get",
    call: "GetInstance",
    label: "GetInstance",
};
const LIST: Kind = Kind {
    id: "list",
    call: "ListInstances",
    label: "ListInstances",
};
const DELETE: Kind = Kind {
    id: "delete",
    call: "DeleteInstance",
    label: "DeleteInstance",
};
const DELETE_AGAIN: Kind = Kind {
    id: "delete_again",
    call: "DeleteInstance",
    label: "DeleteInstance (again)",
};
const LIST_GONE: Kind = Kind {
    id: "list_gone",
    call: "ListInstances",
    label: "ListInstances (gone)",
};
const CLEANUP: Kind = Kind {
    id: "cleanup",
    call: "DeleteInstance",
    label: "DeleteInstance (cleanup)",
};

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Outcome {
    Passed,
    Failed,
    /// Not run: an earlier step it needs failed.
    Skipped,
    /// This build cannot send the call.
    Unsupported,
}

/// One step's result.
#[derive(Debug, Clone, Serialize)]
struct Step {
    step: &'static str,
    call: &'static str,
    #[serde(skip)]
    label: &'static str,
    outcome: Outcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider_id: Option<String>,
    detail: String,
}

impl Step {
    fn new(kind: Kind, outcome: Outcome, ms: Option<f64>, detail: impl Into<String>) -> Self {
        Self {
            step: kind.id,
            call: kind.call,
            label: kind.label,
            outcome,
            duration_ms: ms,
            status: None,
            provider_id: None,
            detail: detail.into(),
        }
    }

    fn passed(kind: Kind, ms: f64, detail: impl Into<String>) -> Self {
        Self::new(kind, Outcome::Passed, Some(ms), detail)
    }

    fn failed(kind: Kind, ms: f64, detail: impl Into<String>) -> Self {
        Self::new(kind, Outcome::Failed, Some(ms), detail)
    }

    /// Passed unless `problems` says otherwise; the instance's status and
    /// provider id are shown either way.
    fn seen(kind: Kind, ms: f64, instance: &Instance, what: &str, problems: &[String]) -> Self {
        let mut detail = format!(
            "{what}: status {}, provider_id {}",
            instance.status, instance.provider_id
        );
        if let Some(fault) = &instance.fault {
            detail.push_str(&format!(", fault {fault:?}"));
        }
        let outcome = if problems.is_empty() {
            Outcome::Passed
        } else {
            detail.push_str("; ");
            detail.push_str(&problems.join("; "));
            Outcome::Failed
        };
        Self {
            status: Some(instance.status.clone()),
            provider_id: Some(instance.provider_id.clone()),
            ..Self::new(kind, outcome, Some(ms), detail)
        }
    }
}

/// The machine-readable report (`--json`).
#[derive(Debug, Serialize)]
struct Report {
    provider: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    executable: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    namespace: String,
    controller_id: String,
    pool: String,
    pool_id: String,
    /// False when the pool is not in the file (its id is still the one the
    /// scaler would give it).
    pool_configured: bool,
    instance: String,
    image: String,
    flavor: String,
    steps: Vec<Step>,
    failed_steps: Vec<&'static str>,
    passed: bool,
    interrupted: bool,
    verdict: String,
}

/// Everything a check needs, from the arguments and the scaler's file.
struct Target {
    provider: Provider,
    pool: Option<PoolConfig>,
    pool_name: String,
    pool_id: String,
    instance: String,
    image: String,
    flavor: String,
    memory_bytes: u64,
    cpus: u32,
    wait_gone: Duration,
    report: Report,
}

/// A usage or configuration error (exit 2).
#[derive(Debug)]
struct Usage(String);

/// Runs `runyard provider check`.
pub async fn run(args: &CheckArgs) -> ExitCode {
    let target = match prepare(args) {
        Ok(t) => t,
        Err(Usage(message)) => {
            if args.json {
                out(&format!(
                    "{}\n",
                    serde_json::json!({"passed": false, "exit_code": EXIT_USAGE, "error": message})
                ));
            }
            eprintln!("runyard provider check: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let mut checker = Checker {
        json: args.json,
        steps: Vec::new(),
    };
    if !args.json {
        out(&header(&target));
    }
    let interrupted = tokio::select! {
        () = sequence(&target, &mut checker) => false,
        _ = tokio::signal::ctrl_c() => true,
    };
    if interrupted {
        if !args.json {
            out("  interrupted: deleting the instance\n");
        }
        let (ms, deleted) = timed(target.provider.delete(&target.pool_id, &target.instance)).await;
        checker.record(match deleted {
            Ok(()) => Step::passed(
                CLEANUP,
                ms,
                format!("{} deleted (or never made)", target.instance),
            ),
            Err(e) => Step::failed(
                CLEANUP,
                ms,
                format!("{}: {e}; it may be left on the backend", target.instance),
            ),
        });
    }
    let mut report = target.report;
    report.steps = checker.steps;
    report.interrupted = interrupted;
    report.failed_steps = report
        .steps
        .iter()
        .filter(|s| s.outcome == Outcome::Failed)
        .map(|s| s.label)
        .collect();
    report.passed = report.failed_steps.is_empty() && !interrupted;
    report.verdict = verdict(&report);
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .unwrap_or_else(|e| format!("{{\"error\": \"encoding the report: {e}\"}}"));
        out(&format!("{text}\n"));
    } else {
        out(&format!("\n{}\n", report.verdict));
    }
    ExitCode::from(if report.passed {
        EXIT_PASSED
    } else {
        EXIT_FAILED
    })
}

fn verdict(r: &Report) -> String {
    let unsupported: Vec<&str> = r
        .steps
        .iter()
        .filter(|s| s.outcome == Outcome::Unsupported)
        .map(|s| s.call)
        .collect();
    let passed = r
        .steps
        .iter()
        .filter(|s| s.outcome == Outcome::Passed)
        .count();
    if r.interrupted {
        return format!(
            "INTERRUPTED: provider {:?} was not fully checked.",
            r.provider
        );
    }
    if r.passed {
        let mut v = format!(
            "PASSED: provider {:?} did all {passed} steps as the scaler needs them.",
            r.provider
        );
        if !unsupported.is_empty() {
            v.push_str(&format!(
                " Not checked ({} not supported by this build).",
                unsupported.join(", ")
            ));
        }
        return v;
    }
    format!(
        "FAILED: provider {:?} failed {} of {} steps: {}.",
        r.provider,
        r.failed_steps.len(),
        r.steps
            .iter()
            .filter(|s| matches!(s.outcome, Outcome::Passed | Outcome::Failed))
            .count(),
        r.failed_steps.join(", ")
    )
}

fn header(t: &Target) -> String {
    let r = &t.report;
    let mut h = format!(
        "runyard provider check: provider {:?} ({})\n",
        r.provider, r.kind
    );
    if let Some(exe) = &r.executable {
        h.push_str(&format!("  executable   {}\n", exe.display()));
    }
    if let Some(file) = &r.config_file {
        h.push_str(&format!("  config file  {}\n", file.display()));
    }
    if let Some(v) = &r.interface_version {
        h.push_str(&format!("  interface    {v}\n"));
    }
    if let Some(command) = &r.command {
        h.push_str(&format!("  command      {command:?}\n"));
    }
    h.push_str(&format!(
        "  controller   {} (namespace {})\n",
        r.controller_id, r.namespace
    ));
    h.push_str(&format!(
        "  pool         {} (id {}){}\n",
        r.pool,
        r.pool_id,
        if r.pool_configured {
            ""
        } else {
            ", not in the file"
        }
    ));
    h.push_str(&format!(
        "  image        {}\n  flavor       {}\n",
        show(&r.image),
        show(&t.flavor)
    ));
    h.push_str(&format!(
        "  instance     {} (JIT config {PLACEHOLDER:?}: registers no runner)\n\n",
        r.instance
    ));
    h
}

fn show(s: &str) -> String {
    if s.is_empty() {
        "(none)".into()
    } else {
        s.to_owned()
    }
}

/// Reads the file and resolves the provider and the pool.
fn prepare(args: &CheckArgs) -> Result<Target, Usage> {
    let path = &args.config;
    let file = ScalerFile::load(path)
        .map_err(|e| Usage(format!("scaler configuration {}: {e}", path.display())))?;
    file.validate()
        .map_err(|e| Usage(format!("scaler configuration {}: {e}", path.display())))?;
    let Some(config) = file.providers.get(&args.provider) else {
        let known: Vec<&str> = file.providers.keys().map(String::as_str).collect();
        return Err(Usage(format!(
            "no provider named {:?} in {} (configured: {})",
            args.provider,
            path.display(),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    if let ProviderConfig::External { executable, .. } = config {
        runnable(executable).map_err(|e| {
            Usage(format!(
                "provider {:?}: executable {}: {e}",
                args.provider,
                executable.display()
            ))
        })?;
    }
    let ns = Namespace::new(args.namespace.clone())
        .map_err(|e| Usage(format!("namespace {:?}: {e}", args.namespace)))?;
    let controller = runyard_provider::controller_id(&ns);
    let pool = match &args.pool {
        Some(name) => match file.pools.iter().find(|p| &p.name == name) {
            Some(p) if p.provider != args.provider => {
                return Err(Usage(format!(
                    "pool {name:?} uses provider {:?}, not {:?}",
                    p.provider, args.provider
                )));
            }
            Some(p) => Some(p.clone()),
            None if valid_pool_name(name) => None,
            None => {
                return Err(Usage(format!(
                    "pool name {name:?} must match [a-z0-9_-]{{1,63}}"
                )));
            }
        },
        None => file
            .pools
            .iter()
            .find(|p| p.provider == args.provider)
            .cloned(),
    };
    let pool_name = match (&pool, &args.pool) {
        (Some(p), _) => p.name.clone(),
        (None, Some(name)) => name.clone(),
        (None, None) => DEFAULT_POOL.to_owned(),
    };
    let pool_id = runyard_provider::pool_id(&controller, &pool_name).to_string();
    // Where the scaler keeps the process provider's pid files.
    let state_dir =
        file.scaler.state_dir.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("runyard-scaler-{}", ns.as_str()))
        });
    let provider =
        Provider::from_config(&args.provider, config, &controller.to_string(), &state_dir);
    if let Some(p) = &pool {
        provider.register_pool(&pool_id, p.extra_specs_json());
    }
    let flavors = pool.as_ref().map(|p| p.flavors.clone()).unwrap_or_default();
    let flavor = match &args.flavor {
        Some(name) => flavors.iter().find(|f| &f.name == name).cloned(),
        None => flavors.first().cloned(),
    };
    let (flavor_name, memory_bytes, cpus) = match (&flavor, &args.flavor) {
        (Some(f), _) => (f.name.clone(), f.memory.as_u64(), f.cpus),
        (None, Some(name)) => (name.clone(), 0, 0),
        (None, None) => (String::new(), 0, 0),
    };
    let image = args
        .image
        .clone()
        .or_else(|| pool.as_ref().map(|p| p.image.clone()))
        .unwrap_or_default();
    let instance = format!(
        "ry-check-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let (kind, executable, config_file, interface_version, command) = match config {
        ProviderConfig::External {
            executable,
            config_file,
            interface_version,
            ..
        } => (
            "external",
            Some(executable.clone()),
            Some(config_file.clone()),
            Some(interface_version.clone()),
            None,
        ),
        ProviderConfig::Process { command, .. } => {
            ("process", None, None, None, Some(command.clone()))
        }
    };
    let report = Report {
        provider: args.provider.clone(),
        kind,
        executable,
        config_file,
        interface_version,
        command,
        namespace: ns.as_str().to_owned(),
        controller_id: controller.to_string(),
        pool: pool_name.clone(),
        pool_id: pool_id.clone(),
        pool_configured: pool.is_some(),
        instance: instance.clone(),
        image: image.clone(),
        flavor: flavor_name.clone(),
        steps: Vec::new(),
        failed_steps: Vec::new(),
        passed: false,
        interrupted: false,
        verdict: String::new(),
    };
    Ok(Target {
        provider,
        pool,
        pool_name,
        pool_id,
        instance,
        image,
        flavor: match &flavor {
            Some(f) => format!("{} ({}, {} CPUs)", f.name, f.memory, f.cpus),
            None => flavor_name,
        },
        memory_bytes,
        cpus,
        wait_gone: Duration::from_secs(args.wait_gone),
        report,
    })
}

/// Whether `path` is a file the scaler can run (garm refuses to start
/// without one, too).
fn runnable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("is not a file".into());
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err("is not executable".into());
    }
    Ok(())
}

/// The create the scaler would send for this pool and instance, with
/// placeholders where a real create carries a JIT config, an instance
/// token and the metadata API's URLs (left empty: the instance's install
/// script stops before it configures anything).
fn create_request(t: &Target) -> (CreateRequest, Bootstrap) {
    let p = t.pool.as_ref();
    let forge = p.map_or(Forge::Github, |p| p.forge);
    let os_type = p.map_or("linux", |p| p.os_type.as_str()).to_owned();
    let os_arch = p.map_or("amd64", |p| p.os_arch.as_str()).to_owned();
    let mut labels: Vec<String> = p.map(|p| p.labels.clone()).unwrap_or_default();
    labels.push(format!("runyard-pool={}", t.pool_name));
    let req = CreateRequest {
        name: t.instance.clone(),
        pool: t.pool_name.clone(),
        pool_id: t.pool_id.clone(),
        flavor: t.report.flavor.clone(),
        memory_bytes: t.memory_bytes,
        cpus: t.cpus,
        image: t.image.clone(),
        labels,
        jit_config: SecretString::from(PLACEHOLDER.to_owned()),
        repo_url: p.map_or_else(|| format!("https://github.com/{PLACEHOLDER}"), repo_url),
        runner_group: String::new(),
        extra_specs: p.map_or_else(|| serde_json::json!({}), PoolConfig::extra_specs_json),
        timeout: p.map_or(Duration::from_secs(20 * 60), |p| p.bootstrap_timeout),
    };
    // GitHub pools get a runner download for the machine's OS and
    // architecture (garm's providers refuse a create without one); it
    // points nowhere.
    let tools = if forge == Forge::Gitlab {
        Vec::new()
    } else {
        vec![placeholder_tool(&os_type, &os_arch)]
    };
    let boot = Bootstrap {
        tools,
        instance_token: SecretString::from(PLACEHOLDER.to_owned()),
        os_type,
        os_arch,
        forge,
        ..Bootstrap::default()
    };
    (req, boot)
}

/// Where the pool's runners register, as the scaler tells providers.
fn repo_url(p: &PoolConfig) -> String {
    let s = &p.scope;
    let host = p.instance.clone().unwrap_or_else(|| {
        if p.forge == Forge::Gitlab {
            "gitlab.com".into()
        } else {
            "github.com".into()
        }
    });
    match (&s.repo, &s.org, &s.enterprise) {
        (Some(r), _, _) => format!("https://{host}/{r}"),
        (_, Some(o), _) => format!("https://{host}/{o}"),
        (_, _, Some(e)) => format!("https://{host}/enterprises/{e}"),
        _ => format!("https://{host}"),
    }
}

/// A runner download named as GitHub names them, at an address that never
/// resolves (`.invalid`).
fn placeholder_tool(os_type: &str, os_arch: &str) -> RunnerDownload {
    let os = if os_type == "windows" { "win" } else { "linux" };
    let arch = match os_arch {
        "arm64" => "arm64",
        "arm" => "arm",
        "i386" => "x86",
        _ => "x64",
    };
    let ext = if os == "win" { "zip" } else { "tar.gz" };
    let filename = format!("actions-runner-{os}-{arch}-{PLACEHOLDER}.{ext}");
    RunnerDownload {
        os: os.into(),
        architecture: arch.into(),
        download_url: format!("https://{PLACEHOLDER}.invalid/{filename}"),
        filename,
        temp_download_token: None,
        sha256_checksum: None,
    }
}

/// Records steps, printing each as it ends unless the report is JSON.
struct Checker {
    json: bool,
    steps: Vec<Step>,
}

impl Checker {
    fn record(&mut self, step: Step) {
        if !self.json {
            out(&line(&step));
        }
        self.steps.push(step);
    }
}

fn line(s: &Step) -> String {
    let mark = match s.outcome {
        Outcome::Passed => "PASS",
        Outcome::Failed => "FAIL",
        Outcome::Skipped => "SKIP",
        Outcome::Unsupported => "----",
    };
    let ms = s
        .duration_ms
        .map_or_else(String::new, |ms| format!("{ms:.1} ms"));
    format!("  {mark}  {:<26} {ms:>11}  {}\n", s.label, s.detail)
}

/// Milliseconds, to the microsecond.
fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

async fn timed<T>(f: impl Future<Output = T>) -> (f64, T) {
    let started = Instant::now();
    let value = f.await;
    (millis(started.elapsed()), value)
}

/// `GetVersion`: what the provider says it is (a provider that does not
/// know the command fails the step: garm's providers all answer it).
async fn version(t: &Target) -> Step {
    let (ms, answer) = timed(t.provider.version(&t.pool_id)).await;
    match answer {
        Ok(v) => Step::new(VERSION, Outcome::Passed, Some(ms), format!("version {v}")),
        Err(ProviderError::Unsupported(why)) => Step::new(VERSION, Outcome::Unsupported, None, why),
        Err(e) => Step::new(VERSION, Outcome::Failed, Some(ms), e.to_string()),
    }
}

/// The sequence; see the module docs.
async fn sequence(t: &Target, c: &mut Checker) {
    c.record(version(t).await);
    let (req, boot) = create_request(t);
    let (ms, created) = timed(t.provider.create_with(&req, &boot)).await;
    let instance = match created {
        Ok(i) => {
            let mut problems = Vec::new();
            if i.name != t.instance {
                problems.push(format!(
                    "answered name {:?}, asked for {:?}",
                    i.name, t.instance
                ));
            }
            c.record(Step::seen(CREATE, ms, &i, "created", &problems));
            i
        }
        Err(e) => {
            let made = match &e {
                ProviderError::InstanceError { provider_id, .. } => Some(provider_id.clone()),
                _ => None,
            };
            let mut step = Step::failed(CREATE, ms, e.to_string());
            step.provider_id.clone_from(&made);
            c.record(step);
            for kind in [GET, LIST, DELETE, DELETE_AGAIN, LIST_GONE] {
                c.record(Step::new(kind, Outcome::Skipped, None, "the create failed"));
            }
            let target = made.unwrap_or_else(|| t.instance.clone());
            let (ms, deleted) = timed(t.provider.delete(&t.pool_id, &target)).await;
            c.record(match deleted {
                Ok(()) => Step::passed(
                    CLEANUP,
                    ms,
                    format!("removed {target} (or it was never made)"),
                ),
                Err(e) => Step::failed(
                    CLEANUP,
                    ms,
                    format!("{target}: {e}; if the create made it, it is left on the backend"),
                ),
            });
            return;
        }
    };
    let id = instance.provider_id.as_str();

    let (ms, got) = timed(t.provider.get(&t.pool_id, id)).await;
    c.record(match got {
        Ok(i) => {
            let mut problems = Vec::new();
            if i.provider_id != id {
                problems.push(format!("answered provider_id {:?}", i.provider_id));
            }
            if i.name != t.instance {
                problems.push(format!("answered name {:?}", i.name));
            }
            Step::seen(GET, ms, &i, "found", &problems)
        }
        Err(e) => Step::failed(GET, ms, format!("{id}: {e}")),
    });

    let (ms, listed) = timed(t.provider.list(&t.pool_id)).await;
    c.record(match listed {
        Ok(list) => match list.iter().find(|i| i.provider_id == id) {
            Some(i) => {
                let problems = if i.name == t.instance {
                    Vec::new()
                } else {
                    vec![format!("listed with name {:?}", i.name)]
                };
                Step::seen(
                    LIST,
                    ms,
                    i,
                    &format!("listed among {}", list.len()),
                    &problems,
                )
            }
            None => Step::failed(
                LIST,
                ms,
                format!(
                    "{id} is not among the {} instances listed for pool id {}",
                    list.len(),
                    t.pool_id
                ),
            ),
        },
        Err(e) => Step::failed(LIST, ms, e.to_string()),
    });

    let (ms, deleted) = timed(t.provider.delete(&t.pool_id, id)).await;
    let first_ok = deleted.is_ok();
    c.record(match deleted {
        Ok(()) => Step::passed(DELETE, ms, format!("deleted {id}")),
        Err(e) => Step::failed(DELETE, ms, format!("{id}: {e}")),
    });

    let (ms, again) = timed(t.provider.delete(&t.pool_id, id)).await;
    let again_ok = again.is_ok();
    c.record(match again {
        Ok(()) => Step::passed(
            DELETE_AGAIN,
            ms,
            "a missing instance is a success (exit 0 or 30)",
        ),
        Err(e) => Step::failed(
            DELETE_AGAIN,
            ms,
            format!(
                "{id}: {e} (deleting a missing instance must succeed: exit 0, or 30 for not found)"
            ),
        ),
    });

    // A backend may take a while to forget a deleted machine; when no
    // delete succeeded there is nothing to wait for.
    let wait = if first_ok || again_ok {
        t.wait_gone
    } else {
        Duration::ZERO
    };
    let started = Instant::now();
    let step = loop {
        let listed = t.provider.list(&t.pool_id).await;
        let ms = millis(started.elapsed());
        match listed {
            Ok(list) => match list.iter().find(|i| i.provider_id == id) {
                None => {
                    break Step::passed(
                        LIST_GONE,
                        ms,
                        format!("{id} is gone ({} other instances listed)", list.len()),
                    );
                }
                Some(i) if started.elapsed() >= wait => {
                    let why = if wait.is_zero() {
                        "no delete succeeded; remove it by hand".to_owned()
                    } else {
                        format!(
                            "still there {:.0} s after the delete; remove it by hand",
                            started.elapsed().as_secs_f64()
                        )
                    };
                    break Step::seen(LIST_GONE, ms, i, "still listed", &[why]);
                }
                Some(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            },
            Err(e) => break Step::failed(LIST_GONE, ms, e.to_string()),
        }
    };
    c.record(step);
}
