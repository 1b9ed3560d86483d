//! Sealed payloads (`docs/protocol.md`, "Sealed payloads"): a DATA's game
//! data encrypted and authenticated end to end under keys the reflectors
//! never hold.
//!
//! - [`CellId`]: the stable 8-byte name of a cell (world id, column, row);
//! - [`MasterSecret`]: the control servers' secret, and from it the
//!   [`EpochKey`] of a cell and epoch and the epoch's jittered start
//!   ([`Schedule`]);
//! - [`SenderKey`]: one sender's AES-256-GCM key for one cell and
//!   epoch, derived from the epoch key, the player and the client instance
//!   id; [`SenderKey::seal`] writes a sealed DATA in place (seal first, then
//!   tag) and refuses a sequence that is not above the last it sealed;
//!   [`SenderKey::open`] opens one in place;
//! - [`Receiver`]: the receiving rules in the document's order (form, key
//!   held, replay window per (player, instance), AEAD), each refusal
//!   counted, duplicate deliveries (another group's copy) apart from
//!   replays;
//! - [`checkpoint`]: sealed checkpoints, a checkpoint state sealed under
//!   the epoch key and signed with the uploader's certified Ed25519 key,
//!   and a joiner's checks.
//!
//! Sealing and opening allocate nothing: the AEAD runs in place in the
//! datagram buffer and the associated data is copied to the stack. Key
//! derivation (HKDF-SHA256) runs once per key, not per datagram.
//!
//! "Seal" here means encrypt and authenticate end to end; writing a
//! datagram's header and its MAC or DATA tag is
//! [`crate::protocol::emit_in_place`].

use crate::protocol::{EmitError, Header, Kind, ReplayWindow, SessionKeys, MAX_DATAGRAM_KERNEL, TAG};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;

/// The sealed-payload format's own version (byte 40): 2, AES-256-GCM.
/// Version 1 (ChaCha20-Poly1305) was withdrawn before any release and is
/// refused like any other version.
pub const SEALED_VERSION: u8 = 2;
/// Length of a cell id.
pub const CELL_ID_LEN: usize = 8;
/// Length of an epoch key and of a sender key.
pub const KEY_LEN: usize = 32;
/// Length of the AEAD's authentication tag (GCM's full 128-bit tag).
pub const AEAD_TAG_LEN: usize = 16;
/// Shortest master secret accepted.
pub const MIN_MASTER_LEN: usize = 32;
/// `W`, the overlap: the next epoch's key is handed out from this long
/// before the epoch starts, and a receiver drops a key this long after its
/// epoch ended.
pub const OVERLAP_S: u64 = 60;

/// Where the sealed payload's fields sit in a DATA.
pub mod field {
    use std::ops::Range;
    /// The sender's client instance id (the instance flag's field).
    pub const INSTANCE: Range<usize> = 32..40;
    pub const VERSION: usize = 40;
    /// Zero; keeps the ciphertext 8-byte aligned.
    pub const RESERVED: Range<usize> = 41..44;
    pub const EPOCH: Range<usize> = 44..48;
    pub const CELL: Range<usize> = 48..56;
    /// Where the encrypted game data starts; everything before it (bytes
    /// 24..32 read as zero) is the associated data.
    pub const CIPHERTEXT: usize = 56;
}

/// The smallest sealed DATA: header, tag, instance, sealed header, AEAD tag.
pub const SEALED_MIN: usize = field::CIPHERTEXT + AEAD_TAG_LEN;
/// What sealing adds to a DATA whose payload starts with the instance id.
pub const SEALED_OVERHEAD: usize = SEALED_MIN - field::INSTANCE.end;
/// The most game data a sealed DATA carries on the kernel path (1,400).
pub const MAX_SEALED_GAME_DATA: usize = MAX_DATAGRAM_KERNEL - SEALED_MIN;

