//! Sealed checkpoints (`docs/protocol.md`, "Sealed checkpoints"): a
//! checkpoint state sealed under the epoch key and signed by its uploader
//! with an Ed25519 key that the control server certifies, so that a joiner
//! can check a state the reflector stored without trusting the reflector
//! or any one member.
//!
//! - [`ControlSigner`]: the control servers' Ed25519 key of a world,
//!   derived from the sealing master secret (every control server of a
//!   fleet derives the same), and the certificates it makes
//!   ([`ControlSigner::certify`], checked by [`verify_certificate`]);
//! - [`PlayerKey`]: a client instance's own Ed25519 key pair;
//! - [`seal_checkpoint`]: the envelope an uploader sends as the state;
//! - [`open_checkpoint`]: a joiner's checks in the document's order, each
//!   refusal a named [`CheckpointRefusal`]; [`compare`] the two-snapshot
//!   comparison.
//!
//! The reflector never sees any of this: the envelope is the upload's body.

use super::{expand, CellId, EpochKey, MasterSecret, WorldId, AEAD_TAG_LEN, CELL_ID_LEN, KEY_LEN};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use sha2::{Digest, Sha256};
use std::fmt;
use std::ops::Range;

/// "RFCP".
pub const ENVELOPE_MAGIC: u32 = 0x5246_4350;
/// The envelope's version (byte 4): 2, AES-256-GCM. Version 1
/// (ChaCha20-Poly1305) was withdrawn before any release and is refused like
/// any other version.
pub const ENVELOPE_VERSION: u8 = 2;
/// An Ed25519 public key.
pub const PUBLIC_KEY_LEN: usize = 32;
/// An Ed25519 signature (a certificate is one).
pub const SIGNATURE_LEN: usize = 64;
/// The envelope's header: everything before the sealed state, all of it
/// associated data.
pub const HEADER_LEN: usize = 152;
/// What the envelope adds to the state: header, AEAD tag, signature.
pub const ENVELOPE_OVERHEAD: usize = HEADER_LEN + AEAD_TAG_LEN + SIGNATURE_LEN;

const CONTROL_SIGN_INFO: &[u8] = b"reflector-control-sign-v1";
const CERT_LABEL: &[u8] = b"reflector-player-cert-v1";
const CHECKPOINT_KEY_INFO: &[u8] = b"reflector-checkpoint-key-v1";
const SIGNATURE_LABEL: &[u8] = b"reflector-checkpoint-sig-v1";

/// Where the envelope's fields sit.
pub mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    /// Zero.
    pub const RESERVED: Range<usize> = 5..8;
    pub const EPOCH: Range<usize> = 8..12;
    pub const PLAYER: Range<usize> = 12..16;
    pub const CELL: Range<usize> = 16..24;
    pub const TICK: Range<usize> = 24..32;
    pub const INSTANCE: Range<usize> = 32..40;
    pub const SEQUENCE: Range<usize> = 40..48;
    pub const CERT_EXPIRY: Range<usize> = 48..56;
    pub const PUBLIC_KEY: Range<usize> = 56..88;
    pub const CERTIFICATE: Range<usize> = 88..152;
    /// Where the sealed state starts.
    pub const STATE: usize = 152;
}

// ---------------------------------------------------------------------------
// Keys and certificates.

fn key_pair(seed: &[u8; 32]) -> Ed25519KeyPair {
    // Any 32 bytes are an Ed25519 seed (RFC 8032 §5.1.5); ring refuses only
    // other lengths.
    Ed25519KeyPair::from_seed_unchecked(seed).expect("a 32-byte Ed25519 seed")
}

fn public_of(pair: &Ed25519KeyPair) -> [u8; PUBLIC_KEY_LEN] {
    let mut p = [0u8; PUBLIC_KEY_LEN];
    p.copy_from_slice(pair.public_key().as_ref());
    p
}

fn signature_of(pair: &Ed25519KeyPair, msg: &[u8]) -> [u8; SIGNATURE_LEN] {
    let mut s = [0u8; SIGNATURE_LEN];
    s.copy_from_slice(pair.sign(msg).as_ref());
    s
}

fn verifies(public_key: &[u8; PUBLIC_KEY_LEN], msg: &[u8], signature: &[u8]) -> bool {
    UnparsedPublicKey::new(&ED25519, public_key)
        .verify(msg, signature)
        .is_ok()
}

