//! Bots in sealed groups (docs/protocol.md, "Sealed payloads"), loopback
//! end to end: an in-process reflector whose groups announce sealed
//! payloads and a control server with a sealing secret, whose grants carry
//! the epoch keys the bots seal and open with, and certificates of the
//! bots' checkpoint signing keys. Every run is bounded by its quota, the
//! bots' duration and grace period.

use reflector_bots::{run_bots, BotsConfig, BotsReport};
use reflector_control::sealing::Sealing;
use reflector_control::{Assign, ControlConfig, ControlServer, ReflectorSpec, World};
use reflector_proto::auth::Secret;
use reflector_proto::sealed::{MasterSecret, Schedule};
use reflector_server::backend::BackendKind;
use reflector_server::checkpoint::CheckpointConfig;
use reflector_server::membership::Policy;
use reflector_server::metrics::Snapshot;
use reflector_server::server::{Server, ServerConfig};
use std::net::IpAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LOCAL: [u8; 4] = [127, 0, 0, 1];

/// A reflector with `groups` free ports, all sealed (or all clear), and a
/// control server with a sealing secret mapping a `grid` world onto them.
fn setup(groups: usize, grid: (u32, u32), sealed: bool) -> (Server, ControlServer) {
    let (server, control, _) = setup_full(groups, grid, sealed, None, 60);
    (server, control)
}

