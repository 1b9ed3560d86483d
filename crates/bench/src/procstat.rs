//! CPU accounting from `/proc`: the parsers are pure (text in, numbers out)
//! and unit-tested; the readers are thin wrappers that open the files.
//!
//! Hardware performance counters are not available on the machines we run
//! on, so CPU cost is the kernel's own accounting: `utime + stime` of the
//! process under test (`/proc/<pid>/stat`, in clock ticks, summed over all
//! its threads by the kernel), the nanosecond run time of each of its
//! threads (`/proc/<pid>/task/<tid>/schedstat`, a finer cross-check), and
//! the machine-wide busy time (`/proc/stat`).

use crate::BenchError;
use std::path::Path;

/// CPU time of one process, in clock ticks (`USER_HZ`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessTicks {
    pub utime: u64,
    pub stime: u64,
}

impl ProcessTicks {
    /// Ticks spent between `earlier` and `self`.
    pub fn since(&self, earlier: &ProcessTicks) -> ProcessTicks {
        ProcessTicks {
            utime: self.utime.saturating_sub(earlier.utime),
            stime: self.stime.saturating_sub(earlier.stime),
        }
    }

    pub fn total(&self) -> u64 {
        self.utime + self.stime
    }
}

/// Machine-wide CPU time from the first line of `/proc/stat`, in ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SystemTicks {
    /// user + nice + system + irq + softirq + steal (guest time is already
    /// inside user, so it is not added again).
    pub busy: u64,
    /// busy + idle + iowait.
    pub total: u64,
}

impl SystemTicks {
    pub fn since(&self, earlier: &SystemTicks) -> SystemTicks {
        SystemTicks {
            busy: self.busy.saturating_sub(earlier.busy),
            total: self.total.saturating_sub(earlier.total),
        }
    }
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses
/// and may itself contain spaces and parentheses, so fields are counted
/// from the *last* `)`.
pub fn parse_pid_stat(text: &str) -> Option<ProcessTicks> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, so utime (field 14) is
    // index 11 and stime (field 15) index 12.
    let mut it = rest.split_ascii_whitespace().skip(11);
    let utime = it.next()?.parse().ok()?;
    let stime = it.next()?.parse().ok()?;
    Some(ProcessTicks { utime, stime })
}

/// Parses the aggregate `cpu ` line of `/proc/stat`.
pub fn parse_proc_stat(text: &str) -> Option<SystemTicks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_ascii_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    if v.len() < 8 {
        return None;
    }
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
    Some(SystemTicks {
        busy,
        total: busy + v[3] + v[4],
    })
}

/// Parses `/proc/<pid>/task/<tid>/schedstat`: the first field is the time
/// the thread has run on a CPU, in nanoseconds.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

fn read(path: &Path) -> Result<String, BenchError> {
    std::fs::read_to_string(path).map_err(|source| BenchError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn format_error(path: &Path, what: &'static str) -> BenchError {
    BenchError::Format {
        path: path.display().to_string(),
        what,
    }
}

pub fn process_ticks(pid: u32) -> Result<ProcessTicks, BenchError> {
    let path = Path::new("/proc").join(pid.to_string()).join("stat");
    parse_pid_stat(&read(&path)?).ok_or_else(|| format_error(&path, "no utime/stime fields"))
}

pub fn system_ticks() -> Result<SystemTicks, BenchError> {
    let path = Path::new("/proc/stat");
    parse_proc_stat(&read(path)?).ok_or_else(|| format_error(path, "no aggregate cpu line"))
}

/// Sum of the on-CPU nanoseconds of every thread of `pid` that is alive now.
pub fn process_sched_ns(pid: u32) -> Result<u64, BenchError> {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let entries = std::fs::read_dir(&dir).map_err(|source| BenchError::Read {
        path: dir.display().to_string(),
        source,
    })?;
    let mut sum = 0;
    for e in entries.flatten() {
        let path = e.path().join("schedstat");
        // A thread may exit between listing and reading: skip it.
        if let Ok(text) = std::fs::read_to_string(&path) {
            sum += parse_schedstat(&text).ok_or_else(|| format_error(&path, "no run-time field"))?;
        }
    }
    Ok(sum)
}

/// Clock ticks per second (`USER_HZ`), the unit of `/proc/*stat` times.
pub fn ticks_per_second() -> u64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(t)) if t > 0 => t as u64,
        // Linux has exported USER_HZ = 100 to user space on every architecture.
        _ => 100,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_stat_with_awkward_command_name() {
        let text = "4242 (re fl) (x)) S 1 4242 4242 0 -1 4194560 120 0 0 0 37 15 0 0 20 0 2 0 12345 1000 200 18446744073709551615";
        assert_eq!(parse_pid_stat(text), Some(ProcessTicks { utime: 37, stime: 15 }));
        assert_eq!(parse_pid_stat("12 (x) S 1 2"), None);
        assert_eq!(parse_pid_stat("no paren"), None);
    }

    #[test]
    fn proc_stat_busy_and_total() {
        let text = "cpu  100 5 50 1000 20 3 7 1 40 0\ncpu0 50 2 25 500 10 1 3 0 20 0\nintr 1 2 3\n";
        let t = parse_proc_stat(text).unwrap();
        // user+nice+system+irq+softirq+steal; guest (40) is inside user already.
        assert_eq!(t.busy, 100 + 5 + 50 + 3 + 7 + 1);
        assert_eq!(t.total, t.busy + 1000 + 20);
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 x 3 4 5 6 7 8\n"), None);
    }

    #[test]
    fn deltas_saturate() {
        let a = ProcessTicks { utime: 10, stime: 5 };
        let b = ProcessTicks { utime: 14, stime: 9 };
        assert_eq!(b.since(&a).total(), 8);
        assert_eq!(a.since(&b).total(), 0);
        let s = SystemTicks { busy: 3, total: 10 }.since(&SystemTicks { busy: 1, total: 4 });
        assert_eq!((s.busy, s.total), (2, 6));
    }

    #[test]
    fn schedstat_and_live_reads() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        assert_eq!(parse_schedstat(""), None);
        let me = std::process::id();
        assert!(process_ticks(me).is_ok());
        assert!(process_sched_ns(me).unwrap() > 0);
        let s = system_ticks().unwrap();
        assert!(s.total >= s.busy);
        assert!(ticks_per_second() > 0);
    }
}
