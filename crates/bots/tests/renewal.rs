//! Membership lifetime (`docs/protocol.md`, "Membership lifetime and
//! renewal") on every backend: bots under short-lived tokens renew and lose
//! nothing; a member that does not renew is removed at its token's expiry
//! and its traffic is no longer fanned out (with eBPF, its kernel entry
//! goes with it). Loopback for the user-space backends; the eBPF cases in
//! namespaces of their own (root).

use oskit::testing::{root_or_skip, veth_pair, NetNsGuard, VethEnd};
use reflector_bots::{run_bots, BotsConfig};
use reflector_control::{Assign, ControlConfig, ControlServer, ReflectorSpec, World};
use reflector_proto::auth::Secret;
use reflector_proto::client::Session;
use reflector_proto::protocol::{Kind, Packet, DATA_PAYLOAD};
use reflector_server::backend::BackendKind;
use reflector_server::backend_matrix;
use reflector_server::membership::Policy;
use reflector_server::metrics::Snapshot;
use reflector_server::server::{Server, ServerConfig};
use reflector_server::testing::Case;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x5b; 32];
/// The control server's token lifetime: bots renew every couple of seconds.
const TOKEN_TTL_S: u64 = 12;
/// How long the bots run: more than two token lifetimes.
const RUN: Duration = Duration::from_secs(30);

/// One lab at a time: the eBPF cases share the devices' programs.
static SERIAL: Mutex<()> = Mutex::new(());

fn server(bind: IpAddr, backend: impl Into<Case>, policy: Policy) -> Server {
    Server::start(
        ServerConfig {
            policy,
            ..backend.into().config(bind, Secret::new(&SECRET).unwrap())
        },
        Arc::new(AtomicBool::new(false)),
    )
    .expect("the reflector starts on the backend asked for, no fallback")
}

fn control(reflector: IpAddr, port: u16) -> ControlServer {
    let world = World::new(
        1,
        1,
        100.0,
        Assign::RoundRobin,
        &[ReflectorSpec {
            ip: reflector,
            ports: vec![port],
        }],
    )
    .unwrap();
    ControlServer::start(
        ControlConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            world,
            secret: Secret::new(&SECRET).unwrap().into(),
            token_ttl_s: TOKEN_TTL_S,
            auth: None,
        },
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap()
}

/// Bots in one group for [`RUN`] under [`TOKEN_TTL_S`]-second tokens: every
/// bot renews at least twice, keeps its one membership, loses nothing, and
/// the reflector expires nobody.
fn renewing_bots_run(server: Server, reflector: IpAddr, bind: IpAddr, netns: Vec<String>) {
    const N: usize = 4;
    let control = control(reflector, server.ports()[0]);
    let mut cfg = BotsConfig::new(&control.url(), N);
    cfg.bind = bind;
    cfg.netns = netns;
    cfg.duration = RUN;
    cfg.rate_hz = 20.0;
    cfg.move_every = None;
    cfg.grace = Duration::from_secs(2);
    let report = run_bots(&cfg, &AtomicBool::new(false)).unwrap();
    server.stop();
    // Totals after the server stopped: its last sweep reads the kernel's
    // counters (the eBPF fan-out forwards without user space seeing it).
    let t = server.join().unwrap().total();
    control.stop();
    assert_eq!(report.error_count, 0, "{:?}", report.errors);
    assert_eq!(report.lost, 0, "{}", report.table(true));
    for b in &report.per_bot {
        assert!(b.renewals >= 2, "bot {} renewed {} times", b.player, b.renewals);
        assert_eq!(b.joins, 1, "bot {} joined again", b.player);
    }
    let renewed: u64 = report.per_bot.iter().map(|b| b.renewals).sum();
    assert_eq!(t.renewals, renewed, "{t:?}");
    assert_eq!(
        (t.expired_tokens, t.expired, t.replaced, t.joins),
        (0, 0, 0, N as u64),
        "{t:?}"
    );
    assert_eq!(t.forwarded, report.total.sent);
    eprintln!("{N} bots renewed {renewed} times in {RUN:?} with {TOKEN_TTL_S} s tokens");
}

fn renewing_bots(backend: Case) {
    let local = IpAddr::from([127, 0, 0, 1]);
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    renewing_bots_run(server(local, backend, Policy::default()), local, local, Vec::new());
}

backend_matrix!(renewing_bots);

/// The reflector in one namespace (eBPF on its veth end), the members in
/// another; removed on drop.
struct Lab {
    r: NetNsGuard,
    c: NetNsGuard,
}

