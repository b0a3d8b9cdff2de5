//! A synthetic Spack CI trace with the structure that makes right-sizing hard.
//!
//! - **Streams**: a workload stream is a package built with one variant set
//!   and one compiler; packages have 1–4 streams. Streams are built at
//!   heavy-tailed rates (log-normal weights), so a few are built every
//!   pipeline and many only now and then.
//! - **Sizes** are heavy-tailed: package medians are log-normal around
//!   1.2 GB (σ 1.1, clamped to 200 MB–40 GB); variants scale them (±40 %,
//!   σ 0.4 in log space), compilers a little (σ 0.1).
//! - **Variation**: each stream's peaks are log-normal around its median
//!   with σ drawn from `[sigma_min, sigma_max]`, log-uniformly by default
//!   (most builds are reproducible, some swing: a quarter of the streams
//!   have σ > 0.2, i.e. swing 2–4× between builds) or uniformly.
//! - **Drift**: every stream's median follows a slow random walk
//!   (`drift_per_day` in log space per day).
//! - **Version bumps**: each package gets new versions as a Poisson process
//!   (mean `version_every_days`); a bump scales its size by a log-normal
//!   factor — σ 0.05 for three bumps in four, σ 0.35 for the rest — and
//!   starts a new workload key.
//! - **Compiler upgrade**: gcc 12.3.0 → 13.2.0 halfway through, shifting
//!   sizes a little (σ 0.05).
//! - **Spikes**: a share `spike_rate` of jobs needs 1.3–2.5× more than usual
//!   (a pathological input, a flaky test leaking memory).
//! - **New workloads**: a share `new_share` of streams first appears during
//!   the trace (new packages and variants join the stack).
//! - **Refs**: a share `pr_share` runs on pull-request refs, which don't
//!   train; the rest on `develop`.
//! - **CPU**: each stream averages 0.5–12 busy cores; wall times are
//!   log-normal around 15 min.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

use super::trace::{Job, Trace, TraceBuilder};
use crate::model::Workload;

/// Knobs of the generator.
#[derive(Debug, Clone, PartialEq)]
pub struct GenConfig {
    /// Workload streams (package × variants × compiler).
    pub workloads: usize,
    /// Jobs in the trace.
    pub jobs: usize,
    /// RNG seed.
    pub seed: u64,
    /// Smallest per-stream log-space σ.
    pub sigma_min: f64,
    /// Largest per-stream log-space σ.
    pub sigma_max: f64,
    /// Draw σ log-uniformly (most workloads calm, some swinging) rather than
    /// uniformly between `sigma_min` and `sigma_max`.
    pub sigma_log_uniform: bool,
    /// Length of the trace in days.
    pub days: f64,
    /// Share of jobs on pull-request refs.
    pub pr_share: f64,
    /// Share of jobs with a memory spike.
    pub spike_rate: f64,
    /// Mean days between version bumps of a package.
    pub version_every_days: f64,
    /// Log-space random-walk step of a stream's median per day.
    pub drift_per_day: f64,
    /// Share of streams that first appear during the trace (new packages or
    /// variants added to the stack).
    pub new_share: f64,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            workloads: 3000,
            jobs: 200_000,
            seed: 1,
            sigma_min: 0.03,
            sigma_max: 0.45,
            sigma_log_uniform: true,
            days: 42.0,
            pr_share: 0.3,
            spike_rate: 0.005,
            version_every_days: 14.0,
            drift_per_day: 0.015,
            new_share: 0.25,
        }
    }
}

/// 2025-01-01T00:00:00Z.
const START: f64 = 1_735_689_600.0;
const DAY: f64 = 86_400.0;
const MIN_PEAK: f64 = 10e6;
/// Below the default 64 GiB ceiling: a job larger than every node never runs.
const MAX_PEAK: f64 = 60e9;
const ARCH: &str = "linux-ubuntu22.04-x86_64_v3";
const VARIANT_SETS: [&str; 10] = [
    "+shared",
    "~shared+pic",
    "+mpi~openmp",
    "+openmp+mpi build_type=Release",
    "+cuda cuda_arch=80",
    "+rocm amdgpu_target=gfx90a",
    "+python~examples",
    "~mpi+fortran",
    "build_type=Debug +shared",
    "+hdf5+netcdf",
];
/// (name, version before the upgrade, version after).
const COMPILERS: [(&str, &str, &str); 3] = [
    ("gcc", "12.3.0", "13.2.0"),
    ("oneapi", "2024.1.0", "2024.1.0"),
    ("clang", "17.0.6", "17.0.6"),
];

struct Package {
    name: String,
    ln_median: f64,
    /// (from time, cumulative log factor, version string), oldest first.
    versions: Vec<(f64, f64, String)>,
}

struct Stream {
    package: usize,
    variants: &'static str,
    compiler: usize,
    ln_factor: f64,
    upgrade_shift: f64,
    sigma: f64,
    cores: f64,
    ln_wall: f64,
    /// Log-space drift at the start of each day.
    drift: Vec<f64>,
    /// When the stream first runs.
    start: f64,
}

