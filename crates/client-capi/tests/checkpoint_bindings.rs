//! Checkpoints from C (examples/c/grid.c), Python (bindings/python) and C#
//! (bindings/csharp) against a real reflector with its channel on: a
//! player uploads its state when the reflector asks; once the reflector
//! stored one, a second player of the same language joins, fetches it and
//! prints its tick, size and FNV-1a, which must be those of exactly the
//! state the first player made for that tick (each program makes it from
//! its id and the tick, as `common::example_state` does). The reflector's
//! counters must agree. The other checkpoint kept (FETCH_OTHER, 1.4) from
//! Python and C#: with none stored, EMPTY naming that fetch.

mod common;

use common::{
    build_csharp_from, build_grid, build_player_exe, crate_dir, example_state, fetches, fnv1a, lib_dir, mint, run,
    tool, uploads, Reflector, STATE_LEN,
};
use std::process::Command;
use std::time::{Duration, Instant};

/// Runs the uploader (`program` with REFLECTOR SECONDS SPEC), and once the
/// reflector stored a checkpoint the joiner; checks what the joiner got.
fn upload_then_join(name: &str, program: impl Fn(&[&str]) -> Command) {
    let r = Reflector::start_checkpoints(300);
    let (a, b) = (mint(71, &r), mint(72, &r));
    let addr = r.addr().to_string();
    let within = Duration::from_secs(60);
    let uploader = program(&[&addr, "8", &a.spec()]);
    let (out_a, out_b) = std::thread::scope(|s| {
        let ta = s.spawn(move || run(uploader, within));
        let deadline = Instant::now() + Duration::from_secs(30);
        while r.counters().checkpoints_stored == 0 {
            if ta.is_finished() {
                let (o, e, _) = ta.join().expect("the uploader's runner");
                panic!("the {name} uploader ended before it stored a checkpoint:\n{o}\n{e}");
            }
            assert!(
                Instant::now() < deadline,
                "the {name} uploader stored no checkpoint in 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let (out_b, err_b, ok_b) = run(program(&[&addr, "2", &b.spec()]), within);
        let (out_a, err_a, ok_a) = ta.join().expect("the uploader's runner");
        assert!(ok_a, "the {name} uploader failed:\n{out_a}\n{err_a}");
        assert!(ok_b, "the {name} joiner failed:\n{out_b}\n{err_b}");
        (out_a, out_b)
    });
    let ups = uploads(&out_a);
    assert!(
        ups.iter().all(|u| u.player == 71 && u.size == STATE_LEN) && !ups.is_empty(),
        "the uploader's uploads: {ups:?}\n{out_a}"
    );
    let got = fetches(&out_b);
    assert_eq!(got.len(), 1, "one fetch, on the join:\n{out_b}");
    let f = got[0];
    assert_eq!((f.player, f.from, f.size), (72, 71, STATE_LEN), "{f:?}");
    assert!(
        ups.iter().any(|u| (u.number, u.tick) == (f.number, f.tick)),
        "the joiner's checkpoint {f:?} is none of the uploads {ups:?}"
    );
    assert_eq!(
        f.fnv1a,
        fnv1a(&example_state(71, f.tick)),
        "the bytes fetched are not the state uploaded at tick {}",
        f.tick
    );
    // The reflector counts a fetch served after its last byte is handed to
    // the kernel, which may be after the joiner has read it all.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while r.counters().checkpoints_served == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let c = r.counters();
    assert!(c.checkpoints_stored >= ups.len() as u64, "{c:?}");
    assert_eq!(c.checkpoint_bytes_stored, c.checkpoints_stored * STATE_LEN as u64);
    assert_eq!(c.checkpoints_served, 1, "only the joiner fetched a state");
    r.stop();
}

#[test]
fn c_player_uploads_and_a_c_joiner_fetches_the_same_bytes() {
    let Some(cc) = tool("cc") else { return };
    let grid = build_grid(&cc, false);
    upload_then_join("C", |args| {
        let mut cmd = Command::new(&grid);
        cmd.args(args);
        cmd
    });
}

#[test]
fn python_player_uploads_and_a_python_joiner_fetches_the_same_bytes() {
    let Some(python) = tool("python3") else { return };
    upload_then_join("Python", |args| {
        let mut cmd = Command::new(&python);
        cmd.current_dir(crate_dir().join("bindings/python"))
            .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
            .arg("player.py")
            .args(args);
        cmd
    });
}

#[test]
fn csharp_player_uploads_and_a_csharp_joiner_fetches_the_same_bytes() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_player_exe(&mcs);
    upload_then_join("C#", |args| {
        let mut cmd = Command::new(&mono);
        cmd.env("LD_LIBRARY_PATH", lib_dir()).arg(&exe).args(args);
        cmd
    });
}

/// Checks a binding's FETCH_OTHER output: a second ask refused in flight
/// (-14), then EMPTY (4) with op FETCH_OTHER (3) for the group.
fn assert_fetch_other_empty(out: &str, group: u16) {
    assert!(out.lines().any(|l| l == "in flight -14"), "{out}");
    assert!(
        out.lines().any(|l| l == format!("ended 4 3 {group}")),
        "EMPTY answering FETCH_OTHER:\n{out}"
    );
}

#[test]
fn python_fetch_other_with_nothing_stored_is_empty_and_says_which() {
    let Some(python) = tool("python3") else { return };
    let r = Reflector::start_checkpoints(60_000);
    let m = mint(73, &r);
    let script = r#"
import sys, time
import reflector_client as rc
lib = rc.load()
player, group, expires, t, k = sys.argv[1].split(":")
c = rc.Client.with_token(lib, bytes.fromhex(t), bytes.fromhex(k), int(player), int(group), "127.0.0.1:" + group,
                         int(expires), local="127.0.0.1:0")
c.checkpoint_configure(fetch_on_join=False)
deadline = time.time() + 20
while not c.is_member():
    if time.time() > deadline:
        raise SystemExit("not a member")
    c.update()
    c.events()
    time.sleep(0.001)
c.fetch_checkpoint_other()
try:
    c.fetch_checkpoint_other()
    raise SystemExit("a second FETCH_OTHER was started")
except rc.ReflectorError as e:
    print("in flight", e.code)
ended = None
while ended is None:
    if time.time() > deadline:
        raise SystemExit("the FETCH_OTHER did not end")
    c.update()
    c.events()
    for ck in c.checkpoint_events():
        if ck.kind != rc.RC_CHECKPOINT_REQUESTED:
            ended = ck
    time.sleep(0.001)
print("ended", ended.kind, ended.op, ended.group)
c.close()
"#;
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["-c", script, &m.spec()]);
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert_fetch_other_empty(&out, r.group());
    r.stop();
}

#[test]
fn csharp_fetch_other_with_nothing_stored_is_empty_and_says_which() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_csharp_from(&mcs, &crate_dir().join("tests/csharp/FetchOther.cs"), "fetch_other.exe");
    let r = Reflector::start_checkpoints(60_000);
    let m = mint(74, &r);
    let mut cmd = Command::new(mono);
    cmd.env("LD_LIBRARY_PATH", lib_dir()).arg(&exe).arg(m.spec());
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "fetch_other.exe failed:\n{out}\n{err}");
    assert_fetch_other_empty(&out, r.group());
    r.stop();
}
