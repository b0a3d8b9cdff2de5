//! What the fuzz targets share: the checks of the property tests, and the
//! split of an input into its header choices and its body.

/// The normalizers' promises (`libs/forge/src/testing/invariants.rs`).
pub use runyard_forge::testing::invariants;

/// `parse_spec`'s promises (`services/allocator/src/testing/spec.rs`).
pub use runyard_allocator::testing::spec;

use time::OffsetDateTime;
use time::macros::datetime;

/// An input's first byte, which picks the headers, and the rest, the body.
/// Bits of the selector a target does not use are ignored.
pub fn split(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((selector, body)) => (*selector, body),
        None => (0, &[]),
    }
}

/// When ingest received the delivery: shortly after the sample payloads'
/// times, or long after them.
pub fn received_at(late: bool) -> OffsetDateTime {
    if late {
        datetime!(2030-01-01 00:00:00 UTC)
    } else {
        datetime!(2024-06-01 12:20:00 UTC)
    }
}

/// Bits `shift..shift + width` of `selector`.
pub fn bits(selector: u8, shift: u32, width: u32) -> usize {
    usize::from(selector >> shift) & ((1 << width) - 1)
}
