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
//! - the checkpoint channel ([`Channel`]), a TCP listener on the port
//!   JOIN_ACK announces, one short exchange per connection
//!   (`reflector_proto::checkpoint`): an upload is stored only if it answers
//!   the nonce pending for exactly that member, under its key, within the
//!   size bound; a fetch is served to a member of that group, under its key,
//!   over this connection's challenge. Everything else is refused with a
//!   reason and counted.
//!
//! The stored state is the upload's own receive buffer (a `Bytes` slice,
//! never copied), and a fetch sends it as a `wire` pointer chunk through
//! `sendpath`'s stream sender: MSG_ZEROCOPY where the kernel does not copy
//! anyway. Every local peer (loopback, veth) copies on delivery, so there
//! the first completion comes back COPIED and the channel sends copies from
//! then on, said once.
//!
//! Bounds: the state's size (`max_bytes`, checked from the message header
//! before its body is read), connections at once overall and per source
//! address, one fetch per member per `fetch_every_ms`, and a deadline on the
//! whole exchange: a peer that stops reading or writing is dropped and
//! counted, holding at most one stored state alive meanwhile.

use crate::membership::Member;
use crate::metrics::{GroupCounters, Registry};
use bytes::Bytes;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use reflector_proto::checkpoint::v1::{Hello, Op, Refusal, Reply, Request, MAX_SMALL, VERSION};
use reflector_proto::protocol::SessionKeys;
use sendpath::stream::{Piece, StreamSender};
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
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
    /// Connections served at once, overall and per source address.
    pub max_conns: usize,
    pub max_conns_per_ip: usize,
    /// One fetch per member per this many milliseconds.
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

/// Refusals that happen before a group is known.
#[derive(Debug, Default)]
pub struct ChannelCounters {
    /// Connections refused at once: too many overall or from one address.
    pub busy: AtomicU64,
    /// Requests that did not decode, were too large, or named no group here.
    pub malformed: AtomicU64,
    /// Exchanges that passed their deadline (a peer that stopped reading or writing).
    pub timeouts: AtomicU64,
}

#[derive(Debug)]
struct Stored {
    seq: u64,
    state: Bytes,
    from_player: u32,
    at: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    who: (u32, u32),
    nonce: u64,
}

#[derive(Debug, Default)]
struct GroupBoard {
    /// (player, membership) -> its keys, for every current member.
    roster: HashMap<(u32, u32), SessionKeys>,
    pending: Option<Pending>,
    latest: Option<Stored>,
    seq: u64,
    last_request_ms: Option<u64>,
    /// Requests each member left unanswered in a row.
    misses: HashMap<(u32, u32), u32>,
    last_fetch: HashMap<(u32, u32), Instant>,
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
        last_fetch.retain(|k, _| roster.contains_key(k));
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

    /// A CHECKPOINT_REQUEST went to `member` with `nonce`; one left
    /// unanswered before it counts against its member.
    pub fn requested(&self, port: u16, member: &Member, nonce: u64, now_ms: u64) {
        let Some((g, c)) = self.groups.get(&port) else { return };
        let mut g = lock(g);
        if let Some(p) = g.pending.take() {
            *g.misses.entry(p.who).or_insert(0) += 1;
        }
        g.pending = Some(Pending {
            who: (member.sender, member.membership),
            nonce,
        });
        g.last_request_ms = Some(now_ms);
        c.checkpoint_requests.fetch_add(1, Relaxed);
    }

    /// Decides one request. `challenge` is this connection's.
    fn serve(&self, req: Request, challenge: u64) -> (Reply, Option<&Arc<GroupCounters>>) {
        let Some((g, c)) = self.groups.get(&req.group) else {
            self.channel.malformed.fetch_add(1, Relaxed);
            return (refuse(Refusal::NoGroup, "no group on that port here"), None);
        };
        let reply = self.decide(&mut lock(g), c, req, challenge);
        if matches!(reply, Reply::Refused { .. }) {
            c.checkpoint_refused.fetch_add(1, Relaxed);
        }
        (reply, Some(c))
    }

