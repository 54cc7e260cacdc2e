//! Sessions ended by `DELETE /mcp`, so that later requests carrying their id get 404.
//!
//! The transport keeps no other per-session state (any replica answers any request), so this
//! is the one thing a replica remembers about a session, and only on the replica that served
//! the DELETE: behind a Service of several replicas a client that keeps using an ended id may
//! still be answered by another replica (docs/protocol.md). Memory is bounded: the newest
//! [`MAX_ENDED`] ids are kept as keyed 64-bit hashes (the key is random per process, so
//! nobody can craft an id that collides with someone else's), older ones are forgotten.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use rustc_hash::FxHashSet;

/// Ended session ids remembered (about 24 bytes each).
pub const MAX_ENDED: usize = 65_536;

/// Recently ended session ids.
#[derive(Debug)]
pub struct EndedSessions {
    keys: std::collections::hash_map::RandomState,
    any: AtomicBool,
    inner: Mutex<Ended>,
    cap: usize,
}

#[derive(Debug, Default)]
struct Ended {
    set: FxHashSet<u64>,
    order: VecDeque<u64>,
}

impl Default for EndedSessions {
    fn default() -> Self {
        Self::with_capacity(MAX_ENDED)
    }
}

impl EndedSessions {
    /// Remembers at most `cap` ids.
    pub fn with_capacity(cap: usize) -> Self {
        Self {
            keys: std::collections::hash_map::RandomState::new(),
            any: AtomicBool::new(false),
            inner: Mutex::new(Ended::default()),
            cap: cap.max(1),
        }
    }

    /// Records that `id` ended; false when it had already ended.
    pub fn end(&self, id: &str) -> bool {
        let h = self.keys.hash_one(id);
        let Ok(mut e) = self.inner.lock() else {
            return false;
        };
        if !e.set.insert(h) {
            return false;
        }
        e.order.push_back(h);
        while e.order.len() > self.cap {
            if let Some(old) = e.order.pop_front() {
                e.set.remove(&old);
            }
        }
        self.any.store(true, Ordering::Release);
        true
    }

    /// Whether `id` was ended here (recently enough to be remembered). Sessionless requests
    /// and servers that never saw a DELETE take no lock.
    #[inline]
    pub fn ended(&self, id: &str) -> bool {
        if id.is_empty() || !self.any.load(Ordering::Acquire) {
            return false;
        }
        let h = self.keys.hash_one(id);
        self.inner.lock().is_ok_and(|e| e.set.contains(&h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_newest_ids_only() {
        let s = EndedSessions::with_capacity(2);
        assert!(!s.ended("a"));
        assert!(s.end("a"));
        assert!(!s.end("a"), "a second DELETE finds it ended");
        assert!(s.ended("a"));
        assert!(!s.ended("b"));
        s.end("b");
        s.end("c");
        assert!(!s.ended("a"), "the oldest is forgotten past the cap");
        assert!(s.ended("b") && s.ended("c"));
        assert!(!s.ended(""));
    }
}
