//! Virtual time in the lab (paper 003): a link of rate R in a lab at TDF 4
//! is shaped to R/4 in real time, while every process in the lab runs under
//! the vtime shim and sees time pass four times slower; the program inside
//! measures ≈R, the real wire carries R/4.

mod common;
use common::*;
use netlab::model::LinkParams;
use netlab::topo::Builtin;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Counts UDP bytes on port 9000 until an END datagram; prints
/// "DATAGRAMS BYTES SECONDS" over its own (virtual) clock, first to last.
const RECEIVER: &str = r#"
import socket, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("0.0.0.0", 9000))
s.settimeout(20)
n = b = 0
first = last = None
while True:
    d = s.recv(65536)
    if d == b"END":
        break
    now = time.monotonic()
    if first is None:
        first = now
    else:
        n += 1
        b += len(d)
    last = now
print(n, b, last - first, flush=True)
"#;

/// Sends 1400-byte datagrams as fast as it can for SECS of its own clock.
const SENDER: &str = r#"
import socket, sys, time
dst, secs = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
buf = b"x" * 1400
end = time.monotonic() + secs
while time.monotonic() < end:
    try:
        s.sendto(buf, (dst, 9000))
    except OSError:
        pass
for _ in range(50):
    s.sendto(b"END", (dst, 9000))
    time.sleep(0.01)
"#;

/// Bytes a 1400-byte UDP datagram is charged at the shaper (HTB counts the
/// Ethernet frame: + 8 UDP + 20 IP + 14 Ethernet).
const FRAME: f64 = 1442.0;

/// Sends for `virtual_secs` of the lab's clock from h1 to h2; returns the
/// rate the receiver measured on its (dilated) clock and the rate through
/// h1's shaper over the middle of the run on this (undilated) process's
/// clock, both in bits per second.
fn tdf(s: &str) -> netlab::plan::Tdf {
    netlab::plan::parse_tdf(s).unwrap()
}

fn measure(lab: &netlab::lab::Lab, virtual_secs: f64) -> (f64, f64) {
    let l = lab.launcher();
    let h2 = lab.state.host("h2").unwrap().addr.unwrap().to_string();
    let mut rx = l
        .command("h2", &["python3", "-c", RECEIVER])
        .unwrap()
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The receiver binds within a virtual moment; give it real time.
    std::thread::sleep(Duration::from_millis(500));
    let mut tx = l
        .command("h1", &["python3", "-c", SENDER, &h2, &virtual_secs.to_string()])
        .unwrap()
        .spawn()
        .unwrap();
    let ns = lab.ns_of("h1").unwrap().to_string();
    let dev = lab
        .plan
        .addressing
        .ifaces
        .iter()
        .find(|f| f.node == "h1")
        .map(|f| f.ifname.clone())
        .unwrap();
    let real = Duration::from_secs_f64(virtual_secs * lab.state.tdf.as_f64());
    // The window starts once the sender is sending (starting Python under
    // the shim takes from 0.1 s to most of a second on a busy machine, and
    // a window opened by the clock alone then measured 0.35-0.9x of R/TDF).
    let idle = netlab::netns::root_qdisc_bytes(&ns, &dev).unwrap();
    wait_for("the sender's first bytes", Duration::from_secs(10), || {
        (netlab::netns::root_qdisc_bytes(&ns, &dev).unwrap() > idle).then_some(())
    });
    std::thread::sleep(real.mul_f64(0.1));
    let (b0, t0) = (netlab::netns::root_qdisc_bytes(&ns, &dev).unwrap(), Instant::now());
    std::thread::sleep(real.mul_f64(0.5));
    let (b1, t1) = (netlab::netns::root_qdisc_bytes(&ns, &dev).unwrap(), Instant::now());
    let real_bps = (b1 - b0) as f64 * 8.0 / (t1 - t0).as_secs_f64();
    assert!(tx.wait().unwrap().success());
    let mut out = String::new();
    rx.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(rx.wait().unwrap().success(), "receiver: {out}");
    let f: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    let (datagrams, seconds) = (f[0], f[2]);
    (datagrams * FRAME * 8.0 / seconds, real_bps)
}

