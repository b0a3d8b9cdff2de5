//! What the predicted tail is worth: per history class and spread, where
//! first attempts' peaks really fell on the scale of the model's
//! predictive distribution, learned from the site's own record.
//!
//! A first attempt's standardized peak is `z = (ln peak − μ) / sd` under
//! the estimate its limit was priced with. For a calibrated model `z`
//! follows the predictive t distribution. Where the spread priors are too
//! wide (workloads with a sample or two on a calm site), `z` stays further
//! in; where the model is too sure (a new version of a known package, whose
//! size jumped), it runs further out. [`Tail`] keeps the recent attempts of
//! one group and fits `z ~ δ + k·T_ν` to their **upper half**: peaks above
//! the median are exact, those below count only as "below the median", and
//! OOM-killed attempts as "beyond their limit" (censored). The tail is what
//! a limit risks, so the body's shape does not dilute it.
//!
//! Some peaks land far beyond any such shape: a build that spikes to twice
//! its size, a version that jumped. No limit near the body covers them,
//! and a location-scale fit that had to would widen the whole tail for
//! them, pricing every limit as if the spread were what the spikes are. So
//! the tail is a mixture: with probability `far` a peak lands anywhere in
//! `[Z0, Z_FAR]`, else on the body `δ + k·T_ν`. A limit's risk is `far`
//! (what lies beyond it) plus the body's; limits are placed on the body
//! ([`Tail::z_for`]) and the OOM target gives the far share first
//! (`target.rs`). The fit is a maximum a posteriori estimate with priors
//! `δ ~ N(0, PRIOR_SD²)`, `ln k ~ N(0, PRIOR_SD²)` and a small far share:
//! a group with little history keeps the model's own tail.
//!
//! The record is a ring of the last `KEEP` attempts, refitted whenever an
//! eighth of it is new; it follows the site as the rest of the model does.

use super::stats;

/// Attempts kept per group.
const KEEP: usize = 1024;
/// Refit after an eighth of the record is new, within these bounds (a fit
/// is about 80 passes over the attempts in the tail).
const REFIT_EVERY: (usize, usize) = (16, 128);
/// Rounds of the coordinate-wise search per fit (the scale and the far-out
/// share trade against each other, so one round does not settle them).
const ROUNDS: usize = 2;
/// Prior sd of the offset and of the log scale factor.
const PRIOR_SD: f64 = 0.25;
/// Exact peaks below this standardized value count only as being below it.
const Z0: f64 = 1.0;
/// Far-out peaks (spikes, jumps) are spread evenly over `[Z0, Z_FAR]`.
const Z_FAR: f64 = 50.0;
/// Prior median of the far-out share, and the prior sd of its log.
const FAR_PRIOR: (f64, f64) = (0.002, 1.0);

/// One attempt: its standardized peak (exact) or limit (censored).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    z: f32,
    dof: f32,
    /// `ln` of the t density's normalizing constant at `dof`.
    ln_norm: f32,
    killed: bool,
}

/// One group's record and the tail fitted to it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tail {
    points: Vec<Point>,
    /// Next slot to overwrite once the ring is full.
    next: usize,
    since_fit: usize,
    /// Offset of the fitted tail.
    delta: f64,
    /// Scale factor of the fitted tail.
    k: f64,
    /// Share of peaks far beyond the body, which no limit near it covers.
    far: f64,
}

impl Default for Tail {
    fn default() -> Self {
        Self {
            points: Vec::new(),
            next: 0,
            since_fit: 0,
            delta: 0.0,
            k: 1.0,
            far: 0.0,
        }
    }
}

/// Share of the far-out peaks beyond the standardized point `z`.
fn far_beyond(z: f64) -> f64 {
    ((Z_FAR - z) / (Z_FAR - Z0)).clamp(0.0, 1.0)
}

impl Tail {
    /// Records a first attempt priced with `dof` degrees of freedom: its
    /// standardized peak `z_peak` when it ran through, else (killed) its
    /// standardized limit `z_limit`.
    pub(super) fn record(&mut self, z_peak: Option<f64>, z_limit: f64, dof: f64) {
        let (z, killed) = match z_peak {
            Some(z) => (z, false),
            None => (z_limit, true),
        };
        if !z.is_finite() || !dof.is_finite() {
            return;
        }
        let point = Point {
            z: z.clamp(-50.0, 50.0) as f32,
            dof: dof as f32,
            ln_norm: stats::t_ln_norm(dof) as f32,
            killed,
        };
        if self.points.len() < KEEP {
            self.points.push(point);
        } else {
            self.points[self.next] = point;
            self.next = (self.next + 1) % KEEP;
        }
        self.since_fit += 1;
        if self.since_fit >= (self.points.len() / 8).clamp(REFIT_EVERY.0, REFIT_EVERY.1) {
            self.since_fit = 0;
            self.fit();
        }
    }

