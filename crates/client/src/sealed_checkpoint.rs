//! Checkpoints in sealed groups (docs/protocol.md, "Sealed checkpoints"):
//! the client's Ed25519 signing key (one per client instance, sent as
//! `sign_key` on every `/join`), the certificates its grants bring, the
//! envelope an upload sends instead of the game's state, and a joiner's
//! checks on what it fetched. The envelope and the checks are
//! `reflector_proto::sealed::checkpoint`'s; this module picks the key, the
//! sequence and the certificate, and counts what the checks refuse.

// From the protocol crate, as `checkpoint` takes them: this module sits below the channel.
use crate::token::{GrantSigning, SignRequest, SigningSink};
use crate::{Error, GroupKey, Verification};
use reflector_proto::checkpoint::{ChannelError as CheckpointError, CheckpointOp};
use reflector_proto::sealed::checkpoint::{
    compare, open_checkpoint, seal_checkpoint, verify_certificate, Agreement, Certificate, CheckpointRefusal,
    FetchedReply, JoinerView, Opened, PlayerKey, SealCheckpointError, UploadInfo, ENVELOPE_OVERHEAD, PUBLIC_KEY_LEN,
    SIGNATURE_LEN,
};
use reflector_proto::sealed::WorldId;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Opened snapshots kept for the two-snapshot comparison: one per
/// (group, FETCH or FETCH_OTHER), a handful of groups at most.
const OPENED_KEPT: usize = 16;

/// The client's checkpoint signing state (held in [`crate::sealing::Sealing`]).
pub(crate) struct CheckpointSigning {
    key: PlayerKey,
    /// Certificates from `/join` answers, put here by the request thread.
    sink: SigningSink,
    /// The newest certificate per group (by expiry).
    grants: Vec<(GroupKey, GrantSigning)>,
    /// The last snapshot each fetch opened, per group and op.
    opened: Vec<(GroupKey, CheckpointOp, Opened)>,
}

impl CheckpointSigning {
    pub(crate) fn new() -> CheckpointSigning {
        CheckpointSigning {
            // Without the OS RNG there is no safe instance id or key at
            // all (as `crate::random_u64`).
            key: PlayerKey::generate().expect("the OS random source is available"),
            sink: Arc::new(Mutex::new(Vec::new())),
            grants: Vec::new(),
            opened: Vec::new(),
        }
    }

    pub(crate) fn public_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.key.public_key()
    }

    /// What a `/join` request carries for signing.
    pub(crate) fn sign_request(&self) -> SignRequest {
        SignRequest {
            public_key: self.key.public_key(),
            sink: Arc::clone(&self.sink),
        }
    }

    /// Holds `g` for `group` unless a certificate expiring later is held
    /// (a renewal's answer may arrive after a newer one was handed in).
    fn hold(&mut self, group: GroupKey, g: GrantSigning) {
        // Groups left long ago go: a certificate an hour past its expiry
        // belongs to no membership (one is renewed before its token ends).
        let now_s = reflector_proto::unix_now_ms() / 1000;
        self.grants
            .retain(|(_, h)| h.certificate.expires_unix_s.saturating_add(3600) > now_s);
        match self.grants.iter_mut().find(|(k, _)| *k == group) {
            Some((_, held)) if held.certificate.expires_unix_s > g.certificate.expires_unix_s => {}
            Some((_, held)) => *held = g,
            None => self.grants.push((group, g)),
        }
    }

    fn signing(&self, group: GroupKey) -> Option<&GrantSigning> {
        self.grants.iter().find(|(k, _)| *k == group).map(|(_, g)| g)
    }

    /// Remembers what `op` opened in `group`, and compares it with the
    /// other op's last snapshot of the group.
    fn remember(&mut self, group: GroupKey, op: CheckpointOp, o: Opened) -> Agreement {
        let other_op = match op {
            CheckpointOp::FetchOther => CheckpointOp::Fetch,
            _ => CheckpointOp::FetchOther,
        };
        let other = self
            .opened
            .iter()
            .find(|(g, p, _)| *g == group && *p == other_op)
            .map(|(_, _, o)| o);
        let agreement = compare(&o, other);
        self.opened.retain(|(g, p, _)| !(*g == group && *p == op));
        if self.opened.len() >= OPENED_KEPT {
            self.opened.remove(0);
        }
        self.opened.push((group, op, o));
        agreement
    }
}

