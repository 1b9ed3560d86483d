use super::*;
use crate::sealed::{MasterSecret, WorldId};
use proptest::prelude::*;

const WORLD: &str = "checkpoint world";
const PLAYER_A: u32 = 7;
const PLAYER_B: u32 = 8;
const INSTANCE: u64 = 0x1111_2222_3333_4444;
const EXPIRES_S: u64 = 1_800_000_000;
/// The REPLY arrives 10 s before the certificate expires.
const RECEIVED_MS: u64 = EXPIRES_S * 1000 - 10_000;
const TICK: u64 = 900;
const STATE: &[u8] = b"the game's state at tick 900";

fn master() -> MasterSecret {
    MasterSecret::new(&[0x42; 32]).unwrap()
}

fn world() -> WorldId {
    WorldId::from_name(WORLD)
}

fn cell(column: u32, row: u32) -> CellId {
    CellId::new(world(), column, row).unwrap()
}

fn control() -> ControlSigner {
    ControlSigner::derive(&master(), world())
}

fn player(seed: u8) -> PlayerKey {
    PlayerKey::from_seed(&[seed; 32])
}

fn cert_of(p: u32, key: &PlayerKey) -> Certificate {
    control().certify(p, &key.public_key(), EXPIRES_S)
}

/// The group's keys: cells (1, 0) and (2, 0), epoch 10, and (1, 0)'s epoch 11.
fn group_keys() -> Vec<EpochKey> {
    let m = master();
    vec![
        m.epoch_key(cell(1, 0), 10),
        m.epoch_key(cell(2, 0), 10),
        m.epoch_key(cell(1, 0), 11),
    ]
}

fn info(sequence: u64) -> UploadInfo {
    UploadInfo {
        tick: TICK,
        instance: INSTANCE,
        sequence,
    }
}

/// Player A's envelope of STATE under cell (1, 0), epoch 10.
fn envelope() -> Vec<u8> {
    let a = player(1);
    seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &group_keys()[0], info(5), STATE).unwrap()
}

fn reply(player: u32) -> FetchedReply {
    FetchedReply {
        tick: TICK,
        from_player: player,
        age_ms: 2_000,
        received_unix_ms: RECEIVED_MS,
    }
}

fn open_with(env: &[u8], reply: &FetchedReply, keys: &[EpochKey]) -> Result<Opened, CheckpointRefusal> {
    let public = control().public_key();
    let mut buf = env.to_vec();
    open_checkpoint(
        &mut buf,
        reply,
        &JoinerView {
            control_public: &public,
            group_keys: keys,
        },
    )
}

fn open(env: &[u8]) -> Result<Opened, CheckpointRefusal> {
    open_with(env, &reply(PLAYER_A), &group_keys())
}

/// Re-signs an altered envelope with player A's key, so that the check
/// under test, not the signature, is what refuses it.
fn resigned(mut env: Vec<u8>) -> Vec<u8> {
    player(1).sign_envelope(&mut env);
    env
}

#[test]
fn every_control_server_of_a_world_derives_the_same_key_and_no_other_does() {
    assert_eq!(control().public_key(), control().public_key());
    assert_eq!(control().seed(), ControlSigner::derive(&master(), world()).seed());
    let other_world = ControlSigner::derive(&master(), WorldId::from_name("another world"));
    let other_master = ControlSigner::derive(&MasterSecret::new(&[0x43; 32]).unwrap(), world());
    assert_ne!(other_world.public_key(), control().public_key());
    assert_ne!(other_master.public_key(), control().public_key());
    assert!(!format!("{:?}", control()).contains(&hex::encode(control().seed())));
}

#[test]
fn a_certificate_verifies_only_for_its_fields_and_key() {
    let a = player(1);
    let c = cert_of(PLAYER_A, &a);
    let public = control().public_key();
    assert!(verify_certificate(&public, world(), &c));
    assert!(!verify_certificate(&public, WorldId::from_name("another world"), &c));
    for changed in [
        Certificate { player: PLAYER_B, ..c },
        Certificate {
            expires_unix_s: EXPIRES_S + 1,
            ..c
        },
        Certificate {
            public_key: player(2).public_key(),
            ..c
        },
    ] {
        assert!(!verify_certificate(&public, world(), &changed), "{changed:?}");
    }
    let other = ControlSigner::derive(&MasterSecret::new(&[0x43; 32]).unwrap(), world());
    assert!(!verify_certificate(&other.public_key(), world(), &c));
}

