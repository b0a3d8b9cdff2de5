//! Posting a report to ingest with bounded, jittered retries.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::path::Path;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::{Error, Report};

/// The path of the usage endpoint under the ingest base URL.
pub const USAGE_PATH: &str = "/v1/usage";

/// How much of an error answer's body is kept for the log.
const MAX_ERROR_BODY: usize = 4096;

/// Ingest's answer to an accepted report: `{"event_id": ..., "duplicate": ...}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct IngestAnswer {
    /// The deterministic event id (`usage:<forge>:<instance>:<job_id>:<attempt>`).
    #[serde(default)]
    pub event_id: Option<String>,
    /// True when JetStream had already seen this report (a re-send).
    #[serde(default)]
    pub duplicate: bool,
}

/// How hard to try.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Deadline for the whole post, retries and back-off included.
    pub total_timeout: Duration,
    /// Timeout of one request.
    pub request_timeout: Duration,
    /// First back-off delay; doubles each retry, plus jitter.
    pub min_delay: Duration,
    /// Ceiling of the back-off delay.
    pub max_delay: Duration,
    /// Retries after the first attempt.
    pub max_retries: usize,
    /// Ceiling for a server's `Retry-After`, so a misconfigured proxy can't
    /// park a CI job.
    pub retry_after_cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            total_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(10),
            min_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(10),
            max_retries: 10,
            retry_after_cap: Duration::from_secs(30),
        }
    }
}

/// `base` + `/v1/usage`. A base that already ends in `/v1/usage` is kept,
/// and a path prefix (a reverse proxy's `/runyard`) is preserved.
pub fn usage_url(base: &str) -> Result<Url, Error> {
    let trimmed = base.trim().trim_end_matches('/');
    let full = if trimmed.ends_with(USAGE_PATH) {
        trimmed.to_owned()
    } else {
        format!("{trimmed}{USAGE_PATH}")
    };
    let url = Url::parse(&full).map_err(|e| Error::InvalidValue {
        field: "url",
        value: base.to_owned(),
        reason: e.to_string(),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Error::InvalidValue {
            field: "url",
            value: base.to_owned(),
            reason: "expected an http or https URL".to_owned(),
        });
    }
    Ok(url)
}

/// The HTTP client: no redirects (a redirected POST turns into a GET and
/// would carry the token elsewhere), bounded connect time, rustls. `ca_file`
/// (`RUNYARD_INGEST_CA_FILE`) is a PEM bundle trusted besides the public
/// roots, for an ingest whose certificate a private CA signed (the public
/// roots stay: GitHub's identity token endpoint needs them).
pub fn http_client(policy: &RetryPolicy, ca_file: Option<&Path>) -> Result<reqwest::Client, Error> {
    // reqwest is built without a default rustls provider and panics on the
    // first client without one; installing is idempotent, so make sure here
    // too rather than rely on every caller.
    runyard_telemetry::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(policy.request_timeout)
        .user_agent(concat!("runyard-report/", env!("CARGO_PKG_VERSION")));
    if let Some(path) = ca_file.filter(|p| !p.as_os_str().is_empty()) {
        let bad = |reason: String| Error::CaFile {
            path: path.to_owned(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|_| bad("not a PEM certificate bundle".to_owned()))?;
        if certs.is_empty() {
            return Err(bad("holds no certificate".to_owned()));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(Error::Client)
}

/// Why one attempt failed.
#[derive(Debug)]
enum AttemptError {
    Transport(reqwest::Error),
    Status {
        status: StatusCode,
        retry_after: Option<Duration>,
        body: String,
    },
}

impl AttemptError {
    /// Connection trouble, 5xx, 429 and 408 are worth another try; any other
    /// answer will not change by asking again.
    fn is_retryable(&self) -> bool {
        match self {
            AttemptError::Transport(e) => !e.is_builder(),
            AttemptError::Status { status, .. } => status_is_retryable(*status),
        }
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            AttemptError::Status { retry_after, .. } => *retry_after,
            AttemptError::Transport(_) => None,
        }
    }

    fn describe(&self) -> String {
        match self {
            AttemptError::Transport(e) => error_chain(e),
            AttemptError::Status { status, body, .. } => format!("{status}: {body}"),
        }
    }

    fn into_error(self, attempts: u32) -> Error {
        match self {
            AttemptError::Transport(source) => Error::Transport { attempts, source },
            AttemptError::Status { status, body, .. } if status_is_retryable(status) => {
                Error::Unavailable {
                    status: status.as_u16(),
                    attempts,
                    body,
                }
            }
            AttemptError::Status { status, body, .. } => Error::Rejected {
                status: status.as_u16(),
                body,
            },
        }
    }
}

/// Connection trouble aside, only these answers may change by asking again.
fn status_is_retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `Retry-After` in seconds; the HTTP-date form is ignored (ingest sends
/// seconds) and falls back to the back-off.
fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// Reads at most [`MAX_ERROR_BODY`] bytes of an error answer.
async fn bounded_body(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    String::from_utf8_lossy(&body).trim().to_owned()
}

async fn attempt(
    client: &reqwest::Client,
    url: &Url,
    token: &SecretString,
    body: &[u8],
    request_timeout: Duration,
) -> Result<IngestAnswer, AttemptError> {
    let response = client
        .post(url.clone())
        .bearer_auth(token.expose_secret())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .timeout(request_timeout)
        .body(body.to_vec())
        .send()
        .await
        .map_err(AttemptError::Transport)?;
    let status = response.status();
    if status.is_success() {
        // The report is in; an answer we can't read doesn't undo that.
        let answer = response
            .json::<IngestAnswer>()
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "unreadable answer from ingest");
                IngestAnswer::default()
            });
        return Ok(answer);
    }
    let retry_after = parse_retry_after(response.headers());
    Err(AttemptError::Status {
        status,
        retry_after,
        body: bounded_body(response).await,
    })
}

