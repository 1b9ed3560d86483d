//! The fleet's registry in Redis (paper 000's many groups over many
//! reflectors): each reflector registers itself and heartbeats a signed
//! entry with a TTL; control servers read the live entries and place every
//! cell of the world on one reflector's group with an atomic claim, so two
//! control servers never place one cell twice and a placement stays while
//! its reflector lives.
//!
//! What is in Redis, under a prefix (default `reflector`):
//!
//! | key | type | what |
//! | --- | --- | --- |
//! | `P:next-id` | counter | `INCR`: reflector ids, never reused |
//! | `P:reflectors` | set | ids that registered (stale ones are pruned) |
//! | `P:reflector:ID` | string, TTL | the reflector's [`Registration`] (JSON), signed, refreshed every heartbeat |
//! | `P:cells` | hash | cell `x,y` -> `ID:PORT`, changed only by compare-and-set |
//!
//! No token, session key or game secret is ever stored there. An entry is
//! signed (HMAC-SHA256) with the secret reflectors and control servers
//! share, over its fields and its expiry, so a writer to Redis who does not
//! hold the secret cannot route players to a reflector of its own
//! ([`View::rogue`] counts what was refused), nor replay an old entry
//! beyond its expiry. Liveness is the entry's TTL, found by polling: a
//! reflector whose heartbeats stop is gone from the next refresh after its
//! TTL.

#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod tls;

pub use tls::RegistryTls;

use redis::Connection;
use reflector_proto::auth::{Secret, SecretRing};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Where the registry is and how long an entry lives without a heartbeat.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// `redis://[user:password@]host:port[/db]` (`rediss://` for TLS).
    pub url: String,
    /// Prefix of every key, so several fleets can share one Redis.
    pub prefix: String,
    /// An entry's time to live; heartbeats go every third of it.
    pub ttl: Duration,
    /// How a `rediss://` server is checked (default: the system's roots).
    pub tls: RegistryTls,
}

impl RegistryConfig {
    pub fn new(url: &str) -> RegistryConfig {
        RegistryConfig {
            url: url.to_string(),
            prefix: "reflector".into(),
            ttl: DEFAULT_TTL,
            tls: RegistryTls::default(),
        }
    }

    /// `url` with the password read from `password_file` (trimmed), so no
    /// password is ever on a command line or in a config file: a URL that
    /// carries one is refused.
    pub fn url_with_password(url: &str, password_file: Option<&std::path::Path>) -> Result<String, RegistryError> {
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(RegistryError::Bad(format!(
                "'{url}' is not a Redis URL (redis://[user@]host:port, or rediss:// for TLS)"
            )));
        };
        if !matches!(scheme, "redis" | "rediss") {
            return Err(RegistryError::Bad(format!(
                "'{scheme}://': only redis:// and rediss:// are registries"
            )));
        }
        let (user, host) = match rest.rsplit_once('@') {
            Some((auth, _)) if auth.contains(':') => {
                return Err(RegistryError::Bad(
                    "the registry URL carries a password: put it in --registry-password-file instead".into(),
                ))
            }
            Some((user, host)) => (user, host),
            None => ("", rest),
        };
        let Some(path) = password_file else {
            return Ok(url.to_string());
        };
        let password = std::fs::read_to_string(path)
            .map_err(|e| RegistryError::Bad(format!("cannot read {}: {e}", path.display())))?;
        let password = password.trim();
        if password.is_empty() || password.contains(['@', '/', ' ']) {
            return Err(RegistryError::Bad(format!(
                "{}: the password must be one line without '@', '/' or spaces",
                path.display()
            )));
        }
        Ok(format!("{scheme}://{user}:{password}@{host}"))
    }

    /// How often a reflector heartbeats (a third of the TTL: two may be
    /// lost before it is taken for dead).
    pub fn heartbeat_every(&self) -> Duration {
        self.ttl / 3
    }

    fn key(&self, what: &str) -> String {
        format!("{}:{what}", self.prefix)
    }
}

/// A dead reflector is noticed within this plus a control server's poll.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3);

