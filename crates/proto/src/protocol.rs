//! The reflector's datagram format, version 2 (`docs/protocol.md`): a
//! 24-byte header on every datagram, a type-specific body, and the MAC or
//! DATA tag that proves the sender holds the player's session key. This
//! module is the one place that knows the offsets, the keys' derivation, the
//! MACs, the tags and the replay window.
//!
//! Parsing is a checked borrowed view ([`Packet::parse`]): once it returns
//! `Ok`, no accessor can panic, whatever bytes came off the network. Errors
//! are a small `Copy` enum so the hot path never allocates on bad input.

use crate::auth::{Secret, SecretRing, TokenClaims, TokenError};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::hash::Hasher;
use std::ops::Range;

type HmacSha256 = Hmac<Sha256>;

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
/// JOIN_ACK flag (bit 2): reserved for sealed payloads; a reflector of this
/// revision never sets it. A client ignores bits it does not know.
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

/// Datagram types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Client asks to join: token, MAC; on the second step the cookie too.
    Join = 1,
    /// Reflector's stateless address check: echo this cookie in a new JOIN.
    JoinChallenge = 2,
    /// The sender is now a member: its membership id, the group's settings.
    JoinAck = 3,
    /// Member leaves at once.
    Leave = 4,
    /// Member is alive; refreshes its expiry.
    Keepalive = 5,
    /// Game data, fanned out to every other member.
    Data = 6,
    /// Something was refused; a 2-byte [`ErrorCode`] and 2 reserved bytes.
    Error = 7,
    /// The reflector checks a member's address (rebinding) or its RTT.
    Probe = 8,
    /// A member's answer to a PROBE, from the probed address.
    ProbeReply = 9,
    /// The reflector asks a member for the group's game state.
    CheckpointRequest = 10,
    /// A member asks for a timed echo: a nonce of its choice.
    Echo = 11,
    /// The reflector's answer to ECHO: the same nonce, the same size.
    EchoReply = 12,
    /// The reflector tells a member its membership here is ending: ask the
    /// control server where to go ([`MovedReason`], within ms).
    Moved = 13,
}

impl Kind {
    pub const ALL: [Kind; 13] = [
        Kind::Join,
        Kind::JoinChallenge,
        Kind::JoinAck,
        Kind::Leave,
        Kind::Keepalive,
        Kind::Data,
        Kind::Error,
        Kind::Probe,
        Kind::ProbeReply,
        Kind::CheckpointRequest,
        Kind::Echo,
        Kind::EchoReply,
        Kind::Moved,
    ];

    pub fn from_u8(v: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Join => "JOIN",
            Kind::JoinChallenge => "JOIN_CHALLENGE",
            Kind::JoinAck => "JOIN_ACK",
            Kind::Leave => "LEAVE",
            Kind::Keepalive => "KEEPALIVE",
            Kind::Data => "DATA",
            Kind::Error => "ERROR",
            Kind::Probe => "PROBE",
            Kind::ProbeReply => "PROBE_REPLY",
            Kind::CheckpointRequest => "CHECKPOINT_REQUEST",
            Kind::Echo => "ECHO",
            Kind::EchoReply => "ECHO_REPLY",
            Kind::Moved => "MOVED",
        }
    }

    /// How a datagram of this type is authenticated.
    pub fn auth(self) -> Auth {
        match self {
            Kind::Join | Kind::JoinChallenge | Kind::JoinAck | Kind::Leave | Kind::Keepalive | Kind::Moved => Auth::Mac,
            Kind::Probe | Kind::ProbeReply | Kind::CheckpointRequest | Kind::Echo | Kind::EchoReply => Auth::ShortMac,
            Kind::Data => Auth::Tag,
            Kind::Error => Auth::None,
        }
    }

    /// Whether `len` (the whole datagram) is a valid size for this type.
    pub fn size_ok(self, len: usize) -> bool {
        match self {
            Kind::Join => len == size::JOIN || len == size::JOIN_WITH_COOKIE,
            Kind::JoinChallenge => len == size::JOIN_CHALLENGE,
            Kind::JoinAck => len == size::JOIN_ACK,
            Kind::Leave => len == size::LEAVE,
            Kind::Keepalive => len == size::KEEPALIVE,
            Kind::Data => (size::DATA_MIN..=MAX_DATAGRAM).contains(&len),
            Kind::Error => len == size::ERROR,
            Kind::Probe | Kind::ProbeReply | Kind::CheckpointRequest => len == size::PROBE,
            Kind::Echo | Kind::EchoReply => len == size::ECHO,
            Kind::Moved => len == size::MOVED,
        }
    }

    fn trailer(self) -> usize {
        match self.auth() {
            Auth::Mac => MAC_LEN,
            Auth::ShortMac => SHORT_MAC_LEN,
            Auth::Tag | Auth::None => 0,
        }
    }
}

/// How a type is authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// HMAC-SHA256 under the MAC key, 16 bytes at the end.
    Mac,
    /// HMAC-SHA256 under the MAC key, 8 bytes at the end.
    ShortMac,
    /// SipHash-2-4 under the tag key at bytes 24..32 (when tags are on).
    Tag,
    None,
}

/// Reasons carried by an ERROR datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// The token's MAC does not verify, or it names another group.
    BadToken = 1,
    /// The token is past its expiry: ask the control server for a new one.
    ExpiredToken = 2,
    /// The echoed cookie is wrong or too old: start the join again.
    BadCookie = 3,
    /// DATA/KEEPALIVE from an address that is not a member: join again
    /// (with the token and key held: this error cannot be authenticated).
    NotMember = 4,
    /// The group is full.
    GroupFull = 5,
    /// The datagram's protocol version is not served here.
    Version = 6,
    /// The JOIN's MAC does not verify under the token's session key.
    BadMac = 7,
    /// Too many members from this address in this group.
    AddressLimit = 8,
    /// Retryable: the address is held by another member that is being
    /// checked; start the JOIN again from its first step after about a second.
    Retry = 9,
}

impl ErrorCode {
    /// Every code, in the order of their values.
    pub const ALL: [ErrorCode; 9] = [
        ErrorCode::BadToken,
        ErrorCode::ExpiredToken,
        ErrorCode::BadCookie,
        ErrorCode::NotMember,
        ErrorCode::GroupFull,
        ErrorCode::Version,
        ErrorCode::BadMac,
        ErrorCode::AddressLimit,
        ErrorCode::Retry,
    ];

    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::BadToken,
            2 => ErrorCode::ExpiredToken,
            3 => ErrorCode::BadCookie,
            4 => ErrorCode::NotMember,
            5 => ErrorCode::GroupFull,
            6 => ErrorCode::Version,
            7 => ErrorCode::BadMac,
            8 => ErrorCode::AddressLimit,
            9 => ErrorCode::Retry,
            _ => return None,
        })
    }
}

