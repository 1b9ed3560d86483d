//! The member's side of the channel over a blocking socket: connect,
//! upload and fetch, each within one deadline (the reflector's bots and
//! tests; the game client runs the same messages non-blocking).

use super::*;

/// A checkpoint as fetched; its state's SHA-256 was checked against the
/// REPLY's digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The checkpoint's number in its group.
    pub seq: u64,
    /// The game tick its uploader gave.
    pub tick: u64,
    pub age_ms: u64,
    pub from_player: u32,
    /// The state's SHA-256 (checked).
    pub digest: [u8; DIGEST_LEN],
    pub state: Bytes,
}

/// Which way a checkpoint went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointOp {
    /// The game's state, sent to the reflector when it asked.
    Upload,
    /// The group's latest checkpoint, fetched from the reflector.
    Fetch,
    /// The other checkpoint of the two the reflector keeps per group
    /// (FETCH_OTHER): the one before the latest, from another member
    /// when it has one.
    FetchOther,
}

/// Why a client exchange failed or could not start: for the blocking
/// exchanges here and for the non-blocking client's (which reports it as
/// `CheckpointError`). A socket error is kept as text, so the error can be
/// cloned and compared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// Not a member of a group (yet, or any more).
    #[error("not a member of a group")]
    NotMember,
    /// The group's JOIN_ACK announced no checkpoint channel.
    #[error("the group announced no checkpoint channel (port 0 in JOIN_ACK)")]
    NoChannel,
    /// An upload with no CHECKPOINT_REQUEST pending (none came, or its
    /// nonce was used).
    #[error("the reflector has not asked for a checkpoint")]
    NotRequested,
    /// One exchange of this kind is already under way.
    #[error("a checkpoint {0:?} is already under way")]
    InFlight(CheckpointOp),
    /// A socket call failed (connect refused, reset, ...).
    #[error("checkpoint channel {addr}: {call} failed: {message}")]
    Io {
        addr: SocketAddr,
        call: &'static str,
        message: String,
    },
    /// The reflector closed the connection before the exchange ended.
    #[error("checkpoint channel {addr}: closed by the reflector mid-exchange")]
    Closed { addr: SocketAddr },
    /// The exchange did not end within its deadline.
    #[error("checkpoint channel {addr}: no answer within the deadline")]
    TimedOut { addr: SocketAddr },
    #[error("checkpoint channel {addr}: version {version} is not spoken here (this client speaks {VERSION})")]
    Version { addr: SocketAddr, version: u8 },
    /// A HELLO or REPLY that does not decode.
    #[error("checkpoint channel {addr}: malformed message: {what}")]
    Malformed { addr: SocketAddr, what: DecodeError },
    /// The reflector refused, and its REPLY's MAC verified under our key.
    #[error("checkpoint channel {addr}: refused: {code}")]
    Refused { addr: SocketAddr, code: Refusal },
    /// A reply with an all-zero MAC (the reflector could not or did not
    /// authenticate the request): the exchange failed, nothing more is known.
    #[error("checkpoint channel {addr}: the exchange failed (unauthenticated refusal{})", match .refusal { Some(c) => format!(": {c}"), None => String::new() })]
    Unauthenticated { addr: SocketAddr, refusal: Option<Refusal> },
    /// A REPLY whose MAC does not verify under our key: nothing in it is used.
    #[error("checkpoint channel {addr}: the reply's MAC does not verify under our key")]
    BadMac { addr: SocketAddr },
    /// A state larger than the bound (the reflector's for an upload, the
    /// client's for a fetch).
    #[error("checkpoint channel {addr}: a state of {len} bytes is larger than the bound of {max}")]
    TooLarge { addr: SocketAddr, len: u64, max: u64 },
    /// An authenticated answer that does not fit the request.
    #[error("checkpoint channel {addr}: {what}")]
    Mismatch { addr: SocketAddr, what: &'static str },
    /// An authenticated answer this step does not expect.
    #[error("checkpoint channel {addr}: unexpected reply {status:?}")]
    Unexpected { addr: SocketAddr, status: Status },
    /// A fetched checkpoint of a sealed group that came intact from the
    /// reflector (its REPLY's MAC and SHA-256 verified) but failed one of
    /// the joiner's own checks (docs/protocol.md, "Sealed checkpoints"):
    /// `refusal` names the first that failed, as its counter is named.
    /// Nothing of the state reaches the game.
    #[error("checkpoint channel {addr}: the fetched checkpoint was refused by the joiner's checks ({}): {refusal}", .refusal.counter())]
    JoinerRefused {
        addr: SocketAddr,
        refusal: crate::sealed::checkpoint::CheckpointRefusal,
    },
}

