//! Capture sources: one contract ([`Source::next_batch`]), three ways of
//! getting packets out of an `AF_PACKET` socket.
//!
//! * `recv`: one `recvmsg` per packet into a private buffer (a copy per packet,
//!   a syscall per packet).
//! * `v2`: TPACKET_V2 ring of fixed-size frames; when the next frame is still
//!   the kernel's, one `poll()` — the per-packet wake-up of libpcap 1.0 that
//!   the paper identifies as the bottleneck.
//! * `v3`: TPACKET_V3 ring of blocks; the kernel hands over a block when it is
//!   full or when the retire timeout expires — the paper's "signal when N
//!   packets are ready or m µs have passed", with N set by the block size.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::sys::xsk::{BindMode, XskSocket};
use crate::sys::{self, BpfInsn, PacketSocket, RawStats, Ring};
use crate::vlan::vlan_of;
use crate::xdp::{self, XdpProgram};

/// Capture mode (backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Recv,
    V2,
    V3,
    Xdp,
}

impl Mode {
    pub const ALL: [Mode; 4] = [Mode::Recv, Mode::V2, Mode::V3, Mode::Xdp];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Recv => "recv",
            Mode::V2 => "v2",
            Mode::V3 => "v3",
            Mode::Xdp => "xdp",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "recv" => Ok(Mode::Recv),
            "v2" => Ok(Mode::V2),
            "v3" => Ok(Mode::V3),
            "xdp" => Ok(Mode::Xdp),
            _ => Err(format!("unknown mode '{s}' (choose recv, v2, v3 or xdp)")),
        }
    }
}

/// Result of probing one mode.
pub use oskit::Support;

/// The fewest v3 blocks a derived geometry gives a ring: with fewer, one
/// block being read or filled is a large share of the ring, and a burst
/// that arrives while the reader holds it is dropped (2 blocks of 512 KiB in
/// a 1 MiB ring lost packets that tcpdump's geometry kept).
pub const MIN_V3_BLOCKS: u64 = 8;
/// The largest derived v3 block (reached from a 4 MiB ring up; the default
/// 8 MiB ring has 16 such blocks).
pub const DEFAULT_V3_BLOCK: u64 = 512 << 10;

/// The v3 block size for a ring of `buffer` bytes: the one asked for, or
/// the largest power of two of at most [`DEFAULT_V3_BLOCK`] that gives the
/// ring at least [`MIN_V3_BLOCKS`] blocks (one page at the least). The ring
/// then rounds it up to hold one whole frame.
pub fn v3_block_size(buffer: u64, asked: Option<u64>) -> u64 {
    if let Some(b) = asked {
        return b;
    }
    let per_block = (buffer / MIN_V3_BLOCKS).clamp(u64::from(PAGE), DEFAULT_V3_BLOCK);
    1u64 << (63 - per_block.leading_zeros())
}

/// A warning for a geometry the user chose that leaves the ring fewer than
/// [`MIN_V3_BLOCKS`] blocks.
pub fn ring_warning(ring: &RingConfig) -> Option<String> {
    let block = ring.block_size?;
    let blocks = ring.buffer_bytes / block.max(1);
    (blocks < MIN_V3_BLOCKS).then(|| {
        format!(
            "a {} KiB ring in blocks of {} KiB has {blocks} block(s): under {MIN_V3_BLOCKS}, a burst that arrives \
             while the reader holds a block can be dropped; leave out --block-size to get {} KiB blocks",
            ring.buffer_bytes >> 10,
            block >> 10,
            v3_block_size(ring.buffer_bytes, None) >> 10
        )
    })
}

/// Ring geometry. `buffer_bytes` is the total ring size (like tcpdump -B).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    pub buffer_bytes: u64,
    /// TPACKET_V3 block size: the kernel wakes the reader once per block
    /// (the paper's N, in bytes rather than packets). `None`: derived from
    /// the ring size ([`v3_block_size`]), so a ring has at least 8 blocks.
    pub block_size: Option<u64>,
    /// TPACKET_V3 retire timeout (the paper's m), in milliseconds, which is
    /// the kernel's granularity.
    pub block_timeout_ms: u32,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            buffer_bytes: 8 << 20,
            block_size: None,
            block_timeout_ms: 20,
        }
    }
}

/// Everything needed to open one socket of a capture.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    pub ifindex: u32,
    pub link: LinkType,
    pub mtu: u32,
    pub snaplen: u32,
    pub filter: Vec<BpfInsn>,
    pub ring: RingConfig,
    pub inbound_only: bool,
    /// Put the interface in promiscuous mode while the socket is open.
    pub promiscuous: bool,
    /// PACKET_FANOUT group id to join (hash by flow), if any.
    pub fanout: Option<u16>,
    /// `-i any`: a datagram socket on every interface, packets with a Linux
    /// cooked header.
    pub cooked: bool,
    /// The filter expression, for the `xdp` mode, which runs it in user
    /// space on every frame (the kernel filter above is for packet sockets).
    pub filter_expr: Option<String>,
}

