//! `client-bench`: the client library's receive cost against a raw
//! `recvmmsg` loop on the same traffic (issue: the client's CPU per received
//! datagram with the Linux `recvmmsg` driver at most 1.2x the raw loop's,
//! with no allocation per datagram).
#![deny(unsafe_code)]

use bench::thread_cpu;
use clap::Parser;
use reflector_client::{Client, Config, Driver, MmsgDriver, Token, TokenSource, UdpDriver};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::protocol::{SessionKeys, MAX_DATAGRAM};
use sendpath::RecvBatch;
use std::io::Write as _;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const METHOD: &str = "\
Method: a reflector (`reflector serve`, sendmmsg backend, one thread) on 127.0.0.1; SENDERS clients send \
SIZE-byte payloads at RATE datagrams/s each for SECS seconds; three receivers are members of the same \
group at the same time, so each gets exactly the same traffic: `client-mmsg` (reflector-client over its \
Linux recvmmsg driver), `client-std` (reflector-client over a std UDP socket), and `raw-recvmmsg` (a \
socket joined with reflector-proto's blocking join, then read with recvmmsg in batches of 32 and only \
counted: the anchor). Each receiver runs on its own thread as a game loop would: sleep FRAME, then take \
everything that is waiting (the clients: update, events, recv until empty, which also answers PROBEs and \
sends ECHO keepalives). CPU: each receiving thread's user+sys time (getrusage RUSAGE_THREAD) over the \
sending window, divided by the datagrams it received. Allocations: a counting allocator counts those \
made on client-mmsg's thread in the window. The ratio is client / raw of the same repetition; the \
figure is the median over repetitions.";

#[derive(Parser)]
#[command(name = "client-bench", about = "The client's CPU per received datagram against a raw recvmmsg loop", long_about = METHOD)]
struct Args {
    /// The reflector binary (default: `reflector` next to this one).
    #[arg(long)]
    reflector: Option<PathBuf>,
    /// Sending clients.
    #[arg(long, default_value_t = 2)]
    senders: u32,
    /// Datagrams per second each sender sends.
    #[arg(long, default_value_t = 10_000)]
    rate: u32,
    /// Game payload bytes per datagram.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Seconds of sending per repetition.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Microseconds a receiver sleeps between looks (its frame): 4 ms, a
    /// 250 Hz loop, gives each look about 80 datagrams at the default rates,
    /// so the figure is the per-datagram work, not the wake-up.
    #[arg(long, default_value_t = 4000)]
    frame_us: u64,
    /// Repetitions.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// CSV output (every receiver of every repetition).
    #[arg(long, default_value = "bench/results/client.csv")]
    out: PathBuf,
}

// Allocations are counted on the measured thread only.
#[global_allocator]
static GLOBAL: bench::sys::CountingAlloc = bench::sys::CountingAlloc;

/// The reflector child, killed on drop.
struct Reflector(Child);

impl Drop for Reflector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Setup {
    secret: Secret,
    addr: SocketAddr,
}

impl Setup {
    fn token(&self, player: u32) -> Token {
        let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 3600;
        let token = TokenClaims {
            player,
            reflector: 0,
            group: self.addr.port(),
            expires_unix_s,
        }
        .sign(&self.secret);
        Token {
            reflector: self.addr.to_string(),
            group: self.addr.port(),
            player,
            token,
            session_key: SessionKeys::derive(&self.secret, &token).session,
            expires_unix_s,
            keys: Vec::new(),
        }
    }

    fn client<D: Driver>(&self, player: u32, driver: D) -> Result<Client<D>, String> {
        let cfg = Config {
            local: "127.0.0.1:0".into(),
            ..Config::new(TokenSource::Given(self.token(player)))
        };
        Client::with_driver(cfg, driver).map_err(|e| format!("client {player}: {e}"))
    }
}

fn start_reflector(bin: &PathBuf, dir: &std::path::Path) -> Result<(Reflector, Setup), String> {
    let mut key = [0u8; 32];
    getrandom_fill(&mut key)?;
    let secret = Secret::new(&key).map_err(|e| e.to_string())?;
    let secret_file = dir.join("secret");
    std::fs::write(&secret_file, key.iter().map(|b| format!("{b:02x}")).collect::<String>())
        .map_err(|e| format!("cannot write {}: {e}", secret_file.display()))?;
    let port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let child = Command::new(bin)
        .arg("serve")
        .args(["--bind", "127.0.0.1", "--ports", &port.to_string()])
        .arg("--secret-file")
        .arg(&secret_file)
        .args(["--backend", "sendmmsg", "--threads", "1"])
        .args(["--member-rate-pps", "0", "--member-rate-bytes", "0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    Ok((
        Reflector(child),
        Setup {
            secret,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        },
    ))
}

fn getrandom_fill(buf: &mut [u8]) -> Result<(), String> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(|e| format!("/dev/urandom: {e}"))
}

/// What one receiver measured in one repetition.
#[derive(Debug, Clone, Default)]
struct Measured {
    datagrams: u64,
    cpu: Duration,
    allocations: u64,
}

