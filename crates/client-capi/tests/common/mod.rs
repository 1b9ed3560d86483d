//! Test helpers: a real reflector in-process on 127.0.0.1, tokens minted
//! with its secret, the built library's folder, the external tools (cc,
//! python3, mcs, mono) and running a player program with a deadline.

#![allow(dead_code, reason = "each test file uses a part of the helpers")]

use reflector_client::{Client, Config, TokenSource};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::protocol::SessionKeys;
use reflector_server::backend::BackendKind;
use reflector_server::membership::Policy;
use reflector_server::server::{Server, ServerConfig};
use std::collections::BTreeSet;
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x5a; 32];

/// A reflector on 127.0.0.1 with one group (its port's number).
pub struct Reflector {
    server: Server,
    pub port: u16,
}

impl Reflector {
    pub fn start() -> Reflector {
        let cfg = ServerConfig {
            ports: vec![0],
            policy: Policy {
                keepalive_ms: 500,
                data_instance: true,
                ..Policy::default()
            },
            ..ServerConfig::new(
                [127, 0, 0, 1].into(),
                Secret::new(&SECRET).expect("a valid secret"),
                BackendKind::Sendto,
            )
        };
        let server = Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("the reflector starts");
        let port = server.ports()[0];
        Reflector { server, port }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn group(&self) -> u16 {
        self.port
    }

    pub fn stop(self) {
        self.server.stop();
        self.server.join().expect("the reflector stops cleanly");
    }
}

/// A token as the control server would issue it.
pub struct Minted {
    pub player: u32,
    pub group: u16,
    pub expires_unix_s: u64,
    pub token: [u8; 32],
    pub session_key: [u8; 32],
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Minted {
    /// `PLAYER:GROUP:EXPIRES:TOKEN_HEX:KEY_HEX`, as the example programs
    /// take a player.
    pub fn spec(&self) -> String {
        format!(
            "{}:{}:{}:{}:{}",
            self.player,
            self.group,
            self.expires_unix_s,
            hex(&self.token),
            hex(&self.session_key)
        )
    }

    pub fn client_token(&self, r: &Reflector) -> reflector_client::Token {
        reflector_client::Token {
            reflector: r.addr().to_string(),
            group: self.group,
            player: self.player,
            token: self.token,
            session_key: self.session_key,
            expires_unix_s: self.expires_unix_s,
        }
    }
}

pub fn mint(player: u32, r: &Reflector) -> Minted {
    let secret = Secret::new(&SECRET).expect("a valid secret");
    let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 300;
    let token = TokenClaims {
        player,
        reflector: 0,
        group: r.group(),
        expires_unix_s,
    }
    .sign(&secret);
    Minted {
        player,
        group: r.group(),
        expires_unix_s,
        token,
        session_key: SessionKeys::derive(&secret, &token).session,
    }
}

/// Whether tests that need outside tools must run (CI sets it).
pub fn required() -> bool {
    std::env::var_os("REQUIRE_ROOT_TESTS").is_some_and(|v| v == "1")
}

/// The tool `name` on PATH; `None` (the test skips, saying why) when it is
/// missing, unless REQUIRE_ROOT_TESTS=1, when a missing tool fails.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let why = format!("{name} is not installed (scripts/install-deps.sh installs it)");
        assert!(!required(), "REQUIRE_ROOT_TESTS=1 and {why}");
        eprintln!("SKIPPED: {why}");
    }
    found
}

/// The folder holding the freshly built libreflector_c.so (cargo builds
/// the library's cdylib beside this test binary, in deps/).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's folder").to_path_buf();
    for d in [deps.clone(), deps.parent().map(Path::to_path_buf).unwrap_or_default()] {
        if d.join("libreflector_c.so").is_file() {
            return d;
        }
    }
    panic!("libreflector_c.so is not beside {} nor in its parent", exe.display());
}

