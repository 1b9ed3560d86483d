//! The types and constants the C header declares. Plain data: the FFI
//! layer (`ffi.rs`) only ever writes them for the caller, never reads one
//! the caller made, so no bit pattern from C is trusted as a Rust enum.

#![allow(non_camel_case_types, reason = "C names, as they appear in the header")]

/// Major version of the C ABI; `rc_version()` returns it in its top 16 bits.
/// A program built against one major version must not load another.
pub const REFLECTOR_C_VERSION_MAJOR: u32 = 1;
/// Minor version: additions only. New functions, types, status codes and
/// event kinds; no function that exists changes its arguments, and no
/// struct that exists changes its size or the offset of a field (a new
/// field may only take bytes that were padding, checked at compile time).
/// What a client is configured with is never a struct the caller fills:
/// it is arguments, or setters on an `rc_config` handle (1.2), so a new
/// setting is a new function and old callers' structs never grow. A
/// caller ignores event kinds it does not know; a status code new in a
/// minor version comes only from that version's functions.
/// 1.1 added checkpoints (`rc_poll_checkpoint` and the functions after
/// it; the status codes from `RC_ERR_BUFFER_TOO_SMALL` on). 1.2 added
/// areas of interest and control server lists: `rc_config` and its
/// functions, `rc_set_position`, `rc_sending_group`, `rc_member_groups`,
/// `RC_EVENT_MOVED`, `RC_EVENT_LEFT_GROUP`, `rc_event.from_group`,
/// `RC_ERR_WRONG_STATE`, and the group in `RC_EVENT_REJOINING` and
/// `RC_EVENT_RENEWED`. 1.3 added an area's tokens handed in by the game:
/// `rc_area_add_token`, `rc_set_area` and `RC_MAX_AREA_TOKENS`. 1.4 added
/// the other checkpoint kept: `rc_fetch_checkpoint_other`,
/// `RC_CHECKPOINT_OP_FETCH_OTHER`, and `op` filled in READY and EMPTY
/// checkpoint events (which fetch they answer). 1.5 added sealed groups'
/// counters: `rc_sealing_stats` and `rc_sealing_counters` (a struct of its
/// own: `rc_client_stats` keeps its size), and `RC_ERR_WRONG_STATE` from
/// `rc_send` in a sealed group with no key held; and sealed checkpoints:
/// `rc_checkpoint_event.verification` (in 1.4's padding) with the
/// `RC_VERIFICATION_*` values, and the joiner's refusal counters
/// (`checkpoint_*` of `rc_sealing_counters`). 1.6 added what a game that
/// fetches its own tokens needs for sealed groups: a client made before
/// its first token (`rc_client_new_handed_in`), its signing key
/// (`rc_sign_key`), epoch keys and checkpoint certificates handed in
/// (`rc_set_epoch_keys` with `rc_epoch_key`, `rc_set_checkpoint_certificate`),
/// and the joiner's check that refused a fetched checkpoint
/// (`rc_checkpoint_event.check` in 1.5's padding, the `RC_CHECK_*`
/// values, `rc_check_name`). 1.7 added `rc_sealing_duplicates`: sealed
/// duplicate deliveries, counted apart from replays (a function of its
/// own: `rc_sealing_counters` keeps its size). 1.8 added `/keys` for a
/// client handed its tokens: a config for such a client
/// (`rc_config_new_handed_in`) and the control server it asks for its
/// next epoch keys (`rc_config_set_keys_from`; its fallbacks with
/// `rc_config_add_fallback_url`, which 1.7 refused on such a config, as no
/// 1.7 caller could make one).
pub const REFLECTOR_C_VERSION_MINOR: u32 = 8;

/// Bytes of a reflector token.
pub const RC_TOKEN_LEN: usize = 32;
/// Bytes of a session key.
pub const RC_SESSION_KEY_LEN: usize = 32;
/// The largest payload a DATA can carry (groups without instance ids); a
/// receive buffer this large never truncates. `rc_max_payload` tells the
/// limit of the group the client is in.
pub const RC_MAX_PAYLOAD: usize = 1440;

