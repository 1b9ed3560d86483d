//! Sealed groups (docs/protocol.md, "Sealed payloads"): the epoch keys the
//! client holds, per group and cell; the sender key it seals under; the
//! one [`Receiver`] that opens every sealed group's DATA (one replay window
//! per sender and instance, across groups); and the `/keys` refresh, run on
//! a helper thread as token requests are, so the game loop never waits on
//! HTTP.
//!
//! Which key a sealed DATA goes under: the newest epoch that has started of
//! the *first* cell of the sending group's keys. The client puts the
//! player's own cell (the grant's `cell`) first when it reads a control
//! server's answer ([`crate::cell_keys`]), so this is the cell the player
//! is in, among the cells the group serves; a group whose grant named no
//! cell of its own seals under its first cell in row order.

use crate::token::{CellKey, ControlError};
use crate::GroupKey;
use reflector_proto::sealed::{CellId, EpochKey, OpenError, Receiver, SealedWithoutInstance, SenderKey, OVERLAP_S};
use std::sync::mpsc;
use std::time::Duration;

/// A client asks `/keys` for a group when the newest key of one of its
/// cells is within [`OVERLAP_S`] of its end, plus a random delay below
/// this: the control server hands out the next epoch's key from then on,
/// and the jitter spreads the requests of players who joined together.
pub const KEYS_REFRESH_JITTER: Duration = Duration::from_secs(3);

/// The first wait after a `/keys` request that failed or brought no newer
/// key; it doubles with each, up to [`KEYS_RETRY_MAX`] (a 429's
/// `Retry-After` is waited in full when longer).
pub const KEYS_RETRY_FIRST: Duration = Duration::from_secs(2);

/// The longest wait between two `/keys` requests for a group that needs
/// keys.
pub const KEYS_RETRY_MAX: Duration = Duration::from_secs(60);

const W_MS: u64 = OVERLAP_S * 1000;

/// What a group's JOIN_ACK says about its DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupSealing {
    Clear,
    Sealed,
    /// Sealed without the instance flag: a misconfigured reflector. What
    /// it forwards is treated as sealed; nothing is sent there.
    Misconfigured(u8),
}

impl GroupSealing {
    pub(crate) fn of_flags(flags: u8) -> GroupSealing {
        match reflector_proto::sealed::group_is_sealed(flags) {
            Ok(false) => GroupSealing::Clear,
            Ok(true) => GroupSealing::Sealed,
            Err(SealedWithoutInstance(f)) => GroupSealing::Misconfigured(f),
        }
    }
}

/// One key held, for the group whose grant (or `/keys` answer) brought it.
struct HeldKey {
    group: GroupKey,
    key: CellKey,
}

/// A group's sealing bookkeeping: its cells in sending order and when its
/// next `/keys` request may go.
struct GroupKeys {
    group: GroupKey,
    /// The cells of the latest grant with keys, the player's own first.
    cells: Vec<CellId>,
    /// This group's jitter on its refresh moment, drawn when it was added.
    jitter_ms: u64,
    /// No `/keys` request before then (Unix ms): a failure's backoff, a
    /// 429's `Retry-After`, or an answer that brought no newer key.
    not_before_unix_ms: u64,
    /// The wait after the next failure.
    backoff: Duration,
    /// A MOVED asked for this group's keys again.
    moved: bool,
}

/// A `/keys` answer from the helper thread.
pub(crate) type KeysResult = Result<Vec<CellKey>, ControlError>;

/// The client's sealing state (see the module docs).
pub(crate) struct Sealing {
    held: Vec<HeldKey>,
    groups: Vec<GroupKeys>,
    /// Our own sender keys, one per (cell, epoch, player) sealed under:
    /// each remembers the last sequence it sealed.
    senders: Vec<((CellId, u32, u32), SenderKey)>,
    pub(crate) receiver: Receiver,
    /// The `/keys` request in flight, for its group.
    pub(crate) fetching: Option<(GroupKey, mpsc::Receiver<KeysResult>)>,
    /// Our checkpoint signing key, the certificates, the opened snapshots.
    pub(crate) checkpoints: crate::sealed_checkpoint::CheckpointSigning,
}

