//! The C# binding (bindings/csharp, P/Invoke): compiled with Mono's `mcs`
//! as C# 7, run with `mono`; a C# player and a Rust player in one group
//! against a real reflector hear each other; an area's tokens handed in
//! from C#; sealing for a game that fetches its own tokens (1.6).

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

/// A game that fetches its own tokens, from C# (1.6,
/// `tests/csharp/HandedInSealing.cs`): the program makes two clients with
/// no token yet and prints their signing keys; this test, as the game's
/// backend, asks the control server's `/join` (sealing secret) with each
/// as `sign_key` and writes the grants back on the program's stdin. The
/// program hands them in; A uploads a checkpoint, B fetches it on joining
/// and takes it as signed by A, both exchange sealed DATA, and wrong
/// lengths are refused naming the field.
#[test]
fn csharp_hands_in_sealing_and_takes_a_signed_checkpoint() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_csharp_from(
        &mcs,
        &crate_dir().join("tests/csharp/HandedInSealing.cs"),
        "handed_in_sealing.exe",
    );
    let r = Reflector::start_sealed_checkpoints(1);
    let control = common::sealing_control_server(&r);
    let mut child = Command::new(mono)
        .env("LD_LIBRARY_PATH", lib_dir())
        .arg(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mono starts");
    let mut stdin = child.stdin.take().expect("stdin");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).ok();
        s
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut out = String::new();
    let next_line = |out: &mut String| {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).ok();
        if let Some(l) = &line {
            out.push_str(l);
            out.push('\n');
        }
        line
    };
    let mut grants = Vec::new();
    for player in [1u32, 2] {
        let Some(line) = next_line(&mut out) else {
            child.kill().ok();
            child.wait().ok();
            panic!("no signing key from the program:\n{out}");
        };
        let key = hex::decode(line.strip_prefix("sign_key ").expect("a sign_key line")).expect("hex");
        let g = common::sealed_join(&control.url(), player, common::centre(0), &key);
        let mut l = format!(
            "{} {} {} {} {} {} {} {}",
            g.grant.player,
            g.grant.group,
            g.grant.reflector,
            g.grant.expires_unix_s,
            g.grant.token,
            g.grant.session_key,
            g.control_public.as_deref().expect("control_public"),
            g.certificate.as_deref().expect("certificate"),
        );
        for k in &g.keys {
            l.push_str(&format!(
                " {},{},{},{},{},{},{}",
                k.cell[0], k.cell[1], k.cell_id, k.epoch, k.key, k.starts_unix_s, k.ends_unix_s
            ));
        }
        grants.push(l);
    }
    for l in &grants {
        writeln!(stdin, "{l}").expect("write a grant line");
    }
    drop(stdin);
    while next_line(&mut out).is_some() {}
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            child.kill().ok();
            child.wait().ok();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().ok();
    let err = err_reader.join().unwrap_or_default();
    assert!(
        status.is_some_and(|s| s.success()),
        "handed_in_sealing.exe failed ({status:?}):\n{out}\n{err}"
    );
    assert!(
        out.contains("short key -2 control_public is 31 bytes; it must be 32"),
        "{out}"
    );
    assert!(
        out.contains("short epoch key -2 epoch key 0: Key is 31 bytes; it must be 32"),
        "{out}"
    );
    // READY (3), signed (2), from player 1 at tick 777, no check refused.
    assert!(out.contains("fetched 3 2 1 777 0"), "{out}");
    assert!(out.contains("same state True"), "{out}");
    assert!(out.contains("sealed data both ways, max payload 1400"), "{out}");
    assert!(out.contains("names checkpoint_wrong_cell checkpoint_bad"), "{out}");
    r.stop();
    control.stop();
}

/// A client handed its tokens that asks `/keys` itself, from C# (1.8,
/// `tests/csharp/KeysFrom.cs`): this test, as the game's backend, asks the
/// control server's `/join` (sealing secret) and passes the grant to the
/// program as arguments. `Client.HandedIn(keysFrom: ...)` refuses plain
/// HTTP without consent, an empty URL and a plain-HTTP fallback with the
/// library's status and message; made with the control server's URL, the
/// client is handed the token and keys near their end and its
/// `GetSealingStats()` shows the `/keys` request it sent, answered.
#[test]
fn csharp_names_a_control_server_for_keys() {
    let (Some(mcs), Some(mono)) = (tool("mcs"), tool("mono")) else {
        return;
    };
    let exe = build_csharp_from(&mcs, &crate_dir().join("tests/csharp/KeysFrom.cs"), "keys_from.exe");
    let r = Reflector::start_sealed();
    let control = common::sealing_control_server(&r);
    let url = control.url();
    // Any signing key: the certificate is not handed in here.
    let g = common::sealed_join(&url, 1, common::centre(0), &[9u8; 32]);
    let mut args = vec![
        url.clone(),
        g.grant.player.to_string(),
        g.grant.group.to_string(),
        g.grant.reflector.clone(),
        g.grant.expires_unix_s.to_string(),
        g.grant.token.clone(),
        g.grant.session_key.clone(),
    ];
    for k in &g.keys {
        args.push(format!(
            "{},{},{},{},{},{},{}",
            k.cell[0], k.cell[1], k.cell_id, k.epoch, k.key, k.starts_unix_s, k.ends_unix_s
        ));
    }
    let mut cmd = Command::new(mono);
    cmd.env("LD_LIBRARY_PATH", lib_dir()).arg(&exe).args(&args);
    let (out, err, ok) = run(cmd, Duration::from_secs(60));
    assert!(ok, "keys_from.exe failed:\n{out}\n{err}");
    common::assert_keys_from_output(&out, &err, &url);
    r.stop();
    control.stop();
}