/// The counter a refusal goes to.
fn count(stats: &mut crate::Stats, r: CheckpointRefusal) {
    use CheckpointRefusal as R;
    let c = match r {
        R::Malformed => &mut stats.checkpoint_malformed,
        R::Version => &mut stats.checkpoint_version,
        R::WrongCell => &mut stats.checkpoint_wrong_cell,
        R::Mismatch => &mut stats.checkpoint_mismatch,
        R::BadCertificate => &mut stats.checkpoint_bad_certificate,
        R::ExpiredCertificate => &mut stats.checkpoint_expired_certificate,
        R::BadSignature => &mut stats.checkpoint_bad_signature,
        R::NoKey => &mut stats.checkpoint_no_key,
        R::Bad => &mut stats.checkpoint_bad,
    };
    *c += 1;
}

/// A refusal as the fetch's failure: its own variant, naming the check
/// (and so its counter), never folded into another failure.
fn refused(addr: SocketAddr, refusal: CheckpointRefusal) -> CheckpointError {
    CheckpointError::JoinerRefused { addr, refusal }
}

impl<D: crate::Driver> crate::Client<D> {
    /// This client instance's checkpoint signing key (Ed25519, public
    /// half): the client sends it as `sign_key` on every `/join` it makes;
    /// a game whose backend fetches tokens sends it there (on its first
    /// `/join` too: a client made with [`crate::TokenSource::Later`] has
    /// its key before any token), and hands the answer's `control_public`
    /// and `certificate` in with [`Self::set_checkpoint_certificate`].
    pub fn checkpoint_signing_key(&self) -> [u8; PUBLIC_KEY_LEN] {
        self.sealing.checkpoints.public_key()
    }

    /// Hands in the checkpoint certificate of `group`'s grant (a game that
    /// gets its tokens some other way than from the control server's
    /// `/join`): `control_public` and `certificate` as the grant carries
    /// them, `expires_unix_s` the grant's (its token's) expiry, which the
    /// certificate signs. Needed to upload and to check checkpoints in a
    /// sealed group; hand in a new one with each renewed token (the one
    /// expiring last is used). Refused when no group `group` is held
    /// ([`Error::NoSuchGroup`]), and when epoch keys are held for the group
    /// and the certificate does not verify under `control_public` for
    /// their world, this client's signing key, the group's player and
    /// `expires_unix_s` ([`Error::BadCertificate`]: a `/join` asked with
    /// another `sign_key`, another grant's expiry, or bytes mixed up).
    /// Hand the keys in first ([`Self::set_epoch_keys`]) so that it is
    /// checked here rather than refused by every joiner.
    pub fn set_checkpoint_certificate(
        &mut self,
        group: u16,
        control_public: [u8; PUBLIC_KEY_LEN],
        certificate: [u8; SIGNATURE_LEN],
        expires_unix_s: u64,
    ) -> Result<(), Error> {
        let groups: Vec<(GroupKey, u32)> = self
            .memberships
            .iter()
            .filter(|m| m.live() && m.key().1 == group)
            .map(|m| (m.key(), m.session.request().player))
            .collect();
        if groups.is_empty() {
            return Err(Error::NoSuchGroup { group });
        }
        let public_key = self.sealing.checkpoints.public_key();
        let held: Vec<(GroupKey, GrantSigning)> = groups
            .into_iter()
            .map(|(g, player)| {
                let certificate = Certificate {
                    player,
                    public_key,
                    expires_unix_s,
                    signature: certificate,
                };
                (
                    g,
                    GrantSigning {
                        control_public,
                        certificate,
                    },
                )
            })
            .collect();
        // Every group checked before any is changed.
        for (g, signing) in &held {
            // A group's cells are of one world: the cell id's first bytes.
            let world = self.sealing.group_keys(*g).first().map(|k| {
                let c = k.cell().0;
                WorldId([c[0], c[1], c[2], c[3]])
            });
            if let Some(world) = world {
                if !verify_certificate(&control_public, world, &signing.certificate) {
                    return Err(Error::BadCertificate {
                        group,
                        player: signing.certificate.player,
                        expires_unix_s,
                    });
                }
            }
        }
        for (g, signing) in held {
            self.sealing.checkpoints.hold(g, signing);
        }
        Ok(())
    }

