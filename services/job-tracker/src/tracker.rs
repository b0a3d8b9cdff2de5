//! The consumer: pull batches from the durable consumer, apply each batch in
//! one transaction, ack after commit. Undecodable messages are dead-lettered
//! after a bounded number of deliveries; Postgres outages stop acking and
//! retry with back-off until it is back.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, AckKind, consumer};
use futures::StreamExt as _;
use prost::Message as _;
use runyard_bus::{Hop, Outgoing, Span, SpanKind, SpanStatus};
use runyard_events::Event;
use tokio_util::sync::CancellationToken;

use crate::State;
use crate::apply::{Incoming, apply_batch};

/// The durable consumer's name (the stream is already namespaced).
pub const CONSUMER: &str = "job-tracker";

/// Creates (or updates) the durable consumer.
pub async fn ensure_consumer(state: &State) -> Result<consumer::PullConsumer, async_nats::Error> {
    let ns = state.bus.namespace();
    let stream = state.bus.jetstream().get_stream(ns.events_stream()).await?;
    let config = consumer::pull::Config {
        durable_name: Some(CONSUMER.into()),
        description: Some("runyard job-tracker projection".into()),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: state.config.tracker_ack_wait,
        deliver_policy: consumer::DeliverPolicy::All,
        filter_subject: ns.all_events(),
        // Several batches in flight across replicas.
        max_ack_pending: i64::try_from(state.config.tracker_batch_size * 20).unwrap_or(20_000),
        max_batch: i64::try_from(state.config.tracker_batch_size).unwrap_or(1000),
        ..Default::default()
    };
    // Create, or bring an existing consumer in line with the configuration
    // (the non-strict create is create-or-update).
    let consumer = stream.create_consumer(config).await?;
    Ok(consumer)
}

/// Runs until `stop` is cancelled; the batch in hand is finished first.
pub async fn consume(state: State, stop: CancellationToken) {
    let mut backoff = Backoff::new();
    while !stop.is_cancelled() {
        let consumer = match ensure_consumer(&state).await {
            Ok(c) => c,
            Err(error) => {
                tracing::warn!(%error, "cannot set up the consumer; retrying");
                state.consumer_ready.store(false, Ordering::SeqCst);
                backoff.sleep(&stop).await;
                continue;
            }
        };
        let messages = consumer
            .stream()
            .max_messages_per_batch(state.config.tracker_batch_size)
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await;
        let mut messages = match messages {
            Ok(m) => m,
            Err(error) => {
                tracing::warn!(%error, "cannot pull from the consumer; retrying");
                backoff.sleep(&stop).await;
                continue;
            }
        };
        state.consumer_ready.store(true, Ordering::SeqCst);
        backoff.reset();
        loop {
            let first = tokio::select! {
                () = stop.cancelled() => return,
                next = messages.next() => next,
            };
            let first = match first {
                Some(Ok(m)) => m,
                Some(Err(error)) => {
                    tracing::debug!(%error, "pull error");
                    continue;
                }
                None => break,
            };
            let mut batch = vec![first];
            let deadline = tokio::time::Instant::now() + state.config.tracker_batch_wait;
            while batch.len() < state.config.tracker_batch_size {
                match tokio::time::timeout_at(deadline, messages.next()).await {
                    Ok(Some(Ok(m))) => batch.push(m),
                    _ => break,
                }
            }
            handle_batch(&state, batch, &stop).await;
        }
    }
}

