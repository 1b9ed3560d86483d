//! The subcommands of the `netlab` binary, one module each; what they
//! share (the build flags, loading a scenario, the state directory) is here.

pub mod check;
pub mod clean;
pub mod delay_line;
pub mod down;
pub mod exec;
pub mod list;
pub mod monitor;
pub mod plan;
pub mod probe_cmd;
pub mod run;
pub mod tdf;
pub mod up;

pub use clap::{Args, Subcommand};
pub use netlab::apply::ApplyMode;
pub use netlab::error::{LabError, ModelError};
pub use netlab::lab::{self, Lab, LabOptions, Launcher, SweepMode};
pub use netlab::model::LinkParams;
pub use netlab::plan::{build_plan, Dilation, Naming, PlanOptions};
pub use netlab::probe;
pub use netlab::scenario::{parse_delay_backend, LinkSpec, Scenario};
pub use netlab::topo::Builtin;
pub use std::io::Write;
pub use std::path::{Path, PathBuf};
pub use std::process::ExitCode;
pub use std::sync::atomic::{AtomicBool, Ordering};
pub use std::time::{Duration, Instant};

/// A scenario and the flags that change it (`up`, `plan`).
#[derive(Args)]
pub struct ScenarioArgs {
    pub scenario: String,
    #[command(flatten)]
    pub build: BuildArgs,
}

#[derive(Args, Clone)]
pub struct BuildArgs {
    /// Link rate for every link, e.g. 100mbit, 1gbit ("none" for unshaped).
    #[arg(long, allow_hyphen_values = true)]
    pub bw: Option<String>,
    /// One-way delay of every link, e.g. 1ms, 250us.
    #[arg(long, allow_hyphen_values = true)]
    pub delay: Option<String>,
    /// Jitter (uniform, +/-) of every link.
    #[arg(long, allow_hyphen_values = true)]
    pub jitter: Option<String>,
    /// Loss of every link in percent, e.g. 0.1%.
    #[arg(long, allow_hyphen_values = true)]
    pub loss: Option<String>,
    /// Queue length of every link, in packets.
    #[arg(long, allow_hyphen_values = true)]
    pub queue: Option<i64>,
    /// How link delay is made: auto (netem if the kernel has it, else the
    /// delay line), netem, delay-line.
    #[arg(long)]
    pub delay_backend: Option<String>,
    /// How the plan is applied: batch (one ip/tc process per namespace run)
    /// or per-op (one process per operation, like Mininet).
    #[arg(long, value_enum, default_value = "batch")]
    pub apply: ApplyMode,
    /// Time dilation factor (4, 2.5 or 3/2; 1 to 1000): link rates are divided and delays
    /// multiplied by it.
    #[arg(long, value_parser = netlab::plan::parse_tdf)]
    pub tdf: Option<netlab::plan::Tdf>,
    /// Fixed ECMP hash seed for all routers (reproducible paths).
    #[arg(long)]
    pub ecmp_seed: Option<u32>,
    /// Raise net.core.netdev_max_backlog (machine-wide) to at least this many packets while
    /// the lab is up, e.g. for in-kernel fan-out to large groups; restored with the last lab.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub netdev_backlog: Option<u64>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn load_scenario(spec: &str, b: &BuildArgs) -> Result<Scenario, LabError> {
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
        s.tdf = Some(netlab::plan::check_tdf("--tdf", t)?);
    }
    if b.ecmp_seed.is_some() {
        s.ecmp_seed = b.ecmp_seed;
    }
    Ok(s)
}

pub fn lab_options(s: &Scenario, b: &BuildArgs) -> Result<LabOptions, LabError> {
    let exe = std::env::current_exe().map_err(|e| LabError::io("find the netlab binary", e))?;
    let mut o = LabOptions::new(exe);
    o.scenario = s.name.clone();
    o.delay_backend = s.delay_backend;
    o.apply_mode = b.apply;
    o.dilation = Dilation {
        tdf: s.tdf.unwrap_or(netlab::plan::Tdf::ONE),
    };
    o.ecmp_seed = s.ecmp_seed;
    o.verbose = !b.quiet;
    o.netdev_backlog = b.netdev_backlog;
    Ok(o)
}

pub fn state_dir() -> PathBuf {
    PathBuf::from(lab::STATE_DIR)
}

/// Every call that touches labs first removes what dead runs left behind.
pub fn sweep_quietly() {
    if let Ok(r) = lab::sweep(&state_dir(), SweepMode::DeadOnly) {
        if !r.removed.is_empty() {
            eprintln!("netlab: removed leftovers of dead runs: {}", r.removed.join(", "));
        }
    }
}

/// Writes `lines` to stdout. A reader that stops early (`netlab plan |
/// head`) ends the output quietly, as with other Unix tools, where
/// `println!` would panic.
pub fn print_lines(lines: impl IntoIterator<Item = String>) -> Result<(), LabError> {
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

pub fn run_flag(id: &str) -> String {
    format!(" --run {id}")
}
