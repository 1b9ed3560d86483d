//! The reflector on loopback, driven by raw test clients: exact delivery
//! counts per backend, hostile traffic interleaved with real traffic, the
//! amplification bound, leave and expiry.

mod common;
use reflector::backend::BackendKind;
use reflector::membership::{Keys, Policy};
use reflector::metrics::Snapshot;
use reflector::server::{Server, ServerConfig};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest};
use reflector_proto::protocol::{emit, ErrorCode, Header, Kind, Packet, SmallDatagram, HEADER_LEN, TOKEN_LEN};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x5a; 32];

fn start(backend: BackendKind, groups: usize, policy: Policy) -> Server {
    let cfg = ServerConfig {
        bind: "127.0.0.1".parse().unwrap(),
        ports: vec![0; groups],
        keys: Keys {
            token_secret: Secret::new(&SECRET).unwrap().into(),
            reflector_id: 0,
            cookie_key: Secret::random(),
        },
        policy,
        backend,
        threads: 2,
        rcvbuf: 4 << 20,
        sndbuf: 4 << 20,
    };
    Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("server starts")
}

fn token(player: u32, group: u16, ttl_s: i64) -> [u8; TOKEN_LEN] {
    let now = (reflector::unix_now_ms() / 1000) as i64;
    TokenClaims {
        player,
        reflector: 0,
        group,
        expires_unix_s: (now + ttl_s).max(0) as u64,
    }
    .sign(&Secret::new(&SECRET).unwrap())
}

/// Retries as the bots do; a loopback join that takes 5 s is broken.
fn join_config() -> ClientConfig {
    ClientConfig {
        retry: Duration::from_millis(250),
        give_up: Some(Duration::from_secs(5)),
    }
}

struct Client {
    sock: UdpSocket,
    id: u32,
    group: u16,
    server: SocketAddr,
    buf: Vec<u8>,
}

impl Client {
    fn new(group: u16, id: u32) -> Client {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Client {
            sock,
            id,
            group,
            server: SocketAddr::from(([127, 0, 0, 1], group)),
            buf: vec![0; 70_000],
        }
    }

    fn send(&self, bytes: &[u8]) {
        self.sock.send_to(bytes, self.server).unwrap();
    }

    fn recv(&mut self) -> Option<&[u8]> {
        match self.sock.recv_from(&mut self.buf) {
            Ok((n, from)) => {
                assert_eq!(from, self.server, "datagrams come from the group's port");
                Some(&self.buf[..n])
            }
            Err(_) => None,
        }
    }

    /// Two-step join; panics if the reflector does not admit us.
    fn join(group: u16, id: u32) -> Client {
        let c = Client::new(group, id);
        let req = JoinRequest {
            reflector: c.server,
            group,
            player: id,
            token: token(id, group, 60),
        };
        blocking::join(&c.sock, req, join_config()).expect("the reflector admits us");
        c
    }

    fn data(&self, seq: u32, payload: &[u8]) {
        let mut b = vec![0u8; HEADER_LEN + payload.len()];
        emit(
            &Header {
                kind: Kind::Data,
                group: self.group,
                sender: self.id,
                seq,
            },
            payload,
            &mut b,
        )
        .unwrap();
        self.send(&b);
    }

    /// Receives DATA until `want` arrived or 3 s pass; checks each datagram
    /// is intact and not from ourselves. Returns how many arrived.
    fn drain_data(&mut self, want: usize, seen: &mut Vec<(u32, u32)>) -> usize {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut got = 0;
        let me = self.id;
        while got < want && Instant::now() < deadline {
            let Some(d) = self.recv() else { break };
            let p = Packet::parse(d).expect("forwarded datagrams are intact");
            assert_eq!(p.kind(), Kind::Data);
            assert_ne!(p.sender(), me, "a member never gets its own datagram back");
            assert_eq!(p.payload(), payload_for(p.sender(), p.seq()).as_slice());
            seen.push((p.sender(), p.seq()));
            got += 1;
        }
        got
    }

    /// True if nothing more arrives within a short grace period.
    fn quiet(&mut self) -> bool {
        self.sock.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
        let r = self.recv().is_none();
        self.sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        r
    }
}

fn payload_for(sender: u32, seq: u32) -> Vec<u8> {
    let mut p = format!("player {sender} move {seq};").into_bytes();
    p.resize(60 + (seq as usize % 40), b'.');
    p
}

