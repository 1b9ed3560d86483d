//! Capture sources: one contract ([`CaptureSource::next_batch`]), one file
//! per way of getting packets out of the kernel, and one registry
//! (`MODES`) that maps a mode's name to how it is opened and probed.
//!
//! * `recv` (`recvmsg`): one `recvmsg` per packet into a private buffer
//!   (a copy per packet, a syscall per packet).
//! * `v2` (`tpacket_v2`): TPACKET_V2 ring of fixed-size frames; when the
//!   next frame is still the kernel's, one `poll()` — the per-packet wake-up
//!   of libpcap 1.0 that the paper identifies as the bottleneck.
//! * `v3` (`tpacket_v3`): TPACKET_V3 ring of blocks; the kernel hands over
//!   a block when it is full or when the retire timeout expires — the
//!   paper's "signal when N packets are ready or m µs have passed", with N
//!   set by the block size.
//! * `xdp` (`af_xdp`): AF_XDP sockets, one per receive queue, fed by the
//!   XDP program of [`crate::xdp`].
//!
//! What the three packet-socket modes share (opening in the safe order,
//! kernel counters, ring helpers) is in `packet_socket`; what every mode
//! shares (the capture's own loss counts, the packet a sink sees) is here.
//! A new mode is one file, whose source type implements [`CaptureSource`]
//! and [`CaptureMode`] (name, rank among the defaults, open, probe), and
//! one line in the registry list (`capture_modes!`): the module, the
//! [`Mode`] variant, `MODES`, the names, the probe and the default choice
//! come from that line.

mod packet_socket;

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::sys::xsk::BindMode;
use crate::sys::{self, BpfInsn};
use crate::xdp::XdpProgram;

pub use af_xdp::{XDP_COALESCE, XDP_COALESCE_BELOW};
pub use packet_socket::v2_frame_size;
pub use tpacket_v3::{ring_warning, v3_block_size, DEFAULT_V3_BLOCK, MIN_V3_BLOCKS};

/// What each capture mode's file states about its source type; the
/// registry line names the type, and [`Mode`] and `MODES` are built from
/// these.
trait CaptureMode: CaptureSource + Sized + 'static {
    /// Its `--mode` value.
    const NAME: &'static str;
    /// Its place among the modes a capture picks by itself when none is
    /// asked for, 0 the best; `None` for a mode used only when asked.
    const DEFAULT_RANK: Option<u8>;

    /// Opens, configures and binds one source.
    fn open(cfg: &SourceConfig) -> Result<Box<dyn CaptureSource>>;

    /// Whether this kernel and these privileges allow the mode.
    fn probe() -> Support;
}

/// One capture mode in the registry: its name (the `--mode` value), how
/// one of its sources is opened, how the probe tests for it, and its rank
/// among the defaults.
#[derive(Clone, Copy)]
struct ModeEntry {
    mode: Mode,
    name: &'static str,
    open: fn(&SourceConfig) -> Result<Box<dyn CaptureSource>>,
    probe: fn() -> Support,
    default_rank: Option<u8>,
}

/// The registry of capture modes, one line per mode in the order the probe
/// lists them, as `(Variant, module::Type)`: the [`Mode`] variant and the
/// mode's file (`module.rs` in this folder, declared from here) with its
/// source type, which implements [`CaptureMode`].
///
/// `cargo fmt` does not reach files whose `mod` a macro declares: `make
/// lint` checks this folder's files by name.
macro_rules! capture_modes {
    ($callback:ident) => {
        $callback! { [
            (Recv, recvmsg::RecvSource),
            (V2, tpacket_v2::FrameRing),
            (V3, tpacket_v3::BlockRing),
            (Xdp, af_xdp::XdpSource),
        ] }
    };
}

