//! A counting global allocator for tests that bound allocations ("a corrupt count never becomes a huge
//! allocation"). A test binary installs it with
//! `#[global_allocator] static A: tf_testkit::alloc::Counting = tf_testkit::alloc::Counting;`
//! and measures a closure with [`largest_allocation`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Forwards to the system allocator, recording the largest request made by a thread being measured.
pub struct Counting;

thread_local! {
    /// Whether this thread's allocations are measured (other test threads allocate freely).
    static TRACK: Cell<bool> = const { Cell::new(false) };
}
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// `LARGEST` is shared, so measurements are serialized.
static SERIAL: Mutex<()> = Mutex::new(());

fn tracking() -> bool {
    TRACK.try_with(Cell::get).unwrap_or(false)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if tracking() {
            LARGEST.fetch_max(l.size(), Ordering::Relaxed);
        }
        System.alloc(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if tracking() {
            LARGEST.fetch_max(new, Ordering::Relaxed);
        }
        System.realloc(p, l, new)
    }
}

/// Runs `f` and returns its result with the largest single allocation it made on this thread. Only meaningful
/// when [`Counting`] is the binary's global allocator (otherwise the size is 0).
pub fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST.store(0, Ordering::Relaxed);
    TRACK.with(|t| t.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    TRACK.with(|t| t.set(false));
    let largest = LARGEST.load(Ordering::Relaxed);
    match r {
        Ok(r) => (r, largest),
        Err(p) => std::panic::resume_unwind(p),
    }
}
