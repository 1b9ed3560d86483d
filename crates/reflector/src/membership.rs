//! Groups and their members: the reflector's decision logic as a pure state
//! machine. It takes bytes, a source address and `now_ms`, and answers what
//! to do (forward, reply, drop and why); it never touches a socket, so every
//! rule is unit-tested deterministically with an injected clock.
//!
//! Rules (paper 000 §3, plus address validation):
//! - a group is addressed by the UDP port it is served on;
//! - JOIN needs a valid token from the control server *and* a second round
//!   trip echoing a stateless cookie, so a spoofed source never becomes a
//!   member and never receives fan-out traffic;
//! - no reply is ever larger than the datagram that caused it, so an
//!   unauthenticated sender cannot use the reflector as an amplifier;
//! - DATA from a member goes to every other member; anything else is
//!   dropped and counted by reason.

use crate::auth::{check_cookie, make_cookie, verify_token, Secret, TokenError};
use crate::backend::Dest;
use crate::protocol::{ErrorCode, JoinAck, Kind, Packet, ParseError, SmallDatagram};
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
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            member_timeout_ms: 10_000,
            max_members: 1024,
            keepalive_ms: 2_000,
        }
    }
}

/// Keys a reflector needs: the secret shared with the control server (to
/// verify tokens) and its own private cookie key.
#[derive(Debug, Clone)]
pub struct Keys {
    pub token_secret: Secret,
    pub cookie_key: Secret,
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
    /// Fan the datagram out to every member except the one at this index.
    Forward {
        from: usize,
    },
    Challenged,
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
}

impl Outcome {
    fn silent(event: Event) -> Outcome {
        Outcome { event, reply: None }
    }

    /// The one place replies are allowed out: never larger than the request.
    fn with_reply(event: Event, reply: SmallDatagram, request_len: usize) -> Outcome {
        Outcome {
            event,
            reply: (reply.len() <= request_len).then_some(reply),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub addr: SocketAddr,
    pub sender: u32,
    pub last_seen_ms: u64,
}

/// One group: its members, and their destinations in kernel format kept in
/// a parallel dense array so a fan-out walks one contiguous slice.
#[derive(Debug)]
pub struct Group {
    port: u16,
    members: Vec<Member>,
    dests: Vec<Dest>,
    by_addr: HashMap<SocketAddr, usize>,
}

impl Group {
    pub fn new(port: u16) -> Group {
        Group {
            port,
            members: Vec::new(),
            dests: Vec::new(),
            by_addr: HashMap::new(),
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

    /// Destinations of all members, index-aligned with [`Group::members`].
    pub fn dests(&self) -> &[Dest] {
        &self.dests
    }

    /// Decides what to do with one datagram received on this group's port.
    pub fn handle(&mut self, keys: &Keys, policy: &Policy, now_ms: u64, src: SocketAddr, datagram: &[u8]) -> Outcome {
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
                        self.members[idx].last_seen_ms = now_ms;
                        Outcome::silent(Event::Forward { from: idx })
                    }
                    Kind::Keepalive => {
                        self.members[idx].last_seen_ms = now_ms;
                        Outcome::silent(Event::Refreshed)
                    }
                    _ => {
                        self.remove(idx);
                        Outcome::silent(Event::Left)
                    }
                }
            }
            Kind::Join => self.join(keys, policy, now_ms, src, &pkt, len),
            other => Outcome::silent(Event::Dropped(DropReason::Unexpected(other))),
        }
    }

    fn join(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now_ms: u64,
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
        if let Err(e) = verify_token(&keys.token_secret, token, self.port, sender, now_ms) {
            let code = if e == TokenError::Expired {
                ErrorCode::ExpiredToken
            } else {
                ErrorCode::BadToken
            };
            let err = SmallDatagram::error(self.port, sender, code);
            return Outcome::with_reply(Event::Dropped(DropReason::Token(e)), err, len);
        }
        let Some(cookie) = pkt.join_cookie() else {
            let cookie = make_cookie(&keys.cookie_key, &src, self.port, sender, now_ms);
            let ch = SmallDatagram::challenge(self.port, sender, &cookie);
            return Outcome::with_reply(Event::Challenged, ch, len);
        };
        if !check_cookie(&keys.cookie_key, cookie, &src, self.port, sender, now_ms) {
            let err = SmallDatagram::error(self.port, sender, ErrorCode::BadCookie);
            return Outcome::with_reply(Event::Dropped(DropReason::BadCookie), err, len);
        }
        let rejoin = match self.by_addr.get(&src) {
            Some(&idx) => {
                // Same address again (a lost JOIN_ACK, or a new player id on
                // a reused port): refresh and answer again.
                self.members[idx].sender = sender;
                self.members[idx].last_seen_ms = now_ms;
                true
            }
            None => {
                if self.members.len() >= policy.max_members {
                    let err = SmallDatagram::error(self.port, sender, ErrorCode::GroupFull);
                    return Outcome::with_reply(Event::Dropped(DropReason::GroupFull), err, len);
                }
                self.by_addr.insert(src, self.members.len());
                self.members.push(Member {
                    addr: src,
                    sender,
                    last_seen_ms: now_ms,
                });
                self.dests.push(Dest::from(src));
                false
            }
        };
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
        self.dests.swap_remove(idx);
        self.by_addr.remove(&gone.addr);
        if let Some(moved) = self.members.get(idx) {
            self.by_addr.insert(moved.addr, idx);
        }
    }

