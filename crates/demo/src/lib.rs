//! The main scenario (`make demo`): a reflector, its control server and
//! bots, placed in an emulated network built with netlab's library (or on
//! loopback when there is no root for namespaces), once per fan-out
//! backend, ending with one table and a non-zero exit on any loss.
//!
//! This crate sits above `netlab` and `reflector`: it knows the reflector's
//! command line and netlab's library API; neither of them knows it.
#![deny(unsafe_code)]

pub mod error;
pub mod fleet;
pub mod place;
pub mod prom;
pub mod scenario;
pub mod wire;

use error::DemoError;
use netlab::scenario::LinkSpec;
use place::{LabShape, Placement};
use reflector_bots::{MIN_SIZE_MARKED, MIN_SIZE_SEALED_MARKED};
use reflector_server::backend::BackendKind;
use reflector_server::receive::ReceiveKind;
use scenario::{checkpoint_table, cost_table, payload_faults, payload_table, table, Scenario, TempDir};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Where {
    /// In a lab when root, else on loopback (with a note).
    Auto,
    /// In a netlab star (needs root).
    Lab,
    /// On 127.0.0.1, no lab.
    Loopback,
}

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "reflector-demo",
    version,
    about = "The reflector's main scenario: control server, reflector and bots in an emulated network, one table",
    after_help = "As root (default --where auto): builds a netlab star of --clients client hosts h2.. around a \
reflector host h1, every link shaped to Fast Ethernet (100 Mb/s; --gigabit for 1 Gb/s), starts the control \
server and the reflector on h1 and one bots process whose sockets are spread over the client hosts, all through \
the lab's launcher; runs the scenario once per backend in --backends; prints titled tables (delivery: what the \
reflector forwarded and fanned out against what the bots received, with every column the reconciliation needs; \
cost and latency: reflector CPU per arrived datagram, one-way latency; checkpoints) and removes the lab. Without root the same scenario runs on 127.0.0.1.\n\n\
Every bot payload carries a marker: a random 8-byte prefix drawn for this run, then the player id and the \
bot's DATA count. In the lab the capture records everything on the reflector's link, both ways, and the demo \
scans every captured frame, whole, for the prefix (the payloads table: markers in the capture). In clear groups \
every DATA shows it; with --sealed (groups that seal game data end to end, under epoch keys from a control \
server given a sealing secret drawn for this run and never printed) there must be none, while the bots open \
what they receive and find their senders' markers inside.\n\n\
Exit status: 0 no loss, 1 loss, 2 errors (also: counters that differ, a lossy or truncated capture, and with \
--sealed a marker in the capture or no DATA captured at all), 130 interrupted.\n\n\
Examples:\n  sudo reflector-demo\n  sudo reflector-demo --clients 16 --gigabit --delay 1ms\n  \
sudo reflector-demo --sealed --backends ebpf,sendmmsg\n  \
sudo reflector-demo --prometheus --backends sendmmsg --duration 5\n  \
reflector-demo --where loopback --bots 32 --duration 5"
)]
pub struct DemoArgs {
    /// Where to run the scenario.
    #[arg(long = "where", value_enum, default_value_t = Where::Auto)]
    pub place: Where,
    /// Client hosts of the lab star.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub clients: u64,
    /// Bots (players) in all, in one process (in the lab spread evenly over the client hosts).
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u64).range(2..=5000))]
    pub bots: u64,
    /// Gigabit lab links instead of Fast Ethernet (100 Mb/s).
    #[arg(long)]
    pub gigabit: bool,
    /// One-way delay of every lab link, e.g. 1ms (default none).
    #[arg(long)]
    pub delay: Option<String>,
    /// Time dilation factor of the lab: every process in it runs under the vtime shim and sees
    /// time pass TDF times slower, and links run at rate/TDF in real time (lab only).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub tdf: u32,
    /// Traffic per backend (e.g. 10s, 1m; a bare number is seconds).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = seconds)]
    pub duration: f64,
    /// DATA per second per bot.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Datagram size in bytes, header included [default: 100; with --sealed 116, the smallest
    /// sealed DATA that holds the bots' fields and the marker]. At least 76 (116 with --sealed).
    #[arg(long)]
    pub size: Option<usize>,
    /// Sealed groups (docs/protocol.md, "Sealed payloads"): the reflector announces sealed
    /// payloads on every group (`serve --data-sealed on`) and the control server gets a sealing
    /// secret drawn for this run (a 0600 file in the run's private directory, never printed;
    /// `control --sealing-secret-file`), so every bot seals what it sends and opens what it
    /// receives. In the lab the run fails if a payload's marker appears anywhere in the capture
    /// of the reflector's link, or if nothing was captured to look at. Checkpoints are sealed too,
    /// and signed by their uploader under a certificate the control server gives with each grant
    /// (the bots send their clients' signing keys on `/join`).
    #[arg(long)]
    pub sealed: bool,
    /// Time between bot moves (e.g. 4s; a bare number is seconds; 0 = never).
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = seconds)]
    pub move_every: f64,
    /// Time between the reflector's checkpoint requests per group (e.g. 1s, 500ms; a bare
    /// number is seconds; 0: no checkpoints). Bots upload their view of the group when asked
    /// and fetch the checkpoint on every join.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = seconds)]
    pub checkpoint_every: f64,
    /// Backends to run in turn, comma separated. Default: ebpf,sendmmsg,sendto in the lab;
    /// sendmmsg,sendto on loopback (the eBPF fan-out replicates on devices, not on loopback).
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<BackendKind>,
    /// How the reflector receives (its --receive).
    #[arg(long, value_enum, default_value_t = ReceiveKind::default())]
    pub receive: ReceiveKind,
    /// Groups (reflector ports).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub groups: u64,
    /// World grid COLSxROWS mapped onto the groups.
    #[arg(long, default_value = "8x8")]
    pub grid: String,
    /// First group port (consecutive ports); default 4000 in the lab, free ports on loopback.
    #[arg(long)]
    pub base_port: Option<u16>,
    /// Control server port; default 8700 in the lab, a free port on loopback.
    #[arg(long)]
    pub control_port: Option<u16>,
    /// Reflector event-loop threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Seed for the bots.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The reflector binary (default: `reflector` next to this program).
    #[arg(long)]
    pub reflector_bin: Option<PathBuf>,
    /// The netlab binary, for its delay lines (default: `netlab` next to this program).
    #[arg(long)]
    pub netlab_bin: Option<PathBuf>,
    /// The capture binary that counts DATA on the reflector's link in the lab (default:
    /// `capture` next to this program).
    #[arg(long)]
    pub capture_bin: Option<PathBuf>,
    /// Also run a real Prometheus beside the reflector (on h1 in the lab), scraping the
    /// reflector's /metrics and the control server's every second, and fail unless both were
    /// up with no scrape error. PATH: the prometheus binary (default: `prometheus` on PATH,
    /// Debian's package). Not with --tdf (Prometheus reads the clock without the shim).
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "prometheus")]
    pub prometheus: Option<PathBuf>,
}

