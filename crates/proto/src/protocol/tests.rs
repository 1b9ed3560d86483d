//! Unit tests of the datagram format.

use super::*;
use crate::auth::Secret;
use proptest::prelude::*;
use std::hash::Hasher;

fn keys() -> SessionKeys {
    SessionKeys::derive(&Secret::new(&[7u8; 32]).unwrap(), &[9u8; TOKEN_LEN])
}

#[test]
fn c_defines_say_what_the_encoder_does() {
    let h = c_defines();
    let value = |name: &str| {
        let line = h
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{h}"));
        usize::from_str_radix(line.split_whitespace().nth(2).unwrap().trim_start_matches("0x"), 16).unwrap()
    };
    // Read the offsets off an encoded DATA, not off the constants.
    let mut d = [0u8; HEADER_LEN];
    let h0 = Header {
        seq: 0x0102_0304_0506_0708,
        ..hdr(Kind::Data)
    };
    put_header(&h0, size::DATA_MIN, &mut d);
    let at = |name: &str, n: usize| &d[value(name)..value(name) + n];
    assert_eq!(at("PROTO_OFF_GROUP", 2), h0.group.to_be_bytes());
    assert_eq!(
        at("PROTO_OFF_LENGTH", 2),
        ((size::DATA_MIN - HEADER_LEN) as u16).to_be_bytes()
    );
    assert_eq!(at("PROTO_OFF_SENDER", 4), h0.sender.to_be_bytes());
    assert_eq!(at("PROTO_OFF_MEMBERSHIP", 4), h0.membership.to_be_bytes());
    assert_eq!(d[value("PROTO_OFF_KIND")], Kind::Data as u8);
    assert_eq!(d[value("PROTO_OFF_KIND")] as usize, value("PROTO_DATA"));
    assert_eq!(d[value("PROTO_OFF_VERSION")] as usize, value("PROTO_VERSION"));
    assert_eq!(usize::from(be16(&d[..2])), value("PROTO_MAGIC"));
    let seq = value("PROTO_OFF_SEQ");
    assert_eq!(d[seq..seq + 8], 0x0102_0304_0506_0708u64.to_be_bytes());
    assert_eq!(value("PROTO_HEADER_LEN"), d.len());
    assert!(h.starts_with("/* Generated") && h.trim_end().ends_with("#endif"));
}

fn hdr(kind: Kind) -> Header {
    Header {
        kind,
        group: 4000,
        sender: 77,
        membership: 0xdead_beef,
        seq: 5,
    }
}

#[test]
fn the_word_wise_tag_is_the_streaming_siphash() {
    let key: [u8; 16] = core::array::from_fn(|i| (i * 7 + 3) as u8);
    let d: Vec<u8> = (0..1200u32).map(|i| (i * 31 + i / 7) as u8).collect();
    for len in (TAG.end..=200).chain([511, 512, 513, 1000, 1199, 1200]) {
        let mut h = siphasher::sip::SipHasher24::new_with_key(&key);
        h.write(&d[..TAG.start]);
        h.write(&[0u8; TAG_LEN]);
        h.write(&d[TAG.end..len]);
        assert_eq!(siphash24_tag(&key, &d[..len]), h.finish(), "{len} bytes");
    }
}

#[test]
fn siphash_is_the_reference_siphash_2_4() {
    // The paper's test vector (Aumasson & Bernstein, appendix A): key
    // 00..0f, message 00..0e. A BPF program computing standard SipHash
    // must agree with these tags.
    let key: [u8; 16] = core::array::from_fn(|i| i as u8);
    let msg: [u8; 15] = core::array::from_fn(|i| i as u8);
    let mut h = siphasher::sip::SipHasher24::new_with_key(&key);
    h.write(&msg);
    assert_eq!(h.finish(), 0xa129_ca61_49be_45e5);
}