    /// Removes members silent for longer than the policy allows; returns how many.
    pub fn expire(&mut self, policy: &Policy, now_ms: u64) -> usize {
        let mut removed = 0;
        let mut i = 0;
        while i < self.members.len() {
            if now_ms.saturating_sub(self.members[i].last_seen_ms) > policy.member_timeout_ms {
                self.remove(i);
                removed += 1;
            } else {
                i += 1;
            }
        }
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::TokenClaims;
    use crate::protocol::{emit, Header, HEADER_LEN, TOKEN_LEN};

    const PORT: u16 = 4000;
    const T0: u64 = 1_700_000_000_000;

    fn keys() -> Keys {
        Keys {
            token_secret: Secret::new(&[1; 32]).unwrap(),
            cookie_key: Secret::new(&[2; 32]).unwrap(),
        }
    }

    fn token(k: &Keys, player: u32, group: u16, ttl_s: u64) -> [u8; TOKEN_LEN] {
        TokenClaims {
            player,
            group,
            expires_unix_s: T0 / 1000 + ttl_s,
        }
        .sign(&k.token_secret)
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

    /// Runs the two-step join and returns the final outcome.
    fn join(g: &mut Group, k: &Keys, p: &Policy, now: u64, src: SocketAddr, player: u32) -> Outcome {
        let t = token(k, player, PORT, 60);
        let first = SmallDatagram::join(PORT, player, &t, None);
        let o = g.handle(k, p, now, src, first.as_bytes());
        assert_eq!(o.event, Event::Challenged);
        let ch = o.reply.expect("challenge sent");
        let cookie = *Packet::parse(ch.as_bytes()).unwrap().challenge_cookie().unwrap();
        let second = SmallDatagram::join(PORT, player, &t, Some(&cookie));
        g.handle(k, p, now, src, second.as_bytes())
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
        let o = g.handle(&k, &p, T0, addr(1), &data(101, b"pos"));
        assert_eq!(o.event, Event::Forward { from: 1 });
        assert!(o.reply.is_none());
        assert_eq!(g.dests().len(), 3);
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
            T0,
            addr(1),
            SmallDatagram::join(PORT, 7, &t, Some(&wrong)).as_bytes(),
        );
        assert_eq!(o.event, Event::Dropped(DropReason::BadCookie));
        // A stale cookie, two slots later.
        let old = make_cookie(&k.cookie_key, &addr(1), PORT, 7, T0);
        let later = T0 + 2 * crate::auth::COOKIE_SLOT_MS + 1;
        let o = g.handle(
            &k,
            &p,
            later,
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
            let o = g.handle(&k, &p, T0, addr(1), req.as_bytes());
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
            T0 + 1000,
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
            let o = g.handle(&k, &p, T0, addr(5), &bytes);
            assert_eq!(o.event, Event::Dropped(reason));
            if let Some(r) = o.reply {
                assert!(r.len() <= bytes.len(), "reply {} > request {}", r.len(), bytes.len());
            }
        }
        let mut other = data(1, b"");
        other[4..6].copy_from_slice(&(PORT + 1).to_be_bytes());
        assert_eq!(
            g.handle(&k, &p, T0, addr(0), &other).event,
            Event::Dropped(DropReason::WrongGroup)
        );
        // A member's address with another sender id.
        assert_eq!(
            g.handle(&k, &p, T0, addr(0), &data(9, b"")).event,
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
        assert_eq!(g.handle(&k, &p, T0, addr(1), leave.as_bytes()).event, Event::Left);
        assert_eq!(g.len(), 4);
        // The member swapped into slot 1 must still be found by its address.
        for i in [0u16, 2, 3, 4] {
            let o = g.handle(&k, &p, T0 + 500, addr(i), &data(u32::from(i), b"x"));
            assert!(matches!(o.event, Event::Forward { .. }), "member {i}");
        }
        for (m, d) in g.members().iter().zip(g.dests()) {
            assert_eq!(Dest::from(m.addr), *d);
        }
        // Member 3 keeps talking, the rest fall silent.
        let ka = SmallDatagram::simple(Kind::Keepalive, PORT, 3, 0);
        assert_eq!(
            g.handle(&k, &p, T0 + 1400, addr(3), ka.as_bytes()).event,
            Event::Refreshed
        );
        assert_eq!(g.expire(&p, T0 + 1600), 3);
        assert_eq!(g.len(), 1);
        assert_eq!(g.members()[0].sender, 3);
        assert!(matches!(
            g.handle(&k, &p, T0 + 1600, addr(3), &data(3, b"")).event,
            Event::Forward { from: 0 }
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
}
