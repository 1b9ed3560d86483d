//! Bad input: clear message, non-zero exit, nothing left behind.

mod common;

use std::process::Command;

use common::{root_or_skip, Lab, BIN};

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN).args(args).output().expect("spawn capture");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn unknown_interface_is_named() {
    let (code, err) = run(&["-i", "nosuchif9", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("no interface named 'nosuchif9'"), "{err}");
}

#[test]
fn a_missing_file_to_read_is_named_as_read_not_written() {
    let (code, err) = run(&["-r", "/nonexistent-dir-for-capture/nothere.pcap"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("cannot read /nonexistent-dir-for-capture/nothere.pcap") && !err.contains("cannot write"),
        "{err}"
    );
}

#[test]
fn bad_filter_shows_libpcap_message() {
    let (code, err) = run(&["-i", "lo", "-c", "1", "udp", "prot", "9"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("bad filter expression 'udp prot 9'") && err.contains("syntax error"),
        "{err}"
    );
}

#[test]
fn bad_arguments_exit_non_zero() {
    let (code, err) = run(&["-i", "lo", "--mode", "v9"]);
    assert_ne!(code, 0);
    assert!(err.contains("unknown mode 'v9'"), "{err}");
    let (code, err) = run(&["-i", "lo", "-w", "/tmp/x.pcap", "--compress", "zlib:12"]);
    assert_ne!(code, 0);
    assert!(err.contains("bad compression"), "{err}");
    let (code, err) = run(&["-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("no interface"), "{err}");
    // -r: a missing file is named; -r and -i together are refused.
    let (code, err) = run(&["-r", "/nonexistent/x.pcap"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/x.pcap"), "{err}");
    let (code, err) = run(&["-r", "/nonexistent/x.pcap", "-i", "lo"]);
    assert_ne!(code, 0);
    assert!(err.contains("-r") && err.contains("--interface"), "{err}");
    // Rotation needs a file, and -W something to count.
    let (code, err) = run(&["-i", "lo", "-G", "5", "-c", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("-G") && err.contains("-w"), "{err}");
    let (code, err) = run(&["-i", "lo", "-w", "/tmp/x.pcap", "-W", "3", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("-W counts the files of -C or -G"), "{err}");
    // --print only makes sense beside -w (without it every packet is printed anyway).
    let (code, err) = run(&["-i", "lo", "--print", "-c", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("--print") && err.contains("-w"), "{err}");
    // -Z names an account that must exist: checked before anything is opened.
    let (code, err) = run(&["-i", "lo", "-Z", "nosuchuser9", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("-Z nosuchuser9") && err.contains("no such user"), "{err}");
    let (code, err) = run(&["gen", "--dst", "127.0.0.1:9", "--size", "20", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("frame size 20 is below"), "{err}");
}

#[test]
fn help_teaches_the_modes() {
    let out = Command::new(BIN).arg("--help").output().expect("spawn");
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    for w in ["recv", "v2", "v3", "--threads", "--compress", "gen"] {
        assert!(s.contains(w), "--help lacks {w}");
    }
}

#[test]
fn no_permission_says_needs_root() {
    if !root_or_skip("no_permission_says_needs_root") {
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        // util-linux is part of every Debian base system; without it we cannot drop root.
        panic!("setpriv (util-linux) not found");
    }
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            BIN,
            "-i",
            "lo",
            "-c",
            "1",
        ])
        .output()
        .expect("setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("needs root or CAP_NET_RAW"), "{err}");
}

#[test]
fn unwritable_output_and_refused_ring_leave_nothing() {
    if !root_or_skip("unwritable_output_and_refused_ring_leave_nothing") {
        return;
    }
    let lab = Lab::new();
    let out = lab
        .cmd(
            &lab.b,
            &[BIN, "-i", &lab.b_if, "-c", "1", "-w", "/nonexistent-dir-capture/x.pcap"],
        )
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot write /nonexistent-dir-capture/x.pcap"), "{err}");

    let dir = std::env::temp_dir().join(format!("capture-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("ring.pcap");
    let f = file.to_string_lossy().to_string();
    let out = lab
        .cmd(
            &lab.b,
            &[
                BIN,
                "-i",
                &lab.b_if,
                "--mode",
                "v3",
                "--block-size",
                "2097152",
                "-B",
                "4194304",
                "-c",
                "1",
                "-w",
                &f,
            ],
        )
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("the kernel refused a v3 ring"), "{err}");
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 0, "nothing half-written");
    std::fs::remove_dir(&dir).expect("rmdir");
}

#[test]
fn tcpdump_options_list_refuse_and_explain() {
    // -D lists the interfaces, lo among them; -L the link types of one.
    let out = Command::new(BIN).arg("-D").output().expect("spawn capture");
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).lines().any(|l| l.contains(".lo ")),
        "-D"
    );
    let out = Command::new(BIN)
        .args(["-i", "lo", "-L"])
        .output()
        .expect("spawn capture");
    assert!(String::from_utf8_lossy(&out.stdout).contains("EN10MB (Ethernet)"));
    // What cannot be honoured is refused with the reason.
    let (code, err) = run(&["-i", "lo", "-y", "RAW", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("-y RAW") && err.contains("EN10MB"), "{err}");
    let (code, err) = run(&["-i", "lo", "--immediate-mode", "--mode", "v3", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("--immediate-mode"), "{err}");
    let file = std::env::temp_dir().join(format!("capture-filter-{}", std::process::id()));
    std::fs::write(&file, "# DNS only\nudp port 53\n").unwrap();
    let f = file.to_string_lossy().to_string();
    let (code, err) = run(&["-i", "lo", "-F", &f, "-c", "1", "tcp"]);
    assert_eq!(code, 1);
    assert!(err.contains("-F") && err.contains("give one of them"), "{err}");
    let (code, err) = run(&["-i", "lo", "-F", "/nonexistent/filter", "-c", "1"]);
    assert_eq!(code, 1);
    assert!(err.contains("/nonexistent/filter"), "{err}");
    let _ = std::fs::remove_file(&file);
    // Everyday options tcpdump users type are accepted.
    let (code, err) = run(&[
        "-i",
        "nosuchif9",
        "-nn",
        "-vv",
        "-e",
        "-XX",
        "-tttt",
        "-#",
        "-l",
        "-S",
        "-K",
        "-s",
        "0",
        "-c",
        "1",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no interface named"),
        "parsed every option, then looked for the interface: {err}"
    );
}
