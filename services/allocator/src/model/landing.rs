//! How far new workloads land from where they were placed: the predictive
//! distribution of a workload with no sample of its own, learned from the
//! site's record instead of a fixed prior.
//!
//! A new version, compiler or variant set is priced from a less specific
//! ladder level (a fallback). How far its first build lands from that
//! level's location is not the spread within a workload: a new variant set
//! of a calm package sits as far from the package's other variant sets as
//! variant sets do, however calm each of them is. So each kind of fallback
//! (ladder, level, and whether a few samples of a more specific level pull
//! the location) keeps the last [`KEPT`] first builds: how far each landed
//! from the location it was priced at (a killed one only known to be
//! beyond its limit), and how far its limit stood.
//!
//! From them a Student t: its degrees of freedom (from [`DOFS`]) by
//! maximum likelihood, and then its scale such that the record's own
//! limits would have been passed as often as they were (a posterior
//! predictive check, solved). Most new versions barely move and one in
//! four jumps far: no t fits both that body and the tail where limits
//! stand, and the maximum-likelihood scale follows the body, which left
//! new versions killed twice as often as stated at their limits. The
//! smallest degrees of freedom keep the variance finite, since the
//! newsvendor prices slack on the spread.

use super::ring::Ring;
use super::stats;

/// First builds kept per kind of fallback.
const KEPT: usize = 512;
/// The fit is redone after this many more first builds (a quarter of the
/// record: a fit reads all of it some 250 times); while a history is
/// replayed at start-up, after half the record, and once when it ends.
const REFIT_EVERY: u64 = 32;
const REPLAY_REFIT_EVERY: u64 = 256;
/// First builds before a fit is made (before it, the configured
/// `fallback_sigma` prices new workloads).
pub(super) const MIN_LANDINGS: usize = 30;
/// Degrees of freedom the fit chooses among.
const DOFS: [f64; 7] = [2.5, 3.0, 4.0, 6.0, 10.0, 25.0, 400.0];
/// The scales the likelihood is searched over (log), whatever the
/// record: a record of builds that were all killed says only that they
/// landed far.
const SCALES: (f64, f64) = (0.005, 5.0);
/// Golden-section steps of the scale, per degrees of freedom (to within
/// 3e-4 of `ln(scale)`).
const SCALE_STEPS: usize = 28;
/// The predictive check moves the scale by at most this factor (log)
/// from the likelihood's: a record with no kill, or only kills, says
/// little about how far.
const CHECK_RANGE: f64 = 1.5;
/// Bisection steps of the predictive check (to within 3e-9 of `ln(scale)`).
const CHECK_STEPS: usize = 30;

/// The t fitted to a record of first builds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Fitted {
    /// Scale of the distance (log).
    pub(super) scale: f64,
    /// Degrees of freedom.
    pub(super) dof: f64,
}

/// One first build: how far it landed (killed: how far its limit stood,
/// and it needed more), how far its limit stood (infinite: none known).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Landing {
    distance: f32,
    limit: f32,
    killed: bool,
}

/// One kind of fallback's record of first builds.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Landings {
    points: Ring<Landing>,
    seen: u64,
    fitted: Option<Fitted>,
    replaying: bool,
}

impl Default for Landings {
    fn default() -> Self {
        Self {
            points: Ring::new(KEPT),
            seen: 0,
            fitted: None,
            replaying: false,
        }
    }
}

impl Landings {
    /// Records a first build that landed `distance` from the location it
    /// was priced at, with its limit `limit` from it (`killed`: the
    /// limit was passed, and `distance` is the limit's).
    pub(super) fn add(&mut self, distance: f64, limit: Option<f64>, killed: bool) {
        if !distance.is_finite() {
            return;
        }
        let point = Landing {
            distance: distance.clamp(-20.0, 20.0) as f32,
            limit: limit
                .filter(|l| l.is_finite())
                .map_or(f32::INFINITY, |l| l.clamp(-20.0, 20.0) as f32),
            killed,
        };
        self.points.push(point);
        self.seen += 1;
        let every = if self.replaying {
            REPLAY_REFIT_EVERY
        } else {
            REFIT_EVERY
        };
        if self.points.len() >= MIN_LANDINGS
            && (self.fitted.is_none() || self.seen.is_multiple_of(every))
        {
            self.fitted = self.fit();
        }
    }

    /// Whether a history is being replayed: the fit is redone less often
    /// until it ends, and then once.
    pub(super) fn set_replaying(&mut self, replaying: bool) {
        if self.replaying && !replaying && self.points.len() >= MIN_LANDINGS {
            self.fitted = self.fit();
        }
        self.replaying = replaying;
    }

    /// The t new workloads of this kind land by, once enough have.
    pub(super) fn fitted(&self) -> Option<Fitted> {
        self.fitted
    }

