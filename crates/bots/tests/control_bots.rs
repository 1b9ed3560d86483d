//! Loopback end to end: an in-process reflector, control server and bots
//! (library calls, not the CLI), on 127.0.0.1 only, with free ports.
//! Every run is bounded by the bots' duration and grace period.

use reflector_bots::{run_bots, BotsConfig};
use reflector_control::{Assign, ControlConfig, ControlServer, ReflectorSpec, World};
use reflector_proto::auth::Secret;
use reflector_server::backend::BackendKind;
use reflector_server::backend_matrix;
use reflector_server::checkpoint::CheckpointConfig;
use reflector_server::server::{Server, ServerConfig};
use reflector_server::testing::Case;
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

const LOCAL: [u8; 4] = [127, 0, 0, 1];

struct Setup {
    server: Server,
    control: ControlServer,
}

/// A reflector with `groups` free ports and a control server mapping a
/// `grid` world onto them, sharing one secret.
fn setup(backend: impl Into<Case>, groups: usize, grid: (u32, u32)) -> Setup {
    setup_with_stop(backend, groups, grid, Arc::new(AtomicBool::new(false)))
}

fn setup_with_stop(backend: impl Into<Case>, groups: usize, grid: (u32, u32), stop: Arc<AtomicBool>) -> Setup {
    setup_full(backend, groups, grid, stop, None, None)
}

