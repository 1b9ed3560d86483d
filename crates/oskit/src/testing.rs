//! Helpers for the tests of every crate (feature `testing`): one namespace
//! guard and one root-or-skip rule.

use crate::netns::{path_of, NetNs};
use crate::SysError;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// True if a test that needs root may go on. Without root it prints
/// "skipping TEST: needs root" and returns false, unless
/// `REQUIRE_ROOT_TESTS=1` (CI), where a skip is a failure.
pub fn root_or_skip(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "{test} needs root, and REQUIRE_ROOT_TESTS=1 forbids skipping it"
    );
    eprintln!("skipping {test}: needs root");
    false
}

/// Runs a command (`ip`, `tc`, …) and panics with its stderr if it fails:
/// test set-up that cannot go on after a failure.
pub fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace owned by a test: deleted on drop, even when the test
/// panics, after every process inside it has been ended.
#[derive(Debug)]
pub struct NetNsGuard {
    name: String,
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

impl NetNsGuard {
    /// Creates a namespace named `{tag}{pid}x{n}` (unique per process and
    /// call, at most 15 + tag bytes) with its loopback up.
    pub fn new(tag: &str) -> NetNsGuard {
        let name = format!(
            "{tag}{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        sh(&["ip", "netns", "add", &name]);
        let guard = NetNsGuard { name };
        sh(&["ip", "-n", &guard.name, "link", "set", "lo", "up"]);
        guard
    }

    /// Takes over deletion of a namespace created by other means (a plan
    /// under test), whether or not it exists yet.
    pub fn adopt(name: impl Into<String>) -> NetNsGuard {
        NetNsGuard { name: name.into() }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn open(&self) -> Result<NetNs, SysError> {
        NetNs::open(&self.name)
    }

    /// Runs `f` on a thread inside the namespace (sockets it creates live
    /// there); panics if the namespace cannot be entered.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.open()
            .and_then(|ns| ns.run(f))
            .unwrap_or_else(|e| panic!("running in {}: {e}", self.name))
    }
}

impl Drop for NetNsGuard {
    fn drop(&mut self) {
        delete_netns(&self.name);
    }
}

/// Ends every process in namespace `name` (SIGTERM, then SIGKILL after 2 s)
/// and deletes it; a namespace that does not exist is not an error.
pub fn delete_netns(name: &str) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let path = path_of(name);
    if std::fs::symlink_metadata(&path).is_err() {
        return;
    }
    let pids = crate::procfs::pids_in_netns(&[&path]);
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| crate::procfs::alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in crate::procfs::pids_in_netns(&[&path]) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    let _ = Command::new("ip").args(["netns", "del", name]).status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_removes_its_namespace_and_the_processes_inside() {
        if !root_or_skip("guard_removes_its_namespace_and_the_processes_inside") {
            return;
        }
        let g = NetNsGuard::new("oskt");
        let path = path_of(g.name());
        assert!(path.exists());
        let child = Command::new("ip")
            .args(["netns", "exec", g.name(), "sleep", "30"])
            .spawn()
            .unwrap();
        let mut child = crate::child::ChildGuard::new(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while crate::procfs::pids_in_netns(&[&path]).is_empty() {
            assert!(Instant::now() < deadline, "sleep never appeared in the namespace");
            std::thread::sleep(Duration::from_millis(5));
        }
        // The thread sees the namespace (/proc/net is the process leader's
        // view, thread-self the thread's): only lo exists there.
        let ifaces = g.run(|| std::fs::read_to_string("/proc/thread-self/net/dev").unwrap());
        assert_eq!(ifaces.lines().skip(2).count(), 1, "{ifaces}");
        drop(g);
        assert!(!path.exists());
        assert!(!child.child().wait().unwrap().success());
    }
}
