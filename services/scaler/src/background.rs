//! What the scaler's background tasks (the reconciler, the OOM retrier)
//! share: a named lease in `<NS>_LEASES` so one replica does the work, and a
//! follower that folds a slice of the log into the task's own view.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runyard_bus::consumer::{Consumer, ConsumerConfig, Deliver, Handler};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::engine::Shared;
use crate::kv::Coordination;

/// Whether the lease is held now (the watch holds until when it may be
/// trusted).
pub(crate) fn held(lease: &watch::Receiver<Option<Instant>>) -> bool {
    lease.borrow().is_some_and(|until| until > Instant::now())
}

/// Holds the lease `key` while it can: renews every `ttl / 4` and says until
/// when it may be trusted (80% of the TTL from before the call, as the pool
/// leases); releases it on `stop`.
pub(crate) async fn keep_lease(
    coord: Coordination,
    key: &'static str,
    ttl: Duration,
    tx: watch::Sender<Option<Instant>>,
    stop: CancellationToken,
) {
    let mut held: Option<u64> = None;
    let mut tick = tokio::time::interval(ttl / 4);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let started = Instant::now();
        match tokio::time::timeout(ttl / 4, coord.lease(key, held)).await {
            Ok(Ok(Some(revision))) => {
                if held.is_none() {
                    tracing::info!(lease = key, "lease taken");
                }
                held = Some(revision);
                tx.send_replace(Some(started + ttl.mul_f64(0.8)));
            }
            Ok(Ok(None)) => {
                if held.take().is_some() {
                    tracing::warn!(lease = key, "lease lost");
                }
                tx.send_replace(None);
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, lease = key, "lease renewal failed");
                tx.send_modify(|_| {});
            }
            Err(_) => {
                tracing::warn!(lease = key, "lease renewal timed out");
                tx.send_modify(|_| {});
            }
        }
    }
    if let Some(revision) = held {
        // Bounded: with NATS gone the lease simply expires.
        let _ = tokio::time::timeout(Duration::from_secs(2), coord.release(key, revision)).await;
    }
}

/// Follows `subjects` (relative to `<ns>.v1.`, e.g. `job.>`) from
/// `now - lookback` with an ephemeral consumer, handing every batch to
/// `handler`; says caught up the first time nothing more is waiting.
pub(crate) async fn follow_log(
    shared: Arc<Shared>,
    description: &str,
    subjects: &[&str],
    handler: impl Handler,
    caught_up: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let bus = &shared.bus;
    let start = OffsetDateTime::now_utc() - shared.timers.lookback;
    let config = ConsumerConfig {
        durable: None,
        description: description.into(),
        filter_subjects: subjects
            .iter()
            .map(|s| format!("{}.v1.{s}", bus.namespace().as_str()))
            .collect(),
        deliver: Deliver::ByStartTime(start),
        batch_size: 500,
        batch_wait: Duration::from_millis(2),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::new(bus, config, None).with_shutdown(stop.clone());
    let mut backoff = Duration::from_millis(250);
    while !stop.is_cancelled() {
        match consumer
            .process_next(&handler, Duration::from_millis(500))
            .await
        {
            Ok(None) => {
                backoff = Duration::from_millis(250);
                caught_up.send_if_modified(|c| !std::mem::replace(c, true));
            }
            Ok(Some(_)) => backoff = Duration::from_millis(250),
            Err(error) => {
                tracing::warn!(%error, description, retry_ms = backoff.as_millis() as u64, "cannot follow the log; retrying");
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}
