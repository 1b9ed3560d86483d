//! The tokio driver against a real reflector on 127.0.0.1, started
//! in-process: clients driven only by the async loop (`ready`,
//! `update_when_due`, `send_async`), never by an `update` of the test's.
//! Each test runs on one current-thread runtime, so anything that blocked
//! in the client would stall every client of the test. What the UDP socket
//! does not show (a token answer, a checkpoint exchange's socket) wakes
//! the loop: with polling set to an hour, both still complete.
#![cfg(feature = "tokio")]

mod common;

use common::{token, Reflector, KEEPALIVE_MS};
use reflector_client::{CheckpointEvent, CheckpointOp, Client, Config, Event, TokenSource, TokioDriver};
use reflector_proto::checkpoint::{Answer, Hello, Reply, Stored, REQUEST_LEN};
use reflector_proto::protocol::SessionKeys;
use reflector_server::checkpoint::CheckpointConfig;
use std::io::{Read, Write};
use std::net::TcpListener;
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

/// A poll interval no test waits out: the work below must wake the loop.
const NO_POLL: Duration = Duration::from_secs(3600);

/// A keepalive of a minute: no PROBE, ECHO or reply wakes the loop within
/// a test.
const QUIET_KEEPALIVE_MS: u16 = 60_000;

/// A checkpoint event without its state's bytes (their count only).
fn brief(e: &CheckpointEvent) -> String {
    match e {
        CheckpointEvent::Checkpoint { op, number, bytes, .. } => {
            format!("Checkpoint {{ op: {op:?}, number: {number}, {} bytes }}", bytes.len())
        }
        other => format!("{other:?}"),
    }
}

/// Runs `c`'s async loop (`update_when_due`, nothing else) until `done`
/// holds on its events and checkpoint events so far; returns the number
/// of wake-ups (updates) it took. Fails after `within`: the only thing
/// that would end a wait then is a poll of an hour or a minute's timer.
async fn loop_until(
    c: &mut Client<TokioDriver>,
    within: Duration,
    events: &mut Vec<Event>,
    checkpoints: &mut Vec<CheckpointEvent>,
    mut done: impl FnMut(&[Event], &[CheckpointEvent]) -> bool,
) -> u32 {
    let mut updates = 0u32;
    let ended = tokio::time::timeout(within, async {
        while !done(events, checkpoints) {
            c.update_when_due().await;
            updates += 1;
            events.extend(std::iter::from_fn(|| c.poll_event()));
            checkpoints.extend(std::iter::from_fn(|| c.poll_checkpoint()));
        }
    })
    .await;
    assert!(
        ended.is_ok(),
        "not done within {within:?} after {updates} updates: the loop was not woken; events {events:?}, checkpoints {:?}",
        checkpoints.iter().map(brief).collect::<Vec<_>>()
    );
    updates
}

/// The token request's answer, which comes in on a helper thread, wakes
/// the loop: with polling set to an hour (and nothing on the UDP socket
/// before the token is there to join with), the client still asks, joins
/// and is a member, in a handful of wake-ups.
#[cfg(feature = "http")]
#[tokio::test]
async fn a_token_answer_wakes_the_loop_instead_of_a_poll() {
    use reflector_client::ControlServer;
    use std::time::Instant;
    let r = Reflector::start(0, false);
    let control = common::control_server(&r, None);
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        background_poll: Some(NO_POLL),
        ..Config::new(TokenSource::Control(ControlServer {
            allow_plain_http: true,
            ..ControlServer::new(control.url(), 1, (10.0, 10.0))
        }))
    };
    let mut c = Client::new_tokio(cfg).expect("the client starts");
    // The request is in flight (on its thread) before the first wait.
    assert!(c
        .next_update()
        .is_some_and(|t| t > Instant::now() + Duration::from_secs(60)));
    let (mut events, mut checkpoints) = (Vec::new(), Vec::new());
    let updates = loop_until(
        &mut c,
        Duration::from_secs(20),
        &mut events,
        &mut checkpoints,
        |e, _| e.iter().any(|e| matches!(e, Event::Joined { .. })),
    )
    .await;
    assert_eq!(events.first(), Some(&Event::TokenRequested), "{events:?}");
    assert!(c.is_member());
    assert_eq!(c.stats().token_requests, 1);
    // The answer, the challenge, the JOIN_ACK, and a spare: a loop that
    // polled would have waited an hour, one that spun would count far more.
    assert!(updates <= 8, "{updates} updates to join");
    drop(c);
    control.stop();
    r.stop();
}

