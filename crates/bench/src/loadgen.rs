//! The load generator and the harness around one run.
//!
//! The implementation under test runs as a child process (the reflector
//! binary, or our own binary's hidden `raw-loop`), so the CPU time the
//! kernel accounts to it is its own and nothing else. This process plays
//! every client on 127.0.0.1: one sender member and R receiver members,
//! which join the reflector for real (tokens signed with the shared secret,
//! then the two-step JOIN with the cookie).
//!
//! One thread does it all, so the load generator needs one core and never
//! spins: it keeps at most `window` datagrams in flight (sent but not yet
//! received by every receiver), and blocks in `epoll_wait` on the
//! receivers' sockets whenever the window is full. Receivers have large
//! buffers, so a bounded window means nothing is dropped at a receiver and
//! every copy is counted exactly.

use crate::grid::{Amount, Cell, Run};
use crate::rawloop::RawLoopStats;
use crate::report::Measurement;
use crate::{set_socket_buffers, BenchError};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::socket::{recvmmsg, MsgFlags, MultiHeaders, SockaddrIn};
use oskit::child::ChildGuard;
use oskit::procfs::{self, ProcessTicks, SystemTicks};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking::{JoinError, Joiner};
use reflector_proto::client::{self, JoinRequest, Session};
use reflector_proto::protocol::{self, Header, Kind, SessionKeys, DATA_PAYLOAD};
use std::io::IoSliceMut;
use std::io::{self, BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A run with no received copy for this long has lost something: stop
/// waiting and report the loss instead of hanging.
const STALL: Duration = Duration::from_secs(2);
/// Time allowed to start a child and join every member.
const SETUP_DEADLINE: Duration = Duration::from_secs(15);
/// Copies delivered before the measured phase, to fault in pages, fill
/// caches, let the scheduler settle and measure the rate that sizes a
/// time-based run.
const WARMUP_COPIES: u64 = 30_000;
/// Player id of the sender; receivers are `SENDER_ID + 1 + i`.
const SENDER_ID: u32 = 1;

/// Fixed settings shared by every run.
#[derive(Debug, Clone)]
pub struct Harness {
    pub reflector_bin: PathBuf,
    pub self_bin: PathBuf,
    /// Socket buffer size for every socket (ours and the child's).
    pub bufsize: usize,
    /// Datagrams in flight at most.
    pub window: u64,
    /// Length of each measured phase.
    pub amount: Amount,
    /// CPU for the child, when pinning (this process is pinned elsewhere).
    pub child_cpu: Option<usize>,
    pub workdir: PathBuf,
    /// Set by Ctrl-C / SIGTERM: the current run is abandoned (its child
    /// killed) and the error [`BenchError::Interrupted`] returned.
    pub stop: Arc<AtomicBool>,
    secret: Secret,
    secret_file: PathBuf,
}

/// A private directory for the secret and the reflector's summaries,
/// removed when dropped.
pub struct WorkDir(pub PathBuf);

impl WorkDir {
    pub fn create() -> Result<WorkDir, BenchError> {
        WorkDir::create_unique("run")
    }

    /// A directory unique to this process and `tag` (tests run in parallel).
    pub fn create_unique(tag: &str) -> Result<WorkDir, BenchError> {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("reflector-bench-{}-{tag}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|source| BenchError::Sys {
            call: "mkdir(temp dir)",
            source,
        })?;
        Ok(WorkDir(dir))
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Harness {
    /// Creates the shared secret (random, written `0600` into `workdir`).
    pub fn new(
        reflector_bin: PathBuf,
        self_bin: PathBuf,
        bufsize: usize,
        window: u64,
        amount: Amount,
        child_cpu: Option<usize>,
        workdir: &Path,
    ) -> Result<Harness, BenchError> {
        let mut key = [0u8; 32];
        let mut urandom = std::fs::File::open("/dev/urandom").map_err(|source| BenchError::Read {
            path: "/dev/urandom".into(),
            source,
        })?;
        io::Read::read_exact(&mut urandom, &mut key).map_err(|source| BenchError::Read {
            path: "/dev/urandom".into(),
            source,
        })?;
        let secret = Secret::new(&key).map_err(|e| BenchError::Setup(e.to_string()))?;
        let secret_file = workdir.join("secret");
        let hexkey: String = key.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&secret_file)
            .and_then(|mut f| io::Write::write_all(&mut f, hexkey.as_bytes()))
            .map_err(|source| BenchError::Sys {
                call: "write(secret file)",
                source,
            })?;
        Ok(Harness {
            reflector_bin,
            self_bin,
            bufsize,
            window,
            amount,
            child_cpu,
            workdir: workdir.to_path_buf(),
            stop: Arc::new(AtomicBool::new(false)),
            secret,
            secret_file,
        })
    }

    /// Makes one run: start the implementation, join, warm up, measure,
    /// stop it and collect its counters.
    pub fn measure(&self, run: &Run) -> Result<Measurement, BenchError> {
        let clients = Clients::new(run.cell, self.bufsize)?;
        let child = match run.imp.backend() {
            Some(backend) => {
                self.start_reflector(backend.name(), run.imp.receive().name(), run.imp.data_tags(), &clients)?
            }
            None => self.start_raw_loop(&clients)?,
        };
        if let Some(cpu) = self.child_cpu {
            oskit::cpu::pin_process(child.pid(), cpu)?;
        }
        clients.set_nonblocking()?;
        let mut gen = Generator::new(&clients, child.target, child.sender, self.window, &self.stop)?;
        let r = run.cell.receivers.max(1) as u64;
        let warm_start = Instant::now();
        let warm = gen.pump((WARMUP_COPIES / r).max(100))?;
        let warm_rate = warm.received as f64 / warm_start.elapsed().as_secs_f64();
        if warm.received != warm.expected {
            return Err(BenchError::Child {
                program: run.imp.name(),
                detail: format!(
                    "warm-up delivered {} of {} copies; is something else using 127.0.0.1 ports?",
                    warm.received, warm.expected
                ),
            });
        }
        let datagrams = self.amount.datagrams(run.cell.receivers, warm_rate);
        let (pid, me) = (child.pid(), std::process::id());
        let (p0, k0, h0, s0, t0) = (
            procfs::process_ticks(pid)?,
            procfs::process_sched_ns(pid)?,
            procfs::process_ticks(me)?,
            procfs::system_ticks()?,
            Instant::now(),
        );
        let phase = gen.pump(datagrams)?;
        let wall_s = t0.elapsed().as_secs_f64();
        let (p1, k1, h1, s1): (ProcessTicks, u64, ProcessTicks, SystemTicks) = (
            procfs::process_ticks(pid)?,
            procfs::process_sched_ns(pid)?,
            procfs::process_ticks(me)?,
            procfs::system_ticks()?,
        );
        let counters = child.stop(&clients.sender)?;
        let p = p1.since(&p0);
        Ok(Measurement {
            datagrams,
            harness_ticks: h1.since(&h0).total(),
            copies_expected: phase.expected,
            copies_received: phase.received,
            bad_copies: phase.bad,
            wall_s,
            proc_user_ticks: p.utime,
            proc_sys_ticks: p.stime,
            proc_sched_ns: k1.saturating_sub(k0),
            system_busy_ticks: s1.since(&s0).busy,
            ticks_per_s: procfs::ticks_per_second(),
            enobufs_waits: counters.enobufs_waits,
            eagain_waits: counters.eagain_waits,
            send_errors: counters.send_errors,
            // Signed on purpose: a child that counted more than arrived and
            // one that counted less are different bugs.
            counter_mismatch: counters.sent as i64 - (warm.received + phase.received) as i64,
        })
    }

    fn start_reflector(
        &self,
        backend: &str,
        receive: &str,
        data_tags: &str,
        clients: &Clients,
    ) -> Result<Running, BenchError> {
        let mut last_err = None;
        // The port is picked by binding and releasing it; another program
        // could take it in between, so a failed start is retried.
        for attempt in 0..3 {
            let port = free_port()?;
            let summary = self.workdir.join(format!("summary-{port}-{attempt}.json"));
            let stderr_path = self.workdir.join(format!("reflector-{port}-{attempt}.log"));
            let stderr = std::fs::File::create(&stderr_path).map_err(|source| BenchError::Sys {
                call: "create(reflector log)",
                source,
            })?;
            let child = Command::new(&self.reflector_bin)
                .arg("serve")
                .args(["--bind", "127.0.0.1", "--ports", &port.to_string()])
                .arg("--secret-file")
                .arg(&self.secret_file)
                .args(["--backend", backend, "--receive", receive])
                .args(["--threads", "1", "--data-tags", data_tags])
                // Receivers never send, and must not expire during a run.
                .args(["--member-timeout", "1h"])
                // Every member on one address, one sender at full speed:
                // the caps that stop a real host from taking a group.
                .args([
                    "--max-per-ip",
                    "65535",
                    "--member-rate-pps",
                    "0",
                    "--member-rate-bytes",
                    "0",
                ])
                .args([
                    "--rcvbuf",
                    &self.bufsize.to_string(),
                    "--sndbuf",
                    &self.bufsize.to_string(),
                ])
                .arg("--summary-json")
                .arg(&summary)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .map_err(|source| BenchError::Spawn {
                    program: self.reflector_bin.display().to_string(),
                    source,
                })?;
            let mut running = Running {
                child: ChildGuard::with_grace(child, Duration::ZERO),
                target: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
                kind: ChildKind::Reflector { summary, stderr_path },
                sender: None,
            };
            match self.join_all(&mut running, clients, port) {
                Ok(()) => return Ok(running),
                Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| BenchError::Setup("reflector did not start".into())))
    }

    fn join_all(&self, running: &mut Running, clients: &Clients, port: u16) -> Result<(), BenchError> {
        let deadline = Instant::now() + SETUP_DEADLINE;
        let expires = reflector_proto::unix_now_ms() / 1000 + 3600;
        let all = std::iter::once(&clients.sender).chain(&clients.receivers);
        for (i, sock) in all.enumerate() {
            let player = SENDER_ID + i as u32;
            let token = TokenClaims {
                player,
                reflector: 0,
                group: port,
                expires_unix_s: expires,
            }
            .sign(&self.secret);
            if self.stop.load(Relaxed) {
                return Err(BenchError::Interrupted);
            }
            let keys = SessionKeys::derive(&self.secret, &token);
            let session = join(sock, running, port, player, &token, keys, deadline)?;
            if i == 0 {
                running.sender = Some(session);
            }
        }
        Ok(())
    }

    fn start_raw_loop(&self, clients: &Clients) -> Result<Running, BenchError> {
        let dests: Vec<String> = clients
            .receivers
            .iter()
            .map(|s| s.local_addr().map(|a| a.to_string()))
            .collect::<Result<_, _>>()
            .map_err(|source| BenchError::Sys {
                call: "getsockname",
                source,
            })?;
        let mut child = Command::new(&self.self_bin)
            .args([
                "raw-loop",
                "--bind",
                "127.0.0.1:0",
                "--bufsize",
                &self.bufsize.to_string(),
            ])
            .arg("--to")
            .arg(dests.join(","))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                program: self.self_bin.display().to_string(),
                source,
            })?;
        let stdout = child.stdout.take();
        let mut guard = ChildGuard::with_grace(child, Duration::ZERO);
        let mut lines = BufReader::new(stdout.ok_or_else(|| BenchError::Setup("raw loop has no stdout".into()))?);
        let mut first = String::new();
        lines.read_line(&mut first).map_err(|source| BenchError::Sys {
            call: "read(raw loop stdout)",
            source,
        })?;
        let target: SocketAddr = first.trim().parse().map_err(|_| BenchError::Child {
            program: "raw-loop".into(),
            detail: format!(
                "expected its address on stdout, got '{}' (exit status {:?})",
                first.trim(),
                guard.child().try_wait().ok().flatten()
            ),
        })?;
        Ok(Running {
            child: guard,
            target,
            kind: ChildKind::RawLoop { stdout: lines },
            sender: None,
        })
    }
}

