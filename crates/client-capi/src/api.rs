//! The C ABI's operations in safe Rust: the handle table of clients, the
//! last-error message, and the conversions between the client's types and
//! the header's. `ffi.rs` only turns pointers into slices and strings and
//! calls these.

use crate::handles::{lock, HandleError, Table};
use crate::types::*;
use reflector_client::{
    AreaTokens, CellKey, CheckpointError, CheckpointEvent, CheckpointOp, Client, Config, ControlServer, Error, Event,
    RejoinReason, SendError, Token, TokenSource, Verification,
};
use reflector_proto::sealed::checkpoint::CheckpointRefusal;
use std::cell::RefCell;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static CLIENTS: Mutex<Table<Entry>> = Mutex::new(Table::new(RC_MAX_CLIENTS));

/// The configs (`rc_config`): a tagged table, so a config handle is never
/// a client's.
static CONFIGS: Mutex<Table<Config>> = Mutex::new(Table::new_tagged(RC_MAX_CONFIGS));

/// What a handle holds: the client, and the state of the last checkpoint
/// polled as `RC_CHECKPOINT_READY` until `rc_checkpoint_take` copies it out.
pub struct Entry {
    client: Client,
    fetched: Option<Fetched>,
    /// It asks the control server (so `rc_set_position` applies).
    control: bool,
    /// An area's tokens added by `rc_area_add_token`, waiting for
    /// `rc_set_area`: the player's cell first.
    area: Vec<Token>,
}

struct Fetched {
    tick: u64,
    bytes: Vec<u8>,
}
static EPOCH: OnceLock<Instant> = OnceLock::new();

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

/// A call's result: the error is the status to return, its message
/// already stored as this thread's last error.
pub type Res<T> = Result<T, rc_status>;

/// Stores `message` as this thread's last error and returns `code`.
pub fn fail(code: rc_status, message: impl Into<String>) -> rc_status {
    let message = message.into();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    code
}

/// Copies this thread's last error message into `buf` (NUL-terminated,
/// cut to fit) and returns its full length in bytes, without the NUL.
pub fn last_error(buf: &mut [u8]) -> usize {
    LAST_ERROR.with(|e| {
        let e = e.borrow();
        if let Some(room) = buf.len().checked_sub(1) {
            let n = e.len().min(room);
            buf[..n].copy_from_slice(&e.as_bytes()[..n]);
            buf[n] = 0;
        }
        e.len()
    })
}

/// `(major << 16) | minor`.
pub fn version() -> u32 {
    (REFLECTOR_C_VERSION_MAJOR << 16) | REFLECTOR_C_VERSION_MINOR
}

fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Milliseconds of the library's monotonic clock (the time base of
/// `rc_update`).
pub fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn instant(now_ms: u64) -> Instant {
    let e = epoch();
    e.checked_add(Duration::from_millis(now_ms))
        .unwrap_or_else(Instant::now)
}

fn status_of(e: &Error) -> rc_status {
    match e {
        Error::Socket { .. } => rc_status::RC_ERR_IO,
        Error::Resolve { .. } => rc_status::RC_ERR_RESOLVE,
        Error::Control(_) => rc_status::RC_ERR_CONTROL,
        Error::JoinRefused { .. } => rc_status::RC_ERR_JOIN_REFUSED,
        Error::NoSuchGroup { .. } | Error::BadCertificate { .. } => rc_status::RC_ERR_INVALID_ARGUMENT,
    }
}

fn client_error(e: &Error) -> rc_status {
    fail(status_of(e), e.to_string())
}

fn bad_handle(h: rc_handle, e: HandleError) -> rc_status {
    match e {
        HandleError::Bad => fail(
            rc_status::RC_ERR_BAD_HANDLE,
            format!("handle {h:#x} is not a live client (never made, or already freed)"),
        ),
        HandleError::Full => fail(
            rc_status::RC_ERR_TABLE_FULL,
            format!("{RC_MAX_CLIENTS} clients are live already; free some"),
        ),
    }
}

/// A token handed in, from its parts.
pub struct TokenParts<'a> {
    pub token: &'a [u8],
    pub session_key: &'a [u8],
    pub player: u32,
    pub group: u16,
    pub reflector: &'a str,
    pub expires_unix_s: u64,
}

fn token(p: &TokenParts<'_>) -> Res<Token> {
    let arg = |what: &str, len: usize, want: usize| {
        fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            format!("{what} is {len} bytes; it must be {want}"),
        )
    };
    let token = p
        .token
        .try_into()
        .map_err(|_| arg("the token", p.token.len(), RC_TOKEN_LEN))?;
    let session_key = p
        .session_key
        .try_into()
        .map_err(|_| arg("the session key", p.session_key.len(), RC_SESSION_KEY_LEN))?;
    if p.reflector.is_empty() {
        return Err(fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            "the reflector address is empty (want host:port)",
        ));
    }
    Ok(Token {
        reflector: p.reflector.to_string(),
        group: p.group,
        player: p.player,
        token,
        session_key,
        expires_unix_s: p.expires_unix_s,
        keys: Vec::new(),
    })
}