fn setup_full(
    backend: impl Into<Case>,
    groups: usize,
    grid: (u32, u32),
    stop: Arc<AtomicBool>,
    auth: Option<Arc<reflector_control::players::JoinAuth>>,
    checkpoint: Option<CheckpointConfig>,
) -> Setup {
    let secret = Secret::new(&[0x5a; 32]).unwrap();
    let server = Server::start(
        ServerConfig {
            ports: vec![0; groups],
            threads: 2,
            checkpoint,
            ..backend.into().config(IpAddr::from(LOCAL), secret.clone())
        },
        stop,
    )
    .unwrap();
    let world = World::new(
        grid.0,
        grid.1,
        100.0,
        Assign::RoundRobin,
        &[ReflectorSpec {
            ip: IpAddr::from(LOCAL),
            ports: server.ports().to_vec(),
        }],
    )
    .unwrap();
    let control = ControlServer::start(
        ControlConfig {
            listen: (LOCAL, 0).into(),
            world,
            secret: secret.into(),
            token_ttl_s: 60,
            auth,
        },
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    Setup { server, control }
}

fn bots(control: &ControlServer, n: usize) -> BotsConfig {
    let mut c = BotsConfig::new(&control.url(), n);
    c.bind = IpAddr::from(LOCAL);
    c.grace = Duration::from_secs(2);
    c
}

/// N bots in one group, M datagrams each, no moves: every bot receives
/// exactly (N-1)*M and the reflector's counters agree.
fn fixed_count(backend: Case) {
    const N: usize = 8;
    const M: u64 = 40;
    let s = setup(backend, 1, (1, 1));
    let mut cfg = bots(&s.control, N);
    cfg.rate_hz = 40.0;
    cfg.max_datagrams = Some(M);
    cfg.move_every = None;
    cfg.sync_start = true;
    // The quota ends the run long before this.
    cfg.duration = Duration::from_secs(15);
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    // The bots' LEAVEs may still be on their way on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.server.registry().total().leaves < N as u64 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    s.server.stop();
    let reg = s.server.join().unwrap();
    s.control.stop();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    for b in &report.per_bot {
        assert_eq!(b.tally.sent, M, "bot {}", b.player);
        assert_eq!(b.tally.expected, (N as u64 - 1) * M, "bot {}", b.player);
        assert_eq!(b.tally.received, (N as u64 - 1) * M, "bot {}", b.player);
        assert_eq!(
            (b.lost, b.tally.duplicates, b.tally.unexpected),
            (0, 0, 0),
            "bot {}",
            b.player
        );
    }
    let t = reg.total();
    assert_eq!(t.forwarded, N as u64 * M);
    assert_eq!(t.fanned_out, N as u64 * (N as u64 - 1) * M);
    assert_eq!(t.joins, N as u64);
    assert_eq!(t.leaves, N as u64);
    assert_eq!(t.dropped_non_member, 0);
    // Every datagram of the bots verified and was fresh: the sessions never
    // reuse a sequence number.
    assert_eq!((t.bad_mac, t.bad_tag, t.replays, t.unvalidated), (0, 0, 0, 0), "{t:?}");
    assert_eq!(report.exit_code(), 0);
    assert!(report.latency.count == t.fanned_out && report.latency.p99_us > 0.0);
}

/// Bots that keep moving across cells and groups lose nothing, and what the
/// reflector fanned out is exactly what the bots received.
#[test]
fn moving_bots_lose_nothing() {
    let s = setup(BackendKind::Sendmmsg, 4, (4, 4));
    let mut cfg = bots(&s.control, 16);
    cfg.duration = Duration::from_secs(3);
    cfg.rate_hz = 20.0;
    cfg.move_every = Some(Duration::from_millis(400));
    cfg.seed = 7;
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    // The bots' last LEAVEs may still be on their way on a loaded machine.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        let t = s.server.registry().total();
        if t.leaves >= t.joins {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    s.server.stop();
    let reg = s.server.join().unwrap();
    s.control.stop();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(report.lost, 0, "{}", report.table(true));
    assert!(report.group_changes > 0, "nobody changed group: {}", report.table(true));
    let t = reg.total();
    assert_eq!(t.forwarded, report.total.sent);
    let received_all =
        report.total.received + report.total.duplicates + report.total.uncertain + report.total.unexpected;
    assert_eq!(t.fanned_out, received_all);
    assert_eq!(report.total.unexpected, 0);
    assert!(report.total.expected > 0);
    assert_eq!(t.leaves, t.joins, "every join ends with a leave");
    // Each group change is a move window of its own (no reflector failed:
    // none other), from the grant handed in to a delivery through the new
    // group or, alone there, its JOIN_ACK; nothing lost, none listed.
    let cell: Vec<_> = report
        .move_windows
        .iter()
        .filter(|w| w.cause == reflector_bots::WindowCause::Cell)
        .collect();
    assert_eq!(cell.len(), report.move_windows.len(), "{:?}", report.move_windows);
    assert!(!cell.is_empty(), "group changes but no window");
    // (From and to may be one group: a player that moves back before its
    // move to the other was made.)
    for w in &cell {
        assert!(w.end_ns.is_some_and(|e| e >= w.start_ns), "{w:?}");
        assert!(w.from.is_some() && w.to.is_some(), "{w:?}");
    }
    assert!(report.lost_datagrams.is_empty());
}

/// With checkpoints on, moving bots keep their groups' state: they upload
/// it when asked, fetch it on every join, and every entry they can compare
/// with the player's next DATA agrees; nothing is lost meanwhile.
#[test]
fn moving_bots_upload_fetch_and_check_checkpoints() {
    let s = setup_full(
        BackendKind::Sendmmsg,
        4,
        (4, 4),
        Arc::new(AtomicBool::new(false)),
        None,
        Some(CheckpointConfig {
            every_ms: 1000,
            fetch_every_ms: 0,
            ..CheckpointConfig::default()
        }),
    );
    let mut cfg = bots(&s.control, 16);
    cfg.duration = Duration::from_secs(4);
    cfg.rate_hz = 20.0;
    cfg.move_every = Some(Duration::from_millis(400));
    cfg.seed = 11;
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    s.server.stop();
    let reg = s.server.join().unwrap();
    s.control.stop();
    let c = &report.checkpoints;
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(report.lost, 0, "{}", report.table(true));
    assert!(c.uploaded > 0 && c.fetched > 0, "{c:?}");
    assert_eq!((c.upload_errors, c.fetch_errors, c.mismatched), (0, 0, 0), "{c:?}");
    assert!(c.entries_matched > 0, "no fetched entry was compared: {c:?}");
    eprintln!("{}", report.table(false));
    let t = reg.total();
    assert_eq!(t.checkpoints_stored, c.uploaded);
    assert_eq!(t.checkpoints_served, c.fetched);
    assert_eq!(t.checkpoint_empty_fetches, c.fetched_empty);
    assert_eq!(t.checkpoint_bytes_served, c.bytes_fetched);
    // A refusal only where a bot had moved on (an upload or fetch for a
    // membership it had left since it asked), as the sealed test allows.
    assert!(
        t.checkpoint_refused <= c.uploads_overtaken + c.fetches_overtaken,
        "{} refused: {c:?}",
        t.checkpoint_refused
    );
}

/// A bot whose control server is gone fails with a message naming it.
#[test]
fn unreachable_control_server_is_an_error() {
    // Bind and drop to get a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = BotsConfig::new(&format!("http://127.0.0.1:{port}"), 1);
    let err = run_bots(&cfg, &AtomicBool::new(false)).unwrap_err().to_string();
    assert!(err.contains("reflector control"), "{err}");
}

/// The HTTP layer of the control server: JSON answers and 400s that name
/// the bad parameter.
#[test]
fn control_server_over_http() {
    let s = setup(BackendKind::Sendto, 2, (2, 1));
    let base = s.control.url();
    let get = |path: &str| -> (u16, serde_json::Value) {
        match ureq::get(&format!("{base}{path}")).call() {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
            Err(e) => panic!("{path}: {e}"),
        }
    };
    let (code, body) = get("/join?player=3&x=150&y=50");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["cell"], serde_json::json!([1, 0]));
    assert_eq!(body["group"], s.server.ports()[1]);
    assert_eq!(body["reflector"], format!("127.0.0.1:{}", s.server.ports()[1]));
    assert_eq!(body["token"].as_str().unwrap().len(), 64);
    let (code, body) = get("/join?player=3&x=250&y=50");
    assert_eq!(code, 400);
    assert!(body["error"].as_str().unwrap().contains("x=250"), "{body}");
    let (code, body) = get("/join?player=3&y=50");
    assert_eq!(code, 400);
    assert!(
        body["error"].as_str().unwrap().contains("missing parameter x"),
        "{body}"
    );
    assert_eq!(get("/healthz").0, 200);
    let (code, world) = get("/world");
    assert_eq!(code, 200);
    assert_eq!(world["grid"], serde_json::json!([2, 1]));
    assert_eq!(get("/other").0, 404);
    s.server.stop();
    s.server.join().unwrap();
    s.control.stop();
}

/// Loss is detected end to end: the reflector stops in the middle of the
/// run, so everything sent afterwards is lost at the tail, exactly.
#[test]
fn reflector_gone_midway_is_counted_as_tail_loss() {
    const N: usize = 4;
    let stop = Arc::new(AtomicBool::new(false));
    let s = setup_with_stop(BackendKind::Sendto, 1, (1, 1), Arc::clone(&stop));
    let mut cfg = bots(&s.control, N);
    cfg.move_every = None;
    cfg.sync_start = true;
    cfg.rate_hz = 20.0;
    cfg.duration = Duration::from_millis(2500);
    cfg.grace = Duration::from_millis(500);
    let stopper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    stopper.join().unwrap();
    let reg = s.server.join().unwrap();
    s.control.stop();
    let t = reg.total();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert!(
        t.forwarded < report.total.sent,
        "the reflector stopped before the bots did"
    );
    // Exactly what was not fanned out is missing.
    assert_eq!(report.total.received, t.fanned_out);
    assert_eq!(report.lost, (N as u64 - 1) * report.total.sent - t.fanned_out);
    assert!(report.total.tail_lost > 0);
    assert_eq!(report.exit_code(), 1);
    assert!(report.table(false).contains("LOSS"));
}

backend_matrix!(fixed_count);

/// Players authenticated by tickets: bots that sign theirs (as the game
/// backend would) join and lose nothing; bots without a ticket are refused
/// by the control server and never join.
#[test]
fn bots_with_tickets_join_and_bots_without_are_refused() {
    use reflector_control::players::{JoinAuth, TicketVerifier};
    let dir = std::env::temp_dir().join(format!("reflector-bots-tickets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys.toml");
    std::fs::write(
        &keys,
        "[[key]]\nkid = \"backend\"\nalg = \"HS256\"\nsecret_hex = \"4444444444444444444444444444444444444444444444444444444444444444\"\n",
    )
    .unwrap();
    let auth = Arc::new(JoinAuth::new(TicketVerifier::from_file(&keys).unwrap(), 10.0, 1000.0));
    let s = setup_full(
        BackendKind::Sendmmsg,
        1,
        (1, 1),
        Arc::new(AtomicBool::new(false)),
        Some(Arc::clone(&auth)),
        None,
    );
    let mut cfg = bots(&s.control, 4);
    cfg.rate_hz = 20.0;
    cfg.max_datagrams = Some(10);
    cfg.move_every = None;
    cfg.sync_start = true;
    cfg.duration = Duration::from_secs(10);
    cfg.ticket_keys = Some(keys.clone());
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!((report.lost, report.joins), (0, 4));
    assert_eq!(report.total.received, 4 * 3 * 10);
    let mut anon = bots(&s.control, 2);
    anon.duration = Duration::from_secs(1);
    anon.grace = Duration::from_millis(200);
    // Without tickets the run stops at the first refusal (every bot's
    // request is alike) and says what is missing.
    let err = run_bots(&anon, &AtomicBool::new(false)).unwrap_err();
    assert!(
        matches!(err, reflector_bots::BotsError::Ticket { status: 401, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("401") && msg.contains("Authorization: Bearer") && msg.contains("--ticket-keys"),
        "{msg}"
    );
    let refused: std::collections::HashMap<_, _> = auth.refused().into_iter().collect();
    assert!((1..=2).contains(&refused["missing"]), "{refused:?}");
    s.server.stop();
    s.server.join().unwrap();
    s.control.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// `--control` with several URLs: a first control server that cannot be
/// reached (a closed port) is passed over for the next, for the world and
/// for every join, and the run ends with no error and no loss; a refusal
/// is not: a first server that answers 404 stops the bots with its answer,
/// though the second would have served them.
#[test]
fn an_unreachable_control_server_is_passed_over_for_the_next() {
    let s = setup(BackendKind::Sendmmsg, 1, (1, 1));
    // A port nothing listens on: bound, then closed.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut cfg = bots(&s.control, 4);
    cfg.control_fallbacks = vec![cfg.control.clone()];
    cfg.control = format!("http://{closed}");
    cfg.rate_hz = 20.0;
    cfg.max_datagrams = Some(10);
    cfg.move_every = None;
    cfg.sync_start = true;
    cfg.duration = Duration::from_secs(10);
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    s.server.stop();
    s.server.join().unwrap();
    s.control.stop();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(report.lost, 0);
    assert_eq!(report.total.received, 4 * 3 * 10);

    // Only servers that could not answer are passed over: a first that
    // refuses (here a server that is not a control server: 404) is the
    // answer, though the second works.
    let not_control = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = not_control.local_addr().unwrap();
    let answer = std::thread::spawn(move || {
        use std::io::{Read, Write};
        // Answers every connection for a few seconds with 404.
        not_control.set_nonblocking(true).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(5);
        let mut answered = 0;
        while std::time::Instant::now() < until {
            match not_control.accept() {
                Ok((mut c, _)) => {
                    c.set_nonblocking(false).unwrap();
                    let mut buf = [0u8; 1024];
                    let _ = c.read(&mut buf);
                    let _ = c.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    answered += 1;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        answered
    });
    let s = setup(BackendKind::Sendmmsg, 1, (1, 1));
    let mut cfg = bots(&s.control, 2);
    cfg.control_fallbacks = vec![cfg.control.clone()];
    cfg.control = format!("http://{addr}");
    cfg.duration = Duration::from_secs(2);
    let out = run_bots(&cfg, &AtomicBool::new(false));
    s.server.stop();
    s.server.join().unwrap();
    s.control.stop();
    let err = out.expect_err("a 404 from the first server is its answer").to_string();
    assert!(err.contains("404"), "{err}");
    assert!(answer.join().unwrap() >= 1);
}
