//! Sealed groups through the binaries: `reflector control` with a sealing
//! secret hands out epoch keys in `/join` and by `/keys`, the reflector
//! started with `--data-sealed on` announces the group as sealed to the
//! player that joins with the granted token, and the control server's
//! `/metrics` counts what `/keys` did.

mod support;

use reflector_proto::client::{Config, JoinRequest};
use reflector_proto::control::{KeyedGrant, KeysAnswer};
use reflector_proto::protocol::SessionKeys;
use reflector_proto::sealed::{self, CellId, Schedule, WorldId};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const TOKEN_SECRET: [u8; 32] = [0x42; 32];
const MASTER: [u8; 32] = [0x6d; 32];
const WORLD: &str = "sealed test world";

/// `reflector control` with a sealing secret, mapping a 2x2 world onto
/// `group` of reflector 0 (every cell on it); its HTTP port.
fn start_control(dir: &Path, group: u16) -> (Proc, u16) {
    let port = free_port();
    let log = dir.join("control.log");
    let mut p = Proc(
        Command::new(env!("CARGO_BIN_EXE_reflector"))
            .args(["control", "--anonymous-joins", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--secret-file", dir.join("secret").to_str().unwrap()])
            .args(["--reflector", &format!("127.0.0.1:{group}"), "--grid", "2x2"])
            .args(["--sealing-secret-file", dir.join("sealing").to_str().unwrap()])
            .args(["--world", WORLD])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("the reflector binary runs"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if !p.alive() || Instant::now() >= deadline {
            panic!(
                "reflector control did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (p, port)
}

fn scratch() -> Scratch {
    let dir = Scratch::new("sealing");
    std::fs::write(dir.0.join("secret"), hex(&TOKEN_SECRET)).unwrap();
    std::fs::write(dir.0.join("sealing"), hex(&MASTER)).unwrap();
    dir
}

#[test]
fn a_sealed_group_end_to_end_through_the_binaries() {
    let dir = scratch();
    let (_serve, group, _metrics) = start_serve(&dir.0.join("secret"), &["--data-sealed", "on"]);
    let (_control, port) = start_control(&dir.0, group);

    // The grant carries the key of each of the four cells, derived as the
    // document says.
    let (status, body) = get_status(port, "/join?player=7&x=150&y=50");
    assert_eq!(status, 200, "{body}");
    let grant: KeyedGrant = serde_json::from_str(&body).unwrap();
    assert_eq!(grant.grant.group, group);
    let master = sealed::MasterSecret::new(&MASTER).unwrap();
    let schedule = Schedule::new(600, 60).unwrap();
    let cells: Vec<[u32; 2]> = grant.keys.iter().map(|k| k.cell).collect();
    assert!(cells.len() >= 4 && cells.len() <= 8, "{cells:?}");
    for want in [[0, 0], [1, 0], [0, 1], [1, 1]] {
        assert!(cells.contains(&want), "{want:?} in {cells:?}");
    }
    for k in &grant.keys {
        let c = CellId::new(WorldId::from_name(WORLD), k.cell[0], k.cell[1]).unwrap();
        assert_eq!(k.key, hex(master.epoch_key(c, k.epoch).as_bytes()), "{k:?}");
        assert_eq!(k.ends_unix_s, schedule.start(&master, c, k.epoch + 1), "{k:?}");
    }

    // The player joins with the granted token: the reflector says sealed.
    let token: [u8; 32] = hex_to(&grant.grant.token);
    let keys = SessionKeys::from_session(hex_to(&grant.grant.session_key));
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let req = JoinRequest {
        reflector: SocketAddr::from(([127, 0, 0, 1], group)),
        group,
        player: 7,
        token,
        keys,
        first_seq: 1,
    };
    let cfg = Config {
        retry: Duration::from_millis(200),
        give_up: Some(Duration::from_secs(3)),
    };
    let (_, ack) = reflector_proto::blocking::join(&sock, req, cfg).expect("admitted");
    assert_eq!(sealed::group_is_sealed(ack.flags), Ok(true), "flags {:#04x}", ack.flags);

    // `/keys` with the session key's MAC gives the same keys, without a ticket.
    let at = unix_s();
    let mac = sealed::keys_request_mac(&keys, &token, at);
    let (status, body) = get_status(
        port,
        &format!("/keys?token={}&at={at}&mac={}", grant.grant.token, hex(&mac)),
    );
    assert_eq!(status, 200, "{body}");
    let answer: KeysAnswer = serde_json::from_str(&body).unwrap();
    assert_eq!((answer.player, answer.group), (7, group));
    let epochs = |ks: &[reflector_proto::control::EpochKeyGrant]| -> Vec<([u32; 2], u32)> {
        ks.iter().map(|k| (k.cell, k.epoch)).collect()
    };
    // The overlap window may have opened between the two requests.
    if epochs(&answer.keys) == epochs(&grant.keys) {
        assert_eq!(answer.keys, grant.keys);
    } else {
        assert!(answer.keys.len() > grant.keys.len(), "{answer:?}");
    }
    // A MAC under another key is refused.
    let (status, body) = get_status(
        port,
        &format!("/keys?token={}&at={at}&mac={}", grant.grant.token, hex(&[0u8; 16])),
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"error\""), "{body}");
    let metrics = get(port, "/metrics");
    for (series, want) in [
        ("reflector_control_keys_requests_total{outcome=\"served\"}", 1),
        ("reflector_control_keys_requests_total{outcome=\"bad_mac\"}", 1),
    ] {
        assert!(metrics.contains(&format!("{series} {want}\n")), "{series}: {metrics}");
    }
}

#[test]
fn the_token_secret_is_refused_as_the_sealing_secret() {
    let dir = scratch();
    std::fs::write(dir.0.join("sealing"), hex(&TOKEN_SECRET)).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(["control", "--anonymous-joins", "--listen", "127.0.0.1:0"])
        .args(["--secret-file", dir.0.join("secret").to_str().unwrap()])
        .args(["--reflector", "127.0.0.1:4000"])
        .args(["--sealing-secret-file", dir.0.join("sealing").to_str().unwrap()])
        .args(["--world", WORLD])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("sealing") && err.contains("token secret"), "{err}");
    // And a sealing secret without a world name is a usage error naming it.
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(["control", "--anonymous-joins", "--listen", "127.0.0.1:0"])
        .args(["--secret-file", dir.0.join("secret").to_str().unwrap()])
        .args(["--reflector", "127.0.0.1:4000"])
        .args(["--sealing-secret-file", dir.0.join("sealing").to_str().unwrap()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--world"), "{err}");
    // A world name without a sealing secret would do nothing: refused too.
    let o = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(["control", "--anonymous-joins", "--listen", "127.0.0.1:0"])
        .args(["--secret-file", dir.0.join("secret").to_str().unwrap()])
        .args(["--reflector", "127.0.0.1:4000", "--world", WORLD])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--sealing-secret-file"), "{err}");
}

fn hex_to<const N: usize>(s: &str) -> [u8; N] {
    let v: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect();
    v.try_into().unwrap()
}
