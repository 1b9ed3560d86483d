//! One bot: a player of the game on the project's client
//! (`reflector_client::Client`), which does everything a member does (the
//! JOIN, keepalives, PROBE answers, rejoins, renewal, moves
//! make-before-break, the checkpoint channel). What stays here is the
//! bots' own part: when to move and send, the grants they ask the control
//! server for (tokens handed to the client), their game state, and the
//! [`Ledger`] kept in step with the client's membership log so that every
//! owed datagram is known.

use super::checkpoints::{compare, CheckpointTally, GameState, PlayerState, Verdict};
use super::config::BotsConfig;
use super::grants::{client_grant, Job, JobResult};
use super::windows::WindowCause;
use super::world::{cell_of, step, Rng};
use super::{Histogram, Ledger, MemId, Receipt, GRANT_RETRY, MARKER_AT, MARKER_LEN, MAX_MESSAGES, PAYLOAD_MIN};
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use oskit::netns::NetNs;
use reflector_client::{
    AreaTokens, CheckpointError, CheckpointEvent, CheckpointOp, Client, Event, MembershipChange, MembershipRecord,
    Refusal, RejoinReason, TrySendError, Verification, MAX_PAYLOAD,
};
use reflector_proto::control::WorldInfo;
use reflector_proto::protocol::DATA_PAYLOAD;
use reflector_proto::sealed::checkpoint::PUBLIC_KEY_LEN;
use std::collections::HashMap;
use std::io;
use std::net::UdpSocket;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Epoll data of a bot's checkpoint socket: its index with this bit set
/// (its UDP socket: the index alone).
pub(super) const CHECKPOINT_FD: u64 = 1 << 63;

/// Why a bot asks the control server for a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ask {
    /// Its first group.
    Join,
    /// It crossed into another cell.
    Move,
    /// Its client needs a token (renewal, a refused one, MOVED).
    Token,
}

#[derive(Debug, Default)]
pub(super) struct BotStats {
    pub(super) sent: u64,
    /// Join grants (tokens) the control server gave.
    pub(super) grants: u64,
    pub(super) joins: u64,
    pub(super) renewals: u64,
    pub(super) cell_changes: u64,
    pub(super) group_changes: u64,
    /// MOVEDs received (a draining or re-placed reflector).
    pub(super) moves_asked: u64,
    pub(super) errors: u64,
    pub(super) lat_max_ns: u64,
    pub(super) lat_sum_ns: u128,
    pub(super) lat_n: u64,
}

pub(super) struct Bot {
    pub(super) player: u32,
    /// Its index (epoll data, the ledger's bot, its namespace).
    pub(super) idx: usize,
    pub(super) pos: (f64, f64),
    pub(super) cell: Option<[u32; 2]>,
    /// Its client until the first grant is handed in: made with no token,
    /// so that its checkpoint signing key goes with the first `/join`.
    pub(super) waiting: Option<Client>,
    /// The client's checkpoint signing key (public half), sent as
    /// `sign_key` on every `/join` for this bot.
    pub(super) sign_key: [u8; PUBLIC_KEY_LEN],
    /// The client, once it holds a token.
    pub(super) client: Option<Client>,
    /// Grant request generation; answers to older requests are ignored.
    pub(super) gen: u64,
    pub(super) http_busy: bool,
    pub(super) asking: Ask,
    /// Not before then is a grant asked for again (after a failure).
    pub(super) ask_at: Option<Instant>,
    /// The client asked for a token and has not got one yet.
    pub(super) token_wanted: bool,
    /// The reflector and group of the last token handed to the client.
    pub(super) granted: Option<(String, u16)>,
    pub(super) next_move: Option<Instant>,
    pub(super) next_send: Instant,
    pub(super) stats: BotStats,
    /// Moves made (carried in every DATA with the position).
    pub(super) moves: u32,
    /// The game state as this bot knows it: the last position and move
    /// count of every player heard from in the current group.
    pub(super) view: HashMap<u32, PlayerState>,
    /// Entries of a fetched checkpoint not yet compared with the player's DATA.
    pub(super) check: HashMap<u32, PlayerState>,
    /// The client's memberships (log ids) and the ledger's for each.
    pub(super) mems: Vec<(u64, MemId)>,
    /// The fetch under way: the membership it is for, and when it began.
    pub(super) fetching: Option<(Option<u64>, Instant)>,
    /// A join wants a fetch (waiting for the one under way or for a slot).
    pub(super) fetch_wanted: bool,
    /// An upload is under way, for this membership.
    pub(super) uploading: Option<Option<u64>>,
    /// The reflector asked this group for the state: answered once the
    /// upload under way ends and a slot is free.
    pub(super) upload_wanted: Option<u16>,
    /// In the queue for a checkpoint slot.
    pub(super) ck_queued: bool,
    /// When the client next needs an update (None: not timed).
    pub(super) client_due: Option<Instant>,
    /// A call into the client may have moved `client_due`.
    pub(super) recheck: bool,
    /// When the bot's own timers next need it.
    pub(super) due: Instant,
}

