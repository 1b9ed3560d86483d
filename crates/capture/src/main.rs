//! `capture`: a tcpdump-like packet capture for high packet rates, and
//! `capture gen`, a packet generator.
#![deny(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::time::Duration;

use capture::{Capture, CaptureConfig, Compression, Control, Format, Limits, Mode, RingConfig, Sink, Support};
use capture::{Dump, PrintOptions, TsFormat};
use clap::{ArgAction, Args, Parser, Subcommand};

mod gen_command;

use gen_command::{run_gen, GenArgs};

#[derive(Parser, Debug)]
#[command(
    name = "capture",
    version,
    about = "Packet capture for high packet rates (AF_PACKET recv, TPACKET_V2, TPACKET_V3, fanout) with exact loss accounting",
    long_about = "Captures packets like tcpdump, with the capture path selectable:\n\
  recv  one recvfrom() per packet, no ring\n\
  v2    TPACKET_V2 ring, a poll() whenever the next slot is empty (libpcap 1.0 style)\n\
  v3    TPACKET_V3 block ring: the reader wakes once per full block or per block timeout\n\
        (\"N packets or m µs\"; the default, as it loses least at high rates)\n\n\
At the end (and on SIGUSR1) it prints what the kernel accepted, what it dropped and what\n\
was captured, so a loss is never silent. Ctrl-C and SIGTERM end the capture with a\n\
complete output file.\n\n\
Examples:\n\
  capture -i eth0 -c 10 udp port 53           print 10 DNS packets\n\
  capture -i eth0 -w out.pcap --duration 10   write 10 s of traffic\n\
  capture -i eth0 -w out.pcapng --pcapng --threads 2 --cpus 0,1\n\
  capture gen -i eth0 --via txring --rate 100000 -c 1000000 --dst 10.0.0.2:9000",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    cap: CapArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Generate UDP datagrams or raw frames at a fixed rate and size.
    Gen(GenArgs),
    /// Show which capture modes this kernel and these privileges allow.
    Probe,
}

