//! io_uring `SEND_ZC` from a pool of registered buffers (paper 004 §3.4's
//! registered-memory pool): the pool is pinned once, when it is registered,
//! instead of page by page on every send as MSG_ZEROCOPY does.
//!
//! Safety contract: the pool's buffers are boxed slices owned by the sender
//! and never resized or moved; they are registered with the ring, and the
//! ring (declared first, so dropped first) is closed before they are freed,
//! which ends the registration. A submission points into slot `i` only while
//! slot `i` is marked in flight; the slot becomes free again only when the
//! kernel has posted the send's completion without `IORING_CQE_F_MORE`, or its
//! notification (`IORING_CQE_F_NOTIF`): after that the kernel no longer reads
//! it. Nothing hands out a slot's bytes while it is in flight. Were the pool
//! freed with sends still in flight, the kernel would still be reading pages
//! it pinned at registration, never freed memory.
#![expect(
    unsafe_code,
    reason = "the fenced io_uring layer: registration and submission of borrowed buffers"
)]

use crate::zerocopy::ZcStats;
use io_uring::{cqueue, opcode, register, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the kernel
/// copied after all (`IORING_NOTIF_USAGE_ZC_COPIED` in its result).
const REPORT_USAGE: u16 = 8;
const USAGE_ZC_COPIED: u32 = 1 << 31;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    /// Submitted; waiting for the send's completion and, if the kernel said
    /// one follows, its notification.
    InFlight,
    /// The send completed; its notification has not come yet.
    AwaitingNotif,
}

/// Whether this kernel can do io_uring SEND_ZC (with registered buffers).
pub fn probe_send_zc() -> Result<(), String> {
    let ring = IoUring::new(8).map_err(|e| format!("io_uring_setup failed ({e})"))?;
    let mut p = register::Probe::new();
    ring.submitter()
        .register_probe(&mut p)
        .map_err(|e| format!("io_uring probe failed ({e})"))?;
    if p.is_supported(opcode::SendZc::CODE) {
        Ok(())
    } else {
        Err("this kernel's io_uring has no SEND_ZC (Linux 6.0+)".into())
    }
}

/// Sends datagrams on one (connected) socket from registered buffers with
/// io_uring SEND_ZC.
pub struct UringZcSender {
    // Dropped first: closing the ring ends the registration of `pool`.
    ring: IoUring,
    sock: OwnedFd,
    pool: Vec<Box<[u8]>>,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Sends that failed (the error of the first is kept for the caller).
    failed: Option<io::Error>,
    pub stats: ZcStats,
}

impl UringZcSender {
    /// Registers a pool of `count` buffers of `size` bytes for sends on
    /// `sock` (a connected UDP socket, or a TCP socket).
    pub fn new(sock: BorrowedFd<'_>, count: u16, size: usize) -> io::Result<UringZcSender> {
        probe_send_zc().map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e))?;
        let ring = IoUring::new(u32::from(count).next_power_of_two().max(8) * 2)?;
        let pool: Vec<Box<[u8]>> = (0..count).map(|_| vec![0u8; size].into_boxed_slice()).collect();
        let iovecs: Vec<libc::iovec> = pool
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: the iovecs describe `pool`'s boxes, which the sender owns
        // and keeps unmoved for the ring's whole life (see the contract).
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        Ok(UringZcSender {
            ring,
            sock: sock.try_clone_to_owned()?,
            pool,
            slots: vec![Slot::Free; count as usize],
            free: (0..count).rev().collect(),
            failed: None,
            stats: ZcStats::default(),
        })
    }

    /// A free buffer of the pool to fill, waiting for one if all are in
    /// flight; returns its index and its bytes.
    pub fn slot(&mut self) -> io::Result<(u16, &mut [u8])> {
        while self.free.is_empty() {
            self.ring.submit_and_wait(1)?;
            self.reap();
        }
        let i = self.free.pop().expect("checked non-empty above");
        Ok((i, &mut self.pool[i as usize]))
    }

    /// Sends the first `len` bytes of pool buffer `i` (from [`Self::slot`]).
    pub fn send(&mut self, i: u16, len: usize) -> io::Result<()> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let idx = i as usize;
        assert!(
            idx < self.slots.len() && self.slots[idx] == Slot::Free && len <= self.pool[idx].len(),
            "send of slot {i} ({len} bytes) that is not a free slot of the pool"
        );
        let buf = &self.pool[idx];
        let entry = opcode::SendZc::new(types::Fd(self.sock.as_raw_fd()), buf.as_ptr(), len as u32)
            .buf_index(Some(i))
            .zc_flags(REPORT_USAGE)
            .build()
            .user_data(u64::from(i));
        self.slots[idx] = Slot::InFlight;
        loop {
            // SAFETY: the entry points into slot i of the registered pool,
            // now in flight: nothing reuses it until its completions (see
            // the contract).
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_ok() {
                break;
            }
            // Submission queue full: hand it to the kernel and take results.
            self.ring.submit()?;
            self.reap();
        }
        self.ring.submit()?;
        self.stats.zerocopy_sends += 1;
        Ok(())
    }

    /// Takes posted completions, freeing slots; returns how many sends
    /// finished (their notification seen).
    pub fn reap(&mut self) -> usize {
        let mut done = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        for cqe in &mut cq {
            let i = cqe.user_data() as usize;
            let flags = cqe.flags();
            let Some(state) = self.slots.get_mut(i) else {
                continue;
            };
            if cqueue::notif(flags) {
                // The kernel is done with the pages.
                if cqe.result() as u32 & USAGE_ZC_COPIED != 0 {
                    self.stats.completed_copied += 1;
                }
                *state = Slot::Free;
                self.free.push(i as u16);
                self.stats.completed += 1;
                done += 1;
                continue;
            }
            if cqe.result() < 0 && self.failed.is_none() {
                self.failed = Some(io::Error::from_raw_os_error(-cqe.result()));
            }
            if cqueue::more(flags) {
                *state = Slot::AwaitingNotif;
            } else {
                // No notification follows (e.g. the send failed).
                *state = Slot::Free;
                self.free.push(i as u16);
            }
        }
        done
    }

    /// Sends not finished yet.
    pub fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| **s != Slot::Free).count()
    }

    /// Waits until every send has finished, at most `timeout`; true if
    /// none is left.
    pub fn drain(&mut self, timeout: std::time::Duration) -> io::Result<bool> {
        let until = std::time::Instant::now() + timeout;
        let step = types::Timespec::new().nsec(50_000_000);
        let args = types::SubmitArgs::new().timespec(&step);
        while self.outstanding() > 0 && std::time::Instant::now() < until {
            match self.ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                // ETIME: the step passed with nothing posted.
                Err(e) if e.raw_os_error() == Some(libc::ETIME) || e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            self.reap();
        }
        Ok(self.outstanding() == 0)
    }
}

impl Drop for UringZcSender {
    fn drop(&mut self) {
        // Let in-flight sends finish first (bounded). Even if some do not,
        // freeing the pool is safe: registration pinned its pages in the
        // kernel, which keeps them until the ring (closed first) lets go.
        let _ = self.drain(std::time::Duration::from_secs(1));
    }
}
