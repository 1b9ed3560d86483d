//! A capture run: open the sockets (one per thread, joined in a fanout
//! group when there are several), then run one pinned worker per socket
//! until the count, the duration or a stop request, with exact accounting.
//!
//! What the run was asked is in `config`, the interface lookups in
//! `iface`, one worker's loop in `worker`, and the statistics and their
//! text in `report`; this module opens the sockets and runs and joins the
//! workers.

mod config;
mod iface;
mod report;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CaptureError, Result};
use crate::filter::{self, LinkType};
use crate::output::{Encoding, FileOutput, FooterStats};
use crate::print::Printer;
use crate::source::{self, Mode, Source, SourceConfig, Support};
use crate::sys;
use crate::xdp::{self, XdpProgram};

pub use config::{CaptureConfig, Control, Limits, OwnedPacket, Sink};
pub use iface::{iface_info, IfaceInfo};
pub use report::{Report, ThreadReport};
pub(crate) use worker::print_lines;
use worker::{worker, Out, Shared, FLUSH_AT};

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
        let probe = source::probe_modes(&source::default_candidates());
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
    fn unknown_interface_is_named() {
        let e = Capture::open(&CaptureConfig::new("nosuchif0")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no interface named 'nosuchif0' (list them with `ip link`)"
        );
    }
}
