//! Every `extern "C"` entry point, and the crate's only unsafe code: raw
//! pointers from C become slices, strings and out-values here, and
//! nothing else happens here; the work is in `api.rs`, in safe Rust.
//!
//! Each entry point runs its body under `catch_unwind`: a panic never
//! crosses into C, it becomes `RC_ERR_PANIC` (or the documented fallback
//! value) with the panic's message as the last error.
//!
//! What C must uphold (the header says the same per function): a pointer
//! with a length points to that many readable (or writable) bytes, or is
//! NULL with length 0; a string is NUL-terminated; out-pointers point to
//! writable memory of their type. Handles need no care: any value is
//! checked against the handle table.

#![allow(unsafe_code, reason = "the C ABI's boundary; fenced in this one file")]
#![allow(
    clippy::missing_safety_doc,
    reason = "the contract is in the module docs and the header"
)]

use crate::api::{self, fail, ControlParts, Res, TokenParts};
use crate::types::*;
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    format!("internal error (a panic in the library, caught): {what}")
}

/// Runs `f`, turning a panic into `fallback` (after storing its message).
fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            fail(rc_status::RC_ERR_PANIC, panic_message(&*p));
            fallback
        }
    }
}

/// `guard` for calls that return a status.
fn call(f: impl FnOnce() -> Res<rc_status>) -> rc_status {
    guard(rc_status::RC_ERR_PANIC, || f().unwrap_or_else(|e| e))
}

fn null(what: &str) -> rc_status {
    fail(rc_status::RC_ERR_NULL, format!("{what} is NULL"))
}

/// A required string argument.
unsafe fn text<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: C passes a NUL-terminated string (the header's contract).
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| fail(rc_status::RC_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// An optional string argument (NULL: none).
unsafe fn opt_text<'a>(p: *const c_char, what: &str) -> Res<Option<&'a str>> {
    if p.is_null() {
        Ok(None)
    } else {
        // SAFETY: as `text`.
        unsafe { text(p, what) }.map(Some)
    }
}

/// `len` bytes at `p` (NULL allowed when `len` is 0).
unsafe fn bytes<'a>(p: *const u8, len: usize, what: &str) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: C passes `len` readable bytes at `p` (the header's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

/// `cap` writable bytes at `p` (NULL allowed when `cap` is 0).
unsafe fn bytes_mut<'a>(p: *mut u8, cap: usize, what: &str) -> Res<&'a mut [u8]> {
    if cap == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: C passes `cap` writable bytes at `p` (the header's contract).
    Ok(unsafe { std::slice::from_raw_parts_mut(p, cap) })
}

/// Writes `v` through an out-pointer.
unsafe fn put<T>(p: *mut T, v: T, what: &str) -> Res<()> {
    if p.is_null() {
        return Err(null(what));
    }
    // SAFETY: C passes a writable `T` (the header's contract); `write`
    // does not read or drop what was there.
    unsafe { p.write(v) };
    Ok(())
}

fn done(r: Res<()>) -> Res<rc_status> {
    r.map(|()| rc_status::RC_OK)
}

/// The library's version: `(major << 16) | minor`. Compare the major part
/// with `REFLECTOR_C_VERSION_MAJOR` from the header you built with.
#[no_mangle]
pub extern "C" fn rc_version() -> u32 {
    guard(0, api::version)
}

/// Milliseconds of the library's monotonic clock: the time `rc_update`
/// wants.
#[no_mangle]
pub extern "C" fn rc_now_ms() -> u64 {
    guard(0, api::now_ms)
}

/// Copies this thread's last error message (of the last call that failed
/// on this thread) into `buf`, NUL-terminated and cut to `cap`; returns
/// the message's full length without the NUL (call with `cap` 0 to ask).
#[no_mangle]
pub unsafe extern "C" fn rc_last_error(buf: *mut c_char, cap: usize) -> usize {
    guard(0, || {
        // SAFETY: `cap` writable bytes at `buf` (the header's contract).
        match unsafe { bytes_mut(buf.cast::<u8>(), cap, "buf") } {
            Ok(b) => api::last_error(b),
            Err(_) => api::last_error(&mut []),
        }
    })
}

/// Live client handles in this process.
#[no_mangle]
pub extern "C" fn rc_live_clients() -> usize {
    guard(0, api::live)
}

/// A client with a token handed in (the game's backend got it from the
/// control server): `token` (`RC_TOKEN_LEN` bytes), `session_key`
/// (`RC_SESSION_KEY_LEN` bytes), the `player` and `group` it is for, the
/// reflector's `"host:port"`, when it expires (Unix s), and the local
/// address to bind (`NULL`: any). The new handle goes to `*out`.
#[no_mangle]
pub unsafe extern "C" fn rc_client_new_with_token(
    token: *const u8,
    token_len: usize,
    session_key: *const u8,
    session_key_len: usize,
    player: u32,
    group: u16,
    reflector: *const c_char,
    expires_unix_s: u64,
    local: *const c_char,
    out: *mut rc_handle,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer as the header says, checked for NULL.
        let p = unsafe {
            token_parts(
                (token, token_len),
                (session_key, session_key_len),
                player,
                group,
                reflector,
                expires_unix_s,
            )?
        };
        // SAFETY: as above.
        let local = unsafe { opt_text(local, "local")? };
        if out.is_null() {
            return Err(null("out"));
        }
        let h = api::new_with_token(&p, local)?;
        // SAFETY: `out` is a writable handle (checked for NULL above, so
        // the client is not leaked by a failed write).
        done(unsafe { put(out, h, "out") })
    })
}

/// The token arguments of `rc_client_new_with_token`, `rc_set_token` and
/// `rc_area_add_token`, read.
///
/// # Safety
/// `token` and `session_key` point at their lengths of readable bytes (or
/// are NULL), `reflector` is NULL or a NUL-terminated string.
unsafe fn token_parts<'a>(
    (token, token_len): (*const u8, usize),
    (session_key, session_key_len): (*const u8, usize),
    player: u32,
    group: u16,
    reflector: *const c_char,
    expires_unix_s: u64,
) -> Res<TokenParts<'a>> {
    // SAFETY: the caller's contract, passed on; NULL checked by each.
    unsafe {
        Ok(TokenParts {
            token: bytes(token, token_len, "token")?,
            session_key: bytes(session_key, session_key_len, "session_key")?,
            player,
            group,
            reflector: text(reflector, "reflector")?,
            expires_unix_s,
        })
    }
}