/// The message a certificate signs.
fn certificate_message(world: WorldId, player: u32, public_key: &[u8; PUBLIC_KEY_LEN], expires_unix_s: u64) -> Vec<u8> {
    let mut m = Vec::with_capacity(CERT_LABEL.len() + 4 + 4 + PUBLIC_KEY_LEN + 8);
    m.extend_from_slice(CERT_LABEL);
    m.extend_from_slice(&world.0);
    m.extend_from_slice(&player.to_be_bytes());
    m.extend_from_slice(public_key);
    m.extend_from_slice(&expires_unix_s.to_be_bytes());
    m
}

/// The control servers' signing key of one world: derived from the sealing
/// master secret, so every control server of a fleet has the same one and
/// no reflector can have it. Debug output never shows the seed.
pub struct ControlSigner {
    seed: [u8; 32],
    pair: Ed25519KeyPair,
    world: WorldId,
}

impl fmt::Debug for ControlSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ControlSigner({:?}, public {})",
            self.world,
            hex::encode(self.public_key())
        )
    }
}

impl ControlSigner {
    /// The key of `world`: seed = HKDF-Expand(PRK, "reflector-control-sign-v1"
    /// ‖ world id, 32).
    pub fn derive(master: &MasterSecret, world: WorldId) -> ControlSigner {
        let seed: [u8; 32] = expand(&master.prk, &[CONTROL_SIGN_INFO, &world.0]);
        ControlSigner {
            pair: key_pair(&seed),
            seed,
            world,
        }
    }

    /// The seed (for the test vectors; it never goes on the wire).
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    pub fn world(&self) -> WorldId {
        self.world
    }

    /// `control_public`, as a grant carries it.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        public_of(&self.pair)
    }

    /// The certificate of `player`'s `public_key` until `expires_unix_s`.
    pub fn certify(&self, player: u32, public_key: &[u8; PUBLIC_KEY_LEN], expires_unix_s: u64) -> Certificate {
        let msg = certificate_message(self.world, player, public_key, expires_unix_s);
        Certificate {
            player,
            public_key: *public_key,
            expires_unix_s,
            signature: signature_of(&self.pair, &msg),
        }
    }
}

/// A player's public key certified by the control servers of a world until
/// an expiry (the token's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Certificate {
    pub player: u32,
    pub public_key: [u8; PUBLIC_KEY_LEN],
    pub expires_unix_s: u64,
    /// The control key's signature: the grant's `certificate`.
    pub signature: [u8; SIGNATURE_LEN],
}

/// Whether `cert` is a certificate of `world`'s control key `control_public`.
pub fn verify_certificate(control_public: &[u8; PUBLIC_KEY_LEN], world: WorldId, cert: &Certificate) -> bool {
    let msg = certificate_message(world, cert.player, &cert.public_key, cert.expires_unix_s);
    verifies(control_public, &msg, &cert.signature)
}

/// A client instance's Ed25519 key pair: made once per instance, it never
/// leaves the client. Debug output never shows the private key.
pub struct PlayerKey {
    pair: Ed25519KeyPair,
}

impl fmt::Debug for PlayerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PlayerKey(public {})", hex::encode(self.public_key()))
    }
}

impl PlayerKey {
    /// A new key from the OS RNG.
    pub fn generate() -> Result<PlayerKey, getrandom::Error> {
        let mut seed = [0u8; 32];
        getrandom::getrandom(&mut seed)?;
        Ok(PlayerKey::from_seed(&seed))
    }

    /// The key of a given seed (RFC 8032's private key): tests and vectors.
    pub fn from_seed(seed: &[u8; 32]) -> PlayerKey {
        PlayerKey { pair: key_pair(seed) }
    }

    /// The public key, as `/join?sign_key=` takes it.
    pub fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        public_of(&self.pair)
    }

    /// Signs an envelope in place: its last [`SIGNATURE_LEN`] bytes become
    /// the signature over the label and everything before them.
    pub fn sign_envelope(&self, envelope: &mut [u8]) {
        let Some(end) = envelope.len().checked_sub(SIGNATURE_LEN) else {
            return;
        };
        let sig = signature_of(&self.pair, &signed_message(&envelope[..end]));
        envelope[end..].copy_from_slice(&sig);
    }
}

