//! Load generators. Both are bounded in count and in time.
//!
//! - [`closed_loop`]: `concurrency` workers each issue the next operation as
//!   soon as their previous one finished — measures the maximum sustainable
//!   rate at that concurrency.
//! - [`open_loop`]: operations are *scheduled* at a fixed rate and each one's
//!   latency is measured from its scheduled start, so a stall of the system
//!   under test is charged to every request it delayed (no coordinated
//!   omission).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What one operation came to: `Ok` when it succeeded as expected, else a
/// short label of what happened instead (`"status 503"`, `"timeout"`, ...);
/// failures are counted by label.
pub type Outcome = Result<(), Cow<'static, str>>;

/// Highest latency a histogram can hold, in microseconds (one minute).
const MAX_LATENCY_US: u64 = 60_000_000;

/// A latency histogram in microseconds, 3 significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    #[allow(clippy::expect_used)] // constant, valid bounds
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("valid histogram bounds")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Counts of outcomes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Operations that succeeded.
    pub ok: u64,
    /// Failed operations by label.
    pub failures: BTreeMap<String, u64>,
}

impl Tally {
    /// Counts one outcome.
    pub fn add(&mut self, outcome: &Outcome) {
        match outcome {
            Ok(()) => self.ok += 1,
            Err(label) => *self.failures.entry(label.to_string()).or_default() += 1,
        }
    }

    /// Adds another tally to this one.
    pub fn merge(&mut self, other: &Tally) {
        self.ok += other.ok;
        for (label, n) in &other.failures {
            *self.failures.entry(label.clone()).or_default() += n;
        }
    }

    /// Number of failed operations.
    pub fn failed(&self) -> u64 {
        self.failures.values().sum()
    }

    /// Number of operations counted.
    pub fn total(&self) -> u64 {
        self.ok + self.failed()
    }

