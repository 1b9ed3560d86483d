//! MSG_ZEROCOPY sends (paper 001), used where they pay.
//!
//! A send at or over the threshold goes out with `MSG_ZEROCOPY`: the kernel
//! pins the buffer's pages instead of copying them and reports, on the
//! socket's error queue, when it no longer needs them; until then this keeps
//! a clone of the buffer's owner (`H`: `bytes::Bytes`, `Arc<[u8]>`, …), so the
//! memory cannot be freed or reused early. Smaller sends are copied: pinning
//! and the completion cost more than copying a few KiB (the threshold is
//! measured, see the crate's benchmark).
//!
//! UDP datagrams larger than the path MTU must be sent with `UDP_SEGMENT`
//! ([`crate::set_udp_segment`], segmented late, GSO) to be sent from the
//! pages: a datagram the IP layer fragments is copied (the kernel then
//! flags its completion COPIED). Datagrams that fit the MTU go out zero-copy
//! as they are.
//!
//! What the kernel may do instead, and what this does about it:
//! - Completions flagged COPIED: the kernel copied after all (every local
//!   peer, loopback and veth included, copies on delivery). Zero copy then
//!   only adds cost, so the socket switches to plain sends, once, and says so.
//! - ENOBUFS: the socket's option memory (`net.core.optmem_max`) or the
//!   locked-memory limit is used up by pinned sends. Completions free it, so
//!   the sender reads them and retries; it never drops the datagram, and it
//!   never waits only for writability (the socket stays writable: waiting for
//!   POLLOUT there is the deadlock of grpc/grpc#30320): it waits for the error
//!   queue, and if no completion comes within the stall limit it sends a copy.
//! - A bound on bytes pinned in flight: past it, a send first waits for
//!   completions the same way.

use crate::completions::Completions;
use crate::errqueue::{self, ErrEntry, ErrKind};
use crate::sys;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// Counters of one zero-copy sender.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcStats {
    /// Sends that went out with MSG_ZEROCOPY.
    pub zerocopy_sends: u64,
    /// Sends copied: under the threshold, after a fall-back, or stalled.
    pub copied_sends: u64,
    /// Zero-copy sends completed (their buffers released).
    pub completed: u64,
    /// Of those, how many the kernel reported it had copied after all.
    pub completed_copied: u64,
    /// Times a send waited for completions (ENOBUFS or the pinned bound).
    pub waits: u64,
    /// Sends copied because no completion came within the stall limit.
    pub stalled: u64,
    /// Most bytes pinned at once.
    pub peak_pinned: usize,
}

/// How a datagram left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// With MSG_ZEROCOPY: the buffer's owner is held until its completion.
    ZeroCopy,
    /// Copied into the kernel: the buffer is free at once.
    Copied,
}

/// Sends datagrams from one socket, zero-copy where it pays.
#[derive(Debug)]
pub struct ZeroCopySender<H> {
    threshold: usize,
    max_pinned: usize,
    stall: Duration,
    completions: Completions<H>,
    /// Why zero copy is off on this socket, if it is.
    off: Option<String>,
    /// Zero-copy sends since the error queue was last read.
    since_reap: u32,
    pub stats: ZcStats,
}

/// The error queue is read every this many zero-copy sends (the kernel
/// coalesces completions into ranges, so one read usually takes many), and
/// whenever a send would go over the pinned bound.
const REAP_EVERY: u32 = 16;

/// The default threshold: the smallest send size at which zero copy cost
/// less CPU per byte than copying in the benchmark on this machine (65,000
/// bytes; at 32 KiB it still cost 1.26x). Where pinning is cheaper relative
/// to copying (a NIC, a slower memory bus) measure and set it lower.
pub const DEFAULT_THRESHOLD: usize = 65_000;
/// The default bound on bytes pinned in flight per socket.
pub const DEFAULT_MAX_PINNED: usize = 8 << 20;
/// How long a send waits for completions before it sends a copy instead.
pub const DEFAULT_STALL: Duration = Duration::from_millis(200);

impl<H: AsRef<[u8]> + Clone> ZeroCopySender<H> {
    /// Enables SO_ZEROCOPY on `fd`; sends of `threshold` bytes or more will
    /// be zero-copy, with at most `max_pinned` bytes in flight. If the kernel
    /// refuses the option, every send is copied and [`Self::zero_copy_off`]
    /// says why.
    pub fn new(fd: BorrowedFd<'_>, threshold: usize, max_pinned: usize) -> ZeroCopySender<H> {
        let off = sys::set_zerocopy(fd)
            .err()
            .map(|e| format!("SO_ZEROCOPY refused ({e}): sends are copied"));
        if let Some(why) = &off {
            tracing::info!("{why}");
        }
        ZeroCopySender {
            threshold,
            max_pinned: max_pinned.max(1),
            stall: DEFAULT_STALL,
            completions: Completions::new(),
            off,
            since_reap: 0,
            stats: ZcStats::default(),
        }
    }

    /// How long a send waits for completions before sending a copy.
    pub fn with_stall(mut self, stall: Duration) -> Self {
        self.stall = stall;
        self
    }

    /// Why this socket sends copies only, if it does.
    pub fn zero_copy_off(&self) -> Option<&str> {
        self.off.as_deref()
    }

    /// Bytes the kernel still has pinned.
    pub fn pinned_bytes(&self) -> usize {
        self.completions.pinned_bytes()
    }

    /// Zero-copy sends not completed yet.
    pub fn outstanding(&self) -> usize {
        self.completions.outstanding()
    }