/// How long a Redis call may take before it counts as failed: the
/// registry is polled, so a slow Redis costs a poll, not a stall.
const IO_TIMEOUT: Duration = Duration::from_millis(500);

/// Clocks of the fleet's hosts may differ by this much.
const CLOCK_SKEW_MS: u64 = 1_000;

/// The signature's domain: no other HMAC under the secret means this.
const SIG_LABEL: &[u8] = b"reflector registration v1";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry {url}: {source}")]
    Redis {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("registry: reflector ids are exhausted (id {0} is above 65535): use a new prefix or reset {1}")]
    IdsExhausted(u64, String),
    #[error("registry: reflector id {0} is held by a live reflector; ids are never shared")]
    IdTaken(u16),
    #[error("registry: {0}")]
    Bad(String),
    /// A connection that cannot work until the operator changes something
    /// (a certificate, a CA file, the URL's scheme), unlike an outage.
    #[error("registry {url}: {problem}")]
    Misconfigured { url: String, problem: String },
}

impl RegistryError {
    /// Whether retrying cannot help: the set-up is wrong, Redis is not down.
    pub fn is_misconfigured(&self) -> bool {
        matches!(self, RegistryError::Bad(_) | RegistryError::Misconfigured { .. })
    }
}

/// What a reflector tells the fleet about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Registration {
    pub id: u16,
    /// The address members send to.
    pub addr: IpAddr,
    /// Its group ports.
    pub ports: Vec<u16>,
    /// Members it takes at most, over all its groups.
    pub capacity: u64,
    /// Its load at the last heartbeat: members, and copies sent per second.
    pub members: u64,
    pub copies_per_s: u64,
    /// Being taken out of service: no new cells go there, and its cells
    /// are placed elsewhere.
    pub draining: bool,
    /// The signature holds until then (Unix ms): a replayed old entry
    /// expires with it.
    pub valid_until_unix_ms: u64,
    /// Random per process (hex): a heartbeat rewrites only its own entry,
    /// so two processes never share an id unnoticed.
    #[serde(default)]
    pub instance: String,
    /// HMAC-SHA256 (hex) of the other fields under the shared secret.
    #[serde(default)]
    pub sig: String,
}

impl Registration {
    fn signed_bytes(&self) -> Vec<u8> {
        let unsigned = Registration {
            sig: String::new(),
            ..self.clone()
        };
        // Serialising a struct of plain fields cannot fail.
        serde_json::to_vec(&unsigned).unwrap_or_default()
    }

    pub fn sign(&mut self, secret: &Secret) {
        self.sig = hex::encode(secret.hmac_sha256(SIG_LABEL, &self.signed_bytes()));
    }

    /// Whether the entry was made by a holder of `secret` and has not
    /// expired at `now_unix_ms`.
    pub fn verify(&self, secret: &Secret, now_unix_ms: u64) -> Result<(), Refused> {
        let want = secret.hmac_sha256(SIG_LABEL, &self.signed_bytes());
        let got = hex::decode(&self.sig).map_err(|_| Refused::BadSignature)?;
        // Equal lengths first; then every byte compared, whatever differs.
        if got.len() != want.len() || got.iter().zip(want.iter()).fold(0u8, |d, (a, b)| d | (a ^ b)) != 0 {
            return Err(Refused::BadSignature);
        }
        self.check_fields(now_unix_ms)
    }

    /// [`Registration::verify`] with a ring's current secret, or its
    /// previous one while that is accepted: during a rollover reflectors
    /// and control servers hold different files for a while.
    pub fn verify_ring(&self, ring: &SecretRing, now_unix_ms: u64) -> Result<(), Refused> {
        match self.verify(&ring.current, now_unix_ms) {
            Err(Refused::BadSignature) => match &ring.previous {
                Some((old, until)) if now_unix_ms < until.saturating_mul(1000) => self.verify(old, now_unix_ms),
                _ => Err(Refused::BadSignature),
            },
            other => other,
        }
    }

