//! Resumable SSE answers (protocol 2025-11-25, "polling" of SEP-1699).
//!
//! With `--sse-poll-after` set, a tool call over a session whose answer is still running
//! after that long, or that streams messages to the client, is answered by an SSE stream
//! whose events carry ids (`<stream>-<seq>`): it opens with a priming event (an id, a
//! `retry` hint, no data) and the server ends it after the poll interval while the call
//! goes on. The client then GETs `/mcp` with `Last-Event-ID` and receives what followed,
//! the response included, from the stream's buffer; it may poll again as often as needed.
//!
//! Each buffer is bounded in events and bytes (the newest event is always kept, so a large
//! response still arrives), buffers are bounded in number, and one nobody reads expires
//! (the call it belongs to is then cancelled). A `Last-Event-ID` that names no buffer of
//! the caller's session, or events already dropped, is refused with a clear error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Bounds and timing of resumable streams.
#[derive(Debug, Clone, Copy)]
pub struct ResumeOptions {
    /// How long an answer stream stays open while its call runs; then the server ends it
    /// and the client resumes with `Last-Event-ID`.
    pub poll_after: Duration,
    /// The reconnection delay suggested to clients (the `retry` field).
    pub retry: Duration,
    /// Buffers kept at once; when all are in use, new answers stream without ids.
    pub max_streams: usize,
    /// Events a buffer keeps (the oldest are dropped first).
    pub max_events: usize,
    /// Bytes a buffer keeps, besides its newest event.
    pub max_bytes: usize,
    /// How long a buffer nobody reads outlives its last event.
    pub ttl: Duration,
}

impl ResumeOptions {
    /// The defaults for a poll interval: 1,024 buffers of at most 256 events and 1 MiB,
    /// kept 60 s, a retry hint of a quarter of the interval (at least 100 ms).
    pub fn with_poll(poll_after: Duration) -> Self {
        Self {
            poll_after,
            retry: (poll_after / 4).max(Duration::from_millis(100)),
            max_streams: 1024,
            max_events: 256,
            max_bytes: 1 << 20,
            ttl: Duration::from_secs(60),
        }
    }
}

/// The buffers of the resumable streams of this transport.
#[derive(Debug)]
pub struct Resumable {
    options: ResumeOptions,
    buffers: Mutex<FxHashMap<u64, Arc<Buffer>>>,
    next: AtomicU64,
}

/// The events of one answer stream, as they were sent.
#[derive(Debug)]
pub struct Buffer {
    id: u64,
    session: Box<str>,
    inner: Mutex<Inner>,
    notify: Notify,
    /// Cancels the call (its client went away, or the buffer expired unread).
    pub cancel: CancellationToken,
}

#[derive(Debug)]
struct Inner {
    /// `(seq, message)`, consecutive; seq 0 is the priming event, never stored.
    events: VecDeque<(u64, Bytes)>,
    bytes: usize,
    next: u64,
    done: bool,
    readers: usize,
    touched: Instant,
}

/// Why a `Last-Event-ID` cannot be resumed.
#[derive(Debug, PartialEq, Eq)]
pub enum ResumeError {
    /// Not `<stream>-<seq>`.
    Malformed,
    /// No buffer of this session has that id (never issued, another session's, expired).
    Unknown,
    /// The events after it were dropped (the buffer's bounds).
    Dropped,
}

impl std::fmt::Display for ResumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Malformed => "Last-Event-ID is not an event id of this server",
            Self::Unknown => {
                "Last-Event-ID names no stream of this session (unknown, or expired); \
                 its events are gone, repeat the request"
            }
            Self::Dropped => {
                "the events after Last-Event-ID were dropped (the stream's buffer is bounded); \
                 repeat the request"
            }
        })
    }
}

/// What comes after an event of a stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// The next event, and its sequence number.
    Event(u64, Bytes),
    /// Nothing yet.
    Wait,
    /// The stream has ended: nothing will follow.
    Done,
    /// The event sought was dropped.
    Dropped,
}

impl Resumable {
    /// Empty buffers with these bounds.
    pub fn new(options: ResumeOptions) -> Self {
        Self {
            options,
            buffers: Mutex::new(FxHashMap::default()),
            next: AtomicU64::new(1),
        }
    }

