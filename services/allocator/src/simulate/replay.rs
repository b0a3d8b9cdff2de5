//! Online replays of a trace (the runyard model, gantry's rule) and the
//! hindsight frontier, with the quality metrics they are compared on.

use std::collections::HashMap;

use runyard_store::workload;

use super::trace::Trace;
use crate::model::{
    GANTRY_LEVELS, JobAttempt, MB, Model, OOM_ADD_BYTES, OOM_FACTOR, Observation, Params, Workload,
    sub_key,
};

/// Consecutive OOM kills of a workload that each get a retry (gantry and
/// runyard alike): the 1st, 2nd and 3rd consecutive kill are retried, the
/// 4th is refused.
pub const MAX_RETRIES: u32 = 3;

/// Consecutive OOM kills per workload of a trace, the way runyard counts
/// them: kills on any ref count, a successful attempt ends the streak, and a
/// kill is retried while the streak (this kill included) is at most
/// [`MAX_RETRIES`]. A streak that ran out stays out until a success, so the
/// next job of that workload to be killed is refused at once.
#[derive(Debug, Clone, Default)]
pub struct OomStreaks {
    kills: Vec<u32>,
}

impl OomStreaks {
    /// Streaks for `workloads` workloads, all at zero.
    pub fn new(workloads: usize) -> Self {
        Self {
            kills: vec![0; workloads],
        }
    }

    /// Records an OOM kill of `workload`; whether it gets a retry.
    pub fn killed(&mut self, workload: u32) -> bool {
        let kills = &mut self.kills[workload as usize];
        *kills = (*kills + 1).min(MAX_RETRIES + 1);
        *kills <= MAX_RETRIES
    }

    /// Records a successful attempt of `workload`: its streak ends.
    pub fn succeeded(&mut self, workload: u32) {
        self.kills[workload as usize] = 0;
    }

    /// Starts `workload`'s streak afresh (a new job under
    /// [`RetryScope::Job`]).
    pub fn reset(&mut self, workload: u32) {
        self.kills[workload as usize] = 0;
    }

    /// The current streak of `workload`.
    pub fn streak(&self, workload: u32) -> u32 {
        self.kills[workload as usize]
    }
}

/// What the consecutive OOM kills that get a retry are counted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryScope {
    /// The workload, across jobs, as runyard counts them: a workload whose
    /// streak ran out has its next kills refused until a job succeeds.
    Workload,
    /// Each job on its own: every job gets up to [`MAX_RETRIES`] retries.
    Job,
}

/// runyard's OOM bump of a killed attempt's limit, applied to gantry's
/// retries too (gantry's own retry logic never merged): `max(limit × 1.2,
/// limit + 100 MiB, peak × 1.2)`, rounded up to whole megabytes, at most
/// `ceiling`. `peak` is the usage at the kill.
pub fn oom_bump(limit: u64, peak: u64, ceiling: u64) -> u64 {
    let (limit, peak) = (limit as f64, peak as f64);
    let bumped = (limit * OOM_FACTOR)
        .max(limit + OOM_ADD_BYTES as f64)
        .max(peak * OOM_FACTOR);
    let mb = (bumped / MB as f64).ceil() as u64;
    mb.saturating_mul(MB).min(ceiling)
}

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
    /// Jobs that never succeeded: refused a retry at a kill beyond the
    /// workload's [`MAX_RETRIES`] consecutive ones.
    pub failed: u64,
    /// Jobs by the attempt that succeeded (0 = the first, 1–3 = that retry).
    pub ok_on_attempt: [u64; MAX_RETRIES as usize + 1],
    /// Refused jobs by the retries they had had before the refusal (3: the
    /// job's own 4th kill; fewer: the workload's streak was already running
    /// from earlier jobs).
    pub refused_after: [u64; MAX_RETRIES as usize + 1],
    /// OOM-killed attempts, first attempts and retries.
    pub killed_attempts: u64,
    /// Σ wall seconds of the killed attempts, as if each was killed at its
    /// end (an upper bound: a kill comes when the peak is reached).
    pub killed_seconds: f64,
    /// Σ limit × wall seconds of the killed attempts (byte-seconds, the same
    /// upper bound).
    pub killed_byte_seconds: f64,
    /// Σ limit × wall seconds of every attempt.
    pub reserved_byte_seconds: f64,
    /// The model only: kills where its recommendation disagreed with the
    /// retry policy ([`OomStreaks`]): a bump for a refused kill, or none for
    /// a retried one.
    pub policy_mismatches: u64,
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
    /// Every method: first attempts by how many earlier protected-ref jobs
    /// the exact workload key had when it was asked ([`HISTORY_BUCKETS`]).
    pub by_history: [LevelOutcome; HISTORY_BUCKETS.len()],
}

