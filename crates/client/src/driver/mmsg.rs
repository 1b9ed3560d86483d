//! A Linux driver that receives with `recvmmsg`: one system call fills up
//! to [`BATCH`] datagrams, which [`Driver::recv_from`] then hands out one
//! by one (a copy into the client's buffer, cheaper than a system call).
//! Sending and the rest are the std socket's. The client's logic is the
//! same as over [`UdpDriver`](super::UdpDriver): this changes only how many
//! times the kernel is entered per frame of a game loop.

use super::Driver;
use crate::sys::RecvSlots;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};

/// Datagrams one `recvmmsg` call can return.
pub const BATCH: usize = 32;

/// A slot holds the largest datagram a reflector forwards, so nothing is
/// ever truncated. The `BATCH` slots are one zeroed allocation (2 MiB of
/// address space); the kernel writes, and so maps, only the bytes that
/// arrive.
const SLOT: usize = reflector_proto::protocol::MAX_DATAGRAM;

/// A non-blocking UDP socket read with `recvmmsg`.
pub struct MmsgDriver {
    sock: UdpSocket,
    slots: RecvSlots,
    next: usize,
    filled: usize,
}

impl std::fmt::Debug for MmsgDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmsgDriver")
            .field("sock", &self.sock)
            .field("queued", &(self.filled - self.next))
            .finish_non_exhaustive()
    }
}

impl MmsgDriver {
    /// Binds `local` (resolved by the system resolver), non-blocking.
    pub fn bind(local: impl ToSocketAddrs) -> io::Result<MmsgDriver> {
        let sock = UdpSocket::bind(local)?;
        sock.set_nonblocking(true)?;
        Ok(MmsgDriver {
            sock,
            slots: RecvSlots::new(BATCH, SLOT),
            next: 0,
            filled: 0,
        })
    }
}

impl Driver for MmsgDriver {
    fn send_to(&mut self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(datagram, to)
    }

    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        if self.next == self.filled {
            self.next = 0;
            self.filled = 0;
            self.filled = self.slots.recv(&self.sock)?;
            if self.filled == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
        let (bytes, src) = self.slots.get(self.next).ok_or(io::ErrorKind::WouldBlock)?;
        self.next += 1;
        // The client's buffer is MAX_DATAGRAM long, as a slot is; a shorter
        // one gets what fits, as recv_from would give it.
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        Ok((n, src))
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn rebind(&mut self) -> io::Result<SocketAddr> {
        let ip = self.sock.local_addr()?.ip();
        let sock = UdpSocket::bind(SocketAddr::new(ip, 0))?;
        sock.set_nonblocking(true)?;
        // What the old socket had queued is dropped with it, as with the
        // std driver.
        self.sock = sock;
        self.next = 0;
        self.filled = 0;
        self.sock.local_addr()
    }
}
