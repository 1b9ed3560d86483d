//! A lab's life: build it from a plan, record it, run things in it, and
//! remove it on every path out (normal exit, error, panic, Ctrl-C), with a
//! sweep that removes what a killed run left behind.

use crate::apply::{apply, ApplyCtx, ApplyMode};
use crate::error::LabError;
use crate::model::{NodeKind, Topology};
use crate::netns;
use crate::plan::{build_plan, DelayBackend, Dilation, Naming, Plan, PlanOptions, NS_PREFIX};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const STATE_DIR: &str = "/run/netlab";

/// A state directory without its state file is a run being created; it is
/// left alone this long before being treated as debris.
const YOUNG: Duration = Duration::from_secs(60);

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
    pub tdf: u32,
    pub namespaces: Vec<String>,
    pub hosts: Vec<HostInfo>,
}

impl RunState {
    fn owner_alive(&self) -> bool {
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

/// Whether a link backend can be used here, and why not.
pub use oskit::Support;

/// Probes netem by adding it to the loopback of a throw-away namespace.
/// The answer cannot change while we run, so it is probed once per process.
pub fn probe_netem() -> Support {
    static CACHED: std::sync::OnceLock<Support> = std::sync::OnceLock::new();
    CACHED.get_or_init(probe_netem_now).clone()
}

fn probe_netem_now() -> Support {
    static N: AtomicU32 = AtomicU32::new(0);
    let ns = format!(
        "{NS_PREFIX}probe{}x{}-",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    let ok = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        return Support::Unsupported("cannot create a namespace to probe".into());
    }
    let out = Command::new("tc")
        .args(["-n", &ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"])
        .output();
    let _ = Command::new("ip").args(["netns", "del", &ns]).status();
    match out {
        Ok(o) if o.status.success() => Support::Supported,
        Ok(o) => Support::Unsupported(format!(
            "netem is not in this kernel ({})",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Support::Unsupported(format!("tc: {e}")),
    }
}

/// Picks the delay backend: the one asked for if it works, else the best
/// the probe allows. Returns the choice and a line saying why.
pub fn choose_delay_backend(want: Option<DelayBackend>) -> Result<(DelayBackend, String), LabError> {
    let netem = probe_netem();
    match (want, netem) {
        (Some(DelayBackend::Netem), Support::Unsupported(r)) => Err(LabError::Unsupported {
            name: "netem".into(),
            reason: format!("{r}; use --delay-backend delay-line"),
        }),
        (Some(b), _) => Ok((b, format!("link delay: {b} (as requested)"))),
        (None, Support::Supported) => Ok((DelayBackend::Netem, "link delay: netem (probe: supported)".into())),
        (None, Support::Unsupported(r)) => Ok((
            DelayBackend::DelayLine,
            format!("link delay: built-in delay line ({r})"),
        )),
    }
}

/// The kernel's neighbour table is one table for all namespaces, and it
/// refuses new entries beyond `gc_thresh3` (sends then fail with ENOBUFS,
/// "neighbor table overflow" in the kernel log). Returns a warning when a
/// lab whose hosts all talk to each other would need more.
pub fn neighbour_warning(addressing: &crate::addr::Addressing) -> Option<String> {
    let need = addressing.neighbour_entries_all_pairs();
    let have: u64 = std::fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (need > have).then(|| {
        let n = need.next_power_of_two() * 2;
        format!(
            "all-pairs traffic in this lab needs up to {need} neighbour (ARP) entries, but the kernel's \
             neighbour table, shared by every namespace, holds {have} (net.ipv4.neigh.default.gc_thresh3); \
             beyond that sends fail. Raise it with: sysctl -w net.ipv4.neigh.default.gc_thresh1={} \
             net.ipv4.neigh.default.gc_thresh2={} net.ipv4.neigh.default.gc_thresh3={n}",
            n / 4,
            n / 2
        )
    })
}

pub fn require_root() -> Result<(), LabError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(LabError::NotRoot)
    }
}

#[derive(Clone, Debug)]
pub struct LabOptions {
    pub scenario: String,
    /// `None`: probe and take the best.
    pub delay_backend: Option<DelayBackend>,
    pub apply_mode: ApplyMode,
    pub dilation: Dilation,
    pub ecmp_seed: Option<u32>,
    /// The netlab binary, for delay-line processes.
    pub exe: PathBuf,
    /// Print progress and choices on stderr.
    pub verbose: bool,
    pub state_dir: PathBuf,
}

impl LabOptions {
    pub fn new(exe: impl Into<PathBuf>) -> Self {
        LabOptions {
            scenario: "(none)".into(),
            delay_backend: None,
            apply_mode: ApplyMode::Batch,
            dilation: Dilation::default(),
            ecmp_seed: None,
            exe: exe.into(),
            verbose: false,
            state_dir: PathBuf::from(STATE_DIR),
        }
    }
}

/// A lab that is up. Dropping it removes it, unless it was detached.
pub struct Lab {
    pub state: RunState,
    pub plan: Plan,
    pub dir: PathBuf,
    children: Vec<Child>,
    done: bool,
    pub build_time: Duration,
}

static RUN_COUNTER: AtomicU32 = AtomicU32::new(0);

fn alloc_run(state_dir: &Path) -> Result<(String, PathBuf), LabError> {
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

fn write_state(dir: &Path, s: &RunState) -> Result<(), LabError> {
    let tmp = dir.join("state.json.tmp");
    let json = serde_json::to_vec_pretty(s).map_err(|e| LabError::io("encode state", e.into()))?;
    std::fs::write(&tmp, json).map_err(|e| LabError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, dir.join("state.json")).map_err(|e| LabError::io(format!("rename {}", tmp.display()), e))
}

pub fn read_state(dir: &Path) -> Option<RunState> {
    serde_json::from_slice(&std::fs::read(dir.join("state.json")).ok()?).ok()
}

impl Lab {
    /// Builds the lab. On any error everything already created is removed
    /// before the error is returned.
    pub fn up(topo: &Topology, opts: &LabOptions, stop: &AtomicBool) -> Result<Lab, LabError> {
        require_root()?;
        topo.validate()?;
        let swept = sweep(&opts.state_dir, SweepMode::DeadOnly)?;
        if opts.verbose && !swept.removed.is_empty() {
            eprintln!("netlab: removed leftovers of dead runs: {}", swept.removed.join(", "));
        }
        let (backend, why) = choose_delay_backend(opts.delay_backend)?;
        let needs_delay = topo.links.iter().any(|l| l.params.needs_delay_stage());
        if opts.verbose && needs_delay {
            eprintln!("netlab: {why}");
        }
        let (run_id, dir) = alloc_run(&opts.state_dir)?;
        let naming = Naming::new(&run_id);
        let plan_opts = PlanOptions {
            delay_backend: backend,
            dilation: opts.dilation,
            ecmp_seed: opts.ecmp_seed,
        };
        let plan = match build_plan(topo, &naming, &plan_opts) {
            Ok(p) => p,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        let me = std::process::id() as i32;
        let hosts = topo
            .nodes
            .iter()
            .filter(|n| n.kind != NodeKind::Switch)
            .map(|n| HostInfo {
                name: n.name.clone(),
                kind: n.kind,
                ns: naming.ns(&n.name),
                addr: plan.addressing.addr_of(&n.name),
                cpus: n.cpus.clone(),
            })
            .collect();
        let state = RunState {
            run_id: run_id.clone(),
            scenario: opts.scenario.clone(),
            topology: topo.name.clone(),
            owner_pid: me,
            owner_start: oskit::procfs::start_time(me),
            phase: Phase::Building,
            delay_backend: backend,
            tdf: opts.dilation.tdf,
            namespaces: plan.namespaces.clone(),
            hosts,
        };
        // Kept for `check`, which warns about neighbour table limits.
        if let Ok(json) = serde_json::to_vec(&plan.addressing) {
            let _ = std::fs::write(dir.join("addressing.json"), json);
        }
        if let Err(e) = write_state(&dir, &state) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let mut lab = Lab {
            state,
            plan,
            dir,
            children: vec![],
            done: false,
            build_time: Duration::ZERO,
        };
        if opts.verbose {
            if let Some(w) = neighbour_warning(&lab.plan.addressing) {
                eprintln!("netlab: note: {w}");
            }
        }
        let t0 = Instant::now();
        let mut last = Instant::now();
        let verbose = opts.verbose;
        let mut progress = |done: usize, total: usize| {
            if verbose && (last.elapsed() > Duration::from_millis(500) || done == total) {
                last = Instant::now();
                eprint!("\rnetlab: building {}: {done}/{total} operations", lab_label(&run_id));
                if done == total {
                    eprintln!();
                }
                let _ = std::io::stderr().flush();
            }
        };
        let mut ctx = ApplyCtx {
            mode: opts.apply_mode,
            exe: &opts.exe,
            log_dir: &lab.dir,
            stop,
            progress: &mut progress,
        };
        // On error `lab` is dropped here, which removes what was built.
        lab.children = apply(&lab.plan, &mut ctx)?;
        lab.build_time = t0.elapsed();
        lab.state.phase = Phase::Running;
        write_state(&lab.dir, &lab.state)?;
        Ok(lab)
    }

    /// Leaves the lab up after this process exits (`netlab up`).
    pub fn detach(mut self) -> Result<RunState, LabError> {
        self.state.phase = Phase::Detached;
        write_state(&self.dir, &self.state)?;
        self.done = true;
        // The delay lines keep running on their own.
        self.children.clear();
        Ok(self.state.clone())
    }

    /// Removes the lab now, reporting any failure (dropping also removes it,
    /// but can only print failures).
    pub fn down(mut self) -> Result<Duration, LabError> {
        let t0 = Instant::now();
        self.teardown()?;
        Ok(t0.elapsed())
    }

    fn teardown(&mut self) -> Result<(), LabError> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        let r = remove_run(&self.dir, &self.state.run_id, &self.state.namespaces);
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        r
    }

    pub fn ns_of(&self, node: &str) -> Result<&str, LabError> {
        self.state.host(node).map(|h| h.ns.as_str())
    }
}

fn lab_label(run: &str) -> String {
    format!("run {run}")
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!(
                "netlab: removing run {} failed: {e}; run `netlab clean`",
                self.state.run_id
            );
        }
    }
}

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
    Ok(rep)
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

/// The one place where processes are started inside a host. Virtual time
/// plugs in here: `wrapper` is put in front of every command (e.g.
/// `vtime run --tdf 4 --`).
#[derive(Clone, Debug, Default)]
pub struct Launcher {
    pub wrapper: Vec<String>,
}

impl Launcher {
    pub fn command(&self, host: &HostInfo, argv: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &host.ns]);
        if let Some(cpus) = &host.cpus {
            c.args(["taskset", "-c", cpus]);
        }
        c.args(&self.wrapper);
        c.args(argv);
        c
    }

    /// Environment every command gets: its own name, the run, and every
    /// host's address as `NETLAB_IP_<host>`.
    pub fn env(state: &RunState, host: &HostInfo) -> Vec<(String, String)> {
        let mut v = vec![
            ("NETLAB_HOST".to_string(), host.name.clone()),
            ("NETLAB_RUN".to_string(), state.run_id.clone()),
        ];
        for h in &state.hosts {
            if let Some(a) = h.addr {
                v.push((format!("NETLAB_IP_{}", h.name), a.to_string()));
            }
        }
        v
    }
}