fn config(source: TokenSource, local: Option<&str>) -> Config {
    let mut cfg = Config::new(source);
    if let Some(local) = local {
        cfg.local = local.to_string();
    }
    cfg
}

fn start(cfg: Config) -> Res<rc_handle> {
    let control = matches!(cfg.token, TokenSource::Control(_));
    // The clock's epoch is taken before any client exists, so every
    // `rc_now_ms()` value maps to an instant after the client started.
    epoch();
    let client = Client::new(cfg).map_err(|e| client_error(&e))?;
    let inserted = lock(&CLIENTS).insert(Entry {
        client,
        fetched: None,
        control,
        area: Vec::new(),
    });
    inserted.map_err(|e| bad_handle(0, e))
}

/// A client with a token handed in; `local` is the address to bind
/// (`None`: any).
pub fn new_with_token(p: &TokenParts<'_>, local: Option<&str>) -> Res<rc_handle> {
    start(config(TokenSource::Given(token(p)?), local))
}

/// What a client that asks the control server needs.
pub struct ControlParts<'a> {
    pub url: &'a str,
    pub ticket: Option<&'a str>,
    pub player: u32,
    pub x: f64,
    pub y: f64,
    pub ca_file: Option<&'a str>,
    pub allow_plain_http: bool,
}

fn control(p: &ControlParts<'_>) -> TokenSource {
    let mut c = ControlServer::new(p.url, p.player, (p.x, p.y));
    c.ticket = p.ticket.map(str::to_string);
    c.ca_file = p.ca_file.map(Into::into);
    c.allow_plain_http = p.allow_plain_http;
    TokenSource::Control(c)
}

/// A client that gets its tokens from the control server.
pub fn new_control(p: &ControlParts<'_>, local: Option<&str>) -> Res<rc_handle> {
    start(config(control(p), local))
}

fn bad_config(cfg: rc_config, e: HandleError) -> rc_status {
    match e {
        HandleError::Bad => fail(
            rc_status::RC_ERR_BAD_HANDLE,
            format!("handle {cfg:#x} is not a live config (never made, already freed, or a client's)"),
        ),
        HandleError::Full => fail(
            rc_status::RC_ERR_TABLE_FULL,
            format!("{RC_MAX_CONFIGS} configs are live already; free some"),
        ),
    }
}

/// Runs `f` on the config behind `cfg`, holding its lock.
fn with_config<R>(cfg: rc_config, f: impl FnOnce(&mut Config) -> Res<R>) -> Res<R> {
    let entry = lock(&CONFIGS).get(cfg).map_err(|e| bad_config(cfg, e))?;
    let mut c = lock(&entry);
    f(&mut c)
}

/// A config for a client that gets its tokens from the control server,
/// with what `new_control` takes; its setters add the rest.
pub fn config_new_control(p: &ControlParts<'_>, local: Option<&str>) -> Res<rc_config> {
    let inserted = lock(&CONFIGS).insert(config(control(p), local));
    inserted.map_err(|e| bad_config(0, e))
}

/// The area of interest, in cells around the player's (0: its cell only).
/// Not for a config handed its tokens (1.8): its game hands the area in.
pub fn config_set_area_radius(cfg: rc_config, radius: u8) -> Res<()> {
    with_config(cfg, |c| match c.token {
        TokenSource::Control(_) => {
            c.area_radius = radius;
            Ok(())
        }
        TokenSource::Given(_) | TokenSource::Later => Err(fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            "this config is handed its tokens: the game hands its area in (rc_area_add_token, rc_set_area)",
        )),
    })
}

/// One more control server of the same world, tried after those before it:
/// for a config handed its tokens (1.8), one more for `/keys`, after the
/// keys_from URL (checked as it is).
pub fn config_add_fallback_url(cfg: rc_config, url: &str) -> Res<()> {
    if url.is_empty() {
        return Err(fail(rc_status::RC_ERR_INVALID_ARGUMENT, "the fallback URL is empty"));
    }
    with_config(cfg, |c| match (&mut c.token, &mut c.keys_from) {
        (TokenSource::Control(control), _) => {
            control.fallback_urls.push(url.to_string());
            Ok(())
        }
        (TokenSource::Given(_) | TokenSource::Later, Some(keys_from)) => {
            keys_url(url, "the fallback URL", keys_from.allow_plain_http)?;
            keys_from.fallback_urls.push(url.to_string());
            Ok(())
        }
        (TokenSource::Given(_) | TokenSource::Later, None) => Err(fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            "this config is handed its tokens and names no control server for /keys yet: \
             rc_config_set_keys_from first, then its fallbacks",
        )),
    })
}

