//! The reflector's bots (`reflector bots`): simulated players that get
//! their group from the control server, join with the two-step JOIN, move
//! across cells (LEAVE + JOIN), send position updates at a game profile,
//! and measure what they receive.
//!
//! Each bot is a player on the project's client (`reflector_client::Client`,
//! over a UDP socket the bots make, in the bot's network namespace with
//! `--netns`), which does all a member does: the JOIN, keepalives, PROBE
//! answers, rejoins, renewal, moves make-before-break, checkpoints. All
//! bots live in one process and are driven by ONE thread with epoll over
//! their sockets; a bot's client is updated when its socket is readable or
//! its next deadline (`Client::next_update`) has come, never on every
//! wake-up. HTTP to the control server runs on two helper threads so a
//! slow answer never stalls the data path; its tokens are handed to the
//! clients. In sealed groups each client refreshes its epoch keys itself
//! (`/keys` on its own helper thread, `Config::keys_from`) between
//! renewals, and signs the checkpoints it uploads: each client is made
//! before its first `/join` so that every `/join` for it carries its
//! signing key (`sign_key`), and each grant's certificate is handed in
//! with the grant's token.
//!
//! Because every bot is in this process, the [`Ledger`] knows exactly who
//! was in which group when, so the expected deliveries are known and loss is
//! exact (see `ledger.rs` for why). DATA payload layout (after the
//! 16-byte header, whose `seq` is the per-membership sequence number):
//!
//! | bytes | field |
//! |-------|-------|
//! | 0..8  | send time, CLOCK_REALTIME ns since the epoch, big endian |
//! | 8..12 | epoch: the sender's membership id, big endian |
//! | 12..16 | the ledger's DATA number, big endian |
//! | 16..24 | the sender's position x, y: f32, big endian |
//! | 24..28 | the sender's move count, big endian |
//! | 28..  | filler up to `--size` |
//!
//! Positions and move counts make the bots' game state: each bot keeps the
//! players of its group as it hears them, uploads that when the reflector
//! asks for a checkpoint, and checks a fetched checkpoint against the DATA
//! that follows (see `checkpoints.rs`).
//!
//! The bots speak to the control server through the types it answers with
//! (`reflector_proto::control`) and sign their player tickets with
//! `reflector_proto::ticket`; they depend on neither the control server nor
//! the data plane. The client tells them, in its membership log, when each
//! confirming JOIN and LEAVE went out, which is what the ledger needs.
#![deny(unsafe_code)]

mod bot;
mod checkpoints;
mod config;
mod grants;
mod hist;
mod ledger;
mod report;
mod windows;
mod world;

pub use checkpoints::{CheckpointTally, GameState, PlayerState};
pub use config::{BotsArgs, BotsConfig, BotsError};
pub use grants::fetch_world;
pub use hist::Histogram;
pub use ledger::{Ledger, LostSend, MemId, Receipt, Tally};
pub use report::{BotReport, BotsReport, Latency, SealedTally};
pub use windows::{LostDatagram, MoveWindow, WindowCause, WindowEnd};

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

use bot::{Bot, Ctx, CHECKPOINT_FD, CHECKPOINT_SLOTS};
use grants::{http_worker, Job, JobResult};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use reflector_proto::protocol::{DATA_PAYLOAD, MAX_DATAGRAM_KERNEL};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use world::Rng;

