//! A small fleet on loopback: a Redis of the test's own (with a password),
//! two reflectors (`serve --registry`) and two control servers (`control
//! --registry`). Both control servers place every cell on a live reflector
//! and agree; a player joins where it is told with the token it got (the
//! token names the id the registry gave); `kill -9` of a reflector moves
//! its cells to the other within its TTL and a poll, and the player joins
//! there. Over TLS (`rediss://` with the fleet's CA file): the same
//! placement and join, and a wrong CA or a plain URL to the TLS port
//! stopping both programs with a message that names the problem.

mod support;

use reflector_registry::testing::{RedisServer, TestCa, TlsMode, PASSWORD};
use std::io::BufRead;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const SECRET: [u8; 32] = [0x44; 32];

struct Fleet {
    _redis: RedisServer,
    dir: Scratch,
    url: String,
    /// The registry flags beyond the URL and the password (TLS files).
    tls_args: Vec<String>,
}

impl Fleet {
    fn new() -> Fleet {
        Fleet::with_redis(RedisServer::start())
    }

    /// A fleet whose registry speaks TLS only, its certificate signed by a
    /// CA the programs are given with --registry-ca-file.
    fn over_tls() -> Fleet {
        let redis = RedisServer::start_tls(TlsMode::ServerOnly);
        let ca = redis.ca_file().expect("a TLS server's CA");
        let mut fleet = Fleet::with_redis(redis);
        fleet.tls_args = vec!["--registry-ca-file".into(), ca.to_str().unwrap().into()];
        fleet
    }

    fn with_redis(redis: RedisServer) -> Fleet {
        let dir = Scratch::new("fleet");
        std::fs::write(dir.0.join("secret"), hex(&SECRET)).unwrap();
        std::fs::write(dir.0.join("redis-password"), PASSWORD).unwrap();
        // The server's URL without its password (that goes in the file).
        let url = redis.url().replace(&format!(":{PASSWORD}@"), "");
        Fleet {
            _redis: redis,
            dir,
            url,
            tls_args: Vec::new(),
        }
    }

    fn registry_args(&self) -> Vec<String> {
        let mut args = vec![
            "--registry".into(),
            self.url.clone(),
            "--registry-password-file".into(),
            self.dir.0.join("redis-password").to_str().unwrap().into(),
        ];
        args.extend(self.tls_args.iter().cloned());
        args
    }

    fn reflector(&self) -> (Proc, u16) {
        self.reflector_with(&[])
    }