    /// The fitted offset and scale factor.
    #[cfg(test)]
    fn shape(&self) -> (f64, f64) {
        (self.delta, self.k)
    }

    /// The negative log posterior of offset `delta`, log scale `ln_k` and
    /// log far-out share `ln_far` over the attempts in the tail (`tail`)
    /// and `below` attempts under [`Z0`] (with their mean degrees of
    /// freedom `below_dof`).
    fn cost(tail: &[Point], below: (f64, f64), delta: f64, ln_k: f64, ln_far: f64) -> f64 {
        let k = ln_k.exp();
        let far = ln_far.exp();
        let (n_below, below_dof) = below;
        let far_prior = (ln_far - FAR_PRIOR.0.ln()) / FAR_PRIOR.1;
        let mut nll =
            0.5 * ((delta / PRIOR_SD).powi(2) + (ln_k / PRIOR_SD).powi(2) + far_prior.powi(2));
        if n_below > 0.0 {
            let under = 1.0 - stats::t_survival((Z0 - delta) / k, below_dof);
            nll -= n_below * ((1.0 - far) * under).max(1e-300).ln();
        }
        let far_density = far / (Z_FAR - Z0);
        let (ln_near, ln_far_density) = ((1.0 - far).ln(), far_density.ln());
        for p in tail {
            let (z, dof) = (f64::from(p.z), f64::from(p.dof));
            let x = (z - delta) / k;
            nll -= if p.killed {
                (far * far_beyond(z) + (1.0 - far) * stats::t_survival(x, dof))
                    .max(1e-300)
                    .ln()
            } else {
                let ln_body = ln_near + f64::from(p.ln_norm)
                    - 0.5 * (dof + 1.0) * (x * x / dof).ln_1p()
                    - ln_k;
                // Where the body's density dwarfs the far-out one (most
                // peaks), the mixture is the body's.
                if ln_body > ln_far_density + 12.0 {
                    ln_body
                } else {
                    (far_density + ln_body.exp()).max(1e-300).ln()
                }
            };
        }
        nll
    }

    /// Coordinate-wise golden-section search of the posterior mode, from
    /// the last one.
    fn fit(&mut self) {
        let tail: Vec<Point> = self
            .points
            .iter()
            .filter(|p| p.killed || f64::from(p.z) >= Z0)
            .copied()
            .collect();
        let n_below = (self.points.len() - tail.len()) as f64;
        let below_dof = self
            .points
            .iter()
            .filter(|p| !p.killed && f64::from(p.z) < Z0)
            .map(|p| f64::from(p.dof))
            .sum::<f64>()
            / n_below.max(1.0);
        let below = (n_below, below_dof.max(1.0));
        let golden = |f: &dyn Fn(f64) -> f64, mut lo: f64, mut hi: f64| {
            let r = 0.618_033_988_749_895;
            let mut a = hi - r * (hi - lo);
            let mut b = lo + r * (hi - lo);
            let (mut fa, mut fb) = (f(a), f(b));
            for _ in 0..14 {
                if fa < fb {
                    hi = b;
                    b = a;
                    fb = fa;
                    a = hi - r * (hi - lo);
                    fa = f(a);
                } else {
                    lo = a;
                    a = b;
                    fa = fb;
                    b = lo + r * (hi - lo);
                    fb = f(b);
                }
            }
            0.5 * (lo + hi)
        };
        let (mut delta, mut ln_k) = (self.delta, self.k.ln());
        let mut ln_far = if self.far > 0.0 {
            self.far.ln()
        } else {
            FAR_PRIOR.0.ln()
        };
        for _ in 0..ROUNDS {
            delta = golden(
                &|d| Self::cost(&tail, below, d, ln_k, ln_far),
                (delta - 0.75).max(-1.5),
                (delta + 0.75).min(2.5),
            );
            ln_k = golden(
                &|l| Self::cost(&tail, below, delta, l, ln_far),
                (ln_k - 0.6).max(-1.2),
                (ln_k + 0.6).min(1.2),
            );
            ln_far = golden(
                &|f| Self::cost(&tail, below, delta, ln_k, f),
                (ln_far - 1.5).max(1e-5f64.ln()),
                (ln_far + 1.5).min(0.2f64.ln()),
            );
        }
        self.delta = delta;
        self.k = ln_k.exp();
        self.far = ln_far.exp();
    }

    /// P(peak beyond the standardized point `z`) for an estimate with
    /// `dof` degrees of freedom: the calibrated P(OOM) of a limit there,
    /// far-out peaks included.
    pub(super) fn survival(&self, z: f64, dof: f64) -> f64 {
        self.far * far_beyond(z)
            + (1.0 - self.far) * stats::t_survival((z - self.delta) / self.k, dof)
    }

