//! The reflector's datagram format, version 2 (`docs/protocol.md`): a
//! 24-byte header on every datagram, a type-specific body, and the MAC or
//! DATA tag that proves the sender holds the player's session key. This
//! module is the one place that knows the offsets, the keys' derivation, the
//! MACs, the tags and the replay window.
//!
//! Parsing is a checked borrowed view ([`Packet::parse`]): once it returns
//! `Ok`, no accessor can panic, whatever bytes came off the network. Errors
//! are a small `Copy` enum so the hot path never allocates on bad input.
//!
//! Files: `consts` (numbers and offsets), `kind` (types and codes),
//! `packet` (parsing), `keys` (session keys, MACs), `emit` (building),
//! `replay` (the replay window), `version1` (answers to version 1, C facts).

mod consts;
mod emit;
mod keys;
mod kind;
mod packet;
mod replay;
mod version1;

pub use consts::*;
pub use emit::*;
pub use keys::*;
pub use kind::*;
pub use packet::*;
pub use replay::*;
pub use version1::*;

#[cfg(test)]
mod tests;
