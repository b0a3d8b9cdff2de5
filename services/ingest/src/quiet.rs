//! Repeated warnings, aggregated: during an outage every delivery is
//! refused the same way, and one WARN line per delivery (thousands a
//! second) buries everything else. A [`Quiet`] lets the first line of a kind
//! through, then at most one per window, carrying how many of the same kind
//! it stood for (`suppressed`); the metrics still count every one.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often a warning of one kind may be logged.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Per-kind rate limit of warning lines.
#[derive(Debug, Default)]
pub struct Quiet {
    kinds: Mutex<HashMap<&'static str, Kind>>,
}

#[derive(Debug)]
struct Kind {
    last: Instant,
    suppressed: u64,
}

impl Quiet {
    /// Whether a warning of `kind` should be logged now; `Some(n)` with the
    /// number of warnings of that kind left out since the last one logged.
    pub fn admit(&self, kind: &'static str) -> Option<u64> {
        let now = Instant::now();
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match kinds.get_mut(kind) {
            None => {
                kinds.insert(
                    kind,
                    Kind {
                        last: now,
                        suppressed: 0,
                    },
                );
                Some(0)
            }
            Some(k) if now.duration_since(k.last) >= WINDOW => {
                let suppressed = k.suppressed;
                k.last = now;
                k.suppressed = 0;
                Some(suppressed)
            }
            Some(k) => {
                k.suppressed += 1;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_window_counting_the_rest() {
        let q = Quiet::default();
        assert_eq!(q.admit("unavailable"), Some(0));
        for _ in 0..16_881 {
            assert_eq!(q.admit("unavailable"), None);
        }
        // Another kind has its own window.
        assert_eq!(q.admit("unauthorized"), Some(0));
        tokio::time::advance(WINDOW).await;
        assert_eq!(q.admit("unavailable"), Some(16_881));
        assert_eq!(q.admit("unavailable"), None);
        tokio::time::advance(WINDOW).await;
        assert_eq!(q.admit("unavailable"), Some(1));
    }
}
