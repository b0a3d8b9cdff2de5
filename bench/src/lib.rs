//! Shared machinery of runyard's benchmarks: bounded closed- and open-loop
//! load generators ([`load`]), a keep-alive HTTP/1.1 client ([`http`]),
//! per-process CPU and memory readings from `/proc` ([`procfs`]) and
//! markdown reporting with percentiles ([`report`]).
//!
//! The benchmark binaries (`src/bin/*`) drive the real service binaries as
//! child processes over loopback, so they measure exactly what production
//! runs.

pub mod http;
pub mod load;
pub mod procfs;
pub mod report;
