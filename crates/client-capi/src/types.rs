//! The types and constants the C header declares. Plain data: the FFI
//! layer (`ffi.rs`) only ever writes them for the caller, never reads one
//! the caller made, so no bit pattern from C is trusted as a Rust enum.

#![allow(non_camel_case_types, reason = "C names, as they appear in the header")]

/// Major version of the C ABI; `rc_version()` returns it in its top 16 bits.
/// A program built against one major version must not load another.
pub const REFLECTOR_C_VERSION_MAJOR: u32 = 1;
/// Minor version: additions only.
pub const REFLECTOR_C_VERSION_MINOR: u32 = 0;

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

const _: () = assert!(RC_TOKEN_LEN == reflector_proto::auth::TOKEN_LEN);
const _: () = assert!(RC_SESSION_KEY_LEN == reflector_proto::protocol::SESSION_KEY_LEN);
const _: () = assert!(RC_MAX_PAYLOAD == reflector_client::MAX_PAYLOAD);

/// A client handle: a slot index and a generation in one number. 0 is
/// never a handle; a freed handle stays invalid (its slot's generation
/// moves on), so using it again returns `RC_ERR_BAD_HANDLE`.
pub type rc_handle = u64;

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
}

/// What an `rc_event` is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rc_event_kind {
    /// No event (the struct is not filled).
    RC_EVENT_NONE = 0,
    /// A member of `group` (`members` in it, `rejoin` set if again).
    RC_EVENT_JOINED = 1,
    /// Joining again with the token held, for `reason`.
    RC_EVENT_REJOINING = 2,
    /// The membership now lasts until `expires_unix_s`.
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
    /// JOINED: the group.
    pub group: u16,
    /// JOINED: members of the group at join time.
    pub members: u16,
    /// JOINED: 1 if this is a rejoin.
    pub rejoin: u8,
    /// REJOINING: why.
    pub reason: rc_rejoin_reason,
    /// SENDER_HEARD, SENDER_SILENT: the player.
    pub player: u32,
    /// SENDER_HEARD, SENDER_SILENT: the player's client instance id.
    pub instance: u64,
    /// RENEWED: Unix seconds.
    pub expires_unix_s: u64,
    /// ERROR: the kind of error.
    pub error: rc_status,
}

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

impl rc_event {
    pub(crate) const NONE: rc_event = rc_event {
        kind: rc_event_kind::RC_EVENT_NONE,
        group: 0,
        members: 0,
        rejoin: 0,
        reason: rc_rejoin_reason::RC_REJOIN_NONE,
        player: 0,
        instance: 0,
        expires_unix_s: 0,
        error: rc_status::RC_OK,
    };
}
