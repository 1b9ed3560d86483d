//! What a run is asked: the interface, filter, mode and ring, when to
//! stop, where the packets go, and the flags that steer a running capture.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::output::{Compression, Format};
use crate::print::PrintOptions;
use crate::source::{Mode, RingConfig};

/// What to capture and how.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    pub iface: String,
    /// tcpdump filter expression; `None` captures everything.
    pub filter: Option<String>,
    /// `None`: the best mode the probe allows.
    pub mode: Option<Mode>,
    pub snaplen: u32,
    pub ring: RingConfig,
    /// Worker threads; more than one joins a PACKET_FANOUT group (hash by flow).
    pub threads: usize,
    /// CPUs to pin worker i to (`cpus[i % len]`); empty = leave to the scheduler.
    pub cpus: Vec<usize>,
    /// Ignore packets this host sends (PACKET_IGNORE_OUTGOING).
    pub inbound_only: bool,
    /// Only packets this host sends (`-Q out`): a check of the packet type
    /// in front of the filter, in the kernel.
    pub outbound_only: bool,
    /// Promiscuous mode while capturing (tcpdump's default; `-p` turns it
    /// off): frames for other hosts, e.g. unicast crossing a bridge, are
    /// captured too.
    pub promiscuous: bool,
    /// Let the xdp mode take an interface that carries addresses (its
    /// program takes every received frame away from the host's stack).
    pub xdp_on_host_interface: bool,
}

impl CaptureConfig {
    pub fn new(iface: &str) -> Self {
        CaptureConfig {
            iface: iface.to_string(),
            filter: None,
            mode: None,
            snaplen: 262_144,
            ring: RingConfig::default(),
            threads: 1,
            cpus: Vec::new(),
            inbound_only: false,
            outbound_only: false,
            promiscuous: true,
            xdp_on_host_interface: false,
        }
    }
}

/// When to stop.
#[derive(Debug, Clone, Copy, Default)]
pub struct Limits {
    pub count: Option<u64>,
    pub duration: Option<Duration>,
}

/// A captured packet, owned (for [`Sink::Collect`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedPacket {
    pub ts_ns: u64,
    pub wire_len: u32,
    pub data: Vec<u8>,
}

/// Where captured packets go.
pub enum Sink {
    /// Count only.
    Count,
    /// One `tcpdump -n`-style line per packet on stdout, printed as asked.
    Summary(PrintOptions),
    /// A pcap/pcapng file (possibly compressed).
    File {
        path: PathBuf,
        format: Format,
        compression: Compression,
        nano: bool,
        /// Make every packet readable from the file as soon as it is taken
        /// (tcpdump's `-U`); otherwise every batch the kernel hands over, at
        /// the latest once a second.
        packet_buffered: bool,
        /// Also print each packet on stdout (tcpdump's `--print`).
        print: Option<PrintOptions>,
        /// `-G/-C/-W`: move on to new files by time or size.
        rotation: crate::output::Rotation,
    },
    /// Keep the packets in memory (for library users and tests).
    Collect(Arc<Mutex<Vec<OwnedPacket>>>),
}

/// Flags a caller (signal handlers, another thread) sets to steer a run.
#[derive(Debug, Clone, Default)]
pub struct Control {
    /// Stop as soon as possible, finishing the output properly.
    pub stop: Arc<AtomicBool>,
    /// Print statistics now (SIGUSR1); cleared when done.
    pub report: Arc<AtomicBool>,
    /// Stop at once (a second Ctrl-C): nothing more is taken from the
    /// kernel, packets encoded but not yet written are counted as not
    /// written and dropped, and the file is closed cleanly with what it has.
    pub abort: Arc<AtomicBool>,
}
