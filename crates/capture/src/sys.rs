//! Every syscall and every raw-memory access of the crate.
//!
//! Safety contract: this module hands out only safe types. Raw pointers never
//! leave it; the mmap'ed rings are exposed through [`Ring`], whose accessors
//! bounds-check every offset against the mapping length, so safe code can
//! never read or write outside the mapping whatever the kernel (or a bug in
//! the ring walker) puts into header fields. Frame status words are accessed
//! as atomics with acquire/release ordering, which is the kernel's own
//! protocol for handing a frame or block between kernel and user space
//! (`smp_wmb()` before the status store on its side). Packet bytes are read
//! only while the status word says the frame belongs to user space, so the
//! kernel does not write them concurrently.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub mod xsk;

/// A syscall that failed, with the call's name: the workspace's one
/// error of that kind.
pub use oskit::SysError;

pub type SysResult<T> = Result<T, SysError>;

fn check(call: &'static str, rc: libc::c_int) -> SysResult<libc::c_int> {
    if rc < 0 {
        Err(SysError::last(call))
    } else {
        Ok(rc)
    }
}

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// Name of interface `index`, or `None` if there is none.
pub fn if_name(index: u32) -> Option<String> {
    let mut buf = [0u8; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// Interface index of `name`, or `None` if there is no such interface.
pub fn if_index(name: &str) -> Option<u32> {
    let c = CString::new(name).ok()?;
    // SAFETY: `c` is a valid NUL-terminated string for the duration of the call.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (idx != 0).then_some(idx)
}

/// Kernel statistics of a packet socket since the previous read (the kernel
/// resets them on every read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawStats {
    pub packets: u64,
    pub drops: u64,
    pub freeze_q_cnt: u64,
}

/// Sets socket option `opt` at `level` to `val`.
fn set_option<T>(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: &T, call: &'static str) -> SysResult<()> {
    // SAFETY: `val` points to a live `T` of the size we pass.
    check(call, unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (val as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Waits until `fd` has one of `events` or `timeout` passes. Returns
/// whether it has; EINTR counts as "not yet".
fn wait_for(fd: RawFd, events: libc::c_short, timeout: Duration) -> SysResult<bool> {
    let mut pfd = libc::pollfd { fd, events, revents: 0 };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: one valid pollfd.
    let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(SysError::new("poll", e));
    }
    Ok(rc > 0)
}

/// One packet taken with [`PacketSocket::recv_one`].
#[derive(Debug, Clone, Copy)]
pub struct Received {
    /// Bytes placed in the buffer.
    pub len: usize,
    /// Length of the packet.
    pub wire: usize,
    /// Kernel receive time (ns since the epoch), 0 if none came with it.
    pub ts_ns: u64,
    pub vlan: Option<(u16, u16)>,
    /// The packet's `sockaddr_ll`.
    pub addr: [u8; 20],
}

/// An `AF_PACKET` socket.
#[derive(Debug)]
pub struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    /// A raw packet socket that receives nothing until [`PacketSocket::bind`]:
    /// protocol 0 keeps packets of other interfaces from queueing up before
    /// the filter and the ring are in place.
    pub fn open(dgram: bool) -> SysResult<Self> {
        let ty = if dgram { libc::SOCK_DGRAM } else { libc::SOCK_RAW };
        // SAFETY: plain syscall; the returned fd is owned below.
        let fd = check("socket(AF_PACKET)", unsafe {
            libc::socket(libc::AF_PACKET, ty | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
        Ok(PacketSocket {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn setsockopt<T>(&self, level: libc::c_int, opt: libc::c_int, val: &T, call: &'static str) -> SysResult<()> {
        set_option(self.fd.as_raw_fd(), level, opt, val, call)
    }

    pub fn set_version(&self, version: libc::c_int) -> SysResult<()> {
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &version,
            "setsockopt(PACKET_VERSION)",
        )
    }

    pub fn attach_filter(&self, prog: &[BpfInsn]) -> SysResult<()> {
        let mut insns: Vec<libc::sock_filter> = prog
            .iter()
            .map(|i| libc::sock_filter {
                code: i.code,
                jt: i.jt,
                jf: i.jf,
                k: i.k,
            })
            .collect();
        let fprog = libc::sock_fprog {
            len: insns.len() as libc::c_ushort,
            filter: insns.as_mut_ptr(),
        };
        // The kernel copies the program during the call, so `insns` may be freed after.
        self.setsockopt(
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog,
            "setsockopt(SO_ATTACH_FILTER)",
        )
    }

    pub fn set_rcvbuf(&self, bytes: libc::c_int) -> SysResult<()> {
        // RCVBUFFORCE lifts the rmem_max cap for root; fall back to the capped option.
        self.setsockopt(
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &bytes,
            "setsockopt(SO_RCVBUFFORCE)",
        )
        .or_else(|_| self.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUF, &bytes, "setsockopt(SO_RCVBUF)"))
    }

    pub fn set_rcvtimeo(&self, t: Duration) -> SysResult<()> {
        let tv = libc::timeval {
            tv_sec: t.as_secs() as libc::time_t,
            tv_usec: t.subsec_micros() as libc::suseconds_t,
        };
        self.setsockopt(libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv, "setsockopt(SO_RCVTIMEO)")
    }

    pub fn enable_timestamp_ns(&self) -> SysResult<()> {
        let on: libc::c_int = 1;
        self.setsockopt(
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            &on,
            "setsockopt(SO_TIMESTAMPNS)",
        )
    }

    pub fn ignore_outgoing(&self) -> SysResult<()> {
        let on: libc::c_int = 1;
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_IGNORE_OUTGOING,
            &on,
            "setsockopt(PACKET_IGNORE_OUTGOING)",
        )
    }

    /// Puts interface `ifindex` in promiscuous mode for as long as this
    /// socket is open: a packet-socket membership, counted by the kernel per
    /// socket and undone when the socket closes (however the process ends),
    /// unlike setting IFF_PROMISC on the device, which would outlive a crash.
    pub fn promiscuous(&self, ifindex: u32) -> SysResult<()> {
        // SAFETY: packet_mreq is plain old data; all-zero is a valid value.
        let mut mreq: libc::packet_mreq = unsafe { mem::zeroed() };
        mreq.mr_ifindex = ifindex as libc::c_int;
        mreq.mr_type = libc::PACKET_MR_PROMISC as libc::c_ushort;
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_ADD_MEMBERSHIP,
            &mreq,
            "setsockopt(PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC)",
        )
    }

    pub fn qdisc_bypass(&self) -> SysResult<()> {
        let on: libc::c_int = 1;
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &on,
            "setsockopt(PACKET_QDISC_BYPASS)",
        )
    }

    pub fn set_rx_ring_v2(&self, block_size: u32, block_nr: u32, frame_size: u32) -> SysResult<()> {
        self.set_ring_v2(
            libc::PACKET_RX_RING,
            "setsockopt(PACKET_RX_RING)",
            block_size,
            block_nr,
            frame_size,
        )
    }

    pub fn set_tx_ring_v2(&self, block_size: u32, block_nr: u32, frame_size: u32) -> SysResult<()> {
        self.set_ring_v2(
            libc::PACKET_TX_RING,
            "setsockopt(PACKET_TX_RING)",
            block_size,
            block_nr,
            frame_size,
        )
    }

    /// One TPACKET_V2 ring request: `block_nr` blocks of `block_size` bytes
    /// cut into frames of `frame_size`.
    fn set_ring_v2(
        &self,
        option: libc::c_int,
        call: &'static str,
        block_size: u32,
        block_nr: u32,
        frame_size: u32,
    ) -> SysResult<()> {
        let req = libc::tpacket_req {
            tp_block_size: block_size,
            tp_block_nr: block_nr,
            tp_frame_size: frame_size,
            tp_frame_nr: block_size / frame_size * block_nr,
        };
        self.setsockopt(libc::SOL_PACKET, option, &req, call)
    }

    pub fn set_rx_ring_v3(&self, block_size: u32, block_nr: u32, frame_size: u32, retire_ms: u32) -> SysResult<()> {
        let req = libc::tpacket_req3 {
            tp_block_size: block_size,
            tp_block_nr: block_nr,
            tp_frame_size: frame_size,
            tp_frame_nr: block_size / frame_size * block_nr,
            tp_retire_blk_tov: retire_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_RX_RING,
            &req,
            "setsockopt(PACKET_RX_RING)",
        )
    }

    /// Binds to one interface and starts receiving every protocol.
    pub fn bind(&self, ifindex: u32, protocol: u16) -> SysResult<()> {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol.to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
        check("bind(AF_PACKET)", unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }

    pub fn join_fanout(&self, group: u16, kind: u32, flags: u32) -> SysResult<()> {
        let arg: u32 = u32::from(group) | ((kind | flags) << 16);
        self.setsockopt(libc::SOL_PACKET, libc::PACKET_FANOUT, &arg, "setsockopt(PACKET_FANOUT)")
    }

    /// Reads (and thereby resets) the kernel counters. `v3` selects the
    /// `tpacket_stats_v3` layout, which adds the freeze count.
    pub fn stats(&self, v3: bool) -> SysResult<RawStats> {
        let mut st = libc::tpacket_stats_v3 {
            tp_packets: 0,
            tp_drops: 0,
            tp_freeze_q_cnt: 0,
        };
        let mut len: libc::socklen_t = if v3 {
            mem::size_of::<libc::tpacket_stats_v3>()
        } else {
            mem::size_of::<libc::tpacket_stats>()
        } as libc::socklen_t;
        // SAFETY: `st` is at least `len` bytes (v2 stats are a prefix of v3 stats).
        check("getsockopt(PACKET_STATISTICS)", unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                (&mut st as *mut libc::tpacket_stats_v3).cast(),
                &mut len,
            )
        })?;
        Ok(RawStats {
            packets: u64::from(st.tp_packets),
            drops: u64::from(st.tp_drops),
            freeze_q_cnt: if v3 { u64::from(st.tp_freeze_q_cnt) } else { 0 },
        })
    }

    /// Waits until the socket is readable or `timeout` passes. Returns
    /// whether it is readable; EINTR counts as "not yet".
    pub fn poll_in(&self, timeout: Duration) -> SysResult<bool> {
        wait_for(self.fd.as_raw_fd(), libc::POLLIN | libc::POLLERR, timeout)
    }

    /// Waits until the socket is writable (TX ring has room) or `timeout`.
    pub fn poll_out(&self, timeout: Duration) -> SysResult<bool> {
        wait_for(self.fd.as_raw_fd(), libc::POLLOUT, timeout)
    }

    /// One `recvmsg` for one packet (blocking up to SO_RCVTIMEO). Returns
    /// `None` on timeout/EINTR, else (bytes copied, length on the wire,
    /// kernel timestamp in ns since the epoch).
    /// PACKET_AUXDATA: each `recvmsg` also reports the VLAN tag the kernel
    /// took out of the frame (into its metadata), so it can be put back.
    pub fn enable_auxdata(&self) -> SysResult<()> {
        let on: libc::c_int = 1;
        self.setsockopt(
            libc::SOL_PACKET,
            libc::PACKET_AUXDATA,
            &on,
            "setsockopt(PACKET_AUXDATA)",
        )
    }

    /// Receives one frame into `buf`, with its kernel timestamp, a VLAN tag
    /// the kernel moved into the metadata, and its address; `None` when the
    /// receive timeout passed first.
    pub fn recv_one(&self, buf: &mut [u8]) -> SysResult<Option<Received>> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // Room for one SCM_TIMESTAMPNS (a timespec) and one PACKET_AUXDATA
        // (a tpacket_auxdata), each with its cmsg header.
        let mut cbuf = [0u64; 16];
        // The sender's link-level address (`sockaddr_ll`, 20 bytes), for
        // the cooked header of `-i any`.
        let mut addr = [0u8; 20];
        // SAFETY: msghdr is plain old data; zero is valid.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_name = addr.as_mut_ptr().cast();
        msg.msg_namelen = addr.len() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = mem::size_of_val(&cbuf);
        // SAFETY: iov points into `buf`, control into `cbuf`, both live for the call.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_TRUNC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(SysError::new("recvmsg", e)),
            };
        }
        let wire = n as usize;
        let mut ts = 0u64;
        let mut vlan = None;
        // SAFETY: walking the control buffer the kernel filled, with the libc
        // CMSG macros that stay within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let t: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    ts = (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64;
                }
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    let a: libc::tpacket_auxdata = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    vlan = crate::vlan::vlan_of(a.tp_status, a.tp_vlan_tci, a.tp_vlan_tpid);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some(Received {
            len: wire.min(buf.len()),
            wire,
            ts_ns: ts,
            vlan,
            addr,
        }))
    }

    /// Sends one frame (raw socket bound to an interface).
    pub fn send(&self, frame: &[u8], flags: libc::c_int) -> SysResult<usize> {
        // SAFETY: `frame` is valid for reads of its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), flags) };
        if n < 0 {
            return Err(SysError::last("send"));
        }
        Ok(n as usize)
    }

    /// Asks the kernel to transmit what the TX ring holds. With `wait` false
    /// it returns at once (MSG_DONTWAIT).
    pub fn kick_tx(&self, wait: bool) -> SysResult<()> {
        let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
        // SAFETY: a NULL buffer of length 0 is how TX rings are flushed.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, flags) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
                || e.raw_os_error() == Some(libc::ENOBUFS)
            {
                return Ok(());
            }
            return Err(SysError::new("send(TX ring)", e));
        }
        Ok(())
    }

    /// Maps the ring(s) set up with PACKET_RX_RING/PACKET_TX_RING.
    pub fn mmap_ring(&self, len: usize) -> SysResult<Ring> {
        // SAFETY: mapping the socket's ring; the kernel checks `len` against it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_LOCKED | libc::MAP_POPULATE,
                self.fd.as_raw_fd(),
                0,
            )
        };
        // MAP_LOCKED may fail under RLIMIT_MEMLOCK; retry without it.
        let p = if p == libc::MAP_FAILED {
            // SAFETY: as above.
            unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    self.fd.as_raw_fd(),
                    0,
                )
            }
        } else {
            p
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last("mmap(packet ring)"));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| SysError::new("mmap(packet ring)", io::Error::other("null mapping")))?;
        Ok(Ring { ptr, len })
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A shared-memory packet ring. Every accessor is bounds-checked.
#[derive(Debug)]
pub struct Ring {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value; access to frames is coordinated
// with the kernel through the status words, and each Ring is used by one
// thread at a time (it is moved, not shared).
unsafe impl Send for Ring {}

impl Ring {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn status_ref(&self, off: usize) -> Option<&AtomicU32> {
        if off % 4 != 0 || off.checked_add(4)? > self.len {
            return None;
        }
        // SAFETY: in bounds and 4-aligned (the mapping is page-aligned);
        // AtomicU32 has the layout of u32.
        Some(unsafe { &*(self.ptr.as_ptr().add(off).cast::<AtomicU32>()) })
    }

