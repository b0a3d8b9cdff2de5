//! Where the model's history comes from: the projection at start, then
//! `UsageReported` events followed live on NATS, so a new usage report
//! changes the next recommendation within a second.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer;
use futures::StreamExt as _;
use prost::Message as _;
use runyard_events::{Body, Event, UsageReported, from_timestamp};
use sqlx::Row as _;
use tokio_util::sync::CancellationToken;

use crate::State;
use crate::model::{Observation, Workload};

/// How far before the load the live follow starts, so nothing published
/// while loading is missed (overlap is deduplicated by event id).
const OVERLAP: Duration = Duration::from_secs(600);

/// Loads every usage sample of the projection into the model. Returns the
/// ids of samples reported within [`OVERLAP`] of the start, which the live
/// follow may deliver again, and when the load started.
pub async fn load(state: &State) -> Result<(HashSet<String>, time::OffsetDateTime), sqlx::Error> {
    let started = time::OffsetDateTime::now_utc();
    let recent_after = started - OVERLAP;
    let clock = Instant::now();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&state.config.database_url)
        .await?;
    // Insertion order is time order up to small skews the model tolerates;
    // it streams from the primary key instead of sorting a million rows.
    let mut rows = sqlx::query(
        "SELECT event_id, workload::text AS workload, ref, peak_memory_bytes,
                memory_limit_bytes, memory_request_bytes, cpu_seconds, wall_seconds,
                oom_killed, reported_at
         FROM usage_samples ORDER BY id",
    )
    .fetch(&pool);
    let mut recent = HashSet::new();
    let mut loaded = 0usize;
    let mut batch: Vec<(Workload, Observation)> = Vec::with_capacity(4096);
    loop {
        let row = match rows.next().await {
            Some(Ok(row)) => row,
            Some(Err(sqlx::Error::Database(e))) if e.code().as_deref() == Some("42P01") => {
                tracing::warn!(
                    "no projection yet (usage_samples missing): starting without history"
                );
                break;
            }
            Some(Err(e)) => return Err(e),
            None => break,
        };
        let reported: time::OffsetDateTime = row.try_get("reported_at")?;
        let workload_text: String = row.try_get("workload")?;
        let Ok(workload) = serde_json::from_str::<Workload>(&workload_text) else {
            continue;
        };
        let r: Option<String> = row.try_get("ref")?;
        let obs = Observation {
            at: reported.unix_timestamp() as f64,
            peak_memory_bytes: u64::try_from(row.try_get::<i64, _>("peak_memory_bytes")?)
                .unwrap_or(0),
            memory_limit_bytes: row
                .try_get::<Option<i64>, _>("memory_limit_bytes")?
                .and_then(|v| u64::try_from(v).ok()),
            memory_request_bytes: row
                .try_get::<Option<i64>, _>("memory_request_bytes")?
                .and_then(|v| u64::try_from(v).ok()),
            cpu_seconds: row.try_get("cpu_seconds")?,
            wall_seconds: row.try_get("wall_seconds")?,
            oom_killed: row.try_get("oom_killed")?,
            protected: state.is_protected(r.as_deref().unwrap_or("")),
        };
        if reported >= recent_after {
            recent.insert(row.try_get::<String, _>("event_id")?);
        }
        batch.push((workload, obs));
        if batch.len() == batch.capacity() {
            loaded += batch.len();
            observe_all(state, &mut batch);
        }
    }
    loaded += batch.len();
    observe_all(state, &mut batch);
    drop(rows);
    pool.close().await;
    let (workloads, samples) = state.model_read().stats();
    tracing::info!(
        loaded,
        workloads,
        samples,
        seconds = clock.elapsed().as_secs_f64(),
        "history loaded"
    );
    Ok((recent, started))
}

/// Takes the write lock once per chunk, not per sample.
fn observe_all(state: &State, batch: &mut Vec<(Workload, Observation)>) {
    state.metrics.samples_observed.inc_by(batch.len() as u64);
    let mut model = state.model_write();
    for (w, o) in batch.drain(..) {
        model.observe(&w, o);
    }
}

/// Converts a usage event into the model's terms.
pub fn observation(state: &State, u: &UsageReported, event: &Event) -> (Workload, Observation) {
    let at = event
        .occurred_at
        .as_ref()
        .or(event.received_at.as_ref())
        .and_then(from_timestamp)
        .unwrap_or_else(time::OffsetDateTime::now_utc);
    let workload: Workload = u
        .workload
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let obs = Observation {
        at: at.unix_timestamp() as f64,
        peak_memory_bytes: u.peak_memory_bytes,
        memory_limit_bytes: u.memory_limit_bytes,
        memory_request_bytes: u.memory_request_bytes,
        cpu_seconds: u.cpu_seconds,
        wall_seconds: u.wall_seconds,
        oom_killed: u.oom_killed,
        protected: state.is_protected(&u.r#ref),
    };
    (workload, obs)
}

/// Follows `<ns>.v1.usage.>` from shortly before `since` with an ordered
/// consumer (re-created after failures), feeding the model.
pub async fn follow(
    state: State,
    mut skip: HashSet<String>,
    since: time::OffsetDateTime,
    stop: CancellationToken,
) {
    let ns = state.bus.namespace().clone();
    let mut start = since - OVERLAP;
    while !stop.is_cancelled() {
        let stream = match state.bus.jetstream().get_stream(ns.events_stream()).await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%error, "event stream not available; creating it");
                // Create it if nothing else has yet (settings stay ingest's).
                let _ = state
                    .bus
                    .create_streams_if_missing(&runyard_bus::StreamSettings::default())
                    .await;
                state.following.store(false, Ordering::SeqCst);
                sleep_or_stop(&stop, Duration::from_millis(200)).await;
                continue;
            }
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: format!("{}.v1.usage.>", ns),
                deliver_policy: consumer::DeliverPolicy::ByStartTime { start_time: start },
                ..Default::default()
            })
            .await;
        let mut messages = match consumer {
            Ok(c) => match c.messages().await {
                Ok(m) => m,
                Err(error) => {
                    tracing::warn!(%error, "cannot follow usage events; retrying");
                    sleep_or_stop(&stop, Duration::from_secs(1)).await;
                    continue;
                }
            },
            Err(error) => {
                tracing::warn!(%error, "cannot follow usage events; retrying");
                sleep_or_stop(&stop, Duration::from_secs(1)).await;
                continue;
            }
        };
        state.following.store(true, Ordering::SeqCst);
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                n = messages.next() => n,
            };
            let msg = match next {
                Some(Ok(m)) => m,
                Some(Err(error)) => {
                    tracing::debug!(%error, "usage follow error");
                    continue;
                }
                None => break,
            };
            if let Ok(info) = msg.info() {
                // Resume from here if the consumer has to be re-created.
                start = info.published + time::Duration::nanoseconds(1);
            }
            let Ok(event) = Event::decode(msg.payload.clone()) else {
                continue;
            };
            if skip.remove(&event.id) {
                continue;
            }
            if let Some(Body::UsageReported(u)) = &event.body {
                let (w, o) = observation(&state, u, &event);
                state.model_write().observe(&w, o);
                state.metrics.samples_observed.inc();
            }
        }
        state.following.store(false, Ordering::SeqCst);
    }
}

async fn sleep_or_stop(stop: &CancellationToken, d: Duration) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = tokio::time::sleep(d) => {}
    }
}
