//! Test helpers: a real reflector in-process on 127.0.0.1, tokens minted
//! with its secret, the built library's folder, the external tools (cc,
//! python3, mcs, mono) and running a player program with a deadline.

#![allow(dead_code, reason = "each test file uses a part of the helpers")]

use reflector_client::{Client, Config, TokenSource};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::protocol::SessionKeys;
use reflector_server::backend::BackendKind;
use reflector_server::checkpoint::CheckpointConfig;
use reflector_server::membership::Policy;
use reflector_server::metrics::Snapshot;
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
        Reflector::start_with(None)
    }

    /// One with its checkpoint channel on, asking each group for a
    /// checkpoint every `every_ms`.
    pub fn start_checkpoints(every_ms: u64) -> Reflector {
        let r = Reflector::start_with(Some(CheckpointConfig {
            every_ms,
            ..CheckpointConfig::default()
        }));
        assert!(
            r.server.checkpoint_port().is_some_and(|p| p != 0),
            "the channel is bound"
        );
        r
    }

    /// `groups` groups on free ports (instance ids on): the cells of a
    /// world (see [`area_control_server`]); `port` is the first.
    pub fn start_groups(groups: usize) -> Reflector {
        Reflector::start_ports(vec![0; groups], None)
    }

    fn start_with(checkpoint: Option<CheckpointConfig>) -> Reflector {
        Reflector::start_ports(vec![0], checkpoint)
    }

    /// One sealed group (`serve --data-sealed on`).
    pub fn start_sealed() -> Reflector {
        Reflector::start_policy(vec![0], None, true)
    }

    /// `groups` sealed groups (`serve --data-sealed on`) with the
    /// checkpoint channel on, asking each group for a checkpoint every
    /// 200 ms, fetches unpaced: the cells of [`sealing_control_server`].
    pub fn start_sealed_checkpoints(groups: usize) -> Reflector {
        let ck = CheckpointConfig {
            every_ms: 200,
            fetch_every_ms: 0,
            ..CheckpointConfig::default()
        };
        let r = Reflector::start_policy(vec![0; groups], Some(ck), true);
        assert!(
            r.server.checkpoint_port().is_some_and(|p| p != 0),
            "the channel is bound"
        );
        r
    }

    fn start_ports(ports: Vec<u16>, checkpoint: Option<CheckpointConfig>) -> Reflector {
        Reflector::start_policy(ports, checkpoint, false)
    }

    fn start_policy(ports: Vec<u16>, checkpoint: Option<CheckpointConfig>, sealed: bool) -> Reflector {
        let cfg = ServerConfig {
            ports,
            policy: Policy {
                keepalive_ms: 500,
                data_instance: true,
                data_sealed: sealed,
                ..Policy::default()
            },
            checkpoint,
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

    /// Every group's port, in the order the groups were given.
    pub fn ports(&self) -> Vec<u16> {
        self.server.ports().to_vec()
    }

    /// The reflector's counters, summed over its groups.
    pub fn counters(&self) -> Snapshot {
        self.server.registry().total()
    }

    pub fn stop(self) {
        self.server.stop();
        self.server.join().expect("the reflector stops cleanly");
    }
}

/// A real control server over plain HTTP on loopback (anonymous joins,
/// tokens for 300 s, the reflector's secret) for a row of `r`'s groups:
/// a world of one row of 100-unit cells, cell i served by group i.
pub fn area_control_server(r: &Reflector) -> reflector_control::ControlServer {
    row_control_server(r, None)
}

/// The master secret of [`sealing_control_server`]'s world.
pub const SEALING_MASTER: [u8; 32] = [0x5e; 32];
/// Its world name.
pub const SEALING_WORLD: &str = "capi tests";

/// [`area_control_server`] with a sealing secret: its grants carry epoch
/// keys (`keys`), and with `sign_key` asked `control_public` and a
/// `certificate` (the default schedule: epochs of 600 s, 60 s of jitter).
pub fn sealing_control_server(r: &Reflector) -> reflector_control::ControlServer {
    use reflector_proto::sealed::{MasterSecret, Schedule};
    let sealing = reflector_control::sealing::Sealing::new(
        MasterSecret::new(&SEALING_MASTER).expect("a long enough master secret"),
        SEALING_WORLD,
        Schedule::new(600, 60).expect("a valid schedule"),
        100.0,
    );
    row_control_server(r, Some(Arc::new(sealing)))
}

/// The control server of [`area_control_server`], with `sealing` if given.
fn row_control_server(
    r: &Reflector,
    sealing: Option<Arc<reflector_control::sealing::Sealing>>,
) -> reflector_control::ControlServer {
    use reflector_control::{Assign, ControlConfig, ReflectorSpec, World};
    let ports = r.ports();
    let mut world = World::new(
        ports.len() as u32,
        1,
        100.0,
        Assign::RoundRobin,
        &[ReflectorSpec {
            ip: [127, 0, 0, 1].into(),
            ports,
        }],
    )
    .expect("a world");
    if let Some(sealing) = sealing {
        world = world.with_sealing(sealing).expect("one cell per group");
    }
    reflector_control::ControlServer::start_with(
        ControlConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            world,
            secret: Secret::new(&SECRET).expect("a valid secret").into(),
            token_ttl_s: 300,
            auth: None,
        },
        reflector_http::Limits::default(),
        None,
        Arc::new(AtomicBool::new(false)),
    )
    .expect("the control server starts")
}