/// Cumulative kernel counters of a socket (PACKET_STATISTICS). `packets`
/// counts every packet the filter accepted, including the dropped ones.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelStats {
    pub packets: u64,
    pub drops: u64,
    pub freeze_q_cnt: u64,
}

impl KernelStats {
    pub fn add(&mut self, o: &KernelStats) {
        self.packets += o.packets;
        self.drops += o.drops;
        self.freeze_q_cnt += o.freeze_q_cnt;
    }
}

/// One captured packet as seen by a sink: borrowed from the ring or buffer.
#[derive(Debug, Clone, Copy)]
pub struct PacketView<'a> {
    /// Kernel receive timestamp, ns since the epoch.
    pub ts_ns: u64,
    /// Length on the wire.
    pub wire_len: u32,
    /// Captured bytes (at most snaplen).
    pub data: &'a [u8],
    /// A VLAN tag the kernel stripped into metadata: (TPID, TCI).
    pub vlan: Option<(u16, u16)>,
    /// `-i any`: the Linux cooked v2 header made from the socket's address
    /// for this packet; `data` is then the network-layer packet.
    pub cooked: Option<[u8; 20]>,
}

/// The Linux cooked v2 header for a packet, from the `sockaddr_ll` the
/// kernel gives with it (family, protocol in network order, ifindex,
/// hardware type, packet type, address length, address): the protocol
/// stays in network order, the index and type go big-endian, the rest is
/// the same bytes.
pub fn sll2_from_sockaddr(sll: &[u8]) -> Option<[u8; 20]> {
    let sll: &[u8; 20] = sll.get(..20)?.try_into().ok()?;
    let mut h = [0u8; 20];
    h[0..2].copy_from_slice(&sll[2..4]);
    let ifindex = u32::from_ne_bytes([sll[4], sll[5], sll[6], sll[7]]);
    h[4..8].copy_from_slice(&ifindex.to_be_bytes());
    let hatype = u16::from_ne_bytes([sll[8], sll[9]]);
    h[8..10].copy_from_slice(&hatype.to_be_bytes());
    h[10..20].copy_from_slice(&sll[10..20]);
    Some(h)
}

/// What a sink tells the source after each packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now without taking this packet: ring modes leave it (and all
    /// later ones) in the ring; `recv` has already read it, so a sink that
    /// stops there must account for it.
    Stop,
}

/// How long the xdp mode lets frames gather after a batch of fewer than
/// [`XDP_COALESCE_BELOW`]: at most 5,000 wake-ups a second, and a ring of
/// 1,024 buffers of 2 KiB (`-B 2048`) holds 200 µs of traffic up to 5 Mpps.
pub const XDP_COALESCE: Duration = Duration::from_micros(200);
pub const XDP_COALESCE_BELOW: usize = 64;

const TPACKET_V2: libc::c_int = 1;
const TPACKET_V3: libc::c_int = 2;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_KERNEL: u32 = 0;
const ETH_P_ALL: u16 = 0x0003;
/// TPACKET2_HDRLEN: aligned tpacket2_hdr plus sockaddr_ll.
const TPACKET2_HDRLEN: u32 = 32 + 20;
const PAGE: u32 = 4096;

fn align16(x: u32) -> u32 {
    (x + 15) & !15
}

/// Frame size for a V2 ring: header area (where the kernel puts the MAC
/// header, see `tpacket_rcv`) plus the largest packet we keep.
pub fn v2_frame_size(snaplen: u32, mtu: u32) -> u32 {
    // Ethernet header plus a VLAN tag on top of the MTU.
    let keep = snaplen.min(mtu.saturating_add(18)).max(64);
    align16(align16(TPACKET2_HDRLEN + 16) + keep)
}

/// A capture source in one of the modes.
#[derive(Debug)]
pub struct Source {
    sock: PacketSocket,
    mode: Mode,
    inner: Inner,
    stats: KernelStats,
    /// Frames whose header did not fit the ring or block: never produced by
    /// a correct kernel, counted so a loss can never be silent.
    pub malformed: u64,
    /// Packets cut shorter than the snaplen because a v2 frame was too small
    /// (e.g. GRO-merged packets larger than the MTU): kept, but reported.
    pub truncated: u64,
    snaplen: u32,
    retire_ms: u32,
    /// `-i any`: packets get a cooked header from their socket address.
    cooked: bool,
}

