//! Checkpoints through the C ABI's entry points (called from Rust as C
//! would) against a real reflector with its channel on: a member uploads
//! when asked, a joiner's READY event and `rc_checkpoint_take` give exactly
//! those bytes (size asked first, a short buffer refused and the state
//! kept), the reflector's and the client's counters agree, a fetch sooner
//! than the reflector allows fails with its refusal code, fetch-on-join can
//! be turned off, and a group without a channel says so.

#![allow(unsafe_code, reason = "calls the C ABI's entry points as C would")]

mod common;

use common::{mint, Minted, Reflector};
use reflector_c::api::{self, TokenParts};
use reflector_c::ffi::*;
use reflector_c::types::*;
use std::time::{Duration, Instant};

fn last_error() -> String {
    let mut buf = [0u8; 512];
    let n = api::last_error(&mut buf);
    String::from_utf8_lossy(&buf[..n.min(511)]).into_owned()
}

fn client(m: &Minted, r: &Reflector) -> rc_handle {
    let reflector = r.addr().to_string();
    let p = TokenParts {
        token: &m.token,
        session_key: &m.session_key,
        player: m.player,
        group: m.group,
        reflector: &reflector,
        expires_unix_s: m.expires_unix_s,
    };
    api::new_with_token(&p, Some("127.0.0.1:0")).expect("a client starts")
}

