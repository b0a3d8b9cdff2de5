//! Ingest's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use runyard_telemetry::Metrics;

/// Labels of `runyard_ingest_deliveries_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeliveryLabels {
    /// `github`, `gitlab` or `usage`.
    pub forge: &'static str,
    /// `accepted`, `duplicate`, `ignored`, `unauthorized`, `invalid`,
    /// `too_large`, `unsupported_media_type`, `not_configured`, `unavailable`,
    /// `overloaded` (shed at the door, see [`crate::shed`]), `too_slow` (the
    /// body missed `RUNYARD_INGEST_BODY_TIMEOUT`, or gave way unverified).
    pub result: &'static str,
}

/// Labels of `runyard_ingest_usage_auth_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageAuthLabels {
    /// `oidc` (a CI identity token), `token` (the shared usage token) or
    /// `none` (no bearer credential at all).
    pub method: &'static str,
    /// `accepted`, `forbidden` (a verified token for another job than the
    /// report's), `unavailable` (the issuer's keys could not be fetched),
    /// `missing`, `wrong` (not the shared token, or not a token of an
    /// accepted kind), or why an identity token was refused: `expired`,
    /// `not_yet_valid`, `audience`, `unknown_issuer`, `unknown_key`,
    /// `signature`, `algorithm`, `claims`, `malformed`.
    pub result: &'static str,
}

/// Handles to the metrics ingest updates.
#[derive(Clone, Debug)]
pub struct IngestMetrics {
    /// Deliveries by forge and result.
    pub deliveries: Family<DeliveryLabels, Counter>,
    /// Time from the start of the publishes to the last JetStream ack.
    pub publish_latency: Histogram,
    /// Raw deliveries not kept because they exceed the server's max_payload.
    pub raw_skipped: Counter,
    /// How usage reports authenticated, and with what result.
    pub usage_auth: Family<UsageAuthLabels, Counter>,
    /// Deliveries in flight (set when scraped).
    pub in_flight: Gauge,
    /// Body memory they hold (set when scraped).
    pub in_flight_bytes: Gauge,
}

impl IngestMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Metrics) -> Self {
        let m = Self {
            deliveries: Family::default(),
            publish_latency: Histogram::new(exponential_buckets(0.0002, 2.0, 16)),
            raw_skipped: Counter::default(),
            usage_auth: Family::default(),
            in_flight: Gauge::default(),
            in_flight_bytes: Gauge::default(),
        };
        registry.register(|r| {
            let r = r.sub_registry_with_prefix("ingest");
            r.register(
                "deliveries",
                "Deliveries by forge and result",
                m.deliveries.clone(),
            );
            r.register(
                "publish_latency_seconds",
                "Time until JetStream acknowledged every message of a delivery",
                m.publish_latency.clone(),
            );
            r.register(
                "raw_skipped",
                "Raw deliveries not kept because they exceed the server's max_payload",
                m.raw_skipped.clone(),
            );
            r.register(
                "usage_auth",
                "Usage report authentications by method (oidc, token, none) and result",
                m.usage_auth.clone(),
            );
            r.register(
                "in_flight",
                "Deliveries admitted and not yet answered",
                m.in_flight.clone(),
            );
            r.register(
                "in_flight_bytes",
                "Body memory held by the deliveries in flight",
                m.in_flight_bytes.clone(),
            );
        });
        m
    }

    /// Counts one delivery.
    pub fn delivery(&self, forge: &'static str, result: &'static str) {
        self.deliveries
            .get_or_create(&DeliveryLabels { forge, result })
            .inc();
    }

    /// Counts one usage report's authentication.
    pub fn usage_auth(&self, method: &'static str, result: &'static str) {
        self.usage_auth
            .get_or_create(&UsageAuthLabels { method, result })
            .inc();
    }
}
