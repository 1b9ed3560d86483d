//! What a bots run reports: per bot and in total, as a table or JSON.

use super::Tally;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// One bot's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BotReport {
    pub player: u32,
    #[serde(flatten)]
    pub tally: Tally,
    pub lost: u64,
    /// Joins completed (JOIN_ACK received).
    pub joins: u64,
    /// JOIN datagrams sent again after a timeout.
    pub join_retries: u64,
    /// Memberships renewed with a fresh token (JOIN_ACK received).
    #[serde(default)]
    pub renewals: u64,
    /// Moves to another cell.
    pub cell_changes: u64,
    /// Moves that changed group (LEAVE + JOIN).
    pub group_changes: u64,
    pub errors: u64,
    pub latency_max_us: f64,
    pub latency_mean_us: f64,
}

/// Latency summary, microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// What the bots' clients did with sealed groups' DATA (docs/protocol.md,
/// "Sealed payloads"): the drops of each receiving step, summed over the
/// bots, and the key refreshes. All zero in clear groups; in a sealed group
/// whose keys every bot holds, the drops stay zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealedTally {
    /// Sealed DATA that passed every receiving step and opened.
    #[serde(default)]
    pub opened: u64,
    /// Not a sealed DATA (clear DATA in a sealed group, or too short).
    pub malformed: u64,
    /// A sealed version the client does not read.
    pub version: u64,
    /// No epoch key held for the sender's cell and epoch.
    pub no_key: u64,
    /// A sequence already seen from that sender instance.
    pub replay: u64,
    /// Did not open under the sender's key.
    pub bad: u64,
    /// `/keys` answers received, and requests that failed.
    pub keys_refreshes: u64,
    pub keys_refresh_failures: u64,
}

impl SealedTally {
    /// Adds one client's counters.
    pub fn add(&mut self, s: &reflector_client::Stats) {
        self.opened += s.sealed_opened;
        self.malformed += s.sealed_malformed;
        self.version += s.sealed_version;
        self.no_key += s.sealed_no_key;
        self.replay += s.sealed_replay;
        self.bad += s.sealed_bad;
        self.keys_refreshes += s.keys_refreshes;
        self.keys_refresh_failures += s.keys_refresh_failures;
    }

    /// Sealed DATA dropped, every step.
    pub fn dropped(&self) -> u64 {
        self.malformed + self.version + self.no_key + self.replay + self.bad
    }
}

/// The result of a bots run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BotsReport {
    pub bots: usize,
    pub duration_s: f64,
    pub rate_hz: f64,
    pub size: usize,
    pub move_every_s: f64,
    pub total: Tally,
    pub lost: u64,
    pub joins: u64,
    pub join_retries: u64,
    pub group_changes: u64,
    pub latency: Latency,
    /// Datagrams received that were not DATA we can account (bad parse, short payload).
    pub malformed: u64,
    /// With `--marker`: DATA received whose game data carries the run's
    /// marker with its sender's player id (0 without one).
    #[serde(default)]
    pub markers_received: u64,
    /// Checkpoint uploads, fetches and their checks.
    #[serde(default)]
    pub checkpoints: super::CheckpointTally,
    /// Sealed DATA dropped by the bots' clients, and key refreshes.
    #[serde(default)]
    pub sealed: SealedTally,
    pub error_count: u64,
    /// The first few error messages.
    pub errors: Vec<String>,
    pub per_bot: Vec<BotReport>,
    /// Every player's move windows (see `windows.rs`), by start time.
    #[serde(default)]
    pub move_windows: Vec<super::MoveWindow>,
    /// The owed DATA lost, one by one with its send time (at most 200,000;
    /// `lost` is the exact count).
    #[serde(default)]
    pub lost_datagrams: Vec<super::LostDatagram>,
}

impl BotsReport {
    /// 2 on errors, 1 on loss, 0 when every expected datagram arrived.
    pub fn exit_code(&self) -> i32 {
        if self.error_count > 0 {
            2
        } else if self.lost > 0 {
            1
        } else {
            0
        }
    }

