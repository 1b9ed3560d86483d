//! The fleet lab's command line and its schedule of events: the options,
//! their value parsers and the checks a schedule must pass before any lab
//! is built. Apart from the run so that the schedule's rules read, and are
//! tested, without a lab.

use serde::Serialize;
use std::path::PathBuf;

/// How long a control server holds its placements after Redis restarted
/// (virtual seconds): two of its registry TTLs, the registry's default 3 s
/// (`control` has no option for it).
pub(super) const CONTROL_HOLD_S: f64 = 6.0;
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

    pub(super) fn name(self) -> &'static str {
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
    fn link_rates_are_read_as_netlab_reads_them() {
        assert_eq!(link_rate("1gbit"), Ok(1_000_000_000));
        assert_eq!(link_rate("100mbit"), Ok(100_000_000));
        assert!(link_rate("0").unwrap_err().contains("above zero"));
        assert!(link_rate("fast").unwrap_err().contains("100mbit"));
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
}