#[test]
fn an_envelope_opens_to_its_state_and_says_who_made_it() {
    let env = envelope();
    assert_eq!(env.len(), ENVELOPE_OVERHEAD + STATE.len());
    assert_eq!(ENVELOPE_OVERHEAD, 232);
    // The state is not in clear.
    assert!(!env.windows(STATE.len()).any(|w| w == STATE));
    let mut buf = env.clone();
    let public = control().public_key();
    let keys = group_keys();
    let o = open_checkpoint(
        &mut buf,
        &reply(PLAYER_A),
        &JoinerView {
            control_public: &public,
            group_keys: &keys,
        },
    )
    .unwrap();
    assert_eq!(&buf[o.state.clone()], STATE);
    assert_eq!(
        (o.player, o.instance, o.tick, o.cell, o.epoch),
        (PLAYER_A, INSTANCE, TICK, cell(1, 0), 10)
    );
    assert_eq!(o.digest, <[u8; 32]>::from(Sha256::digest(STATE)));
    // An empty state, under the next epoch's key (sealed inside the window).
    let b = player(2);
    let next = seal_checkpoint(&b, &cert_of(PLAYER_B, &b), &group_keys()[2], info(6), b"").unwrap();
    let o = open_with(&next, &reply(PLAYER_B), &group_keys()).unwrap();
    assert_eq!((o.state.len(), o.epoch, o.player), (0, 11, PLAYER_B));
}

#[test]
fn the_checkpoint_key_is_not_the_sender_key_of_the_same_inputs() {
    let k = &group_keys()[0];
    assert_ne!(
        checkpoint_key_bytes(k, PLAYER_A, INSTANCE),
        k.sender_key_bytes(PLAYER_A, INSTANCE)
    );
    assert_ne!(
        checkpoint_key_bytes(k, PLAYER_A, INSTANCE),
        checkpoint_key_bytes(k, PLAYER_A, INSTANCE + 1)
    );
}

#[test]
fn sealing_refuses_another_keys_certificate_and_sequence_zero() {
    let (a, b) = (player(1), player(2));
    assert_eq!(
        seal_checkpoint(&a, &cert_of(PLAYER_A, &b), &group_keys()[0], info(5), STATE),
        Err(SealCheckpointError::NotOurCertificate)
    );
    assert_eq!(
        seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &group_keys()[0], info(0), STATE),
        Err(SealCheckpointError::ZeroSequence)
    );
}

#[test]
fn malformed_and_other_versions_are_refused_first() {
    let env = envelope();
    assert_eq!(open(&env[..ENVELOPE_OVERHEAD - 1]), Err(CheckpointRefusal::Malformed));
    assert_eq!(open(b""), Err(CheckpointRefusal::Malformed));
    assert_eq!(open(STATE), Err(CheckpointRefusal::Malformed), "a clear state");
    let mut m = env.clone();
    m[0] ^= 1;
    assert_eq!(open(&m), Err(CheckpointRefusal::Malformed), "magic");
    let mut r = env.clone();
    r[field::RESERVED.start] = 1;
    assert_eq!(open(&resigned(r)), Err(CheckpointRefusal::Malformed), "reserved");
    // Version 1 (ChaCha20-Poly1305, withdrawn) or 3.
    for version in [1u8, 3] {
        let mut v = env.clone();
        v[field::VERSION] = version;
        assert_eq!(
            open(&resigned(v)),
            Err(CheckpointRefusal::Version),
            "envelope version {version}"
        );
    }
}