/// Names of the [`Outcome::by_history`] buckets: prior protected-ref jobs
/// of the exact workload key; one with none, by whether its package (the
/// `package` attribute; a workload without one is its own package) had any.
pub const HISTORY_BUCKETS: [&str; 5] = [
    "package never seen",
    "package seen, workload not",
    "1–2",
    "3–5",
    "6+",
];

/// For each job of `trace`, its [`Outcome::by_history`] bucket: how many
/// earlier jobs of the same workload key ran on a protected ref, and for
/// none, whether any of its package did.
pub fn history_buckets(trace: &Trace, protected: &[bool]) -> Vec<u8> {
    let mut seen = vec![0u32; trace.workloads.len()];
    let package: Vec<Option<&String>> = trace.workloads.iter().map(|w| w.get("package")).collect();
    let mut packages: std::collections::HashSet<&String> = std::collections::HashSet::new();
    trace
        .jobs
        .iter()
        .map(|job| {
            let pkg = package[job.workload as usize];
            let n = &mut seen[job.workload as usize];
            let bucket = match *n {
                0 if pkg.is_some_and(|p| packages.contains(p)) => 1,
                0 => 0,
                1..=2 => 2,
                3..=5 => 3,
                _ => 4,
            };
            if protected[job.git_ref as usize] {
                *n += 1;
                if let Some(p) = pkg {
                    packages.insert(p);
                }
            }
            bucket
        })
        .collect()
}

/// Upper edges of the predicted-P(OOM) bands [`LevelOutcome::bands`] counts
/// first attempts in (the last band is open).
pub const PREDICTED_BANDS: [f64; 5] = [0.01, 0.02, 0.04, 0.08, 1.0];

/// First attempts whose predicted P(OOM) fell in one band: jobs, kills and
/// the sum of the predictions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Band {
    /// Jobs.
    pub jobs: u64,
    /// ... whose first attempt was killed.
    pub ooms: u64,
    /// Σ predicted P(OOM).
    pub predicted: f64,
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
    /// First retries of its killed first attempts.
    pub first_retries: u64,
    /// ... that succeeded.
    pub first_retries_ok: u64,
    /// First attempts by the P(OOM) the model predicted at their limit
    /// ([`PREDICTED_BANDS`]); empty for methods that predict none.
    pub bands: [Band; PREDICTED_BANDS.len()],
}

impl LevelOutcome {
    /// Books one first attempt.
    fn add(&mut self, limit: u64, peak: u64) {
        self.jobs += 1;
        if peak > limit {
            self.ooms += 1;
        } else {
            let limit = limit as f64;
            self.slack += (limit - peak as f64) / limit.max(1.0);
        }
    }

    /// Books the model's prediction for a first attempt (`killed` or not).
    fn predicted(&mut self, p: f64, killed: bool) {
        let band = PREDICTED_BANDS
            .iter()
            .position(|&edge| p < edge)
            .unwrap_or(PREDICTED_BANDS.len() - 1);
        let b = &mut self.bands[band];
        b.jobs += 1;
        b.ooms += u64::from(killed);
        b.predicted += p;
    }

