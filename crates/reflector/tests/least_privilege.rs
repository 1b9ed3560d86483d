//! Least privilege, as shipped: the systemd units in `deploy/systemd` pass
//! `systemd-analyze verify` with no warning, and each unit's own command line
//! runs as an unprivileged user holding exactly the unit's capabilities (its
//! bounding and ambient sets, applied with setpriv) in a namespace of the
//! test's. Without the capability, the same command stops at start with a
//! message naming it.

use oskit::testing::{root_or_skip, veth_pair, NetNsGuard, VethEnd};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel)
}

/// The `[Service]` settings of a unit file, in order (repeated keys kept).
fn service_settings(unit: &str) -> Vec<(String, String)> {
    let mut in_service = false;
    let mut out = vec![];
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.to_string(), v.to_string()));
            }
        }
    }
    out
}

fn setting<'a>(s: &'a [(String, String)], key: &str) -> &'a str {
    s.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("the unit has no {key}="))
}

/// setpriv's form of a systemd capability list ("CAP_NET_BIND_SERVICE" ->
/// "+net_bind_service"); empty means none.
fn setpriv_caps(systemd: &str) -> String {
    let mut caps = vec!["-all".to_string()];
    caps.extend(
        systemd
            .split_whitespace()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase())),
    );
    caps.join(",")
}

/// A directory everyone can read, with the binary and the credentials the
/// units load (test values), as systemd would hand them to the service.
struct Install {
    dir: PathBuf,
}

impl Install {
    fn new(tag: &str) -> Install {
        let dir = std::env::temp_dir().join(format!("reflector-least-privilege-{}-{tag}", std::process::id()));
        let creds = dir.join("credentials");
        std::fs::create_dir_all(&creds).unwrap();
        let bin = dir.join("reflector");
        std::fs::copy(env!("CARGO_BIN_EXE_reflector"), &bin).unwrap();
        let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
        std::fs::copy(data.join("test-cert.pem"), creds.join("tls-cert")).unwrap();
        std::fs::copy(data.join("test-key.pem"), creds.join("tls-key")).unwrap();
        std::fs::write(creds.join("secret"), "ab".repeat(32)).unwrap();
        std::fs::write(creds.join("redis-password"), FLEET_PASSWORD).unwrap();
        std::fs::write(
            creds.join("ticket-keys"),
            format!(
                "[[key]]\nkid = \"k1\"\nalg = \"HS256\"\nsecret_hex = \"{}\"\n",
                "cd".repeat(32)
            ),
        )
        .unwrap();
        for p in [&dir, &creds] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        for f in std::fs::read_dir(&creds).unwrap() {
            std::fs::set_permissions(f.unwrap().path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        Install { dir }
    }

    /// The unit with its binary and credential paths pointing here, and a
    /// fleet's hosts on the namespace's loopback.
    fn localize(&self, unit: &str) -> String {
        unit.replace("/usr/local/bin/reflector", self.dir.join("reflector").to_str().unwrap())
            .replace("redis.internal", "127.0.0.1")
            .replace("--advertise 203.0.113.10", "--advertise 127.0.0.1")
            .replace(
                "${CREDENTIALS_DIRECTORY}",
                self.dir.join("credentials").to_str().unwrap(),
            )
    }
}

impl Drop for Install {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The unit's command as user `nobody` in `ns`, with the unit's bounding and
/// ambient capability sets, or none at all.
fn as_unit(ns: &NetNsGuard, settings: &[(String, String)], with_caps: bool, extra: &[&str]) -> Command {
    let (bounding, ambient) = if with_caps {
        (
            setpriv_caps(setting(settings, "CapabilityBoundingSet")),
            setpriv_caps(setting(settings, "AmbientCapabilities")),
        )
    } else {
        ("-all".to_string(), "-all".to_string())
    };
    let mut c = ns.command("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--bounding-set={bounding}"))
        .arg(format!("--inh-caps={ambient}"))
        .arg(format!("--ambient-caps={ambient}"))
        .arg("--no-new-privs")
        .args(setting(settings, "ExecStart").split_whitespace())
        .args(extra)
        .env("RUST_LOG", "warn");
    c
}

fn verify(unit_path: &Path) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit_path)
        .output()
        .expect("systemd-analyze runs (package systemd)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "{}: {err}",
        unit_path.display()
    );
}

