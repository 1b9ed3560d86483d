//! Counting on the wire: `capture` (an AF_PACKET mode, which leaves the
//! traffic where it was) runs on the reflector host's link and records
//! everything on it, both ways. The demo counts the DATA leaving the
//! reflector's group ports and checks that count against the reflector's
//! and the bots', so "no datagram lost" is seen on the wire, not only at
//! the endpoints; and it scans every frame, whole, for the run's marker
//! prefix, which every bot payload carries: sealed payloads must leave
//! none on the wire.

use crate::error::DemoError;
use reflector_proto::protocol::{Kind, Packet};
use std::net::Ipv4Addr;
use std::path::Path;

/// What a capture file held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireScan {
    /// Frames in the file.
    pub packets: u64,
    /// DATA datagrams from the reflector's group ports.
    pub data: u64,
    /// Occurrences of the marker prefix, in every frame scanned whole.
    pub markers: u64,
    /// Frames kept shorter than they were on the wire.
    pub truncated: u64,
}

/// Reads an Ethernet pcap file: its frames, the DATA from `src` on one of
/// `ports`, and where `marker` occurs anywhere in a frame (headers too).
pub fn scan(pcap: &Path, src: Ipv4Addr, ports: &[u16], marker: &[u8]) -> Result<WireScan, DemoError> {
    let f = std::fs::File::open(pcap).map_err(|e| format!("cannot open the wire capture {}: {e}", pcap.display()))?;
    let mut r = pcap_file::pcap::PcapReader::new(f)
        .map_err(|e| format!("the wire capture {} is not a pcap file: {e}", pcap.display()))?;
    let mut w = WireScan::default();
    while let Some(p) = r.next_packet() {
        let p = p.map_err(|e| format!("reading the wire capture {}: {e}", pcap.display()))?;
        w.packets += 1;
        if (p.data.len() as u64) < u64::from(p.orig_len) {
            w.truncated += 1;
        }
        if data_from(&p.data, src, ports) {
            w.data += 1;
        }
        w.markers += occurrences(&p.data, marker);
    }
    Ok(w)
}

/// How often `needle` occurs in `hay` (overlaps counted; none for an
/// empty needle).
pub fn occurrences(hay: &[u8], needle: &[u8]) -> u64 {
    if needle.is_empty() {
        return 0;
    }
    hay.windows(needle.len()).filter(|w| *w == needle).count() as u64
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
    }

    #[test]
    fn markers_are_found_anywhere_in_a_frame() {
        let m = [0x5e, 0xa1, 0xed, 0, 0xfe, 0xed, 0, 1];
        assert_eq!(occurrences(b"", &m), 0);
        assert_eq!(occurrences(&m, &m), 1);
        assert_eq!(occurrences(&m[..7], &m), 0);
        let mut f = frame([10, 0, 0, 2], 50000, &[1; 30]);
        assert_eq!(occurrences(&f, &m), 0);
        // In the payload, at its end, and across the headers alike.
        f.extend_from_slice(&m);
        f[3..11].copy_from_slice(&m);
        assert_eq!(occurrences(&f, &m), 2);
        assert_eq!(occurrences(b"aaaa", b"aa"), 3);
        assert_eq!(occurrences(b"abc", b""), 0);
    }

    #[test]
    fn a_pcap_file_is_scanned_whole() {
        use pcap_file::pcap::{PcapPacket, PcapWriter};
        use std::time::Duration;
        let m = *b"MARKER!!";
        let mut d = [0u8; 48];
        let n = emit(
            &Header {
                kind: Kind::Data,
                group: 4000,
                sender: 1,
                membership: 9,
                seq: 1,
            },
            &m,
            None,
            &mut d,
        )
        .unwrap();
        let src = Ipv4Addr::new(10, 0, 0, 1);
        let frames = [
            frame([10, 0, 0, 1], 4000, &d[..n]),
            frame([10, 0, 0, 2], 50000, b"nothing to see"),
            frame([10, 0, 0, 2], 50000, b"xxMARKER!!xx"),
        ];
        let path = std::env::temp_dir().join(format!("demo-wire-test-{}.pcap", std::process::id()));
        {
            let mut w = PcapWriter::new(std::fs::File::create(&path).unwrap()).unwrap();
            for (i, f) in frames.iter().enumerate() {
                // The last one kept shorter than it was.
                let orig = f.len() as u32 + if i == 2 { 10 } else { 0 };
                w.write_packet(&PcapPacket::new(Duration::from_millis(i as u64), orig, f))
                    .unwrap();
            }
        }
        let got = scan(&path, src, &[4000], &m);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            got.unwrap(),
            WireScan {
                packets: 3,
                data: 1,
                markers: 2,
                truncated: 1
            }
        );
    }
}
