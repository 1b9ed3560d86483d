//! A capture run: open the sockets (one per thread, joined in a fanout
//! group when there are several), then run one pinned worker per socket
//! until the count, the duration or a stop request, with exact accounting.

use std::fmt;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CaptureError, Result};
use crate::filter::{self, LinkType};
use crate::output::{Compression, Encoding, FileOutput, FooterStats, Format};
use crate::print::{PrintOptions, Printer};
use crate::source::{self, Flow, KernelStats, Mode, PacketView, RingConfig, Source, SourceConfig, Support};
use crate::sys;
use crate::xdp::{self, XdpProgram};

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

/// Statistics of one worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadReport {
    pub cpu: Option<usize>,
    /// Packets taken from the socket and passed to the output.
    pub captured: u64,
    pub bytes: u64,
    pub kernel: KernelStats,
    /// Read from the socket but not output because the count was reached
    /// (only `recv` mode reads before it can decline a packet).
    pub beyond_limit: u64,
    /// Ring entries whose headers did not fit the ring (never seen on a correct kernel).
    pub malformed: u64,
    /// Packets kept shorter than the snaplen because a ring frame was too small.
    pub truncated: u64,
    /// Captured, but dropped before reaching the file because a second stop
    /// signal asked to stop at once.
    pub not_written: u64,
    pub cpu_user: Duration,
    pub cpu_sys: Duration,
}

/// Statistics of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub mode: Option<Mode>,
    pub threads: Vec<ThreadReport>,
    pub elapsed: Duration,
    /// Stopped at once by [`Control::abort`] (a second Ctrl-C).
    pub aborted: bool,
}

impl Report {
    pub fn captured(&self) -> u64 {
        self.threads.iter().map(|t| t.captured).sum()
    }
    pub fn kernel(&self) -> KernelStats {
        let mut k = KernelStats::default();
        for t in &self.threads {
            k.add(&t.kernel);
        }
        k
    }
    /// Packets the capture did not output: kernel drops plus our own.
    pub fn lost(&self) -> u64 {
        self.kernel().drops + self.threads.iter().map(|t| t.malformed).sum::<u64>()
    }
    pub fn cpu(&self) -> Duration {
        self.threads.iter().map(|t| t.cpu_user + t.cpu_sys).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, name: &str, t: &ThreadReport| {
            let cpu = t.cpu_user + t.cpu_sys;
            let per = if t.captured > 0 {
                cpu.as_secs_f64() * 1e9 / t.captured as f64
            } else {
                0.0
            };
            writeln!(
                f,
                "{name}: captured {} packets ({} bytes); kernel: {} accepted by filter, {} dropped, {} queue freezes; \
                 ours: {} malformed, {} truncated by the ring, {} read beyond -c; cpu {:.3}s user + {:.3}s sys ({:.0} ns/packet)",
                t.captured,
                t.bytes,
                t.kernel.packets,
                t.kernel.drops,
                t.kernel.freeze_q_cnt,
                t.malformed,
                t.truncated,
                t.beyond_limit,
                t.cpu_user.as_secs_f64(),
                t.cpu_sys.as_secs_f64(),
                per
            )
        };
        if self.threads.len() > 1 {
            for (i, t) in self.threads.iter().enumerate() {
                let name = match t.cpu {
                    Some(c) => format!("thread {i} (cpu {c})"),
                    None => format!("thread {i}"),
                };
                line(f, &name, t)?;
            }
        }
        let mut total = ThreadReport {
            captured: self.captured(),
            bytes: self.threads.iter().map(|t| t.bytes).sum(),
            kernel: self.kernel(),
            beyond_limit: self.threads.iter().map(|t| t.beyond_limit).sum(),
            malformed: self.threads.iter().map(|t| t.malformed).sum(),
            truncated: self.threads.iter().map(|t| t.truncated).sum(),
            not_written: self.threads.iter().map(|t| t.not_written).sum(),
            cpu_user: self.threads.iter().map(|t| t.cpu_user).sum(),
            cpu_sys: self.threads.iter().map(|t| t.cpu_sys).sum(),
            cpu: None,
        };
        if self.threads.len() == 1 {
            total.cpu = self.threads[0].cpu;
        }
        line(f, "total", &total)?;
        if self.aborted {
            // Accepted by the filter, neither dropped nor taken: still in the ring.
            let unread = total.kernel.packets.saturating_sub(total.kernel.drops + total.captured);
            writeln!(
                f,
                "stopped at once: {} captured packets not written, {unread} left unread in the kernel; \
                 the output holds the other {}",
                total.not_written,
                total.captured - total.not_written
            )?;
        }
        let k = total.kernel.packets.max(1);
        write!(
            f,
            "lost: {} of {} ({:.3}%) in {:.3}s, mode {}",
            self.lost(),
            total.kernel.packets,
            self.lost() as f64 * 100.0 / k as f64,
            self.elapsed.as_secs_f64(),
            self.mode.map_or("-", Mode::name)
        )
    }
}

