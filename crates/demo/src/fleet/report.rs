//! The run's results as the operator reads them: the table of events
//! printed at the end and the CSV files of `--out`. Apart from the
//! analysis so that the figures and their layout change independently.

use super::analysis::EventRow;
use super::cli::CONTROL_HOLD_S;
use super::timeline::Timeline;
use crate::error::DemoError;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

pub(super) fn event_table(rows: &[EventRow]) -> String {
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

pub(super) fn write_csvs(
    out: &Path,
    rows: &[EventRow],
    tl: &Timeline,
    tdf: f64,
    refl_hosts: &[String],
) -> Result<(), DemoError> {
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