impl Bot {
    pub(super) fn new(player: u32, idx: usize, pos: (f64, f64), client: Client, start: Instant) -> Bot {
        Bot {
            player,
            idx,
            pos,
            cell: None,
            sign_key: client.checkpoint_signing_key(),
            waiting: Some(client),
            client: None,
            gen: 0,
            http_busy: false,
            asking: Ask::Join,
            ask_at: None,
            token_wanted: false,
            granted: None,
            next_move: None,
            next_send: start,
            stats: BotStats::default(),
            moves: 0,
            view: HashMap::new(),
            check: HashMap::new(),
            mems: Vec::new(),
            fetching: None,
            fetch_wanted: false,
            uploading: None,
            upload_wanted: None,
            ck_queued: false,
            client_due: None,
            recheck: false,
            due: start,
        }
    }

    pub(super) fn is_member(&self) -> bool {
        self.client.as_ref().is_some_and(Client::is_member)
    }

    /// When the bot next needs attention: its own timers or its client's.
    pub(super) fn next_due(&self) -> Instant {
        self.client_due.map_or(self.due, |c| c.min(self.due))
    }

    fn ledger_mem(&self, id: u64) -> Option<MemId> {
        self.mems.iter().find(|(i, _)| *i == id).map(|&(_, m)| m)
    }
}

/// Applies one record of a client's membership log to the ledger: the
/// ledger's windows open when the confirming JOIN goes out and close when
/// the LEAVE does, so the bots read the log right after each call into the
/// client, before any other bot sends. `left_ns`: the monotonic time of a
/// LEAVE during the run (its settle margin), `None` at the end.
pub(super) fn apply_record(
    ledger: &mut Ledger,
    bot: usize,
    mems: &mut Vec<(u64, MemId)>,
    rec: &MembershipRecord,
    left_ns: Option<u64>,
) {
    let pos = mems.iter().position(|(id, _)| *id == rec.id);
    // A client logs from its first call on: its first membership may have
    // started before the log did.
    let mem = match pos {
        Some(p) => mems[p].1,
        None => {
            let m = ledger.new_membership(bot, rec.reflector);
            mems.push((rec.id, m));
            m
        }
    };
    match rec.change {
        MembershipChange::Started => {}
        MembershipChange::ConfirmSent => ledger.join_sent(mem),
        MembershipChange::Joined => ledger.joined(mem),
        MembershipChange::Restarted => {
            // What the stale cookie's JOIN did, it did not make a member;
            // the join starting over is a new membership for the ledger.
            ledger.join_failed(mem);
            let m = ledger.new_membership(bot, rec.reflector);
            if let Some(e) = mems.iter_mut().find(|(id, _)| *id == rec.id) {
                e.1 = m;
            }
        }
        MembershipChange::Failed => ledger.join_failed(mem),
        MembershipChange::Left | MembershipChange::Lost => {
            match (rec.change, left_ns) {
                (MembershipChange::Left, Some(ns)) => ledger.ended_at(mem, ns),
                _ => ledger.ended(mem),
            }
            mems.retain(|(id, _)| *id != rec.id);
        }
    }
}

/// Everything the loop mutates besides the bots.
pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a BotsConfig,
    pub(super) ledger: Ledger,
    pub(super) latency: Histogram,
    pub(super) malformed: u64,
    /// DATA received carrying the run's marker (`--marker`).
    pub(super) markers: u64,
    pub(super) errors: Vec<String>,
    pub(super) error_count: u64,
    pub(super) buf: Vec<u8>,
    pub(super) sending: bool,
    /// False while `sync_start` holds DATA back.
    pub(super) released: bool,
    pub(super) ck: CheckpointTally,
    pub(super) fetch_ns_sum: u128,
    /// Closed (None) at the end, which ends the HTTP helpers.
    pub(super) jobs: Option<mpsc::Sender<Job>>,
    /// The bots' namespaces (bot i's is `i % len`): checkpoint sockets
    /// are made there.
    pub(super) namespaces: &'a [NetNs],
    pub(super) epoll: &'a Epoll,
    /// The namespace (of `namespaces`) the loop's thread has entered.
    pub(super) in_netns: Option<usize>,
    /// Checkpoint exchanges that may start now (of [`CHECKPOINT_SLOTS`]).
    pub(super) ck_free: usize,
    /// Bots waiting for a checkpoint slot, oldest first.
    pub(super) ck_queue: std::collections::VecDeque<usize>,
    /// Every bot's move windows.
    pub(super) windows: super::windows::Windows,
}

/// Checkpoint exchanges under way at once, over all bots: the two helper
/// threads they had before they ran on the client. The reflector takes 8
/// connections per address (the bots often share one) and closes the
/// oldest unauthenticated one for a new one beyond that.
pub(super) const CHECKPOINT_SLOTS: usize = 2;

