//! The anchor: the smallest reflector there is. Receive a datagram, then
//! `sendto` it to each of a fixed list of addresses, in a blocking loop.
//! No protocol, no membership, no checks, no counters on the data path.
//! It is what the reflector's `sendto` backend costs without the reflector
//! around it, measured on the same machine in the same run.
//!
//! Run as a child process (`reflector-bench raw-loop`) so its CPU time is
//! its own. It prints its bound address on the first stdout line; a
//! zero-length datagram stops it, after which it prints one JSON line of
//! counters and exits.

use crate::{set_socket_buffers, BenchError};
use std::io::Write as _;
use std::net::{SocketAddr, UdpSocket};

/// Consecutive failures on one destination before it is given up for that
/// datagram (counted): loopback does not fail, so this only bounds a
/// misconfigured run instead of hanging it.
const MAX_TRIES: u32 = 1_000;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RawLoopStats {
    pub received: u64,
    pub sent: u64,
    /// Sends that failed and were retried.
    pub retries: u64,
    /// Copies given up after [`MAX_TRIES`] failures.
    pub send_errors: u64,
}

impl RawLoopStats {
    pub fn to_json(self) -> String {
        serde_json::json!({
            "received": self.received,
            "sent": self.sent,
            "retries": self.retries,
            "send_errors": self.send_errors,
        })
        .to_string()
    }

    pub fn from_json(line: &str) -> Option<RawLoopStats> {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        let g = |k: &str| v.get(k).and_then(serde_json::Value::as_u64);
        Some(RawLoopStats {
            received: g("received")?,
            sent: g("sent")?,
            retries: g("retries")?,
            send_errors: g("send_errors")?,
        })
    }
}

/// The loop's command line, the hidden subcommand by which each benchmark
/// starts it as a child process.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[arg(long)]
    pub bind: SocketAddr,
    /// Comma-separated destination addresses.
    #[arg(long, value_delimiter = ',', required = true)]
    pub to: Vec<SocketAddr>,
    #[arg(long, default_value_t = 4 << 20)]
    pub bufsize: usize,
}

/// Runs the loop until a zero-length datagram arrives.
pub fn run(bind: SocketAddr, dests: &[SocketAddr], bufsize: usize) -> Result<RawLoopStats, BenchError> {
    let sock = UdpSocket::bind(bind).map_err(|source| BenchError::Sys { call: "bind", source })?;
    set_socket_buffers(&sock, bufsize)?;
    let local = sock.local_addr().map_err(|source| BenchError::Sys {
        call: "getsockname",
        source,
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{local}")
        .and_then(|()| out.flush())
        .map_err(|source| BenchError::Sys {
            call: "write(stdout)",
            source,
        })?;
    let mut st = RawLoopStats::default();
    let mut buf = vec![0u8; 65_536];
    loop {
        let n = match sock.recv_from(&mut buf) {
            Ok((n, _)) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(BenchError::Sys {
                    call: "recvfrom",
                    source,
                })
            }
        };
        if n == 0 {
            break;
        }
        st.received += 1;
        for d in dests {
            let mut tries = 0;
            loop {
                match sock.send_to(&buf[..n], d) {
                    Ok(_) => {
                        st.sent += 1;
                        break;
                    }
                    Err(_) if tries < MAX_TRIES => {
                        tries += 1;
                        st.retries += 1;
                    }
                    Err(_) => {
                        st.send_errors += 1;
                        break;
                    }
                }
            }
        }
    }
    writeln!(out, "{}", st.to_json())
        .and_then(|()| out.flush())
        .map_err(|source| BenchError::Sys {
            call: "write(stdout)",
            source,
        })?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_round_trip() {
        let s = RawLoopStats {
            received: 1,
            sent: 2,
            retries: 3,
            send_errors: 4,
        };
        assert_eq!(RawLoopStats::from_json(&s.to_json()), Some(s));
        assert_eq!(RawLoopStats::from_json("{}"), None);
        assert_eq!(RawLoopStats::from_json("not json"), None);
    }
}