const SALT: &[u8] = b"reflector-sealed-v1";
const EPOCH_KEY_INFO: &[u8] = b"reflector-epoch-key-v1";
const SENDER_KEY_INFO: &[u8] = b"reflector-sender-key-v1";
const JITTER_INFO: &[u8] = b"reflector-epoch-jitter-v1";
const WORLD_LABEL: &[u8] = b"reflector-world-v1";

pub mod checkpoint;

// ---------------------------------------------------------------------------
// Names and keys.

/// A world's 4-byte id: the first bytes of SHA-256 over a label and its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WorldId(pub [u8; 4]);

impl WorldId {
    pub fn from_name(name: &str) -> WorldId {
        let d = Sha256::new()
            .chain_update(WORLD_LABEL)
            .chain_update(name.as_bytes())
            .finalize();
        WorldId([d[0], d[1], d[2], d[3]])
    }
}

/// A cell's stable id: world id, column, row (big-endian). It does not
/// change when the cell moves to another reflector or port.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CellId(pub [u8; CELL_ID_LEN]);

impl fmt::Debug for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CellId({})", hex::encode(self.0))
    }
}

/// A cell coordinate that does not fit a cell id's 2 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cell [{column}, {row}] is outside the grids a cell id can name (at most 65,535 columns and rows; the control server allows 4,096)")]
pub struct CellOutOfRange {
    pub column: u32,
    pub row: u32,
}

impl CellId {
    pub fn new(world: WorldId, column: u32, row: u32) -> Result<CellId, CellOutOfRange> {
        let (Ok(c), Ok(r)) = (u16::try_from(column), u16::try_from(row)) else {
            return Err(CellOutOfRange { column, row });
        };
        let mut id = [0u8; CELL_ID_LEN];
        id[..4].copy_from_slice(&world.0);
        id[4..6].copy_from_slice(&c.to_be_bytes());
        id[6..].copy_from_slice(&r.to_be_bytes());
        Ok(CellId(id))
    }
}

/// A bad master secret or schedule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("master secret is {0} bytes; it must be at least {MIN_MASTER_LEN} random bytes")]
    MasterTooShort(usize),
    #[error("epoch length must be at least 1 s and the jitter bound at most half of it (got length {length_s} s, jitter {jitter_bound_s} s)")]
    BadSchedule { length_s: u64, jitter_bound_s: u64 },
}

/// HKDF output lengths for ring's `expand`.
struct OkmLen(usize);

impl hkdf::KeyType for OkmLen {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand<const N: usize>(prk: &hkdf::Prk, info: &[&[u8]]) -> [u8; N] {
    let mut out = [0u8; N];
    // HKDF-SHA256 expands to at most 255 × 32 bytes; every length here is
    // 8 or 32, so neither call can fail.
    prk.expand(info, OkmLen(N))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF output of at most 32 bytes");
    out
}

/// The control servers' master secret (never a reflector's). Debug output
/// never shows it.
pub struct MasterSecret {
    prk: hkdf::Prk,
}

impl fmt::Debug for MasterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterSecret(..)")
    }
}

impl MasterSecret {
    pub fn new(bytes: &[u8]) -> Result<MasterSecret, KeyError> {
        if bytes.len() < MIN_MASTER_LEN {
            return Err(KeyError::MasterTooShort(bytes.len()));
        }
        Ok(MasterSecret {
            prk: hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(bytes),
        })
    }

    /// The epoch key of `cell` in `epoch`.
    pub fn epoch_key(&self, cell: CellId, epoch: u32) -> EpochKey {
        EpochKey {
            cell,
            epoch,
            key: expand(&self.prk, &[EPOCH_KEY_INFO, &cell.0, &epoch.to_be_bytes()]),
        }
    }

    /// `j(c, e)`: the epoch's jitter, in seconds below `bound_s` (0 if it is 0).
    pub fn jitter(&self, cell: CellId, epoch: u32, bound_s: u64) -> u64 {
        let raw: [u8; 8] = expand(&self.prk, &[JITTER_INFO, &cell.0, &epoch.to_be_bytes()]);
        u64::from_be_bytes(raw).checked_rem(bound_s).unwrap_or(0)
    }
}

