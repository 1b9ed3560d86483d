//! Removing labs: a run's namespaces and every process inside them, and
//! the sweep that removes what a killed run left behind.

use super::state::{read_state, Phase};
use crate::error::LabError;
use crate::netns;
use crate::plan::{Naming, NS_PREFIX};
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A state directory without its state file is a run being created; it is
/// left alone this long before being treated as debris.
const YOUNG: Duration = Duration::from_secs(60);

/// Removes every namespace of a run (those recorded and any other carrying
/// its prefix), every process inside them, and its state directory.
pub fn remove_run(dir: &Path, run_id: &str, recorded: &[String]) -> Result<(), LabError> {
    let prefix = Naming::new(run_id).prefix();
    let mut names: Vec<String> = recorded.to_vec();
    for n in netns::our_namespaces() {
        if n.starts_with(&prefix) && !names.contains(&n) {
            names.push(n);
        }
    }
    delete_namespaces(&names)?;
    let _ = std::fs::remove_dir_all(dir);
    if let Some(state_dir) = dir.parent() {
        for line in super::limits::restore_if_idle(state_dir)? {
            tracing::info!("netlab: last lab removed: {line}");
        }
    }
    Ok(())
}

/// Deletes many namespaces at once: one scan of /proc to end their
/// processes, one `ip -batch` to delete them.
pub fn delete_namespaces(names: &[String]) -> Result<(), LabError> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let existing: Vec<&String> = names
        .iter()
        .filter(|n| Path::new(netns::NETNS_DIR).join(n).exists())
        .collect();
    if existing.is_empty() {
        return Ok(());
    }
    let paths: Vec<std::path::PathBuf> = existing.iter().map(|n| Path::new(netns::NETNS_DIR).join(n)).collect();
    let scan = || oskit::procfs::pids_in_netns(&paths.iter().map(|p| p.as_path()).collect::<Vec<_>>());
    let pids = scan();
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| oskit::procfs::alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in scan() {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    let mut child = Command::new("ip")
        .args(["-force", "-batch", "-"])
        // A second Ctrl-C must not cut the removal short.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| LabError::Spawn {
            cmd: "ip -force -batch - (netns del)".into(),
            source: e,
        })?;
    let text: String = existing.iter().map(|n| format!("netns del {n}\n")).collect();
    if let Some(mut s) = child.stdin.take() {
        let _ = s.write_all(text.as_bytes());
    }
    let out = child.wait_with_output().map_err(|e| LabError::Spawn {
        cmd: "ip -force -batch - (netns del)".into(),
        source: e,
    })?;
    let left: Vec<&&String> = existing
        .iter()
        .filter(|n| Path::new(netns::NETNS_DIR).join(n).exists())
        .collect();
    if !left.is_empty() {
        return Err(LabError::Command {
            cmd: format!(
                "ip netns del {}",
                left.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ")
            ),
            code: out.status.code().map(|c| c.to_string()).unwrap_or_default(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SweepMode {
    /// Only runs whose owner died while building or running them, and
    /// namespaces of ours that no run claims (what `kill -9` leaves).
    DeadOnly,
    /// Also detached labs left up by `netlab up` (`netlab clean`).
    AllButLive,
    /// Everything, even labs a live process is using (`netlab clean --force`).
    Force,
}

#[derive(Debug, Default)]
pub struct SweepReport {
    pub removed: Vec<String>,
    /// (run, owner pid) left alone because a live process owns them.
    pub skipped: Vec<(String, i32)>,
}

/// Finds and removes leftovers. Safe to run while other runs are being
/// built: a run being created has its state directory before any namespace.
pub fn sweep(state_dir: &Path, mode: SweepMode) -> Result<SweepReport, LabError> {
    let mut rep = SweepReport::default();
    let mut known: HashMap<String, bool> = HashMap::new();
    for e in std::fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
    {
        let dir = e.path();
        // Runs are directories; the files beside them (the saved kernel
        // limits and their lock) are not runs.
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let Some(id) = e.file_name().to_str().map(String::from) else {
            continue;
        };
        let (remove, recorded) = match read_state(&dir) {
            Some(s) => {
                let live = s.phase != Phase::Detached && s.owner_alive();
                let remove = match mode {
                    SweepMode::DeadOnly => s.phase != Phase::Detached && !live,
                    SweepMode::AllButLive => !live,
                    SweepMode::Force => true,
                };
                if !remove && live {
                    rep.skipped.push((id.clone(), s.owner_pid));
                }
                (remove, s.namespaces)
            }
            None => {
                let young = e
                    .metadata()
                    .ok()
                    .and_then(|m| m.modified().ok())
                    .and_then(|t| t.elapsed().ok())
                    .map(|a| a < YOUNG)
                    .unwrap_or(true);
                (mode == SweepMode::Force || !young, vec![])
            }
        };
        known.insert(id.clone(), remove);
        if remove {
            remove_run(&dir, &id, &recorded)?;
            rep.removed.push(id);
        }
    }
    // Namespaces no state directory claims: debris of a run whose state is
    // gone, or of the netem probe.
    let mut orphans = vec![];
    for n in netns::our_namespaces() {
        let id = n[NS_PREFIX.len()..].split('-').next().unwrap_or("").to_string();
        // Checked again now, not from the listing above: a run that started
        // since then has its state directory before any namespace.
        let claimed = known.contains_key(&id) || state_dir.join(&id).exists();
        if !claimed && !id.starts_with("probe") {
            orphans.push(n);
        } else if id.starts_with("probe") {
            let pid = id
                .trim_start_matches("probe")
                .split('x')
                .next()
                .and_then(|p| p.parse::<i32>().ok())
                .unwrap_or(0);
            if !oskit::procfs::alive(pid) {
                orphans.push(n);
            }
        }
    }
    if !orphans.is_empty() {
        delete_namespaces(&orphans)?;
        rep.removed.extend(orphans);
    }
    // Clock records of dilated runs whose owner died with them.
    if let Ok(gone) = vtime::remove_stale(&vtime::default_dir()) {
        rep.removed.extend(gone.into_iter().map(|n| format!("clock {n}")));
    }
    Ok(rep)
}
