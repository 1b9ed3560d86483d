//! The one client a game links: one player's membership of its group on a
//! reflector (or of the groups of its area of interest), driven from the
//! game loop.
//!
//! ```no_run
//! use reflector_client::{Client, Config, ControlServer, Event, TokenSource};
//! use std::time::{Duration, Instant};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The player's ticket comes from the game's backend (a JWT).
//! let control = ControlServer {
//!     ticket: Some("the.player's.ticket".into()),
//!     ..ControlServer::new("https://control.example.net", 7, (120.0, 80.0))
//! };
//! let mut client = Client::new(Config::new(TokenSource::Control(control)))?;
//! loop {
//!     client.update(Instant::now()); // all I/O that is due
//!     while let Some(ev) = client.poll_event() {
//!         if let Event::Error(e) = ev {
//!             eprintln!("{e}");
//!         }
//!     }
//!     while let Some(d) = client.recv() {
//!         println!("player {} #{}: {} bytes", d.sender, d.seq, d.payload.len());
//!     }
//!     if client.is_member() {
//!         client.send(b"my position")?;
//!     }
//!     std::thread::sleep(Duration::from_millis(16)); // the game's frame
//! }
//! # }
//! ```
//!
//! A whole player, with leaving at the end, is `examples/first_group.rs`.
//!
//! The handshake, renewal and PROBE answers are `reflector_proto::client::Session`
//! (sans I/O); this crate adds what each caller of it had to write itself:
//! the socket (a non-blocking std UDP socket the client owns, behind the
//! [`Driver`] seam), keepalives
//! (as ECHOs, which also time the round trip), the token (handed in, or
//! fetched from the control server on a helper thread), renewal before
//! expiry, the rejoin rules, the client instance id and one client-wide
//! sequence counter (docs/protocol.md, revision 2.1), and receive-side
//! deduplication and counting. Nothing is left for the caller to drain or
//! schedule: a PROBE is answered in the [`Client::update`] that receives it,
//! so NAT rebinding needs nothing from the game.
//!
//! Loops other than a game's fixed-rate one: [`Client::next_update`] says
//! when `update` is next due, so a loop sleeps until then or until the
//! socket is readable; feature `tokio` adds `TokioDriver` and such a loop
//! (`Client::update_when_due`, `ready`, `send_async`).
//!
//! Checkpoints (docs/protocol.md, "Checkpoints"): where JOIN_ACK announces
//! the group's checkpoint channel, the client speaks the channel, version 2,
//! itself, advanced by [`Client::update`] without threads or blocking
//! calls: it fetches the latest checkpoint after each join
//! ([`Config::checkpoint_fetch_on_join`]), and uploads the state the game
//! hands to [`Client::provide_checkpoint`] when the reflector asks. Both end
//! in a [`CheckpointEvent`] from [`Client::poll_checkpoint`], each exchange
//! within [`Config::checkpoint_timeout`].
//!
//! Areas of interest ([`Config::area_radius`] > 0; docs/protocol.md,
//! "Area of interest"): the client asks the control server for the
//! player's cell and the groups within R cells of it in one request, and is
//! a member of each, over its one socket (the groups may be ports of one
//! reflector or of several). [`Client::send`] goes to the cell's group
//! only; [`Client::recv`] names each datagram's group, and a datagram that
//! arrives through two groups is delivered once (one stream per sender
//! and instance, across groups, numbered by the sender's client-wide
//! counter). [`Client::set_position`] moves make-before-break: one
//! request for the new area, JOINs for the groups not held yet, sending
//! switches to the new cell at its JOIN_ACK ([`Event::Moved`]), and only
//! once every new group is a member are the groups out of the area left
//! ([`Event::LeftGroup`]). Radius 0 (the default) is one group, as before;
//! a move at radius 0 is make-before-break too.
//!
//! Sealed groups (docs/protocol.md, "Sealed payloads"): where JOIN_ACK
//! says a group is sealed, [`Client::send`] seals the game data end to end
//! under the sender key of the player's cell and its newest started epoch
//! (the keys come in [`Token::keys`] from a control server with a sealing
//! secret, or [`Client::set_epoch_keys`]), and [`Client::recv`] hands back
//! only what opened; each refusal is counted in [`Stats`]. Keys near their
//! end are refreshed with `GET /keys` on a helper thread, as tokens are.
//! Without a key nothing is sent ([`SendError::NoSealingKey`]).
//!
//! Rejoin rules (ERROR cannot be authenticated), per group:
//! - `ERROR(NotMember)` to a member, a reflector silent for
//!   [`SILENT_INTERVALS`] keepalive intervals, or a refused join other than
//!   for the token: join again with the token and key held;
//! - only `ERROR(ExpiredToken)`/`ERROR(BadToken)` answering a JOIN, or the
//!   renewal moment, make it ask for a new token: one request renews
//!   every group of the area;
//! - a join (a first one, a move's, or a rejoin after a silence) that
//!   stays unanswered for [`REPLACE_INTERVALS`] intervals asks where the
//!   cell is now (the reflector may be dead and its cells placed
//!   elsewhere) and follows the answer as a move.
#![deny(unsafe_code)]

mod checkpoint;
mod driver;
mod inbox;
mod memlog;
mod moves;
mod schedule;
mod sealed_checkpoint;
mod sealing;
mod streams;
#[cfg(target_os = "linux")]
mod sys;
mod token;
mod types;
mod wake;

pub use checkpoint::{CheckpointError, CheckpointOp};
#[cfg(target_os = "linux")]
pub use driver::MmsgDriver;
#[cfg(feature = "tokio")]
pub use driver::TokioDriver;
pub use driver::{Driver, UdpDriver};
pub use memlog::{MembershipChange, MembershipRecord, TrySendError};
pub use reflector_proto::checkpoint::Refusal;
pub use schedule::{CHECKPOINT_POLL, FETCH_POLL};
pub use sealing::{KEYS_REFRESH_JITTER, KEYS_RETRY_FIRST, KEYS_RETRY_MAX};
pub use streams::{SenderKey, StreamCounters};
pub use token::{
    cell_keys, fetch as fetch_token, fetch_area, AreaTokens, CellKey, ControlError, ControlServer, GrantError,
    GrantSigning, Token,
};
pub use types::*;

use checkpoint::Transfer;
use inbox::Inbox;
use reflector_proto::client::{self as session, Event as SessionEvent, Failure, JoinRequest, Session};
use reflector_proto::protocol::{
    ErrorCode, Header, Kind, Packet, SessionKeys, DATA_PAYLOAD, INSTANCE_LEN, MAX_DATAGRAM, MAX_DATAGRAM_KERNEL,
    MAX_GAME_PAYLOAD,
};
use reflector_proto::sealed as sealed_fmt;
use sealing::{GroupSealing, Sealing};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use streams::{Streams, Verdict};

