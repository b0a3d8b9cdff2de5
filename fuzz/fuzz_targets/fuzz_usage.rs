//! `normalize_usage`. Selector bits: 0-1 `Content-Type`, 2 received late.

#![no_main]

use libfuzzer_sys::fuzz_target;
use runyard_forge::normalize_usage;
use runyard_fuzz::{bits, invariants, received_at, split};

const CONTENT_TYPES: [Option<&str>; 4] = [
    None,
    Some("application/json"),
    Some("application/json; charset=utf-8"),
    Some("application/x-www-form-urlencoded"),
];

fuzz_target!(|data: &[u8]| {
    let (selector, body) = split(data);
    let content_type = CONTENT_TYPES[bits(selector, 0, 2)];
    let rx = received_at(bits(selector, 2, 1) == 1);
    invariants::usage(
        content_type,
        body,
        rx,
        &normalize_usage(content_type, body, rx),
    );
});
