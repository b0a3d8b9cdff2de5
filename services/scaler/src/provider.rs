//! The providers (`runyard_provider`), and the runner downloads the scaler
//! hands the `external` ones.

pub use runyard_provider::*;

pub mod tools;
