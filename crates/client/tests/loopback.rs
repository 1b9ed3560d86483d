//! The client against a real reflector on 127.0.0.1, started in-process:
//! delivery, the rejoin rules, a reflector restart, NAT rebinding, echo
//! RTT, duplicates, the payload limit. Every wait has a deadline and every
//! send loop a count.

mod common;

use common::net::Relay;
use common::{client, join_all, pump_until, token, Reflector, KEEPALIVE_MS};
use reflector_client::{Client, Config, Event, RejoinReason, SendError, TokenSource};
use std::time::{Duration, Instant};

const KEEPALIVE: Duration = Duration::from_millis(KEEPALIVE_MS as u64);

/// Sends `n` numbered datagrams from `a` and pumps both until `b` has them
/// all; returns what `b` received (sender, seq, number) and `a`'s first and
/// last sequence numbers.
fn stream(a: &mut Client, b: &mut Client, n: u32) -> (Vec<(u32, u64, u32)>, u64, u64) {
    let mut got = Vec::new();
    let (mut first, mut last) = (0, 0);
    for i in 0..n {
        let seq = a.send(&i.to_be_bytes()).expect("a member sends");
        if i == 0 {
            first = seq;
        }
        last = seq;
        // Paced under the reflector's per-member rate cap (500/s), and
        // long enough that the sender's keepalives fall in the stream.
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(20));
        }
        a.update(Instant::now());
        b.update(Instant::now());
        while let Some(d) = b.recv() {
            got.push((d.sender, d.seq, u32::from_be_bytes(d.payload.try_into().unwrap())));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while got.len() < n as usize && Instant::now() < deadline {
        a.update(Instant::now());
        b.update(Instant::now());
        while let Some(d) = b.recv() {
            got.push((d.sender, d.seq, u32::from_be_bytes(d.payload.try_into().unwrap())));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    (got, first, last)
}

#[test]
fn two_clients_hear_each_other_without_loss() {
    let r = Reflector::start(0, true);
    let (mut a, mut b) = (client(1, &r), client(2, &r));
    let ev = join_all(&mut [&mut a, &mut b]);
    assert!(ev.iter().any(|(_, e)| matches!(e, Event::Joined { rejoin: false, .. })));
    const N: u32 = 300;
    for (forward, player) in [(true, 1u32), (false, 2)] {
        let (src, dst) = if forward { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let before = dst.stats();
        let (got, first, last) = stream(src, dst, N);
        assert_eq!(got.len(), N as usize, "every datagram arrives");
        assert!(got.iter().map(|g| g.2).eq(0..N), "in order, each once");
        assert!(got.iter().all(|g| g.0 == player));
        let after = dst.stats();
        assert_eq!(after.data_received - before.data_received, u64::from(N));
        assert_eq!(after.streams.duplicates, 0);
        assert_eq!(after.streams.reordered, 0);
        // The sender's numbers between its first and last DATA that did not
        // arrive are its own control datagrams (echoes, probe replies): the
        // gap count says exactly that many, no more.
        let gaps = after.streams.gaps - before.streams.gaps;
        let controls = (last - first + 1) - u64::from(N);
        assert_eq!(gaps, controls, "gaps are the sender's control datagrams only");
        assert!(controls >= 1, "the stream spans a keepalive interval");
    }
    // The receiver heard the sender's instance id.
    let mut events = Vec::new();
    while let Some(e) = b.poll_event() {
        events.push(e);
    }
    assert!(
        events.contains(&Event::SenderHeard {
            player: 1,
            instance: a.instance()
        }),
        "{events:?}"
    );
    r.stop();
}

#[test]
fn payload_above_the_maximum_is_refused() {
    for (instance, max) in [(true, 1432usize), (false, 1440)] {
        let r = Reflector::start(0, instance);
        let mut a = client(1, &r);
        assert_eq!(a.send(b"x"), Err(SendError::NotMember));
        join_all(&mut [&mut a]);
        assert_eq!(a.max_payload(), Some(max));
        assert!(a.send(&vec![7; max]).is_ok());
        let err = a.send(&vec![7; max + 1]).unwrap_err();
        assert_eq!(err, SendError::TooLarge { len: max + 1, max });
        assert!(err.to_string().contains("larger than"), "{err}");
        drop(a);
        r.stop();
    }
}

#[test]
fn echo_rtt_is_reported() {
    let r = Reflector::start(0, false);
    let mut a = client(1, &r);
    join_all(&mut [&mut a]);
    let mut ev = Vec::new();
    pump_until(&mut [&mut a], KEEPALIVE * 3, &mut ev, |c, _| {
        c[0].stats().rtt_last.is_some()
    });
    let s = a.stats();
    assert!(s.echoes_answered >= 1 && s.echoes_sent >= s.echoes_answered);
    let rtt = s.rtt_last.unwrap();
    assert!(rtt < Duration::from_millis(200), "{rtt:?} on loopback");
    assert!(s.rtt_min.unwrap() <= rtt && s.rtt_smoothed.is_some());
    r.stop();
}

#[test]
fn a_duplicate_is_dropped_and_counted() {
    let r = Reflector::start(0, true);
    let relay = Relay::start(r.addr());
    let mut a = client(1, &r);
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token(2, r.port, relay.addr, 300)))
    };
    let mut b = Client::new(cfg).unwrap();
    join_all(&mut [&mut a, &mut b]);
    relay.duplicate_next.store(true, std::sync::atomic::Ordering::SeqCst);
    let (got, _, _) = stream(&mut a, &mut b, 5);
    assert_eq!(got.len(), 5);
    // Let the copy arrive, then nothing more is delivered.
    let mut ev = Vec::new();
    pump_until(&mut [&mut b], Duration::from_secs(2), &mut ev, |c, _| {
        c[0].stats().streams.duplicates == 1
    });
    assert!(b.recv().is_none(), "the copy is not delivered");
    assert_eq!(b.stats().data_received, 5);
    r.stop();
}

