//! Datagram types, ERROR codes, MOVED reasons and parse errors.

use super::*;
use std::fmt;

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

    pub(super) fn trailer(self) -> usize {
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
