//! Shared machinery of runyard's benchmarks: command-line pieces
//! ([`args`]), bounded closed- and open-loop load generators ([`load`]), a
//! keep-alive HTTP/1.1 client ([`http`]), service binaries as child
//! processes ([`process`]), per-process CPU and memory readings from
//! `/proc` ([`procfs`]), a service's `/metrics` ([`metrics`]), signed
//! GitHub deliveries ([`webhook`]), markdown reporting with distributions
//! and percentiles ([`report`]) and retrying runs other work disturbed
//! ([`attempts`]).
//!
//! The benchmarks (`src/bin/*` and the services' `benches/`) drive the
//! real service binaries as child processes over loopback, so they measure
//! exactly what production runs.

pub mod args;
pub mod attempts;
pub mod http;
pub mod load;
pub mod metrics;
pub mod process;
pub mod procfs;
pub mod report;
pub mod webhook;
