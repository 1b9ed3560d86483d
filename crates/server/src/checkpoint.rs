//! Game-state checkpoints (paper 000 §3: "the multicast reflector
//! periodically checkpoints the current game state by requesting it from a
//! client"), served to joiners and to members that lost datagrams.
//!
//! Two halves share a [`Board`]:
//! - the event loops (they own the groups): every `every_ms` they send one
//!   member of each group a CHECKPOINT_REQUEST with a fresh nonce (the
//!   member with the lowest RTT the reflector measured itself, members that
//!   left earlier requests unanswered last), and they keep the board's
//!   roster of each group's members and keys current;
//! - the checkpoint channel ([`Channel`]), version 2 of
//!   `reflector_proto::checkpoint`: a TCP listener on the port JOIN_ACK
//!   announces, one exchange per connection.
//!
//! The channel has two stages. The *lobby* (the listener's own thread,
//! non-blocking, one `poll` over every connection) sends each connection a
//! HELLO with a fresh challenge and reads at most the 64-byte REQUEST into
//! a fixed buffer; it checks the request in the protocol's order (magic,
//! version, message, op, reserved zeros, group served here, member, request
//! MAC) and refuses with an unauthenticated REFUSED what fails. Nothing
//! else is read or allocated for a connection before its request MAC
//! verifies. A connection that has not sent its REQUEST within the hello
//! deadline is closed; when the connection caps are reached, the oldest
//! unauthenticated connection is evicted for the new one, and a new one is
//! refused only when every connection held is authenticated.
//!
//! An authenticated request gets a *worker* thread: for UPLOAD the pending
//! nonce, the body length (the size bound and the memory bound, reserved
//! before CONTINUE), then the body is streamed into a buffer of exactly
//! that length while its MAC is computed, and hashed once when stored. A
//! group keeps its latest two uploads (from different members when it
//! can): FETCH gets the latest, FETCH_OTHER the one before. Every REPLY
//! after the request MAC verified is MAC'd under the member's key.
//!
//! The stored state is the upload's own receive buffer (a `Bytes`, never
//! copied), sent after the REPLY in one gathered write through `sendpath`'s
//! stream sender: MSG_ZEROCOPY where the kernel does not copy anyway. Every
//! local peer (loopback, veth) copies on delivery, so there the first
//! completion comes back COPIED and the channel sends copies from then on,
//! said once.
//!
//! Bounds: the state's size (`max_bytes`), stored states plus bodies being
//! received (`memory`), connections at once overall and per source address,
//! the hello deadline, one fetch of each kind per member per
//! `fetch_every_ms`, and a deadline on the whole exchange. On shutdown the
//! lobby shuts every connection down, so blocked workers return at once.

use crate::liveness::Watch;
use crate::membership::Member;
pub use crate::metrics::ChannelCounters;
use crate::metrics::{GroupCounters, Registry};
use bytes::Bytes;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use reflector_proto::checkpoint::{
    digest, Answer, BodyMac, DecodeError, Hello, Op, Refusal, Reply, Request, Stored as StoredInfo, BODY_MAC_LEN,
    DIGEST_LEN, REQUEST_LEN,
};
use reflector_proto::protocol::SessionKeys;
use sendpath::stream::{Piece, StreamSender};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the reflector takes and serves checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// TCP port of the channel (0: the kernel picks one; announced in JOIN_ACK).
    pub port: u16,
    /// A CHECKPOINT_REQUEST per group this often.
    pub every_ms: u64,
    /// Largest state stored, bytes.
    pub max_bytes: u64,
    /// Deadline of one whole exchange.
    pub timeout: Duration,
    /// How long a connection may take to send its REQUEST (the HELLO says so).
    pub hello_timeout: Duration,
    /// Stored states plus bodies being received, bytes, over all groups.
    pub memory: u64,
    /// Connections served at once, overall and per source address.
    pub max_conns: usize,
    pub max_conns_per_ip: usize,
    /// One fetch of each kind per member per this many milliseconds.
    pub fetch_every_ms: u64,
    /// Send the state with MSG_ZEROCOPY (when it pays: see the module doc).
    pub zero_copy: bool,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            port: 0,
            every_ms: 5_000,
            max_bytes: 16 << 20,
            timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(2),
            memory: 256 << 20,
            max_conns: 64,
            max_conns_per_ip: 8,
            fetch_every_ms: 500,
            zero_copy: true,
        }
    }
}

/// Zero-copy sends below this size cost more than the copy (the send
/// path's measured threshold).
const ZC_THRESHOLD: usize = sendpath::zerocopy::DEFAULT_THRESHOLD;
/// Bytes one connection may have pinned at once.
const ZC_MAX_PINNED: usize = 8 << 20;
/// How often the lobby looks at the stop flag when nothing happens.
const LOBBY_TICK: Duration = Duration::from_millis(100);
/// Connections accepted per lobby round (then the others get their turn).
const ACCEPTS_PER_ROUND: usize = 64;
/// How long a worker waits for zero-copy completions between looks at the
/// stop flag.
const DRAIN_SLICE: Duration = Duration::from_millis(100);

/// Bytes counted against `--checkpoint-memory` while this lives: a body
/// being received, then the stored state (and every fetch that still sends
/// it).
#[derive(Debug)]
struct Charge {
    bytes: u64,
    counters: Arc<ChannelCounters>,
}