pub fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A scratch folder for build outputs, inside the target folder.
pub fn scratch(name: &str) -> PathBuf {
    let d = lib_dir().join("capi-tests").join(name);
    std::fs::create_dir_all(&d).expect("make a scratch folder");
    d
}

/// Runs `cmd`, killing it after `within`; its stdout, stderr and success.
pub fn run(mut cmd: Command, within: Duration) -> (String, String, bool) {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        out.read_to_string(&mut s).ok();
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        err.read_to_string(&mut s).ok();
        s
    });
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (o, e) = (t_out.join().unwrap_or_default(), t_err.join().unwrap_or_default());
    assert!(
        status.is_some(),
        "{what} did not end within {within:?}; stdout:\n{o}\nstderr:\n{e}"
    );
    (o, e, status.is_some_and(|s| s.success()))
}

/// The `heard ME OTHER` lines of a player program's output.
pub fn heard(stdout: &str) -> BTreeSet<(u32, u32)> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            match (w.next(), w.next(), w.next(), w.next()) {
                (Some("heard"), Some(a), Some(b), None) => Some((a.parse().ok()?, b.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// Asserts every player in `players` heard every other.
pub fn assert_all_heard(heard: &BTreeSet<(u32, u32)>, players: &[u32], output: &str) {
    let mut missing = Vec::new();
    for &a in players {
        for &b in players {
            if a != b && !heard.contains(&(a, b)) {
                missing.push((a, b));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "these (listener, sender) pairs were not heard: {missing:?}; output:\n{output}"
    );
}

/// Compiles examples/c/grid.c against the header and the shared library
/// (`static_lib`: the static one, with the system libraries Rust's std
/// needs on Linux).
pub fn build_grid(cc: &Path, static_lib: bool) -> PathBuf {
    let lib = lib_dir();
    let out = scratch("c").join(if static_lib { "grid-static" } else { "grid" });
    let mut cmd = Command::new(cc);
    cmd.args([
        "-std=c99",
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
    ])
    .arg(crate_dir().join("include"))
    .arg(crate_dir().join("examples/c/grid.c"))
    .arg("-o")
    .arg(&out);
    if static_lib {
        cmd.arg(lib.join("libreflector_c.a")).args(["-lpthread", "-ldl", "-lm"]);
    } else {
        cmd.arg("-L")
            .arg(&lib)
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lreflector_c");
    }
    let (o, e, ok) = run(cmd, Duration::from_secs(120));
    assert!(ok, "grid.c does not build:\n{o}\n{e}");
    out
}

/// A Rust player (the client crate directly) for `seconds`: sends its
/// position every 50 ms once a member; returns the (ME, OTHER) pairs heard.
pub fn rust_player(r: &Reflector, m: &Minted, seconds: u64) -> BTreeSet<(u32, u32)> {
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(m.client_token(r)))
    };
    let mut c = Client::new(cfg).expect("the Rust client starts");
    let mut heard = BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut last = Instant::now();
    let mut x = 0u32;
    while Instant::now() < end {
        let now = Instant::now();
        c.update(now);
        while c.poll_event().is_some() {}
        while let Some(d) = c.recv() {
            heard.insert((m.player, d.sender));
        }
        if c.is_member() && now.duration_since(last) >= Duration::from_millis(50) {
            last = now;
            x = (x + 1) % 16;
            c.send(format!("pos {x} 0").as_bytes()).expect("a member sends");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    heard
}

/// Compiles the C# binding and its example player with `mcs` (C# 7).
pub fn build_player_exe(mcs: &Path) -> PathBuf {
    let out = scratch("csharp").join("player.exe");
    let src = crate_dir().join("bindings/csharp");
    let mut cmd = Command::new(mcs);
    cmd.arg("-langversion:7")
        .arg("-warnaserror")
        .arg(format!("-out:{}", out.display()))
        .arg(src.join("ReflectorClient.cs"))
        .arg(src.join("Player.cs"));
    let (o, e, ok) = run(cmd, Duration::from_secs(120));
    assert!(ok, "the C# binding does not build:\n{o}\n{e}");
    out
}
