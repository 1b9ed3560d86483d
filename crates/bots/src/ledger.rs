//! Delivery accounting for bots that all live in one process: a pure ledger
//! that knows who was in which group when, and therefore exactly which
//! datagrams each bot should have received.
//!
//! Vocabulary: a *membership* is one bot's stay in one group, from its
//! join to its leave; it is also the *epoch* its DATA carries, so a sender's
//! stream is (sender, epoch) with sequence numbers 0, 1, 2, ... For every
//! pair (sender membership, receiver membership) in the same group the
//! ledger keeps a *window* of sender sequence numbers the receiver must get.
//!
//! Why the windows are exact: the reflector serves a group from one socket,
//! in arrival order, and all bots send from one thread. A receiver gets
//! every datagram sent after its confirming JOIN (the one carrying the
//! cookie) reached the reflector and before its LEAVE did, and no other. So
//! a window runs from the sender's next sequence when that JOIN is sent to
//! its next sequence when the LEAVE is sent, with two margins where the
//! order our `sendto` calls were made in need not be the order the reflector
//! sees (bots on different lab hosts reach it over different links):
//! - from the confirming JOIN until its JOIN_ACK arrives, the sender's
//!   datagrams are *uncertain* (accepted, not required); after the ACK they
//!   are certain, since the reflector sent the ACK after admitting the
//!   receiver (causality, no clock involved). A retried JOIN extends this;
//! - datagrams sent less than the *settle* time before a LEAVE are
//!   uncertain too (a LEAVE has no acknowledgement, so a time bound it is;
//!   0 on a path known to keep order).
//!
//! Receipts outside every window are *unexpected*. Missing datagrams are
//! split into *gap* losses (below the highest received sequence) and *tail*
//! losses (after it).

use std::collections::HashMap;
use std::net::SocketAddr;

/// A membership (also the epoch id carried in DATA payloads).
pub type MemId = u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemState {
    /// Created; confirming JOIN not sent yet. Not in the group.
    Pending,
    /// Confirming JOIN sent; the reflector may already count it as a member.
    Joining,
    /// JOIN_ACK received: sends DATA.
    Active,
    Closed,
}

#[derive(Debug)]
struct Mem {
    bot: usize,
    group: SocketAddr,
    state: MemState,
    /// DATA sent so far: the next sequence number.
    next_seq: u32,
    /// (time ns, sequence) of the sends within the settle time, oldest first.
    recent: std::collections::VecDeque<(u64, u32)>,
    /// Wall-clock send time (ns) of each sequence, where the sender told
    /// ([`Ledger::sent_at_wall`]): a lost datagram is placed in time by it.
    wall: Vec<u64>,
}

/// An owed datagram that did not arrive: who sent it, who should have got
/// it, and when it was sent (wall clock, ns; 0 if the sender did not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LostSend {
    pub sender_bot: usize,
    pub receiver_bot: usize,
    pub sent_ns: u64,
}

#[derive(Debug)]
struct Pair {
    tx: MemId,
    /// Lowest sequence accepted (first copy of the confirming JOIN).
    a_min: u32,
    /// Lowest sequence required (last copy of the confirming JOIN).
    a_max: u32,
    /// One past the last sequence accepted; `None` while open.
    end: Option<u32>,
    /// One past the last sequence required, when the receiver's LEAVE came
    /// within the settle time of the sender's last datagrams.
    req_end: Option<u32>,
    /// The receiver's JOIN_ACK has not arrived: what the sender sends now is uncertain.
    young: bool,
    /// Bit `seq - a_min` set when received.
    bits: Vec<u64>,
    dups: u64,
    /// The receiver never became a member: nothing is required.
    void: bool,
}

impl Pair {
    fn covers(&self, seq: u32) -> bool {
        seq >= self.a_min && self.end.is_none_or(|e| seq < e)
    }

    /// Marks `seq`; returns false if it was already there.
    fn mark(&mut self, seq: u32) -> bool {
        let rel = (seq - self.a_min) as usize;
        let (w, b) = (rel / 64, rel % 64);
        if self.bits.len() <= w {
            self.bits.resize(w + 1, 0);
        }
        let fresh = self.bits[w] & (1 << b) == 0;
        self.bits[w] |= 1 << b;
        if !fresh {
            self.dups += 1;
        }
        fresh
    }