/// The arguments of `rc_client_new_control` and `rc_config_new_control`,
/// read.
///
/// # Safety
/// Each pointer is NULL (where optional) or a NUL-terminated string.
unsafe fn control_parts<'a>(
    url: *const c_char,
    ticket: *const c_char,
    player: u32,
    (x, y): (f64, f64),
    ca_file: *const c_char,
    allow_plain_http: c_int,
    local: *const c_char,
) -> Res<(ControlParts<'a>, Option<&'a str>)> {
    // SAFETY: the caller's contract, passed on; NULL checked by each.
    unsafe {
        Ok((
            ControlParts {
                url: text(url, "url")?,
                ticket: opt_text(ticket, "ticket")?,
                player,
                x,
                y,
                ca_file: opt_text(ca_file, "ca_file")?,
                allow_plain_http: allow_plain_http != 0,
            },
            opt_text(local, "local")?,
        ))
    }
}

/// A client that asks the control server at `url` for its tokens, with
/// the game backend's `ticket` (`NULL`: none), for `player` at (`x`,
/// `y`); `ca_file` (`NULL`: the usual roots) a PEM file of a private CA;
/// `allow_plain_http` non-zero to allow `http://` (closed labs only);
/// `local` the address to bind (`NULL`: any). The handle goes to `*out`.
#[no_mangle]
pub unsafe extern "C" fn rc_client_new_control(
    url: *const c_char,
    ticket: *const c_char,
    player: u32,
    x: f64,
    y: f64,
    ca_file: *const c_char,
    allow_plain_http: c_int,
    local: *const c_char,
    out: *mut rc_handle,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer as the header says, checked for NULL.
        let (p, local) = unsafe { control_parts(url, ticket, player, (x, y), ca_file, allow_plain_http, local)? };
        if out.is_null() {
            return Err(null("out"));
        }
        let h = api::new_control(&p, local)?;
        // SAFETY: `out` is a writable handle, checked for NULL above.
        done(unsafe { put(out, h, "out") })
    })
}

/// Does all the I/O that is due (receive, join, keepalive, probe answers,
/// renewal, rejoin). Call it every frame with `rc_now_ms()`.
#[no_mangle]
pub extern "C" fn rc_update(h: rc_handle, now_ms: u64) -> rc_status {
    call(|| done(api::update(h, now_ms)))
}

/// The next event into `*event`: `RC_OK`, or `RC_NONE` (and kind
/// `RC_EVENT_NONE`) when there is none.
#[no_mangle]
pub unsafe extern "C" fn rc_poll_event(h: rc_handle, event: *mut rc_event) -> rc_status {
    call(|| {
        if event.is_null() {
            return Err(null("event"));
        }
        let e = api::poll_event(h)?;
        // SAFETY: `event` is a writable rc_event (checked for NULL).
        unsafe { put(event, e.unwrap_or(rc_event::NONE), "event")? };
        Ok(if e.is_some() {
            rc_status::RC_OK
        } else {
            rc_status::RC_NONE
        })
    })
}

/// The next received datagram: its payload copied into `buf` (`cap`
/// bytes; `RC_MAX_PAYLOAD` never truncates) and what it is into `*info`.
/// `RC_OK`, or `RC_NONE` when nothing is waiting. A payload longer than
/// `cap` is cut (`info->truncated`, `info->len` its full length).
#[no_mangle]
pub unsafe extern "C" fn rc_recv(h: rc_handle, buf: *mut u8, cap: usize, info: *mut rc_datagram_info) -> rc_status {
    call(|| {
        if info.is_null() {
            return Err(null("info"));
        }
        // SAFETY: `cap` writable bytes at `buf` (the header's contract).
        let buf = unsafe { bytes_mut(buf, cap, "buf")? };
        match api::recv(h, buf)? {
            None => Ok(rc_status::RC_NONE),
            // SAFETY: `info` is a writable rc_datagram_info (checked).
            Some(i) => done(unsafe { put(info, i, "info") }),
        }
    })
}

/// Sends `len` bytes at `data` to the group; its sequence number goes to
/// `*seq` (`seq` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn rc_send(h: rc_handle, data: *const u8, len: usize, seq: *mut u64) -> rc_status {
    call(|| {
        // SAFETY: `len` readable bytes at `data` (the header's contract).
        let data = unsafe { bytes(data, len, "data")? };
        let s = api::send(h, data)?;
        if !seq.is_null() {
            // SAFETY: a non-NULL `seq` is a writable u64.
            unsafe { put(seq, s, "seq")? };
        }
        Ok(rc_status::RC_OK)
    })
}

/// The client's counters into `*stats`.
#[no_mangle]
pub unsafe extern "C" fn rc_stats(h: rc_handle, stats: *mut rc_client_stats) -> rc_status {
    call(|| {
        if stats.is_null() {
            return Err(null("stats"));
        }
        let s = api::stats(h)?;
        // SAFETY: `stats` is a writable rc_client_stats (checked for NULL).
        done(unsafe { put(stats, s, "stats") })
    })
}

