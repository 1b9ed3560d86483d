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
//!
//! Inside a network namespace other than the initial one (`unshare --net`,
//! a container) these keys do not exist at all: they are skipped, and
//! [`Raised::unavailable`] says which, so the caller can say once what that
//! means for the lab.

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

/// The current value, or `None` if this network namespace has no such key
/// (only the initial namespace has the machine-wide ones).
fn read(key: &str) -> Result<Option<u64>, LabError> {
    let p = proc_path(key);
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LabError::io(format!("read {p}"), e)),
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| LabError::io(format!("parse {p}"), std::io::Error::other(text.trim().to_string())))
}

/// The value of a machine-wide limit as this namespace sees it (`None`:
/// not visible here).
pub fn current(key: &str) -> Option<u64> {
    read(key).ok().flatten()
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

/// What [`raise`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Raised {
    /// A line per change ("KEY: OLD -> NEW").
    pub changes: Vec<String>,
    /// Keys the lab would have needed raised that this network namespace
    /// cannot see (it is not the machine's initial one), left as they are.
    pub unavailable: Vec<&'static str>,
}

impl Raised {
    /// One line saying what the keys that could not be raised mean for the
    /// lab, if there are any.
    pub fn note(&self) -> Option<String> {
        let neigh = self.unavailable.iter().any(|k| NEIGH_THRESH.contains(k));
        let backlog = self.unavailable.contains(&NETDEV_BACKLOG);
        let mut parts = vec![];
        if neigh {
            parts.push(
                "net.ipv4.neigh.default.gc_thresh1-3 are not visible in this network namespace (they exist only in \
                 the machine's initial one, outside this container), so the kernel's neighbour table, shared by every \
                 namespace, keeps its size: a large lab whose hosts all talk to each other may see sends fail \
                 (ENOBUFS, \"neighbor table overflow\"); raise them on the machine itself if it does",
            );
        }
        if backlog {
            parts.push(
                "net.core.netdev_max_backlog is not visible in this network namespace (it exists only in the \
                 machine's initial one): left as it is, so broadcasts (ARP) that a bridge floods to a big \
                 segment's every port, and in-kernel fan-out to large groups, may be dropped; raise it on the \
                 machine itself",
            );
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// Raises what `needs` asks for. Keys this namespace cannot see are
/// skipped and listed in [`Raised::unavailable`] when the lab needed them.
pub fn raise(state_dir: &Path, needs: &Needs) -> Result<Raised, LabError> {
    let mut l = lock(state_dir)?;
    let keys = NEIGH_THRESH
        .iter()
        .chain(needs.netdev_backlog.is_some().then_some(&NETDEV_BACKLOG));
    let mut current = BTreeMap::new();
    let mut missing = vec![];
    for k in keys {
        match read(k)? {
            Some(v) => {
                current.insert(k.to_string(), v);
            }
            None => missing.push(*k),
        }
    }
    let mut out = Raised {
        unavailable: needed_of(needs, &missing),
        ..Default::default()
    };
    for (k, v) in targets(needs, &current) {
        if !current.contains_key(&k) {
            continue;
        }
        let old = current[&k];
        // Recorded before the write: a crash in between still restores.
        l.saved.original.entry(k.clone()).or_insert(old);
        l.store()?;
        write(&k, v)?;
        out.changes.push(format!("{k}: {old} -> {v}"));
    }
    Ok(out)
}

/// Which of the `missing` keys `needs` would have raised above the kernel's
/// defaults: a small lab fits in them and needs no note.
pub fn needed_of(needs: &Needs, missing: &[&'static str]) -> Vec<&'static str> {
    let defaults: BTreeMap<String, u64> = NEIGH_THRESH
        .iter()
        .zip(KERNEL_DEFAULTS)
        .map(|(k, v)| (k.to_string(), v))
        .chain([(NETDEV_BACKLOG.to_string(), KERNEL_DEFAULT_BACKLOG)])
        .collect();
    let wanted = targets(needs, &defaults);
    missing.iter().copied().filter(|k| wanted.contains_key(*k)).collect()
}

/// The kernel's defaults of gc_thresh1-3 and of the backlog, what a
/// namespace that cannot see them most likely gets.
pub const KERNEL_DEFAULTS: [u64; 3] = [128, 512, 1024];
pub const KERNEL_DEFAULT_BACKLOG: u64 = 1000;

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

    #[test]
    fn keys_a_namespace_cannot_see_are_noted_only_when_the_lab_needs_them() {
        let small = Needs {
            neighbour_entries: 30,
            netdev_backlog: None,
        };
        assert!(needed_of(&small, &NEIGH_THRESH).is_empty());
        let big = Needs {
            neighbour_entries: 9900,
            netdev_backlog: Some(4096),
        };
        let all = [NEIGH_THRESH[0], NEIGH_THRESH[1], NEIGH_THRESH[2], NETDEV_BACKLOG];
        let r = Raised {
            changes: vec![],
            unavailable: needed_of(&big, &all),
        };
        assert_eq!(r.unavailable, all);
        let note = r.note().unwrap();
        assert!(
            note.contains("gc_thresh1-3 are not visible in this network namespace"),
            "{note}"
        );
        assert!(note.contains("netdev_max_backlog"), "{note}");
        assert!(!note.contains('\n'));
        assert_eq!(Raised::default().note(), None);
    }
}
