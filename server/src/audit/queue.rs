//! The queue between requests and the audit writer thread, and the thread.
//!
//! With `drop` ([`OnFull::Drop`]) a request hands its record over when it ends; a full queue
//! or a failing sink drops it (counted). With `refuse` every record holds a place from
//! before its request runs ([`AuditLog::place`]) until the writer has written and flushed
//! it: a request that finds no place is refused, and a sink that fails is retried (the
//! records wait in the writer, the queue fills, and calls are refused until the sink takes
//! records again), so that no call runs without its record.

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use super::{Clock, DROP_LOG_EVERY, OnFull, POLL, Record, Sink, line};
use crate::metrics::governance::GovMetrics;
use crate::secrets::Secrets;

/// The writer's buffer.
const BUFFER: usize = 64 << 10;
/// Largest piece of a line handed to the buffer at once (`refuse`): less than the buffer, so
/// that a piece is either taken whole or not at all when the sink fails, and a retry
/// neither loses nor repeats bytes.
const PIECE: usize = BUFFER / 2;
/// With `refuse`, records written between flushes at most: a flush gives their places back.
const FLUSH_EVERY: u64 = 256;
/// With `refuse`, how often a failing sink is tried for the records still waiting once the
/// server is stopping (then they are dropped and counted).
const LAST_TRIES: u32 = 100;

/// The places of a queue under `refuse`: each record holds one from before its request runs
/// until it is written.
#[derive(Debug)]
struct Places {
    held: AtomicUsize,
    capacity: usize,
}

impl Places {
    /// Takes a place if fewer than `upto` are held.
    fn take_below(&self, upto: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h < upto).then_some(h + 1)
            })
            .is_ok()
    }

    /// Takes a place for the record of a call.
    fn take(&self) -> bool {
        self.take_below(self.capacity)
    }

    /// Takes a place for a record of no call (a refused credential): only in the first half
    /// of the queue, so that a flood of them leaves calls their places.
    fn take_spare(&self) -> bool {
        self.take_below((self.capacity / 2).max(1))
    }

    fn give(&self, n: usize) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| Some(h.saturating_sub(n)));
    }
}

/// The place of a record in the queue, taken before its request runs (`refuse`); given
/// back if dropped without being used ([`AuditLog::record_in`] uses it).
#[derive(Debug)]
pub struct Place(Option<Arc<Places>>);

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            p.give(1);
        }
    }
}

/// The queue had no place for a record: its call must not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom;

/// The queue to the audit writer.
#[derive(Debug)]
pub struct AuditLog {
    tx: SyncSender<Record>,
    metrics: Arc<GovMetrics>,
    /// Set under `refuse`.
    places: Option<Arc<Places>>,
    /// Drops not yet logged, and when the last was logged (seconds since `epoch`, +1).
    unlogged: AtomicU64,
    logged_at: AtomicU64,
    epoch: Instant,
    /// The `mcpServer` field every record carries, once named ([`AuditLog::name_instance`]).
    instance: Arc<OnceLock<Vec<u8>>>,
}

impl AuditLog {
    /// Names the McpServer every record comes from (once; before the first request).
    pub fn name_instance(&self, instance: &super::Instance) {
        let _ = self.instance.set(super::instance_field(instance));
    }

    /// Opens `sink` and starts the writer thread with a queue of `queue` records.
    ///
    /// # Errors
    /// The file cannot be opened for appending, or the thread cannot start.
    pub fn start(
        sink: &Sink,
        queue: usize,
        on_full: OnFull,
        secrets: Arc<Secrets>,
        metrics: Arc<GovMetrics>,
    ) -> std::io::Result<Arc<Self>> {
        let out: Box<dyn Write + Send> = match sink {
            Sink::Stdout => Box::new(std::io::stdout()),
            Sink::File(p) => Box::new(OpenOptions::new().create(true).append(true).open(p)?),
        };
        Self::start_with(out, queue, on_full, secrets, metrics)
    }

