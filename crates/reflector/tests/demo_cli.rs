//! The `control`, `bots` and `demo` subcommands as a user runs them: the
//! real binary, on 127.0.0.1 only, bounded by short durations.

use std::process::{Command, Output};

fn reflector(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the reflector binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_arguments_name_the_problem() {
    let o = reflector(&["bots", "--size", "5", "--control", "http://127.0.0.1:9"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--size"), "{}", stderr(&o));

    let o = reflector(&["bots", "--control", "127.0.0.1:8700"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("http://"), "{}", stderr(&o));

    let o = reflector(&["control", "--reflector", "127.0.0.1:4000"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--secret-file"), "{}", stderr(&o));

    let o = reflector(&[
        "control",
        "--secret-file",
        "/nonexistent/secret",
        "--reflector",
        "nothing",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IP:PORTS"), "{}", stderr(&o));

    let o = reflector(&["demo", "--backends", "carrier-pigeon"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("carrier-pigeon"), "{}", stderr(&o));
}

/// The whole demo, shortened: children start, bots move, both backends
/// report no loss, and nothing is left running.
#[test]
fn short_demo_has_no_loss() {
    let json = std::env::temp_dir().join(format!("reflector-demo-test-{}.json", std::process::id()));
    let o = reflector(&[
        "demo",
        "--bots",
        "8",
        "--duration",
        "2",
        "--move-every",
        "0.5",
        "--groups",
        "4",
        "--grid",
        "4x4",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "stdout:\n{out}\nstderr:\n{}", stderr(&o));
    assert!(
        out.contains("sendmmsg") && out.contains("sendto") && out.contains("OK: no loss"),
        "{out}"
    );
    let rows: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["counters_match"], true, "{r}");
        assert!(r["received"].as_u64().unwrap() > 0, "{r}");
    }
}
