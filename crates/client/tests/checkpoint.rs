//! Checkpoints through the client against a real reflector on 127.0.0.1
//! with its channel on: an upload when asked, a joiner's fetch of exactly
//! those bytes, a large state in many pieces, a channel that never answers
//! (the deadline, with DATA flowing meanwhile), and replies that must not be
//! trusted. Every wait has a deadline and every loop a count.

mod common;

use common::{client, join_all, token, Reflector};
use reflector_client::{CheckpointError, CheckpointEvent, CheckpointOp, Client, Config, TokenSource, Verification};
use reflector_proto::checkpoint::{Answer, Hello, Refusal, Reply, Stored, REQUEST_LEN};
use reflector_server::checkpoint::CheckpointConfig;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// A reflector that asks each group for a checkpoint every 200 ms.
fn reflector() -> Reflector {
    Reflector::start_checkpoints(CheckpointConfig {
        every_ms: 200,
        ..CheckpointConfig::default()
    })
}

/// Updates `clients` every millisecond (draining their events and DATA)
/// until `done` holds on the checkpoint events so far; panics after `within`.
fn pump(
    clients: &mut [&mut Client],
    within: Duration,
    got: &mut Vec<(usize, CheckpointEvent)>,
    mut done: impl FnMut(&[(usize, CheckpointEvent)]) -> bool,
) {
    let deadline = Instant::now() + within;
    for _ in 0..100_000 {
        for (i, c) in clients.iter_mut().enumerate() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
            while c.recv().is_some() {}
            while let Some(e) = c.poll_checkpoint() {
                got.push((i, e));
            }
        }
        if done(got) {
            return;
        }
        assert!(Instant::now() < deadline, "not done within {within:?}; events: {got:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("not done within the loop's count; events: {got:?}");
}

/// A client with the checkpoint settings of `tweak`.
fn client_with(player: u32, r: &Reflector, tweak: impl FnOnce(&mut Config)) -> Client {
    let mut cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token(player, r.port, r.addr(), 300)))
    };
    tweak(&mut cfg);
    Client::new(cfg).expect("the client starts")
}

