//! Building datagrams: headers, MACs and tags, small replies.

use super::*;
use hmac::Mac;

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

pub(super) fn put_header(h: &Header, len: usize, out: &mut [u8]) {
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
    emit_in_place(h, len, keys, out)
}

/// Writes the header and the MAC or tag of a datagram whose body the
/// caller already placed in `out` (a DATA's payload at [`DATA_PAYLOAD`]),
/// `len` bytes in all: lets a sender write its payload in place.
pub fn emit_in_place(h: &Header, len: usize, keys: Option<&SessionKeys>, out: &mut [u8]) -> Result<usize, EmitError> {
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
