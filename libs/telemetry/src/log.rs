//! JSON log lines that name the trace they were written in.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// tracing-subscriber's JSON lines (event fields flattened, no span list)
/// with `trace_id` and `span_id` added when the line is written inside a
/// span the OpenTelemetry layer tracks: the innermost such span's ids, as
/// lower-case hex, the same ids the exported spans and the `traceparent`
/// headers carry.
pub(crate) struct JsonWithTrace {
    inner: Format<Json>,
}

impl JsonWithTrace {
    pub(crate) fn new() -> Self {
        Self {
            inner: tracing_subscriber::fmt::format()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_span_list(false),
        }
    }
}

impl<S, N> FormatEvent<S, N> for JsonWithTrace
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ids = ctx.event_scope().and_then(|scope| {
            scope.into_iter().find_map(|span| {
                let ext = span.extensions();
                let otel = ext.get::<tracing_opentelemetry::OtelData>()?;
                Some((otel.trace_id()?, otel.span_id()?))
            })
        });
        let Some((trace_id, span_id)) = ids else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::with_capacity(256);
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        // The line is one JSON object and a newline: the ids go before the
        // object's closing brace.
        match line.rfind('}') {
            Some(end) => {
                writer.write_str(&line[..end])?;
                write!(writer, r#","trace_id":"{trace_id}","span_id":"{span_id}""#)?;
                writer.write_str(&line[end..])
            }
            None => writer.write_str(&line),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::TracerProvider as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    use tracing_subscriber::prelude::*;

    use super::*;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(out: &Lines) -> Vec<serde_json::Value> {
        let bytes = out.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }

    #[test]
    fn lines_inside_a_span_name_its_trace_and_lines_outside_do_not() {
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let out = Lines::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")))
            .with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
                    .event_format(JsonWithTrace::new())
                    .with_writer(move || writer.clone()),
            );
        let (trace_id, span_id) = tracing::subscriber::with_default(subscriber, || {
            tracing::info!(n = 1, "outside");
            let span = tracing::info_span!("hop");
            let _entered = span.enter();
            tracing::info!(n = 2, "inside");
            let cx = span.context();
            let sc = opentelemetry::trace::TraceContextExt::span(&cx)
                .span_context()
                .clone();
            (sc.trace_id().to_string(), sc.span_id().to_string())
        });
        let lines = lines(&out);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(lines[0]["message"], "outside");
        assert!(lines[0].get("trace_id").is_none(), "{:?}", lines[0]);
        assert_eq!(lines[1]["message"], "inside");
        assert_eq!(lines[1]["n"], 2);
        assert_eq!(lines[1]["trace_id"], trace_id.as_str());
        assert_eq!(lines[1]["span_id"], span_id.as_str());
        assert_eq!(trace_id.len(), 32);
        assert_ne!(trace_id, "0".repeat(32));
    }
}
