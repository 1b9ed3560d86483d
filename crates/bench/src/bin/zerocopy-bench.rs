//! `zerocopy-bench`: paper 001's fig. 3 as far as this machine can show it:
//! send-side CPU per byte for copied sends against MSG_ZEROCOPY sends, UDP
//! with GSO (`UDP_SEGMENT`) from 4 KiB to 64 KiB per send, into a sink where
//! the packets leave without local delivery (a TC program on the sending
//! veth drops them, so completions come back uncopied, as a NIC's would).
#![deny(unsafe_code)]

use bench::lab::{VethLab, VethLabOptions, REFLECTOR_HOST};
use bench::thread_cpu;
use clap::Parser;
use oskit::procfs;
use sendpath::zerocopy::{Sent, ZeroCopySender};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::process::ExitCode;
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

/// The sender's address: the lab's first host (the host of the code
/// under test, here the send path).
const SENDER: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);
/// Where the datagrams go: the other end of the veth, whose MAC the
/// sender knows (a permanent neighbour entry), so every send leaves the
/// device, where the TC program drops it.
const SINK: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 2);

/// The lab: netlab's two-host veth lab ([`VethLab`]: named, recorded,
/// removed on drop and on Ctrl-C, swept after a killed run), the sender
/// in its first host, and the TC program that drops every packet on the
/// sender's device.
fn lab(stop: &AtomicBool) -> Result<VethLab, String> {
    let lab = VethLab::new(
        &VethLabOptions {
            name: "zerocopy-bench".into(),
            subnet: 96,
            reflector_cpus: None,
            netdev_backlog: None,
            rps_cpus: None,
            client_addresses: None,
            reflector_discard: vec![],
        },
        stop,
    )?;
    if (lab.reflector_ip, lab.client_ip) != (SENDER, SINK) {
        return Err(format!(
            "the lab's hosts are at {} and {}, not {SENDER} and {SINK}",
            lab.reflector_ip, lab.client_ip
        ));
    }
    let dev = lab.r_dev.as_str();
    // TC_ACT_SHOT (2) for every packet, in direct-action mode.
    let drop_all = "1,6 0 0 2,";
    lab.run_in(REFLECTOR_HOST, &["tc", "qdisc", "add", "dev", dev, "clsact"])?;
    let filter = [
        "tc", "filter", "add", "dev", dev, "egress", "bpf", "da", "bytecode", drop_all,
    ];
    lab.run_in(REFLECTOR_HOST, &filter)?;
    Ok(lab)
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
    let tx = UdpSocket::bind(SocketAddr::from((SENDER, 0))).map_err(|e| format!("bind: {e}"))?;
    sendpath::set_udp_segment(tx.as_fd(), 1400).map_err(|e| format!("UDP_SEGMENT: {e}"))?;
    let to = SocketAddr::from((SINK, 9));
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
    netlab::log::init_plain();
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
    let lab = match lab(&stop) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("zerocopy-bench: {e}");
            return ExitCode::from(if stop.load(Ordering::Relaxed) { 130 } else { 1 });
        }
    };
    let ns = match VethLab::ns(&lab.r) {
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
