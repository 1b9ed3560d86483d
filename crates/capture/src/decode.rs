//! One-line packet summaries in the style of `tcpdump -n`.
//!
//! Every field access goes through `get`, so truncated or malformed frames
//! produce a shorter summary ("truncated"), never a panic.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::filter::LinkType;

fn be16(b: &[u8], off: usize) -> Option<u16> {
    let s = b.get(off..off.checked_add(2)?)?;
    Some(u16::from_be_bytes([s[0], s[1]]))
}

/// Appends a summary of `data` (captured bytes of a frame that was
/// `wire_len` long) to `out`, without a trailing newline.
pub fn summarize(out: &mut String, link: LinkType, data: &[u8], wire_len: u32) {
    match link {
        LinkType::Ethernet => ethernet(out, data, wire_len),
        LinkType::RawIp => ip(out, data),
        LinkType::LinuxSll2 => match data.get(..20) {
            Some(h) => cooked(out, h, data.get(20..).unwrap_or(&[]), wire_len.saturating_sub(20)),
            None => {
                let _ = write!(out, "[truncated cooked header, {} bytes]", data.len());
            }
        },
    }
}

/// A packet of `-i any`: its interface and direction from the Linux cooked
/// v2 header `h`, as tcpdump prints them, then the packet by its protocol.
pub fn cooked(out: &mut String, h: &[u8], packet: &[u8], wire_len: u32) {
    let protocol = be16(h, 0).unwrap_or(0);
    let ifindex = h.get(4..8).map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let direction = match h.get(10) {
        Some(0) => "In",
        Some(1) => "B",
        Some(2) => "M",
        Some(3) => "P",
        Some(4) => "Out",
        _ => "?",
    };
    interface_name(out, ifindex);
    let _ = write!(out, " {direction:<3} ");
    match protocol {
        0x0800 | 0x86dd => ip(out, packet),
        0x0806 => arp(out, packet),
        t => {
            let _ = write!(out, "ethertype 0x{t:04x}, length {wire_len}");
        }
    }
}

/// Appends the interface's name (looked up once per index and thread), or
/// `if<index>`, padded as tcpdump pads it.
fn interface_name(out: &mut String, index: u32) {
    thread_local! {
        static NAMES: std::cell::RefCell<std::collections::HashMap<u32, String>> = Default::default();
    }
    NAMES.with(|n| {
        let mut names = n.borrow_mut();
        let name = names
            .entry(index)
            .or_insert_with(|| crate::sys::if_name(index).unwrap_or_else(|| format!("if{index}")));
        let _ = write!(out, "{name:<6}");
    });
}

fn ethernet(out: &mut String, data: &[u8], wire_len: u32) {
    let Some(mut ethertype) = be16(data, 12) else {
        let _ = write!(out, "[truncated ethernet frame, {} bytes]", data.len());
        return;
    };
    let mut off = 14;
    // Up to two VLAN tags (802.1Q / 802.1ad).
    for _ in 0..2 {
        if ethertype == 0x8100 || ethertype == 0x88a8 {
            let Some(tci) = be16(data, off) else {
                out.push_str("vlan [truncated]");
                return;
            };
            let _ = write!(out, "vlan {}, ", tci & 0x0fff);
            let Some(t) = be16(data, off + 2) else {
                out.push_str("[truncated]");
                return;
            };
            ethertype = t;
            off += 4;
        }
    }
    let rest = data.get(off..).unwrap_or(&[]);
    match ethertype {
        0x0800 | 0x86dd => ip(out, rest),
        0x0806 => arp(out, rest),
        t => {
            let _ = write!(out, "ethertype 0x{t:04x}, length {wire_len}");
        }
    }
}

fn arp(out: &mut String, d: &[u8]) {
    match (be16(d, 6), d.get(14..18), d.get(24..28)) {
        (Some(op), Some(spa), Some(tpa)) => {
            let s = Ipv4Addr::new(spa[0], spa[1], spa[2], spa[3]);
            let t = Ipv4Addr::new(tpa[0], tpa[1], tpa[2], tpa[3]);
            match op {
                1 => {
                    let _ = write!(out, "ARP, Request who-has {t} tell {s}");
                }
                2 => {
                    let _ = write!(out, "ARP, Reply {s} is-at ...");
                }
                o => {
                    let _ = write!(out, "ARP, op {o}");
                }
            }
        }
        _ => out.push_str("ARP [truncated]"),
    }
}

fn ip(out: &mut String, d: &[u8]) {
    match d.first().map(|b| b >> 4) {
        Some(4) => ipv4(out, d),
        Some(6) => ipv6(out, d),
        _ => out.push_str("[not IP or truncated]"),
    }
}

fn ipv4(out: &mut String, d: &[u8]) {
    let (Some(vihl), Some(total), Some(proto), Some(src), Some(dst)) =
        (d.first(), be16(d, 2), d.get(9), d.get(12..16), d.get(16..20))
    else {
        out.push_str("IP [truncated]");
        return;
    };
    let ihl = usize::from(vihl & 0x0f) * 4;
    let s = Ipv4Addr::new(src[0], src[1], src[2], src[3]);
    let t = Ipv4Addr::new(dst[0], dst[1], dst[2], dst[3]);
    let frag = be16(d, 6).unwrap_or(0) & 0x1fff;
    let payload_len = usize::from(total).saturating_sub(ihl);
    if ihl < 20 || frag != 0 {
        let _ = write!(out, "IP {s} > {t}: proto {proto} fragment, length {payload_len}");
        return;
    }
    l4(
        out,
        "IP",
        &s.to_string(),
        &t.to_string(),
        *proto,
        d.get(ihl..).unwrap_or(&[]),
        payload_len,
    );
}

