//! Running `reflector-demo` as a user does, with the workspace's
//! `reflector` and `netlab` binaries of the same build beside it.

use std::path::PathBuf;
use std::process::{Command, Output};

/// A binary of the same build (`cargo test --workspace` builds every
/// workspace binary before any test runs).
pub fn sibling(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_BIN_EXE_reflector-demo")).with_file_name(name);
    assert!(
        p.is_file(),
        "{} is missing: build the workspace binaries first (`cargo build --workspace --bins`; \
         `make test` does)",
        p.display()
    );
    p
}

pub fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_reflector-demo"))
        .args(args)
        .arg("--reflector-bin")
        .arg(sibling("reflector"))
        .arg("--netlab-bin")
        .arg(sibling("netlab"))
        .arg("--capture-bin")
        .arg(sibling("capture"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("the demo binary runs")
}

pub fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs a short demo with a JSON report and returns its rows, checking
/// that the run succeeded with no loss and matching counters.
pub fn short_run_without_loss(extra: &[&str], backends: usize) -> (String, Vec<serde_json::Value>) {
    // Tests of one binary run at once: each run its own file.
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let json = std::env::temp_dir().join(format!("reflector-demo-test-{}-{n}.json", std::process::id()));
    let mut args = vec![
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
    ];
    args.extend_from_slice(extra);
    let o = demo(&args);
    let all = text(&o);
    assert!(o.status.success(), "{all}");
    assert!(all.contains("OK: no loss"), "{all}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert!(
        doc["parameters"].as_str().is_some_and(|p| p.contains("bots")),
        "the JSON carries the run's parameters: {doc}"
    );
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), backends, "{all}");
    for r in rows {
        assert_eq!(r["lost"], 0, "{r}");
        assert_eq!(r["counters_match"], true, "{r}");
        assert!(r["received"].as_u64().unwrap() > 0, "{r}");
        assert_eq!(r["received"], r["expected"], "{r}");
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!(
            n("received") + n("duplicates") + n("uncertain") + n("unexpected"),
            n("arrived"),
            "{r}"
        );
        assert_eq!(n("arrived"), n("fanned_out"), "{r}");
        assert!(r["wire_data"].is_null() || r["wire_data"] == r["fanned_out"], "{r}");
    }
    (all, rows.clone())
}