const ARPHRD_LOOPBACK: u32 = 772;

/// Interface facts the capture needs.
#[derive(Debug, Clone, Copy)]
pub struct IfaceInfo {
    pub index: u32,
    pub link: LinkType,
    pub mtu: u32,
    /// The loopback device: every packet crosses it twice (sent, then
    /// received), so the capture keeps only the received copy.
    pub loopback: bool,
}

/// Looks an interface up (index, link type, MTU).
pub fn iface_info(name: &str) -> Result<IfaceInfo> {
    if name == "any" {
        // Every interface: cooked packets, frames as large as the largest MTU.
        let mtu = std::fs::read_dir("/sys/class/net")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| std::fs::read_to_string(e.path().join("mtu")).ok())
                    .filter_map(|s| s.trim().parse::<u32>().ok())
                    .max()
                    .unwrap_or(1500)
            })
            .unwrap_or(1500);
        return Ok(IfaceInfo {
            index: 0,
            link: LinkType::LinuxSll2,
            mtu,
            loopback: false,
        });
    }
    let index = sys::if_index(name).ok_or_else(|| CaptureError::NoSuchInterface(name.to_string()))?;
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    let arphrd = read("type").unwrap_or(1);
    let link = LinkType::from_arphrd(arphrd).ok_or_else(|| {
        CaptureError::Config(format!(
            "interface {name} has link type ARPHRD {arphrd}, which capture does not handle (Ethernet, loopback and tun do)"
        ))
    })?;
    Ok(IfaceInfo {
        index,
        link,
        mtu: read("mtu").unwrap_or(1500),
        loopback: arphrd == ARPHRD_LOOPBACK,
    })
}

/// An opened capture: sockets bound and filtering, packets queueing.
#[derive(Debug)]
pub struct Capture {
    sources: Vec<Source>,
    mode: Mode,
    info: IfaceInfo,
    cfg: CaptureConfig,
    /// What the probe found, for printing the choice.
    pub probe: Vec<(Mode, Support)>,
    xdp: Option<String>,
}

static FANOUT_SEQ: AtomicU64 = AtomicU64::new(0);

