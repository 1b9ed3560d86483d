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

/// A game that fetches its own tokens, from Python (1.6): the script is
/// the game and its backend at once. Two clients made before their first
/// token (`Client.handed_in`) send their `sign_key` on the backend's
/// `/join` (urllib, json) to a control server with a sealing secret and
/// hand the answers in (`hand_in`: token, keys, certificate); A uploads a
/// checkpoint when asked, B fetches it on joining and takes it as signed
/// by A, and both exchange sealed DATA. Wrong lengths are refused naming
/// the field.
#[test]
fn python_hands_in_sealing_and_takes_a_signed_checkpoint() {
    let Some(python) = tool("python3") else { return };
    let r = Reflector::start_sealed_checkpoints(1);
    let control = common::sealing_control_server(&r);
    let script = r#"
import json, sys, time, urllib.request
import reflector_client as rc
lib = rc.load()
url = sys.argv[1]
def backend_join(player, sign_key):
    q = "%s/join?player=%d&x=50&y=50&sign_key=%s" % (url, player, sign_key.hex())
    with urllib.request.urlopen(q, timeout=5) as r:
        return json.loads(r.read())
def frame(c, seen):
    c.update()
    c.events()
    for d in c.datagrams():
        seen["data"].append((d.sender, bytes(d.payload)))
    for ck in c.checkpoint_events():
        if ck.kind == rc.RC_CHECKPOINT_REQUESTED and seen.get("state"):
            try:
                c.provide_checkpoint(777, seen["state"])
            except rc.ReflectorError as e:
                if e.code != rc.RC_ERR_IN_FLIGHT:
                    raise
        elif ck.kind != rc.RC_CHECKPOINT_REQUESTED:
            seen["ck"].append((ck.kind, ck.verification, ck.from_player, ck.tick, ck.check))
def pump(clients, done):
    deadline = time.time() + 10
    while not done():
        if time.time() > deadline:
            raise SystemExit("not done within 10 s")
        for c, seen in clients:
            frame(c, seen)
        time.sleep(0.001)

a = rc.Client.handed_in(lib, local="127.0.0.1:0")
a.checkpoint_configure(fetch_on_join=False)
ga = backend_join(1, a.sign_key())
try:
    a.set_checkpoint_certificate(ga["group"], ga["control_public"], ga["certificate"], ga["expires_unix_s"])
    raise SystemExit("a certificate for a group not held yet was taken")
except rc.ReflectorError as e:
    print("before token", e.code, e.message)
a.hand_in(ga)
try:
    a.set_checkpoint_certificate(ga["group"], bytes(31), ga["certificate"], ga["expires_unix_s"])
    raise SystemExit("a 31-byte control_public was taken")
except rc.ReflectorError as e:
    print("short key", e.code, e.message)
try:
    a.set_epoch_keys(ga["group"], [dict(ga["keys"][0], key="00" * 31)])
    raise SystemExit("a 31-byte epoch key was taken")
except rc.ReflectorError as e:
    print("short epoch key", e.code, e.message)
sa = {"data": [], "ck": [], "state": b"python state " * 100}
pump([(a, sa)], lambda: any(k == rc.RC_CHECKPOINT_UPLOADED for k, *_ in sa["ck"]))
b = rc.Client.handed_in(lib, local="127.0.0.1:0")
b.hand_in(backend_join(2, b.sign_key()))
sb = {"data": [], "ck": []}
pump([(a, sa), (b, sb)], lambda: sb["ck"])
kind, verification, frm, tick, check = sb["ck"][0]
print("fetched", kind, verification, frm, tick, check)
taken = b.take_checkpoint()
print("same state", taken == (777, sa["state"]))
deadline = time.time() + 10
while not ((2, b"from b") in sa["data"] and (1, b"from a") in sb["data"]):
    if time.time() > deadline:
        raise SystemExit("no sealed DATA within 10 s")
    a.send(b"from a")
    b.send(b"from b")
    time.sleep(0.01)
    frame(a, sa)
    frame(b, sb)
print("sealed data both ways, max payload", a.max_payload())
print("names", rc.check_name(lib, rc.RC_CHECK_WRONG_CELL), rc.check_name(lib, rc.RC_CHECK_BAD),
      rc.check_name(lib, 0))
print("drops", sum(getattr(a.sealing_stats(), f) for f, _ in rc.SealingStats._fields_))
a.close()
b.close()
"#;
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["-c", script, &control.url()]);
    let (out, err, ok) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("before token -2 no group"), "{out}");
    assert!(
        out.contains("short key -2 control_public is 31 bytes; it must be 32"),
        "{out}"
    );
    assert!(
        out.contains("short epoch key -2 epoch key 0: key is 31 bytes; it must be 32"),
        "{out}"
    );
    // READY (3), signed (2), from player 1 at tick 777, no check refused.
    assert!(out.contains("fetched 3 2 1 777 0"), "{out}");
    assert!(out.contains("same state True"), "{out}");
    assert!(out.contains("sealed data both ways, max payload 1400"), "{out}");
    assert!(out.contains("names checkpoint_wrong_cell checkpoint_bad None"), "{out}");
    assert!(out.contains("drops 0"), "{out}");
    r.stop();
    control.stop();
}

