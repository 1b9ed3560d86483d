//! A flag set by signals, which long-running commands poll (at least every
//! 100 ms) to shut down cleanly: finish the file, print the summary,
//! remove the lab.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};

/// What a second signal does while the first one's clean shutdown runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Second {
    /// Exit at once with this status: for the user whose clean shutdown is
    /// stuck (a server waiting on a client).
    Exit(i32),
    /// Only set the flag again: for programs whose clean-up must finish
    /// (a lab that would otherwise be left half-removed).
    Ignore,
}

/// Returns a flag that any of `signals` sets.
pub fn flag_on(signals: &[i32], second: Second) -> io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    for &sig in signals {
        if let Second::Exit(status) = second {
            // Registered first: it acts only when the flag is already set.
            signal_hook::flag::register_conditional_shutdown(sig, status, Arc::clone(&flag))?;
        }
        signal_hook::flag::register(sig, Arc::clone(&flag))?;
    }
    Ok(flag)
}

/// Makes any of `signals` set `flag`, a flag the caller already has (a
/// control block shared with worker threads).
pub fn set_on(signals: &[i32], flag: &Arc<AtomicBool>) -> io::Result<()> {
    for &sig in signals {
        signal_hook::flag::register(sig, Arc::clone(flag))?;
    }
    Ok(())
}

/// Escalating stops: the first of `signals` sets `stop` (finish cleanly),
/// the second sets `abort` (stop at once, keep what is already done), a
/// third exits with status 130 there and then (for a shutdown stuck in the
/// kernel, e.g. a write to a hung disk). A thread of its own counts them.
pub fn stop_then_abort(signals: &[i32], stop: &Arc<AtomicBool>, abort: &Arc<AtomicBool>) -> io::Result<()> {
    use std::sync::atomic::Ordering;
    let mut incoming = signal_hook::iterator::Signals::new(signals)?;
    let (stop, abort) = (Arc::clone(stop), Arc::clone(abort));
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for (n, _) in incoming.forever().enumerate() {
            match n {
                0 => stop.store(true, Ordering::SeqCst),
                1 => {
                    stop.store(true, Ordering::SeqCst);
                    abort.store(true, Ordering::SeqCst);
                }
                _ => std::process::exit(130),
            }
        }
    })?;
    Ok(())
}

/// The usual flag: SIGINT or SIGTERM set it; a second one exits (status 1).
pub fn stop_flag() -> io::Result<Arc<AtomicBool>> {
    flag_on(&[SIGINT, SIGTERM], Second::Exit(1))
}

/// Makes `signals` harmless to this process (a hang-up must not take a
/// delay line down under a lab left up).
pub fn ignore(signals: &[i32]) -> io::Result<()> {
    let sink = Arc::new(AtomicBool::new(false));
    for &sig in signals {
        signal_hook::flag::register(sig, Arc::clone(&sink))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_second_signal_aborts() {
        // SIGWINCH is used by no other test of this crate, and harmless.
        let (stop, abort) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        stop_then_abort(&[signal_hook::consts::SIGWINCH], &stop, &abort).unwrap();
        let wait = |f: &AtomicBool| {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while !f.load(Ordering::SeqCst) && std::time::Instant::now() < until {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            f.load(Ordering::SeqCst)
        };
        signal_hook::low_level::raise(signal_hook::consts::SIGWINCH).unwrap();
        assert!(wait(&stop));
        assert!(!abort.load(Ordering::SeqCst));
        signal_hook::low_level::raise(signal_hook::consts::SIGWINCH).unwrap();
        assert!(wait(&abort));
    }

    #[test]
    fn a_raised_signal_sets_the_flag() {
        // SIGUSR2 is used by no other test of this crate.
        let flag = flag_on(&[signal_hook::consts::SIGUSR2], Second::Ignore).unwrap();
        assert!(!flag.load(Ordering::SeqCst));
        signal_hook::low_level::raise(signal_hook::consts::SIGUSR2).unwrap();
        assert!(flag.load(Ordering::SeqCst));
    }
}