/// Everything the registry list determines: the modules, the enum and
/// `MODES`.
macro_rules! define_modes {
    ([$(($variant:ident, $module:ident :: $ty:ident)),+ $(,)?]) => {
        $(mod $module;)+

        /// Capture mode (backend), from the registry list.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Mode {
            $(
                #[doc = concat!("`", stringify!($module), ".rs`")]
                $variant,
            )+
        }

        const MODES: [ModeEntry; [$(Mode::$variant),+].len()] = [$(
            ModeEntry {
                mode: Mode::$variant,
                name: <$module::$ty as CaptureMode>::NAME,
                open: <$module::$ty as CaptureMode>::open,
                probe: <$module::$ty as CaptureMode>::probe,
                default_rank: <$module::$ty as CaptureMode>::DEFAULT_RANK,
            },
        )+];
    };
}

capture_modes!(define_modes);

/// The modes a capture picks from when none is asked for, best first (by
/// their `DEFAULT_RANK`). The xdp mode is never a default: it takes the
/// interface's frames away from the host's stack.
fn preference() -> Vec<Mode> {
    let mut ranked: Vec<(u8, Mode)> = MODES.iter().filter_map(|e| Some((e.default_rank?, e.mode))).collect();
    ranked.sort_by_key(|&(rank, _)| rank);
    ranked.into_iter().map(|(_, m)| m).collect()
}

impl Mode {
    pub const ALL: [Mode; MODES.len()] = {
        let mut all = [MODES[0].mode; MODES.len()];
        let mut i = 0;
        while i < MODES.len() {
            all[i] = MODES[i].mode;
            i += 1;
        }
        all
    };

    fn entry(self) -> ModeEntry {
        match MODES.iter().find(|e| e.mode == self) {
            Some(e) => *e,
            None => unreachable!("mode {self:?} has no entry in MODES"),
        }
    }

    pub fn name(self) -> &'static str {
        self.entry().name
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
        if let Some(e) = MODES.iter().find(|e| e.name == s) {
            return Ok(e.mode);
        }
        // "recv, v2, v3 or xdp"
        let names: Vec<&str> = MODES.iter().map(|e| e.name).collect();
        let choices = match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        };
        Err(format!("unknown mode '{s}' (choose {choices})"))
    }
}

/// Result of probing one mode.
pub use oskit::Support;

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

/// What the capture itself loses or cuts (the kernel's losses are in
/// [`KernelStats`]), the same for every mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OwnCounts {
    /// Frames whose header did not fit the ring or block: never produced by
    /// a correct kernel, counted so a loss can never be silent.
    pub malformed: u64,
    /// Packets cut shorter than the snaplen because a v2 frame was too small
    /// (e.g. GRO-merged packets larger than the MTU): kept, but reported.
    pub truncated: u64,
}

/// One way of getting packets out of the kernel: what every capture mode
/// implements (one type per file of this module).
pub trait CaptureSource: Send {
    /// Waits up to `timeout` for packets and hands every ready one to
    /// `sink`, until the sink says stop. Returns how many were handed over;
    /// what the mode could not read or had to cut goes to `own`.
    fn next_batch(
        &mut self,
        timeout: Duration,
        own: &mut OwnCounts,
        sink: &mut dyn FnMut(&PacketView<'_>) -> Flow,
    ) -> Result<usize>;

    /// Cumulative kernel counters.
    fn kernel_stats(&mut self) -> Result<KernelStats>;

    /// How long, in ms, the kernel may hold packets before handing them
    /// over (a partly filled v3 block waits for its retire timeout).
    fn hand_over_ms(&self) -> u32 {
        0
    }

    /// A packet the sink declines has been read already (it cannot stay
    /// in the kernel for the next batch), so it must be accounted for.
    fn reads_before_sink(&self) -> bool {
        false
    }

    /// How an `xdp` source's socket is bound (zero-copy or copy).
    fn xdp_bind_mode(&self) -> Option<BindMode> {
        None
    }
}

/// A capture source in one of the modes: the mode's reader and the counts
/// every mode keeps alike.
pub struct Source {
    mode: Mode,
    reader: Box<dyn CaptureSource>,
    own: OwnCounts,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source")
            .field("mode", &self.mode)
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

impl Source {
    /// Opens, configures and binds one socket. Packets are queued from the
    /// moment this returns.
    pub fn open(mode: Mode, cfg: &SourceConfig) -> Result<Source> {
        let reader = (mode.entry().open)(cfg)?;
        Ok(Source::new(mode, reader))
    }

