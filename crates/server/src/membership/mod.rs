//! Groups and their members: the reflector's decision logic as a pure state
//! machine. It takes bytes, a source address and the time, and answers what
//! to do (forward, reply, drop and why); it never touches a socket, so every
//! rule is unit-tested deterministically with an injected clock.
//!
//! Rules (paper 000 §3, plus address validation and the player's key,
//! `docs/protocol.md`):
//! - a group is addressed by the UDP port it is served on;
//! - JOIN needs a valid token from the control server, a MAC under the
//!   session key derived from it, *and* a second round trip echoing a
//!   stateless cookie, so a spoofed source never becomes a member and a token
//!   seen on the path is useless without the key;
//! - a membership belongs to the player: every later datagram carries its
//!   random membership id and a MAC (DATA: a tag, when the group has tags)
//!   under the player's key, with a sequence number that must be fresh in
//!   the membership's replay window; anything else is dropped and counted;
//! - an authenticated datagram from a new address does not move the member:
//!   the reflector sends that address a PROBE, and only a PROBE_REPLY from it
//!   under the key moves the member (NAT rebinding); the window does not move
//!   before that, so a replay from a spoofed source changes nothing;
//! - no reply is ever larger than the datagram that caused it, and every
//!   reply comes out of the budget of whoever caused it ([`Payer`]): a
//!   member's own (rebinding PROBEs, its re-JOINs), a verified player's
//!   (JOIN_CHALLENGEs), or, for replies nobody can verify, one small global
//!   budget the caller keeps ([`ReplyBudget::admit`]); so a spoofed flood
//!   drains only the global budget and real players keep theirs;
//! - one player's datagram never ends another player's membership: a JOIN
//!   or a rebind onto an address another member holds is refused
//!   (ERROR(Retry), or not moved) while that member is PROBEd under its own
//!   key, twice, about 500 ms apart; it is removed only if it answers
//!   neither;
//! - a membership lives at most until its token expires (wall clock); a
//!   member extends it by renewing: a JOIN with its membership id, a newer
//!   token, MAC'd under the membership's key, answered by a JOIN_ACK of the
//!   same membership (nothing else changes); a JOIN with cookie carrying
//!   another token that expires later than the membership's own token is a
//!   restarted client and replaces the membership;
//! - a member may time its round trip with ECHO, answered ECHO_REPLY from a
//!   small budget of its own;
//! - only MAC'd KEEPALIVEs, ECHOs and PROBE_REPLYs and tag-checked DATA are
//!   signs of life; an ICMP error about a member removes it only if it has also
//!   gone silent since, for at least two keepalive intervals;
//! - the reflector probes every member about once per keepalive interval
//!   and keeps its round-trip time.
//!
//! The group holds plain `SocketAddr`s; every change of membership is also
//! recorded as a [`Change`], which the server hands to the fan-out backend.
//!
//! Files: `types` (policy, keys, time, outcomes), `budget` (reply budgets),
//! `member` (a member and what a group reports), `join` (JOIN and renewal);
//! this one holds the group and its other rules; `tests` the unit tests.

mod budget;
mod join;
mod member;
mod types;

pub use budget::*;
pub use member::*;
pub use types::*;

use reflector_proto::auth::keyed_value;
use reflector_proto::protocol::{ErrorCode, Kind, MovedReason, Packet, ParseError, SmallDatagram};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// One group: its members, one membership per player.
#[derive(Debug)]
pub struct Group {
    port: u16,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddr, usize>,
    by_player: HashMap<u32, usize>,
    /// Members per source IP address.
    per_ip: HashMap<IpAddr, usize>,
    /// Reply budgets of verified players that are not members (bounded by
    /// [`MAX_PLAYER_BUDGETS`], full ones forgotten by [`Group::expire`]).
    players: HashMap<u32, ReplyBudget>,
    /// DATA tags here, if not the policy's default.
    tags: Option<bool>,
    /// The instance flag here, if not the policy's default.
    instance: Option<bool>,
    /// Sealed payloads here, if not the policy's default.
    sealed: Option<bool>,
    /// Counts the membership ids and nonces made, so each is new.
    made: u64,
    /// Changes not yet taken by [`Group::take_changes`]; reused, so the
    /// DATA path allocates nothing.
    changes: Vec<Change>,
    /// When MOVED last went to every member (monotonic ms): once a second.
    moved_at_ms: Option<u64>,
}

