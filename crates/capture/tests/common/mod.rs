//! Test lab: two network namespaces of the test's own joined by a veth
//! pair, deleted again by `Drop` even when the test panics.
#![expect(dead_code, reason = "each test file uses a part of the lab")]

use oskit::testing::{netns_command, static_neighbours, veth_pair, NetNsGuard, VethEnd};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_capture");

pub use oskit::testing::root_or_skip;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Namespaces `a` and `b`, veth `a_if` (10.x.y.1) in a and `b_if` (10.x.y.2) in b,
/// IPv6 off and static neighbours, so only the test's packets cross the link.
pub struct Lab {
    pub a: String,
    pub b: String,
    pub a_if: String,
    pub b_if: String,
    pub a_ip: String,
    pub b_ip: String,
    /// Remove the namespaces (and end every process inside) on drop.
    _guards: [NetNsGuard; 2],
}

impl Lab {
    pub fn new() -> Lab {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{}x{}", pid % 100_000, n);
        // From here on Drop cleans up whatever was made.
        let guards = [NetNsGuard::new("capa"), NetNsGuard::new("capb")];
        let lab = Lab {
            a: guards[0].name().to_string(),
            b: guards[1].name().to_string(),
            a_if: format!("ca{tag}"),
            b_if: format!("cb{tag}"),
            a_ip: format!("10.{}.{}.1", 100 + (pid % 100), n % 250),
            b_ip: format!("10.{}.{}.2", 100 + (pid % 100), n % 250),
            _guards: guards,
        };
        for guard in &lab._guards {
            let ns = guard.open().expect("open the lab's namespace");
            for key in ["net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"] {
                oskit::netns::sysctl(&ns, key, "1").unwrap_or_else(|e| panic!("{e}"));
            }
        }
        let (a_addr, b_addr) = (format!("{}/24", lab.a_ip), format!("{}/24", lab.b_ip));
        let a_end = VethEnd::new(&lab.a, &lab.a_if).addr(&a_addr);
        let b_end = VethEnd::new(&lab.b, &lab.b_if).addr(&b_addr);
        veth_pair(a_end, b_end);
        static_neighbours(a_end, b_end);
        lab
    }

    /// A monitor port in `b`: a veth pair whose receiving end (returned)
    /// gets a copy of every frame `b_if` receives (`tc ... mirred egress
    /// mirror`), with no address. The sending end has VLAN offload off, so a
    /// tag travels in the frame, where an XDP program sees it.
    pub fn add_monitor(&self) -> String {
        let n = self.b_if.trim_start_matches("cb");
        let (tx, rx) = (format!("mt{n}"), format!("mr{n}"));
        veth_pair(VethEnd::new(&self.b, &tx), VethEnd::new(&self.b, &rx));
        self.exec_ok(&self.b, &["ethtool", "-K", &tx, "txvlan", "off"]);
        self.exec_ok(&self.b, &["tc", "qdisc", "add", "dev", &self.b_if, "clsact"]);
        self.exec_ok(
            &self.b,
            &[
                "tc", "filter", "add", "dev", &self.b_if, "ingress", "u32", "match", "u32", "0", "0", "action",
                "mirred", "egress", "mirror", "dev", &tx,
            ],
        );
        rx
    }

    /// The XDP program attached to `ifname` in `ns`, as `ip -d link` shows it.
    pub fn xdp_program(&self, ns: &str, ifname: &str) -> Option<String> {
        oskit::testing::xdp_program(ns, ifname)
    }

    /// `args` (a program and its arguments) to run in namespace `ns`.
    pub fn cmd(&self, ns: &str, args: &[&str]) -> Command {
        let (program, rest) = args.split_first().expect("a program to run");
        let mut c = netns_command(ns, program);
        c.args(rest);
        c
    }

