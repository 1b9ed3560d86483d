//! Protocol version 2 (`docs/protocol-v2.md`): the 24-byte header, every
//! datagram type with its fixed size, the session keys derived from a token,
//! control MACs (HMAC-SHA256, truncated), DATA tags (SipHash-2-4, which a
//! BPF program can compute) and the replay window. Pure: bytes in, bytes
//! and verdicts out; the parser never panics and never allocates.

use crate::auth::Secret;
use crate::protocol::{COOKIE_LEN, MAGIC, MAX_DATAGRAM, TOKEN_LEN};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::hash::Hasher;
use std::ops::Range;

type HmacSha256 = Hmac<Sha256>;

pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 24;
/// Control MAC (JOIN, JOIN_CHALLENGE, JOIN_ACK, LEAVE, KEEPALIVE).
pub const MAC_LEN: usize = 16;
/// Short MAC of the 40-byte PROBE, PROBE_REPLY and CHECKPOINT_REQUEST.
pub const SHORT_MAC_LEN: usize = 8;
pub const NONCE_LEN: usize = 8;
/// Where a DATA's tag sits: right after the header, at a fixed even offset.
pub const TAG: Range<usize> = 24..32;
pub const TAG_LEN: usize = 8;
/// The largest game payload of one DATA.
pub const MAX_DATA_PAYLOAD: usize = MAX_DATAGRAM - HEADER_LEN - TAG_LEN;

/// Field offsets of the header.
pub mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const KIND: usize = 3;
    pub const GROUP: Range<usize> = 4..6;
    pub const LENGTH: Range<usize> = 6..8;
    pub const PLAYER: Range<usize> = 8..12;
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
    pub const PROBE: usize = 40;
}

/// JOIN_ACK flag: DATA tags are on in this group.
pub const FLAG_TAGS: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Join = 1,
    JoinChallenge = 2,
    JoinAck = 3,
    Leave = 4,
    Keepalive = 5,
    Data = 6,
    Error = 7,
    Probe = 8,
    ProbeReply = 9,
    CheckpointRequest = 10,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
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
    ];

    pub fn from_u8(v: u8) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| *k as u8 == v)
    }

    /// How the rest of a datagram of this type is authenticated.
    pub fn auth(self) -> Auth {
        match self {
            Kind::Join | Kind::JoinChallenge | Kind::JoinAck | Kind::Leave | Kind::Keepalive => Auth::Mac,
            Kind::Probe | Kind::ProbeReply | Kind::CheckpointRequest => Auth::ShortMac,
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
        }
    }
}

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

/// Why bytes are not a version-2 datagram. Small and never allocating: the
/// hot path counts these per reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("shorter than the 24-byte header")]
    Short,
    #[error("bad magic")]
    Magic,
    #[error("version {0}, not 2")]
    Version(u8),
    #[error("unknown type {0}")]
    Kind(u8),
    #[error("length field does not match the datagram")]
    Length,
    #[error("wrong size for its type")]
    Size,
}

/// The header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub group: u16,
    pub player: u32,
    pub membership: u32,
    pub seq: u64,
}