impl Charge {
    /// Reserves `bytes` if the total stays within `limit`.
    fn reserve(counters: &Arc<ChannelCounters>, limit: u64, bytes: u64) -> Option<Charge> {
        counters
            .memory_bytes
            .fetch_update(Relaxed, Relaxed, |held| {
                held.checked_add(bytes).filter(|&total| total <= limit)
            })
            .ok()?;
        Some(Charge {
            bytes,
            counters: Arc::clone(counters),
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.counters.memory_bytes.fetch_sub(self.bytes, Relaxed);
    }
}

/// A stored state and its charge: freed (and uncounted) when the group
/// has dropped it and the last fetch sending it is done.
#[derive(Debug)]
struct Held {
    bytes: Bytes,
    _charge: Charge,
}

/// A shared handle to a stored state, as the stream sender holds it.
#[derive(Debug, Clone)]
struct StateRef(Arc<Held>);

impl AsRef<[u8]> for StateRef {
    fn as_ref(&self) -> &[u8] {
        &self.0.bytes
    }
}

/// One stored upload.
#[derive(Debug, Clone)]
struct Kept {
    info: StoredInfo,
    at: Instant,
    state: StateRef,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    who: (u32, u32),
    nonce: u64,
}

/// What [`Board::requested`] changed, to put back with
/// [`Board::withdraw`] if the request could not be sent.
#[derive(Debug, Clone, Copy)]
pub struct Asked {
    nonce: u64,
    dropped: Option<Pending>,
    last_request_ms: Option<u64>,
}

impl GroupBoard {
    /// A request goes to `who`: the older of the two outstanding ones drops
    /// out (returned), a miss for its member if it was not answered.
    fn asked(&mut self, who: (u32, u32), nonce: u64) -> Option<Pending> {
        let dropped = self.pending[1].take();
        if let Some(p) = dropped {
            *self.misses.entry(p.who).or_insert(0) += 1;
        }
        self.pending[1] = self.pending[0].take();
        self.pending[0] = Some(Pending { who, nonce });
        dropped
    }

    /// Undoes `asked` (the request was never sent), unless an upload
    /// already answered it.
    fn unasked(&mut self, a: &Asked) {
        if self.pending[0].is_some_and(|p| p.nonce == a.nonce) {
            self.pending[0] = self.pending[1].take();
            self.pending[1] = a.dropped;
            if let Some(p) = a.dropped {
                if let Some(m) = self.misses.get_mut(&p.who) {
                    *m = m.saturating_sub(1);
                }
            }
        }
        self.last_request_ms = a.last_request_ms;
    }
}

#[derive(Debug, Default)]
struct GroupBoard {
    /// (player, membership) -> its keys, for every current member.
    roster: HashMap<(u32, u32), SessionKeys>,
    /// The last two requests sent, newest first, each until its upload
    /// arrives: an upload on its way when the next request goes out still
    /// counts (the member could not know it had been asked again).
    pending: [Option<Pending>; 2],
    /// The latest stored upload, and the one before it (from another member
    /// than the latest when there was one).
    latest: Option<Kept>,
    other: Option<Kept>,
    seq: u64,
    last_request_ms: Option<u64>,
    /// Requests each member left unanswered in a row.
    misses: HashMap<(u32, u32), u32>,
    last_fetch: HashMap<((u32, u32), Op), Instant>,
}

impl GroupBoard {
    /// Keeps `new` as the latest; the one before becomes the other unless
    /// it came from the same player and the other did not.
    fn keep(&mut self, new: Kept) {
        let from = new.info.from_player;
        let (latest, other) = (self.latest.take(), self.other.take());
        self.other = match (latest, other) {
            (Some(l), _) if l.info.from_player != from => Some(l),
            (Some(_), Some(o)) if o.info.from_player != from => Some(o),
            (Some(l), _) => Some(l),
            (None, o) => o,
        };
        self.latest = Some(new);
    }
}

/// What the event loops and the channel share.
#[derive(Debug)]
pub struct Board {
    pub cfg: CheckpointConfig,
    groups: HashMap<u16, (Mutex<GroupBoard>, Arc<GroupCounters>)>,
    pub channel: Arc<ChannelCounters>,
    /// Set once a completion came back COPIED: later fetches send copies.
    copied: AtomicBool,
}

fn lock(m: &Mutex<GroupBoard>) -> std::sync::MutexGuard<'_, GroupBoard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request whose MAC verified, and what the lobby learnt checking it.
#[derive(Debug, Clone, Copy)]
struct Authed {
    req: Request,
    keys: SessionKeys,
    challenge: u64,
}

/// What a worker does for an authenticated request.
enum Decision {
    Reply(Answer),
    /// CONTINUE: receive `body_len` bytes, counted by this charge.
    Receive(Charge),
    Send(Kept),
}

impl Board {
    pub fn new(cfg: CheckpointConfig, registry: &Registry) -> Board {
        Board {
            cfg,
            groups: registry
                .groups
                .iter()
                .map(|(p, c)| (*p, (Mutex::new(GroupBoard::default()), Arc::clone(c))))
                .collect(),
            channel: Arc::clone(&registry.channel),
            copied: AtomicBool::new(false),
        }
    }

    /// The group's members now (after joins, leaves, expiry).
    pub fn set_roster(&self, port: u16, members: &[Member]) {
        let Some((g, _)) = self.groups.get(&port) else { return };
        let mut g = lock(g);
        g.roster.clear();
        for m in members {
            g.roster.insert((m.sender, m.membership), m.keys);
        }
        let GroupBoard {
            roster,
            misses,
            last_fetch,
            ..
        } = &mut *g;
        misses.retain(|k, _| roster.contains_key(k));
        last_fetch.retain(|(k, _), _| roster.contains_key(k));
    }

    /// If a request is due in this group, which member to ask (an index
    /// into `members`): fewest unanswered requests, then lowest RTT.
    pub fn due_source(&self, port: u16, members: &[Member], now_ms: u64) -> Option<usize> {
        let (g, _) = self.groups.get(&port)?;
        let g = lock(g);
        if members.is_empty()
            || g.last_request_ms
                .is_some_and(|t| now_ms.saturating_sub(t) < self.cfg.every_ms)
        {
            return None;
        }
        let key = |m: &Member| {
            let misses = g.misses.get(&(m.sender, m.membership)).copied().unwrap_or(0);
            (misses, m.rtt_ms.unwrap_or(f64::MAX))
        };
        (0..members.len()).min_by(|&a, &b| {
            let (ka, kb) = (key(&members[a]), key(&members[b]));
            ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
        })
    }

    /// A CHECKPOINT_REQUEST is about to go to `member` with `nonce`: it is
    /// recorded BEFORE it is sent, since the member's upload can reach the
    /// lobby (another thread) before the event loop runs again; one left
    /// unanswered before it counts against its member. Then
    /// [`Board::request_sent`], or [`Board::withdraw`] if the send failed.
    pub fn requested(&self, port: u16, member: &Member, nonce: u64, now_ms: u64) -> Option<Asked> {
        self.requested_of(port, (member.sender, member.membership), nonce, now_ms)
    }

    fn requested_of(&self, port: u16, who: (u32, u32), nonce: u64, now_ms: u64) -> Option<Asked> {
        let (g, _) = self.groups.get(&port)?;
        let mut g = lock(g);
        let dropped = g.asked(who, nonce);
        let last_request_ms = g.last_request_ms.replace(now_ms);
        Some(Asked {
            nonce,
            dropped,
            last_request_ms,
        })
    }

    /// The request recorded by `requested` went out.
    pub fn request_sent(&self, port: u16) {
        if let Some((_, c)) = self.groups.get(&port) {
            c.checkpoint_requests.fetch_add(1, Relaxed);
        }
    }

    /// The request recorded by `requested` could not be sent: as if it had
    /// not been asked (the next round asks again).
    pub fn withdraw(&self, port: u16, asked: &Asked) {
        if let Some((g, _)) = self.groups.get(&port) {
            lock(g).unasked(asked);
        }
    }

    /// The lobby's checks of a whole REQUEST, in the protocol's order:
    /// decode (magic, version, message, op, reserved zeros), group served
    /// here, member of it, request MAC. A refusal here is unauthenticated;
    /// each is counted once.
    fn authenticate(&self, bytes: &[u8; REQUEST_LEN], challenge: u64) -> Result<Authed, Refusal> {
        let req = Request::decode(bytes).map_err(|e: DecodeError| {
            self.channel.malformed.fetch_add(1, Relaxed);
            tracing::debug!("checkpoint channel: malformed request: {e}");
            Refusal::Malformed
        })?;
        let Some((g, c)) = self.groups.get(&req.group) else {
            self.channel.malformed.fetch_add(1, Relaxed);
            return Err(Refusal::NoGroup);
        };
        let keys = lock(g).roster.get(&(req.player, req.membership)).copied();
        let refused = |code| {
            c.checkpoint_refused.fetch_add(1, Relaxed);
            code
        };
        let keys = keys.ok_or_else(|| refused(Refusal::NotMember))?;
        if !req.verify(&keys, challenge) {
            return Err(refused(Refusal::BadMac));
        }
        Ok(Authed { req, keys, challenge })
    }

    fn counters(&self, group: u16) -> Option<&Arc<GroupCounters>> {
        self.groups.get(&group).map(|(_, c)| c)
    }

    /// The answer to an authenticated request, in the protocol's order: for
    /// UPLOAD the pending nonce, the size bound, the memory bound; for a
    /// fetch the rate, then what is stored. A refusal is counted here.
    fn decide(&self, a: &Authed, now: Instant) -> Decision {
        let req = &a.req;
        let Some((g, c)) = self.groups.get(&req.group) else {
            // authenticate() found the group: this cannot happen.
            return Decision::Reply(Answer::Refused(Refusal::NoGroup));
        };
        let who = (req.player, req.membership);
        let mut g = lock(g);
        let refuse = |code| {
            c.checkpoint_refused.fetch_add(1, Relaxed);
            Decision::Reply(Answer::Refused(code))
        };
        match req.op {
            Op::Upload => {
                let Some(slot) = g
                    .pending
                    .iter()
                    .position(|p| p.is_some_and(|p| p.who == who && p.nonce == req.nonce))
                else {
                    return refuse(Refusal::NotRequested);
                };
                if req.body_len > self.cfg.max_bytes {
                    return refuse(Refusal::TooLarge);
                }
                let Some(charge) = Charge::reserve(&self.channel, self.cfg.memory, req.body_len) else {
                    c.checkpoint_memory_refused.fetch_add(1, Relaxed);
                    return refuse(Refusal::Busy);
                };
                // The nonce is used once, whatever becomes of the body.
                g.pending[slot] = None;
                Decision::Receive(charge)
            }
            Op::Fetch | Op::FetchOther => {
                let every = Duration::from_millis(self.cfg.fetch_every_ms);
                let key = (who, req.op);
                if g.last_fetch.get(&key).is_some_and(|t| now.duration_since(*t) < every) {
                    return refuse(Refusal::Busy);
                }
                g.last_fetch.insert(key, now);
                let kept = if req.op == Op::Fetch { &g.latest } else { &g.other };
                match kept {
                    // A refcount, not a copy.
                    Some(k) => Decision::Send(k.clone()),
                    None => {
                        c.checkpoint_empty_fetches.fetch_add(1, Relaxed);
                        Decision::Reply(Answer::Empty)
                    }
                }
            }
        }
    }

    /// Stores an upload whose body MAC verified (`state_digest` computed
    /// outside the lock). Its number in the group.
    fn store(&self, a: &Authed, state: Bytes, state_digest: [u8; DIGEST_LEN], charge: Charge) -> StoredInfo {
        let req = &a.req;
        let who = (req.player, req.membership);
        let len = state.len() as u64;
        let held = StateRef(Arc::new(Held {
            bytes: state,
            _charge: charge,
        }));
        let Some((g, c)) = self.groups.get(&req.group) else {
            // authenticate() found the group; nothing to keep it in otherwise.
            return StoredInfo {
                number: 0,
                tick: req.tick,
                from_player: req.player,
                digest: state_digest,
            };
        };
        let mut g = lock(g);
        g.misses.remove(&who);
        g.seq += 1;
        let info = StoredInfo {
            number: g.seq,
            tick: req.tick,
            from_player: req.player,
            digest: state_digest,
        };
        g.keep(Kept {
            info,
            at: Instant::now(),
            state: held,
        });
        c.checkpoints_stored.fetch_add(1, Relaxed);
        c.checkpoint_bytes_stored.fetch_add(len, Relaxed);
        info
    }
}

/// Reads with a deadline on the whole exchange, not per read: a peer that
/// trickles a byte at a time is cut off as surely as a silent one.
struct DeadlineReader<'a> {
    s: &'a TcpStream,
    deadline: Instant,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "exchange deadline passed"));
        }
        self.s.set_read_timeout(Some(left))?;
        match (&mut &*self.s).read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                Err(io::Error::new(io::ErrorKind::TimedOut, "exchange deadline passed"))
            }
            r => r,
        }
    }
}