impl ChannelError {
    /// A failed socket `call` on the channel at `addr`.
    pub fn io(addr: SocketAddr, call: &'static str, e: &io::Error) -> ChannelError {
        ChannelError::Io {
            addr,
            call,
            message: e.to_string(),
        }
    }

    /// The joiner's check that refused a fetched sealed checkpoint
    /// ([`ChannelError::JoinerRefused`]; `None` for every other failure).
    pub fn joiner_refusal(&self) -> Option<crate::sealed::checkpoint::CheckpointRefusal> {
        match self {
            ChannelError::JoinerRefused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }

    /// The reflector's refusal code, whether or not the refusal could be
    /// authenticated (`None` for every other failure).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            ChannelError::Refused { code, .. } => Some(*code),
            ChannelError::Unauthenticated { refusal, .. } => *refusal,
            _ => None,
        }
    }
}

/// Who is asking: a member's identity and keys.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub group: u16,
    pub player: u32,
    pub membership: u32,
    pub keys: &'a SessionKeys,
}

/// Connects to the channel (`addr`: the reflector's address with the
/// checkpoint port from JOIN_ACK). A caller that must connect from another
/// network namespace connects itself and uses the `_on` functions.
pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ChannelError> {
    if addr.port() == 0 {
        return Err(ChannelError::NoChannel);
    }
    TcpStream::connect_timeout(&addr, timeout).map_err(|e| ChannelError::io(addr, "connect", &e))
}

/// One blocking exchange on a connected stream.
struct Exchange<'s> {
    s: &'s TcpStream,
    addr: SocketAddr,
}

impl Exchange<'_> {
    fn io(&self, call: &'static str, e: io::Error) -> ChannelError {
        ChannelError::io(self.addr, call, &e)
    }

    fn malformed(&self, what: DecodeError) -> ChannelError {
        match what {
            DecodeError::BadVersion(version) => ChannelError::Version {
                addr: self.addr,
                version,
            },
            what => ChannelError::Malformed { addr: self.addr, what },
        }
    }

    fn read<const N: usize>(&self) -> Result<[u8; N], ChannelError> {
        let mut b = [0u8; N];
        let mut s = self.s;
        s.read_exact(&mut b).map_err(|e| self.io("read", e))?;
        Ok(b)
    }

    fn write(&self, parts: &[&[u8]]) -> Result<(), ChannelError> {
        let mut s = self.s;
        for p in parts {
            s.write_all(p).map_err(|e| self.io("write", e))?;
        }
        s.flush().map_err(|e| self.io("flush", e))
    }

    /// Sets the deadlines and reads the HELLO.
    fn hello(&self, timeout: Duration) -> Result<Hello, ChannelError> {
        self.s.set_nodelay(true).map_err(|e| self.io("setsockopt", e))?;
        self.s
            .set_read_timeout(Some(timeout))
            .map_err(|e| self.io("setsockopt", e))?;
        self.s
            .set_write_timeout(Some(timeout))
            .map_err(|e| self.io("setsockopt", e))?;
        Hello::decode(&self.read()?).map_err(|e| self.malformed(e))
    }

    /// Reads a REPLY and returns its answer only if its MAC verifies under
    /// our key; a REFUSED becomes [`ChannelError::Refused`], an all-zero MAC
    /// [`ChannelError::Unauthenticated`].
    fn reply(&self, keys: &SessionKeys, challenge: u64, request_mac: &[u8; MAC_LEN]) -> Result<Answer, ChannelError> {
        let reply = Reply::decode(&self.read()?).map_err(|e| self.malformed(e))?;
        let addr = self.addr;
        if reply.is_unauthenticated() {
            let refusal = match reply.answer {
                Answer::Refused(code) => Some(code),
                _ => None,
            };
            return Err(ChannelError::Unauthenticated { addr, refusal });
        }
        if !reply.verify(keys, challenge, request_mac) {
            return Err(ChannelError::BadMac { addr });
        }
        match reply.answer {
            Answer::Refused(code) => Err(ChannelError::Refused { addr, code }),
            a => Ok(a),
        }
    }

    fn unexpected(&self, a: Answer) -> ChannelError {
        ChannelError::Unexpected {
            addr: self.addr,
            status: a.status(),
        }
    }
}

