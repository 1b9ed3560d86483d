//! No datagram lost at the sender (paper 000 §4.1), on a real device queue:
//! the reflector sits in one namespace, its members in another, joined by a
//! veth whose egress is a token bucket far slower than the fan-out, with a
//! tiny queue. Fan-out bursts overflow that queue; the kernel reports
//! ENOBUFS (IP_RECVERR) and the backend must wait and resend, so every
//! member still receives every datagram. Needs root; creates and removes its
//! own namespaces.

use oskit::testing::{root_or_skip, sh, static_neighbours, veth_pair, NetNsGuard, VethEnd};
use reflector_proto::auth::Secret;
use reflector_proto::client::Session;
use reflector_proto::protocol::DATA_PAYLOAD;
use reflector_server::backend_matrix;
use reflector_server::server::{Server, ServerConfig};
use reflector_server::testing::Case;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SECRET: [u8; 32] = [0x33; 32];

/// Two namespaces and a veth between them; removed on drop, even on panic.
struct Lab {
    a: NetNsGuard,
    b: NetNsGuard,
}

const MAC_A: &str = "02:52:46:00:00:01";
const MAC_B: &str = "02:52:46:00:00:02";

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            a: NetNsGuard::new("rfta"),
            b: NetNsGuard::new("rftb"),
        };
        let (a, b) = (lab.a.name(), lab.b.name());
        let end_a = VethEnd::new(a, "va").mac(MAC_A).addr("10.201.0.1/24");
        let end_b = VethEnd::new(b, "vb").mac(MAC_B).addr("10.201.0.2/24");
        veth_pair(end_a, end_b);
        // Permanent neighbour entries: ARP entries of all namespaces share
        // one kernel table (gc_thresh3, 1024 by default), which a large lab
        // running beside this test can fill; permanent entries are exempt.
        static_neighbours(end_a, end_b);
        // 20 Mbit/s with a 3 KB bucket and queue: a fan-out burst of 100-byte
        // datagrams to 20 members overflows it at once.
        sh(&[
            "tc", "-n", a, "qdisc", "add", "dev", "va", "root", "tbf", "rate", "20mbit", "burst", "3000", "limit",
            "3000",
        ]);
        lab
    }
}

fn join(sock: &UdpSocket, server: SocketAddr, id: u32) -> Session {
    reflector_server::testing::join_blocking(
        sock,
        reflector_server::testing::join_request(&SECRET, server, id, 60, 1),
    )
}

fn no_loss_on_a_full_device_queue(backend: Case) {
    if !root_or_skip(&format!("no_loss_on_a_full_device_queue_{backend}")) {
        return;
    }
    const MEMBERS: usize = 20;
    const SENT: u32 = 300;
    let lab = Lab::new();
    let stop = Arc::new(AtomicBool::new(false));
    let server_stop = Arc::clone(&stop);
    let server = lab.a.run(move || {
        let cfg = ServerConfig {
            rcvbuf: 1 << 20,
            sndbuf: 1 << 20,
            ..backend.config([10, 201, 0, 1].into(), Secret::new(&SECRET).unwrap())
        };
        Server::start(cfg, server_stop).expect("server starts in the namespace")
    });
    let group = server.ports()[0];
    let addr = SocketAddr::from(([10, 201, 0, 1], group));
    let socks: Vec<UdpSocket> = lab.b.run(move || {
        (0..=MEMBERS)
            .map(|_| {
                let s = UdpSocket::bind("10.201.0.2:0").unwrap();
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20));
                s
            })
            .collect()
    });
    let sessions: Vec<Session> = socks.iter().enumerate().map(|(i, s)| join(s, addr, i as u32)).collect();
    let mut sending = sessions[0];
    // Member 0 sends; the others count. Drain in threads so receivers never
    // overflow: any loss would then be the sender's.
    let (sender, receivers) = socks.split_first().unwrap();
    let counts = reflector_server::testing::count_data(receivers, SENT, Duration::from_secs(20));
    let mut b = [0xabu8; 100];
    for seq in 0..SENT {
        sending.emit_data(100 - DATA_PAYLOAD, &mut b).unwrap().unwrap();
        sender.send_to(&b, addr).unwrap();
        if seq % 20 == 19 {
            // Keep the reflector's receive queue from overflowing; the
            // device queue still overflows within every fan-out burst.
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let got: Vec<u32> = counts.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    let t = server.join().unwrap().total();
    assert_eq!(t.forwarded, u64::from(SENT), "reflector received every datagram");
    assert_eq!(t.fanned_out, u64::from(SENT) * MEMBERS as u64);
    assert_eq!(t.send_errors, 0);
    assert!(
        t.enobufs_waits > 0,
        "the device queue never overflowed; the test proves nothing ({t:?})"
    );
    assert!(
        got.iter().all(|&g| g == SENT),
        "receivers got {got:?} of {SENT} via {backend}"
    );
    drop(lab);
}

backend_matrix!(no_loss_on_a_full_device_queue);
