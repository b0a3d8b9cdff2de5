//! How far a loop of the scaler has got, as `GET /v1/pools` shows it
//! (`engine` for the scaling loop, `retrier` for the OOM retrier). A client
//! that publishes an event and then sees `applied_seq` reach its sequence,
//! a later round, and no operation under way and none started since it last
//! looked, knows the loop has acted on everything logged before that event
//! and has nothing left to do.

use std::sync::atomic::{AtomicU64, Ordering};

/// A loop's counters.
#[derive(Debug, Default)]
pub struct Progress {
    applied_seq: AtomicU64,
    rounds: AtomicU64,
    started: AtomicU64,
    in_flight: AtomicU64,
}

/// [`Progress`] read at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProgressView {
    /// The stream sequence of the last event folded in.
    pub applied_seq: u64,
    /// Rounds run (decisions, or the retrier's plans).
    pub rounds: u64,
    /// Operations started (creates, deletes, listings; retry events).
    pub operations_started: u64,
    /// Operations under way at the end of the last round.
    pub operations_in_flight: u64,
}

impl Progress {
    /// The event at stream sequence `seq` was folded in.
    pub fn folded(&self, seq: u64) {
        self.applied_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// An operation started.
    pub fn started(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
    }

    /// A round ended with `in_flight` operations under way.
    pub fn round(&self, in_flight: usize) {
        self.in_flight.store(
            u64::try_from(in_flight).unwrap_or(u64::MAX),
            Ordering::Release,
        );
        self.rounds.fetch_add(1, Ordering::AcqRel);
    }

    /// The counters now.
    pub fn view(&self) -> ProgressView {
        // `rounds` first: what is read of the others is at least as new as
        // the round it counts.
        let rounds = self.rounds.load(Ordering::Acquire);
        ProgressView {
            applied_seq: self.applied_seq.load(Ordering::Acquire),
            rounds,
            operations_started: self.started.load(Ordering::Acquire),
            operations_in_flight: self.in_flight.load(Ordering::Acquire),
        }
    }
}