    pub fn exec_ok(&self, ns: &str, args: &[&str]) -> Output {
        let out = self.cmd(ns, args).output().expect("spawn");
        assert!(
            out.status.success(),
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Runs the generator in `a` towards `b`: `count` UDP packets (or raw
    /// frames for via mmsg/txring) from source port `sport`.
    pub fn gen(&self, via: &str, count: u64, sport: u16, dport: u16, rate: u64) -> String {
        let src = format!("{}:{sport}", self.a_ip);
        let dst = format!("{}:{dport}", self.b_ip);
        let out = self.run_gen(&self.a, &["-i", &self.a_if], via, &src, &dst, count, rate);
        String::from_utf8_lossy(&out.stderr).to_string()
    }

    /// `capture gen` in namespace `ns` with `extra` arguments first.
    #[allow(clippy::too_many_arguments)]
    fn run_gen(&self, ns: &str, extra: &[&str], via: &str, src: &str, dst: &str, count: u64, rate: u64) -> Output {
        let (c, r) = (count.to_string(), rate.to_string());
        let mut args = vec![BIN, "gen"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "--via",
            via,
            "--src",
            src,
            "--dst",
            dst,
            "-c",
            &c,
            "--rate",
            &r,
            "--duration",
            "20",
        ]);
        self.exec_ok(ns, &args)
    }

    /// Runs the generator's UDP path in namespace `ns`: `count` datagrams
    /// from `src` to `dst` (IP:PORT) at `rate` per second.
    pub fn gen_udp(&self, ns: &str, src: &str, dst: &str, count: u64, rate: u64) {
        self.run_gen(ns, &[], "udp", src, dst, count, rate);
    }
}

/// A capture process running in the background, started once it said it
/// is listening (its sockets are bound).
pub struct Running {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub stderr: Vec<String>,
}

impl Running {
    pub fn start(mut cmd: Command) -> Running {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn capture");
        let err = child.stderr.take().expect("stderr piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut r = Running {
            child,
            lines: rx,
            stderr: Vec::new(),
        };
        r.wait_line("listening on", Duration::from_secs(20));
        r
    }

    /// Waits for a stderr line containing `pat`.
    pub fn wait_line(&mut self, pat: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.stderr.push(l.clone());
                    if l.contains(pat) {
                        return l;
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "no '{pat}' from capture within {timeout:?}; stderr so far: {:#?}",
                        self.stderr
                    );
                }
            }
        }
    }

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).expect("kill");
    }

    /// Waits for exit (killing it after `timeout`); returns status and all stderr.
    pub fn finish(mut self, timeout: Duration) -> (std::process::ExitStatus, String, String) {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("capture did not exit within {timeout:?}; stderr: {:#?}", self.stderr);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.stderr.push(l);
        }
        let mut stdout = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = std::io::Read::read_to_string(&mut o, &mut stdout);
        }
        (status, self.stderr.join("\n"), stdout)
    }
}

/// Number read after `key` in `text` (e.g. "kernel: 12 accepted" with key "kernel: ").
pub fn number_after(text: &str, key: &str) -> u64 {
    let i = text.rfind(key).unwrap_or_else(|| panic!("'{key}' not in: {text}")) + key.len();
    text[i..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("no number after '{key}' in: {text}"))
}

/// Lines `tcpdump -r FILE -n` prints (reading stdin when `file` is "-").
pub fn tcpdump_lines(file: &str, stdin: Option<Vec<u8>>) -> Vec<String> {
    let mut c = Command::new("tcpdump");
    c.args(["-r", file, "-n", "-tt", "-x"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().expect("tcpdump");
    if let Some(data) = stdin {
        let mut i = child.stdin.take().expect("stdin");
        std::thread::spawn(move || {
            let _ = std::io::Write::write_all(&mut i, &data);
        });
    }
    let out = child.wait_with_output().expect("tcpdump output");
    assert!(
        out.status.success(),
        "tcpdump -r failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('\t') && !l.starts_with(' '))
        .map(str::to_string)
        .collect()
}
