//! The measured CPU's state, read just before and just after each CPU
//! phase: fixed pieces of pure user-space work timed on that CPU.
//!
//! Why: on a virtual machine the same work costs more or less time as the
//! host's load changes, over seconds to minutes, so ns per copy measured in
//! two runs can differ by more than the implementations do. Perf counters
//! (cycles, instructions) would see past some of that, but a guest without a
//! virtual PMU has none (`perf stat -e cycles` says "not supported"). Two
//! probes stand in, each a walk through a ring of indices in a fixed
//! pseudo-random order (each step a load that waits for the one before):
//!
//! - the **clock probe**, a 16 KiB ring that stays in the core's L1 cache:
//!   its ns per step moves with the core's clock and with the share of the
//!   core the vCPU gets. The CPU phase's windows are also divided by it,
//!   giving a copy's cost in clock-probe steps, a unit that follows the
//!   CPU's speed (the stand-in for cycles);
//! - the **cache probe**, a 256 KiB ring that fits the core's L2 but not
//!   L1: its ns per step rises when something else evicts the core's L2
//!   (another guest on the core between our slices, the host), which slows
//!   the kernel's per-packet work too. Printed as a diagnostic only.
//!
//! Whether a figure in steps reproduces better than ns per copy is for the
//! runs to show (`bench/fanout_repro.py` prints both); it is not assumed.

use std::hint::black_box;
use std::time::Instant;

/// Entries of the clock probe's ring: 16 KiB of `u32`, half of the
/// smallest L1 data cache of the CPUs this runs on.
const CLOCK_RING: usize = 4 * 1024;

/// Entries of the cache probe's ring: 256 KiB of `u32`, more than a core's
/// L1 and well within its L2.
const CACHE_RING: usize = 64 * 1024;

/// Steps per timed slice (a fraction of a millisecond).
const STEPS: usize = 100_000;

/// Timed slices per reading.
const SLICES: usize = 40;

/// A ring: a single cycle through every entry in a fixed pseudo-random
/// order (the same in every run, so that the unit is too), which defeats
/// the prefetchers.
struct Ring(Vec<u32>);

impl Ring {
    fn new(entries: usize) -> Ring {
        // Sattolo's shuffle of the identity gives one cycle through all.
        let mut ring: Vec<u32> = (0..entries as u32).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..entries).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let j = (x % i as u64) as usize;
            ring.swap(i, j);
        }
        Ring(ring)
    }

    /// Walks `steps` steps from `from`; returns where it stopped.
    fn walk(&self, from: u32, steps: usize) -> u32 {
        let mut i = from;
        for _ in 0..steps {
            i = self.0[i as usize];
        }
        i
    }

    /// ns per step now (on the calling thread's CPU): the lower quartile
    /// of [`SLICES`] timed slices, after one walk around the ring that
    /// brings it into the cache (a slice the host interrupted is slower,
    /// never faster).
    fn time(&self) -> f64 {
        let mut at = self.walk(0, self.0.len());
        let mut per_step = Vec::with_capacity(SLICES);
        for _ in 0..SLICES {
            let t = Instant::now();
            at = self.walk(black_box(at), STEPS);
            per_step.push(t.elapsed().as_nanos() as f64 / STEPS as f64);
        }
        black_box(at);
        crate::stats::cost_of(per_step)
    }
}

/// One reading of both probes, ns per step.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Reading {
    pub(crate) clock_ns: f64,
    pub(crate) cache_ns: f64,
}

/// The two probes' rings, built once per run.
pub(crate) struct Probe {
    clock: Ring,
    cache: Ring,
}

impl Probe {
    pub(crate) fn new() -> Probe {
        Probe {
            clock: Ring::new(CLOCK_RING),
            cache: Ring::new(CACHE_RING),
        }
    }

    /// Both probes on `cpu` now, from a thread pinned there.
    pub(crate) fn read(&self, cpu: usize) -> Result<Reading, String> {
        std::thread::scope(|s| {
            s.spawn(|| {
                oskit::cpu::pin_this_thread(cpu).map_err(|e| format!("the probe cannot run on CPU {cpu}: {e}"))?;
                Ok(Reading {
                    clock_ns: self.clock.time(),
                    cache_ns: self.cache.time(),
                })
            })
            .join()
            .map_err(|_| "the probe's thread panicked".to_string())?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_one_cycle_through_every_entry() {
        for n in [CLOCK_RING, CACHE_RING] {
            let r = Ring::new(n);
            let mut seen = vec![false; n];
            let mut i = 0u32;
            for _ in 0..n {
                assert!(!seen[i as usize], "entry {i} visited twice before the cycle closed");
                seen[i as usize] = true;
                i = r.0[i as usize];
            }
            assert_eq!(i, 0, "the walk is back where it started after {n} steps");
            assert_eq!(r.walk(0, n), 0);
        }
    }

    #[test]
    fn a_reading_is_a_positive_time_per_step_for_each_probe() {
        let p = Probe::new();
        let cpu = oskit::cpu::allowed_cpus()[0];
        let r = p.read(cpu).unwrap();
        assert!(r.clock_ns > 0.0 && r.clock_ns.is_finite(), "{r:?}");
        assert!(r.cache_ns > 0.0 && r.cache_ns.is_finite(), "{r:?}");
        assert!(p.read(usize::MAX / 2).is_err());
    }
}
