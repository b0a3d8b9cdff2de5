//! A fake OpenTelemetry collector on loopback: accepts OTLP/HTTP protobuf
//! trace exports and keeps the spans, so tests can check what the services
//! exported ([`runyard_telemetry::traces`]).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
pub use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
pub use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

/// The collector: its base URL (what `OTEL_EXPORTER_OTLP_ENDPOINT` holds)
/// and every export request it received.
#[derive(Debug, Clone)]
pub struct Collector {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Collector {
    /// Starts listening on an ephemeral loopback port.
    pub async fn start() -> Self {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |body: Bytes| async move {
                kept.lock().unwrap_or_else(|e| e.into_inner()).push(body);
                // An empty ExportTraceServiceResponse.
                (
                    [("content-type", "application/x-protobuf")],
                    Vec::<u8>::new(),
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("binding the collector: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("collector address: {e}"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url: format!("http://{addr}"),
            bodies,
        }
    }

    /// Flushes this process's exporter and polls what the collector has
    /// received until `done` holds of it (then `Some` of it) or `timeout`
    /// passes.
    pub async fn wait_for(
        &self,
        timeout: std::time::Duration,
        done: impl Fn(&[(String, Span)]) -> bool,
    ) -> Option<Vec<(String, Span)>> {
        crate::eventually(timeout, || async {
            let _ = tokio::task::spawn_blocking(runyard_telemetry::traces::flush).await;
            let spans = self.spans();
            done(&spans).then_some(spans)
        })
        .await
    }

    /// Every span received so far, with the `service.name` it came from.
    pub fn spans(&self) -> Vec<(String, Span)> {
        let bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        let mut spans = Vec::new();
        for body in bodies.iter() {
            let Ok(req) = ExportTraceServiceRequest::decode(body.clone()) else {
                panic!("an export the collector cannot decode");
            };
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .iter()
                    .flat_map(|r| &r.attributes)
                    .find(|kv| kv.key == "service.name")
                    .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                        AnyValue::StringValue(s) => Some(s.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                for ss in rs.scope_spans {
                    spans.extend(ss.spans.into_iter().map(|s| (service.clone(), s)));
                }
            }
        }
        spans
    }
}

/// The value of `span`'s attribute `key`.
pub fn attribute(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

/// Lower-case hex of a trace or span id.
pub fn hex_id(bytes: &[u8]) -> String {
    hex::encode(bytes)
}
