//! The job-tracker's side of consuming the log: a [`Handler`] applying each
//! batch in one Postgres transaction, and the consumer's settings. Pulling,
//! acking after commit, retries, progress acks, dead letters and shutdown
//! are `runyard_bus::consumer`'s.

use std::sync::atomic::Ordering;

use runyard_bus::consumer::{ConsumerConfig, Deliver, Delivery, Handler, HandlerError, Rejected};
use runyard_events::{Event, Namespace};

use crate::State;
use crate::apply::{ToApply, apply_batch};
use crate::config::Config;

/// The durable consumer's name (the stream is already namespaced).
pub const CONSUMER: &str = "job-tracker";

/// The durable consumer every replica shares, set up from `config`.
pub(crate) fn consumer_config(config: &Config, ns: &Namespace) -> ConsumerConfig {
    ConsumerConfig {
        durable: Some(CONSUMER.into()),
        description: "runyard job-tracker projection".into(),
        filter_subjects: vec![ns.all_events()],
        deliver: Deliver::All,
        batch_size: config.tracker_batch_size,
        batch_wait: config.tracker_batch_wait,
        ack_wait: config.tracker_ack_wait,
        max_attempts: config.tracker_max_attempts,
        span_name: "job-tracker apply",
        ..ConsumerConfig::default()
    }
}

/// Projects batches into Postgres: one transaction per batch; events that
/// cannot be projected come back as rejected (dead-lettered by the
/// consumer); database errors are transient or permanent by their kind.
#[derive(Debug)]
pub(crate) struct Projector {
    pub(crate) state: State,
}

impl Handler for Projector {
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        let state = &self.state;
        match apply_batch(&state.pool, batch).await {
            Ok(applied) => {
                state.db_ok.store(true, Ordering::SeqCst);
                state.metrics.count("applied", applied.new);
                state.metrics.count("duplicate", applied.duplicates);
                Ok(applied.rejected)
            }
            Err(error) if is_transient(&error) => {
                state.db_ok.store(false, Ordering::SeqCst);
                Err(HandlerError::Transient(error.to_string()))
            }
            // Something in the batch Postgres refuses for good: the consumer
            // applies it one event at a time so only the culprit is
            // dead-lettered.
            Err(error) => Err(HandlerError::Permanent(error.to_string())),
        }
    }
}

/// The consumer's deliveries are applied as they are, events not copied.
impl ToApply for Delivery {
    fn seq(&self) -> u64 {
        self.seq
    }
    fn event(&self) -> &Event {
        &self.event
    }
}

/// Errors worth retrying the same batch for: the database is unreachable,
/// restarting or overloaded, or the transaction lost a race.
fn is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| {
            c.starts_with("08") // connection exception
                || c.starts_with("57P") // shutdown, cannot connect now
                || c.starts_with("53") // insufficient resources
                || c == "40001" // serialization failure
                || c == "40P01" // deadlock
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outages_are_transient_refusals_are_not() {
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::Io(std::io::Error::other(
            "connection reset"
        ))));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::ColumnNotFound("x".into())));
    }

    #[test]
    fn one_durable_over_the_whole_log_with_the_configured_batching() {
        let ns = Namespace::new("ns").unwrap_or_else(|e| panic!("{e}"));
        let config = Config {
            tracker_batch_size: 7,
            tracker_ack_wait: std::time::Duration::from_secs(3),
            tracker_max_attempts: 4,
            ..Config::default()
        };
        let c = consumer_config(&config, &ns);
        assert_eq!(c.durable.as_deref(), Some(CONSUMER));
        assert_eq!(c.filter_subjects, vec!["ns.v1.>".to_owned()]);
        assert_eq!((c.batch_size, c.max_attempts), (7, 4));
        assert_eq!(c.ack_wait, std::time::Duration::from_secs(3));
        assert_eq!(c.span_name, "job-tracker apply");
    }
}
