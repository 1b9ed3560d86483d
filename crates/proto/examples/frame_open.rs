//! Where a sealed receive's extra cost goes inside a game frame: a game
//! loop that sleeps a frame and then takes everything waiting, as
//! `sealed-bench`'s receiver does, with each datagram's receive and
//! processing timed by its position in the frame.
//!
//! A helper thread seals (or writes clear) `PER_FRAME` (20, or the third argument) DATA and sends them
//! to a loopback UDP socket at the start of each frame; the measuring
//! thread sleeps the frame, then, per datagram, `recv_from` and the
//! client's pure work on it:
//!
//! - `clear`: parse the header, read the instance id, copy the game data
//!   out (what the client does with a clear DATA);
//! - `sealed`: parse the header, `Receiver::receive` (every receiving step,
//!   the AEAD open in place), copy the game data out;
//! - `sealed-warm`: `sealed` after one throwaway open of another sender's
//!   datagram at the frame's start (its time counted in the frame);
//! - `clear-batch`, `sealed-batch`: every datagram of the frame received
//!   first, then all processed (no system call between two opens).
//!
//! The modes take turns frame by frame, so a busy machine slows each alike:
//! compare within a run (positions of one mode, modes of one run), not
//! absolute times across runs. A developer tool, not a test:
//!
//! `cargo run --release -p reflector-proto --example frame_open [-- FRAMES [SLEEP_US,... [PER_FRAME]]]`
//!
//! prints per (size, frame sleep, mode) the median ns of a datagram's
//! processing at position 0, 1, 2..3 and 4.. of its frame, of its
//! `recv_from`, and of the whole frame per datagram.
//!
//! What it showed on a 2-core AMD EPYC (Zen 3) VM, 20 datagrams a frame:
//! after a 2 or 4 ms sleep the frame's first sealed datagram takes 4 to 8
//! µs against 0.7 to 1.7 µs clear (caches cold after the sleep), while from
//! the fifth on a sealed datagram costs what it costs with no sleep (the
//! AEAD, about 300 ns at 100 B and 500 ns at 1,000 B more than clear). A
//! throwaway open at the frame's start (`sealed-warm`) makes the first
//! datagram cheaper by what the throwaway costs: the frame's total is
//! unchanged, so about two thirds of the cold start is the AEAD's code and
//! state, shared by every key, and the rest the sender's own entry and key.
//! Receiving the whole frame before opening (`*-batch`) saves a few per cent
//! of either mode's frame.

mod common;
use common::{header, median};
use reflector_proto::protocol::{emit_in_place, Header, Packet, INSTANCE_LEN, MAX_DATAGRAM_KERNEL};
use reflector_proto::sealed::{field, CellId, MasterSecret, Receiver, WorldId};
use std::hint::black_box;
use std::net::UdpSocket;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Datagrams per frame unless the third argument says otherwise.
const PER_FRAME: usize = 20;
const MODES: [&str; 5] = ["clear", "sealed", "sealed-warm", "clear-batch", "sealed-batch"];

/// What the helper thread is asked to send: `count` DATA of `game`
/// bytes, sealed or clear.
#[derive(Clone, Copy)]
struct Ask {
    sealed: bool,
    game: usize,
    count: usize,
}

/// The sending side, in its own thread (as the reflector is another
/// process): seals with the sender's key, sends to `to`.
fn sender_thread(asks: mpsc::Receiver<Ask>, done: mpsc::Sender<()>, to: std::net::SocketAddr) {
    let cell = CellId::new(WorldId::from_name("bench"), 3, 1).expect("in range");
    let epoch_key = MasterSecret::new(&[9; 32]).expect("32 bytes").epoch_key(cell, 1);
    let mut key = epoch_key.sender_key(1001, 0x1c2d);
    let sock = UdpSocket::bind("127.0.0.1:0").expect("a loopback socket");
    let mut buf = vec![0u8; MAX_DATAGRAM_KERNEL];
    let mut seq = 0u64;
    while let Ok(a) = asks.recv() {
        for _ in 0..a.count {
            seq += 1;
            let len = if a.sealed {
                buf[field::CIPHERTEXT..field::CIPHERTEXT + a.game].fill(0x42);
                key.seal(&header(seq), a.game, None, &mut buf).expect("seals")
            } else {
                buf[32..40].copy_from_slice(&0x1c2du64.to_be_bytes());
                buf[40..40 + a.game].fill(0x42);
                let len = 32 + INSTANCE_LEN + a.game;
                emit_in_place(&header(seq), len, None, &mut buf).expect("a DATA");
                len
            };
            sock.send_to(&buf[..len], to).expect("loopback send");
        }
        if done.send(()).is_err() {
            return;
        }
    }
}

/// The client's pure work on one received datagram: the game data's
/// length (copied to `out`).
fn process(sealed: bool, receiver: &mut Receiver, d: &mut [u8], out: &mut [u8]) -> usize {
    let p = Packet::parse(&d[..]).expect("a DATA");
    black_box((p.sender(), p.seq()));
    let range = if sealed {
        receiver.receive(d).expect("opens")
    } else {
        black_box(u64::from_be_bytes(d[32..40].try_into().expect("8 bytes")));
        40..d.len()
    };
    let n = range.len();
    out[..n].copy_from_slice(&d[range]);
    n
}

