//! How often one caller may ask about its tasks (`tasks/get`, `tasks/cancel`, `tasks/list`,
//! `tasks/result`): a token bucket per task owner, in a bounded map, so that a client polling
//! in a tight loop is told to slow down instead of taking the store's lock at its own pace.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

/// Task requests one caller may make per second, sustained.
pub(super) const RATE: f64 = 20.0;
/// Task requests one caller may make at once after a pause.
pub(in crate::dispatch) const BURST: f64 = 40.0;
/// Callers tracked at once; past it, idle ones are forgotten (a full bucket is no state).
pub(super) const MAX_CALLERS: usize = 8192;

/// A wait as the whole milliseconds a client is told to wait (rounded up: a client that waits
/// what it is told is served), at least 1.
pub(super) fn retry_ms(wait: Duration) -> u64 {
    u64::try_from(wait.as_micros().div_ceil(1000))
        .unwrap_or(u64::MAX)
        .max(1)
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The task-request budgets of one server.
#[derive(Debug)]
pub(in crate::dispatch) struct Polls {
    rate: f64,
    burst: f64,
    max: usize,
    map: Mutex<FxHashMap<Box<str>, Bucket>>,
}

impl Default for Polls {
    fn default() -> Self {
        Self::new(RATE, BURST, MAX_CALLERS)
    }
}

impl Polls {
    pub(super) fn new(rate: f64, burst: f64, max: usize) -> Self {
        Self {
            rate,
            burst,
            max,
            map: Mutex::new(FxHashMap::default()),
        }
    }

    /// Takes one request of `owner`'s budget, or tells how long until it has one.
    pub(super) fn take(&self, owner: &str) -> Result<(), Duration> {
        self.take_at(owner, Instant::now())
    }

    fn take_at(&self, owner: &str, now: Instant) -> Result<(), Duration> {
        let Ok(mut map) = self.map.lock() else {
            return Ok(());
        };
        if !map.contains_key(owner) && map.len() >= self.max {
            // Those whose bucket refilled are no different from callers never seen.
            let (rate, burst) = (self.rate, self.burst);
            map.retain(|_, b| b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst);
            if map.len() >= self.max {
                // Every tracked caller is busy: this one is let through untracked rather
                // than refused for others' load.
                return Ok(());
            }
        }
        let b = map.entry(owner.into()).or_insert(Bucket {
            tokens: self.burst,
            at: now,
        });
        let refilled = b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * self.rate;
        b.tokens = refilled.min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - b.tokens) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_a_wait_that_is_long_enough() {
        let p = Polls::new(10.0, 3.0, 16);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(p.take_at("a", t0).is_ok());
        }
        let wait = p.take_at("a", t0).unwrap_err();
        assert!(
            wait > Duration::from_millis(90) && wait <= Duration::from_millis(100),
            "{wait:?}"
        );
        // Another caller has its own budget.
        assert!(p.take_at("b", t0).is_ok());
        // After the wait told, one more.
        assert!(p.take_at("a", t0 + wait).is_ok());
        assert!(p.take_at("a", t0 + wait).is_err());
    }

    #[test]
    fn a_caller_that_waits_the_milliseconds_it_is_told_is_served() {
        let p = Polls::new(20.0, 1.0, 16);
        let t0 = Instant::now();
        p.take_at("a", t0).unwrap();
        // 49.7 ms to go: told 50, never 49.
        let wait = p.take_at("a", t0 + Duration::from_micros(300)).unwrap_err();
        let ms = retry_ms(wait);
        assert_eq!(ms, 50, "{wait:?}");
        assert!(
            p.take_at("a", t0 + Duration::from_micros(300) + Duration::from_millis(ms))
                .is_ok()
        );
        assert_eq!(retry_ms(Duration::ZERO), 1);
        assert_eq!(retry_ms(Duration::from_millis(7)), 7);
    }

    #[test]
    fn the_map_stays_bounded_and_forgets_idle_callers_first() {
        let p = Polls::new(10.0, 2.0, 4);
        let t0 = Instant::now();
        for i in 0..4 {
            p.take_at(&format!("c{i}"), t0).unwrap();
            p.take_at(&format!("c{i}"), t0).unwrap();
        }
        // All four busy: a fifth goes through untracked.
        assert!(p.take_at("late", t0).is_ok());
        assert_eq!(p.map.lock().unwrap().len(), 4);
        // Once refilled they are forgotten and the newcomer is tracked.
        let later = t0 + Duration::from_secs(1);
        assert!(p.take_at("late", later).is_ok());
        assert_eq!(p.map.lock().unwrap().len(), 1);
        assert!(p.take_at("late", later).is_ok());
        assert!(p.take_at("late", later).is_err());
    }
}