    /// The human summary.
    pub fn table(&self, per_bot: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "bots: {} bots, {:.1} s at {} Hz x {} B, moves every {}",
            self.bots,
            self.duration_s,
            self.rate_hz,
            self.size,
            if self.move_every_s > 0.0 {
                format!("{} s", self.move_every_s)
            } else {
                "never".into()
            }
        );
        let _ = writeln!(
            out,
            "{:>8} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>6} {:>7} {:>9}",
            "player", "sent", "expected", "received", "dups", "gap", "tail", "unexpect", "joins", "groupch", "lat.max"
        );
        let row = |out: &mut String, label: &str, t: &Tally, joins: u64, gc: u64, lat: String| {
            let _ = writeln!(
                out,
                "{:>8} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>6} {:>7} {:>9}",
                label,
                t.sent,
                t.expected,
                t.received,
                t.duplicates,
                t.gap_lost,
                t.tail_lost,
                t.unexpected,
                joins,
                gc,
                lat
            );
        };
        if per_bot {
            for b in &self.per_bot {
                row(
                    &mut out,
                    &b.player.to_string(),
                    &b.tally,
                    b.joins,
                    b.group_changes,
                    format!("{:.0}us", b.latency_max_us),
                );
            }
        }
        row(
            &mut out,
            "total",
            &self.total,
            self.joins,
            self.group_changes,
            format!("{:.0}us", self.latency.max_us),
        );
        let _ = writeln!(
            out,
            "latency (one-way, {} samples): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            self.latency.count, self.latency.p50_us, self.latency.p99_us, self.latency.max_us
        );
        let _ = writeln!(
            out,
            "join retries {}, uncertain {}, malformed {}{}",
            self.join_retries,
            self.total.uncertain,
            self.malformed,
            if self.markers_received > 0 {
                format!(", {} received with their sender's marker", self.markers_received)
            } else {
                String::new()
            }
        );
        let c = &self.checkpoints;
        if c.requested + c.fetched + c.fetched_empty + c.fetch_errors > 0 {
            let _ = writeln!(
                out,
                "checkpoints: {} requested, {} uploaded ({} failed); {} fetched ({} signed, {} B, {:.1} ms mean, {:.1} ms max), \
                 {} empty, {} failed, {} overtaken; entries checked: {} matched, {} moved since, {} unconfirmed, {} mismatched",
                c.requested,
                c.uploaded,
                c.upload_errors,
                c.fetched,
                c.fetched_signed,
                c.bytes_fetched,
                c.fetch_ms_mean,
                c.fetch_ms_max,
                c.fetched_empty,
                c.fetch_errors,
                c.fetches_overtaken,
                c.entries_matched,
                c.entries_moved,
                c.entries_unconfirmed,
                c.mismatched
            );
        }
        let z = &self.sealed;
        if *z != SealedTally::default() {
            let _ = writeln!(
                out,
                "sealed DATA: {} opened; dropped: {} malformed, {} unknown version, {} without a key, {} replayed, \
                 {} not opening; keys refreshed {} times ({} failed)",
                z.opened, z.malformed, z.version, z.no_key, z.replay, z.bad, z.keys_refreshes, z.keys_refresh_failures
            );
        }
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        let verdict = match self.exit_code() {
            0 => format!("OK: all {} expected datagrams received, no loss", self.total.expected),
            1 => format!(
                "LOSS: {} of {} expected datagrams lost ({} in gaps, {} at the tail)",
                self.lost, self.total.expected, self.total.gap_lost, self.total.tail_lost
            ),
            _ => format!("ERRORS: {} error(s); {} datagrams lost", self.error_count, self.lost),
        };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let mut r = BotsReport {
            bots: 1,
            duration_s: 1.0,
            rate_hz: 1.0,
            size: 100,
            move_every_s: 0.0,
            total: Tally::default(),
            lost: 0,
            joins: 1,
            join_retries: 0,
            group_changes: 0,
            latency: Latency::default(),
            malformed: 0,
            markers_received: 0,
            checkpoints: Default::default(),
            sealed: Default::default(),
            error_count: 0,
            errors: vec![],
            per_bot: vec![],
            move_windows: vec![],
            lost_datagrams: vec![],
        };
        assert_eq!(r.exit_code(), 0);
        assert!(r.table(false).contains("OK"));
        r.lost = 3;
        assert_eq!(r.exit_code(), 1);
        assert!(r.table(false).contains("LOSS"));
        r.error_count = 1;
        assert_eq!(r.exit_code(), 2);
    }
}
