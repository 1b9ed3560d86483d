//! Sealing epoch keys (docs/protocol.md, "Sealed payloads"): with a master
//! secret that only the control servers hold, every `/join` grant carries
//! the epoch keys of the cells its group serves (the current epoch, and the
//! next inside the overlap window), and `GET /keys` hands them out again to
//! a player that proves its current token and session key, without a new
//! ticket.
//!
//! The checks of `/keys` and the keys handed out are pure: the clock comes
//! in as arguments, so the overlap window and the rate limit are tested
//! without waiting.

use crate::players::RateLimiter;
use crate::Reply;
use reflector_proto::auth::{Secret, SecretRing, TokenClaims, TokenError, TOKEN_LEN};
use reflector_proto::control::{EpochKeyGrant, KeysAnswer};
use reflector_proto::protocol::SessionKeys;
use reflector_proto::sealed::checkpoint::ControlSigner;
use reflector_proto::sealed::{self, CellId, MasterSecret, Schedule, WorldId};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Instant;

/// How far a `/keys` request's `at` may be from the server's clock.
pub const MAX_CLOCK_SKEW_S: u64 = 60;
/// The most cells one group may serve in a world with sealing: each grant
/// carries a key (two in the overlap window) per cell of its group, so this
/// bounds an answer (and the derivations it costs) whatever the mapping.
pub const MAX_SEALED_CELLS_PER_GROUP: usize = 64;
/// The shortest epoch: twice the overlap, so that a key is current for a
/// while before its successor is handed out (and clients do not ask again
/// and again).
pub const MIN_EPOCH_LENGTH_S: u64 = 2 * sealed::OVERLAP_S;

/// What became of a `/keys` request; each has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeysOutcome {
    Served,
    /// A parameter missing or malformed (400).
    BadRequest,
    /// The token is not ours (401).
    BadToken,
    /// The token has expired (401).
    ExpiredToken,
    /// The request's MAC does not verify under the token's session key (401).
    BadMac,
    /// `at` is more than [`MAX_CLOCK_SKEW_S`] from the server's clock (401).
    Stale,
    /// Beyond the player's rate (429).
    RateLimited,
    /// The token's group serves more cells than sealing allows (503).
    TooManyCells,
}

impl KeysOutcome {
    pub const ALL: [KeysOutcome; 8] = [
        KeysOutcome::Served,
        KeysOutcome::BadRequest,
        KeysOutcome::BadToken,
        KeysOutcome::ExpiredToken,
        KeysOutcome::BadMac,
        KeysOutcome::Stale,
        KeysOutcome::RateLimited,
        KeysOutcome::TooManyCells,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KeysOutcome::Served => "served",
            KeysOutcome::BadRequest => "bad_request",
            KeysOutcome::BadToken => "bad_token",
            KeysOutcome::ExpiredToken => "expired_token",
            KeysOutcome::BadMac => "bad_mac",
            KeysOutcome::Stale => "stale",
            KeysOutcome::RateLimited => "rate_limited",
            KeysOutcome::TooManyCells => "too_many_cells",
        }
    }
}

/// The sealing configuration of a world and its `/keys` bookkeeping.
pub struct Sealing {
    master: MasterSecret,
    world_name: String,
    world: WorldId,
    schedule: Schedule,
    /// The world's control signing key (player certificates), derived once.
    signer: ControlSigner,
    per_player: Mutex<RateLimiter<u32>>,
    outcomes: [AtomicU64; KeysOutcome::ALL.len()],
    keys_issued: AtomicU64,
    certificates_issued: AtomicU64,
}

impl std::fmt::Debug for Sealing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The master secret never shows (MasterSecret's Debug hides it too).
        f.debug_struct("Sealing")
            .field("world", &self.world_name)
            .field("schedule", &self.schedule)
            .finish_non_exhaustive()
    }
}

