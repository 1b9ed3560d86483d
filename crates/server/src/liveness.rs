//! Whether the event-loop threads still run, for `/healthz`.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Whether every event-loop thread still runs: each clears its flag when it
/// ends, by returning or by panicking.
#[derive(Debug, Clone, Default)]
pub struct Liveness(Arc<Vec<(String, Arc<AtomicBool>)>>);

/// Clears a thread's liveness flag when dropped (its thread ends).
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Relaxed);
    }
}

impl Liveness {
    /// Runs `f` on a thread named `name` whose end this liveness notices.
    pub fn spawn<T: Send + 'static>(
        flags: &mut Vec<(String, Arc<AtomicBool>)>,
        name: String,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<JoinHandle<T>> {
        let flag = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(Arc::clone(&flag));
        let h = std::thread::Builder::new().name(name.clone()).spawn(move || {
            let _guard = guard;
            f()
        })?;
        flags.push((name, flag));
        Ok(h)
    }

    pub fn new(flags: Vec<(String, Arc<AtomicBool>)>) -> Liveness {
        Liveness(Arc::new(flags))
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
            Err(format!("event-loop thread(s) stopped: {}", dead.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn liveness_names_an_ended_thread() {
        let mut flags = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let a = Liveness::spawn(&mut flags, "loop-a".into(), move || {
            let _ = rx.recv();
        })
        .unwrap();
        let b = Liveness::spawn(&mut flags, "loop-b".into(), || panic!("a loop's bug")).unwrap();
        let l = Liveness::new(flags);
        assert!(b.join().is_err());
        assert_eq!(l.check(), Err("event-loop thread(s) stopped: loop-b".into()));
        drop(tx);
        a.join().unwrap();
        assert_eq!(l.check(), Err("event-loop thread(s) stopped: loop-a, loop-b".into()));
        assert_eq!(Liveness::new(Vec::new()).check(), Ok(()));
    }
}