/// The rotation schedule: epoch `e` of cell `c` starts at
/// `e × length + j(c, e)`, with `j < jitter_bound ≤ length / 2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    length_s: u64,
    jitter_bound_s: u64,
}

impl Schedule {
    pub fn new(length_s: u64, jitter_bound_s: u64) -> Result<Schedule, KeyError> {
        if length_s == 0 || jitter_bound_s > length_s / 2 {
            return Err(KeyError::BadSchedule {
                length_s,
                jitter_bound_s,
            });
        }
        Ok(Schedule {
            length_s,
            jitter_bound_s,
        })
    }

    pub fn length_s(&self) -> u64 {
        self.length_s
    }

    pub fn jitter_bound_s(&self) -> u64 {
        self.jitter_bound_s
    }

    /// When epoch `epoch` of `cell` starts, Unix seconds.
    pub fn start(&self, master: &MasterSecret, cell: CellId, epoch: u32) -> u64 {
        u64::from(epoch) * self.length_s + master.jitter(cell, epoch, self.jitter_bound_s)
    }

    /// The newest epoch of `cell` that has started at `now_s` (epoch 0
    /// before any has: the schedule starts at the Unix epoch).
    pub fn current_epoch(&self, master: &MasterSecret, cell: CellId, now_s: u64) -> u32 {
        let unjittered = u32::try_from(now_s / self.length_s).unwrap_or(u32::MAX);
        // Epoch e starts in [e × L, e × L + J) with J ≤ L / 2: the current
        // epoch is the unjittered one or, before its jitter has passed, the
        // one before.
        if unjittered > 0 && self.start(master, cell, unjittered) > now_s {
            unjittered - 1
        } else {
            unjittered
        }
    }

    /// The epochs whose keys a control server hands out for `cell` at
    /// `now_s`: the current one and, inside the overlap window (from
    /// [`OVERLAP_S`] before it starts), the next, never earlier.
    pub fn handed_out(&self, master: &MasterSecret, cell: CellId, now_s: u64) -> (u32, Option<u32>) {
        let current = self.current_epoch(master, cell, now_s);
        let next = current
            .checked_add(1)
            .filter(|&n| now_s.saturating_add(OVERLAP_S) >= self.start(master, cell, n));
        (current, next)
    }
}

/// The key of one cell in one epoch: what the control server hands a
/// player. Debug output never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct EpochKey {
    cell: CellId,
    epoch: u32,
    key: [u8; KEY_LEN],
}

impl fmt::Debug for EpochKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EpochKey({:?}, epoch {})", self.cell, self.epoch)
    }
}

impl EpochKey {
    /// A key as the control server's answer gives it.
    pub fn from_bytes(cell: CellId, epoch: u32, key: [u8; KEY_LEN]) -> EpochKey {
        EpochKey { cell, epoch, key }
    }

    pub fn cell(&self) -> CellId {
        self.cell
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// The key bytes (to hand out, or to compare with a test vector).
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.key
    }

    /// The sender key bytes of one (player, instance) under this key.
    pub fn sender_key_bytes(&self, player: u32, instance: u64) -> [u8; KEY_LEN] {
        // The epoch key is uniformly random: it is the PRK itself (RFC 5869 §3.3).
        let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, &self.key);
        expand(
            &prk,
            &[
                SENDER_KEY_INFO,
                &self.cell.0,
                &self.epoch.to_be_bytes(),
                &player.to_be_bytes(),
                &instance.to_be_bytes(),
            ],
        )
    }

    /// The AEAD key of one (player, instance) under this key: a sender's
    /// own, or one a receiver derives once per sender it hears.
    pub fn sender_key(&self, player: u32, instance: u64) -> SenderKey {
        let bytes = self.sender_key_bytes(player, instance);
        // AES-256-GCM takes exactly 32-byte keys, which this is.
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).expect("a 32-byte AES-256-GCM key");
        SenderKey {
            aead: LessSafeKey::new(unbound),
            cell: self.cell,
            epoch: self.epoch,
            player,
            instance,
            last_sealed: 0,
        }
    }
}

