//! What runyard knows about GitHub and GitLab deliveries: signature and token
//! checks ([`verify`]), the pure normalizers that turn one webhook delivery
//! or usage report into `runyard.events.v1` events, and the forges' REST
//! clients ([`api`]).
//!
//! Apart from [`api`], everything here is plain functions over plain data —
//! no IO, no clock — so ingest's HTTP handlers stay thin and every mapping is
//! tested given/when/then.
//! The normalizers never panic on untrusted input: every rejection is a
//! [`PayloadError`] that names the offending field, which ingest turns into a
//! `400` with that field in the JSON error.

pub mod api;
mod filter;
mod github;
mod gitlab;
mod json;
#[cfg(feature = "testing")]
pub mod testing;
mod timestamps;
pub mod tokens;
mod usage;
pub mod verify;

pub use github::{GithubDelivery, normalize_github};
pub use gitlab::{GitlabDelivery, normalize_gitlab};
pub use usage::normalize_usage;
pub use verify::{AuthError, GithubSignature, bearer, github_signature, token_matches};

use runyard_events::{Event, Forge, Source};

/// The `Source.producer` of every event this crate builds.
pub const PRODUCER: &str = "ingest";

/// The instance used for GitHub deliveries that name no other host.
pub const GITHUB_DOT_COM: &str = "github.com";

/// Result of normalizing one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Normalized {
    /// The events to publish, in order (a GitLab Pipeline Hook yields its
    /// `PipelineObserved` first, then one `JobObserved` per build). Never
    /// empty.
    Events(Vec<Event>),
    /// The delivery is valid but carries nothing runyard records (a `ping`, an
    /// event type runyard does not subscribe to, a manual GitLab job). The
    /// reason is short and safe to echo to the sender.
    Ignored(String),
}

/// Why a delivery's body was rejected. Ingest answers `415` for
/// [`PayloadError::UnsupportedMediaType`] and `400` (naming
/// [`PayloadError::field`]) for [`PayloadError::Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// The `Content-Type` is not one the endpoint accepts.
    #[error("unsupported content type {0:?}")]
    UnsupportedMediaType(String),
    /// A header or body field is missing or malformed. `field` is a header
    /// name (`X-GitHub-Delivery`) or a JSON path (`builds[2].created_at`);
    /// `body` when the body as a whole is not JSON.
    #[error("{field}: {reason}")]
    Invalid {
        /// The header name or JSON path of the offending value.
        field: String,
        /// What is wrong with it, for the sender.
        reason: String,
    },
}

impl PayloadError {
    /// The header or JSON path an [`PayloadError::Invalid`] names.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::UnsupportedMediaType(_) => None,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// How a body is encoded, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Json,
    Form,
}

/// Classifies a `Content-Type` (parameters such as `charset` ignored, case
/// insensitive). A missing or empty header counts as JSON because every
/// sender we know of sends JSON when it says nothing.
fn encoding(content_type: Option<&str>, allow_form: bool) -> Result<Encoding, PayloadError> {
    let Some(raw) = content_type else {
        return Ok(Encoding::Json);
    };
    let mime = raw.split(';').next().unwrap_or_default().trim();
    if mime.is_empty() || mime.eq_ignore_ascii_case("application/json") {
        Ok(Encoding::Json)
    } else if allow_form && mime.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
        Ok(Encoding::Form)
    } else {
        Err(PayloadError::UnsupportedMediaType(raw.to_owned()))
    }
}

/// Which members of a JSON body to build.
#[derive(Debug, Clone, Copy)]
enum Members {
    /// Every member (the usage report's `workload` is an open map).
    All,
    /// Only those whose key is in the set, at every depth: the keys a
    /// normalizer reads (see [`filter`]). Whatever it reads comes out the
    /// same as with [`Members::All`], for much less work.
    Only(&'static filter::KeySet),
}

/// Parses a JSON body, naming `field` when it is not JSON.
fn parse_json(
    bytes: &[u8],
    field: &str,
    members: Members,
) -> Result<serde_json::Value, PayloadError> {
    match members {
        Members::All => serde_json::from_slice(bytes),
        Members::Only(keys) => filter::parse(bytes, keys),
    }
    .map_err(|e| PayloadError::invalid(field, format!("not valid JSON: {e}")))
}

/// Treats an empty header value like a missing one: proxies sometimes forward
/// empty headers, and an empty delivery id would make every delivery collide.
fn non_empty(header: Option<&str>) -> Option<&str> {
    header.map(str::trim).filter(|h| !h.is_empty())
}

/// A header value shortened for an `Ignored` reason, so a hostile sender
/// cannot make us echo kilobytes back.
fn short(s: &str) -> String {
    const MAX: usize = 64;
    s.chars().take(MAX).collect()
}

/// The host of a forge instance (`github.com`, `gitlab.example.com`) from a
/// base URL (`https://gitlab.example.com:8443/`) or a bare host name.
///
/// The host is lower-cased and the port dropped, because a job is identified
/// by `(forge, instance host, job_id)` and the usage reporter only knows the
/// host (`CI_SERVER_HOST`, `GITHUB_SERVER_URL`). Returns `None` unless the host
/// is a plausible DNS name or IP literal: it ends up in event ids, which travel
/// in a NATS header.
fn host_of(url: &str) -> Option<String> {
    let url = url.trim();
    let rest = match url.find("://") {
        Some(i) => url.get(i + 3..)?,
        None => url,
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // Drop credentials (`user:pass@host`); the last `@` ends them.
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        // IPv6 literal: keep the brackets, drop the port after them.
        let end = v6.find(']')?;
        format!("[{}]", v6.get(..end)?)
    } else {
        host_port.split(':').next().unwrap_or_default().to_owned()
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let plausible = !host.is_empty()
        && host.len() <= 253
        && host.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'[' | b']' | b':')
        });
    plausible.then_some(host)
}

