//! The reflector on loopback, driven by raw test clients: exact delivery
//! counts per backend, hostile traffic interleaved with real traffic, the
//! amplification bound, leave and expiry.

use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::{
    emit, ErrorCode, Header, Kind, Packet, SessionKeys, SmallDatagram, DATA_PAYLOAD, TOKEN_LEN,
};
use reflector_server::backend::BackendKind;
use reflector_server::backend_matrix;
use reflector_server::membership::Policy;
use reflector_server::metrics::Snapshot;
use reflector_server::server::{Server, ServerConfig};
use reflector_server::testing::Case;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x5a; 32];

fn start(backend: impl Into<Case>, groups: usize, policy: Policy) -> Server {
    let cfg = ServerConfig {
        ports: vec![0; groups],
        policy,
        threads: 2,
        ..backend
            .into()
            .config([127, 0, 0, 1].into(), Secret::new(&SECRET).unwrap())
    };
    Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("server starts")
}

/// The session keys the control server would hand out with `token`.
fn keys_of(token: &[u8; TOKEN_LEN]) -> SessionKeys {
    SessionKeys::derive(&Secret::new(&SECRET).unwrap(), token)
}

/// A header for hand-made datagrams.
fn hdr(kind: Kind, group: u16, sender: u32, membership: u32, seq: u64) -> Header {
    Header {
        kind,
        group,
        sender,
        membership,
        seq,
    }
}

fn token(player: u32, group: u16, ttl_s: i64) -> [u8; TOKEN_LEN] {
    let now = (reflector_proto::unix_now_ms() / 1000) as i64;
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
    server: SocketAddr,
    buf: Vec<u8>,
    /// Once joined: the membership (key, id, sequence numbers).
    session: Option<Session>,
}

impl Client {
    fn new(group: u16, id: u32) -> Client {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        Client {
            sock,
            id,
            server: SocketAddr::from(([127, 0, 0, 1], group)),
            buf: vec![0; 70_000],
            session: None,
        }
    }

    fn send(&self, bytes: &[u8]) {
        self.sock.send_to(bytes, self.server).unwrap();
    }

    /// The next datagram, or None when the read timeout passes. Any other
    /// error fails the test: an EINTR here once came from io_uring work
    /// the server left to run on this thread, and read as lost datagrams.
    fn recv(&mut self) -> Option<&[u8]> {
        match self.sock.recv_from(&mut self.buf) {
            Ok((n, from)) => {
                assert_eq!(from, self.server, "datagrams come from the group's port");
                Some(&self.buf[..n])
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => None,
            Err(e) => panic!("receiving on the client's socket: {e}"),
        }
    }

    /// Two-step join; panics if the reflector does not admit us.
    fn join(group: u16, id: u32) -> Client {
        let mut c = Client::new(group, id);
        let token = token(id, group, 60);
        let req = JoinRequest {
            reflector: c.server,
            group,
            player: id,
            token,
            keys: keys_of(&token),
            first_seq: 1,
        };
        let (session, _) = blocking::join(&c.sock, req, join_config()).expect("the reflector admits us");
        c.session = Some(session);
        c
    }

    fn session(&mut self) -> &mut Session {
        self.session.as_mut().expect("joined")
    }

    /// DATA number `seq` of ours: the number, then `payload`, sealed by the
    /// session (tagged if the group wants tags). Returns the datagram.
    fn data(&mut self, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; DATA_PAYLOAD + 4 + payload.len()];
        b[DATA_PAYLOAD..DATA_PAYLOAD + 4].copy_from_slice(&seq.to_be_bytes());
        b[DATA_PAYLOAD + 4..].copy_from_slice(payload);
        let n = self
            .session()
            .emit_data(4 + payload.len(), &mut b)
            .expect("a member")
            .unwrap();
        self.send(&b[..n]);
        b
    }

    /// A KEEPALIVE or LEAVE of the session.
    fn control(&mut self, kind: Kind) -> Vec<u8> {
        let t = match kind {
            Kind::Leave => self.session().leave(),
            _ => self.session().keepalive(),
        }
        .expect("a member");
        self.send(t.datagram.as_bytes());
        t.datagram.as_bytes().to_vec()
    }

