//! The checkpoint channel, version 1 (`wire` archives), kept only until the
//! reflector's server and the bots are ported to [version 2](super): the
//! document no longer describes it and a version-2 client does not speak it.
//!
//! One exchange per connection, every message a `wire` archive: the
//! reflector opens with a [`Hello`] (a fresh challenge and the size bound),
//! the client sends one [`Request`], the reflector answers one [`Reply`] and
//! closes. The state travels as a [`wire::Buffer`].
//!
//! Authentication, under the member's session key: an upload carries
//! `HMAC(Km, "reflector-checkpoint-v2" ‖ nonce ‖ group ‖ state)` with the
//! nonce of a CHECKPOINT_REQUEST the reflector sent to that member (single
//! use); a fetch carries
//! `HMAC(Km, "reflector-checkpoint-fetch-v2" ‖ challenge ‖ group ‖ player ‖ membership)`
//! with the challenge of this connection's Hello.

use crate::protocol::{SessionKeys, MAC_LEN};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Version of the channel's messages, in [`Hello`].
pub const VERSION: u8 = 1;
/// Largest Hello, Request header or Reply header (everything but the state).
pub const MAX_SMALL: u64 = 4096;

/// The reflector's first message on every connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u8,
    /// Fresh per connection: a fetch's MAC covers it.
    pub challenge: u64,
    /// Largest state the reflector stores, bytes.
    pub max_state: u64,
}

/// What a member asks for, as whom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The group (its port).
    pub group: u16,
    /// The player id and membership id, as in the member's datagrams.
    pub player: u32,
    pub membership: u32,
    pub op: Op,
    /// The upload's or the fetch's MAC (see the module documentation).
    pub mac: [u8; MAC_LEN],
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    /// The group's game state, answering CHECKPOINT_REQUEST(`nonce`).
    Upload { nonce: u64, state: wire::Buffer },
    /// The group's latest checkpoint.
    Fetch,
}

/// The reflector's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    /// The upload is now the group's checkpoint number `seq`.
    Stored {
        seq: u64,
    },
    /// The group's latest checkpoint: its number, how old it is, who sent it.
    Checkpoint {
        seq: u64,
        age_ms: u64,
        from_player: u32,
        state: wire::Buffer,
    },
    /// The group has no checkpoint yet.
    Empty,
    Refused {
        code: Refusal,
        message: String,
    },
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    #[error("not a member of that group (unknown player or membership)")]
    NotMember,
    #[error("the MAC does not verify under the member's key")]
    BadMac,
    #[error("no checkpoint request with that nonce is pending for this member")]
    NotRequested,
    #[error("the state is larger than the reflector's bound")]
    TooLarge,
    #[error("the request could not be decoded")]
    Malformed,
    #[error("too many requests: try again later")]
    Busy,
    #[error("no such group here")]
    NoGroup,
}

/// A checkpoint as fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub seq: u64,
    pub age_ms: u64,
    pub from_player: u32,
    /// A slice of the received message (no copy).
    pub state: Bytes,
}

/// Why a client exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("checkpoint channel {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("checkpoint channel {addr}: {source}")]
    Wire {
        addr: SocketAddr,
        #[source]
        source: wire::Error,
    },
    #[error("checkpoint channel {addr}: version {version} is not spoken here (this client speaks {VERSION})")]
    Version { addr: SocketAddr, version: u8 },
    #[error("checkpoint channel {addr}: refused: {code} ({message})")]
    Refused {
        addr: SocketAddr,
        code: Refusal,
        message: String,
    },
    #[error("checkpoint channel {addr}: unexpected reply")]
    Unexpected { addr: SocketAddr },
    #[error("the group announced no checkpoint channel (port 0 in JOIN_ACK)")]
    NoChannel,
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
    TcpStream::connect_timeout(&addr, timeout).map_err(|source| ChannelError::Io { addr, source })
}

/// Reads the Hello on a connected stream; every read and write of the
/// exchange then waits at most `timeout`.
fn hello(s: &TcpStream, addr: SocketAddr, timeout: Duration) -> Result<Hello, ChannelError> {
    let io = |source| ChannelError::Io { addr, source };
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    let msg = read(s, addr, MAX_SMALL)?;
    let hello: Hello = wire::from_bytes(&msg).map_err(|source| ChannelError::Wire { addr, source })?;
    if hello.version != VERSION {
        return Err(ChannelError::Version {
            addr,
            version: hello.version,
        });
    }
    Ok(hello)
}

fn read(mut s: &TcpStream, addr: SocketAddr, max: u64) -> Result<Bytes, ChannelError> {
    let limits = wire::Limits {
        max_len: max,
        ..wire::Limits::default()
    };
    wire::read_message(&mut s, limits).map_err(|source| ChannelError::Wire { addr, source })
}

fn send_request(mut s: &TcpStream, addr: SocketAddr, req: &Request) -> Result<(), ChannelError> {
    let wire_err = |source| ChannelError::Wire { addr, source };
    let archive = wire::to_archive(req).map_err(wire_err)?;
    archive.write_to(&mut s).map_err(wire_err)?;
    s.flush().map_err(|source| ChannelError::Io { addr, source })
}