/// Live client handles at once, per process.
pub const RC_MAX_CLIENTS: usize = 4096;

/// Live config handles at once, per process. (Since 1.2.)
pub const RC_MAX_CONFIGS: usize = 1024;

/// Tokens of one area handed in at once: the player's cell and the 24
/// around it (an area of radius 2, the largest a control server grants).
/// (Since 1.3.)
pub const RC_MAX_AREA_TOKENS: usize = 25;

// ---- Handed-in sealing (since 1.6) -------------------------------------

/// Bytes of a client's checkpoint signing key (Ed25519, public half), what
/// `rc_sign_key` gives and a `/join` takes as `sign_key` (hex); also of the
/// control server's `control_public`. (Since 1.6.)
pub const RC_SIGN_KEY_LEN: usize = 32;
/// Bytes of a checkpoint certificate (the `/join` answer's `certificate`,
/// hex there). (Since 1.6.)
pub const RC_CERTIFICATE_LEN: usize = 64;
/// Bytes of an epoch key (`key` of a `keys` entry, hex there). (Since 1.6.)
pub const RC_EPOCH_KEY_LEN: usize = 32;
/// Bytes of a cell id (`cell_id` of a `keys` entry, hex there). (Since 1.6.)
pub const RC_CELL_ID_LEN: usize = 8;
/// Epoch keys one `rc_set_epoch_keys` takes: a group serves at most 64
/// cells under sealing, each with the current epoch's key and, inside the
/// overlap window, the next one's. (Since 1.6.)
pub const RC_MAX_EPOCH_KEYS: usize = 128;

/// One sealing epoch key as a `/join` answer's `keys` entry gives it, its
/// hex fields decoded: the game's backend fills one per entry, in the
/// answer's order, and hands them to `rc_set_epoch_keys` (keys carry no
/// length of their own: the arrays are the protocol's sizes). Its size (72
/// bytes) and layout never change; a later key format would be a new
/// struct with a new function. (Since 1.6.)
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rc_epoch_key {
    /// `cell[0]`: the cell's column.
    pub cell_x: u32,
    /// `cell[1]`: the cell's row.
    pub cell_y: u32,
    /// `epoch`.
    pub epoch: u32,
    /// Zero (a key with anything else here is refused, so a later version
    /// may give these bytes a meaning).
    pub reserved: u32,
    /// `cell_id`, decoded.
    pub cell_id: [u8; RC_CELL_ID_LEN],
    /// `key`, decoded.
    pub key: [u8; RC_EPOCH_KEY_LEN],
    /// `starts_unix_s`.
    pub starts_unix_s: u64,
    /// `ends_unix_s` (after `starts_unix_s`).
    pub ends_unix_s: u64,
}

// rc_epoch_key's size and layout are the ABI's for good, with no padding
// (so C, C#'s sequential layout and Python's ctypes agree byte for byte).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<rc_epoch_key>() == 72);
    assert!(offset_of!(rc_epoch_key, cell_id) == 16);
    assert!(offset_of!(rc_epoch_key, key) == 24);
    assert!(offset_of!(rc_epoch_key, starts_unix_s) == 56);
    assert!(offset_of!(rc_epoch_key, ends_unix_s) == 64);
};

const _: () = assert!(RC_SIGN_KEY_LEN == reflector_proto::sealed::checkpoint::PUBLIC_KEY_LEN);
const _: () = assert!(RC_CERTIFICATE_LEN == reflector_proto::sealed::checkpoint::SIGNATURE_LEN);
const _: () = assert!(RC_EPOCH_KEY_LEN == reflector_proto::sealed::KEY_LEN);
const _: () = assert!(RC_CELL_ID_LEN == reflector_proto::sealed::CELL_ID_LEN);