    fn check_fields(&self, now_unix_ms: u64) -> Result<(), Refused> {
        if now_unix_ms > self.valid_until_unix_ms.saturating_add(CLOCK_SKEW_MS) {
            return Err(Refused::Expired);
        }
        if self.ports.is_empty() {
            return Err(Refused::NoPorts);
        }
        Ok(())
    }
}

/// Why an entry was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    BadSignature,
    Expired,
    NoPorts,
}

/// A lazily (re)connected Redis connection: a call that fails drops it,
/// and the next call connects again, so Redis restarting costs the calls
/// made while it is down and nothing more.
struct Link {
    cfg: RegistryConfig,
    client: redis::Client,
    conn: Option<Connection>,
}

impl Link {
    fn new(cfg: &RegistryConfig) -> Result<Link, RegistryError> {
        let client = tls::client(&cfg.url, &cfg.tls)?;
        Ok(Link {
            cfg: cfg.clone(),
            client,
            conn: None,
        })
    }

    fn err(&self, source: redis::RedisError) -> RegistryError {
        RegistryError::Redis {
            url: redacted(&self.cfg.url),
            source,
        }
    }

    fn with<T>(&mut self, f: impl FnOnce(&mut Connection) -> redis::RedisResult<T>) -> Result<T, RegistryError> {
        if self.conn.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(IO_TIMEOUT)
                .map_err(|e| tls::explain(&self.cfg.url, &self.cfg.tls, &self.client, e, IO_TIMEOUT))?;
            c.set_read_timeout(Some(IO_TIMEOUT)).map_err(|e| self.err(e))?;
            c.set_write_timeout(Some(IO_TIMEOUT)).map_err(|e| self.err(e))?;
            self.conn = Some(c);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Err(RegistryError::Bad("no connection".into()));
        };
        match f(conn) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn = None;
                Err(self.err(e))
            }
        }
    }
}

