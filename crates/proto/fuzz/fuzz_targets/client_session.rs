//! Whatever a reflector (or anyone spoofing it) sends, a client's session
//! must not panic, and must only ever send its own kinds to its reflector.
//! The first byte picks the phase to start in and the clock steps; the rest
//! is cut into datagrams at the lengths the following bytes give.
//! Run: `cd crates/proto/fuzz && cargo +nightly fuzz run client_session`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::client::{Config, JoinRequest, Session};
use reflector_proto::protocol::{Header, JoinAck, Kind, Packet, SessionKeys, SmallDatagram};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let Some((&head, mut rest)) = data.split_first() else {
        return;
    };
    let reflector = SocketAddr::from(([10, 0, 0, 1], 4000));
    let req = JoinRequest {
        reflector,
        group: 4000,
        player: 7,
        token: [1; 32],
        keys: SessionKeys::from_session([3; 32]),
        first_seq: 1,
    };
    let h = |kind| Header {
        kind,
        group: 4000,
        sender: 7,
        membership: 5,
        seq: 1,
    };
    let cfg = Config {
        retry: Duration::from_millis(100),
        give_up: Some(Duration::from_secs(2)),
    };
    let mut now = Instant::now();
    let mut s = Session::new(req, cfg, now);
    if head & 1 == 1 {
        let c = SmallDatagram::challenge(&h(Kind::JoinChallenge), &[2; 16], &req.keys);
        s.handle(now, reflector, &Packet::parse(c.as_bytes()).unwrap());
    }
    if head & 2 == 2 {
        let a = SmallDatagram::join_ack(
            &h(Kind::JoinAck),
            JoinAck {
                members: 1,
                keepalive_ms: 100,
                flags: 1,
                checkpoint_port: 0,
            },
            &req.keys,
        );
        s.handle(now, reflector, &Packet::parse(a.as_bytes()).unwrap());
    }
    while let Some((&len, tail)) = rest.split_first() {
        let n = usize::from(len).min(tail.len());
        let (d, next) = tail.split_at(n);
        rest = next;
        if let Ok(p) = Packet::parse(d) {
            let _ = s.handle(now, reflector, &p);
        }
        now += Duration::from_millis(u64::from(head >> 2) * 10);
        let _ = s.handle_timeout(now);
        while let Some(t) = s.poll_transmit() {
            assert_eq!(t.to, reflector);
            let p = Packet::parse(t.datagram.as_bytes()).expect("the session builds valid datagrams");
            assert!(matches!(
                p.kind(),
                Kind::Join | Kind::Leave | Kind::Keepalive | Kind::ProbeReply
            ));
            assert!(req.keys.verify(&p), "everything the session sends is MAC'd");
        }
    }
});
