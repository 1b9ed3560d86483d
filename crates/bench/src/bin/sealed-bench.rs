//! `sealed-bench`: the client library's CPU per sent and per received
//! datagram in a sealed group against the same in a clear group (issue:
//! sealed at most 1.3x clear at 100 B and 1,000 B).
#![deny(unsafe_code)]

use clap::Parser;
use reflector_client::{CellKey, Client, Config, Token, TokenSource, UdpDriver};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::protocol::SessionKeys;
use reflector_proto::sealed::{CellId, MasterSecret, WorldId};
use std::io::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method: one reflector (`reflector serve`, sendmmsg backend, one thread) on 127.0.0.1 with two groups, \
both with the instance flag on (`--data-instance on`), one of them sealed (`--group-data-sealed \
PORT=on`), so the only difference between them is sealing. Every client holds the same epoch key (set \
in its token as a control server would hand it out), used only in the sealed group. For each payload \
SIZE, repetitions alternate clear and sealed (clear first); in each, a fresh sender client and a fresh \
receiver client join the mode's group, and the sender sends RATE datagrams/s for SECS seconds in \
bursts of one tick (2 ms). Send CPU: the sending thread's CPU time (clock_gettime \
CLOCK_THREAD_CPUTIME_ID, user+sys to the ns: getrusage RUSAGE_THREAD advances only at context switches \
and ticks, too coarse for a burst between two sleeps) around each burst of `Client::send` calls only (seal + tag + sendto, and the loopback delivery the \
kernel does in that sendto), summed, divided by the datagrams sent. Receive CPU: the receiving \
thread, a game loop that sleeps FRAME and then takes everything waiting (update, events, recv until \
empty: the std socket driver's recv, the tag check and, sealed, the open), its thread time around \
that work only (not the sleep), divided by the datagrams received. Correctness, checked in every \
repetition (it is run again, at most twice, and the run fails if it still does not hold): the receiver gets exactly the datagrams sent, each SIZE bytes, \
and its sealed_* drop counters are 0. The clear figure is the anchor: the ratio is sealed / clear of \
adjacent repetitions (pair i: clear rep i, sealed rep i); printed as min / median / max over pairs.";

#[derive(Parser)]
#[command(name = "sealed-bench", about = "The client's CPU per datagram, sealed vs clear groups", long_about = METHOD)]
struct Args {
    /// The reflector binary (default: `reflector` next to this one).
    #[arg(long)]
    reflector: Option<PathBuf>,
    /// Game payload sizes, bytes.
    #[arg(long, default_value = "100,1000", value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Datagrams per second the sender sends.
    #[arg(long, default_value_t = 5_000)]
    rate: u32,
    /// Seconds of sending per repetition.
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Microseconds the receiver sleeps between looks (its frame).
    #[arg(long, default_value_t = 4000)]
    frame_us: u64,
    /// Repetitions per (size, mode), alternating clear and sealed.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// CSV output (every repetition).
    #[arg(long, default_value = "bench/results/sealed.csv")]
    out: PathBuf,
}

/// This thread's CPU time now, to the nanosecond. Not getrusage: on this
/// kernel its thread times advance only at context switches and timer
/// ticks, so a burst timed between a wake-up and the next sleep would read
/// as nothing; CLOCK_THREAD_CPUTIME_ID brings the runtime up to date first.
fn thread_cpu() -> Duration {
    use nix::time::{clock_gettime, ClockId};
    clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

/// A burst goes out every tick.
const TICK: Duration = Duration::from_millis(2);

/// The reflector child, killed on drop.
struct Reflector(Child);

impl Drop for Reflector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Clear,
    Sealed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Clear => "clear",
            Mode::Sealed => "sealed",
        }
    }
}

struct Setup {
    secret: Secret,
    ip: [u8; 4],
    clear_port: u16,
    sealed_port: u16,
    keys: Vec<CellKey>,
}

impl Setup {
    fn port(&self, mode: Mode) -> u16 {
        match mode {
            Mode::Clear => self.clear_port,
            Mode::Sealed => self.sealed_port,
        }
    }

