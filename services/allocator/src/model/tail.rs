//! What the predicted tail is worth: per history class, spread and ladder
//! depth, where first attempts' peaks really fell on the scale of the model's
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
//! The body's degrees of freedom `ν` are learned too, not taken from the
//! estimate. An estimate's t has `3 +` its effective residual count, so a
//! workload with fifty builds is priced nearly normal and one with five
//! with heavy tails. The site's standardized peaks do not follow that:
//! beyond two sds they run out about as often whatever the count (a spread
//! that drifts, a location that moves between builds, a spread estimated
//! too narrow: none of it shrinks with more samples), so a limit of a
//! workload with a long history was stated safer than it was, and one with
//! a short history less safe. Each class's pooled tail fits one `ν`, drawn
//! towards its estimates' own (the mean `ln` of their degrees of freedom,
//! [`NU_SD`]) and kept within [`NU_BOUNDS`]; each group's is drawn towards
//! its class's. Until a group or its class has a fit, the body is the
//! estimate's own t. The newsvendor, which chooses each limit's risk on a
//! normal, is given the spread of the normal that puts its 3 % point where
//! the learned body does ([`Shape::normal_scale`]): covering a heavy body's
//! far tail costs more slack than its scale says, so it is given a lower
//! quantile.
//!
//! Some peaks land far beyond any such shape: a build that spikes to twice
//! its size, a version that jumped. No limit near the body covers them,
//! and a location-scale fit that had to would widen the whole tail for
//! them, pricing every limit as if the spread were what the spikes are. So
//! the tail is a mixture: with probability `far` a peak lands anywhere in
//! `[Z0, Z_FAR]`, else on the body `δ + k·T_ν`. A limit's risk is `far`
//! (what lies beyond it) plus the body's; limits are placed on the body
//! ([`Shape::z_for`]) and the OOM target gives the far share first
//! (`target.rs`).
//!
//! Each fit is a maximum a posteriori estimate, and the priors are two
//! levels deep ([`ClassTails`]). A history class's tail is pooled over all
//! its groups, with a log scale that may run with the spread
//! (`ln k = a + b·spread group`), drawn towards the model's own tail
//! (`δ, a, b ~ N(0, PRIOR_SD²)`, a small far share). Each group's tail is
//! drawn towards its class's at its spread (`GROUP_SD`). Most groups see a
//! few hundred attempts a month; alone, their priors held them near the
//! model's own tail, so a class whose every group ran further out than
//! the model said was under-stated in all of them. Borrowing from the
//! class, a group with little record states its class's risk, and a busy
//! one follows its own. A group with no fit yet is priced as its class.
//!
//! A group's tail is fitted to where its peaks fell, and the risk it
//! states at a limit is a reading of that fit in its far tail. Within a
//! group the limits are not all alike: the newsvendor gives the estimates
//! with the smallest spread the furthest limits, and those are also the
//! estimates whose spread is most often too small (each workload's spread
//! is itself an estimate). So the lowest stated risks run under what
//! happens and the highest over it, though every group's fit is right on
//! average. Each class therefore checks its limits themselves: it keeps
//! its last checked limits (where each stood on its group's body, the
//! spread of its estimate, and whether it was killed) and fits a
//! restatement of the body's risk,
//! `logit p' = PIVOT + shift + by_spread·ln(sd / SPREAD_PIVOT) + slope·(logit p − PIVOT)`,
//! drawn towards the identity ([`Restate`]). Limits are placed and priced
//! on the restated risk, so a stated 1 % is what a class's 1 % limits
//! realized. The term in the spread is there because one class's spreads
//! miss by different amounts: a wide estimate of a workload with a sample
//! or two is wider than its builds vary, and a narrow one of a new variant
//! of a calm package is narrower than how far variants sit apart. The
//! spread groups' tails take most of that, but each group spans a range
//! of spreads and the same risk is stated at every one of them.
//!
//! Each record is a ring of the last attempts, refitted whenever a share
//! of it is new; it follows the site as the rest of the model does. While
//! the history is replayed at start-up the records refit less often, and
//! each once at the end ([`ClassTails::set_replaying`]).

use super::ring::Ring;
use super::stats;

/// Attempts kept per group, and refit when an eighth of them is new.
const KEEP: (usize, usize) = (4096, 8);
/// Attempts kept for a history class's pooled tail, and refit when half
/// of them is new (its groups follow the site in between).
const KEEP_POOLED: (usize, usize) = (8192, 2);
/// While a history is replayed, records refit when half of them is new:
/// nothing is served until the replay ends, and each is refitted then.
const REPLAY_REFIT_SHARE: usize = 2;
/// Refit after this many new attempts at least (a fit is about 60 passes
/// over the attempts in the tail).
const REFIT_EVERY: usize = 16;
/// Rounds of the coordinate-wise search per fit (the scale and the far-out
/// share trade against each other, so one round does not settle them).
const ROUNDS: usize = 2;
/// Steps of each golden-section search (from a bracket of 1.2–3 wide, to
/// within 1 %).
const GOLDEN_STEPS: usize = 10;
/// Prior sd of the pooled offset, log scale factor and its slope by spread.
const PRIOR_SD: f64 = 0.25;
/// How far a group's offset and log scale (sd), its log far-out share and
/// its log tail weight are drawn towards its class's pooled tail at the
/// group's spread.
const GROUP_SD: (f64, f64, f64) = (0.15, 0.5, 0.7);
/// Spread groups a class's tails may have.
const SPREADS_AT_MOST: usize = 8;
/// Checked limits kept per history class for its restatement, refit when
/// an eighth of them is new.
const KEEP_CHECKS: (usize, usize) = (4096, 8);
/// The risk a restatement pivots about (`logit 2 %`): near where limits
/// stand, so its shift and slope hardly trade.
const PIVOT: f64 = -3.891_820_298_110_627;
/// Prior sd of a restatement's shift, its slope and its term in the
/// spread, about the identity.
const RESTATE_SD: (f64, f64, f64) = (0.5, 0.25, 0.5);
/// The predictive spread (log-space sd) a restatement's term in it pivots
/// about: the middle of the spread groups.
const SPREAD_PIVOT: f64 = 0.2;
/// A restatement's shift and its term in the spread stay within ±1.5, its
/// slope within [1/2, 2].
const RESTATE_BOUNDS: (f64, f64) = (1.5, 2.0);
/// Fisher-scoring steps of a restatement at most.
const RESTATE_STEPS: usize = 8;
/// Prior sd of a class's log tail weight `ln ν` about its estimates' own.
const NU_SD: f64 = 1.0;
/// A tail weight stays within 4 – 10⁴: under 4 a t has no fourth moment,
/// and limits far out on it would run away.
const NU_BOUNDS: (f64, f64) = (1.386_294_361_119_890_6, 9.210_340_371_976_184);
/// The body's risk at which its weight is read as a normal spread for the
/// newsvendor ([`Shape::normal_scale`]): where limits mostly stand.
const P_SPREAD: f64 = 0.03;
/// Exact peaks below this standardized value count only as being below it.
const Z0: f64 = 1.0;
/// Far-out peaks (spikes, jumps) are spread evenly over `[Z0, Z_FAR]`.
const Z_FAR: f64 = 50.0;