/// The URL without its password, for messages.
pub fn redacted(url: &str) -> String {
    // Within what follows the scheme only: an '@' before "://" (a typo) is
    // no password to hide, nor an index to cut at.
    match url
        .split_once("://")
        .and_then(|(scheme, rest)| Some((scheme, rest.rsplit_once('@')?)))
    {
        Some((scheme, (auth, host))) => {
            let user = auth.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_string(),
    }
}

fn unix_ms() -> u64 {
    reflector_proto::unix_now_ms()
}

/// Redis' `run_id` and uptime (`INFO server`): a new `run_id` is a
/// restart, which may have lost every key.
fn server_info(link: &mut Link) -> Result<(String, u64), RegistryError> {
    let info: String = link.with(|c| redis::cmd("INFO").arg("server").query(c))?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    let uptime = field("uptime_in_seconds").parse().unwrap_or(u64::MAX);
    Ok((field("run_id"), uptime))
}

/// A Redis that restarted lost its id counter with its keys: live
/// reflectors put it back at their next heartbeat, so a newcomer waits
/// until they all had the chance (two TTLs of the longest allowed, 20 s
/// at most) before it takes an id.
fn wait_for_reregistration(link: &mut Link) -> Result<(), RegistryError> {
    let hold = (2 * link.cfg.ttl).min(Duration::from_secs(20));
    let (_, uptime) = server_info(link)?;
    let up = Duration::from_secs(uptime);
    if up < hold {
        let wait = hold - up + Duration::from_secs(1);
        tracing::info!(
            "registry {} started {up:?} ago: waiting {wait:?} so live reflectors register again before a new id is taken",
            redacted(&link.cfg.url)
        );
        std::thread::sleep(wait);
    }
    Ok(())
}

/// A reflector's side: registers once, then heartbeats.
pub struct Registrar {
    link: Link,
    secret: SecretRing,
    reg: Registration,
    write_script: redis::Script,
}

/// KEYS: the entry, the id counter, the id set; ARGV: the entry's JSON, its
/// TTL in ms, this process's instance, 1 for a first write, the id.
const WRITE: &str = r"
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[4] == '1' then return 0 end
  local ok, e = pcall(cjson.decode, cur)
  if not ok or e['instance'] ~= ARGV[3] then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if n < tonumber(ARGV[5]) then redis.call('SET', KEYS[2], ARGV[5]) end
redis.call('SADD', KEYS[3], ARGV[5])
return 1
";

/// A fresh random instance id (hex).
fn instance_id() -> String {
    let mut b = [0u8; 8];
    // Without an OS random source nothing here can be trusted anyway;
    // the time keeps two processes apart in that case.
    if getrandom::getrandom(&mut b).is_err() {
        b = unix_ms().to_be_bytes();
    }
    hex::encode(b)
}

/// The secret an entry is signed with: the previous one while it is still
/// accepted (the control servers may not have the new file yet: a rollover
/// gives the reflectors the new secret first), else the current one.
fn signing_secret(ring: &SecretRing, now_unix_ms: u64) -> &Secret {
    match &ring.previous {
        Some((old, until)) if now_unix_ms < until.saturating_mul(1000) => old,
        _ => &ring.current,
    }
}

impl Registrar {
    /// Registers a reflector serving `ports` on `addr`. `id`: the one to
    /// use (refused if a live reflector holds it), or `None` for a new one
    /// from the counter (ids are never reused).
    pub fn register(
        cfg: &RegistryConfig,
        secret: &SecretRing,
        id: Option<u16>,
        addr: IpAddr,
        ports: &[u16],
        capacity: u64,
    ) -> Result<Registrar, RegistryError> {
        let mut link = Link::new(cfg)?;
        wait_for_reregistration(&mut link)?;
        let id = match id {
            Some(id) => id,
            None => {
                let next = cfg.key("next-id");
                let n: u64 = link.with(|c| redis::cmd("INCR").arg(&next).query(c))?;
                u16::try_from(n).map_err(|_| RegistryError::IdsExhausted(n, next))?
            }
        };
        let mut r = Registrar {
            link,
            secret: secret.clone(),
            reg: Registration {
                id,
                addr,
                ports: ports.to_vec(),
                capacity,
                members: 0,
                copies_per_s: 0,
                draining: false,
                valid_until_unix_ms: 0,
                instance: instance_id(),
                sig: String::new(),
            },
            write_script: redis::Script::new(WRITE),
        };
        // The first write only if nobody holds the id: two live reflectors
        // with one id would get each other's tokens.
        if !r.write(true)? {
            return Err(RegistryError::IdTaken(id));
        }
        Ok(r)
    }

    pub fn id(&self) -> u16 {
        self.reg.id
    }

    /// The secret file changed: entries are signed with the new ring.
    pub fn set_secret(&mut self, ring: SecretRing) {
        self.secret = ring;
    }

    /// Writes the entry: the first time only if nobody holds the id, later
    /// only if the entry there is this process's own (or gone: a restart of
    /// Redis, an outage longer than the TTL); either way the id counter is
    /// kept at least at this id, so a Redis that lost its keys does not
    /// hand a live reflector's id to a newcomer. False if the id is held.
    fn write(&mut self, only_new: bool) -> Result<bool, RegistryError> {
        let ttl = self.link.cfg.ttl;
        let now = unix_ms();
        self.reg.valid_until_unix_ms = now + ttl.as_millis() as u64;
        self.reg.sign(signing_secret(&self.secret, now));
        let key = self.link.cfg.key(&format!("reflector:{}", self.reg.id));
        let (next, set) = (self.link.cfg.key("next-id"), self.link.cfg.key("reflectors"));
        let value = serde_json::to_string(&self.reg).map_err(|e| RegistryError::Bad(e.to_string()))?;
        let (id, instance) = (self.reg.id, self.reg.instance.clone());
        let script = &self.write_script;
        let written: i64 = self.link.with(|c| {
            script
                .key(&key)
                .key(&next)
                .key(&set)
                .arg(&value)
                .arg(ttl.as_millis() as u64)
                .arg(&instance)
                .arg(u8::from(only_new))
                .arg(id)
                .invoke(c)
        })?;
        Ok(written == 1)
    }

    /// Refreshes the entry with the load now (call every
    /// [`RegistryConfig::heartbeat_every`]). After an outage of Redis, or a
    /// restart that lost the keys, this writes the entry again.
    pub fn heartbeat(&mut self, members: u64, copies_per_s: u64, draining: bool) -> Result<(), RegistryError> {
        self.reg.members = members;
        self.reg.copies_per_s = copies_per_s;
        self.reg.draining = draining;
        if self.write(false)? {
            Ok(())
        } else {
            // Another process wrote an entry under this id while ours was
            // gone (an outage of Redis longer than the TTL, and a newcomer
            // given the id): both now accept the same tokens.
            Err(RegistryError::IdTaken(self.reg.id))
        }
    }

    /// This reflector's ports that some cell of the world is placed on now
    /// (`P:cells`), and whether any cell is placed at all (an empty hash is
    /// a Redis that lost its keys, not a verdict on this reflector).
    pub fn placed_ports(&mut self) -> Result<(std::collections::HashSet<u16>, bool), RegistryError> {
        let key = self.link.cfg.key("cells");
        let cells: Vec<String> = self.link.with(|c| redis::cmd("HVALS").arg(&key).query(c))?;
        let mine = cells
            .iter()
            .filter_map(|v| Placed::decode(v))
            .filter(|p| p.reflector == self.reg.id)
            .map(|p| p.port)
            .collect();
        Ok((mine, !cells.is_empty()))
    }

    /// Removes the entry (a clean stop): its cells are placed elsewhere at
    /// the control servers' next poll rather than after the TTL.
    pub fn deregister(&mut self) -> Result<(), RegistryError> {
        let key = self.link.cfg.key(&format!("reflector:{}", self.reg.id));
        let (set, id) = (self.link.cfg.key("reflectors"), self.reg.id);
        self.link.with(|c| redis::cmd("DEL").arg(&key).query::<()>(c))?;
        self.link.with(|c| redis::cmd("SREM").arg(&set).arg(id).query::<()>(c))
    }
}

/// One group on one reflector, where a cell is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Placed {
    pub reflector: u16,
    pub port: u16,
}

