//! The C example (examples/c/grid.c): built with `cc` against the
//! committed header and the built library, run against a real reflector
//! with several players (several handles in one process); each must hear
//! every other.

mod common;

use common::{assert_all_heard, build_grid, heard, mint, run, tool, Reflector};
use std::process::Command;
use std::time::Duration;

fn grid_players_hear_each_other(static_lib: bool, players: &[u32]) {
    let Some(cc) = tool("cc") else { return };
    let grid = build_grid(&cc, static_lib);
    let r = Reflector::start();
    let mut cmd = Command::new(&grid);
    cmd.arg(r.addr().to_string()).arg("3");
    for &p in players {
        cmd.arg(mint(p, &r).spec());
    }
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "grid failed:\n{out}\n{err}");
    assert!(out.contains("hears player"), "it prints what it hears:\n{out}");
    assert_all_heard(&heard(&out), players, &out);
    r.stop();
}

#[test]
fn c_grid_players_hear_each_other() {
    grid_players_hear_each_other(false, &[11, 12, 13]);
}

#[test]
fn c_grid_linked_statically() {
    grid_players_hear_each_other(true, &[14, 15]);
}

/// The README's "first group in five minutes" C code compiles against the
/// header as it is.
#[test]
fn readme_c_example_compiles() {
    let Some(cc) = tool("cc") else { return };
    let readme = std::fs::read_to_string(common::crate_dir().join("README.md")).expect("the README");
    let code: String = readme
        .split("```c\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("a ```c block in the README")
        .into();
    let dir = common::scratch("readme");
    std::fs::write(dir.join("first.c"), code).unwrap();
    let mut cmd = Command::new(cc);
    cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-c", "-I"])
        .arg(common::crate_dir().join("include"))
        .arg(dir.join("first.c"))
        .arg("-o")
        .arg(dir.join("first.o"));
    let (o, e, ok) = run(cmd, Duration::from_secs(60));
    assert!(ok, "the README's C does not compile:\n{o}\n{e}");
}