/// `rc_checkpoint_event.check`: no joiner's check refused (every event but
/// the FAILED fetch below, and from a library before 1.6). (Since 1.6.)
pub const RC_CHECK_NONE: u8 = 0;
/// A fetched sealed checkpoint is not a checkpoint envelope
/// (`checkpoint_malformed`). The `RC_CHECK_*` values follow the
/// document's order of the joiner's checks, as the `checkpoint_*`
/// counters of `rc_sealing_counters` do; `rc_check_name` names each.
pub const RC_CHECK_MALFORMED: u8 = 1;
/// An envelope version this library does not read (`checkpoint_version`).
pub const RC_CHECK_VERSION: u8 = 2;
/// Sealed for a cell that is not the group's: another group's (or
/// world's) checkpoint (`checkpoint_wrong_cell`).
pub const RC_CHECK_WRONG_CELL: u8 = 3;
/// The reflector's REPLY names another tick or uploader than the envelope
/// (`checkpoint_mismatch`).
pub const RC_CHECK_MISMATCH: u8 = 4;
/// The uploader's certificate does not verify under `control_public`
/// (`checkpoint_bad_certificate`).
pub const RC_CHECK_BAD_CERTIFICATE: u8 = 5;
/// The uploader's certificate had expired at the upload
/// (`checkpoint_expired_certificate`).
pub const RC_CHECK_EXPIRED_CERTIFICATE: u8 = 6;
/// The signature does not verify (`checkpoint_bad_signature`).
pub const RC_CHECK_BAD_SIGNATURE: u8 = 7;
/// No epoch key held for its cell and epoch: fetch again later
/// (`checkpoint_no_key`).
pub const RC_CHECK_NO_KEY: u8 = 8;
/// The state does not open under the group's key: garbage or forged
/// (`checkpoint_bad`).
pub const RC_CHECK_BAD: u8 = 9;

// ---- End of handed-in sealing ------------------------------------------

const _: () = assert!(RC_TOKEN_LEN == reflector_proto::auth::TOKEN_LEN);
const _: () = assert!(RC_SESSION_KEY_LEN == reflector_proto::protocol::SESSION_KEY_LEN);
const _: () = assert!(RC_MAX_PAYLOAD == reflector_client::MAX_PAYLOAD);

/// A client handle: a slot index and a generation in one number. 0 is
/// never a handle; a freed handle stays invalid (its slot's generation
/// moves on), so using it again returns `RC_ERR_BAD_HANDLE`.
pub type rc_handle = u64;

/// A client configuration handle (since 1.2): made by
/// `rc_config_new_control` (or, for a client handed its tokens,
/// `rc_config_new_handed_in`, 1.8), changed by its setters, read (copied) by
/// `rc_client_new_from_config`, freed by `rc_config_free`. Never 0, never
/// equal to a client handle (each is refused where the other is wanted),
/// dead once freed, as client handles are.
pub type rc_config = u64;