/// A client started from a copy of the config (which stays live).
pub fn client_new_from_config(cfg: rc_config) -> Res<rc_handle> {
    let c = with_config(cfg, |c| Ok(c.clone()))?;
    start(c)
}

/// Frees a config (clients made from it keep their copy).
pub fn config_free(cfg: rc_config) -> Res<()> {
    let entry = lock(&CONFIGS).remove(cfg).map_err(|e| bad_config(cfg, e))?;
    drop(entry);
    Ok(())
}

/// Live configs (for tests and leak checks).
pub fn live_configs() -> usize {
    lock(&CONFIGS).len()
}

/// Runs `f` on the client behind `h`, holding that client's lock (not
/// the table's).
fn with<R>(h: rc_handle, f: impl FnOnce(&mut Client) -> Res<R>) -> Res<R> {
    with_entry(h, |e| f(&mut e.client))
}

/// `with` for the whole entry.
fn with_entry<R>(h: rc_handle, f: impl FnOnce(&mut Entry) -> Res<R>) -> Res<R> {
    let entry = lock(&CLIENTS).get(h).map_err(|e| bad_handle(h, e))?;
    let mut e = lock(&entry);
    f(&mut e)
}

/// Frees a client (it leaves its group first). The handle is dead after.
pub fn free(h: rc_handle) -> Res<()> {
    let entry = lock(&CLIENTS).remove(h).map_err(|e| bad_handle(h, e))?;
    drop(entry);
    Ok(())
}

/// Live clients (for tests and leak checks).
pub fn live() -> usize {
    lock(&CLIENTS).len()
}

pub fn update(h: rc_handle, now_ms: u64) -> Res<()> {
    with(h, |c| {
        c.update(instant(now_ms));
        Ok(())
    })
}

fn reason(r: RejoinReason) -> rc_rejoin_reason {
    match r {
        RejoinReason::NotMember => rc_rejoin_reason::RC_REJOIN_NOT_MEMBER,
        RejoinReason::ReflectorSilent => rc_rejoin_reason::RC_REJOIN_REFLECTOR_SILENT,
        RejoinReason::Refused => rc_rejoin_reason::RC_REJOIN_REFUSED,
        RejoinReason::NewGroup => rc_rejoin_reason::RC_REJOIN_NEW_GROUP,
    }
}

/// The header's form of an event. An error event's message becomes this
/// thread's last error.
pub fn event(e: Event) -> rc_event {
    use rc_event_kind::*;
    let mut out = rc_event::NONE;
    match e {
        Event::Joined { group, members, rejoin } => {
            out.kind = RC_EVENT_JOINED;
            out.group = group;
            out.members = members;
            out.rejoin = u8::from(rejoin);
        }
        Event::Rejoining { group, reason: r } => {
            out.kind = RC_EVENT_REJOINING;
            out.group = group;
            out.reason = reason(r);
        }
        Event::Renewed { group, expires_unix_s } => {
            out.kind = RC_EVENT_RENEWED;
            out.group = group;
            out.expires_unix_s = expires_unix_s;
        }
        Event::TokenRequested => out.kind = RC_EVENT_TOKEN_REQUESTED,
        Event::TokenNeeded => out.kind = RC_EVENT_TOKEN_NEEDED,
        Event::SenderHeard { player, instance } => {
            out.kind = RC_EVENT_SENDER_HEARD;
            out.player = player;
            out.instance = instance;
        }
        Event::SenderSilent { player, instance } => {
            out.kind = RC_EVENT_SENDER_SILENT;
            out.player = player;
            out.instance = instance;
        }
        Event::Left => out.kind = RC_EVENT_LEFT,
        Event::Moved { from, to } => {
            out.kind = RC_EVENT_MOVED;
            out.group = to;
            out.from_group = from;
        }
        Event::LeftGroup { group } => {
            out.kind = RC_EVENT_LEFT_GROUP;
            out.group = group;
        }
        Event::MoveAsked {
            group,
            reason,
            within_ms,
        } => {
            out.kind = RC_EVENT_MOVE_ASKED;
            out.group = group;
            out.move_reason = reason;
            out.within_ms = within_ms;
        }
        Event::Error(e) => {
            out.kind = RC_EVENT_ERROR;
            out.error = client_error(&e);
        }
    }
    out
}

/// The next event, or `None`.
pub fn poll_event(h: rc_handle) -> Res<Option<rc_event>> {
    with(h, |c| Ok(c.poll_event().map(event)))
}

