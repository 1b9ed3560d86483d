//! The in-kernel fan-out (`--backend ebpf`), in namespaces this test makes:
//! the reflector in one, its members in another, a veth between them with
//! checksum offload off on both ends (with it on, a copy would carry only
//! the pseudo-header sum and a wrong incremental fix would go unseen; with
//! it off the receiving kernel verifies every checksum and drops, counting
//! `InCsumErrors`, any copy whose sum is wrong). No fallback is allowed, and
//! every case checks the program's own copy count, so a silent fallback to
//! user space fails it. Needs root.

mod common;
use oskit::testing::{root_or_skip, sh, NetNsGuard};
use reflector::backend::BackendKind;
use reflector::membership::{Keys, Policy};
use reflector::metrics::Snapshot;
use reflector::server::{Server, ServerConfig};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::{ErrorCode, Header, Kind, Packet, SessionKeys, DATA_PAYLOAD, TAG};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: [u8; 32] = [0x44; 32];
const MAC_R: &str = "02:52:46:00:01:01";
const MAC_C: &str = "02:52:46:00:01:02";
const REFLECTOR: [u8; 4] = [10, 203, 0, 1];
const CLIENTS: &str = "10.203.0.2";

/// One test at a time: they share `net.core.netdev_max_backlog`.
static SERIAL: Mutex<()> = Mutex::new(());

/// Two namespaces and a veth, offloads off; removed on drop.
struct Lab {
    r: NetNsGuard,
    c: NetNsGuard,
}

impl Lab {
    fn new() -> Lab {
        let lab = Lab {
            r: NetNsGuard::new("kfr"),
            c: NetNsGuard::new("kfc"),
        };
        let (r, c) = (lab.r.name(), lab.c.name());
        sh(&[
            "ip", "link", "add", "vr", "address", MAC_R, "netns", r, "type", "veth", "peer", "name", "vc", "address",
            MAC_C, "netns", c,
        ]);
        for (ns, dev, ip) in [(r, "vr", "10.203.0.1/24"), (c, "vc", "10.203.0.2/24")] {
            sh(&["ip", "-n", ns, "addr", "add", ip, "dev", dev]);
            sh(&["ip", "-n", ns, "link", "set", dev, "up"]);
            sh(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off", "rx", "off",
            ]);
        }
        lab
    }
}

/// Raises `net.core.netdev_max_backlog` (initial namespace only) for the
/// test and restores it: every clone waits in that per-CPU queue.
struct Backlog(String);

const BACKLOG: &str = "/proc/sys/net/core/netdev_max_backlog";

impl Backlog {
    fn raise(to: u32) -> Backlog {
        let old = std::fs::read_to_string(BACKLOG).expect("netdev_max_backlog is readable in the initial namespace");
        std::fs::write(BACKLOG, to.to_string()).expect("root may raise netdev_max_backlog");
        Backlog(old.trim().to_string())
    }
}

impl Drop for Backlog {
    fn drop(&mut self) {
        let _ = std::fs::write(BACKLOG, &self.0);
    }
}

fn start(lab: &Lab, policy: Policy, stop: &Arc<AtomicBool>) -> Server {
    let stop = Arc::clone(stop);
    lab.r.run(move || {
        let cfg = ServerConfig {
            bind: REFLECTOR.into(),
            ports: vec![0],
            keys: Keys {
                token_secret: Secret::new(&SECRET).unwrap().into(),
                reflector_id: 0,
                cookie_key: Secret::random(),
            },
            policy,
            backend: BackendKind::Ebpf,
            fallback: false,
            threads: 1,
            rcvbuf: 1 << 20,
            sndbuf: 1 << 20,
            group_tags: Vec::new(),
            group_instance: Vec::new(),
            checkpoint: None,
        };
        Server::start(cfg, stop).expect("the eBPF backend starts, with no fallback")
    })
}

