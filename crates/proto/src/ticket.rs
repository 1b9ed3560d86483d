//! Player tickets: the JWT a game's backend gives a player, which the
//! control server checks (`Authorization: Bearer`) before it issues a join
//! token. This module holds what both sides share: the claims, the key
//! file format, and the backend's side, [`TicketMinter`] (the bots and the
//! demo play the backend). The checking side, with key rotation and rate
//! limits, is the control server's.
//!
//! Key file (TOML), one `[[key]]` per key:
//!
//! ```toml
//! [[key]]
//! kid = "game-2026-11"
//! alg = "HS256"            # shared secret: the backend and this server
//! secret_hex = "5f3a..."   # at least 32 bytes
//!
//! [[key]]
//! kid = "backend-ed"
//! alg = "EdDSA"            # or ES256: only the public key is here
//! public_pem = """
//! -----BEGIN PUBLIC KEY-----
//! ...
//! -----END PUBLIC KEY-----
//! """
//! ```

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read ticket key file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("ticket key file {path}: {msg}")]
    Bad { path: String, msg: String },
}

/// One `[[key]]` of a key file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub kid: String,
    pub alg: String,
    pub secret_hex: Option<String>,
    pub public_pem: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    key: Vec<KeyEntry>,
}

/// The entries of the key file at `path`, in file order; `path` is named in
/// every error.
pub fn read_key_file(path: &Path) -> Result<Vec<KeyEntry>, KeyFileError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: p.clone(),
        source,
    })?;
    let file: KeyFile = toml::from_str(&text).map_err(|e| KeyFileError::Bad {
        path: p,
        msg: e.to_string(),
    })?;
    Ok(file.key)
}

/// The claims of a player ticket.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    pub sub: String,
    pub exp: u64,
}

/// Mints tickets as a game backend does (bots, the demo): HS256 with a key
/// of the key file format that has a secret.
pub struct TicketMinter {
    kid: String,
    key: EncodingKey,
}

impl TicketMinter {
    /// An HS256 minter with key id `kid`.
    pub fn hs256(kid: impl Into<String>, secret: &[u8]) -> TicketMinter {
        TicketMinter {
            kid: kid.into(),
            key: EncodingKey::from_secret(secret),
        }
    }

    /// The first HS256 key of a key file.
    pub fn from_file(path: &Path) -> Result<TicketMinter, KeyFileError> {
        let bad = |msg: String| KeyFileError::Bad {
            path: path.display().to_string(),
            msg,
        };
        let k = read_key_file(path)?
            .into_iter()
            .find(|k| k.alg == "HS256" && k.secret_hex.is_some())
            .ok_or_else(|| bad("no HS256 key with a secret_hex to sign tickets with".into()))?;
        let secret = hex::decode(k.secret_hex.unwrap_or_default().trim())
            .map_err(|e| bad(format!("key '{}': secret_hex: {e}", k.kid)))?;
        Ok(TicketMinter::hs256(k.kid, &secret))
    }

    /// A ticket for `player`, valid for `ttl_s` from `now_s`.
    pub fn mint(&self, player: u32, now_s: u64, ttl_s: u64) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some(self.kid.clone());
        let claims = Claims {
            sub: player.to_string(),
            exp: now_s + ttl_s,
        };
        // HMAC signing of a serialisable struct cannot fail.
        encode(&h, &claims, &self.key).unwrap_or_default()
    }
}
