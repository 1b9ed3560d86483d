//! What sealing costs a client per datagram, against the clear DATA it
//! replaces (the anchor, measured in the same run): building a DATA with its
//! SipHash tag vs sealing it (AES-256-GCM) and then tagging it; and on
//! receipt, reading a clear DATA's payload vs the receiver's steps and the
//! AEAD open. A micro-benchmark of the pure code on one core, not a test:
//!
//! `cargo run --release -p reflector-proto --example sealed_cost`
//!
//! Prints one CSV line per (size, operation): the median over interleaved
//! rounds of the mean nanoseconds per datagram, and the ratio to the clear
//! anchor of the same round.

mod common;
use common::{header, median};
use reflector_proto::protocol::{emit_in_place, Packet, SessionKeys, INSTANCE_LEN};
use reflector_proto::sealed::{field, CellId, MasterSecret, Receiver, WorldId, SEALED_MIN};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 9;
const PER_ROUND: u64 = 20_000;

fn main() {
    let tag_keys = SessionKeys::from_session([7; 32]);
    let cell = CellId::new(WorldId::from_name("bench"), 3, 1).expect("in range");
    let epoch_key = MasterSecret::new(&[9; 32]).expect("32 bytes").epoch_key(cell, 1);
    println!(
        "# method: {ROUNDS} interleaved rounds of {PER_ROUND} datagrams per operation, one thread, release build;"
    );
    println!("# median of the rounds' mean ns per datagram; ratio = sealed / clear of the same round");
    println!("game_bytes,operation,clear_ns,sealed_ns,ratio");
    for game in [100usize, 1000] {
        let payload = vec![0x42u8; game];
        let mut send_ratio = Vec::new();
        let mut recv_ratio = Vec::new();
        let (mut send_clear, mut send_sealed, mut recv_clear, mut recv_sealed) = (vec![], vec![], vec![], vec![]);
        let mut seq = 0u64;
        let mut sender = epoch_key.sender_key(1001, 0x1c2d);
        for _ in 0..ROUNDS {
            // Send, clear: instance id and game data written, header and tag.
            let mut buf = vec![0u8; 1472];
            let t = Instant::now();
            for _ in 0..PER_ROUND {
                seq += 1;
                buf[32..40].copy_from_slice(&0x1c2du64.to_be_bytes());
                buf[40..40 + game].copy_from_slice(&payload);
                let len = 32 + INSTANCE_LEN + game;
                black_box(emit_in_place(&header(seq), len, Some(&tag_keys), &mut buf).expect("a DATA"));
            }
            let clear = t.elapsed().as_nanos() as f64 / PER_ROUND as f64;
            let clear_copy = buf[..32 + INSTANCE_LEN + game].to_vec();
            // Send, sealed: game data written, sealed in place, tagged.
            let t = Instant::now();
            for _ in 0..PER_ROUND {
                seq += 1;
                buf[field::CIPHERTEXT..field::CIPHERTEXT + game].copy_from_slice(&payload);
                black_box(
                    sender
                        .seal(&header(seq), game, Some(&tag_keys), &mut buf)
                        .expect("seals"),
                );
            }
            let sealed = t.elapsed().as_nanos() as f64 / PER_ROUND as f64;
            send_clear.push(clear);
            send_sealed.push(sealed);
            send_ratio.push(sealed / clear);

            // Receive: a fresh sealed datagram per receipt (the window takes
            // each sequence once), prepared outside the timed loop.
            let n = SEALED_MIN + game;
            let mut received: Vec<Vec<u8>> = (0..PER_ROUND)
                .map(|_| {
                    seq += 1;
                    buf[field::CIPHERTEXT..field::CIPHERTEXT + game].copy_from_slice(&payload);
                    sender.seal(&header(seq), game, None, &mut buf).expect("seals");
                    buf[..n].to_vec()
                })
                .collect();
            let mut receiver = Receiver::new(64);
            receiver.add_epoch_key(epoch_key.clone());
            let t = Instant::now();
            for _ in 0..PER_ROUND {
                // The clear anchor: parse the header and take the payload.
                let p = Packet::parse(black_box(&clear_copy[..])).expect("a DATA");
                black_box(p.payload().len());
            }
            let clear = t.elapsed().as_nanos() as f64 / PER_ROUND as f64;
            let t = Instant::now();
            for d in received.iter_mut() {
                black_box(Packet::parse(&d[..]).expect("a DATA").seq());
                black_box(receiver.receive(d).expect("opens"));
            }
            let sealed = t.elapsed().as_nanos() as f64 / PER_ROUND as f64;
            recv_clear.push(clear);
            recv_sealed.push(sealed);
            recv_ratio.push(sealed / clear);
        }
        println!(
            "{game},send,{:.0},{:.0},{:.2}",
            median(&mut send_clear),
            median(&mut send_sealed),
            median(&mut send_ratio)
        );
        println!(
            "{game},receive,{:.0},{:.0},{:.2}",
            median(&mut recv_clear),
            median(&mut recv_sealed),
            median(&mut recv_ratio)
        );
    }
}