enum Inner {
    Recv {
        buf: Vec<u8>,
        timeout: Duration,
    },
    V2 {
        ring: Ring,
        frame_size: usize,
        frames_per_block: usize,
        block_size: usize,
        frame_nr: usize,
        next: usize,
    },
    V3 {
        ring: Ring,
        block_size: usize,
        block_nr: usize,
        block: usize,
        /// Position inside the current block when a sink stopped mid-block:
        /// (packets left, offset of the next packet).
        cursor: Option<(u32, usize)>,
    },
    Xdp {
        xsk: XskSocket,
        prog: Arc<Mutex<XdpProgram>>,
        queue: u32,
        filter: Option<pcap::BpfProgram>,
        /// Frames the filter rejected.
        rejected: u64,
        /// CLOCK_TAI less CLOCK_REALTIME, to turn the program's stamps into
        /// wall-clock time.
        tai_minus_real: i64,
        /// Frames the previous call took (see [`XDP_COALESCE`]).
        last_batch: usize,
    },
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Inner::Recv { .. } => "Recv",
            Inner::V2 { .. } => "V2",
            Inner::V3 { .. } => "V3",
            Inner::Xdp { .. } => "Xdp",
        };
        f.write_str(name)
    }
}

impl Source {
    /// Opens, configures and binds one socket. Packets are queued from the
    /// moment this returns.
    pub fn open(mode: Mode, cfg: &SourceConfig) -> Result<Source> {
        if mode == Mode::Xdp {
            return Err(CaptureError::Config(
                "the xdp mode opens its sockets with Source::open_xdp (one per receive queue)".into(),
            ));
        }
        let sock = PacketSocket::open(cfg.cooked).map_err(CaptureError::from_sys)?;
        sock.attach_filter(&cfg.filter).map_err(CaptureError::from_sys)?;
        if cfg.inbound_only {
            sock.ignore_outgoing().map_err(CaptureError::from_sys)?;
        }
        let inner = match mode {
            Mode::Recv => {
                let timeout = Duration::from_millis(100);
                sock.set_rcvbuf(cfg.ring.buffer_bytes.min(i32::MAX as u64) as libc::c_int)
                    .map_err(CaptureError::from_sys)?;
                sock.set_rcvtimeo(timeout).map_err(CaptureError::from_sys)?;
                sock.enable_timestamp_ns().map_err(CaptureError::from_sys)?;
                sock.enable_auxdata().map_err(CaptureError::from_sys)?;
                Inner::Recv {
                    buf: vec![0u8; cfg.snaplen.max(64) as usize],
                    timeout,
                }
            }
            Mode::V2 => {
                sock.set_version(TPACKET_V2).map_err(CaptureError::from_sys)?;
                let frame_size = v2_frame_size(cfg.snaplen, cfg.mtu);
                // Blocks of whole pages holding at least one frame.
                let block_size = frame_size.div_ceil(PAGE) * PAGE;
                let block_size = block_size.max(64 << 10).div_ceil(frame_size) * frame_size;
                let block_size = block_size.div_ceil(PAGE) * PAGE;
                let block_nr = block_count(cfg.ring.buffer_bytes, u64::from(block_size));
                sock.set_rx_ring_v2(block_size, block_nr, frame_size)
                    .map_err(|source| ring_err("v2", block_size, block_nr, frame_size, source))?;
                let ring = sock
                    .mmap_ring(block_size as usize * block_nr as usize)
                    .map_err(|source| ring_err("v2", block_size, block_nr, frame_size, source))?;
                let fpb = (block_size / frame_size) as usize;
                Inner::V2 {
                    ring,
                    frame_size: frame_size as usize,
                    frames_per_block: fpb,
                    block_size: block_size as usize,
                    frame_nr: fpb * block_nr as usize,
                    next: 0,
                }
            }
            Mode::V3 => {
                sock.set_version(TPACKET_V3).map_err(CaptureError::from_sys)?;
                let frame_size = v2_frame_size(cfg.snaplen, cfg.mtu);
                let block_size = v3_block_size(cfg.ring.buffer_bytes, cfg.ring.block_size)
                    .max(u64::from(frame_size))
                    .div_ceil(u64::from(PAGE))
                    * u64::from(PAGE);
                let block_size = u32::try_from(block_size).map_err(|_| {
                    CaptureError::Config(format!(
                        "block size {block_size} bytes is over the kernel's 4 GiB limit"
                    ))
                })?;
                let block_nr = block_count(cfg.ring.buffer_bytes, u64::from(block_size));
                sock.set_rx_ring_v3(block_size, block_nr, frame_size, cfg.ring.block_timeout_ms.max(1))
                    .map_err(|source| ring_err("v3", block_size, block_nr, frame_size, source))?;
                let ring = sock
                    .mmap_ring(block_size as usize * block_nr as usize)
                    .map_err(|source| ring_err("v3", block_size, block_nr, frame_size, source))?;
                Inner::V3 {
                    ring,
                    block_size: block_size as usize,
                    block_nr: block_nr as usize,
                    block: 0,
                    cursor: None,
                }
            }
            Mode::Xdp => unreachable!("rejected above"),
        };
        sock.bind(cfg.ifindex, ETH_P_ALL).map_err(CaptureError::from_sys)?;
        // Not on `any` (index 0): there is no one device to make promiscuous.
        if cfg.promiscuous && cfg.ifindex != 0 {
            sock.promiscuous(cfg.ifindex).map_err(CaptureError::from_sys)?;
        }
        if let Some(group) = cfg.fanout {
            // Hash by flow, defragmenting first so all fragments of a datagram
            // land on the same socket.
            sock.join_fanout(group, libc::PACKET_FANOUT_HASH, libc::PACKET_FANOUT_FLAG_DEFRAG)
                .map_err(CaptureError::from_sys)?;
        }
        Ok(Source {
            sock,
            mode,
            inner,
            stats: KernelStats::default(),
            malformed: 0,
            truncated: 0,
            snaplen: cfg.snaplen,
            retire_ms: if mode == Mode::V3 {
                cfg.ring.block_timeout_ms.max(1)
            } else {
                0
            },
            cooked: cfg.cooked,
        })
    }

