//! Parsing of the human quantities a scenario uses: rates, durations, loss.
//!
//! Kept strict on purpose: a typo in a link rate must not silently become
//! "unlimited" or "bits instead of megabits".

use crate::error::ModelError;

/// Parses a rate such as `100mbit`, `1gbit`, `1.5Gbit`, `800kbit` or a bare
/// number of bits per second. Returns bits per second.
pub fn parse_rate(what: &str, s: &str) -> Result<u64, ModelError> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || ModelError::BadValue {
        item: what.to_string(),
        value: s.to_string(),
        expected: "a rate like 100mbit, 1gbit, 500kbit or bits per second".into(),
    };
    let (num, mult) = split_unit(&t, &[("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)]);
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok((v * mult).round() as u64)
}

/// Parses a duration such as `2ms`, `150us`, `1.5s`, `0`. Returns nanoseconds.
pub fn parse_duration(what: &str, s: &str) -> Result<u64, ModelError> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || ModelError::BadValue {
        item: what.to_string(),
        value: s.to_string(),
        expected: "a duration like 2ms, 150us, 1.5s or 0".into(),
    };
    let (num, mult) = split_unit(&t, &[("ms", 1e6), ("us", 1e3), ("ns", 1.0), ("s", 1e9)]);
    if mult == 1.0 && num != "0" && !t.ends_with("ns") {
        // A bare number is ambiguous (ms? s?): refuse it rather than guess.
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    if !v.is_finite() || v < 0.0 {
        return Err(bad());
    }
    Ok((v * mult).round() as u64)
}

/// Parses a loss probability given as percent (`0.5`, `0.5%`). Returns parts
/// per million.
pub fn parse_loss(what: &str, s: &str) -> Result<u32, ModelError> {
    let t = s.trim().trim_end_matches('%');
    let v: f64 = t.parse().map_err(|_| ModelError::BadValue {
        item: what.to_string(),
        value: s.to_string(),
        expected: "a loss in percent between 0 and 100, like 0.5%".into(),
    })?;
    if !v.is_finite() || !(0.0..=100.0).contains(&v) {
        return Err(ModelError::BadValue {
            item: what.to_string(),
            value: s.to_string(),
            expected: "a loss in percent between 0 and 100".into(),
        });
    }
    Ok((v * 10_000.0).round() as u32)
}

fn split_unit<'a>(t: &'a str, units: &[(&str, f64)]) -> (&'a str, f64) {
    for (u, m) in units {
        if let Some(n) = t.strip_suffix(u) {
            return (n.trim(), *m);
        }
    }
    (t, 1.0)
}

/// Formats bits per second the way tc accepts and people read.
pub fn fmt_rate(bps: u64) -> String {
    if bps >= 1_000_000_000 && bps % 1_000_000_000 == 0 {
        format!("{}gbit", bps / 1_000_000_000)
    } else if bps >= 1_000_000 && bps % 1_000_000 == 0 {
        format!("{}mbit", bps / 1_000_000)
    } else if bps >= 1000 && bps % 1000 == 0 {
        format!("{}kbit", bps / 1000)
    } else {
        format!("{bps}bit")
    }
}

/// Formats nanoseconds for output.
pub fn fmt_duration(ns: u64) -> String {
    if ns == 0 {
        "0".into()
    } else if ns % 1_000_000 == 0 {
        format!("{}ms", ns / 1_000_000)
    } else if ns % 1000 == 0 {
        format!("{}us", ns / 1000)
    } else {
        format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("bw", "100mbit").unwrap(), 100_000_000);
        assert_eq!(parse_rate("bw", "1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate("bw", "1.5gbit").unwrap(), 1_500_000_000);
        assert_eq!(parse_rate("bw", "800kbit").unwrap(), 800_000);
        assert_eq!(parse_rate("bw", "12345").unwrap(), 12345);
        assert!(parse_rate("bw", "-5mbit").is_err());
        assert!(parse_rate("bw", "fast").is_err());
        assert_eq!(fmt_rate(100_000_000), "100mbit");
        assert_eq!(fmt_rate(1_500_000_000), "1500mbit");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("d", "2ms").unwrap(), 2_000_000);
        assert_eq!(parse_duration("d", "150us").unwrap(), 150_000);
        assert_eq!(parse_duration("d", "1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_duration("d", "0").unwrap(), 0);
        assert!(parse_duration("d", "5").is_err());
        assert!(parse_duration("d", "-1ms").is_err());
        assert_eq!(fmt_duration(2_000_000), "2ms");
        assert_eq!(fmt_duration(150_000), "150us");
    }

    #[test]
    fn loss() {
        assert_eq!(parse_loss("l", "0.5%").unwrap(), 5000);
        assert_eq!(parse_loss("l", "100").unwrap(), 1_000_000);
        assert!(parse_loss("l", "101").is_err());
        assert!(parse_loss("l", "-1").is_err());
    }
}
