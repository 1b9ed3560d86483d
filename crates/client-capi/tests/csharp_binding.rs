//! The C# binding (bindings/csharp, P/Invoke): compiled with Mono's `mcs`
//! as C# 7, run with `mono`; a C# player and a Rust player in one group
//! against a real reflector hear each other.

mod common;

use common::{assert_all_heard, build_player_exe, heard, lib_dir, mint, run, rust_player, tool, Reflector};
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
