//! Any bytes, decoded as a message of a type with every kind of field:
//! an error is fine, a panic or a runaway allocation is a bug.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[expect(dead_code, reason = "the fields are decoded to exercise the decoder, not read")]
enum Kind<'a> {
    A,
    B(u32),
    C { s: &'a str },
    D(wire::Buffer),
}

#[derive(Deserialize)]
#[expect(dead_code, reason = "the fields are decoded to exercise the decoder, not read")]
struct Everything<'a> {
    n: i64,
    f: f64,
    s: String,
    b: &'a str,
    kinds: Vec<Kind<'a>>,
    map: BTreeMap<u16, Option<Vec<u8>>>,
    buf: wire::Buffer,
    c: char,
}

fuzz_target!(|data: &[u8]| {
    let msg = bytes::Bytes::copy_from_slice(data);
    let _ = wire::from_bytes::<Everything<'_>>(&msg);
    let _ = wire::read_message(&mut &data[..], wire::Limits::default());
});
