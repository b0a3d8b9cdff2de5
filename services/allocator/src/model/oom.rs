//! OOM bookkeeping: consecutive kills per workload and the overshoots
//! killed jobs turned out to need.

use super::{JobAttempt, Observation};

/// Open kills kept per workload, at most (the oldest goes first).
const OPEN_KEPT: usize = 16;
/// An open kill older than this (seconds) is forgotten: GitHub allows
/// re-runs for 30 days after a run.
const OPEN_FOR: f64 = 30.0 * 86_400.0;

/// An OOM kill of an identified job attempt whose job has not reported a
/// later attempt yet: the request that retries it is sized from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct OpenKill {
    /// The killed attempt.
    pub(super) job: JobAttempt,
    /// The kill.
    pub(super) kill: Killed,
    /// The first kill of this job's chain of killed attempts (this one,
    /// unless the attempt before it was killed too).
    pub(super) first: Killed,
    /// Killed attempts of the job in a row, this one included.
    pub(super) chain: u32,
}

/// An OOM-killed attempt of a streak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Killed {
    /// When it was killed.
    pub(super) at: f64,
    /// The limit it ran with.
    pub(super) limit: Option<u64>,
    /// Its usage at the kill.
    pub(super) peak: u64,
    /// Whether the workload had no sample of its own when it was killed (a
    /// new version or package, sized from related keys or the site).
    pub(super) fresh: bool,
    /// Whether its report named the job attempt: such a kill bumps only
    /// the request that says it retries it ([`Streak::open_kill`]), never
    /// another build of the workload.
    pub(super) identified: bool,
}

/// Consecutive OOM kills of one full workload key, robust to attempts that
/// arrive slightly out of time order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Streak {
    /// The newest successful attempt.
    pub(super) last_success: f64,
    /// Kills after `last_success`, oldest first, at most `oom_max_retries + 1`.
    pub(super) kills: Vec<Killed>,
    /// Kills of identified job attempts not yet followed by their job's
    /// next attempt, oldest first: whatever other builds of the workload
    /// do, each stays open for its own retry.
    pub(super) open: Vec<OpenKill>,
}

impl Streak {
    pub(super) fn new() -> Self {
        Self {
            last_success: f64::NEG_INFINITY,
            kills: Vec::new(),
            open: Vec::new(),
        }
    }

    /// Whether it remembers nothing.
    pub(super) fn is_empty(&self) -> bool {
        self.kills.is_empty() && self.open.is_empty()
    }

    /// The open kill a request naming `asked` retries: that attempt's, or
    /// the latest one in the pipeline it names.
    pub(super) fn open_kill(&self, asked: JobAttempt) -> Option<&OpenKill> {
        self.open.iter().rev().find(|o| o.job.answers(&asked))
    }

    /// Sets the pipeline of `attempt`'s open kill when it had none (its
    /// report came before its job's webhook), and chains it to the kill it
    /// follows now that this is known (`via`: the pipeline a retry made
    /// its pipeline from).
    pub(super) fn place(&mut self, attempt: JobAttempt, via: Option<u64>) {
        let Some(i) = self.open.iter().position(|o| {
            o.job.job == attempt.job && o.job.attempt == attempt.attempt && o.job.pipeline == 0
        }) else {
            return;
        };
        let mut me = self.open.remove(i);
        me.job.pipeline = attempt.pipeline;
        let before = self.close_before(&me.job, via, me.kill.at);
        if let Some(b) = before.filter(|_| me.chain == 1) {
            me.first = b.first;
            me.chain = b.chain.saturating_add(1);
        }
        self.open.push(me);
    }

    /// Removes the open kills `job` follows, killed at or before `until`
    /// (its job's earlier attempts, or its workload's in the pipeline `via`
    /// that a retry made its pipeline from), and returns the kill just
    /// before it: the previous attempt's, or the retried pipeline's latest.
    fn close_before(&mut self, job: &JobAttempt, via: Option<u64>, until: f64) -> Option<OpenKill> {
        let follows = |o: &OpenKill| {
            o.kill.at <= until
                && (o.job.precedes(job) || via.is_some_and(|p| p != 0 && p == o.job.pipeline))
        };
        let before = self
            .open
            .iter()
            .filter(|o| follows(o))
            .max_by(|a, b| a.kill.at.total_cmp(&b.kill.at))
            .copied();
        self.open.retain(|o| !follows(o));
        before.filter(|b| b.job.attempt + 1 == job.attempt || via.is_some())
    }

