//! `runyard-scaler simulate`: a discrete-event simulation in virtual time
//! that runs the real scaling policy (`policy::decide` over a `World`) and
//! two baselines (garm's pool manager, ARC's runner scale sets) against the
//! same simulated forge and workload, and reports queue wait, scheduling
//! delay and runner-minutes for each, with fast (container) and slow (VM)
//! boots.
//!
//! The forge (`forge.rs`) queues jobs FIFO and hands the oldest to any idle
//! runner of the pool the moment one is online (so a runner made for one job
//! often takes another); runners are ephemeral. Webhooks reach the scaler
//! the instant they happen, except the lost `queued` ones; provider and
//! forge calls take no time, so a runner is paid from its create decision
//! to its delete decision, and its boot time is all of create → online.

mod baselines;
mod forge;
mod report;
mod runyard;
mod workload;

#[cfg(test)]
mod tests;

use std::time::Duration;

use anyhow::ensure;
use clap::{Args, ValueEnum};
use runyard_events::Forge as ForgeKind;

pub use report::{Percentiles, Report, Section, Stats, Target};

use self::baselines::{Arc, Garm, GarmTimers};
use self::forge::{Forge, Obs};
use self::runyard::{POOL, Runyard, Timers};
use self::workload::{Boot, START, WorkJob, WorkloadConfig, generate};
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
    /// ARC's reconcile period.
    #[arg(long, default_value_t = 1.0)]
    pub arc_period: f64,
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
            arc_period: 1.0,
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
    /// Something it hears about; `true` when it wakes the policy.
    fn observe(&mut self, forge: &mut Forge, now: Clock, obs: Obs) -> bool;
    /// Runs at every instant something was heard (`events`) and at its own
    /// wake-ups.
    fn act(&mut self, forge: &mut Forge, now: Clock, events: bool);
    /// Its next timer, strictly after the last `act`.
    fn next_wakeup(&self) -> Clock;
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

/// runyard, garm and ARC, configured from `args`.
pub(crate) fn scalers(args: &SimulateArgs) -> Vec<Box<dyn Scaler>> {
    let max = args.max_runners as usize;
    let min_idle = args.min_idle as usize;
    vec![
        Box::new(Runyard::new(
            pool_spec(args),
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
        )),
        Box::new(Garm::new(GarmTimers::default(), min_idle, max, START)),
        Box::new(Arc::new(secs(args.arc_period), min_idle, max, START)),
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
    );
    let end = drive(&mut forge, scaler, last + DRAIN);
    (forge, end)
}

/// Runs the three policies over one workload with one boot setting.
pub(crate) fn run_setting(args: &SimulateArgs, work: &[WorkJob], boot: BootSetting) -> Section {
    let rows = scalers(args)
        .iter_mut()
        .map(|scaler| {
            let (forge, end) = simulate_one(args, work, boot, scaler.as_mut());
            Stats::of(scaler.name(), &forge, end)
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
                "{:.1}% of `queued` webhooks (runyard, garm); {}",
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
                "one pool, min_idle {}, max_runners {}, idle_timeout {} s, bootstrap_timeout {} s; ephemeral runners; the forge gives the oldest queued job to the longest-idle online runner",
                args.min_idle,
                args.max_runners,
                args.idle_timeout,
                BOOTSTRAP_TIMEOUT.as_secs()
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
            "garm",
            "5 s loop; a queued job gets a runner once 30 s old (minimum_job_age_backoff) whether or not a runner is idle; a lock older than 10 min is dropped; in_progress on another job's runner unlocks that job; min_idle top-up on in_progress; every 60 s ⌈½⌉ of the idle runners above min_idle + queued jobs are deleted; finished runners deleted by the next 5 s loop".into(),
        ),
        p(
            "ARC",
            format!(
                "every {} s: desired = min_runners + queued + running jobs (its listener sees every job); surplus runners without a job removed, booting first; finished runners deleted at once",
                args.arc_period
            ),
        ),
    ]
}

fn targets(sections: &[Section]) -> Vec<Target> {
    let mut out = Vec::new();
    let find = |s: &Section, p: &str| s.rows.iter().find(|r| r.policy == p).cloned();
    for s in sections {
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

/// Runs the simulation: every boot setting asked for, the three policies
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
    })
}
