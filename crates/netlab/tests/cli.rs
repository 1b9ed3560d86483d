//! The `netlab` command: bad input, running a scenario, clean-up after
//! Ctrl-C and after kill -9. These tests share the machine-wide state
//! directory and `clean`, so they run one at a time.

mod common;
use common::*;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

static SERIAL: Mutex<()> = Mutex::new(());

fn netlab(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_netlab")).args(args).output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn scenario(name: &str, body: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("netlab-test-{}-{name}.toml", std::process::id()));
    std::fs::write(&p, body).unwrap();
    p
}

/// Run ids that a process (by pid) created: they start with its pid in hex.
fn runs_of(pid: u32) -> Vec<String> {
    let p = format!("{}{:x}x", netlab::plan::NS_PREFIX, pid);
    let mut ids: Vec<String> = netlab::netns::our_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&p))
        .filter_map(|n| n[netlab::plan::NS_PREFIX.len()..].split('-').next().map(String::from))
        .collect();
    ids.dedup();
    ids
}

#[test]
fn bad_input_is_named_and_exits_non_zero() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Planning needs no root: these run everywhere.
    let o = netlab(&["plan", "torus:3"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("unknown topology 'torus'"), "{}", text(&o));
    let o = netlab(&["plan", "star:-4"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("topology.hosts = -4"), "{}", text(&o));
    let o = netlab(&["plan", "fattree:5"]);
    assert!(text(&o).contains("even"), "{}", text(&o));
    let o = netlab(&["plan", "pair", "--bw", "500tbit"]);
    assert!(!o.status.success() && text(&o).contains("bw"), "{}", text(&o));
    let o = netlab(&["plan", "pair", "--delay", "-3ms"]);
    assert!(!o.status.success() && text(&o).contains("delay"), "{}", text(&o));
    let o = netlab(&["plan", "pair", "--queue", "-1"]);
    assert!(!o.status.success() && text(&o).contains("queue = -1"), "{}", text(&o));
    let dup = scenario(
        "dup",
        "[topology]\nkind = \"custom\"\nnode = [ { name = \"a\", kind = \"host\" }, { name = \"a\", kind = \"router\" } ]\n",
    );
    let o = netlab(&["plan", dup.to_str().unwrap()]);
    assert!(
        !o.status.success() && text(&o).contains("duplicate node name 'a'"),
        "{}",
        text(&o)
    );
    let o = netlab(&["plan", "star:3"]);
    assert!(o.status.success());
    assert!(text(&o).contains("ip -n netlab-RUN--fabric link add s1 type bridge"));
    let _ = std::fs::remove_file(dup);
}

#[test]
fn not_root_is_refused() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("not_root_is_refused") {
        return;
    }
    // Drop to an unprivileged user to see what a user without root sees.
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
        ])
        .arg(env!("CARGO_BIN_EXE_netlab"))
        .args(["up", "pair"])
        .output();
    let Ok(o) = o else {
        println!("skipping not_root_is_refused: setpriv not available");
        return;
    };
    assert!(!o.status.success());
    assert!(
        text(&o).contains("needs CAP_NET_ADMIN and CAP_SYS_ADMIN (run as root or in a privileged container)"),
        "{}",
        text(&o)
    );
    // Root without CAP_SYS_ADMIN (a container that is not privileged):
    // the capability is named at start.
    let o = Command::new("setpriv")
        .args(["--inh-caps=-sys_admin", "--bounding-set=-sys_admin"])
        .arg(env!("CARGO_BIN_EXE_netlab"))
        .args(["up", "pair"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("this process lacks CAP_SYS_ADMIN"), "{}", text(&o));
}

