//! The "first group" guide's example (`examples/first_group.rs`), run as
//! written: two players, each the example's own `run`, through a real
//! control server (plain HTTP, anonymous joins) and a real reflector; each
//! must hear the other's datagrams.
#![cfg(feature = "http")]

mod common;
// The example's code itself, not a copy of it (its `main` and argument
// parsing are not used here).
#[allow(dead_code)]
#[path = "../examples/first_group.rs"]
mod first_group;

use common::Reflector;
use std::time::Duration;

#[test]
fn two_players_of_the_guide_hear_each_other() {
    let r = Reflector::start(0, false);
    let control = common::control_server(&r, None);
    let url = control.url();
    let players: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|player| {
            let args = first_group::Args {
                control: url.clone(),
                ticket: None,
                player,
                position: (10.0, 10.0),
                plain_http: true,
                count: 20,
                timeout: Duration::from_secs(15),
            };
            std::thread::spawn(move || first_group::run(&args))
        })
        .collect();
    for (i, p) in players.into_iter().enumerate() {
        assert!(
            p.join().unwrap(),
            "player {} did not hear 20 datagrams of the other",
            i + 1
        );
    }
    // Both LEAVEs were sent; the reflector handles them on its own thread.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while r.counters().leaves < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let t = r.counters();
    assert!(t.forwarded >= 40 && t.leaves == 2, "{t:?}");
}
