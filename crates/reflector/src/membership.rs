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
//! - no reply is ever larger than the datagram that caused it, and replies
//!   to senders that are not members are rate-limited per group;
//! - only MAC'd KEEPALIVEs and PROBE_REPLYs and tag-checked DATA are signs
//!   of life; an ICMP error about a member removes it only if it has also
//!   gone silent since, for at least two keepalive intervals;
//! - the reflector probes every member about once per keepalive interval
//!   and keeps its round-trip time.
//!
//! The group holds plain `SocketAddr`s; every change of membership is also
//! recorded as a [`Change`], which the server hands to the fan-out backend.

use reflector_proto::auth::{check_cookie, keyed_value, make_cookie, Secret, SecretRing, TokenError};
use reflector_proto::protocol::{
    ErrorCode, Header, JoinAck, Kind, Packet, ParseError, ReplayWindow, SessionKeys, SmallDatagram, FLAG_TAGS,
};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// Membership policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A member that gives no sign of life for this long is removed.
    pub member_timeout_ms: u64,
    /// Members per group; further joins get ERROR(GroupFull).
    pub max_members: usize,
    /// Keepalive interval announced in JOIN_ACK; members are probed about
    /// as often.
    pub keepalive_ms: u16,
    /// Replies (challenges, errors, probes to new addresses) per second per
    /// group to senders that are not (validated) members, with a burst of as
    /// many. Replies are never larger than their request, but a spoofed flood
    /// would still be reflected one for one onto its victim; this caps that.
    pub replies_per_s: u32,
    /// DATA tags for groups that do not say otherwise ([`Group::set_tags`]).
    pub data_tags: bool,
    /// TCP port of the checkpoint channel announced in JOIN_ACK (0: none).
    pub checkpoint_port: u16,
    /// Members per source IP address in one group: one host cannot fill a
    /// group (and turn each of its datagrams into a thousand copies), while
    /// a household behind one NAT still fits.
    pub max_per_ip: usize,
    /// DATA per second one member may have fanned out (a token bucket with a
    /// second's burst); 0: no cap.
    pub member_pps: u32,
    /// DATA bytes per second one member may have fanned out; 0: no cap.
    pub member_bytes_per_s: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            member_timeout_ms: 10_000,
            max_members: 1024,
            keepalive_ms: 2_000,
            replies_per_s: 500,
            data_tags: true,
            checkpoint_port: 0,
            max_per_ip: 32,
            member_pps: 500,
            member_bytes_per_s: 1_000_000,
        }
    }
}

/// What a reflector needs to check joins: the secret shared with the
/// control server (to verify tokens and derive session keys), its own id in
/// the control server's map (tokens name it), and its private key for
/// cookies, membership ids and probe nonces.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The secret shared with the control server (and, during a rollover,
    /// the previous one while it is still accepted).
    pub token_secret: SecretRing,
    pub reflector_id: u16,
    pub cookie_key: Secret,
}

/// The two clocks the decisions need, read once by the caller: wall-clock
/// time for token expiry and cookie slots (shared with other hosts), and a
/// monotonic clock for member liveness, so that a step of the system clock
/// neither expires every member at once nor keeps dead ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub unix_ms: u64,
    pub mono_ms: u64,
}

/// Why a datagram was dropped. Each maps to a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    Malformed(ParseError),
    /// Header names another group than the port it arrived on.
    WrongGroup,
    /// From a player that is not a member.
    NotMember,
    /// A member's player id with another membership id (an old membership).
    StaleMembership,
    /// The MAC does not verify under the member's (or the token's) key.
    BadMac,
    /// DATA whose tag does not verify.
    BadTag,
    /// A sequence number seen before, or older than the window.
    Replay,
    /// Authenticated, but from an address the member has not validated yet
    /// (a PROBE went there, or the datagram could not be authenticated).
    Unvalidated,
    Token(TokenError),
    BadCookie,
    GroupFull,
    /// The source address has [`Policy::max_per_ip`] members in the group.
    AddressLimit,
    /// DATA beyond the member's rate cap ([`Policy::member_pps`],
    /// [`Policy::member_bytes_per_s`]).
    RateLimited,
    /// A type only the reflector sends.
    Unexpected(Kind),
}

/// What happened to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Fan the datagram out (tag field zeroed) to every member but its sender.
    Forward {
        from: SocketAddr,
    },
    Challenged,
    /// Admitted; `rejoin` if the player was a member already.
    Joined {
        rejoin: bool,
    },
    Left,
    Refreshed,
    /// A PROBE_REPLY from the member's address: its RTT was measured.
    Probed {
        rtt_ms: u64,
    },
    /// A PROBE_REPLY from a new address under the key: the member moved.
    Rebound {
        from: SocketAddr,
        to: SocketAddr,
    },
    Dropped(DropReason),
}

/// The decision for one datagram: an event and maybe a reply to its source.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub event: Event,
    pub reply: Option<SmallDatagram>,
    /// A reply was due but the group's reply budget was spent.
    pub reply_suppressed: bool,
}

impl Outcome {
    fn silent(event: Event) -> Outcome {
        Outcome {
            event,
            reply: None,
            reply_suppressed: false,
        }
    }

    fn drop(reason: DropReason) -> Outcome {
        Outcome::silent(Event::Dropped(reason))
    }

    /// The one place replies are allowed out: never larger than the request.
    fn with_reply(event: Event, reply: SmallDatagram, request_len: usize) -> Outcome {
        Outcome {
            event,
            reply: (reply.len() <= request_len).then_some(reply),
            reply_suppressed: false,
        }
    }
}

/// Token bucket for replies to non-members (see [`Policy::replies_per_s`]).
#[derive(Debug, Clone, Copy)]
struct ReplyBudget {
    tokens: u64,
    last_ms: u64,
}

