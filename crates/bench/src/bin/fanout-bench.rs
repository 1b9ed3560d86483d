//! `fanout-bench`: paper 000's grid (datagram size x receivers) over veth,
//! for the reflector's `sendto`, `sendmmsg` and `ebpf` backends and native
//! IP multicast, in one run.
//!
//! On veth (as on loopback) the receive processing, a TC program included,
//! runs in softirq on whichever CPU sent the packet and is charged to the
//! *sending* process, so a per-process CPU figure for the in-kernel fan-out
//! would be near zero and meaningless. The figure that counts is CPU per
//! copy on the CPU that the sender and the implementation are pinned to,
//! softirq included (from cpuidle's residency counters, median over short
//! windows so that bursts of background work do not move it). To leave the
//! receivers' work out of it,
//! the CPU runs drop every DATA copy at the reflector's egress veth with a
//! small counting TC program, the same for every implementation (its count
//! is the delivered figure); the anchor is the same clients' datagrams
//! dropped at the reflector's ingress, before anything else sees them; the
//! reflector's share is the difference, per copy. Runs that deliver to the
//! receivers give throughput and loss.
#![deny(unsafe_code)]

use bench::lab::{busy_ns_on, sh, VethLab};
use clap::{Parser, Subcommand};
use oskit::child::ChildGuard;
use oskit::netns::NetNs;
use reflector::kfanout::sink::Sink;
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::{self, Header, Kind, SessionKeys, DATA_PAYLOAD};
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method: the reflector (--threads 1) runs in one namespace, one sender and R receiver members \
(real tokens, two-step JOIN, DATA tags on, each member at an address of its own) in another, \
joined by a veth. Each phase sends at a \
fixed datagram rate (--copies-per-s / R, at most 50,000/s) for --seconds. Delivery runs count \
what the receivers get (throughput, loss). CPU runs drop every DATA copy at the reflector's \
egress veth with a counting TC program (its count is the delivered figure); anchor runs drop \
the clients' DATA at the reflector's ingress, before anything else. In CPU and anchor runs the \
sender and the implementation are pinned to one CPU (--cpu) and CPU is that CPU's busy time \
over the phase: wall time - idle time, idle from cpuidle's residency counters (us; /proc/stat's \
10 ms ticks if the kernel has no cpuidle driver); softirq included: on veth the in-kernel \
fan-out runs there, on the sender's CPU. Background work on the other CPUs is left out. A phase \
is cut into 200 ms windows and its busy time per datagram is the median over them (a burst of \
background work moves a window or two, not the median). The reflector's share per copy = \
(CPU-run busy per datagram - anchor busy per datagram) / copies per datagram. \
IP multicast, the physical reference for in-kernel replication: a relay in the reflector's \
namespace receives each datagram and sends it once to a group the R receivers joined; the \
receiving host's kernel makes one copy per receiver socket. Its CPU runs drop nothing: the \
receivers do not read during the phase and count what their sockets hold afterwards, so the \
kernel's replication is inside the measurement as the ebpf clones are. Each repetition runs \
every implementation once, in turn (drift in background load hits them alike); figures are \
medians of --repeat runs.";

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
        multicast, in one run. Reports CPU per copy on one pinned CPU, softirq included (the \
        reflector's share, over an anchor measured in the same run), throughput and loss; writes a CSV. Needs root (namespaces, BPF) and \
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
}