    /// A reflector of the fleet (registry TTL 1 s) with `extra` flags.
    fn reflector_with(&self, extra: &[&str]) -> (Proc, u16) {
        let mut args = self.registry_args();
        args.extend(["--registry-ttl".into(), "1s".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (p, group, _) = start_serve(&self.dir.0.join("secret"), &args);
        (p, group)
    }

    /// `reflector control` of the fleet (anonymous joins, a 2x2 world)
    /// with `registry` as its registry flags.
    fn control_command(&self, registry: &[String]) -> Command {
        self.control_command_from(Command::new(env!("CARGO_BIN_EXE_reflector")), registry)
    }

    /// The same from `c`, a command of the binary (in a namespace, say).
    fn control_command_from(&self, mut c: Command, registry: &[String]) -> Command {
        c.args([
            "control",
            "--anonymous-joins",
            "--listen",
            "127.0.0.1:0",
            "--grid",
            "2x2",
        ])
        .arg("--secret-file")
        .arg(self.dir.0.join("secret"))
        .args(registry)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        c
    }

    /// `reflector serve` of the fleet with `registry` as its registry flags.
    fn serve_command(&self, registry: &[String]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_reflector"));
        c.args(["serve", "--bind", "127.0.0.1", "--ports", &free_port().to_string()])
            .arg("--secret-file")
            .arg(self.dir.0.join("secret"))
            .args(registry)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        c
    }

    /// A control server (anonymous joins, a 2x2 world): it and its port.
    fn control(&self) -> (Proc, u16) {
        let mut child = self
            .control_command(&self.registry_args())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the reflector binary runs");
        let err = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut lines = err.lines();
        let port = loop {
            let line = lines.next().expect("the control server's start-up line").unwrap();
            if let Some(rest) = line.split("control server at ").nth(1) {
                break rest.split(':').nth(1).unwrap().parse::<u16>().unwrap();
            }
        };
        // Keep reading, so the pipe never fills.
        std::thread::spawn(move || for _ in lines {});
        (Proc(child), port)
    }
}

/// `/join` for `player` at the centre of `cell`: (status, reflector id,
/// reflector address, the whole answer).
fn join_at(control: u16, player: u32, cell: (u32, u32)) -> (u16, u16, Option<SocketAddr>, serde_json::Value) {
    let (x, y) = (cell.0 as f64 * 100.0 + 50.0, cell.1 as f64 * 100.0 + 50.0);
    let (code, body) = get_status(control, &format!("/join?player={player}&x={x}&y={y}"));
    let v: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_default();
    let id = v["reflector_id"].as_u64().unwrap_or(0) as u16;
    let addr = v["reflector"].as_str().and_then(|a| a.parse().ok());
    (code, id, addr, v)
}

/// The join request a `/join` answer makes (its token and session key).
fn request_of(answer: &serde_json::Value, player: u32) -> reflector_proto::client::JoinRequest {
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    };
    let token: [u8; 32] = unhex(answer["token"].as_str().unwrap()).try_into().unwrap();
    let session: [u8; 32] = unhex(answer["session_key"].as_str().unwrap()).try_into().unwrap();
    let reflector: SocketAddr = answer["reflector"].as_str().unwrap().parse().unwrap();
    reflector_proto::client::JoinRequest {
        reflector,
        group: reflector.port(),
        player,
        token,
        keys: reflector_proto::protocol::SessionKeys::from_session(session),
        first_seq: 1,
    }
}

/// Joins with a `/join` answer from a fresh socket: the socket once
/// admitted, or `None`.
fn join_with(answer: &serde_json::Value, player: u32) -> Option<UdpSocket> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let cfg = reflector_proto::client::Config {
        retry: Duration::from_millis(200),
        give_up: Some(Duration::from_secs(3)),
    };
    reflector_proto::blocking::join(&sock, request_of(answer, player), cfg).ok()?;
    Some(sock)
}

/// Waits (at most `secs`) until `f` holds.
fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

#[test]
fn two_control_servers_place_cells_on_live_reflectors_and_follow_a_crash() {
    let fleet = Fleet::new();
    let (r1, g1) = fleet.reflector();
    let (r2, g2) = fleet.reflector();
    let (_c1, p1) = fleet.control();
    let (_c2, p2) = fleet.control();
    let cells = [(0, 0), (1, 0), (0, 1), (1, 1)];
    wait_until("every cell placed on both control servers", 10, || {
        cells
            .iter()
            .all(|&c| join_at(p1, 1, c).0 == 200 && join_at(p2, 1, c).0 == 200)
    });
    let mut used = std::collections::HashSet::new();
    for &c in &cells {
        let (_, id1, a1, _) = join_at(p1, 1, c);
        let (_, id2, a2, _) = join_at(p2, 1, c);
        assert_eq!((id1, a1), (id2, a2), "cell {c:?}: both control servers agree");
        assert!([g1, g2].contains(&a1.unwrap().port()));
        used.insert(a1.unwrap().port());
    }
    assert_eq!(used.len(), 2, "the cells are spread over both reflectors");

    // A player joins where it is told: the token names the registry's id.
    let (_, id, addr, answer) = join_at(p1, 7, (0, 0));
    assert!(join_with(&answer, 7).is_some(), "joined reflector {id} at {addr:?}");

    // The reflector of cell (0, 0) dies: its cells move to the other.
    let mut reflectors = [r1, r2];
    let dead_port = addr.unwrap().port();
    let dead = usize::from(dead_port != g1);
    reflectors[dead].signal(nix::sys::signal::Signal::SIGKILL);
    let moved = wait_until("cell (0, 0) moved off the dead reflector", 6, || {
        let (code, _, a, _) = join_at(p1, 7, (0, 0));
        code == 200 && a.is_some_and(|a| a.port() != dead_port)
    });
    eprintln!("fleet: cell moved {moved:?} after kill -9 (TTL 1 s, polls every 1 s)");
    // The other control server polls on its own second: within one more.
    wait_until(
        "the other control server moved every cell off the dead reflector",
        3,
        || {
            cells
                .iter()
                .all(|&c| join_at(p2, 1, c).2.is_some_and(|a| a.port() != dead_port))
        },
    );
    let (_, _, _, answer) = join_at(p2, 7, (0, 0));
    assert!(join_with(&answer, 7).is_some(), "joined the live reflector");
    assert!(reflectors[1 - dead].alive());
}

