//! The bench library's only unsafe code: a global allocator that counts the
//! allocations of the threads that ask it to, for benches that report
//! allocations per datagram. A bench installs it with
//! `#[global_allocator] static A: bench::sys::CountingAlloc = bench::sys::CountingAlloc;`.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Forwards to the system allocator; counts while the calling thread has
/// [`count_this_thread`] on.
pub struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Starts or stops counting the calling thread's allocations.
pub fn count_this_thread(on: bool) {
    COUNTING.with(|c| c.set(on));
}

/// Allocations counted since the last [`reset_allocations`].
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Relaxed)
}

pub fn reset_allocations() {
    ALLOCATIONS.store(0, Relaxed);
}

fn count() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.fetch_add(1, Relaxed);
    }
}

// SAFETY (all three): forwarded unchanged to the system allocator, which
// keeps every contract; counting allocates nothing.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