/// A client handed its tokens that asks `/keys` itself, from Python (1.8):
/// `Client.handed_in(lib, keys_from=...)` refuses plain HTTP without
/// consent, an empty URL and a plain-HTTP fallback with the library's
/// message; made with the control server's URL (the script is also the
/// backend: `/join` with urllib), handed the grant's token and its keys
/// with the times of keys near their end, the client asks `/keys` and
/// `sealing_stats()` shows the answer; the same client without keys_from
/// asks nothing.
#[test]
fn python_names_a_control_server_for_keys() {
    let Some(python) = tool("python3") else { return };
    let r = Reflector::start_sealed();
    let control = common::sealing_control_server(&r);
    let script = r#"
import json, sys, time, urllib.request
import reflector_client as rc
lib = rc.load()
url = sys.argv[1]
for what, kwargs in (("plain", dict(keys_from=url)), ("empty", dict(keys_from="")),
                     ("fallback", dict(keys_from="https://control-a.example",
                                       fallback_urls=["http://control-b.example"]))):
    try:
        rc.Client.handed_in(lib, local="127.0.0.1:0", **kwargs).close()
        raise SystemExit("%s was taken" % what)
    except rc.ReflectorError as e:
        print(what, "refused", e.code, e.message)
def backend_join(player, sign_key):
    q = "%s/join?player=%d&x=50&y=50&sign_key=%s" % (url, player, sign_key.hex())
    with urllib.request.urlopen(q, timeout=5) as r:
        return json.loads(r.read())
with_ = rc.Client.handed_in(lib, local="127.0.0.1:0", keys_from=url, allow_plain_http=True)
without = rc.Client.handed_in(lib, local="127.0.0.1:0")
now = int(time.time())
for player, c in ((1, with_), (2, without)):
    g = backend_join(player, c.sign_key())
    c.set_token(bytes.fromhex(g["token"]), bytes.fromhex(g["session_key"]), g["player"], g["group"],
                g["reflector"], g["expires_unix_s"])
    # The grant's keys with the times of keys near their end (within the
    # overlap window): a refresh is due at once.
    c.set_epoch_keys(g["group"], [dict(k, starts_unix_s=now - 10, ends_unix_s=now + 30) for k in g["keys"]])
deadline = time.time() + 15
while with_.sealing_stats().keys_refreshes == 0:
    if time.time() > deadline:
        s = with_.sealing_stats()
        raise SystemExit("no /keys answer within 15 s: %d requests, %d failures" % (s.keys_requests,
                                                                                    s.keys_refresh_failures))
    for c in (with_, without):
        c.update()
        c.events()
    time.sleep(0.002)
s = with_.sealing_stats()
print("refreshed", s.keys_requests, s.keys_refreshes, s.keys_refresh_failures)
print("without", without.sealing_stats().keys_requests)
with_.close()
without.close()
"#;
    let url = control.url();
    let mut cmd = Command::new(python);
    cmd.current_dir(crate_dir().join("bindings/python"))
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"))
        .args(["-c", script, &url]);
    let (out, err, ok) = run(cmd, Duration::from_secs(60));
    assert!(ok, "{out}\n{err}");
    common::assert_keys_from_output(&out, &err, &url);
    assert!(out.lines().any(|l| l == "without 0"), "no keys_from, no /keys: {out}");
    r.stop();
    control.stop();
}