#[test]
#[cfg(feature = "http")]
fn forged_not_member_rejoins_with_the_held_token_without_the_control_server() {
    use common::net::ticket_json;
    use reflector_client::ControlServer;
    use reflector_proto::protocol::{ErrorCode, SmallDatagram};
    let r = Reflector::start(0, false);
    let relay = Relay::start(r.addr());
    let t = token(9, r.port, relay.addr, 300);
    let body = ticket_json(&t);
    let stub = common::net::HttpStub::start(move || (200, vec![], body.clone()));
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(ControlServer {
            url: stub.url.clone(),
            fallback_urls: Vec::new(),
            ticket: Some("a.ticket.jwt".into()),
            player: 9,
            position: (1.0, 2.0),
            ca_file: None,
            allow_plain_http: true,
        }))
    };
    let mut c = Client::new(cfg).unwrap();
    let ev = join_all(&mut [&mut c]);
    assert!(ev.iter().any(|(_, e)| *e == Event::TokenRequested));
    assert_eq!(stub.requests(), 1);
    let before = c.send(b"before").expect("a member sends");
    // ERROR carries no MAC: anyone who knows the player id can send it.
    let forged = SmallDatagram::error(r.port, 9, 0, ErrorCode::NotMember);
    relay.inject(forged.as_bytes());
    let mut ev = Vec::new();
    pump_until(&mut [&mut c], Duration::from_secs(3), &mut ev, |_, ev| {
        ev.iter().any(|(_, e)| matches!(e, Event::Joined { rejoin: true, .. }))
    });
    assert_eq!(
        ev.first().map(|e| &e.1),
        Some(&Event::Rejoining {
            group: r.port,
            reason: RejoinReason::NotMember
        })
    );
    assert_eq!(stub.requests(), 1, "a forged error never reaches the control server");
    assert_eq!(c.stats().token_requests, 1);
    assert_eq!(c.stats().rejoins, 1);
    // One counter for the client: the new session goes on from the old one.
    assert!(c.send(b"after").expect("a member again") > before + 2);
    r.stop();
}

