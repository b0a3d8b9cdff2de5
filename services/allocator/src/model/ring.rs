//! The last few of something: a fixed-size record whose oldest entry the
//! newest overwrites.

use std::ops::Deref;

/// The last `keep` entries pushed, in no particular order.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Ring<T> {
    entries: Vec<T>,
    keep: usize,
    /// Where the next entry goes once `keep` are in.
    next: usize,
}

impl<T> Ring<T> {
    pub(super) fn new(keep: usize) -> Self {
        Self {
            entries: Vec::new(),
            keep,
            next: 0,
        }
    }

    /// Keeps `entry`, in place of the oldest once the ring is full.
    pub(super) fn push(&mut self, entry: T) {
        if self.entries.len() < self.keep {
            self.entries.push(entry);
        } else if self.keep > 0 {
            self.entries[self.next] = entry;
            self.next = (self.next + 1) % self.keep;
        }
    }
}

impl<T> Deref for Ring<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_replace_the_oldest() {
        let mut ring = Ring::new(3);
        for i in 0..5 {
            ring.push(i);
        }
        let mut kept = ring.to_vec();
        kept.sort_unstable();
        assert_eq!(kept, [2, 3, 4]);
        ring.push(5);
        let mut kept = ring.to_vec();
        kept.sort_unstable();
        assert_eq!(kept, [3, 4, 5]);
    }
}
