//! runyard ingest: verifies GitHub/GitLab webhooks and runner usage reports,
//! normalizes them into `runyard.events.v1.Event`s and makes them durable in
//! JetStream before answering 2xx — an accepted delivery is never lost, and a
//! duplicate delivery is never counted twice.

pub mod config;
pub mod limits;
mod metrics;
pub mod oidc;
pub mod quiet;
mod routes;
pub mod shed;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use runyard_bus::{Bus, StreamSettings};
use runyard_events::Namespace;
use runyard_telemetry::Metrics;
use secrecy::SecretString;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
use metrics::IngestMetrics;

/// Shared state of the HTTP handlers.
#[derive(Debug)]
struct Inner {
    bus: Bus,
    github_secret: Option<SecretString>,
    gitlab_token: Option<SecretString>,
    usage_token: Option<SecretString>,
    /// `RUNYARD_USAGE_OIDC`: verifies CI identity tokens; `None` when no
    /// issuer is configured.
    oidc: Option<oidc::Verifier>,
    /// `RUNYARD_USAGE_OIDC_RATE`.
    usage_rate: oidc::rate::ProjectRate,
    /// `RUNYARD_GITHUB_INSTANCES`, lower-cased.
    github_instances: Vec<String>,
    max_body: usize,
    /// `RUNYARD_INGEST_BODY_TIMEOUT`.
    body_timeout: Duration,
    registry: Metrics,
    metrics: IngestMetrics,
    /// Set once the streams are known to exist; cleared when a publish fails
    /// in a way that may mean they are gone, so the keeper re-creates them.
    streams_ready: AtomicBool,
    /// Rate limit of repeated warnings.
    quiet: quiet::Quiet,
    /// The in-flight budget (load shedding).
    load: Arc<shed::Load>,
}

type AppState = Arc<Inner>;

/// A built ingest service: bound to its address, connected (or connecting)
/// to NATS, ready to [`run`](App::run).
#[derive(Debug)]
pub struct App {
    listener: runyard_tls::Listener,
    state: AppState,
    settings: StreamSettings,
}