impl Capture {
    /// Validates the configuration, compiles the filter, picks the mode and
    /// opens every socket. When this returns, no packet that the filter
    /// accepts is missed (it is captured or counted as dropped).
    pub fn open(cfg: &CaptureConfig) -> Result<Capture> {
        if cfg.threads == 0 || cfg.threads > 64 {
            return Err(CaptureError::Config(format!("--threads {} (use 1 to 64)", cfg.threads)));
        }
        if cfg.snaplen < 14 {
            return Err(CaptureError::Config(format!(
                "snaplen {} is too small (at least 14)",
                cfg.snaplen
            )));
        }
        let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
        if let Some(c) = cfg.cpus.iter().find(|&&c| c >= ncpu) {
            return Err(CaptureError::Config(format!(
                "--cpus names CPU {c}, but this machine has {ncpu} (0..{})",
                ncpu - 1
            )));
        }
        let info = iface_info(&cfg.iface)?;
        // The xdp mode is never a default and is not probed here: its probe
        // loads its program through the verifier (tens of milliseconds of
        // CPU), and opening it reports any problem itself.
        let probe = source::probe_modes(&[Mode::Recv, Mode::V2, Mode::V3]);
        let mode = match cfg.mode {
            Some(m) => {
                if let Some((_, Support::Unsupported(reason))) = probe.iter().find(|(pm, _)| *pm == m) {
                    return Err(CaptureError::ModeUnsupported {
                        mode: m.name(),
                        reason: reason.clone(),
                    });
                }
                m
            }
            None => match source::best_mode(&probe) {
                Some(m) => m,
                None => {
                    let why = probe
                        .iter()
                        .find_map(|(_, s)| match s {
                            Support::Unsupported(r) => Some(r.clone()),
                            Support::Supported => None,
                        })
                        .unwrap_or_default();
                    return Err(CaptureError::ModeUnsupported {
                        mode: "any",
                        reason: why,
                    });
                }
            },
        };
        // The xdp mode filters in user space (compiled per socket).
        let prog = match &cfg.filter {
            Some(expr) if !expr.trim().is_empty() && mode != Mode::Xdp => {
                filter::compile(&cfg.iface, expr, info.link, cfg.snaplen)?
            }
            _ => filter::accept_all(cfg.snaplen),
        };
        let fanout = (cfg.threads > 1 && mode != Mode::Xdp).then(|| {
            // Unique per process and per capture, so concurrent captures do not merge.
            let seq = FANOUT_SEQ.fetch_add(1, Ordering::Relaxed);
            ((std::process::id() as u64).wrapping_mul(31).wrapping_add(seq) & 0xffff) as u16
        });
        let scfg = SourceConfig {
            ifindex: info.index,
            link: info.link,
            mtu: info.mtu,
            snaplen: cfg.snaplen,
            filter: if cfg.outbound_only {
                crate::filter::outgoing_only(prog, cfg.snaplen)
            } else if info.link == LinkType::LinuxSll2 {
                // As on lo itself, each datagram over lo once (the received copy).
                match sys::if_index("lo") {
                    Some(lo) => crate::filter::skip_loopback_outgoing(prog, lo),
                    None => prog,
                }
            } else {
                prog
            },
            ring: cfg.ring,
            // On lo, as libpcap does, drop the outgoing copy of each packet:
            // the same packet comes back as the incoming one, so nothing is
            // lost and each datagram is captured once. With `-Q out` the
            // outgoing copy is the one kept (still once per datagram).
            inbound_only: cfg.inbound_only || (info.loopback && !cfg.outbound_only),
            promiscuous: cfg.promiscuous,
            fanout,
            cooked: info.link == LinkType::LinuxSll2,
            filter_expr: cfg.filter.clone(),
        };
        if mode == Mode::Xdp {
            return Capture::open_xdp(cfg, info, &scfg, probe);
        }
        let mut sources = Vec::with_capacity(cfg.threads);
        for _ in 0..cfg.threads {
            sources.push(Source::open(mode, &scfg)?);
        }
        Ok(Capture {
            sources,
            mode,
            info,
            cfg: cfg.clone(),
            probe,
            xdp: None,
        })
    }

