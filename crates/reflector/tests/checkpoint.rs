//! Checkpoints on loopback (channel version 2): the reflector asks a member
//! for the game state, stores the upload and serves it whole to a joiner
//! while game traffic flows with no loss; every kind of bad request is
//! refused with its reason and counted, before any body is read; a peer
//! that stops reading is cut off at the deadline; the latest two uploads
//! are kept; the memory bound refuses uploads; silent and stalled
//! connections neither grow the reflector's memory nor lock a member out;
//! SIGTERM ends `serve` within a second whatever the channel's peers do;
//! sealed checkpoints pass the unchanged channel and a joiner checks them.

use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::checkpoint::{
    self as channel, Answer, ChannelError, Hello, Member, Op, Refusal, Reply, Request, HELLO_LEN, REPLY_LEN,
};
use reflector_proto::client::{Config as ClientConfig, Event, JoinRequest, Session};
use reflector_proto::protocol::{JoinAck, Kind, Packet, SessionKeys, DATA_PAYLOAD, TOKEN_LEN};
use reflector_server::backend::BackendKind;
use reflector_server::checkpoint::CheckpointConfig;
use reflector_server::membership::Policy;
use reflector_server::server::{Server, ServerConfig};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x3c; 32];
const T: Duration = Duration::from_secs(5);

fn start(groups: usize, ck: CheckpointConfig) -> Server {
    let cfg = ServerConfig {
        ports: vec![0; groups],
        policy: Policy {
            member_pps: 0,
            member_bytes_per_s: 0,
            ..Policy::default()
        },
        threads: 2,
        checkpoint: Some(ck),
        ..ServerConfig::new(
            [127, 0, 0, 1].into(),
            Secret::new(&SECRET).unwrap(),
            BackendKind::Sendmmsg,
        )
    };
    Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("server starts")
}

struct Client {
    sock: UdpSocket,
    server: SocketAddr,
    session: Session,
    ack: JoinAck,
    keys: SessionKeys,
    player: u32,
    group: u16,
}

impl Client {
    fn join(group: u16, player: u32) -> Client {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        // Room for a whole burst of the test's DATA, read afterwards.
        oskit::sockopt::set_buffers(&sock, 8 << 20, 1 << 20).unwrap();
        let server = SocketAddr::from(([127, 0, 0, 1], group));
        let now = (reflector_proto::unix_now_ms() / 1000) + 60;
        let token: [u8; TOKEN_LEN] = TokenClaims {
            player,
            reflector: 0,
            group,
            expires_unix_s: now,
        }
        .sign(&Secret::new(&SECRET).unwrap());
        let keys = SessionKeys::derive(&Secret::new(&SECRET).unwrap(), &token);
        let req = JoinRequest {
            reflector: server,
            group,
            player,
            token,
            keys,
            first_seq: 1,
        };
        let cfg = ClientConfig {
            retry: Duration::from_millis(250),
            give_up: Some(T),
        };
        let (session, ack) = blocking::join(&sock, req, cfg).expect("admitted");
        Client {
            sock,
            server,
            session,
            ack,
            keys,
            player,
            group,
        }
    }

    fn channel(&self) -> SocketAddr {
        SocketAddr::new(self.server.ip(), self.ack.checkpoint_port)
    }

    fn me(&self) -> Member<'_> {
        Member {
            group: self.group,
            player: self.player,
            membership: self.session.membership().unwrap(),
            keys: &self.keys,
        }
    }

    /// Waits for a CHECKPOINT_REQUEST (answering PROBEs); its nonce.
    fn wait_request(&mut self, within: Duration) -> Option<u64> {
        let until = Instant::now() + within;
        let mut buf = vec![0u8; 70_000];
        while Instant::now() < until {
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(p) = Packet::parse(&buf[..n]) else { continue };
            match self.session.handle(Instant::now(), from, &p) {
                Some(Event::CheckpointRequested { nonce }) => return Some(nonce),
                _ => {
                    if let Some(t) = self.session.poll_transmit() {
                        self.sock.send_to(t.datagram.as_bytes(), self.server).unwrap();
                    }
                }
            }
        }
        None
    }

    fn send_data(&mut self, n: u32) {
        let mut b = vec![0u8; DATA_PAYLOAD + 8];
        b[DATA_PAYLOAD..DATA_PAYLOAD + 4].copy_from_slice(&n.to_be_bytes());
        let len = self.session.emit_data(8, &mut b).unwrap().unwrap();
        self.sock.send_to(&b[..len], self.server).unwrap();
    }

    /// DATA numbers received until `want` or 3 s without any.
    fn receive_data(&mut self, want: usize) -> Vec<u32> {
        let mut got = vec![];
        let mut buf = vec![0u8; 70_000];
        let mut last = Instant::now();
        while got.len() < want && last.elapsed() < Duration::from_secs(3) {
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(p) = Packet::parse(&buf[..n]) else { continue };
            if p.kind() == Kind::Data {
                got.push(u32::from_be_bytes(p.payload()[..4].try_into().unwrap()));
                last = Instant::now();
            } else {
                self.session.handle(Instant::now(), from, &p);
                if let Some(t) = self.session.poll_transmit() {
                    self.sock.send_to(t.datagram.as_bytes(), self.server).unwrap();
                }
            }
        }
        got
    }
}

