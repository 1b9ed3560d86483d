//! Receive backends: how datagrams get from a group's socket into the event
//! loop, each as an owned buffer of a receive pool ([`RecvBuf`]) that a
//! fan-out which has to wait simply keeps (no copy), and that goes back to
//! its pool when dropped.
//!
//! One contract ([`Receive`]), backends chosen at run time (`--receive`):
//! `recvmmsg` (the loop reads a group's socket when epoll says it is
//! readable, one syscall per batch) and `io-uring` (one multishot
//! `RECVMSG` per socket into a provided-buffer ring; the ring's fd sits in
//! the loop's epoll, so the loop's model is the same).
//!
//! Adding a backend costs its file in this folder, where its type
//! implements [`Receive`] and [`ReceiveBackend`], and its line in the
//! registry list below (`receive_backends!`). The module, the
//! [`ReceiveKind`] variant, `--receive`'s value, the server's, the tests'
//! and the benchmarks' lists all come from that line.

pub use oskit::Support;
use reflector_proto::protocol::MAX_DATAGRAM;
use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::os::fd::BorrowedFd;
use std::rc::Rc;

/// Room for the longest datagram, plus one byte so that a longer one shows
/// as too long instead of fitting exactly.
pub const RECV_BUF: usize = MAX_DATAGRAM + 1;

/// No buffer-ring id: the buffer goes back to the pool's free list.
const NO_BID: u16 = u16::MAX;

#[derive(Default)]
struct PoolInner {
    size: usize,
    free: Vec<Box<[u8]>>,
    /// Buffers of a ring (with their ids), dropped since the ring took its
    /// buffers back last.
    returned: Vec<(u16, Box<[u8]>)>,
    preallocated: usize,
    allocated: usize,
    handed_out: u64,
    /// [`RecvBuf`]s alive now.
    held: usize,
    /// Ring buffers dropped so far (each goes back to the kernel's ring).
    ring_returned: u64,
}

/// Fixed-size receive buffers for one event loop (single-threaded: no
/// locks). Steady state allocates nothing; the pool grows only while
/// buffers are held (by a waiting fan-out, a parked group's backlog), at
/// most by what the loop lets wait: one batch per parked group.
#[derive(Clone)]
pub struct RecvPool(Rc<RefCell<PoolInner>>);

/// What a pool has done: for tests, and published as the loop's receive
/// metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Buffers allocated when the pool was made.
    pub preallocated: usize,
    /// Buffers ever allocated by the pool (the preallocated ones included;
    /// the pool frees none while it lives).
    pub allocated: usize,
    /// Buffers in the free list now.
    pub free: usize,
    /// Buffers handed out as [`RecvBuf`]s so far.
    pub handed_out: u64,
    /// [`RecvBuf`]s alive now: datagrams being handled, kept by a fan-out
    /// that waits, or queued in a parked group's backlog.
    pub held: usize,
    /// Buffers of a kernel ring dropped so far, each on its way back to the
    /// ring ([`RecvPool::take_returned`]).
    pub ring_returned: u64,
}

impl RecvPool {
    /// A pool of `size`-byte buffers, `prealloc` of them allocated now.
    pub fn new(size: usize, prealloc: usize) -> RecvPool {
        let p = RecvPool(Rc::new(RefCell::new(PoolInner {
            size,
            ..PoolInner::default()
        })));
        {
            let mut i = p.0.borrow_mut();
            i.free = (0..prealloc).map(|_| vec![0u8; size].into_boxed_slice()).collect();
            i.allocated = prealloc;
            i.preallocated = prealloc;
        }
        p
    }

    /// A free buffer, allocated if none is free.
    pub fn take(&self) -> Box<[u8]> {
        let mut i = self.0.borrow_mut();
        match i.free.pop() {
            Some(b) => b,
            None => {
                i.allocated += 1;
                vec![0u8; i.size].into_boxed_slice()
            }
        }
    }

    /// A buffer that was not handed out goes back.
    pub fn put(&self, b: Box<[u8]>) {
        self.0.borrow_mut().free.push(b);
    }