impl Ctx<'_> {
    pub(super) fn error(&mut self, bot: &mut Bot, msg: String) {
        bot.stats.errors += 1;
        self.error_count += 1;
        if self.errors.len() < MAX_MESSAGES {
            tracing::warn!("bot {}: {msg}", bot.player);
            self.errors.push(format!("bot {}: {msg}", bot.player));
        }
    }

    fn ask_grant(&mut self, bot: &mut Bot, why: Ask) {
        bot.gen += 1;
        bot.http_busy = true;
        bot.asking = why;
        bot.ask_at = None;
        if let Some(jobs) = &self.jobs {
            // The receiver lives until the loop ends.
            let _ = jobs.send(Job {
                bot: bot.idx,
                gen: bot.gen,
                player: bot.player,
                pos: bot.pos,
                sign_key: bot.sign_key,
            });
        }
    }

    /// A helper thread's grant: the first makes the bot's client; later
    /// ones are handed to it (a renewal, or a move, make-before-break).
    pub(super) fn on_grant(&mut self, bot: &mut Bot, res: JobResult, now: Instant) {
        if res.gen != bot.gen {
            return;
        }
        bot.http_busy = false;
        let grant = match res.result {
            Ok(g) => {
                bot.stats.grants += 1;
                g
            }
            Err(e) => {
                self.error(bot, e);
                if bot.client.is_none() || bot.token_wanted {
                    bot.ask_at = Some(now + GRANT_RETRY);
                }
                return;
            }
        };
        let (token, certificate) = match client_grant(&grant, bot.player, &bot.sign_key) {
            Ok(t) => t,
            Err(e) => {
                self.error(bot, e);
                return;
            }
        };
        bot.cell = Some(grant.cell);
        if !self.sending {
            return;
        }
        match bot.client.as_mut() {
            None => {
                let Some(mut c) = bot.waiting.take() else { return };
                // The token first (the client then holds the group, and the
                // grant's epoch keys with it), then the certificate, which
                // is checked against those keys.
                if let Err(e) = c.set_token(token) {
                    self.error(bot, e.to_string());
                    bot.waiting = Some(c);
                    bot.ask_at = Some(now + GRANT_RETRY);
                    return;
                }
                bot.granted = Some((grant.reflector.clone(), grant.group));
                if let Some(s) = certificate {
                    let cert = s.certificate;
                    if let Err(e) =
                        c.set_checkpoint_certificate(grant.group, s.control_public, cert.signature, cert.expires_unix_s)
                    {
                        self.error(bot, format!("checkpoint certificate: {e}"));
                    }
                }
                bot.client = Some(c);
            }
            Some(c) => {
                // A move within the cells of the group held needs no new
                // token: the client asks for one when renewal is due.
                let held = (token.reflector.as_str(), token.group);
                if bot.asking == Ask::Move
                    && !bot.token_wanted
                    && bot.granted.as_ref().is_some_and(|(r, g)| (r.as_str(), *g) == held)
                {
                    return;
                }
                bot.token_wanted = false;
                if bot.granted.as_ref().is_some_and(|(r, g)| (r.as_str(), *g) != held) {
                    // Another group: a move window (unless one is open).
                    self.windows
                        .open(bot.idx, WindowCause::Cell, oskit::clock::realtime_ns());
                }
                bot.granted = Some((grant.reflector.clone(), grant.group));
                if let Err(e) = c.set_area_tokens(AreaTokens {
                    cell: token,
                    area: Vec::new(),
                }) {
                    self.error(bot, e.to_string());
                } else if let Some(s) = certificate {
                    // A renewal's or a move's grant certifies the key until
                    // its own expiry: handed in with each token.
                    let cert = s.certificate;
                    if let Err(e) =
                        c.set_checkpoint_certificate(grant.group, s.control_public, cert.signature, cert.expires_unix_s)
                    {
                        self.error(bot, format!("checkpoint certificate: {e}"));
                    }
                }
            }
        }
        bot.recheck = true;
        self.drain(bot, now);
    }

    /// Its client's `update` (its sockets are readable, or it is due), and
    /// what that brought. The loop does this for every bot an epoll wake-up
    /// names before anything else, so that a datagram waits for the other
    /// bots' receiving only, not for their timers.
    pub(super) fn update_client(&mut self, bot: &mut Bot, now: Instant) {
        // The inbox holds what one update receives; with more waiting,
        // taken in turns, bounded like a socket's own drain.
        for _ in 0..64 {
            let Some(c) = bot.client.as_mut() else { break };
            c.update(now);
            bot.recheck = true;
            let held = c.inbox_held();
            self.drain(bot, now);
            if !held {
                break;
            }
        }
    }

    /// Runs a bot: its client's `update` when it is due (or its sockets
    /// are readable, `io`), then its own timers. Returns when it is next
    /// due.
    pub(super) fn service(
        &mut self,
        bot: &mut Bot,
        now: Instant,
        io: bool,
        world: &WorldInfo,
        rng: &mut Rng,
    ) -> Instant {
        recheck(bot, now);
        if io || bot.client_due.is_some_and(|t| now >= t) {
            self.update_client(bot, now);
            recheck(bot, now);
        }
        if now >= bot.due {
            self.tick(bot, now, world, rng);
            recheck(bot, now);
        }
        bot.next_due()
    }

    /// What the client has for the bot after a call: membership records
    /// (first: the ledger must know a JOIN before anyone sends again),
    /// events, DATA, checkpoint events.
    pub(super) fn drain(&mut self, bot: &mut Bot, now: Instant) {
        let Some(c) = bot.client.as_mut() else { return };
        let left_ns = self.sending.then(oskit::clock::mono_now_ns);
        while let Some(rec) = c.poll_membership() {
            apply_record(&mut self.ledger, bot.idx, &mut bot.mems, &rec, left_ns);
        }
        while let Some(ev) = bot.client.as_mut().and_then(Client::poll_event) {
            self.on_event(bot, ev, now);
        }
        // After the events: a window they opened starts from the
        // membership the bot sent through until now.
        let mem = bot
            .client
            .as_ref()
            .and_then(Client::sending_membership)
            .and_then(|id| bot.ledger_mem(id));
        let group = mem.and_then(|m| self.ledger.group_of(m));
        let active = mem.is_some_and(|m| self.ledger.is_active(m));
        self.windows
            .sending(bot.idx, mem, group, active, oskit::clock::realtime_ns());
        self.receive(bot);
        while let Some(ev) = bot.client.as_mut().and_then(Client::poll_checkpoint) {
            self.on_checkpoint(bot, ev);
        }
    }

    fn on_event(&mut self, bot: &mut Bot, ev: Event, now: Instant) {
        match ev {
            Event::Joined { group, .. } => {
                bot.stats.joins += 1;
                bot.next_send = now;
                bot.due = bot.due.min(now);
                let Some(c) = &bot.client else { return };
                if c.group() == Some(group) && c.sending_group() == Some(group) && c.checkpoint_addr().is_some() {
                    // Catch up on the game state (paper 000 §3).
                    bot.fetch_wanted = true;
                    self.start_exchanges(bot);
                }
            }
            Event::Rejoining { group, reason } => {
                let cause = match reason {
                    RejoinReason::ReflectorSilent => Some(WindowCause::Silent),
                    RejoinReason::NotMember => Some(WindowCause::NotMember),
                    RejoinReason::Refused | RejoinReason::NewGroup => None,
                };
                if let Some(cause) = cause {
                    self.open_window(bot, cause);
                }
                self.forget_group(bot);
                if reason == RejoinReason::NotMember {
                    // ERROR(NotMember) cannot be authenticated: the client
                    // joins again with the token and key held (numbers going
                    // on), never with a new grant, which a forged error
                    // would otherwise turn into a lockout by the rate limit.
                    self.error(bot, format!("group {group} forgot this member; joining again"));
                }
            }
            Event::Moved { .. } => {
                bot.stats.group_changes += 1;
                self.forget_group(bot);
            }
            Event::Renewed { .. } => bot.stats.renewals += 1,
            Event::TokenNeeded => {
                bot.token_wanted = true;
                if !bot.http_busy {
                    self.ask_grant(bot, Ask::Token);
                }
            }
            // The reflector ends the membership (MOVED, under the bot's
            // key): the client asks for a token (TokenNeeded), whose grant
            // names where the cell is placed now.
            Event::MoveAsked { .. } => {
                bot.stats.moves_asked += 1;
                self.open_window(bot, WindowCause::Moved);
            }
            Event::Error(e) => self.error(bot, e.to_string()),
            Event::TokenRequested
            | Event::SenderHeard { .. }
            | Event::SenderSilent { .. }
            | Event::LeftGroup { .. }
            | Event::Left => {}
        }
    }

    /// Opens the bot's move window now (one open goes on).
    fn open_window(&mut self, bot: &Bot, cause: WindowCause) {
        self.windows.open(bot.idx, cause, oskit::clock::realtime_ns());
    }

    /// A new group: what the bot knew of the last one no longer applies.
    fn forget_group(&mut self, bot: &mut Bot) {
        bot.view.clear();
        self.ck.entries_unconfirmed += bot.check.len() as u64;
        bot.check.clear();
    }

    /// Received DATA into the ledger, the latency histogram and the bot's
    /// view of its group.
    fn receive(&mut self, bot: &mut Bot) {
        let Some(c) = bot.client.as_mut() else { return };
        let cell = c.group();
        while let Some(d) = c.recv() {
            let p = d.payload;
            if p.len() < PAYLOAD_MIN {
                self.malformed += 1;
                continue;
            }
            let be32 = |i: usize| u32::from_be_bytes([p[i], p[i + 1], p[i + 2], p[i + 3]]);
            let ts = u64::from_be_bytes(p[0..8].try_into().unwrap_or_default());
            if let Some(m) = &self.cfg.marker {
                // Came through whole, the sender's own marker.
                if p.len() >= MARKER_AT + MARKER_LEN
                    && p[MARKER_AT..MARKER_AT + 8] == m[..]
                    && be32(MARKER_AT + 8) == d.sender
                {
                    self.markers += 1;
                }
            }
            // The ledger's own DATA counter: the header's sequence number
            // also counts the sender's ECHOs and PROBE_REPLYs.
            let tx = be32(8);
            let receipt = self.ledger.received(bot.idx, tx, be32(12));
            if receipt != Receipt::Unexpected {
                if let (Some(sender), Some(g)) = (self.ledger.bot_of(tx), self.ledger.group_of(tx)) {
                    self.windows
                        .delivered(bot.idx, sender, tx, oskit::clock::realtime_ns(), g);
                }
            }
            if receipt == Receipt::New {
                let lat = oskit::clock::realtime_ns().saturating_sub(ts);
                self.latency.record(lat);
                let s = &mut bot.stats;
                s.lat_max_ns = s.lat_max_ns.max(lat);
                s.lat_sum_ns += u128::from(lat);
                s.lat_n += 1;
            }
            if Some(d.group) != cell {
                continue;
            }
            let heard = PlayerState {
                player: d.sender,
                x: f32::from_bits(be32(16)),
                y: f32::from_bits(be32(20)),
                moves: be32(24),
            };
            if let Some(entry) = bot.check.remove(&heard.player) {
                match compare(&entry, heard.x, heard.y, heard.moves) {
                    Verdict::Matched => self.ck.entries_matched += 1,
                    Verdict::Moved => self.ck.entries_moved += 1,
                    Verdict::Mismatched => {
                        self.ck.mismatched += 1;
                        bot.stats.errors += 1;
                        self.error_count += 1;
                        if self.errors.len() < MAX_MESSAGES {
                            self.errors.push(format!(
                                "bot {}: checkpoint entry {entry:?} contradicts the player's DATA {heard:?}",
                                bot.player
                            ));
                        }
                    }
                }
            }
            bot.view.insert(heard.player, heard);
        }
    }

    /// The bot's own timers: grants, moves, DATA.
    fn tick(&mut self, bot: &mut Bot, now: Instant, world: &WorldInfo, rng: &mut Rng) {
        let far = now + Duration::from_secs(1);
        bot.due = far;
        if !self.sending {
            return;
        }
        let wants_grant = bot.client.is_none() || bot.token_wanted;
        if wants_grant && !bot.http_busy {
            match bot.ask_at {
                Some(t) if t > now => bot.due = t,
                _ => self.ask_grant(bot, if bot.client.is_none() { Ask::Join } else { Ask::Token }),
            }
        }
        if !bot.is_member() {
            return;
        }
        if let Some(t) = bot.next_move {
            if now >= t && !bot.http_busy {
                let every = self.cfg.move_every.unwrap_or(Duration::from_secs(3600));
                bot.next_move = Some(t + every);
                bot.pos = step(bot.pos, world, rng.unit(), rng.unit());
                bot.moves += 1;
                let cell = cell_of(bot.pos, world);
                if Some(cell) != bot.cell {
                    bot.stats.cell_changes += 1;
                    self.ask_grant(bot, Ask::Move);
                }
            }
        }
        let quota_left = self.cfg.max_datagrams.is_none_or(|m| bot.stats.sent < m);
        if self.released && quota_left && now >= bot.next_send {
            self.send_data(bot, now);
        }
        if self.released && quota_left {
            bot.due = bot.due.min(bot.next_send);
        }
        if let Some(t) = bot.next_move {
            bot.due = bot.due.min(t);
        }
    }

    fn send_data(&mut self, bot: &mut Bot, now: Instant) {
        let Some(c) = bot.client.as_ref() else { return };
        let (Some(id), Some(max)) = (c.sending_membership(), c.max_payload()) else {
            return;
        };
        let Some(mem) = bot.ledger_mem(id) else { return };
        let Some(c) = bot.client.as_mut() else { return };
        let seq = self.ledger.sent(mem);
        // `--size` is the datagram's: the header, and an instance id or
        // the sealing where the group carries them, come off the payload
        // (which never shrinks below the bots' fields and the marker).
        let fields = PAYLOAD_MIN + if self.cfg.marker.is_some() { MARKER_LEN } else { 0 };
        let len = self
            .cfg
            .size
            .saturating_sub(DATA_PAYLOAD + (MAX_PAYLOAD - max))
            .max(fields);
        let b = &mut self.buf;
        let wall = oskit::clock::realtime_ns();
        b[0..8].copy_from_slice(&wall.to_be_bytes());
        b[8..12].copy_from_slice(&mem.to_be_bytes());
        b[12..16].copy_from_slice(&seq.to_be_bytes());
        b[16..20].copy_from_slice(&(bot.pos.0 as f32).to_be_bytes());
        b[20..24].copy_from_slice(&(bot.pos.1 as f32).to_be_bytes());
        b[24..28].copy_from_slice(&bot.moves.to_be_bytes());
        if let Some(m) = &self.cfg.marker {
            let at = MARKER_AT;
            b[at..at + 8].copy_from_slice(m);
            b[at + 8..at + 12].copy_from_slice(&bot.player.to_be_bytes());
            // The bot's own count: unique per bot over every membership.
            b[at + 12..at + 16].copy_from_slice(&(bot.stats.sent as u32).to_be_bytes());
        }
        let period = Duration::from_secs_f64(1.0 / self.cfg.rate_hz);
        match c.try_send(&self.buf[..len]) {
            Ok(_) => {
                // Counted only once it is really sent.
                self.ledger.next_seq_at(mem, oskit::clock::mono_now_ns());
                self.ledger.sent_at_wall(mem, wall);
                bot.stats.sent += 1;
                bot.next_send += period;
                if bot.next_send + period < now {
                    // Far behind (a stall): do not burst to catch up.
                    bot.next_send = now + period;
                }
            }
            // Socket buffer full: again on the next pass, same number.
            Err(TrySendError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                self.error(bot, format!("send: {e}"));
                bot.next_send += period;
            }
        }
    }

    /// Runs `f` (which may open a checkpoint socket) in the bot's
    /// namespace, then has the bot's epoll watch the sockets opened.
    fn in_namespace<T>(
        &mut self,
        bot: &mut Bot,
        f: impl FnOnce(&mut Client) -> Result<T, CheckpointError>,
    ) -> Result<T, CheckpointError> {
        let Some(c) = bot.client.as_mut() else {
            return Err(CheckpointError::NotMember);
        };
        bot.recheck = true;
        // The loop's own thread moves into the bot's namespace (and stays
        // there until another bot's is needed): it makes no other socket
        // once the bots' UDP sockets are made, and a thread per exchange
        // (NetNs::run) would stall every bot while it starts.
        let ns_idx = bot.idx % self.namespaces.len().max(1);
        if let Some(ns) = self.namespaces.get(ns_idx) {
            if self.in_netns != Some(ns_idx) {
                ns.enter_on_this_thread().map_err(|e| CheckpointError::Io {
                    addr: c.checkpoint_addr().unwrap_or_else(|| ([0, 0, 0, 0], 0).into()),
                    call: "setns",
                    message: e.to_string(),
                })?;
                self.in_netns = Some(ns_idx);
            }
        }
        let out = f(c);
        let flags = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLET;
        let mut failed = None;
        for fd in c.checkpoint_fds() {
            match self
                .epoll
                .add(fd, EpollEvent::new(flags, CHECKPOINT_FD | bot.idx as u64))
            {
                // The other exchange's socket, watched already.
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                // Without it the exchange still moves on, at the client's
                // CHECKPOINT_POLL.
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            self.error(bot, format!("epoll_ctl (checkpoint socket): {e}"));
        }
        out
    }

    /// Starts the exchanges the bot wants that can start now; what must
    /// wait for a slot waits in the queue, what waits for the bot's own
    /// exchange of that kind starts when it ends.
    pub(super) fn start_exchanges(&mut self, bot: &mut Bot) {
        if bot.fetch_wanted && bot.fetching.is_none() && self.ck_free > 0 {
            bot.fetch_wanted = false;
            self.start_fetch(bot);
        }
        if bot.uploading.is_none() && self.ck_free > 0 {
            if let Some(group) = bot.upload_wanted.take() {
                self.upload(bot, group);
            }
        }
        let blocked =
            (bot.fetch_wanted && bot.fetching.is_none()) || (bot.upload_wanted.is_some() && bot.uploading.is_none());
        if blocked && !bot.ck_queued {
            bot.ck_queued = true;
            self.ck_queue.push_back(bot.idx);
        }
    }

    fn start_fetch(&mut self, bot: &mut Bot) {
        let for_mem = bot.client.as_ref().and_then(Client::sending_membership);
        let t0 = Instant::now();
        match self.in_namespace(bot, Client::fetch_checkpoint) {
            Ok(()) => {
                bot.fetching = Some((for_mem, t0));
                self.ck_free -= 1;
            }
            // The group has no checkpoint channel, or the bot has left it.
            Err(CheckpointError::NoChannel) | Err(CheckpointError::NotMember) => {}
            Err(e) => {
                self.ck.fetch_errors += 1;
                self.error(bot, format!("checkpoint fetch: {e}"));
            }
        }
    }

    /// Answers the reflector's request with the bot's view of its group.
    fn upload(&mut self, bot: &mut Bot, group: u16) {
        let state = game_state(bot, group);
        let tick = u64::from(bot.moves);
        let for_mem = bot.client.as_ref().and_then(Client::sending_membership);
        match self.in_namespace(bot, move |c| c.provide_checkpoint(tick, state)) {
            Ok(()) => {
                bot.uploading = Some(for_mem);
                self.ck_free -= 1;
            }
            // The membership asked has ended since (the bot moved on), or a
            // newer request replaced it: nothing was lost.
            Err(CheckpointError::NotMember) | Err(CheckpointError::NotRequested) => self.ck.uploads_overtaken += 1,
            Err(e) => {
                self.ck.upload_errors += 1;
                self.error(bot, format!("checkpoint upload: {e}"));
            }
        }
    }

    /// The client's checkpoint events: counted; a fetched checkpoint of
    /// the bot's current membership is kept to be checked against the
    /// DATA to come.
    fn on_checkpoint(&mut self, bot: &mut Bot, ev: CheckpointEvent) {
        let current_mem = bot.client.as_ref().and_then(Client::sending_membership);
        match ev {
            CheckpointEvent::Requested { group } => {
                self.ck.requested += 1;
                // The client keeps the request until it is answered.
                bot.upload_wanted = Some(group);
                self.start_exchanges(bot);
            }
            CheckpointEvent::Uploaded { .. } => {
                self.ck.uploaded += 1;
                self.upload_done(bot);
            }
            CheckpointEvent::Empty { .. } => {
                self.ck.fetched_empty += 1;
                self.fetch_done(bot);
            }
            CheckpointEvent::Checkpoint {
                group,
                bytes,
                verification,
                ..
            } => {
                let (for_mem, t0) = bot.fetching.unwrap_or((None, Instant::now()));
                let took = t0.elapsed();
                self.ck.fetched += 1;
                if matches!(
                    verification,
                    Verification::SignedByOne { .. } | Verification::VerifiedByTwo { .. }
                ) {
                    self.ck.fetched_signed += 1;
                }
                self.ck.bytes_fetched += bytes.len() as u64;
                self.fetch_ns_sum += took.as_nanos();
                self.ck.fetch_ms_max = self.ck.fetch_ms_max.max(took.as_secs_f64() * 1e3);
                let current = for_mem.is_some() && for_mem == current_mem;
                match wire::from_bytes::<GameState>(&bytes::Bytes::from(bytes)) {
                    Ok(gs) if current && gs.group == group => {
                        for e in gs.players.into_iter().filter(|e| e.player != bot.player) {
                            bot.check.insert(e.player, e);
                        }
                    }
                    // Fetched for a membership since left: nothing to check.
                    Ok(_) if !current => {}
                    Ok(gs) => {
                        self.ck.mismatched += 1;
                        self.error(
                            bot,
                            format!("checkpoint of group {} served for group {group}", gs.group),
                        );
                    }
                    Err(e) => {
                        self.ck.mismatched += 1;
                        self.error(bot, format!("checkpoint does not decode: {e}"));
                    }
                }
                self.fetch_done(bot);
            }
            CheckpointEvent::Failed { op, reason, .. } => {
                let refusal = reason.refusal();
                match op {
                    CheckpointOp::Upload => {
                        let for_mem = bot.uploading.flatten();
                        let current = for_mem.is_some() && for_mem == current_mem;
                        // An upload for a membership the bot has left since
                        // it was asked, or whose request the reflector no
                        // longer holds (it keeps its group's last two): a
                        // newer checkpoint stands; nothing was lost.
                        if (!current && refusal == Some(Refusal::NotMember)) || refusal == Some(Refusal::NotRequested) {
                            self.ck.uploads_overtaken += 1;
                        } else {
                            self.ck.upload_errors += 1;
                            self.error(bot, format!("checkpoint upload: {reason}"));
                        }
                        self.upload_done(bot);
                    }
                    // The bots fetch only the latest (FETCH_OTHER is never asked).
                    CheckpointOp::Fetch | CheckpointOp::FetchOther => {
                        let for_mem = bot.fetching.and_then(|(m, _)| m);
                        let current = for_mem.is_some() && for_mem == current_mem;
                        // As for uploads: a fetch for a membership the bot
                        // has left since it asked is refused NotMember by
                        // a reflector that no longer holds it.
                        if !current && refusal == Some(Refusal::NotMember) {
                            self.ck.fetches_overtaken += 1;
                        } else {
                            self.ck.fetch_errors += 1;
                            self.error(bot, format!("checkpoint fetch: {reason}"));
                        }
                        self.fetch_done(bot);
                    }
                }
            }
        }
    }

    fn upload_done(&mut self, bot: &mut Bot) {
        if bot.uploading.take().is_some() {
            self.ck_free += 1;
        }
        self.start_exchanges(bot);
    }

    fn fetch_done(&mut self, bot: &mut Bot) {
        if bot.fetching.take().is_some() {
            self.ck_free += 1;
        }
        self.start_exchanges(bot);
    }

    /// Leaves at the end of the run (the grace period has let everything
    /// arrive: the ledger closes the windows without a settle margin).
    pub(super) fn leave(&mut self, bot: &mut Bot) {
        let Some(c) = bot.client.as_mut() else { return };
        c.leave();
        while let Some(rec) = c.poll_membership() {
            apply_record(&mut self.ledger, bot.idx, &mut bot.mems, &rec, None);
        }
    }
}