#[test]
fn every_type_round_trips_at_its_size() {
    let k = keys();
    let mut out = [0u8; 200];
    let ack = JoinAck {
        members: 3,
        keepalive_ms: 2500,
        flags: FLAG_TAGS,
        checkpoint_port: 4100,
    };
    let cases: Vec<(Kind, Vec<u8>, usize)> = vec![
        (Kind::Join, vec![1; 32], size::JOIN),
        (Kind::Join, vec![1; 48], size::JOIN_WITH_COOKIE),
        (Kind::JoinChallenge, vec![2; 16], size::JOIN_CHALLENGE),
        (Kind::JoinAck, ack.body().to_vec(), size::JOIN_ACK),
        (Kind::Leave, vec![], size::LEAVE),
        (Kind::Keepalive, vec![], size::KEEPALIVE),
        (Kind::Data, b"hello".to_vec(), size::DATA_MIN + 5),
        (Kind::Error, vec![0, 4, 0, 0], size::ERROR),
        (Kind::Probe, 42u64.to_be_bytes().to_vec(), size::PROBE),
        (Kind::ProbeReply, 42u64.to_be_bytes().to_vec(), size::PROBE),
        (Kind::CheckpointRequest, 42u64.to_be_bytes().to_vec(), size::PROBE),
        (Kind::Echo, 42u64.to_be_bytes().to_vec(), size::ECHO),
        (Kind::EchoReply, 42u64.to_be_bytes().to_vec(), size::ECHO),
        (Kind::Moved, vec![0, 2, 0x03, 0xe8, 0, 0, 0, 0], size::MOVED),
    ];
    assert_eq!(
        cases
            .iter()
            .map(|c| c.0)
            .collect::<std::collections::HashSet<_>>()
            .len(),
        Kind::ALL.len(),
        "every type has a case"
    );
    for (kind, body, want) in cases {
        let n = emit(&hdr(kind), &body, Some(&k), &mut out).unwrap();
        assert_eq!(n, want, "{kind:?}");
        let p = Packet::parse(&out[..n]).unwrap();
        assert_eq!(
            (p.kind(), p.group(), p.sender(), p.membership(), p.seq()),
            (kind, 4000, 77, 0xdead_beef, 5)
        );
        assert_eq!(p.payload(), &body[..], "{kind:?}");
        match kind.auth() {
            Auth::Mac | Auth::ShortMac => assert!(k.verify(&p), "{kind:?}"),
            Auth::Tag => assert!(k.verify_tag(&p)),
            Auth::None => {}
        }
    }
    let n = emit(&hdr(Kind::JoinAck), &ack.body(), Some(&k), &mut out).unwrap();
    assert_eq!(Packet::parse(&out[..n]).unwrap().join_ack(), Some(ack));
    let n = emit(&hdr(Kind::Probe), &42u64.to_be_bytes(), Some(&k), &mut out).unwrap();
    assert_eq!(Packet::parse(&out[..n]).unwrap().nonce(), Some(42));
}

#[test]
fn a_changed_byte_or_another_key_fails_the_mac_and_the_tag() {
    let (k, other) = (keys(), SessionKeys::from_session([1u8; 32]));
    let mut out = [0u8; 100];
    for (kind, body) in [(Kind::Keepalive, vec![]), (Kind::Data, b"state".to_vec())] {
        let n = emit(&hdr(kind), &body, Some(&k), &mut out).unwrap();
        let ok = |b: &[u8], key: &SessionKeys| {
            let p = Packet::parse(b).unwrap();
            if kind == Kind::Data {
                key.verify_tag(&p)
            } else {
                key.verify(&p)
            }
        };
        assert!(ok(&out[..n], &k));
        assert!(!ok(&out[..n], &other), "{kind:?} under another key");
        // Every byte the parser does not itself check is covered.
        for i in (field::GROUP.start..n).filter(|i| !field::LENGTH.contains(i)) {
            let mut b = out[..n].to_vec();
            b[i] ^= 0x40;
            assert!(!ok(&b, &k), "{kind:?}: byte {i} flipped still verifies");
        }
    }
}

