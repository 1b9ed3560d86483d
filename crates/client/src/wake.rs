//! A wake-up for event-driven loops from work that the client's UDP socket
//! does not show: the token request's answer, which comes in on a helper
//! thread (a blocking HTTPS call, kept off the caller's thread). The
//! helper signals it once its answer is in the channel `update` reads, so
//! an async loop (the tokio driver's) wakes for it instead of polling
//! (`FETCH_POLL`).
//!
//! It is a `std::task::Waker` slot and a flag, std only: the core stays
//! free of any async runtime, and any executor's waker works.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Waker;
#[cfg(feature = "tokio")]
use std::task::{Context, Poll};

/// Signalled by a helper thread; awaited by an async loop.
#[derive(Debug, Default)]
pub(crate) struct Wake {
    /// Signalled since the loop last saw it (so a signal that comes
    /// before the loop waits is not lost).
    signalled: AtomicBool,
    /// The waiting loop's waker, if one waits.
    waker: Mutex<Option<Waker>>,
}

impl Wake {
    /// Marks the wake-up and wakes the loop waiting for it, if any.
    pub(crate) fn signal(&self) {
        // The flag before the waker is taken: a loop that registers its
        // waker after this take finds the flag set when it looks again.
        self.signalled.store(true, SeqCst);
        let waiting = self.waker.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(w) = waiting {
            w.wake();
        }
    }

    /// Ready once signalled since the last `Ready` (which consumes the
    /// signal); otherwise registers `cx`'s waker for the next signal.
    #[cfg(feature = "tokio")]
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.signalled.swap(false, SeqCst) {
            return Poll::Ready(());
        }
        {
            let mut slot = self.waker.lock().unwrap_or_else(PoisonError::into_inner);
            if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *slot = Some(cx.waker().clone());
            }
        }
        // A signal between the first look and the registration took no
        // waker (or the old one): look again now that ours is in place.
        if self.signalled.swap(false, SeqCst) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// Signals its [`Wake`] when dropped: a helper thread holds one until its
/// last act, so the loop wakes whether the thread answered or panicked (a
/// dropped channel is an answer `update` reports).
pub(crate) struct SignalOnDrop(pub(crate) Arc<Wake>);

impl Drop for SignalOnDrop {
    fn drop(&mut self) {
        self.0.signal();
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake as StdWake;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl StdWake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, SeqCst);
        }
    }

    #[test]
    fn a_signal_before_the_wait_is_kept_and_one_during_it_wakes_the_waiter() {
        let wake = Wake::default();
        let count = Arc::new(Count::default());
        let waker = Waker::from(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        // Nothing yet: waits, registered.
        assert_eq!(wake.poll(&mut cx), Poll::Pending);
        // Signalled while waiting: the waiter is woken, and its next poll
        // is ready, once.
        wake.signal();
        assert_eq!(count.0.load(SeqCst), 1);
        assert_eq!(wake.poll(&mut cx), Poll::Ready(()));
        assert_eq!(wake.poll(&mut cx), Poll::Pending);
        // Signalled with nobody waiting (the waker was taken by the last
        // signal and this poll registered it again; drop that first): the
        // next poll is ready at once.
        wake.waker.lock().unwrap().take();
        wake.signal();
        assert_eq!(count.0.load(SeqCst), 1, "no waiter, no wake-up");
        assert_eq!(wake.poll(&mut cx), Poll::Ready(()));
    }

    #[test]
    fn a_helper_that_panics_still_wakes_the_loop() {
        let wake = Arc::new(Wake::default());
        let signal = SignalOnDrop(Arc::clone(&wake));
        let helper = std::thread::spawn(move || {
            let _signal = signal;
            panic!("the helper fails");
        });
        assert!(helper.join().is_err(), "it panicked");
        let count = Arc::new(Count::default());
        let waker = Waker::from(count);
        assert_eq!(wake.poll(&mut Context::from_waker(&waker)), Poll::Ready(()));
    }
}
