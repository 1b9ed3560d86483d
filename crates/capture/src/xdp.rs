//! The `xdp` mode's kernel side: the XDP program (`ebpf/xsk.bpf.c`) that
//! hands every received frame of a monitor interface to the AF_XDP socket of
//! its queue, its attachment, and the checks that keep it off interfaces
//! that carry a host's own traffic.
//!
//! The program is attached through a BPF link held by this process's file
//! descriptor and never pinned: when the process ends, however it ends
//! (`kill -9` included), the kernel closes the link and the interface goes
//! back to its stack. Only a program attached the legacy way (netlink, which
//! the loader falls back to on kernels without XDP links) outlives its
//! process; the next start finds ours by name and removes it.

use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::process::Command;

use aya::maps::{MapData, PerCpuArray, XskMap};
use aya::programs::{Xdp, XdpMode};
use aya::Ebpf;

use crate::error::{CaptureError, Result};
use crate::sys::xsk::XskSocket;

/// The program's name, as the kernel and `ip link` show it.
pub const PROGRAM: &str = "capture_xsk";
/// The header the program puts in front of each frame: magic, pad, TAI ns.
pub const META_LEN: usize = 16;
const META_MAGIC: u32 = 0x4350_5458;
/// UMEM buffer size: half a page, which holds a 1500-byte-MTU frame after
/// the kernel's 256-byte headroom (twice the buffers of page-sized ones
/// for the same memory); a page for larger MTUs.
pub fn chunk_for_mtu(mtu: u32) -> Option<u32> {
    // Ethernet header and one VLAN tag on top of the MTU.
    [2048u32, 4096].into_iter().find(|c| mtu + 18 <= c - 256)
}
/// The program's map sizes (`CAPTURE_MAX_QUEUES`).
pub const MAX_QUEUES: u32 = 256;

#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

/// The compiled program (built by `build.rs` with clang), 8-byte aligned
/// as the ELF parser wants it.
fn object() -> &'static [u8] {
    static OBJ: &Aligned<[u8]> = &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/xsk.bpf.o")));
    &OBJ.0
}

fn unsupported(reason: String) -> CaptureError {
    CaptureError::ModeUnsupported { mode: "xdp", reason }
}

/// The loaded program and its maps; attached once every socket is in the
/// map. Dropping it detaches the program.
pub struct XdpProgram {
    ebpf: Ebpf,
    xsks: XskMap<MapData>,
    counts: PerCpuArray<MapData, [u64; 2]>,
    attached: Option<&'static str>,
}

impl std::fmt::Debug for XdpProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpProgram").field("attached", &self.attached).finish()
    }
}

impl XdpProgram {
    /// Loads the program through the verifier (not attached yet).
    pub fn load() -> Result<XdpProgram> {
        let mut ebpf = Ebpf::load(object()).map_err(|e| {
            let why = match &e {
                aya::EbpfError::MapError(_) => ": creating BPF maps needs CAP_BPF and CAP_NET_ADMIN (root)",
                _ => "",
            };
            unsupported(format!("cannot load the XDP program's object ({e}){why}"))
        })?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| unsupported(format!("the object has no XDP program {PROGRAM}")))?;
        prog.load().map_err(|e| match e {
            aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
                let log = verifier_log.to_string();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(20)..].join("\n");
                unsupported(format!(
                    "the kernel refused the XDP program ({io_error}); end of the verifier's log:\n{tail}"
                ))
            }
            e => unsupported(format!("cannot load the XDP program: {e}")),
        })?;
        let mut map = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| unsupported(format!("the XDP object has no map {name}")))
        };
        let xsks = XskMap::try_from(map("capture_xsks")?)
            .map_err(|e| unsupported(format!("capture_xsks is not an XSK map: {e}")))?;
        let counts = PerCpuArray::try_from(map("capture_counts")?)
            .map_err(|e| unsupported(format!("capture_counts is not a per-CPU array: {e}")))?;
        Ok(XdpProgram {
            ebpf,
            xsks,
            counts,
            attached: None,
        })
    }

    /// Frames of `queue` go to `sock` from now on.
    pub fn register(&mut self, queue: u32, sock: &XskSocket) -> Result<()> {
        self.xsks
            .set(queue, sock.as_raw_fd(), 0)
            .map_err(|e| unsupported(format!("cannot put the socket of queue {queue} in the XSK map: {e}")))
    }

    /// Attaches to `iface`: in the driver if it has XDP (native), in the
    /// stack otherwise (generic). Returns how it is attached.
    pub fn attach(&mut self, iface: &str) -> Result<&'static str> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| unsupported(format!("the object has no XDP program {PROGRAM}")))?;
        let how = match prog.attach(iface, XdpMode::Driver) {
            Ok(_) => "native",
            Err(native) => match prog.attach(iface, XdpMode::Skb) {
                Ok(_) => "generic",
                Err(generic) => {
                    let busy = attached_program(iface).map(|p| {
                        format!(
                            "; {iface} already has XDP program {} (id {}): one program per interface",
                            p.name, p.id
                        )
                    });
                    return Err(unsupported(format!(
                        "cannot attach the XDP program to {iface} (in the driver: {native}; in the stack: {generic}){}",
                        busy.unwrap_or_default()
                    )));
                }
            },
        };
        self.attached = Some(how);
        Ok(how)
    }

    /// (frames the program saw, frames it found no socket for) on `queue`,
    /// summed over CPUs.
    pub fn queue_counts(&self, queue: u32) -> (u64, u64) {
        match self.counts.get(&queue, 0) {
            Ok(per_cpu) => per_cpu.iter().fold((0, 0), |(s, n), v| (s + v[0], n + v[1])),
            Err(_) => (0, 0),
        }
    }
}

