//! The two summaries of a set of readings the bench uses, apart so that
//! the measuring, the probes and the report all take them from below.

/// The figure of a set of windows' ns per copy: their lower quartile.
/// Work that is not the implementation's (another process, the host
/// taking the vCPU's core or its sibling thread) can only add busy time to
/// a window, never take the implementation's away, and on this kind of
/// machine it comes and goes over seconds: a whole repetition can run 20-40 %
/// slow. The lower quartile is the cost seen in the least disturbed
/// quarter of the time, yet not one lucky window (the minimum would be).
pub(crate) fn cost_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[(v.len() - 1) / 4]
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}