fn localized(install: &Install, name: &str) -> (PathBuf, Vec<(String, String)>) {
    let unit = install.localize(&std::fs::read_to_string(repo_file(&format!("deploy/systemd/{name}"))).unwrap());
    let path = install.dir.join(name);
    std::fs::write(&path, &unit).unwrap();
    (path, service_settings(&unit))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_reflector_unit_verifies_and_serves_unprivileged() {
    if !root_or_skip("the_reflector_unit_verifies_and_serves_unprivileged") {
        return;
    }
    let install = Install::new("serve");
    let (path, settings) = localized(&install, "reflector.service");
    verify(&path);
    let ns = NetNsGuard::new("lpr");
    let o = as_unit(&ns, &settings, true, &["--duration", "0.5"]).output().unwrap();
    assert!(o.status.success(), "the unit's command failed: {}", stderr(&o));
    // Its ports are all unprivileged: it needs no capability at all.
    let o = as_unit(&ns, &settings, false, &["--duration", "0.5"]).output().unwrap();
    assert!(o.status.success(), "failed without capabilities: {}", stderr(&o));
    // A privileged group port without the capability: named at start.
    let low: Vec<(String, String)> = settings
        .iter()
        .map(|(k, v)| (k.clone(), v.replace("--ports 4000-4015", "--ports 80")))
        .collect();
    assert_ne!(low, settings, "the unit's ports changed: update this test");
    let o = as_unit(&ns, &low, false, &["--duration", "0.5"]).output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("CAP_NET_BIND_SERVICE: group port 80"), "{err}");
}

