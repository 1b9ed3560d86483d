//! Sealed groups (docs/protocol.md, "Sealed payloads") end to end: a real
//! reflector with `--data-sealed on` (in this process), a real control
//! server with a sealing secret handing out epoch keys, and a relay in
//! front of one client that sees every byte on its path.
#![cfg(feature = "http")]

mod common;

use common::net::{ticket_json, HttpStub, Relay};
use common::Reflector;
use reflector_client::{
    fetch_token, CellKey, Client, Config, ControlServer, Event, SendError, Stats, Token, TokenSource,
};
use reflector_proto::protocol::{field, Kind};
use reflector_proto::sealed::{self, CellId, EpochKey, MasterSecret, WorldId};
use std::time::{Duration, Instant};

fn control(url: &str, player: u32) -> ControlServer {
    ControlServer {
        allow_plain_http: true,
        ..ControlServer::new(url, player, (50.0, 50.0))
    }
}

/// A client that asks the control server at `url` for its token (and keys).
fn control_client(url: &str, player: u32) -> Client {
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(control(url, player)))
    };
    Client::new(cfg).expect("the client starts")
}

/// A client with `token` handed in, sending to `to` (the reflector or a
/// relay in front of it).
fn given_client(mut token: Token, to: std::net::SocketAddr) -> Client {
    token.reflector = to.to_string();
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token))
    };
    Client::new(cfg).expect("the client starts")
}

/// Pumps `clients` until each is a member, collecting their events.
fn join(clients: &mut [&mut Client]) {
    common::join_all(clients);
}

