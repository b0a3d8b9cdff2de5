//! Handling one batch: triage, the handler with its retries, dead letters,
//! acks, progress acks while any of it runs, and a span per event.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use runyard_events::Event;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::retry::{self, Grace};
use super::triage::{self, Triage};
use super::{BatchReport, Consumer, Delivery, Handler, HandlerError, Rejected, deadletter};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{BusError, SpanStatus};

/// How long an undecodable message waits before its next delivery.
const UNDECODABLE_DELAY: Duration = Duration::from_millis(200);

impl Consumer {
    /// Handles `msgs`: undecodable ones are sent back (or dead-lettered on
    /// their last attempt), dead letters skipped, events handed to
    /// `handler`; then rejected events are dead-lettered and everything
    /// resolved is acked — progress acks keeping the rest meanwhile.
    pub(super) async fn handle_batch<H: Handler>(
        &mut self,
        handler: &H,
        msgs: Vec<jetstream::Message>,
    ) -> BatchReport {
        let started = Instant::now();
        let mut report = BatchReport::default();
        let mut fates = Vec::with_capacity(msgs.len());
        let mut seqs = Vec::with_capacity(msgs.len());
        let mut deliveries = Vec::with_capacity(msgs.len());
        // Position in `msgs` of each delivery.
        let mut carried = Vec::with_capacity(msgs.len());
        let mut spans = Vec::new();
        // A span per event when something will see it: an exporter, or the
        // debug line written in it (the handler gets whole batches: nothing
        // else runs inside these spans).
        let traced = runyard_telemetry::spans_wanted!();
        for (i, msg) in msgs.iter().enumerate() {
            let (seq, delivered, pending) = msg
                .info()
                .map(|info| (info.stream_sequence, info.delivered, info.pending))
                .unwrap_or_default();
            seqs.push(seq);
            let triage = triage::triage(
                msg.subject.as_str(),
                msg.payload.clone(),
                delivered,
                self.config.max_attempts,
                &self.deadletter_subject,
            );
            fates.push(match triage {
                Triage::Skip => {
                    report.skipped.push(seq);
                    Fate::Ack
                }
                Triage::Handle(event) => {
                    let traceparent = msg
                        .headers
                        .as_ref()
                        .and_then(|h| h.get(crate::TRACEPARENT_HEADER))
                        .map(|v| v.as_str().to_owned());
                    if traced {
                        spans.push(event_span(
                            self.config.span_name,
                            traceparent.as_deref(),
                            seq,
                            &event,
                        ));
                    }
                    deliveries.push(Delivery {
                        seq,
                        subject: msg.subject.to_string(),
                        event,
                        traceparent,
                        delivered,
                        pending,
                    });
                    carried.push(i);
                    Fate::Pending
                }
                Triage::Retry(reason) => {
                    tracing::warn!(seq, delivered, %reason, "undecodable message; will retry");
                    if let Err(error) = msg.ack_with(AckKind::Nak(Some(UNDECODABLE_DELAY))).await {
                        tracing::debug!(%error, seq, "nak failed; redelivered after ack_wait");
                    }
                    report.retried.push(seq);
                    Fate::Done
                }
                Triage::DeadLetter(reason) => Fate::DeadLetter(reason),
            });
        }
        if let Some(m) = &self.metrics {
            m.count("retried", report.retried.len());
        }

        // Keep everything still in hand ours while it is worked on.
        let held: Vec<&jetstream::Message> = msgs
            .iter()
            .zip(&fates)
            .filter(|(_, f)| !matches!(f, Fate::Done))
            .map(|(m, _)| m)
            .collect();
        let mut keep = KeepAlive::new(held, self.config.ack_wait, started);
        let mut grace = Grace::new(self.shutdown.clone(), self.config.shutdown_grace);

        if !deliveries.is_empty() {
            let applying = Instant::now();
            let outcomes = self
                .apply(handler, &deliveries, &mut keep, &mut grace)
                .await;
            let applied_in = applying.elapsed();
            for ((outcome, &i), delivery) in outcomes.iter().zip(&carried).zip(&deliveries) {
                fates[i] = match outcome {
                    Outcome::Applied => {
                        report.handled.push(delivery.seq);
                        Fate::Ack
                    }
                    Outcome::Rejected(reason) => Fate::DeadLetter(reason.clone()),
                    Outcome::Unresolved => Fate::Leave,
                };
            }
            if let Some(m) = &self.metrics {
                m.batch_size.observe(deliveries.len() as f64);
                m.apply_latency.observe(applied_in.as_secs_f64());
            }
            // Each event's span ends here, with its outcome (and, at
            // debug, a log line in it: the event's trace id in the logs).
            let log = tracing::enabled!(tracing::Level::DEBUG);
            // `spans` is empty when not `traced`.
            for ((span, outcome), delivery) in spans.into_iter().zip(&outcomes).zip(&deliveries) {
                let (status, label) = match outcome {
                    Outcome::Applied => (SpanStatus::Ok, "applied"),
                    Outcome::Rejected(reason) => (SpanStatus::error(reason.clone()), "rejected"),
                    Outcome::Unresolved => (
                        SpanStatus::error("not applied before shutdown; left for redelivery"),
                        "unresolved",
                    ),
                };
                span.set_status(status);
                if log {
                    span.in_scope(|| {
                        tracing::debug!(
                            seq = delivery.seq,
                            event_id = %delivery.event.id,
                            outcome = label,
                            "event handled"
                        );
                    });
                }
            }
        }

        // Dead letters first: a message is acked only once its dead letter
        // is stored.
        for (i, fate) in fates.iter_mut().enumerate() {
            let Fate::DeadLetter(reason) = fate else {
                continue;
            };
            let stored = self
                .dead_letter(&msgs[i], seqs[i], reason, &mut keep, &mut grace)
                .await;
            *fate = if stored {
                report.deadlettered.push((seqs[i], std::mem::take(reason)));
                Fate::Ack
            } else {
                Fate::Leave
            };
        }

        let to_ack: Vec<usize> = (0..msgs.len())
            .filter(|&i| matches!(fates[i], Fate::Ack))
            .collect();
        let acks = futures::future::join_all(to_ack.iter().map(|&i| msgs[i].ack())).await;
        for (r, &i) in acks.iter().zip(&to_ack) {
            if let Err(error) = r {
                tracing::warn!(%error, seq = seqs[i], "ack failed; the message will be redelivered");
            }
        }
        if let Some(last) = to_ack.iter().map(|&i| seqs[i]).max() {
            let before = self.status.0.last_acked.fetch_max(last, Ordering::SeqCst);
            if let Some(m) = &self.metrics {
                m.last_applied_sequence
                    .set(i64::try_from(before.max(last)).unwrap_or(i64::MAX));
            }
        }
        report.unacked = (0..msgs.len())
            .filter(|&i| matches!(fates[i], Fate::Leave))
            .map(|i| seqs[i])
            .collect();
        if !report.unacked.is_empty() {
            tracing::warn!(
                unacked = report.unacked.len(),
                consumer = %self.label(),
                "leaving messages unacked; they will be redelivered"
            );
        }
        report
    }

