//! A reflector that drains tells its members to move (MOVED, under each
//! member's key); the client asks the control server where to go, joins
//! there, and leaves the old reflector only once it is a member of the new
//! one (make-before-break), with nothing done by the game. The control
//! server here is a stub whose answer the test switches, as a fleet's
//! placement would change.
#![cfg(feature = "http")]

mod common;

use common::net::{ticket_json, HttpStub};
use common::{pump_until, token, Reflector};
use reflector_client::{Client, Config, ControlServer, Event, TokenSource};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn a_draining_reflector_moves_its_members_make_before_break() {
    let (a, b) = (Reflector::start(0, true), Reflector::start(0, true));
    let token_a = token(9, a.port, a.addr(), 300);
    let answer = Arc::new(Mutex::new(ticket_json(&token_a)));
    let stub = {
        let answer = Arc::clone(&answer);
        HttpStub::start(move || (200, Vec::new(), answer.lock().unwrap().clone()))
    };
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Control(ControlServer {
            url: stub.url.clone(),
            fallback_urls: Vec::new(),
            ticket: None,
            player: 9,
            position: (50.0, 50.0),
            ca_file: None,
            allow_plain_http: true,
        }))
    };
    let mut client = Client::new(cfg).expect("the client starts");
    // A player on the new reflector, to hear the client there.
    let mut peer = common::client(10, &b);
    let mut events = Vec::new();
    pump_until(
        &mut [&mut client, &mut peer],
        Duration::from_secs(5),
        &mut events,
        |cs, _| cs.iter().all(|c| c.is_member()),
    );
    assert_eq!(client.sending_group(), Some(a.port));
    let asked_before = stub.requests();

    // The cell is placed on b now; a drains.
    *answer.lock().unwrap() = ticket_json(&token(9, b.port, b.addr(), 300));
    events.clear();
    a.drain(Duration::from_secs(10));
    pump_until(
        &mut [&mut client, &mut peer],
        Duration::from_secs(5),
        &mut events,
        |_, ev| ev.iter().any(|(i, e)| *i == 0 && matches!(e, Event::LeftGroup { .. })),
    );
    let mine: Vec<&Event> = events.iter().filter(|(i, _)| *i == 0).map(|(_, e)| e).collect();
    let at = |f: &dyn Fn(&Event) -> bool| mine.iter().position(|e| f(e)).unwrap_or_else(|| panic!("{mine:?}"));
    let asked = at(
        &|e| matches!(e, Event::MoveAsked { group, reason: 1, within_ms } if *group == a.port && *within_ms > 5_000),
    );
    let joined = at(&|e| matches!(e, Event::Joined { group, .. } if *group == b.port));
    let moved = at(&|e| matches!(e, Event::Moved { from, to } if *from == a.port && *to == b.port));
    let left = at(&|e| matches!(e, Event::LeftGroup { group } if *group == a.port));
    assert!(
        asked < joined && joined < moved && moved <= left,
        "make-before-break: {mine:?}"
    );
    assert_eq!(client.sending_group(), Some(b.port));
    assert!(client.stats().moves_asked >= 1);
    // One placement asked for, however many MOVEDs came, carrying the token
    // held (the control server charges a re-placement to the player only).
    assert_eq!(stub.requests() - asked_before, 1, "{mine:?}");
    let held = hex::encode(token_a.token);
    assert!(
        stub.last_request().contains(&format!("held={held}")),
        "{}",
        stub.last_request()
    );

    // The client is heard on the new reflector, and a is empty.
    let sent = client.send(b"after the move").expect("sending to b");
    let mut heard = false;
    let mut ev = Vec::new();
    pump_until(
        &mut [&mut client, &mut peer],
        Duration::from_secs(3),
        &mut ev,
        |cs, _| {
            while let Some(d) = cs[1].recv() {
                heard |= d.sender == 9 && d.seq == sent;
            }
            heard
        },
    );
    pump_until(
        &mut [&mut client, &mut peer],
        Duration::from_secs(3),
        &mut ev,
        |_, _| a.counters().members == 0,
    );
}
