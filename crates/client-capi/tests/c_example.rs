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

/// Every C block of the README ("first group in five minutes", the
/// checkpoint loop) compiles against the header as it is.
#[test]
fn readme_c_examples_compile() {
    let Some(cc) = tool("cc") else { return };
    let readme = std::fs::read_to_string(common::crate_dir().join("README.md")).expect("the README");
    let blocks: Vec<&str> = readme
        .split("```c\n")
        .skip(1)
        .filter_map(|s| s.split("```").next())
        .collect();
    assert!(blocks.len() >= 2, "the README's ```c blocks: {}", blocks.len());
    let dir = common::scratch("readme");
    for (i, code) in blocks.iter().enumerate() {
        let src = dir.join(format!("block{i}.c"));
        std::fs::write(&src, code).unwrap();
        let mut cmd = Command::new(&cc);
        cmd.args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-c", "-I"])
            .arg(common::crate_dir().join("include"))
            .arg(&src)
            .arg("-o")
            .arg(dir.join(format!("block{i}.o")));
        let (o, e, ok) = run(cmd, Duration::from_secs(60));
        assert!(ok, "the README's C block {i} does not compile:\n{code}\n{o}\n{e}");
    }
}