impl Placed {
    fn encode(self) -> String {
        format!("{}:{}", self.reflector, self.port)
    }

    fn decode(s: &str) -> Option<Placed> {
        let (r, p) = s.split_once(':')?;
        Some(Placed {
            reflector: r.parse().ok()?,
            port: p.parse().ok()?,
        })
    }
}

/// A control server's picture of the fleet after a refresh.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Live reflectors by id (entries that verified).
    pub reflectors: BTreeMap<u16, Registration>,
    /// Every cell placed on a live reflector.
    pub cells: HashMap<(u32, u32), Placed>,
    /// Entries refused (bad signature, expired, no ports) since the start.
    pub rogue: u64,
    /// Cells this control server placed or moved since the start.
    pub claims: u64,
}

impl View {
    /// Where members of `cell` go: the reflector's address and the group.
    pub fn target(&self, cell: (u32, u32)) -> Option<(u16, SocketAddr)> {
        let p = self.cells.get(&cell)?;
        let r = self.reflectors.get(&p.reflector)?;
        Some((p.reflector, SocketAddr::new(r.addr, p.port)))
    }
}

/// Compare-and-set of one cell: sets it to ARGV[3] if it is ARGV[2] now
/// ('' for unset); returns whether it did, and what it is afterwards (ours,
/// or the placement another control server made first).
const CLAIM: &str = r"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur == false and ARGV[2] == '') or cur == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return {1, ARGV[3]}
end
return {0, cur or ''}
";

/// A control server's side: polls the registry and keeps every cell of the
/// world placed on a live reflector that is not draining.
pub struct Directory {
    link: Link,
    secret: SecretRing,
    claim: redis::Script,
    view: View,
    /// Redis' run id at the last refresh: a new one is a restart.
    run_id: Option<String>,
    /// After a restart, until then no cell moves: the reflectors register
    /// again and the placements held here are written back.
    hold_until: Option<Instant>,
}

