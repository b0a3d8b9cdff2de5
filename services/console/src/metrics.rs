//! The console's Prometheus metrics: pages served and how long they took,
//! refused requests, and the savings of the last
//! `RUNYARD_CONSOLE_SAVINGS_WINDOW` per project — the same figures as the
//! savings page and `runyard savings` ([`runyard_insight::savings`]),
//! computed again at most once a minute when scraped.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use runyard_insight::savings::{Figures, Savings};
use runyard_telemetry::Metrics;

/// A page and what it answered.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PageLabels {
    /// `queue`, `pools`, `job`, `workload`, `savings`, `search`, `login`.
    pub page: String,
    /// The HTTP status.
    pub status: u16,
}

/// A page.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PageLabel {
    /// The page.
    pub page: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// [`crate::auth::Refusal::reason`].
    pub reason: String,
}

/// A savings figure's project and window.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SavingsLabels {
    /// The project; `(all)` for the total.
    pub project: String,
    /// The window, e.g. `30d`.
    pub window: String,
}

/// A savings figure that is a quantile.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuantileLabels {
    /// The project; `(all)` for the total.
    pub project: String,
    /// The window.
    pub window: String,
    /// `0.5` or `0.95`.
    pub quantile: String,
}

/// Handles to the console's metrics.
#[derive(Debug, Clone)]
pub struct ConsoleMetrics {
    /// `runyard_console_requests_total{page,status}`.
    pub requests: Family<PageLabels, Counter>,
    /// `runyard_console_page_seconds{page}`: time to answer a page.
    pub page_seconds: Family<PageLabel, Histogram, fn() -> Histogram>,
    /// `runyard_console_refused_total{reason}`.
    pub refused: Family<ReasonLabel, Counter>,
    /// The savings gauges.
    pub savings: SavingsGauges,
}

/// `runyard_savings_*`: one series per project and the total (`(all)`).
#[derive(Debug, Clone, Default)]
pub struct SavingsGauges {
    reserved: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    used: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    before: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    first: Family<SavingsLabels, Gauge>,
    first_killed: Family<SavingsLabels, Gauge>,
    target: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    retries: Family<SavingsLabels, Gauge>,
    retries_ok: Family<SavingsLabels, Gauge>,
    runner_minutes: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    idle_minutes: Family<SavingsLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    wait: Family<QuantileLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

fn page_buckets() -> Histogram {
    Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5])
}

impl ConsoleMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &Metrics) -> Self {
        let m = Self {
            requests: Family::default(),
            page_seconds: Family::new_with_constructor(page_buckets),
            refused: Family::default(),
            savings: SavingsGauges::default(),
        };
        let s = &m.savings;
        registry.register(|r| {
            r.register(
                "console_requests",
                "Console requests by page and HTTP status",
                m.requests.clone(),
            );
            r.register(
                "console_page_seconds",
                "Time the console took to answer a page",
                m.page_seconds.clone(),
            );
            r.register(
                "console_refused",
                "Console requests refused for want of credentials, by reason",
                m.refused.clone(),
            );
            r.register(
                "savings_reserved_gb_hours",
                "Memory reserved by usage reports in the window (limit × wall time), GB·h",
                s.reserved.clone(),
            );
            r.register(
                "savings_used_gb_hours",
                "Memory used by usage reports in the window (peak × wall time), GB·h",
                s.used.clone(),
            );
            r.register(
                "savings_before_gb_hours",
                "The same runs at the size jobs had before runyard, GB·h (when configured)",
                s.before.clone(),
            );
            r.register(
                "savings_first_attempts",
                "First attempts reported in the window",
                s.first.clone(),
            );
            r.register(
                "savings_first_attempts_oom_killed",
                "First attempts OOM-killed in the window",
                s.first_killed.clone(),
            );
            r.register(
                "savings_target_oom",
                "The OOM target first attempts are held to (RUNYARD_ALLOCATOR_TARGET_OOM)",
                s.target.clone(),
            );
            r.register(
                "savings_retries",
                "OOM retries runyard issued in the window",
                s.retries.clone(),
            );
            r.register(
                "savings_retries_succeeded",
                "OOM retries whose new job succeeded",
                s.retries_ok.clone(),
            );
            r.register(
                "savings_runner_minutes",
                "Runner minutes of runners created in the window",
                s.runner_minutes.clone(),
            );
            r.register(
                "savings_idle_runner_minutes",
                "Runner minutes without a job",
                s.idle_minutes.clone(),
            );
            r.register(
                "savings_queue_wait_seconds",
                "Queue wait of jobs started in the window, by quantile",
                s.wait.clone(),
            );
        });
        m
    }
}

impl SavingsGauges {
    /// Sets every series from `savings` over `window` (its name), the
    /// projects gone since the last time removed.
    pub fn set(&self, savings: &Savings, window: &str) {
        for family in [
            &self.reserved,
            &self.used,
            &self.before,
            &self.target,
            &self.runner_minutes,
            &self.idle_minutes,
        ] {
            family.clear();
        }
        for family in [
            &self.first,
            &self.first_killed,
            &self.retries,
            &self.retries_ok,
        ] {
            family.clear();
        }
        self.wait.clear();
        let all = std::iter::once(("(all)", &savings.total)).chain(
            savings
                .projects
                .iter()
                .map(|f| (f.project.as_deref().unwrap_or_default(), f)),
        );
        for (project, f) in all {
            self.one(project, window, f);
        }
    }

    fn one(&self, project: &str, window: &str, f: &Figures) {
        let l = SavingsLabels {
            project: project.to_owned(),
            window: window.to_owned(),
        };
        self.reserved.get_or_create(&l).set(f.reserved_gb_hours);
        self.used.get_or_create(&l).set(f.used_gb_hours);
        if let Some(b) = f.before_gb_hours {
            self.before.get_or_create(&l).set(b);
        }
        self.first.get_or_create(&l).set(f.first_attempts);
        self.first_killed
            .get_or_create(&l)
            .set(f.first_attempts_oom_killed);
        self.target.get_or_create(&l).set(f.target_oom);
        self.retries.get_or_create(&l).set(f.retries);
        self.retries_ok.get_or_create(&l).set(f.retries_succeeded);
        self.runner_minutes.get_or_create(&l).set(f.runner_minutes);
        self.idle_minutes
            .get_or_create(&l)
            .set(f.idle_runner_minutes);
        for (q, v) in [
            ("0.5", f.queue_wait_p50_seconds),
            ("0.95", f.queue_wait_p95_seconds),
        ] {
            if let Some(v) = v {
                self.wait
                    .get_or_create(&QuantileLabels {
                        project: project.to_owned(),
                        window: window.to_owned(),
                        quantile: q.to_owned(),
                    })
                    .set(v);
            }
        }
    }
}
