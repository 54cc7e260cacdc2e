//! The global allocator of the `quiver-server` binary: jemalloc, or the system allocator
//! when `QUIVER_ALLOCATOR=system` is in the environment (the operator sets it for
//! `tuning.allocator: system`), so one binary serves both.
//!
//! The choice is made at the process's first allocation — before anything else could
//! allocate — and never changes afterwards, so every block is freed by the allocator
//! that handed it out. After that first call the cost is one relaxed load and a branch
//! the predictor always gets right.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

use tikv_jemallocator::Jemalloc;

const UNDECIDED: u8 = 0;
const JEMALLOC: u8 = 1;
const SYSTEM: u8 = 2;
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// jemalloc unless `QUIVER_ALLOCATOR=system`.
pub struct Selectable;

#[inline(always)]
fn system() -> bool {
    match CHOICE.load(Relaxed) {
        JEMALLOC => false,
        SYSTEM => true,
        _ => decide(),
    }
}

#[cold]
fn decide() -> bool {
    // SAFETY: getenv only reads the environment and does not allocate (std's env
    // functions would, re-entering this allocator). This runs at the first allocation
    // of the process, before any thread could call setenv. Threads racing here read the
    // same environment and store the same answer.
    let wants_system = unsafe {
        let v = libc::getenv(c"QUIVER_ALLOCATOR".as_ptr());
        !v.is_null() && std::ffi::CStr::from_ptr(v) == c"system"
    };
    CHOICE.store(if wants_system { SYSTEM } else { JEMALLOC }, Relaxed);
    wants_system
}

/// Hands the memory freed so far back to the kernel: after a config load, whose parse and
/// compile garbage (several times the size of what is kept) would otherwise stay resident
/// until jemalloc's decay returns it seconds later. At most once a second (a reload storm
/// leaves the rest to the decay); nothing unless this allocator is the process's.
pub fn release_free_memory() {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if LAST.swap(now, Relaxed) == now {
        return;
    }
    match CHOICE.load(Relaxed) {
        // SAFETY: a mallctl with no old or new value: it only purges every arena
        // (MALLCTL_ARENAS_ALL is 4096).
        JEMALLOC => unsafe {
            tikv_jemalloc_sys::mallctl(
                c"arena.4096.purge".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            );
        },
        // SAFETY: glibc's malloc_trim only releases free memory.
        #[cfg(target_env = "gnu")]
        SYSTEM => unsafe {
            libc::malloc_trim(0);
        },
        _ => {}
    }
}

/// The allocator in use, for the `quiver_build_info` metric.
pub fn name() -> &'static str {
    if system() { "system" } else { "jemalloc" }
}

// SAFETY: every method forwards to exactly one of two sound allocators, and the same one
// for the whole life of the process (see `decide`), so a block is always returned to the
// allocator that produced it, with the layout the caller promises.
unsafe impl GlobalAlloc for Selectable {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds GlobalAlloc::alloc's contract.
        unsafe {
            if system() {
                System.alloc(layout)
            } else {
                Jemalloc.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for alloc.
        unsafe {
            if system() {
                System.alloc_zeroed(layout)
            } else {
                Jemalloc.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from this allocator, hence from the one `system()` names.
        unsafe {
            if system() {
                System.dealloc(ptr, layout)
            } else {
                Jemalloc.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for dealloc.
        unsafe {
            if system() {
                System.realloc(ptr, layout, new_size)
            } else {
                Jemalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}
