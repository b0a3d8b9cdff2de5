//! OOM bookkeeping: consecutive kills per workload and the overshoots
//! killed jobs turned out to need.

use super::Observation;

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
}

/// Consecutive OOM kills of one full workload key, robust to attempts that
/// arrive slightly out of time order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Streak {
    /// The newest successful attempt.
    pub(super) last_success: f64,
    /// Kills after `last_success`, oldest first, at most `oom_max_retries + 1`.
    pub(super) kills: Vec<Killed>,
}

impl Streak {
    pub(super) fn new() -> Self {
        Self {
            last_success: f64::NEG_INFINITY,
            kills: Vec::new(),
        }
    }

    /// Records an attempt (`fresh`: the workload has no sample of its own
    /// yet); when a success ends a streak, returns how far the job overshot
    /// the streak's first killed limit (`peak / limit`) and whether that
    /// kill was fresh.
    pub(super) fn record(
        &mut self,
        at: f64,
        obs: &Observation,
        keep: usize,
        fresh: bool,
    ) -> Option<(f64, bool)> {
        if obs.oom_killed {
            if at < self.last_success {
                return None;
            }
            let kill = Killed {
                at,
                limit: obs.memory_limit_bytes,
                peak: obs.peak_memory_bytes,
                fresh,
            };
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
            overshoot
        } else {
            None
        }
    }
}

/// How far OOM-killed jobs overshot their first limit, learned from
/// streaks that ended in a success: a histogram of `ln(peak / limit)` over
/// `[0, ln 4]`, halved whenever it holds 10 000 so it follows change.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Overshoots {
    bins: [f32; OVERSHOOT_BINS],
    total: f32,
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
