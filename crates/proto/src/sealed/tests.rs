use super::*;
use crate::protocol::{Packet, FLAG_INSTANCE};
use proptest::prelude::*;
use std::collections::HashSet;

const GROUP: u16 = 40_000;
const INSTANCE_A: u64 = 0x1c2d_3e4f_5061_7283;
const INSTANCE_B: u64 = 0x9988_7766_5544_3322;

fn master() -> MasterSecret {
    MasterSecret::new(&[0x5a; 32]).expect("32 bytes")
}

fn cell() -> CellId {
    CellId::new(WorldId::from_name("test world"), 3, 1).expect("in range")
}

fn header(player: u32, membership: u32, seq: u64) -> Header {
    Header {
        kind: Kind::Data,
        group: GROUP,
        sender: player,
        membership,
        seq,
    }
}

fn session(byte: u8) -> SessionKeys {
    SessionKeys::from_session([byte; 32])
}

/// Seals `game` with `key` and returns the datagram.
fn sealed(key: &mut SenderKey, h: &Header, game: &[u8], tags: Option<&SessionKeys>) -> Vec<u8> {
    let mut buf = vec![0u8; MAX_DATAGRAM_KERNEL];
    buf[field::CIPHERTEXT..field::CIPHERTEXT + game.len()].copy_from_slice(game);
    let n = key.seal(h, game.len(), tags, &mut buf).expect("seals");
    buf.truncate(n);
    buf
}

fn opened(key: &SenderKey, datagram: &[u8]) -> Result<Vec<u8>, OpenError> {
    let mut d = datagram.to_vec();
    let r = key.open(&mut d)?;
    Ok(d[r].to_vec())
}

#[test]
fn a_sealed_datagram_opens_to_its_game_data_and_carries_its_fields() {
    let epoch_key = master().epoch_key(cell(), 7);
    let mut key = epoch_key.sender_key(1001, INSTANCE_A);
    let d = sealed(&mut key, &header(1001, 0x5eed, 9), b"position 1,2", None);
    assert_eq!(d.len(), SEALED_MIN + 12);
    assert_eq!(
        sealed_fields(&d),
        Ok(SealedFields {
            player: 1001,
            sequence: 9,
            instance: INSTANCE_A,
            epoch: 7,
            cell: cell(),
        })
    );
    // Encrypted: the game data is not in the datagram.
    assert!(!d.windows(12).any(|w| w == b"position 1,2"));
    // A receiver derives the same key from the epoch key alone.
    let theirs = epoch_key.sender_key(1001, INSTANCE_A);
    assert_eq!(opened(&theirs, &d).as_deref(), Ok(&b"position 1,2"[..]));
    assert_eq!(key.last_sealed(), 9);
}

#[test]
fn seal_then_tag_the_tag_verifies_and_a_stripped_copy_still_opens() {
    let keys = session(7);
    let mut key = master().epoch_key(cell(), 1).sender_key(1001, INSTANCE_A);
    let d = sealed(&mut key, &header(1001, 0x5eed, 1), b"hello", Some(&keys));
    let p = Packet::parse(&d[..]).expect("a DATA");
    assert!(
        keys.verify_tag(&p),
        "the reflector's check passes on the sealed datagram"
    );
    assert_ne!(&d[TAG], &[0u8; 8]);
    // What members receive: the tag zeroed.
    let mut stripped = d.clone();
    stripped[TAG].fill(0);
    assert_eq!(opened(&key, &stripped).as_deref(), Ok(&b"hello"[..]));
    assert_eq!(opened(&key, &d).as_deref(), Ok(&b"hello"[..]));
}

