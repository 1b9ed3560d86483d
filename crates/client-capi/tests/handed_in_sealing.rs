//! Sealed groups for a game that fetches its own tokens (1.6), through the
//! C ABI's entry points as C calls them: the test plays the game's
//! backend, asking an in-process control server with a sealing secret for
//! `/join` with the client's `sign_key` (`rc_sign_key` of a client made
//! before its first token, `rc_client_new_handed_in`) and handing in what
//! the answer holds (`rc_set_token`, `rc_set_epoch_keys`,
//! `rc_set_checkpoint_certificate`). Two such clients exchange sealed DATA
//! through a sealed reflector, and one uploads a checkpoint the other
//! fetches, checks and takes as signed. A checkpoint sealed for another
//! group and a garbage state are each refused by the joiner's checks and
//! named (`rc_checkpoint_event.check`, `rc_check_name`); a sealed group
//! with no key handed in sends nothing and says why, and wrong lengths
//! are refused naming the argument. A client made from a config that
//! names a control server for `/keys` (1.8, `rc_config_set_keys_from`)
//! gets the epoch key that follows the last one its game handed in from
//! there, and the same client without it does not. Every wait has a
//! deadline and every loop a count.

#![allow(unsafe_code, reason = "calls the C ABI's entry points as C would")]

mod common;

use common::Reflector;
use reflector_c::api;
use reflector_c::ffi::*;
use reflector_c::types::*;
use reflector_proto::control::KeyedGrant;
use std::ffi::CStr;
use std::time::{Duration, Instant};

const TICK: u64 = 777;

fn last_error() -> String {
    let mut buf = [0u8; 1024];
    let n = api::last_error(&mut buf);
    String::from_utf8_lossy(&buf[..n.min(1023)]).into_owned()
}

fn ok(st: rc_status, what: &str) {
    assert_eq!(st, rc_status::RC_OK, "{what}: {}", last_error());
}

/// One grant of a `/join` answer as a game's backend reads it: the hex
/// fields decoded, the keys as `rc_epoch_key`s in the answer's order.
#[derive(Clone)]
struct Grant {
    player: u32,
    group: u16,
    reflector: String,
    expires_unix_s: u64,
    token: Vec<u8>,
    session_key: Vec<u8>,
    keys: Vec<rc_epoch_key>,
    control_public: Vec<u8>,
    certificate: Vec<u8>,
}

fn unhex(what: &str, s: &str) -> Vec<u8> {
    hex::decode(s).unwrap_or_else(|e| panic!("{what} is not hex ({e}): {s}"))
}

fn grant(g: &KeyedGrant) -> Grant {
    let keys = g
        .keys
        .iter()
        .map(|k| rc_epoch_key {
            cell_x: k.cell[0],
            cell_y: k.cell[1],
            epoch: k.epoch,
            reserved: 0,
            cell_id: unhex("cell_id", &k.cell_id).try_into().expect("8 bytes"),
            key: unhex("key", &k.key).try_into().expect("32 bytes"),
            starts_unix_s: k.starts_unix_s,
            ends_unix_s: k.ends_unix_s,
        })
        .collect();
    Grant {
        player: g.grant.player,
        group: g.grant.group,
        reflector: g.grant.reflector.clone(),
        expires_unix_s: g.grant.expires_unix_s,
        token: unhex("token", &g.grant.token),
        session_key: unhex("session_key", &g.grant.session_key),
        keys,
        control_public: unhex("control_public", g.control_public.as_deref().expect("control_public")),
        certificate: unhex("certificate", g.certificate.as_deref().expect("certificate")),
    }
}

/// The game's backend: `/join` with `sign_key`, its cell grant decoded.
fn backend_join(url: &str, player: u32, position: (f64, f64), sign_key: &[u8]) -> Grant {
    grant(&common::sealed_join(url, player, position, sign_key))
}

fn sign_key(h: rc_handle) -> [u8; RC_SIGN_KEY_LEN] {
    let mut k = [0u8; RC_SIGN_KEY_LEN];
    // SAFETY: a buffer of its length.
    ok(unsafe { rc_sign_key(h, k.as_mut_ptr(), k.len()) }, "rc_sign_key");
    k
}

/// A client made before its first token (nothing sent yet).
fn new_client(fetch_on_join: bool) -> rc_handle {
    let mut h = 0;
    // SAFETY: a NUL-terminated string and an out-pointer.
    ok(
        unsafe { rc_client_new_handed_in(c"127.0.0.1:0".as_ptr(), &mut h) },
        "rc_client_new_handed_in",
    );
    ok(
        rc_checkpoint_configure(h, i32::from(fetch_on_join), 0, 0),
        "rc_checkpoint_configure",
    );
    h
}

