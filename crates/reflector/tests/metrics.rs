//! `/metrics` of the reflector and of the control server as a scraper sees
//! them: the classic text format unless `Accept` asks for OpenMetrics,
//! `/healthz` on the reflector's metrics listener, and `promtool check
//! metrics` (Debian's `prometheus` package) on both endpoints.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn secret_file() -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("reflector-metrics-test-{}-{}", std::process::id(), free_port()));
    std::fs::write(&p, "cd".repeat(32)).unwrap();
    p
}

/// A child process killed on drop, so a failed test leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `reflector serve` on a free UDP port of 127.0.0.1 (with `extra` flags)
/// and its metrics listener on the returned TCP port.
fn start_reflector(extra: &[&str]) -> (Proc, u16, u16) {
    let secret = secret_file();
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let group = udp.local_addr().unwrap().port();
    drop(udp);
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args([
            "serve",
            "--bind",
            "127.0.0.1",
            "--ports",
            &group.to_string(),
            "--threads",
            "1",
        ])
        .args(["--secret-file", secret.to_str().unwrap()])
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the reflector binary runs");
    let p = Proc(child);
    wait_listening(port);
    let _ = std::fs::remove_file(secret);
    (p, port, group)
}

/// `reflector control` (anonymous joins) on the returned port.
fn start_control() -> (Proc, u16) {
    let secret = secret_file();
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_reflector"))
        .args(["control", "--anonymous-joins", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--secret-file",
            secret.to_str().unwrap(),
            "--reflector",
            "127.0.0.1:4000-4003",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the reflector binary runs");
    let p = Proc(child);
    wait_listening(port);
    let _ = std::fs::remove_file(secret);
    (p, port)
}

/// One GET: (status, Content-Type, body).
fn get(port: u16, path: &str, accept: Option<&str>) -> (u16, String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("a header block");
    let code = head.get(9..12).and_then(|c| c.parse().ok()).expect("a status line");
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type").then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (code, ctype, body.to_string())
}

fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
        .parse()
        .unwrap()
}

/// What Prometheus 2.x sends.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

#[test]
fn the_reflector_serves_classic_text_unless_asked_and_healthz() {
    let (_p, port, _) = start_reflector(&[]);
    let (code, ctype, text) = get(port, "/metrics", None);
    assert_eq!(code, 200);
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    assert!(!text.contains("# EOF"), "{text}");
    assert!(text.contains("# TYPE reflector_received_total counter\n"), "{text}");
    assert!(text.contains("# TYPE reflector_rtt_seconds histogram\n"), "{text}");
    assert_eq!(value(&text, "reflector_received_total"), 0.0);
    assert!(text.contains("reflector_build_info{version=\""), "{text}");
    assert!(!text.contains("group="), "per-group series are off by default: {text}");
    assert!(value(&text, "process_resident_memory_bytes") > 0.0);
    assert!(value(&text, "process_open_fds") > 0.0);

    let (code, ctype, om) = get(port, "/metrics", Some(PROMETHEUS_ACCEPT));
    assert_eq!(code, 200);
    assert_eq!(ctype, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE reflector_received counter\n"), "{om}");

    let (_, ctype, _) = get(port, "/metrics", Some("text/plain;version=0.0.4"));
    assert!(ctype.starts_with("text/plain"), "{ctype}");

    let (code, _, body) = get(port, "/healthz", None);
    assert_eq!((code, body.as_str()), (200, "ok\n"));
}

#[test]
fn per_group_series_only_with_the_flag() {
    let (_p, port, group) = start_reflector(&["--metrics-per-group"]);
    let (_, _, text) = get(port, "/metrics", None);
    assert_eq!(
        value(&text, &format!("reflector_group_received_total{{group=\"{group}\"}}")),
        0.0
    );
    assert!(text.contains(&format!("reflector_group_rtt_seconds_count{{group=\"{group}\"}} 0\n")));
    assert_eq!(value(&text, "reflector_received_total"), 0.0);
}

#[test]
fn the_control_server_has_metrics() {
    let (_p, port) = start_control();
    let (code, ctype, first) = get(port, "/metrics", None);
    assert_eq!(code, 200);
    assert!(ctype.starts_with("text/plain; version=0.0.4"), "{ctype}");
    let n = value(&first, "reflector_control_http_requests_total");
    assert!(get(port, "/world", None).0 == 200);
    let (_, _, second) = get(port, "/metrics", None);
    assert_eq!(value(&second, "reflector_control_http_requests_total"), n + 2.0);
    assert!(second.contains("reflector_control_build_info{version=\""), "{second}");
    assert!(value(&second, "process_start_time_seconds") > 1.6e9);
    let (_, _, om) = get(port, "/metrics", Some(PROMETHEUS_ACCEPT));
    assert!(om.ends_with("# EOF\n"), "{om}");
}

/// `promtool`, or why the check is skipped; with REQUIRE_ROOT_TESTS=1 (CI)
/// a missing promtool fails the test.
fn promtool() -> Option<&'static str> {
    if Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return Some("promtool");
    }
    assert!(
        std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
        "promtool not found (Debian package prometheus; scripts/install-deps.sh) and REQUIRE_ROOT_TESTS=1"
    );
    eprintln!("skipped: promtool not found (install Debian's prometheus package: scripts/install-deps.sh)");
    None
}

fn promtool_check_metrics(promtool: &str, what: &str, text: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics on {what}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_both_endpoints() {
    let Some(promtool) = promtool() else { return };
    // promtool is not lenient: a known-bad exposition fails.
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"# HELP x_us_sum A counter without _total.\n# TYPE x_us_sum counter\nx_us_sum 1\n")
        .unwrap();
    assert!(
        !child.wait().unwrap().success(),
        "promtool should reject a counter without _total"
    );

    let (_r, rport, _) = start_reflector(&[]);
    let (_, _, text) = get(rport, "/metrics", None);
    promtool_check_metrics(promtool, "the reflector", &text);
    let (_r2, rport2, _) = start_reflector(&["--metrics-per-group"]);
    let (_, _, text) = get(rport2, "/metrics", None);
    promtool_check_metrics(promtool, "the reflector with per-group series", &text);
    let (_c, cport) = start_control();
    let (_, _, text) = get(cport, "/metrics", None);
    promtool_check_metrics(promtool, "the control server", &text);
}
