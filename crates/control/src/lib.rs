//! The control server (paper 000 §3): maps a world of virtual locations onto
//! reflector groups and hands each player its group and a signed, expiring
//! join token. It is not on the data path; HTTP+JSON keeps it scriptable
//! (`curl 'http://127.0.0.1:8700/join?player=1&x=10&y=20'`).
//!
//! The world is a grid of `cols x rows` square cells of `cell_size` world
//! units; position (x, y) lies in cell (⌊x/cell_size⌋, ⌊y/cell_size⌋) and
//! must satisfy `0 <= x < cols*cell_size`, `0 <= y < rows*cell_size`.
//!
//! Cells are numbered row-major (`index = cy*cols + cx`) and mapped onto the
//! *targets*: every (reflector, port) pair, listed in the order the
//! `--reflector` options give them (all ports of the first reflector, then
//! the second's, ...). Two assignments:
//! - `round-robin` (default): cell `i` goes to target `i % targets`, so
//!   neighbouring cells land on different groups and load spreads evenly;
//! - `blocks`: the cells are cut into `targets` contiguous runs, cell `i`
//!   goes to target `i * targets / cells`, so neighbouring cells tend to
//!   share a group (fewer group changes when players move).
//!
//! The mapping and the request handling are pure functions, unit-tested
//! without a socket; [`ControlServer`] is the thin HTTP layer over
//! `reflector-http`. Players are authenticated by [`players`]. What the
//! server answers (`JoinGrant`, `WorldInfo`) is defined in
//! `reflector_proto::control`, which its clients share; this crate does
//! not depend on the reflector's data plane.
#![deny(unsafe_code)]

pub mod fleet;
pub mod players;
pub mod sealing;
mod secret;
pub use secret::{SecretCell, SECRET_RECHECK};

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::control::{parse_ports, JoinGrant, KeyedAreaGrant, KeyedGrant};
use reflector_proto::protocol::SessionKeys;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Endpoints (GET, JSON answers):\n  \
/join?player=ID&x=X&y=Y  the player's cell, its reflector ip:port and group, a signed token \
valid for --token-ttl; needs `Authorization: Bearer <ticket>` unless --anonymous-joins; \
&area=1 or 2 also grants every other group within 1 or 2 cells (one request, one rate-limit unit); \
with --sealing-secret-file each grant has `keys`, the epoch keys of its group's cells, and with \
&sign_key=HEX (the player's Ed25519 public key) `control_public` and `certificate`\n  \
/keys?token=T&at=A&mac=M  with --sealing-secret-file: those keys again, for the holder of a current \
token T (hex) and its session key: A its Unix seconds, M = HMAC(mac key, \"reflector-keys-v1\" || \
token || A as u64)[..16] (hex); 401 bad token/MAC or A off by over 60 s, 429 beyond \
--refresh-rate-player\n  \
/world                   the grid and the cell -> group mapping\n  \
/healthz                 liveness\n  \
/metrics                 Prometheus metrics (text 0.0.4; OpenMetrics if Accept asks for it)\n\
Bad parameters get 400 with {\"error\": \"...\"} naming the problem.\n\n\
Example (a shared secret and a development ticket key file first; `reflector ticket --help`):\n  \
od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > secret\n  \
reflector ticket --ticket-keys tickets.toml > /dev/null\n  \
reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml --grid 8x8\n\n\
Sealed groups (their reflectors run `serve --data-sealed on`): a second, separate secret that no \
reflector gets, and the world's name:\n  \
od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > sealing-secret\n  \
reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml \
--sealing-secret-file sealing-secret --world my-world")]
pub struct ControlArgs {
    /// HTTP address to listen on.
    #[arg(long, default_value = "127.0.0.1:8700")]
    pub listen: SocketAddr,
    /// File with the secret shared with the reflectors (hex, or a passphrase of 16+ bytes).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// A reflector and its group ports, as clients reach it: IP:PORTS, e.g.
    /// 127.0.0.1:4000-4015 or 10.0.0.2:4000,4002. Repeat for several reflectors.
    #[arg(long = "reflector", required_unless_present = "registry", conflicts_with = "registry", value_parser = parse_reflector)]
    pub reflectors: Vec<ReflectorSpec>,
    /// A fleet instead of --reflector: place cells on the live reflectors registered in this
    /// Redis (redis://[user@]host:port, or rediss:// for TLS) by `serve --registry`. Several
    /// control servers with the same registry agree on every placement.
    #[arg(long, value_name = "URL")]
    pub registry: Option<String>,
    /// File with the registry's password (one line).
    #[arg(long, value_name = "FILE", requires = "registry")]
    pub registry_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the registry's certificate (a rediss:// URL): the server
    /// is checked against it instead of the system's roots.
    #[arg(long, value_name = "FILE", requires = "registry")]
    pub registry_ca_file: Option<PathBuf>,
    /// PEM client certificate for a registry that requires one (redis.conf tls-auth-clients
    /// yes, its default), with --registry-key-file.
    #[arg(long, value_name = "FILE", requires_all = ["registry", "registry_key_file"])]
    pub registry_cert_file: Option<PathBuf>,
    /// PEM private key of --registry-cert-file.
    #[arg(long, value_name = "FILE", requires = "registry_cert_file")]
    pub registry_key_file: Option<PathBuf>,
    /// Prefix of the registry's keys (the reflectors' --registry-prefix).
    #[arg(long, value_name = "PREFIX", default_value = "reflector")]
    pub registry_prefix: String,
    /// World grid, COLSxROWS cells.
    #[arg(long, default_value = "8x8", value_parser = parse_grid)]
    pub grid: (u32, u32),
    /// Side of one square cell, in world units.
    #[arg(long, default_value_t = 100.0)]
    pub cell_size: f64,
    /// How cells map onto (reflector, port) targets: round-robin (neighbours on
    /// different groups) or blocks (contiguous runs of cells per group).
    #[arg(long, value_enum, default_value_t = Assign::RoundRobin)]
    pub assign: Assign,
    /// Lifetime of issued join tokens (e.g. 5m; a bare number is seconds), from 1s to a day;
    /// whole seconds.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = token_ttl)]
    pub token_ttl: std::time::Duration,
    /// Serve plain HTTP on a non-loopback --listen address. The control server hands out
    /// join tokens, so anywhere but loopback it wants --tls-cert/--tls-key; say this only
    /// where the network is yours (a lab's private links, a test).
    #[arg(long)]
    pub insecure_http: bool,
    /// Key file of the game backend's player tickets (TOML, keys by kid: HS256 secrets,
    /// EdDSA/ES256 public keys; re-read when it changes). /join then needs
    /// `Authorization: Bearer <ticket>` and issues tokens only for the ticket's player.
    #[arg(long, required_unless_present = "anonymous_joins")]
    pub ticket_keys: Option<PathBuf>,
    /// Issue join tokens to anyone for any player id (no tickets): for a closed test network
    /// only, since then anybody can take over any player's membership.
    #[arg(long, conflicts_with = "ticket_keys")]
    pub anonymous_joins: bool,
    /// Tickets accepted per second per player (bursts of five times as many).
    #[arg(long, default_value_t = 2.0)]
    pub ticket_rate_player: f64,
    /// Requests accepted per second per source address (bursts of twice as many): enough for a
    /// household behind one NAT, not for a flood.
    #[arg(long, default_value_t = 20.0)]
    pub ticket_rate_ip: f64,
    /// Sealed groups: file with the master secret of the world's epoch keys (hex, or 32+ bytes;
    /// one line, never rolled over). Only control servers hold it, never a reflector, and it is
    /// not --secret-file. With it every grant carries `keys` (the epoch keys of the cells its
    /// group serves) and GET /keys refreshes them; without it answers have no `keys`.
    #[arg(long, value_name = "FILE", requires = "world")]
    pub sealing_secret_file: Option<PathBuf>,
    /// The world's name (with --sealing-secret-file): cell ids, and so every epoch key, start
    /// with its hash. Every control server of a fleet gives the same one; worlds that share a
    /// master secret need distinct names.
    #[arg(long, value_name = "NAME", requires = "sealing_secret_file")]
    pub world: Option<String>,
    /// Length L of a sealing epoch (keys rotate once per epoch and cell), from 2m to a day;
    /// fixed for the life of the master secret.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = epoch_length)]
    pub epoch_length: Duration,
    /// Bound J of the jitter that spreads the cells' rotations (at most half of
    /// --epoch-length); fixed for the life of the master secret.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = epoch_jitter)]
    pub epoch_jitter: Duration,
    /// GET /keys requests accepted per second per player (bursts of five times as many): a
    /// client asks about once an epoch and after each MOVED.
    #[arg(long, default_value_t = 1.0)]
    pub refresh_rate_player: f64,
    #[command(flatten)]
    pub http: reflector_http::HttpArgs,
}

/// `--epoch-length`: twice the overlap (2 minutes) to a day, whole seconds.
fn epoch_length(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(
        Duration::from_secs(sealing::MIN_EPOCH_LENGTH_S),
        Duration::from_secs(86_400),
    )(s)
}

/// `--epoch-jitter`: up to half a day (and half the epoch, checked with it).
fn epoch_jitter(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(Duration::ZERO, Duration::from_secs(43_200))(s)
}

/// The sealing configuration of `control`'s options, if it has a sealing
/// secret.
fn sealing_of(
    args: &ControlArgs,
    tokens: &reflector_proto::auth::SecretRing,
) -> Result<Option<sealing::Sealing>, CliError> {
    let Some(path) = &args.sealing_secret_file else {
        return Ok(None);
    };
    let world = args.world.as_deref().unwrap_or_default().trim();
    if world.is_empty() {
        return Err("--world: give the world a name (its cells' ids, and so their keys, derive from it)".into());
    }
    let (length_s, jitter_s) = (args.epoch_length.as_secs(), args.epoch_jitter.as_secs());
    let schedule = reflector_proto::sealed::Schedule::new(length_s, jitter_s)
        .map_err(|_| format!("--epoch-jitter {jitter_s} s is more than half of --epoch-length {length_s} s"))?;
    let rate = args.refresh_rate_player;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(
            format!("--refresh-rate-player must be a positive number of requests per second, got {rate}").into(),
        );
    }
    let master = sealing::read_master_secret(path, tokens)?;
    Ok(Some(sealing::Sealing::new(master, world, schedule, rate)))
}