/// The largest payload `rc_send` takes now, 0 while not a member; a
/// negative `rc_status` for a bad handle.
#[no_mangle]
pub extern "C" fn rc_max_payload(h: rc_handle) -> i64 {
    guard(rc_status::RC_ERR_PANIC as i64, || match api::max_payload(h) {
        Ok(n) => i64::try_from(n).unwrap_or(i64::MAX),
        Err(e) => e as i64,
    })
}

/// 1 if the client is a member of a group, 0 if not; a negative
/// `rc_status` for a bad handle.
#[no_mangle]
pub extern "C" fn rc_is_member(h: rc_handle) -> c_int {
    guard(rc_status::RC_ERR_PANIC as c_int, || match api::is_member(h) {
        Ok(m) => c_int::from(m),
        Err(e) => e as c_int,
    })
}

/// The group the client is in into `*group`: `RC_OK`, or `RC_NONE` while
/// not a member.
#[no_mangle]
pub unsafe extern "C" fn rc_group(h: rc_handle, group: *mut u16) -> rc_status {
    call(|| {
        if group.is_null() {
            return Err(null("group"));
        }
        match api::group(h)? {
            None => Ok(rc_status::RC_NONE),
            // SAFETY: `group` is a writable u16 (checked for NULL).
            Some(g) => done(unsafe { put(group, g, "group") }),
        }
    })
}

/// The client's instance id (the `instance` its receivers see) into
/// `*instance`.
#[no_mangle]
pub unsafe extern "C" fn rc_instance(h: rc_handle, instance: *mut u64) -> rc_status {
    call(|| {
        if instance.is_null() {
            return Err(null("instance"));
        }
        let i = api::instance(h)?;
        // SAFETY: `instance` is a writable u64 (checked for NULL).
        done(unsafe { put(instance, i, "instance") })
    })
}

/// Hands in a new token (after `RC_EVENT_TOKEN_NEEDED`, or to move to
/// another group); arguments as `rc_client_new_with_token`.
#[no_mangle]
pub unsafe extern "C" fn rc_set_token(
    h: rc_handle,
    token: *const u8,
    token_len: usize,
    session_key: *const u8,
    session_key_len: usize,
    player: u32,
    group: u16,
    reflector: *const c_char,
    expires_unix_s: u64,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer as the header says, checked for NULL.
        let p = unsafe {
            token_parts(
                (token, token_len),
                (session_key, session_key_len),
                player,
                group,
                reflector,
                expires_unix_s,
            )?
        };
        done(api::set_token(h, &p))
    })
}

/// Adds one token to the area the game hands in (its backend fetched the
/// area's tokens, `GET /join?...&area=R`): the first one added is the
/// player's own cell (where `rc_send` goes), then the other groups of the
/// area, nearest first; arguments as `rc_client_new_with_token`. Nothing
/// changes until `rc_set_area`. At most `RC_MAX_AREA_TOKENS`, all for one
/// player, each group once; a refused token (any error) empties the area
/// being added, so the game adds it again from its first token. (Since
/// 1.3.)
#[no_mangle]
pub unsafe extern "C" fn rc_area_add_token(
    h: rc_handle,
    token: *const u8,
    token_len: usize,
    session_key: *const u8,
    session_key_len: usize,
    player: u32,
    group: u16,
    reflector: *const c_char,
    expires_unix_s: u64,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer as the header says, checked for NULL.
        let p = unsafe {
            token_parts(
                (token, token_len),
                (session_key, session_key_len),
                player,
                group,
                reflector,
                expires_unix_s,
            )?
        };
        done(api::area_add_token(h, &p))
    })
}

/// Hands in the area added by `rc_area_add_token` since the last call:
/// groups held that are still in it are renewed, new ones joined, and the
/// others left once the new ones are members (make-before-break:
/// `RC_EVENT_MOVED` when sends switch to the new cell, `RC_EVENT_LEFT_GROUP`
/// for each group left). The added tokens are used up whatever the result;
/// `RC_ERR_WRONG_STATE` if none was added. (Since 1.3.)
#[no_mangle]
pub extern "C" fn rc_set_area(h: rc_handle) -> rc_status {
    call(|| done(api::set_area(h)))
}

/// A new local socket (as after a network change); the membership moves
/// to it.
#[no_mangle]
pub extern "C" fn rc_rebind(h: rc_handle) -> rc_status {
    call(|| done(api::rebind(h)))
}

/// Leaves the group (`RC_EVENT_LEFT` follows); the handle stays live.
#[no_mangle]
pub extern "C" fn rc_leave(h: rc_handle) -> rc_status {
    call(|| done(api::leave(h)))
}

/// Frees the client (it leaves its group first). The handle is dead
/// after; freeing it again returns `RC_ERR_BAD_HANDLE`.
#[no_mangle]
pub extern "C" fn rc_free(h: rc_handle) -> rc_status {
    call(|| done(api::free(h)))
}

