//! Bots: simulated players that get their group from the control server,
//! join with the two-step JOIN, move across cells (LEAVE + JOIN), send
//! position updates at a game profile, and measure what they receive.
//!
//! All bots live in one process and are driven by ONE thread with epoll
//! over their sockets (one UDP socket per bot, unconnected so late
//! datagrams of a group just left still count); HTTP to the control server
//! runs on two helper threads so a slow answer never stalls the data path.
//!
//! Because every bot is in this process, the [`Ledger`] knows exactly who
//! was in which group when, so the expected deliveries are known and loss is
//! exact (see `bots/ledger.rs` for why). DATA payload layout (after the
//! 16-byte header, whose `seq` is the per-membership sequence number):
//!
//! | bytes | field |
//! |-------|-------|
//! | 0..8  | send time, CLOCK_REALTIME ns since the epoch, big endian |
//! | 8..12 | epoch: the sender's membership id, big endian |
//! | 12..  | filler up to `--size` |

mod hist;
mod ledger;

pub use hist::Histogram;
pub use ledger::{Ledger, MemId, Receipt, Tally};

use crate::control::{Ticket, WorldInfo};
use crate::CliError;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use reflector_proto::client::{self, Event, Failure, JoinRequest, Session, Transmit};
use reflector_proto::protocol::{write_header, Header, Kind, Packet, HEADER_LEN, MAX_DATAGRAM, TOKEN_LEN};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Payload bytes the bots need: timestamp and epoch.
const PAYLOAD_MIN: usize = 12;
/// Smallest `--size`.
pub const MIN_SIZE: usize = HEADER_LEN + PAYLOAD_MIN;
/// A JOIN step unanswered for this long is sent again.
const JOIN_RETRY: Duration = Duration::from_millis(250);
/// Pause before asking the control server again after a failure.
const TICKET_RETRY: Duration = Duration::from_millis(500);
/// The event loop wakes at least this often (HTTP answers arrive on a channel).
const MAX_WAIT_MS: u16 = 5;
/// In the grace period, how often to check whether anything is still missing.
const MISSING_CHECK: Duration = Duration::from_millis(20);
/// Error messages kept for the report (the count is always exact).
const MAX_MESSAGES: usize = 20;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Each bot asks the control server for its group and token, joins (JOIN, \
JOIN_CHALLENGE, JOIN with cookie, JOIN_ACK), sends DATA at --rate and moves every --move-every \
seconds. When sending stops, the bots wait up to --grace for datagrams in flight, leave, and report \
per bot and in total: sent, expected (known exactly: all bots are in this process), received, \
duplicates, loss in gaps and at the tail, and one-way latency from the send timestamp.\n\n\
Exit status: 0 no loss, 1 loss, 2 errors (join refused, control server unreachable, ...).\n\n\
Example: reflector bots --control http://127.0.0.1:8700 --count 100 --duration 30 --move-every 5"
)]
pub struct BotsArgs {
    /// Control server URL.
    #[arg(long, default_value = "http://127.0.0.1:8700")]
    pub control: String,
    /// Number of bots (all in this process, on one thread).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=20_000))]
    pub count: u64,
    /// Seconds of sending; then a grace period for datagrams in flight.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// DATA per second per bot.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Size of each DATA datagram in bytes, header included (UDP payload).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Seconds between moves to a new position (a step of up to one cell
    /// per axis); on a cell change the bot asks the control server for its
    /// group and, if it differs, leaves the old group and joins the new. 0 = never.
    #[arg(long, default_value_t = 3.0)]
    pub move_every: f64,
    /// Local address for the bots' sockets.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Print the report as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Seed for positions, moves and send phases (runs are repeatable).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Player id of the first bot; the others follow.
    #[arg(long, default_value_t = 1)]
    pub first_player: u32,
    /// Longest wait, in seconds, for datagrams in flight after sending stops.
    #[arg(long, default_value_t = 2.0)]
    pub grace: f64,
    /// Receive buffer per bot socket, bytes (SO_RCVBUFFORCE when root).
    #[arg(long, default_value_t = 1 << 20)]
    pub rcvbuf: usize,
    /// Show one row per bot in the table (always in --json).
    #[arg(long)]
    pub per_bot: bool,
    /// Send at most this many DATA per bot, then stop early (fixed counts).
    #[arg(long)]
    pub max_datagrams: Option<u64>,
    /// Start sending only once every bot has joined (exact counts with no moves).
    #[arg(long)]
    pub sync_start: bool,
    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,
    /// Create the bots' sockets in these network namespaces, round-robin (names under
    /// /run/netns, e.g. the client hosts of a lab), so their traffic crosses the lab's links
    /// while one process still knows every expected delivery. Needs root. The control
    /// server is still asked from this process's own namespace.
    #[arg(long, value_delimiter = ',')]
    pub netns: Vec<String>,
    /// Milliseconds: DATA sent this close before a receiver's LEAVE counts as uncertain
    /// (accepted, not required), since over a lab's separate links the LEAVE may overtake
    /// it on the way to the reflector. 0 where every path keeps order.
    #[arg(long, default_value_t = 20)]
    pub settle_ms: u64,
}