#[test]
fn every_altered_byte_outside_the_tag_field_fails_to_open() {
    let mut key = master().epoch_key(cell(), 1).sender_key(1001, INSTANCE_A);
    let d = sealed(&mut key, &header(1001, 0x5eed, 3), b"0123456789", None);
    for i in 0..d.len() {
        let mut bad = d.clone();
        bad[i] ^= 0x01;
        let r = opened(&key, &bad);
        if TAG.contains(&i) {
            assert!(r.is_ok(), "byte {i} is the DATA tag, outside the associated data");
        } else {
            assert!(r.is_err(), "flipping byte {i} went unnoticed");
        }
    }
    // Shortened or lengthened copies fail too.
    assert_eq!(opened(&key, &d[..d.len() - 1]), Err(OpenError::Malformed));
    let mut longer = d.clone();
    longer.push(0);
    assert_eq!(opened(&key, &longer), Err(OpenError::Malformed));
}

#[test]
fn a_key_of_another_cell_epoch_player_or_instance_does_not_open_it() {
    let m = master();
    let mut key = m.epoch_key(cell(), 1).sender_key(1001, INSTANCE_A);
    let d = sealed(&mut key, &header(1001, 0x5eed, 3), b"x", None);
    let other_cell = CellId::new(WorldId::from_name("test world"), 3, 2).expect("in range");
    let other_world = CellId::new(WorldId::from_name("another world"), 3, 1).expect("in range");
    for k in [
        m.epoch_key(other_cell, 1).sender_key(1001, INSTANCE_A),
        m.epoch_key(other_world, 1).sender_key(1001, INSTANCE_A),
        m.epoch_key(cell(), 2).sender_key(1001, INSTANCE_A),
        m.epoch_key(cell(), 1).sender_key(1002, INSTANCE_A),
        m.epoch_key(cell(), 1).sender_key(1001, INSTANCE_B),
        MasterSecret::new(&[0x5b; 32])
            .unwrap()
            .epoch_key(cell(), 1)
            .sender_key(1001, INSTANCE_A),
    ] {
        assert_eq!(opened(&k, &d), Err(OpenError::Bad), "{k:?}");
    }
}

#[test]
fn sealing_refuses_a_sequence_that_is_not_above_the_last() {
    let mut key = master().epoch_key(cell(), 1).sender_key(1001, INSTANCE_A);
    let mut buf = [0u8; 200];
    key.seal(&header(1001, 1, 5), 4, None, &mut buf).expect("first");
    for seq in [0, 4, 5] {
        assert_eq!(
            key.seal(&header(1001, 1, seq), 4, None, &mut buf),
            Err(SealError::SequenceNotAbove { seq, last: 5 })
        );
    }
    key.seal(&header(1001, 1, 6), 4, None, &mut buf).expect("above");
}

#[test]
fn sealing_refuses_what_does_not_fit_or_is_not_its_own() {
    let mut key = master().epoch_key(cell(), 1).sender_key(1001, INSTANCE_A);
    let mut buf = vec![0u8; 2000];
    assert_eq!(
        key.seal(&header(1001, 1, 1), MAX_SEALED_GAME_DATA + 1, None, &mut buf),
        Err(SealError::TooLarge(MAX_SEALED_GAME_DATA + 1))
    );
    assert_eq!(
        key.seal(&header(1002, 1, 1), 1, None, &mut buf),
        Err(SealError::WrongPlayer {
            header: 1002,
            key: 1001
        })
    );
    let mut keepalive = header(1001, 1, 1);
    keepalive.kind = Kind::Keepalive;
    assert!(matches!(
        key.seal(&keepalive, 1, None, &mut buf),
        Err(SealError::NotData(_))
    ));
    assert!(matches!(
        key.seal(&header(1001, 1, 1), 100, None, &mut buf[..150]),
        Err(SealError::Emit(EmitError::BufferTooSmall { need: 172, have: 150 }))
    ));
    // A refused seal does not use up the sequence.
    assert_eq!(key.last_sealed(), 0);
    // The largest fits the kernel path exactly.
    let n = key
        .seal(&header(1001, 1, 1), MAX_SEALED_GAME_DATA, None, &mut buf)
        .expect("fits");
    assert_eq!(
        (n, MAX_SEALED_GAME_DATA, SEALED_OVERHEAD),
        (MAX_DATAGRAM_KERNEL, 1400, 32)
    );
}