/// A fitted tail: where first attempts' standardized peaks fall.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Shape {
    /// Offset of the body.
    delta: f64,
    /// Scale factor of the body.
    k: f64,
    /// Share of peaks far beyond the body, which no limit near it covers.
    far: f64,
    /// The body's degrees of freedom, learned; infinite for the model's
    /// own tail, whose body has each estimate's ([`body_dof`]).
    nu: f64,
    /// How the class's record restates the body's risk at a limit.
    restate: Restate,
}

impl Default for Shape {
    /// The model's own tail.
    fn default() -> Self {
        Self {
            delta: 0.0,
            k: 1.0,
            far: 0.0,
            nu: f64::INFINITY,
            restate: Restate::default(),
        }
    }
}

/// The degrees of freedom of a body of tail weight `nu` for an estimate
/// with `dof` of its own: `nu` once learned, else the estimate's.
fn body_dof(dof: f64, nu: f64) -> f64 {
    if nu.is_finite() { nu } else { dof }
}

/// Share of the far-out peaks beyond the standardized point `z`.
fn far_beyond(z: f64) -> f64 {
    ((Z_FAR - z) / (Z_FAR - Z0)).clamp(0.0, 1.0)
}

impl Shape {
    /// P(peak beyond the standardized point `z`) for an estimate with
    /// `dof` degrees of freedom and predictive spread `spread`: the
    /// calibrated P(OOM) of a limit there, far-out peaks included.
    pub(super) fn survival(&self, z: f64, dof: f64, spread: f64) -> f64 {
        self.far * far_beyond(z) + (1.0 - self.far) * self.restate.of(self.body(z, dof), spread)
    }

    /// What the fitted body leaves beyond `z`, before the restatement.
    fn body(&self, z: f64, dof: f64) -> f64 {
        stats::t_survival((z - self.delta) / self.k, body_dof(dof, self.nu))
    }

    /// The standardized point beyond which the body of the tail (far-out
    /// peaks aside, which no limit near it covers) lies with probability `p`,
    /// for an estimate as [`Shape::survival`] takes it.
    pub(super) fn z_for(&self, p: f64, dof: f64, spread: f64) -> f64 {
        let body = self.restate.inverse(p, spread);
        self.delta + self.k * stats::t_quantile(1.0 - body, body_dof(dof, self.nu))
    }

    /// How much wider (> 1) or narrower the body is than the estimate says.
    #[cfg(test)]
    fn scale(&self) -> f64 {
        self.k
    }

    /// How much wider or narrower than the estimate says a normal must be
    /// to put its [`P_SPREAD`] point where the body does: the spread the
    /// newsvendor prices slack with. A learned body heavier than normal
    /// covers its far tail at a high price, so it is given a lower
    /// quantile, as a wider normal would be.
    pub(super) fn normal_scale(&self) -> f64 {
        if self.nu.is_finite() {
            self.k * t_normal_scale(self.nu)
        } else {
            self.k
        }
    }

    /// The share of far-out peaks, which limits near the body cannot cover.
    pub(super) fn far(&self) -> f64 {
        self.far
    }
}

/// How much wider than its scale a normal must be to put its [`P_SPREAD`]
/// point where a t of `dof` degrees of freedom does.
pub(super) fn t_normal_scale(dof: f64) -> f64 {
    stats::t_quantile(1.0 - P_SPREAD, dof) / stats::normal_quantile(1.0 - P_SPREAD)
}

/// A fit's parameters: the body's offset, its log scale factor at the
/// spread group `centre` and the slope of that log scale by spread group
/// (the pooled tail of a class spans them, a group's own does not), and
/// the log far-out share.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Fit {
    delta: f64,
    ln_k: f64,
    slope: f64,
    ln_far: f64,
    ln_nu: f64,
}

impl Fit {
    fn shape_at(&self, spread: f64) -> Shape {
        Shape {
            delta: self.delta,
            k: (self.ln_k + self.slope * spread).exp(),
            far: self.ln_far.exp(),
            nu: self.ln_nu.exp(),
            restate: Restate::default(),
        }
    }
}

/// What a fit is drawn towards, and how hard.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Prior {
    centre: Fit,
    /// The spread group the log scale `centre.ln_k` stands at.
    spread: f64,
    /// Sd of the offset, the log scale and its slope about their centre.
    sd: f64,
    far_sd: f64,
    nu_sd: f64,
    /// Whether the log tail weight is drawn towards the record's own
    /// estimates' (the mean `ln` of their degrees of freedom) rather than
    /// `centre`'s.
    own_nu: bool,
}

/// The model's own tail, with a small far-out share (median 0.2 %, an sd
/// of its log of 1) and a body of the estimates' own degrees of freedom:
/// what a history class's pooled tail is drawn towards.
const MODEL_PRIOR: Prior = Prior {
    centre: Fit {
        delta: 0.0,
        ln_k: 0.0,
        slope: 0.0,
        ln_far: -6.214_608_098_422_191,
        ln_nu: NU_BOUNDS.1,
    },
    spread: 0.0,
    sd: PRIOR_SD,
    far_sd: 1.0,
    nu_sd: NU_SD,
    own_nu: true,
};

/// One attempt: its standardized peak (exact) or limit (censored).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    z: f32,
    /// `ln` of its estimate's degrees of freedom.
    ln_dof: f32,
    killed: bool,
    /// The spread group of its estimate.
    spread: u8,
}

/// A ring of the last attempts, and when it is due a refit.
#[derive(Debug, Clone, PartialEq)]
struct Record<T = Point> {
    points: Ring<T>,
    /// Refit when this share of the record is new (1 / `refit_share`).
    refit_share: usize,
    since_fit: usize,
}

impl<T> Record<T> {
    fn keeping((keep, refit_share): (usize, usize)) -> Self {
        Self {
            points: Ring::new(keep),
            refit_share,
            since_fit: 0,
        }
    }

