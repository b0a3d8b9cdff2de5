//! job-tracker's Prometheus metrics: the consumer's, as `runyard_tracker_*`
//! (events by result, batch size, apply latency, consumer lag, last applied
//! sequence, apply failures).

use runyard_bus::consumer::ConsumerMetrics;
use runyard_telemetry::Metrics;

/// Handles to the metrics the tracker updates. Of
/// `runyard_tracker_events_total{result}`, the tracker counts `applied` and
/// `duplicate`; the consumer counts `deadlettered` and `retried`.
pub type TrackerMetrics = ConsumerMetrics;

/// Creates the metrics and registers them as `runyard_tracker_*`.
pub fn register(registry: &Metrics) -> TrackerMetrics {
    ConsumerMetrics::register(registry, "tracker")
}