    fn ln_likelihood(&self, scale: f64, dof: f64) -> f64 {
        let norm = stats::t_ln_norm(dof) - scale.ln();
        self.points
            .iter()
            .map(|p| {
                let t = f64::from(p.distance) / scale;
                if p.killed {
                    stats::t_survival(t, dof).max(1e-300).ln()
                } else {
                    norm - 0.5 * (dof + 1.0) * (t * t / dof).ln_1p()
                }
            })
            .sum()
    }

    /// The maximum-likelihood scale of a t with `dof` degrees of freedom
    /// (the likelihood is unimodal in `ln(scale)`: a golden-section
    /// search, one likelihood per step), and that likelihood.
    fn likeliest_scale(&self, dof: f64) -> (f64, f64) {
        let (mut lo, mut hi) = (SCALES.0.ln(), SCALES.1.ln());
        let g = 0.5 * (5f64.sqrt() - 1.0);
        let (mut a, mut b) = (hi - g * (hi - lo), lo + g * (hi - lo));
        let (mut la, mut lb) = (
            self.ln_likelihood(a.exp(), dof),
            self.ln_likelihood(b.exp(), dof),
        );
        for _ in 0..SCALE_STEPS {
            if la > lb {
                (hi, b, lb) = (b, a, la);
                a = hi - g * (hi - lo);
                la = self.ln_likelihood(a.exp(), dof);
            } else {
                (lo, a, la) = (a, b, lb);
                b = lo + g * (hi - lo);
                lb = self.ln_likelihood(b.exp(), dof);
            }
        }
        let scale = (0.5 * (lo + hi)).exp();
        (scale, self.ln_likelihood(scale, dof))
    }

    /// How many of the record's limits a t of `scale` and `dof` says were
    /// passed, and how many were (of those with a known limit).
    fn passed(&self, scale: f64, dof: f64) -> (f64, f64) {
        self.points
            .iter()
            .filter(|p| p.limit.is_finite())
            .fold((0.0, 0.0), |(said, were), p| {
                (
                    said + stats::t_survival(f64::from(p.limit) / scale, dof),
                    were + f64::from(u8::from(p.killed)),
                )
            })
    }

