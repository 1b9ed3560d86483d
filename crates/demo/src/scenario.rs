//! One run of the scenario per backend: a reflector, a control server and
//! one bots process, placed on loopback or in lab hosts, and the table.
//!
//! Children are held by an RAII guard that stops them (SIGTERM, then
//! SIGKILL) on every way out: success, error, Ctrl-C or panic. The
//! reflector's CPU time is its user+sys from `getrusage(RUSAGE_CHILDREN)`
//! taken just before and after reaping it (only it is reaped in between),
//! divided by the datagrams the bots received; `ip netns exec` execs the
//! program, so the reflector is our direct child in the lab too.

use crate::error::DemoError;
use crate::place::{Placement, Role};
use crate::DemoArgs;
use nix::sys::resource::{getrusage, UsageWho};
use oskit::child::ChildGuard;
use reflector_bots::BotsReport;
use reflector_server::backend::BackendKind;
use serde::Serialize;
use std::fmt::Write as _;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One line of the demo table.
#[derive(Debug, Clone, Serialize)]
pub struct DemoRow {
    pub backend: String,
    pub sent: u64,
    pub forwarded: u64,
    pub fanned_out: u64,
    pub expected: u64,
    pub received: u64,
    /// Arrivals beyond the distinct required ones (see the bots' ledger):
    /// a datagram that came again, one in the uncertain start of a
    /// membership (join retried), one outside every membership window.
    pub duplicates: u64,
    pub uncertain: u64,
    pub unexpected: u64,
    /// Every DATA that reached a bot socket: received + duplicates +
    /// uncertain + unexpected; equals `fanned_out` when nothing is lost.
    pub arrived: u64,
    pub lost: u64,
    pub errors: u64,
    pub group_changes: u64,
    pub reflector_cpu_s: f64,
    pub cpu_ns_per_delivered: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// Everything the reflector fanned out reached a bot socket.
    pub counters_match: bool,
    /// DATA datagrams seen leaving the reflector on its link (lab only).
    pub wire_data: Option<u64>,
    /// Every frame captured on the reflector's link, both ways (lab only).
    pub wire_packets: Option<u64>,
    /// Occurrences of the run's marker prefix in those frames, scanned
    /// whole (lab only): 0 when the payloads are sealed.
    pub wire_markers: Option<u64>,
    /// Frames kept shorter than they were (a scan would miss their tail).
    pub wire_truncated: Option<u64>,
    /// DATA the bots received carrying their sender's marker.
    pub markers_received: u64,
    /// The bots' clients' counters of sealed DATA: opened, and refused at
    /// each receiving step (all zero in clear groups).
    pub sealed: reflector_bots::SealedTally,
    /// Checkpoints: stored by the reflector, served to joiners (count and
    /// bytes), the bots' fetch time, and their checks of what they fetched.
    pub checkpoints_stored: u64,
    pub checkpoints_served: u64,
    pub checkpoint_bytes_served: u64,
    pub checkpoint_fetch_ms_mean: f64,
    pub checkpoint_fetch_ms_max: f64,
    /// Fetched checkpoints that came signed by a certified member (sealed
    /// groups; 0 in clear ones).
    pub checkpoint_signed: u64,
    pub checkpoint_entries_matched: u64,
    pub checkpoint_entries_moved: u64,
    pub checkpoint_mismatched: u64,
    /// With `--prometheus`: the scrapes of the reflector Prometheus stored
    /// (every one up, with no error) and `reflector_forwarded_total` at
    /// the last of them.
    pub prometheus_scrapes: Option<u64>,
    pub prometheus_forwarded_seen: Option<u64>,
}

/// Child processes, each stopped (SIGTERM, then SIGKILL) when this goes
/// out of scope.
struct Children {
    procs: Vec<(&'static str, ChildGuard)>,
}

impl Children {
    fn new() -> Children {
        Children { procs: Vec::new() }
    }

