//! Authenticated players: the control server issues a join token only to a
//! player the game's own backend vouches for, with a signed *ticket* (a JWT
//! in `Authorization: Bearer`, as LiveKit access tokens and netcode.io
//! connect tokens do): `sub` is the player id, `exp` is required. Keys are
//! chosen by the ticket's `kid` from a key file that is re-read when it
//! changes, so keys rotate without a restart. Ticket issuance is
//! rate-limited per player and per source address.
//!
//! The key file format, the claims and the minting side are
//! `reflector_proto::ticket`, shared with the bots and any game backend.

use jsonwebtoken::{decode, decode_header, Algorithm, DecodingKey, Validation};
use reflector_proto::ticket::{read_key_file, Claims, KeyFileError};
use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Seconds a ticket's `exp` may be past and still pass (clock skew between
/// the game backend and this server).
pub const LEEWAY_S: u64 = 30;
/// How often the key file's modification time is looked at.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Why a ticket was refused; each reason has a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No `Authorization: Bearer` ticket.
    Missing,
    /// Not a JWT, or no `kid` when the key file has several keys.
    Malformed,
    UnknownKey,
    /// The header's `alg` is not the key's.
    WrongAlgorithm,
    BadSignature,
    Expired,
    /// `sub` is not a player id (a number from 0 to 4294967295).
    BadSubject,
    /// The request names another player than the ticket's `sub`.
    OtherPlayer,
}

impl Refusal {
    pub const ALL: [Refusal; 8] = [
        Refusal::Missing,
        Refusal::Malformed,
        Refusal::UnknownKey,
        Refusal::WrongAlgorithm,
        Refusal::BadSignature,
        Refusal::Expired,
        Refusal::BadSubject,
        Refusal::OtherPlayer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Malformed => "malformed",
            Refusal::UnknownKey => "unknown_key",
            Refusal::WrongAlgorithm => "wrong_algorithm",
            Refusal::BadSignature => "bad_signature",
            Refusal::Expired => "expired",
            Refusal::BadSubject => "bad_subject",
            Refusal::OtherPlayer => "other_player",
        }
    }

    /// What the client is told (never which key exists).
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Missing => "a player ticket is required: Authorization: Bearer <JWT from the game backend>",
            Refusal::Malformed => "the ticket is not a well-formed JWT with a kid",
            Refusal::UnknownKey | Refusal::WrongAlgorithm | Refusal::BadSignature => {
                "the ticket's signature does not verify"
            }
            Refusal::Expired => "the ticket has expired: get a new one from the game backend",
            Refusal::BadSubject => "the ticket's sub is not a player id (0 to 4294967295)",
            Refusal::OtherPlayer => "the ticket is for another player",
        }
    }
}

struct Keys {
    by_kid: HashMap<String, (Algorithm, DecodingKey)>,
}

fn parse_alg(s: &str) -> Option<Algorithm> {
    match s {
        "HS256" => Some(Algorithm::HS256),
        "EdDSA" => Some(Algorithm::EdDSA),
        "ES256" => Some(Algorithm::ES256),
        _ => None,
    }
}

fn load(path: &Path) -> Result<Keys, KeyFileError> {
    let p = path.display().to_string();
    let bad = |msg: String| KeyFileError::Bad { path: p.clone(), msg };
    let entries = read_key_file(path)?;
    if entries.is_empty() {
        return Err(bad("no [[key]] entries".into()));
    }
    let mut by_kid = HashMap::new();
    for k in entries {
        let alg = parse_alg(&k.alg)
            .ok_or_else(|| bad(format!("key '{}': alg '{}' is not HS256, EdDSA or ES256", k.kid, k.alg)))?;
        let key = match (alg, &k.secret_hex, &k.public_pem) {
            (Algorithm::HS256, Some(h), None) => {
                let s = hex::decode(h.trim()).map_err(|e| bad(format!("key '{}': secret_hex: {e}", k.kid)))?;
                if s.len() < 32 {
                    return Err(bad(format!("key '{}': an HS256 secret needs at least 32 bytes", k.kid)));
                }
                DecodingKey::from_secret(&s)
            }
            (Algorithm::EdDSA, None, Some(pem)) => DecodingKey::from_ed_pem(pem.as_bytes())
                .map_err(|e| bad(format!("key '{}': public_pem: {e}", k.kid)))?,
            (Algorithm::ES256, None, Some(pem)) => DecodingKey::from_ec_pem(pem.as_bytes())
                .map_err(|e| bad(format!("key '{}': public_pem: {e}", k.kid)))?,
            _ => {
                return Err(bad(format!(
                    "key '{}': HS256 takes secret_hex, EdDSA and ES256 take public_pem (only)",
                    k.kid
                )))
            }
        };
        if by_kid.insert(k.kid.clone(), (alg, key)).is_some() {
            return Err(bad(format!("key '{}' appears twice", k.kid)));
        }
    }
    Ok(Keys { by_kid })
}

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