// ---------------------------------------------------------------------------
// The nonce scenarios of the document: every (sender key, nonce) pair a
// client seals under is new. Each scenario records the pairs it used.

#[derive(Default)]
struct Used {
    pairs: HashSet<([u8; KEY_LEN], u64)>,
    ciphertexts: HashSet<Vec<u8>>,
}

impl Used {
    fn record(&mut self, epoch_key: &EpochKey, d: &[u8]) {
        let f = sealed_fields(d).expect("sealed");
        let key = epoch_key.sender_key_bytes(f.player, f.instance);
        assert!(
            self.pairs.insert((key, f.sequence)),
            "a (key, nonce) pair repeated: {f:?}"
        );
        // Same game data every time: equal ciphertexts would mean a
        // repeated keystream.
        assert!(
            self.ciphertexts.insert(d[field::CIPHERTEXT..].to_vec()),
            "a ciphertext repeated"
        );
    }
}

/// A client: one instance id, one counter for everything it sends.
struct Client {
    player: u32,
    instance: u64,
    next_seq: u64,
}

impl Client {
    fn send(&mut self, key: &mut SenderKey, membership: u32, tags: &SessionKeys) -> Vec<u8> {
        let seq = self.next_seq;
        self.next_seq += 1;
        sealed(
            key,
            &header(self.player, membership, seq),
            b"same game data",
            Some(tags),
        )
    }
}

#[test]
fn nonce_scenario_a_new_token_in_the_same_epoch() {
    let ek = master().epoch_key(cell(), 1);
    let mut used = Used::default();
    let mut c = Client {
        player: 1001,
        instance: INSTANCE_A,
        next_seq: 1,
    };
    let mut key = ek.sender_key(c.player, c.instance);
    // First token: its own session keys and membership; a KEEPALIVE in
    // between takes a sequence too.
    for _ in 0..3 {
        used.record(&ek, &c.send(&mut key, 0x1111, &session(1)));
    }
    c.next_seq += 1;
    // The renewal or the new token: other session keys, another membership
    // id, the same instance and counter, so the same sender key goes on.
    for _ in 0..3 {
        used.record(&ek, &c.send(&mut key, 0x2222, &session(2)));
    }
    assert_eq!(used.pairs.len(), 6);
    // A client whose counter restarted with the token would repeat a nonce:
    // the key refuses.
    let mut buf = [0u8; 100];
    assert!(matches!(
        key.seal(&header(1001, 0x3333, 1), 1, Some(&session(3)), &mut buf),
        Err(SealError::SequenceNotAbove { seq: 1, last: 7 })
    ));
}

#[test]
fn nonce_scenario_a_client_restart() {
    let ek = master().epoch_key(cell(), 1);
    let mut used = Used::default();
    let mut before = Client {
        player: 1001,
        instance: INSTANCE_A,
        next_seq: 1,
    };
    let mut key = ek.sender_key(before.player, before.instance);
    for _ in 0..3 {
        used.record(&ek, &before.send(&mut key, 0x1111, &session(1)));
    }
    // Restarted: a new instance id, the counter from 1 again.
    let mut after = Client {
        player: 1001,
        instance: INSTANCE_B,
        next_seq: 1,
    };
    let mut key = ek.sender_key(after.player, after.instance);
    for _ in 0..3 {
        used.record(&ek, &after.send(&mut key, 0x2222, &session(2)));
    }
    assert_eq!(used.pairs.len(), 6);
}

#[test]
fn nonce_scenario_two_players_with_the_same_counter() {
    let ek = master().epoch_key(cell(), 1);
    let mut used = Used::default();
    // Even with the same instance id and sequences, the player separates them.
    for player in [1001, 1002] {
        let mut c = Client {
            player,
            instance: INSTANCE_A,
            next_seq: 1,
        };
        let mut key = ek.sender_key(c.player, c.instance);
        for _ in 0..3 {
            used.record(&ek, &c.send(&mut key, 0x1111, &session(1)));
        }
    }
    assert_eq!(used.pairs.len(), 6);
}