pub(super) fn normal(rng: &mut StdRng) -> f64 {
    rng.sample(StandardNormal)
}

fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    -mean * (1.0 - rng.random::<f64>()).ln()
}

/// Generates a trace.
pub fn generate(config: &GenConfig) -> Trace {
    // Non-finite knobs (a NaN typed on the command line) fall back to the
    // defaults rather than poisoning every peak.
    let defaults = GenConfig::default();
    let finite = |x: f64, default: f64| if x.is_finite() { x } else { default };
    let config = &GenConfig {
        sigma_min: finite(config.sigma_min, defaults.sigma_min),
        sigma_max: finite(config.sigma_max, defaults.sigma_max),
        days: finite(config.days, defaults.days),
        pr_share: finite(config.pr_share, defaults.pr_share).clamp(0.0, 1.0),
        spike_rate: finite(config.spike_rate, defaults.spike_rate).clamp(0.0, 1.0),
        version_every_days: finite(config.version_every_days, defaults.version_every_days),
        drift_per_day: finite(config.drift_per_day, defaults.drift_per_day),
        new_share: finite(config.new_share, defaults.new_share).clamp(0.0, 1.0),
        ..config.clone()
    };
    let mut rng = StdRng::seed_from_u64(config.seed);
    let horizon = config.days.max(1.0) * DAY;
    let upgrade_at = START + horizon * 0.55;
    let (sigma_lo, sigma_hi) = if config.sigma_min <= config.sigma_max {
        (config.sigma_min.max(0.0), config.sigma_max.max(0.0))
    } else {
        (config.sigma_max.max(0.0), config.sigma_min.max(0.0))
    };

    // Packages and their version histories, then streams until `workloads`.
    let mut packages: Vec<Package> = Vec::new();
    let mut streams: Vec<Stream> = Vec::new();
    let days = config.days.max(1.0).ceil() as usize + 1;
    while streams.len() < config.workloads.max(1) {
        let id = packages.len();
        let ln_median = (1.2e9f64.ln() + 1.1 * normal(&mut rng)).clamp(200e6f64.ln(), 40e9f64.ln());
        let (mut minor, mut patch) = (rng.random_range(0..20u32), rng.random_range(0..10u32));
        let mut versions = vec![(
            f64::NEG_INFINITY,
            0.0,
            format!("{}.{minor}.{patch}", 1 + id % 4),
        )];
        let mut t = START;
        let mut ln = 0.0;
        if config.version_every_days > 0.0 {
            loop {
                t += exponential(&mut rng, config.version_every_days * DAY);
                if t >= START + horizon {
                    break;
                }
                if rng.random_bool(0.8) {
                    patch += 1;
                } else {
                    minor += 1;
                    patch = 0;
                }
                // Most releases barely change a build; some change it a lot.
                ln += if rng.random_bool(0.75) { 0.05 } else { 0.35 } * normal(&mut rng);
                versions.push((t, ln, format!("{}.{minor}.{patch}", 1 + id % 4)));
            }
        }
        packages.push(Package {
            name: format!("pkg-{id:04}"),
            ln_median,
            versions,
        });
        let n_streams = match rng.random::<f64>() {
            x if x < 0.45 => 1,
            x if x < 0.75 => 2,
            x if x < 0.9 => 3,
            _ => 4,
        };
        let first_variant = rng.random_range(0..VARIANT_SETS.len());
        for k in 0..n_streams {
            if streams.len() >= config.workloads.max(1) {
                break;
            }
            let mut drift = Vec::with_capacity(days);
            let mut d = 0.0;
            for _ in 0..days {
                drift.push(d);
                d += config.drift_per_day * normal(&mut rng);
            }
            streams.push(Stream {
                package: id,
                variants: VARIANT_SETS[(first_variant + k * 3) % VARIANT_SETS.len()],
                compiler: match rng.random::<f64>() {
                    x if x < 0.6 => 0,
                    x if x < 0.85 => 1,
                    _ => 2,
                },
                ln_factor: if k == 0 { 0.0 } else { 0.4 * normal(&mut rng) }
                    + 0.1 * normal(&mut rng),
                upgrade_shift: 0.05 * normal(&mut rng),
                sigma: if config.sigma_log_uniform && sigma_lo > 0.0 {
                    (sigma_lo.ln() + (sigma_hi / sigma_lo).ln() * rng.random::<f64>()).exp()
                } else {
                    sigma_lo + (sigma_hi - sigma_lo) * rng.random::<f64>()
                },
                cores: (0.5f64.ln() + (12.0f64 / 0.5).ln() * rng.random::<f64>()).exp(),
                ln_wall: (900.0f64.ln() + normal(&mut rng)).clamp(30f64.ln(), 14_400f64.ln()),
                drift,
                start: if rng.random_bool(config.new_share) {
                    START + 0.8 * horizon * rng.random::<f64>()
                } else {
                    START
                },
            });
        }
    }

    // Heavy-tailed build rates.
    let mut cumulative = Vec::with_capacity(streams.len());
    let mut total = 0.0;
    for _ in &streams {
        total += (1.2 * normal(&mut rng)).exp();
        cumulative.push(total);
    }

    let mut builder = TraceBuilder::default();
    let develop = builder.git_ref("develop");
    // (stream, version index, upgraded) → workload id.
    let mut ids: HashMap<(usize, usize, bool), u32> = HashMap::new();
    for _ in 0..config.jobs {
        let pick = rng.random::<f64>() * total;
        let s = cumulative
            .partition_point(|&c| c < pick)
            .min(streams.len() - 1);
        let stream = &streams[s];
        let package = &packages[stream.package];
        let at = stream.start + rng.random::<f64>() * (START + horizon - stream.start);
        let version = package
            .versions
            .partition_point(|v| v.0 <= at)
            .saturating_sub(1);
        let (_, ln_version, version_name) = &package.versions[version];
        let upgraded = stream.compiler == 0 && at >= upgrade_at;
        let day = (at - START) / DAY;
        let i = (day.floor() as usize).min(stream.drift.len() - 1);
        let j = (i + 1).min(stream.drift.len() - 1);
        let frac = day - day.floor();
        let drift = stream.drift[i] * (1.0 - frac) + stream.drift[j] * frac;

        let mut ln = package.ln_median + stream.ln_factor + ln_version + drift;
        if upgraded {
            ln += stream.upgrade_shift;
        }
        ln += stream.sigma * normal(&mut rng);
        if rng.random_bool(config.spike_rate) {
            ln += 1.3f64.ln() + (2.5f64 / 1.3).ln() * rng.random::<f64>();
        }
        let peak = ln.exp().clamp(MIN_PEAK, MAX_PEAK);

        let wall = (stream.ln_wall + 0.25 * normal(&mut rng)).exp();
        let cores = (stream.cores * (0.15 * normal(&mut rng)).exp()).clamp(0.05, 64.0);

        let workload = *ids.entry((s, version, upgraded)).or_insert_with(|| {
            let (compiler, before, after) = COMPILERS[stream.compiler];
            let compiler_version = if upgraded { after } else { before };
            builder.workload(spack_workload(
                &package.name,
                version_name,
                stream.variants,
                (compiler, compiler_version),
            ))
        });
        push_build(
            &mut builder,
            &mut rng,
            (config.pr_share, develop),
            workload,
            Build {
                at,
                peak,
                cores,
                wall,
            },
        );
    }
    builder.finish()
}

