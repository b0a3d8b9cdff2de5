//! sea-orm entities of the projection tables (see the migration for what each
//! column means).

pub mod applied_event;
pub mod job;
pub mod pipeline;
pub mod retry;
pub mod runner;
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

/// Runner states as stored (`runners.state`), derived by the `runner_state`
/// SQL function: `deleted` is final; `failed` while no later create attempt
/// succeeded; else the furthest of requested < created < online < assigned.
pub mod runner_state {
    /// Asked of a provider.
    pub const REQUESTED: &str = "requested";
    /// The provider made the instance.
    pub const CREATED: &str = "created";
    /// Online at the forge.
    pub const ONLINE: &str = "online";
    /// Took a job.
    pub const ASSIGNED: &str = "assigned";
    /// The latest create attempt (or the runner) failed.
    pub const FAILED: &str = "failed";
    /// Gone.
    pub const DELETED: &str = "deleted";
}

/// Where a runner row's job came from (`runners.job_source`); a higher
/// source wins.
pub mod job_source {
    /// A `RunnerFailed` naming the job.
    pub const FAILED: i16 = 1;
    /// The `RunnerRequested` for the job.
    pub const REQUESTED: i16 = 2;
    /// A `RunnerAssigned`: the job it really took.
    pub const ASSIGNED: i16 = 3;
}

/// Retry row kinds as stored (`retries.kind`), one per retry event type.
pub mod retry_kind {
    /// `RetryRequested`: the scaler decided to retry.
    pub const REQUESTED: &str = "requested";
    /// `RetryIssued`: the forge accepted the retry.
    pub const ISSUED: &str = "issued";
    /// `RetryRefused`: no retry.
    pub const REFUSED: &str = "refused";
}