#[test]
fn another_groups_checkpoint_is_refused_at_the_cell() {
    // Player A also belongs to the group of cell (5, 5) and holds its key,
    // and signs a checkpoint of it: it is not this group's.
    let a = player(1);
    let elsewhere = master().epoch_key(cell(5, 5), 10);
    let env = seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &elsewhere, info(5), STATE).unwrap();
    assert_eq!(open(&env), Err(CheckpointRefusal::WrongCell));
    // Another world's cell (1, 0): same column and row, another world id.
    let other = MasterSecret::new(&[0x42; 32])
        .unwrap()
        .epoch_key(CellId::new(WorldId::from_name("another world"), 1, 0).unwrap(), 10);
    let env = seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &other, info(5), STATE).unwrap();
    assert_eq!(open(&env), Err(CheckpointRefusal::WrongCell));
    // It opens for a member of that group.
    let env = seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &elsewhere, info(5), STATE).unwrap();
    assert!(open_with(&env, &reply(PLAYER_A), &[elsewhere]).is_ok());
}

#[test]
fn the_replys_tick_and_uploader_must_be_the_envelopes() {
    let env = envelope();
    let r = reply(PLAYER_A);
    assert_eq!(
        open_with(&env, &FetchedReply { tick: TICK + 1, ..r }, &group_keys()),
        Err(CheckpointRefusal::Mismatch)
    );
    assert_eq!(
        open_with(&env, &reply(PLAYER_B), &group_keys()),
        Err(CheckpointRefusal::Mismatch)
    );
}

#[test]
fn a_certificate_of_another_control_key_or_for_another_player_is_refused() {
    let a = player(1);
    let foreign = ControlSigner::derive(&MasterSecret::new(&[0x43; 32]).unwrap(), world());
    let cert = foreign.certify(PLAYER_A, &a.public_key(), EXPIRES_S);
    let env = seal_checkpoint(&a, &cert, &group_keys()[0], info(5), STATE).unwrap();
    assert_eq!(open(&env), Err(CheckpointRefusal::BadCertificate));
    // Player B's certificate used by A's key for A's player id.
    let b = player(2);
    let mut env = envelope();
    env[field::CERTIFICATE].copy_from_slice(&cert_of(PLAYER_B, &b).signature);
    assert_eq!(open(&resigned(env)), Err(CheckpointRefusal::BadCertificate));
}

#[test]
fn a_certificate_must_be_valid_when_the_state_was_uploaded() {
    let env = envelope();
    let at = |received_unix_ms: u64, age_ms: u64| {
        open_with(
            &env,
            &FetchedReply {
                received_unix_ms,
                age_ms,
                ..reply(PLAYER_A)
            },
            &group_keys(),
        )
    };
    let expiry_ms = EXPIRES_S * 1000;
    assert!(at(expiry_ms - 1, 0).is_ok(), "a millisecond before expiry");
    assert_eq!(at(expiry_ms, 0), Err(CheckpointRefusal::ExpiredCertificate));
    // Fetched after expiry, uploaded before it: fine.
    assert!(at(expiry_ms + 4_000, 5_000).is_ok());
    assert_eq!(at(expiry_ms + 5_000, 5_000), Err(CheckpointRefusal::ExpiredCertificate));
}

#[test]
fn a_changed_byte_anywhere_fails_the_signature() {
    let env = envelope();
    let n = env.len();
    // The tick is checked against the REPLY first, the certificate's
    // fields against the control key; every other byte only the signature
    // protects before the AEAD.
    for i in [
        field::SEQUENCE.start,
        field::STATE,
        n - SIGNATURE_LEN - 1,
        n - SIGNATURE_LEN,
        n - 1,
    ] {
        let mut e = env.clone();
        e[i] ^= 0x01;
        assert_eq!(open(&e), Err(CheckpointRefusal::BadSignature), "byte {i}");
    }
}

#[test]
fn an_epoch_not_held_is_refused_before_the_aead() {
    let mut env = envelope();
    env[field::EPOCH].copy_from_slice(&12u32.to_be_bytes());
    assert_eq!(open(&resigned(env)), Err(CheckpointRefusal::NoKey));
    // A joiner holding only the next epoch's key cannot open the current.
    assert_eq!(
        open_with(&envelope(), &reply(PLAYER_A), &group_keys()[1..]),
        Err(CheckpointRefusal::NoKey)
    );
}