/// The refusal code of a failed exchange, authenticated (a REFUSED under
/// our key) or not (an all-zero MAC: refused before the request MAC
/// verified), and which.
fn refusal(r: Result<impl std::fmt::Debug, ChannelError>) -> (Refusal, bool) {
    match r {
        Err(ChannelError::Refused { code, .. }) => (code, true),
        Err(ChannelError::Unauthenticated {
            refusal: Some(code), ..
        }) => (code, false),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// An authenticated refusal's code.
fn refused(r: Result<impl std::fmt::Debug, ChannelError>) -> Refusal {
    match refusal(r) {
        (code, true) => code,
        (code, false) => panic!("{code:?} was not authenticated"),
    }
}

/// An unauthenticated refusal's code.
fn refused_unauth(r: Result<impl std::fmt::Debug, ChannelError>) -> Refusal {
    match refusal(r) {
        (code, false) => code,
        (code, true) => panic!("{code:?} was authenticated"),
    }
}

fn state(len: usize, seed: u8) -> bytes::Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

/// Connects and reads the HELLO.
fn hello(addr: SocketAddr) -> (TcpStream, Hello) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut h = [0u8; HELLO_LEN];
    s.read_exact(&mut h).unwrap();
    (s, Hello::decode(&h).unwrap())
}

fn read_reply(s: &mut TcpStream) -> Reply {
    let mut b = [0u8; REPLY_LEN];
    s.read_exact(&mut b).unwrap();
    Reply::decode(&b).unwrap()
}

/// Sends raw bytes as a request (built from the HELLO) and decodes the
/// reply; the stream is returned to look at what follows.
fn raw_exchange(addr: SocketAddr, request: impl FnOnce(&Hello) -> Vec<u8>) -> (Reply, TcpStream) {
    let (mut s, h) = hello(addr);
    s.write_all(&request(&h)).unwrap();
    (read_reply(&mut s), s)
}

/// Whether the reflector closed the stream (EOF or reset within `T`).
/// The server closed `s` (end of stream or a reset), rather than the read
/// timing out or data arriving.
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
        ),
        Ok(_) => false,
    }
}

