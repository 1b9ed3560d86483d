//! The client side of a membership, as a sans-I/O state machine.
//!
//! A [`Session`] is one player's membership of one group, from the first
//! JOIN to the LEAVE:
//!
//! ```text
//!  JOIN(token) ──▶ JOIN_CHALLENGE(cookie) ──▶ JOIN(token, cookie) ──▶ JOIN_ACK
//!  Challenging                                 Echoing                  Member
//! ```
//!
//! It does no I/O and reads no clock (the quinn-proto shape): the caller
//! feeds it the datagrams that arrive ([`Session::handle`]) and the time
//! ([`Session::handle_timeout`] once [`Session::poll_timeout`] has passed),
//! sends what [`Session::poll_transmit`] yields, and acts on the returned
//! [`Event`]s. So the same code runs in the bots' epoll loop, in the
//! blocking helper ([`crate::blocking`]), against the reflector's pure
//! membership core in unit tests, and on a virtual clock.
//!
//! Rules, each matching what the reflector does (`docs/protocol.md`):
//! - only datagrams from the reflector's address and for our group count;
//!   anything else (late replies of a group we left, strays) is ignored;
//! - a JOIN step unanswered for [`Config::retry`] is sent again;
//! - `ERROR(BadCookie)` (the cookie went stale on a slow round trip) starts
//!   the handshake over; `ERROR(Retry)` (our address is held by another
//!   member the reflector is checking) starts it over after [`RETRY_AFTER`],
//!   at most [`MAX_RETRIES`] times; `ERROR(ExpiredToken)` and every other
//!   refusal end it;
//! - `ERROR(NotMember)` to a member means the reflector forgot it (expiry, a
//!   restart): the membership is lost and the caller joins again;
//! - other errors to a member are late answers to a JOIN it retried after
//!   its join had already succeeded, and are ignored;
//! - a member renews before its token expires ([`Session::renew_at`],
//!   `renewal::renew_at_unix_ms`): given a newer token ([`Session::renew`]),
//!   it sends the renewal JOIN (its membership id, the newer token, MAC'd
//!   under the membership's key) and sends it again every [`Config::retry`]
//!   until the JOIN_ACK of the same membership arrives ([`Event::Renewed`]).
//!   ERRORs cannot be authenticated, so none stops a renewal; a token the
//!   reflector refuses is retried until the caller renews with another one
//!   or the membership ends.

use crate::auth::TokenClaims;
use crate::protocol::{
    emit_in_place, renewal, EmitError, ErrorCode, Header, JoinAck, Kind, Moved, Packet, SessionKeys, SmallDatagram,
    COOKIE_LEN, DATA_PAYLOAD, TOKEN_LEN,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a join waits after `ERROR(Retry)` before it starts again.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// `ERROR(Retry)`s one join accepts; the next one ends it
/// ([`Failure::Refused`] with [`ErrorCode::Retry`]).
pub const MAX_RETRIES: u32 = 10;

/// What a client needs to join: where, which group, as whom, the control
/// server's token for exactly that, and the session key that came with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JoinRequest {
    /// The reflector's address; its port is the group.
    pub reflector: SocketAddr,
    /// The group (the port the reflector serves it on).
    pub group: u16,
    /// Our player id, the sender id in every datagram we send.
    pub player: u32,
    pub token: [u8; TOKEN_LEN],
    /// The session key's derived keys ([`SessionKeys::from_session`]).
    pub keys: SessionKeys,
    /// The first sequence number to use (1 for a new key). Sequence numbers
    /// increase for the key's whole life: a session that follows another one
    /// with the same key starts at the previous one's [`Session::next_seq`].
    pub first_seq: u64,
}

/// Timing of the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// A JOIN step unanswered for this long is sent again.
    pub retry: Duration,
    /// Without a JOIN_ACK after this long the join fails with
    /// [`Failure::TimedOut`]; `None`: retry until the caller gives up.
    pub give_up: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            retry: Duration::from_millis(250),
            give_up: None,
        }
    }
}

/// Why a join ended without a membership.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// `ERROR(ExpiredToken)`: ask the control server for a new token.
    #[error("the reflector says the token has expired: ask the control server for a new one")]
    ExpiredToken,
    /// Any other refusal (`BadToken`, `GroupFull`, ...), or an error code this
    /// version does not know (`Err(raw)`).
    #[error("the reflector refused the join: {}", describe(*.0))]
    Refused(Result<ErrorCode, u16>),
    /// No JOIN_ACK within [`Config::give_up`].
    #[error("no JOIN_ACK within {0:?}")]
    TimedOut(Duration),
}

fn describe(code: Result<ErrorCode, u16>) -> String {
    match code {
        Ok(ErrorCode::BadToken) => "BadToken (the token does not verify here: same secret on control server and reflector? right reflector id, group and player?)".into(),
        Ok(ErrorCode::Retry) => format!("Retry (our address is still held by another member the reflector is checking; gave up after {MAX_RETRIES} retries: try another local port)"),
        Ok(c) => format!("{c:?}"),
        Err(raw) => format!("unknown error code {raw}"),
    }
}