    /// Applies `batch`: as a whole, retrying transient failures; one event
    /// at a time after a permanent failure. One outcome per delivery.
    async fn apply<H: Handler>(
        &self,
        handler: &H,
        batch: &[Delivery],
        keep: &mut KeepAlive<'_>,
        grace: &mut Grace,
    ) -> Vec<Outcome> {
        let mut backoff = retry::backoff();
        loop {
            match keep.during(handler.handle(batch)).await {
                Ok(rejected) => {
                    self.stalled(false);
                    return outcomes(batch, rejected);
                }
                Err(HandlerError::Transient(reason)) => {
                    self.failed();
                    self.stalled(true);
                    tracing::warn!(%reason, events = batch.len(), consumer = %self.label(), "handling batch failed; stalled, retrying");
                    if !keep.during(grace.pause(&mut backoff)).await {
                        return vec![Outcome::Unresolved; batch.len()];
                    }
                }
                Err(HandlerError::Permanent(reason)) if batch.len() == 1 => {
                    self.failed();
                    self.stalled(false);
                    return vec![Outcome::Rejected(reason)];
                }
                Err(HandlerError::Permanent(reason)) => {
                    self.failed();
                    self.stalled(false);
                    tracing::error!(%reason, events = batch.len(), consumer = %self.label(), "batch refused; handling events one by one");
                    return self.one_by_one(handler, batch, keep, grace).await;
                }
            }
        }
    }

    async fn one_by_one<H: Handler>(
        &self,
        handler: &H,
        batch: &[Delivery],
        keep: &mut KeepAlive<'_>,
        grace: &mut Grace,
    ) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(batch.len());
        for one in batch.chunks(1) {
            let mut backoff = retry::backoff();
            let outcome = loop {
                match keep.during(handler.handle(one)).await {
                    Ok(rejected) => {
                        self.stalled(false);
                        break outcomes(one, rejected).swap_remove(0);
                    }
                    Err(HandlerError::Permanent(reason)) => {
                        self.failed();
                        self.stalled(false);
                        break Outcome::Rejected(reason);
                    }
                    Err(HandlerError::Transient(reason)) => {
                        self.failed();
                        self.stalled(true);
                        tracing::warn!(%reason, seq = one[0].seq, "handling event failed; stalled, retrying");
                        if !keep.during(grace.pause(&mut backoff)).await {
                            break Outcome::Unresolved;
                        }
                    }
                }
            };
            out.push(outcome);
            if matches!(out.last(), Some(Outcome::Unresolved)) {
                // Out of time: the rest is not tried.
                out.resize(batch.len(), Outcome::Unresolved);
                break;
            }
        }
        out
    }

    fn failed(&self) {
        if let Some(m) = &self.metrics {
            m.apply_failures.inc();
        }
    }

    /// Records whether the consumer is stalled on a transient failure.
    fn stalled(&self, stalled: bool) {
        let was = self.status.0.stalled.swap(stalled, Ordering::SeqCst);
        if let Some(m) = &self.metrics {
            m.stalled.set(i64::from(stalled));
        }
        if was && !stalled {
            tracing::info!(consumer = %self.label(), "handler succeeded again; no longer stalled");
        }
    }

    /// Publishes the dead letter of `msg`, retrying until it is stored or
    /// shutdown's grace runs out; true once stored.
    async fn dead_letter(
        &self,
        msg: &jetstream::Message,
        seq: u64,
        reason: &str,
        keep: &mut KeepAlive<'_>,
        grace: &mut Grace,
    ) -> bool {
        let mut letter = deadletter::message(
            &self.deadletter_subject,
            seq,
            msg.subject.as_str(),
            msg.payload.clone(),
            reason,
        );
        let mut backoff = retry::backoff();
        loop {
            match keep.during(self.bus.publish(letter.clone())).await {
                Ok(_) => {
                    if let Some(m) = &self.metrics {
                        m.count("deadlettered", 1);
                    }
                    tracing::error!(seq, reason = %deadletter::clean_reason(reason), consumer = %self.label(), "event dead-lettered");
                    return true;
                }
                Err(BusError::TooLarge(size)) if !letter.payload.is_empty() => {
                    tracing::warn!(
                        seq,
                        size,
                        "dead letter too large; storing it without the body"
                    );
                    letter = deadletter::without_payload(letter);
                }
                Err(error) => {
                    tracing::warn!(%error, seq, "dead-letter publish failed; retrying");
                    if !keep.during(grace.pause(&mut backoff)).await {
                        return false;
                    }
                }
            }
        }
    }
}

