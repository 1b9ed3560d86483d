//! `serve --drain-timeout`: on SIGTERM the reflector keeps serving, answers
//! `/readyz` with 503, tells each member with a MOVED under its own key that
//! it stops serving it, and stops when the last member has left, or at the
//! deadline; without the option it stops at once, as before.

mod support;

use nix::sys::signal::Signal;
use reflector_proto::client::Session;
use reflector_proto::protocol::{Kind, MovedReason, Packet, DATA_PAYLOAD};
use std::net::UdpSocket;
use std::time::{Duration, Instant};
use support::*;

const SECRET: [u8; 32] = [0x33; 32];

fn secret_file(dir: &Scratch) -> std::path::PathBuf {
    let f = dir.0.join("secret");
    std::fs::write(&f, hex(&SECRET)).unwrap();
    f
}

/// What a member's socket received within `limit`: every MOVED that
/// verifies under the session's key (reason, within ms) and the number of
/// DATA.
fn receive(sock: &UdpSocket, session: &Session, limit: Duration) -> (Vec<(MovedReason, u16)>, usize) {
    let keys = session.request().keys;
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let (mut moved, mut data) = (Vec::new(), 0);
    let until = Instant::now() + limit;
    let mut buf = [0u8; 2048];
    while Instant::now() < until {
        let Ok((n, _)) = sock.recv_from(&mut buf) else { continue };
        let Ok(p) = Packet::parse(&buf[..n]) else { continue };
        match p.kind() {
            Kind::Moved if keys.verify(&p) => {
                let m = p.moved().unwrap();
                moved.push((m.reason.unwrap(), m.within_ms));
            }
            Kind::Data => data += 1,
            _ => {}
        }
    }
    (moved, data)
}

fn send_data(sock: &UdpSocket, session: &mut Session) {
    let mut b = vec![0u8; DATA_PAYLOAD + 8];
    let n = session.emit_data(8, &mut b).unwrap().unwrap();
    let to = session.request().reflector;
    sock.send_to(&b[..n], to).unwrap();
}

#[test]
fn a_draining_reflector_moves_its_members_and_stops_when_they_have_left() {
    let dir = Scratch::new("drain");
    let file = secret_file(&dir);
    let (mut serve, group, metrics) = start_serve(&file, &["--drain-timeout", "20s"]);
    let (a_sock, mut a) = join_session(&SECRET, group, 1).unwrap();
    let (b_sock, mut b) = join_session(&SECRET, group, 2).unwrap();
    assert_eq!(get_status(metrics, "/readyz").0, 200);

    serve.signal(Signal::SIGTERM);
    // Both told, each under its key, within about a second (the loops look
    // every 500 ms), and told again a second later: the datagram can be lost.
    let (moved_a, _) = receive(&a_sock, &a, Duration::from_millis(2_800));
    assert!(moved_a.len() >= 2, "MOVED once a second: {moved_a:?}");
    assert!(moved_a.len() <= 3, "but not more often: {moved_a:?}");
    let (reason, within) = moved_a[0];
    assert_eq!(reason, MovedReason::Draining);
    assert!(
        (15_000..=20_000).contains(&within),
        "within {within} ms of a 20 s drain"
    );
    let (moved_b, _) = receive(&b_sock, &b, Duration::from_millis(1_200));
    assert!(!moved_b.is_empty(), "the other member too");
    let (code, body) = get_status(metrics, "/readyz");
    assert_eq!((code, body.trim()), (503, "draining"));
    assert_eq!(get_status(metrics, "/healthz").0, 200, "alive all the same");

    // Still serving: a DATA from one member reaches the other.
    send_data(&a_sock, &mut a);
    let (_, data) = receive(&b_sock, &b, Duration::from_millis(500));
    assert_eq!(data, 1, "the group is served while it drains");
    assert!(serve.alive());
    assert!(metric(metrics, "reflector_moved_sent_total") >= 3);

    // The members go; the reflector stops soon after the last one.
    for (sock, session) in [(&a_sock, &mut a), (&b_sock, &mut b)] {
        let t = session.leave().unwrap();
        sock.send_to(t.datagram.as_bytes(), t.to).unwrap();
    }
    let status = serve.exited_within(Duration::from_secs(3)).expect("stopped once empty");
    assert!(status.success(), "{status:?}");
}

#[test]
fn a_drain_ends_at_its_deadline_and_no_drain_stops_at_once() {
    let dir = Scratch::new("deadline");
    let file = secret_file(&dir);
    let (mut serve, group, _) = start_serve(&file, &["--drain-timeout", "1500ms"]);
    let (_sock, _member) = join_session(&SECRET, group, 1).unwrap();
    let t0 = Instant::now();
    serve.signal(Signal::SIGTERM);
    assert!(serve.exited_within(Duration::from_millis(1_000)).is_none(), "draining");
    let status = serve
        .exited_within(Duration::from_secs(3))
        .expect("stopped at the deadline");
    assert!(status.success(), "{status:?}");
    assert!(t0.elapsed() >= Duration::from_millis(1_500));

    let (mut serve, group, _) = start_serve(&file, &[]);
    let (_sock, _member) = join_session(&SECRET, group, 2).unwrap();
    serve.signal(Signal::SIGTERM);
    let status = serve
        .exited_within(Duration::from_secs(1))
        .expect("no drain: stopped at once");
    assert!(status.success(), "{status:?}");
}