    /// `buf` with a datagram at `start..start + len`, handed out; it comes
    /// back to the free list when dropped.
    pub fn wrap(&self, buf: Box<[u8]>, start: usize, len: usize) -> RecvBuf {
        self.wrap_ring(buf, NO_BID, start, len)
    }

    /// The same for buffer `bid` of a ring: it comes back to
    /// [`RecvPool::take_returned`].
    pub fn wrap_ring(&self, buf: Box<[u8]>, bid: u16, start: usize, len: usize) -> RecvBuf {
        {
            let mut i = self.0.borrow_mut();
            i.handed_out += 1;
            i.held += 1;
        }
        let end = (start + len).min(buf.len());
        RecvBuf {
            start: start.min(end) as u32,
            end: end as u32,
            bid,
            buf,
            pool: Rc::clone(&self.0),
        }
    }

    /// A copy of `bytes` in a pool buffer (tests, and callers that have
    /// the bytes elsewhere).
    pub fn filled(&self, bytes: &[u8]) -> RecvBuf {
        let mut b = self.take();
        let n = bytes.len().min(b.len());
        b[..n].copy_from_slice(&bytes[..n]);
        self.wrap(b, 0, n)
    }

    /// Ring buffers dropped since the last call, with their ids.
    pub fn take_returned(&self, into: &mut Vec<(u16, Box<[u8]>)>) {
        into.append(&mut self.0.borrow_mut().returned);
    }

    pub fn stats(&self) -> PoolStats {
        let i = self.0.borrow();
        PoolStats {
            preallocated: i.preallocated,
            allocated: i.allocated,
            free: i.free.len(),
            handed_out: i.handed_out,
            held: i.held,
            ring_returned: i.ring_returned,
        }
    }
}

/// One received datagram in a buffer of a [`RecvPool`], owned: whoever
/// holds it may keep it as long as it likes; dropped, it goes back to the
/// pool (or to the kernel's buffer ring it came from).
pub struct RecvBuf {
    buf: Box<[u8]>,
    start: u32,
    end: u32,
    bid: u16,
    pool: Rc<RefCell<PoolInner>>,
}

impl Deref for RecvBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.start as usize..self.end as usize]
    }
}

impl DerefMut for RecvBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.start as usize..self.end as usize]
    }
}

impl Drop for RecvBuf {
    fn drop(&mut self) {
        // An empty boxed slice allocates nothing.
        let b = std::mem::take(&mut self.buf);
        let mut p = self.pool.borrow_mut();
        p.held -= 1;
        if self.bid == NO_BID {
            p.free.push(b);
        } else {
            p.ring_returned += 1;
            p.returned.push((self.bid, b));
        }
    }
}

impl std::fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RecvBuf({} bytes)", self.len())
    }
}

/// One datagram received for group `group` of the loop.
pub struct Received {
    pub group: usize,
    pub src: SocketAddr,
    pub buf: RecvBuf,
    /// The group's socket had nothing more queued behind it.
    pub drained: bool,
}

/// What woke the loop for a receive.
#[derive(Clone, Copy)]
pub enum Ready<'a> {
    /// Group `g`'s socket is readable (readiness-driven receives).
    Socket(usize, BorrowedFd<'a>),
    /// The receive's own fd ([`Receive::ring_fd`]) is readable.
    Ring,
}

/// A receive backend for the groups of one event loop (indices as in
/// [`crate::backend::Fanout`]).
pub trait Receive {
    fn name(&self) -> &'static str;

    /// An fd of its own that the loop watches (a completion ring), if it
    /// has one: then the loop does not watch the groups' sockets for
    /// datagrams and calls `recv(Ready::Ring)` when that fd is readable.
    fn ring_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// Group `g` is received from `sock` from now on.
    fn attach(&mut self, _g: usize, _sock: BorrowedFd<'_>) -> io::Result<()> {
        Ok(())
    }

