//! C, Python, C# and Rust players in ONE group on a real reflector: each
//! hears every other, asserted per (listener, sender) pair. The C program
//! runs two players (two handles), so six players in all.

mod common;

use common::{
    assert_all_heard, build_grid, build_player_exe, crate_dir, heard, lib_dir, mint, run, rust_player, tool, Reflector,
};
use std::process::Command;
use std::time::Duration;

#[test]
fn c_python_csharp_and_rust_players_hear_each_other() {
    let tools = (tool("cc"), tool("python3"), tool("mcs"), tool("mono"));
    let (Some(cc), Some(python), Some(mcs), Some(mono)) = tools else {
        return;
    };
    let grid = build_grid(&cc, false);
    let exe = build_player_exe(&mcs);
    let r = Reflector::start();
    let addr = r.addr().to_string();
    // Long enough that every program (mono starts slowest) overlaps the
    // others for several seconds.
    let secs = "6";
    let (c1, c2, py, cs, rs) = (mint(41, &r), mint(42, &r), mint(43, &r), mint(44, &r), mint(45, &r));

    let mut c_cmd = Command::new(&grid);
    c_cmd.args([&addr, secs, &c1.spec(), &c2.spec()]);
    let mut py_cmd = Command::new(python);
    py_cmd
        .current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["player.py", &addr, secs, &py.spec()]);
    let mut cs_cmd = Command::new(mono);
    cs_cmd
        .env("LD_LIBRARY_PATH", lib_dir())
        .arg(&exe)
        .args([&addr, secs, &cs.spec()]);

    let within = Duration::from_secs(60);
    let (mut all, outputs) = std::thread::scope(|s| {
        let rust = s.spawn(|| rust_player(&r, &rs, 6));
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
        (rust.join().expect("the Rust player"), outputs)
    });
    all.extend(heard(&outputs));
    assert_all_heard(&all, &[41, 42, 43, 44, 45], &outputs);
    r.stop();
}
