//! tcpdump filter expressions, compiled by libpcap into classic BPF.

use crate::error::{CaptureError, Result};
use crate::sys::BpfInsn;

/// Link-layer type of the frames a socket sees (decides how libpcap
/// compiles a filter and what the pcap header says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkType {
    /// Ethernet framing (also Linux loopback).
    Ethernet,
    /// Bare IP packets (tun devices and other ARPHRD_NONE interfaces).
    RawIp,
    /// Linux cooked capture v2 (`-i any`): a 20-byte header made from the
    /// packet socket's address (protocol, interface index, hardware type,
    /// packet type, link-layer address), then the network-layer packet.
    LinuxSll2,
}

impl LinkType {
    /// The pcap LINKTYPE_ number.
    pub fn pcap_number(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::RawIp => 101,
            LinkType::LinuxSll2 => 276,
        }
    }

    /// libpcap's DLT_ number (what `pcap_open_dead` takes).
    pub fn dlt(self) -> i32 {
        match self {
            LinkType::Ethernet => 1,
            // DLT_RAW is 12 on Linux; LINKTYPE_RAW (in files) is 101.
            LinkType::RawIp => 12,
            LinkType::LinuxSll2 => 276,
        }
    }

    /// From the ARPHRD_ number in /sys/class/net/IF/type.
    pub fn from_arphrd(t: u32) -> Option<Self> {
        match t {
            1 | 772 => Some(LinkType::Ethernet),
            65534 | 519 => Some(LinkType::RawIp),
            _ => None,
        }
    }
}

const BPF_RET_K: u16 = 0x06;

/// Whether `expr` tests VLAN tags (the `vlan` primitive).
fn uses_vlan(expr: &str) -> bool {
    expr.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| w == "vlan")
}

/// Compiles `expr` with libpcap's compiler (optimised) for `link` on
/// interface `iface`, and caps every non-zero accept value at `snaplen` so
/// the kernel copies no more than that into the socket.
///
/// On Linux the kernel takes a received frame's 802.1Q tag out of the
/// frame into its metadata before a packet socket's filter runs, so `vlan`
/// must test the metadata (the kernel's `SKF_AD_VLAN_TAG*` loads), not
/// bytes 12-13. libpcap compiles it that way only for a live capture
/// handle, so an expression with `vlan` is compiled on a live handle of
/// the interface (opened for that and closed again); every other one on a
/// dead handle, which compiles it exactly the same.
pub fn compile(iface: &str, expr: &str, link: LinkType, snaplen: u32) -> Result<Vec<BpfInsn>> {
    let err = |message: String| CaptureError::Filter {
        expr: expr.to_string(),
        message,
    };
    let pcap_message = |e: pcap::Error| match e {
        pcap::Error::PcapError(m) => m,
        other => other.to_string(),
    };
    let prog = if uses_vlan(expr) && link == LinkType::Ethernet {
        let live = pcap::Capture::from_device(iface)
            .and_then(|c| c.snaplen(snaplen as i32).buffer_size(64 << 10).open())
            .map_err(|e| err(format!("libpcap could not open {iface} to compile a VLAN filter: {e}")))?;
        live.compile(expr, true).map_err(|e| err(pcap_message(e)))?
    } else {
        let dead = pcap::Capture::dead(pcap::Linktype(link.dlt()))
            .map_err(|e| err(format!("libpcap could not open a compiler handle: {e}")))?;
        dead.compile(expr, true).map_err(|e| err(pcap_message(e)))?
    };
    let mut out = Vec::with_capacity(prog.get_instructions().len());
    for ins in prog.get_instructions() {
        // The pcap crate exposes instructions only through Display ("code jt jf k"),
        // which avoids any reinterpretation of its private layout.
        let text = ins.to_string();
        let insn = parse_insn(&text).ok_or_else(|| CaptureError::Filter {
            expr: expr.to_string(),
            message: format!("unexpected instruction text from libpcap: {text}"),
        })?;
        out.push(insn);
    }
    if link == LinkType::LinuxSll2 {
        out = cooked_for_kernel(out).map_err(|message| CaptureError::Filter {
            expr: expr.to_string(),
            message,
        })?;
    }
    Ok(cap_snaplen(out, snaplen))
}

/// Length of the Linux cooked v2 header.
pub const SLL2_LEN: u32 = 20;

