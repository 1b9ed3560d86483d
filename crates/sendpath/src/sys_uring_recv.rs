//! io_uring multishot `RECVMSG` into a provided-buffer ring: one ring, one
//! buffer ring, one multishot receive per socket; each datagram comes back
//! as the buffer the kernel filled, owned by the caller until it gives it
//! back ([`UringRecv::provide`]).
//!
//! Safety contract: the buffer ring's entries live in an anonymous mapping
//! owned by [`UringRecv`], registered with the ring and unmapped only after
//! the ring is closed (the field order drops the ring first). A buffer is
//! published to the kernel (written into the buffer ring, the tail moved)
//! only while `UringRecv` holds it in `lent[bid]`; nothing reads or hands
//! out a lent buffer until the kernel names its id in a completion, after
//! which the kernel no longer writes it. Buffers still lent when the
//! receiver is dropped are freed after the ring is closed, which ends the
//! kernel's use of them. The `msghdr` every multishot receive was prepared
//! from is boxed and lives as long as the ring.
#![expect(
    unsafe_code,
    reason = "the fenced io_uring layer: a provided-buffer ring and multishot receives into it"
)]

use crate::errqueue::decode_sockaddr;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicU16, Ordering};

/// The buffer group of the receiver's buffer ring.
const BGID: u16 = 0;
/// `user_data` of cancellations (their completions are not reported).
const CANCEL_KEY: u64 = u64::MAX;
/// Room for the source address ahead of the payload (IPv4 or IPv6).
const NAME_LEN: usize = size_of::<libc::sockaddr_in6>();
/// `struct io_uring_recvmsg_out`, ahead of the name in every buffer.
const OUT_LEN: usize = 16;

/// What one completion of a multishot receive says.
pub enum RecvEvent {
    /// A datagram from the socket armed under `key`, in buffer `bid`, which
    /// the caller now owns and gives back with [`UringRecv::provide`].
    Datagram {
        key: u64,
        bid: u16,
        buf: Box<[u8]>,
        /// Where the payload is in `buf` (truncated to the room there).
        payload: Range<usize>,
        src: Option<SocketAddr>,
        truncated: bool,
        /// The kernel saw more datagrams queued on the socket.
        more_queued: bool,
    },
    /// The multishot receive under `key` has ended (`error`: why, e.g.
    /// ENOBUFS when the buffer ring ran dry, ECANCELED after
    /// [`UringRecv::cancel`]); arm it again to go on.
    Ended { key: u64, error: Option<io::Error> },
}

/// The buffer ring's entries: a page-aligned anonymous mapping.
struct BufRingMem {
    base: *mut types::BufRingEntry,
    bytes: usize,
}

impl Drop for BufRingMem {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `bytes` made in `UringRecv::new`;
        // the ring that used it is closed by now (field order).
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}

/// Multishot receives on any number of sockets into one buffer ring.
pub struct UringRecv {
    // Dropped first: closing the ring ends every receive and the
    // registration of `bufring`.
    ring: IoUring,
    bufring: BufRingMem,
    msghdr: Box<libc::msghdr>,
    /// Buffers lent to the kernel, by id.
    lent: Vec<Option<Box<[u8]>>>,
    in_ring: usize,
    tail: u16,
    buf_size: usize,
    /// Submissions pushed and not yet handed to the kernel.
    unsubmitted: bool,
}

// SAFETY: the raw pointers (the buffer ring's mapping, the boxed msghdr)
// point into memory this struct owns and moves with it.
unsafe impl Send for UringRecv {}