#[test]
fn nonce_scenario_a_reflector_restart() {
    let ek = master().epoch_key(cell(), 1);
    let mut used = Used::default();
    let mut c = Client {
        player: 1001,
        instance: INSTANCE_A,
        next_seq: 1,
    };
    let mut key = ek.sender_key(c.player, c.instance);
    for _ in 0..3 {
        used.record(&ek, &c.send(&mut key, 0x1111, &session(1)));
    }
    // The reflector restarted: the client joins again and gets a new random
    // membership id (which might even be the old one). Nothing of it is in
    // the key or the nonce; the client's counter goes on.
    for membership in [0x9999, 0x1111] {
        used.record(&ek, &c.send(&mut key, membership, &session(1)));
    }
    assert_eq!(used.pairs.len(), 5);
}

// ---------------------------------------------------------------------------
// The receiver.

fn receiver_with(keys: &[&EpochKey]) -> Receiver {
    let mut r = Receiver::new(16);
    for k in keys {
        r.add_epoch_key((*k).clone());
    }
    r
}

#[test]
fn a_receiver_opens_once_and_counts_each_refusal_at_its_step() {
    let m = master();
    let ek = m.epoch_key(cell(), 1);
    let mut r = receiver_with(&[&ek]);
    let mut key = ek.sender_key(1001, INSTANCE_A);
    let d = sealed(&mut key, &header(1001, 1, 10), b"abc", None);

    let mut copy = d.clone();
    let game = r.receive(&mut copy).expect("opens");
    assert_eq!(&copy[game], b"abc");
    // The same datagram again: a replay.
    assert_eq!(r.receive(&mut d.clone()), Err(OpenError::Replay));
    // An altered copy is refused and does not advance the window, so the
    // genuine datagram of that sequence still opens after it.
    let d11 = sealed(&mut key, &header(1001, 1, 11), b"abd", None);
    let mut bad = d11.clone();
    bad[field::CIPHERTEXT] ^= 0x80;
    assert_eq!(r.receive(&mut bad), Err(OpenError::Bad));
    assert!(
        r.receive(&mut d11.clone()).is_ok(),
        "a forged copy does not burn the sequence"
    );
    // Another epoch: no key.
    let mut other = m.epoch_key(cell(), 2).sender_key(1001, INSTANCE_A);
    assert_eq!(
        r.receive(&mut sealed(&mut other, &header(1001, 1, 12), b"x", None)),
        Err(OpenError::NoKey)
    );
    // Another sealed version: 1 (ChaCha20-Poly1305, withdrawn) or 3.
    let d13 = sealed(&mut key, &header(1001, 1, 13), b"x", None);
    for v in [1u8, 3] {
        let mut other = d13.clone();
        other[field::VERSION] = v;
        assert_eq!(r.receive(&mut other), Err(OpenError::Version), "sealed version {v}");
    }
    // A clear DATA (instance id only) is too short to be sealed.
    let mut clear = vec![0u8; 48];
    crate::protocol::emit_in_place(&header(1001, 1, 14), 48, None, &mut clear).expect("a DATA");
    assert_eq!(r.receive(&mut clear), Err(OpenError::Malformed));
    // A sequence 0 never opens.
    let mut zero = d.clone();
    zero[crate::protocol::field::SEQ].fill(0);
    assert_eq!(r.receive(&mut zero), Err(OpenError::Replay));

    assert_eq!(
        r.counters(),
        ReceiveCounters {
            opened: 2,
            malformed: 1,
            version: 2,
            no_key: 1,
            replay: 2,
            bad: 1,
            duplicate: 0,
        }
    );
    assert_eq!(FLAG_INSTANCE, 2, "sealed groups carry the instance id");
}

