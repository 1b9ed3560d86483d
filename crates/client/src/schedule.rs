//! When the client next needs [`Client::update`]: the earliest of its
//! timers, so an event-driven loop (the tokio driver's, or a game's own
//! epoll or IOCP loop) sleeps until then or until its socket is readable
//! instead of calling `update` at a fixed rate.
//!
//! Each deadline here is one of the timers `update` runs:
//! `Client::timers` and `Client::membership_timers` (lib.rs), the move's
//! break (`settle_move`, moves.rs), silent senders
//! (`Streams::poll_silent`) and the checkpoint exchanges (checkpoint.rs).
//! A timer added there needs its deadline here (a checkpoint exchange's
//! own deadline too: with a long poll, or none, it is what ends a channel
//! that never answers). The tests below check
//! that an `update` at the deadline does what is due, and that no
//! deadline is one an `update` leaves in the past (a loop would spin).

use crate::*;

/// How often [`Client::next_update`] asks for an `update` while a token
/// request is in flight (unless [`Config::background_poll`] says): the
/// request runs on a helper thread (a blocking HTTPS call, off the
/// caller's thread), which cannot wake a loop that watches only the UDP
/// socket, so its answer is looked for this often. The tokio driver's
/// loop is woken by the helper instead.
pub const FETCH_POLL: Duration = Duration::from_millis(10);

/// How often [`Client::next_update`] asks for an `update` while a
/// checkpoint exchange is under way (unless [`Config::background_poll`]
/// says): its TCP socket is the client's own, not watched by a loop that
/// watches only the UDP socket, so it is carried on this often until it
/// ends (within [`Config::checkpoint_timeout`]). The tokio driver's loop
/// waits on that socket instead.
pub const CHECKPOINT_POLL: Duration = Duration::from_millis(5);

/// What an event-driven loop is woken by besides the UDP socket and the
/// client's timers; what it is not woken by is polled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Woken {
    /// The token request's helper thread (wake.rs).
    pub token_answer: bool,
    /// The checkpoint exchanges' TCP sockets.
    pub checkpoint_sockets: bool,
}

/// The earlier of two optional instants.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Membership {
    /// This group's next timer (`Client::membership_timers`): a refused
    /// join tried again, a JOIN step or a renewal resent, and for a member
    /// the keepalive, the silence that rejoins, and the renewal moment
    /// (the token's, on the wall clock) if it is still to come.
    fn next_timer(&self, now: Instant, unix_ms: u64) -> Option<Instant> {
        let mut next = earliest(self.rejoin_at, self.session.poll_timeout());
        if !self.session.is_member() && self.wanted {
            next = earliest(next, self.silent_since.map(|t| t + self.keepalive * REPLACE_INTERVALS));
        }
        if self.session.is_member() {
            next = earliest(next, Some(self.last_keepalive + self.keepalive));
            next = earliest(next, Some(self.last_heard + self.keepalive * SILENT_INTERVALS));
            let renew = self.session.renew_at().filter(|&at| at > unix_ms);
            next = earliest(next, renew.map(|at| now + Duration::from_millis(at - unix_ms)));
        }
        next
    }

    /// A member whose renewal moment has passed (its `update` asks for a
    /// token when it can).
    fn renewal_due(&self, unix_ms: u64) -> bool {
        self.live() && self.session.is_member() && self.session.renew_at().is_some_and(|at| unix_ms >= at)
    }
}

impl<D: Driver> Client<D> {
    /// When [`Client::update`] is next needed if no datagram arrives
    /// first: the earliest of the client's timers (a keepalive, a JOIN step
    /// resent, a refused join or token request tried again, the renewal
    /// moment, a reflector's silence, a move's break, a sender going
    /// silent, a checkpoint exchange's deadline), or every [`FETCH_POLL`]
    /// while a token request is in flight and every [`CHECKPOINT_POLL`]
    /// while a checkpoint exchange is under way (both
    /// [`Config::background_poll`] if set). An instant already past means
    /// now. `None`: nothing is timed (after [`Client::leave`]); only a
    /// datagram needs an `update`.
    ///
    /// An event-driven loop sleeps until this instant or until the socket
    /// is readable, whichever comes first, calls `update`, and asks again
    /// (also after a call that starts something, such as
    /// [`Client::set_position`] or [`Client::provide_checkpoint`]). An
    /// `update` at any other moment is harmless. The tokio driver's loop
    /// (`Client::update_when_due`, feature `tokio`) is such a loop, one
    /// that is also woken by the token answer and the exchanges' sockets,
    /// so it does not poll them.
    pub fn next_update(&self) -> Option<Instant> {
        self.next_due(Woken::default())
    }