fn set_token(h: rc_handle, g: &Grant) {
    let reflector = std::ffi::CString::new(g.reflector.clone()).expect("no NUL");
    // SAFETY: each pointer with its length, a NUL-terminated string.
    let st = unsafe {
        rc_set_token(
            h,
            g.token.as_ptr(),
            g.token.len(),
            g.session_key.as_ptr(),
            g.session_key.len(),
            g.player,
            g.group,
            reflector.as_ptr(),
            g.expires_unix_s,
        )
    };
    ok(st, "rc_set_token");
}

fn set_keys(h: rc_handle, group: u16, keys: &[rc_epoch_key]) -> rc_status {
    // SAFETY: `keys.len()` keys at `keys`.
    unsafe { rc_set_epoch_keys(h, group, keys.as_ptr(), keys.len()) }
}

fn set_certificate(h: rc_handle, g: &Grant) -> rc_status {
    // SAFETY: each pointer with its length.
    unsafe {
        rc_set_checkpoint_certificate(
            h,
            g.group,
            g.control_public.as_ptr(),
            g.control_public.len(),
            g.certificate.as_ptr(),
            g.certificate.len(),
            g.expires_unix_s,
        )
    }
}

/// Everything a `/join` answer gives, handed in: what a game does.
fn hand_in(h: rc_handle, g: &Grant) {
    set_token(h, g);
    ok(set_keys(h, g.group, &g.keys), "rc_set_epoch_keys");
    ok(set_certificate(h, g), "rc_set_checkpoint_certificate");
}

/// What one update of the game loop saw.
#[derive(Default)]
struct Seen {
    checkpoints: Vec<rc_checkpoint_event>,
    data: Vec<(u32, Vec<u8>)>,
    /// (check, its name, the message) of each FAILED event.
    failed: Vec<(u8, String)>,
}

/// One frame of `h`: update, drain events, DATA and checkpoint events;
/// answers a REQUESTED with `provide` when given.
fn frame(h: rc_handle, provide: Option<&[u8]>, seen: &mut Seen) {
    ok(rc_update(h, api::now_ms()), "rc_update");
    let mut ev = event_none();
    // SAFETY: a writable event.
    while unsafe { rc_poll_event(h, &mut ev) } == rc_status::RC_OK {}
    let mut buf = [0u8; RC_MAX_PAYLOAD];
    let mut info = rc_datagram_info {
        group: 0,
        sender: 0,
        instance: 0,
        seq: 0,
        len: 0,
        truncated: 0,
    };
    // SAFETY: a buffer of its length and a writable info.
    while unsafe { rc_recv(h, buf.as_mut_ptr(), buf.len(), &mut info) } == rc_status::RC_OK {
        seen.data.push((info.sender, buf[..info.len].to_vec()));
    }
    let mut ck = checkpoint_none();
    // SAFETY: a writable checkpoint event.
    while unsafe { rc_poll_checkpoint(h, &mut ck) } == rc_status::RC_OK {
        if ck.kind == rc_checkpoint_kind::RC_CHECKPOINT_REQUESTED {
            if let Some(state) = provide {
                // SAFETY: `state.len()` bytes at `state`.
                let st = unsafe { rc_provide_checkpoint(h, TICK, state.as_ptr(), state.len()) };
                assert!(
                    matches!(st, rc_status::RC_OK | rc_status::RC_ERR_IN_FLIGHT),
                    "rc_provide_checkpoint: {st:?} {}",
                    last_error()
                );
            }
        }
        if ck.kind == rc_checkpoint_kind::RC_CHECKPOINT_FAILED {
            seen.failed.push((ck.check, last_error()));
        }
        seen.checkpoints.push(ck);
    }
}

fn checkpoint_none() -> rc_checkpoint_event {
    rc_checkpoint_event {
        kind: rc_checkpoint_kind::RC_CHECKPOINT_NONE,
        group: 0,
        op: rc_checkpoint_op::RC_CHECKPOINT_OP_NONE,
        number: 0,
        tick: 0,
        from_player: 0,
        age_ms: 0,
        len: 0,
        error: rc_status::RC_OK,
        refusal: 0,
        verification: 0,
        check: 0,
    }
}

fn event_none() -> rc_event {
    rc_event {
        kind: rc_event_kind::RC_EVENT_NONE,
        group: 0,
        members: 0,
        rejoin: 0,
        from_group: 0,
        reason: rc_rejoin_reason::RC_REJOIN_NONE,
        player: 0,
        move_reason: 0,
        within_ms: 0,
        instance: 0,
        expires_unix_s: 0,
        error: rc_status::RC_OK,
    }
}

