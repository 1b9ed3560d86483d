//! The `v3` mode: a TPACKET_V3 ring of blocks; the kernel hands over a block
//! when it is full or when the retire timeout expires — the paper's "signal
//! when N packets are ready or m µs have passed", with N set by the block
//! size.

use std::time::Duration;

use super::packet_socket::{
    self, block_count, cut_by_slot, ring_err, ring_time_ns, v2_frame_size, BoundSocket, PAGE, TPACKET_V3,
    TP_STATUS_KERNEL, TP_STATUS_USER,
};
use super::{
    sll2_from_sockaddr, CaptureMode, CaptureSource, Flow, KernelStats, OwnCounts, PacketView, RingConfig, SourceConfig,
    Support,
};
use crate::error::{CaptureError, Result};
use crate::sys::Ring;
use crate::vlan::vlan_of;

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

/// A TPACKET_V3 ring read block by block.
pub(super) struct BlockRing {
    socket: BoundSocket,
    ring: Ring,
    block_size: usize,
    block_nr: usize,
    /// The block to read next (or being read).
    block: usize,
    /// Position inside the current block when a sink stopped mid-block:
    /// (packets left, offset of the next packet).
    cursor: Option<(u32, usize)>,
    snaplen: u32,
    /// The retire timeout in ms: how long a partly filled block can wait
    /// before the kernel hands it over.
    retire_ms: u32,
    /// `-i any`: packets get a cooked header from their socket address.
    cooked: bool,
}

pub(super) fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
    let (socket, (ring, block_size, block_nr)) = BoundSocket::open(cfg, true, |sock| {
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
        Ok((ring, block_size, block_nr))
    })?;
    Ok(Box::new(BlockRing {
        socket,
        ring,
        block_size: block_size as usize,
        block_nr: block_nr as usize,
        block: 0,
        cursor: None,
        snaplen: cfg.snaplen,
        retire_ms: cfg.ring.block_timeout_ms.max(1),
        cooked: cfg.cooked,
    }))
}

/// A one-block V3 ring on an unbound socket.
pub(super) fn probe() -> Support {
    packet_socket::probe(|sock| {
        sock.set_version(TPACKET_V3)?;
        sock.set_rx_ring_v3(PAGE, 1, 2048, 1)
    })
}

impl CaptureMode for BlockRing {
    const NAME: &'static str = "v3";
    /// The first default: one wake-up per block.
    const DEFAULT_RANK: Option<u8> = Some(0);

    fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
        open(cfg)
    }

    fn probe() -> Support {
        probe()
    }
}

impl CaptureSource for BlockRing {
    fn next_batch(
        &mut self,
        timeout: Duration,
        own: &mut OwnCounts,
        sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
    ) -> Result<usize> {
        let mut n = 0usize;
        let mut polled = false;
        loop {
            let b_off = self.block * self.block_size;
            let status = self.ring.load_status(b_off + 8);
            if status & TP_STATUS_USER == 0 {
                match self.socket.wait_for_kernel(timeout, n, &mut polled)? {
                    Some(n) => return Ok(n),
                    None => continue,
                }
            }
            let start = self.cursor.take();
            let end = walk_block(
                &self.ring,
                b_off,
                self.block_size,
                start,
                self.snaplen,
                self.cooked,
                &mut own.malformed,
                &mut own.truncated,
                &mut n,
                sink,
            );
            if let Some(resume) = end {
                // The sink declined a packet: resume at it next time.
                self.cursor = Some(resume);
                return Ok(n);
            }
            self.ring.store_status(b_off + 8, TP_STATUS_KERNEL);
            self.block = (self.block + 1) % self.block_nr;
        }
    }

    fn kernel_stats(&mut self) -> Result<KernelStats> {
        self.socket.kernel_stats()
    }

    fn hand_over_ms(&self) -> u32 {
        self.retire_ms
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
        let ts = ring_time_ns(ring.read_u32(p + 4), ring.read_u32(p + 8));
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
                if cut_by_slot(snap, wire, snaplen) {
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
