//! Areas of interest and control server lists (1.2) through the C ABI's
//! entry points, called from Rust as C would: config handles (their own
//! table: never taken for a client's, stale and double frees refused),
//! `rc_set_position`'s refusals, the events' C form (MOVED, LEFT_GROUP, and
//! the group of REJOINING and RENEWED), and a client of radius 1 made from
//! a config whose first control server is down: it fails over, holds both
//! groups of its area, moves make-before-break, and reports it. Then
//! (1.3) an area's tokens handed in by the game, with the same moves.

#![allow(unsafe_code, reason = "calls the C ABI's entry points as C would")]

mod common;

use common::{area_control_server, centre, down_url, mint, mint_for, Minted, Reflector};
use reflector_c::api::{self, TokenParts};
use reflector_c::ffi::*;
use reflector_c::types::*;
use reflector_client::{Event, RejoinReason};
use std::ffi::CString;
use std::time::{Duration, Instant};

fn last_error() -> String {
    let mut buf = [0u8; 512];
    let n = api::last_error(&mut buf);
    String::from_utf8_lossy(&buf[..n.min(511)]).into_owned()
}

fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL")
}

/// A config for `url` (plain HTTP, loopback) of player `player` at `at`.
fn config(url: &str, player: u32, at: (f64, f64)) -> rc_config {
    let (url, local) = (c(url), c("127.0.0.1:0"));
    let mut cfg: rc_config = 0;
    // SAFETY: NUL-terminated strings, NULL optional ones, a writable out.
    let st = unsafe {
        rc_config_new_control(
            url.as_ptr(),
            std::ptr::null(),
            player,
            at.0,
            at.1,
            std::ptr::null(),
            1,
            local.as_ptr(),
            &mut cfg,
        )
    };
    assert_eq!(st, rc_status::RC_OK, "{}", last_error());
    assert_ne!(cfg, 0);
    cfg
}

fn member_groups(h: rc_handle) -> Vec<u16> {
    let mut buf = [0u16; 25];
    let mut n = 0usize;
    // SAFETY: 25 writable u16 and a writable count.
    let st = unsafe { rc_member_groups(h, buf.as_mut_ptr(), buf.len(), &mut n) };
    assert_eq!(st, rc_status::RC_OK, "{}", last_error());
    let mut g = buf[..n].to_vec();
    g.sort_unstable();
    g
}

fn sending_group(h: rc_handle) -> Option<u16> {
    let mut g = 0u16;
    // SAFETY: a writable u16.
    match unsafe { rc_sending_group(h, &mut g) } {
        rc_status::RC_OK => Some(g),
        rc_status::RC_NONE => None,
        e => panic!("rc_sending_group: {e:?} {}", last_error()),
    }
}

