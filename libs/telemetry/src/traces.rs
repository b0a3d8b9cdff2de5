//! Trace export over OTLP (HTTP/protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT`
//! is set. The services carry W3C trace context in NATS headers; each hop
//! that handles a delivery or an event records one span here with the ids
//! that context names, so one delivery's path through the services is one
//! trace in whatever backend receives them. Unset, nothing is recorded and
//! [`Span::start`] costs one atomic load.
//!
//! The exporter batches spans on its own thread and follows the standard
//! `OTEL_EXPORTER_OTLP_*` and `OTEL_BSP_*` variables (headers, timeout,
//! batch size, delay).

use std::sync::OnceLock;
use std::time::SystemTime;

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
pub use opentelemetry::trace::{SpanKind, Status};
pub use opentelemetry::{KeyValue, Value};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// The standard variable that turns export on: the collector's base URL
/// (`/v1/traces` is appended).
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

static EXPORTER: OnceLock<Exporter> = OnceLock::new();

/// Why trace export could not start.
#[derive(Debug, thiserror::Error)]
#[error("OTLP trace export to {endpoint}: {message}")]
pub struct ExportError {
    endpoint: String,
    message: String,
}

/// Starts exporting to `$OTEL_EXPORTER_OTLP_ENDPOINT` as `service` if the
/// variable is set and not empty; does nothing when it is not.
pub fn install_from_env(service: &'static str) -> Result<(), ExportError> {
    match std::env::var(ENDPOINT_VAR) {
        Ok(endpoint) if !endpoint.trim().is_empty() => install(service, endpoint.trim()),
        _ => Ok(()),
    }
}

/// Starts exporting spans to the OTLP/HTTP collector at `endpoint` (its base
/// URL) as `service`. Once per process: a second call changes nothing.
pub fn install(service: &'static str, endpoint: &str) -> Result<(), ExportError> {
    // The exporter's HTTP client needs the TLS provider even for `http://`.
    crate::install_crypto_provider();
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let err = |message: String| ExportError {
        endpoint: url.clone(),
        message,
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(&url)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(Resource::builder().with_service_name(service).build())
        .build();
    let tracer = provider.tracer("runyard");
    let _ = EXPORTER.set(Exporter { provider, tracer });
    tracing::info!(endpoint = %url, service, "exporting traces");
    Ok(())
}

/// Runs a service (`run`) with trace export set up from the environment
/// ([`install_from_env`]), and flushes what it recorded when it ends.
pub async fn exporting<T>(
    service: &'static str,
    run: impl std::future::Future<Output = T>,
) -> Result<T, ExportError> {
    install_from_env(service)?;
    let out = run.await;
    let _ = tokio::task::spawn_blocking(shutdown).await;
    Ok(out)
}

/// Whether spans are being exported.
pub fn enabled() -> bool {
    EXPORTER.get().is_some()
}

/// Sends every span recorded so far (tests; shutdown does it too).
pub fn flush() {
    if let Some(e) = EXPORTER.get() {
        let _ = e.provider.force_flush();
    }
}

/// Flushes and stops the exporter; call once as the process ends.
pub fn shutdown() {
    if let Some(e) = EXPORTER.get() {
        let _ = e.provider.shutdown();
    }
}

/// One hop of a trace being timed: its ids come from the `traceparent` the
/// hop carries on (`span_id`) and the one it was handed (`parent`).
#[derive(Debug)]
pub struct Span {
    name: &'static str,
    kind: SpanKind,
    trace_id: u128,
    span_id: u64,
    parent: Option<u64>,
    start: SystemTime,
    attributes: Vec<KeyValue>,
}

impl Span {
    /// Starts timing a hop, or `None` when export is off.
    pub fn start(
        name: &'static str,
        kind: SpanKind,
        trace_id: u128,
        span_id: u64,
        parent: Option<u64>,
    ) -> Option<Self> {
        enabled().then(|| Self {
            name,
            kind,
            trace_id,
            span_id,
            parent,
            start: SystemTime::now(),
            attributes: Vec::new(),
        })
    }

    /// Adds an attribute.
    pub fn set(&mut self, key: &'static str, value: impl Into<Value>) {
        self.attributes.push(KeyValue::new(key, value));
    }

    /// Ends a hop that answered HTTP `status`: records the code, and the
    /// span's status the way OpenTelemetry's HTTP conventions have it for a
    /// server (a 5xx is an error described by `error`, a 2xx is OK, anything
    /// else is left unset — a client's mistake is not the server's error).
    pub fn end_http(mut self, status: u16, error: impl FnOnce() -> String) {
        self.set("http.response.status_code", i64::from(status));
        self.end(match status {
            500..=599 => Status::error(error()),
            200..=299 => Status::Ok,
            _ => Status::Unset,
        });
    }

    /// Ends the hop now with `status` and queues it for export.
    pub fn end(self, status: Status) {
        let end = SystemTime::now();
        let Some(e) = EXPORTER.get() else { return };
        let parent = match self.parent {
            Some(p) => opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from(self.trace_id),
                SpanId::from(p),
                TraceFlags::SAMPLED,
                true,
                TraceState::default(),
            )),
            None => opentelemetry::Context::new(),
        };
        let mut builder = e
            .tracer
            .span_builder(self.name)
            .with_kind(self.kind)
            .with_start_time(self.start)
            .with_attributes(self.attributes);
        builder.trace_id = Some(TraceId::from(self.trace_id));
        builder.span_id = Some(SpanId::from(self.span_id));
        builder.status = status;
        let mut span = builder.start_with_context(&e.tracer, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut span, end);
    }
}
