//! The membership core's unit tests: every rule with an injected clock.

use super::*;
use reflector_proto::auth::TokenClaims;
use reflector_proto::auth::{make_cookie, Secret, TokenError};
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::{emit, DATA_PAYLOAD, TOKEN_LEN};
use reflector_proto::protocol::{Header, SessionKeys, FLAG_INSTANCE, FLAG_SEALED, FLAG_TAGS};
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
        let n = self.session.emit_data(payload.len(), &mut b).unwrap().unwrap();
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
    let renew =
        |seq: u64, t: &[u8; TOKEN_LEN]| SmallDatagram::renewal(&hdr(Kind::Join, 1, before.membership, seq), t, &mkeys);
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

/// JOIN_ACK's sealed flag: the policy's default or the group's own, always
/// with the instance flag, and the group policy check a client runs agrees.
#[test]
fn join_ack_announces_sealing_with_the_instance_flag_by_policy_and_group() {
    let k = keys();
    for (default, group, want) in [
        (false, None, false),
        (true, None, true),
        (true, Some(false), false),
        (false, Some(true), true),
    ] {
        let p = Policy {
            data_sealed: default,
            ..Policy::default()
        };
        let mut g = Group::new(PORT);
        if let Some(on) = group {
            g.set_sealed(on);
        }
        let (_, o) = join(&mut g, &k, &p, T0, addr(0), 1);
        let ack = parsed(&o.reply.unwrap()).join_ack().unwrap();
        assert_eq!(ack.flags & FLAG_SEALED != 0, want, "{default} {group:?}");
        assert_eq!(
            ack.instance(),
            want,
            "sealed brings the instance flag, and only it does here"
        );
        assert_eq!(reflector_proto::sealed::group_is_sealed(ack.flags), Ok(want));
        assert!(ack.tags(), "tags stay as they were");
    }
}