    /// Opens the AF_XDP socket of receive queue `queue` and puts it in
    /// `prog`'s map (attaching the program is the caller's last step). The
    /// packet socket opened beside it receives nothing; it holds the
    /// promiscuous membership, so the device delivers frames for other
    /// hosts too, undone when it closes.
    pub fn open_xdp(cfg: &SourceConfig, queue: u32, prog: &Arc<Mutex<XdpProgram>>) -> Result<Source> {
        let sock = PacketSocket::open(false).map_err(CaptureError::from_sys)?;
        if cfg.promiscuous {
            sock.promiscuous(cfg.ifindex).map_err(CaptureError::from_sys)?;
        }
        // One frame per buffer (multi-buffer frames are not handled).
        let chunk = xdp::chunk_for_mtu(cfg.mtu).ok_or_else(|| {
            CaptureError::Config(format!(
                "the xdp mode keeps a frame in one buffer of at most 4096 bytes (3840 after the kernel's \
                 headroom); an MTU of {} does not fit: use v3, or lower the MTU",
                cfg.mtu
            ))
        })?;
        let frames = (cfg.ring.buffer_bytes / u64::from(chunk))
            .clamp(64, 1 << 20)
            .next_power_of_two() as u32;
        let xsk =
            XskSocket::open(cfg.ifindex, queue, frames, chunk, false).map_err(|e| CaptureError::ModeUnsupported {
                mode: "xdp",
                reason: format!("cannot open an AF_XDP socket on queue {queue}: {e}"),
            })?;
        let filter = match &cfg.filter_expr {
            Some(expr) if !expr.trim().is_empty() => Some(crate::filter::compile_user(expr, cfg.link)?),
            _ => None,
        };
        prog.lock()
            .map_err(|_| CaptureError::Config("the XDP program's lock was poisoned".into()))?
            .register(queue, &xsk)?;
        Ok(Source {
            sock,
            mode: Mode::Xdp,
            inner: Inner::Xdp {
                xsk,
                prog: Arc::clone(prog),
                queue,
                filter,
                rejected: 0,
                tai_minus_real: xdp::tai_minus_real_ns(),
                last_batch: 0,
            },
            stats: KernelStats::default(),
            malformed: 0,
            truncated: 0,
            snaplen: cfg.snaplen,
            retire_ms: 0,
            cooked: false,
        })
    }