    /// Mean predicted P(OOM) of its first attempts, when the method
    /// predicts one.
    pub fn mean_predicted(&self) -> Option<f64> {
        let jobs: u64 = self.bands.iter().map(|b| b.jobs).sum();
        (jobs > 0).then(|| self.bands.iter().map(|b| b.predicted).sum::<f64>() / jobs as f64)
    }

    /// Share of first retries that succeeded.
    pub fn first_retry_rate(&self) -> Option<f64> {
        (self.first_retries > 0).then(|| self.first_retries_ok as f64 / self.first_retries as f64)
    }

    /// Share of its jobs whose first attempt was killed.
    pub fn oom_rate(&self) -> f64 {
        self.ooms as f64 / self.jobs.max(1) as f64
    }

    /// Mean (limit − peak) / limit over the first attempts that succeeded.
    pub fn avg_slack(&self) -> f64 {
        self.slack / (self.jobs - self.ooms).max(1) as f64
    }
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

    /// Jobs that succeeded on retry 1 over OOM-killed first attempts.
    pub fn first_retry_success_of_killed(&self) -> f64 {
        self.ok_on_attempt[1] as f64 / self.first_ooms.max(1) as f64
    }

    /// Share of all jobs refused a retry.
    pub fn refused_rate(&self) -> f64 {
        self.failed as f64 / self.jobs.max(1) as f64
    }

    /// Killed attempts' share of all reserved memory·time.
    pub fn killed_memory_time_share(&self) -> f64 {
        self.killed_byte_seconds / self.reserved_byte_seconds.max(1.0)
    }

    /// Books one attempt that ran with `limit` for `wall` seconds.
    fn attempt(&mut self, limit: u64, wall: f64, killed: bool) {
        if !wall.is_finite() {
            if killed {
                self.killed_attempts += 1;
            }
            return;
        }
        let byte_seconds = limit as f64 * wall;
        self.reserved_byte_seconds += byte_seconds;
        if killed {
            self.killed_attempts += 1;
            self.killed_seconds += wall;
            self.killed_byte_seconds += byte_seconds;
        }
    }

    /// Books the end of a measured job's attempts: success on `attempt`, or
    /// refused after `attempt` retries.
    fn finished(&mut self, attempt: u32, ok: bool) {
        let i = (attempt as usize).min(MAX_RETRIES as usize);
        if ok {
            self.ok_on_attempt[i] += 1;
            if attempt == 1 {
                self.first_retry_ok += 1;
            }
        } else {
            self.failed += 1;
            self.refused_after[i] += 1;
        }
    }

    /// Books a retry (the `attempt`th).
    fn retried(&mut self, attempt: u32) {
        self.retries += 1;
        if attempt == 1 {
            self.first_retries += 1;
        }
    }

    /// Mean first-attempt limit in bytes.
    pub fn mean_limit(&self) -> f64 {
        self.limit_bytes / self.jobs.max(1) as f64
    }
}

/// Attempt `attempt` of trace job `i`, as its usage reports would name it.
fn sim_attempt(i: usize, attempt: u32) -> JobAttempt {
    JobAttempt::new("github", "sim.invalid", i as u64 + 1, 0, attempt)
}

/// How a replay retries a killed job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retries {
    /// Seconds from a kill to its retry: 0 retries at once; more lets other
    /// builds of the workload run (and pass) in between, as on a busy CI
    /// where several pipelines build the same spec on the same day.
    pub delay_s: f64,
    /// Whether reports name their job attempt and a retry names the attempt
    /// it retries (`retry_of`); false sizes a retry from the workload's OOM
    /// streak alone, as runyard did before `retry_of`.
    pub identified: bool,
}

impl Default for Retries {
    fn default() -> Self {
        Self {
            delay_s: 0.0,
            identified: true,
        }
    }
}

