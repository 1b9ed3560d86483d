//! Deserializing from a received message: the header and the chunk table
//! are validated first, then the body is read with every length checked
//! against what is left. `&str`, `&[u8]` and [`crate::Buffer`] fields are
//! handed out from the message without a copy.

use crate::buffer::HANDOFF;
use crate::error::{Error, ErrorKind};
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Visitor};
use serde::Deserialize;

/// Bounds on what a message may make the decoder do.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest message accepted, bytes.
    pub max_len: u64,
    /// Deepest nesting of sequences, maps, structs, options and enums.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_len: 1 << 30,
            max_depth: 128,
        }
    }
}

/// A validated header: where the body is and its pointer chunks.
pub(crate) struct Head {
    pub threshold: u32,
    pub body_start: usize,
    pub body_len: u64,
    pub table: Vec<(u64, u64)>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Checks a header and its chunk table (`buf` starts with the header; it
/// may hold only the header and table, as when reading from a stream).
pub(crate) fn parse_head(buf: &[u8], limits: &Limits) -> Result<Head, Error> {
    let have = buf.len() as u64;
    if buf.len() < crate::HEADER_LEN {
        return Err(ErrorKind::Truncated {
            what: "header",
            need: crate::HEADER_LEN as u64,
            have,
        }
        .into());
    }
    let magic = [buf[0], buf[1], buf[2], buf[3]];
    if magic != crate::MAGIC {
        return Err(ErrorKind::BadMagic(magic).into());
    }
    if buf[4] != crate::VERSION {
        return Err(ErrorKind::BadVersion(buf[4]).into());
    }
    if buf[5..8] != [0, 0, 0] {
        return Err(ErrorKind::Invalid("reserved header bytes are not zero".into()).into());
    }
    let threshold = u32_at(buf, 8);
    if threshold == 0 {
        return Err(ErrorKind::Invalid("threshold 0: every buffer would be a pointer chunk".into()).into());
    }
    let count = u32_at(buf, 12) as u64;
    let body_len = u64_at(buf, 16);
    let table_len = count * 16;
    let total = crate::HEADER_LEN as u64 + table_len + body_len;
    if total > limits.max_len {
        return Err(ErrorKind::TooLarge {
            len: total,
            limit: limits.max_len,
        }
        .into());
    }
    // Each pointer chunk holds at least `threshold` bytes of the body.
    if count > body_len / u64::from(threshold) {
        return Err(ErrorKind::BadChunkTable(format!(
            "{count} pointer chunks of at least {threshold} bytes cannot fit in a body of {body_len}"
        ))
        .into());
    }
    let need = crate::HEADER_LEN as u64 + table_len;
    if have < need {
        return Err(ErrorKind::Truncated {
            what: "chunk table",
            need,
            have,
        }
        .into());
    }
    let mut table = Vec::with_capacity(count as usize);
    let mut end = 0u64;
    for i in 0..count as usize {
        let at = crate::HEADER_LEN + 16 * i;
        let (off, len) = (u64_at(buf, at), u64_at(buf, at + 8));
        if off < end {
            return Err(
                ErrorKind::BadChunkTable(format!("chunk {i} at {off} overlaps or precedes the one before")).into(),
            );
        }
        if len < u64::from(threshold) {
            return Err(ErrorKind::BadChunkTable(format!(
                "chunk {i} has {len} bytes, under the threshold {threshold}"
            ))
            .into());
        }
        end = off.checked_add(len).filter(|e| *e <= body_len).ok_or_else(|| {
            ErrorKind::BadChunkTable(format!("chunk {i} ({off}+{len}) runs past the body ({body_len})"))
        })?;
        table.push((off, len));
    }
    Ok(Head {
        threshold,
        body_start: need as usize,
        body_len,
        table,
    })
}

/// Decodes a whole message (header, chunk table, body) held in `msg`.
pub fn from_bytes<'de, T: Deserialize<'de>>(msg: &'de Bytes) -> Result<T, Error> {
    from_message(msg, Limits::default())
}

/// [`from_bytes`] with explicit limits.
pub fn from_message<'de, T: Deserialize<'de>>(msg: &'de Bytes, limits: Limits) -> Result<T, Error> {
    let head = parse_head(msg, &limits)?;
    let have = (msg.len() - head.body_start) as u64;
    if have != head.body_len {
        return Err(if have < head.body_len {
            ErrorKind::Truncated {
                what: "body",
                need: head.body_len,
                have,
            }
        } else {
            ErrorKind::TrailingBytes(have - head.body_len)
        }
        .into());
    }
    let mut r = Reader {
        msg,
        body_start: head.body_start,
        rest: &msg[head.body_start..],
        table: head.table,
        next_chunk: 0,
        depth: 0,
        limits,
        buffer_next: false,
        threshold: head.threshold,
    };
    let v = T::deserialize(&mut r)?;
    if !r.rest.is_empty() {
        return Err(ErrorKind::TrailingBytes(r.rest.len() as u64).into());
    }
    if r.next_chunk != r.table.len() {
        return Err(ErrorKind::BadChunkTable(format!(
            "{} of {} pointer chunks were never used by the value",
            r.table.len() - r.next_chunk,
            r.table.len()
        ))
        .into());
    }
    Ok(v)
}

struct Reader<'de> {
    msg: &'de Bytes,
    body_start: usize,
    /// What is not read yet: the message's tail (a slice, so reading a
    /// field is one length check and a split, as fast as a plain slice
    /// reader).
    rest: &'de [u8],
    table: Vec<(u64, u64)>,
    next_chunk: usize,
    depth: usize,
    limits: Limits,
    buffer_next: bool,
    threshold: u32,
}

impl<'de> Reader<'de> {
    /// Offset of the next unread byte in the message.
    fn pos(&self) -> usize {
        self.msg.len() - self.rest.len()
    }

