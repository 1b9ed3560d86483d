//! The checkpoint channel, version 2 (`docs/protocol.md`, "Checkpoints" and
//! "The channel, version 2"): a TCP side channel of the reflector, on the
//! port JOIN_ACK announces, where a member uploads the group's game state
//! when the reflector asks for it (CHECKPOINT_REQUEST) and where any member
//! fetches the latest stored state (FETCH) or the one before (FETCH_OTHER).
//!
//! One exchange per connection, fixed binary messages (big-endian), each
//! starting with [`MAGIC`] and [`VERSION`]:
//!
//! ```text
//! reflector -> client   HELLO    32 B
//! client -> reflector   REQUEST  64 B   (op UPLOAD, FETCH or FETCH_OTHER)
//! reflector -> client   REPLY    88 B   UPLOAD: CONTINUE (or REFUSED)
//! client -> reflector   state (body length bytes), body MAC (16 B)
//! reflector -> client   REPLY    88 B   STORED (or REFUSED)
//!                                       FETCH: CHECKPOINT + state, EMPTY or REFUSED
//! ```
//!
//! Every MAC is under the member's MAC key `Km` and covers the connection's
//! challenge (from the HELLO), so nothing recorded can be replayed on
//! another connection: the request MAC ([`request_mac`]), the body MAC
//! ([`body_mac`], [`BodyMac`]) and the reply MAC ([`reply_mac`]), which also
//! covers the request MAC. A REFUSED sent before the request MAC verified
//! carries an all-zero MAC ([`Reply::unauthenticated`]); a client takes it
//! only as "this exchange failed".
//!
//! The pure pieces (encode, strict decode, MACs, the state's SHA-256 digest)
//! serve both sides; the blocking client ([`upload`], [`fetch`],
//! [`fetch_other`]) follows the exchange over a [`TcpStream`].

use crate::protocol::{SessionKeys, MAC_LEN};
use bytes::Bytes;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::ops::Range;
use std::time::Duration;

type HmacSha256 = Hmac<Sha256>;

/// `"RFCK"`: the first four bytes of every channel message.
pub const MAGIC: u32 = 0x5246_434B;
/// The channel version this module speaks.
pub const VERSION: u8 = 2;
/// Message type byte (offset 5) of a HELLO.
pub const MSG_HELLO: u8 = 1;
/// Message type byte of a REQUEST.
pub const MSG_REQUEST: u8 = 2;
/// Message type byte of a REPLY.
pub const MSG_REPLY: u8 = 3;
pub const HELLO_LEN: usize = 32;
pub const REQUEST_LEN: usize = 64;
pub const REPLY_LEN: usize = 88;
/// The part of a REQUEST its MAC covers (after the challenge).
pub const REQUEST_SIGNED_LEN: usize = 48;
/// The part of a REPLY its MAC covers (after the challenge and request MAC).
pub const REPLY_SIGNED_LEN: usize = 72;
/// Length of the body MAC that follows an upload's state.
pub const BODY_MAC_LEN: usize = MAC_LEN;
/// Length of the state's SHA-256 digest in a REPLY.
pub const DIGEST_LEN: usize = 32;

/// `HMAC(Km, REQUEST_LABEL ‖ challenge ‖ request bytes 0..48)[..16]`.
pub const REQUEST_LABEL: &[u8] = b"reflector-channel-v2-request";
/// `HMAC(Km, BODY_LABEL ‖ challenge ‖ request MAC ‖ state)[..16]`.
pub const BODY_LABEL: &[u8] = b"reflector-channel-v2-body";
/// `HMAC(Km, REPLY_LABEL ‖ challenge ‖ request MAC ‖ reply bytes 0..72)[..16]`.
pub const REPLY_LABEL: &[u8] = b"reflector-channel-v2-reply";

/// Why a channel message was rejected. Small and `Copy`: decoding never
/// allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("not a checkpoint channel message (wrong magic)")]
    BadMagic,
    #[error("channel version {0} (this side speaks {VERSION})")]
    BadVersion(u8),
    #[error("message type {got} where {want} was expected")]
    BadMessage { got: u8, want: u8 },
    #[error("unknown op {0}")]
    UnknownOp(u8),
    #[error("unknown reply status {0}")]
    UnknownStatus(u8),
    #[error("unknown refusal code {0}")]
    BadRefusal(u8),
    #[error("byte {offset} must be zero (reserved, or a field this message does not use)")]
    NonZero { offset: usize },
}

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const MESSAGE: usize = 5;
}

fn be16(b: &[u8], r: Range<usize>) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[r]);
    u16::from_be_bytes(a)
}

fn be32(b: &[u8], r: Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[r]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], r: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[r]);
    u64::from_be_bytes(a)
}