    /// The `xdp` mode: one AF_XDP socket per receive queue, each in the
    /// program's map, then the program attached (so no frame arrives
    /// before a socket can take it). Only for a monitor interface: the
    /// program takes every frame away from the stack.
    fn open_xdp(
        cfg: &CaptureConfig,
        info: IfaceInfo,
        scfg: &SourceConfig,
        probe: Vec<(Mode, Support)>,
    ) -> Result<Capture> {
        let unsupported = |reason: String| CaptureError::ModeUnsupported { mode: "xdp", reason };
        if cfg.outbound_only {
            return Err(unsupported(
                "AF_XDP sees received frames only; -Q out needs a packet-socket mode (v3)".into(),
            ));
        }
        if info.loopback || info.link != LinkType::Ethernet {
            return Err(unsupported(format!(
                "{} is not an Ethernet device; the xdp mode is for a monitor (mirror or SPAN) port",
                cfg.iface
            )));
        }
        let addrs = xdp::host_addresses(&cfg.iface)?;
        if !addrs.is_empty() && !cfg.xdp_on_host_interface {
            let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
            return Err(unsupported(format!(
                "{} carries addresses ({}): it is a host's own interface, and the xdp mode's program would take \
                 every frame it receives away from the stack and its applications. Capture a monitor port \
                 instead (a mirror of this interface's traffic, see the capture README), use v3 here, or pass \
                 --xdp-on-host-interface to take the traffic anyway",
                cfg.iface,
                list.join(", ")
            )));
        }
        let queues = xdp::rx_queues(&cfg.iface);
        if queues > xdp::MAX_QUEUES {
            return Err(unsupported(format!(
                "{} has {queues} receive queues; the program serves at most {}",
                cfg.iface,
                xdp::MAX_QUEUES
            )));
        }
        if cfg.threads != 1 && cfg.threads != queues as usize {
            return Err(CaptureError::Config(format!(
                "the xdp mode runs one thread per receive queue and {} has {queues}: leave out --threads or use --threads {queues}",
                cfg.iface
            )));
        }
        xdp::sweep_leftover(&cfg.iface)?;
        let prog = Arc::new(Mutex::new(XdpProgram::load()?));
        let mut sources = Vec::with_capacity(queues as usize);
        for q in 0..queues {
            sources.push(Source::open_xdp(scfg, q, &prog)?);
        }
        let attach = prog
            .lock()
            .map_err(|_| CaptureError::Config("the XDP program's lock was poisoned".into()))?
            .attach(&cfg.iface)?;
        let bind = sources
            .first()
            .and_then(Source::xdp_bind_mode)
            .map_or("copy", |b| b.name());
        Ok(Capture {
            sources,
            mode: Mode::Xdp,
            info,
            cfg: cfg.clone(),
            probe,
            xdp: Some(format!(
                "program attached {attach}, {queues} queue(s), sockets in {bind} mode"
            )),
        })
    }