/// The label and the bytes a signature covers. ring's Ed25519 takes one
/// contiguous message, so this copies the envelope once (one upload every
/// few seconds; a prehashed variant would avoid it at the cost of a second
/// signature scheme in the document).
fn signed_message(before_signature: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNATURE_LABEL.len() + before_signature.len());
    m.extend_from_slice(SIGNATURE_LABEL);
    m.extend_from_slice(before_signature);
    m
}

/// The checkpoint key bytes of one (player, instance) under an epoch key:
/// HKDF-Expand(E(c, e), "reflector-checkpoint-key-v1" ‖ c ‖ e ‖ player ‖
/// instance, 32). Distinct from the sender key of the same inputs.
pub fn checkpoint_key_bytes(epoch_key: &EpochKey, player: u32, instance: u64) -> [u8; KEY_LEN] {
    // The epoch key is uniformly random: it is the PRK itself (RFC 5869 §3.3).
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, epoch_key.as_bytes());
    expand(
        &prk,
        &[
            CHECKPOINT_KEY_INFO,
            &epoch_key.cell().0,
            &epoch_key.epoch().to_be_bytes(),
            &player.to_be_bytes(),
            &instance.to_be_bytes(),
        ],
    )
}

fn aead_key(bytes: &[u8; KEY_LEN]) -> LessSafeKey {
    // AES-256-GCM takes exactly 32-byte keys, which this is.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256-GCM key"))
}

fn nonce(sequence: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&sequence.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

// ---------------------------------------------------------------------------
// Sealing.

/// Why an envelope could not be made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealCheckpointError {
    #[error("the certificate is for another public key than the signing key's: ask /join again with sign_key set to this key")]
    NotOurCertificate,
    #[error("sequence 0 is never used: take the next value of the client-wide counter")]
    ZeroSequence,
    #[error("a state of {0} bytes is beyond what AES-256-GCM seals at once")]
    TooLarge(usize),
}

/// What an uploader says about its upload besides the state.
#[derive(Debug, Clone, Copy)]
pub struct UploadInfo {
    /// The game's snapshot tick: the upload REQUEST's tick too.
    pub tick: u64,
    /// The uploader's client instance id.
    pub instance: u64,
    /// A fresh value of the client-wide counter (no datagram uses it).
    pub sequence: u64,
}

/// The envelope of `state`: sealed under `epoch_key` (the newest the
/// uploader holds for a cell of the group it uploads to) and signed with
/// `signer`, whose certificate is `cert`.
pub fn seal_checkpoint(
    signer: &PlayerKey,
    cert: &Certificate,
    epoch_key: &EpochKey,
    info: UploadInfo,
    state: &[u8],
) -> Result<Vec<u8>, SealCheckpointError> {
    if cert.public_key != signer.public_key() {
        return Err(SealCheckpointError::NotOurCertificate);
    }
    if info.sequence == 0 {
        return Err(SealCheckpointError::ZeroSequence);
    }
    let mut out = vec![0u8; ENVELOPE_OVERHEAD + state.len()];
    out[field::MAGIC].copy_from_slice(&ENVELOPE_MAGIC.to_be_bytes());
    out[field::VERSION] = ENVELOPE_VERSION;
    out[field::EPOCH].copy_from_slice(&epoch_key.epoch().to_be_bytes());
    out[field::PLAYER].copy_from_slice(&cert.player.to_be_bytes());
    out[field::CELL].copy_from_slice(&epoch_key.cell().0);
    out[field::TICK].copy_from_slice(&info.tick.to_be_bytes());
    out[field::INSTANCE].copy_from_slice(&info.instance.to_be_bytes());
    out[field::SEQUENCE].copy_from_slice(&info.sequence.to_be_bytes());
    out[field::CERT_EXPIRY].copy_from_slice(&cert.expires_unix_s.to_be_bytes());
    out[field::PUBLIC_KEY].copy_from_slice(&cert.public_key);
    out[field::CERTIFICATE].copy_from_slice(&cert.signature);
    let end = field::STATE + state.len();
    out[field::STATE..end].copy_from_slice(state);
    let key = aead_key(&checkpoint_key_bytes(epoch_key, cert.player, info.instance));
    let (header, rest) = out.split_at_mut(field::STATE);
    let tag = key
        .seal_in_place_separate_tag(nonce(info.sequence), Aad::from(&header[..]), &mut rest[..state.len()])
        .map_err(|_| SealCheckpointError::TooLarge(state.len()))?;
    out[end..end + AEAD_TAG_LEN].copy_from_slice(tag.as_ref());
    signer.sign_envelope(&mut out);
    Ok(out)
}