/// Checks magic, version and message type: the first six bytes.
fn check_start(b: &[u8], want: u8) -> Result<(), DecodeError> {
    if be32(b, field::MAGIC) != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if b[field::VERSION] != VERSION {
        return Err(DecodeError::BadVersion(b[field::VERSION]));
    }
    if b[field::MESSAGE] != want {
        return Err(DecodeError::BadMessage {
            got: b[field::MESSAGE],
            want,
        });
    }
    Ok(())
}

fn put_start(b: &mut [u8], message: u8) {
    b[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    b[field::VERSION] = VERSION;
    b[field::MESSAGE] = message;
}

/// Every byte of `r` must be zero.
fn zero(b: &[u8], r: Range<usize>) -> Result<(), DecodeError> {
    match b[r.clone()].iter().position(|&x| x != 0) {
        Some(i) => Err(DecodeError::NonZero { offset: r.start + i }),
        None => Ok(()),
    }
}

fn mac16(keys: &SessionKeys, parts: &[&[u8]]) -> [u8; MAC_LEN] {
    // HMAC-SHA256 takes keys of any length: new_from_slice cannot fail.
    let mut m = HmacSha256::new_from_slice(keys.mac_key()).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    let full = m.finalize().into_bytes();
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&full[..MAC_LEN]);
    out
}

/// Equality with no early exit on the first differing byte.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The SHA-256 of a state, as a REPLY carries it (STORED, CHECKPOINT).
pub fn digest(state: &[u8]) -> [u8; DIGEST_LEN] {
    Sha256::digest(state).into()
}

/// The request MAC: `HMAC(Km, "reflector-channel-v2-request" ‖ challenge ‖
/// bytes 0..48)[..16]`.
pub fn request_mac(keys: &SessionKeys, challenge: u64, signed: &[u8; REQUEST_SIGNED_LEN]) -> [u8; MAC_LEN] {
    mac16(keys, &[REQUEST_LABEL, &challenge.to_be_bytes(), signed])
}

/// The body MAC of an upload: `HMAC(Km, "reflector-channel-v2-body" ‖
/// challenge ‖ request MAC ‖ state)[..16]`. A receiver that gets the state
/// in pieces uses [`BodyMac`].
pub fn body_mac(keys: &SessionKeys, challenge: u64, request_mac: &[u8; MAC_LEN], state: &[u8]) -> [u8; MAC_LEN] {
    let mut m = BodyMac::new(keys, challenge, request_mac);
    m.update(state);
    m.finish()
}

/// The reply MAC: `HMAC(Km, "reflector-channel-v2-reply" ‖ challenge ‖
/// request MAC ‖ bytes 0..72)[..16]`.
pub fn reply_mac(
    keys: &SessionKeys,
    challenge: u64,
    request_mac: &[u8; MAC_LEN],
    signed: &[u8; REPLY_SIGNED_LEN],
) -> [u8; MAC_LEN] {
    mac16(keys, &[REPLY_LABEL, &challenge.to_be_bytes(), request_mac, signed])
}

/// The body MAC computed as the state arrives (the reflector's side of an
/// upload): [`BodyMac::new`], [`BodyMac::update`] per piece, then
/// [`BodyMac::verify`] with the 16 bytes after the state.
#[derive(Clone)]
pub struct BodyMac(HmacSha256);

impl BodyMac {
    pub fn new(keys: &SessionKeys, challenge: u64, request_mac: &[u8; MAC_LEN]) -> BodyMac {
        let mut m = HmacSha256::new_from_slice(keys.mac_key()).expect("HMAC accepts any key length");
        m.update(BODY_LABEL);
        m.update(&challenge.to_be_bytes());
        m.update(request_mac);
        BodyMac(m)
    }

    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    pub fn finish(self) -> [u8; MAC_LEN] {
        let full = self.0.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }

    /// Constant-time check against the MAC that followed the state.
    pub fn verify(self, mac: &[u8; MAC_LEN]) -> bool {
        ct_eq(&self.finish(), mac)
    }
}

/// HELLO (32 bytes): the reflector's first message on every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// Fresh per connection, unpredictable: every MAC of the exchange covers it.
    pub challenge: u64,
    /// The largest state this reflector stores, bytes.
    pub max_state: u64,
    /// How long the reflector waits for the REQUEST.
    pub hello_deadline_ms: u32,
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        put_start(&mut b, MSG_HELLO);
        b[8..16].copy_from_slice(&self.challenge.to_be_bytes());
        b[16..24].copy_from_slice(&self.max_state.to_be_bytes());
        b[24..28].copy_from_slice(&self.hello_deadline_ms.to_be_bytes());
        b
    }

    /// Strict: magic, version, message and the reserved bytes 6..8, 28..32.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, DecodeError> {
        check_start(b, MSG_HELLO)?;
        zero(b, 6..8)?;
        zero(b, 28..32)?;
        Ok(Hello {
            challenge: be64(b, 8..16),
            max_state: be64(b, 16..24),
            hello_deadline_ms: be32(b, 24..28),
        })
    }
}

