//! The test vectors of `docs/protocol-vectors.json` (format: the document's
//! "Test vectors" section), made by this crate's code from fixed inputs (a
//! fixed secret, cookie key and clock; no randomness).
//!
//! - `REGENERATE_VECTORS=1 cargo test -p reflector-proto --test vectors`
//!   writes the file;
//! - without it, the test rebuilds the JSON and asserts it equals the
//!   committed file byte for byte (so a change of the code that changes a
//!   vector fails until the file is regenerated and reviewed), and checks
//!   every entry of the committed file with the crate's API: tokens and keys,
//!   cookies, every datagram's fields, MAC or tag, every channel message's
//!   fields, MACs and digests, and that every `invalid` entry is rejected.
//!
//! Conventions of the file beyond the document's field list: integers are
//! JSON numbers (64-bit ones included: nonces, tags, ticks, the challenge),
//! byte strings are lowercase hex.

use reflector_proto::auth::{check_cookie, make_cookie, verify_token, Secret, TokenClaims, COOKIE_SLOT_MS};
use reflector_proto::checkpoint::{
    body_mac, digest, reply_mac, request_mac, Answer, Hello, Member, Op, Refusal, Reply, Request, Status, Stored,
    HELLO_LEN, REPLY_LEN, REPLY_SIGNED_LEN, REQUEST_LEN, REQUEST_SIGNED_LEN,
};
use reflector_proto::protocol::{
    emit, version1_error, Auth, ErrorCode, Header, JoinAck, Kind, MovedReason, Packet, SessionKeys, SmallDatagram,
    FLAG_INSTANCE, FLAG_TAGS, INSTANCE_LEN, MAGIC, TOKEN_LEN,
};
use reflector_proto::sealed::checkpoint::{
    self as ckpt, open_checkpoint, seal_checkpoint, CheckpointRefusal, ControlSigner, FetchedReply, JoinerView,
    PlayerKey, UploadInfo,
};
use reflector_proto::sealed::{
    self, CellId, EpochKey, MasterSecret, Receiver, Schedule, SenderKey, WorldId, SEALED_MIN,
};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;

// ---------------------------------------------------------------------------
// The fixed inputs.

const NOW_UNIX_MS: u64 = 1_767_225_600_123;
const NOW_S: u64 = NOW_UNIX_MS / 1000;
const REFLECTOR: u16 = 3;
const GROUP: u16 = 40_000;
const PLAYER_A: u32 = 1001;
const PLAYER_B: u32 = 1002;
const MEMBERSHIP: u32 = 0x5eed_1234;
const PROBE_NONCE: u64 = 0x8a3f_0c11_d2e4_5b67;
const CHECKPOINT_NONCE: u64 = 0x0123_4567_89ab_cdef;
const ECHO_NONCE: u64 = 0xfeed_face_cafe_beef;
const INSTANCE: u64 = 0x1c2d_3e4f_5061_7283;
const CHALLENGE: u64 = 0x0f1e_2d3c_4b5a_6978;
const TICK: u64 = 4242;
const STATE: &[u8] = b"checkpoint state of group 40000 at tick 4242\n";

fn secret_bytes() -> [u8; 32] {
    core::array::from_fn(|i| i as u8)
}

fn cookie_key_bytes() -> [u8; 32] {
    core::array::from_fn(|i| 0x80 + i as u8)
}

fn secret() -> Secret {
    Secret::new(&secret_bytes()).expect("32 bytes")
}

fn cookie_key() -> Secret {
    Secret::new(&cookie_key_bytes()).expect("32 bytes")
}

/// Token 0: player A; token 1: player B; token 2: player A's newer token,
/// the one a renewal carries.
fn claims() -> [TokenClaims; 3] {
    let c = |player, expires_unix_s| TokenClaims {
        player,
        reflector: REFLECTOR,
        group: GROUP,
        expires_unix_s,
    };
    [
        c(PLAYER_A, NOW_S + 300),
        c(PLAYER_B, NOW_S + 300),
        c(PLAYER_A, NOW_S + 600),
    ]
}

