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

#[cfg(test)]
mod tests {
    use super::*;

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
