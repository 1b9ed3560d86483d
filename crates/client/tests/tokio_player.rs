//! The tokio example (`examples/tokio_player.rs`), run as written: two
//! players, each the example's own `run` as a task of one current-thread
//! runtime, through a real control server (plain HTTP, anonymous joins:
//! the token requests run on helper threads while the runtime's thread
//! drives both players) and a real reflector; each must hear the other.
#![cfg(all(feature = "http", feature = "tokio"))]

mod common;
// The example's code itself, not a copy of it (its `main` and argument
// parsing are not used here).
#[allow(dead_code)]
#[path = "../examples/tokio_player.rs"]
mod tokio_player;

use common::Reflector;
use std::time::{Duration, Instant};

#[tokio::test]
async fn two_tokio_players_of_the_example_hear_each_other() {
    let r = Reflector::start(0, false);
    let control = common::control_server(&r, None);
    let url = control.url();
    let players: Vec<_> = [1u32, 2]
        .into_iter()
        .map(|player| {
            let args = tokio_player::Args {
                control: url.clone(),
                ticket: None,
                player,
                position: (10.0, 10.0),
                plain_http: true,
                count: 20,
                timeout: Duration::from_secs(15),
            };
            tokio::spawn(async move { tokio_player::run(&args).await })
        })
        .collect();
    for (i, p) in players.into_iter().enumerate() {
        assert!(
            p.await.unwrap(),
            "player {} did not hear 20 datagrams of the other",
            i + 1
        );
    }
    // Both LEAVEs were sent; the reflector handles them on its own thread.
    let deadline = Instant::now() + Duration::from_secs(3);
    while r.counters().leaves < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = r.counters();
    assert!(t.forwarded >= 40 && t.leaves == 2, "{t:?}");
}
