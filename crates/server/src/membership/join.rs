//! JOIN and renewal: a newcomer's handshake (token, MAC, cookie round
//! trip, occupancy of its address) and a member's renewal of its membership.

use super::*;
use reflector_proto::auth::{check_cookie, make_cookie, TokenClaims, TokenError};
use reflector_proto::protocol::{
    ErrorCode, Header, JoinAck, Kind, Packet, ParseError, ReplayWindow, SessionKeys, SmallDatagram, FLAG_INSTANCE,
    FLAG_SEALED, FLAG_TAGS, TOKEN_LEN,
};
use std::net::SocketAddr;

impl Group {
    /// A renewal (a JOIN carrying the membership's id, MAC'd under its
    /// key): from the member's validated address, with a fresh sequence
    /// number and a valid token, the membership's expiry becomes the
    /// token's (if later) and a JOIN_ACK of the same membership answers it,
    /// from the member's budget; keys, window, id and the backend's entry
    /// stay. From another address it is a rebinding trigger like any
    /// authenticated datagram.
    pub(super) fn renewal(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
    ) -> Outcome {
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
    pub(super) fn join_ack(&mut self, idx: usize, policy: &Policy) -> SmallDatagram {
        let members = u16::try_from(self.members.len()).unwrap_or(u16::MAX);
        let instance = self.instance_on(policy);
        let sealed = self.sealed_on(policy);
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
        if sealed {
            // instance_on is true too: bit 2 never goes without bit 1.
            flags |= FLAG_SEALED;
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
    pub(super) fn new_member(
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

    pub(super) fn join(
        &mut self,
        keys: &Keys,
        policy: &Policy,
        now: Now,
        src: SocketAddr,
        pkt: &Packet<&[u8]>,
    ) -> Outcome {
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
}