/// When (Unix ms) the token held was received: the renewal moment is
/// reckoned from it.
struct Held {
    received_unix_ms: u64,
}

/// A group: the reflector's address (its port is the group, unless a relay
/// stands in for it) and the group id.
type GroupKey = (SocketAddr, u16);

/// One group's membership (joined, being joined, or just left), with its
/// reflector and its own timers: each group of an area is probed, kept
/// alive and rejoined on its own.
struct Membership {
    /// This client's number for the membership (a rejoin is a new one),
    /// as the membership log names it.
    id: u64,
    session: Session,
    reflector: SocketAddr,
    rejoin: bool,
    keepalive: Duration,
    instance_flag: bool,
    /// Whether its JOIN_ACK says its DATA is sealed.
    sealing: GroupSealing,
    /// The checkpoint channel's TCP port from JOIN_ACK (0: none).
    checkpoint_port: u16,
    last_keepalive: Instant,
    /// Last authenticated datagram from the reflector for this group.
    last_heard: Instant,
    echo: Option<(u64, Instant)>,
    /// A refused join is tried again then, with the token held.
    rejoin_at: Option<Instant>,
    /// Joining since then (a first join, a move's new group, or a rejoin
    /// because the reflector went silent): once the JOIN has gone
    /// unanswered for [`REPLACE_INTERVALS`] intervals, the cell is placed
    /// anew.
    silent_since: Option<Instant>,
    /// In the area of the latest grant. One that is not any more is left
    /// once the new area's groups are members (make-before-break).
    wanted: bool,
    /// When its LEAVE was sent: DATA the reflector forwarded before the
    /// LEAVE reached it is still delivered for [`LEAVE_LINGER`].
    left_at: Option<Instant>,
}

impl Membership {
    fn key(&self) -> GroupKey {
        (self.reflector, self.session.request().group)
    }

    fn live(&self) -> bool {
        self.left_at.is_none()
    }
}

/// How long a group just left still delivers DATA: what the reflector
/// fanned out to us before our LEAVE reached it is owed, and is still on
/// its way (or in our socket's queue) when the LEAVE goes.
pub const LEAVE_LINGER: Duration = Duration::from_millis(500);

/// A move's old groups are left by this long after the new area was
/// granted even if one of its new groups never becomes a member (a
/// reflector down, a join refused): the old groups are not held forever.
pub const MOVE_BREAK_AFTER: Duration = Duration::from_secs(10);

/// A reflector that ends a membership repeats MOVED every second until the
/// member has gone. The client follows the first at once; while the
/// control server's answer keeps the cell where it was (its registry not
/// polled yet, or a single reflector), it asks again after 1 s, then 2 s,
/// 4 s, at most this long apart: a placement about to change is found
/// within a second or two, one that does not costs few requests.
pub const MOVE_FOLLOW_MAX: Duration = Duration::from_secs(8);

/// One player's memberships (its cell's group, and with
/// [`Config::area_radius`] the groups around it), its socket and its
/// timers; see the crate docs. `D` is the socket ([`UdpDriver`] unless told
/// otherwise).
pub struct Client<D: Driver = UdpDriver> {
    cfg: Config,
    sock: D,
    instance: u64,
    /// The client-wide sequence counter: every datagram of every membership
    /// takes the next number (docs/protocol.md, "Client instance").
    next_seq: u64,
    held: Option<Held>,
    /// Every group held, the cell's among them; a handful (at most 25 for
    /// an area of radius 2), so a linear search is the lookup.
    memberships: Vec<Membership>,
    /// The player's cell: the group of the latest grant's own cell.
    cell: Option<GroupKey>,
    /// Where [`Client::send`] goes: the cell once its JOIN_ACK arrived;
    /// during a move, the previous cell until then.
    sending: Option<GroupKey>,
    /// Old groups of a move are left by then whatever happened.
    break_by: Option<Instant>,
    /// The game moved ([`Client::set_position`]) and the area for the new
    /// position is still to be asked for.
    move_pending: bool,
    /// The next area granted answers a move: taken make-before-break even
    /// at radius 0.
    moving: bool,
    /// When a MOVED was last followed, the cell then, and the wait before
    /// the next is followed ([`MOVE_FOLLOW_MAX`]).
    move_followed: Option<(Instant, Option<GroupKey>)>,
    move_follow_wait: Duration,
    left: bool,
    /// A token request in flight on a helper thread.
    fetching: Option<mpsc::Receiver<Result<AreaTokens, ControlError>>>,
    /// Signalled by that thread once its answer is in `fetching`: an
    /// async loop wakes for it (see wake.rs).
    wake: std::sync::Arc<wake::Wake>,
    fetch_not_before: Option<Instant>,
    /// A renewal brought no later expiry: the next waits until then.
    renew_not_before: Option<Instant>,
    token_needed_said: bool,
    events: VecDeque<Event>,
    inbox: Inbox,
    streams: Streams,
    /// Epoch keys, sender keys, the sealed receiver and `/keys` refresh.
    sealing: Sealing,
    stats: Stats,
    rx: Box<[u8]>,
    tx: Box<[u8; MAX_DATAGRAM_KERNEL]>,
    /// The CHECKPOINT_REQUEST not answered yet: its group and nonce.
    ck_nonce: Option<(GroupKey, u64)>,
    ck_upload: Option<Transfer>,
    ck_fetch: Option<Transfer>,
    /// A FETCH_OTHER under way ([`Client::fetch_checkpoint_other`]).
    ck_fetch_other: Option<Transfer>,
    ck_events: VecDeque<CheckpointEvent>,
    /// The number the next membership takes.
    next_membership_id: u64,
    /// The membership log, once asked for ([`Client::log_memberships`]).
    memlog: Option<VecDeque<MembershipRecord>>,
    /// Receiving stops at a full inbox ([`Client::hold_when_inbox_full`]).
    hold_when_full: bool,
    /// The last `update` stopped receiving at a full inbox.
    inbox_held: bool,
}

fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // Without the OS RNG there is no safe instance id or nonce at all.
    getrandom::getrandom(&mut b).expect("the OS random source is available");
    u64::from_ne_bytes(b)
}

/// The reflector's address of the local socket's family, through the
/// system resolver (a name works as well as an address).
fn resolve(addr: &str, local: SocketAddr) -> Result<SocketAddr, Error> {
    let err = |message: String| Error::Resolve {
        addr: addr.to_string(),
        message,
    };
    let mut all = addr.to_socket_addrs().map_err(|e| err(e.to_string()))?;
    all.find(|a| a.is_ipv4() == local.is_ipv4())
        .ok_or_else(|| err(format!("no address of the local socket's family ({local})")))
}