#[derive(Args, Debug)]
struct CapArgs {
    /// Interface to capture on.
    #[arg(short = 'i', long = "interface", value_name = "IFACE")]
    iface: Option<String>,
    /// Write packets to FILE (pcap unless --pcapng); "-" is stdout.
    #[arg(short = 'w', value_name = "FILE")]
    write: Option<PathBuf>,
    /// Read packets from FILE (pcap or pcapng, plain, gzip or zstd) instead of an interface: the
    /// filter applies, then they are printed, or written with -w.
    #[arg(short = 'r', value_name = "FILE", conflicts_with = "iface")]
    read: Option<PathBuf>,
    /// With -w: also print each packet on stdout, as without -w (tcpdump's --print).
    #[arg(long, requires = "write")]
    print: bool,
    /// With -w: start a new file every SECS seconds, its name the -w name formatted by strftime
    /// (e.g. -w 'trace-%H%M%S.pcap'); with -W, stop after that many files.
    #[arg(short = 'G', value_name = "SECS", requires = "write")]
    rotate_seconds: Option<u64>,
    /// With -w: start a new file once the current one holds MB million bytes of records; the
    /// files after the first are numbered (-w name, then 1, 2, ...).
    #[arg(short = 'C', value_name = "MB", requires = "write")]
    file_size_mb: Option<f64>,
    /// With -C: keep a ring of COUNT files (numbered 0..COUNT-1, then overwritten); with -G
    /// alone: stop after COUNT files.
    #[arg(short = 'W', value_name = "COUNT", value_parser = clap::value_parser!(u32).range(1..))]
    file_count: Option<u32>,
    /// Once the capture sockets are open, drop root's privileges and run as USER (its uid, its
    /// primary group, no other groups), as tcpdump does; the output file is created as USER.
    #[arg(short = 'Z', value_name = "USER")]
    user: Option<String>,
    /// Write pcapng instead of pcap (with a statistics block at the end).
    #[arg(long)]
    pcapng: bool,
    /// Stop after COUNT packets.
    #[arg(short = 'c', value_name = "COUNT")]
    count: Option<u64>,
    /// Bytes kept of each packet.
    #[arg(
        short = 's',
        long = "snapshot-length",
        value_name = "SNAPLEN",
        default_value_t = 262_144
    )]
    snaplen: u32,
    /// Stop after this many seconds (decimals allowed).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Capture path: recv, v2, v3 (AF_PACKET), or xdp (AF_XDP, for a dedicated monitor port
    /// only: its XDP program takes every received frame away from the stack). Default: the best
    /// AF_PACKET mode the probe allows; xdp only when asked for.
    #[arg(long)]
    mode: Option<Mode>,
    /// Let --mode xdp take an interface that carries IP addresses (refused by default: the host's
    /// own traffic on it would stop reaching the stack and its applications).
    #[arg(long = "xdp-on-host-interface")]
    xdp_on_host_interface: bool,
    /// Socket buffer / ring size in KiB (like tcpdump -B).
    #[arg(short = 'B', long = "buffer-size", value_name = "KIB", default_value_t = 8192)]
    buffer_kib: u32,
    /// v3 block size in KiB: the reader is woken once per block (the paper's N). Default: derived
    /// from -B so the ring has at least 8 blocks (512 KiB for the default 8 MiB ring).
    #[arg(long = "block-size", value_name = "KIB", value_parser = clap::value_parser!(u32).range(4..))]
    block_kib: Option<u32>,
    /// v3 block retire timeout in ms: a partly filled block is handed over after this (the paper's m).
    #[arg(long = "block-timeout", value_name = "MS", default_value_t = 20)]
    block_timeout_ms: u32,
    /// Capture threads joined in a PACKET_FANOUT group (hash by flow). The xdp mode runs one per
    /// receive queue of the interface.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// CPUs to pin the threads to, e.g. 0,1 (thread i gets the i-th, round robin).
    #[arg(long, value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Compress the written stream: zlib:LEVEL (0-9, gzip format) or zstd:LEVEL (1-22).
    #[arg(long, value_name = "ALG:LEVEL")]
    compress: Option<Compression>,
    /// Packet-buffered output: each packet is readable from the file as soon as it is captured
    /// (a compressed stream ends a frame per packet). Without it, every batch the kernel hands
    /// over is written and the file is made readable at least once a second.
    #[arg(short = 'U', long = "packet-buffered")]
    packet_buffered: bool,
    /// Nanosecond timestamps in the output file (default microseconds).
    #[arg(long)]
    nano: bool,
    /// Direction: inout (default), in (ignore packets this host sends) or out (only packets this
    /// host sends).
    #[arg(short = 'Q', long, default_value = "inout", value_parser = ["in", "out", "inout"])]
    direction: String,
    /// Do not put the interface in promiscuous mode (by default it is, while capturing, as with
    /// tcpdump: frames addressed to other hosts, e.g. unicast crossing a bridge, are seen too).
    #[arg(short = 'p', long = "no-promiscuous-mode")]
    no_promiscuous: bool,
    /// Do not print packets; only the statistics at the end.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// No name resolution (accepted, as -nn: capture never resolves addresses or ports).
    #[arg(short = 'n', action = ArgAction::Count)]
    no_resolve: u8,
    /// Verbose (accepted, as -vv and -vvv: the one-line summary is the same at every level).
    #[arg(short = 'v', action = ArgAction::Count)]
    verbose: u8,
    /// Print the link-level header on each line: MAC addresses, EtherType, frame length.
    #[arg(short = 'e')]
    link_header: bool,
    /// Hex dump of each packet after its line, from the network header (-xx: from the link header).
    #[arg(short = 'x', action = ArgAction::Count)]
    hex: u8,
    /// Hex and ASCII dump of each packet (-XX: from the link header).
    #[arg(short = 'X', action = ArgAction::Count)]
    hex_ascii: u8,
    /// ASCII dump of each packet, from the network header.
    #[arg(short = 'A')]
    ascii: bool,
    /// Timestamps: -t none, -tt Unix seconds, -ttt since the previous packet, -tttt date and time,
    /// -ttttt since the first packet (default: time of day, UTC).
    #[arg(short = 't', action = ArgAction::Count)]
    timestamps: u8,
    /// Number the printed packets.
    #[arg(short = '#', long = "number")]
    number: bool,
    /// Line-buffered stdout (accepted: printed lines are written and flushed after every batch).
    #[arg(short = 'l')]
    line_buffered: bool,
    /// Absolute TCP sequence numbers (accepted: the summary prints no sequence numbers).
    #[arg(short = 'S', long = "absolute-tcp-sequence-numbers")]
    absolute_seq: bool,
    /// Do not verify checksums (accepted: capture never verifies them).
    #[arg(short = 'K', long = "dont-verify-checksums")]
    dont_verify: bool,
    /// List the interfaces (index, name, state) and exit.
    #[arg(short = 'D', long = "list-interfaces")]
    list_interfaces: bool,
    /// List the interface's data link types and exit.
    #[arg(short = 'L', long = "list-data-link-types")]
    list_link_types: bool,
    /// Data link type: the interface's own only (EN10MB for Ethernet-framed ones, RAW for tun).
    #[arg(short = 'y', long = "linktype", value_name = "TYPE")]
    link_type: Option<String>,
    /// A wake-up per packet: the TPACKET_V2 ring (tcpdump's immediate mode, the paper's baseline).
    #[arg(long)]
    immediate_mode: bool,
    /// Timestamp precision of the file and the printed lines: micro (default) or nano.
    #[arg(long, value_name = "micro|nano", value_parser = ["micro", "nano"])]
    time_stamp_precision: Option<String>,
    /// Read the filter expression from FILE (lines starting with # are comments).
    #[arg(short = 'F', value_name = "FILE")]
    filter_file: Option<PathBuf>,
    /// Exit with status 3 if any packet was lost (kernel drops or our own), for scripts that verify.
    #[arg(long)]
    fail_on_loss: bool,
    /// Print the statistics to stderr every SECS seconds while capturing (progress on long runs).
    #[arg(long, value_name = "SECS")]
    stats_every: Option<f64>,
    /// Filter expression (tcpdump syntax), e.g. "udp and dst port 9000".
    #[arg(value_name = "EXPRESSION", trailing_var_arg = true)]
    filter: Vec<String>,
}

