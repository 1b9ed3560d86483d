//! The fleet lab at a small scale, as root with Debian's redis-server: a
//! reflector killed with SIGKILL while players move often, and every player
//! it had playing again within the bound (detection + the client's
//! re-placement rule + 2 s), none left with a move window that never ends,
//! no owed datagram lost outside the move windows; then Redis down for 3 s
//! and started again empty, with no datagram lost, `/join` answered by the
//! control server while Redis was down (its own counters) and no `/join`
//! failed until the hold after the restart ended; nothing left behind.
//! (The client's unit test `a_move_whose_new_reflector_never_answers_is_placed_anew`
//! is the regression test of the players that never came back: at this
//! scale the race it needs is rare.)

// The demo's helpers: only `sibling` and `text` are needed here.
#[allow(dead_code)]
mod common;
use common::*;
use std::process::Command;

#[test]
fn a_killed_reflectors_players_all_play_again_and_join_is_answered_while_redis_is_down() {
    if !oskit::testing::root_or_skip(
        "a_killed_reflectors_players_all_play_again_and_join_is_answered_while_redis_is_down",
    ) {
        return;
    }
    if Command::new("redis-server").arg("--version").output().is_err() {
        // Only where CI does not promise it (make deps installs it).
        assert!(
            std::env::var_os("REQUIRE_ROOT_TESTS").is_none(),
            "redis-server is missing (make deps installs it)"
        );
        eprintln!(
            "skipping a_killed_reflectors_players_all_play_again_and_join_is_answered_while_redis_is_down: no redis-server"
        );
        return;
    }
    let out = std::env::temp_dir().join(format!("reflector-fleet-test-{}", std::process::id()));
    let o = Command::new(env!("CARGO_BIN_EXE_reflector-fleet-lab"))
        .args(["--reflectors", "2", "--controls", "1", "--clients", "3"])
        .args([
            "--groups",
            "4",
            "--grid",
            "6x6",
            "--duration",
            "22s",
            // Apart by more than the kill's bound (7 s), so the kill's
            // windows and losses are its own; Redis down 13 s to 16 s, the
            // control server's hold after it until the run ends.
            "--events",
            "kill=5,redis=13",
            "--redis-down",
            "3s",
        ])
        // Frequent moves: some grants name the reflector just killed.
        .args(["--move-every", "1s", "--bots", "60"])
        .arg("--out")
        .arg(&out)
        .arg("--reflector-bin")
        .arg(sibling("reflector"))
        .arg("--netlab-bin")
        .arg(sibling("netlab"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("the fleet lab runs");
    let all = text(&o);
    let csv = std::fs::read_to_string(out.join("fleet.csv")).unwrap_or_else(|e| panic!("no fleet.csv ({e}): {all}"));
    let _ = std::fs::remove_dir_all(&out);
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let col = |event: &str, name: &str| -> String {
        let i = head
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name}: {csv}"));
        let row = rows
            .iter()
            .find(|r| r.first() == Some(&event))
            .unwrap_or_else(|| panic!("no row for {event}: {csv}\n{all}"));
        row.get(i).copied().unwrap_or_default().to_string()
    };
    let kill = "kill -9 reflector";
    assert!(
        col(kill, "affected_players").parse::<u64>().is_ok_and(|n| n > 0),
        "{csv}\n{all}"
    );
    assert_eq!(col(kill, "pass"), "true", "{csv}\n{all}");
    assert_eq!(col(kill, "lost_outside_windows"), "0", "{csv}\n{all}");
    let bound: f64 = col(kill, "threshold_s").parse().unwrap();
    assert!(
        col(kill, "recovery_s").parse::<f64>().is_ok_and(|r| r <= bound),
        "{csv}"
    );
    // Redis down: /join answered by the control server meanwhile (its
    // /metrics, read by the lab), none failed, nothing lost.
    let redis = "restart redis";
    assert!(
        col(redis, "redis_down_s").parse::<f64>().is_ok_and(|d| d >= 3.0),
        "{csv}\n{all}"
    );
    assert!(
        col(redis, "joins_answered").parse::<u64>().is_ok_and(|n| n > 0),
        "no /join answered while Redis was down: {csv}\n{all}"
    );
    assert_eq!(col(redis, "join_failures"), "0", "{csv}\n{all}");
    assert_eq!(col(redis, "lost_in_windows"), "0", "{csv}\n{all}");
    assert_eq!(col(redis, "lost_outside_windows"), "0", "{csv}\n{all}");
    assert_eq!(col(redis, "pass"), "true", "{csv}\n{all}");
    assert!(all.contains("lab removed"), "{all}");
}
