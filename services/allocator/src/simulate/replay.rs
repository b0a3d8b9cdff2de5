//! Online replays of a trace (the runyard model, gantry's rule) and the
//! hindsight frontier, with the quality metrics they are compared on.

use std::collections::HashMap;

use runyard_store::workload;

use super::trace::Trace;
use crate::model::{GANTRY_LEVELS, MB, Model, Observation, Params, Workload, sub_key};

/// Retries a job gets after an OOM kill (gantry and runyard alike).
pub const MAX_RETRIES: u32 = 3;

/// Quality of one method over the measured (post-warm-up) jobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    /// Method name for the table.
    pub name: String,
    /// Whether the method retries (the frontier does not).
    pub retries_apply: bool,
    /// Measured jobs.
    pub jobs: u64,
    /// Jobs whose first attempt was OOM-killed (peak > limit).
    pub first_ooms: u64,
    /// Retry attempts spent.
    pub retries: u64,
    /// Jobs that got a first retry.
    pub first_retries: u64,
    /// ... of which the first retry succeeded.
    pub first_retry_ok: u64,
    /// Jobs that never succeeded (retries exhausted).
    pub failed: u64,
    /// Σ (limit − peak) / limit over first attempts that succeeded.
    pub limit_slack: f64,
    /// Σ (request − peak) / request over first attempts that succeeded.
    pub request_slack: f64,
    /// First attempts that succeeded.
    pub successes: u64,
    /// Σ (limit − peak) / limit over all successful attempts (retries too).
    pub limit_slack_all: f64,
    /// Successful attempts, retries included.
    pub successes_all: u64,
    /// Σ first-attempt limit, bytes.
    pub limit_bytes: f64,
    /// Σ limit and Σ peak over first attempts that succeeded (byte-weighted
    /// slack).
    pub ok_limit_bytes: f64,
    /// See `ok_limit_bytes`.
    pub ok_peak_bytes: f64,
    /// The model only: the same per ladder level used (index level + 1;
    /// 0 = defaults), first attempts only.
    pub by_level: Vec<LevelOutcome>,
    /// The model only: the same by samples behind the recommendation
    /// (0, 1–4, 5–9, 10–19, 20+).
    pub by_samples: Vec<LevelOutcome>,
}

/// The `by_samples` bucket of a sample count.
pub fn samples_bucket(samples: u32) -> usize {
    match samples {
        0 => 0,
        1..=4 => 1,
        5..=9 => 2,
        10..=19 => 3,
        _ => 4,
    }
}

/// First-attempt quality of the jobs whose recommendation came from one
/// ladder level.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LevelOutcome {
    /// Jobs.
    pub jobs: u64,
    /// ... whose first attempt was killed.
    pub ooms: u64,
    /// Σ (limit − peak) / limit over the others.
    pub slack: f64,
}

impl Outcome {
    fn new(name: impl Into<String>, retries_apply: bool) -> Self {
        Self {
            name: name.into(),
            retries_apply,
            ..Self::default()
        }
    }

    fn success(&mut self, attempt: u32, limit: u64, request: u64, peak: u64) {
        let (limit, request, peak) = (limit as f64, request as f64, peak as f64);
        let slack = (limit - peak) / limit.max(1.0);
        self.successes_all += 1;
        self.limit_slack_all += slack;
        if attempt == 0 {
            self.ok_limit_bytes += limit;
            self.ok_peak_bytes += peak;
            self.successes += 1;
            self.limit_slack += slack;
            self.request_slack += (request - peak) / request.max(1.0);
        }
    }

    /// Share of jobs whose first attempt was OOM-killed.
    pub fn oom_rate(&self) -> f64 {
        self.first_ooms as f64 / self.jobs.max(1) as f64
    }

    /// Mean (limit − peak) / limit over first attempts that succeeded.
    pub fn avg_limit_slack(&self) -> f64 {
        self.limit_slack / self.successes.max(1) as f64
    }