#[derive(clap::Args)]
struct Args {
    /// Datagram sizes, bytes of UDP payload (our 32-byte DATA header included).
    #[arg(long, default_value = "50,100,500,1000", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Receiver counts.
    #[arg(long, default_value = "3,30,60,90,256", value_delimiter = ',')]
    receivers: Vec<usize>,
    /// Implementations: sendto, sendmmsg, ebpf, multicast.
    #[arg(long, default_value = "sendto,sendmmsg,ebpf,multicast", value_delimiter = ',')]
    impls: Vec<String>,
    /// Seconds per phase.
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// Target copies per second (the datagram rate is this / receivers, at most 50,000/s).
    #[arg(long, default_value_t = 120_000)]
    copies_per_s: u64,
    /// Runs per (cell, implementation); figures are medians.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// The CPU that the sender and the implementation are pinned to in the
    /// CPU and anchor runs, and whose busy time is measured (default: the
    /// last CPU this process may use).
    #[arg(long)]
    cpu: Option<usize>,
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
    /// The lab, with addresses for `members` members.
    fn new(members: usize) -> Result<Lab, String> {
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
    let c = Lab::ns(&lab.veth.c)?;
    let socks: Vec<UdpSocket> = c
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
        .map_err(|e| e.to_string())?;
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

/// Receive buffer for a multicast receiver that holds a whole CPU-run
/// phase unread: `datagrams` copies of a `size`-byte datagram, each
/// charged at about the kernel's buffer (payload and headers rounded up to
/// a power of two, plus the socket buffer's own structures), with margin.
fn mcast_rcvbuf(size: usize, datagrams: u64) -> usize {
    let truesize = (size + 128).next_power_of_two() + 1024;
    let want = datagrams.saturating_mul(truesize as u64).saturating_mul(3) / 2;
    want.clamp(4 << 20, 1 << 30) as usize
}

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

#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    sent: u64,
    delivered: u64,
    copies_per_s: f64,
    cpu_copies: u64,
    busy_ns_per_copy: f64,
    anchor_ns_per_datagram: f64,
    share_ns_per_copy: f64,
}

/// Where the run happens: the lab, the measured CPU (the calling thread is
/// pinned there) and another for the receivers in delivery runs.
struct Place<'a> {
    lab: &'a Lab,
    cpu: usize,
    receivers_cpu: Option<usize>,
}

/// One (cell, implementation) run: delivery, CPU with the egress sink (for
/// multicast: with the copies held in the receivers' sockets), anchor with
/// the ingress sink.
fn one_run(at: &Place, cl: &mut Clients, size: usize, rate: u64, secs: f64, mcast: bool) -> Result<Sample, String> {
    let lab = at.lab;
    // Delivery.
    let stop = AtomicBool::new(false);
    let got = AtomicU64::new(0);
    let (tx, receivers) = (&mut cl.sender, &cl.receivers);
    let sent = std::thread::scope(|s| {
        let h = s.spawn(|| {
            // The receivers' reading is not measured: off the measured CPU.
            if let Some(c) = at.receivers_cpu {
                let _ = oskit::cpu::pin_this_thread(c);
            }
            drain_receivers(receivers, &stop, &got)
        });
        let sent = send_paced(tx, size, rate, secs, |_| {});
        stop.store(true, Relaxed);
        let _ = h.join();
        sent
    });
    let delivered = got.load(Relaxed);
    let copies_per_s = delivered as f64 / secs;
    let rns = Lab::ns(&lab.veth.r)?;
    // CPU: every DATA copy dropped at the reflector's egress; multicast's
    // copies, made in the receiving host, left in the receivers' sockets
    // and counted after the phase.
    let sink = if mcast {
        None
    } else {
        Some(
            rns.run(|| Sink::attach("vr", Some("sinkd")))
                .map_err(|e| e.to_string())??,
        )
    };
    let (s_cpu, cpu_per_datagram) = measured_phase(at, &mut cl.sender, size, rate, secs)?;
    let cpu_copies = match sink {
        Some(sink) => sink.count(),
        None => {
            let (done, held) = (AtomicBool::new(true), AtomicU64::new(0));
            drain_receivers(&cl.receivers, &done, &held);
            let held = held.load(Relaxed);
            let made = s_cpu * cl.receivers.len() as u64;
            if held < made {
                eprintln!(
                    "fanout-bench: warning: the multicast receivers held {held} of {made} copies (a receive buffer overflowed); the figure is per held copy"
                );
            }
            held
        }
    };
    // Anchor: the clients' DATA dropped at the reflector's ingress.
    let sink = rns.run(|| Sink::attach("vr", None)).map_err(|e| e.to_string())??;
    let (_, anchor_per_datagram) = measured_phase(at, &mut cl.sender, size, rate, secs)?;
    drop(sink);
    let copies_per_datagram = cpu_copies as f64 / s_cpu.max(1) as f64;
    let share = (cpu_per_datagram - anchor_per_datagram) / copies_per_datagram;
    Ok(Sample {
        sent,
        delivered,
        copies_per_s,
        cpu_copies,
        busy_ns_per_copy: cpu_per_datagram / copies_per_datagram,
        anchor_ns_per_datagram: anchor_per_datagram,
        share_ns_per_copy: share,
    })
}

