//! wire against bincode, postcard, bitcode, rkyv and prost, in one run:
//!
//! 1. the cpp-serializers `Record` (1,000 int64 ids and 100 strings of 86
//!    characters): serialize and deserialize time and encoded size;
//! 2. a record with one buffer of 4 KiB to 16 MiB: serialize time (wire
//!    references the buffer, the others copy it), and serialize + send +
//!    receive + deserialize over a TCP socket pair on 127.0.0.1, against
//!    bincode with a plain write.
//!
//! Every time is the median of REPS batches; every figure is also given as a
//! ratio to bincode from the same run. CSV on stdout-named files.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

const REPS: usize = 9;

#[derive(Clone, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct Record {
    ids: Vec<i64>,
    strings: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RecordPb {
    #[prost(int64, repeated, tag = "1")]
    ids: Vec<i64>,
    #[prost(string, repeated, tag = "2")]
    strings: Vec<String>,
}

fn record() -> Record {
    Record {
        ids: (0..1000).map(|i| i * 1_000_000_007).collect(),
        strings: (0..100)
            .map(|i| format!("{i:03}").repeat(29)[..86].to_string())
            .collect(),
    }
}

/// Median seconds per call of `f`, over REPS batches of `n` calls.
fn time(n: usize, mut f: impl FnMut()) -> f64 {
    let mut v: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            t.elapsed().as_secs_f64() / n as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[REPS / 2]
}

struct Row {
    name: &'static str,
    ser: f64,
    de: f64,
    size: usize,
}

fn record_rows() -> Vec<Row> {
    let r = record();
    let n = 2000;
    let mut rows = vec![];
    let enc = bincode::serialize(&r).unwrap();
    rows.push(Row {
        name: "bincode",
        ser: time(n, || {
            std::hint::black_box(bincode::serialize(&r).unwrap());
        }),
        de: time(n, || {
            std::hint::black_box(bincode::deserialize::<Record>(&enc).unwrap());
        }),
        size: enc.len(),
    });
    for (name, threshold) in [("wire", wire::DEFAULT_THRESHOLD), ("wire (no pointer chunks)", u32::MAX)] {
        let msg = Bytes::from(wire::to_archive_with(&r, threshold).unwrap().to_vec());
        rows.push(Row {
            name,
            ser: time(n, || {
                std::hint::black_box(wire::to_archive_with(&r, threshold).unwrap());
            }),
            de: time(n, || {
                std::hint::black_box(wire::from_bytes::<Record>(&msg).unwrap());
            }),
            size: msg.len(),
        });
    }
    let enc = postcard::to_allocvec(&r).unwrap();
    rows.push(Row {
        name: "postcard",
        ser: time(n, || {
            std::hint::black_box(postcard::to_allocvec(&r).unwrap());
        }),
        de: time(n, || {
            std::hint::black_box(postcard::from_bytes::<Record>(&enc).unwrap());
        }),
        size: enc.len(),
    });
    let enc = bitcode::serialize(&r).unwrap();
    rows.push(Row {
        name: "bitcode (serde)",
        ser: time(n, || {
            std::hint::black_box(bitcode::serialize(&r).unwrap());
        }),
        de: time(n, || {
            std::hint::black_box(bitcode::deserialize::<Record>(&enc).unwrap());
        }),
        size: enc.len(),
    });
    let enc = rkyv::to_bytes::<rkyv::rancor::Error>(&r).unwrap();
    rows.push(Row {
        name: "rkyv",
        ser: time(n, || {
            std::hint::black_box(rkyv::to_bytes::<rkyv::rancor::Error>(&r).unwrap());
        }),
        de: time(n, || {
            std::hint::black_box(rkyv::from_bytes::<Record, rkyv::rancor::Error>(&enc).unwrap());
        }),
        size: enc.len(),
    });
    let pb = RecordPb {
        ids: r.ids.clone(),
        strings: r.strings.clone(),
    };
    let enc = prost::Message::encode_to_vec(&pb);
    rows.push(Row {
        name: "prost",
        ser: time(n, || {
            std::hint::black_box(prost::Message::encode_to_vec(&pb));
        }),
        de: time(n, || {
            std::hint::black_box(<RecordPb as prost::Message>::decode(&enc[..]).unwrap());
        }),
        size: enc.len(),
    });
    rows
}

#[derive(Serialize, Deserialize)]
struct WithBuffer {
    id: u64,
    data: wire::Buffer,
}

/// What bincode serializes: the buffer borrowed, so its only copy is the
/// serializer's own.
#[derive(Serialize)]
struct WithSlice<'a> {
    id: u64,
    #[serde(with = "serde_bytes")]
    data: &'a [u8],
}

