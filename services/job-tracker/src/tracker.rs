//! The job-tracker's side of consuming the log: a [`Handler`] applying each
//! batch in one Postgres transaction, and the consumer's settings. Pulling,
//! acking after commit, retries, progress acks, dead letters and shutdown
//! are `runyard_bus::consumer`'s.

use std::sync::atomic::Ordering;

use runyard_bus::consumer::{ConsumerConfig, Deliver, Delivery, Handler, HandlerError, Rejected};
use runyard_events::Namespace;

use crate::State;
use crate::apply::apply_in;
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
/// consumer). A database error is blamed on an event only when Postgres
/// says so ([`blame`]); anything else stalls the consumer until the
/// database works again.
#[derive(Debug)]
pub(crate) struct Projector {
    pub(crate) state: State,
}

impl Handler for Projector {
    async fn handle(&self, batch: &[Delivery]) -> Result<Rejected, HandlerError> {
        let state = &self.state;
        let mut conn = match state.pool.acquire().await {
            Ok(conn) => conn,
            Err(error) => return Err(self.stall(&error)),
        };
        match apply_on(&mut conn, batch).await {
            Ok(applied) => {
                state.db_ok.store(true, Ordering::SeqCst);
                state.metrics.count("applied", applied.new);
                state.metrics.count("duplicate", applied.duplicates);
                Ok(applied.rejected)
            }
            // Something in the batch Postgres refuses for good: the consumer
            // applies it one event at a time so only the culprit is
            // dead-lettered.
            Err(error) if blame(&error) == Blame::Event => {
                Err(HandlerError::Permanent(describe(&error)))
            }
            Err(error) => {
                // A session that failed for a reason outside the batch is
                // not trusted again: one opened while the database was
                // read-only stays read-only after it is writable again, and
                // one that planned against a renamed table keeps its plans.
                conn.close_on_drop();
                Err(self.stall(&error))
            }
        }
    }
}

impl Projector {
    /// The environment failed: not ready until a batch commits again.
    fn stall(&self, error: &sqlx::Error) -> HandlerError {
        self.state.db_ok.store(false, Ordering::SeqCst);
        HandlerError::Transient(describe(error))
    }
}

/// One batch in one transaction on `conn`.
async fn apply_on(
    conn: &mut sqlx::pool::PoolConnection<sqlx::Postgres>,
    batch: &[Delivery],
) -> Result<crate::apply::Applied, sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut **conn).await?;
    let applied = apply_in(&mut tx, batch).await?;
    tx.commit().await?;
    Ok(applied)
}

/// Whom a database error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The data of one event: SQLSTATE class 22 (data exception: a value
    /// out of range, invalid text) or class 23 (integrity constraint
    /// violation). The same event fails the same way on any healthy
    /// database, so it is dead-lettered once found alone.
    Event,
    /// Everything else: the database is unreachable, restarting, read-only
    /// (25006), missing a table or column (42P01, 42703: a migration not
    /// run), refusing the credentials (28P01, 28000) or a permission
    /// (42501), out of resources, or the transaction lost a race. Every
    /// event would fail alike, so none is to blame: the consumer stalls
    /// and retries until the database works again.
    Environment,
}

/// Whom `e` is about. Only Postgres' own verdict on the data blames an
/// event; an error without a SQLSTATE (I/O, TLS, pool, protocol, decoding
/// a row) is the environment's.
pub(crate) fn blame(e: &sqlx::Error) -> Blame {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) if code.starts_with("22") || code.starts_with("23") => Blame::Event,
            _ => Blame::Environment,
        },
        _ => Blame::Environment,
    }
}

/// The error with its SQLSTATE, which sqlx's text leaves out (an operator
/// looks the code up; a dead letter's reason carries it).
fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{e} (SQLSTATE {code})"),
            None => e.to_string(),
        },
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database error with SQLSTATE `code`, as sqlx reports one.
    #[derive(Debug)]
    struct Sqlstate(&'static str);

    impl std::fmt::Display for Sqlstate {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "postgres said {}", self.0)
        }
    }

    impl std::error::Error for Sqlstate {}

    impl sqlx::error::DatabaseError for Sqlstate {
        fn message(&self) -> &str {
            "postgres said no"
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn db(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Sqlstate(code)))
    }

    #[test]
    fn only_data_and_integrity_errors_blame_an_event() {
        for code in [
            "22003", "22P02", "22021", "23505", "23503", "23502", "23514",
        ] {
            assert_eq!(blame(&db(code)), Blame::Event, "{code}");
        }
        // The environment: a rotated password, a read-only failover target,
        // a migration not run, a revoked grant, an outage, a race.
        for code in [
            "28P01", "28000", "25006", "42P01", "42703", "42501", "3D000", "08006", "57P01",
            "53300", "40001", "40P01", "0A000", "XX000",
        ] {
            assert_eq!(blame(&db(code)), Blame::Environment, "{code}");
        }
        for e in [
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::Io(std::io::Error::other("connection reset")),
            sqlx::Error::Protocol("unexpected message".into()),
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("x".into()),
        ] {
            assert_eq!(blame(&e), Blame::Environment, "{e}");
        }
    }

    #[test]
    fn the_description_names_the_sqlstate() {
        assert!(describe(&db("25006")).ends_with("(SQLSTATE 25006)"));
        assert_eq!(
            describe(&sqlx::Error::PoolTimedOut),
            sqlx::Error::PoolTimedOut.to_string()
        );
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
