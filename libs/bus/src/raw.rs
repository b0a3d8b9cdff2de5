//! The raw delivery as ingest keeps it in `<NS>_RAW`, with the allowlist of
//! request headers it carries (`Http-<name>`).

use bytes::Bytes;
use runyard_events::{Namespace, ids};

use crate::{EVENT_TYPE, HeaderName, HeaderValue, Prepared, TRACEPARENT};

/// The raw delivery as kept in `<NS>_RAW`: the request headers of an
/// allowlist (what the forges and common proxies send that a replay or an
/// investigation needs; never credentials, cookies or unknown headers,
/// which may carry either) under an `Http-` prefix so they can never be
/// taken for NATS's own headers. Of a repeated request header, the last
/// value is kept.
pub fn raw_message(
    ns: &Namespace,
    kind: &str,
    key: &str,
    headers: &http::HeaderMap,
    body: Bytes,
    traceparent: &HeaderValue,
) -> Prepared {
    let mut msg = Prepared::new(ns.raw_subject(kind), &ids::raw(key), body);
    msg.headers.insert(TRACEPARENT, traceparent.clone());
    msg.headers.insert(EVENT_TYPE, "RawDelivery");
    for (name, value) in headers {
        if let (Some(name), Ok(v)) = (http_header_name(name), value.to_str()) {
            msg.headers.insert(name, v);
        }
    }
    msg
}

/// Declares the allowlist of request headers kept with a raw delivery:
/// those the forges and common proxies send. Their `Http-` names are static
/// rather than built per delivery.
macro_rules! http_header_names {
    ($($name:literal),* $(,)?) => {
        /// The NATS header name `Http-<name>` of a request header on the
        /// allowlist; `None` for every other header (dropped).
        fn http_header_name(
            name: &http::HeaderName,
        ) -> Option<HeaderName> {
            match name.as_str() {
                $(
                    // `const`: the name is built once, at compile time.
                    $name => Some(const {
                        HeaderName::from_static(concat!("Http-", $name))
                    }),
                )*
                _ => None,
            }
        }
    };
}

http_header_names!(
    "accept",
    "accept-encoding",
    "content-length",
    "content-type",
    "host",
    "idempotency-key",
    "traceparent",
    "tracestate",
    "user-agent",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-github-delivery",
    "x-github-enterprise-host",
    "x-github-enterprise-version",
    "x-github-event",
    "x-github-hook-id",
    "x-github-hook-installation-target-id",
    "x-github-hook-installation-target-type",
    "x-gitlab-event",
    "x-gitlab-event-uuid",
    "x-gitlab-instance",
    "x-gitlab-webhook-uuid",
    "x-hub-signature",
    "x-hub-signature-256",
    "x-real-ip",
    "x-request-id",
);
