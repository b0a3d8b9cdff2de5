//! The calibrated OOM knob: the Lagrange multiplier on OOM cost that makes
//! the mean predicted P(OOM) of first attempts meet the operator's target,
//! and a slow correction from the OOM kills actually seen.
//!
//! Minimising the mean slack of first attempts subject to a mean P(OOM) of
//! `target` is, by a Lagrange multiplier λ, minimising per workload
//! `E[slack] + λ · P(OOM)`: the newsvendor choice with cost λ, which gives a
//! calm workload a high quantile (covering its tail is cheap) and a wild one
//! a lower quantile. λ is the one for which the quantiles chosen for the
//! recent asks (their predictive spreads as their tails realized them, kept
//! in a decaying histogram) average `1 − body` where `body` is what the
//! far-out peaks (a running mean of their groups' shares, which no limit
//! buys off) leave of `target' = target × correction`, and the
//! correction is an integral controller on the realized first-attempt OOM
//! rate: every killed first attempt lowers it, every successful one raises
//! it a little, so it settles where realized OOMs meet the target whatever
//! the model's own calibration error.

use super::stats;

/// Histogram bins of `ln(sd)` from `ln(SD_MIN)` to `ln(SD_MAX)`.
const BINS: usize = 48;
const SD_MIN: f64 = 0.005;
const SD_MAX: f64 = 3.0;
/// The histogram halves whenever it holds this much, so it follows the mix
/// of recent asks.
const HALVE_AT: f64 = 4096.0;
/// λ is solved again after this many first attempts (a solve costs about
/// a millisecond; λ moves slowly anyway).
const SOLVE_EVERY: u32 = 256;
/// One first attempt in this many adds its spread to the histogram: the
/// mix is well sampled so, and working out a spread costs a fit or two per
/// observation (start-up replays a million).
const SPREAD_EVERY: u32 = 8;
/// Step of the realized-OOM controller per first attempt (log space,
/// relative to the target): about 1/η·target attempts to correct a factor e.
const STEP: f64 = 0.0004;
/// The correction stays within `[1/BOUND, BOUND]`.
const BOUND: f64 = 4.0;
/// The far-out share is a running mean over about this many spreads.
const FAR_MEMORY: f64 = 512.0;
/// However many far-out peaks, the quantiles get this share of the target.
const MIN_BODY_SHARE: f64 = 0.2;

/// State of the calibration.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Calibration {
    target: f64,
    min_q: f64,
    max_q: f64,
    bins: [f64; BINS],
    total: f64,
    since_solve: u32,
    /// `ln` of the factor on the target the controller has learned.
    ln_correction: f64,
    /// The current multiplier.
    lambda: f64,
    /// Recent first attempts' mean share of far-out peaks, which no limit
    /// buys off: the part of the target spent before any quantile.
    far: f64,
}

fn bin_of(sd: f64) -> usize {
    let x = (sd.clamp(SD_MIN, SD_MAX) / SD_MIN).ln() / (SD_MAX / SD_MIN).ln();
    ((x * BINS as f64) as usize).min(BINS - 1)
}

fn sd_of(bin: usize) -> f64 {
    SD_MIN * ((bin as f64 + 0.5) / BINS as f64 * (SD_MAX / SD_MIN).ln()).exp()
}

impl Calibration {
    /// Calibration to `target` (0 < target < 0.5) with quantiles kept in
    /// `[min_q, max_q]`, starting from multiplier `lambda`.
    pub(super) fn new(target: f64, min_q: f64, max_q: f64, lambda: f64) -> Self {
        Self {
            target,
            min_q,
            max_q,
            bins: [0.0; BINS],
            total: 0.0,
            since_solve: 0,
            ln_correction: 0.0,
            lambda,
            far: 0.0,
        }
    }

    /// The multiplier on OOM cost to price the next limits with.
    pub(super) fn lambda(&self) -> f64 {
        self.lambda
    }

    /// The target the predicted P(OOM) is solved for (target × correction).
    pub(super) fn effective_target(&self) -> f64 {
        (self.target * self.ln_correction.exp()).clamp(1e-4, 0.45)
    }

