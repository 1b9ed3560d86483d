//! The registry against a real Redis (Debian's redis-server, with a
//! password): ids, heartbeats and expiry, placement by two control servers
//! at once, a dead or draining reflector's cells moved, a rogue entry
//! refused, Redis down and restarted; and over TLS: the round trip with the
//! fleet's CA (and a client certificate), refusals that name a wrong CA, a
//! missing client certificate and a scheme that does not match the port.

use reflector_proto::auth::{Secret, SecretRing};
use reflector_registry::testing::{RedisServer, TestCa, TlsMode};
use reflector_registry::{Directory, Placed, Registrar, RegistryConfig, RegistryError, RegistryTls, View};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

fn secret() -> SecretRing {
    Secret::new(&[0x42; 32]).unwrap().into()
}

fn config(redis: &RedisServer, ttl_ms: u64) -> RegistryConfig {
    RegistryConfig {
        ttl: Duration::from_millis(ttl_ms),
        ..RegistryConfig::new(&redis.url())
    }
}

fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, last])
}

fn grid(cols: u32, rows: u32) -> Vec<(u32, u32)> {
    (0..rows).flat_map(|y| (0..cols).map(move |x| (x, y))).collect()
}

fn per_reflector(v: &View) -> HashMap<u16, usize> {
    let mut n = HashMap::new();
    for p in v.cells.values() {
        *n.entry(p.reflector).or_default() += 1;
    }
    n
}

#[test]
fn ids_are_unique_and_an_id_held_is_refused() {
    let redis = RedisServer::start();
    let cfg = config(&redis, 600);
    let a = Registrar::register(&cfg, &secret(), None, ip(1), &[4000], 100).unwrap();
    let b = Registrar::register(&cfg, &secret(), None, ip(2), &[4000], 100).unwrap();
    assert_ne!(a.id(), b.id());
    match Registrar::register(&cfg, &secret(), Some(a.id()), ip(3), &[4000], 100) {
        Err(RegistryError::IdTaken(id)) => assert_eq!(id, a.id()),
        other => panic!("a live reflector's id given again: {:?}", other.map(|r| r.id())),
    }
    // A wrong password is an error that names the server, not the password.
    let bad = RegistryConfig::new(&redis.url().replace("fleet-test-password", "wrong"));
    let e = Registrar::register(&bad, &secret(), None, ip(4), &[4000], 100)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("127.0.0.1") && !e.contains("wrong"), "{e}");
}

