//! Client-side rate limiting shared by the GitHub and GitLab clients.
//!
//! Both forges announce their budget on every answer (GitHub
//! `x-ratelimit-remaining` / `x-ratelimit-reset`, GitLab `RateLimit-Remaining`
//! / `RateLimit-Reset`, the reset as Unix seconds) and answer `Retry-After`
//! when a request was refused. A call that would certainly be refused is not
//! sent: it waits for the budget to come back, up to a bound, and fails with
//! [`ApiError::RateLimited`] past it. Sending it anyway would only burn more
//! of the budget and, on GitHub, risk the integration being banned for
//! ignoring the limit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;

use super::ApiError;

/// Whose budget a request spends. GitHub counts each installation token, the
/// App's own JWT and a personal token separately; one exhausted installation
/// must not stall calls made for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Bucket {
    /// A personal/project token (GitHub PAT, GitLab token).
    Token,
    /// A GitHub App installation token.
    Installation(u64),
    /// The GitHub App's JWT (`/app/...` endpoints).
    AppJwt,
}

/// What is known about one bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// Requests left until `reset_at`, as last announced and counted down
    /// locally for requests in flight since.
    remaining: Option<u64>,
    /// When the budget refills.
    reset_at: Option<Instant>,
    /// No request before this instant (`Retry-After`, secondary limits).
    not_before: Option<Instant>,
}

impl Window {
    /// How long a request must wait now; zero when it may go.
    fn wait(&self, now: Instant) -> Duration {
        let mut wait = Duration::ZERO;
        if let Some(nb) = self.not_before {
            wait = wait.max(nb.saturating_duration_since(now));
        }
        if self.remaining == Some(0)
            && let Some(reset) = self.reset_at
        {
            wait = wait.max(reset.saturating_duration_since(now));
        }
        wait
    }

    /// The announced budget, unless it is stale (its reset has passed).
    fn live_remaining(&self, now: Instant) -> Option<u64> {
        match self.reset_at {
            Some(reset) if reset <= now => None,
            _ => self.remaining,
        }
    }
}

/// The rate-limit state of one client.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    max_wait: Duration,
    buckets: Mutex<HashMap<Bucket, Window>>,
}