/// A JOIN_ACK whose flags ask for sealing without the instance id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the group's JOIN_ACK flags {0:#04x} say sealed (bit 2) without the instance id (bit 1): the group is misconfigured; send no DATA in it")]
pub struct SealedWithoutInstance(pub u8);

/// Whether a group's DATA is sealed, from its JOIN_ACK flags.
pub fn group_is_sealed(flags: u8) -> Result<bool, SealedWithoutInstance> {
    use crate::protocol::{FLAG_INSTANCE, FLAG_SEALED};
    match (flags & FLAG_SEALED != 0, flags & FLAG_INSTANCE != 0) {
        (true, false) => Err(SealedWithoutInstance(flags)),
        (sealed, _) => Ok(sealed),
    }
}

/// The MAC of a `/keys` request: `HMAC(Km, "reflector-keys-v1" ‖ token ‖
/// at)[..16]`, `at` the client's Unix seconds. Proves the session key, not
/// just the token (which crosses the network in every JOIN).
pub fn keys_request_mac(keys: &SessionKeys, token: &[u8; crate::auth::TOKEN_LEN], at_unix_s: u64) -> [u8; 16] {
    use hmac::Mac;
    let full = keys_request_hmac(keys, token, at_unix_s).finalize().into_bytes();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// Whether `mac` is the `/keys` request MAC of (token, at) under `keys`,
/// compared in constant time (the control server's check).
pub fn verify_keys_request_mac(
    keys: &SessionKeys,
    token: &[u8; crate::auth::TOKEN_LEN],
    at_unix_s: u64,
    mac: &[u8],
) -> bool {
    use hmac::Mac;
    mac.len() == 16
        && keys_request_hmac(keys, token, at_unix_s)
            .verify_truncated_left(mac)
            .is_ok()
}

fn keys_request_hmac(keys: &SessionKeys, token: &[u8; crate::auth::TOKEN_LEN], at_unix_s: u64) -> hmac::Hmac<Sha256> {
    use hmac::{Hmac, Mac};
    // HMAC-SHA256 takes keys of any length: new_from_slice cannot fail.
    let mut m = Hmac::<Sha256>::new_from_slice(keys.mac_key()).expect("HMAC accepts any key length");
    m.update(KEYS_REQUEST_LABEL);
    m.update(token);
    m.update(&at_unix_s.to_be_bytes());
    m
}

const KEYS_REQUEST_LABEL: &[u8] = b"reflector-keys-v1";

// ---------------------------------------------------------------------------
// Sealing and opening.

/// Why a sealed DATA could not be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error("{0} game data bytes do not fit a sealed DATA on the kernel path (at most {MAX_SEALED_GAME_DATA})")]
    TooLarge(usize),
    #[error("a sealed payload goes only in a DATA, not a {0}")]
    NotData(&'static str),
    #[error("the header's player {header} is not this key's player {key}")]
    WrongPlayer { header: u32, key: u32 },
    #[error("sequence {seq} is not above {last}, the last this key sealed: a nonce would repeat (the client-wide counter must never go back)")]
    SequenceNotAbove { seq: u64, last: u64 },
    #[error(transparent)]
    Emit(#[from] EmitError),
}

/// Why a received sealed DATA was dropped: the receiving step that refused
/// it (each has its counter, [`OpenError::counter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("not a sealed DATA (too short, or not a DATA)")]
    Malformed,
    #[error("sealed version not served here")]
    Version,
    #[error("no epoch key held for its cell and epoch")]
    NoKey,
    #[error("sequence already seen from that sender instance")]
    Replay,
    #[error("does not open under the sender's key (forged or altered)")]
    Bad,
    #[error(
        "a duplicate delivery: that sequence already opened from another of the sender's copies (another group's)"
    )]
    Duplicate,
}

