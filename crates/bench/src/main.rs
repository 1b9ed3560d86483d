//! `reflector-bench`: paper 000 §5's grid (datagram size x receivers) for
//! each reflector backend, against a raw `sendto` loop in the same run.
#![deny(unsafe_code)]

use bench::grid::{self, Amount};
use bench::loadgen::{Harness, WorkDir};
use bench::{rawloop, report, BenchError};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const METHOD: &str = "\
Method: every implementation runs as a child process on 127.0.0.1 (the reflector with \
--threads 1, or the raw loop: recv, then one blocking sendto per receiver, nothing else). \
This process is one sender member and R receiver members (real tokens, two-step JOIN), \
keeps at most --window datagrams in flight and counts every copy. After a warm-up, CPU \
of the child over the measured phase is read from /proc/<pid>/stat (user+sys ticks) and \
/proc/<pid>/task/*/schedstat (ns on CPU), machine-wide busy time from /proc/stat; each \
is divided by the copies delivered. Ratios divide by the raw loop's figure in the same \
cell; with --repeat N each figure is the median of N runs, implementations alternating. \
On loopback the kernel delivers each copy to its receiver inside the sending call, so \
the per-copy cost includes the receive-side protocol work, alike for every implementation.";

#[derive(Parser)]
#[command(
    name = "reflector-bench",
    version,
    about = "Reflector benchmark: paper 000's size x receivers grid, each backend vs a raw sendto loop",
    long_about = "Reproduces the measurement grid of the reflector paper (§5): datagrams of 50, 100, \
        500 and 1000 bytes fanned out to 3, 30, 60 and 90 receivers, for each fan-out backend of \
        `reflector serve` and for a minimal raw sendto loop (the anchor) measured in the same run.\n\n\
        It reports delivered copies/s, payload Mb/s, CPU time per delivered copy (of the process \
        under test, and machine-wide), ENOBUFS waits and loss, and every CPU figure as a ratio \
        to the raw loop's in the same cell. Writes a CSV (medians and ratios) and a second CSV \
        with every run (<out>_runs.csv).\n\n\
        Needs the release `reflector` binary next to this one (`make bench` builds both).\n\
        Example: reflector-bench --quick --out /tmp/reflector.csv",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    args: BenchArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// The anchor, run as a child by the benchmark: recv, then sendto each --to address.
    #[command(hide = true)]
    RawLoop(rawloop::Args),
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Smaller grid: 50 and 1000 bytes x 3 and 90 receivers, 0.5 s runs, one run each (default: the
    /// full grid, 0.8 s runs, 5 runs per cell and implementation).
    #[arg(long)]
    quick: bool,
    /// Summary CSV to write (medians and ratios); every run goes to <stem>_runs.csv beside it.
    #[arg(long, default_value = "bench/results/reflector.csv")]
    out: PathBuf,
    /// Datagram sizes, comma-separated bytes of UDP payload, our 32-byte DATA header included
    /// (default 50,100,500,1000; --quick 50,1000).
    #[arg(long)]
    sizes: Option<String>,
    /// Receiver counts, comma-separated (default 3,30,60,90; --quick 3,90).
    #[arg(long)]
    receivers: Option<String>,
    /// Implementations to measure besides the raw loop, which is always measured: a fan-out
    /// backend that runs on loopback (sendmmsg, sendto), followed by `+` and a receive backend
    /// other than the default (sendmmsg+io-uring: multishot receives against recvmmsg), and by
    /// `-untagged` for --data-tags off (what the tags cost). Both lists are the server's
    /// registries; a wrong name is answered with every valid one.
    #[arg(long, default_value = "sendto,sendmmsg,sendmmsg-untagged")]
    impls: String,
    /// Length of each measured phase, seconds (default 0.8; --quick 0.5); the datagram count is
    /// set from the rate the warm-up reached.
    #[arg(long, conflicts_with = "copies")]
    seconds: Option<f64>,
    /// Instead of --seconds: a fixed number of copies per run (copies/receivers datagrams, at least 1000).
    #[arg(long)]
    copies: Option<u64>,
    /// Runs per (cell, implementation); figures are medians (default 5; --quick 1).
    #[arg(long)]
    repeat: Option<usize>,
    /// Datagrams in flight at most (sent but not yet received by every receiver).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    window: u64,
    /// Socket buffer size for every socket, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    bufsize: usize,
    /// Do not pin the implementation and the load generator to separate CPUs.
    #[arg(long)]
    no_pin: bool,
    /// The reflector binary (default: `reflector` next to this executable).
    #[arg(long)]
    reflector: Option<PathBuf>,
    /// Ratio of CPU per copy to the raw loop that the sendto backend should stay within.
    #[arg(long, default_value_t = 1.25)]
    target_ratio: f64,
}

fn main() -> ExitCode {
    netlab::log::init_plain();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Cmd::RawLoop(r)) => rawloop::run(&r).map(|_| ExitCode::SUCCESS),
        None => bench(cli.args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("reflector-bench: error: {e}");
            ExitCode::from(1)
        }
    }
}

