//! REST clients for the forges: [`github::GitHubClient`] (JIT runners, runner
//! lists and deletes, workflow runs and jobs, re-runs, webhook redelivery,
//! GitHub App authentication) and [`gitlab::GitLabClient`] (runners created
//! through the API, jobs, pipelines, retries), and
//! [`scaleset::ActionsClient`] (GitHub's Actions service for runner scale
//! sets: registration, scale sets, message sessions, JIT runners).
//!
//! Shared behaviour:
//!
//! - every call has a timeout ([`ClientOptions::timeout`]) and reads at most
//!   [`MAX_BODY`] bytes of an answer;
//! - the rate-limit budget the forge announces is tracked; a call that would
//!   be refused waits for the budget (at most
//!   [`ClientOptions::max_rate_limit_wait`]) instead of being sent, and a
//!   refusal with `Retry-After` makes later calls wait too;
//! - calls are counted per endpoint kind ([`CallCounts`]) for metrics;
//! - credentials live in [`secrecy::SecretString`] and never reach an error's
//!   text, a log line or `Debug` output. Redirects are only followed within
//!   the configured origin, so a credential header never leaves it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::{StatusCode, Url};
use serde::de::DeserializeOwned;

pub mod github;
pub mod gitlab;
mod ratelimit;
pub mod scaleset;

pub use ratelimit::RateBudget;
use ratelimit::{Bucket, RateLimiter};

/// The most of an answer's body a client reads: a page of 100 jobs with
/// their steps is a few hundred KiB.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// The most of a forge's error message kept in [`ApiError::Status`].
const MAX_MESSAGE: usize = 300;

/// Why a forge call failed.
///
/// The text of every variant is safe to log: it names the endpoint kind and
/// what went wrong, never a credential, and never the body of an answer that
/// carried one.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The forge's rate limit refuses this call; try again after
    /// `retry_after`. Either the forge said so (`403`/`429` with
    /// `Retry-After`, or an exhausted budget), or the budget is known to be
    /// exhausted for longer than the client may wait, and nothing was sent.
    #[error("rate limited by the forge, retry after {}s", retry_after.as_secs_f64())]
    RateLimited {
        /// How long to wait before the next call.
        retry_after: Duration,
    },
    /// The forge answered with a status the endpoint does not expect.
    #[error("{endpoint_kind}: the forge answered {status}: {message}")]
    Status {
        /// HTTP status code.
        status: u16,
        /// Which endpoint (one of the `ENDPOINTS` of [`github`] or [`gitlab`]).
        endpoint_kind: &'static str,
        /// The forge's `message` (GitLab: `message` or `error`), shortened.
        message: String,
    },
    /// The request did not complete: connection refused or reset, timeout,
    /// TLS failure, an unreadable body.
    #[error("{endpoint_kind}: request failed ({})", transport_kind(source))]
    Transport {
        /// Which endpoint.
        endpoint_kind: &'static str,
        /// The underlying error (its URL removed).
        #[source]
        source: reqwest::Error,
    },
    /// The forge's answer is not what the endpoint documents.
    #[error("{endpoint_kind}: unexpected answer: {detail}")]
    Decode {
        /// Which endpoint.
        endpoint_kind: &'static str,
        /// What did not fit (never a value from an answer carrying a
        /// credential).
        detail: String,
    },
    /// Credentials could not be used: an unreadable App private key, a JWT
    /// that could not be signed, an App-only endpoint called with a token.
    #[error("authentication: {0}")]
    Auth(String),
    /// The client was configured wrongly (base URL).
    #[error("configuration: {0}")]
    Config(String),
}

fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the answer failed"
    } else {
        "sending failed"
    }
}

impl ApiError {
    /// Whether trying the same call again later may succeed: rate limits,
    /// transport failures, `408`, `429` and `5xx` answers.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::RateLimited { .. } | Self::Transport { .. } => true,
            Self::Status { status, .. } => matches!(status, 408 | 429 | 500..=599),
            Self::Decode { .. } | Self::Auth(_) | Self::Config(_) => false,
        }
    }

    /// The HTTP status of a [`ApiError::Status`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The forge answered `404`.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

