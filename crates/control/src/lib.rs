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

mod cli;
pub mod fleet;
pub mod players;
pub mod sealing;
mod secret;
mod world;
// Split out by role, but their items keep the paths they had at the crate
// root, where the other crates and the tests name them.
pub use cli::{check_transport, parse_grid, parse_reflector, run, try_hint, ControlArgs};
pub use secret::{SecretCell, SECRET_RECHECK};
pub use world::{Assign, MapError, ReflectorSpec, Target, World};

/// Boxed error for command entry points: `main` prints it with its causes.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

use reflector_proto::auth::TokenClaims;
use reflector_proto::control::{JoinGrant, KeyedAreaGrant, KeyedGrant};
use reflector_proto::protocol::SessionKeys;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

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

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::Secret;

    fn refl(s: &str) -> ReflectorSpec {
        parse_reflector(s).unwrap()
    }

    fn world(assign: Assign) -> World {
        World::new(4, 2, 10.0, assign, &[refl("10.0.0.1:4000-4001"), refl("10.0.0.2:5000")]).unwrap()
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
