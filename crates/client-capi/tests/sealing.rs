//! Sealed groups through the C ABI (1.5, 1.7): a send in a sealed group with no
//! key held is refused with RC_ERR_WRONG_STATE and the library's message,
//! and `rc_sealing_stats` and `rc_sealing_duplicates` read the sealed counters.

#![allow(unsafe_code, reason = "calls the C ABI's entry points as C would")]

mod common;

use common::{mint, Reflector};
use reflector_c::api::{self, TokenParts};
use reflector_c::ffi::*;
use reflector_c::types::*;
use std::time::{Duration, Instant};

fn last_error() -> String {
    let mut buf = [0u8; 512];
    let n = api::last_error(&mut buf);
    String::from_utf8_lossy(&buf[..n.min(511)]).into_owned()
}

#[test]
fn a_sealed_group_without_keys_refuses_to_send_and_counters_read() {
    let r = Reflector::start_sealed();
    let m = mint(1, &r);
    let reflector = r.addr().to_string();
    let p = TokenParts {
        token: &m.token,
        session_key: &m.session_key,
        player: m.player,
        group: m.group,
        reflector: &reflector,
        expires_unix_s: m.expires_unix_s,
    };
    let h = api::new_with_token(&p, Some("127.0.0.1:0")).expect("a client starts");
    let deadline = Instant::now() + Duration::from_secs(5);
    while rc_is_member(h) != 1 {
        assert!(Instant::now() < deadline, "no JOIN_ACK within 5 s");
        assert_eq!(rc_update(h, api::now_ms()), rc_status::RC_OK);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(rc_max_payload(h), 1400, "a sealed group's limit");
    let data = b"state";
    let mut seq = 0u64;
    // SAFETY: a valid buffer and out-pointer.
    let st = unsafe { rc_send(h, data.as_ptr(), data.len(), &mut seq) };
    assert_eq!(st, rc_status::RC_ERR_WRONG_STATE);
    assert!(last_error().contains("no sealing key"), "{}", last_error());
    let mut s = rc_sealing_counters {
        bad: 99,
        ..Default::default()
    };
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { rc_sealing_stats(h, &mut s) }, rc_status::RC_OK);
    assert_eq!(s, rc_sealing_counters::default());
    // SAFETY: NULL is checked.
    assert_eq!(
        unsafe { rc_sealing_stats(h, std::ptr::null_mut()) },
        rc_status::RC_ERR_NULL
    );
    let mut dup = 7u64;
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { rc_sealing_duplicates(h, &mut dup) }, rc_status::RC_OK);
    assert_eq!(dup, 0);
    // SAFETY: NULL is checked.
    assert_eq!(
        unsafe { rc_sealing_duplicates(h, std::ptr::null_mut()) },
        rc_status::RC_ERR_NULL
    );
    assert!(rc_version() & 0xffff >= 5, "a library of 1.5 or later");
    assert_eq!(rc_free(h), rc_status::RC_OK);
}
