//! The fleet scenario (`reflector-fleet-lab`): several reflectors, several
//! control servers and one Redis in a netlab star, a thousand bots spread
//! over the client hosts, and the events a fleet must survive, each on a
//! schedule: `kill -9` of a reflector, a control server stopped, Redis
//! down for a while and started again empty, a reflector drained.
//!
//! Every process starts through the lab's launcher, so under `--tdf` all of
//! them (Redis too) run on the lab's virtual clock. This process is not
//! dilated: it keeps the schedule in real time (virtual × TDF) and reports
//! in virtual seconds.
//!
//! What it measures without asking the bots: every reflector's
//! `/metrics` is polled from a client host every `--poll` (members, copies
//! fanned out), which gives the delivered rate over time and, per event, the
//! players on the reflector it hit and when the fleet held every player
//! again (members summed over the live reflectors back to where they
//! were); the control servers' `/metrics` give their 429s and the `/join`s
//! they answered and failed (so whether `/join` was answered while Redis
//! was down, whatever the bots retried). The bots' JSON
//! report gives the exact owed loss, every lost datagram with its send
//! time and every player's move windows, on the clock this program stamps
//! its events on (the lab's virtual one under a TDF): per event, the
//! affected players, the recovery time and the loss inside and outside the
//! windows (`window_stats`), judged against the event's bound (`verdict`).
//!
//! This file keeps the run itself: the lab, the processes and the
//! schedule. What it builds on is in submodules that never refer back to
//! it: the command line, the metrics timeline, the processes' plumbing,
//! the analysis and the report.

mod analysis;
mod cli;
mod procs;
mod report;
mod timeline;

// Split out by role, but the public items keep their `demo::fleet::` paths.
pub use analysis::EventRow;
pub use cli::{check_redis_outages, parse_events, EventKind, FleetArgs};

use crate::error::DemoError;
use analysis::{analyse, counted, link_load, verdict, window_stats, Span, WIRE_OVERHEAD};
use cli::CONTROL_HOLD_S;
use netlab::lab::{Lab, LabOptions};
use netlab::scenario::LinkSpec;
use netlab::topo::Builtin;
use oskit::child::ChildGuard;
use procs::{addr_of, get, spawn, tail, wait_for, which, KeepLogs, Proc};
use reflector_bots::BotsReport;
use report::{event_table, write_csvs};
use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use timeline::{parse_control_metrics, parse_metrics, ControlPoll, ControlSample, Sample, Timeline};

/// The group ports of every reflector (each host has its own address).
const FIRST_PORT: u16 = 4000;
const CONTROL_PORT: u16 = 8700;
const CHECKPOINT_PORT: u16 = 8701;
const METRICS_PORT: u16 = 9100;
const REDIS_PORT: u16 = 6379;
/// The ACL the fleet's Redis is deployed with; the lab runs the same file.
const FLEET_ACL: &str = include_str!("../../../deploy/redis/fleet.acl");