    /// Closes the kills an identified attempt follows (its job's earlier
    /// attempts, or its workload's in the pipeline `via` that a retry made
    /// its pipeline from) and, when it was killed, opens its own, chained
    /// to the kill just before it. Returns the chain it closed when it
    /// passed: how far the job turned out to need beyond the chain's first
    /// killed limit.
    fn record_open(
        &mut self,
        at: f64,
        job: JobAttempt,
        via: Option<u64>,
        kill: Option<Killed>,
        peak: u64,
    ) -> Option<(f64, bool)> {
        let before = self.close_before(&job, via, f64::INFINITY);
        self.open.retain(|o| o.kill.at >= at - OPEN_FOR);
        let Some(kill) = kill else {
            return before
                .and_then(|b| Some((b.first.limit?, b.first.fresh)))
                .filter(|&(limit, _)| limit > 0)
                .map(|(limit, fresh)| (peak as f64 / limit as f64, fresh));
        };
        if self.open.iter().any(|o| o.job == job) {
            return None;
        }
        let (first, chain) = match before {
            Some(b) => (b.first, b.chain.saturating_add(1)),
            None => (kill, 1),
        };
        if self.open.len() >= OPEN_KEPT {
            self.open.remove(0);
        }
        self.open.push(OpenKill {
            job,
            kill,
            first,
            chain,
        });
        None
    }

    /// Records an attempt (`fresh`: the workload has no sample of its own
    /// yet); when a success ends a chain of kills, returns how far the job
    /// overshot the chain's first killed limit (`peak / limit`) and whether
    /// that kill was fresh. An identified attempt ends its own job's chain
    /// only; an unidentified one ends the workload's streak.
    pub(super) fn record(
        &mut self,
        at: f64,
        obs: &Observation,
        via: Option<u64>,
        keep: usize,
        fresh: bool,
    ) -> Option<(f64, bool)> {
        let kill = Killed {
            at,
            limit: obs.memory_limit_bytes,
            peak: obs.peak_memory_bytes,
            fresh,
            identified: obs.job.is_some(),
        };
        let own = obs.job.map(|job| {
            self.record_open(
                at,
                job,
                via,
                obs.oom_killed.then_some(kill),
                obs.peak_memory_bytes,
            )
        });
        if obs.oom_killed {
            if at < self.last_success {
                return None;
            }
            let pos = self.kills.partition_point(|k| k.at <= at);
            self.kills.insert(pos, kill);
            if self.kills.len() > keep {
                self.kills.remove(0);
            }
            None
        } else if at >= self.last_success {
            self.last_success = at;
            let overshoot = self
                .kills
                .first()
                .filter(|k| k.at <= at)
                .and_then(|k| Some((k.limit?, k.fresh)))
                .filter(|&(limit, _)| limit > 0)
                .map(|(limit, fresh)| (obs.peak_memory_bytes as f64 / limit as f64, fresh));
            self.kills.retain(|k| k.at > at);
            own.unwrap_or(overshoot)
        } else {
            own.flatten()
        }
    }
}

/// How far OOM-killed jobs overshot their first limit, learned from
/// streaks that ended in a success: a histogram of `ln(peak / limit)` over
/// `[0, ln 4]`, halved whenever it holds 10 000 so it follows change.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Overshoots {
    bins: [f32; OVERSHOOT_BINS],
    pub(super) total: f32,
}

const OVERSHOOT_BINS: usize = 64;
/// The largest overshoot ratio the histogram tells apart.
const OVERSHOOT_MAX: f64 = 4.0;
/// Overshoots needed before the learned retry limit is used.
const OVERSHOOT_MIN: f32 = 20.0;

impl Overshoots {
    pub(super) fn new() -> Self {
        Self {
            bins: [0.0; OVERSHOOT_BINS],
            total: 0.0,
        }
    }

    fn width() -> f64 {
        OVERSHOOT_MAX.ln() / OVERSHOOT_BINS as f64
    }

    pub(super) fn add(&mut self, ratio: f64) {
        if !(ratio.is_finite() && ratio >= 1.0) {
            return;
        }
        let bin = ((ratio.ln() / Self::width()) as usize).min(OVERSHOOT_BINS - 1);
        self.bins[bin] += 1.0;
        self.total += 1.0;
        if self.total >= 10_000.0 {
            for b in &mut self.bins {
                *b /= 2.0;
            }
            self.total /= 2.0;
        }
    }

    /// The ratio below which `coverage` of the overshoots larger than
    /// `above` fall (the upper edge of that bin), once enough are known.
    pub(super) fn quantile_above(&self, above: f64, coverage: f64) -> Option<f64> {
        let start = if above > 1.0 {
            ((above.ln() / Self::width()) as usize).min(OVERSHOOT_BINS - 1)
        } else {
            0
        };
        let mass: f32 = self.bins[start..].iter().sum();
        if mass < OVERSHOOT_MIN {
            return None;
        }
        let target = coverage as f32 * mass;
        let mut acc = 0.0;
        for (i, &b) in self.bins.iter().enumerate().skip(start) {
            acc += b;
            if acc >= target {
                return Some(((i + 1) as f64 * Self::width()).exp());
            }
        }
        Some(OVERSHOOT_MAX)
    }
}
