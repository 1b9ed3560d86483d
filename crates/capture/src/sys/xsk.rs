//! AF_XDP sockets for the `xdp` capture mode: the UMEM (the packet buffers
//! user space and kernel share), its fill and completion rings, and the
//! receive ring.
//!
//! Safety contract (as for the packet rings in the parent module): only
//! safe types leave this module. Every ring index is masked, every
//! descriptor the kernel writes is checked against the UMEM before its bytes
//! are touched, and the producer/consumer words are accessed as atomics with
//! acquire/release ordering, the kernel's own protocol for these rings. A
//! UMEM chunk is read only between the kernel's publishing it on the receive
//! ring and our returning it on the fill ring, when the kernel does not
//! write it.
#![allow(unsafe_code)]

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{check, set_option, wait_for, SysError, SysResult};

/// How the socket was bound: the driver's zero-copy mode (the UMEM is the
/// device's DMA buffer) or copy mode (the kernel copies each frame into it,
/// which every driver supports and veth always needs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindMode {
    ZeroCopy,
    Copy,
}

impl BindMode {
    pub fn name(self) -> &'static str {
        match self {
            BindMode::ZeroCopy => "zero-copy",
            BindMode::Copy => "copy",
        }
    }
}

/// The socket's own counters (cumulative since it was bound).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct XskStats {
    /// Frames dropped because no UMEM buffer was free or the frame did not
    /// fit one.
    pub rx_dropped: u64,
    /// Frames dropped because the receive ring was full.
    pub rx_ring_full: u64,
}

/// A mapping of one ring: producer and consumer words and `size` entries of
/// `T` (a u64 address on the fill ring, an `xdp_desc` on the receive ring).
#[derive(Debug)]
struct RingMap {
    base: NonNull<u8>,
    map_len: usize,
    producer: usize,
    consumer: usize,
    desc: usize,
    size: u32,
}

impl RingMap {
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        entry: usize,
        pgoff: u64,
        what: &'static str,
    ) -> SysResult<RingMap> {
        let map_len = off.desc as usize + size as usize * entry;
        // SAFETY: mapping a ring of the socket; the kernel checks the length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last(what));
        }
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| SysError::new(what, io::Error::other("null mapping")))?;
        let ring = RingMap {
            base,
            map_len,
            producer: off.producer as usize,
            consumer: off.consumer as usize,
            desc: off.desc as usize,
            size,
        };
        // The offsets come from the kernel; check them once so every later
        // access is in bounds.
        for o in [ring.producer, ring.consumer] {
            if o % 4 != 0 || o + 4 > map_len {
                return Err(SysError::new(
                    what,
                    io::Error::other("ring offsets outside the mapping"),
                ));
            }
        }
        Ok(ring)
    }

    fn word(&self, off: usize) -> &AtomicU32 {
        // SAFETY: `off` is one of the offsets checked in `map` (in bounds,
        // 4-aligned); AtomicU32 has the layout of u32.
        unsafe { &*(self.base.as_ptr().add(off).cast::<AtomicU32>()) }
    }

    fn producer(&self) -> &AtomicU32 {
        self.word(self.producer)
    }

    fn consumer(&self) -> &AtomicU32 {
        self.word(self.consumer)
    }

    /// Pointer to entry `idx` (masked) of `entry` bytes.
    fn entry_ptr(&self, idx: u32, entry: usize) -> *mut u8 {
        let slot = (idx & (self.size - 1)) as usize;
        // SAFETY: slot < size, and the mapping holds `size` entries after `desc`.
        unsafe { self.base.as_ptr().add(self.desc + slot * entry) }
    }
}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

/// The UMEM: anonymous memory registered with the socket, `frames` chunks
/// of `chunk` bytes.
#[derive(Debug)]
struct Umem {
    base: NonNull<u8>,
    len: usize,
}

