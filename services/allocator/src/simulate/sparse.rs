//! The `sparse` profile: a month of Spack CI as it looks where most packages
//! are built only a handful of times.
//!
//! - **Time**: 37 days — a week of warm-up (the simulation measures from day
//!   8 on for this profile) and a month measured.
//! - **Streams**: a package built with one variant set and one compiler;
//!   packages have 1–3 streams. Build rates are heavy-tailed (log-normal
//!   weights, σ `rate_sigma`): with the default 3000 streams and 30 000 jobs
//!   the median stream is built about 6 times a month, a few every day.
//! - **Sizes** are heavy-tailed: package medians log-normal around
//!   `size_median` (σ `size_sigma`), clamped to 50 MB–120 GB; variants scale
//!   them by σ 0.4, compilers by σ 0.1.
//! - **Noise**: each stream's peaks are log-normal around its median with σ
//!   drawn log-uniformly from `[sigma_min, sigma_max]` (a few % to ±45 %).
//! - **Growth**: a share `growth_share` of the streams grows steadily, by
//!   0.5 %–`growth_per_week` a week (no random walk for the others).
//! - **New versions**: a share `version_share` of the packages gets a new
//!   version in the middle third of the measured month; its size jumps by a
//!   log-normal factor (σ 0.05 for three in four, σ `version_jump`, 0.35,
//!   for the rest) and it is a new workload key.
//! - **Spikes**: a share `spike_rate` of jobs (1 in 200) needs 2–4× its usual
//!   peak.
//! - **New workloads**: a share `new_share` of the streams first appears
//!   during the month.
//! - **Refs**: a share `pr_share` runs on pull-request refs (asked for a
//!   recommendation, never trained on); the rest on `develop`.
//!
//! OOM-killed attempts report the limit as their peak (censored); the replay
//! does that for every profile.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::generate::{Build, normal, push_build, spack_workload};
use super::trace::{Trace, TraceBuilder};

/// Knobs of the sparse profile.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseConfig {
    /// Workload streams (package × variants × compiler).
    pub workloads: usize,
    /// Jobs in the trace.
    pub jobs: usize,
    /// RNG seed.
    pub seed: u64,
    /// Length of the trace in days.
    pub days: f64,
    /// Smallest per-stream log-space σ.
    pub sigma_min: f64,
    /// Largest per-stream log-space σ.
    pub sigma_max: f64,
    /// Median of package sizes, bytes.
    pub size_median: f64,
    /// Log-space σ of package sizes.
    pub size_sigma: f64,
    /// Log-space σ of the streams' build-rate weights.
    pub rate_sigma: f64,
    /// Share of streams that grow week over week.
    pub growth_share: f64,
    /// Fastest growth per week (log space), e.g. 0.04 = +4 % a week.
    pub growth_per_week: f64,
    /// Share of packages with a new version mid-trace.
    pub version_share: f64,
    /// Log-space σ of the size jump of one new version in four (the other
    /// three move by σ 0.05).
    pub version_jump: f64,
    /// Share of jobs that spike 2–4×.
    pub spike_rate: f64,
    /// Share of streams that first appear during the trace.
    pub new_share: f64,
    /// Share of jobs on pull-request refs.
    pub pr_share: f64,
    /// Share of streams that build in two configurations under one key: a
    /// third of their builds need [`BIMODAL_FACTOR`] times the memory.
    pub bimodal_share: f64,
    /// Share of builds that come with 1–3 more builds of the same spec
    /// within six hours (several pipelines building it the same day).
    pub same_day_share: f64,
    /// When above 0: the streams new during the trace all appear on this
    /// many days (a release that adds many packages at once), not spread
    /// over the month.
    pub new_package_days: u32,
    /// When above 0: how closely a stream's noise follows its build rate
    /// (rank correlation, up to 1): rarely built streams are the calm ones,
    /// so a spread learned mostly from busy streams is too wide for them.
    pub rare_calm: f64,
}

/// How much more memory the second configuration of a bimodal stream needs.
pub const BIMODAL_FACTOR: f64 = 1.8;

