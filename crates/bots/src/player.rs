//! One bot's life as a state machine: ask for a join grant, join (the
//! protocol crate's client session), send DATA at the game profile, keep
//! alive, move and change groups, leave; and what it receives, recorded in
//! the [`Ledger`]. No sockets and no clock of its own: sends, grant
//! requests and time go through [`Edge`], so a test drives it exactly.

use super::checkpoints::{compare, CheckpointTally, CkDone, CkJob, CkOp, CkResult, GameState, PlayerState, Verdict};
use super::config::BotsConfig;
use super::grants::{join_request, Job, JobResult};
use super::world::{cell_of, step, Rng};
use super::{Histogram, Ledger, MemId, Receipt, GRANT_RETRY, JOIN_RETRY, MAX_MESSAGES, PAYLOAD_MIN};
use reflector_proto::checkpoint::Refusal;
use reflector_proto::client::{self, Event, Failure, JoinRequest, Session, Transmit};
use reflector_proto::control::WorldInfo;
use reflector_proto::protocol::{Kind, Packet, DATA_PAYLOAD};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
#[expect(
    clippy::large_enum_variant,
    reason = "a bot is in a group nearly all the time, so the size is paid anyway; a box would cost an allocation per join"
)]
pub(super) enum State {
    /// Waiting for a join grant (or for the time to ask again).
    Idle,
    /// Joining or a member, as `session` says; `mem` is the ledger's
    /// record of this membership.
    InGroup { mem: MemId, session: Session },
}

impl State {
    pub(super) fn is_member(&self) -> bool {
        matches!(self, State::InGroup { session, .. } if session.is_member())
    }
}

#[derive(Debug, Default)]
pub(super) struct BotStats {
    pub(super) sent: u64,
    /// Join grants (tokens) the control server gave.
    pub(super) grants: u64,
    pub(super) joins: u64,
    pub(super) join_retries: u64,
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
    /// Its index: the edge keeps its socket under it.
    pub(super) idx: usize,
    pub(super) pos: (f64, f64),
    pub(super) cell: Option<[u32; 2]>,
    pub(super) state: State,
    /// Grant request generation; answers to older requests are ignored.
    pub(super) gen: u64,
    pub(super) http_busy: bool,
    pub(super) ask_at: Option<Instant>,
    pub(super) next_move: Option<Instant>,
    pub(super) next_send: Instant,
    pub(super) last_send: Instant,
    /// When the last KEEPALIVE went out.
    pub(super) last_keepalive: Instant,
    pub(super) keepalive: Duration,
    /// Not before then is a grant asked for again to renew (after one
    /// was asked for, or failed).
    pub(super) renew_ask_at: Option<Instant>,
    pub(super) stats: BotStats,
    /// Moves made (carried in every DATA with the position).
    pub(super) moves: u32,
    /// The game state as this bot knows it: the last position and move
    /// count of every player heard from in the current group.
    pub(super) view: HashMap<u32, PlayerState>,
    /// Entries of a fetched checkpoint not yet compared with the player's DATA.
    pub(super) check: HashMap<u32, PlayerState>,
}

/// What the bots need from the world outside them: sending a datagram from
/// a bot's socket, asking the control server for a join grant, and the clocks.
/// The event loop implements it over sockets and HTTP threads; tests
/// implement it with a record of what was sent and a clock they set.
pub(super) trait Edge {
    fn send(&mut self, bot: usize, datagram: &[u8], to: SocketAddr) -> io::Result<usize>;
    fn ask_grant(&mut self, job: Job);
    /// Hands a checkpoint upload or fetch to a helper thread.
    fn checkpoint(&mut self, job: CkJob);
    /// Wall-clock ns since the epoch (DATA send timestamps, latency).
    fn wall_ns(&self) -> u64;
    /// Monotonic ns (the ledger's order of sends and leaves).
    fn mono_ns(&self) -> u64;
}

