//! The scaler's pure core: no IO, no clock of its own, every input an
//! argument. `world` folds the event log into what exists; `policy` turns
//! the world into decisions; `listing` diffs a pool's provider and forge
//! listings against the world into findings. The engine (`crate::engine`)
//! and the simulation (`crate::simulate`) both drive these, so what the
//! simulation measures is the product's own logic.

pub mod listing;
pub mod policy;
pub mod world;
