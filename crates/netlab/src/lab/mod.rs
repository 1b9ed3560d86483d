//! A lab's life: build it from a plan, record it, run things in it, and
//! remove it on every path out (normal exit, error, panic, Ctrl-C), with a
//! sweep that removes what a killed run left behind.

mod cleanup;
mod launch;
pub mod limits;
mod state;

pub use cleanup::{delete_namespaces, remove_run, sweep, SweepMode, SweepReport};
pub use launch::Launcher;
use state::alloc_run;
pub use state::write_state;
pub use state::{find_run, list_runs, read_state, ClockInfo, HostInfo, Phase, RunState, STATE_DIR};

use crate::apply::{apply, ApplyCtx, ApplyMode};
use crate::error::LabError;
use crate::model::{NodeKind, Topology};
use crate::plan::{build_plan, DelayBackend, Dilation, Naming, Plan, PlanOptions, NS_PREFIX};
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
/// lab whose hosts all talk to each other would need more than it holds
/// now (`up` raises it where it can; this is for labs built before that,
/// and for all pairs of a big lab in a container, which cannot raise it).
pub fn neighbour_warning(addressing: &crate::addr::Addressing) -> Option<String> {
    // Permanent entries (every pair of a small segment, the hub of a big
    // one) are not counted against the table's limit.
    let need = addressing.neighbour_entries_dynamic();
    let (have, whose) = match limits::current(limits::NEIGH_THRESH[2]) {
        Some(v) => (v, ""),
        // Not visible in this namespace: most likely the kernel's default.
        None => (
            limits::KERNEL_DEFAULTS[2],
            " (the kernel's default; this namespace cannot see or raise it)",
        ),
    };
    (need > have).then(|| {
        format!(
            "all-pairs traffic in this lab needs up to {need} neighbour (ARP) entries, but the kernel's \
             neighbour table, shared by every namespace, holds {have}{whose} (net.ipv4.neigh.default.gc_thresh3); \
             beyond that sends fail"
        )
    })
}

/// What building and entering a lab takes: `CAP_NET_ADMIN` (links,
/// addresses, qdiscs, sysctls) and `CAP_SYS_ADMIN` (`ip netns add` mounts,
/// `setns` enters).
pub const NEEDED_CAPS: [oskit::caps::Cap; 2] = [oskit::caps::Cap::NetAdmin, oskit::caps::Cap::SysAdmin];

/// The capabilities of [`NEEDED_CAPS`] that `have` lacks.
pub fn missing_caps(have: oskit::caps::CapSet) -> Vec<oskit::caps::Cap> {
    NEEDED_CAPS.into_iter().filter(|c| !have.has(*c)).collect()
}