/// Runs the scenario; returns the exit status.
pub fn run(args: FleetArgs, stop: &AtomicBool) -> Result<i32, DemoError> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the fleet lab needs root (network namespaces): run with sudo".into());
    }
    if !(args.duration.is_finite() && (5.0..=3600.0).contains(&args.duration)) {
        return Err(format!("--duration must be between 5 and 3600 seconds, got {}", args.duration).into());
    }
    reflector_control::parse_grid(&args.grid).map_err(|e| format!("--grid: {e}"))?;
    let events = parse_events(&args.events, args.duration)?;
    check_redis_outages(&events, args.redis_down, args.duration)?;
    let reflector_bin = crate::sibling(&args.reflector_bin, "reflector", "--reflector-bin")?;
    let netlab_bin = crate::sibling(&args.netlab_bin, "netlab", "--netlab-bin")?;
    let redis_bin = which(&args.redis_bin).ok_or_else(|| {
        format!(
            "--redis-bin {}: not found (Debian's redis-server package; `make deps` installs it)",
            args.redis_bin.display()
        )
    })?;

    let n_refl = args.reflectors as usize;
    let n_ctl = args.controls as usize;
    let n_cli = args.clients as usize;
    // Hosts of the star in order: reflectors, control servers, Redis, clients.
    let hosts = n_refl + n_ctl + 1 + n_cli;
    let host = |i: usize| format!("h{}", i + 1);
    let refl_hosts: Vec<String> = (0..n_refl).map(host).collect();
    let ctl_hosts: Vec<String> = (n_refl..n_refl + n_ctl).map(host).collect();
    let redis_host = host(n_refl + n_ctl);
    let client_hosts: Vec<String> = (n_refl + n_ctl + 1..hosts).map(host).collect();

    let spec = LinkSpec {
        bw: Some(args.bw.to_string()),
        ..Default::default()
    };
    let link = spec.apply_to("link", &Default::default())?;
    let mut topo = Builtin::Star { hosts }.build(&link);
    topo.name = format!("fleet ({n_refl} reflectors, {n_ctl} control servers, {n_cli} client hosts)");
    let mut o = LabOptions::new(&netlab_bin);
    o.scenario = "fleet".into();
    o.verbose = true;
    o.dilation.tdf = netlab::plan::Tdf::new(u64::from(args.tdf), 1).map_err(|e| format!("--tdf {}: {e}", args.tdf))?;
    let started = Instant::now();
    let lab = Lab::up(&topo, &o, stop)?;
    eprintln!("fleet: lab up in {:.1} s", started.elapsed().as_secs_f64());
    let outcome = run_in(
        &args,
        &events,
        &lab,
        &reflector_bin,
        &redis_bin,
        &refl_hosts,
        &ctl_hosts,
        &redis_host,
        &client_hosts,
        stop,
    );
    let t = lab.down()?;
    eprintln!("fleet: lab removed in {:.2}s", t.as_secs_f64());
    outcome
}

