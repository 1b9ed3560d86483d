//! Every parser and check of the datagram format on arbitrary bytes: parse, every
//! accessor, MAC and tag verification, and the replay window fed the
//! sequence numbers the input carries. None may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::protocol::{Packet, ReplayWindow, SessionKeys};

fuzz_target!(|data: &[u8]| {
    let keys = SessionKeys::from_session([0x5a; 32]);
    if let Ok(p) = Packet::parse(data) {
        let _ = (
            p.join_token(),
            p.join_cookie(),
            p.challenge_cookie(),
            p.nonce(),
            p.join_ack(),
            p.error_code(),
            p.tag(),
            p.signed(),
            p.payload(),
            p.moved(),
            p.is_renewal(),
        );
        let _ = (keys.verify(&p), keys.verify_tag(&p));
    }
    let mut w = ReplayWindow::default();
    for c in data.chunks(8) {
        let mut a = [0u8; 8];
        a[..c.len()].copy_from_slice(c);
        let s = u64::from_le_bytes(a);
        let fresh = w.fresh(s);
        assert_eq!(w.accept(s), fresh);
        assert!(!w.fresh(s));
    }
});