/// What happens to one message of a batch.
#[derive(Debug)]
enum Fate {
    /// Waiting for the handler.
    Pending,
    /// To be dead-lettered, then acked.
    DeadLetter(String),
    /// To be acked.
    Ack,
    /// Already answered (nak'd).
    Done,
    /// Left unacked: redelivered after `ack_wait`.
    Leave,
}

/// What the handler made of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Applied,
    Rejected(String),
    Unresolved,
}

/// One outcome per delivery of `batch`, given what the handler rejected.
fn outcomes(batch: &[Delivery], rejected: Rejected) -> Vec<Outcome> {
    if rejected.is_empty() {
        return vec![Outcome::Applied; batch.len()];
    }
    let mut by_seq: HashMap<u64, String> = rejected.into_iter().collect();
    let out: Vec<Outcome> = batch
        .iter()
        .map(|d| match by_seq.get(&d.seq) {
            Some(reason) => Outcome::Rejected(reason.clone()),
            None => Outcome::Applied,
        })
        .collect();
    by_seq.retain(|seq, _| !batch.iter().any(|d| d.seq == *seq));
    if !by_seq.is_empty() {
        let unknown: Vec<u64> = by_seq.into_keys().collect();
        tracing::warn!(
            ?unknown,
            "handler rejected sequences not in its batch; ignored"
        );
    }
    out
}

/// Sends progress acks for the messages in hand every `ack_wait / 2` while
/// something (the handler, a back-off, a dead-letter publish) runs.
struct KeepAlive<'a> {
    held: Vec<&'a jetstream::Message>,
    tick: Interval,
}

impl<'a> KeepAlive<'a> {
    fn new(held: Vec<&'a jetstream::Message>, ack_wait: Duration, started: Instant) -> Self {
        let every = (ack_wait / 2).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval_at(started + every, every);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self { held, tick }
    }

    async fn during<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = self.tick.tick() => self.progress().await,
            }
        }
    }

    async fn progress(&self) {
        let acks = self.held.iter().map(|m| m.ack_with(AckKind::Progress));
        let failed = futures::future::join_all(acks)
            .await
            .iter()
            .filter(|r| r.is_err())
            .count();
        tracing::debug!(messages = self.held.len(), failed, "progress acks sent");
    }
}

/// The span of handling one event (exported as `name`): a hop of the trace
/// its `traceparent` names, ended once its batch is resolved.
fn event_span(
    name: &'static str,
    traceparent: Option<&str>,
    seq: u64,
    event: &Event,
) -> tracing::Span {
    let span = tracing::info_span!(
        "event",
        otel.name = name,
        otel.kind = "consumer",
        runyard.event_id = event.id.as_str(),
        runyard.event_type = runyard_events::event_type(event),
        runyard.stream_sequence = i64::try_from(seq).unwrap_or(i64::MAX),
    );
    crate::adopt(&span, traceparent);
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivery(seq: u64) -> Delivery {
        Delivery {
            seq,
            subject: "ns.v1.usage.github".into(),
            event: Event {
                id: format!("e-{seq}"),
                ..Event::default()
            },
            traceparent: None,
            delivered: 1,
            pending: 0,
        }
    }

    #[test]
    fn outcomes_follow_the_rejections_by_sequence() {
        let batch: Vec<Delivery> = [4, 5, 6].into_iter().map(delivery).collect();
        assert_eq!(outcomes(&batch, vec![]), vec![Outcome::Applied; 3]);
        assert_eq!(
            outcomes(&batch, vec![(5, "no".into()), (99, "not ours".into())]),
            vec![
                Outcome::Applied,
                Outcome::Rejected("no".into()),
                Outcome::Applied
            ]
        );
    }
}
