//! How datagrams leave and enter a UDP socket without copies or allocation
//! per datagram (paper 001's send path; MSG_ZEROCOPY builds on this):
//!
//! - [`DestSet`]: a set of destinations kept in the kernel's own address
//!   format, with the `sendmmsg` headers prebuilt when the set changes, so a
//!   fan-out converts nothing and rebuilds nothing per datagram; sends to a
//!   range of it with one `sendmmsg` (or one `sendto` per destination);
//! - [`RecvBatch`]: `recvmmsg` into reused buffers, one syscall per batch;
//!   [`RecvInto`]: the same into buffers the caller owns and may keep;
//! - [`UringRecv`]: io_uring multishot `RECVMSG` into a provided-buffer ring,
//!   each datagram handed out as the buffer the kernel filled;
//! - [`wait_writable`], [`set_recverr`]: the no-loss wait and the option that
//!   makes a full device queue visible (ENOBUFS) instead of a silent drop;
//! - [`errqueue`]: the socket error queue read and decoded — ICMP errors with
//!   the destination they were about, local errors, and zero-copy completion
//!   ranges with their COPIED flag — not just drained;
//! - [`zerocopy::ZeroCopySender`]: MSG_ZEROCOPY sends over a size threshold,
//!   buffers held until their completions ([`completions`], pure), a bound
//!   on bytes pinned, and a fall-back to copies when the kernel copies anyway;
//! - [`stream::StreamSender`]: the same for a message of pieces on a TCP
//!   socket (the reflector's checkpoints): small pieces copied, large shared
//!   buffers sent from their pages and held until completed.
//!
//! All `unsafe` is in the private `sys` module.
#![deny(unsafe_code)]

pub mod completions;
pub mod errqueue;
pub mod stream;
mod sys;
mod sys_uring;
mod sys_uring_recv;
pub mod zerocopy;

pub use sys_uring::{probe_send_zc, UringZcSender};
pub use sys_uring_recv::{probe_recv_multishot, RecvEvent, UringRecv};

pub use sys::{
    probe_sendmmsg, send_flagged, send_stream, set_recverr, set_udp_segment, wait_error_queue, wait_writable, DestSet,
    MultiSend, RecvBatch, RecvInto, SendOne,
};

/// Most headers one `sendmmsg` takes (the kernel's UIO_MAXIOV).
pub const MAX_BATCH: usize = 1024;
