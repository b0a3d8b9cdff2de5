//! A consumer's Prometheus metrics, registered under a prefix of the
//! service's choosing (the job-tracker's are `runyard_tracker_*`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use runyard_telemetry::Metrics;

/// Labels of `<prefix>_events_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// What became of the events. The consumer counts `deadlettered` and
    /// `retried` (undecodable messages sent back for another delivery);
    /// handlers count what they know, e.g. `applied` and `duplicate`.
    pub result: &'static str,
}

/// Handles to one consumer's metrics. Cloning shares them.
#[derive(Clone, Debug)]
pub struct ConsumerMetrics {
    /// `<prefix>_events_total{result}`: events by result.
    pub events: Family<ResultLabel, Counter>,
    /// `<prefix>_batch_size`: events per handled batch.
    pub batch_size: Histogram,
    /// `<prefix>_apply_latency_seconds`: time to handle one batch, retries
    /// included.
    pub apply_latency: Histogram,
    /// `<prefix>_consumer_lag`: stream last sequence minus the last sequence
    /// this consumer acked.
    pub consumer_lag: Gauge,
    /// `<prefix>_last_applied_sequence`: the last stream sequence this
    /// consumer acked.
    pub last_applied_sequence: Gauge,
    /// `<prefix>_apply_failures_total`: handler attempts that failed.
    pub apply_failures: Counter,
    /// `<prefix>_stalled`: 1 while the consumer retries a batch after a
    /// transient (environment) failure and applies nothing, else 0.
    pub stalled: Gauge,
}

impl ConsumerMetrics {
    /// Creates the metrics and registers them as `runyard_<prefix>_...`.
    pub fn register(registry: &Metrics, prefix: &str) -> Self {
        let m = Self {
            events: Family::default(),
            batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            apply_latency: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            consumer_lag: Gauge::default(),
            last_applied_sequence: Gauge::default(),
            apply_failures: Counter::default(),
            stalled: Gauge::default(),
        };
        registry.register(|r| {
            let r = r.sub_registry_with_prefix(prefix);
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
            r.register(
                "stalled",
                "1 while a batch is retried after an environment failure (nothing is applied), else 0",
                m.stalled.clone(),
            );
        });
        m
    }

    /// Counts `n` events with `result`. A zero count still creates the
    /// series, so a rate over it starts from its first batch.
    pub fn count(&self, result: &'static str, n: usize) {
        self.events
            .get_or_create(&ResultLabel { result })
            .inc_by(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_named_under_the_prefix() {
        let registry = Metrics::new();
        let m = ConsumerMetrics::register(&registry, "tracker");
        m.count("applied", 3);
        m.count("duplicate", 0);
        m.batch_size.observe(3.0);
        let text = registry.encode();
        for family in [
            "# TYPE runyard_tracker_events counter",
            "# TYPE runyard_tracker_batch_size histogram",
            "# TYPE runyard_tracker_apply_latency_seconds histogram",
            "# TYPE runyard_tracker_consumer_lag gauge",
            "# TYPE runyard_tracker_last_applied_sequence gauge",
            "# TYPE runyard_tracker_apply_failures counter",
            "# TYPE runyard_tracker_stalled gauge",
        ] {
            assert!(text.contains(family), "{family} in {text}");
        }
        assert!(text.contains(r#"runyard_tracker_events_total{result="applied"} 3"#));
        assert!(text.contains(r#"runyard_tracker_events_total{result="duplicate"} 0"#));
    }
}
