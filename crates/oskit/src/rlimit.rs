//! Resource limits a process raises for itself at start.

use std::io;

/// Lifts the soft limit on open files to `need` if the hard limit allows,
/// else as far as it allows. Returns the soft limit now in force.
pub fn raise_nofile_limit(need: u64) -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft >= need {
        return Ok(soft);
    }
    let target = need.min(hard);
    setrlimit(Resource::RLIMIT_NOFILE, target, hard)?;
    Ok(target)
}
