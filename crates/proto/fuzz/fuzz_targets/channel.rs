//! The checkpoint channel's decoders (version 2) on arbitrary bytes: HELLO,
//! REQUEST and REPLY decoding, and the MAC checks of whatever decodes. None
//! may panic, and whatever decodes encodes back to the same bytes.
//! Run: `cd crates/proto/fuzz && cargo +nightly fuzz run channel`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use reflector_proto::checkpoint::{Hello, Reply, Request, HELLO_LEN, REPLY_LEN, REQUEST_LEN};
use reflector_proto::protocol::SessionKeys;

fuzz_target!(|data: &[u8]| {
    let keys = SessionKeys::from_session([0x5a; 32]);
    if let Some(b) = data.get(..HELLO_LEN).and_then(|b| <&[u8; HELLO_LEN]>::try_from(b).ok()) {
        if let Ok(h) = Hello::decode(b) {
            assert_eq!(&h.encode(), b);
        }
    }
    if let Some(b) = data
        .get(..REQUEST_LEN)
        .and_then(|b| <&[u8; REQUEST_LEN]>::try_from(b).ok())
    {
        if let Ok(r) = Request::decode(b) {
            assert_eq!(&r.encode(), b);
            let _ = r.verify(&keys, 1);
        }
    }
    if let Some(b) = data.get(..REPLY_LEN).and_then(|b| <&[u8; REPLY_LEN]>::try_from(b).ok()) {
        if let Ok(r) = Reply::decode(b) {
            assert_eq!(&r.encode(), b);
            let _ = (r.verify(&keys, 1, &[0; 16]), r.is_unauthenticated());
        }
    }
});