/// What every call returns. `RC_OK` and `RC_NONE` are not errors; every
/// negative value is, with a message from `rc_last_error`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_status {
    /// Done.
    RC_OK = 0,
    /// Nothing to give: no event (`rc_poll_event`), no datagram (`rc_recv`).
    RC_NONE = 1,
    /// A pointer that must not be NULL was.
    RC_ERR_NULL = -1,
    /// An argument is not usable (not UTF-8, a bad address, a bad length).
    RC_ERR_INVALID_ARGUMENT = -2,
    /// Not a live handle: never made, already freed, or 0.
    RC_ERR_BAD_HANDLE = -3,
    /// `rc_send` before the client is a member of a group.
    RC_ERR_NOT_MEMBER = -4,
    /// `rc_send` with a payload above `rc_max_payload`.
    RC_ERR_TOO_LARGE = -5,
    /// A socket call failed.
    RC_ERR_IO = -6,
    /// The reflector's address does not resolve.
    RC_ERR_RESOLVE = -7,
    /// The control server gave no token (see the message for why).
    RC_ERR_CONTROL = -8,
    /// The reflector refused the join.
    RC_ERR_JOIN_REFUSED = -9,
    /// A bug inside the library (a Rust panic, caught at the boundary).
    /// The handle it happened on should be freed.
    RC_ERR_PANIC = -10,
    /// Too many live handles.
    RC_ERR_TABLE_FULL = -11,
    /// `rc_checkpoint_take`'s buffer is smaller than the state; the size
    /// needed went to `*len_out` and the state is kept. (Since 1.1.)
    RC_ERR_BUFFER_TOO_SMALL = -12,
    /// `rc_provide_checkpoint` with no request pending (none came, or it
    /// was answered already). (Since 1.1.)
    RC_ERR_NOT_REQUESTED = -13,
    /// A checkpoint exchange of that kind (upload or fetch) is already
    /// under way; try again once its event came. (Since 1.1.)
    RC_ERR_IN_FLIGHT = -14,
    /// The group has no checkpoint channel (its reflector runs without
    /// one). (Since 1.1.)
    RC_ERR_NO_CHANNEL = -15,
    /// A checkpoint exchange did not end within its timeout. (Since 1.1.)
    RC_ERR_TIMED_OUT = -16,
    /// The reflector refused a checkpoint exchange: the event's `refusal`
    /// says why. (Since 1.1.)
    RC_ERR_REFUSED = -17,
    /// An answer on the checkpoint channel that cannot be trusted or does
    /// not fit the request (bad MAC, wrong digest, malformed): nothing in it
    /// was used. (Since 1.1.)
    RC_ERR_PROTOCOL = -18,
    /// The call does not apply to this client: `rc_set_position` on a
    /// client that is handed its tokens (its game asks for the area
    /// itself), or after `rc_leave`; `rc_send` in a sealed group while no
    /// sealing key is held for its cell (since 1.5; the message says so).
    /// Nothing was done. (Since 1.2.)
    RC_ERR_WRONG_STATE = -19,
}

/// What an `rc_event` is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_event_kind {
    /// No event (the struct is not filled).
    RC_EVENT_NONE = 0,
    /// A member of `group` (`members` in it, `rejoin` set if again).
    RC_EVENT_JOINED = 1,
    /// Joining `group` again with the token held, for `reason` (the group
    /// since 1.2; for `RC_REJOIN_NEW_GROUP`, the new group).
    RC_EVENT_REJOINING = 2,
    /// The membership of `group` now lasts until `expires_unix_s` (the
    /// group since 1.2: with an area, each group renewed says so).
    RC_EVENT_RENEWED = 3,
    /// Asking the control server for a token.
    RC_EVENT_TOKEN_REQUESTED = 4,
    /// Tokens are handed in and a new one is needed: `rc_set_token`.
    RC_EVENT_TOKEN_NEEDED = 5,
    /// The first DATA of `player` (`instance`), or the first since silent.
    RC_EVENT_SENDER_HEARD = 6,
    /// `player` (`instance`) has not been heard for a while.
    RC_EVENT_SENDER_SILENT = 7,
    /// The membership was left (`rc_leave`).
    RC_EVENT_LEFT = 8,
    /// Something failed: `error` says what kind, `rc_last_error` (on the
    /// thread that polled) the message.
    RC_EVENT_ERROR = 9,
    /// `rc_send` goes to `group` from now on, the player's new cell, whose
    /// JOIN_ACK has just come (a move, `rc_set_position`); it went to
    /// `from_group`. (Since 1.2.)
    RC_EVENT_MOVED = 10,
    /// `group`, out of the new area, was left (its LEAVE sent) once every
    /// group of the new area was a member (make-before-break); its DATA
    /// already on the way is still delivered for a moment. (Since 1.2.)
    RC_EVENT_LEFT_GROUP = 11,
    /// The reflector of `group` said (a MOVED under this client's key) that
    /// it stops serving the membership within `within_ms`, for
    /// `move_reason` (1 draining, 2 the cell placed elsewhere, 3 shutting
    /// down). A client made with a control server asks it where to go and
    /// joins there before it leaves (`RC_EVENT_MOVED`, `RC_EVENT_LEFT_GROUP`
    /// if the placement changed); one that is handed tokens gets
    /// `RC_EVENT_TOKEN_NEEDED`. (Since 1.2.)
    RC_EVENT_MOVE_ASKED = 12,
}

