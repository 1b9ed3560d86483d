//! Machine-wide kernel limits a lab can outgrow, raised when a lab needs
//! them (as Mininet's `fixLimits` does) and put back when the last lab is
//! removed.
//!
//! These settings exist only once for the whole machine (the neighbour
//! table is shared by every namespace; `net.core.netdev_max_backlog` exists
//! only in the initial namespace), so a lab host cannot set them itself. The
//! values found before the first raise are recorded in
//! `<state dir>/limits.json`, under a lock, so concurrent netlab processes
//! agree on what to restore, and a crashed run's raise is undone by the
//! sweep that removes its lab.

use crate::error::LabError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

pub const NEIGH_THRESH: [&str; 3] = [
    "net.ipv4.neigh.default.gc_thresh1",
    "net.ipv4.neigh.default.gc_thresh2",
    "net.ipv4.neigh.default.gc_thresh3",
];
pub const NETDEV_BACKLOG: &str = "net.core.netdev_max_backlog";

/// What a lab needs of the machine-wide limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Neighbour (ARP) entries, every namespace together.
    pub neighbour_entries: u64,
    /// Packets the per-CPU backlog must hold (in-kernel fan-out clones).
    pub netdev_backlog: Option<u64>,
}

/// The values to write for `needs`, given the current ones: only raises,
/// never lowers. Pure, so the rule is unit-tested.
pub fn targets(needs: &Needs, current: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let cur = |k: &str| current.get(k).copied().unwrap_or(0);
    if needs.neighbour_entries > cur(NEIGH_THRESH[2]) {
        // Headroom of 2x, and the usual 1:2:4 shape of the three thresholds
        // (below thresh1 no garbage collection; above thresh3 refusals).
        let t3 = needs.neighbour_entries.next_power_of_two() * 2;
        for (k, v) in NEIGH_THRESH.iter().zip([t3 / 4, t3 / 2, t3]) {
            if v > cur(k) {
                out.insert(k.to_string(), v);
            }
        }
    }
    if let Some(b) = needs.netdev_backlog {
        if b > cur(NETDEV_BACKLOG) {
            out.insert(NETDEV_BACKLOG.to_string(), b);
        }
    }
    out
}

fn proc_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

fn read(key: &str) -> Result<u64, LabError> {
    let p = proc_path(key);
    let text = std::fs::read_to_string(&p).map_err(|e| LabError::io(format!("read {p}"), e))?;
    text.trim()
        .parse()
        .map_err(|_| LabError::io(format!("parse {p}"), std::io::Error::other(text.trim().to_string())))
}

fn write(key: &str, v: u64) -> Result<(), LabError> {
    let p = proc_path(key);
    std::fs::write(&p, v.to_string()).map_err(|e| LabError::io(format!("sysctl {key}={v}"), e))
}

/// The values found before netlab first raised anything.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    original: BTreeMap<String, u64>,
}

/// Holds the lock on the saved values while alive.
struct Locked {
    _lock: nix::fcntl::Flock<std::fs::File>,
    path: std::path::PathBuf,
    saved: Saved,
}

fn lock(state_dir: &Path) -> Result<Locked, LabError> {
    std::fs::create_dir_all(state_dir).map_err(|e| LabError::io(format!("create {}", state_dir.display()), e))?;
    let lp = state_dir.join("limits.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lp)
        .map_err(|e| LabError::io(format!("open {}", lp.display()), e))?;
    let lock = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| LabError::sys(format!("flock({})", lp.display()), e))?;
    let path = state_dir.join("limits.json");
    let saved = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    Ok(Locked {
        _lock: lock,
        path,
        saved,
    })
}

impl Locked {
    fn store(&self) -> Result<(), LabError> {
        if self.saved.original.is_empty() {
            let _ = std::fs::remove_file(&self.path);
            return Ok(());
        }
        let json = serde_json::to_vec_pretty(&self.saved).map_err(|e| LabError::io("encode limits", e.into()))?;
        std::fs::write(&self.path, json).map_err(|e| LabError::io(format!("write {}", self.path.display()), e))
    }
}

/// Raises what `needs` asks for; returns a line per change ("KEY: OLD -> NEW").
pub fn raise(state_dir: &Path, needs: &Needs) -> Result<Vec<String>, LabError> {
    let mut l = lock(state_dir)?;
    let keys = NEIGH_THRESH
        .iter()
        .chain(needs.netdev_backlog.is_some().then_some(&NETDEV_BACKLOG));
    let mut current = BTreeMap::new();
    for k in keys {
        current.insert(k.to_string(), read(k)?);
    }
    let mut changes = vec![];
    for (k, v) in targets(needs, &current) {
        let old = current[&k];
        // Recorded before the write: a crash in between still restores.
        l.saved.original.entry(k.clone()).or_insert(old);
        l.store()?;
        write(&k, v)?;
        changes.push(format!("{k}: {old} -> {v}"));
    }
    Ok(changes)
}

/// Puts back every value netlab raised, if no lab is left in `state_dir`;
/// returns a line per value restored.
pub fn restore_if_idle(state_dir: &Path) -> Result<Vec<String>, LabError> {
    let mut l = lock(state_dir)?;
    if l.saved.original.is_empty() || !super::list_runs(state_dir).is_empty() || has_young_run(state_dir) {
        return Ok(vec![]);
    }
    let mut done = vec![];
    for (k, v) in std::mem::take(&mut l.saved.original) {
        write(&k, v)?;
        done.push(format!("{k}: restored to {v}"));
    }
    l.store()?;
    Ok(done)
}

/// A run directory without state yet: a lab being created right now.
fn has_young_run(state_dir: &Path) -> bool {
    std::fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .any(|e| e.path().is_dir() && !e.path().join("state.json").exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cur(n3: u64, backlog: u64) -> BTreeMap<String, u64> {
        [
            (NEIGH_THRESH[0], n3 / 8),
            (NEIGH_THRESH[1], n3 / 2),
            (NEIGH_THRESH[2], n3),
            (NETDEV_BACKLOG, backlog),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    #[test]
    fn only_raises_and_keeps_the_threshold_shape() {
        let small = Needs {
            neighbour_entries: 30,
            netdev_backlog: None,
        };
        assert!(targets(&small, &cur(1024, 1000)).is_empty());
        let star100 = Needs {
            neighbour_entries: 9900,
            netdev_backlog: Some(512),
        };
        let t = targets(&star100, &cur(1024, 1000));
        assert_eq!(t[NEIGH_THRESH[2]], 32768);
        assert_eq!(t[NEIGH_THRESH[1]], 16384);
        assert_eq!(t[NEIGH_THRESH[0]], 8192);
        // The backlog already holds more than asked: left alone.
        assert!(!t.contains_key(NETDEV_BACKLOG));
        let fanout = Needs {
            neighbour_entries: 0,
            netdev_backlog: Some(4096),
        };
        assert_eq!(targets(&fanout, &cur(1024, 1000)).get(NETDEV_BACKLOG), Some(&4096));
    }
}