/// A Spack build's attributes, as the allocator keys them.
pub(super) fn spack_workload(
    package: &str,
    version: &str,
    variants: &str,
    (compiler, compiler_version): (&str, &str),
) -> Workload {
    [
        ("package", package),
        ("version", version),
        ("variants", variants),
        ("compiler", compiler),
        ("compiler_version", compiler_version),
        ("arch", ARCH),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// One generated build's measurements.
#[derive(Clone, Copy)]
pub(super) struct Build {
    pub(super) at: f64,
    pub(super) peak: f64,
    pub(super) cores: f64,
    pub(super) wall: f64,
}

/// Adds `build` of `workload` to the trace: from a pull request with
/// probability `pr_share` (such a build trains nothing), else on `develop`;
/// times rounded to seconds.
pub(super) fn push_build(
    builder: &mut TraceBuilder,
    rng: &mut StdRng,
    (pr_share, develop): (f64, u32),
    workload: u32,
    build: Build,
) {
    let git_ref = if rng.random_bool(pr_share) {
        builder.git_ref(&format!("pr-{}", rng.random_range(10_000..12_000u32)))
    } else {
        develop
    };
    builder.push(Job {
        at: build.at.round(),
        workload,
        git_ref,
        peak_memory_bytes: build.peak as u64,
        cpu_seconds: (build.cores * build.wall).round(),
        wall_seconds: build.wall.round(),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_trace_has_the_promised_structure() {
        let config = GenConfig {
            workloads: 200,
            jobs: 5000,
            ..GenConfig::default()
        };
        let trace = generate(&config);
        assert_eq!(trace.jobs.len(), 5000);
        assert!(trace.jobs.windows(2).all(|w| w[0].at <= w[1].at));
        // Version bumps and the compiler upgrade make more workload keys than
        // streams.
        assert!(trace.workloads.len() > 200, "{}", trace.workloads.len());
        let prs = trace
            .jobs
            .iter()
            .filter(|j| trace.refs[j.git_ref as usize] != "develop")
            .count();
        assert!((1000..2000).contains(&prs), "{prs}");
        assert!(
            trace
                .jobs
                .iter()
                .all(|j| (10e6 as u64..=60e9 as u64).contains(&j.peak_memory_bytes))
        );
        // Same seed, same trace.
        let again = generate(&config);
        assert_eq!(again.jobs, trace.jobs);
    }
}
