//! runyard allocator: recommends CPU and memory for CI jobs from the history
//! of the same workload — over gRPC (`runyard.allocator.v1.Allocator`) and a
//! gantry-compatible HTTP endpoint. History comes from the projection at
//! start and from `UsageReported` events followed live.

pub mod auth;
pub mod config;
mod grpc;
mod history;
mod http;
pub mod model;
pub mod shed;
pub mod simulate;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::HashSet;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use anyhow::Context as _;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use runyard_bus::{Bus, TraceParent};
use runyard_events::{AllocationIssued, Body, Event, Namespace, Source, timestamp};
use runyard_telemetry::Metrics;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

pub use config::Config;
pub use grpc::to_proto;

/// Generated gRPC types and service of `runyard.allocator.v1`, from
/// `runyard-allocator-api` (which callers depend on instead of this crate).
pub use runyard_allocator_api as proto;

/// Labels of `runyard_allocator_recommendations_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RecLabels {
    api: &'static str,
    basis: &'static str,
}

/// Labels of the `runyard_allocator_calibration_*` gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HistoryLabels {
    history: &'static str,
}

/// Labels of `runyard_allocator_auth_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    api: &'static str,
    reason: &'static str,
}

/// The doors a call can be refused at, as counted.
const DOORS: [&str; 2] = ["grpc", "http"];
/// Why a call was refused, as counted (see [`auth::Refusal::reason`]).
const REFUSALS: [auth::Refusal; 3] = [
    auth::Refusal::Missing,
    auth::Refusal::Unknown,
    auth::Refusal::NoClientCertificate,
];

/// Where a call was refused.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Door {
    Grpc = 0,
    Http = 1,
}

/// The APIs a recommendation is answered on, as counted.
const APIS: [&str; 3] = ["grpc", "batch", "http"];
/// The bases a recommendation is counted under.
const BASES: [&str; 4] = ["history", "defaults", "oom_bump", "exhausted"];

/// Where a recommendation was answered.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Api {
    Grpc = 0,
    Batch = 1,
    Http = 2,
}

#[derive(Debug, Clone)]
struct AllocatorMetrics {
    /// `recommendations{api, basis}`, resolved once: `[api][basis]`.
    recommendations: [[Counter; BASES.len()]; APIS.len()],
    samples_observed: Counter,
    /// Usage reports the job's webhooks contradict (see
    /// [`history::judge`]).
    samples_refused: Counter,
    /// Followed usage and job events over [`runyard_events::limits`]
    /// (see [`history::usage_over_limits`]).
    followed_refused: Counter,
    allocations_dropped: Counter,
    allocations_rate_limited: Counter,
    workloads: Gauge,
    samples: Gauge,
    workloads_evicted: Counter,
    /// `auth_refused{api, reason}`, resolved once: `[door][refusal]`.
    auth_refused: [[Counter; REFUSALS.len()]; DOORS.len()],
    /// gRPC calls answered `RESOURCE_EXHAUSTED` (see [`shed`]).
    calls_shed: Counter,
    /// Per history class: first attempts checked, their kills, and the
    /// kills the model predicted for them.
    calibration: [(Gauge, Gauge, Gauge<f64, AtomicU64>); model::HISTORY_CLASSES.len()],
}