/// Payload bytes the bots need: timestamp, epoch (membership), DATA number,
/// position and move count.
const PAYLOAD_MIN: usize = 28;
/// With `--marker`: the run's 8-byte prefix, the player id and the bot's
/// own DATA count (both big-endian u32), right after the fields above, so
/// that every payload carries bytes no other payload carries and a byte
/// scan of a capture finds the prefix wherever a payload crossed in clear.
pub const MARKER_LEN: usize = 16;
/// Where the marker starts in the game data.
const MARKER_AT: usize = PAYLOAD_MIN;
/// Smallest `--size` with `--marker`.
pub const MIN_SIZE_MARKED: usize = MIN_SIZE + MARKER_LEN;
/// Smallest DATA that holds the bots' fields and the marker in a sealed
/// group (instance id, sealed header and AEAD tag around the game data):
/// a smaller `--size` grows to it there.
pub const MIN_SIZE_SEALED_MARKED: usize = reflector_proto::sealed::SEALED_MIN + PAYLOAD_MIN + MARKER_LEN;
/// Smallest `--size`.
pub const MIN_SIZE: usize = DATA_PAYLOAD + PAYLOAD_MIN;
/// Largest `--size`: one Ethernet frame's UDP payload, the most the client
/// sends (a larger DATA would be fragmented to every member).
pub const MAX_SIZE: usize = MAX_DATAGRAM_KERNEL;
/// A JOIN step unanswered for this long is sent again.
const JOIN_RETRY: Duration = Duration::from_millis(250);
/// Pause before asking the control server again after a failure.
const GRANT_RETRY: Duration = Duration::from_millis(500);
/// The event loop wakes at least this often (HTTP answers arrive on a channel).
const MAX_WAIT_MS: u16 = 5;
/// In the grace period, how often to check whether anything is still missing.
const MISSING_CHECK: Duration = Duration::from_millis(20);
/// Error messages kept for the report (the count is always exact).
const MAX_MESSAGES: usize = 20;
/// Lost datagrams listed one by one in the report (the count is always
/// exact): enough for a fleet lab's failures, bounded for a broken run.
const MAX_LOST_LISTED: usize = 200_000;

/// The namespace a thread started in, entered again when this drops.
struct HomeNs(oskit::netns::NetNs);

impl Drop for HomeNs {
    fn drop(&mut self) {
        if let Err(e) = self.0.enter_on_this_thread() {
            tracing::error!("bots: cannot return to this thread's own network namespace: {e}");
        }
    }
}

/// One socket per bot: lift the soft open-file limit towards the hard one
/// if the default (often 1024) is too small.
fn raise_fd_limit(need: u64) -> Result<(), BotsError> {
    match oskit::rlimit::raise_nofile_limit(need) {
        Ok(soft) if soft >= need => Ok(()),
        Ok(soft) => Err(BotsError::Config(format!(
            "{need} open files needed (one socket per bot) but the hard limit is {soft}: \
             use fewer bots or raise it (ulimit -Hn, as root)"
        ))),
        Err(source) => Err(BotsError::Socket {
            call: "setrlimit(RLIMIT_NOFILE)",
            source,
        }),
    }
}

