//! Benchmarks that reproduce the papers' experiments, each beside an anchor
//! measured in the same run on the same machine.
//!
//! `reflector-bench` reproduces paper 000 §5: datagram size x receivers for
//! each fan-out backend of the reflector, against a minimal raw `sendto`
//! loop. The pure parts ([`grid`], [`report`]) are unit-tested; [`loadgen`] and [`rawloop`] do the I/O.
#![deny(unsafe_code)]

pub mod grid;
pub mod lab;
pub mod loadgen;
pub mod rawloop;
pub mod report;
pub mod sink;
pub mod sys;

use std::io;
use std::net::UdpSocket;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: io::Error },
    #[error("{call} failed: {source}")]
    Sys { call: &'static str, source: io::Error },
    #[error(transparent)]
    Os(#[from] oskit::SysError),
    #[error("cannot start {program}: {source} (build it first: `make bench` builds the release binaries, or pass --reflector PATH)")]
    Spawn { program: String, source: io::Error },
    #[error("{program} misbehaved: {detail}")]
    Child { program: String, detail: String },
    #[error("{0}")]
    Setup(String),
    #[error("interrupted")]
    Interrupted,
}

/// Sets both socket buffers to `bytes`, above `net.core.[rw]mem_max` when
/// we may (root), else as far as the limit allows. Every socket of the
/// benchmark, and the reflector's, get the same size, so no implementation
/// is favoured by its queues.
pub fn set_socket_buffers(sock: &UdpSocket, bytes: usize) -> Result<(), BenchError> {
    oskit::sockopt::set_buffers(sock, bytes, bytes)?;
    Ok(())
}

/// The calling thread's user + system CPU time (getrusage RUSAGE_THREAD);
/// zero if the call fails.
pub fn thread_cpu() -> std::time::Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_THREAD)
        .map(|u| {
            let t =
                |tv: nix::sys::time::TimeVal| std::time::Duration::new(tv.tv_sec() as u64, tv.tv_usec() as u32 * 1000);
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or_default()
}