    /// The degrees of freedom of the likeliest t, at the scale that passes
    /// the record's limits as often as they were passed.
    fn fit(&self) -> Option<Fitted> {
        let (_, dof, likeliest) = DOFS
            .iter()
            .map(|&dof| {
                let (scale, ll) = self.likeliest_scale(dof);
                (ll, dof, scale)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0))?;
        // No kill among the limits is taken as half a kill, and only when
        // the likeliest t says more: it bounds how far new workloads land,
        // and says nothing where the limits stood far out (nor where no
        // limit is known).
        let (said, kills) = self.passed(likeliest, dof);
        if kills == 0.0 && said <= 0.5 {
            return Some(Fitted {
                scale: likeliest,
                dof,
            });
        }
        let kills = kills.max(0.5);
        // Passing more limits as the scale grows: a bisection in ln(scale).
        let (mut lo, mut hi) = (likeliest.ln() - CHECK_RANGE, likeliest.ln() + CHECK_RANGE);
        for _ in 0..CHECK_STEPS {
            let mid = 0.5 * (lo + hi);
            if self.passed(mid.exp(), dof).0 < kills {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Some(Fitted {
            scale: (0.5 * (lo + hi)).exp().clamp(SCALES.0, SCALES.1),
            dof,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic Student-t sample of `n` points (scale `scale`, `dof`
    /// degrees of freedom) by the inverse of its distribution.
    fn t_sample(n: usize, scale: f64, dof: f64) -> Vec<f64> {
        (0..n)
            .map(|i| {
                // A scrambled order, so a record cut short is still a
                // sample of the whole distribution.
                let j = (i * 7919) % n;
                let p = (j as f64 + 0.5) / n as f64;
                scale * stats::t_quantile(p, dof)
            })
            .collect()
    }

    #[test]
    fn nothing_is_fitted_before_enough_first_builds() {
        let mut l = Landings::default();
        for d in t_sample(MIN_LANDINGS - 1, 0.3, 400.0) {
            l.add(d, None, false);
        }
        assert_eq!(l.fitted(), None);
        l.add(0.1, None, false);
        assert!(l.fitted().is_some());
        l.add(f64::NAN, None, false);
        assert_eq!(l.seen, MIN_LANDINGS as u64);
    }

    #[test]
    fn a_normal_record_is_fitted_as_one() {
        let mut l = Landings::default();
        for d in t_sample(KEPT, 0.4, 1e6) {
            l.add(d, None, false);
        }
        let f = l.fitted().unwrap();
        assert!((f.scale / 0.4 - 1.0).abs() < 0.08, "{f:?}");
        assert!(f.dof >= 25.0, "{f:?}");
    }

    #[test]
    fn a_record_where_most_barely_move_and_a_few_jump_is_heavy() {
        let mut l = Landings::default();
        for d in t_sample(KEPT, 0.15, 3.0) {
            l.add(d, None, false);
        }
        let f = l.fitted().unwrap();
        assert!((f.scale / 0.15 - 1.0).abs() < 0.15, "{f:?}");
        assert!(f.dof <= 5.0, "{f:?}");
    }

    #[test]
    fn killed_first_builds_count_as_beyond_their_limit() {
        // Builds landing σ 0.4 away, with limits at 0.5: the one in ten
        // beyond is only known to be beyond. Taking them at their limit
        // would make the spread look smaller than it is.
        let (mut censored, mut at_limit) = (Landings::default(), Landings::default());
        for d in t_sample(KEPT, 0.4, 1e6) {
            censored.add(d.min(0.5), Some(0.5), d > 0.5);
            at_limit.add(d.min(0.5), Some(0.5), false);
        }
        let (c, a) = (censored.fitted().unwrap(), at_limit.fitted().unwrap());
        assert!((c.scale / 0.4 - 1.0).abs() < 0.1, "{c:?}");
        assert!(a.scale < c.scale * 0.95, "{a:?} vs {c:?}");
    }

    #[test]
    fn the_scale_passes_the_records_limits_as_often_as_they_were() {
        // Three in four new versions barely move (σ 0.05), one in four
        // jumps (σ 1): limits 0.9 out were passed by 4.6 %, in a record
        // scrambled so that any cut of it is a sample of both.
        let (calm, jumps) = (t_sample(384, 0.05, 1e6), t_sample(128, 1.0, 1e6));
        let (mut calm, mut jumps) = (calm.into_iter(), jumps.into_iter());
        let mut l = Landings::default();
        for i in 0..KEPT {
            let d = if i % 4 == 3 {
                jumps.next()
            } else {
                calm.next()
            }
            .unwrap();
            l.add(d.min(0.9), Some(0.9), d > 0.9);
        }
        let f = l.fitted().unwrap();
        let (said, were) = l.passed(f.scale, f.dof);
        assert!(were > 15.0, "{were}");
        assert!((said / were - 1.0).abs() < 0.05, "{said} vs {were}: {f:?}");
        // The likeliest t follows the calm body and says far fewer.
        let (likeliest, _) = l.likeliest_scale(f.dof);
        assert!(
            l.passed(likeliest, f.dof).0 < 0.7 * were,
            "{likeliest} {f:?}"
        );
    }

    #[test]
    fn a_record_with_no_kill_at_its_limits_is_priced_within_them() {
        // Limits 2.5 σ out, where the likeliest t says 3 of 512 pass:
        // none did, so new workloads land closer than it says (half a
        // kill, within what the check may move).
        let (mut near, mut far) = (Landings::default(), Landings::default());
        for d in t_sample(KEPT, 0.2, 1e6) {
            let d = d.min(0.49);
            near.add(d, Some(0.5), false);
            far.add(d, Some(2.0), false);
        }
        let f = near.fitted().unwrap();
        assert!((near.passed(f.scale, f.dof).0 - 0.5).abs() < 0.01, "{f:?}");
        assert!(
            f.scale < 0.19 && f.scale > 0.2 * (-CHECK_RANGE).exp(),
            "{f:?}"
        );
        // Limits 10 σ out that nothing passed say nothing more.
        let f = far.fitted().unwrap();
        assert_eq!(f.scale, far.likeliest_scale(f.dof).0);
    }

    #[test]
    fn a_record_of_kills_alone_is_priced_wide() {
        let mut l = Landings::default();
        for _ in 0..MIN_LANDINGS {
            l.add(0.0, Some(0.0), true);
        }
        assert!(l.fitted().unwrap().scale > 1.0, "{:?}", l.fitted());
    }

    #[test]
    fn a_replayed_record_is_fitted_once_more_when_the_replay_ends() {
        let (mut live, mut replayed) = (Landings::default(), Landings::default());
        replayed.set_replaying(true);
        for (i, d) in t_sample(384, 0.3, 1e6).into_iter().enumerate() {
            let d = if i < 128 { d / 3.0 } else { d };
            live.add(d, None, false);
            replayed.add(d, None, false);
        }
        // The replay refits at 256 first builds, not at 384.
        assert_ne!(replayed.fitted(), live.fitted());
        replayed.set_replaying(false);
        assert_eq!(replayed.fit(), replayed.fitted());
        assert!(replayed.fitted().unwrap().scale > 0.2);
    }

    #[test]
    fn the_record_follows_the_latest_first_builds() {
        let mut l = Landings::default();
        for d in t_sample(KEPT, 0.1, 1e6) {
            l.add(d, None, false);
        }
        for d in t_sample(KEPT, 0.5, 1e6) {
            l.add(d, None, false);
        }
        assert_eq!(l.points.len(), KEPT);
        let f = l.fitted().unwrap();
        assert!((f.scale / 0.5 - 1.0).abs() < 0.1, "{f:?}");
    }
}
