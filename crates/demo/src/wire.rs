//! Counting on the wire: `capture` (an AF_PACKET mode, which leaves the
//! traffic where it was) runs on the reflector host's link and records the
//! datagrams leaving the reflector's group ports; the demo counts the DATA
//! among them and checks that count against the reflector's and the bots',
//! so "no datagram lost" is seen on the wire, not only at the endpoints.

use crate::error::DemoError;
use reflector_proto::protocol::{Kind, Packet};
use std::net::Ipv4Addr;
use std::path::Path;

/// The filter for what leaves the reflector's group ports.
pub fn filter(reflector: Ipv4Addr, ports: &[u16]) -> String {
    let (lo, hi) = (
        ports.iter().min().copied().unwrap_or(0),
        ports.iter().max().copied().unwrap_or(0),
    );
    format!("udp and src host {reflector} and src portrange {lo}-{hi}")
}

/// DATA datagrams in an Ethernet pcap file from `src` on one of `ports`.
pub fn count_data(pcap: &Path, src: Ipv4Addr, ports: &[u16]) -> Result<u64, DemoError> {
    let f = std::fs::File::open(pcap).map_err(|e| format!("cannot open the wire capture {}: {e}", pcap.display()))?;
    let mut r = pcap_file::pcap::PcapReader::new(f)
        .map_err(|e| format!("the wire capture {} is not a pcap file: {e}", pcap.display()))?;
    let mut n = 0;
    while let Some(p) = r.next_packet() {
        let p = p.map_err(|e| format!("reading the wire capture {}: {e}", pcap.display()))?;
        if data_from(&p.data, src, ports) {
            n += 1;
        }
    }
    Ok(n)
}

/// Whether an Ethernet frame is an IPv4/UDP datagram from `src` on one of
/// `ports` carrying a well-formed DATA datagram of our protocol.
pub fn data_from(frame: &[u8], src: Ipv4Addr, ports: &[u16]) -> bool {
    let Some(ip) = frame.get(14..) else {
        return false;
    };
    if frame[12..14] != [0x08, 0x00] || ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 17 {
        return false;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]) != src {
        return false;
    }
    let Some(udp) = ip.get(ihl..) else {
        return false;
    };
    if udp.len() < 8 || !ports.contains(&u16::from_be_bytes([udp[0], udp[1]])) {
        return false;
    }
    Packet::parse(&udp[8..]).is_ok_and(|p| p.kind() == Kind::Data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::protocol::{emit, Header};

    fn frame(src: [u8; 4], sport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 17, 0, 0];
        ip.extend_from_slice(&src);
        ip.extend_from_slice(&[10, 0, 0, 9]);
        f.extend(ip);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&[0x30, 0x39, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn only_data_from_the_reflector_ports_counts() {
        let mut d = [0u8; 40];
        let n = emit(
            &Header {
                kind: Kind::Data,
                group: 4000,
                sender: 1,
                membership: 9,
                seq: 1,
            },
            &[7; 8],
            None,
            &mut d,
        )
        .unwrap();
        let src = Ipv4Addr::new(10, 0, 0, 1);
        let ports = [4000, 4001];
        assert!(data_from(&frame([10, 0, 0, 1], 4000, &d[..n]), src, &ports));
        assert!(!data_from(&frame([10, 0, 0, 2], 4000, &d[..n]), src, &ports));
        assert!(!data_from(&frame([10, 0, 0, 1], 4999, &d[..n]), src, &ports));
        assert!(!data_from(&frame([10, 0, 0, 1], 4000, b"not ours"), src, &ports));
        assert!(!data_from(&[0u8; 20], src, &ports));
        assert_eq!(
            filter(src, &[4001, 4000, 4015]),
            "udp and src host 10.0.0.1 and src portrange 4000-4015"
        );
    }
}