/// What a REQUEST asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Store the group's state, answering a CHECKPOINT_REQUEST.
    Upload = 1,
    /// The group's latest stored state.
    Fetch = 2,
    /// The stored state before the latest (from another member if possible).
    FetchOther = 3,
}

impl Op {
    pub const ALL: [Op; 3] = [Op::Upload, Op::Fetch, Op::FetchOther];

    pub fn from_u8(v: u8) -> Option<Op> {
        Op::ALL.into_iter().find(|o| *o as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Upload => "UPLOAD",
            Op::Fetch => "FETCH",
            Op::FetchOther => "FETCH_OTHER",
        }
    }
}

/// REQUEST (64 bytes): who asks, for what, under the member's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub op: Op,
    pub group: u16,
    pub player: u32,
    pub membership: u32,
    /// UPLOAD: the CHECKPOINT_REQUEST's nonce; otherwise zero.
    pub nonce: u64,
    /// UPLOAD: the state's length; otherwise zero.
    pub body_len: u64,
    /// UPLOAD: the state's game tick; otherwise zero.
    pub tick: u64,
    /// The request MAC ([`request_mac`]), bytes 48..64.
    pub mac: [u8; MAC_LEN],
}

impl Request {
    /// An UPLOAD request, MAC'd under the member's keys for this
    /// connection's challenge.
    pub fn upload(who: &Member<'_>, challenge: u64, nonce: u64, body_len: u64, tick: u64) -> Request {
        Request {
            op: Op::Upload,
            group: who.group,
            player: who.player,
            membership: who.membership,
            nonce,
            body_len,
            tick,
            mac: [0; MAC_LEN],
        }
        .signed(who.keys, challenge)
    }

    /// A FETCH or FETCH_OTHER request (`op` must not be [`Op::Upload`]:
    /// such a request would carry zero nonce and length).
    pub fn fetch(who: &Member<'_>, challenge: u64, op: Op) -> Request {
        Request {
            op,
            group: who.group,
            player: who.player,
            membership: who.membership,
            nonce: 0,
            body_len: 0,
            tick: 0,
            mac: [0; MAC_LEN],
        }
        .signed(who.keys, challenge)
    }

    /// The same request with its MAC computed under `keys` for `challenge`.
    pub fn signed(mut self, keys: &SessionKeys, challenge: u64) -> Request {
        self.mac = request_mac(keys, challenge, &self.signed_bytes());
        self
    }

    /// Bytes 0..48: what the request MAC covers.
    pub fn signed_bytes(&self) -> [u8; REQUEST_SIGNED_LEN] {
        let mut b = [0u8; REQUEST_SIGNED_LEN];
        put_start(&mut b, MSG_REQUEST);
        b[6] = self.op as u8;
        b[8..10].copy_from_slice(&self.group.to_be_bytes());
        b[12..16].copy_from_slice(&self.player.to_be_bytes());
        b[16..20].copy_from_slice(&self.membership.to_be_bytes());
        b[24..32].copy_from_slice(&self.nonce.to_be_bytes());
        b[32..40].copy_from_slice(&self.body_len.to_be_bytes());
        b[40..48].copy_from_slice(&self.tick.to_be_bytes());
        b
    }

    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[..REQUEST_SIGNED_LEN].copy_from_slice(&self.signed_bytes());
        b[REQUEST_SIGNED_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Strict, in the reflector's order of checks: magic, version, message;
    /// op known; flags and reserved bytes zero, and for FETCH and
    /// FETCH_OTHER the nonce, body length and tick zero. The MAC is checked
    /// separately ([`Request::verify`]) once the member's keys are known.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Result<Request, DecodeError> {
        check_start(b, MSG_REQUEST)?;
        let op = Op::from_u8(b[6]).ok_or(DecodeError::UnknownOp(b[6]))?;
        zero(b, 7..8)?;
        zero(b, 10..12)?;
        zero(b, 20..24)?;
        if op != Op::Upload {
            zero(b, 24..48)?;
        }
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[REQUEST_SIGNED_LEN..]);
        Ok(Request {
            op,
            group: be16(b, 8..10),
            player: be32(b, 12..16),
            membership: be32(b, 16..20),
            nonce: be64(b, 24..32),
            body_len: be64(b, 32..40),
            tick: be64(b, 40..48),
            mac,
        })
    }

    /// Constant-time check of the request MAC under the member's keys.
    pub fn verify(&self, keys: &SessionKeys, challenge: u64) -> bool {
        ct_eq(&request_mac(keys, challenge, &self.signed_bytes()), &self.mac)
    }
}

