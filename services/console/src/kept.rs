//! Savings kept for windows whose sums take long on this site.
//!
//! The savings over a month read every usage report, started job and
//! runner of the month: on a busy site (500,000 jobs) that is seconds of
//! Postgres however it is indexed (docs/benchmarks.md, "Console"). A
//! window whose sums took longer than [`SLOW`] is kept: the page shows the
//! kept figures with the time they were computed, and once they are older
//! than [`FRESH`] the next view has them computed again in the background
//! (one computation per window at a time) while it still shows the kept
//! ones. A window computed faster is never kept: a small site sees every
//! report the moment it is projected.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use runyard_insight::InsightError;
use runyard_insight::savings::Savings;

use crate::Inner;

/// Sums that take longer than this are kept (the pages' target).
pub const SLOW: Duration = Duration::from_millis(200);
/// Kept sums are computed again when a view finds them older than this.
pub const FRESH: Duration = Duration::from_secs(60);
/// Windows kept at most (any `since` can be asked for).
const MAX_WINDOWS: usize = 16;

/// The kept savings, by window.
#[derive(Debug, Default)]
pub struct Kept {
    windows: Mutex<HashMap<u64, Entry>>,
}

#[derive(Debug, Clone)]
struct Entry {
    savings: Arc<Savings>,
    /// When they were computed.
    at: time::OffsetDateTime,
    computed: Instant,
    took: Duration,
    refreshing: bool,
}

/// Savings as a page shows them.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The figures.
    pub savings: Arc<Savings>,
    /// For kept figures: when they were computed and how long that took.
    pub kept: Option<(time::OffsetDateTime, Duration)>,
}

impl Kept {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Entry>> {
        self.windows.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The savings over `window`: kept ones when that window is slow to sum
/// up (computed again in the background once stale), else computed now.
pub async fn savings(state: &Arc<Inner>, window: Duration) -> Result<Answer, InsightError> {
    let key = window.as_secs();
    let (kept, refresh) = {
        let mut windows = state.kept.lock();
        match windows.get_mut(&key) {
            Some(e) => {
                let refresh = e.computed.elapsed() >= FRESH && !e.refreshing;
                e.refreshing |= refresh;
                (
                    Some(Answer {
                        savings: e.savings.clone(),
                        kept: Some((e.at, e.took)),
                    }),
                    refresh,
                )
            }
            None => (None, false),
        }
    };
    match kept {
        Some(answer) => {
            if refresh {
                let state = state.clone();
                tokio::spawn(async move {
                    if let Err(error) = compute(&state, window).await {
                        tracing::warn!(%error, window = ?window, "kept savings not computed again");
                    }
                });
            }
            Ok(answer)
        }
        None => compute(state, window).await.map(|savings| Answer {
            savings,
            kept: None,
        }),
    }
}

/// Computes the savings over `window` and keeps them when that was slow.
pub async fn compute(state: &Inner, window: Duration) -> Result<Arc<Savings>, InsightError> {
    let key = window.as_secs();
    let at = time::OffsetDateTime::now_utc();
    let started = Instant::now();
    let found = runyard_insight::savings::savings(&state.db, &state.savings_query(window)).await;
    let took = started.elapsed();
    let mut windows = state.kept.lock();
    match found {
        Ok(savings) => {
            let savings = Arc::new(savings);
            if took >= SLOW {
                if windows.len() >= MAX_WINDOWS
                    && !windows.contains_key(&key)
                    && let Some(oldest) = windows
                        .iter()
                        .min_by_key(|(_, e)| e.computed)
                        .map(|(k, _)| *k)
                {
                    windows.remove(&oldest);
                }
                windows.insert(
                    key,
                    Entry {
                        savings: savings.clone(),
                        at,
                        computed: started,
                        took,
                        refreshing: false,
                    },
                );
            } else {
                windows.remove(&key);
            }
            Ok(savings)
        }
        Err(e) => {
            if let Some(entry) = windows.get_mut(&key) {
                entry.refreshing = false;
            }
            Err(e)
        }
    }
}
