//! runyard job-tracker: projects the event log into Postgres exactly once —
//! idempotent under redelivery, safe with several replicas on one consumer,
//! and rebuildable from the log.

pub mod config;
mod metrics;
mod tracker;

pub use runyard_projection::{apply, projection, rebuild};

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use axum::extract::State as AxumState;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use runyard_bus::Bus;
use runyard_bus::consumer::{Consumer, ConsumerStatus};
use runyard_events::Namespace;
use runyard_telemetry::Metrics;
use serde_json::json;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use config::Config;
use metrics::TrackerMetrics;
pub use tracker::CONSUMER;

/// Shared state of the consumer and the HTTP endpoints.
#[derive(Debug)]
pub struct Inner {
    bus: Bus,
    pool: PgPool,
    registry: Metrics,
    metrics: TrackerMetrics,
    db_ok: AtomicBool,
    consumer: ConsumerStatus,
}

type State = Arc<Inner>;

/// A built job-tracker: migrated, connected, listening.
#[derive(Debug)]
pub struct App {
    state: State,
    listener: runyard_tls::Listener,
    consumer: Consumer,
}

impl App {
    /// Binds the HTTP listener, runs the migrations and connects to Postgres
    /// and NATS. A Postgres that is down (or still starting) is waited for
    /// with back-off rather than fatal; meanwhile the listener answers
    /// `/healthz` 200 and `/readyz` 503, so an orchestrator sees a live,
    /// not-ready service. NATS is waited for in the background as always.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        // No secret of its own: with RUNYARD_INSECURE_DEV=1, only the WARN.
        runyard_config::secrets::enforce([], vec![], config.insecure_dev)?;
        let ns = Namespace::new(config.bus.namespace.clone())?;
        let tls = tls(&config)?;
        let listener = std::net::TcpListener::bind(config.tracker_http_listen)
            .with_context(|| format!("binding {}", config.tracker_http_listen))?;
        listener.set_nonblocking(true)?;
        let starting = Starting::serve(
            listener.try_clone().context("cloning the listener")?,
            tls.clone(),
        )?;
        let listener = runyard_tls::Listener::new(TcpListener::from_std(listener)?, tls);
        runyard_store::migrate_when_reachable(&config.database.url)
            .await
            .context("migrating the projection database")?;
        let pool = rebuild::pool(&config.database.url, config.database_pool_size).await?;
        let bus = Bus::connect(&config.bus.nats_url, ns, "runyard-job-tracker", true).await?;
        starting.stop().await;
        let registry = Metrics::new();
        let metrics = metrics::register(&registry);
        // Binds once running (creating the stream if ingest has not yet).
        let consumer = Consumer::new(
            &bus,
            tracker::consumer_config(&config, bus.namespace()),
            Some(metrics.clone()),
        );
        tracing::info!(addr = %listener.local_addr()?, namespace = %bus.namespace(), "job-tracker listening");
        Ok(Self {
            state: Arc::new(Inner {
                bus,
                pool,
                registry,
                metrics,
                db_ok: AtomicBool::new(true),
                consumer: consumer.status(),
            }),
            listener,
            consumer,
        })
    }

    /// The HTTP listener's address.
    pub fn local_addr(&self) -> SocketAddr {
        #[allow(clippy::expect_used)]
        self.listener.local_addr().expect("bound listener")
    }

    /// Consumes until `shutdown` resolves; the batch in hand is applied and
    /// acked before it returns.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let stop = runyard_telemetry::cancel_on(shutdown);
        let projector = tracker::Projector {
            state: self.state.clone(),
        };
        let consumer = tokio::spawn(self.consumer.run(projector, stop.clone()));
        let watcher = tokio::spawn(watch(self.state.clone(), stop.clone()));
        let router = axum::Router::new()
            .route(
                "/healthz",
                get(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics_text))
            .with_state(self.state.clone());
        let http_stop = stop.clone();
        let http = tokio::spawn(runyard_tls::serve(
            self.listener,
            router,
            runyard_tls::HEAD_TIMEOUT,
            async move { http_stop.cancelled().await },
        ));
        let _ = consumer.await;
        stop.cancel();
        let _ = watcher.await;
        let _ = http.await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.state.bus.client().flush()).await;
        self.state.pool.close().await;
        tracing::info!("job-tracker stopped");
        Ok(())
    }
}

/// The HTTP listener's TLS, when `RUNYARD_TRACKER_TLS_CERT` and `_KEY` are
/// set (a client CA: mTLS); both the starting and the real router use it.
fn tls(config: &Config) -> anyhow::Result<Option<runyard_tls::Acceptor>> {
    Ok(runyard_tls::ServerTls::http_acceptor(
        "TRACKER",
        config.tls.cert.as_deref(),
        config.tls.key.as_deref(),
        config.tls.client_ca.as_deref(),
    )?)
}

/// The HTTP answers of a tracker that is still starting: alive, not ready.
/// Serves a second handle on the real listener's socket, so the port
/// answers from the moment it is bound; once stopped, connections wait in
/// the socket's backlog for the real router.
struct Starting {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Starting {
    fn serve(
        second: std::net::TcpListener,
        tls: Option<runyard_tls::Acceptor>,
    ) -> anyhow::Result<Self> {
        let second = runyard_tls::Listener::new(TcpListener::from_std(second)?, tls);
        let router = axum::Router::new()
            .route(
                "/healthz",
                get(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .route(
                "/readyz",
                get(|| async {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(json!({"starting": true})),
                    )
                }),
            );
        let stop = CancellationToken::new();
        let until = stop.clone();
        let task = tokio::spawn(runyard_tls::serve(
            second,
            router,
            runyard_tls::HEAD_TIMEOUT,
            async move { until.cancelled().await },
        ));
        Ok(Self { stop, task })
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Keeps readiness current: pings Postgres every couple of seconds (the
/// consumer keeps the lag gauge).
async fn watch(state: State, stop: CancellationToken) {
    loop {
        let ping = tokio::time::timeout(
            Duration::from_secs(2),
            sqlx::query("SELECT 1").execute(&state.pool),
        )
        .await;
        state
            .db_ok
            .store(matches!(ping, Ok(Ok(_))), Ordering::SeqCst);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

async fn readyz(AxumState(state): AxumState<State>) -> Response {
    let nats = state.bus.is_connected();
    let db = state.db_ok.load(Ordering::SeqCst);
    let consumer = state.consumer.is_ready();
    // Stalled: the database answers (`SELECT 1` may well pass) but refuses
    // the batch in hand — read-only, schema or permission missing.
    let stalled = state.consumer.is_stalled();
    let status = if nats && db && consumer && !stalled {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({
            "nats_connected": nats,
            "database_ok": db,
            "consumer_ready": consumer,
            "stalled": stalled,
        })),
    )
        .into_response()
}

async fn metrics_text(AxumState(state): AxumState<State>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            runyard_telemetry::METRICS_CONTENT_TYPE,
        )],
        state.registry.encode(),
    )
        .into_response()
}
