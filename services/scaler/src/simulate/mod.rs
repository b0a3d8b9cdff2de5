//! `runyard-scaler simulate`: a discrete-event simulation in virtual time
//! that runs the real scaling policy (`policy::decide` over a `World`) in
//! both modes of a GitHub pool (webhooks, a runner scale set) and two
//! baselines (garm's pool manager, ARC's runner scale sets) against the
//! same simulated forge and workload, and reports queue wait, scheduling
//! delay, runner-minutes and GiB-minutes for each, with fast (container)
//! and slow (VM) boots.
//!
//! The forge (`forge.rs`) queues jobs FIFO and hands the oldest to an idle
//! runner of the pool the moment one is online (so a runner made for one job
//! often takes another): the longest idle for webhook pools and garm, a
//! random one for scale sets (runyard's and ARC's); runners are ephemeral.
//! Webhooks reach the scaler the instant they happen, except the lost
//! `queued` ones, and so do scale-set messages (never lost); provider and
//! forge calls take no time, so a runner is paid from its create decision
//! to its delete decision, and its boot time is all of create → online.
//! Each job has a memory limit (the allocator's answer, not simulated);
//! runyard sizes a runner for its job with the pool's flavors, garm and ARC
//! run every runner at the largest.

mod baselines;
mod forge;
mod report;
mod runyard;
mod workload;

#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::ensure;
use bytesize::ByteSize;
use clap::{Args, ValueEnum};
use runyard_events::Forge as ForgeKind;

pub use report::{Percentiles, Report, Section, Stats, Target};

use self::baselines::{Arc, Garm, GarmTimers};
use self::forge::{Assign, Forge, Obs};
use self::runyard::{MESSAGE_JOBS, Mode, POOL, Runyard, Timers};
use self::workload::{Boot, START, WorkJob, WorkloadConfig, generate};
use crate::config::Flavor;
use crate::core::policy::{Knobs, PoolSpec};
use crate::core::world::Clock;

/// How long runners take to boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BootSetting {
    /// Containers: uniform 1–4 s.
    Fast,
    /// Virtual machines: log-normal, median 40 s, p95 120 s.
    Slow,
    /// Always `--fixed-boot` seconds (0: none at all).
    Fixed,
}

impl BootSetting {
    fn name(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Slow => "slow",
            Self::Fixed => "fixed",
        }
    }

    fn model(self, fixed: Duration) -> Boot {
        match self {
            Self::Fast => Boot::FAST,
            Self::Slow => Boot::slow(),
            Self::Fixed => Boot::Fixed(fixed),
        }
    }
}

