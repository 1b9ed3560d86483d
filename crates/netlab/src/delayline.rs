//! The delay line: our stand-in for netem on kernels without it.
//!
//! A process in the fabric namespace holds an AF_PACKET socket on each of
//! two veth ports (`a`, `b`). Every frame read on one port is queued with a
//! release time (arrival + delay +/- jitter) unless the loss draw or the
//! queue limit drops it, and is written to the other port when due. Frames
//! leave in arrival order (jitter never reorders, unlike netem's default).
//!
//! The queue ([`DelayQueue`]) is pure and takes `now` as an argument; the
//! loop ([`run`]) does the I/O and the waiting: a precise `ppoll` sleep until
//! shortly before the next release, then a short spin so that wake-up
//! latency does not add to the delay.

use crate::sys::PacketSocket;
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};

/// What happened to a frame offered to the queue.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Queued { release_ns: u64 },
    Lost,
    Overflow,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub queued: u64,
    pub sent: u64,
    pub lost: u64,
    pub overflow: u64,
}

/// One direction of a delayed link.
pub struct DelayQueue {
    delay_ns: u64,
    jitter_ns: u64,
    /// Factor (num, den) on the delay and jitter: the lab's TDF now over
    /// the TDF the link was built with, so that a TDF change at run time
    /// holds new frames for delay x the new TDF of real time.
    scale: (u64, u64),
    loss_ppm: u32,
    limit: usize,
    rng: u64,
    last_release: u64,
    q: VecDeque<(u64, Vec<u8>)>,
    pub stats: Stats,
}

