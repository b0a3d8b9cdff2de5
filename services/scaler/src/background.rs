//! What the scaler's background tasks (the reconciler, the OOM retrier)
//! share: a named lease in `<NS>_LEASES` so one replica does the work, and a
//! follower that folds a slice of the log into the task's own view.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runyard_bus::TraceParent;
use runyard_bus::consumer::{Consumer, ConsumerConfig, Deliver, Handler};
use runyard_events::{Body, Event, Forge, Source, timestamp};
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::io::Io;
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
    io: Arc<Io>,
    description: &str,
    subjects: &[&str],
    handler: impl Handler,
    caught_up: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let bus = &io.bus;
    let start = OffsetDateTime::now_utc() - io.timers.lookback;
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

/// A background task's follower and lease, once the log has been read.
#[derive(Debug)]
pub(crate) struct Leased {
    /// Until when the lease may be trusted (see [`held`]).
    pub(crate) lease: watch::Receiver<Option<Instant>>,
    follower: JoinHandle<()>,
    keeper: JoinHandle<()>,
}

impl Leased {
    /// Waits for the follower and the lease keeper to stop (after `stop`).
    pub(crate) async fn finish(self) {
        let _ = self.keeper.await;
        let _ = self.follower.await;
    }
}

/// Follows `subjects` into `handler` ([`follow_log`]) and, once the log has
/// been read up to where it stood, keeps the lease `key` ([`keep_lease`]),
/// waiting up to one TTL for the first answer. `None` when stopped first.
pub(crate) async fn follow_then_lease(
    io: &Arc<Io>,
    description: &str,
    subjects: &[&str],
    handler: impl Handler + 'static,
    key: &'static str,
    stop: &CancellationToken,
) -> Option<Leased> {
    let (caught_up_tx, mut caught_up) = watch::channel(false);
    let follower = {
        let (io, description, stop) = (io.clone(), description.to_owned(), stop.clone());
        let subjects: Vec<String> = subjects.iter().map(|s| (*s).to_owned()).collect();
        tokio::spawn(async move {
            let subjects: Vec<&str> = subjects.iter().map(String::as_str).collect();
            follow_log(io, &description, &subjects, handler, caught_up_tx, stop).await;
        })
    };
    tokio::select! {
        () = stop.cancelled() => {}
        _ = caught_up.wait_for(|c| *c) => {}
    }
    if stop.is_cancelled() {
        let _ = follower.await;
        return None;
    }
    let ttl = io.timers.lease_ttl;
    let (lease_tx, mut lease) = watch::channel(None);
    let keeper = tokio::spawn(keep_lease(
        io.coord.clone(),
        key,
        ttl,
        lease_tx,
        stop.clone(),
    ));
    // The first round runs as soon as the lease is known either way.
    let _ = tokio::time::timeout(ttl, lease.changed()).await;
    Some(Leased {
        lease,
        follower,
        keeper,
    })
}

/// Publishes one of the scaler's own events (`Source.producer` `scaler`),
/// trying up to `tries` times with a growing pause; the event when it is
/// stored. The id is deterministic, so a second try never doubles it.
pub(crate) async fn publish_own(
    io: &Io,
    forge: Forge,
    instance: &str,
    id: String,
    body: Body,
    tries: u32,
) -> Option<Event> {
    let at = timestamp(OffsetDateTime::now_utc());
    let event = Event {
        id,
        occurred_at: Some(at),
        received_at: Some(at),
        source: Some(Source {
            forge: forge as i32,
            instance: instance.to_owned(),
            delivery_id: String::new(),
            hook_id: String::new(),
            producer: "scaler".into(),
        }),
        body: Some(body),
    };
    let tp = TraceParent::new_root();
    for attempt in 0..tries {
        match io.bus.publish_event(&event, &tp).await {
            Ok(_) => return Some(event),
            Err(error) => {
                tracing::warn!(%error, attempt, event = %event.id, "publishing a scaler event failed");
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(6))).await;
            }
        }
    }
    None
}
