//! Join tokens (issued by the control server, checked by reflectors with a
//! shared secret) and stateless join cookies (the reflector's address check).
//!
//! Pure code: time comes in as an argument (`now_ms`, milliseconds since the
//! Unix epoch), so expiry and cookie windows are tested with an injected clock.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

type HmacSha256 = Hmac<Sha256>;

/// Length of a join token issued by the control server.
pub const TOKEN_LEN: usize = 32;
/// Length of the stateless join cookie.
pub const COOKIE_LEN: usize = 16;
/// MAC length of control datagrams (and of tokens and cookies).
pub const MAC_LEN: usize = 16;

/// Shortest secret we accept: 128 bits.
pub const MIN_SECRET_LEN: usize = 16;
/// A cookie is valid in the slot it was made in and the next one, so it
/// lives between one and two slots.
pub const COOKIE_SLOT_MS: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read secret file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("secret is {0} bytes; it must be at least {MIN_SECRET_LEN} (e.g. 32 random bytes as 64 hex digits)")]
    TooShort(usize),
    #[error("secret file {0}")]
    Format(String),
}

/// A MAC key. Debug output never shows the bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

impl Secret {
    pub fn new(bytes: &[u8]) -> Result<Secret, SecretError> {
        if bytes.len() < MIN_SECRET_LEN {
            return Err(SecretError::TooShort(bytes.len()));
        }
        Ok(Secret(bytes.to_vec()))
    }

    /// Reads a secret file: hex if the (trimmed) content is all hex digits,
    /// otherwise the raw trimmed bytes.
    pub fn from_file(path: &Path) -> Result<Secret, SecretError> {
        // The current secret of a file that may also name a previous one.
        Ok(SecretRing::from_file(path)?.current)
    }

    /// The key bytes, for deriving keys from it (never for display).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// HMAC-SHA256 under this secret of `label` then `data`, whole (a
    /// signature the fleet's registry entries carry: anyone who can write
    /// to the registry but does not hold the secret cannot make one).
    pub fn hmac_sha256(&self, label: &[u8], data: &[u8]) -> [u8; 32] {
        // HMAC accepts keys of any length, so new_from_slice cannot fail.
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        m.update(data);
        m.finalize().into_bytes().into()
    }

    /// A fresh random secret (the reflector's private cookie key).
    pub fn random() -> Secret {
        let mut b = vec![0u8; 32];
        // getrandom only fails if the OS has no entropy source at all;
        // nothing in this program can work then.
        getrandom::getrandom(&mut b).expect("the OS random source is available");
        Secret(b)
    }

    fn mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
        // HMAC accepts keys of any length, so new_from_slice cannot fail.
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC takes any key length");
        m.update(label);
        for p in parts {
            m.update(p);
        }
        let full = m.finalize().into_bytes();
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(&full[..MAC_LEN]);
        out
    }
}

/// The reflector/control shared secret with room to roll it over: tokens
/// are signed with `current`; while `previous` has not passed its end, the
/// reflector accepts tokens signed with it too, so control servers and
/// reflectors can change secrets one at a time without refusing joins.
///
/// File format: the current secret on the first line (hex, or a passphrase
/// of at least 16 bytes), then optionally `previous SECRET until UNIX_SECONDS`.
#[derive(Clone, Debug)]
pub struct SecretRing {
    pub current: Secret,
    pub previous: Option<(Secret, u64)>,
}

impl From<Secret> for SecretRing {
    fn from(current: Secret) -> SecretRing {
        SecretRing {
            current,
            previous: None,
        }
    }
}