impl ReplyBudget {
    fn take(&mut self, per_s: u32, now_ms: u64) -> bool {
        let per_s = u64::from(per_s);
        let refill = now_ms.saturating_sub(self.last_ms).saturating_mul(per_s) / 1000;
        if refill > 0 {
            self.tokens = self.tokens.saturating_add(refill).min(per_s);
            self.last_ms = now_ms;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

/// A PROBE on its way: to which address, with which nonce, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingProbe {
    pub addr: SocketAddr,
    pub nonce: u64,
    pub sent_ms: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub addr: SocketAddr,
    pub sender: u32,
    /// The random id of this membership (in JOIN_ACK and every later MAC).
    pub membership: u32,
    pub keys: SessionKeys,
    /// The player's sequence numbers seen.
    pub window: ReplayWindow,
    /// The reflector's own sequence number for this membership.
    pub tx_seq: u64,
    /// DATA must carry a valid tag.
    pub tags: bool,
    /// Monotonic milliseconds ([`Now::mono_ms`]) of the last sign of life.
    pub last_seen_ms: u64,
    /// When the first ICMP error about this address arrived since it was
    /// last heard from (monotonic ms).
    pub unreachable_since_ms: Option<u64>,
    /// The last PROBE to the member's address (RTT), if unanswered.
    pub probe: Option<PendingProbe>,
    /// The last PROBE to a new address (rebinding), if unanswered.
    pub rebind: Option<PendingProbe>,
    /// Smoothed round-trip time (ms, 1/8 gain), once measured.
    pub rtt_ms: Option<f64>,
    /// When the member was last probed (monotonic ms).
    pub probed_ms: u64,
    /// Its DATA rate cap: packets and bytes.
    pub rate: RateBucket,
}

/// A member's DATA allowance: packet and byte tokens, refilled at the
/// policy's rates up to a second's worth.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateBucket {
    packets: f64,
    bytes: f64,
    last_ms: u64,
}

impl RateBucket {
    fn full(policy: &Policy, now_ms: u64) -> RateBucket {
        RateBucket {
            packets: f64::from(policy.member_pps),
            bytes: policy.member_bytes_per_s as f64,
            last_ms: now_ms,
        }
    }

    /// Takes one datagram of `len` bytes if both caps allow it.
    fn take(&mut self, policy: &Policy, len: usize, now_ms: u64) -> bool {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = now_ms;
        let (pps, bps) = (f64::from(policy.member_pps), policy.member_bytes_per_s as f64);
        self.packets = (self.packets + dt * pps).min(pps);
        self.bytes = (self.bytes + dt * bps).min(bps);
        let pk_ok = policy.member_pps == 0 || self.packets >= 1.0;
        let by_ok = policy.member_bytes_per_s == 0 || self.bytes >= len as f64;
        if !(pk_ok && by_ok) {
            return false;
        }
        self.packets -= 1.0;
        self.bytes -= len as f64;
        true
    }
}

impl Member {
    fn next_header(&mut self, kind: Kind, port: u16) -> Header {
        self.tx_seq += 1;
        Header {
            kind,
            group: port,
            sender: self.sender,
            membership: self.membership,
            seq: self.tx_seq,
        }
    }
}

/// A change of membership, for the fan-out backend's destination set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added(SocketAddr),
    Removed(SocketAddr),
}

/// Members removed by one sweep, by rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Silent for longer than the member timeout.
    pub silent: usize,
    /// Silent since an ICMP error about them, for two keepalive intervals.
    pub unreachable: usize,
}

/// One group: its members, one membership per player.
#[derive(Debug)]
pub struct Group {
    port: u16,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddr, usize>,
    by_player: HashMap<u32, usize>,
    /// Members per source IP address.
    per_ip: HashMap<IpAddr, usize>,
    budget: Option<ReplyBudget>,
    /// DATA tags here, if not the policy's default.
    tags: Option<bool>,
    /// Counts the membership ids and nonces made, so each is new.
    made: u64,
    /// Changes not yet taken by [`Group::take_changes`]; reused, so the
    /// DATA path allocates nothing.
    changes: Vec<Change>,
}