/// Why the reflector sends MOVED.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MovedReason {
    /// The reflector is being taken out of service.
    Draining = 1,
    /// The cell is served elsewhere now.
    Reassigned = 2,
    /// The reflector is shutting down.
    ShuttingDown = 3,
}

impl MovedReason {
    pub const ALL: [MovedReason; 3] = [
        MovedReason::Draining,
        MovedReason::Reassigned,
        MovedReason::ShuttingDown,
    ];

    pub fn from_u16(v: u16) -> Option<MovedReason> {
        Some(match v {
            1 => MovedReason::Draining,
            2 => MovedReason::Reassigned,
            3 => MovedReason::ShuttingDown,
            _ => return None,
        })
    }
}

/// What a MOVED tells a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Why (a reason this version does not know is `Err(raw)`).
    pub reason: Result<MovedReason, u16>,
    /// How long the reflector keeps serving this membership (0: not at all).
    pub within_ms: u16,
}

/// Why a datagram could not be parsed. Small and `Copy`: never allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than the fixed header.
    Truncated,
    /// Not our magic number.
    BadMagic,
    /// A version we do not speak.
    BadVersion(u8),
    /// A type byte we do not know.
    UnknownKind(u8),
    /// The header's length field does not match the bytes received.
    LengthMismatch { declared: u16, actual: usize },
    /// The datagram does not have the size its type requires.
    BadPayload(Kind),
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Truncated => write!(f, "datagram shorter than the {HEADER_LEN}-byte header"),
            ParseError::BadMagic => write!(f, "wrong magic number"),
            ParseError::BadVersion(v) => write!(f, "unsupported version {v}"),
            ParseError::UnknownKind(k) => write!(f, "unknown type {k}"),
            ParseError::LengthMismatch { declared, actual } => {
                write!(
                    f,
                    "length field says {declared} bytes after the header, datagram has {actual}"
                )
            }
            ParseError::BadPayload(k) => write!(f, "{} has the wrong size", k.name()),
        }
    }
}

impl std::error::Error for ParseError {}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// SipHash-2-4 of `d` under `key` with the 8-byte word at [`TAG`] read as
/// zero: the same value as siphasher's streaming hasher fed the three
/// pieces, computed a word at a time (the tag field is word-aligned), which
/// costs about two thirds of the instructions on every DATA the reflector
/// checks. `d` is at least [`TAG`]`.end` bytes long.
fn siphash24_tag(key: &[u8; 16], d: &[u8]) -> u64 {
    #[inline(always)]
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    #[inline(always)]
    fn absorb(v: &mut [u64; 4], m: u64) {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    }
    const _: () = assert!(TAG.start % 8 == 0 && TAG.end - TAG.start == 8);
    let (k0, k1) = (le64(&key[..8]), le64(&key[8..]));
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let words = d.chunks_exact(8);
    let tail = words.remainder();
    for (i, w) in words.enumerate() {
        absorb(&mut v, if i == TAG.start / 8 { 0 } else { le64(w) });
    }
    let mut last = (d.len() as u64) << 56;
    for (i, &b) in tail.iter().enumerate() {
        last |= u64::from(b) << (8 * i);
    }
    absorb(&mut v, last);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// A checked, borrowed view of one datagram.
#[derive(Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    kind: Kind,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates header and size for the type; after `Ok`, every accessor is
    /// in bounds. The MAC or tag is checked separately, with the sender's
    /// keys ([`SessionKeys::verify`], [`SessionKeys::verify_tag`]).
    pub fn parse(buf: T) -> Result<Packet<T>, ParseError> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        if be16(&b[field::MAGIC]) != MAGIC {
            return Err(ParseError::BadMagic);
        }
        if b[field::VERSION] != VERSION {
            return Err(ParseError::BadVersion(b[field::VERSION]));
        }
        let kind = Kind::from_u8(b[field::KIND]).ok_or(ParseError::UnknownKind(b[field::KIND]))?;
        let declared = be16(&b[field::LENGTH]);
        let actual = b.len() - HEADER_LEN;
        if usize::from(declared) != actual {
            return Err(ParseError::LengthMismatch { declared, actual });
        }
        if !kind.size_ok(b.len()) {
            return Err(ParseError::BadPayload(kind));
        }
        Ok(Packet { buf, kind })
    }

    fn bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn group(&self) -> u16 {
        be16(&self.bytes()[field::GROUP])
    }

    /// The player id (the token's).
    pub fn sender(&self) -> u32 {
        be32(&self.bytes()[field::SENDER])
    }

    /// The membership id from JOIN_ACK (0 in JOIN).
    pub fn membership(&self) -> u32 {
        be32(&self.bytes()[field::MEMBERSHIP])
    }

    pub fn seq(&self) -> u64 {
        be64(&self.bytes()[field::SEQ])
    }

    /// DATA: the game payload; other types: what lies between the header
    /// and the MAC.
    pub fn payload(&self) -> &[u8] {
        let b = self.bytes();
        match self.kind {
            Kind::Data => &b[DATA_PAYLOAD..],
            k => &b[HEADER_LEN..b.len() - k.trailer()],
        }
    }

    /// The whole datagram, header included.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes()
    }

    /// The bytes a MAC covers and the MAC, for MAC'd types.
    pub fn signed(&self) -> Option<(&[u8], &[u8])> {
        let n = self.kind.trailer();
        (n > 0).then(|| self.bytes().split_at(self.bytes().len() - n))
    }

    /// JOIN: the token.
    pub fn join_token(&self) -> Option<&[u8; TOKEN_LEN]> {
        if self.kind != Kind::Join {
            return None;
        }
        self.payload()[..TOKEN_LEN].try_into().ok()
    }

    /// JOIN: the echoed cookie, present on the second step only.
    pub fn join_cookie(&self) -> Option<&[u8; COOKIE_LEN]> {
        if self.kind != Kind::Join || self.payload().len() != TOKEN_LEN + COOKIE_LEN {
            return None;
        }
        self.payload()[TOKEN_LEN..].try_into().ok()
    }

    /// JOIN_CHALLENGE: the cookie to echo.
    pub fn challenge_cookie(&self) -> Option<&[u8; COOKIE_LEN]> {
        if self.kind != Kind::JoinChallenge {
            return None;
        }
        self.payload().try_into().ok()
    }

    /// JOIN_ACK: the membership's settings.
    pub fn join_ack(&self) -> Option<JoinAck> {
        if self.kind != Kind::JoinAck {
            return None;
        }
        let p = self.payload();
        Some(JoinAck {
            members: be16(&p[0..2]),
            keepalive_ms: be16(&p[2..4]),
            flags: p[4],
            checkpoint_port: be16(&p[6..8]),
        })
    }

    /// ERROR: the code (unknown codes are reported as `Err(raw)`).
    pub fn error_code(&self) -> Option<Result<ErrorCode, u16>> {
        if self.kind != Kind::Error {
            return None;
        }
        let raw = be16(self.payload());
        Some(ErrorCode::from_u16(raw).ok_or(raw))
    }

    /// PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO, ECHO_REPLY: the nonce.
    pub fn nonce(&self) -> Option<u64> {
        (self.kind.auth() == Auth::ShortMac).then(|| be64(self.payload()))
    }

    /// MOVED: the reason and how long the membership is still served. The
    /// reserved bytes 28..32 are covered by the MAC and not read.
    pub fn moved(&self) -> Option<Moved> {
        if self.kind != Kind::Moved {
            return None;
        }
        let p = self.payload();
        let raw = be16(&p[0..2]);
        Some(Moved {
            reason: MovedReason::from_u16(raw).ok_or(raw),
            within_ms: be16(&p[2..4]),
        })
    }

    /// JOIN: whether it renews a membership (the header carries its
    /// nonzero membership id; MAC'd under the membership's keys, not the
    /// token's).
    pub fn is_renewal(&self) -> bool {
        self.kind == Kind::Join && self.membership() != 0
    }

    /// DATA: the tag field (0 when tags are off).
    pub fn tag(&self) -> Option<u64> {
        (self.kind == Kind::Data).then(|| be64(&self.bytes()[TAG]))
    }
}

