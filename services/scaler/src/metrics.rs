//! The scaler's Prometheus metrics (`runyard_scaler_*`).

use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use runyard_telemetry::Metrics;

use crate::core::policy::PoolStatus;

/// A pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// Pool name.
    pub pool: String,
}

/// Why a queued job gets no runner.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnservedLabel {
    /// `github` / `gitlab`.
    pub forge: &'static str,
    /// `no_matching_pool` / `runner_group`.
    pub reason: &'static str,
}

/// A decision kind.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    /// `create`, `create_idle`, `replace`, `retry`, `give_up`, `reap`, `delete`, `confirm_idle`.
    pub decision: &'static str,
}

/// A provider call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabel {
    /// Provider name.
    pub provider: String,
    /// `create`, `delete`, `list`.
    pub op: &'static str,
}

/// What the reconciler found missing from the log.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FoundLabel {
    /// `github_job`, `gitlab_job` (a job status published from a poll) or
    /// `redelivery` (a failed webhook delivery sent again).
    pub kind: &'static str,
}

/// A forge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForgeLabel {
    /// `github` or `gitlab`.
    pub forge: &'static str,
}

/// A forge endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// `github` or `gitlab`.
    pub forge: &'static str,
    /// The endpoint kind (`generate_jitconfig`, `delete_runner`, ...).
    pub endpoint: &'static str,
}

/// One GitHub rate-limit budget.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabel {
    /// `token`, `installation:<id>` or `app`.
    pub credential: String,
    /// GitHub's `x-ratelimit-resource` (`core`,
    /// `actions_runner_registration`, ...).
    pub resource: String,
}

/// How a reconciler cycle ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CycleLabel {
    /// `complete`, `errors` (some calls failed), `budget_exhausted` (the
    /// hourly API budget ran out, the rest was skipped) or `lease_lost`.
    pub outcome: &'static str,
}

/// An OOM retry decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RetryLabel {
    /// `github` or `gitlab`.
    pub forge: &'static str,
    /// `issued`, `adopted` or `refused`.
    pub outcome: &'static str,
    /// The refusal reason; empty otherwise.
    pub reason: &'static str,
}

/// Why a scale set's message session was made again.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabel {
    /// Pool name.
    pub pool: String,
    /// `silent` (a long poll went unanswered past `scale_set_silence`),
    /// `expired` (the service no longer knew the session), `taken_over`
    /// (a dead holder's session removed), `scale_set_gone` (the scale set
    /// was deleted on the service and made again).
    pub reason: &'static str,
}

/// One of a scale set's statistics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatisticLabel {
    /// Pool name.
    pub pool: String,
    /// `available`, `acquired`, `assigned`, `running`, `registered`,
    /// `busy`, `idle`.
    pub kind: &'static str,
}

