//! The demo placed in network namespaces, as `netlab demo` runs it: the
//! reflector and control server in one namespace, the bots' sockets spread
//! over two others, every datagram crossing a veth. Needs root; creates and
//! removes its own namespaces.

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn sh(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().expect("runs ip");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A reflector namespace and two client namespaces on one bridge (in the
/// reflector's namespace); all removed on drop, even on panic.
struct Lab {
    names: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).status();
        }
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn lab() -> Lab {
    let id = format!("rfd{}x{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let lab = Lab {
        names: vec![format!("{id}r"), format!("{id}c1"), format!("{id}c2")],
    };
    for n in &lab.names {
        sh(&["ip", "netns", "add", n]);
        sh(&["ip", "-n", n, "link", "set", "lo", "up"]);
    }
    let r = &lab.names[0];
    sh(&["ip", "-n", r, "link", "add", "br0", "type", "bridge"]);
    sh(&["ip", "-n", r, "addr", "add", "10.202.0.1/24", "dev", "br0"]);
    sh(&["ip", "-n", r, "link", "set", "br0", "up"]);
    for (i, c) in lab.names[1..].iter().enumerate() {
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
    lab
}

#[test]
fn demo_in_namespaces_loses_nothing() {
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
            "demo_in_namespaces_loses_nothing needs root and REQUIRE_ROOT_TESTS=1"
        );
        eprintln!("skipping demo_in_namespaces_loses_nothing: needs root");
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
