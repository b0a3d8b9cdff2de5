//! What runyard adds around a garm external-provider executable per call:
//! building the clean environment and the bootstrap JSON, spawning the
//! executable in its own process group with its three pipes, feeding stdin
//! while reading stdout and stderr, the timeout and the strict parsing of
//! the answer.
//!
//! Each call is made three ways, interleaved (the order rotating), in one
//! current-thread tokio runtime:
//! - **runyard**: `runyard_scaler::provider::Provider` (the `external`
//!   provider, built from a scaler file's `[providers.noop]`) calling
//!   `benches/noop-provider`, a bash script that drains stdin in one read and
//!   answers a fixed instance;
//! - **baseline**: the same executable spawned directly with
//!   `tokio::process::Command` (a cleared environment holding only
//!   `GARM_COMMAND`, stdin and stdout piped, stderr closed), given the very
//!   bytes runyard sends on stdin (captured once beforehand), its stdout read
//!   and not parsed;
//! - **spawn settings**: the baseline with runyard's spawn settings (the five
//!   `GARM_*` variables, stderr piped too, its own process group,
//!   kill-on-drop, under a timeout), which splits runyard's overhead into
//!   what its way of spawning costs and what its own code costs.
//!
//! The executable's own cost is in all three, so the differences are
//! runyard's. Measured per call: wall time, the CPU time of the runtime's
//! thread (all of this process's work: `/proc/thread-self/schedstat`) and of
//! the reaped children (`cutime + cstime`: clock ticks, summed over the run,
//! so only good to about ±0.2 ms per call; no difference is shown for it).
//!
//! The machine may be shared: before a run the bench waits (up to 20 s) for
//! the rest of the machine to use under 0.25 cores, measures the other load
//! during the run (`/proc/stat` minus this process and its children) and
//! runs again when it was above 0.25 cores (at most 3 attempts), keeping
//! the least disturbed.
//!
//! `cargo bench -p runyard-scaler --bench provider_overhead [-- --calls N
//! --warmup N]` (1,000 calls of each kind after 50 warm-up calls; `--
//! --help` lists the flags); prints markdown. Target: the create's p99
//! overhead at most 5 ms. Without `--bench` (`cargo test -p runyard-scaler
//! --bench provider_overhead`) it is a smoke run: 20 calls of each kind
//! after 2 warm-up calls, once.
#![allow(clippy::print_stdout)] // the report goes to stdout

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use runyard_bench::args;
use runyard_bench::attempts::Attempts;
use runyard_bench::procfs;
use runyard_bench::report::{Dist, Table, verdict};
use runyard_forge::api::github::RunnerDownload;
use runyard_scaler::ScalerFile;
use runyard_scaler::provider::{Bootstrap, CreateRequest, Provider};
use secrecy::SecretString;
use tokio::io::AsyncWriteExt as _;

/// The create overhead's p99 target.
const TARGET_P99_MS: f64 = 5.0;

/// Other load (cores) under which the machine counts as quiet.
const QUIET_CORES: f64 = 0.25;

/// Runs at most, when other work disturbs them.
const ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Create,
    List,
    Delete,
}

impl Call {
    fn command(self) -> &'static str {
        match self {
            Self::Create => "CreateInstance",
            Self::List => "ListInstances",
            Self::Delete => "DeleteInstance",
        }
    }
}

/// One path's measurements of one call kind.
#[derive(Debug, Default)]
struct Samples {
    wall_ms: Vec<f64>,
    thread_cpu: Duration,
    children_cpu: Duration,
}

/// What runyard adds around a garm external-provider executable per call,
/// against a direct spawn of the same executable.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Measured calls of each kind [default: 1000; 20 without `--bench`,
    /// the smoke run of `cargo test --benches`].
    #[arg(long, value_parser = args::at_least_one)]
    calls: Option<usize>,
    /// Warm-up calls of each kind before them [default: 50; 2 without
    /// `--bench`].
    #[arg(long)]
    warmup: Option<usize>,
    #[command(flatten)]
    cargo: args::Cargo,
}