/// Runs the bots: join, send and move for `cfg.duration`, then wait for
/// datagrams in flight (up to `cfg.grace`), leave, and report. `stop`
/// ends the sending phase early.
pub fn run_bots(cfg: &BotsConfig, stop: &AtomicBool) -> Result<BotsReport, BotsError> {
    cfg.validate()?;
    let world = grants::fetch_world_any(&cfg.controls())?;
    if world.grid[0] == 0 || world.grid[1] == 0 || world.cell_size.is_nan() || world.cell_size <= 0.0 {
        return Err(BotsError::Control {
            url: cfg.control.clone(),
            msg: format!("/world describes an empty world: {world:?}"),
        });
    }
    // A socket per bot, and while it fetches or uploads a checkpoint, a
    // TCP socket.
    raise_fd_limit(2 * cfg.count as u64 + 64)?;
    let mut rng = Rng(cfg.seed);
    let sock_err = |call| move |source| BotsError::Socket { call, source };
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| BotsError::Loop {
        call: "epoll_create",
        source: e.into(),
    })?;
    let namespaces = cfg
        .netns
        .iter()
        .map(|n| {
            oskit::netns::NetNs::open(n)
                .map_err(io::Error::from)
                .map_err(sock_err("open network namespace (needs root; see `ip netns list`)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // The loop's thread enters the bots' namespaces to make checkpoint
    // sockets there; it is back in its own when this function returns.
    let _home = match namespaces.is_empty() {
        true => None,
        false => Some(HomeNs(
            oskit::netns::NetNs::open("/proc/thread-self/ns/net")
                .map_err(io::Error::from)
                .map_err(sock_err("open this thread's network namespace"))?,
        )),
    };
    let start = Instant::now();
    let mut bots = Vec::with_capacity(cfg.count);
    for i in 0..cfg.count {
        let bind = || UdpSocket::bind(SocketAddr::new(cfg.bind, 0));
        let sock = match namespaces.get(i % namespaces.len().max(1)) {
            Some(ns) => ns.run(bind).map_err(io::Error::from).map_err(sock_err("setns"))?,
            None => bind(),
        }
        .map_err(sock_err("bind"))?;
        sock.set_nonblocking(true).map_err(sock_err("fcntl(O_NONBLOCK)"))?;
        oskit::sockopt::set_buffers(&sock, cfg.rcvbuf, 256 << 10)
            .map_err(io::Error::from)
            .map_err(sock_err("setsockopt(SO_RCVBUF)"))?;
        // The client keeps this socket (and descriptor) for the whole run:
        // the bots never rebind.
        epoll
            .add(sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| BotsError::Loop {
                call: "epoll_ctl",
                source: e.into(),
            })?;
        let pos = (
            (rng.unit() * world.size[0]).min(world.size[0] * (1.0 - 1e-9)),
            (rng.unit() * world.size[1]).min(world.size[1] * (1.0 - 1e-9)),
        );
        let player = cfg.first_player.wrapping_add(i as u32);
        let client = bot::new_client(cfg, player, sock)
            .map_err(|e| BotsError::Config(format!("bot {player}: its client could not start: {e}")))?;
        let mut bot = Bot::new(player, i, pos, client, start);
        // Spread first moves so bots do not act in lockstep.
        bot.next_move = cfg.move_every.map(|m| start + m.mul_f64(0.5 + rng.unit()));
        bots.push(bot);
    }
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (res_tx, res_rx) = mpsc::channel::<JobResult>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let mut workers = Vec::new();
    let minter = match &cfg.ticket_keys {
        Some(p) => Some(Arc::new(
            reflector_proto::ticket::TicketMinter::from_file(p).map_err(|e| BotsError::Config(e.to_string()))?,
        )),
        None => None,
    };
    for w in 0..2 {
        let (c, m, j, r) = (cfg.controls(), minter.clone(), Arc::clone(&job_rx), res_tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("bots-http-{w}"))
            .spawn(move || http_worker(c, m, j, r))
            .map_err(|source| BotsError::Loop {
                call: "spawn HTTP thread",
                source,
            })?;
        workers.push(h);
    }
    drop(res_tx);
    let mut ctx = Ctx {
        cfg,
        ledger: Ledger::with_settle(cfg.count, u64::try_from(cfg.settle.as_nanos()).unwrap_or(u64::MAX)),
        latency: Histogram::default(),
        malformed: 0,
        markers: 0,
        errors: Vec::new(),
        error_count: 0,
        buf: vec![0u8; MAX_DATAGRAM_KERNEL],
        sending: true,
        released: !cfg.sync_start,
        ck: CheckpointTally::default(),
        fetch_ns_sum: 0,
        jobs: Some(job_tx),
        namespaces: &namespaces,
        epoll: &epoll,
        in_netns: None,
        ck_free: CHECKPOINT_SLOTS,
        ck_queue: Default::default(),
        windows: windows::Windows::new(bots.iter().map(|b| b.player).collect()),
    };
    let mut events = vec![EpollEvent::empty(); 256];
    let send_end = start + cfg.duration;
    let mut drain_start: Option<Instant> = None;
    let mut next_missing_check = start;
    let mut next_progress = start + Duration::from_secs(5);
    let mut next_due = start;
    loop {
        let now = Instant::now();
        if ctx.sending && (now >= send_end || stop.load(Relaxed)) {
            ctx.sending = false;
            drain_start = Some(now);
        }
        if let Some(d) = drain_start {
            // Done when nothing required is still missing; with real loss,
            // after the grace period.
            if now >= d + cfg.grace {
                break;
            }
            if now >= next_missing_check {
                if ctx.ledger.missing() == 0 {
                    break;
                }
                next_missing_check = now + MISSING_CHECK;
            }
        }
        while let Ok(res) = res_rx.try_recv() {
            if let (Some(status), Err(msg)) = (res.refused, &res.result) {
                return Err(BotsError::Ticket {
                    status,
                    msg: msg.clone(),
                    keys: cfg.ticket_keys.clone(),
                });
            }
            if let Some(bot) = bots.get_mut(res.bot) {
                ctx.on_grant(bot, res, now);
                // A new client, or a new join, has its timers to schedule.
                bot.client_due = Some(now);
                bot.recheck = true;
                next_due = now;
            }
        }
        if ctx.sending
            && cfg
                .max_datagrams
                .is_some_and(|m| bots.iter().all(|b| b.stats.sent >= m))
        {
            ctx.sending = false;
            drain_start = Some(now);
        }
        if !ctx.released && bots.iter().all(Bot::is_member) {
            ctx.released = true;
            for b in bots.iter_mut() {
                b.next_send = now;
                b.due = now;
            }
            next_due = now;
        }
        // Checkpoint exchanges that waited for a slot, in order.
        while ctx.ck_free > 0 {
            let Some(i) = ctx.ck_queue.pop_front() else { break };
            if let Some(bot) = bots.get_mut(i) {
                bot.ck_queued = false;
                ctx.start_exchanges(bot);
                bot.client_due = Some(now);
                next_due = now;
            }
        }
        if now >= next_due {
            let mut due = now + Duration::from_secs(1);
            for bot in bots.iter_mut() {
                if now >= bot.next_due() {
                    ctx.service(bot, now, false, &world, &mut rng);
                }
                due = due.min(bot.next_due());
            }
            next_due = due;
        }
        if cfg.progress && now >= next_progress {
            next_progress += Duration::from_secs(5);
            let members = bots.iter().filter(|b| b.is_member()).count();
            eprintln!(
                "bots: {:>5.1} s, {members}/{} members, {} datagrams received",
                now.duration_since(start).as_secs_f64(),
                bots.len(),
                ctx.latency.count()
            );
        }
        let wait_ms = next_due
            .saturating_duration_since(Instant::now())
            .as_micros()
            .div_ceil(1000)
            .min(u128::from(MAX_WAIT_MS)) as u16;
        let n = match epoll.wait(&mut events, EpollTimeout::from(wait_ms)) {
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR) => 0,
            Err(e) => {
                return Err(BotsError::Loop {
                    call: "epoll_wait",
                    source: e.into(),
                })
            }
        };
        let now = Instant::now();
        // Receiving first, for every bot named; then their timers.
        for ev in &events[..n] {
            let i = (ev.data() & !CHECKPOINT_FD) as usize;
            let Some(bot) = bots.get_mut(i) else { continue };
            ctx.update_client(bot, now);
        }
        for ev in &events[..n] {
            let i = (ev.data() & !CHECKPOINT_FD) as usize;
            let Some(bot) = bots.get_mut(i) else { continue };
            next_due = next_due.min(ctx.service(bot, now, false, &world, &mut rng));
        }
    }
    // Leave cleanly; the ledger closes what is still open.
    ctx.sending = false;
    for bot in bots.iter_mut() {
        ctx.leave(bot);
    }
    ctx.jobs = None;
    // Helper threads end when the job channel closes (after any HTTP call
    // in progress, which has its own timeout).
    for w in workers {
        let _ = w.join();
    }
    let tallies = ctx.ledger.finish();
    let players: Vec<u32> = bots.iter().map(|b| b.player).collect();
    let lost_datagrams: Vec<LostDatagram> = ctx
        .ledger
        .lost_sends(MAX_LOST_LISTED)
        .into_iter()
        .map(|l| LostDatagram {
            sender: players[l.sender_bot],
            receiver: players[l.receiver_bot],
            sent_ns: l.sent_ns,
        })
        .collect();
    let move_windows = std::mem::take(&mut ctx.windows).finish(|m| ctx.ledger.group_of(m));
    let mut total = Tally::default();
    let mut per_bot = Vec::with_capacity(bots.len());
    let (mut joins, mut retries, mut gchanges) = (0, 0, 0);
    let mut sealed = SealedTally::default();
    for (bot, t) in bots.iter().zip(&tallies) {
        let mut t = *t;
        let client = bot.client.as_ref().map(|c| c.stats()).unwrap_or_default();
        // What the client dropped before the ledger could see it: DATA of
        // a group it was not a member of (outside every window), and
        // second copies (its streams drop them).
        t.unexpected += client.data_not_member;
        t.duplicates += client.streams.duplicates;
        sealed.add(&client);
        ctx.malformed += client.ignored - client.data_not_member;
        total.add(&t);
        let s = &bot.stats;
        joins += s.joins;
        retries += client.join_retries;
        gchanges += s.group_changes;
        if s.joins == 0 {
            ctx.error_count += 1;
            if ctx.errors.len() < MAX_MESSAGES {
                ctx.errors.push(if s.grants == 0 {
                    format!(
                        "bot {} never got a join token from the control server (its answers are in the errors above)",
                        bot.player
                    )
                } else {
                    format!(
                        "bot {} never joined a group (is the reflector running, with the control server's secret?)",
                        bot.player
                    )
                });
            }
        }
        per_bot.push(BotReport {
            player: bot.player,
            tally: t,
            lost: t.lost(),
            joins: s.joins,
            join_retries: client.join_retries,
            renewals: s.renewals,
            cell_changes: s.cell_changes,
            group_changes: s.group_changes,
            errors: s.errors,
            latency_max_us: s.lat_max_ns as f64 / 1e3,
            latency_mean_us: if s.lat_n > 0 {
                (s.lat_sum_ns / u128::from(s.lat_n)) as f64 / 1e3
            } else {
                0.0
            },
        });
    }
    Ok(BotsReport {
        bots: bots.len(),
        duration_s: cfg.duration.as_secs_f64(),
        rate_hz: cfg.rate_hz,
        size: cfg.size,
        move_every_s: cfg.move_every.map_or(0.0, |d| d.as_secs_f64()),
        lost: total.lost(),
        total,
        joins,
        join_retries: retries,
        group_changes: gchanges,
        latency: Latency {
            count: ctx.latency.count(),
            p50_us: ctx.latency.quantile(0.5) as f64 / 1e3,
            p99_us: ctx.latency.quantile(0.99) as f64 / 1e3,
            max_us: ctx.latency.max() as f64 / 1e3,
        },
        malformed: ctx.malformed,
        markers_received: ctx.markers,
        checkpoints: CheckpointTally {
            fetch_ms_mean: if ctx.ck.fetched > 0 {
                ctx.fetch_ns_sum as f64 / ctx.ck.fetched as f64 / 1e6
            } else {
                0.0
            },
            ..ctx.ck
        },
        sealed,
        error_count: ctx.error_count,
        errors: ctx.errors,
        per_bot,
        move_windows,
        lost_datagrams,
    })
}

/// `reflector bots`.
pub fn run(args: BotsArgs, stop: Arc<AtomicBool>) -> Result<i32, CliError> {
    let cfg = BotsConfig::try_from(&args)?;
    if !args.quiet {
        eprintln!(
            "bots: {} bots against {} for {:.1} s ({} Hz x {} B)",
            cfg.count,
            cfg.control,
            cfg.duration.as_secs_f64(),
            cfg.rate_hz,
            cfg.size
        );
    }
    let report = run_bots(&cfg, &stop)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table(args.per_bot || report.bots <= 20));
    }
    Ok(report.exit_code())
}