fn sockets(lab: &Lab, n: usize) -> Vec<UdpSocket> {
    lab.c.run(move || {
        (0..n)
            .map(|_| {
                let s = UdpSocket::bind(format!("{CLIENTS}:0")).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(2 << 20));
                s
            })
            .collect()
    })
}

fn token(group: u16, player: u32) -> JoinRequest {
    let secret = Secret::new(&SECRET).unwrap();
    let t = TokenClaims {
        player,
        reflector: 0,
        group,
        expires_unix_s: reflector::unix_now_ms() / 1000 + 120,
    }
    .sign(&secret);
    JoinRequest {
        reflector: SocketAddr::from((REFLECTOR, group)),
        group,
        player,
        token: t,
        keys: SessionKeys::derive(&secret, &t),
        first_seq: 1,
    }
}

fn join(sock: &UdpSocket, group: u16, player: u32) -> Session {
    sock.set_nonblocking(false).unwrap();
    let cfg = ClientConfig {
        give_up: Some(Duration::from_secs(5)),
        ..ClientConfig::default()
    };
    let s = blocking::join(sock, token(group, player), cfg)
        .expect("the reflector admits us")
        .0;
    sock.set_nonblocking(true).unwrap();
    s
}

/// What every receiver must get for one DATA: its bytes, tag zeroed.
fn data(session: &mut Session, player: u32, seq_note: u32, len: usize) -> (Vec<u8>, Vec<u8>) {
    let mut b = vec![0u8; len];
    for (k, x) in b.iter_mut().enumerate().skip(DATA_PAYLOAD) {
        *x = (player as usize * 31 + seq_note as usize * 7 + k) as u8;
    }
    let n = session.seal_data(len - DATA_PAYLOAD, &mut b).unwrap().unwrap();
    b.truncate(n);
    let mut want = b.clone();
    want[TAG].fill(0);
    (b, want)
}