/// Replays `trace` through the runyard model ([`replay_model_with`],
/// retries at once).
pub fn replay_model(trace: &Trace, protected: &[bool], params: Params, warmup: usize) -> Outcome {
    replay_model_with(trace, protected, params, warmup, Retries::default())
}

/// Replays `trace` through the runyard model: for each job in time order,
/// ask for a recommendation, then reveal the job's need. A killed attempt is
/// observed with its limit as its peak (usage at the kill); while the
/// workload's consecutive kills number at most [`MAX_RETRIES`]
/// ([`OomStreaks`]) the job is retried — the same build, so the same need —
/// `retries.delay_s` later, with the model's recommendation at that time
/// for the retry of that attempt, and the retry is observed like any
/// attempt. The next kill is refused.
pub fn replay_model_with(
    trace: &Trace,
    protected: &[bool],
    params: Params,
    warmup: usize,
    retries: Retries,
) -> Outcome {
    let mut model = Model::new(params);
    let mut name = if model.params().target_oom > 0.0 {
        format!(
            "runyard (target OOM {}%)",
            (model.params().target_oom * 1000.0).round() / 10.0
        )
    } else if model.params().oom_cost > 0.0 {
        format!("runyard (lognormal, OOM cost {})", model.params().oom_cost)
    } else {
        format!("runyard (lognormal-q{})", model.params().limit_quantile)
    };
    if !retries.identified {
        name.push_str(", retries by workload streak");
    }
    let mut replay = ModelReplay {
        trace,
        protected,
        warmup,
        retries,
        history: history_buckets(trace, protected),
        streaks: OomStreaks::new(trace.workloads.len()),
        out: Outcome::new(name, true),
        due: std::collections::BinaryHeap::new(),
    };
    for (i, job) in trace.jobs.iter().enumerate() {
        replay.retries_due(&mut model, job.at);
        let w = &trace.workloads[job.workload as usize];
        let rec = model.recommend(w);
        if i >= warmup {
            let out = &mut replay.out;
            let bucket = &mut out.by_history[replay.history[i] as usize];
            bucket.add(rec.memory_limit_bytes, job.peak_memory_bytes);
            if let Some(p) = rec.basis.oom_probability.filter(|p| *p >= 0.0) {
                bucket.predicted(p, job.peak_memory_bytes > rec.memory_limit_bytes);
            }
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
                l.add(rec.memory_limit_bytes, job.peak_memory_bytes);
            }
        }
        replay.attempt(&mut model, i, 0, job.at, &rec);
    }
    replay.retries_due(&mut model, f64::INFINITY);
    replay.out
}

/// A retry waiting for its time: (time in ms, job, attempt).
type Due = std::cmp::Reverse<(u64, usize, u32)>;

/// [`replay_model_with`]'s state.
struct ModelReplay<'a> {
    trace: &'a Trace,
    protected: &'a [bool],
    warmup: usize,
    retries: Retries,
    history: Vec<u8>,
    streaks: OomStreaks,
    out: Outcome,
    due: std::collections::BinaryHeap<Due>,
}

