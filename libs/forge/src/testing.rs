//! What the crate's own tests and the fuzz targets (`fuzz/`) share, built
//! only with the `testing` feature (the crate's tests turn it on; no
//! product build does): the normalizers' promises as checks
//! ([`invariants`]) and proptest generators of deliveries
//! ([`generators`]). They live here rather than in `runyard-testkit`
//! because they are properties of this crate: the filtered-parse
//! equivalence tests inside it use the generators, and the fuzz crate gets
//! the checks without the test kit's servers.

pub mod generators;
pub mod invariants;