/// `--token-ttl`: 1 s to a day (tokens carry whole seconds).
fn token_ttl(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(Duration::from_secs(1), Duration::from_secs(86_400))(s)
}

/// Refuses plain HTTP on an address others can reach unless told
/// `--insecure-http`: tokens (and, with protocol v2, session keys) would
/// cross the network in the clear.
pub fn check_transport(listen: SocketAddr, tls: bool, insecure_http: bool) -> Result<(), String> {
    if tls || insecure_http || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "refusing to serve join tokens over plain HTTP on {listen}, which is not a loopback address: \
         give --tls-cert and --tls-key, listen on 127.0.0.1, or say --insecure-http if the network is yours"
    ))
}

/// One reflector as clients reach it, and its group ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReflectorSpec {
    pub ip: IpAddr,
    pub ports: Vec<u16>,
}

/// Parses `IP:PORTS` where PORTS is what `reflector serve --ports` takes.
pub fn parse_reflector(s: &str) -> Result<ReflectorSpec, String> {
    let (ip, ports) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' is not IP:PORTS (e.g. 127.0.0.1:4000-4015)"))?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("'{ip}' in '{s}' is not an IP address (e.g. 127.0.0.1:4000-4015)"))?;
    if ip.is_unspecified() {
        return Err(format!(
            "'{s}': give the address clients use to reach the reflector, not {ip}"
        ));
    }
    Ok(ReflectorSpec {
        ip,
        ports: parse_ports(ports)?.0,
    })
}

/// Parses `8x8` into (cols, rows).
pub fn parse_grid(s: &str) -> Result<(u32, u32), String> {
    let (c, r) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("grid '{s}' is not COLSxROWS (e.g. 8x8)"))?;
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .ok()
            .filter(|&v| (1..=4096).contains(&v))
            .ok_or_else(|| format!("'{t}' in grid '{s}' is not a number of cells from 1 to 4096"))
    };
    Ok((num(c)?, num(r)?))
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    RoundRobin,
    Blocks,
}

impl fmt::Display for Assign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Assign::RoundRobin => "round-robin",
            Assign::Blocks => "blocks",
        })
    }
}

/// Why a position cannot be mapped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MapError {
    #[error("{axis}={value} is not a finite number")]
    NotFinite { axis: &'static str, value: f64 },
    #[error("{axis}={value} is outside the world [0, {limit})")]
    Outside { axis: &'static str, value: f64, limit: f64 },
}

/// The world grid and its cell → (reflector, group) mapping. Pure.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    pub cols: u32,
    pub rows: u32,
    pub cell_size: f64,
    pub assign: Assign,
    /// Every (reflector, port) pair in mapping order (none in a fleet).
    pub targets: Vec<Target>,
    /// In a fleet (`--registry`): the placements of the registry instead.
    pub fleet: Option<fleet::Fleet>,
    /// With a sealing secret: grants carry the epoch keys of their group's
    /// cells, and `/keys` serves them ([`World::with_sealing`]).
    pub sealing: Option<Arc<sealing::Sealing>>,
}

/// One group on one reflector. The reflector id is the position of its
/// `--reflector` option (0, 1, ...); the reflector must be started with the
/// same `--reflector-id`, and tokens are bound to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub reflector_id: u16,
    pub addr: SocketAddr,
}

impl Target {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

/// `/world` lists every cell's group only up to this many cells; beyond it
/// the rule (assignment and targets) is enough to compute any cell, and an
/// unauthenticated request must not make the server build a huge answer.
const WORLD_LISTING_MAX_CELLS: u64 = 4096;

/// A grid of at least one cell of a positive, finite size.
fn check_grid(cols: u32, rows: u32, cell_size: f64) -> Result<(), String> {
    if !(cell_size.is_finite() && cell_size > 0.0) {
        return Err(format!("cell size must be a positive number, got {cell_size}"));
    }
    if cols == 0 || rows == 0 {
        return Err(format!("grid {cols}x{rows} has no cells"));
    }
    Ok(())
}

impl World {
    pub fn new(
        cols: u32,
        rows: u32,
        cell_size: f64,
        assign: Assign,
        reflectors: &[ReflectorSpec],
    ) -> Result<World, String> {
        check_grid(cols, rows, cell_size)?;
        if reflectors.len() > usize::from(u16::MAX) {
            return Err(format!("{} reflectors; at most {}", reflectors.len(), u16::MAX));
        }
        let targets: Vec<Target> = reflectors
            .iter()
            .enumerate()
            .flat_map(|(id, r)| {
                // id < u16::MAX, checked above.
                let reflector_id = id as u16;
                r.ports.iter().map(move |&p| Target {
                    reflector_id,
                    addr: SocketAddr::new(r.ip, p),
                })
            })
            .collect();
        if targets.is_empty() {
            return Err("no reflector ports to map cells onto (give --reflector IP:PORTS)".into());
        }
        Ok(World {
            cols,
            rows,
            cell_size,
            assign,
            targets,
            fleet: None,
            sealing: None,
        })
    }

    /// A world whose cells the fleet's registry places (`--registry`).
    pub fn for_fleet(cols: u32, rows: u32, cell_size: f64, fleet: fleet::Fleet) -> Result<World, String> {
        check_grid(cols, rows, cell_size)?;
        Ok(World {
            cols,
            rows,
            cell_size,
            assign: Assign::RoundRobin,
            targets: Vec::new(),
            fleet: Some(fleet),
            sealing: None,
        })
    }

    /// This world with sealing: its grants carry epoch keys. A static
    /// world whose groups would serve more than
    /// [`sealing::MAX_SEALED_CELLS_PER_GROUP`] cells each is refused (a
    /// fleet's placements are checked per answer).
    pub fn with_sealing(self, s: Arc<sealing::Sealing>) -> Result<World, String> {
        let most = self.most_cells_per_group();
        if most > sealing::MAX_SEALED_CELLS_PER_GROUP as u64 {
            return Err(format!(
                "with a sealing secret a group may serve at most {} cells (each grant carries their keys), \
                 but {}x{} cells onto {} group(s) puts {most} on one: give more group ports",
                sealing::MAX_SEALED_CELLS_PER_GROUP,
                self.cols,
                self.rows,
                self.targets.len()
            ));
        }
        Ok(World {
            sealing: Some(s),
            ..self
        })
    }

