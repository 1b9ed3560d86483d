//! Output files: pcap and pcapng record encoding (pure), optional
//! compression, and a file that stays readable while it is written.
//!
//! The named file is written from the start and made readable up to a sync
//! point after every batch (uncompressed), at least once a second (gzip
//! members and zstd frames end there) and, packet-buffered, after every
//! packet: a crash or `kill -9` leaves a file that reads up to its last sync
//! point. Special files (`/dev/null`, FIFOs) and `-` (stdout) work the same.
//!
//! The record encoding is here; the file, its compression, sync points and
//! rotation are in `file`.

mod file;

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use byteorder_slice::LittleEndian;
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::interface_statistics::{InterfaceStatisticsBlock, InterfaceStatisticsOption};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::Block;
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::filter::LinkType;
use crate::source::PacketView;

pub use file::{FileOutput, Rotation, SYNC_EVERY};

/// File format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Pcap,
    PcapNg,
}

/// Compression of the written stream (the paper's packzip load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    /// gzip container, deflate at level 0..=9.
    Zlib(u32),
    /// zstd at level 1..=22 (0 means zstd's default).
    Zstd(i32),
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (alg, level) = s.split_once(':').unwrap_or((s, ""));
        let bad = || format!("bad compression '{s}': use zlib:LEVEL (0-9) or zstd:LEVEL (1-22)");
        match alg {
            "none" if level.is_empty() => Ok(Compression::None),
            "zlib" | "gzip" => {
                let l: u32 = if level.is_empty() {
                    6
                } else {
                    level.parse().map_err(|_| bad())?
                };
                if l > 9 {
                    return Err(bad());
                }
                Ok(Compression::Zlib(l))
            }
            "zstd" => {
                let l: i32 = if level.is_empty() {
                    3
                } else {
                    level.parse().map_err(|_| bad())?
                };
                if !(0..=22).contains(&l) {
                    return Err(bad());
                }
                Ok(Compression::Zstd(l))
            }
            _ => Err(bad()),
        }
    }
}

/// How records are encoded: format, link type, snaplen, timestamp precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub format: Format,
    pub link: LinkType,
    pub snaplen: u32,
    pub nano: bool,
}

impl Encoding {
    fn datalink(&self) -> DataLink {
        DataLink::from(self.link.pcap_number())
    }

    fn ts_res(&self) -> TsResolution {
        if self.nano {
            TsResolution::NanoSecond
        } else {
            TsResolution::MicroSecond
        }
    }

    /// File preamble: the pcap global header, or pcapng SHB + IDB.
    pub fn header(&self, ifname: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        match self.format {
            Format::Pcap => {
                let h = PcapHeader {
                    version_major: 2,
                    version_minor: 4,
                    ts_correction: 0,
                    ts_accuracy: 0,
                    snaplen: self.snaplen,
                    datalink: self.datalink(),
                    ts_resolution: self.ts_res(),
                    endianness: Endianness::Little,
                };
                // Writing into a Vec cannot fail.
                let _ = h.write_to(&mut out);
            }
            Format::PcapNg => {
                let shb = SectionHeaderBlock {
                    endianness: Endianness::Little,
                    major_version: 1,
                    minor_version: 0,
                    section_length: -1,
                    options: vec![SectionHeaderOption::UserApplication(Cow::Borrowed("capture"))],
                };
                let idb = InterfaceDescriptionBlock {
                    linktype: self.datalink(),
                    snaplen: self.snaplen,
                    options: vec![
                        InterfaceDescriptionOption::IfName(Cow::Owned(ifname.to_string())),
                        InterfaceDescriptionOption::IfTsResol(if self.nano { 9 } else { 6 }),
                    ],
                };
                let _ = Block::SectionHeader(shb).write_to::<LittleEndian, _>(&mut out);
                let _ = Block::InterfaceDescription(idb).write_to::<LittleEndian, _>(&mut out);
            }
        }
        out
    }