/// The checkpoint channel: its lobby thread and the workers it starts.
pub struct Channel {
    port: u16,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Channel {
    /// Serves `listener` (already bound, so errors surface at start-up)
    /// until `stop`, on a thread `watch` notices the end of.
    pub fn start(
        listener: TcpListener,
        board: Arc<Board>,
        stop: Arc<AtomicBool>,
        watch: &mut Watch,
    ) -> io::Result<Channel> {
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let stop2 = Arc::clone(&stop);
        let thread = watch.spawn("checkpoints", move || Lobby::new(listener, board).run(&stop2))?;
        Ok(Channel {
            port,
            thread: Some(thread),
            stop,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the channel: every connection is shut down, so this returns
    /// within about [`LOBBY_TICK`] whatever the peers do.
    pub fn join(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A connection that has not authenticated yet: a HELLO sent, at most the
/// 64 bytes of its REQUEST read.
struct Waiting {
    conn: TcpStream,
    peer: SocketAddr,
    since: Instant,
    challenge: u64,
    buf: [u8; REQUEST_LEN],
    got: usize,
}

/// The authenticated connections (each served by a worker), so the lobby
/// can count them and shut them down on stop.
#[derive(Default)]
struct Serving {
    next: u64,
    conns: HashMap<u64, (IpAddr, TcpStream)>,
}

/// Removes a worker's connection from [`Serving`] however the worker ends.
struct ServingSlot {
    serving: Arc<Mutex<Serving>>,
    id: u64,
}

impl Drop for ServingSlot {
    fn drop(&mut self) {
        lock_serving(&self.serving).conns.remove(&self.id);
    }
}

fn lock_serving(m: &Mutex<Serving>) -> std::sync::MutexGuard<'_, Serving> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Lobby {
    listener: TcpListener,
    board: Arc<Board>,
    waiting: Vec<Waiting>,
    serving: Arc<Mutex<Serving>>,
    workers: Vec<JoinHandle<()>>,
}

impl Lobby {
    fn new(listener: TcpListener, board: Arc<Board>) -> Lobby {
        Lobby {
            listener,
            board,
            waiting: Vec::new(),
            serving: Arc::default(),
            workers: Vec::new(),
        }
    }

    fn run(mut self, stop: &Arc<AtomicBool>) {
        while !stop.load(Relaxed) {
            self.workers.retain(|w| !w.is_finished());
            self.expire(Instant::now());
            let (listener_ready, ready) = self.wait();
            for i in (0..ready.len()).rev() {
                if ready[i] {
                    self.read_request(i, stop);
                }
            }
            if listener_ready {
                self.accept();
            }
        }
        // Shut every connection down: a worker blocked on a read or a
        // send returns at once.
        self.waiting.clear();
        for (_, conn) in lock_serving(&self.serving).conns.values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        for w in self.workers {
            let _ = w.join();
        }
    }

    /// Polls the listener and every waiting connection until something is
    /// readable, the next hello deadline, or [`LOBBY_TICK`].
    fn wait(&self) -> (bool, Vec<bool>) {
        let now = Instant::now();
        let hello = self.board.cfg.hello_timeout;
        let next = self
            .waiting
            .iter()
            .map(|w| (w.since + hello).saturating_duration_since(now))
            .min()
            .unwrap_or(LOBBY_TICK)
            .min(LOBBY_TICK);
        let ms = u16::try_from(next.as_millis()).unwrap_or(u16::MAX).max(1);
        let mut fds = Vec::with_capacity(self.waiting.len() + 1);
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        for w in &self.waiting {
            fds.push(PollFd::new(w.conn.as_fd(), PollFlags::POLLIN));
        }
        if poll(&mut fds, PollTimeout::from(ms)).is_err() {
            // EINTR and the like: look again next round.
            return (false, vec![false; self.waiting.len()]);
        }
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        (ready(&fds[0]), fds[1..].iter().map(ready).collect())
    }

    /// Closes the connections whose hello deadline passed.
    fn expire(&mut self, now: Instant) {
        let hello = self.board.cfg.hello_timeout;
        let before = self.waiting.len();
        self.waiting.retain(|w| now < w.since + hello);
        let closed = (before - self.waiting.len()) as u64;
        if closed > 0 {
            self.board.channel.hello_timeouts.fetch_add(closed, Relaxed);
            tracing::debug!("checkpoint channel: {closed} connection(s) sent no request within the hello deadline");
        }
    }

    /// Reads what has come of waiting connection `i`'s REQUEST, and decides
    /// it once whole.
    fn read_request(&mut self, i: usize, stop: &Arc<AtomicBool>) {
        let Some(w) = self.waiting.get_mut(i) else { return };
        match (&w.conn).read(&mut w.buf[w.got..]) {
            Ok(0) => {
                self.waiting.swap_remove(i);
                return;
            }
            Ok(n) => w.got += n,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => return,
            Err(_) => {
                self.waiting.swap_remove(i);
                return;
            }
        }
        if w.got < REQUEST_LEN {
            return;
        }
        let w = self.waiting.swap_remove(i);
        match self.board.authenticate(&w.buf, w.challenge) {
            Err(code) => {
                tracing::debug!("checkpoint channel: {}: refused: {code}", w.peer);
                let _ = (&w.conn).write_all(&Reply::unauthenticated(code).encode());
            }
            Ok(a) => self.start_worker(w, a, stop),
        }
    }

    fn start_worker(&mut self, w: Waiting, a: Authed, stop: &Arc<AtomicBool>) {
        let Ok(handle) = w.conn.try_clone() else {
            // Out of descriptors: this connection cannot be served.
            self.board.channel.busy.fetch_add(1, Relaxed);
            return;
        };
        let slot = {
            let mut s = lock_serving(&self.serving);
            s.next += 1;
            let id = s.next;
            s.conns.insert(id, (w.peer.ip(), handle));
            ServingSlot {
                serving: Arc::clone(&self.serving),
                id,
            }
        };
        let deadline = w.since + self.board.cfg.timeout;
        let (board, stop) = (Arc::clone(&self.board), Arc::clone(stop));
        let (conn, peer) = (w.conn, w.peer);
        let spawned = std::thread::Builder::new()
            .name("checkpoint-conn".into())
            .spawn(move || {
                let _slot = slot;
                serve_member(&board, &conn, peer, &a, deadline, &stop);
            });
        match spawned {
            Ok(h) => self.workers.push(h),
            Err(e) => {
                self.board.channel.busy.fetch_add(1, Relaxed);
                tracing::warn!("checkpoint channel: cannot start a connection thread: {e}");
            }
        }
    }

    /// Accepts what is waiting, making room by evicting the oldest
    /// unauthenticated connection (of the same address for the per-address
    /// cap), refusing only when every connection held is authenticated.
    fn accept(&mut self) {
        for _ in 0..ACCEPTS_PER_ROUND {
            let (conn, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // Out of descriptors and the like: say so, try next round.
                    tracing::warn!("checkpoint channel: accept: {e}");
                    return;
                }
            };
            if !self.make_room(peer.ip()) {
                self.board.channel.busy.fetch_add(1, Relaxed);
                refuse_busy(&conn);
                continue;
            }
            let Ok(challenge) = fresh_challenge() else {
                // Without the OS's randomness a challenge would be
                // guessable (a recorded exchange replayable): refuse.
                tracing::warn!("checkpoint channel: no randomness for the challenge; connection refused");
                self.board.channel.busy.fetch_add(1, Relaxed);
                refuse_busy(&conn);
                continue;
            };
            let hello = Hello {
                challenge,
                max_state: self.board.cfg.max_bytes,
                hello_deadline_ms: u32::try_from(self.board.cfg.hello_timeout.as_millis()).unwrap_or(u32::MAX),
            };
            // 32 bytes into a new connection's empty send buffer.
            let sent = conn
                .set_nonblocking(true)
                .and_then(|()| conn.set_nodelay(true))
                .and_then(|()| match (&conn).write(&hello.encode())? {
                    32 => Ok(()),
                    _ => Err(io::ErrorKind::WriteZero.into()),
                });
            if sent.is_err() {
                continue;
            }
            self.waiting.push(Waiting {
                conn,
                peer,
                since: Instant::now(),
                challenge,
                buf: [0; REQUEST_LEN],
                got: 0,
            });
        }
    }

    /// Whether a connection from `ip` fits, after evicting the oldest
    /// waiting connection where a cap is reached.
    fn make_room(&mut self, ip: IpAddr) -> bool {
        let cfg = self.board.cfg;
        let (serving_total, serving_here) = {
            let s = lock_serving(&self.serving);
            (s.conns.len(), s.conns.values().filter(|(a, _)| *a == ip).count())
        };
        let waiting_here = self.waiting.iter().filter(|w| w.peer.ip() == ip).count();
        if serving_here + waiting_here >= cfg.max_conns_per_ip && !self.evict_oldest(Some(ip)) {
            return false;
        }
        if serving_total + self.waiting.len() >= cfg.max_conns && !self.evict_oldest(None) {
            return false;
        }
        true
    }

    /// Closes the oldest waiting connection (from `ip`, if given).
    fn evict_oldest(&mut self, ip: Option<IpAddr>) -> bool {
        let oldest = self
            .waiting
            .iter()
            .enumerate()
            .filter(|(_, w)| ip.is_none_or(|ip| w.peer.ip() == ip))
            .min_by_key(|(_, w)| w.since)
            .map(|(i, _)| i);
        match oldest {
            Some(i) => {
                let w = self.waiting.swap_remove(i);
                self.board.channel.evicted.fetch_add(1, Relaxed);
                tracing::debug!(
                    "checkpoint channel: evicted {} (not authenticated) for a new connection",
                    w.peer
                );
                true
            }
            None => false,
        }
    }
}

/// A best-effort refusal (HELLO, then an unauthenticated REFUSED(Busy))
/// that never blocks the lobby.
fn refuse_busy(conn: &TcpStream) {
    let _ = conn.set_nonblocking(true);
    let hello = Hello {
        challenge: fresh_challenge().unwrap_or(0),
        max_state: 0,
        hello_deadline_ms: 0,
    };
    let mut msg = hello.encode().to_vec();
    msg.extend_from_slice(&Reply::unauthenticated(Refusal::Busy).encode());
    let _ = (&mut &*conn).write_all(&msg);
}

/// A fresh challenge from the OS's randomness.
fn fresh_challenge() -> io::Result<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| io::Error::other(format!("no randomness for the challenge: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

/// A worker: serves one authenticated request to its end.
fn serve_member(board: &Board, conn: &TcpStream, peer: SocketAddr, a: &Authed, deadline: Instant, stop: &AtomicBool) {
    let counters = board.counters(a.req.group);
    match exchange(board, conn, a, deadline, stop) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            board.channel.timeouts.fetch_add(1, Relaxed);
            if let Some(c) = counters {
                c.checkpoint_timeouts.fetch_add(1, Relaxed);
            }
            tracing::debug!("checkpoint channel: {peer}: {e}");
        }
        Err(e) => tracing::debug!("checkpoint channel: {peer}: {e}"),
    }
}

fn exchange(board: &Board, conn: &TcpStream, a: &Authed, deadline: Instant, stop: &AtomicBool) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "exchange deadline passed"));
    }
    conn.set_write_timeout(Some(left))?;
    let mut tx: StreamSender<StateRef> = StreamSender::new(
        conn.as_fd(),
        board.cfg.zero_copy && !board.copied.load(Relaxed),
        ZC_THRESHOLD,
        ZC_MAX_PINNED,
    );
    let sign = |answer| Reply::signed(answer, &a.keys, a.challenge, &a.req.mac).encode();
    let t0 = Instant::now();
    let r = match board.decide(a, t0) {
        Decision::Reply(answer) => tx.send_all(conn.as_fd(), &[Piece::Copy(&sign(answer))], deadline),
        Decision::Receive(charge) => {
            tx.send_all(conn.as_fd(), &[Piece::Copy(&sign(Answer::Continue))], deadline)?;
            let answer = match receive(conn, a, deadline)? {
                Some(state) => {
                    let d = digest(&state);
                    Answer::Stored(board.store(a, state, d, charge))
                }
                None => {
                    if let Some(c) = board.counters(a.req.group) {
                        c.checkpoint_refused.fetch_add(1, Relaxed);
                    }
                    Answer::Refused(Refusal::BadMac)
                }
            };
            tx.send_all(conn.as_fd(), &[Piece::Copy(&sign(answer))], deadline)
        }
        Decision::Send(kept) => {
            let len = kept.state.as_ref().len() as u64;
            let answer = Answer::Checkpoint {
                stored: kept.info,
                body_len: len,
                age_ms: u32::try_from(kept.at.elapsed().as_millis()).unwrap_or(u32::MAX),
            };
            let head = sign(answer);
            let r = tx
                .send_all(conn.as_fd(), &[Piece::Copy(&head), Piece::Held(&kept.state)], deadline)
                .map(|()| drain(&mut tx, conn, deadline, stop));
            if let (Ok(()), Some(c)) = (&r, board.counters(a.req.group)) {
                c.checkpoints_served.fetch_add(1, Relaxed);
                c.checkpoint_bytes_served.fetch_add(len, Relaxed);
                c.checkpoint_serve_us_sum
                    .fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
            }
            r
        }
    };
    if let Some(c) = board.counters(a.req.group) {
        c.checkpoint_zerocopy_sends.fetch_add(tx.stats.zerocopy_sends, Relaxed);
        c.checkpoint_copied_sends.fetch_add(tx.stats.copied_sends, Relaxed);
    }
    if tx.copied_seen && !board.copied.swap(true, Relaxed) {
        tracing::info!(
            "checkpoint channel: the kernel copied zero-copy sends after all (a local peer: loopback or veth \
             copy on delivery); checkpoints are sent as plain copies from now on"
        );
    }
    r
}