    fn add(&mut self, name: &'static str, c: Child) {
        self.procs.push((name, ChildGuard::new(c)));
    }

    fn get(&mut self, name: &str) -> Option<&mut Child> {
        self.procs.iter_mut().find(|(n, _)| *n == name).map(|(_, c)| c.child())
    }

    fn take(&mut self, name: &str) -> Option<ChildGuard> {
        let i = self.procs.iter().position(|(n, _)| *n == name)?;
        Some(self.procs.remove(i).1)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        // Last started, first stopped: the bots before their reflector.
        while self.procs.pop().is_some() {}
    }
}

/// A temporary directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// Private to its owner: it holds the run's secrets.
    pub fn new() -> Result<TempDir, DemoError> {
        use std::os::unix::fs::DirBuilderExt;
        let mut rnd = [0u8; 6];
        getrandom::getrandom(&mut rnd).map_err(|e| format!("no random source: {e}"))?;
        let p = std::env::temp_dir().join(format!("reflector-demo-{}-{}", std::process::id(), hex::encode(rnd)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(|e| format!("cannot create {}: {e}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cpu_children() -> f64 {
    getrusage(UsageWho::RUSAGE_CHILDREN).map_or(0.0, |r| {
        let tv = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
        tv(r.user_time()) + tv(r.system_time())
    })
}

/// `n` UDP ports on 127.0.0.1 that are free now (held together so they differ).
fn free_udp_ports(n: usize) -> Result<Vec<u16>, DemoError> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("cannot find free UDP ports on 127.0.0.1: {e}"))?;
    let mut ports = socks
        .iter()
        .map(|s| s.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("getsockname: {e}"))?;
    ports.sort_unstable();
    Ok(ports)
}

fn free_tcp_port() -> Result<u16, DemoError> {
    Ok(TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("cannot find a free TCP port on 127.0.0.1: {e}"))?
        .port())
}

/// True once the reflector child has bound every one of `ports`, read from
/// its `/proc` tables so that probing has no side effect on the ports.
fn udp_ports_bound(pid: u32, ports: &[u16]) -> bool {
    // Cannot tell: the bots' join retries cover a late start.
    oskit::procfs::bound_ports(pid, "udp", None).is_none_or(|b| ports.iter().all(|p| b.contains(p)))
}

/// True once the control child listens on `port` (TCP state 0A = LISTEN).
fn tcp_listening(pid: u32, port: u16) -> bool {
    oskit::procfs::bound_ports(pid, "tcp", Some("0A")).is_none_or(|b| b.contains(&port))
}

fn wait_until(
    what: &str,
    stop: &AtomicBool,
    children: &mut Children,
    mut ok: impl FnMut() -> bool,
) -> Result<(), DemoError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if ok() {
            return Ok(());
        }
        if stop.load(Relaxed) {
            return Err("interrupted".into());
        }
        for (name, c) in children.procs.iter_mut() {
            if let Ok(Some(st)) = c.child().try_wait() {
                return Err(format!(
                    "the {name} child exited early ({st}) while waiting for {what}; see its messages above"
                )
                .into());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after 10 s waiting for {what}").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ports_arg(ports: &[u16]) -> String {
    ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
}

/// One backend's run, everything it needs.
pub struct Scenario<'a> {
    pub args: &'a DemoArgs,
    pub place: &'a Placement,
    pub reflector_bin: PathBuf,
    /// `capture`, to count on the reflector's link (lab only).
    pub capture_bin: Option<PathBuf>,
    /// A real Prometheus to scrape the reflector and the control server
    /// (`--prometheus`).
    pub prometheus_bin: Option<PathBuf>,
    pub dir: &'a Path,
    pub secret: PathBuf,
    /// The player-ticket key file (control verifies, bots sign).
    pub ticket_keys: PathBuf,
    /// `--sealed`: the control server's sealing secret file.
    pub sealing_secret: Option<PathBuf>,
    /// The run's marker prefix, in every bot payload.
    pub marker: [u8; 8],
}

impl Scenario<'_> {
    pub fn run(&self, backend: BackendKind, stop: &AtomicBool) -> Result<DemoRow, DemoError> {
        let a = self.args;
        let groups = a.groups as usize;
        let in_lab = self.place.in_lab();
        // A lab host is a fresh namespace: the usual ports are free there.
        let base_port = a.base_port.or(in_lab.then_some(4000));
        let ports = match base_port {
            Some(b) => {
                let last = u32::from(b) + a.groups as u32 - 1;
                if b == 0 || last > 65535 {
                    return Err(format!("--base-port {b} with {groups} groups runs past port 65535").into());
                }
                (b..=last as u16).collect()
            }
            None => free_udp_ports(groups)?,
        };
        let control_port = match (a.control_port, in_lab) {
            (Some(p), _) => p,
            (None, true) => 8700,
            (None, false) => free_tcp_port()?,
        };
        let host = self.place.reflector_addr();
        let control = SocketAddr::new(host, control_port);
        let summary = self.dir.join(format!("summary-{backend}.json"));
        let mut children = Children::new();

        let mut serve = self.place.command(Role::Reflector, &self.reflector_bin, "serve")?;
        serve
            .args([
                "--bind",
                &host.to_string(),
                "--ports",
                &ports_arg(&ports),
                "--backend",
                backend.name(),
                "--receive",
                a.receive.name(),
            ])
            .arg("--secret-file")
            .arg(&self.secret)
            .arg("--summary-json")
            .arg(&summary)
            .stdout(Stdio::null());
        if let Some(t) = a.threads {
            serve.args(["--threads", &t.to_string()]);
        }
        let metrics = match (&self.prometheus_bin, in_lab) {
            (None, _) => None,
            (Some(_), true) => Some(SocketAddr::new(host, 9100)),
            (Some(_), false) => Some(SocketAddr::new(host, free_tcp_port()?)),
        };
        if let Some(m) = metrics {
            serve.args(["--metrics", &m.to_string()]);
        }
        if !backend.loopback() {
            // A fallback to user space would mislabel the row.
            serve.arg("--strict-backend");
        }
        if self.sealing_secret.is_some() {
            // Every group: the reflector only announces it, holding no key.
            serve.args(["--data-sealed", "on"]);
        }
        if a.checkpoint_every > 0.0 {
            let port = if in_lab { 8701 } else { free_tcp_port()? };
            serve.args(["--checkpoint-port", &port.to_string()]).args([
                "--checkpoint-every",
                &format!("{}ms", (a.checkpoint_every * 1000.0).round().max(100.0) as u64),
            ]);
        }
        children.add(
            "reflector",
            serve.spawn().map_err(|e| format!("cannot start the reflector: {e}"))?,
        );

        let mut ctl = self.place.command(Role::Reflector, &self.reflector_bin, "control")?;
        ctl.args(["--listen", &control.to_string(), "--grid", &a.grid])
            // The lab's links are ours: plain HTTP is fine on its addresses.
            .arg("--insecure-http")
            .arg("--reflector")
            .arg(format!("{host}:{}", ports_arg(&ports)))
            .arg("--secret-file")
            .arg(&self.secret)
            // Players are authenticated: the bots sign tickets with this key,
            // as the game's backend would. All bots ask from one host.
            .arg("--ticket-keys")
            .arg(&self.ticket_keys)
            .args(["--ticket-rate-ip", "10000"])
            .stdout(Stdio::null());
        if let Some(sealing) = &self.sealing_secret {
            ctl.arg("--sealing-secret-file")
                .arg(sealing)
                .args(["--world", "reflector-demo"]);
        }
        children.add(
            "control",
            ctl.spawn()
                .map_err(|e| format!("cannot start the control server: {e}"))?,
        );

        let refl_pid = children.get("reflector").map_or(0, |c| c.id());
        wait_until("the reflector's ports", stop, &mut children, || {
            udp_ports_bound(refl_pid, &ports)
        })?;
        let ctl_pid = children.get("control").map_or(0, |c| c.id());
        wait_until("the control server", stop, &mut children, || {
            tcp_listening(ctl_pid, control_port)
        })?;

        let prometheus = match (&self.prometheus_bin, metrics) {
            (Some(bin), Some(reflector)) => {
                let listen = SocketAddr::new(
                    host,
                    if in_lab {
                        crate::prom::LAB_PORT
                    } else {
                        free_tcp_port()?
                    },
                );
                let dir = self.dir.join(format!("prometheus-{backend}"));
                let targets = crate::prom::Targets {
                    reflector,
                    control,
                    listen,
                };
                children.add("prometheus", crate::prom::start(self.place, bin, &dir, &targets)?);
                Some((listen, dir))
            }
            _ => None,
        };

        // The wire count starts before the first datagram can flow. No
        // filter: everything on the link, both ways, is scanned for
        // markers; a capture that lost a packet fails the run.
        let pcap = self.dir.join(format!("wire-{backend}.pcap"));
        let tap = match (&self.capture_bin, self.place.reflector_iface(), host) {
            (Some(bin), Some(iface), std::net::IpAddr::V4(ip)) => {
                let log = self.dir.join(format!("capture-{backend}.log"));
                let mut c = self.place.program(Role::Reflector, bin)?;
                c.args(["-i", &iface, "-q", "--fail-on-loss", "-w"])
                    .arg(&pcap)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?);
                children.add(
                    "capture",
                    c.spawn()
                        .map_err(|e| format!("cannot start capture on the reflector's link: {e}"))?,
                );
                let pid = children.get("capture").map_or(0, |c| c.id());
                wait_until("the wire capture", stop, &mut children, || {
                    oskit::procfs::has_bound_packet_socket(pid)
                })?;
                Some((ip, log))
            }
            _ => None,
        };

        let mut bots = self.place.command(Role::Bots, &self.reflector_bin, "bots")?;
        let bots_netns = self.place.bots_netns();
        if !bots_netns.is_empty() {
            bots.arg("--netns").arg(bots_netns.join(","));
        }
        bots.arg("--ticket-keys").arg(&self.ticket_keys);
        bots.args([
            "--control",
            &format!("http://{control}"),
            "--count",
            &a.bots.to_string(),
            "--duration",
            &a.duration.to_string(),
            "--rate",
            &a.rate.to_string(),
            "--size",
            &a.size().to_string(),
            "--marker",
            &hex::encode(self.marker),
            "--move-every",
            &a.move_every.to_string(),
            "--bind",
            if in_lab { "0.0.0.0" } else { "127.0.0.1" },
            "--seed",
            &a.seed.to_string(),
            "--json",
        ])
        .stdout(Stdio::piped());
        let mut child = bots.spawn().map_err(|e| format!("cannot start the bots: {e}"))?;
        // Read the report on a thread so a full pipe never blocks the child.
        let mut out = child.stdout.take().ok_or("bots child has no stdout")?;
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s);
            s
        });
        children.add("bots", child);
        eprintln!(
            "demo [{backend}]: {} bots, {} s, {} Hz x {} B, moves every {} s, {groups} groups, control {control}",
            a.bots,
            a.duration,
            a.rate,
            a.size(),
            a.move_every
        );
        // The bots count virtual seconds; this process counts real ones.
        let limit = Instant::now() + Duration::from_secs_f64(a.duration * f64::from(a.tdf) + 60.0);
        loop {
            if stop.load(Relaxed) {
                return Err("interrupted".into());
            }
            let c = children.get("bots").ok_or("bots child vanished")?;
            if c.try_wait()
                .map_err(|e| format!("waiting for the bots: {e}"))?
                .is_some()
            {
                break;
            }
            if Instant::now() > limit {
                return Err("the bots ran far past their duration; stopped".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        children.take("bots");
        let text = reader.join().unwrap_or_default();
        // Asked while the reflector still serves: at least two scrapes.
        let prometheus = match prometheus {
            Some((listen, dir)) => {
                let v = crate::prom::verify(self.place, listen, 2, Duration::from_secs(20))
                    .map_err(|why| format!("{why}\nPrometheus' log ends:\n{}", crate::prom::log_tail(&dir)))?;
                eprintln!(
                    "demo [{backend}]: Prometheus at {listen} scraped the reflector ({} scrapes) and the control \
                     server: both up, no scrape error; it last saw reflector_forwarded_total {}",
                    v.reflector_scrapes, v.forwarded_seen
                );
                Some(v)
            }
            None => None,
        };
        let report: BotsReport = serde_json::from_str(&text)
            .map_err(|e| format!("cannot read the bots' JSON report ({e}); see their messages above"))?;

        // The capture drains what is queued and completes its file on SIGTERM.
        let wire = match tap {
            Some((ip, log)) => {
                let mut cap = children.take("capture").ok_or("capture child vanished")?;
                let st = oskit::child::stop(cap.child(), Duration::from_secs(10));
                if !st.is_some_and(|s| s.success()) {
                    let text = std::fs::read_to_string(&log).unwrap_or_default();
                    return Err(format!("the wire capture exited with {st:?}: {}", text.trim()).into());
                }
                Some(crate::wire::scan(&pcap, ip, &ports, &self.marker)?)
            }
            None => None,
        };
        let wire_data = wire.as_ref().map(|w| w.data);

        // Only the reflector is reaped between these two readings.
        let before = cpu_children();
        let mut refl = children.take("reflector").ok_or("reflector child vanished")?;
        let st = oskit::child::stop(refl.child(), Duration::from_secs(5));
        let cpu = cpu_children() - before;
        if !st.is_some_and(|s| s.success()) {
            return Err(format!("the reflector exited with {st:?}").into());
        }
        let summary: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&summary)
                .map_err(|e| format!("cannot read the reflector summary {}: {e}", summary.display()))?,
        )?;
        let total = &summary["total"];
        let num = |k: &str| total[k].as_u64().unwrap_or(0);
        let fanned_out = num("fanned_out");
        let t = &report.total;
        let arrived = t.received + t.duplicates + t.uncertain + t.unexpected;
        Ok(DemoRow {
            backend: backend.to_string(),
            sent: t.sent,
            forwarded: num("forwarded"),
            fanned_out,
            expected: t.expected,
            received: t.received,
            duplicates: t.duplicates,
            uncertain: t.uncertain,
            unexpected: t.unexpected,
            arrived,
            lost: report.lost,
            errors: report.error_count,
            group_changes: report.group_changes,
            reflector_cpu_s: cpu,
            cpu_ns_per_delivered: if arrived > 0 { cpu * 1e9 / arrived as f64 } else { 0.0 },
            p50_us: report.latency.p50_us,
            p99_us: report.latency.p99_us,
            max_us: report.latency.max_us,
            counters_match: fanned_out == arrived
                && num("forwarded") == t.sent
                && wire_data.is_none_or(|w| w == fanned_out),
            wire_data,
            wire_packets: wire.as_ref().map(|w| w.packets),
            wire_markers: wire.as_ref().map(|w| w.markers),
            wire_truncated: wire.as_ref().map(|w| w.truncated),
            markers_received: report.markers_received,
            sealed: report.sealed,
            checkpoints_stored: num("checkpoints_stored"),
            checkpoints_served: num("checkpoints_served"),
            checkpoint_bytes_served: num("checkpoint_bytes_served"),
            checkpoint_fetch_ms_mean: report.checkpoints.fetch_ms_mean,
            checkpoint_fetch_ms_max: report.checkpoints.fetch_ms_max,
            checkpoint_signed: report.checkpoints.fetched_signed,
            checkpoint_entries_matched: report.checkpoints.entries_matched,
            checkpoint_entries_moved: report.checkpoints.entries_moved,
            checkpoint_mismatched: report.checkpoints.mismatched,
            prometheus_scrapes: prometheus.as_ref().map(|v| v.reflector_scrapes),
            prometheus_forwarded_seen: prometheus.as_ref().map(|v| v.forwarded_seen),
        })
    }
}

