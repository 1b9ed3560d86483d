//! Round trips, zero-copy proofs, stream framing and bad input.

use bytes::Bytes;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use wire::{from_bytes, to_archive, to_archive_with, Buffer, Chunk, Error, ErrorKind, Limits};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Shape {
    Dot,
    Circle(f64),
    Rect { w: u32, h: u32 },
    Blob(Buffer),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Player {
    id: u64,
    name: String,
    pos: (f32, f32),
    shapes: Vec<Shape>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct State {
    tick: i64,
    players: Vec<Player>,
    tags: BTreeMap<String, Option<u16>>,
    snapshot: Buffer,
    #[serde(with = "serde_bytes")]
    plain: Vec<u8>,
    note: Option<String>,
    c: char,
    ok: bool,
}

fn state(snapshot: usize, plain: usize) -> State {
    State {
        tick: -42,
        players: vec![
            Player {
                id: 1,
                name: "ann".into(),
                pos: (1.5, -2.0),
                shapes: vec![Shape::Dot, Shape::Circle(3.0), Shape::Rect { w: 2, h: 9 }],
            },
            Player {
                id: u64::MAX,
                name: "bö".into(),
                pos: (0.0, 0.0),
                shapes: vec![Shape::Blob(Buffer::from(vec![7u8; 5000]))],
            },
        ],
        tags: [("a".to_string(), Some(1)), ("b".to_string(), None)]
            .into_iter()
            .collect(),
        snapshot: Buffer::from(vec![0xabu8; snapshot]),
        plain: vec![0xcd; plain],
        note: Some("x".repeat(3)),
        c: 'λ',
        ok: true,
    }
}

fn roundtrip(s: &State, threshold: u32) -> State {
    let a = to_archive_with(s, threshold).unwrap();
    let msg = Bytes::from(a.to_vec());
    from_bytes::<State>(&msg).unwrap()
}

#[test]
fn nested_values_round_trip_below_at_and_above_the_threshold() {
    for n in [0, 1, 4095, 4096, 4097, 70_000] {
        let s = state(n, n);
        assert_eq!(roundtrip(&s, 4096), s, "snapshot of {n} bytes");
    }
}

#[test]
fn buffers_at_the_threshold_are_referenced_not_copied() {
    let s = state(8192, 8192);
    let a = to_archive(&s).unwrap();
    let pointers: Vec<&Bytes> = a
        .chunks
        .iter()
        .filter_map(|c| match c {
            Chunk::Pointer(b) => Some(b),
            Chunk::Index(_) => None,
        })
        .collect();
    // The 5000-byte blob and the snapshot; not the plain Vec<u8>.
    assert_eq!(pointers.len(), 2);
    assert_eq!(
        pointers[1].as_ptr(),
        s.snapshot.bytes().as_ptr(),
        "the archive holds the caller's allocation"
    );
    // The plain field was copied into the index buffer, in one piece.
    assert!(a.index.windows(8192).any(|w| w.iter().all(|&b| b == 0xcd)));
    assert!(a.index.len() < 8192 + 1024);
    // Below the threshold: copied.
    let small = to_archive(&state(100, 0)).unwrap();
    assert_eq!(
        small.chunks.iter().filter(|c| matches!(c, Chunk::Pointer(_))).count(),
        1
    );
    // Decoded buffers point into the receive buffer.
    let msg = Bytes::from(a.to_vec());
    let back: State = from_bytes(&msg).unwrap();
    let range = msg.as_ptr() as usize..msg.as_ptr() as usize + msg.len();
    assert!(
        range.contains(&(back.snapshot.as_ptr() as usize)),
        "decoded Buffer is a slice of the message"
    );
    let blob = match &back.players[1].shapes[0] {
        Shape::Blob(b) => b,
        other => panic!("{other:?}"),
    };
    assert!(range.contains(&(blob.as_ptr() as usize)));
    // Borrowed decode: &str and &[u8] point into the message too.
    #[derive(Deserialize)]
    struct Borrowed<'a> {
        name: &'a str,
        #[serde(with = "serde_bytes")]
        raw: &'a [u8],
    }
    #[derive(Serialize)]
    struct Owned {
        name: String,
        #[serde(with = "serde_bytes")]
        raw: Vec<u8>,
    }
    let m = Bytes::from(
        to_archive(&Owned {
            name: "zero".into(),
            raw: vec![1, 2, 3],
        })
        .unwrap()
        .to_vec(),
    );
    let b: Borrowed<'_> = from_bytes(&m).unwrap();
    assert_eq!((b.name, b.raw), ("zero", &[1u8, 2, 3][..]));
    assert!(range_of(&m).contains(&(b.name.as_ptr() as usize)));
}

fn range_of(b: &Bytes) -> std::ops::Range<usize> {
    b.as_ptr() as usize..b.as_ptr() as usize + b.len()
}

/// A stream that moves at most `step` bytes per call, as a busy socket does.
struct Trickle<S> {
    inner: S,
    step: usize,
}

impl<S: Read> Read for Trickle<S> {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        let n = b.len().min(self.step);
        self.inner.read(&mut b[..n])
    }
}

impl<S: Write> Write for Trickle<S> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.inner.write(&b[..b.len().min(self.step)])
    }
    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        // Partial gathered writes: at most `step` bytes across the slices.
        let mut left = self.step;
        let mut cut = vec![];
        for b in bufs {
            if left == 0 {
                break;
            }
            let n = b.len().min(left);
            cut.push(std::io::IoSlice::new(&b[..n]));
            left -= n;
        }
        self.inner.write_vectored(&cut)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[test]