/// Updates `h` every millisecond, draining datagrams and collecting its
/// events, until `done` holds; panics after `within`.
fn pump(h: rc_handle, within: Duration, events: &mut Vec<rc_event>, mut done: impl FnMut(&[rc_event]) -> bool) {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; RC_MAX_PAYLOAD];
    for _ in 0..100_000 {
        assert_eq!(rc_update(h, api::now_ms()), rc_status::RC_OK);
        // SAFETY: valid out-pointers and buffers; all-zero is a valid value
        // of each struct (kind NONE, status OK).
        unsafe {
            let mut ev = std::mem::zeroed::<rc_event>();
            while rc_poll_event(h, &mut ev) == rc_status::RC_OK {
                events.push(ev);
            }
            let mut info = std::mem::zeroed::<rc_datagram_info>();
            while rc_recv(h, buf.as_mut_ptr(), buf.len(), &mut info) == rc_status::RC_OK {}
        }
        if done(events) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not done within {within:?}; events: {events:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("not done within the loop's count; events: {events:?}");
}

#[test]
fn config_handles_are_their_own_and_die_when_freed() {
    let cfg = config("http://127.0.0.1:9", 5, (0.0, 0.0));
    assert_eq!(rc_config_set_area_radius(cfg, 2), rc_status::RC_OK);
    let fallback = c("http://127.0.0.1:10");
    // SAFETY: a NUL-terminated string; then NULL, the check under test.
    unsafe {
        assert_eq!(rc_config_add_fallback_url(cfg, fallback.as_ptr()), rc_status::RC_OK);
        assert_eq!(
            rc_config_add_fallback_url(cfg, c("").as_ptr()),
            rc_status::RC_ERR_INVALID_ARGUMENT
        );
        assert_eq!(
            rc_config_add_fallback_url(cfg, std::ptr::null()),
            rc_status::RC_ERR_NULL
        );
    }
    // A config is not a client, nor a client a config.
    assert_eq!(rc_update(cfg, 0), rc_status::RC_ERR_BAD_HANDLE);
    assert_eq!(rc_free(cfg), rc_status::RC_ERR_BAD_HANDLE);
    let m = Reflector::start();
    let t = mint(5, &m);
    let reflector = m.addr().to_string();
    let h = api::new_with_token(
        &TokenParts {
            token: &t.token,
            session_key: &t.session_key,
            player: t.player,
            group: t.group,
            reflector: &reflector,
            expires_unix_s: t.expires_unix_s,
        },
        Some("127.0.0.1:0"),
    )
    .expect("a client starts");
    assert_eq!(rc_config_free(h), rc_status::RC_ERR_BAD_HANDLE);
    assert!(last_error().contains("not a live config"), "{}", last_error());
    assert_eq!(rc_config_set_area_radius(h, 1), rc_status::RC_ERR_BAD_HANDLE);
    // A client handed its tokens does not move by itself.
    assert_eq!(rc_set_position(h, 1.0, 2.0), rc_status::RC_ERR_WRONG_STATE);
    assert!(last_error().contains("handed its tokens"), "{}", last_error());
    assert_eq!(rc_free(h), rc_status::RC_OK);
    m.stop();

    // A client from the config (the config stays live: a second one too).
    let mut a: rc_handle = 0;
    let mut b: rc_handle = 0;
    // SAFETY: writable handles; then NULL, the check under test.
    unsafe {
        assert_eq!(
            rc_client_new_from_config(cfg, &mut a),
            rc_status::RC_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            rc_client_new_from_config(cfg, &mut b),
            rc_status::RC_OK,
            "{}",
            last_error()
        );
        assert_eq!(
            rc_client_new_from_config(cfg, std::ptr::null_mut()),
            rc_status::RC_ERR_NULL
        );
    }
    assert!(a != 0 && b != 0 && a != b && a != cfg);
    assert_eq!(rc_set_position(a, f64::NAN, 0.0), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert_eq!(rc_set_position(a, 100.0, 0.0), rc_status::RC_OK, "{}", last_error());
    assert_eq!(rc_leave(a), rc_status::RC_OK);
    assert_eq!(rc_set_position(a, 200.0, 0.0), rc_status::RC_ERR_WRONG_STATE);
    assert!(last_error().contains("has left"), "{}", last_error());
    assert_eq!(member_groups(a), Vec::<u16>::new());
    assert_eq!(sending_group(a), None);
    assert_eq!(rc_config_free(cfg), rc_status::RC_OK);
    // Freed: stale, a double free refused; the clients keep their copy.
    assert_eq!(rc_config_free(cfg), rc_status::RC_ERR_BAD_HANDLE);
    assert_eq!(rc_config_set_area_radius(cfg, 1), rc_status::RC_ERR_BAD_HANDLE);
    let mut x: rc_handle = 0;
    // SAFETY: a writable handle.
    assert_eq!(
        unsafe { rc_client_new_from_config(cfg, &mut x) },
        rc_status::RC_ERR_BAD_HANDLE
    );
    assert_eq!(rc_update(b, api::now_ms()), rc_status::RC_OK);
    assert_eq!(rc_free(a), rc_status::RC_OK);
    assert_eq!(rc_free(b), rc_status::RC_OK);
}

#[test]
fn the_area_events_have_their_c_form() {
    let e = api::event(Event::Moved { from: 4000, to: 4002 });
    assert_eq!(
        (e.kind, e.from_group, e.group),
        (rc_event_kind::RC_EVENT_MOVED, 4000, 4002)
    );
    let e = api::event(Event::LeftGroup { group: 4001 });
    assert_eq!((e.kind, e.group), (rc_event_kind::RC_EVENT_LEFT_GROUP, 4001));
    let e = api::event(Event::Rejoining {
        group: 4003,
        reason: RejoinReason::ReflectorSilent,
    });
    assert_eq!(
        (e.kind, e.group, e.reason),
        (
            rc_event_kind::RC_EVENT_REJOINING,
            4003,
            rc_rejoin_reason::RC_REJOIN_REFLECTOR_SILENT
        )
    );
    let e = api::event(Event::Renewed {
        group: 4004,
        expires_unix_s: 77,
    });
    assert_eq!(
        (e.kind, e.group, e.expires_unix_s),
        (rc_event_kind::RC_EVENT_RENEWED, 4004, 77)
    );
}

#[test]
fn an_area_client_from_a_config_fails_over_holds_its_area_and_moves() {
    let r = Reflector::start_groups(3);
    let ports = r.ports();
    let control = area_control_server(&r);
    // The first control server is down: every request goes on to the next.
    let cfg = config(&down_url(), 8, centre(0));
    assert_eq!(rc_config_set_area_radius(cfg, 1), rc_status::RC_OK);
    let url = c(&control.url());
    // SAFETY: a NUL-terminated string.
    assert_eq!(
        unsafe { rc_config_add_fallback_url(cfg, url.as_ptr()) },
        rc_status::RC_OK
    );
    let mut h: rc_handle = 0;
    // SAFETY: a writable handle.
    assert_eq!(
        unsafe { rc_client_new_from_config(cfg, &mut h) },
        rc_status::RC_OK,
        "{}",
        last_error()
    );
    assert_eq!(rc_config_free(cfg), rc_status::RC_OK);

    let mut ev = Vec::new();
    let first = {
        let mut g = vec![ports[0], ports[1]];
        g.sort_unstable();
        g
    };
    pump(h, Duration::from_secs(10), &mut ev, |_| {
        rc_is_member(h) == 1 && member_groups(h) == first
    });
    assert_eq!(sending_group(h), Some(ports[0]));
    assert!(
        !ev.iter().any(|e| e.kind == rc_event_kind::RC_EVENT_ERROR),
        "the down server is failed over within the request: {ev:?}"
    );
    // Too small a buffer: the count, and the first ones.
    let mut one = [0u16; 1];
    let mut n = 0usize;
    // SAFETY: one writable u16 and a writable count; then NULL with 0.
    unsafe {
        assert_eq!(
            rc_member_groups(h, one.as_mut_ptr(), 1, &mut n),
            rc_status::RC_ERR_BUFFER_TOO_SMALL
        );
        assert!(n == 2 && first.contains(&one[0]), "{n} {one:?}");
        assert_eq!(
            rc_member_groups(h, std::ptr::null_mut(), 0, &mut n),
            rc_status::RC_ERR_BUFFER_TOO_SMALL
        );
        assert_eq!(n, 2);
    }

    // Across two cells: cell 1's group stays, cell 2's is joined before
    // cell 0's is left.
    let mut ev = Vec::new();
    assert_eq!(rc_set_position(h, centre(2).0, centre(2).1), rc_status::RC_OK);
    pump(h, Duration::from_secs(10), &mut ev, |ev| {
        ev.iter().any(|e| e.kind == rc_event_kind::RC_EVENT_LEFT_GROUP)
    });
    let kinds: Vec<rc_event_kind> = ev.iter().map(|e| e.kind).collect();
    let at = |k: rc_event_kind| kinds.iter().position(|&x| x == k).expect("the event came");
    let moved = ev[at(rc_event_kind::RC_EVENT_MOVED)];
    assert_eq!((moved.from_group, moved.group), (ports[0], ports[2]), "{ev:?}");
    let joined = ev
        .iter()
        .position(|e| e.kind == rc_event_kind::RC_EVENT_JOINED && e.group == ports[2])
        .expect("cell 2 joined");
    let left = at(rc_event_kind::RC_EVENT_LEFT_GROUP);
    assert_eq!(ev[left].group, ports[0]);
    assert!(joined < left, "make-before-break: {ev:?}");
    let mut second = vec![ports[1], ports[2]];
    second.sort_unstable();
    assert_eq!(member_groups(h), second);
    assert_eq!(sending_group(h), Some(ports[2]));
    let mut s = rc_client_stats::default();
    // SAFETY: a writable rc_client_stats.
    assert_eq!(unsafe { rc_stats(h, &mut s) }, rc_status::RC_OK);
    assert_eq!(s.token_requests, 2);
    assert_eq!(rc_free(h), rc_status::RC_OK);
    r.stop();
    assert_eq!(control.stop(), 2, "both requests reached the fallback");
}

/// Adds `m` to the area being handed in to `h` (each group is a port of
/// the test's reflector on loopback).
fn add(h: rc_handle, m: &Minted) -> rc_status {
    let reflector = c(&format!("127.0.0.1:{}", m.group));
    // SAFETY: buffers of the lengths given and a NUL-terminated string.
    unsafe {
        rc_area_add_token(
            h,
            m.token.as_ptr(),
            m.token.len(),
            m.session_key.as_ptr(),
            m.session_key.len(),
            m.player,
            m.group,
            reflector.as_ptr(),
            m.expires_unix_s,
        )
    }
}

#[test]
fn an_area_handed_in_is_joined_and_moved_make_before_break() {
    let r = Reflector::start_groups(3);
    let ports = r.ports();
    let at = format!("127.0.0.1:{}", ports[0]);
    let first = mint_for(9, ports[0]);
    let h = api::new_with_token(
        &TokenParts {
            token: &first.token,
            session_key: &first.session_key,
            player: 9,
            group: ports[0],
            reflector: &at,
            expires_unix_s: first.expires_unix_s,
        },
        Some("127.0.0.1:0"),
    )
    .expect("a client starts");
    let mut ev = Vec::new();
    pump(h, Duration::from_secs(10), &mut ev, |_| rc_is_member(h) == 1);

    // Refusals, each leaving what was added as it was.
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);
    assert!(last_error().contains("no token was added"), "{}", last_error());
    // A refused token drops what was added: nothing is half handed in.
    assert_eq!(add(h, &first), rc_status::RC_OK, "{}", last_error());
    assert_eq!(add(h, &first), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("in the area already"), "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);
    assert_eq!(add(h, &first), rc_status::RC_OK, "{}", last_error());
    assert_eq!(add(h, &mint_for(10, ports[1])), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("for player 9"), "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);
    assert_eq!(add(h, &first), rc_status::RC_OK, "{}", last_error());
    let short = mint_for(9, ports[1]);
    let reflector = c(&format!("127.0.0.1:{}", ports[1]));
    // SAFETY: a 5-byte key said to be 5 bytes (the check under test).
    let st = unsafe {
        rc_area_add_token(
            h,
            short.token.as_ptr(),
            short.token.len(),
            short.session_key.as_ptr(),
            5,
            9,
            ports[1],
            reflector.as_ptr(),
            short.expires_unix_s,
        )
    };
    assert_eq!(st, rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("session key is 5 bytes"), "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);
    // At most RC_MAX_AREA_TOKENS (groups that are never joined: the area
    // is dropped at the one too many).
    for g in 0..RC_MAX_AREA_TOKENS as u16 {
        assert_eq!(add(h, &mint_for(9, 20_000 + g)), rc_status::RC_OK, "{}", last_error());
    }
    assert_eq!(add(h, &mint_for(9, 21_000)), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("at most 25 tokens"), "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);
    assert_eq!(add(9, &first), rc_status::RC_ERR_BAD_HANDLE);
    // The area as it stands, then used up: the next one starts empty.
    assert_eq!(add(h, &first), rc_status::RC_OK, "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_OK, "{}", last_error());
    assert_eq!(rc_set_area(h), rc_status::RC_ERR_WRONG_STATE);

    // The cell (port 0) and one neighbour (port 1).
    let mut ev = Vec::new();
    for (g, m) in [(0, &first), (1, &mint_for(9, ports[1]))] {
        assert_eq!(add(h, m), rc_status::RC_OK, "group {g}: {}", last_error());
    }
    assert_eq!(rc_set_area(h), rc_status::RC_OK, "{}", last_error());
    let both = {
        let mut g = vec![ports[0], ports[1]];
        g.sort_unstable();
        g
    };
    pump(h, Duration::from_secs(10), &mut ev, |_| member_groups(h) == both);
    assert_eq!(sending_group(h), Some(ports[0]));

    // Moved: the cell is port 2, port 1 stays, port 0 is left only after
    // port 2 is a member.
    let mut ev = Vec::new();
    for m in [mint_for(9, ports[2]), mint_for(9, ports[1])] {
        assert_eq!(add(h, &m), rc_status::RC_OK, "{}", last_error());
    }
    assert_eq!(rc_set_area(h), rc_status::RC_OK, "{}", last_error());
    pump(h, Duration::from_secs(10), &mut ev, |ev| {
        ev.iter().any(|e| e.kind == rc_event_kind::RC_EVENT_LEFT_GROUP)
    });
    let joined = ev
        .iter()
        .position(|e| e.kind == rc_event_kind::RC_EVENT_JOINED && e.group == ports[2])
        .expect("port 2 joined");
    let moved = ev
        .iter()
        .position(|e| e.kind == rc_event_kind::RC_EVENT_MOVED)
        .expect("sends moved");
    let left = ev
        .iter()
        .position(|e| e.kind == rc_event_kind::RC_EVENT_LEFT_GROUP)
        .expect("port 0 left");
    assert_eq!((ev[moved].from_group, ev[moved].group), (ports[0], ports[2]), "{ev:?}");
    assert_eq!(ev[left].group, ports[0]);
    assert!(joined < left, "make-before-break: {ev:?}");
    let mut second = vec![ports[1], ports[2]];
    second.sort_unstable();
    assert_eq!(member_groups(h), second);
    assert_eq!(sending_group(h), Some(ports[2]));
    assert_eq!(rc_free(h), rc_status::RC_OK);
    // A freed handle takes no token.
    assert_eq!(add(h, &first), rc_status::RC_ERR_BAD_HANDLE);
    r.stop();
}