    /// How many of the sequences in `[lo, end)` (all >= a_min) were received.
    fn count_range(&self, lo: u32, end: u32) -> u64 {
        if end <= lo {
            return 0;
        }
        let (lo, end) = ((lo - self.a_min) as usize, (end - self.a_min) as usize);
        let mut n = 0u64;
        let (first, last) = (lo / 64, (end - 1) / 64);
        for w in first..=last.min(self.bits.len().saturating_sub(1)) {
            if w >= self.bits.len() {
                break;
            }
            let mut word = self.bits[w];
            if w == first {
                word &= !0u64 << (lo % 64);
            }
            if w == last && end % 64 != 0 {
                word &= (1u64 << (end % 64)) - 1;
            }
            n += u64::from(word.count_ones());
        }
        n
    }

    fn has(&self, seq: u32) -> bool {
        let rel = (seq - self.a_min) as usize;
        self.bits.get(rel / 64).is_some_and(|w| w & (1 << (rel % 64)) != 0)
    }
}

/// Result of recording one received DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receipt {
    New,
    Duplicate,
    /// Not inside any window of this receiver (or an unknown epoch).
    Unexpected,
}

/// Per-bot totals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tally {
    /// DATA sent.
    pub sent: u64,
    /// DATA that had to arrive.
    pub expected: u64,
    /// Distinct required DATA that arrived.
    pub received: u64,
    /// DATA inside a window that arrived again.
    pub duplicates: u64,
    /// DATA in the uncertain start of a window (join retried), accepted.
    pub uncertain: u64,
    /// DATA outside every window.
    pub unexpected: u64,
    /// Required DATA missing below the highest received sequence.
    pub gap_lost: u64,
    /// Required DATA missing after the highest received sequence.
    pub tail_lost: u64,
    /// Memberships (joins that got as far as the confirming JOIN).
    pub memberships: u64,
}

impl Tally {
    pub fn lost(&self) -> u64 {
        self.gap_lost + self.tail_lost
    }

    pub fn add(&mut self, o: &Tally) {
        self.sent += o.sent;
        self.expected += o.expected;
        self.received += o.received;
        self.duplicates += o.duplicates;
        self.uncertain += o.uncertain;
        self.unexpected += o.unexpected;
        self.gap_lost += o.gap_lost;
        self.tail_lost += o.tail_lost;
        self.memberships += o.memberships;
    }
}

/// The ledger of all memberships and windows of one bots process.
#[derive(Debug)]
pub struct Ledger {
    /// Sends this close before a receiver's LEAVE are uncertain (ns).
    settle_ns: u64,
    mems: Vec<Mem>,
    pairs: Vec<Pair>,
    /// Pair indices by receiver membership.
    rx_pairs: Vec<Vec<usize>>,
    /// Pair indices by sender membership.
    tx_pairs: Vec<Vec<usize>>,
    /// Memberships in each group that are Joining or Active.
    groups: HashMap<SocketAddr, Vec<MemId>>,
    /// Per receiving bot: sender membership -> pairs (one per receiver membership).
    rx_index: Vec<HashMap<MemId, Vec<usize>>>,
    unexpected: Vec<u64>,
}

impl Ledger {
    /// A ledger for paths that keep order (loopback, one bridge): no settle time.
    pub fn new(bots: usize) -> Ledger {
        Ledger::with_settle(bots, 0)
    }

    /// A ledger that treats sends within `settle_ns` before a LEAVE as uncertain.
    pub fn with_settle(bots: usize, settle_ns: u64) -> Ledger {
        Ledger {
            settle_ns,
            mems: Vec::new(),
            pairs: Vec::new(),
            rx_pairs: Vec::new(),
            tx_pairs: Vec::new(),
            groups: HashMap::new(),
            rx_index: (0..bots).map(|_| HashMap::new()).collect(),
            unexpected: vec![0; bots],
        }
    }

    /// A bot starts joining `group`; returns the new membership (epoch).
    pub fn new_membership(&mut self, bot: usize, group: SocketAddr) -> MemId {
        self.mems.push(Mem {
            bot,
            group,
            state: MemState::Pending,
            next_seq: 0,
            recent: std::collections::VecDeque::new(),
            wall: Vec::new(),
        });
        self.rx_pairs.push(Vec::new());
        self.tx_pairs.push(Vec::new());
        (self.mems.len() - 1) as MemId
    }