    /// How the xdp mode runs: the program's attachment (native, in the
    /// driver, or generic) and the sockets' binding (zero-copy or copy).
    pub fn xdp_detail(&self) -> Option<&str> {
        self.xdp.as_deref()
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Worker threads (one per socket).
    pub fn threads(&self) -> usize {
        self.sources.len()
    }

    pub fn link(&self) -> LinkType {
        self.info.link
    }

    /// Runs the workers until a limit or `control.stop`; `on_report` is
    /// called with interim statistics whenever `control.report` is set.
    pub fn run(
        self,
        limits: Limits,
        sink: Sink,
        control: &Control,
        on_report: &mut dyn FnMut(&Report),
    ) -> Result<Report> {
        let start = Instant::now();
        let deadline = limits.duration.map(|d| start + d);
        let file = match &sink {
            Sink::File {
                path,
                format,
                compression,
                nano,
                packet_buffered,
                rotation,
                ..
            } => {
                let enc = Encoding {
                    format: *format,
                    link: self.info.link,
                    snaplen: self.cfg.snaplen,
                    nano: *nano,
                };
                let mut f = if rotation.is_on() {
                    FileOutput::create_rotating(path, *rotation, enc, *compression, &self.cfg.iface)?
                } else {
                    FileOutput::create(path, enc, *compression, &self.cfg.iface)?
                };
                f.packet_buffered = *packet_buffered;
                Some(Arc::new(Mutex::new(f)))
            }
            _ => None,
        };
        let shared = Shared {
            taken: AtomicU64::new(0),
            limit: limits.count.unwrap_or(u64::MAX),
            deadline,
            stop: control.stop.clone(),
            abort: control.abort.clone(),
            epoch: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        };
        let n = self.sources.len();
        let snapshots: Vec<Mutex<(u64, ThreadReport)>> =
            (0..n).map(|_| Mutex::new((0, ThreadReport::default()))).collect();
        let mode = self.mode;
        let link = self.info.link;
        let cpus = self.cfg.cpus.clone();
        let results: Vec<Result<ThreadReport>> = std::thread::scope(|scope| {
            let mut handles = Vec::with_capacity(n);
            for (i, src) in self.sources.into_iter().enumerate() {
                let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
                let out = match &sink {
                    Sink::Count => Out::Count,
                    Sink::Summary(opts) => Out::Summary(String::new(), Printer::new(*opts)),
                    Sink::File { print, .. } => match &file {
                        Some(f) => Out::File(
                            f.clone(),
                            Vec::with_capacity(FLUSH_AT + 4096),
                            0,
                            Vec::new(),
                            print.map(|o| (String::new(), Printer::new(o))),
                        ),
                        None => Out::Count,
                    },
                    Sink::Collect(v) => Out::Collect(v.clone(), Vec::new()),
                };
                let shared = &shared;
                let snap = &snapshots[i];
                let monitor = std::thread::current();
                handles.push(scope.spawn(move || {
                    let r = worker(src, cpu, out, link, shared, snap);
                    // Wake the monitor at once instead of making it poll often.
                    monitor.unpark();
                    r
                }));
            }
            // Monitor: interim reports on request, and nothing else.
            while handles.iter().any(|h| !h.is_finished()) {
                // Parked, not sleeping in short steps: an idle monitor costs no wake-ups
                // beyond these, which bound the latency of a SIGUSR1 report.
                std::thread::park_timeout(Duration::from_millis(200));
                if control.report.swap(false, Ordering::Relaxed) {
                    let e = shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
                    let until = Instant::now() + Duration::from_secs(1);
                    while Instant::now() < until
                        && snapshots
                            .iter()
                            .zip(&handles)
                            .any(|(s, h)| !h.is_finished() && s.lock().is_ok_and(|g| g.0 < e))
                    {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    let r = Report {
                        mode: Some(mode),
                        threads: snapshots
                            .iter()
                            .map(|s| s.lock().map(|g| g.1.clone()).unwrap_or_default())
                            .collect(),
                        elapsed: start.elapsed(),
                        aborted: false,
                    };
                    on_report(&r);
                }
            }
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(CaptureError::Config("a capture thread panicked".into())))
                })
                .collect()
        });
        let mut threads = Vec::with_capacity(n);
        for r in results {
            threads.push(r?);
        }
        let report = Report {
            mode: Some(mode),
            threads,
            elapsed: start.elapsed(),
            aborted: control.abort.load(Ordering::Relaxed),
        };
        if let Some(f) = file {
            let f = Arc::try_unwrap(f)
                .map_err(|_| CaptureError::Config("output still shared after the workers ended".into()))?
                .into_inner()
                .map_err(|_| CaptureError::Config("output lock poisoned by a failed thread".into()))?;
            let k = report.kernel();
            let footer = f.encoding.footer(
                oskit::clock::realtime_ns(),
                &FooterStats {
                    filter_accept: k.packets,
                    os_drop: k.drops,
                    delivered: report.captured(),
                },
            );
            f.finish(&footer)?;
        }
        Ok(report)
    }
}

/// A capture running in a background thread (see [`Capture::spawn`]).
#[derive(Debug)]
pub struct RunningCapture {
    control: Control,
    handle: std::thread::JoinHandle<Result<Report>>,
}

impl RunningCapture {
    /// Stops the capture within about 200 ms and returns the statistics.
    /// Packets still queued in the socket then count as neither captured nor
    /// dropped, so stop once the traffic is over and has been read (or use a
    /// count limit and [`RunningCapture::wait`]).
    pub fn stop(self) -> Result<Report> {
        self.control.stop.store(true, Ordering::Relaxed);
        self.wait()
    }

    /// Waits for the capture to end by its own limits.
    pub fn wait(self) -> Result<Report> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(CaptureError::Config("the capture thread panicked".into())))
    }

    /// The run's control flags (stop, report).
    pub fn control(&self) -> &Control {
        &self.control
    }
}

