//! Messages over a byte stream, blocking or not.
//!
//! The sender writes an [`crate::Archive`] with gathered writes: the header
//! and chunk table, then every chunk as its own `IoSlice`, never concatenated.
//! [`MessageWriter`] keeps how far it got, so on a non-blocking socket it
//! stops at `WouldBlock` and resumes at the same byte when the socket is
//! writable again ([`crate::Archive::write_to`] is the blocking form).
//!
//! The receiver ([`MessageReader`]) reads the header, checks it, reads the
//! chunk table, checks it, then reads the body straight into the one buffer
//! the value is decoded from (and that its `&str`, `&[u8]` and
//! [`crate::Buffer`] fields point into). It never reads past the end of a
//! message, so the next message stays in the socket for the next call, and
//! it resumes after `WouldBlock` like the writer ([`read_message`] is the
//! blocking form).

use crate::de::{parse_head, Limits};
use crate::error::{Error, ErrorKind};
use crate::ser::Archive;
use bytes::{Bytes, BytesMut};
use std::io::{self, IoSlice, Read, Write};

/// Bytes of the fixed header: magic (4), version (1), reserved (3),
/// threshold (4), pointer chunks (4), body length (8).
pub const HEADER_LEN: usize = 24;

/// Memory the reader sets aside for a body before its bytes arrive. Past
/// this, the buffer grows (doubling) only as bytes come in, so a forged body
/// length costs at most this much plus twice what the peer really sent.
const BODY_PREALLOC: usize = 1 << 20;

/// Writes `msg` to `w` from byte `sent` on, as far as `w` takes it.
/// Returns `Ok(true)` once the whole message is written, `Ok(false)` when
/// `w` would block; `sent` is advanced either way.
fn write_some<W: Write>(head: &[u8], archive: &Archive, sent: &mut usize, w: &mut W) -> Result<bool, Error> {
    let mut slices = Vec::with_capacity(1 + archive.chunks.len());
    slices.push(IoSlice::new(head));
    slices.extend(archive.body_slices());
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
    IoSlice::advance_slices(&mut bufs, *sent);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
            Ok(n) => {
                *sent += n;
                IoSlice::advance_slices(&mut bufs, n);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

impl Archive {
    /// Writes the message with gathered writes, resuming after partial
    /// writes, never concatenating the chunks. For a blocking writer; on a
    /// non-blocking one use [`MessageWriter`], which can stop and resume.
    pub fn write_to<W: Write>(&self, w: &mut W) -> Result<(), Error> {
        let head = self.head();
        let mut sent = 0;
        if write_some(&head, self, &mut sent, w)? {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the writer would block: use MessageWriter on a non-blocking stream",
            )
            .into())
        }
    }
}

/// One message being sent over a (possibly non-blocking) stream.
///
/// It owns the archive, so the pointer chunks' memory stays alive until the
/// last byte has left (the kernel has copied it by then).
pub struct MessageWriter {
    head: Vec<u8>,
    archive: Archive,
    sent: usize,
    total: usize,
}

impl MessageWriter {
    pub fn new(archive: Archive) -> MessageWriter {
        let head = archive.head();
        let total = head.len() + archive.body_len() as usize;
        MessageWriter {
            head,
            archive,
            sent: 0,
            total,
        }
    }

    /// Writes as much as `w` takes: `Ok(true)` when the message is complete,
    /// `Ok(false)` when `w` would block (call again once it is writable).
    pub fn write_to<W: Write>(&mut self, w: &mut W) -> Result<bool, Error> {
        write_some(&self.head, &self.archive, &mut self.sent, w)
    }

    /// Bytes not written yet.
    pub fn remaining(&self) -> usize {
        self.total - self.sent
    }
}

/// Where a [`MessageReader`] is in the current message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Header,
    Table,
    Body,
}

/// Receives messages from a (possibly non-blocking) stream, one at a time.
pub struct MessageReader {
    limits: Limits,
    msg: BytesMut,
    /// Bytes of `msg` received so far.
    filled: usize,
    /// Length of the message once its header is read (header until then).
    want: usize,
    /// Where the body starts, once the table is read.
    body_start: usize,
    stage: Stage,
}