    /// Keeps `point`; whether the record is due a refit (less often while
    /// `replaying`).
    fn push(&mut self, point: T, replaying: bool) -> bool {
        self.points.push(point);
        self.since_fit += 1;
        let share = if replaying {
            REPLAY_REFIT_SHARE.min(self.refit_share)
        } else {
            self.refit_share
        };
        let due = self.since_fit >= (self.points.len() / share).max(REFIT_EVERY);
        if due {
            self.since_fit = 0;
        }
        due
    }
}

impl Record {
    /// The negative log posterior of `fit` over the attempts in the tail
    /// (`tail`) and those under [`Z0`] (`below`: how many, by spread
    /// group); `free_slope` when the slope is fitted too.
    fn cost(tail: &[Point], below: &[f64], prior: &Prior, fit: &Fit, free_slope: bool) -> f64 {
        let c = &prior.centre;
        let mut nll = 0.5
            * (((fit.delta - c.delta) / prior.sd).powi(2)
                + ((fit.ln_k - c.ln_k) / prior.sd).powi(2)
                + ((fit.ln_far - c.ln_far) / prior.far_sd).powi(2)
                + ((fit.ln_nu - c.ln_nu) / prior.nu_sd).powi(2));
        if free_slope {
            nll += 0.5 * ((fit.slope - c.slope) / prior.sd).powi(2);
        }
        let (far, dof) = (fit.ln_far.exp(), fit.ln_nu.exp());
        let ln_norm = stats::t_ln_norm(dof);
        let mut ln_ks = [0.0; SPREADS_AT_MOST];
        let mut inv_ks = [0.0; SPREADS_AT_MOST];
        for (s, &n_below) in below.iter().enumerate() {
            ln_ks[s] = fit.ln_k + fit.slope * (s as f64 - prior.spread);
            inv_ks[s] = (-ln_ks[s]).exp();
            if n_below > 0.0 {
                let under = 1.0 - stats::t_survival((Z0 - fit.delta) * inv_ks[s], dof);
                nll -= n_below * ((1.0 - far) * under).max(1e-300).ln();
            }
        }
        let far_density = far / (Z_FAR - Z0);
        let (ln_near, ln_far_density) = ((1.0 - far).ln(), far_density.ln());
        for p in tail {
            let z = f64::from(p.z);
            let spread = usize::from(p.spread);
            let (ln_k, x) = (ln_ks[spread], (z - fit.delta) * inv_ks[spread]);
            nll -= if p.killed {
                (far * far_beyond(z) + (1.0 - far) * stats::t_survival(x, dof))
                    .max(1e-300)
                    .ln()
            } else {
                let ln_body = ln_near + ln_norm - 0.5 * (dof + 1.0) * (x * x / dof).ln_1p() - ln_k;
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

    /// The posterior mode by a coordinate-wise golden-section search from
    /// `start` (else the prior's centre); the slope by spread group only if
    /// `free_slope`.
    fn fit(&self, prior: &Prior, start: Option<Fit>, free_slope: bool) -> Fit {
        let mut prior = *prior;
        if prior.own_nu && !self.points.is_empty() {
            let sum: f64 = self.points.iter().map(|p| f64::from(p.ln_dof)).sum();
            prior.centre.ln_nu = (sum / self.points.len() as f64).clamp(NU_BOUNDS.0, NU_BOUNDS.1);
        }
        let prior = &prior;
        let start = start.unwrap_or(prior.centre);
        let tail: Vec<Point> = self
            .points
            .iter()
            .filter(|p| p.killed || f64::from(p.z) >= Z0)
            .copied()
            .collect();
        let groups = self
            .points
            .iter()
            .map(|p| usize::from(p.spread) + 1)
            .max()
            .unwrap_or(1);
        let mut below = [0.0f64; SPREADS_AT_MOST];
        for p in self
            .points
            .iter()
            .filter(|p| !p.killed && f64::from(p.z) < Z0)
        {
            below[usize::from(p.spread)] += 1.0;
        }
        let below = &below[..groups];
        let golden = |f: &dyn Fn(f64) -> f64, mut lo: f64, mut hi: f64| {
            let r = 0.618_033_988_749_895;
            let mut a = hi - r * (hi - lo);
            let mut b = lo + r * (hi - lo);
            let (mut fa, mut fb) = (f(a), f(b));
            for _ in 0..GOLDEN_STEPS {
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
        let cost = |fit: &Fit| Self::cost(&tail, below, prior, fit, free_slope);
        // One parameter of `fit` searched within `reach` of where it is
        // and within `bounds`, the others held.
        let search =
            |fit: &mut Fit, field: fn(&mut Fit) -> &mut f64, reach: f64, bounds: (f64, f64)| {
                let at = *field(fit);
                let held = *fit;
                *field(fit) = golden(
                    &|v| {
                        let mut trial = held;
                        *field(&mut trial) = v;
                        cost(&trial)
                    },
                    (at - reach).max(bounds.0),
                    (at + reach).min(bounds.1),
                );
            };
        let mut fit = start;
        for _ in 0..ROUNDS {
            search(&mut fit, |f| &mut f.delta, 0.75, (-1.5, 2.5));
            search(&mut fit, |f| &mut f.ln_k, 0.6, (-1.2, 1.2));
            if free_slope {
                search(&mut fit, |f| &mut f.slope, 0.3, (-0.6, 0.6));
            }
            search(
                &mut fit,
                |f| &mut f.ln_far,
                1.5,
                (1e-5f64.ln(), 0.2f64.ln()),
            );
            search(&mut fit, |f| &mut f.ln_nu, 1.5, NU_BOUNDS);
        }
        fit
    }
}

/// One group's record and the tail fitted to it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Tail {
    record: Record,
    /// The last fit, once there is one.
    fit: Option<Fit>,
    shape: Shape,
}

impl Default for Tail {
    fn default() -> Self {
        Self {
            record: Record::keeping(KEEP),
            fit: None,
            shape: Shape::default(),
        }
    }
}

impl Tail {
    /// Records an attempt of this group; refits towards `prior` when due.
    fn push(&mut self, point: Point, prior: &Prior, replaying: bool) {
        // One group, one spread: its own record has no slope to fit.
        if self.record.push(Point { spread: 0, ..point }, replaying) {
            self.refit(prior);
        }
    }

    /// Fits the record afresh, towards `prior`.
    fn refit(&mut self, prior: &Prior) {
        let fit = self.record.fit(prior, self.fit, false);
        self.fit = Some(fit);
        self.shape = fit.shape_at(0.0);
    }

    /// The tail fitted, or the model's own before any fit.
    pub(super) fn shape(&self) -> &Shape {
        &self.shape
    }
}

/// How a class's record restates the risk its groups' bodies give a
/// limit of an estimate with predictive spread `sd`, which stands at
/// `x = spread_at(sd)`:
/// `logit p' = PIVOT + shift + by_spread·x + slope·(logit p − PIVOT)`,
/// with `x` held within the spreads of the record it was fitted on (a
/// spread no checked limit had is not extrapolated to). The identity
/// until the class has a record.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Restate {
    shift: f64,
    slope: f64,
    by_spread: f64,
    /// The least and greatest `x` of the record.
    spreads: (f64, f64),
}

impl Default for Restate {
    fn default() -> Self {
        Self {
            shift: 0.0,
            slope: 1.0,
            by_spread: 0.0,
            spreads: (0.0, 0.0),
        }
    }
}

fn logit(p: f64) -> f64 {
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    (p / (1.0 - p)).ln()
}

fn expit(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Where a predictive spread stands for a restatement: `ln` of it over
/// [`SPREAD_PIVOT`].
fn spread_at(spread: f64) -> f64 {
    (spread.max(1e-3) / SPREAD_PIVOT).ln()
}

impl Restate {
    /// The restated risk of a body that leaves `p` beyond a limit of an
    /// estimate with predictive spread `sd`.
    fn of(&self, p: f64, sd: f64) -> f64 {
        if *self == Self::default() {
            return p;
        }
        expit(PIVOT + self.offset(sd) + self.slope * (logit(p) - PIVOT))
    }

    /// The body's own risk that restates as `p` (as [`Restate::of`]).
    fn inverse(&self, p: f64, sd: f64) -> f64 {
        if *self == Self::default() {
            return p;
        }
        expit(PIVOT + (logit(p) - PIVOT - self.offset(sd)) / self.slope)
    }

    /// The shift at predictive spread `sd`, within the record's spreads.
    fn offset(&self, sd: f64) -> f64 {
        let x = spread_at(sd).max(self.spreads.0).min(self.spreads.1);
        self.shift + self.by_spread * x
    }
}

/// One checked limit of a class: where it stood on its group's body
/// (`logit` of the risk beyond it, less [`PIVOT`]), where its estimate's
/// spread stood ([`spread_at`]), the risk of far-out peaks beyond it and
/// the body's share, and whether it was killed.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Check {
    at: f32,
    spread: f32,
    far: f32,
    near: f32,
    killed: bool,
}

impl Record<Check> {
    /// The posterior mode of the restatement by Fisher scoring from
    /// `start`: the kills of the checked limits against what their
    /// bodies said, drawn towards the identity by [`RESTATE_SD`].
    fn restate(&self, start: Restate) -> Restate {
        let spreads = self
            .points
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), c| {
                let x = f64::from(c.spread);
                (lo.min(x), hi.max(x))
            });
        let mut r = Restate { spreads, ..start };
        for _ in 0..RESTATE_STEPS {
            let (mut g, mut i) = ([0.0f64; 3], [[0.0f64; 3]; 3]);
            for c in self.points.iter() {
                let (u, far, near) = (f64::from(c.at), f64::from(c.far), f64::from(c.near));
                let x = f64::from(c.spread);
                let s = expit(PIVOT + r.shift + r.by_spread * x + r.slope * u);
                let p = (far + near * s).clamp(1e-12, 1.0 - 1e-12);
                // d p / d η, and the score and information in η.
                let dp = near * s * (1.0 - s);
                let score = if c.killed { 1.0 / p } else { -1.0 / (1.0 - p) } * dp;
                let info = dp * dp / (p * (1.0 - p));
                let d = [1.0, u, x];
                for (a, row) in d.iter().zip(&mut i) {
                    for (b, cell) in d.iter().zip(row) {
                        *cell += info * a * b;
                    }
                }
                for (a, gain) in d.iter().zip(&mut g) {
                    *gain += score * a;
                }
            }
            let (sd_shift, sd_slope, sd_by_spread) = RESTATE_SD;
            let off = [r.shift, r.slope - 1.0, r.by_spread];
            for (a, sd) in [sd_shift, sd_slope, sd_by_spread].into_iter().enumerate() {
                g[a] -= off[a] / sd.powi(2);
                i[a][a] += 1.0 / sd.powi(2);
            }
            let Some(step) = stats::solve(i, g) else {
                break;
            };
            r.shift = (r.shift + step[0]).clamp(-RESTATE_BOUNDS.0, RESTATE_BOUNDS.0);
            r.slope = (r.slope + step[1]).clamp(1.0 / RESTATE_BOUNDS.1, RESTATE_BOUNDS.1);
            r.by_spread = (r.by_spread + step[2]).clamp(-RESTATE_BOUNDS.0, RESTATE_BOUNDS.0);
            if step.iter().all(|s| s.abs() < 1e-4) {
                break;
            }
        }
        r
    }
}

/// A first attempt priced with `dof` degrees of freedom, of spread group
/// `spread`: its standardized peak `z_peak` when it ran through, else
/// (killed) its standardized limit `z_limit`.
fn point(z_peak: Option<f64>, z_limit: f64, dof: f64, spread: usize) -> Option<Point> {
    let (z, killed) = match z_peak {
        Some(z) => (z, false),
        None => (z_limit, true),
    };
    (z.is_finite() && dof.is_finite()).then(|| Point {
        z: z.clamp(-50.0, 50.0) as f32,
        ln_dof: dof.max(1.0).ln() as f32,
        killed,
        spread: spread.min(SPREADS_AT_MOST - 1) as u8,
    })
}

/// The tails of one history class, by spread group and ladder depth, and
/// pooled over all of them with a log scale that may run with spread: a
/// group with little record borrows its class's tail at its spread, and
/// a busy one follows its own.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ClassTails<const SPREADS: usize, const DEPTHS: usize> {
    pooled: Record,
    pooled_fit: Option<Fit>,
    checks: Record<Check>,
    restate: Restate,
    /// The pooled tail at each spread group.
    at: [Shape; SPREADS],
    replaying: bool,
    groups: [[Tail; DEPTHS]; SPREADS],
}