/// Waits for the zero-copy completions so the state is not freed while the
/// kernel may still read it, looking at the stop flag between slices (on
/// stop the connection is shut down and closing it frees what is left).
fn drain(tx: &mut StreamSender<StateRef>, conn: &TcpStream, deadline: Instant, stop: &AtomicBool) {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if tx.drain(conn.as_fd(), left.min(DRAIN_SLICE)) || left.is_zero() || stop.load(Relaxed) {
            return;
        }
    }
}

/// Receives an upload's body (exactly `body_len` bytes, into a buffer of
/// that size, the MAC computed as it arrives) and its body MAC. The state
/// if the MAC verifies, `None` if not.
fn receive(conn: &TcpStream, a: &Authed, deadline: Instant) -> io::Result<Option<Bytes>> {
    // body_len <= max_bytes and reserved against the memory bound.
    let len = usize::try_from(a.req.body_len).map_err(|_| io::Error::other("body length over the address space"))?;
    // Zeroed pages are mapped lazily: memory grows as the body arrives.
    let mut body = vec![0u8; len];
    let mut mac = BodyMac::new(&a.keys, a.challenge, &a.req.mac);
    let mut rd = DeadlineReader { s: conn, deadline };
    let mut off = 0;
    while off < len {
        match rd.read(&mut body[off..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                mac.update(&body[off..off + n]);
                off += n;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut tag = [0u8; BODY_MAC_LEN];
    rd.read_exact(&mut tag)?;
    Ok(mac.verify(&tag).then(|| Bytes::from(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(number: u64, from_player: u32, counters: &Arc<ChannelCounters>) -> Kept {
        let state = Bytes::from(vec![number as u8; 10]);
        Kept {
            info: StoredInfo {
                number,
                tick: number * 100,
                from_player,
                digest: digest(&state),
            },
            at: Instant::now(),
            state: StateRef(Arc::new(Held {
                bytes: state,
                _charge: Charge::reserve(counters, u64::MAX, 10).unwrap(),
            })),
        }
    }

    fn numbers(g: &GroupBoard) -> (Option<u64>, Option<u64>) {
        (
            g.latest.as_ref().map(|k| k.info.number),
            g.other.as_ref().map(|k| k.info.number),
        )
    }

    #[test]
    fn a_group_keeps_its_latest_two_uploads_from_different_members_when_it_can() {
        let ch = Arc::new(ChannelCounters::default());
        let mut g = GroupBoard::default();
        g.keep(kept(1, 7, &ch));
        assert_eq!(numbers(&g), (Some(1), None));
        // The same member again: the one before is all there is.
        g.keep(kept(2, 7, &ch));
        assert_eq!(numbers(&g), (Some(2), Some(1)));
        g.keep(kept(3, 8, &ch));
        assert_eq!(numbers(&g), (Some(3), Some(2)));
        // Member 8 again: member 7's upload stays the other one.
        g.keep(kept(4, 8, &ch));
        assert_eq!(numbers(&g), (Some(4), Some(2)));
        g.keep(kept(5, 9, &ch));
        assert_eq!(numbers(&g), (Some(5), Some(4)));
        // What was dropped is no longer counted.
        assert_eq!(ch.memory_bytes.load(Relaxed), 20);
        drop(g);
        assert_eq!(ch.memory_bytes.load(Relaxed), 0);
    }

    #[test]
    fn the_memory_bound_reserves_whole_bodies_and_releases_them() {
        let ch = Arc::new(ChannelCounters::default());
        let a = Charge::reserve(&ch, 100, 60).expect("fits");
        assert!(Charge::reserve(&ch, 100, 41).is_none(), "over the bound");
        let b = Charge::reserve(&ch, 100, 40).expect("exactly the bound");
        assert_eq!(ch.memory_bytes.load(Relaxed), 100);
        assert!(Charge::reserve(&ch, u64::MAX, u64::MAX).is_none(), "no overflow");
        drop(a);
        assert_eq!(ch.memory_bytes.load(Relaxed), 40);
        // A state shared with a fetch stays counted until both are done.
        let shared = StateRef(Arc::new(Held {
            bytes: Bytes::from_static(b"x"),
            _charge: b,
        }));
        let sending = shared.clone();
        drop(shared);
        assert_eq!(ch.memory_bytes.load(Relaxed), 40);
        drop(sending);
        assert_eq!(ch.memory_bytes.load(Relaxed), 0);
    }

    fn board(cfg: CheckpointConfig) -> (Board, Registry) {
        let reg = Registry::new("sendto", &[4000]);
        (Board::new(cfg, &reg), reg)
    }

    fn member_keys() -> SessionKeys {
        SessionKeys::from_session([5; 32])
    }

    const WHO: (u32, u32) = (7, 0x0102_0304);

    fn join(b: &Board) {
        let (g, _) = &b.groups[&4000];
        lock(g).roster.insert(WHO, member_keys());
    }

    fn who(keys: &SessionKeys) -> reflector_proto::checkpoint::Member<'_> {
        reflector_proto::checkpoint::Member {
            group: 4000,
            player: WHO.0,
            membership: WHO.1,
            keys,
        }
    }

    #[test]
    fn the_lobby_checks_requests_in_the_protocol_order_and_counts_each_refusal_once() {
        let (b, reg) = board(CheckpointConfig::default());
        let k = member_keys();
        let ch = 0x55;
        let good = Request::fetch(&who(&k), ch, Op::Fetch);
        // Not yet a member, even with a good MAC.
        assert_eq!(b.authenticate(&good.encode(), ch).err(), Some(Refusal::NotMember));
        join(&b);
        assert!(b.authenticate(&good.encode(), ch).is_ok());
        // Another connection's challenge, another key.
        assert_eq!(b.authenticate(&good.encode(), ch + 1).err(), Some(Refusal::BadMac));
        let other = SessionKeys::from_session([6; 32]);
        let forged = Request::fetch(&who(&other), ch, Op::Fetch);
        assert_eq!(b.authenticate(&forged.encode(), ch).err(), Some(Refusal::BadMac));
        // No such group: before membership is looked at.
        let mut elsewhere = good;
        elsewhere.group = 4001;
        let elsewhere = elsewhere.signed(&k, ch);
        assert_eq!(b.authenticate(&elsewhere.encode(), ch).err(), Some(Refusal::NoGroup));
        // Reserved bytes, unknown op, HTTP: malformed.
        let mut bytes = good.encode();
        bytes[11] = 1;
        assert_eq!(b.authenticate(&bytes, ch).err(), Some(Refusal::Malformed));
        let mut bytes = good.encode();
        bytes[6] = 9;
        assert_eq!(b.authenticate(&bytes, ch).err(), Some(Refusal::Malformed));
        let mut http = [b' '; REQUEST_LEN];
        http[..16].copy_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(b.authenticate(&http, ch).err(), Some(Refusal::Malformed));
        assert_eq!(reg.total().checkpoint_refused, 3);
        assert_eq!(reg.channel.malformed.load(Relaxed), 4);
    }

    #[test]
    fn an_upload_answering_the_request_before_the_newest_still_counts() {
        let (b, _reg) = board(CheckpointConfig::default());
        join(&b);
        let k = member_keys();
        let authed = |nonce| Authed {
            req: Request::upload(&who(&k), 1, nonce, 10, 42),
            keys: k,
            challenge: 1,
        };
        let now = Instant::now();
        for nonce in [1, 2, 3] {
            let _ = lock(&b.groups[&4000].0).asked(WHO, nonce);
        }
        // Request 1 dropped out unanswered; 2 was on its way when 3 went out.
        assert_eq!(lock(&b.groups[&4000].0).misses.get(&WHO), Some(&1));
        assert!(matches!(
            b.decide(&authed(1), now),
            Decision::Reply(Answer::Refused(Refusal::NotRequested))
        ));
        assert!(matches!(b.decide(&authed(2), now), Decision::Receive(_)));
        assert!(matches!(b.decide(&authed(3), now), Decision::Receive(_)));
        // Each nonce once.
        assert!(matches!(
            b.decide(&authed(2), now),
            Decision::Reply(Answer::Refused(Refusal::NotRequested))
        ));
    }

    #[test]
    fn a_request_that_could_not_be_sent_is_withdrawn() {
        let (b, reg) = board(CheckpointConfig::default());
        join(&b);
        let k = member_keys();
        let authed = |nonce| Authed {
            req: Request::upload(&who(&k), 1, nonce, 10, 42),
            keys: k,
            challenge: 1,
        };
        let now = Instant::now();
        for nonce in [1, 2] {
            let _ = lock(&b.groups[&4000].0).asked(WHO, nonce);
        }
        // Request 3 is recorded before its send (which fails): request 1
        // drops out meanwhile, a miss.
        let asked = b.requested_of(4000, WHO, 3, 5_000).expect("a group of the board");
        assert_eq!(lock(&b.groups[&4000].0).misses.get(&WHO), Some(&1));
        b.withdraw(4000, &asked);
        // As before it: 1 and 2 outstanding, no miss, no request time (the
        // next round asks again), nothing counted as sent.
        {
            let g = lock(&b.groups[&4000].0);
            assert_eq!(g.misses.get(&WHO), Some(&0));
            assert_eq!(g.last_request_ms, None);
        }
        assert_eq!(reg.total().checkpoint_requests, 0);
        assert!(matches!(
            b.decide(&authed(3), now),
            Decision::Reply(Answer::Refused(Refusal::NotRequested))
        ));
        assert!(matches!(b.decide(&authed(1), now), Decision::Receive(_)));
        // A request that went out is counted, and answerable at once.
        let _ = b.requested_of(4000, WHO, 4, 6_000).expect("a group of the board");
        b.request_sent(4000);
        assert_eq!(reg.total().checkpoint_requests, 1);
        assert!(matches!(b.decide(&authed(4), now), Decision::Receive(_)));
    }

    #[test]
    fn an_upload_needs_the_pending_nonce_the_size_bound_and_room_in_memory() {
        let (b, reg) = board(CheckpointConfig {
            max_bytes: 1000,
            memory: 1500,
            ..CheckpointConfig::default()
        });
        join(&b);
        let k = member_keys();
        let authed = |nonce, len| Authed {
            req: Request::upload(&who(&k), 1, nonce, len, 42),
            keys: k,
            challenge: 1,
        };
        let refusal = |d: Decision| match d {
            Decision::Reply(Answer::Refused(code)) => Some(code),
            _ => None,
        };
        let now = Instant::now();
        assert_eq!(refusal(b.decide(&authed(9, 10), now)), Some(Refusal::NotRequested));
        lock(&b.groups[&4000].0).pending[0] = Some(Pending { who: WHO, nonce: 9 });
        assert_eq!(refusal(b.decide(&authed(8, 10), now)), Some(Refusal::NotRequested));
        assert_eq!(refusal(b.decide(&authed(9, 1001), now)), Some(Refusal::TooLarge));
        // 600 bytes held elsewhere: 1000 more would pass the bound.
        let elsewhere = Charge::reserve(&b.channel, 1500, 600).unwrap();
        assert_eq!(refusal(b.decide(&authed(9, 1000), now)), Some(Refusal::Busy));
        assert_eq!(reg.total().checkpoint_memory_refused, 1);
        let Decision::Receive(charge) = b.decide(&authed(9, 900), now) else {
            panic!("CONTINUE expected")
        };
        assert_eq!(b.channel.memory_bytes.load(Relaxed), 1500);
        // Used once.
        assert_eq!(refusal(b.decide(&authed(9, 10), now)), Some(Refusal::NotRequested));
        let state = Bytes::from(vec![1u8; 900]);
        let info = b.store(&authed(9, 900), state.clone(), digest(&state), charge);
        assert_eq!((info.number, info.tick, info.from_player), (1, 42, 7));
        drop(elsewhere);
        assert_eq!(b.channel.memory_bytes.load(Relaxed), 900);
        assert_eq!(reg.total().checkpoint_refused, 5);
        // FETCH gets it, FETCH_OTHER has nothing yet; each at its own rate.
        let fetch = |op| Authed {
            req: Request::fetch(&who(&k), 1, op),
            keys: k,
            challenge: 1,
        };
        assert!(matches!(b.decide(&fetch(Op::Fetch), now), Decision::Send(k) if k.info == info));
        assert!(matches!(
            b.decide(&fetch(Op::FetchOther), now),
            Decision::Reply(Answer::Empty)
        ));
        assert_eq!(refusal(b.decide(&fetch(Op::Fetch), now)), Some(Refusal::Busy));
        let later = now + Duration::from_millis(b.cfg.fetch_every_ms);
        assert!(matches!(b.decide(&fetch(Op::Fetch), later), Decision::Send(_)));
    }
}
