//! The run's figures, per event: the bots' move windows and lost
//! datagrams split by event, the control servers' counters over each
//! event's span, the members' recovery, the links' load, and the verdict
//! against each event's bound. Pure functions of what the run gathered,
//! apart from it so that they are tested without a lab.

use super::cli::EventKind;
use super::timeline::{ControlSample, Sample, Timeline};
use reflector_bots::{LostDatagram, MoveWindow};
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

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

pub(super) fn analyse(
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
pub(super) struct WindowStats {
    pub(super) affected: u64,
    pub(super) recovery_s: Option<f64>,
    pub(super) lost_in: u64,
    pub(super) lost_out: u64,
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
pub(super) fn window_stats(
    events: &[(EventKind, u64, Option<Ipv4Addr>)],
    windows: &[MoveWindow],
    lost: &[LostDatagram],
) -> Split {
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
pub(super) struct Split {
    /// Per event, in order.
    pub(super) events: Vec<WindowStats>,
    /// Lost datagrams sent before the first event (only `lost_in` and
    /// `lost_out` are set).
    pub(super) before: WindowStats,
}

/// Which polls bound a count over a window of real time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Span {
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
pub(super) fn counted(
    tl: &Timeline,
    from: f64,
    to: Option<f64>,
    span: Span,
    field: impl Fn(&ControlSample) -> u64,
) -> u64 {
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
pub(super) fn verdict(kind: EventKind, r: &EventRow, keepalive_s: f64) -> (Option<f64>, bool) {
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

/// Bytes a copy of `size` bytes takes on a lab link as its shaper counts
/// it: UDP (8), IPv4 (20) and Ethernet (14) headers.
pub(super) const WIRE_OVERHEAD: usize = 8 + 20 + 14;

/// Each reflector's egress as a share of the link rate: (peak over spans
/// of at least `LOAD_SPAN_S` virtual seconds between two of its answered
/// polls, mean over every span it answered), or `None` if it never
/// answered two polls in a row. Spans, not single poll intervals: a poll
/// reads the reflectors one after another, so one interval's length is
/// off by the other reflectors' answer times.
pub(super) fn link_load(tl: &Timeline, tdf: f64, size: usize, bw_bps: u64) -> Vec<Option<(f64, f64)>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::timeline::ControlPoll;

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