#[test]
fn an_8_mib_checkpoint_reaches_a_joiner_intact_while_game_traffic_flows_and_bad_requests_are_refused() {
    let server = start(
        2,
        CheckpointConfig {
            // One request (at the first sweep), none to race with the test.
            every_ms: 600_000,
            max_bytes: 9 << 20,
            fetch_every_ms: 1500,
            ..CheckpointConfig::default()
        },
    );
    let (g1, g2) = (server.ports()[0], server.ports()[1]);
    let mut a = Client::join(g1, 1);
    assert_ne!(a.ack.checkpoint_port, 0, "JOIN_ACK announces the channel");
    assert_eq!(Some(a.ack.checkpoint_port), server.checkpoint_port());
    // Nothing stored yet: a fetch says so.
    assert_eq!(channel::fetch(a.channel(), a.me(), 1 << 30, T).unwrap(), None);

    // The only member is asked; it uploads 8 MiB.
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a CHECKPOINT_REQUEST");
    let big = state(8 << 20, 1);
    // Replayed nonce from another member, or a wrong nonce: refused.
    let mut b = Client::join(g1, 2);
    assert_eq!(
        refused(channel::upload(b.channel(), b.me(), nonce, 7, big.clone(), T)),
        Refusal::NotRequested
    );
    assert_eq!(
        refused(channel::upload(a.channel(), a.me(), nonce ^ 1, 7, big.clone(), T)),
        Refusal::NotRequested
    );
    // Too large: refused from the REQUEST, the body never sent (the nonce
    // stays pending).
    let (reply, mut s) = raw_exchange(a.channel(), |h| {
        Request::upload(&a.me(), h.challenge, nonce, 10 << 20, 7)
            .encode()
            .to_vec()
    });
    assert_eq!(reply.answer, Answer::Refused(Refusal::TooLarge));
    assert!(!reply.is_unauthenticated());
    assert!(closed(&mut s));
    let seq = channel::upload(a.channel(), a.me(), nonce, 7, big.clone(), T).expect("upload stored");
    assert_eq!(seq, 1);
    // The same nonce again: single use.
    assert_eq!(
        refused(channel::upload(a.channel(), a.me(), nonce, 7, big.clone(), T)),
        Refusal::NotRequested
    );

    // Game traffic from a to b while two joiners fetch the checkpoint.
    let c = Client::join(g1, 3);
    let fetcher = {
        let addr = c.channel();
        let (group, membership, keys) = (c.group, c.session.membership().unwrap(), c.keys);
        std::thread::spawn(move || {
            let who = Member {
                group,
                player: 3,
                membership,
                keys: &keys,
            };
            let t0 = Instant::now();
            let f = channel::fetch(addr, who, 1 << 30, T);
            (f, t0.elapsed())
        })
    };
    const N: u32 = 2000;
    for n in 0..N {
        a.send_data(n);
        if n % 100 == 99 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let got = b.receive_data(N as usize);
    assert_eq!(got, (0..N).collect::<Vec<_>>(), "every DATA arrives, in order");
    let (f, took) = fetcher.join().unwrap();
    let f = f.expect("fetched").expect("a checkpoint");
    assert_eq!((f.seq, f.tick, f.from_player), (1, 7, 1));
    assert!(f.state == big, "the state arrives intact");
    assert!(took < T);
    // A fetch flood from one member is refused; after the interval it is served again.
    let again = channel::fetch(c.channel(), c.me(), 1 << 30, T);
    assert_eq!(refused(again), Refusal::Busy);
    std::thread::sleep(Duration::from_millis(1600));
    assert!(channel::fetch(c.channel(), c.me(), 1 << 30, T).unwrap().is_some());

    // Not a member: unknown membership, or a member of another group.
    let stranger_keys = SessionKeys::from_session([9; 32]);
    let stranger = Member {
        group: g1,
        player: 99,
        membership: 12345,
        keys: &stranger_keys,
    };
    assert_eq!(
        refused_unauth(channel::fetch(a.channel(), stranger, 1 << 30, T)),
        Refusal::NotMember
    );
    let d = Client::join(g2, 4);
    let mut cross = d.me();
    cross.group = g1;
    assert_eq!(
        refused_unauth(channel::fetch(d.channel(), cross, 1 << 30, T)),
        Refusal::NotMember
    );
    // A member's key, but a MAC made with another key.
    let mut forged = b.me();
    forged.keys = &stranger_keys;
    assert_eq!(
        refused_unauth(channel::fetch(b.channel(), forged, 1 << 30, T)),
        Refusal::BadMac
    );
    // Garbage: refused unauthenticated once 64 bytes are in.
    let (reply, _) = raw_exchange(a.channel(), |_| {
        let mut g = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
        g.resize(64, b' ');
        g
    });
    assert_eq!(reply.answer, Answer::Refused(Refusal::Malformed));
    assert!(reply.is_unauthenticated());

    // Game traffic still flows after all that.
    for n in N..N + 100 {
        a.send_data(n);
    }
    assert_eq!(b.receive_data(100), (N..N + 100).collect::<Vec<_>>());

    server.stop();
    let reg = server.join().unwrap();
    let t = reg.total();
    assert_eq!(t.checkpoints_stored, 1);
    assert_eq!(t.checkpoint_bytes_stored, 8 << 20);
    assert_eq!(t.checkpoints_served, 2);
    assert_eq!(t.checkpoint_bytes_served, 16 << 20);
    assert_eq!(t.checkpoint_empty_fetches, 1);
    // NotRequested x3, TooLarge, Busy, NotMember x2, BadMac.
    assert_eq!(t.checkpoint_refused, 8);
    assert!(t.checkpoint_requests >= 1);
    let ch = &reg.channel;
    assert_eq!(ch.malformed.load(Relaxed), 1);
    assert_eq!(t.forwarded, u64::from(N) + 100);
}

#[test]
fn a_peer_that_stops_reading_is_cut_off_and_others_are_still_served() {
    let server = start(
        1,
        CheckpointConfig {
            every_ms: 600_000,
            max_bytes: 64 << 20,
            // Room for a 16 MiB upload's MAC and digest in a debug build.
            timeout: Duration::from_secs(6),
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let mut a = Client::join(g, 1);
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a request");
    // Larger than what the socket buffers can hold on loopback.
    let big = state(16 << 20, 3);
    channel::upload(a.channel(), a.me(), nonce, 1, big.clone(), Duration::from_secs(20)).expect("stored");
    // b asks and never reads.
    let b = Client::join(g, 2);
    let (mut s, h) = hello(b.channel());
    s.write_all(&Request::fetch(&b.me(), h.challenge, Op::Fetch).encode())
        .unwrap();
    // Meanwhile another member is served in full.
    let c = Client::join(g, 3);
    let f = channel::fetch(c.channel(), c.me(), 1 << 30, Duration::from_secs(20))
        .unwrap()
        .unwrap();
    assert!(f.state == big);
    // The stalled exchange ends at its deadline.
    let until = Instant::now() + Duration::from_secs(12);
    while server.registry().total().checkpoint_timeouts == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.registry().total().checkpoint_timeouts, 1);
    // The connection was closed on us: reading ends before the whole state.
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0usize;
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n,
        }
    }
    assert!(total < big.len(), "the state was cut off ({total} bytes)");
    let t0 = Instant::now();
    server.stop();
    server.join().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "shutdown waits at most a deadline"
    );
}