/// Checkpoints (since 1.1): the group's game state, kept by the reflector;
/// it asks a member for it now and then, and a joiner fetches the latest.
///
/// Threading: the exchanges (one upload and one fetch of each kind at
/// most, each a non-blocking TCP connection) run inside `rc_update`, on
/// the thread that calls it, a bounded amount of work per call; the
/// library has no thread of its own for them and calls nothing back:
/// outcomes are polled here, a queue apart from `rc_poll_event`. One
/// thread at a time per handle, as for every call.
///
/// Memory: the bytes given to `rc_provide_checkpoint` are copied before it
/// returns (the caller's buffer is its own again at once); a fetched state
/// is the library's from `RC_CHECKPOINT_READY` until `rc_checkpoint_take`
/// copies it into the caller's buffer, and is then let go. The state is
/// never in the event (it can be MiB): the event says its size.
///
/// This call: the next checkpoint event into `*event`: `RC_OK`, or
/// `RC_NONE` (kind `RC_CHECKPOINT_NONE`) when there is none. A
/// `RC_CHECKPOINT_READY` event's state waits for `rc_checkpoint_take`
/// (replacing one not taken); a `RC_CHECKPOINT_FAILED` event's message is
/// this thread's last error.
#[no_mangle]
pub unsafe extern "C" fn rc_poll_checkpoint(h: rc_handle, event: *mut rc_checkpoint_event) -> rc_status {
    call(|| {
        if event.is_null() {
            return Err(null("event"));
        }
        let e = api::poll_checkpoint(h)?;
        // SAFETY: `event` is a writable rc_checkpoint_event (checked for NULL).
        unsafe { put(event, e.unwrap_or(rc_checkpoint_event::NONE), "event")? };
        Ok(if e.is_some() {
            rc_status::RC_OK
        } else {
            rc_status::RC_NONE
        })
    })
}

/// Answers the pending `RC_CHECKPOINT_REQUESTED` with the game's state: the
/// `len` bytes at `state` (copied before this returns), its game `tick`.
/// The upload goes on in later `rc_update`s; `RC_CHECKPOINT_UPLOADED` or
/// `RC_CHECKPOINT_FAILED` tells how it ended. Errors (nothing sent):
/// `RC_ERR_NOT_REQUESTED` (no request pending), `RC_ERR_IN_FLIGHT` (an
/// upload is under way; the request stays pending), `RC_ERR_NOT_MEMBER`,
/// `RC_ERR_NO_CHANNEL`, `RC_ERR_IO`. (Since 1.1.)
#[no_mangle]
pub unsafe extern "C" fn rc_provide_checkpoint(h: rc_handle, tick: u64, state: *const u8, len: usize) -> rc_status {
    call(|| {
        // SAFETY: `len` readable bytes at `state` (the header's contract).
        let state = unsafe { bytes(state, len, "state")? };
        done(api::provide_checkpoint(h, tick, state))
    })
}

/// Fetches the group's latest checkpoint now (a client fetches by itself
/// after each join unless `rc_checkpoint_configure` turned that off). The
/// outcome is an event: `RC_CHECKPOINT_READY`, `_EMPTY` or `_FAILED` (the
/// reflector refuses fetches sooner than its interval: `RC_ERR_REFUSED`,
/// refusal 6). Errors: `RC_ERR_IN_FLIGHT`, `RC_ERR_NOT_MEMBER`,
/// `RC_ERR_NO_CHANNEL`, `RC_ERR_IO`. (Since 1.1.)
#[no_mangle]
pub extern "C" fn rc_fetch_checkpoint(h: rc_handle) -> rc_status {
    call(|| done(api::fetch_checkpoint(h)))
}

/// Fetches the other checkpoint the reflector keeps for the group now
/// (FETCH_OTHER: the one before the latest, uploaded by another member
/// when the reflector has one), so a game can compare two members'
/// snapshots. It may run beside `rc_fetch_checkpoint` (one of each at a
/// time). The outcome is an event whose `op` is
/// `RC_CHECKPOINT_OP_FETCH_OTHER`: `RC_CHECKPOINT_READY`, `_EMPTY` (fewer
/// than two stored) or `_FAILED` (the reflector paces these apart from
/// the FETCHes: sooner than its interval, `RC_ERR_REFUSED`, refusal 6).
/// Errors: `RC_ERR_IN_FLIGHT`, `RC_ERR_NOT_MEMBER`, `RC_ERR_NO_CHANNEL`,
/// `RC_ERR_IO`. (Since 1.4.)
#[no_mangle]
pub extern "C" fn rc_fetch_checkpoint_other(h: rc_handle) -> rc_status {
    call(|| done(api::fetch_checkpoint_other(h)))
}

/// Copies the state of the last `RC_CHECKPOINT_READY` into `buf` (`cap`
/// bytes) and lets the library's copy go: `RC_OK` with its size in
/// `*len_out` and its tick in `*tick_out` (`tick_out` may be NULL);
/// `RC_NONE` when no state waits; `RC_ERR_BUFFER_TOO_SMALL` when `cap` is
/// less than the size, which goes to `*len_out` (the state stays: call
/// again with a buffer that large; `buf` NULL and `cap` 0 asks the size).
/// (Since 1.1.)
#[no_mangle]
pub unsafe extern "C" fn rc_checkpoint_take(
    h: rc_handle,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
    tick_out: *mut u64,
) -> rc_status {
    call(|| {
        if len_out.is_null() {
            return Err(null("len_out"));
        }
        // SAFETY: `cap` writable bytes at `buf` (the header's contract).
        let buf = unsafe { bytes_mut(buf, cap, "buf")? };
        let (len, tick, status) = match api::checkpoint_take(h, buf)? {
            api::Take::Nothing => return Ok(rc_status::RC_NONE),
            api::Take::TooSmall { len, tick } => (
                len,
                tick,
                fail(
                    rc_status::RC_ERR_BUFFER_TOO_SMALL,
                    format!("the checkpoint is {len} bytes; the buffer holds {cap}"),
                ),
            ),
            api::Take::Copied { len, tick } => (len, tick, rc_status::RC_OK),
        };
        // SAFETY: `len_out` is a writable size_t (checked for NULL).
        unsafe { put(len_out, len, "len_out")? };
        if !tick_out.is_null() {
            // SAFETY: a non-NULL `tick_out` is a writable u64.
            unsafe { put(tick_out, tick, "tick_out")? };
        }
        Ok(status)
    })
}