fn be16(b: &[u8], r: Range<usize>) -> u16 {
    u16::from_be_bytes([b[r.start], b[r.start + 1]])
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

/// A checked version-2 datagram: once `parse` succeeds, no accessor panics.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buf: T,
    header: Header,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub fn parse(buf: T) -> Result<Packet<T>, ParseError> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(ParseError::Short);
        }
        if be16(b, field::MAGIC) != MAGIC {
            return Err(ParseError::Magic);
        }
        if b[field::VERSION] != VERSION {
            return Err(ParseError::Version(b[field::VERSION]));
        }
        let kind = Kind::from_u8(b[field::KIND]).ok_or(ParseError::Kind(b[field::KIND]))?;
        if usize::from(be16(b, field::LENGTH)) != b.len() - HEADER_LEN {
            return Err(ParseError::Length);
        }
        if !kind.size_ok(b.len()) {
            return Err(ParseError::Size);
        }
        let header = Header {
            kind,
            group: be16(b, field::GROUP),
            player: be32(b, field::PLAYER),
            membership: be32(b, field::MEMBERSHIP),
            seq: be64(b, field::SEQ),
        };
        Ok(Packet { buf, header })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    fn body(&self) -> &[u8] {
        &self.buf.as_ref()[HEADER_LEN..]
    }

    /// The bytes a MAC covers and the MAC, for MAC'd types.
    pub fn signed(&self) -> Option<(&[u8], &[u8])> {
        let b = self.buf.as_ref();
        let n = match self.header.kind.auth() {
            Auth::Mac => MAC_LEN,
            Auth::ShortMac => SHORT_MAC_LEN,
            _ => return None,
        };
        Some(b.split_at(b.len() - n))
    }

    /// JOIN: the token.
    pub fn token(&self) -> Option<&[u8; TOKEN_LEN]> {
        (self.header.kind == Kind::Join).then(|| self.body()[..TOKEN_LEN].try_into().ok())?
    }

    /// JOIN with cookie, or JOIN_CHALLENGE: the cookie.
    pub fn cookie(&self) -> Option<&[u8; COOKIE_LEN]> {
        let b = self.body();
        match self.header.kind {
            Kind::Join if self.buf.as_ref().len() == size::JOIN_WITH_COOKIE => {
                b[TOKEN_LEN..TOKEN_LEN + COOKIE_LEN].try_into().ok()
            }
            Kind::JoinChallenge => b[..COOKIE_LEN].try_into().ok(),
            _ => None,
        }
    }

    /// PROBE, PROBE_REPLY, CHECKPOINT_REQUEST: the nonce.
    pub fn nonce(&self) -> Option<u64> {
        (self.header.kind.auth() == Auth::ShortMac).then(|| be64(self.body(), 0..NONCE_LEN))
    }

    pub fn join_ack(&self) -> Option<JoinAck> {
        (self.header.kind == Kind::JoinAck).then(|| {
            let b = self.body();
            JoinAck {
                members: be16(b, 0..2),
                keepalive_ms: be16(b, 2..4),
                flags: b[4],
                checkpoint_port: be16(b, 6..8),
            }
        })
    }

    pub fn error_code(&self) -> Option<u16> {
        (self.header.kind == Kind::Error).then(|| be16(self.body(), 0..2))
    }

    /// DATA: the tag field and the game payload.
    pub fn data(&self) -> Option<(u64, &[u8])> {
        (self.header.kind == Kind::Data).then(|| {
            let b = self.buf.as_ref();
            (be64(b, TAG), &b[TAG.end..])
        })
    }
}

/// What JOIN_ACK tells a new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinAck {
    pub members: u16,
    pub keepalive_ms: u16,
    pub flags: u8,
    pub checkpoint_port: u16,
}

/// The keys of one token's session (see the document's table).
#[derive(Clone)]
pub struct SessionKeys {
    /// What the player gets from the control server.
    pub session: [u8; 32],
    mac: [u8; 32],
    tag: [u8; 16],
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes keys of any length.
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

impl SessionKeys {
    /// The control server's and the reflector's side: the session key of a
    /// token, under the shared secret that signed it.
    pub fn derive(secret: &Secret, token: &[u8; TOKEN_LEN]) -> SessionKeys {
        SessionKeys::from_session(hmac(secret.as_bytes(), &[b"reflector-session-v2", token]))
    }

    /// The player's side: the MAC and tag keys of the session key it got.
    pub fn from_session(session: [u8; 32]) -> SessionKeys {
        let mac = hmac(&session, &[b"reflector-mac-v2"]);
        let t = hmac(&session, &[b"reflector-tag-v2"]);
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&t[..16]);
        SessionKeys { session, mac, tag }
    }

    fn mac_of(&self, bytes: &[u8]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.mac).expect("HMAC accepts any key length");
        m.update(bytes);
        m
    }

    /// Checks the MAC of a MAC'd datagram (constant time); false for types
    /// that carry none.
    pub fn verify<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.signed() {
            Some((bytes, mac)) => self.mac_of(bytes).verify_truncated_left(mac).is_ok(),
            None => false,
        }
    }

    /// The DATA tag of `datagram` (the tag field itself read as zero).
    pub fn tag(&self, datagram: &[u8]) -> u64 {
        let mut h = siphasher::sip::SipHasher24::new_with_key(&self.tag);
        h.write(&datagram[..TAG.start]);
        h.write(&[0u8; TAG_LEN]);
        h.write(&datagram[TAG.end..]);
        h.finish()
    }

    /// Checks a DATA's tag (constant time).
    pub fn verify_tag<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.data() {
            Some((tag, _)) => {
                let want = self.tag(p.as_bytes()).to_be_bytes();
                let got = tag.to_be_bytes();
                // No early exit on the first differing byte.
                want.iter().zip(got).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
            }
            None => false,
        }
    }
}

