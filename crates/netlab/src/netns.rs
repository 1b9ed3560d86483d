//! Network namespace helpers: run code inside a namespace, write sysctls
//! there, find the processes living in it, read interface counters.

use crate::error::LabError;
use crate::plan::NS_PREFIX;
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

pub const NETNS_DIR: &str = "/run/netns";

/// Runs `f` on a fresh thread that has entered namespace `ns`. The calling
/// thread's own namespace is never changed, so this is safe to use from a
/// multi-threaded program (tests run in parallel threads).
pub fn run_in<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T, LabError> {
    let path = format!("{NETNS_DIR}/{ns}");
    let file = File::open(&path).map_err(|e| LabError::io(format!("open {path}"), e))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| LabError::sys(format!("setns({path})"), e))?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(LabError::sys("thread in namespace", std::io::Error::other("panicked"))))
    })
}

/// Writes a sysctl (`net.ipv4.ip_forward`) inside a namespace: /proc/sys/net
/// shows the namespace of the thread that opens it.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), LabError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    run_in(ns, || std::fs::write(&path, value))?.map_err(|e| LabError::io(format!("sysctl {key}={value} in {ns}"), e))
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

/// Pids of the processes whose network namespace is `ns` (what
/// `ip netns pids` does), found by comparing namespace inodes.
pub fn pids_in(ns: &str) -> Vec<i32> {
    let Ok(target) = std::fs::metadata(format!("{NETNS_DIR}/{ns}")) else {
        return vec![];
    };
    let mut pids = vec![];
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return pids;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(m) = std::fs::metadata(format!("/proc/{pid}/ns/net")) {
            if m.dev() == target.dev() && m.ino() == target.ino() {
                pids.push(pid);
            }
        }
    }
    pids
}

/// Deletes a namespace after ending every process inside it (politely,
/// then firmly). A namespace that does not exist is not an error: tear-down
/// must be idempotent.
pub fn delete(ns: &str) -> Result<(), LabError> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let path = format!("{NETNS_DIR}/{ns}");
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(());
    }
    let pids = pids_in(ns);
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGTERM);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !pids.iter().all(|&p| !alive(p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for p in pids_in(ns) {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    let out = Command::new("ip")
        .args(["netns", "del", ns])
        .output()
        .map_err(|e| LabError::Spawn {
            cmd: format!("ip netns del {ns}"),
            source: e,
        })?;
    if !out.status.success() && std::fs::symlink_metadata(&path).is_ok() {
        return Err(LabError::Command {
            cmd: format!("ip netns del {ns}"),
            code: out
                .status
                .code()
                .map(|c| c.to_string())
                .unwrap_or_else(|| "signal".into()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// True if a process exists and is not a zombie we are about to reap.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit(')').next().map(|r| r.trim_start().chars().next()),
            Some(Some('Z'))
        ),
        Err(_) => false,
    }
}

/// Start time of a process in clock ticks since boot, to tell a pid from a
/// later process that reused it.
pub fn start_time(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces): state is
    // field 3, starttime field 22.
    s.rsplit(')').next()?.split_whitespace().nth(19)?.parse().ok()
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

/// Like [`run_in`], but returns at once with the thread's handle.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<std::thread::JoinHandle<Result<T, LabError>>, LabError> {
    let path = format!("{NETNS_DIR}/{ns}");
    let file = File::open(&path).map_err(|e| LabError::io(format!("open {path}"), e))?;
    Ok(std::thread::spawn(move || {
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| LabError::sys(format!("setns({path})"), e))?;
        Ok(f())
    }))
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