// ---------------------------------------------------------------------------
// Opening: the joiner's checks.

/// Why a joiner refused a fetched checkpoint: the first check that failed,
/// in the document's order (each has its counter, [`CheckpointRefusal::counter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum CheckpointRefusal {
    #[error("not a checkpoint envelope (too short, wrong magic or reserved bytes not zero)")]
    Malformed,
    #[error("checkpoint envelope version not served here")]
    Version,
    #[error("its cell is not one of the group's cells: another group's (or world's) checkpoint")]
    WrongCell,
    #[error("the reflector's REPLY names another tick or uploader than the envelope")]
    Mismatch,
    #[error("the uploader's certificate does not verify under the control servers' key")]
    BadCertificate,
    #[error("the uploader's certificate had expired when the state was uploaded")]
    ExpiredCertificate,
    #[error("the envelope's signature does not verify under the uploader's key")]
    BadSignature,
    #[error("no epoch key held for its cell and epoch: fetch again later")]
    NoKey,
    #[error("the state does not open under the checkpoint key (garbage or forged)")]
    Bad,
}

impl CheckpointRefusal {
    pub const ALL: [CheckpointRefusal; 9] = [
        CheckpointRefusal::Malformed,
        CheckpointRefusal::Version,
        CheckpointRefusal::WrongCell,
        CheckpointRefusal::Mismatch,
        CheckpointRefusal::BadCertificate,
        CheckpointRefusal::ExpiredCertificate,
        CheckpointRefusal::BadSignature,
        CheckpointRefusal::NoKey,
        CheckpointRefusal::Bad,
    ];

    /// The name the document gives this refusal (and its counter).
    pub fn counter(self) -> &'static str {
        match self {
            CheckpointRefusal::Malformed => "checkpoint_malformed",
            CheckpointRefusal::Version => "checkpoint_version",
            CheckpointRefusal::WrongCell => "checkpoint_wrong_cell",
            CheckpointRefusal::Mismatch => "checkpoint_mismatch",
            CheckpointRefusal::BadCertificate => "checkpoint_bad_certificate",
            CheckpointRefusal::ExpiredCertificate => "checkpoint_expired_certificate",
            CheckpointRefusal::BadSignature => "checkpoint_bad_signature",
            CheckpointRefusal::NoKey => "checkpoint_no_key",
            CheckpointRefusal::Bad => "checkpoint_bad",
        }
    }
}

/// What the channel's CHECKPOINT REPLY said, and when it arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchedReply {
    pub tick: u64,
    pub from_player: u32,
    /// The REPLY's age ms (a u32 on the wire; [`crate::checkpoint::Fetched`]'s width).
    pub age_ms: u64,
    /// The joiner's clock when the REPLY arrived, Unix ms.
    pub received_unix_ms: u64,
}

/// What a joiner checks a checkpoint of one group against.
#[derive(Debug, Clone, Copy)]
pub struct JoinerView<'a> {
    /// `control_public` from the joiner's own grant.
    pub control_public: &'a [u8; PUBLIC_KEY_LEN],
    /// The epoch keys the joiner holds for the cells of the group it
    /// fetched from (its grant for that group; not other groups' keys):
    /// their cells are the group's cells.
    pub group_keys: &'a [EpochKey],
}

/// A checkpoint that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub player: u32,
    pub instance: u64,
    pub tick: u64,
    pub cell: CellId,
    pub epoch: u32,
    /// Where the state lies in the envelope after opening.
    pub state: Range<usize>,
    /// SHA-256 of the opened state, for [`compare`].
    pub digest: [u8; 32],
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