fn bench(a: BenchArgs) -> Result<ExitCode, BenchError> {
    let cfg = |e: String| BenchError::Setup(e);
    let (def_sizes, def_receivers, def_seconds, def_repeat) = if a.quick {
        (&grid::QUICK_SIZES[..], &grid::QUICK_RECEIVERS[..], 0.5, 1)
    } else {
        (&grid::PAPER_SIZES[..], &grid::PAPER_RECEIVERS[..], 0.8, 5)
    };
    let sizes = match &a.sizes {
        Some(s) => grid::parse_list(s, "--sizes", reflector_proto::protocol::DATA_PAYLOAD, 65_507).map_err(cfg)?,
        None => def_sizes.to_vec(),
    };
    let receivers = match &a.receivers {
        Some(s) => grid::parse_list(s, "--receivers", 1, 1000).map_err(cfg)?,
        None => def_receivers.to_vec(),
    };
    let imps = grid::parse_impls(&a.impls).map_err(cfg)?;
    let amount = match (a.copies, a.seconds) {
        (Some(c), _) => Amount::Copies(c),
        (None, Some(s)) if s.is_finite() && s > 0.0 => Amount::Seconds(s),
        (None, Some(s)) => return Err(cfg(format!("--seconds must be a positive number, got {s}"))),
        (None, None) => Amount::Seconds(def_seconds),
    };
    let repeat = a.repeat.unwrap_or(def_repeat).max(1);
    let self_bin = std::env::current_exe().map_err(|source| BenchError::Sys {
        call: "current_exe",
        source,
    })?;
    let reflector_bin = match a.reflector {
        Some(p) => p,
        None => self_bin.with_file_name("reflector"),
    };
    if !reflector_bin.is_file() {
        return Err(BenchError::Setup(format!(
            "no reflector binary at {}: run `make bench` (it builds the release binaries) or `cargo build --release -p reflector`, or pass --reflector PATH",
            reflector_bin.display()
        )));
    }
    // Ctrl-C / SIGTERM: the current run is abandoned, its child killed, the
    // temp files removed, and the exit status is 130.
    let stop = oskit::signal::stop_flag().map_err(|source| BenchError::Sys {
        call: "sigaction(SIGINT/SIGTERM)",
        source,
    })?;
    let cpus = oskit::cpu::allowed_cpus();
    let child_cpu = if !a.no_pin && cpus.len() >= 2 {
        oskit::cpu::pin_this_thread(cpus[0])?;
        println!(
            "pinning: load generator on CPU {}, implementation under test on CPU {}",
            cpus[0], cpus[1]
        );
        Some(cpus[1])
    } else {
        println!(
            "pinning: off ({} CPU(s) allowed{})",
            cpus.len(),
            if a.no_pin { ", --no-pin" } else { "" }
        );
        None
    };
    let workdir = WorkDir::create()?;
    let mut harness = Harness::new(
        reflector_bin,
        self_bin,
        a.bufsize,
        a.window,
        amount,
        child_cpu,
        &workdir.0,
    )?;
    harness.stop = stop;
    let runs = grid::plan(&sizes, &receivers, &imps, repeat);
    println!(
        "reflector-bench: {} runs ({} sizes x {} receiver counts x {} implementations x {} repeats), {} each",
        runs.len(),
        sizes.len(),
        receivers.len(),
        imps.len(),
        repeat,
        match amount {
            Amount::Copies(c) => format!("~{c} copies"),
            Amount::Seconds(s) => format!("~{s} s"),
        }
    );
    let start = Instant::now();
    let mut results = Vec::new();
    for (i, run) in runs.iter().enumerate() {
        let m = match harness.measure(run) {
            Ok(m) => m,
            Err(BenchError::Interrupted) => {
                eprintln!(
                    "reflector-bench: interrupted after {i} of {} runs; nothing written",
                    runs.len()
                );
                return Ok(ExitCode::from(130));
            }
            Err(e) => return Err(e),
        };
        let done = i + 1;
        let eta = start.elapsed().as_secs_f64() / done as f64 * (runs.len() - done) as f64;
        println!(
            "[{:>3}/{} ETA {:>3.0} s] {:>4} B x {:>2} rcv  {:<29} {:>8} copies {:>9.0}/s  {:>6.0} ns/copy (sched {:>6.0})  system {:>6.0}  others {:>6.0}  ENOBUFS {}  loss {}",
            done,
            runs.len(),
            eta,
            run.cell.size,
            run.cell.receivers,
            run.imp.describe(),
            m.copies_received,
            m.copies_per_s(),
            m.proc_ns_per_copy(),
            m.sched_ns_per_copy(),
            m.system_ns_per_copy(),
            m.others_ns_per_copy(),
            m.enobufs_waits,
            m.loss()
        );
        results.push((run.cell, run.imp, run.rep, m));
    }
    let summaries = report::summarize(&results);
    write(&a.out, &report::csv(&summaries))?;
    let runs_path = runs_csv_path(&a.out);
    write(&runs_path, &report::runs_csv(&results))?;
    println!();
    println!("{METHOD}");
    println!();
    print!("{}", report::table(&summaries));
    println!();
    print!("{}", report::verdict(&summaries, a.target_ratio));
    println!(
        "wrote {} and {} in {:.0} s",
        a.out.display(),
        runs_path.display(),
        start.elapsed().as_secs_f64()
    );
    let lost: u64 = summaries
        .iter()
        .map(|s| s.loss() + s.send_errors + s.bad_copies + s.counter_mismatch)
        .sum();
    if lost > 0 {
        eprintln!("reflector-bench: {lost} copies were lost, not sent, malformed or miscounted; see the CSV");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_csv_path(out: &std::path::Path) -> PathBuf {
    let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("reflector");
    out.with_file_name(format!("{stem}_runs.csv"))
}

fn write(path: &std::path::Path, text: &str) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Sys {
            call: "mkdir(results dir)",
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| BenchError::Sys {
        call: "write(results)",
        source,
    })
}