    /// Sends `buf` to `to`, zero-copy if it is large enough and zero copy is
    /// on; waits for completions when the pinned bound or the kernel's
    /// memory limits are reached (at most the stall limit, then copies).
    /// Entries of the error queue that are not completions (ICMP errors) go
    /// to `others`. Errors are the send's own (EAGAIN and ENOBUFS from a full
    /// device queue included: the caller's usual no-loss wait applies).
    pub fn send_to(
        &mut self,
        fd: BorrowedFd<'_>,
        buf: &H,
        to: SocketAddr,
        mut others: impl FnMut(ErrEntry),
    ) -> io::Result<Sent> {
        let bytes = buf.as_ref();
        if self.off.is_some() || bytes.len() < self.threshold {
            sys::send_flagged(fd, bytes, to, false)?;
            self.stats.copied_sends += 1;
            return Ok(Sent::Copied);
        }
        let started = Instant::now();
        loop {
            let over = self.pinned_bytes() + bytes.len() > self.max_pinned;
            if self.since_reap >= REAP_EVERY || (over && self.outstanding() > 0) {
                self.reap(fd, &mut others);
            }
            if self.off.is_some() {
                // A COPIED completion just switched the socket to copies.
                sys::send_flagged(fd, bytes, to, false)?;
                self.stats.copied_sends += 1;
                return Ok(Sent::Copied);
            }
            let room = self.pinned_bytes() == 0 || self.pinned_bytes() + bytes.len() <= self.max_pinned;
            if room {
                match sys::send_flagged(fd, bytes, to, true) {
                    Ok(_) => {
                        self.completions.sent(buf.clone(), bytes.len());
                        self.stats.zerocopy_sends += 1;
                        self.since_reap += 1;
                        self.stats.peak_pinned = self.stats.peak_pinned.max(self.pinned_bytes());
                        return Ok(Sent::ZeroCopy);
                    }
                    // Out of option memory or locked memory: completions free
                    // it. (A full device queue also says ENOBUFS; a completion
                    // wait covers that too, and the stall limit bounds it.)
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && self.outstanding() > 0 => {
                        self.since_reap = REAP_EVERY;
                    }
                    Err(e) => return Err(e),
                }
            }
            if started.elapsed() >= self.stall {
                // No completion in time (a peer or a qdisc holds the pages):
                // never drop, never wait forever: send a copy.
                sys::send_flagged(fd, bytes, to, false)?;
                self.stats.stalled += 1;
                self.stats.copied_sends += 1;
                return Ok(Sent::Copied);
            }
            self.stats.waits += 1;
            let left = self.stall.saturating_sub(started.elapsed());
            sys::wait_error_queue(fd, left.as_millis().clamp(1, i32::MAX as u128) as i32)?;
        }
    }

    /// Reads the error queue: completions release their buffers (and a
    /// COPIED one switches the socket to copies, said once); other entries go
    /// to `others`. Returns how many sends completed.
    pub fn reap(&mut self, fd: BorrowedFd<'_>, mut others: impl FnMut(ErrEntry)) -> usize {
        let mut done = 0;
        let mut copied = false;
        self.since_reap = 0;
        errqueue::read(fd, |e| match e.kind {
            ErrKind::Zerocopy { lo, hi, copied: c } => {
                let n = self.completions.complete(lo, hi, drop);
                done += n;
                self.stats.completed += n as u64;
                if c {
                    self.stats.completed_copied += n as u64;
                    copied = true;
                }
            }
            _ => others(e),
        });
        if copied && self.off.is_none() {
            let why = "the kernel copied zero-copy sends after all (a local peer, or a device without \
                       scatter-gather): this socket now sends copies, which cost less then"
                .to_string();
            tracing::info!("{why}");
            self.off = Some(why);
        }
        done
    }

    /// Waits until every zero-copy send has completed (before the buffers'
    /// owners may be dropped by the caller, e.g. at shutdown), at most
    /// `timeout`; true if none is left.
    pub fn drain(&mut self, fd: BorrowedFd<'_>, timeout: Duration, mut others: impl FnMut(ErrEntry)) -> bool {
        let until = Instant::now() + timeout;
        loop {
            self.reap(fd, &mut others);
            let left = until.saturating_duration_since(Instant::now());
            if self.outstanding() == 0 || left.is_zero() {
                return self.outstanding() == 0;
            }
            let _ = sys::wait_error_queue(fd, left.as_millis().clamp(1, i32::MAX as u128) as i32);
        }
    }
}

/// The zero-copy send paths, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZcBackend {
    /// io_uring SEND_ZC from a registered pool ([`crate::UringZcSender`]).
    Uring,
    /// MSG_ZEROCOPY ([`ZeroCopySender`]).
    MsgZerocopy,
    /// Plain copied sends.
    Copy,
}

impl ZcBackend {
    pub fn name(self) -> &'static str {
        match self {
            ZcBackend::Uring => "io_uring SEND_ZC",
            ZcBackend::MsgZerocopy => "MSG_ZEROCOPY",
            ZcBackend::Copy => "copies",
        }
    }

    /// The best path this kernel allows, probed at run time, and why each
    /// better one is not available.
    pub fn probe() -> (ZcBackend, Vec<String>) {
        let mut why_not = vec![];
        match crate::probe_send_zc() {
            Ok(()) => return (ZcBackend::Uring, why_not),
            Err(e) => why_not.push(format!("io_uring SEND_ZC: {e}")),
        }
        match std::net::UdpSocket::bind("127.0.0.1:0") {
            Ok(s) => match sys::set_zerocopy(std::os::fd::AsFd::as_fd(&s)) {
                Ok(()) => return (ZcBackend::MsgZerocopy, why_not),
                Err(e) => why_not.push(format!("MSG_ZEROCOPY: SO_ZEROCOPY refused ({e})")),
            },
            Err(e) => why_not.push(format!("MSG_ZEROCOPY: no socket to probe with ({e})")),
        }
        (ZcBackend::Copy, why_not)
    }
}