    /// Opens the AF_XDP socket of receive queue `queue` and puts it in
    /// `prog`'s map (attaching the program is the caller's last step).
    pub fn open_xdp(cfg: &SourceConfig, queue: u32, prog: &Arc<Mutex<XdpProgram>>) -> Result<Source> {
        let reader = af_xdp::open(cfg, queue, prog)?;
        Ok(Source::new(Mode::Xdp, reader))
    }

    fn new(mode: Mode, reader: Box<dyn CaptureSource>) -> Source {
        Source {
            mode,
            reader,
            own: OwnCounts::default(),
        }
    }

    /// How an `xdp` source's socket is bound (zero-copy or copy).
    pub fn xdp_bind_mode(&self) -> Option<BindMode> {
        self.reader.xdp_bind_mode()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// How long packets can sit in the socket before a reader can see them:
    /// a partly filled v3 block is handed over only at its retire timeout.
    pub fn visibility_delay(&self) -> Duration {
        Duration::from_millis(u64::from(self.reader.hand_over_ms()) + 10)
    }

    /// See [`CaptureSource::reads_before_sink`].
    pub fn reads_before_sink(&self) -> bool {
        self.reader.reads_before_sink()
    }

    /// Frames whose header did not fit the ring or block (see [`OwnCounts`]).
    pub fn malformed(&self) -> u64 {
        self.own.malformed
    }

    /// Packets a ring slot cut shorter than the snaplen (see [`OwnCounts`]).
    pub fn truncated(&self) -> u64 {
        self.own.truncated
    }

    /// Cumulative kernel counters (reads and accumulates the kernel's
    /// reset-on-read values).
    pub fn kernel_stats(&mut self) -> Result<KernelStats> {
        self.reader.kernel_stats()
    }

    /// Waits up to `timeout` for packets and hands every ready one to
    /// `sink`, until the sink says stop. Returns how many were handed over.
    pub fn next_batch(&mut self, timeout: Duration, sink: &mut dyn FnMut(&PacketView<'_>) -> Flow) -> Result<usize> {
        self.reader.next_batch(timeout, &mut self.own, sink)
    }
}

/// A probe's or a socket's failure as the reason a mode is unsupported.
fn unsupported(e: sys::SysError) -> Support {
    let e = CaptureError::from_sys(e);
    Support::Unsupported(e.to_string())
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
    modes.iter().map(|&m| (m, (m.entry().probe)())).collect()
}

/// The modes a capture may pick by itself, in registry order: the ones it
/// probes when it opens.
pub fn default_candidates() -> Vec<Mode> {
    let preferred = preference();
    Mode::ALL.into_iter().filter(|m| preferred.contains(m)).collect()
}

/// The best mode the probe allows (v3, then v2, then recv).
pub fn best_mode(probed: &[(Mode, Support)]) -> Option<Mode> {
    preference()
        .into_iter()
        .find(|m| probed.iter().any(|(pm, s)| pm == m && *s == Support::Supported))
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn best_mode_prefers_v3() {
        let p = vec![
            (Mode::Recv, Support::Supported),
            (Mode::V2, Support::Supported),
            (Mode::V3, Support::Unsupported("x".into())),
        ];
        assert_eq!(best_mode(&p), Some(Mode::V2));
        assert_eq!(best_mode(&[]), None);
    }

    #[test]
    fn the_registry_holds_each_mode_once_and_names_them_all() {
        for (i, e) in MODES.iter().enumerate() {
            assert!(
                MODES[..i].iter().all(|o| o.mode != e.mode && o.name != e.name),
                "{}",
                e.name
            );
        }
        assert_eq!(Mode::ALL, [Mode::Recv, Mode::V2, Mode::V3, Mode::Xdp]);
        assert_eq!(default_candidates(), vec![Mode::Recv, Mode::V2, Mode::V3]);
        assert_eq!(
            "v4".parse::<Mode>(),
            Err("unknown mode 'v4' (choose recv, v2, v3 or xdp)".to_string())
        );
    }
}