impl SecretRing {
    pub fn from_file(path: &Path) -> Result<SecretRing, SecretError> {
        let text = std::fs::read_to_string(path).map_err(|source| SecretError::Read {
            path: path.display().to_string(),
            source,
        })?;
        SecretRing::parse(&text).map_err(|e| match e {
            SecretError::Format(m) => SecretError::Format(format!("{}: {m}", path.display())),
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<SecretRing, SecretError> {
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let current = secret_from_text(lines.next().unwrap_or(""))?;
        let mut previous = None;
        for l in lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                ["previous", s, "until", t] => {
                    let until = t
                        .parse::<u64>()
                        .map_err(|_| SecretError::Format(format!("'{t}' is not Unix seconds")))?;
                    previous = Some((secret_from_text(s)?, until));
                }
                _ => {
                    return Err(SecretError::Format(format!(
                        "unexpected line '{l}': after the secret only 'previous SECRET until UNIX_SECONDS'"
                    )))
                }
            }
        }
        Ok(SecretRing { current, previous })
    }

    /// [`verify_token`] with the current secret, then the previous one
    /// while it is still accepted.
    pub fn verify_token(
        &self,
        token: &[u8; TOKEN_LEN],
        reflector: u16,
        group: u16,
        sender: u32,
        now_ms: u64,
    ) -> Result<TokenClaims, TokenError> {
        self.verify_token_by(token, reflector, group, sender, now_ms)
            .map(|(claims, _)| claims)
    }

    /// [`SecretRing::verify_token`], and the secret that verified it.
    pub fn verify_token_by(
        &self,
        token: &[u8; TOKEN_LEN],
        reflector: u16,
        group: u16,
        sender: u32,
        now_ms: u64,
    ) -> Result<(TokenClaims, &Secret), TokenError> {
        match verify_token(&self.current, token, reflector, group, sender, now_ms) {
            Ok(c) => Ok((c, &self.current)),
            Err(TokenError::BadMac) => match &self.previous {
                Some((old, until)) if now_ms < until.saturating_mul(1000) => {
                    verify_token(old, token, reflector, group, sender, now_ms).map(|c| (c, old))
                }
                _ => Err(TokenError::BadMac),
            },
            Err(e) => Err(e),
        }
    }
}

/// An unpredictable value derived from a secret key: HMAC-SHA256(key,
/// label ‖ input), first 8 bytes. For values a reflector makes from its
/// private key (membership ids, probe nonces) without a random source in
/// its pure core: distinct inputs give independent values.
pub fn keyed_value(key: &Secret, label: &[u8], input: &[u8]) -> u64 {
    let mut m = HmacSha256::new_from_slice(&key.0).expect("HMAC accepts any key length");
    m.update(label);
    m.update(input);
    let out = m.finalize().into_bytes();
    u64::from_be_bytes(out[..8].try_into().expect("32 bytes of output"))
}

fn secret_from_text(text: &str) -> Result<Secret, SecretError> {
    let text = text.trim();
    match hex::decode(text) {
        Ok(bytes) if !text.is_empty() => Secret::new(&bytes),
        _ => Secret::new(text.as_bytes()),
    }
}

/// Constant-time comparison so MAC checks leak no timing.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What a token grants: `player` may join `group` on reflector `reflector`
/// until `expires_unix_s`. The reflector id matters because groups are
/// ports, and several reflectors usually serve the same port range: without
/// it a token for one reflector would open the same port on every other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenClaims {
    pub player: u32,
    pub reflector: u16,
    pub group: u16,
    pub expires_unix_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("token MAC does not verify")]
    BadMac,
    #[error("token has expired")]
    Expired,
    #[error("token is for another group")]
    WrongGroup,
    #[error("token is for another reflector")]
    WrongReflector,
    #[error("token is for another player id")]
    WrongPlayer,
}

const TOKEN_LABEL: &[u8] = b"reflector-token-v1";
const COOKIE_LABEL: &[u8] = b"reflector-cookie-v1";
const CLAIMS_LEN: usize = TOKEN_LEN - MAC_LEN;

impl TokenClaims {
    fn claims_bytes(&self) -> [u8; CLAIMS_LEN] {
        let mut b = [0u8; CLAIMS_LEN];
        b[0..4].copy_from_slice(&self.player.to_be_bytes());
        b[4..6].copy_from_slice(&self.group.to_be_bytes());
        b[6..8].copy_from_slice(&self.reflector.to_be_bytes());
        b[8..16].copy_from_slice(&self.expires_unix_s.to_be_bytes());
        b
    }

    /// Signs the claims into a token (control server side).
    pub fn sign(&self, secret: &Secret) -> [u8; TOKEN_LEN] {
        let claims = self.claims_bytes();
        let mut t = [0u8; TOKEN_LEN];
        t[..CLAIMS_LEN].copy_from_slice(&claims);
        t[CLAIMS_LEN..].copy_from_slice(&secret.mac(TOKEN_LABEL, &[&claims]));
        t
    }

