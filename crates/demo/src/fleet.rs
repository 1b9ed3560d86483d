//! The fleet scenario (`reflector-fleet-lab`): several reflectors, several
//! control servers and one Redis in a netlab star, a thousand bots spread
//! over the client hosts, and the events a fleet must survive, each on a
//! schedule: `kill -9` of a reflector, a control server stopped, Redis
//! down for a while and started again empty, a reflector drained.
//!
//! Every process starts through the lab's launcher, so under `--tdf` all of
//! them (Redis too) run on the lab's virtual clock. This process is not
//! dilated: it keeps the schedule in real time (virtual × TDF) and reports
//! in virtual seconds.
//!
//! What it measures without asking the bots: every reflector's
//! `/metrics` is polled from a client host every `--poll` (members, copies
//! fanned out), which gives the delivered rate over time and, per event, the
//! players on the reflector it hit and when the fleet held every player
//! again (members summed over the live reflectors back to where they
//! were); the control servers' `/metrics` give their 429s and the `/join`s
//! they answered and failed (so whether `/join` was answered while Redis
//! was down, whatever the bots retried). The bots' JSON
//! report gives the exact owed loss, every lost datagram with its send
//! time and every player's move windows, on the clock this program stamps
//! its events on (the lab's virtual one under a TDF): per event, the
//! affected players, the recovery time and the loss inside and outside the
//! windows (`window_stats`), judged against the event's bound (`verdict`).

use crate::error::DemoError;
use netlab::lab::{Lab, LabOptions};
use netlab::scenario::LinkSpec;
use netlab::topo::Builtin;
use oskit::child::ChildGuard;
use reflector_bots::{BotsReport, LostDatagram, MoveWindow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The group ports of every reflector (each host has its own address).
const FIRST_PORT: u16 = 4000;
const CONTROL_PORT: u16 = 8700;
const CHECKPOINT_PORT: u16 = 8701;
const METRICS_PORT: u16 = 9100;
const REDIS_PORT: u16 = 6379;
/// The ACL the fleet's Redis is deployed with; the lab runs the same file.
const FLEET_ACL: &str = include_str!("../../../deploy/redis/fleet.acl");
/// How long a control server holds its placements after Redis restarted
/// (virtual seconds): two of its registry TTLs, the registry's default 3 s
/// (`control` has no option for it).
const CONTROL_HOLD_S: f64 = 6.0;
/// The shortest and the longest `--redis-down`: below a second no poll of
/// the registry need fail and no `/join` need come while Redis is down.
const MIN_REDIS_DOWN_S: f64 = 1.0;
const MAX_REDIS_DOWN_S: f64 = 60.0;

#[derive(clap::Parser, Debug, Clone)]
#[command(
    name = "reflector-fleet-lab",
    version,
    about = "A fleet of reflectors in the lab: Redis, reflectors, control servers and bots, and the events a fleet must survive",
    after_help = "As root: builds a netlab star of the reflector hosts (r1..), the control server hosts (c1..), a Redis \
host and --clients client hosts, starts Debian's redis-server with the fleet's ACL (deploy/redis/fleet.acl), \
`reflector serve --registry` on every reflector host and `reflector control --registry` on every control server \
host, then one bots process whose sockets are spread over the client hosts. On its schedule (--events, virtual \
seconds after the bots start) it kills a reflector with SIGKILL, stops a control server, kills Redis and starts it \
again empty --redis-down later, and drains a reflector (SIGTERM with --drain-timeout), stamped on the lab's \
(virtual) clock. From the bots' move windows and lost datagrams and the /metrics of every reflector and control \
server it prints a table per event (affected players, recovery, owed loss inside and outside the move windows, \
429s, /join answered and failed, pass/fail against the event's bound) and the bots' exact loss, writes a CSV per \
event and one of the delivered rate over time, and removes the lab.\n\n\
What an event must show: kill, every affected player playing again within 3 keepalive intervals (detection) + 2 \
(the client's re-placement rule) + 2 s; control, no player affected; redis, no loss, /join answered by the \
control servers while Redis was down (more than 0: the bots move every --move-every, so they ask all along) and \
no /join failure from the kill until the hold after the restart ended (2 registry TTLs, 6 s); drain, no loss \
outside the move windows and each window at most 0.5 s.\n\n\
Exit status: 0 every event passed and no loss outside the move windows (before the first event too), 1 \
otherwise, 2 errors, 130 interrupted.\n\n\
Examples (the second runs the 1,000 players of bench/fleet.sh, 29 minutes of wall time on 2 cores):\n  \
sudo reflector-fleet-lab --clients 10 --bots 100 --duration 40s --events kill=10,control=18,redis=21,drain=32\n  \
sudo reflector-fleet-lab --tdf 16 --out bench/results"
)]
pub struct FleetArgs {
    /// Reflector hosts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(2..=16))]
    pub reflectors: u64,
    /// Control server hosts.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub controls: u64,
    /// Client hosts (the bots' sockets are spread over them).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=200))]
    pub clients: u64,
    /// Bots (players) in all, in one process.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(2..=5000))]
    pub bots: u64,
    /// Group ports per reflector.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub groups: u64,
    /// World grid COLSxROWS the control servers place over the fleet.
    #[arg(long, default_value = "10x10")]
    pub grid: String,
    /// How long the bots play, in virtual time (e.g. 100s).
    #[arg(long, value_name = "DURATION", default_value = "100s", value_parser = seconds)]
    pub duration: f64,
    /// The events, NAME=SECONDS after the bots start (virtual), comma separated. NAME: kill (SIGKILL the
    /// reflector with the most members), control (stop the first control server), redis (SIGKILL Redis,
    /// start it again empty --redis-down later), drain (SIGTERM the reflector with the most members; it
    /// drains).
    #[arg(long, default_value = "kill=20,control=40,redis=60,drain=80")]
    pub events: String,
    /// How long the redis event keeps Redis down before starting it again (virtual, 1s to 60s):
    /// long enough that the registry's polls (every second) fail and the bots ask /join meanwhile,
    /// so that "/join answered while Redis is down" is checked, not only the restart.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = seconds)]
    pub redis_down: f64,
    /// DATA per second per bot.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Datagram size in bytes, header included.
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Time between bot moves (0 = never).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = seconds)]
    pub move_every: f64,
    /// The registry's TTL for reflector entries (detection of a dead reflector).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = seconds)]
    pub registry_ttl: f64,
    /// The reflectors' --member-timeout: their keepalive interval is a
    /// quarter of it, and a client takes a reflector for dead after three
    /// silent intervals (4s: detection within 3 s).
    #[arg(long, value_name = "DURATION", default_value = "4s", value_parser = seconds)]
    pub member_timeout: f64,
    /// How long a drained reflector waits for its members to leave.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = seconds)]
    pub drain_timeout: f64,
    /// Time dilation factor: every process in the lab sees time pass TDF times slower.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub tdf: u32,
    /// Every lab link's rate (e.g. 1gbit, 100mbit). A gigabit by default: 1,000 bots at 10 Hz in groups of
    /// about 20 make about 200,000 copies per (virtual) second, about 75 Mbit/s from each of 3 reflectors
    /// and 115 from each of the 2 left after a kill, more than Fast Ethernet carries. The run prints each
    /// reflector's peak load against it.
    #[arg(long, value_name = "RATE", default_value = "1gbit", value_parser = link_rate)]
    pub bw: u64,
    /// How often the reflectors' /metrics are read (real time).
    #[arg(long, value_name = "DURATION", default_value = "200ms", value_parser = seconds)]
    pub poll: f64,
    /// Seed for the bots.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write fleet.csv (one row per event) and fleet_rate.csv (the rate over time) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Keep every process's log (stderr) in this directory (default: removed with the run).
    #[arg(long, value_name = "DIR")]
    pub logs: Option<PathBuf>,
    /// The reflector binary (default: `reflector` next to this program).
    #[arg(long)]
    pub reflector_bin: Option<PathBuf>,
    /// The netlab binary (default: `netlab` next to this program).
    #[arg(long)]
    pub netlab_bin: Option<PathBuf>,
    /// Redis' server binary.
    #[arg(long, default_value = "redis-server")]
    pub redis_bin: PathBuf,
}

/// A link rate in bits per second, as netlab reads it (refused: zero).
fn link_rate(s: &str) -> Result<u64, String> {
    match netlab::units::parse_rate("--bw", s) {
        Ok(0) => Err("a link rate must be above zero".into()),
        Ok(bps) => Ok(bps),
        Err(e) => Err(e.to_string()),
    }
}

