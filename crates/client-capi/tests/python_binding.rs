//! The Python binding (bindings/python, ctypes over the C ABI): a Python
//! player and a Rust player in one group against a real reflector; each
//! hears the other.

mod common;

use common::{assert_all_heard, crate_dir, heard, lib_dir, mint, run, rust_player, tool, Reflector};
use std::process::Command;
use std::time::Duration;

#[test]
fn python_player_and_rust_player_hear_each_other() {
    let Some(python) = tool("python3") else { return };
    let r = Reflector::start();
    let (py, rs) = (mint(21, &r), mint(22, &r));
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["player.py", &r.addr().to_string(), "3", &py.spec()]);
    let (mut all, out) = std::thread::scope(|s| {
        let rust = s.spawn(|| rust_player(&r, &rs, 3));
        let (out, err, ok) = run(cmd, Duration::from_secs(30));
        assert!(ok, "player.py failed:\n{out}\n{err}");
        (rust.join().expect("the Rust player"), out)
    });
    assert!(out.contains("hears player 22: pos"), "it prints what it hears:\n{out}");
    all.extend(heard(&out));
    assert_all_heard(&all, &[21, 22], &out);
    r.stop();
}

/// Errors surface as ReflectorError with the library's code and message:
/// a bad token length, and a second close (a double free).
#[test]
fn python_errors_are_exceptions_with_the_message() {
    let Some(python) = tool("python3") else { return };
    let script = r#"
import reflector_client as rc
lib = rc.load()
try:
    rc.Client.with_token(lib, b"x" * 5, b"k" * 32, 1, 1, "127.0.0.1:9", 2**40)
    raise SystemExit("a 5-byte token was taken")
except rc.ReflectorError as e:
    print("refused", e.code, e.message)
c = rc.Client.with_token(lib, b"t" * 32, b"k" * 32, 1, 1, "127.0.0.1:9", 2**40, local="127.0.0.1:0")
c.update()
s = c.sealing_stats()
print("sealing", s.malformed, s.bad, s.keys_refresh_failures, s.checkpoint_bad)
assert rc.ctypes.sizeof(rc.SealingStats) == 17 * 8, "the counters mirror rc_sealing_counters"
print("duplicates", c.sealing_duplicates())
c.close()
try:
    c.close()
    raise SystemExit("a double free was taken")
except rc.ReflectorError as e:
    print("double free", e.code)
"#;
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["-c", script]);
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("refused -2 the token is 5 bytes; it must be 32"), "{out}");
    assert!(out.contains("double free -3"), "{out}");
    // 1.5's counters read through the binding (no sealed group: zeros).
    assert!(out.contains("sealing 0 0 0"), "{out}");
    // 1.7's duplicate deliveries, a function of their own.
    assert!(out.contains("duplicates 0"), "{out}");
}

/// An area's tokens handed in from Python (1.3): the client joins both
/// groups and sends to the first (its cell); a token refused on the way
/// raises with the library's message and hands nothing in.
#[test]
fn python_hands_in_an_area() {
    let Some(python) = tool("python3") else { return };
    let r = common::Reflector::start_groups(2);
    let ports = r.ports();
    let specs: Vec<String> = ports.iter().map(|&g| common::mint_for(31, g).spec()).collect();
    let script = r#"
import sys, time
import reflector_client as rc
lib = rc.load()
def token(spec):
    player, group, expires, t, k = spec.split(":")
    return (bytes.fromhex(t), bytes.fromhex(k), int(player), int(group), "127.0.0.1:" + group, int(expires))
cell, other = token(sys.argv[1]), token(sys.argv[2])
c = rc.Client.with_token(lib, *cell, local="127.0.0.1:0")
try:
    c.set_area([cell, cell])
    raise SystemExit("a group twice was taken")
except rc.ReflectorError as e:
    print("refused", e.code, e.message)
c.set_area([cell, other])
deadline = time.time() + 10
while c.member_groups() != sorted([cell[3], other[3]]):
    if time.time() > deadline:
        raise SystemExit("not a member of both groups: %r" % c.member_groups())
    c.update()
    c.events()
    time.sleep(0.001)
print("members of", c.member_groups(), "sending to", c.sending_group())
c.close()
"#;
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["-c", script, &specs[0], &specs[1]]);
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("refused -2 group"), "{out}");
    assert!(out.contains("is in the area already"), "{out}");
    let mut both = ports.clone();
    both.sort_unstable();
    assert!(
        out.contains(&format!("members of {both:?} sending to {}", ports[0])),
        "{out}"
    );
    r.stop();
}
