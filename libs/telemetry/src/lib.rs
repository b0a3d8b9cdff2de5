//! Process-wide chores every runyard binary does the same way: the rustls
//! crypto provider, tracing (JSON or pretty), the Prometheus registry and its
//! text exposition, OTLP trace export ([`traces`]) and the shutdown signal.
//! Configuration and secrets are `runyard-config`'s.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};

mod filter;
mod log;
pub mod traces;

pub use prometheus_client;
use prometheus_client::registry::Registry;

/// Installs rustls' `ring` provider for the process. Must run before the first
/// TLS connection (async-nats and reqwest panic otherwise); calling it twice is
/// harmless.
pub fn install_crypto_provider() {
    // An `Err` means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (production).
    Json,
    /// Human-readable (a terminal).
    Pretty,
}

impl LogFormat {
    /// `RUNYARD_LOG_FORMAT` if set (`json` | `pretty`), else pretty on a TTY
    /// and JSON otherwise.
    pub fn from_env() -> Self {
        match std::env::var("RUNYARD_LOG_FORMAT").ok().as_deref() {
            Some("json") => Self::Json,
            Some("pretty") => Self::Pretty,
            _ if std::io::stderr().is_terminal() => Self::Pretty,
            _ => Self::Json,
        }
    }
}

/// Initializes the global tracing subscriber: logs from `RUST_LOG`
/// (default `info`) in [`LogFormat::from_env`] to stderr, and spans as
/// OpenTelemetry spans ([`traces`]), exported when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set. Logging is set up even when the
/// exporter cannot be (the error says why). A second call is a no-op.
pub fn init_tracing() -> Result<(), traces::ExportError> {
    let endpoint = traces::endpoint_from_env();
    let (tracer, failed) = traces::tracer(traces::service_from_env(), endpoint.as_deref());
    init_subscriber(tracer);
    match (failed, endpoint) {
        (Some(error), _) => Err(error),
        (None, Some(endpoint)) => {
            tracing::info!(%endpoint, "exporting traces");
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

/// Whether a per-request or per-event span is worth making at the call
/// site: when spans are exported, or when the call site's module logs at
/// DEBUG (its log lines then name the span's trace). Otherwise such a span
/// would be built and thrown away on every request — most of what tracing
/// costs on a hot path; the trace context is passed on without it
/// (`runyard_bus::follow` on `Span::none()`).
#[macro_export]
macro_rules! spans_wanted {
    () => {
        $crate::traces::enabled() || ::tracing::enabled!(::tracing::Level::DEBUG)
    };
}

/// Installs [`subscriber`] as the global default, with the `log` bridge.
pub(crate) fn init_subscriber(tracer: opentelemetry_sdk::trace::SdkTracer) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = subscriber(tracer, filter, LogFormat::from_env()).try_init();
}

/// The subscriber: the log layer, filtered by `filter`, and the
/// OpenTelemetry layer, which sees only runyard's own spans at INFO or
/// above (never log events: they are not span events here).
///
/// Both filters state the most verbose level they can want, so the
/// process-wide maximum is INFO unless `filter` asks for more: a `debug!`
/// or `trace!` of any crate (and a `log_enabled!(Debug)` through the `log`
/// bridge, which sqlx checks after every query) then stops at one
/// comparison instead of asking every layer's filter.
pub(crate) fn subscriber(
    tracer: opentelemetry_sdk::trace::SdkTracer,
    filter: tracing_subscriber::EnvFilter,
    format: LogFormat,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use tracing_subscriber::filter::{LevelFilter, filter_fn};
    use tracing_subscriber::prelude::*;
    let spans = filter_fn(|meta| {
        meta.is_span()
            && meta.target().starts_with("runyard")
            && *meta.level() <= tracing::Level::INFO
    })
    .with_max_level_hint(LevelFilter::INFO);
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_level(false)
        .with_target(false)
        .with_filter(filter::Fresh(spans));
    let registry = tracing_subscriber::registry().with(otel);
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    match format {
        LogFormat::Json => Box::new(
            registry.with(
                fmt.fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .event_format(log::JsonWithTrace::new())
                    .with_filter(filter::Fresh(filter)),
            ),
        ),
        LogFormat::Pretty => Box::new(registry.with(fmt.with_filter(filter::Fresh(filter)))),
    }
}

/// A shareable Prometheus registry.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
}

impl Metrics {
    /// A registry whose metric names get the `runyard_` prefix.
    pub fn new() -> Self {
        Self {
            registry: Arc::new(Mutex::new(Registry::with_prefix("runyard"))),
        }
    }

    /// Registers metrics; the closure gets the registry.
    pub fn register(&self, f: impl FnOnce(&mut Registry)) {
        let mut reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut reg);
    }

    /// The Prometheus text exposition of everything registered.
    pub fn encode(&self) -> String {
        let reg = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        out
    }
}

/// The content type of [`Metrics::encode`]'s output.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// A token cancelled when `shutdown` resolves, so one signal can stop
/// every task of a service (each selects on the token).
pub fn cancel_on(
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        shutdown.await;
        cancel.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn registered_metrics_are_exposed_with_prefix() {
        let m = Metrics::new();
        let c: Counter = Counter::default();
        m.register(|r| r.register("deliveries", "deliveries seen", c.clone()));
        c.inc();
        let text = m.encode();
        assert!(text.contains("runyard_deliveries_total 1"), "{text}");
    }

    /// The most verbose level the process asks for, with `filter` as
    /// `RUST_LOG`.
    fn max_level(filter: &str) -> Option<tracing::level_filters::LevelFilter> {
        use opentelemetry::trace::TracerProvider as _;
        let tracer = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .build()
            .tracer("test");
        let filter = tracing_subscriber::EnvFilter::new(filter);
        subscriber(tracer, filter, LogFormat::Json).max_level_hint()
    }

    #[test]
    fn debug_and_trace_callsites_are_off_unless_rust_log_asks_for_them() {
        use tracing::level_filters::LevelFilter;
        // The spans need INFO; nothing needs DEBUG or TRACE.
        assert_eq!(max_level("warn"), Some(LevelFilter::INFO));
        assert_eq!(max_level("info"), Some(LevelFilter::INFO));
        assert_eq!(max_level("runyard=debug"), Some(LevelFilter::DEBUG));
        assert_eq!(max_level("trace"), Some(LevelFilter::TRACE));
    }
}
