//! Capacity of the MCP port: connection slots, in-flight requests, open streams, and the
//! draining flag. Readiness (`/readyz`) reads it, so a saturated or stopping pod leaves its
//! Service's endpoints. Every check is an atomic operation: no lock, no allocation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connection slots of the MCP port (shared by its listeners): an accept loop takes a slot
/// for each connection it accepts, so at the cap it holds that connection unserved and
/// accepts no more (new connections wait in the kernel's backlog).
#[derive(Debug)]
pub struct Connections {
    slots: Arc<Semaphore>,
    max: usize,
    /// Accepted connections being served and not yet closed.
    open: AtomicUsize,
}

impl Connections {
    /// Slots for `max` connections (at least one).
    pub fn new(max: usize) -> Arc<Self> {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            open: AtomicUsize::new(0),
        })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Whether the cap is reached.
    pub fn saturated(&self) -> bool {
        self.open() >= self.max
    }

    /// Marks an accepted connection open until the returned guard drops; `permit` is the
    /// slot it was accepted with.
    pub(crate) fn opened(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> OpenSlot {
        self.open.fetch_add(1, Ordering::AcqRel);
        OpenSlot {
            conns: self.clone(),
            _permit: permit,
        }
    }

    /// A slot without waiting, if one is free.
    pub(crate) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// Waits for a free slot.
    pub(crate) async fn take(&self) -> OwnedSemaphorePermit {
        match self.slots.clone().acquire_owned().await {
            Ok(p) => p,
            // The semaphore is never closed.
            Err(_) => std::future::pending().await,
        }
    }

    /// Waits until every connection has closed.
    pub(crate) async fn all_closed(&self) {
        let n = u32::try_from(self.max).unwrap_or(u32::MAX);
        let _ = self.slots.acquire_many(n).await;
    }
}

/// An open connection's slot; closing it (dropping this) frees the slot.
#[derive(Debug)]
pub struct OpenSlot {
    conns: Arc<Connections>,
    _permit: OwnedSemaphorePermit,
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.conns.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A counter with a cap: `try_enter` fails at the cap, a [`Pass`] leaves on drop.
#[derive(Debug)]
pub struct Gate {
    current: AtomicUsize,
    max: usize,
}

impl Gate {
    /// A gate letting `max` holders in at once.
    pub fn new(max: usize) -> Self {
        Self {
            current: AtomicUsize::new(0),
            max,
        }
    }

    /// Enters unless the gate is full.
    #[inline]
    pub fn try_enter(&self) -> Option<Pass<'_>> {
        let prev = self.current.fetch_add(1, Ordering::AcqRel);
        if prev >= self.max {
            self.current.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Pass(self))
    }

    /// Enters unless the gate is full; the caller must [`Gate::release`] exactly once (for
    /// holders that outlive a borrow, such as a stream).
    pub(crate) fn try_enter_detached(&self) -> bool {
        self.try_enter().map(std::mem::forget).is_some()
    }

    /// Leaves after [`Gate::try_enter_detached`].
    pub(crate) fn release(&self) {
        self.current.fetch_sub(1, Ordering::AcqRel);
    }

    /// Holders now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Acquire).min(self.max)
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether the gate is full.
    pub fn saturated(&self) -> bool {
        self.current.load(Ordering::Acquire) >= self.max
    }
}

/// A place in a [`Gate`], given back on drop.
#[derive(Debug)]
pub struct Pass<'a>(&'a Gate);

impl Drop for Pass<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.current.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The MCP port's capacity, shared by the HTTP transport, the accept loop and `/readyz`.
#[derive(Debug)]
pub struct Load {
    /// Connection slots of the MCP listener.
    pub connections: Arc<Connections>,
    /// POST requests being dispatched.
    pub inflight: Gate,
    /// Open GET (SSE) streams.
    pub streams: Gate,
    draining: AtomicBool,
}

impl Load {
    /// Capacity with the given caps.
    pub fn new(max_connections: usize, max_inflight: usize, max_streams: usize) -> Arc<Self> {
        Arc::new(Self {
            connections: Connections::new(max_connections),
            inflight: Gate::new(max_inflight),
            streams: Gate::new(max_streams),
            draining: AtomicBool::new(false),
        })
    }

    /// Marks the server as shutting down: readiness fails from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Why the server should not get new traffic now, if it should not.
    pub fn unready_reason(&self) -> Option<&'static str> {
        if self.draining() {
            Some("shutting down")
        } else if self.connections.saturated() {
            Some("connection limit reached")
        } else if self.inflight.saturated() {
            Some("in-flight request limit reached")
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_refuses_at_the_cap_and_reopens_on_drop() {
        let g = Gate::new(2);
        let a = g.try_enter();
        let b = g.try_enter();
        assert!(a.is_some() && b.is_some());
        assert!(g.try_enter().is_none());
        assert!(g.saturated());
        assert_eq!(g.current(), 2);
        drop(a);
        assert!(!g.saturated());
        assert!(g.try_enter().is_some());
        drop(b);
        assert_eq!(g.current(), 0);
    }

    #[test]
    fn readiness_reflects_saturation_and_draining() {
        let load = Load::new(1, 1, 1);
        assert_eq!(load.unready_reason(), None);
        let pass = load.inflight.try_enter();
        assert_eq!(load.unready_reason(), Some("in-flight request limit reached"));
        drop(pass);
        let permit = load.connections.try_take().unwrap();
        assert_eq!(
            load.connections.open(),
            0,
            "a slot held by the accept loop is no connection"
        );
        let slot = load.connections.opened(permit);
        assert_eq!(load.connections.open(), 1);
        assert_eq!(load.unready_reason(), Some("connection limit reached"));
        drop(slot);
        load.start_draining();
        assert_eq!(load.unready_reason(), Some("shutting down"));
    }
}
