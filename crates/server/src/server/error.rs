//! What can stop a server from starting or running, with hints that name
//! the likely cause.

use std::io;
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind group port {addr}: {source} ({})", bind_hint(addr, source))]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("socket setup for group port {port} failed in {call}: {source}")]
    Setup {
        port: u16,
        call: &'static str,
        source: io::Error,
    },
    #[error("event loop failed: {0}")]
    Loop(#[source] io::Error),
    #[error("{0}")]
    Config(String),
    #[error("cannot bind the checkpoint channel on {addr}: {source}")]
    BindCheckpoint {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// What most likely made binding `addr` fail, by the error's cause.
pub fn bind_hint(addr: &SocketAddr, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: give --bind one of its addresses (`ip -brief address`), or 0.0.0.0 for all",
            addr.ip()
        ),
        io::ErrorKind::AddrInUse => format!(
            "port {} is taken on {}: is another reflector running, or another program on that port?",
            addr.port(),
            addr.ip()
        ),
        io::ErrorKind::PermissionDenied => format!(
            "port {} is below net.ipv4.ip_unprivileged_port_start: run as root or with CAP_NET_BIND_SERVICE, or use a higher port",
            addr.port()
        ),
        _ => "check --bind and --ports".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_failures_name_their_cause() {
        let at: SocketAddr = "10.9.9.9:4000".parse().unwrap();
        let hint = |errno| bind_hint(&at, &io::Error::from_raw_os_error(errno));
        let h = hint(libc::EADDRNOTAVAIL);
        assert!(
            h.contains("10.9.9.9 is not an address of this host") && h.contains("--bind"),
            "{h}"
        );
        assert!(!h.contains("another reflector"), "{h}");
        assert!(hint(libc::EADDRINUSE).contains("another reflector"));
        assert!(hint(libc::EACCES).contains("CAP_NET_BIND_SERVICE"));
    }
}