impl Group {
    pub fn new(port: u16) -> Group {
        Group {
            port,
            members: Vec::new(),
            by_addr: HashMap::new(),
            by_player: HashMap::new(),
            per_ip: HashMap::new(),
            players: HashMap::new(),
            tags: None,
            instance: None,
            sealed: None,
            made: 0,
            changes: Vec::new(),
            moved_at_ms: None,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// DATA tags in this group whatever the policy's default (new members
    /// learn it in JOIN_ACK).
    pub fn set_tags(&mut self, on: bool) {
        self.tags = Some(on);
    }

    /// Whether DATA here must carry tags (the group's setting, else the
    /// policy's default).
    pub fn tags_on(&self, policy: &Policy) -> bool {
        self.tags.unwrap_or(policy.data_tags)
    }

    /// The instance flag in this group whatever the policy's default (new
    /// members learn it in JOIN_ACK).
    pub fn set_instance(&mut self, on: bool) {
        self.instance = Some(on);
    }

    /// Whether this group's JOIN_ACK announces the instance flag: set, or
    /// implied by sealing (a sealed payload starts with the instance id, and
    /// a client refuses the sealed flag without it).
    pub fn instance_on(&self, policy: &Policy) -> bool {
        self.instance.unwrap_or(policy.data_instance) || self.sealed_on(policy)
    }

    /// Sealed payloads in this group whatever the policy's default (new
    /// members learn it in JOIN_ACK).
    pub fn set_sealed(&mut self, on: bool) {
        self.sealed = Some(on);
    }

    /// Whether this group's JOIN_ACK announces sealed payloads.
    pub fn sealed_on(&self, policy: &Policy) -> bool {
        self.sealed.unwrap_or(policy.data_sealed)
    }

    /// Hands every change since the last call to `f`, oldest first, with
    /// the member now at an added address.
    pub fn take_changes(&mut self, mut f: impl FnMut(Change, Option<&Member>)) {
        for c in self.changes.drain(..) {
            let m = match c {
                Change::Added(a) => self.by_addr.get(&a).map(|&i| &self.members[i]),
                Change::Removed(_) => None,
            };
            f(c, m);
        }
    }

    /// A sign of life from `addr` seen outside this core (DATA the kernel
    /// fanned out after checking its tag); false if `addr` is no member.
    pub fn heard_from(&mut self, addr: SocketAddr, now_ms: u64) -> bool {
        let Some(&idx) = self.by_addr.get(&addr) else {
            return false;
        };
        let m = &mut self.members[idx];
        m.last_seen_ms = m.last_seen_ms.max(now_ms);
        m.unreachable_since_ms = None;
        true
    }

    /// Notes an ICMP error about `addr` (the destination of a datagram we
    /// sent); returns true if `addr` is a member. It removes nobody by
    /// itself: see [`Group::expire`].
    pub fn note_unreachable(&mut self, addr: SocketAddr, now_ms: u64) -> bool {
        let Some(&idx) = self.by_addr.get(&addr) else {
            return false;
        };
        self.members[idx].unreachable_since_ms.get_or_insert(now_ms);
        true
    }

    /// A value no one outside can predict (the cookie key is secret), new
    /// for each call: membership ids and probe nonces.
    fn fresh(&mut self, keys: &Keys, what: &[u8], now_ms: u64) -> u64 {
        self.made += 1;
        let mut input = [0u8; 18];
        input[..2].copy_from_slice(&self.port.to_be_bytes());
        input[2..10].copy_from_slice(&self.made.to_be_bytes());
        input[10..].copy_from_slice(&now_ms.to_be_bytes());
        keyed_value(&keys.cookie_key, what, &input)
    }

    /// Decides what to do with one datagram received on this group's port.
    /// Replies a member or a verified player pays for are already paid (or
    /// withheld); a reply with [`Payer::Unverified`] is the caller's to pay
    /// from its global budget ([`ReplyBudget::admit`]) before sending it.
    pub fn handle(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, datagram: &[u8]) -> Outcome {
        self.decide(keys, policy, now, src, datagram)
    }

    /// Takes `n` reply tokens of verified player `sender` (not a member).
    /// `None`: too many players have budgets here; the global budget pays.
    fn player_pays(&mut self, sender: u32, n: u64, policy: &Policy, now_ms: u64) -> Option<bool> {
        let per_s = policy.player_replies_per_s;
        if let Some(b) = self.players.get_mut(&sender) {
            return Some(b.take_n(n, per_s, now_ms));
        }
        if self.players.len() >= MAX_PLAYER_BUDGETS {
            return None;
        }
        let mut b = ReplyBudget::full(per_s, now_ms);
        let ok = b.take_n(n, per_s, now_ms);
        self.players.insert(sender, b);
        Some(ok)
    }

    /// Takes `n` reply tokens of member `idx`.
    fn member_pays(&mut self, idx: usize, n: u64, policy: &Policy, now_ms: u64) -> Option<bool> {
        Some(self.members[idx].replies.take_n(n, policy.member_replies_per_s, now_ms))
    }

    /// What it costs to want member `holder`'s address: the two PROBEs of an
    /// occupancy check unless one is under way.
    fn check_cost(&self, holder: usize) -> u64 {
        if self.members[holder].check.is_some() {
            0
        } else {
            2
        }
    }

    /// Someone else wants member `holder`'s address (and paid): check,
    /// under the holder's own key, that it is still there. The PROBEs go out
    /// with the sweep ([`Group::probes`]); [`Group::expire`] removes a holder
    /// that answered neither.
    fn check_holder(&mut self, holder: usize, now_ms: u64) {
        let m = &mut self.members[holder];
        if m.check.is_none() {
            m.check = Some(OccupancyCheck {
                nonce: 0,
                probes: 0,
                sent_ms: now_ms,
            });
        }
    }

    fn decide(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, datagram: &[u8]) -> Outcome {
        let pkt = match Packet::parse(datagram) {
            Ok(p) => p,
            Err(e) => return Outcome::drop(DropReason::Malformed(e)),
        };
        if pkt.group() != self.port {
            return Outcome::drop(DropReason::WrongGroup);
        }
        match pkt.kind() {
            Kind::Data | Kind::Keepalive | Kind::Leave | Kind::ProbeReply | Kind::Echo => {
                self.member_datagram(keys, policy, now, src, &pkt)
            }
            Kind::Join if pkt.is_renewal() => self.renewal(keys, policy, now, src, &pkt),
            Kind::Join => self.join(keys, policy, now, src, &pkt),
            other => Outcome::drop(DropReason::Unexpected(other)),
        }
    }

    fn member_datagram(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
    ) -> Outcome {
        let len = pkt.as_bytes().len();
        let sender = pkt.sender();
        let Some(&idx) = self.by_player.get(&sender) else {
            // Unauthenticated (there is no key to check it with), so the
            // error is too: the client answers it by joining again.
            let err = SmallDatagram::error(self.port, sender, pkt.membership(), ErrorCode::NotMember);
            return Outcome::with_reply(Event::Dropped(DropReason::NotMember), err, len, Payer::Unverified);
        };
        let m = &self.members[idx];
        if pkt.membership() != m.membership {
            return Outcome::drop(DropReason::StaleMembership);
        }
        let authenticated = match pkt.kind() {
            Kind::Data if m.tags => {
                if !m.keys.verify_tag(pkt) {
                    return Outcome::drop(DropReason::BadTag);
                }
                true
            }
            // Untagged DATA: the group chose not to pay for tags; it counts
            // only from the member's own address and proves nothing.
            Kind::Data => false,
            _ => {
                if !m.keys.verify(pkt) {
                    return Outcome::drop(DropReason::BadMac);
                }
                true
            }
        };
        if src != m.addr {
            return self.elsewhere(keys, policy, now, src, pkt, idx, authenticated);
        }
        if authenticated && !self.members[idx].window.accept(pkt.seq()) {
            return Outcome::drop(DropReason::Replay);
        }
        let m = &mut self.members[idx];
        if authenticated {
            m.last_seen_ms = now.mono_ms;
            m.unreachable_since_ms = None;
        }
        match pkt.kind() {
            Kind::Data => {
                // The member's rate cap: beyond it, its own datagrams are
                // dropped (and counted), nobody else's.
                if !m.rate.take(policy, pkt.as_bytes().len(), now.mono_ms) {
                    return Outcome::drop(DropReason::RateLimited);
                }
                Outcome::silent(Event::Forward { from: src })
            }
            Kind::Keepalive => {
                // Alive at its address: a check on it is answered.
                m.check = None;
                Outcome::silent(Event::Refreshed)
            }
            Kind::Echo => {
                // A sign of life like KEEPALIVE; the answer comes from the
                // member's own echo budget, never anyone else's.
                m.check = None;
                let Some(nonce) = pkt.nonce() else {
                    return Outcome::drop(DropReason::Malformed(ParseError::BadPayload(Kind::Echo)));
                };
                if !m.echo.take(ECHO_REPLIES_PER_S, now.mono_ms) {
                    return Outcome::withheld(Event::Echoed, Kind::EchoReply, Payer::Member);
                }
                let h = m.next_header(Kind::EchoReply, self.port);
                let reply = SmallDatagram::nonce(&h, nonce, &m.keys);
                Outcome::with_reply(Event::Echoed, reply, pkt.as_bytes().len(), Payer::Member)
            }
            Kind::ProbeReply if m.check.is_some_and(|c| c.probes > 0 && Some(c.nonce) == pkt.nonce()) => {
                m.check = None;
                Outcome::silent(Event::Held)
            }
            Kind::ProbeReply => match m.probe {
                Some(p) if Some(p.nonce) == pkt.nonce() => {
                    let rtt_us = now.mono_us.saturating_sub(p.sent_us);
                    let rtt = rtt_us as f64 / 1000.0;
                    m.rtt_ms = Some(match m.rtt_ms {
                        Some(s) => s + (rtt - s) / 8.0,
                        None => rtt,
                    });
                    m.probe = None;
                    Outcome::silent(Event::Probed { rtt_us })
                }
                _ => Outcome::silent(Event::Refreshed),
            },
            _ => {
                self.remove(idx);
                Outcome::silent(Event::Left)
            }
        }
    }

    /// An authenticated datagram of a member from another address: only a
    /// PROBE_REPLY to a PROBE sent there moves the member, and only if no
    /// other member holds that address (else that one is checked first);
    /// anything else whose sequence number is fresh and later than any that
    /// caused a PROBE sends such a PROBE (at most one a second, never
    /// replacing a pending one sooner, from the member's own budget) and
    /// changes nothing.
    #[allow(clippy::too_many_arguments)]
    fn elsewhere(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
        idx: usize,
        authenticated: bool,
    ) -> Outcome {
        if !authenticated {
            return Outcome::drop(DropReason::Unvalidated);
        }
        let m = self.members[idx];
        if pkt.kind() == Kind::ProbeReply && m.rebind.is_some_and(|r| r.addr == src && Some(r.nonce) == pkt.nonce()) {
            // The new address answered under the key.
            if !self.members[idx].window.accept(pkt.seq()) {
                return Outcome::drop(DropReason::Replay);
            }
            self.members[idx].rebind = None;
            if let Some(&holder) = self.by_addr.get(&src) {
                // Another member holds it: that one is asked first, under
                // its own key; this one stays where it is, and its next
                // datagram from there after the holder is gone starts over.
                let cost = self.check_cost(holder);
                if cost > 0 && self.member_pays(idx, cost, policy, now.mono_ms) == Some(true) {
                    self.check_holder(holder, now.mono_ms);
                }
                return Outcome::drop(DropReason::Occupied);
            }
            let old = m.addr;
            self.by_addr.remove(&old);
            self.by_addr.insert(src, idx);
            self.address_removed(old);
            self.address_added(src);
            let mm = &mut self.members[idx];
            mm.addr = src;
            mm.probe = None;
            mm.check = None;
            mm.last_seen_ms = now.mono_ms;
            mm.unreachable_since_ms = None;
            self.changes.push(Change::Removed(old));
            self.changes.push(Change::Added(src));
            return Outcome::silent(Event::Rebound { from: old, to: src });
        }
        // A captured datagram replayed (from anywhere) is no news: only a
        // sequence number the member has not used here, later than any that
        // caused a PROBE, may cause one.
        let seq = pkt.seq();
        if !m.window.fresh(seq) || seq <= m.rebind_seq {
            return Outcome::drop(DropReason::Unvalidated);
        }
        let event = Event::Dropped(DropReason::Unvalidated);
        if m.rebind_sent_ms
            .is_some_and(|t| now.mono_ms.saturating_sub(t) < REBIND_PROBE_EVERY_MS)
        {
            return Outcome::withheld(event, Kind::Probe, Payer::Member);
        }
        if self.member_pays(idx, 1, policy, now.mono_ms) != Some(true) {
            return Outcome::withheld(event, Kind::Probe, Payer::Member);
        }
        let nonce = self.fresh(keys, b"rbnd", now.mono_ms);
        let mm = &mut self.members[idx];
        mm.rebind = Some(PendingProbe {
            addr: src,
            nonce,
            sent_ms: now.mono_ms,
            sent_us: now.mono_us,
        });
        mm.rebind_sent_ms = Some(now.mono_ms);
        mm.rebind_seq = seq;
        let h = mm.next_header(Kind::Probe, self.port);
        let probe = SmallDatagram::nonce(&h, nonce, &mm.keys);
        Outcome::with_reply(event, probe, pkt.as_bytes().len(), Payer::Member)
    }

    /// Counts a member address in its IP's tally.
    fn address_added(&mut self, a: SocketAddr) {
        *self.per_ip.entry(a.ip()).or_insert(0) += 1;
    }

    /// Takes a member address out of its IP's tally.
    fn address_removed(&mut self, a: SocketAddr) {
        if let Some(n) = self.per_ip.get_mut(&a.ip()) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&a.ip());
            }
        }
    }

    fn remove(&mut self, idx: usize) {
        let gone = self.members.swap_remove(idx);
        self.changes.push(Change::Removed(gone.addr));
        self.address_removed(gone.addr);
        self.by_addr.remove(&gone.addr);
        self.by_player.remove(&gone.sender);
        if let Some(moved) = self.members.get(idx) {
            self.by_addr.insert(moved.addr, idx);
            self.by_player.insert(moved.sender, idx);
        }
    }

    /// PROBEs due, for the caller to send from the group's socket: each
    /// member's RTT (one per keepalive interval), measured by the reflector
    /// itself, and the PROBEs of occupancy checks (the first at the first
    /// sweep after the check began, the second [`OCCUPANCY_PROBE_GAP_MS`]
    /// later). `now_ms` is monotonic.
    pub fn probes(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        out: &mut Vec<(SocketAddr, SmallDatagram)>,
    ) -> Probed {
        let now_ms = now.mono_ms;
        let every = u64::from(policy.keepalive_ms).max(1);
        let mut done = Probed::default();
        for i in 0..self.members.len() {
            if let Some(c) = self.members[i].check {
                let due =
                    c.probes == 0 || (c.probes == 1 && now_ms.saturating_sub(c.sent_ms) >= OCCUPANCY_PROBE_GAP_MS);
                if due {
                    let nonce = if c.probes == 0 {
                        done.checks_started += 1;
                        self.fresh(keys, b"ocpy", now_ms)
                    } else {
                        c.nonce
                    };
                    let port = self.port;
                    let m = &mut self.members[i];
                    m.check = Some(OccupancyCheck {
                        nonce,
                        probes: c.probes + 1,
                        sent_ms: now_ms,
                    });
                    let h = m.next_header(Kind::Probe, port);
                    out.push((m.addr, SmallDatagram::nonce(&h, nonce, &m.keys)));
                    done.occupancy += 1;
                }
            }
            if now_ms.saturating_sub(self.members[i].probed_ms) < every {
                continue;
            }
            let nonce = self.fresh(keys, b"prob", now_ms);
            let port = self.port;
            let m = &mut self.members[i];
            m.probed_ms = now_ms;
            m.probe = Some(PendingProbe {
                addr: m.addr,
                nonce,
                sent_ms: now_ms,
                sent_us: now.mono_us,
            });
            let h = m.next_header(Kind::Probe, port);
            out.push((m.addr, SmallDatagram::nonce(&h, nonce, &m.keys)));
            done.rtt += 1;
        }
        done
    }

    /// Asks member `i` for the group's game state: a CHECKPOINT_REQUEST with
    /// a fresh, unpredictable nonce under its key (the upload must carry it).
    pub fn checkpoint_request(
        &mut self,
        keys: &Keys,
        i: usize,
        now_ms: u64,
    ) -> Option<(SocketAddr, u64, SmallDatagram)> {
        if i >= self.members.len() {
            return None;
        }
        let nonce = self.fresh(keys, b"ckpt", now_ms);
        let port = self.port;
        let m = &mut self.members[i];
        let h = m.next_header(Kind::CheckpointRequest, port);
        Some((m.addr, nonce, SmallDatagram::nonce(&h, nonce, &m.keys)))
    }

    /// MOVED to every member, under its key, to its validated address (the
    /// only addresses a member has here), at most once a second: this
    /// reflector stops serving the memberships (`reason`) within
    /// `within_ms`. Appended to `out`; how many.
    pub fn moved_all(
        &mut self,
        reason: MovedReason,
        within_ms: u16,
        now_ms: u64,
        out: &mut Vec<(SocketAddr, SmallDatagram)>,
    ) -> usize {
        if self.moved_at_ms.is_some_and(|t| now_ms.saturating_sub(t) < 1_000) {
            return 0;
        }
        self.moved_at_ms = Some(now_ms);
        let port = self.port;
        for m in &mut self.members {
            let h = m.next_header(Kind::Moved, port);
            out.push((m.addr, SmallDatagram::moved(&h, reason, within_ms, &m.keys)));
        }
        self.members.len()
    }

    /// Removes members whose token expired (wall clock, [`Now::unix_ms`]:
    /// they did not renew), members silent for longer than the policy
    /// allows, and members an ICMP error was about that have not been heard
    /// from since, for two keepalive intervals (monotonic, [`Now::mono_ms`]).
    pub fn expire(&mut self, policy: &Policy, now: Now) -> Expired {
        let now_ms = now.mono_ms;
        let mut out = Expired::default();
        let grace = 2 * u64::from(policy.keepalive_ms);
        let mut i = 0;
        while i < self.members.len() {
            let m = &self.members[i];
            let unreachable = m
                .unreachable_since_ms
                .is_some_and(|t| m.last_seen_ms <= t && now_ms.saturating_sub(t) >= grace);
            let occupied = m
                .check
                .is_some_and(|c| c.probes >= 2 && now_ms.saturating_sub(c.sent_ms) >= OCCUPANCY_PROBE_GAP_MS);
            if now.unix_ms >= m.expires_unix_ms {
                // Whatever else it sends: a membership lives at most as
                // long as its latest token.
                self.remove(i);
                out.tokens += 1;
            } else if now_ms.saturating_sub(m.last_seen_ms) > policy.member_timeout_ms {
                self.remove(i);
                out.silent += 1;
            } else if occupied {
                // Someone else wants its address, and it answered neither
                // PROBE under its own key: gone.
                self.remove(i);
                out.occupied += 1;
            } else if unreachable {
                self.remove(i);
                out.unreachable += 1;
            } else {
                i += 1;
            }
        }
        // Players whose reply budgets are full again are forgotten.
        let per_s = policy.player_replies_per_s;
        self.players.retain(|_, b| !b.is_full(per_s, now_ms));
        out
    }
}

#[cfg(test)]
mod tests;
