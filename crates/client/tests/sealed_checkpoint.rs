//! Checkpoints in sealed groups (docs/protocol.md, "Sealed checkpoints")
//! through the client against a real sealed reflector with its channel on:
//! an upload is an envelope the reflector cannot read, a joiner gets the
//! exact state and how far to trust it, and what fails a joiner's check
//! (a garbage state, another group's checkpoint, a certificate of another
//! world's control key) is counted and never reaches the game. Every wait
//! has a deadline and every loop a count.

mod common;

use common::{join_all, token, Reflector};
use reflector_client::{
    CellKey, CheckpointError, CheckpointEvent, CheckpointOp, Client, Config, Error, Stats, TokenSource, Verification,
};
use reflector_proto::sealed::checkpoint::{ControlSigner, ENVELOPE_OVERHEAD};
use reflector_proto::sealed::{CellId, EpochKey, MasterSecret, WorldId};
use reflector_server::checkpoint::CheckpointConfig;
#[cfg(feature = "http")]
use std::io::{Read, Write};
#[cfg(feature = "http")]
use std::net::{SocketAddr, TcpListener, TcpStream};
#[cfg(feature = "http")]
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
#[cfg(feature = "http")]
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WORLD: &str = "sealed checkpoint tests";
const EPOCH: u32 = 7;
const TICK: u64 = 4242;

/// A sealed reflector asking each group for a checkpoint every 200 ms,
/// fetches unpaced.
fn reflector(max_bytes: u64) -> Reflector {
    Reflector::start_sealed_checkpoints(CheckpointConfig {
        every_ms: 200,
        fetch_every_ms: 0,
        max_bytes,
        ..CheckpointConfig::default()
    })
}

fn master() -> MasterSecret {
    MasterSecret::new(&common::SEALING_MASTER).unwrap()
}

fn world() -> WorldId {
    WorldId::from_name(WORLD)
}

/// The control servers' signing key of the test world.
fn control() -> ControlSigner {
    ControlSigner::derive(&master(), world())
}

/// The epoch key of cell (`col`, 0) as a grant carries it: current now.
fn cell_key(key: EpochKey, col: u32) -> CellKey {
    let now = reflector_proto::unix_now_ms() / 1000;
    CellKey {
        cell: [col, 0],
        key,
        starts_unix_s: now - 10,
        ends_unix_s: now + 600,
    }
}

/// The group's key: cell (0, 0) of the test world.
fn group_key() -> CellKey {
    let cell = CellId::new(world(), 0, 0).unwrap();
    cell_key(master().epoch_key(cell, EPOCH), 0)
}

/// A member of `r`'s sealed group holding `keys`, its checkpoint key
/// certified by `signer` (as a control server's grant would), that does
/// not fetch on join (its certificate comes after the JOIN_ACK).
fn member(r: &Reflector, player: u32, keys: Vec<CellKey>, signer: &ControlSigner) -> Client {
    let mut t = token(player, r.port, r.addr(), 300);
    t.keys = keys;
    let expires = t.expires_unix_s;
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        checkpoint_fetch_on_join: false,
        ..Config::new(TokenSource::Given(t))
    };
    let mut c = Client::new(cfg).expect("the client starts");
    join_all(&mut [&mut c]);
    let cert = signer.certify(player, &c.checkpoint_signing_key(), expires);
    c.set_checkpoint_certificate(r.port, signer.public_key(), cert.signature, expires)
        .expect("a group held");
    c
}

