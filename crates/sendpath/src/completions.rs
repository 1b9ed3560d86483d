//! MSG_ZEROCOPY completion accounting, pure (no syscalls).
//!
//! The kernel numbers a socket's successful zero-copy sends 0, 1, 2, …
//! (a `u32` that wraps) and reports them done on the error queue as
//! inclusive ranges `lo..=hi`, coalesced, and for UDP possibly out of
//! order. Until a send's number is reported, the kernel may still read its
//! pages, so the buffer it came from must stay alive and unchanged: this
//! keeps a holder (`T`, e.g. a `bytes::Bytes` clone) per outstanding send
//! and drops it when its number completes.

use std::collections::VecDeque;

/// Outstanding zero-copy sends of one socket, in send order.
#[derive(Debug)]
pub struct Completions<T> {
    /// Number of the oldest send not yet released (the front of `slots`).
    base: u32,
    /// One slot per send from `base` on; `None` once completed (kept until
    /// everything before it completes, so numbers map to slots by offset).
    slots: VecDeque<Option<(T, usize)>>,
    /// Bytes of the sends not yet completed (what the kernel has pinned).
    pinned: usize,
    /// Sends not yet completed.
    outstanding: usize,
    /// Completions that named no outstanding send (duplicates, or numbers
    /// from before this tracker started): counted, never trusted.
    pub unknown: u64,
}

impl<T> Default for Completions<T> {
    fn default() -> Self {
        Completions::new()
    }
}

impl<T> Completions<T> {
    pub fn new() -> Completions<T> {
        Completions {
            base: 0,
            slots: VecDeque::new(),
            pinned: 0,
            outstanding: 0,
            unknown: 0,
        }
    }

    /// The number the kernel will give the next successful zero-copy send.
    pub fn next_id(&self) -> u32 {
        self.base.wrapping_add(self.slots.len() as u32)
    }

    /// Records a successful zero-copy send of `bytes` bytes whose memory
    /// `holder` keeps alive; returns its number.
    pub fn sent(&mut self, holder: T, bytes: usize) -> u32 {
        let id = self.next_id();
        self.slots.push_back(Some((holder, bytes)));
        self.pinned += bytes;
        self.outstanding += 1;
        id
    }

    /// Sends not yet completed.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// Bytes of the sends not yet completed.
    pub fn pinned_bytes(&self) -> usize {
        self.pinned
    }

    /// Marks sends `lo..=hi` (wrapping) complete, handing each one's holder
    /// to `release`; returns how many outstanding sends it completed.
    pub fn complete(&mut self, lo: u32, hi: u32, mut release: impl FnMut(T)) -> usize {
        let span = hi.wrapping_sub(lo) as u64 + 1;
        let mut done = 0;
        for k in 0..span {
            let id = lo.wrapping_add(k as u32);
            let off = id.wrapping_sub(self.base) as usize;
            match self.slots.get_mut(off).and_then(Option::take) {
                Some((holder, bytes)) => {
                    self.pinned -= bytes;
                    self.outstanding -= 1;
                    release(holder);
                    done += 1;
                }
                None => self.unknown += 1,
            }
        }
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::rc::Rc;

    #[test]
    fn ranges_release_their_holders_and_the_pinned_bytes() {
        let mut c = Completions::new();
        let buf = Rc::new([0u8; 100]);
        for i in 0..5u32 {
            assert_eq!(c.sent(buf.clone(), 100), i);
        }
        assert_eq!((c.outstanding(), c.pinned_bytes()), (5, 500));
        assert_eq!(Rc::strong_count(&buf), 6);
        // Coalesced: 0..=2 in one report.
        assert_eq!(c.complete(0, 2, drop), 3);
        assert_eq!((c.outstanding(), c.pinned_bytes(), c.next_id()), (2, 200, 5));
        assert_eq!(Rc::strong_count(&buf), 3);
        assert_eq!(c.complete(3, 4, drop), 2);
        assert_eq!(Rc::strong_count(&buf), 1, "every holder released");
        assert_eq!(c.pinned_bytes(), 0);
    }

    #[test]
    fn out_of_order_completions_keep_numbering_straight() {
        let mut c = Completions::new();
        for i in 0..6u32 {
            c.sent(i, 10);
        }
        let mut released = vec![];
        c.complete(4, 5, |h| released.push(h));
        c.complete(1, 1, |h| released.push(h));
        assert_eq!(c.outstanding(), 3);
        // 0 is still out, so nothing is popped yet and numbers stay aligned.
        assert_eq!(c.next_id(), 6);
        c.sent(6, 10);
        c.complete(6, 6, |h| released.push(h));
        c.complete(0, 0, |h| released.push(h));
        c.complete(2, 3, |h| released.push(h));
        assert_eq!(released, vec![4, 5, 1, 6, 0, 2, 3]);
        assert_eq!((c.outstanding(), c.pinned_bytes(), c.unknown), (0, 0, 0));
    }

    #[test]
    fn the_counter_wraps_at_u32() {
        let mut c = Completions::<u32>::new();
        c.base = u32::MAX - 1;
        let ids: Vec<u32> = (0..4).map(|i| c.sent(i, 1)).collect();
        assert_eq!(ids, vec![u32::MAX - 1, u32::MAX, 0, 1]);
        // One report across the wrap.
        let mut released = vec![];
        assert_eq!(c.complete(u32::MAX, 0, |h| released.push(h)), 2);
        assert_eq!(c.complete(u32::MAX - 1, u32::MAX - 1, |h| released.push(h)), 1);
        assert_eq!(c.complete(1, 1, |h| released.push(h)), 1);
        assert_eq!(released, vec![1, 2, 0, 3]);
        assert_eq!(c.next_id(), 2);
    }

    #[test]
    fn duplicate_and_unknown_numbers_are_counted_not_trusted() {
        let mut c = Completions::new();
        c.sent('a', 1);
        assert_eq!(c.complete(0, 0, drop), 1);
        assert_eq!(c.complete(0, 0, drop), 0);
        assert_eq!(c.complete(7, 9, drop), 0);
        assert_eq!(c.unknown, 4);
    }

    proptest! {
        /// Any split of the sends into ranges, completed in any order,
        /// releases each holder exactly once and leaves nothing pinned.
        #[test]
        fn any_order_of_any_ranges_releases_each_send_once(
            start in any::<u32>(),
            cuts in proptest::collection::vec(1u32..8, 1..40),
            order in any::<u64>(),
        ) {
            let mut c = Completions::new();
            c.base = start;
            let total: u32 = cuts.iter().sum();
            for i in 0..total {
                c.sent(i, 3);
            }
            let mut ranges = vec![];
            let mut lo = 0u32;
            for len in &cuts {
                ranges.push((start.wrapping_add(lo), start.wrapping_add(lo + len - 1)));
                lo += len;
            }
            // A deterministic shuffle driven by `order`.
            let mut seed = order | 1;
            for i in (1..ranges.len()).rev() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ranges.swap(i, (seed % (i as u64 + 1)) as usize);
            }
            let mut seen = vec![false; total as usize];
            for (lo, hi) in ranges {
                c.complete(lo, hi, |h| {
                    assert!(!seen[h as usize], "released twice");
                    seen[h as usize] = true;
                });
            }
            prop_assert!(seen.iter().all(|s| *s));
            prop_assert_eq!(c.pinned_bytes(), 0);
            prop_assert_eq!(c.outstanding(), 0);
            prop_assert_eq!(c.next_id(), start.wrapping_add(total));
        }
    }
}