/// [`setup`], with the reflector's checkpoint channel and the control
/// server's token lifetime as given, and the control server's sealing (to
/// read its counters).
fn setup_full(
    groups: usize,
    grid: (u32, u32),
    sealed: bool,
    checkpoint: Option<CheckpointConfig>,
    token_ttl_s: u64,
) -> (Server, ControlServer, Arc<Sealing>) {
    let secret = Secret::new(&[0x5b; 32]).unwrap();
    let base = ServerConfig::new(IpAddr::from(LOCAL), secret.clone(), BackendKind::Sendmmsg);
    let server = Server::start(
        ServerConfig {
            ports: vec![0; groups],
            threads: 2,
            checkpoint,
            policy: Policy {
                data_instance: true,
                data_sealed: sealed,
                ..base.policy
            },
            ..base
        },
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    let sealing = Arc::new(Sealing::new(
        MasterSecret::new(&[0x6e; 32]).unwrap(),
        "bots tests",
        Schedule::new(600, 60).unwrap(),
        100.0,
    ));
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
    .unwrap()
    .with_sealing(Arc::clone(&sealing))
    .unwrap();
    let control = ControlServer::start(
        ControlConfig {
            listen: (LOCAL, 0).into(),
            world,
            secret: secret.into(),
            token_ttl_s,
            auth: None,
        },
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    (server, control, sealing)
}

/// Runs `cfg`, waits (bounded) for the bots' LEAVEs, stops both servers.
fn run(server: Server, control: ControlServer, cfg: &BotsConfig) -> (BotsReport, Snapshot) {
    let report = run_bots(cfg, &AtomicBool::new(false)).unwrap();
    // The bots' last LEAVEs may still be on their way on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let t = server.registry().total();
        if t.leaves >= t.joins {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    server.stop();
    let reg = server.join().unwrap();
    control.stop();
    (report, reg.total())
}

fn bots(control: &ControlServer, n: usize) -> BotsConfig {
    let mut c = BotsConfig::new(&control.url(), n);
    c.bind = IpAddr::from(LOCAL);
    c.grace = Duration::from_secs(2);
    c
}

/// N bots in one sealed group, M datagrams each: every bot seals what it
/// sends (a bot without keys could send nothing there, an error) and
/// opens every other bot's datagrams, so each receives exactly (N-1)*M and
/// no sealed DATA is dropped.
#[test]
fn bots_in_a_sealed_group_deliver_everything() {
    const N: usize = 6;
    const M: u64 = 30;
    let (server, control) = setup(1, (1, 1), true);
    let mut cfg = bots(&control, N);
    cfg.rate_hz = 40.0;
    cfg.max_datagrams = Some(M);
    cfg.move_every = None;
    cfg.sync_start = true;
    // Every payload marked: each opened copy must still carry its sender's.
    cfg.marker = Some(*b"\x5e\xa1ed\x00\xfe\xed\x01");
    // The quota ends the run long before this.
    cfg.duration = Duration::from_secs(15);
    let (report, t) = run(server, control, &cfg);
    assert_eq!(report.error_count, 0, "{:?}\n{}", report.errors, report.table(true));
    for b in &report.per_bot {
        assert_eq!(b.tally.sent, M, "bot {}", b.player);
        assert_eq!(b.tally.received, (N as u64 - 1) * M, "bot {}", b.player);
        assert_eq!(
            (b.lost, b.tally.duplicates, b.tally.unexpected),
            (0, 0, 0),
            "bot {}",
            b.player
        );
    }
    assert_eq!(report.sealed.dropped(), 0, "{:?}", report.sealed);
    assert_eq!(report.malformed, 0);
    let copies = N as u64 * (N as u64 - 1) * M;
    assert_eq!(report.sealed.opened, copies, "{:?}", report.sealed);
    assert_eq!(report.markers_received, copies);
    assert_eq!(t.forwarded, N as u64 * M);
    assert_eq!(t.fanned_out, N as u64 * (N as u64 - 1) * M);
    assert_eq!(report.exit_code(), 0, "{}", report.table(true));
}

/// Bots that move across four sealed groups (a new grant, with its
/// group's keys, on each move) lose nothing and drop no sealed DATA.
#[test]
fn moving_bots_in_sealed_groups_lose_nothing() {
    let (server, control) = setup(4, (2, 2), true);
    let mut cfg = bots(&control, 8);
    cfg.duration = Duration::from_secs(3);
    cfg.rate_hz = 20.0;
    cfg.move_every = Some(Duration::from_millis(400));
    cfg.seed = 5;
    let (report, t) = run(server, control, &cfg);
    assert_eq!(report.error_count, 0, "{:?}\n{}", report.errors, report.table(true));
    assert_eq!(report.lost, 0, "{}", report.table(true));
    assert!(report.group_changes > 0, "nobody changed group: {}", report.table(true));
    assert!(report.total.received > 0, "{}", report.table(true));
    assert_eq!(report.sealed.dropped(), 0, "{:?}", report.sealed);
    assert_eq!(t.forwarded, report.total.sent);
}

/// Moving bots in sealed groups with checkpoints on: every `/join` they
/// make carries their client's `sign_key`, so every grant (first join,
/// renewal, move) certifies it and the client takes the certificate with
/// the token. Each upload is then sealed and signed, and each fetch comes
/// back signed by a certified member and agrees with the DATA that
/// follows. Without the certificate every upload is refused (no
/// certificate to sign with) and the bots count checkpoint errors; without
/// the renewals' and moves' certificates, an upload after the first one
/// expired is refused by its joiners. Tokens live 4 s, so bots that stay
/// in a group renew within the run.
#[test]
fn moving_bots_in_sealed_groups_upload_and_fetch_signed_checkpoints() {
    const N: usize = 16;
    let (server, control, sealing) = setup_full(
        4,
        (4, 4),
        true,
        Some(CheckpointConfig {
            every_ms: 500,
            fetch_every_ms: 0,
            ..CheckpointConfig::default()
        }),
        4,
    );
    let mut cfg = bots(&control, N);
    cfg.duration = Duration::from_secs(9);
    cfg.rate_hz = 20.0;
    cfg.move_every = Some(Duration::from_millis(1000));
    cfg.seed = 11;
    let (report, t) = run(server, control, &cfg);
    let c = &report.checkpoints;
    eprintln!("{}", report.table(false));
    eprintln!(
        "{} certificates issued, {} renewals",
        sealing.certificates_issued(),
        report.per_bot.iter().map(|b| b.renewals).sum::<u64>()
    );
    assert_eq!(report.error_count, 0, "{:?}\n{}", report.errors, report.table(true));
    assert_eq!((c.upload_errors, c.fetch_errors, c.mismatched), (0, 0, 0), "{c:?}");
    assert!(c.uploaded > 0 && c.fetched > 0, "{c:?}");
    assert_eq!(
        c.fetched_signed, c.fetched,
        "every fetch in a sealed group is signed: {c:?}"
    );
    assert!(c.entries_matched > 0, "no fetched entry was compared: {c:?}");
    assert!(report.group_changes > 0, "nobody changed group: {}", report.table(true));
    let renewals: u64 = report.per_bot.iter().map(|b| b.renewals).sum();
    assert!(renewals > 0, "nobody renewed: {}", report.table(true));
    assert_eq!(report.lost, 0, "{}", report.table(true));
    assert_eq!(report.sealed.dropped(), 0, "{:?}", report.sealed);
    // One certificate per /join, each bot's first among them.
    assert!(
        sealing.certificates_issued() >= N as u64,
        "{}",
        sealing.certificates_issued()
    );
    assert_eq!(t.checkpoints_stored, c.uploaded);
    assert_eq!(t.checkpoints_served, c.fetched);
    // A refusal only where a bot had moved on (left the membership, or the
    // reflector had a newer request): never one of a signed checkpoint.
    assert!(
        t.checkpoint_refused <= c.uploads_overtaken + c.fetches_overtaken,
        "{} refused: {c:?}",
        t.checkpoint_refused
    );
}

/// The same grants in clear groups: the keys are there but unused, and the
/// report's sealed counters stay zero (the control for the tests above).
#[test]
fn keys_in_clear_groups_change_nothing() {
    const N: usize = 4;
    const M: u64 = 20;
    let (server, control) = setup(1, (1, 1), false);
    let mut cfg = bots(&control, N);
    cfg.rate_hz = 40.0;
    cfg.max_datagrams = Some(M);
    cfg.move_every = None;
    cfg.sync_start = true;
    cfg.duration = Duration::from_secs(15);
    cfg.marker = Some([0xc1; 8]);
    let (report, t) = run(server, control, &cfg);
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(report.total.received, N as u64 * (N as u64 - 1) * M);
    assert_eq!(report.markers_received, N as u64 * (N as u64 - 1) * M);
    assert_eq!(report.sealed, Default::default());
    assert_eq!(t.fanned_out, N as u64 * (N as u64 - 1) * M);
}