/// Updates `clients` every millisecond (draining their events and DATA)
/// until `done` holds on the checkpoint events so far; panics after 10 s.
fn pump(
    clients: &mut [&mut Client],
    got: &mut Vec<(usize, CheckpointEvent)>,
    mut done: impl FnMut(&[(usize, CheckpointEvent)]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..100_000 {
        for (i, c) in clients.iter_mut().enumerate() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
            while c.recv().is_some() {}
            while let Some(e) = c.poll_checkpoint() {
                got.push((i, e));
            }
        }
        if done(got) {
            return;
        }
        assert!(Instant::now() < deadline, "not done within 10 s; events: {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("not done within the loop's count; events: {got:?}");
}

/// Updates `uploader` and `others` until the reflector asks `uploader`,
/// provides `state` at `tick` then, and waits for its outcome (the
/// others' requests go unanswered, so the reflector turns to the
/// uploader): the Uploaded or Failed event.
fn upload_when_asked(uploader: &mut Client, others: &mut [&mut Client], tick: u64, state: &[u8]) -> CheckpointEvent {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    for _ in 0..100_000 {
        for c in others.iter_mut() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
            while c.recv().is_some() {}
            while c.poll_checkpoint().is_some() {}
        }
        uploader.update(Instant::now());
        while uploader.poll_event().is_some() {}
        while uploader.recv().is_some() {}
        while let Some(e) = uploader.poll_checkpoint() {
            match e {
                CheckpointEvent::Requested { .. } => match uploader.provide_checkpoint(tick, state.to_vec()) {
                    Ok(()) | Err(CheckpointError::InFlight(CheckpointOp::Upload)) => {}
                    Err(e) => panic!("the upload does not start: {e}"),
                },
                e @ (CheckpointEvent::Uploaded { .. } | CheckpointEvent::Failed { .. }) => return e,
                other => seen.push(other),
            }
        }
        assert!(Instant::now() < deadline, "no upload ended within 10 s: {seen:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no upload ended within the loop's count: {seen:?}");
}

fn uploaded(e: CheckpointEvent, tick: u64) {
    assert!(
        matches!(e, CheckpointEvent::Uploaded { tick: t, .. } if t == tick),
        "the upload was not stored: {e:?}"
    );
}

/// `c`'s fetch of kind `op` (started here), to its end.
fn fetch(c: &mut Client, op: CheckpointOp) -> CheckpointEvent {
    match op {
        CheckpointOp::FetchOther => c.fetch_checkpoint_other(),
        _ => c.fetch_checkpoint(),
    }
    .expect("the fetch starts");
    let mut got = Vec::new();
    pump(&mut [c], &mut got, |g| {
        g.iter().any(|(_, e)| !matches!(e, CheckpointEvent::Requested { .. }))
    });
    got.into_iter()
        .map(|(_, e)| e)
        .find(|e| !matches!(e, CheckpointEvent::Requested { .. }))
        .expect("the fetch ended")
}

/// The joiner's refusal counters, in the document's order.
fn refusals(s: &Stats) -> [u64; 9] {
    [
        s.checkpoint_malformed,
        s.checkpoint_version,
        s.checkpoint_wrong_cell,
        s.checkpoint_mismatch,
        s.checkpoint_bad_certificate,
        s.checkpoint_expired_certificate,
        s.checkpoint_bad_signature,
        s.checkpoint_no_key,
        s.checkpoint_bad,
    ]
}

/// A game state with a marker no envelope can show in clear.
fn state_with_marker(marker: &[u8], len: usize) -> Vec<u8> {
    let mut s = marker.to_vec();
    s.resize(len, b'~');
    s
}

#[cfg(feature = "http")]
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A TCP forwarder in front of the checkpoint channel that keeps every
/// byte a client sent through it (what the reflector receives and stores).
#[cfg(feature = "http")]
struct TcpTap {
    addr: SocketAddr,
    up: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

#[cfg(feature = "http")]
impl TcpTap {
    fn start(to: SocketAddr) -> TcpTap {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap();
        let up = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (tap, halt) = (Arc::clone(&up), Arc::clone(&stop));
        std::thread::spawn(move || {
            // Bounded: 30 s, or until the test ends.
            let deadline = Instant::now() + Duration::from_secs(30);
            while !halt.load(SeqCst) && Instant::now() < deadline {
                match l.accept() {
                    Ok((c, _)) => {
                        c.set_nonblocking(false).unwrap();
                        let Ok(r) = TcpStream::connect(to) else { continue };
                        let (c2, r2) = (c.try_clone().unwrap(), r.try_clone().unwrap());
                        let t = Arc::clone(&tap);
                        std::thread::spawn(move || pipe(c, r, Some(t)));
                        std::thread::spawn(move || pipe(r2, c2, None));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        TcpTap { addr, up, stop }
    }
}

#[cfg(feature = "http")]
impl Drop for TcpTap {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

/// Copies `from` to `to` until either side closes (or 10 s of silence),
/// keeping what passed in `tap`.
#[cfg(feature = "http")]
fn pipe(mut from: TcpStream, mut to: TcpStream, tap: Option<Arc<Mutex<Vec<u8>>>>) {
    from.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut b = [0u8; 16 * 1024];
    loop {
        match from.read(&mut b) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(std::net::Shutdown::Write);
                return;
            }
            Ok(n) => {
                if let Some(t) = &tap {
                    t.lock().unwrap().extend_from_slice(&b[..n]);
                }
                if to.write_all(&b[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

/// (a) with the real control server: A asks `/join` with its `sign_key`
/// and uploads through a forwarder that keeps every byte; B, a joiner,
/// fetches on join and gets A's exact state, signed by A. The bytes the
/// reflector received do not show the state.
#[cfg(feature = "http")]
#[test]
fn a_sealed_upload_reaches_a_joiner_signed_and_the_reflector_never_sees_it() {
    let r = reflector(16 << 20);
    let (control_server, _sealing) = common::sealing_control_server(&r);
    let url = control_server.url();
    let tap = TcpTap::start(r.checkpoint_addr());
    let control_client = |player: u32, ck: Option<SocketAddr>| {
        let cfg = Config {
            local: "127.0.0.1:0".into(),
            checkpoint_addr: ck,
            ..Config::new(TokenSource::Control(reflector_client::ControlServer {
                allow_plain_http: true,
                ..reflector_client::ControlServer::new(url.clone(), player, (50.0, 50.0))
            }))
        };
        Client::new(cfg).expect("the client starts")
    };
    let mut a = control_client(1, Some(tap.addr));
    join_all(&mut [&mut a]);
    let marker = format!("STATE-MARKER-{:016x}", a.instance()).into_bytes();
    let state = state_with_marker(&marker, 5000);
    uploaded(upload_when_asked(&mut a, &mut [], TICK, &state), TICK);

    let mut b = control_client(2, None);
    let mut got = Vec::new();
    pump(&mut [&mut a, &mut b], &mut got, |g| {
        g.iter()
            .any(|(i, e)| *i == 1 && !matches!(e, CheckpointEvent::Requested { .. }))
    });
    let fetched = got
        .into_iter()
        .find(|(i, e)| *i == 1 && !matches!(e, CheckpointEvent::Requested { .. }))
        .map(|(_, e)| e)
        .unwrap();
    match fetched {
        CheckpointEvent::Checkpoint {
            tick,
            from_player,
            bytes,
            verification,
            ..
        } => {
            assert_eq!((tick, from_player), (TICK, 1));
            assert!(bytes == state, "the exact state");
            assert_eq!(verification, Verification::SignedByOne { player: 1 });
        }
        e => panic!("b's fetch on join: {e:?}"),
    }
    assert_eq!(refusals(&b.stats()), [0; 9]);
    let sent = tap.up.lock().unwrap().clone();
    assert!(
        sent.len() >= state.len() + ENVELOPE_OVERHEAD,
        "the envelope went through the forwarder ({} bytes)",
        sent.len()
    );
    assert!(!contains(&sent, &marker), "the state in clear towards the reflector");
    assert!(!contains(&sent, b"STATE-MARKER"));
}

/// Uploads `uploader`'s envelope (player 3, holding `keys`, certified by
/// `signer`) to a fresh sealed group; a joiner with the group's key and
/// the world's control key fetches it: the fetch's outcome and the
/// joiner's counters.
fn joiner_sees(keys: Vec<CellKey>, signer: &ControlSigner) -> (CheckpointEvent, Stats) {
    joiner_with_keys_sees(keys, signer, vec![group_key()])
}

/// [`joiner_sees`] with the joiner holding `joiner_keys`.
fn joiner_with_keys_sees(
    keys: Vec<CellKey>,
    signer: &ControlSigner,
    joiner_keys: Vec<CellKey>,
) -> (CheckpointEvent, Stats) {
    let r = reflector(16 << 20);
    let mut c = member(&r, 3, keys, signer);
    let state = state_with_marker(b"the uploader's state", 300);
    uploaded(upload_when_asked(&mut c, &mut [], TICK, &state), TICK);
    let mut b = member(&r, 2, joiner_keys, &control());
    let e = fetch(&mut b, CheckpointOp::Fetch);
    (e, b.stats())
}

/// The fetch failed as refused by the joiner's checks, naming `counter`
/// (its own variant, carrying the named refusal, not another failure's).
fn refused_with(e: &CheckpointEvent, counter: &str) {
    match e {
        CheckpointEvent::Failed {
            op: CheckpointOp::Fetch,
            reason: reason @ CheckpointError::JoinerRefused { refusal, .. },
            ..
        } => {
            assert_eq!(refusal.counter(), counter, "{reason}");
            assert_eq!(reason.joiner_refusal(), Some(*refusal));
            assert!(reason.to_string().contains(counter), "{reason}");
        }
        e => panic!("a refused checkpoint reached the game, or failed otherwise: {e:?}"),
    }
}

/// (b) A member whose key for the group's cell and epoch is not the
/// group's uploads a certified, signed envelope around a state nobody else
/// can open (garbage to the group): the joiner refuses it at the AEAD.
#[test]
fn a_garbage_upload_is_refused_by_the_joiner_and_counted() {
    let good = group_key();
    let wrong = EpochKey::from_bytes(good.key.cell(), EPOCH, [0x11; 32]);
    let (e, s) = joiner_sees(vec![cell_key(wrong, 0)], &control());
    refused_with(&e, "checkpoint_bad");
    assert_eq!(refusals(&s), [0, 0, 0, 0, 0, 0, 0, 0, 1]);
    assert_eq!((s.checkpoints_fetched, s.checkpoint_failures), (0, 1));
}

/// (c) The envelope a member sealed for another group (the group serving
/// cell (1, 0) of the same world, under that cell's genuine key), uploaded
/// here through the real channel: the joiner refuses it as another group's.
#[test]
fn another_groups_checkpoint_is_refused_as_the_wrong_cell() {
    let other = CellId::new(world(), 1, 0).unwrap();
    let (e, s) = joiner_sees(vec![cell_key(master().epoch_key(other, EPOCH), 1)], &control());
    refused_with(&e, "checkpoint_wrong_cell");
    assert_eq!(refusals(&s), [0, 0, 1, 0, 0, 0, 0, 0, 0]);
}

/// A certificate made by another world's control key does not verify under
/// the joiner's `control_public`.
#[test]
fn a_certificate_of_another_control_key_is_refused() {
    let stranger = ControlSigner::derive(&MasterSecret::new(&[0x42; 32]).unwrap(), world());
    let (e, s) = joiner_sees(vec![group_key()], &stranger);
    refused_with(&e, "checkpoint_bad_certificate");
    assert_eq!(refusals(&s), [0, 0, 0, 0, 1, 0, 0, 0, 0]);
}

/// (d) Two members upload the same state for the same tick; a joiner
/// fetching both (FETCH and FETCH_OTHER) finds them verified by two.
#[test]
fn two_members_same_tick_are_verified_by_two() {
    let r = reflector(16 << 20);
    let state = state_with_marker(b"the one true state", 2000);
    let mut a = member(&r, 1, vec![group_key()], &control());
    uploaded(upload_when_asked(&mut a, &mut [], TICK, &state), TICK);
    let mut c = member(&r, 3, vec![group_key()], &control());
    uploaded(upload_when_asked(&mut c, &mut [&mut a], TICK, &state), TICK);

    let mut b = member(&r, 2, vec![group_key()], &control());
    b.fetch_checkpoint().expect("the FETCH starts");
    b.fetch_checkpoint_other().expect("the FETCH_OTHER starts beside it");
    let mut got = Vec::new();
    let ended = |g: &[(usize, CheckpointEvent)]| {
        g.iter()
            .filter(|(i, e)| *i == 0 && !matches!(e, CheckpointEvent::Requested { .. }))
            .count()
    };
    pump(&mut [&mut b, &mut a, &mut c], &mut got, |g| ended(g) == 2);
    let mut levels = Vec::new();
    for (_, e) in got
        .into_iter()
        .filter(|(i, e)| *i == 0 && !matches!(e, CheckpointEvent::Requested { .. }))
    {
        match e {
            CheckpointEvent::Checkpoint {
                tick,
                bytes,
                verification,
                from_player,
                ..
            } => {
                assert_eq!(tick, TICK);
                assert!(bytes == state, "the exact state from {from_player}");
                levels.push(verification);
            }
            e => panic!("b's fetch: {e:?}"),
        }
    }
    // The first to end is one member's word; the second, compared with
    // it, is verified by both.
    match &levels[..] {
        [Verification::SignedByOne { player }, Verification::VerifiedByTwo { players }] => {
            let mut p = *players;
            p.sort_unstable();
            assert_eq!(p, [1, 3]);
            assert!(p.contains(player));
        }
        l => panic!("verification levels {l:?}"),
    }
    assert_eq!(refusals(&b.stats()), [0; 9]);
}

/// Two members upload different states for the same tick: the joiner is
/// told they disagree (each event with its own state).
#[test]
fn two_members_with_different_states_disagree() {
    let r = reflector(16 << 20);
    let mut a = member(&r, 1, vec![group_key()], &control());
    uploaded(upload_when_asked(&mut a, &mut [], TICK, b"state one"), TICK);
    let mut c = member(&r, 3, vec![group_key()], &control());
    uploaded(upload_when_asked(&mut c, &mut [&mut a], TICK, b"state two"), TICK);
    let mut b = member(&r, 2, vec![group_key()], &control());
    let first = fetch(&mut b, CheckpointOp::Fetch);
    let second = fetch(&mut b, CheckpointOp::FetchOther);
    assert!(
        matches!(first, CheckpointEvent::Checkpoint { verification: Verification::SignedByOne { player: 3 }, ref bytes, .. } if bytes == b"state two"),
        "{first:?}"
    );
    match second {
        CheckpointEvent::Checkpoint {
            verification: Verification::Disagree { players },
            bytes,
            ..
        } => {
            assert_eq!(players, [1, 3]);
            assert_eq!(bytes, b"state one");
        }
        e => panic!("{e:?}"),
    }
}

/// The state and the envelope's overhead must fit the reflector's bound:
/// one byte more is refused naming the game's sizes; a state that fits
/// goes up.
#[test]
fn a_state_that_does_not_fit_after_the_overhead_is_refused() {
    let max = 1000u64;
    let r = reflector(max);
    let mut a = member(&r, 1, vec![group_key()], &control());
    let fits = max as usize - ENVELOPE_OVERHEAD;
    match upload_when_asked(&mut a, &mut [], TICK, &vec![7u8; fits + 1]) {
        CheckpointEvent::Failed {
            op: CheckpointOp::Upload,
            reason: CheckpointError::TooLarge { len, max: m, .. },
            ..
        } => assert_eq!((len, m), (fits as u64 + 1, fits as u64)),
        e => panic!("{e:?}"),
    }
    uploaded(upload_when_asked(&mut a, &mut [], TICK, &vec![7u8; fits]), TICK);
}

/// Without a certificate (or keys) nothing is uploaded, never the state
/// in clear: the request stays pending, and once the certificate is
/// handed in the same request is answered.
#[test]
fn without_a_certificate_or_keys_nothing_is_uploaded() {
    let r = reflector(16 << 20);
    let mut t = token(1, r.port, r.addr(), 300);
    t.keys = vec![group_key()];
    let expires = t.expires_unix_s;
    let mut a = Client::new(Config {
        local: "127.0.0.1:0".into(),
        checkpoint_fetch_on_join: false,
        ..Config::new(TokenSource::Given(t))
    })
    .unwrap();
    join_all(&mut [&mut a]);
    let mut got = Vec::new();
    pump(&mut [&mut a], &mut got, |g| {
        g.iter().any(|(_, e)| matches!(e, CheckpointEvent::Requested { .. }))
    });
    match a.provide_checkpoint(TICK, b"secret".to_vec()) {
        Err(CheckpointError::Mismatch { what, .. }) => {
            assert!(
                what.contains("certificate") && what.contains("never in clear"),
                "{what}"
            )
        }
        e => panic!("{e:?}"),
    }
    let cert = control().certify(1, &a.checkpoint_signing_key(), expires);
    a.set_checkpoint_certificate(r.port, control().public_key(), cert.signature, expires)
        .unwrap();
    a.provide_checkpoint(TICK, b"secret".to_vec())
        .expect("the same request, answered now");

    // Without keys: a member of a sealed group that was handed none.
    let mut k = common::client(5, &r);
    join_all(&mut [&mut k]);
    let cert = control().certify(5, &k.checkpoint_signing_key(), expires);
    k.set_checkpoint_certificate(r.port, control().public_key(), cert.signature, expires)
        .unwrap();
    let mut got = Vec::new();
    pump(&mut [&mut a, &mut k], &mut got, |g| {
        g.iter()
            .any(|(i, e)| *i == 1 && matches!(e, CheckpointEvent::Requested { .. }))
    });
    match k.provide_checkpoint(TICK, b"secret".to_vec()) {
        Err(CheckpointError::Mismatch { what, .. }) => assert!(what.contains("epoch key"), "{what}"),
        e => panic!("{e:?}"),
    }
}

/// Every `/join` the client makes carries its signing key, the first and
/// each renewal: a stub control server hands out 3 s tokens and keeps the
/// request lines.
#[cfg(feature = "http")]
#[test]
fn every_join_carries_the_signing_key() {
    use common::net::{ticket_json, HttpStub};
    let r = Reflector::start(0, true);
    let (port, addr) = (r.port, r.addr());
    let stub = HttpStub::start(move || (200, vec![], ticket_json(&token(1, port, addr, 3))));
    let mut c = Client::new(Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(reflector_client::ControlServer {
            allow_plain_http: true,
            ..reflector_client::ControlServer::new(stub.url.clone(), 1, (50.0, 50.0))
        }))
    })
    .unwrap();
    let want = format!("sign_key={}", hex::encode(c.checkpoint_signing_key()));
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(8);
    while lines.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "two /join requests within 8 s: {lines:?}, {:?}",
            c.stats()
        );
        c.update(Instant::now());
        while c.poll_event().is_some() {}
        if stub.requests() > lines.len() as u64 {
            lines.push(stub.last_request());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // The second is the client asking again for the same player (a 3 s
    // token is due for renewal at once).
    assert!(c.stats().token_requests >= 2);
    for l in &lines {
        assert!(l.starts_with("GET /join?") && l.contains(&want), "{l}");
    }
}

/// Inside the overlap window an upload goes under the next epoch's key,
/// which is held but has not started (DATA still goes under the current
/// one): a joiner holding both opens it, one holding only the current
/// epoch's key has no key for it.
#[test]
fn an_upload_goes_under_the_newest_key_held_even_before_it_starts() {
    let cell = CellId::new(world(), 0, 0).unwrap();
    let now = reflector_proto::unix_now_ms() / 1000;
    let next = CellKey {
        cell: [0, 0],
        key: master().epoch_key(cell, EPOCH + 1),
        starts_unix_s: now + 30,
        ends_unix_s: now + 630,
    };
    let both = vec![group_key(), next];
    let (e, s) = joiner_with_keys_sees(both.clone(), &control(), both.clone());
    assert!(
        matches!(
            e,
            CheckpointEvent::Checkpoint {
                verification: Verification::SignedByOne { player: 3 },
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(refusals(&s), [0; 9]);
    let (e, s) = joiner_with_keys_sees(both, &control(), vec![group_key()]);
    refused_with(&e, "checkpoint_no_key");
    assert_eq!(refusals(&s), [0, 0, 0, 0, 0, 0, 0, 1, 0]);
}

/// A game that fetches its own tokens: the client starts with none
/// ([`TokenSource::Later`]: nothing sent, its signing key already there
/// for the first `/join`'s `sign_key`), then takes the token, the keys
/// from their parts ([`CellKey::new`]) and the certificate, and uploads a
/// checkpoint a joiner takes as signed. A certificate that does not fit
/// (another expiry, another key's, another control key's) is refused at
/// hand-in, naming it, and changes nothing.
#[test]
fn a_client_without_a_token_yet_takes_keys_and_a_certificate_and_uploads() {
    let r = reflector(16 << 20);
    let mut a = Client::new(Config {
        local: "127.0.0.1:0".into(),
        checkpoint_fetch_on_join: false,
        ..Config::new(TokenSource::Later)
    })
    .expect("a client with no token yet");
    let sign_key = a.checkpoint_signing_key();
    let mut got = Vec::new();
    for _ in 0..20 {
        a.update(Instant::now());
        while let Some(e) = a.poll_event() {
            got.push(e);
        }
    }
    assert!(
        got.is_empty() && !a.is_member(),
        "nothing happens without a token: {got:?}"
    );
    assert_eq!(a.stats().joins, 0);
    assert_eq!(
        a.set_checkpoint_certificate(r.port, control().public_key(), [0; 64], 1),
        Err(Error::NoSuchGroup { group: r.port })
    );

    // What the backend's /join with that sign_key answers.
    let t = token(1, r.port, r.addr(), 300);
    let expires = t.expires_unix_s;
    let cert = control().certify(1, &sign_key, expires);
    a.set_token(t).expect("the first token");
    let g = group_key();
    let mut cell_id = [0u8; 8];
    cell_id.copy_from_slice(&g.key.cell().0);
    let parts = |starts: u64, ends: u64| CellKey::new([0, 0], cell_id, EPOCH, *g.key.as_bytes(), starts, ends);
    let e = parts(g.ends_unix_s, g.starts_unix_s).expect_err("an epoch that ends before it starts");
    assert!(e.contains("ends") && e.contains("before it starts"), "{e}");
    let key = parts(g.starts_unix_s, g.ends_unix_s).expect("a key from its parts");
    assert_eq!(key, g);
    a.set_epoch_keys(r.port, &[key]).expect("a group held");

    // Wrong certificates, each refused naming it.
    let stranger = ControlSigner::derive(&MasterSecret::new(&[0x42; 32]).unwrap(), world());
    let other_key = control().certify(1, &[7; 32], expires);
    for (why, cp, sig, exp) in [
        ("another expiry", control().public_key(), cert.signature, expires + 1),
        ("another key's", control().public_key(), other_key.signature, expires),
        ("another control key", stranger.public_key(), cert.signature, expires),
    ] {
        match a.set_checkpoint_certificate(r.port, cp, sig, exp) {
            Err(e @ Error::BadCertificate { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("certificate") && text.contains("sign_key"),
                    "{why}: {text}"
                );
            }
            other => panic!("{why}: {other:?}"),
        }
    }
    a.set_checkpoint_certificate(r.port, control().public_key(), cert.signature, expires)
        .expect("the grant's own certificate");
    join_all(&mut [&mut a]);
    let state = state_with_marker(b"a state of a game that fetches its own tokens", 400);
    uploaded(upload_when_asked(&mut a, &mut [], TICK, &state), TICK);
    let mut b = member(&r, 2, vec![group_key()], &control());
    match fetch(&mut b, CheckpointOp::Fetch) {
        CheckpointEvent::Checkpoint {
            bytes, verification, ..
        } => {
            assert!(bytes == state);
            assert_eq!(verification, Verification::SignedByOne { player: 1 });
        }
        e => panic!("{e:?}"),
    }
}
