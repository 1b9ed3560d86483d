//! Socket options several crates set the same way.

use crate::SysError;
use nix::sys::socket::{getsockopt, setsockopt, sockopt};
use std::os::fd::AsFd;

/// Sets SO_RCVBUF/SO_SNDBUF to `rcv`/`snd` bytes, trying the root-only
/// `*FORCE` variants first so that the system-wide caps
/// (`net.core.[rw]mem_max`) do not silently shrink them, then the plain
/// options (capped by the kernel). Returns the sizes the kernel reports
/// (it doubles the request for its bookkeeping).
pub fn set_buffers<F: AsFd>(sock: &F, rcv: usize, snd: usize) -> Result<(usize, usize), SysError> {
    if setsockopt(sock, sockopt::RcvBufForce, &rcv).is_err() {
        setsockopt(sock, sockopt::RcvBuf, &rcv)
            .map_err(|e| SysError::new(format!("setsockopt(SO_RCVBUF, {rcv})"), e))?;
    }
    if setsockopt(sock, sockopt::SndBufForce, &snd).is_err() {
        setsockopt(sock, sockopt::SndBuf, &snd)
            .map_err(|e| SysError::new(format!("setsockopt(SO_SNDBUF, {snd})"), e))?;
    }
    let r = getsockopt(sock, sockopt::RcvBuf).map_err(|e| SysError::new("getsockopt(SO_RCVBUF)", e))?;
    let s = getsockopt(sock, sockopt::SndBuf).map_err(|e| SysError::new("getsockopt(SO_SNDBUF)", e))?;
    Ok((r, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_at_least_what_was_asked_when_allowed() {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (r, w) = set_buffers(&s, 64 << 10, 32 << 10).unwrap();
        // Without root the caps may shrink them, but 32/64 KiB is under the
        // default caps; the kernel doubles what it is given.
        assert!(r >= 64 << 10, "{r}");
        assert!(w >= 32 << 10, "{w}");
    }
}
