//! Areas of interest through the C ABI from Python (bindings/python,
//! `mover.py`) and C# (bindings/csharp, `Mover.cs`), against a real
//! reflector with a group per cell (a row of three 100-unit cells) and the
//! real control server, given as the fallback of a first URL where nothing
//! listens (so every request fails over).
//!
//! The mover (radius 1) starts in cell 0 (its area: cells 0 and 1), hears
//! a Rust player in cell 1, and moves to cell 2 with `set_position` (its
//! area: cells 1 and 2). It must get exactly one MOVED, from cell 0's group
//! to cell 2's, and a LEFT_GROUP for cell 0's group only; hear the player
//! in cell 1 on both sides of the move; hear a Rust player in cell 2 only
//! after it (cell 2 is out of its first area); end a member of exactly the
//! groups of cells 1 and 2, sending to cell 2's, after two control server
//! requests. The player in cell 2 hears the mover (its sends follow it);
//! the one in cell 1 never does (it sends to its cell only).

mod common;

use common::{
    area_control_server, build_csharp, centre, crate_dir, down_url, lib_dir, run, rust_cell_player, tool, Reflector,
};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

const MOVER: u32 = 61;
const NEAR: u32 = 62;
const FAR: u32 = 63;

/// Runs `program` (given the mover's arguments) beside the two Rust
/// players and checks what each saw.
fn mover_crosses_the_row(name: &str, program: impl Fn(&[String]) -> Command) {
    let r = Reflector::start_groups(3);
    let ports = r.ports();
    let control = area_control_server(&r);
    let url = control.url();
    let args: Vec<String> = vec![
        MOVER.to_string(),
        "1".into(),
        centre(0).0.to_string(),
        centre(2).0.to_string(),
        "30".into(),
        down_url(),
        url.clone(),
    ];
    let stop = AtomicBool::new(false);
    let (out, near, far) = std::thread::scope(|s| {
        let near = s.spawn(|| rust_cell_player(&url, NEAR, centre(1), &stop));
        let far = s.spawn(|| rust_cell_player(&url, FAR, centre(2), &stop));
        let (out, err, ok) = run(program(&args), Duration::from_secs(60));
        stop.store(true, SeqCst);
        let (near, far) = (
            near.join().expect("the near player"),
            far.join().expect("the far player"),
        );
        assert!(ok, "the {name} mover failed:\n{out}\n{err}");
        (out, near, far)
    });
    r.stop();
    let served = control.stop();

    let lines: Vec<&str> = out.lines().collect();
    let has = |l: String| lines.iter().any(|x| *x == l);
    let starting = |p: &str| lines.iter().filter(|l| l.starts_with(p)).copied().collect::<Vec<_>>();
    let moved = format!("moved {} {}", ports[0], ports[2]);
    assert_eq!(
        starting("moved "),
        [moved.as_str()],
        "one move, cell 0 to cell 2:\n{out}"
    );
    let left = format!("left_group {}", ports[0]);
    assert_eq!(
        starting("left_group "),
        [left.as_str()],
        "cell 0's group left, only:\n{out}"
    );
    assert!(
        starting("error ").is_empty() && starting("rejoining ").is_empty(),
        "{out}"
    );
    for side in ["before", "after"] {
        assert!(
            has(format!("heard {MOVER} {NEAR} {side}")),
            "the player in cell 1 is in both areas, heard {side} the move:\n{out}"
        );
    }
    assert!(
        !has(format!("heard {MOVER} {FAR} before")),
        "cell 2 is out of the first area:\n{out}"
    );
    assert!(has(format!("heard {MOVER} {FAR} after")), "{out}");
    let mut area = [ports[1], ports[2]];
    area.sort_unstable();
    assert!(
        has(format!("groups {} {}", area[0], area[1])),
        "the new area's groups:\n{out}"
    );
    assert!(has(format!("sending {}", ports[2])), "{out}");
    assert!(has("token_requests 2".into()), "the join and the move:\n{out}");
    assert!(
        far.contains(&MOVER),
        "the player in cell 2 hears the mover after its move: {far:?}"
    );
    assert!(
        !near.contains(&MOVER),
        "the mover sends to its own cell only, never cell 1: {near:?}"
    );
    // The mover's two requests and the Rust players' one each, all through
    // the fallback for the mover.
    assert_eq!(served, 4, "requests the control server answered");
}

#[test]
fn a_python_mover_crosses_cells_make_before_break_and_keeps_hearing_its_neighbour() {
    let Some(python) = tool("python3") else { return };
    mover_crosses_the_row("Python", |args| {
        let mut cmd = Command::new(&python);
        cmd.current_dir(crate_dir().join("bindings/python"))
            .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
            .arg("mover.py")
            .args(args);
        cmd
    });
}

#[test]
fn a_csharp_mover_crosses_cells_make_before_break_and_keeps_hearing_its_neighbour() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_csharp(&mcs, "Mover.cs", "mover.exe");
    mover_crosses_the_row("C#", |args| {
        let mut cmd = Command::new(&mono);
        cmd.env("LD_LIBRARY_PATH", lib_dir()).arg(&exe).args(args);
        cmd
    });
}