/// Why a client joins again (`RC_EVENT_REJOINING`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_rejoin_reason {
    RC_REJOIN_NONE = 0,
    /// The reflector said it does not know us.
    RC_REJOIN_NOT_MEMBER = 1,
    /// Nothing heard from the reflector for a few keepalive intervals.
    RC_REJOIN_REFLECTOR_SILENT = 2,
    /// The join was refused for something a retry may cure.
    RC_REJOIN_REFUSED = 3,
    /// A new token for another group.
    RC_REJOIN_NEW_GROUP = 4,
}

/// One event; which fields mean something depends on `kind`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rc_event {
    pub kind: rc_event_kind,
    /// JOINED, REJOINING, RENEWED, LEFT_GROUP: the group; MOVED: the group
    /// `rc_send` goes to now.
    pub group: u16,
    /// JOINED: members of the group at join time.
    pub members: u16,
    /// JOINED: 1 if this is a rejoin.
    pub rejoin: u8,
    /// MOVED: the group `rc_send` went to before. (Since 1.2, in what was
    /// padding: the struct's size and its other fields' offsets are 1.1's.)
    pub from_group: u16,
    /// REJOINING: why.
    pub reason: rc_rejoin_reason,
    /// SENDER_HEARD, SENDER_SILENT: the player.
    pub player: u32,
    /// MOVE_ASKED: why (1 draining, 2 reassigned, 3 shutting down). (Since
    /// 1.2, in 1.1's padding.)
    pub move_reason: u16,
    /// MOVE_ASKED: the reflector serves the membership this much longer.
    /// (Since 1.2, in 1.1's padding.)
    pub within_ms: u16,
    /// SENDER_HEARD, SENDER_SILENT: the player's client instance id.
    pub instance: u64,
    /// RENEWED: Unix seconds.
    pub expires_unix_s: u64,
    /// ERROR: the kind of error.
    pub error: rc_status,
}

/// `rc_event` as 1.1 declared it, for the check below only.
#[repr(C)]
#[allow(dead_code, reason = "its layout is all that is used")]
struct rc_event_1_1 {
    kind: rc_event_kind,
    group: u16,
    members: u16,
    rejoin: u8,
    reason: rc_rejoin_reason,
    player: u32,
    instance: u64,
    expires_unix_s: u64,
    error: rc_status,
}

// rc_event keeps 1.1's size and every 1.1 field at its 1.1 offset, on
// every target (`from_group`, `move_reason` and `within_ms` took padding):
// a 1.1 caller's struct holds a 1.2 event.
const _: () = {
    use std::mem::{offset_of, size_of};
    type Old = rc_event_1_1;
    assert!(size_of::<rc_event>() == size_of::<Old>());
    assert!(offset_of!(rc_event, kind) == offset_of!(Old, kind));
    assert!(offset_of!(rc_event, group) == offset_of!(Old, group));
    assert!(offset_of!(rc_event, members) == offset_of!(Old, members));
    assert!(offset_of!(rc_event, rejoin) == offset_of!(Old, rejoin));
    assert!(offset_of!(rc_event, reason) == offset_of!(Old, reason));
    assert!(offset_of!(rc_event, player) == offset_of!(Old, player));
    assert!(offset_of!(rc_event, instance) == offset_of!(Old, instance));
    assert!(offset_of!(rc_event, expires_unix_s) == offset_of!(Old, expires_unix_s));
    assert!(offset_of!(rc_event, error) == offset_of!(Old, error));
    assert!(offset_of!(rc_event, from_group) > offset_of!(Old, rejoin));
    assert!(offset_of!(rc_event, from_group) + 2 <= offset_of!(Old, reason));
    assert!(offset_of!(rc_event, move_reason) >= offset_of!(Old, player) + 4);
    assert!(offset_of!(rc_event, within_ms) + 2 <= offset_of!(Old, instance));
};

