//! Serializing into an [`Archive`]: small fields are written into the index
//! buffer; a [`crate::Buffer`] at or above the threshold ends the current
//! index chunk and becomes a pointer chunk (its `Bytes`, not a copy).

use crate::buffer::HANDOFF;
use crate::error::{Error, ErrorKind};
use bytes::Bytes;
use serde::ser::{self, Serialize};
use std::io::IoSlice;
use std::ops::Range;

/// One piece of an archive's body, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Bytes of the index buffer.
    Index(Range<usize>),
    /// A caller's buffer, referenced.
    Pointer(Bytes),
}

/// A serialized value: the index buffer and the chunk list whose
/// concatenation is the archive's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archive {
    pub threshold: u32,
    pub index: Vec<u8>,
    pub chunks: Vec<Chunk>,
}

impl Archive {
    /// Bytes of the body (what the chunks add up to).
    pub fn body_len(&self) -> u64 {
        self.chunks
            .iter()
            .map(|c| match c {
                Chunk::Index(r) => r.len() as u64,
                Chunk::Pointer(b) => b.len() as u64,
            })
            .sum()
    }

    /// The pointer chunks' (offset in the body, length), in order.
    pub fn pointer_table(&self) -> Vec<(u64, u64)> {
        let mut off = 0u64;
        let mut t = vec![];
        for c in &self.chunks {
            match c {
                Chunk::Index(r) => off += r.len() as u64,
                Chunk::Pointer(b) => {
                    t.push((off, b.len() as u64));
                    off += b.len() as u64;
                }
            }
        }
        t
    }

    /// The header and the chunk table, as sent before the body.
    pub fn head(&self) -> Vec<u8> {
        let table = self.pointer_table();
        let mut h = Vec::with_capacity(crate::HEADER_LEN + 16 * table.len());
        h.extend_from_slice(&crate::MAGIC);
        h.push(crate::VERSION);
        h.extend_from_slice(&[0; 3]);
        h.extend_from_slice(&self.threshold.to_le_bytes());
        h.extend_from_slice(&(table.len() as u32).to_le_bytes());
        h.extend_from_slice(&self.body_len().to_le_bytes());
        for (off, len) in table {
            h.extend_from_slice(&off.to_le_bytes());
            h.extend_from_slice(&len.to_le_bytes());
        }
        h
    }

    /// The body as `IoSlice`s, pointer chunks pointing at the callers'
    /// memory: what a gathered write sends after [`Archive::head`].
    pub fn body_slices(&self) -> Vec<IoSlice<'_>> {
        self.chunks
            .iter()
            .map(|c| match c {
                Chunk::Index(r) => IoSlice::new(&self.index[r.clone()]),
                Chunk::Pointer(b) => IoSlice::new(b),
            })
            .collect()
    }

    /// The whole message in one contiguous vector (copies everything: for
    /// tests and for transports that cannot gather).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = self.head();
        for s in self.body_slices() {
            v.extend_from_slice(&s);
        }
        v
    }
}

/// Serializes `v` with the default threshold.
pub fn to_archive<T: Serialize + ?Sized>(v: &T) -> Result<Archive, Error> {
    to_archive_with(v, crate::DEFAULT_THRESHOLD)
}

/// Serializes `v`; buffers of `threshold` bytes or more become pointer chunks.
///
/// Two passes, as bincode does: the first only counts the index buffer's
/// bytes, so the second writes into one allocation of the exact size
/// instead of growing (and copying) the buffer as it fills.
pub fn to_archive_with<T: Serialize + ?Sized>(v: &T, threshold: u32) -> Result<Archive, Error> {
    let mut count = Writer {
        threshold,
        out: Counter::default(),
        buffer_next: false,
    };
    v.serialize(&mut count)?;
    let mut s = Writer {
        threshold,
        out: Chunks {
            index: Vec::with_capacity(count.out.index),
            chunks: Vec::with_capacity(2 * count.out.pointers + 1),
            chunk_start: 0,
        },
        buffer_next: false,
    };
    v.serialize(&mut s)?;
    // A Serialize impl that writes differently each time would break the
    // exact size (only a reallocation then, never wrong output).
    debug_assert_eq!(s.out.index.len(), count.out.index, "sizing pass disagrees");
    s.out.close_index();
    Ok(Archive {
        threshold,
        index: s.out.index,
        chunks: s.out.chunks,
    })
}

/// Where a [`Writer`] puts what it serializes.
trait Sink {
    /// Small bytes, copied into the index buffer.
    fn put(&mut self, b: &[u8]);
    /// A buffer referenced as a pointer chunk.
    fn pointer(&mut self, b: Bytes);
}

/// The sizing pass: counts index bytes and pointer chunks.
#[derive(Default)]
struct Counter {
    index: usize,
    pointers: usize,
}

impl Sink for Counter {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.index += b.len();
    }
    fn pointer(&mut self, _: Bytes) {
        self.pointers += 1;
    }
}

/// The writing pass: the index buffer and the chunk list.
struct Chunks {
    index: Vec<u8>,
    chunks: Vec<Chunk>,
    chunk_start: usize,
}