impl RateLimiter {
    pub(crate) fn new(max_wait: Duration) -> Self {
        Self {
            max_wait,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Bucket, Window>> {
        // The map holds plain numbers; a panic elsewhere cannot leave it
        // inconsistent, so a poisoned lock is still usable.
        self.buckets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until a request on `bucket` may be sent, or fails with
    /// [`ApiError::RateLimited`] when that is further away than the
    /// configured maximum wait. Takes one request off the local count, so
    /// concurrent callers do not all spend the last request.
    pub(crate) async fn admit(
        &self,
        bucket: Bucket,
        endpoint: &'static str,
    ) -> Result<(), ApiError> {
        loop {
            let wait = {
                let mut map = self.lock();
                let w = map.entry(bucket).or_default();
                let now = Instant::now();
                if w.reset_at.is_some_and(|r| r <= now) {
                    // The window has rolled over; the next answer says how
                    // much the new one holds.
                    w.remaining = None;
                    w.reset_at = None;
                }
                let wait = w.wait(now);
                if wait.is_zero() {
                    if let Some(r) = w.remaining.as_mut() {
                        *r = r.saturating_sub(1);
                    }
                    return Ok(());
                }
                wait
            };
            if wait > self.max_wait {
                return Err(ApiError::RateLimited { retry_after: wait });
            }
            tracing::debug!(
                endpoint,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "waiting for the forge rate limit"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Records the budget an answer announced.
    pub(crate) fn observe(&self, bucket: Bucket, headers: &HeaderMap) {
        let remaining = header_u64(headers, &["x-ratelimit-remaining", "ratelimit-remaining"]);
        let reset = header_u64(headers, &["x-ratelimit-reset", "ratelimit-reset"]);
        if remaining.is_none() && reset.is_none() {
            return;
        }
        let now = Instant::now();
        let mut map = self.lock();
        let w = map.entry(bucket).or_default();
        if let Some(r) = remaining {
            w.remaining = Some(r);
        }
        if let Some(epoch) = reset {
            w.reset_at = Some(now + until_epoch(epoch));
        }
    }

    /// Records that the forge refused a request on `bucket` and wants no
    /// other before `retry_after` has passed.
    pub(crate) fn refused(&self, bucket: Bucket, retry_after: Duration) {
        let until = Instant::now() + retry_after;
        let mut map = self.lock();
        let w = map.entry(bucket).or_default();
        w.not_before = Some(w.not_before.map_or(until, |nb| nb.max(until)));
    }

    /// The lowest budget any bucket has left, when one is known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        let now = Instant::now();
        self.lock()
            .values()
            .filter_map(|w| w.live_remaining(now))
            .min()
    }
}

/// How long an answer that refused a request asks us to wait, when it is a
/// rate-limit refusal at all: any `429`, and a `403` that carries
/// `Retry-After`, announces an exhausted budget or says so in its message
/// (GitHub's secondary limits). GitHub's documented fallbacks: the reset time
/// when the budget is exhausted, else one minute.
pub(crate) fn refusal(status: u16, headers: &HeaderMap, message: &str) -> Option<Duration> {
    const FALLBACK: Duration = Duration::from_secs(60);
    if status != 429 && status != 403 {
        return None;
    }
    let retry_after = header_u64(headers, &["retry-after"]).map(Duration::from_secs);
    let exhausted =
        header_u64(headers, &["x-ratelimit-remaining", "ratelimit-remaining"]) == Some(0);
    let reset = header_u64(headers, &["x-ratelimit-reset", "ratelimit-reset"]).map(until_epoch);
    let says_so = message.to_ascii_lowercase().contains("rate limit");
    if status == 403 && retry_after.is_none() && !exhausted && !says_so {
        // An ordinary permission refusal (or GitHub refusing a re-run of a
        // run in progress).
        return None;
    }
    Some(match (retry_after, exhausted, reset) {
        (Some(d), _, _) => d,
        (None, true, Some(d)) => d,
        _ => FALLBACK,
    })
}

/// The first of `names` present as a decimal number.
fn header_u64(headers: &HeaderMap, names: &[&str]) -> Option<u64> {
    names.iter().find_map(|n| {
        headers
            .get(*n)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
    })
}

/// From now until a Unix time (zero when it has passed).
fn until_epoch(epoch_secs: u64) -> Duration {
    let at = UNIX_EPOCH + Duration::from_secs(epoch_secs);
    at.duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header value"));
        }
        h
    }

    fn epoch_in(secs: u64) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        (now + secs).to_string()
    }

    #[test]
    fn refusals() {
        let none = HeaderMap::new();
        assert_eq!(
            refusal(403, &none, "Resource not accessible by integration"),
            None
        );
        assert_eq!(refusal(404, &none, "rate limit"), None);
        assert_eq!(refusal(429, &none, ""), Some(Duration::from_secs(60)));
        assert_eq!(
            refusal(403, &headers(&[("retry-after", "7".into())]), ""),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            refusal(403, &none, "You have exceeded a secondary rate limit"),
            Some(Duration::from_secs(60))
        );
        let exhausted = headers(&[
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", epoch_in(100)),
        ]);
        let wait = refusal(403, &exhausted, "API rate limit exceeded").expect("limited");
        assert!(
            wait > Duration::from_secs(90) && wait <= Duration::from_secs(100),
            "{wait:?}"
        );
        let gitlab = headers(&[
            ("retry-after", "3".into()),
            ("ratelimit-remaining", "0".into()),
        ]);
        assert_eq!(refusal(429, &gitlab, ""), Some(Duration::from_secs(3)));
    }

    #[tokio::test]
    async fn exhausted_budget_waits_or_refuses() {
        let limiter = RateLimiter::new(Duration::from_secs(5));
        limiter.observe(
            Bucket::Token,
            &headers(&[
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", epoch_in(3600)),
            ]),
        );
        assert_eq!(limiter.remaining(), Some(0));
        let err = limiter
            .admit(Bucket::Token, "t")
            .await
            .expect_err("over the bound");
        assert!(
            matches!(err, ApiError::RateLimited { retry_after } if retry_after > Duration::from_secs(3000))
        );
        // Another bucket is unaffected.
        limiter
            .admit(Bucket::Installation(1), "t")
            .await
            .expect("other bucket");
    }

    #[tokio::test]
    async fn local_countdown_and_not_before() {
        let limiter = RateLimiter::new(Duration::from_millis(300));
        limiter.observe(
            Bucket::Token,
            &headers(&[
                ("x-ratelimit-remaining", "2".into()),
                ("x-ratelimit-reset", epoch_in(3600)),
            ]),
        );
        limiter.admit(Bucket::Token, "t").await.expect("first");
        limiter.admit(Bucket::Token, "t").await.expect("second");
        assert_eq!(limiter.remaining(), Some(0));
        assert!(limiter.admit(Bucket::Token, "t").await.is_err());

        let limiter = RateLimiter::new(Duration::from_secs(1));
        limiter.refused(Bucket::AppJwt, Duration::from_millis(100));
        let started = Instant::now();
        limiter
            .admit(Bucket::AppJwt, "t")
            .await
            .expect("after the wait");
        assert!(started.elapsed() >= Duration::from_millis(90));
    }
}
