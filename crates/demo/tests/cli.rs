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
        // A sealed DATA with the bots' fields and the marker needs 116.
        (
            &["--sealed", "--size", "100"][..],
            "--size 100 is out of range: from 116",
        ),
        (&["--size", "60"][..], "--size 60 is out of range: from 76"),
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
    let (all, rows) = short_run_without_loss(&["--where", "loopback", "--bots", "8"], 2);
    // No lab, no link to count on.
    assert!(rows.iter().all(|r| r["wire_data"].is_null()), "{rows:?}");
    assert!(
        all.contains("on loopback") && all.contains("sendmmsg") && all.contains("sendto"),
        "{all}"
    );
}
