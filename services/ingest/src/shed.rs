//! Load shedding at the door: a bound on the deliveries in flight and on
//! the body memory they hold, so a flood (many large bodies, a frozen NATS
//! holding every request for the ack timeout, senders that trickle their
//! bodies) cannot grow ingest's memory without limit nor keep real
//! deliveries out.
//!
//! - A delivery is admitted only once what its headers can prove is
//!   checked (the GitLab token, the usage bearer, a well-formed GitHub
//!   signature header), so a sender without a credential holds nothing.
//! - Body bytes are counted as ingest takes them in (the buffer it holds),
//!   not as `Content-Length` declares them: a body that trickles in holds
//!   next to nothing, however large it says it is.
//! - A GitHub body cannot be judged before its last byte (the signature
//!   covers it). Such *unverified* bodies give way: one peer holds at most
//!   `max_unverified_per_peer` of them, and a newer delivery — from that
//!   peer, or from anyone while every slot is taken — cuts the oldest one
//!   short. A forge sends its body at once, so the oldest unverified body
//!   is the slowest sender's, and a real webhook always finds a place.
//!
//! A delivery that does not fit is answered `503` with `Retry-After` — the
//! forges and `runyard-report` retry — and nothing more of it is read.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// The in-flight budget of one ingest.
#[derive(Debug)]
pub struct Load {
    max_requests: usize,
    max_bytes: usize,
    max_unverified_per_peer: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Admissions so far: the key of the next one (keys grow with time, so
    /// the first entry is the oldest).
    next: u64,
    /// Bytes held by every delivery in flight.
    bytes: usize,
    /// The deliveries in flight, oldest first.
    entries: BTreeMap<u64, Entry>,
    /// Unverified deliveries in flight per peer.
    unverified: HashMap<IpAddr, usize>,
}

#[derive(Debug)]
struct Entry {
    peer: IpAddr,
    bytes: usize,
    /// Set while the body is unverified: cancelled when it must give way.
    cut: Option<CancellationToken>,
}

/// Why a delivery's body cannot be taken in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The budget is spent: 503, retry later.
    Full,
    /// An unverified body gave way to a newer delivery.
    Cut,
}

/// A delivery's share of the budget, given back when dropped.
#[derive(Debug)]
pub struct Admitted {
    load: Arc<Load>,
    key: u64,
    cut: CancellationToken,
}

