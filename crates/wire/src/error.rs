use thiserror::Error;

/// An error of this crate: what went wrong is its [`ErrorKind`].
///
/// Boxed so that a `Result` on the decoder's hot path stays two words: with
/// the kind inline every `Result<i64, Error>` the visitor passes around
/// would be five, and decoding small fields measurably slower.
#[derive(Debug, Error)]
#[error(transparent)]
pub struct Error(Box<ErrorKind>);

impl Error {
    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.0
    }

    /// What went wrong, by value (to match on it).
    pub fn into_kind(self) -> ErrorKind {
        *self.0
    }
}

impl From<ErrorKind> for Error {
    #[cold]
    fn from(k: ErrorKind) -> Error {
        Error(Box::new(k))
    }
}

impl From<std::io::Error> for Error {
    #[cold]
    fn from(e: std::io::Error) -> Error {
        ErrorKind::Io(e).into()
    }
}

/// Everything that can go wrong, each with what was wrong.
#[derive(Debug, Error)]
pub enum ErrorKind {
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
    Io(std::io::Error),
}

impl serde::ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        ErrorKind::Custom(msg.to_string()).into()
    }
}

impl serde::de::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        ErrorKind::Custom(msg.to_string()).into()
    }
}
