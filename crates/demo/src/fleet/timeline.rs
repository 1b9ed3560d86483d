//! What the run reads from the reflectors' and the control servers'
//! `/metrics` while the bots play: the samples, their timeline and the
//! parsers of the text exposition. Apart because both the run (which
//! fills it) and the analysis (which reads it) need it, and it needs
//! neither.

/// One sample of one reflector's metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sample {
    pub(super) members: u64,
    pub(super) fanned_out: u64,
}

/// `name value` lines of a Prometheus text exposition, for the two
/// families read here (no labels on the aggregates).
pub(super) fn parse_metrics(text: &str) -> Option<Sample> {
    let mut members = None;
    let mut fanned_out = None;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(value)) = (it.next(), it.next()) else {
            continue;
        };
        let v = value.parse::<f64>().ok().map(|f| f as u64);
        match name {
            "reflector_members" => members = v,
            "reflector_fanned_out_total" => fanned_out = v,
            _ => {}
        }
    }
    Some(Sample {
        members: members?,
        fanned_out: fanned_out?,
    })
}

/// The metrics timeline: per poll, the real time since the bots started
/// and each reflector's sample (absent when it did not answer).
#[derive(Default)]
pub(super) struct Timeline {
    pub(super) rows: Vec<(f64, Vec<Option<Sample>>)>,
    /// Per poll of the control servers: the real times it started and
    /// ended, and each one's counters so far (absent when it did not
    /// answer).
    pub(super) controls: Vec<ControlPoll>,
}

/// One poll of every control server's `/metrics`.
#[derive(Clone, Debug, Default)]
pub(super) struct ControlPoll {
    pub(super) start: f64,
    pub(super) end: f64,
    pub(super) servers: Vec<Option<ControlSample>>,
}

/// A control server's counters, read from its `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ControlSample {
    /// 429s (`reflector_control_join_rate_limited_total`).
    pub(super) rate_limited: u64,
    /// `/join`s answered with a grant (`reflector_control_joins_answered_total`).
    pub(super) joins_answered: u64,
    /// `/join`s that got no grant, every cause
    /// (`reflector_control_join_failures_total{cause}` summed).
    pub(super) join_failures: u64,
}

/// The counters of a control server's `/metrics` (text format); `None`
/// without any of them.
pub(super) fn parse_control_metrics(text: &str) -> Option<ControlSample> {
    let (mut rate_limited, mut answered, mut failures) = (None, None, None);
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(name), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let Some(v) = v.parse::<f64>().ok().map(|f| f as u64) else {
            continue;
        };
        let family = name.split_once('{').map_or(name, |(f, _)| f);
        match family {
            "reflector_control_join_rate_limited_total" => rate_limited = Some(v),
            "reflector_control_joins_answered_total" => answered = Some(v),
            "reflector_control_join_failures_total" => failures = Some(failures.unwrap_or(0) + v),
            _ => {}
        }
    }
    Some(ControlSample {
        rate_limited: rate_limited?,
        joins_answered: answered?,
        join_failures: failures?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_counters_are_read_from_their_metrics() {
        let text = "# TYPE reflector_control_join_rate_limited_total counter\n\
                    reflector_control_join_rate_limited_total 7\n\
                    reflector_control_joins_answered_total 120\n\
                    reflector_control_join_failures_total{cause=\"unplaced\"} 2\n\
                    reflector_control_join_failures_total{cause=\"too_many_cells\"} 0\n\
                    reflector_control_join_failures_total{cause=\"bad_request\"} 1\n\
                    reflector_control_join_rate_limited_other_total 9\n";
        assert_eq!(
            parse_control_metrics(text),
            Some(ControlSample {
                rate_limited: 7,
                joins_answered: 120,
                join_failures: 3
            })
        );
        // A control server without the join counters is no sample.
        assert_eq!(
            parse_control_metrics("reflector_control_join_rate_limited_total 7\n"),
            None
        );
    }

    #[test]
    fn metrics_text_gives_members_and_copies() {
        let text = "# HELP reflector_members x\n# TYPE reflector_members gauge\nreflector_members 42\n\
                    reflector_fanned_out_total 12345\nreflector_group_members{group=\"4000\"} 3\n";
        let s = parse_metrics(text).unwrap();
        assert_eq!((s.members, s.fanned_out), (42, 12345));
        assert!(parse_metrics("reflector_members 1\n").is_none());
    }
}