impl AllocatorMetrics {
    fn register(registry: &Metrics) -> Self {
        let family = Family::<RecLabels, Counter>::default();
        let recommendations = APIS
            .map(|api| BASES.map(|basis| family.get_or_create(&RecLabels { api, basis }).clone()));
        let refused = Family::<RefusedLabels, Counter>::default();
        // Every series exists from the start, at zero.
        let auth_refused = DOORS.map(|api| {
            REFUSALS.map(|r| {
                refused
                    .get_or_create(&RefusedLabels {
                        api,
                        reason: r.reason(),
                    })
                    .clone()
            })
        });
        let checked = Family::<HistoryLabels, Gauge>::default();
        let killed = Family::<HistoryLabels, Gauge>::default();
        let predicted = Family::<HistoryLabels, Gauge<f64, AtomicU64>>::default();
        let calibration = model::HISTORY_CLASSES.map(|history| {
            let l = HistoryLabels { history };
            (
                checked.get_or_create(&l).clone(),
                killed.get_or_create(&l).clone(),
                predicted.get_or_create(&l).clone(),
            )
        });
        let m = Self {
            recommendations,
            samples_observed: Counter::default(),
            samples_refused: Counter::default(),
            followed_refused: Counter::default(),
            allocations_dropped: Counter::default(),
            allocations_rate_limited: Counter::default(),
            workloads: Gauge::default(),
            samples: Gauge::default(),
            workloads_evicted: Counter::default(),
            auth_refused,
            calls_shed: Counter::default(),
            calibration,
        };
        registry.register(|r| {
            let r = r.sub_registry_with_prefix("allocator");
            r.register(
                "recommendations",
                "Recommendations served, by API and basis",
                family,
            );
            r.register(
                "samples_observed",
                "Usage samples fed to the model",
                m.samples_observed.clone(),
            );
            r.register(
                "samples_refused",
                "Usage reports not fed to the model: their job's webhooks name another project or fewer attempts, or the attempt was reported already",
                m.samples_refused.clone(),
            );
            r.register(
                "followed_events_refused",
                "Usage reports and job events followed from the log but not used because a field is over the limits ingest holds events to (published around ingest)",
                m.followed_refused.clone(),
            );
            r.register(
                "allocations_dropped",
                "AllocationIssued events dropped because the publisher was behind",
                m.allocations_dropped.clone(),
            );
            r.register(
                "allocations_rate_limited",
                "AllocationIssued events not published because their client was over RUNYARD_ALLOCATOR_EVENTS_PER_SECOND",
                m.allocations_rate_limited.clone(),
            );
            r.register("workloads", "Workloads with history", m.workloads.clone());
            r.register("samples", "Samples held by the model", m.samples.clone());
            r.register(
                "workloads_evicted",
                "Workloads the model forgot (least recently observed) to stay within RUNYARD_ALLOCATOR_MAX_WORKLOADS",
                m.workloads_evicted.clone(),
            );
            r.register(
                "auth_refused",
                "Calls refused for a missing or unknown bearer token or a missing client certificate, by API and reason",
                refused,
            );
            r.register(
                "calibration_first_attempts",
                "First attempts checked against the P(OOM) the model predicted at their limit (one in two), by history class, since start (the loaded history included)",
                checked,
            );
            r.register(
                "calibration_kills",
                "OOM kills among the checked first attempts, by history class",
                killed,
            );
            r.register(
                "calibration_predicted_kills",
                "The kills the model predicted for the checked first attempts (the sum of their P(OOM)), by history class: calibrated where it matches calibration_kills",
                predicted,
            );
            r.register(
                "calls_shed",
                "gRPC calls answered RESOURCE_EXHAUSTED because the in-flight limit was reached",
                m.calls_shed.clone(),
            );
        });
        m
    }

    /// Counts a call refused at `door`.
    fn refused(&self, door: Door, refusal: auth::Refusal) {
        let reason = match refusal {
            auth::Refusal::Missing => 0,
            auth::Refusal::Unknown => 1,
            auth::Refusal::NoClientCertificate => 2,
        };
        self.auth_refused[door as usize][reason].inc();
    }
}

/// Shared state of the gRPC and HTTP edges and the history feeds.
#[derive(Debug)]
pub struct Inner {
    config: Config,
    model: RwLock<model::Model>,
    protected: HashSet<String>,
    bus: Bus,
    registry: Metrics,
    metrics: AllocatorMetrics,
    allocations: Option<mpsc::Sender<Issued>>,
    /// `AllocationIssued` events per client (see [`auth::Client`]).
    events_limit: Option<EventsLimit>,
    loaded: AtomicBool,
    following: AtomicBool,
}

