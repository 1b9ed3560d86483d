//! The tokio driver against a real reflector on 127.0.0.1, started
//! in-process: clients driven only by the async loop (`ready`,
//! `update_when_due`, `send_async`), never by an `update` of the test's.
//! Each test runs on one current-thread runtime, so anything that blocked
//! in the client would stall every client of the test.
#![cfg(feature = "tokio")]

mod common;

use common::{token, Reflector, KEEPALIVE_MS};
use reflector_client::{Client, Config, Event, TokenSource, TokioDriver};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// A client of `r`'s group for `player`, over the tokio driver.
fn client(player: u32, r: &Reflector) -> Client<TokioDriver> {
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token(player, r.port, r.addr(), 300)))
    };
    Client::new_tokio(cfg).expect("the client starts")
}

const N: u32 = 200;

/// One player's loop: once both players are members (`joined` counts
/// them), sends `N` numbered datagrams, one every 5 ms (under the
/// reflector's per-member rate cap); takes whatever arrives; stops when it
/// has sent `N` and heard `N`. Returns the numbers heard from `other`, in
/// order of arrival, and its events.
async fn player(mut c: Client<TokioDriver>, other: u32, joined: Arc<AtomicUsize>) -> (Vec<u32>, Vec<Event>) {
    let (mut heard, mut events, mut sent) = (Vec::new(), Vec::new(), 0u32);
    let mut pace = tokio::time::interval(Duration::from_millis(5));
    while sent < N || heard.len() < N as usize {
        tokio::select! {
            alive = c.ready() => assert!(alive, "not left"),
            _ = pace.tick() => {
                if sent < N && joined.load(SeqCst) == 2 {
                    c.send_async(&sent.to_be_bytes()).await.expect("a member sends");
                    sent += 1;
                }
            }
        }
        while let Some(e) = c.poll_event() {
            if matches!(e, Event::Joined { .. }) {
                joined.fetch_add(1, SeqCst);
            }
            events.push(e);
        }
        while let Some(d) = c.recv() {
            assert_eq!(d.sender, other);
            heard.push(u32::from_be_bytes(d.payload.try_into().expect("a number")));
        }
    }
    (heard, events)
}

#[tokio::test]
async fn two_tokio_clients_hear_each_other_driven_only_by_the_async_loop() {
    let r = Reflector::start(0, true);
    let joined = Arc::new(AtomicUsize::new(0));
    // Spawned tasks: the client is Send, so it can live in one.
    let a = tokio::spawn(player(client(1, &r), 2, Arc::clone(&joined)));
    let b = tokio::spawn(player(client(2, &r), 1, Arc::clone(&joined)));
    let both = async { (a.await.expect("player 1"), b.await.expect("player 2")) };
    let ((heard_a, ev_a), (heard_b, ev_b)) = tokio::time::timeout(Duration::from_secs(15), both)
        .await
        .expect("both heard every datagram of the other within 15 s");
    for (heard, events) in [(&heard_a, &ev_a), (&heard_b, &ev_b)] {
        assert!(heard.iter().copied().eq(0..N), "every datagram, in order, once");
        assert!(
            events.iter().any(|e| matches!(e, Event::Joined { rejoin: false, .. })),
            "{events:?}"
        );
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, Event::Error(_) | Event::Rejoining { .. })),
            "{events:?}"
        );
    }
    r.stop();
}

#[tokio::test]
async fn an_idle_member_keeps_its_membership_on_its_timers_alone_without_spinning() {
    let r = Reflector::start(0, false);
    let mut c = client(1, &r);
    let mut updates = 0u32;
    tokio::time::timeout(Duration::from_secs(5), async {
        while !c.is_member() {
            c.update_when_due().await;
        }
    })
    .await
    .expect("joined within 5 s");
    // Four keepalive intervals with nothing sent: the ECHOs go out on
    // their timer (and are answered), so the reflector never finds us
    // silent; the loop wakes only for them, the PROBEs and the replies
    // (a spinning loop would update thousands of times).
    let keepalive = Duration::from_millis(KEEPALIVE_MS.into());
    let echoes = c.stats().echoes_sent;
    let _ = tokio::time::timeout(keepalive * 4, async {
        loop {
            c.update_when_due().await;
            updates += 1;
        }
    })
    .await;
    let s = c.stats();
    assert!(s.echoes_sent - echoes >= 3, "an ECHO each interval: {s:?}");
    assert!(s.echoes_answered >= 2, "{s:?}");
    assert!(updates <= 40, "{updates} updates in four keepalive intervals");
    assert!(c.is_member() && s.rejoins == 0, "{s:?}");
    let mut events = Vec::new();
    while let Some(e) = c.poll_event() {
        events.push(e);
    }
    assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
    // Left, nothing more comes.
    c.leave();
    assert_eq!(c.next_update(), None);
    assert!(c.ready().await, "the Left event");
    assert_eq!(c.poll_event(), Some(Event::Left));
    assert!(!c.ready().await);
    drop(c);
    r.stop();
}

#[tokio::test]
async fn the_tokio_driver_is_made_within_a_runtime_only() {
    // Within one: fine. Outside (another thread, no runtime): an error,
    // not a panic.
    assert!(TokioDriver::bind("127.0.0.1:0").is_ok());
    let outside = std::thread::spawn(|| TokioDriver::bind("127.0.0.1:0").map(|_| ()))
        .join()
        .expect("no panic");
    let e = outside.expect_err("no runtime");
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}
