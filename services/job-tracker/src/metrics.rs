//! job-tracker's Prometheus metrics.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use runyard_telemetry::Metrics;

/// Labels of `runyard_tracker_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied`, `duplicate`, `deadlettered`, `retried`.
    pub result: &'static str,
}

/// Handles to the metrics the tracker updates.
#[derive(Clone, Debug)]
pub struct TrackerMetrics {
    /// Events by result.
    pub events: Family<ResultLabel, Counter>,
    /// Events per applied batch.
    pub batch_size: Histogram,
    /// Time to apply and commit a batch.
    pub apply_latency: Histogram,
    /// Stream last sequence minus the last sequence this replica acked.
    pub consumer_lag: Gauge,
    /// The last stream sequence this replica acked.
    pub last_applied_sequence: Gauge,
    /// Failed batch attempts (Postgres unavailable, conflicts).
    pub apply_failures: Counter,
}

impl TrackerMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Metrics) -> Self {
        let m = Self {
            events: Family::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            apply_latency: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            consumer_lag: Gauge::default(),
            last_applied_sequence: Gauge::default(),
            apply_failures: Counter::default(),
        };
        registry.register(|r| {
            let r = r.sub_registry_with_prefix("tracker");
            r.register("events", "Events handled, by result", m.events.clone());
            r.register(
                "batch_size",
                "Events per applied batch",
                m.batch_size.clone(),
            );
            r.register(
                "apply_latency_seconds",
                "Time to apply and commit one batch",
                m.apply_latency.clone(),
            );
            r.register(
                "consumer_lag",
                "Stream last sequence minus the last sequence applied",
                m.consumer_lag.clone(),
            );
            r.register(
                "last_applied_sequence",
                "Last stream sequence applied by this replica",
                m.last_applied_sequence.clone(),
            );
            r.register(
                "apply_failures",
                "Batch attempts that failed and were retried",
                m.apply_failures.clone(),
            );
        });
        m
    }

    /// Counts events with a result.
    pub fn count(&self, result: &'static str, n: usize) {
        self.events
            .get_or_create(&ResultLabel { result })
            .inc_by(n as u64);
    }
}