/// What a run does.
#[derive(Debug)]
struct Plan {
    calls: usize,
    warmup: usize,
    /// Attempts at most (1 for a smoke run).
    attempts: u32,
    /// How long to wait for a quiet machine before an attempt.
    quiet_wait: Duration,
}

impl Plan {
    /// A smoke run without `--bench` (`cargo test --benches`): 20 calls of
    /// each kind, one attempt, no waiting.
    fn of(args: &Args) -> Self {
        let smoke = !args.cargo.bench;
        Self {
            calls: args.calls.unwrap_or(if smoke { 20 } else { 1000 }),
            warmup: args.warmup.unwrap_or(if smoke { 2 } else { 50 }),
            attempts: if smoke { 1 } else { ATTEMPTS },
            quiet_wait: if smoke {
                Duration::ZERO
            } else {
                Duration::from_secs(20)
            },
        }
    }
}

fn main() -> anyhow::Result<()> {
    let plan = Plan::of(&Args::parse());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(&plan))
}

fn noop_executable() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/noop-provider")
}

/// The provider as the scaler builds it from its file.
fn provider(executable: &Path, config_file: &Path) -> anyhow::Result<Provider> {
    let file = ScalerFile::parse(&format!(
        "[providers.noop]\nkind = \"external\"\nexecutable = {:?}\nconfig_file = {:?}\nexec_timeout = \"30s\"\n",
        executable.display().to_string(),
        config_file.display().to_string()
    ))?;
    let config = file.providers.get("noop").context("the noop provider")?;
    Ok(Provider::from_config(
        "noop",
        config,
        "6b890957-d4ae-5cb5-a96f-a6b78de1fb5d",
        config_file.parent().unwrap_or(Path::new("/tmp")),
    ))
}

/// A create as the engine sends it for a GitHub pool: labels, extra specs,
/// the runner downloads GitHub lists (9 builds) and the metadata API's
/// URLs and token, so the bootstrap JSON has its real size.
fn create_request() -> (CreateRequest, Bootstrap) {
    let req = CreateRequest {
        name: "ry-linux-x64-0123456789".into(),
        pool: "linux-x64".into(),
        pool_id: "2f97036a-84c9-5eee-af9b-4683f71549c6".into(),
        flavor: "small".into(),
        memory_bytes: 4 << 30,
        cpus: 2,
        image: "ubuntu:24.04".into(),
        labels: vec![
            "self-hosted".into(),
            "linux".into(),
            "x64".into(),
            "runyard-pool=linux-x64".into(),
        ],
        jit_config: SecretString::from("x".repeat(2400)),
        repo_url: "https://github.com/acme".into(),
        runner_group: String::new(),
        extra_specs: serde_json::json!({"disk_gb": 20}),
        timeout: Duration::from_secs(1200),
    };
    let tools = [
        ("osx", "x64", "tar.gz"),
        ("osx", "arm64", "tar.gz"),
        ("linux", "x64", "tar.gz"),
        ("linux", "arm", "tar.gz"),
        ("linux", "arm64", "tar.gz"),
        ("win", "x64", "zip"),
        ("win", "arm64", "zip"),
        ("linux", "x64", "tar.gz"),
        ("linux", "arm64", "tar.gz"),
    ]
    .into_iter()
    .map(|(os, arch, ext)| {
        let filename = format!("actions-runner-{os}-{arch}-2.328.0.{ext}");
        RunnerDownload {
            os: os.into(),
            architecture: arch.into(),
            download_url: format!(
                "https://github.com/actions/runner/releases/download/v2.328.0/{filename}"
            ),
            filename,
            temp_download_token: None,
            sha256_checksum: Some("0".repeat(64)),
        }
    })
    .collect();
    let boot = Bootstrap {
        tools,
        callback_url: "http://scaler.internal:8084/api/v1/callbacks".into(),
        metadata_url: "http://scaler.internal:8084/api/v1/metadata".into(),
        instance_token: SecretString::from("t".repeat(400)),
        ..Bootstrap::default()
    };
    (req, boot)
}