    /// Σ(limit − peak) / Σ limit over first attempts that succeeded.
    pub fn byte_slack(&self) -> f64 {
        1.0 - self.ok_peak_bytes / self.ok_limit_bytes.max(1.0)
    }

    /// Mean (limit − peak) / limit over all successful attempts.
    pub fn avg_limit_slack_all(&self) -> f64 {
        self.limit_slack_all / self.successes_all.max(1) as f64
    }

    /// Mean (request − peak) / request over first attempts that succeeded.
    pub fn avg_request_slack(&self) -> f64 {
        self.request_slack / self.successes.max(1) as f64
    }

    /// Share of first retries that succeeded.
    pub fn first_retry_success(&self) -> f64 {
        self.first_retry_ok as f64 / self.first_retries.max(1) as f64
    }

    /// Mean first-attempt limit in bytes.
    pub fn mean_limit(&self) -> f64 {
        self.limit_bytes / self.jobs.max(1) as f64
    }
}

/// Replays `trace` through the runyard model: for each job in time order,
/// ask for a recommendation, then reveal the job's need. A killed attempt is
/// observed with its limit as its peak (usage at the kill) and retried with
/// the next recommendation while it carries an OOM bump, at most
/// [`MAX_RETRIES`] times.
pub fn replay_model(trace: &Trace, protected: &[bool], params: Params, warmup: usize) -> Outcome {
    let mut model = Model::new(params);
    let mut out = Outcome::new(
        if model.params().oom_cost > 0.0 {
            format!("runyard (lognormal, OOM cost {})", model.params().oom_cost)
        } else {
            format!("runyard (lognormal-q{})", model.params().limit_quantile)
        },
        true,
    );
    for (i, job) in trace.jobs.iter().enumerate() {
        let w = &trace.workloads[job.workload as usize];
        let is_protected = protected[job.git_ref as usize];
        let measured = i >= warmup;
        let mut rec = model.recommend(w);
        if measured {
            out.jobs += 1;
            out.limit_bytes += rec.memory_limit_bytes as f64;
            let level = usize::try_from(rec.basis.level + 1).unwrap_or(0);
            if out.by_level.len() <= level {
                out.by_level.resize(level + 1, LevelOutcome::default());
            }
            if out.by_samples.is_empty() {
                out.by_samples.resize(5, LevelOutcome::default());
            }
            let bucket = samples_bucket(rec.basis.samples);
            for l in [&mut out.by_level[level], &mut out.by_samples[bucket]] {
                l.jobs += 1;
                if job.peak_memory_bytes > rec.memory_limit_bytes {
                    l.ooms += 1;
                } else {
                    let limit = rec.memory_limit_bytes as f64;
                    l.slack += (limit - job.peak_memory_bytes as f64) / limit;
                }
            }
        }
        let mut attempt = 0u32;
        loop {
            let at = job.at + f64::from(attempt);
            let limit = rec.memory_limit_bytes;
            let killed = job.peak_memory_bytes > limit;
            model.observe(
                w,
                Observation {
                    at,
                    peak_memory_bytes: if killed { limit } else { job.peak_memory_bytes },
                    memory_limit_bytes: Some(limit),
                    memory_request_bytes: Some(rec.memory_request_bytes),
                    cpu_seconds: job.cpu_seconds,
                    wall_seconds: job.wall_seconds,
                    oom_killed: killed,
                    protected: is_protected,
                },
            );
            if !killed {
                if measured {
                    out.success(
                        attempt,
                        limit,
                        rec.memory_request_bytes,
                        job.peak_memory_bytes,
                    );
                    if attempt == 1 {
                        out.first_retry_ok += 1;
                    }
                }
                break;
            }
            if measured && attempt == 0 {
                out.first_ooms += 1;
            }
            let next = model.recommend(w);
            if !next.basis.oom_bump || attempt >= MAX_RETRIES {
                if measured {
                    out.failed += 1;
                }
                break;
            }
            attempt += 1;
            if measured {
                out.retries += 1;
                if attempt == 1 {
                    out.first_retries += 1;
                }
            }
            rec = next;
        }
    }
    out
}