/// A duration with its unit, or bare seconds, as seconds.
fn seconds(s: &str) -> Result<f64, String> {
    oskit::units::secs_or_duration(s).map(|d| d.as_secs_f64())
}

/// What an event does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventKind {
    /// SIGKILL the reflector with the most members.
    Kill,
    /// SIGTERM the first control server.
    Control,
    /// SIGKILL Redis and start it again, empty, `--redis-down` later.
    Redis,
    /// SIGTERM the reflector with the most members: it drains.
    Drain,
}

impl EventKind {
    fn parse(s: &str) -> Result<EventKind, String> {
        Ok(match s {
            "kill" => EventKind::Kill,
            "control" => EventKind::Control,
            "redis" => EventKind::Redis,
            "drain" => EventKind::Drain,
            other => return Err(format!("unknown event '{other}' (kill, control, redis, drain)")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            EventKind::Kill => "kill -9 reflector",
            EventKind::Control => "stop control server",
            EventKind::Redis => "restart redis",
            EventKind::Drain => "drain reflector",
        }
    }
}

/// `kill=20,control=40` → the events in time order, checked against the
/// run's length.
pub fn parse_events(spec: &str, duration: f64) -> Result<Vec<(EventKind, f64)>, String> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, at) = part
            .split_once('=')
            .ok_or_else(|| format!("--events: '{part}' is not NAME=SECONDS"))?;
        let kind = EventKind::parse(name.trim()).map_err(|e| format!("--events: {e}"))?;
        let at = seconds(at.trim()).map_err(|e| format!("--events: {name}: {e}"))?;
        if at <= 0.0 || at >= duration {
            return Err(format!(
                "--events: {name} at {at} s is outside the run (0 to --duration {duration} s, exclusive)"
            ));
        }
        out.push((kind, at));
    }
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    if out.len() > 64 {
        return Err("--events: at most 64 events".into());
    }
    Ok(out)
}

/// Every redis event's outage (`down` virtual seconds) ends before the run
/// does and before the next redis event, and no kill or drain falls in an
/// outage or the control servers' hold after it (one poll to notice the
/// restart, then [`CONTROL_HOLD_S`]): no cell moves then, so such an event
/// could not meet its bound.
pub fn check_redis_outages(events: &[(EventKind, f64)], down: f64, duration: f64) -> Result<(), String> {
    if !(down.is_finite() && (MIN_REDIS_DOWN_S..=MAX_REDIS_DOWN_S).contains(&down)) {
        return Err(format!(
            "--redis-down must be from {MIN_REDIS_DOWN_S} to {MAX_REDIS_DOWN_S} s (shorter, no /join need come \
             while Redis is down), got {down}"
        ));
    }
    let mut back: Option<f64> = None;
    for &(_, at) in events.iter().filter(|(k, _)| *k == EventKind::Redis) {
        if let Some(b) = back.filter(|&b| at < b) {
            return Err(format!(
                "--events: redis at {at} s while Redis is still down (back at {b} s, --redis-down {down} s)"
            ));
        }
        if at + down >= duration {
            return Err(format!(
                "--events: redis at {at} s and --redis-down {down} s: Redis would be down until the run ends \
                 (--duration {duration} s)"
            ));
        }
        back = Some(at + down);
        let settled = at + down + 1.0 + CONTROL_HOLD_S;
        if let Some(&(kind, t)) = events
            .iter()
            .find(|&&(k, t)| matches!(k, EventKind::Kill | EventKind::Drain) && (at..settled).contains(&t))
        {
            return Err(format!(
                "--events: {} at {t} s falls while Redis is down or the control servers hold every placement \
                 after it ({at} s to {settled} s: --redis-down {down} s, a poll, {CONTROL_HOLD_S} s): no cell moves \
                 then, so it could not meet its bound; schedule it from {settled} s",
                kind.name()
            ));
        }
    }
    Ok(())
}

/// One sample of one reflector's metrics.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    members: u64,
    fanned_out: u64,
}

/// `name value` lines of a Prometheus text exposition, for the two
/// families read here (no labels on the aggregates).
fn parse_metrics(text: &str) -> Option<Sample> {
    let mut members = None;
    let mut fanned_out = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let v = value.parse::<f64>().ok().map(|f| f as u64);
        match name {
            "reflector_members" => members = v,
            "reflector_fanned_out_total" => fanned_out = v,
            _ => {}
        }
    }
    Some(Sample {
        members: members?,
        fanned_out: fanned_out?,
    })
}

/// The metrics timeline: per poll, the real time since the bots started
/// and each reflector's sample (absent when it did not answer).
#[derive(Default)]
struct Timeline {
    rows: Vec<(f64, Vec<Option<Sample>>)>,
    /// Per poll of the control servers: the real times it started and
    /// ended, and each one's counters so far (absent when it did not
    /// answer).
    controls: Vec<ControlPoll>,
}

/// One poll of every control server's `/metrics`.
#[derive(Clone, Debug, Default)]
struct ControlPoll {
    start: f64,
    end: f64,
    servers: Vec<Option<ControlSample>>,
}

/// A control server's counters, read from its `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct ControlSample {
    /// 429s (`reflector_control_join_rate_limited_total`).
    rate_limited: u64,
    /// `/join`s answered with a grant (`reflector_control_joins_answered_total`).
    joins_answered: u64,
    /// `/join`s that got no grant, every cause
    /// (`reflector_control_join_failures_total{cause}` summed).
    join_failures: u64,
}

/// The counters of a control server's `/metrics` (text format); `None`
/// without any of them.
fn parse_control_metrics(text: &str) -> Option<ControlSample> {
    let (mut rate_limited, mut answered, mut failures) = (None, None, None);
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Some(v) = v.parse::<f64>().ok().map(|f| f as u64) else {
            continue;
        };
        let family = name.split_once('{').map_or(name, |(f, _)| f);
        match family {
            "reflector_control_join_rate_limited_total" => rate_limited = Some(v),
            "reflector_control_joins_answered_total" => answered = Some(v),
            "reflector_control_join_failures_total" => failures = Some(failures.unwrap_or(0) + v),
            _ => {}
        }
    }
    Some(ControlSample {
        rate_limited: rate_limited?,
        joins_answered: answered?,
        join_failures: failures?,
    })
}

/// One event's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct EventRow {
    pub event: &'static str,
    /// Which process it hit.
    pub target: String,
    /// Virtual seconds after the bots started.
    pub at_s: f64,
    /// Players with a move window that opened between this event and the
    /// next (the bots' own record).
    pub affected_players: u64,
    /// The longest of those windows, virtual seconds (from the failure for
    /// a kill, from the MOVED or the silence otherwise); none if one never
    /// ended.
    pub recovery_s: Option<f64>,
    /// Owed DATA sent between this event and the next and lost, inside a
    /// move window of its sender or receiver, and outside every window.
    pub lost_in_windows: u64,
    pub lost_outside_windows: u64,
    /// 429 answers of the control servers between this event and the next.
    pub rate_limited: u64,
    /// `/join`s the control servers answered with a grant: between this
    /// event and the next; for a Redis restart, while Redis was down (from
    /// the first poll after the kill to the last before the restart).
    pub joins_answered: u64,
    /// `/join`s the control servers failed (503, 400): between this event
    /// and the next; for a Redis restart, from the kill until the hold
    /// after the restart (2 registry TTLs) ended.
    pub join_failures: u64,
    /// Virtual seconds Redis was down (a Redis restart).
    pub redis_down_s: Option<f64>,
    /// The event's bound on `recovery_s` (kill and drain).
    pub threshold_s: Option<f64>,
    /// Whether the event met what it must show (see `verdict`).
    pub pass: bool,
    /// Players on the reflector it hit (kill, drain), from its last sample.
    pub players_on_target: u64,
    /// Members over every reflector just before the event.
    pub members_before: u64,
    /// Virtual seconds from the event until members summed over the live
    /// reflectors were back to `members_before` (none: never in the run).
    pub members_back_s: Option<f64>,
    /// The lowest member count seen after the event, before recovery.
    pub members_low: u64,
}

