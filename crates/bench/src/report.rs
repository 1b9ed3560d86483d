//! From raw measurements to figures: per-copy CPU, medians over
//! repetitions, ratios against the anchor of the same cell, CSV and the
//! printed table. Pure: no I/O.

use crate::grid::{Cell, Impl};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What one run measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measurement {
    pub datagrams: u64,
    pub copies_expected: u64,
    pub copies_received: u64,
    /// Received copies whose length differed from what was sent.
    pub bad_copies: u64,
    /// Wall time of the measured phase, seconds.
    pub wall_s: f64,
    /// Ticks of the process under test over the measured phase.
    pub proc_user_ticks: u64,
    pub proc_sys_ticks: u64,
    /// On-CPU nanoseconds of the process under test (all threads).
    pub proc_sched_ns: u64,
    /// Machine-wide busy ticks over the measured phase.
    pub system_busy_ticks: u64,
    /// Ticks of the load generator (this process) over the measured phase.
    pub harness_ticks: u64,
    /// `USER_HZ`.
    pub ticks_per_s: u64,
    pub enobufs_waits: u64,
    pub eagain_waits: u64,
    /// Copies the implementation gave up on (must be 0).
    pub send_errors: u64,
    /// Copies the implementation counted as sent minus copies received,
    /// warm-up included (must be 0: its counters match the wire).
    pub counter_mismatch: i64,
}

impl Measurement {
    fn per_copy_ns(&self, ticks: u64) -> f64 {
        if self.copies_received == 0 || self.ticks_per_s == 0 {
            return f64::NAN;
        }
        ticks as f64 * 1e9 / self.ticks_per_s as f64 / self.copies_received as f64
    }

    /// user+sys of the process under test per delivered copy, ns.
    pub fn proc_ns_per_copy(&self) -> f64 {
        self.per_copy_ns(self.proc_user_ticks + self.proc_sys_ticks)
    }

    pub fn proc_user_ns_per_copy(&self) -> f64 {
        self.per_copy_ns(self.proc_user_ticks)
    }

    pub fn proc_sys_ns_per_copy(&self) -> f64 {
        self.per_copy_ns(self.proc_sys_ticks)
    }

    /// Scheduler run time of the process under test per delivered copy, ns.
    pub fn sched_ns_per_copy(&self) -> f64 {
        if self.copies_received == 0 {
            return f64::NAN;
        }
        self.proc_sched_ns as f64 / self.copies_received as f64
    }

    /// Machine-wide busy CPU per delivered copy, ns (includes the load generator).
    pub fn system_ns_per_copy(&self) -> f64 {
        self.per_copy_ns(self.system_busy_ticks)
    }

    /// The load generator's CPU per delivered copy, ns.
    pub fn harness_ns_per_copy(&self) -> f64 {
        self.per_copy_ns(self.harness_ticks)
    }

    /// Busy CPU of everything else on the machine (other programs, kernel
    /// threads) per delivered copy, ns: how much the machine-wide figure
    /// is polluted by load that is not ours.
    pub fn others_ns_per_copy(&self) -> f64 {
        let ours = self.proc_user_ticks + self.proc_sys_ticks + self.harness_ticks;
        self.per_copy_ns(self.system_busy_ticks.saturating_sub(ours))
    }

    pub fn copies_per_s(&self) -> f64 {
        if self.wall_s <= 0.0 {
            return f64::NAN;
        }
        self.copies_received as f64 / self.wall_s
    }

    pub fn loss(&self) -> u64 {
        self.copies_expected.saturating_sub(self.copies_received)
    }
}

/// Median of the finite values (NaN if there are none).
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// One (cell, implementation) over all its repetitions.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub cell: Cell,
    pub imp: Impl,
    pub runs: usize,
    pub datagrams: u64,
    pub copies_expected: u64,
    pub copies_received: u64,
    pub bad_copies: u64,
    pub copies_per_s: f64,
    pub payload_mbps: f64,
    pub proc_ns: f64,
    /// Fastest and slowest run: the spread the median hides.
    pub proc_ns_min: f64,
    pub proc_ns_max: f64,
    pub proc_user_ns: f64,
    pub proc_sys_ns: f64,
    pub sched_ns: f64,
    pub system_ns: f64,
    pub harness_ns: f64,
    pub others_ns: f64,
    pub enobufs_waits: u64,
    pub eagain_waits: u64,
    pub send_errors: u64,
    /// Sum over the runs of |counter_mismatch|.
    pub counter_mismatch: u64,
    /// proc_ns / the anchor's proc_ns in the same cell.
    pub ratio_proc: f64,
    pub ratio_sched: f64,
    pub ratio_system: f64,
    /// Median over repetitions of (this run's proc_ns / the anchor's run of
    /// the same repetition).
    pub ratio_proc_paired: f64,
}