/// One sealing configuration is one value: a world compares equal only to
/// itself with the same one (the master secret is not comparable).
impl PartialEq for Sealing {
    fn eq(&self, other: &Sealing) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Sealing {
    /// `refresh_per_s`: `/keys` requests per second per player (bursts of
    /// five times as many).
    pub fn new(master: MasterSecret, world_name: &str, schedule: Schedule, refresh_per_s: f64) -> Sealing {
        let world = WorldId::from_name(world_name);
        Sealing {
            signer: ControlSigner::derive(&master, world),
            master,
            world_name: world_name.to_string(),
            world,
            schedule,
            per_player: Mutex::new(RateLimiter::new(refresh_per_s, refresh_per_s * 5.0)),
            outcomes: Default::default(),
            keys_issued: AtomicU64::new(0),
            certificates_issued: AtomicU64::new(0),
        }
    }

    pub fn world_name(&self) -> &str {
        &self.world_name
    }

    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// `control_public`: the world's control signing key, the same on every
    /// control server with this master secret and world.
    pub fn control_public(&self) -> [u8; 32] {
        self.signer.public_key()
    }

    /// A grant's `control_public` and `certificate` (hex) for `player`'s
    /// Ed25519 key until the token's expiry.
    pub fn certify(&self, player: u32, public_key: &[u8; 32], expires_unix_s: u64) -> (String, String) {
        let cert = self.signer.certify(player, public_key, expires_unix_s);
        self.certificates_issued.fetch_add(1, Relaxed);
        (hex::encode(self.control_public()), hex::encode(cert.signature))
    }

    /// The epoch keys handed out at `now_s` for `cells` (in order): for
    /// each, the current epoch's and, inside the overlap window, the next.
    pub fn keys_for(&self, cells: &[(u32, u32)], now_s: u64) -> Vec<EpochKeyGrant> {
        let mut out = Vec::with_capacity(cells.len() * 2);
        for &(column, row) in cells {
            // The grid is at most 4,096 cells a side (parse_grid), so every
            // cell has an id; a cell that had none would get no key.
            let Ok(cell) = CellId::new(self.world, column, row) else {
                continue;
            };
            let (current, next) = self.schedule.handed_out(&self.master, cell, now_s);
            for epoch in std::iter::once(current).chain(next) {
                let key = self.master.epoch_key(cell, epoch);
                out.push(EpochKeyGrant {
                    cell: [column, row],
                    cell_id: hex::encode(cell.0),
                    epoch,
                    key: hex::encode(key.as_bytes()),
                    starts_unix_s: self.schedule.start(&self.master, cell, epoch),
                    ends_unix_s: self.schedule.start(&self.master, cell, epoch.saturating_add(1)),
                });
            }
        }
        self.keys_issued.fetch_add(out.len() as u64, Relaxed);
        out
    }

    fn count(&self, o: KeysOutcome) {
        if let Some(i) = KeysOutcome::ALL.iter().position(|&x| x == o) {
            self.outcomes[i].fetch_add(1, Relaxed);
        }
    }

    /// `/keys` requests so far, by outcome.
    pub fn outcomes(&self) -> Vec<(&'static str, u64)> {
        KeysOutcome::ALL
            .iter()
            .zip(&self.outcomes)
            .map(|(o, n)| (o.name(), n.load(Relaxed)))
            .collect()
    }

    /// Epoch keys handed out so far, in `/join` answers and by `/keys`.
    pub fn keys_issued(&self) -> u64 {
        self.keys_issued.load(Relaxed)
    }

    /// Player key certificates made so far (one per `/join` with `sign_key`,
    /// however many grants carry it).
    pub fn certificates_issued(&self) -> u64 {
        self.certificates_issued.load(Relaxed)
    }
}

/// Reads a sealing master secret file: as the token secret's file, hex if
/// the trimmed content is all hex digits, else its bytes; at least 32 bytes,
/// one secret only (it never rolls over: the schedule and every key hang on
/// it), and never the secret shared with the reflectors, who must not be
/// able to derive the keys.
pub fn read_master_secret(path: &Path, tokens: &SecretRing) -> Result<MasterSecret, String> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read sealing secret file {p}: {e}"))?;
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let first = lines.next().unwrap_or("");
    if lines.next().is_some() {
        return Err(format!(
            "sealing secret file {p}: one secret on one line only (a master secret is never rolled over: \
             every epoch key and the schedule derive from it)"
        ));
    }
    let bytes = match hex::decode(first) {
        Ok(b) if !first.is_empty() => b,
        _ => first.as_bytes().to_vec(),
    };
    let master = MasterSecret::new(&bytes).map_err(|e| format!("sealing secret file {p}: {e}"))?;
    // Equal keys give equal MACs; distinct ones (practically) never do.
    let same = |s: &Secret| {
        Secret::new(&bytes).is_ok_and(|m| m.hmac_sha256(b"same-secret?", b"") == s.hmac_sha256(b"same-secret?", b""))
    };
    if same(&tokens.current) || tokens.previous.as_ref().is_some_and(|(s, _)| same(s)) {
        return Err(format!(
            "sealing secret file {p} holds the token secret the reflectors share: a reflector could then \
             derive every epoch key; generate a separate one (e.g. od -An -tx1 -N32 /dev/urandom | tr -d ' \\n')"
        ));
    }
    Ok(master)
}

