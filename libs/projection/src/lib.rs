//! The projection of the event log into Postgres: the merge rules
//! ([`projection`]), applying a batch of events exactly once ([`apply`]),
//! a job's story as rows ([`story`]), and replaying the stream into a fresh database, optionally swapped in for
//! the live one ([`rebuild`]). The job-tracker runs it live; `runyard-job-tracker
//! rebuild` and `runyard rebuild` rebuild with it.

pub mod apply;
pub mod projection;
pub mod rebuild;
pub mod story;