/// The next datagram copied into `buf` (cut to fit, said in the info),
/// or `None`.
pub fn recv(h: rc_handle, buf: &mut [u8]) -> Res<Option<rc_datagram_info>> {
    with(h, |c| {
        Ok(c.recv().map(|d| {
            let n = d.payload.len().min(buf.len());
            buf[..n].copy_from_slice(&d.payload[..n]);
            rc_datagram_info {
                group: d.group,
                sender: d.sender,
                instance: d.instance,
                seq: d.seq,
                len: d.payload.len(),
                truncated: u8::from(n < d.payload.len()),
            }
        }))
    })
}

/// Sends `data` to the group; its sequence number.
pub fn send(h: rc_handle, data: &[u8]) -> Res<u64> {
    with(h, |c| {
        c.send(data).map_err(|e| {
            let code = match e {
                SendError::TooLarge { .. } => rc_status::RC_ERR_TOO_LARGE,
                SendError::NotMember => rc_status::RC_ERR_NOT_MEMBER,
                SendError::Io(_) => rc_status::RC_ERR_IO,
                // A code a caller of any 1.x minor version knows (rc_send
                // is older than sealing); the message says which case.
                SendError::NoSealingKey { .. } | SendError::SealedWithoutInstance { .. } => {
                    rc_status::RC_ERR_WRONG_STATE
                }
            };
            fail(code, e.to_string())
        })
    })
}

fn us(d: Option<Duration>) -> u64 {
    d.map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

pub fn stats(h: rc_handle) -> Res<rc_client_stats> {
    with(h, |c| {
        let s = c.stats();
        Ok(rc_client_stats {
            data_sent: s.data_sent,
            bytes_sent: s.bytes_sent,
            data_received: s.data_received,
            bytes_received: s.bytes_received,
            duplicates: s.streams.duplicates,
            reordered: s.streams.reordered,
            gaps: s.streams.gaps,
            too_late: s.streams.too_late,
            inbox_full: s.inbox_full,
            rtt_last_us: us(s.rtt_last),
            rtt_smoothed_us: us(s.rtt_smoothed),
            rtt_min_us: us(s.rtt_min),
            joins: s.joins,
            rejoins: s.rejoins,
            renewals: s.renewals,
            token_requests: s.token_requests,
        })
    })
}

/// The largest payload `send` takes now (0 while not a member).
pub fn max_payload(h: rc_handle) -> Res<usize> {
    with(h, |c| Ok(c.max_payload().unwrap_or(0)))
}

pub fn is_member(h: rc_handle) -> Res<bool> {
    with(h, |c| Ok(c.is_member()))
}

/// The group the client is in (`None` while not a member).
pub fn group(h: rc_handle) -> Res<Option<u16>> {
    with(h, |c| Ok(c.group()))
}

/// The group `send` goes to now (`None` while it has none).
pub fn sending_group(h: rc_handle) -> Res<Option<u16>> {
    with(h, |c| Ok(c.sending_group()))
}

/// The groups the client is a member of, copied into `buf` as far as it
/// holds them; how many there are.
pub fn member_groups(h: rc_handle, buf: &mut [u16]) -> Res<usize> {
    with(h, |c| {
        let mut n = 0;
        for g in c.member_groups() {
            if let Some(slot) = buf.get_mut(n) {
                *slot = g;
            }
            n += 1;
        }
        Ok(n)
    })
}

/// The player moved to (`x`, `y`): the area there is asked for.
pub fn set_position(h: rc_handle, x: f64, y: f64) -> Res<()> {
    if !(x.is_finite() && y.is_finite()) {
        return Err(fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            format!("the position ({x}, {y}) is not finite"),
        ));
    }
    with_entry(h, |e| {
        if e.client.set_position((x, y)) {
            return Ok(());
        }
        Err(fail(
            rc_status::RC_ERR_WRONG_STATE,
            if e.control {
                "the client has left (rc_leave): it moves no more"
            } else {
                "this client is handed its tokens: the game asks for the area at the new position itself"
            },
        ))
    })
}

/// The client's instance id.
pub fn instance(h: rc_handle) -> Res<u64> {
    with(h, |c| Ok(c.instance()))
}

pub fn leave(h: rc_handle) -> Res<()> {
    with(h, |c| {
        c.leave();
        Ok(())
    })
}

pub fn set_token(h: rc_handle, p: &TokenParts<'_>) -> Res<()> {
    let t = token(p)?;
    with(h, |c| c.set_token(t).map_err(|e| client_error(&e)))
}

/// Adds one token to the area being handed in (`rc_area_add_token`). A
/// refused token empties the area being added: the game starts it again,
/// and a half-added area is never handed in by mistake.
pub fn area_add_token(h: rc_handle, p: &TokenParts<'_>) -> Res<()> {
    with_entry(h, |e| {
        let added = check_area_token(&e.area, p);
        match added {
            Ok(t) => {
                e.area.push(t);
                Ok(())
            }
            Err(status) => {
                e.area.clear();
                Err(status)
            }
        }
    })
}