impl DemoArgs {
    /// The bots' `--size`: given, or the default for clear or sealed groups.
    pub fn size(&self) -> usize {
        self.size
            .unwrap_or(if self.sealed { MIN_SIZE_SEALED_MARKED } else { 100 })
    }
}

/// A binary next to this program, or the one given; it must exist.
pub(crate) fn sibling(given: &Option<PathBuf>, name: &str, flag: &str) -> Result<PathBuf, DemoError> {
    let p = match given {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this program's path: {e}"))?
            .with_file_name(name),
    };
    if !p.is_file() {
        return Err(format!(
            "{name} binary {} not found (build it with `cargo build --release --workspace --bins`, or pass {flag})",
            p.display()
        )
        .into());
    }
    Ok(p)
}

/// A duration with its unit, or bare seconds, as seconds.
fn seconds(s: &str) -> Result<f64, String> {
    oskit::units::secs_or_duration(s).map(|d| d.as_secs_f64())
}

/// Checks everything that can be checked before anything starts.
fn validate(args: &DemoArgs) -> Result<(), DemoError> {
    if !(args.duration.is_finite() && (0.5..=3600.0).contains(&args.duration)) {
        return Err(format!("--duration must be between 0.5 and 3600 seconds, got {}", args.duration).into());
    }
    reflector_control::parse_grid(&args.grid).map_err(|e| format!("--grid: {e}"))?;
    let (min, why) = if args.sealed {
        (
            MIN_SIZE_SEALED_MARKED,
            "with --sealed: a sealed DATA's 72 bytes of header, instance, sealing and tag, \
the bots' 28 bytes and the 16-byte marker",
        )
    } else {
        (MIN_SIZE_MARKED, "the header, the bots' 28 bytes and the 16-byte marker")
    };
    if !(min..=reflector_bots::MAX_SIZE).contains(&args.size()) {
        return Err(format!(
            "--size {} is out of range: from {min} ({why}) to {} bytes (one Ethernet frame)",
            args.size(),
            reflector_bots::MAX_SIZE
        )
        .into());
    }
    if !(args.checkpoint_every == 0.0 || (args.checkpoint_every.is_finite() && args.checkpoint_every >= 0.1)) {
        return Err(format!(
            "--checkpoint-every must be 0 (off) or at least 0.1 seconds, got {}",
            args.checkpoint_every
        )
        .into());
    }
    Ok(())
}