#[test]
fn stripping_zeroes_the_tag_and_nothing_else() {
    let k = keys();
    let mut out = [0u8; 64];
    let n = emit(&hdr(Kind::Data), b"abc", Some(&k), &mut out).unwrap();
    let before = out[..n].to_vec();
    strip_tag(&mut out[..n]);
    assert_eq!(&out[TAG], &[0; 8]);
    assert_eq!(&out[..TAG.start], &before[..TAG.start]);
    assert_eq!(&out[TAG.end..n], b"abc");
    // Untagged DATA (tags off) is the same bytes with a zero tag.
    let mut plain = [0u8; 64];
    let m = emit(&hdr(Kind::Data), b"abc", None, &mut plain).unwrap();
    assert_eq!(&plain[..m], &out[..n]);
}

#[test]
fn the_parser_refuses_each_kind_of_bad_datagram() {
    let k = keys();
    let mut out = [0u8; 100];
    let n = emit(&hdr(Kind::Keepalive), &[], Some(&k), &mut out).unwrap();
    let good = out[..n].to_vec();
    let bad = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut b = good.clone();
        f(&mut b);
        Packet::parse(&b[..]).map(|_| ())
    };
    assert_eq!(bad(&|b| b.truncate(10)), Err(ParseError::Truncated));
    assert_eq!(bad(&|b| b[0] = 0), Err(ParseError::BadMagic));
    assert_eq!(bad(&|b| b[2] = 1), Err(ParseError::BadVersion(1)));
    assert_eq!(bad(&|b| b[3] = 99), Err(ParseError::UnknownKind(99)));
    assert_eq!(
        bad(&|b| b.push(0)),
        Err(ParseError::LengthMismatch {
            declared: 16,
            actual: 17
        })
    );
    assert_eq!(
        bad(&|b| {
            b.push(0);
            b[6..8].copy_from_slice(&17u16.to_be_bytes());
        }),
        Err(ParseError::BadPayload(Kind::Keepalive))
    );
    assert_eq!(
        emit(&hdr(Kind::Keepalive), &[], None, &mut out),
        Err(EmitError::NoKey("KEEPALIVE"))
    );
    assert!(emit(&hdr(Kind::Keepalive), &[1], Some(&k), &mut out).is_err());
    assert!(emit(&hdr(Kind::Data), &[0; 100], None, &mut out[..50]).is_err());
}

#[test]
fn both_sides_derive_the_same_keys() {
    let secret = Secret::new(&[3u8; 32]).unwrap();
    let server = SessionKeys::derive(&secret, &[5u8; TOKEN_LEN]);
    let player = SessionKeys::from_session(server.session);
    let leave = SmallDatagram::simple(&hdr(Kind::Leave), &player);
    assert!(server.verify(&Packet::parse(leave.as_bytes()).unwrap()));
    let other_token = SessionKeys::derive(&secret, &[6u8; TOKEN_LEN]);
    assert!(!other_token.verify(&Packet::parse(leave.as_bytes()).unwrap()));
}

#[test]
fn replies_are_never_larger_than_what_triggers_them() {
    let k = keys();
    let h = hdr(Kind::Join);
    let join = SmallDatagram::join(&h, &[1; TOKEN_LEN], None, &k);
    let echo = SmallDatagram::join(&h, &[1; TOKEN_LEN], Some(&[2; COOKIE_LEN]), &k);
    let ch = SmallDatagram::challenge(&h, &[2; COOKIE_LEN], &k);
    let ack = SmallDatagram::join_ack(
        &h,
        JoinAck {
            members: 1,
            keepalive_ms: 1,
            flags: 0,
            checkpoint_port: 0,
        },
        &k,
    );
    let err = SmallDatagram::error(4000, 1, 0, ErrorCode::NotMember);
    let probe = SmallDatagram::nonce(&hdr(Kind::Probe), 1, &k);
    let keepalive = SmallDatagram::simple(&hdr(Kind::Keepalive), &k);
    assert!(ch.len() <= join.len());
    assert!(ack.len() <= echo.len());
    // ERROR to a non-member: never larger than the smallest DATA.
    assert!(err.len() <= size::DATA_MIN);
    assert!(probe.len() <= keepalive.len());
    assert_eq!(
        (join.len(), echo.len(), ch.len(), ack.len(), err.len()),
        (72, 88, 56, 48, 28)
    );
}