    fn add_pair(&mut self, tx: MemId, rx: MemId, start: u32) {
        let idx = self.pairs.len();
        self.pairs.push(Pair {
            tx,
            a_min: start,
            a_max: start,
            end: None,
            req_end: None,
            young: true,
            bits: Vec::new(),
            dups: 0,
            void: false,
        });
        self.rx_pairs[rx as usize].push(idx);
        self.tx_pairs[tx as usize].push(idx);
        let bot = self.mems[rx as usize].bot;
        self.rx_index[bot].entry(tx).or_default().push(idx);
    }

    /// The confirming JOIN (with cookie) of `m` was just sent (again).
    pub fn join_sent(&mut self, m: MemId) {
        let mi = m as usize;
        match self.mems[mi].state {
            MemState::Pending => {
                self.mems[mi].state = MemState::Joining;
                let group = self.mems[mi].group;
                let senders: Vec<MemId> = self
                    .groups
                    .get(&group)
                    .map(|v| {
                        v.iter()
                            .copied()
                            .filter(|&t| self.mems[t as usize].state == MemState::Active)
                            .collect()
                    })
                    .unwrap_or_default();
                for t in senders {
                    let start = self.mems[t as usize].next_seq;
                    self.add_pair(t, m, start);
                }
                self.groups.entry(group).or_default().push(m);
            }
            MemState::Joining => {
                // A retry: anything its sender sent before now is uncertain,
                // and so is what it sends until the JOIN_ACK.
                for &p in &self.rx_pairs[mi] {
                    let tx = self.pairs[p].tx as usize;
                    self.pairs[p].a_max = self.mems[tx].next_seq;
                    self.pairs[p].young = true;
                }
            }
            MemState::Active | MemState::Closed => {}
        }
    }

    /// `m` got its JOIN_ACK: from now on it sends, to everyone in the group.
    pub fn joined(&mut self, m: MemId) {
        let mi = m as usize;
        if self.mems[mi].state != MemState::Joining {
            return;
        }
        self.mems[mi].state = MemState::Active;
        // Admitted for sure: from now on its senders' datagrams are required.
        for &p in &self.rx_pairs[mi] {
            self.pairs[p].young = false;
        }
        let group = self.mems[mi].group;
        let receivers: Vec<MemId> = self
            .groups
            .get(&group)
            .map(|v| v.iter().copied().filter(|&r| r != m).collect())
            .unwrap_or_default();
        for r in receivers {
            self.add_pair(m, r, 0);
            // The receiver was admitted before us (or its pairs say otherwise).
            let p = self.pairs.len() - 1;
            self.pairs[p].young = self.mems[r as usize].state == MemState::Joining;
        }
    }

    /// `m` sends DATA: returns the sequence number to put in it. Only
    /// active memberships send.
    pub fn next_seq(&mut self, m: MemId) -> Option<u32> {
        self.next_seq_at(m, 0)
    }

    /// [`Ledger::next_seq`] at `now_ns` (a monotonic clock).
    pub fn next_seq_at(&mut self, m: MemId, now_ns: u64) -> Option<u32> {
        let mem = &mut self.mems[m as usize];
        if mem.state != MemState::Active {
            return None;
        }
        let s = mem.next_seq;
        mem.next_seq += 1;
        if self.settle_ns > 0 {
            mem.recent.push_back((now_ns, s));
            while mem
                .recent
                .front()
                .is_some_and(|&(t, _)| now_ns.saturating_sub(t) >= self.settle_ns)
            {
                mem.recent.pop_front();
            }
        }
        for &p in &self.tx_pairs[m as usize] {
            let pair = &mut self.pairs[p];
            if pair.young && pair.end.is_none() {
                pair.a_max = s + 1;
            }
        }
        Some(s)
    }

    /// The wall-clock time of `m`'s last sequence handed out (call right
    /// after [`Ledger::next_seq_at`]).
    pub fn sent_at_wall(&mut self, m: MemId, wall_ns: u64) {
        if let Some(mem) = self.mems.get_mut(m as usize) {
            let n = mem.next_seq as usize;
            // Earlier sequences not stamped keep 0 ("not said").
            mem.wall.resize(n.saturating_sub(1), 0);
            mem.wall.push(wall_ns);
        }
    }

