//! `zerocopy-bench`: paper 001's fig. 3 as far as this machine can show it:
//! send-side CPU per byte for copied sends against MSG_ZEROCOPY sends, UDP
//! with GSO (`UDP_SEGMENT`) from 4 KiB to 64 KiB per send, into a sink where
//! the packets leave without local delivery (a TC program on the sending
//! veth drops them, so completions come back uncopied, as a NIC's would).
#![deny(unsafe_code)]

use bench::thread_cpu;
use clap::Parser;
use oskit::procfs;
use sendpath::zerocopy::{Sent, ZeroCopySender};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method: in a network namespace of its own, a UDP socket with UDP_SEGMENT (1400-byte segments) \
sends buffers of SIZE bytes as fast as it can for SECS seconds to an address behind a veth \
whose egress runs a TC classic-BPF program returning TC_ACT_SHOT: every packet is built, \
segmented and freed on the sending CPU, with no local delivery (which would copy the pages \
and make every zero-copy completion COPIED). copy: plain sends. zerocopy: MSG_ZEROCOPY on every \
send, a pool of 64 buffers held until their completions, the error queue read every 16 sends. \
uring: io_uring SEND_ZC from a pool of 64 registered buffers (pinned once), one submission \
(io_uring_enter) per send, completions reaped as slots are needed. \
CPU: the sending thread's user+sys time (getrusage RUSAGE_THREAD) and machine-wide busy time \
(/proc/stat), each per KiB sent; modes alternate within each repetition.";

#[derive(Parser)]
#[command(name = "zerocopy-bench", about = "Send-side CPU per byte: copied vs MSG_ZEROCOPY UDP sends with GSO", long_about = METHOD)]
struct Args {
    /// Bytes per send (each at most 65,000: a GSO send is one UDP datagram of at most 64 KiB).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192,16384,32768,65000")]
    sizes: Vec<usize>,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Repetitions (modes alternate within each).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// CSV output (every measurement).
    #[arg(long, default_value = "bench/results/zerocopy_runs.csv")]
    out: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Copy,
    ZeroCopy,
    Uring,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Copy => "copy",
            Mode::ZeroCopy => "zerocopy",
            Mode::Uring => "uring",
        }
    }
}

struct Lab {
    ns: String,
}