fn wait_for(server: &Server, what: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let t = server.registry().total();
        if what(&t) || Instant::now() > deadline {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// N members, M datagrams each, sent in rounds; every member gets exactly
/// (N-1)*M, each datagram once and intact; a second group is untouched.
fn exact_delivery(backend: BackendKind) {
    const N: usize = 6;
    const M: u32 = 150;
    let server = start(backend, 2, Policy::default());
    let (ga, gb) = (server.ports()[0], server.ports()[1]);
    let mut members: Vec<Client> = (0..N as u32).map(|i| Client::join(ga, 100 + i)).collect();
    let mut other = Client::join(gb, 999);
    let mut seen: Vec<Vec<(u32, u32)>> = vec![Vec::new(); N];
    let mut counts = [0usize; N];
    for seq in 0..M {
        for m in &members {
            m.data(seq, &payload_for(m.id, seq));
        }
        if seq % 10 == 9 || seq == M - 1 {
            let want = (N - 1) * (seq as usize + 1);
            for (i, m) in members.iter_mut().enumerate() {
                counts[i] += m.drain_data(want - counts[i], &mut seen[i]);
            }
        }
    }
    for (i, m) in members.iter_mut().enumerate() {
        assert_eq!(counts[i], (N - 1) * M as usize, "member {i} via {backend}");
        assert!(m.quiet(), "member {i} got more than (N-1)*M");
        let mut s = seen[i].clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), counts[i], "member {i} got duplicates");
    }
    assert!(other.quiet(), "the other group received traffic");
    let t = wait_for(&server, |t| t.fanned_out >= (N * (N - 1)) as u64 * u64::from(M));
    assert_eq!(t.forwarded, N as u64 * u64::from(M));
    assert_eq!(t.fanned_out, (N * (N - 1)) as u64 * u64::from(M));
    assert_eq!(t.joins, N as u64 + 1);
    assert_eq!(t.members, N as u64 + 1);
    assert_eq!(t.send_errors, 0);
    assert_eq!(t.dropped_non_member + t.malformed, 0);
    server.stop();
    let reg = server.join().unwrap();
    assert_eq!(reg.total().forwarded, t.forwarded);
}

/// Bad input of every kind, interleaved with real traffic: each is dropped
/// and counted, members lose nothing, and the attacker never gets back
/// more bytes than it sent.
fn hostile_traffic(backend: BackendKind) {
    const N: usize = 4;
    const M: u32 = 60;
    let server = start(backend, 1, Policy::default());
    let g = server.ports()[0];
    let mut members: Vec<Client> = (0..N as u32).map(|i| Client::join(g, i + 1)).collect();
    let mut attacker = Client::new(g, 66);
    attacker.sock.set_nonblocking(true).unwrap();
    let good_join = SmallDatagram::join(g, 66, &token(66, g, 60), None);
    let mut bad: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", vec![0x52, 0x46, 1]),
        ("bad magic", b"GET / HTTP/1.0\r\n\r\n".to_vec()),
        ("oversized length", {
            let mut d = SmallDatagram::simple(Kind::Keepalive, g, 66, 0).as_bytes().to_vec();
            d[6..8].copy_from_slice(&1000u16.to_be_bytes());
            d
        }),
        ("data from non-member", {
            let mut b = vec![0u8; 100];
            emit(
                &Header {
                    kind: Kind::Data,
                    group: g,
                    sender: 66,
                    seq: 1,
                },
                &[7; 84],
                &mut b,
            )
            .unwrap();
            b
        }),
        (
            "forged token",
            SmallDatagram::join(g, 66, &[0xee; TOKEN_LEN], None).as_bytes().to_vec(),
        ),
        (
            "expired token",
            SmallDatagram::join(g, 66, &token(66, g, -5), None).as_bytes().to_vec(),
        ),
        (
            "wrong cookie",
            SmallDatagram::join(g, 66, &token(66, g, 60), Some(&[1; 16]))
                .as_bytes()
                .to_vec(),
        ),
        (
            "member's token replayed from elsewhere",
            SmallDatagram::join(g, 1, &token(1, g, 60), None).as_bytes().to_vec(),
        ),
        (
            "keepalive from non-member",
            SmallDatagram::simple(Kind::Keepalive, g, 66, 0).as_bytes().to_vec(),
        ),
        ("join without echo", good_join.as_bytes().to_vec()),
    ];
    let mut bad_version = SmallDatagram::simple(Kind::Leave, g, 66, 0).as_bytes().to_vec();
    bad_version[2] = 2;
    bad.push(("bad version", bad_version));
    let mut unknown = SmallDatagram::simple(Kind::Leave, g, 66, 0).as_bytes().to_vec();
    unknown[3] = 0x7f;
    bad.push(("unknown type", unknown));

    let mut attacker_sent = 0usize;
    let mut attacker_got = 0usize;
    let mut counts = [0usize; N];
    let mut seen = vec![Vec::new(); N];
    for seq in 0..M {
        for m in &members {
            m.data(seq, &payload_for(m.id, seq));
            for (_, b) in &bad {
                attacker.send(b);
                attacker_sent += b.len();
            }
        }
        let want = (N - 1) * (seq as usize + 1);
        for (i, m) in members.iter_mut().enumerate() {
            counts[i] += m.drain_data(want - counts[i], &mut seen[i]);
        }
        while let Some(r) = attacker.recv() {
            attacker_got += r.len();
        }
    }
    for (i, c) in counts.iter().enumerate() {
        assert_eq!(*c, (N - 1) * M as usize, "member {i} lost real traffic via {backend}");
    }
    let per_kind = (N as u64) * u64::from(M);
    let t = wait_for(&server, |t| {
        t.received >= per_kind * (bad.len() as u64 + 1) + 2 * N as u64
    });
    assert_eq!(
        t.malformed,
        per_kind * 5,
        "truncated, bad magic, oversized length, bad version, unknown type"
    );
    assert_eq!(
        t.dropped_non_member,
        per_kind * 2,
        "data and keepalive from a non-member"
    );
    assert_eq!(t.bad_token, per_kind, "forged token");
    assert_eq!(t.expired_token, per_kind);
    assert_eq!(t.bad_cookie, per_kind);
    // A replayed token is valid, so it earns a challenge, but the challenge
    // goes to the replayer's address and membership needs the echo.
    assert_eq!(
        t.challenges,
        2 * per_kind + N as u64,
        "joins without echo and replays, plus the members' own"
    );
    assert_eq!(t.members, N as u64, "no attacker became a member");
    assert_eq!(t.forwarded, per_kind);
    assert!(
        t.reply_bytes_out <= t.control_bytes_in,
        "{} > {}",
        t.reply_bytes_out,
        t.control_bytes_in
    );
    // Replies may still be in flight; what did arrive is bounded too.
    std::thread::sleep(Duration::from_millis(100));
    while let Some(r) = attacker.recv() {
        attacker_got += r.len();
    }
    assert!(attacker_got > 0, "refused joins get small errors back");
    assert!(
        attacker_got <= attacker_sent,
        "amplification: got {attacker_got} bytes for {attacker_sent} sent"
    );
    // The challenge answered with the attacker's *own* address still works:
    // validation is about the address, not about who asks.
    let ok = Client::join(g, 66);
    drop(ok);
}