/// A program of this crate from `main`: the lab's notes on stderr, Ctrl-C
/// and SIGTERM turned into `stop` (a second one ignored, so the lab's
/// removal is never cut short), and the outcome as the exit status: the
/// run's own, 130 when interrupted, 2 with the error on stderr.
pub fn main_with(name: &str, run: impl FnOnce(&AtomicBool) -> Result<i32, DemoError>) -> std::process::ExitCode {
    use std::process::ExitCode;
    netlab::log::init_plain();
    let stop = match oskit::signal::flag_on(
        &[oskit::signal::SIGINT, oskit::signal::SIGTERM],
        oskit::signal::Second::Ignore,
    ) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{name}: cannot install signal handlers: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&stop) {
        Ok(code) => ExitCode::from(code.clamp(0, 255) as u8),
        Err(_) if stop.load(std::sync::atomic::Ordering::Relaxed) => {
            eprintln!("{name}: interrupted; children stopped, lab removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("{name}: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Where the ebpf row's CPU is (not) counted: printed under the cost table
/// and carried into the JSON for the plot.
pub const SOFTIRQ_NOTE: &str = "ebpf: reflector cpu is the reflector process only; its in-kernel copies run in \
softirq, which on veth is charged to the sending bots: `make bench` measures CPU per copy with softirq included";

/// Runs the demo; returns the exit status.
pub fn run(args: DemoArgs, stop: &AtomicBool) -> Result<i32, DemoError> {
    validate(&args)?;
    let reflector_bin = sibling(&args.reflector_bin, "reflector", "--reflector-bin")?;
    let root = nix::unistd::geteuid().is_root();
    let in_lab = match args.place {
        Where::Lab if !root => return Err("--where lab needs root (network namespaces): run with sudo".into()),
        Where::Lab => true,
        Where::Auto if !root => {
            eprintln!("demo: not root, so no lab (namespaces need root): running the same scenario on loopback");
            false
        }
        Where::Auto => true,
        Where::Loopback => false,
    };
    if args.tdf > 1 && !in_lab {
        return Err(
            "--tdf needs the lab (--where lab, as root): on loopback use `vtime run --tdf N -- reflector-demo ...`"
                .into(),
        );
    }
    let mut args = args;
    if args.backends.is_empty() {
        args.backends = if in_lab {
            BackendKind::NAMED.to_vec()
        } else {
            BackendKind::ALL.to_vec()
        };
    }
    if let Some(b) = args.backends.iter().find(|b| !b.loopback()).filter(|_| !in_lab) {
        return Err(format!(
            "--backends {b} needs the lab (--where lab, as root): it replicates on devices, not on loopback"
        )
        .into());
    }
    if args.prometheus.is_some() && args.tdf > 1 {
        return Err(
            "--prometheus with --tdf: Prometheus reads the clock without the vtime shim, so its scrape \
times would not be the lab's; run one or the other"
                .into(),
        );
    }
    let prometheus_bin = args.prometheus.as_deref().map(prom::binary).transpose()?;
    let capture_bin = if in_lab {
        Some(sibling(&args.capture_bin, "capture", "--capture-bin")?)
    } else {
        None
    };
    let place = if in_lab {
        let spec = LinkSpec {
            bw: Some(if args.gigabit { "1gbit" } else { "100mbit" }.into()),
            delay: args.delay.clone(),
            ..Default::default()
        };
        let shape = LabShape {
            clients: args.clients as usize,
            link: spec.apply_to("link", &Default::default())?,
            netlab_bin: sibling(&args.netlab_bin, "netlab", "--netlab-bin")?,
            tdf: netlab::plan::Tdf::new(u64::from(args.tdf), 1).map_err(|e| format!("--tdf {}: {e}", args.tdf))?,
        };
        Placement::lab(&shape, stop)?
    } else {
        Placement::Loopback
    };
    // On error `place` is dropped, and with it the lab.
    let dir = TempDir::new()?;
    let secret = dir.0.join("secret");
    let mut key = [0u8; 32];
    getrandom::getrandom(&mut key).map_err(|e| format!("no random source: {e}"))?;
    std::fs::write(&secret, hex::encode(key)).map_err(|e| format!("cannot write {}: {e}", secret.display()))?;
    let ticket_keys = dir.0.join("tickets.toml");
    getrandom::getrandom(&mut key).map_err(|e| format!("no random source: {e}"))?;
    std::fs::write(
        &ticket_keys,
        format!(
            "[[key]]\nkid = \"demo\"\nalg = \"HS256\"\nsecret_hex = \"{}\"\n",
            hex::encode(key)
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", ticket_keys.display()))?;
    // The sealing secret: only the control server reads it (never a
    // reflector), from the run's private directory; it is never printed.
    let sealing_secret = if args.sealed {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let p = dir.0.join("sealing-secret");
        getrandom::getrandom(&mut key).map_err(|e| format!("no random source: {e}"))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)
            .and_then(|mut f| f.write_all(hex::encode(key).as_bytes()))
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        Some(p)
    } else {
        None
    };
    // The run's marker prefix: 8 random bytes, in every bot payload.
    let mut marker = [0u8; 8];
    getrandom::getrandom(&mut marker).map_err(|e| format!("no random source: {e}"))?;
    let sc = Scenario {
        args: &args,
        place: &place,
        reflector_bin,
        capture_bin,
        prometheus_bin,
        dir: &dir.0,
        secret,
        ticket_keys,
        sealing_secret,
        marker,
    };
    let mut rows = Vec::new();
    for &b in &args.backends {
        let row = sc.run(b, stop)?;
        eprintln!(
            "demo [{b}]: sent {}, received {}/{} expected, lost {}",
            row.sent, row.received, row.expected, row.lost
        );
        rows.push(row);
    }
    let parameters = format!(
        "reflector demo {}{}: {} bots, {} s per backend, {} Hz x {} B, moves every {} s, {} groups, {}",
        place.describe(),
        if args.tdf > 1 {
            format!(" at TDF {} (times are virtual)", args.tdf)
        } else {
            String::new()
        },
        args.bots,
        args.duration,
        args.rate,
        args.size(),
        args.move_every,
        args.groups,
        if args.sealed {
            "sealed payloads"
        } else {
            "clear payloads"
        }
    );
    println!("\n{parameters}\n");
    place.finish()?;
    print!("{}", table(&rows));
    print!("\n{}", cost_table(&rows));
    let softirq_note = args.backends.contains(&BackendKind::Ebpf).then_some(SOFTIRQ_NOTE);
    if let Some(note) = softirq_note {
        // The per-process figure would flatter the kernel path: say so.
        println!("  ({note})");
    }
    if args.checkpoint_every > 0.0 {
        print!("\n{}", checkpoint_table(&rows));
    }
    print!("\n{}", payload_table(&rows, args.sealed, &marker));
    if let Some(p) = &args.json {
        let doc = serde_json::json!({
            "parameters": parameters,
            "cpu_note": softirq_note,
            "sealed": args.sealed,
            "marker": hex::encode(marker),
            "rows": rows,
        });
        std::fs::write(p, serde_json::to_string_pretty(&doc)?)
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    let lost: u64 = rows.iter().map(|r| r.lost).sum();
    let errors: u64 = rows.iter().map(|r| r.errors).sum();
    let mismatch = rows.iter().any(|r| !r.counters_match);
    let payload_faults: Vec<String> = rows.iter().flat_map(|r| payload_faults(r, args.sealed)).collect();
    Ok(if errors > 0 || mismatch || !payload_faults.is_empty() {
        println!();
        if errors > 0 || mismatch {
            println!(
                "FAIL: {errors} error(s){}",
                if mismatch {
                    ", reflector and bot counters differ"
                } else {
                    ""
                }
            );
        }
        for f in &payload_faults {
            println!("FAIL: {f}");
        }
        2
    } else if lost > 0 {
        println!("\nFAIL: {lost} datagram(s) lost");
        1
    } else {
        println!("\nOK: no loss; every fanned-out datagram reached its bot");
        if args.sealed && in_lab {
            println!("OK: sealed: no payload's marker anywhere in the capture of the reflector's link");
        }
        0
    })
}