/// Writes a datagram into `out`: header, `body`, then the MAC or the tag
/// its type needs (under `keys`; `None` for ERROR and for DATA with tags
/// off). Returns its length. `body` is what comes between the header and
/// the MAC (for DATA: the game payload, after the tag field).
pub fn emit(h: &Header, body: &[u8], keys: Option<&SessionKeys>, out: &mut [u8]) -> Result<usize, EmitError> {
    let auth = h.kind.auth();
    let extra = match auth {
        Auth::Mac => MAC_LEN,
        Auth::ShortMac => SHORT_MAC_LEN,
        Auth::Tag => TAG_LEN,
        Auth::None => 0,
    };
    let len = HEADER_LEN + extra + body.len();
    if !h.kind.size_ok(len) {
        return Err(EmitError::Size);
    }
    if out.len() < len {
        return Err(EmitError::Buffer);
    }
    out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
    out[field::VERSION] = VERSION;
    out[field::KIND] = h.kind as u8;
    out[field::GROUP].copy_from_slice(&h.group.to_be_bytes());
    out[field::LENGTH].copy_from_slice(&((len - HEADER_LEN) as u16).to_be_bytes());
    out[field::PLAYER].copy_from_slice(&h.player.to_be_bytes());
    out[field::MEMBERSHIP].copy_from_slice(&h.membership.to_be_bytes());
    out[field::SEQ].copy_from_slice(&h.seq.to_be_bytes());
    match auth {
        Auth::Tag => {
            out[TAG.end..len].copy_from_slice(body);
            out[TAG].fill(0);
            if let Some(k) = keys {
                let t = k.tag(&out[..len]);
                out[TAG].copy_from_slice(&t.to_be_bytes());
            }
        }
        Auth::Mac | Auth::ShortMac => {
            let k = keys.ok_or(EmitError::NoKey)?;
            out[HEADER_LEN..len - extra].copy_from_slice(body);
            let mac = k.mac_of(&out[..len - extra]).finalize().into_bytes();
            out[len - extra..len].copy_from_slice(&mac[..extra]);
        }
        Auth::None => out[HEADER_LEN..len].copy_from_slice(body),
    }
    Ok(len)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    #[error("the body has the wrong size for the type")]
    Size,
    #[error("the output buffer is too small")]
    Buffer,
    #[error("this type needs a MAC and no key was given")]
    NoKey,
}

/// Zeroes a DATA's tag field: what every member receives.
pub fn strip_tag(datagram: &mut [u8]) {
    if datagram.len() >= TAG.end {
        datagram[TAG].fill(0);
    }
}

/// The body of a JOIN_ACK (before its MAC).
pub fn join_ack_body(ack: &JoinAck) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0..2].copy_from_slice(&ack.members.to_be_bytes());
    b[2..4].copy_from_slice(&ack.keepalive_ms.to_be_bytes());
    b[4] = ack.flags;
    b[6..8].copy_from_slice(&ack.checkpoint_port.to_be_bytes());
    b
}

/// Sequence numbers seen in one direction of one membership: the highest
/// accepted and a bitmap of the 64 up to it (bit i: highest − i).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    pub highest: u64,
    pub bitmap: u64,
}

impl ReplayWindow {
    /// Whether `seq` would be accepted (new, or inside the window and not seen).
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn keys() -> SessionKeys {
        SessionKeys::derive(&Secret::new(&[7u8; 32]).unwrap(), &[9u8; TOKEN_LEN])
    }

    fn hdr(kind: Kind) -> Header {
        Header {
            kind,
            group: 4000,
            player: 77,
            membership: 0xdead_beef,
            seq: 5,
        }
    }