#[test]
fn a_restarted_reflector_is_rejoined_within_two_seconds() {
    let r = Reflector::start(0, false);
    let port = r.port;
    let mut c = client(3, &r);
    join_all(&mut [&mut c]);
    r.stop();
    // Gone for a moment: the client keeps its timers.
    let mut ev = Vec::new();
    let gone = Instant::now() + Duration::from_millis(300);
    pump_until(&mut [&mut c], Duration::from_secs(1), &mut ev, |_, _| {
        Instant::now() >= gone
    });
    let r = Reflector::start(port, false);
    let back = Instant::now();
    pump_until(&mut [&mut c], Duration::from_secs(2), &mut ev, |_, ev| {
        ev.iter().any(|(_, e)| matches!(e, Event::Joined { rejoin: true, .. }))
    });
    let took = back.elapsed();
    eprintln!("restart: rejoined {took:?} after the reflector came back; events {ev:?}");
    assert!(took < Duration::from_secs(2));
    assert!(
        ev.iter().any(|(_, e)| matches!(
            e,
            Event::Rejoining {
                group,
                reason: RejoinReason::NotMember | RejoinReason::ReflectorSilent
            } if *group == port
        )),
        "{ev:?}"
    );
    assert!(c.is_member());
    r.stop();
}

#[test]
fn a_rebound_client_receives_again_within_one_keepalive_interval() {
    let r = Reflector::start(0, false);
    let (mut a, mut b) = (client(1, &r), client(2, &r));
    join_all(&mut [&mut a, &mut b]);
    let (got, _, _) = stream(&mut a, &mut b, 10);
    assert_eq!(got.len(), 10);
    let old = b.local_addr().unwrap();
    let new = b.rebind().unwrap();
    assert_ne!(old, new);
    let moved = Instant::now();
    let before = b.stats().data_received;
    // The game goes on: `a` sends every 5 ms, `b` only updates.
    let mut ev = Vec::new();
    let mut i = 0u32;
    pump_until(&mut [&mut a, &mut b], KEEPALIVE * 4, &mut ev, |c, _| {
        i += 1;
        if i % 5 == 0 {
            let _ = c[0].send(&i.to_be_bytes());
        }
        while c[1].recv().is_some() {}
        c[1].stats().data_received > before
    });
    let took = moved.elapsed();
    eprintln!("rebound: receiving again after {took:?}");
    // Its next ECHO (due within one interval) draws the reflector's PROBE;
    // the margin is for the round trip and a busy machine.
    assert!(took < KEEPALIVE + Duration::from_millis(250), "took {took:?}");
    assert!(!ev.iter().any(|(_, e)| matches!(e, Event::Rejoining { .. })), "{ev:?}");
    r.stop();
}