impl Directory {
    pub fn new(cfg: &RegistryConfig, secret: &SecretRing) -> Result<Directory, RegistryError> {
        Ok(Directory {
            link: Link::new(cfg)?,
            secret: secret.clone(),
            claim: redis::Script::new(CLAIM),
            view: View::default(),
            run_id: None,
            hold_until: None,
        })
    }

    /// The secret file changed: entries are checked with the new ring.
    pub fn set_secret(&mut self, ring: SecretRing) {
        self.secret = ring;
    }

    /// Connects and pings once: a control server checks its set-up at
    /// start ([`RegistryError::is_misconfigured`] is worth stopping for; an
    /// unreachable Redis is not, it answers from placements once it has any).
    pub fn check(&mut self) -> Result<(), RegistryError> {
        self.link.with(|c| redis::cmd("PING").query::<String>(c)).map(drop)
    }

    /// The view of the last successful refresh (kept while Redis is down).
    pub fn view(&self) -> &View {
        &self.view
    }

    /// Reads the live reflectors, then places each of `cells` that has no
    /// live, serving reflector (atomically: if another control server
    /// placed it first, its placement is taken). On an error the previous
    /// view stays in force.
    pub fn refresh(&mut self, cells: &[(u32, u32)]) -> Result<&View, RegistryError> {
        let (run_id, _) = server_info(&mut self.link)?;
        if self.run_id.as_ref().is_some_and(|r| *r != run_id) {
            let hold = 2 * self.link.cfg.ttl;
            tracing::warn!(
                "registry {} restarted: placements held for {hold:?} while the reflectors register again",
                redacted(&self.link.cfg.url)
            );
            self.hold_until = Some(Instant::now() + hold);
        }
        self.run_id = Some(run_id);
        if self.hold_until.is_some_and(|t| Instant::now() >= t) {
            self.hold_until = None;
        }
        let live = self.read_reflectors()?;
        if self.hold_until.is_some() {
            return self.hold(live);
        }
        let key = self.link.cfg.key("cells");
        let stored: HashMap<String, String> = self.link.with(|c| redis::cmd("HGETALL").arg(&key).query(c))?;
        let serving = |p: &Placed| {
            live.get(&p.reflector)
                .is_some_and(|r| !r.draining && r.ports.contains(&p.port))
        };
        // Cells per reflector and per group, for the least loaded choice.
        let mut load: HashMap<u16, u64> = HashMap::new();
        let mut per_group: HashMap<Placed, u64> = HashMap::new();
        let mut placed: HashMap<(u32, u32), Placed> = HashMap::new();
        let mut raw: HashMap<(u32, u32), String> = HashMap::new();
        for &cell in cells {
            let field = format!("{},{}", cell.0, cell.1);
            if let Some(v) = stored.get(&field) {
                raw.insert(cell, v.clone());
                if let Some(p) = Placed::decode(v).filter(|p| serving(p)) {
                    *load.entry(p.reflector).or_default() += 1;
                    *per_group.entry(p).or_default() += 1;
                    placed.insert(cell, p);
                }
            }
        }
        for &cell in cells {
            if placed.contains_key(&cell) {
                continue;
            }
            let Some(choice) = choose(&live, &load, &per_group) else {
                break; // no reflector serves: the cells wait for one
            };
            let field = format!("{},{}", cell.0, cell.1);
            let expected = raw.get(&cell).cloned().unwrap_or_default();
            let claim = &self.claim;
            let (ours, now): (i64, String) = self.link.with(|c| {
                claim
                    .key(&key)
                    .arg(&field)
                    .arg(&expected)
                    .arg(choice.encode())
                    .invoke(c)
            })?;
            let got = Placed::decode(&now);
            if ours == 1 {
                self.view.claims += 1;
            }
            if let Some(p) = got.filter(|p| live.contains_key(&p.reflector)) {
                *load.entry(p.reflector).or_default() += 1;
                *per_group.entry(p).or_default() += 1;
                placed.insert(cell, p);
            }
        }
        self.view.reflectors = live;
        self.view.cells = placed;
        Ok(&self.view)
    }

