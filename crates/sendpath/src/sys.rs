//! The syscalls: `sendto`/`sendmmsg` to destinations kept in kernel format,
//! `recvmmsg` into reused buffers, `poll` for writability, `recvmsg` on the
//! error queue, and the socket options.
//!
//! Safety contract: every call passes the kernel pointers to memory owned by
//! or borrowed for the call (slices, the set's own vectors and boxes), with
//! lengths taken from the same objects, and reads back only what the kernel
//! says it wrote. The prebuilt `mmsghdr` arrays point into vectors and boxes
//! owned by the same struct; they are rebuilt after every change of those
//! vectors and used only inside `&mut self` methods, so nothing they point
//! to can move or be freed while the kernel reads them.
#![expect(
    unsafe_code,
    reason = "the fenced syscall layer: each unsafe block states its contract"
)]

use crate::errqueue::{decode_extended_err, decode_sockaddr, ErrEntry};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A destination in the kernel's format, built once.
#[derive(Clone, Copy)]
struct Dest {
    addr: SocketAddr,
    raw: RawAddr,
}

#[derive(Clone, Copy)]
enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl Dest {
    fn new(addr: SocketAddr) -> Dest {
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

fn check(ret: isize) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn sendto(fd: BorrowedFd<'_>, buf: &[u8], d: &Dest) -> io::Result<usize> {
    let (sa, len) = d.as_ptr();
    // SAFETY: buf and d are borrowed for the call; the lengths are theirs.
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

/// One datagram to one address, converted on the spot: for replies, which
/// go to whoever sent the request, not to a prebuilt member.
pub struct SendOne;

impl SendOne {
    pub fn send(fd: BorrowedFd<'_>, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        sendto(fd, buf, &Dest::new(to))
    }
}

/// A set of destinations (a group's members) in kernel format, with one
/// prebuilt `mmsghdr` per destination, all sharing one iovec that is pointed
/// at the payload per datagram. Changes (insert, remove) are O(1) and mark
/// the headers stale; they are rebuilt once, at the next send.
pub struct DestSet {
    dests: Vec<Dest>,
    index: HashMap<AddrKey, usize>,
    hdrs: Vec<libc::mmsghdr>,
    iov: Box<libc::iovec>,
    hdrs_valid: bool,
}

/// A destination's key in [`DestSet`]'s index: the fields a `SocketAddr`
/// compares, packed into integers and hashed in one or three writes. Hashing
/// the `SocketAddr` itself feeds the keyed hasher field by field, which
/// costs about twice as much on every fan-out (it looks up its sender).
#[derive(Clone, Copy, PartialEq, Eq)]
enum AddrKey {
    /// Address in bits 16..48, port in 0..16.
    V4(u64),
    V6 {
        ip: u128,
        port: u16,
        flow_scope: u64,
    },
}

impl AddrKey {
    fn of(a: &SocketAddr) -> AddrKey {
        match a {
            SocketAddr::V4(a) => AddrKey::V4(u64::from(a.ip().to_bits()) << 16 | u64::from(a.port())),
            SocketAddr::V6(a) => AddrKey::V6 {
                ip: a.ip().to_bits(),
                port: a.port(),
                flow_scope: u64::from(a.flowinfo()) << 32 | u64::from(a.scope_id()),
            },
        }
    }
}

impl Hash for AddrKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        match *self {
            AddrKey::V4(k) => h.write_u64(k),
            AddrKey::V6 { ip, port, flow_scope } => {
                h.write_u128(ip);
                h.write_u64(flow_scope);
                h.write_u16(port);
            }
        }
    }
}

// SAFETY: the raw pointers inside the headers and the iovec point only into
// memory this struct owns (or, during a send, a borrowed payload); moving the
// set to another thread moves that ownership with it.
unsafe impl Send for DestSet {}

impl Default for DestSet {
    fn default() -> Self {
        DestSet::new()
    }
}

impl DestSet {
    pub fn new() -> DestSet {
        DestSet {
            dests: Vec::new(),
            index: HashMap::new(),
            hdrs: Vec::new(),
            iov: Box::new(libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }),
            hdrs_valid: true,
        }
    }

    pub fn from_addrs(addrs: impl IntoIterator<Item = SocketAddr>) -> DestSet {
        let mut s = DestSet::new();
        for a in addrs {
            s.insert(a);
        }
        s
    }

    /// Adds `addr`; false if it was there already.
    pub fn insert(&mut self, addr: SocketAddr) -> bool {
        let key = AddrKey::of(&addr);
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key, self.dests.len());
        self.dests.push(Dest::new(addr));
        self.hdrs_valid = false;
        true
    }

    /// Removes `addr` (the last destination takes its place); false if absent.
    pub fn remove(&mut self, addr: &SocketAddr) -> bool {
        let Some(i) = self.index.remove(&AddrKey::of(addr)) else {
            return false;
        };
        self.dests.swap_remove(i);
        if let Some(moved) = self.dests.get(i) {
            self.index.insert(AddrKey::of(&moved.addr), i);
        }
        self.hdrs_valid = false;
        true
    }

    pub fn len(&self) -> usize {
        self.dests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.dests.is_empty()
    }

    pub fn position(&self, addr: &SocketAddr) -> Option<usize> {
        self.index.get(&AddrKey::of(addr)).copied()
    }

    pub fn addr(&self, i: usize) -> Option<SocketAddr> {
        self.dests.get(i).map(|d| d.addr)
    }

    pub fn addrs(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.dests.iter().map(|d| d.addr)
    }

    /// A new set holding the destinations in `ranges` (a snapshot for a
    /// fan-out that has to wait: later changes of this set do not touch it).
    pub fn snapshot(&self, ranges: &[Range<usize>]) -> DestSet {
        DestSet::from_addrs(ranges.iter().flat_map(|r| self.dests[r.clone()].iter().map(|d| d.addr)))
    }

    fn rebuild_headers(&mut self) {
        let iov: *mut libc::iovec = &mut *self.iov;
        // SAFETY: mmsghdr is plain data (pointers and integers); zero is valid.
        self.hdrs.resize_with(self.dests.len(), || unsafe { zeroed() });
        for (h, d) in self.hdrs.iter_mut().zip(&self.dests) {
            let (sa, len) = d.as_ptr();
            h.msg_hdr.msg_name = sa as *mut libc::c_void;
            h.msg_hdr.msg_namelen = len;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
        }
        self.hdrs_valid = true;
    }

    /// Sends `buf` to the destinations in `range` (at most
    /// [`crate::MAX_BATCH`] of them) with one `sendmmsg`; returns how many
    /// were sent, a prefix of the range.
    pub fn send_mmsg(&mut self, fd: BorrowedFd<'_>, buf: &[u8], range: Range<usize>) -> io::Result<usize> {
        let range = range.start..range.end.min(self.dests.len());
        let n = range.len().min(crate::MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        if !self.hdrs_valid {
            self.rebuild_headers();
        }
        self.iov.iov_base = buf.as_ptr() as *mut libc::c_void;
        self.iov.iov_len = buf.len();
        // SAFETY: headers range.start..range.start+n exist (range is within
        // dests, and hdrs matches dests after the rebuild); they point at this
        // set's dests and iovec, and the iovec at buf, all alive for the call.
        let r = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr().add(range.start),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        check(r as isize)
    }

    /// Sends `buf` to destination `i` with one `sendto`.
    pub fn send_one(&self, fd: BorrowedFd<'_>, buf: &[u8], i: usize) -> io::Result<usize> {
        match self.dests.get(i) {
            Some(d) => sendto(fd, buf, d),
            None => Err(io::Error::new(io::ErrorKind::InvalidInput, "no such destination")),
        }
    }
}