    fn token(&self, player: u32, mode: Mode) -> Token {
        let group = self.port(mode);
        let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 3600;
        let token = TokenClaims {
            player,
            reflector: 0,
            group,
            expires_unix_s,
        }
        .sign(&self.secret);
        Token {
            reflector: SocketAddr::from((self.ip, group)).to_string(),
            group,
            player,
            token,
            session_key: SessionKeys::derive(&self.secret, &token).session,
            expires_unix_s,
            keys: self.keys.clone(),
        }
    }

    fn client(&self, player: u32, mode: Mode) -> Result<Client, String> {
        let cfg = Config {
            local: "127.0.0.1:0".into(),
            ..Config::new(TokenSource::Given(self.token(player, mode)))
        };
        let driver = UdpDriver::bind("127.0.0.1:0").map_err(|e| format!("client {player}: {e}"))?;
        Client::with_driver(cfg, driver).map_err(|e| format!("client {player}: {e}"))
    }
}

fn free_port() -> Result<u16, String> {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn random(buf: &mut [u8]) -> Result<(), String> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| format!("/dev/urandom: {e}"))
}

fn start_reflector(bin: &PathBuf, dir: &std::path::Path) -> Result<(Reflector, Setup), String> {
    let mut key = [0u8; 32];
    random(&mut key)?;
    let secret = Secret::new(&key).map_err(|e| e.to_string())?;
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, key.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .map_err(|e| format!("cannot write {}: {e}", secret_file.display()))?;
    let clear_port = free_port()?;
    let mut sealed_port = free_port()?;
    while sealed_port == clear_port {
        sealed_port = free_port()?;
    }
    let child = Command::new(bin)
        .arg("serve")
        .args(["--bind", "127.0.0.1", "--ports", &format!("{clear_port},{sealed_port}")])
        .arg("--secret-file")
        .arg(&secret_file)
        .args(["--backend", "sendmmsg", "--threads", "1"])
        .args(["--member-rate-pps", "0", "--member-rate-bytes", "0"])
        .args(["--data-instance", "on"])
        .args(["--group-data-sealed", &format!("{sealed_port}=on")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    // One epoch key, as a control server with a sealing secret would hand
    // it out for the group's cell: current for the whole run.
    let mut master = [0u8; 32];
    random(&mut master)?;
    let master = MasterSecret::new(&master).map_err(|e| e.to_string())?;
    let cell = CellId::new(WorldId::from_name("sealed-bench"), 0, 0).map_err(|e| e.to_string())?;
    let now = reflector_proto::unix_now_ms() / 1000;
    let keys = vec![CellKey {
        cell: [0, 0],
        key: master.epoch_key(cell, 1),
        starts_unix_s: now - 10,
        ends_unix_s: now + 3600,
    }];
    Ok((
        Reflector(child),
        Setup {
            secret,
            ip: [127, 0, 0, 1],
            clear_port,
            sealed_port,
            keys,
        },
    ))
}

/// One repetition's figures.
#[derive(Debug, Clone, Default)]
struct Measured {
    sent: u64,
    send_cpu: Duration,
    received: u64,
    recv_cpu: Duration,
}

fn join(clients: &mut [&mut Client]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !clients.iter().all(|c| c.is_member()) {
        if Instant::now() > deadline {
            return Err("the clients did not join within 5 s (is the reflector running?)".into());
        }
        for c in clients.iter_mut() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// The receiver's game loop until `stop`: the datagrams it took, the
/// thread CPU of taking them, and any that were not `size` bytes.
/// `got` follows the count, for the sender's wait.
fn receive_loop(
    mut c: Client,
    stop: &AtomicBool,
    got: &AtomicU64,
    frame: Duration,
    size: usize,
) -> (Client, u64, Duration, u64) {
    let (mut n, mut cpu, mut wrong) = (0u64, Duration::ZERO, 0u64);
    while !stop.load(Relaxed) {
        std::thread::sleep(frame);
        let t0 = thread_cpu();
        c.update(Instant::now());
        while c.poll_event().is_some() {}
        while let Some(d) = c.recv() {
            n += 1;
            if d.payload.len() != size {
                wrong += 1;
            }
        }
        cpu += thread_cpu() - t0;
        got.store(n, Relaxed);
    }
    (c, n, cpu, wrong)
}

fn one_rep(a: &Args, setup: &Setup, size: usize, mode: Mode, player: u32) -> Result<Measured, String> {
    let mut tx = setup.client(player, mode)?;
    let mut rx = setup.client(player + 1, mode)?;
    join(&mut [&mut tx, &mut rx])?;
    let stop = AtomicBool::new(false);
    let got = AtomicU64::new(0);
    let frame = Duration::from_micros(a.frame_us);
    let payload = vec![0x5au8; size];
    let total = (f64::from(a.rate) * a.secs).round() as u64;
    let per_tick = (f64::from(a.rate) * TICK.as_secs_f64()).max(1.0) as u64;
    let (m, rx, wrong) = std::thread::scope(|s| -> Result<(Measured, Client, u64), String> {
        let h = s.spawn(|| receive_loop(rx, &stop, &got, frame, size));
        let mut m = Measured::default();
        let mut failed = None;
        let t0 = Instant::now();
        let mut next = t0;
        while m.sent < total && failed.is_none() {
            let burst = per_tick.min(total - m.sent);
            let c0 = thread_cpu();
            for _ in 0..burst {
                match tx.send(&payload) {
                    Ok(_) => m.sent += 1,
                    Err(e) => {
                        failed = Some(e.to_string());
                        break;
                    }
                }
            }
            m.send_cpu += thread_cpu() - c0;
            tx.update(Instant::now());
            while tx.poll_event().is_some() {}
            next += TICK;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        // Wait (bounded) for the last datagrams to arrive, then stop.
        let deadline = Instant::now() + Duration::from_secs(2);
        while got.load(Relaxed) < m.sent && Instant::now() < deadline {
            tx.update(Instant::now());
            while tx.poll_event().is_some() {}
            std::thread::sleep(Duration::from_millis(5));
        }
        // Anything extra (a duplicate) would arrive within a few frames.
        std::thread::sleep(frame * 2);
        stop.store(true, Relaxed);
        let (rx, n, cpu, wrong) = h.join().map_err(|_| "the receiver thread panicked".to_string())?;
        if let Some(e) = failed {
            return Err(format!("{} send failed after {} datagrams: {e}", mode.name(), m.sent));
        }
        m.received = n;
        m.recv_cpu = cpu;
        Ok((m, rx, wrong))
    })?;
    let st = rx.stats();
    let drops = st.sealed_malformed
        + st.sealed_version
        + st.sealed_no_key
        + st.sealed_replay
        + st.sealed_bad
        + st.sealed_duplicate;
    if m.received != m.sent || wrong > 0 || drops > 0 {
        return Err(format!(
            "{} {size} B: the receiver got {} of {} datagrams ({wrong} of the wrong size), sealed drops {drops} \
             (malformed {}, version {}, no key {}, replay {}, bad {}, duplicate {}): not measuring failure",
            mode.name(),
            m.received,
            m.sent,
            st.sealed_malformed,
            st.sealed_version,
            st.sealed_no_key,
            st.sealed_replay,
            st.sealed_bad,
            st.sealed_duplicate
        ));
    }
    Ok(m)
}

fn ns_per(cpu: Duration, n: u64) -> f64 {
    cpu.as_nanos() as f64 / n.max(1) as f64
}

/// (min, median, max).
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn main() -> ExitCode {
    netlab::log::init_plain();
    let a = Args::parse();
    if a.rate == 0 || a.secs.is_nan() || a.secs <= 0.0 || a.repeat == 0 || a.sizes.is_empty() {
        eprintln!("sealed-bench: --rate, --secs, --repeat must be positive and --sizes not empty");
        return ExitCode::from(2);
    }
    if let Some(s) = a
        .sizes
        .iter()
        .find(|&&s| s == 0 || s > reflector_client::MAX_PAYLOAD_SEALED)
    {
        eprintln!(
            "sealed-bench: --sizes {s}: each must be in 1..={} (the largest sealed payload)",
            reflector_client::MAX_PAYLOAD_SEALED
        );
        return ExitCode::from(2);
    }
    let bin = a.reflector.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(|d| d.join("reflector")))
            .unwrap_or_else(|| PathBuf::from("reflector"))
    });
    if !bin.is_file() {
        eprintln!(
            "sealed-bench: {} not found: build it (`cargo build --release --workspace --bins`) or give --reflector",
            bin.display()
        );
        return ExitCode::from(2);
    }
    let dir = std::env::temp_dir().join(format!("sealed-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("sealed-bench: cannot create {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let run = || -> Result<(), String> {
        eprintln!("{METHOD}\n");
        let (_child, setup) = start_reflector(&bin, &dir)?;
        let mut rows = vec![];
        let mut summary = vec![];
        let mut player = 1u32;
        for &size in &a.sizes {
            // [direction][mode] -> ns per datagram, per repetition.
            let mut ns: [[Vec<f64>; 2]; 2] = Default::default();
            for rep in 0..a.repeat {
                for (k, mode) in [Mode::Clear, Mode::Sealed].into_iter().enumerate() {
                    // A repetition that lost a datagram (a busy machine can
                    // overflow a socket buffer) is run again, at most twice,
                    // and said so; the run fails if it still does.
                    let mut tries = 0;
                    let m = loop {
                        let r = one_rep(&a, &setup, size, mode, player);
                        player += 2;
                        match r {
                            Ok(m) => break m,
                            Err(e) if tries < 2 => {
                                tries += 1;
                                eprintln!("  {size:>5} B rep {} {}: {e}; run again", rep + 1, mode.name());
                            }
                            Err(e) => return Err(e),
                        }
                    };
                    let (s, r) = (ns_per(m.send_cpu, m.sent), ns_per(m.recv_cpu, m.received));
                    ns[0][k].push(s);
                    ns[1][k].push(r);
                    eprintln!(
                        "  {size:>5} B rep {}/{} {:<6}: sent {} ({s:>6.0} ns CPU each), received {} ({r:>6.0} ns CPU each)",
                        rep + 1,
                        a.repeat,
                        mode.name(),
                        m.sent,
                        m.received
                    );
                    rows.push(format!(
                        "{size},{},{},{},{},{},{:.1},{},{},{:.1},{},{}",
                        mode.name(),
                        rep + 1,
                        a.rate,
                        a.secs,
                        m.sent,
                        s,
                        m.send_cpu.as_nanos(),
                        m.received,
                        r,
                        m.recv_cpu.as_nanos(),
                        a.frame_us
                    ));
                }
            }
            for (d, dir_name) in ["send", "recv"].iter().enumerate() {
                let ratios: Vec<f64> = ns[d][1].iter().zip(&ns[d][0]).map(|(s, c)| s / c).collect();
                let (clo, cmed, chi) = spread(&ns[d][0]);
                let (slo, smed, shi) = spread(&ns[d][1]);
                let (rlo, rmed, rhi) = spread(&ratios);
                println!(
                    "sealed-bench {size:>5} B {dir_name}: clear {:.2} us/datagram ({:.2}-{:.2}), sealed {:.2} ({:.2}-{:.2}); \
                     sealed/clear {rmed:.2}x (min {rlo:.2}, max {rhi:.2}, {} pairs; goal <= 1.3x)",
                    cmed / 1e3,
                    clo / 1e3,
                    chi / 1e3,
                    smed / 1e3,
                    slo / 1e3,
                    shi / 1e3,
                    ratios.len()
                );
                summary.push(format!(
                    "{size},{dir_name},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{rlo:.4},{rmed:.4},{rhi:.4}",
                    clo, cmed, chi, slo, smed, shi
                ));
            }
        }
        let write = |path: &PathBuf, header: &str, lines: &[String]| -> Result<(), String> {
            if let Some(parent) = path.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let mut f = std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            writeln!(f, "{header}")
                .and_then(|()| lines.iter().try_for_each(|r| writeln!(f, "{r}")))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        write(
            &a.out,
            "size,mode,rep,rate,secs,sent,send_ns_per_datagram,send_cpu_ns,received,recv_ns_per_datagram,recv_cpu_ns,frame_us",
            &rows,
        )?;
        let summary_path = a.out.with_file_name(format!(
            "{}_summary.csv",
            a.out.file_stem().and_then(|s| s.to_str()).unwrap_or("sealed")
        ));
        write(
            &summary_path,
            "size,direction,clear_ns_min,clear_ns_median,clear_ns_max,sealed_ns_min,sealed_ns_median,sealed_ns_max,ratio_min,ratio_median,ratio_max",
            &summary,
        )?;
        println!("wrote {} and {}", a.out.display(), summary_path.display());
        Ok(())
    };
    let r = run();
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sealed-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