    /// The answer to a request for group `g`, whose counters are `c`.
    fn decide(&self, g: &mut GroupBoard, c: &GroupCounters, req: Request, challenge: u64) -> Reply {
        let who = (req.player, req.membership);
        let Some(keys) = g.roster.get(&who).copied() else {
            return refuse(
                Refusal::NotMember,
                "join the group first (player and membership as in JOIN_ACK)",
            );
        };
        match req.op {
            Op::Upload { nonce, state } => {
                let asked = g.pending.is_some_and(|p| p.who == who && p.nonce == nonce);
                if !keys.verify_checkpoint(nonce, req.group, &state.0, &req.mac) {
                    refuse(Refusal::BadMac, "upload MAC does not verify under this member's key")
                } else if !asked {
                    refuse(
                        Refusal::NotRequested,
                        "no checkpoint request with that nonce is pending for you",
                    )
                } else if state.0.len() as u64 > self.cfg.max_bytes {
                    refuse(Refusal::TooLarge, "state over the reflector's bound")
                } else {
                    g.pending = None;
                    g.misses.remove(&who);
                    g.seq += 1;
                    let seq = g.seq;
                    c.checkpoints_stored.fetch_add(1, Relaxed);
                    c.checkpoint_bytes_stored.fetch_add(state.0.len() as u64, Relaxed);
                    g.latest = Some(Stored {
                        seq,
                        state: state.0,
                        from_player: req.player,
                        at: Instant::now(),
                    });
                    Reply::Stored { seq }
                }
            }
            Op::Fetch => {
                let too_soon = g
                    .last_fetch
                    .get(&who)
                    .is_some_and(|t| t.elapsed() < Duration::from_millis(self.cfg.fetch_every_ms));
                if !keys.verify_fetch(challenge, req.group, req.player, req.membership, &req.mac) {
                    refuse(Refusal::BadMac, "fetch MAC does not verify under this member's key")
                } else if too_soon {
                    refuse(Refusal::Busy, "one fetch per member per --checkpoint-fetch-every-ms")
                } else {
                    g.last_fetch.insert(who, Instant::now());
                    match &g.latest {
                        Some(s) => Reply::Checkpoint {
                            seq: s.seq,
                            age_ms: s.at.elapsed().as_millis() as u64,
                            from_player: s.from_player,
                            // A refcount, not a copy.
                            state: wire::Buffer(s.state.clone()),
                        },
                        None => {
                            c.checkpoint_empty_fetches.fetch_add(1, Relaxed);
                            Reply::Empty
                        }
                    }
                }
            }
        }
    }
}