/// The client's checkpoint settings: `fetch_on_join` non-zero to fetch
/// after each join (the default), `timeout_ms` the deadline of one exchange
/// (default 10000), `max_bytes` the largest state a fetch takes (default
/// 16 MiB); 0 keeps the timeout or bound as it is. Call it before the
/// first `rc_update` for the first join to see it; an exchange under way
/// keeps its own. (Since 1.1.)
#[no_mangle]
pub extern "C" fn rc_checkpoint_configure(
    h: rc_handle,
    fetch_on_join: c_int,
    timeout_ms: u64,
    max_bytes: u64,
) -> rc_status {
    call(|| done(api::checkpoint_configure(h, fetch_on_join != 0, timeout_ms, max_bytes)))
}

/// The client's checkpoint counters into `*stats`. (Since 1.1.)
#[no_mangle]
pub unsafe extern "C" fn rc_checkpoint_stats(h: rc_handle, stats: *mut rc_checkpoint_counters) -> rc_status {
    call(|| {
        if stats.is_null() {
            return Err(null("stats"));
        }
        let s = api::checkpoint_stats(h)?;
        // SAFETY: `stats` is a writable rc_checkpoint_counters (checked for NULL).
        done(unsafe { put(stats, s, "stats") })
    })
}

/// The client's sealed-group counters into `*stats`: what the receiving
/// steps dropped and the `/keys` refreshes. (Since 1.5.)
#[no_mangle]
pub unsafe extern "C" fn rc_sealing_stats(h: rc_handle, stats: *mut rc_sealing_counters) -> rc_status {
    call(|| {
        if stats.is_null() {
            return Err(null("stats"));
        }
        let s = api::sealing_stats(h)?;
        // SAFETY: `stats` is a writable rc_sealing_counters (checked for NULL).
        done(unsafe { put(stats, s, "stats") })
    })
}

/// Sealed DATA the client dropped as duplicate deliveries into `*count`:
/// authentic copies of a datagram it already had, which the sender sealed
/// for another group of the client's area (docs/protocol.md, "Duplicate
/// deliveries"). Not a replay and not counted in `rc_sealing_counters`.
/// (Since 1.7.)
#[no_mangle]
pub unsafe extern "C" fn rc_sealing_duplicates(h: rc_handle, count: *mut u64) -> rc_status {
    call(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        let n = api::sealing_duplicates(h)?;
        // SAFETY: `count` is a writable u64 (checked for NULL).
        done(unsafe { put(count, n, "count") })
    })
}

/// Areas of interest and control server lists (since 1.2) need settings
/// the 1.1 constructors do not take, so a client gets them from a config:
/// an `rc_config` handle made with the arguments of
/// `rc_client_new_control` (the same meaning, the same NULLs), changed by
/// setters (`rc_config_set_area_radius`, `rc_config_add_fallback_url`; a
/// later minor version adds a setting as a new setter, never as a field of
/// a caller's struct), and read by `rc_client_new_from_config`, which
/// copies it: the config may be changed, used for more clients and freed
/// at once. Config handles follow the client handles' rules (a table
/// behind a mutex, usable from any thread, each call serialized per
/// handle, a freed one refused with `RC_ERR_BAD_HANDLE`), and are never
/// taken for a client's handle nor the other way round. A config for a
/// client handed its tokens is `rc_config_new_handed_in`'s (since 1.8).
///
/// This call: a config with the arguments of `rc_client_new_control`; its
/// handle goes to `*out`. Nothing is sent until a client is made from it.
#[no_mangle]
pub unsafe extern "C" fn rc_config_new_control(
    url: *const c_char,
    ticket: *const c_char,
    player: u32,
    x: f64,
    y: f64,
    ca_file: *const c_char,
    allow_plain_http: c_int,
    local: *const c_char,
    out: *mut rc_config,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer as the header says, checked for NULL.
        let (p, local) = unsafe { control_parts(url, ticket, player, (x, y), ca_file, allow_plain_http, local)? };
        if out.is_null() {
            return Err(null("out"));
        }
        let cfg = api::config_new_control(&p, local)?;
        // SAFETY: `out` is a writable rc_config, checked for NULL above.
        done(unsafe { put(out, cfg, "out") })
    })
}

/// The area of interest: the player's cell and every cell within `radius`
/// cells of it (0, the default: the cell only). The client asks the
/// control server for all of them in one request (the control server
/// takes at most 2, and refuses more: an `RC_EVENT_ERROR` with
/// `RC_ERR_CONTROL`) and is a member of each group: it hears the whole
/// area and sends to its cell only. A config of `rc_config_new_handed_in`
/// refuses it (`RC_ERR_INVALID_ARGUMENT`): its game hands the area in
/// (`rc_area_add_token`, `rc_set_area`). (Since 1.2.)
#[no_mangle]
pub extern "C" fn rc_config_set_area_radius(cfg: rc_config, radius: u8) -> rc_status {
    call(|| done(api::config_set_area_radius(cfg, radius)))
}

/// Adds a control server of the same world, tried after the URL given to
/// `rc_config_new_control` and the ones added before it. A request moves
/// on only when a server could not answer (a connect error, a timeout, a
/// 5xx); a refusal (401, 403, 429) is the answer. Every URL is checked
/// (`https://`, or `http://` with `allow_plain_http`) before a request is
/// sent. On a config of `rc_config_new_handed_in` (since 1.8): one more
/// control server for `/keys`, tried after the URL of
/// `rc_config_set_keys_from` (call that first, else
/// `RC_ERR_INVALID_ARGUMENT`) and the ones added before it, checked here
/// as that URL is (`https://`, or `http://` with its `allow_plain_http`).
/// (Since 1.2.)
#[no_mangle]
pub unsafe extern "C" fn rc_config_add_fallback_url(cfg: rc_config, url: *const c_char) -> rc_status {
    call(|| {
        // SAFETY: a NUL-terminated string (the header's contract), checked for NULL.
        let url = unsafe { text(url, "url")? };
        done(api::config_add_fallback_url(cfg, url))
    })
}