/// A measured phase: datagrams sent, and the measured CPU's busy time per
/// datagram, the median over the phase's windows (background bursts, which
/// hit a window or two, do not move it).
fn measured_phase(at: &Place, tx: &mut Sender, size: usize, rate: u64, secs: f64) -> Result<(u64, f64), String> {
    let mut per_datagram = Vec::new();
    let mut last = (busy_ns_on(Some(at.cpu))?, 0u64);
    let mut failed = None;
    let sent = send_paced(tx, size, rate, secs, |sent| match busy_ns_on(Some(at.cpu)) {
        Ok(busy) => {
            if sent > last.1 {
                per_datagram.push((busy - last.0) / (sent - last.1) as f64);
            }
            last = (busy, sent);
        }
        Err(e) => failed = Some(e),
    });
    if let Some(e) = failed {
        return Err(e);
    }
    stopped()?;
    Ok((sent, median(per_datagram)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// The implementation under test, started in the reflector's namespace.
fn start_impl(at: &Place, imp: &str, reflector: &PathBuf, secret_file: &PathBuf) -> Result<ChildGuard, String> {
    let mut cmd = Command::new("ip");
    // Pinned to the measured CPU from its first instruction, every thread.
    cmd.args(["netns", "exec", &at.lab.veth.r, "taskset", "-c", &at.cpu.to_string()]);
    if imp == "multicast" {
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
        cmd.arg(reflector).args([
            "serve",
            "--bind",
            &REFLECTOR_IP.to_string(),
            "--ports",
            &PORT.to_string(),
            "--backend",
            imp,
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
            "--member-timeout-ms",
            "600000",
            "--rcvbuf",
            "8388608",
            "--sndbuf",
            "8388608",
        ]);
        cmd.arg("--secret-file").arg(secret_file);
    }
    // The relay says when it is bound; the reflector is ready when the
    // JOINs (which retry) are answered.
    let mut child = cmd
        .stdout(if imp == "multicast" {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {imp}: {e}"))?;
    if let Some(out) = child.stdout.take() {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(out), &mut line).map_err(|e| e.to_string())?;
        if line.trim() != "ready" {
            return Err("the multicast relay did not start".into());
        }
    }
    Ok(ChildGuard::new(child))
}

fn bench(a: Args) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root (namespaces, BPF programs): run with sudo".into());
    }
    for i in &a.impls {
        if !["sendto", "sendmmsg", "ebpf", "multicast"].contains(&i.as_str()) {
            return Err(format!(
                "unknown implementation '{i}': choose from sendto, sendmmsg, ebpf, multicast"
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
    oskit::cpu::pin_this_thread(cpu).map_err(|e| format!("cannot pin to CPU {cpu}: {e}"))?;
    let lab = Lab::new(a.receivers.iter().max().map_or(0, |r| r + 1))?;
    let at = Place {
        lab: &lab,
        cpu,
        receivers_cpu: allowed.iter().copied().find(|&c| c != cpu),
    };
    eprintln!("{METHOD}\n");
    eprintln!("measured CPU: {cpu}\n");
    let mut rows = Vec::new();
    for &size in &a.sizes {
        for &receivers in &a.receivers {
            let rate = (a.copies_per_s / receivers as u64).clamp(100, 50_000);
            let mut runs: Vec<Vec<Sample>> = vec![Vec::new(); a.impls.len()];
            for _ in 0..a.repeat {
                for (imp, samples) in a.impls.iter().zip(&mut runs) {
                    stopped()?;
                    let mut child = start_impl(&at, imp, &reflector, &secret_file)?;
                    let mcast = imp == "multicast";
                    let mut cl = if mcast {
                        let phase = (rate as f64 * a.seconds) as u64;
                        mcast_clients(&lab, receivers, mcast_rcvbuf(size, phase))?
                    } else {
                        join_all(&lab, &secret, receivers)?
                    };
                    let run = one_run(&at, &mut cl, size, rate, a.seconds, mcast)?;
                    child.stop();
                    eprintln!(
                        "  run {}/{}: {size} B x {receivers} {imp}: share {:.0} ns/copy",
                        samples.len() + 1,
                        a.repeat,
                        run.share_ns_per_copy
                    );
                    samples.push(run);
                }
            }
            for (imp, samples) in a.impls.iter().zip(runs) {
                let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
                let s = Sample {
                    sent: samples.iter().map(|s| s.sent).sum(),
                    delivered: samples.iter().map(|s| s.delivered).sum(),
                    copies_per_s: m(|s| s.copies_per_s),
                    cpu_copies: samples.iter().map(|s| s.cpu_copies).sum(),
                    busy_ns_per_copy: m(|s| s.busy_ns_per_copy),
                    anchor_ns_per_datagram: m(|s| s.anchor_ns_per_datagram),
                    share_ns_per_copy: m(|s| s.share_ns_per_copy),
                };
                let expected = s.sent * receivers as u64;
                eprintln!(
                    "{size:5} B x {receivers:3} {imp:9}: share {:8.0} ns/copy (busy {:8.0}, anchor {:8.0} ns/datagram), {:9.0} copies/s delivered, lost {}",
                    s.share_ns_per_copy,
                    s.busy_ns_per_copy,
                    s.anchor_ns_per_datagram,
                    s.copies_per_s,
                    expected.saturating_sub(s.delivered)
                );
                rows.push((size, receivers, imp.clone(), rate, s, expected));
            }
        }
    }
    drop(lab);
    let _ = std::fs::remove_dir_all(&dir);
    write_csv(&a.out, &rows)?;
    summarize(&rows);
    Ok(())
}

type Row = (usize, usize, String, u64, Sample, u64);

fn write_csv(out: &PathBuf, rows: &[Row]) -> Result<(), String> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let mut f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut text = String::from(
        "size,receivers,impl,rate_dps,sent,expected,delivered,lost,copies_per_s,cpu_copies,busy_ns_per_copy,anchor_ns_per_datagram,share_ns_per_copy,share_vs_sendto,share_vs_multicast\n",
    );
    for (size, receivers, imp, rate, s, expected) in rows {
        let of = |name: &str| {
            rows.iter()
                .find(|r| r.0 == *size && r.1 == *receivers && r.2 == name)
                .map(|r| r.4.share_ns_per_copy)
        };
        let ratio = |anchor: Option<f64>| anchor.map_or(String::new(), |x| format!("{:.3}", s.share_ns_per_copy / x));
        text.push_str(&format!(
            "{size},{receivers},{imp},{rate},{},{expected},{},{},{:.0},{},{:.1},{:.1},{:.1},{},{}\n",
            s.sent,
            s.delivered,
            expected.saturating_sub(s.delivered),
            s.copies_per_s,
            s.cpu_copies,
            s.busy_ns_per_copy,
            s.anchor_ns_per_datagram,
            s.share_ns_per_copy,
            ratio(of("sendto")),
            ratio(of("multicast")),
        ));
    }
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// The goals at 90 receivers (sendto/ebpf at least 4x, ebpf/multicast at
/// most 1.5x), and clients per core at 100 B.
fn summarize(rows: &[Row]) {
    let share = |size: usize, r: usize, imp: &str| {
        rows.iter()
            .find(|x| x.0 == size && x.1 == r && x.2 == imp)
            .map(|x| x.4.share_ns_per_copy)
    };
    for size in rows.iter().map(|r| r.0).collect::<std::collections::BTreeSet<_>>() {
        if let (Some(e), Some(s), Some(m)) = (
            share(size, 90, "ebpf"),
            share(size, 90, "sendto"),
            share(size, 90, "multicast"),
        ) {
            println!(
                "{size} B, 90 receivers: sendto/ebpf = {:.2}x (goal >= 4), ebpf/multicast = {:.2}x (goal <= 1.5)",
                s / e,
                e / m
            );
        }
    }
    // Paper 000 §6: a client sends 8 kb/s in 100-byte datagrams, so each one
    // the reflector serves takes 10 copies/s of its output.
    for imp in ["sendto", "sendmmsg", "ebpf", "multicast"] {
        if let Some(ns) = share(100, 90, imp).filter(|x| *x > 0.0) {
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