fn main() -> ExitCode {
    init_logging();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Some(Cmd::Gen(g)) => run_gen(g),
        Some(Cmd::Probe) => run_probe(),
        None => run_capture(cli.cap),
    };
    match r {
        Ok(code) => code,
        Err(e) => {
            eprintln!("capture: {e}");
            ExitCode::from(1)
        }
    }
}

/// The library's notices as plain lines on stderr (stdout may carry a
/// pcap); `RUST_LOG` filters them (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}

fn secs(s: Option<f64>, what: &str) -> Result<Option<Duration>, capture::CaptureError> {
    match s {
        None => Ok(None),
        Some(v) if v.is_finite() && v > 0.0 => Ok(Some(Duration::from_secs_f64(v))),
        Some(v) => Err(capture::CaptureError::Config(format!(
            "{what} {v}: give a positive number of seconds"
        ))),
    }
}

fn run_probe() -> Result<ExitCode, capture::CaptureError> {
    let p = capture::probe();
    for (m, s) in &p {
        match s {
            Support::Supported => println!("{m:5} supported"),
            Support::Unsupported(r) => println!("{m:5} unsupported: {r}"),
        }
    }
    match capture::source::best_mode(&p) {
        Some(m) => println!("default: {m}"),
        None => println!("default: none (no mode is available)"),
    }
    Ok(ExitCode::SUCCESS)
}

