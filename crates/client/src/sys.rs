//! The only unsafe code of the client: `recvmmsg(2)` for the Linux driver.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

/// Receives up to `out.len()` datagrams without waiting: datagram `i` into
/// `slots[i * slot..][..slot]`, its length and source into `out[i]`.
/// Returns how many arrived (0 when none was waiting).
pub fn recvmmsg(sock: &UdpSocket, slots: &mut [u8], slot: usize, out: &mut [(usize, SocketAddr)]) -> io::Result<usize> {
    const MAX: usize = 64;
    let n = out.len().min(MAX).min(slots.len() / slot.max(1));
    // SAFETY: plain C structs for which all-zero bytes are a valid value.
    let mut addrs: [libc::sockaddr_storage; MAX] = unsafe { zeroed() };
    let mut iovs: [libc::iovec; MAX] = unsafe { zeroed() };
    let mut hdrs: [libc::mmsghdr; MAX] = unsafe { zeroed() };
    let base = slots.as_mut_ptr();
    for i in 0..n {
        // SAFETY: i * slot + slot <= slots.len(), checked by `n` above.
        iovs[i] = libc::iovec {
            iov_base: unsafe { base.add(i * slot) }.cast(),
            iov_len: slot,
        };
        hdrs[i].msg_hdr.msg_name = (&mut addrs[i] as *mut libc::sockaddr_storage).cast();
        hdrs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        hdrs[i].msg_hdr.msg_iov = &mut iovs[i];
        hdrs[i].msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: every header points at live buffers of the lengths given, all
    // of which outlive the call; the kernel writes at most those lengths.
    let got = unsafe {
        libc::recvmmsg(
            sock.as_raw_fd(),
            hdrs.as_mut_ptr(),
            n as libc::c_uint,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if got < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        };
    }
    let got = got as usize;
    for i in 0..got {
        out[i] = (hdrs[i].msg_len as usize, to_socket_addr(&addrs[i]));
    }
    Ok(got)
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
