//! Child processes that are never left behind: a [`ChildGuard`] stops its
//! child when dropped (error paths, Ctrl-C unwinding, a failed assertion).

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How long a dropped guard lets its child shut down cleanly before SIGKILL.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(2);

/// Owns a child; on drop, stops it with [`stop`] if it is still running.
#[derive(Debug)]
pub struct ChildGuard {
    child: Option<Child>,
    grace: Duration,
}

impl ChildGuard {
    /// Guards `child`; dropping the guard sends SIGTERM, waits up to
    /// [`DEFAULT_GRACE`], then SIGKILLs.
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard::with_grace(child, DEFAULT_GRACE)
    }

    /// Like [`ChildGuard::new`]; a zero grace kills at once.
    pub fn with_grace(child: Child, grace: Duration) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            grace,
        }
    }

    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The child, for waiting on it or reading its pipes.
    pub fn child(&mut self) -> &mut Child {
        // Invariant: `child` is Some from construction until `into_inner` or drop.
        self.child.as_mut().expect("guard holds its child until released")
    }

    /// Stops the child now (SIGTERM, grace, SIGKILL) and returns its status.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let grace = self.grace;
        stop(self.child(), grace)
    }

    /// Releases the child: the caller becomes responsible for it.
    pub fn into_inner(mut self) -> Child {
        self.child.take().expect("guard holds its child until released")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            stop(c, self.grace);
        }
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL; always reaps. Returns the
/// exit status (None only if waiting itself failed).
pub fn stop(c: &mut Child, grace: Duration) -> Option<ExitStatus> {
    if let Ok(Some(st)) = c.try_wait() {
        return Some(st);
    }
    if !grace.is_zero() {
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = c.kill();
    c.wait().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn dropped_guard_stops_and_reaps_its_child() {
        let g = ChildGuard::with_grace(
            Command::new("sleep").arg("30").spawn().unwrap(),
            Duration::from_millis(500),
        );
        let pid = g.id() as i32;
        assert!(crate::procfs::alive(pid));
        let t = Instant::now();
        drop(g);
        // sleep(1) dies on SIGTERM, well inside the grace.
        assert!(t.elapsed() < Duration::from_millis(500));
        assert!(!crate::procfs::alive(pid));
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace() {
        let child = Command::new("sh")
            .args(["-c", "trap '' TERM; sleep 30"])
            .spawn()
            .unwrap();
        let mut g = ChildGuard::with_grace(child, Duration::from_millis(200));
        // Let the shell install its trap before we signal it.
        std::thread::sleep(Duration::from_millis(100));
        let st = g.stop().unwrap();
        assert!(!st.success());
        let pid = g.id() as i32;
        assert!(!crate::procfs::alive(pid));
    }
}
