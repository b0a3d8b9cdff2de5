//! `RUNYARD_USAGE_OIDC_RATE`: how many usage reports one project's identity
//! tokens may send per minute. Each token already speaks for one job
//! attempt only; the bound stops the jobs of one project (many tokens) from
//! filling the event log (`RUNYARD_EVENTS_MAX_BYTES`) for everyone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The variable, for messages.
pub const VAR: &str = "RUNYARD_USAGE_OIDC_RATE";

/// Projects tracked at most; past it, projects whose bucket is full again
/// (idle for a minute) are forgotten.
const MAX_PROJECTS: usize = 10_000;

/// A token bucket per `(issuer, project)`: `per_minute` reports, refilled
/// evenly, with a minute's worth as the burst.
#[derive(Debug)]
pub struct ProjectRate {
    per_minute: u32,
    buckets: Mutex<HashMap<(String, String), (f64, Instant)>>,
}

impl ProjectRate {
    /// `per_minute` = 0 turns the limit off.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            buckets: Mutex::default(),
        }
    }

    /// Takes one report of `project` (as `issuer`'s tokens name it) at
    /// `now`; `Err(wait)` when the project is over its rate, `wait` being
    /// when the next one fits.
    pub fn admit(&self, issuer: &str, project: &str, now: Instant) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let capacity = f64::from(self.per_minute);
        let per_sec = capacity / 60.0;
        let refilled = |(tokens, at): (f64, Instant)| {
            (tokens + now.saturating_duration_since(at).as_secs_f64() * per_sec).min(capacity)
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= MAX_PROJECTS {
            buckets.retain(|_, b| refilled(*b) < capacity);
        }
        let key = (issuer.to_owned(), project.to_ascii_lowercase());
        let bucket = buckets.entry(key).or_insert((capacity, now));
        let tokens = refilled(*bucket);
        if tokens < 1.0 {
            *bucket = (tokens, now);
            return Err(Duration::from_secs_f64((1.0 - tokens) / per_sec));
        }
        *bucket = (tokens - 1.0, now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_project_gets_its_rate_and_others_are_not_slowed() {
        let rate = ProjectRate::new(60);
        let t0 = Instant::now();
        for _ in 0..60 {
            assert_eq!(rate.admit("iss", "acme/app", t0), Ok(()));
        }
        let wait = rate.admit("iss", "ACME/app", t0).expect_err("over");
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::ZERO,
            "{wait:?}"
        );
        assert_eq!(rate.admit("iss", "acme/other", t0), Ok(()), "per project");
        assert_eq!(
            rate.admit("other-iss", "acme/app", t0),
            Ok(()),
            "per issuer"
        );
        // A second later one more fits, not two.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(rate.admit("iss", "acme/app", t1), Ok(()));
        assert!(rate.admit("iss", "acme/app", t1).is_err());
        assert_eq!(ProjectRate::new(0).admit("iss", "acme/app", t0), Ok(()));
    }
}