impl Sealing {
    /// `max_windows`: the (player, instance) replay windows kept at once.
    pub(crate) fn new(max_windows: usize) -> Sealing {
        Sealing {
            held: Vec::new(),
            groups: Vec::new(),
            senders: Vec::new(),
            receiver: Receiver::new(max_windows),
            fetching: None,
            checkpoints: crate::sealed_checkpoint::CheckpointSigning::new(),
        }
    }

    /// Holds `keys` for `group` (a key of the same group, cell and epoch is
    /// replaced; the others stay until [`OVERLAP_S`] after their end).
    /// `grant`: they come with a grant, whose cell order (the player's own
    /// first) becomes the group's; a `/keys` answer keeps the order held.
    pub(crate) fn add(&mut self, group: GroupKey, keys: &[CellKey], grant: bool) {
        for k in keys {
            let same = |h: &HeldKey| {
                h.group == group && h.key.key.cell() == k.key.cell() && h.key.key.epoch() == k.key.epoch()
            };
            match self.held.iter_mut().find(|h| same(h)) {
                Some(h) => h.key = k.clone(),
                None => self.held.push(HeldKey { group, key: k.clone() }),
            }
            self.receiver.add_epoch_key(k.key.clone());
        }
        if keys.is_empty() {
            return;
        }
        let g = match self.groups.iter().position(|g| g.group == group) {
            Some(i) => &mut self.groups[i],
            None => {
                let jitter_ms = crate::random_u64() % (KEYS_REFRESH_JITTER.as_millis() as u64).max(1);
                self.groups.push(GroupKeys {
                    group,
                    cells: Vec::new(),
                    jitter_ms,
                    not_before_unix_ms: 0,
                    backoff: KEYS_RETRY_FIRST,
                    moved: false,
                });
                self.groups.last_mut().expect("just pushed")
            }
        };
        if grant || g.cells.is_empty() {
            g.cells.clear();
            for k in keys {
                if !g.cells.contains(&k.key.cell()) {
                    g.cells.push(k.key.cell());
                }
            }
        }
    }

    /// Drops every key [`OVERLAP_S`] after its epoch ended, with the
    /// sender keys derived from it.
    pub(crate) fn prune(&mut self, now_unix_ms: u64) {
        let expired = |k: &CellKey| now_unix_ms >= k.ends_unix_s.saturating_mul(1000).saturating_add(W_MS);
        if !self.held.iter().any(|h| expired(&h.key)) {
            return;
        }
        let gone: Vec<(CellId, u32)> = self
            .held
            .iter()
            .filter(|h| expired(&h.key))
            .map(|h| (h.key.key.cell(), h.key.key.epoch()))
            .collect();
        self.held.retain(|h| !expired(&h.key));
        for (cell, epoch) in gone {
            // Another group may hold the same cell's key (a cell served
            // twice during a re-placement) with a later end.
            if self
                .held
                .iter()
                .any(|h| h.key.key.cell() == cell && h.key.key.epoch() == epoch)
            {
                continue;
            }
            self.receiver.remove_epoch_key(cell, epoch);
            self.senders.retain(|&((c, e, _), _)| !(c == cell && e == epoch));
        }
    }

    /// When the next key is dropped (Unix ms).
    pub(crate) fn next_prune_unix_ms(&self) -> Option<u64> {
        self.held
            .iter()
            .map(|h| h.key.ends_unix_s.saturating_mul(1000).saturating_add(W_MS))
            .min()
    }