/// What JOIN_ACK tells a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAck {
    /// Members after the join.
    pub members: u16,
    /// Send a KEEPALIVE at least this often (ms).
    pub keepalive_ms: u16,
    /// [`FLAG_TAGS`]: DATA must carry a tag; [`FLAG_INSTANCE`]: its game
    /// payload starts with the sender's instance id; [`FLAG_SEALED`] is
    /// reserved. Unknown bits are ignored.
    pub flags: u8,
    /// TCP port of the reflector's checkpoint channel, 0 if none.
    pub checkpoint_port: u16,
}

impl JoinAck {
    pub fn tags(&self) -> bool {
        self.flags & FLAG_TAGS != 0
    }

    /// Every DATA's game payload starts with the sender's instance id.
    pub fn instance(&self) -> bool {
        self.flags & FLAG_INSTANCE != 0
    }

    fn body(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.members.to_be_bytes());
        b[2..4].copy_from_slice(&self.keepalive_ms.to_be_bytes());
        b[4] = self.flags;
        b[6..8].copy_from_slice(&self.checkpoint_port.to_be_bytes());
        b
    }
}

// The key schedule's side of token verification: here rather than in
// auth.rs, so that authentication does not depend on the datagram layer.
impl SecretRing {
    /// [`SecretRing::verify_token`], and the token's session keys, derived
    /// under the secret that verified it (`docs/protocol.md`, Keys).
    pub fn verify_token_keys(
        &self,
        token: &[u8; TOKEN_LEN],
        reflector: u16,
        group: u16,
        sender: u32,
        now_ms: u64,
    ) -> Result<(TokenClaims, SessionKeys), TokenError> {
        self.verify_token_by(token, reflector, group, sender, now_ms)
            .map(|(claims, secret)| (claims, SessionKeys::derive(secret, token)))
    }
}

/// The keys of one token's session (see the document's table).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionKeys {
    /// What the player gets from the control server.
    pub session: [u8; SESSION_KEY_LEN],
    mac: [u8; 32],
    tag: [u8; 16],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC-SHA256 takes keys of any length: new_from_slice cannot fail.
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m
}

impl SessionKeys {
    /// The control server's and the reflector's side: the session key of a
    /// token, under the shared secret that signed it.
    pub fn derive(secret: &Secret, token: &[u8; TOKEN_LEN]) -> SessionKeys {
        let k = hmac(secret.as_bytes(), &[b"reflector-session-v2", token])
            .finalize()
            .into_bytes();
        SessionKeys::from_session(k.into())
    }

    /// The player's side: the MAC and tag keys of the session key it got.
    pub fn from_session(session: [u8; SESSION_KEY_LEN]) -> SessionKeys {
        let mac = hmac(&session, &[b"reflector-mac-v2"]).finalize().into_bytes().into();
        let t = hmac(&session, &[b"reflector-tag-v2"]).finalize().into_bytes();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&t[..16]);
        SessionKeys { session, mac, tag }
    }

    /// Checks the MAC of a MAC'd datagram (constant time); false for types
    /// that carry none.
    pub fn verify<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.signed() {
            Some((bytes, mac)) => hmac(&self.mac, &[bytes]).verify_truncated_left(mac).is_ok(),
            None => false,
        }
    }

    /// The DATA tag of `datagram` (the tag field itself read as zero):
    /// standard SipHash-2-4, which a BPF program computes the same.
    pub fn tag(&self, datagram: &[u8]) -> u64 {
        if datagram.len() < TAG.end {
            // No tag field to read as zero (no DATA is this short): the
            // streaming hasher panics on it as it always did.
            let mut h = siphasher::sip::SipHasher24::new_with_key(&self.tag);
            h.write(&datagram[..TAG.start]);
            h.write(&[0u8; TAG_LEN]);
            h.write(&datagram[TAG.end..]);
            return h.finish();
        }
        siphash24_tag(&self.tag, datagram)
    }

    /// The MAC key `Km` (datagram MACs and the checkpoint channel's MACs).
    pub fn mac_key(&self) -> &[u8; 32] {
        &self.mac
    }

    /// The DATA tag key, for an in-kernel checker that computes the same
    /// SipHash (the reflector's eBPF fan-out).
    pub fn tag_key(&self) -> &[u8; 16] {
        &self.tag
    }

    /// Checks a DATA's tag (constant time).
    pub fn verify_tag<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.tag() {
            Some(tag) => {
                let want = self.tag(p.as_bytes()).to_be_bytes();
                // No early exit on the first differing byte.
                want.iter()
                    .zip(tag.to_be_bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            }
            None => false,
        }
    }
}