/// The sender and the receivers, all on 127.0.0.1.
struct Clients {
    cell: Cell,
    sender: UdpSocket,
    receivers: Vec<UdpSocket>,
}

impl Clients {
    fn new(cell: Cell, bufsize: usize) -> Result<Clients, BenchError> {
        let bind = || -> Result<UdpSocket, BenchError> {
            let s = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|source| BenchError::Sys {
                call: "bind(127.0.0.1:0)",
                source,
            })?;
            set_socket_buffers(&s, bufsize)?;
            Ok(s)
        };
        Ok(Clients {
            cell,
            sender: bind()?,
            receivers: (0..cell.receivers).map(|_| bind()).collect::<Result<_, _>>()?,
        })
    }

    fn set_nonblocking(&self) -> Result<(), BenchError> {
        for s in std::iter::once(&self.sender).chain(&self.receivers) {
            s.set_nonblocking(true).map_err(|source| BenchError::Sys {
                call: "fcntl(O_NONBLOCK)",
                source,
            })?;
        }
        Ok(())
    }
}

/// The two-step JOIN of one member, retried until `deadline` (the first
/// tries also cover the reflector's start-up), checking between tries that
/// the reflector is still running.
fn join(
    sock: &UdpSocket,
    running: &mut Running,
    group: u16,
    player: u32,
    token: &[u8; protocol::TOKEN_LEN],
    keys: SessionKeys,
    deadline: Instant,
) -> Result<Session, BenchError> {
    let req = JoinRequest {
        reflector: running.target,
        group,
        player,
        token: *token,
        keys,
        first_seq: 1,
    };
    let cfg = client::Config {
        retry: Duration::from_millis(50),
        give_up: Some(deadline.saturating_duration_since(Instant::now())),
    };
    let mut joiner = Joiner::new(sock, req, cfg);
    loop {
        running.check_alive()?;
        match joiner.step() {
            Ok(Some(_)) => return Ok(*joiner.session()),
            Ok(None) => {}
            Err(JoinError::Io { call, source }) => return Err(BenchError::Sys { call, source }),
            Err(e) => {
                return Err(BenchError::Child {
                    program: "reflector".into(),
                    detail: format!("{e}{}", running.log_tail()),
                })
            }
        }
    }
}

