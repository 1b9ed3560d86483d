//! Applying a plan to the kernel, checking every exit status.
//!
//! Two modes with one contract (all ops run in order, the first failure
//! stops the build and is reported with the exact command and its stderr):
//! `per-op` runs one `ip`/`tc` process per op, as Mininet does; `batch`
//! feeds runs of consecutive ops for the same namespace to one
//! `ip -batch -` / `tc -batch -` process, which is several times faster on
//! large topologies.

use crate::error::LabError;
use crate::plan::{delay_line_args, Op, Plan, Tool};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    PerOp,
    Batch,
}

/// How long a delay line may take to bind its sockets.
const DELAY_LINE_START: Duration = Duration::from_secs(10);
const MAX_BATCH: usize = 2000;

pub struct ApplyCtx<'a> {
    pub mode: ApplyMode,
    /// The netlab binary, started again as `netlab delay-line`.
    pub exe: &'a Path,
    /// Where delay-line logs go.
    pub log_dir: &'a Path,
    pub stop: &'a AtomicBool,
    pub progress: &'a mut dyn FnMut(usize, usize),
    /// A dilated lab's clock (directory, domain) and its TDF at build: the
    /// delay lines follow the clock's TDF when it changes.
    pub clock: Option<(&'a Path, &'a str, vtime::Tdf)>,
}

/// An op as a batch line: `(namespace, tool, line)`; `None` if it cannot be
/// batched.
fn batch_key(op: &Op) -> Option<(Option<&str>, Tool, String)> {
    match op {
        Op::AddNetns(n) => Some((None, Tool::Ip, format!("netns add {n}"))),
        Op::Cmd { ns, tool, args } => Some((ns.as_deref(), *tool, args.join(" "))),
        _ => None,
    }
}

fn tool_name(t: Tool) -> &'static str {
    match t {
        Tool::Ip => "ip",
        Tool::Tc => "tc",
    }
}

fn status_text(s: std::process::ExitStatus) -> String {
    s.code()
        .map(|c| c.to_string())
        .unwrap_or_else(|| "killed by signal".into())
}

/// Runs the plan. Returns the delay-line children (already running).
pub fn apply(plan: &Plan, ctx: &mut ApplyCtx) -> Result<Vec<Child>, LabError> {
    let ops = &plan.ops;
    let mut children = vec![];
    let mut i = 0;
    while i < ops.len() {
        if ctx.stop.load(Ordering::Relaxed) {
            return Err(LabError::Interrupted);
        }
        if ctx.mode == ApplyMode::Batch {
            if let Some((ns, tool, lines, j)) = batch_at(ops, i) {
                let t = std::time::Instant::now();
                run_batch(ns, tool, &lines, &ops[i..j]).map_err(|e| interrupted_or(e, ctx.stop))?;
                trace(|| {
                    format!(
                        "{:>8.2}ms  {} batch of {} ops, first: {}",
                        t.elapsed().as_secs_f64() * 1e3,
                        tool_name(tool),
                        j - i,
                        ops[i]
                    )
                });
                i = j;
                (ctx.progress)(i, ops.len());
                continue;
            }
        }
        let t = std::time::Instant::now();
        match &ops[i] {
            Op::DelayLine { .. } => children.push(start_delay_line(&ops[i], ctx)?),
            op => run_one(op).map_err(|e| interrupted_or(e, ctx.stop))?,
        }
        trace(|| format!("{:>8.2}ms  {}", t.elapsed().as_secs_f64() * 1e3, ops[i]));
        i += 1;
        (ctx.progress)(i, ops.len());
    }
    Ok(children)
}

/// A failure while the user is stopping us is the stop, not the failure
/// (a process of ours may have been signalled with the whole group).
fn interrupted_or(e: LabError, stop: &AtomicBool) -> LabError {
    if stop.load(Ordering::Relaxed) {
        LabError::Interrupted
    } else {
        e
    }
}

/// Every op (or batch) and the time it took, as a debug event of target
/// `netlab::trace`: the way to find what makes a build slow (the netlab
/// binary shows them with NETLAB_TRACE=1).
fn trace(line: impl FnOnce() -> String) {
    if tracing::enabled!(target: "netlab::trace", tracing::Level::DEBUG) {
        tracing::debug!(target: "netlab::trace", "netlab trace: {}", line());
    }
}

/// Runs one operation now, checking its exit status.
pub fn run_op(op: &Op) -> Result<(), LabError> {
    run_one(op)
}

/// Runs operations now, in order, consecutive ones for the same namespace
/// and tool in one `-batch` process: a run-time change to hundreds of links
/// (a TDF change) costs a few processes, not hundreds, which matters most
/// when the machine is saturated, exactly when the adaptive TDF acts.
pub fn run_ops_batched(ops: &[Op]) -> Result<(), LabError> {
    let mut i = 0;
    while i < ops.len() {
        let Some((ns, tool, lines, j)) = batch_at(ops, i) else {
            run_one(&ops[i])?;
            i += 1;
            continue;
        };
        run_batch(ns, tool, &lines, &ops[i..j])?;
        i = j;
    }
    Ok(())
}