    /// The most cells one group of a static world serves (0 in a fleet):
    /// both assignments spread the cells as evenly as they divide.
    fn most_cells_per_group(&self) -> u64 {
        match self.targets.len() as u64 {
            0 => 0,
            n => self.cells().div_ceil(n),
        }
    }

    /// The cells the group `port` of reflector `reflector_id` serves now,
    /// row by row (none for a group the world does not map).
    pub fn cells_of_group(&self, reflector_id: u16, port: u16) -> Vec<(u32, u32)> {
        let at = |idx: u64| ((idx % u64::from(self.cols)) as u32, (idx / u64::from(self.cols)) as u32);
        if let Some(f) = &self.fleet {
            let v = f.view();
            let mut cells: Vec<(u32, u32)> = v
                .cells
                .iter()
                .filter(|(_, p)| p.reflector == reflector_id && p.port == port)
                .map(|(&c, _)| c)
                .collect();
            cells.sort_unstable_by_key(|&(x, y)| (y, x));
            return cells;
        }
        let Some(t) = self
            .targets
            .iter()
            .position(|t| t.reflector_id == reflector_id && t.port() == port)
        else {
            return Vec::new();
        };
        let (t, n, cells) = (t as u64, self.targets.len() as u64, self.cells());
        // The inverses of target_of's two rules.
        match self.assign {
            Assign::RoundRobin => (t..cells).step_by(n as usize).map(at).collect(),
            Assign::Blocks => ((t * cells).div_ceil(n)..((t + 1) * cells).div_ceil(n))
                .map(at)
                .collect(),
        }
    }

    /// Every cell, row by row.
    pub fn all_cells(&self) -> Vec<(u32, u32)> {
        (0..self.rows)
            .flat_map(|y| (0..self.cols).map(move |x| (x, y)))
            .collect()
    }

    pub fn cells(&self) -> u64 {
        u64::from(self.cols) * u64::from(self.rows)
    }

    /// World extent (width, height) in world units.
    pub fn size(&self) -> (f64, f64) {
        (
            f64::from(self.cols) * self.cell_size,
            f64::from(self.rows) * self.cell_size,
        )
    }

    /// The cell holding position (x, y).
    pub fn cell_of(&self, x: f64, y: f64) -> Result<(u32, u32), MapError> {
        let (w, h) = self.size();
        let axis = |name: &'static str, v: f64, limit: f64, n: u32| {
            if !v.is_finite() {
                return Err(MapError::NotFinite { axis: name, value: v });
            }
            if !(0.0..limit).contains(&v) {
                return Err(MapError::Outside {
                    axis: name,
                    value: v,
                    limit,
                });
            }
            // v < limit = n*cell_size, but rounding could still give n.
            Ok(((v / self.cell_size) as u32).min(n - 1))
        };
        Ok((axis("x", x, w, self.cols)?, axis("y", y, h, self.rows)?))
    }

    /// The (reflector, port) that serves a cell; `cell` must be in the grid.
    /// The cells within `r` cells of `cell` (the square of side 2r+1
    /// around it, cut at the world's edges), `cell` itself left out,
    /// nearest first (Chebyshev distance), then by row, then column.
    pub fn area_of(&self, cell: (u32, u32), r: u32) -> Vec<(u32, u32)> {
        reflector_proto::control::area_cells([self.cols, self.rows], [cell.0, cell.1], r)
            .into_iter()
            .map(|[x, y]| (x, y))
            .collect()
    }

    /// The (reflector, port) that serves a cell: `None` only in a fleet,
    /// for a cell no live reflector has taken yet.
    pub fn target_of(&self, cell: (u32, u32)) -> Option<Target> {
        if let Some(f) = &self.fleet {
            return f.target(cell).map(|(reflector_id, addr)| Target { reflector_id, addr });
        }
        let idx = u64::from(cell.1.min(self.rows - 1)) * u64::from(self.cols) + u64::from(cell.0.min(self.cols - 1));
        let n = self.targets.len() as u64;
        let t = match self.assign {
            Assign::RoundRobin => idx % n,
            Assign::Blocks => idx * n / self.cells(),
        };
        // t < n by construction in both arms.
        self.targets.get(t as usize).copied()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let (w, h) = self.size();
        let mapping: Vec<serde_json::Value> = if self.cells() <= WORLD_LISTING_MAX_CELLS {
            (0..self.rows)
                .flat_map(|cy| (0..self.cols).map(move |cx| (cx, cy)))
                .map(|c| match self.target_of(c) {
                    Some(t) => serde_json::json!({"cell": [c.0, c.1], "reflector": t.to_string(), "reflector_id": t.reflector_id, "group": t.port()}),
                    None => serde_json::json!({"cell": [c.0, c.1], "reflector": null}),
                })
                .collect()
        } else {
            Vec::new()
        };
        serde_json::json!({
            "grid": [self.cols, self.rows],
            "cell_size": self.cell_size,
            "size": [w, h],
            "assign": self.assign.to_string(),
            "targets": self.targets.iter().map(|t| serde_json::json!({"reflector_id": t.reflector_id, "addr": t.to_string()})).collect::<Vec<_>>(),
            "cells": mapping,
        })
    }
}

/// Everything the control server needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    pub listen: SocketAddr,
    pub world: World,
    /// What tokens are signed with; `control` replaces it when the secret
    /// file changes.
    pub secret: SecretCell,
    pub token_ttl_s: u64,
    /// Player tickets and rate limits; `None`: anonymous joins (tests, closed networks).
    pub auth: Option<Arc<crate::players::JoinAuth>>,
}

/// Splits a query string into (key, value) pairs. Values here are numbers,
/// so only `+` and `%XX` need undoing for the odd client that encodes them.
fn query_pairs(query: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < b.len() => {
                    let hexval = |c: u8| (c as char).to_digit(16);
                    match (hexval(b[i + 1]), hexval(b[i + 2])) {
                        (Some(h), Some(l)) => {
                            // Two hex digits are at most 255.
                            out.push((h * 16 + l) as u8);
                            i += 2;
                        }
                        _ => out.push(b'%'),
                    }
                }
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// An HTTP answer: status and JSON body.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
    /// `Retry-After` seconds (with 429).
    pub retry_after_s: Option<u32>,
}

fn bad(status: u16, msg: impl Into<String>) -> Reply {
    Reply {
        status,
        body: serde_json::json!({ "error": msg.into() }),
        retry_after_s: None,
    }
}

fn too_many(msg: &str, after_s: u32) -> Reply {
    Reply {
        retry_after_s: Some(after_s),
        ..bad(429, format!("{msg}: retry in {after_s} s"))
    }
}

/// Checks a `/join` request against the player tickets and the rate
/// limits; the player it may have a token for, or the refusal to send.
/// The per-address limit comes first, so a flood of forged tickets costs
/// no signature checks beyond its budget.
pub fn authorize(
    auth: &crate::players::JoinAuth,
    authorization: Option<&str>,
    peer: std::net::IpAddr,
    query: &str,
    now_unix_s: u64,
    now: Instant,
    held: Option<u32>,
) -> Result<u32, Reply> {
    use crate::players::Refusal;
    match held {
        // A player that holds a valid token of ours is being re-placed (its
        // reflector failed or drains): many such players behind one address
        // must not be throttled into 429s by the address's budget, so only
        // the player's own budget is spent, before the ticket is verified
        // (a captured token buys a flood no more than its player's rate).
        Some(p) => {
            if let Err(s) = auth.per_player.lock().unwrap_or_else(|e| e.into_inner()).take(p, now) {
                auth.rate_limited.fetch_add(1, Relaxed);
                return Err(too_many("too many token requests for this player", s));
            }
        }
        None => {
            if let Err(s) = auth.per_ip.lock().unwrap_or_else(|e| e.into_inner()).take(peer, now) {
                auth.rate_limited.fetch_add(1, Relaxed);
                return Err(too_many("too many requests from this address", s));
            }
        }
    }
    let refuse = |r: Refusal| {
        auth.count(r);
        let status = if r == Refusal::OtherPlayer { 403 } else { 401 };
        tracing::debug!("control: ticket refused from {peer}: {}", r.name());
        bad(status, r.message())
    };
    let Some(token) = authorization.and_then(|a| a.strip_prefix("Bearer ")).map(str::trim) else {
        return Err(refuse(Refusal::Missing));
    };
    let player = auth.verifier.verify(token, now_unix_s).map_err(refuse)?;
    let asked = query_pairs(query)
        .into_iter()
        .find(|(k, _)| k == "player")
        .map(|(_, v)| v);
    if asked.is_some_and(|p| p.trim() != player.to_string()) {
        return Err(refuse(Refusal::OtherPlayer));
    }
    if let Some(p) = held {
        if p != player {
            return Err(refuse(Refusal::OtherPlayer));
        }
        auth.recoveries.fetch_add(1, Relaxed);
        return Ok(player);
    }
    if let Err(s) = auth
        .per_player
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take(player, now)
    {
        auth.rate_limited.fetch_add(1, Relaxed);
        return Err(too_many("too many token requests for this player", s));
    }
    Ok(player)
}

