//! Areas of interest against a real reflector (one group per cell, in
//! process) and a real control server (anonymous joins, plain HTTP on
//! loopback): a client with an area hears its neighbours' cells, each
//! datagram once; a mover crosses into the next cell make-before-break
//! without losing a datagram it was owed. Every wait has a deadline.
#![cfg(feature = "http")]

mod common;

use common::{pump_until, token, Reflector};
use reflector_client::{Client, Config, ControlServer, Event, TokenSource};
use reflector_proto::client::{Config as SessionConfig, JoinRequest};
use reflector_proto::protocol::{SessionKeys, DATA_PAYLOAD, INSTANCE_LEN};
use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// A client that asks the control server at `url` for the area of
/// `radius` cells around `position`.
fn area_client(url: &str, player: u32, position: (f64, f64), radius: u8) -> Client {
    let control = ControlServer {
        allow_plain_http: true,
        ..ControlServer::new(url, player, position)
    };
    Client::new(Config {
        local: "127.0.0.1:0".into(),
        area_radius: radius,
        ..Config::new(TokenSource::Control(control))
    })
    .expect("the client starts")
}

/// The centre of cell `x` of a one-row world of 100-unit cells.
fn centre(x: usize) -> (f64, f64) {
    (x as f64 * 100.0 + 50.0, 50.0)
}

/// The cells within `radius` of cell `x` in a row of `cols`.
fn area(x: usize, radius: u8, cols: usize) -> Vec<usize> {
    (x.saturating_sub(radius.into())..=(x + usize::from(radius)).min(cols - 1)).collect()
}

fn sorted_groups(c: &Client) -> Vec<u16> {
    let mut g: Vec<u16> = c.member_groups().collect();
    g.sort_unstable();
    g
}

fn ports_of(cells: &[usize], ports: &[u16]) -> Vec<u16> {
    let mut g: Vec<u16> = cells.iter().map(|&c| ports[c]).collect();
    g.sort_unstable();
    g
}

/// Pumps until client i is a member of exactly the groups of `want[i]`
/// (and can send).
fn join_areas(clients: &mut [&mut Client], ports: &[u16], want: &[Vec<usize>]) {
    let want: Vec<Vec<u16>> = want.iter().map(|cells| ports_of(cells, ports)).collect();
    let mut ev = Vec::new();
    pump_until(clients, Duration::from_secs(10), &mut ev, |cs, _| {
        cs.iter()
            .zip(&want)
            .all(|(c, w)| c.is_member() && sorted_groups(c) == *w)
    });
}