    /// Appends up to a batch of datagrams to `out`; returns how many the
    /// kernel handed over (datagrams without a source are counted but
    /// dropped). WouldBlock when there was none.
    fn recv(&mut self, ready: Ready<'_>, out: &mut Vec<Received>) -> io::Result<usize>;

    /// Datagrams per batch at most: a smaller count means the socket was
    /// drained.
    fn batch(&self) -> usize;

    /// Group `g` waits for a fan-out: receive no more for it if the
    /// backend can (what arrives still is kept in order by the loop).
    fn pause(&mut self, _g: usize) {}

    /// Group `g` may receive again.
    fn unpause(&mut self, _g: usize) {}

    /// Called once per loop iteration: hand the kernel whatever is due
    /// (buffers back, receives re-armed).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    /// The receive's buffer pool.
    fn pool(&self) -> &RecvPool;
}

/// What each receive backend's file states about its type; the registry
/// line names the type, and [`ReceiveKind`] is built from these.
pub trait ReceiveBackend: Receive + Sized + 'static {
    /// Its `--receive` value, and its name in logs, metrics and benches.
    const NAME: &'static str;
    /// What `--help` says about the value (clap's convention: the final
    /// period is not shown).
    const HELP: &'static str;
    /// Datagrams land in buffers of a kernel ring ([`RecvPool::wrap_ring`]),
    /// which get them back when dropped; otherwise in the pool's own
    /// buffers ([`RecvPool::wrap`]). The pool's metrics differ accordingly.
    const RING_BUFFERS: bool;

    /// Whether this kernel can run it (asked once, before a server starts).
    fn probe() -> Support;

    /// One event loop's receive.
    fn build() -> io::Result<Self>;
}

/// The registry of receive backends: one line per backend, the default
/// first, as `(Variant, test_name, module::Type)`: the [`ReceiveKind`]
/// variant, the name of its tests in the matrix of `backend_matrix!`
/// (feature `testing`), and its file (`module.rs` in this folder, declared
/// from here) with the type that implements [`ReceiveBackend`].
///
/// `receive_backends!((callback) args...)` expands to
/// `callback! { args... [list] }`: the list travels as one token tree, so
/// the callback can repeat over it inside repetitions of its own (the test
/// matrix, per fan-out backend). Exported only for that macro.
///
/// `cargo fmt` does not reach files whose `mod` a macro declares: `make
/// lint` checks this folder's files by name, and `rustfmt --edition 2021
/// crates/server/src/receive/*.rs` formats them.
#[doc(hidden)]
#[macro_export]
macro_rules! receive_backends {
    (($($callback:tt)*) $($args:tt)*) => {
        $($callback)*! { $($args)* [
            (Recvmmsg, recvmmsg, recvmmsg::Recvmmsg),
            (IoUring, io_uring, uring::UringReceive),
        ] }
    };
}

/// Everything the registry list determines here: the modules, the enum and
/// its lookups.
macro_rules! define_receive_kinds {
    ([$(($variant:ident, $test:ident, $module:ident :: $ty:ident)),+ $(,)?]) => {
        $(pub mod $module;)+

        /// The receive backends, from the registry list: `--receive`'s
        /// values, the default first.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum ReceiveKind {
            $(
                #[doc = concat!("[`", stringify!($module), "::", stringify!($ty), "`]")]
                $variant,
            )+
        }

        impl ReceiveKind {
            /// Every receive backend, default first: what the tests, the demo and
            /// the benchmarks iterate.
            pub const ALL: [ReceiveKind; [$(ReceiveKind::$variant),+].len()] = [$(ReceiveKind::$variant),+];

            pub fn name(self) -> &'static str {
                match self {
                    $(ReceiveKind::$variant => <$module::$ty as ReceiveBackend>::NAME,)+
                }
            }

            /// What `--help` says about it.
            pub fn help(self) -> &'static str {
                match self {
                    $(ReceiveKind::$variant => <$module::$ty as ReceiveBackend>::HELP,)+
                }
            }

            /// See [`ReceiveBackend::RING_BUFFERS`].
            pub fn ring_buffers(self) -> bool {
                match self {
                    $(ReceiveKind::$variant => <$module::$ty as ReceiveBackend>::RING_BUFFERS,)+
                }
            }

            /// Asks the kernel whether it can run this backend
            /// ([`ReceiveBackend::probe`]).
            pub fn probe(self) -> Support {
                match self {
                    $(ReceiveKind::$variant => <$module::$ty as ReceiveBackend>::probe(),)+
                }
            }

            /// One event loop's receive.
            pub fn build(self) -> io::Result<Box<dyn Receive>> {
                Ok(match self {
                    $(ReceiveKind::$variant => Box::new(<$module::$ty as ReceiveBackend>::build()?),)+
                })
            }
        }
    };
}

