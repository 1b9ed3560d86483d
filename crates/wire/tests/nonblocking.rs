//! Framing over non-blocking sockets: the writer and the reader stop at
//! `WouldBlock` and resume where they were; a forged body length cannot make
//! the reader set aside memory the peer has not sent.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};
use wire::{from_bytes, to_archive, Buffer, ErrorKind, Limits, MessageReader, MessageWriter};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Snapshot {
    tick: u64,
    names: Vec<String>,
    state: Buffer,
}

fn snapshot(tick: u64, bytes: usize) -> Snapshot {
    Snapshot {
        tick,
        names: (0..tick).map(|i| format!("player-{i}")).collect(),
        state: Buffer::from((0..bytes).map(|i| (i * 7 + tick as usize) as u8).collect::<Vec<u8>>()),
    }
}

fn pair() -> (UnixStream, UnixStream) {
    let (a, b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (a, b)
}

#[test]
fn messages_cross_non_blocking_sockets_resuming_after_would_block() {
    let (mut tx, mut rx) = pair();
    // Larger than any socket buffer, so both sides must stop and resume.
    let sent = vec![snapshot(3, 3 << 20), snapshot(0, 10), snapshot(40, 100_000)];
    let mut outbox: Vec<MessageWriter> = sent
        .iter()
        .map(|s| MessageWriter::new(to_archive(s).unwrap()))
        .collect();
    outbox.reverse();
    let mut reader = MessageReader::new(Limits::default());
    let mut got = vec![];
    let (mut write_blocked, mut read_blocked) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < sent.len() {
        assert!(Instant::now() < deadline, "stalled after {} messages", got.len());
        // Write until the socket is full.
        while let Some(w) = outbox.last_mut() {
            if w.write_to(&mut tx).unwrap() {
                assert_eq!(w.remaining(), 0);
                outbox.pop();
            } else {
                write_blocked += 1;
                break;
            }
        }
        // Read until it is empty.
        loop {
            match reader.read_from(&mut rx).unwrap() {
                Some(msg) => got.push(from_bytes::<Snapshot>(&msg).unwrap()),
                None => {
                    read_blocked += 1;
                    break;
                }
            }
        }
    }
    assert_eq!(got, sent);
    assert!(reader.is_idle());
    assert!(write_blocked > 0 && read_blocked > 0, "the sockets never blocked");
}

#[test]
fn a_forged_body_length_sets_aside_only_what_arrives() {
    let (mut tx, mut rx) = pair();
    // A real message's header, with its body length forged to 512 MiB
    // (under the default 1 GiB limit), then 10 kB of body, then nothing.
    let mut head = to_archive(&snapshot(1, 10)).unwrap().head();
    head[16..24].copy_from_slice(&(512u64 << 20).to_le_bytes());
    tx.write_all(&head).unwrap();
    tx.write_all(&[0u8; 10_000]).unwrap();
    let mut reader = MessageReader::new(Limits::default());
    assert!(reader.read_from(&mut rx).unwrap().is_none());
    assert!(
        reader.reserved() <= head.len() + (1 << 20) + 2 * 10_000,
        "set aside {} bytes for 10 kB received",
        reader.reserved()
    );
    // The peer goes away mid-message: an error, and not a clean end.
    drop(tx);
    let err = reader.read_from(&mut rx).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof));
    assert!(!reader.is_idle());
}

#[test]
fn a_message_over_the_limit_is_refused_from_its_header() {
    let (mut tx, mut rx) = pair();
    let archive = to_archive(&snapshot(2, 64 << 10)).unwrap();
    MessageWriter::new(archive).write_to(&mut tx).unwrap();
    let mut reader = MessageReader::new(Limits {
        max_len: 4096,
        ..Limits::default()
    });
    let err = reader.read_from(&mut rx).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::TooLarge { .. }), "{err}");
    assert!(reader.reserved() <= wire::HEADER_LEN);
}

#[test]
fn the_blocking_forms_say_what_to_use_on_a_non_blocking_socket() {
    let (mut tx, mut rx) = pair();
    let err = wire::read_message(&mut rx, Limits::default()).unwrap_err();
    assert!(err.to_string().contains("MessageReader"), "{err}");
    let big = to_archive(&snapshot(1, 8 << 20)).unwrap();
    let err = big.write_to(&mut tx).unwrap_err();
    assert!(err.to_string().contains("MessageWriter"), "{err}");
}
