//! A two-namespace veth lab for the benchmarks that need real devices: the
//! reflector's namespace and the clients', one veth between them with
//! static neighbour entries (no ARP in the measurements). Removed on drop,
//! and labs left by a killed run are swept at the next start.

use oskit::netns::NetNs;
use std::net::Ipv4Addr;
use std::process::Command;

/// Runs a command; its stderr is the error.
pub fn sh(args: &[&str]) -> Result<(), String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if !o.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(())
}

/// The two namespaces and the veth (`vr` on the reflector's side, `vc` on
/// the clients').
#[derive(Debug)]
pub struct VethLab {
    /// Namespace names.
    pub r: String,
    pub c: String,
    pub reflector_ip: Ipv4Addr,
    pub client_ip: Ipv4Addr,
}

impl VethLab {
    /// Namespaces `<prefix>r<pid>` and `<prefix>c<pid>`, addresses
    /// 10.`subnet`.0.1 (reflector) and .2 (clients).
    pub fn new(prefix: &str, subnet: u8) -> Result<VethLab, String> {
        let pid = std::process::id();
        Self::sweep(prefix);
        let lab = VethLab {
            r: format!("{prefix}r{pid}"),
            c: format!("{prefix}c{pid}"),
            reflector_ip: Ipv4Addr::new(10, subnet, 0, 1),
            client_ip: Ipv4Addr::new(10, subnet, 0, 2),
        };
        // From here on a failure removes what was made (Drop).
        let l = lab;
        sh(&["ip", "netns", "add", &l.r])?;
        sh(&["ip", "netns", "add", &l.c])?;
        let (rmac, cmac) = (
            format!("02:52:46:00:{subnet:02x}:01"),
            format!("02:52:46:00:{subnet:02x}:02"),
        );
        sh(&[
            "ip", "link", "add", "vr", "address", &rmac, "netns", &l.r, "type", "veth", "peer", "name", "vc",
            "address", &cmac, "netns", &l.c,
        ])?;
        let (rip, cip) = (l.reflector_ip.to_string(), l.client_ip.to_string());
        for (ns, dev, ip, peer, mac) in [(&l.r, "vr", &rip, &cip, &cmac), (&l.c, "vc", &cip, &rip, &rmac)] {
            sh(&["ip", "-n", ns, "addr", "add", &format!("{ip}/24"), "dev", dev])?;
            sh(&["ip", "-n", ns, "link", "set", dev, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            sh(&[
                "ip",
                "-n",
                ns,
                "neigh",
                "replace",
                peer,
                "lladdr",
                mac,
                "dev",
                dev,
                "nud",
                "permanent",
            ])?;
        }
        Ok(l)
    }

    pub fn ns(name: &str) -> Result<NetNs, String> {
        NetNs::open(name).map_err(|e| e.to_string())
    }

    /// Removes labs of this prefix whose process is gone (a run killed with
    /// SIGKILL cannot clean up after itself).
    pub fn sweep(prefix: &str) {
        let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            let Some(rest) = name.strip_prefix(prefix) else {
                continue;
            };
            let Some(pid) = rest.get(1..).and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if !(rest.starts_with('r') || rest.starts_with('c'))
                || std::path::Path::new(&format!("/proc/{pid}")).exists()
            {
                continue;
            }
            eprintln!("removing {name}, left by an earlier run");
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

impl Drop for VethLab {
    fn drop(&mut self) {
        for n in [&self.r, &self.c] {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}
