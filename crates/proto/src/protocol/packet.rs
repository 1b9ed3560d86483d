//! Parsing: a checked borrowed view of a datagram, and the SipHash tag.

use super::*;

pub(super) fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

pub(super) fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

pub(super) fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

pub(super) fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// SipHash-2-4 of `d` under `key` with the 8-byte word at [`TAG`] read as
/// zero: the same value as siphasher's streaming hasher fed the three
/// pieces, computed a word at a time (the tag field is word-aligned), which
/// costs about two thirds of the instructions on every DATA the reflector
/// checks. `d` is at least [`TAG`]`.end` bytes long.
pub(super) fn siphash24_tag(key: &[u8; 16], d: &[u8]) -> u64 {
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

    pub(super) fn body(&self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0..2].copy_from_slice(&self.members.to_be_bytes());
        b[2..4].copy_from_slice(&self.keepalive_ms.to_be_bytes());
        b[4] = self.flags;
        b[6..8].copy_from_slice(&self.checkpoint_port.to_be_bytes());
        b
    }
}