impl MessageReader {
    pub fn new(limits: Limits) -> MessageReader {
        MessageReader {
            limits,
            msg: BytesMut::new(),
            filled: 0,
            want: HEADER_LEN,
            body_start: 0,
            stage: Stage::Header,
        }
    }

    /// True when no part of a message has been received: a stream that ends
    /// here ended cleanly, between messages.
    pub fn is_idle(&self) -> bool {
        self.stage == Stage::Header && self.filled == 0
    }

    /// Bytes set aside for the message being received (at most the limits'
    /// worth of header and table, then 1 MiB plus twice the body bytes
    /// received so far: a forged length cannot make it allocate more).
    pub fn reserved(&self) -> usize {
        self.msg.len()
    }

    /// Reads what `r` has, up to the end of the current message:
    /// `Ok(Some(message))` once it is whole (ready for [`crate::from_bytes`]),
    /// `Ok(None)` when `r` would block (call again once it is readable). The
    /// header and chunk table are validated before the body's memory is set
    /// aside. A stream that ends gives `UnexpectedEof` (see
    /// [`MessageReader::is_idle`] to tell a clean end from a cut message).
    pub fn read_from<R: Read>(&mut self, r: &mut R) -> Result<Option<Bytes>, Error> {
        loop {
            if self.filled == self.want {
                match self.stage {
                    Stage::Header => self.header_done()?,
                    Stage::Table => self.table_done()?,
                    Stage::Body => return Ok(Some(self.take())),
                }
                continue;
            }
            self.reserve();
            match r.read(&mut self.msg[self.filled..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
                Ok(n) => self.filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Makes room for the next read: all of the header or table at once
    /// (bounded by the limits already checked), the body in growing steps.
    fn reserve(&mut self) {
        let target = match self.stage {
            Stage::Header | Stage::Table => self.want,
            Stage::Body => (2 * self.filled).max(self.body_start + BODY_PREALLOC).min(self.want),
        };
        if self.msg.len() < target {
            self.msg.resize(target, 0);
        }
    }

    fn header_done(&mut self) -> Result<(), Error> {
        // Only the table may be missing yet: every other check of the fixed
        // header (sizes against the limits) runs before the table is read.
        match parse_head(&self.msg[..HEADER_LEN], &self.limits) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::Truncated {
                        what: "chunk table",
                        ..
                    }
                ) => {}
            Err(e) => return Err(e),
        }
        let count = u32::from_le_bytes([self.msg[12], self.msg[13], self.msg[14], self.msg[15]]) as usize;
        self.want = HEADER_LEN + count * 16;
        self.stage = Stage::Table;
        Ok(())
    }

    fn table_done(&mut self) -> Result<(), Error> {
        let head = parse_head(&self.msg[..self.filled], &self.limits)?;
        // parse_head checked header + table + body against limits.max_len.
        self.body_start = head.body_start;
        self.want = head.body_start
            + usize::try_from(head.body_len).map_err(|_| ErrorKind::TooLarge {
                len: head.body_len,
                limit: self.limits.max_len,
            })?;
        self.stage = Stage::Body;
        Ok(())
    }

    /// Hands out the complete message and gets ready for the next one.
    fn take(&mut self) -> Bytes {
        self.msg.truncate(self.filled);
        let msg = self.msg.split().freeze();
        self.filled = 0;
        self.want = HEADER_LEN;
        self.stage = Stage::Header;
        msg
    }
}

/// Reads one message from a blocking `r`, validating its header and chunk
/// table before setting memory aside for its body; returns the whole
/// message, ready for [`crate::from_bytes`].
pub fn read_message<R: Read>(r: &mut R, limits: Limits) -> Result<Bytes, Error> {
    let mut reader = MessageReader::new(limits);
    match reader.read_from(r)? {
        Some(msg) => Ok(msg),
        None => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the reader would block: use MessageReader on a non-blocking stream",
        )
        .into()),
    }
}
