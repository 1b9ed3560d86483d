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

use reflector_proto::auth::{check_cookie, keyed_value, make_cookie, Secret, SecretRing, TokenClaims, TokenError};
use reflector_proto::protocol::{
    ErrorCode, Header, JoinAck, Kind, Packet, ParseError, ReplayWindow, SessionKeys, SmallDatagram, FLAG_INSTANCE,
    FLAG_TAGS, TOKEN_LEN,
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
    /// Replies nobody can verify (errors to non-members, to bad tokens, MACs
    /// and cookies, version errors) per second, with a burst of as many: one
    /// budget per event loop, which the caller applies
    /// ([`ReplyBudget::admit`]). Replies are never larger than their
    /// request, but a spoofed flood would still be reflected one for one onto
    /// its victim; this caps that, and nothing else draws on it.
    pub replies_per_s: u32,
    /// Replies per second (burst as many) to one verified player that is not
    /// a member, in one group: JOIN_CHALLENGEs (sent only after the token and
    /// the JOIN's MAC verified), refusals after its cookie, ERROR(Retry) and
    /// the occupancy checks it causes. A valid JOIN replayed from many
    /// addresses drains only its own player's share.
    pub player_replies_per_s: u32,
    /// Replies per second (burst as many) a member's own datagrams may
    /// cause: rebinding PROBEs (at most one a second in any case), the
    /// JOIN_CHALLENGE and JOIN_ACK of a re-JOIN, ERROR(Retry) and the
    /// occupancy checks it causes. Nothing a non-member sends touches it.
    pub member_replies_per_s: u32,
    /// DATA tags for groups that do not say otherwise ([`Group::set_tags`]).
    pub data_tags: bool,
    /// The instance flag (JOIN_ACK flag bit 1: every DATA's game payload
    /// starts with the sender's instance id) for groups that do not say
    /// otherwise ([`Group::set_instance`]). Only announced, never read.
    pub data_instance: bool,
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
            replies_per_s: 200,
            player_replies_per_s: 5,
            member_replies_per_s: 5,
            data_tags: true,
            data_instance: false,
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
    /// The monotonic clock in microseconds (the same instant as `mono_ms`):
    /// PROBE round trips are timed with it.
    pub mono_us: u64,
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
    /// A member's JOIN carrying another valid token of the player that
    /// does not expire later than the token the membership was made with
    /// (a captured older JOIN): it replaces nothing.
    OlderToken,
    Token(TokenError),
    BadCookie,
    GroupFull,
    /// A JOIN or rebind onto an address another member holds: refused
    /// (ERROR(Retry)) or not moved, while that member is checked.
    Occupied,
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
    /// A PROBE_REPLY from the member's address: its RTT was measured, in
    /// microseconds.
    Probed {
        rtt_us: u64,
    },
    /// A PROBE_REPLY from a new address under the key: the member moved.
    Rebound {
        from: SocketAddr,
        to: SocketAddr,
    },
    /// A PROBE_REPLY answered an occupancy check: the member keeps its
    /// address, whoever else wanted it.
    Held,
    /// A renewal from the member's address with a valid token: its expiry
    /// is the newer token's (if later); keys, window and id are unchanged.
    Renewed,
    /// A JOIN with cookie carrying another token of the player, expiring
    /// later than the membership's own: a restarted client; the membership
    /// is replaced (new id, the new token's keys, a fresh window).
    Replaced,
    /// An ECHO from the member's address: a sign of life, answered with
    /// ECHO_REPLY unless its echo budget is spent.
    Echoed,
    Dropped(DropReason),
}

/// Whose budget a reply comes from: whoever caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payer {
    /// No budget: no reply, or a JOIN_ACK admitting a new member (its cookie
    /// proved the address, its MAC the player; bounded by the group's size).
    Nobody,
    /// Nobody could be verified: the caller's global budget
    /// ([`ReplyBudget::admit`], [`Policy::replies_per_s`]).
    Unverified,
    /// A verified player that is not a member
    /// ([`Policy::player_replies_per_s`]); already paid.
    Player,
    /// A member ([`Policy::member_replies_per_s`]); already paid.
    Member,
}

/// The decision for one datagram: an event and maybe a reply to its source.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub event: Event,
    pub reply: Option<SmallDatagram>,
    /// Whose budget pays for the reply.
    pub payer: Payer,
    /// The type of a reply that was due but not sent: its payer's budget
    /// was spent (or, for a rebinding PROBE, one went within the second).
    pub suppressed: Option<Kind>,
}

impl Outcome {
    fn silent(event: Event) -> Outcome {
        Outcome {
            event,
            reply: None,
            payer: Payer::Nobody,
            suppressed: None,
        }
    }

    fn drop(reason: DropReason) -> Outcome {
        Outcome::silent(Event::Dropped(reason))
    }

    /// The one place replies are allowed out: never larger than the request.
    fn with_reply(event: Event, reply: SmallDatagram, request_len: usize, payer: Payer) -> Outcome {
        Outcome {
            event,
            reply: (reply.len() <= request_len).then_some(reply),
            payer,
            suppressed: None,
        }
    }

    /// A reply of `kind` was due, but `payer`'s budget is spent.
    fn withheld(event: Event, kind: Kind, payer: Payer) -> Outcome {
        Outcome {
            event,
            reply: None,
            payer,
            suppressed: Some(kind),
        }
    }

    /// `reply` as `paid` says: sent, withheld, or (`None`: the payer has no
    /// budget of its own here) left to the caller's global budget.
    fn paid(event: Event, reply: SmallDatagram, request_len: usize, payer: Payer, paid: Option<bool>) -> Outcome {
        match paid {
            Some(true) => Outcome::with_reply(event, reply, request_len, payer),
            Some(false) => Outcome::withheld(event, reply_kind(&reply), payer),
            None => Outcome::with_reply(event, reply, request_len, Payer::Unverified),
        }
    }

    /// The type of the reply, if there is one.
    pub fn reply_kind(&self) -> Option<Kind> {
        self.reply.as_ref().map(reply_kind)
    }
}

/// The type of a datagram the reflector built (a header always leads it).
fn reply_kind(r: &SmallDatagram) -> Kind {
    r.as_bytes()
        .get(3)
        .and_then(|&t| Kind::from_u8(t))
        .unwrap_or(Kind::Error)
}

/// A token bucket of replies: `per_s` a second, with a burst of as many.
/// The caller keeps one for replies nobody can verify ([`Payer::Unverified`]);
/// each member has one, and each verified player that is not a member one
/// per group.
#[derive(Debug, Clone, Copy)]
pub struct ReplyBudget {
    tokens: u64,
    last_ms: u64,
}

impl ReplyBudget {
    /// A full budget at `now_ms`.
    pub fn full(per_s: u32, now_ms: u64) -> ReplyBudget {
        ReplyBudget {
            tokens: u64::from(per_s),
            last_ms: now_ms,
        }
    }

    fn refill(&mut self, per_s: u32, now_ms: u64) {
        let per_s = u64::from(per_s);
        if per_s == 0 {
            self.tokens = 0;
            self.last_ms = now_ms;
            return;
        }
        let add = now_ms.saturating_sub(self.last_ms).saturating_mul(per_s) / 1000;
        if add > 0 {
            self.tokens = self.tokens.saturating_add(add).min(per_s);
            // Whole tokens only; the remainder of the time counts next time.
            self.last_ms = if self.tokens == per_s {
                now_ms
            } else {
                self.last_ms + add * 1000 / per_s
            };
        }
    }

