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

fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/prometheus")
}

#[test]
fn promtool_accepts_the_shipped_rules_and_config() {
    let Some(promtool) = promtool() else { return };
    for args in [["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"]] {
        let out = Command::new(promtool)
            .args(args)
            .current_dir(deploy_dir())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every `reflector_*` and `process_*` name in `text` (a metric name runs
/// over lower-case letters, digits and '_'; one ending in '_' is a prefix).
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_';
    for prefix in ["reflector_", "process_"] {
        for (i, _) in text.match_indices(prefix) {
            if i > 0 && (word(b[i - 1]) || b[i - 1].is_ascii_uppercase()) {
                continue;
            }
            let end = b[i..].iter().position(|&c| !word(c)).map_or(b.len(), |n| i + n);
            // A family prefix in prose ("reflector_group_*") is not a name.
            if !text[i..end].ends_with('_') {
                names.insert(text[i..end].to_string());
            }
        }
    }
    names
}

#[test]
fn the_rules_and_the_dashboard_read_only_served_metrics() {
    let (_r, rport, _) = start_reflector(&["--metrics-per-group"]);
    let (_c, cport) = start_control();
    let served = format!("{}{}", get(rport, "/metrics", None).2, get(cport, "/metrics", None).2);
    let is_served = |name: &str| {
        served
            .lines()
            .any(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with([' ', '{'])))
    };
    for file in ["alerts.yml", "grafana-dashboard.json"] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        let names = metric_names(&text);
        assert!(names.len() >= 8, "{file}: only {names:?}");
        let missing: Vec<&String> = names.iter().filter(|n| !is_served(n)).collect();
        assert!(missing.is_empty(), "{file} reads metrics nobody serves: {missing:?}");
    }
    // The check itself finds a name that is not served.
    assert!(!is_served("reflector_rtt_us_sum_total"));
}

/// One HTTP/1.0 GET (no chunked answers): the body if the status is 200.
fn get10(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.0 200").then(|| body.to_string())
}

/// Debian's `prometheus` on 127.0.0.1 (its own temp dir, a free port, 1 s
/// scrapes, the shipped alert rules) scraping a reflector and a control
/// server: both targets up with no scrape error, `up == 1` for both, and
/// every shipped rule evaluated without error.
#[test]
fn a_real_prometheus_scrapes_both_and_evaluates_the_rules() {
    let prometheus = "prometheus";
    if !Command::new(prometheus)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(
            std::env::var("REQUIRE_ROOT_TESTS").as_deref() != Ok("1"),
            "prometheus not found (Debian package prometheus; scripts/install-deps.sh) and REQUIRE_ROOT_TESTS=1"
        );
        eprintln!("skipped: prometheus not found (install Debian's prometheus package: scripts/install-deps.sh)");
        return;
    }
    let (_r, rport, _) = start_reflector(&[]);
    let (_c, cport) = start_control();
    let dir = std::env::temp_dir().join(format!(
        "reflector-prometheus-test-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    struct RmDir(std::path::PathBuf);
    impl Drop for RmDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmDir(dir.clone());
    let rules = deploy_dir().join("alerts.yml").canonicalize().unwrap();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {rules:?}\n\
             scrape_configs:\n  - job_name: reflector\n    static_configs:\n      - targets: [\"127.0.0.1:{rport}\"]\n  \
             - job_name: reflector-control\n    static_configs:\n      - targets: [\"127.0.0.1:{cport}\"]\n"
        ),
    )
    .unwrap();
    let port = free_port();
    let child = Command::new(prometheus)
        .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut prom = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let done = loop {
        if Instant::now() > deadline {
            break false;
        }
        if let Ok(Some(status)) = prom.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = prom.0.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("prometheus exited early: {status}\n{err}");
        }
        std::thread::sleep(Duration::from_millis(250));
        let (Some(targets), Some(up), Some(rules)) = (
            get10(port, "/api/v1/targets?state=active"),
            get10(port, "/api/v1/query?query=up"),
            get10(port, "/api/v1/rules"),
        ) else {
            continue;
        };
        last = format!("{targets}\n{up}\n{rules}");
        let targets: serde_json::Value = serde_json::from_str(&targets).unwrap();
        let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
        let targets_ok = active.len() == 2 && active.iter().all(|t| t["health"] == "up" && t["lastError"] == "");
        let up: serde_json::Value = serde_json::from_str(&up).unwrap();
        let ups = up["data"]["result"].as_array().cloned().unwrap_or_default();
        let up_ok = ups.len() == 2 && ups.iter().all(|r| r["value"][1] == "1");
        let rules: serde_json::Value = serde_json::from_str(&rules).unwrap();
        let all: Vec<serde_json::Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let rules_ok = !all.is_empty() && all.iter().all(|r| r["health"] == "ok");
        if targets_ok && up_ok && rules_ok {
            break true;
        }
    };
    let _ = prom.0.kill();
    let _ = prom.0.wait();
    let mut err = String::new();
    if let Some(mut e) = prom.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(
        done,
        "within 30 s: both targets up without scrape errors, up == 1, every rule healthy. Last answers:\n{last}\n\
         prometheus' log:\n{}",
        err.lines().rev().take(20).collect::<Vec<_>>().join("\n")
    );
}
