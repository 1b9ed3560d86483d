//! The demo in a lab, as `make demo` runs it as root: a netlab star built
//! through netlab's library, the reflector and control server on the
//! reflector host and the bots' sockets spread over the client hosts, all
//! started through the lab's launcher; nothing is left behind.

mod common;
use common::*;

/// Two client hosts, six bots, one backend.
const SMALL_LAB: &[&str] = &[
    "--where",
    "lab",
    "--clients",
    "2",
    "--bots",
    "6",
    "--backends",
    "sendmmsg",
];

#[test]
fn lab_demo_loses_nothing_and_leaves_nothing() {
    if !oskit::testing::root_or_skip("lab_demo_loses_nothing_and_leaves_nothing") {
        return;
    }
    let (all, rows) = short_run_without_loss(SMALL_LAB, 1);
    assert!(
        all.contains("in the lab (reflector on h1, bots over 2 client hosts)"),
        "{all}"
    );
    // Counted on the reflector's link too, and (checked in
    // short_run_without_loss) equal to what the reflector fanned out.
    assert!(all.contains("on wire"), "{all}");
    assert!(rows[0]["wire_data"].as_u64().is_some_and(|w| w > 0), "{rows:?}");
    // Payloads in clear: the capture of the reflector's link holds every
    // bot payload's marker, once in each DATA to the reflector and once
    // in each copy it fanned out (so the sealed test's 0 can fail).
    let r = &rows[0];
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(
        all.contains("clear payloads") && all.contains("Payloads (in clear)"),
        "{all}"
    );
    assert_eq!(n("wire_markers"), n("sent") + n("wire_data"), "{r}");
    assert!(
        n("markers_received") > 0 && n("markers_received") <= n("arrived"),
        "{r}"
    );
    assert_eq!(r["sealed"]["opened"], 0, "{r}");
    // The run's id, as netlab printed it: "netlab: run ID up: ...".
    let run = all
        .split("netlab: run ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in the output: {all}"));
    let prefix = netlab::plan::Naming::new(run).prefix();
    let left: Vec<String> = netlab::netns::our_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "namespaces left behind: {left:?}");
}

/// `--sealed`: every bot payload carries the run's marker, yet a byte scan
/// of every frame captured on the reflector's link, both ways, finds none,
/// while DATA crossed it in numbers and the bots opened what they received
/// and found their senders' markers inside (issue 29's "a capture of a lab
/// run contains none of them"). The clear run above finds them. Checkpoints
/// stay on: uploaded sealed and signed, and every one fetched came back
/// signed by a certified member.
#[test]
fn lab_demo_sealed_leaves_no_marker_on_the_wire() {
    if !oskit::testing::root_or_skip("lab_demo_sealed_leaves_no_marker_on_the_wire") {
        return;
    }
    let (all, rows) = short_run_without_loss(&[SMALL_LAB, &["--sealed"]].concat(), 1);
    let r = &rows[0];
    let n = |k: &str| r[k].as_u64().unwrap_or_else(|| panic!("{k} in {r}"));
    assert!(
        all.contains("sealed payloads") && all.contains("Payloads (sealed end to end)"),
        "{all}"
    );
    assert!(all.contains("OK: sealed: no payload's marker"), "{all}");
    assert_eq!(n("wire_markers"), 0, "{r}");
    assert_eq!(n("wire_truncated"), 0, "{r}");
    // Data captured: the bots' DATA in and the copies out, every one.
    assert!(n("wire_data") >= 50 && n("sent") >= 50, "{r}");
    assert!(n("wire_packets") >= n("sent") + n("wire_data"), "{r}");
    // Delivered and opened, the markers inside.
    let opened = r["sealed"]["opened"].as_u64().unwrap();
    assert!(
        n("markers_received") > 0 && n("markers_received") <= n("arrived"),
        "{r}"
    );
    assert_eq!(n("markers_received"), opened, "{r}");
    for refused in ["malformed", "version", "no_key", "replay", "bad"] {
        assert_eq!(r["sealed"][refused], 0, "{refused}: {r}");
    }
    // The run's tables, for `--nocapture`.
    eprintln!("{all}");
    assert!(all.contains("Checkpoints: stored and served"), "{all}");
    assert!(n("checkpoints_stored") > 0 && n("checkpoints_served") > 0, "{r}");
    // Every fetch the bots completed came back signed (one still on its
    // way as the run ends is served and never counted); one that was not
    // signed would have been refused, an error.
    assert!(
        n("checkpoint_signed") > 0 && n("checkpoint_signed") <= n("checkpoints_served"),
        "{r}"
    );
    assert_eq!((n("errors"), n("checkpoint_mismatched")), (0, 0), "{r}");
}

/// The reflector, the control server and the bots under virtual time (TDF
/// 4, every process under the vtime shim through the lab's launcher): a
/// loss-free exchange, counted on the wire too.
#[test]
fn lab_demo_under_tdf_4_loses_nothing() {
    if !oskit::testing::root_or_skip("lab_demo_under_tdf_4_loses_nothing") {
        return;
    }
    let (all, rows) = short_run_without_loss(&[SMALL_LAB, &["--tdf", "4"]].concat(), 1);
    assert!(all.contains("at TDF 4"), "{all}");
    assert!(rows[0]["wire_data"].as_u64().is_some_and(|w| w > 0), "{rows:?}");
}

/// The same scenario with the in-kernel fan-out: the bots see exactly what
/// they see with the user-space backends, the reflector's counters (read
/// from the program's maps) match what they received, and the wire count
/// matches what it fanned out.
#[test]
fn lab_demo_with_the_ebpf_backend_loses_nothing() {
    if !oskit::testing::root_or_skip("lab_demo_with_the_ebpf_backend_loses_nothing") {
        return;
    }
    let args = ["--where", "lab", "--clients", "2", "--bots", "6", "--backends", "ebpf"];
    let (all, rows) = short_run_without_loss(&args, 1);
    assert_eq!(rows[0]["backend"], "ebpf", "{all}");
    assert!(rows[0]["wire_data"].as_u64().is_some_and(|w| w > 0), "{rows:?}");
}

/// `--prometheus`: a real Prometheus (Debian's), started on the reflector
/// host through the lab's launcher, scrapes the demo's reflector and its
/// control server: both up (`up == 1`), no scrape error, and what it last
/// saw of the reflector's forwarded counter is no more than the reflector
/// forwarded in all.
#[test]
fn lab_demo_scraped_by_a_real_prometheus() {
    if !oskit::testing::root_or_skip("lab_demo_scraped_by_a_real_prometheus") {
        return;
    }
    let found = std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
            "prometheus not found (Debian package prometheus; scripts/install-deps.sh) and REQUIRE_ROOT_TESTS=1"
        );
        eprintln!("skipped: prometheus not found (install Debian's prometheus package: scripts/install-deps.sh)");
        return;
    }
    let (all, rows) = short_run_without_loss(&[SMALL_LAB, &["--prometheus"]].concat(), 1);
    assert!(
        all.contains("Prometheus at 10.0.0.1:9090 scraped the reflector") && all.contains("both up, no scrape error"),
        "{all}"
    );
    let scrapes = rows[0]["prometheus_scrapes"].as_u64().unwrap_or(0);
    assert!(scrapes >= 2, "{rows:?}");
    let seen = rows[0]["prometheus_forwarded_seen"].as_u64().unwrap();
    assert!(seen <= rows[0]["forwarded"].as_u64().unwrap(), "{rows:?}");
    let left = std::process::Command::new("pgrep")
        .args(["-f", "storage.tsdb.path=.*prometheus-sendmmsg"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "Prometheus left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}