impl<const SPREADS: usize, const DEPTHS: usize> Default for ClassTails<SPREADS, DEPTHS> {
    fn default() -> Self {
        const { assert!(SPREADS <= SPREADS_AT_MOST) };
        Self {
            pooled: Record::keeping(KEEP_POOLED),
            pooled_fit: None,
            checks: Record::keeping(KEEP_CHECKS),
            restate: Restate::default(),
            at: [Shape::default(); SPREADS],
            replaying: false,
            groups: std::array::from_fn(|_| std::array::from_fn(|_| Tail::default())),
        }
    }
}

impl<const SPREADS: usize, const DEPTHS: usize> ClassTails<SPREADS, DEPTHS> {
    /// Records a first attempt of spread group `spread` at ladder depth
    /// `depth` (as [`point`] takes it), whose estimate had `dof` degrees of
    /// freedom and predictive spread `sd_pred`.
    pub(super) fn record(
        &mut self,
        (spread, depth): (usize, usize),
        z_peak: Option<f64>,
        z_limit: f64,
        dof: f64,
        sd_pred: f64,
    ) {
        let Some(point) = point(z_peak, z_limit, dof, spread) else {
            return;
        };
        // Where the limit stood on the body it was priced with.
        let shape = self.unrestated((spread, depth));
        let check = Check {
            at: (logit(shape.body(z_limit, dof)) - PIVOT) as f32,
            spread: spread_at(sd_pred) as f32,
            far: (shape.far * far_beyond(z_limit)) as f32,
            near: (1.0 - shape.far) as f32,
            killed: point.killed,
        };
        if self.checks.push(check, self.replaying) {
            self.restate = self.checks.restate(self.restate);
        }
        if self.pooled.push(point, self.replaying) {
            self.refit_pooled();
        }
        let prior = self.group_prior(spread);
        self.groups[spread][depth].push(point, &prior, self.replaying);
    }