/// A checkpoint channel that takes its time: it accepts one connection
/// and waits `pause` before each thing it sends (the HELLO; the REPLY,
/// a CHECKPOINT signed under `keys`, with the first half of `state`; the
/// second half), so every step of the client's exchange finds its socket
/// not ready yet and must be woken when it is. Returns its address; the
/// thread returns whether it served the exchange to the end.
fn slow_channel(
    keys: SessionKeys,
    state: Vec<u8>,
    pause: Duration,
) -> (std::net::SocketAddr, std::thread::JoinHandle<bool>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("a listener");
    let addr = l.local_addr().expect("its address");
    let server = std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let challenge = 0x77;
        let hello = Hello {
            challenge,
            max_state: 1 << 20,
            hello_deadline_ms: 10_000,
        };
        std::thread::sleep(pause);
        let mut req = [0u8; REQUEST_LEN];
        if s.write_all(&hello.encode()).is_err() || s.read_exact(&mut req).is_err() {
            return false;
        }
        let mut req_mac = [0u8; 16];
        req_mac.copy_from_slice(&req[48..]);
        let stored = Stored {
            number: 5,
            tick: 99,
            from_player: 2,
            digest: reflector_proto::checkpoint::digest(&state),
        };
        let answer = Answer::Checkpoint {
            stored,
            body_len: state.len() as u64,
            age_ms: 1,
        };
        let reply = Reply::signed(answer, &keys, challenge, &req_mac).encode();
        let (first, second) = state.split_at(state.len() / 2);
        std::thread::sleep(pause);
        if s.write_all(&reply).is_err() || s.write_all(first).is_err() {
            return false;
        }
        std::thread::sleep(pause);
        if s.write_all(second).is_err() {
            return false;
        }
        // Held open until the client has read it all and closed its end.
        let mut rest = [0u8; 1];
        matches!(s.read(&mut rest), Ok(0))
    });
    (addr, server)
}

/// A checkpoint exchange's TCP socket wakes the loop at each step
/// (connected, HELLO in, REPLY and state in): with polling set to an hour,
/// a reflector whose keepalive is a minute, and a channel that pauses
/// before everything it sends, the fetch on join still ends, with exactly
/// the state sent, in a handful of wake-ups.
#[tokio::test]
async fn a_checkpoint_exchange_wakes_the_loop_instead_of_a_poll() {
    let r = Reflector::start_keepalive(
        QUIET_KEEPALIVE_MS,
        Some(CheckpointConfig {
            // No CHECKPOINT_REQUEST (a UDP datagram) within the test.
            every_ms: 600_000,
            ..CheckpointConfig::default()
        }),
    );
    let t = token(1, r.port, r.addr(), 300);
    let state: Vec<u8> = (0..40_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (channel, server) = slow_channel(
        SessionKeys::from_session(t.session_key),
        state.clone(),
        Duration::from_millis(100),
    );
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        background_poll: Some(NO_POLL),
        // The JOIN_ACK announces the reflector's channel; the client is
        // sent to the slow one instead.
        checkpoint_addr: Some(channel),
        ..Config::new(TokenSource::Given(t))
    };
    let mut c = Client::new_tokio(cfg).expect("the client starts");
    let (mut events, mut checkpoints) = (Vec::new(), Vec::new());
    loop_until(
        &mut c,
        Duration::from_secs(20),
        &mut events,
        &mut checkpoints,
        |e, _| e.iter().any(|e| matches!(e, Event::Joined { .. })),
    )
    .await;
    // The fetch on join started with the JOIN_ACK, and cannot have ended:
    // the channel has not said HELLO yet.
    assert_eq!(
        c.fetch_checkpoint(),
        Err(reflector_client::CheckpointError::InFlight(CheckpointOp::Fetch))
    );
    // The reflector's first CHECKPOINT_REQUEST may come too: not this
    // exchange's, left unanswered.
    let ended = |ck: &[CheckpointEvent]| {
        ck.iter()
            .filter(|e| !matches!(e, CheckpointEvent::Requested { .. }))
            .cloned()
            .collect::<Vec<_>>()
    };
    let updates = loop_until(
        &mut c,
        Duration::from_secs(20),
        &mut events,
        &mut checkpoints,
        |_, ck| !ended(ck).is_empty(),
    )
    .await;
    match &ended(&checkpoints)[..] {
        [CheckpointEvent::Checkpoint {
            group,
            op: CheckpointOp::Fetch,
            number: 5,
            tick: 99,
            from_player: 2,
            age_ms: 1,
            bytes,
            verification: reflector_client::Verification::Clear,
        }] => {
            assert_eq!(*group, r.port);
            assert!(*bytes == state, "the state came changed ({} bytes)", bytes.len());
        }
        other => panic!("{:?}", other.iter().map(brief).collect::<Vec<_>>()),
    }
    // Connected, HELLO, REPLY with half the state, the rest, and spares
    // (a loop that spun would count thousands).
    assert!(updates <= 12, "{updates} updates for one exchange");
    assert_eq!(c.stats().echoes_sent, 0, "no keepalive timer woke it");
    assert!(!events.iter().any(|e| matches!(e, Event::Error(_))), "{events:?}");
    drop(c);
    assert!(
        server.join().expect("the channel's thread"),
        "the channel served it to the end"
    );
    r.stop();
}
