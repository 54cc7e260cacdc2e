//! Running cancellable work by (session, request id): what `notifications/cancelled` finds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

/// Running cancellable calls by (session, request id); the number tells apart two calls that
/// reuse one key, so the first to finish does not unregister the other.
type CancelMap = FxHashMap<(Box<str>, Box<str>), (u64, CancellationToken)>;

/// The cancellation registry of one server.
#[derive(Debug, Default)]
pub(super) struct Cancels {
    map: Arc<Mutex<CancelMap>>,
    next: AtomicU64,
}

impl Cancels {
    /// Registers `token` under (`session`, `id`) until the returned entry is dropped.
    pub(super) fn register(&self, session: &str, id: &RawValue, token: &CancellationToken) -> CancelEntry {
        let key = (Box::from(session), Box::from(id.get()));
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.map.lock() {
            m.insert(key.clone(), (seq, token.clone()));
        }
        CancelEntry {
            map: self.map.clone(),
            key,
            seq,
        }
    }

    /// Cancels the work registered under (`session`, `id`), if any.
    pub(super) fn cancel(&self, session: &str, id: &RawValue) {
        let key = (Box::from(session), Box::from(id.get()));
        if let Some((_, token)) = self.map.lock().ok().and_then(|mut m| m.remove(&key)) {
            token.cancel();
        }
    }

    /// Entries registered right now.
    pub(super) fn len(&self) -> usize {
        self.map.lock().map_or(0, |m| m.len())
    }
}

/// A registration, removed when dropped (unless newer work with the same key replaced it,
/// or a cancel already took it).
#[derive(Debug)]
pub(super) struct CancelEntry {
    map: Arc<Mutex<CancelMap>>,
    key: (Box<str>, Box<str>),
    seq: u64,
}

impl Drop for CancelEntry {
    fn drop(&mut self) {
        if let Ok(mut m) = self.map.lock()
            && m.get(&self.key).is_some_and(|(seq, _)| *seq == self.seq)
        {
            m.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).unwrap()
    }

    #[test]
    fn a_cancel_reaches_only_its_session_and_id_and_entries_unregister() {
        let c = Cancels::default();
        let (a, b) = (CancellationToken::new(), CancellationToken::new());
        let ea = c.register("s1", &id("1"), &a);
        let _eb = c.register("s2", &id("1"), &b);
        assert_eq!(c.len(), 2);
        c.cancel("s2", &id("2"));
        c.cancel("s3", &id("1"));
        assert!(!a.is_cancelled() && !b.is_cancelled());
        c.cancel("s2", &id("1"));
        assert!(b.is_cancelled() && !a.is_cancelled());
        drop(ea);
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn a_finished_call_does_not_unregister_a_newer_one_with_its_key() {
        let c = Cancels::default();
        let (old, new) = (CancellationToken::new(), CancellationToken::new());
        let e_old = c.register("s", &id("7"), &old);
        let _e_new = c.register("s", &id("7"), &new);
        drop(e_old);
        assert_eq!(c.len(), 1);
        c.cancel("s", &id("7"));
        assert!(new.is_cancelled() && !old.is_cancelled());
    }
}