const CAPTURE: &str = r#"#!/bin/bash
# Saves the stdin of a call beside the provider's config file.
read -r -N 1048576 x || true
printf '%s' "$x" > "$GARM_PROVIDER_CONFIG_FILE.stdin"
printf '%s\n' '{"provider_id":"noop-1","name":"noop","status":"running"}'
"#;

/// The bytes runyard writes to a create's stdin.
async fn captured_stdin(
    dir: &Path,
    req: &CreateRequest,
    boot: &Bootstrap,
) -> anyhow::Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt as _;
    let exe = dir.join("capture-provider");
    std::fs::write(&exe, CAPTURE)?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))?;
    let config = dir.join("capture.json");
    std::fs::write(&config, "{}")?;
    provider(&exe, &config)?.create_with(req, boot).await?;
    let bytes = std::fs::read(dir.join("capture.json.stdin")).context("the captured stdin")?;
    // The JSON must be whole (bash's read keeps everything but NUL bytes).
    serde_json::from_slice::<serde_json::Value>(&bytes).context("the captured stdin is JSON")?;
    Ok(bytes)
}

/// One call through runyard's provider.
async fn via_runyard(
    p: &Provider,
    call: Call,
    req: &CreateRequest,
    boot: &Bootstrap,
) -> anyhow::Result<()> {
    match call {
        Call::Create => {
            let i = p.create_with(req, boot).await?;
            anyhow::ensure!(i.provider_id == "noop-1", "unexpected answer {i:?}");
        }
        Call::List => {
            let list = p.list(&req.pool_id).await?;
            anyhow::ensure!(list.len() == 1, "unexpected answer {list:?}");
        }
        Call::Delete => p.delete(&req.pool_id, "noop-1").await?,
    }
    Ok(())
}