/// Settings shared by both clients.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Bound on each HTTP request, connect to last byte.
    pub timeout: Duration,
    /// The longest a call waits for an exhausted rate-limit budget (or a
    /// `Retry-After`) before failing with [`ApiError::RateLimited`] unsent.
    pub max_rate_limit_wait: Duration,
    /// The `User-Agent` sent (GitHub refuses requests without one).
    pub user_agent: String,
}

impl ClientOptions {
    /// Defaults with the given timeout: wait at most 30 s for a rate limit.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            max_rate_limit_wait: Duration::from_secs(30),
            user_agent: concat!("runyard/", env!("CARGO_PKG_VERSION")).to_owned(),
        }
    }

    /// The same with another maximum rate-limit wait.
    #[must_use]
    pub fn with_max_rate_limit_wait(mut self, wait: Duration) -> Self {
        self.max_rate_limit_wait = wait;
        self
    }
}

/// A snapshot of how many requests a client sent, per endpoint kind, and how
/// many of them the forge refused for rate limiting. Token and installation
/// look-ups count under their own kinds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Requests sent, per endpoint kind (every kind listed, zeros included).
    pub calls: BTreeMap<&'static str, u64>,
    /// Answers that were rate-limit refusals.
    pub rate_limited: u64,
}

impl CallCounts {
    /// Requests sent to one endpoint kind.
    pub fn get(&self, endpoint_kind: &str) -> u64 {
        self.calls.get(endpoint_kind).copied().unwrap_or(0)
    }

    /// Requests sent in all.
    pub fn total(&self) -> u64 {
        self.calls.values().sum()
    }
}

/// Lock-free per-endpoint counters.
#[derive(Debug)]
struct Counters {
    calls: Vec<(&'static str, AtomicU64)>,
    rate_limited: AtomicU64,
}

impl Counters {
    fn new(kinds: &[&'static str]) -> Self {
        Self {
            calls: kinds.iter().map(|k| (*k, AtomicU64::new(0))).collect(),
            rate_limited: AtomicU64::new(0),
        }
    }

    fn count(&self, kind: &'static str) {
        if let Some((_, c)) = self.calls.iter().find(|(k, _)| *k == kind) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn snapshot(&self) -> CallCounts {
        CallCounts {
            calls: self
                .calls
                .iter()
                .map(|(k, c)| (*k, c.load(Ordering::Relaxed)))
                .collect(),
            rate_limited: self.rate_limited.load(Ordering::Relaxed),
        }
    }
}

/// An answer that was not a rate-limit refusal.
#[derive(Debug)]
pub(crate) struct Raw {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Raw {
    /// This answer if its status is 2xx, else [`ApiError::Status`] with the
    /// forge's message.
    pub(crate) fn success(self, endpoint: &'static str) -> Result<Self, ApiError> {
        if self.status.is_success() {
            Ok(self)
        } else {
            Err(self.into_error(endpoint))
        }
    }

    /// [`ApiError::Status`] for this answer.
    pub(crate) fn into_error(self, endpoint: &'static str) -> ApiError {
        ApiError::Status {
            status: self.status.as_u16(),
            endpoint_kind: endpoint,
            message: message_of(&self.body),
        }
    }

    /// The body as `T`. The serde message (which may quote values from the
    /// answer) is kept only when `sensitive` is false.
    pub(crate) fn json<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        sensitive: bool,
    ) -> Result<T, ApiError> {
        decode(&self.body, endpoint, sensitive)
    }
}

pub(crate) fn decode<T: DeserializeOwned>(
    body: &[u8],
    endpoint: &'static str,
    sensitive: bool,
) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::Decode {
        endpoint_kind: endpoint,
        detail: if sensitive {
            format!(
                "malformed JSON ({:?}) at line {} column {}",
                e.classify(),
                e.line(),
                e.column()
            )
        } else {
            e.to_string()
        },
    })
}

/// The human-readable message of an error answer: GitHub's `message`,
/// GitLab's `message` (a string or an object of field errors) or `error`,
/// else the start of the body; shortened, control characters dropped.
pub(crate) fn message_of(body: &[u8]) -> String {
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match v.get("message").or_else(|| v.get("error")) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => v.to_string(),
        },
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    };
    shortened(&text)
}

