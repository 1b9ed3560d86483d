//! What a sealed checkpoint costs, against what the channel already does to
//! every state (the anchor, measured in the same run): SHA-256 of the state
//! (the reflector hashes each upload once, a fetcher checks the digest) vs
//! making the envelope (AES-256-GCM, one copy, Ed25519 signature) and
//! a joiner's checks (two Ed25519 verifications, the AEAD open, SHA-256 of
//! the opened state). A micro-benchmark of the pure code on one core, not a
//! test:
//!
//! `cargo run --release -p reflector-proto --example checkpoint_cost`
//!
//! Prints one CSV line per (state size, operation): the median over
//! interleaved rounds of the mean microseconds per state, and the ratio to
//! the anchor of the same round.

mod common;
use common::median;
use reflector_proto::checkpoint::digest;
use reflector_proto::sealed::checkpoint::{
    open_checkpoint, seal_checkpoint, ControlSigner, FetchedReply, JoinerView, PlayerKey, UploadInfo,
};
use reflector_proto::sealed::{CellId, MasterSecret, WorldId};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 7;

fn main() {
    let master = MasterSecret::new(&[9; 32]).expect("32 bytes");
    let world = WorldId::from_name("bench");
    let control = ControlSigner::derive(&master, world);
    let epoch_key = master.epoch_key(CellId::new(world, 3, 1).expect("in range"), 1);
    let player = PlayerKey::from_seed(&[5; 32]);
    let expires = 4_000_000_000;
    let cert = control.certify(1001, &player.public_key(), expires);
    let public = control.public_key();
    let keys = [epoch_key.clone()];
    let view = JoinerView {
        control_public: &public,
        group_keys: &keys,
    };
    println!("# method: {ROUNDS} interleaved rounds per size, one thread, release build; median of the rounds' mean");
    println!("# us per state; anchor = SHA-256 of the state; ratio = operation / anchor of the same round");
    println!("state_bytes,operation,anchor_us,op_us,ratio");
    let mut seq = 0u64;
    for (size, per_round) in [(4usize << 10, 400u32), (1 << 20, 8), (8 << 20, 2)] {
        let state = vec![0x42u8; size];
        let (mut anchor, mut seal, mut open) = (vec![], vec![], vec![]);
        let (mut seal_ratio, mut open_ratio) = (vec![], vec![]);
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..per_round {
                black_box(digest(black_box(&state)));
            }
            let a = t.elapsed().as_secs_f64() * 1e6 / f64::from(per_round);
            let t = Instant::now();
            let mut env = Vec::new();
            for _ in 0..per_round {
                seq += 1;
                let info = UploadInfo {
                    tick: seq,
                    instance: 7,
                    sequence: seq,
                };
                env = seal_checkpoint(&player, &cert, &epoch_key, info, black_box(&state)).expect("seals");
            }
            let s = t.elapsed().as_secs_f64() * 1e6 / f64::from(per_round);
            let reply = FetchedReply {
                tick: seq,
                from_player: 1001,
                age_ms: 0,
                received_unix_ms: 1_000,
            };
            // Opening is in place: a fresh copy per iteration, made outside the timing.
            let mut copies: Vec<Vec<u8>> = (0..per_round).map(|_| env.clone()).collect();
            let t = Instant::now();
            for c in copies.iter_mut() {
                black_box(open_checkpoint(c, &reply, &view).expect("opens"));
            }
            let o = t.elapsed().as_secs_f64() * 1e6 / f64::from(per_round);
            anchor.push(a);
            seal.push(s);
            open.push(o);
            seal_ratio.push(s / a);
            open_ratio.push(o / a);
        }
        let a = median(&mut anchor);
        println!(
            "{size},seal,{a:.1},{:.1},{:.2}",
            median(&mut seal),
            median(&mut seal_ratio)
        );
        println!(
            "{size},open,{a:.1},{:.1},{:.2}",
            median(&mut open),
            median(&mut open_ratio)
        );
    }
}