    /// How an `xdp` source's socket is bound (zero-copy or copy).
    pub fn xdp_bind_mode(&self) -> Option<BindMode> {
        match &self.inner {
            Inner::Xdp { xsk, .. } => Some(xsk.bind_mode()),
            _ => None,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How long packets can sit in the socket before a reader can see them:
    /// a partly filled v3 block is handed over only at its retire timeout.
    pub fn visibility_delay(&self) -> Duration {
        Duration::from_millis(u64::from(self.retire_ms) + 10)
    }

    /// Cumulative kernel counters (reads and accumulates the kernel's
    /// reset-on-read values).
    pub fn kernel_stats(&mut self) -> Result<KernelStats> {
        if let Inner::Xdp {
            xsk,
            prog,
            queue,
            rejected,
            ..
        } = &self.inner
        {
            // Cumulative counters: the program's (frames seen, frames with
            // no socket) and the socket's (no free buffer, full ring). The
            // dropped frames were never filtered, so they count in full.
            let (seen, no_socket) = prog.lock().map_or((0, 0), |p| p.queue_counts(*queue));
            let st = xsk.stats().map_err(CaptureError::from_sys)?;
            let drops = no_socket + st.rx_dropped + st.rx_ring_full;
            self.stats = KernelStats {
                packets: seen.saturating_sub(*rejected),
                drops,
                freeze_q_cnt: 0,
            };
            return Ok(self.stats);
        }
        let RawStats {
            packets,
            drops,
            freeze_q_cnt,
        } = self.sock.stats(self.mode == Mode::V3).map_err(CaptureError::from_sys)?;
        self.stats.add(&KernelStats {
            packets,
            drops,
            freeze_q_cnt,
        });
        Ok(self.stats)
    }

    /// Waits up to `timeout` for packets and hands every ready one to
    /// `sink`, until the sink says stop. Returns how many were handed over.
    pub fn next_batch(&mut self, timeout: Duration, sink: &mut dyn FnMut(&PacketView<'_>) -> Flow) -> Result<usize> {
        match &mut self.inner {
            Inner::Xdp {
                xsk,
                filter,
                rejected,
                tai_minus_real,
                last_batch,
                ..
            } => {
                // AF_XDP wakes a sleeping reader for every frame; under a
                // steady stream that is v2's wake-up per packet. After a
                // small batch, let frames gather for a moment instead (the
                // role of v3's block): a bounded delay, never a loss while
                // the ring holds that moment's traffic.
                if (1..XDP_COALESCE_BELOW).contains(last_batch) {
                    std::thread::sleep(XDP_COALESCE);
                }
                if !xsk.rx_ready() && !xsk.poll_in(timeout).map_err(CaptureError::from_sys)? {
                    *last_batch = 0;
                    return Ok(0);
                }
                // One clock read per batch for frames the program could not stamp.
                let now = oskit::clock::realtime_ns();
                let snaplen = self.snaplen as usize;
                let mut n = 0usize;
                let invalid = xsk.receive(xdp::META_LEN, &mut |meta, frame| {
                    if let Some(f) = filter.as_ref() {
                        if !f.filter(frame) {
                            *rejected += 1;
                            return true;
                        }
                    }
                    let p = PacketView {
                        ts_ns: xdp::meta_time(meta, *tai_minus_real).unwrap_or(now),
                        wire_len: frame.len() as u32,
                        data: &frame[..frame.len().min(snaplen)],
                        vlan: None,
                        cooked: None,
                    };
                    if sink(&p) == Flow::Stop {
                        return false;
                    }
                    n += 1;
                    true
                });
                self.malformed += invalid;
                *last_batch = n;
                Ok(n)
            }
            Inner::Recv { buf, timeout: cur } => {
                if *cur != timeout {
                    self.sock
                        .set_rcvtimeo(timeout.max(Duration::from_millis(1)))
                        .map_err(CaptureError::from_sys)?;
                    *cur = timeout;
                }
                match self.sock.recv_one(buf).map_err(CaptureError::from_sys)? {
                    None => Ok(0),
                    Some(r) => {
                        let ts = if r.ts_ns == 0 {
                            oskit::clock::realtime_ns()
                        } else {
                            r.ts_ns
                        };
                        let p = PacketView {
                            ts_ns: ts,
                            wire_len: r.wire as u32,
                            data: &buf[..r.len],
                            vlan: r.vlan,
                            cooked: if self.cooked { sll2_from_sockaddr(&r.addr) } else { None },
                        };
                        Ok(usize::from(sink(&p) == Flow::Continue))
                    }
                }
            }
            Inner::V2 {
                ring,
                frame_size,
                frames_per_block,
                block_size,
                frame_nr,
                next,
            } => {
                let mut n = 0usize;
                let mut polled = false;
                loop {
                    let off = (*next / *frames_per_block) * *block_size + (*next % *frames_per_block) * *frame_size;
                    let status = ring.load_status(off);
                    if status & TP_STATUS_USER == 0 {
                        if n > 0 || polled {
                            return Ok(n);
                        }
                        // The libpcap-1.0 pattern: a poll() whenever the next slot is empty.
                        polled = true;
                        if !self.sock.poll_in(timeout).map_err(CaptureError::from_sys)? {
                            return Ok(0);
                        }
                        continue;
                    }
                    let wire = ring.read_u32(off + 4);
                    let snap = ring.read_u32(off + 8) as usize;
                    let mac = ring.read_u16(off + 12) as usize;
                    let ts = u64::from(ring.read_u32(off + 16)) * 1_000_000_000 + u64::from(ring.read_u32(off + 20));
                    let vlan = vlan_of(status, ring.read_u16(off + 24), ring.read_u16(off + 26));
                    // The sockaddr_ll follows the (aligned) tpacket2_hdr.
                    let cooked = if self.cooked {
                        ring.bytes(off + 32, 20).and_then(sll2_from_sockaddr)
                    } else {
                        None
                    };
                    let data = if mac + snap <= *frame_size {
                        ring.bytes(off + mac, snap)
                    } else {
                        None
                    };
                    match data {
                        Some(data) => {
                            let p = PacketView {
                                ts_ns: ts,
                                wire_len: wire,
                                data,
                                vlan,
                                cooked,
                            };
                            if sink(&p) == Flow::Stop {
                                // Not taken: the frame stays in the ring.
                                return Ok(n);
                            }
                            n += 1;
                            if (snap as u32) < wire.min(self.snaplen) {
                                self.truncated += 1;
                            }
                        }
                        None => self.malformed += 1,
                    }
                    ring.store_status(off, TP_STATUS_KERNEL);
                    *next = (*next + 1) % *frame_nr;
                }
            }
            Inner::V3 {
                ring,
                block_size,
                block_nr,
                block,
                cursor,
            } => {
                let mut n = 0usize;
                let mut polled = false;
                loop {
                    let b_off = *block * *block_size;
                    let status = ring.load_status(b_off + 8);
                    if status & TP_STATUS_USER == 0 {
                        if n > 0 || polled {
                            return Ok(n);
                        }
                        polled = true;
                        if !self.sock.poll_in(timeout).map_err(CaptureError::from_sys)? {
                            return Ok(0);
                        }
                        continue;
                    }
                    let start = cursor.take();
                    let end = walk_block(
                        ring,
                        b_off,
                        *block_size,
                        start,
                        self.snaplen,
                        self.cooked,
                        &mut self.malformed,
                        &mut self.truncated,
                        &mut n,
                        sink,
                    );
                    if let Some(resume) = end {
                        // The sink declined a packet: resume at it next time.
                        *cursor = Some(resume);
                        return Ok(n);
                    }
                    ring.store_status(b_off + 8, TP_STATUS_KERNEL);
                    *block = (*block + 1) % *block_nr;
                }
            }
        }
    }
}

/// Walks the packets of one v3 block (from its first packet, or from
/// `start` = (packets left, offset) after a sink declined one). Every header
/// field comes from memory the kernel writes, so all of them are checked
/// against the block before use. Returns where to resume if the sink stopped.
#[allow(clippy::too_many_arguments)]
fn walk_block(
    ring: &Ring,
    b_off: usize,
    block_size: usize,
    start: Option<(u32, usize)>,
    snaplen: u32,
    cooked: bool,
    malformed: &mut u64,
    truncated: &mut u64,
    n: &mut usize,
    sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
) -> Option<(u32, usize)> {
    let (mut left, mut p_rel) =
        start.unwrap_or_else(|| (ring.read_u32(b_off + 12), ring.read_u32(b_off + 16) as usize));
    while left > 0 {
        // Everything must stay inside this block.
        if p_rel.saturating_add(48) > block_size {
            *malformed += u64::from(left);
            return None;
        }
        let p = b_off + p_rel;
        let next_off = ring.read_u32(p) as usize;
        let ts = u64::from(ring.read_u32(p + 4)) * 1_000_000_000 + u64::from(ring.read_u32(p + 8));
        let snap = ring.read_u32(p + 12) as usize;
        let wire = ring.read_u32(p + 16);
        let pstatus = ring.read_u32(p + 20);
        let mac = ring.read_u16(p + 24) as usize;
        let vlan = vlan_of(pstatus, ring.read_u32(p + 32) as u16, ring.read_u16(p + 36));
        // The sockaddr_ll follows the (aligned) tpacket3_hdr.
        let cooked = if cooked && p_rel + 48 + 20 <= block_size {
            ring.bytes(p + 48, 20).and_then(sll2_from_sockaddr)
        } else {
            None
        };
        let inside = p_rel + mac + snap <= block_size;
        match inside.then(|| ring.bytes(p + mac, snap)).flatten() {
            Some(data) => {
                let pv = PacketView {
                    ts_ns: ts,
                    wire_len: wire,
                    data,
                    vlan,
                    cooked,
                };
                if sink(&pv) == Flow::Stop {
                    return Some((left, p_rel));
                }
                *n += 1;
                if (snap as u32) < wire.min(snaplen) {
                    *truncated += 1;
                }
            }
            None => {
                // A block we cannot walk: count what is left as malformed.
                *malformed += u64::from(left);
                return None;
            }
        }
        left -= 1;
        if left > 0 && next_off == 0 {
            *malformed += u64::from(left);
            return None;
        }
        p_rel += next_off;
    }
    None
}

/// Blocks of `block_size` in a ring of about `buffer` bytes: at least one;
/// too many is left for the kernel to refuse (it checks the total).
fn block_count(buffer: u64, block_size: u64) -> u32 {
    (buffer / block_size.max(1)).clamp(1, u64::from(u32::MAX)) as u32
}

fn ring_err(
    mode: &'static str,
    block_size: u32,
    block_count: u32,
    frame_size: u32,
    source: sys::SysError,
) -> CaptureError {
    if matches!(source.errno(), Some(libc::EPERM) | Some(libc::EACCES)) {
        return CaptureError::NeedsRoot { call: source.call };
    }
    CaptureError::RingRefused {
        mode,
        block_size,
        block_count,
        frame_size,
        source,
    }
}

/// Probes which modes this kernel and these privileges allow, by opening a
/// small unbound socket of each kind.
pub fn probe() -> Vec<(Mode, Support)> {
    probe_modes(&Mode::ALL)
}

/// Probes the given modes only. Probing `xdp` loads its program through
/// the verifier, tens of milliseconds of CPU, so a capture probes it only
/// when asked for it.
pub fn probe_modes(modes: &[Mode]) -> Vec<(Mode, Support)> {
    modes.iter().map(|&m| (m, probe_mode(m))).collect()
}

fn probe_mode(mode: Mode) -> Support {
    let unsupported = |e: sys::SysError| {
        let e = CaptureError::from_sys(e);
        Support::Unsupported(e.to_string())
    };
    if mode == Mode::Xdp {
        // The program through the verifier, and a socket with its UMEM.
        if let Err(e) = XdpProgram::load() {
            return Support::Unsupported(e.to_string());
        }
        return match XskSocket::probe() {
            Ok(()) => Support::Supported,
            Err(e) => unsupported(e),
        };
    }
    let sock = match PacketSocket::open(false) {
        Ok(s) => s,
        Err(e) => return unsupported(e),
    };
    let (version, v3) = match mode {
        Mode::Recv => return Support::Supported,
        Mode::V2 => (TPACKET_V2, false),
        _ => (TPACKET_V3, true),
    };
    if let Err(e) = sock.set_version(version) {
        return unsupported(e);
    }
    let r = if v3 {
        sock.set_rx_ring_v3(PAGE, 1, 2048, 1)
    } else {
        sock.set_rx_ring_v2(PAGE, 1, 2048)
    };
    match r {
        Ok(()) => Support::Supported,
        Err(e) => unsupported(e),
    }
}

/// The best mode the probe allows (v3, then v2, then recv).
pub fn best_mode(probed: &[(Mode, Support)]) -> Option<Mode> {
    [Mode::V3, Mode::V2, Mode::Recv]
        .into_iter()
        .find(|m| probed.iter().any(|(pm, s)| pm == m && *s == Support::Supported))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_v3_blocks_give_every_ring_at_least_eight() {
        assert_eq!(v3_block_size(8 << 20, None), 512 << 10); // the default: 16 blocks
        assert_eq!(v3_block_size(2 << 20, None), 256 << 10); // tcpdump's default ring, libpcap's block
        assert_eq!(v3_block_size(1 << 20, None), 128 << 10); // -B 1024: 8 blocks, not 2
        assert_eq!(v3_block_size(3 << 20, None), 256 << 10); // 12 blocks
        assert_eq!(v3_block_size(64 << 20, None), 512 << 10);
        assert_eq!(v3_block_size(16 << 10, None), 4 << 10); // one page at the least
        assert_eq!(v3_block_size(1 << 20, Some(512 << 10)), 512 << 10);
        for kib in 4..20_000u64 {
            let b = v3_block_size(kib << 10, None);
            assert!(b.is_power_of_two() && b >= 4096);
            assert!((kib << 10) / b >= MIN_V3_BLOCKS || b == 4096, "{kib} KiB");
        }
        let warn = |buffer, block| {
            ring_warning(&RingConfig {
                buffer_bytes: buffer,
                block_size: block,
                block_timeout_ms: 20,
            })
        };
        assert!(warn(1 << 20, Some(512 << 10)).unwrap().contains("2 block(s)"));
        assert!(warn(1 << 20, Some(128 << 10)).is_none());
        assert!(warn(1 << 20, None).is_none());
    }

    #[test]
    fn cooked_header_from_a_socket_address() {
        // sockaddr_ll as the kernel lays it out (host order where it is).
        let mut sll = [0u8; 20];
        sll[0..2].copy_from_slice(&17u16.to_ne_bytes()); // AF_PACKET
        sll[2..4].copy_from_slice(&[0x08, 0x00]); // IPv4, network order
        sll[4..8].copy_from_slice(&7u32.to_ne_bytes()); // ifindex
        sll[8..10].copy_from_slice(&1u16.to_ne_bytes()); // ARPHRD_ETHER
        sll[10] = 4; // PACKET_OUTGOING
        sll[11] = 6;
        sll[12..18].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        let h = sll2_from_sockaddr(&sll).unwrap();
        assert_eq!(&h[0..4], &[0x08, 0x00, 0, 0], "protocol, reserved");
        assert_eq!(&h[4..8], &[0, 0, 0, 7], "ifindex big-endian");
        assert_eq!(&h[8..10], &[0, 1], "hardware type big-endian");
        assert_eq!(&h[10..18], &[4, 6, 2, 0, 0, 0, 0, 9]);
        assert_eq!(sll2_from_sockaddr(&sll[..19]), None);
    }

    #[test]
    fn mode_names_round_trip() {
        for m in Mode::ALL {
            assert_eq!(m.name().parse::<Mode>(), Ok(m));
        }
        assert!("v4".parse::<Mode>().is_err());
    }

    #[test]
    fn v2_frames_hold_a_full_ethernet_frame() {
        let f = v2_frame_size(262144, 1500);
        assert_eq!(f % 16, 0);
        assert!(f >= 80 + 1518 - 14);
        assert_eq!(v2_frame_size(96, 1500), align16(80 + 96));
    }

    #[test]
    fn best_mode_prefers_v3() {
        let p = vec![
            (Mode::Recv, Support::Supported),
            (Mode::V2, Support::Supported),
            (Mode::V3, Support::Unsupported("x".into())),
        ];
        assert_eq!(best_mode(&p), Some(Mode::V2));
        assert_eq!(best_mode(&[]), None);
    }

    /// Packets, malformed count, truncated count, resume point.
    type Walk = (Vec<Vec<u8>>, u64, u64, Option<(u32, usize)>);

    /// Writes a v3 packet header + data at `off` of a block.
    fn put_pkt(ring: &mut Ring, off: usize, next: u32, data: &[u8], wire: u32) {
        ring.write_u32(off, next);
        ring.write_u32(off + 4, 7); // sec
        ring.write_u32(off + 8, 9); // nsec
        ring.write_u32(off + 12, data.len() as u32);
        ring.write_u32(off + 16, wire);
        ring.write_u32(off + 20, TP_STATUS_USER);
        let mac: u16 = 64;
        ring.bytes_mut(off + 24, 2)
            .expect("in ring")
            .copy_from_slice(&mac.to_ne_bytes());
        ring.bytes_mut(off + 64, data.len())
            .expect("in ring")
            .copy_from_slice(data);
    }

    fn walk_all(ring: &Ring, start: Option<(u32, usize)>, stop_after: usize) -> Walk {
        let (mut mal, mut tr, mut n) = (0, 0, 0);
        let mut got = Vec::new();
        let end = walk_block(
            ring,
            0,
            4096,
            start,
            65535,
            false,
            &mut mal,
            &mut tr,
            &mut n,
            &mut |p| {
                if got.len() == stop_after {
                    return Flow::Stop;
                }
                got.push(p.data.to_vec());
                Flow::Continue
            },
        );
        assert_eq!(n, got.len());
        (got, mal, tr, end)
    }

    #[test]
    fn v3_block_walk_extracts_packets_and_resumes() {
        let mut ring = Ring::anonymous(4096).expect("anonymous mapping");
        ring.write_u32(12, 3); // num_pkts
        ring.write_u32(16, 48); // offset to first packet
        put_pkt(&mut ring, 48, 128, b"first", 5);
        put_pkt(&mut ring, 176, 128, b"second!", 100);
        put_pkt(&mut ring, 304, 0, b"3", 1);
        let (got, mal, tr, end) = walk_all(&ring, None, usize::MAX);
        assert_eq!(got, vec![b"first".to_vec(), b"second!".to_vec(), b"3".to_vec()]);
        assert_eq!((mal, tr, end), (0, 1, None));
        // A sink that stops after one packet resumes at the second.
        let (got, _, _, end) = walk_all(&ring, None, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(end, Some((2, 176)));
        let (got, _, _, end) = walk_all(&ring, end, usize::MAX);
        assert_eq!(got, vec![b"second!".to_vec(), b"3".to_vec()]);
        assert_eq!(end, None);
    }

    #[test]
    fn v3_block_walk_survives_garbage() {
        let mut ring = Ring::anonymous(4096).expect("anonymous mapping");
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        for round in 0..3000 {
            let b = ring.bytes_mut(0, 4096).expect("whole ring");
            for chunk in b.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let v = if round % 2 == 0 { x % 512 } else { x };
                chunk.copy_from_slice(&v.to_ne_bytes()[..chunk.len()]);
            }
            let (got, mal, _, _) = walk_all(&ring, None, usize::MAX);
            // Whatever the headers say, the walk ends and stays in the block.
            assert!(got.iter().all(|g| g.len() <= 4096));
            let _ = mal;
        }
    }
}
