//! The statistic: a recency-weighted log-normal fit of peaks with a Student-t
//! predictive quantile, plus the few special functions it needs.
//!
//! Memory peaks of one workload are close to log-normal (a build's peak is a
//! product of many factors), so the fit works on `ln(peak)`. The predictive
//! quantile of the next peak is `μ + t(q, ν) · σ · √(1 + 1/n)`: the
//! `√(1 + 1/n)` and the t quantile pay for estimating `μ` and `σ` from a
//! handful of samples, and `σ` is shrunk towards a prior so that three calm
//! samples of a wild package do not produce a tight limit.

/// One training sample in compact form (16 bytes; a level key holds a
/// bounded window of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// Unix seconds, clamped to `u32`.
    pub at: u32,
    /// `ln(peak bytes)`; an OOM-killed attempt stores its censored value.
    pub ln_peak: f32,
    /// One-step-ahead residual: `ln_peak` minus the workload's predicted
    /// location just before it arrived, scaled by `1/√(1 + 1/n)` so that its
    /// square estimates σ². NaN for the first sample of a workload key.
    pub resid: f32,
    /// Average cores used (`cpu_seconds / wall_seconds`), NaN when unknown.
    pub cores: f32,
}

/// Sorted insert into a bounded window; returns whether it grew.
pub(crate) fn insert_sample(window: &mut Vec<Sample>, sample: Sample, cap: usize) -> bool {
    let pos = window.partition_point(|s| s.at <= sample.at);
    if window.len() >= cap {
        if pos == 0 {
            // Older than everything held: the window has moved on.
            return false;
        }
        window.remove(0);
        window.insert(pos - 1, sample);
        return false;
    }
    if window.len() == window.capacity() {
        // Grow by half (4, 6, 9, 13, ...) up to the cap exactly: a million
        // samples in windows must not carry doubling slack.
        let target = (window.len() + window.len() / 2).max(4).min(cap);
        window.reserve_exact(target - window.len());
    }
    window.insert(pos, sample);
    true
}

/// Knobs of [`fit`], copied out of the model's parameters.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FitKnobs {
    /// Half-life of a sample's weight, counted in newer samples (0 = none).
    pub half_life_samples: f64,
    /// Half-life of a residual's weight in newer samples (0 = none): the
    /// spread changes more slowly than the location, so it may look further
    /// back.
    pub sigma_half_life_samples: f64,
    /// Half-life of a sample's weight in days of age (0 = none).
    pub half_life_days: f64,
    /// Values and residuals beyond this many robust standard deviations are
    /// clipped (0 = no clipping).
    pub clip: f64,
    /// Windows with fewer samples are not clipped (their MAD is too noisy).
    pub clip_min_samples: usize,
    /// Never clip with a robust σ below this (log units): a MAD of a few
    /// calm samples is no licence to cut off an honest high one.
    pub clip_floor: f64,
}

/// A fitted window: the recency-weighted location of `ln(peak)` and the
/// spread of its one-step-ahead residuals.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fit {
    /// Weighted mean of `ln(peak)` after clipping outliers.
    pub mu: f64,
    /// Effective number of samples (Kish) behind `mu`.
    pub n_eff: f64,
    /// Weighted variance of the (clipped) values around `mu`: the residual
    /// spread plus whatever mix of workloads a broad level holds.
    pub value_var: f64,
    /// Weighted mean square of the residuals after clipping (σ² estimate),
    /// 0 when there are none.
    pub resid_var: f64,
    /// Effective number of residuals behind `resid_var`.
    pub resid_n: f64,
    /// Recency-weighted mean of cores used, when any sample knows it.
    pub cores: Option<f64>,
}

/// The time of day-based decay is measured in.
const DAY: f64 = 86_400.0;

/// The most samples [`fit`] looks at (the newest); windows are capped to it.
pub(crate) const MAX_WINDOW: usize = 64;

