//! `--receive io-uring`: one ring per event loop, one multishot RECVMSG per
//! group socket into a ring of provided buffers (`sendpath::UringRecv`).
//! The ring's fd sits in the loop's epoll; when it is readable the loop
//! takes the datagrams of all its groups at once. A receive that ends
//! (the buffers ran out: ENOBUFS; a paused group's, cancelled) is armed
//! again once buffers are back and its group may receive; a datagram's
//! buffer goes back to the kernel's ring when its [`RecvBuf`] is dropped.

use super::{Ready, Receive, ReceiveBackend, Received, RecvBuf, RecvPool, Support, RECV_BUF};
use sendpath::{RecvEvent, UringRecv};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Buffers in the kernel's ring (about 64 KiB each).
const BUFFERS: u16 = 128;
/// Completions taken per call.
const BATCH: usize = 64;

#[derive(Default)]
struct Group {
    sock: Option<OwnedFd>,
    armed: bool,
    paused: bool,
}

/// Multishot `RECVMSG` into the kernel's ring of provided buffers.
pub struct UringReceive {
    ring: UringRecv,
    groups: Vec<Group>,
    /// Groups whose receive is not armed and should be.
    disarmed: usize,
    pool: RecvPool,
    returned: Vec<(u16, Box<[u8]>)>,
}

impl UringReceive {
    pub fn new() -> io::Result<UringReceive> {
        Ok(UringReceive {
            ring: UringRecv::new(BUFFERS, RECV_BUF)?,
            groups: Vec::new(),
            disarmed: 0,
            // The ring's buffers are its own; the pool only routes them
            // back (and counts).
            pool: RecvPool::new(RECV_BUF, 0),
            returned: Vec::with_capacity(usize::from(BUFFERS)),
        })
    }

    /// Buffers dropped since the last call go back to the kernel.
    fn give_back(&mut self) {
        self.pool.take_returned(&mut self.returned);
        for (bid, b) in self.returned.drain(..) {
            self.ring.provide(bid, b);
        }
    }

    /// Arms every group that should receive and is not armed, if the
    /// kernel has buffers to receive into.
    fn rearm(&mut self) -> io::Result<()> {
        if self.disarmed == 0 || self.ring.available() == 0 {
            return Ok(());
        }
        for (g, st) in self.groups.iter_mut().enumerate() {
            if st.armed || st.paused {
                continue;
            }
            if let Some(sock) = &st.sock {
                self.ring.arm(g as u64, sock.as_fd())?;
                st.armed = true;
                self.disarmed -= 1;
            }
        }
        Ok(())
    }
}

impl ReceiveBackend for UringReceive {
    const NAME: &'static str = "io-uring";
    const HELP: &'static str = "io_uring: one multishot RECVMSG per socket into a ring of provided buffers \
                                (Linux 6.0+; io_uring must be allowed: sysctl kernel.io_uring_disabled = 0, \
                                not blocked by a container's seccomp profile).";
    const RING_BUFFERS: bool = true;

    /// One multishot receive armed on a loopback socket must deliver a
    /// datagram; the reason it did not names the cause.
    fn probe() -> Support {
        match sendpath::probe_recv_multishot() {
            Ok(()) => Support::Supported,
            Err(why) => Support::Unsupported(why),
        }
    }

    fn build() -> io::Result<UringReceive> {
        UringReceive::new()
    }
}

impl Receive for UringReceive {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn ring_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.ring.fd())
    }

    fn attach(&mut self, g: usize, sock: BorrowedFd<'_>) -> io::Result<()> {
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, Group::default);
        }
        let st = &mut self.groups[g];
        if st.sock.is_none() {
            self.disarmed += 1;
        }
        // The ring holds the socket while a receive runs; this copy is for
        // arming it again.
        st.sock = Some(sock.try_clone_to_owned()?);
        self.flush()
    }

    fn recv(&mut self, ready: Ready<'_>, out: &mut Vec<Received>) -> io::Result<usize> {
        if !matches!(ready, Ready::Ring) {
            return Ok(0);
        }
        self.give_back();
        let (groups, pool, disarmed) = (&mut self.groups, &self.pool, &mut self.disarmed);
        let mut n = 0;
        self.ring.reap(BATCH, |ev| match ev {
            RecvEvent::Datagram {
                key,
                bid,
                buf,
                payload,
                src,
                more_queued,
                ..
            } => {
                n += 1;
                let group = key as usize;
                let buf: RecvBuf = pool.wrap_ring(buf, bid, payload.start, payload.len());
                // Without a source the buffer goes straight back (dropped).
                if let Some(src) = src {
                    out.push(Received {
                        group,
                        src,
                        buf,
                        drained: !more_queued,
                    });
                }
            }
            RecvEvent::Ended { key, .. } => {
                // ENOBUFS, ECANCELED, or a socket error (a queued ICMP
                // error, which the loop reads from the error queue on
                // EPOLLERR): armed again by `rearm`.
                if let Some(st) = groups.get_mut(key as usize) {
                    if st.armed {
                        st.armed = false;
                        *disarmed += 1;
                    }
                }
            }
        });
        self.give_back();
        self.rearm()?;
        self.ring.submit()?;
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn batch(&self) -> usize {
        BATCH
    }

    fn pause(&mut self, g: usize) {
        if let Some(st) = self.groups.get_mut(g) {
            st.paused = true;
            if st.armed {
                // Its Ended follows; what arrives before waits in order.
                let _ = self.ring.cancel(g as u64);
            }
        }
    }

    fn unpause(&mut self, g: usize) {
        if let Some(st) = self.groups.get_mut(g) {
            st.paused = false;
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.give_back();
        self.rearm()?;
        self.ring.submit()
    }

    fn pool(&self) -> &RecvPool {
        &self.pool
    }
}