    /// The group (reflector address and port) of membership `m`.
    pub fn group_of(&self, m: MemId) -> Option<SocketAddr> {
        self.mems.get(m as usize).map(|x| x.group)
    }

    /// The bot of membership `m`.
    pub fn bot_of(&self, m: MemId) -> Option<usize> {
        self.mems.get(m as usize).map(|x| x.bot)
    }

    /// Whether `m` got its JOIN_ACK and has not ended.
    pub fn is_active(&self, m: MemId) -> bool {
        self.mems.get(m as usize).is_some_and(|x| x.state == MemState::Active)
    }

    /// Every owed datagram that did not arrive, as [`Ledger::finish`]
    /// counts them (gap and tail losses), at most `max` (call after
    /// `finish`).
    pub fn lost_sends(&self, max: usize) -> Vec<LostSend> {
        let mut out = Vec::new();
        for (mi, mem) in self.mems.iter().enumerate() {
            for &p in &self.rx_pairs[mi] {
                let pair = &self.pairs[p];
                if pair.void {
                    continue;
                }
                let accepted_end = pair.end.unwrap_or(pair.a_max);
                let end = pair.req_end.map_or(accepted_end, |r| r.min(accepted_end));
                let tx = &self.mems[pair.tx as usize];
                for s in pair.a_max..end {
                    if pair.has(s) {
                        continue;
                    }
                    if out.len() >= max {
                        return out;
                    }
                    out.push(LostSend {
                        sender_bot: tx.bot,
                        receiver_bot: mem.bot,
                        sent_ns: tx.wall.get(s as usize).copied().unwrap_or(0),
                    });
                }
            }
        }
        out
    }

    /// DATA sent by `m` so far.
    pub fn sent(&self, m: MemId) -> u32 {
        self.mems.get(m as usize).map_or(0, |x| x.next_seq)
    }

    /// `m` ends: its LEAVE was just sent (or it learnt it is no member).
    pub fn ended(&mut self, m: MemId) {
        self.close(m, None);
    }

    /// [`Ledger::ended`] at `now_ns`: the senders' datagrams of the last
    /// settle time may or may not have beaten the LEAVE to the reflector.
    pub fn ended_at(&mut self, m: MemId, now_ns: u64) {
        self.close(m, Some(now_ns));
    }

    fn close(&mut self, m: MemId, now_ns: Option<u64>) {
        let mi = m as usize;
        if self.mems[mi].state == MemState::Closed {
            return;
        }
        let was = self.mems[mi].state;
        self.mems[mi].state = MemState::Closed;
        if was == MemState::Pending {
            return;
        }
        let settle = self.settle_ns;
        for &p in &self.rx_pairs[mi] {
            let tx = &self.mems[self.pairs[p].tx as usize];
            if self.pairs[p].end.is_none() {
                self.pairs[p].end = Some(tx.next_seq);
                if let Some(now) = now_ns.filter(|_| settle > 0) {
                    let first_recent = tx.recent.iter().find(|&&(t, _)| now.saturating_sub(t) < settle);
                    self.pairs[p].req_end = first_recent.map(|&(_, s)| s);
                }
            }
        }
        let sent = self.mems[mi].next_seq;
        for &p in &self.tx_pairs[mi] {
            if self.pairs[p].end.is_none() {
                self.pairs[p].end = Some(sent);
            }
        }
        let group = self.mems[mi].group;
        if let Some(v) = self.groups.get_mut(&group) {
            v.retain(|&x| x != m);
        }
    }

    /// The join of `m` was refused: it never was a member, so it need not
    /// have received anything.
    pub fn join_failed(&mut self, m: MemId) {
        let mi = m as usize;
        if self.mems[mi].state == MemState::Joining {
            for &p in &self.rx_pairs[mi] {
                self.pairs[p].void = true;
            }
        }
        self.ended(m);
    }

    /// Records DATA (sender epoch `tx`, sequence `seq`) received by `bot`.
    pub fn received(&mut self, bot: usize, tx: MemId, seq: u32) -> Receipt {
        let found = self
            .rx_index
            .get(bot)
            .and_then(|m| m.get(&tx))
            .and_then(|ps| ps.iter().copied().find(|&p| self.pairs[p].covers(seq)));
        match found {
            Some(p) if self.pairs[p].mark(seq) => Receipt::New,
            Some(_) => Receipt::Duplicate,
            None => {
                if let Some(u) = self.unexpected.get_mut(bot) {
                    *u += 1;
                }
                Receipt::Unexpected
            }
        }
    }