#[test]
fn a_reflector_whose_cells_went_elsewhere_tells_its_members_to_move() {
    let fleet = Fleet::new();
    let (_r1, g1) = fleet.reflector();
    let (_r2, g2) = fleet.reflector();
    let (_c, port) = fleet.control();
    wait_until("cell (0, 0) placed", 10, || join_at(port, 1, (0, 0)).0 == 200);
    let (_, here_id, here, answer) = join_at(port, 5, (0, 0));
    let here = here.unwrap();
    let keys = request_of(&answer, 5).keys;
    let sock = join_with(&answer, 5).expect("joined");
    // Where the other reflector is: the group of a cell placed there.
    let cells = [(0, 0), (1, 0), (0, 1), (1, 1)];
    let (there_id, there) = cells
        .iter()
        .map(|&c| join_at(port, 1, c))
        .find(|(_, _, a, _)| a.is_some_and(|a| a.port() != here.port()))
        .map(|(_, id, a, _)| (id, a.unwrap()))
        .expect("a cell on the other reflector");
    assert!([g1, g2].contains(&there.port()));
    // As a control server that took this reflector for dead (cut off from
    // the registry a while) would have: every cell of it placed elsewhere.
    for (x, y) in cells {
        let field = format!("{x},{y}");
        if join_at(port, 1, (x, y)).1 == here_id {
            let set = Command::new("redis-cli")
                .args([
                    "-p",
                    &fleet._redis.port.to_string(),
                    "--no-auth-warning",
                    "-a",
                    PASSWORD,
                ])
                .args([
                    "HSET",
                    "reflector:cells",
                    &field,
                    &format!("{there_id}:{}", there.port()),
                ])
                .output()
                .expect("redis-cli runs (Debian package redis-tools, with redis-server)");
            assert!(set.status.success());
        }
    }
    // Its member is told (after two TTLs, in case the registry was only
    // restarting), under its own key, that the cell is served elsewhere.
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 256];
    let moved = loop {
        assert!(t0.elapsed() < Duration::from_secs(8), "no MOVED came");
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let Ok(p) = reflector_proto::protocol::Packet::parse(&buf[..n]) else {
            continue;
        };
        if p.kind() == reflector_proto::protocol::Kind::Moved && from == here && keys.verify(&p) {
            break p.moved().unwrap();
        }
    };
    assert_eq!(moved.reason, Ok(reflector_proto::protocol::MovedReason::Reassigned));
    assert!(
        t0.elapsed() >= Duration::from_millis(1_500),
        "not before two TTLs: {:?}",
        t0.elapsed()
    );
    // And the control server sends it there.
    let (_, id, a, _) = join_at(port, 5, (0, 0));
    assert_eq!((id, a), (there_id, Some(there)));
}

/// A game client (the client library) placed by a control server of the
/// fleet, at the centre of cell (0, 0).
fn game_client(control: u16, player: u32) -> reflector_client::Client {
    let cfg = reflector_client::Config {
        local: "127.0.0.1:0".into(),
        ..reflector_client::Config::new(reflector_client::TokenSource::Control(
            reflector_client::ControlServer {
                url: format!("http://127.0.0.1:{control}"),
                fallback_urls: Vec::new(),
                ticket: None,
                player,
                position: (50.0, 50.0),
                ca_file: None,
                allow_plain_http: true,
            },
        ))
    };
    reflector_client::Client::new(cfg).expect("the client starts")
}