impl Default for SparseConfig {
    fn default() -> Self {
        Self {
            workloads: 3000,
            jobs: 30_000,
            seed: 1,
            days: 37.0,
            sigma_min: 0.03,
            sigma_max: 0.45,
            size_median: 1e9,
            size_sigma: 1.4,
            rate_sigma: 0.8,
            growth_share: 0.3,
            growth_per_week: 0.04,
            version_share: 0.3,
            version_jump: 0.35,
            spike_rate: 0.005,
            new_share: 0.1,
            pr_share: 0.25,
            bimodal_share: 0.0,
            same_day_share: 0.0,
            new_package_days: 0,
            rare_calm: 0.0,
        }
    }
}

impl SparseConfig {
    /// The knobs as one line for the report.
    pub fn describe(&self) -> String {
        format!(
            "sparse profile (seed {}, {} streams, {} jobs, {} days; sizes median {:.1} GB, σ {} clamped 50 MB–120 GB; noise σ {}–{} log-uniform; build rates log-normal σ {}; {:.0}% of streams grow up to {:.1}%/week; {:.0}% of packages get a new version mid-month (size jump σ 0.05, σ {} for one in four); {:.1}% of jobs spike 2–4×; {:.0}% of streams new during the month; {:.0}% on pull requests)",
            self.seed,
            self.workloads,
            self.jobs,
            self.days,
            self.size_median / 1e9,
            self.size_sigma,
            self.sigma_min,
            self.sigma_max,
            self.rate_sigma,
            self.growth_share * 100.0,
            self.growth_per_week * 100.0,
            self.version_share * 100.0,
            self.version_jump,
            self.spike_rate * 100.0,
            self.new_share * 100.0,
            self.pr_share * 100.0,
        ) + &self.adversarial()
    }

    /// The structures built to disagree with the model, when on.
    fn adversarial(&self) -> String {
        let mut parts = Vec::new();
        if self.bimodal_share > 0.0 {
            parts.push(format!(
                "{:.0}% of streams bimodal (a third of builds ×{BIMODAL_FACTOR})",
                self.bimodal_share * 100.0
            ));
        }
        if self.same_day_share > 0.0 {
            parts.push(format!(
                "{:.0}% of builds with 1–3 more of the same spec within 6 h",
                self.same_day_share * 100.0
            ));
        }
        if self.new_package_days > 0 {
            parts.push(format!(
                "new streams arrive on {} days",
                self.new_package_days
            ));
        }
        if self.rare_calm > 0.0 {
            parts.push(format!(
                "noise ranked with build rate (ρ {:.2}): rare streams calm",
                self.rare_calm.min(1.0)
            ));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("; {}", parts.join("; "))
        }
    }
}

/// 2025-01-01T00:00:00Z.
pub(super) const START: f64 = 1_735_689_600.0;
const DAY: f64 = 86_400.0;
const MIN_PEAK: f64 = 50e6;
const MAX_PEAK: f64 = 120e9;
const VARIANT_SETS: [&str; 8] = [
    "+shared",
    "~shared+pic",
    "+mpi~openmp",
    "+openmp+mpi build_type=Release",
    "+cuda cuda_arch=80",
    "+python~examples",
    "~mpi+fortran",
    "+hdf5+netcdf",
];
const COMPILERS: [(&str, &str); 3] = [
    ("gcc", "13.2.0"),
    ("oneapi", "2024.1.0"),
    ("clang", "17.0.6"),
];

struct Package {
    name: String,
    ln_median: f64,
    /// (from time, log factor, version), oldest first.
    versions: Vec<(f64, f64, String)>,
}

struct Stream {
    package: usize,
    variants: &'static str,
    compiler: usize,
    ln_factor: f64,
    sigma: f64,
    /// Log growth per day.
    growth: f64,
    cores: f64,
    ln_wall: f64,
    start: f64,
    /// Builds in two configurations (see [`SparseConfig::bimodal_share`]).
    bimodal: bool,
}