    /// Our sender key for a DATA to `group` at `now_unix_ms`: under the
    /// newest started epoch of the group's first cell (module docs).
    pub(crate) fn sending_key(
        &mut self,
        group: GroupKey,
        now_unix_ms: u64,
        player: u32,
        instance: u64,
    ) -> Option<&mut SenderKey> {
        let cell = *self.groups.iter().find(|g| g.group == group)?.cells.first()?;
        let key = self
            .held
            .iter()
            .filter(|h| h.group == group && h.key.key.cell() == cell)
            .filter(|h| h.key.starts_unix_s.saturating_mul(1000) <= now_unix_ms)
            .max_by_key(|h| h.key.key.epoch())?;
        let epoch = key.key.key.epoch();
        let slot = (cell, epoch, player);
        let i = match self.senders.iter().position(|(s, _)| *s == slot) {
            Some(i) => i,
            None => {
                self.senders.push((slot, key.key.key.sender_key(player, instance)));
                self.senders.len() - 1
            }
        };
        Some(&mut self.senders[i].1)
    }

    /// The key a checkpoint upload to `group` is sealed under
    /// (docs/protocol.md, "Sealed checkpoints", "Which key"): the group's
    /// first cell, as for DATA, but its newest epoch key held, started or
    /// not: inside the overlap window the next epoch's, which every grant
    /// handed out from then on carries, so a joiner can open it.
    pub(crate) fn checkpoint_key(&self, group: GroupKey) -> Option<EpochKey> {
        let cell = *self.groups.iter().find(|g| g.group == group)?.cells.first()?;
        self.held
            .iter()
            .filter(|h| h.group == group && h.key.key.cell() == cell)
            .max_by_key(|h| h.key.key.epoch())
            .map(|h| h.key.key.clone())
    }

    /// Every epoch key held for `group` (its grant's and `/keys`'
    /// answers', each until [`OVERLAP_S`] after its end): what a joiner
    /// checks a checkpoint of that group against, never another group's.
    pub(crate) fn group_keys(&self, group: GroupKey) -> Vec<EpochKey> {
        self.held
            .iter()
            .filter(|h| h.group == group)
            .map(|h| h.key.key.clone())
            .collect()
    }

    /// When `group`'s next `/keys` request is due (Unix ms), if it needs
    /// one: after a MOVED, or when the newest key of one of its cells is
    /// within [`OVERLAP_S`] of its end (plus the group's jitter); never
    /// before a backoff's end.
    pub(crate) fn refresh_due_unix_ms(&self, group: GroupKey) -> Option<u64> {
        let g = self.groups.iter().find(|g| g.group == group)?;
        let newest_ends = g.cells.iter().filter_map(|&c| {
            self.held
                .iter()
                .filter(|h| h.group == group && h.key.key.cell() == c)
                .map(|h| h.key.ends_unix_s)
                .max()
        });
        let due = if g.moved {
            Some(0)
        } else {
            newest_ends
                .min()
                .map(|end| end.saturating_mul(1000).saturating_sub(W_MS) + g.jitter_ms)
        }?;
        Some(due.max(g.not_before_unix_ms))
    }

