//! Whether the reflector's threads still run, for `/healthz`: the event
//! loops, the checkpoint channel's lobby, the kernel path's resender and,
//! in a fleet, the registry's heartbeats. Each is started through a
//! [`Watch`], which notices when it ends. (The checkpoint channel's
//! per-connection threads are not watched: each serves one request and
//! ends, and the lobby that starts them is.)

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Whether every watched thread still runs: each clears its flag when it
/// ends, by returning or by panicking.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Vec<(String, Arc<AtomicBool>)>>);

/// The threads started so far, each with the flag it clears when it ends.
#[derive(Debug, Default)]
pub struct Watch(Vec<(String, Arc<AtomicBool>)>);

/// Clears a thread's liveness flag when dropped (its thread ends).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
    }
}

impl Watch {
    pub fn new() -> Watch {
        Watch::default()
    }

    /// Runs `f` on a thread named `name` whose end the liveness notices.
    pub fn spawn<T: Send + 'static>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<JoinHandle<T>> {
        let flag = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(Arc::clone(&flag));
        let h = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let _guard = guard;
            f()
        })?;
        self.0.push((name.to_owned(), flag));
        Ok(h)
    }

    /// The liveness of every thread started so far.
    pub fn liveness(self) -> Liveness {
        Liveness(Arc::new(self.0))
    }
}

impl Liveness {
    /// The threads of both, `self`'s first: for threads started after the
    /// server's (the registry's heartbeats, started once it serves).
    pub fn and(&self, other: &Liveness) -> Liveness {
        Liveness(Arc::new(self.0.iter().chain(other.0.iter()).cloned().collect()))
    }

    /// The names of the threads watched, in the order they started.
    pub fn watched(&self) -> Vec<&str> {
        self.0.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// `Ok` while every thread runs; else the names of those that ended.
    pub fn check(&self) -> Result<(), String> {
        let dead: Vec<&str> = self
            .0
            .iter()
            .filter(|(_, f)| !f.load(Relaxed))
            .map(|(n, _)| n.as_str())
            .collect();
        if dead.is_empty() {
            Ok(())
        } else {
            Err(format!("thread(s) stopped: {}", dead.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_names_an_ended_thread() {
        let mut watch = Watch::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a = watch
            .spawn("loop-a", move || {
                let _ = rx.recv();
            })
            .unwrap();
        let b = watch.spawn("loop-b", || panic!("a loop's bug")).unwrap();
        let l = watch.liveness();
        assert!(b.join().is_err());
        assert_eq!(l.check(), Err("thread(s) stopped: loop-b".into()));
        drop(tx);
        a.join().unwrap();
        assert_eq!(l.check(), Err("thread(s) stopped: loop-a, loop-b".into()));
        assert_eq!(Watch::new().liveness().check(), Ok(()));
    }

    #[test]
    fn joined_liveness_names_an_ended_thread_of_either() {
        let (mut first, mut second) = (Watch::new(), Watch::new());
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a = first
            .spawn("reflector-0", move || {
                let _ = rx.recv();
            })
            .unwrap();
        let b = second.spawn("registry", || ()).unwrap();
        b.join().unwrap();
        let (first, second) = (first.liveness(), second.liveness());
        let both = first.and(&second);
        assert_eq!(both.watched(), vec!["reflector-0", "registry"]);
        assert_eq!(first.check(), Ok(()));
        assert_eq!(both.check(), Err("thread(s) stopped: registry".into()));
        drop(tx);
        a.join().unwrap();
        assert_eq!(both.check(), Err("thread(s) stopped: reflector-0, registry".into()));
    }
}
