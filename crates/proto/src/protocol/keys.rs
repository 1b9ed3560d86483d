//! The keys of a session, derived from the token, and the MACs under them.

use super::*;
use crate::auth::{Secret, SecretRing, TokenClaims, TokenError};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::fmt;
use std::hash::Hasher;
type HmacSha256 = Hmac<Sha256>;

// The key schedule's side of token verification: here rather than in
// auth.rs, so that authentication does not depend on the datagram layer.
impl SecretRing {
    /// [`SecretRing::verify_token`], and the token's session keys, derived
    /// under the secret that verified it (`docs/protocol.md`, Keys).
    pub fn verify_token_keys(
        &self,
        token: &[u8; TOKEN_LEN],
        reflector: u16,
        group: u16,
        sender: u32,
        now_ms: u64,
    ) -> Result<(TokenClaims, SessionKeys), TokenError> {
        self.verify_token_by(token, reflector, group, sender, now_ms)
            .map(|(claims, secret)| (claims, SessionKeys::derive(secret, token)))
    }
}

/// The keys of one token's session (see the document's table).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionKeys {
    /// What the player gets from the control server.
    pub session: [u8; SESSION_KEY_LEN],
    pub(super) mac: [u8; 32],
    pub(super) tag: [u8; 16],
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(..)")
    }
}

pub(super) fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC-SHA256 takes keys of any length: new_from_slice cannot fail.
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC accepts any key length");
    for p in parts {
        m.update(p);
    }
    m
}

impl SessionKeys {
    /// The control server's and the reflector's side: the session key of a
    /// token, under the shared secret that signed it.
    pub fn derive(secret: &Secret, token: &[u8; TOKEN_LEN]) -> SessionKeys {
        let k = hmac(secret.as_bytes(), &[b"reflector-session-v2", token])
            .finalize()
            .into_bytes();
        SessionKeys::from_session(k.into())
    }

    /// The player's side: the MAC and tag keys of the session key it got.
    pub fn from_session(session: [u8; SESSION_KEY_LEN]) -> SessionKeys {
        let mac = hmac(&session, &[b"reflector-mac-v2"]).finalize().into_bytes().into();
        let t = hmac(&session, &[b"reflector-tag-v2"]).finalize().into_bytes();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&t[..16]);
        SessionKeys { session, mac, tag }
    }

    /// Checks the MAC of a MAC'd datagram (constant time); false for types
    /// that carry none.
    pub fn verify<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.signed() {
            Some((bytes, mac)) => hmac(&self.mac, &[bytes]).verify_truncated_left(mac).is_ok(),
            None => false,
        }
    }

    /// The DATA tag of `datagram` (the tag field itself read as zero):
    /// standard SipHash-2-4, which a BPF program computes the same.
    pub fn tag(&self, datagram: &[u8]) -> u64 {
        if datagram.len() < TAG.end {
            // No tag field to read as zero (no DATA is this short): the
            // streaming hasher panics on it as it always did.
            let mut h = siphasher::sip::SipHasher24::new_with_key(&self.tag);
            h.write(&datagram[..TAG.start]);
            h.write(&[0u8; TAG_LEN]);
            h.write(&datagram[TAG.end..]);
            return h.finish();
        }
        siphash24_tag(&self.tag, datagram)
    }

    /// The MAC key `Km` (datagram MACs and the checkpoint channel's MACs).
    pub fn mac_key(&self) -> &[u8; 32] {
        &self.mac
    }

    /// The DATA tag key, for an in-kernel checker that computes the same
    /// SipHash (the reflector's eBPF fan-out).
    pub fn tag_key(&self) -> &[u8; 16] {
        &self.tag
    }

    /// Checks a DATA's tag (constant time).
    pub fn verify_tag<T: AsRef<[u8]>>(&self, p: &Packet<T>) -> bool {
        match p.tag() {
            Some(tag) => {
                let want = self.tag(p.as_bytes()).to_be_bytes();
                // No early exit on the first differing byte.
                want.iter()
                    .zip(tag.to_be_bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            }
            None => false,
        }
    }
}