impl Client<UdpDriver> {
    /// Binds a non-blocking std UDP socket on [`Config::local`] and starts
    /// (see [`Client::with_driver`]).
    pub fn new(cfg: Config) -> Result<Client, Error> {
        let sock = UdpDriver::bind(cfg.local.as_str()).map_err(|e| Error::socket("bind", e))?;
        Client::with_driver(cfg, sock)
    }
}

impl<D: Driver> Client<D> {
    /// Starts on `sock`: a given token is joined with at once, a control
    /// server asked for one (or for the area, [`Config::area_radius`]) on a
    /// helper thread; with [`TokenSource::Later`] nothing is sent until a
    /// token is handed in.
    pub fn with_driver(cfg: Config, sock: D) -> Result<Client<D>, Error> {
        let now = Instant::now();
        let mut c = Client {
            instance: loop {
                let v = random_u64();
                if v != 0 {
                    break v;
                }
            },
            next_seq: 1,
            held: None,
            // Room for the largest area (5 x 5 cells) and the groups of
            // the one before it, so moving does not allocate either.
            memberships: Vec::with_capacity(2 * 25),
            cell: None,
            sending: None,
            break_by: None,
            move_pending: false,
            moving: false,
            move_followed: None,
            move_follow_wait: Duration::from_secs(1),
            left: false,
            fetching: None,
            wake: Default::default(),
            fetch_not_before: None,
            renew_not_before: None,
            token_needed_said: false,
            events: VecDeque::with_capacity(64),
            inbox: Inbox::new(cfg.inbox),
            streams: Streams::new(cfg.max_senders, cfg.sender_silent_after),
            sealing: Sealing::new(cfg.max_senders),
            stats: Stats::default(),
            rx: vec![0u8; MAX_DATAGRAM].into_boxed_slice(),
            tx: Box::new([0u8; MAX_DATAGRAM_KERNEL]),
            ck_nonce: None,
            ck_upload: None,
            ck_fetch: None,
            ck_fetch_other: None,
            ck_events: VecDeque::new(),
            next_membership_id: 1,
            memlog: None,
            hold_when_full: false,
            inbox_held: false,
            sock,
            cfg,
        };
        match c.cfg.token.clone() {
            TokenSource::Given(t) => c.take_token(t, now)?,
            TokenSource::Later => {}
            TokenSource::Control(_) => c.request_token(now),
        }
        Ok(c)
    }

