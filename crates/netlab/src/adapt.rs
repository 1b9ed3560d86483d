//! Adaptive time dilation (paper 003's Emulation Monitor and Time Dilation
//! Adaptor): sample how busy the machine is over each epoch, raise the TDF
//! when the emulation is overloaded (it cannot keep up with real time, so
//! fidelity would suffer), lower it when the machine is mostly idle (the run
//! would take longer than it needs). The policy is pure and unit-tested; the
//! loop that samples `/proc/stat` and applies the decision is [`run`].

use crate::error::LabError;
use crate::lab::RunState;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// When to change the TDF, and within which bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Policy {
    pub min_tdf: u32,
    pub max_tdf: u32,
    /// Busy fraction of all CPUs above which the emulation is overloaded.
    pub high: f64,
    /// Busy fraction below which the machine is idle enough to speed up.
    pub low: f64,
    pub epoch: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min_tdf: 1,
            max_tdf: 16,
            high: 0.85,
            low: 0.40,
            epoch: Duration::from_secs(1),
        }
    }
}

impl Policy {
    /// The TDF for the next epoch, given this epoch's busy fraction. Under
    /// overload it grows in proportion to the overload (at least by one),
    /// so one step usually suffices; saturated (busy at or over
    /// [`SATURATED`]) the overload cannot be measured, since busy time
    /// cannot exceed 100%, so it doubles. When idle it shrinks by one, so
    /// the emulation does not oscillate. Always within `[min_tdf, max_tdf]`.
    pub fn next(&self, tdf: u32, busy: f64) -> u32 {
        let next = if busy >= SATURATED {
            tdf.saturating_mul(2).max(tdf + 1)
        } else if busy > self.high {
            let scaled = (f64::from(tdf) * busy / self.high).ceil() as u32;
            scaled.max(tdf + 1)
        } else if busy < self.low {
            tdf.saturating_sub(1)
        } else {
            tdf
        };
        next.clamp(self.min_tdf.max(1), self.max_tdf.max(self.min_tdf.max(1)))
    }
}

/// Busy fraction from which the machine counts as saturated: how far
/// behind the emulation is cannot be read from the CPU any more.
pub const SATURATED: f64 = 0.97;

/// Parses `--adaptive-tdf MIN-MAX`.
pub fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once('-')
        .ok_or_else(|| format!("'{s}' is not a range MIN-MAX, e.g. 1-8"))?;
    let p = |x: &str| {
        x.trim()
            .parse::<u32>()
            .map_err(|_| format!("'{x}' in '{s}' is not a whole number"))
    };
    let (a, b) = (p(a)?, p(b)?);
    if a == 0 || b < a || b > 1000 {
        return Err(format!("'{s}': need 1 <= MIN <= MAX <= 1000"));
    }
    Ok((a, b))
}

/// Samples the machine every epoch and applies the policy to the lab until
/// `stop` is set; writes `seconds,busy,tdf` lines to `trace` and returns the
/// TDF in force at the end.
pub fn run(state: &RunState, policy: Policy, stop: &AtomicBool, trace: &mut dyn Write) -> Result<vtime::Tdf, LabError> {
    let mut st = state.clone();
    let t0 = Instant::now();
    let _ = writeln!(trace, "seconds,busy,tdf");
    let _ = writeln!(trace, "0.000,,{}", st.tdf);
    let mut last = oskit::procfs::system_ticks()?;
    let mut next = t0 + policy.epoch;
    while !stop.load(Ordering::Relaxed) {
        // Short sleeps so a stop is seen quickly.
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(20).min(next.saturating_duration_since(Instant::now())));
            continue;
        }
        next += policy.epoch;
        let now = oskit::procfs::system_ticks()?;
        let d = now.since(&last);
        last = now;
        let busy = if d.total > 0 {
            d.busy as f64 / d.total as f64
        } else {
            0.0
        };
        // The policy steps in whole factors; a lab started at a fractional
        // one (2.5) takes its first step from the next whole one up.
        let whole = st.tdf.num().div_ceil(st.tdf.den()).min(u64::from(u32::MAX)) as u32;
        let tdf = vtime::Tdf::new(u64::from(policy.next(whole, busy)), 1).map_err(|reason| vtime::Error::BadTdf {
            input: whole.to_string(),
            reason,
        })?;
        if tdf != st.tdf {
            crate::lab::set_tdf(&st, tdf)?;
            st.tdf = tdf;
        }
        let _ = writeln!(trace, "{:.3},{busy:.3},{}", t0.elapsed().as_secs_f64(), st.tdf);
    }
    Ok(st.tdf)
}