/// Header fields of a datagram to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub group: u16,
    /// The player id.
    pub sender: u32,
    /// The membership id (0 in JOIN).
    pub membership: u32,
    pub seq: u64,
}

/// Why a datagram could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    #[error("buffer of {have} bytes is too small for a {need}-byte datagram")]
    BufferTooSmall { need: usize, have: usize },
    #[error("a {kind} of {len} bytes is not a valid size for its type")]
    BadSize { kind: &'static str, len: usize },
    #[error("a {0} needs a MAC and no key was given")]
    NoKey(&'static str),
}

fn put_header(h: &Header, len: usize, out: &mut [u8]) {
    out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    out[field::VERSION] = VERSION;
    out[field::KIND] = h.kind as u8;
    out[field::GROUP].copy_from_slice(&h.group.to_be_bytes());
    // len <= MAX_DATAGRAM, checked by the callers, so this fits a u16.
    out[field::LENGTH].copy_from_slice(&((len - HEADER_LEN) as u16).to_be_bytes());
    out[field::SENDER].copy_from_slice(&h.sender.to_be_bytes());
    out[field::MEMBERSHIP].copy_from_slice(&h.membership.to_be_bytes());
    out[field::SEQ].copy_from_slice(&h.seq.to_be_bytes());
}

/// Writes a datagram into `out`: header, `body`, then the MAC or the tag
/// its type needs (under `keys`; `None` for ERROR, and for DATA with tags
/// off). `body` is the game payload for DATA, else what comes between the
/// header and the MAC. Returns the datagram's length.
pub fn emit(h: &Header, body: &[u8], keys: Option<&SessionKeys>, out: &mut [u8]) -> Result<usize, EmitError> {
    let start = if h.kind == Kind::Data { DATA_PAYLOAD } else { HEADER_LEN };
    let len = start + body.len() + h.kind.trailer();
    if !h.kind.size_ok(len) {
        return Err(EmitError::BadSize {
            kind: h.kind.name(),
            len,
        });
    }
    if out.len() < len {
        return Err(EmitError::BufferTooSmall {
            need: len,
            have: out.len(),
        });
    }
    out[start..start + body.len()].copy_from_slice(body);
    seal(h, len, keys, out)
}

/// Writes the header and the MAC or tag of a datagram whose body the
/// caller already placed in `out` (a DATA's payload at [`DATA_PAYLOAD`]),
/// `len` bytes in all: lets a sender write its payload in place.
pub fn seal(h: &Header, len: usize, keys: Option<&SessionKeys>, out: &mut [u8]) -> Result<usize, EmitError> {
    if !h.kind.size_ok(len) {
        return Err(EmitError::BadSize {
            kind: h.kind.name(),
            len,
        });
    }
    if out.len() < len {
        return Err(EmitError::BufferTooSmall {
            need: len,
            have: out.len(),
        });
    }
    put_header(h, len, out);
    match h.kind.auth() {
        Auth::Tag => {
            out[TAG].fill(0);
            if let Some(k) = keys {
                let t = k.tag(&out[..len]);
                out[TAG].copy_from_slice(&t.to_be_bytes());
            }
        }
        Auth::Mac | Auth::ShortMac => {
            let k = keys.ok_or(EmitError::NoKey(h.kind.name()))?;
            let n = h.kind.trailer();
            let mac = hmac(&k.mac, &[&out[..len - n]]).finalize().into_bytes();
            out[len - n..len].copy_from_slice(&mac[..n]);
        }
        Auth::None => {}
    }
    Ok(len)
}

/// Zeroes a DATA's tag field: what every member receives.
pub fn strip_tag(datagram: &mut [u8]) {
    if datagram.len() >= TAG.end {
        datagram[TAG].fill(0);
    }
}

/// Sequence numbers seen in one direction of one membership: the highest
/// accepted and a bitmap of the 64 up to it (bit i: highest − i).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    pub highest: u64,
    pub bitmap: u64,
}

impl ReplayWindow {
    /// Whether `seq` would be accepted (new, or inside the window and unseen).
    pub fn fresh(&self, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        if seq > self.highest {
            return true;
        }
        let back = self.highest - seq;
        back < 64 && self.bitmap & (1u64 << back) == 0
    }

    /// Accepts `seq` if fresh (call only once the datagram's MAC or tag
    /// verified, from the member's validated address); false for a replay.
    pub fn accept(&mut self, seq: u64) -> bool {
        if !self.fresh(seq) {
            return false;
        }
        if seq > self.highest {
            let shift = seq - self.highest;
            self.bitmap = if shift >= 64 { 0 } else { self.bitmap << shift };
            self.bitmap |= 1;
            self.highest = seq;
        } else {
            self.bitmap |= 1u64 << (self.highest - seq);
        }
        true
    }
}

/// A control datagram built on the stack (no allocation): the largest is a
/// JOIN with its cookie.
#[derive(Clone, Copy)]
pub struct SmallDatagram {
    buf: [u8; size::MAX_CONTROL],
    len: usize,
}

impl SmallDatagram {
    /// Builds a control datagram; `keys` for every MAC'd type.
    pub fn build(h: &Header, body: &[u8], keys: Option<&SessionKeys>) -> Result<SmallDatagram, EmitError> {
        let mut buf = [0u8; size::MAX_CONTROL];
        let len = emit(h, body, keys, &mut buf)?;
        Ok(SmallDatagram { buf, len })
    }

    fn control(h: &Header, body: &[u8], keys: &SessionKeys) -> SmallDatagram {
        // Every caller passes the fixed body of a MAC'd control type.
        SmallDatagram::build(h, body, Some(keys)).expect("fixed-size control body")
    }

    pub fn join(
        h: &Header,
        token: &[u8; TOKEN_LEN],
        cookie: Option<&[u8; COOKIE_LEN]>,
        keys: &SessionKeys,
    ) -> SmallDatagram {
        let mut p = [0u8; TOKEN_LEN + COOKIE_LEN];
        p[..TOKEN_LEN].copy_from_slice(token);
        let body = match cookie {
            Some(c) => {
                p[TOKEN_LEN..].copy_from_slice(c);
                &p[..]
            }
            None => &p[..TOKEN_LEN],
        };
        SmallDatagram::control(&Header { kind: Kind::Join, ..*h }, body, keys)
    }