/// `E[clamp(Z, -c, c)²]` for a standard normal Z, to keep a clipped
/// estimate of σ² consistent for normal data.
fn clipped_variance(c: f64) -> f64 {
    let tail = 1.0 - normal_cdf(c);
    let density = (-0.5 * c * c).exp() / (2.0 * std::f64::consts::PI).sqrt();
    1.0 - 2.0 * (c * density + tail) + 2.0 * c * c * tail
}

/// Standard normal CDF (Abramowitz–Stegun 26.2.17, error < 7.5e-8).
fn normal_cdf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.231_641_9 * x.abs());
    let density = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let poly = t
        * (0.319_381_530
            + t * (-0.356_563_782
                + t * (1.781_477_937 + t * (-1.821_255_978 + t * 1.330_274_429))));
    let upper = density * poly;
    if x >= 0.0 { 1.0 - upper } else { upper }
}

fn half_life_rate(half_life: f64) -> f64 {
    if half_life.is_finite() && half_life > 0.0 {
        std::f64::consts::LN_2 / half_life
    } else {
        0.0
    }
}

/// The weighted median of `(value, weight)` pairs; sorts them by value.
fn weighted_median(pairs: &mut [(f64, f64)]) -> f64 {
    pairs.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = pairs.iter().map(|p| p.1).sum();
    let mut acc = 0.0;
    for &(value, weight) in pairs.iter() {
        acc += weight;
        if acc >= total / 2.0 {
            return value;
        }
    }
    pairs.last().map_or(0.0, |p| p.0)
}

/// Robust clipping bounds `center ± clip·scale` of `(value, weight)` pairs
/// around `center`, from the weighted median absolute deviation; infinite
/// when clipping is off or there are too few pairs.
fn clip_bounds(pairs: &[(f64, f64)], center: f64, knobs: &FitKnobs) -> (f64, f64, f64) {
    if knobs.clip <= 0.0 || pairs.len() < knobs.clip_min_samples.max(3) {
        return (f64::NEG_INFINITY, f64::INFINITY, 1.0);
    }
    let mut deviations = [(0.0f64, 0.0f64); MAX_WINDOW];
    for (d, p) in deviations.iter_mut().zip(pairs) {
        *d = ((p.0 - center).abs(), p.1);
    }
    let mad = weighted_median(&mut deviations[..pairs.len()]);
    let scale = (1.482_6 * mad).max(knobs.clip_floor).max(1e-3);
    (
        center - knobs.clip * scale,
        center + knobs.clip * scale,
        clipped_variance(knobs.clip).max(0.5),
    )
}