#[test]
fn the_window_is_per_player_and_instance_across_cells_and_epochs() {
    let m = master();
    let other_cell = CellId::new(WorldId::from_name("test world"), 4, 1).expect("in range");
    let (a1, a2, b1) = (
        m.epoch_key(cell(), 1),
        m.epoch_key(cell(), 2),
        m.epoch_key(other_cell, 1),
    );
    let mut r = receiver_with(&[&a1, &a2, &b1]);
    // One client, one counter, sending in two cells and across a rotation.
    let mut k_a1 = a1.sender_key(1001, INSTANCE_A);
    let mut k_a2 = a2.sender_key(1001, INSTANCE_A);
    let mut k_b1 = b1.sender_key(1001, INSTANCE_A);
    let d1 = sealed(&mut k_a1, &header(1001, 1, 1), b"1", None);
    let d2 = sealed(&mut k_b1, &header(1001, 2, 2), b"2", None);
    let d3 = sealed(&mut k_a2, &header(1001, 1, 3), b"3", None);
    // Arriving out of order is fine; each once.
    for d in [&d2, &d1, &d3] {
        assert!(r.receive(&mut d.clone()).is_ok());
    }
    for d in [&d1, &d2, &d3] {
        assert_eq!(r.receive(&mut d.clone()), Err(OpenError::Replay));
    }
    // The restarted client (new instance) has its own window from 1.
    let mut k_new = a1.sender_key(1001, INSTANCE_B);
    assert!(r
        .receive(&mut sealed(&mut k_new, &header(1001, 1, 1), b"1", None))
        .is_ok());
    // Another player with the same sequence too.
    let mut k_other = a1.sender_key(1002, INSTANCE_A);
    assert!(r
        .receive(&mut sealed(&mut k_other, &header(1002, 1, 1), b"1", None))
        .is_ok());
}

#[test]
fn a_dropped_epoch_key_opens_nothing_more() {
    let ek = master().epoch_key(cell(), 1);
    let mut r = receiver_with(&[&ek]);
    let mut key = ek.sender_key(1001, INSTANCE_A);
    assert!(r
        .receive(&mut sealed(&mut key, &header(1001, 1, 1), b"1", None))
        .is_ok());
    r.remove_epoch_key(cell(), 1);
    assert_eq!(
        r.receive(&mut sealed(&mut key, &header(1001, 1, 2), b"2", None)),
        Err(OpenError::NoKey)
    );
}

#[test]
fn the_least_recently_used_window_is_forgotten_and_its_replay_then_opens() {
    // The document's residual risk, shown: with room for two windows, a third
    // sender evicts the oldest, whose captured datagram then opens once more.
    let ek = master().epoch_key(cell(), 1);
    let mut r = Receiver::new(2);
    r.add_epoch_key(ek.clone());
    let captured = sealed(&mut ek.sender_key(1001, INSTANCE_A), &header(1001, 1, 1), b"a", None);
    assert!(r.receive(&mut captured.clone()).is_ok());
    for (player, seq) in [(1002, 1), (1003, 1)] {
        let d = sealed(
            &mut ek.sender_key(player, INSTANCE_A),
            &header(player, 1, seq),
            b"b",
            None,
        );
        assert!(r.receive(&mut d.clone()).is_ok());
    }
    assert!(
        r.receive(&mut captured.clone()).is_ok(),
        "the evicted window's replay opens"
    );
    assert_eq!(r.receive(&mut captured.clone()), Err(OpenError::Replay));
}