/// Per-position samples of one mode.
#[derive(Default)]
struct Samples {
    process: [Vec<f64>; 4],
    recv: [Vec<f64>; 2],
    frame_per_datagram: Vec<f64>,
}

fn bucket(pos: usize) -> usize {
    match pos {
        0 => 0,
        1 => 1,
        2 | 3 => 2,
        _ => 3,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let frames: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(300);
    let sleeps: Vec<u64> = args
        .get(1)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 1000, 4000]);
    let per_frame: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(PER_FRAME).max(1);
    let rx = UdpSocket::bind("127.0.0.1:0").expect("a loopback socket");
    rx.set_nonblocking(true).expect("non-blocking");
    let to = rx.local_addr().expect("bound");
    let (ask_tx, ask_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let helper = std::thread::spawn(move || sender_thread(ask_rx, done_tx, to));

    let cell = CellId::new(WorldId::from_name("bench"), 3, 1).expect("in range");
    let epoch_key = MasterSecret::new(&[9; 32]).expect("32 bytes").epoch_key(cell, 1);
    // The throwaway open: another sender's datagram, sealed once, copied
    // back before each use (an open decrypts in place).
    let mut dummy_key = epoch_key.sender_key(2002, 0x77);
    let mut dummy = vec![0u8; MAX_DATAGRAM_KERNEL];
    let mut bufs: Vec<Vec<u8>> = (0..per_frame).map(|_| vec![0u8; MAX_DATAGRAM_KERNEL]).collect();
    let mut lens = vec![0usize; per_frame];
    let mut out = vec![0u8; MAX_DATAGRAM_KERNEL];
    let mut dummy_copy = vec![0u8; MAX_DATAGRAM_KERNEL];

    println!("# method: {per_frame} DATA per frame sent by another thread over loopback; {frames} frames per mode, modes in turn frame by frame; median ns");
    println!("game_bytes,sleep_us,mode,proc_pos0,proc_pos1,proc_pos2_3,proc_pos4_plus,recv_pos0,recv_pos1_plus,frame_ns_per_datagram");
    for game in [100usize, 1000] {
        dummy[field::CIPHERTEXT..field::CIPHERTEXT + game].fill(0x24);
        let h = Header {
            sender: 2002,
            ..header(game as u64)
        };
        let dummy_len = dummy_key.seal(&h, game, None, &mut dummy).expect("seals");
        for &sleep_us in &sleeps {
            let mut receiver = Receiver::new(64);
            receiver.add_epoch_key(epoch_key.clone());
            let mut samples: Vec<Samples> = MODES.iter().map(|_| Samples::default()).collect();
            for frame in 0..frames * MODES.len() {
                let m = frame % MODES.len();
                let mode = MODES[m];
                let sealed = mode.starts_with("sealed");
                ask_tx
                    .send(Ask {
                        sealed,
                        game,
                        count: per_frame,
                    })
                    .expect("the helper runs");
                std::thread::sleep(Duration::from_micros(sleep_us));
                done_rx.recv().expect("the helper runs");
                let s = &mut samples[m];
                let t_frame = Instant::now();
                if mode == "sealed-warm" {
                    dummy_copy[..dummy_len].copy_from_slice(&dummy[..dummy_len]);
                    black_box(dummy_key.open(&mut dummy_copy[..dummy_len]).expect("opens"));
                }
                let mut got = 0;
                let batch = mode.ends_with("batch");
                // Bounded: the helper sent per_frame, all queued by now.
                for (pos, (buf, len)) in bufs.iter_mut().zip(lens.iter_mut()).enumerate() {
                    let t0 = Instant::now();
                    let n = match rx.recv_from(buf) {
                        Ok((n, _)) => n,
                        Err(e) => panic!("frame {frame}: datagram {pos} not there: {e}"),
                    };
                    s.recv[usize::from(pos > 0)].push(t0.elapsed().as_nanos() as f64);
                    *len = n;
                    if !batch {
                        let t1 = Instant::now();
                        got += process(sealed, &mut receiver, &mut buf[..n], &mut out);
                        s.process[bucket(pos)].push(t1.elapsed().as_nanos() as f64);
                    }
                }
                if batch {
                    for (pos, (buf, &n)) in bufs.iter_mut().zip(lens.iter()).enumerate() {
                        let t1 = Instant::now();
                        got += process(sealed, &mut receiver, &mut buf[..n], &mut out);
                        s.process[bucket(pos)].push(t1.elapsed().as_nanos() as f64);
                    }
                }
                s.frame_per_datagram
                    .push(t_frame.elapsed().as_nanos() as f64 / per_frame as f64);
                assert_eq!(got, game * per_frame);
            }
            for (m, s) in samples.iter_mut().enumerate() {
                let p: Vec<String> = s.process.iter_mut().map(|v| format!("{:.0}", median(v))).collect();
                println!(
                    "{game},{sleep_us},{},{},{:.0},{:.0},{:.0}",
                    MODES[m],
                    p.join(","),
                    median(&mut s.recv[0]),
                    median(&mut s.recv[1]),
                    median(&mut s.frame_per_datagram)
                );
            }
        }
    }
    drop(ask_tx);
    let _ = helper.join();
}
