//! What a run records about itself in `/run/netlab/<run>/state.json`
//! (written before anything is created, so a crash can always be swept),
//! and how runs are found again.

use crate::error::LabError;
use crate::model::NodeKind;
use crate::plan::DelayBackend;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

pub const STATE_DIR: &str = "/run/netlab";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Being built by its owner process.
    Building,
    /// Up and owned by a live process (`run`, a test).
    Running,
    /// Left up by `netlab up` for later `exec` and `down`.
    Detached,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostInfo {
    pub name: String,
    pub kind: NodeKind,
    pub ns: String,
    pub addr: Option<Ipv4Addr>,
    pub cpus: Option<String>,
}

/// What is written to `/run/netlab/<run>/state.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunState {
    pub run_id: String,
    pub scenario: String,
    pub topology: String,
    pub owner_pid: i32,
    pub owner_start: Option<u64>,
    pub phase: Phase,
    pub delay_backend: DelayBackend,
    #[serde(with = "crate::plan::tdf_serde")]
    pub tdf: vtime::Tdf,
    pub namespaces: Vec<String>,
    pub hosts: Vec<HostInfo>,
    /// The run's clock when it is dilated (TDF > 1): every process started
    /// in a host runs under the vtime shim on this one record, so all hosts
    /// share one virtual epoch.
    #[serde(default)]
    pub clock: Option<ClockInfo>,
    /// The devices with a rate limit, re-rated when the TDF changes.
    #[serde(default)]
    pub shaped: Vec<crate::plan::Shaped>,
}

/// Where a dilated run's clock lives.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClockInfo {
    /// The vtime clock domain (`vtime status` shows it, `vtime set` changes it).
    pub domain: String,
    pub dir: PathBuf,
    /// The shim every process in the lab preloads.
    pub shim: PathBuf,
}

impl RunState {
    /// True while the process that built the run (and removes it) lives.
    pub fn owner_alive(&self) -> bool {
        oskit::procfs::alive(self.owner_pid) && oskit::procfs::start_time(self.owner_pid) == self.owner_start
    }
    pub fn host(&self, name: &str) -> Result<&HostInfo, LabError> {
        self.hosts
            .iter()
            .find(|h| h.name == name)
            .ok_or_else(|| LabError::UnknownHost {
                host: name.into(),
                run: self.run_id.clone(),
                known: self
                    .hosts
                    .iter()
                    .map(|h| h.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

pub(crate) fn alloc_run(state_dir: &Path) -> Result<(String, PathBuf), LabError> {
    std::fs::create_dir_all(state_dir).map_err(|e| LabError::io(format!("create {}", state_dir.display()), e))?;
    loop {
        let id = format!(
            "{:x}x{}",
            std::process::id(),
            RUN_COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = state_dir.join(&id);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok((id, dir)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(LabError::io(format!("create {}", dir.display()), e)),
        }
    }
}

pub fn write_state(dir: &Path, s: &RunState) -> Result<(), LabError> {
    let tmp = dir.join("state.json.tmp");
    let json = serde_json::to_vec_pretty(s).map_err(|e| LabError::io("encode state", e.into()))?;
    std::fs::write(&tmp, json).map_err(|e| LabError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, dir.join("state.json")).map_err(|e| LabError::io(format!("rename {}", tmp.display()), e))
}

pub fn read_state(dir: &Path) -> Option<RunState> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

/// All runs with a readable state.
pub fn list_runs(state_dir: &Path) -> Vec<RunState> {
    let mut v: Vec<RunState> = std::fs::read_dir(state_dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| read_state(&e.path()))
        .collect();
    v.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    v
}

/// The run a command means: the one named, or the only one that is up.
pub fn find_run(state_dir: &Path, run: Option<&str>) -> Result<RunState, LabError> {
    let runs: Vec<RunState> = list_runs(state_dir)
        .into_iter()
        .filter(|r| r.phase != Phase::Building)
        .collect();
    match run {
        Some(id) => runs
            .into_iter()
            .find(|r| r.run_id == id)
            .ok_or_else(|| LabError::NoLab(format!(" with run id '{id}'"))),
        None => match runs.len() {
            0 => Err(LabError::NoLab(String::new())),
            1 => Ok(runs.into_iter().next().expect("one element")),
            _ => Err(LabError::Ambiguous(format!(
                "several labs are up ({}): name one with --run",
                runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>().join(", ")
            ))),
        },
    }
}