    #[test]
    fn siphash_is_the_reference_siphash_2_4() {
        // The paper's test vector (Aumasson & Bernstein, appendix A): key
        // 00..0f, message 00..0e. A BPF program computing standard SipHash
        // must agree with this crate's tags.
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
        let cases: Vec<(Kind, Vec<u8>, usize)> = vec![
            (Kind::Join, vec![1; 32], size::JOIN),
            (Kind::Join, vec![1; 48], size::JOIN_WITH_COOKIE),
            (Kind::JoinChallenge, vec![2; 16], size::JOIN_CHALLENGE),
            (
                Kind::JoinAck,
                join_ack_body(&JoinAck {
                    members: 3,
                    keepalive_ms: 2500,
                    flags: FLAG_TAGS,
                    checkpoint_port: 4100,
                })
                .to_vec(),
                size::JOIN_ACK,
            ),
            (Kind::Leave, vec![], size::LEAVE),
            (Kind::Keepalive, vec![], size::KEEPALIVE),
            (Kind::Data, b"hello".to_vec(), size::DATA_MIN + 5),
            (Kind::Error, vec![0, 4, 0, 0], size::ERROR),
            (Kind::Probe, 42u64.to_be_bytes().to_vec(), size::PROBE),
            (Kind::ProbeReply, 42u64.to_be_bytes().to_vec(), size::PROBE),
            (Kind::CheckpointRequest, 42u64.to_be_bytes().to_vec(), size::PROBE),
        ];
        for (kind, body, want) in cases {
            let n = emit(&hdr(kind), &body, Some(&k), &mut out).unwrap();
            assert_eq!(n, want, "{kind:?}");
            let p = Packet::parse(&out[..n]).unwrap();
            assert_eq!(*p.header(), hdr(kind));
            match kind.auth() {
                Auth::Mac | Auth::ShortMac => assert!(k.verify(&p), "{kind:?}"),
                Auth::Tag => assert!(k.verify_tag(&p)),
                Auth::None => {}
            }
        }
        let n = emit(
            &hdr(Kind::JoinAck),
            &join_ack_body(&JoinAck {
                members: 3,
                keepalive_ms: 2500,
                flags: 1,
                checkpoint_port: 4100,
            }),
            Some(&k),
            &mut out,
        )
        .unwrap();
        assert_eq!(
            Packet::parse(&out[..n]).unwrap().join_ack(),
            Some(JoinAck {
                members: 3,
                keepalive_ms: 2500,
                flags: 1,
                checkpoint_port: 4100
            })
        );
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
            for i in (0..n).filter(|i| {
                !(field::LENGTH.contains(i) || *i == field::KIND || *i == field::VERSION || field::MAGIC.contains(i))
            }) {
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
        // The tag was computed over the zeroed field, so a receiver holding
        // the sender's key could still check it after restoring it.
        let mut restored = out[..n].to_vec();
        restored[TAG].copy_from_slice(&before[TAG]);
        assert!(k.verify_tag(&Packet::parse(&restored[..]).unwrap()));
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
        assert_eq!(bad(&|b| b.truncate(10)), Err(ParseError::Short));
        assert_eq!(bad(&|b| b[0] = 0), Err(ParseError::Magic));
        assert_eq!(bad(&|b| b[2] = 1), Err(ParseError::Version(1)));
        assert_eq!(bad(&|b| b[3] = 99), Err(ParseError::Kind(99)));
        assert_eq!(bad(&|b| b.push(0)), Err(ParseError::Length));
        assert_eq!(
            bad(&|b| {
                b.push(0);
                b[6..8].copy_from_slice(&17u16.to_be_bytes());
            }),
            Err(ParseError::Size)
        );
        assert_eq!(emit(&hdr(Kind::Keepalive), &[], None, &mut out), Err(EmitError::NoKey));
        assert_eq!(
            emit(&hdr(Kind::Keepalive), &[1], Some(&k), &mut out),
            Err(EmitError::Size)
        );
    }

    #[test]
    fn both_sides_derive_the_same_keys() {
        let secret = Secret::new(&[3u8; 32]).unwrap();
        let server = SessionKeys::derive(&secret, &[5u8; TOKEN_LEN]);
        let player = SessionKeys::from_session(server.session);
        let mut out = [0u8; 64];
        let n = emit(&hdr(Kind::Leave), &[], Some(&player), &mut out).unwrap();
        assert!(server.verify(&Packet::parse(&out[..n]).unwrap()));
        let other_token = SessionKeys::derive(&secret, &[6u8; TOKEN_LEN]);
        assert!(!other_token.verify(&Packet::parse(&out[..n]).unwrap()));
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

    proptest! {
        #[test]
        fn random_bytes_never_panic_the_parser(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = Packet::parse(&b[..]) {
                let k = keys();
                let _ = (p.token(), p.cookie(), p.nonce(), p.join_ack(), p.error_code(), p.data(), p.signed());
                let _ = (k.verify(&p), k.verify_tag(&p));
            }
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