    /// The standardized point beyond which the body of the tail (far-out
    /// peaks aside, which no limit near it covers) lies with probability `p`.
    pub(super) fn z_for(&self, p: f64, dof: f64) -> f64 {
        self.delta + self.k * stats::t_quantile(1.0 - p, dof)
    }

    /// How much wider (> 1) or narrower the body is than the estimate says.
    pub(super) fn scale(&self) -> f64 {
        self.k
    }

    /// The share of far-out peaks, which limits near the body cannot cover.
    pub(super) fn far(&self) -> f64 {
        self.far
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records `n` attempts whose standardized peaks are normal quantiles
    /// `delta + k·Φ⁻¹(u)` on an even grid of `u`, in a scrambled order,
    /// killed beyond `z_limit`.
    fn fill(tail: &mut Tail, n: usize, delta: f64, k: f64, z_limit: f64) {
        for i in 0..n {
            // 7919 is prime and does not divide n: each grid point once.
            let u = ((i * 7919) % n) as f64 / n as f64 + 0.5 / n as f64;
            let z = delta + k * stats::normal_quantile(u);
            let peak = (z <= z_limit).then_some(z);
            tail.record(peak, z_limit, 1e6);
        }
    }

    #[test]
    fn with_no_record_the_models_tail_stands() {
        let tail = Tail::default();
        assert_eq!(tail.shape(), (0.0, 1.0));
        assert!((tail.survival(1.88, 1e6) - 0.03).abs() < 1e-3);
    }

    #[test]
    fn a_calibrated_record_keeps_the_tail() {
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.0, 1.0, 1.88);
        // What the model's 3 % point is said to risk.
        let p = tail.survival(1.88, 1e6);
        assert!((p / 0.03 - 1.0).abs() < 0.2, "{p} from {:?}", tail.shape());
    }

    #[test]
    fn a_spread_twice_too_wide_is_found_and_priced() {
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.0, 0.5, 1.88);
        let (_, k) = tail.shape();
        assert!((k - 0.5).abs() < 0.06, "{k}");
        // The model's 3 % point risks far less; 3 % lies further in.
        assert!(tail.survival(1.88, 1e6) < 0.003);
        assert!((tail.z_for(0.03, 1e6) - 0.94).abs() < 0.1);
    }

    #[test]
    fn kills_beyond_a_shifted_tail_push_the_limit_out() {
        // Sizes jumped by half an sd: the model's 3 % point risks ~8 %.
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.5, 1.0, 1.88);
        let p = tail.survival(1.88, 1e6);
        assert!((p / 0.085 - 1.0).abs() < 0.25, "{p}");
        let z = tail.z_for(0.03, 1e6);
        assert!(z > 2.2, "{z}");
    }

    #[test]
    fn peaks_far_beyond_are_a_floor_no_limit_buys_off() {
        // A calibrated body, limits at three points of it, and 1.5 % of
        // attempts spiking far out (killed whatever the limit).
        let mut tail = Tail::default();
        for round in 0..4 {
            for (j, z_limit) in [2.0, 2.6, 3.2].into_iter().enumerate() {
                let n = 340;
                for i in 0..n {
                    let spike = (i + 97 * j + 31 * round) % 67 == 0;
                    let u = ((i * 7919) % n) as f64 / n as f64 + 0.5 / n as f64;
                    let z = if spike {
                        20.0
                    } else {
                        stats::normal_quantile(u)
                    };
                    tail.record((z <= z_limit).then_some(z), z_limit, 1e6);
                }
            }
        }
        let far = tail.far();
        assert!(
            (far / 0.015 - 1.0).abs() < 0.5,
            "{far} from {:?}",
            tail.shape()
        );
        // The body stays the model's: its 3 % point is where it was...
        assert!((tail.z_for(0.03, 1e6) - 1.88).abs() < 0.25);
        // ... and what a limit risks never falls below the far share.
        assert!(tail.survival(6.0, 1e6) >= 0.85 * far);
        let at_body = tail.survival(1.88, 1e6);
        assert!((at_body / (0.03 + far) - 1.0).abs() < 0.3, "{at_body}");
    }

    #[test]
    fn survival_and_its_inverse_agree() {
        let mut tail = Tail::default();
        fill(&mut tail, 700, 0.2, 1.3, 2.0);
        for p in [0.2, 0.05, 0.02, 0.01, 0.002] {
            // What the body leaves beyond its point, far-out peaks aside.
            let z = tail.z_for(p, 8.0);
            let back = (tail.survival(z, 8.0) - tail.far() * far_beyond(z)) / (1.0 - tail.far());
            // Two approximations (the t tail and its quantile) meet.
            assert!((back / p - 1.0).abs() < 0.05, "{p}: {back}");
        }
    }
}
