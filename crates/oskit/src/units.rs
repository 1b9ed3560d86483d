//! Durations on the command line, written with their unit (`30s`,
//! `500ms`, `1m30s`; humantime's syntax), so no option has to say in its
//! name or help whether it counts milliseconds or seconds.

use std::time::Duration;

/// A duration with its unit; a bare number is refused with a hint.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.parse::<f64>().is_ok() {
        return Err(format!("'{s}' has no unit: write e.g. {t}s or {t}ms"));
    }
    humantime::parse_duration(t).map_err(|e| format!("'{s}' is not a duration like 30s or 500ms: {e}"))
}

/// A duration with its unit, or a bare number of seconds (the unit such an
/// option always had, so existing command lines keep their meaning).
pub fn secs_or_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    match t.parse::<f64>() {
        Ok(v) if (0.0..1e9).contains(&v) => Ok(Duration::from_secs_f64(v)),
        Ok(_) => Err(format!("'{s}' is not a number of seconds from 0 up")),
        Err(_) => duration(t),
    }
}

/// A value parser for durations with a unit from `min` to `max`.
pub fn duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| within(duration(s)?, s, min, max)
}

/// A value parser for durations with a unit, or bare seconds, from `min` to `max`.
pub fn secs_or_duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| within(secs_or_duration(s)?, s, min, max)
}

fn within(d: Duration, s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    if d < min || d > max {
        return Err(format!(
            "'{s}' is not from {} to {}",
            humantime::format_duration(min),
            humantime::format_duration(max)
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_their_unit() {
        assert_eq!(duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("1m 30s"), Ok(Duration::from_secs(90)));
        let e = duration("10000").unwrap_err();
        assert!(e.contains("no unit") && e.contains("10000ms"), "{e}");
        assert!(duration("soon").unwrap_err().contains("'soon'"));
        assert!(duration("").is_err());
    }

    #[test]
    fn bare_numbers_are_seconds_where_they_always_were() {
        assert_eq!(secs_or_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(secs_or_duration("250ms"), Ok(Duration::from_millis(250)));
        assert!(secs_or_duration("-1").is_err());
        assert!(secs_or_duration("nan").is_err());
        assert!(secs_or_duration("inf").is_err());
    }

    #[test]
    fn bounds_are_named_with_units() {
        let p = duration_in(Duration::from_millis(100), Duration::from_secs(600));
        assert_eq!(p("100ms"), Ok(Duration::from_millis(100)));
        let e = p("99ms").unwrap_err();
        assert!(e.contains("100ms") && e.contains("10m"), "{e}");
        assert!(p("11m").is_err());
        let p = secs_or_duration_in(Duration::from_secs(1), Duration::from_secs(86_400));
        assert_eq!(p("300"), Ok(Duration::from_secs(300)));
        assert!(p("0.5").is_err());
    }
}