    #[inline]
    fn take(&mut self, n: u64, what: &'static str) -> Result<&'de [u8], Error> {
        let have = self.rest.len();
        match usize::try_from(n) {
            Ok(n) if n <= have => {
                let (s, rest) = self.rest.split_at(n);
                self.rest = rest;
                Ok(s)
            }
            _ => Err(truncated(what, n, have)),
        }
    }

    #[inline]
    fn arr<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], Error> {
        match self.rest.split_first_chunk::<N>() {
            Some((a, rest)) => {
                self.rest = rest;
                Ok(*a)
            }
            None => Err(truncated(what, N as u64, self.rest.len())),
        }
    }

    #[inline]
    fn len(&mut self, what: &'static str) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(self.arr::<8>(what)?))
    }

    /// A count of elements: never more than bytes left, so a forged count
    /// cannot make a collection preallocate beyond the input's size.
    #[inline]
    fn count(&mut self, what: &'static str) -> Result<usize, Error> {
        let n = self.len(what)?;
        let left = self.rest.len() as u64;
        if n > left {
            return Err(ErrorKind::Invalid(format!("{what} claims {n} elements, with {left} bytes left")).into());
        }
        Ok(n as usize)
    }

    fn enter(&mut self) -> Result<(), Error> {
        self.depth += 1;
        if self.depth > self.limits.max_depth {
            return Err(ErrorKind::TooDeep(self.limits.max_depth).into());
        }
        Ok(())
    }