fn refused(addr: SocketAddr, reply: Reply) -> ChannelError {
    match reply {
        Reply::Refused { code, message } => ChannelError::Refused { addr, code, message },
        _ => ChannelError::Unexpected { addr },
    }
}

/// Uploads `state` answering CHECKPOINT_REQUEST(`nonce`); returns the
/// checkpoint's number. The state goes out as a pointer chunk: not copied
/// into the message. Its MAC is computed before connecting, so a large
/// state does not eat into the reflector's deadline for the exchange.
pub fn upload(
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    state: Bytes,
    timeout: Duration,
) -> Result<u64, ChannelError> {
    let mac = who.keys.checkpoint_mac(nonce, who.group, &state);
    send_upload(&connect(addr, timeout)?, addr, who, nonce, state, mac, timeout)
}

/// [`upload`] on a stream the caller connected to `addr` (the reflector's
/// deadline runs from the connection: connect after preparing the state).
pub fn upload_on(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    state: Bytes,
    timeout: Duration,
) -> Result<u64, ChannelError> {
    let mac = who.keys.checkpoint_mac(nonce, who.group, &state);
    send_upload(s, addr, who, nonce, state, mac, timeout)
}

fn send_upload(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    nonce: u64,
    state: Bytes,
    mac: [u8; MAC_LEN],
    timeout: Duration,
) -> Result<u64, ChannelError> {
    hello(s, addr, timeout)?;
    let req = Request {
        group: who.group,
        player: who.player,
        membership: who.membership,
        op: Op::Upload {
            nonce,
            state: wire::Buffer(state),
        },
        mac,
    };
    send_request(s, addr, &req)?;
    let msg = read(s, addr, MAX_SMALL)?;
    match wire::from_bytes::<Reply>(&msg).map_err(|source| ChannelError::Wire { addr, source })? {
        Reply::Stored { seq } => Ok(seq),
        other => Err(refused(addr, other)),
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
    fetch_on(&connect(addr, timeout)?, addr, who, max_state, timeout)
}

/// [`fetch`] on a stream the caller connected to `addr`.
pub fn fetch_on(
    s: &TcpStream,
    addr: SocketAddr,
    who: Member<'_>,
    max_state: u64,
    timeout: Duration,
) -> Result<Option<Fetched>, ChannelError> {
    let hello = hello(s, addr, timeout)?;
    let req = Request {
        group: who.group,
        player: who.player,
        membership: who.membership,
        op: Op::Fetch,
        mac: who
            .keys
            .fetch_mac(hello.challenge, who.group, who.player, who.membership),
    };
    send_request(s, addr, &req)?;
    let msg = read(s, addr, max_state.saturating_add(MAX_SMALL))?;
    match wire::from_bytes::<Reply>(&msg).map_err(|source| ChannelError::Wire { addr, source })? {
        Reply::Checkpoint {
            seq,
            age_ms,
            from_player,
            state,
        } => Ok(Some(Fetched {
            seq,
            age_ms,
            from_player,
            state: state.0,
        })),
        Reply::Empty => Ok(None),
        other => Err(refused(addr, other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_the_state_is_a_slice_of_the_message() {
        let state = Bytes::from(vec![7u8; 10_000]);
        let req = Request {
            group: 4000,
            player: 9,
            membership: 77,
            op: Op::Upload {
                nonce: 5,
                state: wire::Buffer(state.clone()),
            },
            mac: [3; MAC_LEN],
        };
        let msg = Bytes::from(wire::to_archive(&req).unwrap().to_vec());
        let back: Request = wire::from_bytes(&msg).unwrap();
        assert_eq!(back, req);
        let Op::Upload { state: got, .. } = back.op else {
            panic!("not an upload")
        };
        let start = got.0.as_ptr() as usize - msg.as_ptr() as usize;
        assert!(
            start + got.0.len() <= msg.len(),
            "decoded state is not inside the message"
        );
        for r in [
            Reply::Stored { seq: 3 },
            Reply::Empty,
            Reply::Refused {
                code: Refusal::BadMac,
                message: "x".into(),
            },
        ] {
            let m = Bytes::from(wire::to_archive(&r).unwrap().to_vec());
            assert_eq!(wire::from_bytes::<Reply>(&m).unwrap(), r);
        }
    }

    #[test]
    fn macs_bind_nonce_group_content_and_challenge() {
        let k = SessionKeys::from_session([1; 32]);
        let other = SessionKeys::from_session([2; 32]);
        let mac = k.checkpoint_mac(5, 4000, b"state");
        assert!(k.verify_checkpoint(5, 4000, b"state", &mac));
        assert!(!k.verify_checkpoint(6, 4000, b"state", &mac));
        assert!(!k.verify_checkpoint(5, 4001, b"state", &mac));
        assert!(!k.verify_checkpoint(5, 4000, b"statf", &mac));
        assert!(!other.verify_checkpoint(5, 4000, b"state", &mac));
        let f = k.fetch_mac(11, 4000, 9, 77);
        assert!(k.verify_fetch(11, 4000, 9, 77, &f));
        assert!(!k.verify_fetch(12, 4000, 9, 77, &f));
        assert!(!k.verify_fetch(11, 4000, 8, 77, &f));
        assert!(!k.verify_fetch(11, 4000, 9, 78, &f));
    }
}