struct Loaded {
    keys: Keys,
    mtime: Option<SystemTime>,
    checked: std::time::Instant,
}

/// Verifies player tickets against the keys of a key file, re-reading the
/// file when its modification time changes (a broken new file is reported
/// once and the keys in force are kept).
pub struct TicketVerifier {
    path: PathBuf,
    recheck: Duration,
    loaded: Mutex<Loaded>,
}

impl TicketVerifier {
    pub fn from_file(path: &Path) -> Result<TicketVerifier, KeyFileError> {
        TicketVerifier::with_recheck(path, RELOAD_CHECK)
    }

    /// As [`TicketVerifier::from_file`], looking at the file at most once per `recheck`.
    pub fn with_recheck(path: &Path, recheck: Duration) -> Result<TicketVerifier, KeyFileError> {
        let keys = load(path)?;
        Ok(TicketVerifier {
            path: path.to_path_buf(),
            recheck,
            loaded: Mutex::new(Loaded {
                keys,
                mtime: mtime(path),
                checked: std::time::Instant::now(),
            }),
        })
    }

    /// The player id a ticket vouches for, at `now_s` (Unix seconds).
    pub fn verify(&self, token: &str, now_s: u64) -> Result<u32, Refusal> {
        let header = decode_header(token).map_err(|_| Refusal::Malformed)?;
        let mut guard = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        if guard.checked.elapsed() >= self.recheck {
            guard.checked = std::time::Instant::now();
            let m = mtime(&self.path);
            if m != guard.mtime {
                guard.mtime = m;
                match load(&self.path) {
                    Ok(k) => {
                        tracing::info!("ticket keys reloaded from {}", self.path.display());
                        guard.keys = k;
                    }
                    Err(e) => tracing::warn!("{e}; keeping the keys in force"),
                }
            }
        }
        let keys = &guard.keys.by_kid;
        let (alg, key) = match &header.kid {
            Some(kid) => keys.get(kid).ok_or(Refusal::UnknownKey)?,
            None if keys.len() == 1 => keys.values().next().ok_or(Refusal::UnknownKey)?,
            None => return Err(Refusal::Malformed),
        };
        if header.alg != *alg {
            return Err(Refusal::WrongAlgorithm);
        }
        let mut v = Validation::new(*alg);
        v.leeway = LEEWAY_S;
        v.validate_exp = false;
        v.set_required_spec_claims(&["exp", "sub"]);
        let data = decode::<Claims>(token, key, &v).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidSignature => Refusal::BadSignature,
            _ => Refusal::Malformed,
        })?;
        // Checked here against the caller's clock (injected, so testable).
        if data.claims.exp.saturating_add(LEEWAY_S) < now_s {
            return Err(Refusal::Expired);
        }
        data.claims.sub.parse::<u32>().map_err(|_| Refusal::BadSubject)
    }
}

/// A token bucket per key (player, address): `per_s` tokens a second, at
/// most `burst` saved. Buckets that are full again are forgotten when the
/// table grows large, so a flood of distinct keys cannot grow memory without
/// bound.
pub struct RateLimiter<K> {
    per_s: f64,
    burst: f64,
    buckets: HashMap<K, (f64, std::time::Instant)>,
}

/// Keys kept before full buckets are swept.
const MAX_BUCKETS: usize = 100_000;

impl<K: Hash + Eq + Copy> RateLimiter<K> {
    pub fn new(per_s: f64, burst: f64) -> RateLimiter<K> {
        RateLimiter {
            per_s,
            burst: burst.max(1.0),
            buckets: HashMap::new(),
        }
    }