#[test]
fn run_prints_output_and_removes_everything() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("run_prints_output_and_removes_everything") {
        return;
    }
    let s = scenario(
        "run",
        r#"
        [topology]
        kind = "star"
        hosts = 3
        [link]
        bw = "100mbit"
        delay = "200us"
        [[command]]
        host = "h1"
        cmd = "echo hello from $NETLAB_HOST; ip -br addr show eth0"
        [[command]]
        host = "h3"
        cmd = "echo h3 knows h2 at $NETLAB_IP_h2"
        at = "50ms"
        "#,
    );
    let child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["run", s.to_str().unwrap()])
        .output()
        .unwrap();
    let t = text(&child);
    assert!(child.status.success(), "{t}");
    assert!(t.contains("[h1] hello from h1"), "{t}");
    assert!(t.contains("10.0.0.1/29"), "{t}");
    assert!(t.contains("[h3] h3 knows h2 at 10.0.0.2"), "{t}");
    assert!(t.contains("link delay:"), "the delay backend must be named: {t}");
    let _ = std::fs::remove_file(s);
}

#[test]
fn failing_command_fails_the_run_and_removes_the_lab() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("failing_command_fails_the_run_and_removes_the_lab") {
        return;
    }
    let s = scenario(
        "fail",
        "[topology]\nkind = \"pair\"\n[[command]]\nhost = \"h2\"\ncmd = \"echo broken >&2; exit 3\"\n",
    );
    let child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["run", s.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(runs_of(pid).is_empty(), "namespaces left after a failed command");
    let o = netlab(&["run", s.to_str().unwrap()]);
    let t = text(&o);
    assert!(
        t.contains("command in host 'h2' failed (exit 3)") && t.contains("broken"),
        "{t}"
    );
    let _ = std::fs::remove_file(s);
}

/// Starts `netlab run` on `topology` plus a `sleep 30` in h1, and returns
/// once the sleep runs there: the child, its run id and the scenario file.
fn run_sleeping(tag: &str, topology: &str) -> (std::process::Child, String, std::path::PathBuf) {
    let s = scenario(
        tag,
        &format!("{topology}[[command]]\nhost = \"h1\"\ncmd = \"sleep 30\"\n"),
    );
    let child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["run", s.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let run = wait_for("lab up", Duration::from_secs(20), || runs_of(pid).into_iter().next());
    wait_for("sleep in h1 of a running lab", Duration::from_secs(20), || {
        let ns = netlab::plan::Naming::new(&run).ns("h1");
        let state = netlab::lab::read_state(&std::path::Path::new(netlab::lab::STATE_DIR).join(&run));
        (state.is_some_and(|s| s.phase == netlab::lab::Phase::Running) && !netlab::netns::pids_in(&ns).is_empty())
            .then_some(())
    });
    (child, run, s)
}

#[test]
fn ctrl_c_during_run_removes_the_lab() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("ctrl_c_during_run_removes_the_lab") {
        return;
    }
    let (mut child, run, s) = run_sleeping(
        "sigint",
        "[topology]\nkind = \"star\"\nhosts = 3\n[link]\ndelay = \"1ms\"\n",
    );
    let pid = child.id();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(namespaces_of(&run).is_empty(), "namespaces left after Ctrl-C");
    assert!(!std::path::Path::new(netlab::lab::STATE_DIR).join(&run).exists());
    let _ = std::fs::remove_file(s);
}