/// How a row's counters must add up; printed under the delivery table so
/// the arithmetic can be checked on screen.
pub const RECONCILE: &str = "  counters `match` when forwarded = sent, arrived = fanned out (= on wire, in the lab), \
and arrived = received + dup + uncertain + unexpected;\n  lost = expected - received (datagrams owed to a bot while \
it was a member that never came)";

/// The delivery table: what the reflector counted against what the bots
/// counted, with every column the reconciliation needs.
pub fn table(rows: &[DemoRow]) -> String {
    let mut out = String::from("Delivery: reflector counters against bot counters\n");
    let _ = writeln!(
        out,
        "{:>9} {:>8} {:>9} {:>10} {:>9} | {:>9} {:>5} {:>9} {:>10} {:>9} {:>8} | {:>9} {:>5}",
        "backend",
        "sent",
        "forwarded",
        "fanned out",
        "on wire",
        "received",
        "dup",
        "uncertain",
        "unexpected",
        "arrived",
        "counters",
        "expected",
        "lost"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>9} {:>8} {:>9} {:>10} {:>9} | {:>9} {:>5} {:>9} {:>10} {:>9} {:>8} | {:>9} {:>5}",
            r.backend,
            r.sent,
            r.forwarded,
            r.fanned_out,
            r.wire_data.map_or_else(|| "-".to_string(), |w| w.to_string()),
            r.received,
            r.duplicates,
            r.uncertain,
            r.unexpected,
            r.arrived,
            if r.counters_match { "match" } else { "DIFFER" },
            r.expected,
            r.lost,
        );
    }
    let _ = writeln!(out, "{RECONCILE}");
    out
}