impl Drop for Umem {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `XskSocket::open` mapped.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// One AF_XDP socket with its own UMEM, bound to one receive queue.
#[derive(Debug)]
pub struct XskSocket {
    // Field order is drop order: the rings and the UMEM are unmapped before
    // the socket closes (the kernel keeps its pin until then).
    fill: RingMap,
    _completion: RingMap,
    rx: RingMap,
    umem: Umem,
    fd: OwnedFd,
    chunk: u32,
    bind_mode: BindMode,
}

// SAFETY: the mappings are owned by this value and used by one thread at a
// time (it is moved, not shared).
unsafe impl Send for XskSocket {}

const DESC_LEN: usize = mem::size_of::<libc::xdp_desc>();

impl XskSocket {
    /// Opens a socket on queue `queue` of `ifindex` with `frames` buffers
    /// of `chunk` bytes (both powers of two), fills the fill ring with all of
    /// them and binds, in zero-copy mode if the driver has it and in copy
    /// mode otherwise (`force_copy` skips the attempt).
    pub fn open(ifindex: u32, queue: u32, frames: u32, chunk: u32, force_copy: bool) -> SysResult<XskSocket> {
        assert!(frames.is_power_of_two() && chunk.is_power_of_two());
        // SAFETY: plain syscall; the fd is owned below.
        let raw = check("socket(AF_XDP)", unsafe {
            libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: just returned by socket(), owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = frames as usize * chunk as usize;
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(SysError::last("mmap(UMEM)"));
        }
        let umem = Umem {
            base: NonNull::new(p.cast::<u8>())
                .ok_or_else(|| SysError::new("mmap(UMEM)", io::Error::other("null mapping")))?,
            len,
        };
        // SAFETY: xdp_umem_reg is plain old data; all-zero is valid.
        let mut reg: libc::xdp_umem_reg = unsafe { mem::zeroed() };
        reg.addr = umem.base.as_ptr() as u64;
        reg.len = len as u64;
        reg.chunk_size = chunk;
        reg.headroom = 0;
        setsockopt(&fd, libc::XDP_UMEM_REG, &reg, "setsockopt(XDP_UMEM_REG)")?;
        setsockopt(&fd, libc::XDP_UMEM_FILL_RING, &frames, "setsockopt(XDP_UMEM_FILL_RING)")?;
        // Receive only: the completion ring (which the kernel requires)
        // never sees an entry, so its minimum size does.
        let completion_size: u32 = 64;
        setsockopt(
            &fd,
            libc::XDP_UMEM_COMPLETION_RING,
            &completion_size,
            "setsockopt(XDP_UMEM_COMPLETION_RING)",
        )?;
        setsockopt(&fd, libc::XDP_RX_RING, &frames, "setsockopt(XDP_RX_RING)")?;
        // SAFETY: xdp_mmap_offsets is plain old data.
        let mut off: libc::xdp_mmap_offsets = unsafe { mem::zeroed() };
        let mut optlen = mem::size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is a live buffer of `optlen` bytes.
        check("getsockopt(XDP_MMAP_OFFSETS)", unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut optlen,
            )
        })?;
        let fill = RingMap::map(
            fd.as_raw_fd(),
            &off.fr,
            frames,
            8,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            "mmap(AF_XDP fill ring)",
        )?;
        let completion = RingMap::map(
            fd.as_raw_fd(),
            &off.cr,
            completion_size,
            8,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            "mmap(AF_XDP completion ring)",
        )?;
        let rx = RingMap::map(
            fd.as_raw_fd(),
            &off.rx,
            frames,
            DESC_LEN,
            libc::XDP_PGOFF_RX_RING as u64,
            "mmap(AF_XDP receive ring)",
        )?;
        // Every buffer starts on the fill ring: the kernel may use any of them.
        let prod = fill.producer().load(Ordering::Relaxed);
        for i in 0..frames {
            let addr = u64::from(i) * u64::from(chunk);
            // SAFETY: an entry of the fill ring, 8 bytes, 8-aligned (desc
            // offsets are 8-aligned and entries 8 bytes).
            unsafe { fill.entry_ptr(prod.wrapping_add(i), 8).cast::<u64>().write(addr) };
        }
        fill.producer().store(prod.wrapping_add(frames), Ordering::Release);

        let mut sock = XskSocket {
            fill,
            _completion: completion,
            rx,
            umem,
            fd,
            chunk,
            bind_mode: BindMode::Copy,
        };
        if !force_copy {
            match sock.bind(ifindex, queue, libc::XDP_ZEROCOPY) {
                Ok(()) => {
                    sock.bind_mode = BindMode::ZeroCopy;
                    return Ok(sock);
                }
                // No zero-copy in this driver: copy mode below.
                Err(e) if matches!(e.errno(), Some(libc::EOPNOTSUPP) | Some(libc::EPROTONOSUPPORT)) => {}
                Err(e) => return Err(e),
            }
        }
        sock.bind(ifindex, queue, libc::XDP_COPY)?;
        Ok(sock)
    }