/// Something the caller must know about, returned by [`Session::handle`]
/// and [`Session::handle_timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A JOIN step went unanswered for [`Config::retry`] and was queued again.
    Retransmitted,
    /// `ERROR(BadCookie)`, or the wait after `ERROR(Retry)` is over: the
    /// first JOIN is queued again. A membership count that treated the
    /// echoed JOIN as pending should void it.
    Restarted,
    /// JOIN_ACK (MAC-checked): we are a member.
    Joined(JoinAck),
    /// A PROBE (MAC-checked) was answered: the reply is queued.
    Probed,
    /// CHECKPOINT_REQUEST (MAC-checked): upload the group's game state with
    /// this nonce over the checkpoint channel ([`crate::checkpoint::upload`]).
    CheckpointRequested { nonce: u64 },
    /// The join ended without a membership; the session is finished.
    Failed(Failure),
    /// `ERROR(NotMember)` while a member: the reflector no longer has us
    /// (it expired us or restarted). The session is finished; join again
    /// with the same token if it is still valid
    /// ([`Session::rejoin_request`]).
    MembershipLost,
    /// The JOIN_ACK (MAC-checked, same membership) of a renewal: the
    /// membership now lasts until the newer token's expiry.
    Renewed,
    /// MOVED (MAC-checked, this membership): the reflector stops serving
    /// the membership within `within_ms` (draining, the cell placed
    /// elsewhere, shutting down). Ask the control server where to go, join
    /// there, then leave here. An unauthenticated ERROR never means this.
    Moved(Moved),
}

/// Where a session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The first JOIN (token only) is out; waiting for the challenge (or
    /// waiting to send it again after `ERROR(Retry)`).
    Challenging,
    /// The JOIN echoing the cookie is out; waiting for JOIN_ACK.
    Echoing,
    /// Admitted (JOIN_ACK received).
    Member,
    /// Finished: the join failed, the membership was lost, or we left.
    Done,
}

/// A datagram to send.
#[derive(Clone, Copy)]
pub struct Transmit {
    pub to: SocketAddr,
    pub datagram: SmallDatagram,
    /// This is a JOIN echoing a cookie: once it is out, the reflector may
    /// count us as a member even before its JOIN_ACK reaches us.
    pub echoes_cookie: bool,
}

impl std::fmt::Debug for Transmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transmit")
            .field("to", &self.to)
            .field("len", &self.datagram.len())
            .field("echoes_cookie", &self.echoes_cookie)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Challenging,
    /// `ERROR(Retry)`: the first JOIN goes out again at this time.
    Waiting(Instant),
    Echoing([u8; COOKIE_LEN]),
    Member(JoinAck),
    Done,
}

/// One player's membership of one group; see the module documentation.
/// `Copy` and allocation-free, so thousands live in one event loop.
#[derive(Debug, Clone, Copy)]
pub struct Session {
    req: JoinRequest,
    cfg: Config,
    state: State,
    /// The next sequence number to send.
    seq: u64,
    /// The membership id from JOIN_ACK.
    membership: u32,
    started: Instant,
    /// When the current JOIN step was last queued.
    last_tx: Instant,
    pending: Option<Transmit>,
    /// `ERROR(Retry)`s received so far.
    retries: u32,
    /// The newest token this session holds (the request's, or the last
    /// renewal's) and when it was received (Unix ms), once the caller said.
    newest: Held,
    /// A renewal waiting for its JOIN_ACK.
    renewing: Option<Held>,
}

/// A token held, with its keys and when it was received.
#[derive(Debug, Clone, Copy)]
struct Held {
    token: [u8; TOKEN_LEN],
    keys: SessionKeys,
    received_unix_ms: Option<u64>,
}

impl Held {
    fn expires_unix_s(&self) -> u64 {
        TokenClaims::peek(&self.token).expires_unix_s
    }
}

impl Session {
    /// Starts a join at `now`: the first JOIN is ready in [`Session::poll_transmit`].
    pub fn new(req: JoinRequest, cfg: Config, now: Instant) -> Session {
        let mut s = Session {
            req,
            cfg,
            state: State::Challenging,
            seq: req.first_seq.max(1),
            membership: 0,
            started: now,
            last_tx: now,
            pending: None,
            retries: 0,
            newest: Held {
                token: req.token,
                keys: req.keys,
                received_unix_ms: None,
            },
            renewing: None,
        };
        s.queue_join(now);
        s
    }

    pub fn request(&self) -> &JoinRequest {
        &self.req
    }

    pub fn phase(&self) -> Phase {
        match self.state {
            State::Challenging | State::Waiting(_) => Phase::Challenging,
            State::Echoing(_) => Phase::Echoing,
            State::Member(_) => Phase::Member,
            State::Done => Phase::Done,
        }
    }

    pub fn is_member(&self) -> bool {
        matches!(self.state, State::Member(_))
    }

    /// The next sequence number this session would send (hand it to the
    /// next session with the same key as [`JoinRequest::first_seq`]).
    pub fn next_seq(&self) -> u64 {
        self.seq
    }

    /// Raises the next sequence number to at least `seq` (never lowers it).
    /// A client holding several sessions keeps one counter across them
    /// (docs/protocol.md, "Client instance and sequence counter"): before a
    /// session sends, it takes up where the last datagram of any of them
    /// left off, so no two datagrams of the client share a number.
    pub fn advance_seq(&mut self, seq: u64) {
        self.seq = self.seq.max(seq);
    }

    /// The membership id, once a member.
    pub fn membership(&self) -> Option<u32> {
        self.is_member().then_some(self.membership)
    }

