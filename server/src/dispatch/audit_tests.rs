//! The audit trail under a flood, through the router: with `--audit-on-full refuse` every
//! call that ran has its record, and a call whose record could not be queued was refused
//! before it ran, with the documented error.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::audit::{AuditLog, OnFull};
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::reload::Reloader;
use crate::secrets::Secrets;

/// A sink that takes nothing until it is opened (a stalled log pipe, a full disk being
/// cleared), then keeps every byte.
#[derive(Clone, Default)]
struct Gated {
    open: Arc<(Mutex<bool>, Condvar)>,
    bytes: Arc<Mutex<Vec<u8>>>,
    /// The writer is stuck in it.
    stuck: Arc<std::sync::atomic::AtomicBool>,
}

impl Gated {
    /// Waits until the writer is stuck in the sink (at most 10 s).
    fn until_stuck(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.stuck.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the writer never wrote");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn open(&self) {
        let (m, cv) = &*self.open;
        *m.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cv.notify_all();
    }

    fn lines(&self) -> Vec<Value> {
        let bytes = self
            .bytes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl Write for Gated {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let (m, cv) = &*self.open;
        let mut open = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        self.stuck.store(!*open, std::sync::atomic::Ordering::SeqCst);
        while !*open {
            open = cv.wait(open).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        self.bytes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn audited(queue: usize, on_full: OnFull, sink: &Gated) -> Arc<Server> {
    let metrics = Metrics::new("test", "system");
    let gov = metrics.gov.clone();
    let log = AuditLog::start_with(
        Box::new(sink.clone()),
        queue,
        on_full,
        Secrets::new(),
        gov.clone(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let limiter = crate::limits::Limiter::new(1000, None, gov);
    let server = Server::builder(Registry::new(&metrics), metrics)
        .limiter(limiter)
        .audit(Some(log))
        .build();
    Reloader::new(server.clone())
        .apply(&[(
            "t.yaml".into(),
            "tools: [{name: greet, handler: {template: hi}}]".into(),
        )])
        .unwrap_or_else(|e| panic!("{e}"));
    server
}

const STATELESS_CX: Ctx<'static> = Ctx {
    session: "",
    version: "2026-07-28",
    stream: false,
    era: Era::Stateless("2026-07-28"),
    caller: None,
    opens: Opens::Minted,
    client: None,
};

/// `n` calls of `greet` at once, ids from `first`: the ids answered with a result, and the
/// errors of the others.
async fn flood(s: &Arc<Server>, first: u64, n: u64) -> (BTreeSet<u64>, Vec<Value>) {
    let calls = (first..first + n).map(|id| {
        let s = s.clone();
        tokio::spawn(async move {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "greet", "arguments": {},
                "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                          "io.modelcontextprotocol/clientCapabilities": {}}}});
            match s.handle(body.to_string().as_bytes(), STATELESS_CX, false).await {
                Outcome::Reply(r) => {
                    serde_json::from_slice::<Value>(&r.body).unwrap_or_else(|e| panic!("{e}"))
                }
                other => panic!("{other:?}"),
            }
        })
    });
    let mut ran = BTreeSet::new();
    let mut refused = Vec::new();
    for c in calls.collect::<Vec<_>>() {
        let v = c.await.unwrap_or_else(|e| panic!("{e}"));
        if v.get("result").is_some() {
            assert_eq!(v["result"]["content"][0]["text"], "hi", "{v}");
            ran.insert(v["id"].as_u64().unwrap_or_else(|| panic!("{v}")));
        } else {
            refused.push(v["error"].clone());
        }
    }
    (ran, refused)
}

/// Waits until the writer has written `n` records (at most 10 s).
fn written(s: &Server, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.metrics.gov.audit_records.get() < n {
        assert!(
            Instant::now() < deadline,
            "{} records written",
            s.metrics.gov.audit_records.get()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_refuse_every_call_that_ran_has_its_record_however_full_the_queue() {
    let sink = Gated::default();
    let s = audited(8, OnFull::Refuse, &sink);
    // The sink takes nothing: the first call's record is stuck in the writer, and at most
    // the queue's other 7 places let calls run.
    let (first, _) = flood(&s, 0, 1).await;
    assert_eq!(first.len(), 1);
    sink.until_stuck();
    let (mut ran, refused) = flood(&s, 1, 200).await;
    assert!(!ran.is_empty() && ran.len() <= 7, "{} ran", ran.len());
    assert_eq!(ran.len() + refused.len(), 200);
    ran.extend(first);
    for e in &refused {
        assert_eq!(e["code"], -32004, "{e}");
        assert_eq!(e["data"]["audit"], "queue_full", "{e}");
        assert_eq!(e["data"]["retryAfter"], 1, "{e}");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(m.starts_with("Audit trail full"), "{m}");
    }
    assert_eq!(s.metrics.gov.audit_refused.get(), refused.len() as u64);
    // Once the sink takes records again, the queue empties and calls run again.
    sink.open();
    written(&s, ran.len() as u64);
    let (again, _) = flood(&s, 1000, 4).await;
    assert_eq!(again.len(), 4);
    let all: BTreeSet<u64> = ran.iter().chain(&again).copied().collect();
    written(&s, all.len() as u64);
    let lines = sink.lines();
    let recorded: BTreeSet<u64> = lines
        .iter()
        .map(|l| {
            assert_eq!(l["outcome"], "ok", "{l}");
            l["requestId"].as_u64().unwrap_or_else(|| panic!("{l}"))
        })
        .collect();
    assert_eq!(lines.len(), all.len(), "one record per call that ran");
    assert_eq!(recorded, all);
    assert_eq!(s.metrics.gov.audit_dropped.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_drop_every_call_runs_and_records_that_find_the_queue_full_are_counted() {
    let sink = Gated::default();
    let s = audited(8, OnFull::Drop, &sink);
    flood(&s, 0, 1).await;
    sink.until_stuck();
    let (ran, refused) = flood(&s, 1, 200).await;
    assert_eq!((ran.len(), refused.len()), (200, 0));
    // The queue holds 8 of them; the other 192 ran without a record.
    assert_eq!(s.metrics.gov.audit_dropped.get(), 192);
    sink.open();
    written(&s, 9);
    assert_eq!(sink.lines().len(), 9);
    assert_eq!(s.metrics.gov.audit_refused.get(), 0);
}
