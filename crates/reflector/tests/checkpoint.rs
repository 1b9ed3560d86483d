//! Checkpoints on loopback: the reflector asks a member for the game state,
//! stores the upload and serves it whole to a joiner while game traffic
//! flows with no loss; every kind of bad request is refused with its reason
//! and counted; a peer that stops reading is cut off at the deadline.

use reflector::backend::BackendKind;
use reflector::checkpoint::CheckpointConfig;
use reflector::membership::{Keys, Policy};
use reflector::server::{Server, ServerConfig};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::checkpoint::v1::{self as channel, ChannelError, Member, Op, Refusal, Reply, Request};
use reflector_proto::client::{Config as ClientConfig, Event, JoinRequest, Session};
use reflector_proto::protocol::{JoinAck, Kind, Packet, SessionKeys, DATA_PAYLOAD, TOKEN_LEN};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x3c; 32];
const T: Duration = Duration::from_secs(5);

fn start(groups: usize, ck: CheckpointConfig) -> Server {
    let cfg = ServerConfig {
        bind: "127.0.0.1".parse().unwrap(),
        ports: vec![0; groups],
        keys: Keys {
            token_secret: Secret::new(&SECRET).unwrap().into(),
            reflector_id: 0,
            cookie_key: Secret::random(),
        },
        policy: Policy {
            member_pps: 0,
            member_bytes_per_s: 0,
            ..Policy::default()
        },
        backend: BackendKind::Sendmmsg,
        fallback: false,
        threads: 2,
        rcvbuf: 4 << 20,
        sndbuf: 4 << 20,
        group_tags: Vec::new(),
        group_instance: Vec::new(),
        checkpoint: Some(ck),
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
        let now = (reflector::unix_now_ms() / 1000) + 60;
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
        let len = self.session.seal_data(8, &mut b).unwrap().unwrap();
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

fn refused(r: Result<impl std::fmt::Debug, ChannelError>) -> Refusal {
    match r {
        Err(ChannelError::Refused { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn state(len: usize, seed: u8) -> bytes::Bytes {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect::<Vec<_>>()
        .into()
}

/// Sends raw bytes as a request and decodes the reply.
fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let _hello = wire::read_message(&mut s, wire::Limits::default()).unwrap();
    s.write_all(bytes).unwrap();
    let msg = wire::read_message(&mut s, wire::Limits::default()).unwrap();
    wire::from_bytes::<Reply>(&msg).unwrap()
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
        refused(channel::upload(b.channel(), b.me(), nonce, big.clone(), T)),
        Refusal::NotRequested
    );
    assert_eq!(
        refused(channel::upload(a.channel(), a.me(), nonce ^ 1, big.clone(), T)),
        Refusal::NotRequested
    );
    let seq = channel::upload(a.channel(), a.me(), nonce, big.clone(), T).expect("upload stored");
    assert_eq!(seq, 1);
    // The same nonce again: single use.
    assert_eq!(
        refused(channel::upload(a.channel(), a.me(), nonce, big.clone(), T)),
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
    assert_eq!((f.seq, f.from_player), (1, 1));
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
        refused(channel::fetch(a.channel(), stranger, 1 << 30, T)),
        Refusal::NotMember
    );
    let d = Client::join(g2, 4);
    let mut cross = d.me();
    cross.group = g1;
    assert_eq!(
        refused(channel::fetch(d.channel(), cross, 1 << 30, T)),
        Refusal::NotMember
    );
    // A member's key, but a MAC made with another key.
    let mut forged = b.me();
    forged.keys = &stranger_keys;
    assert_eq!(
        refused(channel::fetch(b.channel(), forged, 1 << 30, T)),
        Refusal::BadMac
    );
    // Too large: refused from the header, before the body is read.
    let huge = Request {
        group: g1,
        player: 1,
        membership: a.session.membership().unwrap(),
        op: Op::Upload {
            nonce: 1,
            state: wire::Buffer(state(10 << 20, 2)),
        },
        mac: [0; 16],
    };
    let head = wire::to_archive(&huge).unwrap().head();
    match raw_exchange(a.channel(), &head) {
        Reply::Refused { code, .. } => assert_eq!(code, Refusal::TooLarge),
        other => panic!("{other:?}"),
    }
    // Garbage.
    match raw_exchange(a.channel(), b"GET / HTTP/1.1\r\n\r\n        ") {
        Reply::Refused { code, .. } => assert_eq!(code, Refusal::Malformed),
        other => panic!("{other:?}"),
    }

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
    // NotRequested x3, Busy, NotMember x2, BadMac.
    assert_eq!(t.checkpoint_refused, 7);
    assert!(t.checkpoint_requests >= 1);
    let ch = &reg.channel;
    assert_eq!(ch.malformed.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(t.forwarded, u64::from(N) + 100);
}

#[test]
fn a_peer_that_stops_reading_is_cut_off_and_others_are_still_served() {
    let server = start(
        1,
        CheckpointConfig {
            every_ms: 600_000,
            max_bytes: 64 << 20,
            timeout: Duration::from_secs(2),
            ..CheckpointConfig::default()
        },
    );
    let g = server.ports()[0];
    let mut a = Client::join(g, 1);
    let nonce = a.wait_request(Duration::from_secs(3)).expect("a request");
    // Larger than what the socket buffers can hold on loopback.
    let big = state(32 << 20, 3);
    channel::upload(a.channel(), a.me(), nonce, big.clone(), Duration::from_secs(20)).expect("stored");
    // b asks and never reads.
    let b = Client::join(g, 2);
    let mut s = TcpStream::connect(b.channel()).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let hello = wire::read_message(&mut s, wire::Limits::default()).unwrap();
    let hello: channel::Hello = wire::from_bytes(&hello).unwrap();
    let m = b.session.membership().unwrap();
    let req = Request {
        group: g,
        player: 2,
        membership: m,
        op: Op::Fetch,
        mac: b.keys.fetch_mac(hello.challenge, g, 2, m),
    };
    wire::to_archive(&req).unwrap().write_to(&mut s).unwrap();
    // Meanwhile another member is served in full.
    let c = Client::join(g, 3);
    let f = channel::fetch(c.channel(), c.me(), 1 << 30, Duration::from_secs(20))
        .unwrap()
        .unwrap();
    assert!(f.state == big);
    // The stalled exchange ends at its deadline.
    let until = Instant::now() + Duration::from_secs(8);
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