type State = Arc<Inner>;

impl Inner {
    fn model_read(&self) -> RwLockReadGuard<'_, model::Model> {
        self.model.read().unwrap_or_else(|e| e.into_inner())
    }

    fn model_write(&self) -> RwLockWriteGuard<'_, model::Model> {
        self.model.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings the model's gauges up to date (after a load or a batch of
    /// observations).
    fn model_metrics(&self) {
        let (workloads, samples, evicted, checks) = {
            let model = self.model_read();
            let (w, s) = model.stats();
            (w, s, model.evicted(), model.calibration_checks())
        };
        let m = &self.metrics;
        m.workloads
            .set(i64::try_from(workloads).unwrap_or(i64::MAX));
        m.samples.set(i64::try_from(samples).unwrap_or(i64::MAX));
        m.workloads_evicted
            .inc_by(evicted.saturating_sub(m.workloads_evicted.get()));
        for ((attempts, kills, predicted), c) in m.calibration.iter().zip(checks) {
            attempts.set(i64::try_from(c.attempts).unwrap_or(i64::MAX));
            kills.set(i64::try_from(c.kills).unwrap_or(i64::MAX));
            predicted.set(c.predicted);
        }
    }

    fn is_protected(&self, r: &str) -> bool {
        self.protected.contains(r)
    }

    fn require_ready(&self) -> Result<(), tonic::Status> {
        if self.loaded.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(tonic::Status::unavailable("history still loading"))
        }
    }

    /// The recommendation for `w`, and `w`'s key (for its event).
    fn recommend(
        &self,
        w: &model::Workload,
        retry_of: Option<model::JobAttempt>,
    ) -> (model::Recommendation, String) {
        keyed_recommendation(&self.model_read(), w, retry_of)
    }

    fn recommend_many(
        &self,
        ws: &[(model::Workload, Option<model::JobAttempt>)],
    ) -> Vec<(model::Recommendation, String)> {
        let model = self.model_read();
        ws.iter()
            .map(|(w, retry_of)| keyed_recommendation(&model, w, *retry_of))
            .collect()
    }

    /// Counts an answer and queues it for its `AllocationIssued` event —
    /// never on the request's critical path: the publisher task builds the
    /// event, and a full queue drops (and counts) it.
    fn issued(
        &self,
        api: Api,
        (workload, key): (model::Workload, String),
        r: String,
        rec: model::Recommendation,
        Issuing { trace, client }: Issuing,
    ) {
        let basis = if rec.basis.retries_exhausted {
            3
        } else if rec.basis.oom_bump {
            2
        } else if rec.basis.defaults {
            1
        } else {
            0
        };
        self.metrics.recommendations[api as usize][basis].inc();
        let Some(tx) = &self.allocations else { return };
        if let Some(limit) = &self.events_limit
            && !limit.admit(client)
        {
            self.metrics.allocations_rate_limited.inc();
            return;
        }
        let issued = Issued {
            at: time::OffsetDateTime::now_utc(),
            workload,
            key,
            r#ref: r,
            rec,
            trace,
        };
        if tx.try_send(issued).is_err() {
            self.metrics.allocations_dropped.inc();
        }
    }
}

/// What an answer's `AllocationIssued` event needs from its call.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Issuing {
    /// The call's trace context.
    pub(crate) trace: Option<TraceParent>,
    /// Who asked.
    pub(crate) client: auth::Client,
}

/// At most `per_second` `AllocationIssued` events per client, in bursts of
/// `burst`: a client asking in a loop cannot fill the log, and the answers
/// themselves are never held back.
#[derive(Debug)]
struct EventsLimit {
    limiter: governor::DefaultKeyedRateLimiter<u64>,
    /// Admissions since the idle clients' state was last dropped.
    since_sweep: AtomicU64,
}

impl EventsLimit {
    /// Clients' state is swept of idle ones every this many admissions.
    const SWEEP_EVERY: u64 = 4096;

