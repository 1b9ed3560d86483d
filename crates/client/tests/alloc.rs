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
use std::time::{Duration, Instant};

struct Counting;

thread_local! {
    // Per thread, so the tests of this binary (run in parallel) count only
    // their own allocations.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count_one() {
    if COUNTING.with(Cell::get) {
        ALLOCATIONS.with(|a| a.set(a.get() + 1));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_one();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_one();
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
    ALLOCATIONS.with(|a| a.set(0));
    let got = round(true, 200);
    assert!(got > 0, "datagrams went both ways");
    assert_eq!(ALLOCATIONS.with(Cell::get), 0, "allocations in the steady state");
    drop((a, b));
    r.stop();
}

/// The same over the Linux `recvmmsg` driver: its batch buffers are
/// allocated once, at bind.
#[cfg(target_os = "linux")]
#[test]
fn steady_state_over_recvmmsg_does_not_allocate() {
    use reflector_client::{Client, Config, MmsgDriver, TokenSource};
    let r = Reflector::start(0, true);
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(common::token(2, r.port, r.addr(), 300)))
    };
    let mut a = client(1, &r);
    let mut b = Client::with_driver(cfg, MmsgDriver::bind("127.0.0.1:0").unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(a.is_member() && b.is_member()) {
        assert!(Instant::now() < deadline, "joins did not complete");
        a.update(Instant::now());
        b.update(Instant::now());
        while a.poll_event().is_some() || b.poll_event().is_some() {}
        std::thread::sleep(Duration::from_millis(1));
    }
    let payload = [7u8; 200];
    let mut round = |count: bool, n: u32| -> u64 {
        let mut got = 0u64;
        COUNTING.with(|c| c.set(count));
        for i in 0..n {
            a.send(&payload).expect("a member sends");
            a.update(Instant::now());
            if i % 10 == 9 {
                // Ten wait for each look, so the batches hold several.
                std::thread::sleep(Duration::from_millis(25));
                b.update(Instant::now());
                while let Some(d) = b.recv() {
                    got += 1;
                    assert_eq!(d.payload.len(), payload.len());
                }
                while a.poll_event().is_some() || b.poll_event().is_some() {}
            }
        }
        COUNTING.with(|c| c.set(false));
        got
    };
    round(false, 40);
    ALLOCATIONS.with(|a| a.set(0));
    let got = round(true, 200);
    assert_eq!(got, 200, "the receiver got every datagram");
    assert_eq!(ALLOCATIONS.with(Cell::get), 0, "allocations in the steady state");
    drop((a, b));
    r.stop();
}