    /// Whether a history is being replayed: records refit less often
    /// until it ends, and then every one of them is refitted.
    pub(super) fn set_replaying(&mut self, replaying: bool) {
        let ended = self.replaying && !replaying;
        self.replaying = replaying;
        if !ended {
            return;
        }
        // Only what a live model would have fitted by now: a record under
        // `REFIT_EVERY` attempts has never been, and a restarted allocator
        // answers as the one that saw the same history live.
        if self.pooled_fit.is_some() {
            self.refit_pooled();
        }
        if self.checks.points.len() >= REFIT_EVERY {
            self.restate = self.checks.restate(self.restate);
        }
        for spread in 0..SPREADS {
            let prior = self.group_prior(spread);
            for tail in &mut self.groups[spread] {
                if tail.fit.is_some() {
                    tail.refit(&prior);
                }
            }
        }
    }

    /// The pooled log scale stands at the middle spread group.
    const MIDDLE: f64 = (SPREADS as f64 - 1.0) / 2.0;

    fn refit_pooled(&mut self) {
        let prior = Prior {
            spread: Self::MIDDLE,
            ..MODEL_PRIOR
        };
        let fit = self.pooled.fit(&prior, self.pooled_fit, true);
        self.pooled_fit = Some(fit);
        self.at = std::array::from_fn(|s| fit.shape_at(s as f64 - Self::MIDDLE));
    }

    /// What a group of spread group `spread` is drawn towards: the pooled
    /// tail at its spread, or the model's own before there is one.
    fn group_prior(&self, spread: usize) -> Prior {
        match self.pooled_fit {
            Some(fit) => Prior {
                centre: Fit {
                    ln_k: fit.ln_k + fit.slope * (spread as f64 - Self::MIDDLE),
                    slope: 0.0,
                    ..fit
                },
                spread: 0.0,
                sd: GROUP_SD.0,
                far_sd: GROUP_SD.1,
                nu_sd: GROUP_SD.2,
                own_nu: false,
            },
            None => MODEL_PRIOR,
        }
    }

    /// The tail a limit of spread group `spread` at ladder depth `depth`
    /// is priced with: its own once fitted, else its class's at its spread,
    /// restated as the class's checked limits found it.
    pub(super) fn of(&self, group: (usize, usize)) -> Shape {
        Shape {
            restate: self.restate,
            ..self.unrestated(group)
        }
    }

