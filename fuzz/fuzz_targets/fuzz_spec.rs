//! `parse_spec` on any UTF-8 text (the HTTP handler only ever has text).

#![no_main]

use libfuzzer_sys::fuzz_target;
use runyard_allocator::model::parse_spec;
use runyard_fuzz::spec;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        spec::check(&parse_spec(text));
    }
});