impl Summary {
    pub fn loss(&self) -> u64 {
        self.copies_expected.saturating_sub(self.copies_received)
    }
}

/// Medians per (cell, implementation), then ratios against the anchor.
/// `results` holds (cell, implementation, repetition, measurement).
pub fn summarize(results: &[(Cell, Impl, usize, Measurement)]) -> Vec<Summary> {
    let mut by: BTreeMap<(Cell, Impl), Vec<&Measurement>> = BTreeMap::new();
    for (c, i, _, m) in results {
        by.entry((*c, *i)).or_default().push(m);
    }
    // Paired ratios: each run against the anchor's run of the same cell and
    // repetition, made seconds before it, so slow changes of the machine's
    // load cancel out; their median is a second, more drift-proof estimate.
    let anchor_runs: BTreeMap<(Cell, usize), f64> = results
        .iter()
        .filter(|(_, i, _, _)| *i == Impl::RawLoop)
        .map(|(c, _, rep, m)| ((*c, *rep), m.proc_ns_per_copy()))
        .collect();
    let mut paired: BTreeMap<(Cell, Impl), Vec<f64>> = BTreeMap::new();
    for (c, i, rep, m) in results {
        if let Some(a) = anchor_runs.get(&(*c, *rep)) {
            paired.entry((*c, *i)).or_default().push(m.proc_ns_per_copy() / a);
        }
    }
    let mut out: Vec<Summary> = by
        .into_iter()
        .map(|((cell, imp), ms)| {
            let med = |f: fn(&Measurement) -> f64| median(&ms.iter().map(|m| f(m)).collect::<Vec<_>>());
            let sum = |f: fn(&Measurement) -> u64| ms.iter().map(|m| f(m)).sum::<u64>();
            let copies_per_s = med(Measurement::copies_per_s);
            Summary {
                cell,
                imp,
                runs: ms.len(),
                datagrams: sum(|m| m.datagrams),
                copies_expected: sum(|m| m.copies_expected),
                copies_received: sum(|m| m.copies_received),
                bad_copies: sum(|m| m.bad_copies),
                copies_per_s,
                payload_mbps: copies_per_s * cell.size as f64 * 8.0 / 1e6,
                proc_ns: med(Measurement::proc_ns_per_copy),
                proc_ns_min: ms.iter().map(|m| m.proc_ns_per_copy()).fold(f64::NAN, f64::min),
                proc_ns_max: ms.iter().map(|m| m.proc_ns_per_copy()).fold(f64::NAN, f64::max),
                proc_user_ns: med(Measurement::proc_user_ns_per_copy),
                proc_sys_ns: med(Measurement::proc_sys_ns_per_copy),
                sched_ns: med(Measurement::sched_ns_per_copy),
                system_ns: med(Measurement::system_ns_per_copy),
                harness_ns: med(Measurement::harness_ns_per_copy),
                others_ns: med(Measurement::others_ns_per_copy),
                enobufs_waits: sum(|m| m.enobufs_waits),
                eagain_waits: sum(|m| m.eagain_waits),
                send_errors: sum(|m| m.send_errors),
                counter_mismatch: sum(|m| m.counter_mismatch.unsigned_abs()),
                ratio_proc: f64::NAN,
                ratio_sched: f64::NAN,
                ratio_system: f64::NAN,
                ratio_proc_paired: paired.get(&(cell, imp)).map_or(f64::NAN, |v| median(v)),
            }
        })
        .collect();
    let anchors: BTreeMap<Cell, (f64, f64, f64)> = out
        .iter()
        .filter(|s| s.imp == Impl::RawLoop)
        .map(|s| (s.cell, (s.proc_ns, s.sched_ns, s.system_ns)))
        .collect();
    for s in &mut out {
        if let Some(&(p, k, y)) = anchors.get(&s.cell) {
            s.ratio_proc = s.proc_ns / p;
            s.ratio_sched = s.sched_ns / k;
            s.ratio_system = s.system_ns / y;
        }
    }
    out
}

