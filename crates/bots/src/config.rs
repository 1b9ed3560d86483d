//! The bots' command line and configuration, checked before anything runs.

use super::{MARKER_LEN, MAX_SIZE, MIN_SIZE, MIN_SIZE_MARKED};
use oskit::units::{duration_in, secs_or_duration_in};
use std::io;
use std::net::IpAddr;
use std::time::Duration;

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
    /// Control server URL; several, comma separated, are asked in turn: the next only when one
    /// could not answer (a connect error, a timeout or a 5xx), never after a refusal.
    #[arg(long, default_value = "http://127.0.0.1:8700")]
    pub control: String,
    /// Number of bots (all in this process, on one thread).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=20_000))]
    pub count: u64,
    /// How long the bots send (e.g. 10s, 2m; a bare number is seconds); then a grace period
    /// for datagrams in flight.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = secs_or_duration_in(Duration::from_millis(1), Duration::from_secs(10_000_000)))]
    pub duration: Duration,
    /// DATA per second per bot.
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    /// Size of each DATA datagram in bytes, header included (UDP payload), at most 1472 (one
    /// Ethernet frame).
    #[arg(long, default_value_t = 100)]
    pub size: usize,
    /// Time between moves to a new position (e.g. 3s; a bare number is seconds; a step of up
    /// to one cell per axis); on a cell change the bot asks the control server for its
    /// group and, if it differs, leaves the old group and joins the new. 0 = never.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = secs_or_duration_in(Duration::ZERO, Duration::from_secs(10_000_000)))]
    pub move_every: Duration,
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
    /// Longest wait for datagrams in flight after sending stops (e.g. 2s; a bare number is
    /// seconds).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = secs_or_duration_in(Duration::ZERO, Duration::from_secs(10_000_000)))]
    pub grace: Duration,
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
    /// DATA sent this close before a receiver's LEAVE (e.g. 20ms) counts as uncertain
    /// (accepted, not required), since over a lab's separate links the LEAVE may overtake
    /// it on the way to the reflector. 0s where every path keeps order.
    #[arg(long, value_name = "DURATION", default_value = "20ms", value_parser = duration_in(Duration::ZERO, Duration::from_secs(3600)))]
    pub settle: Duration,
    /// Old spelling of --settle, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "settle")]
    pub settle_ms: Option<u64>,
    /// Ticket key file (what `reflector control --ticket-keys` reads; `reflector ticket` writes
    /// one for development) whose first HS256 key signs a player ticket for every token request,
    /// as the game's backend would. Needed unless the control server runs --anonymous-joins.
    #[arg(long, value_name = "FILE", alias = "ticket-key")]
    pub ticket_keys: Option<std::path::PathBuf>,
    /// Mark every DATA: 16 hex digits (8 bytes, e.g. random per run) written into the game data
    /// after the bots' own 28 bytes, followed by the player id and the bot's DATA count (4 bytes
    /// each, big-endian), so that a byte scan of a capture finds the prefix in every payload that
    /// crossed in clear, and none where payloads are sealed. --size must be at least 76; payloads
    /// grow to hold it (a sealed DATA to at least 116 bytes). The report counts the DATA received
    /// with their sender's marker.
    #[arg(long, value_name = "HEX", value_parser = marker_hex)]
    pub marker: Option<[u8; 8]>,
}

/// `--marker`: exactly 8 bytes as 16 hex digits.
pub fn marker_hex(s: &str) -> Result<[u8; 8], String> {
    let v = hex::decode(s).map_err(|e| format!("not hex ({e}): give 16 hex digits, e.g. 5eed1e55c0ffee00"))?;
    <[u8; 8]>::try_from(v.as_slice()).map_err(|_| format!("{} bytes: give exactly 8 bytes (16 hex digits)", v.len()))
}

/// Everything a bots run needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct BotsConfig {
    /// Control server base URL, e.g. `http://127.0.0.1:8700`.
    pub control: String,
    /// More control servers of the same world, asked in turn after `control`.
    pub control_fallbacks: Vec<String>,
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
    /// Key file to sign player tickets with (none: anonymous requests).
    pub ticket_keys: Option<std::path::PathBuf>,
    /// A prefix written, with the player and the bot's DATA count, into
    /// every DATA's game data (`--marker`).
    pub marker: Option<[u8; 8]>,
}

impl BotsConfig {
    /// Defaults of the CLI for `count` bots against `control`.
    pub fn new(control: &str, count: usize) -> BotsConfig {
        BotsConfig {
            control: control.trim_end_matches('/').to_string(),
            control_fallbacks: Vec::new(),
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
            ticket_keys: None,
            marker: None,
        }
    }