impl UringRecv {
    /// A ring with `count` receive buffers (a power of two, at most 32768),
    /// each with room for a `payload`-byte datagram.
    pub fn new(count: u16, payload: usize) -> io::Result<UringRecv> {
        if !count.is_power_of_two() || count > 32768 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "buffer count must be a power of two up to 32768",
            ));
        }
        let ring = IoUring::builder()
            .setup_cqsize(u32::from(count).max(64) * 4)
            .build(64)?;
        let bytes = (usize::from(count) * size_of::<types::BufRingEntry>()).next_multiple_of(4096);
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let bufring = BufRingMem {
            base: base.cast(),
            bytes,
        };
        // SAFETY: page-aligned zeroed memory of `count` entries, owned by
        // the receiver and unmapped only after the ring is closed.
        unsafe {
            ring.submitter()
                .register_buf_ring_with_flags(base as u64, count, BGID, 0)?
        };
        // SAFETY: plain data; zero is valid.
        let mut msghdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        msghdr.msg_namelen = NAME_LEN as libc::socklen_t;
        let buf_size = OUT_LEN + NAME_LEN + payload;
        let mut r = UringRecv {
            ring,
            bufring,
            msghdr,
            lent: (0..count).map(|_| None).collect(),
            in_ring: 0,
            tail: 0,
            buf_size,
            unsubmitted: false,
        };
        for bid in 0..count {
            r.provide(bid, vec![0u8; buf_size].into_boxed_slice());
        }
        Ok(r)
    }

    /// The ring's fd: readable while completions wait (for an epoll).
    pub fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the ring's fd, open as long as `self`.
        unsafe { BorrowedFd::borrow_raw(self.ring.as_raw_fd()) }
    }

    /// Buffers the kernel may fill now.
    pub fn available(&self) -> usize {
        self.in_ring
    }

    /// Gives buffer `bid` (from a [`RecvEvent::Datagram`]) back to the
    /// kernel. A buffer of another size or an id already lent is dropped.
    pub fn provide(&mut self, bid: u16, mut buf: Box<[u8]>) {
        let i = usize::from(bid);
        if buf.len() != self.buf_size || i >= self.lent.len() || self.lent[i].is_some() {
            return;
        }
        let mask = self.lent.len() - 1;
        // SAFETY: the entry at the tail is one the kernel has consumed (at
        // most `count` are published at once: one per lent buffer); the
        // buffer is kept in `lent` until the kernel names it (see the
        // contract).
        unsafe {
            let e = &mut *self.bufring.base.add(usize::from(self.tail) & mask);
            e.set_addr(buf.as_mut_ptr() as u64);
            e.set_len(buf.len() as u32);
            e.set_bid(bid);
        }
        self.lent[i] = Some(buf);
        self.in_ring += 1;
        self.tail = self.tail.wrapping_add(1);
        // SAFETY: the tail field of the ring's first entry, in our mapping;
        // the kernel reads it concurrently, hence the atomic release store
        // (after the entry is written).
        unsafe {
            let tail = types::BufRingEntry::tail(self.bufring.base).cast_mut();
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }

    fn push(&mut self, e: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: the entry points at nothing but `msghdr` (alive as
            // long as the ring) and the socket, which the kernel holds a
            // reference to while the receive runs.
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                self.unsubmitted = true;
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Starts a multishot receive on `sock`, reported under `key` (not
    /// `u64::MAX`); submitted by the next [`UringRecv::submit`].
    pub fn arm(&mut self, key: u64, sock: BorrowedFd<'_>) -> io::Result<()> {
        let e = opcode::RecvMsgMulti::new(types::Fd(sock.as_fd().as_raw_fd()), &*self.msghdr, BGID)
            .build()
            .user_data(key);
        self.push(&e)
    }

    /// Asks the kernel to end the multishot receive under `key`; its
    /// [`RecvEvent::Ended`] follows.
    pub fn cancel(&mut self, key: u64) -> io::Result<()> {
        let e = opcode::AsyncCancel::new(key).build().user_data(CANCEL_KEY);
        self.push(&e)
    }

    /// Hands what was armed or cancelled to the kernel.
    pub fn submit(&mut self) -> io::Result<()> {
        if self.unsubmitted {
            self.ring.submit()?;
            self.unsubmitted = false;
        }
        Ok(())
    }

    /// Takes up to `max` completions; returns how many were taken.
    pub fn reap(&mut self, max: usize, mut f: impl FnMut(RecvEvent)) -> usize {
        let mut taken = 0;
        let mut cq = self.ring.completion();
        cq.sync();
        while taken < max {
            let Some(cqe) = cq.next() else {
                break;
            };
            taken += 1;
            let key = cqe.user_data();
            if key == CANCEL_KEY {
                continue;
            }
            let (res, flags) = (cqe.result(), cqe.flags());
            if res >= 0 {
                if let Some(bid) = cqueue::buffer_select(flags) {
                    if let Some(buf) = self.lent.get_mut(usize::from(bid)).and_then(Option::take) {
                        self.in_ring -= 1;
                        f(datagram(key, bid, buf, &self.msghdr, res as usize, flags));
                    }
                }
            }
            if !cqueue::more(flags) {
                let error = (res < 0).then(|| io::Error::from_raw_os_error(-res));
                f(RecvEvent::Ended { key, error });
            }
        }
        taken
    }
}

fn datagram(key: u64, bid: u16, buf: Box<[u8]>, msghdr: &libc::msghdr, len: usize, flags: u32) -> RecvEvent {
    let more_queued = cqueue::sock_nonempty(flags);
    let (payload, src, truncated) = match types::RecvMsgOut::parse(&buf[..len.min(buf.len())], msghdr) {
        Ok(out) => {
            let start = out.payload_data().as_ptr() as usize - buf.as_ptr() as usize;
            let name = &out.name_data()[..(out.incoming_name_len() as usize).min(NAME_LEN)];
            (
                start..start + out.payload_data().len(),
                decode_sockaddr(name),
                out.is_payload_truncated(),
            )
        }
        Err(()) => (0..0, None, true),
    };
    RecvEvent::Datagram {
        key,
        bid,
        buf,
        payload,
        src,
        truncated,
        more_queued,
    }
}

/// Whether this kernel and its policy allow multishot receives into a
/// buffer ring: one receive armed on a loopback socket must deliver one
/// datagram. The error names the cause.
pub fn probe_recv_multishot() -> Result<(), String> {
    // On its own thread: the kernel's teardown of a ring signals every live
    // thread that submitted to it (task work), which interrupts whatever
    // that thread blocks in next with EINTR, some time after the ring is
    // gone. A thread that has exited is left alone.
    std::thread::Builder::new()
        .name("uring-probe".into())
        .spawn(probe_on_this_thread)
        .map_err(|e| format!("could not start the io_uring probe's thread ({e})"))?
        .join()
        .unwrap_or_else(|_| Err("the io_uring probe panicked".into()))
}

fn probe_on_this_thread() -> Result<(), String> {
    let mut r = UringRecv::new(2, 64).map_err(|e| setup_error(&e))?;
    let mut p = io_uring::register::Probe::new();
    r.ring
        .submitter()
        .register_probe(&mut p)
        .map_err(|e| format!("io_uring probe failed ({e})"))?;
    if !p.is_supported(opcode::RecvMsgMulti::CODE) {
        return Err("this kernel's io_uring has no RECVMSG".into());
    }
    // Without a loopback address (a namespace whose `lo` is down) the
    // rings and the opcode are all that can be checked.
    let Ok(sock) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return Ok(());
    };
    let to = sock.local_addr().map_err(|e| e.to_string())?;
    r.arm(1, sock.as_fd())
        .and_then(|()| r.submit())
        .map_err(|e| format!("io_uring submission failed ({e})"))?;
    sock.send_to(b"probe", to).map_err(|e| e.to_string())?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut got: Option<Result<(), String>> = None;
    while got.is_none() && std::time::Instant::now() < deadline {
        let _ = r.ring.submit_and_wait(1);
        r.reap(8, |ev| match ev {
            RecvEvent::Datagram { buf, payload, .. } => {
                got = Some(if &buf[payload] == b"probe" {
                    Ok(())
                } else {
                    Err("io_uring multishot RECVMSG returned other bytes than sent".into())
                });
            }
            RecvEvent::Ended { error, .. } => {
                got.get_or_insert(Err(format!(
                    "io_uring multishot RECVMSG ended at once ({}; Linux 6.0+ needed)",
                    error.map_or("no error".into(), |e| e.to_string())
                )));
            }
        });
    }
    got.unwrap_or_else(|| Err("io_uring multishot RECVMSG delivered nothing within 1 s".into()))
}

/// Why a ring could not be set up, with the usual causes named.
fn setup_error(e: &io::Error) -> String {
    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok());
    match (e.raw_os_error(), disabled) {
        (Some(libc::EPERM), Some(d)) if d > 0 => format!(
            "io_uring is disabled here (kernel.io_uring_disabled = {d}{}): {e}",
            if d == 1 { ", only for the io_uring_group" } else { "" }
        ),
        (Some(libc::EPERM), _) => {
            format!("io_uring is not permitted here (a container's seccomp profile blocks it?): {e}")
        }
        (Some(libc::ENOSYS), _) => format!("this kernel has no io_uring: {e}"),
        (Some(libc::EINVAL), _) => format!("this kernel has no provided-buffer rings (Linux 5.19+): {e}"),
        _ => format!("io_uring setup failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn datagrams_arrive_in_lent_buffers_and_buffers_go_back() {
        probe_recv_multishot().expect("io_uring multishot receive works here");
        let mut r = UringRecv::new(4, 100).unwrap();
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        r.arm(7, rx.as_fd()).unwrap();
        r.submit().unwrap();
        for i in 0..6u8 {
            tx.send_to(&[i; 10], rx.local_addr().unwrap()).unwrap();
        }
        // Four buffers: four datagrams, then the receive ends (ENOBUFS).
        let mut got = Vec::new();
        let mut ended = None;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while ended.is_none() && std::time::Instant::now() < deadline {
            let _ = r.ring.submit_and_wait(1);
            r.reap(16, |ev| match ev {
                RecvEvent::Datagram {
                    key,
                    bid,
                    buf,
                    payload,
                    src,
                    ..
                } => {
                    assert_eq!((key, src), (7, Some(tx.local_addr().unwrap())));
                    got.push((bid, buf[payload].to_vec(), buf));
                }
                RecvEvent::Ended { error, .. } => ended = Some(error.and_then(|e| e.raw_os_error())),
            });
        }
        assert_eq!(ended, Some(Some(libc::ENOBUFS)));
        assert_eq!(r.available(), 0);
        let bytes: Vec<Vec<u8>> = got.iter().map(|g| g.1.clone()).collect();
        assert_eq!(bytes, (0..4u8).map(|i| vec![i; 10]).collect::<Vec<_>>());
        for (bid, _, buf) in got {
            r.provide(bid, buf);
        }
        assert_eq!(r.available(), 4);
        // Armed again, the two left in the socket come.
        r.arm(7, rx.as_fd()).unwrap();
        r.submit().unwrap();
        let mut rest = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while rest.len() < 2 && std::time::Instant::now() < deadline {
            let _ = r.ring.submit_and_wait(1);
            r.reap(16, |ev| {
                if let RecvEvent::Datagram { buf, payload, .. } = ev {
                    rest.push(buf[payload].to_vec());
                }
            });
        }
        assert_eq!(rest, vec![vec![4u8; 10], vec![5u8; 10]]);
    }

    /// The probe leaves nothing behind on the caller's thread: a blocking
    /// receive right after it times out instead of failing with EINTR
    /// (what the kernel's teardown of a ring this thread had submitted to
    /// did, within milliseconds).
    #[test]
    fn the_probe_does_not_interrupt_the_callers_next_wait() {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
        let mut buf = [0u8; 16];
        for _ in 0..5 {
            probe_recv_multishot().expect("io_uring multishot receive works here");
            for _ in 0..4 {
                let e = sock.recv_from(&mut buf).expect_err("nothing was sent");
                assert!(
                    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
                    "the wait after the probe ended with {e}"
                );
            }
        }
    }
}