    /// `None` for a rate of 0 (no limit).
    fn new(per_second: u32, burst: u32) -> Option<Self> {
        let rate = std::num::NonZeroU32::new(per_second)?;
        let burst = std::num::NonZeroU32::new(burst.max(1)).unwrap_or(rate);
        Some(Self {
            limiter: governor::RateLimiter::keyed(
                governor::Quota::per_second(rate).allow_burst(burst),
            ),
            since_sweep: AtomicU64::new(0),
        })
    }

    fn admit(&self, client: auth::Client) -> bool {
        if self
            .since_sweep
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(Self::SWEEP_EVERY)
        {
            self.limiter.retain_recent();
        }
        self.limiter.check_key(&client.0).is_ok()
    }
}

/// `model`'s recommendation for `w`, and `w`'s key, made once for both.
fn keyed_recommendation(
    model: &model::Model,
    w: &model::Workload,
    retry_of: Option<model::JobAttempt>,
) -> (model::Recommendation, String) {
    let key = model::full_key(w);
    (model.recommend_keyed(w, &key, retry_of), key)
}

/// An answered recommendation on its way to becoming an `AllocationIssued`.
#[derive(Debug)]
struct Issued {
    at: time::OffsetDateTime,
    workload: model::Workload,
    /// The workload's key, made when it was answered.
    key: String,
    r#ref: String,
    rec: model::Recommendation,
    /// The answering call's trace context, when traces are exported.
    trace: Option<TraceParent>,
}

impl Issued {
    fn into_event(self) -> Event {
        let Self {
            at,
            workload,
            key,
            r#ref,
            rec,
            trace: _,
        } = self;
        Event {
            id: format!("allocation:{:032x}", rand::random::<u128>()),
            occurred_at: Some(timestamp(at)),
            received_at: Some(timestamp(at)),
            source: Some(Source {
                producer: "allocator".into(),
                ..Source::default()
            }),
            body: Some(Body::AllocationIssued(AllocationIssued {
                workload_key: key,
                workload,
                r#ref,
                cpu_request_millicores: rec.cpu_request_millicores,
                cpu_limit_millicores: rec.cpu_limit_millicores,
                memory_request_bytes: rec.memory_request_bytes,
                memory_limit_bytes: rec.memory_limit_bytes,
                build_jobs: rec.build_jobs,
                retry_count: rec.retry_count,
                samples: rec.basis.samples,
                level: rec.basis.level,
                statistic: rec.basis.statistic,
                oom_bump: rec.basis.oom_bump,
                retries_exhausted: rec.basis.retries_exhausted,
            })),
        }
    }
}

/// Most `AllocationIssued` events one publish batch carries.
const ALLOCATION_BATCH: usize = 1024;

/// How long a batch of `AllocationIssued` events fills before it is sent.
/// Under load, one burst every few milliseconds costs the allocator's NATS
/// client and nats-server far less per event than a trickle of small
/// batches (fewer wake-ups, writes and acks); analytics events can be that
/// much later.
const ALLOCATION_LINGER: Duration = Duration::from_millis(5);

/// Publishes queued `AllocationIssued` events in batches of what has
/// queued up within [`ALLOCATION_LINGER`], with one ack per batch
/// (analytics events: a lost one is tolerable, a slower answer is not).
async fn publish_allocations(bus: Bus, mut rx: mpsc::Receiver<Issued>) {
    let traceparent = TraceParent::new_root().header_value();
    let mut batch = Vec::with_capacity(ALLOCATION_BATCH);
    while rx.recv_many(&mut batch, ALLOCATION_BATCH).await > 0 {
        if batch.len() < ALLOCATION_BATCH {
            tokio::time::sleep(ALLOCATION_LINGER).await;
            while batch.len() < ALLOCATION_BATCH {
                let Ok(issued) = rx.try_recv() else { break };
                batch.push(issued);
            }
        }
        // An event carries its call's trace context (the publisher's own
        // for calls that had none).
        let messages = batch.drain(..).filter_map(|issued| {
            let own = issued.trace.map(|t| t.header_value());
            let event = issued.into_event();
            bus.prepare_event(&event, own.as_ref().unwrap_or(&traceparent))
                .ok()
        });
        if let Err(error) = bus.publish_confirming_last(messages).await {
            tracing::debug!(%error, "allocation events not published");
        }
    }
}