#[test]
fn a_garbage_state_signed_by_a_certified_player_is_refused_at_the_aead() {
    let mut env = envelope();
    let n = env.len();
    for b in &mut env[field::STATE..n - SIGNATURE_LEN] {
        *b = 0x5a;
    }
    assert_eq!(open(&resigned(env)), Err(CheckpointRefusal::Bad));
    // Sealed under a key that is not the group's epoch key.
    let a = player(1);
    let fake = EpochKey::from_bytes(cell(1, 0), 10, [9; 32]);
    let env = seal_checkpoint(&a, &cert_of(PLAYER_A, &a), &fake, info(5), STATE).unwrap();
    assert_eq!(open(&env), Err(CheckpointRefusal::Bad));
}

#[test]
fn the_first_failing_check_names_the_refusal() {
    // Another group's cell, a wrong tick and a broken signature: the cell.
    let mut env = envelope();
    env[field::CELL].copy_from_slice(&cell(5, 5).0);
    let n = env.len();
    env[n - 1] ^= 1;
    let wrong_tick = FetchedReply {
        tick: 1,
        ..reply(PLAYER_A)
    };
    assert_eq!(
        open_with(&env, &wrong_tick, &group_keys()),
        Err(CheckpointRefusal::WrongCell)
    );
    let names: std::collections::HashSet<_> = CheckpointRefusal::ALL.iter().map(|r| r.counter()).collect();
    assert_eq!(names.len(), CheckpointRefusal::ALL.len());
}

fn opened(player: u32, tick: u64, state: &[u8]) -> Opened {
    Opened {
        player,
        instance: INSTANCE,
        tick,
        cell: cell(1, 0),
        epoch: 10,
        state: 0..state.len(),
        digest: Sha256::digest(state).into(),
    }
}

#[test]
fn two_snapshots_agree_disagree_or_count_as_one() {
    let a = opened(PLAYER_A, TICK, STATE);
    assert_eq!(
        compare(&a, Some(&opened(PLAYER_B, TICK, STATE))),
        Agreement::VerifiedByTwo {
            tick: TICK,
            players: [PLAYER_A, PLAYER_B]
        }
    );
    assert_eq!(
        compare(&a, Some(&opened(PLAYER_B, TICK, b"another state"))),
        Agreement::Disagree {
            tick: TICK,
            players: [PLAYER_A, PLAYER_B]
        }
    );
    let one = Agreement::SignedByOne {
        tick: TICK,
        player: PLAYER_A,
    };
    assert_eq!(compare(&a, None), one);
    assert_eq!(compare(&a, Some(&opened(PLAYER_B, TICK - 1, STATE))), one, "other tick");
    assert_eq!(
        compare(&a, Some(&opened(PLAYER_A, TICK, STATE))),
        one,
        "the same uploader twice"
    );
}

#[test]
fn a_generated_key_signs_and_never_shows_in_debug() {
    let k = PlayerKey::generate().unwrap();
    assert_ne!(k.public_key(), PlayerKey::generate().unwrap().public_key());
    let c = cert_of(PLAYER_A, &k);
    let env = seal_checkpoint(&k, &c, &group_keys()[0], info(5), STATE).unwrap();
    let public = control().public_key();
    let keys = group_keys();
    let mut buf = env;
    assert!(open_checkpoint(
        &mut buf,
        &reply(PLAYER_A),
        &JoinerView {
            control_public: &public,
            group_keys: &keys
        }
    )
    .is_ok());
    assert!(format!("{k:?}").contains(&hex::encode(k.public_key())));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary bytes, with the group's keys and a REPLY that agrees with
    /// whatever header they have: refused, never a panic.
    #[test]
    fn arbitrary_bytes_are_refused_without_panicking(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let mut reply = reply(PLAYER_A);
        if data.len() >= field::STATE {
            reply.tick = be_u64(&data[field::TICK]);
            reply.from_player = be_u32(&data[field::PLAYER]);
        }
        prop_assert!(open_with(&data, &reply, &group_keys()).is_err());
    }

    /// Any one byte of a valid envelope changed: refused (by some check),
    /// never opened to another state.
    #[test]
    fn any_changed_byte_is_refused(at in any::<proptest::sample::Index>(), bit in 0u8..8) {
        let mut env = envelope();
        let i = at.index(env.len());
        env[i] ^= 1 << bit;
        prop_assert!(open(&env).is_err(), "byte {} bit {} changed and it opened", i, bit);
    }
}