    /// The groups that need `/keys` (whether live members or not).
    pub(crate) fn groups(&self) -> impl Iterator<Item = GroupKey> + '_ {
        self.groups.iter().map(|g| g.group)
    }

    /// A MOVED for `group`: its keys are asked for again.
    pub(crate) fn moved(&mut self, group: GroupKey) {
        if let Some(g) = self.groups.iter_mut().find(|g| g.group == group) {
            g.moved = true;
        }
    }

    /// A `/keys` request for `group` went out.
    pub(crate) fn asked(&mut self, group: GroupKey) {
        if let Some(g) = self.groups.iter_mut().find(|g| g.group == group) {
            g.moved = false;
        }
    }

    /// A `/keys` answer for `group` arrived at `now_unix_ms` (its keys
    /// added already): if the group is still due, the answer brought no
    /// newer key (the next epoch's is not handed out yet: clocks differ),
    /// so the next request backs off.
    pub(crate) fn answered(&mut self, group: GroupKey, now_unix_ms: u64) {
        let still_due = self.refresh_due_unix_ms(group).is_some_and(|t| t <= now_unix_ms);
        if let Some(g) = self.groups.iter_mut().find(|g| g.group == group) {
            if still_due {
                g.not_before_unix_ms = now_unix_ms + g.backoff.as_millis() as u64;
                g.backoff = (g.backoff * 2).min(KEYS_RETRY_MAX);
            } else {
                g.backoff = KEYS_RETRY_FIRST;
            }
        }
    }

    /// A `/keys` request for `group` failed: the next waits the backoff,
    /// or `retry_after` (a 429's) when that is longer.
    pub(crate) fn failed(&mut self, group: GroupKey, now_unix_ms: u64, retry_after: Option<Duration>) {
        if let Some(g) = self.groups.iter_mut().find(|g| g.group == group) {
            let wait = retry_after.map_or(g.backoff, |r| r.max(g.backoff));
            g.not_before_unix_ms = now_unix_ms + wait.as_millis() as u64;
            g.backoff = (g.backoff * 2).min(KEYS_RETRY_MAX);
        }
    }
}

/// The [`crate::Stats`] counter a receiving step's refusal goes to.
pub(crate) fn count(stats: &mut crate::Stats, e: OpenError) {
    match e {
        OpenError::Malformed => stats.sealed_malformed += 1,
        OpenError::Version => stats.sealed_version += 1,
        OpenError::NoKey => stats.sealed_no_key += 1,
        OpenError::Replay => stats.sealed_replay += 1,
        OpenError::Bad => stats.sealed_bad += 1,
        OpenError::Duplicate => stats.sealed_duplicate += 1,
    }
}

impl<D: crate::Driver> crate::Client<D> {
    /// The `/keys` answer, once the helper thread has it.
    pub(crate) fn poll_keys(&mut self, _now: std::time::Instant) {
        let Some((group, rx)) = &self.sealing.fetching else {
            return;
        };
        let group = *group;
        let res = match rx.try_recv() {
            Ok(r) => r,
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => Err(ControlError::BadAnswer("the request thread ended".into())),
        };
        self.sealing.fetching = None;
        let now_ms = reflector_proto::unix_now_ms();
        match res {
            Ok(keys) => {
                self.stats.keys_refreshes += 1;
                self.sealing.add(group, &keys, false);
                self.sealing.answered(group, now_ms);
            }
            Err(e) => {
                self.stats.keys_refresh_failures += 1;
                let retry_after = match &e {
                    ControlError::RateLimited { retry_after_s, .. } => Some(Duration::from_secs(*retry_after_s)),
                    _ => None,
                };
                self.sealing.failed(group, now_ms, retry_after);
                self.events.push_back(crate::Event::Error(crate::Error::Control(e)));
            }
        }
    }

    /// Drops the keys past their overlap, and asks `/keys` for the first
    /// group that is due (one request at a time; each has its deadline in
    /// [`crate::Client::next_update`] through [`Self::next_keys_due`]).
    pub(crate) fn sealing_timers(&mut self, _now: std::time::Instant) {
        let now_ms = reflector_proto::unix_now_ms();
        self.sealing.prune(now_ms);
        if self.sealing.fetching.is_some() {
            return;
        }
        let Some(c) = self.keys_control() else {
            return;
        };
        let due = self.sealing.groups().find(|&g| {
            self.find(g).is_some_and(|i| self.memberships[i].session.is_member())
                && self.sealing.refresh_due_unix_ms(g).is_some_and(|t| t <= now_ms)
        });
        let Some(group) = due else { return };
        let Some(i) = self.find(group) else { return };
        let req = self.memberships[i].session.rejoin_request();
        let at_unix_s = now_ms / 1000;
        let mac = reflector_proto::sealed::keys_request_mac(&req.keys, &req.token, at_unix_s);
        let (c, player, token) = (c.clone(), req.player, req.token);
        let (tx, rx) = mpsc::channel();
        let signal = crate::wake::SignalOnDrop(std::sync::Arc::clone(&self.wake));
        std::thread::spawn(move || {
            // Dropped last, after the answer is sent (or on a panic).
            let _signal = signal;
            let _ = tx.send(crate::token::fetch_keys(&c, player, &token, at_unix_s, &mac));
        });
        self.sealing.asked(group);
        self.sealing.fetching = Some((group, rx));
        self.stats.keys_requests += 1;
    }

