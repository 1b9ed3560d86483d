//! The C example (examples/c/grid.c): built with `cc` against the
//! committed header and the built library, run with three players (three
//! handles in one process) against a real reflector; each must hear the
//! two others.

mod common;

use common::{assert_all_heard, build_grid, heard, mint, run, tool, Reflector};
use std::process::Command;
use std::time::Duration;

#[test]
fn c_grid_players_hear_each_other() {
    let Some(cc) = tool("cc") else { return };
    let grid = build_grid(&cc);
    let r = Reflector::start();
    let players = [11u32, 12, 13];
    let mut cmd = Command::new(&grid);
    cmd.arg(r.addr().to_string()).arg("3");
    for p in players {
        cmd.arg(mint(p, &r).spec());
    }
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "grid failed:\n{out}\n{err}");
    assert!(out.contains("hears player"), "it prints what it hears:\n{out}");
    assert_all_heard(&heard(&out), &players, &out);
    r.stop();
}