fn refuse(code: Refusal, message: &str) -> Reply {
    Reply::Refused {
        code,
        message: message.into(),
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

/// The checkpoint channel: its listener thread and the connections it serves.
pub struct Channel {
    port: u16,
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Channel {
    /// Serves `listener` (already bound, so errors surface at start-up)
    /// until `stop`.
    pub fn start(listener: TcpListener, board: Arc<Board>, stop: Arc<AtomicBool>) -> io::Result<Channel> {
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("checkpoints".into())
            .spawn(move || accept_loop(listener, board, &stop2))?;
        Ok(Channel {
            port,
            thread: Some(thread),
            stop,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Waits for the listener and every connection to finish (each within
    /// its deadline).
    pub fn join(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connections at once: overall and per address.
#[derive(Default)]
struct Active {
    total: AtomicUsize,
    per_ip: Mutex<HashMap<IpAddr, usize>>,
}

/// Releases a connection's places when its worker ends, however it ends.
struct Slot {
    active: Arc<Active>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.active.total.fetch_sub(1, Relaxed);
        let mut m = self.active.per_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

fn accept_loop(listener: TcpListener, board: Arc<Board>, stop: &AtomicBool) {
    let active = Arc::new(Active::default());
    let mut workers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Relaxed) {
        workers.retain(|w| !w.is_finished());
        let (conn, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, PollTimeout::from(100u16));
                continue;
            }
            Err(e) => {
                // Out of descriptors and the like: say so, back off, go on.
                tracing::warn!("checkpoint channel: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let admitted = {
            let mut m = active.per_ip.lock().unwrap_or_else(|p| p.into_inner());
            let here = m.entry(peer.ip()).or_insert(0);
            if active.total.load(Relaxed) >= board.cfg.max_conns || *here >= board.cfg.max_conns_per_ip {
                if *here == 0 {
                    m.remove(&peer.ip());
                }
                false
            } else {
                *here += 1;
                active.total.fetch_add(1, Relaxed);
                true
            }
        };
        if !admitted {
            board.channel.busy.fetch_add(1, Relaxed);
            refuse_busy(conn);
            continue;
        }
        let slot = Slot {
            active: Arc::clone(&active),
            ip: peer.ip(),
        };
        let b = Arc::clone(&board);
        match std::thread::Builder::new()
            .name("checkpoint-conn".into())
            .spawn(move || {
                let _slot = slot;
                serve_conn(&b, conn, peer);
            }) {
            Ok(h) => workers.push(h),
            Err(e) => {
                board.channel.busy.fetch_add(1, Relaxed);
                tracing::warn!("checkpoint channel: cannot start a connection thread: {e}");
            }
        }
    }
    for w in workers {
        let _ = w.join();
    }
}

/// A best-effort refusal that never blocks the listener.
fn refuse_busy(conn: TcpStream) {
    let _ = conn.set_nonblocking(true);
    let hello = Hello {
        version: VERSION,
        challenge: 0,
        max_state: 0,
    };
    let reply = refuse(Refusal::Busy, "too many checkpoint connections: try again later");
    for msg in [wire::to_archive(&hello), wire::to_archive(&reply)]
        .into_iter()
        .flatten()
    {
        let _ = io::Write::write_all(&mut &conn, &msg.to_vec());
    }
}

/// A fresh challenge. Without the OS's randomness it would be guessable
/// (a recorded fetch could be replayed), so the exchange is refused then.
fn fresh_challenge() -> io::Result<u64> {
    let mut b = [0u8; 8];
    getrandom::getrandom(&mut b).map_err(|e| io::Error::other(format!("no randomness for the challenge: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

fn serve_conn(board: &Board, conn: TcpStream, peer: SocketAddr) {
    let started = Instant::now();
    let deadline = started + board.cfg.timeout;
    match exchange(board, &conn, deadline) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::TimedOut => {
            board.channel.timeouts.fetch_add(1, Relaxed);
            tracing::debug!("checkpoint channel: {peer}: {e}");
        }
        Err(e) => tracing::debug!("checkpoint channel: {peer}: {e}"),
    }
}

fn exchange(board: &Board, conn: &TcpStream, deadline: Instant) -> io::Result<()> {
    let challenge = fresh_challenge()?;
    conn.set_nodelay(true)?;
    conn.set_write_timeout(Some(board.cfg.timeout))?;
    let hello = Hello {
        version: VERSION,
        challenge,
        max_state: board.cfg.max_bytes,
    };
    let mut tx: StreamSender<Bytes> = StreamSender::new(
        conn.as_fd(),
        board.cfg.zero_copy && !board.copied.load(Relaxed),
        ZC_THRESHOLD,
        ZC_MAX_PINNED,
    );
    send(&mut tx, conn, &hello, deadline)?;
    let limits = wire::Limits {
        max_len: board.cfg.max_bytes.saturating_add(MAX_SMALL),
        ..wire::Limits::default()
    };
    let mut rd = DeadlineReader { s: conn, deadline };
    let msg = match wire::read_message(&mut rd, limits) {
        Ok(m) => m,
        Err(e) => {
            return match e.into_kind() {
                wire::ErrorKind::Io(io) => Err(io),
                wire::ErrorKind::TooLarge { .. } => {
                    board.channel.malformed.fetch_add(1, Relaxed);
                    let r = refuse(Refusal::TooLarge, "state over the reflector's bound");
                    send(&mut tx, conn, &r, deadline)
                }
                other => {
                    board.channel.malformed.fetch_add(1, Relaxed);
                    let r = refuse(Refusal::Malformed, &other.to_string());
                    send(&mut tx, conn, &r, deadline)
                }
            };
        }
    };
    let req: Request = match wire::from_bytes(&msg) {
        Ok(r) => r,
        Err(e) => {
            board.channel.malformed.fetch_add(1, Relaxed);
            let r = refuse(Refusal::Malformed, &e.to_string());
            return send(&mut tx, conn, &r, deadline);
        }
    };
    let t0 = Instant::now();
    let (reply, counters) = board.serve(req, challenge);
    let served = match &reply {
        Reply::Checkpoint { state, .. } => Some(state.0.len() as u64),
        _ => None,
    };
    let r = send(&mut tx, conn, &reply, deadline);
    drop(reply);
    if let Some(c) = counters {
        c.checkpoint_zerocopy_sends.fetch_add(tx.stats.zerocopy_sends, Relaxed);
        c.checkpoint_copied_sends.fetch_add(tx.stats.copied_sends, Relaxed);
        if let (Some(bytes), Ok(())) = (served, &r) {
            c.checkpoints_served.fetch_add(1, Relaxed);
            c.checkpoint_bytes_served.fetch_add(bytes, Relaxed);
            c.checkpoint_serve_us_sum
                .fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
        }
        if matches!(&r, Err(e) if e.kind() == io::ErrorKind::TimedOut) {
            c.checkpoint_timeouts.fetch_add(1, Relaxed);
        }
    }
    if tx.copied_seen && !board.copied.swap(true, Relaxed) {
        tracing::info!(
            "checkpoint channel: the kernel copied zero-copy sends after all (a local peer: loopback or veth \
             copy on delivery); checkpoints are sent as plain copies from now on"
        );
    }
    r
}

/// Sends one message: header and index chunks copied,
/// the state from its own pages; waits for the zero-copy completions so the
/// state is not freed while the kernel may still read it.
fn send<T: serde::Serialize>(
    tx: &mut StreamSender<Bytes>,
    conn: &TcpStream,
    msg: &T,
    deadline: Instant,
) -> io::Result<()> {
    let archive = wire::to_archive(msg).map_err(io::Error::other)?;
    let head = archive.head();
    let mut pieces = vec![Piece::Copy(&head[..])];
    for c in &archive.chunks {
        pieces.push(match c {
            wire::Chunk::Index(r) => Piece::Copy(&archive.index[r.clone()]),
            wire::Chunk::Pointer(b) => Piece::Held(b),
        });
    }
    tx.send_all(conn.as_fd(), &pieces, deadline)?;
    tx.drain(conn.as_fd(), deadline.saturating_duration_since(Instant::now()));
    Ok(())
}