    /// Reads the claims of a token *without* checking it (clients use this
    /// to learn their id and group; reflectors must call [`verify_token`]).
    pub fn peek(token: &[u8; TOKEN_LEN]) -> TokenClaims {
        TokenClaims {
            player: u32::from_be_bytes([token[0], token[1], token[2], token[3]]),
            group: u16::from_be_bytes([token[4], token[5]]),
            reflector: u16::from_be_bytes([token[6], token[7]]),
            expires_unix_s: u64::from_be_bytes([
                token[8], token[9], token[10], token[11], token[12], token[13], token[14], token[15],
            ]),
        }
    }
}

/// Reflector side: the token must verify, be unexpired, and name this
/// reflector, the group it arrived on and the sender id in the header.
pub fn verify_token(
    secret: &Secret,
    token: &[u8; TOKEN_LEN],
    reflector: u16,
    group: u16,
    sender: u32,
    now_ms: u64,
) -> Result<TokenClaims, TokenError> {
    let mac = secret.mac(TOKEN_LABEL, &[&token[..CLAIMS_LEN]]);
    if !ct_eq(&mac, &token[CLAIMS_LEN..]) {
        return Err(TokenError::BadMac);
    }
    let claims = TokenClaims::peek(token);
    if claims.expires_unix_s.saturating_mul(1000) <= now_ms {
        return Err(TokenError::Expired);
    }
    if claims.reflector != reflector {
        return Err(TokenError::WrongReflector);
    }
    if claims.group != group {
        return Err(TokenError::WrongGroup);
    }
    if claims.player != sender {
        return Err(TokenError::WrongPlayer);
    }
    Ok(claims)
}

fn addr_bytes(addr: &SocketAddr) -> ([u8; 18], usize) {
    let mut b = [0u8; 18];
    let n = match addr.ip() {
        IpAddr::V4(ip) => {
            b[..4].copy_from_slice(&ip.octets());
            4
        }
        IpAddr::V6(ip) => {
            b[..16].copy_from_slice(&ip.octets());
            16
        }
    };
    b[n..n + 2].copy_from_slice(&addr.port().to_be_bytes());
    (b, n + 2)
}

fn cookie_at(key: &Secret, addr: &SocketAddr, group: u16, sender: u32, slot: u64) -> [u8; COOKIE_LEN] {
    let (a, n) = addr_bytes(addr);
    key.mac(
        COOKIE_LABEL,
        &[
            &a[..n],
            &group.to_be_bytes(),
            &sender.to_be_bytes(),
            &slot.to_be_bytes(),
        ],
    )
}

/// The stateless cookie for `addr` joining `group` as `sender` now.
pub fn make_cookie(key: &Secret, addr: &SocketAddr, group: u16, sender: u32, now_ms: u64) -> [u8; COOKIE_LEN] {
    cookie_at(key, addr, group, sender, now_ms / COOKIE_SLOT_MS)
}

