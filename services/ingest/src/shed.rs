//! Load shedding at the door: a bound on the deliveries in flight and on
//! the body bytes they may hold, so a flood (many large bodies, a frozen
//! NATS holding every request for the ack timeout) cannot grow ingest's
//! memory without limit. A delivery that does not fit is answered `503`
//! with `Retry-After` at once — the forges and `runyard-report` retry — and
//! nothing of it is read.

use std::sync::{Arc, Mutex, PoisonError};

/// The in-flight budget of one ingest.
#[derive(Debug)]
pub struct Load {
    max_requests: usize,
    max_bytes: usize,
    /// (requests, bytes) in flight.
    used: Mutex<(usize, usize)>,
}

/// A delivery's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    load: Arc<Load>,
    bytes: usize,
}

impl Load {
    /// At most `max_requests` deliveries and `max_bytes` of body bytes in
    /// flight.
    pub fn new(max_requests: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            max_requests: max_requests.max(1),
            max_bytes,
            used: Mutex::new((0, 0)),
        })
    }

    /// Admits a delivery of up to `bytes` body bytes, or `None` when that
    /// would pass either bound. A delivery alone is always admitted, so a
    /// body limit above the byte budget still lets large bodies through, one
    /// at a time.
    pub fn try_admit(self: &Arc<Self>, bytes: usize) -> Option<Admitted> {
        let mut used = self.used.lock().unwrap_or_else(PoisonError::into_inner);
        let (requests, held) = *used;
        let fits = requests < self.max_requests
            && (requests == 0 || held.saturating_add(bytes) <= self.max_bytes);
        if !fits {
            return None;
        }
        *used = (requests + 1, held.saturating_add(bytes));
        Some(Admitted {
            load: self.clone(),
            bytes,
        })
    }

    /// Deliveries and body bytes in flight now.
    pub fn in_flight(&self) -> (usize, usize) {
        *self.used.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut used = self
            .load
            .used
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        used.0 = used.0.saturating_sub(1);
        used.1 = used.1.saturating_sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_bytes_are_both_bounded() {
        let load = Load::new(2, 100);
        let a = load.try_admit(60).expect("first");
        assert!(load.try_admit(50).is_none(), "bytes");
        let b = load.try_admit(40).expect("fits");
        assert!(load.try_admit(0).is_none(), "requests");
        drop(a);
        assert_eq!(load.in_flight(), (1, 40));
        drop(b);
        // Alone, a body over the byte budget still goes through.
        let big = load.try_admit(1000).expect("alone");
        assert!(load.try_admit(1).is_none());
        drop(big);
        assert_eq!(load.in_flight(), (0, 0));
    }
}