/// A joiner's checks on a fetched envelope, in the document's order; opens
/// it in place. On a refusal the envelope's bytes are unspecified: drop
/// them, and give nothing of them to the game.
pub fn open_checkpoint(
    envelope: &mut [u8],
    reply: &FetchedReply,
    joiner: &JoinerView<'_>,
) -> Result<Opened, CheckpointRefusal> {
    use CheckpointRefusal as R;
    // 1. Form.
    if envelope.len() < ENVELOPE_OVERHEAD
        || be_u32(&envelope[field::MAGIC]) != ENVELOPE_MAGIC
        || envelope[field::RESERVED] != [0u8; 3]
    {
        return Err(R::Malformed);
    }
    if envelope[field::VERSION] != ENVELOPE_VERSION {
        return Err(R::Version);
    }
    let mut cell = [0u8; CELL_ID_LEN];
    cell.copy_from_slice(&envelope[field::CELL]);
    let cell = CellId(cell);
    let epoch = be_u32(&envelope[field::EPOCH]);
    let player = be_u32(&envelope[field::PLAYER]);
    let tick = be_u64(&envelope[field::TICK]);
    let instance = be_u64(&envelope[field::INSTANCE]);
    let sequence = be_u64(&envelope[field::SEQUENCE]);
    // 2. One of the group's cells.
    if !joiner.group_keys.iter().any(|k| k.cell() == cell) {
        return Err(R::WrongCell);
    }
    // 3. The reflector's account of the upload.
    if reply.tick != tick || reply.from_player != player {
        return Err(R::Mismatch);
    }
    // 4. The certificate, for the cell's world, and its expiry at upload.
    let mut public_key = [0u8; PUBLIC_KEY_LEN];
    public_key.copy_from_slice(&envelope[field::PUBLIC_KEY]);
    let mut signature = [0u8; SIGNATURE_LEN];
    signature.copy_from_slice(&envelope[field::CERTIFICATE]);
    let cert = Certificate {
        player,
        public_key,
        expires_unix_s: be_u64(&envelope[field::CERT_EXPIRY]),
        signature,
    };
    let world = WorldId([cell.0[0], cell.0[1], cell.0[2], cell.0[3]]);
    if !verify_certificate(joiner.control_public, world, &cert) {
        return Err(R::BadCertificate);
    }
    let uploaded_ms = reply.received_unix_ms.saturating_sub(reply.age_ms);
    if uploaded_ms >= cert.expires_unix_s.saturating_mul(1000) {
        return Err(R::ExpiredCertificate);
    }
    // 5. The uploader's signature.
    let sig_at = envelope.len() - SIGNATURE_LEN;
    if !verifies(&public_key, &signed_message(&envelope[..sig_at]), &envelope[sig_at..]) {
        return Err(R::BadSignature);
    }
    // 6. A key held for (cell, epoch).
    let epoch_key = joiner
        .group_keys
        .iter()
        .find(|k| k.cell() == cell && k.epoch() == epoch)
        .ok_or(R::NoKey)?;
    // 7. The AEAD.
    let key = aead_key(&checkpoint_key_bytes(epoch_key, player, instance));
    let (header, rest) = envelope.split_at_mut(field::STATE);
    let opened = key
        .open_in_place(
            nonce(sequence),
            Aad::from(&header[..]),
            &mut rest[..sig_at - field::STATE],
        )
        .map_err(|_| R::Bad)?;
    let digest: [u8; 32] = Sha256::digest(&*opened).into();
    let state = field::STATE..field::STATE + opened.len();
    Ok(Opened {
        player,
        instance,
        tick,
        cell,
        epoch,
        state,
        digest,
    })
}

/// How far a joiner can trust a checkpoint state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agreement {
    /// Two members uploaded the same state for the same tick.
    VerifiedByTwo { tick: u64, players: [u32; 2] },
    /// Only one member's word (checked and attributable).
    SignedByOne { tick: u64, player: u32 },
    /// Two members uploaded different states for the same tick: the
    /// envelopes are the evidence; which to load is the game's policy.
    Disagree { tick: u64, players: [u32; 2] },
}

/// The two-snapshot comparison: `latest` (FETCH) and, if fetched and
/// opened, `other` (FETCH_OTHER).
pub fn compare(latest: &Opened, other: Option<&Opened>) -> Agreement {
    match other {
        Some(o) if o.tick == latest.tick && o.player != latest.player => {
            let players = [latest.player, o.player];
            if o.digest == latest.digest {
                Agreement::VerifiedByTwo {
                    tick: latest.tick,
                    players,
                }
            } else {
                Agreement::Disagree {
                    tick: latest.tick,
                    players,
                }
            }
        }
        _ => Agreement::SignedByOne {
            tick: latest.tick,
            player: latest.player,
        },
    }
}

#[cfg(test)]
mod tests;
