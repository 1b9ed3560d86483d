//! Raw-socket system calls for the delay line.
//!
//! Safety contract: every `unsafe` block here passes the kernel pointers to
//! properly sized, initialised local values (`sockaddr_ll`, `c_int`) or to
//! a caller's buffer together with that buffer's exact length; the file
//! descriptor is owned by an `OwnedFd` and so is valid for the call.
#![expect(
    unsafe_code,
    reason = "the fenced syscall layer: each unsafe block states its contract"
)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// An AF_PACKET socket bound to one interface. With `PACKET_VNET_HDR` the
/// kernel hands over GSO super-frames and checksum offload state with each
/// frame and accepts them back on send, so TCP over a delayed link keeps
/// working without turning offloads off.
pub struct PacketSocket {
    fd: OwnedFd,
}

fn check(r: libc::c_int, call: &str) -> io::Result<libc::c_int> {
    if r < 0 {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{call}: {e}")))
    } else {
        Ok(r)
    }
}

fn setopt(fd: &OwnedFd, level: libc::c_int, name: libc::c_int, val: libc::c_int, call: &str) -> io::Result<()> {
    // SAFETY: `val` is a live c_int and its size is passed alongside it.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &val as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    check(r, call).map(|_| ())
}

impl PacketSocket {
    pub fn open(ifname: &str) -> io::Result<Self> {
        let ifindex = nix::net::if_::if_nametoindex(ifname)
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, format!("interface {ifname}: {e}")))?;
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain syscall with integer arguments.
        let raw = check(
            unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    proto as libc::c_int,
                )
            },
            "socket(AF_PACKET)",
        )?;
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        setopt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            1,
            "setsockopt(PACKET_VNET_HDR)",
        )?;
        // Without this we would read back our own transmissions.
        setopt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            1,
            "setsockopt(PACKET_IGNORE_OUTGOING)",
        )?;
        // Room for a burst at high rate; FORCE works as root, plain as fallback.
        if setopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20, "SO_RCVBUFFORCE").is_err() {
            let _ = setopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20, "SO_RCVBUF");
        }
        let _ = setopt(&fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8 << 20, "SO_SNDBUFFORCE");
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is initialised and its exact size is passed.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        check(r, "bind(AF_PACKET)")?;
        // Kernel receive timestamps: the delay counts from when the frame
        // reached the port, not from when this process got to run.
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimestampns, &true)
            .map_err(|e| io::Error::other(format!("setsockopt(SO_TIMESTAMPNS): {e}")))?;
        Ok(PacketSocket { fd })
    }

    /// Receives one frame (with its vnet header) without blocking, with the
    /// kernel's receive time (CLOCK_REALTIME, ns) when it gave one.
    pub fn recv_stamped(&self, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
        use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
        let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
        let mut iov = [io::IoSliceMut::new(buf)];
        let msg = recvmsg::<()>(self.fd.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_DONTWAIT)
            .map_err(io::Error::from)?;
        let mut ts = None;
        if let Ok(cms) = msg.cmsgs() {
            for c in cms {
                if let ControlMessageOwned::ScmTimestampns(t) = c {
                    ts = Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64);
                }
            }
        }
        Ok((msg.bytes, ts))
    }

    /// Sends one frame (with its vnet header) without blocking.
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: the kernel reads exactly `buf.len()` bytes from `buf`.
        let r = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }
}

impl AsFd for PacketSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