    /// Required datagrams not received yet, counting open windows up to
    /// what their senders have sent so far: 0 means nothing is in flight.
    pub fn missing(&self) -> u64 {
        self.pairs
            .iter()
            .filter(|p| !p.void)
            .map(|p| {
                let end = p.req_end.or(p.end).unwrap_or(self.mems[p.tx as usize].next_seq);
                if end <= p.a_max {
                    return 0;
                }
                u64::from(end - p.a_max) - p.count_range(p.a_max, end)
            })
            .sum()
    }

    /// Closes every open membership (the run is over and in-flight DATA had
    /// its grace period) and totals per bot.
    pub fn finish(&mut self) -> Vec<Tally> {
        for m in 0..self.mems.len() as MemId {
            self.ended(m);
        }
        let mut out = vec![Tally::default(); self.rx_index.len()];
        for (bot, u) in self.unexpected.iter().enumerate() {
            out[bot].unexpected = *u;
        }
        for (mi, mem) in self.mems.iter().enumerate() {
            let t = &mut out[mem.bot];
            t.sent += u64::from(mem.next_seq);
            for &p in &self.rx_pairs[mi] {
                let pair = &self.pairs[p];
                let accepted_end = pair.end.unwrap_or(pair.a_max);
                // Required up to req_end; what follows, up to end, is uncertain.
                let end = pair.req_end.map_or(accepted_end, |r| r.min(accepted_end));
                t.duplicates += pair.dups;
                if pair.void {
                    // Never a member: whatever arrived was not owed.
                    t.unexpected += (pair.a_min..accepted_end).filter(|&s| pair.has(s)).count() as u64;
                    continue;
                }
                let mut uncertain = 0u64;
                for s in (pair.a_min..pair.a_max.min(end)).chain(end.max(pair.a_max)..accepted_end) {
                    if pair.has(s) {
                        uncertain += 1;
                    }
                }
                t.uncertain += uncertain;
                let lo = pair.a_max;
                if end <= lo {
                    continue;
                }
                t.expected += u64::from(end - lo);
                let mut got = 0u64;
                let mut highest = None;
                for s in lo..end {
                    if pair.has(s) {
                        got += 1;
                        highest = Some(s);
                    }
                }
                t.received += got;
                let tail_from = highest.map_or(lo, |h| h + 1);
                let tail = u64::from(end - tail_from);
                let lost = u64::from(end - lo) - got;
                t.tail_lost += tail;
                t.gap_lost += lost - tail;
            }
        }
        for (mi, mem) in self.mems.iter().enumerate() {
            if !self.rx_pairs[mi].is_empty() || !self.tx_pairs[mi].is_empty() || mem.next_seq > 0 {
                out[mem.bot].memberships += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Joins `bot` to `group` cleanly; returns its membership.
    fn join(l: &mut Ledger, bot: usize, group: SocketAddr) -> MemId {
        let m = l.new_membership(bot, group);
        l.join_sent(m);
        l.joined(m);
        m
    }

    /// `m` (of `bot`) sends `n` datagrams, delivered to each `(bot, delivered?)`.
    fn send(l: &mut Ledger, m: MemId, n: u32, to: &[usize]) -> Vec<u32> {
        let mut seqs = Vec::new();
        for _ in 0..n {
            let s = l.next_seq(m).unwrap();
            for &r in to {
                assert_eq!(l.received(r, m, s), Receipt::New);
            }
            seqs.push(s);
        }
        seqs
    }

    #[test]
    fn lost_sends_name_each_missing_datagram_and_its_send_time() {
        let mut l = Ledger::new(3);
        let m: Vec<MemId> = (0..3).map(|b| join(&mut l, b, g(1))).collect();
        // Bot 0 sends 4 at wall times 100..=103: bot 1 misses #1, bot 2
        // misses #1 and #3.
        for (s, t) in (0..4).zip(100..) {
            assert_eq!(l.next_seq_at(m[0], 0), Some(s));
            l.sent_at_wall(m[0], t);
            if s != 1 {
                assert_eq!(l.received(1, m[0], s), Receipt::New);
            }
            if s % 2 == 0 {
                assert_eq!(l.received(2, m[0], s), Receipt::New);
            }
        }
        let t = l.finish();
        assert_eq!(t[1].lost() + t[2].lost(), 3);
        let mut lost = l.lost_sends(10);
        lost.sort_by_key(|x| (x.receiver_bot, x.sent_ns));
        let as_tuples: Vec<_> = lost.iter().map(|x| (x.sender_bot, x.receiver_bot, x.sent_ns)).collect();
        assert_eq!(as_tuples, [(0, 1, 101), (0, 2, 101), (0, 2, 103)]);
        assert_eq!(l.lost_sends(2).len(), 2, "bounded");
    }

    #[test]
    fn no_churn_is_exact() {
        let mut l = Ledger::new(3);
        let m: Vec<MemId> = (0..3).map(|b| join(&mut l, b, g(1))).collect();
        for (b, &mm) in m.iter().enumerate() {
            let others: Vec<usize> = (0..3).filter(|&x| x != b).collect();
            send(&mut l, mm, 10, &others);
        }
        let t = l.finish();
        for tb in &t {
            assert_eq!(tb.sent, 10);
            assert_eq!(tb.expected, 20);
            assert_eq!(tb.received, 20);
            assert_eq!(tb.lost(), 0);
            assert_eq!(tb.memberships, 1);
        }
    }

    #[test]
    fn gaps_tails_and_duplicates() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        let _b = join(&mut l, 1, g(1));
        for s in 0..10 {
            assert_eq!(l.next_seq(a), Some(s));
        }
        // Bot 1 gets 0..10 except 3 and 4, then 8, 9 never arrive; 5 twice.
        for s in [0, 1, 2, 5, 5, 6, 7] {
            l.received(1, a, s);
        }
        assert_eq!(l.received(1, a, 5), Receipt::Duplicate);
        let t = l.finish();
        assert_eq!(t[1].expected, 10);
        assert_eq!(t[1].received, 6);
        assert_eq!(t[1].gap_lost, 2);
        assert_eq!(t[1].tail_lost, 2);
        assert_eq!(t[1].duplicates, 2);
        assert_eq!(t[0].sent, 10);
        assert_eq!(t[0].expected, 0);
    }

    #[test]
    fn missing_tracks_what_is_in_flight() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        join(&mut l, 1, g(1));
        assert_eq!(l.missing(), 0);
        for _ in 0..200 {
            l.next_seq(a);
        }
        assert_eq!(l.missing(), 200);
        for s in (0..200).filter(|s| s % 7 != 0) {
            l.received(1, a, s);
        }
        assert_eq!(l.missing(), 29);
        for s in (0..200).filter(|s| s % 7 == 0) {
            l.received(1, a, s);
        }
        assert_eq!(l.missing(), 0);
        let p = Pair {
            tx: 0,
            a_min: 3,
            a_max: 3,
            end: None,
            req_end: None,
            young: false,
            bits: vec![!0, !0],
            dups: 0,
            void: false,
        };
        assert_eq!(p.count_range(3, 3 + 128), 128);
        assert_eq!(p.count_range(3 + 60, 3 + 70), 10);
        assert_eq!(p.count_range(3 + 64, 3 + 200), 64);
        assert_eq!(p.count_range(3 + 5, 3 + 5), 0);
    }

    #[test]
    fn everything_lost_is_tail() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        join(&mut l, 1, g(1));
        for _ in 0..4 {
            l.next_seq(a);
        }
        let t = l.finish();
        assert_eq!((t[1].expected, t[1].tail_lost, t[1].gap_lost), (4, 4, 0));
    }