impl OpenError {
    /// The counter the document names for this refusal.
    pub fn counter(self) -> &'static str {
        match self {
            OpenError::Malformed => "sealed_malformed",
            OpenError::Version => "sealed_version",
            OpenError::NoKey => "sealed_no_key",
            OpenError::Replay => "sealed_replay",
            OpenError::Bad => "sealed_bad",
            OpenError::Duplicate => "sealed_duplicate",
        }
    }
}

/// A sealed DATA's clear fields, read without a key (receiving step 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealedFields {
    pub player: u32,
    pub sequence: u64,
    pub instance: u64,
    pub epoch: u32,
    pub cell: CellId,
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(b);
    u32::from_be_bytes(a)
}

/// Step 1: a DATA of at least [`SEALED_MIN`] bytes whose length field
/// agrees, with sealed version 1. Only the fields the sealed format needs
/// are read; the datagram layer checked the rest.
pub fn sealed_fields(datagram: &[u8]) -> Result<SealedFields, OpenError> {
    use crate::protocol::field as hf;
    let n = datagram.len();
    if n < SEALED_MIN
        || datagram[hf::KIND] != Kind::Data as u8
        || usize::from(u16::from_be_bytes([
            datagram[hf::LENGTH.start],
            datagram[hf::LENGTH.start + 1],
        ])) != n - crate::protocol::HEADER_LEN
    {
        return Err(OpenError::Malformed);
    }
    if datagram[field::VERSION] != SEALED_VERSION {
        return Err(OpenError::Version);
    }
    let mut cell = [0u8; CELL_ID_LEN];
    cell.copy_from_slice(&datagram[field::CELL]);
    Ok(SealedFields {
        player: be_u32(&datagram[hf::SENDER]),
        sequence: be_u64(&datagram[hf::SEQ]),
        instance: be_u64(&datagram[field::INSTANCE]),
        epoch: be_u32(&datagram[field::EPOCH]),
        cell: CellId(cell),
    })
}

/// The associated data: bytes 0..56 with the tag field read as zero.
fn associated_data(datagram: &[u8]) -> [u8; field::CIPHERTEXT] {
    let mut ad = [0u8; field::CIPHERTEXT];
    ad.copy_from_slice(&datagram[..field::CIPHERTEXT]);
    ad[TAG].fill(0);
    ad
}

fn nonce(sequence: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&sequence.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// One sender's AEAD key in one cell and epoch. As a sender's key it
/// remembers the last sequence it sealed, and never seals one not above it.
pub struct SenderKey {
    aead: LessSafeKey,
    cell: CellId,
    epoch: u32,
    player: u32,
    instance: u64,
    last_sealed: u64,
}

impl fmt::Debug for SenderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SenderKey({:?}, epoch {}, player {}, instance {:#x})",
            self.cell, self.epoch, self.player, self.instance
        )
    }
}

impl SenderKey {
    /// The last sequence this key sealed (0: none yet).
    pub fn last_sealed(&self) -> u64 {
        self.last_sealed
    }