/// What a game's backend does for a sealed group: `GET
/// /join?player=P&x=X&y=Y&sign_key=HEX` of the control server at `url`;
/// the answer's cell grant (token, keys, `control_public`, `certificate`).
pub fn sealed_join(
    url: &str,
    player: u32,
    (x, y): (f64, f64),
    sign_key: &[u8],
) -> reflector_proto::control::KeyedGrant {
    let answer: reflector_proto::control::KeyedAreaGrant = ureq::get(&format!("{url}/join"))
        .query("player", &player.to_string())
        .query("x", &x.to_string())
        .query("y", &y.to_string())
        .query("sign_key", &hex(sign_key))
        .timeout(Duration::from_secs(5))
        .call()
        .expect("the control server answers /join")
        .into_json()
        .expect("the /join JSON");
    assert!(
        !answer.cell.keys.is_empty() && answer.cell.certificate.is_some(),
        "a control server with a sealing secret, asked with sign_key, hands out keys and a certificate"
    );
    answer.cell
}

/// The centre of cell `x` of [`area_control_server`]'s row.
pub fn centre(x: usize) -> (f64, f64) {
    (x as f64 * 100.0 + 50.0, 50.0)
}

/// An `http://` URL on loopback where nothing listens (a port just freed):
/// a control server that is down.
pub fn down_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let addr = l.local_addr().expect("its address");
    drop(l);
    format!("http://{addr}")
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
            keys: Vec::new(),
        }
    }
}

pub fn mint(player: u32, r: &Reflector) -> Minted {
    mint_for(player, r.group())
}