impl Group {
    pub fn new(port: u16) -> Group {
        Group {
            port,
            members: Vec::new(),
            by_addr: HashMap::new(),
            by_player: HashMap::new(),
            per_ip: HashMap::new(),
            budget: None,
            tags: None,
            made: 0,
            changes: Vec::new(),
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
    pub fn handle(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, datagram: &[u8]) -> Outcome {
        let mut out = self.decide(keys, policy, now, src, datagram);
        if out.reply.is_some() && !matches!(out.event, Event::Joined { .. }) {
            let budget = self.budget.get_or_insert(ReplyBudget {
                tokens: u64::from(policy.replies_per_s),
                last_ms: now.mono_ms,
            });
            if !budget.take(policy.replies_per_s, now.mono_ms) {
                out.reply = None;
                out.reply_suppressed = true;
            }
        }
        out
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
            Kind::Data | Kind::Keepalive | Kind::Leave | Kind::ProbeReply => {
                self.member_datagram(keys, policy, now, src, &pkt)
            }
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
            return Outcome::with_reply(Event::Dropped(DropReason::NotMember), err, len);
        };
        let m = self.members[idx];
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
            return self.elsewhere(keys, now, src, pkt, idx, authenticated);
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
            Kind::Keepalive => Outcome::silent(Event::Refreshed),
            Kind::ProbeReply => match m.probe {
                Some(p) if Some(p.nonce) == pkt.nonce() => {
                    let rtt = now.mono_ms.saturating_sub(p.sent_ms);
                    m.rtt_ms = Some(match m.rtt_ms {
                        Some(s) => s + (rtt as f64 - s) / 8.0,
                        None => rtt as f64,
                    });
                    m.probe = None;
                    Outcome::silent(Event::Probed { rtt_ms: rtt })
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
    /// PROBE_REPLY to a PROBE sent there moves the member; anything else
    /// sends (at most once a second) such a PROBE and changes nothing.
    fn elsewhere(
        &mut self,
        keys: &Keys,
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
            // The new address answered under the key: move there.
            if !self.members[idx].window.accept(pkt.seq()) {
                return Outcome::drop(DropReason::Replay);
            }
            if let Some(&other) = self.by_addr.get(&src) {
                // Someone else's stale membership at that address.
                if other != idx {
                    self.remove(other);
                }
            }
            let idx = self.by_player[&m.sender];
            let old = self.members[idx].addr;
            self.by_addr.remove(&old);
            self.by_addr.insert(src, idx);
            self.address_removed(old);
            self.address_added(src);
            let mm = &mut self.members[idx];
            mm.addr = src;
            mm.rebind = None;
            mm.probe = None;
            mm.last_seen_ms = now.mono_ms;
            mm.unreachable_since_ms = None;
            self.changes.push(Change::Removed(old));
            self.changes.push(Change::Added(src));
            return Outcome::silent(Event::Rebound { from: old, to: src });
        }
        let due = match m.rebind {
            Some(r) => r.addr != src || now.mono_ms.saturating_sub(r.sent_ms) >= 1000,
            None => true,
        };
        if !due {
            return Outcome::drop(DropReason::Unvalidated);
        }
        let nonce = self.fresh(keys, b"rbnd", now.mono_ms);
        let mm = &mut self.members[idx];
        mm.rebind = Some(PendingProbe {
            addr: src,
            nonce,
            sent_ms: now.mono_ms,
        });
        let h = mm.next_header(Kind::Probe, self.port);
        let probe = SmallDatagram::nonce(&h, nonce, &mm.keys);
        Outcome::with_reply(Event::Dropped(DropReason::Unvalidated), probe, pkt.as_bytes().len())
    }

    fn join(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, pkt: &Packet<&[u8]>) -> Outcome {
        let len = pkt.as_bytes().len();
        let sender = pkt.sender();
        // parse() guarantees a JOIN carries a token.
        let Some(token) = pkt.join_token() else {
            return Outcome::drop(DropReason::Malformed(ParseError::BadPayload(Kind::Join)));
        };
        let session =
            match keys
                .token_secret
                .verify_token_keys(token, keys.reflector_id, self.port, sender, now.unix_ms)
            {
                Ok((_, k)) => k,
                Err(e) => {
                    let code = if e == TokenError::Expired {
                        ErrorCode::ExpiredToken
                    } else {
                        ErrorCode::BadToken
                    };
                    let err = SmallDatagram::error(self.port, sender, 0, code);
                    return Outcome::with_reply(Event::Dropped(DropReason::Token(e)), err, len);
                }
            };
        if !session.verify(pkt) {
            let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::BadMac);
            return Outcome::with_reply(Event::Dropped(DropReason::BadMac), err, len);
        }
        let existing = self.by_player.get(&sender).copied();
        let Some(cookie) = pkt.join_cookie() else {
            let cookie = make_cookie(&keys.cookie_key, &src, self.port, sender, now.unix_ms);
            let h = Header {
                kind: Kind::JoinChallenge,
                group: self.port,
                sender,
                membership: 0,
                seq: 1,
            };
            let ch = SmallDatagram::challenge(&h, &cookie, &session);
            return Outcome::with_reply(Event::Challenged, ch, len);
        };
        if !check_cookie(&keys.cookie_key, cookie, &src, self.port, sender, now.unix_ms) {
            let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::BadCookie);
            return Outcome::with_reply(Event::Dropped(DropReason::BadCookie), err, len);
        }
        let tags = self.tags.unwrap_or(policy.data_tags);
        let idx = match existing {
            Some(idx) => {
                // The player again. The cookie proves the address and the MAC
                // the key; the sequence number must be new for this
                // membership, so a captured JOIN replayed later moves nothing.
                if !self.members[idx].window.accept(pkt.seq()) {
                    return Outcome::drop(DropReason::Replay);
                }
                let old = self.members[idx].addr;
                if old != src {
                    if let Some(&other) = self.by_addr.get(&src) {
                        self.remove(other);
                    }
                    let idx = self.by_player[&sender];
                    self.by_addr.remove(&old);
                    self.by_addr.insert(src, idx);
                    self.address_removed(old);
                    self.address_added(src);
                    self.members[idx].addr = src;
                    self.changes.push(Change::Removed(old));
                    self.changes.push(Change::Added(src));
                }
                let idx = self.by_player[&sender];
                let m = &mut self.members[idx];
                m.last_seen_ms = now.mono_ms;
                m.unreachable_since_ms = None;
                m.rebind = None;
                idx
            }
            None => {
                if self.members.len() >= policy.max_members {
                    let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::GroupFull);
                    return Outcome::with_reply(Event::Dropped(DropReason::GroupFull), err, len);
                }
                // Another player's membership at this address is stale: the
                // address is this client's now (the cookie proved it).
                if let Some(&other) = self.by_addr.get(&src) {
                    self.remove(other);
                }
                if self.per_ip.get(&src.ip()).copied().unwrap_or(0) >= policy.max_per_ip {
                    let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::AddressLimit);
                    return Outcome::with_reply(Event::Dropped(DropReason::AddressLimit), err, len);
                }
                let membership = (self.fresh(keys, b"mbid", now.mono_ms) as u32).max(1);
                let mut window = ReplayWindow::default();
                window.accept(pkt.seq());
                let idx = self.members.len();
                self.members.push(Member {
                    addr: src,
                    sender,
                    membership,
                    keys: session,
                    window,
                    tx_seq: 1,
                    tags,
                    last_seen_ms: now.mono_ms,
                    unreachable_since_ms: None,
                    probe: None,
                    rebind: None,
                    rtt_ms: None,
                    probed_ms: now.mono_ms,
                    rate: RateBucket::full(policy, now.mono_ms),
                });
                self.address_added(src);
                self.by_addr.insert(src, idx);
                self.by_player.insert(sender, idx);
                self.changes.push(Change::Added(src));
                idx
            }
        };
        let members = u16::try_from(self.members.len()).unwrap_or(u16::MAX);
        let port = self.port;
        let m = &mut self.members[idx];
        let h = m.next_header(Kind::JoinAck, port);
        let ack = JoinAck {
            members,
            keepalive_ms: policy.keepalive_ms,
            flags: if m.tags { FLAG_TAGS } else { 0 },
            checkpoint_port: policy.checkpoint_port,
        };
        let reply = SmallDatagram::join_ack(&h, ack, &m.keys);
        Outcome::with_reply(
            Event::Joined {
                rejoin: existing.is_some(),
            },
            reply,
            len,
        )
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