    /// [`AuditLog::start`] writing to `out`.
    ///
    /// # Errors
    /// The thread cannot start.
    pub fn start_with(
        out: Box<dyn Write + Send>,
        queue: usize,
        on_full: OnFull,
        secrets: Arc<Secrets>,
        metrics: Arc<GovMetrics>,
    ) -> std::io::Result<Arc<Self>> {
        let queue = queue.max(1);
        let (tx, rx) = sync_channel(queue);
        let places = (on_full == OnFull::Refuse).then(|| {
            Arc::new(Places {
                held: AtomicUsize::new(0),
                capacity: queue,
            })
        });
        let log = Arc::new(Self {
            tx,
            metrics: metrics.clone(),
            places: places.clone(),
            unlogged: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            epoch: Instant::now(),
            instance: Arc::default(),
        });
        let writer = Writer {
            out: BufWriter::with_capacity(BUFFER, out),
            buf: Vec::with_capacity(512),
            clock: Clock::new(),
            unflushed: 0,
            places,
            metrics,
            log: Arc::downgrade(&log),
            failing_since: None,
            instance: log.instance.clone(),
        };
        std::thread::Builder::new()
            .name("quiver-audit".into())
            .spawn(move || writer.run(&rx, &secrets))?;
        Ok(log)
    }

    /// Takes a place for the record of a request about to run: `None` under `drop` (nothing
    /// is held); under `refuse` the place, or [`NoRoom`] (counted in
    /// `quiver_audit_refused_total`) when the queue has none.
    ///
    /// # Errors
    /// [`NoRoom`]: the request must be refused.
    pub fn place(&self) -> Result<Option<Place>, NoRoom> {
        let Some(p) = &self.places else {
            return Ok(None);
        };
        if p.take() {
            Ok(Some(Place(Some(p.clone()))))
        } else {
            self.metrics.audit_refused.inc();
            Err(NoRoom)
        }
    }

    /// Queues a record in the place taken for it; never blocks, never finds the queue full.
    pub fn record_in(&self, mut place: Place, r: Record) {
        // The record takes the place over: the writer gives it back once it is written.
        let taken = place.0.take();
        if self.tx.try_send(r).is_err() {
            // Only a writer that is gone (the process is ending) refuses it.
            if let Some(p) = taken {
                p.give(1);
            }
            self.dropped(1);
        }
    }

    /// Queues a record that holds no place (a refused credential, a denial decided outside
    /// dispatch); never blocks. A full queue drops it (counted and logged); under `refuse` it
    /// needs a place of its own, in the first half of the queue only (the rest is for calls).
    pub fn record(&self, r: Record) {
        let place = match self.places.as_ref().map(|p| p.take_spare()) {
            Some(false) => {
                self.dropped(1);
                return;
            }
            Some(true) => self.places.clone(),
            None => None,
        };
        match self.tx.try_send(r) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                if let Some(p) = place {
                    p.give(1);
                }
                self.dropped(1);
            }
        }
    }

    /// Under `refuse`, waits until every record queued so far is written (at most
    /// `within`): what a stopping server does last. `false` if some were not.
    pub async fn settle(&self, within: Duration) -> bool {
        let Some(p) = &self.places else {
            return true;
        };
        let deadline = tokio::time::Instant::now() + within;
        while p.held.load(Ordering::Acquire) > 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
        true
    }

    /// Counts `n` dropped records and logs them, at most every [`DROP_LOG_EVERY`].
    fn dropped(&self, n: u64) {
        self.metrics.audit_dropped.inc_by(n);
        let pending = self.unlogged.fetch_add(n, Ordering::Relaxed) + n;
        let now = self.epoch.elapsed().as_secs() + 1;
        let last = self.logged_at.load(Ordering::Relaxed);
        if (last == 0 || now >= last + DROP_LOG_EVERY.as_secs())
            && self
                .logged_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let n = self.unlogged.swap(0, Ordering::Relaxed).max(pending.min(1));
            tracing::warn!(
                dropped = n,
                "audit records dropped: the audit queue was full or its sink failed (see quiver_audit_dropped_total)"
            );
        }
    }
}

