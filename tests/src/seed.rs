//! The seed of a randomized test: taken from an environment variable so a
//! failing run can be replayed, otherwise from the clock.

use std::time::{SystemTime, UNIX_EPOCH};

/// The seed in `var` when it holds a number, else one from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    seed_from(std::env::var(var).ok().as_deref())
}

fn seed_from(value: Option<&str>) -> u64 {
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    })
}

/// A xorshift generator: small, seedable and dependency-free, for
/// schedules a seed replays; not for statistical quality.
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (made odd: xorshift never leaves zero).
    pub fn new(seed: u64) -> XorShift {
        XorShift(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_replayed_as_given() {
        assert_eq!(seed_from(Some("12345")), 12345);
        assert_eq!(seed_from(Some("0")), 0);
    }

    #[test]
    fn anything_else_takes_a_seed_from_the_clock() {
        // Nanoseconds since 1970 are far above any small replayed seed.
        assert!(seed_from(None) > 1_000_000);
        assert!(seed_from(Some("not a number")) > 1_000_000);
    }
}
