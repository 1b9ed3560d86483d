//! The fan-out contract and the user-space backends (`sendto`, `sendmmsg`).
//!
//! Contract: a fan-out either completes ([`Progress::Done`]: every other
//! member has the datagram, or was given up for a counted reason) or is
//! [`Progress::Pending`]: the socket buffer or the device queue is full, and
//! the event loop resumes it ([`Fanout::resume`]) when the socket is
//! writable or the back-off timer fires, serving its other groups meanwhile.
//! A full queue is never a reason to drop: with `IP_RECVERR` the kernel
//! reports it as ENOBUFS, and we wait and resend (paper §4.1). A pending
//! fan-out keeps a snapshot of the destinations it still owes and the
//! datagram's receive buffer (owned: no copy), so members joining or
//! leaving before it resumes change nothing for it.

use crate::membership::Member;
use crate::metrics::GroupCounters;
use crate::receive::RecvBuf;
pub use oskit::Support;
use sendpath::errqueue::ErrEntry;
use sendpath::DestSet;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// When a pending fan-out wants to be resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// When the socket is writable again (its buffer was full: EAGAIN).
    Writable,
    /// At this time (the device queue was full: ENOBUFS; the socket usually
    /// stays writable then, so waiting for POLLOUT would spin).
    At(Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    Done,
    Pending(Wake),
}

/// A fan-out backend, for every group of one event loop. Groups are the
/// loop's indices; the backend keeps per group whatever it sends with.
/// Built on the loop's own thread (it holds the loop's receive buffers).
pub trait Fanout {
    fn name(&self) -> &'static str;

    /// Group `g` (port `port`, DATA tags on or off) is served from socket
    /// `fd` from now on.
    fn attach(&mut self, g: usize, fd: BorrowedFd<'_>, port: u16, tags: bool) -> io::Result<()>;

    /// A member at `addr`; `m` is its state in the membership core (absent
    /// if it left again within the same batch of changes).
    fn member_added(&mut self, g: usize, addr: SocketAddr, m: Option<&Member>);

    fn member_removed(&mut self, g: usize, addr: SocketAddr);

    /// Sends `datagram` to every member of `g` but `from`, counting copies,
    /// waits and give-ups in `c`. Must not be called while `g` is pending.
    /// A pending fan-out keeps `datagram` (the receive buffer itself) until
    /// it is done; dropping it returns the buffer to its pool.
    fn fanout(
        &mut self,
        g: usize,
        fd: BorrowedFd<'_>,
        datagram: RecvBuf,
        from: SocketAddr,
        c: &GroupCounters,
    ) -> Progress;

    /// Continues a pending fan-out of `g`.
    fn resume(&mut self, g: usize, fd: BorrowedFd<'_>, c: &GroupCounters) -> Progress;

    /// Gives up a pending fan-out of `g` (shutdown); the copies it still owed
    /// are counted in `send_errors`.
    fn abandon(&mut self, g: usize, c: &GroupCounters);

    /// An entry read from the error queue of `g`'s socket.
    fn error_entry(&mut self, _g: usize, _e: &ErrEntry) {}

    /// Copies counters kept outside `c` (an in-kernel backend's maps) into
    /// it, and names the members whose DATA it forwarded since the last call
    /// (signs of life the membership core did not see); called at every
    /// expiry sweep, before the expiry.
    fn sync(&mut self, _g: usize, _c: &GroupCounters, _heard: &mut dyn FnMut(SocketAddr)) {}

    /// Group `g`'s socket is drained and no fan-out of it waits.
    fn idle(&mut self, _g: usize) {}

    /// A datagram about to be judged by the membership core: true if it is
    /// a LEAVE an in-kernel path fenced the group for (it passes the
    /// group's DATA up until [`Fanout::leave_judged`]).
    fn leave_arrived(&mut self, _g: usize, _from: SocketAddr, _datagram: &[u8]) -> bool {
        false
    }

    /// The LEAVE `leave_arrived` said was fenced has been judged, valid or
    /// not, and the changes it made were handed over.
    fn leave_judged(&mut self, _g: usize) {}

    /// A member's DATA that reached user space (the membership core
    /// accepted it): false if its sequence number was already seen by a
    /// path the core does not watch (the kernel's), so it is a replay.
    fn accept_data(&mut self, _g: usize, _from: SocketAddr, _datagram: &[u8]) -> bool {
        true
    }
}

/// Each member's DATA cap (the membership policy's), for a backend that
/// forwards DATA the membership core does not see (the kernel path
/// enforces it for what it replicates); 0 is no cap.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateCaps {
    pub pps: u32,
    pub bytes_per_s: u32,
}

/// One group's socket (a duplicate descriptor) and counters, for a backend
/// that sends from a thread of its own what it could not send itself (the
/// kernel path's refused copies), so they carry the group's source address
/// and port.
pub struct ResendTarget {
    pub port: u16,
    pub sock: std::net::UdpSocket,
    pub counters: std::sync::Arc<GroupCounters>,
}

/// Shortest and longest pause after ENOBUFS (hrtimers make 20 µs real,
/// unlike the 10 ms ticks the paper had).
const BACKOFF_MIN: Duration = Duration::from_micros(20);
const BACKOFF_MAX: Duration = Duration::from_millis(2);
/// A destination that fails this many times in a row with an error that is
/// not a full queue is skipped (counted in `send_errors`): a queued ICMP
/// error fails one send (any send: it is the socket's pending error), so a
/// real destination succeeds on the next try.
const MAX_HARD_FAILURES: u32 = 4;

/// What to do after a failed send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    Retry,
    Skip,
    Wait(Wake),
}