/// A forge status word that is safe to put into an event id (which is also
/// the `Nats-Msg-Id` header): 1–64 characters of `[A-Za-z0-9_-]`.
fn status_word<'a>(word: &'a str, field: &str) -> Result<&'a str, PayloadError> {
    let ok = !word.is_empty()
        && word.len() <= 64
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(word)
    } else {
        Err(PayloadError::invalid(
            field,
            "expected a status word of 1-64 characters [A-Za-z0-9_-]",
        ))
    }
}

/// The envelope every normalizer fills the same way.
struct Envelope<'a> {
    forge: Forge,
    instance: &'a str,
    delivery_id: &'a str,
    hook_id: &'a str,
    received_at: time::OffsetDateTime,
}

impl Envelope<'_> {
    fn event(
        &self,
        id: String,
        occurred_at: time::OffsetDateTime,
        body: runyard_events::Body,
    ) -> Event {
        Event {
            id,
            occurred_at: Some(runyard_events::timestamp(occurred_at)),
            received_at: Some(runyard_events::timestamp(self.received_at)),
            source: Some(Source {
                forge: self.forge as i32,
                instance: self.instance.to_owned(),
                delivery_id: self.delivery_id.to_owned(),
                hook_id: self.hook_id.to_owned(),
                producer: PRODUCER.to_owned(),
            }),
            body: Some(body),
        }
    }
}

/// Seconds from `from` to `to`, or `None` when either is unknown or the
/// forge's clocks put them the wrong way round (GitHub does so for some
/// skipped jobs): a negative duration would poison every average built on it.
fn seconds_between(
    from: Option<time::OffsetDateTime>,
    to: Option<time::OffsetDateTime>,
) -> Option<f64> {
    let secs = (to? - from?).as_seconds_f64();
    (secs >= 0.0).then_some(secs)
}

/// Helpers shared by the normalizers' tests.
#[cfg(test)]
pub(crate) mod testutil {
    use serde_json::Value;

    /// A fixture with the value at JSON pointer `pointer` replaced.
    pub(crate) fn replaced(fixture: &str, pointer: &str, value: Value) -> Vec<u8> {
        let mut v: Value = serde_json::from_str(fixture).expect("fixture is JSON");
        *v.pointer_mut(pointer).expect("pointer exists in fixture") = value;
        serde_json::to_vec(&v).expect("serializes")
    }

    /// A fixture with the object member at `pointer` removed.
    pub(crate) fn removed(fixture: &str, pointer: &str) -> Vec<u8> {
        let mut v: Value = serde_json::from_str(fixture).expect("fixture is JSON");
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        v.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .and_then(|o| o.remove(key))
            .expect("member exists in fixture");
        serde_json::to_vec(&v).expect("serializes")
    }

    /// A protobuf timestamp as a `time` instant.
    pub(crate) fn at(t: &Option<prost_types::Timestamp>) -> Option<time::OffsetDateTime> {
        t.as_ref().and_then(runyard_events::from_timestamp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert_eq!(encoding(None, false), Ok(Encoding::Json));
        assert_eq!(encoding(Some(""), false), Ok(Encoding::Json));
        assert_eq!(
            encoding(Some("Application/JSON; charset=utf-8"), false),
            Ok(Encoding::Json)
        );
        assert_eq!(
            encoding(Some("application/x-www-form-urlencoded"), true),
            Ok(Encoding::Form)
        );
        assert!(matches!(
            encoding(Some("application/x-www-form-urlencoded"), false),
            Err(PayloadError::UnsupportedMediaType(_))
        ));
        assert!(matches!(
            encoding(Some("text/plain"), true),
            Err(PayloadError::UnsupportedMediaType(t)) if t == "text/plain"
        ));
    }

    #[test]
    fn hosts() {
        for (url, host) in [
            ("https://gitlab.example.com", "gitlab.example.com"),
            ("https://GitLab.Example.com:8443/", "gitlab.example.com"),
            (
                "http://192.168.64.1:3005/gitlab-org/gitlab-test",
                "192.168.64.1",
            ),
            ("https://user:pw@ghe.corp/a/b?x#y", "ghe.corp"),
            ("ghe.corp", "ghe.corp"),
            ("ghe.corp:443", "ghe.corp"),
            ("https://[::1]:8080/x", "[::1]"),
        ] {
            assert_eq!(host_of(url).as_deref(), Some(host), "{url}");
        }
        for bad in [
            "",
            "https://",
            "https:///x",
            "a b",
            "héllo",
            "x\r\ny",
            "https://[::1",
        ] {
            assert_eq!(host_of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn status_words_are_id_safe() {
        assert!(status_word("waiting_for_resource", "s").is_ok());
        for bad in ["", "a b", "a:b", "x\n", &"a".repeat(65)] {
            let err = status_word(bad, "build_status").expect_err(bad);
            assert_eq!(err.field(), Some("build_status"));
        }
    }

    #[test]
    fn negative_durations_are_dropped() {
        let a = time::macros::datetime!(2024-01-01 12:00:00 UTC);
        let b = time::macros::datetime!(2024-01-01 12:00:30 UTC);
        assert_eq!(seconds_between(Some(a), Some(b)), Some(30.0));
        assert_eq!(seconds_between(Some(b), Some(a)), None);
        assert_eq!(seconds_between(None, Some(a)), None);
    }
}