/// Runs the scenario; returns the exit status.
pub fn run(args: FleetArgs, stop: &AtomicBool) -> Result<i32, DemoError> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the fleet lab needs root (network namespaces): run with sudo".into());
    }
    if !(args.duration.is_finite() && (5.0..=3600.0).contains(&args.duration)) {
        return Err(format!("--duration must be between 5 and 3600 seconds, got {}", args.duration).into());
    }
    reflector_control::parse_grid(&args.grid).map_err(|e| format!("--grid: {e}"))?;
    let events = parse_events(&args.events, args.duration)?;
    check_redis_outages(&events, args.redis_down, args.duration)?;
    let reflector_bin = crate::sibling(&args.reflector_bin, "reflector", "--reflector-bin")?;
    let netlab_bin = crate::sibling(&args.netlab_bin, "netlab", "--netlab-bin")?;
    let redis_bin = which(&args.redis_bin).ok_or_else(|| {
        format!(
            "--redis-bin {}: not found (Debian's redis-server package; `make deps` installs it)",
            args.redis_bin.display()
        )
    })?;

    let n_refl = args.reflectors as usize;
    let n_ctl = args.controls as usize;
    let n_cli = args.clients as usize;
    // Hosts of the star in order: reflectors, control servers, Redis, clients.
    let hosts = n_refl + n_ctl + 1 + n_cli;
    let host = |i: usize| format!("h{}", i + 1);
    let refl_hosts: Vec<String> = (0..n_refl).map(host).collect();
    let ctl_hosts: Vec<String> = (n_refl..n_refl + n_ctl).map(host).collect();
    let redis_host = host(n_refl + n_ctl);
    let client_hosts: Vec<String> = (n_refl + n_ctl + 1..hosts).map(host).collect();

    let spec = LinkSpec {
        bw: Some(args.bw.to_string()),
        ..Default::default()
    };
    let link = spec.apply_to("link", &Default::default())?;
    let mut topo = Builtin::Star { hosts }.build(&link);
    topo.name = format!("fleet ({n_refl} reflectors, {n_ctl} control servers, {n_cli} client hosts)");
    let mut o = LabOptions::new(&netlab_bin);
    o.scenario = "fleet".into();
    o.verbose = true;
    o.dilation.tdf = netlab::plan::Tdf::new(u64::from(args.tdf), 1).map_err(|e| format!("--tdf {}: {e}", args.tdf))?;
    let started = Instant::now();
    let lab = Lab::up(&topo, &o, stop)?;
    eprintln!("fleet: lab up in {:.1} s", started.elapsed().as_secs_f64());
    let outcome = run_in(
        &args,
        &events,
        &lab,
        &reflector_bin,
        &redis_bin,
        &refl_hosts,
        &ctl_hosts,
        &redis_host,
        &client_hosts,
        stop,
    );
    let t = lab.down()?;
    eprintln!("fleet: lab removed in {:.2}s", t.as_secs_f64());
    outcome
}