    /// Receives DATA until `want` arrived or 3 s pass; checks each datagram
    /// is intact and not from ourselves. Returns how many arrived.
    /// PROBEs from the reflector are answered on the way, as any client does.
    fn drain_data(&mut self, want: usize, seen: &mut Vec<(u32, u32)>) -> usize {
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut got = 0;
        let me = self.id;
        while got < want && Instant::now() < deadline {
            let Some(d) = self.recv() else { break };
            let p = Packet::parse(d.to_vec()).expect("datagrams from the reflector parse");
            if p.kind() == Kind::Probe {
                let server = self.server;
                if let Some(s) = self.session.as_mut() {
                    s.handle(Instant::now(), server, &p);
                    if let Some(t) = s.poll_transmit() {
                        self.send(t.datagram.as_bytes());
                    }
                }
                continue;
            }
            assert_eq!(p.kind(), Kind::Data);
            assert_ne!(p.sender(), me, "a member never gets its own datagram back");
            assert_eq!(p.tag(), Some(0), "tags are stripped before fan-out");
            let (num, rest) = p.payload().split_at(4);
            let num = u32::from_be_bytes(num.try_into().unwrap());
            assert_eq!(rest, payload_for(p.sender(), num).as_slice());
            seen.push((p.sender(), num));
            got += 1;
        }
        got
    }