/// The writer thread's state.
struct Writer {
    out: BufWriter<Box<dyn Write + Send>>,
    buf: Vec<u8>,
    clock: Clock,
    /// Records written to `out` since its last flush.
    unflushed: u64,
    /// Set under `refuse`: written records give their places back, and the sink's failures
    /// are retried.
    places: Option<Arc<Places>>,
    metrics: Arc<GovMetrics>,
    log: Weak<AuditLog>,
    /// Since when the sink has been failing (`refuse`), for the warning.
    failing_since: Option<Instant>,
    /// The `mcpServer` field of every record, when the server names its McpServer.
    instance: Arc<OnceLock<Vec<u8>>>,
}

impl Writer {
    /// Records to lines, flushed whenever the queue is empty (and under `refuse` every
    /// [`FLUSH_EVERY`] records), until every sender is gone.
    fn run(mut self, rx: &Receiver<Record>, secrets: &Secrets) {
        loop {
            let r = match rx.try_recv() {
                Ok(r) => r,
                Err(TryRecvError::Empty) => {
                    self.flush(false);
                    // Poll instead of blocking in `recv`: a writer that waits on the channel
                    // makes every request's send wake it (a futex call and a context switch
                    // per record); one that sleeps is woken by nobody and drains a batch per
                    // period.
                    std::thread::sleep(POLL);
                    self.clock.reset();
                    continue;
                }
                Err(TryRecvError::Disconnected) => break,
            };
            self.buf.clear();
            let instance = self.instance.get().map(Vec::as_slice);
            line(&r, instance, secrets, &mut self.clock, &mut self.buf);
            self.buf.push(b'\n');
            self.put();
            if self.places.is_some() && self.unflushed >= FLUSH_EVERY {
                self.flush(false);
            }
        }
        self.flush(true);
    }

    /// Counts `n` records lost to the sink's error `e`.
    fn fail(&self, n: u64, e: &std::io::Error) {
        match self.log.upgrade() {
            Some(l) => l.dropped(n),
            None => {
                self.metrics.audit_dropped.inc_by(n);
            }
        }
        tracing::debug!(error = %e, "audit sink write failed");
    }

    /// Writes the line in `buf`: once under `drop` (a failure drops it); under `refuse` in
    /// pieces, each retried until the sink takes it.
    fn put(&mut self) {
        if self.places.is_none() {
            match self.out.write_all(&self.buf) {
                Ok(()) => self.unflushed += 1,
                Err(e) => self.fail(1, &e),
            }
            return;
        }
        let mut done = 0;
        while done < self.buf.len() {
            let end = (done + PIECE).min(self.buf.len());
            let piece = &self.buf[done..end];
            let out = &mut self.out;
            if let Err(e) = retry(&mut self.failing_since, false, || out.write_all(piece)) {
                // Only while stopping: the record is lost.
                self.fail(1, &e);
                return;
            }
            done = end;
        }
        self.unflushed += 1;
    }