/// Updates `hs` every millisecond, draining events and datagrams and
/// collecting checkpoint events, until `done` holds; panics after `within`.
fn pump(
    hs: &[rc_handle],
    within: Duration,
    got: &mut Vec<(usize, rc_checkpoint_event)>,
    mut done: impl FnMut(&[(usize, rc_checkpoint_event)]) -> bool,
) {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; RC_MAX_PAYLOAD];
    for _ in 0..100_000 {
        for (i, &h) in hs.iter().enumerate() {
            assert_eq!(rc_update(h, api::now_ms()), rc_status::RC_OK);
            // SAFETY: valid out-pointers and buffers; all-zero is a valid
            // value of each struct (kind NONE, status OK).
            unsafe {
                let mut ev = std::mem::zeroed::<rc_event>();
                while rc_poll_event(h, &mut ev) == rc_status::RC_OK {}
                let mut info = std::mem::zeroed::<rc_datagram_info>();
                while rc_recv(h, buf.as_mut_ptr(), buf.len(), &mut info) == rc_status::RC_OK {}
                let mut ck = std::mem::zeroed::<rc_checkpoint_event>();
                loop {
                    match rc_poll_checkpoint(h, &mut ck) {
                        rc_status::RC_OK => got.push((i, ck)),
                        rc_status::RC_NONE => break,
                        e => panic!("rc_poll_checkpoint: {e:?} {}", last_error()),
                    }
                }
            }
        }
        if done(got) {
            return;
        }
        assert!(Instant::now() < deadline, "not done within {within:?}; events: {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("not done within the loop's count; events: {got:?}");
}

fn joined(h: rc_handle) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while rc_is_member(h) != 1 {
        assert!(Instant::now() < deadline, "no JOIN_ACK within 5 s");
        assert_eq!(rc_update(h, api::now_ms()), rc_status::RC_OK);
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn stats(h: rc_handle) -> rc_checkpoint_counters {
    let mut s = rc_checkpoint_counters::default();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { rc_checkpoint_stats(h, &mut s) }, rc_status::RC_OK);
    s
}

/// `n` bytes of a pseudo-random pattern (xorshift): a misplaced piece
/// cannot look right.
fn pattern(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn kind(k: rc_checkpoint_kind) -> impl Fn(&(usize, rc_checkpoint_event)) -> bool {
    move |(_, e)| e.kind == k
}

#[test]
fn upload_when_asked_and_a_joiner_takes_exactly_those_bytes() {
    use rc_checkpoint_kind::*;
    let r = Reflector::start_checkpoints(200);
    let (ma, mb) = (mint(61, &r), mint(62, &r));
    let a = client(&ma, &r);
    // The first member fetches nothing on its join: turned off here.
    assert_eq!(rc_checkpoint_configure(a, 0, 5_000, 0), rc_status::RC_OK);
    joined(a);
    let mut got = Vec::new();
    pump(&[a], Duration::from_secs(5), &mut got, |g| {
        g.iter().any(kind(RC_CHECKPOINT_REQUESTED))
    });
    assert!(got.iter().all(|(_, e)| e.group == ma.group), "{got:?}");

    // Larger than one 64 KiB piece of the channel.
    let state = pattern(150_000);
    // SAFETY: `state` is that many readable bytes.
    assert_eq!(
        unsafe { rc_provide_checkpoint(a, 42, state.as_ptr(), state.len()) },
        rc_status::RC_OK
    );
    // SAFETY: as above.
    let again = unsafe { rc_provide_checkpoint(a, 42, state.as_ptr(), state.len()) };
    assert_eq!(again, rc_status::RC_ERR_IN_FLIGHT, "{}", last_error());
    got.clear();
    pump(&[a], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(_, e)| matches!(e.kind, RC_CHECKPOINT_UPLOADED | RC_CHECKPOINT_FAILED))
    });
    let up = got
        .iter()
        .find(|(_, e)| e.kind == RC_CHECKPOINT_UPLOADED)
        .map(|(_, e)| *e)
        .unwrap_or_else(|| panic!("no upload stored: {got:?} {}", last_error()));
    assert_eq!((up.group, up.tick), (ma.group, 42));
    assert!(
        !got.iter()
            .any(|(_, e)| matches!(e.kind, RC_CHECKPOINT_EMPTY | RC_CHECKPOINT_READY)),
        "fetch-on-join was off: {got:?}"
    );
    let c = r.counters();
    assert_eq!(c.checkpoints_stored, 1);
    assert_eq!(c.checkpoint_bytes_stored, state.len() as u64);
    assert_eq!((stats(a).uploaded, stats(a).fetched), (1, 0));

    // b fetches on its join (the default).
    let b = client(&mb, &r);
    got.clear();
    pump(&[a, b], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(i, e)| *i == 1 && matches!(e.kind, RC_CHECKPOINT_READY | RC_CHECKPOINT_EMPTY | RC_CHECKPOINT_FAILED))
    });
    let ready = got
        .iter()
        .find(|(i, e)| *i == 1 && e.kind != RC_CHECKPOINT_REQUESTED)
        .map(|(_, e)| *e)
        .expect("b's fetch ended");
    assert_eq!(ready.kind, RC_CHECKPOINT_READY, "{ready:?} {}", last_error());
    assert_eq!(
        (ready.group, ready.number, ready.tick, ready.from_player, ready.len),
        (mb.group, up.number, 42, 61, state.len())
    );
    assert_eq!(ready.op, rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH, "the latest (1.4)");
    assert_eq!(ready.verification, RC_VERIFICATION_CLEAR, "a clear group (1.5)");

    // The size first, a short buffer refused (the state kept), then all.
    let (mut len, mut tick) = (0usize, 0u64);
    // SAFETY: NULL with capacity 0 asks the size; valid out-pointers.
    let st = unsafe { rc_checkpoint_take(b, std::ptr::null_mut(), 0, &mut len, &mut tick) };
    assert_eq!((st, len, tick), (rc_status::RC_ERR_BUFFER_TOO_SMALL, state.len(), 42));
    let mut buf = vec![0u8; state.len() + 10];
    // SAFETY: `buf` holds more than the capacity passed.
    let st = unsafe { rc_checkpoint_take(b, buf.as_mut_ptr(), state.len() - 1, &mut len, std::ptr::null_mut()) };
    assert_eq!((st, len), (rc_status::RC_ERR_BUFFER_TOO_SMALL, state.len()));
    assert!(last_error().contains("150000 bytes"), "{}", last_error());
    // SAFETY: a NULL len_out: the check under test.
    let st = unsafe { rc_checkpoint_take(b, buf.as_mut_ptr(), buf.len(), std::ptr::null_mut(), &mut tick) };
    assert_eq!(st, rc_status::RC_ERR_NULL);
    // SAFETY: `buf.len()` writable bytes.
    let st = unsafe { rc_checkpoint_take(b, buf.as_mut_ptr(), buf.len(), &mut len, &mut tick) };
    assert_eq!((st, len, tick), (rc_status::RC_OK, state.len(), 42));
    assert!(buf[..len] == state[..], "the bytes taken are not the bytes uploaded");
    // SAFETY: as above.
    let st = unsafe { rc_checkpoint_take(b, buf.as_mut_ptr(), buf.len(), &mut len, &mut tick) };
    assert_eq!(st, rc_status::RC_NONE, "taken once");
    // The reflector counts a fetch served after its last byte is handed to
    // the kernel, which may be after the joiner has read it all.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while r.counters().checkpoints_served == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(r.counters().checkpoints_served, 1);
    let sb = stats(b);
    assert_eq!((sb.fetched, sb.failures), (1, 0));

    // The other one kept (1.4): with one stored there is none, an EMPTY
    // that says which fetch it answers, not a failure.
    assert_eq!(rc_fetch_checkpoint_other(b), rc_status::RC_OK);
    assert_eq!(rc_fetch_checkpoint_other(b), rc_status::RC_ERR_IN_FLIGHT);
    got.clear();
    pump(&[b], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(_, e)| matches!(e.kind, RC_CHECKPOINT_FAILED | RC_CHECKPOINT_READY | RC_CHECKPOINT_EMPTY))
    });
    let other = got
        .iter()
        .find(|(_, e)| e.kind != RC_CHECKPOINT_REQUESTED)
        .map(|(_, e)| *e)
        .expect("the FETCH_OTHER ended");
    assert_eq!(
        (other.kind, other.op, other.group),
        (
            RC_CHECKPOINT_EMPTY,
            rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH_OTHER,
            mb.group
        ),
        "{}",
        last_error()
    );
    let sb = stats(b);
    assert_eq!((sb.fetched, sb.failures), (2, 0));

    // A fetch at once is sooner than the reflector allows: FAILED, refused
    // as busy (6), with a message on the polling thread.
    assert_eq!(rc_fetch_checkpoint(b), rc_status::RC_OK);
    assert_eq!(rc_fetch_checkpoint(b), rc_status::RC_ERR_IN_FLIGHT);
    got.clear();
    pump(&[b], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(_, e)| matches!(e.kind, RC_CHECKPOINT_FAILED | RC_CHECKPOINT_READY))
    });
    let failed = got
        .iter()
        .find(|(_, e)| e.kind == RC_CHECKPOINT_FAILED)
        .map(|(_, e)| *e)
        .unwrap_or_else(|| panic!("the second fetch was not refused: {got:?}"));
    assert_eq!(
        (failed.op, failed.error, failed.refusal),
        (rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH, rc_status::RC_ERR_REFUSED, 6)
    );
    assert!(last_error().contains("refused"), "{}", last_error());
    assert_eq!(stats(b).failures, 1);

    assert_eq!(rc_free(a), rc_status::RC_OK);
    assert_eq!(rc_free(b), rc_status::RC_OK);
    r.stop();
}

#[test]
fn a_group_without_a_channel_says_so() {
    let r = Reflector::start();
    let h = client(&mint(63, &r), &r);
    joined(h);
    assert_eq!(rc_fetch_checkpoint(h), rc_status::RC_ERR_NO_CHANNEL);
    assert!(last_error().contains("no checkpoint channel"), "{}", last_error());
    let state = [1u8; 4];
    // SAFETY: 4 readable bytes.
    let st = unsafe { rc_provide_checkpoint(h, 1, state.as_ptr(), state.len()) };
    assert_eq!(st, rc_status::RC_ERR_NOT_REQUESTED);
    assert_eq!(rc_free(h), rc_status::RC_OK);
    r.stop();
}