/// True if `cookie` was made for this address, group and sender in the
/// current slot or the previous one. Only the real owner of `addr` can have
/// received it, so a valid echo proves the source address is not spoofed.
pub fn check_cookie(
    key: &Secret,
    cookie: &[u8; COOKIE_LEN],
    addr: &SocketAddr,
    group: u16,
    sender: u32,
    now_ms: u64,
) -> bool {
    let slot = now_ms / COOKIE_SLOT_MS;
    ct_eq(cookie, &cookie_at(key, addr, group, sender, slot))
        || (slot > 0 && ct_eq(cookie, &cookie_at(key, addr, group, sender, slot - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rolled_over_secret_is_accepted_until_its_end() {
        let (old, new) = (secret(1), secret(2));
        let claims = TokenClaims {
            player: 42,
            reflector: 3,
            group: 4000,
            expires_unix_s: NOW / 1000 + 600,
        };
        let by_old = claims.sign(&old);
        let ring = SecretRing::parse(&format!(
            "{}\nprevious {} until {}\n",
            hex::encode([2u8; 32]),
            hex::encode([1u8; 32]),
            NOW / 1000 + 60
        ))
        .unwrap();
        assert_eq!(ring.verify_token(&claims.sign(&new), 3, 4000, 42, NOW), Ok(claims));
        assert_eq!(ring.verify_token(&by_old, 3, 4000, 42, NOW), Ok(claims));
        assert_eq!(
            ring.verify_token(&by_old, 3, 4000, 42, NOW + 61_000),
            Err(TokenError::BadMac),
            "after its end the old secret is refused"
        );
        // A token the old secret signed still passes every other check.
        assert_eq!(
            ring.verify_token(&by_old, 3, 4001, 42, NOW),
            Err(TokenError::WrongGroup)
        );
        assert!(SecretRing::parse("short").is_err());
        assert!(SecretRing::parse(&format!("{}\nnext x", hex::encode([2u8; 32]))).is_err());
        let plain: SecretRing = new.into();
        assert_eq!(plain.verify_token(&by_old, 3, 4000, 42, NOW), Err(TokenError::BadMac));
    }

    fn secret(b: u8) -> Secret {
        Secret::new(&[b; 32]).unwrap()
    }

    const NOW: u64 = 1_700_000_000_000;

    #[test]
    fn token_verifies_and_binds_group_player_expiry() {
        let s = secret(1);
        let claims = TokenClaims {
            player: 42,
            reflector: 3,
            group: 4000,
            expires_unix_s: NOW / 1000 + 60,
        };
        let t = claims.sign(&s);
        assert_eq!(TokenClaims::peek(&t), claims);
        assert_eq!(verify_token(&s, &t, 3, 4000, 42, NOW), Ok(claims));
        assert_eq!(verify_token(&s, &t, 3, 4001, 42, NOW), Err(TokenError::WrongGroup));
        assert_eq!(verify_token(&s, &t, 3, 4000, 43, NOW), Err(TokenError::WrongPlayer));
        assert_eq!(
            verify_token(&s, &t, 3, 4000, 42, NOW + 60_000),
            Err(TokenError::Expired)
        );
        assert_eq!(verify_token(&secret(2), &t, 3, 4000, 42, NOW), Err(TokenError::BadMac));
        assert_eq!(verify_token(&s, &t, 4, 4000, 42, NOW), Err(TokenError::WrongReflector));
    }

    #[test]
    fn any_flipped_token_bit_is_rejected() {
        let s = secret(1);
        let t = TokenClaims {
            player: 1,
            reflector: 3,
            group: 2,
            expires_unix_s: u64::MAX / 2000,
        }
        .sign(&s);
        for i in 0..TOKEN_LEN * 8 {
            let mut f = t;
            f[i / 8] ^= 1 << (i % 8);
            assert!(verify_token(&s, &f, 3, 2, 1, NOW).is_err(), "bit {i}");
        }
    }

    #[test]
    fn cookie_binds_address_group_sender_and_time() {
        let k = secret(3);
        let a: SocketAddr = "10.0.0.1:5000".parse().unwrap();
        let c = make_cookie(&k, &a, 7, 9, NOW);
        assert!(check_cookie(&k, &c, &a, 7, 9, NOW));
        assert!(check_cookie(&k, &c, &a, 7, 9, NOW + COOKIE_SLOT_MS));
        assert!(!check_cookie(&k, &c, &a, 7, 9, NOW + 2 * COOKIE_SLOT_MS + 1));
        assert!(!check_cookie(&k, &c, &"10.0.0.1:5001".parse().unwrap(), 7, 9, NOW));
        assert!(!check_cookie(&k, &c, &"10.0.0.2:5000".parse().unwrap(), 7, 9, NOW));
        assert!(!check_cookie(&k, &c, &a, 8, 9, NOW));
        assert!(!check_cookie(&k, &c, &a, 7, 10, NOW));
        assert!(!check_cookie(&secret(4), &c, &a, 7, 9, NOW));
        let v6: SocketAddr = "[::1]:5000".parse().unwrap();
        let c6 = make_cookie(&k, &v6, 7, 9, NOW);
        assert!(check_cookie(&k, &c6, &v6, 7, 9, NOW));
    }

    #[test]
    fn secrets_are_checked() {
        assert!(matches!(Secret::new(b"short"), Err(SecretError::TooShort(5))));
        let dir = std::env::temp_dir().join(format!("reflector-secret-{}", std::process::id()));
        std::fs::write(&dir, format!("{}\n", "ab".repeat(32))).unwrap();
        let s = Secret::from_file(&dir).unwrap();
        assert_eq!(s.0, vec![0xab; 32]);
        std::fs::write(&dir, "a passphrase that is long enough\n").unwrap();
        assert_eq!(Secret::from_file(&dir).unwrap().0, b"a passphrase that is long enough");
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(Secret::from_file(&dir), Err(SecretError::Read { .. })));
    }
}