/// Fits the newest [`MAX_WINDOW`] of `samples` (sorted oldest first,
/// non-empty): recency weights relative to the newest sample (so a fit
/// does not change with the time it is asked at); the weighted mean of
/// `ln(peak)` after clipping outliers (spikes, censored OOM values) at
/// `clip` robust scales around the weighted median; the weighted mean
/// square of the residuals, clipped alike around zero.
pub(crate) fn fit(samples: &[Sample], knobs: &FitKnobs) -> Fit {
    let samples = &samples[samples.len().saturating_sub(MAX_WINDOW)..];
    let n = samples.len();
    let per_sample = half_life_rate(knobs.half_life_samples);
    let per_day = half_life_rate(knobs.half_life_days);
    // Ages count from the newest sample: measuring them from any later
    // time would add the same term to every log-weight, which the
    // normalisation below takes out again.
    let reference = samples.last().map_or(0.0, |s| f64::from(s.at));

    // Log-weights, normalised so the newest is 1 (nothing underflows): one
    // set for the location, one for the residuals.
    let per_sample_sigma = half_life_rate(knobs.sigma_half_life_samples);
    let mut weights = [0.0f64; MAX_WINDOW];
    let mut resid_weights = [0.0f64; MAX_WINDOW];
    for (i, s) in samples.iter().enumerate() {
        let rank = (n - 1 - i) as f64;
        let age_days = (reference - f64::from(s.at)) / DAY;
        weights[i] = -(rank * per_sample + age_days * per_day);
        resid_weights[i] = -(rank * per_sample_sigma + age_days * per_day);
    }
    for weights in [&mut weights[..n], &mut resid_weights[..n]] {
        let max = weights.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        for w in weights.iter_mut() {
            *w = (*w - max).exp();
        }
    }
    let weights = &weights[..n];
    let resid_weights = &resid_weights[..n];

    // Location.
    let mut pairs = [(0.0f64, 0.0f64); MAX_WINDOW];
    for ((p, s), &w) in pairs.iter_mut().zip(samples).zip(weights.iter()) {
        *p = (f64::from(s.ln_peak), w);
    }
    let pairs = &mut pairs[..n];
    let (low, high, _) = if knobs.clip > 0.0 && n >= knobs.clip_min_samples.max(3) {
        let median = weighted_median(pairs);
        clip_bounds(pairs, median, knobs)
    } else {
        (f64::NEG_INFINITY, f64::INFINITY, 1.0)
    };
    let (mut sw, mut sw2, mut swy) = (0.0, 0.0, 0.0);
    for &(y, w) in pairs.iter() {
        sw += w;
        sw2 += w * w;
        swy += w * y.clamp(low, high);
    }
    let mu = swy / sw;
    let n_eff = (sw * sw / sw2).max(1.0);
    let mut ss = 0.0;
    for &(y, w) in pairs.iter() {
        let d = y.clamp(low, high) - mu;
        ss += w * d * d;
    }
    let denominator = sw - sw2 / sw;
    let value_var = if denominator > 1e-12 {
        ss / denominator
    } else {
        0.0
    };

    // Residual spread.
    let mut resid = [(0.0f64, 0.0f64); MAX_WINDOW];
    let mut m = 0;
    for (s, &w) in samples.iter().zip(resid_weights.iter()) {
        let r = f64::from(s.resid);
        if r.is_finite() {
            resid[m] = (r, w);
            m += 1;
        }
    }
    let resid = &resid[..m];
    let (r_low, r_high, consistency) = clip_bounds(resid, 0.0, knobs);
    let (mut rw, mut rw2, mut rss) = (0.0, 0.0, 0.0);
    for &(r, w) in resid {
        let r = r.clamp(r_low, r_high);
        rw += w;
        rw2 += w * w;
        rss += w * r * r;
    }
    let (resid_var, resid_n) = if rw > 0.0 {
        (rss / rw / consistency, rw * rw / rw2)
    } else {
        (0.0, 0.0)
    };

    let (mut cw, mut cwx) = (0.0, 0.0);
    for (s, &w) in samples.iter().zip(weights.iter()) {
        let c = f64::from(s.cores);
        if c.is_finite() && c >= 0.0 {
            cw += w;
            cwx += w * c;
        }
    }
    Fit {
        mu,
        n_eff,
        value_var,
        resid_var,
        resid_n,
        cores: (cw > 0.0).then(|| cwx / cw),
    }
}

/// Inverse of the standard normal CDF (Acklam's rational approximation,
/// relative error below 1.2e-9). `p` is clamped into `(0, 1)`.
pub(crate) fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    const P_LOW: f64 = 0.024_25;
    let p = if p.is_nan() {
        0.5
    } else {
        p.clamp(1e-15, 1.0 - 1e-15)
    };
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < P_LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - P_LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    }
}

