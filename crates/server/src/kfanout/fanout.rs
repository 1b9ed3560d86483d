//! The `ebpf` backend as an event loop sees it: the shared kernel path for
//! what the program replicates, `sendmmsg` for what it passes up.

use super::sys::{PROTO_LEAVE, PROTO_LEAVE_LEN};
use crate::backend::user::{Fanout, Progress, UserFanout};
use crate::membership::Member;
use crate::metrics::GroupCounters;
use crate::receive::RecvBuf;
use reflector_proto::protocol::field;
use std::io;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::sync::MutexGuard;

use super::{KernelPath, SharedKernel};

/// The `ebpf` backend of one event loop: the shared kernel path for what
/// the program replicates, `sendmmsg` for what it passes up.
pub struct EbpfFanout {
    kernel: SharedKernel,
    user: UserFanout,
    ports: Vec<u16>,
    /// Groups whose DATA this loop is serving itself (see `held` in
    /// fanout.h), so the map is written only when that changes.
    held: Vec<bool>,
}

impl EbpfFanout {
    pub fn new(kernel: SharedKernel) -> EbpfFanout {
        EbpfFanout {
            kernel,
            user: UserFanout::sendmmsg(),
            ports: Vec::new(),
            held: Vec::new(),
        }
    }

    fn kernel(&self) -> MutexGuard<'_, KernelPath> {
        // A panic while holding the lock leaves maps that are still valid
        // (each update is one syscall): go on with them.
        self.kernel.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn port(&self, g: usize) -> Option<u16> {
        self.ports.get(g).copied()
    }
}

impl Fanout for EbpfFanout {
    fn name(&self) -> &'static str {
        "ebpf"
    }

    fn attach(&mut self, g: usize, fd: BorrowedFd<'_>, port: u16, tags: bool) -> io::Result<()> {
        if self.ports.len() <= g {
            self.ports.resize(g + 1, 0);
            self.held.resize(g + 1, false);
        }
        self.ports[g] = port;
        self.kernel().add_group(port, tags)?;
        self.user.attach(g, fd, port, tags)
    }

    fn member_added(&mut self, g: usize, addr: SocketAddr, m: Option<&Member>) {
        self.user.member_added(g, addr, m);
        if let (Some(port), Some(m)) = (self.port(g), m) {
            self.kernel().member_added(port, addr, m);
        }
    }

    fn member_removed(&mut self, g: usize, addr: SocketAddr) {
        self.user.member_removed(g, addr);
        if let Some(port) = self.port(g) {
            self.kernel().member_removed(port, addr);
        }
    }

    fn fanout(
        &mut self,
        g: usize,
        fd: BorrowedFd<'_>,
        datagram: RecvBuf,
        from: SocketAddr,
        c: &GroupCounters,
    ) -> Progress {
        // DATA the program passed up: until the socket is drained, newer
        // DATA of this group must not overtake it in the kernel.
        if let (Some(port), Some(false)) = (self.port(g), self.held.get(g).copied()) {
            self.held[g] = true;
            self.kernel().hold(port, true);
        }
        self.user.fanout(g, fd, datagram, from, c)
    }

    fn idle(&mut self, g: usize) {
        let Some(port) = self.port(g) else {
            return;
        };
        let held = self.held.get(g).copied() == Some(true);
        if held {
            self.held[g] = false;
        }
        let mut k = self.kernel();
        if held {
            k.hold(port, false);
        }
        k.drained(port);
    }

    fn leave_arrived(&mut self, g: usize, from: SocketAddr, datagram: &[u8]) -> bool {
        // Most datagrams are not LEAVEs: no lock for them.
        if datagram.len() != PROTO_LEAVE_LEN || datagram[field::KIND] != PROTO_LEAVE {
            return false;
        }
        self.port(g)
            .is_some_and(|port| self.kernel().fenced_leave(port, from, datagram))
    }

    fn leave_judged(&mut self, g: usize) {
        if let Some(port) = self.port(g) {
            self.kernel().leave_judged(port);
        }
    }

    fn resume(&mut self, g: usize, fd: BorrowedFd<'_>, c: &GroupCounters) -> Progress {
        self.user.resume(g, fd, c)
    }

    fn abandon(&mut self, g: usize, c: &GroupCounters) {
        self.user.abandon(g, c)
    }

    fn sync(&mut self, g: usize, c: &GroupCounters, heard: &mut dyn FnMut(SocketAddr)) {
        if let Some(port) = self.port(g) {
            self.kernel().sync(port, c, heard);
        }
    }

    fn accept_data(&mut self, g: usize, from: SocketAddr, datagram: &[u8]) -> bool {
        match self.port(g) {
            Some(port) => self.kernel().accept_data(port, from, datagram),
            None => true,
        }
    }
}