/// A built allocator: listeners bound, NATS connecting; history loads when
/// it runs.
#[derive(Debug)]
pub struct App {
    state: State,
    grpc: runyard_tls::Listener,
    http: runyard_tls::Listener,
    /// mTLS with the gantry endpoint open: the HTTP handshake lets clients
    /// without a certificate in, and every other path refuses them.
    http_cert_per_request: bool,
    allocations_rx: Option<mpsc::Receiver<Issued>>,
}

/// Both listeners, over TLS when `RUNYARD_ALLOCATOR_TLS_CERT` and `_KEY`
/// are set (read again whenever they change). With a client CA, gRPC
/// clients need a certificate it signed; so do HTTP clients, except on
/// `GET /v1/allocation` when `RUNYARD_ALLOCATOR_ANONYMOUS_GANTRY` is on
/// (then the HTTP handshake asks for a certificate without requiring one,
/// and the other paths refuse a client that gave none). The last value
/// says whether that per-request check is on.
async fn listeners(
    config: &Config,
) -> anyhow::Result<(runyard_tls::Listener, runyard_tls::Listener, bool)> {
    use runyard_tls::{ClientAuth, Protocols, ServerTls};
    let tls = ServerTls::from_settings(
        "ALLOCATOR",
        config.tls.cert.as_deref(),
        config.tls.key.as_deref(),
        config.tls.client_ca.as_deref(),
    )?;
    let per_request =
        config.allocator_anonymous_gantry && tls.as_ref().is_some_and(|t| t.files().mtls());
    let http_auth = if per_request {
        ClientAuth::Optional
    } else {
        ClientAuth::Required
    };
    let acceptor = |auth, protocols| {
        tls.as_ref()
            .map(|t| t.acceptor(auth, protocols))
            .transpose()
    };
    let grpc = TcpListener::bind(config.allocator_listen)
        .await
        .with_context(|| format!("binding {}", config.allocator_listen))?;
    let http = TcpListener::bind(config.allocator_http_listen)
        .await
        .with_context(|| format!("binding {}", config.allocator_http_listen))?;
    Ok((
        runyard_tls::Listener::new(grpc, acceptor(ClientAuth::Required, Protocols::Grpc)?)
            .nodelay(true),
        runyard_tls::Listener::new(http, acceptor(http_auth, Protocols::Http)?),
        per_request,
    ))
}

impl App {
    /// Checks the tokens ([`Config::check_secrets`]), binds both
    /// listeners and connects to NATS.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        config.check_secrets()?;
        let ns = Namespace::new(config.bus.namespace.clone())?;
        let (grpc, http, http_cert_per_request) = listeners(&config).await?;
        let bus = Bus::connect(&config.bus.nats_url, ns, "runyard-allocator", true).await?;
        let registry = Metrics::new();
        let metrics = AllocatorMetrics::register(&registry);
        let (tx, rx) = if config.allocator_publish_allocations {
            let (tx, rx) = mpsc::channel(16_384);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let tokens = &config.allocator_tokens;
        if tokens.is_empty() {
            tracing::warn!(
                "no {} or {}: the allocator answers anyone (anonymous)",
                auth::TOKENS_VAR,
                auth::TOKENS_FILE_VAR
            );
        } else {
            tracing::info!(
                tokens = tokens.len(),
                anonymous_gantry = config.allocator_anonymous_gantry,
                "calls need a bearer token (health, readiness and metrics do not)"
            );
        }
        tracing::info!(
            grpc = %grpc.local_addr()?,
            http = %http.local_addr()?,
            namespace = %bus.namespace(),
            "allocator listening"
        );
        let protected = config.protected_refs().into_iter().collect();
        let events_limit = EventsLimit::new(
            config.allocator_events_per_second,
            config.allocator_events_burst,
        );
        Ok(Self {
            state: Arc::new(Inner {
                model: RwLock::new(model::Model::new(config.model.clone())),
                config,
                protected,
                bus,
                registry,
                metrics,
                allocations: tx,
                events_limit,
                loaded: AtomicBool::new(false),
                following: AtomicBool::new(false),
            }),
            grpc,
            http,
            http_cert_per_request,
            allocations_rx: rx,
        })
    }