impl ModelReplay<'_> {
    /// The recommendation for the retry that follows `attempt` (from 0) of
    /// job `i`.
    fn retry_rec(&self, model: &Model, i: usize, attempt: u32) -> crate::model::Recommendation {
        let w = &self.trace.workloads[self.trace.jobs[i].workload as usize];
        if self.retries.identified {
            model.recommend_retry(w, sim_attempt(i, attempt + 1))
        } else {
            model.recommend(w)
        }
    }

    /// Runs the retries due by `until`, in time order.
    fn retries_due(&mut self, model: &mut Model, until: f64) {
        while let Some(&std::cmp::Reverse((at, i, attempt))) = self.due.peek() {
            if at as f64 / 1000.0 > until {
                break;
            }
            self.due.pop();
            let rec = self.retry_rec(model, i, attempt - 1);
            if i >= self.warmup {
                self.out.policy_mismatches += u64::from(!rec.basis.oom_bump);
            }
            self.attempt(model, i, attempt, at as f64 / 1000.0, &rec);
        }
    }

    /// Attempt `attempt` (from 0) of job `i` at `at` with `rec`; a kill
    /// queues its retry, or runs it at once without a delay.
    fn attempt(
        &mut self,
        model: &mut Model,
        i: usize,
        mut attempt: u32,
        mut at: f64,
        rec: &crate::model::Recommendation,
    ) {
        let job = &self.trace.jobs[i];
        let w = &self.trace.workloads[job.workload as usize];
        let measured = i >= self.warmup;
        let mut rec = rec.clone();
        loop {
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
                    protected: self.protected[job.git_ref as usize],
                    job: self.retries.identified.then(|| sim_attempt(i, attempt + 1)),
                },
            );
            let out = &mut self.out;
            if measured {
                out.attempt(limit, job.wall_seconds, killed);
                if attempt == 1 {
                    let bucket = &mut out.by_history[self.history[i] as usize];
                    bucket.first_retries += 1;
                    bucket.first_retries_ok += u64::from(!killed);
                }
            }
            if !killed {
                self.streaks.succeeded(job.workload);
                if measured {
                    out.success(
                        attempt,
                        limit,
                        rec.memory_request_bytes,
                        job.peak_memory_bytes,
                    );
                    out.finished(attempt, true);
                }
                return;
            }
            if measured && attempt == 0 {
                out.first_ooms += 1;
            }
            if !self.streaks.killed(job.workload) {
                // Refused: the model should say its retries are spent.
                let next = self.retry_rec(model, i, attempt);
                if measured {
                    self.out.policy_mismatches += u64::from(!next.basis.retries_exhausted);
                    self.out.finished(attempt, false);
                }
                return;
            }
            attempt += 1;
            if measured {
                self.out.retried(attempt);
            }
            if self.retries.delay_s > 0.0 {
                let when = at + self.retries.delay_s;
                self.due
                    .push(std::cmp::Reverse(((when * 1000.0) as u64, i, attempt)));
                return;
            }
            // At once: the recommendation once the kill has been observed,
            // bumped while the model's own streak allows a retry.
            rec = self.retry_rec(model, i, attempt - 1);
            if measured {
                self.out.policy_mismatches += u64::from(!rec.basis.oom_bump);
            }
            at = job.at + f64::from(attempt);
        }
    }
}

/// gantry's samples per key: the newest 5 (time, peak).
const GANTRY_SAMPLE: usize = 5;
/// gantry accepts a sample one short of ideal.
const GANTRY_MIN: usize = GANTRY_SAMPLE - 1;
const GANTRY_REQUEST: u64 = 2_000_000_000;
const GANTRY_LIMIT: u64 = 5_000_000_000;
/// gantry's headroom on the max of its samples.
const GANTRY_HEADROOM: f64 = 1.2;

