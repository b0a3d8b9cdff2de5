//! Repeating a measured run that other work sharing the machine disturbed.

/// The attempts at one measured run. The first one that other work did
/// not disturb is kept; when every attempt was disturbed, the least
/// disturbed one is.
#[derive(Debug)]
pub struct Attempts<T> {
    /// Other load (cores) above which a run counts as disturbed.
    max_other: f64,
    /// Attempts at most.
    max: u32,
    tries: Vec<(f64, T)>,
}

impl<T> Attempts<T> {
    /// At most `max` attempts; a run during which other work kept more than
    /// `max_other` cores busy is repeated.
    pub fn new(max_other: f64, max: u32) -> Self {
        Self {
            max_other,
            max,
            tries: Vec::new(),
        }
    }

    /// The number of the attempt about to run (1-based).
    pub fn next_number(&self) -> u32 {
        u32::try_from(self.tries.len())
            .unwrap_or(u32::MAX)
            .saturating_add(1)
    }

    /// Records an attempt during which other work kept `other` cores busy;
    /// true when no further attempt is needed (says on stderr why not).
    pub fn record(&mut self, other: f64, value: T) -> bool {
        self.tries.push((other, value));
        let n = self.next_number() - 1;
        if other <= self.max_other {
            return true;
        }
        if n >= self.max {
            eprintln!(
                "  other work used {other:.2} cores; all {n} attempts disturbed, keeping the least disturbed"
            );
            return true;
        }
        eprintln!(
            "  other work used {other:.2} cores during the run; repeating it (attempt {n} of {})",
            self.max
        );
        false
    }

    /// The kept attempt, its number, its other load, and the rest.
    ///
    /// # Panics
    ///
    /// Without a [`record`](Self::record)ed attempt.
    pub fn finish(self) -> (T, u32, f64, Vec<T>) {
        let best = self
            .tries
            .iter()
            .enumerate()
            .min_by(|a, b| a.1.0.total_cmp(&b.1.0))
            .map_or(0, |(i, _)| i);
        let mut kept = None;
        let mut rest = Vec::new();
        for (i, (other, value)) in self.tries.into_iter().enumerate() {
            if i == best {
                kept = Some((value, u32::try_from(i + 1).unwrap_or(u32::MAX), other));
            } else {
                rest.push(value);
            }
        }
        #[allow(clippy::expect_used)] // documented
        let (value, number, other) = kept.expect("at least one attempt");
        (value, number, other, rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_quiet_or_the_least_disturbed_attempt() {
        let mut a = Attempts::new(0.25, 3);
        assert_eq!(a.next_number(), 1);
        assert!(!a.record(0.9, "first"));
        assert!(a.record(0.1, "second"));
        assert_eq!(a.finish(), ("second", 2, 0.1, vec!["first"]));

        let mut a = Attempts::new(0.25, 3);
        assert!(!a.record(0.9, 1));
        assert!(!a.record(0.5, 2));
        assert!(a.record(0.7, 3));
        assert_eq!(a.finish(), (2, 2, 0.5, vec![1, 3]));
    }
}
