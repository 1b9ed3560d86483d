//! What a run reports: per-thread and total counts (captured, the
//! kernel's, the capture's own losses, CPU time) and their text.

use std::fmt;
use std::time::Duration;

use crate::source::{KernelStats, Mode};

/// Statistics of one worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadReport {
    pub cpu: Option<usize>,
    /// Packets taken from the socket and passed to the output.
    pub captured: u64,
    pub bytes: u64,
    pub kernel: KernelStats,
    /// Read from the socket but not output because the count was reached
    /// (only `recv` mode reads before it can decline a packet).
    pub beyond_limit: u64,
    /// Ring entries whose headers did not fit the ring (never seen on a correct kernel).
    pub malformed: u64,
    /// Packets kept shorter than the snaplen because a ring frame was too small.
    pub truncated: u64,
    /// Captured, but dropped before reaching the file because a second stop
    /// signal asked to stop at once.
    pub not_written: u64,
    pub cpu_user: Duration,
    pub cpu_sys: Duration,
}

/// Statistics of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    pub mode: Option<Mode>,
    pub threads: Vec<ThreadReport>,
    pub elapsed: Duration,
    /// Stopped at once by [`Control::abort`] (a second Ctrl-C).
    pub aborted: bool,
}

impl Report {
    pub fn captured(&self) -> u64 {
        self.threads.iter().map(|t| t.captured).sum()
    }
    pub fn kernel(&self) -> KernelStats {
        let mut k = KernelStats::default();
        for t in &self.threads {
            k.add(&t.kernel);
        }
        k
    }
    /// Packets the capture did not output: kernel drops plus our own.
    pub fn lost(&self) -> u64 {
        self.kernel().drops + self.threads.iter().map(|t| t.malformed).sum::<u64>()
    }
    pub fn cpu(&self) -> Duration {
        self.threads.iter().map(|t| t.cpu_user + t.cpu_sys).sum()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, name: &str, t: &ThreadReport| {
            let cpu = t.cpu_user + t.cpu_sys;
            let per = if t.captured > 0 {
                cpu.as_secs_f64() * 1e9 / t.captured as f64
            } else {
                0.0
            };
            writeln!(
                f,
                "{name}: captured {} packets ({} bytes); kernel: {} accepted by filter, {} dropped, {} queue freezes; \
                 ours: {} malformed, {} truncated by the ring, {} read beyond -c; cpu {:.3}s user + {:.3}s sys ({:.0} ns/packet)",
                t.captured,
                t.bytes,
                t.kernel.packets,
                t.kernel.drops,
                t.kernel.freeze_q_cnt,
                t.malformed,
                t.truncated,
                t.beyond_limit,
                t.cpu_user.as_secs_f64(),
                t.cpu_sys.as_secs_f64(),
                per
            )
        };
        if self.threads.len() > 1 {
            for (i, t) in self.threads.iter().enumerate() {
                let name = match t.cpu {
                    Some(c) => format!("thread {i} (cpu {c})"),
                    None => format!("thread {i}"),
                };
                line(f, &name, t)?;
            }
        }
        let mut total = ThreadReport {
            captured: self.captured(),
            bytes: self.threads.iter().map(|t| t.bytes).sum(),
            kernel: self.kernel(),
            beyond_limit: self.threads.iter().map(|t| t.beyond_limit).sum(),
            malformed: self.threads.iter().map(|t| t.malformed).sum(),
            truncated: self.threads.iter().map(|t| t.truncated).sum(),
            not_written: self.threads.iter().map(|t| t.not_written).sum(),
            cpu_user: self.threads.iter().map(|t| t.cpu_user).sum(),
            cpu_sys: self.threads.iter().map(|t| t.cpu_sys).sum(),
            cpu: None,
        };
        if self.threads.len() == 1 {
            total.cpu = self.threads[0].cpu;
        }
        line(f, "total", &total)?;
        if self.aborted {
            // Accepted by the filter, neither dropped nor taken: still in the ring.
            let unread = total.kernel.packets.saturating_sub(total.kernel.drops + total.captured);
            writeln!(
                f,
                "stopped at once: {} captured packets not written, {unread} left unread in the kernel; \
                 the output holds the other {}",
                total.not_written,
                total.captured - total.not_written
            )?;
        }
        let k = total.kernel.packets.max(1);
        write!(
            f,
            "lost: {} of {} ({:.3}%) in {:.3}s, mode {}",
            self.lost(),
            total.kernel.packets,
            self.lost() as f64 * 100.0 / k as f64,
            self.elapsed.as_secs_f64(),
            self.mode.map_or("-", Mode::name)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_totals_and_text() {
        let t = |c, d| ThreadReport {
            captured: c,
            bytes: c * 64,
            kernel: KernelStats {
                packets: c + d,
                drops: d,
                freeze_q_cnt: 0,
            },
            ..Default::default()
        };
        let r = Report {
            mode: Some(Mode::V3),
            threads: vec![t(10, 2), t(5, 0)],
            elapsed: Duration::from_secs(1),
            aborted: false,
        };
        assert_eq!(r.captured(), 15);
        assert_eq!(r.lost(), 2);
        let s = r.to_string();
        assert!(s.contains("thread 1"), "{s}");
        assert!(s.contains("total: captured 15 packets"), "{s}");
        assert!(s.contains("lost: 2 of 17"), "{s}");
        assert!(!s.contains("stopped at once"), "{s}");
        // Stopped at once: 4 encoded but not written, 3 still in the ring.
        let mut first = t(10, 2);
        first.not_written = 4;
        first.kernel.packets += 3;
        let r = Report {
            threads: vec![first],
            aborted: true,
            ..r
        };
        let s = r.to_string();
        assert!(
            s.contains("stopped at once: 4 captured packets not written, 3 left unread in the kernel; the output holds the other 6"),
            "{s}"
        );
    }
}