/// A client from a copy of the config (the config stays the caller's);
/// the handle goes to `*out`. It asks the control server at once, for the
/// area when the config has a radius. From a config of
/// `rc_config_new_handed_in` (since 1.8): a client as
/// `rc_client_new_handed_in` makes (no token yet, nothing sent), which
/// asks `/keys` of the config's keys_from control server, if it names one.
/// (Since 1.2.)
#[no_mangle]
pub unsafe extern "C" fn rc_client_new_from_config(cfg: rc_config, out: *mut rc_handle) -> rc_status {
    call(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let h = api::client_new_from_config(cfg)?;
        // SAFETY: `out` is a writable handle, checked for NULL above.
        done(unsafe { put(out, h, "out") })
    })
}

/// Frees a config; clients made from it keep their copy. The handle is
/// dead after. (Since 1.2.)
#[no_mangle]
pub extern "C" fn rc_config_free(cfg: rc_config) -> rc_status {
    call(|| done(api::config_free(cfg)))
}

/// The player moved to (`x`, `y`), world units as given at creation: the
/// client asks the control server for the area there (one request, now or
/// when the one in flight ends), joins the groups it does not hold,
/// switches `rc_send` to the new cell at its JOIN_ACK (`RC_EVENT_MOVED`)
/// and only then leaves the groups out of the new area
/// (`RC_EVENT_LEFT_GROUP`): make-before-break, at any radius. Each call is
/// a request (one unit of the ticket's rate limit): call it when the
/// player crosses into another cell, not every frame. Errors:
/// `RC_ERR_INVALID_ARGUMENT` (not finite), `RC_ERR_WRONG_STATE` (a client
/// handed its tokens, or after `rc_leave`). (Since 1.2.)
#[no_mangle]
pub extern "C" fn rc_set_position(h: rc_handle, x: f64, y: f64) -> rc_status {
    call(|| done(api::set_position(h, x, y)))
}

/// The group `rc_send` goes to now into `*group`: the player's cell, or
/// during a move the previous cell until the new one's JOIN_ACK. `RC_OK`,
/// or `RC_NONE` while there is none. (Since 1.2.)
#[no_mangle]
pub unsafe extern "C" fn rc_sending_group(h: rc_handle, group: *mut u16) -> rc_status {
    call(|| {
        if group.is_null() {
            return Err(null("group"));
        }
        match api::sending_group(h)? {
            None => Ok(rc_status::RC_NONE),
            // SAFETY: `group` is a writable u16 (checked for NULL).
            Some(g) => done(unsafe { put(group, g, "group") }),
        }
    })
}

/// The groups the client is a member of now (its cell's and those of its
/// area; during a move the old ones too, until left), in no particular
/// order: as many as fit copied into `groups` (`cap` of them; NULL with 0
/// asks the number), how many there are into `*count`. `RC_OK`, or
/// `RC_ERR_BUFFER_TOO_SMALL` when `cap` is less than `*count` (the first
/// `cap` copied). 25 hold an area of radius 2; during a move the old
/// groups are there too until they are left. (Since 1.2.)
#[no_mangle]
pub unsafe extern "C" fn rc_member_groups(h: rc_handle, groups: *mut u16, cap: usize, count: *mut usize) -> rc_status {
    call(|| {
        if count.is_null() {
            return Err(null("count"));
        }
        let buf: &mut [u16] = match (cap, groups.is_null()) {
            (0, _) => &mut [],
            (_, true) => return Err(null("groups")),
            // SAFETY: `cap` writable, aligned u16 at `groups` (the
            // header's contract), checked for NULL.
            (_, false) => unsafe { std::slice::from_raw_parts_mut(groups, cap) },
        };
        let n = api::member_groups(h, buf)?;
        // SAFETY: `count` is a writable size_t (checked for NULL).
        unsafe { put(count, n, "count")? };
        Ok(if n > cap {
            fail(
                rc_status::RC_ERR_BUFFER_TOO_SMALL,
                format!("the client is in {n} groups; the buffer holds {cap}"),
            )
        } else {
            rc_status::RC_OK
        })
    })
}

// ---- Handed-in sealing (since 1.6) -------------------------------------
//
// A game whose backend fetches the tokens (`rc_client_new_with_token`,
// `rc_set_token`, `rc_area_add_token`) and plays in sealed groups hands in
// what a control server with a sealing secret answers besides the token:
// the epoch keys (`keys`) and, for checkpoints, the certificate of the
// client's signing key (`control_public`, `certificate`), asked for with
// `sign_key` = `rc_sign_key`. A client made by `rc_client_new_handed_in`
// has that key before its first token, so one `/join` brings everything.

/// A client handed its tokens that has none yet: it holds no group and
/// sends nothing until `rc_set_token` (or `rc_area_add_token` then
/// `rc_set_area`) hands the first in; after that it is a client of
/// `rc_client_new_with_token` in every way. Its checkpoint signing key is
/// there at once (`rc_sign_key`), for the game's backend to send as
/// `sign_key` on the `/join` that brings the first token. `local` is the
/// address to bind (`NULL`: any); the handle goes to `*out`. A client
/// that also asks `/keys` for its next epoch keys is made from a config:
/// `rc_config_new_handed_in`, `rc_config_set_keys_from` (1.8). (Since 1.6.)
#[no_mangle]
pub unsafe extern "C" fn rc_client_new_handed_in(local: *const c_char, out: *mut rc_handle) -> rc_status {
    call(|| {
        // SAFETY: NULL or a NUL-terminated string (the header's contract).
        let local = unsafe { opt_text(local, "local")? };
        if out.is_null() {
            return Err(null("out"));
        }
        let h = api::new_handed_in(local)?;
        // SAFETY: `out` is a writable handle, checked for NULL above.
        done(unsafe { put(out, h, "out") })
    })
}

