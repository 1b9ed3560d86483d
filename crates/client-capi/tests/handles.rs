//! Handles through the C ABI's own entry points (the safe ones, called
//! from Rust as C would): a stale handle, a double free and handle 0 are
//! errors with a message, never a crash. No reflector is needed: a
//! client with a token starts and joins in the background.

use reflector_c::api::{self, TokenParts};
use reflector_c::ffi::{
    rc_checkpoint_configure, rc_fetch_checkpoint, rc_free, rc_is_member, rc_leave, rc_max_payload, rc_update,
    rc_version,
};
use reflector_c::types::*;

fn last_error() -> String {
    let mut buf = [0u8; 256];
    let n = api::last_error(&mut buf);
    String::from_utf8_lossy(&buf[..n.min(255)]).into_owned()
}

fn parts<'a>(token: &'a [u8], key: &'a [u8]) -> TokenParts<'a> {
    TokenParts {
        token,
        session_key: key,
        player: 7,
        group: 1,
        reflector: "127.0.0.1:9",
        expires_unix_s: u64::MAX / 2,
    }
}

#[test]
fn stale_handles_and_double_free_are_errors() {
    let h = api::new_with_token(&parts(&[1; 32], &[2; 32]), Some("127.0.0.1:0")).expect("a client starts");
    assert_ne!(h, 0);
    assert_eq!(rc_update(h, api::now_ms()), rc_status::RC_OK);
    assert_eq!(rc_is_member(h), 0, "nobody answers on port 9");
    assert_eq!(rc_max_payload(h), 0);
    assert_eq!(rc_leave(h), rc_status::RC_OK);
    assert_eq!(rc_free(h), rc_status::RC_OK);
    assert_eq!(rc_free(h), rc_status::RC_ERR_BAD_HANDLE, "double free");
    assert!(last_error().contains("not a live client"), "{}", last_error());
    assert_eq!(rc_update(h, 0), rc_status::RC_ERR_BAD_HANDLE, "stale");
    assert_eq!(rc_is_member(h), rc_status::RC_ERR_BAD_HANDLE as i32);
    assert_eq!(rc_max_payload(h), rc_status::RC_ERR_BAD_HANDLE as i64);
    assert_eq!(rc_free(0), rc_status::RC_ERR_BAD_HANDLE);
    // A new client may reuse the slot; the old handle stays dead.
    let h2 = api::new_with_token(&parts(&[1; 32], &[2; 32]), Some("127.0.0.1:0")).unwrap();
    assert_ne!(h2, h);
    assert_eq!(rc_update(h, 0), rc_status::RC_ERR_BAD_HANDLE);
    assert_eq!(rc_free(h2), rc_status::RC_OK);
}

#[test]
fn bad_arguments_are_errors_with_a_message() {
    let e = api::new_with_token(&parts(&[1; 31], &[2; 32]), None).unwrap_err();
    assert_eq!(e, rc_status::RC_ERR_INVALID_ARGUMENT);
    assert!(last_error().contains("token is 31 bytes"), "{}", last_error());
    let mut p = parts(&[1; 32], &[2; 32]);
    p.reflector = "no-such-host.invalid:1";
    let e = api::new_with_token(&p, None).unwrap_err();
    assert_eq!(e, rc_status::RC_ERR_RESOLVE, "{}", last_error());
}

#[test]
fn version_has_the_header_major() {
    assert_eq!(rc_version() >> 16, REFLECTOR_C_VERSION_MAJOR);
}

/// Checkpoint calls before a join and on dead handles: errors with a
/// message (the pointer-taking ones are covered in tests/checkpoint.rs).
#[test]
fn checkpoint_calls_on_a_non_member_and_a_dead_handle() {
    let h = api::new_with_token(&parts(&[1; 32], &[2; 32]), Some("127.0.0.1:0")).expect("a client starts");
    assert_eq!(rc_fetch_checkpoint(h), rc_status::RC_ERR_NOT_MEMBER);
    assert!(last_error().contains("not a member"), "{}", last_error());
    assert_eq!(
        api::provide_checkpoint(h, 1, b"s"),
        Err(rc_status::RC_ERR_NOT_REQUESTED)
    );
    assert_eq!(api::checkpoint_take(h, &mut [0u8; 8]), Ok(api::Take::Nothing));
    assert_eq!(api::poll_checkpoint(h), Ok(None));
    assert_eq!(rc_checkpoint_configure(h, 1, 100, 1 << 10), rc_status::RC_OK);
    assert_eq!(rc_free(h), rc_status::RC_OK);
    assert_eq!(rc_fetch_checkpoint(h), rc_status::RC_ERR_BAD_HANDLE);
    assert_eq!(rc_checkpoint_configure(h, 1, 0, 0), rc_status::RC_ERR_BAD_HANDLE);
    assert_eq!(api::checkpoint_take(h, &mut []), Err(rc_status::RC_ERR_BAD_HANDLE));
}