    pub(super) fn validate(&self) -> Result<(), BotsError> {
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
        if !(MIN_SIZE..=MAX_SIZE).contains(&self.size) {
            return bad(format!(
                "--size must be from {MIN_SIZE} (header, timestamp, epoch, number, position, moves) to {MAX_SIZE} bytes \
                 (one Ethernet frame: a larger DATA would be fragmented to every member), got {}",
                self.size
            ));
        }
        if self.marker.is_some() && self.size < MIN_SIZE_MARKED {
            return bad(format!(
                "--size {} with --marker: the marker takes {MARKER_LEN} bytes after the bots' own fields, so \
                 --size must be at least {MIN_SIZE_MARKED}",
                self.size
            ));
        }
        if self.duration.is_zero() {
            return bad("--duration must be positive".into());
        }
        for url in self.controls() {
            if !url.starts_with("http://") {
                return bad(format!(
                    "--control must be http:// URLs (e.g. http://127.0.0.1:8700), got '{url}'"
                ));
            }
        }
        Ok(())
    }
}

impl BotsConfig {
    /// Every control server, in the order they are asked.
    pub fn controls(&self) -> Vec<String> {
        std::iter::once(&self.control)
            .chain(&self.control_fallbacks)
            .cloned()
            .collect()
    }
}

impl TryFrom<&BotsArgs> for BotsConfig {
    type Error = BotsError;
    fn try_from(a: &BotsArgs) -> Result<BotsConfig, BotsError> {
        let move_every = a.move_every;
        let mut urls = a.control.split(',').map(|u| u.trim().trim_end_matches('/').to_string());
        let cfg = BotsConfig {
            control: urls.next().unwrap_or_default(),
            control_fallbacks: urls.collect(),
            count: a.count as usize,
            first_player: a.first_player,
            duration: a.duration,
            rate_hz: a.rate,
            size: a.size,
            move_every: (!move_every.is_zero()).then_some(move_every),
            bind: a.bind,
            seed: a.seed,
            grace: a.grace,
            rcvbuf: a.rcvbuf,
            progress: !a.quiet,
            max_datagrams: a.max_datagrams,
            sync_start: a.sync_start,
            netns: a.netns.clone(),
            settle: a.settle_ms.map_or(a.settle, Duration::from_millis),
            ticket_keys: a.ticket_keys.clone(),
            marker: a.marker,
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
    /// The control server refused a player ticket: every bot's ticket is
    /// made alike, so the run stops at the first refusal.
    #[error("{msg}: {}", ticket_hint(*status, keys.as_deref()))]
    Ticket {
        status: u16,
        msg: String,
        keys: Option<std::path::PathBuf>,
    },
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

/// Why the control server refused the bots' tickets, and what to change.
pub fn ticket_hint(status: u16, keys: Option<&std::path::Path>) -> String {
    match (status, keys) {
        (_, None) => "the control server wants a player ticket with each token request: give --ticket-keys FILE, \
             the key file the control server reads with its --ticket-keys (`reflector ticket --ticket-keys FILE` \
             writes one for development), unless it is meant to run --anonymous-joins"
            .to_string(),
        (403, Some(k)) => format!(
            "the control server took the tickets signed with {} for other players than asked",
            k.display()
        ),
        (_, Some(k)) => format!(
            "the control server does not accept the tickets signed with {}: is it the file the control server reads \
             with --ticket-keys (and are both clocks right)?",
            k.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        c.marker = Some([1; 8]);
        // As --help says.
        assert_eq!((MIN_SIZE_MARKED, crate::MIN_SIZE_SEALED_MARKED), (76, 116));
        c.size = MIN_SIZE_MARKED - 1;
        assert!(c.validate().unwrap_err().to_string().contains("--marker"));
        c.size += 1;
        assert!(c.validate().is_ok());
        assert_eq!(
            marker_hex("5eed1e55c0ffee00"),
            Ok([0x5e, 0xed, 0x1e, 0x55, 0xc0, 0xff, 0xee, 0])
        );
        assert!(marker_hex("5eed").unwrap_err().contains("exactly 8 bytes"));
        assert!(marker_hex("zz").unwrap_err().contains("not hex"));
        let mut c = ok.clone();
        c.control = "127.0.0.1:8700".into();
        assert!(c.validate().unwrap_err().to_string().contains("http://"));
    }
}