/// The player of the join token a `/join` carries as `held=HEX` (the
/// token the client holds now), if it is one of ours (current secret, or
/// the previous while it is accepted) and has not expired.
pub fn held_player(secret: &reflector_proto::auth::SecretRing, query: &str, now_unix_ms: u64) -> Option<u32> {
    let hex_token = query_pairs(query).into_iter().find(|(k, _)| k == "held")?.1;
    let bytes = hex::decode(hex_token.trim()).ok()?;
    let token: [u8; reflector_proto::auth::TOKEN_LEN] = bytes.try_into().ok()?;
    let claims = TokenClaims::peek(&token);
    secret
        .verify_token(&token, claims.reflector, claims.group, claims.player, now_unix_ms)
        .ok()
        .map(|c| c.player)
}

/// Answers one request. Pure: the clock comes in as `now_unix_s`.
pub fn handle(cfg: &ControlConfig, method: &str, url: &str, now_unix_s: u64) -> Reply {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    if method != "GET" {
        return bad(405, format!("method {method} not allowed: use GET"));
    }
    match path {
        "/healthz" => Reply {
            status: 200,
            body: serde_json::json!({"ok": true}),
            retry_after_s: None,
        },
        "/world" => Reply {
            status: 200,
            body: cfg.world.to_json(),
            retry_after_s: None,
        },
        "/join" => join(cfg, query, now_unix_s, None),
        "/keys" => keys(cfg, query, now_unix_s, Instant::now()),
        _ => bad(
            404,
            format!(
                "no such endpoint {path}: try /join?player=ID&x=X&y=Y, /keys?token=T&at=A&mac=M, /world, /healthz or /metrics"
            ),
        ),
    }
}

/// `GET /keys?token=T&at=A&mac=M` ([`sealing::keys`]): 404 where this
/// server has no sealing secret. Pure but for the rate limit's `now`.
pub fn keys(cfg: &ControlConfig, query: &str, now_unix_s: u64, now: Instant) -> Reply {
    match &cfg.world.sealing {
        Some(s) => sealing::keys(
            s,
            &cfg.secret.ring(),
            |reflector_id, port| cfg.world.cells_of_group(reflector_id, port),
            query,
            now_unix_s,
            now,
        ),
        None => bad(
            404,
            "this control server hands out no sealing keys (it has no --sealing-secret-file)",
        ),
    }
}

/// `/join` for `player` (authenticated by its ticket), or for the player
/// the query names (anonymous joins).
pub fn join(cfg: &ControlConfig, query: &str, now_unix_s: u64, player: Option<u32>) -> Reply {
    match join_checked(cfg, query, now_unix_s, player) {
        Ok(r) | Err((_, r)) => r,
    }
}

/// Why a `/join` got no grant. Ticket refusals and 429s come before it
/// and are counted apart (`join_refusals`, `join_rate_limited`). Nothing
/// here asks the registry: in a fleet `/join` answers from the last
/// placements its poller read, so Redis being down is no cause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinFailure {
    /// 503: no live reflector serves the player's cell (a fleet's registry
    /// has not placed it yet).
    Unplaced,
    /// 503: with sealing, the player's group (or one of its area's) serves
    /// more cells than one answer carries keys for.
    TooManyCells,
    /// 400: a parameter missing or wrong.
    BadRequest,
}

impl JoinFailure {
    pub const ALL: [JoinFailure; 3] = [
        JoinFailure::Unplaced,
        JoinFailure::TooManyCells,
        JoinFailure::BadRequest,
    ];

    /// The `cause` label of `reflector_control_join_failures`.
    pub fn name(self) -> &'static str {
        match self {
            JoinFailure::Unplaced => "unplaced",
            JoinFailure::TooManyCells => "too_many_cells",
            JoinFailure::BadRequest => "bad_request",
        }
    }
}

/// What became of the `/join` requests that passed the ticket check and
/// the rate limits, for `/metrics`: so an observer outside (the fleet lab)
/// can tell that `/join` is answered, whatever the registry does.
#[derive(Debug, Default)]
pub struct JoinCounts {
    answered: AtomicU64,
    /// Indexed like [`JoinFailure::ALL`].
    failed: [AtomicU64; JoinFailure::ALL.len()],
}

impl JoinCounts {
    /// [`join`], counted.
    pub fn join(&self, cfg: &ControlConfig, query: &str, now_unix_s: u64, player: Option<u32>) -> Reply {
        match join_checked(cfg, query, now_unix_s, player) {
            Ok(r) => {
                self.answered.fetch_add(1, Relaxed);
                r
            }
            Err((why, r)) => {
                self.failed[why as usize].fetch_add(1, Relaxed);
                r
            }
        }
    }

    /// `/join` requests answered with a grant (200).
    pub fn answered(&self) -> u64 {
        self.answered.load(Relaxed)
    }

    /// `/join` requests refused here, by cause (every cause, zeros too).
    pub fn failed(&self) -> Vec<(&'static str, u64)> {
        JoinFailure::ALL
            .iter()
            .map(|&f| (f.name(), self.failed[f as usize].load(Relaxed)))
            .collect()
    }
}

/// A bad `/join` parameter: 400 naming it.
fn bad_request(msg: impl Into<String>) -> (JoinFailure, Reply) {
    (JoinFailure::BadRequest, bad(400, msg))
}

