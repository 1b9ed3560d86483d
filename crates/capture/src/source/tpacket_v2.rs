//! The `v2` mode: a TPACKET_V2 ring of fixed-size frames; when the next
//! frame is still the kernel's, one `poll()` — the per-packet wake-up of
//! libpcap 1.0 that the paper identifies as the bottleneck.

use std::time::Duration;

use super::packet_socket::{
    self, block_count, cut_by_slot, ring_err, ring_time_ns, v2_frame_size, BoundSocket, PAGE, TPACKET_V2,
    TP_STATUS_KERNEL, TP_STATUS_USER,
};
use super::{
    sll2_from_sockaddr, CaptureMode, CaptureSource, Flow, KernelStats, OwnCounts, PacketView, SourceConfig, Support,
};
use crate::error::{CaptureError, Result};
use crate::sys::Ring;
use crate::vlan::vlan_of;

/// A TPACKET_V2 ring read frame by frame.
pub(super) struct FrameRing {
    socket: BoundSocket,
    ring: Ring,
    frame_size: usize,
    frames_per_block: usize,
    block_size: usize,
    frame_nr: usize,
    /// The next frame to read.
    next: usize,
    snaplen: u32,
    /// `-i any`: packets get a cooked header from their socket address.
    cooked: bool,
}

pub(super) fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
    let (socket, (ring, frame_size, block_size, block_nr)) = BoundSocket::open(cfg, false, |sock| {
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
        Ok((ring, frame_size, block_size, block_nr))
    })?;
    let fpb = (block_size / frame_size) as usize;
    Ok(Box::new(FrameRing {
        socket,
        ring,
        frame_size: frame_size as usize,
        frames_per_block: fpb,
        block_size: block_size as usize,
        frame_nr: fpb * block_nr as usize,
        next: 0,
        snaplen: cfg.snaplen,
        cooked: cfg.cooked,
    }))
}

/// A small V2 ring on an unbound socket.
pub(super) fn probe() -> Support {
    packet_socket::probe(|sock| {
        sock.set_version(TPACKET_V2)?;
        sock.set_rx_ring_v2(PAGE, 1, 2048)
    })
}

impl CaptureMode for FrameRing {
    const NAME: &'static str = "v2";
    /// The second default.
    const DEFAULT_RANK: Option<u8> = Some(1);

    fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
        open(cfg)
    }

    fn probe() -> Support {
        probe()
    }
}

impl CaptureSource for FrameRing {
    fn next_batch(
        &mut self,
        timeout: Duration,
        own: &mut OwnCounts,
        sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
    ) -> Result<usize> {
        let ring = &self.ring;
        let mut n = 0usize;
        let mut polled = false;
        loop {
            let off = (self.next / self.frames_per_block) * self.block_size
                + (self.next % self.frames_per_block) * self.frame_size;
            let status = ring.load_status(off);
            if status & TP_STATUS_USER == 0 {
                // The libpcap-1.0 pattern: a poll() whenever the next slot is empty.
                match self.socket.wait_for_kernel(timeout, n, &mut polled)? {
                    Some(n) => return Ok(n),
                    None => continue,
                }
            }
            let wire = ring.read_u32(off + 4);
            let snap = ring.read_u32(off + 8) as usize;
            let mac = ring.read_u16(off + 12) as usize;
            let ts = ring_time_ns(ring.read_u32(off + 16), ring.read_u32(off + 20));
            let vlan = vlan_of(status, ring.read_u16(off + 24), ring.read_u16(off + 26));
            // The sockaddr_ll follows the (aligned) tpacket2_hdr.
            let cooked = if self.cooked {
                ring.bytes(off + 32, 20).and_then(sll2_from_sockaddr)
            } else {
                None
            };
            let data = if mac + snap <= self.frame_size {
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
                    if cut_by_slot(snap, wire, self.snaplen) {
                        own.truncated += 1;
                    }
                }
                None => own.malformed += 1,
            }
            ring.store_status(off, TP_STATUS_KERNEL);
            self.next = (self.next + 1) % self.frame_nr;
        }
    }

    fn kernel_stats(&mut self) -> Result<KernelStats> {
        self.socket.kernel_stats()
    }
}