/// Capped exponential back-off with jitter.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(5);

    fn new() -> Self {
        Self { next: Self::MIN }
    }

    fn reset(&mut self) {
        self.next = Self::MIN;
    }

    async fn sleep(&mut self, stop: &CancellationToken) {
        let jitter = rand::random::<f64>() * 0.5 + 0.75;
        let wait = self.next.mul_f64(jitter);
        self.next = (self.next * 2).min(Self::MAX);
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

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

async fn handle_batch(state: &State, batch: Vec<jetstream::Message>, stop: &CancellationToken) {
    let deadletter = state.bus.namespace().deadletter_subject();
    let mut incoming = Vec::with_capacity(batch.len());
    let mut to_ack = Vec::with_capacity(batch.len());
    let mut spans = Vec::new();
    for msg in batch {
        if msg.subject.as_str() == deadletter {
            to_ack.push(msg);
            continue;
        }
        let seq = msg.info().map(|i| i.stream_sequence).unwrap_or_default();
        match Event::decode(msg.payload.clone()) {
            Ok(event) if !event.id.is_empty() => {
                if let Some(span) = apply_span(&msg, seq, &event) {
                    spans.push((seq, span));
                }
                incoming.push(Incoming { seq, event });
                to_ack.push(msg);
            }
            Ok(_) => poison(state, msg, "event without id").await,
            Err(e) => poison(state, msg, &format!("undecodable event: {e}")).await,
        }
    }
    let started = Instant::now();
    let mut backoff = Backoff::new();
    let mut waited_since_stop: Option<Instant> = None;
    let mut refused = Vec::new();
    loop {
        match apply_batch(&state.pool, &incoming).await {
            Ok(applied) => {
                state.db_ok.store(true, Ordering::SeqCst);
                state.metrics.count("applied", applied.new);
                state.metrics.count("duplicate", applied.duplicates);
                if !spans.is_empty() {
                    refused.clone_from(&applied.rejected);
                }
                for (seq, reason) in &applied.rejected {
                    if let Some(i) = incoming.iter().find(|i| i.seq == *seq) {
                        let payload = i.event.encode_to_vec();
                        dead_letter(state, *seq, "", payload.into(), reason).await;
                    }
                }
                break;
            }
            Err(error) if is_transient(&error) => {
                state.db_ok.store(false, Ordering::SeqCst);
                state.metrics.apply_failures.inc();
                tracing::warn!(%error, events = incoming.len(), "applying batch failed; retrying");
                // Keep the messages ours while we wait.
                for m in &to_ack {
                    let _ = m.ack_with(AckKind::Progress).await;
                }
                if stop.is_cancelled() {
                    let since = *waited_since_stop.get_or_insert_with(Instant::now);
                    if since.elapsed() > Duration::from_secs(10) {
                        // Unacked messages are redelivered after ack_wait.
                        tracing::warn!("stopping with an unapplied batch; it will be redelivered");
                        return;
                    }
                }
                backoff.sleep(&CancellationToken::new()).await;
            }
            Err(error) => {
                // Something in this batch Postgres refuses for good: apply
                // one event at a time so only the culprit is dead-lettered.
                state.metrics.apply_failures.inc();
                tracing::error!(%error, "batch refused; applying events one by one");
                apply_one_by_one(state, &incoming).await;
                break;
            }
        }
    }
    state.metrics.batch_size.observe(incoming.len() as f64);
    state
        .metrics
        .apply_latency
        .observe(started.elapsed().as_secs_f64());
    let last = to_ack
        .iter()
        .filter_map(|m| m.info().ok().map(|i| i.stream_sequence))
        .max();
    let acks = futures::future::join_all(to_ack.iter().map(|m| m.ack()));
    for r in acks.await {
        if let Err(error) = r {
            tracing::warn!(%error, "ack failed; the message will be redelivered and deduplicated");
        }
    }
    if let Some(last) = last {
        state.last_acked.fetch_max(last, Ordering::SeqCst);
        state
            .metrics
            .last_applied_sequence
            .set(i64::try_from(state.last_acked.load(Ordering::SeqCst)).unwrap_or(i64::MAX));
    }
    for (seq, span) in spans {
        span.end(match refused.iter().find(|(s, _)| *s == seq) {
            Some((_, reason)) => SpanStatus::error(reason.clone()),
            None => SpanStatus::Ok,
        });
    }
}

/// When traces are exported, the span of applying one event: a hop of the
/// trace its message's `traceparent` names (ending once its batch is
/// committed and acked).
fn apply_span(msg: &jetstream::Message, seq: u64, event: &Event) -> Option<Span> {
    let hop = Hop::when_exported(|| {
        msg.headers
            .as_ref()
            .and_then(|h| h.get(runyard_bus::TRACEPARENT_HEADER))
            .map(async_nats::HeaderValue::as_str)
    })?;
    let mut span = hop.span("job-tracker apply", SpanKind::Consumer)?;
    span.set("runyard.event_id", event.id.clone());
    span.set("runyard.event_type", runyard_events::event_type(event));
    span.set(
        "runyard.stream_sequence",
        i64::try_from(seq).unwrap_or(i64::MAX),
    );
    Some(span)
}

async fn apply_one_by_one(state: &State, incoming: &[Incoming]) {
    for one in incoming {
        let mut backoff = Backoff::new();
        loop {
            match apply_batch(&state.pool, std::slice::from_ref(one)).await {
                Ok(applied) => {
                    state.metrics.count("applied", applied.new);
                    state.metrics.count("duplicate", applied.duplicates);
                    break;
                }
                Err(error) if is_transient(&error) => {
                    backoff.sleep(&CancellationToken::new()).await
                }
                Err(error) => {
                    let payload = one.event.encode_to_vec();
                    dead_letter(state, one.seq, "", payload.into(), &error.to_string()).await;
                    break;
                }
            }
        }
    }
}

/// An undecodable message: redelivered a bounded number of times (a newer
/// replica may understand it), then dead-lettered and acked so it never
/// blocks the rest.
async fn poison(state: &State, msg: jetstream::Message, reason: &str) {
    let (seq, delivered) = msg
        .info()
        .map(|i| (i.stream_sequence, i.delivered))
        .unwrap_or_default();
    if delivered >= i64::from(state.config.tracker_max_attempts) {
        dead_letter(
            state,
            seq,
            msg.subject.as_str(),
            msg.payload.clone(),
            reason,
        )
        .await;
        if let Err(error) = msg.ack().await {
            tracing::warn!(%error, "ack of dead-lettered message failed");
        }
    } else {
        tracing::warn!(seq, delivered, reason, "undecodable message; will retry");
        let _ = msg
            .ack_with(AckKind::Nak(Some(Duration::from_millis(200))))
            .await;
    }
}

async fn dead_letter(state: &State, seq: u64, subject: &str, payload: bytes::Bytes, reason: &str) {
    let clean: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(512)
        .collect();
    let msg = Outgoing {
        subject: state.bus.namespace().deadletter_subject(),
        id: format!("deadletter:{seq}"),
        headers: vec![
            ("Runyard-Deadletter-Reason".into(), clean.clone()),
            ("Runyard-Original-Subject".into(), subject.to_owned()),
            ("Runyard-Original-Sequence".into(), seq.to_string()),
        ],
        payload,
    };
    let mut backoff = Backoff::new();
    for _ in 0..5 {
        match state.bus.publish(msg.clone()).await {
            Ok(_) => {
                state.metrics.count("deadlettered", 1);
                tracing::error!(seq, reason = %clean, "event dead-lettered");
                return;
            }
            Err(error) => {
                tracing::warn!(%error, seq, "dead-letter publish failed; retrying");
                backoff.sleep(&CancellationToken::new()).await;
            }
        }
    }
}