/// `n` bytes of a fixed pseudo-random pattern (xorshift), so a misplaced
/// piece cannot look right.
fn pattern(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Waits for `a`'s request, provides `state` at `tick`, and waits for the
/// STORED; returns the checkpoint's number.
fn upload(r: &Reflector, a: &mut Client, tick: u64, state: &[u8]) -> u64 {
    let group = r.port;
    let mut got = Vec::new();
    pump(&mut [a], Duration::from_secs(5), &mut got, |g| {
        g.iter().any(|(_, e)| matches!(e, CheckpointEvent::Requested { .. }))
    });
    assert!(got.contains(&(0, CheckpointEvent::Requested { group })), "{got:?}");
    a.provide_checkpoint(tick, state.to_vec()).expect("the upload starts");
    // One upload at a time.
    assert_eq!(
        a.provide_checkpoint(tick, state.to_vec()),
        Err(CheckpointError::InFlight(CheckpointOp::Upload))
    );
    got.clear();
    pump(&mut [a], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(_, e)| matches!(e, CheckpointEvent::Uploaded { .. } | CheckpointEvent::Failed { .. }))
    });
    let number = got
        .iter()
        .find_map(|(_, e)| match e {
            CheckpointEvent::Uploaded {
                group: g,
                number,
                tick: t,
            } if *g == group && *t == tick => Some(*number),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no STORED: {got:?}"));
    assert_eq!(a.stats().checkpoints_uploaded, 1);
    number
}

/// Joins `b` and waits for its own fetch's outcome.
fn join_and_fetch(a: &mut Client, b: &mut Client) -> CheckpointEvent {
    join_all(&mut [&mut *b]);
    let mut got = Vec::new();
    pump(&mut [a, b], Duration::from_secs(5), &mut got, |g| {
        g.iter().any(|(i, e)| {
            *i == 1
                && matches!(
                    e,
                    CheckpointEvent::Checkpoint { .. } | CheckpointEvent::Empty { .. } | CheckpointEvent::Failed { .. }
                )
        })
    });
    got.into_iter()
        .find(|(i, e)| *i == 1 && !matches!(e, CheckpointEvent::Requested { .. }))
        .map(|(_, e)| e)
        .expect("b's fetch ended")
}

#[test]
fn a_member_uploads_when_asked_and_a_joiner_fetches_exactly_those_bytes() {
    let r = reflector();
    let group = r.port;
    let mut a = client(1, &r);
    join_all(&mut [&mut a]);
    assert!(a.checkpoint_addr().is_some(), "the JOIN_ACK announced the channel");
    // Before anything is stored, a's own fetch on join finds the group empty.
    let mut got = Vec::new();
    pump(&mut [&mut a], Duration::from_secs(5), &mut got, |g| {
        g.iter().any(|(_, e)| !matches!(e, CheckpointEvent::Requested { .. }))
    });
    assert!(
        got.contains(&(
            0,
            CheckpointEvent::Empty {
                group,
                op: CheckpointOp::Fetch
            }
        )),
        "{got:?}"
    );
    assert_eq!(r.counters().checkpoints_stored, 0);

    let state = b"the game state at tick 42: three players, one flag".to_vec();
    let number = upload(&r, &mut a, 42, &state);
    let c = r.counters();
    assert_eq!(c.checkpoints_stored, 1);
    assert_eq!(c.checkpoint_bytes_stored, state.len() as u64);
    // Nothing pending any more: the nonce was used.
    assert_eq!(a.provide_checkpoint(43, vec![1]), Err(CheckpointError::NotRequested));

    let mut b = client(2, &r);
    match join_and_fetch(&mut a, &mut b) {
        CheckpointEvent::Checkpoint {
            group: g,
            number: n,
            tick,
            from_player,
            bytes,
            verification,
            ..
        } => {
            assert_eq!((g, n, tick, from_player), (group, number, 42, 1));
            assert_eq!(bytes, state);
            // A clear group: nothing more than the channel's checks.
            assert_eq!(verification, Verification::Clear);
        }
        other => panic!("b fetched {other:?}"),
    }
    assert_eq!(r.counters().checkpoints_served, 1);
    assert_eq!(b.stats().checkpoints_fetched, 1);
    assert_eq!(b.stats().checkpoint_failures, 0);
    // A fetch asked for at once is one sooner than the reflector allows:
    // refused, and the refusal is authenticated and told apart.
    b.fetch_checkpoint().expect("the fetch starts");
    let mut got = Vec::new();
    pump(&mut [&mut b], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .any(|(_, e)| matches!(e, CheckpointEvent::Failed { .. } | CheckpointEvent::Checkpoint { .. }))
    });
    let reason = got
        .iter()
        .find_map(|(_, e)| match e {
            CheckpointEvent::Failed { op, reason, .. } => Some((*op, reason.clone())),
            _ => None,
        })
        .expect("the second fetch was refused");
    assert_eq!(reason.0, CheckpointOp::Fetch);
    assert!(
        matches!(
            reason.1,
            CheckpointError::Refused {
                code: Refusal::Busy,
                ..
            }
        ),
        "{reason:?}"
    );
    r.stop();
}

#[test]
fn a_state_of_256_kib_goes_up_and_comes_down_intact() {
    let r = reflector();
    let mut a = client_with(1, &r, |c| c.checkpoint_fetch_on_join = false);
    join_all(&mut [&mut a]);
    // Four times the client's largest read or write: many pieces each way.
    let state = pattern(256 << 10);
    let number = upload(&r, &mut a, 7, &state);
    assert_eq!(r.counters().checkpoint_bytes_stored, state.len() as u64);
    let mut b = client(2, &r);
    match join_and_fetch(&mut a, &mut b) {
        CheckpointEvent::Checkpoint {
            number: n, tick, bytes, ..
        } => {
            assert_eq!((n, tick, bytes.len()), (number, 7, state.len()));
            assert!(bytes == state, "the state came back changed");
        }
        other => panic!("b fetched {other:?}"),
    }
    r.stop();
}

