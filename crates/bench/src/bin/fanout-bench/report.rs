//! A cell's figure from its repetitions, the CSV and the summary lines.

use crate::measure::Sample;
use crate::stats::{cost_of, median};

use std::io::Write as _;
use std::path::PathBuf;

/// One cell's figures over its repetitions.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cell {
    /// Each repetition's ns per copy, in run order.
    pub(crate) runs: Vec<f64>,
    pub(crate) ns_per_copy: f64,
    pub(crate) busy_pct: f64,
    pub(crate) sender_busy_pct: f64,
    pub(crate) cpu_copies_per_s: f64,
    /// Copies counted in the CPU phases' measured windows, all repetitions.
    pub(crate) cpu_copies: u64,
    /// The lowest share of received packets processed on the measured CPU.
    pub(crate) rx_on_measured_pct: f64,
    /// The lowest share of copies transmitted on the measured CPU.
    pub(crate) copies_on_measured_pct: f64,
    /// The highest busy fraction of the measured CPU before a phase.
    pub(crate) background_pct: f64,
    /// The lowest and highest [`CpuPhase::counted_vs_sent_pct`].
    pub(crate) counted_vs_sent_pct: (f64, f64),
    pub(crate) stalls: u64,
    pub(crate) sent: u64,
    pub(crate) delivered: u64,
    pub(crate) delivered_per_s: f64,
    /// The cost of a copy in probe steps: the lower quartile of every
    /// window of every repetition, each divided by its phase's probe
    /// reading (see [`crate::probe`]).
    pub(crate) steps_per_copy: f64,
    /// Each repetition's cost of a copy in probe steps, in run order.
    pub(crate) step_runs: Vec<f64>,
    /// The clock probe's ns per step, the median over the repetitions.
    pub(crate) probe_ns: f64,
    /// The cache probe's ns per step: the median and the highest over the
    /// repetitions (a diagnostic).
    pub(crate) cache_probe_ns: (f64, f64),
}

impl Cell {
    pub(crate) fn of(samples: &[Sample]) -> Cell {
        let m = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
        Cell {
            runs: samples.iter().map(|s| s.cpu.ns_per_copy).collect(),
            // Over every window of every repetition.
            ns_per_copy: cost_of(samples.iter().flat_map(|s| s.cpu.windows.iter().copied()).collect()),
            busy_pct: m(|s| s.cpu.busy_pct),
            sender_busy_pct: m(|s| s.cpu.sender_busy_pct),
            cpu_copies_per_s: m(|s| s.cpu.copies_per_s),
            cpu_copies: samples.iter().map(|s| s.cpu.copies).sum(),
            rx_on_measured_pct: samples
                .iter()
                .map(|s| s.cpu.rx_on_measured_pct)
                .fold(f64::NAN, f64::min),
            copies_on_measured_pct: samples
                .iter()
                .map(|s| s.cpu.copies_on_measured_pct)
                .fold(f64::NAN, f64::min),
            background_pct: samples.iter().map(|s| s.cpu.background_pct).fold(f64::NAN, f64::max),
            counted_vs_sent_pct: (
                samples
                    .iter()
                    .map(|s| s.cpu.counted_vs_sent_pct)
                    .fold(f64::NAN, f64::min),
                samples
                    .iter()
                    .map(|s| s.cpu.counted_vs_sent_pct)
                    .fold(f64::NAN, f64::max),
            ),
            stalls: samples.iter().map(|s| s.cpu.stalls).sum(),
            sent: samples.iter().map(|s| s.sent).sum(),
            delivered: samples.iter().map(|s| s.delivered).sum(),
            delivered_per_s: m(|s| s.copies_per_s),
            steps_per_copy: cost_of(samples.iter().flat_map(|s| s.cpu.step_windows()).collect()),
            step_runs: samples.iter().map(|s| cost_of(s.cpu.step_windows())).collect(),
            probe_ns: m(|s| s.cpu.probe_ns),
            cache_probe_ns: (
                m(|s| s.cpu.cache_probe_ns),
                samples.iter().map(|s| s.cpu.cache_probe_ns).fold(f64::NAN, f64::max),
            ),
        }
    }