/// The bots' state machine: everything the loop mutates besides the bots,
/// with I/O and clocks behind [`Edge`], so it is deterministic under test.
pub(super) struct Ctx<'a, E: Edge> {
    pub(super) cfg: &'a BotsConfig,
    pub(super) ledger: Ledger,
    pub(super) edge: E,
    pub(super) latency: Histogram,
    pub(super) malformed: u64,
    pub(super) errors: Vec<String>,
    pub(super) error_count: u64,
    pub(super) buf: Vec<u8>,
    pub(super) sending: bool,
    /// False while `sync_start` holds DATA back.
    pub(super) released: bool,
    pub(super) ck: CheckpointTally,
    pub(super) fetch_ns_sum: u128,
}

impl<E: Edge> Ctx<'_, E> {
    pub(super) fn error(&mut self, bot: &mut Bot, msg: String) {
        bot.stats.errors += 1;
        self.error_count += 1;
        if self.errors.len() < MAX_MESSAGES {
            tracing::warn!("bot {}: {msg}", bot.player);
            self.errors.push(format!("bot {}: {msg}", bot.player));
        }
    }

    pub(super) fn ask_grant(&mut self, idx: usize, bot: &mut Bot) {
        bot.gen += 1;
        bot.http_busy = true;
        bot.ask_at = None;
        self.edge.ask_grant(Job {
            bot: idx,
            gen: bot.gen,
            player: bot.player,
            pos: bot.pos,
        });
    }

    pub(super) fn send_small(&mut self, bot: &mut Bot, tx: &Transmit) {
        match self.edge.send(bot.idx, tx.datagram.as_bytes(), tx.to) {
            Ok(_) => {}
            // Control datagrams are retried by their own timers.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => self.error(bot, format!("sendto {}: {e}", tx.to)),
        }
    }

    /// A new group: what the bot knew of the last one no longer applies.
    fn forget_group(&mut self, bot: &mut Bot) {
        bot.view.clear();
        self.ck.entries_unconfirmed += bot.check.len() as u64;
        bot.check.clear();
    }

    pub(super) fn start_join(&mut self, idx: usize, bot: &mut Bot, req: JoinRequest, now: Instant) {
        self.forget_group(bot);
        let mem = self.ledger.new_membership(idx, req.reflector);
        let cfg = client::Config {
            retry: JOIN_RETRY,
            give_up: None,
        };
        bot.state = State::InGroup {
            mem,
            session: Session::new(req, cfg, now),
        };
        self.token_received(bot);
        self.flush(bot);
    }

    /// Sends the JOIN step the bot's session has queued, if any (a session
    /// holds at most one).
    pub(super) fn flush(&mut self, bot: &mut Bot) {
        let State::InGroup { mem, session } = &mut bot.state else {
            return;
        };
        let mem = *mem;
        if let Some(tx) = session.poll_transmit() {
            self.send_small(bot, &tx);
            if tx.echoes_cookie {
                self.ledger.join_sent(mem);
            }
        }
    }

    /// Leaves the current group. `settle`: the LEAVE may overtake other
    /// bots' recent datagrams on the way (a move during the run); false at
    /// the end of the run, when the grace period has let everything arrive.
    pub(super) fn leave(&mut self, bot: &mut Bot, settle: bool) {
        if let State::InGroup { mem, mut session } = bot.state {
            if let Some(tx) = session.leave() {
                self.send_small(bot, &tx);
            }
            // After the LEAVE is sent: its order against other bots' sends
            // is what the reflector sees, up to the settle time.
            if settle {
                self.ledger.ended_at(mem, self.edge.mono_ns());
            } else {
                self.ledger.ended(mem);
            }
            bot.state = State::Idle;
            self.forget_group(bot);
        }
    }

    pub(super) fn on_grant(&mut self, idx: usize, bot: &mut Bot, res: JobResult, now: Instant) {
        if res.gen != bot.gen {
            return;
        }
        bot.http_busy = false;
        let grant = match res.result {
            Ok(t) => {
                bot.stats.grants += 1;
                t
            }
            Err(e) => {
                self.error(bot, e);
                if matches!(bot.state, State::Idle) {
                    bot.ask_at = Some(now + GRANT_RETRY);
                }
                return;
            }
        };
        let target = match join_request(&grant, bot.player) {
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
        match bot.state {
            State::InGroup { session, .. } if session.is_member() => {
                if session.request().reflector != target.reflector {
                    self.leave(bot, true);
                    bot.stats.group_changes += 1;
                    self.start_join(idx, bot, target, now);
                } else {
                    self.renew_with(bot, &target, now);
                }
            }
            State::Idle => self.start_join(idx, bot, target, now),
            // Grants are asked for only when Idle or a member.
            State::InGroup { .. } => {}
        }
    }

    /// Handles one received datagram; true if it was a control reply that
    /// may have made the bot due (DATA never changes a bot's timers).
    pub(super) fn on_datagram(
        &mut self,
        idx: usize,
        bot: &mut Bot,
        data: &[u8],
        src: SocketAddr,
        now: Instant,
    ) -> bool {
        let control = Packet::parse(data).is_ok_and(|p| p.kind() != Kind::Data);
        self.handle_datagram(idx, bot, data, src, now);
        control
    }

    pub(super) fn handle_datagram(&mut self, idx: usize, bot: &mut Bot, data: &[u8], src: SocketAddr, now: Instant) {
        let Ok(pkt) = Packet::parse(data) else {
            self.malformed += 1;
            return;
        };
        match pkt.kind() {
            Kind::Data => {
                let p = pkt.payload();
                if p.len() < PAYLOAD_MIN {
                    self.malformed += 1;
                    return;
                }
                let ts = u64::from_be_bytes(p[0..8].try_into().unwrap_or_default());
                let epoch = u32::from_be_bytes(p[8..12].try_into().unwrap_or_default());
                // The ledger's own DATA counter: the header's sequence number
                // also counts the sender's KEEPALIVEs and PROBE_REPLYs.
                let seq = u32::from_be_bytes(p[12..16].try_into().unwrap_or_default());
                if self.ledger.received(idx, epoch, seq) == Receipt::New {
                    let lat = self.edge.wall_ns().saturating_sub(ts);
                    self.latency.record(lat);
                    let s = &mut bot.stats;
                    s.lat_max_ns = s.lat_max_ns.max(lat);
                    s.lat_sum_ns += u128::from(lat);
                    s.lat_n += 1;
                }
                let current = matches!(&bot.state, State::InGroup { session, .. }
                    if session.request().reflector == src && session.request().group == pkt.group());
                if current {
                    let f32_at = |i: usize| f32::from_be_bytes(p[i..i + 4].try_into().unwrap_or_default());
                    let heard = PlayerState {
                        player: pkt.sender(),
                        x: f32_at(16),
                        y: f32_at(20),
                        moves: u32::from_be_bytes(p[24..28].try_into().unwrap_or_default()),
                    };
                    if let Some(entry) = bot.check.remove(&heard.player) {
                        match compare(&entry, heard.x, heard.y, heard.moves) {
                            Verdict::Matched => self.ck.entries_matched += 1,
                            Verdict::Moved => self.ck.entries_moved += 1,
                            Verdict::Mismatched => {
                                self.ck.mismatched += 1;
                                self.error(
                                    bot,
                                    format!("checkpoint entry {entry:?} contradicts the player's DATA {heard:?}"),
                                );
                            }
                        }
                    }
                    bot.view.insert(heard.player, heard);
                }
            }
            Kind::JoinChallenge | Kind::JoinAck | Kind::Error | Kind::Probe | Kind::CheckpointRequest => {
                let State::InGroup { mem, session } = &mut bot.state else {
                    return;
                };
                let (mem, group) = (*mem, session.request().group);
                let event = session.handle(now, src, &pkt);
                // Kept for a rejoin: the newest token and where the numbers got to.
                let again = session.rejoin_request();
                self.flush(bot);
                match event {
                    Some(Event::Joined(ack)) => {
                        self.ledger.joined(mem);
                        bot.stats.joins += 1;
                        if ack.checkpoint_port != 0 {
                            // Catch up on the game state (paper 000 §3).
                            self.checkpoint_job(idx, bot, mem, ack.checkpoint_port, CkOp::Fetch);
                        }
                        bot.keepalive = Duration::from_millis(u64::from(ack.keepalive_ms.max(50)));
                        bot.last_send = now;
                        bot.last_keepalive = now;
                        bot.next_send = now;
                    }
                    Some(Event::Restarted) => {
                        // Stale cookie (a slow round trip): the session
                        // starts over, as a new membership for the ledger.
                        self.ledger.join_failed(mem);
                        bot.stats.join_retries += 1;
                        if let State::InGroup { mem, session } = &mut bot.state {
                            *mem = self.ledger.new_membership(idx, session.request().reflector);
                        }
                    }
                    Some(Event::MembershipLost) => {
                        // ERROR(NotMember) cannot be authenticated: join again
                        // with the token and key held (sequence numbers going
                        // on), not with a new grant, which a forged error
                        // would otherwise turn into a lockout by the rate limit.
                        self.ledger.ended(mem);
                        self.error(bot, format!("group {group} forgot this member; joining again"));
                        self.start_join(idx, bot, again, now);
                    }
                    Some(Event::Failed(Failure::ExpiredToken)) => {
                        self.ledger.join_failed(mem);
                        bot.state = State::Idle;
                        if !bot.http_busy {
                            self.ask_grant(idx, bot);
                        }
                    }
                    Some(Event::Failed(f)) => {
                        self.ledger.join_failed(mem);
                        bot.state = State::Idle;
                        bot.ask_at = Some(now + GRANT_RETRY);
                        self.error(bot, format!("group {group}: {f}"));
                    }
                    Some(Event::CheckpointRequested { nonce }) => {
                        self.ck.requested += 1;
                        let port = match &bot.state {
                            State::InGroup { session, .. } => session.ack().map_or(0, |a| a.checkpoint_port),
                            State::Idle => 0,
                        };
                        let state = self.game_state(bot, group);
                        let tick = u64::from(bot.moves);
                        self.checkpoint_job(idx, bot, mem, port, CkOp::Upload { nonce, tick, state });
                    }
                    Some(Event::Renewed) => bot.stats.renewals += 1,
                    // The reflector ends the membership (MOVED, under the
                    // bot's key): a new grant for the same position, which
                    // names the reflector the cell is placed on now.
                    Some(Event::Moved(_)) => {
                        bot.stats.moves_asked += 1;
                        if !bot.http_busy {
                            self.ask_grant(idx, bot);
                        }
                    }
                    Some(Event::Retransmitted) | Some(Event::Probed) | None => {}
                }
            }
            _ => self.malformed += 1,
        }
    }

    /// Timers of one bot; returns when it next needs attention.
    pub(super) fn tick(
        &mut self,
        idx: usize,
        bot: &mut Bot,
        now: Instant,
        world: &WorldInfo,
        rng: &mut Rng,
    ) -> Instant {
        let far = now + Duration::from_secs(1);
        if !self.sending {
            return far;
        }
        match bot.state {
            State::Idle => {
                if !bot.http_busy {
                    match bot.ask_at {
                        Some(t) if t > now => return t,
                        _ => self.ask_grant(idx, bot),
                    }
                }
                far
            }
            State::InGroup { mem, mut session } if !session.is_member() => {
                let Some(due) = session.poll_timeout() else {
                    return far;
                };
                if now < due {
                    return due;
                }
                if session.handle_timeout(now) == Some(Event::Retransmitted) {
                    bot.stats.join_retries += 1;
                }
                bot.state = State::InGroup { mem, session };
                self.flush(bot);
                session.poll_timeout().unwrap_or(far)
            }
            State::InGroup { mem, mut session } => {
                if let Some(t) = bot.next_move {
                    if now >= t && !bot.http_busy {
                        let every = self.cfg.move_every.unwrap_or(Duration::from_secs(3600));
                        bot.next_move = Some(t + every);
                        bot.pos = step(bot.pos, world, rng.unit(), rng.unit());
                        bot.moves += 1;
                        let cell = cell_of(bot.pos, world);
                        if Some(cell) != bot.cell {
                            bot.stats.cell_changes += 1;
                            self.ask_grant(idx, bot);
                        }
                    }
                }
                let quota_left = self.cfg.max_datagrams.is_none_or(|m| bot.stats.sent < m);
                if self.released && quota_left && now >= bot.next_send {
                    self.send_data(bot, mem, &mut session, now);
                }
                // Every interval, whatever else is sent: with DATA tags off,
                // DATA is no sign of life.
                if now >= bot.last_keepalive + bot.keepalive {
                    if let Some(tx) = session.keepalive() {
                        self.send_small(bot, &tx);
                    }
                    bot.last_keepalive = now;
                }
                let renew_due = self.renew_tick(idx, bot, &mut session, now);
                // The session's sequence number moved on.
                bot.state = State::InGroup { mem, session };
                let mut next = bot.last_keepalive + bot.keepalive;
                if let Some(t) = renew_due {
                    next = next.min(t);
                }
                if self.released && quota_left {
                    next = next.min(bot.next_send);
                }
                if let Some(t) = bot.next_move {
                    next = next.min(t);
                }
                next
            }
        }
    }

    /// The group's state as this bot knows it, itself included, encoded
    /// with `wire`.
    fn game_state(&self, bot: &Bot, group: u16) -> bytes::Bytes {
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
        wire::to_archive(&state).map(|a| a.to_vec().into()).unwrap_or_default()
    }

    fn checkpoint_job(&mut self, idx: usize, bot: &mut Bot, mem: MemId, port: u16, op: CkOp) {
        let State::InGroup { session, .. } = &bot.state else {
            return;
        };
        let (Some(membership), true) = (session.membership(), port != 0) else {
            return;
        };
        let req = session.request();
        self.edge.checkpoint(CkJob {
            bot: idx,
            mem,
            addr: SocketAddr::new(req.reflector.ip(), port),
            group: req.group,
            player: req.player,
            membership,
            keys: req.keys,
            op,
        });
    }

    /// A helper thread's answer: counted; a fetched checkpoint of the bot's
    /// current membership is kept to be checked against the DATA to come.
    pub(super) fn on_checkpoint(&mut self, bot: &mut Bot, res: CkResult) {
        let current = matches!(&bot.state, State::InGroup { mem, .. } if *mem == res.mem);
        match res.outcome {
            Ok(CkDone::Uploaded) => self.ck.uploaded += 1,
            Ok(CkDone::Fetched(None)) => self.ck.fetched_empty += 1,
            Ok(CkDone::Fetched(Some(f))) => {
                self.ck.fetched += 1;
                self.ck.bytes_fetched += f.state.len() as u64;
                let ms = res.took.as_secs_f64() * 1e3;
                self.fetch_ns_sum += res.took.as_nanos();
                self.ck.fetch_ms_max = self.ck.fetch_ms_max.max(ms);
                let group = match &bot.state {
                    State::InGroup { session, .. } => session.request().group,
                    State::Idle => 0,
                };
                match wire::from_bytes::<GameState>(&f.state) {
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
            }
            // An upload for a membership the bot has left since it was
            // asked (it moved on): the reflector rightly no longer knows
            // that membership; nothing was lost.
            Err(e) if !res.fetch && !current && e.refusal() == Some(Refusal::NotMember) => {
                self.ck.uploads_overtaken += 1;
            }
            // An upload whose request the reflector no longer holds: it keeps
            // its group's last two, and newer ones (to this bot or to other
            // members) replaced it while the upload waited on a busy
            // machine. A newer checkpoint stands; nothing was lost.
            Err(e) if !res.fetch && e.refusal() == Some(Refusal::NotRequested) => {
                self.ck.uploads_overtaken += 1;
            }
            Err(e) => {
                if res.fetch {
                    self.ck.fetch_errors += 1;
                } else {
                    self.ck.upload_errors += 1;
                }
                self.error(
                    bot,
                    format!("checkpoint {}: {e}", if res.fetch { "fetch" } else { "upload" }),
                );
            }
        }
    }

    pub(super) fn send_data(&mut self, bot: &mut Bot, mem: MemId, session: &mut Session, now: Instant) {
        let seq = self.ledger.sent(mem);
        let size = self.cfg.size;
        let target = *session.request();
        let p = DATA_PAYLOAD;
        self.buf[p..p + 8].copy_from_slice(&self.edge.wall_ns().to_be_bytes());
        self.buf[p + 8..p + 12].copy_from_slice(&mem.to_be_bytes());
        self.buf[p + 12..p + 16].copy_from_slice(&seq.to_be_bytes());
        self.buf[p + 16..p + 20].copy_from_slice(&(bot.pos.0 as f32).to_be_bytes());
        self.buf[p + 20..p + 24].copy_from_slice(&(bot.pos.1 as f32).to_be_bytes());
        self.buf[p + 24..p + 28].copy_from_slice(&bot.moves.to_be_bytes());
        // size was validated against MAX_DATAGRAM and the buffer has that size.
        match session.seal_data(size - DATA_PAYLOAD, &mut self.buf) {
            Some(Ok(n)) if n == size => {}
            _ => return,
        }
        match self.edge.send(bot.idx, &self.buf[..size], target.reflector) {
            Ok(_) => {
                // Count it only once it is really sent.
                self.ledger.next_seq_at(mem, self.edge.mono_ns());
                bot.stats.sent += 1;
                bot.last_send = now;
                let period = Duration::from_secs_f64(1.0 / self.cfg.rate_hz);
                bot.next_send += period;
                if bot.next_send + period < now {
                    // Far behind (a stall): do not burst to catch up.
                    bot.next_send = now + period;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Socket buffer full: try again on the next pass, same seq.
            }
            Err(e) => {
                self.error(bot, format!("sendto {}: {e}", target.reflector));
                bot.next_send += Duration::from_secs_f64(1.0 / self.cfg.rate_hz);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::{Secret, TokenClaims};
    use reflector_proto::control::JoinGrant;
    use reflector_server::membership::{Event as GroupEvent, Group, Keys, Now, Policy};

    /// Records what the bots send and ask for; its clocks are set by the test.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<(usize, Vec<u8>, SocketAddr)>,
        jobs: Vec<(usize, u64, u32)>,
        ck: Vec<CkJob>,
        wall_ns: u64,
        mono_ns: u64,
    }

    impl Edge for Recorder {
        fn send(&mut self, bot: usize, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
            self.sent.push((bot, datagram.to_vec(), to));
            Ok(datagram.len())
        }
        fn ask_grant(&mut self, job: Job) {
            self.jobs.push((job.bot, job.gen, job.player));
        }
        fn checkpoint(&mut self, job: CkJob) {
            self.ck.push(job);
        }
        fn wall_ns(&self) -> u64 {
            self.wall_ns
        }
        fn mono_ns(&self) -> u64 {
            self.mono_ns
        }
    }

    const T0_MS: u64 = 1_700_000_000_000;

    /// One bot against a real group (the reflector's pure membership core):
    /// it asks for a join grant, joins in two steps, sends DATA at its rate with
    /// the edge's timestamps, and leaves — all on an injected clock.
    #[test]
    fn a_bot_asks_joins_sends_at_its_rate_and_leaves_deterministically() {
        let mut cfg = BotsConfig::new("http://control.invalid", 1);
        cfg.move_every = None;
        let world = WorldInfo {
            grid: [1, 1],
            cell_size: 100.0,
            size: [100.0, 100.0],
        };
        let keys = Keys {
            token_secret: Secret::new(&[7; 32]).unwrap().into(),
            reflector_id: 0,
            cookie_key: Secret::new(&[8; 32]).unwrap(),
        };
        let policy = Policy {
            checkpoint_port: 4100,
            ..Policy::default()
        };
        let mut group = Group::new(4000);
        let reflector: SocketAddr = "10.0.0.1:4000".parse().unwrap();
        let me: SocketAddr = "10.0.0.2:5555".parse().unwrap();
        let start = Instant::now();
        let mut ctx = Ctx {
            cfg: &cfg,
            ledger: Ledger::with_settle(1, 0),
            edge: Recorder {
                wall_ns: T0_MS * 1_000_000,
                ..Default::default()
            },
            latency: Histogram::default(),
            malformed: 0,
            errors: Vec::new(),
            error_count: 0,
            buf: vec![0u8; 2048],
            sending: true,
            released: true,
            ck: CheckpointTally::default(),
            fetch_ns_sum: 0,
        };
        let mut bot = Bot {
            player: 42,
            idx: 0,
            pos: (50.0, 50.0),
            cell: None,
            state: State::Idle,
            gen: 0,
            http_busy: false,
            ask_at: None,
            next_move: None,
            next_send: start,
            last_send: start,
            last_keepalive: start,
            keepalive: Duration::from_secs(2),
            renew_ask_at: None,
            stats: BotStats::default(),
            moves: 0,
            view: HashMap::new(),
            check: HashMap::new(),
        };
        let mut rng = Rng(1);
        ctx.tick(0, &mut bot, start, &world, &mut rng);
        assert_eq!(ctx.edge.jobs, vec![(0, 1, 42)]);
        let token = TokenClaims {
            player: 42,
            reflector: 0,
            group: 4000,
            expires_unix_s: T0_MS / 1000 + 60,
        }
        .sign(&keys.token_secret.current);
        let grant = JoinGrant {
            player: 42,
            cell: [0, 0],
            reflector: reflector.to_string(),
            reflector_id: 0,
            group: 4000,
            token: hex::encode(token),
            session_key: hex::encode(
                reflector_proto::protocol::SessionKeys::derive(&keys.token_secret.current, &token).session,
            ),
            expires_unix_s: T0_MS / 1000 + 60,
        };
        ctx.on_grant(
            0,
            &mut bot,
            JobResult {
                bot: 0,
                gen: 1,
                result: Ok(grant),
                refused: None,
            },
            start,
        );
        // Two round trips with the group: challenge, then ack.
        let now = Now {
            unix_ms: T0_MS,
            mono_ms: 1,
            mono_us: 1_000,
        };
        for expect in [GroupEvent::Challenged, GroupEvent::Joined { rejoin: false }] {
            let (_, join, to) = ctx.edge.sent.pop().expect("a JOIN was sent");
            assert_eq!(to, reflector);
            let out = group.handle(&keys, &policy, now, me, &join);
            assert_eq!(out.event, expect);
            ctx.on_datagram(0, &mut bot, out.reply.unwrap().as_bytes(), reflector, start);
        }
        assert!(bot.state.is_member());
        assert_eq!(bot.stats.joins, 1);
        // The joiner fetches the group's checkpoint from the announced port.
        let fetch = ctx.edge.ck.pop().expect("a checkpoint fetch");
        assert!(matches!(fetch.op, CkOp::Fetch));
        assert_eq!(fetch.addr, "10.0.0.1:4100".parse().unwrap());
        assert_eq!((fetch.group, fetch.player), (4000, 42));
        // DATA at 10 Hz: one now, none 50 ms later, the next at 100 ms.
        for (ms, sends) in [(0, 1), (50, 1), (100, 2)] {
            ctx.edge.wall_ns = (T0_MS + ms) * 1_000_000;
            ctx.tick(0, &mut bot, start + Duration::from_millis(ms), &world, &mut rng);
            assert_eq!(ctx.edge.sent.len(), sends, "at {ms} ms");
        }
        for (k, (_, d, to)) in ctx.edge.sent.iter().enumerate() {
            let p = Packet::parse(&d[..]).unwrap();
            let number = u32::from_be_bytes(p.payload()[12..16].try_into().unwrap());
            assert_eq!((p.kind(), number, *to, d.len()), (Kind::Data, k as u32, reflector, 100));
            let stamp = u64::from_be_bytes(p.payload()[..8].try_into().unwrap());
            assert_eq!(stamp, (T0_MS + 100 * k as u64) * 1_000_000);
            // The group forwards it: the bot is a member there.
            assert!(matches!(
                group.handle(&keys, &policy, now, me, d).event,
                GroupEvent::Forward { .. }
            ));
        }
        let last_seq = Packet::parse(&ctx.edge.sent.last().expect("DATA sent").1[..])
            .unwrap()
            .seq();
        // Asked for a checkpoint, the bot uploads its view with the nonce.
        let (_, nonce, req) = group.checkpoint_request(&keys, 0, 2).expect("a member to ask");
        ctx.on_datagram(0, &mut bot, req.as_bytes(), reflector, start);
        let up = ctx.edge.ck.pop().expect("an upload");
        let CkOp::Upload { nonce: n, tick, state } = &up.op else {
            panic!("not an upload")
        };
        assert_eq!((*n, *tick), (nonce, 0));
        let gs: GameState = wire::from_bytes(state).unwrap();
        assert_eq!(gs.group, 4000);
        assert_eq!(
            gs.players,
            vec![PlayerState {
                player: 42,
                x: 50.0,
                y: 50.0,
                moves: 0
            }]
        );
        // A fetched checkpoint is checked against the DATA that follows:
        // player 7 at the same move count must be where it says.
        let mem = match bot.state {
            State::InGroup { mem, .. } => mem,
            State::Idle => unreachable!(),
        };
        let fetched = GameState {
            group: 4000,
            players: vec![
                PlayerState {
                    player: 7,
                    x: 1.0,
                    y: 2.0,
                    moves: 3,
                },
                PlayerState {
                    player: 8,
                    x: 1.0,
                    y: 2.0,
                    moves: 3,
                },
            ],
        };
        ctx.on_checkpoint(
            &mut bot,
            CkResult {
                bot: 0,
                mem,
                fetch: true,
                took: Duration::from_millis(3),
                outcome: Ok(CkDone::Fetched(Some({
                    let state: bytes::Bytes = wire::to_archive(&fetched).unwrap().to_vec().into();
                    reflector_proto::checkpoint::Fetched {
                        seq: 1,
                        tick: 3,
                        age_ms: 0,
                        from_player: 7,
                        digest: reflector_proto::checkpoint::digest(&state),
                        state,
                    }
                }))),
            },
        );
        assert_eq!((ctx.ck.fetched, bot.check.len()), (1, 2));
        for (player, x, moves) in [(7u32, 1.0f32, 3u32), (8, 5.0, 3)] {
            let mut d = vec![0u8; 100];
            let p = DATA_PAYLOAD;
            d[p + 16..p + 20].copy_from_slice(&x.to_be_bytes());
            d[p + 20..p + 24].copy_from_slice(&2.0f32.to_be_bytes());
            d[p + 24..p + 28].copy_from_slice(&moves.to_be_bytes());
            let h = reflector_proto::protocol::Header {
                kind: Kind::Data,
                group: 4000,
                sender: player,
                membership: 1,
                seq: 1,
            };
            reflector_proto::protocol::seal(&h, 100, None, &mut d).unwrap();
            ctx.on_datagram(0, &mut bot, &d, reflector, start);
        }
        assert_eq!((ctx.ck.entries_matched, ctx.ck.mismatched), (1, 1));
        assert!(bot.check.is_empty());
        ctx.edge.sent.clear();
        // An ERROR(NotMember) (forgeable: it carries no MAC) makes the bot
        // join again with the token and key it holds, numbers going on; it
        // does not ask the control server for a new grant.
        let jobs_before = ctx.edge.jobs.len();
        let forged = reflector_proto::protocol::SmallDatagram::error(
            4000,
            42,
            0,
            reflector_proto::protocol::ErrorCode::NotMember,
        );
        ctx.on_datagram(0, &mut bot, forged.as_bytes(), reflector, start);
        assert_eq!(ctx.edge.jobs.len(), jobs_before, "no new grant asked for");
        let (_, join, _) = ctx.edge.sent.pop().expect("a JOIN again");
        let join = Packet::parse(&join[..]).unwrap();
        assert_eq!(join.kind(), Kind::Join);
        assert_eq!(join.join_token(), Some(&token));
        assert!(join.seq() > last_seq);
        // The group still has it (the error was forged): the JOIN is fresh
        // in its window, so the same membership is confirmed.
        let out = group.handle(&keys, &policy, now, me, join.as_bytes());
        assert_eq!(out.event, GroupEvent::Challenged);
        ctx.on_datagram(0, &mut bot, out.reply.unwrap().as_bytes(), reflector, start);
        let (_, echo, _) = ctx.edge.sent.pop().expect("the echo");
        let out = group.handle(&keys, &policy, now, me, &echo);
        assert_eq!(out.event, GroupEvent::Joined { rejoin: true });
        ctx.on_datagram(0, &mut bot, out.reply.unwrap().as_bytes(), reflector, start);
        assert!(bot.state.is_member());
        ctx.edge.sent.clear();
        ctx.leave(&mut bot, false);
        let (_, leave, _) = ctx.edge.sent.pop().expect("a LEAVE");
        assert_eq!(group.handle(&keys, &policy, now, me, &leave).event, GroupEvent::Left);
        assert!(matches!(bot.state, State::Idle));
        // Two errors reported: the contradicting checkpoint entry, and the
        // group forgot it (and it joined again).
        assert_eq!((bot.stats.sent, ctx.error_count), (2, 2));
    }
}