/// A filter compiled for the cooked link type reads the 20-byte header
/// libpcap puts in front of each packet, but the kernel runs it on the
/// packet itself (a datagram packet socket has no link header): loads past
/// the header move back by its length, and loads of the header's fields
/// become the kernel's ancillary loads of the same values (protocol,
/// interface index, hardware type, packet type), as libpcap does for its
/// own cooked captures. A filter that reads any other header byte (the
/// link-layer address) cannot run in the kernel and is refused.
pub fn cooked_for_kernel(mut prog: Vec<BpfInsn>) -> std::result::Result<Vec<BpfInsn>, String> {
    const CLASS_LD: u16 = 0x00;
    const CLASS_LDX: u16 = 0x01;
    const MODE_ABS: u16 = 0x20;
    const MODE_IND: u16 = 0x40;
    const MODE_MSH: u16 = 0xa0;
    const SKF_AD_OFF: i32 = -0x1000;
    for i in &mut prog {
        let class = i.code & 0x07;
        let mode = i.code & 0xe0;
        if !(class == CLASS_LD || class == CLASS_LDX) || !matches!(mode, MODE_ABS | MODE_IND | MODE_MSH) {
            continue;
        }
        if i.k >= SLL2_LEN {
            i.k -= SLL2_LEN;
            continue;
        }
        let ancillary = match (mode, i.k) {
            (MODE_ABS, 0) => 0,  // SKF_AD_PROTOCOL
            (MODE_ABS, 4) => 8,  // SKF_AD_IFINDEX
            (MODE_ABS, 8) => 28, // SKF_AD_HATYPE
            (MODE_ABS, 10) => 4, // SKF_AD_PKTTYPE
            _ => {
                return Err(format!(
                    "on -i any the filter reads byte {} of the cooked header, which the kernel cannot \
                     test (it can test the protocol, interface, hardware type and packet type)",
                    i.k
                ))
            }
        };
        i.k = (SKF_AD_OFF + ancillary) as u32;
    }
    Ok(prog)
}

/// Compiles `expr` for running in user space on whole frames (the `xdp`
/// mode): libpcap's own interpreter runs it, and VLAN tests read the tag
/// in the frame, where an AF_XDP socket sees it.
pub fn compile_user(expr: &str, link: LinkType) -> Result<pcap::BpfProgram> {
    let dead = pcap::Capture::dead(pcap::Linktype(link.dlt())).map_err(|e| CaptureError::Filter {
        expr: expr.to_string(),
        message: format!("libpcap could not open a compiler handle: {e}"),
    })?;
    dead.compile(expr, true).map_err(|e| CaptureError::Filter {
        expr: expr.to_string(),
        message: match e {
            pcap::Error::PcapError(m) => m,
            other => other.to_string(),
        },
    })
}

/// A filter that accepts everything, truncated to `snaplen`.
pub fn accept_all(snaplen: u32) -> Vec<BpfInsn> {
    vec![BpfInsn {
        code: BPF_RET_K,
        jt: 0,
        jf: 0,
        k: snaplen,
    }]
}

fn parse_insn(s: &str) -> Option<BpfInsn> {
    let mut it = s.split_whitespace();
    let insn = BpfInsn {
        code: it.next()?.parse().ok()?,
        jt: it.next()?.parse().ok()?,
        jf: it.next()?.parse().ok()?,
        k: it.next()?.parse().ok()?,
    };
    it.next().is_none().then_some(insn)
}

fn cap_snaplen(mut prog: Vec<BpfInsn>, snaplen: u32) -> Vec<BpfInsn> {
    for i in &mut prog {
        if i.code == BPF_RET_K && i.k != 0 {
            i.k = i.k.min(snaplen);
        }
    }
    prog
}

/// `-Q out`: the program `prog` behind a check that the packet is one this
/// host sends (the kernel's packet type, read with the `SKF_AD_PKTTYPE`
/// ancillary load, is PACKET_OUTGOING); other packets are refused before
/// `prog` runs. Classic BPF jumps are relative, so `prog` is unchanged
/// behind the prefix. An empty `prog` (no filter) accepts `snaplen` bytes.
pub fn outgoing_only(prog: Vec<BpfInsn>, snaplen: u32) -> Vec<BpfInsn> {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const SKF_AD_OFF: i32 = -0x1000;
    const SKF_AD_PKTTYPE: i32 = 4;
    const PACKET_OUTGOING: u32 = 4;
    let mut out = vec![
        BpfInsn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: (SKF_AD_OFF + SKF_AD_PKTTYPE) as u32,
        },
        // Outgoing: skip the refusal; otherwise fall into it.
        BpfInsn {
            code: JEQ_K,
            jt: 1,
            jf: 0,
            k: PACKET_OUTGOING,
        },
        BpfInsn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: 0,
        },
    ];
    if prog.is_empty() {
        out.push(BpfInsn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k: snaplen,
        });
    } else {
        out.extend(prog);
    }
    out
}

