//! netlab inside a container: the `netlab` command builds, checks and
//! removes a lab in a network namespace other than the machine's initial
//! one (`unshare --net --pid --fork --mount --mount-proc`, what a privileged
//! container is), with its own private `/run/netns` and `/run/netlab`.
//! There the machine-wide neighbour limits do not exist; `up` must say so
//! in one note and go on.

mod common;
use common::*;
use std::process::Command;

/// Namespaces of the machine (this test's own namespace), by name.
fn outer_namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    v.sort();
    v
}

/// Mount points of this (the outer) mount namespace.
fn outer_mounts() -> String {
    std::fs::read_to_string("/proc/self/mountinfo").unwrap()
}

/// The wrapper run as pid 1 of the new namespaces: private mounts first, so
/// that nothing mounted here (the tmpfs over /run/netns and /run/netlab,
/// the namespaces bound under it) is seen outside, then up, check, down,
/// and what is left inside. Everything inside goes when it exits.
const WRAPPER: &str = r#"set -eu
mount --make-rprivate /
mkdir -p /run/netns /run/netlab
mount -t tmpfs "$TAG" /run/netns
mount -t tmpfs "$TAG" /run/netlab
echo "inner namespaces before: [$(ip netns list)]"
"$NETLAB" up star:301
"$NETLAB" check
"$NETLAB" down
echo "inner namespaces after: [$(ip netns list)]"
echo "inner runs after: [$(ls /run/netlab | grep -v '^limits' || true)]"
"#;

#[test]
fn up_check_down_in_a_private_network_namespace_leaves_nothing() {
    if !need_root("up_check_down_in_a_private_network_namespace_leaves_nothing") {
        return;
    }
    let ns_before = outer_namespaces();
    let tag = format!("netlab-ct-test{}", std::process::id());
    let o = Command::new("unshare")
        .args([
            "--net",
            "--pid",
            "--fork",
            "--mount",
            "--mount-proc",
            "sh",
            "-c",
            WRAPPER,
        ])
        .env("NETLAB", env!("CARGO_BIN_EXE_netlab"))
        .env("TAG", &tag)
        .output()
        .expect("run unshare (util-linux)");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    // Beyond 300 hosts all-pairs traffic needs more neighbour entries than
    // the kernel's default table holds, and this namespace cannot raise it:
    // one note, and the lab still works.
    let notes = err.matches("are not visible in this network namespace").count();
    assert_eq!(notes, 1, "{err}");
    assert!(!err.contains("error"), "{err}");
    assert!(out.contains("inner namespaces before: []"), "{out}");
    // Checked by a sample that needs no room in the table: every host to
    // the hub, whose neighbour entries are permanent.
    assert!(
        out.contains("300 sampled host pairs reach each other")
            && out.contains("every host to hub h1 and 0 random destinations per host"),
        "{out}"
    );
    assert!(err.contains("0 instead of 5 random destinations per host"), "{err}");
    assert!(out.contains("inner namespaces after: []"), "{out}");
    assert!(out.contains("inner runs after: []"), "{out}");
    // Nothing of it outside: the namespaces lived under the private tmpfs,
    // which went with the mount namespace.
    let run = out
        .split("--run ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {out}"));
    let leaked: Vec<String> = outer_namespaces()
        .into_iter()
        .filter(|n| !ns_before.contains(n))
        .filter(|n| n.starts_with(&format!("netlab-{run}-")))
        .collect();
    assert!(leaked.is_empty(), "namespaces outside: {leaked:?}");
    assert!(!outer_mounts().contains(&tag), "a tmpfs of the test is mounted outside");
}