    fn unrestated(&self, (spread, depth): (usize, usize)) -> Shape {
        let own = &self.groups[spread][depth];
        if own.fit.is_some() {
            *own.shape()
        } else {
            self.at[spread]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Tail {
        /// Records an attempt (as [`point`] takes it) alone, drawn
        /// towards `prior`.
        fn record(&mut self, z_peak: Option<f64>, z_limit: f64, prior: &Prior) {
            if let Some(point) = point(z_peak, z_limit, 1e6, 0) {
                self.push(point, prior, false);
            }
        }
    }

    /// Gives `record` `n` attempts whose standardized peaks are normal
    /// quantiles `delta + k·Φ⁻¹(u)` on an even grid of `u`, in a scrambled
    /// order, killed beyond `z_limit`.
    fn attempts(n: usize, delta: f64, k: f64, z_limit: f64, mut record: impl FnMut(Option<f64>)) {
        for u in grid(n) {
            let z = delta + k * stats::normal_quantile(u);
            record((z <= z_limit).then_some(z));
        }
    }

    /// `n` probabilities on an even grid, `(i + ½) / n`, in a scrambled
    /// order (7919 is prime and does not divide `n`: each point once).
    fn grid(n: usize) -> impl Iterator<Item = f64> {
        (0..n).map(move |i| ((i * 7919) % n) as f64 / n as f64 + 0.5 / n as f64)
    }

    /// A class fed by `feed` live, and one fed the same as a replay.
    fn online_and_replayed<const S: usize, const D: usize>(
        feed: impl Fn(&mut ClassTails<S, D>),
    ) -> (ClassTails<S, D>, ClassTails<S, D>) {
        let mut online = ClassTails::default();
        feed(&mut online);
        let mut replayed = ClassTails::default();
        replayed.set_replaying(true);
        feed(&mut replayed);
        replayed.set_replaying(false);
        (online, replayed)
    }

    fn fill(tail: &mut Tail, n: usize, delta: f64, k: f64, z_limit: f64) {
        attempts(n, delta, k, z_limit, |peak| {
            tail.record(peak, z_limit, &MODEL_PRIOR)
        });
    }

    #[test]
    fn with_no_record_the_models_tail_stands() {
        let tail = Tail::default();
        assert_eq!(tail.shape(), &Shape::default());
        assert!((tail.shape().survival(1.88, 1e6, SPREAD_PIVOT) - 0.03).abs() < 1e-3);
    }

    #[test]
    fn a_calibrated_record_keeps_the_tail() {
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.0, 1.0, 1.88);
        // What the model's 3 % point is said to risk.
        let p = tail.shape().survival(1.88, 1e6, SPREAD_PIVOT);
        assert!((p / 0.03 - 1.0).abs() < 0.2, "{p} from {:?}", tail.shape);
    }

    /// `n` standardized peaks of a t with `nu` degrees of freedom, on an
    /// even grid of quantiles in a scrambled order (as [`attempts`]).
    fn t_peaks(n: usize, nu: f64) -> impl Iterator<Item = f64> {
        grid(n).map(move |u| stats::t_quantile(u, nu))
    }

    #[test]
    fn a_tail_heavier_than_its_estimates_say_is_learned() {
        // The estimates say normal; the peaks follow a t with 5 degrees
        // of freedom, with limits far enough out to see it.
        let mut tail = Tail::default();
        for z in t_peaks(2048, 5.0) {
            tail.record((z <= 4.0).then_some(z), 4.0, &MODEL_PRIOR);
        }
        // The normal's 0.13 % beyond 3 sds is 3 % on that t.
        let real = stats::t_survival(3.0, 5.0);
        let said = tail.shape().survival(3.0, 1e6, SPREAD_PIVOT);
        assert!(
            (said / real - 1.0).abs() < 0.3,
            "{said} against {real} from {:?}",
            tail.shape
        );
    }

    #[test]
    fn a_heavy_body_is_priced_as_wide_as_its_limits_stand() {
        // Two classes put their 3 % point at the same place: one's peaks
        // on a t with 5 degrees of freedom, as its estimates say, the
        // other's on a normal that much wider than its estimates say.
        let wide = stats::t_quantile(0.97, 5.0) / stats::normal_quantile(0.97);
        let mut heavy = ClassTails::<1, 1>::default();
        for z in t_peaks(2048, 5.0) {
            heavy.record((0, 0), (z <= 4.0).then_some(z), 4.0, 5.0, SPREAD_PIVOT);
        }
        let mut normal = ClassTails::<1, 1>::default();
        attempts(2048, 0.0, wide, 4.0, |peak| {
            normal.record((0, 0), peak, 4.0, 1e6, SPREAD_PIVOT)
        });
        let (heavy, normal) = (heavy.of((0, 0)), normal.of((0, 0)));
        // Covering the heavy body's tail costs more than its scale says:
        // the newsvendor is given a wider spread for it, and about the
        // same for both. (A fit sees the upper half, where the body's
        // offset and scale trade a little: hence 10 %.)
        assert!(heavy.normal_scale() > 1.1 * heavy.scale(), "{heavy:?}");
        assert!(
            (normal.normal_scale() / normal.scale() - 1.0).abs() < 0.01,
            "{normal:?}"
        );
        for shape in [heavy, normal] {
            let priced = shape.normal_scale();
            assert!(
                (priced / wide - 1.0).abs() < 0.1,
                "{priced} against {wide} from {shape:?}"
            );
        }
    }

    #[test]
    fn a_fitted_tail_states_a_limit_the_same_whatever_its_estimates_count() {
        // Half the attempts were priced with 5 degrees of freedom, half
        // with 80; their peaks came from one t with 8, as a site's do.
        let mut class = ClassTails::<1, 1>::default();
        for (i, z) in t_peaks(2048, 8.0).enumerate() {
            let dof = if i % 2 == 0 { 5.0 } else { 80.0 };
            class.record((0, 0), (z <= 3.5).then_some(z), 3.5, dof, SPREAD_PIVOT);
        }
        // The body the class fitted (its restatement, which learns from
        // the limits as they were stated while the record filled, aside).
        let shape = class.unrestated((0, 0));
        let real = stats::t_survival(2.5, 8.0);
        let (few, many) = (
            shape.survival(2.5, 5.0, SPREAD_PIVOT),
            shape.survival(2.5, 80.0, SPREAD_PIVOT),
        );
        // Each estimate's own t would say 2.7 % and 0.7 %.
        assert!((few / many - 1.0).abs() < 1e-9, "{few} against {many}");
        assert!((few / real - 1.0).abs() < 0.3, "{few} against {real}");
        let stated = class.of((0, 0));
        assert_eq!(
            stated.survival(2.5, 5.0, SPREAD_PIVOT),
            stated.survival(2.5, 80.0, SPREAD_PIVOT)
        );
        // Limits are placed on the same body too.
        let (z_few, z_many) = (
            stated.z_for(0.01, 5.0, SPREAD_PIVOT),
            stated.z_for(0.01, 80.0, SPREAD_PIVOT),
        );
        assert!((z_few - z_many).abs() < 1e-9, "{z_few} against {z_many}");
    }

    #[test]
    fn before_any_fit_a_tail_is_each_estimates_own_t() {
        let shape = ClassTails::<1, 1>::default().of((0, 0));
        for dof in [4.0, 30.0] {
            let said = shape.survival(2.5, dof, SPREAD_PIVOT);
            assert!((said - stats::t_survival(2.5, dof)).abs() < 1e-12, "{said}");
        }
    }

    #[test]
    fn a_spread_twice_too_wide_is_found_and_priced() {
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.0, 0.5, 1.88);
        let k = tail.shape().scale();
        assert!((k - 0.5).abs() < 0.06, "{k}");
        // The model's 3 % point risks far less; 3 % lies further in.
        assert!(tail.shape().survival(1.88, 1e6, SPREAD_PIVOT) < 0.003);
        assert!((tail.shape().z_for(0.03, 1e6, SPREAD_PIVOT) - 0.94).abs() < 0.1);
    }

    #[test]
    fn kills_beyond_a_shifted_tail_push_the_limit_out() {
        // Sizes jumped by half an sd: the model's 3 % point risks ~8 %.
        let mut tail = Tail::default();
        fill(&mut tail, 1024, 0.5, 1.0, 1.88);
        let p = tail.shape().survival(1.88, 1e6, SPREAD_PIVOT);
        assert!((p / 0.085 - 1.0).abs() < 0.25, "{p}");
        let z = tail.shape().z_for(0.03, 1e6, SPREAD_PIVOT);
        assert!(z > 2.2, "{z}");
    }

    #[test]
    fn peaks_far_beyond_are_a_floor_no_limit_buys_off() {
        // A calibrated body, limits at three points of it, and 1.5 % of
        // attempts spiking far out (killed whatever the limit).
        let mut tail = Tail::default();
        for round in 0..4 {
            for (j, z_limit) in [2.0, 2.6, 3.2].into_iter().enumerate() {
                for (i, u) in grid(340).enumerate() {
                    let spike = (i + 97 * j + 31 * round) % 67 == 0;
                    let z = if spike {
                        20.0
                    } else {
                        stats::normal_quantile(u)
                    };
                    tail.record((z <= z_limit).then_some(z), z_limit, &MODEL_PRIOR);
                }
            }
        }
        let far = tail.shape().far();
        assert!(
            (far / 0.015 - 1.0).abs() < 0.5,
            "{far} from {:?}",
            tail.shape
        );
        // The body stays the model's: its 3 % point is where it was...
        assert!((tail.shape().z_for(0.03, 1e6, SPREAD_PIVOT) - 1.88).abs() < 0.25);
        // ... and what a limit risks never falls below the far share.
        assert!(tail.shape().survival(6.0, 1e6, SPREAD_PIVOT) >= 0.85 * far);
        let at_body = tail.shape().survival(1.88, 1e6, SPREAD_PIVOT);
        assert!((at_body / (0.03 + far) - 1.0).abs() < 0.3, "{at_body}");
    }

