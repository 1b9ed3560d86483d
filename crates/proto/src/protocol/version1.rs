//! What a version-2 reflector answers a version-1 datagram, and the facts
//! the C side (the eBPF program) is generated from.

use super::*;

/// Size of the version-1 ERROR(Version) answer.
pub const VERSION1_ERROR_LEN: usize = 18;

/// The answer to a datagram of protocol version 1: a version-1 ERROR
/// (18 bytes, code [`ErrorCode::Version`]) with the request's group and
/// bytes 8..12, if the request is a version-1 datagram of at least a
/// header's size (a reflector looks at nothing shorter, and a reply is never
/// larger than its request).
pub fn version1_error(request: &[u8]) -> Option<[u8; VERSION1_ERROR_LEN]> {
    if request.len() < HEADER_LEN || be16(&request[field::MAGIC]) != MAGIC || request[field::VERSION] != 1 {
        return None;
    }
    let mut out = [0u8; VERSION1_ERROR_LEN];
    out[0..2].copy_from_slice(&MAGIC.to_be_bytes());
    out[2] = 1;
    out[3] = Kind::Error as u8;
    out[4..6].copy_from_slice(&request[4..6]);
    out[6..8].copy_from_slice(&2u16.to_be_bytes());
    out[8..12].copy_from_slice(&request[8..12]);
    out[16..18].copy_from_slice(&(ErrorCode::Version as u16).to_be_bytes());
    Some(out)
}

/// The protocol's facts a C program needs (the in-kernel fan-out, built by
/// the server's build script), as `#define` lines: the one place they are
/// written is this crate, so the eBPF program cannot drift from it.
pub fn c_defines() -> String {
    let defines: [(&str, usize); 16] = [
        ("PROTO_MAGIC", usize::from(MAGIC)),
        ("PROTO_VERSION", usize::from(VERSION)),
        ("PROTO_DATA", Kind::Data as usize),
        ("PROTO_LEAVE", Kind::Leave as usize),
        ("PROTO_LEAVE_LEN", size::LEAVE),
        ("PROTO_HEADER_LEN", HEADER_LEN),
        ("PROTO_TAG_OFF", TAG.start),
        ("PROTO_DATA_MIN", size::DATA_MIN),
        ("PROTO_OFF_VERSION", field::VERSION),
        ("PROTO_OFF_KIND", field::KIND),
        ("PROTO_OFF_GROUP", field::GROUP.start),
        ("PROTO_OFF_LENGTH", field::LENGTH.start),
        ("PROTO_OFF_SENDER", field::SENDER.start),
        ("PROTO_OFF_MEMBERSHIP", field::MEMBERSHIP.start),
        ("PROTO_OFF_SEQ", field::SEQ.start),
        ("PROTO_MAX_DATAGRAM_KERNEL", MAX_DATAGRAM_KERNEL),
    ];
    let mut out = String::from(
        "/* Generated from reflector-proto (protocol::c_defines) by the build script: do not edit. */\n\
         #ifndef REFLECTOR_PROTO_H\n#define REFLECTOR_PROTO_H\n",
    );
    for (name, value) in defines {
        out.push_str(&format!("#define {name} {value:#x}\n"));
    }
    out.push_str("#endif\n");
    out
}