/// When the bot's client next needs an update, asked again only after a
/// call that can move its timers (sending DATA does not).
fn recheck(bot: &mut Bot, now: Instant) {
    if std::mem::take(&mut bot.recheck) {
        if let Some(c) = &bot.client {
            // An update leaves no deadline in the past (the client's own
            // tests check it); should one, the loop would spin on it.
            bot.client_due = c.next_update().map(|t| t.max(now + Duration::from_micros(100)));
        }
    }
}

/// Datagrams one update takes in before the bot reads them (it updates
/// again while more wait): room for a burst from a few dozen senders
/// without a 1.4 kB slot per datagram a whole group could send at once.
const INBOX: usize = 128;

/// The group's state as this bot knows it, itself included, encoded with
/// `wire`.
fn game_state(bot: &Bot, group: u16) -> Vec<u8> {
    let mut players: Vec<PlayerState> = bot.view.values().copied().collect();
    players.push(PlayerState {
        player: bot.player,
        x: bot.pos.0 as f32,
        y: bot.pos.1 as f32,
        moves: bot.moves,
    });
    players.sort_by_key(|p| p.player);
    let state = GameState { group, players };
    // A plain struct of numbers always serializes.
    wire::to_archive(&state).map(|a| a.to_vec()).unwrap_or_default()
}

