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
//!
//! GitHub keeps one budget per credential **and** per resource (its
//! `x-ratelimit-resource`: `core` for most REST calls,
//! `actions_runner_registration` for JIT configs and registration tokens,
//! `search`, ...): an exhausted `core` does not stop a JIT config. The state
//! here is keyed the same way. A request's resource is the one an earlier
//! answer to the same endpoint kind named; before any did, the one GitHub
//! documents for it ([`default_resource`]). Every answer files its budget
//! under the resource it names, so a wrong guess is corrected by the first
//! answer. Secondary limits (`Retry-After` without an exhausted budget) are
//! GitHub's per-credential brake and hold back every resource of that
//! credential.

use std::collections::{BTreeMap, HashMap};
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

impl Bucket {
    /// The bucket as a metric label: `token`, `installation:<id>`, `app`.
    fn label(self) -> String {
        match self {
            Self::Token => "token".to_owned(),
            Self::Installation(id) => format!("installation:{id}"),
            Self::AppJwt => "app".to_owned(),
        }
    }
}

/// The resource name used for a forge that does not name its budgets
/// (GitLab).
pub(crate) const UNNAMED: &str = "default";

/// The resource GitHub documents for an endpoint kind: registering a
/// runner spends `actions_runner_registration`, everything else `core`.
pub(crate) fn default_resource(endpoint: &str) -> &'static str {
    match endpoint {
        "generate_jitconfig" | "registration_token" => "actions_runner_registration",
        _ => "core",
    }
}

/// One budget as last announced: a credential's resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateBudget {
    /// Whose budget: `token`, `installation:<id>` or `app` (the App's JWT).
    pub credential: String,
    /// GitHub's `x-ratelimit-resource` (`core`,
    /// `actions_runner_registration`, ...); `default` for GitLab.
    pub resource: String,
    /// Requests per window, when announced.
    pub limit: Option<u64>,
    /// Requests left (counted down locally for requests sent since).
    pub remaining: Option<u64>,
    /// When the budget refills, Unix seconds.
    pub reset_epoch: Option<u64>,
}

/// What is known about one bucket.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    /// Requests left until `reset_at`, as last announced and counted down
    /// locally for requests in flight since.
    remaining: Option<u64>,
    /// When the budget refills.
    reset_at: Option<Instant>,
    /// No request before this instant (`Retry-After` on a refusal that
    /// exhausted this budget).
    not_before: Option<Instant>,
    /// Requests per window, as announced.
    limit: Option<u64>,
    /// `reset_at` as the Unix seconds announced.
    reset_epoch: Option<u64>,
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

/// A budget's key: whose and which resource.
type Key = (Bucket, String);

/// The state behind the lock.
#[derive(Debug, Default)]
struct State {
    windows: HashMap<Key, Window>,
    /// No request on the credential before this instant: a secondary limit.
    held: HashMap<Bucket, Instant>,
    /// The resource the last answer to each endpoint kind named.
    learned: HashMap<&'static str, String>,
}

/// The rate-limit state of one client.
#[derive(Debug)]
pub(crate) struct RateLimiter {
    max_wait: Duration,
    state: Mutex<State>,
}