/// The token, time and MAC of a `/keys` request.
struct KeysRequest {
    token: [u8; TOKEN_LEN],
    at_unix_s: u64,
    mac: [u8; 16],
}

fn parse_keys_request(query: &str) -> Result<KeysRequest, String> {
    let pairs = crate::query_pairs(query);
    let get = |k: &str| {
        pairs
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.trim())
            .ok_or_else(|| format!("missing parameter {k}: GET /keys?token=HEX&at=UNIX_SECONDS&mac=HEX"))
    };
    let hex_of = |k: &str, len: usize| -> Result<Vec<u8>, String> {
        hex::decode(get(k)?)
            .ok()
            .filter(|b| b.len() == len)
            .ok_or_else(|| format!("{k} is not {len} bytes of hex"))
    };
    let token = hex_of("token", TOKEN_LEN)?
        .try_into()
        .map_err(|_| "token is not 32 bytes of hex".to_string())?;
    let mac = hex_of("mac", 16)?
        .try_into()
        .map_err(|_| "mac is not 16 bytes of hex".to_string())?;
    let at = get("at")?;
    let at_unix_s = at.parse::<u64>().map_err(|_| format!("at={at} is not Unix seconds"))?;
    Ok(KeysRequest { token, at_unix_s, mac })
}

/// `GET /keys`: the checks in the document's order (the token as a
/// reflector checks it, the MAC under its session key, `at` against the
/// clock), then the player's rate, then the keys of the cells the token's
/// group serves now (`cells_of`: reflector id and port to cells). Pure:
/// the clock comes in as `now_unix_s` and `now`.
pub fn keys(
    sealing: &Sealing,
    tokens: &SecretRing,
    cells_of: impl FnOnce(u16, u16) -> Vec<(u32, u32)>,
    query: &str,
    now_unix_s: u64,
    now: Instant,
) -> Reply {
    let refuse = |o: KeysOutcome, status: u16, msg: String| {
        sealing.count(o);
        crate::bad(status, msg)
    };
    let req = match parse_keys_request(query) {
        Ok(r) => r,
        Err(e) => return refuse(KeysOutcome::BadRequest, 400, e),
    };
    let claims = TokenClaims::peek(&req.token);
    let secret = match tokens.verify_token_by(
        &req.token,
        claims.reflector,
        claims.group,
        claims.player,
        now_unix_s.saturating_mul(1000),
    ) {
        Ok((_, secret)) => secret,
        Err(TokenError::Expired) => {
            return refuse(
                KeysOutcome::ExpiredToken,
                401,
                "the token has expired: get a new one with /join".into(),
            )
        }
        Err(_) => return refuse(KeysOutcome::BadToken, 401, "the token is not one of ours".into()),
    };
    let session = SessionKeys::derive(secret, &req.token);
    if !sealed::verify_keys_request_mac(&session, &req.token, req.at_unix_s, &req.mac) {
        return refuse(
            KeysOutcome::BadMac,
            401,
            "the request's mac does not verify under the token's session key".into(),
        );
    }
    if req.at_unix_s.abs_diff(now_unix_s) > MAX_CLOCK_SKEW_S {
        return refuse(
            KeysOutcome::Stale,
            401,
            format!(
                "at={} is more than {MAX_CLOCK_SKEW_S} s from the server's clock ({now_unix_s}): sign the request with the current time",
                req.at_unix_s
            ),
        );
    }
    let limited = sealing
        .per_player
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take(claims.player, now);
    if let Err(after_s) = limited {
        sealing.count(KeysOutcome::RateLimited);
        return crate::too_many("too many key requests for this player", after_s);
    }
    let cells = cells_of(claims.reflector, claims.group);
    if cells.len() > MAX_SEALED_CELLS_PER_GROUP {
        sealing.count(KeysOutcome::TooManyCells);
        return too_many_cells(claims.group, cells.len());
    }
    sealing.count(KeysOutcome::Served);
    let answer = KeysAnswer {
        player: claims.player,
        group: claims.group,
        keys: sealing.keys_for(&cells, now_unix_s),
    };
    Reply {
        status: 200,
        body: serde_json::to_value(answer).unwrap_or_default(),
        retry_after_s: None,
    }
}

