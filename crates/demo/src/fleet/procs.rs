//! The scenario's processes: started with their log, signalled, waited
//! for, and asked over HTTP; their logs kept when the run ends. Apart
//! from the run so that its schedule reads without the plumbing.

use crate::error::DemoError;
use netlab::lab::Lab;
use oskit::child::ChildGuard;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// `name` on PATH, or the path given.
pub(super) fn which(given: &Path) -> Option<PathBuf> {
    if given.components().count() > 1 {
        return given.is_file().then(|| given.to_owned());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(given))
        .find(|p| p.is_file())
}

/// A started process of the scenario, stopped when dropped.
pub(super) struct Proc {
    pub(super) name: String,
    pub(super) guard: Option<ChildGuard>,
}

impl Proc {
    pub(super) fn alive(&mut self) -> bool {
        match &mut self.guard {
            Some(g) => matches!(g.child().try_wait(), Ok(None)),
            None => false,
        }
    }

    pub(super) fn signal(&mut self, sig: nix::sys::signal::Signal) -> Result<(), DemoError> {
        let g = self
            .guard
            .as_mut()
            .ok_or_else(|| format!("{} is not running", self.name))?;
        let pid = nix::unistd::Pid::from_raw(g.id() as i32);
        nix::sys::signal::kill(pid, sig).map_err(|e| format!("cannot signal {}: {e}", self.name))?;
        Ok(())
    }
}

pub(super) fn spawn(name: &str, mut c: Command, log: &Path) -> Result<Proc, DemoError> {
    let f = std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(f);
    let child = c.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Proc {
        name: name.into(),
        guard: Some(ChildGuard::new(child)),
    })
}

pub(super) fn addr_of(lab: &Lab, host: &str) -> Result<Ipv4Addr, DemoError> {
    Ok(lab
        .state
        .host(host)?
        .addr
        .ok_or_else(|| format!("lab host {host} has no address"))?)
}

/// Waits until `ok`, `secs` real seconds at most.
pub(super) fn wait_for(
    what: &str,
    secs: f64,
    stop: &AtomicBool,
    mut ok: impl FnMut() -> bool,
) -> Result<(), DemoError> {
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    while !ok() {
        if stop.load(Relaxed) {
            return Err("interrupted".into());
        }
        if Instant::now() > deadline {
            return Err(format!("timed out after {secs:.0} s waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Copies the run's `*.log` files and the bots' report to `to` when dropped.
pub(super) struct KeepLogs {
    pub(super) from: PathBuf,
    pub(super) to: Option<PathBuf>,
}

impl Drop for KeepLogs {
    fn drop(&mut self) {
        let Some(to) = &self.to else { return };
        if let Err(e) = std::fs::create_dir_all(to) {
            eprintln!("fleet: cannot create {}: {e}", to.display());
            return;
        }
        let Ok(entries) = std::fs::read_dir(&self.from) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log" || x == "json" || x == "jsonl") {
                if let Err(err) = std::fs::copy(&p, to.join(e.file_name())) {
                    eprintln!("fleet: cannot keep {}: {err}", p.display());
                }
            }
        }
        eprintln!("fleet: logs kept in {}", to.display());
    }
}

pub(super) fn get(url: &str) -> Result<String, String> {
    ureq::get(url)
        .timeout(Duration::from_millis(500))
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?
        .into_string()
        .map_err(|e| format!("GET {url}: {e}"))
}

pub(super) fn tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(10).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}
