//! The reflector's data plane (Bauer & Rooney, "The Performance of Software
//! Multicast-Reflector Implementations for Multi-Player Online Games"),
//! `reflector serve`.
//!
//! Clients send unicast UDP to a group's port; the reflector forwards each
//! datagram to every other member of that group. The datagram format, join
//! tokens and cookies and the client side of the JOIN handshake are in the
//! `reflector-proto` crate, shared with every client; this crate holds:
//! - [`membership`]: groups and members, a pure state machine with an injected clock;
//! - [`backend`]: fan-out backends (`sendto` loop, `sendmmsg`) behind one trait;
//! - [`kfanout`]: the in-kernel fan-out (`--backend ebpf`);
//! - [`receive`]: receive backends (`recvmmsg`, io_uring multishot) behind one trait, each
//!   datagram an owned buffer of a receive pool;
//! - [`server`]: starting and stopping the server, its event loops (sockets, membership and
//!   backends together), `reflector serve`'s command line and the metrics listener;
//! - [`checkpoint`]: game-state checkpoints and their TCP channel;
//! - [`metrics`]: counters, Prometheus exposition and the final summary;
//! - `testing` (feature): the backend test matrix for integration tests.
//!
//! It serves `/metrics` through `reflector-http` and knows nothing of the
//! control server or the bots.
#![deny(unsafe_code)]

pub mod backend;
pub mod checkpoint;
pub mod kfanout;
pub mod liveness;
pub mod membership;
pub mod metrics;
pub mod receive;
pub mod server;
#[cfg(feature = "testing")]
pub mod testing;

/// Both clocks, read once per batch of datagrams: the system clock (token
/// expiry is wall-clock time shared between hosts) and the process's
/// monotonic one (liveness, intervals); the pure core below takes them as
/// arguments.
pub fn now() -> membership::Now {
    let mono_ns = oskit::clock::mono_now_ns();
    membership::Now {
        unix_ms: reflector_proto::unix_now_ms(),
        mono_ms: mono_ns / 1_000_000,
        mono_us: mono_ns / 1_000,
    }
}

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
