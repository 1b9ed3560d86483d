//! The `recv` mode: one `recvmsg` per packet into a private buffer (a copy
//! per packet, a syscall per packet; the kernel's timestamp from
//! `SO_TIMESTAMPNS`, a stripped VLAN tag from `PACKET_AUXDATA`).

use std::time::Duration;

use super::packet_socket::{self, BoundSocket};
use super::{
    sll2_from_sockaddr, CaptureMode, CaptureSource, Flow, KernelStats, OwnCounts, PacketView, SourceConfig, Support,
};
use crate::error::{CaptureError, Result};

/// A packet socket read one `recvmsg` at a time.
pub(super) struct RecvSource {
    socket: BoundSocket,
    buf: Vec<u8>,
    /// The receive timeout the socket has now (changed only when a batch
    /// asks for another).
    timeout: Duration,
    /// `-i any`: packets get a cooked header from their socket address.
    cooked: bool,
}

pub(super) fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
    let (socket, timeout) = BoundSocket::open(cfg, false, |sock| {
        let timeout = Duration::from_millis(100);
        sock.set_rcvbuf(cfg.ring.buffer_bytes.min(i32::MAX as u64) as libc::c_int)
            .map_err(CaptureError::from_sys)?;
        sock.set_rcvtimeo(timeout).map_err(CaptureError::from_sys)?;
        sock.enable_timestamp_ns().map_err(CaptureError::from_sys)?;
        sock.enable_auxdata().map_err(CaptureError::from_sys)?;
        Ok(timeout)
    })?;
    Ok(Box::new(RecvSource {
        socket,
        buf: vec![0u8; cfg.snaplen.max(64) as usize],
        timeout,
        cooked: cfg.cooked,
    }))
}

/// Any packet socket will do.
pub(super) fn probe() -> Support {
    packet_socket::probe(|_| Ok(()))
}

impl CaptureMode for RecvSource {
    const NAME: &'static str = "recv";
    /// The last default: every kernel has it.
    const DEFAULT_RANK: Option<u8> = Some(2);

    fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>> {
        open(cfg)
    }

    fn probe() -> Support {
        probe()
    }
}

impl CaptureSource for RecvSource {
    fn next_batch(
        &mut self,
        timeout: Duration,
        _own: &mut OwnCounts,
        sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
    ) -> Result<usize> {
        let sock = &self.socket.sock;
        if self.timeout != timeout {
            sock.set_rcvtimeo(timeout.max(Duration::from_millis(1)))
                .map_err(CaptureError::from_sys)?;
            self.timeout = timeout;
        }
        match sock.recv_one(&mut self.buf).map_err(CaptureError::from_sys)? {
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
                    data: &self.buf[..r.len],
                    vlan: r.vlan,
                    cooked: if self.cooked { sll2_from_sockaddr(&r.addr) } else { None },
                };
                Ok(usize::from(sink(&p) == Flow::Continue))
            }
        }
    }

    fn kernel_stats(&mut self) -> Result<KernelStats> {
        self.socket.kernel_stats()
    }

    fn reads_before_sink(&self) -> bool {
        true
    }
}
