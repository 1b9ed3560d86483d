//! Packet capture on Linux `AF_PACKET` sockets in the modes compared by
//! Braun et al. (IMC 2010): a `recvfrom` per packet, a TPACKET_V2 ring with
//! a `poll()` per empty slot, and a TPACKET_V3 block ring whose retire
//! timeout is the paper's "wake up when N packets are ready or m µs have
//! passed". Fanout over pinned threads, tcpdump filter expressions,
//! pcap/pcapng output (optionally compressed), exact loss accounting, and a
//! packet generator to drive it.
//!
//! ```no_run
//! use capture::{Capture, CaptureConfig, Control, Limits, Sink};
//! let mut cfg = CaptureConfig::new("veth0");
//! cfg.filter = Some("udp port 5000".into());
//! let cap = Capture::open(&cfg)?; // sockets bound: nothing is missed from here on
//! let report = cap.run(Limits { count: Some(100), duration: None }, Sink::Count,
//!                      &Control::default(), &mut |_| {})?;
//! println!("{report}");
//! # Ok::<(), capture::CaptureError>(())
//! ```
#![deny(unsafe_code)]

pub mod decode;
pub mod error;
pub mod filter;
pub mod gen;
pub mod output;
pub mod print;
pub mod read;
pub mod session;
pub mod source;
pub mod sys;
mod vlan;
pub mod xdp;

pub use error::{CaptureError, Result};
pub use filter::LinkType;
pub use output::{Compression, Format};
pub use print::{Dump, PrintOptions, TsFormat};
pub use session::{
    count_packets, iface_info, Capture, CaptureConfig, Control, Limits, OwnedPacket, Report, Sink, ThreadReport,
};
pub use source::{probe, ring_warning, v3_block_size, KernelStats, Mode, RingConfig, Support, MIN_V3_BLOCKS};