/// The client's checkpoint signing key (Ed25519, public half; one per
/// client, made with it; the private half never leaves the library) into
/// `out` (`cap` bytes, at least `RC_SIGN_KEY_LEN`; `RC_SIGN_KEY_LEN` are
/// written). The game's backend sends it, hex, as `sign_key` on every
/// `/join` for this client (the first, renewals, moves), so that a
/// control server with a sealing secret certifies it: its answer's
/// `control_public` and `certificate` go to `rc_set_checkpoint_certificate`.
/// `RC_ERR_BUFFER_TOO_SMALL` when `cap` is less. (Since 1.6.)
#[no_mangle]
pub unsafe extern "C" fn rc_sign_key(h: rc_handle, out: *mut u8, cap: usize) -> rc_status {
    call(|| {
        if out.is_null() {
            return Err(null("out"));
        }
        let key = api::sign_key(h)?;
        if cap < RC_SIGN_KEY_LEN {
            return Err(fail(
                rc_status::RC_ERR_BUFFER_TOO_SMALL,
                format!("the signing key is {RC_SIGN_KEY_LEN} bytes (RC_SIGN_KEY_LEN); the buffer holds {cap}"),
            ));
        }
        // SAFETY: `cap` writable bytes at `out` (the header's contract),
        // checked for NULL; `RC_SIGN_KEY_LEN` of them are written.
        let buf = unsafe { bytes_mut(out, cap, "out")? };
        buf[..RC_SIGN_KEY_LEN].copy_from_slice(&key);
        Ok(rc_status::RC_OK)
    })
}

/// Hands in the sealing epoch keys of `group` (a group the client holds:
/// after its token was handed in): the `n` entries of `keys`, the `keys`
/// of that group's grant in the control server's `/join` answer (or of a
/// `/keys` answer), decoded, in the answer's order, the player's own cell
/// first (the cell the answer names in `cell`: the client seals what it
/// sends under the first key's cell). Keys are held beside those held
/// already, each until the overlap after its epoch ends; hand in the new
/// ones the game's backend fetches before the newest held ends (with each
/// token renewal, or `GET /keys`), or make the client from a config that
/// names a control server for that (`rc_config_set_keys_from`, 1.8): it
/// then asks `/keys` itself. In a sealed group `rc_send` needs one
/// (else `RC_ERR_WRONG_STATE`, "no sealing key is held"), and so do
/// checkpoints. Errors (nothing handed in): `RC_ERR_INVALID_ARGUMENT` for
/// `n` 0 or above `RC_MAX_EPOCH_KEYS`, a key whose epoch does not end
/// after it starts or whose `reserved` is not 0 (the message names its
/// index), or no group `group` held. (Since 1.6.)
#[no_mangle]
pub unsafe extern "C" fn rc_set_epoch_keys(h: rc_handle, group: u16, keys: *const rc_epoch_key, n: usize) -> rc_status {
    call(|| {
        let keys: &[rc_epoch_key] = match (n, keys.is_null()) {
            (0, _) => &[],
            (_, true) => return Err(null("keys")),
            // SAFETY: `n` readable, aligned rc_epoch_key at `keys` (the
            // header's contract), checked for NULL.
            (_, false) => unsafe { std::slice::from_raw_parts(keys, n) },
        };
        done(api::set_epoch_keys(h, group, keys))
    })
}

/// Hands in the checkpoint certificate of `group`'s grant: the `/join`
/// answer's `control_public` (`control_public_len` bytes, which must be
/// `RC_SIGN_KEY_LEN`) and `certificate` (`certificate_len`, which must be
/// `RC_CERTIFICATE_LEN`), decoded from hex, and that grant's
/// `expires_unix_s` (the certificate signs it). A sealed group's uploads
/// need it (else `rc_provide_checkpoint` returns `RC_ERR_PROTOCOL`), and
/// so do the joiner's checks of a fetched checkpoint (against
/// `control_public`). Hand in the keys first (`rc_set_epoch_keys`): the
/// certificate is then checked here, under `control_public` for their
/// world, this client's `rc_sign_key`, the group's player and
/// `expires_unix_s`. Hand in each renewed grant's. Errors (nothing handed
/// in): `RC_ERR_INVALID_ARGUMENT` for a wrong length (the message names
/// the argument), no group `group` held, or a certificate that does not
/// verify. (Since 1.6.)
#[no_mangle]
pub unsafe extern "C" fn rc_set_checkpoint_certificate(
    h: rc_handle,
    group: u16,
    control_public: *const u8,
    control_public_len: usize,
    certificate: *const u8,
    certificate_len: usize,
    expires_unix_s: u64,
) -> rc_status {
    call(|| {
        // SAFETY: each pointer with its length as the header says, checked
        // for NULL.
        let (cp, cert) = unsafe {
            (
                bytes(control_public, control_public_len, "control_public")?,
                bytes(certificate, certificate_len, "certificate")?,
            )
        };
        done(api::set_checkpoint_certificate(h, group, cp, cert, expires_unix_s))
    })
}