/// Releases an ephemeral port for the reflector to bind.
fn free_port() -> Result<u16, BenchError> {
    UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .map_err(|source| BenchError::Sys {
            call: "bind(free port)",
            source,
        })
}

enum ChildKind {
    Reflector { summary: PathBuf, stderr_path: PathBuf },
    RawLoop { stdout: BufReader<ChildStdout> },
}

struct Running {
    child: ChildGuard,
    target: SocketAddr,
    kind: ChildKind,
    /// The sending member's session (its key, membership id and sequence
    /// numbers seal each DATA); none for the raw loop, which checks nothing.
    sender: Option<Session>,
}

/// What the implementation counted about its own sends.
#[derive(Debug, Default)]
struct ChildCounters {
    /// Copies the child says it sent, warm-up included.
    sent: u64,
    enobufs_waits: u64,
    eagain_waits: u64,
    send_errors: u64,
}

impl Running {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn name(&self) -> &'static str {
        match self.kind {
            ChildKind::Reflector { .. } => "reflector",
            ChildKind::RawLoop { .. } => "raw-loop",
        }
    }

    fn log_tail(&self) -> String {
        match &self.kind {
            ChildKind::Reflector { stderr_path, .. } => {
                let text = std::fs::read_to_string(stderr_path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                if tail.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; its log ends: {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    )
                }
            }
            ChildKind::RawLoop { .. } => String::new(),
        }
    }

    fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.child.child().try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(BenchError::Child {
                program: self.name().into(),
                detail: format!("exited early with {status}{}", self.log_tail()),
            }),
            Err(source) => Err(BenchError::Sys {
                call: "waitpid",
                source,
            }),
        }
    }

    /// Stops the child (SIGTERM for the reflector, a zero-length datagram
    /// for the raw loop) and reads the counters it reports at exit.
    fn stop(self, sender: &UdpSocket) -> Result<ChildCounters, BenchError> {
        let name = self.name();
        let tail = self.log_tail();
        let child_err = |detail: String| BenchError::Child {
            program: name.into(),
            detail,
        };
        let Running {
            child: mut guard,
            target,
            kind,
            ..
        } = self;
        match kind {
            ChildKind::Reflector { summary, .. } => {
                let pid = nix::unistd::Pid::from_raw(guard.child().id() as i32);
                nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).map_err(|e| BenchError::Sys {
                    call: "kill(SIGTERM)",
                    source: e.into(),
                })?;
                wait_exit(guard.child(), Duration::from_secs(10)).map_err(|d| child_err(format!("{d}{tail}")))?;
                let text = std::fs::read_to_string(&summary).map_err(|source| BenchError::Read {
                    path: summary.display().to_string(),
                    source,
                })?;
                let _ = std::fs::remove_file(&summary);
                let v: serde_json::Value =
                    serde_json::from_str(&text).map_err(|e| child_err(format!("summary JSON does not parse: {e}")))?;
                let g = |k: &str| v["total"][k].as_u64().unwrap_or(0);
                Ok(ChildCounters {
                    sent: g("fanned_out"),
                    enobufs_waits: g("enobufs_waits"),
                    eagain_waits: g("eagain_waits"),
                    send_errors: g("send_errors"),
                })
            }
            ChildKind::RawLoop { mut stdout } => {
                // The sender socket is non-blocking here; one zero-length
                // datagram on loopback always fits.
                sender.send_to(&[], target).map_err(|source| BenchError::Sys {
                    call: "sendto(stop)",
                    source,
                })?;
                let mut line = String::new();
                stdout.read_line(&mut line).map_err(|source| BenchError::Sys {
                    call: "read(raw loop stdout)",
                    source,
                })?;
                let st = RawLoopStats::from_json(line.trim())
                    .ok_or_else(|| child_err(format!("unexpected final line '{}'", line.trim())))?;
                wait_exit(guard.child(), Duration::from_secs(10)).map_err(child_err)?;
                Ok(ChildCounters {
                    sent: st.sent,
                    enobufs_waits: st.retries,
                    eagain_waits: 0,
                    send_errors: st.send_errors,
                })
            }
        }
    }
}

