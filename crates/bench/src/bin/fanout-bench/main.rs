//! `fanout-bench`: paper 000's grid (datagram size x receivers) over veth,
//! for the reflector's `sendto`, `sendmmsg` and `ebpf` backends and native
//! IP multicast, in one run.
//!
//! The figure is the saturation throughput of one measured CPU: all of an
//! implementation's work runs there (user-space backends pinned with
//! taskset, the veth's receive softirq, where the ebpf program and the
//! kernel's copies run, steered there with RPS), the sender runs on
//! another CPU and keeps the measured one busy, and the figure is copies
//! per busy second of the measured CPU, reported as ns per copy. Nothing is
//! subtracted: an earlier method subtracted a clients-only anchor from a
//! small busy-time signal and its figures did not survive a re-run (a
//! negative share at 100 B x 90 receivers). See [`METHOD`].
#![deny(unsafe_code)]

mod lab;
mod measure;
mod probe;
mod report;
mod stats;

use lab::{join_all, mcast_clients, port_of, raw_clients, Clients, Lab, MCAST, MCAST_PORT, MCAST_RCVBUF, REFLECTOR_IP};
use measure::{one_run, Place, Sample, BACKGROUND_MAX_PCT};
use report::{summarize, write_csv, Cell, Row};

use bench::grid::{reflector_impl, reflector_impls};
use bench::lab::REFLECTOR_HOST;
use bench::rawloop::SendMode;
use clap::{Parser, Subcommand};
use oskit::child::ChildGuard;
use reflector_proto::auth::Secret;
use reflector_server::receive::ReceiveKind;
use std::ffi::OsString;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method (saturation throughput of one measured CPU, nothing subtracted): the reflector \
(--threads 1) runs in one namespace, one sender and R receiver members (real tokens, two-step \
JOIN, DATA tags on, each member at an address of its own) in another, joined by a veth. Two \
CPUs: the sender runs on one (--sender-cpu); ALL of the implementation's work runs on the \
other, the measured CPU (--cpu): the reflector or relay process is pinned there (taskset), and \
RPS on both ends of the veth (rx-0/rps_cpus) steers their receive softirq there, so the \
reflector's socket receive, the ebpf backend's TC ingress program with its clones, and every \
copy's transmit run on the measured CPU; the sender's CPU keeps only the sending. The share of \
received packets that the measured CPU processed (softnet_stat) is printed per run as the \
evidence (on veth without RPS, the receive softirq would run on the sender's CPU). In a CPU \
phase every DATA copy is dropped at the reflector's egress veth by a counting TC program, the \
same for every implementation (its count is the figure's numerator). The sender keeps the \
measured CPU saturated without overrunning it: it sends as fast as it can while fewer than \
about 16,000 copies' worth of datagrams are in flight (sent minus counted copies / R), so no \
queue overflows and no work is spent on datagrams that are then dropped. After a 0.2 s \
warm-up a phase of --seconds is cut into 200 ms windows; in each, ns per copy = the measured \
CPU's busy time (wall time - idle time, idle from cpuidle's residency counters, us; softirq \
included) / copies counted, i.e. 1e9 / (copies per second / busy fraction). A figure is the \
lower quartile of its windows: other work (another process, the host taking the vCPU's core \
or its sibling thread) only ever adds busy time to a window, and on a virtual machine it comes \
and goes over seconds, so a whole repetition can run 20-40 % slow; the lower quartile is the \
cost in the least disturbed quarter of the time, not one lucky window. The busy fraction is printed (it should be >= 95 %), so is the sender's CPU's (the \
sender sleeps while its window is full, so below 100 % it kept up), and so is the measured CPU's \
busy fraction over 200 ms with nothing sent just before the phase (other work there is \
counted as the implementation's: a quiet machine is needed). After the phase the copies still \
in flight are counted and the total is checked against datagrams sent x R. The same windows are \
also given in clock-probe steps: just before and just after each phase two fixed pieces of \
user-space work (walks through a ring of indices in a fixed pseudo-random order, each step a load \
that waits for the one before) are timed on the measured CPU, 40 slices of 100,000 steps each, \
lower quartile: the clock probe's ring (16 KiB) stays in L1, so its ns per step follows the core's \
clock and the share of the core the vCPU gets; each window's ns per copy divided by the mean of its \
two readings is the copy's cost in clock-probe steps (a stand-in for cycles: this guest has no perf \
counters), and a cell's figure in steps is the lower quartile of those windows. The cache probe's \
ring (256 KiB) fits L2 but not L1: its ns per step rises when others evict the core's L2, which \
slows the kernel's per-packet work too; it is printed as a diagnostic. IP multicast, the physical \
reference for in-kernel replication: a relay pinned to the measured CPU receives each \
datagram and sends it once to a group the R receivers joined; the clients' namespace's \
kernel makes one copy per receiver socket, in the softirq of the measured CPU too (the relay \
sends from there and RPS on the clients' end points there). In its CPU phase the receivers' \
buffers are set to the minimum and nobody reads, so each copy is made, offered to its socket \
and freed there (counted as a UDP receive-buffer drop in the clients' namespace: the figure's \
numerator), as each ebpf copy is made, transmitted and freed by the sink. The raw loop \
(--impls raw-loop; reflector-bench's anchor, the cheapest user-space reflector there is): a \
process pinned to the measured CPU receives each datagram and sends it with one blocking sendto \
per receiver, no protocol and no checks; its copies meet the same sink. Two floors for the \
sendmmsg backend, run the same way: raw-mmsg receives with recvmmsg (32 per call) and sends \
each datagram to every receiver with one sendmmsg, which is what the sendmmsg backend does \
without the reflector around it; raw-mmsg-batch sends every copy of a received batch with \
one sendmmsg (up to 1,024 messages per call), the most a user-space sender can batch. With \
--interleave every implementation but multicast is started once per cell, each on its own port, \
and stays up while the others take their turns (an idle one sleeps; the ebpf backend's ingress \
program, while it is up, also sees the other implementations' datagrams and passes them at its \
port check), so the repetitions of all of them follow each other within seconds. Each repetition \
runs every implementation once, in turn (drift in background load hits them alike); a cell's \
figure is the lower quartile of the windows of its --repeat repetitions, printed with each \
repetition's own figure and their spread (max - min, % of the cell's figure). Ratios (sendto/ebpf, ebpf/multicast, sendmmsg/sendto, \
sendmmsg/raw-loop) \
are ratios of these ns per copy in one run. A reflector implementation named with a group mode, \
IMPL:instance or IMPL:sealed, runs with --data-instance on or --data-sealed on (which announces the \
instance flag too): the same datagrams, the group announced clear or sealed (bench/sealed.sh). Delivery phases (paced, --copies-per-s) count what \
the receivers get: throughput and loss.";

/// Set by Ctrl-C or SIGTERM: the run stops and the lab is removed.
static STOP: AtomicBool = AtomicBool::new(false);

fn stopped() -> Result<(), String> {
    if STOP.load(Relaxed) {
        return Err("interrupted".into());
    }
    Ok(())
}

#[derive(Parser)]
#[command(
    name = "fanout-bench",
    version,
    about = "In-kernel fan-out benchmark: paper 000's grid over veth, sendto/sendmmsg/ebpf vs native IP multicast",
    long_about = "Reproduces paper 000's measurement grid (50, 100, 500, 1000 B x 3, 30, 60, 90 receivers, \
        and 256) over a veth lab for the reflector's sendto, sendmmsg and ebpf backends and native IP \
        multicast, in one run. Reports ns of CPU per copy: the saturation throughput of one measured \
        CPU that carries all of the implementation's work (the process pinned there, the veth's receive \
        softirq steered there with RPS), copies per busy second, nothing subtracted; each repetition's \
        figure and the spread per cell; delivery throughput and loss; writes a CSV. The default grid \
        with 3 repetitions takes about 12 minutes. Needs root (namespaces, BPF, RPS) and 2 CPUs, and \
        the release `reflector` binary next to this one (`make bench` builds both).",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    args: Args,
}

