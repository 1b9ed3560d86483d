//! `/join` answered from the last placements while the fleet's Redis is
//! down, and counted where an observer outside sees it: a control server
//! of a fleet (its registry poller, as `control --registry` runs it) over
//! Debian's redis-server, one reflector heartbeating its entry; `/join`
//! asked before any placement (503, counted as unplaced), with a bad
//! parameter (400), then while Redis is killed and after it comes back
//! empty (200 every time, through the restart's hold), each answer counted
//! in `reflector_control_joins_answered` and no failure.

use reflector_control::fleet::{Fleet, Poller};
use reflector_control::{ControlConfig, ControlServer, SecretCell, World};
use reflector_proto::auth::Secret;
use reflector_registry::testing::RedisServer;
use reflector_registry::{Registrar, RegistryConfig};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// GET, as (status, body); no error for a non-2xx status.
fn get(url: &str, accept: Option<&str>) -> (u16, String) {
    let mut r = ureq::get(url).timeout(Duration::from_secs(5));
    if let Some(a) = accept {
        r = r.set("Accept", a);
    }
    match r.call() {
        Ok(resp) => (resp.status(), resp.into_string().unwrap()),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// The sample `name` (labels included) of a scrape.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

/// (answered, unplaced, bad requests, registry up) in both formats, which must agree.
fn counts(base: &str) -> (u64, u64, u64, u64) {
    let read = |accept| {
        let (status, t) = get(&format!("{base}/metrics"), accept);
        assert_eq!(status, 200, "{t}");
        (
            sample(&t, "reflector_control_joins_answered_total"),
            sample(&t, "reflector_control_join_failures_total{cause=\"unplaced\"}"),
            sample(&t, "reflector_control_join_failures_total{cause=\"bad_request\"}"),
            sample(&t, "reflector_control_fleet_registry_up"),
        )
    };
    let text = read(None);
    assert_eq!(
        text,
        read(Some("application/openmetrics-text; version=1.0.0")),
        "both formats"
    );
    text
}

/// Sets the stop flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
    }
}

fn wait_until(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn join_is_answered_and_counted_while_redis_is_down_and_after_it_restarts() {
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        // Only where CI does not promise it (make deps installs it).
        assert!(
            std::env::var_os("REQUIRE_ROOT_TESTS").is_none(),
            "redis-server is missing (make deps installs it)"
        );
        eprintln!("skipping join_is_answered_and_counted_while_redis_is_down_and_after_it_restarts: no redis-server");
        return;
    }
    let mut redis = RedisServer::start();
    let ttl = Duration::from_secs(1);
    let cfg = RegistryConfig {
        ttl,
        ..RegistryConfig::new(&redis.url())
    };
    let secret = SecretCell::from(Secret::new(&[7; 32]).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let reflector: IpAddr = "127.0.0.1".parse().unwrap();
    // One reflector's heartbeats, as `serve --registry` sends them: they
    // fail while Redis is down and write the entry again once it is back.
    let mut registrar = Registrar::register(&cfg, &secret.ring(), None, reflector, &[4000, 4001], 100).unwrap();
    let beating = Arc::clone(&stop);
    let heartbeats = std::thread::spawn(move || {
        while !beating.load(Relaxed) {
            let _ = registrar.heartbeat(0, 0, false);
            std::thread::sleep(ttl / 3);
        }
    });
    let fleet = Fleet::default();
    let world = World::for_fleet(4, 4, 10.0, fleet.clone()).unwrap();
    let cells = world.all_cells();
    let server = ControlServer::start(
        ControlConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            world,
            secret: secret.clone(),
            token_ttl_s: 60,
            auth: None,
        },
        Arc::clone(&stop),
    )
    .unwrap();
    let base = server.url();
    let join = |player: u32| get(&format!("{base}/join?player={player}&x=15&y=25"), None);
    assert_eq!(counts(&base), (0, 0, 0, 0), "every series there, at zero");

    // Nothing placed yet (no poll): 503, counted under its cause.
    assert_eq!(join(1).0, 503);
    assert_eq!(get(&format!("{base}/join?player=1&x=15"), None).0, 400);
    assert_eq!(counts(&base), (0, 1, 1, 0));

    let poller = Poller::start(&cfg, secret.clone(), fleet.clone(), cells.clone(), Arc::clone(&stop)).unwrap();
    // Dropped before the poller, also when an assertion fails: the poller
    // (and the heartbeats) stop, so a failure ends the test, not hangs it.
    let _stop_first = StopOnDrop(Arc::clone(&stop));
    wait_until("every cell placed", 10, || fleet.view().cells.len() == cells.len());
    let (status, body) = join(2);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("127.0.0.1:400"), "{body}");
    assert_eq!(counts(&base), (1, 1, 1, 1));

    // Redis down for two TTLs (the reflector's entry would have expired):
    // /join answers from the placements read last.
    redis.kill();
    wait_until("a failed poll", 10, || !fleet.registry_up());
    let mut answered = 1;
    let down = Instant::now();
    for player in 10..40 {
        if down.elapsed() > 2 * ttl {
            break;
        }
        let (status, body) = join(player);
        assert_eq!(status, 200, "while Redis is down: {body}");
        answered += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fleet.polls_failed() > 0);
    assert_eq!(counts(&base), (answered, 1, 1, 0), "counted while Redis is down");

    // Back, empty: the control server holds and writes back its
    // placements (two TTLs, 2 s here) while the
    // reflector registers again; /join answers all along.
    let _back = RedisServer::start_on(redis.port);
    wait_until("a poll that reaches Redis again", 10, || fleet.registry_up());
    let back = Instant::now();
    for player in 40..200 {
        if back.elapsed() > Duration::from_secs(3) {
            break;
        }
        let (status, body) = join(player);
        assert_eq!(status, 200, "after Redis came back: {body}");
        answered += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(counts(&base), (answered, 1, 1, 1), "no failure across the restart");

    stop.store(true, Relaxed);
    server.stop();
    drop(poller);
    heartbeats.join().unwrap();
}