/// The window every receiver measures: opened and closed by the sender
/// thread through `measuring`; `stop` ends the receivers.
struct Window {
    measuring: AtomicBool,
    stop: AtomicBool,
}

/// A game loop over a client: sleep a frame, take everything. Counts only
/// while the window is open.
fn client_loop<D: Driver>(
    mut c: Client<D>,
    w: &Window,
    frame: Duration,
    ready: &Barrier,
    count_allocs: bool,
) -> Measured {
    let mut m = Measured::default();
    ready.wait();
    let (mut cpu0, mut open) = (Duration::ZERO, false);
    while !w.stop.load(Relaxed) {
        std::thread::sleep(frame);
        let now_open = w.measuring.load(Relaxed);
        if now_open && !open {
            cpu0 = thread_cpu();
            if count_allocs {
                bench::sys::count_this_thread(true);
            }
        }
        c.update(Instant::now());
        while c.poll_event().is_some() {}
        let mut n = 0;
        while c.recv().is_some() {
            n += 1;
        }
        if now_open {
            m.datagrams += n;
        }
        if !now_open && open {
            bench::sys::count_this_thread(false);
            m.cpu = thread_cpu() - cpu0;
        }
        open = now_open;
    }
    m.allocations = if count_allocs { bench::sys::allocations() } else { 0 };
    m
}

/// The anchor: recvmmsg in batches of 32, each datagram only counted.
fn raw_loop(sock: UdpSocket, w: &Window, frame: Duration, ready: &Barrier) -> Measured {
    let mut m = Measured::default();
    let mut batch = RecvBatch::new(32, MAX_DATAGRAM);
    let _ = sock.set_nonblocking(true);
    ready.wait();
    let (mut cpu0, mut open) = (Duration::ZERO, false);
    while !w.stop.load(Relaxed) {
        std::thread::sleep(frame);
        let now_open = w.measuring.load(Relaxed);
        if now_open && !open {
            cpu0 = thread_cpu();
        }
        let mut n = 0u64;
        while let Ok(k) = batch.recv(sock.as_fd()) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        if now_open {
            m.datagrams += n;
        }
        if !now_open && open {
            m.cpu = thread_cpu() - cpu0;
        }
        open = now_open;
    }
    m
}

const RECEIVERS: [&str; 3] = ["client-mmsg", "client-std", "raw-recvmmsg"];