#[derive(Serialize, Deserialize)]
struct WithVec {
    id: u64,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// A connected pair on 127.0.0.1.
fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    a.set_nodelay(true).unwrap();
    (a, b)
}

/// Seconds per message, serialize + send + receive + deserialize, both
/// ends in this process (the receiver on its own thread).
fn end_to_end(size: usize, use_wire: bool, n: usize) -> f64 {
    let (mut tx, rx) = pair();
    let data = vec![0x5au8; size];
    let buf = wire::Buffer::from(data.clone());
    let receiver = std::thread::spawn(move || {
        let mut rx = rx;
        for _ in 0..REPS * n {
            if use_wire {
                let msg = wire::read_message(&mut rx, wire::Limits::default()).unwrap();
                let v: WithBuffer = wire::from_bytes(&msg).unwrap();
                assert_eq!(v.data.len(), size);
            } else {
                let mut len = [0u8; 8];
                rx.read_exact(&mut len).unwrap();
                let mut b = vec![0u8; u64::from_le_bytes(len) as usize];
                rx.read_exact(&mut b).unwrap();
                let v: WithVec = bincode::deserialize(&b).unwrap();
                assert_eq!(v.data.len(), size);
            }
            // One byte back: the sender times whole round trips.
            rx.write_all(&[1]).unwrap();
        }
    });
    let t = time(n, || {
        if use_wire {
            let a = wire::to_archive(&WithBuffer { id: 1, data: buf.clone() }).unwrap();
            a.write_to(&mut tx).unwrap();
        } else {
            let b = bincode::serialize(&WithSlice { id: 1, data: &data }).unwrap();
            tx.write_all(&(b.len() as u64).to_le_bytes()).unwrap();
            tx.write_all(&b).unwrap();
        }
        let mut ack = [0u8; 1];
        tx.read_exact(&mut ack).unwrap();
    });
    receiver.join().unwrap();
    t
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "bench/results".into());
    let rows = record_rows();
    let base = rows.iter().find(|r| r.name == "bincode").map(|r| (r.ser, r.de, r.size)).unwrap();
    let mut csv = String::from("serializer,serialize_ns,deserialize_ns,size_bytes,serialize_x_bincode,deserialize_x_bincode,size_x_bincode\n");
    println!("Record (1,000 int64 + 100 strings of 86 chars), median of {REPS} batches; ratios to bincode:");
    for r in &rows {
        println!(
            "  {:<26} ser {:>8.0} ns ({:.2}x)  de {:>8.0} ns ({:.2}x)  size {:>6} B ({:.2}x)",
            r.name,
            r.ser * 1e9,
            r.ser / base.0,
            r.de * 1e9,
            r.de / base.1,
            r.size,
            r.size as f64 / base.2 as f64
        );
        csv += &format!(
            "{},{:.1},{:.1},{},{:.3},{:.3},{:.3}\n",
            r.name,
            r.ser * 1e9,
            r.de * 1e9,
            r.size,
            r.ser / base.0,
            r.de / base.1,
            r.size as f64 / base.2 as f64
        );
    }
    std::fs::write(format!("{out}/wire_record.csv"), csv).unwrap();
    let mut csv = String::from("buffer_bytes,wire_serialize_ns,bincode_serialize_ns,serialize_speedup,wire_e2e_us,bincode_e2e_us,e2e_x_bincode\n");
    println!("One buffer: serialize (wire references, bincode copies) and serialize+send+receive+deserialize over TCP:");
    for size in [4 << 10, 64 << 10, 1 << 20, 16 << 20] {
        let buf = wire::Buffer::from(vec![0x5au8; size]);
        let vec = vec![0x5au8; size];
        let n = (64 << 20) / size.max(1);
        let n = n.clamp(4, 2000);
        let w = time(n, || {
            std::hint::black_box(wire::to_archive(&WithBuffer { id: 1, data: buf.clone() }).unwrap());
        });
        let b = time(n, || {
            std::hint::black_box(bincode::serialize(&WithSlice { id: 1, data: &vec }).unwrap());
        });
        let m = n.clamp(4, 200);
        let we = end_to_end(size, true, m);
        let be = end_to_end(size, false, m);
        println!(
            "  {:>9} B: serialize wire {:>9.0} ns, bincode {:>11.0} ns ({:.0}x faster); end to end wire {:>8.1} us, bincode {:>8.1} us ({:.2}x)",
            size,
            w * 1e9,
            b * 1e9,
            b / w,
            we * 1e6,
            be * 1e6,
            we / be
        );
        csv += &format!(
            "{size},{:.1},{:.1},{:.1},{:.2},{:.2},{:.3}\n",
            w * 1e9,
            b * 1e9,
            b / w,
            we * 1e6,
            be * 1e6,
            we / be
        );
    }
    std::fs::write(format!("{out}/wire_buffers.csv"), csv).unwrap();
}
