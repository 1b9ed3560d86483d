//! `--prometheus`: a real Prometheus (Debian's `prometheus`) placed beside
//! the reflector, scraping the reflector's `/metrics` and the control
//! server's every second for the whole run, and asked at the end, through
//! its own HTTP API, whether both targets were up with no scrape error.
//! In the lab it runs on the reflector host through the lab's launcher,
//! and its API is read from inside that host's network namespace.

use crate::error::DemoError;
use crate::place::{Placement, Role};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Where Prometheus listens in the lab (a fresh namespace: the usual port).
pub const LAB_PORT: u16 = 9090;

/// What Prometheus scrapes and where it answers.
pub struct Targets {
    pub reflector: SocketAddr,
    pub control: SocketAddr,
    pub listen: SocketAddr,
}

/// What Prometheus said at the end of a run.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Scrapes of the reflector's `/metrics` it stored (`up` samples).
    pub reflector_scrapes: u64,
    /// `reflector_forwarded_total` at its last scrape.
    pub forwarded_seen: u64,
}

/// Writes the configuration and starts Prometheus for `t`, placed with
/// the reflector; `dir` holds its configuration and storage.
pub fn start(place: &Placement, bin: &Path, dir: &Path, t: &Targets) -> Result<Child, DemoError> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: reflector\n    static_configs:\n      - targets: [\"{}\"]\n  \
             - job_name: reflector-control\n    static_configs:\n      - targets: [\"{}\"]\n",
            t.reflector, t.control
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", config.display()))?;
    let log = dir.join("prometheus.log");
    let mut c = place.program(Role::Reflector, bin)?;
    c.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address={}", t.listen))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?);
    c.spawn().map_err(|e| {
        DemoError::from(format!(
            "cannot start {} ({e}): install Debian's prometheus package (scripts/install-deps.sh) or pass --prometheus PATH",
            bin.display()
        ))
    })
}

/// The last lines of Prometheus' log, for an error message.
pub fn log_tail(dir: &Path) -> String {
    let text = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(8).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Asks Prometheus until `within` is over whether both targets are up
/// with no scrape error, `up == 1` for both, and the reflector scraped at
/// least `min_scrapes` times; the verdict, or an error with its last
/// answers.
pub fn verify(place: &Placement, listen: SocketAddr, min_scrapes: u64, within: Duration) -> Result<Verdict, String> {
    let deadline = Instant::now() + within;
    loop {
        let last = match ask(place, listen, min_scrapes) {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(why)) | Err(why) => why,
        };
        if Instant::now() > deadline {
            return Err(format!(
                "Prometheus at {listen} did not confirm the scrapes within {within:?}: {last}"
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One look: `Err` when the API cannot be read, `Ok(Err)` with what is
/// not there yet.
fn ask(place: &Placement, listen: SocketAddr, min_scrapes: u64) -> Result<Result<Verdict, String>, String> {
    let json = |path: &str| -> Result<serde_json::Value, String> {
        let body = get(place, listen, path)?;
        serde_json::from_str(&body).map_err(|e| format!("{path}: not JSON ({e}): {body}"))
    };
    let targets = json("/api/v1/targets?state=active")?;
    let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
    if active.len() != 2 {
        return Ok(Err(format!("{} active targets, want 2: {targets}", active.len())));
    }
    for t in &active {
        if t["health"] != "up" || t["lastError"] != "" {
            return Ok(Err(format!(
                "target {} health {} last error {}",
                t["scrapeUrl"], t["health"], t["lastError"]
            )));
        }
    }
    let up = json("/api/v1/query?query=up")?;
    let ups = up["data"]["result"].as_array().cloned().unwrap_or_default();
    if ups.len() != 2 || !ups.iter().all(|r| r["value"][1] == "1") {
        return Ok(Err(format!("up is not 1 for both targets: {up}")));
    }
    let scalar = |v: &serde_json::Value| -> u64 {
        v["data"]["result"][0]["value"][1]
            .as_str()
            .and_then(|s| s.parse::<f64>().ok())
            .map_or(0, |f| f as u64)
    };
    let scrapes = scalar(&json(
        "/api/v1/query?query=count_over_time(up%7Bjob%3D%22reflector%22%7D%5B1h%5D)",
    )?);
    if scrapes < min_scrapes {
        return Ok(Err(format!(
            "{scrapes} scrapes of the reflector so far, want {min_scrapes}"
        )));
    }
    let forwarded = scalar(&json("/api/v1/query?query=reflector_forwarded_total")?);
    Ok(Ok(Verdict {
        reflector_scrapes: scrapes,
        forwarded_seen: forwarded,
    }))
}

/// `GET path` from Prometheus, from where it runs (the reflector host's
/// namespace in the lab).
fn get(place: &Placement, listen: SocketAddr, path: &str) -> Result<String, String> {
    let url = format!("http://{listen}{path}");
    let fetch = move || -> Result<String, String> {
        ureq::get(&url)
            .timeout(Duration::from_secs(5))
            .call()
            .map_err(|e| format!("GET {url}: {e}"))?
            .into_string()
            .map_err(|e| format!("GET {url}: {e}"))
    };
    match place.reflector_netns() {
        None => fetch(),
        Some(ns) => oskit::netns::NetNs::open(&ns)
            .map_err(|e| format!("cannot open the reflector host's namespace {ns}: {e}"))?
            .run(fetch)
            .map_err(|e| format!("cannot enter the reflector host's namespace {ns}: {e}"))?,
    }
}

/// The Prometheus binary: the one given, or `prometheus` on PATH.
pub fn binary(given: &Path) -> Result<PathBuf, DemoError> {
    if given.components().count() > 1 {
        return if given.is_file() {
            Ok(given.to_owned())
        } else {
            Err(format!("--prometheus {}: no such file", given.display()).into())
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(given))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            DemoError::from(format!(
                "--prometheus: {} not found on PATH (Debian's prometheus package: scripts/install-deps.sh installs it)",
                given.display()
            ))
        })
}