/// A token of `player` for `group` (any port of the test's reflector).
pub fn mint_for(player: u32, group: u16) -> Minted {
    let secret = Secret::new(&SECRET).expect("a valid secret");
    let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 300;
    let token = TokenClaims {
        player,
        reflector: 0,
        group,
        expires_unix_s,
    }
    .sign(&secret);
    Minted {
        player,
        group,
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
    let out = if static_lib { "grid-static" } else { "grid" };
    build_grid_with(cc, static_lib, &crate_dir().join("include"), out)
}

/// `build_grid` against the header in `include` (an older version's, to
/// check that its programs run on this library), into `name`.
pub fn build_grid_with(cc: &Path, static_lib: bool, include: &Path, name: &str) -> PathBuf {
    let lib = lib_dir();
    let out = scratch("c").join(name);
    let mut cmd = Command::new(cc);
    cmd.args([
        "-std=c99",
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
    ])
    .arg(include)
    .arg(crate_dir().join("examples/c/grid.c"))
    .arg("-o")
    .arg(&out);
    if static_lib {
        cmd.arg(lib.join("libreflector_c.a")).args(["-lpthread", "-ldl", "-lm"]);
    } else {
        cmd.arg("-L")
            .arg(&lib)
            // DT_RPATH, not RUNPATH: it wins over the LD_LIBRARY_PATH cargo
            // sets for tests, which may name a stale copy of the library.
            .arg("-Wl,--disable-new-dtags")
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
    build_csharp(mcs, "Player.cs", "player.exe")
}

/// Compiles the C# binding and the example program `main` (a file of
/// bindings/csharp) with `mcs` (C# 7) into `exe`.
pub fn build_csharp(mcs: &Path, main: &str, exe: &str) -> PathBuf {
    build_csharp_from(mcs, &crate_dir().join("bindings/csharp").join(main), exe)
}

/// Compiles the C# binding and the program at `main` (an example, or a
/// test program of tests/csharp) with `mcs` (C# 7) into `exe`.
pub fn build_csharp_from(mcs: &Path, main: &Path, exe: &str) -> PathBuf {
    let out = scratch("csharp").join(exe);
    let src = crate_dir().join("bindings/csharp");
    let mut cmd = Command::new(mcs);
    cmd.arg("-langversion:7")
        .arg("-warnaserror")
        .arg(format!("-out:{}", out.display()))
        .arg(src.join("ReflectorClient.cs"))
        .arg(main);
    let (o, e, ok) = run(cmd, Duration::from_secs(120));
    assert!(ok, "the C# binding and {} do not build:\n{o}\n{e}", main.display());
    out
}

/// A Rust player (the client crate) asking the control server at `url`
/// for the group of its cell at `position` (radius 0): sends its position
/// every 50 ms once a member, until `stop`; returns the players it heard.
pub fn rust_cell_player(url: &str, player: u32, position: (f64, f64), stop: &AtomicBool) -> BTreeSet<u32> {
    use reflector_client::ControlServer;
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(ControlServer {
            allow_plain_http: true,
            ..ControlServer::new(url, player, position)
        }))
    };
    let mut c = Client::new(cfg).expect("the Rust client starts");
    let mut heard = BTreeSet::new();
    let mut last = Instant::now();
    // Bounded: the caller stops it within a minute.
    let end = Instant::now() + Duration::from_secs(60);
    while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < end {
        let now = Instant::now();
        c.update(now);
        while c.poll_event().is_some() {}
        while let Some(d) = c.recv() {
            heard.insert(d.sender);
        }
        if c.is_member() && now.duration_since(last) >= Duration::from_millis(50) {
            last = now;
            c.send(b"pos").expect("a member sends");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    heard
}

/// The size of the state the example players hand in for a checkpoint.
pub const STATE_LEN: usize = 20_000;

/// The state an example player (grid.c, player.py, Player.cs) hands in at
/// `tick`: each computes the same bytes from its id and the tick.
pub fn example_state(player: u32, tick: u64) -> Vec<u8> {
    (0..STATE_LEN as u64)
        .map(|i| ((i * 7 + (i >> 8) + u64::from(player) * 13 + tick) & 0xff) as u8)
        .collect()
}

/// 64-bit FNV-1a, as the example players print a fetched state's.
pub fn fnv1a(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An `uploaded ME number N tick T size S` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploaded {
    pub player: u32,
    pub number: u64,
    pub tick: u64,
    pub size: usize,
}

/// A `checkpoint ME from P number N tick T size S fnv1a H` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fetched {
    pub player: u32,
    pub from: u32,
    pub number: u64,
    pub tick: u64,
    pub size: usize,
    pub fnv1a: u64,
}

/// The `uploaded` lines of a player program's output.
pub fn uploads(stdout: &str) -> Vec<Uploaded> {
    stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["uploaded", p, "number", n, "tick", t, "size", s] => Some(Uploaded {
                    player: p.parse().ok()?,
                    number: n.parse().ok()?,
                    tick: t.parse().ok()?,
                    size: s.parse().ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The `checkpoint` lines of a player program's output.
pub fn fetches(stdout: &str) -> Vec<Fetched> {
    stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["checkpoint", p, "from", f, "number", n, "tick", t, "size", s, "fnv1a", h] => Some(Fetched {
                    player: p.parse().ok()?,
                    from: f.parse().ok()?,
                    number: n.parse().ok()?,
                    tick: t.parse().ok()?,
                    size: s.parse().ok()?,
                    fnv1a: u64::from_str_radix(h, 16).ok()?,
                }),
                _ => None,
            }
        })
        .collect()
}

/// The `got ME SENDER SEQ` lines (numbered datagrams received, `--owed`).
pub fn got(stdout: &str) -> Vec<(u32, u32, u64)> {
    stdout
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["got", r, s, k] => Some((r.parse().ok()?, s.parse().ok()?, k.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

/// A Rust player in the `--owed K:N` protocol of the example programs:
/// sends its position every 50 ms; once it heard `group_size - 1` others
/// (all are members then) sends `owed` numbered datagrams ("n SEQ", one a
/// frame) and "done"; stops 300 ms after its own are out and every other
/// player's "done" came, or after `cap`. Returns the same lines the
/// programs print (`got`, `complete`, `heard`).
pub fn rust_owed_player(r: &Reflector, m: &Minted, owed: u64, group_size: usize, cap: Duration) -> String {
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(m.client_token(r)))
    };
    let mut c = Client::new(cfg).expect("the Rust client starts");
    let me = m.player;
    let mut out = String::new();
    let mut heard = BTreeSet::new();
    let mut done_from = BTreeSet::new();
    let (mut sent, mut done_sent, mut complete_at) = (0u64, false, None::<Instant>);
    let end = Instant::now() + cap;
    let mut last = Instant::now();
    for _ in 0..1_000_000 {
        let now = Instant::now();
        if now >= end || complete_at.is_some_and(|t| now.duration_since(t) >= Duration::from_millis(300)) {
            break;
        }
        c.update(now);
        while c.poll_event().is_some() {}
        while c.poll_checkpoint().is_some() {}
        while let Some(d) = c.recv() {
            let text = String::from_utf8_lossy(d.payload);
            if let Some(k) = text.strip_prefix("n ") {
                out.push_str(&format!("got {me} {} {k}\n", d.sender));
            } else if text == "done" {
                done_from.insert(d.sender);
            }
            heard.insert(d.sender);
        }
        if c.is_member() && now.duration_since(last) >= Duration::from_millis(50) {
            last = now;
            c.send(b"pos 0 3").expect("a member sends");
        }
        if heard.len() + 1 >= group_size && c.is_member() {
            if sent < owed {
                c.send(format!("n {sent}").as_bytes()).expect("a member sends");
                sent += 1;
            } else if !done_sent {
                c.send(b"done").expect("a member sends");
                done_sent = true;
            }
        }
        if done_sent && done_from.len() + 1 >= group_size && complete_at.is_none() {
            complete_at = Some(now);
            out.push_str(&format!("complete {me}\n"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in heard {
        out.push_str(&format!("heard {me} {h}\n"));
    }
    out
}

/// What a binding's keys_from test prints (`KeysFrom.cs`, the Python
/// script): the library's refusals of plain HTTP for the keys_from URL
/// (`url`) and a fallback and of an empty URL, then `refreshed REQUESTS
/// REFRESHES FAILURES` of the client with keys_from, which must have asked
/// `/keys` and refreshed with no failure. `err` goes into the messages.
pub fn assert_keys_from_output(out: &str, err: &str, url: &str) {
    assert!(
        out.contains(&format!(
            "plain refused -2 refusing plain HTTP to {url} (the keys_from URL)"
        )),
        "{out}"
    );
    assert!(out.contains("empty refused -2 the keys_from URL is empty"), "{out}");
    assert!(
        out.contains("fallback refused -2 refusing plain HTTP to http://control-b.example (the fallback URL)"),
        "{out}"
    );
    let line = out.lines().find(|l| l.starts_with("refreshed ")).unwrap_or_default();
    let n: Vec<u64> = line.split_whitespace().skip(1).filter_map(|w| w.parse().ok()).collect();
    assert!(
        n.len() == 3 && n[0] >= 1 && n[1] >= 1 && n[2] == 0,
        "requests, refreshes, failures: {line:?}\n{out}\n{err}"
    );
}
