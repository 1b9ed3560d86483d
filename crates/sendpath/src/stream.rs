//! MSG_ZEROCOPY on a stream socket, for messages made of pieces: a `wire`
//! archive's header and index chunks (small, copied) and its pointer chunks
//! (large shared buffers, sent from their own pages when they are at or over
//! the threshold and zero copy is on).
//!
//! TCP gives one completion number per successful `send` with MSG_ZEROCOPY,
//! a partial one included, so a large piece may take several numbers; each
//! holds a clone of the piece's owner until it completes. The socket is
//! blocking with a send timeout (SO_SNDTIMEO): a peer that stops reading
//! makes a send fail with EAGAIN/EWOULDBLOCK after the timeout, reported as
//! `TimedOut`, and the caller drops the connection; what is still pinned is
//! released when the completions arrive (at the latest when the socket is
//! closed and the kernel frees its queue). The same rules as
//! [`crate::zerocopy::ZeroCopySender`] apply: COPIED completions switch the
//! sender to copies (the caller may share that verdict across connections),
//! ENOBUFS and the pinned bound wait for completions, never loop on
//! writability.

use crate::completions::Completions;
use crate::errqueue::{self, ErrKind};
use crate::sys;
use crate::zerocopy::ZcStats;
use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

/// One piece of a message.
#[derive(Debug, Clone, Copy)]
pub enum Piece<'a, H> {
    /// Copied into the kernel.
    Copy(&'a [u8]),
    /// A shared buffer: sent from its pages if large enough, its owner held
    /// until then.
    Held(&'a H),
}

/// Sends messages on one connected stream socket.
#[derive(Debug)]
pub struct StreamSender<H> {
    threshold: usize,
    max_pinned: usize,
    completions: Completions<H>,
    zero_copy: bool,
    /// Completions came back COPIED on this socket.
    pub copied_seen: bool,
    pub stats: ZcStats,
}

impl<H: AsRef<[u8]> + Clone> StreamSender<H> {
    /// With `zero_copy`, enables SO_ZEROCOPY (if the kernel refuses, every
    /// piece is copied); pieces of `threshold` bytes or more then go out
    /// zero-copy, at most `max_pinned` bytes in flight.
    pub fn new(fd: BorrowedFd<'_>, zero_copy: bool, threshold: usize, max_pinned: usize) -> StreamSender<H> {
        let zero_copy = zero_copy && sys::set_zerocopy(fd).is_ok();
        StreamSender {
            threshold: threshold.max(1),
            max_pinned: max_pinned.max(1),
            completions: Completions::new(),
            zero_copy,
            copied_seen: false,
            stats: ZcStats::default(),
        }
    }

    /// Whether large pieces still go out zero-copy.
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// Bytes the kernel still has pinned.
    pub fn pinned_bytes(&self) -> usize {
        self.completions.pinned_bytes()
    }

    /// Sends every piece, in order, before `deadline`.
    pub fn send_all(&mut self, fd: BorrowedFd<'_>, pieces: &[Piece<'_, H>], deadline: Instant) -> io::Result<()> {
        for p in pieces {
            match p {
                Piece::Copy(b) => self.copy(fd, b, deadline)?,
                Piece::Held(h) => {
                    let b = h.as_ref();
                    if self.zero_copy && b.len() >= self.threshold {
                        self.send_held(fd, h, deadline)?;
                    } else {
                        self.copy(fd, b, deadline)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn copy(&mut self, fd: BorrowedFd<'_>, mut b: &[u8], deadline: Instant) -> io::Result<()> {
        while !b.is_empty() {
            past(deadline)?;
            match sys::send_stream(fd, b, false) {
                Ok(n) => b = &b[n..],
                Err(e) => retry_or_fail(e)?,
            }
        }
        self.stats.copied_sends += 1;
        Ok(())
    }

    fn send_held(&mut self, fd: BorrowedFd<'_>, h: &H, deadline: Instant) -> io::Result<()> {
        let all = h.as_ref();
        let mut off = 0;
        while off < all.len() {
            past(deadline)?;
            if !self.zero_copy {
                // A COPIED completion came in the middle: the rest is copied.
                return self.copy(fd, &all[off..], deadline);
            }
            let left = &all[off..];
            if self.pinned_bytes() > 0 && self.pinned_bytes() + left.len().min(self.max_pinned) > self.max_pinned {
                self.wait_completions(fd, deadline)?;
                continue;
            }
            match sys::send_stream(fd, left, true) {
                Ok(n) => {
                    self.completions.sent(h.clone(), n);
                    self.stats.zerocopy_sends += 1;
                    self.stats.peak_pinned = self.stats.peak_pinned.max(self.pinned_bytes());
                    off += n;
                    self.reap(fd);
                }
                // Option memory or locked memory used up by pinned pages:
                // completions free it.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) && self.completions.outstanding() > 0 => {
                    self.wait_completions(fd, deadline)?;
                }
                Err(e) => retry_or_fail(e)?,
            }
        }
        Ok(())
    }

    fn wait_completions(&mut self, fd: BorrowedFd<'_>, deadline: Instant) -> io::Result<()> {
        self.stats.waits += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        sys::wait_error_queue(fd, left.as_millis().clamp(1, i32::MAX as u128) as i32)?;
        self.reap(fd);
        Ok(())
    }

    /// Reads completions: buffers released; a COPIED one turns zero copy off.
    pub fn reap(&mut self, fd: BorrowedFd<'_>) -> usize {
        let mut done = 0;
        errqueue::read(fd, |e| {
            if let ErrKind::Zerocopy { lo, hi, copied } = e.kind {
                let n = self.completions.complete(lo, hi, drop);
                done += n;
                self.stats.completed += n as u64;
                if copied {
                    self.stats.completed_copied += n as u64;
                    self.copied_seen = true;
                    self.zero_copy = false;
                }
            }
        });
        done
    }

    /// Waits up to `timeout` for every zero-copy send to complete; true if
    /// none is left (the owners may then be dropped without the kernel still
    /// reading their pages; if false, closing the socket frees them).
    pub fn drain(&mut self, fd: BorrowedFd<'_>, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            self.reap(fd);
            let left = until.saturating_duration_since(Instant::now());
            if self.completions.outstanding() == 0 || left.is_zero() {
                return self.completions.outstanding() == 0;
            }
            let _ = sys::wait_error_queue(fd, left.as_millis().clamp(1, i32::MAX as u128) as i32);
        }
    }
}

fn past(deadline: Instant) -> io::Result<()> {
    if Instant::now() >= deadline {
        Err(io::Error::new(io::ErrorKind::TimedOut, "send deadline passed"))
    } else {
        Ok(())
    }
}

/// EINTR: again. EAGAIN on a blocking socket: its send timeout passed (the
/// peer stopped reading). Anything else: the connection's error.
fn retry_or_fail(e: io::Error) -> io::Result<()> {
    match e.kind() {
        io::ErrorKind::Interrupted => Ok(()),
        io::ErrorKind::WouldBlock => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer stopped reading (send timeout)",
        )),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;
    use std::sync::Arc;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (s, c)
    }

    #[test]
    fn a_message_arrives_whole_and_loopback_turns_zero_copy_off() {
        let (s, mut c) = pair();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        let big: Arc<[u8]> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
        let reader = std::thread::spawn(move || {
            let mut v = vec![];
            c.read_to_end(&mut v).unwrap();
            v
        });
        let mut tx = StreamSender::new(s.as_fd(), true, 4096, 1 << 20);
        let deadline = Instant::now() + Duration::from_secs(10);
        tx.send_all(
            s.as_fd(),
            &[Piece::Copy(b"head"), Piece::Held(&big), Piece::Copy(b"tail")],
            deadline,
        )
        .unwrap();
        tx.send_all(s.as_fd(), &[Piece::Held(&big)], deadline).unwrap();
        assert!(tx.drain(s.as_fd(), Duration::from_secs(5)), "completions missing");
        assert_eq!(tx.pinned_bytes(), 0);
        drop(s);
        let got = reader.join().unwrap();
        let mut want = b"head".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"tail");
        want.extend_from_slice(&big);
        assert_eq!(got.len(), want.len());
        assert!(got == want, "bytes differ");
        // Loopback delivery copies: every completion says so, and the
        // sender stops pinning.
        if tx.stats.zerocopy_sends > 0 {
            assert_eq!(tx.stats.completed, tx.stats.zerocopy_sends);
            assert!(tx.copied_seen && !tx.zero_copy());
        }
    }

    #[test]
    fn a_peer_that_stops_reading_times_out_and_memory_stays_bounded() {
        let (s, c) = pair();
        s.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
        let big: Arc<[u8]> = vec![1u8; 64 << 20].into();
        let mut tx = StreamSender::new(s.as_fd(), false, 4096, 1 << 20);
        let t0 = Instant::now();
        let e = tx
            .send_all(
                s.as_fd(),
                &[Piece::Held(&big)],
                Instant::now() + Duration::from_secs(20),
            )
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(10));
        drop(c);
    }
}