#[test]
fn a_version_1_client_gets_a_version_1_error_no_larger_than_its_request() {
    let mut v1 = [0u8; 48];
    v1[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    v1[2] = 1;
    v1[3] = 1;
    v1[4..6].copy_from_slice(&4000u16.to_be_bytes());
    v1[8..12].copy_from_slice(&7u32.to_be_bytes());
    let e = version1_error(&v1).unwrap();
    assert_eq!(
        (e[2], e[3], be16(&e[4..6]), be32(&e[8..12]), be16(&e[16..18])),
        (1, 7, 4000, 7, 6)
    );
    assert_eq!(
        version1_error(&v1[..16]),
        None,
        "a 16-byte request gets no 18-byte reply"
    );
    assert_eq!(
        version1_error(&v1[..23]),
        None,
        "nothing shorter than a header is answered"
    );
    assert!(version1_error(&v1[..24]).is_some());
    let mut v2 = v1;
    v2[2] = 2;
    assert_eq!(version1_error(&v2), None);
}

#[test]
fn the_replay_window_accepts_each_sequence_once() {
    let mut w = ReplayWindow::default();
    assert!(!w.accept(0), "0 is never valid");
    assert!(w.accept(1));
    assert!(!w.accept(1));
    assert!(w.accept(10));
    assert!(w.accept(5), "late but inside the window");
    assert!(!w.accept(5));
    assert!(w.accept(100));
    assert!(!w.accept(36), "older than the window: refused");
    assert!(w.accept(37));
    assert!(w.accept(100 + 64));
    assert!(!w.accept(100), "now outside the window");
}

#[test]
fn echo_echo_reply_and_moved_carry_their_fields_under_the_mac() {
    let k = keys();
    for kind in [Kind::Echo, Kind::EchoReply] {
        let d = SmallDatagram::nonce(&hdr(kind), 0x0102_0304_0506_0708, &k);
        let p = Packet::parse(d.as_bytes()).unwrap();
        assert_eq!((p.kind(), d.len(), p.nonce()), (kind, 40, Some(0x0102_0304_0506_0708)));
        assert!(k.verify(&p));
        assert_eq!(p.moved(), None);
    }
    for reason in MovedReason::ALL {
        let d = SmallDatagram::moved(&hdr(Kind::Keepalive), reason, 1500, &k);
        let p = Packet::parse(d.as_bytes()).unwrap();
        assert_eq!((p.kind(), d.len()), (Kind::Moved, size::MOVED));
        assert_eq!(
            p.moved(),
            Some(Moved {
                reason: Ok(reason),
                within_ms: 1500
            })
        );
        assert_eq!(&p.as_bytes()[28..32], &[0; 4], "reserved");
        assert!(k.verify(&p));
        assert_eq!(MovedReason::from_u16(reason as u16), Some(reason));
    }
    assert_eq!(MovedReason::from_u16(0), None);
    // ECHO_REPLY answers ECHO at exactly its size.
    assert_eq!(size::ECHO, size::PROBE);
}

#[test]
fn error_codes_and_join_ack_flags() {
    for (i, c) in ErrorCode::ALL.into_iter().enumerate() {
        assert_eq!(c as u16, i as u16 + 1);
        assert_eq!(ErrorCode::from_u16(c as u16), Some(c));
        let e = SmallDatagram::error(4000, 1, 0, c);
        assert_eq!(Packet::parse(e.as_bytes()).unwrap().error_code(), Some(Ok(c)));
    }
    assert_eq!(ErrorCode::from_u16(9), Some(ErrorCode::Retry));
    assert_eq!(ErrorCode::from_u16(10), None);
    let ack = |flags| JoinAck {
        members: 1,
        keepalive_ms: 1,
        flags,
        checkpoint_port: 0,
    };
    assert!(ack(FLAG_TAGS | FLAG_INSTANCE).tags() && ack(FLAG_TAGS | FLAG_INSTANCE).instance());
    assert!(!ack(FLAG_TAGS | FLAG_SEALED).instance());
    assert!(!ack(FLAG_INSTANCE | 0xf8).tags(), "unknown bits are ignored");
    assert_eq!(MAX_GAME_PAYLOAD, 1440);
    assert_eq!(MAX_GAME_PAYLOAD - INSTANCE_LEN, 1432);
}

#[test]
fn a_renewal_is_a_72_byte_join_with_the_membership_under_its_keys() {
    let (old, new) = (keys(), SessionKeys::from_session([4u8; 32]));
    let h = Header {
        membership: 0x1234_5678,
        ..hdr(Kind::Keepalive)
    };
    let d = SmallDatagram::renewal(&h, &[8; TOKEN_LEN], &old);
    let p = Packet::parse(d.as_bytes()).unwrap();
    assert_eq!(
        (p.kind(), d.len(), p.membership()),
        (Kind::Join, size::JOIN, 0x1234_5678)
    );
    assert!(p.is_renewal());
    assert_eq!(p.join_token(), Some(&[8; TOKEN_LEN]));
    assert_eq!(p.join_cookie(), None);
    assert!(old.verify(&p), "MAC'd under the membership's keys");
    assert!(!new.verify(&p));
    let first = SmallDatagram::join(&hdr(Kind::Join), &[8; TOKEN_LEN], None, &old);
    let first = Packet::parse(first.as_bytes()).unwrap();
    assert!(first.is_renewal(), "hdr() carries a membership id");
    let fresh = SmallDatagram::join(
        &Header {
            membership: 0,
            ..hdr(Kind::Join)
        },
        &[8; TOKEN_LEN],
        None,
        &old,
    );
    assert!(!Packet::parse(fresh.as_bytes()).unwrap().is_renewal());
}

#[test]
fn renewal_time_is_a_third_of_the_lifetime_left_at_latest_10_s_before_expiry() {
    let t0 = 1_700_000_000_000u64;
    // 300 s token: renew with 100 s left.
    assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 300), t0 + 200_000);
    // 24 s token: a third left (8 s) would be later than 10 s before expiry.
    assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 24), t0 + 14_000);
    // 6 s token: at once.
    assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 + 6), t0);
    // Already expired: at once.
    assert_eq!(renewal::renew_at_unix_ms(t0, t0 / 1000 - 5), t0 - 5000);
}

