//! The C# binding (bindings/csharp, P/Invoke): compiled with Mono's `mcs`
//! as C# 7, run with `mono`; a C# player and a Rust player in one group
//! against a real reflector hear each other; an area's tokens handed in
//! from C#.

mod common;

use common::{
    assert_all_heard, build_csharp_from, build_player_exe, crate_dir, heard, lib_dir, mint, mint_for, run, rust_player,
    tool, Reflector,
};
use std::process::Command;
use std::time::Duration;

#[test]
fn csharp_player_and_rust_player_hear_each_other() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_player_exe(&mcs);
    let r = Reflector::start();
    let (cs, rs) = (mint(31, &r), mint(32, &r));
    let mut cmd = Command::new(mono);
    cmd.env("LD_LIBRARY_PATH", lib_dir())
        .arg(&exe)
        .args([&r.addr().to_string(), "4", &cs.spec()]);
    let (mut all, out) = std::thread::scope(|s| {
        let rust = s.spawn(|| rust_player(&r, &rs, 4));
        let (out, err, ok) = run(cmd, Duration::from_secs(60));
        assert!(ok, "player.exe failed:\n{out}\n{err}");
        (rust.join().expect("the Rust player"), out)
    });
    assert!(out.contains("hears player 32: pos"), "it prints what it hears:\n{out}");
    all.extend(heard(&out));
    assert_all_heard(&all, &[31, 32], &out);
    r.stop();
}

/// An area's tokens handed in from C# (1.3), as `python_hands_in_an_area`
/// does from Python, run under Mono so the P/Invoke signatures and the
/// marshalling of `AddAreaToken`, `SetArea`, `SetToken`, `MemberGroups` and
/// `SendingGroup` are proven against the built library, not only compiled:
/// the client joins both groups and sends to the first (its cell); a group
/// added twice, and a 5-byte token to `SetToken`, are refused with the
/// library's status and message; the cell's own token renews.
#[test]
fn csharp_hands_in_an_area() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_csharp_from(
        &mcs,
        &crate_dir().join("tests/csharp/HandsInArea.cs"),
        "hands_in_area.exe",
    );
    let r = Reflector::start_groups(2);
    let ports = r.ports();
    let specs: Vec<String> = ports.iter().map(|&g| mint_for(31, g).spec()).collect();
    let mut cmd = Command::new(mono);
    cmd.env("LD_LIBRARY_PATH", lib_dir()).arg(&exe).args(&specs);
    let (out, err, ok) = run(cmd, Duration::from_secs(30));
    assert!(ok, "hands_in_area.exe failed:\n{out}\n{err}");
    assert!(out.contains("refused -2 group"), "{out}");
    assert!(out.contains("is in the area already"), "{out}");
    let mut both = ports.clone();
    both.sort_unstable();
    assert!(
        out.contains(&format!("members of {both:?} sending to {}", ports[0])),
        "{out}"
    );
    assert!(
        out.contains("set_token refused -2 the token is 5 bytes; it must be 32"),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "renewed"), "{out}");
    assert!(!out.contains("error "), "{out}");
    r.stop();
}

/// The Unity plugin folder: the library under Plugins/x86_64 and the
/// binding's sources, from the library this test run built.
#[test]
fn unity_package_lays_out_the_plugin_folder() {
    let Some(bash) = tool("bash") else { return };
    let out = common::scratch("unity").join("ReflectorClient");
    let mut cmd = Command::new(bash);
    cmd.arg(common::crate_dir().join("bindings/unity/package.sh"))
        .arg(&out)
        .env("REFLECTOR_C_LIB", lib_dir().join("libreflector_c.so"));
    let (o, e, ok) = run(cmd, Duration::from_secs(60));
    assert!(ok, "package.sh failed:\n{o}\n{e}");
    for f in [
        "Plugins/x86_64/libreflector_c.so",
        "Scripts/ReflectorClient.cs",
        "Scripts/Examples~/Player.cs",
        "Scripts/Examples~/Mover.cs",
        "README.txt",
    ] {
        assert!(out.join(f).is_file(), "{f} missing from the plugin folder");
    }
    let lib = std::fs::read(out.join("Plugins/x86_64/libreflector_c.so")).unwrap();
    assert_eq!(&lib[..4], b"\x7fELF", "a Linux shared library");
}