    pub fn challenge(h: &Header, cookie: &[u8; COOKIE_LEN], keys: &SessionKeys) -> SmallDatagram {
        SmallDatagram::control(
            &Header {
                kind: Kind::JoinChallenge,
                ..*h
            },
            cookie,
            keys,
        )
    }

    pub fn join_ack(h: &Header, ack: JoinAck, keys: &SessionKeys) -> SmallDatagram {
        SmallDatagram::control(
            &Header {
                kind: Kind::JoinAck,
                ..*h
            },
            &ack.body(),
            keys,
        )
    }

    /// LEAVE or KEEPALIVE.
    pub fn simple(h: &Header, keys: &SessionKeys) -> SmallDatagram {
        SmallDatagram::control(h, &[], keys)
    }

    /// PROBE, PROBE_REPLY, CHECKPOINT_REQUEST, ECHO or ECHO_REPLY (the
    /// header's kind says which).
    pub fn nonce(h: &Header, nonce: u64, keys: &SessionKeys) -> SmallDatagram {
        SmallDatagram::control(h, &nonce.to_be_bytes(), keys)
    }

    /// MOVED (reflector to a member's validated address, under its key).
    pub fn moved(h: &Header, reason: MovedReason, within_ms: u16, keys: &SessionKeys) -> SmallDatagram {
        let mut body = [0u8; 8];
        body[0..2].copy_from_slice(&(reason as u16).to_be_bytes());
        body[2..4].copy_from_slice(&within_ms.to_be_bytes());
        SmallDatagram::control(
            &Header {
                kind: Kind::Moved,
                ..*h
            },
            &body,
            keys,
        )
    }

    /// A renewal JOIN (72 bytes): `h` carries the current membership id
    /// (nonzero) and a sequence number fresh in the membership's window,
    /// `token` is the newer token, and `membership_keys` are the keys of the
    /// membership being renewed (not the new token's).
    pub fn renewal(h: &Header, token: &[u8; TOKEN_LEN], membership_keys: &SessionKeys) -> SmallDatagram {
        SmallDatagram::join(h, token, None, membership_keys)
    }

