//! The crate's error type: every variant says what was wrong and what to do.

use std::io;
use std::path::PathBuf;

use crate::model::TdfError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad TDF {input:?}: {reason}")]
    BadTdf { input: String, reason: TdfError },
    #[error("bad clock domain name {0:?}: use 1 to 64 characters from A-Z a-z 0-9 . _ - (not starting with '.')")]
    BadName(String),
    #[error("no clock domain named {name:?} in {} (`vtime status` lists them)", dir.display())]
    UnknownDomain { name: String, dir: PathBuf },
    #[error("clock domain {name:?} is in use by process {pid}: pick another name, or change its TDF with `vtime set {name} N`")]
    InUse { name: String, pid: u32 },
    #[error(
        "clock domain {name:?} is managed by the program that created it (pid {pid}), which changes more than \
         the clock with its factor: for a netlab lab, `netlab tdf N` re-rates the links too; `vtime set --force` \
         changes the clock alone"
    )]
    Managed { name: String, pid: u32 },
    #[error("{}: not a vtime clock record ({why})", path.display())]
    BadRecord { path: PathBuf, why: String },
    #[error("{call} {}: {source}", path.display())]
    Io {
        call: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the vtime shim {} cannot be loaded: {reason}", path.display())]
    ShimLoad { path: PathBuf, reason: String },
}

impl Error {
    pub(crate) fn io(call: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { call, path, source }
    }
}