    /// This process's client instance id (random, never 0).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The local address of the socket.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            streams: self.streams.counters,
            ..self.stats
        }
    }

    /// Senders tracked now (heard and not yet silent).
    pub fn senders(&self) -> usize {
        self.streams.tracked()
    }

    /// Whether [`Client::send`] has a group to send to now: a member of
    /// the player's cell (during a move, of the cell it is leaving until
    /// the new one's JOIN_ACK).
    pub fn is_member(&self) -> bool {
        self.sending_index().is_some()
    }

    /// The group of the player's cell (joined or being joined).
    pub fn group(&self) -> Option<u16> {
        self.cell.map(|(_, g)| g)
    }

    /// The group [`Client::send`] goes to now (`None` while it has none):
    /// the cell's, or during a move the previous cell's until the new
    /// one's JOIN_ACK ([`Event::Moved`]).
    pub fn sending_group(&self) -> Option<u16> {
        self.sending_index()
            .map(|i| self.memberships[i].session.request().group)
    }

    /// The groups this client is a member of now (the cell's and, with
    /// [`Config::area_radius`], those around it), in no particular order.
    pub fn member_groups(&self) -> impl Iterator<Item = u16> + '_ {
        self.memberships
            .iter()
            .filter(|m| m.live() && m.session.is_member())
            .map(|m| m.session.request().group)
    }

    /// The largest payload [`Client::send`] takes now: 1,440 bytes, 1,432
    /// where the group carries instance ids, 1,400 in a sealed group
    /// ([`MAX_PAYLOAD_SEALED`]); `None` before the first join.
    pub fn max_payload(&self) -> Option<usize> {
        let m = &self.memberships[self.sending_index()?];
        Some(if m.sealing != GroupSealing::Clear {
            MAX_PAYLOAD_SEALED
        } else if m.instance_flag {
            MAX_PAYLOAD_WITH_INSTANCE
        } else {
            MAX_PAYLOAD
        })
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next checkpoint event, if any.
    pub fn poll_checkpoint(&mut self) -> Option<CheckpointEvent> {
        self.ck_events.pop_front()
    }

    /// Where the checkpoint channel of the group [`Client::send`] goes to
    /// is: `None` before JOIN_ACK, or when the group has none.
    pub fn checkpoint_addr(&self) -> Option<SocketAddr> {
        self.checkpoint_addr_of(self.sending_index()?)
    }

    fn checkpoint_addr_of(&self, i: usize) -> Option<SocketAddr> {
        let m = &self.memberships[i];
        if !m.session.is_member() || m.checkpoint_port == 0 {
            return None;
        }
        Some(
            self.cfg
                .checkpoint_addr
                .unwrap_or_else(|| SocketAddr::new(m.reflector.ip(), m.checkpoint_port)),
        )
    }

    /// Answers the pending [`CheckpointEvent::Requested`] with `state`, the
    /// game's snapshot at its `tick`: starts the upload (connect, no
    /// waiting) to the group that asked, which later [`Client::update`]s
    /// carry on; the outcome is
    /// [`CheckpointEvent::Uploaded`] or [`CheckpointEvent::Failed`]. The
    /// request's nonce is used by this call whatever the outcome. Errors
    /// (nothing started): [`CheckpointError::NotRequested`] with no request
    /// pending, [`CheckpointError::InFlight`] while an upload is under way
    /// (its request is kept: provide again once it ended),
    /// [`CheckpointError::NotMember`], or the connect's own failure.
    pub fn provide_checkpoint(&mut self, tick: u64, state: Vec<u8>) -> Result<(), CheckpointError> {
        if self.ck_upload.is_some() {
            return Err(CheckpointError::InFlight(CheckpointOp::Upload));
        }
        let (key, nonce) = self.ck_nonce.ok_or(CheckpointError::NotRequested)?;
        let i = self.find(key).ok_or(CheckpointError::NotMember)?;
        let (who, addr) = self.channel(i)?;
        // In a sealed group the envelope goes up, never the state in clear
        // (sealed_checkpoint.rs); refused without a key or certificate,
        // the request kept.
        let (state, overhead) = if self.memberships[i].sealing == GroupSealing::Clear {
            (state, 0)
        } else {
            (self.seal_upload(i, addr, tick, &state)?, sealed_checkpoint::OVERHEAD)
        };
        self.ck_nonce = None;
        let deadline = Instant::now() + self.cfg.checkpoint_timeout;
        self.ck_upload = Some(Transfer::upload(addr, who, nonce, tick, state, overhead, deadline)?);
        Ok(())
    }

    /// Fetches the latest checkpoint of the group [`Client::send`] goes to
    /// now (a member that lost DATA
    /// and wants to resync; joins fetch by themselves, see
    /// [`Config::checkpoint_fetch_on_join`]). The outcome is a
    /// [`CheckpointEvent`]: `Checkpoint`, `Empty` or `Failed`. The reflector
    /// allows one fetch per member per `--checkpoint-fetch-every`; sooner
    /// ones are refused (`Busy`).
    pub fn fetch_checkpoint(&mut self) -> Result<(), CheckpointError> {
        let i = self.sending_index().ok_or(CheckpointError::NotMember)?;
        self.start_fetch(i, CheckpointOp::Fetch, Instant::now())
    }

    /// Fetches the other checkpoint of the two the reflector keeps for the
    /// group [`Client::send`] goes to (FETCH_OTHER: the one before the
    /// latest, uploaded by another member when the reflector has one), so
    /// a joiner can compare two members' snapshots. It runs beside a
    /// [`Client::fetch_checkpoint`] (one of each at a time). The outcome is
    /// a [`CheckpointEvent`] whose `op` is [`CheckpointOp::FetchOther`]:
    /// `Checkpoint`, `Empty` (fewer than two stored) or `Failed`. The
    /// reflector allows one per member per `--checkpoint-fetch-every`,
    /// apart from the FETCHes.
    pub fn fetch_checkpoint_other(&mut self) -> Result<(), CheckpointError> {
        let i = self.sending_index().ok_or(CheckpointError::NotMember)?;
        self.start_fetch(i, CheckpointOp::FetchOther, Instant::now())
    }

    /// Changes the checkpoint settings of a running client
    /// ([`Config::checkpoint_fetch_on_join`], [`Config::checkpoint_timeout`],
    /// [`Config::checkpoint_max_bytes`]); an exchange already under way
    /// keeps its deadline and bound. Before the first [`Client::update`],
    /// the first join sees the new `fetch_on_join`.
    pub fn set_checkpoint_config(&mut self, fetch_on_join: bool, timeout: Duration, max_bytes: u64) {
        self.cfg.checkpoint_fetch_on_join = fetch_on_join;
        self.cfg.checkpoint_timeout = timeout;
        self.cfg.checkpoint_max_bytes = max_bytes;
    }

    /// The checkpoint settings now: fetch on join, the timeout, the bound.
    pub fn checkpoint_config(&self) -> (bool, Duration, u64) {
        (
            self.cfg.checkpoint_fetch_on_join,
            self.cfg.checkpoint_timeout,
            self.cfg.checkpoint_max_bytes,
        )
    }

    /// The next received DATA, if any.
    pub fn recv(&mut self) -> Option<Datagram<'_>> {
        let s = self.inbox.pop()?;
        Some(Datagram {
            group: s.group,
            sender: s.sender,
            instance: s.instance,
            seq: s.seq,
            payload: &s.buf[..s.len],
        })
    }

    /// Sends `payload` to the player's cell's group
    /// ([`Client::sending_group`]; never to the other groups of its area);
    /// returns the sequence number
    /// it took. Refused above [`Client::max_payload`]: the in-kernel
    /// fan-out replicates only one-frame datagrams, and a larger one would
    /// be fragmented to every member.
    pub fn send(&mut self, payload: &[u8]) -> Result<u64, SendError> {
        self.try_send(payload).map_err(|e| match e {
            TrySendError::Refused(e) => e,
            TrySendError::Io(e) => SendError::Io(e.to_string()),
        })
    }

    /// [`Client::send`], with a socket's failure as the `io::Error` itself,
    /// so a caller can tell a full socket buffer (`ErrorKind::WouldBlock`:
    /// send again later) from a real failure by its kind.
    pub fn try_send(&mut self, payload: &[u8]) -> Result<u64, TrySendError> {
        let max = self.max_payload().ok_or(SendError::NotMember)?;
        if payload.len() > max {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max,
            }
            .into());
        }
        let i = self.sending_index().ok_or(SendError::NotMember)?;
        match self.memberships[i].sealing {
            GroupSealing::Clear => {}
            GroupSealing::Sealed => return self.send_sealed(i, payload),
            GroupSealing::Misconfigured(flags) => {
                let group = self.memberships[i].key().1;
                return Err(SendError::SealedWithoutInstance { group, flags }.into());
            }
        }
        let m = &mut self.memberships[i];
        let mut at = DATA_PAYLOAD;
        if m.instance_flag {
            self.tx[at..at + INSTANCE_LEN].copy_from_slice(&self.instance.to_be_bytes());
            at += INSTANCE_LEN;
        }
        self.tx[at..at + payload.len()].copy_from_slice(payload);
        let body = at - DATA_PAYLOAD + payload.len();
        m.session.advance_seq(self.next_seq);
        let seq = m.session.next_seq();
        let n = match m.session.emit_data(body, &mut self.tx[..]) {
            Some(Ok(n)) => n,
            // The buffer holds the largest DATA allowed, checked above.
            Some(Err(e)) => return Err(SendError::Io(e.to_string()).into()),
            None => return Err(SendError::NotMember.into()),
        };
        self.next_seq = m.session.next_seq();
        self.sock
            .send_to(&self.tx[..n], m.reflector)
            .map_err(TrySendError::Io)?;
        self.stats.data_sent += 1;
        self.stats.bytes_sent += payload.len() as u64;
        Ok(seq)
    }

    /// [`Client::try_send`] in a sealed group: the game data sealed under
    /// our sender key of the group's cell and newest started epoch (see
    /// sealing.rs), the nonce the client-wide counter, then tagged. Without
    /// a key nothing is sent.
    fn send_sealed(&mut self, i: usize, payload: &[u8]) -> Result<u64, TrySendError> {
        let m = &mut self.memberships[i];
        let group = m.key();
        let req = m.session.request();
        let (player, tag_keys) = (req.player, req.keys);
        let (Some(ack), Some(membership)) = (m.session.ack(), m.session.membership()) else {
            return Err(SendError::NotMember.into());
        };
        let key = self
            .sealing
            .sending_key(group, reflector_proto::unix_now_ms(), player, self.instance)
            .ok_or(SendError::NoSealingKey { group: group.1 })?;
        m.session.advance_seq(self.next_seq);
        let seq = m.session.next_seq();
        let h = Header {
            kind: Kind::Data,
            group: group.1,
            sender: player,
            membership,
            seq,
        };
        let start = sealed_fmt::field::CIPHERTEXT;
        self.tx[start..start + payload.len()].copy_from_slice(payload);
        let n = key
            .seal(&h, payload.len(), ack.tags().then_some(&tag_keys), &mut self.tx[..])
            .map_err(|e| SendError::Io(e.to_string()))?;
        // The number is taken whether or not the socket takes the datagram:
        // a nonce is never used twice.
        m.session.advance_seq(seq + 1);
        self.next_seq = m.session.next_seq();
        self.sock
            .send_to(&self.tx[..n], m.reflector)
            .map_err(TrySendError::Io)?;
        self.stats.data_sent += 1;
        self.stats.bytes_sent += payload.len() as u64;
        Ok(seq)
    }

    /// Hands in sealing epoch keys for `group` (a game that gets its tokens
    /// some other way than from the control server's `/join`, which brings
    /// them in [`Token::keys`]): held beside those the client has, each
    /// until [`reflector_proto::sealed::OVERLAP_S`] after its epoch ends.
    /// The first cell's key is the one the client seals under (put the
    /// player's cell first, as [`cell_keys`] does). Refused when no group
    /// `group` is held.
    pub fn set_epoch_keys(&mut self, group: u16, keys: &[CellKey]) -> Result<(), Error> {
        let groups: Vec<GroupKey> = self
            .memberships
            .iter()
            .filter(|m| m.live() && m.key().1 == group)
            .map(Membership::key)
            .collect();
        if groups.is_empty() {
            return Err(Error::NoSuchGroup { group });
        }
        for g in groups {
            self.sealing.add(g, keys, true);
        }
        Ok(())
    }

    /// Hands in a new token (for a game whose backend fetches them): it
    /// renews the membership if it is for the same group, else the client
    /// joins there (leaving the old group first; see
    /// [`Client::set_area_tokens`] for a move make-before-break).
    pub fn set_token(&mut self, token: Token) -> Result<(), Error> {
        self.take_token(token, Instant::now())
    }

    /// Hands in the tokens of an area (for a game whose backend fetches
    /// them, `GET /join?...&area=R`): the groups held that are still in
    /// it are renewed, the new ones joined, and the others left once the
    /// new ones are members (make-before-break; see the crate docs).
    pub fn set_area_tokens(&mut self, area: AreaTokens) -> Result<(), Error> {
        self.take_area(area, Instant::now())
    }

    /// The player moved to `position` (world units, as
    /// [`ControlServer::position`]): the client asks the control server
    /// for the area there in one request (at once, or when the request in
    /// flight ends), joins the groups it does not hold yet, switches
    /// [`Client::send`] to the new cell at its JOIN_ACK ([`Event::Moved`])
    /// and only then leaves the groups out of the new area
    /// ([`Event::LeftGroup`]). Each call is a request (one unit of the
    /// ticket's rate limit): call it when the player crosses into another
    /// cell, not every frame. False (nothing done) when the game hands
    /// tokens in (it asks for the area itself, [`Client::set_area_tokens`])
    /// or after [`Client::leave`].
    pub fn set_position(&mut self, position: (f64, f64)) -> bool {
        let TokenSource::Control(c) = &mut self.cfg.token else {
            return false;
        };
        if self.left {
            return false;
        }
        c.position = position;
        self.move_pending = true;
        self.request_token(Instant::now());
        true
    }

    /// Moves to a new local port (same address), as a NAT rebinding or a
    /// network change would: the reflector follows once the next datagram
    /// from there has answered its PROBE, with nothing else done.
    pub fn rebind(&mut self) -> Result<SocketAddr, Error> {
        self.sock.rebind().map_err(|e| Error::socket("rebind", e))
    }

    /// Leaves every group (one LEAVE each, not retried: the reflector
    /// expires a silent member anyway) and stops.
    pub fn leave(&mut self) {
        let mut any = false;
        for i in 0..self.memberships.len() {
            let m = &mut self.memberships[i];
            if !m.live() {
                continue;
            }
            any = true;
            if let Some(t) = m.session.leave() {
                let _ = self.sock.send_to(t.datagram.as_bytes(), t.to);
            }
            self.log_membership(i, MembershipChange::Left);
        }
        self.memberships.clear();
        self.cell = None;
        self.sending = None;
        if any {
            self.events.push_back(Event::Left);
        }
        // Exchanges under way end with the membership (their sockets close).
        self.ck_upload = None;
        self.ck_fetch = None;
        self.ck_fetch_other = None;
        self.ck_nonce = None;
        self.left = true;
    }

    /// Does all I/O due at `now`: receives everything waiting (answering
    /// PROBEs at once), sends keepalives (ECHOs), retries joins, renews,
    /// rejoins, carries a move on, and reports silent senders. When the
    /// next one is due: [`Client::next_update`].
    pub fn update(&mut self, now: Instant) {
        if self.left {
            return;
        }
        self.poll_fetch(now);
        self.poll_keys(now);
        self.receive(now);
        self.timers(now);
        self.sealing_timers(now);
        self.settle_move(now);
        self.checkpoints(now);
        while let Some((player, instance)) = self.streams.poll_silent(now) {
            self.events.push_back(Event::SenderSilent { player, instance });
        }
    }

    /// The live membership of `key`.
    fn find(&self, key: GroupKey) -> Option<usize> {
        self.memberships.iter().position(|m| m.live() && m.key() == key)
    }

    fn sending_index(&self) -> Option<usize> {
        self.find(self.sending?)
            .filter(|&i| self.memberships[i].session.is_member())
    }

    fn receive(&mut self, now: Instant) {
        self.inbox_held = false;
        // Bounded, so a flood cannot keep the game loop here.
        for _ in 0..4096 {
            if self.hold_when_full && self.inbox.len == self.inbox.slots.len() {
                self.inbox_held = true;
                return;
            }
            let (n, src) = match self.sock.recv_from(&mut self.rx) {
                Ok(r) => r,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // ICMP errors of earlier sends and the like: the timers retry.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) => {
                    self.events.push_back(Event::Error(Error::socket("recvfrom", e)));
                    return;
                }
            };
            self.datagram(n, src, now);
        }
    }

    fn datagram(&mut self, n: usize, src: SocketAddr, now: Instant) {
        if self.memberships.is_empty() {
            self.stats.ignored += 1;
            return;
        }
        let Ok(pkt) = Packet::parse(&self.rx[..n]) else {
            self.stats.ignored += 1;
            return;
        };
        let group = pkt.group();
        let key = (src, group);
        // A live membership first: a group left and joined again within
        // the linger is the new one's.
        let Some(i) = self
            .find(key)
            .or_else(|| self.memberships.iter().position(|m| m.key() == key))
        else {
            self.stats.ignored += 1;
            return;
        };
        let m = &mut self.memberships[i];
        match pkt.kind() {
            Kind::Data => {
                let lingering = m
                    .left_at
                    .is_some_and(|t| now.saturating_duration_since(t) < LEAVE_LINGER);
                if !(m.session.is_member() || lingering) {
                    self.stats.ignored += 1;
                    self.stats.data_not_member += 1;
                    return;
                }
                let (sender, seq) = (pkt.sender(), pkt.seq());
                if m.sealing != GroupSealing::Clear {
                    // Opened in place: only the game data goes on.
                    match self.sealing.receiver.receive(&mut self.rx[..n]) {
                        Ok(game) => {
                            self.stats.sealed_opened += 1;
                            let mut id = [0u8; INSTANCE_LEN];
                            id.copy_from_slice(&self.rx[sealed_fmt::field::INSTANCE]);
                            self.deliver(group, sender, u64::from_be_bytes(id), seq, game, now);
                        }
                        Err(e) => sealing::count(&mut self.stats, e),
                    }
                    return;
                }
                let mut at = DATA_PAYLOAD;
                let mut instance = 0;
                if m.instance_flag {
                    if n < at + INSTANCE_LEN {
                        self.stats.ignored += 1;
                        return;
                    }
                    let mut id = [0u8; INSTANCE_LEN];
                    id.copy_from_slice(&self.rx[at..at + INSTANCE_LEN]);
                    instance = u64::from_be_bytes(id);
                    at += INSTANCE_LEN;
                }
                self.deliver(group, sender, instance, seq, at..n, now);
            }
            _ if !m.live() => self.stats.ignored += 1,
            Kind::EchoReply => {
                let keys = m.session.request().keys;
                let ours = Some(pkt.membership()) == m.session.membership()
                    && pkt.sender() == m.session.request().player
                    && keys.verify(&pkt);
                match (m.echo, pkt.nonce()) {
                    (Some((nonce, sent)), Some(got)) if ours && nonce == got => {
                        m.echo = None;
                        m.last_heard = now;
                        self.stats.echoes_answered += 1;
                        self.rtt(now.saturating_duration_since(sent));
                    }
                    _ => self.stats.ignored += 1,
                }
            }
            _ => {
                m.session.advance_seq(self.next_seq);
                let ev = m.session.handle(now, src, &pkt);
                self.session_event(i, ev, now);
            }
        }
    }

    /// A DATA's game payload, `self.rx[payload]`, from `sender`'s
    /// `instance`: deduplicated across groups, counted, and put in the inbox.
    fn deliver(
        &mut self,
        group: u16,
        sender: u32,
        instance: u64,
        seq: u64,
        payload: std::ops::Range<usize>,
        now: Instant,
    ) {
        if payload.len() > MAX_GAME_PAYLOAD {
            self.stats.oversize += 1;
            return;
        }
        // One table for every group: a sender heard in two groups of the
        // area is one stream, its copies dropped here.
        match self.streams.accept((sender, instance), seq, now) {
            Verdict::Fresh { first } => {
                if first {
                    self.events.push_back(Event::SenderHeard {
                        player: sender,
                        instance,
                    });
                }
            }
            Verdict::Duplicate | Verdict::TooLate | Verdict::TableFull => return,
        }
        self.stats.data_received += 1;
        self.stats.bytes_received += payload.len() as u64;
        let Some(slot) = self.inbox.push() else {
            self.stats.inbox_full += 1;
            return;
        };
        slot.group = group;
        slot.sender = sender;
        slot.instance = instance;
        slot.seq = seq;
        slot.len = payload.len();
        slot.buf[..payload.len()].copy_from_slice(&self.rx[payload]);
    }

    fn rtt(&mut self, sample: Duration) {
        let s = &mut self.stats;
        s.rtt_last = Some(sample);
        s.rtt_min = Some(s.rtt_min.map_or(sample, |m| m.min(sample)));
        s.rtt_smoothed = Some(s.rtt_smoothed.map_or(sample, |r| (r * 7 + sample) / 8));
    }

    /// Sends what membership `i`'s session queued and keeps the
    /// client-wide counter.
    fn flush(&mut self, i: usize) {
        let m = &mut self.memberships[i];
        if let Some(t) = m.session.poll_transmit() {
            // A lost control datagram is resent by the session's timers.
            let _ = self.sock.send_to(t.datagram.as_bytes(), t.to);
            if t.echoes_cookie && !m.session.is_member() {
                self.log_membership(i, MembershipChange::ConfirmSent);
            }
        }
        let m = &self.memberships[i];
        self.next_seq = self.next_seq.max(m.session.next_seq());
    }

    fn session_event(&mut self, i: usize, ev: Option<SessionEvent>, now: Instant) {
        self.flush(i);
        let Some(ev) = ev else { return };
        let key = self.memberships[i].key();
        match ev {
            SessionEvent::Joined(ack) => {
                let m = &mut self.memberships[i];
                m.keepalive = Duration::from_millis(u64::from(ack.keepalive_ms.max(50)));
                m.instance_flag = ack.instance();
                m.sealing = GroupSealing::of_flags(ack.flags);
                m.checkpoint_port = ack.checkpoint_port;
                m.last_heard = now;
                m.last_keepalive = now;
                self.stats.joins += 1;
                self.log_membership(i, MembershipChange::Joined);
                let m = &self.memberships[i];
                self.events.push_back(Event::Joined {
                    group: key.1,
                    members: ack.members,
                    rejoin: m.rejoin,
                });
                // The game's state is its cell's: the neighbours' groups
                // are only heard.
                let is_cell = self.cell == Some(key);
                if is_cell && self.cfg.checkpoint_fetch_on_join && ack.checkpoint_port != 0 && self.ck_fetch.is_none() {
                    if let Err(reason) = self.start_fetch(i, CheckpointOp::Fetch, now) {
                        self.checkpoint_failed(CheckpointOp::Fetch, reason);
                    }
                }
            }
            SessionEvent::Probed => {
                self.memberships[i].last_heard = now;
                self.stats.probes_answered += 1;
            }
            SessionEvent::Renewed => {
                let m = &mut self.memberships[i];
                m.last_heard = now;
                self.stats.renewals += 1;
                self.events.push_back(Event::Renewed {
                    group: key.1,
                    expires_unix_s: m.session.expires_unix_s(),
                });
            }
            SessionEvent::MembershipLost => self.rejoin(i, RejoinReason::NotMember, now),
            SessionEvent::Failed(Failure::ExpiredToken)
            | SessionEvent::Failed(Failure::Refused(Ok(ErrorCode::BadToken))) => {
                self.log_membership(i, MembershipChange::Failed);
                // The one case where the held token is no good: a new one
                // (for the whole area, in one request).
                self.need_token(now);
            }
            SessionEvent::Failed(f) => {
                self.log_membership(i, MembershipChange::Failed);
                self.events.push_back(Event::Error(Error::JoinRefused {
                    group: key.1,
                    failure: f,
                }));
                self.memberships[i].rejoin_at = Some(now + TOKEN_RETRY);
            }
            SessionEvent::CheckpointRequested { nonce } => {
                self.memberships[i].last_heard = now;
                self.stats.checkpoints_requested += 1;
                self.ck_nonce = Some((key, nonce));
                self.ck_events.push_back(CheckpointEvent::Requested { group: key.1 });
            }
            SessionEvent::Moved(m) => self.move_asked(i, m, now),
            SessionEvent::Retransmitted => self.stats.join_retries += 1,
            SessionEvent::Restarted => {
                self.stats.join_retries += 1;
                self.log_membership(i, MembershipChange::Restarted);
            }
        }
    }

    /// Joins group `i` again with the token and key held (never asks for a
    /// new token); the other groups are not touched.
    fn rejoin(&mut self, i: usize, why: RejoinReason, now: Instant) {
        let m = &self.memberships[i];
        let req = JoinRequest {
            first_seq: self.next_seq.max(m.session.next_seq()),
            ..m.session.rejoin_request()
        };
        let (reflector, group) = (m.reflector, m.key().1);
        self.stats.rejoins += 1;
        self.events.push_back(Event::Rejoining { group, reason: why });
        self.start(Some(i), req, reflector, true, now);
    }

    /// Starts a join: in place of membership `at`, or as a new one.
    fn start(&mut self, at: Option<usize>, req: JoinRequest, reflector: SocketAddr, rejoin: bool, now: Instant) {
        let cfg = session::Config {
            retry: self.cfg.join_retry,
            give_up: None,
        };
        let req = JoinRequest {
            first_seq: req.first_seq.max(self.next_seq),
            ..req
        };
        let mut s = Session::new(req, cfg, now);
        if let Some(h) = &self.held {
            s.set_token_received(h.received_unix_ms);
        }
        let id = self.next_membership_id;
        self.next_membership_id += 1;
        let m = Membership {
            id,
            session: s,
            reflector,
            rejoin,
            keepalive: Duration::from_secs(2),
            instance_flag: false,
            sealing: GroupSealing::Clear,
            checkpoint_port: 0,
            last_keepalive: now,
            last_heard: now,
            echo: None,
            rejoin_at: None,
            // A reflector that dies while this JOIN is on its way (a move
            // to a group it served a moment before) never answers: the
            // placement is asked again as for a rejoin after a silence.
            silent_since: Some(now),
            wanted: true,
            left_at: None,
        };
        // A request was for the membership that ended: its nonce is void.
        if self.ck_nonce.is_some_and(|(k, _)| k == m.key()) {
            self.ck_nonce = None;
        }
        let i = match at {
            Some(i) => {
                // The membership it replaces ends here (a rejoin, or a
                // join after a refusal), without a LEAVE.
                self.log_membership(i, MembershipChange::Lost);
                let wanted = self.memberships[i].wanted;
                self.memberships[i] = Membership { wanted, ..m };
                i
            }
            None => {
                self.memberships.push(m);
                self.memberships.len() - 1
            }
        };
        self.log_membership(i, MembershipChange::Started);
        self.flush(i);
    }

    fn poll_fetch(&mut self, now: Instant) {
        let Some(rx) = &self.fetching else { return };
        let res = match rx.try_recv() {
            Ok(r) => r,
            Err(mpsc::TryRecvError::Empty) => return,
            Err(mpsc::TryRecvError::Disconnected) => Err(ControlError::BadAnswer("the request thread ended".into())),
        };
        self.fetching = None;
        match res {
            Ok(a) => {
                self.fetch_not_before = None;
                // Radius 0 without a move is the one-group client it
                // always was.
                let taken = if self.cfg.area_radius == 0 && !self.moving {
                    self.take_token(a.cell, now)
                } else {
                    self.take_area(a, now)
                };
                if let Err(e) = taken {
                    self.events.push_back(Event::Error(e));
                    self.fetch_not_before = Some(now + TOKEN_RETRY);
                }
            }
            Err(e) => {
                let wait = match &e {
                    ControlError::RateLimited { retry_after_s, .. } => {
                        Duration::from_secs(*retry_after_s).max(TOKEN_RETRY)
                    }
                    _ => TOKEN_RETRY,
                };
                self.fetch_not_before = Some(now + wait);
                self.events.push_back(Event::Error(Error::Control(e)));
            }
        }
    }

    /// Each timer here (and in `membership_timers`) has its deadline in
    /// [`Client::next_update`] (schedule.rs).
    fn timers(&mut self, now: Instant) {
        // No group at all, or one whose join ended: after a failed
        // request, ask again (for the whole area) once the wait is over.
        let stuck = !self.memberships.iter().any(Membership::live)
            || self
                .memberships
                .iter()
                .any(|m| m.live() && m.session.phase() == session::Phase::Done);
        if self.fetching.is_none()
            && self.fetch_not_before.is_some_and(|t| now >= t)
            && (stuck || self.moving || self.move_pending)
        {
            self.fetch_not_before = None;
            self.request_token(now);
        }
        if self.move_pending {
            self.request_token(now);
        }
        for i in 0..self.memberships.len() {
            self.membership_timers(i, now);
        }
    }

    fn membership_timers(&mut self, i: usize, now: Instant) {
        let m = &mut self.memberships[i];
        if !m.live() {
            return;
        }
        if m.rejoin_at.is_some_and(|t| now >= t) {
            m.rejoin_at = None;
            self.rejoin(i, RejoinReason::Refused, now);
            return;
        }
        if m.session.poll_timeout().is_some_and(|t| now >= t) {
            m.session.advance_seq(self.next_seq);
            let ev = m.session.handle_timeout(now);
            self.session_event(i, ev, now);
        }
        let m = &mut self.memberships[i];
        if !m.session.is_member() {
            // A group being left (out of the area) is not placed anew.
            if m.wanted
                && m.silent_since
                    .is_some_and(|t| now >= t + m.keepalive * REPLACE_INTERVALS)
            {
                // Asked again only after as long once more if the answer
                // keeps the cell there (the registry may not have noticed).
                m.silent_since = Some(now);
                self.replace_silent(now);
            }
            return;
        }
        m.silent_since = None;
        let interval = m.keepalive;
        if now.saturating_duration_since(m.last_heard) >= interval * SILENT_INTERVALS {
            self.rejoin(i, RejoinReason::ReflectorSilent, now);
            // The group's interval goes on counting until a JOIN_ACK says.
            let m = &mut self.memberships[i];
            m.silent_since = Some(now);
            m.keepalive = interval;
            return;
        }
        if now.saturating_duration_since(m.last_keepalive) >= interval {
            m.last_keepalive = now;
            self.send_echo(i, now);
        }
        self.renew_if_due(i, now);
    }

    /// The keepalive: an ECHO, a sign of life like KEEPALIVE that the
    /// reflector also answers, so each interval times the round trip.
    fn send_echo(&mut self, i: usize, now: Instant) {
        let m = &mut self.memberships[i];
        let nonce = random_u64();
        m.session.advance_seq(self.next_seq);
        let Some(echo) = m.session.echo(nonce) else { return };
        self.next_seq = m.session.next_seq();
        if self.sock.send_to(echo.datagram.as_bytes(), m.reflector).is_ok() {
            m.echo = Some((nonce, now));
            self.stats.echoes_sent += 1;
        }
    }
}