/// Waits for a child to exit successfully, at most `limit`.
fn wait_exit(child: &mut Child, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(format!("exited with {s}")),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => return Err(format!("did not exit within {limit:?} of being asked to stop")),
            Err(e) => return Err(format!("waitpid failed: {e}")),
        }
    }
}

/// Result of one pumping phase.
#[derive(Debug, Clone, Copy)]
struct Phase {
    expected: u64,
    received: u64,
    bad: u64,
}

/// Sends DATA and counts copies, with a bounded number in flight.
struct Generator<'a> {
    clients: &'a Clients,
    stop: &'a AtomicBool,
    target: SocketAddr,
    window: u64,
    epoll: Epoll,
    datagram: Vec<u8>,
    /// Seals each DATA (reflector); `None`: plain untagged DATA (raw loop).
    sender: Option<Session>,
    seq: u64,
    /// Receive buffers, one datagram each: one byte longer than what is
    /// sent, so a longer datagram shows as a wrong length.
    rxbufs: Vec<Vec<u8>>,
    headers: MultiHeaders<SockaddrIn>,
}

/// Datagrams taken from one receiver socket per system call.
const RECV_BATCH: usize = 64;

/// One `recvmmsg` on a non-blocking socket: the lengths of the datagrams
/// received (the load generator's cost matters only in that it must keep up
/// with the implementation under test).
fn recv_batch(
    sock: &UdpSocket,
    bufs: &mut [Vec<u8>],
    headers: &mut MultiHeaders<SockaddrIn>,
) -> nix::Result<Vec<usize>> {
    let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
    let res = recvmmsg(sock.as_raw_fd(), headers, iovs.iter_mut(), MsgFlags::MSG_DONTWAIT, None)?;
    Ok(res.map(|m| m.bytes).collect())
}