/// What `rc_recv` says about the datagram it copied.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rc_datagram_info {
    pub group: u16,
    /// The sending player.
    pub sender: u32,
    /// The sender's client instance id (0 if the group carries none).
    pub instance: u64,
    /// The sender's sequence number.
    pub seq: u64,
    /// The payload's full length; more than the buffer's capacity if
    /// `truncated`.
    pub len: usize,
    /// 1 if the buffer was too small and only its capacity was copied.
    pub truncated: u8,
}

/// Counters since the client started. RTTs are in microseconds, 0 while
/// unmeasured.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rc_client_stats {
    pub data_sent: u64,
    pub bytes_sent: u64,
    pub data_received: u64,
    pub bytes_received: u64,
    pub duplicates: u64,
    pub reordered: u64,
    pub gaps: u64,
    pub too_late: u64,
    pub inbox_full: u64,
    pub rtt_last_us: u64,
    pub rtt_smoothed_us: u64,
    pub rtt_min_us: u64,
    pub joins: u64,
    pub rejoins: u64,
    pub renewals: u64,
    pub token_requests: u64,
}

/// What an `rc_checkpoint_event` is. (Since 1.1.)
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_checkpoint_kind {
    /// No event (the struct is not filled).
    RC_CHECKPOINT_NONE = 0,
    /// The reflector asks this member for the game's state: answer with
    /// `rc_provide_checkpoint` (soon: the reflector's exchange has a
    /// deadline).
    RC_CHECKPOINT_REQUESTED = 1,
    /// The state provided was stored as checkpoint `number` at `tick`.
    RC_CHECKPOINT_UPLOADED = 2,
    /// The group's latest checkpoint came (`number`, `tick`, `from_player`,
    /// `age_ms`) and its SHA-256 checked: its `len` bytes wait for
    /// `rc_checkpoint_take`. Since 1.4 `op` says which fetch it answers:
    /// `RC_CHECKPOINT_OP_FETCH` (the latest) or `RC_CHECKPOINT_OP_FETCH_OTHER`
    /// (the other one kept).
    RC_CHECKPOINT_READY = 3,
    /// The group has no checkpoint yet; or, for `op`
    /// `RC_CHECKPOINT_OP_FETCH_OTHER` (1.4), fewer than two, so no other one.
    RC_CHECKPOINT_EMPTY = 4,
    /// An exchange (`op`) failed: `error` says what kind, `refusal` the
    /// reflector's reason if it refused, `rc_last_error` (on the thread that
    /// polled) the message.
    RC_CHECKPOINT_FAILED = 5,
}

/// Which way a checkpoint exchange went. (Since 1.1.)
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_checkpoint_op {
    RC_CHECKPOINT_OP_NONE = 0,
    /// The game's state to the reflector (after a request).
    RC_CHECKPOINT_OP_UPLOAD = 1,
    /// The group's latest checkpoint from the reflector.
    RC_CHECKPOINT_OP_FETCH = 2,
    /// The other checkpoint the reflector keeps for the group (the one
    /// before the latest, from another member when it has one): only after
    /// `rc_fetch_checkpoint_other`. (Since 1.4.)
    RC_CHECKPOINT_OP_FETCH_OTHER = 3,
}