/// A REPLY's status byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Continue = 1,
    Stored = 2,
    Checkpoint = 3,
    Empty = 4,
    Refused = 5,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Continue,
        Status::Stored,
        Status::Checkpoint,
        Status::Empty,
        Status::Refused,
    ];

    pub fn from_u8(v: u8) -> Option<Status> {
        Status::ALL.into_iter().find(|s| *s as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Continue => "CONTINUE",
            Status::Stored => "STORED",
            Status::Checkpoint => "CHECKPOINT",
            Status::Empty => "EMPTY",
            Status::Refused => "REFUSED",
        }
    }
}

/// Why a request was refused (a REPLY's refusal code, byte 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[repr(u8)]
pub enum Refusal {
    #[error("not a member of that group (unknown player or membership)")]
    NotMember = 1,
    #[error("the MAC does not verify under the member's key")]
    BadMac = 2,
    #[error("no checkpoint request with that nonce is pending for this member")]
    NotRequested = 3,
    #[error("the state is larger than the reflector's bound")]
    TooLarge = 4,
    #[error("the request could not be decoded")]
    Malformed = 5,
    #[error("busy (too many connections, a fetch sooner than allowed, or the memory bound): try again later")]
    Busy = 6,
    #[error("no such group here")]
    NoGroup = 7,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::NotMember,
        Refusal::BadMac,
        Refusal::NotRequested,
        Refusal::TooLarge,
        Refusal::Malformed,
        Refusal::Busy,
        Refusal::NoGroup,
    ];

    pub fn from_u8(v: u8) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| *r as u8 == v)
    }
}

/// A stored checkpoint as STORED and CHECKPOINT describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// The checkpoint's number in its group.
    pub number: u64,
    /// The game tick the uploader gave.
    pub tick: u64,
    /// Who uploaded it.
    pub from_player: u32,
    /// The state's SHA-256.
    pub digest: [u8; DIGEST_LEN],
}

/// What a REPLY says; each status carries exactly the fields it uses (the
/// others are zero on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// UPLOAD accepted: send the state and its body MAC.
    Continue,
    /// The upload is stored.
    Stored(Stored),
    /// The requested checkpoint: `body_len` bytes of state follow the REPLY.
    Checkpoint {
        stored: Stored,
        body_len: u64,
        /// How old the stored state is (saturated at 2³²−1).
        age_ms: u32,
    },
    /// The group has no such checkpoint.
    Empty,
    Refused(Refusal),
}

impl Answer {
    pub fn status(&self) -> Status {
        match self {
            Answer::Continue => Status::Continue,
            Answer::Stored(_) => Status::Stored,
            Answer::Checkpoint { .. } => Status::Checkpoint,
            Answer::Empty => Status::Empty,
            Answer::Refused(_) => Status::Refused,
        }
    }
}

/// REPLY (88 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub answer: Answer,
    /// The reply MAC ([`reply_mac`]), all zero in an unauthenticated REFUSED.
    pub mac: [u8; MAC_LEN],
}

impl Reply {
    /// A reply MAC'd under the requester's keys (`request_mac`: the MAC of
    /// the REQUEST it answers, which verified).
    pub fn signed(answer: Answer, keys: &SessionKeys, challenge: u64, request_mac: &[u8; MAC_LEN]) -> Reply {
        let mut r = Reply {
            answer,
            mac: [0; MAC_LEN],
        };
        r.mac = reply_mac(keys, challenge, request_mac, &r.signed_bytes());
        r
    }

    /// A REFUSED sent before the request MAC verified (no key, or the MAC
    /// failed): its MAC is all zero.
    pub fn unauthenticated(code: Refusal) -> Reply {
        Reply {
            answer: Answer::Refused(code),
            mac: [0; MAC_LEN],
        }
    }

    /// Whether the MAC is all zero (an unauthenticated REFUSED, or a reply
    /// no client may act on).
    pub fn is_unauthenticated(&self) -> bool {
        self.mac == [0; MAC_LEN]
    }

