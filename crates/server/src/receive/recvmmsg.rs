//! `--receive recvmmsg`: the loop reads a group's socket when epoll says it
//! is readable, one `recvmmsg` per batch, straight into pool buffers.

use super::{Ready, Receive, ReceiveBackend, Received, RecvPool, Support, RECV_BUF};
use sendpath::RecvInto;
use std::io;

/// Datagrams per `recvmmsg`.
const BATCH: usize = 32;

/// `recvmmsg` into buffers of the loop's own pool.
pub struct Recvmmsg {
    hdrs: RecvInto,
    /// Buffers taken from the pool for the next call; those the kernel
    /// filled are handed out, the rest wait for the call after.
    staged: Vec<Box<[u8]>>,
    pool: RecvPool,
}

impl Recvmmsg {
    pub fn new() -> Recvmmsg {
        Recvmmsg {
            hdrs: RecvInto::new(BATCH),
            staged: Vec::with_capacity(BATCH),
            pool: RecvPool::new(RECV_BUF, 2 * BATCH),
        }
    }
}

impl Default for Recvmmsg {
    fn default() -> Self {
        Recvmmsg::new()
    }
}

impl ReceiveBackend for Recvmmsg {
    const NAME: &'static str = "recvmmsg";
    const HELP: &'static str = "`recvmmsg` on each readable socket: one syscall per batch of datagrams.";
    const RING_BUFFERS: bool = false;

    /// Plain sockets and `recvmmsg`: every kernel the reflector runs on.
    fn probe() -> Support {
        Support::Supported
    }

    fn build() -> io::Result<Recvmmsg> {
        Ok(Recvmmsg::new())
    }
}

impl Receive for Recvmmsg {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn recv(&mut self, ready: Ready<'_>, out: &mut Vec<Received>) -> io::Result<usize> {
        let Ready::Socket(g, fd) = ready else {
            return Ok(0);
        };
        while self.staged.len() < BATCH {
            self.staged.push(self.pool.take());
        }
        let n = self.hdrs.recv(fd, &mut self.staged)?;
        let drained = n < BATCH;
        for (k, buf) in self.staged.drain(..n).enumerate() {
            match self.hdrs.get(k) {
                Some((len, Some(src), _)) => out.push(Received {
                    group: g,
                    src,
                    buf: self.pool.wrap(buf, 0, len),
                    drained: drained && k + 1 == n,
                }),
                _ => self.pool.put(buf),
            }
        }
        Ok(n)
    }

    fn batch(&self) -> usize {
        BATCH
    }

    fn pool(&self) -> &RecvPool {
        &self.pool
    }
}