/// `name` on PATH, or the path given.
fn which(given: &Path) -> Option<PathBuf> {
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
struct Proc {
    name: String,
    guard: Option<ChildGuard>,
}

impl Proc {
    fn alive(&mut self) -> bool {
        match &mut self.guard {
            Some(g) => matches!(g.child().try_wait(), Ok(None)),
            None => false,
        }
    }

    fn signal(&mut self, sig: nix::sys::signal::Signal) -> Result<(), DemoError> {
        let g = self
            .guard
            .as_mut()
            .ok_or_else(|| format!("{} is not running", self.name))?;
        let pid = nix::unistd::Pid::from_raw(g.id() as i32);
        nix::sys::signal::kill(pid, sig).map_err(|e| format!("cannot signal {}: {e}", self.name))?;
        Ok(())
    }
}

fn spawn(name: &str, mut c: Command, log: &Path) -> Result<Proc, DemoError> {
    let f = std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(f);
    let child = c.spawn().map_err(|e| format!("cannot start {name}: {e}"))?;
    Ok(Proc {
        name: name.into(),
        guard: Some(ChildGuard::new(child)),
    })
}

fn addr_of(lab: &Lab, host: &str) -> Result<Ipv4Addr, DemoError> {
    Ok(lab
        .state
        .host(host)?
        .addr
        .ok_or_else(|| format!("lab host {host} has no address"))?)
}

/// Waits until `ok`, `secs` real seconds at most.
fn wait_for(what: &str, secs: f64, stop: &AtomicBool, mut ok: impl FnMut() -> bool) -> Result<(), DemoError> {
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

#[allow(clippy::too_many_arguments)]
fn run_in(
    args: &FleetArgs,
    events: &[(EventKind, f64)],
    lab: &Lab,
    reflector_bin: &Path,
    redis_bin: &Path,
    refl_hosts: &[String],
    ctl_hosts: &[String],
    redis_host: &str,
    client_hosts: &[String],
    stop: &AtomicBool,
) -> Result<i32, DemoError> {
    let tdf = f64::from(args.tdf);
    let dir = crate::scenario::TempDir::new()?;
    let d = &dir.0;
    // The logs are copied out on every way out of the run, errors included.
    let _keep = KeepLogs {
        from: d.clone(),
        to: args.logs.clone(),
    };
    let launcher = lab.launcher();
    let write = |name: &str, text: &str| -> Result<PathBuf, DemoError> {
        let p = d.join(name);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        Ok(p)
    };
    let random_hex = || -> Result<String, DemoError> {
        let mut k = [0u8; 32];
        getrandom::getrandom(&mut k).map_err(|e| format!("no random source: {e}"))?;
        Ok(hex::encode(k))
    };
    let secret = write("secret", &random_hex()?)?;
    let ticket_keys = write(
        "tickets.toml",
        &format!(
            "[[key]]\nkid = \"fleet\"\nalg = \"HS256\"\nsecret_hex = \"{}\"\n",
            random_hex()?
        ),
    )?;
    let password = random_hex()?;
    let password_file = write("redis-password", &password)?;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(password.as_bytes());
    let acl = write("fleet.acl", &FLEET_ACL.replace("PASSWORD_SHA256", &hex::encode(digest)))?;

    let redis_addr = addr_of(lab, redis_host)?;
    let redis_cmd = || -> Result<Command, DemoError> {
        let mut c = launcher.command(redis_host, &[redis_bin.as_os_str()])?;
        c.args(["--bind", &redis_addr.to_string(), "--port", &REDIS_PORT.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ])
            .arg("--aclfile")
            .arg(&acl)
            .arg("--dir")
            .arg(d);
        Ok(c)
    };
    let mut redis = spawn("redis", redis_cmd()?, &d.join("redis.log"))?;
    let redis_up =
        || std::net::TcpStream::connect_timeout(&(redis_addr, REDIS_PORT).into(), Duration::from_millis(200)).is_ok();
    let probe_ns = oskit::netns::NetNs::open(lab.ns_of(&client_hosts[0])?)
        .map_err(|e| format!("cannot open a client host's namespace: {e}"))?;
    wait_for("Redis", 10.0 * tdf, stop, || probe_ns.run(redis_up).unwrap_or(false))?;
    let registry = vec![
        "--registry".to_string(),
        format!("redis://fleet@{redis_addr}:{REDIS_PORT}"),
        "--registry-password-file".into(),
        password_file.to_string_lossy().into_owned(),
    ];
    let ports = format!("{FIRST_PORT}-{}", FIRST_PORT as u64 + args.groups - 1);

    let mut reflectors = Vec::new();
    let mut refl_addrs = Vec::new();
    for h in refl_hosts {
        let a = addr_of(lab, h)?;
        let mut c = launcher.command(h, &[reflector_bin.as_os_str()])?;
        c.arg("serve")
            .args([
                "--bind",
                &a.to_string(),
                "--advertise",
                &a.to_string(),
                "--ports",
                &ports,
            ])
            .arg("--secret-file")
            .arg(&secret)
            .args(&registry)
            .args(["--registry-ttl", &format!("{}ms", (args.registry_ttl * 1000.0) as u64)])
            .args([
                "--member-timeout",
                &format!("{}ms", (args.member_timeout * 1000.0) as u64),
            ])
            .args([
                "--drain-timeout",
                &format!("{}ms", (args.drain_timeout * 1000.0) as u64),
            ])
            .args(["--checkpoint-port", &CHECKPOINT_PORT.to_string()])
            .args(["--metrics", &format!("{a}:{METRICS_PORT}")])
            .env("RUST_LOG", "warn");
        reflectors.push(spawn(
            &format!("reflector on {h}"),
            c,
            &d.join(format!("reflector-{h}.log")),
        )?);
        refl_addrs.push(a);
    }
    let mut controls = Vec::new();
    let mut control_urls = Vec::new();
    for h in ctl_hosts {
        let a = addr_of(lab, h)?;
        let mut c = launcher.command(h, &[reflector_bin.as_os_str()])?;
        c.arg("control")
            .args([
                "--listen",
                &format!("{a}:{CONTROL_PORT}"),
                "--grid",
                &args.grid,
                "--insecure-http",
            ])
            .arg("--secret-file")
            .arg(&secret)
            .arg("--ticket-keys")
            .arg(&ticket_keys)
            .args(&registry)
            // Every bot of a client host asks from its address.
            .args(["--ticket-rate-ip", "100000"])
            .env("RUST_LOG", "warn");
        controls.push(spawn(
            &format!("control server on {h}"),
            c,
            &d.join(format!("control-{h}.log")),
        )?);
        control_urls.push(format!("http://{a}:{CONTROL_PORT}"));
    }
    for (i, a) in refl_addrs.iter().enumerate() {
        let url = format!("http://{a}:{METRICS_PORT}/metrics");
        wait_for(&format!("the reflector on {}", refl_hosts[i]), 20.0 * tdf, stop, || {
            probe_ns.run(|| get(&url).is_ok()).unwrap_or(false)
        })?;
    }
    for (i, u) in control_urls.iter().enumerate() {
        let url = format!("{u}/healthz");
        wait_for(
            &format!("the control server on {}", ctl_hosts[i]),
            20.0 * tdf,
            stop,
            || probe_ns.run(|| get(&url).is_ok()).unwrap_or(false),
        )?;
    }
    // The control servers place the whole grid once they see live reflectors.
    std::thread::sleep(Duration::from_secs_f64(2.0 * args.registry_ttl * tdf));

    // The metrics poller, from a client host.
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let polling = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let poller = {
        let timeline = timeline.clone();
        let polling = polling.clone();
        let urls: Vec<String> = refl_addrs
            .iter()
            .map(|a| format!("http://{a}:{METRICS_PORT}/metrics"))
            .collect();
        let ctl_metrics: Vec<String> = control_urls.iter().map(|u| format!("{u}/metrics")).collect();
        let every = Duration::from_secs_f64(args.poll.max(0.05));
        let ns = oskit::netns::NetNs::open(lab.ns_of(&client_hosts[0])?)
            .map_err(|e| format!("cannot open a client host's namespace: {e}"))?;
        ns.spawn::<(), oskit::SysError>(move || {
            while polling.load(Relaxed) {
                let at = t0.elapsed().as_secs_f64();
                let row: Vec<Option<Sample>> = urls
                    .iter()
                    .map(|u| get(u).ok().and_then(|t| parse_metrics(&t)))
                    .collect();
                let start = t0.elapsed().as_secs_f64();
                let servers: Vec<Option<ControlSample>> = ctl_metrics
                    .iter()
                    .map(|u| get(u).ok().and_then(|t| parse_control_metrics(&t)))
                    .collect();
                let end = t0.elapsed().as_secs_f64();
                if let Ok(mut tl) = timeline.lock() {
                    tl.rows.push((at, row));
                    tl.controls.push(ControlPoll { start, end, servers });
                }
                std::thread::sleep(every);
            }
        })
    };

    let bots_netns: Vec<String> = client_hosts
        .iter()
        .map(|h| lab.ns_of(h).map(String::from))
        .collect::<Result<_, _>>()?;
    let mut bots = launcher.command(&client_hosts[0], &[reflector_bin.as_os_str()])?;
    bots.arg("bots")
        .arg("--netns")
        .arg(bots_netns.join(","))
        .arg("--ticket-keys")
        .arg(&ticket_keys)
        .args(["--control", &control_urls.join(",")])
        .args(["--count", &args.bots.to_string()])
        .args(["--duration", &format!("{}ms", (args.duration * 1000.0) as u64)])
        .args(["--rate", &args.rate.to_string(), "--size", &args.size.to_string()])
        .args(["--move-every", &format!("{}ms", (args.move_every * 1000.0) as u64)])
        .args([
            "--bind",
            "0.0.0.0",
            "--seed",
            &args.seed.to_string(),
            "--json",
            "--quiet",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("bots.log")).map_err(|e| format!("cannot create the bots' log: {e}"))?);
    let mut child = bots.spawn().map_err(|e| format!("cannot start the bots: {e}"))?;
    let mut out = child.stdout.take().ok_or("the bots child has no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let mut bots = ChildGuard::new(child);
    eprintln!(
        "fleet: {} bots over {} client hosts, {} s (virtual{}), {} Hz x {} B; events: {}",
        args.bots,
        client_hosts.len(),
        args.duration,
        if args.tdf > 1 {
            format!(", TDF {}", args.tdf)
        } else {
            String::new()
        },
        args.rate,
        args.size,
        events
            .iter()
            .map(|(k, at)| format!("{} at {at} s", k.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The events are stamped on the clock the bots' move windows are on:
    // the lab's virtual CLOCK_REALTIME under a TDF (its clock domain),
    // the real one otherwise.
    let clock = match &lab.state.clock {
        Some(c) => Some(
            vtime::Domain::open(&c.dir, &c.domain)
                .map_err(|e| format!("cannot open the lab's clock domain {}: {e}", c.domain))?,
        ),
        None => None,
    };
    let lab_now_ns = || -> u64 {
        match &clock {
            Some(d) => u64::try_from(d.virtual_now(vtime::ClockBase::Realtime)).unwrap_or(0),
            None => oskit::clock::realtime_ns(),
        }
    };
    // The schedule, in real time.
    let mut done: Vec<Done> = Vec::new();
    // Redis down: the index of its event in `done`, and when (real) to
    // start it again.
    let mut redis_back: Option<(usize, f64)> = None;
    let mut redis_starts = 1;
    let end = Duration::from_secs_f64(args.duration * tdf + 60.0 * tdf);
    let mut next = 0;
    loop {
        if stop.load(Relaxed) {
            return Err("interrupted".into());
        }
        if let Ok(Some(_)) = bots.child().try_wait() {
            break;
        }
        if t0.elapsed() > end {
            return Err("the bots ran far past their duration; stopped".into());
        }
        if let Some(&(kind, at)) = events.get(next) {
            if t0.elapsed().as_secs_f64() >= at * tdf {
                next += 1;
                let real_at = t0.elapsed().as_secs_f64();
                let at_ns = lab_now_ns();
                let (target, refl) = match kind {
                    EventKind::Kill | EventKind::Drain => {
                        let i = busiest(&timeline, &mut reflectors).ok_or("no live reflector left to hit")?;
                        let sig = if kind == EventKind::Kill {
                            nix::sys::signal::Signal::SIGKILL
                        } else {
                            nix::sys::signal::Signal::SIGTERM
                        };
                        reflectors[i].signal(sig)?;
                        (refl_hosts[i].clone(), Some(i))
                    }
                    EventKind::Control => {
                        let i = controls
                            .iter_mut()
                            .position(|c| c.alive())
                            .ok_or("no live control server left to stop")?;
                        let c = &mut controls[i];
                        c.signal(nix::sys::signal::Signal::SIGTERM)?;
                        (c.name.clone(), None)
                    }
                    EventKind::Redis => {
                        redis.signal(nix::sys::signal::Signal::SIGKILL)?;
                        if let Some(mut g) = redis.guard.take() {
                            let _ = g.child().wait();
                        }
                        redis_back = Some((done.len(), real_at + args.redis_down * tdf));
                        ("redis".into(), None)
                    }
                };
                eprintln!("fleet: {} ({target}) at {:.1} s", kind.name(), real_at / tdf);
                done.push(Done {
                    kind,
                    at,
                    real_at,
                    target,
                    refl,
                    at_ns,
                    back_real: None,
                });
            }
        }
        if let Some((k, when)) = redis_back {
            let now = t0.elapsed().as_secs_f64();
            if now >= when {
                redis_starts += 1;
                redis = spawn("redis", redis_cmd()?, &d.join(format!("redis-{redis_starts}.log")))?;
                done[k].back_real = Some(now);
                redis_back = None;
                eprintln!(
                    "fleet: redis started again at {:.1} s, down {:.1} s",
                    now / tdf,
                    (now - done[k].real_at) / tdf
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(bots);
    let text = reader.join().unwrap_or_default();
    // Kept with the logs (--logs): every bot's figures.
    let _ = std::fs::write(d.join("bots-report.json"), &text);
    polling.store(false, Relaxed);
    let _ = poller.join();
    let report: BotsReport = serde_json::from_str(&text).map_err(|e| {
        format!(
            "cannot read the bots' JSON report ({e}); their log ends:\n{}",
            tail(&d.join("bots.log"))
        )
    })?;
    let tl = timeline.lock().map_err(|_| "timeline lock poisoned")?;
    let mut rows: Vec<EventRow> = done
        .iter()
        .map(|e| analyse(&tl, e.kind, e.at, e.real_at, &e.target, e.refl, tdf))
        .collect();
    let stamps: Vec<(EventKind, u64, Option<Ipv4Addr>)> = done
        .iter()
        .map(|e| (e.kind, e.at_ns, e.refl.map(|i| refl_addrs[i])))
        .collect();
    let keepalive_s = args.member_timeout / 4.0;
    let stats = window_stats(&stamps, &report.move_windows, &report.lost_datagrams);
    let before = (stats.before.lost_in, stats.before.lost_out);
    for (i, (r, w)) in rows.iter_mut().zip(stats.events).enumerate() {
        r.affected_players = w.affected;
        r.recovery_s = w.recovery_s;
        r.lost_in_windows = w.lost_in;
        r.lost_outside_windows = w.lost_out;
        let (from, to) = (done[i].real_at, done.get(i + 1).map(|d| d.real_at));
        r.rate_limited = counted(&tl, from, to, Span::Covering, |c| c.rate_limited);
        (r.joins_answered, r.join_failures) = match (done[i].kind, done[i].back_real) {
            // While Redis was down, only what was surely answered then;
            // failures from the kill until the hold after the restart ended.
            (EventKind::Redis, back) => {
                r.redis_down_s = back.map(|b| (b - from) / tdf);
                let hold_end = back.map(|b| b + CONTROL_HOLD_S * tdf);
                (
                    counted(&tl, from, back, Span::Inside, |c| c.joins_answered),
                    counted(&tl, from, hold_end, Span::Covering, |c| c.join_failures),
                )
            }
            _ => (
                counted(&tl, from, to, Span::Covering, |c| c.joins_answered),
                counted(&tl, from, to, Span::Covering, |c| c.join_failures),
            ),
        };
        (r.threshold_s, r.pass) = verdict(done[i].kind, r, keepalive_s);
    }

    print!("{}", event_table(&rows));
    println!(
        "\nbots: sent {}, received {} of {} owed, lost {} ({} listed with their send time), errors {}",
        report.total.sent,
        report.total.received,
        report.total.expected,
        report.lost,
        report.lost_datagrams.len(),
        report.error_count
    );
    println!(
        "move windows: {} in all; times on the lab's {} clock{}",
        report.move_windows.len(),
        if args.tdf > 1 { "virtual" } else { "real" },
        if args.tdf > 1 {
            format!(" (TDF {}: every threshold is in virtual seconds)", args.tdf)
        } else {
            String::new()
        }
    );
    let loads = link_load(&tl, tdf, args.size, args.bw);
    let shown: Vec<String> = refl_hosts
        .iter()
        .zip(&loads)
        .map(|(h, l)| match l {
            Some((peak, mean)) => format!("{h} peak {:.0} %, mean {:.0} %", peak * 100.0, mean * 100.0),
            None => format!("{h} not measured"),
        })
        .collect();
    println!(
        "reflectors' egress against the {} Mbit/s links (copies x {} B on the wire per virtual s): {}",
        args.bw / 1_000_000,
        args.size + WIRE_OVERHEAD,
        shown.join("; ")
    );
    if loads.iter().flatten().any(|&(peak, _)| peak > 0.9) {
        println!("  a reflector's link was over 90 % full: its queue, not the fleet, may have lost datagrams (--bw)");
    }
    if let Some(first) = done.first() {
        println!(
            "before the first event ({:.1} s): lost {} inside move windows, {} outside",
            first.at, before.0, before.1
        );
    }
    // The split by event is only as good as the list it is made from.
    let unsplit = report.lost.saturating_sub(report.lost_datagrams.len() as u64);
    if unsplit > 0 {
        println!(
            "  {unsplit} lost datagram(s) not listed by the bots: the split above counts only the {} listed, \
             so this run cannot pass",
            report.lost_datagrams.len()
        );
    }
    for e in report.errors.iter().take(10) {
        println!("  bots error: {e}");
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        write_csvs(out, &rows, &tl, tdf, refl_hosts)?;
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    let lost_outside: u64 = before.1 + rows.iter().map(|r| r.lost_outside_windows).sum::<u64>();
    Ok(if report.error_count > 0 {
        2
    } else if failed > 0 || lost_outside > 0 || unsplit > 0 {
        1
    } else {
        0
    })
}

/// An event as it happened.
struct Done {
    kind: EventKind,
    /// Virtual seconds after the bots started, as scheduled.
    at: f64,
    /// Real seconds after the bots started.
    real_at: f64,
    target: String,
    /// The reflector it hit (kill, drain).
    refl: Option<usize>,
    /// When, on the lab's clock (ns).
    at_ns: u64,
    /// A Redis restart: real seconds after the bots started when Redis
    /// was started again (none: not within the run).
    back_real: Option<f64>,
}

/// Copies the run's `*.log` files and the bots' report to `to` when dropped.
struct KeepLogs {
    from: PathBuf,
    to: Option<PathBuf>,
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

/// The live reflector with the most members at the last sample.
fn busiest(timeline: &Mutex<Timeline>, reflectors: &mut [Proc]) -> Option<usize> {
    let last = timeline.lock().ok()?.rows.last()?.1.clone();
    (0..reflectors.len())
        .filter(|&i| reflectors[i].alive())
        .max_by_key(|&i| last.get(i).copied().flatten().map_or(0, |s| s.members))
}

fn analyse(
    tl: &Timeline,
    kind: EventKind,
    at: f64,
    real_at: f64,
    target: &str,
    refl: Option<usize>,
    tdf: f64,
) -> EventRow {
    let total = |row: &Vec<Option<Sample>>, skip: Option<usize>| -> u64 {
        row.iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != skip)
            .filter_map(|(_, s)| s.map(|s| s.members))
            .sum()
    };
    let before = tl.rows.iter().rev().find(|(t, _)| *t <= real_at);
    let members_before = before.map_or(0, |(_, r)| total(r, None));
    let affected = match (before, refl) {
        (Some((_, r)), Some(i)) => r.get(i).copied().flatten().map_or(0, |s| s.members),
        _ => 0,
    };
    let mut low = members_before;
    let mut recovery = None;
    for (t, r) in tl.rows.iter().filter(|(t, _)| *t > real_at) {
        // The reflector hit no longer counts: its members are held only once
        // they are members elsewhere.
        let m = total(r, refl);
        low = low.min(m);
        if m >= members_before {
            recovery = Some((t - real_at) / tdf);
            break;
        }
    }
    EventRow {
        event: kind.name(),
        target: target.to_string(),
        at_s: at,
        affected_players: 0,
        recovery_s: None,
        lost_in_windows: 0,
        lost_outside_windows: 0,
        rate_limited: 0,
        joins_answered: 0,
        join_failures: 0,
        redis_down_s: None,
        threshold_s: None,
        pass: false,
        players_on_target: affected,
        members_before,
        members_back_s: recovery,
        members_low: low,
    }
}

/// One event's share of the bots' move windows and lost datagrams.
#[derive(Debug, Default, PartialEq)]
struct WindowStats {
    affected: u64,
    recovery_s: Option<f64>,
    lost_in: u64,
    lost_out: u64,
}

/// Splits the bots' record by event: a window belongs to the last event
/// at or before its start, and so does a lost datagram by its send time.
/// A kill's or a drain's windows are those that left the reflector it hit
/// (whatever opened them: the silence, the MOVED, or a player's own move
/// that took it off the dead reflector first) and those that never ended;
/// the other events' are every window but the players' own moves. A kill's windows run from the kill
/// (the failure), the others from their own start. A lost datagram is
/// inside a window when its send time is within one of its sender's or
/// its receiver's (any window). A datagram lost before the first event
/// goes to `before` (the steady state must lose nothing either). Times:
/// ns on the lab's clock.
fn window_stats(events: &[(EventKind, u64, Option<Ipv4Addr>)], windows: &[MoveWindow], lost: &[LostDatagram]) -> Split {
    let period = |t: u64| events.iter().rposition(|&(_, at, _)| at <= t);
    let counts = |k: usize, w: &MoveWindow| match events[k] {
        (EventKind::Kill | EventKind::Drain, _, target) => {
            let ip = |a: &Option<String>| {
                a.as_deref()
                    .and_then(|f| f.parse::<std::net::SocketAddrV4>().ok())
                    .map(|a| *a.ip())
            };
            // Left it (a move between two of its groups did not), or never
            // ended: a player that never plays again is the event's, from
            // wherever it was (a move's JOIN to the reflector just killed).
            w.end_ns.is_none() || (target.is_some() && ip(&w.from) == target && ip(&w.to) != target)
        }
        _ => w.cause != reflector_bots::WindowCause::Cell,
    };
    let mut out: Vec<WindowStats> = events.iter().map(|_| WindowStats::default()).collect();
    let mut worst: Vec<Option<u64>> = vec![Some(0); events.len()];
    let mut players: Vec<std::collections::BTreeSet<u32>> = vec![Default::default(); events.len()];
    // Per player: its windows as [start, end] on the lab's clock.
    let mut spans: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for w in windows {
        let k = period(w.start_ns).filter(|&k| counts(k, w));
        let start = match k {
            Some(k) if events[k].0 == EventKind::Kill => events[k].1.min(w.start_ns),
            _ => w.start_ns,
        };
        spans
            .entry(w.player)
            .or_default()
            .push((start, w.end_ns.unwrap_or(u64::MAX)));
        let Some(k) = k else { continue };
        players[k].insert(w.player);
        worst[k] = match (worst[k], w.end_ns) {
            (Some(m), Some(end)) => Some(m.max(end.saturating_sub(start))),
            _ => None,
        };
    }
    for (k, o) in out.iter_mut().enumerate() {
        o.affected = players[k].len() as u64;
        o.recovery_s = if o.affected == 0 {
            Some(0.0)
        } else {
            worst[k].map(|ns| ns as f64 / 1e9)
        };
    }
    let inside = |p: u32, t: u64| spans.get(&p).is_some_and(|v| v.iter().any(|&(a, b)| a <= t && t <= b));
    let mut before = WindowStats::default();
    for l in lost {
        let share = match period(l.sent_ns) {
            Some(k) => &mut out[k],
            None => &mut before,
        };
        if inside(l.sender, l.sent_ns) || inside(l.receiver, l.sent_ns) {
            share.lost_in += 1;
        } else {
            share.lost_out += 1;
        }
    }
    Split { events: out, before }
}

/// The bots' record split by [`window_stats`].
struct Split {
    /// Per event, in order.
    events: Vec<WindowStats>,
    /// Lost datagrams sent before the first event (only `lost_in` and
    /// `lost_out` are set).
    before: WindowStats,
}

/// Which polls bound a count over a window of real time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Span {
    /// Only what surely happened inside it: from the first poll that
    /// started at or after `from` to the last that ended at or before `to`.
    Inside,
    /// All that may have happened inside it: from the last poll that ended
    /// at or before `from` (zero if none) to the first that started at or
    /// after `to` (the last poll if none).
    Covering,
}

/// A control server counter's growth from real time `from` to `to` (the
/// run's end if none), summed over the control servers (a stopped one: up
/// to its last answer).
fn counted(tl: &Timeline, from: f64, to: Option<f64>, span: Span, field: impl Fn(&ControlSample) -> u64) -> u64 {
    let n = tl.controls.first().map_or(0, |p| p.servers.len());
    (0..n)
        .map(|i| {
            // Server i's answers: (poll start, poll end, value).
            let polls: Vec<(f64, f64, u64)> = tl
                .controls
                .iter()
                .filter_map(|p| p.servers.get(i).copied().flatten().map(|c| (p.start, p.end, field(&c))))
                .collect();
            let (first, last) = match span {
                Span::Inside => (
                    polls.iter().find(|p| p.0 >= from).map(|p| p.2),
                    polls.iter().rev().find(|p| to.is_none_or(|t| p.1 <= t)).map(|p| p.2),
                ),
                Span::Covering => (
                    Some(polls.iter().rev().find(|p| p.1 <= from).map_or(0, |p| p.2)),
                    to.and_then(|t| polls.iter().find(|p| p.0 >= t))
                        .or(polls.last())
                        .map(|p| p.2),
                ),
            };
            match (first, last) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => 0,
            }
        })
        .sum()
}

/// What each event must show (the bounds, in the lab's virtual
/// seconds under a TDF): a kill, every affected player playing again
/// within detection (3 keepalive intervals) + the client's rule
/// (REPLACE_INTERVALS, 2 intervals) + 2 s; a control server stopped, no
/// player affected; Redis down and restarted, no loss, `/join` answered
/// while it was down and never failed until the hold after the restart
/// ended; a drain, no loss outside the move windows and each window at
/// most 500 ms. The bound, and whether it was met.
fn verdict(kind: EventKind, r: &EventRow, keepalive_s: f64) -> (Option<f64>, bool) {
    match kind {
        EventKind::Kill => {
            let bound = 5.0 * keepalive_s + 2.0;
            let ok = r.affected_players > 0 && r.recovery_s.is_some_and(|x| x <= bound);
            (Some(bound), ok)
        }
        EventKind::Control => (None, r.affected_players == 0),
        EventKind::Redis => (
            None,
            r.lost_in_windows + r.lost_outside_windows == 0
                && r.redis_down_s.is_some()
                && r.joins_answered > 0
                && r.join_failures == 0,
        ),
        EventKind::Drain => {
            let ok = r.lost_outside_windows == 0 && r.recovery_s.is_some_and(|x| x <= 0.5);
            (Some(0.5), ok)
        }
    }
}

fn event_table(rows: &[EventRow]) -> String {
    let mut s = String::new();
    // Three decimals: a drain's windows are milliseconds.
    let opt = |v: Option<f64>, none: &str| v.map_or(none.to_string(), |v| format!("{v:.3}"));
    let _ = writeln!(
        s,
        "\n{:<20} {:<22} {:>6} {:>8} {:>9} {:>7} {:>8} {:>8} {:>5} {:>6} {:>5} {:>4} | {:>7} {:>7} {:>6} {:>7}",
        "event",
        "target",
        "at s",
        "affected",
        "recovery",
        "bound",
        "lost in",
        "lost out",
        "429s",
        "joins",
        "fails",
        "pass",
        "on tgt",
        "members",
        "lowest",
        "back s"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<20} {:<22} {:>6.1} {:>8} {:>9} {:>7} {:>8} {:>8} {:>5} {:>6} {:>5} {:>4} | {:>7} {:>7} {:>6} {:>7}",
            r.event,
            r.target,
            r.at_s,
            r.affected_players,
            opt(r.recovery_s, "never"),
            opt(r.threshold_s, "-"),
            r.lost_in_windows,
            r.lost_outside_windows,
            r.rate_limited,
            r.joins_answered,
            r.join_failures,
            if r.pass { "yes" } else { "NO" },
            r.players_on_target,
            r.members_before,
            r.members_low,
            opt(r.members_back_s, "never"),
        );
    }
    let _ = writeln!(
        s,
        "affected: players whose move window (MOVED, or the client's silence rule) opened after the event; \
         recovery: the longest window, virtual s (a kill's from the kill), to the first DATA delivered \
         through the new membership; lost in/out: owed DATA sent after the event and lost, inside a window of \
         its sender or receiver / outside; 429s: the control servers' refusals; joins/fails: their /join answers \
         with a grant and failures (503, 400) until the next event, for a Redis restart joins answered while \
         Redis was down and fails until the hold after the restart ended ({CONTROL_HOLD_S} s). Right of |: the \
         reflectors' /metrics (players on the reflector hit, members before, lowest after, s until as many \
         again)."
    );
    for r in rows.iter().filter(|r| r.redis_down_s.is_some()) {
        let _ = writeln!(
            s,
            "{} at {:.1} s: Redis down {:.1} s, /join answered {} time(s) meanwhile, {} failure(s) until the hold \
             ended",
            r.event,
            r.at_s,
            r.redis_down_s.unwrap_or_default(),
            r.joins_answered,
            r.join_failures
        );
    }
    s
}

fn write_csvs(out: &Path, rows: &[EventRow], tl: &Timeline, tdf: f64, refl_hosts: &[String]) -> Result<(), DemoError> {
    let mut s = String::from(
        "event,target,at_s,affected_players,recovery_s,lost_in_windows,lost_outside_windows,rate_limited_429,\
         threshold_s,pass,players_on_target,members_before,members_low,members_back_s,joins_answered,join_failures,\
         redis_down_s\n",
    );
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.3}"));
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{:.3},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.event,
            r.target,
            r.at_s,
            r.affected_players,
            opt(r.recovery_s),
            r.lost_in_windows,
            r.lost_outside_windows,
            r.rate_limited,
            opt(r.threshold_s),
            r.pass,
            r.players_on_target,
            r.members_before,
            r.members_low,
            opt(r.members_back_s),
            r.joins_answered,
            r.join_failures,
            opt(r.redis_down_s)
        );
    }
    let p = out.join("fleet.csv");
    std::fs::write(&p, s).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    // Copies fanned out per virtual second between polls, per reflector.
    let mut s = String::from("t_s");
    for h in refl_hosts {
        let _ = write!(s, ",members_{h},copies_per_s_{h}");
    }
    s.push('\n');
    let mut last: BTreeMap<usize, (f64, u64)> = BTreeMap::new();
    for (t, row) in &tl.rows {
        let _ = write!(s, "{:.3}", t / tdf);
        for (i, smp) in row.iter().enumerate() {
            match smp {
                Some(x) => {
                    let rate = match last.get(&i) {
                        Some(&(t1, f1)) if *t > t1 && x.fanned_out >= f1 => {
                            (x.fanned_out - f1) as f64 / ((t - t1) / tdf)
                        }
                        _ => 0.0,
                    };
                    last.insert(i, (*t, x.fanned_out));
                    let _ = write!(s, ",{},{rate:.1}", x.members);
                }
                None => {
                    last.remove(&i);
                    s.push_str(",,");
                }
            }
        }
        s.push('\n');
    }
    let p = out.join("fleet_rate.csv");
    std::fs::write(&p, s).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    eprintln!("fleet: wrote {} and {}", out.join("fleet.csv").display(), p.display());
    Ok(())
}

/// Bytes a copy of `size` bytes takes on a lab link as its shaper counts
/// it: UDP (8), IPv4 (20) and Ethernet (14) headers.
const WIRE_OVERHEAD: usize = 8 + 20 + 14;

/// Each reflector's egress as a share of the link rate: (peak over spans
/// of at least `LOAD_SPAN_S` virtual seconds between two of its answered
/// polls, mean over every span it answered), or `None` if it never
/// answered two polls in a row. Spans, not single poll intervals: a poll
/// reads the reflectors one after another, so one interval's length is
/// off by the other reflectors' answer times.
fn link_load(tl: &Timeline, tdf: f64, size: usize, bw_bps: u64) -> Vec<Option<(f64, f64)>> {
    let n = tl.rows.first().map_or(0, |r| r.1.len());
    let bits = ((size + WIRE_OVERHEAD) * 8) as f64;
    let share = |copies: u64, secs: f64| copies as f64 / secs * bits / bw_bps as f64;
    (0..n)
        .map(|i| {
            let (mut peak, mut copies, mut secs) = (None::<f64>, 0u64, 0.0f64);
            // The span being gathered: its start (virtual s, copies so far).
            let mut span: Option<(f64, u64)> = None;
            let mut last: Option<(f64, u64)> = None;
            for (t, row) in &tl.rows {
                let now = row.get(i).copied().flatten().map(|x| (t / tdf, x.fanned_out));
                match (last, now) {
                    (Some((t0, c0)), Some((t1, c1))) if t1 > t0 && c1 >= c0 => {
                        copies += c1 - c0;
                        secs += t1 - t0;
                        let (ts, cs) = *span.get_or_insert((t0, c0));
                        if t1 - ts >= LOAD_SPAN_S {
                            let x = share(c1 - cs, t1 - ts);
                            peak = Some(peak.map_or(x, |p| p.max(x)));
                            span = Some((t1, c1));
                        }
                    }
                    // A poll unanswered (or a counter reset): start again.
                    _ => span = None,
                }
                last = now;
            }
            if secs <= 0.0 {
                return None;
            }
            let mean = share(copies, secs);
            Some((peak.unwrap_or(mean), mean))
        })
        .collect()
}

/// The shortest span a peak link load is taken over (virtual seconds).
const LOAD_SPAN_S: f64 = 1.0;

fn get(url: &str) -> Result<String, String> {
    ureq::get(url)
        .timeout(Duration::from_millis(500))
        .call()
        .map_err(|e| format!("GET {url}: {e}"))?
        .into_string()
        .map_err(|e| format!("GET {url}: {e}"))
}

fn tail(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(10).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_parsed_in_time_order_and_checked_against_the_run() {
        let e = parse_events("drain=80,kill=20, control=40", 100.0).unwrap();
        assert_eq!(
            e,
            vec![
                (EventKind::Kill, 20.0),
                (EventKind::Control, 40.0),
                (EventKind::Drain, 80.0)
            ]
        );
        assert!(parse_events("kill=120", 100.0).unwrap_err().contains("outside the run"));
        assert!(parse_events("explode=10", 100.0)
            .unwrap_err()
            .contains("unknown event 'explode'"));
        assert!(parse_events("kill", 100.0).unwrap_err().contains("NAME=SECONDS"));
    }

    #[test]
    fn windows_and_lost_datagrams_are_split_by_event() {
        use reflector_bots::WindowCause;
        let s = 1_000_000_000u64;
        let w = |player, cause, start: u64, end: Option<u64>| MoveWindow {
            player,
            cause,
            start_ns: start,
            end_ns: end,
            end_by: None,
            from: Some(
                if start < 30 * s {
                    "10.0.0.1:4000"
                } else {
                    "10.0.0.2:4000"
                }
                .into(),
            ),
            to: None,
        };
        let l = |sender, receiver, sent_ns| LostDatagram {
            sender,
            receiver,
            sent_ns,
        };
        let (r1, r2) = (Some(Ipv4Addr::new(10, 0, 0, 1)), Some(Ipv4Addr::new(10, 0, 0, 2)));
        let events = [
            (EventKind::Kill, 10 * s, r1),
            (EventKind::Control, 20 * s, None),
            (EventKind::Drain, 30 * s, r2),
        ];
        let windows = [
            // The kill's: detected 3 s later, back 2 s and 4 s after that.
            w(1, WindowCause::Silent, 13 * s, Some(15 * s)),
            w(2, WindowCause::Silent, 13 * s, Some(17 * s)),
            // The drain's: 0.3 s.
            w(3, WindowCause::Moved, 31 * s, Some(31 * s + 300_000_000)),
            // A player's own move after the control server stopped: not
            // the event's, and on the drain another reflector's.
            w(7, WindowCause::Cell, 21 * s, Some(22 * s)),
            MoveWindow {
                from: Some("10.0.0.1:4001".into()),
                ..w(8, WindowCause::Moved, 32 * s, Some(40 * s))
            },
        ];
        let lost = [
            // Sent to the dead reflector before the silence was noticed:
            // inside player 1's window, which runs from the kill.
            l(1, 4, 11 * s),
            // Player 5 to 4, neither moving: outside.
            l(5, 4, 12 * s),
            // Before any event: the steady state's, outside.
            l(5, 4, 5 * s),
            // In the drain's window (the receiver's).
            l(6, 3, 31 * s + 100_000_000),
        ];
        let got = window_stats(&events, &windows, &lost);
        assert_eq!((got.before.lost_in, got.before.lost_out), (0, 1));
        let brief: Vec<_> = got
            .events
            .iter()
            .map(|x| (x.affected, x.recovery_s, x.lost_in, x.lost_out))
            .collect();
        assert_eq!(
            brief,
            [(2, Some(7.0), 1, 1), (0, Some(0.0), 0, 0), (1, Some(0.3), 1, 0)]
        );
        // A window that never ended: no recovery, wherever it started.
        let open = [w(1, WindowCause::Silent, 13 * s, None)];
        assert_eq!(window_stats(&events[..1], &open, &[]).events[0].recovery_s, None);
        let stuck = [MoveWindow {
            from: Some("10.0.0.9:4000".into()),
            ..w(1, WindowCause::Cell, 11 * s, None)
        }];
        assert_eq!(window_stats(&events[..1], &stuck, &[]).events[0].recovery_s, None);
        // The bounds: keepalive 1 s gives a kill 3 + 2 + 2 = 7 s.
        let mut r = analyse(&Timeline::default(), EventKind::Kill, 10.0, 10.0, "h1", Some(0), 1.0);
        (r.affected_players, r.recovery_s) = (2, Some(7.0));
        assert_eq!(verdict(EventKind::Kill, &r, 1.0), (Some(7.0), true));
        r.recovery_s = Some(7.1);
        assert_eq!(verdict(EventKind::Kill, &r, 1.0), (Some(7.0), false));
        (r.recovery_s, r.lost_outside_windows) = (Some(0.3), 1);
        assert_eq!(verdict(EventKind::Drain, &r, 1.0), (Some(0.5), false));
        r.lost_outside_windows = 0;
        assert_eq!(verdict(EventKind::Drain, &r, 1.0), (Some(0.5), true));
        assert!(!verdict(EventKind::Control, &r, 1.0).1, "a player affected");
    }

    #[test]
    fn link_rates_are_read_as_netlab_reads_them() {
        assert_eq!(link_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(link_rate("100mbit"), Ok(100_000_000));
        assert!(link_rate("0").unwrap_err().contains("above zero"));
        assert!(link_rate("fast").unwrap_err().contains("100mbit"));
    }

    #[test]
    fn link_load_is_each_reflectors_egress_against_the_link_rate() {
        let smp = |fanned_out| Some(Sample { members: 1, fanned_out });
        // TDF 2: 1 s of real time between polls is 0.5 s of the lab's. The
        // first reflector sends 1,000 copies in each of the first two half
        // seconds, then 3,000 in each of the next two (2,000 and 6,000 per
        // s); 142 B each against 10 Mbit/s. The peak is over 1 s spans.
        // The second never answers twice in a row: not measured.
        let tl = Timeline {
            rows: vec![
                (0.0, vec![smp(0), smp(0)]),
                (1.0, vec![smp(1000), None]),
                (2.0, vec![smp(2000), smp(9)]),
                (3.0, vec![smp(5000), None]),
                (4.0, vec![smp(8000), smp(20)]),
            ],
            controls: Vec::new(),
        };
        let got = link_load(&tl, 2.0, 100, 10_000_000);
        let (peak, mean) = got[0].unwrap();
        let load = |per_s: f64| per_s * 142.0 * 8.0 / 1e7;
        assert!((peak - load(6000.0)).abs() < 1e-9, "{peak}");
        assert!((mean - load(4000.0)).abs() < 1e-9, "{mean}");
        assert_eq!(got[1], None);
    }

    #[test]
    fn control_counters_are_read_from_their_metrics() {
        let text = "# TYPE reflector_control_join_rate_limited_total counter\n\
                    reflector_control_join_rate_limited_total 7\n\
                    reflector_control_joins_answered_total 120\n\
                    reflector_control_join_failures_total{cause=\"unplaced\"} 2\n\
                    reflector_control_join_failures_total{cause=\"too_many_cells\"} 0\n\
                    reflector_control_join_failures_total{cause=\"bad_request\"} 1\n\
                    reflector_control_join_rate_limited_other_total 9\n";
        assert_eq!(
            parse_control_metrics(text),
            Some(ControlSample {
                rate_limited: 7,
                joins_answered: 120,
                join_failures: 3
            })
        );
        // A control server without the join counters is no sample.
        assert_eq!(
            parse_control_metrics("reflector_control_join_rate_limited_total 7\n"),
            None
        );
    }

    #[test]
    fn control_counts_are_split_by_window() {
        let c = |rate_limited, joins_answered| {
            Some(ControlSample {
                rate_limited,
                joins_answered,
                join_failures: 0,
            })
        };
        let poll = |start: f64, servers| ControlPoll {
            start,
            end: start + 0.1,
            servers,
        };
        let tl = Timeline {
            rows: Vec::new(),
            controls: vec![
                poll(1.0, vec![c(0, 10), c(2, 0)]),
                poll(2.0, vec![c(3, 20), c(2, 0)]),
                poll(3.0, vec![None, c(5, 0)]),
                poll(4.0, vec![None, c(9, 0)]),
            ],
        };
        let limited = |from, to, span| counted(&tl, from, to, span, |c| c.rate_limited);
        // Covering 1.5 to 3.5: the first from 0 (poll 1) to 3 (its last),
        // the second from 2 (poll 1) to 9 (poll 4, the first after 3.5).
        assert_eq!(limited(1.5, Some(3.5), Span::Covering), 3 + 7);
        assert_eq!(limited(3.5, None, Span::Covering), 4);
        // Inside 1.5 to 3.5: the first, polls 2 to 2 (0); the second,
        // polls 2 to 3 (3).
        assert_eq!(limited(1.5, Some(3.5), Span::Inside), 3);
        // Inside 0.5 to 2.5: 10 answers of the first for sure.
        assert_eq!(counted(&tl, 0.5, Some(2.5), Span::Inside, |c| c.joins_answered), 10);
        // No poll wholly inside: nothing for sure.
        assert_eq!(limited(1.05, Some(1.5), Span::Inside), 0);
    }

    #[test]
    fn redis_outages_end_within_the_run_and_do_not_overlap() {
        let e = parse_events("redis=10,redis=20", 30.0).unwrap();
        assert!(check_redis_outages(&e, 3.0, 30.0).is_ok());
        assert!(check_redis_outages(&e, 10.5, 30.0).unwrap_err().contains("still down"));
        assert!(check_redis_outages(&e, 10.0, 30.0)
            .unwrap_err()
            .contains("until the run ends"));
        assert!(check_redis_outages(&e, 0.5, 30.0).unwrap_err().contains("--redis-down"));
        assert!(check_redis_outages(&[], f64::NAN, 30.0).is_err());
        // No cell moves until the hold after the restart ended.
        let e = parse_events("kill=5,redis=10,drain=19.5,kill=20", 30.0).unwrap();
        let err = check_redis_outages(&e, 3.0, 30.0).unwrap_err();
        assert!(
            err.contains("drain reflector at 19.5 s") && err.contains("from 20 s"),
            "{err}"
        );
        let e = parse_events("kill=5,redis=10,control=12,drain=20", 30.0).unwrap();
        assert!(check_redis_outages(&e, 3.0, 30.0).is_ok());
    }

    #[test]
    fn a_redis_restart_passes_only_with_joins_answered_while_down_and_no_failure() {
        let mut r = analyse(&Timeline::default(), EventKind::Redis, 10.0, 10.0, "redis", None, 1.0);
        (r.redis_down_s, r.joins_answered, r.join_failures) = (Some(3.0), 40, 0);
        assert_eq!(verdict(EventKind::Redis, &r, 1.0), (None, true));
        r.joins_answered = 0;
        assert!(
            !verdict(EventKind::Redis, &r, 1.0).1,
            "no /join seen answered while down"
        );
        (r.joins_answered, r.join_failures) = (40, 1);
        assert!(!verdict(EventKind::Redis, &r, 1.0).1, "a /join failed");
        (r.join_failures, r.lost_in_windows) = (0, 1);
        assert!(!verdict(EventKind::Redis, &r, 1.0).1, "a datagram lost");
        (r.lost_in_windows, r.redis_down_s) = (0, None);
        assert!(!verdict(EventKind::Redis, &r, 1.0).1, "Redis never back");
    }

    #[test]
    fn metrics_text_gives_members_and_copies() {
        let text = "# HELP reflector_members x\n# TYPE reflector_members gauge\nreflector_members 42\n\
                    reflector_fanned_out_total 12345\nreflector_group_members{group=\"4000\"} 3\n";
        let s = parse_metrics(text).unwrap();
        assert_eq!((s.members, s.fanned_out), (42, 12345));
        assert!(parse_metrics("reflector_members 1\n").is_none());
    }

    #[test]
    fn recovery_is_when_the_live_reflectors_hold_every_member_again() {
        let s = |m| {
            Some(Sample {
                members: m,
                fanned_out: 0,
            })
        };
        let tl = Timeline {
            rows: vec![
                (1.0, vec![s(10), s(20), s(30)]),
                (2.0, vec![None, s(20), s(30)]),
                (3.0, vec![None, s(25), s(33)]),
                (4.0, vec![None, s(27), s(33)]),
            ],
            controls: Vec::new(),
        };
        // Reflector 0 killed at real 1.5 s with TDF 2: its 10 players are
        // back (27 + 33 = 60) at real 4.0 s, 1.25 virtual seconds later.
        let r = analyse(&tl, EventKind::Kill, 0.75, 1.5, "h1", Some(0), 2.0);
        assert_eq!((r.players_on_target, r.members_before, r.members_low), (10, 60, 50));
        assert_eq!(r.members_back_s, Some(1.25));
        // Never back within the timeline.
        let r = analyse(&tl, EventKind::Kill, 1.5, 3.0, "h2", Some(1), 1.0);
        assert_eq!(r.members_back_s, None);
    }
}