#[allow(clippy::too_many_arguments)]
fn run_in(
    args: &FleetArgs,
    events: &[(EventKind, f64)],
    lab: &Lab,
    reflector_bin: &Path,
    redis_bin: &Path,
    refl_hosts: &[String],
    ctl_hosts: &[String],
    redis_host: &str,
    client_hosts: &[String],
    stop: &AtomicBool,
) -> Result<i32, DemoError> {
    let tdf = f64::from(args.tdf);
    let dir = crate::scenario::TempDir::new()?;
    let d = &dir.0;
    // The logs are copied out on every way out of the run, errors included.
    let _keep = KeepLogs {
        from: d.clone(),
        to: args.logs.clone(),
    };
    let launcher = lab.launcher();
    let write = |name: &str, text: &str| -> Result<PathBuf, DemoError> {
        let p = d.join(name);
        std::fs::write(&p, text).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
        Ok(p)
    };
    let random_hex = || -> Result<String, DemoError> {
        let mut k = [0u8; 32];
        getrandom::getrandom(&mut k).map_err(|e| format!("no random source: {e}"))?;
        Ok(hex::encode(k))
    };
    let secret = write("secret", &random_hex()?)?;
    let ticket_keys = write(
        "tickets.toml",
        &format!(
            "[[key]]\nkid = \"fleet\"\nalg = \"HS256\"\nsecret_hex = \"{}\"\n",
            random_hex()?
        ),
    )?;
    let password = random_hex()?;
    let password_file = write("redis-password", &password)?;
    let digest = <sha2::Sha256 as sha2::Digest>::digest(password.as_bytes());
    let acl = write("fleet.acl", &FLEET_ACL.replace("PASSWORD_SHA256", &hex::encode(digest)))?;

    let redis_addr = addr_of(lab, redis_host)?;
    let redis_cmd = || -> Result<Command, DemoError> {
        let mut c = launcher.command(redis_host, &[redis_bin.as_os_str()])?;
        c.args(["--bind", &redis_addr.to_string(), "--port", &REDIS_PORT.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--protected-mode",
                "no",
            ])
            .arg("--aclfile")
            .arg(&acl)
            .arg("--dir")
            .arg(d);
        Ok(c)
    };
    let mut redis = spawn("redis", redis_cmd()?, &d.join("redis.log"))?;
    let redis_up =
        || std::net::TcpStream::connect_timeout(&(redis_addr, REDIS_PORT).into(), Duration::from_millis(200)).is_ok();
    let probe_ns = oskit::netns::NetNs::open(lab.ns_of(&client_hosts[0])?)
        .map_err(|e| format!("cannot open a client host's namespace: {e}"))?;
    wait_for("Redis", 10.0 * tdf, stop, || probe_ns.run(redis_up).unwrap_or(false))?;
    let registry = vec![
        "--registry".to_string(),
        format!("redis://fleet@{redis_addr}:{REDIS_PORT}"),
        "--registry-password-file".into(),
        password_file.to_string_lossy().into_owned(),
    ];
    let ports = format!("{FIRST_PORT}-{}", FIRST_PORT as u64 + args.groups - 1);

    let mut reflectors = Vec::new();
    let mut refl_addrs = Vec::new();
    for h in refl_hosts {
        let a = addr_of(lab, h)?;
        let mut c = launcher.command(h, &[reflector_bin.as_os_str()])?;
        c.arg("serve")
            .args([
                "--bind",
                &a.to_string(),
                "--advertise",
                &a.to_string(),
                "--ports",
                &ports,
            ])
            .arg("--secret-file")
            .arg(&secret)
            .args(&registry)
            .args(["--registry-ttl", &format!("{}ms", (args.registry_ttl * 1000.0) as u64)])
            .args([
                "--member-timeout",
                &format!("{}ms", (args.member_timeout * 1000.0) as u64),
            ])
            .args([
                "--drain-timeout",
                &format!("{}ms", (args.drain_timeout * 1000.0) as u64),
            ])
            .args(["--checkpoint-port", &CHECKPOINT_PORT.to_string()])
            .args(["--metrics", &format!("{a}:{METRICS_PORT}")])
            .env("RUST_LOG", "warn");
        reflectors.push(spawn(
            &format!("reflector on {h}"),
            c,
            &d.join(format!("reflector-{h}.log")),
        )?);
        refl_addrs.push(a);
    }
    let mut controls = Vec::new();
    let mut control_urls = Vec::new();
    for h in ctl_hosts {
        let a = addr_of(lab, h)?;
        let mut c = launcher.command(h, &[reflector_bin.as_os_str()])?;
        c.arg("control")
            .args([
                "--listen",
                &format!("{a}:{CONTROL_PORT}"),
                "--grid",
                &args.grid,
                "--insecure-http",
            ])
            .arg("--secret-file")
            .arg(&secret)
            .arg("--ticket-keys")
            .arg(&ticket_keys)
            .args(&registry)
            // Every bot of a client host asks from its address.
            .args(["--ticket-rate-ip", "100000"])
            .env("RUST_LOG", "warn");
        controls.push(spawn(
            &format!("control server on {h}"),
            c,
            &d.join(format!("control-{h}.log")),
        )?);
        control_urls.push(format!("http://{a}:{CONTROL_PORT}"));
    }
    for (i, a) in refl_addrs.iter().enumerate() {
        let url = format!("http://{a}:{METRICS_PORT}/metrics");
        wait_for(&format!("the reflector on {}", refl_hosts[i]), 20.0 * tdf, stop, || {
            probe_ns.run(|| get(&url).is_ok()).unwrap_or(false)
        })?;
    }
    for (i, u) in control_urls.iter().enumerate() {
        let url = format!("{u}/healthz");
        wait_for(
            &format!("the control server on {}", ctl_hosts[i]),
            20.0 * tdf,
            stop,
            || probe_ns.run(|| get(&url).is_ok()).unwrap_or(false),
        )?;
    }
    // The control servers place the whole grid once they see live reflectors.
    std::thread::sleep(Duration::from_secs_f64(2.0 * args.registry_ttl * tdf));

    // The metrics poller, from a client host.
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let polling = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let poller = {
        let timeline = timeline.clone();
        let polling = polling.clone();
        let urls: Vec<String> = refl_addrs
            .iter()
            .map(|a| format!("http://{a}:{METRICS_PORT}/metrics"))
            .collect();
        let ctl_metrics: Vec<String> = control_urls.iter().map(|u| format!("{u}/metrics")).collect();
        let every = Duration::from_secs_f64(args.poll.max(0.05));
        let ns = oskit::netns::NetNs::open(lab.ns_of(&client_hosts[0])?)
            .map_err(|e| format!("cannot open a client host's namespace: {e}"))?;
        ns.spawn::<(), oskit::SysError>(move || {
            while polling.load(Relaxed) {
                let at = t0.elapsed().as_secs_f64();
                let row: Vec<Option<Sample>> = urls
                    .iter()
                    .map(|u| get(u).ok().and_then(|t| parse_metrics(&t)))
                    .collect();
                let start = t0.elapsed().as_secs_f64();
                let servers: Vec<Option<ControlSample>> = ctl_metrics
                    .iter()
                    .map(|u| get(u).ok().and_then(|t| parse_control_metrics(&t)))
                    .collect();
                let end = t0.elapsed().as_secs_f64();
                if let Ok(mut tl) = timeline.lock() {
                    tl.rows.push((at, row));
                    tl.controls.push(ControlPoll { start, end, servers });
                }
                std::thread::sleep(every);
            }
        })
    };

    let bots_netns: Vec<String> = client_hosts
        .iter()
        .map(|h| lab.ns_of(h).map(String::from))
        .collect::<Result<_, _>>()?;
    let mut bots = launcher.command(&client_hosts[0], &[reflector_bin.as_os_str()])?;
    bots.arg("bots")
        .arg("--netns")
        .arg(bots_netns.join(","))
        .arg("--ticket-keys")
        .arg(&ticket_keys)
        .args(["--control", &control_urls.join(",")])
        .args(["--count", &args.bots.to_string()])
        .args(["--duration", &format!("{}ms", (args.duration * 1000.0) as u64)])
        .args(["--rate", &args.rate.to_string(), "--size", &args.size.to_string()])
        .args(["--move-every", &format!("{}ms", (args.move_every * 1000.0) as u64)])
        .args([
            "--bind",
            "0.0.0.0",
            "--seed",
            &args.seed.to_string(),
            "--json",
            "--quiet",
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(d.join("bots.log")).map_err(|e| format!("cannot create the bots' log: {e}"))?);
    let mut child = bots.spawn().map_err(|e| format!("cannot start the bots: {e}"))?;
    let mut out = child.stdout.take().ok_or("the bots child has no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let mut bots = ChildGuard::new(child);
    eprintln!(
        "fleet: {} bots over {} client hosts, {} s (virtual{}), {} Hz x {} B; events: {}",
        args.bots,
        client_hosts.len(),
        args.duration,
        if args.tdf > 1 {
            format!(", TDF {}", args.tdf)
        } else {
            String::new()
        },
        args.rate,
        args.size,
        events
            .iter()
            .map(|(k, at)| format!("{} at {at} s", k.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The events are stamped on the clock the bots' move windows are on:
    // the lab's virtual CLOCK_REALTIME under a TDF (its clock domain),
    // the real one otherwise.
    let clock = match &lab.state.clock {
        Some(c) => Some(
            vtime::Domain::open(&c.dir, &c.domain)
                .map_err(|e| format!("cannot open the lab's clock domain {}: {e}", c.domain))?,
        ),
        None => None,
    };
    let lab_now_ns = || -> u64 {
        match &clock {
            Some(d) => u64::try_from(d.virtual_now(vtime::ClockBase::Realtime)).unwrap_or(0),
            None => oskit::clock::realtime_ns(),
        }
    };
    // The schedule, in real time.
    let mut done: Vec<Done> = Vec::new();
    // Redis down: the index of its event in `done`, and when (real) to
    // start it again.
    let mut redis_back: Option<(usize, f64)> = None;
    let mut redis_starts = 1;
    let end = Duration::from_secs_f64(args.duration * tdf + 60.0 * tdf);
    let mut next = 0;
    loop {
        if stop.load(Relaxed) {
            return Err("interrupted".into());
        }
        if let Ok(Some(_)) = bots.child().try_wait() {
            break;
        }
        if t0.elapsed() > end {
            return Err("the bots ran far past their duration; stopped".into());
        }
        if let Some(&(kind, at)) = events.get(next) {
            if t0.elapsed().as_secs_f64() >= at * tdf {
                next += 1;
                let real_at = t0.elapsed().as_secs_f64();
                let at_ns = lab_now_ns();
                let (target, refl) = match kind {
                    EventKind::Kill | EventKind::Drain => {
                        let i = busiest(&timeline, &mut reflectors).ok_or("no live reflector left to hit")?;
                        let sig = if kind == EventKind::Kill {
                            nix::sys::signal::Signal::SIGKILL
                        } else {
                            nix::sys::signal::Signal::SIGTERM
                        };
                        reflectors[i].signal(sig)?;
                        (refl_hosts[i].clone(), Some(i))
                    }
                    EventKind::Control => {
                        let i = controls
                            .iter_mut()
                            .position(|c| c.alive())
                            .ok_or("no live control server left to stop")?;
                        let c = &mut controls[i];
                        c.signal(nix::sys::signal::Signal::SIGTERM)?;
                        (c.name.clone(), None)
                    }
                    EventKind::Redis => {
                        redis.signal(nix::sys::signal::Signal::SIGKILL)?;
                        if let Some(mut g) = redis.guard.take() {
                            let _ = g.child().wait();
                        }
                        redis_back = Some((done.len(), real_at + args.redis_down * tdf));
                        ("redis".into(), None)
                    }
                };
                eprintln!("fleet: {} ({target}) at {:.1} s", kind.name(), real_at / tdf);
                done.push(Done {
                    kind,
                    at,
                    real_at,
                    target,
                    refl,
                    at_ns,
                    back_real: None,
                });
            }
        }
        if let Some((k, when)) = redis_back {
            let now = t0.elapsed().as_secs_f64();
            if now >= when {
                redis_starts += 1;
                redis = spawn("redis", redis_cmd()?, &d.join(format!("redis-{redis_starts}.log")))?;
                done[k].back_real = Some(now);
                redis_back = None;
                eprintln!(
                    "fleet: redis started again at {:.1} s, down {:.1} s",
                    now / tdf,
                    (now - done[k].real_at) / tdf
                );
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(bots);
    let text = reader.join().unwrap_or_default();
    // Kept with the logs (--logs): every bot's figures.
    let _ = std::fs::write(d.join("bots-report.json"), &text);
    polling.store(false, Relaxed);
    let _ = poller.join();
    let report: BotsReport = serde_json::from_str(&text).map_err(|e| {
        format!(
            "cannot read the bots' JSON report ({e}); their log ends:\n{}",
            tail(&d.join("bots.log"))
        )
    })?;
    let tl = timeline.lock().map_err(|_| "timeline lock poisoned")?;
    let mut rows: Vec<EventRow> = done
        .iter()
        .map(|e| analyse(&tl, e.kind, e.at, e.real_at, &e.target, e.refl, tdf))
        .collect();
    let stamps: Vec<(EventKind, u64, Option<Ipv4Addr>)> = done
        .iter()
        .map(|e| (e.kind, e.at_ns, e.refl.map(|i| refl_addrs[i])))
        .collect();
    let keepalive_s = args.member_timeout / 4.0;
    let stats = window_stats(&stamps, &report.move_windows, &report.lost_datagrams);
    let before = (stats.before.lost_in, stats.before.lost_out);
    for (i, (r, w)) in rows.iter_mut().zip(stats.events).enumerate() {
        r.affected_players = w.affected;
        r.recovery_s = w.recovery_s;
        r.lost_in_windows = w.lost_in;
        r.lost_outside_windows = w.lost_out;
        let (from, to) = (done[i].real_at, done.get(i + 1).map(|d| d.real_at));
        r.rate_limited = counted(&tl, from, to, Span::Covering, |c| c.rate_limited);
        (r.joins_answered, r.join_failures) = match (done[i].kind, done[i].back_real) {
            // While Redis was down, only what was surely answered then;
            // failures from the kill until the hold after the restart ended.
            (EventKind::Redis, back) => {
                r.redis_down_s = back.map(|b| (b - from) / tdf);
                let hold_end = back.map(|b| b + CONTROL_HOLD_S * tdf);
                (
                    counted(&tl, from, back, Span::Inside, |c| c.joins_answered),
                    counted(&tl, from, hold_end, Span::Covering, |c| c.join_failures),
                )
            }
            _ => (
                counted(&tl, from, to, Span::Covering, |c| c.joins_answered),
                counted(&tl, from, to, Span::Covering, |c| c.join_failures),
            ),
        };
        (r.threshold_s, r.pass) = verdict(done[i].kind, r, keepalive_s);
    }

    print!("{}", event_table(&rows));
    println!(
        "\nbots: sent {}, received {} of {} owed, lost {} ({} listed with their send time), errors {}",
        report.total.sent,
        report.total.received,
        report.total.expected,
        report.lost,
        report.lost_datagrams.len(),
        report.error_count
    );
    println!(
        "move windows: {} in all; times on the lab's {} clock{}",
        report.move_windows.len(),
        if args.tdf > 1 { "virtual" } else { "real" },
        if args.tdf > 1 {
            format!(" (TDF {}: every threshold is in virtual seconds)", args.tdf)
        } else {
            String::new()
        }
    );
    let loads = link_load(&tl, tdf, args.size, args.bw);
    let shown: Vec<String> = refl_hosts
        .iter()
        .zip(&loads)
        .map(|(h, l)| match l {
            Some((peak, mean)) => format!("{h} peak {:.0} %, mean {:.0} %", peak * 100.0, mean * 100.0),
            None => format!("{h} not measured"),
        })
        .collect();
    println!(
        "reflectors' egress against the {} Mbit/s links (copies x {} B on the wire per virtual s): {}",
        args.bw / 1_000_000,
        args.size + WIRE_OVERHEAD,
        shown.join("; ")
    );
    if loads.iter().flatten().any(|&(peak, _)| peak > 0.9) {
        println!("  a reflector's link was over 90 % full: its queue, not the fleet, may have lost datagrams (--bw)");
    }
    if let Some(first) = done.first() {
        println!(
            "before the first event ({:.1} s): lost {} inside move windows, {} outside",
            first.at, before.0, before.1
        );
    }
    // The split by event is only as good as the list it is made from.
    let unsplit = report.lost.saturating_sub(report.lost_datagrams.len() as u64);
    if unsplit > 0 {
        println!(
            "  {unsplit} lost datagram(s) not listed by the bots: the split above counts only the {} listed, \
             so this run cannot pass",
            report.lost_datagrams.len()
        );
    }
    for e in report.errors.iter().take(10) {
        println!("  bots error: {e}");
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        write_csvs(out, &rows, &tl, tdf, refl_hosts)?;
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    let lost_outside: u64 = before.1 + rows.iter().map(|r| r.lost_outside_windows).sum::<u64>();
    Ok(if report.error_count > 0 {
        2
    } else if failed > 0 || lost_outside > 0 || unsplit > 0 {
        1
    } else {
        0
    })
}

/// An event as it happened.
struct Done {
    kind: EventKind,
    /// Virtual seconds after the bots started, as scheduled.
    at: f64,
    /// Real seconds after the bots started.
    real_at: f64,
    target: String,
    /// The reflector it hit (kill, drain).
    refl: Option<usize>,
    /// When, on the lab's clock (ns).
    at_ns: u64,
    /// A Redis restart: real seconds after the bots started when Redis
    /// was started again (none: not within the run).
    back_real: Option<f64>,
}

/// The live reflector with the most members at the last sample.
fn busiest(timeline: &Mutex<Timeline>, reflectors: &mut [Proc]) -> Option<usize> {
    let last = timeline.lock().ok()?.rows.last()?.1.clone();
    (0..reflectors.len())
        .filter(|&i| reflectors[i].alive())
        .max_by_key(|&i| last.get(i).copied().flatten().map_or(0, |s| s.members))
}
