//! What a reflector and its clients must agree on, and nothing else: the
//! datagram format, the join tokens and cookies, and the client side of the
//! JOIN handshake. The reflector server, its bots, the benchmarks and any
//! game client use this one crate, so the handshake is written once.
//!
//! - [`protocol`]: version 2 (`docs/protocol.md`): the 24-byte header, a
//!   checked borrowed parser that never panics, session keys derived from
//!   the token, control MACs, SipHash DATA tags, the replay window, builders
//!   for the small control datagrams;
//! - [`auth`]: join tokens (signed by the control server, checked by the
//!   reflector) and stateless join cookies (the reflector's address check);
//! - [`client`]: one player's membership of one group as a sans-I/O state
//!   machine (JOIN, JOIN_CHALLENGE, JOIN with cookie, JOIN_ACK, retries on an
//!   injected clock, refusals and `ERROR(NotMember)` as events, LEAVE);
//! - [`checkpoint`]: the checkpoint channel's messages, version 2 (over
//!   TCP, fixed binary, every message MAC'd), their MACs, and a blocking
//!   client for uploads and fetches;
//! - [`blocking`]: that state machine driven over a blocking
//!   [`std::net::UdpSocket`], for simple clients (tests, benchmarks);
//! - [`control`]: what the control server answers (the join grant, the
//!   world) as JSON types, and the group-port syntax it shares with the
//!   reflectors;
//! - [`sealed`]: sealed payloads (protocol revision 2.2): cell ids, epoch
//!   and sender keys (HKDF-SHA256), seal and open in place
//!   (AES-256-GCM), the receiving rules with their counters;
//! - `ticket` (feature `tickets`): the player ticket a game backend signs
//!   for the control server (claims, key file, minting).
//!
//! Everything but [`blocking`] and [`auth::Secret::random`] is pure: time
//! comes in as an argument, bytes go out as values.
#![deny(unsafe_code)]

pub mod auth;
pub mod blocking;
pub mod checkpoint;
pub mod client;
pub mod control;
pub mod protocol;
pub mod sealed;
#[cfg(feature = "tickets")]
pub mod ticket;

/// Milliseconds since the Unix epoch from the system clock. Token expiry is
/// wall-clock time shared between hosts; callers read it here once and pass
/// it down to the pure code.
pub fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