    /// Takes `n` tokens if there are as many.
    pub fn take_n(&mut self, n: u64, per_s: u32, now_ms: u64) -> bool {
        self.refill(per_s, now_ms);
        if self.tokens < n {
            return false;
        }
        self.tokens -= n;
        true
    }

    pub fn take(&mut self, per_s: u32, now_ms: u64) -> bool {
        self.take_n(1, per_s, now_ms)
    }

    /// Whether the budget is back to full (it can be forgotten).
    fn is_full(&mut self, per_s: u32, now_ms: u64) -> bool {
        self.refill(per_s, now_ms);
        self.tokens >= u64::from(per_s)
    }

    /// Pays for `o`'s reply if nobody could be verified for it: withholds
    /// the reply once this budget is spent. Other replies were paid already.
    pub fn admit(&mut self, per_s: u32, now_ms: u64, o: &mut Outcome) {
        if o.payer != Payer::Unverified {
            return;
        }
        if let Some(r) = o.reply {
            if !self.take(per_s, now_ms) {
                o.reply = None;
                o.suppressed = Some(reply_kind(&r));
            }
        }
    }
}

/// Verified players that are not members, with a reply budget each, per
/// group: bounded; beyond it their replies fall to the global budget.
const MAX_PLAYER_BUDGETS: usize = 4096;

/// Occupancy checks: the holder of a wanted address is PROBEd twice, this
/// far apart (the server's sweep runs every 500 ms), and removed this long
/// after the second PROBE if it answered neither.
const OCCUPANCY_PROBE_GAP_MS: u64 = 500;

/// Rebinding PROBEs per member: at most one per this interval, and a
/// pending one is not replaced sooner.
const REBIND_PROBE_EVERY_MS: u64 = 1000;

/// ECHO_REPLYs per member per second (a burst of as many): a member's
/// echoes beyond it refresh it but are not answered.
pub const ECHO_REPLIES_PER_S: u32 = 4;

/// A check that a member still holds its address, because someone else
/// wants it: PROBEs under the member's own key (paid by whoever wants it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OccupancyCheck {
    /// The PROBEs' nonce (both carry it), 0 until the first is sent.
    pub nonce: u64,
    /// PROBEs sent so far (0, 1 or 2).
    pub probes: u8,
    /// When the last one went (or the check began, before the first).
    pub sent_ms: u64,
}

/// What one [`Group::probes`] call sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probed {
    /// RTT PROBEs.
    pub rtt: usize,
    /// Occupancy-check PROBEs.
    pub occupancy: usize,
    /// Occupancy checks begun (their first PROBE).
    pub checks_started: usize,
}

/// A PROBE on its way: to which address, with which nonce, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingProbe {
    pub addr: SocketAddr,
    pub nonce: u64,
    pub sent_ms: u64,
    /// When it went, monotonic microseconds ([`Now::mono_us`]).
    pub sent_us: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub addr: SocketAddr,
    pub sender: u32,
    /// The random id of this membership (in JOIN_ACK and every later MAC).
    pub membership: u32,
    pub keys: SessionKeys,
    /// The token the membership was made with (whose keys it uses); a
    /// renewal does not change it.
    pub token: [u8; TOKEN_LEN],
    /// Wall-clock ms ([`Now::unix_ms`]) at which the membership ends: its
    /// latest token's expiry (the token is valid while now is earlier).
    pub expires_unix_ms: u64,
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
    /// When the last rebinding PROBE went (monotonic ms): one a second.
    pub rebind_sent_ms: Option<u64>,
    /// The highest sequence number that caused a rebinding PROBE: only a
    /// later one may cause another (a captured datagram causes one at most).
    pub rebind_seq: u64,
    /// Someone else wants this member's address: it is being PROBEd.
    pub check: Option<OccupancyCheck>,
    /// Replies this member's own datagrams may cause.
    pub replies: ReplyBudget,
    /// ECHO_REPLYs it may have ([`ECHO_REPLIES_PER_S`]).
    pub echo: ReplyBudget,
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
    /// Held an address someone else wanted and answered neither PROBE of
    /// the occupancy check.
    pub occupied: usize,
    /// Their token expired (wall clock) and they had not renewed it.
    pub tokens: usize,
}

impl Expired {
    /// Members removed, all rules together.
    pub fn total(&self) -> usize {
        self.silent + self.unreachable + self.occupied + self.tokens
    }
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
    /// Reply budgets of verified players that are not members (bounded by
    /// [`MAX_PLAYER_BUDGETS`], full ones forgotten by [`Group::expire`]).
    players: HashMap<u32, ReplyBudget>,
    /// DATA tags here, if not the policy's default.
    tags: Option<bool>,
    /// The instance flag here, if not the policy's default.
    instance: Option<bool>,
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
            players: HashMap::new(),
            tags: None,
            instance: None,
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

    /// The instance flag in this group whatever the policy's default (new
    /// members learn it in JOIN_ACK).
    pub fn set_instance(&mut self, on: bool) {
        self.instance = Some(on);
    }

