//! Groups and their members: the reflector's decision logic as a pure state
//! machine. It takes bytes, a source address and the time, and answers what
//! to do (forward, reply, drop and why); it never touches a socket, so every
//! rule is unit-tested deterministically with an injected clock.
//!
//! Rules (paper 000 §3, plus address validation):
//! - a group is addressed by the UDP port it is served on;
//! - JOIN needs a valid token from the control server *and* a second round
//!   trip echoing a stateless cookie, so a spoofed source never becomes a
//!   member and never receives fan-out traffic;
//! - no reply is ever larger than the datagram that caused it, so an
//!   unauthenticated sender cannot use the reflector as an amplifier, and
//!   replies to non-members are rate-limited per group, so a spoofed flood is
//!   not even reflected one for one;
//! - a player is a member of a group at most once;
//! - DATA from a member goes to every other member; anything else is
//!   dropped and counted by reason;
//! - an ICMP error about a member is evidence, not proof (anyone who knows
//!   its address and the group port can forge one): it removes the member
//!   only if the member has also gone silent since the first error, for at
//!   least two keepalive intervals.
//!
//! The group holds plain `SocketAddr`s; every change of membership is also
//! recorded as a [`Change`], which the server hands to the fan-out backend
//! (which keeps the destinations in whatever form it sends to).

use reflector_proto::auth::{check_cookie, make_cookie, Secret, SecretRing, TokenError};
use reflector_proto::protocol::{ErrorCode, JoinAck, Kind, Packet, ParseError, SmallDatagram};
use std::collections::HashMap;
use std::net::SocketAddr;

/// Membership policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A member that sends neither DATA nor KEEPALIVE for this long is removed.
    pub member_timeout_ms: u64,
    /// Members per group; further joins get ERROR(GroupFull).
    pub max_members: usize,
    /// Keepalive interval announced in JOIN_ACK.
    pub keepalive_ms: u16,
    /// Replies (challenges, errors) per second per group to senders that are
    /// not members yet, with a burst of as many. Replies are never larger
    /// than their request, but a spoofed flood would still be reflected one
    /// for one onto its victim; this caps that. JOIN_ACKs are not limited.
    pub replies_per_s: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            member_timeout_ms: 10_000,
            max_members: 1024,
            keepalive_ms: 2_000,
            replies_per_s: 500,
        }
    }
}

/// What a reflector needs to check joins: the secret shared with the
/// control server (to verify tokens), its own id in the control server's
/// map (tokens name it), and its private cookie key.
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
    /// DATA, KEEPALIVE or LEAVE from an address that is not a member.
    NotMember,
    /// A member's address sent with another sender id than it joined with.
    SenderMismatch,
    Token(TokenError),
    BadCookie,
    GroupFull,
    /// A type only the reflector sends (JOIN_CHALLENGE, JOIN_ACK, ERROR).
    Unexpected(Kind),
}

/// What happened to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Fan the datagram out to every member except its sender.
    Forward {
        from: SocketAddr,
    },
    Challenged,
    /// Admitted; `rejoin` if the address or the player was a member already.
    Joined {
        rejoin: bool,
    },
    Left,
    Refreshed,
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

#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub addr: SocketAddr,
    pub sender: u32,
    /// Monotonic milliseconds ([`Now::mono_ms`]) of the last DATA, KEEPALIVE or JOIN.
    pub last_seen_ms: u64,
    /// When the first ICMP error about this address arrived since it was
    /// last heard from (monotonic ms).
    pub unreachable_since_ms: Option<u64>,
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

/// One group: its members. A player is a member at most once: a JOIN from a
/// new address moves it (NAT rebinding), so one token cannot fill a group
/// from many source ports.
#[derive(Debug)]
pub struct Group {
    port: u16,
    members: Vec<Member>,
    by_addr: HashMap<SocketAddr, usize>,
    by_player: HashMap<u32, usize>,
    budget: Option<ReplyBudget>,
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
            budget: None,
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

