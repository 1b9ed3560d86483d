use thiserror::Error;

/// Everything that can go wrong, each with what was wrong.
#[derive(Debug, Error)]
pub enum Error {
    #[error("not a wire archive (magic {0:02x?})")]
    BadMagic([u8; 4]),
    #[error("archive version {0} is not supported (this is version {v})", v = crate::VERSION)]
    BadVersion(u8),
    #[error("truncated: {what} needs {need} bytes, {have} left")]
    Truncated { what: &'static str, need: u64, have: u64 },
    #[error("archive of {len} bytes is over the limit of {limit}")]
    TooLarge { len: u64, limit: u64 },
    #[error("chunk table: {0}")]
    BadChunkTable(String),
    #[error("{0}")]
    Invalid(String),
    #[error("nesting deeper than {0}")]
    TooDeep(usize),
    #[error("{0} bytes left over after the value")]
    TrailingBytes(u64),
    #[error("{0}")]
    Custom(String),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl serde::ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Custom(msg.to_string())
    }
}

impl serde::de::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error::Custom(msg.to_string())
    }
}