#[test]
fn a_drained_reflector_hands_its_players_to_another_and_stops_when_empty() {
    let fleet = Fleet::new();
    let (r1, g1) = fleet.reflector_with(&["--drain-timeout", "20s"]);
    let (r2, g2) = fleet.reflector_with(&["--drain-timeout", "20s"]);
    let (_c, port) = fleet.control();
    wait_until("cell (0, 0) placed", 10, || join_at(port, 1, (0, 0)).0 == 200);
    let mut player = game_client(port, 21);
    let t0 = Instant::now();
    while !player.is_member() {
        assert!(t0.elapsed() < Duration::from_secs(5), "the player never joined");
        player.update(Instant::now());
        std::thread::sleep(Duration::from_millis(5));
    }
    let first = player.sending_group().unwrap();
    let mut reflectors = [(r1, g1), (r2, g2)];
    let i = usize::from(first != g1);
    assert_eq!(reflectors[i].1, first);
    // Drain the player's reflector: the registry marks it, the control
    // server places the cell on the other, the player is told and follows.
    reflectors[i].0.signal(nix::sys::signal::Signal::SIGTERM);
    let mut events = Vec::new();
    let t0 = Instant::now();
    let mut told = None;
    while player.sending_group() == Some(first) || !player.is_member() {
        assert!(t0.elapsed() < Duration::from_secs(10), "not moved: {events:?}");
        player.update(Instant::now());
        while let Some(e) = player.poll_event() {
            if matches!(e, reflector_client::Event::MoveAsked { .. }) {
                told.get_or_insert_with(Instant::now);
            }
            events.push(e);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let moved_after = t0.elapsed();
    // In a fleet the drained reflector tells its members once their cell is
    // placed elsewhere, so the first answer is the new placement: the move
    // window (told -> sending through the new reflector) is a request and a
    // join, not a poll of the registry.
    let window = told.expect("told to move").elapsed();
    assert!(window < Duration::from_secs(1), "move window {window:?}: {events:?}");
    assert_eq!(player.sending_group(), Some(reflectors[1 - i].1));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, reflector_client::Event::MoveAsked { reason: 1, .. })),
        "{events:?}"
    );
    // With its last member gone, the drained reflector stops by itself.
    let t1 = Instant::now();
    let status = loop {
        player.update(Instant::now());
        if let Some(st) = reflectors[i].0.exited_within(Duration::from_millis(20)) {
            break st;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "the drained reflector did not stop"
        );
    };
    assert!(status.success(), "{status:?}");
    eprintln!(
        "fleet: the player moved {moved_after:?} after SIGTERM (move window {window:?}); the reflector stopped {:?} later",
        t1.elapsed()
    );
    assert!(reflectors[1 - i].0.alive());
}

/// What `cmd` printed on stderr, once it exited (within 10 s) with a
/// failure status; a program that goes on running or succeeds fails the test.
fn refusal(mut cmd: Command) -> String {
    let mut p = Proc(cmd.stderr(Stdio::piped()).spawn().expect("the reflector binary runs"));
    let status = p
        .exited_within(Duration::from_secs(10))
        .expect("it should stop at once, naming the problem");
    let mut err = String::new();
    std::io::Read::read_to_string(p.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success(), "exited 0: {err}");
    err
}

#[test]
fn a_fleet_over_tls_places_cells_and_a_player_joins_where_it_is_told() {
    let fleet = Fleet::over_tls();
    assert!(fleet.url.starts_with("rediss://127.0.0.1:"), "{}", fleet.url);
    let (_r1, g1) = fleet.reflector();
    let (_c, port) = fleet.control();
    wait_until("cell (0, 0) placed over TLS", 10, || join_at(port, 1, (0, 0)).0 == 200);
    let (_, id, addr, answer) = join_at(port, 9, (0, 0));
    assert_eq!(
        addr.map(|a| a.port()),
        Some(g1),
        "placed on the reflector that registered over TLS"
    );
    assert!(id >= 1, "the token names the id the registry gave");
    assert!(join_with(&answer, 9).is_some(), "joined reflector {id} at {addr:?}");
}