    /// While Redis has just restarted: every placement held here is written
    /// back unless another control server wrote one first (then that one
    /// is taken), and nothing moves; reflectors not registered again yet
    /// keep their entries of before in the view, so `/join` goes on.
    fn hold(&mut self, live: BTreeMap<u16, Registration>) -> Result<&View, RegistryError> {
        let key = self.link.cfg.key("cells");
        let held: Vec<((u32, u32), Placed)> = self.view.cells.iter().map(|(c, p)| (*c, *p)).collect();
        for (cell, p) in held {
            let field = format!("{},{}", cell.0, cell.1);
            let claim = &self.claim;
            let (_, now): (i64, String) = self
                .link
                .with(|c| claim.key(&key).arg(&field).arg("").arg(p.encode()).invoke(c))?;
            if let Some(q) = Placed::decode(&now) {
                self.view.cells.insert(cell, q);
            }
        }
        for (id, r) in live {
            self.view.reflectors.insert(id, r);
        }
        Ok(&self.view)
    }

    fn read_reflectors(&mut self) -> Result<BTreeMap<u16, Registration>, RegistryError> {
        let set = self.link.cfg.key("reflectors");
        let ids: Vec<u16> = self.link.with(|c| redis::cmd("SMEMBERS").arg(&set).query(c))?;
        let mut live = BTreeMap::new();
        if ids.is_empty() {
            return Ok(live);
        }
        let keys: Vec<String> = ids
            .iter()
            .map(|id| self.link.cfg.key(&format!("reflector:{id}")))
            .collect();
        let values: Vec<Option<String>> = self.link.with(|c| redis::cmd("MGET").arg(&keys).query(c))?;
        let now = unix_ms();
        let mut gone = Vec::new();
        for (&id, v) in ids.iter().zip(values) {
            let Some(v) = v else {
                gone.push(id);
                continue;
            };
            match serde_json::from_str::<Registration>(&v) {
                Ok(r) if r.id == id && r.verify_ring(&self.secret, now).is_ok() => {
                    live.insert(id, r);
                }
                Ok(r) => {
                    self.view.rogue += 1;
                    tracing::warn!(
                        "registry: entry of reflector {id} refused ({:?}): not signed with this fleet's secret, or stale",
                        r.verify_ring(&self.secret, now).err()
                    );
                }
                Err(e) => {
                    self.view.rogue += 1;
                    tracing::warn!("registry: entry of reflector {id} does not parse: {e}");
                }
            }
        }
        // Ids whose entry expired: pruned, so the set does not grow for ever.
        if !gone.is_empty() {
            self.link
                .with(|c| redis::cmd("SREM").arg(&set).arg(&gone).query::<()>(c))?;
        }
        Ok(live)
    }
}

