//! Consuming the event log with ack-after-commit.
//!
//! A [`Consumer`] pulls batches from a JetStream pull consumer (durable and
//! shared by replicas, or ephemeral for one process), decodes them into
//! [`Delivery`]s and hands each batch to a [`Handler`]. A message is acked
//! only once its effect is durable — the handler returned — or, for an event
//! that can never be applied, once its dead letter is stored. Everything
//! else is left to JetStream's redelivery:
//!
//! - a transient failure ([`HandlerError::Transient`]: the environment, not
//!   an event) stalls the consumer: the batch is retried with a jittered
//!   back-off, keeping its messages with progress acks, for as long as it
//!   takes, and [`ConsumerStatus::is_stalled`] (and the `stalled` gauge)
//!   says so until a batch succeeds again; nothing is dead-lettered for it;
//! - a permanent failure ([`HandlerError::Permanent`]: something in one
//!   event) splits the batch and applies it one event at a time, so only
//!   the culprit is dead-lettered;
//! - events the handler rejects are dead-lettered, in either path;
//! - undecodable messages (or events without id) come back a bounded number
//!   of times, then are dead-lettered;
//! - a dead letter that cannot be stored leaves its message unacked.
//!
//! Every wait observes the shutdown token: on shutdown the batch in hand is
//! finished and acked, or, if it keeps failing, given up after a grace
//! period without an ack (redelivered within `ack_wait`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::consumer::pull::{self, MessagesErrorKind};
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy};
use futures::StreamExt as _;
use runyard_events::Event;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Bus, BusError, StreamSettings, nats_err};

mod batch;
mod deadletter;
mod metrics;
mod retry;
mod triage;

pub use deadletter::{
    ORIGINAL_SEQUENCE_HEADER, ORIGINAL_SUBJECT_HEADER, PAYLOAD_DROPPED_HEADER, REASON_HEADER,
};
pub use metrics::{ConsumerMetrics, ResultLabel};

/// Idle heartbeat asked of the server for the pull stream: two missed ones
/// mean the consumer is gone (deleted, server restarted) and is bound again.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Expiry of each pull request.
const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// How long [`Consumer::run`] waits for a first message before looking at the
/// shutdown token and its binding again.
const IDLE_WAIT: Duration = Duration::from_secs(5);
/// How often [`Consumer::run`] refreshes the lag gauge.
const LAG_EVERY: Duration = Duration::from_secs(2);
/// Bound on one lag probe and on deleting an ephemeral consumer at exit.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Where a new consumer starts in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Deliver {
    /// From the oldest message the stream holds.
    #[default]
    All,
    /// Only messages published after the consumer is created.
    New,
    /// From the first message published at or after this time.
    ByStartTime(time::OffsetDateTime),
    /// From this stream sequence.
    ByStartSequence(u64),
}

impl Deliver {
    fn policy(self) -> DeliverPolicy {
        match self {
            Self::All => DeliverPolicy::All,
            Self::New => DeliverPolicy::New,
            Self::ByStartTime(start_time) => DeliverPolicy::ByStartTime { start_time },
            Self::ByStartSequence(start_sequence) => {
                DeliverPolicy::ByStartSequence { start_sequence }
            }
        }
    }
}

/// How a [`Consumer`] binds and batches.
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    /// `Some(name)`: a durable consumer, shared by every replica using the
    /// name (each message goes to one of them). `None`: an ephemeral
    /// consumer for this process alone (a follower), removed by the server
    /// after [`ConsumerConfig::inactive_threshold`] without a client, and
    /// deleted when [`Consumer::run`] ends.
    ///
    /// A durable's [`ConsumerConfig::deliver`] applies when it is first
    /// created; binding again keeps the start point it already has.
    pub durable: Option<String>,
    /// Description stored with the consumer (and used in logs).
    pub description: String,
    /// Subjects to consume; empty means the whole stream. Several filters
    /// need NATS ≥ 2.10.
    pub filter_subjects: Vec<String>,
    /// Where a new consumer starts.
    pub deliver: Deliver,
    /// Most messages in one batch.
    pub batch_size: usize,
    /// Longest wait, after a batch's first message, for more to fill it.
    pub batch_wait: Duration,
    /// How long JetStream waits for an ack before delivering a message
    /// again. Short (5 s by default) so that what a killed process held
    /// comes back within seconds; batches handled for longer are kept with
    /// progress acks every `ack_wait / 2`.
    pub ack_wait: Duration,
    /// Deliveries of an undecodable message (or an event without id) before
    /// it is dead-lettered.
    pub max_attempts: u32,
    /// For ephemeral consumers: how long the server keeps one without a
    /// client pulling.
    pub inactive_threshold: Duration,
    /// After shutdown is asked for, how long a batch that keeps failing (or
    /// a dead letter that cannot be stored) is still retried before it is
    /// given up unacked.
    pub shutdown_grace: Duration,
    /// Name of the span exported for each event (one hop of the trace its
    /// `traceparent` names), when trace export is on.
    pub span_name: &'static str,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            durable: None,
            description: "runyard consumer".into(),
            filter_subjects: Vec::new(),
            deliver: Deliver::All,
            batch_size: 1000,
            batch_wait: Duration::from_millis(50),
            ack_wait: Duration::from_secs(5),
            max_attempts: 3,
            inactive_threshold: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(10),
            span_name: "runyard consume",
        }
    }
}