    /// The gRPC address.
    pub fn grpc_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.grpc.local_addr().expect("bound listener")
    }

    /// The HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.http.local_addr().expect("bound listener")
    }

    /// Loads the history, follows usage events and serves until `shutdown`.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = runyard_telemetry::cancel_on(shutdown);
        let publisher = self
            .allocations_rx
            .map(|rx| tokio::spawn(publish_allocations(self.state.bus.clone(), rx)));
        let feed = {
            let state = self.state.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let (skip, since) = loop {
                    match history::load(&state).await {
                        Ok(v) => break v,
                        Err(error) => {
                            tracing::warn!(%error, "cannot load history; retrying");
                            tokio::select! {
                                () = stop.cancelled() => return,
                                () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            }
                        }
                    }
                };
                state.loaded.store(true, Ordering::SeqCst);
                history::follow(state, skip, since, stop).await;
            })
        };

        let (health_reporter, health_service) = tonic_health::server::health_reporter();
        health_reporter
            .set_serving::<proto::allocator_server::AllocatorServer<grpc::Service>>()
            .await;
        // Reflection in both versions: v1alpha for the clients that still
        // speak only it (grpcio-reflection, Postman, older grpcurl/Evans).
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(
                    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
                )
        };
        let reflection_v1 = reflection().build_v1().context("building reflection v1")?;
        let reflection_v1alpha = reflection()
            .build_v1alpha()
            .context("building reflection v1alpha")?;
        let service = grpc::Service {
            state: self.state.clone(),
        };
        // Authenticate first (a refused call takes no slot), then shed,
        // then decode and answer.
        let allocator = tonic::service::interceptor::InterceptedService::new(
            shed::InFlight::new(
                proto::allocator_server::AllocatorServer::new(service),
                self.state.config.allocator_max_in_flight,
                self.state.metrics.calls_shed.clone(),
            ),
            grpc::Authenticate {
                state: self.state.clone(),
            },
        );
        let grpc_stop = stop.clone();
        let grpc = tokio::spawn(
            tonic::transport::Server::builder()
                // A connection that stops answering pings is closed.
                .http2_keepalive_interval(Some(runyard_tls::HEAD_TIMEOUT))
                .http2_keepalive_timeout(Some(runyard_tls::HEAD_TIMEOUT))
                .add_service(health_service)
                .add_service(reflection_v1)
                .add_service(reflection_v1alpha)
                .add_service(allocator)
                .serve_with_incoming_shutdown(self.grpc.incoming(), async move {
                    grpc_stop.cancelled().await
                }),
        );
        let http_stop = stop.clone();
        let router = http::router(self.state.clone(), self.http_cert_per_request);
        let http = tokio::spawn(runyard_tls::serve(
            self.http,
            router,
            runyard_tls::HEAD_TIMEOUT,
            async move { http_stop.cancelled().await },
        ));
        stop.cancelled().await;
        let _ = grpc.await;
        let _ = http.await;
        let _ = feed.await;
        // Dropping the state's sender ends the publisher after it drains.
        drop(self.state);
        if let Some(p) = publisher {
            let _ = tokio::time::timeout(Duration::from_secs(5), p).await;
        }
        tracing::info!("allocator stopped");
        Ok(())
    }
}