/// gantry's samples per key: the newest 5 (time, peak).
const GANTRY_SAMPLE: usize = 5;
/// gantry accepts a sample one short of ideal.
const GANTRY_MIN: usize = GANTRY_SAMPLE - 1;
const GANTRY_REQUEST: u64 = 2_000_000_000;
const GANTRY_LIMIT: u64 = 5_000_000_000;
const GANTRY_BUMP: f64 = 1.2;

/// gantry's published rule: the newest 5 `develop` samples of the first of
/// six levels with at least 4; request = their mean usage (the trace has
/// peaks only, so the mean of peaks), limit = max of peaks × 1.2 (PR 106);
/// defaults 2 GB / 5 GB; after an OOM kill the previous limit × 1.2.
#[derive(Debug, Default)]
struct Gantry {
    samples: HashMap<String, Vec<(f64, u64)>>,
}

impl Gantry {
    fn keys(w: &Workload) -> Vec<String> {
        let full = workload::key(w.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if !w.contains_key("package") {
            return vec![full];
        }
        let mut keys: Vec<String> = GANTRY_LEVELS
            .iter()
            .map(|level| {
                let names: Vec<String> = level.iter().map(|a| (*a).to_owned()).collect();
                let mut key = String::new();
                sub_key(&full, &names, &mut key);
                key
            })
            .collect();
        keys.dedup();
        keys
    }

    fn recommend(&self, w: &Workload) -> (u64, u64) {
        for key in Self::keys(w) {
            if let Some(s) = self.samples.get(&key).filter(|s| s.len() >= GANTRY_MIN) {
                let mean = s.iter().map(|x| x.1 as f64).sum::<f64>() / s.len() as f64;
                let max = s.iter().map(|x| x.1).max().unwrap_or(0) as f64;
                return (mean as u64, (max * GANTRY_BUMP) as u64);
            }
        }
        (GANTRY_REQUEST, GANTRY_LIMIT)
    }

    fn observe(&mut self, w: &Workload, at: f64, peak: u64) {
        for key in Self::keys(w) {
            let s = self.samples.entry(key).or_default();
            let pos = s.partition_point(|x| x.0 <= at);
            s.insert(pos, (at, peak));
            if s.len() > GANTRY_SAMPLE {
                s.remove(0);
            }
        }
    }
}

/// Replays `trace` through gantry's rule (successful `develop`-ref jobs
/// train it; limits are capped at `ceiling` like runyard's).
pub fn replay_gantry(trace: &Trace, protected: &[bool], ceiling: u64, warmup: usize) -> Outcome {
    let mut gantry = Gantry::default();
    let mut out = Outcome::new("gantry (mean of 5; max × 1.2)", true);
    for (i, job) in trace.jobs.iter().enumerate() {
        let w = &trace.workloads[job.workload as usize];
        let measured = i >= warmup;
        let (request, first_limit) = gantry.recommend(w);
        let mut limit = first_limit.min(ceiling);
        let request = request.min(limit);
        if measured {
            out.jobs += 1;
            out.limit_bytes += limit as f64;
        }
        let mut attempt = 0u32;
        loop {
            if job.peak_memory_bytes <= limit {
                if measured {
                    out.success(attempt, limit, request, job.peak_memory_bytes);
                    if attempt == 1 {
                        out.first_retry_ok += 1;
                    }
                }
                if protected[job.git_ref as usize] {
                    gantry.observe(w, job.at, job.peak_memory_bytes);
                }
                break;
            }
            if measured && attempt == 0 {
                out.first_ooms += 1;
            }
            if attempt >= MAX_RETRIES || limit >= ceiling {
                if measured {
                    out.failed += 1;
                }
                break;
            }
            attempt += 1;
            limit = ((limit as f64 * GANTRY_BUMP) as u64).min(ceiling);
            if measured {
                out.retries += 1;
                if attempt == 1 {
                    out.first_retries += 1;
                }
            }
        }
    }
    out
}

/// Quantile `q` of sorted values as the inverse empirical CDF (type 1): the
/// smallest value that at least a share `q` of them do not exceed.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The hindsight frontier: per workload, the `q` quantile of all its peaks
/// in the whole trace as a fixed limit (and the median as request), scored
/// on the measured jobs. No online method knows these.
pub fn frontier(trace: &Trace, q: f64, ceiling: u64, warmup: usize) -> Outcome {
    let mut peaks: Vec<Vec<u64>> = vec![Vec::new(); trace.workloads.len()];
    for job in &trace.jobs {
        peaks[job.workload as usize].push(job.peak_memory_bytes);
    }
    let limits: Vec<(u64, u64)> = peaks
        .iter_mut()
        .map(|p| {
            p.sort_unstable();
            let limit = quantile(p, q).div_ceil(MB).saturating_mul(MB).min(ceiling);
            let request = quantile(p, 0.5).div_ceil(MB).saturating_mul(MB).min(limit);
            (limit, request)
        })
        .collect();
    let mut out = Outcome::new(format!("hindsight q={q}"), false);
    for job in trace.jobs.iter().skip(warmup) {
        let (limit, request) = limits[job.workload as usize];
        out.jobs += 1;
        out.limit_bytes += limit as f64;
        if job.peak_memory_bytes > limit {
            out.first_ooms += 1;
        } else {
            out.success(0, limit, request, job.peak_memory_bytes);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::trace::{Job, TraceBuilder};

    fn trace(peaks: &[u64]) -> Trace {
        let mut b = TraceBuilder::default();
        let w = b.workload(
            [
                ("package", "zlib"),
                ("version", "1.3"),
                ("compiler", "gcc"),
                ("compiler_version", "12"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        let r = b.git_ref("develop");
        for (i, &p) in peaks.iter().enumerate() {
            b.push(Job {
                at: 1e9 + i as f64 * 3600.0,
                workload: w,
                git_ref: r,
                peak_memory_bytes: p,
                cpu_seconds: 100.0,
                wall_seconds: 50.0,
            });
        }
        b.finish()
    }

    #[test]
    fn gantry_uses_max_of_five_and_bumps_by_a_fifth() {
        // Defaults (5 GB) for four jobs, then max of the newest 5 × 1.2.
        let t = trace(&[1_000_000_000; 6]);
        let out = replay_gantry(&t, &[true], 64 << 30, 0);
        assert_eq!(out.first_ooms, 0);
        let expected = 4.0 * 5e9 + 2.0 * 1.2e9;
        assert!(
            (out.limit_bytes - expected).abs() < 10.0,
            "{}",
            out.limit_bytes
        );
        // 5 GB default, a 6.5 GB job: 5 → 6 → 7.2 GB; the first retry fails.
        let t = trace(&[6_500_000_000]);
        let out = replay_gantry(&t, &[true], 64 << 30, 0);
        assert_eq!((out.first_ooms, out.retries, out.first_retry_ok), (1, 2, 0));
    }

    #[test]
    fn frontier_quantiles_are_per_workload() {
        let peaks: Vec<u64> = (1..=100).map(|i| i * 1_000_000_000).collect();
        let t = trace(&peaks);
        let out = frontier(&t, 0.95, u64::MAX, 0);
        // q0.95 of 1..=100 GB is 95 GB: five jobs are larger.
        assert_eq!(out.first_ooms, 5);
    }

    #[test]
    fn model_replay_retries_until_the_bump_clears() {
        // A steady 1 GB workload, then a 2× spike.
        let mut peaks = vec![1_000_000_000; 10];
        peaks.push(2_000_000_000);
        let t = trace(&peaks);
        let out = replay_model(&t, &[true], Params::default(), 0);
        assert_eq!(out.first_ooms, 1);
        assert_eq!(out.failed, 0);
        assert!(out.retries >= 1);
    }
}