/// The reception time the program stamped in front of a frame, converted
/// to wall-clock ns with `tai_minus_real` (CLOCK_TAI less CLOCK_REALTIME);
/// `None` when the metadata is absent.
pub fn meta_time(meta: &[u8], tai_minus_real: i64) -> Option<u64> {
    if meta.len() < META_LEN || u32::from_ne_bytes(meta[0..4].try_into().ok()?) != META_MAGIC {
        return None;
    }
    let tai = u64::from_ne_bytes(meta[8..16].try_into().ok()?);
    Some((tai as i64 - tai_minus_real) as u64)
}

/// CLOCK_TAI less CLOCK_REALTIME in ns (the kernel's TAI offset, 0 when
/// no time daemon set it).
pub fn tai_minus_real_ns() -> i64 {
    use nix::time::{clock_gettime, ClockId};
    let ns = |c| {
        clock_gettime(c)
            .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
            .unwrap_or(0)
    };
    let real = ns(ClockId::CLOCK_REALTIME);
    ns(ClockId::CLOCK_TAI) - real
}

/// The number of receive queues of `iface` (one socket each).
pub fn rx_queues(iface: &str) -> u32 {
    std::fs::read_dir(format!("/sys/class/net/{iface}/queues"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count() as u32
        })
        .unwrap_or(1)
        .max(1)
}

/// The addresses on `iface` that show it carries a host's traffic: every
/// IPv4 address and every IPv6 address beyond link-local ones (which the
/// kernel puts on any interface that comes up). When they cannot be listed
/// the check fails closed: an error, not an empty list.
pub fn host_addresses(iface: &str) -> Result<Vec<IpAddr>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| {
        unsupported(format!(
            "cannot list the addresses of {iface} to check that it is not a host's interface: {e}"
        ))
    })?;
    Ok(addrs
        .filter(|a| a.interface_name == iface)
        .filter_map(|a| {
            let sa = a.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                return Some(IpAddr::V4(v4.ip()));
            }
            let v6 = sa.as_sockaddr_in6()?.ip();
            let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
            (!link_local).then_some(IpAddr::V6(v6))
        })
        .collect())
}

/// An XDP program attached to an interface, as `ip -d link` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub id: u32,
    pub name: String,
}

/// The XDP program on `iface`, if any (read from `ip -d link show`).
pub fn attached_program(iface: &str) -> Option<Attached> {
    let out = Command::new("ip")
        .args(["-d", "link", "show", "dev", iface])
        .output()
        .ok()?;
    parse_attached(&String::from_utf8_lossy(&out.stdout))
}

/// Parses `prog/xdp id N name NAME` (or `prog/xdpgeneric …`) out of `ip -d
/// link show`.
fn parse_attached(text: &str) -> Option<Attached> {
    let mut words = text.split_whitespace().peekable();
    while let Some(w) = words.next() {
        if w.starts_with("prog/xdp") {
            let (mut id, mut name) = (None, None);
            while let Some(k) = words.next() {
                match k {
                    "id" => id = words.next().and_then(|v| v.parse().ok()),
                    "name" => name = words.next().map(str::to_string),
                    _ => {}
                }
                if id.is_some() && name.is_some() {
                    break;
                }
            }
            return Some(Attached {
                id: id?,
                name: name.unwrap_or_default(),
            });
        }
    }
    None
}