/// A bot's client, with no token yet: the first grant is handed in (its
/// checkpoint signing key exists from the start, for that `/join`).
pub(super) fn new_client(bots: &BotsConfig, player: u32, sock: UdpSocket) -> Result<Client, String> {
    let driver = reflector_client::UdpDriver::from_socket(sock).map_err(|e| format!("fcntl(O_NONBLOCK): {e}"))?;
    let mut cfg = reflector_client::Config::new(reflector_client::TokenSource::Later);
    // The bots hand tokens in, and each renewal brings the keys of the
    // moment; between renewals the client refreshes a sealed group's
    // keys itself (`/keys` under the membership's token) before its
    // epoch ends, as a game whose client asks for its tokens does.
    cfg.keys_from = Some(reflector_client::ControlServer {
        fallback_urls: bots.control_fallbacks.clone(),
        allow_plain_http: true,
        ..reflector_client::ControlServer::new(bots.control.clone(), player, (0.0, 0.0))
    });
    cfg.join_retry = super::JOIN_RETRY;
    // Every bot may hear every other, and no one else. (The client
    // walks its table when a sender may have gone silent: no larger
    // than it needs to be.)
    cfg.max_senders = bots.count;
    cfg.inbox = INBOX;
    // Fetched by the bot, so that the socket is made in its namespace.
    cfg.checkpoint_fetch_on_join = false;
    let mut c = Client::with_driver(cfg, driver).map_err(|e| e.to_string())?;
    c.log_memberships();
    c.hold_when_inbox_full(true);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn rec(id: u64, change: MembershipChange) -> MembershipRecord {
        MembershipRecord {
            id,
            reflector: SocketAddr::from(([127, 0, 0, 1], 4000)),
            group: 4000,
            change,
        }
    }

    /// Two bots' clients' logs, applied as the loop does: the receiver's
    /// window opens at its confirming JOIN and closes at its LEAVE; a
    /// restarted join requires nothing of what came before it.
    #[test]
    fn membership_records_open_and_close_the_ledgers_windows() {
        let mut l = Ledger::new(2);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for c in [
            MembershipChange::Started,
            MembershipChange::ConfirmSent,
            MembershipChange::Joined,
        ] {
            apply_record(&mut l, 0, &mut a, &rec(1, c), None);
        }
        let sender = a[0].1;
        l.next_seq(sender); // 0: bot 1 not in the group yet
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::Started), None);
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::ConfirmSent), None);
        l.next_seq(sender); // 1: before the stale cookie's restart: not owed
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::Restarted), None);
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::ConfirmSent), None);
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::Joined), None);
        for _ in 0..3 {
            let s = l.next_seq(sender).unwrap(); // 2, 3, 4: owed
            if s != 3 {
                assert_eq!(l.received(1, sender, s), Receipt::New);
            }
        }
        apply_record(&mut l, 1, &mut b, &rec(1, MembershipChange::Left), None);
        assert!(b.is_empty(), "a left membership is forgotten");
        l.next_seq(sender); // 5: after the LEAVE
        let t = l.finish();
        assert_eq!((t[1].expected, t[1].received, t[1].gap_lost), (3, 2, 1));
        assert_eq!(t[1].memberships, 2, "the restart was a membership of its own");
        assert_eq!(t[0].sent, 6);
    }
}