/// One checkpoint event; which fields mean something depends on `kind`.
/// The state itself is never in it: `rc_checkpoint_take` copies it out.
/// (Since 1.1.)
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct rc_checkpoint_event {
    pub kind: rc_checkpoint_kind,
    /// Every kind: the group.
    pub group: u16,
    /// FAILED: the exchange that failed. READY, EMPTY (since 1.4; 0 before):
    /// the fetch answered, `RC_CHECKPOINT_OP_FETCH` or
    /// `RC_CHECKPOINT_OP_FETCH_OTHER`.
    pub op: rc_checkpoint_op,
    /// UPLOADED, READY: the checkpoint's number in its group.
    pub number: u64,
    /// UPLOADED, READY: the game tick its uploader gave.
    pub tick: u64,
    /// READY: who uploaded it.
    pub from_player: u32,
    /// READY: how old it was when served, in milliseconds.
    pub age_ms: u32,
    /// READY: the state's size in bytes (what `rc_checkpoint_take` needs).
    pub len: usize,
    /// FAILED: the kind of failure.
    pub error: rc_status,
    /// FAILED with `RC_ERR_REFUSED` (or an unauthenticated failure that
    /// named one): the reflector's refusal code (1 not a member, 2 bad MAC,
    /// 3 not requested, 4 too large, 5 malformed, 6 busy: try later, 7 no
    /// such group); 0 otherwise.
    pub refusal: u8,
    /// READY: how far the state can be trusted, an `RC_VERIFICATION_*`
    /// value (0 for the other kinds, and from a library before 1.5).
    /// (Since 1.5, in 1.4's padding.)
    pub verification: u8,
    /// FAILED fetch of a sealed group's checkpoint that came intact but
    /// that one of the joiner's checks refused: which, an `RC_CHECK_*`
    /// value (`rc_check_name` names it; `error` stays `RC_ERR_PROTOCOL`, as
    /// in 1.5); 0 otherwise, and from a library before 1.6. (Since 1.6, in
    /// 1.5's padding.)
    pub check: u8,
}

/// `rc_checkpoint_event.verification`: not a READY event (or a library
/// before 1.5). (Since 1.5.)
pub const RC_VERIFICATION_NONE: u8 = 0;
/// A clear group: the state as the reflector served it (its SHA-256
/// checked against the authenticated reply), nothing more.
pub const RC_VERIFICATION_CLEAR: u8 = 1;
/// A sealed group: sealed under the group's key and signed by the
/// certified key of `from_player` (one member's word).
pub const RC_VERIFICATION_SIGNED: u8 = 2;
/// A sealed group: the latest and the other checkpoint kept (both
/// fetched), of one tick, are the same state uploaded by two members.
pub const RC_VERIFICATION_VERIFIED_BY_TWO: u8 = 3;
/// A sealed group: both fetched, of one tick, from two members, but the
/// states differ (which to load is the game's policy).
pub const RC_VERIFICATION_DISAGREE: u8 = 4;

/// `rc_checkpoint_event` as 1.1 to 1.4 declared it, for the check below only.
#[repr(C)]
#[allow(dead_code, reason = "its layout is all that is used")]
struct rc_checkpoint_event_1_4 {
    kind: rc_checkpoint_kind,
    group: u16,
    op: rc_checkpoint_op,
    number: u64,
    tick: u64,
    from_player: u32,
    age_ms: u32,
    len: usize,
    error: rc_status,
    refusal: u8,
}

// rc_checkpoint_event keeps 1.4's size and every field at its offset, on
// every target (`verification`, 1.5, and `check`, 1.6, took padding after
// `refusal`).
const _: () = {
    use std::mem::{offset_of, size_of};
    type Old = rc_checkpoint_event_1_4;
    assert!(size_of::<rc_checkpoint_event>() == size_of::<Old>());
    assert!(offset_of!(rc_checkpoint_event, kind) == offset_of!(Old, kind));
    assert!(offset_of!(rc_checkpoint_event, group) == offset_of!(Old, group));
    assert!(offset_of!(rc_checkpoint_event, op) == offset_of!(Old, op));
    assert!(offset_of!(rc_checkpoint_event, number) == offset_of!(Old, number));
    assert!(offset_of!(rc_checkpoint_event, tick) == offset_of!(Old, tick));
    assert!(offset_of!(rc_checkpoint_event, from_player) == offset_of!(Old, from_player));
    assert!(offset_of!(rc_checkpoint_event, age_ms) == offset_of!(Old, age_ms));
    assert!(offset_of!(rc_checkpoint_event, len) == offset_of!(Old, len));
    assert!(offset_of!(rc_checkpoint_event, error) == offset_of!(Old, error));
    assert!(offset_of!(rc_checkpoint_event, refusal) == offset_of!(Old, refusal));
    assert!(offset_of!(rc_checkpoint_event, verification) == offset_of!(Old, refusal) + 1);
    assert!(offset_of!(rc_checkpoint_event, check) == offset_of!(Old, refusal) + 2);
};

