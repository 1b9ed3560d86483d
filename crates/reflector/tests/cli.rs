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

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("reflector-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn ticket_writes_a_development_key_file_and_mints_a_ticket_control_accepts() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("ticket");
    let keys = dir.join("tickets.toml");
    let k = keys.to_str().unwrap();
    let o = reflector(&["ticket", "--ticket-keys", k, "--player", "7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("DEVELOPMENT"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&keys).unwrap().permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&keys).unwrap();
    assert!(text.starts_with("# DEVELOPMENT"), "{text}");
    let ticket = String::from_utf8(o.stdout).unwrap();
    let verifier = reflector_control::players::TicketVerifier::from_file(&keys).unwrap();
    let now_s = reflector_proto::unix_now_ms() / 1000;
    assert_eq!(verifier.verify(ticket.trim(), now_s), Ok(7));
    // A second call reuses the file (and says nothing about writing it).
    let o = reflector(&["ticket", "--ticket-keys", k, "--player", "8", "--ttl", "90s"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("DEVELOPMENT"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), text);
    let ticket = String::from_utf8(o.stdout).unwrap();
    assert_eq!(verifier.verify(ticket.trim(), now_s), Ok(8));
    // A TTL needs its unit.
    let o = reflector(&["ticket", "--ticket-keys", k, "--ttl", "90"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--ttl"), "{}", stderr(&o));
    // A key file with nothing to sign with is named.
    std::fs::write(
        dir.join("ed.toml"),
        "[[key]]\nkid = \"x\"\nalg = \"EdDSA\"\npublic_pem = \"\"\n",
    )
    .unwrap();
    let o = reflector(&["ticket", "--ticket-keys", dir.join("ed.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("ed.toml") && stderr(&o).contains("HS256"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The examples of `reflector --help` and `reflector control --help` name
/// everything the commands require (the ticket key file included).
#[test]
fn help_examples_name_the_required_options() {
    for args in [&["--help"][..], &["control", "--help"]] {
        let o = reflector(args);
        assert!(o.status.success());
        let help = String::from_utf8_lossy(&o.stdout).into_owned();
        let control: Vec<&str> = help
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("reflector control "))
            .collect();
        assert!(!control.is_empty(), "{help}");
        for line in control {
            assert!(
                line.contains("--ticket-keys") || line.contains("--anonymous-joins"),
                "{line}"
            );
        }
        assert!(help.contains("reflector ticket --ticket-keys"), "{help}");
    }
}
