//! The floor under a sealed receive: what the AEAD alone costs to open one
//! datagram's game data, against what the receiver's steps cost around it.
//! Per game-data size (100 B and 1,000 B), on datagrams sealed beforehand:
//!
//! - `aes`: ring's AES-256-GCM `open_in_place` alone, with the sealed
//!   format's 56 bytes of associated data (the floor: the format's AEAD,
//!   which this does not change);
//! - `chacha`: the same with ChaCha20-Poly1305 (for comparison only: the
//!   AEAD of the withdrawn sealed version 1, docs/protocol.md says why it
//!   went);
//! - `open`: `SenderKey::open` (the form read again, then the AEAD);
//! - `receive`: `Receiver::receive`, every receiving step (the one a
//!   client calls);
//! - `parse`: `Packet::parse` of a clear DATA (what a clear receive does
//!   in this library's pure code).
//!
//! A micro-benchmark of the pure code on one core, not a test:
//!
//! `cargo run --release -p reflector-proto --example open_floor`
//!
//! prints, per (size, operation), the median over interleaved rounds of the
//! mean ns per datagram. Instruction counts (the machine's shared CPUs make
//! time noisy; instructions are not): run one operation alone under
//! callgrind, counting only inside the measured loop, and divide by the
//! datagrams:
//!
//! `valgrind --tool=callgrind --toggle-collect='*open_floor::measured*'
//!  target/release/examples/open_floor --only receive 1000 20000`
//!
//! Under valgrind (3.19) the CPU shows no VAES/VPCLMULQDQ, so ring takes
//! its AES-NI + AVX code (`aeshwclmulmovbe`) rather than the VAES + AVX2
//! code a native run on such a CPU takes: callgrind's AEAD counts are of
//! that path. The counts outside the AEAD are the same either way.

mod common;
use common::{header, median};
use reflector_proto::protocol::{emit_in_place, Packet, INSTANCE_LEN};
use reflector_proto::sealed::{field, CellId, MasterSecret, Receiver, WorldId, SEALED_MIN};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, CHACHA20_POLY1305};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 9;
const PER_ROUND: usize = 20_000;
const BATCH: usize = 100;
const OPS: [&str; 5] = ["parse", "aes", "chacha", "open", "receive"];

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// Everything one operation needs, made outside the measured loop.
struct Fixture {
    chacha: LessSafeKey,
    aes: LessSafeKey,
    sender: reflector_proto::sealed::SenderKey,
    epoch_key: reflector_proto::sealed::EpochKey,
    seq: u64,
}

impl Fixture {
    fn new() -> Fixture {
        let cell = CellId::new(WorldId::from_name("bench"), 3, 1).expect("in range");
        let epoch_key = MasterSecret::new(&[9; 32]).expect("32 bytes").epoch_key(cell, 1);
        let raw = epoch_key.sender_key_bytes(1001, 0x1c2d);
        Fixture {
            chacha: LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &raw).expect("32 bytes")),
            aes: LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &raw).expect("32 bytes")),
            sender: epoch_key.sender_key(1001, 0x1c2d),
            epoch_key,
            seq: 0,
        }
    }

    /// `n` datagrams for `op` (a clear DATA for `parse`, a sealed DATA
    /// otherwise), each fresh (its own sequence).
    fn datagrams(&mut self, op: &str, game: usize, n: usize) -> Vec<Vec<u8>> {
        let payload = vec![0x42u8; game];
        let mut buf = vec![0u8; 1472];
        (0..n)
            .map(|_| {
                self.seq += 1;
                let h = header(self.seq);
                match op {
                    "parse" => {
                        buf[32..40].copy_from_slice(&0x1c2du64.to_be_bytes());
                        buf[40..40 + game].copy_from_slice(&payload);
                        let len = 32 + INSTANCE_LEN + game;
                        emit_in_place(&h, len, None, &mut buf).expect("a DATA");
                        buf[..len].to_vec()
                    }
                    _ => {
                        buf[field::CIPHERTEXT..field::CIPHERTEXT + game].copy_from_slice(&payload);
                        let len = self.sender.seal(&h, game, None, &mut buf).expect("seals");
                        assert_eq!(len, SEALED_MIN + game);
                        buf[..len].to_vec()
                    }
                }
            })
            .collect()
    }
}