/// A jitter seed that differs per process, so that reporters of a pipeline
/// that failed together don't retry in lock-step. (backon is built without
/// its `std` feature, which would otherwise fall back to a fixed seed.)
fn jitter_seed() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// Posts `report` to `url` with `Authorization: Bearer <token>`.
///
/// Retries connection errors, 5xx, 429 and 408 with exponential back-off
/// and jitter, waiting at least a server's `Retry-After` (capped); any other
/// answer is final. The whole call is bounded by `policy.total_timeout`.
pub async fn post(
    client: &reqwest::Client,
    url: &Url,
    token: &SecretString,
    report: &Report,
    policy: &RetryPolicy,
) -> Result<IngestAnswer, Error> {
    let body = serde_json::to_vec(report).map_err(Error::Encode)?;
    let backoff = ExponentialBuilder::default()
        .with_min_delay(policy.min_delay)
        .with_max_delay(policy.max_delay)
        .with_factor(2.0)
        .with_max_times(policy.max_retries)
        .with_jitter()
        .with_jitter_seed(jitter_seed());
    let attempts = Cell::new(0u32);
    let mut last_error: Option<String> = None;
    let cap = policy.retry_after_cap;

    let send = || {
        attempts.set(attempts.get() + 1);
        attempt(client, url, token, &body, policy.request_timeout)
    };
    let retrying = send
        .retry(backoff)
        .when(AttemptError::is_retryable)
        .adjust(|error, delay| {
            // `None` means the back-off is exhausted: keep it that way.
            delay.map(|delay| match error.retry_after() {
                Some(after) => after.min(cap).max(delay),
                None => delay,
            })
        })
        .notify(|error, delay| {
            let error = error.describe();
            tracing::warn!(
                attempt = attempts.get(),
                delay_ms = delay.as_millis() as u64,
                %error,
                "posting usage report failed, retrying"
            );
            last_error = Some(error);
        });

    match tokio::time::timeout(policy.total_timeout, retrying).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(error.into_error(attempts.get())),
        Err(_elapsed) => Err(Error::Deadline {
            timeout: policy.total_timeout,
            attempts: attempts.get(),
            last: last_error.unwrap_or_else(|| "first attempt still running".to_owned()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;

    use super::*;

    #[test]
    fn usage_url_appends_the_path() {
        let cases = [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1/usage"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/v1/usage"),
            (
                "https://ci.example.com/runyard",
                "https://ci.example.com/runyard/v1/usage",
            ),
            (
                "https://ci.example.com/v1/usage",
                "https://ci.example.com/v1/usage",
            ),
        ];
        for (base, want) in cases {
            assert_eq!(
                usage_url(base).map(|u| u.to_string()).ok().as_deref(),
                Some(want)
            );
        }
        assert!(usage_url("not a url").is_err());
        assert!(usage_url("ftp://example.com").is_err());
    }

    #[test]
    fn retry_after_seconds() {
        let mut headers = HeaderMap::new();
        assert_eq!(parse_retry_after(&headers), None);
        headers.insert(RETRY_AFTER, HeaderValue::from_static("3"));
        assert_eq!(parse_retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(parse_retry_after(&headers), None);
    }

    #[test]
    fn which_answers_are_retried() {
        for (status, retry) in [
            (StatusCode::SERVICE_UNAVAILABLE, true),
            (StatusCode::INTERNAL_SERVER_ERROR, true),
            (StatusCode::TOO_MANY_REQUESTS, true),
            (StatusCode::REQUEST_TIMEOUT, true),
            (StatusCode::BAD_REQUEST, false),
            (StatusCode::UNAUTHORIZED, false),
            (StatusCode::PAYLOAD_TOO_LARGE, false),
            (StatusCode::FOUND, false),
        ] {
            assert_eq!(status_is_retryable(status), retry, "{status}");
        }
    }
}