    /// `"none"` or `"status 503: 12, timeout: 1"`.
    pub fn failures_text(&self) -> String {
        if self.failures.is_empty() {
            return "none".into();
        }
        self.failures
            .iter()
            .map(|(label, n)| format!("{label}: {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Result of a [`closed_loop`] run.
#[derive(Debug)]
pub struct ClosedLoopResult {
    /// Wall time from the first operation to the last completion.
    pub elapsed: Duration,
    /// Outcomes.
    pub tally: Tally,
    /// Per-operation service time, microseconds.
    pub latency: Histogram<u64>,
    /// True when the time limit stopped the run before all operations ran.
    pub hit_time_limit: bool,
}

impl ClosedLoopResult {
    /// Completed operations per second (successful or not).
    pub fn rate(&self) -> f64 {
        self.tally.total() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Successful operations per second.
    pub fn ok_rate(&self) -> f64 {
        self.tally.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs operations `0..n` with `concurrency` workers, each starting its next
/// operation when the previous one finished; stops early (without starting
/// new operations) once `time_limit` has passed. Operations must bound their
/// own duration (a timeout inside `op`).
pub async fn closed_loop<F, Fut>(
    n: u64,
    concurrency: usize,
    time_limit: Duration,
    op: F,
) -> ClosedLoopResult
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + time_limit;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let op = op.clone();
        let next = next.clone();
        workers.spawn(async move {
            let mut tally = Tally::default();
            let mut latency = latency_histogram();
            let mut stopped_by_time = false;
            loop {
                if Instant::now() >= deadline {
                    stopped_by_time = true;
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let t0 = Instant::now();
                let outcome = op(i).await;
                latency.saturating_record(micros(t0.elapsed()));
                tally.add(&outcome);
            }
            (tally, latency, stopped_by_time)
        });
    }
    let mut result = ClosedLoopResult {
        elapsed: Duration::ZERO,
        tally: Tally::default(),
        latency: latency_histogram(),
        hit_time_limit: false,
    };
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok((tally, latency, stopped_by_time)) => {
                result.tally.merge(&tally);
                let _ = result.latency.add(&latency);
                result.hit_time_limit |= stopped_by_time;
            }
            Err(_) => {
                *result
                    .tally
                    .failures
                    .entry("worker panicked".into())
                    .or_default() += 1
            }
        }
    }
    result.elapsed = start.elapsed();
    result
}

/// Result of an [`open_loop`] run.
#[derive(Debug)]
pub struct OpenLoopResult {
    /// Operations scheduled (rate × duration).
    pub scheduled: u64,
    /// Wall time from the first scheduled start to the last completion.
    pub elapsed: Duration,
    /// Outcomes.
    pub tally: Tally,
    /// Latency from each operation's *scheduled* start to its completion,
    /// microseconds (includes any delay in starting it).
    pub from_schedule: Histogram<u64>,
    /// Latency from the actual start to completion, microseconds.
    pub service: Histogram<u64>,
    /// Largest delay between a scheduled start and the actual start.
    pub max_start_lag: Duration,
    /// `from_schedule` latency split by the second (of the schedule) the
    /// operation was due in: shows whether a tail is spread out or one stall.
    pub per_second: Vec<Histogram<u64>>,
}

impl OpenLoopResult {
    /// Completed operations per second over the run.
    pub fn achieved_rate(&self) -> f64 {
        self.tally.total() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug)]
struct OpenLoopRecord {
    tally: Tally,
    from_schedule: Histogram<u64>,
    service: Histogram<u64>,
    max_start_lag: Duration,
    per_second: Vec<Histogram<u64>>,
}

/// Schedules operation `i` at `start + i / rate` for `duration`, with at most
/// `max_in_flight` outstanding (a saturated system delays further starts,
/// and that delay is counted in [`OpenLoopResult::from_schedule`]).
/// Operations must bound their own duration.
pub async fn open_loop<F, Fut>(
    rate: f64,
    duration: Duration,
    max_in_flight: usize,
    op: F,
) -> OpenLoopResult
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let rate = rate.max(1.0);
    let scheduled = (rate * duration.as_secs_f64()).round() as u64;
    let period = Duration::from_secs_f64(1.0 / rate);
    let op = Arc::new(op);
    let record = Arc::new(Mutex::new(OpenLoopRecord {
        tally: Tally::default(),
        from_schedule: latency_histogram(),
        service: latency_histogram(),
        max_start_lag: Duration::ZERO,
        per_second: (0..duration.as_secs_f64().ceil() as usize)
            .map(|_| latency_histogram())
            .collect(),
    }));
    let in_flight = Arc::new(Semaphore::new(max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    let start = Instant::now() + Duration::from_millis(20);
    for i in 0..scheduled {
        let at = start + period.mul_f64(i as f64);
        if Instant::now() < at {
            tokio::time::sleep_until(at).await;
        }
        // Only fails when the semaphore is closed, which it never is.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let op = op.clone();
        let record = record.clone();
        tasks.spawn(async move {
            let started = Instant::now();
            let outcome = op(i).await;
            let done = Instant::now();
            drop(permit);
            let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
            r.tally.add(&outcome);
            r.from_schedule.saturating_record(micros(done - at));
            r.service.saturating_record(micros(done - started));
            r.max_start_lag = r.max_start_lag.max(started - at);
            let second = usize::try_from((at - start).as_secs()).unwrap_or(usize::MAX);
            if let Some(h) = r.per_second.get_mut(second) {
                h.saturating_record(micros(done - at));
            }
        });
        // Reap finished tasks as we go so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed();
    let r = match Arc::try_unwrap(record) {
        Ok(m) => m.into_inner().unwrap_or_else(|e| e.into_inner()),
        // Every task was joined, so no clone is left; copy defensively anyway.
        Err(shared) => {
            let r = shared.lock().unwrap_or_else(|e| e.into_inner());
            OpenLoopRecord {
                tally: r.tally.clone(),
                from_schedule: r.from_schedule.clone(),
                service: r.service.clone(),
                max_start_lag: r.max_start_lag,
                per_second: r.per_second.clone(),
            }
        }
    };
    OpenLoopResult {
        scheduled,
        elapsed,
        tally: r.tally,
        from_schedule: r.from_schedule,
        service: r.service,
        max_start_lag: r.max_start_lag,
        per_second: r.per_second,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closed_loop_runs_every_operation_once() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let r = closed_loop(100, 7, Duration::from_secs(10), move |i| {
            let s = s.clone();
            async move {
                s.lock().unwrap_or_else(|e| e.into_inner()).push(i);
                if i % 10 == 0 {
                    Err("tenth".into())
                } else {
                    Ok(())
                }
            }
        })
        .await;
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
        assert_eq!(r.tally.ok, 90);
        assert_eq!(r.tally.failures.get("tenth"), Some(&10));
        assert_eq!(r.latency.len(), 100);
        assert!(!r.hit_time_limit);
    }

    #[tokio::test]
    async fn open_loop_schedules_rate_times_duration() {
        let r = open_loop(500.0, Duration::from_millis(200), 16, |_| async { Ok(()) }).await;
        assert_eq!(r.scheduled, 100);
        assert_eq!(r.tally.ok, 100);
        assert_eq!(r.from_schedule.len(), 100);
        assert_eq!(r.per_second.iter().map(Histogram::len).sum::<u64>(), 100);
        assert!(r.elapsed >= Duration::from_millis(190));
    }
}