fn ipv6(out: &mut String, d: &[u8]) {
    let (Some(plen), Some(next), Some(src), Some(dst)) = (be16(d, 4), d.get(6), d.get(8..24), d.get(24..40)) else {
        out.push_str("IP6 [truncated]");
        return;
    };
    let a = |b: &[u8]| {
        let mut x = [0u8; 16];
        x.copy_from_slice(b);
        Ipv6Addr::from(x).to_string()
    };
    l4(
        out,
        "IP6",
        &a(src),
        &a(dst),
        *next,
        d.get(40..).unwrap_or(&[]),
        usize::from(plen),
    );
}

fn l4(out: &mut String, fam: &str, s: &str, t: &str, proto: u8, d: &[u8], payload_len: usize) {
    match proto {
        17 => match (be16(d, 0), be16(d, 2), be16(d, 4)) {
            (Some(sp), Some(dp), Some(ulen)) => {
                let _ = write!(
                    out,
                    "{fam} {s}.{sp} > {t}.{dp}: UDP, length {}",
                    usize::from(ulen).saturating_sub(8)
                );
            }
            _ => {
                let _ = write!(out, "{fam} {s} > {t}: UDP [truncated]");
            }
        },
        6 => match (be16(d, 0), be16(d, 2), d.get(12), d.get(13)) {
            (Some(sp), Some(dp), Some(doff), Some(fl)) => {
                let hl = usize::from(doff >> 4) * 4;
                let mut flags = String::new();
                for (bit, c) in [(0x02, 'S'), (0x01, 'F'), (0x04, 'R'), (0x08, 'P'), (0x10, '.')] {
                    if fl & bit != 0 {
                        flags.push(c);
                    }
                }
                let _ = write!(
                    out,
                    "{fam} {s}.{sp} > {t}.{dp}: Flags [{flags}], length {}",
                    payload_len.saturating_sub(hl)
                );
            }
            _ => {
                let _ = write!(out, "{fam} {s} > {t}: TCP [truncated]");
            }
        },
        1 | 58 => {
            let kind = if proto == 1 { "ICMP" } else { "ICMP6" };
            let _ = write!(
                out,
                "{fam} {s} > {t}: {kind} type {}, length {payload_len}",
                d.first().copied().unwrap_or(0)
            );
        }
        p => {
            let _ = write!(out, "{fam} {s} > {t}: ip-proto-{p} {payload_len}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooked_packets_show_interface_and_direction() {
        let mut h = [0u8; 20];
        h[0..2].copy_from_slice(&[0x08, 0x06]); // ARP: printed by protocol
        h[4..8].copy_from_slice(&0xfff0u32.to_be_bytes()); // no such interface
        h[10] = 4;
        let mut s = String::new();
        cooked(&mut s, &h, &[0u8; 8], 8);
        assert!(s.starts_with("if65520 Out "), "{s}");
        assert!(s.contains("ARP"), "{s}");
        // Read back from a file: the header is in the data; a short one is named.
        let mut s = String::new();
        summarize(&mut s, LinkType::LinuxSll2, &h[..12], 12);
        assert!(s.contains("truncated cooked header"), "{s}");
    }
    use crate::gen::{build_udp_frame, FrameSpec};

    fn spec() -> FrameSpec {
        FrameSpec {
            vlan: None,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: "10.1.0.1:4000".parse().expect("addr"),
            dst: "10.1.0.2:5000".parse().expect("addr"),
            frame_len: 64,
        }
    }

    #[test]
    fn udp_summary() {
        let f = build_udp_frame(&spec(), 7);
        let mut s = String::new();
        summarize(&mut s, LinkType::Ethernet, &f, f.len() as u32);
        assert_eq!(s, "IP 10.1.0.1.4000 > 10.1.0.2.5000: UDP, length 22");
    }

    #[test]
    fn every_truncation_is_handled() {
        let f = build_udp_frame(&spec(), 7);
        for n in 0..f.len() {
            let mut s = String::new();
            summarize(&mut s, LinkType::Ethernet, &f[..n], f.len() as u32);
            assert!(!s.is_empty());
            summarize(&mut s, LinkType::RawIp, &f[..n], f.len() as u32);
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic xorshift instead of a fuzzer dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 80) as usize;
            let mut buf = vec![0u8; len];
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (x >> ((i % 8) * 8)) as u8 ^ i as u8;
            }
            // Bias towards interesting ethertypes and IP versions.
            if len > 14 {
                buf[12] = [0x08, 0x86, 0x81][(x % 3) as usize];
                buf[13] = [0x00, 0xdd, 0x00][(x % 3) as usize];
                buf[14] = [0x45, 0x60, 0x4f][((x >> 3) % 3) as usize];
            }
            let mut s = String::new();
            summarize(&mut s, LinkType::Ethernet, &buf, len as u32);
            summarize(&mut s, LinkType::RawIp, &buf, len as u32);
        }
    }
}