    /// Bytes 0..72: what the reply MAC covers.
    pub fn signed_bytes(&self) -> [u8; REPLY_SIGNED_LEN] {
        let mut b = [0u8; REPLY_SIGNED_LEN];
        put_start(&mut b, MSG_REPLY);
        b[6] = self.answer.status() as u8;
        let stored = |b: &mut [u8; REPLY_SIGNED_LEN], s: &Stored| {
            b[8..16].copy_from_slice(&s.number.to_be_bytes());
            b[24..32].copy_from_slice(&s.tick.to_be_bytes());
            b[32..36].copy_from_slice(&s.from_player.to_be_bytes());
            b[40..72].copy_from_slice(&s.digest);
        };
        match &self.answer {
            Answer::Continue | Answer::Empty => {}
            Answer::Refused(code) => b[7] = *code as u8,
            Answer::Stored(s) => stored(&mut b, s),
            Answer::Checkpoint {
                stored: s,
                body_len,
                age_ms,
            } => {
                stored(&mut b, s);
                b[16..24].copy_from_slice(&body_len.to_be_bytes());
                b[36..40].copy_from_slice(&age_ms.to_be_bytes());
            }
        }
        b
    }

    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut b = [0u8; REPLY_LEN];
        b[..REPLY_SIGNED_LEN].copy_from_slice(&self.signed_bytes());
        b[REPLY_SIGNED_LEN..].copy_from_slice(&self.mac);
        b
    }

    /// Strict: magic, version, message, status known, the refusal code
    /// known in a REFUSED and zero otherwise, and every field the status
    /// does not use zero. The MAC is checked separately ([`Reply::verify`]).
    pub fn decode(b: &[u8; REPLY_LEN]) -> Result<Reply, DecodeError> {
        check_start(b, MSG_REPLY)?;
        let status = Status::from_u8(b[6]).ok_or(DecodeError::UnknownStatus(b[6]))?;
        if status != Status::Refused {
            zero(b, 7..8)?;
        }
        let stored = |b: &[u8; REPLY_LEN]| {
            let mut digest = [0u8; DIGEST_LEN];
            digest.copy_from_slice(&b[40..72]);
            Stored {
                number: be64(b, 8..16),
                tick: be64(b, 24..32),
                from_player: be32(b, 32..36),
                digest,
            }
        };
        let answer = match status {
            Status::Continue | Status::Empty | Status::Refused => {
                zero(b, 8..REPLY_SIGNED_LEN)?;
                match status {
                    Status::Continue => Answer::Continue,
                    Status::Empty => Answer::Empty,
                    _ => Answer::Refused(Refusal::from_u8(b[7]).ok_or(DecodeError::BadRefusal(b[7]))?),
                }
            }
            Status::Stored => {
                zero(b, 16..24)?;
                zero(b, 36..40)?;
                Answer::Stored(stored(b))
            }
            Status::Checkpoint => Answer::Checkpoint {
                stored: stored(b),
                body_len: be64(b, 16..24),
                age_ms: be32(b, 36..40),
            },
        };
        let mut mac = [0u8; MAC_LEN];
        mac.copy_from_slice(&b[REPLY_SIGNED_LEN..]);
        Ok(Reply { answer, mac })
    }

    /// Constant-time check of the reply MAC under the requester's keys.
    pub fn verify(&self, keys: &SessionKeys, challenge: u64, request_mac: &[u8; MAC_LEN]) -> bool {
        ct_eq(
            &reply_mac(keys, challenge, request_mac, &self.signed_bytes()),
            &self.mac,
        )
    }
}