pub const CSV_HEADER: &str = "payload_bytes,receivers,impl,runs,datagrams,copies_expected,copies_received,loss,bad_copies,\
copies_per_s,payload_mbps,proc_cpu_ns_per_copy,proc_cpu_ns_min,proc_cpu_ns_max,proc_user_ns_per_copy,proc_sys_ns_per_copy,sched_cpu_ns_per_copy,\
system_cpu_ns_per_copy,loadgen_cpu_ns_per_copy,others_cpu_ns_per_copy,enobufs_waits,eagain_waits,send_errors,counter_mismatch,ratio_proc_vs_raw,ratio_sched_vs_raw,ratio_system_vs_raw,ratio_proc_paired_vs_raw";

fn f(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        String::new()
    }
}

pub fn csv(summaries: &[Summary]) -> String {
    let mut s = String::from(CSV_HEADER);
    s.push('\n');
    for r in summaries {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            r.cell.size,
            r.cell.receivers,
            r.imp,
            r.runs,
            r.datagrams,
            r.copies_expected,
            r.copies_received,
            r.loss(),
            r.bad_copies,
            f(r.copies_per_s, 0),
            f(r.payload_mbps, 1),
            f(r.proc_ns, 1),
            f(r.proc_ns_min, 1),
            f(r.proc_ns_max, 1),
            f(r.proc_user_ns, 1),
            f(r.proc_sys_ns, 1),
            f(r.sched_ns, 1),
            f(r.system_ns, 1),
            f(r.harness_ns, 1),
            f(r.others_ns, 1),
            r.enobufs_waits,
            r.eagain_waits,
            r.send_errors,
            r.counter_mismatch,
            f(r.ratio_proc, 3),
            f(r.ratio_sched, 3),
            f(r.ratio_system, 3),
            f(r.ratio_proc_paired, 3),
        );
    }
    s
}

pub const RUNS_CSV_HEADER: &str = "payload_bytes,receivers,impl,rep,datagrams,copies_expected,copies_received,bad_copies,\
wall_s,proc_user_ticks,proc_sys_ticks,proc_sched_ns,system_busy_ticks,loadgen_ticks,ticks_per_s,enobufs_waits,eagain_waits,send_errors,counter_mismatch";

/// Every run, unaggregated, for anyone who wants to redo the statistics.
pub fn runs_csv(results: &[(Cell, Impl, usize, Measurement)]) -> String {
    let mut s = String::from(RUNS_CSV_HEADER);
    s.push('\n');
    for (c, i, rep, m) in results {
        let _ = writeln!(
            s,
            "{},{},{},{},{},{},{},{},{:.6},{},{},{},{},{},{},{},{},{},{}",
            c.size,
            c.receivers,
            i,
            rep,
            m.datagrams,
            m.copies_expected,
            m.copies_received,
            m.bad_copies,
            m.wall_s,
            m.proc_user_ticks,
            m.proc_sys_ticks,
            m.proc_sched_ns,
            m.system_busy_ticks,
            m.harness_ticks,
            m.ticks_per_s,
            m.enobufs_waits,
            m.eagain_waits,
            m.send_errors,
            m.counter_mismatch
        );
    }
    s
}

/// Geometric mean of the finite, positive values.
pub fn geomean(values: &[f64]) -> f64 {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp()
}

/// The printed table: one line per cell and implementation.
pub fn table(summaries: &[Summary]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>5} {:>4} {:>9} {:>10} {:>8} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7} {:>9} {:>8} {:>6}",
        "bytes",
        "rcv",
        "impl",
        "copies/s",
        "Mb/s",
        "proc ns",
        "x raw",
        "sched ns",
        "x raw",
        "system ns",
        "x raw",
        "others ns",
        "ENOBUFS",
        "loss"
    );
    for r in summaries {
        let _ = writeln!(
            s,
            "{:>5} {:>4} {:>9} {:>10} {:>8} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7} {:>9} {:>8} {:>6}",
            r.cell.size,
            r.cell.receivers,
            r.imp.name(),
            f(r.copies_per_s, 0),
            f(r.payload_mbps, 1),
            f(r.proc_ns, 0),
            f(r.ratio_proc, 2),
            f(r.sched_ns, 0),
            f(r.ratio_sched, 2),
            f(r.system_ns, 0),
            f(r.ratio_system, 2),
            f(r.others_ns, 0),
            r.enobufs_waits,
            r.loss()
        );
    }
    s
}