    /// The bounds and timing in force.
    pub fn options(&self) -> &ResumeOptions {
        &self.options
    }

    fn lock(&self) -> MutexGuard<'_, FxHashMap<u64, Arc<Buffer>>> {
        self.buffers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new buffer for an answer to `session`, after dropping expired ones; `None` when
    /// every place is taken by a buffer in use.
    pub fn open(&self, session: &str) -> Option<Arc<Buffer>> {
        let now = Instant::now();
        let mut map = self.lock();
        map.retain(|_, b| {
            let keep = !b.lock().expired(now, self.options.ttl);
            if !keep {
                b.cancel.cancel();
            }
            keep
        });
        if map.len() >= self.options.max_streams {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let b = Arc::new(Buffer {
            id,
            session: session.into(),
            inner: Mutex::new(Inner {
                events: VecDeque::new(),
                bytes: 0,
                next: 1,
                done: false,
                readers: 0,
                touched: now,
            }),
            notify: Notify::new(),
            cancel: CancellationToken::new(),
        });
        map.insert(id, b.clone());
        Some(b)
    }

    /// The buffer and the sequence number a `Last-Event-ID` of `session` resumes after.
    ///
    /// # Errors
    /// The id is malformed, names no live buffer of this session, or events after it were
    /// dropped.
    pub fn resume(&self, last_event_id: &[u8], session: &str) -> Result<(Arc<Buffer>, u64), ResumeError> {
        let (stream, seq) = parse_id(last_event_id).ok_or(ResumeError::Malformed)?;
        let b = self
            .lock()
            .get(&stream)
            .filter(|b| *b.session == *session)
            .cloned()
            .ok_or(ResumeError::Unknown)?;
        if b.lock().expired(Instant::now(), self.options.ttl) {
            return Err(ResumeError::Unknown);
        }
        if b.next_after(seq) == Next::Dropped {
            return Err(ResumeError::Dropped);
        }
        Ok((b, seq))
    }

    /// Buffers held (for tests and metrics).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no buffer is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `<stream>-<seq>`, both decimal.
fn parse_id(v: &[u8]) -> Option<(u64, u64)> {
    let s = std::str::from_utf8(v).ok()?.trim();
    let (a, b) = s.split_once('-')?;
    let digits = |x: &str| !x.is_empty() && x.len() <= 20 && x.bytes().all(|c| c.is_ascii_digit());
    if !(digits(a) && digits(b)) {
        return None;
    }
    Some((a.parse().ok()?, b.parse().ok()?))
}

impl Inner {
    fn expired(&self, now: Instant, ttl: Duration) -> bool {
        self.readers == 0 && now.saturating_duration_since(self.touched) > ttl
    }
}

impl Buffer {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The id of event `seq` of this stream.
    pub fn event_id(&self, seq: u64) -> String {
        format!("{}-{seq}", self.id)
    }

    /// Appends a message, dropping the oldest ones beyond the bounds (never the newest).
    pub fn push(&self, message: Bytes, options: &ResumeOptions) {
        {
            let mut i = self.lock();
            let seq = i.next;
            i.next += 1;
            i.bytes += message.len();
            i.events.push_back((seq, message));
            while i.events.len() > 1 && (i.events.len() > options.max_events || i.bytes > options.max_bytes) {
                if let Some((_, m)) = i.events.pop_front() {
                    i.bytes -= m.len();
                }
            }
            i.touched = Instant::now();
        }
        self.notify.notify_waiters();
    }

    /// Marks the stream ended: readers end once they have what is buffered.
    pub fn finish(&self) {
        {
            let mut i = self.lock();
            i.done = true;
            i.touched = Instant::now();
        }
        self.notify.notify_waiters();
    }

    /// What follows event `seq`.
    pub fn next_after(&self, seq: u64) -> Next {
        let i = self.lock();
        let first = i.events.front().map_or(i.next, |e| e.0);
        let want = seq.saturating_add(1);
        if want < first {
            return Next::Dropped;
        }
        let index = usize::try_from(want - first).unwrap_or(usize::MAX);
        match i.events.get(index) {
            Some((s, m)) => Next::Event(*s, m.clone()),
            None if i.done => Next::Done,
            None => Next::Wait,
        }
    }

    /// Waits until something is pushed or the stream ends, or `deadline`; false at the
    /// deadline. Call [`Buffer::next_after`] again after it.
    pub async fn changed(&self, seq: u64, deadline: Instant) -> bool {
        let notified = self.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if self.next_after(seq) != Next::Wait {
            return true;
        }
        tokio::time::timeout_at(deadline.into(), notified).await.is_ok()
    }

    /// Counts a reader in (readers keep a buffer from expiring).
    pub fn attach(&self) {
        let mut i = self.lock();
        i.readers += 1;
        i.touched = Instant::now();
    }

    /// Counts a reader out; `true` when the stream has not ended.
    pub fn detach(&self) -> bool {
        let mut i = self.lock();
        i.readers = i.readers.saturating_sub(1);
        i.touched = Instant::now();
        !i.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> ResumeOptions {
        ResumeOptions {
            max_streams: 2,
            max_events: 3,
            max_bytes: 10,
            ttl: Duration::from_millis(50),
            ..ResumeOptions::with_poll(Duration::from_millis(100))
        }
    }

    #[test]
    fn buffers_replay_after_an_id_within_their_bounds() {
        let r = Resumable::new(opts());
        let b = r.open("s1").unwrap();
        let o = *r.options();
        b.push(Bytes::from_static(b"aaaa"), &o);
        b.push(Bytes::from_static(b"bbbb"), &o);
        assert_eq!(b.next_after(0), Next::Event(1, Bytes::from_static(b"aaaa")));
        assert_eq!(b.next_after(1), Next::Event(2, Bytes::from_static(b"bbbb")));
        assert_eq!(b.next_after(2), Next::Wait);
        // 12 bytes > 10: the oldest goes.
        b.push(Bytes::from_static(b"cccc"), &o);
        assert_eq!(b.next_after(0), Next::Dropped);
        assert_eq!(b.next_after(1), Next::Event(2, Bytes::from_static(b"bbbb")));
        // One event larger than the byte bound is still kept, alone.
        b.push(Bytes::from(vec![b'x'; 100]), &o);
        assert_eq!(b.next_after(3), Next::Event(4, Bytes::from(vec![b'x'; 100])));
        assert_eq!(b.next_after(2), Next::Dropped);
        b.finish();
        assert_eq!(b.next_after(4), Next::Done);

        let id = b.event_id(3);
        assert_eq!(r.resume(id.as_bytes(), "s1").map(|(_, s)| s), Ok(3));
        assert_eq!(r.resume(id.as_bytes(), "s2").err(), Some(ResumeError::Unknown));
        assert_eq!(
            r.resume(b.event_id(1).as_bytes(), "s1").err(),
            Some(ResumeError::Dropped)
        );
        let bad: [&[u8]; 8] = [
            b"",
            b"7",
            b"-1",
            b"1-",
            b"a-1",
            b"1-2-3",
            b"99999999999999999999999-1",
            b"\xff-1",
        ];
        for bad in bad {
            assert_eq!(r.resume(bad, "s1").err(), Some(ResumeError::Malformed), "{bad:?}");
        }
        assert_eq!(r.resume(b"424242-0", "s1").err(), Some(ResumeError::Unknown));
    }

    #[test]
    fn buffers_are_bounded_in_number_and_expire_unread() {
        let r = Resumable::new(opts());
        let a = r.open("s").unwrap();
        let b = r.open("s").unwrap();
        assert!(r.open("s").is_none(), "every place is taken");
        b.attach();
        std::thread::sleep(Duration::from_millis(60));
        // `a` has no reader and outlived its ttl: dropped, its call cancelled; `b` is read.
        let c = r.open("s").unwrap();
        assert!(a.cancel.is_cancelled());
        assert!(!b.cancel.is_cancelled());
        assert_eq!(r.len(), 2);
        assert_eq!(
            r.resume(a.event_id(0).as_bytes(), "s").err(),
            Some(ResumeError::Unknown)
        );
        assert!(r.resume(c.event_id(0).as_bytes(), "s").is_ok());
    }
}
