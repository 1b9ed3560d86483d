//! The demo as a user runs it without a lab: bad arguments are refused
//! with a message naming them, and a short loopback run loses nothing.

mod common;
use common::*;

#[test]
fn bad_arguments_name_the_problem() {
    for (args, needle) in [
        (&["--backends", "carrier-pigeon"][..], "carrier-pigeon"),
        (&["--duration", "0"][..], "--duration"),
        (&["--clients", "0"][..], "--clients"),
        (&["--grid", "8by8"][..], "--grid"),
        (&["--where", "moon"][..], "moon"),
    ] {
        let o = demo(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_reflector-demo"))
        .args(["--reflector-bin", "/nonexistent/reflector"])
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("reflector binary /nonexistent/reflector not found"),
        "{}",
        text(&o)
    );
}

/// The whole demo on loopback, shortened: children start, bots move, both
/// backends report no loss, and the table says where it ran.
#[test]
fn short_loopback_demo_has_no_loss() {
    let all = short_run_without_loss(&["--where", "loopback", "--bots", "8"], 2);
    assert!(
        all.contains("on loopback") && all.contains("sendmmsg") && all.contains("sendto"),
        "{all}"
    );
}
