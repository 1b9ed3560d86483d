//! The wall clock as one number.

/// Wall-clock time in ns since the Unix epoch (0 before it): timestamps of
/// captured packets, the delay line's clock offset, the bots' send times.
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn realtime_is_after_2020_and_moves_forward() {
        let a = super::realtime_ns();
        assert!(a > 1_577_836_800_000_000_000);
        assert!(super::realtime_ns() >= a);
    }
}