/// The same executable spawned directly.
async fn direct(exe: &Path, call: Call, stdin: &[u8]) -> anyhow::Result<()> {
    let create = call == Call::Create;
    let mut child = tokio::process::Command::new(exe)
        .env_clear()
        .env("GARM_COMMAND", call.command())
        .stdin(if create {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let pipe = child.stdin.take();
    let write = async move {
        if let Some(mut pipe) = pipe {
            let _ = pipe.write_all(stdin).await;
        }
    };
    let ((), out) = tokio::join!(write, child.wait_with_output());
    let out = out?;
    anyhow::ensure!(out.status.success(), "the no-op provider failed");
    anyhow::ensure!(
        (call == Call::Delete) == out.stdout.is_empty(),
        "unexpected output"
    );
    Ok(())
}

/// The baseline with runyard's spawn settings.
async fn direct_like_runyard(exe: &Path, call: Call, stdin: &[u8]) -> anyhow::Result<()> {
    let create = call == Call::Create;
    let mut child = tokio::process::Command::new(exe)
        .env_clear()
        .env("GARM_COMMAND", call.command())
        .env("GARM_CONTROLLER_ID", "6b890957-d4ae-5cb5-a96f-a6b78de1fb5d")
        .env("GARM_PROVIDER_CONFIG_FILE", "/tmp/noop.json")
        .env("GARM_INTERFACE_VERSION", "v0.1.0")
        .env("GARM_POOL_ID", "2f97036a-84c9-5eee-af9b-4683f71549c6")
        .stdin(if create {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    let pipe = child.stdin.take();
    let write = async move {
        if let Some(mut pipe) = pipe {
            let _ = pipe.write_all(stdin).await;
        }
    };
    let run = async move {
        let ((), out) = tokio::join!(write, child.wait_with_output());
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(30), run).await??;
    anyhow::ensure!(out.status.success(), "the no-op provider failed");
    Ok(())
}

/// The three ways of making a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Runyard,
    Baseline,
    Settings,
}

const WAYS: [Way; 3] = [Way::Runyard, Way::Baseline, Way::Settings];

/// One attempt's measurements: per call kind, per way.
#[derive(Debug)]
struct Run {
    results: Vec<(Call, [Samples; 3])>,
    secs: f64,
    own_cores: f64,
    other_cores: f64,
}

/// Our own CPU time so far: this process and its reaped children.
fn own_cpu() -> Duration {
    let me = std::process::id();
    procfs::cpu_time(me).unwrap_or_default() + procfs::children_cpu_time(me).unwrap_or_default()
}

async fn measure(
    plan: &Plan,
    p: &Provider,
    exe: &Path,
    req: &CreateRequest,
    boot: &Bootstrap,
    stdin: &[u8],
) -> anyhow::Result<Run> {
    let me = std::process::id();
    let children = || procfs::children_cpu_time(me).unwrap_or_default();
    let mut results = Vec::new();
    let busy0 = procfs::machine_busy().unwrap_or_default();
    let own0 = own_cpu();
    let started = Instant::now();
    for call in [Call::Create, Call::List, Call::Delete] {
        let mut samples: [Samples; 3] = Default::default();
        for i in 0..plan.warmup + plan.calls {
            let measured = i >= plan.warmup;
            for k in 0..3 {
                let way = (i + k) % 3;
                let cpu0 = procfs::thread_on_cpu();
                let child0 = children();
                let t0 = Instant::now();
                match WAYS[way] {
                    Way::Runyard => via_runyard(p, call, req, boot).await?,
                    Way::Baseline => direct(exe, call, stdin).await?,
                    Way::Settings => direct_like_runyard(exe, call, stdin).await?,
                }
                let wall = t0.elapsed().as_secs_f64() * 1e3;
                let cpu = procfs::thread_on_cpu().saturating_sub(cpu0);
                let child = children().saturating_sub(child0);
                if measured {
                    let s = &mut samples[way];
                    s.wall_ms.push(wall);
                    s.thread_cpu += cpu;
                    s.children_cpu += child;
                }
            }
        }
        results.push((call, samples));
    }
    let secs = started.elapsed().as_secs_f64();
    let own = own_cpu().saturating_sub(own0);
    let busy = procfs::machine_busy()
        .unwrap_or_default()
        .saturating_sub(busy0);
    Ok(Run {
        results,
        secs,
        own_cores: own.as_secs_f64() / secs,
        other_cores: busy.saturating_sub(own).as_secs_f64() / secs,
    })
}

async fn run(plan: &Plan) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("noop.json");
    std::fs::write(&config, "{}")?;
    let exe = noop_executable();
    let p = provider(&exe, &config)?;
    let (req, boot) = create_request();
    let stdin = captured_stdin(dir.path(), &req, &boot).await?;

    let mut tries = Attempts::new(QUIET_CORES, plan.attempts);
    loop {
        let attempt = tries.next_number();
        let before = procfs::wait_for_quiet(QUIET_CORES, plan.quiet_wait).await;
        let run = measure(plan, &p, &exe, &req, &boot, &stdin).await?;
        eprintln!(
            "attempt {attempt}: other load {before:.2} cores before, {:.2} during ({:.1} s)",
            run.other_cores, run.secs
        );
        if tries.record(run.other_cores, run) {
            break;
        }
    }
    let attempts = tries.next_number() - 1;
    let (run, kept, _, _) = tries.finish();
    report(plan, &run, kept, attempts, stdin.len());
    Ok(())
}

fn report(plan: &Plan, run: &Run, kept: u32, attempts: u32, stdin_bytes: usize) {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let today = time::OffsetDateTime::now_utc().date();
    println!(
        "### provider_overhead — {today}: {} calls of each kind after {} warm-up calls\n",
        plan.calls, plan.warmup
    );
    println!(
        "{cpus} CPUs; attempt #{kept} of {attempts} kept ({:.1} s): this process and its children {:.2} cores, other load {:.2} cores{}. \
         CreateInstance stdin: {stdin_bytes} bytes (the bootstrap JSON).\n",
        run.secs,
        run.own_cores,
        run.other_cores,
        if run.other_cores > QUIET_CORES {
            " (**disturbed**: read the tails with care)"
        } else {
            ""
        }
    );
    let mut t = Table::new([
        "call",
        "path",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "mean ms",
        "this process's CPU µs/call",
        "provider's CPU µs/call",
    ]);
    let mut create_overhead_p99 = f64::NAN;
    for (call, samples) in &run.results {
        let [runyard, baseline, settings] = samples;
        let n = runyard.wall_ms.len() as f64;
        let wall = |s: &Samples| Dist::of(s.wall_ms.iter().copied());
        let (r, b, f) = (wall(runyard), wall(baseline), wall(settings));
        let cpu = |s: &Samples| s.thread_cpu.as_secs_f64() * 1e6 / n;
        let child = |s: &Samples| s.children_cpu.as_secs_f64() * 1e6 / n;
        let cmd = call.command();
        let cells = |path: &str, figures: [String; 7]| {
            [cmd.to_owned(), path.to_owned()].into_iter().chain(figures)
        };
        for (path, d, x) in [
            ("runyard `Provider`", &r, runyard),
            ("direct spawn (baseline)", &b, baseline),
            ("direct spawn, runyard's spawn settings", &f, settings),
        ] {
            let figures = [d.p50(), d.p90(), d.p99(), d.max(), d.mean()].map(|v| format!("{v:.2}"));
            let [p50, p90, p99, max, mean] = figures;
            t.row(cells(
                path,
                [
                    p50,
                    p90,
                    p99,
                    max,
                    mean,
                    format!("{:.0}", cpu(x)),
                    format!("{:.0}", child(x)),
                ],
            ));
        }
        for (label, bold, a, z, x, y) in [
            ("runyard − baseline", true, &r, &b, runyard, baseline),
            (
                "… of which spawn settings",
                false,
                &f,
                &b,
                settings,
                baseline,
            ),
            (
                "… of which runyard's code",
                false,
                &r,
                &f,
                runyard,
                settings,
            ),
        ] {
            let star = if bold { "**" } else { "" };
            t.row(cells(
                &format!("{star}{label}{star}"),
                [
                    format!("{star}{:+.2}{star}", a.p50() - z.p50()),
                    format!("{:+.2}", a.p90() - z.p90()),
                    format!("{star}{:+.2}{star}", a.p99() - z.p99()),
                    String::new(),
                    format!("{:+.2}", a.mean() - z.mean()),
                    format!("{:+.0}", cpu(x) - cpu(y)),
                    String::new(),
                ],
            ));
        }
        let d = Dist::of(
            runyard
                .wall_ms
                .iter()
                .zip(&baseline.wall_ms)
                .map(|(a, b)| a - b),
        );
        let paired = [d.p50(), d.p90(), d.p99(), d.max(), d.mean()].map(|v| format!("{v:+.2}"));
        let [p50, p90, p99, max, mean] = paired;
        t.row(cells(
            "paired: each runyard call − the baseline call beside it",
            [p50, p90, p99, max, mean, String::new(), String::new()],
        ));
        t.row(cells(
            "ratio runyard / baseline",
            [
                format!("{:.2}×", r.p50() / b.p50()),
                String::new(),
                format!("{:.2}×", r.p99() / b.p99()),
                String::new(),
                format!("{:.2}×", r.mean() / b.mean()),
                String::new(),
                String::new(),
            ],
        ));
        if *call == Call::Create {
            create_overhead_p99 = r.p99() - b.p99();
        }
    }
    println!("{t}");
    let mut t = Table::new(["target", "measured", "verdict"]);
    t.row([
        format!("CreateInstance overhead p99 ≤ {TARGET_P99_MS} ms (runyard p99 − baseline p99)"),
        format!("{create_overhead_p99:+.2} ms"),
        verdict(create_overhead_p99 <= TARGET_P99_MS).to_owned(),
    ]);
    print!("{t}");
}
