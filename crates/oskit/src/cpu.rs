//! CPU affinity: benchmarks pin the system under test and its load
//! generator to separate cores so they do not share one.

use crate::SysError;
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// Pins one task (a thread id; 0 = the calling thread) to `cpu`.
pub fn pin_task(tid: i32, cpu: usize) -> Result<(), SysError> {
    let mut set = CpuSet::new();
    set.set(cpu).map_err(|e| SysError::new(format!("CPU_SET({cpu})"), e))?;
    sched_setaffinity(Pid::from_raw(tid), &set)
        .map_err(|e| SysError::new(format!("sched_setaffinity({tid}, {cpu})"), e))
}

/// Pins the calling thread to `cpu`.
pub fn pin_this_thread(cpu: usize) -> Result<(), SysError> {
    pin_task(0, cpu)
}

/// Pins every thread that `pid` has now to `cpu` (call it once the process
/// has started all its threads).
pub fn pin_process(pid: u32, cpu: usize) -> Result<(), SysError> {
    for tid in crate::procfs::tasks(pid)? {
        pin_task(tid, cpu)?;
    }
    Ok(())
}

/// The CPUs this process may run on, ascending.
pub fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Idle time so far of every CPU, or of one, microseconds, from cpuidle's
/// per-state residency counters, and how many CPUs that covers; `None`
/// without a cpuidle driver.
fn cpuidle_us(only: Option<usize>) -> Option<(u64, usize)> {
    let mut total = 0u64;
    let mut cpus = 0;
    for cpu in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
        let name = cpu.file_name();
        let name = name.to_string_lossy();
        let Some(n) = name.strip_prefix("cpu").and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        if only.is_some_and(|c| c != n) {
            continue;
        }
        let Ok(states) = std::fs::read_dir(cpu.path().join("cpuidle")) else {
            continue;
        };
        cpus += 1;
        for st in states.flatten() {
            let t = std::fs::read_to_string(st.path().join("time")).ok()?;
            total += t.trim().parse::<u64>().ok()?;
        }
    }
    (cpus > 0).then_some((total, cpus))
}

/// Busy time so far of one CPU (`Some`) or of all, ns (only differences
/// mean anything): wall time x CPUs - idle time, with idle time from
/// cpuidle (microseconds) where the kernel has it. `/proc/stat` counts in
/// 10 ms ticks, too coarse over a benchmark phase of a second or two; it is
/// the fallback.
pub fn busy_ns(cpu: Option<usize>) -> Result<f64, SysError> {
    static T0: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let t0 = *T0.get_or_init(std::time::Instant::now);
    if let Some((idle_us, cpus)) = cpuidle_us(cpu) {
        let wall = t0.elapsed().as_nanos() as f64;
        return Ok(wall * cpus as f64 - idle_us as f64 * 1e3);
    }
    let busy_ticks = match cpu {
        Some(c) => crate::procfs::cpu_busy_ticks(c)?,
        None => crate::procfs::system_ticks()?.busy,
    };
    Ok(busy_ticks as f64 * 1e9 / crate::procfs::ticks_per_second() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_grows_while_a_cpu_works() {
        let cpu = allowed_cpus()[0];
        let before = busy_ns(None).unwrap();
        let one_before = busy_ns(Some(cpu)).unwrap();
        let end = std::time::Instant::now() + std::time::Duration::from_millis(30);
        while std::time::Instant::now() < end {
            std::hint::black_box(0u64);
        }
        assert!(busy_ns(None).unwrap() > before);
        assert!(busy_ns(Some(cpu)).unwrap() >= one_before);
    }

    #[test]
    fn a_thread_pinned_to_an_allowed_cpu_stays_there() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let last = *cpus.last().unwrap();
        std::thread::spawn(move || {
            pin_this_thread(last).unwrap();
            assert_eq!(allowed_cpus(), vec![last]);
        })
        .join()
        .unwrap();
        assert!(pin_this_thread(CpuSet::count() + 1).is_err());
    }
}
