//! The IO handles the scaler's parts share: the event log, leases and
//! claims, the forge clients, the allocator, the projection, the timers and
//! the metrics. The engine holds them beside its pools; the retrier, the
//! reconciler, the log follower and the instance metadata API take these
//! alone, never the engine.

use std::time::Instant;

use runyard_bus::Bus;
use sqlx::PgPool;

use crate::config::Flavor;
use crate::config::Timers;
use crate::core::world::Job;
use crate::forges::Forges;
use crate::kv::Coordination;
use crate::metrics::ScalerMetrics;
use crate::retry::Lineage;
use crate::sizing::{Allocator, Sizing, retry_of};

/// What every part of the scaler talks to the world through.
#[derive(Debug)]
pub struct Io {
    /// The event log.
    pub bus: Bus,
    /// Leases and claims.
    pub coord: Coordination,
    /// Forge clients.
    pub forges: Forges,
    /// Right-sizing.
    pub allocator: Allocator,
    /// What runyard's retries made (the retrier's book), for sizing a
    /// retry's runner.
    pub lineage: Lineage,
    /// The projection (a job already started gets no runner).
    pub db: Option<PgPool>,
    /// Timers.
    pub timers: Timers,
    /// Metrics.
    pub metrics: ScalerMetrics,
    /// Until when the projection is taken as unreachable (checks skipped).
    pub db_down_until: std::sync::Mutex<Option<Instant>>,
    /// Creates under way at once.
    pub create_slots: tokio::sync::Semaphore,
}

impl Io {
    /// Sizes `job`'s runner from its recommendation, as the retry it is
    /// when runyard's lineage or the job itself says so.
    pub async fn size(&self, job: &Job, flavors: &[Flavor]) -> Sizing {
        self.allocator
            .size(job, flavors, retry_of(job, &self.lineage))
            .await
    }
}
