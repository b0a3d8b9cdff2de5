//! runyard-forge's integration tests, one binary: the REST clients against
//! the fake forge servers of `runyard-testkit`, and property tests of the
//! normalizers (with the generators and checks of `runyard_forge::testing`),
//! and the runner scale-set client against the fake Actions service.

mod api;
mod fuzz;
mod prop;
mod scaleset;