    /// Takes the certificates the token request thread received, for the
    /// groups their grants name.
    pub(crate) fn take_certificates(&mut self) {
        let got: Vec<(String, u16, GrantSigning)> = {
            let mut sink = self
                .sealing
                .checkpoints
                .sink
                .lock()
                // Poisoned only by a panic while pushing: still a list.
                .unwrap_or_else(|e| e.into_inner());
            if sink.is_empty() {
                return;
            }
            std::mem::take(&mut *sink)
        };
        let Ok(local) = self.sock.local_addr() else { return };
        for (reflector, group, g) in got {
            // The grant's name resolves as its token's did (take_token).
            if let Ok(addr) = crate::resolve(&reflector, local) {
                self.sealing.checkpoints.hold((addr, group), g);
            }
        }
    }

    /// The envelope an upload to membership `i`'s sealed group sends for
    /// `state` at `tick` (docs/protocol.md, "Sealed checkpoints"): under
    /// the newest epoch key held for the group's first cell, signed with
    /// the grant's certificate, its sequence one value of the client-wide
    /// counter. Refused (nothing sent, never the state in clear) without a
    /// key or a certificate.
    pub(crate) fn seal_upload(
        &mut self,
        i: usize,
        addr: SocketAddr,
        tick: u64,
        state: &[u8],
    ) -> Result<Vec<u8>, CheckpointError> {
        let group = self.memberships[i].key();
        let epoch_key = self.sealing.checkpoint_key(group).ok_or(CheckpointError::Mismatch {
            addr,
            what: "sealed group without an epoch key for its cells: the checkpoint is not uploaded (never in clear)",
        })?;
        let signing = *self.sealing.checkpoints.signing(group).ok_or(CheckpointError::Mismatch {
            addr,
            what: "sealed group without a checkpoint certificate (the grant had none: a control server with a sealing secret, asked with sign_key, gives one): the checkpoint is not uploaded (never in clear)",
        })?;
        // One value of the client-wide counter, used by no datagram: the
        // memberships' own counters go on past it.
        let sequence = self
            .memberships
            .iter()
            .map(|m| m.session.next_seq())
            .fold(self.next_seq, u64::max);
        self.next_seq = sequence + 1;
        for m in self.memberships.iter_mut() {
            m.session.advance_seq(self.next_seq);
        }
        let info = UploadInfo {
            tick,
            instance: self.instance,
            sequence,
        };
        seal_checkpoint(
            &self.sealing.checkpoints.key,
            &signing.certificate,
            &epoch_key,
            info,
            state,
        )
        .map_err(|e| CheckpointError::Mismatch {
            addr,
            what: match e {
                SealCheckpointError::NotOurCertificate => {
                    "the checkpoint certificate held is not for this client's signing key"
                }
                SealCheckpointError::ZeroSequence => "sequence 0 is never used",
                SealCheckpointError::TooLarge(_) => "the state is too large to seal",
            },
        })
    }

    /// A joiner's checks on what a fetch brought from `group`, a sealed
    /// group (`reply`: what the REPLY said, and when it arrived): the opened state and how far it is trusted, or the refusal
    /// (counted; nothing of the state is kept).
    pub(crate) fn open_fetched(
        &mut self,
        group: GroupKey,
        addr: SocketAddr,
        op: CheckpointOp,
        reply: &FetchedReply,
        mut envelope: Vec<u8>,
    ) -> Result<(Vec<u8>, Verification), CheckpointError> {
        let Some(signing) = self.sealing.checkpoints.signing(group).copied() else {
            return Err(CheckpointError::Mismatch {
                addr,
                what: "sealed group without control_public from its grant: a checkpoint cannot be checked, so it is not taken",
            });
        };
        let keys = self.sealing.group_keys(group);
        let view = JoinerView {
            control_public: &signing.control_public,
            group_keys: &keys,
        };
        match open_checkpoint(&mut envelope, reply, &view) {
            Ok(o) => {
                let state = envelope[o.state.clone()].to_vec();
                let verification = match self.sealing.checkpoints.remember(group, op, o) {
                    Agreement::SignedByOne { player, .. } => Verification::SignedByOne { player },
                    Agreement::VerifiedByTwo { players, .. } => Verification::VerifiedByTwo { players },
                    Agreement::Disagree { players, .. } => Verification::Disagree { players },
                };
                Ok((state, verification))
            }
            Err(r) => {
                count(&mut self.stats, r);
                Err(refused(addr, r))
            }
        }
    }
}

/// What sealing adds to a state: the envelope's fixed overhead.
pub(crate) const OVERHEAD: usize = ENVELOPE_OVERHEAD;