    /// The bytes of a bytes field, and whether the chunk table lists them.
    fn bytes_field(&mut self) -> Result<(usize, &'de [u8], bool), Error> {
        let n = self.len("bytes length")?;
        let off = (self.pos() - self.body_start) as u64;
        if let Some(&(c_off, c_len)) = self.table.get(self.next_chunk) {
            if c_off < off {
                return Err(ErrorKind::BadChunkTable(format!(
                    "pointer chunk at {c_off} is not where any field's bytes start"
                ))
                .into());
            }
            if c_off == off {
                if c_len != n {
                    return Err(ErrorKind::BadChunkTable(format!(
                        "pointer chunk at {c_off} has {c_len} bytes, its field {n}"
                    ))
                    .into());
                }
                self.next_chunk += 1;
                let start = self.pos();
                return Ok((start, self.take(n, "bytes")?, true));
            }
        }
        let start = self.pos();
        Ok((start, self.take(n, "bytes")?, false))
    }
}

#[cold]
fn truncated(what: &'static str, need: u64, have: usize) -> Error {
    ErrorKind::Truncated {
        what,
        need,
        have: have as u64,
    }
    .into()
}

#[inline]
fn utf8(b: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(b).map_err(|e| ErrorKind::Invalid(format!("string is not UTF-8: {e}")).into())
}

macro_rules! prim {
    ($m:ident, $t:ty, $visit:ident, $n:literal) => {
        fn $m<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
            v.$visit(<$t>::from_le_bytes(self.arr::<$n>(stringify!($t))?))
        }
    };
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(ErrorKind::Invalid("the format is not self-describing: a type must say what it expects".into()).into())
    }
    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.arr::<1>("bool")?[0] {
            0 => v.visit_bool(false),
            1 => v.visit_bool(true),
            b => Err(ErrorKind::Invalid(format!("bool byte {b}")).into()),
        }
    }
    prim!(deserialize_i8, i8, visit_i8, 1);
    prim!(deserialize_i16, i16, visit_i16, 2);
    prim!(deserialize_i32, i32, visit_i32, 4);
    prim!(deserialize_i64, i64, visit_i64, 8);
    prim!(deserialize_i128, i128, visit_i128, 16);
    prim!(deserialize_u8, u8, visit_u8, 1);
    prim!(deserialize_u16, u16, visit_u16, 2);
    prim!(deserialize_u32, u32, visit_u32, 4);
    prim!(deserialize_u64, u64, visit_u64, 8);
    prim!(deserialize_u128, u128, visit_u128, 16);
    prim!(deserialize_f32, f32, visit_f32, 4);
    prim!(deserialize_f64, f64, visit_f64, 8);
    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let c = u32::from_le_bytes(self.arr::<4>("char")?);
        v.visit_char(char::from_u32(c).ok_or_else(|| ErrorKind::Invalid(format!("{c:#x} is not a char")))?)
    }
    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let n = self.len("string length")?;
        v.visit_borrowed_str(utf8(self.take(n, "string")?)?)
    }
    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_str(v)
    }
    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let is_buffer = std::mem::take(&mut self.buffer_next);
        let (start, b, listed) = self.bytes_field()?;
        if is_buffer && !listed && b.len() as u64 >= u64::from(self.threshold) {
            // A sender of this format makes every such buffer a pointer chunk.
            return Err(ErrorKind::BadChunkTable(format!(
                "a buffer of {} bytes (threshold {}) is not in the chunk table",
                b.len(),
                self.threshold
            ))
            .into());
        }
        if is_buffer {
            // The Buffer takes a shared slice of the message: no copy.
            let shared = self.msg.slice(start..start + b.len());
            HANDOFF.with(|h| *h.borrow_mut() = Some(shared));
            let r = v.visit_borrowed_bytes(b);
            HANDOFF.with(|h| h.borrow_mut().take());
            return r;
        }
        v.visit_borrowed_bytes(b)
    }
    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_bytes(v)
    }
    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        match self.arr::<1>("option tag")?[0] {
            0 => v.visit_none(),
            1 => {
                self.enter()?;
                let r = v.visit_some(&mut *self);
                self.depth -= 1;
                r
            }
            t => Err(ErrorKind::Invalid(format!("option tag {t}")).into()),
        }
    }
    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }
    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, v: V) -> Result<V::Value, Error> {
        v.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, v: V) -> Result<V::Value, Error> {
        if name == crate::BUFFER_TOKEN {
            self.buffer_next = true;
            let r = self.deserialize_bytes(v);
            self.buffer_next = false;
            return r;
        }
        v.visit_newtype_struct(self)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let n = self.count("sequence")?;
        self.enter()?;
        let r = v.visit_seq(Elements { r: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, Error> {
        self.enter()?;
        let r = v.visit_seq(Elements { r: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &'static str, n: usize, v: V) -> Result<V::Value, Error> {
        self.deserialize_tuple(n, v)
    }
    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let n = self.count("map")?;
        self.enter()?;
        let r = v.visit_map(Elements { r: &mut *self, left: n });
        self.depth -= 1;
        r
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_tuple(fields.len(), v)
    }
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Error> {
        self.enter()?;
        let r = v.visit_enum(&mut *self);
        self.depth -= 1;
        r
    }
    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.deserialize_u32(v)
    }
    fn deserialize_ignored_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(ErrorKind::Invalid("cannot skip a value in a format that is not self-describing".into()).into())
    }
    fn is_human_readable(&self) -> bool {
        false
    }
}

struct Elements<'a, 'de> {
    r: &'a mut Reader<'de>,
    left: usize,
}

impl<'de> de::SeqAccess<'de> for Elements<'_, 'de> {
    type Error = Error;
    #[inline]
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, s: T) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        s.deserialize(&mut *self.r).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::MapAccess<'de> for Elements<'_, 'de> {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, s: K) -> Result<Option<K::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        s.deserialize(&mut *self.r).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, s: V) -> Result<V::Value, Error> {
        s.deserialize(&mut *self.r)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de> de::EnumAccess<'de> for &mut Reader<'de> {
    type Error = Error;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, s: V) -> Result<(V::Value, Self), Error> {
        let v = s.deserialize(&mut *self)?;
        Ok((v, self))
    }
}

impl<'de> de::VariantAccess<'de> for &mut Reader<'de> {
    type Error = Error;
    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, s: T) -> Result<T::Value, Error> {
        s.deserialize(self)
    }
    fn tuple_variant<V: Visitor<'de>>(self, n: usize, v: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_tuple(self, n, v)
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], v: V) -> Result<V::Value, Error> {
        de::Deserializer::deserialize_tuple(self, fields.len(), v)
    }
}