/// Runs frames of `clients` (each with the state it provides when asked)
/// every millisecond until `done`; panics after 10 s.
fn pump(clients: &[(rc_handle, Option<&[u8]>)], seen: &mut [Seen], mut done: impl FnMut(&[Seen]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..100_000 {
        for (i, &(h, provide)) in clients.iter().enumerate() {
            frame(h, provide, &mut seen[i]);
        }
        if done(seen) {
            return;
        }
        assert!(Instant::now() < deadline, "not done within 10 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("not done within the loop's count");
}

fn kinds(s: &Seen, kind: rc_checkpoint_kind) -> Vec<rc_checkpoint_event> {
    s.checkpoints.iter().copied().filter(|e| e.kind == kind).collect()
}

/// The state a client uploads (a marker and padding).
fn state(marker: &str) -> Vec<u8> {
    let mut s = marker.as_bytes().to_vec();
    s.resize(3000, b'.');
    s
}

#[test]
fn handed_in_clients_exchange_sealed_data_and_a_signed_checkpoint() {
    let r = Reflector::start_sealed_checkpoints(1);
    let control = common::sealing_control_server(&r);
    let url = control.url();
    let centre = common::centre(0);

    // A: made first, its sign_key on its first /join, everything handed in.
    let a = new_client(false);
    assert_eq!(rc_is_member(a), 0, "no token yet: no group");
    let ga = backend_join(&url, 1, centre, &sign_key(a));
    hand_in(a, &ga);
    let up = state("the state A had at its tick");
    let mut seen = vec![Seen::default(), Seen::default()];
    pump(&[(a, Some(&up))], &mut seen[..1], |s| {
        !kinds(&s[0], rc_checkpoint_kind::RC_CHECKPOINT_UPLOADED).is_empty() || !s[0].failed.is_empty()
    });
    assert!(seen[0].failed.is_empty(), "A's upload failed: {:?}", seen[0].failed);

    // B joins later, fetches on join and checks what A uploaded.
    let b = new_client(true);
    let gb = backend_join(&url, 2, centre, &sign_key(b));
    hand_in(b, &gb);
    pump(&[(a, Some(&up)), (b, None)], &mut seen, |s| {
        s[1].checkpoints
            .iter()
            .any(|e| e.kind != rc_checkpoint_kind::RC_CHECKPOINT_REQUESTED)
    });
    let got = kinds(&seen[1], rc_checkpoint_kind::RC_CHECKPOINT_READY);
    assert_eq!(got.len(), 1, "B's fetch on join: {:?}", seen[1].failed);
    let ready = got[0];
    assert_eq!(ready.verification, RC_VERIFICATION_SIGNED, "one member's signed word");
    assert_eq!((ready.from_player, ready.tick, ready.check), (1, TICK, RC_CHECK_NONE));
    let mut buf = vec![0u8; ready.len];
    let (mut len, mut tick) = (0usize, 0u64);
    // SAFETY: a buffer of its length and out-pointers.
    ok(
        unsafe { rc_checkpoint_take(b, buf.as_mut_ptr(), buf.len(), &mut len, &mut tick) },
        "rc_checkpoint_take",
    );
    assert!(buf[..len] == up[..], "B took exactly A's state");

    // Sealed DATA both ways.
    assert_eq!(rc_max_payload(a), 1400, "a sealed group");
    let deadline = Instant::now() + Duration::from_secs(10);
    let heard = |s: &Seen, from: u32, what: &[u8]| s.data.iter().any(|(p, d)| *p == from && d == what);
    for _ in 0..10_000 {
        if heard(&seen[0], 2, b"from B") && heard(&seen[1], 1, b"from A") {
            break;
        }
        assert!(Instant::now() < deadline, "the sealed DATA did not arrive within 10 s");
        for (h, msg) in [(a, &b"from A"[..]), (b, &b"from B"[..])] {
            // SAFETY: `msg.len()` bytes at `msg`; `seq` may be NULL.
            ok(
                unsafe { rc_send(h, msg.as_ptr(), msg.len(), std::ptr::null_mut()) },
                "rc_send",
            );
        }
        pump(&[(a, None), (b, None)], &mut seen, |_| true);
        std::thread::sleep(Duration::from_millis(10));
    }
    for h in [a, b] {
        let mut s = rc_sealing_counters::default();
        // SAFETY: a writable out-pointer.
        ok(unsafe { rc_sealing_stats(h, &mut s) }, "rc_sealing_stats");
        assert_eq!(s, rc_sealing_counters::default(), "nothing refused, no /keys asked");
        ok(rc_free(h), "rc_free");
    }
    r.stop();
    control.stop();
}

/// Runs one uploader (player 1, handed the cell-0 token with `keys`
/// instead of its own, and its genuine certificate) and a joiner (player
/// 2, everything genuine) in cell 0 of a world of two sealed cells: the
/// joiner's fetch of the uploader's checkpoint, its FAILED event's check
/// and message, and its counters.
fn joiner_refuses(
    keys: impl Fn(&Grant, &Grant) -> Vec<rc_epoch_key>,
) -> (rc_checkpoint_event, String, rc_sealing_counters) {
    let r = Reflector::start_sealed_checkpoints(2);
    let control = common::sealing_control_server(&r);
    let url = control.url();
    let u = new_client(false);
    let gu = backend_join(&url, 1, common::centre(0), &sign_key(u));
    let other = backend_join(&url, 1, common::centre(1), &sign_key(u));
    assert_ne!(gu.group, other.group, "two cells, two groups");
    set_token(u, &gu);
    ok(set_keys(u, gu.group, &keys(&gu, &other)), "rc_set_epoch_keys");
    // The certificate is checked against the world of the keys held:
    // both cells are of one world, so it is taken.
    ok(set_certificate(u, &gu), "rc_set_checkpoint_certificate");
    let up = state("an uploader's state");
    let mut seen = vec![Seen::default(), Seen::default()];
    pump(&[(u, Some(&up))], &mut seen[..1], |s| {
        !kinds(&s[0], rc_checkpoint_kind::RC_CHECKPOINT_UPLOADED).is_empty()
    });
    let j = new_client(true);
    let gj = backend_join(&url, 2, common::centre(0), &sign_key(j));
    hand_in(j, &gj);
    pump(&[(u, None), (j, None)], &mut seen, |s| {
        s[1].checkpoints
            .iter()
            .any(|e| e.kind != rc_checkpoint_kind::RC_CHECKPOINT_REQUESTED)
    });
    let ended = seen[1]
        .checkpoints
        .iter()
        .copied()
        .find(|e| e.kind != rc_checkpoint_kind::RC_CHECKPOINT_REQUESTED)
        .expect("the fetch ended");
    let message = seen[1].failed.first().map(|(_, m)| m.clone()).unwrap_or_default();
    let mut counters = rc_sealing_counters::default();
    // SAFETY: a writable out-pointer.
    ok(unsafe { rc_sealing_stats(j, &mut counters) }, "rc_sealing_stats");
    ok(rc_free(u), "rc_free");
    ok(rc_free(j), "rc_free");
    r.stop();
    control.stop();
    (ended, message, counters)
}

fn name(check: u8) -> Option<String> {
    let p = rc_check_name(check);
    // SAFETY: NULL or a static NUL-terminated string.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn assert_refused(e: rc_checkpoint_event, message: &str, check: u8, counter: &str) {
    assert_eq!(
        (e.kind, e.op, e.error),
        (
            rc_checkpoint_kind::RC_CHECKPOINT_FAILED,
            rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH,
            rc_status::RC_ERR_PROTOCOL
        ),
        "a refused checkpoint reached the game or failed otherwise ({message})"
    );
    assert_eq!(e.check, check, "{message}");
    assert_eq!(e.refusal, 0, "the reflector refused nothing");
    assert_eq!(e.verification, RC_VERIFICATION_NONE);
    assert_eq!(name(e.check).as_deref(), Some(counter));
    assert!(
        message.contains(counter) && message.contains("joiner's checks"),
        "{message}"
    );
}

#[test]
fn a_checkpoint_sealed_for_another_group_is_refused_as_the_wrong_cell() {
    // The uploader seals under cell 1's genuine keys (another group's).
    let (e, message, s) = joiner_refuses(|_, other| other.keys.clone());
    assert_refused(e, &message, RC_CHECK_WRONG_CELL, "checkpoint_wrong_cell");
    assert_eq!((s.checkpoint_wrong_cell, s.checkpoint_bad), (1, 0));
}

#[test]
fn a_garbage_state_is_refused_as_bad() {
    // The uploader holds its cell's id and epochs under keys nobody else
    // has: certified and signed, but garbage to the group.
    let (e, message, s) = joiner_refuses(|own, _| {
        own.keys
            .iter()
            .map(|k| rc_epoch_key {
                key: k.key.map(|b| b ^ 0x5a),
                ..*k
            })
            .collect()
    });
    assert_refused(e, &message, RC_CHECK_BAD, "checkpoint_bad");
    assert_eq!((s.checkpoint_wrong_cell, s.checkpoint_bad), (0, 1));
}

#[test]
fn refusals_name_what_is_wrong_and_nothing_is_sent_without_a_key() {
    let r = Reflector::start_sealed_checkpoints(1);
    let control = common::sealing_control_server(&r);
    let url = control.url();
    let h = new_client(false);
    let key = sign_key(h);
    let g = backend_join(&url, 5, common::centre(0), &key);

    // Before any token: no group to hand anything in for.
    assert_eq!(set_keys(h, g.group, &g.keys), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains(&format!("no group {}", g.group)),
        "{}",
        last_error()
    );
    // The signing key needs its 32 bytes.
    let mut short = [0u8; 16];
    // SAFETY: a buffer of its length.
    let st = unsafe { rc_sign_key(h, short.as_mut_ptr(), short.len()) };
    assert_eq!(st, rc_status::RC_ERR_BUFFER_TOO_SMALL);
    assert!(last_error().contains("32 bytes"), "{}", last_error());

    // A sealed group with the token only: a member that sends nothing.
    set_token(h, &g);
    let mut seen = vec![Seen::default()];
    pump(&[(h, None)], &mut seen, |_| rc_is_member(h) == 1);
    // SAFETY: 4 bytes; `seq` may be NULL.
    let st = unsafe { rc_send(h, b"move".as_ptr(), 4, std::ptr::null_mut()) };
    assert_eq!(st, rc_status::RC_ERR_WRONG_STATE);
    assert!(last_error().contains("no sealing key is held"), "{}", last_error());
    let mut stats = rc_client_stats::default();
    // SAFETY: a writable out-pointer.
    ok(unsafe { rc_stats(h, &mut stats) }, "rc_stats");
    assert_eq!((stats.data_sent, stats.bytes_sent), (0, 0), "nothing was sent");

    // Wrong lengths, each named.
    let mut bad = g.clone();
    bad.control_public.pop();
    assert_eq!(set_certificate(h, &bad), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("control_public is 31 bytes; it must be 32"),
        "{}",
        last_error()
    );
    let mut bad = g.clone();
    bad.certificate.push(0);
    assert_eq!(set_certificate(h, &bad), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("the certificate is 65 bytes; it must be 64"),
        "{}",
        last_error()
    );
    // Keys: none, a reserved field set, an epoch that ends before it starts.
    // SAFETY: NULL with 0.
    let st = unsafe { rc_set_epoch_keys(h, g.group, std::ptr::null(), 0) };
    assert_eq!(st, rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("no epoch key given"), "{}", last_error());
    let mut keys = g.keys.clone();
    keys.push(rc_epoch_key { reserved: 1, ..keys[0] });
    assert_eq!(set_keys(h, g.group, &keys), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains(&format!("epoch key {}: reserved", keys.len() - 1)),
        "{}",
        last_error()
    );
    let backwards = rc_epoch_key {
        starts_unix_s: keys[0].ends_unix_s,
        ends_unix_s: keys[0].starts_unix_s,
        ..keys[0]
    };
    assert_eq!(set_keys(h, g.group, &[backwards]), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("epoch key 0: the key of cell"),
        "{}",
        last_error()
    );
    // Still no key held: a refused call handed nothing in.
    // SAFETY: as above.
    let st = unsafe { rc_send(h, b"move".as_ptr(), 4, std::ptr::null_mut()) };
    assert_eq!(st, rc_status::RC_ERR_WRONG_STATE);

    // With the keys, a certificate of another client's key is refused.
    ok(set_keys(h, g.group, &g.keys), "rc_set_epoch_keys");
    let stranger = backend_join(&url, 5, common::centre(0), &[9u8; 32]);
    let mut theirs = g.clone();
    theirs.certificate = stranger.certificate;
    theirs.expires_unix_s = stranger.expires_unix_s;
    assert_eq!(set_certificate(h, &theirs), rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(
        last_error().contains("does not verify under control_public") && last_error().contains("sign_key"),
        "{}",
        last_error()
    );
    ok(set_certificate(h, &g), "the grant's own certificate");
    // SAFETY: as above.
    ok(
        unsafe { rc_send(h, b"move".as_ptr(), 4, std::ptr::null_mut()) },
        "rc_send with a key",
    );

    // The checks' names.
    assert_eq!(name(RC_CHECK_NONE), None);
    assert_eq!(name(RC_CHECK_MALFORMED).as_deref(), Some("checkpoint_malformed"));
    assert_eq!(name(RC_CHECK_WRONG_CELL).as_deref(), Some("checkpoint_wrong_cell"));
    assert_eq!(name(RC_CHECK_BAD).as_deref(), Some("checkpoint_bad"));
    assert_eq!(name(10), None);
    // The handed-in calls came with 1.6; later minor versions keep them.
    let v = rc_version();
    assert!(v >> 16 == 1 && v & 0xffff >= 6, "a library of 1.6 or later, got {v:#x}");
    ok(rc_free(h), "rc_free");
    r.stop();
    control.stop();
}

// ---- Keys from a control server (1.8) ----------------------------------

/// A client handed its tokens, made from a config of
/// `rc_config_new_handed_in` that names `url` (and then each of
/// `fallbacks`) for `/keys`, plain HTTP allowed (the test's loopback), or
/// names none (`None`).
fn new_client_keys_from(url: Option<&str>, fallbacks: &[&str]) -> rc_handle {
    let mut cfg: rc_config = 0;
    // SAFETY: a NUL-terminated string and an out-pointer.
    ok(
        unsafe { rc_config_new_handed_in(c"127.0.0.1:0".as_ptr(), &mut cfg) },
        "rc_config_new_handed_in",
    );
    if let Some(url) = url {
        let url = std::ffi::CString::new(url).expect("no NUL");
        // SAFETY: a NUL-terminated string; NULL ca_file (the usual roots).
        ok(
            unsafe { rc_config_set_keys_from(cfg, url.as_ptr(), std::ptr::null(), 1) },
            "rc_config_set_keys_from",
        );
    }
    for f in fallbacks {
        let f = std::ffi::CString::new(*f).expect("no NUL");
        // SAFETY: a NUL-terminated string.
        ok(
            unsafe { rc_config_add_fallback_url(cfg, f.as_ptr()) },
            "rc_config_add_fallback_url",
        );
    }
    let mut h = 0;
    // SAFETY: an out-pointer.
    ok(
        unsafe { rc_client_new_from_config(cfg, &mut h) },
        "rc_client_new_from_config",
    );
    // The client has its copy: the config goes at once.
    ok(rc_config_free(cfg), "rc_config_free");
    ok(rc_checkpoint_configure(h, 0, 0, 0), "rc_checkpoint_configure");
    h
}

/// The key of the epoch before `k`'s, for `k`'s cell (derived from the
/// test world's master secret, as the control server derives it), with
/// the times of a key near its end: valid from 10 s ago, ending in 30 s,
/// within the overlap window, so a `/keys` refresh is due at once.
fn previous_epoch_near_its_end(k: &rc_epoch_key) -> rc_epoch_key {
    use reflector_proto::sealed::{CellId, MasterSecret, WorldId};
    let master = MasterSecret::new(&common::SEALING_MASTER).expect("the test world's master secret");
    let cell = CellId::new(WorldId::from_name(common::SEALING_WORLD), k.cell_x, k.cell_y).expect("a cell");
    assert_eq!(
        cell.0, k.cell_id,
        "the test derives the cell as the control server does"
    );
    let previous = master.epoch_key(cell, k.epoch - 1);
    let now = reflector_proto::unix_now_ms() / 1000;
    rc_epoch_key {
        epoch: k.epoch - 1,
        key: *previous.as_bytes(),
        starts_unix_s: now - 10,
        ends_unix_s: now + 30,
        ..*k
    }
}

fn sealing_counters(h: rc_handle) -> rc_sealing_counters {
    let mut s = rc_sealing_counters::default();
    // SAFETY: a writable out-pointer.
    ok(unsafe { rc_sealing_stats(h, &mut s) }, "rc_sealing_stats");
    s
}

/// The point of `rc_config_set_keys_from`: a game that hands its tokens in
/// and last handed in the key of the epoch before the current one, near
/// its end (its next renewal further off than the overlap window), has
/// its client ask the control server's `/keys` for what follows, with the
/// membership's token, and then opens what the group seals under the
/// current epoch. The first control server named is down: its fallback
/// answers. The same client, from a config that names no control server
/// for `/keys`, asks nothing and cannot open that DATA (no key for its
/// epoch), as a 1.7 client handed its tokens could not.
#[test]
fn a_handed_in_client_with_keys_from_gets_the_next_epochs_key_from_keys() {
    let r = Reflector::start_sealed();
    let control = common::sealing_control_server(&r);
    let url = control.url();
    let centre = common::centre(0);

    // The sender: every key of its grant handed in, sealing under the
    // current epoch.
    let sender = new_client(false);
    hand_in(sender, &backend_join(&url, 3, centre, &sign_key(sender)));

    // Two clients whose game hands in the token and only the previous
    // epoch's key, each from a config: one names the control server for
    // /keys (behind one that is down), the other does not.
    let down = common::down_url();
    let with = new_client_keys_from(Some(&down), &[&url]);
    let without = new_client_keys_from(None, &[]);
    let mut current_epoch = 0;
    for (h, player) in [(with, 1), (without, 2)] {
        let g = backend_join(&url, player, centre, &sign_key(h));
        set_token(h, &g);
        current_epoch = g.keys[0].epoch;
        ok(
            set_keys(h, g.group, &[previous_epoch_near_its_end(&g.keys[0])]),
            "rc_set_epoch_keys (the previous epoch only)",
        );
    }

    let clients = [(sender, None), (with, None), (without, None)];
    let mut seen = vec![Seen::default(), Seen::default(), Seen::default()];
    pump(&clients, &mut seen, |_| {
        clients.iter().all(|&(h, _)| rc_is_member(h) == 1)
    });
    // The sender sends until `with` opens its DATA: within the refresh's
    // jitter (KEYS_REFRESH_JITTER, 3 s) and the answer.
    let from_sender = |s: &Seen| s.data.iter().any(|(p, d)| *p == 3 && d == b"under the current epoch");
    let deadline = Instant::now() + Duration::from_secs(15);
    for _ in 0..10_000 {
        if from_sender(&seen[1]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the client with keys_from never opened the current epoch's DATA: {:?}",
            sealing_counters(with)
        );
        let msg = b"under the current epoch";
        // SAFETY: `msg.len()` bytes at `msg`; `seq` may be NULL.
        ok(
            unsafe { rc_send(sender, msg.as_ptr(), msg.len(), std::ptr::null_mut()) },
            "rc_send",
        );
        pump(&clients, &mut seen, |_| true);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(from_sender(&seen[1]), "opened within the loop's count");

    let w = sealing_counters(with);
    assert!(
        w.keys_requests >= 1 && w.keys_refreshes >= 1,
        "asked /keys and got an answer: {w:?}"
    );
    assert_eq!(
        w.keys_refresh_failures, 0,
        "the fallback answered for the server that is down: {w:?}"
    );
    assert_eq!(w.bad, 0, "{w:?}");
    // The game handed in epoch e - 1 only: the key that opened the
    // sender's epoch-e DATA came from /keys.
    assert!(current_epoch > 1, "an epoch with one before it: {current_epoch}");

    let wo = sealing_counters(without);
    assert_eq!(
        wo.keys_requests, 0,
        "no control server named for /keys: nothing asked ({wo:?})"
    );
    assert!(
        !from_sender(&seen[2]),
        "the client without keys_from holds no key of the current epoch"
    );
    assert!(wo.no_key > 0, "the sender's DATA reached it and found no key: {wo:?}");
    for h in [sender, with, without] {
        ok(rc_free(h), "rc_free");
    }
    r.stop();
    control.stop();
}

fn keys_from(cfg: rc_config, url: Option<&str>, ca_file: Option<&str>, allow_plain_http: bool) -> rc_status {
    let url = url.map(|u| std::ffi::CString::new(u).expect("no NUL"));
    let ca = ca_file.map(|c| std::ffi::CString::new(c).expect("no NUL"));
    let ptr = |s: &Option<std::ffi::CString>| s.as_ref().map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: NULL or NUL-terminated strings.
    unsafe { rc_config_set_keys_from(cfg, ptr(&url), ptr(&ca), i32::from(allow_plain_http)) }
}

fn fallback(cfg: rc_config, url: &str) -> rc_status {
    let url = std::ffi::CString::new(url).expect("no NUL");
    // SAFETY: a NUL-terminated string.
    unsafe { rc_config_add_fallback_url(cfg, url.as_ptr()) }
}

fn refused(st: rc_status, code: rc_status, words: &str) {
    assert_eq!(st, code, "{}", last_error());
    assert!(last_error().contains(words), "want {words:?} in: {}", last_error());
}

/// `rc_config_set_keys_from` and the config calls around it refuse what
/// cannot work, each with a message that says what, before anything is
/// set; a refused call leaves the config as it was.
#[test]
fn keys_from_refusals_name_what_is_wrong() {
    use rc_status::*;
    let v = rc_version();
    assert!(v >> 16 == 1 && v & 0xffff >= 8, "a library of 1.8 or later, got {v:#x}");
    let mut cfg: rc_config = 0;
    // SAFETY: NULL local (any) and an out-pointer.
    ok(
        unsafe { rc_config_new_handed_in(std::ptr::null(), &mut cfg) },
        "rc_config_new_handed_in",
    );
    // SAFETY: a NULL out-pointer: the check under test.
    refused(
        unsafe { rc_config_new_handed_in(std::ptr::null(), std::ptr::null_mut()) },
        RC_ERR_NULL,
        "out is NULL",
    );

    // Before a control server is named, a fallback has nothing to follow.
    refused(
        fallback(cfg, "https://control-b.example"),
        RC_ERR_INVALID_ARGUMENT,
        "names no control server for /keys yet: rc_config_set_keys_from first",
    );
    refused(keys_from(cfg, None, None, false), RC_ERR_NULL, "url is NULL");
    refused(
        keys_from(cfg, Some(""), None, false),
        RC_ERR_INVALID_ARGUMENT,
        "the keys_from URL is empty",
    );
    refused(
        keys_from(cfg, Some("http://127.0.0.1:9"), None, false),
        RC_ERR_INVALID_ARGUMENT,
        "refusing plain HTTP to http://127.0.0.1:9 (the keys_from URL)",
    );
    assert!(last_error().contains("allow_plain_http"), "{}", last_error());
    refused(
        keys_from(cfg, Some("ftp://control.example"), None, true),
        RC_ERR_INVALID_ARGUMENT,
        "ftp://control.example is neither https:// nor http://",
    );
    refused(
        keys_from(cfg, Some("https://control.example"), Some(""), false),
        RC_ERR_INVALID_ARGUMENT,
        "ca_file is empty",
    );
    refused(
        keys_from(cfg, Some("https://control.example"), Some("/nonexistent/ca.pem"), false),
        RC_ERR_INVALID_ARGUMENT,
        "cannot read the CA file /nonexistent/ca.pem",
    );
    refused(
        keys_from(cfg, Some("https://control.example"), Some("/"), false),
        RC_ERR_INVALID_ARGUMENT,
        "cannot read the CA file /",
    );
    // None of those set anything: a fallback is still refused.
    refused(
        fallback(cfg, "https://control-b.example"),
        RC_ERR_INVALID_ARGUMENT,
        "rc_config_set_keys_from first",
    );

    // Named (HTTPS, a readable CA file): fallbacks follow, checked alike.
    let ca = common::scratch("keys_from").join("ca.pem");
    std::fs::write(&ca, "not checked until a request\n").expect("write the CA file");
    ok(
        keys_from(cfg, Some("https://control-a.example"), ca.to_str(), false),
        "rc_config_set_keys_from",
    );
    ok(fallback(cfg, "https://control-b.example"), "an HTTPS fallback");
    refused(
        fallback(cfg, "http://control-c.example"),
        RC_ERR_INVALID_ARGUMENT,
        "refusing plain HTTP to http://control-c.example (the fallback URL)",
    );
    refused(fallback(cfg, ""), RC_ERR_INVALID_ARGUMENT, "the fallback URL is empty");
    // A config handed its tokens has no area to ask for.
    refused(
        rc_config_set_area_radius(cfg, 1),
        RC_ERR_INVALID_ARGUMENT,
        "the game hands its area in (rc_area_add_token, rc_set_area)",
    );

    // A client from it is a client handed its tokens: no group, nothing
    // sent, its signing key there at once.
    let mut h = 0;
    // SAFETY: an out-pointer.
    ok(
        unsafe { rc_client_new_from_config(cfg, &mut h) },
        "rc_client_new_from_config",
    );
    assert_eq!(rc_is_member(h), 0, "no token yet: no group");
    assert_ne!(sign_key(h), [0u8; RC_SIGN_KEY_LEN]);
    ok(rc_update(h, api::now_ms()), "rc_update");
    assert_eq!(
        sealing_counters(h).keys_requests,
        0,
        "no group held: nothing to refresh"
    );
    refused(rc_set_position(h, 1.0, 1.0), RC_ERR_WRONG_STATE, "");
    // A client's handle is not a config's, nor the other way round.
    refused(
        keys_from(h, Some("https://control.example"), None, false),
        RC_ERR_BAD_HANDLE,
        "is not a live config",
    );
    refused(
        rc_set_position(cfg, 1.0, 1.0),
        RC_ERR_BAD_HANDLE,
        "is not a live client",
    );
    ok(rc_free(h), "rc_free");

    // A config that asks the control server for its tokens refreshes its
    // keys there: it takes no keys_from.
    let mut control: rc_config = 0;
    // SAFETY: NUL-terminated strings, NULLs where optional, an out-pointer.
    ok(
        unsafe {
            rc_config_new_control(
                c"https://control.example".as_ptr(),
                std::ptr::null(),
                1,
                0.0,
                0.0,
                std::ptr::null(),
                0,
                std::ptr::null(),
                &mut control,
            )
        },
        "rc_config_new_control",
    );
    refused(
        keys_from(control, Some("https://control.example"), None, false),
        RC_ERR_INVALID_ARGUMENT,
        "keys_from is for a config of a client handed its tokens (rc_config_new_handed_in)",
    );
    // Its fallbacks and area are as in 1.2 (unchecked until a request).
    ok(
        fallback(control, "http://control-b.example"),
        "a control config's fallback",
    );
    ok(rc_config_set_area_radius(control, 1), "a control config's area");
    ok(rc_config_free(control), "rc_config_free");
    ok(rc_config_free(cfg), "rc_config_free");
    refused(
        keys_from(cfg, Some("https://control.example"), None, false),
        RC_ERR_BAD_HANDLE,
        "is not a live config",
    );
}