/// Everything a bots run needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct BotsConfig {
    /// Control server base URL, e.g. `http://127.0.0.1:8700`.
    pub control: String,
    pub count: usize,
    pub first_player: u32,
    pub duration: Duration,
    pub rate_hz: f64,
    pub size: usize,
    pub move_every: Option<Duration>,
    pub bind: IpAddr,
    pub seed: u64,
    pub grace: Duration,
    pub rcvbuf: usize,
    /// Progress lines on stderr.
    pub progress: bool,
    /// Stop sending DATA after this many per bot (the run ends early once
    /// every bot has sent them): fixed counts for exact checks.
    pub max_datagrams: Option<u64>,
    /// Hold DATA until every bot has joined once, so that with no moves
    /// each bot must receive exactly (bots in its group - 1) x sent.
    pub sync_start: bool,
    /// Network namespaces (names under /run/netns) for the bots' sockets,
    /// round-robin; empty: this process's own.
    pub netns: Vec<String>,
    /// DATA sent this close before a receiver's LEAVE is uncertain.
    pub settle: Duration,
}

impl BotsConfig {
    /// Defaults of the CLI for `count` bots against `control`.
    pub fn new(control: &str, count: usize) -> BotsConfig {
        BotsConfig {
            control: control.trim_end_matches('/').to_string(),
            count,
            first_player: 1,
            duration: Duration::from_secs(10),
            rate_hz: 10.0,
            size: 100,
            move_every: Some(Duration::from_secs(3)),
            bind: IpAddr::from([0, 0, 0, 0]),
            seed: 1,
            grace: Duration::from_secs(2),
            rcvbuf: 1 << 20,
            progress: false,
            max_datagrams: None,
            sync_start: false,
            netns: Vec::new(),
            settle: Duration::from_millis(20),
        }
    }

    fn validate(&self) -> Result<(), BotsError> {
        let bad = |m: String| Err(BotsError::Config(m));
        if self.count == 0 {
            return bad("--count must be at least 1".into());
        }
        if !(self.rate_hz.is_finite() && self.rate_hz > 0.0 && self.rate_hz <= 10_000.0) {
            return bad(format!(
                "--rate must be between 0 and 10000 per second, got {}",
                self.rate_hz
            ));
        }
        if !(MIN_SIZE..=MAX_DATAGRAM).contains(&self.size) {
            return bad(format!(
                "--size must be from {MIN_SIZE} (header + timestamp + epoch) to {MAX_DATAGRAM} bytes, got {}",
                self.size
            ));
        }
        if self.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        if !(self.control.starts_with("http://")) {
            return bad(format!(
                "--control must be an http:// URL (e.g. http://127.0.0.1:8700), got '{}'",
                self.control
            ));
        }
        Ok(())
    }
}

fn secs(name: &str, v: f64, allow_zero: bool) -> Result<Duration, BotsError> {
    if v.is_finite() && (v > 0.0 || (allow_zero && v == 0.0)) && v < 1e7 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(BotsError::Config(format!(
            "--{name} must be a {} number of seconds, got {v}",
            if allow_zero { "non-negative" } else { "positive" }
        )))
    }
}