    /// Hands every change since the last call to `f`, oldest first.
    pub fn take_changes(&mut self, mut f: impl FnMut(Change)) {
        for c in self.changes.drain(..) {
            f(c);
        }
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
            Err(e) => return Outcome::silent(Event::Dropped(DropReason::Malformed(e))),
        };
        if pkt.group() != self.port {
            return Outcome::silent(Event::Dropped(DropReason::WrongGroup));
        }
        let len = datagram.len();
        let sender = pkt.sender();
        match pkt.kind() {
            Kind::Data | Kind::Keepalive | Kind::Leave => {
                let Some(&idx) = self.by_addr.get(&src) else {
                    let err = SmallDatagram::error(self.port, sender, ErrorCode::NotMember);
                    return Outcome::with_reply(Event::Dropped(DropReason::NotMember), err, len);
                };
                if self.members[idx].sender != sender {
                    return Outcome::silent(Event::Dropped(DropReason::SenderMismatch));
                }
                match pkt.kind() {
                    Kind::Data => {
                        self.members[idx].last_seen_ms = now.mono_ms;
                        self.members[idx].unreachable_since_ms = None;
                        Outcome::silent(Event::Forward { from: src })
                    }
                    Kind::Keepalive => {
                        self.members[idx].last_seen_ms = now.mono_ms;
                        self.members[idx].unreachable_since_ms = None;
                        Outcome::silent(Event::Refreshed)
                    }
                    _ => {
                        self.remove(idx);
                        Outcome::silent(Event::Left)
                    }
                }
            }
            Kind::Join => self.join(keys, policy, now, src, &pkt, len),
            other => Outcome::silent(Event::Dropped(DropReason::Unexpected(other))),
        }
    }

    fn join(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
        len: usize,
    ) -> Outcome {
        let sender = pkt.sender();
        // parse() guarantees a JOIN carries a token.
        let Some(token) = pkt.join_token() else {
            return Outcome::silent(Event::Dropped(DropReason::Malformed(ParseError::BadPayload(
                Kind::Join,
            ))));
        };
        if let Err(e) = keys
            .token_secret
            .verify_token(token, keys.reflector_id, self.port, sender, now.unix_ms)
        {
            let code = if e == TokenError::Expired {
                ErrorCode::ExpiredToken
            } else {
                ErrorCode::BadToken
            };
            let err = SmallDatagram::error(self.port, sender, code);
            return Outcome::with_reply(Event::Dropped(DropReason::Token(e)), err, len);
        }
        let Some(cookie) = pkt.join_cookie() else {
            let cookie = make_cookie(&keys.cookie_key, &src, self.port, sender, now.unix_ms);
            let ch = SmallDatagram::challenge(self.port, sender, &cookie);
            return Outcome::with_reply(Event::Challenged, ch, len);
        };
        if !check_cookie(&keys.cookie_key, cookie, &src, self.port, sender, now.unix_ms) {
            let err = SmallDatagram::error(self.port, sender, ErrorCode::BadCookie);
            return Outcome::with_reply(Event::Dropped(DropReason::BadCookie), err, len);
        }
        // Whoever held this address, and this player's entry elsewhere, are
        // replaced: the same address again is a lost JOIN_ACK or a reused
        // port; the same player elsewhere is a NAT rebinding or a restart.
        let at_addr = self.by_addr.get(&src).copied();
        let as_player = self.by_player.get(&sender).copied();
        let rejoin = at_addr.is_some() || as_player.is_some();
        if let (Some(a), Some(p)) = (at_addr, as_player) {
            if a != p {
                self.remove(p);
            }
        }
        let member = Member {
            addr: src,
            sender,
            last_seen_ms: now.mono_ms,
            unreachable_since_ms: None,
        };
        match self.by_addr.get(&src).or_else(|| self.by_player.get(&sender)).copied() {
            Some(idx) => {
                let old = self.members[idx];
                self.by_addr.remove(&old.addr);
                self.by_player.remove(&old.sender);
                self.members[idx] = member;
                if old.addr != src {
                    self.changes.push(Change::Removed(old.addr));
                    self.changes.push(Change::Added(src));
                }
                self.by_addr.insert(src, idx);
                self.by_player.insert(sender, idx);
            }
            None => {
                if self.members.len() >= policy.max_members {
                    let err = SmallDatagram::error(self.port, sender, ErrorCode::GroupFull);
                    return Outcome::with_reply(Event::Dropped(DropReason::GroupFull), err, len);
                }
                self.by_addr.insert(src, self.members.len());
                self.by_player.insert(sender, self.members.len());
                self.members.push(member);
                self.changes.push(Change::Added(src));
            }
        }
        let members = u16::try_from(self.members.len()).unwrap_or(u16::MAX);
        let ack = SmallDatagram::join_ack(
            self.port,
            sender,
            JoinAck {
                members,
                keepalive_ms: policy.keepalive_ms,
            },
        );
        Outcome::with_reply(Event::Joined { rejoin }, ack, len)
    }

    fn remove(&mut self, idx: usize) {
        let gone = self.members.swap_remove(idx);
        self.changes.push(Change::Removed(gone.addr));
        self.by_addr.remove(&gone.addr);
        self.by_player.remove(&gone.sender);
        if let Some(moved) = self.members.get(idx) {
            self.by_addr.insert(moved.addr, idx);
            self.by_player.insert(moved.sender, idx);
        }
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
    use reflector_proto::protocol::{emit, Header, HEADER_LEN, TOKEN_LEN};
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

    fn at(ms: u64) -> Now {
        Now {
            unix_ms: ms,
            mono_ms: ms,
        }
    }

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], 5000 + i))
    }

    fn data(sender: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + payload.len()];
        emit(
            &Header {
                kind: Kind::Data,
                group: PORT,
                sender,
                seq: 1,
            },
            payload,
            &mut b,
        )
        .unwrap();
        b
    }

    /// Runs the client's handshake ([`Session`]) against the group and
    /// returns the outcome of its last datagram; checks the first step is
    /// answered with a challenge.
    fn join(g: &mut Group, k: &Keys, p: &Policy, now: u64, src: SocketAddr, player: u32) -> Outcome {
        let req = JoinRequest {
            reflector: SocketAddr::from(([10, 0, 0, 254], PORT)),
            group: PORT,
            player,
            token: token(k, player, PORT, 60),
        };
        // The client's clock only times its retries, which never fire here.
        let t = std::time::Instant::now();
        let mut s = Session::new(req, ClientConfig::default(), t);
        let mut outcomes = Vec::new();
        while let Some(tx) = s.poll_transmit() {
            let o = g.handle(k, p, at(now), src, tx.datagram.as_bytes());
            if let Some(r) = o.reply {
                s.handle(t, req.reflector, &Packet::parse(r.as_bytes()).unwrap());
            }
            outcomes.push(o);
        }
        assert_eq!(outcomes[0].event, Event::Challenged);
        *outcomes.last().unwrap()
    }

    #[test]
    fn two_step_join_then_forward() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        for i in 0..3 {
            let o = join(&mut g, &k, &p, T0, addr(i), 100 + u32::from(i));
            assert_eq!(o.event, Event::Joined { rejoin: false });
            let ack = Packet::parse(o.reply.unwrap().as_bytes().to_vec())
                .unwrap()
                .join_ack()
                .unwrap();
            assert_eq!(ack.members, i + 1);
        }
        assert_eq!(g.len(), 3);
        let o = g.handle(&k, &p, at(T0), addr(1), &data(101, b"pos"));
        assert_eq!(o.event, Event::Forward { from: addr(1) });
        assert!(o.reply.is_none());
        assert_eq!(mirror(&mut g, &mut HashSet::new()).len(), 3);
    }

    #[test]
    fn join_without_valid_cookie_never_makes_a_member() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let t = token(&k, 7, PORT, 60);
        // Cookie made for another address (what a spoofer would have to guess).
        let wrong = make_cookie(&k.cookie_key, &addr(9), PORT, 7, T0);
        let o = g.handle(
            &k,
            &p,
            at(T0),
            addr(1),
            SmallDatagram::join(PORT, 7, &t, Some(&wrong)).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::BadCookie));
        // A stale cookie, two slots later.
        let old = make_cookie(&k.cookie_key, &addr(1), PORT, 7, T0);
        let later = T0 + 2 * reflector_proto::auth::COOKIE_SLOT_MS + 1;
        let o = g.handle(
            &k,
            &p,
            at(later),
            addr(1),
            SmallDatagram::join(PORT, 7, &t, Some(&old)).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::BadCookie));
        assert!(g.is_empty());
    }

    #[test]
    fn bad_tokens_are_refused_with_small_errors() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        let cases = [
            (
                token(&k, 7, PORT + 1, 60),
                DropReason::Token(TokenError::WrongGroup),
                ErrorCode::BadToken,
            ),
            (
                token(&k, 8, PORT, 60),
                DropReason::Token(TokenError::WrongPlayer),
                ErrorCode::BadToken,
            ),
            (
                [0u8; TOKEN_LEN],
                DropReason::Token(TokenError::BadMac),
                ErrorCode::BadToken,
            ),
        ];
        for (t, reason, code) in cases {
            let req = SmallDatagram::join(PORT, 7, &t, None);
            let o = g.handle(&k, &p, at(T0), addr(1), req.as_bytes());
            assert_eq!(o.event, Event::Dropped(reason));
            let r = o.reply.unwrap();
            assert!(r.len() <= req.len());
            assert_eq!(
                Packet::parse(r.as_bytes().to_vec()).unwrap().error_code(),
                Some(Ok(code))
            );
        }
        let t = token(&k, 7, PORT, 1);
        let o = g.handle(
            &k,
            &p,
            at(T0 + 1000),
            addr(1),
            SmallDatagram::join(PORT, 7, &t, None).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::Token(TokenError::Expired)));
        assert!(g.is_empty());
    }

    #[test]
    fn non_members_and_strays_are_dropped_without_amplification() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        join(&mut g, &k, &p, T0, addr(0), 1);
        let cases: Vec<(Vec<u8>, DropReason)> = vec![
            (data(2, b"xx"), DropReason::NotMember),
            (
                SmallDatagram::simple(Kind::Keepalive, PORT, 2, 0).as_bytes().to_vec(),
                DropReason::NotMember,
            ),
            (
                SmallDatagram::simple(Kind::Leave, PORT, 2, 0).as_bytes().to_vec(),
                DropReason::NotMember,
            ),
            (
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
                DropReason::Malformed(ParseError::BadMagic),
            ),
            (vec![0x52], DropReason::Malformed(ParseError::Truncated)),
            (
                SmallDatagram::challenge(PORT, 2, &[0; 16]).as_bytes().to_vec(),
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
        let mut other = data(1, b"");
        other[4..6].copy_from_slice(&(PORT + 1).to_be_bytes());
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &other).event,
            Event::Dropped(DropReason::WrongGroup)
        );
        // A member's address with another sender id.
        assert_eq!(
            g.handle(&k, &p, at(T0), addr(0), &data(9, b"")).event,
            Event::Dropped(DropReason::SenderMismatch)
        );
        assert_eq!(g.len(), 1);
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
        for i in 0..5 {
            join(&mut g, &k, &p, T0, addr(i), u32::from(i));
        }
        let leave = SmallDatagram::simple(Kind::Leave, PORT, 1, 0);
        assert_eq!(g.handle(&k, &p, at(T0), addr(1), leave.as_bytes()).event, Event::Left);
        assert_eq!(g.len(), 4);
        // The member swapped into slot 1 must still be found by its address.
        for i in [0u16, 2, 3, 4] {
            let o = g.handle(&k, &p, at(T0 + 500), addr(i), &data(u32::from(i), b"x"));
            assert!(matches!(o.event, Event::Forward { .. }), "member {i}");
        }
        let mut seen = HashSet::new();
        mirror(&mut g, &mut seen);
        // Member 3 keeps talking, the rest fall silent.
        let ka = SmallDatagram::simple(Kind::Keepalive, PORT, 3, 0);
        assert_eq!(
            g.handle(&k, &p, at(T0 + 1400), addr(3), ka.as_bytes()).event,
            Event::Refreshed
        );
        assert_eq!(g.expire(&p, T0 + 1600).silent, 3);
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].sender, 3);
        assert_eq!(mirror(&mut g, &mut seen), [addr(3)].into_iter().collect());
        assert!(matches!(
            g.handle(&k, &p, at(T0 + 1600), addr(3), &data(3, b"")).event,
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
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(0), 1).event,
            Event::Joined { rejoin: false }
        );
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(0), 1).event,
            Event::Joined { rejoin: true }
        );
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(1), 2).event,
            Event::Joined { rejoin: false }
        );
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(2), 3).event,
            Event::Dropped(DropReason::GroupFull)
        );
        assert_eq!(g.len(), 2);
    }
    #[test]
    fn a_player_is_a_member_once_and_moves_with_its_address() {
        let (k, p) = (keys(), Policy::default());
        let mut g = Group::new(PORT);
        join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        // Player 1 again from a new port (NAT rebinding, or one token tried
        // from many ports): still one entry, now at the new address.
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(7), 1).event,
            Event::Joined { rejoin: true }
        );
        assert_eq!(g.len(), 2);
        assert!(matches!(
            g.handle(&k, &p, at(T0), addr(0), &data(1, b"x")).event,
            Event::Dropped(DropReason::NotMember)
        ));
        assert!(matches!(
            g.handle(&k, &p, at(T0), addr(7), &data(1, b"x")).event,
            Event::Forward { .. }
        ));
        let mut seen = HashSet::new();
        assert_eq!(mirror(&mut g, &mut seen), [addr(1), addr(7)].into_iter().collect());
        // Player 2 takes over player 1's address: player 1's entry goes.
        assert_eq!(
            join(&mut g, &k, &p, T0, addr(7), 2).event,
            Event::Joined { rejoin: true }
        );
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].sender, 2);
        assert_eq!(g.members()[0].addr, addr(7));
        assert_eq!(mirror(&mut g, &mut seen), [addr(7)].into_iter().collect());
    }

    /// Applies the group's changes to `seen` (what a backend does with its
    /// destination set) and checks it then holds exactly the members.
    fn mirror(g: &mut Group, seen: &mut HashSet<SocketAddr>) -> HashSet<SocketAddr> {
        g.take_changes(|c| match c {
            Change::Added(a) => assert!(seen.insert(a), "{a} added twice"),
            Change::Removed(a) => assert!(seen.remove(&a), "{a} removed but absent"),
        });
        let members: HashSet<SocketAddr> = g.members().iter().map(|m| m.addr).collect();
        assert_eq!(*seen, members);
        seen.clone()
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
        join(&mut g, &k, &p, T0, addr(0), 1);
        join(&mut g, &k, &p, T0, addr(1), 2);
        assert!(!g.note_unreachable(addr(9), T0 + 100));
        // A (possibly forged) error about member 0, which keeps talking.
        assert!(g.note_unreachable(addr(0), T0 + 100));
        let ka = SmallDatagram::simple(Kind::Keepalive, PORT, 1, 0);
        g.handle(&k, &p, at(T0 + 1500), addr(0), ka.as_bytes());
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
        let probe = data(9, b"spoofed data");
        let sent = |g: &mut Group, now: u64| g.handle(&k, &p, at(now), addr(3), &probe);
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
            join(&mut g, &k, &Policy { replies_per_s: 10, ..p }, T0 + 2000, addr(0), 1).event,
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
        join(&mut g, &k, &p, T0, addr(0), 1);
        // The wall clock jumps a day ahead; the monotonic clock moves 10 ms.
        let jumped = Now {
            unix_ms: T0 + 86_400_000,
            mono_ms: T0 + 10,
        };
        assert!(matches!(
            g.handle(&k, &p, jumped, addr(0), &data(1, b"x")).event,
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
        let o = g.handle(
            &k,
            &p,
            at(T0),
            addr(0),
            SmallDatagram::join(PORT, 5, &t, None).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::Token(TokenError::WrongReflector)));
    }
}
