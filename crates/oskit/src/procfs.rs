//! Reading `/proc`: the parsers are pure (text in, numbers out) and
//! unit-tested; the readers are thin wrappers that open the files.
//!
//! Hardware performance counters are not available on the machines we run
//! on, so CPU cost is the kernel's own accounting: `utime + stime` of a
//! process (`/proc/<pid>/stat`, in clock ticks, summed over its threads by
//! the kernel), the nanosecond run time of each thread
//! (`/proc/<pid>/task/<tid>/schedstat`), and the machine-wide busy time
//! (`/proc/stat`).

use crate::SysError;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
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

/// The fields of `/proc/<pid>/stat` after the command name. The name
/// (field 2) is in parentheses and may itself contain spaces and
/// parentheses, so fields are counted from the *last* `)`: index 0 is the
/// state (field 3).
fn fields_after_name(text: &str) -> Option<std::str::SplitAsciiWhitespace<'_>> {
    Some(text[text.rfind(')')? + 1..].split_ascii_whitespace())
}

/// utime (field 14) and stime (field 15) from `/proc/<pid>/stat`.
pub fn parse_pid_stat(text: &str) -> Option<ProcessTicks> {
    let mut it = fields_after_name(text)?.skip(11);
    let utime = it.next()?.parse().ok()?;
    let stime = it.next()?.parse().ok()?;
    Some(ProcessTicks { utime, stime })
}

/// The state letter (field 3) from `/proc/<pid>/stat`.
pub fn parse_pid_state(text: &str) -> Option<char> {
    fields_after_name(text)?.next()?.chars().next()
}

/// The start time (field 22, ticks since boot) from `/proc/<pid>/stat`.
pub fn parse_start_time(text: &str) -> Option<u64> {
    fields_after_name(text)?.nth(19)?.parse().ok()
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

fn read(path: &Path) -> Result<String, SysError> {
    std::fs::read_to_string(path).map_err(|e| SysError::new(format!("read {}", path.display()), e))
}

fn format_error(path: &Path, what: &str) -> SysError {
    SysError::new(
        format!("parse {}", path.display()),
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string()),
    )
}

pub fn process_ticks(pid: u32) -> Result<ProcessTicks, SysError> {
    let path = Path::new("/proc").join(pid.to_string()).join("stat");
    parse_pid_stat(&read(&path)?).ok_or_else(|| format_error(&path, "no utime/stime fields"))
}

pub fn system_ticks() -> Result<SystemTicks, SysError> {
    let path = Path::new("/proc/stat");
    parse_proc_stat(&read(path)?).ok_or_else(|| format_error(path, "no aggregate cpu line"))
}

/// Thread ids of `pid` that exist now.
pub fn tasks(pid: u32) -> Result<Vec<i32>, SysError> {
    let dir = Path::new("/proc").join(pid.to_string()).join("task");
    let entries = std::fs::read_dir(&dir).map_err(|e| SysError::new(format!("read {}", dir.display()), e))?;
    Ok(entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect())
}

/// Sum of the on-CPU nanoseconds of every thread of `pid` that is alive now.
pub fn process_sched_ns(pid: u32) -> Result<u64, SysError> {
    let mut sum = 0;
    for tid in tasks(pid)? {
        let path = Path::new("/proc")
            .join(pid.to_string())
            .join("task")
            .join(tid.to_string())
            .join("schedstat");
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

/// True if a process exists and is not a zombie about to be reaped.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => parse_pid_state(&s).is_some_and(|c| c != 'Z'),
        Err(_) => false,
    }
}

/// Start time of a process in clock ticks since boot, to tell a pid from a
/// later process that reused it.
pub fn start_time(pid: i32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Pids of the processes whose network namespace is one of `namespaces`
/// (paths of namespace files, e.g. under /run/netns), found by comparing
/// namespace inodes in one scan of /proc (what `ip netns pids` does).
pub fn pids_in_netns(namespaces: &[&Path]) -> Vec<i32> {
    let inodes: HashSet<(u64, u64)> = namespaces
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    if inodes.is_empty() {
        return vec![];
    }
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/net")).is_ok_and(|m| inodes.contains(&(m.dev(), m.ino())))
        })
        .collect()
}

/// The UDP (`table` = "udp"/"udp6") or TCP ports that process `pid` sees
/// bound in its network namespace, optionally only those in TCP `state`
/// (hex, e.g. "0A" = LISTEN), from `/proc/<pid>/net/<table>`.
pub fn bound_ports(pid: u32, table: &str, state: Option<&str>) -> Option<HashSet<u16>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).ok()?;
    Some(parse_bound_ports(&text, state))
}

/// Parses a `/proc/net/{udp,tcp}[6]` table into the local ports it lists.
pub fn parse_bound_ports(text: &str, state: Option<&str>) -> HashSet<u16> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let local = f.nth(1)?;
            let st = f.nth(1)?;
            if state.is_some_and(|want| want != st) {
                return None;
            }
            u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
        })
        .collect()
}