/// Pumps until `want` datagrams have reached `rx` (collecting them as
/// (sender, instance, seq, payload)), updating `others` too; panics after 5 s.
fn receive(rx: &mut Client, others: &mut [&mut Client], want: usize) -> Vec<(u32, u64, u64, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want {
        assert!(
            Instant::now() < deadline,
            "{} of {want} datagrams within 5 s; stats {:?}",
            got.len(),
            rx.stats()
        );
        rx.update(Instant::now());
        for o in others.iter_mut() {
            o.update(Instant::now());
        }
        while let Some(d) = rx.recv() {
            got.push((d.sender, d.instance, d.seq, d.payload.to_vec()));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// A payload of `len` bytes: the marker, then the index, then filler.
fn payload(marker: &[u8], i: usize, len: usize) -> Vec<u8> {
    let mut p = marker.to_vec();
    p.extend_from_slice(format!("#{i:04}#").as_bytes());
    p.resize(len.max(p.len()), b'.');
    p
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The sealed-step counters of `s`.
fn sealed_counts(s: &Stats) -> [u64; 5] {
    [
        s.sealed_malformed,
        s.sealed_version,
        s.sealed_no_key,
        s.sealed_replay,
        s.sealed_bad,
    ]
}

/// The DATA the relay carried towards its client from `player`.
fn relayed_data(relay: &Relay, player: u32) -> Vec<Vec<u8>> {
    relay
        .tap
        .lock()
        .unwrap()
        .iter()
        .filter(|(up, d)| !*up && d.len() > 24 && d[3] == Kind::Data as u8)
        .filter(|(_, d)| u32::from_be_bytes(d[field::SENDER].try_into().unwrap()) == player)
        .map(|(_, d)| d.clone())
        .collect()
}

/// Waits until the relay has carried `n` DATA from `player` to its client.
fn wait_relayed(relay: &Relay, player: u32, n: usize) -> Vec<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = relayed_data(relay, player);
        if d.len() >= n {
            return d;
        }
        assert!(Instant::now() < deadline, "{} of {n} DATA relayed", d.len());
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn sealed_payloads_are_unreadable_on_the_path_and_arrive_intact() {
    let r = Reflector::start_sealed();
    let (control_server, sealing) = common::sealing_control_server(&r);
    let url = control_server.url();
    // A asks the control server itself; B's token (and keys) come from
    // the same control server, and B talks through a relay that sees
    // every byte between it and the reflector.
    let mut a = control_client(&url, 1);
    let b_token = fetch_token(&control(&url, 2)).expect("a grant");
    assert!(
        !b_token.keys.is_empty(),
        "a control server with a sealing secret hands out keys"
    );
    assert_eq!(b_token.keys[0].cell, [0, 0]);
    let relay = Relay::start(r.addr());
    let mut b = given_client(b_token, relay.addr);
    join(&mut [&mut a, &mut b]);
    assert!(sealing.keys_issued() >= 2, "keys went out in both grants");
    assert_eq!(a.max_payload(), Some(reflector_client::MAX_PAYLOAD_SEALED));
    assert_eq!(reflector_client::MAX_PAYLOAD_SEALED, 1400);
    let too_big = vec![0u8; 1401];
    assert_eq!(a.send(&too_big), Err(SendError::TooLarge { len: 1401, max: 1400 }));

    let marker_a = format!("A-MARKER-{:016x}", a.instance()).into_bytes();
    let marker_b = format!("B-MARKER-{:016x}", b.instance()).into_bytes();
    let lens = [0usize, 1, 30, 700, 1400];
    let mut sent_a = Vec::new();
    for i in 0..20 {
        let p = payload(&marker_a, i, lens[i % lens.len()]);
        a.send(&p).expect("sent");
        sent_a.push(p);
    }
    let got = receive(&mut b, &mut [&mut a], sent_a.len());
    let payloads: Vec<Vec<u8>> = got.iter().map(|g| g.3.clone()).collect();
    assert_eq!(payloads, sent_a, "every payload intact, in order");
    assert!(got.iter().all(|g| g.0 == 1 && g.1 == a.instance()));
    let p = payload(&marker_b, 0, 100);
    b.send(&p).expect("sent");
    let back = receive(&mut a, &mut [&mut b], 1);
    assert_eq!(back[0].3, p);
    // Nothing that crossed the path carries a marker: not the DATA the
    // reflector fanned out to B, not the DATA B sent.
    let tap = relay.tap.lock().unwrap().clone();
    assert!(tap.iter().filter(|(_, d)| d[3] == Kind::Data as u8).count() >= 21);
    for (up, d) in &tap {
        assert!(
            !contains(d, &marker_a) && !contains(d, &marker_b) && !contains(d, b"MARKER"),
            "a marker in clear on the path (towards the reflector: {up})"
        );
    }
    assert_eq!(sealed_counts(&a.stats()), [0; 5]);
    assert_eq!(sealed_counts(&b.stats()), [0; 5]);
    // Every DATA each received was a sealed one that opened.
    assert_eq!((b.stats().sealed_opened, a.stats().sealed_opened), (20, 1));
}

/// Two clients in a sealed group, B behind a relay, with keys made here
/// from a master secret (as a control server would) and handed in.
struct Pair {
    r: Reflector,
    relay: Relay,
    a: Client,
    b: Client,
    keys: Vec<CellKey>,
}

fn test_keys(epoch: u32, ends_in_s: u64) -> Vec<CellKey> {
    let master = MasterSecret::new(&common::SEALING_MASTER).unwrap();
    let cell = CellId::new(WorldId::from_name("pair world"), 0, 0).unwrap();
    let now = reflector_proto::unix_now_ms() / 1000;
    vec![CellKey {
        cell: [0, 0],
        key: master.epoch_key(cell, epoch),
        starts_unix_s: now - 10,
        ends_unix_s: now + ends_in_s,
    }]
}

fn keyed(mut t: Token, keys: &[CellKey]) -> Token {
    t.keys = keys.to_vec();
    t
}

impl Pair {
    fn start() -> Pair {
        let r = Reflector::start_sealed();
        let keys = test_keys(7, 600);
        let relay = Relay::start(r.addr());
        let mut a = given_client(keyed(common::token(1, r.port, r.addr(), 300), &keys), r.addr());
        let mut b = given_client(keyed(common::token(2, r.port, r.addr(), 300), &keys), relay.addr);
        join(&mut [&mut a, &mut b]);
        Pair { r, relay, a, b, keys }
    }

    /// A sends `p`; B gets it (and only it).
    fn a_to_b(&mut self, p: &[u8]) {
        self.a.send(p).expect("sent");
        let got = receive(&mut self.b, &mut [&mut self.a], 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].3, p);
    }

    /// Injects `d` into B from the reflector's address (the relay's) and
    /// updates B until its counters move; nothing reaches the game.
    fn inject(&mut self, d: &[u8]) -> Stats {
        let before = self.b.stats();
        self.relay.inject(d);
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            self.b.update(Instant::now());
            assert!(self.b.recv().is_none(), "an injected datagram reached the game");
            let now = self.b.stats();
            if sealed_counts(&now) != sealed_counts(&before) {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "the injected datagram was not counted: {now:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn forged_altered_and_replayed_copies_are_dropped_and_counted() {
    let mut p = Pair::start();
    p.a_to_b(b"genuine one");
    let genuine = wait_relayed(&p.relay, 1, 1).pop().unwrap();
    assert_eq!(genuine.len(), sealed::SEALED_MIN + b"genuine one".len());

    // (c) The genuine copy again: a replay.
    let s = p.inject(&genuine);
    assert_eq!(sealed_counts(&s), [0, 0, 0, 1, 0], "sealed_replay");

    // (b) A ciphertext byte flipped, under a fresh sequence so the window
    // does not stop it first: the AEAD does.
    let mut altered = genuine.clone();
    altered[field::SEQ.end - 1] ^= 0x40;
    altered[sealed::field::CIPHERTEXT] ^= 1;
    let s = p.inject(&altered);
    assert_eq!(sealed_counts(&s), [0, 0, 0, 1, 1], "sealed_bad");

    // A made-up instance: a sender key that does not open it.
    let mut forged = genuine.clone();
    forged[field::SEQ.end - 1] ^= 0x41;
    forged[sealed::field::INSTANCE].copy_from_slice(&0x1234_5678_9abc_def0u64.to_be_bytes());
    let s = p.inject(&forged);
    assert_eq!(sealed_counts(&s), [0, 0, 0, 1, 2], "sealed_bad");

    // An epoch nobody holds a key for.
    let mut unkeyed = genuine.clone();
    unkeyed[sealed::field::EPOCH].copy_from_slice(&99u32.to_be_bytes());
    let s = p.inject(&unkeyed);
    assert_eq!(sealed_counts(&s), [0, 0, 1, 1, 2], "sealed_no_key");

    // Another sealed version: 1, ChaCha20-Poly1305, withdrawn.
    let mut version = genuine.clone();
    version[sealed::field::VERSION] = 1;
    let s = p.inject(&version);
    assert_eq!(sealed_counts(&s), [0, 1, 1, 1, 2], "sealed_version");

    // A clear DATA in a sealed group (too short to be sealed).
    let mut clear = genuine[..40].to_vec();
    clear[field::LENGTH].copy_from_slice(&16u16.to_be_bytes());
    let s = p.inject(&clear);
    assert_eq!(sealed_counts(&s), [1, 1, 1, 1, 2], "sealed_malformed");

    // The next genuine datagram still arrives.
    p.a_to_b(b"genuine two");
    assert_eq!(sealed_counts(&p.b.stats()), [1, 1, 1, 1, 2]);
    assert_eq!(p.b.stats().data_received, 2);
    // Only the two genuine ones opened; every refusal was counted instead.
    assert_eq!(p.b.stats().sealed_opened, 2);
    let _ = &p.r;
}

#[test]
fn a_new_token_keeps_the_counter_and_a_restart_takes_a_new_instance() {
    let mut p = Pair::start();
    for i in 0..5 {
        p.a_to_b(format!("before {i}").as_bytes());
    }
    // A new token in the same epoch (the same keys): a renewal, sequence
    // numbers going on.
    let renewed = keyed(common::token(1, p.r.port, p.r.addr(), 600), &p.keys);
    p.a.set_token(renewed).expect("taken");
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.a.stats().renewals == 0 {
        assert!(Instant::now() < deadline, "renewed within 5 s");
        p.a.update(Instant::now());
        p.b.update(Instant::now());
        std::thread::sleep(Duration::from_millis(1));
    }
    for i in 0..5 {
        p.a_to_b(format!("after {i}").as_bytes());
    }
    // On the path: every DATA from A under one (cell, epoch, instance),
    // so one sender key, with strictly increasing sequences (nonces).
    let relayed = wait_relayed(&p.relay, 1, 10);
    assert_eq!(relayed.len(), 10);
    let seqs: Vec<u64> = relayed
        .iter()
        .map(|d| u64::from_be_bytes(d[field::SEQ].try_into().unwrap()))
        .collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let key_ids: std::collections::HashSet<Vec<u8>> = relayed
        .iter()
        .map(|d| d[sealed::field::INSTANCE.start..sealed::field::CELL.end].to_vec())
        .collect();
    assert_eq!(key_ids.len(), 1, "one sender key");
    assert_eq!(sealed_counts(&p.b.stats()), [0; 5]);

    // A restart: a new client for the same player, a new instance, a
    // counter from the start again: its datagrams open.
    let old_instance = p.a.instance();
    drop(std::mem::replace(
        &mut p.a,
        given_client(keyed(common::token(1, p.r.port, p.r.addr(), 300), &p.keys), p.r.addr()),
    ));
    join(&mut [&mut p.a, &mut p.b]);
    assert_ne!(p.a.instance(), old_instance);
    let seq = p.a.send(b"after the restart").expect("sent");
    assert!(seq < seqs[0] + 10, "the counter started over ({seq})");
    let got = receive(&mut p.b, &mut [&mut p.a], 1);
    assert_eq!(
        (got[0].1, got[0].3.as_slice()),
        (p.a.instance(), &b"after the restart"[..])
    );
    assert_eq!(sealed_counts(&p.b.stats()), [0; 5]);
}

#[test]
fn without_a_key_a_sealed_group_gets_nothing_sent() {
    let r = Reflector::start_sealed();
    let relay = Relay::start(r.addr());
    let mut a = given_client(common::token(1, r.port, r.addr(), 300), relay.addr);
    join(&mut [&mut a]);
    let group = r.port;
    assert_eq!(a.send(b"secret"), Err(SendError::NoSealingKey { group }));
    assert!(a.send(b"secret").unwrap_err().to_string().contains("sealed"));
    // A key of another group changes nothing; refused for a group not held.
    assert!(a.set_epoch_keys(group.wrapping_add(1), &test_keys(1, 600)).is_err());
    assert_eq!(a.send(b"secret"), Err(SendError::NoSealingKey { group }));
    // An expired key (its overlap over too) is no key.
    let mut old = test_keys(1, 0);
    old[0].starts_unix_s -= 1000;
    old[0].ends_unix_s -= 100;
    a.set_epoch_keys(group, &old).expect("held group");
    a.update(Instant::now());
    assert_eq!(a.send(b"secret"), Err(SendError::NoSealingKey { group }));
    // Let any stray datagram cross the relay, then look.
    for _ in 0..20 {
        a.update(Instant::now());
        std::thread::sleep(Duration::from_millis(5));
    }
    let up_data = relay
        .tap
        .lock()
        .unwrap()
        .iter()
        .filter(|(up, d)| *up && d[3] == Kind::Data as u8)
        .count();
    assert_eq!(up_data, 0, "no DATA on the wire");
    assert_eq!(a.stats().data_sent, 0);
    // With a key it goes.
    a.set_epoch_keys(group, &test_keys(1, 600)).expect("held group");
    a.send(b"secret").expect("sealed and sent");
}

/// A `/join` answer for `t` with `keys` (as a control server with a
/// sealing secret writes them).
fn join_json(t: &Token, keys: &[CellKey]) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&ticket_json(t)).unwrap();
    v["keys"] = keys_json(keys);
    v.to_string()
}

fn keys_json(keys: &[CellKey]) -> serde_json::Value {
    keys.iter()
        .map(|k| {
            serde_json::json!({
                "cell": k.cell,
                "cell_id": hex::encode(k.key.cell().0),
                "epoch": k.key.epoch(),
                "key": hex::encode(k.key.as_bytes()),
                "starts_unix_s": k.starts_unix_s,
                "ends_unix_s": k.ends_unix_s,
            })
        })
        .collect()
}

#[test]
fn a_key_near_its_end_is_refreshed_from_the_control_server() {
    let r = Reflector::start_sealed();
    let (control_server, sealing) = common::sealing_control_server(&r);
    let mut a = control_client(&control_server.url(), 1);
    join(&mut [&mut a]);
    a.send(b"sealed under the granted key").expect("keys from /join");
    assert_eq!(a.stats().keys_requests, 0, "the granted key is far from its end");
    // A key of another cell of the group that ends within W: the client
    // asks /keys (MAC under its session key) within the jitter.
    let near_end = test_keys(3, 30);
    a.set_epoch_keys(r.port, &near_end).expect("held group");
    let deadline = Instant::now() + reflector_client::KEYS_REFRESH_JITTER + Duration::from_secs(5);
    while a.stats().keys_refreshes == 0 {
        assert!(Instant::now() < deadline, "refreshed in time: {:?}", a.stats());
        a.update(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(a.stats().keys_refresh_failures, 0);
    let served = sealing.outcomes().iter().find(|(n, _)| *n == "served").map(|(_, c)| *c);
    assert_eq!(
        served,
        Some(1),
        "the control server took the request's MAC: {:?}",
        sealing.outcomes()
    );
    // The answer brought no newer key for that cell: no request on every
    // update, the next waits a backoff.
    for _ in 0..50 {
        a.update(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(a.stats().keys_requests, 1);
}

/// A game that hands tokens in refreshes its keys through `/keys` only when
/// it names a control server for that (`Config::keys_from`): the
/// membership's token signs the request, as for a client that asks for its
/// own tokens. Without it nothing is asked (the game hands keys in).
#[test]
fn a_client_given_its_tokens_refreshes_keys_from_keys_from() {
    let r = Reflector::start_sealed();
    let (control_server, sealing) = common::sealing_control_server(&r);
    let url = control_server.url();
    let mut with = {
        let cfg = Config {
            local: "127.0.0.1:0".into(),
            keys_from: Some(control(&url, 0)),
            ..Config::new(TokenSource::Given(fetch_token(&control(&url, 1)).expect("a grant")))
        };
        Client::new(cfg).expect("the client starts")
    };
    let mut without = given_client(fetch_token(&control(&url, 2)).expect("a grant"), r.addr());
    join(&mut [&mut with, &mut without]);
    let near_end = test_keys(3, 30);
    for c in [&mut with, &mut without] {
        c.set_epoch_keys(r.port, &near_end).expect("held group");
    }
    let deadline = Instant::now() + reflector_client::KEYS_REFRESH_JITTER + Duration::from_secs(5);
    while with.stats().keys_refreshes == 0 {
        assert!(Instant::now() < deadline, "refreshed in time: {:?}", with.stats());
        for c in [&mut with, &mut without] {
            c.update(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(with.stats().keys_refresh_failures, 0);
    let served = sealing.outcomes().iter().find(|(n, _)| *n == "served").map(|(_, c)| *c);
    assert_eq!(served, Some(1), "{:?}", sealing.outcomes());
    assert_eq!(without.stats().keys_requests, 0, "no control server named for /keys");
}

#[test]
fn a_refresh_refused_with_429_waits_its_retry_after() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};
    let r = Reflector::start_sealed();
    let token = common::token(1, r.port, r.addr(), 300);
    // Granted with a key that ends within W: a refresh is due at once.
    let join_answer = join_json(&token, &test_keys(4, 30));
    let keys_answer =
        serde_json::json!({"player": 1, "group": r.port, "keys": keys_json(&test_keys(5, 600))}).to_string();
    let n = Arc::new(AtomicU64::new(0));
    let times = Arc::new(Mutex::new(Vec::new()));
    let (count, at) = (Arc::clone(&n), Arc::clone(&times));
    let stub = HttpStub::start(move || {
        at.lock().unwrap().push(Instant::now());
        match count.fetch_add(1, SeqCst) {
            0 => (200, vec![], join_answer.clone()),
            1 => (
                429,
                vec![("Retry-After", "2".to_string())],
                "{\"error\": \"slow down\"}".into(),
            ),
            _ => (200, vec![], keys_answer.clone()),
        }
    });
    let mut a = control_client(&stub.url, 1);
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut errors = Vec::new();
    while a.stats().keys_refreshes == 0 {
        assert!(Instant::now() < deadline, "refreshed after the 429: {:?}", a.stats());
        a.update(Instant::now());
        while let Some(e) = a.poll_event() {
            if let Event::Error(e) = e {
                errors.push(e);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(
        stub.last_request().starts_with("GET /keys?token="),
        "{}",
        stub.last_request()
    );
    assert!(stub.last_request().contains("&mac="));
    assert_eq!((a.stats().keys_requests, a.stats().keys_refresh_failures), (2, 1));
    assert!(errors.iter().any(|e| e.to_string().contains("429")), "{errors:?}");
    let t = times.lock().unwrap().clone();
    assert!(
        t[2] >= t[1] + Duration::from_secs(2),
        "the next /keys waited Retry-After"
    );
    // The refreshed key is used: an epoch-5 key is newest and started.
    a.send(b"under the refreshed key").expect("sent");
}

#[test]
fn keys_in_a_join_answer_are_checked() {
    let r = Reflector::start_sealed();
    let token = common::token(1, r.port, r.addr(), 300);
    let mut bad = keys_json(&test_keys(1, 600));
    bad[0]["key"] = "00ff".into();
    let mut v: serde_json::Value = serde_json::from_str(&ticket_json(&token)).unwrap();
    v["keys"] = bad;
    let body = v.to_string();
    let stub = HttpStub::start(move || (200, vec![], body.clone()));
    let e = fetch_token(&control(&stub.url, 1)).unwrap_err();
    assert!(e.to_string().contains("32 hex bytes"), "{e}");
    // The player's own cell first, whatever the server's order.
    let two = {
        let mut k = test_keys(1, 600);
        let mut other = k[0].clone();
        other.cell = [1, 0];
        other.key = EpochKey::from_bytes(CellId::new(WorldId::from_name("w"), 1, 0).unwrap(), 1, [9; 32]);
        k.insert(0, other);
        k
    };
    let mut v: serde_json::Value = serde_json::from_str(&ticket_json(&token)).unwrap();
    v["keys"] = keys_json(&two);
    let body = v.to_string();
    let stub = HttpStub::start(move || (200, vec![], body.clone()));
    let t = fetch_token(&control(&stub.url, 1)).expect("a token");
    let cells: Vec<[u32; 2]> = t.keys.iter().map(|k| k.cell).collect();
    assert_eq!(cells, vec![[0, 0], [1, 0]], "ticket_json's cell [0, 0] first");
}

/// A sender in two sealed groups of a listener's area sends each datagram
/// to both under one sequence, sealed once per group under that group's
/// cell key (as the protocol allows: two keys, so no nonce repeats). The
/// listener delivers each once and counts the other copy as a duplicate
/// delivery, not a replay; a copy it opened, sent to it again, is still a
/// replay (docs/protocol.md, "Duplicate deliveries").
#[test]
fn another_groups_copy_is_a_duplicate_and_the_same_copy_again_a_replay() {
    use reflector_client::AreaTokens;
    use reflector_proto::client::{Config as SessionConfig, JoinRequest};
    use reflector_proto::protocol::{Header, SessionKeys};
    use std::net::{SocketAddr, UdpSocket};

    let r = Reflector::start_sealed_groups(2);
    let ports = r.ports();
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let master = MasterSecret::new(&common::SEALING_MASTER).unwrap();
    let now = reflector_proto::unix_now_ms() / 1000;
    let cell_key = |column: u32| CellKey {
        cell: [column, 0],
        key: master.epoch_key(CellId::new(WorldId::from_name("pair world"), column, 0).unwrap(), 7),
        starts_unix_s: now - 10,
        ends_unix_s: now + 600,
    };
    let keys = [cell_key(0), cell_key(1)];

    // The listener: group A (cell 0) through a relay, so that the test can
    // send it a copy "from the reflector"; group B (cell 1) direct.
    let relay = Relay::start(at(ports[0]));
    let mut a = keyed(common::token(1, ports[0], relay.addr, 300), &keys[..1]);
    a.reflector = relay.addr.to_string();
    let b = keyed(common::token(1, ports[1], at(ports[1]), 300), &keys[1..]);
    let mut listener = given_client(a.clone(), relay.addr);
    listener
        .set_area_tokens(AreaTokens { cell: a, area: vec![b] })
        .expect("an area");
    let deadline = Instant::now() + Duration::from_secs(5);
    while listener.member_groups().count() < 2 {
        assert!(
            Instant::now() < deadline,
            "the listener joined {:?}",
            listener.member_groups().collect::<Vec<_>>()
        );
        listener.update(Instant::now());
        while listener.poll_event().is_some() {}
        std::thread::sleep(Duration::from_millis(1));
    }

    // The sender: one socket, one instance, a member of both groups.
    let sock = UdpSocket::bind("127.0.0.1:0").expect("a socket");
    let cfg = SessionConfig {
        retry: Duration::from_millis(100),
        give_up: Some(Duration::from_secs(5)),
    };
    let instance = 0x5eed_u64;
    let mut sessions: Vec<_> = ports
        .iter()
        .zip(&keys)
        .map(|(&group, k)| {
            let t = common::token(4, group, at(group), 300);
            let req = JoinRequest {
                reflector: at(group),
                group,
                player: 4,
                token: t.token,
                keys: SessionKeys::from_session(t.session_key),
                first_seq: 1,
            };
            let (s, ack) = reflector_proto::blocking::join(&sock, req, cfg).expect("the double sender joins");
            assert!(ack.tags() && sealed::group_is_sealed(ack.flags) == Ok(true));
            (s, k.key.sender_key(4, instance))
        })
        .collect();

    const M: u64 = 20;
    let mut delivered = Vec::new();
    for k in 0..M {
        let seq = sessions.iter().map(|(s, _)| s.next_seq()).max().expect("two sessions");
        let game = format!("datagram {k}");
        for (s, key) in sessions.iter_mut() {
            let h = Header {
                kind: Kind::Data,
                group: s.request().group,
                sender: 4,
                membership: s.membership().expect("a member"),
                seq,
            };
            let mut buf = [0u8; 256];
            buf[sealed::field::CIPHERTEXT..][..game.len()].copy_from_slice(game.as_bytes());
            let tags = s.request().keys;
            let n = key.seal(&h, game.len(), Some(&tags), &mut buf).expect("seals");
            s.advance_seq(seq + 1);
            sock.send_to(&buf[..n], s.request().reflector).expect("sent");
        }
        // Both copies in before the next pair: each is judged against the
        // other, whichever comes first.
        let deadline = Instant::now() + Duration::from_secs(5);
        while listener.stats().data_received + listener.stats().sealed_duplicate < 2 * (k + 1) {
            assert!(
                Instant::now() < deadline,
                "datagram {k}: both copies not judged within 5 s: {:?}",
                listener.stats()
            );
            listener.update(Instant::now());
            while let Some(d) = listener.recv() {
                delivered.push((d.sender, d.seq, d.payload.to_vec()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    while let Some(d) = listener.recv() {
        delivered.push((d.sender, d.seq, d.payload.to_vec()));
    }
    assert_eq!(
        delivered.iter().map(|d| d.2.clone()).collect::<Vec<_>>(),
        (0..M).map(|k| format!("datagram {k}").into_bytes()).collect::<Vec<_>>(),
        "each datagram once"
    );
    let s = listener.stats();
    assert_eq!(s.sealed_duplicate, M, "the other group's copies: {s:?}");
    assert_eq!(sealed_counts(&s), [0; 5], "none counted as a replay or worse: {s:?}");

    // A copy the listener opened, sent to it again from the reflector's
    // address: a replay, not a duplicate.
    let captured = wait_relayed(&relay, 4, M as usize).pop().expect("a copy relayed");
    relay.inject(&captured);
    let deadline = Instant::now() + Duration::from_secs(2);
    while listener.stats().sealed_replay == 0 {
        assert!(
            Instant::now() < deadline,
            "the replay was not counted: {:?}",
            listener.stats()
        );
        listener.update(Instant::now());
        assert!(listener.recv().is_none(), "a replay reached the game");
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = listener.stats();
    assert_eq!((s.sealed_replay, s.sealed_duplicate, s.sealed_bad), (1, M, 0), "{s:?}");
}