#[test]
fn kill_9_during_up_then_clean_leaves_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("kill_9_during_up_then_clean_leaves_nothing") {
        return;
    }
    // Big enough to be caught half-built; with delay lines, so that
    // processes are left too.
    let mut child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["up", "linear:60", "--delay", "100us", "--apply", "per-op", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let run = wait_for("namespaces being created", Duration::from_secs(20), || {
        runs_of(pid).into_iter().next().filter(|r| namespaces_of(r).len() >= 10)
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!namespaces_of(&run).is_empty(), "test needs a half-built lab");
    let o = netlab(&["clean"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains(&run), "{}", text(&o));
    assert!(namespaces_of(&run).is_empty(), "namespaces left after clean");
    assert!(!std::path::Path::new(netlab::lab::STATE_DIR).join(&run).exists());
    // No delay line of that run survives.
    let o = Command::new("pgrep")
        .args([
            "-f",
            &format!("netns exec {}", netlab::plan::Naming::new(&run).fabric()),
        ])
        .output()
        .unwrap();
    assert!(o.stdout.is_empty(), "delay lines left: {}", text(&o));
}

#[test]
fn up_exec_check_down() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("up_exec_check_down") {
        return;
    }
    let o = netlab(&["up", "chain:3", "--bw", "1gbit", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = text(&o).split_whitespace().nth(2).unwrap().to_string();
    let o = netlab(&[
        "exec",
        "--run",
        &run,
        "h2",
        "--",
        "sh",
        "-c",
        "echo $NETLAB_HOST $NETLAB_IP_h1",
    ]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "h2 10.0.0.1");
    let o = netlab(&["exec", "--run", &run, "h2", "--", "false"]);
    assert_eq!(o.status.code(), Some(1));
    let o = netlab(&["exec", "--run", &run, "h9", "--", "true"]);
    assert!(text(&o).contains("unknown host 'h9'"), "{}", text(&o));
    let o = netlab(&["check", "--run", &run]);
    assert!(
        o.status.success() && text(&o).contains("all 2 host pairs"),
        "{}",
        text(&o)
    );
    let o = netlab(&["down", "--run", &run]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(namespaces_of(&run).is_empty());
}

/// The run id in the output of `up` ("... --run ID ...").
fn run_id_of(o: &Output) -> String {
    text(o)
        .split("--run ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .map(String::from)
        .unwrap_or_else(|| panic!("no run id in {}", text(o)))
}

/// SIGINT to a process group, as a terminal's Ctrl-C sends it.
fn ctrl_c(group_leader: u32) {
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(group_leader as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
}

#[test]
fn ctrl_c_to_the_process_group_during_up_exits_130_with_nothing_left() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("ctrl_c_to_the_process_group_during_up_exits_130_with_nothing_left") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["up", "linear:50", "--apply", "per-op"])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let run = wait_for("namespaces being created", Duration::from_secs(20), || {
        runs_of(pid).into_iter().next().filter(|r| namespaces_of(r).len() >= 5)
    });
    ctrl_c(pid);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("interrupted; lab removed") && !err.contains("killed by signal"),
        "{err}"
    );
    assert!(namespaces_of(&run).is_empty(), "namespaces left after Ctrl-C");
}

#[test]
fn down_refuses_a_lab_a_live_run_is_using() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("down_refuses_a_lab_a_live_run_is_using") {
        return;
    }
    let (mut child, run, s) = run_sleeping("inuse", "[topology]\nkind = \"pair\"\n");
    let pid = child.id();
    let o = netlab(&["down", "--run", &run]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("in use by live process") && text(&o).contains("--force"),
        "{}",
        text(&o)
    );
    assert!(!namespaces_of(&run).is_empty(), "down removed a live run's lab");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130));
    assert!(namespaces_of(&run).is_empty());
    let _ = std::fs::remove_file(s);
}

