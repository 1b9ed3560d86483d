//! The Linux `recvmmsg` driver under the same client: a receiver on
//! `MmsgDriver` gets every datagram of four senders exactly once, with the
//! datagrams queued between its updates (so its batches hold many), and
//! still receives after a rebind.
#![cfg(target_os = "linux")]

mod common;

use common::{client, token, Reflector};
use reflector_client::{Client, Config, Driver, MmsgDriver, TokenSource};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

fn pump<D: Driver>(c: &mut Client<D>, got: &mut BTreeSet<(u32, u32)>) {
    c.update(Instant::now());
    while c.poll_event().is_some() {}
    while let Some(d) = c.recv() {
        let n = u32::from_be_bytes(d.payload.try_into().unwrap());
        assert!(got.insert((d.sender, n)), "({}, {n}) twice", d.sender);
    }
}

#[test]
fn every_datagram_once_through_recvmmsg_and_after_a_rebind() {
    let r = Reflector::start(0, true);
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token(10, r.port, r.addr(), 300)))
    };
    let mut rx = Client::with_driver(cfg, MmsgDriver::bind("127.0.0.1:0").unwrap()).unwrap();
    let mut senders: Vec<Client> = (1..=4).map(|p| client(p, &r)).collect();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = BTreeSet::new();
    while !(rx.is_member() && senders.iter().all(|s| s.is_member())) {
        assert!(Instant::now() < deadline, "joins did not complete");
        for s in &mut senders {
            s.update(Instant::now());
        }
        pump(&mut rx, &mut got);
        std::thread::sleep(Duration::from_millis(1));
    }
    const N: u32 = 120;
    for round in 0..2u32 {
        let base = round * N;
        for i in base..base + N {
            for s in &mut senders {
                s.send(&i.to_be_bytes()).expect("a member sends");
                s.update(Instant::now());
            }
            // Under the reflector's per-member cap (500/s); the receiver
            // looks only every tenth round, so 40 datagrams wait for it.
            if i % 10 == 9 {
                std::thread::sleep(Duration::from_millis(25));
                pump(&mut rx, &mut got);
            }
        }
        let round_set: BTreeSet<(u32, u32)> = (1..=4).flat_map(|p| (base..base + N).map(move |i| (p, i))).collect();
        let deadline = Instant::now() + Duration::from_secs(3);
        while !round_set.is_subset(&got) && Instant::now() < deadline {
            for s in &mut senders {
                s.update(Instant::now());
            }
            pump(&mut rx, &mut got);
            std::thread::sleep(Duration::from_millis(1));
        }
        let missing = round_set.difference(&got).count();
        assert_eq!(missing, 0, "round {round}: every datagram of every sender");
        assert_eq!(rx.stats().streams.duplicates, 0);
        if round == 0 {
            assert_eq!(rx.stats().data_received, u64::from(4 * N));
            // A new local port: the client's next ECHO comes from it and the
            // reflector's PROBE moves the membership; until then datagrams
            // go to the old port, so wait for one sent after the rebind.
            let before = rx.local_addr().unwrap();
            let after = rx.rebind().unwrap();
            assert_ne!(before, after);
            let deadline = Instant::now() + Duration::from_secs(3);
            let marker = |k: u32| (1, 1_000_000 + k);
            let mut k = 0;
            while !got.contains(&marker(k.max(1) - 1)) || k == 0 {
                assert!(Instant::now() < deadline, "nothing received after the rebind");
                senders[0].send(&marker(k).1.to_be_bytes()).unwrap();
                k += 1;
                for s in &mut senders {
                    s.update(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(20));
                pump(&mut rx, &mut got);
            }
        }
    }
    r.stop();
}