impl<'a> Generator<'a> {
    fn new(
        clients: &'a Clients,
        target: SocketAddr,
        sender: Option<Session>,
        window: u64,
        stop: &'a AtomicBool,
    ) -> Result<Generator<'a>, BenchError> {
        let sys = |call, e: nix::errno::Errno| BenchError::Sys { call, source: e.into() };
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| sys("epoll_create", e))?;
        for (i, s) in clients.receivers.iter().enumerate() {
            epoll
                .add(s.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
                .map_err(|e| sys("epoll_ctl", e))?;
        }
        let size = clients.cell.size;
        let mut datagram = vec![0u8; size];
        // Payload: a recognisable pattern; the header is rewritten per datagram.
        for (i, b) in datagram.iter_mut().enumerate().skip(DATA_PAYLOAD) {
            *b = i as u8;
        }
        Ok(Generator {
            clients,
            stop,
            target,
            window: window.max(1),
            epoll,
            datagram,
            sender,
            seq: 0,
            rxbufs: vec![vec![0u8; size + 1]; RECV_BATCH],
            headers: MultiHeaders::preallocate(RECV_BATCH, None),
        })
    }

    fn pump(&mut self, count: u64) -> Result<Phase, BenchError> {
        let r = self.clients.receivers.len() as u64;
        let expected = count * r;
        let (mut sent, mut received, mut bad) = (0u64, 0u64, 0u64);
        let mut events = vec![EpollEvent::empty(); self.clients.receivers.len().clamp(1, 128)];
        let mut last_progress = Instant::now();
        let size = self.clients.cell.size;
        while received < expected {
            if self.stop.load(Relaxed) {
                return Err(BenchError::Interrupted);
            }
            // In flight = datagrams not yet received by every receiver.
            while sent < count && sent * r < received + self.window * r {
                self.seq += 1;
                let sealed =
                    match self.sender.as_mut() {
                        Some(s) => s.emit_data(size - DATA_PAYLOAD, &mut self.datagram).unwrap_or(Err(
                            protocol::EmitError::NoKey("DATA of a session that is not a member"),
                        )),
                        None => {
                            let h = Header {
                                kind: Kind::Data,
                                group: self.target.port(),
                                sender: SENDER_ID,
                                membership: 0,
                                seq: self.seq,
                            };
                            protocol::emit_in_place(&h, size, None, &mut self.datagram)
                        }
                    };
                sealed.map_err(|e| BenchError::Setup(format!("cannot build a {size}-byte datagram: {e}")))?;
                match self.clients.sender.send_to(&self.datagram, self.target) {
                    Ok(_) => sent += 1,
                    // Wait for copies to come back; then try again.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(source) => {
                        return Err(BenchError::Sys {
                            call: "sendto(DATA)",
                            source,
                        })
                    }
                }
            }
            let n = match self.epoll.wait(&mut events, EpollTimeout::from(100u16)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => {
                    return Err(BenchError::Sys {
                        call: "epoll_wait",
                        source: e.into(),
                    })
                }
            };
            if n == 0 {
                if last_progress.elapsed() > STALL {
                    break;
                }
                continue;
            }
            for ev in &events[..n] {
                let Some(sock) = self.clients.receivers.get(ev.data() as usize) else {
                    continue;
                };
                loop {
                    match recv_batch(sock, &mut self.rxbufs, &mut self.headers) {
                        Ok(lens) => {
                            received += lens.len() as u64;
                            bad += lens.iter().filter(|&&l| l != size).count() as u64;
                            if lens.len() < self.rxbufs.len() {
                                break;
                            }
                        }
                        Err(nix::errno::Errno::EAGAIN) => break,
                        Err(nix::errno::Errno::EINTR) => continue,
                        Err(e) => {
                            return Err(BenchError::Sys {
                                call: "recvmmsg",
                                source: e.into(),
                            })
                        }
                    }
                }
            }
            last_progress = Instant::now();
        }
        Ok(Phase {
            expected,
            received,
            bad,
        })
    }
}