#[test]
fn two_control_servers_place_every_cell_once_and_follow_failures() {
    let redis = RedisServer::start();
    let cfg = config(&redis, 600);
    let cells = grid(4, 3);
    let mut a = Registrar::register(&cfg, &secret(), None, ip(1), &[4000, 4001], 100).unwrap();
    let mut b = Registrar::register(&cfg, &secret(), None, ip(2), &[5000], 100).unwrap();
    let mut one = Directory::new(&cfg, &secret()).unwrap();
    let mut two = Directory::new(&cfg, &secret()).unwrap();
    // Both at once: every claim is a compare-and-set, so they agree.
    let (v1, v2) = std::thread::scope(|s| {
        let h = s.spawn(|| one.refresh(&cells).unwrap().clone());
        let v2 = two.refresh(&cells).unwrap().clone();
        (h.join().unwrap(), v2)
    });
    assert_eq!(v1.cells.len(), cells.len(), "every cell placed");
    assert_eq!(v1.cells, v2.cells, "both control servers see one placement");
    assert_eq!(v1.claims + v2.claims, cells.len() as u64, "each cell claimed once");
    let n = per_reflector(&v1);
    assert_eq!((n[&a.id()], n[&b.id()]), (6, 6), "spread over the live reflectors");
    let (ta, _) = v1.target((0, 0)).unwrap();
    assert!(ta == a.id() || ta == b.id());

    // Placements stay while their reflectors live.
    a.heartbeat(10, 0, false).unwrap();
    b.heartbeat(10, 0, false).unwrap();
    let again = one.refresh(&cells).unwrap().clone();
    assert_eq!(again.cells, v1.cells);
    assert_eq!(again.claims, v1.claims, "nothing claimed again");

    // b stops heartbeating: after the TTL its cells go to a.
    let died = Instant::now();
    let moved = loop {
        a.heartbeat(10, 0, false).unwrap();
        let v = one.refresh(&cells).unwrap().clone();
        if !v.reflectors.contains_key(&b.id()) {
            break v;
        }
        assert!(died.elapsed() < Duration::from_secs(3), "b never expired");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(died.elapsed() >= Duration::from_millis(400), "not before its TTL");
    assert_eq!(per_reflector(&moved)[&a.id()], cells.len(), "all cells on a");
    let v2 = two.refresh(&cells).unwrap();
    assert_eq!(v2.cells, moved.cells, "the other control server agrees");

    // A draining reflector gets no cells and gives its own away.
    let mut c = Registrar::register(&cfg, &secret(), None, ip(3), &[6000], 100).unwrap();
    a.heartbeat(10, 0, true).unwrap();
    c.heartbeat(0, 0, false).unwrap();
    let v = one.refresh(&cells).unwrap();
    assert_eq!(
        per_reflector(v).get(&c.id()),
        Some(&cells.len()),
        "a drains: c has them all"
    );
    assert!(v.reflectors[&a.id()].draining);
    // A clean stop removes the entry at once.
    c.deregister().unwrap();
    a.heartbeat(10, 0, false).unwrap();
    let v = one.refresh(&cells).unwrap();
    assert!(!v.reflectors.contains_key(&c.id()));
    assert_eq!(per_reflector(v)[&a.id()], cells.len());
    drop(b);
}

#[test]
fn a_rogue_entry_is_refused_and_counted() {
    let redis = RedisServer::start();
    let cfg = config(&redis, 600);
    let cells = grid(2, 2);
    let honest = Registrar::register(&cfg, &secret(), None, ip(1), &[4000], 100).unwrap();
    // Someone who can write to Redis but lacks the fleet's secret.
    let other: SecretRing = Secret::new(&[0x66; 32]).unwrap().into();
    let rogue = Registrar::register(&cfg, &other, None, ip(66), &[4000], 100).unwrap();
    let mut d = Directory::new(&cfg, &secret()).unwrap();
    let v = d.refresh(&cells).unwrap();
    assert!(v.reflectors.contains_key(&honest.id()));
    assert!(
        !v.reflectors.contains_key(&rogue.id()),
        "not signed with the fleet's secret"
    );
    assert!(v.rogue >= 1);
    assert!(v.cells.values().all(|p| p.reflector == honest.id()));
}

#[test]
fn redis_down_keeps_the_view_and_a_restart_is_repaired_by_heartbeats() {
    let mut redis = RedisServer::start();
    let port = redis.port;
    let cfg = config(&redis, 600);
    let cells = grid(3, 1);
    let mut a = Registrar::register(&cfg, &secret(), None, ip(1), &[4000], 100).unwrap();
    let mut d = Directory::new(&cfg, &secret()).unwrap();
    let before: HashMap<(u32, u32), Placed> = d.refresh(&cells).unwrap().cells.clone();
    assert_eq!(before.len(), 3);
    redis.kill();
    assert!(d.refresh(&cells).is_err());
    assert_eq!(d.view().cells, before, "the last view answers while Redis is down");
    assert!(a.heartbeat(0, 0, false).is_err());
    // Back, empty (a restart that lost every key): the control server
    // holds its placements (and writes them back) while reflectors
    // register again; the next heartbeat registers a again, on its id.
    let _redis = RedisServer::start_on(port);
    let v = d.refresh(&cells).unwrap();
    assert_eq!(v.cells, before, "held across the restart");
    assert!(v.target((0, 0)).is_some(), "and still answered");
    a.heartbeat(0, 0, false).unwrap();
    // A newcomer waits until the live ones had their chance, and never
    // gets an id a live reflector holds (the counter was lost too).
    let t0 = Instant::now();
    let mut b = Registrar::register(&cfg, &secret(), None, ip(2), &[5000], 100).unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(200), "it waited for the others");
    assert_ne!(b.id(), a.id(), "an id in use is never handed out again");
    // Once the hold is over, placement is back to its rules: a's cells
    // stay on a (alive), none moved.
    let until = Instant::now() + Duration::from_millis(1_300);
    while Instant::now() < until {
        a.heartbeat(0, 0, false).unwrap();
        b.heartbeat(0, 0, false).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = d.refresh(&cells).unwrap();
    assert_eq!(v.cells, before);
    assert!(v.reflectors.contains_key(&b.id()));
}

#[test]
fn a_second_process_on_a_held_id_is_refused_at_heartbeat() {
    let redis = RedisServer::start();
    let cfg = config(&redis, 600);
    let mut a = Registrar::register(&cfg, &secret(), None, ip(1), &[4000], 100).unwrap();
    // Its entry removed behind its back, and the id taken by another.
    let mut c = redis.client().get_connection().unwrap();
    redis::cmd("DEL")
        .arg(format!("reflector:reflector:{}", a.id()))
        .query::<()>(&mut c)
        .unwrap();
    let _b = Registrar::register(&cfg, &secret(), Some(a.id()), ip(2), &[4000], 100).unwrap();
    match a.heartbeat(0, 0, false) {
        Err(RegistryError::IdTaken(id)) => assert_eq!(id, a.id()),
        other => panic!("a heartbeat over another process's entry: {other:?}"),
    }
}

fn tls_config(redis: &RedisServer, tls: RegistryTls) -> RegistryConfig {
    RegistryConfig {
        tls,
        ..config(redis, 600)
    }
}

/// Registers, heartbeats and places a world over `cfg`: the whole round
/// trip a fleet makes through its registry.
fn round_trip(cfg: &RegistryConfig) {
    let cells = grid(2, 2);
    let mut a = Registrar::register(cfg, &secret(), None, ip(1), &[4000], 100).unwrap();
    a.heartbeat(3, 10, false).unwrap();
    let mut d = Directory::new(cfg, &secret()).unwrap();
    d.check().unwrap();
    let v = d.refresh(&cells).unwrap();
    assert_eq!(v.cells.len(), cells.len(), "every cell placed");
    assert_eq!(v.reflectors[&a.id()].members, 3, "the heartbeat's load arrived");
    assert_eq!(v.target((1, 1)).unwrap().0, a.id());
    let (ports, any) = a.placed_ports().unwrap();
    assert!(any && ports.contains(&4000), "the reflector reads its claims back");
}

#[test]
fn the_round_trip_goes_over_tls_checked_against_the_fleets_ca() {
    let redis = RedisServer::start_tls(TlsMode::ServerOnly);
    assert!(redis.url().starts_with("rediss://"));
    round_trip(&tls_config(&redis, redis.client_tls()));
}

#[test]
fn a_redis_that_requires_client_certificates_gets_one() {
    let redis = RedisServer::start_tls(TlsMode::ClientCertificates);
    let tls = redis.client_tls();
    assert!(tls.client_cert.is_some());
    round_trip(&tls_config(&redis, tls.clone()));
    // Without one the server ends the handshake, and the message says why.
    let without = RegistryTls {
        client_cert: None,
        ..tls
    };
    let e = Registrar::register(&tls_config(&redis, without), &secret(), None, ip(2), &[4000], 100)
        .err()
        .expect("refused without a client certificate");
    assert!(e.is_misconfigured(), "{e}");
    assert!(e.to_string().contains("--registry-cert-file"), "{e}");
}

#[test]
fn a_server_certificate_that_does_not_verify_is_refused_by_name() {
    let redis = RedisServer::start_tls(TlsMode::ServerOnly);
    let scratch = std::env::temp_dir().join(format!("registry-other-ca-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let other = scratch.join("other-ca.pem");
    TestCa::new("another CA").write(&other);
    let wrong_ca = RegistryTls {
        ca_file: Some(other.clone()),
        client_cert: None,
    };
    // Both sides: a reflector registering, a control server checking.
    let e = Registrar::register(
        &tls_config(&redis, wrong_ca.clone()),
        &secret(),
        None,
        ip(1),
        &[4000],
        100,
    )
    .err()
    .expect("a certificate of another CA");
    let mut d = Directory::new(&tls_config(&redis, wrong_ca), &secret()).unwrap();
    let e2 = d.check().expect_err("a certificate of another CA");
    let _ = std::fs::remove_dir_all(&scratch);
    for e in [e, e2] {
        eprintln!("refused as: {e}");
        assert!(e.is_misconfigured(), "{e}");
        let text = e.to_string();
        assert!(text.contains("does not verify against the CA file"), "{text}");
        assert!(text.contains("other-ca.pem"), "names the file: {text}");
        assert!(!text.contains(reflector_registry::testing::PASSWORD), "{text}");
    }
    // The right CA, but a host the certificate does not name.
    let other_host = RegistryConfig {
        url: redis.url().replace("127.0.0.1", "127.0.0.2"),
        ..tls_config(&redis, redis.client_tls())
    };
    let e = Directory::new(&other_host, &secret())
        .unwrap()
        .check()
        .expect_err("not its name");
    eprintln!("refused as: {e}");
    assert!(e.is_misconfigured(), "{e}");
    assert!(e.to_string().contains("not valid for '127.0.0.2'"), "{e}");
    // The system's roots do not know the test CA either.
    let e = Registrar::register(&config(&redis, 600), &secret(), None, ip(1), &[4000], 100)
        .err()
        .expect("not signed by a public CA");
    assert!(e.to_string().contains("the system's roots"), "{e}");
}

#[test]
fn a_scheme_that_does_not_match_the_port_is_named() {
    let plain = RedisServer::start();
    let tls = RedisServer::start_tls(TlsMode::ServerOnly);
    // rediss:// to the plain server (with a good CA file: the scheme is wrong).
    let to_plain = tls_config(
        &plain,
        RegistryTls {
            ca_file: tls.ca_file(),
            client_cert: None,
        },
    );
    let to_plain = RegistryConfig {
        url: plain.url().replace("redis://", "rediss://"),
        ..to_plain
    };
    let e = Registrar::register(&to_plain, &secret(), None, ip(1), &[4000], 100)
        .err()
        .expect("TLS to a plain port");
    assert!(e.is_misconfigured(), "{e}");
    eprintln!("refused as: {e}");
    assert!(e.to_string().contains("plain Redis port"), "{e}");
    // redis:// to the TLS server.
    let to_tls = RegistryConfig {
        url: tls.url().replace("rediss://", "redis://"),
        ..config(&tls, 600)
    };
    let mut d = Directory::new(&to_tls, &secret()).unwrap();
    let e = d.check().expect_err("plain text to a TLS port");
    assert!(e.is_misconfigured(), "{e}");
    eprintln!("refused as: {e}");
    assert!(
        e.to_string().contains("is a TLS port") && e.to_string().contains("rediss://"),
        "{e}"
    );
    // A Redis that is down is an outage, not a set-up to fix.
    let port = plain.port;
    drop(plain);
    let down = RegistryConfig::new(&format!("redis://127.0.0.1:{port}"));
    let e = Directory::new(&down, &secret())
        .unwrap()
        .check()
        .expect_err("nobody listens");
    assert!(!e.is_misconfigured(), "{e}");
}