    /// Whether this kernel and these privileges allow AF_XDP sockets (one
    /// is opened and closed again; nothing is bound).
    pub fn probe() -> SysResult<()> {
        // SAFETY: plain syscall; the fd is closed right away.
        let raw = check("socket(AF_XDP)", unsafe {
            libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: just returned by socket(), owned by nobody else.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        Ok(())
    }

    fn bind(&self, ifindex: u32, queue: u32, flags: u16) -> SysResult<()> {
        // SAFETY: sockaddr_xdp is plain old data.
        let mut sa: libc::sockaddr_xdp = unsafe { mem::zeroed() };
        sa.sxdp_family = libc::AF_XDP as u16;
        sa.sxdp_flags = flags;
        sa.sxdp_ifindex = ifindex;
        sa.sxdp_queue_id = queue;
        // SAFETY: a valid sockaddr_xdp of the size passed.
        check("bind(AF_XDP)", unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                mem::size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }

    pub fn bind_mode(&self) -> BindMode {
        self.bind_mode
    }

    /// Whether the receive ring holds frames.
    pub fn rx_ready(&self) -> bool {
        let prod = self.rx.producer().load(Ordering::Acquire);
        prod != self.rx.consumer().load(Ordering::Relaxed)
    }

    /// Hands the received frames, oldest first, to `f` as
    /// (`meta`, `frame`), where `meta` is the `meta_len` bytes in front of
    /// the frame (the XDP metadata area, if the program wrote one), until
    /// `f` returns false (that frame stays in the ring). Each frame taken
    /// goes back on the fill ring with its metadata area zeroed. Returns the
    /// number of descriptors skipped as invalid (never written by a correct
    /// kernel; their buffers go back on the fill ring too).
    pub fn receive(&mut self, meta_len: usize, f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> u64 {
        let prod = self.rx.producer().load(Ordering::Acquire);
        let cons = self.rx.consumer().load(Ordering::Relaxed);
        let fill_prod = self.fill.producer().load(Ordering::Relaxed);
        let mut taken = 0u32;
        let mut invalid = 0u64;
        let avail = prod.wrapping_sub(cons);
        let chunk = u64::from(self.chunk);
        while taken < avail {
            let idx = cons.wrapping_add(taken);
            // SAFETY: a receive-ring entry published by the kernel (acquire
            // load of the producer above); xdp_desc is 16 bytes and aligned.
            let d = unsafe { self.rx.entry_ptr(idx, DESC_LEN).cast::<libc::xdp_desc>().read() };
            let base = d.addr & !(chunk - 1);
            let in_chunk = d.addr - base;
            let ok = d
                .addr
                .checked_add(u64::from(d.len))
                .is_some_and(|end| end <= self.umem.len as u64)
                && in_chunk + u64::from(d.len) <= chunk
                && in_chunk >= meta_len as u64;
            if ok {
                let start = d.addr as usize;
                // SAFETY: [start - meta_len, start + len) lies inside one
                // chunk of the UMEM (checked above), which the kernel handed
                // to us and does not write until we return it.
                let (meta, frame) = unsafe {
                    let p = self.umem.base.as_ptr();
                    (
                        std::slice::from_raw_parts(p.add(start - meta_len), meta_len),
                        std::slice::from_raw_parts(p.add(start), d.len as usize),
                    )
                };
                if !f(meta, frame) {
                    break;
                }
                // SAFETY: as above; the slices given to `f` are dead now.
                unsafe { std::ptr::write_bytes(self.umem.base.as_ptr().add(start - meta_len), 0, meta_len) };
            } else {
                invalid += 1;
            }
            // SAFETY: fill-ring entry; at most `frames` buffers are ever
            // outside the fill ring, so it has room for every one returned.
            unsafe {
                self.fill
                    .entry_ptr(fill_prod.wrapping_add(taken), 8)
                    .cast::<u64>()
                    .write(base.min(self.umem.len as u64 - chunk))
            };
            taken += 1;
        }
        if taken > 0 {
            self.fill
                .producer()
                .store(fill_prod.wrapping_add(taken), Ordering::Release);
            self.rx.consumer().store(cons.wrapping_add(taken), Ordering::Release);
        }
        invalid
    }

    /// Waits until frames arrive or `timeout` passes; EINTR counts as "not yet".
    pub fn poll_in(&self, timeout: Duration) -> SysResult<bool> {
        wait_for(self.fd.as_raw_fd(), libc::POLLIN, timeout)
    }

    /// The socket's counters (XDP_STATISTICS; cumulative, not reset on read).
    pub fn stats(&self) -> SysResult<XskStats> {
        // SAFETY: plain old data.
        let mut st: libc::xdp_statistics = unsafe { mem::zeroed() };
        let mut optlen = mem::size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `st` is a live buffer of `optlen` bytes.
        check("getsockopt(XDP_STATISTICS)", unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut st as *mut libc::xdp_statistics).cast(),
                &mut optlen,
            )
        })?;
        Ok(XskStats {
            rx_dropped: st.rx_dropped,
            rx_ring_full: st.rx_ring_full,
        })
    }
}

impl AsRawFd for XskSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn setsockopt<T>(fd: &OwnedFd, opt: libc::c_int, val: &T, call: &'static str) -> SysResult<()> {
    set_option(fd.as_raw_fd(), libc::SOL_XDP, opt, val, call)
}