#[test]
fn a_wrong_ca_or_a_plain_url_to_the_tls_port_stops_both_programs_naming_it() {
    let fleet = Fleet::over_tls();
    let other = fleet.dir.0.join("other-ca.pem");
    TestCa::new("not the fleet's CA").write(&other);
    let password = fleet.dir.0.join("redis-password").to_str().unwrap().to_string();
    let wrong_ca: Vec<String> = vec![
        "--registry".into(),
        fleet.url.clone(),
        "--registry-password-file".into(),
        password.clone(),
        "--registry-ca-file".into(),
        other.to_str().unwrap().into(),
    ];
    let plain: Vec<String> = vec![
        "--registry".into(),
        fleet.url.replace("rediss://", "redis://"),
        "--registry-password-file".into(),
        password,
    ];
    for (name, cmd) in [
        ("serve", fleet.serve_command(&wrong_ca)),
        ("control", fleet.control_command(&wrong_ca)),
    ] {
        let err = refusal(cmd);
        eprintln!("{name} refused: {}", err.trim());
        assert!(
            err.contains("does not verify against the CA file") && err.contains("other-ca.pem"),
            "{name}: {err}"
        );
    }
    for (name, cmd) in [
        ("serve", fleet.serve_command(&plain)),
        ("control", fleet.control_command(&plain)),
    ] {
        let err = refusal(cmd);
        eprintln!("{name} refused: {}", err.trim());
        assert!(
            err.contains("is a TLS port") && err.contains("use rediss://"),
            "{name}: {err}"
        );
    }
}

/// A plain redis:// URL to another host's address is warned about, once:
/// in a namespace of the test's own, 10.77.0.1 on its loopback device stands
/// for that host (no traffic leaves the namespace).
#[test]
fn a_plain_url_to_another_host_is_warned_about_once() {
    use oskit::testing::{root_or_skip, sh, NetNsGuard};
    if !root_or_skip("a_plain_url_to_another_host_is_warned_about_once") {
        return;
    }
    let fleet = Fleet::new();
    let ns = NetNsGuard::new("rtw");
    sh(&["ip", "-n", ns.name(), "addr", "add", "10.77.0.1/32", "dev", "lo"]);
    let _redis = Proc(
        ns.command("redis-server")
            .args(["--bind", "10.77.0.1", "--port", "6379", "--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&fleet.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server runs"),
    );
    wait_until("redis-server listens in the namespace", 10, || {
        ns.run(|| std::net::TcpStream::connect("10.77.0.1:6379").is_ok())
    });
    let registry: Vec<String> = vec![
        "--registry".into(),
        "redis://10.77.0.1:6379".into(),
        "--registry-password-file".into(),
        fleet.dir.0.join("redis-password").to_str().unwrap().into(),
    ];
    let mut control = Proc(
        fleet
            .control_command_from(ns.command(env!("CARGO_BIN_EXE_reflector")), &registry)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the reflector binary runs"),
    );
    // Up to its first poll that reached the registry (it works, in clear),
    // and one more: the warning is said at start, and not again.
    let lines = std::io::BufReader::new(control.0.stderr.take().unwrap()).lines();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut printed = Vec::new();
    let t0 = Instant::now();
    let mut reachable_at = None;
    while reachable_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(1_500)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never reached the registry: {printed:?}"
        );
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            if l.contains("reachable") {
                reachable_at.get_or_insert_with(Instant::now);
            }
            printed.push(l);
        }
    }
    let warnings = printed.iter().filter(|l| l.contains("in clear")).count();
    assert_eq!(warnings, 1, "{printed:#?}");
    assert!(
        printed
            .iter()
            .any(|l| l.contains("in clear") && l.contains("rediss://")),
        "the warning says what to do: {printed:#?}"
    );
    drop(control);
}