fn check_area_token(area: &[Token], p: &TokenParts<'_>) -> Res<Token> {
    let t = token(p)?;
    let invalid = |m: String| fail(rc_status::RC_ERR_INVALID_ARGUMENT, m);
    if area.len() >= RC_MAX_AREA_TOKENS {
        return Err(invalid(format!(
            "an area has at most {RC_MAX_AREA_TOKENS} tokens; the area being added was dropped"
        )));
    }
    if let Some(first) = area.first() {
        if first.player != t.player {
            return Err(invalid(format!(
                "the area's tokens are for player {}, this one for {}; the area being added was dropped",
                first.player, t.player
            )));
        }
    }
    if area.iter().any(|a| a.group == t.group && a.reflector == t.reflector) {
        return Err(invalid(format!(
            "group {} at {} is in the area already; the area being added was dropped",
            t.group, t.reflector
        )));
    }
    Ok(t)
}

/// Hands in the tokens added since the last call (`rc_set_area`); they are
/// taken whatever the outcome.
pub fn set_area(h: rc_handle) -> Res<()> {
    with_entry(h, |e| {
        let mut tokens = std::mem::take(&mut e.area).into_iter();
        let Some(cell) = tokens.next() else {
            return Err(fail(
                rc_status::RC_ERR_WRONG_STATE,
                "no token was added since the last rc_set_area (rc_area_add_token first)",
            ));
        };
        let area = AreaTokens {
            cell,
            area: tokens.collect(),
        };
        e.client.set_area_tokens(area).map_err(|err| client_error(&err))
    })
}

pub fn rebind(h: rc_handle) -> Res<()> {
    with(h, |c| c.rebind().map(drop).map_err(|e| client_error(&e)))
}

/// The status a checkpoint failure is reported as.
pub fn checkpoint_status(e: &CheckpointError) -> rc_status {
    match e {
        CheckpointError::NotMember => rc_status::RC_ERR_NOT_MEMBER,
        CheckpointError::NoChannel => rc_status::RC_ERR_NO_CHANNEL,
        CheckpointError::NotRequested => rc_status::RC_ERR_NOT_REQUESTED,
        CheckpointError::InFlight(_) => rc_status::RC_ERR_IN_FLIGHT,
        CheckpointError::Io { .. } | CheckpointError::Closed { .. } => rc_status::RC_ERR_IO,
        CheckpointError::TimedOut { .. } => rc_status::RC_ERR_TIMED_OUT,
        CheckpointError::Refused { .. } | CheckpointError::Unauthenticated { .. } => rc_status::RC_ERR_REFUSED,
        CheckpointError::TooLarge { .. } => rc_status::RC_ERR_TOO_LARGE,
        CheckpointError::Malformed { .. }
        | CheckpointError::Version { .. }
        | CheckpointError::BadMac { .. }
        | CheckpointError::Mismatch { .. }
        | CheckpointError::Unexpected { .. }
        // 1.5 reported these as RC_ERR_PROTOCOL (then folded into
        // Mismatch); the check itself is the event's `check` (1.6).
        | CheckpointError::JoinerRefused { .. } => rc_status::RC_ERR_PROTOCOL,
    }
}

fn checkpoint_error(e: &CheckpointError) -> rc_status {
    fail(checkpoint_status(e), e.to_string())
}

fn checkpoint_op(op: CheckpointOp) -> rc_checkpoint_op {
    match op {
        CheckpointOp::Upload => rc_checkpoint_op::RC_CHECKPOINT_OP_UPLOAD,
        CheckpointOp::Fetch => rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH,
        CheckpointOp::FetchOther => rc_checkpoint_op::RC_CHECKPOINT_OP_FETCH_OTHER,
    }
}

