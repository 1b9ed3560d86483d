//! The reflector's syscalls that nix does not wrap the way the hot path
//! needs: `sendto` and `sendmmsg` to pre-built kernel socket addresses,
//! `recvfrom` into a caller's buffer, error-queue draining and socket options.
//!
//! Safety contract: every function here passes the kernel pointers to memory
//! that is borrowed for the duration of the call (slices, `Dest`s and the
//! batch's own arrays), with lengths taken from the same objects, and reads
//! back only what the kernel reports it wrote. `MmsgBatch` holds raw pointers
//! only between filling and the `sendmmsg` call, both inside one `&mut self`
//! method, so nothing it points to can move or be freed meanwhile.
#![expect(
    unsafe_code,
    reason = "the fenced syscall layer: each unsafe block states its contract"
)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd};

/// A destination in the kernel's own format, built once when a member joins
/// so that a fan-out converts nothing per datagram.
#[derive(Clone, Copy)]
pub struct Dest {
    addr: SocketAddr,
    raw: RawAddr,
}

#[derive(Clone, Copy)]
enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl From<SocketAddr> for Dest {
    fn from(addr: SocketAddr) -> Dest {
        let raw = match addr {
            SocketAddr::V4(a) => RawAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        };
        Dest { addr, raw }
    }
}

impl Dest {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn as_ptr(&self) -> (*const libc::sockaddr, libc::socklen_t) {
        match &self.raw {
            RawAddr::V4(a) => (
                (a as *const libc::sockaddr_in).cast(),
                size_of::<libc::sockaddr_in>() as libc::socklen_t,
            ),
            RawAddr::V6(a) => (
                (a as *const libc::sockaddr_in6).cast(),
                size_of::<libc::sockaddr_in6>() as libc::socklen_t,
            ),
        }
    }
}

impl PartialEq for Dest {
    fn eq(&self, other: &Dest) -> bool {
        self.addr == other.addr
    }
}

impl Eq for Dest {}

impl std::fmt::Debug for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dest({})", self.addr)
    }
}

fn check(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

/// One non-blocking `sendto`.
pub fn send_to(fd: BorrowedFd<'_>, buf: &[u8], dest: &Dest) -> io::Result<usize> {
    let (sa, len) = dest.as_ptr();
    // SAFETY: buf and dest are borrowed for the call; lengths match them.
    check(unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            sa,
            len,
        )
    })
}

/// One non-blocking `recvfrom`; returns the length and the source.
pub fn recv_from(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut sl = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: buf and ss are borrowed mutably for the call with their sizes.
    let n = check(unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut sl,
        )
    })?;
    let addr = sockaddr_to_std(&ss)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "datagram from a non-IP address family"))?;
    Ok((n, addr))
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in, which is smaller.
            let a: &libc::sockaddr_in = unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let a: &libc::sockaddr_in6 = unsafe { &*(ss as *const libc::sockaddr_storage).cast() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Reusable arrays for `sendmmsg`: one header per destination, all pointing
/// at one iovec that references the payload, so the payload is referenced,
/// not copied, by us (the kernel still copies it once per datagram).
pub struct MmsgBatch {
    hdrs: Vec<libc::mmsghdr>,
    iov: Box<libc::iovec>,
}

impl MmsgBatch {
    pub fn new(capacity: usize) -> MmsgBatch {
        // SAFETY: mmsghdr is plain data (pointers and integers); zero is valid.
        let hdrs = (0..capacity.max(1))
            .map(|_| unsafe { zeroed::<libc::mmsghdr>() })
            .collect();
        MmsgBatch {
            hdrs,
            iov: Box::new(libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }),
        }
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Sends `buf` to `dests[i]` for each `i` in `idx` (at most `capacity()`
    /// of them) in one syscall; returns how many were sent (a prefix of `idx`).
    /// Panics if an index is out of range (callers build `idx` from `dests`).
    pub fn send(&mut self, fd: BorrowedFd<'_>, buf: &[u8], dests: &[Dest], idx: &[usize]) -> io::Result<usize> {
        let n = idx.len().min(self.hdrs.len());
        if n == 0 {
            return Ok(0);
        }
        self.iov.iov_base = buf.as_ptr() as *mut libc::c_void;
        self.iov.iov_len = buf.len();
        let iov: *mut libc::iovec = &mut *self.iov;
        for (h, &i) in self.hdrs.iter_mut().zip(idx) {
            let (sa, len) = dests[i].as_ptr();
            h.msg_hdr.msg_name = sa as *mut libc::c_void;
            h.msg_hdr.msg_namelen = len;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: the first n headers point at buf (via the boxed iovec) and
        // at the borrowed Dests, all alive for this call.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        check(r as isize)
    }
}

/// Checks that the kernel has `sendmmsg` (a zero-length batch sends nothing).
pub fn probe_sendmmsg() -> io::Result<()> {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
    // SAFETY: a zero-length vector; the kernel reads no header.
    let r = unsafe { libc::sendmmsg(sock.as_raw_fd(), std::ptr::null_mut(), 0, libc::MSG_DONTWAIT) };
    check(r as isize).map(|_| ())
}

/// Waits until the socket is writable or `timeout_ms` passes; true if a
/// send should be tried again. poll() reports POLLERR whatever we asked for
/// while an ICMP error is queued; that also means "try again" (the next
/// send consumes or the caller drains the error), never "wait more", which
/// would spin.
pub fn wait_writable(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd, borrowed for the call.
    let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(r > 0 && p.revents & (libc::POLLOUT | libc::POLLERR) != 0)
}

/// Reads and discards queued ICMP errors (IP_RECVERR); returns how many.
/// Without this a pending error would fail the next send with, e.g.,
/// ECONNREFUSED for an unrelated destination.
pub fn drain_error_queue(fd: BorrowedFd<'_>) -> usize {
    let mut count = 0;
    let mut data = [0u8; 64];
    let mut control = [0u64; 64];
    loop {
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: msghdr is plain data; zero is valid.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 64]>();
        // SAFETY: msg points at local buffers alive for the call.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 || count >= 1024 {
            return count;
        }
        count += 1;
    }
}

fn set_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a local int with its size.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// IP_RECVERR (or IPV6_RECVERR): makes the kernel report ENOBUFS when the
/// device queue drops our datagram, instead of dropping it silently.
/// On an IPv6 socket both options are set: sends to IPv4-mapped members go
/// through the IPv4 path, which reads IP_RECVERR.
pub fn set_recverr(fd: BorrowedFd<'_>, ip: IpAddr) -> io::Result<()> {
    match ip {
        IpAddr::V4(_) => set_int(fd, libc::SOL_IP, libc::IP_RECVERR, 1),
        IpAddr::V6(_) => {
            set_int(fd, libc::SOL_IPV6, libc::IPV6_RECVERR, 1)?;
            // A v6-only socket may refuse the IPv4 option; it never sends over IPv4 then.
            let _ = set_int(fd, libc::SOL_IP, libc::IP_RECVERR, 1);
            Ok(())
        }
    }
}

/// Sleeps for `micros` on a high-resolution timer (not a spin).
pub fn sleep_micros(micros: u64) {
    std::thread::sleep(std::time::Duration::from_micros(micros));
}