    /// ERROR (not MAC'd: the reflector may hold no key for its addressee).
    pub fn error(group: u16, sender: u32, membership: u32, code: ErrorCode) -> SmallDatagram {
        let mut body = [0u8; 4];
        body[..2].copy_from_slice(&(code as u16).to_be_bytes());
        let h = Header {
            kind: Kind::Error,
            group,
            sender,
            membership,
            seq: 0,
        };
        SmallDatagram::build(&h, &body, None).expect("fixed-size error body")
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Size of the version-1 ERROR(Version) answer.
pub const VERSION1_ERROR_LEN: usize = 18;

/// The answer to a datagram of protocol version 1: a version-1 ERROR
/// (18 bytes, code [`ErrorCode::Version`]) with the request's group and
/// bytes 8..12, if the request is a version-1 datagram of at least a
/// header's size (a reflector looks at nothing shorter, and a reply is never
/// larger than its request).
pub fn version1_error(request: &[u8]) -> Option<[u8; VERSION1_ERROR_LEN]> {
    if request.len() < HEADER_LEN || be16(&request[field::MAGIC]) != MAGIC || request[field::VERSION] != 1 {
        return None;
    }
    let mut out = [0u8; VERSION1_ERROR_LEN];
    out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    out[2] = 1;
    out[3] = Kind::Error as u8;
    out[4..6].copy_from_slice(&request[4..6]);
    out[6..8].copy_from_slice(&2u16.to_be_bytes());
    out[8..12].copy_from_slice(&request[8..12]);
    out[16..18].copy_from_slice(&(ErrorCode::Version as u16).to_be_bytes());
    Some(out)
}

/// The protocol's facts a C program needs (the in-kernel fan-out, built by
/// the server's build script), as `#define` lines: the one place they are
/// written is this crate, so the eBPF program cannot drift from it.
pub fn c_defines() -> String {
    let defines: [(&str, usize); 16] = [
        ("PROTO_MAGIC", usize::from(MAGIC)),
        ("PROTO_VERSION", usize::from(VERSION)),
        ("PROTO_DATA", Kind::Data as usize),
        ("PROTO_LEAVE", Kind::Leave as usize),
        ("PROTO_LEAVE_LEN", size::LEAVE),
        ("PROTO_HEADER_LEN", HEADER_LEN),
        ("PROTO_TAG_OFF", TAG.start),
        ("PROTO_DATA_MIN", size::DATA_MIN),
        ("PROTO_OFF_VERSION", field::VERSION),
        ("PROTO_OFF_KIND", field::KIND),
        ("PROTO_OFF_GROUP", field::GROUP.start),
        ("PROTO_OFF_LENGTH", field::LENGTH.start),
        ("PROTO_OFF_SENDER", field::SENDER.start),
        ("PROTO_OFF_MEMBERSHIP", field::MEMBERSHIP.start),
        ("PROTO_OFF_SEQ", field::SEQ.start),
        ("PROTO_MAX_DATAGRAM_KERNEL", MAX_DATAGRAM_KERNEL),
    ];
    let mut out = String::from(
        "/* Generated from reflector-proto (protocol::c_defines) by the build script: do not edit. */\n\
         #ifndef REFLECTOR_PROTO_H\n#define REFLECTOR_PROTO_H\n",
    );
    for (name, value) in defines {
        out.push_str(&format!("#define {name} {value:#x}\n"));
    }
    out.push_str("#endif\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keys() -> SessionKeys {
        SessionKeys::derive(&Secret::new(&[7u8; 32]).unwrap(), &[9u8; TOKEN_LEN])
    }

    #[test]
    fn c_defines_say_what_the_encoder_does() {
        let h = c_defines();
        let value = |name: &str| {
            let line = h
                .lines()
                .find(|l| l.split_whitespace().nth(1) == Some(name))
                .unwrap_or_else(|| panic!("{name} missing from\n{h}"));
            usize::from_str_radix(line.split_whitespace().nth(2).unwrap().trim_start_matches("0x"), 16).unwrap()
        };
        // Read the offsets off an encoded DATA, not off the constants.
        let mut d = [0u8; HEADER_LEN];
        let h0 = Header {
            seq: 0x0102_0304_0506_0708,
            ..hdr(Kind::Data)
        };
        put_header(&h0, size::DATA_MIN, &mut d);
        let at = |name: &str, n: usize| &d[value(name)..value(name) + n];
        assert_eq!(at("PROTO_OFF_GROUP", 2), h0.group.to_be_bytes());
        assert_eq!(
            at("PROTO_OFF_LENGTH", 2),
            ((size::DATA_MIN - HEADER_LEN) as u16).to_be_bytes()
        );
        assert_eq!(at("PROTO_OFF_SENDER", 4), h0.sender.to_be_bytes());
        assert_eq!(at("PROTO_OFF_MEMBERSHIP", 4), h0.membership.to_be_bytes());
        assert_eq!(d[value("PROTO_OFF_KIND")], Kind::Data as u8);
        assert_eq!(d[value("PROTO_OFF_KIND")] as usize, value("PROTO_DATA"));
        assert_eq!(d[value("PROTO_OFF_VERSION")] as usize, value("PROTO_VERSION"));
        assert_eq!(usize::from(be16(&d[..2])), value("PROTO_MAGIC"));
        let seq = value("PROTO_OFF_SEQ");
        assert_eq!(d[seq..seq + 8], 0x0102_0304_0506_0708u64.to_be_bytes());
        assert_eq!(value("PROTO_HEADER_LEN"), d.len());
        assert!(h.starts_with("/* Generated") && h.trim_end().ends_with("#endif"));
    }

    fn hdr(kind: Kind) -> Header {
        Header {
            kind,
            group: 4000,
            sender: 77,
            membership: 0xdead_beef,
            seq: 5,
        }
    }

    #[test]
    fn the_word_wise_tag_is_the_streaming_siphash() {
        let key: [u8; 16] = core::array::from_fn(|i| (i * 7 + 3) as u8);
        let d: Vec<u8> = (0..1200u32).map(|i| (i * 31 + i / 7) as u8).collect();
        for len in (TAG.end..=200).chain([511, 512, 513, 1000, 1199, 1200]) {
            let mut h = siphasher::sip::SipHasher24::new_with_key(&key);
            h.write(&d[..TAG.start]);
            h.write(&[0u8; TAG_LEN]);
            h.write(&d[TAG.end..len]);
            assert_eq!(siphash24_tag(&key, &d[..len]), h.finish(), "{len} bytes");
        }
    }

    #[test]
    fn siphash_is_the_reference_siphash_2_4() {
        // The paper's test vector (Aumasson & Bernstein, appendix A): key
        // 00..0f, message 00..0e. A BPF program computing standard SipHash
        // must agree with these tags.
        let key: [u8; 16] = core::array::from_fn(|i| i as u8);
        let msg: [u8; 15] = core::array::from_fn(|i| i as u8);
        let mut h = siphasher::sip::SipHasher24::new_with_key(&key);
        h.write(&msg);
        assert_eq!(h.finish(), 0xa129_ca61_49be_45e5);
    }

    #[test]
    fn every_type_round_trips_at_its_size() {
        let k = keys();
        let mut out = [0u8; 200];
        let ack = JoinAck {
            members: 3,
            keepalive_ms: 2500,
            flags: FLAG_TAGS,
            checkpoint_port: 4100,
        };
        let cases: Vec<(Kind, Vec<u8>, usize)> = vec![
            (Kind::Join, vec![1; 32], size::JOIN),
            (Kind::Join, vec![1; 48], size::JOIN_WITH_COOKIE),
            (Kind::JoinChallenge, vec![2; 16], size::JOIN_CHALLENGE),
            (Kind::JoinAck, ack.body().to_vec(), size::JOIN_ACK),
            (Kind::Leave, vec![], size::LEAVE),
            (Kind::Keepalive, vec![], size::KEEPALIVE),
            (Kind::Data, b"hello".to_vec(), size::DATA_MIN + 5),
            (Kind::Error, vec![0, 4, 0, 0], size::ERROR),
            (Kind::Probe, 42u64.to_be_bytes().to_vec(), size::PROBE),
            (Kind::ProbeReply, 42u64.to_be_bytes().to_vec(), size::PROBE),
            (Kind::CheckpointRequest, 42u64.to_be_bytes().to_vec(), size::PROBE),
            (Kind::Echo, 42u64.to_be_bytes().to_vec(), size::ECHO),
            (Kind::EchoReply, 42u64.to_be_bytes().to_vec(), size::ECHO),
            (Kind::Moved, vec![0, 2, 0x03, 0xe8, 0, 0, 0, 0], size::MOVED),
        ];
        assert_eq!(
            cases
                .iter()
                .map(|c| c.0)
                .collect::<std::collections::HashSet<_>>()
                .len(),
            Kind::ALL.len(),
            "every type has a case"
        );
        for (kind, body, want) in cases {
            let n = emit(&hdr(kind), &body, Some(&k), &mut out).unwrap();
            assert_eq!(n, want, "{kind:?}");
            let p = Packet::parse(&out[..n]).unwrap();
            assert_eq!(
                (p.kind(), p.group(), p.sender(), p.membership(), p.seq()),
                (kind, 4000, 77, 0xdead_beef, 5)
            );
            assert_eq!(p.payload(), &body[..], "{kind:?}");
            match kind.auth() {
                Auth::Mac | Auth::ShortMac => assert!(k.verify(&p), "{kind:?}"),
                Auth::Tag => assert!(k.verify_tag(&p)),
                Auth::None => {}
            }
        }
        let n = emit(&hdr(Kind::JoinAck), &ack.body(), Some(&k), &mut out).unwrap();
        assert_eq!(Packet::parse(&out[..n]).unwrap().join_ack(), Some(ack));
        let n = emit(&hdr(Kind::Probe), &42u64.to_be_bytes(), Some(&k), &mut out).unwrap();
        assert_eq!(Packet::parse(&out[..n]).unwrap().nonce(), Some(42));
    }

    #[test]
    fn a_changed_byte_or_another_key_fails_the_mac_and_the_tag() {
        let (k, other) = (keys(), SessionKeys::from_session([1u8; 32]));
        let mut out = [0u8; 100];
        for (kind, body) in [(Kind::Keepalive, vec![]), (Kind::Data, b"state".to_vec())] {
            let n = emit(&hdr(kind), &body, Some(&k), &mut out).unwrap();
            let ok = |b: &[u8], key: &SessionKeys| {
                let p = Packet::parse(b).unwrap();
                if kind == Kind::Data {
                    key.verify_tag(&p)
                } else {
                    key.verify(&p)
                }
            };
            assert!(ok(&out[..n], &k));
            assert!(!ok(&out[..n], &other), "{kind:?} under another key");
            // Every byte the parser does not itself check is covered.
            for i in (field::GROUP.start..n).filter(|i| !field::LENGTH.contains(i)) {
                let mut b = out[..n].to_vec();
                b[i] ^= 0x40;
                assert!(!ok(&b, &k), "{kind:?}: byte {i} flipped still verifies");
            }
        }
    }

    #[test]
    fn stripping_zeroes_the_tag_and_nothing_else() {
        let k = keys();
        let mut out = [0u8; 64];
        let n = emit(&hdr(Kind::Data), b"abc", Some(&k), &mut out).unwrap();
        let before = out[..n].to_vec();
        strip_tag(&mut out[..n]);
        assert_eq!(&out[TAG], &[0; 8]);
        assert_eq!(&out[..TAG.start], &before[..TAG.start]);
        assert_eq!(&out[TAG.end..n], b"abc");
        // Untagged DATA (tags off) is the same bytes with a zero tag.
        let mut plain = [0u8; 64];
        let m = emit(&hdr(Kind::Data), b"abc", None, &mut plain).unwrap();
        assert_eq!(&plain[..m], &out[..n]);
    }

    #[test]
    fn the_parser_refuses_each_kind_of_bad_datagram() {
        let k = keys();
        let mut out = [0u8; 100];
        let n = emit(&hdr(Kind::Keepalive), &[], Some(&k), &mut out).unwrap();
        let good = out[..n].to_vec();
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Packet::parse(&b[..]).map(|_| ())
        };
        assert_eq!(bad(&|b| b.truncate(10)), Err(ParseError::Truncated));
        assert_eq!(bad(&|b| b[0] = 0), Err(ParseError::BadMagic));
        assert_eq!(bad(&|b| b[2] = 1), Err(ParseError::BadVersion(1)));
        assert_eq!(bad(&|b| b[3] = 99), Err(ParseError::UnknownKind(99)));
        assert_eq!(
            bad(&|b| b.push(0)),
            Err(ParseError::LengthMismatch {
                declared: 16,
                actual: 17
            })
        );
        assert_eq!(
            bad(&|b| {
                b.push(0);
                b[6..8].copy_from_slice(&17u16.to_be_bytes());
            }),
            Err(ParseError::BadPayload(Kind::Keepalive))
        );
        assert_eq!(
            emit(&hdr(Kind::Keepalive), &[], None, &mut out),
            Err(EmitError::NoKey("KEEPALIVE"))
        );
        assert!(emit(&hdr(Kind::Keepalive), &[1], Some(&k), &mut out).is_err());
        assert!(emit(&hdr(Kind::Data), &[0; 100], None, &mut out[..50]).is_err());
    }

    #[test]
    fn both_sides_derive_the_same_keys() {
        let secret = Secret::new(&[3u8; 32]).unwrap();
        let server = SessionKeys::derive(&secret, &[5u8; TOKEN_LEN]);
        let player = SessionKeys::from_session(server.session);
        let leave = SmallDatagram::simple(&hdr(Kind::Leave), &player);
        assert!(server.verify(&Packet::parse(leave.as_bytes()).unwrap()));
        let other_token = SessionKeys::derive(&secret, &[6u8; TOKEN_LEN]);
        assert!(!other_token.verify(&Packet::parse(leave.as_bytes()).unwrap()));
    }

    #[test]
    fn replies_are_never_larger_than_what_triggers_them() {
        let k = keys();
        let h = hdr(Kind::Join);
        let join = SmallDatagram::join(&h, &[1; TOKEN_LEN], None, &k);
        let echo = SmallDatagram::join(&h, &[1; TOKEN_LEN], Some(&[2; COOKIE_LEN]), &k);
        let ch = SmallDatagram::challenge(&h, &[2; COOKIE_LEN], &k);
        let ack = SmallDatagram::join_ack(
            &h,
            JoinAck {
                members: 1,
                keepalive_ms: 1,
                flags: 0,
                checkpoint_port: 0,
            },
            &k,
        );
        let err = SmallDatagram::error(4000, 1, 0, ErrorCode::NotMember);
        let probe = SmallDatagram::nonce(&hdr(Kind::Probe), 1, &k);
        let keepalive = SmallDatagram::simple(&hdr(Kind::Keepalive), &k);
        assert!(ch.len() <= join.len());
        assert!(ack.len() <= echo.len());
        // ERROR to a non-member: never larger than the smallest DATA.
        assert!(err.len() <= size::DATA_MIN);
        assert!(probe.len() <= keepalive.len());
        assert_eq!(
            (join.len(), echo.len(), ch.len(), ack.len(), err.len()),
            (72, 88, 56, 48, 28)
        );
    }

    #[test]
    fn a_version_1_client_gets_a_version_1_error_no_larger_than_its_request() {
        let mut v1 = [0u8; 48];
        v1[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        v1[2] = 1;
        v1[3] = 1;
        v1[4..6].copy_from_slice(&4000u16.to_be_bytes());
        v1[8..12].copy_from_slice(&7u32.to_be_bytes());
        let e = version1_error(&v1).unwrap();
        assert_eq!(
            (e[2], e[3], be16(&e[4..6]), be32(&e[8..12]), be16(&e[16..18])),
            (1, 7, 4000, 7, 6)
        );
        assert_eq!(
            version1_error(&v1[..16]),
            None,
            "a 16-byte request gets no 18-byte reply"
        );
        assert_eq!(
            version1_error(&v1[..23]),
            None,
            "nothing shorter than a header is answered"
        );
        assert!(version1_error(&v1[..24]).is_some());
        let mut v2 = v1;
        v2[2] = 2;
        assert_eq!(version1_error(&v2), None);
    }

    #[test]
    fn the_replay_window_accepts_each_sequence_once() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(0), "0 is never valid");
        assert!(w.accept(1));
        assert!(!w.accept(1));
        assert!(w.accept(10));
        assert!(w.accept(5), "late but inside the window");
        assert!(!w.accept(5));
        assert!(w.accept(100));
        assert!(!w.accept(36), "older than the window: refused");
        assert!(w.accept(37));
        assert!(w.accept(100 + 64));
        assert!(!w.accept(100), "now outside the window");
    }