impl Capture {
    /// Runs the capture in a background thread, for callers that produce the
    /// traffic themselves (e.g. counting a reflector's datagrams on the wire).
    pub fn spawn(self, limits: Limits, sink: Sink) -> RunningCapture {
        let control = Control::default();
        let c = control.clone();
        let handle = std::thread::spawn(move || self.run(limits, sink, &c, &mut |_| {}));
        RunningCapture { control, handle }
    }
}

const FLUSH_AT: usize = 256 << 10;

struct Shared {
    taken: AtomicU64,
    limit: u64,
    deadline: Option<Instant>,
    stop: Arc<AtomicBool>,
    abort: Arc<AtomicBool>,
    epoch: AtomicU64,
    failed: AtomicBool,
}

enum Out {
    Count,
    Summary(String, Printer),
    /// Shared file, local encoded records (and how many packets they
    /// hold), scratch for VLAN re-insertion, and the lines to print too
    /// (`--print`).
    File(Arc<Mutex<FileOutput>>, Vec<u8>, u64, Vec<u8>, Option<(String, Printer)>),
    Collect(Arc<Mutex<Vec<OwnedPacket>>>, Vec<OwnedPacket>),
}

impl Out {
    fn flush(&mut self) -> Result<()> {
        match self {
            Out::Count => {}
            Out::Summary(s, _) => print_lines(s)?,
            Out::File(f, buf, packets, _, print) => {
                if let Some((s, _)) = print {
                    print_lines(s)?;
                }
                let mut g = f
                    .lock()
                    .map_err(|_| CaptureError::Config("output lock poisoned by a failed thread".into()))?;
                if !buf.is_empty() {
                    g.write_chunk(buf)?;
                    buf.clear();
                    *packets = 0;
                }
                // Also when idle: what was written less than a second ago
                // reaches the file within the second, and -G's next file is
                // opened on time.
                g.sync_if_due(false)?;
                g.rotate_if_due()?;
            }
            Out::Collect(all, local) => {
                if !local.is_empty() {
                    if let Ok(mut g) = all.lock() {
                        g.append(local);
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops what is encoded but not written (stopping at once); returns
    /// how many packets that was. Other outputs are cheap: flushed.
    fn discard(&mut self) -> Result<u64> {
        match self {
            Out::File(_, buf, packets, _, print) => {
                buf.clear();
                if let Some((s, _)) = print {
                    s.clear();
                }
                Ok(std::mem::take(packets))
            }
            _ => self.flush().map(|()| 0),
        }
    }

    /// The rotating output has written its last file (`-G` with `-W`).
    fn exhausted(&self) -> bool {
        matches!(self, Out::File(f, ..) if f.lock().is_ok_and(|g| g.exhausted()))
    }

    fn pending(&self) -> usize {
        match self {
            Out::Count => 0,
            Out::Summary(s, _) => s.len(),
            Out::File(_, b, _, _, print) => b.len() + print.as_ref().map_or(0, |(s, _)| s.len()),
            Out::Collect(_, v) => v.len() * 64,
        }
    }
}

/// Writes the printed lines to stdout. A closed stdout (e.g. `| head`)
/// ends the capture quietly.
pub(crate) fn print_lines(s: &mut String) -> Result<()> {
    if s.is_empty() {
        return Ok(());
    }
    let mut o = std::io::stdout().lock();
    let r = o.write_all(s.as_bytes()).and_then(|_| o.flush());
    s.clear();
    r.map_err(|e| CaptureError::Output {
        path: "stdout".into(),
        source: e,
    })
}

fn worker(
    mut src: Source,
    cpu: Option<usize>,
    mut out: Out,
    link: LinkType,
    shared: &Shared,
    snap: &Mutex<(u64, ThreadReport)>,
) -> Result<ThreadReport> {
    let r = worker_loop(&mut src, cpu, &mut out, link, shared, snap);
    if r.is_err() {
        // Let the other workers end too; the run reports the first error.
        shared.failed.store(true, Ordering::Relaxed);
    }
    r
}

fn worker_loop(
    src: &mut Source,
    cpu: Option<usize>,
    out: &mut Out,
    link: LinkType,
    shared: &Shared,
    snap: &Mutex<(u64, ThreadReport)>,
) -> Result<ThreadReport> {
    if let Some(c) = cpu {
        oskit::cpu::pin_this_thread(c).map_err(|e| CaptureError::Config(format!("--cpus: {e}")))?;
    }
    let cpu0 = sys::thread_cpu_time();
    let mut rep = ThreadReport {
        cpu,
        ..Default::default()
    };
    let mut seen_epoch = 0u64;
    let has_limit = shared.limit != u64::MAX;
    // Ring modes can leave a packet in place; recv has read it already.
    let in_ring = !src.reads_before_sink();
    // -U: one packet per batch, so each is written and synced on its own
    // (recv takes one per call anyway).
    let per_packet = matches!(out, Out::File(f, ..) if f.lock().is_ok_and(|g| g.packet_buffered));
    let encoding = match out {
        Out::File(f, ..) => f.lock().ok().map(|g| g.encoding),
        _ => None,
    };
    loop {
        if shared.stop.load(Ordering::Relaxed)
            || shared.failed.load(Ordering::Relaxed)
            || shared.taken.load(Ordering::Relaxed) >= shared.limit
        {
            break;
        }
        // Bounds how long a stop request or a report request waits.
        let mut timeout = Duration::from_millis(200);
        if let Some(d) = shared.deadline {
            let now = Instant::now();
            if now >= d {
                break;
            }
            timeout = timeout.min(d - now);
        }
        let mut beyond = 0u64;
        let mut bytes = 0u64;
        let n = src.next_batch(timeout, &mut |p: &PacketView<'_>| {
            // One call can hand over a whole ring of blocks: leave the rest
            // in the ring once a flush is due, so what is encoded but not
            // written stays bounded (a second Ctrl-C drops at most that).
            if in_ring && (out.pending() >= FLUSH_AT || (per_packet && out.pending() > 0)) {
                return Flow::Stop;
            }
            // Without -c there is nothing to share per packet.
            if has_limit && shared.taken.fetch_add(1, Ordering::Relaxed) >= shared.limit {
                beyond += 1;
                return Flow::Stop;
            }
            bytes += p.data.len() as u64;
            take(out, link, encoding.as_ref(), p);
            Flow::Continue
        })?;
        rep.captured += n as u64;
        rep.bytes += bytes;
        // In ring modes a declined packet stays in the ring; only recv has read it.
        if !in_ring {
            rep.beyond_limit += beyond;
        }
        // Every batch the kernel hands over goes to the file (a sync point
        // follows at the latest within a second; see FileOutput).
        out.flush()?;
        // -G with -W: the last file's time is up; the capture ends, as
        // tcpdump's does.
        if out.exhausted() {
            shared.stop.store(true, Ordering::Relaxed);
        }
        let e = shared.epoch.load(Ordering::Acquire);
        if e != seen_epoch {
            seen_epoch = e;
            fill_final(&mut rep, src, cpu0)?;
            if let Ok(mut g) = snap.lock() {
                *g = (e, rep.clone());
            }
        }
    }
    if shared.stop.load(Ordering::Relaxed) && !shared.failed.load(Ordering::Relaxed) {
        // Asked to stop: take what is already queued (including a partly
        // filled v3 block, visible after its retire timeout), so a stop after
        // the traffic leaves nothing uncounted; bounded for endless traffic,
        // written in FLUSH_AT steps, and cut short by a second signal.
        let until = Instant::now() + Duration::from_millis(500);
        let has_limit = shared.limit != u64::MAX;
        while !shared.abort.load(Ordering::Relaxed) {
            let n = src.next_batch(src.visibility_delay(), &mut |p: &PacketView<'_>| {
                if in_ring && out.pending() >= FLUSH_AT {
                    return Flow::Stop;
                }
                if has_limit && shared.taken.fetch_add(1, Ordering::Relaxed) >= shared.limit {
                    return Flow::Stop;
                }
                rep.bytes += p.data.len() as u64;
                take(out, link, encoding.as_ref(), p);
                Flow::Continue
            })?;
            rep.captured += n as u64;
            if out.pending() >= FLUSH_AT && !shared.abort.load(Ordering::Relaxed) {
                out.flush()?;
            }
            if n == 0 || Instant::now() >= until {
                break;
            }
        }
    }
    if shared.abort.load(Ordering::Relaxed) {
        rep.not_written = out.discard()?;
    }
    out.flush()?;
    fill_final(&mut rep, src, cpu0)?;
    Ok(rep)
}

/// Hands one packet to the output.
fn take(out: &mut Out, link: LinkType, encoding: Option<&Encoding>, p: &PacketView<'_>) {
    match out {
        Out::Count => {}
        Out::Summary(s, printer) => printer.line(s, link, p),
        Out::File(_, buf, packets, scratch, print) => {
            if let Some(e) = encoding {
                e.record(buf, p, scratch);
                *packets += 1;
            }
            if let Some((s, printer)) = print {
                printer.line(s, link, p);
            }
        }
        Out::Collect(_, v) => v.push(match p.cooked {
            Some(h) => OwnedPacket {
                ts_ns: p.ts_ns,
                wire_len: p.wire_len + h.len() as u32,
                data: [&h[..], p.data].concat(),
            },
            None => OwnedPacket {
                ts_ns: p.ts_ns,
                wire_len: p.wire_len,
                data: p.data.to_vec(),
            },
        }),
    }
}

fn fill_final(rep: &mut ThreadReport, src: &mut Source, cpu0: (Duration, Duration)) -> Result<()> {
    rep.kernel = src.kernel_stats()?;
    rep.malformed = src.malformed();
    rep.truncated = src.truncated();
    let (u, s) = sys::thread_cpu_time();
    rep.cpu_user = u.saturating_sub(cpu0.0);
    rep.cpu_sys = s.saturating_sub(cpu0.1);
    Ok(())
}

/// Convenience for other crates: capture on `iface` with `filter` for
/// `duration` (or until `count` packets) and return the statistics.
pub fn count_packets(iface: &str, filter: Option<&str>, limits: Limits, stop: Arc<AtomicBool>) -> Result<Report> {
    let mut cfg = CaptureConfig::new(iface);
    cfg.filter = filter.map(str::to_string);
    cfg.snaplen = 128;
    let cap = Capture::open(&cfg)?;
    let control = Control {
        stop,
        ..Control::default()
    };
    cap.run(limits, Sink::Count, &control, &mut |_| {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_totals_and_text() {
        let t = |c, d| ThreadReport {
            captured: c,
            bytes: c * 64,
            kernel: KernelStats {
                packets: c + d,
                drops: d,
                freeze_q_cnt: 0,
            },
            ..Default::default()
        };
        let r = Report {
            mode: Some(Mode::V3),
            threads: vec![t(10, 2), t(5, 0)],
            elapsed: Duration::from_secs(1),
            aborted: false,
        };
        assert_eq!(r.captured(), 15);
        assert_eq!(r.lost(), 2);
        let s = r.to_string();
        assert!(s.contains("thread 1"), "{s}");
        assert!(s.contains("total: captured 15 packets"), "{s}");
        assert!(s.contains("lost: 2 of 17"), "{s}");
        assert!(!s.contains("stopped at once"), "{s}");
        // Stopped at once: 4 encoded but not written, 3 still in the ring.
        let mut first = t(10, 2);
        first.not_written = 4;
        first.kernel.packets += 3;
        let r = Report {
            threads: vec![first],
            aborted: true,
            ..r
        };
        let s = r.to_string();
        assert!(
            s.contains("stopped at once: 4 captured packets not written, 3 left unread in the kernel; the output holds the other 6"),
            "{s}"
        );
    }

    #[test]
    fn unknown_interface_is_named() {
        let e = Capture::open(&CaptureConfig::new("nosuchif0")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no interface named 'nosuchif0' (list them with `ip link`)"
        );
    }
}