impl TryFrom<&BotsArgs> for BotsConfig {
    type Error = BotsError;
    fn try_from(a: &BotsArgs) -> Result<BotsConfig, BotsError> {
        let move_every = secs("move-every", a.move_every, true)?;
        let cfg = BotsConfig {
            control: a.control.trim_end_matches('/').to_string(),
            count: a.count as usize,
            first_player: a.first_player,
            duration: secs("duration", a.duration, false)?,
            rate_hz: a.rate,
            size: a.size,
            move_every: (!move_every.is_zero()).then_some(move_every),
            bind: a.bind,
            seed: a.seed,
            grace: secs("grace", a.grace, true)?,
            rcvbuf: a.rcvbuf,
            progress: !a.quiet,
            max_datagrams: a.max_datagrams,
            sync_start: a.sync_start,
            netns: a.netns.clone(),
            settle: Duration::from_millis(a.settle_ms),
        };
        if a.first_player.checked_add(a.count as u32 - 1).is_none() {
            return Err(BotsError::Config(
                "--first-player + --count overflows player ids".into(),
            ));
        }
        cfg.validate()?;
        Ok(cfg)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BotsError {
    #[error("{0}")]
    Config(String),
    #[error("control server {url}: {msg} (is `reflector control` running there?)")]
    Control { url: String, msg: String },
    #[error("bot socket setup failed in {call}: {source}")]
    Socket {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("bot event loop failed in {call}: {source}")]
    Loop {
        call: &'static str,
        #[source]
        source: io::Error,
    },
}

/// One bot's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BotReport {
    pub player: u32,
    #[serde(flatten)]
    pub tally: Tally,
    pub lost: u64,
    /// Joins completed (JOIN_ACK received).
    pub joins: u64,
    /// JOIN datagrams sent again after a timeout.
    pub join_retries: u64,
    /// Moves to another cell.
    pub cell_changes: u64,
    /// Moves that changed group (LEAVE + JOIN).
    pub group_changes: u64,
    pub errors: u64,
    pub latency_max_us: f64,
    pub latency_mean_us: f64,
}

/// Latency summary, microseconds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

/// The result of a bots run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BotsReport {
    pub bots: usize,
    pub duration_s: f64,
    pub rate_hz: f64,
    pub size: usize,
    pub move_every_s: f64,
    pub total: Tally,
    pub lost: u64,
    pub joins: u64,
    pub join_retries: u64,
    pub group_changes: u64,
    pub latency: Latency,
    /// Datagrams received that were not DATA we can account (bad parse, short payload).
    pub malformed: u64,
    pub error_count: u64,
    /// The first few error messages.
    pub errors: Vec<String>,
    pub per_bot: Vec<BotReport>,
}

impl BotsReport {
    /// 2 on errors, 1 on loss, 0 when every expected datagram arrived.
    pub fn exit_code(&self) -> i32 {
        if self.error_count > 0 {
            2
        } else if self.lost > 0 {
            1
        } else {
            0
        }
    }

    /// The human summary.
    pub fn table(&self, per_bot: bool) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "bots: {} bots, {:.1} s at {} Hz x {} B, moves every {}",
            self.bots,
            self.duration_s,
            self.rate_hz,
            self.size,
            if self.move_every_s > 0.0 {
                format!("{} s", self.move_every_s)
            } else {
                "never".into()
            }
        );
        let _ = writeln!(
            out,
            "{:>8} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>6} {:>7} {:>9}",
            "player", "sent", "expected", "received", "dups", "gap", "tail", "unexpect", "joins", "groupch", "lat.max"
        );
        let row = |out: &mut String, label: &str, t: &Tally, joins: u64, gc: u64, lat: String| {
            let _ = writeln!(
                out,
                "{:>8} {:>9} {:>10} {:>10} {:>6} {:>8} {:>8} {:>8} {:>6} {:>7} {:>9}",
                label,
                t.sent,
                t.expected,
                t.received,
                t.duplicates,
                t.gap_lost,
                t.tail_lost,
                t.unexpected,
                joins,
                gc,
                lat
            );
        };
        if per_bot {
            for b in &self.per_bot {
                row(
                    &mut out,
                    &b.player.to_string(),
                    &b.tally,
                    b.joins,
                    b.group_changes,
                    format!("{:.0}us", b.latency_max_us),
                );
            }
        }
        row(
            &mut out,
            "total",
            &self.total,
            self.joins,
            self.group_changes,
            format!("{:.0}us", self.latency.max_us),
        );
        let _ = writeln!(
            out,
            "latency (one-way, {} samples): p50 {:.1} us, p99 {:.1} us, max {:.1} us",
            self.latency.count, self.latency.p50_us, self.latency.p99_us, self.latency.max_us
        );
        let _ = writeln!(
            out,
            "join retries {}, uncertain {}, malformed {}",
            self.join_retries, self.total.uncertain, self.malformed
        );
        for e in &self.errors {
            let _ = writeln!(out, "error: {e}");
        }
        let verdict = match self.exit_code() {
            0 => format!("OK: all {} expected datagrams received, no loss", self.total.expected),
            1 => format!(
                "LOSS: {} of {} expected datagrams lost ({} in gaps, {} at the tail)",
                self.lost, self.total.expected, self.total.gap_lost, self.total.tail_lost
            ),
            _ => format!("ERRORS: {} error(s); {} datagrams lost", self.error_count, self.lost),
        };
        let _ = writeln!(out, "{verdict}");
        out
    }
}