/// Sealed groups' counters since the client started (docs/protocol.md,
/// "Sealed payloads"). (Since 1.5.)
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rc_sealing_counters {
    /// Sealed groups' DATA dropped by a receiving step: not a sealed DATA
    /// (too short, or clear DATA in a sealed group) ...
    pub malformed: u64,
    /// ... a sealed version this library does not read ...
    pub version: u64,
    /// ... no epoch key held for its cell and epoch ...
    pub no_key: u64,
    /// ... a sequence already seen from that sender instance (the same
    /// sealed datagram again; honest duplicates through two groups of an
    /// area are counted apart, `rc_sealing_duplicates`, since 1.7) ...
    pub replay: u64,
    /// ... does not open under the sender's key (forged or altered).
    pub bad: u64,
    /// `GET /keys` requests sent (key refreshes).
    pub keys_requests: u64,
    /// `/keys` answers received.
    pub keys_refreshes: u64,
    /// `/keys` requests that failed (retried with backoff).
    pub keys_refresh_failures: u64,
    /// Sealed groups' fetched checkpoints refused by the joiner's checks
    /// (docs/protocol.md, "Sealed checkpoints"), one counter per check; a
    /// refused state never reaches the game (the fetch is FAILED). Not a
    /// checkpoint envelope ...
    pub checkpoint_malformed: u64,
    /// ... an envelope version this library does not read ...
    pub checkpoint_version: u64,
    /// ... sealed for a cell not of the group (another group's) ...
    pub checkpoint_wrong_cell: u64,
    /// ... the reply's tick or uploader differ from the envelope's ...
    pub checkpoint_mismatch: u64,
    /// ... the uploader's certificate does not verify ...
    pub checkpoint_bad_certificate: u64,
    /// ... it had expired at the upload ...
    pub checkpoint_expired_certificate: u64,
    /// ... the signature does not verify ...
    pub checkpoint_bad_signature: u64,
    /// ... no epoch key held for its cell and epoch ...
    pub checkpoint_no_key: u64,
    /// ... the state does not open under the group's key (garbage or
    /// forged).
    pub checkpoint_bad: u64,
}

/// Checkpoint counters since the client started. (Since 1.1.)
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct rc_checkpoint_counters {
    /// Requests received from the reflector.
    pub requested: u64,
    /// Uploads the reflector stored.
    pub uploaded: u64,
    /// Fetches that ended with a checkpoint or with none (EMPTY).
    pub fetched: u64,
    /// Exchanges that failed (uploads and fetches).
    pub failures: u64,
}

impl rc_checkpoint_event {
    pub(crate) const NONE: rc_checkpoint_event = rc_checkpoint_event {
        kind: rc_checkpoint_kind::RC_CHECKPOINT_NONE,
        group: 0,
        op: rc_checkpoint_op::RC_CHECKPOINT_OP_NONE,
        number: 0,
        tick: 0,
        from_player: 0,
        age_ms: 0,
        len: 0,
        error: rc_status::RC_OK,
        refusal: 0,
        verification: RC_VERIFICATION_NONE,
        check: RC_CHECK_NONE,
    };
}

impl rc_event {
    pub(crate) const NONE: rc_event = rc_event {
        kind: rc_event_kind::RC_EVENT_NONE,
        group: 0,
        members: 0,
        rejoin: 0,
        from_group: 0,
        reason: rc_rejoin_reason::RC_REJOIN_NONE,
        player: 0,
        move_reason: 0,
        within_ms: 0,
        instance: 0,
        expires_unix_s: 0,
        error: rc_status::RC_OK,
    };
}