proptest! {
    #[test]
    fn random_bytes_never_panic_the_parser(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(p) = Packet::parse(&b[..]) {
            let k = keys();
            let _ = (p.join_token(), p.join_cookie(), p.challenge_cookie(), p.nonce(), p.join_ack());
            let _ = (p.error_code(), p.tag(), p.signed(), p.payload(), p.seq(), p.membership());
            let _ = (p.moved(), p.is_renewal());
            let _ = (k.verify(&p), k.verify_tag(&p));
        }
    }

    #[test]
    fn header_like_bytes_never_panic(kind in 0u8..16, len in 0u16..100, tail in proptest::collection::vec(any::<u8>(), 0..100)) {
        let mut b = vec![0x52, 0x46, 2, kind, 0x0f, 0xa0];
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&[0; 16]);
        b.extend_from_slice(&tail);
        if let Ok(p) = Packet::parse(&b[..]) {
            let _ = (p.payload(), p.signed(), p.join_ack(), p.nonce(), p.moved());
        }
    }

    #[test]
    fn data_round_trips(group: u16, sender: u32, membership: u32, seq: u64, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
        let k = keys();
        let mut buf = vec![0u8; DATA_PAYLOAD + payload.len()];
        let h = Header { kind: Kind::Data, group, sender, membership, seq };
        let n = emit(&h, &payload, Some(&k), &mut buf).unwrap();
        let p = Packet::parse(&buf[..n]).unwrap();
        prop_assert_eq!((p.group(), p.sender(), p.membership(), p.seq()), (group, sender, membership, seq));
        prop_assert_eq!(p.payload(), &payload[..]);
        prop_assert!(k.verify_tag(&p));
    }

    #[test]
    fn the_window_matches_a_set_of_seen_numbers(seqs in proptest::collection::vec(1u64..300, 0..200)) {
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::BTreeSet::new();
        for s in seqs {
            let highest = seen.iter().next_back().copied().unwrap_or(0);
            let model = !seen.contains(&s) && (s > highest || highest - s < 64);
            prop_assert_eq!(w.accept(s), model, "seq {}", s);
            if model {
                seen.insert(s);
            }
        }
    }
}
