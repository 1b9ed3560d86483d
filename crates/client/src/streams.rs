//! What a receiver knows of each sender: one stream per (player, instance),
//! deduplicated with the protocol's replay window and counted (gaps,
//! reordering, duplicates). Pure: time comes in as an argument.
//!
//! Why per (player, instance): a sender numbers every datagram it sends,
//! in any group, from one counter, so a player seen again after a rejoin or
//! in a second group is the same stream; a restarted sender has a new
//! instance id and starts a new one.

use reflector_proto::protocol::ReplayWindow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A sender: its player id and client instance id (0 where the group does
/// not carry instance ids).
pub type SenderKey = (u32, u64);

/// What became of one received DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New: deliver it. `first`: the first datagram of this sender (or the
    /// first since it went silent).
    Fresh { first: bool },
    /// Seen before: dropped.
    Duplicate,
    /// More than 64 numbers behind the newest of its sender: whether it is
    /// new cannot be told, so it is dropped.
    TooLate,
    /// A new sender while the table is full: dropped.
    TableFull,
}

/// Counters over every stream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StreamCounters {
    pub delivered: u64,
    pub duplicates: u64,
    pub too_late: u64,
    /// Arrived after a higher number of the same sender.
    pub reordered: u64,
    /// Sequence numbers skipped and never filled: lost DATA, and also the
    /// sender's own control datagrams (KEEPALIVE, ECHO, PROBE_REPLY), which
    /// take numbers from the same counter and are never forwarded. An
    /// upper bound of the loss; see the crate README.
    pub gaps: u64,
    pub table_full: u64,
}

#[derive(Debug, Clone, Copy)]
struct Stream {
    window: ReplayWindow,
    last_heard: Instant,
    silent: bool,
}

/// The streams of every sender heard, bounded.
#[derive(Debug)]
pub struct Streams {
    map: HashMap<SenderKey, Stream>,
    cap: usize,
    silent_after: Duration,
    /// No sender goes silent before this (a bound kept as senders are
    /// heard): until then looking for silent senders is one comparison,
    /// not a walk over the table, which a client does on every update.
    silent_not_before: Option<Instant>,
    pub counters: StreamCounters,
}

impl Streams {
    /// At most `cap` senders tracked (allocated now, so a steady state never
    /// allocates); a sender unheard for `silent_after` is reported silent.
    pub fn new(cap: usize, silent_after: Duration) -> Streams {
        Streams {
            map: HashMap::with_capacity(cap),
            cap,
            silent_after,
            silent_not_before: None,
            counters: StreamCounters::default(),
        }
    }

    /// Judges DATA number `seq` from `key`, received at `now`.
    pub fn accept(&mut self, key: SenderKey, seq: u64, now: Instant) -> Verdict {
        // One hash of the key per datagram (contains_key then entry was two).
        let full = self.map.len() >= self.cap;
        let s = match self.map.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(_) if full => {
                self.counters.table_full += 1;
                return Verdict::TableFull;
            }
            Entry::Vacant(v) => v.insert(Stream {
                window: ReplayWindow::default(),
                last_heard: now,
                silent: true,
            }),
        };
        if !s.window.fresh(seq) {
            if seq <= s.window.highest && s.window.highest - seq >= 64 {
                self.counters.too_late += 1;
                return Verdict::TooLate;
            }
            self.counters.duplicates += 1;
            return Verdict::Duplicate;
        }
        let before = s.window.highest;
        s.window.accept(seq);
        if before != 0 && seq > before {
            self.counters.gaps += seq - before - 1;
        } else if seq < before {
            // It fills a gap counted when a higher number came first.
            self.counters.reordered += 1;
            self.counters.gaps = self.counters.gaps.saturating_sub(1);
        }
        self.counters.delivered += 1;
        s.last_heard = now;
        let first = s.silent;
        s.silent = false;
        if first {
            // A sender heard later only goes silent later: the bound holds
            // for the others, and this one is the new earliest only here.
            let at = now + self.silent_after;
            self.silent_not_before = Some(self.silent_not_before.map_or(at, |t| t.min(at)));
        }
        Verdict::Fresh { first }
    }

    /// One sender that has gone silent since it was last heard (reported
    /// once, then forgotten, so the table never fills with the departed).
    pub fn poll_silent(&mut self, now: Instant) -> Option<SenderKey> {
        if self.silent_not_before.is_none_or(|t| now < t) {
            return None;
        }
        let after = self.silent_after;
        let key = self
            .map
            .iter()
            .find(|(_, s)| !s.silent && now.saturating_duration_since(s.last_heard) >= after)
            .map(|(k, _)| *k);
        if let Some(k) = key {
            self.map.remove(&k);
        }
        // The bound made exact again: the next walk is when someone may
        // really have gone silent.
        self.silent_not_before = self
            .map
            .values()
            .filter(|s| !s.silent)
            .map(|s| s.last_heard + after)
            .min();
        key
    }

    /// When [`Streams::poll_silent`] next may have a sender to report: no
    /// later than the earliest a sender heard goes silent (`None` with none
    /// heard).
    pub fn next_silent(&self) -> Option<Instant> {
        self.silent_not_before
    }

    /// Senders tracked now.
    pub fn tracked(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_reordering_and_gaps_are_counted() {
        let t0 = Instant::now();
        let mut s = Streams::new(4, Duration::from_secs(1));
        let a = (7, 99);
        assert_eq!(s.accept(a, 10, t0), Verdict::Fresh { first: true });
        assert_eq!(s.accept(a, 11, t0), Verdict::Fresh { first: false });
        assert_eq!(s.accept(a, 11, t0), Verdict::Duplicate);
        assert_eq!(s.accept(a, 14, t0), Verdict::Fresh { first: false });
        assert_eq!(s.counters.gaps, 2);
        assert_eq!(s.accept(a, 12, t0), Verdict::Fresh { first: false });
        assert_eq!((s.counters.reordered, s.counters.gaps), (1, 1));
        assert_eq!(s.accept(a, 200, t0), Verdict::Fresh { first: false });
        assert_eq!(s.accept(a, 100, t0), Verdict::TooLate);
        // Same player, another instance: another stream.
        assert_eq!(s.accept((7, 5), 1, t0), Verdict::Fresh { first: true });
        assert_eq!(s.counters.duplicates, 1);
        assert_eq!(s.counters.delivered, 6);
    }

    #[test]
    fn silent_senders_are_reported_once_and_the_table_is_bounded() {
        let t0 = Instant::now();
        let mut s = Streams::new(2, Duration::from_millis(100));
        s.accept((1, 0), 1, t0);
        s.accept((2, 0), 1, t0 + Duration::from_millis(50));
        assert_eq!(s.accept((3, 0), 1, t0), Verdict::TableFull);
        assert_eq!(s.next_silent(), Some(t0 + Duration::from_millis(100)));
        assert_eq!(s.poll_silent(t0 + Duration::from_millis(99)), None);
        assert_eq!(s.poll_silent(t0 + Duration::from_millis(100)), Some((1, 0)));
        assert_eq!(s.next_silent(), Some(t0 + Duration::from_millis(150)));
        assert_eq!(s.poll_silent(t0 + Duration::from_millis(100)), None);
        assert_eq!(s.accept((1, 0), 2, t0), Verdict::Fresh { first: true });
        assert_eq!(s.tracked(), 2);
    }
}
