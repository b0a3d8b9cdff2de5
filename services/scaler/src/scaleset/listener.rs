//! One scale set's message session and long poll.
//!
//! - Only the replica holding the pool's lease listens; the others stand by.
//! - The session's id, its holder and the last message whose events are in
//!   the log are written to the log ([`convert::progress`] on
//!   `<ns>.v1.scaleset.<pool>`) before the session is used and after every
//!   message. A replica taking over reads that, deletes the dead holder's
//!   session by its id, then makes its own, so a session conflict (409) is
//!   never a crash loop; a conflict left anyway (a holder whose progress
//!   never reached the log) is waited out with back-off.
//! - A message is acknowledged only after its job events and the progress
//!   naming it are in the log; a restart polls from that message on, so it
//!   neither replays nor skips.
//! - `JobAvailable` jobs are acquired before anything else (GHES needs it);
//!   a failed acquire leaves the message unacknowledged, to come again.
//! - A `401` on the queue or the acquire refreshes the session's token once
//!   and tries again; a session the service no longer knows is made again.
//! - A poll with no answer for longer than `scale_set_silence` (the
//!   service answers `202` after about 50 s) makes the session again
//!   (metric `runyard_scaler_scale_set_sessions_recreated_total{reason="silent"}`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use runyard_bus::{Bus, TraceParent};
use runyard_events::{Body, Event, Namespace, ScaleSetProgress};
use runyard_forge::api::ApiError;
use runyard_forge::api::scaleset::{
    Exception, JobMessageKind, ScaleSetMessage, Session, Statistics, exception, is_token_expired,
};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{ScaleSet, convert};
use crate::metrics::{PoolLabel, ScalerMetrics, SessionLabel, StatisticLabel};

/// Which pools this replica holds the lease of, and until when (written by
/// the engine at every renewal).
pub type Owned = Arc<RwLock<HashMap<String, Instant>>>;

/// The longest wait between failed attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How long the deletion of a session may take when leaving.
const GOODBYE: Duration = Duration::from_secs(5);

/// A listener's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The longest a poll may go unanswered.
    pub silence: Duration,
    /// First wait after a failure (×1.5 each time, at most 30 s).
    pub backoff: Duration,
    /// `X-ScaleSetMaxCapacity`: the pool's `max_runners`.
    pub max_capacity: u32,
    /// The forge host.
    pub instance: String,
    /// This replica's name (the session's owner).
    pub replica: String,
}

/// One pool's listener.
#[derive(Debug)]
pub struct Listener {
    set: Arc<ScaleSet>,
    twins: super::resolve::Resolver,
    bus: Bus,
    metrics: ScalerMetrics,
    owned: Owned,
    settings: Settings,
}

/// Why a session ended.
#[derive(Debug)]
enum Ended {
    /// The lease moved on, or the scaler stops: not a failure.
    Left,
    /// Make a new session after the back-off.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Ended {
    fn from(e: anyhow::Error) -> Self {
        Self::Failed(e)
    }
}

impl From<ApiError> for Ended {
    fn from(e: ApiError) -> Self {
        Self::Failed(e.into())
    }
}

impl Listener {
    /// A listener for `set`.
    pub fn new(
        set: Arc<ScaleSet>,
        twins: super::resolve::Resolver,
        bus: Bus,
        metrics: ScalerMetrics,
        owned: Owned,
        settings: Settings,
    ) -> Self {
        Self {
            set,
            twins,
            bus,
            metrics,
            owned,
            settings,
        }
    }

