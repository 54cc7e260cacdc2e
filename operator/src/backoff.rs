//! Per-object exponential backoff of failed reconciles: the first retry after 1 s, each
//! further failure doubling the wait up to a cap of 5 minutes. A success resets an object's
//! schedule; an object that is gone is forgotten, so the table holds only failing objects.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;

use crate::crd::McpServer;

/// First retry delay.
pub const INITIAL: Duration = Duration::from_secs(1);
/// Longest retry delay.
pub const CAP: Duration = Duration::from_secs(300);

/// Consecutive failures per object and the delay they earn.
#[derive(Debug)]
pub struct Backoff<K = ObjectRef<McpServer>> {
    initial: Duration,
    cap: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Hash + Eq> Default for Backoff<K> {
    fn default() -> Self {
        Self::new(INITIAL, CAP)
    }
}

impl<K: Hash + Eq> Backoff<K> {
    /// A schedule starting at `initial`, doubling up to `cap`.
    pub fn new(initial: Duration, cap: Duration) -> Self {
        Self {
            initial,
            cap,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<K, u32>> {
        // The table holds plain counters: one left by a panicking holder is still usable.
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The wait after the `n`th consecutive failure (`n` >= 1): `initial * 2^(n-1)`, at most `cap`.
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.cap)
    }

    /// Records one more failure of `key` and returns how long to wait before retrying it.
    pub fn fail(&self, key: K) -> Duration {
        let mut table = self.table();
        let n = table.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        self.delay(*n)
    }

    /// A success (or a deletion): the next failure of `key` starts the schedule again.
    pub fn reset(&self, key: &K) {
        self.table().remove(key);
    }

    /// Objects with failures on record.
    pub fn len(&self) -> usize {
        self.table().len()
    }

    /// Whether no object has failures on record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_one_second_to_a_five_minute_cap() {
        let b: Backoff<&str> = Backoff::default();
        let waits: Vec<u64> = (0..12).map(|_| b.fail("a").as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        // Far past the cap nothing overflows.
        assert_eq!(b.delay(u32::MAX), CAP);
        assert_eq!(b.delay(64), CAP);
    }

    #[test]
    fn objects_back_off_independently_and_a_success_resets_one() {
        let b: Backoff<&str> = Backoff::default();
        for _ in 0..3 {
            b.fail("a");
        }
        assert_eq!(b.fail("b"), Duration::from_secs(1), "b has its own schedule");
        assert_eq!(b.fail("a"), Duration::from_secs(8));
        b.reset(&"a");
        assert_eq!(b.len(), 1, "a success forgets the object");
        assert_eq!(b.fail("a"), Duration::from_secs(1), "and starts it over");
        b.reset(&"a");
        b.reset(&"b");
        assert!(b.is_empty());
    }
}