    /// Acquire-load of the status word at `off` (0 if out of bounds).
    pub fn load_status(&self, off: usize) -> u32 {
        self.status_ref(off).map_or(0, |a| a.load(Ordering::Acquire))
    }

    /// Release-store of a status word, handing the frame back (or forward).
    pub fn store_status(&self, off: usize, v: u32) {
        if let Some(a) = self.status_ref(off) {
            a.store(v, Ordering::Release);
        }
    }

    pub fn read_u16(&self, off: usize) -> u16 {
        self.bytes(off, 2).map_or(0, |b| u16::from_ne_bytes([b[0], b[1]]))
    }

    pub fn read_u32(&self, off: usize) -> u32 {
        self.bytes(off, 4)
            .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The bytes `[off, off+len)`, or `None` if that leaves the mapping.
    pub fn bytes(&self, off: usize, len: usize) -> Option<&[u8]> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds; see the module contract on concurrent writes.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }

    /// Mutable bytes of a TX frame owned by user space.
    pub fn bytes_mut(&mut self, off: usize, len: usize) -> Option<&mut [u8]> {
        if off.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds, and `&mut self` makes this the only live slice.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }

    pub fn write_u32(&mut self, off: usize, v: u32) {
        if let Some(b) = self.bytes_mut(off, 4) {
            b.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

impl Ring {
    /// An anonymous mapping with the ring interface, for testing the ring
    /// walkers on hand-made (or garbage) contents.
    #[cfg(test)]
    pub fn anonymous(len: usize) -> SysResult<Ring> {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last("mmap(anonymous)"));
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| SysError::new("mmap(anonymous)", io::Error::other("null mapping")))?;
        Ok(Ring { ptr, len })
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what mmap_ring mapped.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// A UDP socket for the generator's `sendmmsg` path.
#[derive(Debug)]
pub struct UdpSender {
    fd: OwnedFd,
    /// Destination, given per message: an unconnected socket does not turn
    /// ICMP port-unreachable replies into send errors.
    dst: libc::sockaddr_in,
}

impl UdpSender {
    pub fn new(
        dst: std::net::SocketAddrV4,
        src: Option<std::net::SocketAddrV4>,
        device: Option<&str>,
    ) -> SysResult<Self> {
        // SAFETY: plain syscall.
        let fd = check("socket(AF_INET, SOCK_DGRAM)", unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: fresh fd owned by nobody else.
        let s = UdpSender {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            dst: sockaddr_in(dst),
        };
        if let Some(dev) = device {
            let c = CString::new(dev).map_err(|e| {
                SysError::new(
                    "setsockopt(SO_BINDTODEVICE)",
                    io::Error::new(io::ErrorKind::InvalidInput, e),
                )
            })?;
            let b = c.as_bytes_with_nul();
            // SAFETY: pointer/len of a live NUL-terminated string.
            check("setsockopt(SO_BINDTODEVICE)", unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_BINDTODEVICE,
                    b.as_ptr().cast(),
                    b.len() as libc::socklen_t,
                )
            })?;
        }
        let sndbuf: libc::c_int = 4 << 20;
        // SAFETY: int option.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUFFORCE,
                (&sndbuf as *const libc::c_int).cast(),
                4,
            );
        }
        if let Some(src) = src {
            let sa = sockaddr_in(src);
            // SAFETY: valid sockaddr_in.
            check("bind(UDP)", unsafe {
                libc::bind(
                    fd,
                    (&sa as *const libc::sockaddr_in).cast(),
                    mem::size_of::<libc::sockaddr_in>() as u32,
                )
            })?;
        }
        Ok(s)
    }