/// [`join`], and why it gave no grant.
fn join_checked(
    cfg: &ControlConfig,
    query: &str,
    now_unix_s: u64,
    player: Option<u32>,
) -> Result<Reply, (JoinFailure, Reply)> {
    let pairs = query_pairs(query);
    let get = |k: &str| pairs.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let player = match player {
        Some(p) => p,
        None => {
            let Some(player) = get("player") else {
                return Err(bad_request("missing parameter player (a number from 0 to 4294967295)"));
            };
            let Ok(player) = player.trim().parse::<u32>() else {
                return Err(bad_request(format!(
                    "player={player} is not a number from 0 to 4294967295"
                )));
            };
            player
        }
    };
    let mut pos = [0.0f64; 2];
    for (i, axis) in ["x", "y"].into_iter().enumerate() {
        let Some(v) = get(axis) else {
            return Err(bad_request(format!(
                "missing parameter {axis} (a position in world units)"
            )));
        };
        match v.trim().parse::<f64>() {
            Ok(f) => pos[i] = f,
            Err(_) => return Err(bad_request(format!("{axis}={v} is not a number"))),
        }
    }
    let cell = match cfg.world.cell_of(pos[0], pos[1]) {
        Ok(c) => c,
        Err(e) => return Err(bad_request(e.to_string())),
    };
    let area = match get("area").map(|v| v.trim().parse::<u32>()) {
        None => 0,
        Some(Ok(r)) if r <= MAX_AREA => r,
        Some(_) => {
            return Err(bad_request(format!(
                "area must be a number of cells from 0 to {MAX_AREA}"
            )))
        }
    };
    let sign_key = match get("sign_key").map(parse_sign_key) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => return Err(bad_request(e)),
    };
    let expires_unix_s = now_unix_s.saturating_add(cfg.token_ttl_s);
    // With a sealing secret and a player key, every grant of the answer
    // carries the world's control key and the key's certificate (the same
    // for all: one player, one key, one expiry).
    let certified = match (&cfg.world.sealing, sign_key) {
        (Some(s), Some(k)) => Some(s.certify(player, &k, expires_unix_s)),
        _ => None,
    };
    let secret = cfg.secret.get();
    // Cells without a reflector are only possible in a fleet: the caller
    // checks the player's own cell; the area's get no grant.
    let grant = |cell: (u32, u32), target: Target| {
        let token = TokenClaims {
            player,
            reflector: target.reflector_id,
            group: target.port(),
            expires_unix_s,
        }
        .sign(&secret);
        JoinGrant {
            player,
            cell: [cell.0, cell.1],
            reflector: target.to_string(),
            reflector_id: target.reflector_id,
            group: target.port(),
            token: hex::encode(token),
            session_key: hex::encode(SessionKeys::derive(&secret, &token).session),
            expires_unix_s,
        }
    };
    let Some(own) = cfg.world.target_of(cell) else {
        return Err((
            JoinFailure::Unplaced,
            Reply {
                status: 503,
                body: serde_json::json!({"error": format!(
                    "no reflector serves cell ({}, {}) now: the fleet has no live reflector for it yet; retry",
                    cell.0, cell.1
                )}),
                retry_after_s: Some(1),
            },
        ));
    };
    // With sealing, each grant carries the epoch keys of every cell its
    // group serves now; without, none (the field is absent).
    let keyed = |cell: (u32, u32), target: Target| -> Result<KeyedGrant, Reply> {
        let keys = match &cfg.world.sealing {
            Some(s) => {
                let cells = cfg.world.cells_of_group(target.reflector_id, target.port());
                if cells.len() > sealing::MAX_SEALED_CELLS_PER_GROUP {
                    return Err(sealing::too_many_cells(target.port(), cells.len()));
                }
                s.keys_for(&cells, now_unix_s)
            }
            None => Vec::new(),
        };
        Ok(KeyedGrant {
            grant: grant(cell, target),
            keys,
            control_public: certified.as_ref().map(|(public, _)| public.clone()),
            certificate: certified.as_ref().map(|(_, cert)| cert.clone()),
        })
    };
    let own = match keyed(cell, own) {
        Ok(g) => g,
        Err(refused) => return Err((JoinFailure::TooManyCells, refused)),
    };
    let body = if area == 0 {
        serde_json::to_value(own)
    } else {
        // One grant per other group of the area, nearest cell first.
        let w = &cfg.world;
        let grants: Result<Vec<KeyedGrant>, Reply> =
            reflector_proto::control::area_grant_cells([w.cols, w.rows], [cell.0, cell.1], area, |[x, y]| {
                w.target_of((x, y))
            })
            .into_iter()
            .filter_map(|[x, y]| w.target_of((x, y)).map(|t| keyed((x, y), t)))
            .collect();
        match grants {
            Ok(area) => serde_json::to_value(KeyedAreaGrant { cell: own, area }),
            Err(refused) => return Err((JoinFailure::TooManyCells, refused)),
        }
    };
    Ok(Reply {
        status: 200,
        body: body.unwrap_or_default(),
        retry_after_s: None,
    })
}

/// `sign_key`: a player's Ed25519 public key, 64 hex digits. Whether it is
/// a curve point is not checked: a key that is not one never verifies.
fn parse_sign_key(v: &str) -> Result<[u8; 32], String> {
    let v = v.trim();
    hex::decode(v)
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            format!(
                "sign_key={v} is not an Ed25519 public key: it must be 64 hex digits (32 bytes), the key the client \
                 signs its checkpoints with"
            )
        })
}

/// The largest `area` a `/join` may ask for: 2 cells around the player's
/// (a 5 x 5 square, at most 24 more groups).
pub const MAX_AREA: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control server: {0}")]
    Http(#[from] reflector_http::HttpError),
}

/// The control server's `/metrics`: its HTTP server's counters, `/join`
/// answered and failed (`joins`), its join refusals by reason (with
/// tickets), build and process metrics.
pub fn metrics(
    cfg: &ControlConfig,
    joins: &JoinCounts,
    http: &reflector_http::Stats,
    format: reflector_http::expo::Format,
) -> String {
    use reflector_http::expo;
    let mut e = expo::Exposition::new(format);
    let auth = if cfg.auth.is_some() { "tickets" } else { "open" };
    expo::build_info(&mut e, "reflector_control", &[("join_auth", auth)]);
    expo::http_stats(&mut e, "reflector_control", http);
    // Zero with anonymous joins: the same series either way.
    let refused: Vec<(&str, u64)> = match &cfg.auth {
        Some(a) => a.refused(),
        None => crate::players::Refusal::ALL.iter().map(|r| (r.name(), 0)).collect(),
    };
    let mut f = e.counter(
        "reflector_control_join_refusals",
        "Token requests refused, by reason (bad or missing tickets, other players).",
    );
    for (reason, n) in refused {
        f.sample(&[("reason", reason)], n);
    }
    e.counter(
        "reflector_control_join_rate_limited",
        "Token requests refused 429 by the per-player or per-address rate limit.",
    )
    .sample(&[], cfg.auth.as_ref().map_or(0, |a| a.rate_limited.load(Relaxed)));
    e.counter(
        "reflector_control_join_recoveries",
        "Token requests that carried a valid join token of the same player (re-placement after a reflector failed or drained): charged to the player's rate limit only, not to its address's.",
    )
    .sample(&[], cfg.auth.as_ref().map_or(0, |a| a.recoveries.load(Relaxed)));
    e.counter(
        "reflector_control_joins_answered",
        "Token requests answered with a grant (200), one per answer (an area's grants in it included); in a fleet from the last placements read, so also while the registry is down.",
    )
    .sample(&[], joins.answered());
    let mut f = e.counter(
        "reflector_control_join_failures",
        "Token requests that passed the ticket check and rate limits but got no grant, by cause: unplaced (503: no live reflector serves the cell yet), too_many_cells (503: a sealed group serves more cells than an answer carries keys for), bad_request (400).",
    );
    for (cause, n) in joins.failed() {
        f.sample(&[("cause", cause)], n);
    }
    if let Some(f) = &cfg.world.fleet {
        fleet::write_metrics(&mut e, f);
    }
    // Zero without sealing: the same series either way.
    let outcomes: Vec<(&str, u64)> = match &cfg.world.sealing {
        Some(s) => s.outcomes(),
        None => sealing::KeysOutcome::ALL.iter().map(|o| (o.name(), 0)).collect(),
    };
    let mut f = e.counter(
        "reflector_control_keys_requests",
        "GET /keys requests (sealing epoch keys), by outcome: served, or why refused.",
    );
    for (outcome, n) in outcomes {
        f.sample(&[("outcome", outcome)], n);
    }
    e.counter(
        "reflector_control_sealing_keys_issued",
        "Sealing epoch keys handed out, in /join answers and by /keys.",
    )
    .sample(&[], cfg.world.sealing.as_ref().map_or(0, |s| s.keys_issued()));
    e.counter(
        "reflector_control_sealing_certificates_issued",
        "Player signing keys certified (/join with sign_key), for sealed checkpoints.",
    )
    .sample(&[], cfg.world.sealing.as_ref().map_or(0, |s| s.certificates_issued()));
    let (reloads, reload_errors) = cfg.secret.reloads();
    e.counter(
        "reflector_control_token_secret_reloads",
        "Times the control server took a new token secret (the secret file changed, or SIGHUP).",
    )
    .sample(&[], reloads);
    e.counter(
        "reflector_control_token_secret_reload_errors",
        "New versions of the secret file that could not be read or parsed: the secret in force was kept.",
    )
    .sample(&[], reload_errors);
    expo::process(&mut e);
    e.finish()
}

/// A running control server.
pub struct ControlServer {
    http: reflector_http::HttpServer,
    scheme: &'static str,
}

impl ControlServer {
    /// Binds (so a busy port is reported here) and serves until stopped.
    /// Port 0 in `cfg.listen` picks a free port; see [`ControlServer::addr`].
    pub fn start(cfg: ControlConfig, stop: Arc<AtomicBool>) -> Result<ControlServer, ControlError> {
        ControlServer::start_with(cfg, reflector_http::Limits::default(), None, stop)
    }

