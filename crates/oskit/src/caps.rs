//! Which Linux capabilities this process holds, so a program can check at
//! start what its configuration needs and name what is missing, instead of
//! failing later with a bare `EPERM`.
//!
//! Read from `/proc/self/status` (`CapEff`, the effective set), the same
//! bits `capget(2)` returns; a hex mask needs no library.

use crate::SysError;
use std::fmt;

/// The capabilities the workspace's programs may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cap {
    /// Bind ports below `net.ipv4.ip_unprivileged_port_start`.
    NetBindService,
    /// Network configuration: attach tc/XDP programs, lift socket-buffer caps.
    NetAdmin,
    /// Packet sockets (capture).
    NetRaw,
    /// Lock memory beyond RLIMIT_MEMLOCK (pinned zero-copy buffers).
    IpcLock,
    /// Enter another network namespace (`setns`).
    SysAdmin,
    /// Load BPF programs and create maps.
    Bpf,
    /// BPF programs that read kernel memory or use perf events.
    Perfmon,
}

impl Cap {
    pub const ALL: [Cap; 7] = [
        Cap::NetBindService,
        Cap::NetAdmin,
        Cap::NetRaw,
        Cap::IpcLock,
        Cap::SysAdmin,
        Cap::Bpf,
        Cap::Perfmon,
    ];

    /// The capability's number (`linux/capability.h`).
    pub fn number(self) -> u32 {
        match self {
            Cap::NetBindService => 10,
            Cap::NetAdmin => 12,
            Cap::NetRaw => 13,
            Cap::IpcLock => 14,
            Cap::SysAdmin => 21,
            Cap::Perfmon => 38,
            Cap::Bpf => 39,
        }
    }

    /// The name `setcap`, `capsh` and systemd use.
    pub fn name(self) -> &'static str {
        match self {
            Cap::NetBindService => "CAP_NET_BIND_SERVICE",
            Cap::NetAdmin => "CAP_NET_ADMIN",
            Cap::NetRaw => "CAP_NET_RAW",
            Cap::IpcLock => "CAP_IPC_LOCK",
            Cap::SysAdmin => "CAP_SYS_ADMIN",
            Cap::Perfmon => "CAP_PERFMON",
            Cap::Bpf => "CAP_BPF",
        }
    }
}

impl fmt::Display for Cap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of capabilities, as the kernel's 64-bit mask.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn has(self, cap: Cap) -> bool {
        self.0 & (1u64 << cap.number()) != 0
    }
}

/// The `CapEff` mask from the text of a `/proc/PID/status` file.
pub fn parse_effective(status: &str) -> Option<CapSet> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok().map(CapSet)
}

/// This process's effective capabilities.
pub fn effective() -> Result<CapSet, SysError> {
    let path = "/proc/self/status";
    let text = std::fs::read_to_string(path).map_err(|e| SysError::new(format!("read {path}"), e))?;
    parse_effective(&text).ok_or_else(|| {
        SysError::new(
            format!("parse CapEff in {path}"),
            std::io::Error::new(std::io::ErrorKind::InvalidData, "no CapEff line"),
        )
    })
}

/// The lowest port an unprivileged process may bind
/// (`net.ipv4.ip_unprivileged_port_start`, 1024 unless changed; the
/// setting is per network namespace).
pub fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_mask_is_read_from_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                      CapEff:\t0000000000001400\nCapBnd:\t000001ffffffffff\n";
        let set = parse_effective(status).unwrap();
        assert!(set.has(Cap::NetBindService));
        assert!(set.has(Cap::NetAdmin));
        assert!(!set.has(Cap::NetRaw));
        assert!(!set.has(Cap::Bpf));
        assert_eq!(parse_effective("Name:\tx\n"), None);
        assert_eq!(parse_effective("CapEff:\tzz\n"), None);
    }

    #[test]
    fn root_has_everything_and_the_numbers_match_the_kernel() {
        let all = CapSet(0x0000_01ff_ffff_ffff);
        assert!(Cap::ALL.iter().all(|c| all.has(*c)));
        assert_eq!(Cap::Bpf.number(), 39);
        assert_eq!(Cap::NetBindService.to_string(), "CAP_NET_BIND_SERVICE");
    }
}
