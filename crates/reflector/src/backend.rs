//! Fan-out backends: how one datagram reaches every other member.
//!
//! One contract, several backends chosen at run time (`--backend`):
//! - `sendto`: the paper's user-space loop, one `sendto` per member (§4.1);
//! - `sendmmsg`: the same copies, one syscall per batch of members.
//!
//! Contract: [`Fanout::send_all`] returns only when every destination has
//! the datagram, or has been given up for a reason that is counted
//! (`send_errors`: unroutable, or shutdown while the queue stayed full). A
//! full device queue is never a reason to drop: with `IP_RECVERR` the
//! kernel reports it as ENOBUFS, and we wait and resend (paper §4.1).

use crate::metrics::GroupCounters;
use crate::sys;
pub use crate::sys::Dest;
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// The fan-out backends, best first.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// One `sendmmsg` per batch of members.
    Sendmmsg,
    /// One `sendto` per member (the paper's user-space loop).
    Sendto,
}

/// Whether a backend can run here, and if not why.
pub use oskit::Support;

impl BackendKind {
    pub const ALL: [BackendKind; 2] = [BackendKind::Sendmmsg, BackendKind::Sendto];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sendmmsg => "sendmmsg",
            BackendKind::Sendto => "sendto",
        }
    }

    /// Asks the kernel, without sending anything.
    pub fn probe(self) -> Support {
        match self {
            BackendKind::Sendto => Support::Supported,
            BackendKind::Sendmmsg => match sys::probe_sendmmsg() {
                Ok(()) => Support::Supported,
                Err(e) => Support::Unsupported(format!("sendmmsg is not available: {e}")),
            },
        }
    }

    /// The best backend the probe allows.
    pub fn best() -> BackendKind {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.probe() == Support::Supported)
            .unwrap_or(BackendKind::Sendto)
    }

    pub fn build(self) -> Box<dyn Fanout> {
        match self {
            BackendKind::Sendto => Box::new(SendtoLoop),
            BackendKind::Sendmmsg => Box::new(Sendmmsg::new(256)),
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<BackendKind, String> {
        BackendKind::ALL.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<&str> = BackendKind::ALL.iter().map(|b| b.name()).collect();
            format!("unknown backend '{s}'; choose one of: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Shortest and longest pause after ENOBUFS. The socket usually stays
/// writable when the *device* queue overflows, so POLLOUT alone would return
/// at once and we would spin; a short timer sleep (hrtimers make 20 µs
/// real, unlike the 10 ms ticks the paper had) lets the queue drain.
const BACKOFF_MIN_US: u64 = 20;
const BACKOFF_MAX_US: u64 = 2_000;
/// A destination that fails this many times in a row with a non-queue error
/// is skipped (counted in `send_errors`); pending ICMP errors fail a send
/// once, so a real destination succeeds on the next try.
const MAX_HARD_FAILURES: u32 = 4;

/// Outcome of one fan-out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FanoutResult {
    pub sent: u64,
    pub skipped: u64,
}

pub trait Fanout {
    fn name(&self) -> &'static str;

    /// Sends `datagram` to every entry of `dests` except index `skip` (the
    /// sender). Counts waits and errors in `counters`.
    fn send_all(
        &mut self,
        fd: BorrowedFd<'_>,
        datagram: &[u8],
        dests: &[Dest],
        skip: Option<usize>,
        counters: &GroupCounters,
        stop: &AtomicBool,
    ) -> FanoutResult;
}

/// What to do after a failed send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Retry,
    Skip,
    GiveUp,
}

/// Shared no-loss policy: waits as the error requires and says whether to
/// resend. `hard_failures` counts consecutive non-queue errors for the
/// current destination; `backoff_us` is the current ENOBUFS pause.
struct Waiter {
    hard_failures: u32,
    backoff_us: u64,
}

impl Waiter {
    fn new() -> Waiter {
        Waiter {
            hard_failures: 0,
            backoff_us: BACKOFF_MIN_US,
        }
    }

    fn success(&mut self) {
        self.hard_failures = 0;
        self.backoff_us = BACKOFF_MIN_US;
    }

    fn after_error(&mut self, fd: BorrowedFd<'_>, e: &io::Error, c: &GroupCounters, stop: &AtomicBool) -> Next {
        match e.raw_os_error() {
            Some(libc::EAGAIN) => {
                c.eagain_waits.fetch_add(1, Relaxed);
                // Socket buffer full: POLLOUT is exactly the right wake-up.
                // Bounded waits so a stop request is seen.
                while !stop.load(Relaxed) {
                    match sys::wait_writable(fd, 100) {
                        Ok(true) => return Next::Retry,
                        Ok(false) => continue,
                        Err(_) => return Next::Skip,
                    }
                }
                Next::GiveUp
            }
            Some(libc::ENOBUFS) => {
                c.enobufs_waits.fetch_add(1, Relaxed);
                if stop.load(Relaxed) && self.backoff_us >= BACKOFF_MAX_US {
                    return Next::GiveUp;
                }
                let _ = sys::wait_writable(fd, 100);
                sys::sleep_micros(self.backoff_us);
                self.backoff_us = (self.backoff_us * 2).min(BACKOFF_MAX_US);
                Next::Retry
            }
            Some(libc::EINTR) => Next::Retry,
            _ => {
                // ECONNREFUSED & co. are usually a queued ICMP error from an
                // earlier datagram, surfacing on this send (which it failed):
                // that error, and any others queued, are counted and drained,
                // then the send is retried.
                let queued = sys::drain_error_queue(fd);
                c.icmp_errors.fetch_add(queued.max(1) as u64, Relaxed);
                self.hard_failures += 1;
                if self.hard_failures >= MAX_HARD_FAILURES {
                    self.hard_failures = 0;
                    Next::Skip
                } else {
                    Next::Retry
                }
            }
        }
    }
}

/// Maps position `i` among "all destinations but `skip`" to an index.
fn nth_except(i: usize, skip: Option<usize>) -> usize {
    match skip {
        Some(s) if i >= s => i + 1,
        _ => i,
    }
}

/// The paper's user-space implementation: one `sendto` per member.
#[derive(Default)]
pub struct SendtoLoop;

impl Fanout for SendtoLoop {
    fn name(&self) -> &'static str {
        "sendto"
    }

    fn send_all(
        &mut self,
        fd: BorrowedFd<'_>,
        datagram: &[u8],
        dests: &[Dest],
        skip: Option<usize>,
        c: &GroupCounters,
        stop: &AtomicBool,
    ) -> FanoutResult {
        let mut r = FanoutResult::default();
        let mut w = Waiter::new();
        for (i, d) in dests.iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            loop {
                match sys::send_to(fd, datagram, d) {
                    Ok(_) => {
                        w.success();
                        r.sent += 1;
                        break;
                    }
                    Err(e) => match w.after_error(fd, &e, c, stop) {
                        Next::Retry => continue,
                        Next::Skip | Next::GiveUp => {
                            r.skipped += 1;
                            break;
                        }
                    },
                }
            }
        }
        r
    }
}