/// `simulate`'s options. Times are in seconds.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Seed of the workload, the boot times and the retry jitter.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Jobs queued in all.
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    /// Hours over which they are queued.
    #[arg(long, default_value_t = 24.0)]
    pub hours: f64,
    /// Share of the jobs queued in matrix bursts (0 = a plain Poisson
    /// process).
    #[arg(long, default_value_t = 0.3)]
    pub burst_share: f64,
    /// Smallest matrix burst.
    #[arg(long, default_value_t = 20)]
    pub burst_min: usize,
    /// Largest matrix burst.
    #[arg(long, default_value_t = 200)]
    pub burst_max: usize,
    /// Median job duration (log-normal).
    #[arg(long, default_value_t = 300.0)]
    pub job_median: f64,
    /// σ of the log of the job duration.
    #[arg(long, default_value_t = 1.0)]
    pub job_sigma: f64,
    /// Boot settings to run.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [BootSetting::Fast, BootSetting::Slow])]
    pub boot: Vec<BootSetting>,
    /// Boot time of the `fixed` setting.
    #[arg(long, default_value_t = 0.0)]
    pub fixed_boot: f64,
    /// Share of `queued` webhooks that never reach the scaler (runyard and
    /// garm; ARC's listener does not use webhooks).
    #[arg(long, default_value_t = 0.0)]
    pub lost_webhooks: f64,
    /// Period of a reconciler that finds lost jobs still queued (0: none,
    /// as in the scaler today).
    #[arg(long, default_value_t = 0.0)]
    pub reconcile_period: f64,
    /// Share of runner creates that fail (every policy).
    #[arg(long, default_value_t = 0.0)]
    pub create_failures: f64,
    /// The pool's `max_runners`.
    #[arg(long, default_value_t = 1000)]
    pub max_runners: u32,
    /// The pool's `min_idle` (garm's `min_idle_runners`, ARC's
    /// `minRunners`).
    #[arg(long, default_value_t = 0)]
    pub min_idle: u32,
    /// The pool's `idle_timeout`.
    #[arg(long, default_value_t = 300.0)]
    pub idle_timeout: f64,
    /// The scaler's `idle_backoff`.
    #[arg(long, default_value_t = 10.0)]
    pub idle_backoff: f64,
    /// The scaler's `sync_interval` (forge listing; the only way it learns a
    /// runner is online). 0: learned at once.
    #[arg(long, default_value_t = 30.0)]
    pub sync_interval: f64,
    /// ARC's resync when no message comes (the listener's empty long
    /// poll; it also retries failed creates). ARC reconciles on every
    /// message and runner change besides.
    #[arg(long, default_value_t = 50.0)]
    pub arc_period: f64,
    /// The pool's flavors' memory, GiB, smallest first (runyard sizes a
    /// runner for its job; garm and ARC run every runner at the largest).
    #[arg(long, value_delimiter = ',', default_values_t = [2.0, 4.0, 8.0, 16.0])]
    pub flavors: Vec<f64>,
    /// Median of the jobs' memory limits (log-normal), GiB.
    #[arg(long, default_value_t = 1.5)]
    pub memory_median: f64,
    /// σ of the log of the jobs' memory limits.
    #[arg(long, default_value_t = 1.0)]
    pub memory_sigma: f64,
}

impl Default for SimulateArgs {
    fn default() -> Self {
        Self {
            seed: 1,
            jobs: 20_000,
            hours: 24.0,
            burst_share: 0.3,
            burst_min: 20,
            burst_max: 200,
            job_median: 300.0,
            job_sigma: 1.0,
            boot: vec![BootSetting::Fast, BootSetting::Slow],
            fixed_boot: 0.0,
            lost_webhooks: 0.0,
            reconcile_period: 0.0,
            create_failures: 0.0,
            max_runners: 1000,
            min_idle: 0,
            idle_timeout: 300.0,
            idle_backoff: 10.0,
            sync_interval: 30.0,
            arc_period: 50.0,
            flavors: vec![2.0, 4.0, 8.0, 16.0],
            memory_median: 1.5,
            memory_sigma: 1.0,
        }
    }
}

/// The engine's fixed timers (`[scaler]` defaults).
const TICK: Duration = Duration::from_millis(500);
const BUSY_CONFIRMATION: Duration = Duration::from_secs(30);
const CREATE_ATTEMPTS: u32 = 5;
const CREATE_BACKOFF: Duration = Duration::from_secs(2);
const CREATE_BACKOFF_MAX: Duration = Duration::from_secs(60);
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// How long after the last arrival a run may go on draining.
const DRAIN: Duration = Duration::from_secs(12 * 3600);
/// How long after the last job completed runners are still counted (enough
/// for every policy to scale to zero; with `min_idle` they never do).
const TAIL: Duration = Duration::from_secs(3600);