    /// Writes a sealed DATA in `out`, in place: the caller has put
    /// `game_len` bytes of game data at [`field::CIPHERTEXT`]. Writes the
    /// header (its `seq` is the client-wide counter, the nonce), the
    /// instance id and the sealed header, encrypts the game data and
    /// appends the AEAD tag, then, if the group has tags, the DATA tag over
    /// the sealed datagram. Returns the datagram's length.
    pub fn seal(
        &mut self,
        h: &Header,
        game_len: usize,
        tag_keys: Option<&SessionKeys>,
        out: &mut [u8],
    ) -> Result<usize, SealError> {
        if h.kind != Kind::Data {
            return Err(SealError::NotData(h.kind.name()));
        }
        if h.sender != self.player {
            return Err(SealError::WrongPlayer {
                header: h.sender,
                key: self.player,
            });
        }
        if game_len > MAX_SEALED_GAME_DATA {
            return Err(SealError::TooLarge(game_len));
        }
        if h.seq <= self.last_sealed {
            return Err(SealError::SequenceNotAbove {
                seq: h.seq,
                last: self.last_sealed,
            });
        }
        let len = SEALED_MIN + game_len;
        // The header with a zero tag field (no keys: the tag comes last).
        crate::protocol::emit_in_place(h, len, None, out)?;
        out[field::INSTANCE].copy_from_slice(&self.instance.to_be_bytes());
        out[field::VERSION] = SEALED_VERSION;
        out[field::RESERVED].fill(0);
        out[field::EPOCH].copy_from_slice(&self.epoch.to_be_bytes());
        out[field::CELL].copy_from_slice(&self.cell.0);
        let ad = associated_data(out);
        let end = field::CIPHERTEXT + game_len;
        let tag = self
            .aead
            .seal_in_place_separate_tag(nonce(h.seq), Aad::from(&ad), &mut out[field::CIPHERTEXT..end])
            // ring refuses only inputs beyond GCM's 2^36 - 32-byte limit,
            // far above MAX_SEALED_GAME_DATA, checked above.
            .map_err(|_| SealError::TooLarge(game_len))?;
        out[end..len].copy_from_slice(tag.as_ref());
        self.last_sealed = h.seq;
        if let Some(k) = tag_keys {
            let t = k.tag(&out[..len]);
            out[TAG].copy_from_slice(&t.to_be_bytes());
        }
        Ok(len)
    }

    /// Opens a sealed DATA in place (step 4 alone: the caller checked the
    /// form, the key and the window) and returns where its game data now
    /// lies in `datagram`. On failure the ciphertext is left unspecified:
    /// drop the datagram.
    pub fn open(&self, datagram: &mut [u8]) -> Result<Range<usize>, OpenError> {
        let f = sealed_fields(datagram)?;
        if f.player != self.player || f.instance != self.instance || f.cell != self.cell || f.epoch != self.epoch {
            return Err(OpenError::Bad);
        }
        self.open_read(datagram, &f)
    }

    /// [`SenderKey::open`] with the fields read already, by the caller
    /// that chose this key by them (so they are this key's).
    fn open_read(&self, datagram: &mut [u8], f: &SealedFields) -> Result<Range<usize>, OpenError> {
        debug_assert!(
            f.player == self.player && f.instance == self.instance && f.cell == self.cell && f.epoch == self.epoch
        );
        let ad = associated_data(datagram);
        let opened = self
            .aead
            .open_in_place(nonce(f.sequence), Aad::from(&ad), &mut datagram[field::CIPHERTEXT..])
            .map_err(|_| OpenError::Bad)?;
        Ok(field::CIPHERTEXT..field::CIPHERTEXT + opened.len())
    }
}

// ---------------------------------------------------------------------------
// The receiver.

/// What a receiver dropped, per step, and what it opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiveCounters {
    pub opened: u64,
    pub malformed: u64,
    pub version: u64,
    pub no_key: u64,
    pub replay: u64,
    pub bad: u64,
    /// Authentic copies of a sequence already opened, sealed for another
    /// group (docs/protocol.md, "Duplicate deliveries"): dropped, not an
    /// attack.
    pub duplicate: u64,
}

impl ReceiveCounters {
    fn count(&mut self, e: OpenError) {
        match e {
            OpenError::Malformed => self.malformed += 1,
            OpenError::Version => self.version += 1,
            OpenError::NoKey => self.no_key += 1,
            OpenError::Replay => self.replay += 1,
            OpenError::Bad => self.bad += 1,
            OpenError::Duplicate => self.duplicate += 1,
        }
    }
}

/// The opened copies a receiver remembers per (player, instance), to tell
/// a duplicate delivery from a replay (docs/protocol.md, "Duplicate
/// deliveries").
pub const OPENED_REMEMBERED: usize = 8;