/// Uploads `state` (the game's snapshot at `tick`) answering
/// CHECKPOINT_REQUEST(`nonce`); returns the checkpoint's number once the
/// reflector's authenticated STORED names our state's digest and tick. The
/// digest is computed before connecting, so a large state does not eat into
/// the reflector's deadline for the exchange.
pub fn upload(
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    tick: u64,
    state: Bytes,
    timeout: Duration,
) -> Result<u64, ChannelError> {
    let d = digest(&state);
    send_upload(&connect(addr, timeout)?, addr, who, nonce, tick, &state, d, timeout)
}

/// [`upload`] on a stream the caller connected to `addr` (the reflector's
/// deadline runs from the connection: connect after preparing the state).
pub fn upload_on(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    tick: u64,
    state: Bytes,
    timeout: Duration,
) -> Result<u64, ChannelError> {
    let d = digest(&state);
    send_upload(s, addr, who, nonce, tick, &state, d, timeout)
}

#[allow(clippy::too_many_arguments)]
fn send_upload(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    tick: u64,
    state: &[u8],
    state_digest: [u8; DIGEST_LEN],
    timeout: Duration,
) -> Result<u64, ChannelError> {
    let x = Exchange { s, addr };
    let hello = x.hello(timeout)?;
    let len = state.len() as u64;
    if len > hello.max_state {
        return Err(ChannelError::TooLarge {
            addr,
            len,
            max: hello.max_state,
        });
    }
    let req = Request::upload(&who, hello.challenge, nonce, len, tick);
    x.write(&[&req.encode()])?;
    match x.reply(who.keys, hello.challenge, &req.mac)? {
        Answer::Continue => {}
        other => return Err(x.unexpected(other)),
    }
    let mac = body_mac(who.keys, hello.challenge, &req.mac, state);
    x.write(&[state, &mac])?;
    match x.reply(who.keys, hello.challenge, &req.mac)? {
        Answer::Stored(st) => {
            if st.digest != state_digest {
                return Err(ChannelError::Mismatch {
                    addr,
                    what: "STORED names another state's digest",
                });
            }
            if st.tick != tick || st.from_player != who.player {
                return Err(ChannelError::Mismatch {
                    addr,
                    what: "STORED names another tick or player",
                });
            }
            Ok(st.number)
        }
        other => Err(x.unexpected(other)),
    }
}

/// Fetches the group's latest checkpoint (`None`: it has none yet).
/// `max_state` bounds what this client accepts.
pub fn fetch(
    addr: SocketAddr,
    who: Member<'_>,
    max_state: u64,
    timeout: Duration,
) -> Result<Option<Fetched>, ChannelError> {
    fetch_op_on(&connect(addr, timeout)?, addr, who, Op::Fetch, max_state, timeout)
}

/// [`fetch`] on a stream the caller connected to `addr`.
pub fn fetch_on(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    max_state: u64,
    timeout: Duration,
) -> Result<Option<Fetched>, ChannelError> {
    fetch_op_on(s, addr, who, Op::Fetch, max_state, timeout)
}

/// Fetches the checkpoint before the latest (FETCH_OTHER), from another
/// member than the latest when the reflector has one.
pub fn fetch_other(
    addr: SocketAddr,
    who: Member<'_>,
    max_state: u64,
    timeout: Duration,
) -> Result<Option<Fetched>, ChannelError> {
    fetch_op_on(&connect(addr, timeout)?, addr, who, Op::FetchOther, max_state, timeout)
}

fn fetch_op_on(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    op: Op,
    max_state: u64,
    timeout: Duration,
) -> Result<Option<Fetched>, ChannelError> {
    let x = Exchange { s, addr };
    let hello = x.hello(timeout)?;
    let req = Request::fetch(&who, hello.challenge, op);
    x.write(&[&req.encode()])?;
    match x.reply(who.keys, hello.challenge, &req.mac)? {
        Answer::Empty => Ok(None),
        Answer::Checkpoint {
            stored,
            body_len,
            age_ms,
        } => {
            if body_len > max_state {
                return Err(ChannelError::TooLarge {
                    addr,
                    len: body_len,
                    max: max_state,
                });
            }
            // body_len <= max_state, which the caller chose to hold in memory.
            let mut state = vec![0u8; body_len as usize];
            let mut r = s;
            r.read_exact(&mut state).map_err(|e| x.io("read", e))?;
            if digest(&state) != stored.digest {
                return Err(ChannelError::Mismatch {
                    addr,
                    what: "the state's SHA-256 is not the REPLY's digest",
                });
            }
            Ok(Some(Fetched {
                seq: stored.number,
                tick: stored.tick,
                age_ms: u64::from(age_ms),
                from_player: stored.from_player,
                digest: stored.digest,
                state: Bytes::from(state),
            }))
        }
        other => Err(x.unexpected(other)),
    }
}
