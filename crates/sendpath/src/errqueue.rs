//! The socket error queue, decoded. With `IP_RECVERR` the kernel queues one
//! entry per failed datagram (an ICMP error from the path, a local error)
//! and, with `SO_ZEROCOPY`, one per range of completed zero-copy sends.
//! The decoding here is pure (bytes in, [`ErrKind`] out) and unit-tested;
//! reading the queue is [`read`], in the fenced `sys` module.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

pub use crate::sys::read;

/// Where an error-queue entry comes from (`ee_origin`).
const ORIGIN_LOCAL: u8 = 1;
const ORIGIN_ICMP: u8 = 2;
const ORIGIN_ICMP6: u8 = 3;
const ORIGIN_ZEROCOPY: u8 = 5;
/// `ee_code` flag of a zero-copy completion whose pages were copied anyway.
const CODE_ZEROCOPY_COPIED: u8 = 1;
/// `struct sock_extended_err`: errno u32, origin u8, type u8, code u8, pad
/// u8, info u32, data u32; the offender's address follows.
pub const EXTENDED_ERR_LEN: usize = 16;

/// One decoded entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrEntry {
    /// The destination of the datagram the error is about (the queue hands
    /// back its address); `None` for completions, which name no datagram.
    pub dest: Option<SocketAddr>,
    pub kind: ErrKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrKind {
    /// An ICMP (or ICMPv6) error from the path: `offender` is the host or
    /// router that sent it. Anyone who knows the destination and our port can
    /// forge one, so it is evidence, never proof.
    Icmp {
        errno: u32,
        icmp_type: u8,
        code: u8,
        offender: Option<IpAddr>,
    },
    /// An error raised on this host (e.g. EMSGSIZE).
    Local { errno: u32 },
    /// Zero-copy sends `lo..=hi` (counted per socket from 0) completed; with
    /// `copied` the kernel copied the pages after all (local delivery).
    Zerocopy { lo: u32, hi: u32, copied: bool },
    /// Anything else (a timestamp, a future origin): counted, not used.
    Other { origin: u8, errno: u32 },
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Decodes the payload of an `IP_RECVERR`/`IPV6_RECVERR` control message: a
/// `sock_extended_err`, then the offender's `sockaddr` if there is one.
/// Returns `None` if it is too short to be one.
pub fn decode_extended_err(b: &[u8]) -> Option<ErrKind> {
    if b.len() < EXTENDED_ERR_LEN {
        return None;
    }
    let (errno, origin, typ, code) = (u32_at(b, 0), b[4], b[5], b[6]);
    let (info, data) = (u32_at(b, 8), u32_at(b, 12));
    Some(match origin {
        ORIGIN_ICMP | ORIGIN_ICMP6 => ErrKind::Icmp {
            errno,
            icmp_type: typ,
            code,
            offender: decode_sockaddr(&b[EXTENDED_ERR_LEN..]).map(|a| a.ip()),
        },
        ORIGIN_LOCAL => ErrKind::Local { errno },
        ORIGIN_ZEROCOPY => ErrKind::Zerocopy {
            lo: info,
            hi: data,
            copied: code & CODE_ZEROCOPY_COPIED != 0,
        },
        other => ErrKind::Other { origin: other, errno },
    })
}

/// Decodes a `sockaddr_in` or `sockaddr_in6` in the kernel's layout (family
/// in host order, port and address in network order).
pub fn decode_sockaddr(b: &[u8]) -> Option<SocketAddr> {
    if b.len() < 2 {
        return None;
    }
    let family = i32::from(u16::from_ne_bytes([b[0], b[1]]));
    match family {
        libc::AF_INET if b.len() >= 8 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::new(ip.into(), port))
        }
        libc::AF_INET6 if b.len() >= 24 => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[8..24]);
            let ip = Ipv6Addr::from(o);
            // An IPv4 peer of a dual-stack socket is reported as ::ffff:a.b.c.d.
            let ip = ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4);
            Some(SocketAddr::new(ip, port))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(errno: u32, origin: u8, typ: u8, code: u8, info: u32, data: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&errno.to_ne_bytes());
        v.extend_from_slice(&[origin, typ, code, 0]);
        v.extend_from_slice(&info.to_ne_bytes());
        v.extend_from_slice(&data.to_ne_bytes());
        v
    }

    fn sin(ip: [u8; 4], port: u16) -> Vec<u8> {
        let mut v = (libc::AF_INET as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(&port.to_be_bytes());
        v.extend_from_slice(&ip);
        v.extend_from_slice(&[0; 8]);
        v
    }

    #[test]
    fn icmp_port_unreachable_with_its_offender() {
        let mut b = ext(libc::ECONNREFUSED as u32, ORIGIN_ICMP, 3, 3, 0, 0);
        b.extend(sin([10, 0, 0, 7], 0));
        assert_eq!(
            decode_extended_err(&b),
            Some(ErrKind::Icmp {
                errno: libc::ECONNREFUSED as u32,
                icmp_type: 3,
                code: 3,
                offender: Some("10.0.0.7".parse().unwrap()),
            })
        );
        // No offender address: still an ICMP error.
        let b = ext(113, ORIGIN_ICMP, 3, 1, 0, 0);
        assert!(matches!(
            decode_extended_err(&b),
            Some(ErrKind::Icmp { offender: None, .. })
        ));
    }

    #[test]
    fn zerocopy_ranges_and_the_copied_flag() {
        let b = ext(0, ORIGIN_ZEROCOPY, 0, 1, 5, 9);
        assert_eq!(
            decode_extended_err(&b),
            Some(ErrKind::Zerocopy {
                lo: 5,
                hi: 9,
                copied: true
            })
        );
        let b = ext(0, ORIGIN_ZEROCOPY, 0, 0, 0, 0);
        assert_eq!(
            decode_extended_err(&b),
            Some(ErrKind::Zerocopy {
                lo: 0,
                hi: 0,
                copied: false
            })
        );
    }

    #[test]
    fn local_other_and_short_entries() {
        assert_eq!(
            decode_extended_err(&ext(90, ORIGIN_LOCAL, 0, 0, 1500, 0)),
            Some(ErrKind::Local { errno: 90 })
        );
        assert_eq!(
            decode_extended_err(&ext(0, 4, 0, 0, 0, 0)),
            Some(ErrKind::Other { origin: 4, errno: 0 })
        );
        assert_eq!(decode_extended_err(&[0; 15]), None);
    }

    #[test]
    fn sockaddrs_both_families_and_mapped_v4() {
        assert_eq!(
            decode_sockaddr(&sin([127, 0, 0, 1], 4000)),
            Some("127.0.0.1:4000".parse().unwrap())
        );
        let mut v6 = (libc::AF_INET6 as u16).to_ne_bytes().to_vec();
        v6.extend_from_slice(&4001u16.to_be_bytes());
        v6.extend_from_slice(&[0; 4]);
        let mapped: Ipv6Addr = "::ffff:10.1.2.3".parse().unwrap();
        v6.extend_from_slice(&mapped.octets());
        assert_eq!(decode_sockaddr(&v6), Some("10.1.2.3:4001".parse().unwrap()));
        assert_eq!(decode_sockaddr(&[1]), None);
        assert_eq!(decode_sockaddr(&(libc::AF_INET as u16).to_ne_bytes()), None);
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(b in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = decode_extended_err(&b);
            let _ = decode_sockaddr(&b);
        }
    }
}