    /// The reflector's JOIN_ACK, once a member.
    pub fn ack(&self) -> Option<JoinAck> {
        match self.state {
            State::Member(a) => Some(a),
            _ => None,
        }
    }

    /// The next datagram to send, if any. A step queued again before the
    /// previous copy was taken replaces it: only the latest step matters.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.pending.take()
    }

    /// When [`Session::handle_timeout`] is next due; `None` once a member
    /// (keepalives are the caller's: it knows when it last sent), unless a
    /// renewal waits for its JOIN_ACK, or done.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Member(_) if self.renewing.is_some() => Some(self.last_tx + self.cfg.retry),
            State::Challenging | State::Echoing(_) | State::Waiting(_) => {
                let retry = match self.state {
                    State::Waiting(at) => at,
                    _ => self.last_tx + self.cfg.retry,
                };
                Some(match self.cfg.give_up {
                    Some(g) => retry.min(self.started + g),
                    None => retry,
                })
            }
            State::Member(_) | State::Done => None,
        }
    }

    /// Advances the timers to `now`: resends the current JOIN step (or the
    /// renewal), or gives up.
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Event> {
        if let (State::Member(_), Some(r)) = (self.state, self.renewing) {
            if now < self.last_tx + self.cfg.retry {
                return None;
            }
            self.queue_renewal(r.token, now);
            return Some(Event::Retransmitted);
        }
        if !matches!(self.state, State::Challenging | State::Echoing(_) | State::Waiting(_)) {
            return None;
        }
        if let Some(g) = self.cfg.give_up {
            if now >= self.started + g {
                self.state = State::Done;
                self.pending = None;
                return Some(Event::Failed(Failure::TimedOut(g)));
            }
        }
        if let State::Waiting(at) = self.state {
            if now < at {
                return None;
            }
            self.state = State::Challenging;
            self.queue_join(now);
            return Some(Event::Restarted);
        }
        if now < self.last_tx + self.cfg.retry {
            return None;
        }
        self.queue_join(now);
        Some(Event::Retransmitted)
    }

    /// Handles one datagram that arrived from `src`. DATA is the caller's
    /// business and is ignored here, as is anything not from our reflector
    /// and group, for another player, or (every type but ERROR) whose MAC
    /// does not verify under our key.
    pub fn handle<T: AsRef<[u8]>>(&mut self, now: Instant, src: SocketAddr, pkt: &Packet<T>) -> Option<Event> {
        if src != self.req.reflector || pkt.group() != self.req.group || pkt.sender() != self.req.player {
            return None;
        }
        if pkt.kind() != Kind::Error && !self.req.keys.verify(pkt) {
            return None;
        }
        match (pkt.kind(), self.state) {
            (Kind::JoinChallenge, State::Challenging) => {
                let cookie = *pkt.challenge_cookie()?;
                self.state = State::Echoing(cookie);
                self.queue_join(now);
                None
            }
            (Kind::JoinAck, State::Echoing(_)) => {
                let ack = pkt.join_ack()?;
                self.state = State::Member(ack);
                self.membership = pkt.membership();
                self.pending = None;
                Some(Event::Joined(ack))
            }
            (Kind::JoinAck, State::Member(_)) if pkt.membership() == self.membership => {
                // A late copy of the first JOIN_ACK, or a renewal's.
                let r = self.renewing.take()?;
                let ack = pkt.join_ack()?;
                self.state = State::Member(ack);
                self.newest = r;
                self.pending = None;
                Some(Event::Renewed)
            }
            (Kind::Probe, State::Member(_)) if pkt.membership() == self.membership => {
                let nonce = pkt.nonce()?;
                let h = self.header(Kind::ProbeReply);
                self.pending = Some(Transmit {
                    to: self.req.reflector,
                    datagram: SmallDatagram::nonce(&h, nonce, &self.req.keys),
                    echoes_cookie: false,
                });
                Some(Event::Probed)
            }
            (Kind::CheckpointRequest, State::Member(_)) if pkt.membership() == self.membership => {
                Some(Event::CheckpointRequested { nonce: pkt.nonce()? })
            }
            (Kind::Moved, State::Member(_)) if pkt.membership() == self.membership => Some(Event::Moved(pkt.moved()?)),
            (Kind::Error, State::Challenging | State::Echoing(_)) => {
                match pkt.error_code()? {
                    Ok(ErrorCode::BadCookie) => {
                        self.state = State::Challenging;
                        self.queue_join(now);
                        Some(Event::Restarted)
                    }
                    // The address is held by a member being checked: the
                    // whole join again, a second later (a bounded number
                    // of times: the holder may be alive).
                    Ok(ErrorCode::Retry) if self.retries < MAX_RETRIES => {
                        self.retries += 1;
                        self.state = State::Waiting(now + RETRY_AFTER);
                        self.pending = None;
                        None
                    }
                    // Not a member yet: a NotMember here answers a DATA or
                    // KEEPALIVE of an earlier membership, not this join.
                    Ok(ErrorCode::NotMember) => None,
                    Ok(ErrorCode::ExpiredToken) => self.fail(Failure::ExpiredToken),
                    code => self.fail(Failure::Refused(code)),
                }
            }
            (Kind::Error, State::Member(_)) => match pkt.error_code()? {
                Ok(ErrorCode::NotMember) => {
                    self.state = State::Done;
                    Some(Event::MembershipLost)
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// Notes when (Unix ms) the session's token was received from the
    /// control server: the renewal moment is reckoned from it.
    pub fn set_token_received(&mut self, unix_ms: u64) {
        self.newest.received_unix_ms = Some(unix_ms);
    }

    /// When (Unix ms) a member should renew: when a third of its newest
    /// token's lifetime is left, at the latest 10 s before its expiry
    /// (`renewal::renew_at_unix_ms`). `None` before it is a member, while a
    /// renewal is under way, or before [`Session::set_token_received`].
    pub fn renew_at(&self) -> Option<u64> {
        if !self.is_member() || self.renewing.is_some() {
            return None;
        }
        let received = self.newest.received_unix_ms?;
        Some(renewal::renew_at_unix_ms(received, self.newest.expires_unix_s()))
    }

    /// The expiry (Unix s) of the newest token held: when the reflector
    /// ends the membership unless it is renewed.
    pub fn expires_unix_s(&self) -> u64 {
        self.newest.expires_unix_s()
    }

    /// Whether a renewal waits for its JOIN_ACK.
    pub fn is_renewing(&self) -> bool {
        self.renewing.is_some()
    }

    /// Renews the membership with a newer `token` (and its `keys`, kept for
    /// the next JOIN: the membership keeps its own), received at
    /// `received_unix_ms`: the renewal JOIN is queued, and sent again every
    /// [`Config::retry`] until its JOIN_ACK. A token that does not expire
    /// later than the newest held is not worth a renewal: false, and so
    /// is any call while not a member.
    pub fn renew(&mut self, token: [u8; TOKEN_LEN], keys: SessionKeys, received_unix_ms: u64, now: Instant) -> bool {
        let held = Held {
            token,
            keys,
            received_unix_ms: Some(received_unix_ms),
        };
        if !self.is_member() || held.expires_unix_s() <= self.newest.expires_unix_s() {
            return false;
        }
        self.renewing = Some(held);
        self.queue_renewal(token, now);
        true
    }

    /// The request to join with again after the membership was lost: the
    /// newest token and key held, sequence numbers going on.
    pub fn rejoin_request(&self) -> JoinRequest {
        JoinRequest {
            token: self.newest.token,
            keys: self.newest.keys,
            first_seq: self.seq,
            ..self.req
        }
    }

    fn queue_renewal(&mut self, token: [u8; TOKEN_LEN], now: Instant) {
        let seq = self.seq;
        self.seq += 1;
        let h = Header {
            kind: Kind::Join,
            group: self.req.group,
            sender: self.req.player,
            membership: self.membership,
            seq,
        };
        self.pending = Some(Transmit {
            to: self.req.reflector,
            datagram: SmallDatagram::renewal(&h, &token, &self.req.keys),
            echoes_cookie: false,
        });
        self.last_tx = now;
    }

    /// Ends the session: the LEAVE to send, unless it had already ended. A
    /// join still in progress is left too, since the reflector may have
    /// admitted us already.
    pub fn leave(&mut self) -> Option<Transmit> {
        if self.state == State::Done {
            return None;
        }
        self.state = State::Done;
        self.pending = None;
        Some(self.simple(Kind::Leave))
    }

    /// A KEEPALIVE to send, while a member. When to send it is the caller's
    /// choice: every [`JoinAck::keepalive_ms`] (with DATA tags off, DATA is no
    /// sign of life, so keepalives go out whatever else is sent).
    pub fn keepalive(&mut self) -> Option<Transmit> {
        self.is_member().then(|| self.simple(Kind::Keepalive))
    }

    /// An ECHO carrying `nonce` (only while a member): a sign of life like
    /// KEEPALIVE that the reflector also answers with an ECHO_REPLY of the
    /// same nonce, MAC'd under this session's key, so the caller times the
    /// round trip.
    pub fn echo(&mut self, nonce: u64) -> Option<Transmit> {
        if !self.is_member() {
            return None;
        }
        let h = self.header(Kind::Echo);
        Some(Transmit {
            to: self.req.reflector,
            datagram: SmallDatagram::nonce(&h, nonce, &self.req.keys),
            echoes_cookie: false,
        })
    }

    /// Seals a DATA whose game payload (`payload_len` bytes) the caller
    /// wrote at `out[DATA_PAYLOAD..]`: header, our next sequence number, and
    /// the tag if the group wants tags. Returns the datagram's length; only
    /// while a member.
    pub fn emit_data(&mut self, payload_len: usize, out: &mut [u8]) -> Option<Result<usize, EmitError>> {
        let State::Member(ack) = self.state else {
            return None;
        };
        let h = self.header(Kind::Data);
        let keys = ack.tags().then_some(&self.req.keys);
        Some(emit_in_place(&h, DATA_PAYLOAD + payload_len, keys, out))
    }

    /// The header of our next datagram of `kind` (takes a sequence number).
    fn header(&mut self, kind: Kind) -> Header {
        let seq = self.seq;
        self.seq += 1;
        Header {
            kind,
            group: self.req.group,
            sender: self.req.player,
            membership: if kind == Kind::Join { 0 } else { self.membership },
            seq,
        }
    }

    fn simple(&mut self, kind: Kind) -> Transmit {
        let h = self.header(kind);
        Transmit {
            to: self.req.reflector,
            datagram: SmallDatagram::simple(&h, &self.req.keys),
            echoes_cookie: false,
        }
    }

    fn queue_join(&mut self, now: Instant) {
        let cookie = match &self.state {
            State::Echoing(c) => Some(*c),
            _ => None,
        };
        let h = self.header(Kind::Join);
        self.pending = Some(Transmit {
            to: self.req.reflector,
            datagram: SmallDatagram::join(&h, &self.req.token, cookie.as_ref(), &self.req.keys),
            echoes_cookie: cookie.is_some(),
        });
        self.last_tx = now;
    }

    fn fail(&mut self, f: Failure) -> Option<Event> {
        self.state = State::Done;
        self.pending = None;
        Some(Event::Failed(f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::MovedReason;
    use proptest::prelude::*;

    const GROUP: u16 = 4000;
    const PLAYER: u32 = 7;

    fn reflector() -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], GROUP))
    }

    fn keys() -> SessionKeys {
        SessionKeys::from_session([4; 32])
    }

    fn req() -> JoinRequest {
        JoinRequest {
            reflector: reflector(),
            group: GROUP,
            player: PLAYER,
            token: [3; TOKEN_LEN],
            keys: keys(),
            first_seq: 1,
        }
    }

    fn hdr(kind: Kind) -> Header {
        Header {
            kind,
            group: GROUP,
            sender: PLAYER,
            membership: 0x55,
            seq: 1,
        }
    }

    const ACK: JoinAck = JoinAck {
        members: 2,
        keepalive_ms: 500,
        flags: 0,
        checkpoint_port: 0,
    };

    fn parse(t: &Transmit) -> Packet<Vec<u8>> {
        Packet::parse(t.datagram.as_bytes().to_vec()).unwrap()
    }

    fn challenge() -> Packet<Vec<u8>> {
        Packet::parse(
            SmallDatagram::challenge(&hdr(Kind::JoinChallenge), &[9; COOKIE_LEN], &keys())
                .as_bytes()
                .to_vec(),
        )
        .unwrap()
    }

    fn ack() -> Packet<Vec<u8>> {
        Packet::parse(
            SmallDatagram::join_ack(&hdr(Kind::JoinAck), ACK, &keys())
                .as_bytes()
                .to_vec(),
        )
        .unwrap()
    }

    fn error(code: ErrorCode) -> Packet<Vec<u8>> {
        Packet::parse(SmallDatagram::error(GROUP, PLAYER, 0, code).as_bytes().to_vec()).unwrap()
    }

    #[test]
    fn the_two_steps_then_member() {
        let t0 = Instant::now();
        let mut s = Session::new(req(), Config::default(), t0);
        let first = s.poll_transmit().unwrap();
        assert!(!first.echoes_cookie);
        assert_eq!(first.to, reflector());
        let p = parse(&first);
        assert_eq!((p.kind(), p.group(), p.sender()), (Kind::Join, GROUP, PLAYER));
        assert_eq!(p.join_token(), Some(&[3; TOKEN_LEN]));
        assert_eq!(p.join_cookie(), None);
        assert!(s.poll_transmit().is_none());
        assert_eq!(s.handle(t0, reflector(), &challenge()), None);
        assert_eq!(s.phase(), Phase::Echoing);
        let second = s.poll_transmit().unwrap();
        assert!(second.echoes_cookie);
        assert_eq!(parse(&second).join_cookie(), Some(&[9; COOKIE_LEN]));
        // A second challenge (answer to a retried first JOIN) changes nothing.
        assert_eq!(s.handle(t0, reflector(), &challenge()), None);
        assert!(s.poll_transmit().is_none());
        let ev = s.handle(t0, reflector(), &ack());
        assert_eq!(ev, Some(Event::Joined(ACK)));
        assert!(s.is_member());
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(parse(&s.keepalive().unwrap()).kind(), Kind::Keepalive);
        let leave = s.leave().unwrap();
        assert_eq!(parse(&leave).kind(), Kind::Leave);
        assert_eq!(s.phase(), Phase::Done);
        assert!(s.leave().is_none() && s.keepalive().is_none());
    }

    #[test]
    fn an_ack_before_the_echo_and_strays_are_ignored() {
        let t0 = Instant::now();
        let mut s = Session::new(req(), Config::default(), t0);
        s.poll_transmit();
        assert_eq!(s.handle(t0, reflector(), &ack()), None);
        let elsewhere = SocketAddr::from(([10, 0, 0, 1], GROUP + 1));
        assert_eq!(s.handle(t0, elsewhere, &challenge()), None);
        let other_group = Packet::parse(
            SmallDatagram::challenge(
                &Header {
                    group: GROUP + 1,
                    ..hdr(Kind::JoinChallenge)
                },
                &[9; 16],
                &keys(),
            )
            .as_bytes()
            .to_vec(),
        )
        .unwrap();
        assert_eq!(s.handle(t0, reflector(), &other_group), None);
        assert_eq!(s.phase(), Phase::Challenging);
        assert!(s.poll_transmit().is_none());
    }

    #[test]
    fn unanswered_steps_are_resent_on_the_injected_clock() {
        let t0 = Instant::now();
        let cfg = Config {
            retry: Duration::from_millis(100),
            give_up: Some(Duration::from_millis(1000)),
        };
        let mut s = Session::new(req(), cfg, t0);
        s.poll_transmit();
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_millis(100)));
        assert_eq!(s.handle_timeout(t0 + Duration::from_millis(99)), None);
        assert!(s.poll_transmit().is_none());
        assert_eq!(
            s.handle_timeout(t0 + Duration::from_millis(100)),
            Some(Event::Retransmitted)
        );
        assert!(!s.poll_transmit().unwrap().echoes_cookie);
        s.handle(t0 + Duration::from_millis(150), reflector(), &challenge());
        s.poll_transmit();
        assert_eq!(s.poll_timeout(), Some(t0 + Duration::from_millis(250)));
        assert_eq!(
            s.handle_timeout(t0 + Duration::from_millis(250)),
            Some(Event::Retransmitted)
        );
        assert!(s.poll_transmit().unwrap().echoes_cookie, "the echo is what is resent");
        assert_eq!(
            s.handle_timeout(t0 + Duration::from_millis(1000)),
            Some(Event::Failed(Failure::TimedOut(Duration::from_millis(1000))))
        );
        assert_eq!(s.phase(), Phase::Done);
        assert_eq!(s.poll_timeout(), None);
        assert!(s.poll_transmit().is_none());
    }

    #[test]
    fn errors_restart_end_or_are_ignored_by_phase() {
        let t0 = Instant::now();
        // A stale cookie starts over from the first JOIN.
        let mut s = Session::new(req(), Config::default(), t0);
        s.handle(t0, reflector(), &challenge());
        s.poll_transmit();
        assert_eq!(
            s.handle(t0, reflector(), &error(ErrorCode::BadCookie)),
            Some(Event::Restarted)
        );
        assert_eq!(s.phase(), Phase::Challenging);
        assert!(!s.poll_transmit().unwrap().echoes_cookie);
        // A NotMember while joining answers an older membership.
        assert_eq!(s.handle(t0, reflector(), &error(ErrorCode::NotMember)), None);
        for (code, failure) in [
            (ErrorCode::ExpiredToken, Failure::ExpiredToken),
            (ErrorCode::BadToken, Failure::Refused(Ok(ErrorCode::BadToken))),
            (ErrorCode::GroupFull, Failure::Refused(Ok(ErrorCode::GroupFull))),
        ] {
            let mut s = Session::new(req(), Config::default(), t0);
            assert_eq!(s.handle(t0, reflector(), &error(code)), Some(Event::Failed(failure)));
            assert_eq!(s.phase(), Phase::Done);
            assert!(s.poll_transmit().is_none() && s.poll_timeout().is_none());
        }
        // A member ignores late refusals of its retried JOIN, but not NotMember.
        let mut s = Session::new(req(), Config::default(), t0);
        s.handle(t0, reflector(), &challenge());
        s.handle(t0, reflector(), &ack());
        assert_eq!(s.handle(t0, reflector(), &error(ErrorCode::BadCookie)), None);
        assert!(s.is_member());
        assert_eq!(
            s.handle(t0, reflector(), &error(ErrorCode::NotMember)),
            Some(Event::MembershipLost)
        );
        assert_eq!(s.phase(), Phase::Done);
        assert!(s.leave().is_none(), "nothing to leave");
    }

    #[test]
    fn retry_waits_a_second_then_starts_over_a_bounded_number_of_times() {
        let t0 = Instant::now();
        let mut s = Session::new(req(), Config::default(), t0);
        s.poll_transmit();
        let mut now = t0;
        for i in 0..MAX_RETRIES {
            // Refused in either step: nothing goes out until the wait is over.
            if i % 2 == 1 {
                s.handle(now, reflector(), &challenge());
                assert!(s.poll_transmit().unwrap().echoes_cookie);
            }
            assert_eq!(s.handle(now, reflector(), &error(ErrorCode::Retry)), None);
            assert_eq!(s.phase(), Phase::Challenging);
            assert!(s.poll_transmit().is_none());
            assert_eq!(s.poll_timeout(), Some(now + RETRY_AFTER));
            // A late challenge during the wait changes nothing.
            assert_eq!(s.handle(now, reflector(), &challenge()), None);
            assert!(s.poll_transmit().is_none());
            assert_eq!(s.handle_timeout(now + RETRY_AFTER - Duration::from_millis(1)), None);
            now += RETRY_AFTER;
            assert_eq!(s.handle_timeout(now), Some(Event::Restarted));
            let first = s.poll_transmit().unwrap();
            assert!(!first.echoes_cookie, "from the first step");
        }
        let ev = s.handle(now, reflector(), &error(ErrorCode::Retry));
        assert_eq!(ev, Some(Event::Failed(Failure::Refused(Ok(ErrorCode::Retry)))));
        assert!(Failure::Refused(Ok(ErrorCode::Retry)).to_string().contains("retries"));
        assert_eq!(s.phase(), Phase::Done);
        assert!(s.poll_timeout().is_none());
        // Admitted after a retry: a member as usual.
        let mut s = Session::new(req(), Config::default(), t0);
        s.handle(t0, reflector(), &error(ErrorCode::Retry));
        s.handle_timeout(t0 + RETRY_AFTER);
        s.poll_transmit();
        s.handle(t0 + RETRY_AFTER, reflector(), &challenge());
        s.poll_transmit();
        assert_eq!(
            s.handle(t0 + RETRY_AFTER, reflector(), &ack()),
            Some(Event::Joined(ACK))
        );
    }

    #[test]
    fn forged_replies_are_ignored_and_probes_answered_under_the_key() {
        let t0 = Instant::now();
        let mut s = Session::new(req(), Config::default(), t0);
        s.poll_transmit();
        // A challenge MAC'd under another key (someone who saw the token).
        let other = SessionKeys::from_session([5; 32]);
        let forged = SmallDatagram::challenge(&hdr(Kind::JoinChallenge), &[9; 16], &other);
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(forged.as_bytes()).unwrap()),
            None
        );
        assert_eq!(s.phase(), Phase::Challenging);
        s.handle(t0, reflector(), &challenge());
        let echo = s.poll_transmit().unwrap();
        s.handle(t0, reflector(), &ack());
        assert_eq!(s.membership(), Some(0x55));
        // Sequence numbers only grow: JOIN, JOIN again, then a KEEPALIVE.
        let ka = s.keepalive().unwrap();
        assert!(parse(&ka).seq() > parse(&echo).seq());
        assert_eq!(parse(&ka).membership(), 0x55);
        assert!(keys().verify(&parse(&ka)));
        let probe = SmallDatagram::nonce(&hdr(Kind::Probe), 77, &keys());
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(probe.as_bytes()).unwrap()),
            Some(Event::Probed)
        );
        let reply = parse(&s.poll_transmit().unwrap());
        assert_eq!(
            (reply.kind(), reply.nonce(), reply.membership()),
            (Kind::ProbeReply, Some(77), 0x55)
        );
        assert!(keys().verify(&reply));
        // A checkpoint request under our key is an event; a forged one is not.
        let req = SmallDatagram::nonce(&hdr(Kind::CheckpointRequest), 91, &keys());
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(req.as_bytes()).unwrap()),
            Some(Event::CheckpointRequested { nonce: 91 })
        );
        let mut forged = req.as_bytes().to_vec();
        forged[24] ^= 1;
        assert_eq!(s.handle(t0, reflector(), &Packet::parse(&forged[..]).unwrap()), None);
        // MOVED under our key is an event; under another key, from another
        // address or for another membership it is nothing.
        let moved = SmallDatagram::moved(&hdr(Kind::Moved), MovedReason::Draining, 1_500, &keys());
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(moved.as_bytes()).unwrap()),
            Some(Event::Moved(Moved {
                reason: Ok(MovedReason::Draining),
                within_ms: 1_500
            }))
        );
        let other = SessionKeys::from_session([9; 32]);
        let forged = SmallDatagram::moved(&hdr(Kind::Moved), MovedReason::Draining, 1_500, &other);
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(forged.as_bytes()).unwrap()),
            None
        );
        let elsewhere: SocketAddr = "192.0.2.9:4000".parse().unwrap();
        assert_eq!(s.handle(t0, elsewhere, &Packet::parse(moved.as_bytes()).unwrap()), None);
        let stale = SmallDatagram::moved(
            &Header {
                membership: 0x56,
                ..hdr(Kind::Moved)
            },
            MovedReason::Draining,
            1_500,
            &keys(),
        );
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(stale.as_bytes()).unwrap()),
            None
        );
        assert!(s.is_member(), "MOVED alone ends nothing");
        // DATA sealed in place, untagged in a group without tags.
        let mut out = [0u8; 64];
        out[crate::protocol::DATA_PAYLOAD..][..3].copy_from_slice(b"pos");
        let n = s.emit_data(3, &mut out).unwrap().unwrap();
        let d = Packet::parse(&out[..n]).unwrap();
        assert_eq!((d.kind(), d.payload(), d.tag()), (Kind::Data, &b"pos"[..], Some(0)));
        assert!(d.seq() > reply.seq());
        let next = s.next_seq();
        assert!(next > d.seq());
    }

    #[test]
    fn unknown_error_codes_are_refusals_that_say_so() {
        let mut b = SmallDatagram::error(GROUP, PLAYER, 0, ErrorCode::BadToken)
            .as_bytes()
            .to_vec();
        b[24..26].copy_from_slice(&99u16.to_be_bytes());
        let t0 = Instant::now();
        let mut s = Session::new(req(), Config::default(), t0);
        let ev = s.handle(t0, reflector(), &Packet::parse(&b[..]).unwrap());
        assert_eq!(ev, Some(Event::Failed(Failure::Refused(Err(99)))));
        assert!(Failure::Refused(Err(99)).to_string().contains("unknown error code 99"));
    }

    /// A token whose expiry (bytes 8..16) is `expires_unix_s`: the session
    /// reads nothing else of it.
    fn token_expiring(expires_unix_s: u64) -> [u8; TOKEN_LEN] {
        let mut t = [3; TOKEN_LEN];
        t[8..16].copy_from_slice(&expires_unix_s.to_be_bytes());
        t
    }

    #[test]
    fn a_member_renews_under_its_membership_key_until_acknowledged() {
        const EXP: u64 = 1_700_000_300;
        let t0 = Instant::now();
        let mut r = req();
        r.token = token_expiring(EXP);
        let mut s = Session::new(r, Config::default(), t0);
        let newer = token_expiring(EXP + 300);
        let newer_keys = SessionKeys::from_session([6; 32]);
        assert!(!s.renew(newer, newer_keys, 0, t0), "not a member yet");
        s.set_token_received(EXP * 1000 - 300_000);
        assert_eq!(s.renew_at(), None, "not a member yet");
        s.handle(t0, reflector(), &challenge());
        let echo = s.poll_transmit().unwrap();
        s.handle(t0, reflector(), &ack());
        assert!(s.is_member());
        // A third of the 300 s left: 100 s before expiry.
        assert_eq!(s.renew_at(), Some(EXP * 1000 - 100_000));
        assert_eq!(s.renew_at(), Some(renewal::renew_at_unix_ms(EXP * 1000 - 300_000, EXP)));
        assert!(!s.renew(token_expiring(EXP), newer_keys, 0, t0), "not later");
        assert!(s.poll_transmit().is_none());
        let at = EXP * 1000 - 100_000;
        assert!(s.renew(newer, newer_keys, at, t0));
        assert!(s.is_renewing() && s.renew_at().is_none());
        let first = parse(&s.poll_transmit().unwrap());
        assert_eq!(first.as_bytes().len(), 72);
        assert!(first.is_renewal());
        assert_eq!((first.membership(), first.join_token()), (0x55, Some(&newer)));
        assert_eq!(first.join_cookie(), None);
        assert!(keys().verify(&first), "under the membership's key");
        assert!(!newer_keys.verify(&first));
        assert!(first.seq() > parse(&echo).seq());
        // Unanswered: sent again at the retry interval, with a new number.
        let retry = Config::default().retry;
        assert_eq!(s.poll_timeout(), Some(t0 + retry));
        assert_eq!(s.handle_timeout(t0 + retry / 2), None);
        assert_eq!(s.handle_timeout(t0 + retry), Some(Event::Retransmitted));
        let again = parse(&s.poll_transmit().unwrap());
        assert!(again.is_renewal() && again.seq() > first.seq());
        // A JOIN_ACK of another membership, or forged, is not the answer.
        let other = Packet::parse(
            SmallDatagram::join_ack(
                &Header {
                    membership: 0x56,
                    ..hdr(Kind::JoinAck)
                },
                ACK,
                &keys(),
            )
            .as_bytes()
            .to_vec(),
        )
        .unwrap();
        assert_eq!(s.handle(t0, reflector(), &other), None);
        let forged = SmallDatagram::join_ack(&hdr(Kind::JoinAck), ACK, &newer_keys);
        assert_eq!(
            s.handle(t0, reflector(), &Packet::parse(forged.as_bytes()).unwrap()),
            None
        );
        // ERRORs cannot stop it.
        assert_eq!(s.handle(t0, reflector(), &error(ErrorCode::BadToken)), None);
        assert!(s.is_renewing());
        assert_eq!(s.handle(t0, reflector(), &ack()), Some(Event::Renewed));
        assert!(!s.is_renewing() && s.is_member());
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(s.expires_unix_s(), EXP + 300);
        assert_eq!(s.renew_at(), Some(renewal::renew_at_unix_ms(at, EXP + 300)));
        // A late copy changes nothing; the membership keeps its key.
        assert_eq!(s.handle(t0, reflector(), &ack()), None);
        assert!(keys().verify(&parse(&s.keepalive().unwrap())));
        // Joining again (membership lost) uses the newest token and key.
        let again = s.rejoin_request();
        assert_eq!((again.token, again.keys.mac_key()), (newer, newer_keys.mac_key()));
        assert_eq!(again.first_seq, s.next_seq());
    }

    proptest! {
        /// Whatever arrives, in whatever phase, the session never panics,
        /// only ever sends to its reflector, and every datagram it sends
        /// parses as one of the client's kinds.
        #[test]
        fn any_input_in_any_phase_is_safe(
            phase in 0usize..3,
            inputs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            kinds in proptest::collection::vec(1u8..11, 0..8),
            steps_ms in proptest::collection::vec(0u64..400, 0..8),
        ) {
            let t0 = Instant::now();
            let mut s = Session::new(req(), Config { retry: Duration::from_millis(100), give_up: Some(Duration::from_secs(1)) }, t0);
            if phase >= 1 { s.handle(t0, reflector(), &challenge()); }
            if phase >= 2 { s.handle(t0, reflector(), &ack()); }
            let mut now = t0;
            for (i, bytes) in inputs.iter().enumerate() {
                // Valid headers with random kinds and payloads reach the
                // per-kind accessors; raw bytes exercise the parser.
                let mut d = vec![0x52, 0x46, crate::protocol::VERSION, kinds.get(i).copied().unwrap_or(2)];
                d.extend_from_slice(&GROUP.to_be_bytes());
                d.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
                d.extend_from_slice(&PLAYER.to_be_bytes());
                d.extend_from_slice(&[0; 12]);
                d.extend_from_slice(bytes);
                for b in [&d[..], &bytes[..]] {
                    if let Ok(p) = Packet::parse(b) {
                        let _ = s.handle(now, reflector(), &p);
                    }
                }
                now += Duration::from_millis(steps_ms.get(i).copied().unwrap_or(0));
                let _ = s.handle_timeout(now);
                while let Some(t) = s.poll_transmit() {
                    prop_assert_eq!(t.to, reflector());
                    let p = Packet::parse(t.datagram.as_bytes()).unwrap();
                    prop_assert!(matches!(p.kind(), Kind::Join | Kind::Leave | Kind::Keepalive));
                    prop_assert_eq!(t.echoes_cookie, p.join_cookie().is_some());
                }
            }
        }
    }
}