/// One CPU's busy ticks from its `/proc/stat` line (everything but idle
/// and iowait).
pub fn cpu_busy_ticks(cpu: usize) -> Result<u64, SysError> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| SysError::new("read /proc/stat", e))?;
    parse_cpu_busy_ticks(&text, cpu).ok_or_else(|| {
        SysError::new(
            "read /proc/stat",
            std::io::Error::other(format!("no readable line for cpu{cpu}")),
        )
    })
}

/// Parses the `cpuN` line of `/proc/stat` into its busy ticks.
pub fn parse_cpu_busy_ticks(text: &str, cpu: usize) -> Option<u64> {
    let label = format!("cpu{cpu}");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(label.as_str()))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal ...
    Some(
        fields
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 3 && *i != 4)
            .map(|(_, v)| v)
            .sum(),
    )
}

/// True once process `pid` has a packet socket bound to an interface (a
/// capture that has started), from `/proc/<pid>/net/packet` and its
/// descriptors.
pub fn has_bound_packet_socket(pid: u32) -> bool {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/packet")) else {
        return false;
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    let inodes: HashSet<String> = fds
        .filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()
                .and_then(|s| s.strip_prefix("socket:[")?.strip_suffix(']').map(String::from))
        })
        .collect();
    bound_packet_socket(&table, &inodes)
}

/// Parses a `/proc/net/packet` table: is one of `inodes` bound (Iface ≠ 0)?
pub fn bound_packet_socket(table: &str, inodes: &HashSet<String>) -> bool {
    table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 9 && f[4] != "0" && inodes.contains(f[8])
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packet_table() {
        let t = "sk RefCnt Type Proto  Iface R Rmem User Inode\n\
                 ffff 3 3 0003 2 1 0 0 4242\nffff 3 3 0003 0 1 0 0 4343\n";
        let ino = |s: &str| [s.to_string()].into_iter().collect::<HashSet<_>>();
        assert!(bound_packet_socket(t, &ino("4242")));
        assert!(!bound_packet_socket(t, &ino("4343")), "unbound");
        assert!(!bound_packet_socket(t, &ino("1")));
    }

    #[test]
    fn one_cpus_busy_ticks_leave_out_idle_and_iowait() {
        let text = "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 1 2 3 100 200 4 5 6 0 0\ncpu1 1 1 1 1 1 1 1 1 0 0\n";
        assert_eq!(parse_cpu_busy_ticks(text, 0), Some(1 + 2 + 3 + 4 + 5 + 6));
        assert_eq!(parse_cpu_busy_ticks(text, 7), None);
        assert_eq!(parse_cpu_busy_ticks("cpu0 1 x 3\n", 0), None);
    }

    #[test]
    fn pid_stat_with_awkward_command_name() {
        let text = "4242 (re fl) (x)) S 1 4242 4242 0 -1 4194560 120 0 0 0 37 15 0 0 20 0 2 0 12345 1000 200 18446744073709551615";
        assert_eq!(parse_pid_stat(text), Some(ProcessTicks { utime: 37, stime: 15 }));
        assert_eq!(parse_pid_state(text), Some('S'));
        assert_eq!(parse_start_time(text), Some(12345));
        assert_eq!(parse_pid_stat("12 (x) S 1 2"), None);
        assert_eq!(parse_pid_stat("no paren"), None);
        assert_eq!(parse_start_time("12 (x) S 1 2"), None);
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
    fn live_reads_of_this_process() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123_456));
        assert_eq!(parse_schedstat(""), None);
        let me = std::process::id();
        assert!(process_ticks(me).is_ok());
        assert!(process_sched_ns(me).unwrap() > 0);
        assert!(tasks(me).unwrap().contains(&(me as i32)));
        let s = system_ticks().unwrap();
        assert!(s.total >= s.busy);
        assert!(ticks_per_second() > 0);
        assert!(alive(me as i32));
        assert!(start_time(me as i32).is_some());
        let own_ns = Path::new("/proc/self/ns/net");
        assert!(pids_in_netns(&[own_ns]).contains(&(me as i32)));
        assert!(pids_in_netns(&[]).is_empty());
    }

    #[test]
    fn bound_ports_table() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue\n\
                    0: 0100007F:0FA0 00000000:0000 07 00000000:00000000\n\
                    1: 00000000:21FC 00000000:0000 0A 00000000:00000000\n";
        assert_eq!(parse_bound_ports(text, None), [4000, 8700].into_iter().collect());
        assert_eq!(parse_bound_ports(text, Some("0A")), [8700].into_iter().collect());
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = sock.local_addr().unwrap().port();
        assert!(bound_ports(std::process::id(), "udp", None).unwrap().contains(&port));
    }
}
