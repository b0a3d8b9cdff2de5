//! What the crate's own tests and the `fuzz_spec` target (`fuzz/`) share,
//! built only with the `testing` feature (the crate's tests turn it on; no
//! product build does): `parse_spec`'s promises as checks ([`spec`]). It
//! lives here rather than in `runyard-testkit` because it is a property of
//! this crate, and the test kit must not depend on a service.

pub mod spec;