    #[test]
    fn windows_follow_joins_and_leaves() {
        let mut l = Ledger::new(3);
        let a = join(&mut l, 0, g(1));
        send(&mut l, a, 3, &[]); // alone: nobody must receive 0..3
        let b = join(&mut l, 1, g(1));
        send(&mut l, a, 2, &[1]); // 3, 4 to bot 1
        send(&mut l, b, 2, &[0]);
        l.ended(b); // bot 1 leaves group 1 ...
        let b2 = join(&mut l, 1, g(2)); // ... for group 2, where it is alone
        send(&mut l, a, 2, &[]); // 5, 6: nobody
        send(&mut l, b2, 5, &[]);
        // A late copy of a's seq 4 (sent while bot 1 was in group 1) is fine;
        // seq 5 (sent after it left) is unexpected; an unknown epoch too.
        assert_eq!(l.received(1, a, 4), Receipt::Duplicate);
        assert_eq!(l.received(1, a, 5), Receipt::Unexpected);
        assert_eq!(l.received(1, 99, 0), Receipt::Unexpected);
        assert_eq!(l.received(7, a, 0), Receipt::Unexpected);
        let t = l.finish();
        assert_eq!((t[0].sent, t[0].expected, t[0].received, t[0].lost()), (7, 2, 2, 0));
        assert_eq!((t[1].sent, t[1].expected, t[1].received, t[1].lost()), (7, 2, 2, 0));
        assert_eq!((t[1].unexpected, t[1].duplicates, t[1].memberships), (2, 1, 2));
    }