/// A scaling policy driven by the simulation.
pub(crate) trait Scaler {
    /// Its name in the report.
    fn name(&self) -> &'static str;
    /// Whether it learns of queued jobs from webhooks (and so misses the
    /// lost ones).
    fn webhooks(&self) -> bool;
    /// Whether its runners are a runner scale set's (the forge gives a job
    /// to any idle one of the set, [`Assign::AnyIdle`]).
    fn scale_set(&self) -> bool;
    /// Something it hears about; `true` when it wakes the policy.
    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool;
    /// Runs at every instant something was heard (`events`) and at its own
    /// wake-ups.
    fn act(&mut self, forge: &mut Forge, now: Clock, events: bool);
    /// Its next timer, strictly after the last `act`.
    fn next_wakeup(&self) -> Clock;
    /// What the report should say of its run besides the figures.
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Runs `scaler` against `forge` until every job is done and every runner
/// gone, an hour after the last job completed, or `until`. Returns the time
/// it stopped.
pub(crate) fn drive(forge: &mut Forge, scaler: &mut dyn Scaler, until: Clock) -> Clock {
    let mut now = START;
    while !forge.quiescent() {
        let wake = scaler.next_wakeup();
        let t = forge.next_time().map_or(wake, |e| e.min(wake));
        let deadline = forge.all_done_at().map_or(until, |d| (d + TAIL).min(until));
        if t > deadline {
            return deadline;
        }
        now = t;
        let mut events = false;
        for obs in forge.step(now) {
            let hidden = match obs {
                Obs::Queued(j) => scaler.webhooks() && forge.jobs[j].work.lost,
                Obs::Rediscovered(_) => !scaler.webhooks(),
                _ => false,
            };
            if !hidden {
                events |= scaler.observe(forge, now, obs);
            }
        }
        scaler.act(forge, now, events);
    }
    now
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn pool_spec(args: &SimulateArgs) -> PoolSpec {
    PoolSpec {
        name: POOL.into(),
        forge: ForgeKind::Github,
        instance: "github.com".into(),
        labels: vec!["self-hosted".into(), "linux".into(), "x64".into()],
        min_idle: args.min_idle,
        max_runners: args.max_runners,
        idle_timeout: secs(args.idle_timeout),
        bootstrap_timeout: BOOTSTRAP_TIMEOUT,
        priority: 0,
        repos: None,
        scale_set: false,
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The pool's flavors, smallest first.
pub(crate) fn flavors(args: &SimulateArgs) -> Vec<Flavor> {
    args.flavors
        .iter()
        .map(|&gib| Flavor {
            name: format!("{gib}g"),
            memory: ByteSize((gib * GIB) as u64),
            cpus: 1,
        })
        .collect()
}

/// The largest flavor's memory, bytes.
pub(crate) fn largest(flavors: &[Flavor]) -> u64 {
    flavors.iter().map(|f| f.memory.as_u64()).max().unwrap_or(0)
}

/// runyard in `mode`, configured from `args`.
pub(crate) fn runyard(args: &SimulateArgs, mode: Mode) -> Runyard {
    Runyard::new(
        pool_spec(args),
        mode,
        flavors(args),
        Knobs {
            idle_backoff: secs(args.idle_backoff),
            create_attempts: CREATE_ATTEMPTS,
            balance: crate::core::policy::Balance::Spread,
        },
        Timers {
            tick: TICK,
            sync_interval: secs(args.sync_interval),
            busy_confirmation: BUSY_CONFIRMATION,
            create_backoff: CREATE_BACKOFF,
            create_backoff_max: CREATE_BACKOFF_MAX,
        },
        args.seed,
        START,
    )
}

/// runyard (webhook and scale-set mode), garm and ARC, configured from
/// `args`.
pub(crate) fn scalers(args: &SimulateArgs) -> Vec<Box<dyn Scaler>> {
    let max = args.max_runners as usize;
    let min_idle = args.min_idle as usize;
    let biggest = largest(&flavors(args));
    vec![
        Box::new(runyard(args, Mode::Webhook)),
        Box::new(runyard(args, Mode::ScaleSet)),
        Box::new(Garm::new(
            GarmTimers::default(),
            min_idle,
            max,
            biggest,
            START,
        )),
        Box::new(Arc::new(
            secs(args.arc_period),
            min_idle,
            max,
            biggest,
            START,
        )),
    ]
}

/// Runs one policy over `work` with one boot setting; returns the forge as
/// it ended and the time it stopped.
pub(crate) fn simulate_one(
    args: &SimulateArgs,
    work: &[WorkJob],
    boot: BootSetting,
    scaler: &mut dyn Scaler,
) -> (Forge, Clock) {
    // The same boot times (and failed creates), in creation order, for
    // every policy.
    let seed = args.seed ^ (0x9e37_79b9_7f4a_7c15 ^ boot as u64);
    let last = work.last().map_or(START, |w| w.queued_at);
    let mut forge = Forge::new(
        work,
        boot.model(secs(args.fixed_boot)),
        seed,
        args.create_failures,
        secs(args.reconcile_period),
        if scaler.scale_set() {
            Assign::AnyIdle
        } else {
            Assign::LongestIdle
        },
    );
    let end = drive(&mut forge, scaler, last + DRAIN);
    (forge, end)
}

/// Runs the four policies over one workload with one boot setting.
pub(crate) fn run_setting(args: &SimulateArgs, work: &[WorkJob], boot: BootSetting) -> Section {
    let flavors = flavors(args);
    let rows = scalers(args)
        .iter_mut()
        .map(|scaler| {
            let (forge, end) = simulate_one(args, work, boot, scaler.as_mut());
            let mut stats = Stats::of(scaler.name(), &forge, end, &flavors);
            stats.notes = scaler.notes();
            stats
        })
        .collect();
    Section {
        boot: boot.name(),
        label: boot.model(secs(args.fixed_boot)).label(),
        rows,
    }
}

fn params(args: &SimulateArgs, work: &[WorkJob]) -> Vec<(String, String)> {
    let bursty = work
        .windows(2)
        .filter(|w| w[0].queued_at == w[1].queued_at)
        .count();
    let p = |k: &str, v: String| (k.to_owned(), v);
    vec![
        p("seed", args.seed.to_string()),
        p(
            "workload",
            format!(
                "{} jobs over {} h: Poisson arrivals, {:.0}% of the jobs in matrix bursts of {}–{} queued at once at uniformly random times ({} jobs share their queue time with another); durations log-normal, median {:.0} s, σ {:.2} (cut at 6 h)",
                work.len(),
                args.hours,
                args.burst_share * 100.0,
                args.burst_min,
                args.burst_max,
                bursty,
                args.job_median,
                args.job_sigma
            ),
        ),
        p(
            "lost webhooks",
            format!(
                "{:.1}% of `queued` webhooks (runyard's webhook mode, garm; scale-set messages are not lost); {}",
                args.lost_webhooks * 100.0,
                if args.reconcile_period > 0.0 {
                    format!("a reconciler finds them every {} s", args.reconcile_period)
                } else {
                    "no reconciler".into()
                }
            ),
        ),
        p(
            "failed creates",
            format!("{:.1}% of creates", args.create_failures * 100.0),
        ),
        p(
            "pool",
            format!(
                "one pool, min_idle {}, max_runners {}, idle_timeout {} s, bootstrap_timeout {} s; ephemeral runners; the forge gives the oldest queued job to the longest-idle online runner (webhook pools, garm) or to a uniformly random idle runner of the set (scale sets: runyard scale-set, ARC)",
                args.min_idle,
                args.max_runners,
                args.idle_timeout,
                BOOTSTRAP_TIMEOUT.as_secs()
            ),
        ),
        p(
            "memory",
            format!(
                "flavors {} GiB; each job's limit (the allocator's answer, taken as right) log-normal, median {} GiB, σ {:.2}, within 0.25–64 GiB (its own stream); runyard: the smallest flavor covering the job's limit (the largest when none does), free runners the first; garm (one flavor per pool) and ARC (one pod template): the largest",
                args.flavors
                    .iter()
                    .map(|f| format!("{f}"))
                    .collect::<Vec<_>>()
                    .join(" / "),
                args.memory_median,
                args.memory_sigma
            ),
        ),
        p(
            "runyard",
            format!(
                "policy::decide on every event and every {} ms; idle_backoff {} s; busy_confirmation {} s (two idle readings); sync_interval {} s (when it learns a runner is online); create_attempts {}, back-off {}–{} s",
                TICK.as_millis(),
                args.idle_backoff,
                BUSY_CONFIRMATION.as_secs(),
                args.sync_interval,
                CREATE_ATTEMPTS,
                CREATE_BACKOFF.as_secs(),
                CREATE_BACKOFF_MAX.as_secs()
            ),
        ),
        p(
            "runyard scale-set",
            format!(
                "the same core and policy on a scale-set pool (`scale_set = true`, labels [pool, ...]); job events are the listener's (JobAssigned → queued, JobStarted → in_progress on the runner, JobCompleted → completed, each naming the pool's scale set), delivered by the long poll as soon as they exist in messages of ≤ {MESSAGE_JOBS} job events (no latency, as webhooks; acquiring takes no time; none lost); runners online from the same listing every {} s",
                args.sync_interval
            ),
        ),
        p(
            "garm",
            "5 s loop; a queued job gets a runner once 30 s old (minimum_job_age_backoff) whether or not a runner is idle; a lock older than 10 min is dropped; in_progress on another job's runner unlocks that job; min_idle top-up on in_progress; every 60 s ⌈½⌉ of the idle runners above min_idle + queued jobs are deleted; finished runners deleted by the next 5 s loop".into(),
        ),
        p(
            "ARC",
            format!(
                "desired = min(minRunners + totalAssignedJobs, maxRunners) on every message (its listener sees every assigned job; assigned includes running) and every {} s without one; the runner set reconciles on that and on every runner change: creates up to desired, or removes runners without a job above it (pending, then running, oldest first); finished runners deleted at once (scale-down is runners exiting after their job); every runner the largest flavor",
                args.arc_period
            ),
        ),
    ]
}

/// Whether `a` is within 10 % of `b`, or within `floor` of it (the
/// printed resolution: 0.1 s, 1 minute) when 10 % of `b` is less.
pub(crate) fn within_10pct(a: f64, b: f64, floor: f64) -> bool {
    (a - b).abs() <= (0.1 * b.abs()).max(floor)
}

/// The scale-set targets of one section: runyard's scale-set mode within
/// 10 % of its webhook mode, and fewer GiB-minutes than ARC.
fn scale_set_targets(s: &Section, ry: &Stats, ss: &Stats, arc: &Stats) -> Vec<Target> {
    let pairs = [
        ("queue wait p50 (s)", ss.wait.p50, ry.wait.p50, 0.1),
        ("queue wait p95 (s)", ss.wait.p95, ry.wait.p95, 0.1),
        ("runner-min", ss.paid, ry.paid, 1.0),
        ("GiB-min", ss.gib_min, ry.gib_min, 1.0),
        ("idle runner-min", ss.idle, ry.idle, 1.0),
    ];
    let close = pairs
        .iter()
        .all(|&(_, a, b, floor)| within_10pct(a, b, floor));
    let figures: Vec<String> = pairs
        .iter()
        .map(|(what, a, b, _)| format!("{what} {a:.1} vs {b:.1}"))
        .collect();
    vec![
        Target {
            pass: close,
            text: format!(
                "{} boots: runyard scale-set mode within 10% of webhook mode ({})",
                s.boot,
                figures.join(", ")
            ),
        },
        Target {
            pass: ss.gib_min < arc.gib_min && ry.gib_min < arc.gib_min,
            text: format!(
                "{} boots: runyard GiB-min below ARC's {:.0}: scale-set {:.0} ({:.0}%), webhook {:.0} ({:.0}%); runner-min {:.0} / {:.0} vs ARC's {:.0}",
                s.boot,
                arc.gib_min,
                ss.gib_min,
                100.0 * ss.gib_min / arc.gib_min.max(f64::MIN_POSITIVE),
                ry.gib_min,
                100.0 * ry.gib_min / arc.gib_min.max(f64::MIN_POSITIVE),
                ss.paid,
                ry.paid,
                arc.paid
            ),
        },
    ]
}

fn targets(sections: &[Section]) -> Vec<Target> {
    let mut out = Vec::new();
    let find = |s: &Section, p: &str| s.rows.iter().find(|r| r.policy == p).cloned();
    for s in sections {
        if let (Some(ry), Some(ss), Some(arc)) = (
            find(s, "runyard"),
            find(s, "runyard scale-set"),
            find(s, "ARC"),
        ) {
            out.extend(scale_set_targets(s, &ry, &ss, &arc));
        }
        let (Some(ry), Some(garm)) = (find(s, "runyard"), find(s, "garm")) else {
            continue;
        };
        out.push(Target {
            pass: ry.delay.p95 <= 1.0,
            text: format!(
                "{} boots: runyard scheduling delay p95 {:.1} s ≤ 1 s",
                s.boot, ry.delay.p95
            ),
        });
        out.push(Target {
            pass: ry.beyond_boot.p95 <= 1.0,
            text: format!(
                "{} boots: runyard wait beyond the n-th boot p95 {:.1} s ≤ 1 s (the scheduling delay without the forge's choice of runner)",
                s.boot, ry.beyond_boot.p95
            ),
        });
        if s.boot == "fast" {
            out.push(Target {
                pass: ry.wait.p95 <= 0.25 * garm.wait.p95,
                text: format!(
                    "fast boots: runyard queue wait p95 {:.1} s ≤ 25% of garm's {:.1} s ({:.1} s)",
                    ry.wait.p95,
                    garm.wait.p95,
                    0.25 * garm.wait.p95
                ),
            });
        }
        out.push(Target {
            pass: ry.paid <= garm.paid,
            text: format!(
                "{} boots: runyard runner-minutes {:.0} ≤ garm's {:.0}",
                s.boot, ry.paid, garm.paid
            ),
        });
        out.push(Target {
            pass: ry.idle <= 0.02 * ry.busy,
            text: format!(
                "{} boots: runyard idle runner-minutes {:.0} ≤ 2% of its busy ones ({:.0})",
                s.boot,
                ry.idle,
                0.02 * ry.busy
            ),
        });
    }
    out
}

/// Runs the simulation: every boot setting asked for, the four policies
/// each, over one generated workload.
pub fn run(args: &SimulateArgs) -> anyhow::Result<Report> {
    ensure!(args.hours > 0.0, "--hours must be positive");
    ensure!(
        args.burst_min <= args.burst_max,
        "--burst-min above --burst-max"
    );
    ensure!(
        (0.0..=1.0).contains(&args.burst_share),
        "--burst-share is a share (0–1)"
    );
    ensure!(
        (0.0..=1.0).contains(&args.lost_webhooks),
        "--lost-webhooks is a share (0–1)"
    );
    ensure!(
        (0.0..1.0).contains(&args.create_failures),
        "--create-failures is a share (0–1)"
    );
    ensure!(args.max_runners > 0, "--max-runners must be positive");
    ensure!(
        args.min_idle <= args.max_runners,
        "--min-idle above --max-runners"
    );
    ensure!(args.arc_period > 0.0, "--arc-period must be positive");
    ensure!(
        !args.flavors.is_empty() && args.flavors.iter().all(|f| *f > 0.0),
        "--flavors: at least one, each a positive size in GiB"
    );
    ensure!(
        args.flavors.windows(2).all(|w| w[0] < w[1]),
        "--flavors: smallest first"
    );
    ensure!(args.memory_median > 0.0, "--memory-median must be positive");
    ensure!(args.job_median > 0.0, "--job-median must be positive");
    let work = workload(args);
    let sections: Vec<Section> = args
        .boot
        .iter()
        .map(|b| run_setting(args, &work, *b))
        .collect();
    Ok(Report {
        params: params(args, &work),
        targets: targets(&sections),
        sections,
    })
}

/// The workload `args` ask for.
pub(crate) fn workload(args: &SimulateArgs) -> Vec<WorkJob> {
    generate(&WorkloadConfig {
        seed: args.seed,
        jobs: args.jobs,
        span: secs(args.hours * 3600.0),
        burst_share: args.burst_share,
        burst_min: args.burst_min,
        burst_max: args.burst_max,
        job_median: secs(args.job_median),
        job_sigma: args.job_sigma,
        lost_webhooks: args.lost_webhooks,
        memory_median: args.memory_median * GIB,
        memory_sigma: args.memory_sigma,
    })
}