/// One decoded event handed to a [`Handler`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Stream sequence.
    pub seq: u64,
    /// The subject it was published on.
    pub subject: String,
    /// The event (always with an id).
    pub event: Event,
    /// Its `traceparent` header, if any.
    pub traceparent: Option<String>,
    /// How many times it has been delivered, this time included.
    pub delivered: i64,
    /// Messages matching the consumer's filters still to come after this
    /// one when it was delivered (0: the follower has caught up).
    pub pending: u64,
}

/// Events a handler can never apply, as `(stream sequence, reason)`: they
/// are dead-lettered.
pub type Rejected = Vec<(u64, String)>;

/// Why a whole batch failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandlerError {
    /// The environment failed, not an event (a database outage, read-only
    /// or missing schema, refused credentials or permissions, a conflict):
    /// the consumer stalls, retrying the batch with back-off until it
    /// succeeds or shutdown's grace is over. Never dead-letters anything,
    /// so a broken environment cannot empty the log into dead letters.
    #[error("transient failure: {0}")]
    Transient(String),
    /// Something in one event of the batch will never succeed, whatever the
    /// environment: the batch is split and applied one event at a time; an
    /// event failing permanently on its own is dead-lettered with this
    /// reason.
    #[error("permanent failure: {0}")]
    Permanent(String),
}

/// What a [`Consumer`] does with its batches.
pub trait Handler: Send + Sync {
    /// Applies a batch. The effect must be durable when it returns `Ok`
    /// (the batch is acked next) and idempotent (a message is redelivered
    /// when an ack is lost). `Ok(rejected)` lists `(seq, reason)` of events
    /// that can never be applied: they are dead-lettered.
    fn handle(
        &self,
        batch: &[Delivery],
    ) -> impl Future<Output = Result<Rejected, HandlerError>> + Send;
}

/// What became of one batch, by stream sequence.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Events the handler applied, acked.
    pub handled: Vec<u64>,
    /// Events or messages dead-lettered, then acked: `(seq, reason)`.
    pub deadlettered: Vec<(u64, String)>,
    /// Undecodable messages sent back for another delivery.
    pub retried: Vec<u64>,
    /// Messages on the dead-letter subject, acked without handling.
    pub skipped: Vec<u64>,
    /// Messages left unacked (still failing when shutdown's grace ran out,
    /// or their dead letter could not be stored): delivered again later.
    pub unacked: Vec<u64>,
}

/// A consumer's state as other tasks see it (readiness probes, followers).
/// Cloning shares it.
#[derive(Debug, Clone)]
pub struct ConsumerStatus(Arc<StatusInner>);

#[derive(Debug)]
struct StatusInner {
    ready: watch::Sender<bool>,
    stalled: AtomicBool,
    last_acked: AtomicU64,
}

impl ConsumerStatus {
    fn new() -> Self {
        Self(Arc::new(StatusInner {
            ready: watch::Sender::new(false),
            stalled: AtomicBool::new(false),
            last_acked: AtomicU64::new(0),
        }))
    }

    /// True while the consumer is bound and pulling.
    pub fn is_ready(&self) -> bool {
        *self.0.ready.borrow()
    }

    /// True from a transient handler failure until the handler next
    /// succeeds (or fails permanently): the consumer is retrying the batch
    /// in hand and applies nothing meanwhile.
    pub fn is_stalled(&self) -> bool {
        self.0.stalled.load(Ordering::SeqCst)
    }

    /// Readiness as it changes.
    pub fn ready_changes(&self) -> watch::Receiver<bool> {
        self.0.ready.subscribe()
    }

    /// The highest stream sequence this consumer acked (0 before any).
    pub fn last_acked(&self) -> u64 {
        self.0.last_acked.load(Ordering::SeqCst)
    }

