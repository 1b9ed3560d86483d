//! `checkpoint-bench`: the reflector's checkpoint hand-off (the send path's
//! second benchmark): the time and the reflector's CPU to serve
//! an N MiB checkpoint to K joiners at once over a veth, with the channel's
//! MSG_ZEROCOPY on and off. Over veth the kernel copies on delivery, so
//! zero copy cannot gain here: what this shows is that the fall-back to
//! copies works (the first completions say COPIED and the channel copies
//! from then on) and costs nothing beside plain copies.
#![deny(unsafe_code)]

use bench::lab::{VethLab, VethLabOptions, REFLECTOR_HOST};
use bytes::Bytes;
use clap::Parser;
use oskit::child::ChildGuard;
use oskit::procfs;
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::checkpoint::{self as channel, Member};
use reflector_proto::client::{Config as ClientConfig, Event, JoinRequest, Session};
use reflector_proto::protocol::{Packet, SessionKeys};
use std::io::Write as _;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method: the reflector (release build, --backend sendmmsg) runs in one namespace with its \
checkpoint channel on; the clients in another, joined by a veth. One member is asked for a \
checkpoint and uploads N MiB; then K members that joined fetch it at once (each over its own \
TCP connection, all connected first, then released together), and every fetched state is \
compared with the upload. Time: from the release to the last byte received. CPU: the \
reflector process's user+system time (/proc/PID/stat, 10 ms ticks: averaged over the runs, \
readable from a few tens of ms) and machine-wide busy time (wall x CPUs - idle, idle from \
cpuidle's residency counters, microseconds: the receivers' TCP work on the other side of the \
veth included), each over the same interval. Modes: copy (--checkpoint-zerocopy off) and zerocopy (on: MSG_ZEROCOPY for \
pieces of 64 KB and more until a completion says the kernel copied, then plain copies); \
the reflector is restarted per mode and size; figures are medians of --repeat runs.";

#[derive(Parser)]
#[command(
    name = "checkpoint-bench",
    about = "Checkpoint hand-off: time and reflector CPU to serve N MiB to K joiners, zero copy on vs off",
    long_about = METHOD
)]
struct Args {
    /// Checkpoint sizes, MiB.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    sizes_mib: Vec<usize>,
    /// Joiners fetching at once.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    joiners: Vec<usize>,
    /// Runs per cell; figures are medians (the reflector's CPU: the mean).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// CSV output.
    #[arg(long, default_value = "bench/results/checkpoint.csv")]
    out: PathBuf,
    /// The reflector binary (default: next to this one).
    #[arg(long)]
    reflector: Option<PathBuf>,
}

static STOP: AtomicBool = AtomicBool::new(false);

