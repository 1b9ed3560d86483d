//! The clocks as plain numbers: the wall clock in ns since the Unix epoch,
//! and the process's monotonic clock (for liveness and intervals, immune to
//! steps of the system clock; one epoch per process, so every part of a
//! program, a reflector and bots run by one test say, reads the same clock).

use std::sync::OnceLock;
use std::time::Instant;

/// Wall-clock time in ns since the Unix epoch (0 before it): timestamps of
/// captured packets, the delay line's clock offset, the bots' send times.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Nanoseconds on the monotonic clock since the first call in this process.
pub fn mono_now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Milliseconds on the same clock as [`mono_now_ns`].
pub fn mono_now_ms() -> u64 {
    mono_now_ns() / 1_000_000
}

#[cfg(test)]
mod tests {
    #[test]
    fn realtime_is_after_2020_and_moves_forward() {
        let a = super::realtime_ns();
        assert!(a > 1_577_836_800_000_000_000);
        assert!(super::realtime_ns() >= a);
    }

    #[test]
    fn the_monotonic_clock_never_goes_back() {
        let a = super::mono_now_ns();
        assert!(super::mono_now_ns() >= a);
        assert!(super::mono_now_ms() <= super::mono_now_ns() / 1_000_000);
    }
}
