//! `vtime`: run programs with time dilated, change the factor while they run.
#![deny(unsafe_code)]

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Args, Parser, Subcommand};
use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;
use vtime::shim::InstalledShim;
use vtime::target::{classify_file, resolve_command};
use vtime::{ClockBase, Domain, Tdf};

const ABOUT: &str = "Time dilation without a kernel patch: programs see time run TDF times slower";
const LONG_ABOUT: &str = "\
Time dilation without a kernel patch. Under TDF N, programs started by `vtime run` see every \
clock advance N times slower than real time, and every sleep, poll, timer and timed wait last \
N times longer, so to them the machine, its links and its peers look N times faster.

It works by an LD_PRELOAD shim (embedded in this binary) over the C library's clock, sleep and \
timeout calls, including futex waits made through syscall() (Rust std, tokio), reading a small \
record in shared memory (a clock domain). `vtime set` changes the factor while programs run; \
their clocks stay continuous and monotonic, and waits in progress follow the change.

Not covered (refused unless --allow-uncovered): statically linked programs and Go programs, \
which never go through the C library for time. Kernel timers of TCP (retransmission, delayed \
ACK) always run in real time.

Examples:
  vtime run --tdf 4 -- sleep 1                  # 1 s of its time = 4 s of real time
  vtime run --tdf 4 --clock lab -- sleep 3 & sleep 0.5; vtime set lab 2
  vtime status";

#[derive(Parser)]
#[command(name = "vtime", version, about = ABOUT, long_about = LONG_ABOUT)]
struct Cli {
    /// Directory of the clock records (shared memory by default).
    #[arg(long, global = true, env = vtime::DIR_ENV, value_name = "DIR", default_value = "/dev/shm")]
    dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command (and every process it starts) with time dilated.
    Run(RunArgs),
    /// Change the TDF of a running clock domain.
    Set {
        /// The clock domain (`vtime status` lists them).
        name: String,
        /// The new factor: a positive decimal (4, 2.5, 0.5) or fraction (1/3).
        #[arg(value_parser = parse_tdf_arg, allow_hyphen_values = true)]
        tdf: Tdf,
        /// Change a managed domain's clock alone (one a netlab lab created:
        /// its links keep the rates of the old factor; `netlab tdf` changes both).
        #[arg(long)]
        force: bool,
    },
    /// Show each clock domain: factor, virtual clock, owner.
    Status {
        /// Show only this domain.
        name: Option<String>,
    },
    /// Print the C header that describes the shared record.
    Header,
}

#[derive(Args)]
struct RunArgs {
    /// Time dilation factor: real seconds per virtual second (> 0; 4, 2.5, 1/3).
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_tdf_arg, allow_hyphen_values = true)]
    tdf: Tdf,
    /// Name of the clock domain to create (for `vtime set NAME N`); default run-PID.
    #[arg(long, value_name = "NAME")]
    clock: Option<String>,
    /// Start a program the shim cannot cover (static or Go) anyway; it runs in real time.
    #[arg(long)]
    allow_uncovered: bool,
    /// Use this shim file instead of the embedded one.
    #[arg(long, value_name = "PATH")]
    shim: Option<PathBuf>,
    /// The command and its arguments (put `--` before it).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

fn parse_tdf_arg(s: &str) -> Result<Tdf, String> {
    vtime::parse_tdf(s).map_err(|e| e.to_string())
}

/// A failure with the exit status it maps to.
struct Failure {
    code: u8,
    msg: String,
}

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure {
            code: 1,
            msg: e.to_string(),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(args) => run(&cli.dir, args),
        Cmd::Set { name, tdf, force } => set(&cli.dir, &name, tdf, force),
        Cmd::Status { name } => status(&cli.dir, name.as_deref()),
        Cmd::Header => {
            print!("{}", vtime::shim::RECORD_HEADER);
            Ok(ExitCode::SUCCESS)
        }
    };
    result.unwrap_or_else(|f| {
        eprintln!("vtime: {}", f.msg);
        ExitCode::from(f.code)
    })
}