/// splitmix64: small, seedable, good enough for positions and phases.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Where a bot goes next: a step of up to one cell per axis, kept inside
/// the world. Pure, so it is tested without sockets.
fn step(pos: (f64, f64), world: &WorldInfo, r1: f64, r2: f64) -> (f64, f64) {
    let clamp = |v: f64, limit: f64| v.clamp(0.0, limit * (1.0 - 1e-9));
    (
        clamp(pos.0 + (2.0 * r1 - 1.0) * world.cell_size, world.size[0]),
        clamp(pos.1 + (2.0 * r2 - 1.0) * world.cell_size, world.size[1]),
    )
}

/// The cell of a position, as the control server computes it.
fn cell_of(pos: (f64, f64), world: &WorldInfo) -> [u32; 2] {
    let c = |v: f64, n: u32| ((v / world.cell_size).max(0.0) as u32).min(n.saturating_sub(1));
    [c(pos.0, world.grid[0]), c(pos.1, world.grid[1])]
}

fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

// ---------------------------------------------------------------------------
// HTTP to the control server, on helper threads.

struct Job {
    bot: usize,
    gen: u64,
    player: u32,
    pos: (f64, f64),
}

struct JobResult {
    bot: usize,
    gen: u64,
    result: Result<Ticket, String>,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .build()
}

fn http_error(e: ureq::Error) -> String {
    match e {
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            format!("answered {code}: {}", body.trim())
        }
        ureq::Error::Transport(t) => format!("unreachable: {t}"),
    }
}

/// `GET /world`.
pub fn fetch_world(control: &str) -> Result<WorldInfo, BotsError> {
    let url = format!("{control}/world");
    let err = |msg: String| BotsError::Control {
        url: control.to_string(),
        msg,
    };
    agent()
        .get(&url)
        .call()
        .map_err(|e| err(http_error(e)))?
        .into_json::<WorldInfo>()
        .map_err(|e| err(format!("bad /world answer: {e}")))
}

/// `GET /join?player=..&x=..&y=..`.
pub fn fetch_ticket(agent: &ureq::Agent, control: &str, player: u32, pos: (f64, f64)) -> Result<Ticket, String> {
    agent
        .get(&format!("{control}/join"))
        .query("player", &player.to_string())
        .query("x", &pos.0.to_string())
        .query("y", &pos.1.to_string())
        .call()
        .map_err(|e| format!("control server {control}: /join {}", http_error(e)))?
        .into_json::<Ticket>()
        .map_err(|e| format!("control server {control}: bad /join answer: {e}"))
}

fn http_worker(control: String, jobs: Arc<Mutex<mpsc::Receiver<Job>>>, results: mpsc::Sender<JobResult>) {
    let agent = agent();
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(j) => j,
                Err(_) => return, // the event loop is done
            },
            Err(_) => return,
        };
        let result = fetch_ticket(&agent, &control, job.player, job.pos);
        if results
            .send(JobResult {
                bot: job.bot,
                gen: job.gen,
                result,
            })
            .is_err()
        {
            return;
        }
    }
}

// ---------------------------------------------------------------------------
// The bots and their event loop.

/// A ticket made usable: where to send and the token bytes.
fn join_request(t: &Ticket, player: u32) -> Result<JoinRequest, String> {
    let reflector: SocketAddr = t
        .reflector
        .parse()
        .map_err(|_| format!("control server gave reflector '{}', not ip:port", t.reflector))?;
    let token: [u8; TOKEN_LEN] = hex::decode(&t.token)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| format!("control server gave a token that is not {TOKEN_LEN} hex bytes"))?;
    Ok(JoinRequest {
        reflector,
        group: t.group,
        player,
        token,
    })
}

