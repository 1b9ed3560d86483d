//! The anchor: the smallest reflector there is. Receive a datagram, then
//! `sendto` it to each of a fixed list of addresses, in a blocking loop.
//! No protocol, no membership, no checks, no counters on the data path.
//! It is what the reflector's `sendto` backend costs without the reflector
//! around it, measured on the same machine in the same run.
//!
//! Two more floors, by `--send` (fanout-bench's `raw-mmsg` and
//! `raw-mmsg-batch`): receive a batch with `recvmmsg`, then send each
//! datagram to every address with one `sendmmsg` (`mmsg`: what the
//! reflector's `sendmmsg` backend does, without the reflector), or every
//! copy of the whole batch with as few `sendmmsg` as 1,024 messages per call
//! allow (`mmsg-batch`: the most a user-space sender can batch). They say how
//! much of the reflector's cost is its own work and how much is the kernel's
//! per-message send, which no user-space backend avoids.
//!
//! Run as a child process (`reflector-bench raw-loop`) so its CPU time is
//! its own. It prints its bound address on the first stdout line; a
//! zero-length datagram stops it, after which it prints one JSON line of
//! counters and exits.

use crate::{set_socket_buffers, BenchError};
use sendpath::{DestSet, MultiSend, RecvBatch};
use std::io::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd as _;

/// Datagrams per `recvmmsg` in the batched floors: the reflector's batch.
const RECV_BATCH: usize = 32;
/// Receive slot: the largest datagram the reflector forwards fits.
const SLOT: usize = 2_048;

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
    /// How copies are sent: `sendto` (one call per copy, the anchor),
    /// `mmsg` (one `sendmmsg` per datagram) or `mmsg-batch` (one `sendmmsg`
    /// per received batch).
    #[arg(long, value_enum, default_value_t = SendMode::Sendto)]
    pub send: SendMode,
}

/// The loop's way of sending, see the module's text.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendMode {
    #[default]
    Sendto,
    Mmsg,
    MmsgBatch,
}

impl SendMode {
    /// fanout-bench's implementation name for each mode.
    pub const NAMES: [(&'static str, SendMode); 3] = [
        ("raw-loop", SendMode::Sendto),
        ("raw-mmsg", SendMode::Mmsg),
        ("raw-mmsg-batch", SendMode::MmsgBatch),
    ];

    pub fn of_impl(name: &str) -> Option<SendMode> {
        SendMode::NAMES.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
    }

    /// The value of `--send` for this mode.
    pub fn arg(self) -> &'static str {
        match self {
            SendMode::Sendto => "sendto",
            SendMode::Mmsg => "mmsg",
            SendMode::MmsgBatch => "mmsg-batch",
        }
    }
}

/// Runs the loop until a zero-length datagram arrives.
pub fn run(a: &Args) -> Result<RawLoopStats, BenchError> {
    let (bind, dests, bufsize) = (a.bind, &a.to[..], a.bufsize);
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
    let st = serve(&sock, dests, a.send)?;
    writeln!(out, "{}", st.to_json())
        .and_then(|()| out.flush())
        .map_err(|source| BenchError::Sys {
            call: "write(stdout)",
            source,
        })?;
    Ok(st)
}

/// Forwards what `sock` receives to `dests` until a zero-length datagram.
pub fn serve(sock: &UdpSocket, dests: &[SocketAddr], mode: SendMode) -> Result<RawLoopStats, BenchError> {
    match mode {
        SendMode::Sendto => sendto_loop(sock, dests),
        SendMode::Mmsg => mmsg_loop(sock, dests, false),
        SendMode::MmsgBatch => mmsg_loop(sock, dests, true),
    }
}

fn sendto_loop(sock: &UdpSocket, dests: &[SocketAddr]) -> Result<RawLoopStats, BenchError> {
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
    Ok(st)
}

/// The batched floors. The receive is the reflector's (`recvmmsg`, waiting
/// in `poll` when the queue is empty); a full send buffer is waited out, as
/// the reflector does, and counted as a retry.
fn mmsg_loop(sock: &UdpSocket, dests: &[SocketAddr], whole_batch: bool) -> Result<RawLoopStats, BenchError> {
    let fd = sock.as_fd();
    let mut st = RawLoopStats::default();
    let mut set = DestSet::from_addrs(dests.iter().copied());
    let mut batch = RecvBatch::new(RECV_BATCH, SLOT);
    let mut multi = MultiSend::new();
    let sys = |call: &'static str| move |source| BenchError::Sys { call, source };
    loop {
        let n = match batch.recv(fd) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                wait_readable(sock).map_err(sys("poll"))?;
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(sys("recvmmsg")(e)),
        };
        let mut stop = false;
        // One small allocation per batch of up to 32 datagrams: next to
        // 32 x R kernel sends, nothing.
        let mut views: Vec<&[u8]> = Vec::with_capacity(n);
        for i in 0..n {
            let Some((bytes, _, _)) = batch.get(i) else { break };
            if bytes.is_empty() {
                stop = true;
                break;
            }
            views.push(bytes);
        }
        st.received += views.len() as u64;
        if whole_batch {
            let total = views.len() * set.len();
            let mut sent = 0;
            while sent < total {
                match multi.send(fd, &views, &set, sent) {
                    Ok(k) => sent += k,
                    Err(e) => give_way(sock, e, &mut st).map_err(sys("sendmmsg"))?,
                }
            }
            st.sent += total as u64;
        } else {
            for d in &views {
                let mut sent = 0;
                while sent < set.len() {
                    match set.send_mmsg(fd, d, sent..set.len()) {
                        Ok(k) => sent += k,
                        Err(e) => give_way(sock, e, &mut st).map_err(sys("sendmmsg"))?,
                    }
                }
                st.sent += sent as u64;
            }
        }
        if stop {
            return Ok(st);
        }
    }
}

/// A send that could not go: a full buffer is waited out (counted), any
/// other error ends the run.
fn give_way(sock: &UdpSocket, e: std::io::Error, st: &mut RawLoopStats) -> std::io::Result<()> {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => {
            st.retries += 1;
            sendpath::wait_writable(sock.as_fd(), 100).map(|_| ())
        }
        _ => Err(e),
    }
}

fn wait_readable(sock: &UdpSocket) -> std::io::Result<()> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
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

    #[test]
    fn every_mode_forwards_every_datagram_to_every_destination_then_stops() {
        for (name, mode) in SendMode::NAMES {
            let relay = UdpSocket::bind("127.0.0.1:0").unwrap();
            let rx: Vec<UdpSocket> = (0..3).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
            for r in &rx {
                r.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
            }
            let dests: Vec<SocketAddr> = rx.iter().map(|r| r.local_addr().unwrap()).collect();
            let to = relay.local_addr().unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            // Queued before the loop starts, so the batched modes see whole
            // batches and the stop datagram inside one.
            for i in 0..50u8 {
                tx.send_to(&[i; 20], to).unwrap();
            }
            tx.send_to(&[], to).unwrap();
            let st = serve(&relay, &dests, mode).unwrap();
            assert_eq!((st.received, st.sent, st.send_errors), (50, 150, 0), "{name}");
            for r in &rx {
                let mut b = [0u8; 64];
                for i in 0..50u8 {
                    let n = r.recv(&mut b).unwrap();
                    assert_eq!(&b[..n], &[i; 20], "{name}: datagram {i}, in order");
                }
            }
        }
    }
}