mod exchange;
pub use exchange::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_read_whether_or_not_it_was_authenticated() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let signed = ChannelError::Refused {
            addr,
            code: Refusal::NotMember,
        };
        let bare = ChannelError::Unauthenticated {
            addr,
            refusal: Some(Refusal::NotRequested),
        };
        assert_eq!(signed.refusal(), Some(Refusal::NotMember));
        assert_eq!(bare.refusal(), Some(Refusal::NotRequested));
        assert_eq!(ChannelError::BadMac { addr }.refusal(), None);
    }

    #[test]
    fn a_joiner_refusal_names_its_check_and_is_no_reflector_refusal() {
        use crate::sealed::checkpoint::CheckpointRefusal;
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for r in CheckpointRefusal::ALL {
            let e = ChannelError::JoinerRefused { addr, refusal: r };
            assert_eq!(e.joiner_refusal(), Some(r));
            assert_eq!(e.refusal(), None, "the reflector refused nothing");
            let text = e.to_string();
            assert!(text.contains(r.counter()) && text.contains("joiner's checks"), "{text}");
        }
        assert_eq!(ChannelError::BadMac { addr }.joiner_refusal(), None);
    }
    use std::net::TcpListener;

    fn keys() -> SessionKeys {
        SessionKeys::from_session([1; 32])
    }

    fn member(k: &SessionKeys) -> Member<'_> {
        Member {
            group: 4000,
            player: 9,
            membership: 0x0102_0304,
            keys: k,
        }
    }

    const CHALLENGE: u64 = 0x1122_3344_5566_7788;

    fn hello() -> Hello {
        Hello {
            challenge: CHALLENGE,
            max_state: 1 << 24,
            hello_deadline_ms: 2000,
        }
    }

    fn stored() -> Stored {
        Stored {
            number: 3,
            tick: 1234,
            from_player: 9,
            digest: digest(b"state"),
        }
    }

    fn answers() -> Vec<Answer> {
        let mut v = vec![
            Answer::Continue,
            Answer::Stored(stored()),
            Answer::Checkpoint {
                stored: stored(),
                body_len: 5,
                age_ms: 700,
            },
            Answer::Empty,
        ];
        v.extend(Refusal::ALL.map(Answer::Refused));
        v
    }

    fn requests(k: &SessionKeys) -> Vec<Request> {
        let m = member(k);
        vec![
            Request::upload(&m, CHALLENGE, 77, 5, 1234),
            Request::fetch(&m, CHALLENGE, Op::Fetch),
            Request::fetch(&m, CHALLENGE, Op::FetchOther),
        ]
    }

    #[test]
    fn every_message_round_trips() {
        let k = keys();
        let h = hello();
        assert_eq!(Hello::decode(&h.encode()), Ok(h));
        assert_eq!(&h.encode()[..6], &[0x52, 0x46, 0x43, 0x4b, 2, 1]);
        for r in requests(&k) {
            let b = r.encode();
            assert_eq!(Request::decode(&b), Ok(r));
            assert!(r.verify(&k, CHALLENGE));
            assert_eq!(b[6], r.op as u8);
        }
        let req_mac = requests(&k)[0].mac;
        for a in answers() {
            let r = Reply::signed(a, &k, CHALLENGE, &req_mac);
            let b = r.encode();
            assert_eq!(Reply::decode(&b), Ok(r), "{a:?}");
            assert!(r.verify(&k, CHALLENGE, &req_mac));
            assert!(!r.is_unauthenticated());
            assert_eq!(b[6], a.status() as u8);
        }
        for (i, c) in Refusal::ALL.into_iter().enumerate() {
            assert_eq!(c as u8, i as u8 + 1);
            assert_eq!(Refusal::from_u8(c as u8), Some(c));
        }
    }

    /// Flips every bit of every byte in `zeros` and expects `NonZero` there.
    fn each_reserved_byte_rejected<const N: usize, T: std::fmt::Debug>(
        good: [u8; N],
        zeros: &[Range<usize>],
        decode: impl Fn(&[u8; N]) -> Result<T, DecodeError>,
        what: &str,
    ) {
        for r in zeros {
            for i in r.clone() {
                for bit in 0..8 {
                    let mut b = good;
                    b[i] ^= 1 << bit;
                    assert_eq!(
                        decode(&b).err(),
                        Some(DecodeError::NonZero { offset: i }),
                        "{what}: byte {i} bit {bit}"
                    );
                }
            }
        }
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)] // lists of ranges, some of one
    fn every_reserved_or_unused_byte_non_zero_is_rejected() {
        let k = keys();
        each_reserved_byte_rejected(hello().encode(), &[6..8, 28..32], Hello::decode, "HELLO");
        let [up, fetch, other] = requests(&k)[..] else {
            unreachable!()
        };
        each_reserved_byte_rejected(up.encode(), &[7..8, 10..12, 20..24], Request::decode, "UPLOAD");
        for r in [fetch, other] {
            each_reserved_byte_rejected(r.encode(), &[7..8, 10..12, 20..48], Request::decode, r.op.name());
        }
        let m = up.mac;
        let reply = |a| Reply::signed(a, &k, CHALLENGE, &m).encode();
        each_reserved_byte_rejected(reply(Answer::Continue), &[7..72], Reply::decode, "CONTINUE");
        each_reserved_byte_rejected(reply(Answer::Empty), &[7..72], Reply::decode, "EMPTY");
        each_reserved_byte_rejected(
            reply(Answer::Refused(Refusal::Busy)),
            &[8..72],
            Reply::decode,
            "REFUSED",
        );
        each_reserved_byte_rejected(
            reply(Answer::Stored(stored())),
            &[7..8, 16..24, 36..40],
            Reply::decode,
            "STORED",
        );
        let ck = reply(Answer::Checkpoint {
            stored: stored(),
            body_len: 5,
            age_ms: 1,
        });
        each_reserved_byte_rejected(ck, &[7..8], Reply::decode, "CHECKPOINT");
    }

    #[test]
    fn magic_version_message_op_status_and_codes_are_checked() {
        let k = keys();
        let h = hello().encode();
        let r = requests(&k)[0].encode();
        let p = Reply::signed(Answer::Empty, &k, CHALLENGE, &[0; 16]).encode();
        let with = |mut b: [u8; 88], i: usize, v: u8| {
            b[i] = v;
            b
        };
        let mut bad = h;
        bad[0] = b'X';
        assert_eq!(Hello::decode(&bad), Err(DecodeError::BadMagic));
        bad = h;
        bad[4] = 1;
        assert_eq!(Hello::decode(&bad), Err(DecodeError::BadVersion(1)));
        bad = h;
        bad[5] = MSG_REPLY;
        assert_eq!(Hello::decode(&bad), Err(DecodeError::BadMessage { got: 3, want: 1 }));
        let mut badr = r;
        badr[6] = 4;
        assert_eq!(Request::decode(&badr), Err(DecodeError::UnknownOp(4)));
        badr[6] = 0;
        assert_eq!(Request::decode(&badr), Err(DecodeError::UnknownOp(0)));
        assert_eq!(Reply::decode(&with(p, 6, 6)), Err(DecodeError::UnknownStatus(6)));
        assert_eq!(Reply::decode(&with(p, 6, 0)), Err(DecodeError::UnknownStatus(0)));
        let refused = Reply::unauthenticated(Refusal::NotMember).encode();
        assert_eq!(Reply::decode(&with(refused, 7, 0)), Err(DecodeError::BadRefusal(0)));
        assert_eq!(Reply::decode(&with(refused, 7, 8)), Err(DecodeError::BadRefusal(8)));
    }

    #[test]
    fn every_mac_bit_flip_is_rejected() {
        let k = keys();
        for r in requests(&k) {
            let b = r.encode();
            for i in 0..REQUEST_LEN * 8 {
                let mut f = b;
                f[i / 8] ^= 1 << (i % 8);
                if let Ok(d) = Request::decode(&f) {
                    assert!(!d.verify(&k, CHALLENGE), "{:?}: bit {i}", r.op);
                }
            }
            assert!(!r.verify(&k, CHALLENGE + 1), "another connection's challenge");
            assert!(!r.verify(&SessionKeys::from_session([2; 32]), CHALLENGE));
        }
        let req_mac = requests(&k)[0].mac;
        for a in answers() {
            let b = Reply::signed(a, &k, CHALLENGE, &req_mac).encode();
            for i in 0..REPLY_LEN * 8 {
                let mut f = b;
                f[i / 8] ^= 1 << (i % 8);
                if let Ok(d) = Reply::decode(&f) {
                    assert!(!d.verify(&k, CHALLENGE, &req_mac), "{a:?}: bit {i}");
                }
            }
            let r = Reply::decode(&b).unwrap();
            let mut other_req = req_mac;
            other_req[0] ^= 1;
            assert!(!r.verify(&k, CHALLENGE, &other_req), "bound to the request");
        }
        let m = body_mac(&k, CHALLENGE, &req_mac, b"state");
        let mut inc = BodyMac::new(&k, CHALLENGE, &req_mac);
        inc.update(b"st");
        inc.update(b"ate");
        assert!(inc.clone().verify(&m));
        for i in 0..MAC_LEN * 8 {
            let mut f = m;
            f[i / 8] ^= 1 << (i % 8);
            assert!(!inc.clone().verify(&f));
        }
        assert_ne!(body_mac(&k, CHALLENGE, &req_mac, b"statf"), m);
        assert_ne!(body_mac(&k, CHALLENGE ^ 1, &req_mac, b"state"), m);
    }

    #[test]
    fn a_refused_with_a_zero_mac_is_recognised_as_unauthenticated() {
        let r = Reply::unauthenticated(Refusal::BadMac);
        let b = r.encode();
        assert_eq!(&b[72..], &[0; 16]);
        let d = Reply::decode(&b).unwrap();
        assert!(d.is_unauthenticated());
        assert_eq!(d.answer, Answer::Refused(Refusal::BadMac));
        assert!(!d.verify(&keys(), CHALLENGE, &[0; 16]));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic_the_decoders_and_what_decodes_re_encodes(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), REPLY_LEN),
            start in proptest::prelude::any::<bool>(),
        ) {
            let mut b: [u8; REPLY_LEN] = b.try_into().unwrap();
            if start {
                // Past the magic and version most of the time, so the
                // later checks are reached.
                b[..5].copy_from_slice(&[0x52, 0x46, 0x43, 0x4b, VERSION]);
            }
            let k = keys();
            for m in [MSG_HELLO, MSG_REQUEST, MSG_REPLY] {
                b[5] = if start { m } else { b[5] };
                if let Ok(h) = Hello::decode(b[..HELLO_LEN].try_into().unwrap()) {
                    proptest::prop_assert_eq!(&h.encode()[..], &b[..HELLO_LEN]);
                }
                if let Ok(r) = Request::decode(b[..REQUEST_LEN].try_into().unwrap()) {
                    proptest::prop_assert_eq!(&r.encode()[..], &b[..REQUEST_LEN]);
                    let _ = r.verify(&k, CHALLENGE);
                }
                if let Ok(r) = Reply::decode(&b) {
                    proptest::prop_assert_eq!(r.encode(), b);
                    let _ = r.verify(&k, CHALLENGE, &[0; 16]);
                }
            }
        }
    }

    /// A scripted reflector on loopback: sends HELLO, reads the request,
    /// answers with `script` (which sees the request and the stream).
    fn serve(script: impl FnOnce(&mut TcpStream, Request) + Send + 'static) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            s.write_all(&hello().encode()).unwrap();
            let mut b = [0u8; REQUEST_LEN];
            s.read_exact(&mut b).unwrap();
            script(&mut s, Request::decode(&b).unwrap());
        });
        addr
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn upload_and_fetch_follow_the_exchange() {
        let k = keys();
        let state = Bytes::from_static(b"the group's state");
        let st = state.clone();
        let addr = serve(move |s, req| {
            let k = keys();
            assert!(req.verify(&k, CHALLENGE));
            assert_eq!((req.op, req.nonce, req.body_len, req.tick), (Op::Upload, 77, 17, 1234));
            s.write_all(&Reply::signed(Answer::Continue, &k, CHALLENGE, &req.mac).encode())
                .unwrap();
            let mut body = vec![0u8; req.body_len as usize];
            s.read_exact(&mut body).unwrap();
            let mut mac = [0u8; 16];
            s.read_exact(&mut mac).unwrap();
            let mut m = BodyMac::new(&k, CHALLENGE, &req.mac);
            m.update(&body);
            assert!(m.verify(&mac));
            assert_eq!(body, st);
            let stored = Stored {
                number: 41,
                tick: req.tick,
                from_player: req.player,
                digest: digest(&body),
            };
            s.write_all(&Reply::signed(Answer::Stored(stored), &k, CHALLENGE, &req.mac).encode())
                .unwrap();
        });
        assert_eq!(upload(addr, member(&k), 77, 1234, state.clone(), T).unwrap(), 41);

        let st = state.clone();
        let addr = serve(move |s, req| {
            let k = keys();
            assert!(req.verify(&k, CHALLENGE));
            assert_eq!(req.op, Op::FetchOther);
            let a = Answer::Checkpoint {
                stored: Stored {
                    number: 40,
                    tick: 1200,
                    from_player: 5,
                    digest: digest(&st),
                },
                body_len: st.len() as u64,
                age_ms: 300,
            };
            s.write_all(&Reply::signed(a, &k, CHALLENGE, &req.mac).encode())
                .unwrap();
            s.write_all(&st).unwrap();
        });
        let f = fetch_other(addr, member(&k), 1 << 20, T).unwrap().unwrap();
        assert_eq!((f.seq, f.tick, f.age_ms, f.from_player), (40, 1200, 300, 5));
        assert_eq!((f.state, f.digest), (state.clone(), digest(&state)));

        let addr = serve(|s, req| {
            s.write_all(&Reply::signed(Answer::Empty, &keys(), CHALLENGE, &req.mac).encode())
                .unwrap();
        });
        assert_eq!(fetch(addr, member(&k), 1 << 20, T).unwrap(), None);
    }

    #[test]
    fn the_client_acts_only_on_authenticated_replies_and_checked_states() {
        let k = keys();
        let addr = serve(|s, _| {
            s.write_all(&Reply::unauthenticated(Refusal::NotMember).encode())
                .unwrap()
        });
        assert!(matches!(
            fetch(addr, member(&k), 1 << 20, T),
            Err(ChannelError::Unauthenticated {
                refusal: Some(Refusal::NotMember),
                ..
            })
        ));
        // A REFUSED under another key (a forgery) is not a refusal.
        let addr = serve(|s, req| {
            let other = SessionKeys::from_session([2; 32]);
            s.write_all(&Reply::signed(Answer::Refused(Refusal::Busy), &other, CHALLENGE, &req.mac).encode())
                .unwrap()
        });
        assert!(matches!(
            fetch(addr, member(&k), 1 << 20, T),
            Err(ChannelError::BadMac { .. })
        ));
        let addr = serve(|s, req| {
            s.write_all(&Reply::signed(Answer::Refused(Refusal::Busy), &keys(), CHALLENGE, &req.mac).encode())
                .unwrap()
        });
        assert!(matches!(
            fetch(addr, member(&k), 1 << 20, T),
            Err(ChannelError::Refused {
                code: Refusal::Busy,
                ..
            })
        ));
        // A state that is not the digest's is refused.
        let addr = serve(|s, req| {
            let a = Answer::Checkpoint {
                stored: stored(),
                body_len: 5,
                age_ms: 0,
            };
            s.write_all(&Reply::signed(a, &keys(), CHALLENGE, &req.mac).encode())
                .unwrap();
            s.write_all(b"statf").unwrap();
        });
        assert!(matches!(
            fetch(addr, member(&k), 1 << 20, T),
            Err(ChannelError::Mismatch { .. })
        ));
        // Larger than the client accepts: not read.
        let addr = serve(|s, req| {
            let a = Answer::Checkpoint {
                stored: stored(),
                body_len: 5,
                age_ms: 0,
            };
            s.write_all(&Reply::signed(a, &keys(), CHALLENGE, &req.mac).encode())
                .unwrap();
        });
        assert!(matches!(
            fetch(addr, member(&k), 4, T),
            Err(ChannelError::TooLarge { len: 5, max: 4, .. })
        ));
        // A version-1 reflector fails on the HELLO's first bytes.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut h = hello().encode();
            h[4] = 1;
            s.write_all(&h).unwrap();
        });
        assert!(matches!(
            fetch(addr, member(&k), 1 << 20, T),
            Err(ChannelError::Version { version: 1, .. })
        ));
    }
}