/// The first 8 bytes of a sealed DATA's AEAD tag (its last 16 bytes): what
/// tells two copies of one sequence apart. `datagram` passed step 1, so it
/// is at least [`SEALED_MIN`] bytes.
fn tag_prefix(datagram: &[u8]) -> u64 {
    let n = datagram.len();
    be_u64(&datagram[n - AEAD_TAG_LEN..n - AEAD_TAG_LEN + 8])
}

/// All a receiver keeps of one (player, instance) that a datagram opened
/// from, in one table entry, so that a datagram costs one lookup: the
/// replay window, its least-recently-used stamp, the sender keys that
/// opened something, and the last copies opened.
struct Sender {
    window: ReplayWindow,
    /// [`Receiver::uses`] when a datagram last opened: the least recently
    /// used goes first when the table is full.
    last_used: u64,
    /// One per (cell, epoch) this sender sealed under that the receiver
    /// holds a key for: one or two (a rotation), a few for a mover.
    keys: Vec<SenderKey>,
    /// (sequence, [`tag_prefix`]) of the last copies opened, a ring;
    /// sequence 0 (never opened) marks an empty slot.
    opened: [(u64, u64); OPENED_REMEMBERED],
    next_opened: usize,
}

impl Sender {
    fn new(key: SenderKey) -> Sender {
        Sender {
            window: ReplayWindow::default(),
            last_used: 0,
            keys: vec![key],
            opened: [(0, 0); OPENED_REMEMBERED],
            next_opened: 0,
        }
    }

    fn key(&self, cell: CellId, epoch: u32) -> Option<&SenderKey> {
        self.keys.iter().find(|k| k.cell == cell && k.epoch == epoch)
    }

    fn remember(&mut self, seq: u64, tag: u64) {
        self.opened[self.next_opened] = (seq, tag);
        self.next_opened = (self.next_opened + 1) % OPENED_REMEMBERED;
    }

    /// For a sequence that is not fresh: whether this copy may be a
    /// duplicate delivery (a copy of `seq` is remembered, none with this
    /// tag) rather than a replay.
    fn may_be_duplicate(&self, seq: u64, tag: u64) -> bool {
        let mut seen = false;
        for &(s, t) in &self.opened {
            if s == seq {
                if t == tag {
                    return false;
                }
                seen = true;
            }
        }
        seen
    }
}

/// The receiving side of sealed groups: the epoch keys held and, per
/// (player, instance) heard, one entry with its replay window (across all
/// groups, cells and epochs: the sequence is client-wide), the sender keys
/// derived for it (once per (cell, epoch)) and the copies it last opened.
/// The table grows only when a new sender opens, never per datagram.
///
/// Its keys are chosen by whoever sends (any holder of an epoch key can
/// derive any player's sender key, so an entry's (player, instance) is not
/// proof of who sent), and every datagram is looked up in it: it keeps
/// std's `RandomState`, SipHash keyed at random per table, so nobody can
/// aim keys at one bucket; the table is also bounded (`max_windows`). One
/// SipHash per datagram is about 160 instructions of the ~1,800 a 100-byte
/// receive takes (the AEAD ~1,450, `examples/open_floor.rs`): too little
/// to trade for an unkeyed hash.
pub struct Receiver {
    epoch_keys: Vec<EpochKey>,
    senders: HashMap<(u32, u64), Sender>,
    max_windows: usize,
    uses: u64,
    counters: ReceiveCounters,
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("epoch_keys", &self.epoch_keys)
            .field("senders", &self.senders.len())
            .field("sender_keys", &self.sender_keys())
            .field("counters", &self.counters)
            .finish()
    }
}

impl Receiver {
    /// A receiver that keeps at most `max_windows` (player, instance)
    /// windows (at least 1); beyond it the least recently used is forgotten
    /// (the document's residual risk: a replay of that instance opens once
    /// more while its epoch key is held).
    pub fn new(max_windows: usize) -> Receiver {
        Receiver {
            epoch_keys: Vec::new(),
            senders: HashMap::new(),
            max_windows: max_windows.max(1),
            uses: 0,
            counters: ReceiveCounters::default(),
        }
    }