fn messages_cross_a_socket_pair_with_partial_reads_and_writes() {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let sent = vec![state(100_000, 10), state(0, 0), state(4096, 5000)];
    let expect = sent.clone();
    let writer = std::thread::spawn(move || {
        let mut w = Trickle { inner: a, step: 1000 };
        for s in &sent {
            to_archive(s).unwrap().write_to(&mut w).unwrap();
        }
    });
    let mut r = Trickle { inner: b, step: 777 };
    for want in expect {
        let msg = wire::read_message(&mut r, Limits::default()).unwrap();
        assert_eq!(from_bytes::<State>(&msg).unwrap(), want);
    }
    writer.join().unwrap();
}

fn message() -> Vec<u8> {
    to_archive(&state(5000, 10)).unwrap().to_vec()
}

fn decode(b: Vec<u8>) -> Result<State, ErrorKind> {
    let m = Bytes::from(b);
    from_bytes::<State>(&m).map_err(Error::into_kind)
}

#[test]
fn every_kind_of_bad_input_gets_its_error() {
    let good = message();
    assert!(decode(good.clone()).is_ok());
    assert!(matches!(
        decode(good[..10].to_vec()),
        Err(ErrorKind::Truncated { what: "header", .. })
    ));
    assert!(matches!(
        decode(good[..good.len() - 1].to_vec()),
        Err(ErrorKind::Truncated { what: "body", .. })
    ));
    let mut m = good.clone();
    m.push(0);
    assert!(matches!(decode(m), Err(ErrorKind::TrailingBytes(1))));
    let mut m = good.clone();
    m[0] = b'X';
    assert!(matches!(decode(m), Err(ErrorKind::BadMagic(_))));
    let mut m = good.clone();
    m[4] = 9;
    assert!(matches!(decode(m), Err(ErrorKind::BadVersion(9))));
    // Threshold 0, or a chunk under the threshold.
    let mut m = good.clone();
    m[8..12].copy_from_slice(&0u32.to_le_bytes());
    assert!(matches!(decode(m), Err(ErrorKind::Invalid(_))));
    let mut m = good.clone();
    m[8..12].copy_from_slice(&6000u32.to_le_bytes());
    assert!(matches!(decode(m), Err(ErrorKind::BadChunkTable(_))));
    // A chunk running past the body; chunks overlapping.
    let mut m = good.clone();
    m[24 + 8..24 + 16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(decode(m), Err(ErrorKind::BadChunkTable(_))));
    let mut m = good.clone();
    let first = m[24..32].to_vec();
    m[40..48].copy_from_slice(&first);
    assert!(matches!(decode(m), Err(ErrorKind::BadChunkTable(_))));
    // A chunk that no field's bytes start at.
    let mut m = good.clone();
    let off = u64::from_le_bytes(m[24..32].try_into().unwrap());
    m[24..32].copy_from_slice(&(off + 1).to_le_bytes());
    assert!(decode(m).is_err());
    // An absurd body length: refused by the limit, nothing allocated.
    let mut m = good.clone();
    m[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(decode(m.clone()), Err(ErrorKind::TooLarge { .. })));
    assert!(matches!(
        wire::read_message(&mut &m[..], Limits::default()).map_err(Error::into_kind),
        Err(ErrorKind::TooLarge { .. })
    ));
    // An absurd element count in the body.
    let a = to_archive(&vec![1u8, 2, 3]).unwrap().to_vec();
    let mut m = a.clone();
    m[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    let b = Bytes::from(m);
    assert!(matches!(
        from_bytes::<Vec<u8>>(&b).map_err(Error::into_kind),
        Err(ErrorKind::Invalid(_))
    ));
}

#[derive(Debug, Serialize, Deserialize)]
struct Nest(Option<Box<Nest>>);

#[test]
fn deep_nesting_is_refused() {
    let mut n = Nest(None);
    for _ in 0..200 {
        n = Nest(Some(Box::new(n)));
    }
    let m = Bytes::from(to_archive(&n).unwrap().to_vec());
    assert!(matches!(
        from_bytes::<Nest>(&m).map_err(Error::into_kind),
        Err(ErrorKind::TooDeep(128))
    ));
    let ok = wire::from_message::<Nest>(
        &m,
        Limits {
            max_depth: 256,
            ..Limits::default()
        },
    );
    assert!(ok.is_ok());
}

proptest! {
    #[test]
    fn arbitrary_values_round_trip(
        tick in any::<i64>(),
        names in proptest::collection::vec(".{0,40}", 0..6),
        snap in 0usize..9000,
        threshold in 1u32..10_000,
    ) {
        let mut s = state(snap, snap / 2);
        s.tick = tick;
        for (p, n) in s.players.iter_mut().zip(names) {
            p.name = n;
        }
        prop_assert_eq!(roundtrip(&s, threshold), s);
    }

    #[test]
    fn random_and_mutated_bytes_never_panic(
        noise in proptest::collection::vec(any::<u8>(), 0..300),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
    ) {
        let _ = decode(noise);
        let mut m = message();
        for (i, b) in flips {
            let n = m.len();
            m[i % n] ^= b;
        }
        let _ = decode(m);
    }
}
