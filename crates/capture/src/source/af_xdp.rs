//! The `xdp` mode: an AF_XDP socket per receive queue, fed by the XDP
//! program of [`crate::xdp`], which stamps each frame; the filter runs here,
//! in user space, on every frame.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{unsupported, CaptureMode, CaptureSource, Flow, KernelStats, OwnCounts, PacketView, SourceConfig, Support};
use crate::error::{CaptureError, Result};
use crate::sys::xsk::{BindMode, XskSocket};
use crate::sys::PacketSocket;
use crate::xdp::{self, XdpProgram};

/// How long the xdp mode lets frames gather after a batch of fewer than
/// [`XDP_COALESCE_BELOW`]: at most 5,000 wake-ups a second, and a ring of
/// 1,024 buffers of 2 KiB (`-B 2048`) holds 200 µs of traffic up to 5 Mpps.
pub const XDP_COALESCE: Duration = Duration::from_micros(200);
pub const XDP_COALESCE_BELOW: usize = 64;

/// The AF_XDP socket of one receive queue.
pub(super) struct XdpSource {
    /// Receives nothing; holds the promiscuous membership (see [`open`]).
    _promiscuous: PacketSocket,
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
    snaplen: u32,
}

/// The registry's constructor: the xdp mode's sockets are one per receive
/// queue, in one program's map, so they are opened by [`open`] instead.
pub(super) fn open_one(_cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
    Err(CaptureError::Config(
        "the xdp mode opens its sockets with Source::open_xdp (one per receive queue)".into(),
    ))
}

/// Opens the AF_XDP socket of receive queue `queue` and puts it in
/// `prog`'s map (attaching the program is the caller's last step). The
/// packet socket opened beside it receives nothing; it holds the
/// promiscuous membership, so the device delivers frames for other
/// hosts too, undone when it closes.
pub(super) fn open(cfg: &SourceConfig, queue: u32, prog: &Arc<Mutex<XdpProgram>>) -> Result<Box<dyn CaptureSource>> {
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
    let xsk = XskSocket::open(cfg.ifindex, queue, frames, chunk, false).map_err(|e| CaptureError::ModeUnsupported {
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
    Ok(Box::new(XdpSource {
        _promiscuous: sock,
        xsk,
        prog: Arc::clone(prog),
        queue,
        filter,
        rejected: 0,
        tai_minus_real: xdp::tai_minus_real_ns(),
        last_batch: 0,
        snaplen: cfg.snaplen,
    }))
}

/// The program through the verifier, and a socket with its UMEM.
pub(super) fn probe() -> Support {
    if let Err(e) = XdpProgram::load() {
        return Support::Unsupported(e.to_string());
    }
    match XskSocket::probe() {
        Ok(()) => Support::Supported,
        Err(e) => unsupported(e),
    }
}

impl CaptureMode for XdpSource {
    const NAME: &'static str = "xdp";
    /// Only when asked: it takes the interface's frames away from the host's stack.
    const DEFAULT_RANK: Option<u8> = None;

    fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
        open_one(cfg)
    }

    fn probe() -> Support {
        probe()
    }
}

impl CaptureSource for XdpSource {
    fn next_batch(
        &mut self,
        timeout: Duration,
        own: &mut OwnCounts,
        sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
    ) -> Result<usize> {
        // AF_XDP wakes a sleeping reader for every frame; under a
        // steady stream that is v2's wake-up per packet. After a
        // small batch, let frames gather for a moment instead (the
        // role of v3's block): a bounded delay, never a loss while
        // the ring holds that moment's traffic.
        if (1..XDP_COALESCE_BELOW).contains(&self.last_batch) {
            std::thread::sleep(XDP_COALESCE);
        }
        if !self.xsk.rx_ready() && !self.xsk.poll_in(timeout).map_err(CaptureError::from_sys)? {
            self.last_batch = 0;
            return Ok(0);
        }
        // One clock read per batch for frames the program could not stamp.
        let now = oskit::clock::realtime_ns();
        let snaplen = self.snaplen as usize;
        let (filter, rejected, tai_minus_real) = (&self.filter, &mut self.rejected, self.tai_minus_real);
        let mut n = 0usize;
        let invalid = self.xsk.receive(xdp::META_LEN, &mut |meta, frame| {
            if let Some(f) = filter.as_ref() {
                if !f.filter(frame) {
                    *rejected += 1;
                    return true;
                }
            }
            let p = PacketView {
                ts_ns: xdp::meta_time(meta, tai_minus_real).unwrap_or(now),
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
        own.malformed += invalid;
        self.last_batch = n;
        Ok(n)
    }

    /// Cumulative counters: the program's (frames seen, frames with no
    /// socket) and the socket's (no free buffer, full ring). The dropped
    /// frames were never filtered, so they count in full.
    fn kernel_stats(&mut self) -> Result<KernelStats> {
        let (seen, no_socket) = self.prog.lock().map_or((0, 0), |p| p.queue_counts(self.queue));
        let st = self.xsk.stats().map_err(CaptureError::from_sys)?;
        let drops = no_socket + st.rx_dropped + st.rx_ring_full;
        Ok(KernelStats {
            packets: seen.saturating_sub(self.rejected),
            drops,
            freeze_q_cnt: 0,
        })
    }

    fn xdp_bind_mode(&self) -> Option<BindMode> {
        Some(self.xsk.bind_mode())
    }
}