#[test]
fn fetch_other_returns_the_upload_before_the_latest_from_another_member() {
    let server = start(
        1,
        CheckpointConfig {
            every_ms: 300,
            fetch_every_ms: 0,
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let mut members = [Client::join(g, 1), Client::join(g, 2)];
    // Each member asked answers once with its own state and tick; a member
    // asked again lets the request pass, so the next goes to the other
    // (bounded: 40 rounds of at most 2 x 250 ms).
    let mut uploaded: Vec<(u32, u64, bytes::Bytes)> = Vec::new();
    for round in 0..40u64 {
        for m in members.iter_mut() {
            let Some(nonce) = m.wait_request(Duration::from_millis(250)) else {
                continue;
            };
            if !uploaded.iter().any(|u| u.0 == m.player) {
                let st = state(1000 + round as usize, m.player as u8);
                let tick = 100 * round + u64::from(m.player);
                if channel::upload(m.channel(), m.me(), nonce, tick, st.clone(), T).is_ok() {
                    uploaded.push((m.player, tick, st));
                }
            }
        }
        let players: std::collections::HashSet<u32> = uploaded.iter().map(|u| u.0).collect();
        if players.len() == 2 {
            break;
        }
    }
    let (latest_player, latest_tick, latest) = uploaded.last().cloned().expect("uploads");
    // The one before: the newest upload from the other member.
    let (other_player, other_tick, other) = uploaded
        .iter()
        .rev()
        .find(|u| u.0 != latest_player)
        .cloned()
        .expect("uploads from both members");
    let me = members[0].me();
    let f = channel::fetch(members[0].channel(), me, 1 << 20, T).unwrap().unwrap();
    assert_eq!((f.from_player, f.tick), (latest_player, latest_tick));
    assert!(f.state == latest);
    let o = channel::fetch_other(members[0].channel(), me, 1 << 20, T)
        .unwrap()
        .unwrap();
    assert_eq!((o.from_player, o.tick), (other_player, other_tick));
    assert!(o.state == other);
    assert!(o.seq < f.seq);
    server.stop();
    server.join().unwrap();
}

#[test]
fn a_non_members_oversized_upload_is_refused_before_its_body_is_read() {
    let server = start(
        1,
        CheckpointConfig {
            every_ms: 600_000,
            max_bytes: 1 << 20,
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let a = Client::join(g, 1);
    let stranger_keys = SessionKeys::from_session([9; 32]);
    let stranger = Member {
        group: g,
        player: 99,
        membership: 12345,
        keys: &stranger_keys,
    };
    // A REQUEST claiming 1 GiB, and nothing after it: the refusal comes
    // back for the 64 bytes alone, and the connection is closed.
    let t0 = Instant::now();
    let (reply, mut s) = raw_exchange(a.channel(), |h| {
        Request::upload(&stranger, h.challenge, 1, 1 << 30, 0).encode().to_vec()
    });
    assert_eq!(reply.answer, Answer::Refused(Refusal::NotMember));
    assert!(reply.is_unauthenticated());
    assert!(closed(&mut s));
    assert!(t0.elapsed() < Duration::from_secs(1));
    // The same from a member's player with a bad MAC.
    let mut forged = a.me();
    forged.keys = &stranger_keys;
    let (reply, mut s) = raw_exchange(a.channel(), |h| {
        Request::upload(&forged, h.challenge, 1, 1 << 30, 0).encode().to_vec()
    });
    assert_eq!(reply.answer, Answer::Refused(Refusal::BadMac));
    assert!(reply.is_unauthenticated());
    assert!(closed(&mut s));
    server.stop();
    let reg = server.join().unwrap();
    assert_eq!(reg.total().checkpoint_refused, 2);
    assert_eq!(reg.channel.memory_bytes.load(Relaxed), 0);
}

#[test]
fn the_memory_bound_refuses_uploads_as_busy_and_counts_them() {
    let server = start(
        2,
        CheckpointConfig {
            every_ms: 600_000,
            max_bytes: 800 << 10,
            memory: 1 << 20,
            ..CheckpointConfig::default()
        },
    );
    let (g1, g2) = (server.ports()[0], server.ports()[1]);
    let mut a = Client::join(g1, 1);
    let mut b = Client::join(g2, 2);
    let na = a.wait_request(Duration::from_secs(3)).expect("a request in group 1");
    let nb = b.wait_request(Duration::from_secs(3)).expect("a request in group 2");
    channel::upload(a.channel(), a.me(), na, 1, state(600 << 10, 1), T).expect("stored");
    let ch = &server.registry().channel;
    assert_eq!(ch.memory_bytes.load(Relaxed), 600 << 10);
    // 600 KiB held: 600 more would pass 1 MiB.
    assert_eq!(
        refused(channel::upload(b.channel(), b.me(), nb, 1, state(600 << 10, 2), T)),
        Refusal::Busy
    );
    assert_eq!(server.registry().total().checkpoint_memory_refused, 1);
    // A refusal does not use the nonce: 400 KiB fits.
    channel::upload(b.channel(), b.me(), nb, 2, state(400 << 10, 3), T).expect("stored");
    assert_eq!(ch.memory_bytes.load(Relaxed), 1000 << 10);
    let text = server.registry().prometheus(false);
    assert!(
        text.contains(&format!("\nreflector_checkpoint_memory_bytes {}\n", 1000 << 10)),
        "{text}"
    );
    server.stop();
    let reg = server.join().unwrap();
    let t = reg.total();
    assert_eq!(
        (t.checkpoints_stored, t.checkpoint_memory_refused, t.checkpoint_refused),
        (2, 1, 1)
    );
}

/// `/healthz` watches the checkpoint channel's thread as it watches the
/// event loops: when it ends, the liveness says so by name.
#[test]
fn healthz_watches_the_checkpoint_channel() {
    let server = start(2, CheckpointConfig::default());
    let liveness = server.liveness();
    assert_eq!(liveness.watched(), ["checkpoints", "reflector-0", "reflector-1"]);
    assert_eq!(liveness.check(), Ok(()));
    server.stop();
    let until = Instant::now() + Duration::from_secs(5);
    while !liveness.check().is_err_and(|why| why.contains("checkpoints")) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let why = liveness.check().expect_err("the threads ended");
    assert!(why.contains("checkpoints"), "{why}");
    server.join().unwrap();
}

#[test]
fn silent_connections_are_closed_at_the_hello_deadline_evicted_first_at_the_cap_and_busy_only_when_all_authenticated() {
    let server = start(
        1,
        CheckpointConfig {
            every_ms: 600_000,
            max_bytes: 64 << 20,
            max_conns: 3,
            max_conns_per_ip: 3,
            // Long enough that the member below arrives before the silent
            // ones time out on a loaded machine (else nothing is evicted).
            hello_timeout: Duration::from_millis(1_500),
            timeout: Duration::from_secs(4),
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let mut a = Client::join(g, 1);
    // Three silent connections fill the caps.
    let mut silent: Vec<TcpStream> = (0..3).map(|_| hello(a.channel()).0).collect();
    // A member still gets in: the oldest silent one makes room.
    assert_eq!(channel::fetch(a.channel(), a.me(), 1 << 30, T).unwrap(), None);
    let ch = &server.registry().channel;
    assert_eq!(ch.evicted.load(Relaxed), 1);
    // The others are closed at the hello deadline.
    let t0 = Instant::now();
    for s in &mut silent {
        assert!(closed(s));
    }
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    let until = Instant::now() + Duration::from_secs(2);
    while ch.hello_timeouts.load(Relaxed) < 2 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(ch.hello_timeouts.load(Relaxed), 2);
    // Three authenticated fetchers that never read a large state hold
    // every place: only then is a new connection refused as busy.
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a request");
    channel::upload(
        a.channel(),
        a.me(),
        nonce,
        1,
        state(16 << 20, 4),
        Duration::from_secs(20),
    )
    .expect("stored");
    let fetchers: Vec<Client> = (2..5).map(|p| Client::join(g, p)).collect();
    let mut stalled = Vec::new();
    for f in &fetchers {
        let (mut s, h) = hello(f.channel());
        s.write_all(&Request::fetch(&f.me(), h.challenge, Op::Fetch).encode())
            .unwrap();
        // The REPLY and the first bytes arrive: it is being served.
        read_reply(&mut s);
        stalled.push(s);
    }
    assert_eq!(
        refused_unauth(channel::fetch(a.channel(), a.me(), 1 << 30, T)),
        Refusal::Busy
    );
    assert_eq!(ch.busy.load(Relaxed), 1);
    drop(stalled);
    server.stop();
    server.join().unwrap();
}

/// `reflector serve` as a process, for what only a process shows: its
/// memory, and its exit on SIGTERM.
struct Serve {
    child: oskit::child::ChildGuard,
    group: u16,
    channel: SocketAddr,
    summary: std::path::PathBuf,
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Serve {
    fn start(extra: &[&str]) -> Serve {
        let tag = format!("{}-{}", std::process::id(), free_tcp_port());
        let dir = std::env::temp_dir();
        let secret = dir.join(format!("reflector-ck-secret-{tag}"));
        std::fs::write(&secret, hex::encode(SECRET)).unwrap();
        let summary = dir.join(format!("reflector-ck-summary-{tag}.json"));
        let (group, ck) = (free_udp_port(), free_tcp_port());
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args([
                "serve",
                "--bind",
                "127.0.0.1",
                "--threads",
                "1",
                "--backend",
                "sendmmsg",
            ])
            .args(["--ports", &group.to_string(), "--checkpoint-port", &ck.to_string()])
            .args(["--secret-file", secret.to_str().unwrap()])
            .args(["--summary-json", summary.to_str().unwrap()])
            .args(["--checkpoint-every", "10m"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("the reflector binary runs");
        let child = oskit::child::ChildGuard::with_grace(child, Duration::ZERO);
        let channel = SocketAddr::from(([127, 0, 0, 1], ck));
        let until = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(channel).is_err() {
            assert!(Instant::now() < until, "the reflector did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_file(&secret);
        Serve {
            child,
            group,
            channel,
            summary,
        }
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    /// SIGTERM; how long until the process exited, and its summary.
    fn terminate(mut self) -> (Duration, serde_json::Value) {
        let t0 = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = loop {
            if let Some(s) = self.child.child().try_wait().unwrap() {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(15), "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(5));
        };
        let took = t0.elapsed();
        assert!(status.success(), "exit status {status}");
        let text = std::fs::read_to_string(&self.summary).expect("the summary is written");
        let _ = std::fs::remove_file(&self.summary);
        (took, serde_json::from_str(&text).unwrap())
    }
}

/// A TCP connection from `src` (any 127.0.0.0/8 address works on lo).
fn connect_from(src: std::net::Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let std::net::SocketAddr::V4(to) = to else {
        unreachable!("the channel listens on IPv4")
    };
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(src, 0)))?;
    connect(fd.as_raw_fd(), &SockaddrIn::from(to))?;
    Ok(TcpStream::from(fd))
}

/// The reflector's memory must not grow with what unauthenticated peers
/// send. Before channel version 2 a non-member's upload was read whole
/// before any check (8 stalled 15 MiB uploads: +120-149 MiB) and 64 silent
/// connections locked members out for the whole deadline.
const MAX_RSS_GROWTH_KIB: u64 = 8 << 10;

#[test]
fn silent_and_stalled_connections_from_8_addresses_neither_grow_memory_nor_lock_out_a_member() {
    let serve = Serve::start(&["--checkpoint-hello-timeout", "20s", "--checkpoint-fetch-every", "0s"]);
    let mut a = Client::join(serve.group, 1);
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a request");
    let st = state(64 << 10, 5);
    channel::upload(serve.channel, a.me(), nonce, 3, st.clone(), T).expect("stored");
    // One fetch before the baseline: the worker path is warm.
    assert!(
        channel::fetch(serve.channel, a.me(), 1 << 20, T)
            .unwrap()
            .unwrap()
            .state
            == st
    );
    let before = serve.rss_kib();

    let stranger_keys = SessionKeys::from_session([9; 32]);
    let stranger = Member {
        group: serve.group,
        player: 99,
        membership: 1,
        keys: &stranger_keys,
    };
    let body = vec![0x5a_u8; 15 << 20];
    let mut held = Vec::new();
    let (mut silent, mut stalled) = (0, 0);
    for host in 2..10u8 {
        let src = std::net::Ipv4Addr::new(127, 0, 0, host);
        for i in 0..16 {
            let Ok(mut s) = connect_from(src, serve.channel) else {
                continue;
            };
            if i % 2 == 0 {
                silent += 1;
            } else {
                stalled += 1;
                let mut h = [0u8; HELLO_LEN];
                s.set_read_timeout(Some(T)).unwrap();
                let _ = s.read_exact(&mut h);
                let challenge = Hello::decode(&h).map_or(0, |h| h.challenge);
                let req = Request::upload(&stranger, challenge, 1, 15 << 20, 0).encode();
                s.set_nonblocking(true).unwrap();
                if i % 4 == 1 {
                    // Part of a header, then nothing.
                    let _ = s.write(&req[..40]);
                } else {
                    // A header that fails, then as much of a 15 MiB body
                    // as the kernel takes.
                    let _ = s.write(&req);
                    let _ = s.write(&body);
                }
            }
            held.push(s);
        }
    }
    assert_eq!((silent, stalled), (64, 64));
    // A member's fetch is served meanwhile.
    let t0 = Instant::now();
    let f = channel::fetch(serve.channel, a.me(), 1 << 20, T)
        .expect("served")
        .expect("a checkpoint");
    let took = t0.elapsed();
    assert!(f.state == st);
    std::thread::sleep(Duration::from_millis(300));
    let after = serve.rss_kib();
    let growth = after.saturating_sub(before);
    println!(
        "reflector RSS {before} KiB -> {after} KiB (+{growth} KiB, bound {MAX_RSS_GROWTH_KIB} KiB) under 64 silent and 64 stalled connections from 8 addresses; member fetch {took:?}"
    );
    assert!(growth <= MAX_RSS_GROWTH_KIB, "RSS grew by {growth} KiB");
    drop(held);
    let (_, summary) = serve.terminate();
    let ch = &summary["checkpoint_channel"];
    // 12 connections held per address (the failing headers are closed at
    // once) against a cap of 8: at least 4 evicted per address.
    assert!(ch["evicted"].as_u64().unwrap() >= 32, "{ch}");
    // Everything held was freed with the board.
    assert_eq!(ch["memory_bytes"].as_u64(), Some(0));
    // Every failing header refused NotMember (counted in the group).
    assert!(
        summary["total"]["checkpoint_refused"].as_u64().unwrap() >= 1,
        "{summary}"
    );
}

#[test]
fn sigterm_ends_serve_within_a_second_with_idle_channel_peers_and_writes_the_summary() {
    let serve = Serve::start(&[]);
    let mut a = Client::join(serve.group, 1);
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a request");
    // An authenticated upload that stops after CONTINUE (a worker blocked
    // reading its body), and a connection that never sends its request.
    let (mut up, h) = hello(serve.channel);
    up.write_all(&Request::upload(&a.me(), h.challenge, nonce, 1 << 20, 1).encode())
        .unwrap();
    assert_eq!(read_reply(&mut up).answer, Answer::Continue);
    up.write_all(&[0u8; 1000]).unwrap();
    let (idle, _) = hello(serve.channel);
    std::thread::sleep(Duration::from_millis(200));
    let (took, summary) = serve.terminate();
    println!("serve: SIGTERM to exit {took:?} with an idle upload and a silent connection on the checkpoint channel");
    assert!(took < Duration::from_millis(1500), "took {took:?}");
    assert_eq!(summary["total"]["joins"].as_u64(), Some(1), "{summary}");
    drop((up, idle));
}

/// Sealed checkpoints (docs/protocol.md, "Sealed checkpoints") need nothing
/// of the reflector: two members upload envelopes of the same state and
/// tick through the unchanged channel, a joiner opens both with the
/// REPLYs' fields and finds them verified by two members; then a member's
/// signed upload of another group's checkpoint, and of a garbage state, are
/// stored by the reflector (opaque bytes) and refused by the joiner.
#[test]
fn sealed_checkpoints_pass_the_reflector_unchanged_and_a_joiner_checks_them() {
    use reflector_proto::sealed::checkpoint::{
        compare, field, open_checkpoint, seal_checkpoint, Agreement, CheckpointRefusal, ControlSigner, FetchedReply,
        JoinerView, PlayerKey, UploadInfo, SIGNATURE_LEN,
    };
    use reflector_proto::sealed::{CellId, MasterSecret, WorldId};

    let server = start(
        1,
        CheckpointConfig {
            every_ms: 300,
            fetch_every_ms: 0,
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let master = MasterSecret::new(&[0x6d; 32]).unwrap();
    let world = WorldId::from_name("checkpoint test world");
    let control = ControlSigner::derive(&master, world);
    let ours = master.epoch_key(CellId::new(world, 0, 0).unwrap(), 5);
    let theirs = master.epoch_key(CellId::new(world, 1, 0).unwrap(), 5);
    let expires = reflector_proto::unix_now_ms() / 1000 + 60;
    let mut members = [Client::join(g, 1), Client::join(g, 2)];
    let signers: Vec<PlayerKey> = [1u8, 2].iter().map(|&p| PlayerKey::from_seed(&[p; 32])).collect();
    let certs: Vec<_> = members
        .iter()
        .zip(&signers)
        .map(|(m, k)| control.certify(m.player, &k.public_key(), expires))
        .collect();
    const TICK: u64 = 4242;
    let game_state = state(3000, 9);
    let mut seq = 1000;
    let mut envelope = |who: usize, key: &reflector_proto::sealed::EpochKey| {
        seq += 1;
        let info = UploadInfo {
            tick: TICK,
            instance: 0x77 + who as u64,
            sequence: seq,
        };
        seal_checkpoint(&signers[who], &certs[who], key, info, &game_state).unwrap()
    };
    let (e1, e2) = (envelope(0, &ours), envelope(1, &ours));
    let mut other_group = envelope(1, &theirs);
    let mut garbage = envelope(1, &ours);
    let n = garbage.len();
    garbage[field::STATE..n - SIGNATURE_LEN].fill(0x5a);
    signers[1].sign_envelope(&mut garbage);
    // Each member asked uploads its envelope once (bounded: 40 rounds of at
    // most 2 x 250 ms); then the bad ones, one at a time.
    let mut queue: Vec<(usize, Vec<u8>)> = vec![(0, e1), (1, e2)];
    let mut uploaded = Vec::new();
    let mut upload_next = |members: &mut [Client; 2], queue: &mut Vec<(usize, Vec<u8>)>| {
        for _ in 0..40 {
            for (i, m) in members.iter_mut().enumerate() {
                let Some(nonce) = m.wait_request(Duration::from_millis(250)) else {
                    continue;
                };
                if let Some(at) = queue.iter().position(|(who, _)| *who == i) {
                    let (_, env) = queue.remove(at);
                    if channel::upload(m.channel(), m.me(), nonce, TICK, env.clone().into(), T).is_ok() {
                        uploaded.push(i);
                    } else {
                        queue.push((i, env));
                    }
                }
            }
            if queue.is_empty() {
                return;
            }
        }
        panic!("uploads not requested in time: {} left", queue.len());
    };
    upload_next(&mut members, &mut queue);
    let public = control.public_key();
    let keys = [ours.clone()];
    let view = JoinerView {
        control_public: &public,
        group_keys: &keys,
    };
    let open = |f: &channel::Fetched| {
        let reply = FetchedReply {
            tick: f.tick,
            from_player: f.from_player,
            age_ms: f.age_ms,
            received_unix_ms: reflector_proto::unix_now_ms(),
        };
        let mut buf = f.state.to_vec();
        open_checkpoint(&mut buf, &reply, &view).map(|o| (buf[o.state.clone()].to_vec(), o))
    };
    let me = members[0].me();
    let f = channel::fetch(members[0].channel(), me, 1 << 20, T).unwrap().unwrap();
    let o = channel::fetch_other(members[0].channel(), me, 1 << 20, T)
        .unwrap()
        .unwrap();
    let (latest_state, latest) = open(&f).expect("the latest opens");
    let (other_state, other) = open(&o).expect("the one before opens");
    assert!(latest_state == game_state && other_state == game_state);
    match compare(&latest, Some(&other)) {
        Agreement::VerifiedByTwo { tick, mut players } => {
            players.sort_unstable();
            assert_eq!((tick, players), (TICK, [1, 2]));
        }
        a => panic!("two members' equal snapshots: {a:?}"),
    }
    // The reflector stores what a member signs, whatever it is; the joiner
    // refuses it.
    for (env, want) in [
        (std::mem::take(&mut other_group), CheckpointRefusal::WrongCell),
        (std::mem::take(&mut garbage), CheckpointRefusal::Bad),
    ] {
        let mut q = vec![(1usize, env)];
        upload_next(&mut members, &mut q);
        let me = members[0].me();
        let f = channel::fetch(members[0].channel(), me, 1 << 20, T).unwrap().unwrap();
        assert_eq!(f.from_player, 2);
        assert_eq!(open(&f).map(|_| ()), Err(want));
    }
    assert_eq!(uploaded.len(), 4);
    server.stop();
    server.join().unwrap();
}
