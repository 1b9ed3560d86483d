//! The only unsafe code of the client: `recvmmsg(2)` for the Linux driver.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// `count` receive slots of `slot` bytes and the kernel's headers for
/// them, built once: a `recvmmsg` call then only resets two fields per
/// header. The headers point into the boxes this owns, whose heap blocks
/// do not move when the struct does.
pub struct RecvSlots {
    slot: usize,
    buf: Box<[u8]>,
    _iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    hdrs: Box<[libc::mmsghdr]>,
    count: usize,
}

// SAFETY: the raw pointers inside the headers point only into this
// struct's own boxes, so moving it to another thread moves what they point
// at with it; nothing is shared.
unsafe impl Send for RecvSlots {}

impl RecvSlots {
    pub fn new(count: usize, slot: usize) -> RecvSlots {
        let mut buf = vec![0u8; count * slot].into_boxed_slice();
        // SAFETY: plain C structs for which all-zero bytes are valid.
        let mut names: Box<[libc::sockaddr_storage]> = (0..count).map(|_| unsafe { zeroed() }).collect();
        let mut iovs: Box<[libc::iovec]> = (0..count)
            .map(|i| libc::iovec {
                // In bounds: i < count, and buf has count * slot bytes.
                iov_base: buf[i * slot..].as_mut_ptr().cast(),
                iov_len: slot,
            })
            .collect();
        let hdrs = (0..count)
            .map(|i| {
                // SAFETY: as above.
                let mut h: libc::mmsghdr = unsafe { zeroed() };
                h.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        RecvSlots {
            slot,
            buf,
            _iovs: iovs,
            names,
            hdrs,
            count: 0,
        }
    }

    /// Receives what is waiting, up to the slot count, without blocking;
    /// returns how many arrived (0 when none was waiting).
    pub fn recv(&mut self, sock: &UdpSocket) -> io::Result<usize> {
        for h in self.hdrs.iter_mut() {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_flags = 0;
        }
        // SAFETY: every header points at this struct's own iovec, buffer
        // slot and name, alive and unmoved for the call; the kernel writes
        // at most the lengths they give.
        let got = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                self.hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.count = 0;
        if got < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        self.count = got as usize;
        Ok(self.count)
    }

    /// Datagram `i` of the last call and its source.
    pub fn get(&self, i: usize) -> Option<(&[u8], SocketAddr)> {
        if i >= self.count {
            return None;
        }
        let len = (self.hdrs[i].msg_len as usize).min(self.slot);
        Some((
            &self.buf[i * self.slot..i * self.slot + len],
            to_socket_addr(&self.names[i]),
        ))
    }
}

fn to_socket_addr(a: &libc::sockaddr_storage) -> SocketAddr {
    match i32::from(a.ss_family) {
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 for this family, and
            // sockaddr_storage is large and aligned enough for it.
            let a6 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            SocketAddr::V6(SocketAddrV6::new(
                a6.sin6_addr.s6_addr.into(),
                u16::from_be(a6.sin6_port),
                u32::from_be(a6.sin6_flowinfo),
                a6.sin6_scope_id,
            ))
        }
        _ => {
            // SAFETY: as above, for AF_INET (the only other family a UDP
            // socket of ours receives from).
            let a4 = unsafe { &*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                u32::from_be(a4.sin_addr.s_addr).into(),
                u16::from_be(a4.sin_port),
            ))
        }
    }
}
