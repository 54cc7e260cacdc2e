//! Pinned tool definitions at run time (`pin: warn | enforce` of an upstream): the records
//! of the approved and pending definitions of each source, what each newly listed tool set
//! does to them, and which served names await approval (not listed, calls refused, under
//! `enforce`).
//!
//! The records are kept in memory, or in a ConfigMap ([`super::pin_store`]): until that is
//! read, an `enforce` upstream serves nothing (fail closed), and a source whose record cannot
//! be read serves nothing of its `enforce` tools either. Decisions are made while a registry
//! generation is built (never on the call path); a call pays nothing for pinning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use rustc_hash::FxHashMap;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::config::upstream::pin::{Seen, SourceRecord};

/// One source's record as read from the store.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Held {
    /// A record.
    Record(SourceRecord),
    /// Text that is not a record: nothing of the source is approved until it is fixed or
    /// the key deleted (which pins the definitions seen next).
    Unreadable,
}

/// Why a listed tool is not approved.
pub(super) const NEW: &str = "new since its upstream's definitions were approved";
pub(super) const CHANGED: &str = "its definition changed since it was approved";
const UNREAD: &str = "the pin record is not read yet";
const UNREADABLE: &str = "its upstream's pin record is not readable (fix or delete it)";

#[derive(Debug, Default)]
struct State {
    /// Every source's record; `None` until the store was read.
    records: Option<BTreeMap<String, Held>>,
    /// The latest tools listed by each pinned source, and whether the list was complete.
    seen: BTreeMap<String, (Arc<[Seen]>, bool)>,
    /// A record changed here since the last write to the store (every write merges every
    /// record, so which one changed does not matter).
    dirty: bool,
    /// Sources whose record the store held or this server wrote: a key of one of them that
    /// leaves the store was deleted (which pins afresh); of the others, it never got there,
    /// and what this server holds is kept and written.
    persisted: BTreeSet<String>,
    /// Pinned sources of the serving config.
    sources: BTreeSet<String>,
}

/// The approved digests of every source (`None`: an unreadable record).
fn approvals(records: &BTreeMap<String, Held>) -> BTreeMap<&str, Option<BTreeMap<&str, &str>>> {
    records
        .iter()
        .map(|(source, held)| {
            let approved = match held {
                Held::Record(r) => Some(
                    r.approved
                        .iter()
                        .map(|(k, p)| (k.as_str(), p.hash.as_str()))
                        .collect(),
                ),
                Held::Unreadable => None,
            };
            (source.as_str(), approved)
        })
        .collect()
}

/// What pinning decided for one upstream's listed tools.
#[derive(Debug, Default)]
pub(super) struct Verdict {
    /// Tools (names at the upstream) not approved, with why.
    pub unapproved: Vec<(String, &'static str)>,
    /// Definitions newly pending (counted as changes).
    pub changes: u64,
}

/// The pin records of a server and the served names awaiting approval.
#[derive(Debug)]
pub struct Pins {
    state: Mutex<State>,
    /// Served name to its upstream, for the tools `enforce` holds back.
    awaiting: ArcSwap<FxHashMap<String, String>>,
    /// Signalled when a record changed here (for the store).
    pub(super) flush: Notify,
    /// Where the records are kept (`None`: memory).
    store: Mutex<Option<String>>,
}

impl Default for Pins {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                records: Some(BTreeMap::new()),
                ..State::default()
            }),
            awaiting: ArcSwap::default(),
            flush: Notify::new(),
            store: Mutex::new(None),
        }
    }
}

impl Pins {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps the records in `store` (described for messages) from now on: nothing is
    /// approved until it was read ([`Self::loaded`]).
    pub fn use_store(&self, store: String) {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = Some(store);
        self.state().records = None;
    }

    /// The store's records, as read. A source this server holds a record of that never
    /// reached the store (its write failed or is pending) keeps it, to be written; a source
    /// whose key was deleted from the store is pinned afresh. Returns whether what is
    /// approved changed (the first read, an approval, a record deleted or made unreadable):
    /// only then is the registry rebuilt. A write of this server's own, or another
    /// replica's pending definitions, changes nothing served.
    pub(super) fn loaded(&self, mut records: BTreeMap<String, Held>) -> bool {
        let mut st = self.state();
        let mut unwritten = Vec::new();
        for (source, held) in st.records.iter().flatten() {
            if !records.contains_key(source) && !st.persisted.contains(source) {
                unwritten.push((source.clone(), held.clone()));
            }
        }
        st.persisted.extend(records.keys().cloned());
        let again = !unwritten.is_empty();
        st.dirty |= again;
        records.extend(unwritten);
        let changed = st
            .records
            .as_ref()
            .is_none_or(|before| approvals(before) != approvals(&records));
        st.records = Some(records);
        drop(st);
        if again {
            self.flush.notify_one();
        }
        changed
    }

    /// Records that `sources` were written to the store.
    pub(super) fn written(&self, sources: impl IntoIterator<Item = String>) {
        self.state().persisted.extend(sources);
    }