    #[test]
    fn survival_and_its_inverse_agree() {
        let mut tail = Tail::default();
        fill(&mut tail, 700, 0.2, 1.3, 2.0);
        for p in [0.2, 0.05, 0.02, 0.01, 0.002] {
            // What the body leaves beyond its point, far-out peaks aside.
            let z = tail.shape().z_for(p, 8.0, SPREAD_PIVOT);
            let back = (tail.shape().survival(z, 8.0, SPREAD_PIVOT)
                - tail.shape().far() * far_beyond(z))
                / (1.0 - tail.shape().far());
            // Two approximations (the t tail and its quantile) meet.
            assert!((back / p - 1.0).abs() < 0.05, "{p}: {back}");
        }
    }

    #[test]
    fn a_restated_risk_and_its_inverse_agree() {
        let shape = Shape {
            delta: 0.2,
            k: 1.3,
            far: 0.004,
            nu: 8.0,
            restate: Restate {
                shift: 0.3,
                slope: 0.7,
                by_spread: -0.4,
                spreads: (-2.0, 2.0),
            },
        };
        for (p, sd) in [0.2, 0.05, 0.02, 0.01, 0.002]
            .into_iter()
            .flat_map(|p| [0.03, SPREAD_PIVOT, 0.9].map(|sd| (p, sd)))
        {
            let z = shape.z_for(p, 8.0, sd);
            let back =
                (shape.survival(z, 8.0, sd) - shape.far() * far_beyond(z)) / (1.0 - shape.far());
            assert!((back / p - 1.0).abs() < 0.05, "{p} at {sd}: {back}");
        }
        // Beyond the pivot a slope under 1 states more than the body
        // says, and further in less.
        assert!(shape.restate.of(0.002, SPREAD_PIVOT) > 0.004);
        assert!(shape.restate.of(0.2, SPREAD_PIVOT) < 0.2);
    }

    /// A class of one group with two kinds of estimate, `n` attempts
    /// each, interleaved: `(z, k, sd)` is where a kind's limits stand,
    /// how far its peaks really spread on its scale (`N(0, k²)`), and its
    /// predictive spread.
    fn mixed(n: usize, a: (f64, f64, f64), b: (f64, f64, f64)) -> ClassTails<1, 1> {
        let mut class = ClassTails::<1, 1>::default();
        let mut peaks = [Vec::new(), Vec::new()];
        for ((z, k, _), peaks) in [a, b].into_iter().zip(&mut peaks) {
            attempts(n, 0.0, k, z, |peak| peaks.push(peak));
        }
        let [of_a, of_b] = peaks;
        for (pa, pb) in of_a.into_iter().zip(of_b) {
            class.record((0, 0), pa, a.0, 1e6, a.2);
            class.record((0, 0), pb, b.0, 1e6, b.2);
        }
        class
    }

    /// Whether `class` restates the risk of each kind of estimate
    /// `(z, k, sd)` (as [`mixed`] takes it) within 30 % of what it
    /// really is, and at most `share` of the error before.
    fn restated_near_truth(class: &ClassTails<1, 1>, kinds: [(f64, f64, f64); 2], share: f64) {
        let restated = class.of((0, 0));
        let unrestated = class.unrestated((0, 0));
        for (z, k, sd) in kinds {
            let said = restated.survival(z, 1e6, sd);
            let was = unrestated.survival(z, 1e6, sd);
            let real = stats::t_survival(z / k, 1e6);
            assert!(
                (said / real - 1.0).abs() < 0.3,
                "at {z}, spread {sd}: {said} restated, {real} real"
            );
            assert!(
                (said - real).abs() < share * (was - real).abs(),
                "at {z}, spread {sd}: {said} restated, {was} before, {real} real"
            );
        }
    }

    #[test]
    fn a_class_whose_far_limits_are_riskier_than_its_near_ones_is_restated() {
        // The far limits risk 1.5 %, the near ones 3.8 %: one body fitted
        // to both cannot say so.
        let kinds = [(2.4, 1.1, SPREAD_PIVOT), (1.6, 0.9, SPREAD_PIVOT)];
        restated_near_truth(&mixed(2000, kinds[0], kinds[1]), kinds, 0.6);
    }

    #[test]
    fn a_class_whose_wide_estimates_say_more_than_they_risk_is_restated_by_spread() {
        // Limits at the same point of one body: the wide estimates' peaks
        // spread less than they say (0.9 % beyond), the narrow ones' more
        // (6.6 %). Where a limit stands cannot tell them apart; the spread
        // of its estimate can.
        let kinds = [(1.88, 0.8, 0.5), (1.88, 1.25, 0.08)];
        let class = mixed(2000, kinds[0], kinds[1]);
        restated_near_truth(&class, kinds, 0.3);
        let shape = class.of((0, 0));
        assert!(shape.restate.by_spread < -0.5);
        // Spreads no checked limit had are priced as the nearest that one
        // had, not extrapolated to.
        let at = |sd: f64| shape.survival(1.88, 1e6, sd);
        let same = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-6;
        assert!(same(at(3.0), at(0.5)), "{} {}", at(3.0), at(0.5));
        assert!(same(at(0.01), at(0.08)), "{} {}", at(0.01), at(0.08));
        assert!(at(0.08) > at(0.2) && at(0.2) > at(0.5));
    }

    #[test]
    fn a_class_whose_limits_realize_their_risk_stays_calibrated() {
        // Calm and wild estimates alike are as wide as they say: whatever
        // the restatement makes of their limits, it states what they risk.
        let kinds = [(2.6, 1.0, 0.5), (1.4, 1.0, 0.08)];
        let class = mixed(2000, kinds[0], kinds[1]);
        for (z, k, sd) in kinds {
            let said = class.of((0, 0)).survival(z, 1e6, sd);
            let was = class.unrestated((0, 0)).survival(z, 1e6, sd);
            let real = stats::t_survival(z / k, 1e6);
            assert!(
                (said / real - 1.0).abs() < 0.1,
                "at {z}, spread {sd}: {said} restated, {was} before, {real} real"
            );
        }
    }

