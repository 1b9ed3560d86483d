//! The format's numbers: magic, version, sizes, field offsets, flags and
//! the renewal rule's times.

use std::ops::Range;

/// `"RF"`: lets us drop stray traffic (scanners, other protocols) cheaply.
pub const MAGIC: u16 = 0x5246;
/// Bumped on any incompatible layout change.
pub const VERSION: u8 = 2;
/// Size of the fixed header that starts every datagram.
pub const HEADER_LEN: usize = 24;
/// Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP).
pub const MAX_DATAGRAM: usize = 65_507;
/// Where a DATA's tag sits: right after the header, at a fixed even offset.
pub const TAG: Range<usize> = 24..32;
pub const TAG_LEN: usize = 8;
/// Where a DATA's game payload starts.
pub const DATA_PAYLOAD: usize = 32;
/// Largest game payload of one DATA.
pub const MAX_PAYLOAD: usize = MAX_DATAGRAM - DATA_PAYLOAD;
/// Largest DATA a client sends: an Ethernet MTU of 1,500 less the IPv4 and
/// UDP headers. The in-kernel fan-out replicates only datagrams that fit one
/// frame; a reflector still forwards larger DATA (up to [`MAX_DATAGRAM`]) in
/// user space, but clients must not rely on it.
pub const MAX_DATAGRAM_KERNEL: usize = 1472;
/// Largest game payload of a DATA a client sends ([`MAX_DATAGRAM_KERNEL`]
/// less the header and the tag); [`INSTANCE_LEN`] less where the group's
/// JOIN_ACK has [`FLAG_INSTANCE`]. The client library refuses a larger one.
pub const MAX_GAME_PAYLOAD: usize = MAX_DATAGRAM_KERNEL - DATA_PAYLOAD;
/// Length of the client instance id that starts every DATA's game payload
/// in a group whose JOIN_ACK has [`FLAG_INSTANCE`].
pub const INSTANCE_LEN: usize = 8;

// The sizes of tokens, cookies and MACs are the authentication's (auth.rs);
// the datagram layout uses them.
pub use crate::auth::{COOKIE_LEN, MAC_LEN, TOKEN_LEN};
/// MAC length of the 40-byte PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO
/// and ECHO_REPLY.
pub const SHORT_MAC_LEN: usize = 8;
pub const NONCE_LEN: usize = 8;
/// Length of a session key.
pub const SESSION_KEY_LEN: usize = 32;

/// Where each header field sits in a datagram (docs/protocol.md, "Header").
/// Public so the in-kernel fan-out's loader and its generated C constants
/// (`c_defines`) read the same offsets.
pub mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const GROUP: Range<usize> = 4..6;
    pub const LENGTH: Range<usize> = 6..8;
    pub const SENDER: Range<usize> = 8..12;
    pub const MEMBERSHIP: Range<usize> = 12..16;
    pub const SEQ: Range<usize> = 16..24;
}

/// Datagram sizes (header included), per type.
pub mod size {
    pub const JOIN: usize = 72;
    pub const JOIN_WITH_COOKIE: usize = 88;
    pub const JOIN_CHALLENGE: usize = 56;
    pub const JOIN_ACK: usize = 48;
    pub const LEAVE: usize = 40;
    pub const KEEPALIVE: usize = 40;
    pub const DATA_MIN: usize = 32;
    pub const ERROR: usize = 28;
    /// PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO and ECHO_REPLY.
    pub const PROBE: usize = 40;
    pub const ECHO: usize = 40;
    pub const MOVED: usize = 48;
    /// The largest control datagram.
    pub const MAX_CONTROL: usize = JOIN_WITH_COOKIE;
}

/// JOIN_ACK flag (bit 0): DATA tags are on in this group.
pub const FLAG_TAGS: u8 = 1;
/// JOIN_ACK flag (bit 1): every DATA's game payload starts with the
/// sender's [`INSTANCE_LEN`]-byte client instance id.
pub const FLAG_INSTANCE: u8 = 2;
/// JOIN_ACK flag (bit 2): every DATA's game payload is a sealed payload
/// (`crate::sealed`), set only with [`FLAG_INSTANCE`] (`reflector serve
/// --data-sealed on`). A client ignores bits it does not know.
pub const FLAG_SEALED: u8 = 4;

/// Renewal (`docs/protocol.md`, "Membership lifetime and renewal"): a JOIN
/// whose header carries a nonzero membership id is a renewal of that
/// membership (72 bytes, no cookie, MAC'd under the membership's keys; see
/// [`SmallDatagram::renewal`]).
pub mod renewal {
    /// A client renews when this fraction (1/3) of its token's lifetime is
    /// left: the lifetime is the control server's `expires_unix_s` less the
    /// time the token was received.
    pub const LIFETIME_LEFT_DIVISOR: u64 = 3;
    /// ... and at the latest this long before the token expires.
    pub const AT_LATEST_BEFORE_EXPIRY_MS: u64 = 10_000;

    /// When (Unix ms) a client that received a token at `received_unix_ms`
    /// expiring at `expires_unix_s` renews it: when a third of its lifetime
    /// is left, and at the latest 10 s before expiry (never before it was
    /// received).
    pub fn renew_at_unix_ms(received_unix_ms: u64, expires_unix_s: u64) -> u64 {
        let expires = expires_unix_s.saturating_mul(1000);
        let lifetime = expires.saturating_sub(received_unix_ms);
        let by_fraction = expires - lifetime / LIFETIME_LEFT_DIVISOR;
        let latest = expires.saturating_sub(AT_LATEST_BEFORE_EXPIRY_MS);
        by_fraction.min(latest).max(received_unix_ms.min(expires))
    }
}