    /// Where `/keys` goes: the control server the client takes its tokens
    /// from, or for a game that hands them in, [`crate::Config::keys_from`].
    fn keys_control(&self) -> Option<&crate::ControlServer> {
        match &self.cfg.token {
            crate::TokenSource::Control(c) => Some(c),
            crate::TokenSource::Given(_) | crate::TokenSource::Later => self.cfg.keys_from.as_ref(),
        }
    }

    /// When the sealing timers next have work (Unix ms): a key to drop, or
    /// a `/keys` request due (only for a client that knows a control
    /// server, for a group it is a member of, none in flight).
    pub(crate) fn next_keys_due(&self) -> Option<u64> {
        let mut next = self.sealing.next_prune_unix_ms();
        if self.sealing.fetching.is_none() && self.keys_control().is_some() {
            for g in self.sealing.groups() {
                let member = self.find(g).is_some_and(|i| self.memberships[i].session.is_member());
                if member {
                    if let Some(t) = self.sealing.refresh_due_unix_ms(g) {
                        next = Some(next.map_or(t, |n| n.min(t)));
                    }
                }
            }
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::sealed::{MasterSecret, WorldId};
    use std::net::SocketAddr;

    const G: GroupKey = (
        SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 4000),
        4000,
    );
    const NOW_S: u64 = 1_800_000_000;
    const NOW_MS: u64 = NOW_S * 1000;

    fn key(col: u32, epoch: u32, starts: u64, ends: u64) -> CellKey {
        let master = MasterSecret::new(&[7; 32]).unwrap();
        let cell = CellId::new(WorldId::from_name("unit"), col, 0).unwrap();
        CellKey {
            cell: [col, 0],
            key: master.epoch_key(cell, epoch),
            starts_unix_s: starts,
            ends_unix_s: ends,
        }
    }

    fn sealed_under(s: &mut Sealing, now_ms: u64) -> Option<(u32, [u8; 8])> {
        let k = s.sending_key(G, now_ms, 7, 9)?;
        // The key's identity shows only in what it seals: seal one byte.
        let h = reflector_proto::protocol::Header {
            kind: reflector_proto::protocol::Kind::Data,
            group: G.1,
            sender: 7,
            membership: 1,
            seq: k.last_sealed() + 1,
        };
        let mut out = [0u8; 128];
        let n = k.seal(&h, 1, None, &mut out).unwrap();
        assert_eq!(n, reflector_proto::sealed::SEALED_MIN + 1);
        let epoch = u32::from_be_bytes(out[field_epoch()].try_into().unwrap());
        Some((epoch, out[reflector_proto::sealed::field::CELL].try_into().unwrap()))
    }

    fn field_epoch() -> std::ops::Range<usize> {
        reflector_proto::sealed::field::EPOCH
    }

    #[test]
    fn it_seals_under_the_first_cells_newest_started_epoch() {
        let mut s = Sealing::new(8);
        let own = key(1, 10, NOW_S - 100, NOW_S + 500);
        let next = key(1, 11, NOW_S + 500, NOW_S + 1100);
        let other = key(2, 10, NOW_S - 100, NOW_S + 500);
        // The grant's order: the player's cell (column 1) first.
        s.add(G, &[own.clone(), other, next.clone()], true);
        let (epoch, cell) = sealed_under(&mut s, NOW_MS).unwrap();
        assert_eq!((epoch, cell), (10, own.key.cell().0), "the next epoch has not started");
        let (epoch, _) = sealed_under(&mut s, (NOW_S + 500) * 1000).unwrap();
        assert_eq!(epoch, 11, "once it has, the newest");
        // Sequences under one sender key only go up (the key remembers).
        let k = s.sending_key(G, NOW_MS, 7, 9).unwrap();
        assert_eq!(k.last_sealed(), 1);
        // No key for another group.
        assert!(s.sending_key((G.0, 4001), NOW_MS, 7, 9).is_none());
    }

    #[test]
    fn keys_go_an_overlap_after_their_end() {
        let mut s = Sealing::new(8);
        s.add(G, &[key(1, 10, NOW_S - 600, NOW_S)], true);
        let drop_at = (NOW_S + OVERLAP_S) * 1000;
        assert_eq!(s.next_prune_unix_ms(), Some(drop_at));
        s.prune(drop_at - 1);
        assert!(
            s.sending_key(G, drop_at - 1, 7, 9).is_some(),
            "still held within W of its end"
        );
        s.prune(drop_at);
        assert!(s.sending_key(G, drop_at, 7, 9).is_none());
        assert_eq!(s.next_prune_unix_ms(), None);
    }

    #[test]
    fn a_refresh_is_due_within_the_overlap_and_backs_off() {
        let mut s = Sealing::new(8);
        assert_eq!(s.refresh_due_unix_ms(G), None, "no keys, nothing to refresh");
        s.add(
            G,
            &[
                key(1, 10, NOW_S - 100, NOW_S + 500),
                key(2, 10, NOW_S - 100, NOW_S + 300),
            ],
            true,
        );
        let jitter = s.groups[0].jitter_ms;
        assert!(jitter < KEYS_REFRESH_JITTER.as_millis() as u64);
        // The cell whose newest key ends first.
        let due = (NOW_S + 300 - OVERLAP_S) * 1000 + jitter;
        assert_eq!(s.refresh_due_unix_ms(G), Some(due));
        // An answer without a newer key: the next waits 2 s, then 4 s.
        s.answered(G, due);
        assert_eq!(s.refresh_due_unix_ms(G), Some(due + 2000));
        s.answered(G, due + 2000);
        assert_eq!(s.refresh_due_unix_ms(G), Some(due + 2000 + 4000));
        // A 429 saying 30 s: 30 s, not the 8 s backoff.
        s.failed(G, due + 6000, Some(Duration::from_secs(30)));
        assert_eq!(s.refresh_due_unix_ms(G), Some(due + 36_000));
        // The next epoch's keys: due an overlap before their end, the
        // backoff reset.
        s.add(G, &[key(2, 11, NOW_S + 300, NOW_S + 900)], false);
        let later = (NOW_S + 500 - OVERLAP_S) * 1000 + jitter;
        s.answered(G, due + 36_000);
        assert_eq!(s.groups[0].backoff, KEYS_RETRY_FIRST);
        assert_eq!(s.refresh_due_unix_ms(G), Some(later));
        // A MOVED: due now (after any backoff), once.
        s.moved(G);
        assert_eq!(s.refresh_due_unix_ms(G), Some(due + 36_000));
        s.asked(G);
        assert_eq!(s.refresh_due_unix_ms(G), Some(later));
    }

    #[test]
    fn a_refresh_keeps_the_grants_cell_order() {
        let mut s = Sealing::new(8);
        let own = key(2, 10, NOW_S - 100, NOW_S + 500);
        s.add(G, &[own.clone(), key(1, 10, NOW_S - 100, NOW_S + 500)], true);
        // /keys answers in row order: column 1 first.
        s.add(
            G,
            &[key(1, 11, NOW_S - 50, NOW_S + 700), key(2, 11, NOW_S - 50, NOW_S + 700)],
            false,
        );
        let (epoch, cell) = sealed_under(&mut s, NOW_MS).unwrap();
        assert_eq!((epoch, cell), (11, own.key.cell().0));
    }
}