impl Chunks {
    fn close_index(&mut self) {
        if self.index.len() > self.chunk_start {
            self.chunks.push(Chunk::Index(self.chunk_start..self.index.len()));
        }
        self.chunk_start = self.index.len();
    }
}

impl Sink for Chunks {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.index.extend_from_slice(b);
    }
    fn pointer(&mut self, b: Bytes) {
        self.close_index();
        self.chunks.push(Chunk::Pointer(b));
    }
}

struct Writer<S> {
    threshold: u32,
    out: S,
    /// Set by the Buffer newtype: the next bytes are a Buffer's.
    buffer_next: bool,
}

impl<S: Sink> Writer<S> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.out.put(b);
    }

    #[inline]
    fn len(&mut self, n: usize) {
        self.put(&(n as u64).to_le_bytes());
    }
}

type R = Result<(), Error>;

impl<S: Sink> ser::Serializer for &mut Writer<S> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    fn serialize_bool(self, v: bool) -> R {
        self.put(&[u8::from(v)]);
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> R {
        self.put(&[v]);
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f32(self, v: f32) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_f64(self, v: f64) -> R {
        self.put(&v.to_le_bytes());
        Ok(())
    }
    fn serialize_char(self, v: char) -> R {
        self.serialize_u32(u32::from(v))
    }
    fn serialize_str(self, v: &str) -> R {
        self.len(v.len());
        self.put(v.as_bytes());
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> R {
        self.len(v.len());
        let is_buffer = std::mem::take(&mut self.buffer_next);
        if is_buffer && v.len() as u64 >= u64::from(self.threshold) {
            // The Buffer left its owner in the slot: reference it.
            let owned = HANDOFF.with(|h| h.borrow_mut().take());
            if let Some(b) = owned.filter(|b| b.as_ptr() == v.as_ptr() && b.len() == v.len()) {
                self.out.pointer(b);
                return Ok(());
            }
        }
        // Below the threshold, or plain bytes: copied whole, in one piece.
        self.put(v);
        Ok(())
    }
    fn serialize_none(self) -> R {
        self.put(&[0]);
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> R {
        self.put(&[1]);
        v.serialize(self)
    }
    fn serialize_unit(self) -> R {
        Ok(())
    }
    fn serialize_unit_struct(self, _: &'static str) -> R {
        Ok(())
    }
    fn serialize_unit_variant(self, _: &'static str, i: u32, _: &'static str) -> R {
        self.serialize_u32(i)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, v: &T) -> R {
        if name == crate::BUFFER_TOKEN {
            self.buffer_next = true;
        }
        let r = v.serialize(&mut *self);
        self.buffer_next = false;
        r
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(self, _: &'static str, i: u32, _: &'static str, v: &T) -> R {
        self.serialize_u32(i)?;
        v.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self, Error> {
        let n = len.ok_or_else(|| ErrorKind::Custom("sequences of unknown length are not supported".into()))?;
        self.len(n);
        Ok(self)
    }
    fn serialize_tuple(self, _: usize) -> Result<Self, Error> {
        Ok(self)
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self, Error> {
        Ok(self)
    }
    fn serialize_tuple_variant(self, _: &'static str, i: u32, _: &'static str, _: usize) -> Result<Self, Error> {
        self.serialize_u32(i)?;
        Ok(self)
    }
    fn serialize_map(self, len: Option<usize>) -> Result<Self, Error> {
        let n = len.ok_or_else(|| ErrorKind::Custom("maps of unknown length are not supported".into()))?;
        self.len(n);
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, Error> {
        Ok(self)
    }
    fn serialize_struct_variant(self, _: &'static str, i: u32, _: &'static str, _: usize) -> Result<Self, Error> {
        self.serialize_u32(i)?;
        Ok(self)
    }
}

macro_rules! compound {
    ($tr:ident, $m:ident) => {
        impl<S: Sink> ser::$tr for &mut Writer<S> {
            type Ok = ();
            type Error = Error;
            fn $m<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
                v.serialize(&mut **self)
            }
            fn end(self) -> R {
                Ok(())
            }
        }
    };
}
compound!(SerializeSeq, serialize_element);
compound!(SerializeTuple, serialize_element);
compound!(SerializeTupleStruct, serialize_field);
compound!(SerializeTupleVariant, serialize_field);

impl<S: Sink> ser::SerializeMap for &mut Writer<S> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> R {
        k.serialize(&mut **self)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> R {
        v.serialize(&mut **self)
    }
    fn end(self) -> R {
        Ok(())
    }
}

impl<S: Sink> ser::SerializeStruct for &mut Writer<S> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, v: &T) -> R {
        v.serialize(&mut **self)
    }
    fn end(self) -> R {
        Ok(())
    }
}

impl<S: Sink> ser::SerializeStructVariant for &mut Writer<S> {
    type Ok = ();
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, _: &'static str, v: &T) -> R {
        v.serialize(&mut **self)
    }
    fn end(self) -> R {
        Ok(())
    }
}
