//! The token secret rolled over while `serve` and `control` run: the new
//! file is taken on SIGHUP (which no longer ends either process) or when
//! the file changes, tokens of the previous secret are accepted until the
//! time the file gives and refused once it is gone, and a broken file keeps
//! the secret in force.

use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::client::{Config, Failure, JoinRequest};
use reflector_proto::protocol::{ErrorCode, SessionKeys};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const OLD: [u8; 32] = [0x11; 32];
const NEW: [u8; 32] = [0x22; 32];

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn unix_s() -> u64 {
    reflector_proto::unix_now_ms() / 1000
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("reflector-secret-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `text` to `path` as an operator should: a new file renamed over
/// the old one, so a reader never sees half of it.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    fn hang_up(&self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

fn metric(port: u16, series: &str) -> u64 {
    let text = get(port, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        .parse()
        .unwrap()
}

/// Waits (at most 5 s) for `series` to reach `want`.
fn wait_metric(port: u16, series: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let got = metric(port, series);
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{series} is {got}, not {want}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A join request for `player` in `group` signed with `secret`.
fn request(secret: &[u8; 32], group: u16, player: u32) -> JoinRequest {
    let secret = Secret::new(secret).unwrap();
    let token = TokenClaims {
        player,
        reflector: 0,
        group,
        expires_unix_s: unix_s() + 120,
    }
    .sign(&secret);
    JoinRequest {
        reflector: SocketAddr::from(([127, 0, 0, 1], group)),
        group,
        player,
        token,
        keys: SessionKeys::derive(&secret, &token),
        first_seq: 1,
    }
}

/// Joins from a fresh socket: `Ok` once admitted, or the refusal.
fn join(secret: &[u8; 32], group: u16, player: u32) -> Result<(), Failure> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let cfg = Config {
        retry: Duration::from_millis(200),
        give_up: Some(Duration::from_secs(3)),
    };
    match reflector_proto::blocking::join(&sock, request(secret, group, player), cfg) {
        Ok(_) => Ok(()),
        Err(reflector_proto::blocking::JoinError::Failed { failure, .. }) => Err(failure),
        Err(e) => panic!("player {player}: {e}"),
    }
}

#[test]
fn serve_takes_a_rolled_over_secret_without_a_restart() {
    let dir = Scratch::new("serve");
    let file = dir.0.join("secret");
    std::fs::write(&file, hex(&OLD)).unwrap();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let group = udp.local_addr().unwrap().port();
    drop(udp);
    let metrics = free_port();
    let mut serve = Proc(
        Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args([
                "serve",
                "--bind",
                "127.0.0.1",
                "--ports",
                &group.to_string(),
                "--threads",
                "1",
            ])
            .args(["--secret-file", file.to_str().unwrap()])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the reflector binary runs"),
    );
    wait_listening(metrics);
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