/// The cost and latency table: the reflector's CPU per datagram that
/// arrived, and the bots' one-way latency.
pub fn cost_table(rows: &[DemoRow]) -> String {
    let mut out = String::from("Cost and latency\n");
    let _ = writeln!(
        out,
        "{:>9} {:>7} {:>13} {:>9} {:>14} {:>9} {:>9} {:>9}",
        "backend", "moves", "reflector cpu", "arrived", "cpu/arrived", "p50", "p99", "max"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>9} {:>7} {:>11.3} s {:>9} {:>11.0} ns {:>6.0} us {:>6.0} us {:>6.0} us",
            r.backend,
            r.group_changes,
            r.reflector_cpu_s,
            r.arrived,
            r.cpu_ns_per_delivered,
            r.p50_us,
            r.p99_us,
            r.max_us,
        );
    }
    out
}

/// The checkpoints of each run: what the reflector stored and served, how
/// long the bots' fetches took, and how their checks came out.
pub fn checkpoint_table(rows: &[DemoRow]) -> String {
    let mut out =
        String::from("Checkpoints: stored and served by the reflector, fetched and checked by joining bots\n");
    let _ = writeln!(
        out,
        "{:>9} {:>8} {:>8} {:>7} {:>10} {:>11} {:>10} {:>8} {:>6} {:>10}",
        "backend", "stored", "served", "signed", "bytes", "fetch mean", "fetch max", "matched", "moved", "mismatched"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>9} {:>8} {:>8} {:>7} {:>10} {:>8.1} ms {:>7.1} ms {:>8} {:>6} {:>10}",
            r.backend,
            r.checkpoints_stored,
            r.checkpoints_served,
            r.checkpoint_signed,
            r.checkpoint_bytes_served,
            r.checkpoint_fetch_ms_mean,
            r.checkpoint_fetch_ms_max,
            r.checkpoint_entries_matched,
            r.checkpoint_entries_moved,
            r.checkpoint_mismatched
        );
    }
    out
}