#[test]
fn a_copy_sealed_for_another_group_is_a_duplicate_and_a_replay_stays_a_replay() {
    // A sender in two groups of the receiver's area sends sequence 5 to
    // both, sealed once per group under that group's cell key.
    let m = master();
    let cell_id = |column| CellId::new(WorldId::from_name("test world"), column, 1).expect("in range");
    let (ka, kb, kc) = (
        m.epoch_key(cell(), 1),
        m.epoch_key(cell_id(4), 1),
        m.epoch_key(cell_id(5), 1),
    );
    let mut r = receiver_with(&[&ka, &kb, &kc]);
    let (mut sa, mut sb) = (ka.sender_key(1001, INSTANCE_A), kb.sender_key(1001, INSTANCE_A));
    let in_group = |group: u16, membership: u32, seq: u64| Header {
        group,
        ..header(1001, membership, seq)
    };
    let via_a = sealed(&mut sa, &in_group(GROUP, 1, 5), b"five", None);
    let via_b = sealed(&mut sb, &in_group(GROUP + 1, 2, 5), b"five", None);

    assert!(r.receive(&mut via_a.clone()).is_ok());
    assert_eq!(r.receive(&mut via_b.clone()), Err(OpenError::Duplicate));
    // Each copy again, byte for byte (the stripped tag field aside): replays.
    let mut a_again = via_a.clone();
    a_again[TAG].fill(0x77);
    assert_eq!(r.receive(&mut a_again), Err(OpenError::Replay));
    assert_eq!(r.receive(&mut via_b.clone()), Err(OpenError::Replay));
    // A forged "other copy" of that sequence does not open: bad, not a
    // duplicate, and no AEAD tag of it is remembered.
    let mut forged = sealed(
        &mut kb.sender_key(1001, INSTANCE_A),
        &in_group(GROUP + 2, 3, 5),
        b"five",
        None,
    );
    forged[field::CIPHERTEXT] ^= 1;
    assert_eq!(r.receive(&mut forged.clone()), Err(OpenError::Bad));
    assert_eq!(r.receive(&mut forged), Err(OpenError::Bad));
    // The duplicate did not burn a fresh sequence: 6 and 7 open, in any order.
    let d7 = sealed(&mut sa, &in_group(GROUP, 1, 7), b"seven", None);
    let d6 = sealed(&mut sb, &in_group(GROUP + 1, 2, 6), b"six", None);
    assert!(r.receive(&mut d7.clone()).is_ok());
    assert!(r.receive(&mut d6.clone()).is_ok());

    // Once the copies of sequence 5 are no longer remembered (8 more
    // opened since), another copy of it cannot be told from a replay.
    for seq in 8..8 + OPENED_REMEMBERED as u64 {
        assert!(r
            .receive(&mut sealed(&mut sa, &in_group(GROUP, 1, seq), b"n", None))
            .is_ok());
    }
    let via_c = sealed(
        &mut kc.sender_key(1001, INSTANCE_A),
        &in_group(GROUP + 3, 4, 5),
        b"five",
        None,
    );
    assert_eq!(r.receive(&mut via_c.clone()), Err(OpenError::Replay));
    let c = r.counters();
    assert_eq!(
        (c.opened, c.duplicate, c.replay, c.bad),
        (3 + OPENED_REMEMBERED as u64, 1, 3, 2)
    );
}

#[test]
fn forged_senders_leave_no_state_behind() {
    let ek = master().epoch_key(cell(), 1);
    let mut r = receiver_with(&[&ek]);
    let mut attacker = master().epoch_key(cell(), 1);
    attacker.key = [0; KEY_LEN];
    for instance in 1..=100u64 {
        let d = sealed(
            &mut attacker.sender_key(1001, instance),
            &header(1001, 1, 1),
            b"x",
            None,
        );
        assert_eq!(r.receive(&mut d.clone()), Err(OpenError::Bad));
    }
    assert_eq!((r.sender_keys(), r.senders.len()), (0, 0));
    assert_eq!(r.counters().bad, 100);
}

// ---------------------------------------------------------------------------
// Names, secrets and the schedule.