#[test]
fn error_replies_tell_clients_what_to_do() {
    let server = start(BackendKind::Sendto, 1, Policy::default());
    let g = server.ports()[0];
    let mut c = Client::new(g, 5);
    c.send(SmallDatagram::join(g, 5, &token(5, g, -1), None).as_bytes());
    let r = c.recv().expect("error reply");
    assert_eq!(
        Packet::parse(r).unwrap().error_code(),
        Some(Ok(ErrorCode::ExpiredToken))
    );
    c.data(1, b"hello");
    let r = c.recv().expect("error reply");
    assert_eq!(Packet::parse(r).unwrap().error_code(), Some(Ok(ErrorCode::NotMember)));
}

#[test]
fn leave_and_expiry_stop_delivery() {
    // Long enough that `a`, sending a keepalive every 100 ms, survives a
    // scheduling stall of a second on a loaded machine.
    let policy = Policy {
        member_timeout_ms: 1500,
        ..Policy::default()
    };
    let server = start(BackendKind::Sendmmsg, 1, policy);
    let g = server.ports()[0];
    let a = Client::join(g, 1);
    let mut b = Client::join(g, 2);
    let mut c = Client::join(g, 3);
    let mut seen = Vec::new();
    a.data(0, &payload_for(1, 0));
    assert_eq!(b.drain_data(1, &mut seen), 1);
    assert_eq!(c.drain_data(1, &mut seen), 1);
    // c leaves at once; b falls silent and expires, a keeps talking.
    c.send(SmallDatagram::simple(Kind::Leave, g, 3, 0).as_bytes());
    let t = wait_for(&server, |t| t.leaves == 1);
    assert_eq!(t.members, 2);
    let deadline = Instant::now() + Duration::from_secs(8);
    while server.registry().total().expired == 0 && Instant::now() < deadline {
        a.send(SmallDatagram::simple(Kind::Keepalive, g, 1, 0).as_bytes());
        std::thread::sleep(Duration::from_millis(100));
    }
    let t = server.registry().total();
    assert_eq!(t.expired, 1, "b expired");
    assert_eq!(t.members, 1);
    // b's stale copy of the first round aside, nothing more reaches b or c.
    a.data(1, &payload_for(1, 1));
    assert!(b.quiet() && c.quiet());
    assert_eq!(wait_for(&server, |t| t.forwarded == 2).fanned_out, 2);
    drop(a);
}

/// A member that vanishes without LEAVE (its port now answers ICMP port
/// unreachable) until it expires: the queued ICMP errors fail later sends
/// on the group socket; they must be drained, counted and the sends retried,
/// so the remaining members lose nothing.
fn departed_member_costs_nothing_to_the_others(backend: BackendKind) {
    const M: u32 = 100;
    let server = start(backend, 1, Policy::default());
    let g = server.ports()[0];
    let a = Client::join(g, 1);
    let mut b = Client::join(g, 2);
    let c = Client::join(g, 3);
    drop(c);
    let mut seen = Vec::new();
    let mut got = 0;
    for seq in 0..M {
        a.data(seq, &payload_for(1, seq));
        got += b.drain_data(1, &mut seen);
    }
    assert_eq!(got, M as usize, "b lost datagrams via {backend}");
    assert!(b.quiet());
    let t = wait_for(&server, |t| t.forwarded == u64::from(M));
    assert_eq!(t.forwarded, u64::from(M));
    assert_eq!(t.send_errors, 0);
    assert!(
        t.icmp_errors > 0,
        "the departed member's port unreachables were seen: {t:?}"
    );
}

backend_matrix!(exact_delivery);

backend_matrix!(hostile_traffic);

backend_matrix!(departed_member_costs_nothing_to_the_others);
