//! `runyard-job-tracker rebuild` and `runyard rebuild`: replays the whole
//! stream into a fresh database and optionally swaps it in for the live one.

use std::time::{Duration, Instant};

use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use prost::Message as _;
use runyard_bus::Bus;
use runyard_events::Event;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::apply::{Incoming, apply_batch};

/// Why a replay, a swap or a rebuild failed (each names the step).
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// Reading the event stream failed.
    #[error("{what}: {source}")]
    Stream {
        /// The step.
        what: &'static str,
        /// What NATS said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A database step failed.
    #[error("{what}: {source}")]
    Database {
        /// The step.
        what: String,
        /// What Postgres said.
        source: sqlx::Error,
    },
    /// Naming, creating or migrating a database failed.
    #[error(transparent)]
    Store(#[from] runyard_store::StoreError),
    /// The rebuild was asked to go into the live database itself.
    #[error("cannot rebuild into the live database")]
    IntoLive,
}

/// Turns a NATS error into [`RebuildError::Stream`] of step `what`.
fn stream<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> RebuildError {
    move |e| RebuildError::Stream {
        what,
        source: Box::new(e),
    }
}

/// Turns a Postgres error into [`RebuildError::Database`] of step `what`.
fn database(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> RebuildError {
    move |source| RebuildError::Database {
        what: what.into(),
        source,
    }
}

/// What a replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Messages read from the stream.
    pub messages: u64,
    /// Events applied (first time).
    pub applied: u64,
    /// Messages skipped (dead letters, undecodable).
    pub skipped: u64,
    /// Last stream sequence replayed.
    pub through: u64,
}

/// Replays the stream from `from_seq` (1 = the start) up to its last
/// sequence as of the call, into `pool`, in batches of `batch_size`. Records
/// the last replayed sequence in `projection_meta`.
pub async fn replay(
    bus: &Bus,
    pool: &PgPool,
    from_seq: u64,
    batch_size: usize,
) -> Result<Replayed, RebuildError> {
    let ns = bus.namespace();
    let mut events = bus
        .jetstream()
        .get_stream(ns.events_stream())
        .await
        .map_err(stream("opening the event stream"))?;
    let state = events
        .info()
        .await
        .map_err(stream("reading the event stream's state"))?
        .state
        .clone();
    let mut done = Replayed {
        through: from_seq.saturating_sub(1),
        ..Replayed::default()
    };
    if state.messages == 0 || state.last_sequence < from_seq {
        return Ok(done);
    }
    let end = state.last_sequence;
    let consumer = events
        .create_consumer(consumer::pull::OrderedConfig {
            deliver_policy: if from_seq <= 1 {
                consumer::DeliverPolicy::All
            } else {
                consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from_seq,
                }
            },
            filter_subject: ns.all_events(),
            ..Default::default()
        })
        .await
        .map_err(stream("creating the replay's consumer"))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(stream("reading the event stream"))?;
    let deadletter = ns.deadletter_subject();
    let mut batch: Vec<Incoming> = Vec::with_capacity(batch_size);
    let mut last_report = Instant::now();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .map_err(stream("the stream stopped delivering during the replay"))?;
        let Some(msg) = next else { break };
        let msg = msg.map_err(stream("reading the event stream"))?;
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or_default();
        done.messages += 1;
        if msg.subject.as_str() != deadletter {
            match Event::decode(msg.payload.clone()) {
                Ok(event) if !event.id.is_empty() => batch.push(Incoming {
                    seq,
                    event,
                    traceparent: msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(runyard_bus::TRACEPARENT_HEADER))
                        .map(|v| v.as_str().to_owned()),
                }),
                _ => done.skipped += 1,
            }
        } else {
            done.skipped += 1;
        }
        let at_end = seq >= end;
        if batch.len() >= batch_size || (at_end && !batch.is_empty()) {
            let applied = apply_batch(pool, &batch)
                .await
                .map_err(database("applying replayed events"))?;
            done.applied += applied.new as u64;
            done.skipped += applied.rejected.len() as u64;
            batch.clear();
        }
        done.through = seq;
        if last_report.elapsed() > Duration::from_secs(5) {
            tracing::info!(through = seq, end, applied = done.applied, "replaying");
            last_report = Instant::now();
        }
        if at_end {
            break;
        }
    }
    sqlx::query(
        "INSERT INTO projection_meta (key, value) VALUES ('replayed_through', $1)
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(done.through.to_string())
    .execute(pool)
    .await
    .map_err(database("recording the replayed sequence"))?;
    Ok(done)
}

/// Connects a pool to a projection database.
pub async fn pool(url: &str, size: u32) -> Result<PgPool, RebuildError> {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(5))
        .connect(url)
        .await
        .map_err(database("connecting to the projection database"))
}

/// How many times [`swap`] tries when a database is still in use.
const SWAP_ATTEMPTS: u32 = 5;