#[test]
fn a_channel_that_never_answers_fails_at_the_deadline_while_data_flows() {
    let r = reflector();
    // A channel that accepts and then says nothing.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    silent.set_nonblocking(true).unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let timeout = Duration::from_millis(1500);
    let mut a = client_with(1, &r, |c| c.checkpoint_fetch_on_join = false);
    let mut b = client_with(2, &r, |c| {
        c.checkpoint_addr = Some(silent_addr);
        c.checkpoint_timeout = timeout;
    });
    join_all(&mut [&mut a]);
    let t0 = Instant::now();
    join_all(&mut [&mut b]);
    // The fetch started with the JOIN_ACK.
    assert_eq!(
        b.fetch_checkpoint(),
        Err(CheckpointError::InFlight(CheckpointOp::Fetch))
    );
    let mut held = Vec::new();
    let (mut sent, mut a_got, mut b_got, mut failed) = (0u32, 0u32, 0u32, None);
    for i in 0..2000u32 {
        if i % 5 == 0 {
            a.send(&i.to_be_bytes()).expect("a sends");
            b.send(&i.to_be_bytes()).expect("b sends");
            sent += 1;
        }
        if let Ok((s, _)) = silent.accept() {
            held.push(s);
        }
        for (c, n) in [(&mut a, &mut a_got), (&mut b, &mut b_got)] {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
            while c.recv().is_some() {
                *n += 1;
            }
        }
        while let Some(e) = b.poll_checkpoint() {
            if let CheckpointEvent::Failed { op, reason, .. } = e {
                failed = Some((op, reason, t0.elapsed()));
            }
        }
        if failed.is_some() || t0.elapsed() > timeout * 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (op, reason, after) = failed.expect("the fetch failed");
    assert_eq!(op, CheckpointOp::Fetch);
    assert_eq!(reason, CheckpointError::TimedOut { addr: silent_addr });
    assert!(after >= timeout && after < timeout * 2, "failed after {after:?}");
    assert_eq!(held.len(), 1, "the silent channel was connected to once");
    // DATA both ways all along (the last few may still be in flight).
    assert!(sent >= 20, "only {sent} sent each way");
    assert!(
        a_got + 5 >= sent && b_got + 5 >= sent,
        "{sent} sent each way; a got {a_got}, b got {b_got}"
    );
    assert!(a.is_member() && b.is_member());
    r.stop();
}

/// A fake channel on 127.0.0.1 that sends a HELLO, reads the REQUEST and
/// answers `reply` (and `tail` after it); returns its address.
fn fake_channel(reply: [u8; 88], tail: Vec<u8>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let hello = Hello {
            challenge: 77,
            max_state: 1 << 20,
            hello_deadline_ms: 2000,
        };
        let mut req = [0u8; REQUEST_LEN];
        if s.write_all(&hello.encode()).is_ok() && s.read_exact(&mut req).is_ok() {
            let _ = s.write_all(&reply);
            let _ = s.write_all(&tail);
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    addr
}

#[test]
fn replies_that_do_not_verify_are_never_taken_as_a_checkpoint() {
    let r = reflector();
    let state = b"forged".to_vec();
    let stored = Stored {
        number: 1,
        tick: 9,
        from_player: 3,
        digest: reflector_proto::checkpoint::digest(&state),
    };
    let forged = Answer::Checkpoint {
        stored,
        body_len: state.len() as u64,
        age_ms: 0,
    };
    // A CHECKPOINT with an all-zero MAC, one MAC'd under another key, and
    // an unauthenticated REFUSED.
    let zero = Reply {
        answer: forged,
        mac: [0; 16],
    };
    let other_key = reflector_proto::protocol::SessionKeys::from_session([9; 32]);
    let wrong = Reply::signed(forged, &other_key, 77, &[0; 16]);
    let refused = Reply::unauthenticated(Refusal::NotMember);
    for (reply, expect) in [
        (zero, "unauthenticated"),
        (wrong, "bad mac"),
        (refused, "unauthenticated refusal"),
    ] {
        let addr = fake_channel(reply.encode(), state.clone());
        let mut c = client_with(5, &r, |c| c.checkpoint_addr = Some(addr));
        join_all(&mut [&mut c]);
        let mut got = Vec::new();
        pump(&mut [&mut c], Duration::from_secs(5), &mut got, |g| {
            g.iter().any(|(_, e)| !matches!(e, CheckpointEvent::Requested { .. }))
        });
        let ended: Vec<_> = got
            .into_iter()
            .map(|(_, e)| e)
            .filter(|e| !matches!(e, CheckpointEvent::Requested { .. }))
            .collect();
        match (&ended[..], expect) {
            (
                [CheckpointEvent::Failed {
                    reason: CheckpointError::Unauthenticated { refusal: None, .. },
                    ..
                }],
                "unauthenticated",
            )
            | (
                [CheckpointEvent::Failed {
                    reason: CheckpointError::BadMac { .. },
                    ..
                }],
                "bad mac",
            ) => {}
            (
                [CheckpointEvent::Failed {
                    reason: reason @ CheckpointError::Unauthenticated { .. },
                    ..
                }],
                "unauthenticated refusal",
            ) => assert_eq!(reason.refusal(), Some(Refusal::NotMember)),
            _ => panic!("{expect}: {ended:?}"),
        }
        assert_eq!(c.stats().checkpoints_fetched, 0);
    }
    r.stop();
}

#[test]
fn a_checkpoint_trickled_in_small_pieces_is_assembled_and_checked() {
    let r = reflector();
    let player = 6;
    // One token for the channel and the client: two calls a second
    // boundary apart would give two expiries, so two session keys.
    let held = token(player, r.port, r.addr(), 300);
    let keys = reflector_proto::protocol::SessionKeys::from_session(held.session_key);
    let state = pattern(100_000);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let body = state.clone();
    // A channel that answers correctly under the member's key, but writes
    // everything in pieces of at most 997 bytes with pauses between: the
    // client sees HELLO, REPLY and state each split over many reads.
    let server = std::thread::spawn(move || -> usize {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        let challenge = 0x5151;
        let hello = Hello {
            challenge,
            max_state: 1 << 20,
            hello_deadline_ms: 2000,
        };
        let mut req = [0u8; REQUEST_LEN];
        let mut all = Vec::new();
        all.extend_from_slice(&hello.encode());
        let mut pieces = 0;
        let send = |s: &mut std::net::TcpStream, b: &[u8], pieces: &mut usize| {
            for (i, p) in b.chunks(997).enumerate() {
                s.write_all(p).unwrap();
                *pieces += 1;
                if i % 10 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        send(&mut s, &all[..1], &mut pieces);
        std::thread::sleep(Duration::from_millis(20));
        send(&mut s, &all[1..], &mut pieces);
        s.read_exact(&mut req).unwrap();
        let mut req_mac = [0u8; 16];
        req_mac.copy_from_slice(&req[48..]);
        let stored = Stored {
            number: 3,
            tick: 11,
            from_player: 2,
            digest: reflector_proto::checkpoint::digest(&body),
        };
        let reply = Reply::signed(
            Answer::Checkpoint {
                stored,
                body_len: body.len() as u64,
                age_ms: 5,
            },
            &keys,
            challenge,
            &req_mac,
        );
        let enc = reply.encode();
        send(&mut s, &enc[..40], &mut pieces);
        std::thread::sleep(Duration::from_millis(20));
        send(&mut s, &enc[40..], &mut pieces);
        send(&mut s, &body, &mut pieces);
        pieces
    });
    let mut c = client_with(player, &r, |c| {
        c.checkpoint_addr = Some(addr);
        c.token = TokenSource::Given(held);
    });
    join_all(&mut [&mut c]);
    let mut got = Vec::new();
    pump(&mut [&mut c], Duration::from_secs(10), &mut got, |g| {
        g.iter().any(|(_, e)| !matches!(e, CheckpointEvent::Requested { .. }))
    });
    let pieces = server.join().unwrap();
    assert!(pieces > 100, "{pieces} pieces");
    let ended: Vec<_> = got
        .into_iter()
        .map(|(_, e)| e)
        .filter(|e| !matches!(e, CheckpointEvent::Requested { .. }))
        .collect();
    assert_eq!(
        ended,
        [CheckpointEvent::Checkpoint {
            group: r.port,
            op: CheckpointOp::Fetch,
            number: 3,
            tick: 11,
            from_player: 2,
            age_ms: 5,
            bytes: state,
            verification: Verification::Clear,
        }]
    );
    r.stop();
}

#[test]
fn a_refused_connect_is_a_failure_event_not_a_hang() {
    let r = reflector();
    // A port nobody listens on any more.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let mut c = client_with(8, &r, |c| c.checkpoint_addr = Some(closed));
    join_all(&mut [&mut c]);
    let mut got = Vec::new();
    pump(&mut [&mut c], Duration::from_secs(5), &mut got, |g| {
        g.iter().any(|(_, e)| !matches!(e, CheckpointEvent::Requested { .. }))
    });
    let failed = got
        .iter()
        .find_map(|(_, e)| match e {
            CheckpointEvent::Failed { op, reason, .. } => Some((*op, reason.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no failure: {got:?}"));
    assert!(
        matches!(failed, (CheckpointOp::Fetch, CheckpointError::Io { call: "connect", addr, .. }) if addr == closed),
        "{failed:?}"
    );
    assert_eq!(c.stats().checkpoint_failures, 1);
    assert!(c.is_member());
    r.stop();
}

/// Pumps `clients` until client `who` reports the end of a fetch of `op`;
/// returns that event.
fn fetch_outcome(clients: &mut [&mut Client], who: usize, op: CheckpointOp) -> CheckpointEvent {
    let ends = move |(i, e): &(usize, CheckpointEvent)| {
        *i == who
            && matches!(e,
                CheckpointEvent::Checkpoint { op: o, .. }
                | CheckpointEvent::Empty { op: o, .. }
                | CheckpointEvent::Failed { op: o, .. } if *o == op)
    };
    let mut got = Vec::new();
    pump(clients, Duration::from_secs(5), &mut got, |g| g.iter().any(ends));
    got.into_iter().find(ends).map(|(_, e)| e).expect("the fetch ended")
}

#[test]
fn fetch_other_gets_the_other_members_checkpoint_and_empty_while_one_is_stored() {
    let r = reflector();
    let group = r.port;
    let no_fetch_on_join = |c: &mut Config| c.checkpoint_fetch_on_join = false;
    let mut a = client_with(1, &r, no_fetch_on_join);
    let mut b = client_with(2, &r, no_fetch_on_join);
    let mut c = client_with(3, &r, no_fetch_on_join);
    let mut d = client_with(4, &r, no_fetch_on_join);
    join_all(&mut [&mut a]);
    let state_a = b"player 1's snapshot at tick 10".to_vec();
    upload(&r, &mut a, 10, &state_a);

    // One stored: FETCH_OTHER has nothing to give, and says so (EMPTY,
    // not a failure).
    join_all(&mut [&mut d]);
    d.fetch_checkpoint_other().expect("the fetch starts");
    assert_eq!(
        d.fetch_checkpoint_other(),
        Err(CheckpointError::InFlight(CheckpointOp::FetchOther))
    );
    assert_eq!(
        fetch_outcome(&mut [&mut a, &mut d], 1, CheckpointOp::FetchOther),
        CheckpointEvent::Empty {
            group,
            op: CheckpointOp::FetchOther
        }
    );
    assert_eq!((d.stats().checkpoints_fetched, d.stats().checkpoint_failures), (1, 0));

    // A second member's upload: a and d leave the reflector's requests
    // unanswered from now on, so it turns to b.
    join_all(&mut [&mut b]);
    let state_b = b"player 2's snapshot at tick 12, not the same".to_vec();
    let number_b = upload_when_asked(&mut b, &mut [&mut a, &mut d], 12, &state_b);

    // A third member fetches both at once: the latest is b's, the other
    // a's, each exactly the bytes its uploader gave.
    join_all(&mut [&mut c]);
    c.fetch_checkpoint().expect("the FETCH starts");
    c.fetch_checkpoint_other().expect("the FETCH_OTHER starts beside it");
    let mut got = Vec::new();
    pump(&mut [&mut c, &mut a, &mut b], Duration::from_secs(5), &mut got, |g| {
        g.iter()
            .filter(|(i, e)| *i == 0 && !matches!(e, CheckpointEvent::Requested { .. }))
            .count()
            == 2
    });
    let mut ended: Vec<CheckpointEvent> = got
        .into_iter()
        .filter(|(i, e)| *i == 0 && !matches!(e, CheckpointEvent::Requested { .. }))
        .map(|(_, e)| e)
        .collect();
    ended.sort_by_key(|e| match e {
        CheckpointEvent::Checkpoint { op, .. } => *op == CheckpointOp::FetchOther,
        _ => true,
    });
    match &ended[..] {
        [CheckpointEvent::Checkpoint {
            group: g1,
            op: CheckpointOp::Fetch,
            number: n1,
            tick: 12,
            from_player: 2,
            bytes: latest,
            ..
        }, CheckpointEvent::Checkpoint {
            group: g2,
            op: CheckpointOp::FetchOther,
            number: n2,
            tick: 10,
            from_player: 1,
            bytes: other,
            ..
        }] => {
            assert_eq!((*g1, *g2), (group, group));
            assert_eq!(*n1, number_b);
            assert!(n2 < n1, "the other one is older: {n2} vs {n1}");
            assert_eq!((latest, other), (&state_b, &state_a));
        }
        _ => panic!("c fetched {ended:?}"),
    }
    assert_eq!((c.stats().checkpoints_fetched, c.stats().checkpoint_failures), (2, 0));
    // The reflector counts a state served once its last byte is handed to
    // the kernel, which may be after c has read it all.
    let deadline = Instant::now() + Duration::from_secs(3);
    while r.counters().checkpoints_served < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(r.counters().checkpoints_served, 2, "two states served, both to c");
    r.stop();
}

/// Updates `uploader` and `others` until the reflector asks `uploader`,
/// provides `state` at `tick` then, and waits for its STORED (the others'
/// requests go unanswered); returns the checkpoint's number.
fn upload_when_asked(uploader: &mut Client, others: &mut [&mut Client], tick: u64, state: &[u8]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    for _ in 0..100_000 {
        for c in others.iter_mut() {
            c.update(Instant::now());
            while c.poll_event().is_some() {}
            while c.recv().is_some() {}
            while c.poll_checkpoint().is_some() {}
        }
        uploader.update(Instant::now());
        while uploader.poll_event().is_some() {}
        while uploader.recv().is_some() {}
        while let Some(e) = uploader.poll_checkpoint() {
            match e {
                // A request that comes while the upload runs waits: this
                // one upload answers.
                CheckpointEvent::Requested { .. } => match uploader.provide_checkpoint(tick, state.to_vec()) {
                    Ok(()) | Err(CheckpointError::InFlight(CheckpointOp::Upload)) => {}
                    Err(e) => panic!("the upload does not start: {e}"),
                },
                CheckpointEvent::Uploaded { number, tick: t, .. } if t == tick => return number,
                other => seen.push(other),
            }
        }
        assert!(Instant::now() < deadline, "no upload stored within 10 s: {seen:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("no upload stored within the loop's count: {seen:?}");
}