#[derive(Subcommand)]
enum Cmd {
    /// The IP multicast anchor, run by the benchmark: recv, send once to the group.
    #[command(hide = true)]
    McastRelay {
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long)]
        group: SocketAddrV4,
        #[arg(long)]
        ifaddr: Ipv4Addr,
    },
    /// The raw-loop anchor, run by the benchmark: recv, then one blocking
    /// sendto per receiver (the same loop as reflector-bench's); with
    /// `--send mmsg` or `mmsg-batch`, the batched floors.
    #[command(hide = true)]
    RawLoop(bench::rawloop::Args),
}

#[derive(clap::Args)]
struct Args {
    /// Datagram sizes, bytes of UDP payload (our 32-byte DATA header included).
    #[arg(long, default_value = "50,100,500,1000", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Receiver counts.
    #[arg(long, default_value = "3,30,60,90,256", value_delimiter = ',')]
    receivers: Vec<usize>,
    /// Implementations: sendto, sendmmsg, ebpf (the reflector's --backend),
    /// each also as BACKEND+RECEIVE for another --receive than recvmmsg (e.g.
    /// sendmmsg+io-uring), multicast, raw-loop (the anchor of reflector-bench:
    /// recv, then one sendto per receiver), raw-mmsg (recvmmsg, then one
    /// sendmmsg per datagram: the sendmmsg backend without the reflector)
    /// and raw-mmsg-batch (one sendmmsg per received batch). A reflector
    /// implementation may end in a group mode, `:instance` (`--data-instance
    /// on`) or `:sealed` (`--data-sealed on`): the same traffic, the group
    /// announced clear with instance ids or sealed.
    #[arg(
        long,
        default_value = "raw-loop,sendto,sendmmsg,ebpf,multicast",
        value_delimiter = ','
    )]
    impls: Vec<String>,
    /// Seconds measured per CPU phase (after a 0.2 s warm-up), cut into 200 ms windows.
    #[arg(long, default_value_t = 1.2)]
    seconds: f64,
    /// Start every implementation but multicast once per cell and keep them
    /// up, each on its own port, so that their repetitions take turns within
    /// seconds of each other (slow periods of the host then hit them alike)
    /// instead of each being started and stopped for its turn.
    #[arg(long)]
    interleave: bool,
    /// Seconds per delivery phase (paced at --copies-per-s; 0: no delivery phases).
    #[arg(long, default_value_t = 0.4)]
    delivery_seconds: f64,
    /// Copies per second of the delivery phases (the datagram rate is this /
    /// receivers, at most 50,000/s). CPU phases are not paced: they saturate
    /// the measured CPU.
    #[arg(long, default_value_t = 120_000)]
    copies_per_s: u64,
    /// Repetitions per (cell, implementation), interleaved; figures are medians.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// The measured CPU: the implementation is pinned there and the veth's
    /// receive softirq steered there (default: the last CPU this process may use).
    #[arg(long)]
    cpu: Option<usize>,
    /// The sender's CPU (default: another CPU this process may use).
    #[arg(long)]
    sender_cpu: Option<usize>,
    /// Diagnostic: leave RPS off, to see where the veth's receive softirq
    /// lands without it (the figures are then not the method's).
    #[arg(long)]
    no_rps: bool,
    /// Summary CSV.
    #[arg(long, default_value = "bench/results/fanout.csv")]
    out: PathBuf,
    /// The reflector binary (default: `reflector` next to this executable).
    #[arg(long)]
    reflector: Option<PathBuf>,
}

