//! `netlab`: build emulated networks of namespaces, bridges and shaped links,
//! run commands in them, and remove them without leaving anything behind.
#![deny(unsafe_code)]

use clap::{Args, Parser, Subcommand};
use netlab::apply::ApplyMode;
use netlab::delayline;
use netlab::error::{LabError, ModelError};
use netlab::lab::{self, Lab, LabOptions, Launcher, SweepMode};
use netlab::model::LinkParams;
use netlab::plan::{build_plan, Dilation, Naming, PlanOptions};
use netlab::probe;
use netlab::scenario::{parse_delay_backend, LinkSpec, Scenario};
use netlab::topo::Builtin;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "netlab",
    version,
    about = "An emulated network on one machine: hosts, links, switches, routers, topologies",
    long_about = "netlab builds networks out of Linux network namespaces (hosts, routers), \
bridges (switches) and veth pairs (links) shaped with HTB for bandwidth and with netem or \
netlab's own delay line for delay, jitter and loss. Everything it creates carries the \
prefix 'netlab-<run>-' and is removed on exit, on error, on Ctrl-C, and by the next \
netlab call after a crash.\n\n\
SCENARIO is a TOML file (see the README) or a built-in topology written as \
KIND[:SIZE]: pair, star:N (N hosts on a switch), linear:N (N switches, a host on each), \
chain:N (two hosts through N switches), fattree:K (K-ary fat tree of ECMP routers).\n\n\
Examples:\n  sudo netlab run crates/netlab/scenarios/star.toml   (from the repository root)\n  sudo netlab up star:4 --bw 100mbit --delay 1ms\n  \
sudo netlab exec h1 -- ip addr\n  sudo netlab check\n  sudo netlab down\n  sudo netlab clean"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab and leave it up (use `exec`, `check`, then `down`).
    Up {
        scenario: String,
        #[command(flatten)]
        build: BuildArgs,
    },
    /// Remove a lab left up by `up` (the only one, or --run ID, or --all).
    Down {
        #[arg(long)]
        run: Option<String>,
        #[arg(long)]
        all: bool,
        /// Also remove a lab that a live process (a `netlab run`, a test, the demo) is using.
        #[arg(long)]
        force: bool,
    },
    /// Build a lab, run the scenario's commands, print their output, remove the lab.
    Run {
        scenario: String,
        #[command(flatten)]
        build: BuildArgs,
        /// Keep each command's stdout/stderr in this directory.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Adapt the TDF to the machine's load while the commands run, within MIN-MAX (e.g.
        /// 1-8): raised when the CPUs are more than 85% busy, lowered below 40%; the trace is
        /// written to tdf-trace.csv in the output directory.
        #[arg(long, value_parser = netlab::adapt::parse_range)]
        adaptive_tdf: Option<(u32, u32)>,
        /// Seconds between adaptive TDF decisions.
        #[arg(long, default_value_t = 1.0)]
        adapt_epoch: f64,
    },
    /// Run a command inside a host (or router) of a lab that is up.
    Exec {
        #[arg(long)]
        run: Option<String>,
        host: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Give a host (or router) of a lab that is up a monitor port: a veth pair in its namespace
    /// whose receiving end (NAME, default mon0) gets a copy of every frame the node's lab
    /// interfaces send and receive (tc mirred), for `capture -i NAME --mode xdp` or any capture.
    /// It goes with the lab; --remove takes it away earlier.
    Monitor {
        #[arg(long)]
        run: Option<String>,
        host: String,
        /// The monitor port's name (its sending end is NAME-tx).
        #[arg(long, default_value = "mon0")]
        name: String,
        /// Remove the port and the mirroring instead.
        #[arg(long)]
        remove: bool,
    },
    /// List labs and their hosts.
    List,
    /// Remove leftovers: crashed runs and labs left up; --force also removes
    /// labs that a live netlab process is using.
    Clean {
        #[arg(long)]
        force: bool,
    },
    /// Print the operations that `up` would run, without running them.
    Plan {
        scenario: String,
        #[command(flatten)]
        build: BuildArgs,
    },
    /// Change the time dilation factor of a running dilated lab: every link is re-rated to
    /// rate/TDF and the lab's clock (every process in it) runs TDF times slower.
    Tdf {
        #[arg(long)]
        run: Option<String>,
        /// The new factor (a whole number, 1 or more).
        #[arg(value_parser = clap::value_parser!(u32).range(1..=1000))]
        tdf: u32,
    },
    /// Check that the hosts reach each other (UDP probes of our own): every pair in a lab of
    /// up to 300 hosts; in a bigger one a sample: every host to a hub (the host whose neighbour
    /// entries the plan made permanent on the biggest segment, else the first) and 5 random
    /// destinations per host, named in the output with the seed that repeats it. --all-pairs
    /// checks every pair of any lab.
    Check {
        #[arg(long)]
        run: Option<String>,
        /// Every pair, whatever the lab's size (a 1,000-host lab has 999,000, each resolved by an
        /// ARP broadcast to every port: over an hour).
        #[arg(long)]
        all_pairs: bool,
        /// Random destinations per host in a sampled check (fewer if the kernel's neighbour
        /// table, shared by the machine, has no room for them).
        #[arg(long, default_value_t = probe::SAMPLE_PER_HOST as u16, value_parser = clap::value_parser!(u16).range(0..=1000))]
        sample: u16,
        /// Seed of the sample's random pairs (printed by every sampled check).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Measure one TCP flow or UDP round trips between two hosts of a lab.
    Probe {
        #[arg(long)]
        run: Option<String>,
        #[command(subcommand)]
        what: ProbeCmd,
    },
    /// (internal) The delay line process of one link.
    #[command(hide = true)]
    DelayLine(DelayLineArgs),
}

#[derive(Subcommand)]
enum ProbeCmd {
    /// TCP throughput from one host to another.
    Tcp {
        from: String,
        to: String,
        /// Seconds measured (after one second of warm-up).
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
    },
    /// UDP round-trip times from one host to another.
    Rtt {
        from: String,
        to: String,
        #[arg(long, default_value_t = 200)]
        count: usize,
    },
}

#[derive(Args, Clone)]
struct BuildArgs {
    /// Link rate for every link, e.g. 100mbit, 1gbit ("none" for unshaped).
    #[arg(long, allow_hyphen_values = true)]
    bw: Option<String>,
    /// One-way delay of every link, e.g. 1ms, 250us.
    #[arg(long, allow_hyphen_values = true)]
    delay: Option<String>,
    /// Jitter (uniform, +/-) of every link.
    #[arg(long, allow_hyphen_values = true)]
    jitter: Option<String>,
    /// Loss of every link in percent, e.g. 0.1%.
    #[arg(long, allow_hyphen_values = true)]
    loss: Option<String>,
    /// Queue length of every link, in packets.
    #[arg(long, allow_hyphen_values = true)]
    queue: Option<i64>,
    /// How link delay is made: auto (netem if the kernel has it, else the
    /// delay line), netem, delay-line.
    #[arg(long)]
    delay_backend: Option<String>,
    /// How the plan is applied: batch (one ip/tc process per namespace run)
    /// or per-op (one process per operation, like Mininet).
    #[arg(long, value_enum, default_value = "batch")]
    apply: ApplyMode,
    /// Time dilation factor: link rates are divided and delays multiplied by it.
    #[arg(long)]
    tdf: Option<u32>,
    /// Fixed ECMP hash seed for all routers (reproducible paths).
    #[arg(long)]
    ecmp_seed: Option<u32>,
    /// Raise net.core.netdev_max_backlog (machine-wide) to at least this many packets while
    /// the lab is up, e.g. for in-kernel fan-out to large groups; restored with the last lab.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    netdev_backlog: Option<u64>,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args)]
struct DelayLineArgs {
    #[arg(long)]
    link: usize,
    #[arg(long)]
    a: String,
    #[arg(long)]
    b: String,
    #[arg(long, default_value_t = 0)]
    delay_ns: u64,
    #[arg(long, default_value_t = 0)]
    jitter_ns: u64,
    #[arg(long, default_value_t = 0)]
    loss_ppm: u32,
    #[arg(long, default_value_t = 10_000)]
    limit: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 30_000)]
    spin_ns: u64,
    /// The lab's clock (a dilated lab): the delay follows its TDF.
    #[arg(long, requires_all = ["clock_domain", "built_tdf"])]
    clock_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    clock_domain: Option<String>,
    /// The TDF the delay and jitter above were computed for.
    #[arg(long)]
    built_tdf: Option<u64>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    netlab::log::init_plain();
    use oskit::signal::{flag_on, Second, SIGHUP, SIGINT, SIGTERM};
    // A second signal must not cut the lab's removal short. Registration
    // only fails for forbidden signals, which these are not.
    let stop = flag_on(&[SIGINT, SIGTERM, SIGHUP], Second::Ignore).unwrap_or_default();
    match real_main(cli, &stop) {
        Ok(code) => code,
        Err(LabError::Interrupted) => {
            // Ends a progress line that may still be open.
            eprintln!("\nnetlab: interrupted; lab removed");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("netlab: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn load_scenario(spec: &str, b: &BuildArgs) -> Result<Scenario, LabError> {
    let mut s = if Path::new(spec).exists() || spec.ends_with(".toml") {
        Scenario::load(spec)?
    } else {
        let (kind, size) = match spec.split_once(':') {
            Some((k, n)) => {
                let n: i64 = n.parse().map_err(|_| ModelError::BadValue {
                    item: format!("topology size in '{spec}'"),
                    value: n.into(),
                    expected: "a whole number, e.g. star:4".into(),
                })?;
                (k, Some(n))
            }
            None => (spec, None),
        };
        let built = match kind {
            "star" => Builtin::from_parts(kind, size, None, None)?,
            "linear" | "chain" => Builtin::from_parts(kind, None, size, None)?,
            "fattree" => Builtin::from_parts(kind, None, None, size)?,
            _ => Builtin::from_parts(kind, None, None, None)?,
        };
        Scenario {
            name: spec.into(),
            topology: built.build(&LinkParams::default()),
            commands: vec![],
            delay_backend: None,
            ecmp_seed: None,
            tdf: None,
        }
    };
    let overrides = LinkSpec {
        bw: b.bw.clone(),
        delay: b.delay.clone(),
        jitter: b.jitter.clone(),
        loss: b.loss.clone().map(toml::Value::String),
        queue: b.queue,
    };
    for (i, l) in s.topology.links.iter_mut().enumerate() {
        l.params = overrides.apply_to(&format!("link {i} ({} - {})", l.a, l.b), &l.params)?;
    }
    if let Some(d) = &b.delay_backend {
        s.delay_backend = parse_delay_backend(d)?;
    }
    if let Some(t) = b.tdf {
        if !(1..=1000).contains(&t) {
            return Err(ModelError::OutOfRange {
                item: "--tdf".into(),
                value: t.to_string(),
                range: "between 1 and 1000".into(),
            }
            .into());
        }
        s.tdf = Some(t);
    }
    if b.ecmp_seed.is_some() {
        s.ecmp_seed = b.ecmp_seed;
    }
    Ok(s)
}

fn lab_options(s: &Scenario, b: &BuildArgs) -> Result<LabOptions, LabError> {
    let exe = std::env::current_exe().map_err(|e| LabError::io("find the netlab binary", e))?;
    let mut o = LabOptions::new(exe);
    o.scenario = s.name.clone();
    o.delay_backend = s.delay_backend;
    o.apply_mode = b.apply;
    o.dilation = Dilation {
        tdf: s.tdf.unwrap_or(1),
    };
    o.ecmp_seed = s.ecmp_seed;
    o.verbose = !b.quiet;
    o.netdev_backlog = b.netdev_backlog;
    Ok(o)
}

fn state_dir() -> PathBuf {
    PathBuf::from(lab::STATE_DIR)
}

/// Every call that touches labs first removes what dead runs left behind.
fn sweep_quietly() {
    if let Ok(r) = lab::sweep(&state_dir(), SweepMode::DeadOnly) {
        if !r.removed.is_empty() {
            eprintln!("netlab: removed leftovers of dead runs: {}", r.removed.join(", "));
        }
    }
}

/// Writes `lines` to stdout. A reader that stops early (`netlab plan |
/// head`) ends the output quietly, as with other Unix tools, where
/// `println!` would panic.
fn print_lines(lines: impl IntoIterator<Item = String>) -> Result<(), LabError> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = lines
        .into_iter()
        .try_for_each(|line| writeln!(out, "{line}"))
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(|e| LabError::io("standard output", e)),
    }
}

fn real_main(cli: Cli, stop: &AtomicBool) -> Result<ExitCode, LabError> {
    match cli.cmd {
        Cmd::Plan { scenario, build } => {
            let s = load_scenario(&scenario, &build)?;
            let o = PlanOptions {
                delay_backend: s.delay_backend.unwrap_or(netlab::plan::DelayBackend::DelayLine),
                dilation: Dilation {
                    tdf: s.tdf.unwrap_or(1),
                },
                ecmp_seed: s.ecmp_seed,
            };
            let p = build_plan(&s.topology, &Naming::new("RUN"), &o)?;
            let head = format!(
                "# {} ({} operations; RUN is the run id chosen at `up`)",
                s.topology.name,
                p.ops.len()
            );
            print_lines(std::iter::once(head).chain(p.ops.iter().map(|op| op.to_string())))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::DelayLine(a) => run_delay_line(a),
        Cmd::Up { scenario, build } => {
            let s = load_scenario(&scenario, &build)?;
            lab::require_caps()?;
            if s.tdf.unwrap_or(1) > 1 {
                return Err(LabError::DetachedClock);
            }
            let lab = Lab::up(&s.topology, &lab_options(&s, &build)?, stop)?;
            if stop.load(Ordering::Relaxed) {
                return Err(LabError::Interrupted);
            }
            let mut text = lab.summary();
            if !s.commands.is_empty() {
                text.push_str(&format!(
                    "  note: the scenario's {} command(s) run only with `netlab run`\n",
                    s.commands.len()
                ));
            }
            let st = lab.detach()?;
            print!("{text}");
            println!(
                "  run commands with: netlab exec{} HOST -- CMD;  remove with: netlab down{}",
                run_flag(&st.run_id),
                run_flag(&st.run_id)
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Down { run, all, force } => {
            lab::require_caps()?;
            sweep_quietly();
            let runs: Vec<lab::RunState> = if all {
                lab::list_runs(&state_dir())
                    .into_iter()
                    .filter(|r| r.phase == lab::Phase::Detached)
                    .collect()
            } else {
                vec![lab::find_run(&state_dir(), run.as_deref())?]
            };
            if runs.is_empty() {
                println!("netlab: no lab is up");
            }
            for r in &runs {
                if r.phase != lab::Phase::Detached && r.owner_alive() && !force {
                    return Err(LabError::InUse {
                        run: r.run_id.clone(),
                        pid: r.owner_pid,
                    });
                }
            }
            for r in runs {
                let t0 = Instant::now();
                lab::remove_run(&state_dir().join(&r.run_id), &r.run_id, &r.namespaces)?;
                println!("netlab: run {} removed in {:.2}s", r.run_id, t0.elapsed().as_secs_f64());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Run {
            scenario,
            build,
            out,
            adaptive_tdf,
            adapt_epoch,
        } => {
            let s = load_scenario(&scenario, &build)?;
            lab::require_caps()?;
            let mut o = lab_options(&s, &build)?;
            if let Some((min, max)) = adaptive_tdf {
                if !(adapt_epoch.is_finite() && (0.05..=60.0).contains(&adapt_epoch)) {
                    return Err(ModelError::OutOfRange {
                        item: "--adapt-epoch".into(),
                        value: adapt_epoch.to_string(),
                        range: "between 0.05 and 60 seconds".into(),
                    }
                    .into());
                }
                o.virtual_time = true;
                o.dilation.tdf = o.dilation.tdf.clamp(min, max);
            }
            let lab = Lab::up(&s.topology, &o, stop)?;
            eprint!("{}", lab.summary());
            let out_dir = out.unwrap_or_else(|| lab.dir.join("out"));
            std::fs::create_dir_all(&out_dir).map_err(|e| LabError::io(format!("create {}", out_dir.display()), e))?;
            // On error the lab is dropped, which removes it.
            match adaptive_tdf {
                None => netlab::runner::run_commands(&lab, &s.commands, stop, &out_dir)?,
                Some((min_tdf, max_tdf)) => {
                    let policy = netlab::adapt::Policy {
                        min_tdf,
                        max_tdf,
                        epoch: Duration::from_secs_f64(adapt_epoch),
                        ..Default::default()
                    };
                    let trace_path = out_dir.join("tdf-trace.csv");
                    let mut trace = std::fs::File::create(&trace_path)
                        .map_err(|e| LabError::io(format!("create {}", trace_path.display()), e))?;
                    let done = AtomicBool::new(false);
                    let state = lab.state.clone();
                    let (ran, adapted) = std::thread::scope(|sc| {
                        let adaptor = sc.spawn(|| netlab::adapt::run(&state, policy, &done, &mut trace));
                        let ran = netlab::runner::run_commands(&lab, &s.commands, stop, &out_dir);
                        done.store(true, Ordering::Relaxed);
                        (ran, adaptor.join())
                    });
                    ran?;
                    let last =
                        adapted.map_err(|_| LabError::io("adaptive TDF", std::io::Error::other("panicked")))??;
                    eprintln!(
                        "netlab: adaptive TDF ended at {last}; trace in {}",
                        trace_path.display()
                    );
                }
            }
            let t = lab.down()?;
            eprintln!("netlab: lab removed in {:.2}s", t.as_secs_f64());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec { run, host, cmd } => {
            lab::require_caps()?;
            sweep_quietly();
            let st = lab::find_run(&state_dir(), run.as_deref())?;
            let mut c = Launcher::for_run(&st).command(&host, &cmd)?;
            let status = c.status().map_err(|e| LabError::Spawn {
                cmd: cmd.join(" "),
                source: e,
            })?;
            Ok(ExitCode::from(status.code().unwrap_or(1).clamp(0, 255) as u8))
        }
        Cmd::Monitor {
            run,
            host,
            name,
            remove,
        } => {
            lab::require_caps()?;
            sweep_quietly();
            netlab::monitor::check_name(&name)?;
            let st = lab::find_run(&state_dir(), run.as_deref())?;
            if remove {
                netlab::monitor::remove(&st, &host, &name)?;
            } else {
                netlab::monitor::add(&st, &host, &name)?;
            }
            if remove {
                println!("removed monitor port {name} from {host}");
            } else {
                println!(
                    "{host}: monitor port {name} mirrors every frame of its lab interfaces; capture there with \
                     `netlab exec {host} -- capture -i {name} --mode xdp ...`"
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List => {
            if lab::require_caps().is_ok() {
                sweep_quietly();
            }
            let runs = lab::list_runs(&state_dir());
            if runs.is_empty() {
                println!("no labs");
            }
            for r in runs {
                let owner = if r.phase == lab::Phase::Detached {
                    String::new()
                } else {
                    format!(", owner pid {}", r.owner_pid)
                };
                println!(
                    "run {}: {} [{}] {:?}{}, delay backend {}",
                    r.run_id, r.scenario, r.topology, r.phase, owner, r.delay_backend
                );
                for h in &r.hosts {
                    println!(
                        "  {:<8} {:<7} {:<16} ns {}",
                        h.name,
                        format!("{:?}", h.kind).to_lowercase(),
                        h.addr.map(|a| a.to_string()).unwrap_or_default(),
                        h.ns
                    );
                }
            }
            let stray: Vec<String> = netlab::netns::our_namespaces();
            if !stray.is_empty() {
                println!("{} namespaces carry the netlab- prefix", stray.len());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Clean { force } => {
            lab::require_caps()?;
            let r = lab::sweep(
                &state_dir(),
                if force { SweepMode::Force } else { SweepMode::AllButLive },
            )?;
            for (id, pid) in &r.skipped {
                println!("netlab: kept run {id}: in use by live process {pid} (use --force to remove it anyway)");
            }
            if r.removed.is_empty() {
                println!("netlab: nothing to clean");
            } else {
                println!("netlab: removed {}", r.removed.join(", "));
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Tdf { run, tdf } => {
            lab::require_caps()?;
            sweep_quietly();
            let mut st = lab::find_run(&state_dir(), run.as_deref())?;
            for line in lab::set_tdf(&st, tdf)? {
                println!("netlab: {line}");
            }
            st.tdf = tdf;
            lab::write_state(&state_dir().join(&st.run_id), &st)?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Check {
            run,
            all_pairs,
            sample,
            seed,
        } => {
            lab::require_caps()?;
            sweep_quietly();
            let st = lab::find_run(&state_dir(), run.as_deref())?;
            let eps = probe::endpoints(&st);
            let n = eps.len();
            let every = n * n.saturating_sub(1);
            let sampled = !all_pairs && n > probe::ALL_PAIRS_MAX;
            let sample = usize::from(sample);
            let (set, what, how) = if sampled {
                sample_set(&st, &eps, sample, seed)
            } else {
                if let Some(w) = load_addressing(&st).and_then(|a| lab::neighbour_warning(&a)) {
                    eprintln!("netlab: note: {w}");
                }
                (probe::PairSet::all(n), format!("all {every} host pairs"), String::new())
            };
            let t0 = Instant::now();
            let show = |p: probe::CheckProgress| {
                eprint!(
                    "\rnetlab: checking: {}/{} pairs, {} unreachable so far",
                    p.done, p.total, p.failed
                );
                let _ = std::io::stderr().flush();
            };
            let result = probe::check_pairs(&eps, &set, probe::CheckOptions::default(), stop, show);
            // Ends the progress line.
            eprintln!();
            let failed = result?;
            if failed.is_empty() {
                println!(
                    "netlab: {what} reach each other (UDP, {:.2}s){how}",
                    t0.elapsed().as_secs_f64()
                );
                Ok(ExitCode::SUCCESS)
            } else {
                const SHOWN: usize = 20;
                for (a, b) in failed.iter().take(SHOWN) {
                    println!("unreachable: {a} -> {b}");
                }
                if failed.len() > SHOWN {
                    println!("... and {} more", failed.len() - SHOWN);
                }
                println!(
                    "netlab: {} of {what} unreachable ({:.2}s){how}",
                    failed.len(),
                    t0.elapsed().as_secs_f64()
                );
                Ok(ExitCode::FAILURE)
            }
        }
        Cmd::Probe { run, what } => {
            lab::require_caps()?;
            sweep_quietly();
            let st = lab::find_run(&state_dir(), run.as_deref())?;
            let eps = probe::endpoints(&st);
            let find = |n: &str| {
                eps.iter()
                    .find(|e| e.name == n)
                    .cloned()
                    .ok_or_else(|| LabError::UnknownHost {
                        host: n.into(),
                        run: st.run_id.clone(),
                        known: eps.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", "),
                    })
            };
            match what {
                ProbeCmd::Tcp { from, to, secs } => {
                    if !(0.1..=600.0).contains(&secs) {
                        return Err(ModelError::OutOfRange {
                            item: "--secs".into(),
                            value: secs.to_string(),
                            range: "between 0.1 and 600".into(),
                        }
                        .into());
                    }
                    let t = probe::tcp_flow(
                        &find(&from)?,
                        &find(&to)?,
                        Duration::from_secs(1),
                        Duration::from_secs_f64(secs),
                    )?;
                    println!(
                        "tcp {from} -> {to}: {:.1} Mbit/s goodput ({} bytes in {:.2}s)",
                        t.goodput_bps / 1e6,
                        t.bytes,
                        t.window.as_secs_f64()
                    );
                }
                ProbeCmd::Rtt { from, to, count } => {
                    let count = count.clamp(1, 100_000);
                    let mut v = probe::udp_rtts(
                        &find(&from)?,
                        &find(&to)?,
                        count,
                        Duration::from_millis(2),
                        Duration::from_secs(1),
                    )?;
                    v.sort();
                    if v.is_empty() {
                        println!("rtt {from} -> {to}: no replies");
                        return Ok(ExitCode::FAILURE);
                    }
                    let q = |p: f64| v[((v.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
                    println!(
                        "rtt {from} -> {to}: {} of {count} replies, min {:.0}us median {:.0}us p99 {:.0}us",
                        v.len(),
                        q(0.0),
                        q(0.5),
                        q(0.99)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The pairs of a sampled check, what they are and how they were chosen
/// (for the output): every host to a hub (the host the plan gave permanent
/// neighbours on the biggest segment, else the first) and `want` random
/// destinations per host, fewer if the neighbour table has no room.
fn sample_set(
    st: &lab::RunState,
    eps: &[probe::Endpoint],
    want: usize,
    seed: Option<u64>,
) -> (probe::PairSet, String, String) {
    let n = eps.len();
    let (t3, seen) = match lab::limits::current(lab::limits::NEIGH_THRESH[2]) {
        Some(v) => (v, true),
        None => (lab::limits::KERNEL_DEFAULTS[2], false),
    };
    let k = probe::sample_budget(n, t3, want);
    if k < want {
        let whose = if seen {
            ""
        } else {
            " if this container's machine left the default"
        };
        eprintln!(
            "netlab: note: {k} instead of {want} random destinations per host: the kernel's neighbour table, \
             shared by the machine, holds {t3} entries{whose} (net.ipv4.neigh.default.gc_thresh3) and the sample \
             uses at most half of it"
        );
    }
    let seed = seed.unwrap_or_else(time_seed);
    let hub = load_addressing(st)
        .and_then(|a| a.big_segment_hub().map(String::from))
        .and_then(|h| eps.iter().position(|e| e.name == h))
        .unwrap_or(0);
    let set = probe::PairSet::sampled(n, hub, k, seed);
    let what = format!("{} sampled host pairs", set.len());
    let how = format!(
        ": every host to hub {} and {k} random destinations per host, seed {seed} (`--seed {seed}` repeats it); \
         {n} hosts have {} pairs, --all-pairs checks them all",
        eps[hub].name,
        n * n.saturating_sub(1)
    );
    eprintln!("netlab: checking {what}{how}");
    (set, what, how)
}

/// A seed for a sample nobody asked to repeat: the clock's nanoseconds.
fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ u64::from(std::process::id())
}

/// The addressing of a run, re-read from its state directory.
fn load_addressing(st: &lab::RunState) -> Option<netlab::addr::Addressing> {
    let text = std::fs::read(state_dir().join(&st.run_id).join("addressing.json")).ok()?;
    serde_json::from_slice(&text).ok()
}

fn run_flag(id: &str) -> String {
    format!(" --run {id}")
}

fn run_delay_line(a: DelayLineArgs) -> Result<ExitCode, LabError> {
    // The delay line runs until netlab ends it (SIGTERM); a terminal
    // hang-up must not take a link down under a lab left up.
    use oskit::signal::{flag_on, ignore, Second, SIGHUP, SIGINT, SIGTERM};
    let stop = flag_on(&[SIGTERM, SIGINT], Second::Ignore).unwrap_or_default();
    let _ = ignore(&[SIGHUP]);
    let clock = match (&a.clock_dir, &a.clock_domain, a.built_tdf) {
        (Some(dir), Some(domain), Some(built)) => {
            let link = format!("{} ({} <-> {})", a.link, a.a, a.b);
            let err = |msg: String| LabError::DelayLine {
                link: link.clone(),
                msg,
            };
            let d = vtime::Domain::open(dir, domain).map_err(|e| err(e.to_string()))?;
            let t = vtime::Tdf::new(built, 1).map_err(|e| err(format!("--built-tdf {built}: {e}")))?;
            Some((d, t))
        }
        _ => None,
    };
    let cfg = delayline::Config {
        clock,
        a: a.a.clone(),
        b: a.b.clone(),
        delay_ns: a.delay_ns,
        jitter_ns: a.jitter_ns,
        loss_ppm: a.loss_ppm,
        limit: a.limit.max(1),
        seed: a.seed,
        spin_ns: a.spin_ns,
    };
    let stats = delayline::run(&cfg, &stop, || {
        println!("ready");
        let _ = std::io::stdout().flush();
    })
    .map_err(|e| LabError::DelayLine {
        link: format!("{} ({} <-> {})", a.link, a.a, a.b),
        msg: e.to_string(),
    })?;
    eprintln!("delay line {}: a->b {:?}; b->a {:?}", a.link, stats[0], stats[1]);
    Ok(ExitCode::SUCCESS)
}
