//! The reflector's datagram format: a 16-byte versioned header on every
//! datagram, followed by a type-specific payload. Layouts are documented in
//! `docs/protocol.md`; this module is the one place that knows the offsets.
//!
//! Parsing is a checked borrowed view ([`Packet::parse`]): once it returns
//! `Ok`, no accessor can panic, whatever bytes came off the network. Errors
//! are a small `Copy` enum so the hot path never allocates on bad input.

use std::fmt;

/// `"RF"`: lets us drop stray traffic (scanners, other protocols) cheaply.
pub const MAGIC: u16 = 0x5246;
/// Bumped on any incompatible layout change; other versions are dropped.
pub const VERSION: u8 = 1;
/// Size of the fixed header that starts every datagram.
pub const HEADER_LEN: usize = 16;
/// Largest UDP payload over IPv4 (65535 - 20 IP - 8 UDP).
pub const MAX_DATAGRAM: usize = 65_507;
/// Largest payload after our header.
pub const MAX_PAYLOAD: usize = MAX_DATAGRAM - HEADER_LEN;

/// Length of a join token issued by the control server.
pub const TOKEN_LEN: usize = 32;
/// Length of the stateless join cookie.
pub const COOKIE_LEN: usize = 16;
/// Truncated MAC length used by tokens and cookies (128 bits).
pub const MAC_LEN: usize = 16;

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const GROUP: Range<usize> = 4..6;
    pub const LENGTH: Range<usize> = 6..8;
    pub const SENDER: Range<usize> = 8..12;
    pub const SEQ: Range<usize> = 12..16;
}

/// Datagram types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Client asks to join; carries a token, and on the second step the cookie.
    Join = 1,
    /// Reflector's stateless address check: echo this cookie in a new JOIN.
    JoinChallenge = 2,
    /// The sender is now a member.
    JoinAck = 3,
    /// Member leaves at once.
    Leave = 4,
    /// Member is alive; refreshes its expiry.
    Keepalive = 5,
    /// Game data, fanned out to every other member.
    Data = 6,
    /// Something was refused; payload is a 2-byte [`ErrorCode`].
    Error = 7,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::Join,
        Kind::JoinChallenge,
        Kind::JoinAck,
        Kind::Leave,
        Kind::Keepalive,
        Kind::Data,
        Kind::Error,
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
        }
    }
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
    /// DATA/KEEPALIVE from an address that is not a member: join first.
    NotMember = 4,
    /// The group is full.
    GroupFull = 5,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Option<ErrorCode> {
        Some(match v {
            1 => ErrorCode::BadToken,
            2 => ErrorCode::ExpiredToken,
            3 => ErrorCode::BadCookie,
            4 => ErrorCode::NotMember,
            5 => ErrorCode::GroupFull,
            _ => return None,
        })
    }
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
    /// The payload does not have the size its type requires.
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
                    "length field says {declared} bytes of payload, datagram has {actual}"
                )
            }
            ParseError::BadPayload(k) => write!(f, "{} payload has the wrong size", k.name()),
        }
    }
}

impl std::error::Error for ParseError {}

/// A checked, borrowed view of one datagram.
#[derive(Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    kind: Kind,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Validates header and payload size for the type; after `Ok`, every
    /// accessor is in bounds.
    pub fn parse(buf: T) -> Result<Packet<T>, ParseError> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(ParseError::Truncated);
        }
        if u16::from_be_bytes([b[0], b[1]]) != MAGIC {
            return Err(ParseError::BadMagic);
        }
        if b[field::VERSION] != VERSION {
            return Err(ParseError::BadVersion(b[field::VERSION]));
        }
        let kind = Kind::from_u8(b[field::KIND]).ok_or(ParseError::UnknownKind(b[field::KIND]))?;
        let declared = u16::from_be_bytes([b[field::LENGTH.start], b[field::LENGTH.start + 1]]);
        let actual = b.len() - HEADER_LEN;
        if usize::from(declared) != actual {
            return Err(ParseError::LengthMismatch { declared, actual });
        }
        let ok = match kind {
            Kind::Join => actual == TOKEN_LEN || actual == TOKEN_LEN + COOKIE_LEN,
            Kind::JoinChallenge => actual == COOKIE_LEN,
            Kind::JoinAck => actual == JOIN_ACK_PAYLOAD,
            Kind::Leave | Kind::Keepalive => actual == 0,
            Kind::Data => true,
            Kind::Error => actual == 2,
        };
        if !ok {
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

    pub fn sender(&self) -> u32 {
        be32(&self.bytes()[field::SENDER])
    }

    pub fn seq(&self) -> u32 {
        be32(&self.bytes()[field::SEQ])
    }

    pub fn payload(&self) -> &[u8] {
        &self.bytes()[HEADER_LEN..]
    }

    /// The whole datagram, header included (what the reflector forwards).
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes()
    }

    /// JOIN: the token bytes (first [`TOKEN_LEN`] bytes of the payload).
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

    /// JOIN_ACK: (members after the join, keepalive interval in ms).
    pub fn join_ack(&self) -> Option<JoinAck> {
        if self.kind != Kind::JoinAck {
            return None;
        }
        let p = self.payload();
        Some(JoinAck {
            members: be16(&p[0..2]),
            keepalive_ms: be16(&p[2..4]),
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
}

/// Payload of JOIN_ACK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAck {
    pub members: u16,
    pub keepalive_ms: u16,
}

const JOIN_ACK_PAYLOAD: usize = 4;

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Header fields of a datagram to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub group: u16,
    pub sender: u32,
    pub seq: u32,
}