#[test]
#[cfg(feature = "http")]
fn renewal_fetches_a_new_token_ahead_of_expiry_and_keeps_the_membership() {
    use reflector_client::ControlServer;
    let r = Reflector::start(0, false);
    // The first token expires in 11 s: its renewal moment (10 s before
    // expiry) comes within about a second; the second lasts.
    let short = common::net::ticket_json(&token(4, r.port, r.addr(), 11));
    let long = common::net::ticket_json(&token(4, r.port, r.addr(), 300));
    let served = std::sync::atomic::AtomicU64::new(0);
    let stub = common::net::HttpStub::start(move || {
        let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (200, vec![], if n == 0 { short.clone() } else { long.clone() })
    });
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(ControlServer {
            url: stub.url.clone(),
            fallback_urls: Vec::new(),
            ticket: None,
            player: 4,
            position: (0.0, 0.0),
            ca_file: None,
            allow_plain_http: true,
        }))
    };
    let mut c = Client::new(cfg).unwrap();
    join_all(&mut [&mut c]);
    let mut ev = Vec::new();
    pump_until(&mut [&mut c], Duration::from_secs(4), &mut ev, |_, ev| {
        ev.iter().any(|(_, e)| matches!(e, Event::Renewed { .. }))
    });
    assert!(
        ev.iter()
            .any(|(_, e)| matches!(e, Event::Renewed { group, .. } if *group == r.port)),
        "the renewal names its group: {ev:?}"
    );
    assert_eq!(stub.requests(), 2);
    assert!(
        !ev.iter()
            .any(|(_, e)| matches!(e, Event::Rejoining { .. } | Event::Joined { .. })),
        "{ev:?}"
    );
    assert!(c.is_member());
    assert_eq!(c.stats().renewals, 1);
    r.stop();
}

/// A renewal answered with a token that expires no later than the one held
/// (the control server answering within the second of its last grant, or
/// not extending an expiry of its own) is not asked again on every update
/// until the second rolls over: the client backs off (a quarter of the time
/// left, at least 1 s), and renews at the next try that brings a later
/// expiry.
#[test]
#[cfg(feature = "http")]
fn a_renewal_that_brought_no_later_expiry_is_not_asked_again_at_once() {
    use reflector_client::ControlServer;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Arc;
    let r = Reflector::start(0, false);
    // The token expires in 11 s: its renewal moment (10 s before expiry)
    // comes within about a second, and the stub answers the renewal with
    // the very same token (same expiry) until `extend` is set.
    let same = common::net::ticket_json(&token(4, r.port, r.addr(), 11));
    let later = common::net::ticket_json(&token(4, r.port, r.addr(), 300));
    let extend = Arc::new(AtomicBool::new(false));
    let stub = {
        let extend = Arc::clone(&extend);
        common::net::HttpStub::start(move || {
            let body = if extend.load(SeqCst) { &later } else { &same };
            (200, vec![], body.clone())
        })
    };
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(ControlServer {
            allow_plain_http: true,
            ..ControlServer::new(stub.url.clone(), 4, (0.0, 0.0))
        }))
    };
    let mut c = Client::new(cfg).unwrap();
    join_all(&mut [&mut c]);
    let joined = Instant::now();
    let mut ev = Vec::new();
    // 3 s of updates every millisecond: the renewal moment and the back-off
    // after its answer (about 2.5 s with 10 s left).
    pump_until(&mut [&mut c], Duration::from_secs(5), &mut ev, |_, _| {
        joined.elapsed() >= Duration::from_secs(3)
    });
    let asked = stub.requests();
    assert!(asked >= 2, "the renewal moment came: {asked} requests");
    assert!(
        asked <= 3,
        "{asked} requests in 3 s: a renewal that brought no later expiry was asked again at once"
    );
    assert!(!ev.iter().any(|(_, e)| matches!(e, Event::Renewed { .. })), "{ev:?}");
    assert!(c.is_member());
    // A later expiry is taken at the next try, after the back-off.
    extend.store(true, SeqCst);
    pump_until(&mut [&mut c], Duration::from_secs(5), &mut ev, |_, ev| {
        ev.iter().any(|(_, e)| matches!(e, Event::Renewed { .. }))
    });
    assert!(
        ev.iter()
            .any(|(_, e)| matches!(e, Event::Renewed { group, .. } if *group == r.port)),
        "{ev:?}"
    );
    assert!(stub.requests() <= asked + 2, "{} requests", stub.requests());
    assert!(
        !ev.iter()
            .any(|(_, e)| matches!(e, Event::Rejoining { .. } | Event::Joined { .. })),
        "{ev:?}"
    );
    assert_eq!(c.stats().renewals, 1);
    r.stop();
}