impl Lab {
    fn new() -> Result<Lab, String> {
        let lab = Lab {
            ns: format!("zcbench{}", std::process::id()),
        };
        let n = lab.ns.as_str();
        for args in [
            vec!["ip", "netns", "add", n],
            vec!["ip", "-n", n, "link", "add", "za", "type", "veth", "peer", "name", "zb"],
            vec!["ip", "-n", n, "addr", "add", "10.96.0.1/24", "dev", "za"],
            vec!["ip", "-n", n, "link", "set", "za", "up"],
            vec!["ip", "-n", n, "link", "set", "zb", "up"],
            vec![
                "ip",
                "-n",
                n,
                "neigh",
                "add",
                "10.96.0.2",
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                "za",
                "nud",
                "permanent",
            ],
            vec!["tc", "-n", n, "qdisc", "add", "dev", "za", "clsact"],
            // TC_ACT_SHOT (2) for every packet, in direct-action mode.
            vec![
                "tc",
                "-n",
                n,
                "filter",
                "add",
                "dev",
                "za",
                "egress",
                "bpf",
                "da",
                "bytecode",
                "1,6 0 0 2,",
            ],
        ] {
            let out = Command::new(args[0])
                .args(&args[1..])
                .output()
                .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
            if !out.status.success() {
                return Err(format!(
                    "{} failed: {} (needs root)",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
        }
        Ok(lab)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
    }
}

struct Run {
    bytes: u64,
    wall: Duration,
    thread_cpu: Duration,
    system_busy_s: f64,
    copied_sends: u64,
    completed_copied: u64,
}

fn measure(mode: Mode, size: usize, secs: f64, stop: &AtomicBool) -> Result<Run, String> {
    let tx = UdpSocket::bind("10.96.0.1:0").map_err(|e| format!("bind: {e}"))?;
    sendpath::set_udp_segment(tx.as_fd(), 1400).map_err(|e| format!("UDP_SEGMENT: {e}"))?;
    let to: SocketAddr = "10.96.0.2:9".parse().expect("a literal address");
    let mut uring = match mode {
        Mode::Uring => {
            tx.connect(to).map_err(|e| format!("connect: {e}"))?;
            Some(sendpath::UringZcSender::new(tx.as_fd(), 64, size).map_err(|e| format!("io_uring: {e}"))?)
        }
        _ => None,
    };
    let pool: Vec<Arc<[u8]>> = (0..64).map(|i| vec![i as u8; size].into()).collect();
    let mut zc = ZeroCopySender::new(tx.as_fd(), 0, 16 << 20);
    if mode == Mode::ZeroCopy {
        if let Some(why) = zc.zero_copy_off() {
            return Err(why.to_string());
        }
    }
    let hz = procfs::ticks_per_second() as f64;
    let sys0 = procfs::system_ticks().map_err(|e| e.to_string())?;
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let mut bytes = 0u64;
    let mut i = 0usize;
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        for _ in 0..64 {
            let buf = &pool[i % pool.len()];
            i += 1;
            let r = match mode {
                Mode::Copy => sendpath::send_flagged(tx.as_fd(), buf, to, false).map(|_| Sent::Copied),
                Mode::ZeroCopy => zc.send_to(tx.as_fd(), buf, to, |_| {}),
                Mode::Uring => {
                    let u = uring.as_mut().expect("made above for this mode");
                    match u.slot() {
                        Ok((i, _)) => u.send(i, size).map(|()| Sent::ZeroCopy),
                        Err(e) => Err(e),
                    }
                }
            };
            match r {
                Ok(_) => bytes += size as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) || e.kind() == std::io::ErrorKind::WouldBlock => {
                    let _ = sendpath::wait_writable(tx.as_fd(), 10);
                }
                Err(e) => return Err(format!("send: {e}")),
            }
        }
    }
    let wall = start.elapsed();
    let thread_cpu = thread_cpu().saturating_sub(cpu0);
    let sys = procfs::system_ticks().map_err(|e| e.to_string())?.since(&sys0);
    zc.drain(tx.as_fd(), Duration::from_secs(5), |_| {});
    let completed_copied = match uring.as_mut() {
        Some(u) => {
            u.drain(Duration::from_secs(5))
                .map_err(|e| format!("io_uring drain: {e}"))?;
            u.stats.completed_copied
        }
        None => zc.stats.completed_copied,
    };
    Ok(Run {
        bytes,
        wall,
        thread_cpu,
        system_busy_s: sys.busy as f64 / hz,
        copied_sends: zc.stats.copied_sends,
        completed_copied,
    })
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(s) = args.sizes.iter().find(|s| **s == 0 || **s > 65_000) {
        eprintln!("zerocopy-bench: --sizes {s}: each size must be 1 to 65000 bytes");
        return ExitCode::from(2);
    }
    let stop = Arc::new(AtomicBool::new(false));
    if let Err(e) = oskit::signal::set_on(&[oskit::signal::SIGINT, oskit::signal::SIGTERM], &stop) {
        eprintln!("zerocopy-bench: signals: {e}");
        return ExitCode::from(1);
    }
    let lab = match Lab::new() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zerocopy-bench: {e}");
            return ExitCode::from(1);
        }
    };
    let ns = match oskit::netns::NetNs::open(&lab.ns) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("zerocopy-bench: {e}");
            return ExitCode::from(1);
        }
    };
    let mut csv = String::from(
        "mode,size,rep,bytes,wall_s,thread_cpu_s,system_busy_s,thread_ns_per_kib,system_ns_per_kib,gbit_per_s,copied_sends,completed_copied\n",
    );
    for rep in 1..=args.reps {
        for &size in &args.sizes {
            for mode in [Mode::Copy, Mode::ZeroCopy, Mode::Uring] {
                if stop.load(Ordering::Relaxed) {
                    eprintln!("zerocopy-bench: interrupted; lab removed");
                    return ExitCode::from(130);
                }
                eprintln!(
                    "zerocopy-bench: repetition {rep}/{}, {size} bytes, {}",
                    args.reps,
                    mode.name()
                );
                let r = match ns.run(|| measure(mode, size, args.secs, &stop)) {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) | Err(oskit::SysError { call: e, .. }) => {
                        eprintln!("zerocopy-bench: {}: {e}", mode.name());
                        return ExitCode::from(1);
                    }
                };
                let kib = r.bytes as f64 / 1024.0;
                csv += &format!(
                    "{},{size},{rep},{},{:.4},{:.4},{:.4},{:.1},{:.1},{:.3},{},{}\n",
                    mode.name(),
                    r.bytes,
                    r.wall.as_secs_f64(),
                    r.thread_cpu.as_secs_f64(),
                    r.system_busy_s,
                    r.thread_cpu.as_secs_f64() * 1e9 / kib,
                    r.system_busy_s * 1e9 / kib,
                    r.bytes as f64 * 8.0 / r.wall.as_secs_f64() / 1e9,
                    r.copied_sends,
                    r.completed_copied,
                );
            }
        }
    }
    drop(lab);
    if let Err(e) = std::fs::write(&args.out, csv) {
        eprintln!("zerocopy-bench: cannot write {}: {e}", args.out);
        return ExitCode::from(1);
    }
    eprintln!("zerocopy-bench: wrote {}", args.out);
    ExitCode::SUCCESS
}