/// Why a datagram could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    #[error("buffer of {have} bytes is too small for a {need}-byte datagram")]
    BufferTooSmall { need: usize, have: usize },
    #[error("payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte maximum")]
    PayloadTooLarge(usize),
}

/// Writes header + payload into `out`; returns the datagram length.
pub fn emit(h: &Header, payload: &[u8], out: &mut [u8]) -> Result<usize, EmitError> {
    let len = write_header(h, payload.len(), out)?;
    out[HEADER_LEN..len].copy_from_slice(payload);
    Ok(len)
}

/// Writes only the header for a payload of `payload_len` bytes that the
/// caller places (or already placed) at `out[HEADER_LEN..]`. Lets bots write
/// their payload in place without an intermediate buffer.
pub fn write_header(h: &Header, payload_len: usize, out: &mut [u8]) -> Result<usize, EmitError> {
    if payload_len > MAX_PAYLOAD {
        return Err(EmitError::PayloadTooLarge(payload_len));
    }
    let len = HEADER_LEN + payload_len;
    if out.len() < len {
        return Err(EmitError::BufferTooSmall {
            need: len,
            have: out.len(),
        });
    }
    out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    out[field::VERSION] = VERSION;
    out[field::KIND] = h.kind as u8;
    out[field::GROUP].copy_from_slice(&h.group.to_be_bytes());
    // Cast is checked above: payload_len <= MAX_PAYLOAD < u16::MAX.
    out[field::LENGTH].copy_from_slice(&(payload_len as u16).to_be_bytes());
    out[field::SENDER].copy_from_slice(&h.sender.to_be_bytes());
    out[field::SEQ].copy_from_slice(&h.seq.to_be_bytes());
    Ok(len)
}

/// A small fixed-capacity datagram for control replies (challenge, ack,
/// error): built on the stack, no allocation.
#[derive(Clone, Copy)]
pub struct SmallDatagram {
    buf: [u8; HEADER_LEN + TOKEN_LEN + COOKIE_LEN],
    len: usize,
}

impl SmallDatagram {
    fn new(h: &Header, payload: &[u8]) -> SmallDatagram {
        let mut buf = [0u8; HEADER_LEN + TOKEN_LEN + COOKIE_LEN];
        // Every caller passes a payload of at most TOKEN_LEN + COOKIE_LEN
        // bytes (the largest control payload), so emit cannot fail.
        let len = emit(h, payload, &mut buf).expect("control payload fits the small buffer");
        SmallDatagram { buf, len }
    }

    pub fn join(group: u16, sender: u32, token: &[u8; TOKEN_LEN], cookie: Option<&[u8; COOKIE_LEN]>) -> Self {
        let h = Header {
            kind: Kind::Join,
            group,
            sender,
            seq: 0,
        };
        let mut p = [0u8; TOKEN_LEN + COOKIE_LEN];
        p[..TOKEN_LEN].copy_from_slice(token);
        match cookie {
            Some(c) => {
                p[TOKEN_LEN..].copy_from_slice(c);
                SmallDatagram::new(&h, &p)
            }
            None => SmallDatagram::new(&h, &p[..TOKEN_LEN]),
        }
    }

    pub fn challenge(group: u16, sender: u32, cookie: &[u8; COOKIE_LEN]) -> Self {
        SmallDatagram::new(
            &Header {
                kind: Kind::JoinChallenge,
                group,
                sender,
                seq: 0,
            },
            cookie,
        )
    }