    /// [`ControlServer::start`] with explicit HTTP limits, and over TLS
    /// when given a certificate.
    pub fn start_with(
        cfg: ControlConfig,
        limits: reflector_http::Limits,
        tls: Option<reflector_http::Tls>,
        stop: Arc<AtomicBool>,
    ) -> Result<ControlServer, ControlError> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let listen = cfg.listen;
        // The world never changes while serving: serialise it once rather
        // than per request (64x64 cells make 350 KB of JSON), so asking for
        // it over and over costs the server a copy-free send, not CPU.
        let world = reflector_http::Bytes::from(format!("{}\n", cfg.world.to_json()));
        let joins = Arc::new(JoinCounts::default());
        let handler: reflector_http::Handler = Arc::new(move |req: &reflector_http::Request<'_>| {
            if req.method == "GET" && req.target.split('?').next() == Some("/metrics") {
                let format = reflector_http::expo::Format::negotiate(req.accept);
                return reflector_http::Response {
                    status: 200,
                    content_type: format.content_type(),
                    body: metrics(&cfg, &joins, &req.stats, format).into(),
                    retry_after_s: None,
                };
            }
            if req.method == "GET" && req.target.split('?').next() == Some("/world") {
                // A fleet's placements change; a static world's never do.
                let body = match cfg.world.fleet {
                    Some(_) => format!("{}\n", cfg.world.to_json()).into(),
                    None => world.clone(),
                };
                return reflector_http::Response {
                    status: 200,
                    content_type: "application/json",
                    body,
                    retry_after_s: None,
                };
            }
            let now_s = reflector_proto::unix_now_ms() / 1000;
            let (path, query) = req.target.split_once('?').unwrap_or((req.target, ""));
            let reply = match (&cfg.auth, req.method, path) {
                (Some(auth), "GET", "/join") => {
                    let held = held_player(&cfg.secret.ring(), query, reflector_proto::unix_now_ms());
                    match authorize(
                        auth,
                        req.authorization,
                        req.peer.ip(),
                        query,
                        now_s,
                        Instant::now(),
                        held,
                    ) {
                        Ok(player) => joins.join(&cfg, query, now_s, Some(player)),
                        Err(refused) => refused,
                    }
                }
                (None, "GET", "/join") => joins.join(&cfg, query, now_s, None),
                _ => handle(&cfg, req.method, req.target, now_s),
            };
            if reply.status != 200 {
                tracing::debug!(
                    "control: {} {} from {} -> {} {}",
                    req.method,
                    req.target,
                    req.peer,
                    reply.status,
                    reply.body
                );
            }
            reflector_http::Response {
                status: reply.status,
                content_type: "application/json",
                body: format!("{}\n", reply.body).into(),
                retry_after_s: reply.retry_after_s,
            }
        });
        let http = reflector_http::HttpServer::start("control", listen, limits, tls, handler, stop)?;
        Ok(ControlServer { http, scheme })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.http.addr()
    }

    /// `http://ip:port` (or `https://`), what bots take as `--control`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr())
    }

    /// What the HTTP layer has done so far (requests, refusals, ...).
    pub fn stats(&self) -> reflector_http::Stats {
        self.http.stats()
    }

    /// Stops serving (within [`reflector_http::SHUTDOWN_GRACE`] of the last
    /// poll of the stop flag) and waits; returns requests served.
    pub fn stop(self) -> u64 {
        self.http.stop().requests
    }
}

/// The start-up line's suggestion: a request that gets a join token from
/// this server as configured (with tickets, the ticket comes from
/// `reflector ticket`, which reads the same key file).
pub fn try_hint(url: &str, ticket_keys: Option<&std::path::Path>) -> String {
    let join = format!("'{url}/join?player=1&x=0&y=0'");
    match ticket_keys {
        Some(keys) => format!(
            "curl -s -H \"Authorization: Bearer $(reflector ticket --ticket-keys {} --player 1)\" {join}",
            keys.display()
        ),
        None => format!("curl -s {join}"),
    }
}

