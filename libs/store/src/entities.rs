//! sea-orm entities of the projection tables (see the migration for what each
//! column means).

pub mod applied_event;
pub mod job;
pub mod pipeline;
pub mod usage_sample;

/// Job status as stored (`jobs.status`): 1 queued < 2 waiting < 3 in_progress
/// < 4 completed.
pub mod status {
    /// Queued.
    pub const QUEUED: i16 = 1;
    /// Waiting (e.g. for an environment approval or a resource).
    pub const WAITING: i16 = 2;
    /// Running.
    pub const IN_PROGRESS: i16 = 3;
    /// Done, whatever the conclusion.
    pub const COMPLETED: i16 = 4;
}