#[test]
fn check_on_star_100_passes_and_stops_on_ctrl_c() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("check_on_star_100_passes_and_stops_on_ctrl_c") {
        return;
    }
    use std::os::unix::process::CommandExt;
    let thresh3 = || -> u64 {
        std::fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3")
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let before = thresh3();
    let o = netlab(&["up", "star:100", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = run_id_of(&o);
    // 9,900 neighbour entries for all pairs, all of them permanent (the
    // plan knows every address and MAC): none is resolved by ARP or counted
    // against the machine's shared table, which stays as it was.
    let o = Command::new("ip")
        .args(["-n", &format!("netlab-{run}-h7"), "neigh", "show", "nud", "permanent"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 99, "{}", text(&o));
    assert_eq!(thresh3(), before);
    let o = netlab(&["check", "--run", &run]);
    let t = text(&o);
    assert!(
        o.status.success() && t.contains("all 9900 host pairs reach each other"),
        "{t}"
    );
    assert!(t.contains("9900/9900 pairs, 0 unreachable so far"), "{t}");
    // Again with h1 cut off, so that every source waits out its rounds for
    // h1 (tens of seconds in all), interrupted once it has started probing.
    let o = netlab(&[
        "exec",
        "--run",
        &run,
        "h1",
        "--",
        "sh",
        "-c",
        "for d in /sys/class/net/*; do n=${d##*/}; [ \"$n\" = lo ] || ip link set \"$n\" down; done",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let child = Command::new(env!("CARGO_BIN_EXE_netlab"))
        .args(["check", "--run", &run])
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let sent = std::time::Instant::now();
    ctrl_c(child.id());
    let o = child.wait_with_output().unwrap();
    let took = sent.elapsed();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(err.contains("checking: ") && err.contains("interrupted"), "{err}");
    assert!(took < Duration::from_secs(2), "check took {took:?} to stop");
    let o = netlab(&["down", "--run", &run]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(namespaces_of(&run).is_empty());
    if netlab::lab::list_runs(std::path::Path::new(netlab::lab::STATE_DIR)).is_empty() {
        assert_eq!(thresh3(), before, "the last lab's removal restores the limit");
    }
}

#[test]
fn adaptive_tdf_rises_under_load_and_is_traced() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("adaptive_tdf_rises_under_load_and_is_traced") {
        return;
    }
    // Two CPU-bound loops (a fixed amount of work each, not a duration,
    // which the dilated clock would stretch) keep both cores busy, for about
    // 3 s on a fast core (dash): many 0.2 s epochs.
    let burn = "i=0; while [ $i -lt 4000000 ]; do i=$((i+1)); done";
    let s = scenario(
        "adapt",
        &format!("[topology]\nkind = \"pair\"\n[[command]]\nhost = \"h1\"\ncmd = \"({burn}) & ({burn}); wait\"\n"),
    );
    let out = std::env::temp_dir().join(format!("netlab-adapt-{}", std::process::id()));
    let o = netlab(&[
        "run",
        s.to_str().unwrap(),
        "--adaptive-tdf",
        "1-4",
        "--adapt-epoch",
        "0.2",
        "--out",
        out.to_str().unwrap(),
        "-q",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let trace = std::fs::read_to_string(out.join("tdf-trace.csv")).unwrap();
    let tdfs: Vec<u32> = trace
        .lines()
        .skip(1)
        .filter_map(|l| l.rsplit(',').next()?.parse().ok())
        .collect();
    assert!(tdfs.len() >= 3, "{trace}");
    assert!(tdfs.iter().all(|&t| (1..=4).contains(&t)), "{trace}");
    assert!(
        tdfs.iter().any(|&t| t > 1),
        "both cores busy, yet the TDF never rose:\n{trace}"
    );
    assert!(text(&o).contains("adaptive TDF ended at"), "{}", text(&o));
    let _ = std::fs::remove_dir_all(out);
    let _ = std::fs::remove_file(s);
    let bad = netlab(&["run", "pair", "--adaptive-tdf", "4-1"]);
    assert!(
        !bad.status.success() && text(&bad).contains("MIN <= MAX"),
        "{}",
        text(&bad)
    );
}

/// `netlab monitor`: a host's monitor port gets a copy of every frame its
/// lab interface receives and sends, and `--remove` takes it away.
#[test]
fn monitor_port_mirrors_both_directions_and_goes_away() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("monitor_port_mirrors_both_directions_and_goes_away") {
        return;
    }
    let o = netlab(&["up", "pair", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = text(&o).split_whitespace().nth(2).unwrap().to_string();
    let o = netlab(&["monitor", "--run", &run, "h1"]);
    assert!(
        o.status.success() && text(&o).contains("monitor port mon0"),
        "{}",
        text(&o)
    );
    // The same name twice is refused.
    let o = netlab(&["monitor", "--run", &run, "h1"]);
    assert!(!o.status.success() && text(&o).contains("monitor port"), "{}", text(&o));
    let rx = || -> u64 {
        let o = netlab(&[
            "exec",
            "--run",
            &run,
            "h1",
            "--",
            "cat",
            "/sys/class/net/mon0/statistics/rx_packets",
        ]);
        text(&o).trim().parse().unwrap_or_else(|_| panic!("{}", text(&o)))
    };
    let send = |from: &str, to: &str, n: u32| {
        let script = format!("for i in $(seq 1 {n}); do echo x > /dev/udp/$NETLAB_IP_{to}/9999; done");
        let o = netlab(&["exec", "--run", &run, from, "--", "bash", "-c", &script]);
        assert!(o.status.success(), "{}", text(&o));
    };
    let before = rx();
    send("h2", "h1", 200); // received by h1 (and answered with ICMP port unreachable)
    send("h1", "h2", 100); // sent by h1 (h2's answers come back to h1 too)
    let got = rx() - before;
    // 200 in + 100 out, plus the ICMP replies each way (no ARP: the
    // neighbours are permanent).
    assert!((300..=620).contains(&got), "mon0 saw {got} frames");
    let o = netlab(&["monitor", "--run", &run, "h1", "--remove"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = netlab(&["exec", "--run", &run, "h1", "--", "ip", "link", "show", "mon0"]);
    assert!(!o.status.success(), "mon0 still there");
    let o = netlab(&["down", "--run", &run]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A lab too big for all pairs by default (more than 300 hosts): plain
/// `check` proves it with a sample (every host to the hub, whose neighbour
/// entries are permanent, and 5 random destinations per host, resolved by
/// ARP through a backlog sized for the segment's floods), states the
/// sample, and finds none unreachable in an idle lab. 400 hosts keep the
/// test within about 30 s on a busy 2-core machine; star:1000 takes 10-30 s
/// to come up and as long to check here (README, "Limitations").
#[test]
fn check_on_star_400_samples_and_finds_every_host() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !need_root("check_on_star_400_samples_and_finds_every_host") {
        return;
    }
    let t0 = std::time::Instant::now();
    let o = netlab(&["up", "star:400", "-q"]);
    assert!(o.status.success(), "{}", text(&o));
    let run = run_id_of(&o);
    let up = t0.elapsed();
    let t1 = std::time::Instant::now();
    let o = netlab(&["check", "--run", &run, "--seed", "7"]);
    let check = t1.elapsed();
    let t = text(&o);
    let down = netlab(&["down", "--run", &run]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(namespaces_of(&run).is_empty());
    // 399 hosts to the hub, 5 random destinations from each of the 400.
    assert!(
        o.status.success() && t.contains("2399 sampled host pairs reach each other"),
        "{t}"
    );
    assert!(
        t.contains("every host to hub h1 and 5 random destinations per host, seed 7")
            && t.contains("400 hosts have 159600 pairs, --all-pairs checks them all"),
        "{t}"
    );
    assert!(t.contains("2399/2399 pairs, 0 unreachable so far"), "{t}");
    eprintln!("star:400: up {up:?}, sampled check {check:?}");
    assert!(check < Duration::from_secs(60), "check took {check:?}");
}

/// A reader that stops early (`netlab list | head -1`) ends the output
/// quietly: no panic, success.
#[test]
fn output_to_a_closed_pipe_ends_quietly() {
    for args in [&["list"][..], &["plan", "star:40"][..]] {
        // A pipe whose reading end is closed before netlab starts.
        let (reader, writer) = nix::unistd::pipe().unwrap();
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_netlab"))
            .args(args)
            .stdout(writer)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "netlab {args:?}: {err}");
        assert!(out.status.success(), "netlab {args:?}: {:?} {err}", out.status);
    }
}