const GROUP: u16 = 4700;
const CK_PORT: u16 = 4710;
const T: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    netlab::log::init_plain();
    let args = Args::parse();
    match oskit::signal::flag_on(&[libc::SIGINT, libc::SIGTERM], oskit::signal::Second::Ignore) {
        Ok(flag) => {
            std::thread::spawn(move || loop {
                if flag.load(Relaxed) {
                    STOP.store(true, Relaxed);
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            });
        }
        Err(e) => {
            eprintln!("checkpoint-bench: error: cannot handle signals: {e}");
            return ExitCode::FAILURE;
        }
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("checkpoint-bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn stopped() -> Result<(), String> {
    if STOP.load(Relaxed) {
        Err("interrupted".into())
    } else {
        Ok(())
    }
}

fn now_unix() -> u64 {
    reflector_proto::unix_now_ms() / 1000
}

/// A member in the clients' namespace.
struct Joined {
    sock: UdpSocket,
    session: Session,
    keys: SessionKeys,
    player: u32,
}

fn join(lab: &VethLab, secret: &Secret, players: std::ops::Range<u32>) -> Result<Vec<Joined>, String> {
    let ns = VethLab::ns(&lab.c)?;
    let ip = lab.client_ip;
    let socks: Vec<UdpSocket> = ns
        .run(|| {
            players
                .clone()
                .map(|_| UdpSocket::bind(SocketAddr::from((ip, 0))))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let to = SocketAddr::from((lab.reflector_ip, GROUP));
    let mut out = Vec::new();
    for (sock, player) in socks.into_iter().zip(players) {
        let token = TokenClaims {
            player,
            reflector: 0,
            group: GROUP,
            expires_unix_s: now_unix() + 3600,
        }
        .sign(secret);
        let keys = SessionKeys::derive(secret, &token);
        let req = JoinRequest {
            reflector: to,
            group: GROUP,
            player,
            token,
            keys,
            first_seq: 1,
        };
        let cfg = ClientConfig {
            give_up: Some(Duration::from_secs(5)),
            ..ClientConfig::default()
        };
        let (session, _) = blocking::join(&sock, req, cfg).map_err(|e| format!("join of player {player}: {e:?}"))?;
        out.push(Joined {
            sock,
            session,
            keys,
            player,
        });
    }
    Ok(out)
}

impl Joined {
    fn member(&self) -> Member<'_> {
        Member {
            group: GROUP,
            player: self.player,
            membership: self.session.membership().unwrap_or(0),
            keys: &self.keys,
        }
    }

    fn wait_request(&mut self) -> Result<u64, String> {
        self.sock
            .set_read_timeout(Some(Duration::from_millis(100)))
            .map_err(|e| e.to_string())?;
        let until = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 2048];
        while Instant::now() < until {
            stopped()?;
            let Ok((n, from)) = self.sock.recv_from(&mut buf) else {
                continue;
            };
            let Ok(p) = Packet::parse(&buf[..n]) else { continue };
            if let Some(Event::CheckpointRequested { nonce }) = self.session.handle(Instant::now(), from, &p) {
                return Ok(nonce);
            }
            if let Some(t) = self.session.poll_transmit() {
                let _ = self.sock.send_to(t.datagram.as_bytes(), from);
            }
        }
        Err("no CHECKPOINT_REQUEST within 10 s".into())
    }
}

fn connect(lab: &VethLab, n: usize) -> Result<Vec<TcpStream>, String> {
    let addr = SocketAddr::from((lab.reflector_ip, CK_PORT));
    let ns = VethLab::ns(&lab.c)?;
    ns.run(|| {
        (0..n)
            .map(|_| channel::connect(addr, T).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, String>>()
    })
    .map_err(|e| e.to_string())?
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    wall_ms: f64,
    reflector_cpu_ms: f64,
    busy_ms: f64,
}

/// K fetches at once; every state checked.
fn fetch_all(lab: &VethLab, joiners: &[Joined], want: &Bytes, pid: u32) -> Result<Sample, String> {
    let streams = connect(lab, joiners.len())?;
    let addr = SocketAddr::from((lab.reflector_ip, CK_PORT));
    let go = std::sync::Barrier::new(joiners.len() + 1);
    let tick_ms = 1000.0 / procfs::ticks_per_second() as f64;
    std::thread::scope(|s| {
        let hs: Vec<_> = joiners
            .iter()
            .zip(&streams)
            .map(|(j, st)| {
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    let f = channel::fetch_on(st, addr, j.member(), 1 << 32, T);
                    (f, Instant::now())
                })
            })
            .collect();
        let c0 = procfs::process_ticks(pid).map_err(|e| e.to_string())?;
        let b0 = oskit::cpu::busy_ns(None).map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        go.wait();
        let mut last = t0;
        for h in hs {
            let (f, done) = h.join().map_err(|_| "a fetch thread panicked")?;
            let f = f.map_err(|e| e.to_string())?.ok_or("the reflector had no checkpoint")?;
            if f.state != *want {
                return Err("a fetched state differs from the upload".into());
            }
            last = last.max(done);
        }
        let busy = oskit::cpu::busy_ns(None).map_err(|e| e.to_string())? - b0;
        let cpu = procfs::process_ticks(pid).map_err(|e| e.to_string())?.since(&c0);
        Ok(Sample {
            wall_ms: last.duration_since(t0).as_secs_f64() * 1e3,
            reflector_cpu_ms: cpu.total() as f64 * tick_ms,
            busy_ms: busy / 1e6,
        })
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

struct Row {
    mode: &'static str,
    size_mib: usize,
    joiners: usize,
    wall_ms: f64,
    reflector_cpu_ms: f64,
    busy_ms: f64,
    zerocopy_sends: u64,
    copied_sends: u64,
}

fn start_reflector(
    lab: &VethLab,
    bin: &Path,
    secret: &Path,
    summary: &Path,
    zc: bool,
    max: usize,
) -> Result<ChildGuard, String> {
    let (ip, group, ck_port, max) = (
        lab.reflector_ip.to_string(),
        GROUP.to_string(),
        CK_PORT.to_string(),
        max.to_string(),
    );
    let argv: Vec<&std::ffi::OsStr> = [bin.as_os_str()]
        .into_iter()
        .chain(
            [
                "serve",
                "--bind",
                &ip,
                "--ports",
                &group,
                "--backend",
                "sendmmsg",
                "--threads",
                "1",
                "--max-per-ip",
                "1000",
                "--checkpoint-port",
                &ck_port,
                "--checkpoint-every",
                "100ms",
                "--checkpoint-max-bytes",
                &max,
                "--checkpoint-fetch-every",
                "0s",
                "--checkpoint-conns",
                "1024",
                "--checkpoint-conns-per-ip",
                "1024",
                "--checkpoint-timeout",
                "60s",
                "--checkpoint-zerocopy",
                if zc { "on" } else { "off" },
                "--secret-file",
            ]
            .map(std::ffi::OsStr::new),
        )
        .chain([secret.as_os_str(), "--summary-json".as_ref(), summary.as_os_str()])
        .collect();
    let child = lab
        .launcher()
        .command(REFLECTOR_HOST, &argv)
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    Ok(ChildGuard::new(child))
}

fn run(a: Args) -> Result<(), String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root (network namespaces): run with sudo".into());
    }
    if a.sizes_mib.is_empty() || a.joiners.is_empty() || a.repeat == 0 {
        return Err("--sizes-mib, --joiners and --repeat must not be empty or zero".into());
    }
    let bin = match &a.reflector {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| e.to_string())?
            .with_file_name("reflector"),
    };
    if !bin.exists() {
        return Err(format!(
            "{} is missing: `make bench` builds it (or pass --reflector)",
            bin.display()
        ));
    }
    eprintln!("{METHOD}\n");
    let dir = std::env::temp_dir().join(format!("checkpoint-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = (|| {
        let mut raw = [0u8; 32];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").map_err(|e| e.to_string())?,
            &mut raw,
        )
        .map_err(|e| e.to_string())?;
        let secret = Secret::new(&raw).map_err(|e| e.to_string())?;
        let secret_file = dir.join("secret");
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&secret_file, hex).map_err(|e| e.to_string())?;
        let lab = VethLab::new(
            &VethLabOptions {
                name: "checkpoint-bench".into(),
                subnet: 211,
                reflector_cpus: None,
                netdev_backlog: None,
                rps_cpus: None,
                client_addresses: None,
                reflector_discard: vec![],
            },
            &STOP,
        )?;
        let kmax = *a.joiners.iter().max().unwrap_or(&1);
        let mut rows = Vec::new();
        for &size in &a.sizes_mib {
            for (mode, zc) in [("copy", false), ("zerocopy", true)] {
                stopped()?;
                let summary = dir.join(format!("summary-{mode}-{size}.json"));
                let mut refl = start_reflector(&lab, &bin, &secret_file, &summary, zc, (size << 20) + 4096)?;
                let pid = refl.child().id();
                let mut members = join(&lab, &secret, 1..kmax as u32 + 2)?;
                let mut up = members.remove(0);
                let nonce = up.wait_request()?;
                let state: Bytes = (0..size << 20).map(|i| (i % 251) as u8).collect::<Vec<_>>().into();
                let s = connect(&lab, 1)?.pop().ok_or("no connection")?;
                channel::upload_on(
                    &s,
                    SocketAddr::from((lab.reflector_ip, CK_PORT)),
                    up.member(),
                    nonce,
                    1,
                    state.clone(),
                    T,
                )
                .map_err(|e| format!("upload: {e}"))?;
                let mut cells = Vec::new();
                for &k in &a.joiners {
                    let mut v = Vec::new();
                    for _ in 0..a.repeat {
                        stopped()?;
                        v.push(fetch_all(&lab, &members[..k], &state, pid)?);
                    }
                    // The process's CPU comes in 10 ms ticks (and its
                    // connection threads are gone by the time /proc/PID/task
                    // could be read): averaged over the runs, not a median.
                    let s = Sample {
                        wall_ms: median(v.iter().map(|s| s.wall_ms).collect()),
                        reflector_cpu_ms: v.iter().map(|s| s.reflector_cpu_ms).sum::<f64>() / v.len() as f64,
                        busy_ms: median(v.iter().map(|s| s.busy_ms).collect()),
                    };
                    eprintln!(
                        "{size:>3} MiB x {k:>3} {mode:>8}: {:8.1} ms, reflector {:7.1} ms CPU, machine {:7.1} ms busy ({:.0} MiB/s)",
                        s.wall_ms,
                        s.reflector_cpu_ms,
                        s.busy_ms,
                        (size * k) as f64 / (s.wall_ms / 1e3)
                    );
                    cells.push((k, s));
                }
                // The reflector's own account of how the state went out.
                oskit::child::stop(refl.child(), Duration::from_secs(10));
                drop(refl);
                let text = std::fs::read_to_string(&summary).map_err(|e| format!("{}: {e}", summary.display()))?;
                let j: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
                let num = |k: &str| j["total"][k].as_u64().unwrap_or(0);
                let (zcs, cps) = (num("checkpoint_zerocopy_sends"), num("checkpoint_copied_sends"));
                if zc {
                    eprintln!(
                        "{size:>3} MiB zerocopy: {zcs} MSG_ZEROCOPY sends before the fall-back, {cps} copied sends"
                    );
                }
                for (k, s) in cells {
                    rows.push(Row {
                        mode,
                        size_mib: size,
                        joiners: k,
                        wall_ms: s.wall_ms,
                        reflector_cpu_ms: s.reflector_cpu_ms,
                        busy_ms: s.busy_ms,
                        zerocopy_sends: zcs,
                        copied_sends: cps,
                    });
                }
            }
        }
        drop(lab);
        write_csv(&a.out, &rows)?;
        summarize(&rows);
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn write_csv(out: &PathBuf, rows: &[Row]) -> Result<(), String> {
    let mut f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut text = String::from(
        "mode,size_mib,joiners,wall_ms,reflector_cpu_ms,machine_busy_ms,mib_per_s,zerocopy_sends,copied_sends\n",
    );
    for r in rows {
        text.push_str(&format!(
            "{},{},{},{:.2},{:.1},{:.1},{:.0},{},{}\n",
            r.mode,
            r.size_mib,
            r.joiners,
            r.wall_ms,
            r.reflector_cpu_ms,
            r.busy_ms,
            (r.size_mib * r.joiners) as f64 / (r.wall_ms / 1e3),
            r.zerocopy_sends,
            r.copied_sends
        ));
    }
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// zerocopy (fallen back) over copy, per cell: time and CPU.
fn summarize(rows: &[Row]) {
    for z in rows.iter().filter(|r| r.mode == "zerocopy") {
        if let Some(c) = rows
            .iter()
            .find(|r| r.mode == "copy" && r.size_mib == z.size_mib && r.joiners == z.joiners)
        {
            // Below ~50 ms the process's 10 ms ticks cannot tell.
            let cpu = if z.reflector_cpu_ms.min(c.reflector_cpu_ms) >= 50.0 {
                format!("{:.2}x", z.reflector_cpu_ms / c.reflector_cpu_ms)
            } else {
                "(too short to resolve)".to_string()
            };
            println!(
                "{:>3} MiB x {:>3}: zerocopy/copy time {:.2}x, machine busy {:.2}x, reflector CPU {cpu}",
                z.size_mib,
                z.joiners,
                z.wall_ms / c.wall_ms,
                z.busy_ms / c.busy_ms
            );
        }
    }
}
