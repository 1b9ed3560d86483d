//! The demo placed in network namespaces, as `netlab demo` runs it: the
//! reflector and control server in one namespace, the bots' sockets spread
//! over two others, every datagram crossing a veth. Needs root; creates and
//! removes its own namespaces.

use oskit::testing::{root_or_skip, sh, NetNsGuard};
use std::process::Command;

/// A reflector namespace and two client namespaces on one bridge (in the
/// reflector's namespace); all removed on drop, even on panic.
struct Lab {
    names: Vec<String>,
    _guards: Vec<NetNsGuard>,
}

fn lab() -> Lab {
    let guards: Vec<NetNsGuard> = ["rfdr", "rfdc", "rfdc"].into_iter().map(NetNsGuard::new).collect();
    let names: Vec<String> = guards.iter().map(|g| g.name().to_string()).collect();
    let r = &names[0];
    sh(&["ip", "-n", r, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", r, "addr", "add", "10.202.0.1/24", "dev", "br0"]);
    sh(&["ip", "-n", r, "link", "set", "br0", "up"]);
    for (i, c) in names[1..].iter().enumerate() {
        let port = format!("p{i}");
        sh(&[
            "ip", "-n", r, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", c,
        ]);
        sh(&["ip", "-n", r, "link", "set", &port, "master", "br0", "up"]);
        sh(&[
            "ip",
            "-n",
            c,
            "addr",
            "add",
            &format!("10.202.0.{}/24", i + 2),
            "dev",
            "eth0",
        ]);
        sh(&["ip", "-n", c, "link", "set", "eth0", "up"]);
    }
    Lab { names, _guards: guards }
}

#[test]
fn demo_in_namespaces_loses_nothing() {
    if !root_or_skip("demo_in_namespaces_loses_nothing") {
        return;
    }
    let lab = lab();
    let json = std::env::temp_dir().join(format!("{}-demo.json", lab.names[0]));
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args([
            "demo",
            "--bots",
            "6",
            "--duration",
            "2",
            "--move-every",
            "1",
            "--groups",
            "4",
            "--grid",
            "2x2",
        ])
        .args(["--backends", "sendmmsg"])
        .args(["--reflector-netns", &lab.names[0], "--reflector-addr", "10.202.0.1"])
        .args(["--bots-netns", &format!("{},{}", lab.names[1], lab.names[2])])
        .arg("--json")
        .arg(&json)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the reflector binary runs");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("in the lab"), "{out}");
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let row = &rows[0];
    assert_eq!(row["lost"], 0);
    assert!(row["received"].as_u64().unwrap() > 0);
    assert_eq!(row["received"], row["expected"]);
    assert_eq!(row["counters_match"], true);
    drop(lab);
}