/// The name of an `RC_CHECK_*` value (`rc_checkpoint_event.check`): the
/// joiner's check as docs/protocol.md and the `checkpoint_*` counters name
/// it ("checkpoint_wrong_cell", ...), a static NUL-terminated string the
/// caller never frees; NULL for 0 and for values this library does not
/// know. (Since 1.6.)
#[no_mangle]
pub extern "C" fn rc_check_name(check: u8) -> *const c_char {
    guard(std::ptr::null(), || {
        api::check_name(check).map_or(std::ptr::null(), std::ffi::CStr::as_ptr)
    })
}

// ---- End of handed-in sealing ------------------------------------------

// ---- Keys from a control server, tokens handed in (since 1.8) ----------
//
// A client handed its tokens holds a sealed group's epoch keys only as
// the game hands them in, so a game whose renewals are further apart than
// the overlap window (60 s) misses the next epoch's key. A client made
// from a config that names a control server for `/keys` asks it for the
// next keys itself, as a client that fetches its own tokens does: when
// the newest key of one of its group's cells is within the overlap of its
// end, with the membership's newest token (a MAC under its session key,
// no ticket). Its requests count in `rc_sealing_counters`
// (`keys_requests`, `keys_refreshes`, `keys_refresh_failures`); a failed
// one is an `RC_EVENT_ERROR` (`RC_ERR_CONTROL`) and is retried with
// backoff. The game may still hand keys in (`rc_set_epoch_keys`): both
// are held.

/// A config for a client handed its tokens: `rc_client_new_from_config`
/// makes from it a client as `rc_client_new_handed_in` does (no token yet,
/// nothing sent until `rc_set_token`, or `rc_area_add_token` then
/// `rc_set_area`; its signing key there at once), with the config's
/// settings: `rc_config_set_keys_from` and its `rc_config_add_fallback_url`
/// (`rc_config_set_area_radius` is refused: the game hands the area in).
/// `local` is the address to bind (`NULL`: any); the handle goes to
/// `*out`. (Since 1.8.)
#[no_mangle]
pub unsafe extern "C" fn rc_config_new_handed_in(local: *const c_char, out: *mut rc_config) -> rc_status {
    call(|| {
        // SAFETY: NULL or a NUL-terminated string (the header's contract).
        let local = unsafe { opt_text(local, "local")? };
        if out.is_null() {
            return Err(null("out"));
        }
        let cfg = api::config_new_handed_in(local)?;
        // SAFETY: `out` is a writable rc_config, checked for NULL above.
        done(unsafe { put(out, cfg, "out") })
    })
}

/// Names the control server that the clients of a config of
/// `rc_config_new_handed_in` ask `GET /keys` (docs/protocol.md, "Handing
/// out keys") for their sealed groups' next epoch keys: `url`
/// (`https://host:port`, the world's control server, the one the game's
/// backend asks `/join`), `ca_file` (`NULL`: the usual roots) a PEM file
/// of a private CA, `allow_plain_http` non-zero to allow `http://`
/// (closed labs only: the token and the keys cross in clear). No ticket
/// goes with `/keys`: the membership's token signs the request. More
/// control servers of the world: `rc_config_add_fallback_url` after this
/// call; calling it again names another (the fallbacks added before are
/// dropped). Everything is checked here, nothing set on a refusal
/// (`RC_ERR_INVALID_ARGUMENT`, the message says what): an empty URL, one
/// neither `https://` nor `http://`, `http://` without
/// `allow_plain_http`, an empty or unreadable `ca_file`, and a config of
/// `rc_config_new_control` (that client asks its own control server).
/// (Since 1.8.)
#[no_mangle]
pub unsafe extern "C" fn rc_config_set_keys_from(
    cfg: rc_config,
    url: *const c_char,
    ca_file: *const c_char,
    allow_plain_http: c_int,
) -> rc_status {
    call(|| {
        // SAFETY: NUL-terminated strings (the header's contract), `url`
        // checked for NULL, `ca_file` NULL or a string.
        let (url, ca_file) = unsafe { (text(url, "url")?, opt_text(ca_file, "ca_file")?) };
        done(api::config_set_keys_from(cfg, url, ca_file, allow_plain_http != 0))
    })
}

// ---- End of keys from a control server ---------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> String {
        let mut b = [0u8; 256];
        let n = api::last_error(&mut b);
        String::from_utf8_lossy(&b[..n.min(255)]).into_owned()
    }

    #[test]
    fn a_panic_becomes_a_status_and_a_message() {
        assert_eq!(call(|| panic!("boom in a call")), rc_status::RC_ERR_PANIC);
        assert!(message().contains("boom in a call"), "{}", message());
        assert_eq!(guard(-7i64, || panic!("{} formatted", 42)), -7);
        assert!(message().contains("42 formatted"), "{}", message());
    }

    #[test]
    fn null_pointers_are_errors() {
        let mut h: rc_handle = 0;
        // SAFETY: NULL strings with valid lengths: the checks under test.
        let st = unsafe {
            rc_client_new_with_token(
                std::ptr::null(),
                32,
                [0u8; 32].as_ptr(),
                32,
                1,
                1,
                c"127.0.0.1:9".as_ptr(),
                0,
                std::ptr::null(),
                &mut h,
            )
        };
        assert_eq!(st, rc_status::RC_ERR_NULL);
        assert!(message().contains("token is NULL"), "{}", message());
        // SAFETY: a NULL event pointer: the check under test.
        assert_eq!(
            unsafe { rc_poll_event(1, std::ptr::null_mut()) },
            rc_status::RC_ERR_NULL
        );
        // SAFETY: a zero capacity with NULL: allowed, asks the length.
        let n = unsafe { rc_last_error(std::ptr::null_mut(), 0) };
        assert_eq!(n, message().len());
    }
}