    pub fn join_ack(group: u16, sender: u32, ack: JoinAck) -> Self {
        let mut p = [0u8; JOIN_ACK_PAYLOAD];
        p[0..2].copy_from_slice(&ack.members.to_be_bytes());
        p[2..4].copy_from_slice(&ack.keepalive_ms.to_be_bytes());
        SmallDatagram::new(
            &Header {
                kind: Kind::JoinAck,
                group,
                sender,
                seq: 0,
            },
            &p,
        )
    }

    pub fn error(group: u16, sender: u32, code: ErrorCode) -> Self {
        SmallDatagram::new(
            &Header {
                kind: Kind::Error,
                group,
                sender,
                seq: 0,
            },
            &(code as u16).to_be_bytes(),
        )
    }

    pub fn simple(kind: Kind, group: u16, sender: u32, seq: u32) -> Self {
        SmallDatagram::new(
            &Header {
                kind,
                group,
                sender,
                seq,
            },
            &[],
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn data_round_trip() {
        let mut buf = [0u8; 200];
        let h = Header {
            kind: Kind::Data,
            group: 4001,
            sender: 77,
            seq: 123_456,
        };
        let n = emit(&h, b"hello game", &mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 10);
        let p = Packet::parse(&buf[..n]).unwrap();
        assert_eq!(p.kind(), Kind::Data);
        assert_eq!(p.group(), 4001);
        assert_eq!(p.sender(), 77);
        assert_eq!(p.seq(), 123_456);
        assert_eq!(p.payload(), b"hello game");
    }

    #[test]
    fn control_round_trips() {
        let token = [7u8; TOKEN_LEN];
        let cookie = [9u8; COOKIE_LEN];
        let j1 = SmallDatagram::join(5, 6, &token, None);
        let p = Packet::parse(j1.as_bytes()).unwrap();
        assert_eq!(p.join_token(), Some(&token));
        assert_eq!(p.join_cookie(), None);
        let j2 = SmallDatagram::join(5, 6, &token, Some(&cookie));
        let p = Packet::parse(j2.as_bytes()).unwrap();
        assert_eq!(p.join_cookie(), Some(&cookie));
        let c = SmallDatagram::challenge(5, 6, &cookie);
        assert_eq!(Packet::parse(c.as_bytes()).unwrap().challenge_cookie(), Some(&cookie));
        let ack = JoinAck {
            members: 3,
            keepalive_ms: 1000,
        };
        let a = SmallDatagram::join_ack(5, 6, ack);
        assert_eq!(Packet::parse(a.as_bytes()).unwrap().join_ack(), Some(ack));
        let e = SmallDatagram::error(5, 6, ErrorCode::NotMember);
        assert_eq!(
            Packet::parse(e.as_bytes()).unwrap().error_code(),
            Some(Ok(ErrorCode::NotMember))
        );
        for k in [Kind::Leave, Kind::Keepalive] {
            let d = SmallDatagram::simple(k, 1, 2, 3);
            assert_eq!(d.len(), HEADER_LEN);
            assert_eq!(Packet::parse(d.as_bytes()).unwrap().kind(), k);
        }
    }

    #[test]
    fn replies_are_never_larger_than_what_triggers_them() {
        let token = [0u8; TOKEN_LEN];
        let first_join = SmallDatagram::join(1, 1, &token, None).len();
        let second_join = SmallDatagram::join(1, 1, &token, Some(&[0; COOKIE_LEN])).len();
        assert!(SmallDatagram::challenge(1, 1, &[0; COOKIE_LEN]).len() <= first_join);
        assert!(SmallDatagram::error(1, 1, ErrorCode::BadToken).len() <= first_join);
        assert!(
            SmallDatagram::join_ack(
                1,
                1,
                JoinAck {
                    members: 1,
                    keepalive_ms: 1
                }
            )
            .len()
                <= second_join
        );
    }

    #[test]
    fn rejects_bad_headers() {
        let mut buf = [0u8; 64];
        let n = emit(
            &Header {
                kind: Kind::Data,
                group: 1,
                sender: 2,
                seq: 3,
            },
            b"abc",
            &mut buf,
        )
        .unwrap();
        assert_eq!(Packet::parse(&buf[..HEADER_LEN - 1]).err(), Some(ParseError::Truncated));
        let mut b = buf;
        b[0] = 0;
        assert_eq!(Packet::parse(&b[..n]).err(), Some(ParseError::BadMagic));
        let mut b = buf;
        b[2] = 9;
        assert_eq!(Packet::parse(&b[..n]).err(), Some(ParseError::BadVersion(9)));
        let mut b = buf;
        b[3] = 99;
        assert_eq!(Packet::parse(&b[..n]).err(), Some(ParseError::UnknownKind(99)));
        assert_eq!(
            Packet::parse(&buf[..n - 1]).err(),
            Some(ParseError::LengthMismatch { declared: 3, actual: 2 })
        );
        let mut b = buf;
        b[3] = Kind::Keepalive as u8;
        assert_eq!(
            Packet::parse(&b[..n]).err(),
            Some(ParseError::BadPayload(Kind::Keepalive))
        );
    }

    #[test]
    fn emit_checks_sizes() {
        let mut small = [0u8; 10];
        let h = Header {
            kind: Kind::Data,
            group: 1,
            sender: 2,
            seq: 3,
        };
        assert!(matches!(
            emit(&h, b"", &mut small),
            Err(EmitError::BufferTooSmall { .. })
        ));
        let big = vec![0u8; MAX_PAYLOAD + 1];
        let mut out = vec![0u8; MAX_DATAGRAM + 10];
        assert_eq!(
            emit(&h, &big, &mut out),
            Err(EmitError::PayloadTooLarge(MAX_PAYLOAD + 1))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = Packet::parse(&bytes[..]) {
                // Every accessor must be safe on anything parse accepted.
                let _ = (p.group(), p.sender(), p.seq(), p.payload().len());
                let _ = (p.join_token(), p.join_cookie(), p.challenge_cookie(), p.join_ack(), p.error_code());
            }
        }

        #[test]
        fn header_like_bytes_never_panic(kind in 0u8..10, len in 0u16..80, tail in proptest::collection::vec(any::<u8>(), 0..80)) {
            let mut b = vec![0x52, 0x46, VERSION, kind, 0, 1];
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&[0; 8]);
            b.extend_from_slice(&tail);
            if let Ok(p) = Packet::parse(&b[..]) {
                let _ = (p.join_token(), p.join_cookie(), p.challenge_cookie(), p.join_ack(), p.error_code());
                prop_assert_eq!(p.payload().len(), usize::from(len));
            }
        }

        /// Random bytes rarely get past the magic number; mutating valid
        /// datagrams of every type (flipped bytes, truncation, extension)
        /// reaches the type and length checks and the accessors.
        #[test]
        fn mutated_valid_datagrams_never_panic(
            kind in 0usize..7,
            flips in proptest::collection::vec((0usize..80, any::<u8>()), 0..4),
            cut in 0usize..80,
            extra in proptest::collection::vec(any::<u8>(), 0..4),
        ) {
            let token = [3u8; TOKEN_LEN];
            let cookie = [4u8; COOKIE_LEN];
            let base = match kind {
                0 => SmallDatagram::join(1, 2, &token, None),
                1 => SmallDatagram::join(1, 2, &token, Some(&cookie)),
                2 => SmallDatagram::challenge(1, 2, &cookie),
                3 => SmallDatagram::join_ack(1, 2, JoinAck { members: 1, keepalive_ms: 5 }),
                4 => SmallDatagram::error(1, 2, ErrorCode::BadCookie),
                5 => SmallDatagram::simple(Kind::Keepalive, 1, 2, 3),
                _ => SmallDatagram::simple(Kind::Leave, 1, 2, 3),
            };
            let mut b = base.as_bytes().to_vec();
            for (i, v) in flips {
                if let Some(x) = b.get_mut(i) {
                    *x = v;
                }
            }
            b.truncate(cut.max(1));
            b.extend_from_slice(&extra);
            if let Ok(p) = Packet::parse(&b[..]) {
                let _ = (p.group(), p.sender(), p.seq(), p.payload().len());
                let _ = (p.join_token(), p.join_cookie(), p.challenge_cookie(), p.join_ack(), p.error_code());
                prop_assert_eq!(p.payload().len() + HEADER_LEN, b.len());
            }
        }

        #[test]
        fn data_round_trips(group: u16, sender: u32, seq: u32, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut buf = vec![0u8; HEADER_LEN + payload.len()];
            let h = Header { kind: Kind::Data, group, sender, seq };
            let n = emit(&h, &payload, &mut buf).unwrap();
            let p = Packet::parse(&buf[..n]).unwrap();
            prop_assert_eq!((p.group(), p.sender(), p.seq()), (group, sender, seq));
            prop_assert_eq!(p.payload(), &payload[..]);
        }
    }
}