    /// [`Client::next_update`] for a loop that is also woken by `woken`:
    /// what wakes it is not polled, unless [`Config::background_poll`]
    /// asks for a poll all the same (a fallback).
    pub(crate) fn next_due(&self, woken: Woken) -> Option<Instant> {
        if self.left {
            return None;
        }
        let now = Instant::now();
        let unix_ms = reflector_proto::unix_now_ms();
        let mut next = self.break_by;
        // Token requests (`timers`, `request_token`): the answer looked
        // for, a retry's wait, or a request that can go now (a move asked
        // for, a renewal moment passed). A retry's instant that passed
        // with nothing to ask for is no deadline.
        let retry = self.fetch_not_before.filter(|&t| t > now);
        if self.fetching.is_some() {
            let poll = self.cfg.background_poll.or((!woken.token_answer).then_some(FETCH_POLL));
            next = earliest(next, poll.map(|p| now + p));
        } else if retry.is_some() {
            next = earliest(next, retry);
        } else if matches!(self.cfg.token, TokenSource::Control(_)) {
            if self.move_pending {
                next = Some(now);
            } else if self.memberships.iter().any(|m| m.renewal_due(unix_ms)) {
                // A renewal that brought no later expiry backs off
                // (`renewal_settled`): due then, not now.
                next = match self.renew_not_before.filter(|&t| t > now) {
                    Some(t) => earliest(next, Some(t)),
                    None => Some(now),
                };
            }
        }
        let mut exchanges = false;
        for t in self.transfers() {
            exchanges = true;
            next = earliest(next, Some(t.deadline()));
        }
        if exchanges {
            let poll = self
                .cfg
                .background_poll
                .or((!woken.checkpoint_sockets).then_some(CHECKPOINT_POLL));
            next = earliest(next, poll.map(|p| now + p));
        }
        next = earliest(next, self.streams.next_silent());
        // Sealing keys: one to drop, a `/keys` request due, or the answer
        // of one in flight, looked for as a token request's is.
        if let Some(t) = self.next_keys_due() {
            next = earliest(next, Some(now + Duration::from_millis(t.saturating_sub(unix_ms))));
        }
        if self.sealing.fetching.is_some() {
            let poll = self.cfg.background_poll.or((!woken.token_answer).then_some(FETCH_POLL));
            next = earliest(next, poll.map(|p| now + p));
        }
        // Groups just left only linger (DATA already on its way is judged
        // by its arrival time): nothing to do for them at a given time.
        for m in self.memberships.iter().filter(|m| m.live()) {
            next = earliest(next, m.next_timer(now, unix_ms));
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::{Secret, TokenClaims};
    use reflector_proto::protocol::{Header, JoinAck, SmallDatagram, COOKIE_LEN};

    const REFLECTOR: ([u8; 4], u16) = ([127, 0, 0, 1], 4000);

    /// A network in memory: what the client sent, and what it will receive.
    #[derive(Default)]
    struct Mem {
        sent: Vec<Vec<u8>>,
        inbox: VecDeque<Vec<u8>>,
    }

    impl Driver for Mem {
        fn send_to(&mut self, d: &[u8], _: SocketAddr) -> io::Result<usize> {
            self.sent.push(d.to_vec());
            Ok(d.len())
        }
        fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
            let d = self.inbox.pop_front().ok_or(io::ErrorKind::WouldBlock)?;
            buf[..d.len()].copy_from_slice(&d);
            Ok((d.len(), SocketAddr::from(REFLECTOR)))
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 5555)))
        }
        fn rebind(&mut self) -> io::Result<SocketAddr> {
            self.local_addr()
        }
    }

    const SESSION_KEY: [u8; 32] = [2; 32];

    /// A client with a given token expiring in `ttl_s` (the token's own
    /// claims say so: the renewal moment is reckoned from them).
    fn client(ttl_s: u64) -> Client<Mem> {
        let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + ttl_s;
        let claims = TokenClaims {
            player: 7,
            reflector: 0,
            group: REFLECTOR.1,
            expires_unix_s,
        };
        let token = Token {
            reflector: SocketAddr::from(REFLECTOR).to_string(),
            group: REFLECTOR.1,
            player: 7,
            token: claims.sign(&Secret::new(&[3; 32]).unwrap()),
            session_key: SESSION_KEY,
            expires_unix_s,
            keys: Vec::new(),
        };
        Client::with_driver(Config::new(TokenSource::Given(token)), Mem::default()).unwrap()
    }

    /// What the reflector answers, under the session's key.
    fn from_reflector(c: &mut Client<Mem>, d: SmallDatagram) {
        c.sock.inbox.push_back(d.as_bytes().to_vec());
    }

    fn kinds(c: &mut Client<Mem>) -> Vec<Kind> {
        c.sock
            .sent
            .drain(..)
            .map(|d| Packet::parse(&d[..]).unwrap().kind())
            .collect()
    }

    /// Joins through the two steps at `t0`: the client is a member with a
    /// 500 ms keepalive. Returns the events so far.
    fn join(c: &mut Client<Mem>, t0: Instant) -> Vec<Event> {
        join_with(c, t0, 500)
    }

    fn join_with(c: &mut Client<Mem>, t0: Instant, keepalive_ms: u16) -> Vec<Event> {
        let keys = SessionKeys::from_session(SESSION_KEY);
        let h = Header {
            kind: Kind::JoinChallenge,
            group: REFLECTOR.1,
            sender: 7,
            membership: 0x55,
            seq: 1,
        };
        from_reflector(c, SmallDatagram::challenge(&h, &[9; COOKIE_LEN], &keys));
        c.update(t0);
        let ack = JoinAck {
            members: 1,
            keepalive_ms,
            flags: 0,
            checkpoint_port: 0,
        };
        from_reflector(c, SmallDatagram::join_ack(&h, ack, &keys));
        c.update(t0);
        assert!(c.is_member());
        assert_eq!(
            kinds(c),
            [Kind::Join, Kind::Join],
            "the JOIN, then the one echoing the cookie"
        );
        std::iter::from_fn(|| c.poll_event()).collect()
    }

    /// `update` at `next_update()` leaves a deadline after it (or none).
    fn settles(c: &mut Client<Mem>) {
        let at = c.next_update().expect("a deadline");
        c.update(at);
        assert!(
            c.next_update().is_none_or(|n| n > at),
            "{:?} after an update at {at:?}",
            c.next_update()
        );
    }

    #[test]
    fn a_joining_client_is_due_at_its_join_retry() {
        let t0 = Instant::now();
        let mut c = client(300);
        let at = c.next_update().expect("the JOIN's retry");
        // Created just before t0's read or after: the retry is measured
        // from the client's own start.
        assert!(at > t0 && at <= Instant::now() + c.cfg.join_retry, "{at:?}");
        c.update(at - Duration::from_millis(1));
        assert_eq!(kinds(&mut c), [Kind::Join], "the first JOIN only");
        c.update(at);
        assert_eq!(kinds(&mut c), [Kind::Join], "resent at the deadline");
        settles(&mut c);
    }

    #[test]
    fn a_member_is_due_at_its_next_keepalive_and_sends_it_then() {
        let t0 = Instant::now();
        let mut c = client(300);
        join(&mut c, t0);
        let keepalive = Duration::from_millis(500);
        assert_eq!(c.next_update(), Some(t0 + keepalive));
        c.update(t0 + keepalive - Duration::from_millis(1));
        assert_eq!(kinds(&mut c), [], "nothing is due before it");
        c.update(t0 + keepalive);
        assert_eq!(kinds(&mut c), [Kind::Echo], "the keepalive goes at the deadline");
        assert_eq!(c.stats().echoes_sent, 1);
        // Unanswered, the next one an interval later; after three silent
        // intervals the rejoin (the silence deadline comes first then).
        assert_eq!(c.next_update(), Some(t0 + 2 * keepalive));
        c.update(t0 + 2 * keepalive);
        c.update(t0 + 3 * keepalive - Duration::from_millis(1));
        assert_eq!(c.next_update(), Some(t0 + 3 * keepalive));
        c.update(t0 + 3 * keepalive);
        assert_eq!(c.stats().rejoins, 1, "silent for three intervals: joined again");
        assert_eq!(kinds(&mut c), [Kind::Echo, Kind::Join]);
        settles(&mut c);
    }

    #[test]
    fn a_silent_reflector_that_does_not_answer_the_rejoin_is_placed_anew() {
        let t0 = Instant::now();
        let mut c = client(300);
        join(&mut c, t0);
        let k = Duration::from_millis(500);
        // Silent for three intervals: joined again with the token held.
        for n in 1..=3 {
            c.update(t0 + n * k);
        }
        assert_eq!(c.stats().rejoins, 1);
        while c.poll_event().is_some() {}
        // The rejoin unanswered: the placement is asked anew after
        // REPLACE_INTERVALS more, a deadline of its own.
        let at = t0 + 3 * k + k * REPLACE_INTERVALS;
        assert!(c.next_update().is_some_and(|n| n <= at), "{:?}", c.next_update());
        c.update(at - Duration::from_millis(1));
        assert_eq!(c.stats().replacements, 0, "not before");
        c.update(at);
        assert_eq!(c.stats().replacements, 1);
        let events: Vec<Event> = std::iter::from_fn(|| c.poll_event()).collect();
        assert!(
            events.contains(&Event::TokenNeeded),
            "a given token: the game is asked: {events:?}"
        );
        // Still unanswered: asked again only as long later.
        c.update(at + k);
        assert_eq!(c.stats().replacements, 1);
        c.update(at + k * REPLACE_INTERVALS);
        assert_eq!(c.stats().replacements, 2);
    }

    #[test]
    fn a_move_whose_new_reflector_never_answers_is_placed_anew() {
        // The fleet lab's kill -9: a move's grant names a group on a
        // reflector that dies before its JOIN arrives. That JOIN is never
        // answered, and without a deadline of its own the player kept
        // trying it for good (and lost its old group at the move's break).
        let t0 = Instant::now();
        let mut c = client(300);
        join(&mut c, t0);
        while c.poll_event().is_some() {}
        let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 300;
        let claims = TokenClaims {
            player: 7,
            reflector: 0,
            group: 4001,
            expires_unix_s,
        };
        let dead = Token {
            reflector: "127.0.0.2:4001".into(),
            group: 4001,
            player: 7,
            token: claims.sign(&Secret::new(&[3; 32]).unwrap()),
            session_key: SESSION_KEY,
            expires_unix_s,
            keys: Vec::new(),
        };
        c.take_area(
            AreaTokens {
                cell: dead,
                area: Vec::new(),
            },
            t0,
        )
        .unwrap();
        // Nothing answers (the old group's reflector neither: it rejoins,
        // but a group being left is not placed anew). The new JOIN's
        // interval is the default 2 s until a JOIN_ACK says otherwise.
        let at = t0 + Duration::from_secs(2) * REPLACE_INTERVALS;
        let mut t = t0;
        while t + Duration::from_millis(250) < at {
            t += Duration::from_millis(250);
            c.update(t);
        }
        assert!(c.next_update().is_some_and(|n| n <= at), "{:?}", c.next_update());
        c.update(at - Duration::from_millis(1));
        assert_eq!(c.stats().replacements, 0, "not before");
        while c.poll_event().is_some() {}
        c.update(at);
        assert_eq!(c.stats().replacements, 1, "the unanswered JOIN asks where the cell is");
        let events: Vec<Event> = std::iter::from_fn(|| c.poll_event()).collect();
        assert!(events.contains(&Event::TokenNeeded), "{events:?}");
        settles(&mut c);
    }

    #[test]
    fn a_renewal_moment_passed_is_no_deadline_once_reported() {
        // A given token with 5 s left: its renewal moment has passed at
        // once; the game is told (TokenNeeded) and nothing is due until
        // the keepalive, though the moment stays passed.
        let t0 = Instant::now();
        let mut c = client(5);
        let events = join(&mut c, t0);
        assert!(events.contains(&Event::TokenNeeded), "{events:?}");
        assert_eq!(c.next_update(), Some(t0 + Duration::from_millis(500)));
        settles(&mut c);
    }

    #[test]
    fn a_renewal_backing_off_is_due_when_the_back_off_ends_not_now() {
        // A control server's renewal that brought no later expiry backs
        // off: the passed renewal moment must not keep the loop spinning.
        let t0 = Instant::now();
        let mut c = client(5);
        join_with(&mut c, t0, u16::MAX);
        c.cfg.token = TokenSource::Control(ControlServer {
            url: "http://127.0.0.1:9".into(),
            fallback_urls: Vec::new(),
            ticket: None,
            player: 7,
            position: (0.0, 0.0),
            ca_file: None,
            allow_plain_http: true,
        });
        let back_off = Instant::now() + Duration::from_secs(3);
        c.renew_not_before = Some(back_off);
        assert_eq!(c.next_update(), Some(back_off));
        c.renew_not_before = None;
        assert!(c.next_update().unwrap() <= Instant::now(), "due now without a back-off");
    }

    #[test]
    fn the_renewal_moment_is_a_deadline() {
        // A token for 15 s renews 10 s before its expiry (4 to 5 s from
        // now: the expiry is in whole seconds), before the keepalive of
        // this group (65.5 s).
        let t0 = Instant::now();
        let mut c = client(15);
        join_with(&mut c, t0, u16::MAX);
        let at = c.next_update().expect("the renewal moment");
        let now = Instant::now();
        assert!(
            at >= now + Duration::from_millis(3900) && at <= now + Duration::from_secs(5),
            "{:?} from now",
            at - now
        );
    }

    #[test]
    fn a_sender_going_silent_is_a_deadline_and_a_left_client_has_none() {
        let t0 = Instant::now();
        let mut c = client(300);
        join(&mut c, t0);
        // Player 8 heard at t0 + 100 ms, silent 200 ms later: before the
        // keepalive.
        c.streams = Streams::new(8, Duration::from_millis(200));
        c.streams.accept((8, 0), 1, t0 + Duration::from_millis(100));
        assert_eq!(c.next_update(), Some(t0 + Duration::from_millis(300)));
        c.update(t0 + Duration::from_millis(300));
        assert_eq!(c.poll_event(), Some(Event::SenderSilent { player: 8, instance: 0 }));
        assert_eq!(c.next_update(), Some(t0 + Duration::from_millis(500)));
        c.leave();
        assert_eq!(c.next_update(), None);
    }

    #[test]
    fn a_token_request_in_flight_is_polled_unless_the_loop_is_woken_by_its_answer() {
        let t0 = Instant::now();
        let mut c = client(300);
        // A keepalive of 65.5 s: nothing else is due soon.
        join_with(&mut c, t0, u16::MAX);
        let (_answer, rx) = mpsc::channel();
        c.fetching = Some(rx);
        let polled = c.next_update().expect("a poll");
        assert!(polled <= Instant::now() + FETCH_POLL, "{:?}", polled - t0);
        let woken = Woken {
            token_answer: true,
            checkpoint_sockets: false,
        };
        let due = c.next_due(woken).expect("the keepalive");
        assert_eq!(due, t0 + Duration::from_millis(u64::from(u16::MAX)), "not polled");
        // A fallback asked for: polled that often, woken or not.
        c.cfg.background_poll = Some(Duration::from_secs(30));
        for at in [c.next_update(), c.next_due(woken)] {
            let at = at.expect("the fallback");
            let now = Instant::now();
            assert!(at > now + Duration::from_secs(29) && at <= now + Duration::from_secs(30));
        }
    }

    #[test]
    fn error_retry_is_due_after_the_protocols_second() {
        let t0 = Instant::now();
        let mut c = client(300);
        kinds(&mut c);
        let e = SmallDatagram::error(REFLECTOR.1, 7, 0, reflector_proto::protocol::ErrorCode::Retry);
        from_reflector(&mut c, e);
        c.update(t0);
        assert_eq!(c.next_update(), Some(t0 + session::RETRY_AFTER));
        c.update(t0 + session::RETRY_AFTER);
        assert_eq!(kinds(&mut c), [Kind::Join]);
        settles(&mut c);
    }
}