impl Load {
    /// At most `max_requests` deliveries and `max_bytes` of body memory in
    /// flight, and at most `max_unverified_per_peer` unverified bodies per
    /// peer.
    pub fn new(max_requests: usize, max_bytes: usize, max_unverified_per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            max_requests: max_requests.max(1),
            max_bytes,
            max_unverified_per_peer: max_unverified_per_peer.max(1),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a delivery from `peer` whose body is `unverified` (its
    /// credential cannot be checked before the body is read), or `None`
    /// when every slot is held by a delivery that does not give way.
    /// Unverified bodies cut to make room are told through
    /// [`Admitted::cut`].
    pub fn try_admit(self: &Arc<Self>, peer: IpAddr, unverified: bool) -> Option<Admitted> {
        let peer = runyard_tls::peer_key(peer);
        let mut state = self.lock();
        if unverified {
            while state.unverified.get(&peer).copied().unwrap_or(0) >= self.max_unverified_per_peer
            {
                if !state.cut_oldest(Some(peer)) {
                    break;
                }
            }
        }
        while state.entries.len() >= self.max_requests {
            if !state.cut_oldest(None) {
                return None;
            }
        }
        let key = state.next;
        state.next += 1;
        let cut = CancellationToken::new();
        state.entries.insert(
            key,
            Entry {
                peer,
                bytes: 0,
                cut: unverified.then(|| cut.clone()),
            },
        );
        if unverified {
            *state.unverified.entry(peer).or_default() += 1;
        }
        Some(Admitted {
            load: self.clone(),
            key,
            cut,
        })
    }

    /// Deliveries and body bytes in flight now.
    pub fn in_flight(&self) -> (usize, usize) {
        let state = self.lock();
        (state.entries.len(), state.bytes)
    }
}

impl State {
    /// Cuts the oldest unverified delivery (of `peer`, or of anyone):
    /// false when there is none.
    fn cut_oldest(&mut self, peer: Option<IpAddr>) -> bool {
        let oldest = self
            .entries
            .iter()
            .find(|(_, e)| e.cut.is_some() && peer.is_none_or(|p| e.peer == p))
            .map(|(k, _)| *k);
        match oldest {
            Some(key) => {
                if let Some(entry) = self.remove(key)
                    && let Some(cut) = entry.cut
                {
                    cut.cancel();
                }
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, key: u64) -> Option<Entry> {
        let entry = self.entries.remove(&key)?;
        self.bytes = self.bytes.saturating_sub(entry.bytes);
        if entry.cut.is_some() {
            self.verified(entry.peer);
        }
        Some(entry)
    }

    /// One unverified body of `peer` fewer.
    fn verified(&mut self, peer: IpAddr) {
        if let Some(n) = self.unverified.get_mut(&peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.unverified.remove(&peer);
            }
        }
    }
}

impl Admitted {
    /// Holds `bytes` of body memory in all from now on (the buffer grew or
    /// is about to): refused when that would pass the budget — unless this
    /// delivery alone holds memory, so a body limit above the budget still
    /// lets large bodies through, one at a time — or when the body was cut.
    pub fn hold(&self, bytes: usize) -> Result<(), Refused> {
        let mut state = self.load.lock();
        let total = state.bytes;
        let Some(entry) = state.entries.get_mut(&self.key) else {
            return Err(Refused::Cut);
        };
        let others = total.saturating_sub(entry.bytes);
        if bytes > entry.bytes && others > 0 && others.saturating_add(bytes) > self.load.max_bytes {
            return Err(Refused::Full);
        }
        entry.bytes = bytes;
        state.bytes = others.saturating_add(bytes);
        Ok(())
    }

    /// The body checked out: it no longer gives way to newer deliveries.
    pub fn verified(&self) {
        let mut state = self.load.lock();
        let Some(entry) = state.entries.get_mut(&self.key) else {
            return;
        };
        if entry.cut.take().is_some() {
            let peer = entry.peer;
            state.verified(peer);
        }
    }

    /// Resolves when this (unverified) body was cut to make room.
    pub fn cut(&self) -> WaitForCancellationFutureOwned {
        self.cut.clone().cancelled_owned()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.load.lock().remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const A: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
    const B: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));

    fn is_cut(a: &Admitted) -> bool {
        a.cut.is_cancelled()
    }

    #[test]
    fn requests_and_bytes_are_both_bounded() {
        let load = Load::new(2, 100, 8);
        let a = load.try_admit(A, false).expect("first");
        a.hold(60).expect("fits");
        let b = load.try_admit(A, false).expect("second");
        assert_eq!(b.hold(50), Err(Refused::Full), "bytes");
        b.hold(40).expect("fits");
        assert!(load.try_admit(B, false).is_none(), "requests");
        drop(a);
        assert_eq!(load.in_flight(), (1, 40));
        // Alone, a body over the byte budget still goes through.
        b.hold(1000).expect("alone");
        drop(b);
        assert_eq!(load.in_flight(), (0, 0));
    }

    #[test]
    fn unverified_bodies_give_way_oldest_first() {
        let load = Load::new(3, 1000, 2);
        let slow1 = load.try_admit(A, true).expect("slow 1");
        let slow2 = load.try_admit(A, true).expect("slow 2");
        // A third from the same peer cuts that peer's oldest.
        let slow3 = load.try_admit(A, true).expect("slow 3");
        assert!(is_cut(&slow1) && !is_cut(&slow2));
        assert_eq!(slow1.hold(10), Err(Refused::Cut));
        // Another peer takes the last free slot; the next one, verified,
        // cuts the oldest unverified body of anyone.
        let other = load.try_admit(B, false).expect("free slot");
        let real = load.try_admit(B, false).expect("room made");
        assert!(is_cut(&slow2) && !is_cut(&slow3));
        // A verified body does not give way: with the last unverified one
        // checked out, every slot is held for good.
        slow3.verified();
        assert!(load.try_admit(B, true).is_none());
        assert!(!is_cut(&slow3));
        drop((other, real, slow3, slow1, slow2));
        assert_eq!(load.in_flight(), (0, 0));
        assert!(load.lock().unverified.is_empty());
    }
}