impl DelayQueue {
    pub fn new(delay_ns: u64, jitter_ns: u64, loss_ppm: u32, limit: usize, seed: u64) -> Self {
        DelayQueue {
            delay_ns,
            jitter_ns,
            scale: (1, 1),
            loss_ppm,
            limit: limit.max(1),
            rng: seed | 1,
            last_release: 0,
            q: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// xorshift64*: fast, deterministic for a seed, good enough for loss and
    /// jitter draws.
    fn next_rand(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Scales the delay and jitter of frames pushed from now on by
    /// `num / den` (frames already queued keep their release time).
    pub fn set_scale(&mut self, num: u64, den: u64) {
        self.scale = (num.max(1), den.max(1));
    }

    fn scaled(&self, ns: u64) -> u64 {
        let (num, den) = self.scale;
        u64::try_from(u128::from(ns) * u128::from(num) / u128::from(den)).unwrap_or(u64::MAX)
    }

    pub fn push(&mut self, now_ns: u64, frame: Vec<u8>) -> Verdict {
        if self.loss_ppm > 0 && self.next_rand() % 1_000_000 < self.loss_ppm as u64 {
            self.stats.lost += 1;
            return Verdict::Lost;
        }
        if self.q.len() >= self.limit {
            self.stats.overflow += 1;
            return Verdict::Overflow;
        }
        let (delay, jitter) = (self.scaled(self.delay_ns), self.scaled(self.jitter_ns));
        let mut t = now_ns + delay;
        if jitter > 0 {
            let span = 2 * jitter + 1;
            t = t + (self.next_rand() % span) - jitter;
        }
        // FIFO: a frame never overtakes the one before it.
        let release_ns = t.max(self.last_release);
        self.last_release = release_ns;
        self.q.push_back((release_ns, frame));
        self.stats.queued += 1;
        Verdict::Queued { release_ns }
    }

    pub fn next_release(&self) -> Option<u64> {
        self.q.front().map(|(t, _)| *t)
    }

    /// The head frame if it is due at `now_ns`.
    pub fn peek_due(&self, now_ns: u64) -> Option<&[u8]> {
        match self.q.front() {
            Some((t, f)) if *t <= now_ns => Some(f),
            _ => None,
        }
    }

    pub fn pop(&mut self) {
        if self.q.pop_front().is_some() {
            self.stats.sent += 1;
        }
    }

    pub fn len(&self) -> usize {
        self.q.len()
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

pub fn now_ns() -> u64 {
    // CLOCK_MONOTONIC cannot fail on Linux for a valid clock id.
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

pub struct Config {
    pub a: String,
    pub b: String,
    pub delay_ns: u64,
    pub jitter_ns: u64,
    pub loss_ppm: u32,
    pub limit: usize,
    pub seed: u64,
    /// Spin this long before a release instead of sleeping.
    pub spin_ns: u64,
    /// A dilated lab's clock and the TDF the delays above were built for:
    /// the delay follows the clock's TDF when it changes.
    pub clock: Option<(vtime::Domain, vtime::Tdf)>,
}

/// The factor on a link's built delay when the lab's TDF is `now` and the
/// link was built for `built`: now / built, as a fraction.
pub fn tdf_scale(now: vtime::Tdf, built: vtime::Tdf) -> (u64, u64) {
    (now.num() * built.den(), now.den() * built.num())
}

/// Largest frame we may read: a 64 KiB GSO super-frame plus headers.
const BUF: usize = 65536 + 256;

/// Runs the delay line until `stop` is set. Calls `ready` once both sockets
/// are bound.
pub fn run(cfg: &Config, stop: &AtomicBool, ready: impl FnOnce()) -> io::Result<[Stats; 2]> {
    use nix::poll::{PollFd, PollFlags};
    let _ = nix::sys::prctl::set_timerslack(1);
    let socks = [PacketSocket::open(&cfg.a)?, PacketSocket::open(&cfg.b)?];
    // qs[0] carries a -> b, qs[1] carries b -> a.
    let mut qs = [
        DelayQueue::new(cfg.delay_ns, cfg.jitter_ns, cfg.loss_ppm, cfg.limit, cfg.seed),
        DelayQueue::new(
            cfg.delay_ns,
            cfg.jitter_ns,
            cfg.loss_ppm,
            cfg.limit,
            cfg.seed.rotate_left(17),
        ),
    ];
    ready();
    let mut buf = vec![0u8; BUF];
    let mut blocked = [false; 2];
    let mut scale = (1, 1);
    while !stop.load(Ordering::Relaxed) {
        if let Some((clock, built)) = &cfg.clock {
            // One seqlock read of the shared record per pass.
            let s = tdf_scale(clock.snapshot().timeline.tdf(), *built);
            if s != scale {
                scale = s;
                for q in &mut qs {
                    q.set_scale(s.0, s.1);
                }
            }
        }
        let now = now_ns();
        // Sleep until the next release minus the spin margin, or until a
        // frame arrives, or a blocked output can take more.
        let next = qs.iter().filter_map(|q| q.next_release()).min();
        let timeout = match next {
            Some(t) if t <= now + cfg.spin_ns => Some(nix::sys::time::TimeSpec::new(0, 0)),
            Some(t) => Some(nix::sys::time::TimeSpec::from_duration(
                std::time::Duration::from_nanos(t - now - cfg.spin_ns),
            )),
            // Wake up now and then to notice `stop`.
            None => Some(nix::sys::time::TimeSpec::from_duration(
                std::time::Duration::from_millis(100),
            )),
        };
        {
            let out_flags = |i: usize| {
                if blocked[i] {
                    PollFlags::POLLIN | PollFlags::POLLOUT
                } else {
                    PollFlags::POLLIN
                }
            };
            let mut fds = [
                PollFd::new(socks[0].as_fd(), out_flags(0)),
                PollFd::new(socks[1].as_fd(), out_flags(1)),
            ];
            match nix::poll::ppoll(&mut fds, timeout, None) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(io::Error::other(format!("ppoll: {e}"))),
            }
        }
        // Take in everything that has arrived. Arrival is the kernel's
        // receive stamp, moved from the wall clock to the monotonic one.
        let mono = now_ns();
        let offset = oskit::clock::realtime_ns().saturating_sub(mono);
        for (i, s) in socks.iter().enumerate() {
            for _ in 0..256 {
                match s.recv_stamped(&mut buf) {
                    Ok((n, ts)) => {
                        let t = ts.map(|t| t.saturating_sub(offset).min(mono)).unwrap_or(mono);
                        qs[i].push(t, buf[..n].to_vec());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("recv on {}: {e}", [&cfg.a, &cfg.b][i]),
                        ))
                    }
                }
            }
        }
        // Spin up to the next release if it is close, then send what is due.
        if let Some(t) = qs.iter().filter_map(|q| q.next_release()).min() {
            if t > now_ns() && t <= now_ns() + cfg.spin_ns {
                while now_ns() < t {
                    std::hint::spin_loop();
                }
            }
        }
        let now = now_ns();
        for i in 0..2 {
            let out = &socks[1 - i];
            blocked[1 - i] = false;
            while let Some(f) = qs[i].peek_due(now) {
                match out.send(f) {
                    Ok(_) => qs[i].pop(),
                    // The peer is backed up: keep the frame, wait for POLLOUT.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.raw_os_error() == Some(libc::ENOBUFS) => {
                        blocked[1 - i] = true;
                        break;
                    }
                    // A frame the other side cannot take (e.g. too big) is
                    // counted as lost rather than stopping the link.
                    Err(_) => {
                        qs[i].pop();
                        qs[i].stats.sent -= 1;
                        qs[i].stats.lost += 1;
                    }
                }
            }
        }
    }
    Ok([qs[0].stats, qs[1].stats])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tdf_change_scales_the_delay_of_new_frames_only() {
        let mut q = DelayQueue::new(1_000, 0, 0, 100, 1);
        assert_eq!(q.push(0, vec![1]), Verdict::Queued { release_ns: 1_000 });
        // Built at TDF 2, the lab now at 4: twice the delay for new frames.
        let (n, d) = tdf_scale(vtime::Tdf::new(4, 1).unwrap(), vtime::Tdf::new(2, 1).unwrap());
        assert_eq!((n, d), (4, 2));
        q.set_scale(n, d);
        assert_eq!(q.push(10, vec![2]), Verdict::Queued { release_ns: 2_010 });
        // The first frame kept its release time.
        assert_eq!(q.next_release(), Some(1_000));
        q.set_scale(1, 2);
        // Never earlier than the frame before it (FIFO).
        assert_eq!(q.push(20, vec![3]), Verdict::Queued { release_ns: 2_010 });
        assert_eq!(q.push(3_000, vec![4]), Verdict::Queued { release_ns: 3_500 });
    }

    #[test]
    fn releases_after_delay_in_order() {
        let mut q = DelayQueue::new(1000, 0, 0, 10, 1);
        assert_eq!(q.push(5, vec![1]), Verdict::Queued { release_ns: 1005 });
        assert_eq!(q.push(7, vec![2]), Verdict::Queued { release_ns: 1007 });
        assert_eq!(q.peek_due(1004), None);
        assert_eq!(q.peek_due(1005), Some(&[1u8][..]));
        q.pop();
        assert_eq!(q.next_release(), Some(1007));
        q.pop();
        assert!(q.is_empty());
        assert_eq!(q.stats.sent, 2);
    }

    #[test]
    fn jitter_stays_in_bounds_and_never_reorders() {
        let mut q = DelayQueue::new(10_000, 3_000, 0, 100_000, 42);
        let mut last = 0;
        let (mut lo, mut hi) = (u64::MAX, 0);
        for i in 0..10_000u64 {
            let now = i * 100_000; // far apart: jitter is never clipped by FIFO
            let Verdict::Queued { release_ns } = q.push(now, vec![]) else {
                panic!()
            };
            assert!(release_ns >= last);
            last = release_ns;
            lo = lo.min(release_ns - now);
            hi = hi.max(release_ns - now);
        }
        assert!(lo >= 7_000 && hi <= 13_000, "{lo}..{hi}");
        assert!(lo < 7_100 && hi > 12_900, "jitter should cover its range: {lo}..{hi}");
    }

    #[test]
    fn loss_and_overflow_are_counted_exactly() {
        let mut q = DelayQueue::new(0, 0, 250_000, 1_000_000, 7);
        for i in 0..100_000 {
            q.push(i, vec![]);
        }
        assert_eq!(q.stats.lost + q.stats.queued, 100_000);
        let rate = q.stats.lost as f64 / 100_000.0;
        assert!((rate - 0.25).abs() < 0.01, "{rate}");
        let mut q = DelayQueue::new(0, 0, 0, 3, 7);
        for i in 0..5 {
            q.push(i, vec![]);
        }
        assert_eq!((q.stats.queued, q.stats.overflow, q.len()), (3, 2, 3));
    }
}
