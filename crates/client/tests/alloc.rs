//! No allocation per datagram in steady state: a counting global allocator
//! (counting only this test's thread) around a send/update/recv loop.
//! In its own test binary, since the allocator is global.

// A global allocator is an `unsafe impl`; it only counts and forwards to
// the system allocator, which keeps every contract.
#![allow(unsafe_code)]

mod common;

use common::{client, join_all, Reflector};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Relaxed);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.fetch_add(1, Relaxed);
        }
        // SAFETY: as `dealloc`, and `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_send_and_receive_do_not_allocate() {
    let r = Reflector::start(0, true);
    let (mut a, mut b) = (client(1, &r), client(2, &r));
    join_all(&mut [&mut a, &mut b]);
    let payload = [9u8; 200];
    let mut round = |count: bool, n: u32| -> u64 {
        let mut got = 0u64;
        COUNTING.with(|c| c.set(count));
        for i in 0..n {
            a.send(&payload).expect("a member sends");
            b.send(&payload).expect("a member sends");
            a.update(Instant::now());
            b.update(Instant::now());
            while let Some(d) = b.recv() {
                got += d.payload.len() as u64;
            }
            while let Some(d) = a.recv() {
                got += d.payload.len() as u64;
            }
            while a.poll_event().is_some() || b.poll_event().is_some() {}
            if i % 40 == 39 {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        COUNTING.with(|c| c.set(false));
        got
    };
    // Warm up: each hears the other once (the sender tables fill).
    round(false, 40);
    ALLOCATIONS.store(0, Relaxed);
    let got = round(true, 200);
    assert!(got > 0, "datagrams went both ways");
    assert_eq!(ALLOCATIONS.load(Relaxed), 0, "allocations in the steady state");
    drop((a, b));
    r.stop();
}