/// 503 for a group that serves more cells than sealing hands keys out for
/// (only a fleet can place so many; a static world is refused at start).
pub fn too_many_cells(group: u16, cells: usize) -> Reply {
    Reply {
        status: 503,
        body: serde_json::json!({"error": format!(
            "group {group} serves {cells} cells, more than the {MAX_SEALED_CELLS_PER_GROUP} whose keys one answer \
             carries: the fleet needs more group ports"
        )}),
        retry_after_s: Some(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{join, parse_reflector, Assign, ControlConfig, World};
    use reflector_proto::control::{KeyedAreaGrant, KeyedGrant};
    use std::sync::Arc;
    use std::time::Duration;

    const TOKEN_SECRET: [u8; 32] = [5; 32];
    const MASTER: [u8; 32] = [0x6d; 32];
    const WORLD: &str = "test world";
    /// A time well inside some epoch of every cell, far from any overlap
    /// window (epochs of 600 s, jitter below 60 s, overlap 60 s).
    const MID_EPOCH_S: u64 = 1_767_225_600 + 300;

    fn sealing() -> Arc<Sealing> {
        Arc::new(Sealing::new(
            MasterSecret::new(&MASTER).unwrap(),
            WORLD,
            Schedule::new(600, 60).unwrap(),
            1.0,
        ))
    }

    /// 4 x 2 cells round-robin onto three groups (4000, 4001 on reflector
    /// 0, 5000 on reflector 1), sealed.
    fn cfg() -> ControlConfig {
        let world = World::new(
            4,
            2,
            10.0,
            Assign::RoundRobin,
            &[
                parse_reflector("10.0.0.1:4000-4001").unwrap(),
                parse_reflector("10.0.0.2:5000").unwrap(),
            ],
        )
        .unwrap()
        .with_sealing(sealing())
        .unwrap();
        ControlConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            world,
            secret: Secret::new(&TOKEN_SECRET).unwrap().into(),
            token_ttl_s: 600,
            auth: None,
        }
    }

    fn master() -> MasterSecret {
        MasterSecret::new(&MASTER).unwrap()
    }

    fn cell_id(column: u32, row: u32) -> CellId {
        CellId::new(WorldId::from_name(WORLD), column, row).unwrap()
    }

    /// Checks every key of `grant` against the derivations and the schedule
    /// at `now_s`; returns the (cell, epoch) pairs it carries.
    fn check_keys(grant: &KeyedGrant, now_s: u64) -> Vec<([u32; 2], u32)> {
        let (m, s) = (master(), Schedule::new(600, 60).unwrap());
        grant
            .keys
            .iter()
            .map(|k| {
                let c = cell_id(k.cell[0], k.cell[1]);
                assert_eq!(k.cell_id, hex::encode(c.0), "{k:?}");
                assert_eq!(k.key, hex::encode(m.epoch_key(c, k.epoch).as_bytes()), "{k:?}");
                assert_eq!(k.starts_unix_s, s.start(&m, c, k.epoch), "{k:?}");
                assert_eq!(k.ends_unix_s, s.start(&m, c, k.epoch + 1), "{k:?}");
                assert!(
                    k.starts_unix_s <= now_s + OVERLAP && now_s < k.ends_unix_s,
                    "{k:?} is handed out at {now_s}"
                );
                (k.cell, k.epoch)
            })
            .collect()
    }
    const OVERLAP: u64 = sealed::OVERLAP_S;

    #[test]
    fn a_group_lists_exactly_the_cells_mapped_onto_it() {
        for assign in [Assign::RoundRobin, Assign::Blocks] {
            for (cols, rows, spec) in [
                (4, 2, "10.0.0.1:4000-4002"),
                (3, 3, "10.0.0.1:1-4"),
                (1, 1, "10.0.0.1:1-5"),
            ] {
                let w = World::new(cols, rows, 1.0, assign, &[parse_reflector(spec).unwrap()]).unwrap();
                let mut seen = Vec::new();
                for t in &w.targets {
                    let cells = w.cells_of_group(t.reflector_id, t.port());
                    for &c in &cells {
                        assert_eq!(w.target_of(c), Some(*t), "{assign} {cols}x{rows}: {c:?}");
                    }
                    seen.extend(cells);
                }
                seen.sort_unstable();
                let mut all = w.all_cells();
                all.sort_unstable();
                assert_eq!(seen, all, "{assign} {cols}x{rows}: every cell in exactly one group");
            }
        }
        let w = cfg().world;
        assert!(w.cells_of_group(0, 4999).is_empty(), "a group the world does not map");
        assert!(w.cells_of_group(1, 4000).is_empty(), "the port on another reflector");
    }

    #[test]
    fn join_grants_carry_the_keys_of_every_cell_their_group_serves() {
        let c = cfg();
        let now_s = MID_EPOCH_S;
        let r = join(&c, "player=42&x=15&y=5&area=1", now_s, None);
        assert_eq!(r.status, 200, "{}", r.body);
        let a: KeyedAreaGrant = serde_json::from_value(r.body).unwrap();
        // Group 4001 serves cells 1, 4 and 7 (row-major, three groups).
        let epoch = (now_s / 600) as u32;
        assert_eq!(
            check_keys(&a.cell, now_s),
            [([1, 0], epoch), ([0, 1], epoch), ([3, 1], epoch)]
        );
        // Each area grant carries its own group's cells: 4000 serves 0, 3,
        // 6 and 5000 serves 2, 5.
        assert_eq!(a.area.len(), 2);
        assert_eq!(
            check_keys(&a.area[0], now_s),
            [([0, 0], epoch), ([3, 0], epoch), ([2, 1], epoch)]
        );
        assert_eq!(check_keys(&a.area[1], now_s), [([2, 0], epoch), ([1, 1], epoch)]);
        // A plain join carries them too.
        let plain: KeyedGrant = serde_json::from_value(join(&c, "player=42&x=15&y=5", now_s, None).body).unwrap();
        assert_eq!(plain.keys, a.cell.keys);
        assert_eq!(c.world.sealing.as_ref().unwrap().keys_issued(), 3 + 3 + 2 + 3);
        // Without a sealing secret the answer has no keys field at all.
        let mut unsealed = cfg();
        unsealed.world.sealing = None;
        let r = join(&unsealed, "player=42&x=15&y=5&area=1", now_s, None);
        assert!(r.body.get("keys").is_none(), "{}", r.body);
        assert!(r.body["area"][0].get("keys").is_none(), "{}", r.body);
    }

    #[test]
    fn the_next_epoch_is_in_the_answer_only_inside_the_overlap_window() {
        let c = cfg();
        let (m, s) = (master(), Schedule::new(600, 60).unwrap());
        // Cell (1, 0)'s own grant also holds cell (0, 1): follow (1, 0).
        let cell = cell_id(1, 0);
        let e = s.current_epoch(&m, cell, MID_EPOCH_S);
        let next_start = s.start(&m, cell, e + 1);
        let epochs_at = |now_s: u64| -> Vec<u32> {
            let r = join(&c, "player=42&x=15&y=5", now_s, None);
            let g: KeyedGrant = serde_json::from_value(r.body).unwrap();
            check_keys(&g, now_s)
                .into_iter()
                .filter(|(c, _)| *c == [1, 0])
                .map(|(_, e)| e)
                .collect()
        };
        assert_eq!(epochs_at(next_start - OVERLAP - 1), [e], "a second before the window");
        assert_eq!(epochs_at(next_start - OVERLAP), [e, e + 1], "the window opens");
        assert_eq!(epochs_at(next_start - 1), [e, e + 1]);
        assert_eq!(
            epochs_at(next_start),
            [e + 1],
            "the next is current: the old one is not handed out"
        );
    }

    /// The grant's certificate, checked under its own `control_public`.
    fn certified(g: &KeyedGrant, key: &[u8; 32]) -> Option<[u8; 32]> {
        use reflector_proto::sealed::checkpoint::{verify_certificate, Certificate};
        let public: [u8; 32] = hex::decode(g.control_public.as_ref()?).unwrap().try_into().unwrap();
        let signature: [u8; 64] = hex::decode(g.certificate.as_ref()?).unwrap().try_into().unwrap();
        let cert = Certificate {
            player: g.grant.player,
            public_key: *key,
            expires_unix_s: g.grant.expires_unix_s,
            signature,
        };
        assert!(
            verify_certificate(&public, WorldId::from_name(WORLD), &cert),
            "the certificate verifies under control_public"
        );
        // For nothing else: another player, key or expiry.
        for other in [
            Certificate {
                player: cert.player + 1,
                ..cert
            },
            Certificate {
                expires_unix_s: cert.expires_unix_s + 1,
                ..cert
            },
            Certificate {
                public_key: [7; 32],
                ..cert
            },
        ] {
            assert!(!verify_certificate(&public, WorldId::from_name(WORLD), &other));
        }
        Some(public)
    }

    #[test]
    fn a_grant_with_sign_key_carries_a_certificate_of_it() {
        use reflector_proto::sealed::checkpoint::PlayerKey;
        let c = cfg();
        let key = PlayerKey::from_seed(&[3; 32]).public_key();
        let q = format!("player=42&x=15&y=5&area=1&sign_key={}", hex::encode(key));
        let r = join(&c, &q, MID_EPOCH_S, None);
        assert_eq!(r.status, 200, "{}", r.body);
        let a: KeyedAreaGrant = serde_json::from_value(r.body).unwrap();
        assert_eq!(a.cell.grant.expires_unix_s, MID_EPOCH_S + 600, "the token's expiry");
        let public = certified(&a.cell, &key).expect("the player's grant is certified");
        assert_eq!(public, c.world.sealing.as_ref().unwrap().control_public());
        assert_eq!(a.area.len(), 2);
        for g in &a.area {
            assert_eq!(certified(g, &key), Some(public), "every grant of the area");
        }
        // A plain join too; without sign_key neither field.
        let q = format!("player=42&x=15&y=5&sign_key={}", hex::encode(key).to_uppercase());
        let plain: KeyedGrant = serde_json::from_value(join(&c, &q, MID_EPOCH_S, None).body).unwrap();
        assert_eq!(certified(&plain, &key), Some(public));
        assert_eq!(
            c.world.sealing.as_ref().unwrap().certificates_issued(),
            2,
            "one per answer"
        );
        let r = join(&c, "player=42&x=15&y=5&area=1", MID_EPOCH_S, None);
        assert_eq!(
            c.world.sealing.as_ref().unwrap().certificates_issued(),
            2,
            "none without sign_key"
        );
        assert!(
            r.body.get("control_public").is_none() && r.body.get("certificate").is_none(),
            "{}",
            r.body
        );
        assert!(r.body["area"][0].get("certificate").is_none(), "{}", r.body);
        // Without a sealing secret, sign_key changes nothing.
        let mut unsealed = cfg();
        unsealed.world.sealing = None;
        let r = join(
            &unsealed,
            &format!("player=42&x=15&y=5&sign_key={}", hex::encode(key)),
            MID_EPOCH_S,
            None,
        );
        assert_eq!(r.status, 200, "{}", r.body);
        assert!(
            r.body.get("certificate").is_none() && r.body.get("control_public").is_none(),
            "{}",
            r.body
        );
    }

    #[test]
    fn a_bad_sign_key_is_400_and_names_the_parameter() {
        let c = cfg();
        for bad in ["", "abcd", &"ab".repeat(31), &"ab".repeat(33), &"zz".repeat(32)] {
            let r = join(&c, &format!("player=42&x=15&y=5&sign_key={bad}"), MID_EPOCH_S, None);
            assert_eq!(r.status, 400, "sign_key={bad}: {}", r.body);
            let e = r.body["error"].as_str().unwrap();
            assert!(e.contains("sign_key") && e.contains("64 hex digits"), "{e}");
        }
        // Checked without a sealing secret too: a bad parameter is a bad request.
        let mut unsealed = cfg();
        unsealed.world.sealing = None;
        assert_eq!(
            join(&unsealed, "player=42&x=15&y=5&sign_key=00", MID_EPOCH_S, None).status,
            400
        );
    }

    #[test]
    fn control_servers_with_the_same_sealing_secret_share_control_public() {
        let key = reflector_proto::sealed::checkpoint::PlayerKey::from_seed(&[3; 32]).public_key();
        let q = format!("player=42&x=15&y=5&sign_key={}", hex::encode(key));
        let public_of = |c: &ControlConfig| {
            let g: KeyedGrant = serde_json::from_value(join(c, &q, MID_EPOCH_S, None).body).unwrap();
            certified(&g, &key).expect("certified")
        };
        // Two servers built apart from the same secret and world.
        let (one, two) = (cfg(), cfg());
        assert_eq!(public_of(&one), public_of(&two));
        // Another master secret makes another key (and its certificates do
        // not verify under this one's).
        let other = Sealing::new(
            MasterSecret::new(&[0x6e; 32]).unwrap(),
            WORLD,
            Schedule::new(600, 60).unwrap(),
            1.0,
        );
        assert_ne!(other.control_public(), public_of(&one));
        let world = Sealing::new(master(), "another world", Schedule::new(600, 60).unwrap(), 1.0);
        assert_ne!(world.control_public(), public_of(&one));
    }

    #[test]
    fn a_world_whose_groups_serve_too_many_cells_is_refused_with_sealing() {
        let w = World::new(9, 8, 1.0, Assign::Blocks, &[parse_reflector("10.0.0.1:4000").unwrap()]).unwrap();
        let e = w.with_sealing(sealing()).unwrap_err();
        assert!(e.contains("72") && e.contains("at most 64"), "{e}");
        let w = World::new(8, 8, 1.0, Assign::Blocks, &[parse_reflector("10.0.0.1:4000").unwrap()]).unwrap();
        assert!(w.with_sealing(sealing()).is_ok(), "64 cells on one group fit");
    }

    /// A token of ours for `player` in group 4001 of reflector 0, and the
    /// query of a `/keys` request signed at `at` (by `keys`, or its own).
    fn token(player: u32, expires_unix_s: u64, secret: &Secret) -> [u8; TOKEN_LEN] {
        TokenClaims {
            player,
            reflector: 0,
            group: 4001,
            expires_unix_s,
        }
        .sign(secret)
    }

    fn query(token: &[u8; TOKEN_LEN], at: u64, keys: &SessionKeys) -> String {
        format!(
            "token={}&at={at}&mac={}",
            hex::encode(token),
            hex::encode(sealed::keys_request_mac(keys, token, at))
        )
    }

    #[test]
    fn keys_needs_the_token_and_its_session_key_and_a_current_time() {
        let c = cfg();
        let secret = Secret::new(&TOKEN_SECRET).unwrap();
        let now_s = MID_EPOCH_S;
        let t0 = Instant::now();
        let ours = token(42, now_s + 60, &secret);
        let keys = SessionKeys::derive(&secret, &ours);
        let ask = |q: &str, player_time: Instant| crate::keys(&c, q, now_s, player_time);

        let r = ask(&query(&ours, now_s - 30, &keys), t0);
        assert_eq!(r.status, 200, "{}", r.body);
        let a: KeysAnswer = serde_json::from_value(r.body).unwrap();
        assert_eq!((a.player, a.group), (42, 4001));
        // The same keys as the /join grant of that group.
        let granted: KeyedGrant = serde_json::from_value(join(&c, "player=42&x=15&y=5", now_s, None).body).unwrap();
        assert_eq!(a.keys, granted.keys);

        let status = |q: String| {
            let r = ask(&q, t0);
            assert!(r.body["error"].is_string(), "{}", r.body);
            (r.status, r.body["error"].as_str().unwrap_or_default().to_string())
        };
        // Another session key's MAC (a token seen on the path is not enough).
        let other_keys = SessionKeys::derive(&secret, &token(42, now_s + 61, &secret));
        let (s, e) = status(query(&ours, now_s, &other_keys));
        assert_eq!(s, 401);
        assert!(e.contains("mac"), "{e}");
        // A forged token (not under our secret), and an expired one.
        let forged = token(42, now_s + 60, &Secret::new(&[6; 32]).unwrap());
        let (s, e) = status(query(
            &forged,
            now_s,
            &SessionKeys::derive(&Secret::new(&[6; 32]).unwrap(), &forged),
        ));
        assert_eq!(s, 401);
        assert!(e.contains("not one of ours"), "{e}");
        let expired = token(42, now_s - 1, &secret);
        let (s, e) = status(query(&expired, now_s, &SessionKeys::derive(&secret, &expired)));
        assert_eq!(s, 401);
        assert!(e.contains("expired"), "{e}");
        // A stale or future `at`, even correctly signed.
        for at in [now_s - 61, now_s + 61] {
            let (s, e) = status(query(&ours, at, &keys));
            assert_eq!(s, 401, "at {at}");
            assert!(e.contains("60 s"), "{e}");
        }
        assert_eq!(
            ask(&query(&ours, now_s + 60, &keys), t0).status,
            200,
            "60 s off is fine"
        );
        // Bad parameters.
        let good = query(&ours, now_s, &keys);
        let without = |k: &str| {
            good.split('&')
                .filter(|p| !p.starts_with(k))
                .collect::<Vec<_>>()
                .join("&")
        };
        for (q, names) in [
            (without("token="), "missing parameter token"),
            (without("at="), "missing parameter at"),
            (without("mac="), "missing parameter mac"),
            (good.replace("token=", "token=zz"), "token"),
            (good.replace("mac=", "mac=00"), "mac"),
            (good.replace(&format!("at={now_s}"), "at=soon"), "at=soon"),
        ] {
            let (s, e) = status(q.clone());
            assert_eq!(s, 400, "{q}");
            assert!(e.contains(names), "{q}: {e}");
        }
        let outcomes: std::collections::HashMap<_, _> =
            c.world.sealing.as_ref().unwrap().outcomes().into_iter().collect();
        assert_eq!(
            (
                outcomes["served"],
                outcomes["bad_mac"],
                outcomes["bad_token"],
                outcomes["expired_token"],
                outcomes["stale"],
                outcomes["bad_request"]
            ),
            (2, 1, 1, 1, 2, 6)
        );
    }

    #[test]
    fn keys_beyond_the_players_rate_get_429_with_retry_after() {
        let c = cfg();
        let secret = Secret::new(&TOKEN_SECRET).unwrap();
        let now_s = MID_EPOCH_S;
        let t0 = Instant::now();
        let (a, b) = (token(42, now_s + 60, &secret), token(43, now_s + 60, &secret));
        let (ka, kb) = (SessionKeys::derive(&secret, &a), SessionKeys::derive(&secret, &b));
        // One a second, bursts of five: the sixth at once waits a second.
        let statuses: Vec<u16> = (0..6)
            .map(|_| crate::keys(&c, &query(&a, now_s, &ka), now_s, t0).status)
            .collect();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
        let limited = crate::keys(&c, &query(&a, now_s, &ka), now_s, t0);
        assert_eq!((limited.status, limited.retry_after_s), (429, Some(1)));
        assert!(
            limited.body["error"].as_str().unwrap().contains("too many"),
            "{}",
            limited.body
        );
        // Another player is not affected, and the first gets one more a second later.
        assert_eq!(crate::keys(&c, &query(&b, now_s, &kb), now_s, t0).status, 200);
        let later = t0 + Duration::from_secs(1);
        assert_eq!(crate::keys(&c, &query(&a, now_s, &ka), now_s, later).status, 200);
        // Refusals before the MAC check cost the player nothing: a bad MAC
        // with a player's token cannot drain its budget.
        let c = cfg();
        let other = SessionKeys::derive(&secret, &b);
        for _ in 0..20 {
            assert_eq!(crate::keys(&c, &query(&a, now_s, &other), now_s, t0).status, 401);
        }
        assert_eq!(crate::keys(&c, &query(&a, now_s, &ka), now_s, t0).status, 200);
        let outcomes: std::collections::HashMap<_, _> =
            c.world.sealing.as_ref().unwrap().outcomes().into_iter().collect();
        assert_eq!(
            (outcomes["bad_mac"], outcomes["served"], outcomes["rate_limited"]),
            (20, 1, 0)
        );
    }

    #[test]
    fn keys_without_a_sealing_secret_is_not_served() {
        let mut c = cfg();
        c.world.sealing = None;
        let r = crate::handle(&c, "GET", "/keys?token=00&at=0&mac=00", MID_EPOCH_S);
        assert_eq!(r.status, 404);
        assert!(
            r.body["error"].as_str().unwrap().contains("--sealing-secret-file"),
            "{}",
            r.body
        );
    }

    /// The keys this server hands out are the protocol's test vectors'
    /// `keys_answers`, field for field.
    #[test]
    fn handed_out_keys_are_the_test_vectors() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol-vectors.json");
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the protocol's vectors")).unwrap();
        let sec = &file["sealed"];
        let master = MasterSecret::new(&hex::decode(sec["master_secret"].as_str().unwrap()).unwrap()).unwrap();
        let schedule = Schedule::new(
            sec["epoch_length_s"].as_u64().unwrap(),
            sec["jitter_bound_s"].as_u64().unwrap(),
        )
        .unwrap();
        let s = Sealing::new(master, sec["world"].as_str().unwrap(), schedule, 1.0);
        let answers = sec["keys_answers"].as_array().expect("keys_answers");
        assert!(!answers.is_empty());
        for a in answers {
            let cells: Vec<(u32, u32)> = serde_json::from_value::<Vec<[u32; 2]>>(a["cells"].clone())
                .unwrap()
                .into_iter()
                .map(|[c, r]| (c, r))
                .collect();
            let got = serde_json::to_value(s.keys_for(&cells, a["at_unix_s"].as_u64().unwrap())).unwrap();
            assert_eq!(got, a["keys"], "{}", a["name"]);
        }
    }

    #[test]
    fn a_master_secret_file_is_checked_and_named() {
        let dir = std::env::temp_dir().join(format!("control-sealing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tokens: SecretRing = Secret::new(&TOKEN_SECRET).unwrap().into();
        let read = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            read_master_secret(&p, &tokens).map(|_| ())
        };
        assert_eq!(read("hex", &format!("{}\n", "6d".repeat(32))), Ok(()));
        assert_eq!(read("phrase", "a passphrase of thirty-two bytes or more\n"), Ok(()));
        let e = read("short", &"6d".repeat(31)).unwrap_err();
        assert!(
            e.contains("short") && e.contains("31 bytes") && e.contains("at least 32"),
            "{e}"
        );
        let e = read(
            "two",
            &format!("{}\nprevious {} until 5\n", "6d".repeat(32), "6e".repeat(32)),
        )
        .unwrap_err();
        assert!(e.contains("two") && e.contains("one secret"), "{e}");
        let e = read("token", &"05".repeat(32)).unwrap_err();
        assert!(e.contains("token secret"), "{e}");
        let e = read_master_secret(&dir.join("absent"), &tokens)
            .map(|_| ())
            .unwrap_err();
        assert!(e.contains("absent") && e.contains("cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