#[derive(Debug, Clone, Copy)]
#[expect(
    clippy::large_enum_variant,
    reason = "a bot is in a group nearly all the time, so the size is paid anyway; a box would cost an allocation per join"
)]
enum State {
    /// Waiting for a ticket (or for the time to ask again).
    Idle,
    /// Joining or a member, as `session` says; `mem` is the ledger's
    /// record of this membership.
    InGroup { mem: MemId, session: Session },
}

impl State {
    fn is_member(&self) -> bool {
        matches!(self, State::InGroup { session, .. } if session.is_member())
    }
}

#[derive(Debug, Default)]
struct BotStats {
    sent: u64,
    joins: u64,
    join_retries: u64,
    cell_changes: u64,
    group_changes: u64,
    errors: u64,
    lat_max_ns: u64,
    lat_sum_ns: u128,
    lat_n: u64,
}

struct Bot {
    player: u32,
    sock: UdpSocket,
    pos: (f64, f64),
    cell: Option<[u32; 2]>,
    state: State,
    /// Ticket request generation; answers to older requests are ignored.
    gen: u64,
    http_busy: bool,
    ask_at: Option<Instant>,
    next_move: Option<Instant>,
    next_send: Instant,
    last_send: Instant,
    keepalive: Duration,
    stats: BotStats,
}

/// Everything the loop mutates besides the bots.
struct Ctx<'a> {
    cfg: &'a BotsConfig,
    ledger: Ledger,
    jobs: mpsc::Sender<Job>,
    latency: Histogram,
    malformed: u64,
    errors: Vec<String>,
    error_count: u64,
    buf: Vec<u8>,
    sending: bool,
    /// False while `sync_start` holds DATA back.
    released: bool,
}