/// Renames `live` to `old` and `target` to `live` on the server `admin_url`
/// names, in one transaction: either both renames happen or neither does,
/// so a failure (a database still in use, `target` missing, a name taken)
/// never leaves the server without a database called `live`. The sessions
/// on both are ended first (Postgres renames no database in use); one that
/// reconnects in between makes the attempt fail whole, and it is tried
/// again, up to [`SWAP_ATTEMPTS`] times.
pub async fn swap(
    admin_url: &str,
    live: &str,
    target: &str,
    old: &str,
) -> Result<(), RebuildError> {
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin_url)
        .await
        .map_err(database("connecting to the server to swap databases"))?;
    let mut attempt = 1;
    loop {
        match try_swap(&mut conn, live, target, old).await {
            Ok(()) => return Ok(()),
            // 55006 object_in_use: a session came back between the
            // termination and the rename.
            Err(sqlx::Error::Database(e))
                if e.code().as_deref() == Some("55006") && attempt < SWAP_ATTEMPTS =>
            {
                tracing::warn!(error = %e, attempt, "database in use during the swap; trying again");
                tokio::time::sleep(Duration::from_millis(200) * attempt).await;
                attempt += 1;
            }
            Err(e) => {
                return Err(database(format!(
                    "swapping {target} in for {live}; nothing was renamed"
                ))(e));
            }
        }
    }
}

async fn try_swap(
    conn: &mut sqlx::PgConnection,
    live: &str,
    target: &str,
    old: &str,
) -> Result<(), sqlx::Error> {
    let mut tx = sqlx::Connection::begin(&mut *conn).await?;
    for (from, to) in [(live, old), (target, live)] {
        // Live trackers reconnect after the rename and continue on the
        // rebuilt database; their consumer position is in JetStream.
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(from)
        .execute(&mut *tx)
        .await?;
        let sql = format!(
            "ALTER DATABASE \"{}\" RENAME TO \"{}\"",
            from.replace('"', "\"\""),
            to.replace('"', "\"\"")
        );
        sqlx::query(&sql).execute(&mut *tx).await?;
    }
    // Dropped without a commit (an error above), the transaction rolls
    // back both renames.
    tx.commit().await
}

/// Options of a rebuild.
#[derive(Debug, Clone)]
pub struct RebuildOptions {
    /// The live database URL.
    pub live_url: String,
    /// Name of the database to build (default `<live>_rebuild`).
    pub into: Option<String>,
    /// Replace the live database with the rebuilt one when done.
    pub swap: bool,
    /// Events per transaction.
    pub batch_size: usize,
}

/// Rebuilds the projection from the stream into a fresh database; with
/// `swap`, renames it over the live one in one transaction ([`swap`]; the
/// old one is kept as `<live>_old_<unix time>`) and catches up whatever
/// arrived meanwhile.
/// Returns the rebuilt database's URL.
pub async fn rebuild(bus: &Bus, opts: &RebuildOptions) -> Result<(String, Replayed), RebuildError> {
    let (_, live_name) = runyard_store::split_database_url(&opts.live_url)?;
    let target_name = opts
        .into
        .clone()
        .unwrap_or_else(|| format!("{live_name}_rebuild"));
    if target_name == live_name {
        return Err(RebuildError::IntoLive);
    }
    let target_url = runyard_store::with_database(&opts.live_url, &target_name)?;
    runyard_store::drop_database(&target_url).await?;
    runyard_store::migrate(&target_url).await?;
    let started = Instant::now();
    let db = pool(&target_url, 2).await?;
    let mut replayed = replay(bus, &db, 1, opts.batch_size).await?;
    tracing::info!(
        events = replayed.applied,
        through = replayed.through,
        seconds = started.elapsed().as_secs_f64(),
        database = %target_name,
        "projection rebuilt"
    );
    if !opts.swap {
        db.close().await;
        return Ok((target_url, replayed));
    }
    db.close().await;
    let (admin, _) = runyard_store::split_database_url(&opts.live_url)?;
    let old_name = format!(
        "{live_name}_old_{}",
        time::OffsetDateTime::now_utc().unix_timestamp()
    );
    swap(&admin, &live_name, &target_name, &old_name).await?;
    // Events the live trackers applied to the old database between the end of
    // the replay and the swap are still in the stream: replay them too (the
    // apply-once bookkeeping skips anything already there).
    let db = pool(&opts.live_url, 2).await?;
    let more = replay(bus, &db, replayed.through + 1, opts.batch_size).await?;
    db.close().await;
    replayed.messages += more.messages;
    replayed.applied += more.applied;
    replayed.skipped += more.skipped;
    replayed.through = replayed.through.max(more.through);
    tracing::info!(old = %old_name, "rebuilt projection swapped in");
    Ok((opts.live_url.clone(), replayed))
}