const REFLECTOR: [u8; 4] = [10, 204, 0, 1];
const CLIENTS: [u8; 4] = [10, 204, 0, 2];

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            r: NetNsGuard::new("rnr"),
            c: NetNsGuard::new("rnc"),
        };
        veth_pair(
            VethEnd::new(lab.r.name(), "vr").addr("10.204.0.1/24"),
            VethEnd::new(lab.c.name(), "vc").addr("10.204.0.2/24"),
        );
        lab
    }

    fn server(&self, policy: Policy) -> Server {
        self.r
            .run(move || server(IpAddr::from(REFLECTOR), BackendKind::Ebpf, policy))
    }
}

#[test]
fn renewing_bots_ebpf() {
    if !root_or_skip("renewing_bots_ebpf") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let s = lab.server(Policy::default());
    renewing_bots_run(
        s,
        IpAddr::from(REFLECTOR),
        IpAddr::from(CLIENTS),
        vec![lab.c.name().to_string()],
    );
}

/// A member that does not renew: its token lives `ttl_s` seconds.
fn member(sock: &UdpSocket, reflector: SocketAddr, player: u32, ttl_s: u64) -> Session {
    reflector_server::testing::join_blocking(
        sock,
        reflector_server::testing::join_request(&SECRET, reflector, player, ttl_s, 1),
    )
}

fn data_received(sock: &UdpSocket, within: Duration) -> u64 {
    let mut buf = [0u8; 2048];
    let mut n = 0;
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok((len, _)) = sock.recv_from(&mut buf) {
            if Packet::parse(&buf[..len]).is_ok_and(|p| p.kind() == Kind::Data) {
                n += 1;
            }
        }
    }
    n
}

fn send_data(sock: &UdpSocket, s: &mut Session, to: SocketAddr) {
    let mut b = [0u8; DATA_PAYLOAD + 8];
    let n = s.emit_data(8, &mut b).unwrap().unwrap();
    sock.send_to(&b[..n], to).unwrap();
}

/// Two members whose tokens live 3 s and who keep sending KEEPALIVEs but
/// never renew: until then each one's DATA reaches the other; after the
/// next sweep past the expiry both are gone (counted as expired tokens),
/// DATA is no longer fanned out, and the reflector answers ERROR(NotMember).
fn unrenewed_members_expire_run(server: &Server, reflector: SocketAddr, socks: &[UdpSocket]) -> Snapshot {
    for s in socks {
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    }
    let mut a = member(&socks[0], reflector, 1, 3);
    let mut b = member(&socks[1], reflector, 2, 3);
    send_data(&socks[0], &mut a, reflector);
    assert_eq!(
        data_received(&socks[1], Duration::from_millis(300)),
        1,
        "fanned out while valid"
    );
    // Alive all along, on the monotonic clock.
    let deadline = Instant::now() + Duration::from_secs(6);
    while server.registry().total().expired_tokens < 2 {
        assert!(
            Instant::now() < deadline,
            "not expired: {:?}",
            server.registry().total()
        );
        for (s, m) in socks.iter().zip([&mut a, &mut b]) {
            if let Some(tx) = m.keepalive() {
                s.send_to(tx.datagram.as_bytes(), reflector).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let t = server.registry().total();
    assert_eq!((t.members, t.expired, t.expired_tokens), (0, 0, 2), "{t:?}");
    let forwarded = t.forwarded;
    send_data(&socks[0], &mut a, reflector);
    assert_eq!(
        data_received(&socks[1], Duration::from_millis(300)),
        0,
        "no longer fanned out"
    );
    let t = server.registry().total();
    assert_eq!(t.forwarded, forwarded);
    assert!(t.dropped_non_member >= 1, "{t:?}");
    t
}

fn unrenewed_members_expire(backend: Case) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let local = IpAddr::from([127, 0, 0, 1]);
    let s = server(local, backend, Policy::default());
    let reflector = SocketAddr::new(local, s.ports()[0]);
    let socks: Vec<UdpSocket> = (0..2).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    unrenewed_members_expire_run(&s, reflector, &socks);
    s.stop();
    s.join().unwrap();
}

backend_matrix!(unrenewed_members_expire);

#[test]
fn unrenewed_members_expire_ebpf() {
    if !root_or_skip("unrenewed_members_expire_ebpf") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let s = lab.server(Policy::default());
    let reflector = SocketAddr::from((REFLECTOR, s.ports()[0]));
    let socks: Vec<UdpSocket> = lab.c.run(|| {
        (0..2)
            .map(|_| UdpSocket::bind(SocketAddr::from((CLIENTS, 0))).unwrap())
            .collect()
    });
    let t = unrenewed_members_expire_run(&s, reflector, &socks);
    // The late DATA found no kernel entry (the Removed change took it out):
    // passed up, and user space did not fan it out either.
    assert!(t.kernel_passed_up >= 1, "{t:?}");
    eprintln!("kernel_forwarded {} of forwarded {}", t.kernel_forwarded, t.forwarded);
    s.stop();
    s.join().unwrap();
}