/// The header's form of a checkpoint event; a READY's state moves into
/// `fetched` (replacing one not taken), a FAILED's message becomes this
/// thread's last error.
fn checkpoint_event(e: CheckpointEvent, fetched: &mut Option<Fetched>) -> rc_checkpoint_event {
    use rc_checkpoint_kind::*;
    let mut out = rc_checkpoint_event::NONE;
    match e {
        CheckpointEvent::Requested { group } => {
            out.kind = RC_CHECKPOINT_REQUESTED;
            out.group = group;
        }
        CheckpointEvent::Uploaded { group, number, tick } => {
            out.kind = RC_CHECKPOINT_UPLOADED;
            out.group = group;
            out.number = number;
            out.tick = tick;
        }
        CheckpointEvent::Checkpoint {
            group,
            op,
            number,
            tick,
            from_player,
            age_ms,
            bytes,
            verification,
        } => {
            out.kind = RC_CHECKPOINT_READY;
            out.verification = match verification {
                Verification::Clear => RC_VERIFICATION_CLEAR,
                Verification::SignedByOne { .. } => RC_VERIFICATION_SIGNED,
                Verification::VerifiedByTwo { .. } => RC_VERIFICATION_VERIFIED_BY_TWO,
                Verification::Disagree { .. } => RC_VERIFICATION_DISAGREE,
            };
            out.group = group;
            out.op = checkpoint_op(op);
            out.number = number;
            out.tick = tick;
            out.from_player = from_player;
            out.age_ms = age_ms;
            out.len = bytes.len();
            *fetched = Some(Fetched { tick, bytes });
        }
        CheckpointEvent::Empty { group, op } => {
            out.kind = RC_CHECKPOINT_EMPTY;
            out.group = group;
            out.op = checkpoint_op(op);
        }
        CheckpointEvent::Failed { group, op, reason } => {
            out.kind = RC_CHECKPOINT_FAILED;
            out.group = group;
            out.op = checkpoint_op(op);
            out.refusal = reason.refusal().map_or(0, |r| r as u8);
            out.check = reason.joiner_refusal().map_or(RC_CHECK_NONE, check_code);
            out.error = checkpoint_error(&reason);
        }
    }
    out
}

/// The next checkpoint event, or `None`.
pub fn poll_checkpoint(h: rc_handle) -> Res<Option<rc_checkpoint_event>> {
    with_entry(h, |e| {
        let ev = e.client.poll_checkpoint();
        Ok(ev.map(|ev| checkpoint_event(ev, &mut e.fetched)))
    })
}

/// Answers the pending request with `state` (copied) at `tick`.
pub fn provide_checkpoint(h: rc_handle, tick: u64, state: &[u8]) -> Res<()> {
    with(h, |c| {
        c.provide_checkpoint(tick, state.to_vec())
            .map_err(|e| checkpoint_error(&e))
    })
}

/// Starts a fetch of the group's latest checkpoint.
pub fn fetch_checkpoint(h: rc_handle) -> Res<()> {
    with(h, |c| c.fetch_checkpoint().map_err(|e| checkpoint_error(&e)))
}

/// Starts a fetch of the other checkpoint the reflector keeps (1.4).
pub fn fetch_checkpoint_other(h: rc_handle) -> Res<()> {
    with(h, |c| c.fetch_checkpoint_other().map_err(|e| checkpoint_error(&e)))
}

/// What `checkpoint_take` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// No state is waiting.
    Nothing,
    /// The buffer is too small for the state of `len` bytes (kept).
    TooSmall { len: usize, tick: u64 },
    /// The state's `len` bytes were copied and let go.
    Copied { len: usize, tick: u64 },
}

/// Copies the waiting state into `buf` if it fits (and lets it go).
pub fn checkpoint_take(h: rc_handle, buf: &mut [u8]) -> Res<Take> {
    with_entry(h, |e| {
        let Some(f) = e.fetched.as_ref() else {
            return Ok(Take::Nothing);
        };
        let (len, tick) = (f.bytes.len(), f.tick);
        if len > buf.len() {
            return Ok(Take::TooSmall { len, tick });
        }
        buf[..len].copy_from_slice(&f.bytes);
        e.fetched = None;
        Ok(Take::Copied { len, tick })
    })
}

/// Sets the checkpoint settings; 0 keeps the timeout or bound as it is.
pub fn checkpoint_configure(h: rc_handle, fetch_on_join: bool, timeout_ms: u64, max_bytes: u64) -> Res<()> {
    with(h, |c| {
        let (_, timeout, max) = c.checkpoint_config();
        let timeout = if timeout_ms == 0 {
            timeout
        } else {
            Duration::from_millis(timeout_ms)
        };
        let max = if max_bytes == 0 { max } else { max_bytes };
        c.set_checkpoint_config(fetch_on_join, timeout, max);
        Ok(())
    })
}

pub fn sealing_stats(h: rc_handle) -> Res<rc_sealing_counters> {
    with(h, |c| {
        let s = c.stats();
        Ok(rc_sealing_counters {
            malformed: s.sealed_malformed,
            version: s.sealed_version,
            no_key: s.sealed_no_key,
            replay: s.sealed_replay,
            bad: s.sealed_bad,
            keys_requests: s.keys_requests,
            keys_refreshes: s.keys_refreshes,
            keys_refresh_failures: s.keys_refresh_failures,
            checkpoint_malformed: s.checkpoint_malformed,
            checkpoint_version: s.checkpoint_version,
            checkpoint_wrong_cell: s.checkpoint_wrong_cell,
            checkpoint_mismatch: s.checkpoint_mismatch,
            checkpoint_bad_certificate: s.checkpoint_bad_certificate,
            checkpoint_expired_certificate: s.checkpoint_expired_certificate,
            checkpoint_bad_signature: s.checkpoint_bad_signature,
            checkpoint_no_key: s.checkpoint_no_key,
            checkpoint_bad: s.checkpoint_bad,
        })
    })
}

