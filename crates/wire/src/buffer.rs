//! [`Buffer`]: a refcounted byte buffer that this crate's serializer takes
//! as a pointer chunk (no copy) and its deserializer hands out as a slice of
//! the receive buffer (no copy).
//!
//! serde gives a serializer only a short-lived `&[u8]`; the buffer's owner
//! is handed over safely instead: `Buffer::serialize` puts a clone of its
//! `Bytes` (a refcount increment) in a thread-local slot and serializes a
//! newtype with a private name; this crate's serializer recognises the name
//! and takes the clone from the slot. Any other serializer just sees bytes.

use bytes::Bytes;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::RefCell;
use std::ops::Deref;

thread_local! {
    /// A buffer being handed to (or from) this crate's (de)serializer.
    pub(crate) static HANDOFF: RefCell<Option<Bytes>> = const { RefCell::new(None) };
}

/// Shared immutable bytes, serialized as a pointer chunk at or above the
/// archive's threshold. Clones share the memory; it is released when the
/// last holder (an archive being sent included) drops it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Buffer(pub Bytes);

impl Buffer {
    pub fn new(b: impl Into<Bytes>) -> Buffer {
        Buffer(b.into())
    }

    pub fn bytes(&self) -> &Bytes {
        &self.0
    }
}

impl Deref for Buffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for Buffer {
    fn from(v: Vec<u8>) -> Buffer {
        Buffer(v.into())
    }
}

impl From<Bytes> for Buffer {
    fn from(b: Bytes) -> Buffer {
        Buffer(b)
    }
}

/// The inner value: plain bytes for every serializer.
struct Raw<'a>(&'a [u8]);

impl Serialize for Raw<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

impl Serialize for Buffer {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        HANDOFF.with(|h| *h.borrow_mut() = Some(self.0.clone()));
        let r = s.serialize_newtype_struct(crate::BUFFER_TOKEN, &Raw(&self.0));
        // Whatever the serializer did, nothing stays behind in the slot.
        HANDOFF.with(|h| h.borrow_mut().take());
        r
    }
}

struct BufferVisitor;

impl<'de> serde::de::Visitor<'de> for BufferVisitor {
    type Value = Buffer;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("bytes")
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Buffer, D::Error> {
        d.deserialize_bytes(BufferVisitor)
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Buffer, E> {
        // This crate's deserializer left the same bytes as a slice of the
        // receive buffer: take that (no copy); anyone else's bytes are copied.
        let shared = HANDOFF.with(|h| h.borrow_mut().take());
        Ok(match shared {
            Some(b) if b.as_ptr() == v.as_ptr() && b.len() == v.len() => Buffer(b),
            _ => Buffer(Bytes::copy_from_slice(v)),
        })
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Buffer, E> {
        Ok(Buffer(v.into()))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Buffer, A::Error> {
        let mut v = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
        while let Some(b) = a.next_element::<u8>()? {
            v.push(b);
        }
        Ok(Buffer(v.into()))
    }
}

impl<'de> Deserialize<'de> for Buffer {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Buffer, D::Error> {
        d.deserialize_newtype_struct(crate::BUFFER_TOKEN, BufferVisitor)
    }
}
