//! The C example (examples/c/grid.c): built with `cc` against the
//! committed header and the built library, run against a real reflector
//! with several players (several handles in one process); each must hear
//! every other. Built against the 1.1 header (tests/data/abi-1.1, as 1.1
//! shipped it), it must run the same on this library: minor versions only
//! add.

mod common;

use common::{assert_all_heard, build_grid, build_grid_with, heard, mint, run, tool, Reflector};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn grid_players_hear_each_other(static_lib: bool, players: &[u32]) {
    let Some(cc) = tool("cc") else { return };
    run_grid(build_grid(&cc, static_lib), players);
}

fn run_grid(grid: PathBuf, players: &[u32]) {
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

/// A 1.1 program (grid.c uses 1.1's calls and structs only: events,
/// datagrams, stats, checkpoints) built against 1.1's header runs on this
/// library: 1.2 changed no function and no struct's size or offsets.
#[test]
fn c_grid_built_against_the_1_1_header_runs_on_this_library() {
    let Some(cc) = tool("cc") else { return };
    let old = common::crate_dir().join("tests/data/abi-1.1");
    let h = std::fs::read_to_string(old.join("reflector_client.h")).expect("the 1.1 header");
    assert!(
        h.contains("#define REFLECTOR_C_VERSION_MINOR 1\n"),
        "the 1.1 header, as it shipped"
    );
    run_grid(build_grid_with(&cc, false, &old, "grid-abi-1.1"), &[16, 17]);
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