/// Generates a sparse trace.
pub fn generate_sparse(config: &SparseConfig) -> Trace {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let finite = |x: f64, d: f64| if x.is_finite() { x } else { d };
    let days = finite(config.days, 30.0).max(1.0);
    let horizon = days * DAY;
    let (lo, hi) = {
        let (a, b) = (
            finite(config.sigma_min, 0.03).max(0.001),
            finite(config.sigma_max, 0.45).max(0.001),
        );
        (a.min(b), a.max(b))
    };
    let share = |x: f64| finite(x, 0.0).clamp(0.0, 1.0);

    // Days new streams arrive on, when they come in waves (drawn only
    // then, so the default trace stays as it was).
    let arrival_days: Vec<f64> = (0..config.new_package_days)
        .map(|_| (0.8 * days * rng.random::<f64>()).floor())
        .collect();
    let mut packages: Vec<Package> = Vec::new();
    let mut streams: Vec<Stream> = Vec::new();
    while streams.len() < config.workloads.max(1) {
        let id = packages.len();
        let ln_median = (config.size_median.max(1.0).ln()
            + finite(config.size_sigma, 1.4) * normal(&mut rng))
        .clamp(MIN_PEAK.ln(), MAX_PEAK.ln());
        let (major, minor) = (1 + id % 5, rng.random_range(0..30u32));
        let mut versions = vec![(f64::NEG_INFINITY, 0.0, format!("{major}.{minor}.0"))];
        if rng.random_bool(share(config.version_share)) {
            // Mid-month: the middle third of the month after the first week.
            let week = (7.0 * DAY).min(horizon / 2.0);
            let at = START + week + (horizon - week) * (1.0 + rng.random::<f64>()) / 3.0;
            let jump = if rng.random_bool(0.75) {
                0.05
            } else {
                finite(config.version_jump, 0.35)
            } * normal(&mut rng);
            versions.push((at, jump, format!("{major}.{}.0", minor + 1)));
        }
        packages.push(Package {
            name: format!("pkg-{id:04}"),
            ln_median,
            versions,
        });
        let n_streams = match rng.random::<f64>() {
            x if x < 0.55 => 1,
            x if x < 0.85 => 2,
            _ => 3,
        };
        let first_variant = rng.random_range(0..VARIANT_SETS.len());
        for k in 0..n_streams {
            if streams.len() >= config.workloads.max(1) {
                break;
            }
            let grows = rng.random_bool(share(config.growth_share));
            let per_week = 0.005
                + (finite(config.growth_per_week, 0.04) - 0.005).max(0.0) * rng.random::<f64>();
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
                sigma: (lo.ln() + (hi / lo).ln() * rng.random::<f64>()).exp(),
                growth: if grows { per_week / 7.0 } else { 0.0 },
                cores: (0.5f64.ln() + (12.0f64 / 0.5).ln() * rng.random::<f64>()).exp(),
                ln_wall: (900.0f64.ln() + normal(&mut rng)).clamp(30f64.ln(), 14_400f64.ln()),
                start: if rng.random_bool(share(config.new_share)) {
                    if arrival_days.is_empty() {
                        START + 0.8 * horizon * rng.random::<f64>()
                    } else {
                        let day = arrival_days[rng.random_range(0..arrival_days.len())];
                        START + (day + 0.5 * rng.random::<f64>()) * DAY
                    }
                } else {
                    START
                },
                bimodal: config.bimodal_share > 0.0 && rng.random_bool(share(config.bimodal_share)),
            });
        }
    }

    let mut cumulative = Vec::with_capacity(streams.len());
    let mut total = 0.0;
    let mut rate_z = Vec::with_capacity(streams.len());
    for _ in &streams {
        let z = normal(&mut rng);
        rate_z.push(z);
        total += (finite(config.rate_sigma, 1.2) * z).exp();
        cumulative.push(total);
    }
    if config.rare_calm > 0.0 {
        // The same noise levels, dealt out by a score that follows the
        // build rate: drawn from a side generator, so the rest of the
        // trace is the one the seed gives without it.
        let rho = config.rare_calm.min(1.0);
        let mut side = StdRng::seed_from_u64(config.seed ^ 0x5157_a11e);
        let mut order: Vec<(f64, usize)> = rate_z
            .iter()
            .enumerate()
            .map(|(i, z)| (rho * z + (1.0 - rho * rho).sqrt() * normal(&mut side), i))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut sigmas: Vec<f64> = streams.iter().map(|s| s.sigma).collect();
        sigmas.sort_by(f64::total_cmp);
        for ((_, i), sigma) in order.into_iter().zip(sigmas) {
            streams[i].sigma = sigma;
        }
    }

    let mut builder = TraceBuilder::default();
    let develop = builder.git_ref("develop");
    let mut ids: HashMap<(usize, usize), u32> = HashMap::new();
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
        let (_, jump, version_name) = &package.versions[version];
        let mean_ln =
            package.ln_median + stream.ln_factor + jump + stream.growth * (at - START) / DAY;
        let mut ln = mean_ln + stream.sigma * normal(&mut rng);
        if rng.random_bool(share(config.spike_rate)) {
            ln += 2f64.ln() + 2f64.ln() * rng.random::<f64>();
        }
        let workload = *ids.entry((s, version)).or_insert_with(|| {
            builder.workload(spack_workload(
                &package.name,
                version_name,
                stream.variants,
                COMPILERS[stream.compiler],
            ))
        });
        // The same spec built again the same day, by other pipelines.
        let again = if config.same_day_share > 0.0 && rng.random_bool(share(config.same_day_share))
        {
            rng.random_range(1..=3)
        } else {
            0
        };
        for k in 0..=again {
            let (at, mut ln) = if k == 0 {
                (at, ln)
            } else {
                let ln = mean_ln + stream.sigma * normal(&mut rng);
                (
                    (at + rng.random::<f64>() * 6.0 * 3600.0).min(START + horizon),
                    ln,
                )
            };
            if stream.bimodal && rng.random_bool(1.0 / 3.0) {
                ln += BIMODAL_FACTOR.ln();
            }
            let peak = ln.exp().clamp(MIN_PEAK, MAX_PEAK);
            let wall = (stream.ln_wall + 0.25 * normal(&mut rng)).exp();
            let cores = (stream.cores * (0.15 * normal(&mut rng)).exp()).clamp(0.05, 64.0);
            push_build(
                &mut builder,
                &mut rng,
                (share(config.pr_share), develop),
                workload,
                Build {
                    at,
                    peak,
                    cores,
                    wall,
                },
            );
        }
    }
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each workload key's `ln(peak)`s.
    fn ln_peaks_by_key(t: &Trace) -> HashMap<u32, Vec<f64>> {
        let mut by_key: HashMap<u32, Vec<f64>> = HashMap::new();
        for j in &t.jobs {
            by_key
                .entry(j.workload)
                .or_default()
                .push((j.peak_memory_bytes as f64).ln());
        }
        by_key
    }

    #[test]
    fn sparse_trace_is_sparse_heavy_tailed_and_reproducible() {
        let config = SparseConfig::default();
        let trace = generate_sparse(&config);
        assert_eq!(trace.jobs.len(), 30_000);
        assert!(trace.jobs.windows(2).all(|w| w[0].at <= w[1].at));
        // Most workload keys are built only a handful of times.
        let mut per_key = vec![0u32; trace.workloads.len()];
        for j in &trace.jobs {
            per_key[j.workload as usize] += 1;
        }
        per_key.sort_unstable();
        let median = per_key[per_key.len() / 2];
        assert!((2..=8).contains(&median), "median builds per key {median}");
        let peaks: Vec<u64> = trace.jobs.iter().map(|j| j.peak_memory_bytes).collect();
        assert!(
            peaks
                .iter()
                .all(|&p| (50e6 as u64..=120e9 as u64).contains(&p))
        );
        assert!(peaks.iter().any(|&p| p < 200_000_000));
        assert!(peaks.iter().any(|&p| p > 50_000_000_000));
        // New versions make more keys than streams.
        assert!(trace.workloads.len() > 3000, "{}", trace.workloads.len());
        let again = generate_sparse(&config);
        assert_eq!(again.jobs, trace.jobs);
    }

    #[test]
    fn the_adversarial_structures_are_what_they_say() {
        let base = SparseConfig {
            workloads: 400,
            jobs: 6000,
            ..SparseConfig::default()
        };
        let plain = generate_sparse(&base);
        // Several pipelines the same day: more builds, in bursts of one spec.
        let bursts = generate_sparse(&SparseConfig {
            same_day_share: 0.5,
            ..base.clone()
        });
        assert!(
            bursts.jobs.len() > plain.jobs.len() * 3 / 2,
            "{}",
            bursts.jobs.len()
        );
        let close = |t: &Trace| {
            t.jobs
                .windows(2)
                .filter(|w| w[0].workload == w[1].workload && w[1].at - w[0].at < 6.0 * 3600.0)
                .count()
        };
        assert!(close(&bursts) > 3 * close(&plain).max(1));
        // Waves of new packages: far more keys are first built on the
        // busiest day than when new streams spread over the month.
        let busiest = |config: &SparseConfig| {
            let t = generate_sparse(config);
            let mut first: HashMap<u32, f64> = HashMap::new();
            for j in &t.jobs {
                first.entry(j.workload).or_insert(j.at);
            }
            let mut per_day: HashMap<i64, u32> = HashMap::new();
            for at in first.values().filter(|&&at| at > START + 3.0 * DAY) {
                *per_day.entry(((at - START) / DAY) as i64).or_default() += 1;
            }
            per_day.values().copied().max().unwrap_or(0)
        };
        let spread = SparseConfig {
            new_share: 0.3,
            ..base.clone()
        };
        let waves = SparseConfig {
            new_package_days: 2,
            ..spread.clone()
        };
        let (w, p) = (busiest(&waves), busiest(&spread));
        assert!(2 * w > 3 * p, "busiest day {w} in waves, {p} spread");
        // Bimodal streams: peaks of one key come in two clusters ×1.8 apart.
        let bimodal = generate_sparse(&SparseConfig {
            bimodal_share: 1.0,
            sigma_min: 0.02,
            sigma_max: 0.03,
            ..base.clone()
        });
        let by_key = ln_peaks_by_key(&bimodal);
        let (key, peaks) = by_key.iter().max_by_key(|(_, p)| p.len()).expect("a key");
        let lo = peaks.iter().copied().fold(f64::INFINITY, f64::min);
        let high = peaks.iter().filter(|&&p| p > lo + 0.4).count();
        assert!(
            high * 8 > peaks.len() && high * 2 < peaks.len(),
            "key {key}: {high} of {} high",
            peaks.len()
        );
        // Rare streams calm: the keys built most often spread further than
        // the ones built least, which they do not when noise is dealt
        // without regard to the rate.
        let spread_by_rate = |t: &Trace| {
            let mut keys: Vec<(usize, f64)> = ln_peaks_by_key(t)
                .values()
                .filter(|p| p.len() >= 4)
                .map(|p| {
                    let mean = p.iter().sum::<f64>() / p.len() as f64;
                    let var =
                        p.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (p.len() - 1) as f64;
                    (p.len(), var.sqrt())
                })
                .collect();
            keys.sort_by_key(|k| k.0);
            let third = keys.len() / 3;
            let median = |ks: &[(usize, f64)]| {
                let mut sds: Vec<f64> = ks.iter().map(|k| k.1).collect();
                sds.sort_by(f64::total_cmp);
                sds[sds.len() / 2]
            };
            median(&keys[keys.len() - third..]) / median(&keys[..third])
        };
        let calm = generate_sparse(&SparseConfig {
            rare_calm: 1.0,
            spike_rate: 0.0,
            growth_share: 0.0,
            version_share: 0.0,
            ..base.clone()
        });
        let unranked = generate_sparse(&SparseConfig {
            spike_rate: 0.0,
            growth_share: 0.0,
            version_share: 0.0,
            ..base.clone()
        });
        let (c, u) = (spread_by_rate(&calm), spread_by_rate(&unranked));
        assert!(
            c > 2.5 && u < 1.6,
            "busiest / rarest spread {c:.2}, unranked {u:.2}"
        );
        assert_eq!(calm.jobs.len(), unranked.jobs.len());
        assert_eq!(
            generate_sparse(&base).jobs,
            plain.jobs,
            "the default is unchanged"
        );
    }
}