/// Copies received, checked byte for byte against `expected` and for
/// their source; returns how many each socket got.
fn drain(
    socks: &[UdpSocket],
    from: SocketAddr,
    expected: &HashMap<(u32, u64), Vec<u8>>,
    got: &mut [u64],
    per_sender: &mut HashMap<(usize, u32), u64>,
) {
    let mut buf = [0u8; 2048];
    for (i, s) in socks.iter().enumerate() {
        while let Ok((n, src)) = s.recv_from(&mut buf) {
            let p = Packet::parse(&buf[..n]).expect("a copy parses");
            if p.kind() != Kind::Data {
                continue; // PROBEs and the like
            }
            assert_eq!(src, from, "a copy comes from the group's address and port");
            let want = expected
                .get(&(p.sender(), p.seq()))
                .unwrap_or_else(|| panic!("an unexpected DATA {}#{}", p.sender(), p.seq()));
            assert_eq!(&buf[..n], &want[..], "a copy's bytes differ from what was sent");
            got[i] += 1;
            *per_sender.entry((i, p.sender())).or_default() += 1;
        }
    }
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn counters(server: &Server) -> Snapshot {
    server.registry().groups[0].1.snapshot()
}

fn csum_errors(lab: &Lab) -> u64 {
    csum_errors_in(&lab.c)
}

/// N members each send M DATA; every other member gets each exactly once,
/// byte for byte, with valid checksums, and the program made every copy.
fn exact_delivery(n: usize, m: u32, len: usize) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let _backlog = Backlog::raise(20_000);
    let lab = Lab::new();
    let stop = Arc::new(AtomicBool::new(false));
    // All members share one address here.
    let policy = Policy {
        max_per_ip: n,
        ..Policy::default()
    };
    let server = start(&lab, policy, &stop);
    let group = server.ports()[0];
    let from = SocketAddr::from((REFLECTOR, group));
    let socks = sockets(&lab, n);
    let mut sessions: Vec<Session> = socks
        .iter()
        .enumerate()
        .map(|(i, s)| join(s, group, i as u32 + 1))
        .collect();
    // Every member is in the kernel's list before traffic starts.
    wait_for("all members", 5, || counters(&server).members == n as u64);
    let mut expected = HashMap::new();
    let mut got = vec![0u64; n];
    let mut per_sender = HashMap::new();
    for round in 0..m {
        for (i, s) in socks.iter().enumerate() {
            let (bytes, want) = data(&mut sessions[i], i as u32 + 1, round, len);
            let p = Packet::parse(&want[..]).unwrap();
            expected.insert((p.sender(), p.seq()), want);
            s.send_to(&bytes, from).unwrap();
            if i % 16 == 15 {
                drain(&socks, from, &expected, &mut got, &mut per_sender);
            }
        }
        drain(&socks, from, &expected, &mut got, &mut per_sender);
    }
    let want_each = (n as u64 - 1) * u64::from(m);
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.iter().any(|&g| g < want_each) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        drain(&socks, from, &expected, &mut got, &mut per_sender);
    }
    std::thread::sleep(Duration::from_millis(100));
    drain(&socks, from, &expected, &mut got, &mut per_sender);
    assert!(
        got.iter().all(|&g| g == want_each),
        "each member gets {want_each}: {got:?}"
    );
    for i in 0..n {
        for p in 1..=n as u32 {
            let k = per_sender.get(&(i, p)).copied().unwrap_or(0);
            let want = if p as usize == i + 1 { 0 } else { u64::from(m) };
            assert_eq!(k, want, "member {i} got {k} copies of player {p}'s DATA");
        }
    }
    assert_eq!(csum_errors(&lab), 0, "no copy had a wrong checksum");
    let total = n as u64 * u64::from(m);
    wait_for("the kernel's counters", 5, || {
        counters(&server).kernel_copies == total * (n as u64 - 1)
    });
    let c = counters(&server);
    assert_eq!(c.kernel_forwarded, total, "{c:?}");
    assert_eq!((c.forwarded, c.fanned_out), (total, total * (n as u64 - 1)), "{c:?}");
    assert_eq!((c.kernel_clone_errors, c.bad_tag, c.replays), (0, 0, 0), "{c:?}");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

#[test]
fn exact_delivery_small_group() {
    if !root_or_skip("exact_delivery_small_group") {
        return;
    }
    exact_delivery(4, 25, 100);
}

#[test]
fn exact_delivery_256_members() {
    if !root_or_skip("exact_delivery_256_members") {
        return;
    }
    // Sizes that exercise an odd tail in the tag's SipHash.
    exact_delivery(256, 2, 77);
}