pub fn sealing_duplicates(h: rc_handle) -> Res<u64> {
    with(h, |c| Ok(c.stats().sealed_duplicate))
}

pub fn checkpoint_stats(h: rc_handle) -> Res<rc_checkpoint_counters> {
    with(h, |c| {
        let s = c.stats();
        Ok(rc_checkpoint_counters {
            requested: s.checkpoints_requested,
            uploaded: s.checkpoints_uploaded,
            fetched: s.checkpoints_fetched,
            failures: s.checkpoint_failures,
        })
    })
}

// ---- Handed-in sealing (since 1.6) -------------------------------------

/// A client handed its tokens that has none yet (`rc_client_new_handed_in`):
/// it sends nothing until `rc_set_token` or `rc_set_area`, and its signing
/// key is there at once for the game's first `/join`.
pub fn new_handed_in(local: Option<&str>) -> Res<rc_handle> {
    start(config(TokenSource::Later, local))
}

/// The client's checkpoint signing key (`sign_key` of a `/join`).
pub fn sign_key(h: rc_handle) -> Res<[u8; RC_SIGN_KEY_LEN]> {
    with(h, |c| Ok(c.checkpoint_signing_key()))
}

/// The `RC_CHECK_*` value of a joiner's refusal.
fn check_code(r: CheckpointRefusal) -> u8 {
    use CheckpointRefusal as R;
    match r {
        R::Malformed => RC_CHECK_MALFORMED,
        R::Version => RC_CHECK_VERSION,
        R::WrongCell => RC_CHECK_WRONG_CELL,
        R::Mismatch => RC_CHECK_MISMATCH,
        R::BadCertificate => RC_CHECK_BAD_CERTIFICATE,
        R::ExpiredCertificate => RC_CHECK_EXPIRED_CERTIFICATE,
        R::BadSignature => RC_CHECK_BAD_SIGNATURE,
        R::NoKey => RC_CHECK_NO_KEY,
        R::Bad => RC_CHECK_BAD,
    }
}

/// The name of an `RC_CHECK_*` value (the document's, and its counter's),
/// NUL-terminated; `None` for 0 and values this library does not know.
pub fn check_name(check: u8) -> Option<&'static std::ffi::CStr> {
    let r = CheckpointRefusal::ALL.into_iter().find(|&r| check_code(r) == check)?;
    Some(match r {
        CheckpointRefusal::Malformed => c"checkpoint_malformed",
        CheckpointRefusal::Version => c"checkpoint_version",
        CheckpointRefusal::WrongCell => c"checkpoint_wrong_cell",
        CheckpointRefusal::Mismatch => c"checkpoint_mismatch",
        CheckpointRefusal::BadCertificate => c"checkpoint_bad_certificate",
        CheckpointRefusal::ExpiredCertificate => c"checkpoint_expired_certificate",
        CheckpointRefusal::BadSignature => c"checkpoint_bad_signature",
        CheckpointRefusal::NoKey => c"checkpoint_no_key",
        CheckpointRefusal::Bad => c"checkpoint_bad",
    })
}

/// The keys of `rc_set_epoch_keys`, checked (each refusal names the key
/// by its index and what is wrong) before anything is handed in.
fn epoch_keys(keys: &[rc_epoch_key]) -> Res<Vec<CellKey>> {
    let invalid = |m: String| fail(rc_status::RC_ERR_INVALID_ARGUMENT, m);
    if keys.is_empty() {
        return Err(invalid(
            "no epoch key given (n is 0): hand in the keys entries of the group's /join answer".into(),
        ));
    }
    if keys.len() > RC_MAX_EPOCH_KEYS {
        return Err(invalid(format!(
            "{} epoch keys given; at most {RC_MAX_EPOCH_KEYS} (RC_MAX_EPOCH_KEYS) at once",
            keys.len()
        )));
    }
    keys.iter()
        .enumerate()
        .map(|(i, k)| {
            if k.reserved != 0 {
                return Err(invalid(format!(
                    "epoch key {i}: reserved is {:#x}; it must be 0",
                    k.reserved
                )));
            }
            CellKey::new(
                [k.cell_x, k.cell_y],
                k.cell_id,
                k.epoch,
                k.key,
                k.starts_unix_s,
                k.ends_unix_s,
            )
            .map_err(|e| invalid(format!("epoch key {i}: {e}")))
        })
        .collect()
}