fn run(dir: &Path, args: RunArgs) -> Result<ExitCode, Failure> {
    let program = &args.command[0];
    let shown = program.to_string_lossy().into_owned();
    let Some(path) = resolve_command(&shown) else {
        return Err(Failure {
            code: 127,
            msg: format!("command not found: {shown}"),
        });
    };
    let coverage = classify_file(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if let Some(reason) = coverage.reason() {
        if !args.allow_uncovered {
            return Err(Failure {
                code: 2,
                msg: format!(
                    "{shown} cannot be dilated: {reason}. It would run in real time; \
                     pass --allow-uncovered to start it anyway"
                ),
            });
        }
        eprintln!("vtime: warning: {shown} is not dilated ({reason}): it runs in REAL time");
    }
    // What a killed earlier run left behind (its creator is gone).
    for name in vtime::remove_stale(dir)? {
        eprintln!("vtime: removed clock domain {name} left behind by a process that is gone");
    }
    vtime::shim::remove_stale();
    let shim = match &args.shim {
        Some(p) => InstalledShim::from_path(p)?,
        None => InstalledShim::install()?,
    };
    let name = args.clock.unwrap_or_else(|| format!("run-{}", std::process::id()));
    let domain = Domain::create(dir, &name, args.tdf)?;
    if std::io::stderr().is_terminal() {
        eprintln!(
            "vtime: clock domain {name} at TDF {} (`vtime set {name} N` changes it)",
            args.tdf
        );
    }

    // Signals are caught before the child exists so none is lost in between.
    let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let handle = signals.handle();
    let mut child = Command::new(program)
        .args(&args.command[1..])
        .envs(domain.child_env(shim.path()))
        .spawn()
        .map_err(|e| format!("cannot start {shown}: {e}"))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let forwarder = std::thread::spawn(move || {
        for info in signals.forever() {
            // Ctrl-C and Ctrl-\ from the terminal reach the whole foreground
            // group, the child included: forwarding them would deliver twice.
            let from_tty = matches!(info.cause, Cause::Kernel) && (info.signal == SIGINT || info.signal == SIGQUIT);
            if !from_tty {
                if let Ok(sig) = nix::sys::signal::Signal::try_from(info.signal) {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
        }
    });
    let status = child.wait().map_err(|e| format!("waiting for {shown}: {e}"));
    handle.close();
    let _ = forwarder.join();
    drop(domain);
    drop(shim);
    let status = status?;
    use std::os::unix::process::ExitStatusExt;
    let code = match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    };
    Ok(ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)))
}

fn set(dir: &Path, name: &str, tdf: Tdf, force: bool) -> Result<ExitCode, Failure> {
    let domain = Domain::open(dir, name)?;
    let before = domain.snapshot().timeline.tdf();
    domain.set_tdf_from_outside(tdf, force)?;
    println!("{name}: TDF {before} -> {tdf}");
    Ok(ExitCode::SUCCESS)
}

fn status(dir: &Path, only: Option<&str>) -> Result<ExitCode, Failure> {
    if let Some(n) = only {
        vtime::validate_name(n)?;
    }
    let mut rows = vtime::list_domains(dir)?;
    rows.retain(|(n, _)| only.is_none_or(|o| o == n));
    if rows.is_empty() {
        if let Some(n) = only {
            return Err(vtime::Error::UnknownDomain {
                name: n.to_string(),
                dir: dir.to_path_buf(),
            }
            .into());
        }
        println!("no clock domains in {}", dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20} {:>8} {:<26} {:>14} {:>14} {:>7}  CREATOR",
        "NAME", "TDF", "VIRTUAL UTC", "VIRTUAL AGE", "REAL AGE", "CHANGES"
    );
    for (name, d) in rows {
        let d = match d {
            Ok(d) => d,
            Err(e) => {
                println!("{name:<20} unreadable: {e}");
                continue;
            }
        };
        let s = d.snapshot();
        let t = s.timeline;
        let mono = ClockBase::Monotonic;
        let real_age = vtime::real_now(mono) - t.epochs[mono as usize];
        let virt_age = t.segs[mono as usize].virtual_at(real_age);
        let utc = fmt_utc(d.virtual_now(ClockBase::Realtime));
        let alive = if nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.creator_pid as i32), None).is_ok() {
            "running"
        } else {
            "gone"
        };
        println!(
            "{name:<20} {:>8} {utc:<26} {:>12.3} s {:>12.3} s {:>7}  {} ({alive})",
            t.tdf().to_string(),
            virt_age as f64 / 1e9,
            real_age as f64 / 1e9,
            s.changes,
            s.creator_pid
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for ns since the Unix epoch (proleptic Gregorian).
fn fmt_utc(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let ms = ns.rem_euclid(1_000_000_000) / 1_000_000;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to civil date (Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_format() {
        assert_eq!(super::fmt_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::fmt_utc(1_700_000_000_123_000_000), "2023-11-14T22:13:20.123Z");
        assert_eq!(super::fmt_utc(951_782_400_000_000_000), "2000-02-29T00:00:00.000Z");
    }
}