/// What the program leaves to user space, and what it tells it: a
/// non-member's DATA reaches the reflector and gets ERROR(NotMember); a
/// member that sends only tagged DATA (no KEEPALIVE) stays a member past the
/// timeout, counted by the kernel; a silent one is expired; a replayed DATA
/// is dropped in the kernel; a leave and a join during traffic are seen by
/// the very next datagram.
#[test]
fn pass_up_liveness_and_changes() {
    if !root_or_skip("pass_up_liveness_and_changes") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let stop = Arc::new(AtomicBool::new(false));
    let policy = Policy {
        member_timeout_ms: 1_000,
        keepalive_ms: 250,
        ..Policy::default()
    };
    let server = start(&lab, policy, &stop);
    let group = server.ports()[0];
    let from = SocketAddr::from((REFLECTOR, group));
    // Members 0..4 talk, 4 stays silent, 5 is a stranger, 6 joins later.
    let socks = sockets(&lab, 7);
    let mut sessions: Vec<Session> = (0..5).map(|i| join(&socks[i], group, i as u32 + 1)).collect();
    wait_for("five members", 5, || counters(&server).members == 5);

    // A stranger's DATA: well formed, tagged under a key of its own.
    let keys = SessionKeys::derive(&Secret::new(&SECRET).unwrap(), &[9; 32]);
    let h = Header {
        kind: Kind::Data,
        group,
        sender: 99,
        membership: 7,
        seq: 1,
    };
    let mut b = [0u8; 64];
    let len = reflector_proto::protocol::emit(&h, &[1; 32], Some(&keys), &mut b).unwrap();
    socks[5].send_to(&b[..len], from).unwrap();
    socks[5].set_nonblocking(false).unwrap();
    socks[5].set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut r = [0u8; 128];
    let (k, src) = socks[5].recv_from(&mut r).expect("a non-member gets an answer");
    let e = Packet::parse(&r[..k]).unwrap();
    assert_eq!((src, e.kind()), (from, Kind::Error));
    assert_eq!(e.error_code(), Some(Ok(ErrorCode::NotMember)));
    socks[5].set_nonblocking(true).unwrap();

    // Members 0..4 send only DATA for 2.5 timeouts; member 4 sends nothing.
    let mut expected = HashMap::new();
    let mut got = vec![0u64; 7];
    let mut per_sender = HashMap::new();
    let t0 = Instant::now();
    let mut round = 0u32;
    let mut replay = None;
    while t0.elapsed() < Duration::from_millis(2_500) {
        for i in 0..4 {
            let (bytes, want) = data(&mut sessions[i], i as u32 + 1, round, 60);
            let p = Packet::parse(&want[..]).unwrap();
            expected.insert((p.sender(), p.seq()), want);
            socks[i].send_to(&bytes, from).unwrap();
            if replay.is_none() {
                replay = Some((i, bytes));
            }
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(100));
        drain(&socks, from, &expected, &mut got, &mut per_sender);
    }
    wait_for("the silent member's expiry", 3, || counters(&server).expired == 1);
    let c = counters(&server);
    assert_eq!(c.members, 4, "members that send only tagged DATA stay: {c:?}");
    assert_eq!(c.dropped_non_member, 1, "{c:?}");
    assert!(c.kernel_passed_up >= 1, "the stranger's DATA went up: {c:?}");
    // The silent member got everything until it was expired, then nothing
    // more; the talkers got every other talker's DATA.
    drain(&socks, from, &expected, &mut got, &mut per_sender);
    let sent = u64::from(round);
    for (i, g) in got.iter().take(4).enumerate() {
        assert_eq!(*g, 3 * sent, "talker {i}");
    }
    assert!(got[4] < 4 * sent, "the expired member stopped receiving: {got:?}");

    // A replay of the first DATA is dropped by the program.
    let (ri, rbytes) = replay.unwrap();
    socks[ri].send_to(&rbytes, from).unwrap();
    wait_for("the replay counted", 3, || counters(&server).replays == 1);

    // Member 3 leaves; member 6 joins; the next DATA of member 0 reaches
    // 1, 2 and 6 only.
    let tx = sessions[3].leave().expect("a member can leave");
    socks[3].send_to(tx.datagram.as_bytes(), tx.to).unwrap();
    wait_for("the leave", 3, || counters(&server).members == 3);
    let _s6 = join(&socks[6], group, 7);
    wait_for("the join", 3, || counters(&server).members == 4);
    let before = got.clone();
    let (bytes, want) = data(&mut sessions[0], 1, round, 60);
    let p = Packet::parse(&want[..]).unwrap();
    expected.insert((p.sender(), p.seq()), want);
    socks[0].send_to(&bytes, from).unwrap();
    wait_for("the copies", 3, || {
        drain(&socks, from, &expected, &mut got, &mut per_sender);
        got[1] > before[1] && got[2] > before[2] && got[6] > before[6]
    });
    std::thread::sleep(Duration::from_millis(100));
    drain(&socks, from, &expected, &mut got, &mut per_sender);
    let delta: Vec<u64> = got.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(delta, vec![0, 1, 1, 0, 0, 0, 1], "one copy each to 1, 2 and the joiner");
    let c = counters(&server);
    wait_for("the kernel's counters", 3, || {
        counters(&server).kernel_forwarded == 4 * sent + 1
    });
    assert_eq!(c.bad_tag, 0, "{c:?}");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

/// Programs of ours loaded in the kernel now (any namespace: programs are
/// global), by the name the kernel keeps (15 bytes of `reflector_fanout`).
fn our_programs() -> usize {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some("reflector_fanou"))
        .count()
}