/// The live, serving reflector with the fewest cells (then the fewest
/// members, then the lowest id), and its group with the fewest cells.
fn choose(
    live: &BTreeMap<u16, Registration>,
    load: &HashMap<u16, u64>,
    per_group: &HashMap<Placed, u64>,
) -> Option<Placed> {
    let r = live
        .values()
        .filter(|r| !r.draining && !r.ports.is_empty())
        .min_by_key(|r| (load.get(&r.id).copied().unwrap_or(0), r.members, r.id))?;
    let port = *r.ports.iter().min_by_key(|&&p| {
        let g = Placed {
            reflector: r.id,
            port: p,
        };
        (per_group.get(&g).copied().unwrap_or(0), p)
    })?;
    Some(Placed { reflector: r.id, port })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: u16) -> Registration {
        Registration {
            id,
            addr: "10.0.0.1".parse().unwrap(),
            ports: vec![4000, 4001],
            capacity: 1000,
            members: 0,
            copies_per_s: 0,
            draining: false,
            valid_until_unix_ms: 10_000,
            instance: "00".into(),
            sig: String::new(),
        }
    }

    #[test]
    fn a_signature_binds_every_field_and_the_expiry() {
        let secret = Secret::new(&[7; 32]).unwrap();
        let mut r = reg(3);
        r.sign(&secret);
        assert_eq!(r.verify(&secret, 5_000), Ok(()));
        assert_eq!(r.verify(&secret, 10_000 + CLOCK_SKEW_MS + 1), Err(Refused::Expired));
        let other = Secret::new(&[8; 32]).unwrap();
        assert_eq!(r.verify(&other, 5_000), Err(Refused::BadSignature));
        let mut moved = r.clone();
        moved.addr = "192.0.2.66".parse().unwrap();
        assert_eq!(
            moved.verify(&secret, 5_000),
            Err(Refused::BadSignature),
            "a rogue address"
        );
        let mut longer = r.clone();
        longer.valid_until_unix_ms += 1_000_000;
        assert_eq!(
            longer.verify(&secret, 5_000),
            Err(Refused::BadSignature),
            "a stretched expiry"
        );
    }

    #[test]
    fn during_a_rollover_entries_are_signed_with_the_secret_both_sides_hold() {
        let (old, new) = (Secret::new(&[1; 32]).unwrap(), Secret::new(&[2; 32]).unwrap());
        // Step 1: reflectors hold NEW with OLD as previous; control servers OLD.
        let reflector = SecretRing {
            current: new.clone(),
            previous: Some((old.clone(), 100)),
        };
        let control: SecretRing = old.clone().into();
        let mut r = reg(1);
        r.sign(signing_secret(&reflector, 50_000));
        assert_eq!(r.verify_ring(&control, 5_000), Ok(()));
        // Step 2: the control servers hold the same file.
        assert_eq!(r.verify_ring(&reflector, 5_000), Ok(()));
        // After the overlap: signed and checked with NEW only.
        let mut r = reg(1);
        r.sign(signing_secret(&reflector, 100_000));
        assert_eq!(r.verify(&new, 5_000), Ok(()));
        let after: SecretRing = new.into();
        assert_eq!(r.verify_ring(&after, 5_000), Ok(()));
        assert_eq!(r.verify_ring(&control, 5_000), Err(Refused::BadSignature));
    }

    #[test]
    fn the_least_loaded_serving_reflector_and_group_are_chosen() {
        let mut live = BTreeMap::new();
        for id in [1, 2, 3] {
            live.insert(id, reg(id));
        }
        live.get_mut(&3).unwrap().draining = true;
        let mut load = HashMap::new();
        load.insert(1, 5);
        load.insert(2, 2);
        let mut per_group = HashMap::new();
        per_group.insert(
            Placed {
                reflector: 2,
                port: 4000,
            },
            2,
        );
        assert_eq!(
            choose(&live, &load, &per_group),
            Some(Placed {
                reflector: 2,
                port: 4001
            }),
            "reflector 3 drains; 2 has fewer cells; its port 4000 has them"
        );
        live.clear();
        assert_eq!(choose(&live, &load, &per_group), None);
    }

    #[test]
    fn the_password_comes_from_a_file_only() {
        let f = std::env::temp_dir().join(format!("registry-pw-{}", std::process::id()));
        std::fs::write(&f, "s3cret\n").unwrap();
        let u = RegistryConfig::url_with_password("redis://fleet@10.0.0.9:6379", Some(&f)).unwrap();
        assert_eq!(u, "redis://fleet:s3cret@10.0.0.9:6379");
        let u = RegistryConfig::url_with_password("redis://10.0.0.9:6379", Some(&f)).unwrap();
        assert_eq!(u, "redis://:s3cret@10.0.0.9:6379");
        assert!(RegistryConfig::url_with_password("redis://a:b@10.0.0.9", None)
            .unwrap_err()
            .to_string()
            .contains("--registry-password-file"));
        assert!(RegistryConfig::url_with_password("http://x", None).is_err());
        let _ = std::fs::remove_file(&f);
    }

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            redacted("redis://fleet:s3cret@10.0.0.9:6379/0"),
            "redis://fleet:***@10.0.0.9:6379/0"
        );
        assert_eq!(redacted("redis://10.0.0.9:6379"), "redis://10.0.0.9:6379");
        assert_eq!(redacted("a@b://x:y@host"), "a@b://x:***@host", "an '@' in the scheme");
    }
}