#[test]
fn cell_ids_are_world_column_row() {
    let w = WorldId::from_name("test world");
    let c = CellId::new(w, 0x0102, 0x0304).expect("in range");
    assert_eq!(&c.0[..4], &w.0);
    assert_eq!(&c.0[4..], &[1, 2, 3, 4]);
    assert_ne!(WorldId::from_name("test world"), WorldId::from_name("test worle"));
    assert_eq!(
        CellId::new(w, 65_536, 0),
        Err(CellOutOfRange { column: 65_536, row: 0 })
    );
    assert!(CellId::new(w, 0, 70_000).unwrap_err().to_string().contains("4,096"));
}

#[test]
fn bad_secrets_and_schedules_are_named() {
    assert_eq!(MasterSecret::new(&[1; 31]).unwrap_err(), KeyError::MasterTooShort(31));
    assert!(Schedule::new(0, 0).is_err());
    assert!(Schedule::new(600, 301).unwrap_err().to_string().contains("half"));
    assert!(Schedule::new(600, 300).is_ok());
    assert!(!format!("{:?}", master()).contains("5a"));
    assert!(!format!("{:?}", master().epoch_key(cell(), 1)).contains(&hex::encode(master().epoch_key(cell(), 1).key)));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_receiver_and_never_open(
        data in proptest::collection::vec(any::<u8>(), 0..200),
        make_it_data in any::<bool>(),
    ) {
        let mut data = data;
        if make_it_data && data.len() >= 24 {
            // Past the first check more often: a DATA with a length that agrees.
            data[3] = Kind::Data as u8;
            let n = (data.len() - 24) as u16;
            data[6..8].copy_from_slice(&n.to_be_bytes());
        }
        let mut r = Receiver::new(4);
        if let Ok(f) = sealed_fields(&data) {
            // Hold the very key the input names, so the AEAD is reached.
            r.add_epoch_key(master().epoch_key(f.cell, f.epoch));
        }
        let mut copy = data.clone();
        prop_assert!(r.receive(&mut copy).is_err());
        let c = r.counters();
        prop_assert_eq!(c.malformed + c.version + c.no_key + c.replay + c.bad + c.duplicate, 1);
    }

    #[test]
    fn epochs_start_in_order_with_jitter_below_its_bound(
        epoch in 0u32..u32::MAX,
        length in 1u64..100_000,
        jitter_frac in 0u64..=50,
        column in 0u32..4096,
        row in 0u32..4096,
    ) {
        let jitter_bound = length * jitter_frac / 100;
        let s = Schedule::new(length, jitter_bound).expect("valid");
        let m = master();
        let c = CellId::new(WorldId::from_name("w"), column, row).expect("in range");
        let j = m.jitter(c, epoch, jitter_bound);
        prop_assert!(j < jitter_bound.max(1));
        let (start, next) = (s.start(&m, c, epoch), s.start(&m, c, epoch + 1));
        prop_assert!(next > start);
        prop_assert!(next - start <= length + jitter_bound);
        // Every second of the epoch has it current, and the next is handed
        // out from the overlap before it starts.
        if epoch > 0 {
            for now in [start, start + (next - start) / 2, next - 1] {
                prop_assert_eq!(s.current_epoch(&m, c, now), epoch);
                let (current, handed_next) = s.handed_out(&m, c, now);
                prop_assert_eq!(current, epoch);
                prop_assert_eq!(handed_next.is_some(), now + OVERLAP_S >= next);
            }
        }
    }

    #[test]
    fn anything_sealed_opens_and_any_flip_outside_the_tag_is_caught(
        game in proptest::collection::vec(any::<u8>(), 0..=MAX_SEALED_GAME_DATA),
        seq in 1u64..u64::MAX,
        player in any::<u32>(),
        instance in any::<u64>(),
        membership in any::<u32>(),
        flip in any::<proptest::sample::Index>(),
        bit in 0u8..8,
    ) {
        let ek = master().epoch_key(cell(), 9);
        let mut key = ek.sender_key(player, instance);
        let d = sealed(&mut key, &header(player, membership, seq), &game, Some(&session(4)));
        prop_assert_eq!(d.len(), SEALED_MIN + game.len());
        prop_assert_eq!(opened(&key, &d), Ok(game));
        let i = flip.index(d.len());
        let mut bad = d.clone();
        bad[i] ^= 1 << bit;
        prop_assert_eq!(opened(&key, &bad).is_ok(), TAG.contains(&i));
    }
}