/// `reflector serve --backend ebpf` in the lab, stopped by `signal`: the
/// program it loaded is gone right after, with no restart and no sweep
/// (its TCX link and maps belonged to the process's descriptors).
fn nothing_left_after(signal: nix::sys::signal::Signal) {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let secret = std::env::temp_dir().join(format!("reflector-ebpf-secret-{}-{signal}", std::process::id()));
    std::fs::write(&secret, hex::encode(SECRET)).unwrap();
    let before = our_programs();
    let mut child = std::process::Command::new("ip")
        .args(["netns", "exec", lab.r.name(), env!("CARGO_BIN_EXE_reflector"), "serve"])
        .args([
            "--bind",
            "10.203.0.1",
            "--ports",
            "4000",
            "--backend",
            "ebpf",
            "--strict-backend",
        ])
        .arg("--secret-file")
        .arg(&secret)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for("the program loaded", 10, || our_programs() > before);
    // `ip netns exec` execs the reflector: the child is the reflector.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).unwrap();
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&secret);
    wait_for("the program gone", 5, || our_programs() == before);
    if signal == nix::sys::signal::Signal::SIGINT {
        assert!(status.success(), "Ctrl-C is a clean exit: {status}");
    }
}

#[test]
fn nothing_left_after_ctrl_c() {
    if !root_or_skip("nothing_left_after_ctrl_c") {
        return;
    }
    nothing_left_after(nix::sys::signal::Signal::SIGINT);
}

#[test]
fn nothing_left_after_kill_9() {
    if !root_or_skip("nothing_left_after_kill_9") {
        return;
    }
    nothing_left_after(nix::sys::signal::Signal::SIGKILL);
}