    #[test]
    fn rejoining_the_same_group_is_a_new_epoch() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        let b1 = join(&mut l, 1, g(1));
        send(&mut l, a, 2, &[1]);
        l.ended(b1);
        send(&mut l, a, 2, &[]);
        let b2 = join(&mut l, 1, g(1));
        send(&mut l, a, 2, &[1]); // seqs 4, 5 go to b2's window
        l.next_seq(b2);
        let t = l.finish();
        assert_eq!((t[1].expected, t[1].received, t[1].lost()), (4, 4, 0));
        assert_eq!(t[0].tail_lost, 1); // b2's only datagram never reached bot 0
    }

    #[test]
    fn retried_join_makes_the_start_uncertain() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        l.next_seq(a); // 0: before bot 1's join
        let b = l.new_membership(1, g(1));
        l.join_sent(b);
        l.next_seq(a); // 1: the first JOIN copy may or may not have counted
        l.join_sent(b); // retry
        l.joined(b);
        l.next_seq(a); // 2: required
        assert_eq!(l.received(1, a, 0), Receipt::Unexpected);
        assert_eq!(l.received(1, a, 1), Receipt::New);
        assert_eq!(l.received(1, a, 2), Receipt::New);
        let t = l.finish();
        assert_eq!(
            (t[1].expected, t[1].received, t[1].uncertain, t[1].lost()),
            (1, 1, 1, 0)
        );
    }

    #[test]
    fn a_refused_join_requires_nothing() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(1));
        let b = l.new_membership(1, g(1));
        l.join_sent(b);
        l.next_seq(a);
        l.join_failed(b);
        l.next_seq(a);
        let t = l.finish();
        assert_eq!((t[1].expected, t[1].lost()), (0, 0));
        assert_eq!(t[0].sent, 2);
    }

    #[test]
    fn joiner_receives_from_senders_that_join_while_it_waits() {
        let mut l = Ledger::new(2);
        let b = l.new_membership(1, g(1));
        l.join_sent(b); // bot 1 waits for its ACK
        let a = join(&mut l, 0, g(1));
        l.next_seq(a);
        l.joined(b);
        assert_eq!(l.received(1, a, 0), Receipt::New);
        l.next_seq(a);
        assert_eq!(l.received(1, a, 1), Receipt::New);
        let t = l.finish();
        // Seq 0 was sent before b's JOIN_ACK: accepted but not owed (over
        // separate links it may reach the reflector before b's JOIN). Seq 1
        // came after the ACK: owed.
        assert_eq!((t[1].expected, t[1].received, t[1].uncertain), (1, 1, 1));
    }

    use proptest::prelude::*;

    /// A reference model of a group server: delivers each DATA at once to
    /// everyone who is a member at that moment, unless told to drop it.
    #[derive(Debug, Clone)]
    enum Op {
        /// Bot joins group (if not in one) or moves to it.
        Join(usize, u16),
        Leave(usize),
        /// Bot sends; the copy to receiver `drop_for` (if any) is lost.
        Send(usize, Option<usize>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..4usize, 1..3u16).prop_map(|(b, g)| Op::Join(b, g)),
            (0..4usize).prop_map(Op::Leave),
            (0..4usize, proptest::option::of(0..4usize)).prop_map(|(b, d)| Op::Send(b, d)),
            (0..4usize).prop_map(|b| Op::Send(b, None)),
        ]
    }

    proptest! {
        #[test]
        fn ledger_matches_a_reference_model(ops in proptest::collection::vec(op(), 0..120)) {
            let mut l = Ledger::new(4);
            let mut cur: [Option<(MemId, u16)>; 4] = [None; 4];
            let (mut delivered, mut dropped) = ([0u64; 4], [0u64; 4]);
            for o in ops {
                match o {
                    Op::Join(b, grp) => {
                        if let Some((m, _)) = cur[b].take() {
                            l.ended(m);
                        }
                        cur[b] = Some((join(&mut l, b, g(grp)), grp));
                    }
                    Op::Leave(b) => {
                        if let Some((m, _)) = cur[b].take() {
                            l.ended(m);
                        }
                    }
                    Op::Send(b, drop_for) => {
                        let Some((m, grp)) = cur[b] else { continue };
                        let s = l.next_seq(m).unwrap();
                        for r in 0..4 {
                            if r == b || cur[r].map(|c| c.1) != Some(grp) {
                                continue;
                            }
                            if drop_for == Some(r) {
                                dropped[r] += 1;
                            } else {
                                prop_assert_eq!(l.received(r, m, s), Receipt::New);
                                delivered[r] += 1;
                            }
                        }
                    }
                }
            }
            let t = l.finish();
            for r in 0..4 {
                prop_assert_eq!(t[r].received, delivered[r]);
                prop_assert_eq!(t[r].lost(), dropped[r]);
                prop_assert_eq!(t[r].expected, delivered[r] + dropped[r]);
                prop_assert_eq!(t[r].unexpected + t[r].duplicates + t[r].uncertain, 0);
            }
        }
    }
    #[test]
    fn datagrams_before_the_join_ack_are_uncertain_not_owed() {
        let mut l = Ledger::new(2);
        let a = join(&mut l, 0, g(4000));
        let b = l.new_membership(1, g(4000));
        l.join_sent(b);
        // Sent while b's JOIN may still be on its way: b may or may not get them.
        let early = [l.next_seq(a).unwrap(), l.next_seq(a).unwrap()];
        assert_eq!(l.received(1, a, early[1]), Receipt::New);
        l.joined(b);
        let owed = send(&mut l, a, 3, &[1]);
        assert_eq!(owed, vec![2, 3, 4]);
        assert_eq!(l.missing(), 0);
        let t = l.finish();
        assert_eq!((t[1].expected, t[1].received, t[1].lost()), (3, 3, 0));
        assert_eq!(t[1].uncertain, 1, "the early datagram that did arrive");
    }

    #[test]
    fn datagrams_just_before_a_leave_are_uncertain_with_a_settle_time() {
        const MS: u64 = 1_000_000;
        for (settle, owed_last) in [(20 * MS, false), (0, true)] {
            let mut l = Ledger::with_settle(2, settle);
            let a = join(&mut l, 0, g(4000));
            let b = join(&mut l, 1, g(4000));
            for (i, at) in [0, 100, 195].into_iter().enumerate() {
                let s = l.next_seq_at(a, at * MS).unwrap();
                assert_eq!(s, i as u32);
                if s < 2 {
                    assert_eq!(l.received(1, a, s), Receipt::New);
                }
            }
            // b leaves at 200 ms; seq 2 (sent at 195 ms) may have been beaten by the LEAVE.
            l.ended_at(b, 200 * MS);
            let t = l.finish();
            if owed_last {
                assert_eq!((t[1].expected, t[1].received, t[1].tail_lost), (3, 2, 1));
            } else {
                assert_eq!((t[1].expected, t[1].received, t[1].lost()), (2, 2, 0));
            }
        }
    }

    #[test]
    fn an_uncertain_tail_datagram_that_arrives_is_counted_as_such() {
        let mut l = Ledger::with_settle(2, 1_000);
        let a = join(&mut l, 0, g(4000));
        let b = join(&mut l, 1, g(4000));
        let s = l.next_seq_at(a, 10_000).unwrap();
        l.ended_at(b, 10_500);
        assert_eq!(l.received(1, a, s), Receipt::New);
        let t = l.finish();
        assert_eq!(
            (t[1].expected, t[1].uncertain, t[1].lost(), t[1].unexpected),
            (0, 1, 0, 0)
        );
    }
}
