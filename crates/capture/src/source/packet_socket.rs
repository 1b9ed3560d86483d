//! What the three `AF_PACKET` modes (`recv`, `v2`, `v3`) share: opening a
//! packet socket in the one safe order (filter, then the mode's own set-up,
//! then `bind`, then the fanout group), the kernel's reset-on-read counters
//! kept as running totals, the ring constants and geometry helpers, and the
//! wait for a ring slot the kernel still holds.

use std::time::Duration;

use super::{unsupported, KernelStats, SourceConfig, Support};
use crate::error::{CaptureError, Result};
use crate::sys::{self, PacketSocket, RawStats};

pub(super) const TPACKET_V2: libc::c_int = 1;
pub(super) const TPACKET_V3: libc::c_int = 2;
pub(super) const TP_STATUS_USER: u32 = 1;
pub(super) const TP_STATUS_KERNEL: u32 = 0;
const ETH_P_ALL: u16 = 0x0003;
/// TPACKET2_HDRLEN: aligned tpacket2_hdr plus sockaddr_ll.
const TPACKET2_HDRLEN: u32 = 32 + 20;
pub(super) const PAGE: u32 = 4096;

pub(super) fn align16(x: u32) -> u32 {
    (x + 15) & !15
}

/// Frame size for a V2 ring: header area (where the kernel puts the MAC
/// header, see `tpacket_rcv`) plus the largest packet we keep.
pub fn v2_frame_size(snaplen: u32, mtu: u32) -> u32 {
    // Ethernet header plus a VLAN tag on top of the MTU.
    let keep = snaplen.min(mtu.saturating_add(18)).max(64);
    align16(align16(TPACKET2_HDRLEN + 16) + keep)
}

/// A ring timestamp (seconds and nanoseconds from a frame or packet
/// header) in ns since the epoch.
pub(super) fn ring_time_ns(sec: u32, nsec: u32) -> u64 {
    u64::from(sec) * 1_000_000_000 + u64::from(nsec)
}

/// Whether a packet that kept `snap` of its `wire` bytes was cut by its ring
/// slot rather than by the snaplen (counted as truncated).
pub(super) fn cut_by_slot(snap: usize, wire: u32, snaplen: u32) -> bool {
    (snap as u32) < wire.min(snaplen)
}

/// A bound packet socket and the running totals of its kernel counters.
#[derive(Debug)]
pub(super) struct BoundSocket {
    pub(super) sock: PacketSocket,
    stats: KernelStats,
    /// The socket is a TPACKET_V3 one (its statistics have another layout).
    v3: bool,
}

impl BoundSocket {
    /// Opens, configures and binds one socket; `setup` is the mode's own
    /// part (its ring, or its receive options), done after the filter and
    /// before `bind`, so no unfiltered packet queues up. Packets are queued
    /// from the moment this returns.
    pub(super) fn open<T>(
        cfg: &SourceConfig,
        v3: bool,
        setup: impl FnOnce(&PacketSocket) -> Result<T>,
    ) -> Result<(BoundSocket, T)> {
        let sock = PacketSocket::open(cfg.cooked).map_err(CaptureError::from_sys)?;
        sock.attach_filter(&cfg.filter).map_err(CaptureError::from_sys)?;
        if cfg.inbound_only {
            sock.ignore_outgoing().map_err(CaptureError::from_sys)?;
        }
        let mode_state = setup(&sock)?;
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
        let bound = BoundSocket {
            sock,
            stats: KernelStats::default(),
            v3,
        };
        Ok((bound, mode_state))
    }

    /// Cumulative kernel counters (reads and accumulates the kernel's
    /// reset-on-read values).
    pub(super) fn kernel_stats(&mut self) -> Result<KernelStats> {
        let RawStats {
            packets,
            drops,
            freeze_q_cnt,
        } = self.sock.stats(self.v3).map_err(CaptureError::from_sys)?;
        self.stats.add(&KernelStats {
            packets,
            drops,
            freeze_q_cnt,
        });
        Ok(self.stats)
    }

    /// For a ring reader whose next slot (frame or block) is still the
    /// kernel's: `Some(n)` ends the batch (it has taken packets, or has
    /// already waited once); `None` means packets may be ready after one
    /// wait of up to `timeout`, so look again.
    pub(super) fn wait_for_kernel(&self, timeout: Duration, n: usize, polled: &mut bool) -> Result<Option<usize>> {
        if n > 0 || *polled {
            return Ok(Some(n));
        }
        *polled = true;
        if !self.sock.poll_in(timeout).map_err(CaptureError::from_sys)? {
            return Ok(Some(0));
        }
        Ok(None)
    }
}

/// Probes a packet-socket mode by opening a small unbound socket and doing
/// the mode's set-up on it.
pub(super) fn probe(setup: impl FnOnce(&PacketSocket) -> sys::SysResult<()>) -> Support {
    let sock = match PacketSocket::open(false) {
        Ok(s) => s,
        Err(e) => return unsupported(e),
    };
    match setup(&sock) {
        Ok(()) => Support::Supported,
        Err(e) => unsupported(e),
    }
}

/// Blocks of `block_size` in a ring of about `buffer` bytes: at least one;
/// too many is left for the kernel to refuse (it checks the total).
pub(super) fn block_count(buffer: u64, block_size: u64) -> u32 {
    (buffer / block_size.max(1)).clamp(1, u64::from(u32::MAX)) as u32
}

pub(super) fn ring_err(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_frames_hold_a_full_ethernet_frame() {
        let f = v2_frame_size(262144, 1500);
        assert_eq!(f % 16, 0);
        assert!(f >= 80 + 1518 - 14);
        assert_eq!(v2_frame_size(96, 1500), align16(80 + 96));
    }
}
