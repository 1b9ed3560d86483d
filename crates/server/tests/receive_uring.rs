//! The io_uring receive on its own: malformed datagrams (empty, short,
//! garbage, the longest UDP allows) are counted and dropped as with
//! recvmmsg, and a server that stops leaves no ring behind.

use reflector_proto::auth::Secret;
use reflector_proto::protocol::MAX_DATAGRAM;
use reflector_server::backend::{BackendKind, Support};
use reflector_server::metrics::Snapshot;
use reflector_server::receive::ReceiveKind;
use reflector_server::server::Server;
use reflector_server::testing::Case;
use std::net::UdpSocket;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x77; 32];

/// The tests count this process's io_uring fds: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const CASE: Case = Case {
    backend: BackendKind::Sendmmsg,
    receive: ReceiveKind::IoUring,
};

/// False (with the reason, unless CI forbids skipping) if io_uring cannot
/// run here.
fn supported(test: &str) -> bool {
    match ReceiveKind::IoUring.probe() {
        Support::Supported => true,
        Support::Unsupported(why) => {
            assert!(
                std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
                "{test}: io_uring unsupported here ({why}), and CI forbids skipping it"
            );
            eprintln!("skipping {test}: {why}");
            false
        }
    }
}

fn start(threads: usize) -> Server {
    let cfg = reflector_server::server::ServerConfig {
        ports: vec![0; 2],
        threads,
        ..CASE.config([127, 0, 0, 1].into(), Secret::new(&SECRET).unwrap())
    };
    Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("server starts")
}

fn wait_for(server: &Server, what: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let t = server.registry().total();
        if what(&t) || Instant::now() > deadline {
            return t;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// This process's open io_uring instances.
fn rings() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|l| l.to_string_lossy().contains("io_uring"))
        .count()
}

#[test]
fn malformed_datagrams_are_counted_and_dropped() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !supported("malformed_datagrams_are_counted_and_dropped") {
        return;
    }
    let server = start(1);
    let g = server.ports()[0];
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let bad: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x52, 0x46, 2],
        b"GET / HTTP/1.0\r\n\r\n".to_vec(),
        vec![0x52; 300],
        // The longest UDP allows: it fits a receive buffer whole.
        vec![0x52; MAX_DATAGRAM],
    ];
    const ROUNDS: usize = 50;
    for _ in 0..ROUNDS {
        for d in &bad {
            tx.send_to(d, ("127.0.0.1", g)).unwrap();
        }
        // Loopback drops nothing if the reflector keeps up; pace a little.
        std::thread::sleep(Duration::from_millis(1));
    }
    let want = (ROUNDS * bad.len()) as u64;
    let t = wait_for(&server, |t| t.received >= want);
    assert_eq!(t.received, want, "every datagram received: {t:?}");
    assert_eq!(t.malformed, want, "every one dropped as malformed: {t:?}");
    assert_eq!((t.forwarded, t.fanned_out), (0, 0));
    let done = server.registry().total();
    server.stop();
    let _ = server.join().unwrap();
    assert_eq!(done.received, want);
}

#[test]
fn a_stopped_server_leaves_no_ring_behind() {
    let _one = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !supported("a_stopped_server_leaves_no_ring_behind") {
        return;
    }
    let before = rings();
    let server = start(2);
    // One ring per event loop, open while it runs.
    let deadline = Instant::now() + Duration::from_secs(3);
    while rings() < before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(rings(), before + 2, "one ring per loop");
    server.stop();
    server.join().unwrap();
    assert_eq!(rings(), before, "every ring closed");
}
