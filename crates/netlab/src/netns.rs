//! Network namespace helpers: run code inside a namespace, write sysctls
//! there, find the processes living in it, read interface counters.

use crate::error::LabError;
use crate::plan::NS_PREFIX;
use std::collections::HashMap;
use std::process::Command;

pub use oskit::netns::NETNS_DIR;

/// Writes a sysctl (`net.ipv4.ip_forward`) inside a namespace.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), LabError> {
    Ok(oskit::netns::sysctl(&oskit::netns::NetNs::open(ns)?, key, value)?)
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