impl RateLimiter {
    pub(crate) fn new(max_wait: Duration) -> Self {
        Self {
            max_wait,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The map holds plain numbers; a panic elsewhere cannot leave it
        // inconsistent, so a poisoned lock is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The resource a request to `endpoint` spends: as an earlier answer
    /// named it, else `fallback` (see the module documentation).
    pub(crate) fn resource_of(&self, endpoint: &'static str, fallback: &str) -> String {
        self.lock()
            .learned
            .get(endpoint)
            .cloned()
            .unwrap_or_else(|| fallback.to_owned())
    }

    /// Waits until a request on `bucket`'s `resource` may be sent, or fails
    /// with [`ApiError::RateLimited`] when that is further away than the
    /// configured maximum wait. Takes one request off the local count, so
    /// concurrent callers do not all spend the last request.
    pub(crate) async fn admit(
        &self,
        bucket: Bucket,
        resource: &str,
        endpoint: &'static str,
    ) -> Result<(), ApiError> {
        let key = (bucket, resource.to_owned());
        loop {
            let wait = {
                let mut st = self.lock();
                let now = Instant::now();
                let held = st
                    .held
                    .get(&bucket)
                    .map_or(Duration::ZERO, |nb| nb.saturating_duration_since(now));
                let w = st.windows.entry(key.clone()).or_default();
                if w.reset_at.is_some_and(|r| r <= now) {
                    // The window has rolled over; the next answer says how
                    // much the new one holds.
                    w.remaining = None;
                    w.reset_at = None;
                    w.reset_epoch = None;
                }
                let wait = w.wait(now).max(held);
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
                resource,
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "waiting for the forge rate limit"
            );
            tokio::time::sleep(wait).await;
        }
    }

    /// Records the budget an answer to `endpoint` announced, under the
    /// resource it names (else `fallback`); returns that resource.
    pub(crate) fn observe(
        &self,
        bucket: Bucket,
        endpoint: &'static str,
        fallback: &str,
        headers: &HeaderMap,
    ) -> String {
        let named = header_str(headers, "x-ratelimit-resource");
        let resource = named.clone().unwrap_or_else(|| fallback.to_owned());
        let mut st = self.lock();
        if let Some(named) = named {
            st.learned.insert(endpoint, named);
        }
        let remaining = header_u64(headers, &["x-ratelimit-remaining", "ratelimit-remaining"]);
        let reset = header_u64(headers, &["x-ratelimit-reset", "ratelimit-reset"]);
        if remaining.is_none() && reset.is_none() {
            return resource;
        }
        let limit = header_u64(headers, &["x-ratelimit-limit", "ratelimit-limit"]);
        let w = st.windows.entry((bucket, resource.clone())).or_default();
        Self::record(w, limit, remaining, reset);
        resource
    }

    /// Records every resource of a `GET /rate_limit` answer
    /// (`resources.<name>.{limit, remaining, reset}`): what GitHub itself
    /// counts, free of charge and of clock skew.
    pub(crate) fn observe_all(&self, bucket: Bucket, resources: &BTreeMap<String, Announced>) {
        let mut st = self.lock();
        for (name, a) in resources {
            let w = st.windows.entry((bucket, name.clone())).or_default();
            Self::record(w, a.limit, a.remaining, a.reset);
            if a.remaining.is_some_and(|r| r > 0) {
                // Refilled: a refusal's wait on this budget is over.
                w.not_before = None;
            }
        }
    }

    fn record(w: &mut Window, limit: Option<u64>, remaining: Option<u64>, reset: Option<u64>) {
        if let Some(l) = limit {
            w.limit = Some(l);
        }
        if let Some(r) = remaining {
            w.remaining = Some(r);
        }
        if let Some(epoch) = reset {
            w.reset_at = Some(Instant::now() + until_epoch(epoch));
            w.reset_epoch = Some(epoch);
        }
    }

    /// Records that the forge refused a request and wants no other before
    /// `retry_after` has passed: on `resource` alone when the refusal said
    /// that budget is exhausted (a primary limit), else on every resource of
    /// the credential (a secondary limit).
    pub(crate) fn refused(
        &self,
        bucket: Bucket,
        resource: &str,
        exhausted: bool,
        retry_after: Duration,
    ) {
        let until = Instant::now() + retry_after;
        let later = |nb: Option<Instant>| Some(nb.map_or(until, |nb| nb.max(until)));
        let mut st = self.lock();
        if exhausted {
            let w = st.windows.entry((bucket, resource.to_owned())).or_default();
            w.not_before = later(w.not_before);
        } else {
            let held = st.held.get(&bucket).copied();
            if let Some(nb) = later(held) {
                st.held.insert(bucket, nb);
            }
        }
    }

    /// The lowest budget any bucket has left, when one is known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        let now = Instant::now();
        self.lock()
            .windows
            .values()
            .filter_map(|w| w.live_remaining(now))
            .min()
    }

    /// Every budget an answer announced, sorted by credential and resource.
    pub(crate) fn budgets(&self) -> Vec<RateBudget> {
        let now = Instant::now();
        let mut out: Vec<RateBudget> = self
            .lock()
            .windows
            .iter()
            .filter(|(_, w)| w.remaining.is_some() || w.reset_epoch.is_some())
            .map(|((bucket, resource), w)| RateBudget {
                credential: bucket.label(),
                resource: resource.clone(),
                limit: w.limit,
                remaining: w.live_remaining(now),
                reset_epoch: w.reset_epoch,
            })
            .collect();
        out.sort_by(|a, b| (&a.credential, &a.resource).cmp(&(&b.credential, &b.resource)));
        out
    }
}

/// One resource of a `GET /rate_limit` answer.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
pub(crate) struct Announced {
    #[serde(default)]
    pub(crate) limit: Option<u64>,
    #[serde(default)]
    pub(crate) remaining: Option<u64>,
    #[serde(default)]
    pub(crate) reset: Option<u64>,
}

/// Whether an answer says its budget is exhausted.
pub(crate) fn exhausted(headers: &HeaderMap) -> bool {
    header_u64(headers, &["x-ratelimit-remaining", "ratelimit-remaining"]) == Some(0)
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

/// A header's text.
fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
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
            "t",
            "core",
            &headers(&[
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", epoch_in(3600)),
            ]),
        );
        assert_eq!(limiter.remaining(), Some(0));
        let err = limiter
            .admit(Bucket::Token, "core", "t")
            .await
            .expect_err("over the bound");
        assert!(
            matches!(err, ApiError::RateLimited { retry_after } if retry_after > Duration::from_secs(3000))
        );
        // Another bucket is unaffected.
        limiter
            .admit(Bucket::Installation(1), "core", "t")
            .await
            .expect("other bucket");
    }

    #[tokio::test]
    async fn local_countdown_and_not_before() {
        let limiter = RateLimiter::new(Duration::from_millis(300));
        limiter.observe(
            Bucket::Token,
            "t",
            "core",
            &headers(&[
                ("x-ratelimit-remaining", "2".into()),
                ("x-ratelimit-reset", epoch_in(3600)),
            ]),
        );
        limiter
            .admit(Bucket::Token, "core", "t")
            .await
            .expect("first");
        limiter
            .admit(Bucket::Token, "core", "t")
            .await
            .expect("second");
        assert_eq!(limiter.remaining(), Some(0));
        assert!(limiter.admit(Bucket::Token, "core", "t").await.is_err());

        let limiter = RateLimiter::new(Duration::from_secs(1));
        limiter.refused(Bucket::AppJwt, "core", false, Duration::from_millis(100));
        let started = Instant::now();
        limiter
            .admit(Bucket::AppJwt, "core", "t")
            .await
            .expect("after the wait");
        assert!(started.elapsed() >= Duration::from_millis(90));
    }

    fn exhausted_until(resource: &str, secs: u64) -> HeaderMap {
        headers(&[
            ("x-ratelimit-limit", "5000".into()),
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", epoch_in(secs)),
            ("x-ratelimit-resource", resource.to_owned()),
        ])
    }

    #[tokio::test]
    async fn one_resource_exhausted_leaves_the_others_alone() {
        let limiter = RateLimiter::new(Duration::from_millis(50));
        // A JIT config's answer says the registration budget is spent for
        // an hour; a core answer after it says core has plenty.
        let named = limiter.observe(
            Bucket::Token,
            "generate_jitconfig",
            "actions_runner_registration",
            &exhausted_until("actions_runner_registration", 3600),
        );
        assert_eq!(named, "actions_runner_registration");
        limiter.observe(
            Bucket::Token,
            "list_runners",
            "core",
            &headers(&[
                ("x-ratelimit-remaining", "4999".into()),
                ("x-ratelimit-reset", epoch_in(3600)),
                ("x-ratelimit-resource", "core".into()),
            ]),
        );
        let err = limiter
            .admit(
                Bucket::Token,
                "actions_runner_registration",
                "generate_jitconfig",
            )
            .await
            .expect_err("registration is spent");
        assert!(
            matches!(err, ApiError::RateLimited { retry_after } if retry_after > Duration::from_secs(3500))
        );
        limiter
            .admit(Bucket::Token, "core", "list_runners")
            .await
            .expect("core is not held back by registration");

        // And the other way round, on another credential.
        limiter.observe(
            Bucket::Installation(7),
            "list_runners",
            "core",
            &exhausted_until("core", 3600),
        );
        assert!(
            limiter
                .admit(Bucket::Installation(7), "core", "list_runners")
                .await
                .is_err()
        );
        limiter
            .admit(
                Bucket::Installation(7),
                "actions_runner_registration",
                "generate_jitconfig",
            )
            .await
            .expect("registration is not held back by core");

        // Both are reported, each with its reset.
        let budgets = limiter.budgets();
        let find = |cred: &str, res: &str| {
            budgets
                .iter()
                .find(|b| b.credential == cred && b.resource == res)
                .cloned()
                .unwrap_or_else(|| panic!("{cred} {res} in {budgets:?}"))
        };
        assert_eq!(
            find("token", "actions_runner_registration").remaining,
            Some(0)
        );
        assert_eq!(find("token", "core").remaining, Some(4998));
        assert_eq!(find("installation:7", "core").remaining, Some(0));
        assert_eq!(find("token", "core").limit, None);
        assert_eq!(find("installation:7", "core").limit, Some(5000));
        assert!(find("installation:7", "core").reset_epoch.is_some());
    }

    #[tokio::test]
    async fn an_unnamed_request_takes_the_documented_resource_until_an_answer_names_one() {
        let limiter = RateLimiter::new(Duration::from_millis(50));
        assert_eq!(
            default_resource("generate_jitconfig"),
            "actions_runner_registration"
        );
        assert_eq!(default_resource("list_runner_downloads"), "core");
        assert_eq!(limiter.resource_of("get_job", "core"), "core");
        // GitHub answers that endpoint from another budget: later requests
        // to it are held against that one.
        limiter.observe(
            Bucket::Token,
            "get_job",
            "core",
            &exhausted_until("actions", 600),
        );
        assert_eq!(limiter.resource_of("get_job", "core"), "actions");
        assert!(
            limiter
                .admit(Bucket::Token, "actions", "get_job")
                .await
                .is_err()
        );
        limiter
            .admit(Bucket::Token, "core", "list_runners")
            .await
            .expect("core untouched");
        // Without the header the answer is filed under the fallback.
        let named = limiter.observe(
            Bucket::Token,
            "list_runners",
            "core",
            &headers(&[("x-ratelimit-remaining", "3".into())]),
        );
        assert_eq!(named, "core");
    }

    #[tokio::test]
    async fn secondary_limits_hold_the_credential_and_rate_limit_reads_refill() {
        let limiter = RateLimiter::new(Duration::from_millis(10));
        limiter.refused(Bucket::Token, "core", false, Duration::from_secs(60));
        for resource in ["core", "actions_runner_registration"] {
            assert!(limiter.admit(Bucket::Token, resource, "t").await.is_err());
        }
        limiter
            .admit(Bucket::AppJwt, "core", "t")
            .await
            .expect("another credential");

        // A primary refusal holds its resource only; GET /rate_limit saying
        // it refilled lifts it.
        limiter.observe(
            Bucket::AppJwt,
            "generate_jitconfig",
            "actions_runner_registration",
            &exhausted_until("actions_runner_registration", 3600),
        );
        limiter.refused(
            Bucket::AppJwt,
            "actions_runner_registration",
            true,
            Duration::from_secs(3600),
        );
        assert!(
            limiter
                .admit(Bucket::AppJwt, "actions_runner_registration", "t")
                .await
                .is_err()
        );
        let reset: u64 = epoch_in(3600).parse().expect("epoch");
        let refilled = BTreeMap::from([(
            "actions_runner_registration".to_owned(),
            Announced {
                limit: Some(10000),
                remaining: Some(10000),
                reset: Some(reset),
            },
        )]);
        limiter.observe_all(Bucket::AppJwt, &refilled);
        limiter
            .admit(Bucket::AppJwt, "actions_runner_registration", "t")
            .await
            .expect("refilled");
    }
}