/// `text` as an error message keeps it: control characters blanked, at
/// most [`MAX_MESSAGE`] characters (an ellipsis says it was cut), trimmed.
pub(crate) fn shortened(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_MESSAGE)
        .collect();
    if text.chars().count() > MAX_MESSAGE {
        out.push('…');
    }
    out.trim().to_owned()
}

/// The HTTP machinery both clients share.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) http: reqwest::Client,
    /// Base URL, without a trailing slash.
    base: Url,
    limiter: RateLimiter,
    counters: Counters,
}

impl Core {
    pub(crate) fn new(
        base_url: &str,
        options: &ClientOptions,
        kinds: &[&'static str],
    ) -> Result<Self, ApiError> {
        let base = parse_base(base_url)?;
        // reqwest needs a process-wide rustls provider; binaries install
        // ring at start, this covers tests and tools that do not. A second
        // install is refused, which is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let origin = base.origin();
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(options.timeout)
            .user_agent(options.user_agent.clone())
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                // Credential headers (PRIVATE-TOKEN) would travel with a
                // redirect: follow only within the forge's origin.
                if attempt.previous().len() < 5 && attempt.url().origin() == origin {
                    attempt.follow()
                } else {
                    attempt.stop()
                }
            }))
            .build()
            .map_err(|e| {
                ApiError::Config(format!("building the HTTP client: {}", e.without_url()))
            })?;
        Ok(Self {
            http,
            base,
            limiter: RateLimiter::new(options.max_rate_limit_wait),
            counters: Counters::new(kinds),
        })
    }

    /// `path` (starting with `/`, possibly with a query) under the base URL.
    pub(crate) fn url(&self, path: &str) -> Result<Url, ApiError> {
        let joined = format!("{}{}", self.base.as_str().trim_end_matches('/'), path);
        Url::parse(&joined).map_err(|e| ApiError::Config(format!("bad request path: {e}")))
    }

    /// Whether `url` (a pagination link) is on the configured origin, so the
    /// credential may be sent to it.
    pub(crate) fn same_origin(&self, url: &Url) -> bool {
        url.origin() == self.base.origin()
    }

    /// Sends one request: waits for the rate limit of the resource it
    /// spends (`resource`, unless an earlier answer to `endpoint` named
    /// another), counts it, reads a bounded body, records the announced
    /// budget and turns a rate-limit refusal into
    /// [`ApiError::RateLimited`]. Any other answer comes back as [`Raw`] for
    /// the endpoint to judge.
    pub(crate) async fn execute(
        &self,
        bucket: Bucket,
        endpoint: &'static str,
        resource: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<Raw, ApiError> {
        let resource = self.limiter.resource_of(endpoint, resource);
        self.limiter.admit(bucket, &resource, endpoint).await?;
        self.send_counted(bucket, endpoint, &resource, request)
            .await
    }

    /// Sends a request that spends no budget (GitHub's `GET /rate_limit`):
    /// not held back by an exhausted one.
    pub(crate) async fn execute_free(
        &self,
        bucket: Bucket,
        endpoint: &'static str,
        request: reqwest::RequestBuilder,
    ) -> Result<Raw, ApiError> {
        self.send_counted(bucket, endpoint, ratelimit::UNNAMED, request)
            .await
    }

    async fn send_counted(
        &self,
        bucket: Bucket,
        endpoint: &'static str,
        resource: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Raw, ApiError> {
        self.counters.count(endpoint);
        let transport = |e: reqwest::Error| ApiError::Transport {
            endpoint_kind: endpoint,
            source: e.without_url(),
        };
        let mut response = request.send().await.map_err(transport)?;
        let status = response.status();
        let headers = response.headers().clone();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(ApiError::Decode {
                    endpoint_kind: endpoint,
                    detail: format!("answer larger than {MAX_BODY} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let resource = self.limiter.observe(bucket, endpoint, resource, &headers);
        let raw = Raw {
            status,
            headers,
            body,
        };
        if !status.is_success() {
            let message = message_of(&raw.body);
            if let Some(retry_after) = ratelimit::refusal(status.as_u16(), &raw.headers, &message) {
                let exhausted = ratelimit::exhausted(&raw.headers);
                self.limiter
                    .refused(bucket, &resource, exhausted, retry_after);
                self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    endpoint,
                    status = status.as_u16(),
                    resource,
                    retry_after_s = retry_after.as_secs(),
                    "forge rate limit hit"
                );
                return Err(ApiError::RateLimited { retry_after });
            }
        }
        Ok(raw)
    }

    pub(crate) fn calls(&self) -> CallCounts {
        self.counters.snapshot()
    }

    pub(crate) fn rate_limit_remaining(&self) -> Option<u64> {
        self.limiter.remaining()
    }

    pub(crate) fn rate_budgets(&self) -> Vec<RateBudget> {
        self.limiter.budgets()
    }

    pub(crate) fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    pub(crate) fn base(&self) -> &Url {
        &self.base
    }
}

/// Parses and checks a base URL: http(s), no credentials in it (they would
/// end up in logs and errors), no query.
fn parse_base(base_url: &str) -> Result<Url, ApiError> {
    let url = Url::parse(base_url.trim())
        .map_err(|e| ApiError::Config(format!("base url is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ApiError::Config("base url must be http or https".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(ApiError::Config(
            "base url must not carry credentials; pass the token separately".into(),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(ApiError::Config(
            "base url must not have a query or fragment".into(),
        ));
    }
    Ok(url)
}

/// Percent-encodes one path segment (owner, repo, org names come from
/// configuration and could hold `/` or `?`).
pub(crate) fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Serde adapters for the forges' timestamps: RFC 3339 (and GitLab's older
/// spellings); a value that does not parse becomes `None` rather than failing
/// a whole page of jobs.
pub(crate) mod lenient_time {
    use serde::{Deserialize, Deserializer};
    use time::OffsetDateTime;

    pub(crate) fn option<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<OffsetDateTime>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        Ok(s.as_deref().and_then(crate::timestamps::parse))
    }
}

/// Serde adapter: `null` as the type's default (GitHub sends `null` for empty
/// strings and lists in places).
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + serde::Deserialize<'de>,
{
    use serde::Deserialize;
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages() {
        assert_eq!(
            message_of(br#"{"message":"Not Found","documentation_url":"x"}"#),
            "Not Found"
        );
        assert_eq!(
            message_of(br#"{"message":{"tag_list":["bad"]}}"#),
            r#"{"tag_list":["bad"]}"#
        );
        assert_eq!(
            message_of(br#"{"error":"insufficient_scope"}"#),
            "insufficient_scope"
        );
        assert_eq!(
            message_of(b"<html>\nbad gateway</html>"),
            "<html> bad gateway</html>"
        );
        let long = format!(r#"{{"message":"{}"}}"#, "x".repeat(1000));
        assert_eq!(message_of(long.as_bytes()).chars().count(), MAX_MESSAGE + 1);
    }

    #[test]
    fn base_urls() {
        assert!(parse_base("https://api.github.com").is_ok());
        assert!(parse_base("http://127.0.0.1:8080/api/v3/").is_ok());
        for bad in [
            "ftp://x",
            "https://u:p@x",
            "https://tok@x",
            "https://x/?a=b",
            "nope",
        ] {
            let err = parse_base(bad).expect_err(bad);
            assert!(!err.to_string().contains("tok@"), "{err}");
        }
    }

    #[test]
    fn segments() {
        assert_eq!(seg("acme-app_1.x"), "acme-app_1.x");
        assert_eq!(seg("a/b?c"), "a%2Fb%3Fc");
    }
}