    /// Appends one packet record to `out`. A VLAN tag the kernel stripped is
    /// put back into the frame, as on the wire; `scratch` avoids an
    /// allocation per tagged packet.
    pub fn record(&self, out: &mut Vec<u8>, p: &PacketView<'_>, scratch: &mut Vec<u8>) {
        let (data, wire) = match (p.cooked, p.vlan, self.link) {
            // `-i any`: the cooked header in front of the packet.
            (Some(h), _, _) => {
                scratch.clear();
                scratch.extend_from_slice(&h);
                scratch.extend_from_slice(p.data);
                (&scratch[..], p.wire_len + h.len() as u32)
            }
            (None, Some((tpid, tci)), LinkType::Ethernet) if p.data.len() >= 12 => {
                scratch.clear();
                scratch.extend_from_slice(&p.data[..12]);
                scratch.extend_from_slice(&tpid.to_be_bytes());
                scratch.extend_from_slice(&tci.to_be_bytes());
                scratch.extend_from_slice(&p.data[12..]);
                (&scratch[..], p.wire_len + 4)
            }
            _ => (p.data, p.wire_len),
        };
        let caplen = data.len().min(self.snaplen as usize);
        let data = &data[..caplen];
        let wire = wire.max(caplen as u32);
        let ts = Duration::from_nanos(p.ts_ns);
        match self.format {
            Format::Pcap => {
                let pkt = PcapPacket::new(ts, wire, data);
                // Cannot fail: caplen <= snaplen and caplen <= wire by construction, and
                // timestamps fit u32 seconds until 2106.
                let _ = pkt.write_to::<_, LittleEndian>(out, self.ts_res(), self.snaplen);
            }
            Format::PcapNg => {
                // The EPB timestamp is in units of the IDB's if_tsresol.
                let units = if self.nano { p.ts_ns } else { p.ts_ns / 1000 };
                let epb = EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: Duration::from_nanos(units),
                    original_len: wire,
                    data: Cow::Borrowed(data),
                    options: vec![],
                };
                let _ = Block::EnhancedPacket(epb).write_to::<LittleEndian, _>(out);
            }
        }
    }

    /// pcapng footer: an Interface Statistics Block with the final counters
    /// (pcap has no place for them).
    pub fn footer(&self, now_ns: u64, stats: &FooterStats) -> Vec<u8> {
        let mut out = Vec::new();
        if self.format == Format::PcapNg {
            let units = if self.nano { now_ns } else { now_ns / 1000 };
            let isb = InterfaceStatisticsBlock {
                interface_id: 0,
                // pcapng stores a 64-bit timestamp as two 32-bit words, the
                // high one first, each in the section's byte order; the crate
                // writes the field as one little-endian u64 (low word first),
                // so swap the halves to get the spec's layout.
                timestamp: units.rotate_left(32),
                options: vec![
                    InterfaceStatisticsOption::IsbFilterAccept(stats.filter_accept),
                    InterfaceStatisticsOption::IsbOsDrop(stats.os_drop),
                    InterfaceStatisticsOption::IsbUsrDeliv(stats.delivered),
                ],
            };
            let _ = Block::InterfaceStatistics(isb).write_to::<LittleEndian, _>(&mut out);
        }
        out
    }
}