    #[test]
    fn echo_echo_reply_and_moved_carry_their_fields_under_the_mac() {
        let k = keys();
        for kind in [Kind::Echo, Kind::EchoReply] {
            let d = SmallDatagram::nonce(&hdr(kind), 0x0102_0304_0506_0708, &k);
            let p = Packet::parse(d.as_bytes()).unwrap();
            assert_eq!((p.kind(), d.len(), p.nonce()), (kind, 40, Some(0x0102_0304_0506_0708)));
            assert!(k.verify(&p));
            assert_eq!(p.moved(), None);
        }
        for reason in MovedReason::ALL {
            let d = SmallDatagram::moved(&hdr(Kind::Keepalive), reason, 1500, &k);
            let p = Packet::parse(d.as_bytes()).unwrap();
            assert_eq!((p.kind(), d.len()), (Kind::Moved, size::MOVED));
            assert_eq!(
                p.moved(),
                Some(Moved {
                    reason: Ok(reason),
                    within_ms: 1500
                })
            );
            assert_eq!(&p.as_bytes()[28..32], &[0; 4], "reserved");
            assert!(k.verify(&p));
            assert_eq!(MovedReason::from_u16(reason as u16), Some(reason));
        }
        assert_eq!(MovedReason::from_u16(0), None);
        // ECHO_REPLY answers ECHO at exactly its size.
        assert_eq!(size::ECHO, size::PROBE);
    }