/// One `sendmmsg` per batch of members; the payload is referenced by every
/// header, never copied in user space.
pub struct Sendmmsg {
    batch: sys::MmsgBatch,
    scratch: Vec<usize>,
}

impl Sendmmsg {
    pub fn new(batch: usize) -> Sendmmsg {
        Sendmmsg {
            batch: sys::MmsgBatch::new(batch),
            scratch: Vec::with_capacity(batch),
        }
    }
}

impl Fanout for Sendmmsg {
    fn name(&self) -> &'static str {
        "sendmmsg"
    }

    fn send_all(
        &mut self,
        fd: BorrowedFd<'_>,
        datagram: &[u8],
        dests: &[Dest],
        skip: Option<usize>,
        c: &GroupCounters,
        stop: &AtomicBool,
    ) -> FanoutResult {
        let mut r = FanoutResult::default();
        let total = dests.len() - usize::from(skip.is_some_and(|s| s < dests.len()));
        let mut w = Waiter::new();
        let mut pos = 0;
        let cap = self.batch.capacity();
        // Reused across calls: holds at most `cap` indices, no allocation
        // after the first fan-out.
        let idx = &mut self.scratch;
        while pos < total {
            let n = (total - pos).min(cap);
            idx.clear();
            idx.extend((pos..pos + n).map(|i| nth_except(i, skip)));
            match self.batch.send(fd, datagram, dests, idx) {
                Ok(k) => {
                    w.success();
                    r.sent += k as u64;
                    pos += k;
                }
                Err(e) => match w.after_error(fd, &e, c, stop) {
                    Next::Retry => {}
                    Next::Skip => {
                        r.skipped += 1;
                        pos += 1;
                    }
                    Next::GiveUp => {
                        r.skipped += (total - pos) as u64;
                        break;
                    }
                },
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nth_except_skips_the_sender() {
        let v: Vec<usize> = (0..4).map(|i| nth_except(i, Some(2))).collect();
        assert_eq!(v, vec![0, 1, 3, 4]);
        let v: Vec<usize> = (0..3).map(|i| nth_except(i, None)).collect();
        assert_eq!(v, vec![0, 1, 2]);
    }

    #[test]
    fn backends_by_name_and_probe() {
        let e = "dpdk".parse::<BackendKind>().unwrap_err();
        assert!(e.contains("sendmmsg") && e.contains("sendto"), "{e}");
        for b in BackendKind::ALL {
            assert_eq!(b.name().parse::<BackendKind>(), Ok(b));
            assert_eq!(b.build().name(), b.name());
        }
        // Linux has had sendmmsg since 3.0.
        assert_eq!(BackendKind::Sendmmsg.probe(), Support::Supported);
        assert_eq!(BackendKind::best(), BackendKind::Sendmmsg);
    }
}
