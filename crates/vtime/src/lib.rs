//! Time dilation without a kernel patch.
//!
//! A *clock domain* is a small record in shared memory holding a time
//! dilation factor (TDF) and the piece of the virtual clock it started
//! ([`model`]). Processes started with the environment from
//! [`Domain::child_env`] load an `LD_PRELOAD` shim (C, embedded in this crate,
//! see [`shim`]) that shows them every clock and every wait through that
//! record: under TDF 4 a one-second sleep takes four real seconds. The TDF can
//! change at run time ([`Domain::set_tdf`]); clocks stay continuous and
//! monotonic, and waits in progress follow the change.
//!
//! ```no_run
//! # fn main() -> Result<(), vtime::Error> {
//! use vtime::{Domain, Tdf};
//! let domain = Domain::create(&vtime::default_dir(), "lab1", "4".parse::<Tdf>().unwrap())?;
//! let shim = vtime::shim::InstalledShim::install()?;
//! let mut cmd = std::process::Command::new("sleep");
//! cmd.arg("1").envs(domain.child_env(shim.path()));
//! // ... spawn; later: domain.set_tdf(Tdf::new(2, 1).unwrap())?;
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]

mod domain;
mod error;
pub mod model;
mod record;
pub mod shim;
mod sys;
pub mod target;

pub use domain::{default_dir, list_domains, remove_stale, validate_name, Domain, Listed, DIR_ENV, RECORD_ENV};
pub use error::Error;
pub use model::{ClockBase, Divider, Segment, Tdf, TdfError, Timeline};
pub use record::{Snapshot, FLAG_MANAGED};

/// Real value of a clock base now (ns): what a controller compares virtual
/// clocks with.
pub fn real_now(base: ClockBase) -> i64 {
    sys::now_ns(base)
}

/// Parses a TDF given by a user, with an error naming the input.
pub fn parse_tdf(s: &str) -> Result<Tdf, Error> {
    s.parse().map_err(|reason| Error::BadTdf {
        input: s.to_string(),
        reason,
    })
}
