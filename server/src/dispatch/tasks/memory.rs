//! The tasks of one replica, in its memory: by id, each owned by the caller that created it,
//! bounded per caller, for callers without credentials together, and in total, forgotten
//! after a TTL. A task ends with the process that runs it.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use rustc_hash::FxHashMap;
use serde_json::{Map, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::task::{
    MAX_TASK_ID, Quota, Refused, Status, TaskBounds, TaskView, UpdateError, checked, mint, within_bounds,
};

/// The end of a task, to wait for.
#[derive(Debug)]
pub(super) struct Finished(tokio::sync::watch::Receiver<bool>);

impl Finished {
    /// Waits until the task is terminal, or forgotten (its TTL ended).
    pub(super) async fn wait(mut self) {
        let _ = self.0.wait_for(|done| *done).await;
    }
}

#[derive(Debug)]
struct Entry {
    owner: Box<str>,
    /// Whose bounds it counts against ([`Quota::key`]).
    quota: Box<str>,
    /// Its caller has no credentials.
    anonymous: bool,
    status: Status,
    created: SystemTime,
    updated: SystemTime,
    expires: Instant,
    token: CancellationToken,
    /// The JSON size of its result, or while it waits for input of the answers it holds.
    size: usize,
    /// The answers gathered for its run while it waits for more.
    answers: Map<String, Value>,
    /// Resumes its run with every answer once the last pending question is answered.
    resume: Option<oneshot::Sender<Map<String, Value>>>,
    /// How long it is kept after its creation (the store's TTL, or a shorter one asked for).
    ttl: Duration,
    /// Its place in creation order (`tasks/list` pages by it).
    seq: u64,
    /// Turns `true` when it reaches a terminal status (what `tasks/result` waits on).
    done: tokio::sync::watch::Sender<bool>,
}

/// The tasks of one replica, in its memory, under one lock.
#[derive(Debug)]
pub(super) struct MemoryTasks {
    bounds: TaskBounds,
    map: Mutex<FxHashMap<Box<str>, Entry>>,
    /// The next task's [`Entry::seq`].
    next_seq: std::sync::atomic::AtomicU64,
}

impl MemoryTasks {
    pub(super) fn new(bounds: TaskBounds) -> Self {
        MemoryTasks {
            bounds,
            map: Mutex::new(FxHashMap::default()),
            next_seq: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn view(&self, id: &str, e: &Entry) -> TaskView {
        TaskView {
            id: id.to_owned(),
            status: e.status.clone(),
            created: e.created,
            updated: e.updated,
            ttl: e.ttl,
            poll_interval: self.bounds.poll_interval,
        }
    }

    /// Forgets expired tasks (cancelling any still running).
    fn purge(map: &mut FxHashMap<Box<str>, Entry>, now: Instant) {
        map.retain(|_, e| {
            let keep = e.expires > now;
            if !keep {
                e.token.cancel();
            }
            keep
        });
    }

    /// A working task of `owner`, counted against its own bounds, kept for the store's TTL.
    #[cfg(test)]
    fn create(&self, owner: &str, token: CancellationToken) -> Result<TaskView, Refused> {
        self.create_for(owner, &Quota::caller(owner), token, self.bounds.ttl)
    }

    /// Creates a working task of `owner` within the bounds of `quota`, cancelled through
    /// `token`, kept for `ttl` (at most the store's TTL).
    pub(super) fn create_for(
        &self,
        owner: &str,
        quota: &Quota<'_>,
        token: CancellationToken,
        ttl: Duration,
    ) -> Result<TaskView, Refused> {
        let ttl = ttl.min(self.bounds.ttl);
        let Ok(mut map) = self.map.lock() else {
            return Err(Refused::Total(self.bounds.total));
        };
        let now = Instant::now();
        Self::purge(&mut map, now);
        let b = &self.bounds;
        if map.len() >= b.total {
            return Err(Refused::Total(b.total));
        }
        if quota.anonymous && map.values().filter(|e| e.anonymous).count() >= b.anonymous {
            return Err(Refused::Anonymous(b.anonymous));
        }
        let same = |e: &&Entry| e.anonymous == quota.anonymous && *e.quota == *quota.key;
        if map.values().filter(same).count() >= b.per_caller {
            return Err(Refused::PerCaller(b.per_caller));
        }
        let at = SystemTime::now();
        let id = mint();
        let e = Entry {
            owner: owner.into(),
            quota: (*quota.key).into(),
            anonymous: quota.anonymous,
            status: Status::Working,
            created: at,
            updated: at,
            expires: now + ttl,
            token,
            size: 0,
            answers: Map::new(),
            resume: None,
            ttl,
            seq: self.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            done: tokio::sync::watch::Sender::new(false),
        };
        let v = self.view(&id, &e);
        map.insert(id.into(), e);
        Ok(v)
    }

    /// The task `id` of `owner`; `None` for an unknown, expired or foreign id.
    pub(super) fn get(&self, owner: &str, id: &str) -> Option<TaskView> {
        if id.len() > MAX_TASK_ID {
            return None;
        }
        let map = self.map.lock().ok()?;
        let e = map.get(id)?;
        (&*e.owner == owner && e.expires > Instant::now()).then(|| self.view(id, e))
    }

    /// Records the end of a task (no effect on a task already ended, e.g. cancelled); a
    /// result over the bounds fails the task instead.
    pub(super) fn finish(&self, id: &str, status: Status) {
        let Ok(mut map) = self.map.lock() else {
            return;
        };
        let held: usize = map.values().map(|e| e.size).sum();
        let (status, size) = within_bounds(status, held, &self.bounds);
        if let Some(e) = map.get_mut(id)
            && !e.status.terminal()
        {
            e.size = size;
            e.status = status;
            e.updated = SystemTime::now();
            e.done.send_replace(true);
        }
    }

    /// Cancels the task `id` of `owner`: `false` for an unknown, expired or foreign id. An
    /// ended task stays as it is (cancelling it again is no error).
    pub(super) fn cancel(&self, owner: &str, id: &str) -> bool {
        if id.len() > MAX_TASK_ID {
            return false;
        }
        let Ok(mut map) = self.map.lock() else {
            return false;
        };
        let Some(e) = map.get_mut(id) else {
            return false;
        };
        if &*e.owner != owner || e.expires <= Instant::now() {
            return false;
        }
        if !e.status.terminal() {
            e.status = Status::Cancelled;
            e.updated = SystemTime::now();
            e.token.cancel();
            e.resume = None;
            e.answers = Map::new();
            e.size = 0;
            e.done.send_replace(true);
        }
        true
    }

    /// Parks the working task `id` until the client answers `asked` (`used`: the answers its
    /// run had already): the receiver yields every answer once the last is in. `None` when
    /// the task no longer works (cancelled, expired).
    pub(super) fn park(
        &self,
        id: &str,
        asked: Map<String, Value>,
        used: Map<String, Value>,
    ) -> Option<oneshot::Receiver<Map<String, Value>>> {
        let mut map = self.map.lock().ok()?;
        let e = map.get_mut(id)?;
        if e.status != Status::Working || e.expires <= Instant::now() {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        e.status = Status::InputRequired(asked);
        e.size = used.values().map(crate::template::approx_size).sum();
        e.answers = used;
        e.resume = Some(tx);
        e.updated = SystemTime::now();
        Some(rx)
    }

    /// Records answers to the questions of the task `id` of `owner`, at once.
    pub(super) fn update(
        &self,
        owner: &str,
        id: &str,
        mut responses: Map<String, Value>,
    ) -> Result<(), UpdateError> {
        if id.len() > MAX_TASK_ID {
            return Err(UpdateError::Unknown);
        }
        let Ok(mut map) = self.map.lock() else {
            return Err(UpdateError::Unknown);
        };
        let held: usize = map.values().map(|e| e.size).sum();
        let e = map.get_mut(id).ok_or(UpdateError::Unknown)?;
        if &*e.owner != owner || e.expires <= Instant::now() {
            return Err(UpdateError::Unknown);
        }
        let Status::InputRequired(pending) = &mut e.status else {
            return Ok(());
        };
        let (answered, size) = checked(pending, &responses, e.size)?;
        if size > self.bounds.max_result_bytes {
            return Err(UpdateError::Invalid(format!(
                "Invalid params: the answers are about {size} bytes; a task keeps at most {}",
                self.bounds.max_result_bytes
            )));
        }
        let others = held.saturating_sub(e.size);
        if others.saturating_add(size) > self.bounds.total_result_bytes {
            return Err(UpdateError::Full(format!(
                "the server holds {others} bytes of task results and answers already (at most {}); try again later",
                self.bounds.total_result_bytes
            )));
        }
        if answered.is_empty() {
            return Ok(());
        }
        for k in answered {
            pending.remove(&k);
            if let Some(a) = responses.remove(&k) {
                e.answers.insert(k, a);
            }
        }
        e.size = size;
        e.updated = SystemTime::now();
        if pending.is_empty() {
            e.status = Status::Working;
            e.size = 0;
            if let Some(tx) = e.resume.take() {
                let _ = tx.send(std::mem::take(&mut e.answers));
            }
        }
        Ok(())
    }

    /// What turns once the task `id` of `owner` has ended; `None` for an unknown, expired or
    /// foreign id.
    pub(super) fn finished(&self, owner: &str, id: &str) -> Option<Finished> {
        if id.len() > MAX_TASK_ID {
            return None;
        }
        let map = self.map.lock().ok()?;
        let e = map.get(id)?;
        (&*e.owner == owner && e.expires > Instant::now()).then(|| Finished(e.done.subscribe()))
    }

    /// A page of `owner`'s tasks in creation order after the place `after`, at most `limit`,
    /// with the cursor of the next page; `None` for a cursor this store never gave.
    pub(super) fn list(
        &self,
        owner: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Option<(Vec<TaskView>, Option<u64>)> {
        let next = self.next_seq.load(std::sync::atomic::Ordering::Relaxed);
        if after.is_some_and(|a| a >= next) {
            return None;
        }
        let map = self.map.lock().ok()?;
        let now = Instant::now();
        let mut mine: Vec<(&str, &Entry)> = map
            .iter()
            .filter(|(_, e)| &*e.owner == owner && e.expires > now && after.is_none_or(|a| e.seq > a))
            .map(|(id, e)| (&**id, e))
            .collect();
        mine.sort_unstable_by_key(|(_, e)| e.seq);
        let more = mine.len() > limit;
        mine.truncate(limit);
        let cursor = mine.last().filter(|_| more).map(|(_, e)| e.seq);
        Some((mine.into_iter().map(|(id, e)| self.view(id, e)).collect(), cursor))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn store(per_caller: usize, total: usize, ttl: Duration) -> MemoryTasks {
        MemoryTasks::new(TaskBounds {
            per_caller,
            total,
            ttl,
            poll_interval: Duration::from_millis(250),
            ..TaskBounds::default()
        })
    }

    #[test]
    fn lifecycle_working_then_completed_with_the_result_inline() {
        let s = store(4, 8, Duration::from_secs(60));
        let t = s.create("alice", CancellationToken::new()).unwrap();
        let created = t.created();
        assert_eq!(created["resultType"], "task");
        assert_eq!(created["status"], "working");
        assert_eq!(created["ttlMs"], 60_000);
        assert_eq!(created["pollIntervalMs"], 250);
        for k in ["result", "error", "task", "ttl", "pollInterval", "requestState"] {
            assert!(created.get(k).is_none(), "{k}");
        }
        assert!(created["createdAt"].as_str().unwrap().ends_with('Z'));
        let got = s.get("alice", &t.id).unwrap().detailed();
        assert_eq!(got["status"], "working");
        assert!(got.get("result").is_none());
        let result = json!({"content": [{"type": "text", "text": "done"}]});
        s.finish(&t.id, Status::Completed(result.clone()));
        let got = s.get("alice", &t.id).unwrap().detailed();
        assert_eq!(got["status"], "completed");
        assert_eq!(got["result"], result);
    }

    #[test]
    fn a_failed_task_carries_an_error_and_no_result() {
        let s = store(4, 8, Duration::from_secs(60));
        let t = s.create("alice", CancellationToken::new()).unwrap();
        s.finish(&t.id, Status::Failed(-32603, "boom".into()));
        let got = s.get("alice", &t.id).unwrap().detailed();
        assert_eq!(got["status"], "failed");
        assert_eq!(got["error"]["code"], -32603);
        assert!(got.get("result").is_none());
    }

    #[test]
    fn cancel_stops_the_work_and_a_late_finish_does_not_undo_it() {
        let s = store(4, 8, Duration::from_secs(60));
        let token = CancellationToken::new();
        let t = s.create("alice", token.clone()).unwrap();
        assert!(s.cancel("alice", &t.id));
        assert!(token.is_cancelled());
        s.finish(&t.id, Status::Completed(json!({})));
        assert_eq!(s.get("alice", &t.id).unwrap().status, Status::Cancelled);
        // Idempotent on a terminal task.
        assert!(s.cancel("alice", &t.id));
        assert_eq!(s.get("alice", &t.id).unwrap().status, Status::Cancelled);
    }

    #[test]
    fn foreign_forged_and_huge_ids_are_all_unknown() {
        let s = store(4, 8, Duration::from_secs(60));
        let token = CancellationToken::new();
        let t = s.create("alice", token.clone()).unwrap();
        assert_eq!(t.id.len(), 32);
        assert!(t.id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(s.get("mallory", &t.id).is_none());
        assert!(!s.cancel("mallory", &t.id));
        assert!(!token.is_cancelled(), "a foreign cancel must not reach the task");
        let huge = "a".repeat(1 << 20);
        for forged in [
            "",
            "0",
            "00000000000000000000000000000000",
            huge.as_str(),
            "\u{0}\u{ffff}",
        ] {
            assert!(s.get("alice", forged).is_none());
            assert!(!s.cancel("alice", forged));
        }
        let other = s.create("alice", CancellationToken::new()).unwrap();
        assert_ne!(t.id, other.id);
    }

    #[test]
    fn too_many_tasks_is_a_clear_refusal_per_caller_and_in_total() {
        let s = store(2, 3, Duration::from_secs(60));
        s.create("alice", CancellationToken::new()).unwrap();
        s.create("alice", CancellationToken::new()).unwrap();
        let e = s.create("alice", CancellationToken::new()).unwrap_err();
        assert_eq!(e, Refused::PerCaller(2));
        assert!(e.to_string().contains("too many tasks"));
        s.create("bob", CancellationToken::new()).unwrap();
        assert_eq!(
            s.create("carol", CancellationToken::new()).unwrap_err(),
            Refused::Total(3)
        );
    }

    #[test]
    fn expired_tasks_are_forgotten_cancelled_and_free_their_slot() {
        let s = store(1, 1, Duration::ZERO);
        let token = CancellationToken::new();
        let t = s.create("alice", token.clone()).unwrap();
        assert!(s.get("alice", &t.id).is_none());
        assert!(!s.cancel("alice", &t.id));
        // The next create purges it, cancelling its work, and takes its slot.
        s.create("alice", CancellationToken::new()).unwrap();
        assert!(token.is_cancelled());
    }
}

#[cfg(test)]
mod result_bounds {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_result_over_the_bounds_fails_its_task_and_frees_nothing_it_did_not_take() {
        let s = MemoryTasks::new(TaskBounds {
            max_result_bytes: 1000,
            total_result_bytes: 1500,
            ..TaskBounds::default()
        });
        let big = json!({"content": [{"type": "text", "text": "x".repeat(2000)}]});
        let fits = json!({"content": [{"type": "text", "text": "y".repeat(800)}]});
        let t1 = s.create("a", CancellationToken::new()).unwrap();
        s.finish(&t1.id, Status::Completed(big));
        let got = s.get("a", &t1.id).unwrap().detailed();
        assert_eq!(got["status"], "failed");
        assert_eq!(got["error"]["code"], -32603);
        assert!(
            got["error"]["message"].as_str().unwrap().contains("at most 1000"),
            "{got}"
        );
        assert!(got.get("result").is_none());
        // One fits; a second of the same size would take the total over its bound.
        let t2 = s.create("a", CancellationToken::new()).unwrap();
        s.finish(&t2.id, Status::Completed(fits.clone()));
        assert_eq!(s.get("a", &t2.id).unwrap().detailed()["status"], "completed");
        let t3 = s.create("b", CancellationToken::new()).unwrap();
        s.finish(&t3.id, Status::Completed(fits));
        let got = s.get("b", &t3.id).unwrap().detailed();
        assert_eq!(got["status"], "failed");
        assert!(
            got["error"]["message"]
                .as_str()
                .unwrap()
                .contains("task results already"),
            "{got}"
        );
    }
}

#[cfg(test)]
mod input {
    use serde_json::json;

    use super::*;

    fn elicit(message: &str) -> Value {
        json!({"method": "elicitation/create", "params": {"mode": "form", "message": message, "requestedSchema": {"type": "object"}}})
    }

    fn asked(keys: &[&str]) -> Map<String, Value> {
        keys.iter().map(|k| ((*k).to_owned(), elicit(k))).collect()
    }

    fn accept(v: Value) -> Value {
        json!({"action": "accept", "content": v})
    }

    fn responses(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn parked(s: &MemoryTasks, keys: &[&str]) -> (String, oneshot::Receiver<Map<String, Value>>) {
        let t = s.create("alice", CancellationToken::new()).unwrap();
        let used = responses(json!({"earlier": accept(json!({"x": 1}))}));
        let rx = s.park(&t.id, asked(keys), used).unwrap();
        (t.id, rx)
    }

    #[test]
    fn a_parked_task_shows_its_pending_questions_and_nothing_else() {
        let s = MemoryTasks::new(TaskBounds::default());
        let (id, _rx) = parked(&s, &["confirm"]);
        let got = s.get("alice", &id).unwrap().detailed();
        assert_eq!(got["status"], "input_required");
        assert_eq!(got["inputRequests"]["confirm"]["method"], "elicitation/create");
        for k in ["result", "error", "requestState"] {
            assert!(got.get(k).is_none(), "{k}: {got}");
        }
    }

    #[test]
    fn partial_answers_are_taken_at_once_and_the_last_one_resumes_with_all() {
        let s = MemoryTasks::new(TaskBounds::default());
        let (id, mut rx) = parked(&s, &["name", "confirm"]);
        s.update(
            "alice",
            &id,
            responses(json!({"name": accept(json!({"name": "a"}))})),
        )
        .unwrap();
        let got = s.get("alice", &id).unwrap().detailed();
        assert_eq!(got["status"], "input_required");
        assert!(got["inputRequests"].get("name").is_none(), "{got}");
        assert!(got["inputRequests"].get("confirm").is_some(), "{got}");
        assert!(rx.try_recv().is_err(), "resumed before the last answer");
        // A key that is not pending (answered already, or never asked) is ignored.
        let again = responses(json!({"name": {"nope": 1}, "unknown-key": {"ignored": true}}));
        s.update("alice", &id, again).unwrap();
        assert_eq!(
            s.get("alice", &id).unwrap().detailed()["inputRequests"],
            json!({"confirm": elicit("confirm")})
        );
        s.update(
            "alice",
            &id,
            responses(json!({"confirm": accept(json!({"confirm": true}))})),
        )
        .unwrap();
        assert_eq!(s.get("alice", &id).unwrap().status, Status::Working);
        let all = rx.try_recv().unwrap();
        let keys: Vec<&str> = all.keys().map(String::as_str).collect();
        assert_eq!(keys, ["confirm", "earlier", "name"]);
        assert_eq!(all["name"], accept(json!({"name": "a"})));
        // Once working again, an update is an acknowledgement without effect.
        s.update("alice", &id, responses(json!({"confirm": {"nope": 1}})))
            .unwrap();
        assert_eq!(s.get("alice", &id).unwrap().status, Status::Working);
    }

    #[test]
    fn a_malformed_answer_to_a_pending_key_is_refused_and_changes_nothing() {
        let s = MemoryTasks::new(TaskBounds::default());
        let (id, mut rx) = parked(&s, &["a", "b"]);
        let before = s.get("alice", &id).unwrap();
        for bad in [
            json!({"nope": 1}),
            json!("accept"),
            json!([1]),
            json!({"action": "maybe"}),
            json!(null),
        ] {
            let r = responses(json!({"a": accept(json!({"ok": true})), "b": bad.clone()}));
            let Err(UpdateError::Invalid(why)) = s.update("alice", &id, r) else {
                panic!("{bad} accepted");
            };
            assert!(why.starts_with("Invalid params: inputResponses.b "), "{why}");
            let now = s.get("alice", &id).unwrap();
            assert_eq!(now.status, before.status, "{bad}");
        }
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn answers_larger_than_a_task_keeps_are_refused() {
        let s = MemoryTasks::new(TaskBounds {
            max_result_bytes: 1000,
            ..TaskBounds::default()
        });
        let (id, _rx) = parked(&s, &["a"]);
        let big = responses(json!({"a": accept(json!({"text": "x".repeat(2000)}))}));
        let Err(UpdateError::Invalid(why)) = s.update("alice", &id, big) else {
            panic!("a 2 kB answer was kept");
        };
        assert!(why.contains("at most 1000"), "{why}");
        assert_eq!(
            s.get("alice", &id).unwrap().detailed()["status"],
            "input_required"
        );
    }

    #[test]
    fn waiting_tasks_answers_count_against_the_total_of_results() {
        let s = MemoryTasks::new(TaskBounds {
            max_result_bytes: 1000,
            total_result_bytes: 1500,
            ..TaskBounds::default()
        });
        let answer = || responses(json!({"a": accept(json!({"text": "x".repeat(800)}))}));
        let (one, _rx1) = parked(&s, &["a", "b"]);
        s.update("alice", &one, answer()).unwrap();
        let (two, _rx2) = parked(&s, &["a"]);
        let Err(UpdateError::Full(why)) = s.update("alice", &two, answer()) else {
            panic!("the total was not enforced");
        };
        assert!(why.contains("at most 1500"), "{why}");
        assert_eq!(
            s.get("alice", &two).unwrap().detailed()["inputRequests"],
            json!({"a": elicit("a")})
        );
        // Once the first is cancelled, its answers no longer count.
        assert!(s.cancel("alice", &one));
        s.update("alice", &two, answer()).unwrap();
    }

    #[test]
    fn foreign_forged_and_expired_ids_are_unknown_to_update() {
        let s = MemoryTasks::new(TaskBounds::default());
        let (id, mut rx) = parked(&s, &["a"]);
        let answer = || responses(json!({"a": accept(json!({}))}));
        assert_eq!(s.update("mallory", &id, answer()), Err(UpdateError::Unknown));
        let huge = "a".repeat(1 << 20);
        for forged in ["", "0", "00000000000000000000000000000000", huge.as_str()] {
            assert_eq!(s.update("alice", forged, answer()), Err(UpdateError::Unknown));
        }
        assert!(rx.try_recv().is_err(), "a foreign update reached the task");
        let expired = MemoryTasks::new(TaskBounds {
            ttl: Duration::ZERO,
            ..TaskBounds::default()
        });
        let t = expired.create("alice", CancellationToken::new()).unwrap();
        assert!(expired.park(&t.id, asked(&["a"]), Map::new()).is_none());
        assert_eq!(
            expired.update("alice", &t.id, answer()),
            Err(UpdateError::Unknown)
        );
    }

    #[test]
    fn cancelling_a_parked_task_closes_its_wait_and_it_cannot_park_again() {
        let s = MemoryTasks::new(TaskBounds::default());
        let (id, mut rx) = parked(&s, &["a"]);
        assert!(s.cancel("alice", &id));
        assert_eq!(s.get("alice", &id).unwrap().status, Status::Cancelled);
        assert!(matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Closed)));
        assert!(s.park(&id, asked(&["b"]), Map::new()).is_none());
        s.update("alice", &id, responses(json!({"a": accept(json!({}))})))
            .unwrap();
        s.finish(&id, Status::Completed(json!({})));
        assert_eq!(s.get("alice", &id).unwrap().status, Status::Cancelled);
    }
}

#[cfg(test)]
mod core_wire {
    use serde_json::json;

    use super::*;

    #[test]
    fn lists_page_in_creation_order_per_owner_and_refuse_cursors_never_given() {
        let s = MemoryTasks::new(TaskBounds::default());
        let mine: Vec<String> = (0..5)
            .map(|i| {
                if i == 2 {
                    s.create("bob", CancellationToken::new()).unwrap();
                }
                s.create("alice", CancellationToken::new()).unwrap().id
            })
            .collect();
        let (page, next) = s.list("alice", None, 2).unwrap();
        let mut seen: Vec<String> = page.into_iter().map(|t| t.id).collect();
        let mut cursor = next;
        while let Some(c) = cursor {
            let (page, next) = s.list("alice", Some(c), 2).unwrap();
            seen.extend(page.into_iter().map(|t| t.id));
            cursor = next;
        }
        assert_eq!(seen, mine);
        assert_eq!(s.list("bob", None, 10).unwrap().0.len(), 1);
        assert!(s.list("alice", Some(1 << 40), 2).is_none());
        assert!(s.list("mallory", None, 2).unwrap().0.is_empty());
    }

    #[test]
    fn a_task_ttl_is_at_most_the_store_s_and_the_core_shape_follows_its_status() {
        let s = MemoryTasks::new(TaskBounds::default());
        let short = s
            .create_for(
                "a",
                &Quota::caller("a"),
                CancellationToken::new(),
                Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(short.core()["ttl"], 5000);
        let long = s
            .create_for("a", &Quota::caller("a"), CancellationToken::new(), Duration::MAX)
            .unwrap();
        assert_eq!(long.core()["ttl"], 600_000);
        let c = short.core();
        assert_eq!(c["status"], "working");
        for k in ["resultType", "ttlMs", "pollIntervalMs", "result", "statusMessage"] {
            assert!(c.get(k).is_none(), "{k}");
        }
        s.finish(
            &short.id,
            Status::Completed(json!({"content": [], "isError": true})),
        );
        let c = s.get("a", &short.id).unwrap().core();
        assert_eq!(c["status"], "failed");
        assert!(c["statusMessage"].is_string());
        s.finish(&long.id, Status::Completed(json!({"content": []})));
        assert_eq!(s.get("a", &long.id).unwrap().core()["status"], "completed");
    }

    #[tokio::test]
    async fn finished_turns_when_the_task_ends_and_is_none_for_foreign_ids() {
        let s = MemoryTasks::new(TaskBounds::default());
        let t = s.create("a", CancellationToken::new()).unwrap();
        assert!(s.finished("b", &t.id).is_none());
        assert!(s.finished("a", &"f".repeat(1 << 12)).is_none());
        let f = s.finished("a", &t.id).unwrap();
        let waiting = tokio::spawn(f.wait());
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        s.finish(&t.id, Status::Completed(json!({})));
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .unwrap()
            .unwrap();
        // Already ended: turns at once.
        tokio::time::timeout(Duration::from_secs(10), s.finished("a", &t.id).unwrap().wait())
            .await
            .unwrap();
    }
}