fn cookie_cases() -> [(&'static str, u32); 2] {
    [("192.0.2.10:51000", PLAYER_A), ("[2001:db8::10]:51001", PLAYER_B)]
}

// ---------------------------------------------------------------------------
// A JSON value whose objects keep their fields in the order written,
// whatever serde_json's features: the file is compared byte for byte.

enum J {
    U(u64),
    S(String),
    B(bool),
    Null,
    A(Vec<J>),
    O(Vec<(&'static str, J)>),
}

impl Serialize for J {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            J::U(v) => s.serialize_u64(*v),
            J::S(v) => s.serialize_str(v),
            J::B(v) => s.serialize_bool(*v),
            J::Null => s.serialize_unit(),
            J::A(v) => {
                let mut q = s.serialize_seq(Some(v.len()))?;
                for x in v {
                    q.serialize_element(x)?;
                }
                q.end()
            }
            J::O(v) => {
                let mut m = s.serialize_map(Some(v.len()))?;
                for (k, x) in v {
                    m.serialize_entry(k, x)?;
                }
                m.end()
            }
        }
    }
}

fn u(v: impl Into<u64>) -> J {
    J::U(v.into())
}

fn h(b: impl AsRef<[u8]>) -> J {
    J::S(hex::encode(b))
}

fn s(v: &str) -> J {
    J::S(v.to_string())
}

fn keys_of(i: Option<usize>) -> J {
    i.map_or(J::Null, |i| u(i as u64))
}

// ---------------------------------------------------------------------------
// Building the vectors.

fn token_keys() -> Vec<([u8; TOKEN_LEN], SessionKeys)> {
    claims()
        .iter()
        .map(|c| {
            let t = c.sign(&secret());
            (t, SessionKeys::derive(&secret(), &t))
        })
        .collect()
}

fn header(kind: Kind, player: u32, membership: u32, seq: u64) -> Header {
    Header {
        kind,
        group: GROUP,
        sender: player,
        membership,
        seq,
    }
}

/// A datagram entry: name, type, keys, hex, the header's fields, then `extra`.
fn datagram(name: &str, bytes: &[u8], keys: Option<usize>, extra: Vec<(&'static str, J)>) -> J {
    let be = |r: std::ops::Range<usize>| bytes[r].iter().fold(0u64, |a, b| a << 8 | u64::from(*b));
    let mut o = vec![
        ("name", s(name)),
        ("type", u(bytes[3])),
        ("keys", keys_of(keys)),
        ("hex", h(bytes)),
        ("group", u(be(4..6))),
        ("player", u(be(8..12))),
        ("membership", u(be(12..16))),
    ];
    if bytes.len() >= 24 {
        o.push(("sequence", u(be(16..24))));
    }
    o.extend(extra);
    J::O(o)
}

fn data(h: &Header, payload: &[u8], keys: Option<&SessionKeys>) -> Vec<u8> {
    let mut buf = vec![0u8; 32 + payload.len()];
    let n = emit(h, payload, keys, &mut buf).expect("a DATA of this size");
    buf.truncate(n);
    buf
}

fn datagrams(tk: &[([u8; TOKEN_LEN], SessionKeys)]) -> Vec<J> {
    let (t0, k0) = (&tk[0].0, &tk[0].1);
    let t2 = &tk[2].0;
    let a = |kind, membership, seq| header(kind, PLAYER_A, membership, seq);
    let cookie_a = make_cookie(
        &cookie_key(),
        &cookie_cases()[0].0.parse().unwrap(),
        GROUP,
        PLAYER_A,
        NOW_UNIX_MS,
    );
    let mut v = Vec::new();

    let join = SmallDatagram::join(&a(Kind::Join, 0, 1), t0, None, k0);
    v.push(datagram("JOIN", join.as_bytes(), Some(0), vec![("token", h(t0))]));
    let challenge = SmallDatagram::challenge(&a(Kind::JoinChallenge, 0, 1), &cookie_a, k0);
    v.push(datagram(
        "JOIN_CHALLENGE",
        challenge.as_bytes(),
        Some(0),
        vec![("cookie", h(cookie_a))],
    ));
    let join2 = SmallDatagram::join(&a(Kind::Join, 0, 2), t0, Some(&cookie_a), k0);
    v.push(datagram(
        "JOIN (with cookie)",
        join2.as_bytes(),
        Some(0),
        vec![("token", h(t0)), ("cookie", h(cookie_a))],
    ));
    let ack = JoinAck {
        members: 3,
        keepalive_ms: 1000,
        flags: FLAG_TAGS | FLAG_INSTANCE,
        checkpoint_port: 40_100,
    };
    let ackd = SmallDatagram::join_ack(&a(Kind::JoinAck, MEMBERSHIP, 1), ack, k0);
    v.push(datagram(
        "JOIN_ACK (tags, instance)",
        ackd.as_bytes(),
        Some(0),
        vec![
            ("members", u(ack.members)),
            ("keepalive_ms", u(ack.keepalive_ms)),
            ("flags", u(ack.flags)),
            ("checkpoint_port", u(ack.checkpoint_port)),
        ],
    ));
    let ka = SmallDatagram::simple(&a(Kind::Keepalive, MEMBERSHIP, 3), k0);
    v.push(datagram("KEEPALIVE", ka.as_bytes(), Some(0), vec![]));

    let game = b"position 12.5 -3.25";
    let tagged = data(&a(Kind::Data, MEMBERSHIP, 4), game, Some(k0));
    let tag = u64::from_be_bytes(tagged[24..32].try_into().unwrap());
    v.push(datagram(
        "DATA (tag)",
        &tagged,
        Some(0),
        vec![("tags", J::B(true)), ("tag", u(tag)), ("payload", h(game))],
    ));
    let plain = data(&a(Kind::Data, MEMBERSHIP, 5), game, None);
    v.push(datagram(
        "DATA (tags off)",
        &plain,
        None,
        vec![("tags", J::B(false)), ("tag", u(0u64)), ("payload", h(game))],
    ));
    let mut with_instance = INSTANCE.to_be_bytes().to_vec();
    with_instance.extend_from_slice(game);
    let inst = data(&a(Kind::Data, MEMBERSHIP, 6), &with_instance, Some(k0));
    let itag = u64::from_be_bytes(inst[24..32].try_into().unwrap());
    v.push(datagram(
        "DATA (tag, instance)",
        &inst,
        Some(0),
        vec![
            ("tags", J::B(true)),
            ("tag", u(itag)),
            ("payload", h(&with_instance)),
            ("instance", u(INSTANCE)),
        ],
    ));

    for (name, kind, seq, nonce) in [
        ("PROBE", Kind::Probe, 2, PROBE_NONCE),
        ("PROBE_REPLY", Kind::ProbeReply, 7, PROBE_NONCE),
        ("CHECKPOINT_REQUEST", Kind::CheckpointRequest, 3, CHECKPOINT_NONCE),
        ("ECHO", Kind::Echo, 8, ECHO_NONCE),
        ("ECHO_REPLY", Kind::EchoReply, 4, ECHO_NONCE),
    ] {
        let d = SmallDatagram::nonce(&a(kind, MEMBERSHIP, seq), nonce, k0);
        v.push(datagram(name, d.as_bytes(), Some(0), vec![("nonce", u(nonce))]));
    }
    for (i, reason) in MovedReason::ALL.into_iter().enumerate() {
        let within = [5000u16, 0, 1000][i];
        let d = SmallDatagram::moved(&a(Kind::Moved, MEMBERSHIP, 5 + i as u64), reason, within, k0);
        v.push(datagram(
            &format!("MOVED ({reason:?})"),
            d.as_bytes(),
            Some(0),
            vec![
                ("reason", u(reason as u16)),
                ("reason_name", s(&format!("{reason:?}"))),
                ("within_ms", u(within)),
            ],
        ));
    }
    let renewal = SmallDatagram::renewal(&a(Kind::Join, MEMBERSHIP, 9), t2, k0);
    v.push(datagram(
        "JOIN (renewal)",
        renewal.as_bytes(),
        Some(0),
        vec![("token", h(t2)), ("renewal", J::B(true)), ("token_index", u(2u64))],
    ));
    let leave = SmallDatagram::simple(&a(Kind::Leave, MEMBERSHIP, 10), k0);
    v.push(datagram("LEAVE", leave.as_bytes(), Some(0), vec![]));

    // ERROR(Version) is only ever sent as a version-1 ERROR (below).
    for code in ErrorCode::ALL.into_iter().filter(|c| *c != ErrorCode::Version) {
        let e = SmallDatagram::error(GROUP, PLAYER_B, 0, code);
        v.push(datagram(
            &format!("ERROR ({code:?})"),
            e.as_bytes(),
            None,
            vec![("code", u(code as u16)), ("code_name", s(&format!("{code:?}")))],
        ));
    }
    let request = v1_request();
    let e = version1_error(&request).expect("a version-1 request of a header's size");
    v.push(datagram(
        "ERROR (Version), version 1",
        &e,
        None,
        vec![
            ("version", u(1u8)),
            ("code", u(ErrorCode::Version as u16)),
            ("code_name", s("Version")),
            ("request", h(request)),
        ],
    ));
    v
}

/// A version-1 JOIN-like datagram of a header's size (what an old client sends).
fn v1_request() -> [u8; 24] {
    let mut r = [0u8; 24];
    r[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    r[2] = 1;
    r[3] = 1;
    r[4..6].copy_from_slice(&GROUP.to_be_bytes());
    r[6..8].copy_from_slice(&0u16.to_be_bytes());
    r[8..12].copy_from_slice(&PLAYER_A.to_be_bytes());
    r[12..16].copy_from_slice(&0xa1b2_c3d4u32.to_be_bytes());
    r[16..24].copy_from_slice(&7u64.to_be_bytes());
    r
}

fn hello() -> Hello {
    Hello {
        challenge: CHALLENGE,
        max_state: 16 << 20,
        hello_deadline_ms: 2000,
    }
}

fn member(k: &SessionKeys) -> Member<'_> {
    Member {
        group: GROUP,
        player: PLAYER_A,
        membership: MEMBERSHIP,
        keys: k,
    }
}

fn requests(k: &SessionKeys) -> [Request; 3] {
    let m = member(k);
    [
        Request::upload(&m, CHALLENGE, CHECKPOINT_NONCE, STATE.len() as u64, TICK),
        Request::fetch(&m, CHALLENGE, Op::Fetch),
        Request::fetch(&m, CHALLENGE, Op::FetchOther),
    ]
}

fn stored() -> Stored {
    Stored {
        number: 7,
        tick: TICK,
        from_player: PLAYER_A,
        digest: digest(STATE),
    }
}

/// (name, reply, the request it answers, the state that goes with it).
fn replies(k: &SessionKeys) -> Vec<(String, Reply, Request, Option<&'static [u8]>)> {
    let [up, fetch, other] = requests(k);
    let signed = |a, r: &Request| Reply::signed(a, k, CHALLENGE, &r.mac);
    vec![
        ("REPLY CONTINUE".into(), signed(Answer::Continue, &up), up, None),
        (
            "REPLY STORED".into(),
            signed(Answer::Stored(stored()), &up),
            up,
            Some(STATE),
        ),
        (
            "REPLY CHECKPOINT".into(),
            signed(
                Answer::Checkpoint {
                    stored: stored(),
                    body_len: STATE.len() as u64,
                    age_ms: 1500,
                },
                &fetch,
            ),
            fetch,
            Some(STATE),
        ),
        ("REPLY EMPTY".into(), signed(Answer::Empty, &other), other, None),
        (
            "REPLY REFUSED".into(),
            signed(Answer::Refused(Refusal::Busy), &fetch),
            fetch,
            None,
        ),
        (
            "REPLY REFUSED (unauthenticated)".into(),
            Reply::unauthenticated(Refusal::NotMember),
            fetch,
            None,
        ),
    ]
}

fn request_entry(r: &Request) -> J {
    J::O(vec![
        ("name", s(&format!("REQUEST {}", r.op.name()))),
        ("hex", h(r.encode())),
        ("op", u(r.op as u8)),
        ("group", u(r.group)),
        ("player", u(r.player)),
        ("membership", u(r.membership)),
        ("nonce", u(r.nonce)),
        ("body_length", u(r.body_len)),
        ("tick", u(r.tick)),
        ("mac", h(r.mac)),
    ])
}

fn reply_entry(name: &str, r: &Reply, req: &Request, state: Option<&[u8]>) -> J {
    let (refusal, info, body_len, age_ms) = match r.answer {
        Answer::Refused(c) => (c as u8, None, 0, 0),
        Answer::Stored(st) => (0, Some(st), 0, 0),
        Answer::Checkpoint {
            stored,
            body_len,
            age_ms,
        } => (0, Some(stored), body_len, age_ms),
        Answer::Continue | Answer::Empty => (0, None, 0, 0),
    };
    let st = info.unwrap_or(Stored {
        number: 0,
        tick: 0,
        from_player: 0,
        digest: [0; 32],
    });
    let mut o = vec![
        ("name", s(name)),
        ("hex", h(r.encode())),
        ("status", u(r.answer.status() as u8)),
        ("refusal", u(refusal)),
        ("checkpoint", u(st.number)),
        ("body_length", u(body_len)),
        ("tick", u(st.tick)),
        ("from_player", u(st.from_player)),
        ("age_ms", u(age_ms)),
        ("digest", h(st.digest)),
        ("mac", h(r.mac)),
        ("authenticated", J::B(!r.is_unauthenticated())),
        ("request", s(&format!("REQUEST {}", req.op.name()))),
        ("request_mac", h(req.mac)),
    ];
    if let Some(state) = state {
        o.push(("state", h(state)));
    }
    J::O(o)
}

fn channel(tk: &[([u8; TOKEN_LEN], SessionKeys)]) -> J {
    let k = &tk[0].1;
    let hl = hello();
    let mut msgs = vec![J::O(vec![
        ("name", s("HELLO")),
        ("hex", h(hl.encode())),
        ("challenge", u(hl.challenge)),
        ("max_state", u(hl.max_state)),
        ("hello_deadline_ms", u(hl.hello_deadline_ms)),
    ])];
    let reqs = requests(k);
    msgs.extend(reqs.iter().map(request_entry));
    let up = &reqs[0];
    msgs.push(J::O(vec![
        ("name", s("body MAC")),
        ("hex", h(body_mac(k, CHALLENGE, &up.mac, STATE))),
        ("request", s("REQUEST UPLOAD")),
        ("request_mac", h(up.mac)),
        ("state", h(STATE)),
    ]));
    for (name, r, req, state) in replies(k) {
        msgs.push(reply_entry(&name, &r, &req, state));
    }
    J::O(vec![
        ("challenge", u(CHALLENGE)),
        ("keys", u(0u64)),
        ("group", u(GROUP)),
        ("player", u(PLAYER_A)),
        ("membership", u(MEMBERSHIP)),
        ("messages", J::A(msgs)),
    ])
}

/// Invalid entries: (name, why, kind, message or None, keys, bytes, extra).
fn invalid(tk: &[([u8; TOKEN_LEN], SessionKeys)]) -> Vec<J> {
    let k0 = &tk[0].1;
    let a = |kind, seq| header(kind, PLAYER_A, MEMBERSHIP, seq);
    let ka = SmallDatagram::simple(&a(Kind::Keepalive, 11), k0).as_bytes().to_vec();
    let mut v = Vec::new();
    let mut dg = |name: &str, why: &str, bytes: Vec<u8>, extra: Vec<(&'static str, J)>| {
        let mut o = vec![
            ("name", s(name)),
            ("why", s(why)),
            ("kind", s("datagram")),
            ("keys", u(0u64)),
            ("hex", h(bytes)),
        ];
        o.extend(extra);
        v.push(J::O(o));
    };
    let mut b = ka.clone();
    b[0] = 0x52 ^ 0xff;
    dg("bad magic", "the first two bytes are not 0x5246", b, vec![]);
    let mut b = ka.clone();
    b[6..8].copy_from_slice(&17u16.to_be_bytes());
    dg(
        "wrong length field",
        "the length field says 17, the datagram has 16 bytes after the header",
        b,
        vec![],
    );
    let mut b = ka.clone();
    b.push(0);
    b[6..8].copy_from_slice(&17u16.to_be_bytes());
    dg(
        "wrong size for type",
        "a KEEPALIVE of 41 bytes (its type's size is 40)",
        b,
        vec![],
    );
    let mut b = ka.clone();
    b[3] = 14;
    dg("unknown type", "type 14 is not in the table", b, vec![]);
    let mut b = ka.clone();
    b[2] = 3;
    dg(
        "unsupported version",
        "version 3 (not answered: only version 1 gets an ERROR)",
        b,
        vec![],
    );
    let mut b = ka.clone();
    b[39] ^= 0x01;
    dg("flipped MAC", "a KEEPALIVE whose MAC's last bit is flipped", b, vec![]);
    let mut b = ka.clone();
    b[20] ^= 0x01;
    dg(
        "flipped sequence",
        "a KEEPALIVE whose sequence changed under its MAC",
        b,
        vec![],
    );
    let mut b = data(&a(Kind::Data, 12), b"position 12.5 -3.25", Some(k0));
    b[24] ^= 0x80;
    dg(
        "flipped tag",
        "a DATA whose tag's first bit is flipped (tags on)",
        b,
        vec![("tags", J::B(true))],
    );

    let [up, fetch, _] = requests(k0);
    let mut ch = |name: &str, why: &str, message: &str, bytes: &[u8], extra: Vec<(&'static str, J)>| {
        let mut o = vec![
            ("name", s(name)),
            ("why", s(why)),
            ("kind", s("channel")),
            ("message", s(message)),
            ("keys", u(0u64)),
            ("hex", h(bytes)),
        ];
        o.extend(extra);
        v.push(J::O(o));
    };
    // Re-MAC'd after the change, so only the rule named is broken.
    let remac = |mut b: [u8; REQUEST_LEN]| {
        let signed: [u8; REQUEST_SIGNED_LEN] = b[..REQUEST_SIGNED_LEN].try_into().unwrap();
        b[REQUEST_SIGNED_LEN..].copy_from_slice(&request_mac(k0, CHALLENGE, &signed));
        b
    };
    // Each breaks one rule of a FETCH request that is otherwise right.
    for (byte, value, name, why) in [
        (
            21,
            1,
            "REQUEST with a non-zero reserved byte",
            "byte 21 (reserved, 20..24) is 1; the MAC is right",
        ),
        (
            7,
            1,
            "REQUEST with non-zero flags",
            "byte 7 (flags) is 1; the MAC is right",
        ),
        (6, 4, "REQUEST with an unknown op", "op 4; the MAC is right"),
        (
            31,
            1,
            "FETCH with a non-zero nonce",
            "the nonce of a FETCH must be zero; the MAC is right",
        ),
    ] {
        let mut b = fetch.encode();
        b[byte] = value;
        ch(name, why, "REQUEST", &remac(b), vec![]);
    }
    let mut b = up.encode();
    b[63] ^= 0x01;
    ch(
        "REQUEST with a flipped MAC",
        "the request MAC's last bit is flipped",
        "REQUEST",
        &b,
        vec![],
    );
    let mut b = up.encode();
    b[0] = b'X';
    ch(
        "REQUEST with bad magic",
        "the first four bytes are not RFCK",
        "REQUEST",
        &remac(b),
        vec![],
    );
    let mut b = hello().encode();
    b[4] = 1;
    ch(
        "HELLO of version 1",
        "channel version 1 is not spoken",
        "HELLO",
        &b,
        vec![],
    );
    let mut b = Reply::signed(Answer::Stored(stored()), k0, CHALLENGE, &up.mac).encode();
    b[87] ^= 0x01;
    ch(
        "REPLY with a flipped MAC",
        "the reply MAC's last bit is flipped",
        "REPLY",
        &b,
        vec![("request_mac", h(up.mac))],
    );
    let mut b = Reply::signed(Answer::Continue, k0, CHALLENGE, &up.mac).encode();
    b[30] = 1;
    let signed: [u8; REPLY_SIGNED_LEN] = b[..REPLY_SIGNED_LEN].try_into().unwrap();
    let mac = reply_mac(k0, CHALLENGE, &up.mac, &signed);
    b[REPLY_SIGNED_LEN..].copy_from_slice(&mac);
    ch(
        "CONTINUE with a tick",
        "the tick of a CONTINUE must be zero; the MAC is right",
        "REPLY",
        &b,
        vec![("request_mac", h(up.mac))],
    );
    v
}

fn build() -> String {
    let tk = token_keys();
    let tokens = claims()
        .iter()
        .zip(&tk)
        .map(|(c, (t, k))| {
            J::O(vec![
                ("player", u(c.player)),
                ("group", u(c.group)),
                ("reflector", u(c.reflector)),
                ("expires_unix_s", u(c.expires_unix_s)),
                ("token", h(t)),
                ("session_key", h(k.session)),
                ("mac_key", h(k.mac_key())),
                ("tag_key", h(k.tag_key())),
            ])
        })
        .collect();
    let cookies = cookie_cases()
        .iter()
        .map(|(addr, player)| {
            let a: SocketAddr = addr.parse().expect("a fixed address");
            J::O(vec![
                ("address", s(addr)),
                ("group", u(GROUP)),
                ("player", u(*player)),
                ("slot", u(NOW_UNIX_MS / COOKIE_SLOT_MS)),
                ("cookie", h(make_cookie(&cookie_key(), &a, GROUP, *player, NOW_UNIX_MS))),
            ])
        })
        .collect();
    let root = J::O(vec![
        ("secret", h(secret_bytes())),
        ("cookie_key", h(cookie_key_bytes())),
        ("now_unix_ms", u(NOW_UNIX_MS)),
        ("tokens", J::A(tokens)),
        ("cookies", J::A(cookies)),
        ("datagrams", J::A(datagrams(&tk))),
        ("channel", channel(&tk)),
        ("invalid", J::A(invalid(&tk))),
        ("areas", areas()),
        ("sealed", sealed_section(&tk)),
    ]);
    let mut out = serde_json::to_string_pretty(&root).expect("serialisable");
    out.push('\n');
    out
}

/// Areas of interest: grids whose cells are labelled with their group
/// (row-major), a center and a radius; the covered cells in order and the
/// cells the answer grants (docs/protocol.md, "Area of interest").
fn areas() -> J {
    // (grid, group of cell index i, center, radius)
    type GroupOf = fn(u32) -> u32;
    let cases: [([u32; 2], GroupOf, [u32; 2], u32); 6] = [
        // Three groups round-robin, as the control server's default assigns.
        ([4, 2], |i| i % 3, [1, 0], 1),
        // Four groups in blocks; the 5 x 5 square around the middle.
        ([5, 5], |i| i * 4 / 25, [2, 2], 2),
        // A corner, the square cut at two edges; groups of 2 x 2 cells, so
        // the nearest ring adds nothing and the next one three groups.
        ([6, 4], |i| (i % 6) / 2 + (i / 6) / 2 * 3, [5, 3], 2),
        // Every cell its own group: every covered cell is granted.
        ([3, 3], |i| i, [0, 0], 2),
        // One group for the whole world: nothing more to grant.
        ([3, 2], |_| 0, [1, 1], 2),
        // Radius 0 is the plain join.
        ([4, 4], |i| i, [2, 1], 0),
    ];
    let cell = |c: [u32; 2]| J::A(vec![u(c[0]), u(c[1])]);
    J::A(
        cases
            .iter()
            .map(|&(grid, group_of, center, radius)| {
                let label = |c: [u32; 2]| group_of(c[1] * grid[0] + c[0]);
                let groups = (0..grid[0] * grid[1])
                    .map(|i| s(&format!("g{}", group_of(i))))
                    .collect();
                let covered = reflector_proto::control::area_cells(grid, center, radius);
                let granted = reflector_proto::control::area_grant_cells(grid, center, radius, label);
                J::O(vec![
                    ("grid", J::A(vec![u(grid[0]), u(grid[1])])),
                    ("groups", J::A(groups)),
                    ("center", cell(center)),
                    ("radius", u(radius)),
                    ("cells", J::A(covered.into_iter().map(cell).collect())),
                    ("granted", J::A(granted.into_iter().map(cell).collect())),
                ])
            })
            .collect(),
    )
}

// ---------------------------------------------------------------------------
// Sealed payloads (docs/protocol.md, "Sealed payloads").

const WORLD: &str = "vector world";
const EPOCH_LENGTH_S: u64 = 600;
const JITTER_BOUND_S: u64 = 60;
const INSTANCE_B: u64 = 0x0a1b_2c3d_4e5f_6071;
const GAME_DATA: &[u8] = b"player 1001 at 12.5,34.0 heading 90";

fn master_bytes() -> [u8; 32] {
    core::array::from_fn(|i| 0xc0 + i as u8)
}

fn master() -> MasterSecret {
    MasterSecret::new(&master_bytes()).expect("32 bytes")
}

fn schedule() -> Schedule {
    Schedule::new(EPOCH_LENGTH_S, JITTER_BOUND_S).expect("a valid schedule")
}

fn cell_at(column: u32, row: u32) -> CellId {
    CellId::new(WorldId::from_name(WORLD), column, row).expect("in range")
}

/// The epoch current at the vectors' clock.
fn epoch_now() -> u32 {
    u32::try_from(NOW_S / EPOCH_LENGTH_S).expect("fits 32 bits")
}

/// The receiver's epoch keys: (cell, epoch).
fn sealed_cells() -> [([u32; 2], u32); 3] {
    let e = epoch_now();
    [([3, 1], e), ([3, 1], e + 1), ([0, 2], e)]
}

/// The senders: (index in `sealed_cells`, player, instance).
fn sealed_senders() -> [(usize, u32, u64); 3] {
    [
        (0, PLAYER_A, INSTANCE),
        (0, PLAYER_B, INSTANCE_B),
        (1, PLAYER_A, INSTANCE),
    ]
}

fn epoch_key_at(i: usize) -> EpochKey {
    let ([column, row], epoch) = sealed_cells()[i];
    master().epoch_key(cell_at(column, row), epoch)
}

fn sender_key_at(i: usize) -> SenderKey {
    let (c, player, instance) = sealed_senders()[i];
    epoch_key_at(c).sender_key(player, instance)
}

/// A sealed DATA of sender `sender` (an index in `sealed_senders`).
fn sealed_data(sender: usize, membership: u32, seq: u64, game: &[u8], tags: Option<&SessionKeys>) -> Vec<u8> {
    let (_, player, _) = sealed_senders()[sender];
    let mut buf = vec![0u8; SEALED_MIN + game.len()];
    buf[sealed::field::CIPHERTEXT..][..game.len()].copy_from_slice(game);
    let n = sender_key_at(sender)
        .seal(&header(Kind::Data, player, membership, seq), game.len(), tags, &mut buf)
        .expect("seals");
    buf.truncate(n);
    buf
}

/// (name, keys, tags, sender, hex, Ok(game data) or Err((reject, why))).
type SealedCase = (
    &'static str,
    Option<usize>,
    bool,
    usize,
    Vec<u8>,
    Result<Vec<u8>, (&'static str, &'static str)>,
);

fn sealed_cases(tk: &[([u8; TOKEN_LEN], SessionKeys)]) -> Vec<SealedCase> {
    let sent = sealed_data(0, MEMBERSHIP, 77, GAME_DATA, Some(&tk[0].1));
    let mut received = sent.clone();
    received[24..32].fill(0);
    let altered = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = received.clone();
        f(&mut d);
        d
    };
    let mut clear = vec![0u8; 40 + 8];
    clear[32..40].copy_from_slice(&INSTANCE.to_be_bytes());
    clear[40..].copy_from_slice(b"in clear");
    let clear = {
        let n = reflector_proto::protocol::emit_in_place(
            &header(Kind::Data, PLAYER_A, MEMBERSHIP, 79),
            clear.len(),
            None,
            &mut clear,
        )
        .expect("a DATA");
        clear[..n].to_vec()
    };
    vec![
        (
            "sealed DATA as sent, tagged",
            Some(0),
            true,
            0,
            sent.clone(),
            Ok(GAME_DATA.to_vec()),
        ),
        (
            "the same as members receive it (tag zeroed)",
            None,
            false,
            0,
            received.clone(),
            Ok(GAME_DATA.to_vec()),
        ),
        (
            "player B, empty game data, no tags",
            None,
            false,
            1,
            sealed_data(1, 0x0bad_cafe, 5, b"", None),
            Ok(Vec::new()),
        ),
        (
            "player A in the next epoch, tagged",
            Some(0),
            true,
            2,
            sealed_data(2, MEMBERSHIP, 78, b"after the rotation", Some(&tk[0].1)),
            Ok(b"after the rotation".to_vec()),
        ),
        (
            "one ciphertext byte altered",
            None,
            false,
            0,
            altered(&|d| d[60] ^= 0x01),
            Err(("sealed_bad", "the ciphertext changed on the path")),
        ),
        (
            "the AEAD tag altered",
            None,
            false,
            0,
            altered(&|d| {
                let n = d.len();
                d[n - 1] ^= 0x80
            }),
            Err(("sealed_bad", "the last byte of the AEAD tag changed")),
        ),
        (
            "the header's membership id altered",
            None,
            false,
            0,
            altered(&|d| d[15] ^= 0x01),
            Err(("sealed_bad", "the header is associated data")),
        ),
        (
            "the header's player changed to B",
            None,
            false,
            0,
            altered(&|d| d[8..12].copy_from_slice(&PLAYER_B.to_be_bytes())),
            Err(("sealed_bad", "player B's sender key does not open player A's datagram")),
        ),
        (
            "the cell id changed to another cell the receiver holds",
            None,
            false,
            0,
            altered(&|d| d[48..56].copy_from_slice(&cell_at(0, 2).0)),
            Err(("sealed_bad", "that cell's key does not open it")),
        ),
        (
            "an epoch the receiver holds no key for",
            None,
            false,
            0,
            altered(&|d| d[44..48].copy_from_slice(&(epoch_now() + 2).to_be_bytes())),
            Err(("sealed_no_key", "refused before any AEAD work")),
        ),
        (
            "sealed version 1",
            None,
            false,
            0,
            altered(&|d| d[40] = 1),
            Err((
                "sealed_version",
                "version 1 (ChaCha20-Poly1305) was withdrawn: this revision serves sealed version 2 only",
            )),
        ),
        (
            "a clear DATA in a sealed group",
            None,
            false,
            0,
            clear,
            Err((
                "sealed_malformed",
                "48 bytes: shorter than the smallest sealed DATA (72)",
            )),
        ),
    ]
}

fn sealed_section(tk: &[([u8; TOKEN_LEN], SessionKeys)]) -> J {
    let m = master();
    let cells = sealed_cells()
        .iter()
        .enumerate()
        .map(|(i, &([column, row], epoch))| {
            let c = cell_at(column, row);
            J::O(vec![
                ("cell", J::A(vec![u(column), u(row)])),
                ("cell_id", h(c.0)),
                ("epoch", u(epoch)),
                ("epoch_key", h(epoch_key_at(i).as_bytes())),
                ("jitter", u(m.jitter(c, epoch, JITTER_BOUND_S))),
                ("starts_unix_s", u(schedule().start(&m, c, epoch))),
            ])
        })
        .collect();
    let senders = sealed_senders()
        .iter()
        .map(|&(c, player, instance)| {
            let ek = epoch_key_at(c);
            J::O(vec![
                ("cell_id", h(ek.cell().0)),
                ("epoch", u(ek.epoch())),
                ("player", u(player)),
                ("instance", u(instance)),
                ("sender_key", h(ek.sender_key_bytes(player, instance))),
            ])
        })
        .collect();
    let datagrams = sealed_cases(tk)
        .into_iter()
        .map(|(name, keys, tags, sender, bytes, outcome)| {
            let mut o = vec![
                ("name", s(name)),
                ("keys", keys_of(keys)),
                ("tags", J::B(tags)),
                ("sender", u(sender as u64)),
                ("hex", h(&bytes)),
            ];
            match outcome {
                Ok(game) => o.push(("game_data", h(game))),
                Err((reject, why)) => {
                    o.push(("reject", s(reject)));
                    o.push(("why", s(why)));
                }
            }
            J::O(o)
        })
        .collect();
    J::O(vec![
        ("master_secret", h(master_bytes())),
        ("world", s(WORLD)),
        ("world_id", h(WorldId::from_name(WORLD).0)),
        ("epoch_length_s", u(EPOCH_LENGTH_S)),
        ("jitter_bound_s", u(JITTER_BOUND_S)),
        ("cells", J::A(cells)),
        ("senders", J::A(senders)),
        ("datagrams", J::A(datagrams)),
        (
            "keys_request",
            J::O(vec![
                ("keys", u(0u64)),
                ("token", h(tk[0].0)),
                ("at_unix_s", u(NOW_S)),
                ("mac", h(sealed::keys_request_mac(&tk[0].1, &tk[0].0, NOW_S))),
            ]),
        ),
        ("keys_answers", J::A(keys_answers())),
        ("checkpoints", checkpoints_section()),
    ])
}

/// The cells of the `keys` answers: those of `sealed_cells`.
const ANSWER_CELLS: [[u32; 2]; 2] = [[3, 1], [0, 2]];

/// When the `keys` answers are made: mid-epoch (one key per cell), and 30 s
/// into the overlap window before cell (3, 1)'s next epoch (two for it).
fn keys_answer_times() -> [(&'static str, u64); 2] {
    let (m, c) = (master(), cell_at(3, 1));
    let e = schedule().current_epoch(&m, c, NOW_S + 300);
    let window = schedule().start(&m, c, e + 1) - sealed::OVERLAP_S;
    [
        ("mid-epoch", NOW_S + 300),
        ("inside the overlap window of (3, 1)", window + 30),
    ]
}

/// A `keys` array as the control server answers it at `at` for `cells`.
fn keys_answer(at: u64, cells: &[[u32; 2]]) -> Vec<J> {
    let (m, sch) = (master(), schedule());
    let mut out = Vec::new();
    for &[column, row] in cells {
        let c = cell_at(column, row);
        let (current, next) = sch.handed_out(&m, c, at);
        for e in std::iter::once(current).chain(next) {
            out.push(J::O(vec![
                ("cell", J::A(vec![u(column), u(row)])),
                ("cell_id", h(c.0)),
                ("epoch", u(e)),
                ("key", h(m.epoch_key(c, e).as_bytes())),
                ("starts_unix_s", u(sch.start(&m, c, e))),
                ("ends_unix_s", u(sch.start(&m, c, e + 1))),
            ]));
        }
    }
    out
}

fn keys_answers() -> Vec<J> {
    keys_answer_times()
        .iter()
        .map(|&(name, at)| {
            J::O(vec![
                ("name", s(name)),
                ("at_unix_s", u(at)),
                (
                    "cells",
                    J::A(ANSWER_CELLS.iter().map(|&[c, r]| J::A(vec![u(c), u(r)])).collect()),
                ),
                ("keys", J::A(keys_answer(at, &ANSWER_CELLS))),
            ])
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Sealed checkpoints (docs/protocol.md, "Sealed checkpoints").

/// The cells of the joiner's group: it holds the keys of `sealed_cells` for
/// these only (cell (0, 2)'s key it holds is another group's).
const GROUP_CELLS: [[u32; 2]; 1] = [[3, 1]];
const CHECKPOINT_AGE_MS: u64 = 700;

fn control_signer() -> ControlSigner {
    ControlSigner::derive(&master(), WorldId::from_name(WORLD))
}

/// The players: (player id, Ed25519 seed); their certificates expire with
/// token 0.
fn checkpoint_players() -> [(u32, [u8; 32]); 2] {
    [
        (PLAYER_A, core::array::from_fn(|i| 0xa0 + i as u8)),
        (PLAYER_B, core::array::from_fn(|i| 0x10 + 3 * i as u8)),
    ]
}

fn cert_expiry() -> u64 {
    claims()[0].expires_unix_s
}

fn player_key(i: usize) -> PlayerKey {
    PlayerKey::from_seed(&checkpoint_players()[i].1)
}

fn certificate(i: usize) -> ckpt::Certificate {
    control_signer().certify(checkpoint_players()[i].0, &player_key(i).public_key(), cert_expiry())
}

/// The epoch keys the joiner holds for its group's cells.
fn group_keys() -> Vec<EpochKey> {
    (0..sealed_cells().len())
        .filter(|&i| GROUP_CELLS.contains(&sealed_cells()[i].0))
        .map(epoch_key_at)
        .collect()
}

fn reply_for(player: u32) -> FetchedReply {
    FetchedReply {
        tick: TICK,
        from_player: player,
        age_ms: CHECKPOINT_AGE_MS,
        received_unix_ms: NOW_UNIX_MS,
    }
}

struct CheckpointCase {
    name: &'static str,
    signer: usize,
    instance: u64,
    envelope: Vec<u8>,
    reply: FetchedReply,
    /// Ok(state, the key it is sealed under) or Err((refusal, why)).
    outcome: Result<(Vec<u8>, EpochKey), (CheckpointRefusal, &'static str)>,
}

fn checkpoint_cases() -> Vec<CheckpointCase> {
    let e = epoch_now();
    let seal = |signer: usize, cert: &ckpt::Certificate, key: &EpochKey, instance: u64, seq: u64, state: &[u8]| {
        let info = UploadInfo {
            tick: TICK,
            instance,
            sequence: seq,
        };
        seal_checkpoint(&player_key(signer), cert, key, info, state).expect("seals")
    };
    let resign = |signer: usize, mut env: Vec<u8>| {
        player_key(signer).sign_envelope(&mut env);
        env
    };
    let ours = epoch_key_at(0);
    let next = epoch_key_at(1);
    let a = seal(0, &certificate(0), &ours, INSTANCE, 100, STATE);
    let case = |name, signer, instance, envelope, reply, outcome| CheckpointCase {
        name,
        signer,
        instance,
        envelope,
        reply,
        outcome,
    };
    let refused = |r: CheckpointRefusal, why: &'static str| Err((r, why));
    let mut version1 = a.clone();
    version1[ckpt::field::VERSION] = 1;
    let mut flipped = a.clone();
    let n = flipped.len();
    flipped[n - 40] ^= 0x04;
    let mut garbage = a.clone();
    for (i, b) in garbage[ckpt::field::STATE..n - ckpt::SIGNATURE_LEN]
        .iter_mut()
        .enumerate()
    {
        *b = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
    let foreign = ControlSigner::derive(&master(), WorldId::from_name("another world")).certify(
        PLAYER_A,
        &player_key(0).public_key(),
        cert_expiry(),
    );
    let b_state: &[u8] = b"";
    vec![
        case(
            "player A's checkpoint at tick 4242",
            0,
            INSTANCE,
            a.clone(),
            reply_for(PLAYER_A),
            Ok((STATE.to_vec(), ours.clone())),
        ),
        case(
            "player B's empty checkpoint under the next epoch (sealed inside the overlap window)",
            1,
            INSTANCE_B,
            seal(1, &certificate(1), &next, INSTANCE_B, 9, b_state),
            reply_for(PLAYER_B),
            Ok((b_state.to_vec(), next.clone())),
        ),
        case(
            "231 bytes",
            0,
            INSTANCE,
            a[..ckpt::ENVELOPE_OVERHEAD - 1].to_vec(),
            reply_for(PLAYER_A),
            refused(CheckpointRefusal::Malformed, "shorter than the smallest envelope (232)"),
        ),
        case(
            "envelope version 1, signed",
            0,
            INSTANCE,
            resign(0, version1),
            reply_for(PLAYER_A),
            refused(
                CheckpointRefusal::Version,
                "version 1 (ChaCha20-Poly1305) was withdrawn: this revision serves envelope version 2 only",
            ),
        ),
        case(
            "another group's checkpoint, signed by a certified player",
            0,
            INSTANCE,
            seal(0, &certificate(0), &epoch_key_at(2), INSTANCE, 101, STATE),
            reply_for(PLAYER_A),
            refused(
                CheckpointRefusal::WrongCell,
                "cell (0, 2) is not the group's, though the joiner holds its key",
            ),
        ),
        case(
            "the REPLY names another tick",
            0,
            INSTANCE,
            a.clone(),
            FetchedReply {
                tick: TICK + 1,
                ..reply_for(PLAYER_A)
            },
            refused(CheckpointRefusal::Mismatch, "the REPLY's tick is not the envelope's"),
        ),
        case(
            "a certificate from another world's control key",
            0,
            INSTANCE,
            seal(0, &foreign, &ours, INSTANCE, 102, STATE),
            reply_for(PLAYER_A),
            refused(
                CheckpointRefusal::BadCertificate,
                "it does not verify under this world's control_public",
            ),
        ),
        case(
            "the certificate had expired when the state was uploaded",
            0,
            INSTANCE,
            a.clone(),
            FetchedReply {
                received_unix_ms: cert_expiry() * 1000 + CHECKPOINT_AGE_MS,
                ..reply_for(PLAYER_A)
            },
            refused(
                CheckpointRefusal::ExpiredCertificate,
                "REPLY time minus age is the expiry itself",
            ),
        ),
        case(
            "one signature bit flipped",
            0,
            INSTANCE,
            flipped,
            reply_for(PLAYER_A),
            refused(CheckpointRefusal::BadSignature, "the signature no longer verifies"),
        ),
        case(
            "an epoch the joiner holds no key for, signed",
            0,
            INSTANCE,
            seal(
                0,
                &certificate(0),
                &master().epoch_key(ours.cell(), e + 2),
                INSTANCE,
                103,
                STATE,
            ),
            reply_for(PLAYER_A),
            refused(CheckpointRefusal::NoKey, "refused before any AEAD work"),
        ),
        case(
            "a garbage state signed by a certified player",
            0,
            INSTANCE,
            resign(0, garbage),
            reply_for(PLAYER_A),
            refused(CheckpointRefusal::Bad, "it does not open under the checkpoint key"),
        ),
    ]
}

fn checkpoints_section() -> J {
    let signer = control_signer();
    let players = checkpoint_players()
        .iter()
        .enumerate()
        .map(|(i, (player, seed))| {
            J::O(vec![
                ("player", u(*player)),
                ("seed", h(seed)),
                ("public_key", h(player_key(i).public_key())),
                ("expires_unix_s", u(cert_expiry())),
                ("certificate", h(certificate(i).signature)),
            ])
        })
        .collect();
    let (public, keys) = (signer.public_key(), group_keys());
    let envelopes = checkpoint_cases()
        .into_iter()
        .map(|c| {
            // Each case is what the crate's checks say, before it is written.
            let view = JoinerView {
                control_public: &public,
                group_keys: &keys,
            };
            let judged = open_checkpoint(&mut c.envelope.clone(), &c.reply, &view).map(|_| ());
            assert_eq!(
                judged,
                c.outcome.as_ref().map(|_| ()).map_err(|(r, _)| *r),
                "{}",
                c.name
            );
            let mut o = vec![
                ("name", s(c.name)),
                ("signer", u(c.signer as u64)),
                ("instance", u(c.instance)),
                ("hex", h(&c.envelope)),
                ("reply_tick", u(c.reply.tick)),
                ("reply_from_player", u(c.reply.from_player)),
                ("reply_unix_ms", u(c.reply.received_unix_ms)),
                ("age_ms", u(c.reply.age_ms)),
            ];
            match c.outcome {
                Ok((state, key)) => {
                    let player = checkpoint_players()[c.signer].0;
                    o.push(("state", h(state)));
                    o.push((
                        "checkpoint_key",
                        h(ckpt::checkpoint_key_bytes(&key, player, c.instance)),
                    ));
                }
                Err((r, why)) => {
                    o.push(("reject", s(r.counter())));
                    o.push(("why", s(why)));
                }
            }
            J::O(o)
        })
        .collect();
    J::O(vec![
        ("control_seed", h(signer.seed())),
        ("control_public", h(signer.public_key())),
        (
            "group_cells",
            J::A(GROUP_CELLS.iter().map(|&[c, r]| J::A(vec![u(c), u(r)])).collect()),
        ),
        ("players", J::A(players)),
        ("envelopes", J::A(envelopes)),
    ])
}

fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol-vectors.json")
}

#[test]
fn the_committed_vectors_are_what_the_code_makes() {
    let want = build();
    if std::env::var_os("REGENERATE_VECTORS").is_some_and(|v| v == "1") {
        std::fs::write(path(), &want).expect("write docs/protocol-vectors.json");
        return;
    }
    let have =
        std::fs::read_to_string(path()).expect("docs/protocol-vectors.json exists (REGENERATE_VECTORS=1 makes it)");
    if have != want {
        let line = have.lines().zip(want.lines()).position(|(a, b)| a != b);
        panic!(
            "docs/protocol-vectors.json differs from what the code makes (first differing line: {:?}); \
             if the change is intended, run REGENERATE_VECTORS=1 cargo test -p reflector-proto --test vectors \
             and review the diff",
            line.map(|l| l + 1)
        );
    }
}

// ---------------------------------------------------------------------------
// Checking the committed file with the crate's API.

fn load() -> Value {
    let text = std::fs::read_to_string(path()).expect("docs/protocol-vectors.json exists");
    serde_json::from_str(&text).expect("valid JSON")
}

fn num(v: &Value, f: &str) -> u64 {
    v[f].as_u64().unwrap_or_else(|| panic!("{f} is not a number in {v}"))
}

fn bytes(v: &Value, f: &str) -> Vec<u8> {
    let t = v[f].as_str().unwrap_or_else(|| panic!("{f} is not a string in {v}"));
    hex::decode(t).unwrap_or_else(|e| panic!("{f} is not hex: {e}"))
}

fn arr<const N: usize>(v: &Value, f: &str) -> [u8; N] {
    bytes(v, f)
        .try_into()
        .unwrap_or_else(|_| panic!("{f} is not {N} bytes in {v}"))
}

fn list<'a>(v: &'a Value, f: &str) -> &'a Vec<Value> {
    let l = v[f].as_array().unwrap_or_else(|| panic!("section {f} is missing"));
    assert!(!l.is_empty(), "section {f} is empty");
    l
}

fn keys_at(file: &Value, e: &Value) -> Option<SessionKeys> {
    e["keys"]
        .as_u64()
        .map(|i| SessionKeys::from_session(arr(&file["tokens"][i as usize], "session_key")))
}

#[test]
fn tokens_keys_and_cookies_verify() {
    let f = load();
    let sec = Secret::new(&bytes(&f, "secret")).unwrap();
    let ck = Secret::new(&bytes(&f, "cookie_key")).unwrap();
    let now = num(&f, "now_unix_ms");
    for t in list(&f, "tokens") {
        let token: [u8; TOKEN_LEN] = arr(t, "token");
        let claims = TokenClaims {
            player: num(t, "player") as u32,
            group: num(t, "group") as u16,
            reflector: num(t, "reflector") as u16,
            expires_unix_s: num(t, "expires_unix_s"),
        };
        assert_eq!(claims.sign(&sec), token);
        assert_eq!(
            verify_token(&sec, &token, claims.reflector, claims.group, claims.player, now),
            Ok(claims)
        );
        let k = SessionKeys::derive(&sec, &token);
        assert_eq!(k.session, arr::<32>(t, "session_key"));
        assert_eq!(k.mac_key(), &arr::<32>(t, "mac_key"));
        assert_eq!(k.tag_key(), &arr::<16>(t, "tag_key"));
    }
    let mut families = std::collections::HashSet::new();
    for c in list(&f, "cookies") {
        let a: SocketAddr = c["address"].as_str().unwrap().parse().unwrap();
        families.insert(a.is_ipv4());
        assert_eq!(num(c, "slot"), now / COOKIE_SLOT_MS);
        let (g, p) = (num(c, "group") as u16, num(c, "player") as u32);
        let cookie: [u8; 16] = arr(c, "cookie");
        assert_eq!(make_cookie(&ck, &a, g, p, now), cookie);
        assert!(check_cookie(&ck, &cookie, &a, g, p, now));
    }
    assert_eq!(families.len(), 2, "an IPv4 and an IPv6 cookie");
}

#[test]
fn every_datagram_parses_to_its_fields_and_verifies() {
    let f = load();
    let mut kinds = std::collections::HashSet::new();
    for e in list(&f, "datagrams") {
        let name = e["name"].as_str().unwrap();
        let b = bytes(e, "hex");
        if e.get("version").and_then(Value::as_u64) == Some(1) {
            assert_eq!(
                version1_error(&bytes(e, "request")).map(|x| x.to_vec()),
                Some(b.clone()),
                "{name}"
            );
            assert_eq!(
                (b[3], u16::from_be_bytes([b[16], b[17]])),
                (num(e, "type") as u8, num(e, "code") as u16)
            );
            continue;
        }
        let p = Packet::parse(&b[..]).unwrap_or_else(|err| panic!("{name}: {err}"));
        kinds.insert(p.kind());
        let keys = keys_at(&f, e);
        let obj = e.as_object().unwrap();
        for (field, v) in obj {
            let n = || v.as_u64().unwrap();
            match field.as_str() {
                "name" | "hex" | "keys" | "code_name" | "reason_name" | "token_index" => {}
                "type" => assert_eq!(p.kind() as u8 as u64, n(), "{name}"),
                "group" => assert_eq!(u64::from(p.group()), n(), "{name}"),
                "player" => assert_eq!(u64::from(p.sender()), n(), "{name}"),
                "membership" => assert_eq!(u64::from(p.membership()), n(), "{name}"),
                "sequence" => assert_eq!(p.seq(), n(), "{name}"),
                "token" => assert_eq!(p.join_token().map(|t| t.to_vec()), Some(bytes(e, "token")), "{name}"),
                "cookie" => assert_eq!(
                    p.join_cookie().or(p.challenge_cookie()).map(|c| c.to_vec()),
                    Some(bytes(e, "cookie")),
                    "{name}"
                ),
                "renewal" => assert_eq!(p.is_renewal(), v.as_bool().unwrap(), "{name}"),
                "members" => assert_eq!(u64::from(p.join_ack().unwrap().members), n()),
                "keepalive_ms" => assert_eq!(u64::from(p.join_ack().unwrap().keepalive_ms), n()),
                "flags" => assert_eq!(u64::from(p.join_ack().unwrap().flags), n()),
                "checkpoint_port" => assert_eq!(u64::from(p.join_ack().unwrap().checkpoint_port), n()),
                "code" => assert_eq!(p.error_code().unwrap().map(|c| c as u16), Ok(n() as u16), "{name}"),
                "nonce" => assert_eq!(p.nonce(), Some(n()), "{name}"),
                "reason" => assert_eq!(p.moved().unwrap().reason.map(|r| r as u16), Ok(n() as u16)),
                "within_ms" => assert_eq!(u64::from(p.moved().unwrap().within_ms), n()),
                "tag" => assert_eq!(p.tag(), Some(n()), "{name}"),
                "tags" => {}
                "payload" => assert_eq!(p.payload(), &bytes(e, "payload")[..], "{name}"),
                "instance" => assert_eq!(&p.payload()[..INSTANCE_LEN], &n().to_be_bytes(), "{name}"),
                other => panic!("{name}: field {other} is not checked here"),
            }
        }
        match p.kind().auth() {
            Auth::Mac | Auth::ShortMac => {
                let k = keys.unwrap_or_else(|| panic!("{name}: a MAC'd type needs keys"));
                assert!(k.verify(&p), "{name}: MAC");
            }
            Auth::Tag if e["tags"].as_bool() == Some(true) => {
                assert!(keys.unwrap().verify_tag(&p), "{name}: tag");
            }
            Auth::Tag => assert_eq!(p.tag(), Some(0), "{name}: tags off"),
            Auth::None => assert!(keys.is_none(), "{name}"),
        }
    }
    assert_eq!(kinds.len(), Kind::ALL.len(), "every type has a vector");
}

#[test]
fn every_channel_message_decodes_to_its_fields_and_its_macs_and_digests_verify() {
    let f = load();
    let ch = &f["channel"];
    let k = keys_at(&f, ch).expect("channel keys");
    let challenge = num(ch, "challenge");
    let mut statuses = std::collections::HashSet::new();
    let mut ops = std::collections::HashSet::new();
    for m in list(ch, "messages") {
        let name = m["name"].as_str().unwrap();
        let b = bytes(m, "hex");
        if name == "HELLO" {
            let hl = Hello::decode(&b[..].try_into().expect("32 bytes")).unwrap();
            assert_eq!(b.len(), HELLO_LEN);
            assert_eq!(
                (hl.challenge, hl.max_state, u64::from(hl.hello_deadline_ms)),
                (challenge, num(m, "max_state"), num(m, "hello_deadline_ms"))
            );
            assert_eq!(num(m, "challenge"), challenge);
        } else if name.starts_with("REQUEST") {
            let r = Request::decode(&b[..].try_into().expect("64 bytes")).unwrap();
            ops.insert(r.op);
            assert!(r.verify(&k, challenge), "{name}");
            assert_eq!(
                (
                    r.op as u8 as u64,
                    u64::from(r.group),
                    u64::from(r.player),
                    u64::from(r.membership)
                ),
                (num(m, "op"), num(m, "group"), num(m, "player"), num(m, "membership"))
            );
            assert_eq!(
                (r.nonce, r.body_len, r.tick),
                (num(m, "nonce"), num(m, "body_length"), num(m, "tick"))
            );
            assert_eq!(r.mac, arr::<16>(m, "mac"));
        } else if name == "body MAC" {
            let req_mac: [u8; 16] = arr(m, "request_mac");
            assert_eq!(
                body_mac(&k, challenge, &req_mac, &bytes(m, "state")).to_vec(),
                b,
                "{name}"
            );
        } else {
            assert!(name.starts_with("REPLY"), "{name}");
            assert_eq!(b.len(), REPLY_LEN);
            let r = Reply::decode(&b[..].try_into().unwrap()).unwrap();
            statuses.insert(r.answer.status());
            let req_mac: [u8; 16] = arr(m, "request_mac");
            assert_eq!(r.answer.status() as u8 as u64, num(m, "status"));
            assert_eq!(r.mac, arr::<16>(m, "mac"));
            if m["authenticated"].as_bool().unwrap() {
                assert!(r.verify(&k, challenge, &req_mac), "{name}");
            } else {
                assert!(r.is_unauthenticated(), "{name}");
                assert!(matches!(r.answer, Answer::Refused(_)), "{name}");
            }
            let (refusal, st, body_len, age) = match r.answer {
                Answer::Refused(c) => (c as u8, None, 0, 0),
                Answer::Stored(st) => (0, Some(st), 0, 0),
                Answer::Checkpoint {
                    stored,
                    body_len,
                    age_ms,
                } => (0, Some(stored), body_len, age_ms),
                Answer::Continue | Answer::Empty => (0, None, 0, 0),
            };
            assert_eq!(u64::from(refusal), num(m, "refusal"));
            assert_eq!((body_len, u64::from(age)), (num(m, "body_length"), num(m, "age_ms")));
            let digest_field: [u8; 32] = arr(m, "digest");
            match st {
                Some(st) => {
                    assert_eq!(
                        (st.number, st.tick, u64::from(st.from_player), st.digest),
                        (
                            num(m, "checkpoint"),
                            num(m, "tick"),
                            num(m, "from_player"),
                            digest_field
                        )
                    );
                    let state = bytes(m, "state");
                    assert_eq!(digest(&state), st.digest, "{name}: the state's SHA-256");
                    if r.answer.status() == Status::Checkpoint {
                        assert_eq!(state.len() as u64, body_len);
                    }
                }
                None => assert_eq!(
                    (
                        num(m, "checkpoint"),
                        num(m, "tick"),
                        num(m, "from_player"),
                        digest_field
                    ),
                    (0, 0, 0, [0; 32])
                ),
            }
        }
    }
    assert_eq!(ops.len(), Op::ALL.len(), "a REQUEST for each op");
    assert_eq!(statuses.len(), Status::ALL.len(), "a REPLY for each status");
}

#[test]
fn every_invalid_entry_is_rejected() {
    let f = load();
    let challenge = num(&f["channel"], "challenge");
    for e in list(&f, "invalid") {
        let name = e["name"].as_str().unwrap();
        assert!(e["why"].as_str().is_some_and(|w| !w.is_empty()), "{name}: why");
        let b = bytes(e, "hex");
        let k = keys_at(&f, e).expect("keys");
        let rejected = match e["kind"].as_str() {
            Some("datagram") => match Packet::parse(&b[..]) {
                Err(_) => true,
                Ok(p) => match p.kind().auth() {
                    Auth::Mac | Auth::ShortMac => !k.verify(&p),
                    Auth::Tag => e["tags"].as_bool() == Some(true) && !k.verify_tag(&p),
                    Auth::None => false,
                },
            },
            Some("channel") => match e["message"].as_str() {
                Some("HELLO") => Hello::decode(&b[..].try_into().unwrap()).is_err(),
                Some("REQUEST") => {
                    Request::decode(&b[..].try_into().unwrap()).map_or(true, |r| !r.verify(&k, challenge))
                }
                Some("REPLY") => {
                    let req_mac: [u8; 16] = arr(e, "request_mac");
                    Reply::decode(&b[..].try_into().unwrap()).map_or(true, |r| !r.verify(&k, challenge, &req_mac))
                }
                other => panic!("{name}: unknown message {other:?}"),
            },
            other => panic!("{name}: unknown kind {other:?}"),
        };
        assert!(rejected, "{name} ({}) was accepted", e["why"]);
    }
}

#[test]
fn the_areas_grant_what_the_crate_grants() {
    let v = load();
    let areas = v["areas"].as_array().expect("an areas list");
    assert!(!areas.is_empty());
    let pair = |c: &Value| -> [u32; 2] {
        let a = c.as_array().expect("a cell is [column, row]");
        [a[0].as_u64().unwrap() as u32, a[1].as_u64().unwrap() as u32]
    };
    for a in areas {
        let grid = pair(&a["grid"]);
        let groups: Vec<&str> = a["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap())
            .collect();
        assert_eq!(groups.len() as u32, grid[0] * grid[1], "one group per cell in {a}");
        let (center, radius) = (pair(&a["center"]), num(a, "radius") as u32);
        let list = |f: &str| a[f].as_array().unwrap().iter().map(pair).collect::<Vec<_>>();
        assert_eq!(
            reflector_proto::control::area_cells(grid, center, radius),
            list("cells"),
            "{a}"
        );
        let granted = reflector_proto::control::area_grant_cells(grid, center, radius, |c| {
            groups[(c[1] * grid[0] + c[0]) as usize]
        });
        assert_eq!(granted, list("granted"), "{a}");
    }
}

#[test]
fn sealed_keys_open_and_rejections_are_what_the_file_says() {
    let file = load();
    let sec = &file["sealed"];
    let master = MasterSecret::new(&bytes(sec, "master_secret")).expect("a master secret");
    let world = WorldId::from_name(sec["world"].as_str().expect("world name"));
    assert_eq!(world.0.to_vec(), bytes(sec, "world_id"));
    let schedule = Schedule::new(num(sec, "epoch_length_s"), num(sec, "jitter_bound_s")).expect("schedule");
    let mut held = Vec::new();
    for c in list(sec, "cells") {
        let at: Vec<u32> = list(c, "cell")
            .iter()
            .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).expect("a coordinate"))
            .collect();
        let cell = CellId::new(world, at[0], at[1]).expect("in range");
        assert_eq!(cell.0.to_vec(), bytes(c, "cell_id"));
        let epoch = u32::try_from(num(c, "epoch")).expect("an epoch fits 32 bits");
        let ek = master.epoch_key(cell, epoch);
        assert_eq!(ek.as_bytes().to_vec(), bytes(c, "epoch_key"));
        assert_eq!(master.jitter(cell, epoch, schedule.jitter_bound_s()), num(c, "jitter"));
        assert_eq!(schedule.start(&master, cell, epoch), num(c, "starts_unix_s"));
        held.push(ek);
    }
    let senders: Vec<(EpochKey, u32, u64)> = list(sec, "senders")
        .iter()
        .map(|s| {
            let ek = held
                .iter()
                .find(|k| k.cell().0.to_vec() == bytes(s, "cell_id") && u64::from(k.epoch()) == num(s, "epoch"))
                .expect("a sender's cell and epoch are in cells")
                .clone();
            let (player, instance) = (num(s, "player") as u32, num(s, "instance"));
            assert_eq!(ek.sender_key_bytes(player, instance).to_vec(), bytes(s, "sender_key"));
            (ek, player, instance)
        })
        .collect();
    let req = &sec["keys_request"];
    let k = keys_at(&file, req).expect("the keys request names its keys");
    let token: [u8; TOKEN_LEN] = arr(req, "token");
    assert_eq!(
        sealed::keys_request_mac(&k, &token, num(req, "at_unix_s")).to_vec(),
        bytes(req, "mac")
    );
    // The keys answers read as the control module's type, and hold, per
    // cell, the epoch current at `at` and, only inside the overlap window,
    // the next one.
    let mut windows = 0;
    for a in list(sec, "keys_answers") {
        let at = num(a, "at_unix_s");
        let keys: Vec<reflector_proto::control::EpochKeyGrant> =
            serde_json::from_value(a["keys"].clone()).expect("keys as the control server answers them");
        let mut want = Vec::new();
        for c in list(a, "cells") {
            let (column, row) = (c[0].as_u64().unwrap() as u32, c[1].as_u64().unwrap() as u32);
            let cell = CellId::new(world, column, row).expect("in range");
            let current = schedule.current_epoch(&master, cell, at);
            assert!(schedule.start(&master, cell, current) <= at && at < schedule.start(&master, cell, current + 1));
            let next_start = schedule.start(&master, cell, current + 1);
            let mut epochs = vec![current];
            if at + sealed::OVERLAP_S >= next_start {
                epochs.push(current + 1);
                windows += 1;
            }
            for e in epochs {
                want.push(reflector_proto::control::EpochKeyGrant {
                    cell: [column, row],
                    cell_id: hex::encode(cell.0),
                    epoch: e,
                    key: hex::encode(master.epoch_key(cell, e).as_bytes()),
                    starts_unix_s: schedule.start(&master, cell, e),
                    ends_unix_s: schedule.start(&master, cell, e + 1),
                });
            }
        }
        assert_eq!(keys, want, "{}", a["name"]);
    }
    assert!(windows > 0, "one answer is inside an overlap window");
    let datagrams = list(sec, "datagrams");
    assert!(datagrams.iter().any(|d| d.get("game_data").is_some()));
    assert!(datagrams.iter().any(|d| d["reject"] == "sealed_bad"));
    for d in datagrams {
        let name = d["name"].as_str().unwrap_or("?");
        let wire = bytes(d, "hex");
        let (ek, player, instance) = &senders[num(d, "sender") as usize];
        // A fresh receiver per datagram: each is judged alone.
        let mut receiver = Receiver::new(8);
        for k in &held {
            receiver.add_epoch_key(k.clone());
        }
        let mut buf = wire.clone();
        match d.get("game_data") {
            Some(_) => {
                let game = receiver.receive(&mut buf).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(buf[game].to_vec(), bytes(d, "game_data"), "{name}");
                let mut again = wire.clone();
                let opened = ek.sender_key(*player, *instance).open(&mut again).expect("opens");
                assert_eq!(again[opened].to_vec(), bytes(d, "game_data"), "{name}");
                if d["tags"] == true {
                    let k = keys_at(&file, d).expect("a tagged datagram names its keys");
                    let p = Packet::parse(&wire[..]).expect("a DATA");
                    assert!(k.verify_tag(&p), "{name}: the DATA tag over the sealed datagram");
                } else {
                    assert_eq!(&wire[24..32], &[0u8; 8], "{name}: untagged");
                }
            }
            None => {
                let err = receiver.receive(&mut buf).expect_err(name);
                assert_eq!(err.counter(), d["reject"], "{name}");
            }
        }
    }
}

#[test]
fn sealed_checkpoints_open_and_refusals_are_what_the_file_says() {
    let file = load();
    let sec = &file["sealed"];
    let ck = &sec["checkpoints"];
    let master = MasterSecret::new(&bytes(sec, "master_secret")).expect("a master secret");
    let world = WorldId::from_name(sec["world"].as_str().expect("world name"));
    let signer = ControlSigner::derive(&master, world);
    assert_eq!(signer.seed().to_vec(), bytes(ck, "control_seed"));
    let control_public: [u8; 32] = arr(ck, "control_public");
    assert_eq!(signer.public_key(), control_public);
    let group: Vec<CellId> = list(ck, "group_cells")
        .iter()
        .map(|c| CellId::new(world, c[0].as_u64().unwrap() as u32, c[1].as_u64().unwrap() as u32).unwrap())
        .collect();
    // The joiner holds the keys of `cells` whose cell is the group's.
    let keys: Vec<EpochKey> = list(sec, "cells")
        .iter()
        .map(|c| {
            let cell = CellId(arr(c, "cell_id"));
            EpochKey::from_bytes(cell, num(c, "epoch") as u32, arr(c, "epoch_key"))
        })
        .filter(|k| group.contains(&k.cell()))
        .collect();
    assert!(!keys.is_empty());
    let players: Vec<(u32, PlayerKey)> = list(ck, "players")
        .iter()
        .map(|p| {
            let key = PlayerKey::from_seed(&arr(p, "seed"));
            assert_eq!(key.public_key().to_vec(), bytes(p, "public_key"));
            let cert = ckpt::Certificate {
                player: num(p, "player") as u32,
                public_key: key.public_key(),
                expires_unix_s: num(p, "expires_unix_s"),
                signature: arr(p, "certificate"),
            };
            assert!(ckpt::verify_certificate(&control_public, world, &cert));
            assert_eq!(signer.certify(cert.player, &cert.public_key, cert.expires_unix_s), cert);
            (cert.player, key)
        })
        .collect();
    let envelopes = list(ck, "envelopes");
    let mut refused = std::collections::HashSet::new();
    for e in envelopes {
        let name = e["name"].as_str().unwrap_or("?");
        let reply = FetchedReply {
            tick: num(e, "reply_tick"),
            from_player: num(e, "reply_from_player") as u32,
            age_ms: num(e, "age_ms"),
            received_unix_ms: num(e, "reply_unix_ms"),
        };
        let mut buf = bytes(e, "hex");
        let view = JoinerView {
            control_public: &control_public,
            group_keys: &keys,
        };
        let got = open_checkpoint(&mut buf, &reply, &view);
        match e.get("state") {
            Some(_) => {
                let o = got.unwrap_or_else(|r| panic!("{name}: refused {}", r.counter()));
                assert_eq!(buf[o.state.clone()].to_vec(), bytes(e, "state"), "{name}");
                let (player, key) = &players[num(e, "signer") as usize];
                assert_eq!(o.player, *player, "{name}");
                let ek = keys
                    .iter()
                    .find(|k| k.cell() == o.cell && k.epoch() == o.epoch)
                    .unwrap();
                assert_eq!(
                    ckpt::checkpoint_key_bytes(ek, o.player, num(e, "instance")).to_vec(),
                    bytes(e, "checkpoint_key"),
                    "{name}"
                );
                // Ed25519 is deterministic: signing again gives the same bytes.
                let mut again = bytes(e, "hex");
                key.sign_envelope(&mut again);
                assert_eq!(again, bytes(e, "hex"), "{name}: the signature");
            }
            None => {
                let r = got.map(|_| ()).expect_err(name);
                assert_eq!(r.counter(), e["reject"], "{name}");
                refused.insert(r);
            }
        }
    }
    // Every refusal is exercised.
    assert_eq!(refused.len(), CheckpointRefusal::ALL.len());
}