/// Checks at start that this process holds the capabilities a lab needs
/// (root in the machine or in a privileged container), so that a missing
/// one is named instead of surfacing later as a bare `EPERM` of `ip`.
pub fn require_caps() -> Result<(), LabError> {
    let missing = match oskit::caps::effective() {
        Ok(have) => missing_caps(have),
        // No /proc: judge by the user id alone.
        Err(_) if nix::unistd::geteuid().is_root() => vec![],
        Err(_) => NEEDED_CAPS.to_vec(),
    };
    if missing.is_empty() {
        Ok(())
    } else {
        Err(LabError::MissingCaps {
            missing: missing.iter().map(|c| c.name()).collect::<Vec<_>>().join(" and "),
        })
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
    /// Log progress and choices (through `tracing`: the binary's subscriber shows them).
    pub verbose: bool,
    pub state_dir: PathBuf,
    /// Raise `net.core.netdev_max_backlog` to at least this (in-kernel
    /// fan-out queues one clone per member on the per-CPU backlog).
    pub netdev_backlog: Option<u64>,
    /// Give the lab a clock even at TDF 1, so its TDF can change later
    /// (adaptive dilation starts undilated).
    pub virtual_time: bool,
    /// Where the lab's subnets start (default 10.0.0.0): for programs that
    /// need their hosts at known addresses (see
    /// [`plan_addressing_from`](crate::addr::plan_addressing_from)).
    pub first_subnet: Option<std::net::Ipv4Addr>,
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
            netdev_backlog: None,
            virtual_time: false,
            first_subnet: None,
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
    /// The dilated run's clock record and shim, removed with the lab.
    clock: Option<(vtime::Domain, vtime::shim::InstalledShim)>,
}

impl Lab {
    /// Builds the lab. On any error everything already created is removed
    /// before the error is returned.
    pub fn up(topo: &Topology, opts: &LabOptions, stop: &AtomicBool) -> Result<Lab, LabError> {
        require_caps()?;
        topo.validate()?;
        let swept = sweep(&opts.state_dir, SweepMode::DeadOnly)?;
        if opts.verbose && !swept.removed.is_empty() {
            tracing::info!("netlab: removed leftovers of dead runs: {}", swept.removed.join(", "));
        }
        let (backend, why) = choose_delay_backend(opts.delay_backend)?;
        let needs_delay = topo.links.iter().any(|l| l.params.needs_delay_stage());
        if opts.verbose && needs_delay {
            tracing::info!("netlab: {why}");
        }
        let (run_id, dir) = alloc_run(&opts.state_dir)?;
        let naming = Naming::new(&run_id);
        let plan_opts = PlanOptions {
            delay_backend: backend,
            dilation: opts.dilation,
            ecmp_seed: opts.ecmp_seed,
            first_subnet: opts.first_subnet.unwrap_or(crate::addr::DEFAULT_FIRST_SUBNET),
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
            clock: None,
            shaped: plan.shaped.clone(),
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
            clock: None,
        };
        if opts.dilation.dilated() || opts.virtual_time {
            // One record per lab: every host shares one virtual epoch.
            // On error `lab` is dropped, which removes what was made.
            let tdf = opts.dilation.tdf;
            let dir = vtime::default_dir();
            let name = format!("netlab-{run_id}");
            // Managed: a bare `vtime set` would change the clock without
            // the links' rates, so it refuses and points to `netlab tdf`.
            let domain = vtime::Domain::create_managed(&dir, &name, tdf)?;
            let shim = vtime::shim::InstalledShim::install_in(&lab.dir)?;
            lab.state.clock = Some(ClockInfo {
                domain: name,
                dir,
                shim: shim.path().to_path_buf(),
            });
            lab.clock = Some((domain, shim));
            write_state(&lab.dir, &lab.state)?;
            if opts.verbose {
                tracing::info!(
                    "netlab: virtual time: every process in the lab runs under the vtime shim at TDF {} \
                     (clock domain {}; `netlab tdf` changes it with the links' rates)",
                    opts.dilation.tdf,
                    lab.state.clock.as_ref().map_or("", |c| c.domain.as_str())
                );
            }
        }
        let needs = limits::Needs {
            // What all-pairs traffic makes the kernel resolve: the plan's
            // permanent entries do not count.
            neighbour_entries: lab.plan.addressing.neighbour_entries_dynamic(),
            // What was asked for, and room for a big segment's ARP floods.
            netdev_backlog: opts.netdev_backlog.max(lab.plan.addressing.flood_backlog()),
        };
        // On error `lab` is dropped here, which removes it (and restores
        // what was raised once no lab is left).
        let raised = limits::raise(&opts.state_dir, &needs)?;
        for change in &raised.changes {
            if opts.verbose {
                tracing::info!("netlab: raised a machine-wide limit this lab needs (restored when the last lab is removed): {change}");
            }
        }
        if let Some(note) = raised.note() {
            if opts.verbose {
                tracing::warn!("netlab: note: {note}");
            }
        }
        let t0 = Instant::now();
        let mut last = Instant::now();
        let verbose = opts.verbose;
        // A line every few seconds on a long build, and one at the end: the
        // caller's subscriber decides where (and whether) it shows.
        let mut progress = |done: usize, total: usize| {
            if verbose && (last.elapsed() > Duration::from_secs(2) || done == total) {
                last = Instant::now();
                tracing::info!("netlab: building {}: {done}/{total} operations", lab_label(&run_id));
            }
        };
        let clock = lab.state.clock.clone();
        let mut ctx = ApplyCtx {
            mode: opts.apply_mode,
            exe: &opts.exe,
            log_dir: &lab.dir,
            stop,
            progress: &mut progress,
            clock: clock
                .as_ref()
                .map(|c| (c.dir.as_path(), c.domain.as_str(), opts.dilation.tdf)),
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
        if self.clock.is_some() {
            return Err(LabError::DetachedClock);
        }
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
        // The processes that read the record are gone with the namespaces.
        self.clock = None;
        r
    }

    /// Changes the lab's time dilation factor while it runs: every link's
    /// HTB rate becomes rate/TDF, then the lab's clock runs TDF times slower
    /// (see [`set_tdf`]).
    pub fn set_tdf(&mut self, tdf: vtime::Tdf) -> Result<Vec<String>, LabError> {
        let lines = set_tdf(&self.state, tdf)?;
        self.state.tdf = tdf;
        write_state(&self.dir, &self.state)?;
        Ok(lines)
    }

    /// The door into this lab's hosts.
    pub fn launcher(&self) -> Launcher {
        Launcher::for_run(&self.state)
    }

    /// What was built, for the user: run id, size, build time, hosts.
    pub fn summary(&self) -> String {
        let lab = self;
        let s = &lab.state;
        let mut out = format!(
            "netlab: run {} up: {} ({} namespaces, {} ops, built in {:.2}s)\n",
            s.run_id,
            s.topology,
            s.namespaces.len(),
            lab.plan.ops.len(),
            lab.build_time.as_secs_f64()
        );
        for h in s.hosts.iter().filter(|h| h.kind == NodeKind::Host).take(20) {
            out.push_str(&format!(
                "  {:<8} {}\n",
                h.name,
                h.addr.map(|a| a.to_string()).unwrap_or_default()
            ));
        }
        if s.hosts.len() > 20 {
            out.push_str(&format!(
                "  ... ({} hosts and routers in all; `netlab list` shows them)\n",
                s.hosts.len()
            ));
        }
        out
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
            tracing::error!(
                "netlab: removing run {} failed: {e}; run `netlab clean`",
                self.state.run_id
            );
        }
    }
}

/// Changes a running, dilated lab's TDF (from any process: the state names
/// the clock and the shaped devices). Links are re-rated first when time
/// slows down (so no link runs too fast for a moment) and last when it speeds
/// up. Delay-line and netem delays keep the factor they were built with.
/// Returns a line per change.
pub fn set_tdf(state: &RunState, tdf: vtime::Tdf) -> Result<Vec<String>, LabError> {
    let Some(clock) = &state.clock else {
        return Err(LabError::io(
            format!("change the TDF of run {}", state.run_id),
            std::io::Error::other("the lab was built without a clock (TDF 1): build it with --tdf 2 or more"),
        ));
    };
    crate::plan::check_tdf("the new TDF", tdf)?;
    let new = tdf;
    let d = crate::plan::Dilation { tdf };
    let rerate = |lines: &mut Vec<String>| -> Result<(), LabError> {
        let mut ops: Vec<_> = state
            .shaped
            .iter()
            .map(|s| crate::plan::htb_rate_change(s, d))
            .collect();
        // Same namespace next to each other: one `tc -batch` per namespace.
        ops.sort_by_key(|op| match op {
            crate::plan::Op::Cmd { ns, .. } => ns.clone(),
            _ => None,
        });
        crate::apply::run_ops_batched(&ops)?;
        for s in &state.shaped {
            lines.push(format!("{}:{} rate {}bit", s.ns, s.dev, d.rate(s.bw_bps)));
        }
        Ok(())
    };
    let mut lines = vec![];
    let slower = tdf > state.tdf;
    if slower {
        rerate(&mut lines)?;
    }
    vtime::Domain::open(&clock.dir, &clock.domain)?.set_tdf(new)?;
    lines.push(format!("clock {}: TDF {tdf}", clock.domain));
    if !slower {
        rerate(&mut lines)?;
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;
    use oskit::caps::{Cap, CapSet};

    #[test]
    fn a_missing_capability_is_named() {
        let root = CapSet(0x0000_01ff_ffff_ffff);
        assert!(missing_caps(root).is_empty());
        let net_admin_only = CapSet(1 << Cap::NetAdmin.number());
        assert_eq!(missing_caps(net_admin_only), [Cap::SysAdmin]);
        assert_eq!(missing_caps(CapSet(0)), [Cap::NetAdmin, Cap::SysAdmin]);
        let e = LabError::MissingCaps {
            missing: "CAP_SYS_ADMIN".into(),
        };
        assert_eq!(
            e.to_string(),
            "needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root or in a privileged container): this process lacks CAP_SYS_ADMIN"
        );
    }
}