#[test]
fn sealing_is_a_group_policy_that_needs_the_instance_flag() {
    use crate::protocol::{FLAG_SEALED, FLAG_TAGS};
    assert_eq!(group_is_sealed(0), Ok(false));
    assert_eq!(group_is_sealed(FLAG_TAGS | FLAG_INSTANCE), Ok(false));
    assert_eq!(group_is_sealed(FLAG_INSTANCE | FLAG_SEALED), Ok(true));
    assert_eq!(group_is_sealed(0xff), Ok(true));
    let e = group_is_sealed(FLAG_TAGS | FLAG_SEALED).unwrap_err();
    assert_eq!(e, SealedWithoutInstance(5));
    assert!(e.to_string().contains("misconfigured"));
}

#[test]
fn a_keys_request_mac_binds_the_session_key_the_token_and_the_time() {
    let token = [7u8; crate::auth::TOKEN_LEN];
    let mac = keys_request_mac(&session(1), &token, 1_767_225_600);
    assert_ne!(mac, keys_request_mac(&session(2), &token, 1_767_225_600));
    assert_ne!(mac, keys_request_mac(&session(1), &[8u8; 32], 1_767_225_600));
    assert_ne!(mac, keys_request_mac(&session(1), &token, 1_767_225_601));
    assert_eq!(mac, keys_request_mac(&session(1), &token, 1_767_225_600));
    assert!(verify_keys_request_mac(&session(1), &token, 1_767_225_600, &mac));
    assert!(!verify_keys_request_mac(&session(2), &token, 1_767_225_600, &mac));
    assert!(!verify_keys_request_mac(&session(1), &token, 1_767_225_601, &mac));
    assert!(
        !verify_keys_request_mac(&session(1), &token, 1_767_225_600, &mac[..15]),
        "all 16 bytes"
    );
    let mut flipped = mac;
    flipped[15] ^= 1;
    assert!(!verify_keys_request_mac(&session(1), &token, 1_767_225_600, &flipped));
}

#[test]
fn the_next_epoch_is_handed_out_only_inside_the_overlap_window() {
    let (m, c) = (master(), cell());
    let s = Schedule::new(600, 60).expect("valid");
    let e: u32 = 2_945_830;
    let (start, next_start) = (s.start(&m, c, e), s.start(&m, c, e + 1));
    assert_eq!(s.current_epoch(&m, c, start), e, "current from its start");
    assert_eq!(s.current_epoch(&m, c, start - 1), e - 1, "not before");
    assert_eq!(s.current_epoch(&m, c, next_start - 1), e);
    assert_eq!(s.current_epoch(&m, c, next_start), e + 1);
    assert_eq!(s.handed_out(&m, c, start), (e, None));
    assert_eq!(
        s.handed_out(&m, c, next_start - OVERLAP_S - 1),
        (e, None),
        "one second early"
    );
    assert_eq!(
        s.handed_out(&m, c, next_start - OVERLAP_S),
        (e, Some(e + 1)),
        "the window opens"
    );
    assert_eq!(s.handed_out(&m, c, next_start - 1), (e, Some(e + 1)));
    assert_eq!(s.handed_out(&m, c, next_start).0, e + 1, "then it is current");
    // Before any epoch has started, epoch 0 is the one handed out.
    let no_jitter = Schedule::new(600, 0).expect("valid");
    assert_eq!(no_jitter.handed_out(&m, c, 0), (0, None));
    assert_eq!(no_jitter.handed_out(&m, c, 540), (0, Some(1)));
}