    #[test]
    fn error_codes_and_join_ack_flags() {
        for (i, c) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(c as u16, i as u16 + 1);
            assert_eq!(ErrorCode::from_u16(c as u16), Some(c));
            let e = SmallDatagram::error(4000, 1, 0, c);
            assert_eq!(Packet::parse(e.as_bytes()).unwrap().error_code(), Some(Ok(c)));
        }
        assert_eq!(ErrorCode::from_u16(9), Some(ErrorCode::Retry));
        assert_eq!(ErrorCode::from_u16(10), None);
        let ack = |flags| JoinAck {
            members: 1,
            keepalive_ms: 1,
            flags,
            checkpoint_port: 0,
        };
        assert!(ack(FLAG_TAGS | FLAG_INSTANCE).tags() && ack(FLAG_TAGS | FLAG_INSTANCE).instance());
        assert!(!ack(FLAG_TAGS | FLAG_SEALED).instance());
        assert!(!ack(FLAG_INSTANCE | 0xf8).tags(), "unknown bits are ignored");
        assert_eq!(MAX_GAME_PAYLOAD, 1440);
        assert_eq!(MAX_GAME_PAYLOAD - INSTANCE_LEN, 1432);
    }

    #[test]
    fn a_renewal_is_a_72_byte_join_with_the_membership_under_its_keys() {
        let (old, new) = (keys(), SessionKeys::from_session([4u8; 32]));
        let h = Header {
            membership: 0x1234_5678,
            ..hdr(Kind::Keepalive)
        };
        let d = SmallDatagram::renewal(&h, &[8; TOKEN_LEN], &old);
        let p = Packet::parse(d.as_bytes()).unwrap();
        assert_eq!(
            (p.kind(), d.len(), p.membership()),
            (Kind::Join, size::JOIN, 0x1234_5678)
        );
        assert!(p.is_renewal());
        assert_eq!(p.join_token(), Some(&[8; TOKEN_LEN]));
        assert_eq!(p.join_cookie(), None);
        assert!(old.verify(&p), "MAC'd under the membership's keys");
        assert!(!new.verify(&p));
        let first = SmallDatagram::join(&hdr(Kind::Join), &[8; TOKEN_LEN], None, &old);
        let first = Packet::parse(first.as_bytes()).unwrap();
        assert!(first.is_renewal(), "hdr() carries a membership id");
        let fresh = SmallDatagram::join(
            &Header {
                membership: 0,
                ..hdr(Kind::Join)
            },
            &[8; TOKEN_LEN],
            None,
            &old,
        );
        assert!(!Packet::parse(fresh.as_bytes()).unwrap().is_renewal());
    }

    #[test]
    fn renewal_time_is_a_third_of_the_lifetime_left_at_latest_10_s_before_expiry() {
        let t0 = 1_700_000_000_000u64;
        // 300 s token: renew with 100 s left.
        assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 300), t0 + 200_000);
        // 24 s token: a third left (8 s) would be later than 10 s before expiry.
        assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 24), t0 + 14_000);
        // 6 s token: at once.
        assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 6), t0);
        // Already expired: at once.
        assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 - 5), t0 - 5000);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_the_parser(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = Packet::parse(&b[..]) {
                let k = keys();
                let _ = (p.join_token(), p.join_cookie(), p.challenge_cookie(), p.nonce(), p.join_ack());
                let _ = (p.error_code(), p.tag(), p.signed(), p.payload(), p.seq(), p.membership());
                let _ = (p.moved(), p.is_renewal());
                let _ = (k.verify(&p), k.verify_tag(&p));
            }
        }

        #[test]
        fn header_like_bytes_never_panic(kind in 0u8..16, len in 0u16..100, tail in proptest::collection::vec(any::<u8>(), 0..100)) {
            let mut b = vec![0x52, 0x46, 2, kind, 0x0f, 0xa0];
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&[0; 16]);
            b.extend_from_slice(&tail);
            if let Ok(p) = Packet::parse(&b[..]) {
                let _ = (p.payload(), p.signed(), p.join_ack(), p.nonce(), p.moved());
            }
        }

        #[test]
        fn data_round_trips(group: u16, sender: u32, membership: u32, seq: u64, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let k = keys();
            let mut buf = vec![0u8; DATA_PAYLOAD + payload.len()];
            let h = Header { kind: Kind::Data, group, sender, membership, seq };
            let n = emit(&h, &payload, Some(&k), &mut buf).unwrap();
            let p = Packet::parse(&buf[..n]).unwrap();
            prop_assert_eq!((p.group(), p.sender(), p.membership(), p.seq()), (group, sender, membership, seq));
            prop_assert_eq!(p.payload(), &payload[..]);
            prop_assert!(k.verify_tag(&p));
        }

        #[test]
        fn the_window_matches_a_set_of_seen_numbers(seqs in proptest::collection::vec(1u64..300, 0..200)) {
            let mut w = ReplayWindow::default();
            let mut seen = std::collections::BTreeSet::new();
            for s in seqs {
                let highest = seen.iter().next_back().copied().unwrap_or(0);
                let model = !seen.contains(&s) && (s > highest || highest - s < 64);
                prop_assert_eq!(w.accept(s), model, "seq {}", s);
                if model {
                    seen.insert(s);
                }
            }
        }
    }
}