/// No datagram lost at the sender in the kernel path (paper 000 §4.2): the
/// reflector's veth egress is a token bucket far slower than the fan-out
/// with a tiny queue, so clones are refused; each refused copy goes up the
/// ring buffer and is resent from user space, waiting out ENOBUFS, and
/// every member still receives every datagram.
#[test]
fn no_loss_on_a_full_device_queue() {
    if !root_or_skip("no_loss_on_a_full_device_queue") {
        return;
    }
    const RECEIVERS: usize = 20;
    const SENT: u32 = 300;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    sh(&[
        "tc",
        "-n",
        lab.r.name(),
        "qdisc",
        "add",
        "dev",
        "vr",
        "root",
        "tbf",
        "rate",
        "20mbit",
        "burst",
        "3000",
        "limit",
        "3000",
    ]);
    let stop = Arc::new(AtomicBool::new(false));
    let policy = Policy {
        max_per_ip: RECEIVERS + 1,
        ..Policy::default()
    };
    let server = start(&lab, policy, &stop);
    let group = server.ports()[0];
    let from = SocketAddr::from((REFLECTOR, group));
    let socks = sockets(&lab, RECEIVERS + 1);
    let mut sessions: Vec<Session> = socks
        .iter()
        .enumerate()
        .map(|(i, s)| join(s, group, i as u32 + 1))
        .collect();
    wait_for("all members", 5, || counters(&server).members == RECEIVERS as u64 + 1);
    let (sender, receivers) = socks.split_first().unwrap();
    let counts = common::count_data(receivers, SENT, Duration::from_secs(30));
    for seq in 0..SENT {
        let (bytes, _) = data(&mut sessions[0], 1, seq, 100);
        sender.send_to(&bytes, from).unwrap();
        if seq % 20 == 19 {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let got: Vec<u32> = counts.into_iter().map(|h| h.join().unwrap()).collect();
    let all = u64::from(SENT) * RECEIVERS as u64;
    wait_for("the kernel's counters", 5, || {
        let c = counters(&server);
        c.forwarded == u64::from(SENT) && c.fanned_out == all && c.kernel_resent == c.kernel_clone_errors
    });
    let c = counters(&server);
    assert!(got.iter().all(|&g| g == SENT), "receivers got {got:?} of {SENT}: {c:?}");
    // The program met a full queue, handed the refused copies up, and the
    // group went on in user space while the queue was full (back-pressure).
    assert!(
        c.kernel_clone_errors > 0 && c.kernel_forwarded > 0,
        "the device queue never refused a clone; the test proves nothing ({c:?})"
    );
    assert_eq!(c.send_errors, 0, "{c:?}");
    assert!(c.enobufs_waits > 0, "sends waited out the full queue: {c:?}");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

/// Members behind two devices, one group of them behind a router (paper
/// 000 §4.2: members may sit behind different devices and next hops): the
/// program sends each copy out of the member's own device, to its next
/// hop's MAC, from the address the group's socket (bound to any address)
/// would use towards it; and when the router's MAC changes, the reflector
/// follows the neighbour entry and delivery resumes within a few sweeps.
#[test]
fn members_behind_other_devices_and_a_router() {
    if !root_or_skip("members_behind_other_devices_and_a_router") {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let r = NetNsGuard::new("kfr");
    let c1 = NetNsGuard::new("kfa");
    let gw = NetNsGuard::new("kfg");
    let c2 = NetNsGuard::new("kfb");
    let links = [
        (&r, "vr1", "10.204.1.1/24", &c1, "vc1", "10.204.1.2/24"),
        (&r, "vr2", "10.204.2.1/24", &gw, "vg1", "10.204.2.2/24"),
        (&gw, "vg2", "10.204.3.1/24", &c2, "vc2", "10.204.3.2/24"),
    ];
    for (a, da, ipa, b, db, ipb) in links {
        sh(&[
            "ip",
            "link",
            "add",
            da,
            "netns",
            a.name(),
            "type",
            "veth",
            "peer",
            "name",
            db,
            "netns",
            b.name(),
        ]);
        for (ns, dev, ip) in [(a, da, ipa), (b, db, ipb)] {
            sh(&["ip", "-n", ns.name(), "addr", "add", ip, "dev", dev]);
            sh(&["ip", "-n", ns.name(), "link", "set", dev, "up"]);
            sh(&[
                "ip",
                "netns",
                "exec",
                ns.name(),
                "ethtool",
                "-K",
                dev,
                "tx",
                "off",
                "rx",
                "off",
            ]);
        }
    }
    sh(&[
        "ip",
        "-n",
        r.name(),
        "route",
        "add",
        "10.204.3.0/24",
        "via",
        "10.204.2.2",
    ]);
    sh(&["ip", "-n", c2.name(), "route", "add", "default", "via", "10.204.3.1"]);
    sh(&[
        "ip",
        "netns",
        "exec",
        gw.name(),
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);

    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let server = r.run(move || {
        let cfg = ServerConfig {
            bind: [0, 0, 0, 0].into(),
            ports: vec![0],
            keys: Keys {
                token_secret: Secret::new(&SECRET).unwrap().into(),
                reflector_id: 0,
                cookie_key: Secret::random(),
            },
            policy: Policy::default(),
            backend: BackendKind::Ebpf,
            fallback: false,
            threads: 1,
            rcvbuf: 1 << 20,
            sndbuf: 1 << 20,
            group_tags: Vec::new(),
            group_instance: Vec::new(),
            checkpoint: None,
        };
        Server::start(cfg, stop2).expect("the eBPF backend starts, with no fallback")
    });
    let group = server.ports()[0];
    // Each side talks to the reflector address it reaches directly, and
    // every copy must come from that address.
    let sides: [(&NetNsGuard, &str, [u8; 4]); 2] = [
        (&c1, "10.204.1.2", [10, 204, 1, 1]),
        (&c2, "10.204.3.2", [10, 204, 2, 1]),
    ];
    let mut socks = Vec::new();
    let mut froms = Vec::new();
    let mut sessions = Vec::new();
    for (k, (ns, ip, refl)) in sides.into_iter().enumerate() {
        let ip = ip.to_string();
        let ss: Vec<UdpSocket> = ns.run(move || {
            (0..3)
                .map(|_| {
                    let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
                    s.set_nonblocking(true).unwrap();
                    s
                })
                .collect()
        });
        for (j, s) in ss.iter().enumerate() {
            let mut req = token(group, (k * 3 + j) as u32 + 1);
            req.reflector = SocketAddr::from((refl, group));
            s.set_nonblocking(false).unwrap();
            let cfg = ClientConfig {
                give_up: Some(Duration::from_secs(5)),
                ..ClientConfig::default()
            };
            sessions.push(blocking::join(s, req, cfg).expect("the reflector admits us").0);
            s.set_nonblocking(true).unwrap();
            froms.push(SocketAddr::from((refl, group)));
        }
        socks.extend(ss);
    }
    wait_for("six members", 5, || counters(&server).members == 6);

    let mut expected = HashMap::new();
    let mut got = vec![0u64; 6];
    let mut per_sender = HashMap::new();
    let mut drain_all = |expected: &HashMap<(u32, u64), Vec<u8>>, got: &mut Vec<u64>| {
        for (i, s) in socks.iter().enumerate() {
            let mut one = [0u64];
            drain(std::slice::from_ref(s), froms[i], expected, &mut one, &mut per_sender);
            got[i] += one[0];
        }
    };
    const ROUNDS: u32 = 10;
    for round in 0..ROUNDS {
        for (i, s) in socks.iter().enumerate() {
            let (bytes, want) = data(&mut sessions[i], i as u32 + 1, round, 90);
            let p = Packet::parse(&want[..]).unwrap();
            expected.insert((p.sender(), p.seq()), want);
            s.send_to(&bytes, froms[i]).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        drain_all(&expected, &mut got);
    }
    wait_for("every copy", 5, || {
        drain_all(&expected, &mut got);
        got.iter().all(|&g| g >= 5 * u64::from(ROUNDS))
    });
    assert_eq!(
        got,
        vec![5 * u64::from(ROUNDS); 6],
        "each member gets every other member's DATA once"
    );
    assert_eq!(
        csum_errors_in(&c1) + csum_errors_in(&c2),
        0,
        "no copy had a wrong checksum"
    );
    wait_for("the kernel's counters", 5, || {
        counters(&server).kernel_copies == 6 * 5 * u64::from(ROUNDS)
    });

    // The router's MAC changes; the reflector learns it from the neighbour
    // table (set here as an ARP update would) and copies reach C2 again.
    sh(&[
        "ip",
        "-n",
        gw.name(),
        "link",
        "set",
        "vg1",
        "address",
        "02:52:46:00:02:99",
    ]);
    sh(&[
        "ip",
        "-n",
        r.name(),
        "neigh",
        "replace",
        "10.204.2.2",
        "lladdr",
        "02:52:46:00:02:99",
        "dev",
        "vr2",
    ]);
    let before = got[3];
    let mut round = ROUNDS;
    wait_for("delivery through the router again", 5, || {
        let (bytes, want) = data(&mut sessions[0], 1, round, 90);
        round += 1;
        let p = Packet::parse(&want[..]).unwrap();
        expected.insert((p.sender(), p.seq()), want);
        socks[0].send_to(&bytes, froms[0]).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drain_all(&expected, &mut got);
        got[3] > before
    });
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

fn csum_errors_in(ns: &NetNsGuard) -> u64 {
    ns.run(|| {
        let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").unwrap();
        let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
        let names: Vec<&str> = udp[0].split_whitespace().collect();
        let values: Vec<&str> = udp[1].split_whitespace().collect();
        let i = names.iter().position(|n| *n == "InCsumErrors").unwrap();
        values[i].parse().unwrap()
    })
}

/// The per-member rate cap in the kernel path: a member that floods has
/// its own DATA beyond the cap dropped (and counted) in the kernel, while
/// every other member's DATA still reaches everyone.
#[test]
fn a_flooding_member_is_capped_in_the_kernel() {
    if !root_or_skip("a_flooding_member_is_capped_in_the_kernel") {
        return;
    }
    const CAP: u32 = 50;
    const FLOOD: u32 = 200;
    const QUIET: u32 = 20;
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let lab = Lab::new();
    let stop = Arc::new(AtomicBool::new(false));
    let policy = Policy {
        member_pps: CAP,
        member_bytes_per_s: 0,
        ..Policy::default()
    };
    let server = start(&lab, policy, &stop);
    let group = server.ports()[0];
    let from = SocketAddr::from((REFLECTOR, group));
    let socks = sockets(&lab, 4);
    let mut sessions: Vec<Session> = (0..4).map(|i| join(&socks[i], group, i as u32 + 1)).collect();
    wait_for("four members", 5, || counters(&server).members == 4);
    let mut expected = HashMap::new();
    let mut got = vec![0u64; 4];
    let mut per_sender = HashMap::new();
    let t0 = Instant::now();
    for k in 0..FLOOD {
        let (bytes, want) = data(&mut sessions[0], 1, k, 64);
        let p = Packet::parse(&want[..]).unwrap();
        expected.insert((p.sender(), p.seq()), want);
        socks[0].send_to(&bytes, from).unwrap();
        if k % 16 == 15 {
            drain(&socks, from, &expected, &mut got, &mut per_sender);
        }
    }
    let flood_secs = t0.elapsed().as_secs_f64();
    for k in 0..QUIET {
        let (bytes, want) = data(&mut sessions[1], 2, k, 64);
        let p = Packet::parse(&want[..]).unwrap();
        expected.insert((p.sender(), p.seq()), want);
        socks[1].send_to(&bytes, from).unwrap();
        std::thread::sleep(Duration::from_millis(25));
        drain(&socks, from, &expected, &mut got, &mut per_sender);
    }
    wait_for("the kernel's counters", 5, || {
        let c = counters(&server);
        c.kernel_forwarded + c.rate_limited == u64::from(FLOOD + QUIET)
    });
    std::thread::sleep(Duration::from_millis(50));
    drain(&socks, from, &expected, &mut got, &mut per_sender);
    let c = counters(&server);
    let passed = c.kernel_forwarded - u64::from(QUIET);
    // A full bucket (one second's worth) plus what refilled while flooding.
    let most = u64::from(CAP) + (flood_secs * f64::from(CAP)).ceil() as u64 + 1;
    assert!(
        (u64::from(CAP)..=most).contains(&passed),
        "{passed} of the flood passed, not {CAP}..={most}: {c:?}"
    );
    assert_eq!(c.rate_limited, u64::from(FLOOD) - passed, "{c:?}");
    for i in 1..4 {
        assert_eq!(
            per_sender.get(&(i, 1)).copied().unwrap_or(0),
            passed,
            "member {i}: the flood's share"
        );
    }
    for i in [0, 2, 3] {
        assert_eq!(
            per_sender.get(&(i, 2)).copied().unwrap_or(0),
            u64::from(QUIET),
            "member {i} lost the quiet one's DATA"
        );
    }
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}