/// gantry's published rule: the newest 5 `develop` samples of the first of
/// six levels with at least 4; request = their mean usage (the trace has
/// peaks only, so the mean of peaks), limit = max of peaks × 1.2 (PR 106);
/// defaults 2 GB / 5 GB. gantry has no retry rule of its own (its retry
/// logic never merged); [`replay_gantry`] retries with runyard's.
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
                return (mean as u64, (max * GANTRY_HEADROOM) as u64);
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
/// train it; limits are capped at `ceiling` like runyard's). OOM kills are
/// retried while the consecutive kills counted over `scope` number at most
/// [`MAX_RETRIES`] ([`OomStreaks`]), each retry with [`oom_bump`] of the
/// killed limit: gantry's own retry logic never merged.
pub fn replay_gantry(
    trace: &Trace,
    protected: &[bool],
    ceiling: u64,
    warmup: usize,
    scope: RetryScope,
) -> Outcome {
    let mut gantry = Gantry::default();
    let mut streaks = OomStreaks::new(trace.workloads.len());
    let mut out = Outcome::new(
        match scope {
            RetryScope::Job => "gantry (mean of 5; max × 1.2)",
            RetryScope::Workload => "gantry, retries counted per workload",
        },
        true,
    );
    let history = history_buckets(trace, protected);
    for (i, job) in trace.jobs.iter().enumerate() {
        let w = &trace.workloads[job.workload as usize];
        let measured = i >= warmup;
        if scope == RetryScope::Job {
            streaks.reset(job.workload);
        }
        let (request, first_limit) = gantry.recommend(w);
        let mut limit = first_limit.min(ceiling);
        let request = request.min(limit);
        if measured {
            out.by_history[history[i] as usize].add(limit, job.peak_memory_bytes);
            out.jobs += 1;
            out.limit_bytes += limit as f64;
        }
        let mut attempt = 0u32;
        loop {
            let killed = job.peak_memory_bytes > limit;
            if measured {
                out.attempt(limit, job.wall_seconds, killed);
            }
            if !killed {
                streaks.succeeded(job.workload);
                if measured {
                    out.success(attempt, limit, request, job.peak_memory_bytes);
                    out.finished(attempt, true);
                }
                if protected[job.git_ref as usize] {
                    gantry.observe(w, job.at, job.peak_memory_bytes);
                }
                break;
            }
            if measured && attempt == 0 {
                out.first_ooms += 1;
            }
            if !streaks.killed(job.workload) {
                if measured {
                    out.finished(attempt, false);
                }
                break;
            }
            attempt += 1;
            // Killed at its limit: that is its usage at the kill.
            limit = oom_bump(limit, limit, ceiling);
            if measured {
                out.retried(attempt);
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
pub fn frontier(trace: &Trace, protected: &[bool], q: f64, ceiling: u64, warmup: usize) -> Outcome {
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
    let history = history_buckets(trace, protected);
    for (job, &bucket) in trace.jobs.iter().zip(&history).skip(warmup) {
        let (limit, request) = limits[job.workload as usize];
        out.by_history[bucket as usize].add(limit, job.peak_memory_bytes);
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
    fn a_delayed_retry_is_bumped_though_other_builds_passed_meanwhile() {
        // A steady 1 GB workload built hourly; one build needs 1.3 GB and
        // is killed; its retry runs 3 hours later, after three builds
        // passed at the usual limit.
        let mut peaks = vec![1_000_000_000; 12];
        peaks.push(1_300_000_000);
        peaks.extend([1_000_000_000; 6]);
        let t = trace(&peaks);
        let delayed = |identified| Retries {
            delay_s: 3.0 * 3600.0,
            identified,
        };
        let out = replay_model_with(&t, &[true], Params::default(), 12, delayed(true));
        assert_eq!((out.first_ooms, out.retries), (1, 1), "{out:?}");
        assert_eq!(out.ok_on_attempt[1], 1, "the first retry passes: {out:?}");
        assert_eq!(out.policy_mismatches, 0);
        // Sized from the workload's streak, which the passing builds ended,
        // the retry gets the killed limit again.
        let before = replay_model_with(&t, &[true], Params::default(), 12, delayed(false));
        assert_eq!(before.first_ooms, 1);
        assert_eq!(before.ok_on_attempt[1], 0, "{before:?}");
        assert!(before.policy_mismatches >= 1, "{before:?}");
        // At once, both ways agree.
        let now = replay_model_with(&t, &[true], Params::default(), 12, Retries::default());
        assert_eq!(now.ok_on_attempt[1], 1, "{now:?}");
    }

    #[test]
    fn history_buckets_tell_a_new_package_from_a_new_version() {
        let mut b = TraceBuilder::default();
        let spec = |version: &str| {
            [("package", "zlib"), ("version", version)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let (old, new) = (b.workload(spec("1.2")), b.workload(spec("1.3")));
        let (develop, pr) = (b.git_ref("develop"), b.git_ref("pr-1"));
        // A pull request's build teaches nothing: 1.3's first job still
        // finds no protected build of zlib; after 1.2's, it finds one.
        let jobs = [(new, pr), (new, pr), (old, develop), (new, develop)];
        for (n, (workload, git_ref)) in jobs.into_iter().chain([(new, develop); 6]).enumerate() {
            b.push(Job {
                at: n as f64,
                workload,
                git_ref,
                peak_memory_bytes: 1,
                cpu_seconds: 1.0,
                wall_seconds: 1.0,
            });
        }
        let t = b.finish();
        let protected: Vec<bool> = t.refs.iter().map(|r| r == "develop").collect();
        assert_eq!(
            history_buckets(&t, &protected),
            [0, 0, 0, 1, 2, 2, 3, 3, 3, 4]
        );
    }

    #[test]
    fn gantry_uses_max_of_five_and_bumps_by_a_fifth() {
        // Defaults (5 GB) for four jobs, then max of the newest 5 × 1.2.
        let t = trace(&[1_000_000_000; 6]);
        let out = replay_gantry(&t, &[true], 64 << 30, 0, RetryScope::Job);
        assert_eq!(out.first_ooms, 0);
        let expected = 4.0 * 5e9 + 2.0 * 1.2e9;
        assert!(
            (out.limit_bytes - expected).abs() < 10.0,
            "{}",
            out.limit_bytes
        );
        // 5 GB default, a 6.5 GB job: 5 → 6 → 7.2 GB; the first retry fails.
        let t = trace(&[6_500_000_000]);
        let out = replay_gantry(&t, &[true], 64 << 30, 0, RetryScope::Job);
        assert_eq!((out.first_ooms, out.retries, out.first_retry_ok), (1, 2, 0));
        assert_eq!(out.ok_on_attempt, [0, 0, 1, 0]);
    }

    #[test]
    fn oom_streaks_retry_three_kills_in_a_row_and_refuse_the_fourth() {
        let mut s = OomStreaks::new(2);
        assert!(s.killed(0) && s.killed(0) && s.killed(0));
        assert_eq!(s.streak(0), 3);
        assert!(!s.killed(0), "the 4th consecutive kill is refused");
        assert!(!s.killed(0), "and so is the next until a success");
        assert_eq!(s.streak(0), MAX_RETRIES + 1);
        assert!(s.killed(1), "streaks are per workload");
        s.succeeded(0);
        assert_eq!(s.streak(0), 0);
        assert!(s.killed(0));
    }

    #[test]
    fn oom_bump_is_the_largest_of_the_three_rules() {
        let gib = 1u64 << 30;
        // × 1.2 dominates large limits, + 100 MiB small ones.
        assert_eq!(
            oom_bump(5_000_000_000, 5_000_000_000, 64 * gib),
            6_000_000_000
        );
        assert_eq!(oom_bump(120_000_000, 120_000_000, 64 * gib), 225_000_000);
        // A peak above the limit (reported usage) counts × 1.2.
        assert_eq!(
            oom_bump(1_000_000_000, 2_000_000_000, 64 * gib),
            2_400_000_000
        );
        assert_eq!(oom_bump(60 * gib, 60 * gib, 64 * gib), 64 * gib);
    }

    #[test]
    fn gantry_retries_with_runyards_bump() {
        // Four jobs at the 5 GB default, then max of 5 × 1.2 = 120 MB. A
        // 230 MB job: 120 → 225 (+100 MiB) → 330 MB, ok on retry 2 (× 1.2
        // alone would need four retries).
        let t = trace(&[
            100_000_000,
            100_000_000,
            100_000_000,
            100_000_000,
            100_000_000,
            230_000_000,
        ]);
        let out = replay_gantry(&t, &[true], 64 << 30, 0, RetryScope::Job);
        assert_eq!(out.ok_on_attempt, [5, 0, 1, 0]);
        assert_eq!((out.first_ooms, out.retries, out.failed), (1, 2, 0));
        // A 10 GB job: 120 → 225 → 330 → 436 MB, refused at its 4th kill;
        // the next 10 GB job (the streak still running) at its 1st; a
        // success ends the streak.
        let mut peaks = vec![100_000_000; 5];
        peaks.extend([10_000_000_000, 10_000_000_000, 100_000_000, 10_000_000_000]);
        let t = trace(&peaks);
        let out = replay_gantry(&t, &[true], 64 << 30, 0, RetryScope::Workload);
        assert_eq!(out.refused_after, [1, 0, 0, 2]);
        assert_eq!((out.first_ooms, out.retries, out.failed), (3, 6, 3));
        assert_eq!(out.killed_attempts, 9);
        assert_eq!(out.ok_on_attempt, [6, 0, 0, 0]);
        // Counted per job, the second 10 GB job gets its three retries too.
        let out = replay_gantry(&t, &[true], 64 << 30, 0, RetryScope::Job);
        assert_eq!(out.refused_after, [0, 0, 0, 3]);
        assert_eq!((out.first_ooms, out.retries, out.failed), (3, 9, 3));
    }

    /// The first limit the model gives the job after `history`.
    fn first_limit_after(history: &[u64]) -> u64 {
        let mut peaks = history.to_vec();
        peaks.push(1);
        let out = replay_model(&trace(&peaks), &[true], Params::default(), history.len());
        assert_eq!(out.jobs, 1);
        out.limit_bytes as u64
    }

    #[test]
    fn model_replay_retries_a_job_just_above_its_limit_once() {
        let history = vec![1_000_000_000; 10];
        let limit = first_limit_after(&history);
        assert!(limit > 1_000_000_000, "{limit}");
        let mut peaks = history.clone();
        peaks.push(limit + MB);
        let out = replay_model(&trace(&peaks), &[true], Params::default(), history.len());
        assert_eq!(
            (out.jobs, out.first_ooms, out.retries, out.failed),
            (1, 1, 1, 0)
        );
        assert_eq!(out.ok_on_attempt, [0, 1, 0, 0]);
        assert_eq!(out.first_retry_success_of_killed(), 1.0);
        assert_eq!(out.policy_mismatches, 0);
    }

    #[test]
    fn model_replay_refuses_the_fourth_kill_in_a_row() {
        // A 50 GB job after 1 GB ones: three bumps don't reach it, so its
        // 4th kill is refused; the next 50 GB job finds the streak still
        // running and is refused at its first kill; a success ends the
        // streak, and the next 50 GB job gets its three retries again.
        let mut peaks = vec![1_000_000_000; 10];
        peaks.extend([
            50_000_000_000,
            50_000_000_000,
            1_000_000_000,
            50_000_000_000,
        ]);
        let out = replay_model(&trace(&peaks), &[true], Params::default(), 10);
        assert_eq!(out.jobs, 4);
        assert_eq!((out.first_ooms, out.retries, out.failed), (3, 6, 3));
        assert_eq!(out.refused_after, [1, 0, 0, 2]);
        assert_eq!(out.ok_on_attempt, [1, 0, 0, 0]);
        assert_eq!(out.killed_attempts, 9);
        assert_eq!(out.refused_rate(), 0.75);
        assert_eq!(out.policy_mismatches, 0);
        assert!(out.killed_memory_time_share() > 0.5);
    }

    #[test]
    fn frontier_quantiles_are_per_workload() {
        let peaks: Vec<u64> = (1..=100).map(|i| i * 1_000_000_000).collect();
        let t = trace(&peaks);
        let out = frontier(&t, &[true], 0.95, u64::MAX, 0);
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