#[test]
fn the_ebpf_unit_verifies_and_fans_out_in_the_kernel_with_only_its_capabilities() {
    if !root_or_skip("the_ebpf_unit_verifies_and_fans_out_in_the_kernel_with_only_its_capabilities") {
        return;
    }
    let install = Install::new("ebpf");
    let (path, settings) = localized(&install, "reflector-ebpf.service");
    verify(&path);
    const CAPS: &str = "CAP_BPF CAP_NET_ADMIN CAP_PERFMON";
    assert_eq!(setting(&settings, "CapabilityBoundingSet"), CAPS);
    assert_eq!(setting(&settings, "AmbientCapabilities"), CAPS);
    let ns = NetNsGuard::new("lpe");
    // The kernel path serves addresses of Ethernet devices: one here.
    veth_pair(
        VethEnd::new(ns.name(), "le0").addr("10.207.0.1/24"),
        VethEnd::new(ns.name(), "le1"),
    );
    let run = |settings: &[(String, String)]| {
        as_unit(&ns, settings, true, &["--bind", "10.207.0.1", "--duration", "0.5"])
            .output()
            .unwrap()
    };
    let o = run(&settings);
    assert!(o.status.success(), "the unit's command failed: {}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("(backend ebpf)"), "the kernel path, not a fallback: {out}");
    // Each of the three is needed, and named when missing (--strict-backend).
    for cap in CAPS.split(' ') {
        let less: Vec<(String, String)> = settings
            .iter()
            .map(|(k, v)| match k.as_str() {
                "CapabilityBoundingSet" | "AmbientCapabilities" => (
                    k.clone(),
                    v.split(' ').filter(|c| *c != cap).collect::<Vec<_>>().join(" "),
                ),
                _ => (k.clone(), v.clone()),
            })
            .collect();
        let o = run(&less);
        assert!(!o.status.success(), "started without {cap}");
        let err = stderr(&o);
        assert!(err.contains(cap) && err.contains("--strict-backend"), "{cap}: {err}");
    }
}

/// The password the fleet's Redis user has in these tests.
const FLEET_PASSWORD: &str = "fleet-unit-test-password";

/// Debian's redis-server in `ns`, TLS only on 127.0.0.1:6380 as the units
/// expect it (its certificate signed by a CA made here, handed to the units
/// as their `redis-ca` credential), with the shipped ACL file (the test's
/// password hashed in), so the units' commands run against the very
/// permissions an installation gives them.
fn fleet_redis(ns: &NetNsGuard, install: &Install) -> Running {
    let ca = reflector_registry::testing::TestCa::new("fleet unit test CA");
    ca.write(&install.dir.join("credentials/redis-ca"));
    let (cert, key) = (install.dir.join("redis.pem"), install.dir.join("redis-key.pem"));
    ca.issue(&["127.0.0.1", "redis.internal"], &cert, &key);
    let acl = std::fs::read_to_string(repo_file("deploy/redis/fleet.acl"))
        .unwrap()
        .replace("PASSWORD_SHA256", &sha256_hex(FLEET_PASSWORD));
    let acl_path = install.dir.join("fleet.acl");
    std::fs::write(&acl_path, acl).unwrap();
    let child = ns
        .command("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            "6380",
            "--tls-auth-clients",
            "no",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(install.dir.join("credentials/redis-ca"))
        .arg("--dir")
        .arg(&install.dir)
        .arg("--aclfile")
        .arg(&acl_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server runs (make deps installs it)");
    let redis = Running(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ns.run(|| TcpStream::connect("127.0.0.1:6380").is_ok()) {
        assert!(Instant::now() < deadline, "redis-server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    redis
}

/// `redis-cli` in `ns` as the fleet's user, over TLS: what it printed.
fn fleet_redis_cli(ns: &NetNsGuard, install: &Install, args: &[&str]) -> String {
    let o = ns
        .command("redis-cli")
        .args(["-p", "6380", "--tls", "--cacert"])
        .arg(install.dir.join("credentials/redis-ca"))
        .args(["--no-auth-warning", "--user", "fleet", "--pass", FLEET_PASSWORD])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// SHA-256 in hex, for the ACL file's password hash, as its README says
/// to make it (`sha256sum`).
fn sha256_hex(s: &str) -> String {
    let o = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(s.as_bytes())?;
            c.wait_with_output()
        })
        .expect("sha256sum runs (coreutils)");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_fleet_units_register_through_the_shipped_acl_with_only_their_capabilities() {
    if !root_or_skip("the_fleet_units_register_through_the_shipped_acl_with_only_their_capabilities") {
        return;
    }
    let install = Install::new("fleet");
    let (rpath, rsettings) = localized(&install, "reflector-fleet.service");
    let (cpath, csettings) = localized(&install, "reflector-control-fleet.service");
    verify(&rpath);
    verify(&cpath);
    // The drain fits in the stop timeout.
    assert!(setting(&rsettings, "ExecStart").contains("--drain-timeout 30s"));
    assert_eq!(setting(&rsettings, "TimeoutStopSec"), "40");
    let ns = NetNsGuard::new("lpf");
    let _redis = fleet_redis(&ns, &install);
    let mut reflector = Running(
        as_unit(&ns, &rsettings, true, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut control = Running(
        as_unit(&ns, &csettings, true, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The reflector registered and the control server placed the world's
    // cells on it, both as the ACL's user.
    // A reflector registering with a Redis just started waits two TTLs
    // (6 s at the unit's 3 s) so live ones re-register first.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cells = fleet_redis_cli(&ns, &install, &["HVALS", "reflector:cells"]);
        if cells.lines().count() == 64 && cells.lines().all(|l| l.starts_with("1:")) {
            break;
        }
        for (name, c) in [("reflector", &mut reflector), ("control", &mut control)] {
            if let Some(status) = c.0.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(c.0.stderr.as_mut().unwrap(), &mut err).unwrap();
                panic!("the {name} unit's command exited ({status}): {err}");
            }
        }
        assert!(Instant::now() < deadline, "cells not placed: {cells}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(fleet_redis_cli(&ns, &install, &["GET", "reflector:reflector:1"]).contains("\"draining\":false"));
    // SIGTERM: no members, so the drain ends at once and the entry goes.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(reflector.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = reflector.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the drained reflector did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
    assert_eq!(
        fleet_redis_cli(&ns, &install, &["GET", "reflector:reflector:1"]).trim(),
        "",
        "deregistered"
    );
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_control_unit_verifies_and_listens_on_443_with_only_its_capability() {
    if !root_or_skip("the_control_unit_verifies_and_listens_on_443_with_only_its_capability") {
        return;
    }
    let install = Install::new("control");
    let (path, settings) = localized(&install, "reflector-control.service");
    verify(&path);
    assert_eq!(setting(&settings, "CapabilityBoundingSet"), "CAP_NET_BIND_SERVICE");
    let ns = NetNsGuard::new("lpc");

    let mut child = Running(
        as_unit(&ns, &settings, true, &[])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if ns.run(|| TcpStream::connect_timeout(&"127.0.0.1:443".parse().unwrap(), Duration::from_millis(200)).is_ok())
        {
            break;
        }
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.0.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("the control server exited ({status}) instead of listening: {err}");
        }
        assert!(Instant::now() < deadline, "the control server never listened on 443");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM, as systemd stops it: gone well within TimeoutStopSec.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    drop(child);

    let o = as_unit(&ns, &settings, false, &[]).output().unwrap();
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("CAP_NET_BIND_SERVICE: --listen port 443"), "{err}");
}
