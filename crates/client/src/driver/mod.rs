//! The seam between the client and its socket. The client's logic calls
//! only these four operations, so another driver (tokio, `recvmmsg`, an
//! in-memory network in a test) plugs in without touching it; the std
//! driver here is the portable default.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};

/// A datagram socket the client owns. `recv_from` must not block: it
/// returns `ErrorKind::WouldBlock` when nothing is waiting, since the
/// client runs inside the game's loop.
pub trait Driver {
    fn send_to(&mut self, datagram: &[u8], to: SocketAddr) -> io::Result<usize>;
    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    /// Moves to a new local port on the same address (see
    /// `Client::rebind`); returns the new address.
    fn rebind(&mut self) -> io::Result<SocketAddr>;
}

/// A non-blocking std [`UdpSocket`].
#[derive(Debug)]
pub struct UdpDriver {
    sock: UdpSocket,
}

impl UdpDriver {
    /// Binds `local` (`host:port`, resolved by the system resolver) and
    /// makes the socket non-blocking.
    pub fn bind(local: impl ToSocketAddrs) -> io::Result<UdpDriver> {
        let sock = UdpSocket::bind(local)?;
        UdpDriver::from_socket(sock)
    }

    /// A socket the caller made (bound where it chose: another network
    /// namespace, a buffer size of its own), made non-blocking. A
    /// [`Driver::rebind`] binds the new socket in the calling thread's
    /// namespace, with default options.
    pub fn from_socket(sock: UdpSocket) -> io::Result<UdpDriver> {
        sock.set_nonblocking(true)?;
        Ok(UdpDriver { sock })
    }
}

/// The socket's descriptor, for an event loop to watch (it changes on
/// [`Driver::rebind`]).
#[cfg(unix)]
impl std::os::fd::AsFd for UdpDriver {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(unix)]
impl std::os::fd::AsRawFd for UdpDriver {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

impl Driver for UdpDriver {
    fn send_to(&mut self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.sock.send_to(datagram, to)
    }

    fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.sock.recv_from(buf)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn rebind(&mut self) -> io::Result<SocketAddr> {
        let ip = self.sock.local_addr()?.ip();
        *self = UdpDriver::bind(SocketAddr::new(ip, 0))?;
        self.sock.local_addr()
    }
}

#[cfg(target_os = "linux")]
mod mmsg;
#[cfg(target_os = "linux")]
pub use mmsg::MmsgDriver;
#[cfg(feature = "tokio")]
mod tokio;
#[cfg(feature = "tokio")]
pub use self::tokio::TokioDriver;