    /// Holds `key` (replacing one of the same cell and epoch).
    pub fn add_epoch_key(&mut self, key: EpochKey) {
        self.remove_epoch_key(key.cell, key.epoch);
        self.epoch_keys.push(key);
    }

    /// Drops the key of (cell, epoch) and every sender key derived from it.
    pub fn remove_epoch_key(&mut self, cell: CellId, epoch: u32) {
        self.epoch_keys.retain(|k| !(k.cell == cell && k.epoch == epoch));
        for s in self.senders.values_mut() {
            s.keys.retain(|k| !(k.cell == cell && k.epoch == epoch));
        }
    }

    pub fn counters(&self) -> ReceiveCounters {
        self.counters
    }

    /// Sender keys kept, over every sender.
    fn sender_keys(&self) -> usize {
        self.senders.values().map(|s| s.keys.len()).sum()
    }

    /// Applies the receiving steps to a DATA of a sealed group, in place;
    /// returns where the game data lies, or the refusal (already counted).
    pub fn receive(&mut self, datagram: &mut [u8]) -> Result<Range<usize>, OpenError> {
        let r = self.receive_uncounted(datagram);
        match r {
            Ok(_) => self.counters.opened += 1,
            Err(e) => self.counters.count(e),
        }
        r
    }

    fn receive_uncounted(&mut self, datagram: &mut [u8]) -> Result<Range<usize>, OpenError> {
        // Step 1, the fields read once.
        let f = sealed_fields(datagram)?;
        let tag = tag_prefix(datagram);
        // The one table lookup of a datagram from a sender heard before.
        let sender = self.senders.get_mut(&(f.player, f.instance));
        let held = sender.as_deref().and_then(|s| s.key(f.cell, f.epoch));
        // Step 2: a sender key derived already implies its epoch key.
        let epoch_key = match held {
            Some(_) => None,
            None => Some(
                self.epoch_keys
                    .iter()
                    .find(|k| k.cell == f.cell && k.epoch == f.epoch)
                    .ok_or(OpenError::NoKey)?,
            ),
        };
        // Step 3, before any AEAD (and before deriving a key).
        let duplicate = match sender.as_deref() {
            _ if f.sequence == 0 => return Err(OpenError::Replay),
            None => false,
            Some(s) if s.window.fresh(f.sequence) => false,
            Some(s) if s.may_be_duplicate(f.sequence, tag) => true,
            Some(_) => return Err(OpenError::Replay),
        };
        // Step 4. A key derived here is kept only once a datagram opened
        // under it: forged datagrams with made-up instances cost a
        // derivation each, never memory.
        let derived = epoch_key.map(|k| k.sender_key(f.player, f.instance));
        // One of the two is there: `held`, or else the epoch key's.
        let key = held.or(derived.as_ref()).ok_or(OpenError::NoKey)?;
        let game = key.open_read(datagram, &f)?;
        self.uses += 1;
        match sender {
            Some(s) => {
                // (Not `extend`: that would move the large `None` too.)
                if let Some(k) = derived {
                    s.keys.push(k);
                }
                s.remember(f.sequence, tag);
                if duplicate {
                    return Err(OpenError::Duplicate);
                }
                s.window.accept(f.sequence);
                s.last_used = self.uses;
            }
            // A new sender: no key was held, so `derived` is its key.
            None => {
                if let Some(key) = derived {
                    if self.senders.len() >= self.max_windows {
                        let oldest = self.senders.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| *k);
                        if let Some(old) = oldest {
                            self.senders.remove(&old);
                        }
                    }
                    let mut s = Sender::new(key);
                    s.window.accept(f.sequence);
                    s.remember(f.sequence, tag);
                    s.last_used = self.uses;
                    self.senders.insert((f.player, f.instance), s);
                }
            }
        }
        Ok(game)
    }
}

#[cfg(test)]
mod tests;
