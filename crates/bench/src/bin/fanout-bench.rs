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

use bench::grid::{reflector_impl, reflector_impls};
use bench::lab::{sh, VethLab};
use bench::sink::Sink;
use clap::{Parser, Subcommand};
use nix::sys::socket::{sendmmsg, MsgFlags, MultiHeaders, SockaddrIn};
use oskit::child::ChildGuard;
use oskit::netns::NetNs;
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::{self, Header, Kind, SessionKeys, DATA_PAYLOAD};
use reflector_server::receive::ReceiveKind;
use std::io::{IoSlice, Read as _, Seek as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
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
in flight are counted and the total is checked against datagrams sent x R. IP multicast, the physical \
reference for in-kernel replication: a relay pinned to the measured CPU receives each \
datagram and sends it once to a group the R receivers joined; the clients' namespace's \
kernel makes one copy per receiver socket, in the softirq of the measured CPU too (the relay \
sends from there and RPS on the clients' end points there). In its CPU phase the receivers' \
buffers are set to the minimum and nobody reads, so each copy is made, offered to its socket \
and freed there (counted as a UDP receive-buffer drop in the clients' namespace: the figure's \
numerator), as each ebpf copy is made, transmitted and freed by the sink. The raw loop \
(--impls raw-loop; reflector-bench's anchor, the cheapest user-space reflector there is): a \
process pinned to the measured CPU receives each datagram and sends it with one blocking sendto \
per receiver, no protocol and no checks; its copies meet the same sink. Each repetition \
runs every implementation once, in turn (drift in background load hits them alike); a cell's \
figure is the lower quartile of the windows of its --repeat repetitions, printed with each \
repetition's own figure and their spread (max - min, % of the cell's figure). Ratios (sendto/ebpf, ebpf/multicast, sendmmsg/sendto, \
sendmmsg/raw-loop) \
are ratios of these ns per copy in one run. Delivery phases (paced, --copies-per-s) count what \
the receivers get: throughput and loss.";

/// Set by Ctrl-C or SIGTERM: the run stops and the lab is removed.
static STOP: AtomicBool = AtomicBool::new(false);

fn stopped() -> Result<(), String> {
    if STOP.load(Relaxed) {
        return Err("interrupted".into());
    }
    Ok(())
}

const REFLECTOR_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 1);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 2);
/// Every member has an address of its own, as game clients do (so each copy
/// changes the destination address and its checksums, not only the port):
/// member `i`'s is 10.211.(i / 250).(1 + i % 250), routed over the veth.
const MEMBER_NET: &str = "10.211.0.0/16";

/// The MAC of the clients' end of the veth (`VethLab`'s, for subnet 210).
const CLIENT_MAC: &str = "02:52:46:00:d2:02";

fn member_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 211, (i / 250) as u8, (1 + i % 250) as u8)
}