/// The no-loss policy: what a send error means and how long to wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiter {
    hard_failures: u32,
    backoff: Duration,
}

impl Waiter {
    pub(crate) fn new() -> Waiter {
        Waiter {
            hard_failures: 0,
            backoff: BACKOFF_MIN,
        }
    }

    pub(crate) fn success(&mut self) {
        self.hard_failures = 0;
        self.backoff = BACKOFF_MIN;
    }

    pub(crate) fn after_error(&mut self, e: &io::Error, c: &GroupCounters) -> Next {
        match e.raw_os_error() {
            Some(libc::EAGAIN) => {
                c.eagain_waits.fetch_add(1, Relaxed);
                Next::Wait(Wake::Writable)
            }
            Some(libc::ENOBUFS) => {
                c.enobufs_waits.fetch_add(1, Relaxed);
                let at = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                Next::Wait(Wake::At(at))
            }
            Some(libc::EINTR) => Next::Retry,
            _ => {
                self.hard_failures += 1;
                if self.hard_failures >= MAX_HARD_FAILURES {
                    self.hard_failures = 0;
                    Next::Skip
                } else {
                    Next::Retry
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Sendto,
    Sendmmsg,
}

/// A fan-out that had to wait: the datagram's receive buffer and the
/// destinations it still owes.
struct Pending {
    datagram: RecvBuf,
    rest: DestSet,
    pos: usize,
    waiter: Waiter,
}

#[derive(Default)]
struct GroupState {
    members: DestSet,
    pending: Option<Pending>,
}

/// The user-space backends: members kept as a prebuilt [`DestSet`] per
/// group (rebuilt on membership change, never per datagram).
pub(crate) struct UserFanout {
    mode: Mode,
    groups: Vec<GroupState>,
}

impl UserFanout {
    pub(crate) fn sendmmsg() -> UserFanout {
        UserFanout::new(Mode::Sendmmsg)
    }

    pub(crate) fn new(mode: Mode) -> UserFanout {
        UserFanout {
            mode,
            groups: Vec::new(),
        }
    }

    fn group(&mut self, g: usize) -> &mut GroupState {
        if g >= self.groups.len() {
            self.groups.resize_with(g + 1, GroupState::default);
        }
        &mut self.groups[g]
    }
}

/// One datagram on its way out of one socket.
struct Sender<'a> {
    mode: Mode,
    fd: BorrowedFd<'a>,
    buf: &'a [u8],
    c: &'a GroupCounters,
}

impl Sender<'_> {
    /// Sends to `set[range]` from `*pos` on; `Ok(())` when the range is
    /// done, `Err(wake)` with `*pos` at the first destination still owed.
    fn range(&self, set: &mut DestSet, range: Range<usize>, pos: &mut usize, w: &mut Waiter) -> Result<(), Wake> {
        while *pos < range.end {
            let r = match self.mode {
                Mode::Sendto => set.send_one(self.fd, self.buf, *pos).map(|_| 1),
                Mode::Sendmmsg => set.send_mmsg(self.fd, self.buf, *pos..range.end),
            };
            match r {
                Ok(k) => {
                    w.success();
                    *pos += k;
                    self.c.fanned_out.fetch_add(k as u64, Relaxed);
                    self.c.bytes_out.fetch_add((k * self.buf.len()) as u64, Relaxed);
                }
                Err(e) => match w.after_error(&e, self.c) {
                    Next::Retry => {}
                    Next::Skip => {
                        self.c.send_errors.fetch_add(1, Relaxed);
                        *pos += 1;
                    }
                    Next::Wait(wake) => return Err(wake),
                },
            }
        }
        Ok(())
    }
}

impl Fanout for UserFanout {
    fn name(&self) -> &'static str {
        match self.mode {
            Mode::Sendto => "sendto",
            Mode::Sendmmsg => "sendmmsg",
        }
    }

    fn attach(&mut self, g: usize, _fd: BorrowedFd<'_>, _port: u16, _tags: bool) -> io::Result<()> {
        self.group(g);
        Ok(())
    }

    fn member_added(&mut self, g: usize, addr: SocketAddr, _m: Option<&Member>) {
        self.group(g).members.insert(addr);
    }

    fn member_removed(&mut self, g: usize, addr: SocketAddr) {
        self.group(g).members.remove(&addr);
    }

    fn fanout(
        &mut self,
        g: usize,
        fd: BorrowedFd<'_>,
        datagram: RecvBuf,
        from: SocketAddr,
        c: &GroupCounters,
    ) -> Progress {
        let mode = self.mode;
        let st = self.group(g);
        debug_assert!(st.pending.is_none(), "fan-out started while one is pending");
        let n = st.members.len();
        // Everyone but the sender: the ranges on either side of it.
        let (first, second) = match st.members.position(&from) {
            Some(s) => (0..s, s + 1..n),
            None => (0..n, n..n),
        };
        let mut w = Waiter::new();
        let tx = Sender {
            mode,
            fd,
            buf: &datagram,
            c,
        };
        for (k, range) in [first.clone(), second.clone()].into_iter().enumerate() {
            let mut pos = range.start;
            if let Err(wake) = tx.range(&mut st.members, range.clone(), &mut pos, &mut w) {
                let mut owed = Vec::with_capacity(2);
                owed.push(pos..range.end);
                if k == 0 {
                    owed.push(second);
                }
                st.pending = Some(Pending {
                    datagram,
                    rest: st.members.snapshot(&owed),
                    pos: 0,
                    waiter: w,
                });
                c.pending_fanouts.fetch_add(1, Relaxed);
                return Progress::Pending(wake);
            }
        }
        Progress::Done
    }

    fn resume(&mut self, g: usize, fd: BorrowedFd<'_>, c: &GroupCounters) -> Progress {
        let mode = self.mode;
        let st = self.group(g);
        let Some(p) = st.pending.as_mut() else {
            return Progress::Done;
        };
        let end = p.rest.len();
        let tx = Sender {
            mode,
            fd,
            buf: &p.datagram,
            c,
        };
        match tx.range(&mut p.rest, 0..end, &mut p.pos, &mut p.waiter) {
            Ok(()) => {
                st.pending = None;
                Progress::Done
            }
            Err(wake) => Progress::Pending(wake),
        }
    }

    fn abandon(&mut self, g: usize, c: &GroupCounters) {
        if let Some(p) = self.group(g).pending.take() {
            c.send_errors.fetch_add((p.rest.len() - p.pos) as u64, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::os::fd::AsFd;

    #[test]
    fn the_waiter_turns_errors_into_waits_retries_and_skips() {
        let c = GroupCounters::default();
        let mut w = Waiter::new();
        assert_eq!(
            w.after_error(&io::Error::from_raw_os_error(libc::EAGAIN), &c),
            Next::Wait(Wake::Writable)
        );
        let t0 = Instant::now();
        let Next::Wait(Wake::At(a)) = w.after_error(&io::Error::from_raw_os_error(libc::ENOBUFS), &c) else {
            panic!("ENOBUFS must wait on the timer");
        };
        let Next::Wait(Wake::At(b)) = w.after_error(&io::Error::from_raw_os_error(libc::ENOBUFS), &c) else {
            panic!("ENOBUFS must wait on the timer");
        };
        // The back-off doubles.
        assert!(a >= t0 + BACKOFF_MIN && b >= t0 + 2 * BACKOFF_MIN);
        let refused = io::Error::from_raw_os_error(libc::ECONNREFUSED);
        for _ in 1..MAX_HARD_FAILURES {
            assert_eq!(w.after_error(&refused, &c), Next::Retry);
        }
        assert_eq!(w.after_error(&refused, &c), Next::Skip);
        let s = c.snapshot();
        assert_eq!((s.eagain_waits, s.enobufs_waits), (1, 2));
    }

    fn rx() -> UdpSocket {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_nonblocking(true).unwrap();
        s
    }

    fn drain(s: &UdpSocket) -> usize {
        let mut b = [0u8; 64];
        let mut n = 0;
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if s.recv(&mut b).is_ok() {
                n += 1;
            } else if n > 0 {
                std::thread::sleep(Duration::from_millis(5));
                if s.recv(&mut b).is_err() {
                    break;
                }
                n += 1;
            }
        }
        n
    }

    #[test]
    fn every_member_but_the_sender_gets_one_copy_through_membership_changes() {
        for mode in [Mode::Sendmmsg, Mode::Sendto] {
            let tx = rx();
            let members: Vec<UdpSocket> = (0..6).map(|_| rx()).collect();
            let mut f = UserFanout::new(mode);
            f.attach(0, tx.as_fd(), 0, false).unwrap();
            for m in &members {
                f.member_added(0, m.local_addr().unwrap(), None);
            }
            f.member_removed(0, members[5].local_addr().unwrap());
            let c = GroupCounters::default();
            let from = members[2].local_addr().unwrap();
            let pool = crate::receive::RecvPool::new(64, 1);
            assert_eq!(f.fanout(0, tx.as_fd(), pool.filled(b"hello"), from, &c), Progress::Done);
            // Done: the buffer is back in the pool.
            assert_eq!(pool.stats().free, 1);
            let got: Vec<usize> = members.iter().map(drain).collect();
            assert_eq!(got, vec![1, 1, 0, 1, 1, 0], "{}", f.name());
            assert_eq!(c.snapshot().fanned_out, 4);
            assert_eq!(c.snapshot().bytes_out, 20);
        }
    }

    /// A fan-out that has to wait keeps the received buffer itself: no
    /// copy (the same bytes at the same address), no other buffer taken
    /// from the pool while it waits, and the buffer back in the pool once
    /// the fan-out is done. The wait comes from a real full device queue:
    /// a veth behind a tiny token bucket, in a namespace.
    #[test]
    fn a_pending_fanout_holds_the_received_buffer_without_a_copy() {
        use crate::receive::RecvPool;
        use oskit::testing::{permanent_neighbour, root_or_skip, sh, veth_pair, NetNsGuard, VethEnd};
        if !root_or_skip("a_pending_fanout_holds_the_received_buffer_without_a_copy") {
            return;
        }
        let ns = NetNsGuard::new("rfpb");
        let n = ns.name();
        // A veth whose other end has no address: what leaves is dropped there.
        let va = VethEnd::new(n, "va").addr("10.203.0.1/24");
        veth_pair(va, VethEnd::new(n, "vb"));
        permanent_neighbour(va, "10.203.0.2", "02:52:46:00:00:09");
        sh(&[
            "tc", "-n", n, "qdisc", "add", "dev", "va", "root", "tbf", "rate", "1mbit", "burst", "1600", "limit",
            "3000",
        ]);
        ns.run(|| {
            let tx = UdpSocket::bind("10.203.0.1:0").unwrap();
            tx.set_nonblocking(true).unwrap();
            sendpath::set_recverr(tx.as_fd(), "10.203.0.1".parse().unwrap()).unwrap();
            let mut f = UserFanout::new(Mode::Sendmmsg);
            f.attach(0, tx.as_fd(), 0, false).unwrap();
            for k in 0..20u16 {
                f.member_added(0, SocketAddr::from(([10, 203, 0, 2], 5000 + k)), None);
            }
            let pool = RecvPool::new(1200, 1);
            let datagram = pool.filled(&[0xab; 1000]);
            let at = datagram.as_ptr();
            let c = GroupCounters::default();
            let from = SocketAddr::from(([10, 203, 0, 9], 1));
            let mut progress = f.fanout(0, tx.as_fd(), datagram, from, &c);
            assert!(
                matches!(progress, Progress::Pending(_)),
                "20 KB into a 3 KB queue must wait"
            );
            let held = f.groups[0].pending.as_ref().expect("a pending fan-out");
            assert_eq!(
                held.datagram.as_ptr(),
                at,
                "the pending fan-out holds the received buffer itself"
            );
            assert_eq!(&*held.datagram, &[0xab; 1000][..]);
            let s = pool.stats();
            assert_eq!(
                (s.allocated, s.free, s.handed_out),
                (1, 0, 1),
                "no copy, no other buffer"
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while progress != Progress::Done && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
                progress = f.resume(0, tx.as_fd(), &c);
            }
            assert_eq!(progress, Progress::Done);
            assert_eq!(c.snapshot().fanned_out, 20);
            // Done: the buffer is back, nothing else was allocated.
            assert_eq!(pool.stats().free, 1);
            assert_eq!(pool.stats().allocated, 1);
        });
    }
}
