//! `normalize_gitlab`. Selector bits: 0-1 `X-Gitlab-Event`, 2-3 the dedup
//! headers, 4-5 `X-Gitlab-Instance`, 6 `Content-Type`, 7 received late.

#![no_main]

use libfuzzer_sys::fuzz_target;
use runyard_forge::{GitlabDelivery, normalize_gitlab};
use runyard_fuzz::{bits, invariants, received_at, split};

const EVENTS: [Option<&str>; 4] = [
    Some("Job Hook"),
    Some("Pipeline Hook"),
    Some("Push Hook"),
    None,
];
const KEY: &str = "6c5f8a1e-1b0e-4f5e-9c55-2f1a7c7b9e10";
const UUID: &str = "0b9ab2d4-6e1c-4d61-8b1c-1f3c9f2a4b55";
/// `Idempotency-Key` and `X-Gitlab-Event-UUID`.
const KEYS: [(Option<&str>, Option<&str>); 4] = [
    (Some(KEY), None),
    (None, Some(UUID)),
    (Some(""), None),
    (Some("  "), Some(UUID)),
];
const INSTANCES: [Option<&str>; 4] = [
    Some("https://gitlab.example.com"),
    None,
    Some("https://GitLab.example.com:8443/gitlab"),
    Some("not a url"),
];
const CONTENT_TYPES: [Option<&str>; 2] = [None, Some("application/json; charset=utf-8")];

fuzz_target!(|data: &[u8]| {
    let (selector, body) = split(data);
    let (idempotency_key, event_uuid) = KEYS[bits(selector, 2, 2)];
    let d = GitlabDelivery {
        event: EVENTS[bits(selector, 0, 2)],
        idempotency_key,
        event_uuid,
        webhook_uuid: Some("a3f1c2d4-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
        instance: INSTANCES[bits(selector, 4, 2)],
        content_type: CONTENT_TYPES[bits(selector, 6, 1)],
        body,
        received_at: received_at(bits(selector, 7, 1) == 1),
    };
    invariants::gitlab(&d, &normalize_gitlab(&d));
});