fn signals(control: &Control) -> Result<(), capture::CaptureError> {
    let err = |e: std::io::Error| capture::CaptureError::Config(format!("cannot install signal handlers: {e}"));
    use oskit::signal::{set_on, stop_then_abort, SIGINT, SIGTERM, SIGUSR1};
    // First: finish cleanly (drain the ring, write everything). Second: stop
    // at once, keeping what is written. Third: exit there and then.
    stop_then_abort(&[SIGINT, SIGTERM], &control.stop, &control.abort).map_err(err)?;
    set_on(&[SIGUSR1], &control.report).map_err(err)?;
    Ok(())
}

/// `-D`: the interfaces, as the kernel numbers them.
fn list_interfaces() -> Result<ExitCode, capture::CaptureError> {
    let mut ifaces: Vec<(u32, String, String)> = std::fs::read_dir("/sys/class/net")
        .map_err(|e| capture::CaptureError::Config(format!("cannot list /sys/class/net: {e}")))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let read = |f: &str| std::fs::read_to_string(e.path().join(f)).unwrap_or_default();
            let index = read("ifindex").trim().parse().ok()?;
            Some((index, name, read("operstate").trim().to_string()))
        })
        .collect();
    ifaces.sort();
    for (index, name, state) in &ifaces {
        println!("{index}.{name} [{state}]");
    }
    // As tcpdump lists it: the pseudo-device after the real ones.
    println!(
        "{}.any (Pseudo-device that captures on all interfaces) [Running]",
        ifaces.len() + 1
    );
    Ok(ExitCode::SUCCESS)
}

fn link_type_name(link: capture::LinkType) -> (&'static str, &'static str) {
    match link {
        capture::LinkType::Ethernet => ("EN10MB", "Ethernet"),
        capture::LinkType::RawIp => ("RAW", "Raw IP"),
        capture::LinkType::LinuxSll2 => ("LINUX_SLL2", "Linux cooked v2"),
    }
}