    /// PROBEs due (one per member per keepalive interval), for the caller to
    /// send from the group's socket: each member's RTT, measured by the
    /// reflector itself. `now_ms` is monotonic.
    pub fn probes(&mut self, keys: &Keys, policy: &Policy, now_ms: u64, out: &mut Vec<(SocketAddr, SmallDatagram)>) {
        let every = u64::from(policy.keepalive_ms).max(1);
        for i in 0..self.members.len() {
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
            });
            let h = m.next_header(Kind::Probe, port);
            out.push((m.addr, SmallDatagram::nonce(&h, nonce, &m.keys)));
        }
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

    /// Removes members silent for longer than the policy allows, and members
    /// an ICMP error was about that have not been heard from since, for two
    /// keepalive intervals. `now_ms` is the monotonic clock ([`Now::mono_ms`]).
    pub fn expire(&mut self, policy: &Policy, now_ms: u64) -> Expired {
        let mut out = Expired::default();
        let grace = 2 * u64::from(policy.keepalive_ms);
        let mut i = 0;
        while i < self.members.len() {
            let m = &self.members[i];
            let unreachable = m
                .unreachable_since_ms
                .is_some_and(|t| m.last_seen_ms <= t && now_ms.saturating_sub(t) >= grace);
            if now_ms.saturating_sub(m.last_seen_ms) > policy.member_timeout_ms {
                self.remove(i);
                out.silent += 1;
            } else if unreachable {
                self.remove(i);
                out.unreachable += 1;
            } else {
                i += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::TokenClaims;
    use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
    use reflector_proto::protocol::{emit, DATA_PAYLOAD, TOKEN_LEN};
    use std::collections::HashSet;

    const PORT: u16 = 4000;
    const T0: u64 = 1_700_000_000_000;

    fn keys() -> Keys {
        Keys {
            token_secret: Secret::new(&[1; 32]).unwrap().into(),
            reflector_id: 0,
            cookie_key: Secret::new(&[2; 32]).unwrap(),
        }
    }

    fn token(k: &Keys, player: u32, group: u16, ttl_s: u64) -> [u8; TOKEN_LEN] {
        TokenClaims {
            player,
            reflector: 0,
            group,
            expires_unix_s: T0 / 1000 + ttl_s,
        }
        .sign(&k.token_secret.current)
    }

    fn session_keys(k: &Keys, t: &[u8; TOKEN_LEN]) -> SessionKeys {
        SessionKeys::derive(&k.token_secret.current, t)
    }

    fn at(ms: u64) -> Now {
        Now {
            unix_ms: ms,
            mono_ms: ms,
        }
    }

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], 5000 + i))
    }

    fn hdr(kind: Kind, sender: u32, membership: u32, seq: u64) -> Header {
        Header {
            kind,
            group: PORT,
            sender,
            membership,
            seq,
        }
    }

    fn reflector_addr() -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 254], PORT))
    }

    /// A player as a real client is: the protocol crate's session.
    struct Player {
        session: Session,
    }

    impl Player {
        fn data(&mut self, payload: &[u8]) -> Vec<u8> {
            let mut b = vec![0u8; DATA_PAYLOAD + payload.len()];
            b[DATA_PAYLOAD..].copy_from_slice(payload);
            let n = self.session.seal_data(payload.len(), &mut b).unwrap().unwrap();
            b.truncate(n);
            b
        }

        fn keepalive(&mut self) -> Vec<u8> {
            self.session.keepalive().unwrap().datagram.as_bytes().to_vec()
        }

        fn leave(&mut self) -> Vec<u8> {
            self.session.leave().unwrap().datagram.as_bytes().to_vec()
        }

        /// Feeds a datagram from the reflector; returns what the player sends back.
        fn answer(&mut self, reply: &SmallDatagram) -> Option<Vec<u8>> {
            let t = std::time::Instant::now();
            self.session
                .handle(t, reflector_addr(), &Packet::parse(reply.as_bytes()).unwrap());
            self.session.poll_transmit().map(|t| t.datagram.as_bytes().to_vec())
        }
    }

    /// Runs the client's handshake against the group from `src`, starting at
    /// sequence number `first_seq`; returns the player and the outcome of its
    /// last datagram; checks the first step is answered with a challenge.
    fn join_from(
        g: &mut Group,
        k: &Keys,
        p: &Policy,
        now: u64,
        src: SocketAddr,
        player: u32,
        first_seq: u64,
    ) -> (Player, Outcome) {
        let t = token(k, player, PORT, 60);
        let req = JoinRequest {
            reflector: reflector_addr(),
            group: PORT,
            player,
            token: t,
            keys: session_keys(k, &t),
            first_seq,
        };
        // The client's clock only times its retries, which never fire here.
        let clock = std::time::Instant::now();
        let mut s = Session::new(req, ClientConfig::default(), clock);
        let mut outcomes = Vec::new();
        while let Some(tx) = s.poll_transmit() {
            let o = g.handle(k, p, at(now), src, tx.datagram.as_bytes());
            if let Some(r) = o.reply {
                s.handle(clock, req.reflector, &Packet::parse(r.as_bytes()).unwrap());
            }
            outcomes.push(o);
        }
        assert_eq!(outcomes[0].event, Event::Challenged);
        (Player { session: s }, *outcomes.last().unwrap())
    }

    fn join(g: &mut Group, k: &Keys, p: &Policy, now: u64, src: SocketAddr, player: u32) -> (Player, Outcome) {
        join_from(g, k, p, now, src, player, 1)
    }

    /// Applies the group's changes to `seen` (what a backend does with its
    /// destination set) and checks it then holds exactly the members.
    fn mirror(g: &mut Group, seen: &mut HashSet<SocketAddr>) -> HashSet<SocketAddr> {
        g.take_changes(|c, m| match c {
            Change::Added(a) => {
                // Within one batch an address may be added and removed again.
                assert!(m.is_none_or(|m| m.addr == a), "{a} added with another member");
                assert!(seen.insert(a), "{a} added twice")
            }
            Change::Removed(a) => assert!(seen.remove(&a), "{a} removed but absent"),
        });
        let members: HashSet<SocketAddr> = g.members().iter().map(|m| m.addr).collect();
        assert_eq!(*seen, members);
        seen.clone()
    }

    #[test]
    fn two_step_join_then_tagged_data_forwarded() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let mut players = Vec::new();
        for i in 0..3 {
            let (pl, o) = join(&mut g, &k, &p, T0, addr(i), 100 + u32::from(i));
            assert_eq!(o.event, Event::Joined { rejoin: false });
            let ack = Packet::parse(o.reply.unwrap().as_bytes().to_vec()).unwrap();
            let a = ack.join_ack().unwrap();
            assert_eq!((a.members, a.tags()), (i + 1, true));
            assert_ne!(ack.membership(), 0);
            players.push(pl);
        }
        assert_eq!(g.len(), 3);
        let d = players[1].data(b"pos");
        assert_ne!(Packet::parse(&d[..]).unwrap().tag(), Some(0), "tagged");
        let o = g.handle(&k, &p, at(T0), addr(1), &d);
        assert_eq!(o.event, Event::Forward { from: addr(1) });
        assert!(o.reply.is_none());
        assert_eq!(mirror(&mut g, &mut HashSet::new()).len(), 3);
    }

    #[test]
    fn join_without_valid_cookie_or_key_never_makes_a_member() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let t = token(&k, 7, PORT, 60);
        let sk = session_keys(&k, &t);
        // Cookie made for another address (what a spoofer would have to guess).
        let wrong = make_cookie(&k.cookie_key, &addr(9), PORT, 7, T0);
        let j = SmallDatagram::join(&hdr(Kind::Join, 7, 0, 1), &t, Some(&wrong), &sk);
        let o = g.handle(&k, &p, at(T0), addr(1), j.as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::BadCookie));
        // A stale cookie, two slots later.
        let old = make_cookie(&k.cookie_key, &addr(1), PORT, 7, T0);
        let later = T0 + 2 * reflector_proto::auth::COOKIE_SLOT_MS + 1;
        let j = SmallDatagram::join(&hdr(Kind::Join, 7, 0, 2), &t, Some(&old), &sk);
        let o = g.handle(&k, &p, at(later), addr(1), j.as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::BadCookie));
        // The token without its key (seen on the path): not even a challenge.
        let guess = SessionKeys::from_session([9; 32]);
        let j = SmallDatagram::join(&hdr(Kind::Join, 7, 0, 3), &t, None, &guess);
        let o = g.handle(&k, &p, at(T0), addr(1), j.as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::BadMac));
        let err = Packet::parse(o.reply.unwrap().as_bytes().to_vec()).unwrap();
        assert_eq!(err.error_code(), Some(Ok(ErrorCode::BadMac)));
        assert!(g.is_empty());
    }

    #[test]
    fn bad_tokens_are_refused_with_small_errors() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let cases = [
            (token(&k, 7, PORT + 1, 60), DropReason::Token(TokenError::WrongGroup)),
            (token(&k, 8, PORT, 60), DropReason::Token(TokenError::WrongPlayer)),
            ([0u8; TOKEN_LEN], DropReason::Token(TokenError::BadMac)),
        ];
        for (t, reason) in cases {
            let req = SmallDatagram::join(&hdr(Kind::Join, 7, 0, 1), &t, None, &session_keys(&k, &t));
            let o = g.handle(&k, &p, at(T0), addr(1), req.as_bytes());
            assert_eq!(o.event, Event::Dropped(reason));
            let r = o.reply.unwrap();
            assert!(r.len() <= req.len());
            assert_eq!(
                Packet::parse(r.as_bytes().to_vec()).unwrap().error_code(),
                Some(Ok(ErrorCode::BadToken))
            );
        }
        let t = token(&k, 7, PORT, 1);
        let req = SmallDatagram::join(&hdr(Kind::Join, 7, 0, 1), &t, None, &session_keys(&k, &t));
        let o = g.handle(&k, &p, at(T0 + 1000), addr(1), req.as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::Token(TokenError::Expired)));
        assert!(g.is_empty());
    }

    #[test]
    fn non_members_and_strays_are_dropped_without_amplification() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let other = SessionKeys::from_session([3; 32]);
        let mut stray_data = vec![0u8; 64];
        let n = emit(&hdr(Kind::Data, 2, 0, 1), b"xx", Some(&other), &mut stray_data).unwrap();
        stray_data.truncate(n);
        let cases: Vec<(Vec<u8>, DropReason)> = vec![
            (stray_data, DropReason::NotMember),
            (
                SmallDatagram::simple(&hdr(Kind::Keepalive, 2, 0, 1), &other)
                    .as_bytes()
                    .to_vec(),
                DropReason::NotMember,
            ),
            (
                SmallDatagram::simple(&hdr(Kind::Leave, 2, 0, 1), &other)
                    .as_bytes()
                    .to_vec(),
                DropReason::NotMember,
            ),
            // Player 1's id with a membership id of an earlier membership.
            (
                SmallDatagram::simple(&hdr(Kind::Keepalive, 1, 12345, 1), &other)
                    .as_bytes()
                    .to_vec(),
                DropReason::StaleMembership,
            ),
            (
                b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
                DropReason::Malformed(ParseError::BadMagic),
            ),
            (vec![0x52], DropReason::Malformed(ParseError::Truncated)),
            (
                SmallDatagram::challenge(&hdr(Kind::JoinChallenge, 2, 0, 1), &[0; 16], &other)
                    .as_bytes()
                    .to_vec(),
                DropReason::Unexpected(Kind::JoinChallenge),
            ),
        ];
        for (bytes, reason) in cases {
            let o = g.handle(&k, &p, at(T0), addr(5), &bytes);
            assert_eq!(o.event, Event::Dropped(reason));
            if let Some(r) = o.reply {
                assert!(r.len() <= bytes.len(), "reply {} > request {}", r.len(), bytes.len());
            }
        }
        let mut wrong_group = one.data(b"");
        wrong_group[4..6].copy_from_slice(&(PORT + 1).to_be_bytes());
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &wrong_group).event,
            Event::Dropped(DropReason::WrongGroup)
        );
        assert_eq!(g.len(), 1);
    }

    #[test]
    fn forged_replayed_and_spoofed_datagrams_move_nothing() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        let membership = g.members()[0].membership;
        let guess = SessionKeys::from_session([9; 32]);
        // Without the key: MACs and tags fail, whoever sends them.
        let ka = SmallDatagram::simple(&hdr(Kind::Keepalive, 1, membership, 1 << 40), &guess);
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), ka.as_bytes()).event,
            Event::Dropped(DropReason::BadMac)
        );
        let mut forged = vec![0u8; 64];
        let n = emit(
            &hdr(Kind::Data, 1, membership, 1 << 40),
            b"boo",
            Some(&guess),
            &mut forged,
        )
        .unwrap();
        let o = g.handle(&k, &p, at(T0), addr(0), &forged[..n]);
        assert_eq!(o.event, Event::Dropped(DropReason::BadTag));
        let leave = SmallDatagram::simple(&hdr(Kind::Leave, 1, membership, 1 << 40), &guess);
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), leave.as_bytes()).event,
            Event::Dropped(DropReason::BadMac)
        );
        // The member's own datagram replayed: from its address, a replay...
        let d = one.data(b"move");
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &d).event,
            Event::Forward { from: addr(0) }
        );
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &d).event,
            Event::Dropped(DropReason::Replay)
        );
        // ...from another address (a spoofed source, or a NAT rebinding): a
        // PROBE there, and no move, and the window does not advance.
        let ka = one.keepalive();
        let o = g.handle(&k, &p, at(T0), addr(9), &ka);
        assert_eq!(o.event, Event::Dropped(DropReason::Unvalidated));
        let probe = o.reply.expect("a PROBE to the new address");
        assert_eq!(Packet::parse(probe.as_bytes()).unwrap().kind(), Kind::Probe);
        assert_eq!(g.members()[0].addr, addr(0));
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &ka).event,
            Event::Refreshed,
            "still fresh at home"
        );
        // A second datagram from there within the second: no second PROBE.
        let ka2 = one.keepalive();
        let o = g.handle(&k, &p, at(T0 + 10), addr(9), &ka2);
        assert!(o.reply.is_none());
        // The PROBE's answer from the new address under the key moves it.
        let reply = one.answer(&probe).expect("a PROBE_REPLY");
        let o = g.handle(&k, &p, at(T0 + 20), addr(9), &reply);
        assert_eq!(
            o.event,
            Event::Rebound {
                from: addr(0),
                to: addr(9)
            }
        );
        assert_eq!(g.members()[0].addr, addr(9));
        assert_eq!(mirror(&mut g, &mut seen), [addr(1), addr(9)].into_iter().collect());
        // The same answer replayed, from anywhere, does nothing more.
        assert_eq!(
            g.handle(&k, &p, at(T0 + 30), addr(9), &reply).event,
            Event::Dropped(DropReason::Replay)
        );
        let o = g.handle(&k, &p, at(T0 + 30), addr(0), &reply);
        assert_eq!(o.event, Event::Dropped(DropReason::Unvalidated));
        assert_eq!(g.members()[0].addr, addr(9));
    }

    #[test]
    fn leave_and_expiry_keep_index_consistent() {
        let (k, p) = (
            keys(),
            Policy {
                member_timeout_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let mut players: Vec<Player> = (0..5)
            .map(|i| join(&mut g, &k, &p, T0, addr(i), u32::from(i)).0)
            .collect();
        let leave = players[1].leave();
        assert_eq!(g.handle(&k, &p, at(T0), addr(1), &leave).event, Event::Left);
        assert_eq!(g.len(), 4);
        // The member swapped into slot 1 must still be found.
        for i in [0usize, 2, 3, 4] {
            let d = players[i].data(b"x");
            let o = g.handle(&k, &p, at(T0 + 500), addr(i as u16), &d);
            assert!(matches!(o.event, Event::Forward { .. }), "member {i}");
        }
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        // Member 3 keeps talking, the rest fall silent.
        let ka = players[3].keepalive();
        assert_eq!(g.handle(&k, &p, at(T0 + 1400), addr(3), &ka).event, Event::Refreshed);
        assert_eq!(g.expire(&p, T0 + 1600).silent, 3);
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].sender, 3);
        assert_eq!(mirror(&mut g, &mut seen), [addr(3)].into_iter().collect());
        let d = players[3].data(b"");
        assert!(matches!(
            g.handle(&k, &p, at(T0 + 1600), addr(3), &d).event,
            Event::Forward { from } if from == addr(3)
        ));
    }

    #[test]
    fn rejoin_is_idempotent_and_groups_have_a_cap() {
        let (k, p) = (
            keys(),
            Policy {
                max_members: 2,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (first, o) = join(&mut g, &k, &p, T0, addr(0), 1);
        assert_eq!(o.event, Event::Joined { rejoin: false });
        let id = g.members()[0].membership;
        // The same key again (JOIN_ACK lost): numbers go on, same membership.
        let next = first.session.next_seq();
        let (_, o) = join_from(&mut g, &k, &p, T0, addr(0), 1, next);
        assert_eq!(o.event, Event::Joined { rejoin: true });
        assert_eq!(g.members()[0].membership, id);
        // A captured JOIN replayed (its sequence numbers seen): refused.
        let (_, o) = join_from(&mut g, &k, &p, T0, addr(0), 1, 1);
        assert_eq!(o.event, Event::Dropped(DropReason::Replay));
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(1), 2).1.event,
            Event::Joined { rejoin: false }
        );
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(2), 3).1.event,
            Event::Dropped(DropReason::GroupFull)
        );
        assert_eq!(g.len(), 2);
    }

    #[test]
    fn a_player_is_a_member_once_and_a_validated_join_moves_it() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (first, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        // Player 1 again from a new port with its key, fresh numbers and a
        // cookie that proves the new address: one entry, moved there.
        let (mut moved, o) = join_from(&mut g, &k, &p, T0, addr(7), 1, first.session.next_seq());
        assert_eq!(o.event, Event::Joined { rejoin: true });
        assert_eq!(g.len(), 2);
        let d = moved.data(b"x");
        assert!(matches!(
            g.handle(&k, &p, at(T0), addr(7), &d).event,
            Event::Forward { .. }
        ));
        let mut seen = HashSet::new();
        assert_eq!(mirror(&mut g, &mut seen), [addr(1), addr(7)].into_iter().collect());
        // Player 2 joins from player 1's address: player 1's entry goes.
        let (_, o) = join_from(&mut g, &k, &p, T0, addr(7), 2, 100);
        assert_eq!(o.event, Event::Joined { rejoin: true });
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].sender, 2);
        assert_eq!(g.members()[0].addr, addr(7));
        assert_eq!(mirror(&mut g, &mut seen), [addr(7)].into_iter().collect());
    }

    #[test]
    fn untagged_data_forwards_but_is_no_sign_of_life() {
        let (k, p) = (
            keys(),
            Policy {
                member_timeout_ms: 1000,
                data_tags: false,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut one, o) = join(&mut g, &k, &p, T0, addr(0), 1);
        let ack = Packet::parse(o.reply.unwrap().as_bytes().to_vec())
            .unwrap()
            .join_ack()
            .unwrap();
        assert!(!ack.tags());
        let d = one.data(b"x");
        assert_eq!(Packet::parse(&d[..]).unwrap().tag(), Some(0));
        assert_eq!(
            g.handle(&k, &p, at(T0 + 900), addr(0), &d).event,
            Event::Forward { from: addr(0) }
        );
        // Untagged DATA from elsewhere proves nothing: dropped, no PROBE.
        let o = g.handle(&k, &p, at(T0 + 900), addr(5), &d);
        assert_eq!(o.event, Event::Dropped(DropReason::Unvalidated));
        assert!(o.reply.is_none());
        assert_eq!(g.expire(&p, T0 + 1001).silent, 1, "DATA alone did not keep it");
        // A group may override the server's default.
        let mut tagged = Group::new(PORT);
        tagged.set_tags(true);
        let (_, o) = join(&mut tagged, &k, &p, T0, addr(0), 1);
        assert!(Packet::parse(o.reply.unwrap().as_bytes().to_vec())
            .unwrap()
            .join_ack()
            .unwrap()
            .tags());
    }

    #[test]
    fn probes_measure_each_members_round_trip() {
        let (k, p) = (
            keys(),
            Policy {
                keepalive_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let mut out = Vec::new();
        g.probes(&k, &p, T0 + 500, &mut out);
        assert!(out.is_empty(), "not due yet");
        g.probes(&k, &p, T0 + 1000, &mut out);
        assert_eq!(out.len(), 1);
        let (to, probe) = out.pop().unwrap();
        assert_eq!(to, addr(0));
        let reply = one.answer(&probe).expect("answered at once");
        let o = g.handle(&k, &p, at(T0 + 1042), addr(0), &reply);
        assert_eq!(o.event, Event::Probed { rtt_ms: 42 });
        assert_eq!(g.members()[0].rtt_ms, Some(42.0));
        // Answered again (a replay): nothing measured twice.
        assert_eq!(
            g.handle(&k, &p, at(T0 + 1100), addr(0), &reply).event,
            Event::Dropped(DropReason::Replay)
        );
    }

    #[test]
    fn one_address_holds_at_most_max_per_ip_members() {
        let (k, p) = (
            keys(),
            Policy {
                max_per_ip: 3,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        // addr(i) are ports of one IP address.
        let mut players: Vec<Player> = (0..3)
            .map(|i| join(&mut g, &k, &p, T0, addr(i), u32::from(i)).0)
            .collect();
        let (_, o) = join(&mut g, &k, &p, T0, addr(3), 3);
        assert_eq!(o.event, Event::Dropped(DropReason::AddressLimit));
        let err = Packet::parse(o.reply.unwrap().as_bytes().to_vec()).unwrap();
        assert_eq!(err.error_code(), Some(Ok(ErrorCode::AddressLimit)));
        assert_eq!(g.len(), 3);
        // Another host is not affected.
        let elsewhere = SocketAddr::from(([10, 0, 0, 2], 5000));
        assert_eq!(
            join(&mut g, &k, &p, T0, elsewhere, 9).1.event,
            Event::Joined { rejoin: false }
        );
        // A member of the full address leaves: there is room again.
        let leave = players[0].leave();
        assert_eq!(g.handle(&k, &p, at(T0), addr(0), &leave).event, Event::Left);
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(3), 3).1.event,
            Event::Joined { rejoin: false }
        );
        let _ = players.pop();
    }

    #[test]
    fn a_member_over_its_rate_cap_loses_only_its_own_excess() {
        let (k, p) = (
            keys(),
            Policy {
                member_pps: 5,
                member_bytes_per_s: 0,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut noisy, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let (mut quiet, _) = join(&mut g, &k, &p, T0, addr(1), 2);
        let verdicts: Vec<Event> = (0..8)
            .map(|_| g.handle(&k, &p, at(T0), addr(0), &noisy.data(b"x")).event)
            .collect();
        assert_eq!(
            verdicts.iter().filter(|e| matches!(e, Event::Forward { .. })).count(),
            5,
            "a second's burst"
        );
        assert_eq!(
            verdicts
                .iter()
                .filter(|e| **e == Event::Dropped(DropReason::RateLimited))
                .count(),
            3
        );
        let d = quiet.data(b"y");
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(1), &d).event,
            Event::Forward { from: addr(1) }
        );
        // 400 ms later two more are allowed.
        let later: Vec<Event> = (0..3)
            .map(|_| g.handle(&k, &p, at(T0 + 400), addr(0), &noisy.data(b"x")).event)
            .collect();
        assert_eq!(later.iter().filter(|e| matches!(e, Event::Forward { .. })).count(), 2);
        // The byte cap the same way: 200 bytes a second, datagrams of 132.
        let p = Policy {
            member_pps: 0,
            member_bytes_per_s: 200,
            ..Policy::default()
        };
        let mut g = Group::new(PORT);
        let (mut big, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let d = big.data(&[0; 100]);
        assert_eq!(d.len(), 132);
        assert!(matches!(
            g.handle(&k, &p, at(T0), addr(0), &d).event,
            Event::Forward { .. }
        ));
        let d = big.data(&[0; 100]);
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &d).event,
            Event::Dropped(DropReason::RateLimited)
        );
    }

    #[test]
    fn an_icmp_error_alone_never_removes_a_member() {
        let (k, p) = (
            keys(),
            Policy {
                keepalive_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut zero, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        assert!(!g.note_unreachable(addr(9), T0 + 100));
        // A (possibly forged) error about member 0, which keeps talking.
        assert!(g.note_unreachable(addr(0), T0 + 100));
        let ka = zero.keepalive();
        g.handle(&k, &p, at(T0 + 1500), addr(0), &ka);
        assert_eq!(g.expire(&p, T0 + 5000), Expired::default());
        // An error about member 1, silent since: it stays for two keepalive
        // intervals, then stops costing a send per datagram.
        assert!(g.note_unreachable(addr(1), T0 + 6000));
        assert!(
            g.note_unreachable(addr(1), T0 + 7000),
            "a later error keeps the first time"
        );
        assert_eq!(g.expire(&p, T0 + 7999), Expired::default());
        assert_eq!(
            g.expire(&p, T0 + 8000),
            Expired {
                silent: 0,
                unreachable: 1
            }
        );
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].addr, addr(0));
    }

    #[test]
    fn replies_to_non_members_are_rate_limited() {
        let k = keys();
        let p = Policy {
            replies_per_s: 10,
            ..Policy::default()
        };
        let mut g = Group::new(PORT);
        let mut spoofed = vec![0u8; 64];
        let n = emit(&hdr(Kind::Data, 9, 0, 1), b"spoofed data", None, &mut spoofed).unwrap();
        spoofed.truncate(n);
        let sent = |g: &mut Group, now: u64| g.handle(&k, &p, at(now), addr(3), &spoofed);
        let first: Vec<bool> = (0..15).map(|_| sent(&mut g, T0).reply.is_some()).collect();
        assert_eq!(first.iter().filter(|r| **r).count(), 10, "burst of replies_per_s");
        let o = sent(&mut g, T0);
        assert!(o.reply.is_none() && o.reply_suppressed);
        assert_eq!(o.event, Event::Dropped(DropReason::NotMember), "still counted");
        // 200 ms later two more tokens have accrued.
        let later: Vec<bool> = (0..5).map(|_| sent(&mut g, T0 + 200).reply.is_some()).collect();
        assert_eq!(later.iter().filter(|r| **r).count(), 2);
        // Members' JOIN_ACKs are never suppressed.
        assert_eq!(
            join(&mut g, &k, &Policy { replies_per_s: 10, ..p }, T0 + 2000, addr(0), 1)
                .1
                .event,
            Event::Joined { rejoin: false }
        );
    }

    #[test]
    fn liveness_follows_the_monotonic_clock_not_the_wall_clock() {
        let (k, p) = (
            keys(),
            Policy {
                member_timeout_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        // The wall clock jumps a day ahead; the monotonic clock moves 10 ms.
        let jumped = Now {
            unix_ms: T0 + 86_400_000,
            mono_ms: T0 + 10,
        };
        let d = one.data(b"x");
        assert!(matches!(
            g.handle(&k, &p, jumped, addr(0), &d).event,
            Event::Forward { .. }
        ));
        assert_eq!(g.expire(&p, T0 + 10).silent, 0);
        assert_eq!(g.expire(&p, T0 + 1011).silent, 1);
    }

    #[test]
    fn tokens_for_another_reflector_are_refused() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let t = TokenClaims {
            player: 5,
            reflector: 1,
            group: PORT,
            expires_unix_s: T0 / 1000 + 60,
        }
        .sign(&k.token_secret.current);
        let j = SmallDatagram::join(&hdr(Kind::Join, 5, 0, 1), &t, None, &session_keys(&k, &t));
        let o = g.handle(&k, &p, at(T0), addr(0), j.as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::Token(TokenError::WrongReflector)));
    }
}