impl App {
    /// Checks the secrets ([`Config::check_secrets`]), binds the listener
    /// and connects to NATS. A NATS that is down at start is not fatal:
    /// ingest answers 503 and `/readyz` stays red until it is up.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        config.check_secrets()?;
        let ns = Namespace::new(config.bus.namespace.clone())?;
        let mut issuers = oidc::issuer::parse(&config.usage_oidc).map_err(anyhow::Error::msg)?;
        oidc::issuer::restrict(&mut issuers, &config.usage_oidc_projects)
            .map_err(anyhow::Error::msg)?;
        let oidc = if issuers.is_empty() {
            None
        } else {
            tracing::info!(
                issuers = ?issuers.iter().map(|i| i.url.as_str()).collect::<Vec<_>>(),
                shared_token = config.usage_token.is_some(),
                "usage reports accept CI identity tokens"
            );
            Some(oidc::Verifier::new(issuers, config.usage_oidc_refetch)?)
        };
        let tls = runyard_tls::ServerTls::http_acceptor(
            "INGEST",
            config.tls.cert.as_deref(),
            config.tls.key.as_deref(),
            config.tls.client_ca.as_deref(),
        )?;
        let bus = Bus::connect(&config.bus.nats_url, ns, "runyard-ingest", true)
            .await?
            .with_ack_timeout(config.ingest_ack_timeout);
        let listener = TcpListener::bind(config.ingest_listen)
            .await
            .with_context(|| format!("binding {}", config.ingest_listen))?;
        let listener = runyard_tls::Listener::new(listener, tls);
        let registry = Metrics::new();
        let metrics = IngestMetrics::register(&registry);
        let settings = StreamSettings {
            events_max_age: config.events_max_age,
            raw_max_age: config.raw_max_age,
            events_max_bytes: config.events_max_bytes.as_u64(),
            raw_max_bytes: config.raw_max_bytes.as_u64(),
            replicas: config.streams.replicas,
            ..StreamSettings::default()
        };
        let github_instances = config.github_instances();
        let state = Arc::new(Inner {
            bus,
            github_secret: config.github_webhook_secret,
            gitlab_token: config.gitlab_webhook_token,
            usage_token: config.usage_token,
            oidc,
            usage_rate: oidc::rate::ProjectRate::new(config.usage_oidc_rate),
            github_instances,
            max_body: usize::try_from(config.ingest_max_body.as_u64()).unwrap_or(usize::MAX),
            body_timeout: config.ingest_body_timeout,
            registry,
            metrics,
            streams_ready: AtomicBool::new(false),
            quiet: quiet::Quiet::default(),
            load: shed::Load::new(
                config.ingest_max_in_flight,
                usize::try_from(config.ingest_max_in_flight_bytes.as_u64()).unwrap_or(usize::MAX),
                config.ingest_max_unverified_per_peer,
            ),
        });
        // Give a server that is up a moment to answer, so a freshly built app
        // is ready at once; a server that is down is handled by the keeper.
        wait_connected(&state.bus, Duration::from_secs(2)).await;
        if state.bus.is_connected() {
            ensure_streams(&state, &settings).await;
        }
        let addr = listener.local_addr()?;
        tracing::info!(%addr, namespace = %state.bus.namespace(), "ingest listening");
        Ok(Self {
            listener,
            state,
            settings,
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `shutdown` resolves; in-flight deliveries finish (and are
    /// acknowledged by JetStream) before it returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = CancellationToken::new();
        let keeper = tokio::spawn(stream_keeper(
            self.state.clone(),
            self.settings.clone(),
            stop.clone(),
        ));
        let router = routes::router(self.state.clone());
        // A request head, like a body, has RUNYARD_INGEST_BODY_TIMEOUT (an
        // idle connection too); each request knows its peer, since
        // unverified bodies are bounded per client.
        runyard_tls::serve(self.listener, router, self.state.body_timeout, shutdown).await;
        stop.cancel();
        let _ = keeper.await;
        // Everything answered 202 is already acked; flush anything else.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.state.bus.client().flush()).await;
        tracing::info!("ingest stopped");
        Ok(())
    }
}

async fn wait_connected(bus: &Bus, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    while !bus.is_connected() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ensure_streams(state: &Inner, settings: &StreamSettings) {
    match state.bus.ensure_streams(settings).await {
        Ok(()) => {
            if !state.streams_ready.swap(true, Ordering::SeqCst) {
                tracing::info!("event log streams ready");
                check_max_payload(state);
            }
        }
        Err(error) => {
            if let Some(suppressed) = state.quiet.admit("streams") {
                tracing::warn!(%error, suppressed, "could not set up the event log streams");
            }
        }
    }
}

/// Warns when the server's `max_payload` is below `RUNYARD_INGEST_MAX_BODY`:
/// a delivery between the two is accepted, but its raw body is not kept
/// (counted in `runyard_ingest_raw_skipped_total`), and an event that large
/// would be refused with 413. Checked whenever a (re)connected server's
/// streams are set up, since another server may have other limits.
fn check_max_payload(state: &Inner) {
    let max_payload = state.bus.max_payload();
    if max_payload < state.max_body {
        tracing::warn!(
            max_payload,
            max_body = state.max_body,
            "nats max_payload is below RUNYARD_INGEST_MAX_BODY: raw deliveries larger than it are not kept; raise max_payload in nats-server.conf or lower the body limit"
        );
    }
}

/// Keeps the streams in place: (re)creates them whenever NATS is reachable
/// and they are not known to exist — at start with NATS down, and after a
/// server lost its store.
async fn stream_keeper(state: AppState, settings: StreamSettings, stop: CancellationToken) {
    loop {
        if state.bus.is_connected() && !state.streams_ready.load(Ordering::SeqCst) {
            ensure_streams(&state, &settings).await;
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}
