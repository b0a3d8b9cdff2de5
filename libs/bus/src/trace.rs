//! W3C trace context (`traceparent`) carried in NATS headers, so one
//! delivery's path through the services is one trace.

use std::fmt;

use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// A parsed or freshly made `traceparent` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// 16-byte trace id (never all zero).
    pub trace_id: u128,
    /// 8-byte id of the span that emitted this message (never zero).
    pub span_id: u64,
    /// Trace flags (`01` = sampled).
    pub flags: u8,
}

impl TraceParent {
    /// A new trace with a random id.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero_u128(),
            span_id: nonzero_u64(),
            flags: 1,
        }
    }

    /// The same trace, a new span (this hop).
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero_u64(),
            ..*self
        }
    }

    /// Parses version-00 `traceparent`; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        let mut parts = s.trim().split('-');
        let (v, t, p, f) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || v != "00" || t.len() != 32 || p.len() != 16 || f.len() != 2 {
            return None;
        }
        let lower_hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if !(lower_hex(t) && lower_hex(p) && lower_hex(f)) {
            return None;
        }
        let trace_id = u128::from_str_radix(t, 16).ok()?;
        let span_id = u64::from_str_radix(p, 16).ok()?;
        let flags = u8::from_str_radix(f, 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }
}

impl TraceParent {
    /// The `traceparent` value as a NATS header value, for
    /// [`crate::Bus::prepare_event`] and [`crate::Prepared`] headers.
    pub fn header_value(&self) -> async_nats::HeaderValue {
        async_nats::HeaderValue::from(self.encode().as_str())
    }

    /// `00-<trace_id>-<span_id>-<flags>` in lower-case hex: formatted by hand
    /// because this runs for every delivery and `fmt`'s padded hex of a
    /// `u128` is several times slower.
    fn encode(&self) -> Encoded {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        fn put(out: &mut [u8], value: u128) {
            let mut v = value;
            for b in out.iter_mut().rev() {
                *b = HEX[(v & 0xf) as usize];
                v >>= 4;
            }
        }
        let mut buf = *b"00-00000000000000000000000000000000-0000000000000000-00";
        put(&mut buf[3..35], self.trace_id);
        put(&mut buf[36..52], u128::from(self.span_id));
        put(&mut buf[53..55], u128::from(self.flags));
        Encoded(buf)
    }
}

/// A formatted `traceparent`: 55 ASCII bytes.
struct Encoded([u8; 55]);

impl Encoded {
    fn as_str(&self) -> &str {
        // Only ASCII hex digits and dashes are ever written into it.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.encode().as_str())
    }
}

impl TraceParent {
    /// The W3C context this names, as a remote parent.
    fn remote(&self) -> opentelemetry::Context {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
        };
        opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from(self.trace_id),
            SpanId::from(self.span_id),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        ))
    }

    /// The context of `span` as the OpenTelemetry layer recorded it, or
    /// `None` when no such layer records it (a process without
    /// [`runyard_telemetry::init_tracing`], or a span filtered out).
    pub fn of(span: &tracing::Span) -> Option<Self> {
        use opentelemetry::trace::TraceContextExt as _;
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        sc.is_valid().then(|| Self {
            trace_id: u128::from_be_bytes(sc.trace_id().to_bytes()),
            span_id: u64::from_be_bytes(sc.span_id().to_bytes()),
            flags: sc.trace_flags().to_u8(),
        })
    }
}

/// Makes `span` a hop of the trace `incoming` (a `traceparent` value)
/// names — its remote parent — or the root of a new trace when there is
/// none or it is malformed, and returns the context the hop passes on (the
/// `traceparent` of what it publishes). Call before the span is entered.
///
/// Without an OpenTelemetry layer recording the span, the context passed
/// on is a child of `incoming`, or a new root: messages carry a
/// `traceparent` either way.
pub fn follow(span: &tracing::Span, incoming: Option<&str>) -> TraceParent {
    let parent = adopt(span, incoming);
    TraceParent::of(span)
        .unwrap_or_else(|| parent.map_or_else(TraceParent::new_root, |p| p.child()))
}

/// [`follow`] without working out the context passed on (which costs a
/// context per call): for a hop that publishes nothing of its own, or
/// that takes the context from [`current`] inside the span. Returns the
/// parent it found in `incoming`.
pub fn adopt(span: &tracing::Span, incoming: Option<&str>) -> Option<TraceParent> {
    let parent = incoming.and_then(TraceParent::parse);
    let _ = span.set_parent(parent.map_or_else(opentelemetry::Context::new, |p| p.remote()));
    parent
}

/// The context of the current span — what a message published now
/// carries — or a new trace outside any recorded span.
pub fn current() -> TraceParent {
    TraceParent::of(&tracing::Span::current()).unwrap_or_else(TraceParent::new_root)
}

fn nonzero_u128() -> u128 {
    loop {
        let v: u128 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

fn nonzero_u64() -> u64 {
    loop {
        let v: u64 = rand::random();
        if v != 0 {
            return v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_a_valid_trace_with_a_new_span() {
        let incoming = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = follow(&tracing::Span::none(), Some(incoming));
        assert_eq!(tp.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_ne!(tp.span_id, 0x00f067aa0ba902b7);
        assert_eq!(TraceParent::parse(&tp.to_string()), Some(tp));
    }

    #[test]
    fn formats_as_w3c_traceparent() {
        let tp = TraceParent {
            trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
            span_id: 0xf067aa0ba902b7,
            flags: 1,
        };
        let want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(tp.to_string(), want);
        assert_eq!(tp.header_value().as_str(), want);
        for _ in 0..100 {
            let tp = TraceParent::new_root();
            let by_fmt = format!(
                "00-{:032x}-{:016x}-{:02x}",
                tp.trace_id, tp.span_id, tp.flags
            );
            assert_eq!(tp.to_string(), by_fmt);
        }
        let max = TraceParent {
            trace_id: u128::MAX,
            span_id: u64::MAX,
            flags: u8::MAX,
        };
        assert_eq!(
            max.to_string(),
            format!("00-{}-{}-ff", "f".repeat(32), "f".repeat(16))
        );
    }

    #[test]
    fn malformed_context_starts_a_new_trace() {
        for bad in [
            "",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let tp = follow(&tracing::Span::none(), Some("garbage"));
        assert_ne!(tp.trace_id, 0);
    }
}