/// What a run's payloads showed: the capture's frames and the markers in
/// them, the marked DATA the bots received, and the bots' sealed counters.
pub fn payload_table(rows: &[DemoRow], sealed: bool, marker: &[u8; 8]) -> String {
    let mut out = format!(
        "Payloads ({}): marker prefix {} in every bot payload; the capture of the reflector's link scanned whole\n",
        if sealed { "sealed end to end" } else { "in clear" },
        hex::encode(marker)
    );
    let _ = writeln!(
        out,
        "{:>9} {:>9} {:>9} {:>8} | {:>8} {:>8} | {:>9} {:>7} {:>7} {:>6} {:>6}",
        "backend",
        "captured",
        "truncated",
        "markers",
        "marked",
        "opened",
        "malformed",
        "version",
        "no key",
        "replay",
        "bad"
    );
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    for r in rows {
        let z = &r.sealed;
        let _ = writeln!(
            out,
            "{:>9} {:>9} {:>9} {:>8} | {:>8} {:>8} | {:>9} {:>7} {:>7} {:>6} {:>6}",
            r.backend,
            opt(r.wire_packets),
            opt(r.wire_truncated),
            opt(r.wire_markers),
            r.markers_received,
            z.opened,
            z.malformed,
            z.version,
            z.no_key,
            z.replay,
            z.bad
        );
    }
    let _ = writeln!(
        out,
        "  captured: frames on the reflector's link, both ways; markers: the prefix's occurrences in them{};\n  \
         marked: DATA the bots received with their sender's marker; opened, and refused by step: the bots' \
         clients' sealed DATA",
        if sealed {
            " (must be 0)"
        } else {
            " (clear payloads show it)"
        }
    );
    out
}