    fn owns(&self) -> bool {
        self.owned
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&self.set.pool)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Resolves once this replica no longer holds the pool's lease (read
    /// every 250 ms): a long poll does not outlive the lease by more.
    async fn lease_lost(&self) {
        while self.owns() {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn recreated(&self, reason: &'static str) {
        self.metrics
            .scale_set_sessions_recreated
            .get_or_create(&SessionLabel {
                pool: self.set.pool.clone(),
                reason,
            })
            .inc();
        self.set.update_view(|v| v.sessions_recreated += 1);
    }

    /// Runs until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut wait = self.settings.backoff;
        loop {
            if stop.is_cancelled() {
                return;
            }
            if !self.owns() {
                self.set.update_view(|v| {
                    v.state = "standby";
                    v.session_id = None;
                });
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                }
            }
            match self.hold(&stop).await {
                Ended::Left => wait = self.settings.backoff,
                Ended::Failed(error) => {
                    tracing::warn!(pool = %self.set.pool, scale_set = %self.set.name, error = format!("{error:#}"), wait_s = wait.as_secs_f64(), "scale-set listener: trying again");
                    self.set.update_view(|v| {
                        v.state = "error";
                        v.session_id = None;
                        v.error = Some(format!("{error:#}"));
                    });
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                    wait = wait.mul_f64(1.5).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// The latest progress of this pool in the log.
    async fn last_progress(&self) -> anyhow::Result<Option<ScaleSetProgress>> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        use prost::Message as _;
        let ns: &Namespace = self.bus.namespace();
        let stream = self
            .bus
            .jetstream()
            .get_stream(ns.events_stream())
            .await
            .context("opening the event stream")?;
        let raw = match stream
            .get_last_raw_message_by_subject(&ns.scale_set_subject(&self.set.pool))
            .await
        {
            Ok(raw) => raw,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(e).context("reading the scale set's progress from the log"),
        };
        let event = Event::decode(raw.payload.as_ref()).context("decoding a progress event")?;
        Ok(match event.body {
            Some(Body::ScaleSetProgress(p)) => Some(p),
            _ => None,
        })
    }

    /// Publishes events and waits until the log has every one.
    async fn log(&self, events: &[Event]) -> anyhow::Result<()> {
        let trace = TraceParent::new_root();
        futures::future::try_join_all(events.iter().map(|e| self.bus.publish_event(e, &trace)))
            .await
            .context("putting the scale set's events in the log")?;
        Ok(())
    }

    fn ctx(&self, scale_set_id: i64) -> convert::Context<'_> {
        convert::Context {
            pool: &self.set.pool,
            instance: &self.settings.instance,
            scale_set_id,
            received: OffsetDateTime::now_utc(),
        }
    }

    /// One session: made, polled while the lease is held, deleted when
    /// leaving.
    async fn hold(&self, stop: &CancellationToken) -> Ended {
        let client = &self.set.client;
        let id = match self.set.id() {
            Some(id) => id,
            None => match self.set.ensure().await {
                Ok(id) => id,
                Err(e) => return Ended::Failed(e.into()),
            },
        };
        let recovered = match self.last_progress().await {
            Ok(p) => p.filter(|p| p.scale_set_id == id),
            Err(e) => return Ended::Failed(e),
        };
        let mut last = recovered.as_ref().map_or(0, |p| p.last_message_id);
        if let Some(p) = recovered.as_ref().filter(|p| !p.session_id.is_empty()) {
            // Left by a holder that died (another replica, or this one
            // before a restart): remove it so ours can be made.
            match client.delete_session(id, &p.session_id).await {
                Ok(()) => {
                    if p.owner != self.settings.replica {
                        tracing::info!(pool = %self.set.pool, owner = %p.owner, session = %p.session_id, "removed the session of the scale set's previous holder");
                        self.recreated("taken_over");
                    }
                }
                Err(e) => return Ended::Failed(e.into()),
            }
        }
        let session = match client.create_session(id, &self.settings.replica).await {
            Ok(s) => s,
            Err(e) => {
                match exception(&e) {
                    Some(Exception::ScaleSetNotFound) => {
                        // Deleted on the service (inactive scale sets are
                        // collected): make it again, from message 0.
                        self.set.forget();
                        self.recreated("scale_set_gone");
                    }
                    Some(Exception::SessionConflict) => {
                        tracing::warn!(pool = %self.set.pool, "the scale set has a session this replica cannot name (a holder that died before logging it); waiting for the service to expire it");
                    }
                    _ => {}
                }
                return Ended::Failed(
                    anyhow::Error::new(e).context("making the scale set's message session"),
                );
            }
        };
        let session_id = session.session_id.clone();
        if let Err(e) = self
            .log(&[convert::progress(
                &self.ctx(id),
                &session_id,
                &self.settings.replica,
                last,
                &session.statistics,
            )])
            .await
        {
            let _ = tokio::time::timeout(GOODBYE, client.delete_session(id, &session_id)).await;
            return Ended::Failed(e);
        }
        tracing::info!(pool = %self.set.pool, scale_set = %self.set.name, session = %session_id, last_message_id = last, "scale-set session held");
        self.seen(&session.statistics, None);
        self.set.update_view(|v| {
            v.state = "active";
            v.session_id = Some(session_id.clone());
            v.last_message_id = last;
            v.error = None;
        });
        let mut session = session;
        let ended = self.poll(id, &mut session, &mut last, stop).await;
        // Leaving: the session goes, and once it is gone the log says so.
        // A session that could not be deleted (the service is down) stays
        // named in the log, for whoever holds the pool next to delete.
        let deleted = matches!(
            tokio::time::timeout(GOODBYE, client.delete_session(id, &session.session_id)).await,
            Ok(Ok(()))
        );
        let left_session = if deleted {
            ""
        } else {
            session.session_id.as_str()
        };
        if !self.owns() {
            // A successor may hold the pool already: its progress stays the
            // last word (it deletes this session by id if need be).
            return ended;
        }
        let _ = tokio::time::timeout(
            GOODBYE,
            self.log(&[convert::progress(
                &self.ctx(id),
                left_session,
                &self.settings.replica,
                last,
                &session.statistics,
            )]),
        )
        .await;
        ended
    }

    /// Records an answer of the service.
    fn seen(&self, stats: &Statistics, message_id: Option<i64>) {
        let pool = &self.set.pool;
        let now = OffsetDateTime::now_utc();
        self.metrics
            .scale_set_last_message
            .get_or_create(&PoolLabel { pool: pool.clone() })
            .set(now.unix_timestamp());
        for (kind, v) in [
            ("available", stats.total_available_jobs),
            ("acquired", stats.total_acquired_jobs),
            ("assigned", stats.total_assigned_jobs),
            ("running", stats.total_running_jobs),
            ("registered", stats.total_registered_runners),
            ("busy", stats.total_busy_runners),
            ("idle", stats.total_idle_runners),
        ] {
            self.metrics
                .scale_set_statistics
                .get_or_create(&StatisticLabel {
                    pool: pool.clone(),
                    kind,
                })
                .set(v);
        }
        let at = now
            .format(&time::format_description::well_known::Rfc3339)
            .ok();
        self.set.update_view(|v| {
            v.last_message_at = at;
            v.statistics = Some(*stats);
            if let Some(id) = message_id {
                v.last_message_id = id;
            }
        });
    }

    /// Gets a new token for the session; a session the service no longer
    /// knows ends it.
    async fn refresh(&self, id: i64, session: &mut Session) -> Result<(), Ended> {
        match self
            .set
            .client
            .refresh_session(id, &session.session_id)
            .await
        {
            Ok(fresh) => {
                *session = fresh;
                Ok(())
            }
            Err(e) => {
                if exception(&e).is_some() || e.is_not_found() {
                    self.recreated("expired");
                }
                Err(Ended::Failed(
                    anyhow::Error::new(e).context("refreshing the session's token"),
                ))
            }
        }
    }

    async fn poll(
        &self,
        id: i64,
        session: &mut Session,
        last: &mut i64,
        stop: &CancellationToken,
    ) -> Ended {
        let client = &self.set.client;
        let mut refreshed = false;
        loop {
            if stop.is_cancelled() || !self.owns() {
                return Ended::Left;
            }
            let got = tokio::select! {
                () = stop.cancelled() => return Ended::Left,
                () = self.lease_lost() => return Ended::Left,
                got = tokio::time::timeout(
                    self.settings.silence,
                    client.get_message(session, *last, self.settings.max_capacity),
                ) => got,
            };
            let message = match got {
                Err(_) => {
                    self.recreated("silent");
                    return Ended::Failed(anyhow::anyhow!(
                        "the message long poll went unanswered for {}s; making a new session",
                        self.settings.silence.as_secs_f64()
                    ));
                }
                Ok(Err(e)) if is_token_expired(&e) && !refreshed => {
                    if let Err(ended) = self.refresh(id, session).await {
                        return ended;
                    }
                    refreshed = true;
                    continue;
                }
                Ok(Err(e)) => {
                    if matches!(
                        exception(&e),
                        Some(Exception::SessionNotFound | Exception::SessionExpired)
                    ) {
                        self.recreated("expired");
                    }
                    return Ended::Failed(anyhow::Error::new(e).context("polling for messages"));
                }
                Ok(Ok(None)) => {
                    refreshed = false;
                    let stats = session.statistics;
                    self.seen(&stats, None);
                    continue;
                }
                Ok(Ok(Some(m))) => m,
            };
            refreshed = false;
            if let Err(ended) = self.handle(id, session, &message).await {
                return ended;
            }
            *last = message.message_id;
        }
    }

    /// Runs `call` with the session's token, refreshing it once on a `401`.
    async fn with_token<T, F, Fut>(
        &self,
        id: i64,
        session: &mut Session,
        mut call: F,
    ) -> Result<T, Ended>
    where
        F: FnMut(Session) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        match call(session.clone()).await {
            Err(e) if is_token_expired(&e) => {
                self.refresh(id, session).await?;
                Ok(call(session.clone()).await?)
            }
            other => Ok(other?),
        }
    }

    /// One message: acquire, log, acknowledge.
    async fn handle(
        &self,
        id: i64,
        session: &mut Session,
        message: &ScaleSetMessage,
    ) -> Result<(), Ended> {
        let client = &self.set.client;
        let available: Vec<i64> = message
            .jobs
            .iter()
            .filter(|j| matches!(j.kind, JobMessageKind::Available) && j.runner_request_id != 0)
            .map(|j| j.runner_request_id)
            .collect();
        if !available.is_empty() {
            let acquired = self
                .with_token(id, session, |s| {
                    let ids = available.clone();
                    async move { client.acquire_jobs(id, &s, &ids).await }
                })
                .await?;
            if acquired.len() < available.len() {
                tracing::info!(pool = %self.set.pool, offered = available.len(), acquired = acquired.len(), "some available jobs went to another scale set");
            }
        }
        let twins = self.twins.resolve(message).await;
        let ctx = self.ctx(id);
        self.log(&convert::events(&ctx, message, &twins)).await?;
        self.twins.done(message);
        // Only once the jobs are in: the progress says they are. A replica
        // that lost the lease meanwhile leaves the progress (and so the
        // session id in the log) to its successor.
        if !self.owns() {
            return Err(Ended::Left);
        }
        self.log(&[convert::progress(
            &ctx,
            &session.session_id,
            &self.settings.replica,
            message.message_id,
            &message.statistics,
        )])
        .await?;
        let message_id = message.message_id;
        if let Err(Ended::Failed(error)) = self
            .with_token(id, session, |s| async move {
                client.delete_message(&s, message_id).await
            })
            .await
        {
            // Its effects are in the log: a redelivery makes the same
            // events, which the log drops.
            tracing::warn!(pool = %self.set.pool, message_id, error = format!("{error:#}"), "acknowledging a scale-set message failed");
        }
        self.metrics
            .scale_set_messages
            .get_or_create(&PoolLabel {
                pool: self.set.pool.clone(),
            })
            .inc();
        session.statistics = message.statistics;
        self.seen(&message.statistics, Some(message_id));
        Ok(())
    }
}
