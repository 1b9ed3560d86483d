//! The process's monotonic clock: for liveness and intervals, immune to
//! steps of the system clock. One epoch per process, so every part of a
//! program (a reflector and bots run by one test, say) reads the same
//! clock.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds on the monotonic clock since the first call in this process.
pub fn mono_now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Milliseconds on the same clock as [`mono_now_ns`].
pub fn mono_now_ms() -> u64 {
    mono_now_ns() / 1_000_000
}