fn one_rep(a: &Args, setup: &Setup, rep: usize) -> Result<(Vec<Measured>, u64), String> {
    // Players: 1.. senders, 1001.. receivers (fresh ids each repetition).
    let base = 10_000 * (rep as u32 + 1);
    let mut senders: Vec<Client> = (0..a.senders)
        .map(|i| setup.client(base + i, UdpDriver::bind("127.0.0.1:0").map_err(|e| e.to_string())?))
        .collect::<Result<_, _>>()?;
    let mmsg = setup.client(base + 1001, MmsgDriver::bind("127.0.0.1:0").map_err(|e| e.to_string())?)?;
    let std_c = setup.client(base + 1002, UdpDriver::bind("127.0.0.1:0").map_err(|e| e.to_string())?)?;
    let raw = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let t = setup.token(base + 1003);
    let req = reflector_proto::client::JoinRequest {
        reflector: setup.addr,
        group: t.group,
        player: t.player,
        token: t.token,
        keys: SessionKeys::from_session(t.session_key),
        first_seq: 1,
    };
    let cfg = reflector_proto::client::Config {
        give_up: Some(Duration::from_secs(5)),
        ..Default::default()
    };
    reflector_proto::blocking::join(&raw, req, cfg).map_err(|e| format!("raw receiver: {e}"))?;

    // Join the clients (the senders here, the receivers on their threads
    // once started: each is polled only by its own thread).
    let mut mmsg = mmsg;
    let mut std_c = std_c;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(senders.iter().all(|s| s.is_member()) && mmsg.is_member() && std_c.is_member()) {
        if Instant::now() > deadline {
            return Err("the clients did not join within 5 s (is the reflector running?)".into());
        }
        for c in senders.iter_mut() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
        }
        mmsg.update(Instant::now());
        while mmsg.poll_event().is_some() {}
        std_c.update(Instant::now());
        while std_c.poll_event().is_some() {}
        std::thread::sleep(Duration::from_millis(1));
    }

    let w = Window {
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    };
    let frame = Duration::from_micros(a.frame_us);
    let ready = Barrier::new(4);
    bench::sys::reset_allocations();
    let payload = vec![0x5au8; a.size];
    let (results, sent) = std::thread::scope(|s| {
        let h1 = s.spawn(|| client_loop(mmsg, &w, frame, &ready, true));
        let h2 = s.spawn(|| client_loop(std_c, &w, frame, &ready, false));
        let h3 = s.spawn(|| raw_loop(raw, &w, frame, &ready));
        ready.wait();
        // Warm up half a second, then the window, then a tail for what is
        // in flight (not counted).
        let total = Duration::from_secs_f64(a.secs);
        let warm = Duration::from_millis(500);
        let t0 = Instant::now();
        let tick = Duration::from_millis(1);
        let per_tick = f64::from(a.rate) / 1000.0;
        let mut owed = 0.0f64;
        let mut counted = 0u64;
        while t0.elapsed() < warm + total {
            let in_window = t0.elapsed() >= warm;
            if in_window && !w.measuring.load(Relaxed) {
                w.measuring.store(true, Relaxed);
            }
            owed += per_tick;
            while owed >= 1.0 {
                for c in senders.iter_mut() {
                    if c.send(&payload).is_ok() && in_window {
                        counted += 1;
                    }
                }
                owed -= 1.0;
            }
            for c in senders.iter_mut() {
                c.update(Instant::now());
                while c.poll_event().is_some() {}
            }
            std::thread::sleep(tick);
        }
        // Let the last datagrams arrive before the window closes.
        std::thread::sleep(Duration::from_millis(50));
        w.measuring.store(false, Relaxed);
        std::thread::sleep(frame * 3 + Duration::from_millis(20));
        w.stop.store(true, Relaxed);
        let r = vec![
            h1.join().unwrap_or_default(),
            h2.join().unwrap_or_default(),
            h3.join().unwrap_or_default(),
        ];
        (r, counted)
    });
    Ok((results, sent))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> ExitCode {
    netlab::log::init_plain();
    let a = Args::parse();
    if a.senders == 0 || a.rate == 0 || a.secs.is_nan() || a.secs <= 0.0 || a.repeat == 0 || a.size == 0 {
        eprintln!("client-bench: --senders, --rate, --secs, --repeat and --size must be positive");
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
            "client-bench: {} not found: build it (`cargo build --release --workspace --bins`) or give --reflector",
            bin.display()
        );
        return ExitCode::from(2);
    }
    let dir = std::env::temp_dir().join(format!("client-bench-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("client-bench: cannot create {}: {e}", dir.display());
        return ExitCode::from(2);
    }
    let run = || -> Result<(), String> {
        let (_child, setup) = start_reflector(&bin, &dir)?;
        // The reflector binds before it reads its first datagram: the
        // first joins retry until it is up.
        let mut rows = vec![];
        let mut ratios: Vec<Vec<f64>> = vec![vec![]; 2];
        let mut allocs_per = vec![];
        for rep in 0..a.repeat {
            let (m, sent) = one_rep(&a, &setup, rep)?;
            let ns = |x: &Measured| x.cpu.as_nanos() as f64 / x.datagrams.max(1) as f64;
            let raw_ns = ns(&m[2]);
            for (i, name) in RECEIVERS.iter().enumerate() {
                let ratio = ns(&m[i]) / raw_ns;
                if i < 2 {
                    ratios[i].push(ratio);
                }
                eprintln!(
                    "  rep {}/{}: {name:<13} {:>8} of {} datagrams sent in the window, {:>7.0} ns/datagram, {:.2}x raw{}",
                    rep + 1,
                    a.repeat,
                    m[i].datagrams,
                    sent,
                    ns(&m[i]),
                    ratio,
                    if i == 0 {
                        format!(", {} allocations", m[i].allocations)
                    } else {
                        String::new()
                    }
                );
                rows.push(format!(
                    "{},{name},{},{},{},{},{},{},{},{},{:.1},{:.4},{}",
                    rep + 1,
                    a.senders,
                    a.rate,
                    a.size,
                    a.frame_us,
                    sent,
                    m[i].datagrams,
                    m[i].cpu.as_nanos(),
                    a.secs,
                    ns(&m[i]),
                    ratio,
                    if i == 0 {
                        m[i].allocations.to_string()
                    } else {
                        String::new()
                    }
                ));
            }
            allocs_per.push(m[0].allocations as f64 / m[0].datagrams.max(1) as f64);
        }
        if let Some(parent) = a.out.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let mut f = std::fs::File::create(&a.out).map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
        writeln!(
            f,
            "rep,receiver,senders,rate_per_sender,size,frame_us,sent_in_window,received,cpu_ns,secs,ns_per_datagram,ratio_vs_raw,allocations"
        )
        .and_then(|()| rows.iter().try_for_each(|r| writeln!(f, "{r}")))
        .map_err(|e| format!("cannot write {}: {e}", a.out.display()))?;
        let mmsg = median(&mut ratios[0]);
        let std_r = median(&mut ratios[1]);
        let allocs = allocs_per.iter().cloned().fold(0.0, f64::max);
        println!(
            "client-bench: {} senders x {}/s x {} B, frame {} us, {} x {} s: client over recvmmsg {:.2}x the raw \
             recvmmsg loop (median of {}), over a std socket {:.2}x; {:.4} allocations per datagram at most",
            a.senders, a.rate, a.size, a.frame_us, a.repeat, a.secs, mmsg, a.repeat, std_r, allocs
        );
        println!("wrote {}", a.out.display());
        Ok(())
    };
    let r = run();
    let _ = std::fs::remove_dir_all(&dir);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("client-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
