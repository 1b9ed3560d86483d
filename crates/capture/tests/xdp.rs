//! The AF_XDP mode on a monitor port (a mirror of the lab link's received
//! traffic): exact counts, the filter, VLAN tags in the frame, nothing left
//! attached after an exit or a `kill -9`, a leftover swept, a host
//! interface refused.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{number_after, root_or_skip, tcpdump_lines, Lab, Running, BIN};

fn capture(lab: &Lab, args: &[&str]) -> Running {
    let mut cmd = lab.cmd(&lab.b, &[BIN]);
    cmd.args(args);
    Running::start(cmd)
}

#[test]
fn xdp_captures_an_exact_count_on_a_mirror_port_and_filters() {
    if !root_or_skip("xdp_captures_an_exact_count_on_a_mirror_port_and_filters") {
        return;
    }
    let lab = Lab::new();
    let mon = lab.add_monitor();
    let dir = tempfile_dir();
    let file = format!("{dir}/xdp.pcap");
    let mut run = capture(
        &lab,
        &[
            "-i",
            &mon,
            "--mode",
            "xdp",
            "-c",
            "500",
            "-w",
            &file,
            "udp and dst port 7100",
        ],
    );
    let detail = run.wait_line("capture: xdp:", Duration::from_secs(5));
    // veth has no zero-copy AF_XDP: the capture says it binds in copy mode.
    assert!(detail.contains("copy mode"), "{detail}");
    assert!(lab.xdp_program(&lab.b, &mon).is_some_and(|p| p.contains("capture_xsk")));
    // 300 datagrams the filter rejects, then the 500 it keeps.
    lab.gen("udp", 300, 5000, 7200, 20_000);
    lab.gen("udp", 500, 5000, 7100, 20_000);
    let (status, err, _) = run.finish(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert_eq!(number_after(&err, "captured "), 500, "{err}");
    assert_eq!(number_after(&err, "filter, "), 0, "dropped: {err}");
    let lines = tcpdump_lines(&file, None);
    assert_eq!(lines.len(), 500);
    assert!(lines.iter().all(|l| l.contains(".7100: UDP")), "{:?}", &lines[..3]);
    // Timestamps come from the program's stamps, in order.
    let ts: Vec<f64> = lines
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]));
    // The program left with the process; the mirrored link still works.
    assert_eq!(lab.xdp_program(&lab.b, &mon), None);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn xdp_sees_vlan_tags_carried_in_the_frame() {
    if !root_or_skip("xdp_sees_vlan_tags_carried_in_the_frame") {
        return;
    }
    let lab = Lab::new();
    let mon = lab.add_monitor();
    let dir = tempfile_dir();
    let file = format!("{dir}/vlan.pcap");
    let run = capture(
        &lab,
        &["-i", &mon, "--mode", "xdp", "-c", "40", "-w", &file, "vlan 100"],
    );
    // 40 tagged raw frames among 60 untagged ones.
    lab.gen("mmsg", 60, 5000, 7100, 20_000);
    let src = format!("{}:5000", lab.a_ip);
    let dst = format!("{}:7100", lab.b_ip);
    lab.exec_ok(
        &lab.a,
        &[
            BIN, "gen", "-i", &lab.a_if, "--via", "mmsg", "--vlan", "100", "--src", &src, "--dst", &dst, "-c", "40",
            "--rate", "20000",
        ],
    );
    let (status, err, _) = run.finish(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert_eq!(number_after(&err, "captured "), 40, "{err}");
    // tcpdump's own vlan filter agrees with every frame written.
    let out = Command::new("tcpdump")
        .args(["-r", &file, "-n", "vlan 100"])
        .output()
        .expect("tcpdump");
    let matched = String::from_utf8_lossy(&out.stdout).lines().count();
    assert_eq!(matched, 40, "{}", String::from_utf8_lossy(&out.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn xdp_kill_9_leaves_no_program_and_a_second_capture_is_refused() {
    if !root_or_skip("xdp_kill_9_leaves_no_program_and_a_second_capture_is_refused") {
        return;
    }
    let lab = Lab::new();
    let mon = lab.add_monitor();
    let first = capture(&lab, &["-i", &mon, "--mode", "xdp", "-q"]);
    assert!(lab.xdp_program(&lab.b, &mon).is_some());
    // While it runs, another capture in xdp mode is refused, naming it.
    let out = lab
        .cmd(&lab.b, &[BIN, "-i", &mon, "--mode", "xdp", "-c", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("already captured in xdp mode by process") && err.contains(&first.child.id().to_string()),
        "{err}"
    );
    first.signal(nix::sys::signal::Signal::SIGKILL);
    let (status, _, _) = first.finish(Duration::from_secs(10));
    assert!(!status.success());
    // The kernel detached the program with the process's last descriptor.
    let mut gone = false;
    for _ in 0..100 {
        if lab.xdp_program(&lab.b, &mon).is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone, "program still attached after kill -9");
    // A restart captures at once.
    let run = capture(&lab, &["-i", &mon, "--mode", "xdp", "-c", "50", "-q"]);
    lab.gen("udp", 50, 5000, 7100, 20_000);
    let (status, err, _) = run.finish(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert_eq!(number_after(&err, "captured "), 50, "{err}");
}

#[test]
fn xdp_sweeps_a_leftover_and_refuses_a_host_interface() {
    if !root_or_skip("xdp_sweeps_a_leftover_and_refuses_a_host_interface") {
        return;
    }
    let lab = Lab::new();
    let mon = lab.add_monitor();
    // A leftover: our program attached the legacy way (netlink), which
    // outlives its process, as on kernels without XDP links.
    let obj = concat!(env!("OUT_DIR"), "/xsk.bpf.o");
    oskit::testing::attach_xdp_legacy(&lab.b, &mon, obj, "xdp");
    assert!(lab.xdp_program(&lab.b, &mon).is_some());
    let run = capture(&lab, &["-i", &mon, "--mode", "xdp", "-c", "20", "-q"]);
    lab.gen("udp", 20, 5000, 7100, 20_000);
    let (status, err, _) = run.finish(Duration::from_secs(20));
    assert!(status.success(), "{err}");
    assert!(err.contains("removed a leftover capture_xsk program"), "{err}");
    assert_eq!(number_after(&err, "captured "), 20, "{err}");
    assert_eq!(lab.xdp_program(&lab.b, &mon), None);

    // The lab link carries an address: refused, and nothing attached.
    let out = lab
        .cmd(&lab.b, &[BIN, "-i", &lab.b_if, "--mode", "xdp", "-c", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("carries addresses") && err.contains(&lab.b_ip), "{err}");
    assert!(err.contains("--xdp-on-host-interface"), "{err}");
    assert_eq!(lab.xdp_program(&lab.b, &lab.b_if), None);
}

fn tempfile_dir() -> String {
    let d = std::env::temp_dir().join(format!(
        "capture-xdp-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d.to_string_lossy().to_string()
}