/// One paragraph per implementation: geometric mean and worst ratio over
/// the cells, and how many cells meet `target`.
pub fn verdict(summaries: &[Summary], target: f64) -> String {
    let mut s = String::new();
    // Every reflector implementation measured, in the summaries' order.
    let mut imps: Vec<Impl> = summaries
        .iter()
        .map(|r| r.imp)
        .filter(|&i| i != Impl::RawLoop)
        .collect();
    imps.sort();
    imps.dedup();
    for imp in imps {
        let rows: Vec<&Summary> = summaries.iter().filter(|r| r.imp == imp).collect();
        if rows.is_empty() {
            continue;
        }
        let proc: Vec<f64> = rows.iter().map(|r| r.ratio_proc).collect();
        let sched: Vec<f64> = rows.iter().map(|r| r.ratio_sched).collect();
        let paired: Vec<f64> = rows.iter().map(|r| r.ratio_proc_paired).collect();
        let worst = proc.iter().copied().filter(|x| x.is_finite()).fold(f64::NAN, f64::max);
        let within = proc.iter().filter(|x| x.is_finite() && **x <= target).count();
        let _ = writeln!(
            s,
            "{imp}: CPU per delivered copy vs raw loop: geomean {} (sched {}, paired {}), worst {}; within {target}x in {within}/{} cells",
            f(geomean(&proc), 3),
            f(geomean(&sched), 3),
            f(geomean(&paired), 3),
            f(worst, 3),
            rows.len()
        );
    }
    // What DATA tags cost: an implementation with tags on over the same with
    // tags off (sendmmsg over sendmmsg-untagged), per cell.
    let tagged: Vec<(&Summary, &Summary)> = summaries
        .iter()
        .filter_map(|on| {
            let off = on.imp.untagged()?;
            summaries
                .iter()
                .find(|o| o.imp == off && o.cell == on.cell)
                .map(|o| (on, o))
        })
        .collect();
    let mut with_tags: Vec<Impl> = tagged.iter().map(|(on, _)| on.imp).collect();
    with_tags.sort();
    with_tags.dedup();
    for imp in with_tags {
        let pairs: Vec<&(&Summary, &Summary)> = tagged.iter().filter(|(on, _)| on.imp == imp).collect();
        let cells: Vec<String> = pairs
            .iter()
            .map(|(on, off)| {
                format!(
                    "{} B x {}: {}",
                    on.cell.size,
                    on.cell.receivers,
                    f(on.proc_ns / off.proc_ns, 3)
                )
            })
            .collect();
        let ratios: Vec<f64> = pairs.iter().map(|(on, off)| on.proc_ns / off.proc_ns).collect();
        let _ = writeln!(
            s,
            "DATA tags: CPU per delivered copy with tags on / off ({imp}): geomean {}; {}",
            f(geomean(&ratios), 3),
            cells.join(", ")
        );
    }
    let lost: u64 = summaries.iter().map(Summary::loss).sum();
    let bad: u64 = summaries.iter().map(|r| r.bad_copies + r.send_errors).sum();
    let mismatch: u64 = summaries.iter().map(|r| r.counter_mismatch).sum();
    let _ = writeln!(
        s,
        "copies lost: {lost}; wrong-length copies + send errors: {bad}; \
         implementation's sent counter minus copies received: {mismatch}"
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(copies: u64, user: u64, sys: u64) -> Measurement {
        Measurement {
            datagrams: copies / 3,
            copies_expected: copies,
            copies_received: copies,
            wall_s: 1.0,
            proc_user_ticks: user,
            proc_sys_ticks: sys,
            proc_sched_ns: (user + sys) * 10_000_000,
            system_busy_ticks: 2 * (user + sys),
            harness_ticks: (user + sys) / 2,
            ticks_per_s: 100,
            ..Measurement::default()
        }
    }

    #[test]
    fn per_copy_figures() {
        let x = m(1_000_000, 60, 40);
        // 100 ticks at 100 Hz = 1 s over 1e6 copies = 1000 ns.
        assert!((x.proc_ns_per_copy() - 1000.0).abs() < 1e-9);
        assert!((x.proc_user_ns_per_copy() - 600.0).abs() < 1e-9);
        assert!((x.sched_ns_per_copy() - 1000.0).abs() < 1e-9);
        assert!((x.system_ns_per_copy() - 2000.0).abs() < 1e-9);
        assert!((x.harness_ns_per_copy() - 500.0).abs() < 1e-9);
        assert!((x.others_ns_per_copy() - 500.0).abs() < 1e-9);
        assert!((x.copies_per_s() - 1e6).abs() < 1e-6);
        assert!(Measurement::default().proc_ns_per_copy().is_nan());
    }

    #[test]
    fn medians_and_geomean() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[f64::NAN, 5.0]), 5.0);
        assert!(median(&[]).is_nan());
        assert!((geomean(&[1.0, 4.0]) - 2.0).abs() < 1e-12);
        assert!(geomean(&[f64::NAN]).is_nan());
    }

    #[test]
    fn ratios_against_the_anchor_of_the_same_cell() {
        let a = Cell {
            size: 100,
            receivers: 3,
        };
        let b = Cell {
            size: 100,
            receivers: 30,
        };
        let results = vec![
            (a, Impl::RawLoop, 0, m(1_000_000, 50, 50)),
            (a, Impl::RawLoop, 1, m(1_000_000, 50, 60)),
            (a, Impl::RawLoop, 2, m(1_000_000, 50, 70)),
            (a, Impl::parse("sendto").unwrap(), 0, m(1_000_000, 60, 60)),
            (b, Impl::RawLoop, 0, m(1_000_000, 100, 100)),
            (b, Impl::parse("sendto").unwrap(), 0, m(1_000_000, 100, 150)),
        ];
        let s = summarize(&results);
        assert_eq!(s.len(), 4);
        let get = |c: Cell, i: Impl| s.iter().find(|r| r.cell == c && r.imp == i).unwrap();
        let raw = get(a, Impl::RawLoop);
        assert_eq!(raw.runs, 3);
        assert!((raw.proc_ns - 1100.0).abs() < 1e-9, "median of 1000, 1100, 1200");
        assert!((raw.ratio_proc - 1.0).abs() < 1e-12);
        assert!((raw.proc_ns_min - 1000.0).abs() < 1e-9 && (raw.proc_ns_max - 1200.0).abs() < 1e-9);
        assert!((get(a, Impl::parse("sendto").unwrap()).ratio_proc - 1200.0 / 1100.0).abs() < 1e-9);
        // Paired with repetition 0 of the anchor (1000 ns), not its median.
        assert!((get(a, Impl::parse("sendto").unwrap()).ratio_proc_paired - 1.2).abs() < 1e-9);
        assert!((get(b, Impl::parse("sendto").unwrap()).ratio_proc - 1.25).abs() < 1e-9);
        let text = csv(&s);
        assert_eq!(text.lines().count(), 5);
        assert!(text
            .lines()
            .all(|l| l.split(',').count() == CSV_HEADER.split(',').count()));
        assert!(table(&s).contains("raw-loop"));
        let v = verdict(&s, 1.25);
        assert!(v.contains("within 1.25x in 2/2 cells"), "{v}");
        assert!(v.contains("copies lost: 0"));
    }

    #[test]
    fn loss_is_reported() {
        let mut x = m(300, 1, 1);
        x.copies_received = 290;
        assert_eq!(x.loss(), 10);
        let s = summarize(&[(Cell { size: 50, receivers: 3 }, Impl::parse("sendto").unwrap(), 0, x)]);
        assert_eq!(s[0].loss(), 10);
        assert!(s[0].ratio_proc.is_nan(), "no anchor, no ratio");
        assert!(csv(&s).contains(",290,10,"));
        let runs = runs_csv(&[(Cell { size: 50, receivers: 3 }, Impl::parse("sendto").unwrap(), 0, x)]);
        assert_eq!(runs.lines().count(), 2);
    }
}
