//! Back-off between attempts, and the shutdown rule every wait obeys: once
//! shutdown is asked for, a consumer keeps retrying the batch in hand for a
//! bounded grace period, then gives up without acknowledging it (JetStream
//! redelivers it, to this process's successor or another replica).

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// First delay of a back-off.
const MIN_DELAY: Duration = Duration::from_millis(100);
/// Longest delay before jitter (jitter adds up to as much again).
const MAX_DELAY: Duration = Duration::from_secs(5);

/// A fresh capped exponential back-off with jitter. The jitter is seeded per
/// back-off: `backon` without its `std` feature would seed every process
/// alike, and replicas retrying in step is what jitter is for avoiding.
pub(crate) fn backoff() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(MIN_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .with_jitter_seed(rand::random())
        .without_max_times()
        .build()
}

/// Waits between attempts that observe a shutdown token.
#[derive(Debug)]
pub(crate) struct Grace {
    shutdown: CancellationToken,
    grace: Duration,
    /// When the attempts must stop: set once shutdown is seen.
    deadline: Option<Instant>,
}

impl Grace {
    /// Waits that stop retrying `grace` after `shutdown` is cancelled.
    pub(crate) fn new(shutdown: CancellationToken, grace: Duration) -> Self {
        Self {
            shutdown,
            grace,
            deadline: None,
        }
    }

    /// Waits the next delay of `backoff` before another attempt. `false`
    /// means give up now: shutdown was asked for and the grace period is
    /// over. A shutdown during the wait ends the wait early, so one more
    /// attempt runs at once (it may succeed and let the batch be acked).
    pub(crate) async fn pause(&mut self, backoff: &mut ExponentialBackoff) -> bool {
        let delay = backoff.next().unwrap_or(MAX_DELAY);
        if self.deadline.is_none() && self.shutdown.is_cancelled() {
            self.deadline = Some(Instant::now() + self.grace);
        }
        match self.deadline {
            Some(deadline) => {
                if Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep_until((Instant::now() + delay).min(deadline)).await;
                true
            }
            None => {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = self.shutdown.cancelled() => {
                        self.deadline = Some(Instant::now() + self.grace);
                    }
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_with_jitter_up_to_a_cap() {
        let delays: Vec<Duration> = backoff().take(12).collect();
        assert!(delays[0] >= MIN_DELAY && delays[0] <= MIN_DELAY * 2);
        assert!(delays.iter().all(|d| *d <= MAX_DELAY * 2), "{delays:?}");
        assert!(delays[11] >= MAX_DELAY, "{delays:?}");
        // Two back-offs do not retry in step.
        let (a, b): (Vec<_>, Vec<_>) = (backoff().take(8).collect(), backoff().take(8).collect());
        assert_ne!(a, b);
    }

    #[tokio::test(start_paused = true)]
    async fn without_shutdown_it_keeps_waiting() {
        let mut grace = Grace::new(CancellationToken::new(), Duration::from_secs(1));
        let mut b = backoff();
        let start = Instant::now();
        for _ in 0..20 {
            assert!(grace.pause(&mut b).await);
        }
        assert!(start.elapsed() > Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_cuts_a_wait_short_then_allows_only_the_grace_period() {
        let token = CancellationToken::new();
        let mut grace = Grace::new(token.clone(), Duration::from_secs(10));
        let mut b = backoff();
        // Long delays already.
        for _ in 0..8 {
            b.next();
        }
        let cancel = {
            let token = token.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                token.cancel();
            })
        };
        let start = Instant::now();
        assert!(
            grace.pause(&mut b).await,
            "a shutdown mid-wait allows one more attempt"
        );
        assert_eq!(start.elapsed(), Duration::from_millis(50));
        cancel.await.unwrap_or_default();
        let mut waits = 0;
        while grace.pause(&mut b).await {
            waits += 1;
        }
        assert!(waits >= 1);
        assert_eq!(
            start.elapsed(),
            Duration::from_millis(50) + Duration::from_secs(10)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_before_the_first_wait_still_grants_the_grace_period() {
        let token = CancellationToken::new();
        token.cancel();
        let mut grace = Grace::new(token, Duration::from_secs(2));
        let mut b = backoff();
        let start = Instant::now();
        while grace.pause(&mut b).await {}
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