    /// Takes a token for `key` at `now`; `Err(seconds)` until one is due.
    pub fn take(&mut self, key: K, now: std::time::Instant) -> Result<(), u32> {
        if self.buckets.len() >= MAX_BUCKETS {
            let (per_s, burst) = (self.per_s, self.burst);
            self.buckets
                .retain(|_, (t, at)| *t + now.saturating_duration_since(*at).as_secs_f64() * per_s < burst);
        }
        let (per_s, burst) = (self.per_s, self.burst);
        let (tokens, at) = self.buckets.entry(key).or_insert((burst, now));
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * per_s).min(burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / per_s).ceil().max(1.0) as u32)
        }
    }
}

/// Everything the control server checks before it issues a join token.
pub struct JoinAuth {
    pub verifier: TicketVerifier,
    pub per_player: Mutex<RateLimiter<u32>>,
    pub per_ip: Mutex<RateLimiter<IpAddr>>,
    refused: HashMap<Refusal, std::sync::atomic::AtomicU64>,
    pub rate_limited: std::sync::atomic::AtomicU64,
    /// Requests that carried a valid join token of their player (see
    /// `authorize`): re-placements.
    pub recoveries: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for JoinAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are never printed.
        f.debug_struct("JoinAuth")
            .field("refused", &self.refused())
            .finish_non_exhaustive()
    }
}

impl JoinAuth {
    pub fn new(verifier: TicketVerifier, player_per_s: f64, ip_per_s: f64) -> JoinAuth {
        JoinAuth {
            verifier,
            per_player: Mutex::new(RateLimiter::new(player_per_s, player_per_s * 5.0)),
            per_ip: Mutex::new(RateLimiter::new(ip_per_s, ip_per_s * 2.0)),
            refused: Refusal::ALL.iter().map(|r| (*r, Default::default())).collect(),
            rate_limited: Default::default(),
            recoveries: Default::default(),
        }
    }

