//! What the tests that run `reflector serve` and `control` as processes
//! share: a child killed on drop, scratch files, HTTP GETs of `/metrics`,
//! join requests signed by the test.
#![allow(dead_code)]

use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::client::{Config, Failure, JoinRequest, Session};
use reflector_proto::protocol::SessionKeys;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn unix_s() -> u64 {
    reflector_proto::unix_now_ms() / 1000
}

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new directory for each call (tests of one binary run at once).
    pub fn new(name: &str) -> Scratch {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("reflector-scratch-{name}-{}-{n}", std::process::id()));
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
pub fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Proc {
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0.id() as i32), sig).unwrap();
    }

    pub fn hang_up(&self) {
        self.signal(nix::sys::signal::Signal::SIGHUP);
    }

    /// Waits at most `limit` for the process to exit: its status, or
    /// `None` if it still runs.
    pub fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

pub fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One GET of `path` on 127.0.0.1:`port`: the status and the body.
pub fn get_status(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let code = head.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_string())
}

pub fn get(port: u16, path: &str) -> String {
    get_status(port, path).1
}

/// `reflector serve` on a free group port of 127.0.0.1 with its metrics
/// listener, the secret from `secret_file` and `extra` flags; the process,
/// the group port and the metrics port, once it listens. If it stops or
/// does not listen within 10 s, the panic shows what it printed.
pub fn start_serve(secret_file: &Path, extra: &[&str]) -> (Proc, u16, u16) {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let group = udp.local_addr().unwrap().port();
    drop(udp);
    let metrics = free_port();
    let log = std::env::temp_dir().join(format!("reflector-serve-{}-{group}.log", std::process::id()));
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
            .args(["--secret-file", secret_file.to_str().unwrap()])
            .args(["--metrics", &format!("127.0.0.1:{metrics}")])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the reflector binary runs"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", metrics)).is_err() {
        if !serve.alive() || Instant::now() >= deadline {
            let printed = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_file(&log);
            panic!("reflector serve on port {group} did not start: {printed}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = std::fs::remove_file(&log);
    (serve, group, metrics)
}

pub fn metric(port: u16, series: &str) -> u64 {
    let text = get(port, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        .parse()
        .unwrap()
}

/// Waits (at most 5 s) for `series` to reach `want`.
pub fn wait_metric(port: u16, series: &str, want: u64) {
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
pub fn request(secret: &[u8; 32], group: u16, player: u32) -> JoinRequest {
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

/// Joins from a fresh socket: the socket and the session once admitted,
/// or the refusal.
pub fn join_session(secret: &[u8; 32], group: u16, player: u32) -> Result<(UdpSocket, Session), Failure> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let cfg = Config {
        retry: Duration::from_millis(200),
        give_up: Some(Duration::from_secs(3)),
    };
    match reflector_proto::blocking::join(&sock, request(secret, group, player), cfg) {
        Ok((session, _)) => Ok((sock, session)),
        Err(reflector_proto::blocking::JoinError::Failed { failure, .. }) => Err(failure),
        Err(e) => panic!("player {player}: {e}"),
    }
}

/// Joins from a fresh socket: `Ok` once admitted, or the refusal.
pub fn join(secret: &[u8; 32], group: u16, player: u32) -> Result<(), Failure> {
    join_session(secret, group, player).map(|_| ())
}
