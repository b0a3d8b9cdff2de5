//! The workload: when jobs are queued, how long they run, how much memory
//! the allocator gives them, which `queued` webhooks are lost, and how long
//! a runner takes to boot.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::core::world::Clock;

/// Where virtual time starts (any instant works; this one is in 2023).
pub(crate) const START: Clock = Duration::from_secs(1_700_000_000);

/// What the generator is asked for.
#[derive(Debug, Clone)]
pub(crate) struct WorkloadConfig {
    /// Seed.
    pub seed: u64,
    /// Jobs in all.
    pub jobs: usize,
    /// Jobs are queued within this span from `START`.
    pub span: Duration,
    /// Share of the jobs that arrive in matrix bursts.
    pub burst_share: f64,
    /// Smallest burst.
    pub burst_min: usize,
    /// Largest burst.
    pub burst_max: usize,
    /// Median job duration.
    pub job_median: Duration,
    /// σ of the log of the job duration.
    pub job_sigma: f64,
    /// Share of `queued` webhooks the scaler never receives.
    pub lost_webhooks: f64,
    /// Median memory limit the allocator recommends for a job, bytes.
    pub memory_median: f64,
    /// σ of the log of that limit.
    pub memory_sigma: f64,
}

/// One job of the workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct WorkJob {
    /// When it is queued.
    pub queued_at: Clock,
    /// How long it runs once a runner takes it.
    pub duration: Duration,
    /// Its `queued` webhook is lost.
    pub lost: bool,
    /// The memory limit the allocator recommends for it, bytes (the
    /// allocator is not simulated: this is taken as its answer, and right).
    pub memory: u64,
}

/// Jobs longer than this are cut (GitHub's limit for a job on a
/// self-hosted runner is days; most CI systems cap far lower).
const MAX_JOB: Duration = Duration::from_secs(6 * 3600);

/// Memory limits are kept within these (bytes).
const MIN_MEMORY: f64 = 256.0 * 1024.0 * 1024.0;
const MAX_MEMORY: f64 = 64.0 * 1024.0 * 1024.0 * 1024.0;

/// Mixed into the seed of the memory limits' own stream, so adding them
/// changed no queue time, duration or lost webhook of a seed.
const MEMORY_STREAM: u64 = 0x6d65_6d6f_7279;

/// A standard normal deviate (Box–Muller; `rand_distr` is not needed for
/// one distribution).
pub(crate) fn std_normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// A log-normal deviate given its median and the σ of its log.
pub(crate) fn lognormal(rng: &mut impl Rng, median: f64, sigma: f64) -> f64 {
    median * (sigma * std_normal(rng)).exp()
}

/// Generates the workload, ordered by queue time: single jobs as a Poisson
/// process over the span (uniform times given their count), plus matrix
/// bursts of `burst_min..=burst_max` jobs queued at the same instant at
/// uniformly random times. Memory limits are log-normal, one per job in
/// queue order, from a stream of their own.
pub(crate) fn generate(config: &WorkloadConfig) -> Vec<WorkJob> {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let span = config.span.as_secs_f64();
    let mut times: Vec<f64> = Vec::with_capacity(config.jobs);
    let burst_jobs = ((config.jobs as f64) * config.burst_share.clamp(0.0, 1.0)).round() as usize;
    let (lo, hi) = (
        config.burst_min.max(1),
        config.burst_max.max(config.burst_min.max(1)),
    );
    while times.len() < burst_jobs {
        let size = rng.random_range(lo..=hi).min(burst_jobs - times.len());
        let at = rng.random::<f64>() * span;
        times.extend(std::iter::repeat_n(at, size));
    }
    while times.len() < config.jobs {
        times.push(rng.random::<f64>() * span);
    }
    times.sort_by(f64::total_cmp);
    let median = config.job_median.as_secs_f64();
    let mut memory_rng = StdRng::seed_from_u64(config.seed ^ MEMORY_STREAM);
    times
        .into_iter()
        .map(|t| {
            let duration = lognormal(&mut rng, median, config.job_sigma).max(1.0);
            let memory = lognormal(&mut memory_rng, config.memory_median, config.memory_sigma)
                .clamp(MIN_MEMORY, MAX_MEMORY);
            WorkJob {
                // Whole milliseconds: equal times stay equal, sums stay exact.
                queued_at: START + Duration::from_millis((t * 1000.0) as u64),
                duration: Duration::from_millis((duration * 1000.0) as u64).min(MAX_JOB),
                lost: config.lost_webhooks > 0.0 && rng.random::<f64>() < config.lost_webhooks,
                memory: memory as u64,
            }
        })
        .collect()
}

/// How long a runner takes from the create decision until it is online at
/// the forge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Boot {
    /// Always this long.
    Fixed(Duration),
    /// Uniform between two bounds (containers).
    Uniform {
        /// Shortest.
        lo: Duration,
        /// Longest.
        hi: Duration,
    },
    /// Log-normal (virtual machines).
    LogNormal {
        /// Median.
        median: Duration,
        /// σ of the log.
        sigma: f64,
    },
}

impl Boot {
    /// Containers: 1–4 s.
    pub(crate) const FAST: Self = Self::Uniform {
        lo: Duration::from_secs(1),
        hi: Duration::from_secs(4),
    };

    /// Virtual machines: median 40 s, p95 120 s (σ = ln 3 / 1.645).
    pub(crate) fn slow() -> Self {
        Self::LogNormal {
            median: Duration::from_secs(40),
            sigma: 3f64.ln() / 1.644_853_6,
        }
    }

    /// Draws one boot time (always one deviate's worth of the stream, so
    /// every policy sees the same sequence of boot times).
    pub(crate) fn sample(&self, rng: &mut impl Rng) -> Duration {
        let secs = match *self {
            Self::Fixed(d) => {
                let _ = rng.random::<f64>();
                d.as_secs_f64()
            }
            Self::Uniform { lo, hi } => {
                lo.as_secs_f64() + rng.random::<f64>() * (hi.as_secs_f64() - lo.as_secs_f64())
            }
            Self::LogNormal { median, sigma } => lognormal(rng, median.as_secs_f64(), sigma),
        };
        Duration::from_millis((secs.max(0.0) * 1000.0) as u64)
    }

    /// A short label for the report.
    pub(crate) fn label(&self) -> String {
        match *self {
            Self::Fixed(d) => format!("fixed {:.1} s", d.as_secs_f64()),
            Self::Uniform { lo, hi } => {
                format!("uniform {:.0}–{:.0} s", lo.as_secs_f64(), hi.as_secs_f64())
            }
            Self::LogNormal { median, sigma } => format!(
                "log-normal, median {:.0} s, p95 {:.0} s",
                median.as_secs_f64(),
                median.as_secs_f64() * (1.644_853_6 * sigma).exp()
            ),
        }
    }
}