    #[test]
    fn a_group_with_little_record_borrows_its_class() {
        use rand::{Rng, SeedableRng};
        // Every group of a class runs half an sd further out than the
        // model says (its 3 % point risks 8.5 %), each with 32 attempts.
        const GROUPS: usize = 40;
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut class = ClassTails::<1, GROUPS>::default();
        let mut alone: [Tail; GROUPS] = std::array::from_fn(|_| Tail::default());
        for _ in 0..32 {
            for (group, tail) in alone.iter_mut().enumerate() {
                let z = 0.5 + stats::normal_quantile(rng.random_range(1e-9..1.0));
                let peak = (z <= 1.88).then_some(z);
                class.record((0, group), peak, 1.88, 1e6, SPREAD_PIVOT);
                tail.record(peak, 1.88, &MODEL_PRIOR);
            }
        }
        let stated = |tail: &Shape| tail.survival(1.88, 1e6, SPREAD_PIVOT);
        let mean = |tails: &mut dyn Iterator<Item = &Shape>, f: &dyn Fn(&Shape) -> f64| {
            tails.map(f).sum::<f64>() / GROUPS as f64
        };
        let error = |tail: &Shape| (stated(tail) - 0.085).abs();
        // The groups as fitted, before their class restates them.
        let groups: Vec<Shape> = (0..GROUPS).map(|g| class.unrestated((0, g))).collect();
        // Alone, each group is held towards the model's 3 %: the class
        // is under-stated on average. Borrowing, it is not, and each
        // group's stated risk is nearer the truth.
        let (borrowed, own) = (
            mean(&mut groups.iter(), &stated),
            mean(&mut alone.iter().map(Tail::shape), &stated),
        );
        assert!(own < 0.9 * 0.085, "{own}");
        assert!((borrowed / 0.085 - 1.0).abs() < 0.1, "{borrowed}");
        let (borrowed, own) = (
            mean(&mut groups.iter(), &error),
            mean(&mut alone.iter().map(Tail::shape), &error),
        );
        assert!(borrowed < 0.8 * own, "{borrowed} against {own} alone");
        // A group with no record yet is priced as its class.
        let mut fresh = ClassTails::<1, 2>::default();
        attempts(400, 0.5, 1.0, 1.88, |peak| {
            fresh.record((0, 0), peak, 1.88, 1e6, SPREAD_PIVOT)
        });
        let unseen = fresh.of((0, 1)).survival(1.88, 1e6, SPREAD_PIVOT);
        assert!((unseen / 0.085 - 1.0).abs() < 0.2, "{unseen}");
    }

    #[test]
    fn a_busy_group_keeps_its_own_tail_against_its_class() {
        // Four spread groups run further out; the busy calm one is half
        // as wide as the model says.
        let mut class = ClassTails::<5, 1>::default();
        for round in 0..4 {
            for spread in 1..5 {
                attempts(50, 0.5, 1.0, 1.88, |peak| {
                    class.record((spread, 0), peak, 1.88, 1e6, SPREAD_PIVOT)
                });
            }
            attempts(256 + round, 0.0, 0.5, 1.88, |peak| {
                class.record((0, 0), peak, 1.88, 1e6, SPREAD_PIVOT)
            });
        }
        let calm = class.of((0, 0));
        assert!(calm.scale() < 0.7, "{calm:?} in a class at {:?}", class.at);
        assert!(calm.survival(1.88, 1e6, SPREAD_PIVOT) < 0.005);
        assert!(class.of((1, 0)).survival(1.88, 1e6, SPREAD_PIVOT) > 0.06);
    }

    #[test]
    fn a_wild_group_with_no_record_is_not_priced_as_its_calm_class() {
        // The calm spread groups of a class run half as wide as the model
        // says; the middle one as wide. The wildest has no record yet.
        let mut class = ClassTails::<5, 1>::default();
        for _ in 0..3 {
            for (spread, k) in [(0, 0.5), (1, 0.5), (2, 1.0)] {
                attempts(300, 0.0, k, 1.88, |peak| {
                    class.record((spread, 0), peak, 1.88, 1e6, SPREAD_PIVOT)
                });
            }
        }
        let wild = class.of((4, 0));
        assert!(wild.scale() > 0.9, "{wild:?}");
        assert!(class.of((0, 0)).scale() < 0.65);
    }

    #[test]
    fn a_replayed_record_ends_with_the_tails_it_would_have_online() {
        // Six groups of three shapes, their attempts interleaved in time.
        let mut groups = Vec::new();
        for (spread, delta, k) in [(0, 0.0, 0.6), (1, 0.3, 1.0), (2, 0.6, 1.3)] {
            for depth in 0..2 {
                let mut peaks = Vec::new();
                attempts(700 + 50 * depth, delta, k, 1.88, |peak| peaks.push(peak));
                groups.push(((spread, depth), peaks));
            }
        }
        let feed = |class: &mut ClassTails<3, 2>| {
            for i in 0..750 {
                for (group, peaks) in &groups {
                    if let Some(&peak) = peaks.get(i) {
                        class.record(*group, peak, 1.88, 30.0, SPREAD_PIVOT);
                    }
                }
            }
        };
        let (online, replayed) = online_and_replayed(feed);
        for spread in 0..3 {
            for depth in 0..2 {
                for z in [1.5, 1.88, 2.5] {
                    let (a, b) = (
                        online.of((spread, depth)).survival(z, 30.0, SPREAD_PIVOT),
                        replayed.of((spread, depth)).survival(z, 30.0, SPREAD_PIVOT),
                    );
                    // Online, a group's last fit drew on the class as it was
                    // then; replayed, on the class at the end.
                    assert!(
                        (b - a).abs() < 0.002_f64.max(0.05 * a),
                        "{spread}/{depth} at {z}: {a} online, {b} replayed"
                    );
                }
            }
        }
    }

    #[test]
    fn a_replay_too_short_for_a_fit_answers_as_live() {
        // Fewer attempts than a first fit needs: live, the class states the
        // model's own tail; a replay of the same ends no differently.
        let feed = |class: &mut ClassTails<1, 1>| {
            for (i, z) in [0.4, 1.3, -0.2, 2.6, 0.9, 1.7, -1.1, 0.2]
                .into_iter()
                .enumerate()
            {
                let peak = (z <= 2.0).then_some(z);
                class.record((0, 0), peak, 2.0, 4.0 + i as f64, SPREAD_PIVOT);
            }
        };
        let (online, replayed) = online_and_replayed(feed);
        for z in [1.5, 2.0, 3.0] {
            let live = online.of((0, 0)).survival(z, 9.0, SPREAD_PIVOT);
            assert_eq!(live, stats::t_survival(z, 9.0));
            assert_eq!(replayed.of((0, 0)).survival(z, 9.0, SPREAD_PIVOT), live);
        }
    }
}