/// PIDs of processes that hold a BPF link to program `id` (from
/// /proc/PID/fdinfo: a live capture's link shows up there).
fn link_holders(id: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return pids;
    };
    let want = format!("prog_id:\t{id}");
    for p in procs.filter_map(|e| e.ok()) {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fdinfo")) else {
            continue;
        };
        let held = fds.filter_map(|e| e.ok()).any(|fd| {
            std::fs::read_to_string(fd.path())
                .map(|s| s.contains("link_type:\txdp") && s.lines().any(|l| l == want))
                .unwrap_or(false)
        });
        if held {
            pids.push(pid);
        }
    }
    pids
}

/// Removes a program of ours that no live process holds (left by a
/// netlink attachment whose process died); refuses one a live capture
/// holds, naming it. Programs of others are left to `attach` to report.
/// Called before any socket is bound (a queue takes one socket).
pub fn sweep_leftover(iface: &str) -> Result<()> {
    let Some(p) = attached_program(iface) else {
        return Ok(());
    };
    if p.name != PROGRAM {
        return Ok(());
    }
    let holders = link_holders(p.id);
    if !holders.is_empty() {
        return Err(unsupported(format!(
            "{iface} is already captured in xdp mode by process {} (program {PROGRAM}, id {}); an interface takes one",
            holders.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            p.id
        )));
    }
    // Either attachment, in the stack or in the driver (`xdp off` alone
    // would only clear the driver's).
    for mode in ["xdpgeneric", "xdpdrv"] {
        Command::new("ip")
            .args(["link", "set", "dev", iface, mode, "off"])
            .status()
            .map_err(|e| {
                unsupported(format!(
                    "cannot run ip to remove a leftover XDP program from {iface}: {e}"
                ))
            })?;
    }
    if attached_program(iface).is_some_and(|q| q.id == p.id) {
        return Err(unsupported(format!(
            "{iface} has a leftover {PROGRAM} program (id {}) that could not be removed (pinned?); \
             remove it with `ip link set dev {iface} xdp off` or its pin in /sys/fs/bpf",
            p.id
        )));
    }
    tracing::warn!(
        "capture: removed a leftover {PROGRAM} program (id {}) from {iface}, left by a capture that did not exit",
        p.id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_link_output_names_the_program() {
        let native = "5: mon0@if4: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 xdp qdisc noqueue state UP\n    \
                      link/ether 02:00:00:00:00:01 brd ff:ff:ff:ff:ff:ff link-netnsid 0 promiscuity 0\n    \
                      prog/xdp id 42 name capture_xsk tag 0123456789abcdef jited \n    veth addrgenmode eui64";
        assert_eq!(
            parse_attached(native),
            Some(Attached {
                id: 42,
                name: "capture_xsk".into()
            })
        );
        let generic = "prog/xdpgeneric id 7 name other tag 00 jited";
        assert_eq!(
            parse_attached(generic).map(|a| (a.id, a.name)),
            Some((7, "other".into()))
        );
        assert_eq!(parse_attached("3: lo: <LOOPBACK,UP> mtu 65536 qdisc noqueue"), None);
    }

    #[test]
    fn buffers_hold_a_whole_frame() {
        assert_eq!(chunk_for_mtu(1500), Some(2048));
        assert_eq!(chunk_for_mtu(1774), Some(2048));
        assert_eq!(chunk_for_mtu(1775), Some(4096));
        assert_eq!(chunk_for_mtu(3822), Some(4096));
        assert_eq!(chunk_for_mtu(9000), None);
    }

    #[test]
    fn metadata_gives_wall_clock_time_or_nothing() {
        let mut meta = [0u8; META_LEN];
        assert_eq!(meta_time(&meta, 37_000_000_000), None);
        meta[0..4].copy_from_slice(&META_MAGIC.to_ne_bytes());
        meta[8..16].copy_from_slice(&1_700_000_037_000_000_000u64.to_ne_bytes());
        assert_eq!(meta_time(&meta, 37_000_000_000), Some(1_700_000_000_000_000_000));
        assert_eq!(meta_time(&meta[..8], 0), None);
    }
}
