//! C, Python, C# and Rust players in ONE group on a real reflector (the C
//! program runs two players, two handles: five players in all), each hears
//! every other, asserted per (listener, sender) pair; and no owed datagram
//! is lost. Owed: sent to the group while the receiver was a member (from
//! its JOIN_ACK to its LEAVE). Each player sends OWED numbered datagrams
//! only once it has heard every other player (so all are members), then
//! "done", and leaves only once every other player's "done" came (so no
//! one has left while any numbered datagram was being sent): every
//! numbered datagram is owed to every other player, and each must arrive
//! exactly once. Loopback only; bounded in count and time.

mod common;

use common::{
    assert_all_heard, build_grid, build_player_exe, crate_dir, got, heard, lib_dir, mint, run, rust_owed_player, tool,
    Reflector,
};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// Numbered datagrams each player sends.
const OWED: u64 = 40;

#[test]
fn mixed_language_players_lose_no_owed_datagram() {
    let tools = (tool("cc"), tool("python3"), tool("mcs"), tool("mono"));
    let (Some(cc), Some(python), Some(mcs), Some(mono)) = tools else {
        return;
    };
    let grid = build_grid(&cc, false);
    let exe = build_player_exe(&mcs);
    let r = Reflector::start();
    let addr = r.addr().to_string();
    let players = [41u32, 42, 43, 44, 45];
    // The most any program runs: it normally ends well before, once every
    // player's "done" came.
    let cap = "25";
    let owed = format!("{OWED}:{}", players.len());
    let (c1, c2, py, cs, rs) = (mint(41, &r), mint(42, &r), mint(43, &r), mint(44, &r), mint(45, &r));

    let mut c_cmd = Command::new(&grid);
    c_cmd.args(["--owed", &owed, &addr, cap, &c1.spec(), &c2.spec()]);
    let mut py_cmd = Command::new(python);
    py_cmd
        .current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["player.py", "--owed", &owed, &addr, cap, &py.spec()]);
    let mut cs_cmd = Command::new(mono);
    cs_cmd
        .env("LD_LIBRARY_PATH", lib_dir())
        .arg(&exe)
        .args(["--owed", &owed, &addr, cap, &cs.spec()]);

    let within = Duration::from_secs(60);
    let outputs = std::thread::scope(|s| {
        let rust = s.spawn(|| rust_owed_player(&r, &rs, OWED, players.len(), Duration::from_secs(25)));
        let runs: Vec<_> = [("C", c_cmd), ("Python", py_cmd), ("C#", cs_cmd)]
            .into_iter()
            .map(|(name, cmd)| (name, s.spawn(move || run(cmd, within))))
            .collect();
        let mut outputs = String::new();
        for (name, t) in runs {
            let (out, err, ok) = t.join().expect("a player runner");
            assert!(ok, "the {name} player failed:\n{out}\n{err}");
            outputs.push_str(&format!("--- {name}\n{out}"));
        }
        outputs.push_str(&format!("--- Rust\n{}", rust.join().expect("the Rust player")));
        outputs
    });
    r.stop();

    assert_all_heard(&heard(&outputs), &players, &outputs);
    for p in players {
        assert!(
            outputs.lines().any(|l| l == format!("complete {p}")),
            "player {p} did not see every other player's \"done\" within the cap; output:\n{outputs}"
        );
    }
    let mut count: BTreeMap<(u32, u32, u64), usize> = BTreeMap::new();
    for g in got(&outputs) {
        *count.entry(g).or_default() += 1;
    }
    let (mut lost, mut dup) = (Vec::new(), Vec::new());
    for &rcv in &players {
        for &snd in &players {
            if rcv == snd {
                continue;
            }
            for k in 0..OWED {
                match count.get(&(rcv, snd, k)).copied().unwrap_or(0) {
                    0 => lost.push((rcv, snd, k)),
                    1 => {}
                    n => dup.push(((rcv, snd, k), n)),
                }
            }
        }
    }
    let owed_total = players.len() * (players.len() - 1) * OWED as usize;
    assert!(
        lost.is_empty(),
        "{} of {owed_total} owed datagrams lost, (receiver, sender, seq): {lost:?}",
        lost.len()
    );
    assert!(dup.is_empty(), "datagrams delivered more than once: {dup:?}");
    let strays: Vec<_> = count
        .keys()
        .filter(|(rcv, snd, k)| rcv == snd || *k >= OWED || !players.contains(snd) || !players.contains(rcv))
        .collect();
    assert!(strays.is_empty(), "numbered datagrams nobody sent: {strays:?}");
}