    pub fn count(&self, r: Refusal) {
        if let Some(c) = self.refused.get(&r) {
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Refusals so far, by reason.
    pub fn refused(&self) -> Vec<(&'static str, u64)> {
        Refusal::ALL
            .iter()
            .map(|r| (r.name(), self.refused[r].load(std::sync::atomic::Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};
    use reflector_proto::ticket::TicketMinter;
    use ring::signature::KeyPair;

    const NOW: u64 = 1_700_000_000;

    fn key_file(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("reflector-tickets-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const SECRET: &str = "0101010101010101010101010101010101010101010101010101010101010101";

    #[test]
    fn hs256_tickets_verify_and_every_bad_one_is_refused_with_its_reason() {
        let d = dir("hs");
        let f = key_file(
            &d,
            "keys.toml",
            &format!("[[key]]\nkid = \"k1\"\nalg = \"HS256\"\nsecret_hex = \"{SECRET}\"\n"),
        );
        let v = TicketVerifier::from_file(&f).unwrap();
        let m = TicketMinter::from_file(&f).unwrap();
        assert_eq!(v.verify(&m.mint(7, NOW, 60), NOW), Ok(7));
        assert_eq!(v.verify(&m.mint(7, NOW - 600, 60), NOW), Err(Refusal::Expired));
        // Within the leeway.
        assert_eq!(v.verify(&m.mint(7, NOW - 80, 60), NOW), Ok(7));
        assert_eq!(v.verify("not a jwt", NOW), Err(Refusal::Malformed));
        // Another backend's secret, same kid.
        let other = key_file(&d, "other.toml", "[[key]]\nkid = \"k1\"\nalg = \"HS256\"\nsecret_hex = \"0202020202020202020202020202020202020202020202020202020202020202\"\n");
        let forged = TicketMinter::from_file(&other).unwrap().mint(7, NOW, 60);
        assert_eq!(v.verify(&forged, NOW), Err(Refusal::BadSignature));
        // An unknown kid.
        let k2 = key_file(
            &d,
            "k2.toml",
            &format!("[[key]]\nkid = \"k2\"\nalg = \"HS256\"\nsecret_hex = \"{SECRET}\"\n"),
        );
        assert_eq!(
            v.verify(&TicketMinter::from_file(&k2).unwrap().mint(7, NOW, 60), NOW),
            Err(Refusal::UnknownKey)
        );
        // A sub that is no player id.
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        let bad_sub = encode(
            &h,
            &Claims {
                sub: "alice".into(),
                exp: NOW + 60,
            },
            &EncodingKey::from_secret(&hex::decode(SECRET).unwrap()),
        )
        .unwrap();
        assert_eq!(v.verify(&bad_sub, NOW), Err(Refusal::BadSubject));
        // HS256 "none"-style downgrade attempts: another alg in the header.
        let mut h384 = Header::new(Algorithm::HS384);
        h384.kid = Some("k1".into());
        let wrong = encode(
            &h384,
            &Claims {
                sub: "7".into(),
                exp: NOW + 60,
            },
            &EncodingKey::from_secret(&hex::decode(SECRET).unwrap()),
        )
        .unwrap();
        assert_eq!(v.verify(&wrong, NOW), Err(Refusal::WrongAlgorithm));
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn eddsa_public_keys_verify_and_keys_rotate_without_a_restart() {
        let d = dir("ed");
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        // SubjectPublicKeyInfo of an Ed25519 key: a fixed 12-byte prefix.
        let mut spki = vec![0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
        spki.extend_from_slice(pair.public_key().as_ref());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64_encode(&spki)
        );
        let f = key_file(
            &d,
            "keys.toml",
            &format!("[[key]]\nkid = \"old\"\nalg = \"HS256\"\nsecret_hex = \"{SECRET}\"\n"),
        );
        let v = TicketVerifier::with_recheck(&f, Duration::ZERO).unwrap();
        let mut h = Header::new(Algorithm::EdDSA);
        h.kid = Some("ed1".into());
        let ticket = encode(
            &h,
            &Claims {
                sub: "9".into(),
                exp: NOW + 60,
            },
            &EncodingKey::from_ed_der(pkcs8.as_ref()),
        )
        .unwrap();
        assert_eq!(v.verify(&ticket, NOW), Err(Refusal::UnknownKey));
        // Rotate: the new file has the EdDSA key; a later mtime is noticed.
        std::fs::write(
            &f,
            format!("[[key]]\nkid = \"ed1\"\nalg = \"EdDSA\"\npublic_pem = \"\"\"\n{pem}\"\"\"\n"),
        )
        .unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(later)
            .unwrap();
        assert_eq!(v.verify(&ticket, NOW), Ok(9));
        // The old key is gone.
        let old = TicketMinter::hs256("old", &hex::decode(SECRET).unwrap());
        assert_eq!(v.verify(&old.mint(9, NOW, 60), NOW), Err(Refusal::UnknownKey));
        // A broken file keeps the keys in force.
        std::fs::write(&f, "garbage = [").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(later + Duration::from_secs(5))
            .unwrap();
        assert_eq!(v.verify(&ticket, NOW), Ok(9));
        let _ = std::fs::remove_dir_all(d);
    }

    fn base64_encode(b: &[u8]) -> String {
        const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in b.chunks(3) {
            let n = (u32::from(c[0]) << 16)
                | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
                | u32::from(*c.get(2).unwrap_or(&0));
            for i in 0..4 {
                if i <= c.len() {
                    out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[test]
    fn bad_key_files_are_named() {
        let d = dir("bad");
        let e = |body: &str| {
            TicketVerifier::from_file(&key_file(&d, "k.toml", body))
                .err()
                .unwrap()
                .to_string()
        };
        assert!(e("").contains("key"));
        assert!(e("[[key]]\nkid = \"a\"\nalg = \"RS256\"\nsecret_hex = \"00\"\n").contains("RS256"));
        assert!(e("[[key]]\nkid = \"a\"\nalg = \"HS256\"\nsecret_hex = \"0011\"\n").contains("32 bytes"));
        assert!(e("[[key]]\nkid = \"a\"\nalg = \"EdDSA\"\nsecret_hex = \"0011\"\n").contains("public_pem"));
        assert!(TicketVerifier::from_file(Path::new("/nonexistent/keys.toml"))
            .err()
            .unwrap()
            .to_string()
            .contains("/nonexistent/keys.toml"));
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn buckets_refill_and_say_when() {
        let mut l = RateLimiter::new(2.0, 3.0);
        let t = std::time::Instant::now();
        for _ in 0..3 {
            assert_eq!(l.take(1u32, t), Ok(()));
        }
        assert_eq!(l.take(1, t), Err(1));
        assert_eq!(l.take(2, t), Ok(()), "another key has its own bucket");
        assert_eq!(l.take(1, t + Duration::from_millis(500)), Ok(()));
    }
}
