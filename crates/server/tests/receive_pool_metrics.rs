//! The receive pools' counters as a scraper reads them from `/metrics`:
//! traffic through two groups served by two event loops, then the pools'
//! sums agree with each other and with the datagram counters (every
//! datagram received came in a pool buffer, every buffer is back once the
//! traffic stops), and so does each loop's pool as the registry holds it.

use reflector_proto::auth::Secret;
use reflector_proto::protocol::DATA_PAYLOAD;
use reflector_server::backend_matrix;
use reflector_server::metrics::Exposition;
use reflector_server::server::http::serve_metrics;
use reflector_server::server::{Server, ServerConfig};
use reflector_server::testing::{join_blocking, join_request, Case, DataCounters};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x4e; 32];
const LOOPS: usize = 2;
/// Members per group: one sends, the others count.
const MEMBERS: usize = 4;
const SENT: u32 = 300;

/// The body of `GET /metrics` on `addr`.
fn scrape(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a header block");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// The value of `series` (name and labels as exposed) in a scrape.
fn value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("{series}: {e}\n{text}"))
}

/// The receive-pool series of a scrape (summed over the event loops).
#[derive(Debug)]
struct Pool {
    preallocated: u64,
    allocated: u64,
    grown: u64,
    held: u64,
    handed_out: u64,
    ring_returned: u64,
}

fn pool(text: &str) -> Pool {
    let v = |name: &str| value(text, name);
    Pool {
        preallocated: v("reflector_receive_buffers_preallocated"),
        allocated: v("reflector_receive_buffers_allocated_total"),
        grown: v("reflector_receive_buffers_grown_total"),
        held: v("reflector_receive_buffers_held"),
        handed_out: v("reflector_receive_buffers_handed_out_total"),
        ring_returned: v("reflector_receive_ring_buffers_returned_total"),
    }
}

fn pool_counters_in_metrics(case: Case) {
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = ServerConfig {
        ports: vec![0; LOOPS],
        threads: LOOPS,
        ..case.config([127, 0, 0, 1].into(), Secret::new(&SECRET).unwrap())
    };
    let server = Server::start(cfg, Arc::clone(&stop)).expect("server starts");
    let listener = reflector_http::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let metrics = serve_metrics(
        listener,
        reflector_http::Limits::default(),
        None,
        Exposition::new(server.registry().clone(), false),
        Arc::new(|| Ok(())),
        Arc::new(|| Ok(())),
        Arc::clone(&stop),
    )
    .expect("metrics listener starts");
    let metrics_addr = metrics.addr();

    // Each group (one per loop): one sender, the others count what they get.
    let mut counters = Vec::new();
    for &port in server.ports() {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let socks: Vec<UdpSocket> = (0..MEMBERS).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
        let mut sessions: Vec<_> = socks
            .iter()
            .enumerate()
            .map(|(i, s)| join_blocking(s, join_request(&SECRET, addr, i as u32 + 1, 60, 1)))
            .collect();
        let (sender, receivers) = socks.split_first().unwrap();
        let counting = DataCounters::start(receivers, SENT, Duration::from_secs(20));
        let mut b = [0x5cu8; 200];
        for seq in 0..SENT {
            sessions[0].emit_data(b.len() - DATA_PAYLOAD, &mut b).unwrap().unwrap();
            sender.send_to(&b, addr).unwrap();
            if seq % 50 == 49 {
                // Every receiver has this burst before the next leaves: no
                // queue ever holds more than one, however slow the machine.
                assert!(
                    counting.wait_for(seq + 1, Duration::from_secs(5)),
                    "a receiver did not get DATA {} via {case} within 5 s:\n{}",
                    seq + 1,
                    scrape(metrics_addr)
                );
            }
        }
        sessions.clear();
        counters.push(counting);
    }
    for got in counters.into_iter().flat_map(DataCounters::finish) {
        assert_eq!(got, SENT, "a receiver lost DATA via {case}");
    }

    // The loops publish their pools at each sweep (every 500 ms): wait for
    // a scrape in which every datagram is accounted for and nothing held.
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let text = scrape(metrics_addr);
        let p = pool(&text);
        if (p.handed_out == value(&text, "reflector_received_total") && p.held == 0) || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let received = value(&text, "reflector_received_total");
    assert!(
        received >= u64::from(SENT) * LOOPS as u64,
        "{received} datagrams received:\n{text}"
    );
    let p = pool(&text);
    assert_eq!(
        p.handed_out, received,
        "every datagram received came in a pool buffer:\n{text}"
    );
    assert!(p.allocated >= p.preallocated, "{p:?}");
    assert_eq!(p.grown, p.allocated - p.preallocated, "{p:?}");
    assert_eq!(p.held, 0, "buffers still held after the traffic: {p:?}");
    if case.receive.ring_buffers() {
        // The kernel's ring holds the buffers: the pools allocate none, and
        // every buffer handed out went back to the ring.
        assert_eq!((p.preallocated, p.allocated), (0, 0), "{p:?}");
        assert_eq!(p.ring_returned, p.handed_out, "{p:?}");
    } else {
        assert!(p.preallocated > 0, "{p:?}");
        assert_eq!(p.ring_returned, 0, "no ring with {}: {p:?}", case.receive);
    }
    // Each loop's own pool (the scrape is their sum): each served a group.
    let loops: Vec<_> = server.registry().receive_pools.iter().map(|c| c.snapshot()).collect();
    assert_eq!(loops.len(), LOOPS);
    for (lp, s) in loops.iter().enumerate() {
        assert!(s.handed_out >= u64::from(SENT), "loop {lp}: {s:?}");
        assert!(s.allocated >= s.preallocated, "loop {lp}: {s:?}");
    }
    assert_eq!(loops.iter().map(|s| s.handed_out).sum::<u64>(), p.handed_out);
    for family in [
        "# TYPE reflector_receive_buffers_held gauge",
        "# TYPE reflector_receive_buffers_allocated_total counter",
        "# HELP reflector_receive_buffers_grown_total Receive buffers allocated beyond the preallocation",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }

    stop.store(true, Relaxed);
    let _ = metrics.stop();
    server.join().unwrap();
}

backend_matrix!(pool_counters_in_metrics);