    pub fn send_batch(&self, bufs: &[&[u8]]) -> SysResult<usize> {
        sendmmsg_to(self.fd.as_raw_fd(), bufs, Some(&self.dst))
    }
}

fn sockaddr_in(a: std::net::SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// `sendmmsg` of `bufs` on a connected socket (UDP, or a bound packet
/// socket). Returns how many were sent; 0 when the socket buffer is full.
pub fn sendmmsg(fd: RawFd, bufs: &[&[u8]]) -> SysResult<usize> {
    sendmmsg_to(fd, bufs, None)
}

fn sendmmsg_to(fd: RawFd, bufs: &[&[u8]], dst: Option<&libc::sockaddr_in>) -> SysResult<usize> {
    let mut iovs: Vec<libc::iovec> = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: zeroed mmsghdr is valid; we set the iov fields.
            let mut m: libc::mmsghdr = unsafe { mem::zeroed() };
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
            if let Some(d) = dst {
                // The kernel only reads the address.
                m.msg_hdr.msg_name = (d as *const libc::sockaddr_in).cast_mut().cast();
                m.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            }
            m
        })
        .collect();
    // SAFETY: msgs/iovs point into live buffers for the duration of the call.
    let n = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), msgs.len() as libc::c_uint, 0) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
            || e.raw_os_error() == Some(libc::ENOBUFS)
        {
            return Ok(0);
        }
        return Err(SysError::new("sendmmsg", e));
    }
    Ok(n as usize)
}

/// CPU time (user, system) of the calling thread.
pub fn thread_cpu_time() -> (Duration, Duration) {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// `fmt` formatted by the C library's strftime for `unix_secs` in local
/// time (tcpdump's `-G` file names); `None` if the format or the time does
/// not convert.
pub fn strftime_local(fmt: &str, unix_secs: i64) -> Option<String> {
    let cfmt = CString::new(fmt).ok()?;
    let t: libc::time_t = unix_secs as libc::time_t;
    // SAFETY: localtime_r writes into `tm`, which we own; it returns null on
    // failure, checked below.
    let mut tm: libc::tm = unsafe { mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return None;
    }
    let mut buf = vec![0u8; fmt.len() * 8 + 256];
    // SAFETY: buf is writable for its length, cfmt is NUL-terminated, tm
    // is initialised; strftime writes at most buf.len() bytes and returns
    // how many (0 if they did not fit).
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), cfmt.as_ptr(), &tm) };
    if n == 0 && !fmt.is_empty() {
        return None;
    }
    buf.truncate(n);
    String::from_utf8(buf).ok()
}
