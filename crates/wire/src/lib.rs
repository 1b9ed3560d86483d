//! Chunked zero-copy serialization (paper 004, §3.1–3.4) for any serde type.
//!
//! Serializing a value produces an [`Archive`]: an index buffer that holds
//! the small fields (copied, as any serializer would), and a chunk list in
//! which the large shared buffers ([`Buffer`], at or above a threshold,
//! 4096 bytes by default) are *pointer chunks*: references to the caller's
//! memory, never copied. Sending the archive is one gathered write (header,
//! chunk table, then each chunk as its own `IoSlice`); receiving it is one
//! read into one buffer, from which `&str`, `&[u8]` and [`Buffer`] fields are
//! handed out without a copy.
//!
//! No IDL and no code generator: `#[derive(Serialize, Deserialize)]` is all a
//! type needs. A plain `Vec<u8>` or `&[u8]` field (with `serde_bytes`) is
//! copied into the index buffer whole, at any size; declaring it as
//! [`Buffer`] instead is the one-line change that makes it a pointer chunk.
//!
//! Untrusted input is validated before use (header, chunk table, every
//! length against what is left, nesting depth, a total size limit); errors
//! are typed ([`Error`]) and nothing panics. See `README.md` for the format.
#![deny(unsafe_code)]

mod buffer;
mod de;
mod error;
mod frame;
mod ser;

pub use buffer::Buffer;
pub use de::{from_bytes, from_message, Limits};
pub use error::{Error, ErrorKind};
pub use frame::{read_message, MessageReader, MessageWriter, HEADER_LEN};
pub use ser::{to_archive, to_archive_with, Archive, Chunk};

/// Buffers at or above this many bytes become pointer chunks by default.
pub const DEFAULT_THRESHOLD: u32 = 4096;
/// The format's magic bytes and version.
pub const MAGIC: [u8; 4] = *b"WIRE";
pub const VERSION: u8 = 1;
/// The newtype name through which [`Buffer`] finds this crate's
/// serializer (as serde_json's `RawValue` does); private to the format.
pub(crate) const BUFFER_TOKEN: &str = "$wire::private::Buffer";