/// Hands in epoch keys for `group` (`rc_set_epoch_keys`).
pub fn set_epoch_keys(h: rc_handle, group: u16, keys: &[rc_epoch_key]) -> Res<()> {
    let keys = epoch_keys(keys)?;
    with(h, |c| c.set_epoch_keys(group, &keys).map_err(|e| client_error(&e)))
}

/// Hands in `group`'s checkpoint certificate (`rc_set_checkpoint_certificate`):
/// the lengths checked first, each refusal naming the argument.
pub fn set_checkpoint_certificate(
    h: rc_handle,
    group: u16,
    control_public: &[u8],
    certificate: &[u8],
    expires_unix_s: u64,
) -> Res<()> {
    let arg = |what: &str, len: usize, want: usize, name: &str| {
        fail(
            rc_status::RC_ERR_INVALID_ARGUMENT,
            format!("{what} is {len} bytes; it must be {want} ({name}): the /join answer's hex, decoded"),
        )
    };
    let cp: [u8; RC_SIGN_KEY_LEN] = control_public.try_into().map_err(|_| {
        arg(
            "control_public",
            control_public.len(),
            RC_SIGN_KEY_LEN,
            "RC_SIGN_KEY_LEN",
        )
    })?;
    let cert: [u8; RC_CERTIFICATE_LEN] = certificate.try_into().map_err(|_| {
        arg(
            "the certificate",
            certificate.len(),
            RC_CERTIFICATE_LEN,
            "RC_CERTIFICATE_LEN",
        )
    })?;
    with(h, |c| {
        c.set_checkpoint_certificate(group, cp, cert, expires_unix_s)
            .map_err(|e| client_error(&e))
    })
}

// ---- Keys from a control server, tokens handed in (since 1.8) ----------

/// A config for a client handed its tokens (`rc_config_new_handed_in`):
/// the client it makes is `new_handed_in`'s, with the config's settings.
pub fn config_new_handed_in(local: Option<&str>) -> Res<rc_config> {
    let inserted = lock(&CONFIGS).insert(config(TokenSource::Later, local));
    inserted.map_err(|e| bad_config(0, e))
}

/// A URL `/keys` may go to: `https://`, or `http://` with consent. `what`
/// names it in the refusal ("the keys_from URL", "the fallback URL").
fn keys_url(url: &str, what: &str, allow_plain_http: bool) -> Res<()> {
    let invalid = |m: String| fail(rc_status::RC_ERR_INVALID_ARGUMENT, m);
    if url.is_empty() {
        return Err(invalid(format!(
            "{what} is empty: want https://host:port of the control server that hands out the world's keys"
        )));
    }
    if url.starts_with("https://") {
        return Ok(());
    }
    if url.starts_with("http://") {
        if allow_plain_http {
            return Ok(());
        }
        return Err(invalid(format!(
            "refusing plain HTTP to {url} ({what}): the token and the epoch keys of every /keys answer would \
             cross the network in clear; use https://, or allow_plain_http for a closed lab"
        )));
    }
    Err(invalid(format!("{what} {url} is neither https:// nor http://")))
}

/// Names the control server a config handed its tokens asks `/keys`
/// (`rc_config_set_keys_from`): every argument checked before anything
/// is set; a second call names another (its fallbacks dropped).
pub fn config_set_keys_from(cfg: rc_config, url: &str, ca_file: Option<&str>, allow_plain_http: bool) -> Res<()> {
    let invalid = |m: String| fail(rc_status::RC_ERR_INVALID_ARGUMENT, m);
    keys_url(url, "the keys_from URL", allow_plain_http)?;
    if let Some(path) = ca_file {
        if path.is_empty() {
            return Err(invalid(
                "ca_file is empty: a PEM file of the control server's CA, or NULL for the usual roots".into(),
            ));
        }
        // Read now, not at the first /keys minutes later: a missing file
        // is the game's to fix, and said where the game made the call.
        if let Err(e) = std::fs::read(path) {
            return Err(invalid(format!("cannot read the CA file {path}: {e}")));
        }
    }
    with_config(cfg, |c| match c.token {
        TokenSource::Given(_) | TokenSource::Later => {
            let mut server = ControlServer::new(url, 0, (0.0, 0.0));
            server.ca_file = ca_file.map(Into::into);
            server.allow_plain_http = allow_plain_http;
            c.keys_from = Some(server);
            Ok(())
        }
        TokenSource::Control(_) => Err(invalid(
            "this config asks the control server for its tokens and refreshes its keys there: keys_from is for \
             a config of a client handed its tokens (rc_config_new_handed_in)"
                .into(),
        )),
    })
}

// ---- End of keys from a control server ---------------------------------