/// Counters written into the pcapng footer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FooterStats {
    pub filter_accept: u64,
    pub os_drop: u64,
    pub delivered: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    use pcap_file::pcap::PcapReader;
    use pcap_file::pcapng::PcapNgReader;

    fn pkt(data: &[u8], ts_ns: u64) -> PacketView<'_> {
        PacketView {
            ts_ns,
            wire_len: data.len() as u32 + 10,
            data,
            vlan: None,
            cooked: None,
        }
    }

    pub(super) fn enc(format: Format, nano: bool) -> Encoding {
        Encoding {
            format,
            link: LinkType::Ethernet,
            snaplen: 65535,
            nano,
        }
    }

    #[test]
    fn pcap_round_trip() {
        for nano in [false, true] {
            let e = enc(Format::Pcap, nano);
            let mut buf = e.header("eth0");
            let mut scratch = Vec::new();
            let data: Vec<u8> = (0..60u8).collect();
            e.record(&mut buf, &pkt(&data, 1_700_000_000_123_456_789), &mut scratch);
            e.record(&mut buf, &pkt(&data[..20], 1_700_000_001_000_000_000), &mut scratch);
            let mut r = PcapReader::new(&buf[..]).expect("header");
            let p1 = r.next_packet().expect("one").expect("valid");
            assert_eq!(&p1.data[..], &data[..]);
            assert_eq!(p1.orig_len, 70);
            let want = if nano { 123_456_789 } else { 123_456_000 };
            assert_eq!(p1.timestamp, Duration::new(1_700_000_000, want));
            let p2 = r.next_packet().expect("two").expect("valid");
            assert_eq!(p2.data.len(), 20);
            assert!(r.next_packet().is_none());
        }
    }

    #[test]
    fn statistics_block_timestamp_is_high_word_first() {
        // pcapng: Timestamp (High), then Timestamp (Low), 32 bits each.
        let e = enc(Format::PcapNg, false);
        let now_ns = 1_764_000_000_123_456_000u64; // late 2025
        let isb = e.footer(now_ns, &FooterStats::default());
        // Block type, total length, interface id (32 bits each), then the timestamp.
        assert_eq!(u32::from_le_bytes(isb[0..4].try_into().unwrap()), 5);
        let high = u32::from_le_bytes(isb[12..16].try_into().unwrap()) as u64;
        let low = u32::from_le_bytes(isb[16..20].try_into().unwrap()) as u64;
        assert_eq!((high << 32) | low, now_ns / 1000);
    }

    #[test]
    fn pcapng_round_trip_with_footer() {
        let e = enc(Format::PcapNg, false);
        let mut buf = e.header("veth0");
        let mut scratch = Vec::new();
        let data = [7u8; 61];
        e.record(&mut buf, &pkt(&data, 5_000_001_000), &mut scratch);
        buf.extend(e.footer(
            6_000_000_000,
            &FooterStats {
                filter_accept: 3,
                os_drop: 2,
                delivered: 1,
            },
        ));
        let mut r = PcapNgReader::new(&buf[..]).expect("shb");
        let mut epbs = 0;
        let mut isb = false;
        while let Some(b) = r.next_block() {
            match b.expect("valid block") {
                Block::EnhancedPacket(p) => {
                    epbs += 1;
                    assert_eq!(&p.data[..], &data[..]);
                    assert_eq!(p.original_len, 71);
                }
                Block::InterfaceStatistics(s) => {
                    isb = true;
                    assert!(s.options.contains(&InterfaceStatisticsOption::IsbOsDrop(2)));
                }
                _ => {}
            }
        }
        assert_eq!(epbs, 1);
        assert!(isb);
    }

    #[test]
    fn vlan_tag_is_reinserted_and_snaplen_applied() {
        let mut e = enc(Format::Pcap, false);
        e.snaplen = 16;
        let mut buf = Vec::new();
        let mut scratch = Vec::new();
        let data: Vec<u8> = (0..40u8).collect();
        let mut p = pkt(&data, 0);
        p.vlan = Some((0x8100, 0x0123));
        e.record(&mut buf, &p, &mut scratch);
        // 16-byte record header, then 16 bytes of frame.
        assert_eq!(buf.len(), 32);
        assert_eq!(&buf[16 + 12..16 + 16], &[0x81, 0x00, 0x01, 0x23]);
        // incl_len 16, orig_len = 50 + 4.
        assert_eq!(u32::from_le_bytes(buf[8..12].try_into().expect("4")), 16);
        assert_eq!(u32::from_le_bytes(buf[12..16].try_into().expect("4")), 54);
    }

    #[test]
    fn compression_parses() {
        assert_eq!("zlib:0".parse(), Ok(Compression::Zlib(0)));
        assert_eq!("zstd:19".parse(), Ok(Compression::Zstd(19)));
        assert_eq!("none".parse(), Ok(Compression::None));
        assert!("zlib:10".parse::<Compression>().is_err());
        assert!("lz4:1".parse::<Compression>().is_err());
    }
}
