//! Error type of the crate: every variant says what went wrong and, where
//! there is one, what to do about it.

use std::path::PathBuf;

use crate::sys::SysError;

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("no interface named '{0}' (list them with `ip link`)")]
    NoSuchInterface(String),
    #[error("{call} was refused: needs root or CAP_NET_RAW (run with sudo)")]
    NeedsRoot { call: String },
    #[error("bad filter expression '{expr}': {message}")]
    Filter { expr: String, message: String },
    #[error(
        "the kernel refused a {mode} ring of {block_count} blocks of {block_size} bytes \
         (frame size {frame_size}): {source}; try a smaller --buffer-size or --block-size"
    )]
    RingRefused {
        mode: &'static str,
        block_size: u32,
        block_count: u32,
        frame_size: u32,
        #[source]
        source: SysError,
    },
    #[error("capture mode {mode} is not available here: {reason}")]
    ModeUnsupported { mode: &'static str, reason: String },
    #[error("cannot read {}: {source}", path.display())]
    Input {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl CaptureError {
    /// Maps EPERM/EACCES of a syscall to [`CaptureError::NeedsRoot`].
    pub(crate) fn from_sys(e: SysError) -> Self {
        match e.errno() {
            Some(libc::EPERM) | Some(libc::EACCES) => CaptureError::NeedsRoot { call: e.call },
            _ => CaptureError::Sys(e),
        }
    }
}

pub type Result<T, E = CaptureError> = std::result::Result<T, E>;