    pub(crate) fn min(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NAN, f64::min)
    }

    pub(crate) fn max(&self) -> f64 {
        self.runs.iter().copied().fold(f64::NAN, f64::max)
    }

    /// (max - min) as % of the median.
    pub(crate) fn spread_pct(&self) -> f64 {
        (self.max() - self.min()) * 100.0 / self.ns_per_copy
    }

    /// The same spread for the figures in probe steps.
    pub(crate) fn step_spread_pct(&self) -> f64 {
        let lo = self.step_runs.iter().copied().fold(f64::NAN, f64::min);
        let hi = self.step_runs.iter().copied().fold(f64::NAN, f64::max);
        (hi - lo) * 100.0 / self.steps_per_copy
    }
}

pub(crate) struct Row {
    pub(crate) size: usize,
    pub(crate) receivers: usize,
    pub(crate) imp: String,
    pub(crate) rate: u64,
    pub(crate) cell: Cell,
    pub(crate) expected: u64,
}

pub(crate) fn write_csv(out: &PathBuf, rows: &[Row]) -> Result<(), String> {
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    let mut f = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut text = String::from(
        "size,receivers,impl,rate_dps,sent,expected,delivered,lost,copies_per_s,ns_per_copy,ns_per_copy_min,ns_per_copy_max,spread_pct,ns_per_copy_runs,cpu_copies,cpu_copies_per_s,busy_pct,sender_busy_pct,background_pct,copies_on_measured_pct,rx_on_measured_pct,counted_vs_sent_pct_min,counted_vs_sent_pct_max,stalls,vs_sendto,vs_multicast,vs_raw_loop,probe_ns_per_step,steps_per_copy,steps_per_copy_runs,steps_spread_pct,cache_probe_ns_per_step,cache_probe_ns_per_step_max\n",
    );
    for r in rows {
        let c = &r.cell;
        let of = |name: &str| {
            rows.iter()
                .find(|x| x.size == r.size && x.receivers == r.receivers && x.imp == name)
                .map(|x| x.cell.ns_per_copy)
        };
        let ratio = |anchor: Option<f64>| anchor.map_or(String::new(), |x| format!("{:.3}", c.ns_per_copy / x));
        text.push_str(&format!(
            "{},{},{},{},{},{},{},{},{:.0},{:.1},{:.1},{:.1},{:.1},{},{},{:.0},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{:.3},{:.1},{},{:.1},{:.3},{:.3}\n",
            r.size,
            r.receivers,
            r.imp,
            r.rate,
            c.sent,
            r.expected,
            c.delivered,
            r.expected.saturating_sub(c.delivered),
            c.delivered_per_s,
            c.ns_per_copy,
            c.min(),
            c.max(),
            c.spread_pct(),
            c.runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(";"),
            c.cpu_copies,
            c.cpu_copies_per_s,
            c.busy_pct,
            c.sender_busy_pct,
            c.background_pct,
            c.copies_on_measured_pct,
            c.rx_on_measured_pct,
            c.counted_vs_sent_pct.0,
            c.counted_vs_sent_pct.1,
            c.stalls,
            ratio(of("sendto")),
            ratio(of("multicast")),
            ratio(of("raw-loop")),
            c.probe_ns,
            c.steps_per_copy,
            c.step_runs.iter().map(|x| format!("{x:.1}")).collect::<Vec<_>>().join(";"),
            c.step_spread_pct(),
            c.cache_probe_ns.0,
            c.cache_probe_ns.1,
        ));
    }
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// The goals at 90 receivers (sendto/ebpf at least 4x, ebpf/multicast at
/// most 1.5x), and clients per core at 100 B.
pub(crate) fn summarize(rows: &[Row]) {
    let ns = |size: usize, r: usize, imp: &str| {
        rows.iter()
            .find(|x| x.size == size && x.receivers == r && x.imp == imp)
            .map(|x| x.cell.ns_per_copy)
    };
    for size in rows.iter().map(|r| r.size).collect::<std::collections::BTreeSet<_>>() {
        let (e, s, mm, m) = (
            ns(size, 90, "ebpf"),
            ns(size, 90, "sendto"),
            ns(size, 90, "sendmmsg"),
            ns(size, 90, "multicast"),
        );
        let head = format!("{size} B, 90 receivers (ns per copy, one run):");
        let mut line = head.clone();
        if let (Some(e), Some(s)) = (e, s) {
            line += &format!(" sendto/ebpf = {:.2}x (goal >= 4)", s / e);
        }
        if let (Some(e), Some(m)) = (e, m) {
            line += &format!(" ebpf/multicast = {:.2}x (goal <= 1.5)", e / m);
        }
        if let (Some(mm), Some(s)) = (mm, s) {
            line += &format!(" sendmmsg/sendto = {:.2}x", mm / s);
        }
        if let (Some(mm), Some(raw)) = (mm, ns(size, 90, "raw-loop")) {
            line += &format!(" sendmmsg/raw-loop = {:.2}x", mm / raw);
        }
        if line != head {
            println!("{line}");
        }
    }
    // Paper 000 §6: a client sends 8 kb/s in 100-byte datagrams, so each one
    // the reflector serves takes 10 copies/s of its output.
    for imp in ["sendto", "sendmmsg", "ebpf", "multicast"] {
        if let Some(ns) = ns(100, 90, imp).filter(|x| *x > 0.0) {
            println!(
                "{imp}: one core makes {:.0} copies/s at 100 B, 90 receivers: {:.0} clients of 8 kb/s (paper: 7,500 per Fast-Ethernet reflector)",
                1e9 / ns,
                1e9 / ns / 10.0
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::CpuPhase;

    #[test]
    fn a_cells_figure_is_the_lower_quartile_of_all_its_windows() {
        let s = |windows: &[f64]| Sample {
            cpu: CpuPhase {
                ns_per_copy: cost_of(windows.to_vec()),
                windows: windows.to_vec(),
                ..CpuPhase::default()
            },
            ..Sample::default()
        };
        // A repetition slowed throughout by other work does not move the
        // figure; the spread of the repetitions' own figures shows it.
        let c = Cell::of(&[
            s(&[100.0, 101.0, 99.0, 103.0]),
            s(&[140.0, 138.0, 141.0, 139.0]),
            s(&[98.0, 102.0, 100.0, 104.0]),
        ]);
        assert_eq!(c.ns_per_copy, 100.0);
        assert_eq!(c.runs, vec![99.0, 138.0, 98.0]);
        assert!((c.spread_pct() - 40.0).abs() < 1e-9);
        assert!(cost_of(Vec::new()).is_nan());
        assert_eq!(cost_of(vec![5.0]), 5.0);
    }

    #[test]
    fn a_cells_step_figure_divides_each_window_by_its_own_phases_probe() {
        let s = |windows: &[f64], probe_ns: f64| Sample {
            cpu: CpuPhase {
                ns_per_copy: cost_of(windows.to_vec()),
                windows: windows.to_vec(),
                probe_ns,
                ..CpuPhase::default()
            },
            ..Sample::default()
        };
        // The second repetition ran on a CPU 40 % slower (the probe says so
        // too): in steps the two agree, in ns they are 40 % apart.
        let c = Cell::of(&[
            s(&[100.0, 104.0, 102.0, 106.0], 2.0),
            s(&[140.0, 144.0, 142.0, 146.0], 2.8),
        ]);
        assert_eq!(c.runs, vec![100.0, 140.0]);
        assert_eq!(c.step_runs.len(), 2);
        assert!(c.step_runs.iter().all(|x| (x - 50.0).abs() < 1e-9), "{:?}", c.step_runs);
        assert!((c.steps_per_copy - 50.0).abs() < 1e-9, "{}", c.steps_per_copy);
        assert!(c.spread_pct() > 39.0, "{}", c.spread_pct());
        assert!(c.step_spread_pct() < 1e-6, "{}", c.step_spread_pct());
        assert_eq!(c.probe_ns, 2.8, "the median of two is the upper one");
    }
}