    /// True if no DATA arrives within a short grace period (the
    /// reflector's PROBEs may, and are answered).
    fn quiet(&mut self) -> bool {
        self.sock.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
        let mut quiet = true;
        while let Some(d) = self.recv() {
            let Ok(p) = Packet::parse(d.to_vec()) else {
                quiet = false;
                break;
            };
            if p.kind() != Kind::Probe {
                quiet = false;
                break;
            }
        }
        self.sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        quiet
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
fn exact_delivery(backend: Case) {
    const N: usize = 6;
    const M: u32 = 150;
    let server = start(backend, 2, Policy::default());
    let (ga, gb) = (server.ports()[0], server.ports()[1]);
    let mut members: Vec<Client> = (0..N as u32).map(|i| Client::join(ga, 100 + i)).collect();
    let mut other = Client::join(gb, 999);
    let mut seen: Vec<Vec<(u32, u32)>> = vec![Vec::new(); N];
    let mut counts = [0usize; N];
    for seq in 0..M {
        for m in &mut members {
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
fn hostile_traffic(backend: Case) {
    const N: usize = 4;
    const M: u32 = 60;
    let server = start(backend, 1, Policy::default());
    let g = server.ports()[0];
    let mut members: Vec<Client> = (0..N as u32).map(|i| Client::join(g, i + 1)).collect();
    let mut attacker = Client::new(g, 66);
    attacker.sock.set_nonblocking(true).unwrap();
    // The attacker holds a ticket of its own (player 66), and has seen
    // member 1's token, membership id and datagrams on the path, but not its
    // session key.
    let own = token(66, g, 60);
    let own_keys = keys_of(&own);
    let guessed = SessionKeys::from_session([0xee; 32]);
    let member1 = members[0].session().membership().unwrap();
    let seen_keepalive = members[0].control(Kind::Keepalive);
    let j = |player, t: &[u8; TOKEN_LEN], cookie: Option<&[u8; 16]>, k: &SessionKeys| {
        SmallDatagram::join(&hdr(Kind::Join, g, player, 0, 1), t, cookie, k)
            .as_bytes()
            .to_vec()
    };
    let mut bad: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", vec![0x52, 0x46, 2]),
        ("bad magic", b"GET / HTTP/1.0\r\n\r\n".to_vec()),
        ("oversized length", {
            let mut d = SmallDatagram::simple(&hdr(Kind::Keepalive, g, 66, 0, 1), &own_keys)
                .as_bytes()
                .to_vec();
            d[6..8].copy_from_slice(&1000u16.to_be_bytes());
            d
        }),
        ("data from non-member", {
            let mut b = vec![0u8; 100];
            let n = emit(&hdr(Kind::Data, g, 66, 0, 1), &[7; 68], Some(&own_keys), &mut b).unwrap();
            b.truncate(n);
            b
        }),
        ("forged token", j(66, &[0xee; TOKEN_LEN], None, &own_keys)),
        ("expired token", {
            let t = token(66, g, -5);
            j(66, &t, None, &keys_of(&t))
        }),
        ("wrong cookie", j(66, &own, Some(&[1; 16]), &own_keys)),
        (
            "member's token replayed without its key",
            j(1, &token(1, g, 60), None, &guessed),
        ),
        (
            "keepalive from non-member",
            SmallDatagram::simple(&hdr(Kind::Keepalive, g, 66, 0, 1), &own_keys)
                .as_bytes()
                .to_vec(),
        ),
        (
            "member's keepalive forged without its key",
            SmallDatagram::simple(&hdr(Kind::Keepalive, g, 1, member1, 1 << 40), &guessed)
                .as_bytes()
                .to_vec(),
        ),
        ("member's data forged without its key", {
            let mut b = vec![0u8; 100];
            let n = emit(
                &hdr(Kind::Data, g, 1, member1, 1 << 40),
                &[7; 68],
                Some(&guessed),
                &mut b,
            )
            .unwrap();
            b.truncate(n);
            b
        }),
        ("member's keepalive replayed from elsewhere", seen_keepalive),
        ("join without echo", j(66, &own, None, &own_keys)),
    ];
    // A version-1 LEAVE: 16 bytes, so no 18-byte ERROR(Version) back.
    let mut bad_version = vec![0x52, 0x46, 1, 4, 0, 0, 0, 0, 0, 0, 0, 66, 0, 0, 0, 0];
    bad_version[4..6].copy_from_slice(&g.to_be_bytes());
    bad.push(("bad version", bad_version));
    let mut unknown = SmallDatagram::simple(&hdr(Kind::Leave, g, 66, 0, 1), &own_keys)
        .as_bytes()
        .to_vec();
    unknown[3] = 0x7f;
    bad.push(("unknown type", unknown));

    let mut attacker_sent = 0usize;
    let mut attacker_got = 0usize;
    let mut counts = [0usize; N];
    let mut seen = vec![Vec::new(); N];
    for seq in 0..M {
        for m in &mut members {
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
        t.received > per_kind * (bad.len() as u64 + 1) + 2 * N as u64
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
    // A seen token is useless without its key: not even a challenge.
    assert_eq!(t.bad_mac, 2 * per_kind, "replayed token, forged keepalive");
    assert_eq!(t.bad_tag, per_kind, "forged data never reaches the members");
    // The member's own keepalive from another address moves nothing; it
    // was accepted at home already, so it is no news and causes no PROBE.
    assert_eq!(t.unvalidated, per_kind);
    assert_eq!((t.rebinds, t.rebind_probes), (0, 0));
    // The attacker's joins without echo are challenged from its own
    // player's budget (5 a second): most are withheld, and counted so.
    assert_eq!(
        t.challenges + t.challenges_suppressed,
        per_kind + N as u64,
        "joins without echo, plus the members' own"
    );
    assert!(t.challenges_suppressed > 0 && t.challenges >= N as u64);
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
    let expired = token(5, g, -1);
    c.send(SmallDatagram::join(&hdr(Kind::Join, g, 5, 0, 1), &expired, None, &keys_of(&expired)).as_bytes());
    let r = c.recv().expect("error reply");
    assert_eq!(
        Packet::parse(r).unwrap().error_code(),
        Some(Ok(ErrorCode::ExpiredToken))
    );
    let mut d = vec![0u8; 64];
    let n = emit(&hdr(Kind::Data, g, 5, 0, 2), b"hello", None, &mut d).unwrap();
    c.send(&d[..n]);
    let r = c.recv().expect("error reply");
    assert_eq!(Packet::parse(r).unwrap().error_code(), Some(Ok(ErrorCode::NotMember)));
    // A client of protocol version 1 is told so, in version 1's layout.
    let mut v1 = vec![0x52, 0x46, 1, 1, 0, 0, 0, 32, 0, 0, 0, 5, 0, 0, 0, 0];
    v1[4..6].copy_from_slice(&g.to_be_bytes());
    v1.extend_from_slice(&[0; 32]);
    c.send(&v1);
    let r = c.recv().expect("version error").to_vec();
    assert_eq!(
        (r.len(), r[2], r[3], u16::from_be_bytes([r[16], r[17]])),
        (18, 1, 7, ErrorCode::Version as u16)
    );
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
    let mut a = Client::join(g, 1);
    let mut b = Client::join(g, 2);
    let mut c = Client::join(g, 3);
    let mut seen = Vec::new();
    a.data(0, &payload_for(1, 0));
    assert_eq!(b.drain_data(1, &mut seen), 1);
    assert_eq!(c.drain_data(1, &mut seen), 1);
    // c leaves at once; b falls silent and expires, a keeps talking.
    c.control(Kind::Leave);
    let t = wait_for(&server, |t| t.leaves == 1);
    assert_eq!(t.members, 2);
    let deadline = Instant::now() + Duration::from_secs(8);
    while server.registry().total().expired == 0 && Instant::now() < deadline {
        a.control(Kind::Keepalive);
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
fn departed_member_costs_nothing_to_the_others(backend: Case) {
    const M: u32 = 100;
    let server = start(backend, 1, Policy::default());
    let g = server.ports()[0];
    let mut a = Client::join(g, 1);
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

/// JOIN_ACK announces a sealed group (flag bit 2, with the instance flag,
/// bit 1) when the reflector is told so, and not otherwise, whatever the
/// backend; the reflector holds no key for it. (A group's own setting is
/// covered by the membership tests.)
fn join_ack_announces_sealing_by_option(backend: Case) {
    for sealed in [false, true] {
        let server = start(
            backend,
            1,
            Policy {
                data_sealed: sealed,
                ..Policy::default()
            },
        );
        let group = server.ports()[0];
        let c = Client::new(group, 7);
        let token = token(7, group, 60);
        let req = JoinRequest {
            reflector: c.server,
            group,
            player: 7,
            token,
            keys: keys_of(&token),
            first_seq: 1,
        };
        let (_, ack) = blocking::join(&c.sock, req, join_config()).expect("the reflector admits us");
        assert_eq!(
            reflector_proto::sealed::group_is_sealed(ack.flags),
            Ok(sealed),
            "data_sealed {sealed}: flags {:#04x}",
            ack.flags
        );
        assert_eq!(ack.instance(), sealed, "the instance flag comes with sealing");
        assert!(ack.tags(), "tags as they were");
        server.stop();
    }
}

backend_matrix!(join_ack_announces_sealing_by_option);

/// One member floods far beyond its rate cap: its excess is dropped and
/// counted, every other member's datagrams still arrive, and what it did
/// get through reaches everyone.
#[test]
fn a_flooding_member_is_capped_and_the_others_unaffected() {
    let policy = Policy {
        member_pps: 50,
        ..Policy::default()
    };
    let server = start(BackendKind::Sendmmsg, 1, policy);
    let g = server.ports()[0];
    let mut flood = Client::join(g, 1);
    let mut polite = Client::join(g, 2);
    let mut listener = Client::join(g, 3);
    const FLOOD: u32 = 400;
    for seq in 0..FLOOD {
        flood.data(seq, &payload_for(1, seq));
    }
    for seq in 0..10 {
        polite.data(seq, &payload_for(2, seq));
    }
    let t = wait_for(&server, |t| t.forwarded + t.rate_limited == u64::from(FLOOD) + 10);
    assert_eq!(t.forwarded + t.rate_limited, u64::from(FLOOD) + 10);
    assert!(t.rate_limited >= u64::from(FLOOD) - 100, "the flood was capped: {t:?}");
    let mut seen = Vec::new();
    let got = listener.drain_data(t.forwarded as usize, &mut seen);
    assert_eq!(got as u64, t.forwarded, "everything let through arrives");
    assert_eq!(
        seen.iter().filter(|(p, _)| *p == 2).count(),
        10,
        "the polite member lost nothing"
    );
    drop((flood, polite));
}

/// A member that answers the reflector's PROBEs as a real client does: the
/// RTT histogram's count and sum move, and the sum is not 0 (a loopback
/// round trip is well under a millisecond, so whole milliseconds would
/// give 0).
#[test]
fn rtt_histogram_moves_with_real_probe_answers() {
    use reflector_http::expo::Format;
    use reflector_server::metrics::Exposition;
    let server = start(
        BackendKind::Sendto,
        1,
        Policy {
            keepalive_ms: 50,
            ..Policy::default()
        },
    );
    let group = server.ports()[0];
    let mut c = Client::join(group, 7);
    c.sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.registry().total().probe_replies < 3 && Instant::now() < deadline {
        let Some(d) = c.recv().map(<[u8]>::to_vec) else {
            continue;
        };
        let Ok(p) = Packet::parse(d) else { continue };
        let server_addr = c.server;
        c.session().handle(Instant::now(), server_addr, &p);
        while let Some(t) = c.session().poll_transmit() {
            c.sock.send_to(t.datagram.as_bytes(), t.to).unwrap();
        }
    }
    let replies = server.registry().total().probe_replies;
    assert!(replies >= 3, "only {replies} PROBE answers measured in 5 s");
    let text = Exposition::new(server.registry().clone(), false).encode(Format::Text);
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} missing:\n{text}"))
            .parse()
            .unwrap()
    };
    let count = value("reflector_rtt_seconds_count");
    let sum = value("reflector_rtt_seconds_sum");
    assert!(count >= replies as f64, "count {count} < {replies} replies");
    assert!(sum > 0.0, "RTT sum is 0 after {count} answers:\n{text}");
    // A loopback round trip: positive and far below a second on average.
    assert!(sum / count < 1.0, "mean RTT {} s", sum / count);
    assert!(value("reflector_probe_replies_total") >= replies as f64);
    server.stop();
    server.join().unwrap();
}
