//! Every captured frame goes through the one-line decoder; whatever bytes
//! come off the wire (truncated by the snaplen or not), it must not panic.
//! Run: `cd crates/capture/fuzz && cargo +nightly fuzz run summarize_frame`.
#![no_main]

use capture::decode::summarize;
use capture::filter::LinkType;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, frame)) = data.split_first() else {
        return;
    };
    let link = if sel & 1 == 0 {
        LinkType::Ethernet
    } else {
        LinkType::RawIp
    };
    // The wire length may exceed what was kept (snaplen), never be smaller.
    let wire_len = frame.len() as u32 + u32::from(sel >> 1);
    let mut out = String::new();
    summarize(&mut out, link, frame, wire_len);
});
