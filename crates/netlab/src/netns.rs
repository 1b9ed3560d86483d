//! Network namespace helpers: run code inside a namespace, write sysctls
//! and devices' sysfs settings there, find the processes living in it,
//! read interface counters.

use crate::error::LabError;
use crate::model::{CpuList, Sysfs};
use crate::plan::NS_PREFIX;
use std::collections::HashMap;
use std::process::Command;

pub use oskit::netns::NETNS_DIR;

/// Writes a sysctl (`net.ipv4.ip_forward`) inside a namespace.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), LabError> {
    Ok(oskit::netns::sysctl(&oskit::netns::NetNs::open(ns)?, key, value)?)
}

/// Writes a device's sysfs setting inside namespace `ns` and reads it
/// back: from a thread with the namespace's own sysfs on `/sys`
/// ([`NetNs::run_with_sysfs`](oskit::netns::NetNs::run_with_sysfs)), which
/// first checks that `/sys/class/net` lists exactly the namespace's devices,
/// so the write cannot land on a device of the same name elsewhere. Every
/// file of the setting (each receive queue's, for RPS) must read back what
/// was written. The error is the reason alone (the caller names the op).
pub fn write_sysfs(ns: &str, dev: &str, set: &Sysfs) -> Result<(), String> {
    let netns = oskit::netns::NetNs::open(ns).map_err(|e| e.to_string())?;
    netns
        .run_with_sysfs(|| -> Result<(), String> {
            check_sysfs_is_this_namespaces()?;
            match set {
                Sysfs::RpsCpus(cpus) => write_rps(dev, cpus),
            }
        })
        .map_err(|e| e.to_string())?
}

/// `/sys/class/net` against the devices of the calling thread's network
/// namespace (`/proc/thread-self/net/dev`, which follows the thread).
fn check_sysfs_is_this_namespaces() -> Result<(), String> {
    let mut in_sysfs: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map_err(|e| format!("read /sys/class/net: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev")
        .map_err(|e| format!("read /proc/thread-self/net/dev: {e}"))?;
    let mut in_ns: Vec<String> = dev
        .lines()
        .skip(2)
        .filter_map(|l| Some(l.split_once(':')?.0.trim().to_string()))
        .collect();
    in_sysfs.sort();
    in_ns.sort();
    if in_sysfs != in_ns {
        return Err(format!(
            "the sysfs mounted for the namespace lists {} but the namespace has {}",
            in_sysfs.join(" "),
            in_ns.join(" ")
        ));
    }
    Ok(())
}

/// RPS: `cpus` into every receive queue's `rps_cpus` of `dev`.
fn write_rps(dev: &str, cpus: &CpuList) -> Result<(), String> {
    let queues = format!("/sys/class/net/{dev}/queues");
    let mut rx: Vec<(u32, String)> = std::fs::read_dir(&queues)
        .map_err(|e| format!("read {queues}: {e}"))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter_map(|q| Some((q.strip_prefix("rx-")?.parse().ok()?, q)))
        .collect();
    rx.sort();
    if rx.is_empty() {
        return Err(format!("{dev} has no receive queues in {queues}"));
    }
    let mask = cpus.kernel_mask();
    for (_, q) in rx {
        let file = format!("{queues}/{q}/rps_cpus");
        if !std::path::Path::new(&file).exists() {
            return Err(format!("no {file}: a kernel without RPS (CONFIG_RPS)?"));
        }
        std::fs::write(&file, &mask).map_err(|e| {
            format!("writing {mask} (CPUs {cpus}) to {file}: {e} (a CPU this machine does not have, or one isolated from kernel work?)")
        })?;
        let back = std::fs::read_to_string(&file).map_err(|e| format!("read {file}: {e}"))?;
        if CpuList::from_kernel_mask(&back).as_deref() != Some(cpus.cpus()) {
            return Err(format!(
                "wrote {mask} (CPUs {cpus}) to {file}, read back {}: RPS steers only to CPUs that are online",
                back.trim()
            ));
        }
    }
    Ok(())
}

/// Names of all namespaces that carry our prefix.
pub fn our_namespaces() -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(NETNS_DIR) else {
        return vec![];
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect();
    v.sort();
    v
}

/// Pids of the processes whose network namespace is `ns`.
pub fn pids_in(ns: &str) -> Vec<i32> {
    oskit::procfs::pids_in_netns(&[&oskit::netns::path_of(ns)])
}

/// Runs an iproute2 command with JSON output (`-j`) and parses it; a
/// failure names the command and carries its stderr.
fn json_command(program: &str, args: &[&str]) -> Result<serde_json::Value, LabError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program).args(args).output().map_err(|e| LabError::Spawn {
        cmd: cmd.clone(),
        source: e,
    })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd,
            code: format!("{:?}", out.status.code()),
            stderr: String::from_utf8_lossy(&out.stderr).into(),
        });
    }
    serde_json::from_slice(&out.stdout).map_err(|e| LabError::io(cmd, e.into()))
}

/// Per-interface (tx_bytes, tx_packets, rx_bytes, rx_packets) in a namespace.
pub fn link_counters(ns: &str) -> Result<HashMap<String, [u64; 4]>, LabError> {
    let v = json_command("ip", &["-n", ns, "-j", "-s", "link", "show"])?;
    let mut m = HashMap::new();
    for l in v.as_array().into_iter().flatten() {
        let Some(name) = l["ifname"].as_str() else {
            continue;
        };
        let s = &l["stats64"];
        let g = |d: &str, f: &str| s[d][f].as_u64().unwrap_or(0);
        m.insert(
            name.to_string(),
            [
                g("tx", "bytes"),
                g("tx", "packets"),
                g("rx", "bytes"),
                g("rx", "packets"),
            ],
        );
    }
    Ok(m)
}

/// Runs `f` on a fresh thread inside namespace `ns` and returns at once
/// with the thread's handle; the caller's own namespace never changes.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T, LabError>>, LabError> {
    Ok(oskit::netns::NetNs::open(ns)?.spawn(f))
}

/// Bytes sent by the root qdisc of a device, as the qdisc counts them: a
/// GSO super-frame is charged for the headers of every segment it becomes,
/// which is what the wire would carry (device counters charge them once).
pub fn root_qdisc_bytes(ns: &str, dev: &str) -> Result<u64, LabError> {
    let v = json_command("tc", &["-n", ns, "-s", "-j", "qdisc", "show", "dev", dev])?;
    v.as_array()
        .into_iter()
        .flatten()
        .find(|q| q["root"].as_bool() == Some(true))
        .and_then(|q| q["bytes"].as_u64())
        .ok_or_else(|| LabError::Command {
            cmd: format!("tc -n {ns} -s -j qdisc show dev {dev}"),
            code: "0".into(),
            stderr: "no root qdisc with byte counters".into(),
        })
}
