//! OS plumbing that every crate of the workspace needs and that used to be
//! written once per crate: entering a network namespace, CPU pinning,
//! `/proc` parsing, a guard that never leaves a child process behind, a
//! stop flag set by signals, socket-buffer setters, a watched file and the
//! answer of a capability probe. A leaf: it depends on no other crate of ours.
//!
//! Every call that can fail returns a [`SysError`] naming the call (and the
//! file or namespace it was about), so a caller can wrap it in its own error
//! without losing what went wrong.
#![deny(unsafe_code)]

pub mod caps;
pub mod child;
pub mod clock;
pub mod cpu;
pub mod netns;
pub mod procfs;
pub mod rlimit;
pub mod signal;
pub mod sockopt;
#[cfg(feature = "testing")]
pub mod testing;
pub mod units;
pub mod watch;

use std::io;

/// A failed system call or file access, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct SysError {
    /// The call and its subject, e.g. `setns(/run/netns/lab1)`.
    pub call: String,
    #[source]
    pub source: io::Error,
}

impl SysError {
    pub fn new(call: impl Into<String>, source: impl Into<io::Error>) -> SysError {
        SysError {
            call: call.into(),
            source: source.into(),
        }
    }

    /// `call` failed with the calling thread's `errno`.
    pub fn last(call: impl Into<String>) -> SysError {
        SysError::new(call, io::Error::last_os_error())
    }

    /// The errno of the failure, if it came from the OS.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

impl From<SysError> for io::Error {
    fn from(e: SysError) -> io::Error {
        io::Error::new(e.source.kind(), e.to_string())
    }
}

/// What a run-time probe found: a backend, mode or kernel feature can be
/// used here, or why not (said to the user when falling back).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Support {
    Supported,
    Unsupported(String),
}

impl Support {
    pub fn is_supported(&self) -> bool {
        matches!(self, Support::Supported)
    }

    /// The reason, when unsupported.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Support::Supported => None,
            Support::Unsupported(r) => Some(r),
        }
    }
}

impl std::fmt::Display for Support {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Support::Supported => f.write_str("supported"),
            Support::Unsupported(r) => write!(f, "unsupported: {r}"),
        }
    }
}