    /// Flushes the records written since the last flush, counting them; under `refuse`
    /// retried until the sink takes them (`last`: a stopping server tries a while only), and
    /// their places given back.
    fn flush(&mut self, last: bool) {
        if self.unflushed == 0 {
            return;
        }
        let n = std::mem::take(&mut self.unflushed);
        let out = &mut self.out;
        let flushed = match &self.places {
            None => out.flush(),
            Some(_) => retry(&mut self.failing_since, last, || out.flush()),
        };
        match flushed {
            Ok(()) => {
                self.metrics.audit_records.inc_by(n);
            }
            Err(e) => self.fail(n, &e),
        }
        if let Some(p) = &self.places {
            p.give(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
}

/// Runs `op` until it succeeds, waiting [`POLL`] between tries and warning (at most every
/// [`DROP_LOG_EVERY`]) while it fails; with `last`, [`LAST_TRIES`] times at most.
fn retry(
    failing_since: &mut Option<Instant>,
    last: bool,
    mut op: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut tries = 0u32;
    let mut warned: Option<Instant> = None;
    loop {
        let Err(e) = op() else {
            if failing_since.take().is_some() {
                tracing::info!("audit sink takes records again");
            }
            return Ok(());
        };
        tries += 1;
        if last && tries >= LAST_TRIES {
            return Err(e);
        }
        let since = *failing_since.get_or_insert_with(Instant::now);
        if warned.is_none_or(|w| w.elapsed() >= DROP_LOG_EVERY) {
            warned = Some(Instant::now());
            tracing::warn!(
                error = %e,
                failing_for = ?since.elapsed(),
                "audit sink failing: records wait and, once the audit queue is full, calls are refused (--audit-on-full refuse)"
            );
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    use serde_json::Value;

    fn log(tx: SyncSender<Record>, places: Option<Arc<Places>>, m: &Arc<GovMetrics>) -> AuditLog {
        AuditLog {
            tx,
            metrics: m.clone(),
            places,
            unlogged: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            epoch: Instant::now(),
            instance: Arc::default(),
        }
    }

    #[test]
    fn a_full_queue_counts_every_drop() {
        let m = GovMetrics::unregistered();
        // A writer that never reads: a queue of 2 with a record taken by the thread at most.
        let (tx, _rx) = sync_channel(2);
        let log = log(tx, None, &m);
        for _ in 0..10 {
            log.record(Record::new("tools/call", "ok"));
        }
        assert_eq!(m.audit_dropped.get(), 8);
        assert_eq!(log.place().unwrap().map(|_| ()), None, "drop holds no places");
    }

    #[test]
    fn under_refuse_a_record_without_a_place_never_runs_and_places_come_back() {
        let m = GovMetrics::unregistered();
        let (tx, rx) = sync_channel(2);
        let places = Arc::new(Places {
            held: AtomicUsize::new(0),
            capacity: 2,
        });
        let log = log(tx, Some(places.clone()), &m);
        let a = log.place().unwrap().unwrap();
        let b = log.place().unwrap().unwrap();
        assert_eq!(log.place().unwrap_err(), NoRoom);
        assert_eq!(m.audit_refused.get(), 1);
        // An unused place is given back when dropped.
        drop(b);
        let b = log.place().unwrap().unwrap();
        // Used ones stay held while their records wait, and never find the queue full.
        log.record_in(a, Record::new("tools/call", "ok"));
        log.record_in(b, Record::new("tools/call", "ok"));
        assert_eq!(places.held.load(Ordering::Acquire), 2);
        assert_eq!(m.audit_dropped.get(), 0);
        // A record of no call (a refused credential) needs a place too: here it is dropped.
        log.record(Record::new("authentication", "unauthenticated"));
        assert_eq!(m.audit_dropped.get(), 1);
        assert_eq!(rx.try_iter().count(), 2);
    }

    #[test]
    fn records_of_no_call_take_at_most_half_the_queue() {
        let m = GovMetrics::unregistered();
        let (tx, rx) = sync_channel(8);
        let places = Arc::new(Places {
            held: AtomicUsize::new(0),
            capacity: 8,
        });
        let log = log(tx, Some(places.clone()), &m);
        for _ in 0..100 {
            log.record(Record::new("authentication", "unauthenticated"));
        }
        assert_eq!((rx.try_iter().count(), m.audit_dropped.get()), (4, 96));
        // Calls still find the other half.
        let calls: Vec<Place> = (0..4).map(|_| log.place().unwrap().unwrap()).collect();
        assert_eq!(log.place().unwrap_err(), NoRoom);
        drop(calls);
    }

    /// A sink that fails its first `failures` writes and flushes, then keeps every byte.
    #[derive(Clone)]
    struct Flaky {
        failures: Arc<AtomicUsize>,
        bytes: Arc<Mutex<Vec<u8>>>,
    }

    impl Flaky {
        fn broken(&self) -> std::io::Result<()> {
            let left = self
                .failures
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
            match left {
                Ok(_) => Err(std::io::Error::other("disk full")),
                Err(_) => Ok(()),
            }
        }
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.broken()?;
            self.bytes.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            self.broken()
        }
    }

    #[tokio::test]
    async fn under_refuse_a_failing_sink_loses_no_record() {
        let m = GovMetrics::unregistered();
        let sink = Flaky {
            failures: Arc::new(AtomicUsize::new(5)),
            bytes: Arc::default(),
        };
        let log = AuditLog::start_with(
            Box::new(sink.clone()),
            16,
            OnFull::Refuse,
            Secrets::new(),
            m.clone(),
        )
        .unwrap();
        // Lines of about 200 KiB too: larger than the writer's buffer, written in pieces.
        let big = serde_json::json!(vec!["x".repeat(1000); 200]);
        for i in 0..40u64 {
            let place = loop {
                match log.place() {
                    Ok(p) => break p.unwrap(),
                    Err(NoRoom) => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            };
            let mut r = Record::new("tools/call", "ok");
            r.request_id = Some(i.to_string().into());
            if i % 10 == 0 {
                r.arguments = Some(big.clone());
            }
            log.record_in(place, r);
        }
        assert!(log.settle(Duration::from_secs(10)).await, "records still waiting");
        assert_eq!(m.audit_records.get(), 40);
        assert_eq!(m.audit_dropped.get(), 0);
        let bytes = sink.bytes.lock().unwrap().clone();
        let ids: Vec<u64> = String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["requestId"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ids, (0..40).collect::<Vec<_>>());
        // Every place is back.
        assert!(log.place().unwrap().is_some());
    }

    #[tokio::test]
    async fn a_named_instance_and_the_trace_ids_are_in_every_record() {
        let m = GovMetrics::unregistered();
        let sink = Flaky {
            failures: Arc::new(AtomicUsize::new(0)),
            bytes: Arc::default(),
        };
        let log = AuditLog::start_with(
            Box::new(sink.clone()),
            16,
            OnFull::Drop,
            Secrets::new(),
            m.clone(),
        )
        .unwrap();
        log.name_instance(&"team-a/tools.v2".parse().unwrap());
        let mut traced = Record::new("tools/call", "ok");
        traced.trace = Some(Box::new((
            "0af7651916cd43dd8448eb211c80319c".into(),
            "b7ad6b7169203331".into(),
        )));
        log.record(traced);
        log.record(Record::new("prompts/get", "forbidden"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.audit_records.get() < 2 {
            assert!(Instant::now() < deadline, "records not written in 10 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert!(log.settle(Duration::from_secs(10)).await);
        let bytes = sink.bytes.lock().unwrap().clone();
        let lines: Vec<Value> = String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        for l in &lines {
            assert_eq!(
                l["mcpServer"],
                serde_json::json!({"namespace": "team-a", "name": "tools.v2"}),
                "{l}"
            );
        }
        assert_eq!(lines[0]["traceId"], "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(lines[0]["spanId"], "b7ad6b7169203331");
        assert!(lines[1].get("traceId").is_none(), "{}", lines[1]);
    }

    #[test]
    fn an_instance_is_a_namespace_and_a_name_and_nothing_else() {
        let ok: super::super::Instance = "default/weather".parse().unwrap();
        assert_eq!((ok.namespace.as_str(), ok.name.as_str()), ("default", "weather"));
        let long_label = format!("{}/x", "a".repeat(64));
        let long_name = format!("a/{}", "b".repeat(254));
        for bad in [
            "",
            "weather",
            "/weather",
            "default/",
            "a/b/c",
            "Default/x",
            "a/B",
            "a b/x",
            "a/x\"",
            "../etc/passwd",
            "a/é",
            long_label.as_str(),
            long_name.as_str(),
        ] {
            assert!(bad.parse::<super::super::Instance>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn records_reach_a_file_one_line_each() {
        let dir = std::env::temp_dir().join(format!("quiver-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.jsonl");
        let m = GovMetrics::unregistered();
        let log = AuditLog::start(
            &Sink::File(path.clone()),
            16,
            OnFull::Drop,
            Secrets::new(),
            m.clone(),
        )
        .unwrap();
        for i in 0..100 {
            let mut r = Record::new("tools/call", "ok");
            r.request_id = Some(i.to_string().into());
            while log.tx.try_send(r.clone()).is_err() {
                std::thread::yield_now();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while m.audit_records.get() < 100 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let ids: Vec<i64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["requestId"]
                    .as_i64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ids, (0..100).collect::<Vec<_>>());
        assert_eq!(m.audit_dropped.get(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