/// Handles to the metrics the scaler updates.
#[derive(Clone, Debug)]
pub struct ScalerMetrics {
    /// Runners each pool should have.
    pub desired: Family<PoolLabel, Gauge>,
    /// Runners alive per pool.
    pub actual: Family<PoolLabel, Gauge>,
    /// Idle runners per pool.
    pub idle: Family<PoolLabel, Gauge>,
    /// Runners being created or booting per pool.
    pub creating: Family<PoolLabel, Gauge>,
    /// Jobs waiting per pool.
    pub queued: Family<PoolLabel, Gauge>,
    /// 1 for each pool whose lease this replica holds.
    pub leases_held: Family<PoolLabel, Gauge>,
    /// Decisions made.
    pub decisions: Family<DecisionLabel, Counter>,
    /// Provider call latency.
    pub provider_latency: Family<ProviderLabel, Histogram>,
    /// Failed provider calls.
    pub provider_errors: Family<ProviderLabel, Counter>,
    /// Queued → started wait of jobs (seconds, from the forge's timestamps).
    pub queue_wait: Histogram,
    /// Claims in `<NS>_CLAIMS`.
    pub claims_held: Gauge,
    /// Forge API requests the scaler sent (the reconciler's are counted apart).
    pub forge_api_calls: Family<EndpointLabel, Counter>,
    /// The GitHub API's `x-ratelimit-remaining`.
    pub github_rate_limit_remaining: Gauge,
    /// Requests left per GitHub credential and resource.
    pub github_budget_remaining: Family<BudgetLabel, Gauge>,
    /// When each budget refills, Unix seconds.
    pub github_budget_reset: Family<BudgetLabel, Gauge>,
    /// Creates waiting for a spent GitHub budget.
    pub creates_waiting_for_rate_limit: Gauge,
    /// Lost events the reconciler made up for.
    pub reconciler_found: Family<FoundLabel, Counter>,
    /// Forge API requests the reconciler sent.
    pub reconciler_api_calls: Family<ForgeLabel, Counter>,
    /// Reconciler cycles by outcome.
    pub reconciler_cycles: Family<CycleLabel, Counter>,
    /// OOM retry decisions by forge and outcome.
    pub retries: Family<RetryLabel, Counter>,
    /// Queued jobs no pool can serve, by forge and reason (each job
    /// attempt counted once).
    pub jobs_unserved: Family<UnservedLabel, Counter>,
    /// Scale-set message sessions made again, by reason.
    pub scale_set_sessions_recreated: Family<SessionLabel, Counter>,
    /// Scale-set messages processed (their events in the log, acknowledged).
    pub scale_set_messages: Family<PoolLabel, Counter>,
    /// When a scale set's listener last heard from the service (Unix seconds).
    pub scale_set_last_message: Family<PoolLabel, Gauge>,
    /// The Actions service's statistics per scale set.
    pub scale_set_statistics: Family<StatisticLabel, Gauge>,
    /// Assigned jobs the service counts beyond the scaler's own count.
    pub scale_set_unseen_jobs: Family<PoolLabel, Gauge>,
}