#[test]
fn an_area_hears_its_neighbours_cell_and_each_datagram_once() {
    let r = Reflector::start_groups(3);
    let ports = r.ports();
    let control = common::area_control_server(&r, 3, 1);
    let url = control.url();
    // The listener in cell 0, radius 1: cells 0 and 1. The near sender in
    // cell 1, radius 1, holds all three groups (its area overlaps the
    // listener's) and sends to its cell only; the far one in cell 2 is
    // out of the listener's area and must not be heard.
    let mut listener = area_client(&url, 1, centre(0), 1);
    let mut near = area_client(&url, 2, centre(1), 1);
    let mut far = area_client(&url, 3, centre(2), 0);
    join_areas(
        &mut [&mut listener, &mut near, &mut far],
        &ports,
        &[vec![0, 1], vec![0, 1, 2], vec![2]],
    );
    assert_eq!(listener.sending_group(), Some(ports[0]));
    assert_eq!(near.sending_group(), Some(ports[1]));

    const N: u32 = 100;
    let mut got: Vec<(u32, u16, u32)> = Vec::new();
    fn collect(l: &mut Client, got: &mut Vec<(u32, u16, u32)>) {
        while let Some(d) = l.recv() {
            let n = u32::from_be_bytes(d.payload[..4].try_into().expect("4 bytes"));
            got.push((d.sender, d.group, n));
        }
    }
    for i in 0..N {
        near.send(&i.to_be_bytes()).expect("near is a member");
        far.send(&i.to_be_bytes()).expect("far is a member");
        if i % 10 == 9 {
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in [&mut near, &mut far, &mut listener] {
            c.update(Instant::now());
        }
        collect(&mut listener, &mut got);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while got.iter().filter(|g| g.0 == 2).count() < N as usize && Instant::now() < deadline {
        for c in [&mut near, &mut far, &mut listener] {
            c.update(Instant::now());
        }
        collect(&mut listener, &mut got);
        std::thread::sleep(Duration::from_millis(1));
    }
    let from_near: Vec<u32> = got.iter().filter(|g| g.0 == 2).map(|g| g.2).collect();
    assert_eq!(
        from_near,
        (0..N).collect::<Vec<_>>(),
        "every datagram of the neighbour, once, in order"
    );
    assert!(
        got.iter().filter(|g| g.0 == 2).all(|g| g.1 == ports[1]),
        "each names the neighbour's group"
    );
    assert!(got.iter().all(|g| g.0 != 3), "nothing from outside the area");
    assert_eq!(listener.stats().streams.duplicates, 0);

    // A sender in two groups of the listener's area at once, sending every
    // datagram to both under one instance id and sequence number (as the
    // protocol's client-wide counter numbers them): both copies arrive,
    // the second is dropped.
    let sock = UdpSocket::bind("127.0.0.1:0").expect("a socket");
    let cfg = SessionConfig {
        retry: Duration::from_millis(100),
        give_up: Some(Duration::from_secs(5)),
    };
    let mut sessions: Vec<_> = [ports[0], ports[1]]
        .into_iter()
        .map(|group| {
            let at = SocketAddr::from(([127, 0, 0, 1], group));
            let t = token(4, group, at, 300);
            let req = JoinRequest {
                reflector: at,
                group,
                player: 4,
                token: t.token,
                keys: SessionKeys::from_session(t.session_key),
                first_seq: 1,
            };
            let (s, ack) = reflector_proto::blocking::join(&sock, req, cfg).expect("the double sender joins");
            assert!(ack.instance(), "the groups carry instance ids");
            s
        })
        .collect();
    let before = listener.stats().streams.duplicates;
    const M: u32 = 50;
    let instance = 0x5eed_u64;
    let mut buf = [0u8; 128];
    let mut doubled = Vec::new();
    for k in 0..M {
        let seq = sessions.iter().map(|s| s.next_seq()).max().expect("two sessions");
        for s in sessions.iter_mut() {
            s.advance_seq(seq);
            buf[DATA_PAYLOAD..DATA_PAYLOAD + INSTANCE_LEN].copy_from_slice(&instance.to_be_bytes());
            buf[DATA_PAYLOAD + INSTANCE_LEN..DATA_PAYLOAD + INSTANCE_LEN + 4].copy_from_slice(&k.to_be_bytes());
            let n = s
                .emit_data(INSTANCE_LEN + 4, &mut buf)
                .expect("a member")
                .expect("it fits");
            sock.send_to(&buf[..n], s.request().reflector).expect("sent");
        }
        if k % 10 == 9 {
            std::thread::sleep(Duration::from_millis(10));
        }
        listener.update(Instant::now());
        while let Some(d) = listener.recv() {
            if d.sender == 4 {
                assert_eq!(d.instance, instance);
                doubled.push(u32::from_be_bytes(d.payload[..4].try_into().expect("4 bytes")));
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while listener.stats().streams.duplicates - before < u64::from(M) && Instant::now() < deadline {
        listener.update(Instant::now());
        while let Some(d) = listener.recv() {
            if d.sender == 4 {
                doubled.push(u32::from_be_bytes(d.payload[..4].try_into().expect("4 bytes")));
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        doubled,
        (0..M).collect::<Vec<_>>(),
        "each datagram sent to two groups is delivered once"
    );
    assert_eq!(
        listener.stats().streams.duplicates - before,
        u64::from(M),
        "both copies arrived and the second of each was dropped"
    );
}

/// A mover with `radius` crosses from cell 1 into cell 2 of a row of 4
/// while a stationary player in each cell sends a numbered datagram every
/// 5 ms. Owed to the mover: what was sent to a group after its JOIN_ACK
/// there and before its LEAVE (the test drives every client from this one
/// thread, so "after the update that reported it" and "before the update
/// that sent the LEAVE" are exact).
fn cross_one_cell(radius: u8) {
    const COLS: usize = 4;
    let r = Reflector::start_groups(COLS);
    let ports = r.ports();
    let control = common::area_control_server(&r, COLS as u32, 1);
    let url = control.url();
    let mut mover = area_client(&url, 1, centre(1), radius);
    let mut cells: Vec<Client> = (0..COLS)
        .map(|x| area_client(&url, 10 + x as u32, centre(x), 0))
        .collect();
    let (old_area, new_area) = (area(1, radius, COLS), area(2, radius, COLS));
    {
        let mut all: Vec<&mut Client> = std::iter::once(&mut mover).chain(cells.iter_mut()).collect();
        let want: Vec<Vec<usize>> = std::iter::once(old_area.clone())
            .chain((0..COLS).map(|x| vec![x]))
            .collect();
        join_areas(&mut all, &ports, &want);
    }
    let to_leave: HashSet<u16> = old_area
        .iter()
        .filter(|c| !new_area.contains(c))
        .map(|&c| ports[c])
        .collect();
    let to_join: HashSet<u16> = new_area
        .iter()
        .filter(|c| !old_area.contains(c))
        .map(|&c| ports[c])
        .collect();

    // (player, seq, group, index of the send)
    let mut sent: Vec<(u32, u64, u16, usize)> = Vec::new();
    // Per group: sends from this index on are owed, up to (not with) the other.
    let mut owed_from: HashMap<u16, usize> = old_area.iter().map(|&c| (ports[c], 0)).collect();
    let mut owed_to: HashMap<u16, usize> = HashMap::new();
    let mut heard: HashMap<(u32, u64), u32> = HashMap::new();
    let mut mover_events: Vec<Event> = Vec::new();
    // The mover's own sends: (seq, after its Moved event).
    let mut mover_sent: Vec<(u64, bool)> = Vec::new();
    let mut heard_from_mover: Vec<HashSet<u64>> = vec![HashSet::new(); COLS];
    let start = Instant::now();
    let deadline = start + Duration::from_secs(20);
    let tick = Duration::from_millis(5);
    let mut next_send = start;
    let mut number = 0u32;
    let mut asked = false;
    let mut moved = false;
    let mut settled_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        assert!(
            now < deadline,
            "the move did not settle; mover's events: {mover_events:?}"
        );
        let sending = settled_at.is_none_or(|t| now < t + Duration::from_millis(300));
        if !sending && now >= settled_at.expect("settled") + Duration::from_millis(600) {
            break;
        }
        if sending && now >= next_send {
            next_send += tick;
            number += 1;
            for (x, c) in cells.iter_mut().enumerate() {
                let seq = c.send(&number.to_be_bytes()).expect("a stationary sender is a member");
                sent.push((10 + x as u32, seq, ports[x], sent.len()));
            }
            let seq = mover
                .send(&number.to_be_bytes())
                .expect("the mover always has a group to send to");
            mover_sent.push((seq, moved));
        }
        if !asked && now >= start + Duration::from_millis(300) {
            assert!(mover.set_position(centre(2)), "the mover asks the control server");
            asked = true;
        }
        for (x, c) in cells.iter_mut().enumerate() {
            c.update(Instant::now());
            while let Some(e) = c.poll_event() {
                assert!(
                    !matches!(e, Event::Rejoining { .. } | Event::Error(_)),
                    "cell {x}: {e:?}"
                );
            }
            while let Some(d) = c.recv() {
                if d.sender == 1 {
                    heard_from_mover[x].insert(d.seq);
                }
            }
        }
        let sends_before = sent.len();
        mover.update(Instant::now());
        while let Some(e) = mover.poll_event() {
            match e {
                Event::Joined { group, .. } => {
                    owed_from.insert(group, sends_before);
                }
                Event::LeftGroup { group } => {
                    owed_to.insert(group, sends_before);
                }
                Event::Moved { .. } => moved = true,
                Event::Rejoining { .. } | Event::Error(_) => panic!("the mover: {e:?}"),
                _ => {}
            }
            mover_events.push(e);
        }
        while let Some(d) = mover.recv() {
            *heard.entry((d.sender, d.seq)).or_default() += 1;
        }
        if settled_at.is_none() && moved && to_leave.iter().all(|g| owed_to.contains_key(g)) {
            settled_at = Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    // The steps, in order: the new groups' JOIN_ACKs, then (and only
    // then) the LEAVEs; sending switched to the new cell exactly once.
    let pos = |f: &dyn Fn(&Event) -> bool| mover_events.iter().position(f);
    let moves: Vec<&Event> = mover_events
        .iter()
        .filter(|e| matches!(e, Event::Moved { .. }))
        .collect();
    assert_eq!(
        moves,
        [&Event::Moved {
            from: ports[1],
            to: ports[2]
        }],
        "{mover_events:?}"
    );
    for &g in &to_leave {
        let left = pos(&|e| *e == Event::LeftGroup { group: g }).expect("left");
        for &j in &to_join {
            let joined = pos(&|e| matches!(e, Event::Joined { group, .. } if *group == j)).expect("joined");
            assert!(joined < left, "group {j} joined before {g} was left: {mover_events:?}");
        }
    }
    assert_eq!(sorted_groups(&mover), ports_of(&new_area, &ports));
    assert_eq!(mover.sending_group(), Some(ports[2]));

    // Nothing owed lost, nothing delivered twice.
    let owed: Vec<(u32, u64)> = sent
        .iter()
        .filter(|(_, _, g, i)| owed_from.get(g).is_some_and(|&f| *i >= f) && owed_to.get(g).is_none_or(|&t| *i < t))
        .map(|&(p, s, _, _)| (p, s))
        .collect();
    let lost: Vec<&(u32, u64)> = owed.iter().filter(|k| !heard.contains_key(k)).collect();
    assert!(
        lost.is_empty(),
        "{} of {} owed datagrams lost: {lost:?}",
        lost.len(),
        owed.len()
    );
    assert!(heard.values().all(|&n| n == 1), "a datagram delivered twice");
    // The windows are not empty: the old groups were heard up to their
    // LEAVE, the new ones from their JOIN_ACK.
    for &g in to_leave.iter().chain(&to_join) {
        let in_group = owed.iter().filter(|(p, _)| ports[(*p - 10) as usize] == g).count();
        assert!(in_group >= 20, "group {g}: only {in_group} owed");
    }

    // The mover's sends: to the old cell before the switch, to the new one
    // after it, every one heard there.
    let (before, after): (Vec<_>, Vec<_>) = mover_sent.iter().partition(|(_, moved)| !moved);
    assert!(
        before.len() >= 20 && after.len() >= 20,
        "{} before, {} after",
        before.len(),
        after.len()
    );
    assert!(
        before.iter().all(|(s, _)| heard_from_mover[1].contains(s)),
        "the old cell heard the mover"
    );
    assert!(
        after.iter().all(|(s, _)| heard_from_mover[2].contains(s)),
        "the new cell hears the mover"
    );
    assert!(
        after.iter().all(|(s, _)| !heard_from_mover[1].contains(s)),
        "the old cell does not"
    );
    println!(
        "radius {radius}: {} owed to the mover, 0 lost; {} mover sends after the move, all heard in the new cell",
        owed.len(),
        after.len()
    );
}

#[test]
fn a_mover_crosses_make_before_break_without_losing_an_owed_datagram() {
    cross_one_cell(0);
}

#[test]
fn a_mover_with_an_area_crosses_without_losing_an_owed_datagram() {
    cross_one_cell(1);
}

/// The rejoin rules stay per group: a NotMember in one group of the area
/// rejoins that group with its held token (the other group and the
/// control server untouched), and the renewal moment asks the control
/// server once for the whole area, every group renewed from that answer.
#[test]
fn a_group_rejoins_on_its_own_and_one_request_renews_the_area() {
    use common::net::{ticket_json, HttpStub, Relay};
    use reflector_client::RejoinReason;
    use reflector_proto::protocol::{ErrorCode, SmallDatagram};
    let r = Reflector::start_groups(2);
    let ports = r.ports();
    // The neighbour's group through a relay, so the test can forge an
    // ERROR "from the reflector" there.
    let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], ports[1])));
    let cell_at = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let area_json = |ttl_s: u64| {
        let mut answer: serde_json::Value =
            serde_json::from_str(&ticket_json(&token(9, ports[0], cell_at, ttl_s))).expect("JSON");
        let neighbour: serde_json::Value =
            serde_json::from_str(&ticket_json(&token(9, ports[1], relay.addr, ttl_s))).expect("JSON");
        answer["area"] = serde_json::Value::Array(vec![neighbour]);
        answer.to_string()
    };
    // The first tokens expire in 11 s: their renewal moment (10 s before
    // expiry) comes within about a second; the next ones last.
    let (short, long) = (area_json(11), area_json(300));
    let served = std::sync::atomic::AtomicU64::new(0);
    let stub = HttpStub::start(move || {
        let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (200, vec![], if n == 0 { short.clone() } else { long.clone() })
    });
    let mut c = area_client(&stub.url, 9, (0.0, 0.0), 1);
    join_areas(&mut [&mut c], &ports, &[vec![0, 1]]);
    assert_eq!(stub.requests(), 1, "one request for the whole area");

    let forged = SmallDatagram::error(ports[1], 9, 0, ErrorCode::NotMember);
    relay.inject(forged.as_bytes());
    let mut ev = Vec::new();
    pump_until(&mut [&mut c], Duration::from_secs(3), &mut ev, |_, ev| {
        ev.iter()
            .any(|(_, e)| matches!(e, Event::Joined { group, rejoin: true, .. } if *group == ports[1]))
    });
    assert_eq!(
        ev.first().map(|e| &e.1),
        Some(&Event::Rejoining {
            group: ports[1],
            reason: RejoinReason::NotMember
        }),
        "the rejoin names the neighbour's group"
    );
    assert!(
        !ev.iter()
            .any(|(_, e)| matches!(e, Event::Joined { group, .. } if *group == ports[0])),
        "the cell's group is not touched: {ev:?}"
    );
    assert_eq!(stub.requests(), 1, "a rejoin uses the token held");
    assert_eq!(c.sending_group(), Some(ports[0]));

    let mut ev = Vec::new();
    pump_until(&mut [&mut c], Duration::from_secs(4), &mut ev, |_, ev| {
        ev.iter().filter(|(_, e)| matches!(e, Event::Renewed { .. })).count() == 2
    });
    assert_eq!(stub.requests(), 2, "one request renewed both groups");
    let mut renewed: Vec<u16> = ev
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Renewed { group, .. } => Some(*group),
            _ => None,
        })
        .collect();
    renewed.sort_unstable();
    assert_eq!(renewed, ports_of(&[0, 1], &ports), "each renewal names its group");
    assert!(
        !ev.iter()
            .any(|(_, e)| matches!(e, Event::Rejoining { .. } | Event::Joined { .. })),
        "{ev:?}"
    );
    assert_eq!(c.stats().renewals, 2);
    assert_eq!(sorted_groups(&c), ports_of(&[0, 1], &ports));
    r.stop();
}