    fn set_ready(&self, ready: bool) {
        self.0
            .ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }
}

/// A bound pull consumer: the server-side name and the message stream.
struct Pull {
    name: String,
    messages: pull::Stream,
}

/// Consumes the namespace's event stream in batches with ack-after-commit
/// (see the [module documentation](self)).
pub struct Consumer {
    bus: Bus,
    config: ConsumerConfig,
    metrics: Option<ConsumerMetrics>,
    status: ConsumerStatus,
    deadletter_subject: String,
    shutdown: CancellationToken,
    pull: Option<Pull>,
    /// The last ephemeral consumer bound, deleted when binding again.
    ephemeral: Option<String>,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("namespace", self.bus.namespace())
            .field("config", &self.config)
            .field("bound", &self.pull.as_ref().map(|p| p.name.as_str()))
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    /// A consumer of `bus`'s event stream that binds on first use (so it can
    /// be built before NATS or the stream is there). `metrics`, when given,
    /// are updated as batches are handled.
    pub fn new(bus: &Bus, config: ConsumerConfig, metrics: Option<ConsumerMetrics>) -> Self {
        Self {
            deadletter_subject: bus.namespace().deadletter_subject(),
            bus: bus.clone(),
            config,
            metrics,
            status: ConsumerStatus::new(),
            shutdown: CancellationToken::new(),
            pull: None,
            ephemeral: None,
        }
    }

    /// A consumer bound now: creates (or updates) the JetStream consumer,
    /// creating the namespace's streams with default settings if they are
    /// missing, and starts pulling.
    pub async fn bind(
        bus: &Bus,
        config: ConsumerConfig,
        metrics: Option<ConsumerMetrics>,
    ) -> Result<Self, BusError> {
        let mut consumer = Self::new(bus, config, metrics);
        consumer.bind_now().await?;
        Ok(consumer)
    }

    /// Makes every wait of [`Consumer::process_next`] observe `shutdown`
    /// ([`Consumer::run`] does this with its own token).
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ConsumerConfig {
        &self.config
    }

    /// A handle on readiness and the last acked sequence.
    pub fn status(&self) -> ConsumerStatus {
        self.status.clone()
    }

    /// The JetStream consumer's name while bound (an ephemeral consumer's
    /// is made up by the server).
    pub fn name(&self) -> Option<&str> {
        self.pull.as_ref().map(|p| p.name.as_str())
    }

    fn label(&self) -> &str {
        self.config
            .durable
            .as_deref()
            .unwrap_or(&self.config.description)
    }

    /// Handles one batch: waits up to `wait` for a first message (less if
    /// shutdown is asked for), fills the batch for up to `batch_wait`, then
    /// handles, dead-letters and acks it. `Ok(None)` when nothing came.
    /// Binds first if not bound; an error means the binding is lost (the
    /// next call binds again).
    #[tracing::instrument(level = "debug", skip_all, fields(consumer = %self.label()))]
    pub async fn process_next<H: Handler>(
        &mut self,
        handler: &H,
        wait: Duration,
    ) -> Result<Option<BatchReport>, BusError> {
        if self.pull.is_none() {
            self.bind_now().await?;
        }
        let Some(batch) = self.next_batch(wait).await? else {
            return Ok(None);
        };
        Ok(Some(self.handle_batch(handler, batch).await))
    }

