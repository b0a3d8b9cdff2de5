//! The scaler's pure core: no IO, no clock of its own, every input an
//! argument. `world` folds the event log into what exists; `policy` turns
//! the world into decisions; `listing` diffs a pool's provider and forge
//! listings against the world into findings; `step` holds the engine's
//! bookkeeping over them (the world, the operations in flight, the owned
//! pools) and turns each input, at a time it is given, into effects. The
//! engine (`crate::engine`) and the simulation (`crate::simulate`) both
//! drive these, so what the simulation measures is the product's own
//! logic.

pub mod listing;
pub mod policy;
pub mod queue;
pub mod step;
pub mod world;