    /// Whether this group's JOIN_ACK announces the instance flag.
    pub fn instance_on(&self, policy: &Policy) -> bool {
        self.instance.unwrap_or(policy.data_instance)
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

    /// A renewal (a JOIN carrying the membership's id, MAC'd under its
    /// key): from the member's validated address, with a fresh sequence
    /// number and a valid token, the membership's expiry becomes the
    /// token's (if later) and a JOIN_ACK of the same membership answers it,
    /// from the member's budget; keys, window, id and the backend's entry
    /// stay. From another address it is a rebinding trigger like any
    /// authenticated datagram.
    fn renewal(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, pkt: &Packet<&[u8]>) -> Outcome {
        let len = pkt.as_bytes().len();
        let sender = pkt.sender();
        // parse() guarantees a JOIN carries a token; a renewal no cookie.
        let (Some(token), None) = (pkt.join_token(), pkt.join_cookie()) else {
            return Outcome::drop(DropReason::Malformed(ParseError::BadPayload(Kind::Join)));
        };
        let Some(&idx) = self.by_player.get(&sender) else {
            let err = SmallDatagram::error(self.port, sender, pkt.membership(), ErrorCode::NotMember);
            return Outcome::with_reply(Event::Dropped(DropReason::NotMember), err, len, Payer::Unverified);
        };
        let m = self.members[idx];
        if pkt.membership() != m.membership {
            return Outcome::drop(DropReason::StaleMembership);
        }
        if !m.keys.verify(pkt) {
            return Outcome::drop(DropReason::BadMac);
        }
        if src != m.addr {
            return self.elsewhere(keys, policy, now, src, pkt, idx, true);
        }
        if !self.members[idx].window.accept(pkt.seq()) {
            return Outcome::drop(DropReason::Replay);
        }
        let claims = match keys
            .token_secret
            .verify_token(token, keys.reflector_id, self.port, sender, now.unix_ms)
        {
            Ok(c) => c,
            Err(e) => {
                let code = if e == TokenError::Expired {
                    ErrorCode::ExpiredToken
                } else {
                    ErrorCode::BadToken
                };
                let err = SmallDatagram::error(self.port, sender, m.membership, code);
                return Outcome::with_reply(Event::Dropped(DropReason::Token(e)), err, len, Payer::Unverified);
            }
        };
        let mm = &mut self.members[idx];
        // A retried renewal whose JOIN_ACK was lost carries the same token:
        // answered again, and an older token never shortens the membership.
        mm.expires_unix_ms = mm.expires_unix_ms.max(claims.expires_unix_s.saturating_mul(1000));
        mm.last_seen_ms = now.mono_ms;
        mm.unreachable_since_ms = None;
        if self.member_pays(idx, 1, policy, now.mono_ms) != Some(true) {
            return Outcome::withheld(Event::Renewed, Kind::JoinAck, Payer::Member);
        }
        let ack = self.join_ack(idx, policy);
        Outcome::with_reply(Event::Renewed, ack, len, Payer::Member)
    }

    /// JOIN_ACK of member `idx`, under its key, with its next sequence number.
    fn join_ack(&mut self, idx: usize, policy: &Policy) -> SmallDatagram {
        let members = u16::try_from(self.members.len()).unwrap_or(u16::MAX);
        let instance = self.instance_on(policy);
        let port = self.port;
        let m = &mut self.members[idx];
        let h = m.next_header(Kind::JoinAck, port);
        let mut flags = 0;
        if m.tags {
            flags |= FLAG_TAGS;
        }
        if instance {
            flags |= FLAG_INSTANCE;
        }
        let ack = JoinAck {
            members,
            keepalive_ms: policy.keepalive_ms,
            flags,
            checkpoint_port: policy.checkpoint_port,
        };
        SmallDatagram::join_ack(&h, ack, &m.keys)
    }

    /// A new member's state: `seq` (the JOIN's) starts its window, and every
    /// number below it counts as used (the client's numbers only grow), so a
    /// captured first JOIN replayed later is no news either.
    #[allow(clippy::too_many_arguments)]
    fn new_member(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now_ms: u64,
        src: SocketAddr,
        sender: u32,
        session: SessionKeys,
        token: &[u8; TOKEN_LEN],
        seq: u64,
    ) -> Member {
        let membership = (self.fresh(keys, b"mbid", now_ms) as u32).max(1);
        Member {
            addr: src,
            sender,
            membership,
            keys: session,
            token: *token,
            expires_unix_ms: TokenClaims::peek(token).expires_unix_s.saturating_mul(1000),
            window: ReplayWindow {
                highest: seq,
                bitmap: u64::MAX,
            },
            tx_seq: 1,
            tags: self.tags_on(policy),
            last_seen_ms: now_ms,
            unreachable_since_ms: None,
            probe: None,
            rebind: None,
            rebind_sent_ms: None,
            rebind_seq: 0,
            check: None,
            replies: ReplyBudget::full(policy.member_replies_per_s, now_ms),
            echo: ReplyBudget::full(ECHO_REPLIES_PER_S, now_ms),
            rtt_ms: None,
            probed_ms: now_ms,
            rate: RateBucket::full(policy, now_ms),
        }
    }

    fn join(&mut self, keys: &Keys, policy: &Policy, now: Now, src: SocketAddr, pkt: &Packet<&[u8]>) -> Outcome {
        let len = pkt.as_bytes().len();
        let sender = pkt.sender();
        let now_ms = now.mono_ms;
        // parse() guarantees a JOIN carries a token.
        let Some(token) = pkt.join_token() else {
            return Outcome::drop(DropReason::Malformed(ParseError::BadPayload(Kind::Join)));
        };
        let (claims, session) =
            match keys
                .token_secret
                .verify_token_keys(token, keys.reflector_id, self.port, sender, now.unix_ms)
            {
                Ok(ck) => ck,
                Err(e) => {
                    let code = if e == TokenError::Expired {
                        ErrorCode::ExpiredToken
                    } else {
                        ErrorCode::BadToken
                    };
                    let err = SmallDatagram::error(self.port, sender, 0, code);
                    return Outcome::with_reply(Event::Dropped(DropReason::Token(e)), err, len, Payer::Unverified);
                }
            };
        if !session.verify(pkt) {
            let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::BadMac);
            return Outcome::with_reply(Event::Dropped(DropReason::BadMac), err, len, Payer::Unverified);
        }
        let existing = self.by_player.get(&sender).copied();
        // A member's JOIN with another token than the membership was made
        // with: a client that restarted (new key, its counter from 1) if that
        // token expires later; anything else (a captured older JOIN) is
        // dropped unanswered.
        let replaces = existing.is_some_and(|idx| self.members[idx].token != *token);
        if let Some(idx) = existing {
            if replaces {
                let made = TokenClaims::peek(&self.members[idx].token).expires_unix_s;
                if claims.expires_unix_s <= made {
                    return Outcome::drop(DropReason::OlderToken);
                }
            } else if !self.members[idx].window.fresh(pkt.seq()) {
                // A member's JOIN must carry a sequence number it has not
                // used (checked, not yet taken): a captured one replayed
                // causes nothing.
                return Outcome::drop(DropReason::Replay);
            }
        }
        let Some(cookie) = pkt.join_cookie() else {
            // The token and the MAC verified: the player pays (a member
            // from its own budget), whatever address it claims; with its
            // budget spent, no cookie is even made.
            let (payer, paid) = match existing {
                Some(idx) => (Payer::Member, self.member_pays(idx, 1, policy, now_ms)),
                None => (Payer::Player, self.player_pays(sender, 1, policy, now_ms)),
            };
            if paid == Some(false) {
                return Outcome::withheld(Event::Challenged, Kind::JoinChallenge, payer);
            }
            let cookie = make_cookie(&keys.cookie_key, &src, self.port, sender, now.unix_ms);
            let h = Header {
                kind: Kind::JoinChallenge,
                group: self.port,
                sender,
                membership: 0,
                seq: 1,
            };
            let ch = SmallDatagram::challenge(&h, &cookie, &session);
            return Outcome::paid(Event::Challenged, ch, len, payer, paid);
        };
        if !check_cookie(&keys.cookie_key, cookie, &src, self.port, sender, now.unix_ms) {
            let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::BadCookie);
            return Outcome::with_reply(Event::Dropped(DropReason::BadCookie), err, len, Payer::Unverified);
        }
        // From here the cookie proved the address and the MAC the player.
        let retry = SmallDatagram::error(self.port, sender, 0, ErrorCode::Retry);
        let occupied = Event::Dropped(DropReason::Occupied);
        let idx = match existing {
            Some(idx) => {
                // The player again. The sequence number is taken now, so a
                // captured JOIN replayed later moves nothing.
                if !replaces {
                    self.members[idx].window.accept(pkt.seq());
                }
                let old = self.members[idx].addr;
                if old != src {
                    if let Some(&holder) = self.by_addr.get(&src) {
                        // Another member's address: it is checked under its
                        // own key (this member pays), and this one is told
                        // to try again.
                        let cost = 1 + self.check_cost(holder);
                        let paid = self.member_pays(idx, cost, policy, now_ms);
                        if paid == Some(true) {
                            self.check_holder(holder, now_ms);
                        }
                        return Outcome::paid(occupied, retry, len, Payer::Member, paid);
                    }
                }
                if replaces {
                    // A new membership in the old one's place: its budgets
                    // stay (the same player pays), the rest starts afresh,
                    // and the backend drops the old entry (key, window) for
                    // the new one even at the same address.
                    let mut m = self.new_member(keys, policy, now_ms, src, sender, session, token, pkt.seq());
                    let prev = self.members[idx];
                    m.replies = prev.replies;
                    m.echo = prev.echo;
                    m.rate = prev.rate;
                    self.members[idx] = m;
                    self.by_addr.remove(&old);
                    self.by_addr.insert(src, idx);
                    self.address_removed(old);
                    self.address_added(src);
                    self.changes.push(Change::Removed(old));
                    self.changes.push(Change::Added(src));
                } else if old != src {
                    self.by_addr.remove(&old);
                    self.by_addr.insert(src, idx);
                    self.address_removed(old);
                    self.address_added(src);
                    self.members[idx].addr = src;
                    self.members[idx].check = None;
                    self.members[idx].probe = None;
                    self.changes.push(Change::Removed(old));
                    self.changes.push(Change::Added(src));
                }
                let m = &mut self.members[idx];
                m.last_seen_ms = now_ms;
                m.unreachable_since_ms = None;
                m.rebind = None;
                idx
            }
            None => {
                if self.members.len() >= policy.max_members {
                    let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::GroupFull);
                    let paid = self.player_pays(sender, 1, policy, now_ms);
                    return Outcome::paid(Event::Dropped(DropReason::GroupFull), err, len, Payer::Player, paid);
                }
                if let Some(&holder) = self.by_addr.get(&src) {
                    // Another player's membership at this address: never
                    // removed for this JOIN. It is checked under its own key
                    // (this player pays; with no budget of its own here the
                    // check goes ahead and the global budget pays the reply),
                    // and removed only if it answers neither PROBE.
                    let cost = 1 + self.check_cost(holder);
                    let paid = self.player_pays(sender, cost, policy, now_ms);
                    if paid != Some(false) {
                        self.check_holder(holder, now_ms);
                    }
                    return Outcome::paid(occupied, retry, len, Payer::Player, paid);
                }
                if self.per_ip.get(&src.ip()).copied().unwrap_or(0) >= policy.max_per_ip {
                    let err = SmallDatagram::error(self.port, sender, 0, ErrorCode::AddressLimit);
                    let paid = self.player_pays(sender, 1, policy, now_ms);
                    return Outcome::paid(Event::Dropped(DropReason::AddressLimit), err, len, Payer::Player, paid);
                }
                let idx = self.members.len();
                let m = self.new_member(keys, policy, now_ms, src, sender, session, token, pkt.seq());
                self.members.push(m);
                self.address_added(src);
                self.by_addr.insert(src, idx);
                self.by_player.insert(sender, idx);
                self.players.remove(&sender);
                self.changes.push(Change::Added(src));
                idx
            }
        };
        // A re-JOIN's JOIN_ACK is the member's to pay; a new member's is
        // free (its cookie and MAC verified; the group's size bounds them).
        let (payer, paid) = match existing {
            Some(idx) => (Payer::Member, self.member_pays(idx, 1, policy, now_ms)),
            None => (Payer::Nobody, Some(true)),
        };
        let reply = self.join_ack(idx, policy);
        let event = if replaces {
            Event::Replaced
        } else {
            Event::Joined {
                rejoin: existing.is_some(),
            }
        };
        Outcome::paid(event, reply, len, payer, paid)
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
            mono_us: ms * 1000,
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
        join_with(g, k, p, now, src, player, first_seq, token(k, player, PORT, 60))
    }

    /// [`join_from`] with the token given.
    #[allow(clippy::too_many_arguments)]
    fn join_with(
        g: &mut Group,
        k: &Keys,
        p: &Policy,
        now: u64,
        src: SocketAddr,
        player: u32,
        first_seq: u64,
        t: [u8; TOKEN_LEN],
    ) -> (Player, Outcome) {
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
        // The first step is challenged, unless it is a replay.
        assert!(matches!(
            outcomes[0].event,
            Event::Challenged | Event::Dropped(DropReason::Replay)
        ));
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
        assert_eq!(g.expire(&p, at(T0 + 1600)).silent, 3);
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
        // A captured JOIN replayed (its sequence numbers seen): refused at
        // the first step, unanswered.
        let (_, o) = join_from(&mut g, &k, &p, T0, addr(0), 1, 1);
        assert_eq!(o.event, Event::Dropped(DropReason::Replay));
        assert!(o.reply.is_none() && o.suppressed.is_none());
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

    /// One sweep of the server's timer: expiry, then the PROBEs due, which
    /// the players listed (at their addresses) answer 2 ms later.
    fn sweep(g: &mut Group, k: &Keys, p: &Policy, now: u64, live: &mut [(SocketAddr, &mut Player)]) -> Expired {
        let gone = g.expire(p, at(now));
        let mut out = Vec::new();
        g.probes(k, p, at(now), &mut out);
        for (to, probe) in out {
            if let Some((a, pl)) = live.iter_mut().find(|(a, _)| *a == to) {
                if let Some(r) = pl.answer(&probe) {
                    g.handle(k, p, at(now + 2), *a, &r);
                }
            }
        }
        gone
    }

    /// The three ways onto an address another player's membership holds.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Onto {
        /// A player that is no member JOINs from there (spoofed, echoing the
        /// challenge it saw on the path).
        Join,
        /// A member JOINs again from there.
        Rejoin,
        /// A member sends its own KEEPALIVE from there and answers the
        /// rebinding PROBE under its key.
        Rebind,
    }

    /// The attacker (player 66, with its own valid token and key) takes path
    /// `how` onto the victim's (player 1's) address once a second for 6 s,
    /// the server's sweep running every 500 ms. The victim answers every
    /// PROBE if `victim_answers`, and its DATA must keep being forwarded
    /// then. Returns when (ms after the start) the attacker held the address.
    fn take_over(how: Onto, victim_answers: bool) -> Option<u64> {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut victim, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let (mut attacker, mut seq) = match how {
            Onto::Join => (None, 1),
            Onto::Rejoin | Onto::Rebind => {
                let (a, _) = join(&mut g, &k, &p, T0, addr(1), 66);
                let next = a.session.next_seq();
                (Some(a), next)
            }
        };
        let holds = |g: &Group, player: u32| g.members().iter().any(|m| m.sender == player && m.addr == addr(0));
        for round in 0..6u64 {
            let base = T0 + 1 + round * 1000;
            let mut live = [(addr(0), &mut victim)];
            let live: &mut [(SocketAddr, &mut Player)] = if victim_answers { &mut live } else { &mut [] };
            sweep(&mut g, &k, &p, base, live);
            match how {
                Onto::Join | Onto::Rejoin => {
                    let (pl, o) = join_from(&mut g, &k, &p, base + 1, addr(0), 66, seq);
                    seq = pl.session.next_seq();
                    if o.event == Event::Dropped(DropReason::Occupied) {
                        let err = Packet::parse(o.reply.expect("paid").as_bytes().to_vec()).unwrap();
                        assert_eq!(err.error_code(), Some(Ok(ErrorCode::Retry)));
                        assert!(pl.session.poll_timeout().is_some(), "the client waits to retry");
                    } else {
                        assert!(!victim_answers, "{how:?}: {:?}", o.event);
                    }
                }
                Onto::Rebind => {
                    let a = attacker.as_mut().unwrap();
                    let ka = a.keepalive();
                    if let Some(probe) = g.handle(&k, &p, at(base + 1), addr(0), &ka).reply {
                        let r = a.answer(&probe).expect("answered under the attacker's key");
                        let ev = g.handle(&k, &p, at(base + 2), addr(0), &r).event;
                        assert!(
                            ev == Event::Dropped(DropReason::Occupied) || !victim_answers,
                            "{how:?}: {ev:?}"
                        );
                    }
                }
            }
            if holds(&g, 66) {
                return Some(base + 1 - T0);
            }
            if victim_answers {
                assert!(
                    holds(&g, 1),
                    "{how:?}: the answering victim was removed in round {round}"
                );
                let d = victim.data(b"still here");
                assert_eq!(
                    g.handle(&k, &p, at(base + 3), addr(0), &d).event,
                    Event::Forward { from: addr(0) },
                    "{how:?}: round {round}"
                );
            }
            let mut live = [(addr(0), &mut victim)];
            let live: &mut [(SocketAddr, &mut Player)] = if victim_answers { &mut live } else { &mut [] };
            sweep(&mut g, &k, &p, base + 500, live);
        }
        None
    }

    #[test]
    fn a_join_onto_a_members_address_never_removes_an_answering_member() {
        assert_eq!(take_over(Onto::Join, true), None);
    }

    #[test]
    fn a_rejoin_onto_a_members_address_never_removes_an_answering_member() {
        assert_eq!(take_over(Onto::Rejoin, true), None);
    }

    #[test]
    fn a_rebind_onto_a_members_address_never_removes_an_answering_member() {
        assert_eq!(take_over(Onto::Rebind, true), None);
    }

    #[test]
    fn a_silent_incumbent_is_replaced_after_two_unanswered_probes() {
        for how in [Onto::Join, Onto::Rejoin, Onto::Rebind] {
            let t = take_over(how, false).expect("the dead incumbent is replaced");
            // Checked at the first sweep (500 ms), probed twice 500 ms
            // apart, removed at the next sweep; the attacker's next try wins.
            assert!((1000..=2100).contains(&t), "{how:?}: after {t} ms");
        }
    }

    /// The check is the newcomer's: paid from its budget, the holder's
    /// own budget, pending RTT PROBE and pending rebinding PROBE untouched.
    #[test]
    fn an_occupancy_check_is_paid_by_the_newcomer_and_leaves_the_holders_probes_alone() {
        let (k, p) = (
            keys(),
            Policy {
                keepalive_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (mut victim, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let ka = victim.keepalive();
        assert!(
            g.handle(&k, &p, at(T0 + 10), addr(5), &ka).reply.is_some(),
            "a rebinding PROBE"
        );
        let mut out = Vec::new();
        assert_eq!(g.probes(&k, &p, at(T0 + 1000), &mut out).rtt, 1);
        let before = g.members()[0];
        assert!(before.probe.is_some() && before.rebind.is_some());
        let (_, o) = join_from(&mut g, &k, &p, T0 + 1001, addr(0), 66, 1);
        assert_eq!(
            (o.event, o.payer),
            (Event::Dropped(DropReason::Occupied), Payer::Player)
        );
        // 5 tokens: the challenge, then ERROR(Retry) and the check's 2 PROBEs.
        assert_eq!(g.players[&66].tokens, 1);
        let m = g.members()[0];
        assert_eq!(
            (m.replies.tokens, m.probe, m.rebind),
            (before.replies.tokens, before.probe, before.rebind)
        );
        assert!(m.check.is_some());
        // A second newcomer while the check runs pays for its Retry only.
        let (_, o) = join_from(&mut g, &k, &p, T0 + 1002, addr(0), 67, 1);
        assert_eq!(o.event, Event::Dropped(DropReason::Occupied));
        assert_eq!(g.players[&67].tokens, 3);
        out.clear();
        let sent = g.probes(&k, &p, at(T0 + 1100), &mut out);
        assert_eq!((sent.rtt, sent.occupancy, sent.checks_started), (0, 1, 1));
        assert_eq!(out[0].0, addr(0));
        let m = g.members()[0];
        assert_eq!((m.probe, m.rebind), (before.probe, before.rebind));
        // The holder answers under its key: it stays, the check ends.
        let r = victim.answer(&out[0].1).unwrap();
        assert_eq!(g.handle(&k, &p, at(T0 + 1150), addr(0), &r).event, Event::Held);
        assert!(g.members()[0].check.is_none());
        assert_eq!(g.expire(&p, at(T0 + 5000)), Expired::default());
    }

    /// Non-member traffic (spoofed floods of every kind) cannot spend the
    /// budget a member's rebinding PROBE comes from.
    #[test]
    fn a_flood_of_non_member_traffic_cannot_stop_a_rebinding_probe() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let spoof = |i: u32| SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 7000));
        let other = SessionKeys::from_session([3; 32]);
        for i in 0..2000u32 {
            let ka = SmallDatagram::simple(&hdr(Kind::Keepalive, 2, 0, 1), &other);
            g.handle(&k, &p, at(T0 + 100), spoof(i), ka.as_bytes());
            let t = token(&k, 9, PORT, 60);
            let j = SmallDatagram::join(&hdr(Kind::Join, 9, 0, 1), &t, None, &session_keys(&k, &t));
            g.handle(&k, &p, at(T0 + 100), spoof(i), j.as_bytes());
        }
        let ka = one.keepalive();
        let o = g.handle(&k, &p, at(T0 + 100), addr(9), &ka);
        let probe = o.reply.expect("a PROBE to the new address");
        let r = one.answer(&probe).unwrap();
        assert_eq!(
            g.handle(&k, &p, at(T0 + 110), addr(9), &r).event,
            Event::Rebound {
                from: addr(0),
                to: addr(9)
            }
        );
    }

    /// A valid JOIN of one player replayed from many addresses drains that
    /// player's share of challenges only: another player is still challenged.
    #[test]
    fn a_replayed_join_drains_only_its_players_challenges() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let t = token(&k, 66, PORT, 60);
        let j = SmallDatagram::join(&hdr(Kind::Join, 66, 0, 1), &t, None, &session_keys(&k, &t));
        let mut challenged = 0;
        for i in 0..2000u32 {
            let from = SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 7000));
            if g.handle(&k, &p, at(T0), from, j.as_bytes()).reply.is_some() {
                challenged += 1;
            }
        }
        assert!(
            challenged <= 10,
            "{challenged} challenges for one player in one instant"
        );
        let (_, o) = join(&mut g, &k, &p, T0, addr(0), 7);
        assert_eq!(o.event, Event::Joined { rejoin: false });
    }

    /// One captured KEEPALIVE replayed from 100 addresses: one PROBE at
    /// most, and the member's real rebinding is not blocked.
    #[test]
    fn a_replayed_keepalive_neither_floods_probes_nor_blocks_rebinding() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        // The member rebinds to addr(9); its KEEPALIVE from there is seen.
        let ka = one.keepalive();
        let o = g.handle(&k, &p, at(T0 + 100), addr(9), &ka);
        let probe = o.reply.expect("a PROBE to the member's new address");
        let mut probes = 0;
        for i in 0..100u16 {
            let from = SocketAddr::from(([10, 2, 0, i as u8], 7000 + i));
            let o = g.handle(&k, &p, at(T0 + 101 + u64::from(i) * 30), from, &ka);
            probes += usize::from(o.reply.is_some());
        }
        assert_eq!(probes, 0, "the replays took no PROBE: the pending one stands");
        // The member answers (its PROBE_REPLY arrives late, after the replays).
        let r = one.answer(&probe).unwrap();
        assert_eq!(
            g.handle(&k, &p, at(T0 + 3200), addr(9), &r).event,
            Event::Rebound {
                from: addr(0),
                to: addr(9)
            }
        );
        // Replayed again later from anywhere: no PROBE (not fresh any more
        // than when it first triggered one).
        let mut probes = 0;
        for i in 0..100u16 {
            let from = SocketAddr::from(([10, 2, 1, i as u8], 7000 + i));
            let o = g.handle(&k, &p, at(T0 + 4000 + u64::from(i) * 30), from, &ka);
            probes += usize::from(o.reply.is_some());
        }
        assert_eq!(probes, 0);
    }

    /// Fresh datagrams from ever new addresses: one rebinding PROBE a second.
    #[test]
    fn at_most_one_rebinding_probe_per_member_per_second() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let mut sent = Vec::new();
        for i in 0..300u16 {
            let now = T0 + u64::from(i) * 10;
            let ka = one.keepalive();
            let from = SocketAddr::from(([10, 3, (i >> 8) as u8, i as u8], 7000));
            if g.handle(&k, &p, at(now), from, &ka).reply.is_some() {
                sent.push(now);
            }
        }
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(sent.windows(2).all(|w| w[1] - w[0] >= 1000), "{sent:?}");
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
        // Player 2 joins from player 1's address: told to retry, while
        // player 1 is checked; player 1's entry stays (see take_over).
        let (_, o) = join_from(&mut g, &k, &p, T0, addr(7), 2, 100);
        assert_eq!(o.event, Event::Dropped(DropReason::Occupied));
        let err = Packet::parse(o.reply.unwrap().as_bytes().to_vec()).unwrap();
        assert_eq!(err.error_code(), Some(Ok(ErrorCode::Retry)));
        assert_eq!(g.len(), 2);
        assert_eq!(mirror(&mut g, &mut seen), [addr(1), addr(7)].into_iter().collect());
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
        assert_eq!(g.expire(&p, at(T0 + 1001)).silent, 1, "DATA alone did not keep it");
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
        g.probes(&k, &p, at(T0 + 500), &mut out);
        assert!(out.is_empty(), "not due yet");
        g.probes(&k, &p, at(T0 + 1000), &mut out);
        assert_eq!(out.len(), 1);
        let (to, probe) = out.pop().unwrap();
        assert_eq!(to, addr(0));
        let reply = one.answer(&probe).expect("answered at once");
        // Answered 137 us later, within the same millisecond: measured in
        // microseconds, not rounded to 0 ms.
        let answered = Now {
            mono_us: (T0 + 1000) * 1000 + 137,
            ..at(T0 + 1000)
        };
        let o = g.handle(&k, &p, answered, addr(0), &reply);
        assert_eq!(o.event, Event::Probed { rtt_us: 137 });
        assert_eq!(g.members()[0].rtt_ms, Some(0.137));
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
        assert_eq!(g.expire(&p, at(T0 + 5000)), Expired::default());
        // An error about member 1, silent since: it stays for two keepalive
        // intervals, then stops costing a send per datagram.
        assert!(g.note_unreachable(addr(1), T0 + 6000));
        assert!(
            g.note_unreachable(addr(1), T0 + 7000),
            "a later error keeps the first time"
        );
        assert_eq!(g.expire(&p, at(T0 + 7999)), Expired::default());
        assert_eq!(
            g.expire(&p, at(T0 + 8000)),
            Expired {
                silent: 0,
                unreachable: 1,
                occupied: 0,
                tokens: 0,
            }
        );
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].addr, addr(0));
    }

    /// Replies nobody can verify come from the caller's one global budget,
    /// version errors included (the server's), and nothing else draws on it.
    #[test]
    fn unverifiable_replies_share_one_small_global_budget() {
        let k = keys();
        let p = Policy {
            replies_per_s: 10,
            ..Policy::default()
        };
        let mut g = Group::new(PORT);
        let mut global = ReplyBudget::full(p.replies_per_s, T0);
        let mut spoofed = vec![0u8; 64];
        let n = emit(&hdr(Kind::Data, 9, 0, 1), b"spoofed data", None, &mut spoofed).unwrap();
        spoofed.truncate(n);
        let bad_token = SmallDatagram::join(&hdr(Kind::Join, 9, 0, 1), &[0; TOKEN_LEN], None, &keys_guess());
        let mut sent = |g: &mut Group, now: u64, d: &[u8]| {
            let mut o = g.handle(&k, &p, at(now), addr(3), d);
            assert_eq!(o.payer, Payer::Unverified);
            global.admit(p.replies_per_s, now, &mut o);
            o
        };
        let first: Vec<bool> = (0..15)
            .map(|i| {
                let d: &[u8] = if i % 2 == 0 { &spoofed } else { bad_token.as_bytes() };
                sent(&mut g, T0, d).reply.is_some()
            })
            .collect();
        assert_eq!(first.iter().filter(|r| **r).count(), 10, "burst of replies_per_s");
        let o = sent(&mut g, T0, &spoofed);
        assert!(o.reply.is_none());
        assert_eq!(o.suppressed, Some(Kind::Error));
        assert_eq!(o.event, Event::Dropped(DropReason::NotMember), "still counted");
        // 200 ms later two more tokens have accrued.
        let later: Vec<bool> = (0..5)
            .map(|_| sent(&mut g, T0 + 200, &spoofed).reply.is_some())
            .collect();
        assert_eq!(later.iter().filter(|r| **r).count(), 2);
        // The global budget is spent, yet a real player is challenged and
        // admitted: its replies are paid from its own budget.
        let (_, o) = join(&mut g, &k, &p, T0 + 200, addr(0), 1);
        assert_eq!(o.event, Event::Joined { rejoin: false });
        assert_eq!(o.payer, Payer::Nobody);
    }

    fn keys_guess() -> SessionKeys {
        SessionKeys::from_session([9; 32])
    }

    /// Each member's and each verified player's budget: spent by its own
    /// traffic only, refilled at its rate; full player budgets are forgotten.
    #[test]
    fn member_and_player_budgets_are_their_own() {
        let (k, p) = (
            keys(),
            Policy {
                player_replies_per_s: 3,
                member_replies_per_s: 2,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        // Player 66's valid JOIN, replayed: 3 challenges, then withheld.
        let t = token(&k, 66, PORT, 60);
        let j = SmallDatagram::join(&hdr(Kind::Join, 66, 0, 1), &t, None, &session_keys(&k, &t));
        let outs: Vec<Outcome> = (0..5)
            .map(|i| g.handle(&k, &p, at(T0), addr(10 + i), j.as_bytes()))
            .collect();
        assert!(outs
            .iter()
            .all(|o| o.payer == Payer::Player && o.event == Event::Challenged));
        assert_eq!(outs.iter().filter(|o| o.reply.is_some()).count(), 3);
        assert_eq!(outs[4].suppressed, Some(Kind::JoinChallenge));
        // Another player is not affected; a second later 66 has 3 again.
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(0), 1).1.event,
            Event::Joined { rejoin: false }
        );
        assert!(g.handle(&k, &p, at(T0 + 1000), addr(10), j.as_bytes()).reply.is_some());
        // Full budgets are forgotten by the sweep.
        assert_eq!(g.players.len(), 1);
        g.expire(&p, at(T0 + 2000));
        assert!(g.players.is_empty());
        // A member's re-JOIN steps come from its own budget (2 a second):
        // a captured re-JOIN is not fresh and costs nothing.
        let (mut one, _) = join(&mut g, &k, &p, T0 + 2000, addr(1), 2);
        let s = one.session.next_seq();
        let (_, o) = join_from(&mut g, &k, &p, T0 + 2000, addr(1), 2, s);
        assert_eq!((o.event, o.payer), (Event::Joined { rejoin: true }, Payer::Member));
        assert!(o.reply.is_some(), "challenge and ack: 2 tokens");
        let rj = SmallDatagram::join(
            &hdr(Kind::Join, 2, 0, s + 5),
            &token(&k, 2, PORT, 60),
            None,
            &one.session.request().keys,
        );
        let o = g.handle(&k, &p, at(T0 + 2000), addr(1), rj.as_bytes());
        assert_eq!((o.event, o.suppressed), (Event::Challenged, Some(Kind::JoinChallenge)));
        assert_eq!(
            g.handle(
                &k,
                &p,
                at(T0 + 2000),
                addr(1),
                SmallDatagram::join(
                    &hdr(Kind::Join, 2, 0, 1),
                    &token(&k, 2, PORT, 60),
                    None,
                    &one.session.request().keys
                )
                .as_bytes()
            )
            .event,
            Event::Dropped(DropReason::Replay)
        );
        // The member's rebinding PROBE: its budget refilled a second later.
        let ka = one.keepalive();
        let o = g.handle(&k, &p, at(T0 + 3000), addr(9), &ka);
        assert_eq!((o.payer, o.reply_kind()), (Payer::Member, Some(Kind::Probe)));
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
            mono_us: (T0 + 10) * 1000,
        };
        let d = one.data(b"x");
        assert!(matches!(
            g.handle(&k, &p, jumped, addr(0), &d).event,
            Event::Forward { .. }
        ));
        assert_eq!(g.expire(&p, at(T0 + 10)).silent, 0);
        assert_eq!(g.expire(&p, at(T0 + 1011)).silent, 1);
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

    /// Wall clock `unix`, monotonic clock `mono`.
    fn clocks(unix: u64, mono: u64) -> Now {
        Now {
            unix_ms: unix,
            mono_ms: mono,
            mono_us: mono * 1000,
        }
    }

    fn parsed(d: &SmallDatagram) -> Packet<Vec<u8>> {
        Packet::parse(d.as_bytes().to_vec()).unwrap()
    }

    /// A member that does not renew is removed at its token's expiry (wall
    /// clock), however alive it is, counted apart; the backend is told, and
    /// its traffic is no longer fanned out.
    #[test]
    fn a_member_that_does_not_renew_is_removed_at_its_tokens_expiry() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let (mut two, _) = join(&mut g, &k, &p, T0, addr(1), 2);
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        assert_eq!(g.members()[0].expires_unix_ms, T0 + 60_000);
        // Alive throughout on the monotonic clock (a keepalive a second).
        for s in 1..60u64 {
            for (pl, a) in [(&mut one, addr(0)), (&mut two, addr(1))] {
                let ka = pl.keepalive();
                assert_eq!(g.handle(&k, &p, at(T0 + s * 1000), a, &ka).event, Event::Refreshed);
            }
        }
        assert_eq!(g.expire(&p, at(T0 + 59_999)), Expired::default());
        let gone = g.expire(&p, clocks(T0 + 60_000, T0 + 59_999));
        assert_eq!(
            gone,
            Expired {
                tokens: 2,
                ..Expired::default()
            }
        );
        assert!(g.is_empty());
        assert!(mirror(&mut g, &mut seen).is_empty(), "the backend's entries go too");
        let d = one.data(b"late");
        let o = g.handle(&k, &p, at(T0 + 60_001), addr(0), &d);
        assert_eq!(o.event, Event::Dropped(DropReason::NotMember));
        assert_eq!(o.payer, Payer::Unverified);
    }

    /// A renewal (72 bytes, the membership's id and key, a newer token)
    /// extends the membership and changes nothing else; retried, it is
    /// answered again; replayed, from elsewhere, or with a bad token, it
    /// renews nothing.
    #[test]
    fn a_renewal_extends_the_membership_and_changes_nothing_else() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        let before = g.members()[0];
        let mkeys = one.session.request().keys;
        let newer = token(&k, 1, PORT, 120);
        let seq = one.session.next_seq() + 10;
        let renew = |seq: u64, t: &[u8; TOKEN_LEN]| {
            SmallDatagram::renewal(&hdr(Kind::Join, 1, before.membership, seq), t, &mkeys)
        };
        let r = renew(seq, &newer);
        assert_eq!(r.len(), 72);
        let now = at(T0 + 40_000);
        let o = g.handle(&k, &p, now, addr(0), r.as_bytes());
        assert_eq!((o.event, o.payer), (Event::Renewed, Payer::Member));
        let ack = parsed(&o.reply.expect("a JOIN_ACK"));
        assert_eq!((ack.kind(), ack.membership()), (Kind::JoinAck, before.membership));
        assert!(mkeys.verify(&ack), "under the membership's key");
        let m = g.members()[0];
        assert_eq!(m.expires_unix_ms, T0 + 120_000);
        assert_eq!(
            (m.membership, m.token, m.addr),
            (before.membership, before.token, before.addr)
        );
        assert_eq!(m.keys.mac_key(), before.keys.mac_key());
        assert_eq!(m.window.highest, seq);
        assert_eq!(mirror(&mut g, &mut seen), [addr(0), addr(1)].into_iter().collect());
        let mut changes = 0;
        g.take_changes(|_, _| changes += 1);
        assert_eq!(changes, 0, "no change for the backend");
        // Its traffic goes on under the same key.
        let d = one.data(b"x");
        assert!(matches!(
            g.handle(&k, &p, now, addr(0), &d).event,
            Event::Forward { .. }
        ));
        // The same renewal replayed: nothing; retried (JOIN_ACK lost): answered.
        assert_eq!(
            g.handle(&k, &p, now, addr(0), r.as_bytes()).event,
            Event::Dropped(DropReason::Replay)
        );
        let o = g.handle(&k, &p, now, addr(0), renew(seq + 100, &newer).as_bytes());
        assert_eq!(o.event, Event::Renewed);
        // An older token never shortens it.
        let o = g.handle(
            &k,
            &p,
            now,
            addr(0),
            renew(seq + 101, &token(&k, 1, PORT, 70)).as_bytes(),
        );
        assert_eq!(o.event, Event::Renewed);
        assert_eq!(g.members()[0].expires_unix_ms, T0 + 120_000);
        // From another address: a rebinding PROBE, no renewal.
        let o = g.handle(
            &k,
            &p,
            now,
            addr(9),
            renew(seq + 200, &token(&k, 1, PORT, 300)).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::Unvalidated));
        assert_eq!(o.reply_kind(), Some(Kind::Probe));
        assert_eq!(g.members()[0].expires_unix_ms, T0 + 120_000);
        // Bad tokens: ERRORs nobody can verify, from the global budget.
        for (i, (t, code)) in [
            (token(&k, 2, PORT, 300), ErrorCode::BadToken),
            (token(&k, 1, PORT + 1, 300), ErrorCode::BadToken),
            (token(&k, 1, PORT, 30), ErrorCode::ExpiredToken),
        ]
        .into_iter()
        .enumerate()
        {
            let o = g.handle(&k, &p, now, addr(0), renew(seq + 300 + i as u64, &t).as_bytes());
            assert!(matches!(o.event, Event::Dropped(DropReason::Token(_))), "{code:?}");
            assert_eq!(o.payer, Payer::Unverified);
            assert_eq!(parsed(&o.reply.unwrap()).error_code(), Some(Ok(code)));
        }
        // Under the new token's key, or the other member's id: not a renewal.
        let wrong_key = SmallDatagram::renewal(
            &hdr(Kind::Join, 1, before.membership, seq + 400),
            &newer,
            &session_keys(&k, &newer),
        );
        assert_eq!(
            g.handle(&k, &p, now, addr(0), wrong_key.as_bytes()).event,
            Event::Dropped(DropReason::BadMac)
        );
        let stale = SmallDatagram::renewal(&hdr(Kind::Join, 1, 12345, seq + 401), &newer, &mkeys);
        assert_eq!(
            g.handle(&k, &p, now, addr(0), stale.as_bytes()).event,
            Event::Dropped(DropReason::StaleMembership)
        );
        // Renewed, it outlives its first token, and goes at the new one's end.
        assert_eq!(g.expire(&p, clocks(T0 + 60_000, T0 + 1000)).tokens, 1, "player 2 only");
        assert_eq!(g.members()[0].sender, 1);
        assert_eq!(g.expire(&p, clocks(T0 + 120_000, T0 + 1000)).tokens, 1);
        assert!(g.is_empty());
    }

    /// A client that restarted (a new token and key, its counter from 1)
    /// replaces its membership; an older token's JOIN replaces nothing.
    #[test]
    fn a_restarted_client_replaces_its_membership() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let (mut old, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        let before = g.members()[0];
        // The restarted client: a later token, sequence numbers from 1.
        let t2 = token(&k, 1, PORT, 90);
        let (mut new, o) = join_with(&mut g, &k, &p, T0 + 5000, addr(0), 1, 1, t2);
        assert_eq!((o.event, o.payer), (Event::Replaced, Payer::Member));
        let ack = parsed(&o.reply.unwrap());
        assert!(session_keys(&k, &t2).verify(&ack));
        let m = g.members()[0];
        assert_ne!(m.membership, before.membership);
        assert_eq!((m.token, m.expires_unix_ms, m.tx_seq), (t2, T0 + 90_000, 2));
        assert_eq!(m.keys.mac_key(), session_keys(&k, &t2).mac_key());
        assert_eq!(g.len(), 2);
        // The backend re-adds the address with the new key.
        let mut log = Vec::new();
        g.take_changes(|c, m| log.push((c, m.map(|m| m.membership))));
        assert_eq!(
            log,
            vec![
                (Change::Removed(addr(0)), None),
                (Change::Added(addr(0)), Some(g.members()[0].membership))
            ]
        );
        let d = new.data(b"x");
        assert!(matches!(
            g.handle(&k, &p, at(T0 + 5000), addr(0), &d).event,
            Event::Forward { .. }
        ));
        let d = old.data(b"x");
        assert_eq!(
            g.handle(&k, &p, at(T0 + 5000), addr(0), &d).event,
            Event::Dropped(DropReason::StaleMembership)
        );
        // The first token's JOIN (a captured one, or the old process) and a
        // token expiring no later replace nothing, unanswered.
        for t in [token(&k, 1, PORT, 60), token(&k, 1, PORT, 90 - 1)] {
            let j = SmallDatagram::join(&hdr(Kind::Join, 1, 0, 1), &t, None, &session_keys(&k, &t));
            let o = g.handle(&k, &p, at(T0 + 5000), addr(0), j.as_bytes());
            assert_eq!(o.event, Event::Dropped(DropReason::OlderToken));
            assert!(o.reply.is_none());
        }
        // Onto another player's address: that one is checked first.
        let t3 = token(&k, 1, PORT, 120);
        let (_, o) = join_with(&mut g, &k, &p, T0 + 6000, addr(1), 1, 1, t3);
        assert_eq!(o.event, Event::Dropped(DropReason::Occupied));
        assert_eq!(parsed(&o.reply.unwrap()).error_code(), Some(Ok(ErrorCode::Retry)));
        assert_eq!(g.members()[0].token, t2);
        // From a free address: replaced and moved.
        let (_, o) = join_with(&mut g, &k, &p, T0 + 7000, addr(5), 1, 1, t3);
        assert_eq!(o.event, Event::Replaced);
        assert_eq!(g.members()[0].addr, addr(5));
        assert_eq!(mirror(&mut g, &mut seen), [addr(1), addr(5)].into_iter().collect());
    }

    /// ECHO from the member's address: a sign of life, answered with an
    /// ECHO_REPLY of the same size and nonce under its key, 4 a second.
    #[test]
    fn echoes_are_answered_from_the_members_own_budget() {
        let (k, p) = (
            keys(),
            Policy {
                member_timeout_ms: 1000,
                ..Policy::default()
            },
        );
        let mut g = Group::new(PORT);
        let (one, _) = join(&mut g, &k, &p, T0, addr(0), 1);
        let mkeys = one.session.request().keys;
        let id = g.members()[0].membership;
        let mut seq = one.session.next_seq();
        let mut echo = |nonce: u64| {
            seq += 1;
            SmallDatagram::nonce(&hdr(Kind::Echo, 1, id, seq), nonce, &mkeys)
        };
        let mut answered = 0u32;
        for i in 0..6u64 {
            let e = echo(100 + i);
            let o = g.handle(&k, &p, at(T0 + 900), addr(0), e.as_bytes());
            assert_eq!((o.event, o.payer), (Event::Echoed, Payer::Member));
            if let Some(r) = o.reply {
                answered += 1;
                assert_eq!(r.len(), e.len(), "exactly as large as the request");
                let r = parsed(&r);
                assert_eq!(
                    (r.kind(), r.nonce(), r.membership()),
                    (Kind::EchoReply, Some(100 + i), id)
                );
                assert_eq!(r.seq(), g.members()[0].tx_seq);
                assert!(mkeys.verify(&r));
            } else {
                assert_eq!(o.suppressed, Some(Kind::EchoReply));
            }
        }
        assert_eq!(answered, ECHO_REPLIES_PER_S);
        // A sign of life: not expired a second after the join.
        assert_eq!(g.expire(&p, at(T0 + 1500)), Expired::default());
        // 250 ms later one more; a replay and another address get none.
        let e = echo(7);
        let o = g.handle(&k, &p, at(T0 + 1150), addr(0), e.as_bytes());
        assert_eq!(o.reply_kind(), Some(Kind::EchoReply));
        let o = g.handle(&k, &p, at(T0 + 1150), addr(0), e.as_bytes());
        assert_eq!((o.event, o.reply_kind()), (Event::Dropped(DropReason::Replay), None));
        let o = g.handle(&k, &p, at(T0 + 1200), addr(9), echo(8).as_bytes());
        assert_eq!(o.event, Event::Dropped(DropReason::Unvalidated));
        assert_eq!(o.reply_kind(), Some(Kind::Probe), "a rebinding PROBE, not an answer");
        // Forged: dropped, unanswered.
        let forged = SmallDatagram::nonce(&hdr(Kind::Echo, 1, id, seq + 50), 9, &keys_guess());
        let o = g.handle(&k, &p, at(T0 + 1300), addr(0), forged.as_bytes());
        assert_eq!((o.event, o.reply_kind()), (Event::Dropped(DropReason::BadMac), None));
    }

    /// JOIN_ACK's instance flag: the policy's default, or the group's own.
    #[test]
    fn join_ack_announces_the_instance_flag_by_policy_and_group() {
        let k = keys();
        for (default, group, want) in [
            (false, None, false),
            (true, None, true),
            (true, Some(false), false),
            (false, Some(true), true),
        ] {
            let p = Policy {
                data_instance: default,
                ..Policy::default()
            };
            let mut g = Group::new(PORT);
            if let Some(on) = group {
                g.set_instance(on);
            }
            let (_, o) = join(&mut g, &k, &p, T0, addr(0), 1);
            let ack = parsed(&o.reply.unwrap()).join_ack().unwrap();
            assert_eq!(ack.instance(), want, "{default} {group:?}");
            assert!(ack.tags(), "tags stay as they were");
            assert_eq!(ack.flags & !(FLAG_TAGS | FLAG_INSTANCE), 0);
        }
    }
}