    /// Runs until `shutdown` is cancelled: handles batch after batch,
    /// binding again with back-off whenever the binding is lost. On
    /// shutdown, the batch in hand is finished and acked first (or, still
    /// failing after [`ConsumerConfig::shutdown_grace`], left unacked). With
    /// metrics, the lag gauge is refreshed every couple of seconds.
    pub async fn run<H: Handler>(mut self, handler: H, shutdown: CancellationToken) {
        self.shutdown = shutdown.clone();
        let lag = self.metrics.clone().map(|metrics| {
            tokio::spawn(watch_lag(
                self.bus.clone(),
                self.status.clone(),
                metrics,
                shutdown.clone(),
            ))
        });
        let mut backoff = None;
        while !shutdown.is_cancelled() {
            match self.process_next(&handler, IDLE_WAIT).await {
                Ok(_) => backoff = None,
                Err(error) => {
                    tracing::warn!(%error, consumer = %self.label(), "consumer unavailable; binding again");
                    let delay = backoff
                        .get_or_insert_with(retry::backoff)
                        .next()
                        .unwrap_or(IDLE_WAIT);
                    tokio::select! {
                        () = shutdown.cancelled() => {}
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        self.status.set_ready(false);
        self.pull = None;
        self.delete_ephemeral().await;
        if let Some(lag) = lag {
            let _ = lag.await;
        }
        tracing::info!(consumer = %self.label(), "consumer stopped");
    }

    /// Reads the stream's last sequence and sets the lag gauge (if any) to
    /// it minus the last sequence acked; returns the lag.
    pub async fn refresh_lag(&self) -> Result<u64, BusError> {
        let lag = stream_lag(&self.bus, &self.status).await?;
        if let Some(m) = &self.metrics {
            m.consumer_lag.set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
        Ok(lag)
    }

    async fn bind_now(&mut self) -> Result<(), BusError> {
        self.pull = None;
        let bound = self.try_bind().await;
        self.status.set_ready(bound.is_ok());
        if let Err(error) = &bound {
            tracing::debug!(%error, consumer = %self.label(), "binding failed");
        }
        bound
    }

    async fn try_bind(&mut self) -> Result<(), BusError> {
        let js = self.bus.jetstream();
        let name = self.bus.namespace().events_stream();
        let stream = match js.get_stream(&name).await {
            Ok(s) => s,
            Err(_) => {
                // Missing (nothing has created it yet) or unreachable: create
                // it where missing, never changing an existing one.
                self.bus
                    .create_events_stream_if_missing(&StreamSettings::default())
                    .await?;
                js.get_stream(&name)
                    .await
                    .map_err(|e| nats_err("finding the event stream", e))?
            }
        };
        let mut config = pull_config(&self.config);
        match &self.config.durable {
            Some(durable) => {
                // A durable keeps the start point it was created with: the
                // server refuses to change it, and a restarted replica must
                // not move it.
                if let Ok(info) = stream.consumer_info(durable).await {
                    config.deliver_policy = info.config.deliver_policy;
                }
            }
            None => {
                if let Some(old) = self.ephemeral.take() {
                    let _ = tokio::time::timeout(PROBE_TIMEOUT, stream.delete_consumer(&old)).await;
                }
                // A follower bound again carries on after what it acked.
                let acked = self.status.last_acked();
                if acked > 0 {
                    config.deliver_policy = DeliverPolicy::ByStartSequence {
                        start_sequence: acked + 1,
                    };
                }
            }
        }
        let consumer = stream
            .create_consumer(config)
            .await
            .map_err(|e| nats_err("creating the consumer", e))?;
        let name = consumer.cached_info().name.clone();
        let messages = consumer
            .stream()
            .max_messages_per_batch(self.config.batch_size.max(1))
            .heartbeat(HEARTBEAT)
            .expires(PULL_EXPIRES)
            .messages()
            .await
            .map_err(|e| nats_err("pulling from the consumer", e))?;
        if self.config.durable.is_none() {
            self.ephemeral = Some(name.clone());
        }
        tracing::info!(consumer = %self.label(), name = %name, "consumer bound");
        self.pull = Some(Pull { name, messages });
        Ok(())
    }

    async fn delete_ephemeral(&mut self) {
        let Some(name) = self.ephemeral.take() else {
            return;
        };
        let js = self.bus.jetstream();
        let delete = async {
            let stream = js
                .get_stream(self.bus.namespace().events_stream())
                .await
                .ok()?;
            stream.delete_consumer(&name).await.ok()
        };
        let _ = tokio::time::timeout(PROBE_TIMEOUT, delete).await;
    }

    /// The next batch: a first message within `wait`, then whatever comes
    /// within `batch_wait`, up to `batch_size`.
    async fn next_batch(
        &mut self,
        wait: Duration,
    ) -> Result<Option<Vec<jetstream::Message>>, BusError> {
        let shutdown = self.shutdown.clone();
        let Some(pull) = self.pull.as_mut() else {
            return Ok(None);
        };
        let deadline = Instant::now() + wait;
        let first = loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => return Ok(None),
                next = tokio::time::timeout_at(deadline, pull.messages.next()) => next,
            };
            match next {
                Err(_elapsed) => return Ok(None),
                Ok(Some(Ok(msg))) => break msg,
                Ok(Some(Err(error))) if is_fatal(error.kind()) => {
                    self.lost();
                    return Err(nats_err("pulling messages", error));
                }
                Ok(Some(Err(error))) => {
                    tracing::debug!(%error, "pull error");
                }
                Ok(None) => {
                    self.lost();
                    return Err(nats_err("pulling messages", "the pull stream ended"));
                }
            }
        };
        let size = self.config.batch_size.max(1);
        let mut batch = Vec::with_capacity(size.min(1024));
        batch.push(first);
        let fill = Instant::now() + self.config.batch_wait;
        let mut fatal = false;
        while batch.len() < size {
            match tokio::time::timeout_at(fill, pull.messages.next()).await {
                Ok(Some(Ok(msg))) => batch.push(msg),
                Ok(Some(Err(error))) if !is_fatal(error.kind()) => {}
                Ok(_) => {
                    // Handle what came; bind again afterwards.
                    fatal = true;
                    break;
                }
                Err(_elapsed) => break,
            }
        }
        if fatal {
            self.lost();
        }
        Ok(Some(batch))
    }

    /// The binding is gone: drop it, so the next call binds again.
    fn lost(&mut self) {
        self.pull = None;
        self.status.set_ready(false);
    }
}

/// The JetStream settings of a consumer configured by `c`.
fn pull_config(c: &ConsumerConfig) -> pull::Config {
    let batch = c.batch_size.max(1);
    let (filter_subject, filter_subjects) = match c.filter_subjects.as_slice() {
        [] => (String::new(), Vec::new()),
        [one] => (one.clone(), Vec::new()),
        many => (String::new(), many.to_vec()),
    };
    pull::Config {
        durable_name: c.durable.clone(),
        description: Some(c.description.clone()),
        ack_policy: AckPolicy::Explicit,
        ack_wait: c.ack_wait,
        deliver_policy: c.deliver.policy(),
        filter_subject,
        filter_subjects,
        // Several batches in flight across replicas.
        max_ack_pending: i64::try_from(batch.saturating_mul(20)).unwrap_or(i64::MAX),
        max_batch: i64::try_from(batch).unwrap_or(i64::MAX),
        inactive_threshold: if c.durable.is_some() {
            Duration::ZERO
        } else {
            c.inactive_threshold
        },
        ..Default::default()
    }
}

/// Errors after which the pull stream is of no more use.
fn is_fatal(kind: MessagesErrorKind) -> bool {
    matches!(
        kind,
        MessagesErrorKind::MissingHeartbeat
            | MessagesErrorKind::ConsumerDeleted
            | MessagesErrorKind::NoResponders
            | MessagesErrorKind::PushBasedConsumer
            | MessagesErrorKind::RequestLimitExceeded
    )
}

/// The stream's last sequence minus the last one acked.
async fn stream_lag(bus: &Bus, status: &ConsumerStatus) -> Result<u64, BusError> {
    let probe = bus.jetstream().get_stream(bus.namespace().events_stream());
    let stream = tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .map_err(|_| BusError::AckTimeout(PROBE_TIMEOUT))?
        .map_err(|e| nats_err("reading stream info", e))?;
    let last = stream.cached_info().state.last_sequence;
    Ok(last.saturating_sub(status.last_acked()))
}

async fn watch_lag(
    bus: Bus,
    status: ConsumerStatus,
    metrics: ConsumerMetrics,
    stop: CancellationToken,
) {
    loop {
        if let Ok(lag) = stream_lag(&bus, &status).await {
            metrics
                .consumer_lag
                .set(i64::try_from(lag).unwrap_or(i64::MAX));
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(LAG_EVERY) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_filter_is_sent_as_filter_subject_several_as_filter_subjects() {
        let config = |filters: &[&str], durable: Option<&str>| ConsumerConfig {
            filter_subjects: filters.iter().map(|f| (*f).to_owned()).collect(),
            durable: durable.map(str::to_owned),
            batch_size: 10,
            ..ConsumerConfig::default()
        };
        let c = config(&["a.>"], None);
        let p = pull_config(&c);
        assert_eq!(
            (p.filter_subject.as_str(), p.filter_subjects.len()),
            ("a.>", 0)
        );
        assert_eq!(p.inactive_threshold, c.inactive_threshold);
        assert_eq!(p.durable_name, None);
        let p = pull_config(&config(&["a.>", "b.>"], Some("d")));
        assert_eq!(p.filter_subject, "");
        assert_eq!(p.filter_subjects, vec!["a.>".to_owned(), "b.>".to_owned()]);
        assert_eq!(p.inactive_threshold, Duration::ZERO);
        assert_eq!(p.durable_name.as_deref(), Some("d"));
        assert_eq!((p.max_batch, p.max_ack_pending), (10, 200));
        assert_eq!(p.ack_policy, AckPolicy::Explicit);
        let p = pull_config(&config(&[], None));
        assert_eq!(
            (p.filter_subject.as_str(), p.filter_subjects.len()),
            ("", 0)
        );
    }
}
