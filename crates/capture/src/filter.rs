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
}

impl LinkType {
    /// The pcap LINKTYPE_ number.
    pub fn pcap_number(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::RawIp => 101,
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
        // pcap_open_dead takes a DLT_ value, which differs from the file's
        // LINKTYPE_ number for raw IP (DLT_RAW is 12 on Linux, LINKTYPE_RAW 101).
        let dlt = match link {
            LinkType::Ethernet => 1,
            LinkType::RawIp => 12,
        };
        let dead = pcap::Capture::dead(pcap::Linktype(dlt))
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
    Ok(cap_snaplen(out, snaplen))
}

/// Compiles `expr` for running in user space on whole frames (the `xdp`
/// mode): libpcap's own interpreter runs it, and VLAN tests read the tag
/// in the frame, where an AF_XDP socket sees it.
pub fn compile_user(expr: &str, link: LinkType) -> Result<pcap::BpfProgram> {
    let dlt = match link {
        LinkType::Ethernet => 1,
        LinkType::RawIp => 12,
    };
    let dead = pcap::Capture::dead(pcap::Linktype(dlt)).map_err(|e| CaptureError::Filter {
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
