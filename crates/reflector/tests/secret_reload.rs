//! The token secret rolled over while `serve` and `control` run: the new
//! file is taken on SIGHUP (which no longer ends either process) or when
//! the file changes, tokens of the previous secret are accepted until the
//! time the file gives and refused once it is gone, and a broken file keeps
//! the secret in force.

mod support;

use reflector_proto::auth::Secret;
use reflector_proto::client::Failure;
use reflector_proto::protocol::ErrorCode;
use std::process::{Command, Stdio};
use support::*;

const OLD: [u8; 32] = [0x11; 32];
const NEW: [u8; 32] = [0x22; 32];

#[test]
fn serve_takes_a_rolled_over_secret_without_a_restart() {
    let dir = Scratch::new("serve");
    let file = dir.0.join("secret");
    std::fs::write(&file, hex(&OLD)).unwrap();
    let (mut serve, group, metrics) = start_serve(&file, &[]);
    assert_eq!(join(&OLD, group, 1), Ok(()));
    assert_eq!(
        join(&NEW, group, 2),
        Err(Failure::Refused(Ok(ErrorCode::BadToken))),
        "not yet"
    );

    // Step 1 of a rollover: the new secret, the old one accepted until then.
    let until = unix_s() + 600;
    std::fs::write(&file, format!("{}\nprevious {} until {until}\n", hex(&NEW), hex(&OLD))).unwrap();
    serve.hang_up();
    wait_metric(metrics, "reflector_token_secret_reloads_total", 1);
    assert!(serve.alive(), "SIGHUP reloads, it does not stop the reflector");
    assert_eq!(metric(metrics, "reflector_token_secret_previous_until_seconds"), until);
    assert_eq!(join(&NEW, group, 3), Ok(()), "the new secret");
    assert_eq!(join(&OLD, group, 4), Ok(()), "the previous one, during the overlap");

    // The overlap over: the old secret's tokens are refused. No signal:
    // the file is seen to change.
    replace(&file, &hex(&NEW));
    wait_metric(metrics, "reflector_token_secret_reloads_total", 2);
    assert_eq!(metric(metrics, "reflector_token_secret_previous_until_seconds"), 0);
    assert_eq!(join(&OLD, group, 5), Err(Failure::Refused(Ok(ErrorCode::BadToken))));
    assert_eq!(join(&NEW, group, 6), Ok(()));

    // A broken file (a secret of 5 bytes): reported, and the secret in
    // force is kept.
    replace(&file, "short\n");
    wait_metric(metrics, "reflector_token_secret_reload_errors_total", 1);
    assert_eq!(metric(metrics, "reflector_token_secret_reloads_total"), 2);
    assert_eq!(join(&NEW, group, 7), Ok(()));
    assert!(serve.alive());
}

#[test]
fn control_signs_with_the_new_secret_after_a_reload() {
    let dir = Scratch::new("control");
    let file = dir.0.join("secret");
    std::fs::write(&file, hex(&OLD)).unwrap();
    let port = free_port();
    let mut control = Proc(
        Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args(["control", "--anonymous-joins", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--secret-file", file.to_str().unwrap(), "--reflector", "127.0.0.1:4000"])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the reflector binary runs"),
    );
    wait_listening(port);
    // Which secret the token of a /join answer verifies under.
    let signed_with = |player: u32, secret: &[u8; 32]| {
        let body = get(port, &format!("/join?player={player}&x=0&y=0"));
        let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body}"));
        let bytes: Vec<u8> = (0..64)
            .step_by(2)
            .map(|i| u8::from_str_radix(&v["token"].as_str().unwrap()[i..i + 2], 16).unwrap())
            .collect();
        let token: [u8; 32] = bytes.try_into().unwrap();
        let group = v["group"].as_u64().unwrap() as u16;
        let secret = Secret::new(secret).unwrap();
        reflector_proto::auth::verify_token(&secret, &token, 0, group, player, reflector_proto::unix_now_ms()).is_ok()
    };
    assert!(signed_with(1, &OLD));
    std::fs::write(
        &file,
        format!("{}\nprevious {} until {}\n", hex(&NEW), hex(&OLD), unix_s() + 600),
    )
    .unwrap();
    control.hang_up();
    wait_metric(port, "reflector_control_token_secret_reloads_total", 1);
    assert!(control.alive(), "SIGHUP reloads, it does not stop the control server");
    assert!(
        signed_with(2, &NEW) && !signed_with(3, &OLD),
        "new tokens carry the new secret"
    );
    replace(&file, "short\n");
    wait_metric(port, "reflector_control_token_secret_reload_errors_total", 1);
    assert!(signed_with(4, &NEW), "a broken file keeps the secret in force");
}