impl<D: Driver> Drop for Client<D> {
    /// A client dropped leaves, so its group stops fanning out to it now
    /// rather than at the reflector's member timeout.
    fn drop(&mut self) {
        self.leave_quietly();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::protocol::{SmallDatagram, TOKEN_LEN};

    /// A network in memory: what the client sent, and what it will receive.
    #[derive(Default)]
    struct Mem {
        sent: Vec<(Vec<u8>, SocketAddr)>,
        inbox: VecDeque<(Vec<u8>, SocketAddr)>,
    }

    impl Driver for Mem {
        fn send_to(&mut self, d: &[u8], to: SocketAddr) -> io::Result<usize> {
            self.sent.push((d.to_vec(), to));
            Ok(d.len())
        }
        fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
            let (d, from) = self.inbox.pop_front().ok_or(io::ErrorKind::WouldBlock)?;
            buf[..d.len()].copy_from_slice(&d);
            Ok((d.len(), from))
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 5555)))
        }
        fn rebind(&mut self) -> io::Result<SocketAddr> {
            self.local_addr()
        }
    }

    fn given() -> Config {
        Config::new(TokenSource::Given(Token {
            reflector: "127.0.0.1:4000".into(),
            group: 4000,
            player: 7,
            token: [1; TOKEN_LEN],
            session_key: [2; 32],
            expires_unix_s: reflector_proto::unix_now_ms() / 1000 + 300,
            keys: Vec::new(),
        }))
    }

    #[test]
    fn a_given_token_is_joined_at_once_and_errors_while_joining_change_nothing() {
        let mut c = Client::with_driver(given(), Mem::default()).unwrap();
        let reflector = SocketAddr::from(([127, 0, 0, 1], 4000));
        let (join, to) = c.sock.sent.pop().expect("a JOIN");
        let p = Packet::parse(&join[..]).unwrap();
        assert_eq!((p.kind(), p.seq(), to, join.len()), (Kind::Join, 1, reflector, 72));
        assert_eq!(c.send(b"x"), Err(SendError::NotMember));
        assert_eq!(c.max_payload(), None);
        // A NotMember while joining answers nothing of ours; a datagram
        // from elsewhere is ignored.
        let e = SmallDatagram::error(4000, 7, 0, ErrorCode::NotMember);
        c.sock.inbox.push_back((e.as_bytes().to_vec(), reflector));
        c.sock
            .inbox
            .push_back((e.as_bytes().to_vec(), SocketAddr::from(([127, 0, 0, 1], 4001))));
        c.update(Instant::now());
        assert_eq!(c.poll_event(), None);
        assert_eq!(c.stats().ignored, 1);
        assert_eq!(c.stats().rejoins, 0);
        assert!(c.instance() != 0);
    }

    #[test]
    fn the_groups_of_an_area_share_one_sequence_counter() {
        let mut c = Client::with_driver(given(), Mem::default()).unwrap();
        let TokenSource::Given(cell) = c.cfg.token.clone() else {
            unreachable!("a given token")
        };
        let neighbour = Token {
            reflector: "127.0.0.1:4001".into(),
            group: 4001,
            ..cell.clone()
        };
        c.set_area_tokens(AreaTokens {
            cell,
            area: vec![neighbour],
        })
        .unwrap();
        // Both joins go on retrying, each group under its own key.
        let t0 = Instant::now();
        for step in 1..=4 {
            c.update(t0 + c.cfg.join_retry * step);
        }
        let sent: Vec<(u16, u64)> = c
            .sock
            .sent
            .iter()
            .map(|(d, _)| Packet::parse(&d[..]).map(|p| (p.group(), p.seq())).unwrap())
            .collect();
        assert!(sent.iter().any(|&(g, _)| g == 4000) && sent.iter().any(|&(g, _)| g == 4001));
        assert!(
            sent.windows(2).all(|w| w[0].1 < w[1].1),
            "one counter across groups, never a number twice: {sent:?}"
        );
        assert_eq!(c.group(), Some(4000));
        assert_eq!(c.sending_group(), None, "nothing to send to before a JOIN_ACK");
    }

    #[test]
    fn error_retry_waits_the_protocols_second_before_joining_again() {
        let mut c = Client::with_driver(given(), Mem::default()).unwrap();
        let reflector = SocketAddr::from(([127, 0, 0, 1], 4000));
        let t0 = Instant::now();
        c.sock.sent.clear();
        let e = SmallDatagram::error(4000, 7, 0, ErrorCode::Retry);
        c.sock.inbox.push_back((e.as_bytes().to_vec(), reflector));
        c.update(t0);
        // Not even the join's own 250 ms retry goes out during the wait.
        c.update(t0 + session::RETRY_AFTER - Duration::from_millis(1));
        assert!(c.sock.sent.is_empty(), "nothing sent while waiting");
        c.update(t0 + session::RETRY_AFTER);
        let (join, _) = c.sock.sent.pop().expect("the JOIN again");
        let p = Packet::parse(&join[..]).unwrap();
        assert_eq!((p.kind(), p.join_cookie()), (Kind::Join, None));
        assert!(p.seq() > 1, "numbers go on");
        assert_eq!(c.poll_event(), None);
    }
}
