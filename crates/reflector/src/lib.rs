//! A software multicast reflector for multiplayer games (Bauer & Rooney,
//! "The Performance of Software Multicast-Reflector Implementations for
//! Multi-Player Online Games").
//!
//! Clients send unicast UDP to a group's port; the reflector forwards each
//! datagram to every other member of that group. The datagram format, join
//! tokens and cookies and the client side of the JOIN handshake are in the
//! `reflector-proto` crate, shared with every client; this crate holds:
//! - [`membership`]: groups and members, a pure state machine with an injected clock;
//! - [`backend`]: fan-out backends (`sendto` loop, `sendmmsg`) behind one trait;
//! - [`server`]: the event loops that tie sockets, membership and backends together;
//! - [`metrics`]: counters, Prometheus exposition and the final summary;
//! - [`bots`]: simulated players that measure delivery, loss and latency.
#![deny(unsafe_code)]

pub mod backend;
pub mod bots;
pub mod checkpoint;
pub mod kfanout;
pub mod membership;
pub mod metrics;
pub mod privileges;
pub mod server;

/// Milliseconds since the Unix epoch from the system clock: the only place
/// the real clock is read; everything below takes `now_ms` as an argument.
pub fn unix_now_ms() -> u64 {
    reflector_proto::unix_now_ms()
}

/// Both clocks, read once per batch of datagrams.
pub fn now() -> membership::Now {
    membership::Now {
        unix_ms: unix_now_ms(),
        mono_ms: oskit::clock::mono_now_ms(),
    }
}

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