/// The cost-optimal ("newsvendor") standard score of a log-normal limit.
///
/// With `ln(peak) ~ N(μ, σ²)` and the limit at `exp(μ + zσ)`, the expected
/// waste of one job is the slack `E[(L − X)/L; X ≤ L]` plus `cost` for an
/// OOM kill (`P(X > L)`), both in units of the limit. Its derivative in `z`
/// vanishes where `σ·e^{σ²/2 − σz}·Φ(z − σ) = cost·φ(z)`; the log of the
/// difference is strictly increasing in `z`, so Newton's method finds the
/// root. A calm workload gets a high quantile (covering its tail is cheap),
/// a wild one a lower quantile (covering it would waste much on every run).
pub(crate) fn newsvendor_z(sigma: f64, cost: f64) -> f64 {
    const Z_MAX: f64 = 6.0;
    if !(sigma.is_finite() && sigma > 1e-6) {
        return Z_MAX;
    }
    if !(cost.is_finite() && cost > 0.0) {
        return 0.0;
    }
    let ln_norm = 0.5 * (2.0 * std::f64::consts::PI).ln();
    let g = |z: f64| {
        sigma.ln() - sigma * z + 0.5 * sigma * sigma + normal_cdf(z - sigma).max(1e-300).ln()
            - cost.ln()
            + 0.5 * z * z
            + ln_norm
    };
    let mut z = 2.0f64;
    for _ in 0..50 {
        let x = z - sigma;
        let mills =
            (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt() / normal_cdf(x).max(1e-300);
        let slope = (z - sigma + mills).max(1e-6);
        let next = (z - g(z) / slope).clamp(-Z_MAX, Z_MAX);
        if (next - z).abs() < 1e-9 {
            return next;
        }
        z = next;
    }
    z
}

/// `φ(a) / (1 − Φ(a))`: how far above `a` a standard normal lands on
/// average, given that it lands above `a` (`E[Z | Z > a]`). Asymptotic for
/// large `a`, where the ratio of two tiny numbers loses precision.
pub(crate) fn inverse_mills(a: f64) -> f64 {
    if !a.is_finite() {
        return if a > 0.0 { a } else { 0.0 };
    }
    if a > 6.0 {
        // a + 1/a − 2/a³: within 1e-4 from 6 on.
        return a + 1.0 / a - 2.0 / (a * a * a);
    }
    let density = (-0.5 * a * a).exp() / (2.0 * std::f64::consts::PI).sqrt();
    density / (1.0 - normal_cdf(a)).max(1e-300)
}

/// `P(T > t)` for Student's t with `nu` degrees of freedom, through
/// Wallace's normal approximation `z = (8ν + 1)/(8ν + 3) · √(ν ln(1 + t²/ν))`
/// (within a few thousandths of the exact tail for ν ≥ 3).
pub(crate) fn t_survival(t: f64, nu: f64) -> f64 {
    if t.is_nan() {
        return 0.5;
    }
    let nu = if nu.is_finite() { nu.max(1.0) } else { 1e7 };
    let z = (8.0 * nu + 1.0) / (8.0 * nu + 3.0) * (nu * (t * t / nu).ln_1p()).sqrt();
    1.0 - normal_cdf(if t < 0.0 { -z } else { z })
}

/// `ln` of the normalizing constant of Student's t density with `nu`
/// degrees of freedom, `Γ((ν+1)/2) / (Γ(ν/2)·√(νπ))` (the log-gamma
/// difference by its asymptotic series, within 0.02 from ν = 1).
pub(crate) fn t_ln_norm(nu: f64) -> f64 {
    let nu = if nu.is_finite() { nu.max(1.0) } else { 1e7 };
    let a = 0.5 * nu;
    0.5 * a.ln() - 1.0 / (8.0 * a) + 1.0 / (192.0 * a * a * a)
        - 0.5 * (nu * std::f64::consts::PI).ln()
}

/// The solution `x` of `a·x = b` for a symmetric positive definite N×N
/// `a` (by its Cholesky factor), or `None` where `a` is not.
pub(crate) fn solve<const N: usize>(a: [[f64; N]; N], b: [f64; N]) -> Option<[f64; N]> {
    let mut l = [[0.0f64; N]; N];
    for i in 0..N {
        for j in 0..=i {
            let sum = a[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            if i == j {
                if sum <= 0.0 || !sum.is_finite() {
                    return None;
                }
                l[i][i] = sum.sqrt();
            } else {
                l[i][j] = sum / l[j][j];
            }
        }
    }
    let mut y = [0.0f64; N];
    for i in 0..N {
        y[i] = (b[i] - (0..i).map(|k| l[i][k] * y[k]).sum::<f64>()) / l[i][i];
    }
    let mut x = [0.0f64; N];
    for i in (0..N).rev() {
        x[i] = (y[i] - (i + 1..N).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    Some(x)
}

/// Standard normal CDF, for callers outside this module.
pub(crate) fn normal_probability(z: f64) -> f64 {
    normal_cdf(z)
}

/// Cornish–Fisher expansion of the Student-t quantile around the normal one
/// (four terms; within 1% of the exact value for ν ≥ 3 up to p = 0.999).
fn t_cornish_fisher(z: f64, nu: f64) -> f64 {
    let z2 = z * z;
    let z3 = z2 * z;
    let z5 = z3 * z2;
    let z7 = z5 * z2;
    let z9 = z7 * z2;
    let g1 = (z3 + z) / 4.0;
    let g2 = (5.0 * z5 + 16.0 * z3 + 3.0 * z) / 96.0;
    let g3 = (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / 384.0;
    let g4 = (79.0 * z9 + 776.0 * z7 + 1482.0 * z5 - 1920.0 * z3 - 945.0 * z) / 92_160.0;
    z + g1 / nu + g2 / nu.powi(2) + g3 / nu.powi(3) + g4 / nu.powi(4)
}

/// Quantile `p` of Student's t with `nu` degrees of freedom. Exact for
/// ν = 1 and ν = 2, Cornish–Fisher from ν = 3, interpolated in 1/ν between.
pub(crate) fn t_quantile(p: f64, nu: f64) -> f64 {
    let p = if p.is_nan() {
        0.5
    } else {
        p.clamp(1e-12, 1.0 - 1e-12)
    };
    let z = normal_quantile(p);
    if !nu.is_finite() || nu > 1e7 {
        return z;
    }
    let nu = nu.max(1.0);
    let exact1 = || (std::f64::consts::PI * (p - 0.5)).tan();
    let exact2 = || (2.0 * p - 1.0) / (2.0 * p * (1.0 - p)).sqrt();
    // Linear in 1/ν between two anchors (ν_a < ν_b).
    let between = |nu_a: f64, t_a: f64, nu_b: f64, t_b: f64| {
        let x = (1.0 / nu_a - 1.0 / nu) / (1.0 / nu_a - 1.0 / nu_b);
        t_a + (t_b - t_a) * x
    };
    if nu >= 3.0 {
        t_cornish_fisher(z, nu)
    } else if nu >= 2.0 {
        between(2.0, exact2(), 3.0, t_cornish_fisher(z, 3.0))
    } else {
        between(1.0, exact1(), 2.0, exact2())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symmetric_system_is_solved_and_a_singular_one_refused() {
        let a = [[4.0, 1.0, 0.5], [1.0, 3.0, -0.2], [0.5, -0.2, 2.0]];
        let x = [0.3, -1.2, 2.5];
        let b: [f64; 3] = std::array::from_fn(|i| (0..3).map(|j| a[i][j] * x[j]).sum());
        let got = solve(a, b).expect("positive definite");
        for (g, w) in got.iter().zip(x) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
        assert_eq!(solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]), None);
    }

    #[test]
    fn normal_quantile_matches_tables() {
        assert!((normal_quantile(0.5)).abs() < 1e-9);
        assert!((normal_quantile(0.975) - 1.959_964).abs() < 1e-5);
        assert!((normal_quantile(0.98) - 2.053_749).abs() < 1e-5);
        assert!((normal_quantile(0.999) - 3.090_232).abs() < 1e-5);
        assert!((normal_quantile(0.01) + 2.326_348).abs() < 1e-5);
    }

    #[test]
    fn newsvendor_gives_calm_workloads_higher_quantiles() {
        let q = |sigma: f64, cost: f64| normal_cdf(newsvendor_z(sigma, cost));
        // The first-order condition holds at the root.
        for (sigma, cost) in [(0.03, 2.5), (0.2, 2.5), (0.45, 2.5), (0.3, 10.0)] {
            let z = newsvendor_z(sigma, cost);
            let lhs = sigma * (0.5 * sigma * sigma - sigma * z).exp() * normal_cdf(z - sigma);
            let rhs = cost * (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
            assert!(
                (lhs / rhs - 1.0).abs() < 1e-6,
                "σ {sigma} cost {cost}: {lhs} vs {rhs}"
            );
        }
        assert!(q(0.03, 2.5) > 0.99);
        assert!(q(0.45, 2.5) < 0.97);
        assert!(q(0.45, 2.5) < q(0.2, 2.5));
        assert!(q(0.2, 10.0) > q(0.2, 2.5));
        assert_eq!(newsvendor_z(0.0, 2.5), 6.0);
    }

    #[test]
    fn t_quantile_matches_tables() {
        // Exact values from a t table.
        let cases = [
            (0.98, 1.0, 15.894_5),
            (0.98, 2.0, 4.848_7),
            (0.98, 3.0, 3.481_9),
            (0.98, 5.0, 2.756_5),
            (0.98, 10.0, 2.359_3),
            (0.98, 30.0, 2.146_8),
            (0.999, 5.0, 5.893_4),
            (0.999, 10.0, 4.143_7),
        ];
        for (p, nu, want) in cases {
            let got = t_quantile(p, nu);
            assert!(
                (got - want).abs() / want < 0.02,
                "t({p}, {nu}) = {got}, want {want}"
            );
        }
        // Monotone in ν between the anchors.
        let mut last = f64::INFINITY;
        for i in 0..40 {
            let t = t_quantile(0.98, 1.0 + f64::from(i) * 0.25);
            assert!(t <= last + 1e-9);
            last = t;
        }
    }

    fn sample(at: u32, ln_peak: f32, resid: f32) -> Sample {
        Sample {
            at,
            ln_peak,
            resid,
            cores: 2.0,
        }
    }

    fn knobs(clip: f64) -> FitKnobs {
        FitKnobs {
            half_life_samples: 0.0,
            sigma_half_life_samples: 0.0,
            half_life_days: 0.0,
            clip,
            clip_min_samples: 3,
            clip_floor: 0.01,
        }
    }

    #[test]
    fn fit_weighs_the_location_and_residuals() {
        let samples: Vec<Sample> = (0..5)
            .map(|i| {
                sample(
                    1000 + i,
                    20.0 + i as f32 * 0.1,
                    if i == 0 { f32::NAN } else { 0.1 },
                )
            })
            .collect();
        let fit = fit(&samples, &knobs(0.0));
        assert!((fit.mu - 20.2).abs() < 1e-6);
        assert!((fit.n_eff - 5.0).abs() < 1e-9);
        assert!((fit.resid_var - 0.01).abs() < 1e-6);
        assert!((fit.resid_n - 4.0).abs() < 1e-9);
        assert_eq!(fit.cores, Some(2.0));
        // A sample-count half-life favours the newest.
        let mut k = knobs(0.0);
        k.half_life_samples = 1.0;
        let recent = super::fit(&samples, &k);
        assert!(recent.mu > 20.3 && recent.n_eff < 3.0, "{recent:?}");
    }

    #[test]
    fn clipping_bounds_the_pull_of_one_spike() {
        let mut samples: Vec<Sample> = (0..20)
            .map(|i| {
                let r = if i % 2 == 0 { 0.05 } else { -0.05 };
                sample(1000 + i, 20.0 + r, r)
            })
            .collect();
        samples[10].ln_peak = 20.0 + 2.0f32.ln();
        samples[10].resid = 2.0f32.ln();
        let raw = fit(&samples, &knobs(0.0));
        let robust = fit(&samples, &knobs(3.0));
        assert!(raw.resid_var.sqrt() > 0.15, "{raw:?}");
        assert!(robust.resid_var.sqrt() < 0.08, "{robust:?}");
        assert!(robust.mu < raw.mu);
        assert!((clipped_variance(3.0) - 0.995).abs() < 1e-3);
    }
}