    /// The quantile the newsvendor choice with cost `lambda` gives a
    /// predictive spread `sd`, kept within the configured bounds.
    pub(super) fn quantile(&self, sd: f64, lambda: f64) -> f64 {
        stats::normal_probability(stats::newsvendor_z(sd, lambda)).clamp(self.min_q, self.max_q)
    }

    /// Mean P(OOM) over the histogram at `lambda`.
    fn mean_oom(&self, lambda: f64) -> f64 {
        let mut sum = 0.0;
        for (i, &w) in self.bins.iter().enumerate() {
            if w > 0.0 {
                sum += w * (1.0 - self.quantile(sd_of(i), lambda));
            }
        }
        sum / self.total.max(1e-12)
    }

    /// Whether the next first attempt should bring its predictive spread.
    pub(super) fn wants_spread(&self) -> bool {
        self.since_solve.is_multiple_of(SPREAD_EVERY)
    }

    /// Records a first attempt: the predictive spread it was asked with and
    /// the share of far-out peaks its group has (NaN when not worked out),
    /// and whether it was killed.
    pub(super) fn record(&mut self, sd: f64, far: f64, killed: bool) {
        if far.is_finite() {
            self.far += (far.clamp(0.0, 1.0) - self.far) / FAR_MEMORY;
        }
        if sd.is_finite() && sd > 0.0 {
            self.bins[bin_of(sd)] += 1.0;
            self.total += 1.0;
            if self.total >= HALVE_AT {
                for b in &mut self.bins {
                    *b /= 2.0;
                }
                self.total /= 2.0;
            }
        }
        let error = (if killed { 1.0 } else { 0.0 } - self.target) / self.target;
        self.ln_correction = (self.ln_correction - STEP * error).clamp(-BOUND.ln(), BOUND.ln());
        self.since_solve += 1;
        if self.since_solve >= SOLVE_EVERY {
            self.since_solve = 0;
            self.solve();
        }
    }

    /// Finds λ by bisection in log space: mean P(OOM) falls as λ grows.
    pub(super) fn solve(&mut self) {
        if self.total < 1.0 {
            return;
        }
        // The quantiles share what the far-out peaks leave of the target.
        let goal = self.effective_target();
        let goal = ((goal - self.far) / (1.0 - self.far)).max(goal * MIN_BODY_SHARE);
        let (mut lo, mut hi) = ((1e-3f64).ln(), (1e4f64).ln());
        // 30 halvings of a 16-wide log interval: λ to within 2e-8.
        for _ in 0..30 {
            let mid = 0.5 * (lo + hi);
            if self.mean_oom(mid.exp()) > goal {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.lambda = (0.5 * (lo + hi)).exp();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mean P(OOM) the quantiles give over the recorded spreads.
    fn quantiles_risk(c: &Calibration) -> f64 {
        c.mean_oom(c.lambda())
    }

    #[test]
    fn far_out_peaks_take_their_share_of_the_target_first() {
        let (mut plain, mut spiky) = (
            Calibration::new(0.03, 0.75, 0.9995, 2.0),
            Calibration::new(0.03, 0.75, 0.9995, 2.0),
        );
        for i in 0..SOLVE_EVERY * 4 {
            let sd = 0.05 + 0.3 * f64::from(i % 7) / 7.0;
            plain.record(sd, 0.0, false);
            spiky.record(sd, 0.01, false);
        }
        // Kills count nowhere yet: the correction is what 1 024 successes
        // made of it, the same for both.
        let goal = plain.effective_target();
        assert!((quantiles_risk(&plain) / goal - 1.0).abs() < 0.02);
        // With 1 % of peaks beyond any limit, the quantiles get the rest.
        let far = spiky.far;
        assert!((far - 0.01).abs() < 0.01 * 0.9);
        let body = (goal - far) / (1.0 - far);
        assert!(
            (quantiles_risk(&spiky) / body - 1.0).abs() < 0.02,
            "{} vs {body}",
            quantiles_risk(&spiky)
        );
        assert!(spiky.lambda() > plain.lambda());
    }
}
