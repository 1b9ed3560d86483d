//! Everything the network can send reaches `Packet::parse` and then the
//! membership logic; neither may panic, and no reply may exceed the request.
//! Run: `cd crates/server/fuzz && cargo +nightly fuzz run parse_datagram`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::auth::Secret;
use reflector_proto::protocol::Packet;
use reflector_server::membership::{Group, Keys, Policy};
use std::net::SocketAddr;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::parse(data) {
        let _ = (p.group(), p.sender(), p.seq(), p.payload().len());
        let _ = (
            p.join_token(),
            p.join_cookie(),
            p.challenge_cookie(),
            p.join_ack(),
            p.error_code(),
        );
    }
    let keys = Keys {
        token_secret: Secret::new(&[1; 32]).unwrap().into(),
        reflector_id: 0,
        cookie_key: Secret::new(&[2; 32]).unwrap(),
    };
    let mut g = Group::new(u16::from_be_bytes([data.first().copied().unwrap_or(0), 0]));
    let src = SocketAddr::from(([10, 0, 0, 1], 5000));
    let now = reflector_server::membership::Now {
        unix_ms: 1_700_000_000_000,
        mono_ms: 1,
        mono_us: 1_000,
    };
    let out = g.handle(&keys, &Policy::default(), now, src, data);
    if let Some(r) = out.reply {
        assert!(r.len() <= data.len());
    }
});
