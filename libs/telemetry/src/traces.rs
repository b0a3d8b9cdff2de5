//! Traces: `tracing` spans recorded as OpenTelemetry spans through
//! `tracing-opentelemetry`, exported over OTLP (HTTP/protobuf) when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
//!
//! The OpenTelemetry layer is always installed, exporting or not, so every
//! span the services open has W3C trace and span ids: the services carry
//! them across NATS in `traceparent` headers, and JSON log lines written
//! inside a span name them (`trace_id`, `span_id`), so the logs of one
//! delivery can be found from its trace id in every service. Only spans
//! (never log events) at INFO or above, from runyard's own code, reach the
//! OpenTelemetry layer; `RUST_LOG` filters the logs, not the traces.
//!
//! The exporter batches spans on its own thread and follows the standard
//! `OTEL_EXPORTER_OTLP_*`, `OTEL_BSP_*` and `OTEL_SERVICE_NAME` variables.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

pub use opentelemetry::trace::Status;
pub use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The standard variable that turns export on: the collector's base URL
/// (`/v1/traces` is appended).
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The standard variable naming the service in exported spans; the
/// executable's name when unset.
pub const SERVICE_NAME_VAR: &str = "OTEL_SERVICE_NAME";

static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Why trace export could not start.
#[derive(Debug, thiserror::Error)]
#[error("OTLP trace export to {endpoint}: {message}")]
pub struct ExportError {
    endpoint: String,
    message: String,
}

/// The endpoint `OTEL_EXPORTER_OTLP_ENDPOINT` names, if set and not empty.
pub(crate) fn endpoint_from_env() -> Option<String> {
    std::env::var(ENDPOINT_VAR)
        .ok()
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
}

/// The service name spans are exported as: `OTEL_SERVICE_NAME`, else the
/// executable's file name (`runyard-ingest`, …).
pub(crate) fn service_from_env() -> String {
    std::env::var(SERVICE_NAME_VAR)
        .ok()
        .filter(|s| !s.trim().is_empty())
        .or_else(|| {
            std::env::current_exe()
                .ok()?
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "runyard".to_owned())
}

/// The process's tracer: made once, exporting to `endpoint` (a collector's
/// base URL) when given; when the exporter cannot be made, a tracer that
/// exports nothing, and the reason. Later calls return the first one.
pub(crate) fn tracer(service: String, endpoint: Option<&str>) -> (SdkTracer, Option<ExportError>) {
    if let Some(p) = PROVIDER.get() {
        return (p.tracer("runyard"), None);
    }
    let mut builder = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(service).build());
    let mut failed = None;
    if let Some(endpoint) = endpoint {
        // The exporter's HTTP client needs the TLS provider even for `http://`.
        crate::install_crypto_provider();
        let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
        match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(&url)
            .build()
        {
            Ok(exporter) => {
                builder = builder.with_batch_exporter(exporter);
                EXPORTING.store(true, Ordering::Relaxed);
            }
            Err(e) => {
                failed = Some(ExportError {
                    endpoint: url,
                    message: e.to_string(),
                });
            }
        }
    }
    let provider = PROVIDER.get_or_init(|| builder.build());
    (provider.tracer("runyard"), failed)
}

/// Installs the process's logging and tracing (as
/// [`crate::init_tracing`] does) exporting spans to the OTLP/HTTP collector
/// at `endpoint` as `service`, whatever the environment says: for tests.
/// Once per process: a second call changes nothing.
pub fn install(service: &str, endpoint: &str) -> Result<(), ExportError> {
    let (tracer, failed) = tracer(service.to_owned(), Some(endpoint));
    crate::init_subscriber(tracer);
    failed.map_or(Ok(()), Err)
}

/// Runs a service (`run`) and flushes the spans it recorded when it ends.
pub async fn exporting<T>(run: impl std::future::Future<Output = T>) -> T {
    let out = run.await;
    let _ = tokio::task::spawn_blocking(shutdown).await;
    out
}

/// Whether spans are being exported.
pub fn enabled() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Sends every span recorded so far (tests; shutdown does it too).
pub fn flush() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.force_flush();
    }
}

/// Flushes and stops the exporter; call once as the process ends.
pub fn shutdown() {
    if enabled()
        && let Some(p) = PROVIDER.get()
    {
        let _ = p.shutdown();
    }
}

/// Records on `span` that it answered HTTP `status`: the code, and the
/// span's status the way OpenTelemetry's HTTP conventions have it for a
/// server (a 5xx is an error described by `error`, a 2xx is OK, anything
/// else is left unset — a client's mistake is not the server's error).
pub fn record_http(span: &tracing::Span, status: u16, error: impl FnOnce() -> String) {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    span.set_attribute("http.response.status_code", i64::from(status));
    span.set_status(match status {
        500..=599 => Status::error(error()),
        200..=299 => Status::Ok,
        _ => Status::Unset,
    });
}