/// The batch that starts at `ops[i]`: its namespace, tool, lines, and the
/// index after it; `None` if that op cannot be batched.
fn batch_at(ops: &[Op], i: usize) -> Option<(Option<&str>, Tool, Vec<String>, usize)> {
    let (ns, tool, _) = batch_key(&ops[i])?;
    let mut j = i;
    let mut lines = vec![];
    while j < ops.len() && lines.len() < MAX_BATCH {
        match batch_key(&ops[j]) {
            Some((n2, t2, line)) if n2 == ns && t2 == tool => lines.push(line),
            _ => break,
        }
        j += 1;
    }
    Some((ns, tool, lines, j))
}

fn run_one(op: &Op) -> Result<(), LabError> {
    let mut cmd = match op {
        Op::AddNetns(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "add", n]);
            c
        }
        Op::Sysctl { ns, key, value } => return crate::netns::sysctl(ns, key, value),
        Op::Sysfs { ns, dev, set } => {
            return crate::netns::write_sysfs(ns, dev, set).map_err(|msg| LabError::Apply {
                op: op.to_string(),
                msg,
            })
        }
        Op::Ethtool { ns, args } => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "ethtool"]).args(args);
            c
        }
        Op::Cmd { ns, tool, args } => {
            let mut c = Command::new(tool_name(*tool));
            if let Some(ns) = ns {
                c.args(["-n", ns]);
            }
            c.args(args);
            c
        }
        Op::DelayLine { .. } => unreachable!("delay lines are started by apply()"),
    };
    // Its own process group: a Ctrl-C at the terminal reaches netlab only,
    // which stops between operations and removes the lab in order, instead
    // of the operation dying half-done with "killed by signal".
    let out = cmd.process_group(0).output().map_err(|e| LabError::Spawn {
        cmd: op.to_string(),
        source: e,
    })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: op.to_string(),
            code: status_text(out.status),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn run_batch(ns: Option<&str>, tool: Tool, lines: &[String], ops: &[Op]) -> Result<(), LabError> {
    let mut c = Command::new(tool_name(tool));
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    c.args(["-batch", "-"])
        // Its own process group: see run_one.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let what = format!(
        "{} {}-batch ({} ops, first: {})",
        tool_name(tool),
        ns.map(|n| format!("-n {n} ")).unwrap_or_default(),
        lines.len(),
        ops[0]
    );
    let mut child = c.spawn().map_err(|e| LabError::Spawn {
        cmd: what.clone(),
        source: e,
    })?;
    let mut text = lines.join("\n");
    text.push('\n');
    // Write from a thread so that a tool that stops reading on error cannot
    // dead-lock us against a full stderr pipe.
    let stdin = child.stdin.take();
    let writer = std::thread::spawn(move || {
        if let Some(mut s) = stdin {
            let _ = s.write_all(text.as_bytes());
        }
    });
    let out = child.wait_with_output().map_err(|e| LabError::Spawn {
        cmd: what.clone(),
        source: e,
    })?;
    let _ = writer.join();
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    // Both tools report "Command failed -:N" with the 1-based line.
    let failed = stderr
        .rsplit("Command failed -:")
        .next()
        .and_then(|s| s.trim().split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|s| s.parse::<usize>().ok())
        .and_then(|n| ops.get(n.wrapping_sub(1)));
    Err(LabError::Command {
        cmd: failed.map(|o| o.to_string()).unwrap_or(what),
        code: status_text(out.status),
        stderr: stderr
            .lines()
            .filter(|l| !l.starts_with("Command failed"))
            .collect::<Vec<_>>()
            .join("; "),
    })
}

fn start_delay_line(op: &Op, ctx: &ApplyCtx) -> Result<Child, LabError> {
    let Op::DelayLine {
        ns,
        link,
        a,
        b,
        params,
        seed,
    } = op
    else {
        unreachable!("only called for delay-line ops")
    };
    let log_path = ctx.log_dir.join(format!("delay-line-{link}.log"));
    let log =
        std::fs::File::create(&log_path).map_err(|e| LabError::io(format!("create {}", log_path.display()), e))?;
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(ctx.exe)
        .args(["delay-line", "--link", &link.to_string(), "--a", a, "--b", b])
        .args(delay_line_args(params))
        .args(["--seed", &seed.to_string()]);
    if let Some((dir, domain, tdf)) = ctx.clock {
        c.arg("--clock-dir")
            .arg(dir)
            .args(["--clock-domain", domain, "--built-tdf", &tdf.to_string()]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        // Its own process group: a Ctrl-C at the terminal reaches netlab,
        // which then removes the lab in order, instead of killing links
        // under running traffic.
        .process_group(0);
    let mut child = c.spawn().map_err(|e| LabError::Spawn {
        cmd: op.to_string(),
        source: e,
    })?;
    let stdout = child.stdout.take();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        if let Some(s) = stdout {
            let _ = BufReader::new(s).read_line(&mut line);
        }
        let _ = tx.send(line);
    });
    match rx.recv_timeout(DELAY_LINE_START) {
        Ok(l) if l.trim() == "ready" => Ok(child),
        other => {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            Err(LabError::DelayLine {
                link: format!("{link} ({a} <-> {b})"),
                msg: match other {
                    Err(_) => format!("did not start within {DELAY_LINE_START:?}; log: {}", log.trim()),
                    Ok(_) => format!("exited at start: {}", log.trim()),
                },
            })
        }
    }
}