receive_backends!((define_receive_kinds));

/// The first backend of the registry list.
impl Default for ReceiveKind {
    fn default() -> ReceiveKind {
        ReceiveKind::ALL[0]
    }
}

/// By hand rather than derived, so that the values and their help come
/// from the registry list.
impl clap::ValueEnum for ReceiveKind {
    fn value_variants<'a>() -> &'a [ReceiveKind] {
        &ReceiveKind::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        // As clap's derive shows a one-line doc comment: without its final period.
        let help = self.help().strip_suffix('.').unwrap_or(self.help());
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

impl std::str::FromStr for ReceiveKind {
    type Err = String;

    fn from_str(s: &str) -> Result<ReceiveKind, String> {
        ReceiveKind::ALL.into_iter().find(|r| r.name() == s).ok_or_else(|| {
            let names: Vec<&str> = ReceiveKind::ALL.iter().map(|r| r.name()).collect();
            format!("unknown receive '{s}'; choose one of: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for ReceiveKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_to_the_pool_and_are_reused() {
        let p = RecvPool::new(16, 2);
        let a = p.filled(b"hello");
        assert_eq!(&*a, b"hello");
        let b = p.filled(b"x");
        // Both preallocated ones are out; a third is allocated.
        let c = p.filled(b"y");
        let ptrs = [a.as_ptr(), b.as_ptr(), c.as_ptr()];
        let s = p.stats();
        assert_eq!((s.preallocated, s.allocated, s.held, s.handed_out), (2, 3, 3, 3));
        drop((a, b, c));
        assert_eq!(p.stats().free, 3);
        assert_eq!(p.stats().held, 0);
        // No allocation in steady state: the same buffers go round.
        for _ in 0..100 {
            let d = p.filled(b"again");
            assert_eq!(&*d, b"again");
        }
        assert_eq!(p.stats().allocated, 3);
        let again = p.filled(b"z");
        assert!(ptrs.contains(&again.as_ptr()));
        // Ring buffers come back with their ids.
        let r = p.wrap_ring(vec![0u8; 16].into_boxed_slice(), 5, 2, 4);
        assert_eq!(r.len(), 4);
        assert_eq!((p.stats().held, p.stats().ring_returned), (2, 0));
        drop(r);
        assert_eq!((p.stats().held, p.stats().ring_returned), (1, 1));
        let mut back = Vec::new();
        p.take_returned(&mut back);
        assert_eq!(back.iter().map(|b| b.0).collect::<Vec<_>>(), vec![5]);
    }

    #[test]
    fn kinds_by_name() {
        for r in ReceiveKind::ALL {
            assert_eq!(r.name().parse::<ReceiveKind>(), Ok(r));
        }
        let e = "xdp".parse::<ReceiveKind>().unwrap_err();
        assert!(e.contains("recvmmsg") && e.contains("io-uring"), "{e}");
        assert_eq!(ReceiveKind::Recvmmsg.probe(), Support::Supported);
        assert_eq!(ReceiveKind::default(), ReceiveKind::Recvmmsg);
        // What the pool metrics test expects of each kind's buffers.
        assert!(!ReceiveKind::Recvmmsg.ring_buffers());
        assert!(ReceiveKind::IoUring.ring_buffers());
        // What the registry list makes agrees with the backends' own names.
        for (k, r) in ReceiveKind::ALL.into_iter().enumerate() {
            assert!(ReceiveKind::ALL[..k].iter().all(|o| o.name() != r.name()), "{r} twice");
            assert!(!r.help().is_empty(), "{r}");
            let value = clap::ValueEnum::to_possible_value(&r).unwrap();
            assert_eq!(value.get_name(), r.name());
            if r.probe() == Support::Supported {
                assert_eq!(r.build().unwrap().name(), r.name());
            }
        }
    }
}