/// The measured loop: `op` once per datagram. Its name is what callgrind's
/// `--toggle-collect` matches.
#[inline(never)]
fn measured(op: &str, f: &Fixture, receiver: &mut Receiver, ds: &mut [Vec<u8>]) {
    match op {
        "parse" => {
            for d in ds.iter() {
                let p = Packet::parse(black_box(&d[..])).expect("a DATA");
                black_box(p.payload().len());
            }
        }
        "chacha" | "aes" => {
            let key = if op == "chacha" { &f.chacha } else { &f.aes };
            for d in ds.iter_mut() {
                let mut ad = [0u8; field::CIPHERTEXT];
                ad.copy_from_slice(&d[..field::CIPHERTEXT]);
                let opened = key
                    .open_in_place(nonce(d_seq(d)), Aad::from(&ad), &mut d[field::CIPHERTEXT..])
                    .expect("opens");
                black_box(opened.len());
            }
        }
        "open" => {
            for d in ds.iter_mut() {
                black_box(f.sender.open(d).expect("opens"));
            }
        }
        _ => {
            for d in ds.iter_mut() {
                black_box(receiver.receive(d).expect("opens"));
            }
        }
    }
}

/// The raw AEAD datagrams keep their sequence in their last 8 bytes of
/// associated data, which is all they are for here.
fn d_seq(d: &[u8]) -> u64 {
    u64::from_be_bytes(d[field::CIPHERTEXT - 8..field::CIPHERTEXT].try_into().expect("8 bytes"))
}

fn prepare(f: &mut Fixture, op: &str, game: usize, n: usize) -> Vec<Vec<u8>> {
    if op != "chacha" && op != "aes" {
        return f.datagrams(op, game, n);
    }
    // Raw AEAD datagrams: the sequence written into the associated data's
    // last 8 bytes before sealing, so the loop reads its nonce from there.
    let key = if op == "chacha" { &f.chacha } else { &f.aes };
    let payload = vec![0x42u8; game];
    (0..n)
        .map(|_| {
            f.seq += 1;
            let mut d = vec![0x11u8; field::CIPHERTEXT];
            d[field::CIPHERTEXT - 8..].copy_from_slice(&f.seq.to_be_bytes());
            d.extend_from_slice(&payload);
            let ad: [u8; field::CIPHERTEXT] = d[..field::CIPHERTEXT].try_into().expect("56 bytes");
            let tag = key
                .seal_in_place_separate_tag(nonce(f.seq), Aad::from(&ad), &mut d[field::CIPHERTEXT..])
                .expect("seals");
            d.extend_from_slice(tag.as_ref());
            d
        })
        .collect()
}

fn receiver(f: &Fixture) -> Receiver {
    let mut r = Receiver::new(64);
    r.add_epoch_key(f.epoch_key.clone());
    r
}

fn usage() -> ! {
    eprintln!("usage: open_floor [--only OP SIZE COUNT]   (OP one of {OPS:?}; SIZE game bytes, 1..=1400)");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut f = Fixture::new();
    if let [flag, op, size, count] = &args[..] {
        if flag != "--only" || !OPS.contains(&op.as_str()) {
            usage();
        }
        let (Ok(game), Ok(n)) = (size.parse::<usize>(), count.parse::<usize>()) else {
            usage()
        };
        if game == 0 || game > reflector_proto::sealed::MAX_SEALED_GAME_DATA {
            usage();
        }
        let mut ds = prepare(&mut f, op, game, n);
        let mut r = receiver(&f);
        measured(op, &f, &mut r, &mut ds);
        println!("{op},{game},{n}");
        return;
    }
    if !args.is_empty() {
        usage();
    }
    println!(
        "# method: {ROUNDS} interleaved rounds of {PER_ROUND} datagrams per operation, one thread, release build;"
    );
    println!("# median of the rounds' mean ns per datagram (datagrams made before each timed batch of {BATCH})");
    println!("game_bytes,operation,ns_per_datagram");
    for game in [100usize, 1000] {
        let mut ns: Vec<Vec<f64>> = vec![Vec::new(); OPS.len()];
        for _ in 0..ROUNDS {
            for (k, op) in OPS.iter().enumerate() {
                // In batches small enough to stay in cache, as a datagram
                // just received is: only the batches are timed.
                let mut r = receiver(&f);
                let mut spent = std::time::Duration::ZERO;
                for _ in 0..PER_ROUND / BATCH {
                    let mut ds = prepare(&mut f, op, game, BATCH);
                    let t = Instant::now();
                    measured(op, &f, &mut r, &mut ds);
                    spent += t.elapsed();
                }
                ns[k].push(spent.as_nanos() as f64 / PER_ROUND as f64);
            }
        }
        for (k, op) in OPS.iter().enumerate() {
            println!("{game},{op},{:.0}", median(&mut ns[k]));
        }
    }
}