/// Several datagrams, each to every destination of a [`DestSet`], in as few
/// `sendmmsg` calls as [`crate::MAX_BATCH`] messages per call allow: a whole
/// received batch fanned out with one system call where [`DestSet::send_mmsg`]
/// makes one per datagram. The headers and iovecs are rebuilt on each call
/// into vectors that never grow past their first capacity, so nothing is
/// allocated per call.
pub struct MultiSend {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
}

// SAFETY: between calls the headers hold stale pointers that are never read
// (every call rewrites the ones it passes); moving the struct moves nothing
// they point to.
unsafe impl Send for MultiSend {}

impl Default for MultiSend {
    fn default() -> Self {
        MultiSend::new()
    }
}

impl MultiSend {
    pub fn new() -> MultiSend {
        MultiSend {
            // SAFETY: plain data; zero is valid.
            hdrs: (0..crate::MAX_BATCH).map(|_| unsafe { zeroed() }).collect(),
            iovs: vec![
                libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0
                };
                crate::MAX_BATCH
            ],
        }
    }

    /// Sends copy `first` onwards of the `bufs.len() * dests.len()` copies
    /// (datagram-major: every destination of `bufs[0]`, then of `bufs[1]`…)
    /// with one `sendmmsg` of at most [`crate::MAX_BATCH`] messages; returns
    /// how many were sent, a prefix. The caller loops until all are sent,
    /// waiting on WouldBlock as with any non-blocking send.
    pub fn send(&mut self, fd: BorrowedFd<'_>, bufs: &[&[u8]], dests: &DestSet, first: usize) -> io::Result<usize> {
        let per = dests.dests.len();
        let total = bufs.len() * per;
        let n = total.saturating_sub(first).min(crate::MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        for k in 0..n {
            let copy = first + k;
            let (buf, d) = (bufs[copy / per], &dests.dests[copy % per]);
            self.iovs[k] = libc::iovec {
                iov_base: buf.as_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            let (sa, len) = d.as_ptr();
            let h = &mut self.hdrs[k];
            h.msg_hdr.msg_name = sa as *mut libc::c_void;
            h.msg_hdr.msg_namelen = len;
            h.msg_hdr.msg_iov = &mut self.iovs[k];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: headers 0..n were written above and point at iovecs of
        // this struct (never reallocated: both vectors keep MAX_BATCH
        // entries), at `dests`' addresses and at `bufs`, all borrowed for
        // the call; n <= MAX_BATCH = the vectors' length.
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

/// `recvmmsg` into `slots` reused buffers of `slot_size` bytes each.
pub struct RecvBatch {
    slot_size: usize,
    buf: Vec<u8>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    hdrs: Vec<libc::mmsghdr>,
    count: usize,
}

// SAFETY: as for DestSet: the headers point only into this struct's own
// vectors, which move with it.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub fn new(slots: usize, slot_size: usize) -> RecvBatch {
        let slots = slots.clamp(1, crate::MAX_BATCH);
        let mut b = RecvBatch {
            slot_size,
            buf: vec![0u8; slots * slot_size],
            iovs: Vec::with_capacity(slots),
            // SAFETY: plain data; zero is valid.
            names: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: plain data; zero is valid.
            hdrs: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            count: 0,
        };
        let base = b.buf.as_mut_ptr();
        for i in 0..slots {
            b.iovs.push(libc::iovec {
                // SAFETY: i * slot_size is within buf (slots * slot_size bytes).
                iov_base: unsafe { base.add(i * slot_size) }.cast(),
                iov_len: slot_size,
            });
        }
        // The vectors are never resized again, so these pointers stay valid.
        for i in 0..slots {
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
        }
        b
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives up to `capacity()` datagrams in one call (non-blocking);
    /// returns how many. WouldBlock when none is queued.
    pub fn recv(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        for h in &mut self.hdrs {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        // SAFETY: every header points at this batch's own iovec (into buf)
        // and sockaddr_storage, all alive and unmoved for the call.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                self.hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.count = check(r as isize)?;
        Ok(self.count)
    }

    /// Datagram `i` of the last batch: its bytes (at most the slot size),
    /// its source, and whether it was truncated to fit the slot.
    pub fn get(&self, i: usize) -> Option<(&[u8], Option<SocketAddr>, bool)> {
        let (range, src, truncated) = self.slot(i)?;
        Some((&self.buf[range], src, truncated))
    }

    /// [`RecvBatch::get`], writable: a receiver may rewrite a datagram in
    /// place before passing it on (the reflector zeroes a DATA's tag).
    pub fn get_mut(&mut self, i: usize) -> Option<(&mut [u8], Option<SocketAddr>, bool)> {
        let (range, src, truncated) = self.slot(i)?;
        Some((&mut self.buf[range], src, truncated))
    }

    fn slot(&self, i: usize) -> Option<(Range<usize>, Option<SocketAddr>, bool)> {
        if i >= self.count {
            return None;
        }
        let h = &self.hdrs[i];
        let len = (h.msg_len as usize).min(self.slot_size);
        let start = i * self.slot_size;
        let name_len = (h.msg_hdr.msg_namelen as usize).min(size_of::<libc::sockaddr_storage>());
        // SAFETY: names[i] is plain data of at least name_len bytes.
        let name = unsafe {
            std::slice::from_raw_parts((&self.names[i] as *const libc::sockaddr_storage).cast::<u8>(), name_len)
        };
        Some((
            start..start + len,
            decode_sockaddr(name),
            h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
        ))
    }
}

/// `recvmmsg` into buffers the caller owns and may keep (a receive pool's):
/// the headers are built once and pointed at the caller's buffers on each
/// call, one syscall per batch.
pub struct RecvInto {
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_storage>,
    hdrs: Vec<libc::mmsghdr>,
    count: usize,
}

// SAFETY: as for RecvBatch: the headers point only into this struct's own
// vectors, which move with it; the iovecs point at the caller's buffers
// only during `recv`.
unsafe impl Send for RecvInto {}

impl RecvInto {
    pub fn new(slots: usize) -> RecvInto {
        let slots = slots.clamp(1, crate::MAX_BATCH);
        let mut b = RecvInto {
            iovs: (0..slots)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            // SAFETY: plain data; zero is valid.
            names: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            // SAFETY: plain data; zero is valid.
            hdrs: (0..slots).map(|_| unsafe { zeroed() }).collect(),
            count: 0,
        };
        // The vectors are never resized again, so these pointers stay valid.
        for i in 0..slots {
            let h = &mut b.hdrs[i].msg_hdr;
            h.msg_iov = &mut b.iovs[i];
            h.msg_iovlen = 1;
            h.msg_name = (&mut b.names[i] as *mut libc::sockaddr_storage).cast();
        }
        b
    }

    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Receives up to `bufs.len()` (at most `capacity()`) datagrams in one
    /// call (non-blocking), datagram `i` into `bufs[i]`; returns how many.
    /// WouldBlock when none is queued.
    pub fn recv(&mut self, fd: BorrowedFd<'_>, bufs: &mut [Box<[u8]>]) -> io::Result<usize> {
        let n = bufs.len().min(self.hdrs.len());
        for (i, b) in bufs[..n].iter_mut().enumerate() {
            self.iovs[i] = libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            };
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        self.count = 0;
        // SAFETY: the first n headers point at their own iovec and
        // sockaddr_storage and the iovecs at `bufs[..n]`, all alive, unmoved
        // and not otherwise borrowed for the call.
        let r = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                self.hdrs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        self.count = check(r as isize)?;
        Ok(self.count)
    }

    /// Datagram `i` of the last call: its length in its buffer (at most the
    /// buffer's), its source, and whether it was truncated to fit.
    pub fn get(&self, i: usize) -> Option<(usize, Option<SocketAddr>, bool)> {
        if i >= self.count {
            return None;
        }
        let h = &self.hdrs[i];
        let len = (h.msg_len as usize).min(self.iovs[i].iov_len);
        let name_len = (h.msg_hdr.msg_namelen as usize).min(size_of::<libc::sockaddr_storage>());
        // SAFETY: names[i] is plain data of at least name_len bytes.
        let name = unsafe {
            std::slice::from_raw_parts((&self.names[i] as *const libc::sockaddr_storage).cast::<u8>(), name_len)
        };
        Some((len, decode_sockaddr(name), h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0))
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
/// send should be tried again. poll() reports POLLERR whatever was asked
/// while an error is queued; that also means "try again" (the send consumes
/// it, or the caller reads the queue), never "wait more", which would spin.
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

fn set_int(fd: BorrowedFd<'_>, level: libc::c_int, name: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: a pointer to a local int with its size.
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

/// IP_RECVERR (or IPV6_RECVERR): the kernel reports ENOBUFS when the device
/// queue drops our datagram, instead of dropping it silently, and queues
/// ICMP errors with the destination they are about. On an IPv6 socket both
/// are set: sends to IPv4-mapped members take the IPv4 path.
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

/// Reads the socket's error queue (at most 1024 entries per call), handing
/// each decoded entry to `f`; returns how many entries were read, decodable
/// or not.
pub fn read(fd: BorrowedFd<'_>, mut f: impl FnMut(ErrEntry)) -> usize {
    let mut count = 0;
    // The datagram that failed comes back as data; only its address matters.
    let mut data = [0u8; 64];
    let mut control = [0u64; 64];
    while count < 1024 {
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: plain data; zero is valid.
        let mut name: libc::sockaddr_storage = unsafe { zeroed() };
        // SAFETY: plain data; zero is valid.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 64]>();
        // SAFETY: msg points at local buffers alive for the call.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 {
            break;
        }
        count += 1;
        let name_len = (msg.msg_namelen as usize).min(size_of::<libc::sockaddr_storage>());
        // SAFETY: name is plain data of at least name_len bytes.
        let name_bytes =
            unsafe { std::slice::from_raw_parts((&name as *const libc::sockaddr_storage).cast::<u8>(), name_len) };
        let dest = decode_sockaddr(name_bytes);
        // SAFETY: the CMSG macros walk the control buffer the kernel filled,
        // within msg_controllen; each data slice lies inside its cmsg.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                let (level, typ) = ((*c).cmsg_level, (*c).cmsg_type);
                if (level == libc::SOL_IP && typ == libc::IP_RECVERR)
                    || (level == libc::SOL_IPV6 && typ == libc::IPV6_RECVERR)
                {
                    let hdr = libc::CMSG_LEN(0) as usize;
                    let len = ((*c).cmsg_len as usize).saturating_sub(hdr);
                    let bytes = std::slice::from_raw_parts(libc::CMSG_DATA(c), len);
                    if let Some(kind) = decode_extended_err(bytes) {
                        f(ErrEntry {
                            dest: if matches!(kind, crate::errqueue::ErrKind::Zerocopy { .. }) {
                                None
                            } else {
                                dest
                            },
                            kind,
                        });
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
    }
    count
}

/// SO_ZEROCOPY: lets sends with MSG_ZEROCOPY pin the caller's pages instead
/// of copying them (Linux 4.14+; UDP from 5.0).
pub fn set_zerocopy(fd: BorrowedFd<'_>) -> io::Result<()> {
    set_int(fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)
}

/// UDP_SEGMENT: each send of up to 64 KiB leaves as datagrams of `size`
/// payload bytes, segmented late (GSO), so one send is one large buffer.
pub fn set_udp_segment(fd: BorrowedFd<'_>, size: u16) -> io::Result<()> {
    set_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, libc::c_int::from(size))
}

/// One datagram to `to`, non-blocking; with `zerocopy` the kernel pins
/// `buf`'s pages (MSG_ZEROCOPY) and reports on the error queue when it is
/// done with them: the caller must keep `buf` alive and unchanged until then.
pub fn send_flagged(fd: BorrowedFd<'_>, buf: &[u8], to: SocketAddr, zerocopy: bool) -> io::Result<usize> {
    let d = Dest::new(to);
    let (sa, len) = d.as_ptr();
    let flags = libc::MSG_DONTWAIT | if zerocopy { libc::MSG_ZEROCOPY } else { 0 };
    // SAFETY: buf and d are borrowed for the call; the lengths are theirs.
    // With MSG_ZEROCOPY the kernel keeps referencing buf's pages after the
    // call: the safe wrapper holds buf's owner until the completion arrives.
    check(unsafe { libc::sendto(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags, sa, len) })
}

/// Sends from `buf` on a connected stream socket, blocking up to the
/// socket's SO_SNDTIMEO (then EAGAIN); never raises SIGPIPE. With `zerocopy`
/// the kernel pins the pages of what it accepted (MSG_ZEROCOPY): the caller
/// must keep `buf` alive and unchanged until the completion arrives.
pub fn send_stream(fd: BorrowedFd<'_>, buf: &[u8], zerocopy: bool) -> io::Result<usize> {
    let flags = libc::MSG_NOSIGNAL | if zerocopy { libc::MSG_ZEROCOPY } else { 0 };
    // SAFETY: buf is borrowed for the call; its length is its own. Zero-copy
    // pages are held by the safe wrapper until their completion.
    check(unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags) })
}

/// Waits until the socket's error queue has an entry (a completion) or
/// `timeout_ms` passes; true if it has one.
pub fn wait_error_queue(fd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        // No event asked for: poll reports POLLERR (a queued error or
        // completion) regardless, and nothing else wakes it. POLLOUT would
        // report the usual writable socket at once and spin.
        events: 0,
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
    Ok(r > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errqueue::ErrKind;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    fn sock() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    fn recv_all(s: &UdpSocket, want: usize) -> Vec<Vec<u8>> {
        let mut got = vec![];
        let mut b = [0u8; 2048];
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.len() < want && Instant::now() < deadline {
            if let Ok(n) = s.recv(&mut b) {
                got.push(b[..n].to_vec());
            }
        }
        got
    }

    #[test]
    fn a_set_sends_one_batch_to_a_range_and_survives_changes() {
        let tx = sock();
        let rx: Vec<UdpSocket> = (0..5).map(|_| sock()).collect();
        let mut set = DestSet::from_addrs(rx.iter().map(|s| s.local_addr().unwrap()));
        assert_eq!(set.len(), 5);
        assert!(!set.insert(rx[0].local_addr().unwrap()));
        // Everyone but 2: two ranges around it.
        let skip = set.position(&rx[2].local_addr().unwrap()).unwrap();
        let n = set.send_mmsg(tx.as_fd(), b"one", 0..skip).unwrap()
            + set.send_mmsg(tx.as_fd(), b"one", skip + 1..5).unwrap();
        assert_eq!(n, 4);
        for (i, r) in rx.iter().enumerate() {
            let want = usize::from(i != 2);
            assert_eq!(recv_all(r, want).len(), want, "receiver {i}");
        }
        // Remove one, the headers are rebuilt, the payload is the new one.
        assert!(set.remove(&rx[1].local_addr().unwrap()));
        assert!(!set.remove(&rx[1].local_addr().unwrap()));
        assert_eq!(set.send_mmsg(tx.as_fd(), b"two", 0..set.len()).unwrap(), 4);
        for (i, r) in rx.iter().enumerate() {
            let got = recv_all(r, usize::from(i != 1));
            assert_eq!(got, if i == 1 { vec![] } else { vec![b"two".to_vec()] }, "receiver {i}");
        }
        let snap = set.snapshot(&[0..1, 2..4]);
        assert_eq!(snap.len(), 3);
        assert_eq!(snap.send_one(tx.as_fd(), b"3", 0).unwrap(), 1);
    }

    #[test]
    fn a_multi_send_sends_every_datagram_to_every_destination_and_resumes() {
        let tx = sock();
        let rx: Vec<UdpSocket> = (0..3).map(|_| sock()).collect();
        let set = DestSet::from_addrs(rx.iter().map(|s| s.local_addr().unwrap()));
        let bufs: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 8]).collect();
        let views: Vec<&[u8]> = bufs.iter().map(Vec::as_slice).collect();
        let mut m = MultiSend::new();
        assert_eq!(
            m.send(tx.as_fd(), &views, &set, 0).unwrap(),
            120,
            "40 datagrams x 3 in one call"
        );
        for (i, r) in rx.iter().enumerate() {
            assert_eq!(recv_all(r, 40), bufs, "receiver {i}: every datagram, in order");
        }
        // Resuming at copy 118 (datagram-major): datagram 39 to the second
        // and third destinations only.
        assert_eq!(m.send(tx.as_fd(), &views, &set, 118).unwrap(), 2);
        assert_eq!(recv_all(&rx[0], 1), Vec::<Vec<u8>>::new());
        assert_eq!(recv_all(&rx[1], 1), vec![bufs[39].clone()]);
        assert_eq!(recv_all(&rx[2], 1), vec![bufs[39].clone()]);
        assert_eq!(
            m.send(tx.as_fd(), &views, &set, 120).unwrap(),
            0,
            "nothing past the last copy"
        );
        assert_eq!(
            m.send(tx.as_fd(), &views[..0], &set, 0).unwrap(),
            0,
            "no datagrams, no call"
        );
        // One call never takes more than MAX_BATCH messages.
        let many: Vec<&[u8]> = (0..400).map(|_| &b"x"[..]).collect();
        let n = m.send(tx.as_fd(), &many, &set, 0).unwrap();
        assert!(n > 0 && n <= crate::MAX_BATCH, "{n}");
    }

    #[test]
    fn the_index_tells_apart_what_socket_addresses_tell_apart() {
        use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
        let v4 = |a: [u8; 4], p| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(a), p));
        let v6 = |ip: Ipv6Addr, p, flow, scope| SocketAddr::V6(SocketAddrV6::new(ip, p, flow, scope));
        let addrs = [
            v4([10, 0, 0, 1], 4000),
            v4([10, 0, 0, 1], 4001),
            v4([10, 0, 0, 2], 4000),
            v4([0, 0, 15, 160], 1),
            v6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped(), 4000, 0, 0),
            v6(Ipv6Addr::LOCALHOST, 4000, 0, 0),
            v6(Ipv6Addr::LOCALHOST, 4000, 0, 2),
            v6(Ipv6Addr::LOCALHOST, 4000, 7, 0),
            v6(Ipv6Addr::LOCALHOST, 4001, 0, 0),
        ];
        let mut set = DestSet::from_addrs(addrs);
        assert_eq!(set.len(), addrs.len());
        for a in addrs {
            assert!(!set.insert(a), "{a}");
            assert_eq!(set.addr(set.position(&a).unwrap()), Some(a));
        }
        assert!(set.remove(&addrs[0]));
        assert_eq!(set.position(&addrs[0]), None);
        for a in &addrs[1..] {
            assert_eq!(set.addr(set.position(a).unwrap()), Some(*a));
        }
    }

    #[test]
    fn a_batch_receives_several_datagrams_with_their_sources() {
        let rx = sock();
        let tx = sock();
        for i in 0..3u8 {
            tx.send_to(&[i; 10], rx.local_addr().unwrap()).unwrap();
        }
        let mut b = RecvBatch::new(8, 64);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut n = 0;
        while n == 0 && Instant::now() < deadline {
            n = b.recv(rx.as_fd()).unwrap_or(0);
        }
        // Loopback delivers in order; all three are queued by now.
        assert!(n >= 1);
        for i in 0..n {
            let (d, src, trunc) = b.get(i).unwrap();
            assert_eq!(d, &[i as u8; 10]);
            assert_eq!(src, Some(tx.local_addr().unwrap()));
            assert!(!trunc);
        }
        assert!(b.get(n).is_none());
        // Larger than a slot: truncated, and said so.
        while b.recv(rx.as_fd()).is_ok() {}
        let mut small = RecvBatch::new(1, 4);
        tx.send_to(&[9; 10], rx.local_addr().unwrap()).unwrap();
        let mut got = false;
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline && !got {
            if small.recv(rx.as_fd()).unwrap_or(0) == 1 {
                got = small.get(0).is_some_and(|(d, _, t)| d == [9; 4] && t);
                break;
            }
        }
        assert!(got);
    }

    #[test]
    fn port_unreachable_comes_back_decoded_with_its_destination() {
        let tx = sock();
        set_recverr(tx.as_fd(), "127.0.0.1".parse().unwrap()).unwrap();
        // A port nobody listens on: bind, note, close.
        let gone = sock().local_addr().unwrap();
        SendOne::send(tx.as_fd(), b"x", gone).unwrap();
        let mut entries = vec![];
        let deadline = Instant::now() + Duration::from_secs(2);
        while entries.is_empty() && Instant::now() < deadline {
            read(tx.as_fd(), |e| entries.push(e));
        }
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert_eq!(entries[0].dest, Some(gone));
        assert!(
            matches!(entries[0].kind, ErrKind::Icmp { errno, icmp_type: 3, code: 3, .. } if errno == libc::ECONNREFUSED as u32),
            "{entries:?}"
        );
        assert!(wait_writable(tx.as_fd(), 10).unwrap());
        probe_sendmmsg().unwrap();
    }
}