/// Runs `ip -n NS -batch -` with `commands`, one per line.
fn ip_batch(ns: &str, commands: &str) -> Result<(), String> {
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("ip has no stdin")?
        .write_all(commands.as_bytes())
        .map_err(|e| format!("ip -batch: {e}"))?;
    let out = child.wait_with_output().map_err(|e| format!("ip -batch: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip -n {ns} -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}
const MCAST: Ipv4Addr = Ipv4Addr::new(239, 210, 0, 1);
const PORT: u16 = 4600;
const MCAST_PORT: u16 = 4601;

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
    /// sendto per receiver (the same loop as reflector-bench's).
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
    /// recv, then one sendto per receiver).
    #[arg(
        long,
        default_value = "raw-loop,sendto,sendmmsg,ebpf,multicast",
        value_delimiter = ','
    )]
    impls: Vec<String>,
    /// Seconds measured per CPU phase (after a 0.2 s warm-up), cut into 200 ms windows.
    #[arg(long, default_value_t = 1.2)]
    seconds: f64,
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
    let cli = Cli::parse();
    let r = match cli.command {
        Some(Cmd::McastRelay { bind, group, ifaddr }) => mcast_relay(bind, group, ifaddr),
        Some(Cmd::RawLoop(r)) => bench::rawloop::run(r.bind, &r.to, r.bufsize)
            .map(|_| ())
            .map_err(|e| e.to_string()),
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

/// The lab's namespaces and veth ([`VethLab`]), a device that frees what
/// the egress sink redirects to it, and the raised backlog (restored on
/// drop, before the namespaces go).
struct Lab {
    veth: VethLab,
    backlog: Option<String>,
}

const BACKLOG: &str = "/proc/sys/net/core/netdev_max_backlog";

impl Lab {
    /// The lab, with addresses for `members` members, and the receive
    /// softirq of both ends of the veth steered to CPU `rps` (RPS).
    fn new(members: usize, rps: Option<usize>) -> Result<Lab, String> {
        let veth = VethLab::new("fb", 210)?;
        let r = veth.r.clone();
        // Member addresses on the clients' side, a route and static
        // neighbours (the clients' MAC) on the reflector's.
        let mut on_c = String::new();
        let mut on_r = format!("route add {MEMBER_NET} dev vr\n");
        for i in 0..members {
            let ip = member_ip(i);
            on_c.push_str(&format!("addr add {ip}/32 dev vc\n"));
            on_r.push_str(&format!(
                "neigh replace {ip} lladdr {CLIENT_MAC} dev vr nud permanent\n"
            ));
        }
        ip_batch(&veth.c, &on_c)?;
        ip_batch(&r, &on_r)?;
        // Where the egress sink sends what it counted: a veth whose peer is
        // down, which frees it at once (this kernel has no dummy device).
        sh(&[
            "ip", "-n", &r, "link", "add", "sinkd", "type", "veth", "peer", "name", "sinkp",
        ])?;
        sh(&["ip", "-n", &r, "link", "set", "sinkd", "up"])?;
        // Every clone waits in the sending CPU's backlog: a 256-member group
        // overflows the default 1,000 (the setting lives in the initial
        // namespace only; restored on drop).
        if let Some(cpu) = rps {
            steer_rx(&r, "vr", cpu)?;
            steer_rx(&veth.c, "vc", cpu)?;
        }
        let old = std::fs::read_to_string(BACKLOG).map_err(|e| format!("{BACKLOG}: {e}"))?;
        std::fs::write(BACKLOG, "30000").map_err(|e| format!("{BACKLOG}: {e}"))?;
        Ok(Lab {
            veth,
            backlog: Some(old.trim().to_string()),
        })
    }

    fn ns(name: &str) -> Result<NetNs, String> {
        VethLab::ns(name)
    }
}

/// Steers the receive softirq of `dev` (in namespace `ns`) to `cpu` with
/// RPS, and reads the mask back. sysfs shows the devices of the namespace
/// that mounted it, hence `ip netns exec` (which mounts the namespace's own).
fn steer_rx(ns: &str, dev: &str, cpu: usize) -> Result<(), String> {
    if cpu >= 64 {
        return Err(format!("--cpu {cpu}: RPS steering here supports CPUs 0..63"));
    }
    let mask = format!("{:x}", 1u64 << cpu);
    let file = format!("/sys/class/net/{dev}/queues/rx-0/rps_cpus");
    sh(&["ip", "netns", "exec", ns, "sh", "-c", &format!("echo {mask} > {file}")])?;
    let o = Command::new("ip")
        .args(["netns", "exec", ns, "cat", &file])
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    let got = String::from_utf8_lossy(&o.stdout);
    let got = got.trim().replace(',', "");
    if u64::from_str_radix(&got, 16) != Ok(1u64 << cpu) {
        return Err(format!(
            "RPS on {dev}: wrote {mask} to {file}, read back '{got}' (a kernel without CONFIG_RPS?)"
        ));
    }
    Ok(())
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(b) = &self.backlog {
            let _ = std::fs::write(BACKLOG, b);
        }
    }
}

/// The sender member: its socket and session (none for multicast), where
/// it sends.
struct Sender {
    sock: UdpSocket,
    session: Option<Session>,
    to: SocketAddr,
    seq: u64,
}

/// One implementation's clients.
struct Clients {
    sender: Sender,
    receivers: Vec<UdpSocket>,
}

fn join_all(lab: &Lab, secret: &Secret, receivers: usize) -> Result<Clients, String> {
    let socks = member_sockets(lab, receivers)?;
    let to = SocketAddr::from((REFLECTOR_IP, PORT));
    let mut sessions = Vec::new();
    for (i, s) in socks.iter().enumerate() {
        let player = i as u32 + 1;
        let token = TokenClaims {
            player,
            reflector: 0,
            group: PORT,
            expires_unix_s: now_unix() + 3600,
        }
        .sign(secret);
        let req = JoinRequest {
            reflector: to,
            group: PORT,
            player,
            token,
            keys: SessionKeys::derive(secret, &token),
            first_seq: 1,
        };
        let cfg = ClientConfig {
            give_up: Some(Duration::from_secs(5)),
            ..ClientConfig::default()
        };
        let (session, _) = blocking::join(s, req, cfg).map_err(|e| format!("join of player {player}: {e:?}"))?;
        sessions.push(session);
    }
    let mut socks = socks.into_iter();
    let sock = socks.next().ok_or("no sender")?;
    Ok(Clients {
        sender: Sender {
            sock,
            session: sessions.into_iter().next(),
            to,
            seq: 0,
        },
        receivers: socks.collect(),
    })
}

/// The sender's socket and `receivers` more, each at a member address of
/// its own in the clients' namespace.
fn member_sockets(lab: &Lab, receivers: usize) -> Result<Vec<UdpSocket>, String> {
    Lab::ns(&lab.veth.c)?
        .run(|| {
            (0..=receivers)
                .map(|i| {
                    let s = UdpSocket::bind(SocketAddr::from((member_ip(i), 0)))?;
                    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20));
                    Ok(s)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The raw loop's clients: the same member sockets as [`join_all`]'s, no
/// JOIN (the loop has no membership); the sender's DATA is not sealed.
fn raw_clients(lab: &Lab, receivers: usize) -> Result<Clients, String> {
    let mut socks = member_sockets(lab, receivers)?.into_iter();
    let sock = socks.next().ok_or("no sender")?;
    Ok(Clients {
        sender: Sender {
            sock,
            session: None,
            to: SocketAddr::from((REFLECTOR_IP, PORT)),
            seq: 0,
        },
        receivers: socks.collect(),
    })
}

/// Receive buffer of a multicast receiver in delivery phases (they read
/// as the copies come; CPU phases shrink it to the minimum).
const MCAST_RCVBUF: usize = 2 << 20;

fn mcast_clients(lab: &Lab, receivers: usize, rcvbuf: usize) -> Result<Clients, String> {
    let c = Lab::ns(&lab.veth.c)?;
    let (sender, receivers) = c
        .run(|| -> std::io::Result<(UdpSocket, Vec<UdpSocket>)> {
            let sender = UdpSocket::bind(SocketAddr::from((CLIENT_IP, 0)))?;
            let mut rs = Vec::new();
            for _ in 0..receivers {
                let s = socket2_reuse(MCAST_PORT)?;
                s.join_multicast_v4(&MCAST, &CLIENT_IP)?;
                nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &rcvbuf)?;
                rs.push(s);
            }
            Ok((sender, rs))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(Clients {
        sender: Sender {
            sock: sender,
            session: None,
            to: SocketAddr::from((REFLECTOR_IP, PORT)),
            seq: 0,
        },
        receivers,
    })
}

/// A UDP socket on `port` that shares it with the other receivers (each
/// gets every multicast datagram).
fn socket2_reuse(port: u16) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::new(0, 0, 0, 0, port))?;
    Ok(UdpSocket::from(fd))
}

fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One DATA datagram of `size` bytes from the sender (sealed with its
/// session: tag and sequence, as a game client would).
fn next_datagram(tx: &mut Sender, size: usize, buf: &mut [u8], body: &[u8]) -> usize {
    match tx.session.as_mut() {
        Some(s) => s.seal_data(size - DATA_PAYLOAD, buf).and_then(Result::ok).unwrap_or(0),
        None => {
            tx.seq += 1;
            let h = Header {
                kind: Kind::Data,
                group: PORT,
                sender: 1,
                membership: 1,
                seq: tx.seq,
            };
            protocol::emit(&h, body, None, buf).unwrap_or(0)
        }
    }
}

/// Length of the windows a measured phase is cut into.
const WINDOW: Duration = Duration::from_millis(200);

/// Sends at `rate` datagrams/s for `secs`, calling `at_window` with the
/// count sent so far every [`WINDOW`] and at the end; returns how many
/// were sent.
fn send_paced(tx: &mut Sender, size: usize, rate: u64, secs: f64, mut at_window: impl FnMut(u64)) -> u64 {
    let size = size.max(DATA_PAYLOAD);
    let mut buf = vec![0x5au8; size];
    // The multicast sender's DATA payload (its tag field is left zero).
    let body = vec![0x5au8; size - DATA_PAYLOAD];
    let start = Instant::now();
    let total = (rate as f64 * secs) as u64;
    let mut sent = 0u64;
    // A sender that cannot send at all must not hang the benchmark.
    let deadline = start + Duration::from_secs_f64(secs * 3.0 + 2.0);
    let mut next_window = start + WINDOW;
    while sent < total && Instant::now() < deadline && !STOP.load(Relaxed) {
        if Instant::now() >= next_window {
            at_window(sent);
            next_window += WINDOW;
        }
        // Datagrams due by now, sent as a burst every millisecond.
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        while sent < due {
            let n = next_datagram(tx, size, &mut buf, &body);
            if n == 0 {
                eprintln!("fanout-bench: cannot build a {size}-byte DATA datagram");
                return sent;
            }
            match tx.sock.send_to(&buf[..n], tx.to) {
                Ok(_) => sent += 1,
                Err(_) => std::thread::sleep(Duration::from_micros(100)),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    at_window(sent);
    sent
}

/// Counts what the receivers get until `stop`, then until quiet.
fn drain_receivers(rs: &[UdpSocket], stop: &AtomicBool, got: &AtomicU64) {
    for r in rs {
        let _ = r.set_nonblocking(true);
    }
    let mut buf = [0u8; 2048];
    let mut quiet_since: Option<Instant> = None;
    loop {
        let mut any = false;
        for r in rs {
            while r.recv(&mut buf).is_ok() {
                got.fetch_add(1, Relaxed);
                any = true;
            }
        }
        if any {
            quiet_since = None;
        } else if stop.load(Relaxed) {
            let q = *quiet_since.get_or_insert_with(Instant::now);
            if q.elapsed() > Duration::from_millis(300) {
                return;
            }
        }
        if !any {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// One repetition of one (cell, implementation).
#[derive(Debug, Clone, Default)]
struct Sample {
    /// Delivery phase: datagrams sent, copies the receivers got, copies/s.
    sent: u64,
    delivered: u64,
    copies_per_s: f64,
    /// CPU phase.
    cpu: CpuPhase,
}

/// What a CPU phase measured.
#[derive(Debug, Clone, Default)]
struct CpuPhase {
    /// Busy ns of the measured CPU per copy, the lower quartile of the
    /// windows (see [`cost_of`]).
    ns_per_copy: f64,
    /// Each window's busy ns per copy, in time order.
    windows: Vec<f64>,
    /// The measured CPU's busy fraction, %, the median window.
    busy_pct: f64,
    /// The sender's CPU's busy fraction, %, the median window (the sender
    /// sleeps while its window is full: below 100 it kept up with the
    /// measured CPU; the fan-out there would show as a jump).
    sender_busy_pct: f64,
    /// Copies per second over the measured windows (the saturation throughput).
    copies_per_s: f64,
    /// Copies counted over the measured windows.
    copies: u64,
    /// Of the packets that CPUs' receive backlogs processed during the
    /// measured windows, the share the measured CPU processed, %.
    rx_on_measured_pct: f64,
    /// Of the copies the sink counted, the share whose transmit ran on the
    /// measured CPU, % (NaN for multicast, whose copies the sink does not see).
    copies_on_measured_pct: f64,
    /// The measured CPU's busy fraction just before the phase, with nothing
    /// sent, %: work that is not ours (a quiet machine shows ~0).
    background_pct: f64,
    /// Copies counted over the whole phase, warm-up and the tail in flight
    /// included, per copy the datagrams sent should make (sent x R), %:
    /// 100 (multicast: a hair under, the few copies left in the receivers'
    /// buffers); below, copies were lost on the way; above, miscounted.
    counted_vs_sent_pct: f64,
    /// Times the sender found nothing counted for a while with its window
    /// full and sent on (datagrams lost on the way: a queue overflowed).
    stalls: u64,
}

/// Where the run happens: the lab, the measured CPU (the implementation is
/// pinned there and the veth's receive softirq steered there) and the
/// sender's CPU (the calling thread is pinned there, and the receivers'
/// reading in delivery phases runs there too).
struct Place<'a> {
    lab: &'a Lab,
    cpu: usize,
    sender_cpu: usize,
}

/// One (cell, implementation) run: a delivery phase (paced; what the
/// receivers get), then a CPU phase (saturated; copies counted by the
/// egress sink, for multicast as receive-buffer drops at the receivers).
fn one_run(at: &Place, cl: &mut Clients, size: usize, rate: u64, a: &Args, mcast: bool) -> Result<Sample, String> {
    let lab = at.lab;
    let (mut sent, mut delivered) = (0, 0);
    if a.delivery_seconds > 0.0 {
        let stop = AtomicBool::new(false);
        let got = AtomicU64::new(0);
        let (tx, receivers) = (&mut cl.sender, &cl.receivers);
        sent = std::thread::scope(|s| {
            let h = s.spawn(|| {
                let _ = oskit::cpu::pin_this_thread(at.sender_cpu);
                drain_receivers(receivers, &stop, &got)
            });
            let sent = send_paced(tx, size, rate, a.delivery_seconds, |_| {});
            stop.store(true, Relaxed);
            let _ = h.join();
            sent
        });
        delivered = got.load(Relaxed);
    }
    let copies_per_s = delivered as f64 / a.delivery_seconds.max(1e-9);
    let r = cl.receivers.len();
    let cpu = if mcast {
        // The copies are offered to receive buffers of the minimum size that
        // nobody reads: each is made and freed in the clients' namespace,
        // counted there as a receive-buffer drop.
        for s in &cl.receivers {
            nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::RcvBuf, &1).map_err(|e| e.to_string())?;
        }
        let snmp = Lab::ns(&lab.veth.c)?
            .run(|| std::fs::File::open("/proc/thread-self/net/snmp"))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("/proc/net/snmp of the clients' namespace: {e}"))?;
        measured_phase(at, &mut cl.sender, size, r, a.seconds, &mut Copies::Drops(snmp))?
    } else {
        let rns = Lab::ns(&lab.veth.r)?;
        let sink = rns
            .run(|| Sink::attach("vr", Some("sinkd")))
            .map_err(|e| e.to_string())??;
        measured_phase(at, &mut cl.sender, size, r, a.seconds, &mut Copies::Sink(&sink))?
    };
    Ok(Sample {
        sent,
        delivered,
        copies_per_s,
        cpu,
    })
}

/// What counts the copies of a CPU phase.
enum Copies<'a> {
    /// The counting sink at the reflector's egress.
    Sink(&'a Sink),
    /// UDP receive-buffer drops in the clients' namespace (multicast):
    /// its `/proc/net/snmp`, open.
    Drops(std::fs::File),
}

impl Copies<'_> {
    /// Copies so far (a running total).
    fn total(&mut self) -> Result<u64, String> {
        match self {
            Copies::Sink(s) => Ok(s.count()),
            Copies::Drops(f) => udp_rcvbuf_errors(f),
        }
    }

    /// Copies so far per CPU, where the counter knows it.
    fn per_cpu(&self) -> Option<Vec<u64>> {
        match self {
            Copies::Sink(s) => Some(s.count_per_cpu()),
            Copies::Drops(_) => None,
        }
    }
}

/// `Udp: RcvbufErrors` from an open `/proc/net/snmp` (of the namespace
/// that opened it).
fn udp_rcvbuf_errors(f: &mut std::fs::File) -> Result<u64, String> {
    let mut text = String::new();
    f.rewind().map_err(|e| format!("/proc/net/snmp: {e}"))?;
    f.read_to_string(&mut text)
        .map_err(|e| format!("/proc/net/snmp: {e}"))?;
    parse_udp_rcvbuf_errors(&text)
}

/// `Udp: RcvbufErrors` from the text of `/proc/net/snmp` (a line of names,
/// then a line of values).
fn parse_udp_rcvbuf_errors(text: &str) -> Result<u64, String> {
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next(), udp.next());
    let (Some(names), Some(values)) = (names, values) else {
        return Err("/proc/net/snmp has no Udp lines".into());
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "RcvbufErrors")
        .and_then(|(_, v)| v.parse().ok())
        .ok_or_else(|| "/proc/net/snmp has no Udp RcvbufErrors".into())
}

/// Packets each CPU's receive backlog has processed so far
/// (`/proc/net/softnet_stat`).
fn softnet_processed() -> Result<Vec<(usize, u64)>, String> {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").map_err(|e| format!("/proc/net/softnet_stat: {e}"))?;
    parse_softnet_processed(&text)
}

/// (CPU, processed) per line of `/proc/net/softnet_stat`: the first field,
/// the CPU number from the 13th where the kernel gives it, else the line's
/// position; hexadecimal.
fn parse_softnet_processed(text: &str) -> Result<Vec<(usize, u64)>, String> {
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex =
                |s: &str| u64::from_str_radix(s, 16).map_err(|_| format!("/proc/net/softnet_stat: bad field '{s}'"));
            let cpu = match f.get(12) {
                Some(c) => hex(c)? as usize,
                None => i,
            };
            Ok((cpu, hex(f.first().copied().unwrap_or(""))?))
        })
        .collect()
}

/// The measured CPU's share of the packets processed between two
/// [`softnet_processed`] readings, %.
fn rx_share(before: &[(usize, u64)], after: &[(usize, u64)], cpu: usize) -> f64 {
    let delta = |c: usize| {
        let b = before.iter().find(|x| x.0 == c).map_or(0, |x| x.1);
        let a = after.iter().find(|x| x.0 == c).map_or(0, |x| x.1);
        a.wrapping_sub(b) & 0xffff_ffff
    };
    let total: u64 = after.iter().map(|x| delta(x.0)).sum();
    if total == 0 {
        return f64::NAN;
    }
    delta(cpu) as f64 * 100.0 / total as f64
}

/// Copies in flight the sender allows (in datagrams: this / receivers): a
/// few ms of work queued for the measured CPU, well within the socket
/// buffers (8 MiB at the reflector, 4 MiB at the relay) and the backlog.
const IN_FLIGHT_COPIES: u64 = 16_384;

/// Datagrams sent between two readings of the copy count (one sendmmsg).
const BURST: u64 = 64;

/// Warm-up at the start of a CPU phase, not measured.
const WARMUP: Duration = Duration::from_millis(200);

/// Above this busy fraction of the measured CPU with nothing sent, %, the
/// run says that the machine was not quiet.
const BACKGROUND_MAX_PCT: f64 = 3.0;

/// Busy ns so far of one CPU (cpuidle residency; only differences mean
/// anything).
fn busy_of(cpu: usize) -> Result<f64, String> {
    oskit::cpu::busy_ns(Some(cpu)).map_err(|e| e.to_string())
}

/// The measured CPU's busy fraction over [`WINDOW`] with nothing sent, %.
fn background_busy(cpu: usize) -> Result<f64, String> {
    let (t0, b0) = (Instant::now(), busy_of(cpu)?);
    std::thread::sleep(WINDOW);
    let (t1, b1) = (Instant::now(), busy_of(cpu)?);
    Ok((b1 - b0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64)
}

/// A CPU phase: the sender (on its own CPU) keeps the measured CPU
/// saturated, sending as fast as it can while fewer than
/// [`IN_FLIGHT_COPIES`] copies' worth of datagrams are in flight, and every
/// [`WINDOW`] after the warm-up the measured CPU's busy time and the copies
/// counted (`count`, a running total) are read.
fn measured_phase(
    at: &Place,
    tx: &mut Sender,
    size: usize,
    receivers: usize,
    secs: f64,
    count: &mut Copies,
) -> Result<CpuPhase, String> {
    let size = size.max(DATA_PAYLOAD);
    let mut bufs = vec![vec![0x5au8; size]; BURST as usize];
    let mut lens = vec![0usize; BURST as usize];
    let body = vec![0x5au8; size - DATA_PAYLOAD];
    let SocketAddr::V4(to) = tx.to else {
        return Err(format!("{}: the lab is IPv4", tx.to));
    };
    let addrs = vec![Some(SockaddrIn::from(to)); BURST as usize];
    let mut headers = MultiHeaders::<SockaddrIn>::preallocate(BURST as usize, None);
    let fd = tx.sock.as_raw_fd();
    // With RPS a datagram stays charged to the sender's socket until the
    // measured CPU has dealt with it: a send buffer that holds the whole
    // window, so that the sender never blocks on it.
    oskit::sockopt::set_buffers(&tx.sock, 4 << 20, 16 << 20).map_err(|e| format!("the sender's buffers: {e}"))?;
    let r = receivers.max(1) as u64;
    let window = (IN_FLIGHT_COPIES / r).clamp(16, 1024);
    let background_pct = background_busy(at.cpu)?;
    let c0 = count.total()?;
    let start = Instant::now();
    let end = start + WARMUP + Duration::from_secs_f64(secs);
    let mut next_mark = start + WARMUP;
    // (time, busy ns of the measured CPU, copies) at each window's edge.
    let mut marks: Vec<(Instant, f64, u64, f64)> = Vec::new();
    let (mut rx0, mut cpu0) = (Vec::new(), None);
    let (mut sent, mut lost, mut stalls) = (0u64, 0u64, 0u64);
    let mut progress = (start, 0u64);
    loop {
        stopped()?;
        let copies = count.total()?.wrapping_sub(c0);
        let now = Instant::now();
        if now >= next_mark {
            if marks.is_empty() {
                rx0 = softnet_processed()?;
                cpu0 = count.per_cpu();
            }
            marks.push((now, busy_of(at.cpu)?, copies, busy_of(at.sender_cpu)?));
            if now >= end {
                break;
            }
            next_mark += WINDOW;
        }
        if copies != progress.1 {
            progress = (now, copies);
        } else if now - progress.0 > Duration::from_millis(500) && sent - lost >= copies / r + window {
            // Nothing counted for 500 ms with the window full: what is in
            // flight was lost (a queue overflowed; a process merely held off
            // the CPU by other work on a busy machine is back well before), so
            // send on.
            lost = sent - copies / r;
            stalls += 1;
            progress = (now, copies);
        }
        // Up to a burst, sealed in order and sent with one sendmmsg (a
        // partial send leaves a gap in the sequence, which is allowed).
        let n = (copies / r + window).saturating_sub(sent - lost).min(BURST) as usize;
        if n == 0 {
            // The window is full: the measured CPU has milliseconds of work
            // queued. Sleeping (not spinning) leaves the sender's CPU busy
            // only with sending, so its busy time is a diagnostic too.
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        for (b, l) in bufs.iter_mut().zip(lens.iter_mut()).take(n) {
            *l = next_datagram(tx, size, b, &body);
            if *l == 0 {
                return Err(format!("cannot build a {size}-byte DATA datagram"));
            }
        }
        let iovs: Vec<[IoSlice; 1]> = bufs
            .iter()
            .zip(&lens)
            .take(n)
            .map(|(b, &l)| [IoSlice::new(&b[..l])])
            .collect();
        if let Ok(done) = sendmmsg(fd, &mut headers, &iovs, &addrs[..n], [], MsgFlags::empty()) {
            sent += done.count() as u64;
        }
    }
    let rx1 = softnet_processed()?;
    // What is still in flight is counted before the totals are compared
    // (not measured): until the count stops for 50 ms, at most 1 s.
    let (mut total, mut since, deadline) = (
        count.total()?.wrapping_sub(c0),
        Instant::now(),
        Instant::now() + Duration::from_secs(1),
    );
    while Instant::now() < deadline && since.elapsed() < Duration::from_millis(50) {
        std::thread::sleep(Duration::from_millis(5));
        let now = count.total()?.wrapping_sub(c0);
        if now != total {
            (total, since) = (now, Instant::now());
        }
    }
    let copies_on_measured_pct = match (cpu0, count.per_cpu()) {
        (Some(a), Some(b)) => {
            let d: Vec<u64> = b
                .iter()
                .zip(a.iter().chain(std::iter::repeat(&0)))
                .map(|(b, a)| b.wrapping_sub(*a))
                .collect();
            let all: u64 = d.iter().sum();
            d.get(at.cpu)
                .map_or(f64::NAN, |&m| m as f64 * 100.0 / all.max(1) as f64)
        }
        _ => f64::NAN,
    };
    let (mut per_copy, mut busy, mut sender_busy) = (Vec::new(), Vec::new(), Vec::new());
    for w in marks.windows(2) {
        let ((t0, b0, c0, s0), (t1, b1, c1, s1)) = (w[0], w[1]);
        if c1 > c0 {
            per_copy.push((b1 - b0) / (c1 - c0) as f64);
        }
        busy.push((b1 - b0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64);
        sender_busy.push((s1 - s0) * 100.0 / (t1 - t0).as_nanos().max(1) as f64);
    }
    let (first, last) = (marks[0], marks[marks.len() - 1]);
    if per_copy.is_empty() {
        return Err("no copy was counted in a CPU phase: is the implementation running?".into());
    }
    Ok(CpuPhase {
        ns_per_copy: cost_of(per_copy.clone()),
        windows: per_copy,
        busy_pct: median(busy),
        sender_busy_pct: median(sender_busy),
        copies_per_s: (last.2 - first.2) as f64 / (last.0 - first.0).as_secs_f64(),
        copies: last.2 - first.2,
        rx_on_measured_pct: rx_share(&rx0, &rx1, at.cpu),
        copies_on_measured_pct,
        counted_vs_sent_pct: total as f64 * 100.0 / (sent * r).max(1) as f64,
        background_pct,
        stalls,
    })
}

/// The figure of a set of windows' ns per copy: their lower quartile.
/// Work that is not the implementation's (another process, the host
/// taking the vCPU's core or its sibling thread) can only add busy time to
/// a window, never take the implementation's away, and on this kind of
/// machine it comes and goes over seconds: a whole repetition can run 20-40 %
/// slow. The lower quartile is the cost seen in the least disturbed
/// quarter of the time, yet not one lucky window (the minimum would be).
fn cost_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[(v.len() - 1) / 4]
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The implementation under test, started in the reflector's namespace.
/// `to`: the receivers' addresses, for the raw loop.
fn start_impl(
    at: &Place,
    imp: &str,
    reflector: &PathBuf,
    secret_file: &PathBuf,
    to: &[SocketAddr],
) -> Result<ChildGuard, String> {
    let mut cmd = Command::new("ip");
    // Pinned to the measured CPU from its first instruction, every thread.
    cmd.args(["netns", "exec", &at.lab.veth.r, "taskset", "-c", &at.cpu.to_string()]);
    let relay = imp == "multicast" || imp == "raw-loop";
    if imp == "raw-loop" {
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let to: Vec<String> = to.iter().map(ToString::to_string).collect();
        cmd.arg(me).args([
            "raw-loop",
            "--bind",
            &format!("{REFLECTOR_IP}:{PORT}"),
            "--to",
            &to.join(","),
            // The reflector's buffers (--rcvbuf, --sndbuf below).
            "--bufsize",
            "8388608",
        ]);
    } else if imp == "multicast" {
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        cmd.arg(me).args([
            "mcast-relay",
            "--bind",
            &format!("{REFLECTOR_IP}:{PORT}"),
            "--group",
            &format!("{MCAST}:{MCAST_PORT}"),
            "--ifaddr",
            &REFLECTOR_IP.to_string(),
        ]);
    } else {
        let (backend, receive) = reflector_impl(imp).ok_or_else(|| format!("unknown implementation '{imp}'"))?;
        cmd.arg(reflector).args([
            "serve",
            "--bind",
            &REFLECTOR_IP.to_string(),
            "--ports",
            &PORT.to_string(),
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
        ]);
        cmd.arg("--secret-file").arg(secret_file);
        // Only when not the default, so that a reflector built before
        // `--receive` existed can still be measured (--reflector, A/B runs).
        if receive != ReceiveKind::default() {
            cmd.args(["--receive", receive.name()]);
        }
    }
    // The relays say when they are bound (the raw loop prints its address);
    // the reflector is ready when the JOINs (which retry) are answered.
    let mut child = cmd
        .stdout(if relay { Stdio::piped() } else { Stdio::null() })
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {imp}: {e}"))?;
    if let Some(out) = child.stdout.take() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).map_err(|e| e.to_string())?;
        let started = match imp {
            "raw-loop" => line.trim().parse::<SocketAddr>().is_ok(),
            _ => line.trim() == "ready",
        };
        if !started {
            return Err(format!("the {imp} relay did not start"));
        }
    }
    Ok(ChildGuard::new(child))
}

fn bench(a: Args) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root (namespaces, BPF programs): run with sudo".into());
    }
    for i in &a.impls {
        if !["multicast", "raw-loop"].contains(&i.as_str()) && reflector_impl(i).is_none() {
            return Err(format!(
                "unknown implementation '{i}': choose from {}, multicast, raw-loop",
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
    let lab = Lab::new(
        a.receivers.iter().max().map_or(0, |r| r + 1),
        (!a.no_rps).then_some(cpu),
    )?;
    let at = Place {
        lab: &lab,
        cpu,
        sender_cpu,
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
            for _ in 0..a.repeat {
                for (imp, samples) in a.impls.iter().zip(&mut runs) {
                    stopped()?;
                    let mcast = imp == "multicast";
                    // The raw loop is told its receivers' addresses at start.
                    let raw = (imp == "raw-loop").then(|| raw_clients(&lab, receivers)).transpose()?;
                    let to = raw.as_ref().map_or(Ok(Vec::new()), |c| {
                        c.receivers
                            .iter()
                            .map(UdpSocket::local_addr)
                            .collect::<std::io::Result<Vec<_>>>()
                            .map_err(|e| e.to_string())
                    })?;
                    let mut child = start_impl(&at, imp, &reflector, &secret_file, &to)?;
                    let mut cl = match raw {
                        Some(c) => c,
                        None if mcast => mcast_clients(&lab, receivers, MCAST_RCVBUF)?,
                        None => join_all(&lab, &secret, receivers)?,
                    };
                    let run = one_run(&at, &mut cl, size, rate, &a, mcast)?;
                    child.stop();
                    let c = &run.cpu;
                    eprintln!(
                        "  rep {}/{}: {size} B x {receivers} {imp}: {:.1} ns/copy ({:.3} M copies/s; measured CPU {:.1} % busy, {:.1} % before the phase; sender's CPU {:.1} % busy; copies sent on the measured CPU {}; packets received there, machine-wide {:.1} %{})",
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
                        if c.stalls > 0 {
                            format!(", {} stalls: datagrams lost on the way", c.stalls)
                        } else {
                            String::new()
                        }
                    );
                    samples.push(run);
                }
            }
            for (imp, samples) in a.impls.iter().zip(runs) {
                let cell = Cell::of(&samples);
                let expected = cell.sent * receivers as u64;
                eprintln!(
                    "{size:5} B x {receivers:3} {imp:9}: {:7.1} ns/copy (runs {}; spread {:.1} %), measured CPU {:.1} % busy; delivery {:.0} copies/s, lost {}",
                    cell.ns_per_copy,
                    cell.runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(", "),
                    cell.spread_pct(),
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

/// One cell's figures over its repetitions.
#[derive(Debug, Clone, Default)]
struct Cell {
    /// Each repetition's ns per copy, in run order.
    runs: Vec<f64>,
    ns_per_copy: f64,
    busy_pct: f64,
    sender_busy_pct: f64,
    cpu_copies_per_s: f64,
    /// Copies counted in the CPU phases' measured windows, all repetitions.
    cpu_copies: u64,
    /// The lowest share of received packets processed on the measured CPU.
    rx_on_measured_pct: f64,
    /// The lowest share of copies transmitted on the measured CPU.
    copies_on_measured_pct: f64,
    /// The highest busy fraction of the measured CPU before a phase.
    background_pct: f64,
    /// The lowest and highest [`CpuPhase::counted_vs_sent_pct`].
    counted_vs_sent_pct: (f64, f64),
    stalls: u64,
    sent: u64,
    delivered: u64,
    delivered_per_s: f64,
}

impl Cell {
    fn of(samples: &[Sample]) -> Cell {
        let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
        Cell {
            runs: samples.iter().map(|s| s.cpu.ns_per_copy).collect(),
            // Over every window of every repetition.
            ns_per_copy: cost_of(samples.iter().flat_map(|s| s.cpu.windows.iter().copied()).collect()),
            busy_pct: m(|s| s.cpu.busy_pct),
            sender_busy_pct: m(|s| s.cpu.sender_busy_pct),
            cpu_copies_per_s: m(|s| s.cpu.copies_per_s),
            cpu_copies: samples.iter().map(|s| s.cpu.copies).sum(),
            rx_on_measured_pct: samples
                .iter()
                .map(|s| s.cpu.rx_on_measured_pct)
                .fold(f64::NAN, f64::min),
            copies_on_measured_pct: samples
                .iter()
                .map(|s| s.cpu.copies_on_measured_pct)
                .fold(f64::NAN, f64::min),
            background_pct: samples.iter().map(|s| s.cpu.background_pct).fold(f64::NAN, f64::max),
            counted_vs_sent_pct: (
                samples
                    .iter()
                    .map(|s| s.cpu.counted_vs_sent_pct)
                    .fold(f64::NAN, f64::min),
                samples
                    .iter()
                    .map(|s| s.cpu.counted_vs_sent_pct)
                    .fold(f64::NAN, f64::max),
            ),
            stalls: samples.iter().map(|s| s.cpu.stalls).sum(),
            sent: samples.iter().map(|s| s.sent).sum(),
            delivered: samples.iter().map(|s| s.delivered).sum(),
            delivered_per_s: m(|s| s.copies_per_s),
        }
    }

    fn min(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NAN, f64::min)
    }

    fn max(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NAN, f64::max)
    }

    /// (max - min) as % of the median.
    fn spread_pct(&self) -> f64 {
        (self.max() - self.min()) * 100.0 / self.ns_per_copy
    }
}

struct Row {
    size: usize,
    receivers: usize,
    imp: String,
    rate: u64,
    cell: Cell,
    expected: u64,
}

fn write_csv(out: &PathBuf, rows: &[Row]) -> Result<(), String> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let mut f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut text = String::from(
        "size,receivers,impl,rate_dps,sent,expected,delivered,lost,copies_per_s,ns_per_copy,ns_per_copy_min,ns_per_copy_max,spread_pct,ns_per_copy_runs,cpu_copies,cpu_copies_per_s,busy_pct,sender_busy_pct,background_pct,copies_on_measured_pct,rx_on_measured_pct,counted_vs_sent_pct_min,counted_vs_sent_pct_max,stalls,vs_sendto,vs_multicast,vs_raw_loop\n",
    );
    for r in rows {
        let c = &r.cell;
        let of = |name: &str| {
            rows.iter()
                .find(|x| x.size == r.size && x.receivers == r.receivers && x.imp == name)
                .map(|x| x.cell.ns_per_copy)
        };
        let ratio = |anchor: Option<f64>| anchor.map_or(String::new(), |x| format!("{:.3}", c.ns_per_copy / x));
        text.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.0},{:.1},{:.1},{:.1},{:.1},{},{},{:.0},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{},{}\n",
            r.size,
            r.receivers,
            r.imp,
            r.rate,
            c.sent,
            r.expected,
            c.delivered,
            r.expected.saturating_sub(c.delivered),
            c.delivered_per_s,
            c.ns_per_copy,
            c.min(),
            c.max(),
            c.spread_pct(),
            c.runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(";"),
            c.cpu_copies,
            c.cpu_copies_per_s,
            c.busy_pct,
            c.sender_busy_pct,
            c.background_pct,
            c.copies_on_measured_pct,
            c.rx_on_measured_pct,
            c.counted_vs_sent_pct.0,
            c.counted_vs_sent_pct.1,
            c.stalls,
            ratio(of("sendto")),
            ratio(of("multicast")),
            ratio(of("raw-loop")),
        ));
    }
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// The goals at 90 receivers (sendto/ebpf at least 4x, ebpf/multicast at
/// most 1.5x), and clients per core at 100 B.
fn summarize(rows: &[Row]) {
    let ns = |size: usize, r: usize, imp: &str| {
        rows.iter()
            .find(|x| x.size == size && x.receivers == r && x.imp == imp)
            .map(|x| x.cell.ns_per_copy)
    };
    for size in rows.iter().map(|r| r.size).collect::<std::collections::BTreeSet<_>>() {
        let (e, s, mm, m) = (
            ns(size, 90, "ebpf"),
            ns(size, 90, "sendto"),
            ns(size, 90, "sendmmsg"),
            ns(size, 90, "multicast"),
        );
        let head = format!("{size} B, 90 receivers (ns per copy, one run):");
        let mut line = head.clone();
        if let (Some(e), Some(s)) = (e, s) {
            line += &format!(" sendto/ebpf = {:.2}x (goal >= 4)", s / e);
        }
        if let (Some(e), Some(m)) = (e, m) {
            line += &format!(" ebpf/multicast = {:.2}x (goal <= 1.5)", e / m);
        }
        if let (Some(mm), Some(s)) = (mm, s) {
            line += &format!(" sendmmsg/sendto = {:.2}x", mm / s);
        }
        if let (Some(mm), Some(raw)) = (mm, ns(size, 90, "raw-loop")) {
            line += &format!(" sendmmsg/raw-loop = {:.2}x", mm / raw);
        }
        if line != head {
            println!("{line}");
        }
    }
    // Paper 000 §6: a client sends 8 kb/s in 100-byte datagrams, so each one
    // the reflector serves takes 10 copies/s of its output.
    for imp in ["sendto", "sendmmsg", "ebpf", "multicast"] {
        if let Some(ns) = ns(100, 90, imp).filter(|x| *x > 0.0) {
            println!(
                "{imp}: one core makes {:.0} copies/s at 100 B, 90 receivers: {:.0} clients of 8 kb/s (paper: 7,500 per Fast-Ethernet reflector)",
                1e9 / ns,
                1e9 / ns / 10.0
            );
        }
    }
}

fn getrandom(buf: &mut [u8]) -> Result<(), String> {
    let mut f = std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?;
    std::io::Read::read_exact(&mut f, buf).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcvbuf_errors_are_read_from_the_udp_lines() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
            Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            Udp: 10 0 7 3 7 0\n\
            UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n\
            UdpLite: 0 0 0 0 99 0\n";
        assert_eq!(parse_udp_rcvbuf_errors(text), Ok(7));
        assert!(parse_udp_rcvbuf_errors("Ip: a\nIp: 1\n").is_err());
    }

    #[test]
    fn softnet_lines_give_cpu_and_processed() {
        let with_cpu = "00000010 0 0 0 0 0 0 0 0 0 0 0 00000000 0 0\n\
                        000000ff 0 0 0 0 0 0 0 0 0 0 0 00000003 0 0\n";
        assert_eq!(parse_softnet_processed(with_cpu), Ok(vec![(0, 16), (3, 255)]));
        let old = "00000001 0 0\n00000002 0 0\n";
        assert_eq!(parse_softnet_processed(old), Ok(vec![(0, 1), (1, 2)]));
    }

    #[test]
    fn rx_share_is_the_measured_cpus_part_of_what_was_processed() {
        let before = [(0, 100), (1, 1000)];
        let after = [(0, 110), (1, 1090)];
        assert_eq!(rx_share(&before, &after, 1), 90.0);
        // The kernel's counters are 32 bits and wrap.
        let before = [(0, 0xffff_fff0), (1, 0)];
        let after = [(0, 0x10), (1, 0)];
        assert_eq!(rx_share(&before, &after, 0), 100.0);
        assert!(rx_share(&after, &after, 0).is_nan());
    }

    #[test]
    fn a_cells_figure_is_the_lower_quartile_of_all_its_windows() {
        let s = |windows: &[f64]| Sample {
            cpu: CpuPhase {
                ns_per_copy: cost_of(windows.to_vec()),
                windows: windows.to_vec(),
                ..CpuPhase::default()
            },
            ..Sample::default()
        };
        // A repetition slowed throughout by other work does not move the
        // figure; the spread of the repetitions' own figures shows it.
        let c = Cell::of(&[
            s(&[100.0, 101.0, 99.0, 103.0]),
            s(&[140.0, 138.0, 141.0, 139.0]),
            s(&[98.0, 102.0, 100.0, 104.0]),
        ]);
        assert_eq!(c.ns_per_copy, 100.0);
        assert_eq!(c.runs, vec![99.0, 138.0, 98.0]);
        assert!((c.spread_pct() - 40.0).abs() < 1e-9);
        assert!(cost_of(Vec::new()).is_nan());
        assert_eq!(cost_of(vec![5.0]), 5.0);
    }
}