fn main() -> ExitCode {
    netlab::log::init_plain();
    let cli = Cli::parse();
    let r = match cli.command {
        Some(Cmd::McastRelay { bind, group, ifaddr }) => mcast_relay(bind, group, ifaddr),
        Some(Cmd::RawLoop(r)) => bench::rawloop::run(&r).map(|_| ()).map_err(|e| e.to_string()),
        None => bench(cli.args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fanout-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The multicast anchor's relay: each datagram once to the group.
fn mcast_relay(bind: SocketAddr, group: SocketAddrV4, ifaddr: Ipv4Addr) -> Result<(), String> {
    let s = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    oskit::sockopt::set_buffers(&s, 4 << 20, 4 << 20).map_err(|e| e.to_string())?;
    nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::IpMulticastLoop, &false).map_err(|e| e.to_string())?;
    let out = UdpSocket::bind(SocketAddr::from((ifaddr, 0))).map_err(|e| e.to_string())?;
    out.set_multicast_loop_v4(false).map_err(|e| e.to_string())?;
    // Bound: the benchmark may send.
    println!("ready");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65536];
    loop {
        let n = s.recv(&mut buf).map_err(|e| e.to_string())?;
        // A full queue is waited out, as the reflector does (no loss at the sender).
        while let Err(e) = out.send_to(&buf[..n], group) {
            if e.raw_os_error() != Some(libc::ENOBUFS) && e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(format!("send to {group}: {e}"));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// A reflector implementation's group mode: what its JOIN_ACK announces.
/// The reflector never reads a sealed payload, so the same datagrams go
/// through either (the sealed-traffic benchmark compares the two).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum GroupMode {
    /// The default: no instance ids, nothing sealed.
    Plain,
    /// `--data-instance on`: clear, with the instance flag a sealed group has too.
    Instance,
    /// `--data-sealed on`: sealed (with the instance flag).
    Sealed,
}

/// `imp` without its group mode suffix, and the mode.
fn group_mode(imp: &str) -> (&str, GroupMode) {
    if let Some(base) = imp.strip_suffix(":sealed") {
        (base, GroupMode::Sealed)
    } else if let Some(base) = imp.strip_suffix(":instance") {
        (base, GroupMode::Instance)
    } else {
        (imp, GroupMode::Plain)
    }
}

/// The implementation under test, started in the reflector's namespace on
/// `port`. `to`: the receivers' addresses, for the raw loop.
fn start_impl(
    at: &Place,
    imp: &str,
    reflector: &PathBuf,
    secret_file: &PathBuf,
    to: &[SocketAddr],
    port: u16,
) -> Result<ChildGuard, String> {
    // The command line; the lab's launcher starts it in the reflector's
    // host, pinned to the measured CPU (the host's CPU set) from its first
    // instruction, every thread.
    let mut argv: Vec<OsString> = Vec::new();
    let floor = SendMode::of_impl(imp);
    let relay = imp == "multicast" || floor.is_some();
    if let Some(mode) = floor {
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let to: Vec<String> = to.iter().map(ToString::to_string).collect();
        argv.push(me.into());
        argv.extend(
            [
                "raw-loop",
                "--send",
                mode.arg(),
                "--bind",
                &format!("{REFLECTOR_IP}:{port}"),
                "--to",
                &to.join(","),
                // The reflector's buffers (--rcvbuf, --sndbuf below).
                "--bufsize",
                "8388608",
            ]
            .map(OsString::from),
        );
    } else if imp == "multicast" {
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        argv.push(me.into());
        argv.extend(
            [
                "mcast-relay",
                "--bind",
                &format!("{REFLECTOR_IP}:{port}"),
                "--group",
                &format!("{MCAST}:{MCAST_PORT}"),
                "--ifaddr",
                &REFLECTOR_IP.to_string(),
            ]
            .map(OsString::from),
        );
    } else {
        let (base, mode) = group_mode(imp);
        let (backend, receive) = reflector_impl(base).ok_or_else(|| format!("unknown implementation '{imp}'"))?;
        argv.push(reflector.into());
        argv.extend(
            [
                "serve",
                "--bind",
                &REFLECTOR_IP.to_string(),
                "--ports",
                &port.to_string(),
                "--backend",
                backend.name(),
                "--strict-backend",
                "--threads",
                "1",
                "--max-per-ip",
                "1000",
                "--max-members",
                "1024",
                "--member-rate-pps",
                "0",
                "--member-rate-bytes",
                "0",
                "--member-timeout",
                "10m",
                "--rcvbuf",
                "8388608",
                "--sndbuf",
                "8388608",
            ]
            .map(OsString::from),
        );
        argv.push("--secret-file".into());
        argv.push(secret_file.into());
        // Only when not the default, so that a reflector built before
        // `--receive` existed can still be measured (--reflector, A/B runs).
        if receive != ReceiveKind::default() {
            argv.extend(["--receive", receive.name()].map(OsString::from));
        }
        match mode {
            GroupMode::Plain => {}
            GroupMode::Instance => argv.extend(["--data-instance", "on"].map(OsString::from)),
            GroupMode::Sealed => argv.extend(["--data-sealed", "on"].map(OsString::from)),
        }
    }
    // The relays say when they are bound (the raw loop prints its address);
    // the reflector is ready when the JOINs (which retry) are answered.
    let mut child = at
        .lab
        .veth
        .launcher()
        .command(REFLECTOR_HOST, &argv)
        .map_err(|e| format!("cannot start {imp}: {e}"))?
        .stdout(if relay { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {imp}: {e}"))?;
    if let Some(out) = child.stdout.take() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).map_err(|e| e.to_string())?;
        let started = if floor.is_some() {
            line.trim().parse::<SocketAddr>().is_ok()
        } else {
            line.trim() == "ready"
        };
        if !started {
            return Err(format!("the {imp} relay did not start"));
        }
    }
    Ok(ChildGuard::new(child))
}

/// Starts implementation `imp` on `port` and makes its clients: members
/// joined with real tokens (reflector backends), the raw loops' receivers
/// (told to the loop at start), or multicast group members.
fn start_with_clients(
    at: &Place,
    imp: &str,
    reflector: &PathBuf,
    secret_file: &PathBuf,
    secret: &Secret,
    receivers: usize,
    port: u16,
) -> Result<(ChildGuard, Clients), String> {
    let lab = at.lab;
    // The raw loops are told their receivers' addresses at start.
    let raw = SendMode::of_impl(imp)
        .map(|_| raw_clients(lab, receivers, port))
        .transpose()?;
    let to = raw.as_ref().map_or(Ok(Vec::new()), |c| {
        c.receivers
            .iter()
            .map(UdpSocket::local_addr)
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(|e| e.to_string())
    })?;
    let child = start_impl(at, imp, reflector, secret_file, &to, port)?;
    let cl = match raw {
        Some(c) => c,
        None if imp == "multicast" => mcast_clients(lab, receivers, MCAST_RCVBUF, port)?,
        None => join_all(lab, secret, receivers, port)?,
    };
    Ok((child, cl))
}

fn bench(a: Args) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root (namespaces, BPF programs): run with sudo".into());
    }
    for i in &a.impls {
        if i != "multicast" && SendMode::of_impl(i).is_none() && reflector_impl(group_mode(i).0).is_none() {
            return Err(format!(
                "unknown implementation '{i}': choose from {} (each also with :instance or :sealed), multicast, raw-loop, raw-mmsg, raw-mmsg-batch",
                reflector_impls().join(", ")
            ));
        }
    }
    if let Some(r) = a.receivers.iter().find(|&&r| r == 0 || r > 1023) {
        return Err(format!(
            "--receivers {r}: each count must be in 1..=1023 (the reflector runs with --max-members 1024)"
        ));
    }
    if !(a.seconds > 0.0 && a.seconds <= 60.0) || a.repeat == 0 {
        return Err("--seconds must be in (0, 60] and --repeat at least 1".into());
    }
    let reflector = match &a.reflector {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("reflector"),
    };
    if !reflector.is_file() {
        return Err(format!(
            "{} not found: `make bench` builds the release binaries (or pass --reflector)",
            reflector.display()
        ));
    }
    let dir = std::env::temp_dir().join(format!("fanout-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut key = [0u8; 32];
    getrandom(&mut key)?;
    let secret = Secret::new(&key).map_err(|e| e.to_string())?;
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, key.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .map_err(|e| e.to_string())?;
    let flag = oskit::signal::flag_on(&[libc::SIGINT, libc::SIGTERM], oskit::signal::Second::Ignore)
        .map_err(|e| format!("cannot handle signals: {e}"))?;
    std::thread::spawn(move || loop {
        if flag.load(Relaxed) {
            STOP.store(true, Relaxed);
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    });
    let allowed = oskit::cpu::allowed_cpus();
    let cpu = match a.cpu {
        Some(c) if allowed.contains(&c) => c,
        Some(c) => return Err(format!("--cpu {c}: this process may run on CPUs {allowed:?} only")),
        None => *allowed.last().ok_or("cannot read this process's CPU affinity")?,
    };
    let sender_cpu = match a.sender_cpu {
        Some(c) if allowed.contains(&c) && c != cpu => c,
        Some(c) => {
            return Err(format!(
                "--sender-cpu {c}: must be one of CPUs {allowed:?} (this process's) and not the measured CPU {cpu}"
            ))
        }
        None => allowed
            .iter()
            .copied()
            .find(|&c| c != cpu)
            .ok_or("needs 2 CPUs: one for the sender, one measured")?,
    };
    oskit::cpu::pin_this_thread(sender_cpu).map_err(|e| format!("cannot pin to CPU {sender_cpu}: {e}"))?;
    // The sender's short sleeps while its window is full end on time (the
    // default slack is 50 us).
    let _ = nix::sys::prctl::set_timerslack(1_000);
    let members = a.receivers.iter().max().map_or(0, |r| r + 1);
    let lab_start = Instant::now();
    let lab = Lab::new(members, cpu, !a.no_rps, &STOP)?;
    eprintln!(
        "lab for {members} members up in {:.2} s",
        lab_start.elapsed().as_secs_f64()
    );
    let probe = probe::Probe::new();
    let at = Place {
        lab: &lab,
        cpu,
        sender_cpu,
        probe: &probe,
    };
    eprintln!("{METHOD}\n");
    eprintln!(
        "measured CPU: {cpu}; sender's CPU: {sender_cpu}; RPS: {}\n",
        if a.no_rps {
            "off (--no-rps: diagnostic, not the method)".to_string()
        } else {
            format!("both veth ends steered to CPU {cpu}")
        }
    );
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut noisy = 0.0f64;
    for &size in &a.sizes {
        for &receivers in &a.receivers {
            let rate = (a.copies_per_s / receivers as u64).clamp(100, 50_000);
            let mut runs: Vec<Vec<Sample>> = vec![Vec::new(); a.impls.len()];
            // With --interleave every implementation but multicast is started
            // once for the cell and stays up; its repetitions take turns with
            // the others'.
            let mut live: Vec<Option<(ChildGuard, Clients)>> = Vec::new();
            for (k, imp) in a.impls.iter().enumerate() {
                live.push(if a.interleave && imp != "multicast" {
                    Some(start_with_clients(
                        &at,
                        imp,
                        &reflector,
                        &secret_file,
                        &secret,
                        receivers,
                        port_of(k),
                    )?)
                } else {
                    None
                });
            }
            for _ in 0..a.repeat {
                for (k, (imp, samples)) in a.impls.iter().zip(&mut runs).enumerate() {
                    stopped()?;
                    let mcast = imp == "multicast";
                    let run = match live[k].as_mut() {
                        Some((_, cl)) => one_run(&at, cl, size, rate, &a, mcast)?,
                        None => {
                            let (mut child, mut cl) =
                                start_with_clients(&at, imp, &reflector, &secret_file, &secret, receivers, port_of(k))?;
                            let run = one_run(&at, &mut cl, size, rate, &a, mcast)?;
                            child.stop();
                            run
                        }
                    };
                    let c = &run.cpu;
                    eprintln!(
                        "  rep {}/{}: {size} B x {receivers} {imp}: {:.1} ns/copy ({:.3} M copies/s; measured CPU {:.1} % busy, {:.1} % before the phase; sender's CPU {:.1} % busy; copies sent on the measured CPU {}; packets received there, machine-wide {:.1} %; clock probe {:.3} ns/step, {:.1} steps/copy; cache probe {:.3} ns/step{})",
                        samples.len() + 1,
                        a.repeat,
                        c.ns_per_copy,
                        c.copies_per_s / 1e6,
                        c.busy_pct,
                        c.background_pct,
                        c.sender_busy_pct,
                        if c.copies_on_measured_pct.is_nan() {
                            "n/a".to_string()
                        } else {
                            format!("{:.1} %", c.copies_on_measured_pct)
                        },
                        c.rx_on_measured_pct,
                        c.probe_ns,
                        c.ns_per_copy / c.probe_ns,
                        c.cache_probe_ns,
                        if c.stalls > 0 {
                            format!(", {} stalls: datagrams lost on the way", c.stalls)
                        } else {
                            String::new()
                        }
                    );
                    samples.push(run);
                }
            }
            for (mut child, _) in live.into_iter().flatten() {
                child.stop();
            }
            for (imp, samples) in a.impls.iter().zip(runs) {
                let cell = Cell::of(&samples);
                let expected = cell.sent * receivers as u64;
                eprintln!(
                    "{size:5} B x {receivers:3} {imp:9}: {:7.1} ns/copy (runs {}; spread {:.1} %), {:.1} clock-probe steps/copy (runs {}; spread {:.1} %), cache probe {:.2}-{:.2} ns/step, measured CPU {:.1} % busy; delivery {:.0} copies/s, lost {}",
                    cell.ns_per_copy,
                    cell.runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", "),
                    cell.spread_pct(),
                    cell.steps_per_copy,
                    cell.step_runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", "),
                    cell.step_spread_pct(),
                    cell.cache_probe_ns.0,
                    cell.cache_probe_ns.1,
                    cell.busy_pct,
                    cell.delivered_per_s,
                    expected.saturating_sub(cell.delivered)
                );
                let (lo, hi) = cell.counted_vs_sent_pct;
                if !(99.0..=100.0).contains(&lo) || !(99.0..=100.0).contains(&hi) {
                    eprintln!(
                        "  warning: copies counted were {lo:.2}-{hi:.2} % of datagrams sent x receivers (expected 100 %): some were lost on the way or miscounted"
                    );
                }
                if cell.busy_pct < 95.0 {
                    eprintln!(
                        "  warning: the measured CPU was only {:.1} % busy: the sender did not saturate it, the figure includes idle-wake-up costs",
                        cell.busy_pct
                    );
                }
                if cell.background_pct > BACKGROUND_MAX_PCT {
                    noisy = noisy.max(cell.background_pct);
                }
                rows.push(Row {
                    size,
                    receivers,
                    imp: imp.clone(),
                    rate,
                    cell,
                    expected,
                });
            }
        }
    }
    drop(lab);
    let _ = std::fs::remove_dir_all(&dir);
    write_csv(&a.out, &rows)?;
    summarize(&rows);
    eprintln!("grid done in {:.0} s", t0.elapsed().as_secs_f64());
    if noisy > 0.0 {
        eprintln!(
            "warning: NOT A QUIET MACHINE: the measured CPU was up to {noisy:.0} % busy with nothing sent (other work); \
             it is counted as the implementation's, so these figures will not reproduce (background_pct in the CSV)"
        );
    }
    Ok(())
}

fn getrandom(buf: &mut [u8]) -> Result<(), String> {
    let mut f = std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?;
    std::io::Read::read_exact(&mut f, buf).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_mode_suffixes() {
        assert_eq!(group_mode("sendmmsg:sealed"), ("sendmmsg", GroupMode::Sealed));
        assert_eq!(group_mode("ebpf:instance"), ("ebpf", GroupMode::Instance));
        assert_eq!(group_mode("sendto"), ("sendto", GroupMode::Plain));
        // Only the last suffix is a mode; the base is looked up as it is.
        assert_eq!(group_mode("sendto:sealed:sealed"), ("sendto:sealed", GroupMode::Sealed));
        // The base names a reflector implementation as it would alone.
        assert!(reflector_impl(group_mode("sendmmsg:sealed").0).is_some());
        assert!(reflector_impl("sendmmsg:sealed").is_none());
    }
}