/// `reflector control`.
pub fn run(args: ControlArgs, stop: Arc<AtomicBool>) -> Result<(), CliError> {
    let tls = args.http.tls()?;
    check_transport(args.listen, tls.is_some(), args.insecure_http)?;
    let secret = SecretCell::from(Secret::from_file(&args.secret_file)?);
    // SIGHUP re-reads the secret file rather than ending the process.
    let hangup = oskit::signal::flag_on(&[oskit::signal::SIGHUP], oskit::signal::Second::Ignore)
        .map_err(|e| format!("cannot install the SIGHUP handler: {e}"))?;
    let mut secret_file = secret::SecretFile::new(&args.secret_file, secret.clone(), hangup);
    let fleet_cfg = match &args.registry {
        Some(url) => Some(reflector_registry::RegistryConfig {
            url: reflector_registry::RegistryConfig::url_with_password(url, args.registry_password_file.as_deref())?,
            prefix: args.registry_prefix.clone(),
            tls: reflector_registry::RegistryTls {
                ca_file: args.registry_ca_file.clone(),
                client_cert: args.registry_cert_file.clone().zip(args.registry_key_file.clone()),
            },
            ..reflector_registry::RegistryConfig::new(url)
        }),
        None => None,
    };
    let world = match &fleet_cfg {
        Some(_) => World::for_fleet(args.grid.0, args.grid.1, args.cell_size, fleet::Fleet::default()),
        None => World::new(args.grid.0, args.grid.1, args.cell_size, args.assign, &args.reflectors),
    }
    .map_err(|e| format!("bad world: {e}"))?;
    let world = match sealing_of(&args, &secret.ring())? {
        Some(s) => {
            tracing::info!(
                "sealing: grants carry the epoch keys of world '{}' (epochs of {} s, jitter below {} s); GET /keys refreshes them",
                s.world_name(),
                s.schedule().length_s(),
                s.schedule().jitter_bound_s()
            );
            world.with_sealing(Arc::new(s)).map_err(|e| format!("bad world: {e}"))?
        }
        None => world,
    };
    let _poller = match (&fleet_cfg, &world.fleet) {
        (Some(rc), Some(f)) => Some(fleet::Poller::start(
            rc,
            secret.clone(),
            f.clone(),
            world.all_cells(),
            Arc::clone(&stop),
        )?),
        _ => None,
    };
    for (name, v) in [
        ("--ticket-rate-player", args.ticket_rate_player),
        ("--ticket-rate-ip", args.ticket_rate_ip),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be a positive number of requests per second, got {v}").into());
        }
    }
    let auth = match &args.ticket_keys {
        Some(path) => {
            let verifier = crate::players::TicketVerifier::from_file(path)?;
            Some(Arc::new(crate::players::JoinAuth::new(
                verifier,
                args.ticket_rate_player,
                args.ticket_rate_ip,
            )))
        }
        None => {
            tracing::warn!("--anonymous-joins: join tokens for any player id, to anyone; never on an open network");
            None
        }
    };
    let cfg = ControlConfig {
        listen: args.listen,
        world,
        secret,
        token_ttl_s: args.token_ttl.as_secs(),
        auth,
    };
    let (cols, rows, ntargets) = (cfg.world.cols, cfg.world.rows, cfg.world.targets.len());
    let onto = match &fleet_cfg {
        Some(rc) => format!(
            "the fleet's live reflectors (registry {})",
            reflector_registry::redacted(&rc.url)
        ),
        None => format!("{ntargets} group(s) ({})", args.assign),
    };
    let server = ControlServer::start_with(cfg, args.http.limits(), tls, Arc::clone(&stop))?;
    tracing::info!(
        "control server at {}: {cols}x{rows} cells of {} units onto {onto}; try: {}",
        server.addr(),
        args.cell_size,
        try_hint(&server.url(), args.ticket_keys.as_deref())
    );
    let started = Instant::now();
    while !stop.load(Relaxed) {
        secret_file.poll();
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = server.stop();
    tracing::info!(
        "control server stopped after {:.1} s, {served} request(s) served",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refl(s: &str) -> ReflectorSpec {
        parse_reflector(s).unwrap()
    }

    fn world(assign: Assign) -> World {
        World::new(4, 2, 10.0, assign, &[refl("10.0.0.1:4000-4001"), refl("10.0.0.2:5000")]).unwrap()
    }

    #[test]
    fn parses_reflectors_and_grids() {
        assert_eq!(
            refl("127.0.0.1:4000-4002"),
            ReflectorSpec {
                ip: "127.0.0.1".parse().unwrap(),
                ports: vec![4000, 4001, 4002]
            }
        );
        assert_eq!(refl("[::1]:7").ports, vec![7]);
        assert!(parse_reflector("4000").unwrap_err().contains("IP:PORTS"));
        assert!(parse_reflector("host:4000").unwrap_err().contains("not an IP"));
        assert!(parse_reflector("0.0.0.0:4000").unwrap_err().contains("clients use"));
        assert!(parse_reflector("1.2.3.4:x").is_err());
        assert_eq!(parse_grid("8x4"), Ok((8, 4)));
        assert!(parse_grid("8").is_err());
        assert!(parse_grid("0x4").is_err());
        assert!(parse_grid("ax4").is_err());
    }

    #[test]
    fn cell_of_positions() {
        let w = world(Assign::RoundRobin);
        assert_eq!(w.cell_of(0.0, 0.0), Ok((0, 0)));
        assert_eq!(w.cell_of(9.999, 10.0), Ok((0, 1)));
        assert_eq!(w.cell_of(39.9, 19.9), Ok((3, 1)));
        assert!(matches!(w.cell_of(40.0, 0.0), Err(MapError::Outside { axis: "x", .. })));
        assert!(matches!(w.cell_of(0.0, 20.0), Err(MapError::Outside { axis: "y", .. })));
        assert!(matches!(w.cell_of(-0.1, 0.0), Err(MapError::Outside { axis: "x", .. })));
        assert!(matches!(w.cell_of(f64::NAN, 0.0), Err(MapError::NotFinite { .. })));
        assert!(matches!(w.cell_of(0.0, f64::INFINITY), Err(MapError::NotFinite { .. })));
        // The largest value below the edge must not round into a cell past the grid.
        let edge = 40.0 - 1e-12;
        assert_eq!(w.cell_of(edge, 0.0), Ok((3, 0)));
    }

    #[test]
    fn round_robin_and_blocks() {
        let rr = world(Assign::RoundRobin);
        let t: Vec<String> = rr.targets.iter().map(|t| t.to_string()).collect();
        assert_eq!(t, ["10.0.0.1:4000", "10.0.0.1:4001", "10.0.0.2:5000"]);
        let cells: Vec<(u32, u32)> = (0..2).flat_map(|y| (0..4).map(move |x| (x, y))).collect();
        let got: Vec<u16> = cells.iter().map(|&c| rr.target_of(c).unwrap().port()).collect();
        assert_eq!(got, [4000, 4001, 5000, 4000, 4001, 5000, 4000, 4001]);
        let bl = world(Assign::Blocks);
        let got: Vec<u16> = cells.iter().map(|&c| bl.target_of(c).unwrap().port()).collect();
        assert_eq!(got, [4000, 4000, 4000, 4001, 4001, 4001, 5000, 5000]);
        // More targets than cells: every cell still gets a valid target.
        let tiny = World::new(1, 1, 1.0, Assign::Blocks, &[refl("10.0.0.1:1-50")]).unwrap();
        assert_eq!(tiny.target_of((0, 0)).unwrap().port(), 1);
        assert!(World::new(1, 1, 0.0, Assign::Blocks, &[refl("10.0.0.1:1")]).is_err());
        assert!(World::new(1, 1, 1.0, Assign::Blocks, &[]).is_err());
    }

    fn cfg() -> ControlConfig {
        ControlConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            world: world(Assign::RoundRobin),
            secret: Secret::new(&[5; 32]).unwrap().into(),
            token_ttl_s: 60,
            auth: None,
        }
    }

    #[test]
    fn a_held_token_names_its_player_only_if_it_is_ours_and_current() {
        let secret = Secret::new(&[5; 32]).unwrap();
        let ring: reflector_proto::auth::SecretRing = secret.clone().into();
        let token = |player: u32, expires_unix_s: u64, s: &Secret| {
            hex::encode(
                TokenClaims {
                    player,
                    reflector: 2,
                    group: 4001,
                    expires_unix_s,
                }
                .sign(s),
            )
        };
        let now_ms = 1_000_000_000;
        let q = |t: String| format!("x=1&y=1&held={t}");
        assert_eq!(held_player(&ring, &q(token(9, 2_000_000, &secret)), now_ms), Some(9));
        assert_eq!(
            held_player(&ring, &q(token(9, 999_999, &secret)), now_ms),
            None,
            "expired"
        );
        let other = Secret::new(&[6; 32]).unwrap();
        assert_eq!(
            held_player(&ring, &q(token(9, 2_000_000, &other)), now_ms),
            None,
            "not ours"
        );
        assert_eq!(held_player(&ring, "x=1&y=1&held=zz", now_ms), None);
        assert_eq!(held_player(&ring, "x=1&y=1", now_ms), None);
    }

    #[test]
    fn tickets_decide_the_player_and_floods_get_429_with_retry_after() {
        use crate::players::{JoinAuth, TicketVerifier};
        use reflector_proto::ticket::TicketMinter;
        let dir = std::env::temp_dir().join(format!("reflector-authorize-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keys = dir.join("keys.toml");
        std::fs::write(
            &keys,
            "[[key]]\nkid = \"g\"\nalg = \"HS256\"\nsecret_hex = \"0303030303030303030303030303030303030303030303030303030303030303\"\n",
        )
        .unwrap();
        let auth = JoinAuth::new(TicketVerifier::from_file(&keys).unwrap(), 1.0, 3.0);
        let minter = TicketMinter::from_file(&keys).unwrap();
        let (now_s, t) = (1_000_000, Instant::now());
        let peer: std::net::IpAddr = "192.0.2.1".parse().unwrap();
        let bearer = |p: u32| format!("Bearer {}", minter.mint(p, now_s, 60));
        // The ticket says who the player is; the query may only agree.
        let q = "player=42&x=1&y=1";
        assert_eq!(authorize(&auth, Some(&bearer(42)), peer, q, now_s, t, None), Ok(42));
        assert_eq!(
            authorize(&auth, Some(&bearer(42)), peer, "x=1&y=1", now_s, t, None),
            Ok(42)
        );
        let other = authorize(&auth, Some(&bearer(7)), peer, q, now_s, t, None).unwrap_err();
        assert_eq!(other.status, 403);
        // Three requests per second from one address (burst 6): the rest wait.
        let peer2: std::net::IpAddr = "192.0.2.2".parse().unwrap();
        let missing = authorize(&auth, None, peer2, q, now_s, t, None).unwrap_err();
        assert_eq!(missing.status, 401);
        assert!(missing.body["error"]
            .as_str()
            .unwrap()
            .contains("Authorization: Bearer"));
        let statuses: Vec<u16> = (0..8)
            .map(|_| {
                authorize(&auth, Some("Bearer x.y.z"), peer2, q, now_s, t, None).map_or_else(|r| r.status, |_| 200)
            })
            .collect();
        assert_eq!(statuses, [401, 401, 401, 401, 401, 429, 429, 429]);
        let limited = authorize(&auth, None, peer2, q, now_s, t, None).unwrap_err();
        assert_eq!((limited.status, limited.retry_after_s), (429, Some(1)));
        // A player re-placed with a valid token of its own is not charged to
        // the address (its own budget only); the ticket must still agree.
        assert_eq!(
            authorize(&auth, Some(&bearer(42)), peer2, q, now_s, t, Some(42)),
            Ok(42)
        );
        let not_his = authorize(&auth, Some(&bearer(42)), peer2, q, now_s, t, Some(7)).unwrap_err();
        assert_eq!(not_his.status, 403);
        assert_eq!(auth.recoveries.load(Relaxed), 1);
        // One ticket per second per player (burst 5), from any address.
        let peer3: std::net::IpAddr = "192.0.2.3".parse().unwrap();
        let per_player: Vec<u16> = (0..5)
            .map(|_| authorize(&auth, Some(&bearer(9)), peer3, "", now_s, t, None).map_or_else(|r| r.status, |_| 200))
            .collect();
        assert_eq!(per_player, [200, 200, 200, 200, 200]);
        let peer4: std::net::IpAddr = "192.0.2.4".parse().unwrap();
        assert_eq!(
            authorize(&auth, Some(&bearer(9)), peer4, "", now_s, t, None)
                .unwrap_err()
                .status,
            429
        );
        let refused: std::collections::HashMap<_, _> = auth.refused().into_iter().collect();
        assert_eq!(
            (refused["missing"], refused["malformed"], refused["other_player"]),
            (1, 5, 2)
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn join_issues_a_verifiable_token() {
        let c = cfg();
        let r = handle(&c, "GET", "/join?player=42&x=15&y=5", 1_000);
        assert_eq!(r.status, 200, "{}", r.body);
        let t: JoinGrant = serde_json::from_value(r.body).unwrap();
        assert_eq!(t.cell, [1, 0]);
        assert_eq!(t.reflector, "10.0.0.1:4001");
        assert_eq!(t.group, 4001);
        assert_eq!(t.expires_unix_s, 1_060);
        let token: [u8; reflector_proto::protocol::TOKEN_LEN] = hex::decode(&t.token).unwrap().try_into().unwrap();
        let claims = reflector_proto::auth::verify_token(&c.secret.get(), &token, 0, 4001, 42, 1_000_000).unwrap();
        assert_eq!(claims.expires_unix_s, 1_060);
    }

    /// The sample `name{labels}` of a scrape, as a number.
    fn sample(text: &str, name: &str) -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn joins_answered_and_failed_are_counted_by_cause_in_both_formats() {
        use reflector_http::expo::Format;
        let (c, joins) = (cfg(), JoinCounts::default());
        let unplaced_cfg = ControlConfig {
            world: World::for_fleet(4, 2, 10.0, fleet::Fleet::default()).unwrap(),
            ..cfg()
        };
        let scrape = |format| metrics(&c, &joins, &reflector_http::Stats::default(), format);
        // The same series before any request, at zero.
        for format in [Format::Text, Format::OpenMetrics] {
            let t = scrape(format);
            assert_eq!(sample(&t, "reflector_control_joins_answered_total"), Some(0), "{t}");
            for cause in ["unplaced", "too_many_cells", "bad_request"] {
                let name = format!("reflector_control_join_failures_total{{cause=\"{cause}\"}}");
                assert_eq!(sample(&t, &name), Some(0), "{t}");
            }
        }
        assert_eq!(joins.join(&c, "player=1&x=15&y=5", 1_000, None).status, 200);
        assert_eq!(joins.join(&c, "player=2&x=15&y=5&area=1", 1_000, None).status, 200);
        assert_eq!(joins.join(&c, "player=3&x=zz&y=5", 1_000, None).status, 400);
        // A fleet with no live reflector yet: 503 for want of a placement.
        let unplaced = joins.join(&unplaced_cfg, "player=4&x=15&y=5", 1_000, None);
        assert_eq!((unplaced.status, unplaced.retry_after_s), (503, Some(1)));
        assert_eq!(joins.answered(), 2);
        let failed: std::collections::HashMap<_, _> = joins.failed().into_iter().collect();
        assert_eq!(
            (failed["unplaced"], failed["too_many_cells"], failed["bad_request"]),
            (1, 0, 1)
        );
        for format in [Format::Text, Format::OpenMetrics] {
            let t = scrape(format);
            assert!(t.contains("# TYPE reflector_control_join_failures"), "{t}");
            assert_eq!(sample(&t, "reflector_control_joins_answered_total"), Some(2), "{t}");
            assert_eq!(
                sample(&t, "reflector_control_join_failures_total{cause=\"unplaced\"}"),
                Some(1),
                "{t}"
            );
            assert_eq!(
                sample(&t, "reflector_control_join_failures_total{cause=\"bad_request\"}"),
                Some(1),
                "{t}"
            );
        }
    }

    #[test]
    fn an_area_is_the_nearest_cells_first_cut_at_the_edges() {
        let w = world(Assign::RoundRobin); // 4 x 2 cells
        assert_eq!(w.area_of((0, 0), 1), vec![(1, 0), (0, 1), (1, 1)]);
        assert_eq!(w.area_of((1, 1), 1), vec![(0, 0), (1, 0), (2, 0), (0, 1), (2, 1)]);
        let two = w.area_of((0, 0), 2);
        assert_eq!(two.len(), 5, "{two:?}");
        assert_eq!(&two[3..], &[(2, 0), (2, 1)], "distance 2 after distance 1");
        assert!(w.area_of((3, 1), 0).is_empty());
    }

    #[test]
    fn a_batch_join_grants_each_other_group_of_the_area_once() {
        let c = cfg();
        // Cell (1, 0) of 4 x 2, three targets round-robin: its neighbours
        // (0,0) (2,0) (0,1) (1,1) (2,1) map to targets 0 2 1 2 0; its own is 1.
        let r = handle(&c, "GET", "/join?player=42&x=15&y=5&area=1", 1_000);
        assert_eq!(r.status, 200, "{}", r.body);
        let a: reflector_proto::control::AreaGrant = serde_json::from_value(r.body.clone()).unwrap();
        assert_eq!((a.cell.cell, a.cell.group), ([1, 0], 4001));
        let groups: Vec<(&str, [u32; 2])> = a.area.iter().map(|g| (g.reflector.as_str(), g.cell)).collect();
        assert_eq!(groups, [("10.0.0.1:4000", [0, 0]), ("10.0.0.2:5000", [2, 0])]);
        for g in &a.area {
            let token: [u8; reflector_proto::protocol::TOKEN_LEN] = hex::decode(&g.token).unwrap().try_into().unwrap();
            let claims =
                reflector_proto::auth::verify_token(&c.secret.get(), &token, g.reflector_id, g.group, 42, 1_000_000)
                    .unwrap();
            assert_eq!(claims.expires_unix_s, 1_060);
            assert_ne!(g.session_key, a.cell.session_key);
        }
        // A plain join's reader reads the player's own grant from it.
        let own: JoinGrant = serde_json::from_value(r.body).unwrap();
        assert_eq!(own, a.cell);
        // A plain join has no area; a too large one is refused.
        let plain = handle(&c, "GET", "/join?player=42&x=15&y=5", 1_000);
        assert!(plain.body.get("area").is_none(), "{}", plain.body);
        let big = handle(&c, "GET", "/join?player=42&x=15&y=5&area=3", 1_000);
        assert_eq!(big.status, 400);
        assert!(big.body["error"].as_str().unwrap().contains("area"), "{}", big.body);
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let c = cfg();
        let err = |url: &str| {
            let r = handle(&c, "GET", url, 0);
            assert_eq!(r.status, 400, "{url}: {}", r.body);
            r.body["error"].as_str().unwrap().to_string()
        };
        assert!(err("/join?x=1&y=1").contains("player"));
        assert!(err("/join?player=abc&x=1&y=1").contains("player=abc"));
        assert!(err("/join?player=-1&x=1&y=1").contains("player"));
        assert!(err("/join?player=1&y=1").contains("missing parameter x"));
        assert!(err("/join?player=1&x=1").contains("missing parameter y"));
        assert!(err("/join?player=1&x=zz&y=1").contains("x=zz"));
        assert!(err("/join?player=1&x=1&y=1e9").contains("outside"));
        assert!(err("/join?player=1&x=NaN&y=1").contains("finite"));
        assert_eq!(handle(&c, "GET", "/nope", 0).status, 404);
        assert_eq!(handle(&c, "POST", "/join", 0).status, 405);
        assert_eq!(handle(&c, "GET", "/healthz", 0).status, 200);
        // Encoded values are accepted.
        assert_eq!(handle(&c, "GET", "/join?player=%31&x=1%2E5&y=1", 0).status, 200);
        assert_eq!(handle(&c, "GET", "/join?player=1&x=1&y=%", 0).status, 400);
    }

    #[test]
    fn plain_http_only_on_loopback_unless_told() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert!(check_transport(at("127.0.0.1:8700"), false, false).is_ok());
        assert!(check_transport(at("[::1]:8700"), false, false).is_ok());
        let e = check_transport(at("0.0.0.0:8700"), false, false).unwrap_err();
        assert!(e.contains("--tls-cert") && e.contains("--insecure-http"), "{e}");
        assert!(check_transport(at("10.0.0.1:8700"), false, false).is_err());
        assert!(check_transport(at("10.0.0.1:8700"), true, false).is_ok());
        assert!(check_transport(at("10.0.0.1:8700"), false, true).is_ok());
    }

    #[test]
    fn world_json_describes_the_mapping() {
        let r = handle(&cfg(), "GET", "/world", 0);
        assert_eq!(r.status, 200);
        let info: reflector_proto::control::WorldInfo = serde_json::from_value(r.body.clone()).unwrap();
        assert_eq!(info.grid, [4, 2]);
        assert_eq!(info.size, [40.0, 20.0]);
        assert_eq!(r.body["cells"].as_array().unwrap().len(), 8);
        assert_eq!(r.body["cells"][2]["reflector"], "10.0.0.2:5000");
    }
}