impl Ctx<'_> {
    fn error(&mut self, bot: &mut Bot, msg: String) {
        bot.stats.errors += 1;
        self.error_count += 1;
        if self.errors.len() < MAX_MESSAGES {
            tracing::warn!("bot {}: {msg}", bot.player);
            self.errors.push(format!("bot {}: {msg}", bot.player));
        }
    }

    fn ask_ticket(&mut self, idx: usize, bot: &mut Bot) {
        bot.gen += 1;
        bot.http_busy = true;
        bot.ask_at = None;
        // The receiver lives until the loop ends.
        let _ = self.jobs.send(Job {
            bot: idx,
            gen: bot.gen,
            player: bot.player,
            pos: bot.pos,
        });
    }

    fn send_small(&mut self, bot: &mut Bot, tx: &Transmit) {
        match bot.sock.send_to(tx.datagram.as_bytes(), tx.to) {
            Ok(_) => {}
            // Control datagrams are retried by their own timers.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => self.error(bot, format!("sendto {}: {e}", tx.to)),
        }
    }

    fn start_join(&mut self, idx: usize, bot: &mut Bot, req: JoinRequest, now: Instant) {
        let mem = self.ledger.new_membership(idx, req.reflector);
        let cfg = client::Config {
            retry: JOIN_RETRY,
            give_up: None,
        };
        bot.state = State::InGroup {
            mem,
            session: Session::new(req, cfg, now),
        };
        self.flush(bot);
    }

    /// Sends the JOIN step the bot's session has queued, if any (a session
    /// holds at most one).
    fn flush(&mut self, bot: &mut Bot) {
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
    fn leave(&mut self, bot: &mut Bot, settle: bool) {
        if let State::InGroup { mem, mut session } = bot.state {
            if let Some(tx) = session.leave() {
                self.send_small(bot, &tx);
            }
            // After the LEAVE is sent: its order against other bots' sends
            // is what the reflector sees, up to the settle time.
            if settle {
                self.ledger.ended_at(mem, crate::mono_now_ns());
            } else {
                self.ledger.ended(mem);
            }
            bot.state = State::Idle;
        }
    }

    fn on_ticket(&mut self, idx: usize, bot: &mut Bot, res: JobResult, now: Instant) {
        if res.gen != bot.gen {
            return;
        }
        bot.http_busy = false;
        let ticket = match res.result {
            Ok(t) => t,
            Err(e) => {
                self.error(bot, e);
                if matches!(bot.state, State::Idle) {
                    bot.ask_at = Some(now + TICKET_RETRY);
                }
                return;
            }
        };
        let target = match join_request(&ticket, bot.player) {
            Ok(t) => t,
            Err(e) => {
                self.error(bot, e);
                return;
            }
        };
        bot.cell = Some(ticket.cell);
        if !self.sending {
            return;
        }
        match bot.state {
            State::InGroup { session, .. } if session.is_member() => {
                if session.request().reflector != target.reflector {
                    self.leave(bot, true);
                    bot.stats.group_changes += 1;
                    self.start_join(idx, bot, target, now);
                }
            }
            State::Idle => self.start_join(idx, bot, target, now),
            // Tickets are asked for only when Idle or a member.
            State::InGroup { .. } => {}
        }
    }

    /// Handles one received datagram; true if it was a control reply that
    /// may have made the bot due (DATA never changes a bot's timers).
    fn on_datagram(&mut self, idx: usize, bot: &mut Bot, data: &[u8], src: SocketAddr, now: Instant) -> bool {
        let control = Packet::parse(data).is_ok_and(|p| p.kind() != Kind::Data);
        self.handle_datagram(idx, bot, data, src, now);
        control
    }

    fn handle_datagram(&mut self, idx: usize, bot: &mut Bot, data: &[u8], src: SocketAddr, now: Instant) {
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
                if self.ledger.received(idx, epoch, pkt.seq()) == Receipt::New {
                    let lat = realtime_ns().saturating_sub(ts);
                    self.latency.record(lat);
                    let s = &mut bot.stats;
                    s.lat_max_ns = s.lat_max_ns.max(lat);
                    s.lat_sum_ns += u128::from(lat);
                    s.lat_n += 1;
                }
            }
            Kind::JoinChallenge | Kind::JoinAck | Kind::Error => {
                let State::InGroup { mem, session } = &mut bot.state else {
                    return;
                };
                let (mem, group) = (*mem, session.request().group);
                let event = session.handle(now, src, &pkt);
                self.flush(bot);
                match event {
                    Some(Event::Joined(ack)) => {
                        self.ledger.joined(mem);
                        bot.stats.joins += 1;
                        bot.keepalive = Duration::from_millis(u64::from(ack.keepalive_ms.max(50)));
                        bot.last_send = now;
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
                        self.ledger.ended(mem);
                        bot.state = State::Idle;
                        self.error(bot, format!("group {group} forgot this member; joining again"));
                        if !bot.http_busy {
                            self.ask_ticket(idx, bot);
                        }
                    }
                    Some(Event::Failed(Failure::ExpiredToken)) => {
                        self.ledger.join_failed(mem);
                        bot.state = State::Idle;
                        if !bot.http_busy {
                            self.ask_ticket(idx, bot);
                        }
                    }
                    Some(Event::Failed(f)) => {
                        self.ledger.join_failed(mem);
                        bot.state = State::Idle;
                        bot.ask_at = Some(now + TICKET_RETRY);
                        self.error(bot, format!("group {group}: {f}"));
                    }
                    Some(Event::Retransmitted) | None => {}
                }
            }
            _ => self.malformed += 1,
        }
    }

    /// Timers of one bot; returns when it next needs attention.
    fn tick(&mut self, idx: usize, bot: &mut Bot, now: Instant, world: &WorldInfo, rng: &mut Rng) -> Instant {
        let far = now + Duration::from_secs(1);
        if !self.sending {
            return far;
        }
        match bot.state {
            State::Idle => {
                if !bot.http_busy {
                    match bot.ask_at {
                        Some(t) if t > now => return t,
                        _ => self.ask_ticket(idx, bot),
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
            State::InGroup { mem, session } => {
                if let Some(t) = bot.next_move {
                    if now >= t && !bot.http_busy {
                        let every = self.cfg.move_every.unwrap_or(Duration::from_secs(3600));
                        bot.next_move = Some(t + every);
                        bot.pos = step(bot.pos, world, rng.unit(), rng.unit());
                        let cell = cell_of(bot.pos, world);
                        if Some(cell) != bot.cell {
                            bot.stats.cell_changes += 1;
                            self.ask_ticket(idx, bot);
                        }
                    }
                }
                let quota_left = self.cfg.max_datagrams.is_none_or(|m| bot.stats.sent < m);
                if self.released && quota_left && now >= bot.next_send {
                    self.send_data(bot, mem, session.request(), now);
                } else if now >= bot.last_send + bot.keepalive {
                    if let Some(tx) = session.keepalive() {
                        self.send_small(bot, &tx);
                    }
                    bot.last_send = now;
                }
                let mut next = bot.last_send + bot.keepalive;
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

    fn send_data(&mut self, bot: &mut Bot, mem: MemId, target: &JoinRequest, now: Instant) {
        let seq = self.ledger.sent(mem);
        let size = self.cfg.size;
        let h = Header {
            kind: Kind::Data,
            group: target.group,
            sender: bot.player,
            seq,
        };
        // size was validated against MAX_DATAGRAM and the buffer has that size.
        if write_header(&h, size - HEADER_LEN, &mut self.buf).is_err() {
            return;
        }
        self.buf[HEADER_LEN..HEADER_LEN + 8].copy_from_slice(&realtime_ns().to_be_bytes());
        self.buf[HEADER_LEN + 8..HEADER_LEN + 12].copy_from_slice(&mem.to_be_bytes());
        match bot.sock.send_to(&self.buf[..size], target.reflector) {
            Ok(_) => {
                // Count it only once it is really sent.
                self.ledger.next_seq_at(mem, crate::mono_now_ns());
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

/// One socket per bot: lift the soft open-file limit towards the hard one
/// if the default (often 1024) is too small.
fn raise_fd_limit(need: u64) -> Result<(), BotsError> {
    match crate::http::raise_nofile_limit(need) {
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
    let world = fetch_world(&cfg.control)?;
    if world.grid[0] == 0 || world.grid[1] == 0 || world.cell_size.is_nan() || world.cell_size <= 0.0 {
        return Err(BotsError::Control {
            url: cfg.control.clone(),
            msg: format!("/world describes an empty world: {world:?}"),
        });
    }
    raise_fd_limit(cfg.count as u64 + 64)?;
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
        // Spread first moves and send phases so bots do not act in lockstep.
        let next_move = cfg.move_every.map(|m| start + m.mul_f64(0.5 + rng.unit()));
        bots.push(Bot {
            player: cfg.first_player.wrapping_add(i as u32),
            sock,
            pos,
            cell: None,
            state: State::Idle,
            gen: 0,
            http_busy: false,
            ask_at: None,
            next_move,
            next_send: start,
            last_send: start,
            keepalive: Duration::from_secs(2),
            stats: BotStats::default(),
        });
    }
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let (res_tx, res_rx) = mpsc::channel::<JobResult>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let mut workers = Vec::new();
    for w in 0..2 {
        let (c, j, r) = (cfg.control.clone(), Arc::clone(&job_rx), res_tx.clone());
        let h = std::thread::Builder::new()
            .name(format!("bots-http-{w}"))
            .spawn(move || http_worker(c, j, r))
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
        jobs: job_tx,
        latency: Histogram::default(),
        malformed: 0,
        errors: Vec::new(),
        error_count: 0,
        buf: vec![0u8; MAX_DATAGRAM],
        sending: true,
        released: !cfg.sync_start,
    };
    let mut rbuf = vec![0u8; MAX_DATAGRAM + 1];
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
            let i = res.bot;
            if let Some(bot) = bots.get_mut(i) {
                ctx.on_ticket(i, bot, res, now);
            }
            // A new join has a retry timer to schedule.
            next_due = now;
        }
        if ctx.sending
            && cfg
                .max_datagrams
                .is_some_and(|m| bots.iter().all(|b| b.stats.sent >= m))
        {
            ctx.sending = false;
            drain_start = Some(now);
        }
        if !ctx.released && bots.iter().all(|b| b.state.is_member()) {
            ctx.released = true;
            for b in bots.iter_mut() {
                b.next_send = now;
            }
            next_due = now;
        }
        if now >= next_due {
            let mut due = now + Duration::from_secs(1);
            for (i, bot) in bots.iter_mut().enumerate() {
                due = due.min(ctx.tick(i, bot, now, &world, &mut rng));
            }
            next_due = due;
        }
        if cfg.progress && now >= next_progress {
            next_progress += Duration::from_secs(5);
            let members = bots.iter().filter(|b| b.state.is_member()).count();
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
        for ev in &events[..n] {
            let i = ev.data() as usize;
            let Some(bot) = bots.get_mut(i) else { continue };
            // Bounded so one busy socket cannot starve the others.
            for _ in 0..256 {
                match bot.sock.recv_from(&mut rbuf) {
                    Ok((len, src)) => {
                        if ctx.on_datagram(i, bot, &rbuf[..len], src, now) {
                            next_due = now;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // A queued ICMP error (e.g. a reflector port not open yet).
                    Err(_) => continue,
                }
            }
        }
    }
    // Leave cleanly; the ledger closes what is still open.
    for bot in bots.iter_mut() {
        ctx.leave(bot, false);
    }
    drop(ctx.jobs);
    // Helper threads end when the job channel closes (after any HTTP call
    // in progress, which has its own timeout).
    for w in workers {
        let _ = w.join();
    }
    let tallies = ctx.ledger.finish();
    let mut total = Tally::default();
    let mut per_bot = Vec::with_capacity(bots.len());
    let (mut joins, mut retries, mut gchanges) = (0, 0, 0);
    for (bot, t) in bots.iter().zip(&tallies) {
        total.add(t);
        let s = &bot.stats;
        joins += s.joins;
        retries += s.join_retries;
        gchanges += s.group_changes;
        if s.joins == 0 {
            ctx.error_count += 1;
            if ctx.errors.len() < MAX_MESSAGES {
                ctx.errors.push(format!(
                    "bot {} never joined a group (is the reflector running, with the control server's secret?)",
                    bot.player
                ));
            }
        }
        per_bot.push(BotReport {
            player: bot.player,
            tally: *t,
            lost: t.lost(),
            joins: s.joins,
            join_retries: s.join_retries,
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
        error_count: ctx.error_count,
        errors: ctx.errors,
        per_bot,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> WorldInfo {
        WorldInfo {
            grid: [4, 2],
            cell_size: 10.0,
            size: [40.0, 20.0],
        }
    }

    #[test]
    fn steps_stay_in_the_world_and_cells_match_the_control_server() {
        let w = world();
        let mut rng = Rng(7);
        let mut p = (0.0, 0.0);
        for _ in 0..10_000 {
            p = step(p, &w, rng.unit(), rng.unit());
            assert!((0.0..40.0).contains(&p.0) && (0.0..20.0).contains(&p.1), "{p:?}");
            let c = cell_of(p, &w);
            assert!(c[0] < 4 && c[1] < 2);
        }
        assert_eq!(step((0.0, 0.0), &w, 0.0, 1.0), (0.0, 10.0));
        assert_eq!(cell_of((39.999, 19.999), &w), [3, 1]);
        assert_eq!(cell_of((10.0, 0.0), &w), [1, 0]);
    }

    #[test]
    fn rng_is_uniform_enough_and_repeatable() {
        let mut a = Rng(1);
        let mut b = Rng(1);
        let xs: Vec<f64> = (0..10_000).map(|_| a.unit()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert_eq!(b.unit(), xs[0]);
    }

    #[test]
    fn config_is_checked() {
        let ok = BotsConfig::new("http://127.0.0.1:1", 2);
        assert!(ok.validate().is_ok());
        let mut c = ok.clone();
        c.size = MIN_SIZE - 1;
        assert!(c.validate().unwrap_err().to_string().contains("--size"));
        let mut c = ok.clone();
        c.rate_hz = 0.0;
        assert!(c.validate().unwrap_err().to_string().contains("--rate"));
        let mut c = ok.clone();
        c.control = "127.0.0.1:8700".into();
        assert!(c.validate().unwrap_err().to_string().contains("http://"));
        assert!(secs("duration", -1.0, false).is_err());
        assert!(secs("duration", f64::NAN, false).is_err());
        assert!(secs("move-every", 0.0, true).is_ok());
    }

    #[test]
    fn exit_codes() {
        let mut r = BotsReport {
            bots: 1,
            duration_s: 1.0,
            rate_hz: 1.0,
            size: 100,
            move_every_s: 0.0,
            total: Tally::default(),
            lost: 0,
            joins: 1,
            join_retries: 0,
            group_changes: 0,
            latency: Latency::default(),
            malformed: 0,
            error_count: 0,
            errors: vec![],
            per_bot: vec![],
        };
        assert_eq!(r.exit_code(), 0);
        assert!(r.table(false).contains("OK"));
        r.lost = 3;
        assert_eq!(r.exit_code(), 1);
        assert!(r.table(false).contains("LOSS"));
        r.error_count = 1;
        assert_eq!(r.exit_code(), 2);
    }
}