    /// Sets the pinned sources of the serving config.
    pub(super) fn set_sources(&self, sources: BTreeSet<String>) {
        self.state().sources = sources;
    }

    /// The pinned sources of the serving config.
    pub(super) fn sources(&self) -> BTreeSet<String> {
        self.state().sources.clone()
    }

    /// Decides which of `seen` (what `upstream` lists now) are approved, and updates the
    /// source's record: the first definitions of a source are approved, later new or
    /// changed ones are pending.
    pub(super) fn observe(&self, upstream: &str, seen: Vec<Seen>, complete: bool) -> Verdict {
        let persistent = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        let seen: Arc<[Seen]> = seen.into();
        let mut st = self.state();
        st.seen.insert(upstream.to_owned(), (Arc::clone(&seen), complete));
        let all = |why: &'static str| Verdict {
            unapproved: seen.iter().map(|s| (s.remote.clone(), why)).collect(),
            changes: 0,
        };
        let Some(records) = st.records.as_mut() else {
            return all(UNREAD);
        };
        let prev = match records.get(upstream) {
            Some(Held::Unreadable) => return all(UNREADABLE),
            Some(Held::Record(r)) => Some(r),
            None => None,
        };
        let next = SourceRecord::observe(prev, &seen, complete);
        let changes = next
            .pending
            .iter()
            .filter(|(k, p)| {
                prev.and_then(|r| r.pending.get(*k))
                    .is_none_or(|q| q.hash != p.hash)
            })
            .count() as u64;
        let unapproved = seen
            .iter()
            .filter(|s| !next.approves(&s.remote, &s.hash))
            .map(|s| {
                let known = prev.is_some_and(|r| r.approved.contains_key(&s.remote));
                (s.remote.clone(), if known { CHANGED } else { NEW })
            })
            .collect();
        if prev != Some(&next) {
            records.insert(upstream.to_owned(), Held::Record(next));
            if persistent {
                st.dirty = true;
                self.flush.notify_one();
            }
        }
        Verdict { unapproved, changes }
    }

    /// The served names `enforce` holds back now, with their upstreams.
    pub(super) fn set_awaiting(&self, awaiting: FxHashMap<String, String>) {
        self.awaiting.store(Arc::new(awaiting));
    }

    /// The upstream whose tool served as `name` awaits approval, if it does.
    pub fn awaiting(&self, name: &str) -> Option<String> {
        self.awaiting.load().get(name).cloned()
    }

    /// Whether a record changed since the last call (then the records are to be written).
    pub(super) fn take_dirty(&self) -> bool {
        std::mem::take(&mut self.state().dirty)
    }

    /// Writes the records again later (a write failed).
    pub(super) fn redirty(&self) {
        self.state().dirty = true;
    }

    /// The text `source`'s record should have in the store, given what the store holds
    /// (`text`), within `budget` bytes, or `None` when that is already it. A source this
    /// server saw listed is merged with what it lists; another is only kept within the
    /// budget; stored text that is unreadable is left for a person to fix.
    pub(super) fn merged(&self, source: &str, text: Option<&str>, budget: usize) -> Option<String> {
        let st = self.state();
        let prev = match text {
            None => None,
            Some(t) => Some(SourceRecord::decode(t)?),
        };
        let next = match (st.seen.get(source), prev) {
            (Some((seen, complete)), prev) => SourceRecord::observe(prev.as_ref(), seen, *complete),
            (None, Some(prev)) => prev,
            (None, None) => return None,
        };
        let encoded = next.encode(budget);
        (Some(encoded.as_str()) != text).then_some(encoded)
    }

    /// Every record, for `GET /pins` (definitions included).
    pub fn report(&self) -> Value {
        let st = self.state();
        let store = self.store.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let sources: serde_json::Map<String, Value> = st
            .records
            .iter()
            .flatten()
            .map(|(k, held)| {
                let v = match held {
                    Held::Record(r) => serde_json::to_value(r).unwrap_or_default(),
                    Held::Unreadable => json!({"unreadable": true}),
                };
                (k.clone(), v)
            })
            .collect();
        json!({
            "store": store.unwrap_or_else(|| "memory".into()),
            "read": st.records.is_some(),
            "sources": sources,
            "awaiting": &**self.awaiting.load(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, description: &str) -> Seen {
        Seen::of(name, &json!({"name": name, "description": description}))
    }

    #[test]
    fn memory_records_approve_first_then_hold_changes() {
        let pins = Pins::default();
        let v = pins.observe("gh", vec![seen("a", "one")], true);
        assert!(v.unapproved.is_empty());
        let v = pins.observe("gh", vec![seen("a", "two"), seen("b", "new")], true);
        assert_eq!(v.unapproved, [("a".to_owned(), CHANGED), ("b".to_owned(), NEW)]);
        assert_eq!(v.changes, 2);
        // Seen again: nothing new counted.
        let v = pins.observe("gh", vec![seen("a", "two"), seen("b", "new")], true);
        assert_eq!((v.unapproved.len(), v.changes), (2, 0));
        // Changed back: served again.
        let v = pins.observe("gh", vec![seen("a", "one")], true);
        assert!(v.unapproved.is_empty());
        assert!(!pins.take_dirty(), "memory records are never written");
    }

    #[test]
    fn a_store_not_read_or_unreadable_approves_nothing() {
        let pins = Pins::default();
        pins.use_store("configmap:ns/x-pins".into());
        let v = pins.observe("gh", vec![seen("a", "one")], true);
        assert_eq!(v.unapproved, [("a".to_owned(), UNREAD)]);
        pins.loaded(BTreeMap::from([("gh".to_owned(), Held::Unreadable)]));
        let v = pins.observe("gh", vec![seen("a", "one")], true);
        assert_eq!(v.unapproved, [("a".to_owned(), UNREADABLE)]);
        // A readable store: first seen approved, and the record is to be written.
        pins.loaded(BTreeMap::new());
        assert!(
            pins.observe("gh", vec![seen("a", "one")], true)
                .unapproved
                .is_empty()
        );
        assert!(pins.take_dirty());
        let text = pins.merged("gh", None, 4096).expect("a record to write");
        assert_eq!(pins.merged("gh", Some(&text), 4096), None, "written once");
        assert_eq!(
            pins.merged("gh", Some("not json"), 4096),
            None,
            "unreadable text is left alone"
        );
        // Another replica (or an approval) wrote meanwhile: merged on top of it.
        let mut other = SourceRecord::decode(&text).unwrap();
        other.approved.clear();
        let theirs = serde_json::to_string(&other).unwrap();
        let merged = SourceRecord::decode(&pins.merged("gh", Some(&theirs), 4096).unwrap()).unwrap();
        assert_eq!(merged.pending.keys().collect::<Vec<_>>(), ["a"]);
        // A source this server never saw listed is only kept within the budget.
        let big = SourceRecord::observe(
            None,
            &(0..50)
                .map(|i| seen(&format!("t{i}"), &"x".repeat(500)))
                .collect::<Vec<_>>(),
            true,
        );
        let shrunk = pins
            .merged("other", Some(&serde_json::to_string(&big).unwrap()), 4096)
            .unwrap();
        assert!(shrunk.len() <= 4096);
        assert_eq!(pins.merged("nothing", None, 4096), None);
    }

    #[test]
    fn only_a_change_of_what_is_approved_asks_for_a_rebuild() {
        let pins = Pins::default();
        pins.use_store("configmap:ns/x-pins".into());
        let read = |text: &str| {
            BTreeMap::from([("gh".to_owned(), Held::Record(SourceRecord::decode(text).unwrap()))])
        };
        assert!(pins.loaded(BTreeMap::new()), "the first read");
        assert!(
            pins.observe("gh", vec![seen("a", "one")], true)
                .unapproved
                .is_empty()
        );
        let ours = pins.merged("gh", None, 4096).unwrap();
        // This server's own write comes back through the watch: nothing to rebuild.
        assert!(!pins.loaded(read(&ours)));
        // Another replica records a pending definition: nothing served changes either.
        let v = pins.observe("gh", vec![seen("a", "two")], true);
        assert_eq!(v.unapproved.len(), 1);
        let pending = pins.merged("gh", Some(&ours), 4096).unwrap();
        assert!(!pins.loaded(read(&pending)));
        // An approval does.
        let mut approved = SourceRecord::decode(&pending).unwrap();
        assert_eq!(approved.approve(&[]), ["a"]);
        assert!(pins.loaded(read(&serde_json::to_string(&approved).unwrap())));
        // So does a record made unreadable.
        assert!(pins.loaded(BTreeMap::from([("gh".to_owned(), Held::Unreadable)])));
    }

    #[test]
    fn a_record_that_never_reached_the_store_is_not_trusted_afresh() {
        let pins = Pins::default();
        pins.use_store("configmap:ns/x-pins".into());
        pins.loaded(BTreeMap::new());
        assert!(
            pins.observe("gh", vec![seen("a", "one")], true)
                .unapproved
                .is_empty()
        );
        let _ = pins.take_dirty();
        // Its write failed; then another write to the ConfigMap (or a restart of the watch)
        // shows a store without it: the definitions approved here are kept, not replaced by
        // whatever the upstream lists now.
        pins.loaded(BTreeMap::new());
        let v = pins.observe("gh", vec![seen("a", "rug pulled")], true);
        assert_eq!(v.unapproved, [("a".to_owned(), CHANGED)]);
        assert!(pins.take_dirty());
        // Once written, a key deleted from the store pins afresh (deliberately).
        pins.written(["gh".to_owned()]);
        pins.loaded(BTreeMap::new());
        assert!(
            pins.observe("gh", vec![seen("a", "rug pulled")], true)
                .unapproved
                .is_empty()
        );
    }
}