/// `-i any` sees a packet sent over `lo` twice, as sent and as received;
/// libpcap drops the sent copy, and so does this prefix in the kernel:
/// packets of type PACKET_OUTGOING on interface `lo_index` are refused
/// before `prog` runs.
pub fn skip_loopback_outgoing(prog: Vec<BpfInsn>, lo_index: u32) -> Vec<BpfInsn> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const SKF_AD_OFF: i32 = -0x1000;
    let insn = |code, jt, jf, k| BpfInsn { code, jt, jf, k };
    let mut out = vec![
        insn(LD_W_ABS, 0, 0, (SKF_AD_OFF + 4) as u32), // packet type
        insn(JEQ_K, 0, 3, 4),                          // outgoing? else to prog
        insn(LD_W_ABS, 0, 0, (SKF_AD_OFF + 8) as u32), // interface index
        insn(JEQ_K, 0, 1, lo_index),                   // lo? else to prog
        insn(BPF_RET_K, 0, 0, 0),
    ];
    out.extend(prog);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_only_checks_the_packet_type_before_the_filter() {
        let prog = accept_all(100);
        let q = outgoing_only(prog.clone(), 100);
        assert_eq!(q.len(), prog.len() + 3);
        assert_eq!((q[0].code, q[0].k), (0x20, 0xffff_f004), "ld the packet type");
        assert_eq!(
            (q[1].code, q[1].jt, q[1].jf, q[1].k),
            (0x15, 1, 0, 4),
            "outgoing skips the refusal"
        );
        assert_eq!((q[2].code, q[2].k), (0x06, 0), "ret 0: refused");
        assert_eq!(&q[3..], &prog[..]);
        assert_eq!(outgoing_only(vec![], 64)[3].k, 64, "no filter: accept snaplen");
    }

    #[test]
    fn loopback_outgoing_prefix_jumps_to_the_filter_otherwise() {
        let prog = accept_all(100);
        let q = skip_loopback_outgoing(prog.clone(), 1);
        assert_eq!(q.len(), 6);
        // Not outgoing: insn 1 jumps 3 ahead, to the filter (index 5).
        assert_eq!((q[1].jt, q[1].jf, 1 + 1 + q[1].jf as usize), (0, 3, 5));
        // Outgoing, not lo: insn 3 jumps 1 ahead, to the filter.
        assert_eq!((q[3].k, 3 + 1 + q[3].jf as usize), (1, 5));
        assert_eq!((q[4].code, q[4].k), (BPF_RET_K, 0));
        assert_eq!(&q[5..], &prog[..]);
    }

    #[test]
    fn vlan_is_found_as_a_word_only() {
        assert!(uses_vlan("vlan"));
        assert!(uses_vlan("vlan 100 and udp"));
        assert!(uses_vlan("(vlan)"));
        assert!(!uses_vlan("udp port 9"));
        assert!(!uses_vlan("host vlanhost"));
    }

    #[test]
    fn parses_display_form() {
        assert_eq!(
            parse_insn("6 0 0 262144"),
            Some(BpfInsn {
                code: 6,
                jt: 0,
                jf: 0,
                k: 262144
            })
        );
        assert_eq!(parse_insn("6 0 0"), None);
        assert_eq!(parse_insn("6 0 0 1 2"), None);
        assert_eq!(parse_insn("x 0 0 1"), None);
    }

    #[test]
    fn compiles_udp_and_caps_snaplen() {
        let p = compile("lo", "udp port 9", LinkType::Ethernet, 96).expect("valid filter");
        assert!(p.len() > 2);
        let rets: Vec<u32> = p.iter().filter(|i| i.code == BPF_RET_K).map(|i| i.k).collect();
        assert!(rets.contains(&96) && rets.contains(&0), "{rets:?}");
    }

    #[test]
    fn cooked_filters_read_the_packet_and_the_kernels_metadata() {
        // `udp`: the protocol (a header field) and the IP protocol byte.
        let p = compile("lo", "udp", LinkType::LinuxSll2, 65535).expect("cooked filter");
        let loads: Vec<u32> = p.iter().filter(|i| i.code & 0xe7 == 0x20).map(|i| i.k).collect();
        assert!(loads.contains(&0xffff_f000), "protocol as SKF_AD_PROTOCOL: {loads:?}");
        assert!(
            loads.contains(&9),
            "the IPv4 protocol byte, 20 bytes earlier: {loads:?}"
        );
        // `inbound` tests the packet type.
        let p = compile("lo", "inbound", LinkType::LinuxSll2, 65535).expect("cooked filter");
        assert!(p.iter().any(|i| i.k == 0xffff_f004), "{p:?}");
        // A port behind the variable IP header length: the MSH load moves too.
        let p = compile("lo", "udp port 53", LinkType::LinuxSll2, 65535).expect("cooked filter");
        assert!(p.iter().filter(|i| i.code == 0xb1).all(|i| i.k == 0), "{p:?}");
        // The link-layer address (bytes 12-19) has no kernel equivalent.
        let addr_load = vec![
            BpfInsn {
                code: 0x30, // ld byte at absolute offset
                jt: 0,
                jf: 0,
                k: 12,
            },
            accept_all(64)[0],
        ];
        assert!(cooked_for_kernel(addr_load).unwrap_err().contains("byte 12"));
    }

    #[test]
    fn compiles_for_raw_ip_links() {
        let p = compile("lo", "icmp", LinkType::RawIp, 65535).expect("raw-IP filter");
        assert!(p.len() > 1);
    }

    #[test]
    fn bad_filter_carries_libpcap_message() {
        let e = compile("lo", "udp prot 9", LinkType::Ethernet, 65535).unwrap_err();
        let s = e.to_string();
        assert!(s.contains("udp prot 9") && s.contains("syntax error"), "{s}");
    }
}