/// The filter: from `-F FILE` or from the command line, not both.
fn filter_expression(a: &CapArgs) -> Result<String, capture::CaptureError> {
    let inline = a.filter.join(" ");
    let Some(path) = &a.filter_file else {
        return Ok(inline);
    };
    if !inline.trim().is_empty() {
        return Err(capture::CaptureError::Config(format!(
            "-F {} and a filter expression on the command line: give one of them",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| capture::CaptureError::Config(format!("-F {}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" "))
}

/// Options that only mean something with an output file.
fn check_output_flags(a: &CapArgs) -> Result<(), capture::CaptureError> {
    if a.write.is_none() && (a.compress.is_some() || a.pcapng) {
        return Err(capture::CaptureError::Config(
            "--compress and --pcapng need an output file (-w FILE)".into(),
        ));
    }
    Ok(())
}

/// Nanosecond timestamps asked for, and how packets are printed.
fn print_options(a: &CapArgs) -> (bool, PrintOptions) {
    let nano = a.nano || a.time_stamp_precision.as_deref() == Some("nano");
    let print = PrintOptions {
        ts: TsFormat::from_count(a.timestamps),
        nano,
        number: a.number,
        link_header: a.link_header,
        dump: Dump::from_flags(a.hex, a.hex_ascii, a.ascii),
    };
    (nano, print)
}

/// `-r FILE`: the file's packets that pass the filter, printed or written.
fn read_back(a: &CapArgs, file: &std::path::Path) -> Result<ExitCode, capture::CaptureError> {
    use capture::read::{read_file, ReadSink};
    check_output_flags(a)?;
    if a.rotate_seconds.is_some() || a.file_size_mb.is_some() || a.file_count.is_some() {
        return Err(capture::CaptureError::Config(
            "-G, -C and -W rotate the files of a live capture, not of -r".into(),
        ));
    }
    let (nano, print) = print_options(a);
    let sink = match &a.write {
        Some(path) => ReadSink::File {
            path: path.clone(),
            format: if a.pcapng { Format::PcapNg } else { Format::Pcap },
            compression: a.compress.unwrap_or(Compression::None),
            nano,
            print: a.print.then_some(print),
        },
        None if a.quiet => ReadSink::Count,
        None => ReadSink::Print(print),
    };
    let expr = filter_expression(a)?;
    let expr = (!expr.trim().is_empty()).then_some(expr);
    let report = read_file(file, expr.as_deref(), a.count, sink)?;
    eprintln!("capture: {report}");
    Ok(ExitCode::SUCCESS)
}

fn run_capture(a: CapArgs) -> Result<ExitCode, capture::CaptureError> {
    if a.list_interfaces {
        return list_interfaces();
    }
    if let Some(file) = &a.read {
        return read_back(&a, file);
    }
    let Some(iface) = a.iface.clone() else {
        return Err(capture::CaptureError::Config(
            "no interface: give one with -i IFACE (see `ip link`), or see --help".into(),
        ));
    };
    let duration = secs(a.duration, "--duration")?;
    check_output_flags(&a)?;
    if a.list_link_types || a.link_type.is_some() {
        let (name, description) = link_type_name(capture::iface_info(&iface)?.link);
        if a.list_link_types {
            println!("Data link types for {iface} (use option -y to set):\n  {name} ({description})");
            return Ok(ExitCode::SUCCESS);
        }
        if let Some(y) = &a.link_type {
            if !y.eq_ignore_ascii_case(name) {
                return Err(capture::CaptureError::Config(format!(
                    "-y {y}: {iface} offers only {name} ({description}); see -L"
                )));
            }
        }
    }
    let (nano, print) = print_options(&a);
    let mut cfg = CaptureConfig::new(&iface);
    let expr = filter_expression(&a)?;
    cfg.filter = (!expr.trim().is_empty()).then_some(expr);
    cfg.mode = match (a.immediate_mode, a.mode) {
        (false, m) => m,
        (true, None | Some(Mode::V2)) => Some(Mode::V2),
        (true, Some(m)) => {
            return Err(capture::CaptureError::Config(format!(
                "--immediate-mode is the v2 ring (a wake-up per packet); it cannot be combined with --mode {m}"
            )))
        }
    };
    // tcpdump's -s 0: the default, the largest snapshot.
    cfg.snaplen = if a.snaplen == 0 { 262_144 } else { a.snaplen };
    cfg.ring = RingConfig {
        buffer_bytes: u64::from(a.buffer_kib) * 1024,
        block_size: a.block_kib.map(|k| u64::from(k) * 1024),
        block_timeout_ms: a.block_timeout_ms,
    };
    if let Some(w) = capture::ring_warning(&cfg.ring) {
        eprintln!("capture: warning: {w}");
    }
    cfg.threads = a.threads;
    cfg.cpus = a.cpus.clone();
    cfg.inbound_only = a.direction == "in";
    cfg.outbound_only = a.direction == "out";
    cfg.promiscuous = !a.no_promiscuous;
    cfg.xdp_on_host_interface = a.xdp_on_host_interface;
    let control = Control::default();
    signals(&control)?;
    // Resolved before anything is opened: a wrong name fails at once.
    let run_as = a.user.as_deref().map(lookup_user).transpose()?;
    let cap = Capture::open(&cfg)?;
    if let Some(u) = &run_as {
        drop_privileges(u)?;
        eprintln!("capture: running as {} (uid {}, gid {})", u.name, u.uid, u.gid);
    }
    let how = if a.mode.is_some() { "chosen" } else { "best available" };
    let others: Vec<String> = cap
        .probe
        .iter()
        .map(|(m, s)| match s {
            Support::Supported => format!("{m} ok"),
            Support::Unsupported(_) => format!("{m} unavailable"),
        })
        .collect();
    eprintln!(
        "capture: listening on {iface}, mode {} ({how}; {}), link-type {}, snapshot length {} bytes, {} thread(s)",
        cap.mode(),
        others.join(", "),
        link_type_name(cap.link()).0,
        cfg.snaplen,
        cap.threads()
    );
    if let Some(detail) = cap.xdp_detail() {
        eprintln!("capture: xdp: {detail}");
    }
    let sink = match &a.write {
        Some(path) => Sink::File {
            path: path.clone(),
            format: if a.pcapng { Format::PcapNg } else { Format::Pcap },
            compression: a.compress.unwrap_or(Compression::None),
            nano,
            packet_buffered: a.packet_buffered,
            print: a.print.then_some(print),
            rotation: rotation(&a)?,
        },
        None if a.quiet => Sink::Count,
        None => Sink::Summary(print),
    };
    let limits = Limits {
        count: a.count,
        duration,
    };
    if let Some(every) = secs(a.stats_every, "--stats-every")? {
        // Same path as SIGUSR1: raise the report flag periodically.
        let (report, stop) = (control.report.clone(), control.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(every);
                report.store(true, Ordering::Relaxed);
            }
        });
    }
    let report = cap.run(limits, sink, &control, &mut |r| {
        eprintln!("capture: statistics so far\n{r}")
    })?;
    eprintln!("{report}");
    if a.fail_on_loss && report.lost() > 0 {
        eprintln!("capture: {} packet(s) lost (--fail-on-loss)", report.lost());
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// `-Z USER`: the account to switch to.
fn lookup_user(name: &str) -> Result<nix::unistd::User, capture::CaptureError> {
    let err = |m: String| capture::CaptureError::Config(format!("-Z {name}: {m}"));
    nix::unistd::User::from_name(name)
        .map_err(|e| err(e.to_string()))?
        .ok_or_else(|| err("no such user".into()))
}

/// Switches to `u` for good: supplementary groups, group, then user (in
/// that order: once the uid is not root, the others can no longer be set),
/// and checks that root cannot be taken back.
fn drop_privileges(u: &nix::unistd::User) -> Result<(), capture::CaptureError> {
    use nix::unistd::{setgid, setgroups, setuid, Uid};
    let err = |call: &str, e: nix::Error| {
        capture::CaptureError::Config(format!("-Z {}: {call}: {e} (dropping privileges needs root)", u.name))
    };
    if Uid::effective() == u.uid && Uid::current() == u.uid {
        return Ok(());
    }
    setgroups(&[u.gid]).map_err(|e| err("setgroups", e))?;
    setgid(u.gid).map_err(|e| err("setgid", e))?;
    setuid(u.uid).map_err(|e| err("setuid", e))?;
    if !u.uid.is_root() && setuid(Uid::from_raw(0)).is_ok() {
        return Err(capture::CaptureError::Config(format!(
            "-Z {}: root could be taken back after setuid",
            u.name
        )));
    }
    Ok(())
}

/// `-G`, `-C` and `-W`, checked.
fn rotation(a: &CapArgs) -> Result<capture::output::Rotation, capture::CaptureError> {
    let bad = |m: String| Err(capture::CaptureError::Config(m));
    if a.file_count.is_some() && a.rotate_seconds.is_none() && a.file_size_mb.is_none() {
        return bad("-W counts the files of -C or -G: give one of them".into());
    }
    if a.rotate_seconds == Some(0) {
        return bad("-G 0: give a number of seconds of at least 1".into());
    }
    let max_bytes = match a.file_size_mb {
        Some(mb) if !(mb.is_finite() && mb > 0.0) => return bad(format!("-C {mb}: give a positive size in MB")),
        Some(mb) => Some((mb * 1e6).ceil() as u64),
        None => None,
    };
    let on = a.rotate_seconds.is_some() || max_bytes.is_some();
    if on && a.write.as_deref() == Some(std::path::Path::new("-")) {
        return bad("-G and -C write several files: -w - (stdout) cannot rotate".into());
    }
    Ok(capture::output::Rotation {
        every: a.rotate_seconds.map(Duration::from_secs),
        max_bytes,
        files: a.file_count,
    })
}