#[test]
fn a_program_in_a_dilated_lab_sees_the_configured_rate() {
    if !need_root("a_program_in_a_dilated_lab_sees_the_configured_rate") {
        return;
    }
    if std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        panic!("python3 is needed for this test (scripts/install-deps.sh installs it)");
    }
    const RATE: u64 = 20_000_000;
    let r = RATE as f64;
    let params = LinkParams {
        bw_bps: Some(RATE),
        ..Default::default()
    };
    let mut o = opts();
    o.dilation.tdf = tdf("4");
    let mut lab = up(&Builtin::Pair.build(&params), &o);
    assert!(lab.state.clock.is_some(), "a dilated lab records its clock");
    // TDF 4, then changed at run time to 2.5 (vtime's TDF is a ratio, end to
    // end): the links are re-rated to R/TDF and the clock follows; inside,
    // the program measures ≈R each time.
    for (tdf, virtual_secs) in [(tdf("4"), 1.5), (tdf("2.5"), 1.0)] {
        if tdf != lab.state.tdf {
            lab.set_tdf(tdf).unwrap();
        }
        let (inside, real) = measure(&lab, virtual_secs);
        let real_r = r / tdf.as_f64();
        eprintln!(
            "configured {r} b/s at TDF {tdf}: inside {inside:.0} b/s ({:.3}x), real wire {real:.0} b/s ({:.3}x of R/TDF)",
            inside / r,
            real / real_r
        );
        assert!(
            (inside / r - 1.0).abs() < 0.05,
            "TDF {tdf}: inside the lab {inside:.0} b/s, configured {r}"
        );
        assert!(
            (real / real_r - 1.0).abs() < 0.05,
            "TDF {tdf}: real wire {real:.0} b/s, expected {real_r}"
        );
    }
    let clock = lab.state.clock.clone().unwrap();
    lab.down().unwrap();
    assert!(
        vtime::Domain::open(&clock.dir, &clock.domain).is_err(),
        "the lab's clock record is removed with it"
    );
}

/// The delay line holds frames for delay x TDF of real time, and follows a
/// TDF change at run time: a 4 ms link at TDF 2 (16 ms round trip in real
/// time) doubles to a 32 ms round trip at TDF 4. The probes run in the test
/// process, outside the lab's clock, so they see real time.
#[test]
fn the_delay_line_follows_a_tdf_change() {
    if !need_root("the_delay_line_follows_a_tdf_change") {
        return;
    }
    let params = LinkParams {
        delay_ns: 4_000_000,
        ..Default::default()
    };
    let mut o = opts();
    o.dilation.tdf = tdf("2");
    o.delay_backend = Some(netlab::plan::DelayBackend::DelayLine);
    let mut lab = up(&Builtin::Pair.build(&params), &o);
    for tdf in [tdf("2"), tdf("4"), tdf("1")] {
        if tdf != lab.state.tdf {
            lab.set_tdf(tdf).unwrap();
        }
        let eps = netlab::probe::endpoints(&lab.state);
        let mut rtts =
            netlab::probe::udp_rtts(&eps[0], &eps[1], 60, Duration::from_millis(2), Duration::from_secs(2)).unwrap();
        assert_eq!(rtts.len(), 60, "TDF {tdf}: a probe was lost");
        rtts.sort();
        let median = rtts[rtts.len() / 2].as_secs_f64();
        // Two traversals of a 4 ms x TDF link, plus the stack (well under 1 ms).
        let want = 2.0 * 0.004 * tdf.as_f64();
        eprintln!(
            "TDF {tdf}: median real RTT {:.2} ms, {:.2} ms expected",
            median * 1e3,
            want * 1e3
        );
        assert!(
            median >= want && median < want + 0.003,
            "TDF {tdf}: median RTT {median:.4} s, expected {want:.4} s"
        );
    }
    lab.down().unwrap();
}
