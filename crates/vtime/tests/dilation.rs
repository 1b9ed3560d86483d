//! Real-time tests of the shim through `vtime run`. Each wait is measured in
//! real time by this process between two lines the program prints; waits run
//! as parallel processes so the suite costs a few TDF-scaled seconds, not
//! their sum. Timing assertions are the (within 2%); the programs
//! sleep, so they are robust to CPU load from elsewhere.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use vtime::{Domain, Tdf};

const VTIME: &str = env!("CARGO_BIN_EXE_vtime");

/// The C test program, compiled once per test run.
fn waits_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vtime-waits");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/waits.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = Command::new(&cc)
            .args(["-O2", "-Wall", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-lpthread")
            .status()
            .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
        assert!(st.success(), "compiling {} failed", src.display());
        out
    })
}

/// A private directory for records and the shim, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("vtime-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }

    fn vtime(&self) -> Command {
        let mut c = Command::new(VTIME);
        c.env("VTIME_DIR", &self.0).env("TMPDIR", &self.0);
        c
    }

    /// Nothing left behind: no record, no shim directory.
    fn assert_empty(&self) {
        let left: Vec<_> = std::fs::read_dir(&self.0)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a probe reported: real time from our "go" to its `done` line, and
/// its own view.
#[derive(Debug)]
struct Measured {
    real: Duration,
    go: Instant,
    outcome: String,
    virt_ns: i64,
    cpu_us: i64,
}

/// Drives a probe: waits for its `ready` line (with an optional prefix),
/// runs `gate` (e.g. a barrier, so that many probes starting together have
/// all finished starting), writes `go` to its stdin and timestamps it, then
/// timestamps its `done` line. Stamping here, after start-up, keeps process
/// start-up under load out of the figure; a late wake-up of the probe after
/// `go` can only make the figure longer, never shorter. Bounded by `limit`.
fn measure(mut child: Child, prefix: &str, limit: Duration, gate: impl FnOnce()) -> (Measured, Child) {
    let out = child.stdout.take().unwrap();
    let mut stdin = child.stdin.take().expect("probe stdin must be piped");
    let start = Instant::now();
    let mut gate = Some(gate);
    let mut go = None;
    let mut lines = BufReader::new(out).lines();
    while let Some(Ok(line)) = lines.next() {
        assert!(start.elapsed() < limit, "probe ran past {limit:?}");
        // The test harness may print on the same line before our prefix.
        let Some(at) = line.find(prefix) else { continue };
        let l = &line[at + prefix.len()..];
        if l == "ready" {
            (gate.take().expect("two ready lines"))();
            go = Some(Instant::now());
            writeln!(stdin, "go").and_then(|_| stdin.flush()).expect("write go");
        } else if let Some(rest) = l.strip_prefix("done ") {
            let go = go.expect("done before ready");
            let f: Vec<&str> = rest.split_whitespace().collect();
            let m = Measured {
                real: go.elapsed(),
                go,
                outcome: f[0].to_string(),
                virt_ns: f[1].parse().unwrap(),
                cpu_us: f[2].parse().unwrap(),
            };
            // Keep reading, so that what the program prints after (the test
            // harness's summary) does not hit a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (m, child);
        }
    }
    let st = child.wait();
    panic!("probe ended without a done line: {st:?}");
}

fn within(actual: Duration, expected: Duration, frac: f64) -> bool {
    (actual.as_secs_f64() - expected.as_secs_f64()).abs() <= expected.as_secs_f64() * frac
}

const MODES: &[&str] = &[
    "nanosleep",
    "clock_nanosleep_abs",
    "usleep",
    "poll",
    "ppoll",
    "select",
    "epoll",
    "timerfd",
    "timerfd_abs",
    "posix_timer",
    "alarm",
    "setitimer",
    "cond_realtime",
    "cond_monotonic",
    "sem",
    "mutex",
    "sigtimedwait",
    "futex",
    "rcvtimeo",
    "rx_timestamp",
];

/// Under TDF 4, a 1 s virtual wait through every interface takes 4 s of real
/// time within 2%, reports its timeout, sees 1 s pass on its own clock, and
/// does not spin. `rx_timestamp` sleeps 1 s and then checks that a kernel
/// receive timestamp reads on the virtual wall clock (3 s behind the real one
/// by then).
#[test]
fn every_wait_takes_tdf_times_longer() {
    let s = Scratch::new("waits");
    let bin = waits_bin();
    let children: Vec<(&str, Child)> = MODES
        .iter()
        .map(|m| {
            let c = s
                .vtime()
                .args(["run", "--tdf", "4", "--"])
                .arg(bin)
                .args([m, "1"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            (*m, c)
        })
        .collect();
    let all_started = Arc::new(Barrier::new(children.len()));
    let handles: Vec<_> = children
        .into_iter()
        .map(|(m, c)| {
            let b = all_started.clone();
            std::thread::spawn(move || {
                (
                    m,
                    measure(c, "", Duration::from_secs(60), move || {
                        b.wait();
                    }),
                )
            })
        })
        .collect();
    let mut failures = Vec::new();
    for h in handles {
        let (m, (r, mut child)) = h.join().unwrap();
        assert!(child.wait().unwrap().success(), "{m}: exit status");
        eprintln!("{m}: {r:?}");
        let virt = Duration::from_nanos(r.virt_ns.max(0) as u64);
        let timing_ok = if m == "rcvtimeo" {
            // The kernel runs socket timeouts on its timer wheel, whose slack
            // for multi-second timeouts is up to 1/8 of the timeout with or
            // without vtime. Check what vtime controls: never early, and real
            // time is exactly 4x the time the program saw pass.
            virt >= Duration::from_secs(1)
                && virt < Duration::from_millis(1150)
                && (r.real.as_secs_f64() / virt.as_secs_f64() - 4.0).abs() <= 4.0 * 0.02
        } else {
            within(r.real, Duration::from_secs(4), 0.02) && within(virt, Duration::from_secs(1), 0.02)
        };
        if r.outcome != "timeout" || !timing_ok || r.cpu_us > 100_000 {
            failures.push(format!("{m}: {r:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "waits off (expected 4 s real, 1 s virtual, timeout, no spin): {failures:#?}"
    );
    s.assert_empty();
}

/// A TDF change during a long sleep ends it at the right real time: the part
/// slept before the change at the old factor, the rest at the new one.
#[test]
fn tdf_change_during_a_sleep() {
    let s = Scratch::new("change");
    let child = s
        .vtime()
        .args(["run", "--tdf", "4", "--clock", "change", "--"])
        .arg(waits_bin())
        .args(["nanosleep", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let dir = s.0.clone();
    let mut changer = None;
    let (r, mut child) = measure(child, "", Duration::from_secs(30), || {
        // The probe is running, so its domain exists.
        let d = Domain::open(&dir, "change").unwrap();
        changer = Some(std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            let at = Instant::now();
            d.set_tdf(Tdf::new(2, 1).unwrap()).unwrap();
            at
        }));
    });
    let changed_at = changer.unwrap().join().unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(r.outcome, "timeout");
    // Before the change the sleep ran at TDF 4, after it at TDF 2.
    let before = changed_at.duration_since(r.go).as_secs_f64();
    let expected = before + (2.0 - before / 4.0) * 2.0;
    assert!(
        within(r.real, Duration::from_secs_f64(expected), 0.02),
        "slept {:?}, expected {expected:.3} s (changed after {before:.3} s)",
        r.real
    );
    // Also well away from what either factor alone would give (8 s or 4 s).
    assert!(r.real.as_secs_f64() > 4.2 && r.real.as_secs_f64() < 7.0, "{r:?}");
    s.assert_empty();
}

/// A child of the program (through a shell) runs on the same dilated clock.
#[test]
fn children_inherit() {
    let s = Scratch::new("inherit");
    let script = format!("{} nanosleep 0.5; true", waits_bin().display());
    let child = s
        .vtime()
        .args(["run", "--tdf", "4", "--", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (r, mut child) = measure(child, "", Duration::from_secs(30), || ());
    assert!(child.wait().unwrap().success());
    assert_eq!(r.outcome, "timeout");
    assert!(within(r.real, Duration::from_secs(2), 0.02), "{r:?}");
    s.assert_empty();
}

/// Child role of the Rust probes, not a test of its own: ignored, and run
/// (with `--ignored`) only when re-executed by the test below.
#[test]
#[ignore = "child role of rust_std_timeouts_are_dilated_without_spinning"]
fn rust_probe_child() {
    let Ok(mode) = std::env::var("VTIME_TEST_PROBE") else {
        return;
    };
    use std::sync::{Condvar, Mutex};
    let cpu = || {
        let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).unwrap();
        let us = |t: nix::sys::time::TimeVal| t.tv_sec() * 1_000_000 + t.tv_usec();
        us(u.user_time()) + us(u.system_time())
    };
    let wait = Duration::from_secs(1);
    println!("probe: ready");
    let mut go = String::new();
    std::io::stdin().read_line(&mut go).unwrap();
    let (c0, v0) = (cpu(), Instant::now());
    let timed_out = match mode.as_str() {
        "condvar" => {
            let pair = (Mutex::new(()), Condvar::new());
            let g = pair.0.lock().unwrap();
            let (_g, r) = pair.1.wait_timeout(g, wait).unwrap();
            r.timed_out()
        }
        "park" => {
            std::thread::park_timeout(wait);
            true
        }
        "channel" => {
            let (_tx, rx) = std::sync::mpsc::channel::<()>();
            rx.recv_timeout(wait).is_err()
        }
        m => panic!("unknown probe {m}"),
    };
    let (v, c) = (v0.elapsed(), cpu() - c0);
    println!(
        "probe: done {} {} {}",
        if timed_out { "timeout" } else { "woken" },
        v.as_nanos(),
        c
    );
}

/// Rust std's Condvar::wait_timeout, park_timeout and channel timeouts (futex
/// waits with absolute CLOCK_MONOTONIC deadlines through syscall()) take TDF
/// times longer in real time and do not spin.
#[test]
fn rust_std_timeouts_are_dilated_without_spinning() {
    let s = Scratch::new("rust");
    let me = std::env::current_exe().unwrap();
    let modes = ["condvar", "park", "channel"];
    let all_started = Arc::new(Barrier::new(modes.len()));
    let handles: Vec<_> = modes
        .into_iter()
        .map(|mode| {
            let c = s
                .vtime()
                .args(["run", "--tdf", "4", "--"])
                .arg(&me)
                .args([
                    "rust_probe_child",
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads",
                    "1",
                ])
                .env("VTIME_TEST_PROBE", mode)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let b = all_started.clone();
            std::thread::spawn(move || {
                (
                    mode,
                    measure(c, "probe: ", Duration::from_secs(60), move || {
                        b.wait();
                    }),
                )
            })
        })
        .collect();
    for h in handles {
        let (mode, (r, mut child)) = h.join().unwrap();
        assert!(child.wait().unwrap().success(), "{mode}");
        eprintln!("{mode}: {r:?}");
        assert_eq!(r.outcome, "timeout", "{mode}");
        assert!(within(r.real, Duration::from_secs(4), 0.02), "{mode}: {r:?}");
        let virt = Duration::from_nanos(r.virt_ns as u64);
        assert!(
            within(virt, Duration::from_secs(1), 0.02),
            "{mode}: its own clock: {r:?}"
        );
        // A spinning wait would burn about 4 s of CPU.
        assert!(r.cpu_us < 100_000, "{mode} spins: {r:?}");
    }
    s.assert_empty();
}

fn run_output(s: &Scratch, args: &[&str]) -> Output {
    s.vtime().args(args).stdin(Stdio::null()).output().unwrap()
}

fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Bad input: a clear error naming the problem and a non-zero exit.
#[test]
fn bad_input_is_refused_clearly() {
    let s = Scratch::new("bad");
    for (args, needle) in [
        (vec!["run", "--tdf", "0", "--", "true"], "must be greater than 0"),
        (vec!["run", "--tdf", "-1", "--", "true"], "must be greater than 0"),
        (vec!["run", "--tdf", "nan", "--", "true"], "not a number"),
        (vec!["run", "--tdf", "abc", "--", "true"], "not a number"),
        (vec!["set", "nosuch", "2"], "no clock domain named \"nosuch\""),
        (vec!["set", "x", "0"], "must be greater than 0"),
        (vec!["status", "nosuch"], "no clock domain named \"nosuch\""),
        (vec!["run", "--clock", "a/b", "--", "true"], "bad clock domain name"),
        (vec!["run", "--", "no-such-command-vtime"], "command not found"),
    ] {
        let o = run_output(&s, &args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(stderr_of(&o).contains(needle), "{args:?}: {}", stderr_of(&o));
    }
    // A shim that cannot load.
    let garbage = s.0.join("garbage.so");
    std::fs::write(&garbage, b"not a shared object").unwrap();
    let o = run_output(&s, &["run", "--shim", garbage.to_str().unwrap(), "--", "true"]);
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("cannot be loaded"), "{}", stderr_of(&o));
    std::fs::remove_file(&garbage).unwrap();
    s.assert_empty();
}

/// Clocks read in a tight loop never go back while the TDF changes under
/// them hundreds of times (the seqlock and the rebase, seen from C).
#[test]
fn clocks_stay_monotonic_across_rapid_changes() {
    let s = Scratch::new("mono");
    // "monotonic 10" reads each clock 10 million times.
    let child = s
        .vtime()
        .args(["run", "--tdf", "4", "--clock", "mono", "--"])
        .arg(waits_bin())
        .args(["monotonic", "10"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let dir = s.0.clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut changer = None;
    let (r, mut child) = measure(child, "", Duration::from_secs(60), || {
        // The probe is running, so its domain exists.
        let d = Domain::open(&dir, "mono").unwrap();
        let stop = stop.clone();
        changer = Some(std::thread::spawn(move || {
            let factors = ["1", "4", "2.5", "1/3", "7", "0.5"];
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut n = 0usize;
            // Bounded in count and time.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 5000 && Instant::now() < deadline {
                d.set_tdf(factors[n % factors.len()].parse().unwrap()).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            n
        }));
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let changes = changer.unwrap().join().unwrap();
    assert!(child.wait().unwrap().success());
    eprintln!("{changes} TDF changes during {:?}", r.real);
    assert!(changes >= 50, "only {changes} TDF changes happened during the loop");
    assert_eq!(r.outcome, "timeout", "a clock went back ({changes} changes): {r:?}");
    s.assert_empty();
}

/// A SIGINT sent to `vtime run` (as `kill -INT` does) reaches the program.
#[test]
fn sigint_is_forwarded() {
    let s = Scratch::new("sigint");
    let mut child = s
        .vtime()
        .args(["run", "--clock", "int", "--"])
        .arg(waits_bin())
        .args(["nanosleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(128 + 2));
    s.assert_empty();
}

/// A program that sets up io_uring is told, once, that its timeouts are not
/// dilated.
#[test]
fn io_uring_is_reported() {
    let s = Scratch::new("uring");
    let o = s
        .vtime()
        .args(["run", "--tdf", "4", "--"])
        .arg(waits_bin())
        .args(["io_uring", "0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success());
    let err = stderr_of(&o);
    assert_eq!(err.matches("uses io_uring").count(), 1, "{err}");
    s.assert_empty();
}

/// Exit statuses pass through, including death by a signal (128 + N).
#[test]
fn exit_status_propagates() {
    let s = Scratch::new("status");
    assert_eq!(
        run_output(&s, &["run", "--", "sh", "-c", "exit 7"]).status.code(),
        Some(7)
    );
    assert_eq!(
        run_output(&s, &["run", "--", "sh", "-c", "kill -TERM $$"])
            .status
            .code(),
        Some(128 + 15)
    );
    s.assert_empty();
}

/// A statically linked program is refused at launch with the reason, and
/// started (with a warning) only when asked to.
#[test]
fn static_program_is_detected() {
    let s = Scratch::new("static");
    let bin = s.0.join("static-true");
    let src = s.0.join("t.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .arg("-static")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success(), "cc -static failed (libc6-dev provides libc.a)");
    std::fs::remove_file(&src).unwrap();
    let o = run_output(&s, &["run", "--tdf", "2", "--", bin.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("statically linked"), "{}", stderr_of(&o));
    let o = run_output(
        &s,
        &["run", "--tdf", "2", "--allow-uncovered", "--", bin.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(stderr_of(&o).contains("REAL time"), "{}", stderr_of(&o));
    std::fs::remove_file(&bin).unwrap();
    s.assert_empty();
}

/// `vtime status` shows a running domain, its factor after `vtime set`.
#[test]
fn set_and_status_on_a_running_domain() {
    let s = Scratch::new("setstatus");
    let mut child = s
        .vtime()
        .args(["run", "--tdf", "3", "--clock", "shown", "--"])
        .arg(waits_bin())
        .args(["nanosleep", "30"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded wait for the domain to appear.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Domain::open(&s.0, "shown").is_err() {
        assert!(Instant::now() < deadline, "domain never appeared");
        std::thread::sleep(Duration::from_millis(5));
    }
    let o = run_output(&s, &["set", "shown", "2.5"]);
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "shown: TDF 3 -> 2.5");
    let o = run_output(&s, &["status"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.starts_with("shown "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(line.split_whitespace().nth(1) == Some("2.5"), "{line}");
    assert!(line.contains("running"), "{line}");
    // Ctrl-C style stop: SIGTERM to vtime reaches the program, and vtime cleans up.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(128 + 15));
    s.assert_empty();
}

/// Futex commands that are not waits pass through untouched: their fourth
/// argument is a count or garbage, never a timespec to read (reading it
/// crashed every multi-threaded Rust program at its first FUTEX_WAKE).
#[test]
fn futex_wakes_with_any_fourth_argument_pass_through() {
    let s = Scratch::new("futexwake");
    let bin = s.0.join("wake");
    let src = s.0.join("wake.c");
    std::fs::write(
        &src,
        "#include <linux/futex.h>\n#include <sys/syscall.h>\n#include <unistd.h>\n\
         int main(void) { int w = 0;\n\
           /* A wild pointer where a wait would have its timeout. */\n\
           long r = syscall(SYS_futex, &w, FUTEX_WAKE_PRIVATE, 1, (void *)8, 0, 0);\n\
           r |= syscall(SYS_futex, &w, FUTEX_REQUEUE_PRIVATE, 1, (void *)1, &w, 0);\n\
           return r < 0; }\n",
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc).arg("-o").arg(&bin).arg(&src).status().unwrap();
    assert!(st.success());
    std::fs::remove_file(&src).unwrap();
    let o = run_output(&s, &["run", "--tdf", "4", "--", bin.to_str().unwrap()]);
    assert!(o.status.success(), "status {:?}: {}", o.status, stderr_of(&o));
    std::fs::remove_file(&bin).unwrap();
    s.assert_empty();
}

/// A program whose allocator reads the clock and makes raw system calls
/// (as jemalloc does: Redis under the shim hung at start) is not deadlocked
/// by the shim's own start-up: resolving the real functions allocates when
/// a symbol is missing, and that allocation re-enters the shim on the same
/// thread. The program starts, and its time is dilated.
#[test]
fn an_allocator_that_reads_the_clock_does_not_deadlock_the_shim() {
    let s = Scratch::new("alloc");
    let bin = s.0.join("alloc-clock");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/alloc_clock.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args(["-O1", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc}: {e}"));
    assert!(st.success(), "compiling {} failed", src.display());
    let mut child = s
        .vtime()
        .args(["run", "--tdf", "2", "--"])
        .arg(&bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: a deadlocked start never ends by itself.
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            std::fs::remove_file(&bin).unwrap();
            panic!("the program did not end within 20 s under the shim (deadlocked at start)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = child.wait_with_output().unwrap();
    std::fs::remove_file(&bin).unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let fields: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(fields.first(), Some(&"ok"), "{out}");
    // 100 ms of its own time, not less (it did sleep, on the shim's clock)
    // and the allocator really read the clock.
    let ms: i64 = fields[1].parse().unwrap();
    assert!(
        (95..1000).contains(&ms),
        "a 100 ms sleep measured {ms} ms of its own time"
    );
    let reads: i64 = fields[2].parse().unwrap();
    assert!(reads > 0, "the allocator never ran");
    s.assert_empty();
}
