//! Messages over a byte stream: the sender writes an [`crate::Archive`]
//! with gathered writes ([`crate::Archive::write_to`]); the receiver reads
//! the header and the chunk table, checks them, then reads the body straight
//! into the one buffer the value is decoded from (and that its `&str`,
//! `&[u8]` and [`crate::Buffer`] fields point into).

use crate::de::{parse_head, Limits};
use crate::error::Error;
use bytes::{Bytes, BytesMut};
use std::io::Read;

/// Bytes of the fixed header: magic (4), version (1), reserved (3),
/// threshold (4), pointer chunks (4), body length (8).
pub const HEADER_LEN: usize = 24;

/// Reads one message from `r` (blocking), validating its header and chunk
/// table before allocating its body; returns the whole message, ready for
/// [`crate::from_bytes`].
pub fn read_message<R: Read>(r: &mut R, limits: Limits) -> Result<Bytes, Error> {
    let mut head = vec![0u8; HEADER_LEN];
    r.read_exact(&mut head)?;
    // The table's size is known from the header; the limit bounds it.
    let count = u32::from_le_bytes([head[12], head[13], head[14], head[15]]) as usize;
    let table_len = count.saturating_mul(16);
    parse_head_prefix(&head, &limits)?;
    let mut msg = BytesMut::with_capacity(0);
    msg.extend_from_slice(&head);
    msg.resize(HEADER_LEN + table_len, 0);
    r.read_exact(&mut msg[HEADER_LEN..])?;
    let parsed = parse_head(&msg, &limits)?;
    let body = usize::try_from(parsed.body_len).map_err(|_| Error::TooLarge {
        len: parsed.body_len,
        limit: limits.max_len,
    })?;
    let start = msg.len();
    msg.resize(start + body, 0);
    r.read_exact(&mut msg[start..])?;
    Ok(msg.freeze())
}

/// The checks that need only the fixed header (size limits), so a forged
/// table length is refused before anything is allocated for it.
fn parse_head_prefix(head: &[u8], limits: &Limits) -> Result<(), Error> {
    match parse_head(head, limits) {
        // The table is not read yet: only that may be missing.
        Err(Error::Truncated {
            what: "chunk table", ..
        })
        | Ok(_) => Ok(()),
        Err(e) => Err(e),
    }
}