/// Why a row fails the payload checks: a capture that cannot be trusted
/// to have seen everything, and in a sealed run a marker on the wire or
/// no DATA captured to look at.
pub fn payload_faults(r: &DemoRow, sealed: bool) -> Vec<String> {
    let mut out = Vec::new();
    let b = &r.backend;
    if let Some(t) = r.wire_truncated.filter(|t| *t > 0) {
        out.push(format!(
            "[{b}] {t} captured frame(s) truncated: their tails were not scanned"
        ));
    }
    if !sealed {
        return out;
    }
    if let Some(m) = r.wire_markers.filter(|m| *m > 0) {
        out.push(format!(
            "[{b}] sealed run, yet the run's marker appears {m} time(s) in the capture: payloads crossed in clear"
        ));
    }
    if r.wire_data == Some(0) {
        out.push(format!(
            "[{b}] sealed run, but no DATA was captured on the reflector's link: 0 markers proves nothing"
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn bound_ports_are_seen_in_proc() {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        let p = s.local_addr().unwrap().port();
        let me = std::process::id();
        assert!(udp_ports_bound(me, &[p]));
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tp = l.local_addr().unwrap().port();
        assert!(tcp_listening(me, tp));
        drop(l);
        assert!(!tcp_listening(me, tp));
        drop(s);
        assert!(!udp_ports_bound(me, &[p]));
        let free = free_udp_ports(3).unwrap();
        assert_eq!(free.len(), 3);
        assert!(free.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ports_arg(&[1, 2, 30]), "1,2,30");
    }

    fn sample_row() -> DemoRow {
        DemoRow {
            backend: "sendto".into(),
            sent: 10,
            forwarded: 10,
            fanned_out: 90,
            expected: 90,
            received: 88,
            duplicates: 1,
            uncertain: 1,
            unexpected: 0,
            arrived: 90,
            lost: 0,
            errors: 0,
            group_changes: 3,
            reflector_cpu_s: 0.001,
            cpu_ns_per_delivered: 11111.0,
            p50_us: 50.0,
            p99_us: 99.0,
            max_us: 120.0,
            counters_match: true,
            wire_data: Some(90),
            wire_packets: Some(130),
            wire_markers: Some(0),
            wire_truncated: Some(0),
            markers_received: 88,
            sealed: reflector_bots::SealedTally {
                opened: 90,
                ..Default::default()
            },
            checkpoints_stored: 4,
            checkpoints_served: 3,
            checkpoint_bytes_served: 300,
            checkpoint_fetch_ms_mean: 1.5,
            checkpoint_fetch_ms_max: 2.5,
            checkpoint_signed: 0,
            checkpoint_entries_matched: 7,
            checkpoint_entries_moved: 1,
            checkpoint_mismatched: 0,
            prometheus_scrapes: None,
            prometheus_forwarded_seen: None,
        }
    }

    #[test]
    fn table_has_a_row_per_backend() {
        let row = sample_row();
        let ck = checkpoint_table(std::slice::from_ref(&row));
        assert!(ck.contains("1.5 ms") && ck.lines().count() == 3, "{ck}");
        assert!(ck.starts_with("Checkpoints"), "every table has a title: {ck}");
        let t = table(std::slice::from_ref(&row));
        assert!(t.starts_with("Delivery"), "{t}");
        // Title, header, one row, then the reconciliation rule.
        let data = t.lines().nth(2).unwrap();
        let cells: Vec<&str> = data.split_whitespace().filter(|c| *c != "|").collect();
        assert_eq!(
            cells,
            ["sendto", "10", "10", "90", "90", "88", "1", "1", "0", "90", "match", "90", "0"],
            "{t}"
        );
        // The columns shown add up as the printed rule says.
        let n = |i: usize| cells[i].parse::<u64>().unwrap();
        assert_eq!(n(5) + n(6) + n(7) + n(8), n(9), "{t}");
        assert_eq!(n(9), n(3), "{t}");
        assert!(t.contains(RECONCILE), "{t}");
        let c = cost_table(&[row]);
        assert!(
            c.starts_with("Cost") && c.contains("11111 ns") && c.contains("120 us"),
            "{c}"
        );
    }

    #[test]
    fn payload_checks_fail_a_sealed_run_with_markers_or_nothing_captured() {
        let clean = sample_row();
        assert!(payload_faults(&clean, true).is_empty());
        let t = payload_table(std::slice::from_ref(&clean), true, &[0xab; 8]);
        assert!(
            t.starts_with("Payloads (sealed end to end): marker prefix abababababababab"),
            "{t}"
        );
        let cells: Vec<&str> = t
            .lines()
            .nth(2)
            .unwrap()
            .split_whitespace()
            .filter(|c| *c != "|")
            .collect();
        assert_eq!(
            cells,
            ["sendto", "130", "0", "0", "88", "90", "0", "0", "0", "0", "0"],
            "{t}"
        );
        assert!(t.contains("(must be 0)"), "{t}");

        let mut leak = sample_row();
        leak.wire_markers = Some(3);
        let f = payload_faults(&leak, true);
        assert!(f.len() == 1 && f[0].contains("marker appears 3 time(s)"), "{f:?}");
        // In clear the markers are expected.
        assert!(payload_faults(&leak, false).is_empty());

        let mut empty = sample_row();
        empty.wire_data = Some(0);
        assert!(payload_faults(&empty, true)[0].contains("no DATA was captured"));
        let mut cut = sample_row();
        cut.wire_truncated = Some(1);
        assert!(payload_faults(&cut, false)[0].contains("truncated"));
        // No capture (loopback): nothing to check, nothing to fail.
        let mut lo = sample_row();
        (lo.wire_data, lo.wire_packets, lo.wire_markers, lo.wire_truncated) = (None, None, None, None);
        assert!(payload_faults(&lo, true).is_empty());
        let t = payload_table(&[lo], false, &[1; 8]);
        let cells: Vec<&str> = t.lines().nth(2).unwrap().split_whitespace().take(4).collect();
        assert_eq!(cells, ["sendto", "-", "-", "-"], "{t}");
        assert!(t.contains("(clear payloads show it)"), "{t}");
    }
}
