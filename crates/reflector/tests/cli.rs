//! The `control` and `bots` subcommands as a user runs them: the real
//! binary, refusing bad arguments with a message that names them.

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
        "--anonymous-joins",
        "--secret-file",
        "/nonexistent/secret",
        "--reflector",
        "nothing",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("IP:PORTS"), "{}", stderr(&o));

    // Tickets or an explicit opt-out: never anonymous by default.
    let o = reflector(&["control", "--secret-file", "s", "--reflector", "127.0.0.1:4000"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--ticket-keys"), "{}", stderr(&o));
    let secret = std::env::temp_dir().join(format!("reflector-cli-secret-{}", std::process::id()));
    std::fs::write(&secret, "ab".repeat(32)).unwrap();
    let o = reflector(&[
        "control",
        "--secret-file",
        secret.to_str().unwrap(),
        "--reflector",
        "127.0.0.1:4000",
        "--ticket-keys",
        "/nonexistent/keys.toml",
    ]);
    let _ = std::fs::remove_file(&secret);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("/nonexistent/keys.toml"), "{}", stderr(&o));
}
