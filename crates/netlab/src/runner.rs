//! The scenario runner: starts a scenario's commands in their hosts at
//! their times (through the run's launcher), waits for the foreground ones,
//! prints their output, and fails on the first that fails or times out.

use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::HostCommand;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Starts each command at its time, waits for the foreground ones, prints
/// their output, and fails on the first that fails or times out.
pub fn run_commands(lab: &Lab, cmds: &[HostCommand], stop: &AtomicBool, out_dir: &Path) -> Result<(), LabError> {
    let launcher = lab.launcher();
    struct Running {
        idx: usize,
        cmd: HostCommand,
        child: std::process::Child,
        started: Instant,
        out: PathBuf,
        err: PathBuf,
    }
    let t0 = Instant::now();
    let mut running: Vec<Running> = vec![];
    let mut background = vec![];
    let mut next = 0;
    loop {
        if stop.load(Ordering::Relaxed) {
            for r in running.iter_mut().chain(background.iter_mut()) {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            return Err(LabError::Interrupted);
        }
        while next < cmds.len() && t0.elapsed() >= cmds[next].at {
            let c = &cmds[next];
            let base = format!("{next:02}-{}", c.host);
            let (out, err) = (out_dir.join(format!("{base}.out")), out_dir.join(format!("{base}.err")));
            let f = |p: &Path| std::fs::File::create(p).map_err(|e| LabError::io(format!("create {}", p.display()), e));
            let mut cmd = launcher.command(&c.host, &["sh", "-c", &c.cmd])?;
            cmd.stdin(Stdio::null()).stdout(f(&out)?).stderr(f(&err)?);
            let child = cmd.spawn().map_err(|e| LabError::Spawn {
                cmd: c.cmd.clone(),
                source: e,
            })?;
            tracing::info!(
                "netlab: [{:>6.2}s] {}: {}{}",
                t0.elapsed().as_secs_f64(),
                c.host,
                c.cmd,
                if c.background { " (background)" } else { "" }
            );
            let r = Running {
                idx: next,
                cmd: c.clone(),
                child,
                started: Instant::now(),
                out,
                err,
            };
            if c.background {
                background.push(r);
            } else {
                running.push(r);
            }
            next += 1;
        }
        let mut i = 0;
        while i < running.len() {
            let r = &mut running[i];
            let status = r.child.try_wait().map_err(|e| LabError::io("wait for command", e))?;
            let timed_out = status.is_none() && r.started.elapsed() > r.cmd.timeout;
            if status.is_none() && !timed_out {
                i += 1;
                continue;
            }
            if timed_out {
                let _ = r.child.kill();
                let _ = r.child.wait();
            }
            let r = running.remove(i);
            let out = std::fs::read_to_string(&r.out).unwrap_or_default();
            let err = std::fs::read_to_string(&r.err).unwrap_or_default();
            let mut so = std::io::stdout().lock();
            for l in out.lines() {
                let _ = writeln!(so, "[{}] {l}", r.cmd.host);
            }
            for l in err.lines() {
                let _ = writeln!(so, "[{} stderr] {l}", r.cmd.host);
            }
            drop(so);
            let ok = matches!(status, Some(s) if s.success());
            if !ok {
                let tail: Vec<&str> = err.lines().rev().take(5).collect();
                let tail = if tail.is_empty() {
                    String::new()
                } else {
                    format!(
                        "\n  stderr: {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n          ")
                    )
                };
                return Err(LabError::HostCommand {
                    host: r.cmd.host.clone(),
                    cmd: format!("command {}: {}", r.idx, r.cmd.cmd),
                    code: match status {
                        None => format!("timed out after {:?}", r.cmd.timeout),
                        Some(s) => s
                            .code()
                            .map(|c| c.to_string())
                            .unwrap_or_else(|| "killed by signal".into()),
                    },
                    tail,
                });
            }
        }
        if next >= cmds.len() && running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for mut r in background {
        let _ = r.child.kill();
        let _ = r.child.wait();
    }
    Ok(())
}