impl ScalerMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &Metrics) -> Self {
        let m = Self {
            desired: Family::default(),
            actual: Family::default(),
            idle: Family::default(),
            creating: Family::default(),
            queued: Family::default(),
            leases_held: Family::default(),
            decisions: Family::default(),
            provider_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 18))
            }),
            provider_errors: Family::default(),
            queue_wait: Histogram::new(exponential_buckets(0.1, 2.0, 16)),
            claims_held: Gauge::default(),
            forge_api_calls: Family::default(),
            github_rate_limit_remaining: Gauge::default(),
            github_budget_remaining: Family::default(),
            github_budget_reset: Family::default(),
            creates_waiting_for_rate_limit: Gauge::default(),
            reconciler_found: Family::default(),
            reconciler_api_calls: Family::default(),
            reconciler_cycles: Family::default(),
            retries: Family::default(),
            jobs_unserved: Family::default(),
            scale_set_sessions_recreated: Family::default(),
            scale_set_messages: Family::default(),
            scale_set_last_message: Family::default(),
            scale_set_statistics: Family::default(),
            scale_set_unseen_jobs: Family::default(),
        };
        registry.register(|r| {
            let r = r.sub_registry_with_prefix("scaler");
            r.register(
                "pool_desired_runners",
                "Runners each pool should have",
                m.desired.clone(),
            );
            r.register(
                "pool_actual_runners",
                "Runners alive per pool",
                m.actual.clone(),
            );
            r.register("pool_idle_runners", "Idle runners per pool", m.idle.clone());
            r.register(
                "pool_creating_runners",
                "Runners being created or booting per pool",
                m.creating.clone(),
            );
            r.register(
                "pool_queued_jobs",
                "Jobs waiting for a runner per pool",
                m.queued.clone(),
            );
            r.register(
                "pool_lease_held",
                "1 for each pool whose lease this replica holds",
                m.leases_held.clone(),
            );
            r.register(
                "decisions",
                "Scaling decisions, by kind",
                m.decisions.clone(),
            );
            r.register(
                "provider_call_seconds",
                "Provider call latency",
                m.provider_latency.clone(),
            );
            r.register(
                "provider_errors",
                "Failed provider calls",
                m.provider_errors.clone(),
            );
            r.register(
                "queue_wait_seconds",
                "Queued to started wait of jobs",
                m.queue_wait.clone(),
            );
            r.register(
                "claims_held",
                "Job claims in the claims bucket",
                m.claims_held.clone(),
            );
            r.register(
                "forge_api_calls",
                "Forge API requests sent by the scaler, by forge and endpoint",
                m.forge_api_calls.clone(),
            );
            r.register(
                "github_rate_limit_remaining",
                "The GitHub API's remaining request budget",
                m.github_rate_limit_remaining.clone(),
            );
            r.register(
                "github_rate_limit_budget_remaining",
                "Requests left of each GitHub rate-limit budget, by credential and resource",
                m.github_budget_remaining.clone(),
            );
            r.register(
                "github_rate_limit_budget_reset_seconds",
                "When each GitHub rate-limit budget refills (Unix seconds), by credential and resource",
                m.github_budget_reset.clone(),
            );
            r.register(
                "creates_waiting_for_rate_limit",
                "Runner creates waiting for a spent GitHub rate-limit budget",
                m.creates_waiting_for_rate_limit.clone(),
            );
            r.register(
                "reconciler_found",
                "Lost webhook events the reconciler made up for, by kind",
                m.reconciler_found.clone(),
            );
            r.register(
                "oom_retries",
                "OOM retry decisions, by forge, outcome and refusal reason",
                m.retries.clone(),
            );
            r.register(
                "jobs_unserved",
                "Queued jobs no pool can serve, by forge and reason (once per job attempt)",
                m.jobs_unserved.clone(),
            );
            r.register(
                "scale_set_sessions_recreated",
                "Scale-set message sessions made again, by pool and reason (silent, expired, taken_over, scale_set_gone)",
                m.scale_set_sessions_recreated.clone(),
            );
            r.register(
                "scale_set_messages",
                "Scale-set messages whose events are in the log and that were acknowledged, by pool",
                m.scale_set_messages.clone(),
            );
            r.register(
                "scale_set_last_message_timestamp_seconds",
                "When each scale set's listener last had an answer from the Actions service (Unix seconds)",
                m.scale_set_last_message.clone(),
            );
            r.register(
                "scale_set_unseen_jobs",
                "Jobs the Actions service counts as assigned to a scale set beyond the scaler's own count of its queued and running jobs (a check: positive for long means lost messages)",
                m.scale_set_unseen_jobs.clone(),
            );
            r.register(
                "scale_set_statistics",
                "The Actions service's statistics per scale set (jobs available, acquired, assigned, running; runners registered, busy, idle)",
                m.scale_set_statistics.clone(),
            );
            r.register(
                "reconciler_api_calls",
                "Forge API requests the reconciler sent, by forge",
                m.reconciler_api_calls.clone(),
            );
            r.register(
                "reconciler_cycles",
                "Reconciler cycles, by outcome",
                m.reconciler_cycles.clone(),
            );
        });
        m
    }

    /// Every series of the scale-set pools exists from the start: counts at
    /// zero, and the last answer at `start` (so a listener that never hears
    /// from the service shows its silence from the start).
    pub fn init_scale_sets(&self, pools: &[&str], start: i64) {
        for pool in pools {
            let pool = (*pool).to_owned();
            let _ = self
                .scale_set_messages
                .get_or_create(&PoolLabel { pool: pool.clone() });
            let _ = self
                .scale_set_unseen_jobs
                .get_or_create(&PoolLabel { pool: pool.clone() });
            self.scale_set_last_message
                .get_or_create(&PoolLabel { pool: pool.clone() })
                .set(start);
            for reason in ["silent", "expired", "taken_over", "scale_set_gone"] {
                let _ = self
                    .scale_set_sessions_recreated
                    .get_or_create(&SessionLabel {
                        pool: pool.clone(),
                        reason,
                    });
            }
            for kind in [
                "available",
                "acquired",
                "assigned",
                "running",
                "registered",
                "busy",
                "idle",
            ] {
                let _ = self.scale_set_statistics.get_or_create(&StatisticLabel {
                    pool: pool.clone(),
                    kind,
                });
            }
        }
    }

    /// Makes every labelled series exist at zero, so dashboards and alerts
    /// see a provider or decision kind before its first event.
    pub fn init(&self, providers: &[&str], pools: &[&str]) {
        for provider in providers {
            for op in ["create", "delete", "list"] {
                let label = ProviderLabel {
                    provider: (*provider).to_owned(),
                    op,
                };
                let _ = self.provider_errors.get_or_create(&label);
                let _ = self.provider_latency.get_or_create(&label);
            }
        }
        for decision in [
            "create",
            "create_idle",
            "replace",
            "retry",
            "give_up",
            "reap",
            "delete",
            "confirm_idle",
        ] {
            let _ = self.decisions.get_or_create(&DecisionLabel { decision });
        }
        for pool in pools {
            let _ = self.leases_held.get_or_create(&PoolLabel {
                pool: (*pool).to_owned(),
            });
        }
        for kind in ["github_job", "gitlab_job", "redelivery"] {
            let _ = self.reconciler_found.get_or_create(&FoundLabel { kind });
        }
        // Every retry outcome exists from the start, at zero.
        for forge in ["github", "gitlab"] {
            for outcome in ["issued", "adopted"] {
                let _ = self.retries.get_or_create(&RetryLabel {
                    forge,
                    outcome,
                    reason: "",
                });
            }
            for reason in runyard_events::RETRY_REFUSAL_REASONS {
                let _ = self.retries.get_or_create(&RetryLabel {
                    forge,
                    outcome: "refused",
                    reason,
                });
            }
        }
        for forge in ["github", "gitlab"] {
            let _ = self
                .reconciler_api_calls
                .get_or_create(&ForgeLabel { forge });
        }
        for outcome in ["complete", "errors", "budget_exhausted", "lease_lost"] {
            let _ = self
                .reconciler_cycles
                .get_or_create(&CycleLabel { outcome });
        }
    }

    /// Brings `forge_api_calls` up to a client's running totals.
    pub fn record_forge_calls(&self, forge: &'static str, totals: &runyard_forge::api::CallCounts) {
        for (endpoint, total) in &totals.calls {
            let counter = self
                .forge_api_calls
                .get_or_create(&EndpointLabel { forge, endpoint });
            let seen = counter.get();
            if *total > seen {
                counter.inc_by(total - seen);
            }
        }
    }

    /// Sets the budget gauges from a client's budgets.
    pub fn record_rate_budgets(&self, budgets: &[runyard_forge::api::RateBudget]) {
        let gauge = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        for b in budgets {
            let label = BudgetLabel {
                credential: b.credential.clone(),
                resource: b.resource.clone(),
            };
            if let Some(left) = b.remaining {
                self.github_budget_remaining
                    .get_or_create(&label)
                    .set(gauge(left));
            }
            if let Some(reset) = b.reset_epoch {
                self.github_budget_reset
                    .get_or_create(&label)
                    .set(gauge(reset));
            }
        }
    }

    /// Records one provider call.
    pub fn provider_call(&self, provider: &str, op: &'static str, started: Instant, ok: bool) {
        let label = ProviderLabel {
            provider: provider.to_owned(),
            op,
        };
        self.provider_latency
            .get_or_create(&label)
            .observe(started.elapsed().as_secs_f64());
        if !ok {
            self.provider_errors.get_or_create(&label).inc();
        }
    }

    /// Sets the pool gauges.
    pub fn record_pools(&self, pools: &[PoolStatus]) {
        for s in pools {
            let l = PoolLabel {
                pool: s.name.clone(),
            };
            self.desired.get_or_create(&l).set(i64::from(s.desired));
            self.actual.get_or_create(&l).set(i64::from(s.actual));
            self.idle.get_or_create(&l).set(i64::from(s.idle));
            self.creating.get_or_create(&l).set(i64::from(s.creating));
            self.queued.get_or_create(&l).set(i64::from(s.queued));
        }
    }
}
