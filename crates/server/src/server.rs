//! The reflector server: one UDP socket per group port, groups spread over
//! one event loop per core (each loop owns its groups outright, so there is
//! no shared mutable state and no lock on the data path).
//!
//! Per batch of datagrams the hot path does one `recvmmsg` into reused
//! buffers; per datagram one membership decision (no allocation for DATA)
//! and the backend's sends of that same buffer: nothing is copied or
//! allocated in user space. A fan-out that has to wait (full socket buffer
//! or device queue) parks its group — the group's socket is not read until
//! it completes, so its datagrams stay in order — while the loop goes on
//! serving its other groups; it resumes on `EPOLLOUT` or a timer.

use crate::backend::{Backend, BackendKind, Fanout, Progress, Wake};
use crate::checkpoint::{Board, Channel, CheckpointConfig};
use crate::kfanout::{RateCaps, ResendTarget};
use crate::liveness::{Liveness, Watch};
use crate::membership::{Change, DropReason, Event, Group, Keys, Now, Policy, ReplyBudget};
use crate::metrics::{GroupCounters, Registry};
use crate::CliError;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use oskit::clock::mono_now_ms;
use oskit::units::{duration_in, secs_or_duration_in};
use reflector_proto::auth::Secret;
use reflector_proto::control::{parse_ports, PortList};
use reflector_proto::protocol::{strip_tag, version1_error, Kind, ParseError, MAX_DATAGRAM};
use sendpath::errqueue::{ErrEntry, ErrKind};
use sendpath::{RecvBatch, SendOne};
use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind the group ports on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Group ports: a range `4000-4015`, a list `4000,4002`, or both. Each port is one group.
    #[arg(long, default_value = "4000-4015", value_parser = parse_ports)]
    pub ports: PortList,
    /// File with the secret shared with the control server (hex, or a passphrase of 16+ bytes).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Fan-out backend: sendmmsg (one syscall per batch of members), sendto (one per
    /// member, the paper's user-space loop), or ebpf (a TC program replicates each DATA
    /// inside the kernel; needs root, Linux 6.6+, IPv4 on Ethernet devices). Default: the best
    /// user-space backend this kernel supports. If ebpf cannot run, the reflector says why and
    /// falls back to the best user-space backend, unless --strict-backend.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Refuse to start if the --backend asked for cannot run, instead of falling back.
    #[arg(long)]
    pub strict_backend: bool,
    /// This reflector's id in the control server's map: the position (0, 1, ...) of its
    /// `--reflector` option there. Tokens name it, so a token opens only this reflector.
    #[arg(long, default_value_t = 0)]
    pub reflector_id: u16,
    /// Replies nobody can verify (errors to non-members, bad tokens, MACs and cookies, version
    /// errors) per second per event-loop thread, so a spoofed flood is not reflected onto its
    /// victim. Nothing else draws on this budget: members and verified players have their own.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    pub replies_per_s: u32,
    /// Replies per second to one verified player that is not a member, per group (its
    /// JOIN_CHALLENGEs, refusals, ERROR(Retry)): a valid JOIN replayed from many addresses drains
    /// only that player's share.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub player_replies_per_s: u32,
    /// Replies per second one member's own datagrams may cause (rebinding PROBEs, at most one a
    /// second anyway; a re-JOIN's challenge and JOIN_ACK); non-member traffic cannot touch it.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub member_replies_per_s: u32,
    /// DATA tags: every DATA carries a SipHash tag under the sender's session key, checked before
    /// fan-out, so a datagram with a spoofed member source is dropped (on), or not (off: cheaper;
    /// then only KEEPALIVEs count as signs of life, and clients send them every interval).
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub data_tags: Toggle,
    /// DATA tags of one group, unlike --data-tags: PORT=on or PORT=off (repeatable).
    #[arg(long = "group-data-tags", value_name = "PORT=on|off", value_parser = parse_group_tags)]
    pub group_data_tags: Vec<(u16, bool)>,
    /// Instance ids: announce (JOIN_ACK flag bit 1) that every DATA's game payload starts with
    /// the sender's 8-byte client instance id. The reflector never reads it; turn it on once
    /// every client of the deployment sends it.
    #[arg(long, value_enum, default_value_t = Toggle::Off)]
    pub data_instance: Toggle,
    /// The instance flag of one group, unlike --data-instance: PORT=on or PORT=off (repeatable).
    #[arg(long = "group-data-instance", value_name = "PORT=on|off", value_parser = parse_group_tags)]
    pub group_data_instance: Vec<(u16, bool)>,
    /// Members per source IP address in one group (further JOINs get ERROR(AddressLimit)): one
    /// host cannot fill a group and multiply its datagrams by the group's size, a household
    /// behind one NAT still fits. Raise it for load tests from one address.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=65535))]
    pub max_per_ip: u64,
    /// DATA datagrams per second one member may have fanned out (a second's burst); beyond it
    /// its own datagrams are dropped and counted. A game sends tens; 0 lifts the cap.
    #[arg(long, default_value_t = 500)]
    pub member_rate_pps: u32,
    /// DATA bytes per second one member may have fanned out (a second's burst); 0 lifts the cap.
    #[arg(long, default_value_t = 1_000_000)]
    pub member_rate_bytes: u64,
    /// Event-loop threads; groups are spread over them. Default: one per core.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Remove a member after this long without DATA or KEEPALIVE (e.g. 10s, 1500ms).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_in(ms(100), DAY))]
    pub member_timeout: Duration,
    /// Old spelling of --member-timeout, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "member_timeout", value_parser = clap::value_parser!(u64).range(100..))]
    pub member_timeout_ms: Option<u64>,
    /// Maximum members per group.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(2..=65535))]
    pub max_members: u64,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9100); https with --tls-cert.
    #[arg(long)]
    pub metrics: Option<SocketAddr>,
    /// Socket receive buffer per group, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub rcvbuf: usize,
    /// Socket send buffer per group, bytes.
    #[arg(long, default_value_t = 4 << 20)]
    pub sndbuf: usize,
    /// Stop after this long (e.g. 30s, 2m; a bare number is seconds). Default: run until
    /// Ctrl-C / SIGTERM.
    #[arg(long, value_name = "DURATION", value_parser = secs_or_duration_in(ms(1), 3650 * DAY))]
    pub duration: Option<Duration>,
    /// Write the final counters as JSON to this file.
    #[arg(long)]
    pub summary_json: Option<PathBuf>,
    /// Checkpoints: serve the groups' game state on this TCP port (announced in JOIN_ACK): every
    /// --checkpoint-every the reflector asks one member per group (the lowest RTT) for its
    /// state, keeps the latest, and hands it to joiners and to members that resync. Off unless given.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub checkpoint_port: Option<u16>,
    /// How often each group is asked for a checkpoint (e.g. 5s).
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = duration_in(ms(100), DAY))]
    pub checkpoint_every: Duration,
    /// Old spelling of --checkpoint-every, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "checkpoint_every", value_parser = clap::value_parser!(u64).range(100..))]
    pub checkpoint_every_ms: Option<u64>,
    /// Largest game state stored per group, bytes (larger uploads are refused before they are read).
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..=(1 << 30)))]
    pub checkpoint_max_bytes: u64,
    /// Deadline of one checkpoint exchange (e.g. 10s): a peer that stops reading is cut off.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration_in(ms(100), DAY))]
    pub checkpoint_timeout: Duration,
    /// Old spelling of --checkpoint-timeout, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "checkpoint_timeout", value_parser = clap::value_parser!(u64).range(100..))]
    pub checkpoint_timeout_ms: Option<u64>,
    /// Checkpoint connections that have not sent their request within this time (e.g. 2s) are
    /// closed (the HELLO tells the client).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = duration_in(ms(10), ms(600_000)))]
    pub checkpoint_hello_timeout: Duration,
    /// Old spelling of --checkpoint-hello-timeout, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "checkpoint_hello_timeout", value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub checkpoint_hello_timeout_ms: Option<u64>,
    /// Bytes of stored checkpoint states plus upload bodies being received, over all groups;
    /// an upload that would pass it is refused as busy and counted (checkpoint_memory_refused).
    #[arg(long, default_value_t = 256 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_memory: u64,
    /// Checkpoint connections at once. At the cap the oldest connection that has not
    /// authenticated is closed for a new one; a new one is refused as busy only if every
    /// connection held has authenticated.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub checkpoint_conns: u64,
    /// Checkpoint connections at once from one source address.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub checkpoint_conns_per_ip: u64,
    /// One fetch per member per this time (e.g. 500ms; a fetch flood is refused and counted).
    #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = duration_in(Duration::ZERO, DAY))]
    pub checkpoint_fetch_every: Duration,
    /// Old spelling of --checkpoint-fetch-every, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "checkpoint_fetch_every")]
    pub checkpoint_fetch_every_ms: Option<u64>,
    /// Send checkpoints with MSG_ZEROCOPY (off: always copy). Local peers make the kernel copy
    /// anyway; the reflector then switches to copies by itself and says so.
    #[arg(long, value_enum, default_value_t = Toggle::On)]
    pub checkpoint_zerocopy: Toggle,
    #[command(flatten)]
    pub http: reflector_http::HttpArgs,
    /// Also expose every group's own series on /metrics (reflector_group_*{group}): about 87 series per
    /// group. Off: aggregates over all groups only.
    #[arg(long)]
    pub metrics_per_group: bool,
}

const DAY: Duration = Duration::from_secs(86_400);

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

impl ServeArgs {
    /// --member-timeout, or its old spelling in milliseconds.
    pub fn member_timeout(&self) -> Duration {
        self.member_timeout_ms
            .map_or(self.member_timeout, Duration::from_millis)
    }

    /// --checkpoint-every, or its old spelling in milliseconds.
    pub fn checkpoint_every(&self) -> Duration {
        self.checkpoint_every_ms
            .map_or(self.checkpoint_every, Duration::from_millis)
    }

    /// --checkpoint-timeout, or its old spelling in milliseconds.
    pub fn checkpoint_timeout(&self) -> Duration {
        self.checkpoint_timeout_ms
            .map_or(self.checkpoint_timeout, Duration::from_millis)
    }

    /// --checkpoint-hello-timeout, or its old spelling in milliseconds.
    pub fn checkpoint_hello_timeout(&self) -> Duration {
        self.checkpoint_hello_timeout_ms
            .map_or(self.checkpoint_hello_timeout, Duration::from_millis)
    }

    /// --checkpoint-fetch-every, or its old spelling in milliseconds.
    pub fn checkpoint_fetch_every(&self) -> Duration {
        self.checkpoint_fetch_every_ms
            .map_or(self.checkpoint_fetch_every, Duration::from_millis)
    }
}

/// Whole milliseconds, saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `PORT=on|off`.
pub fn parse_group_tags(s: &str) -> Result<(u16, bool), String> {
    let (port, v) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not PORT=on or PORT=off"))?;
    let port = port
        .trim()
        .parse::<u16>()
        .map_err(|_| format!("'{port}' in '{s}' is not a port"))?;
    match v.trim() {
        "on" => Ok((port, true)),
        "off" => Ok((port, false)),
        other => Err(format!("'{other}' in '{s}' is neither on nor off")),
    }
}

/// An option that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot bind group port {addr}: {source} ({})", bind_hint(addr, source))]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("socket setup for group port {port} failed in {call}: {source}")]
    Setup {
        port: u16,
        call: &'static str,
        source: io::Error,
    },
    #[error("event loop failed: {0}")]
    Loop(#[source] io::Error),
    #[error("{0}")]
    Config(String),
    #[error("cannot bind the checkpoint channel on {addr}: {source}")]
    BindCheckpoint {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
}

/// What most likely made binding `addr` fail, by the error's cause.
pub fn bind_hint(addr: &SocketAddr, e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::AddrNotAvailable => format!(
            "{} is not an address of this host: give --bind one of its addresses (`ip -brief address`), or 0.0.0.0 for all",
            addr.ip()
        ),
        io::ErrorKind::AddrInUse => format!(
            "port {} is taken on {}: is another reflector running, or another program on that port?",
            addr.port(),
            addr.ip()
        ),
        io::ErrorKind::PermissionDenied => format!(
            "port {} is below net.ipv4.ip_unprivileged_port_start: run as root or with CAP_NET_BIND_SERVICE, or use a higher port",
            addr.port()
        ),
        _ => "check --bind and --ports".to_string(),
    }
}

/// Everything a server needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub bind: IpAddr,
    /// Group ports; 0 asks the kernel for a free port (tests), and the bound
    /// port becomes the group.
    pub ports: Vec<u16>,
    pub keys: Keys,
    pub policy: Policy,
    pub backend: BackendKind,
    /// If `backend` cannot run here: fall back to the best user-space one
    /// (saying why), or refuse to start.
    pub fallback: bool,
    pub threads: usize,
    pub rcvbuf: usize,
    pub sndbuf: usize,
    /// Groups whose DATA tags differ from [`Policy::data_tags`]: (port, on).
    pub group_tags: Vec<(u16, bool)>,
    /// Groups whose instance flag differs from [`Policy::data_instance`]:
    /// (port, on).
    pub group_instance: Vec<(u16, bool)>,
    /// The checkpoint channel, if any (its port goes into
    /// [`Policy::checkpoint_port`] once bound).
    pub checkpoint: Option<CheckpointConfig>,
}

impl ServerConfig {
    /// A reflector on `bind` with one group on a port the kernel picks,
    /// tokens checked under `token_secret` (reflector id 0), a fresh cookie
    /// key, the default policy and `backend` with no fallback; one thread,
    /// 4 MiB socket buffers, no checkpoint channel. Embedders and tests set
    /// the rest with struct update syntax (`ServerConfig { threads: 2,
    /// ..ServerConfig::new(..) }`).
    pub fn new(bind: IpAddr, token_secret: Secret, backend: BackendKind) -> Self {
        ServerConfig {
            bind,
            ports: vec![0],
            keys: Keys {
                token_secret: token_secret.into(),
                reflector_id: 0,
                cookie_key: Secret::random(),
            },
            policy: Policy::default(),
            backend,
            fallback: false,
            threads: 1,
            rcvbuf: 4 << 20,
            sndbuf: 4 << 20,
            group_tags: Vec::new(),
            group_instance: Vec::new(),
            checkpoint: None,
        }
    }
}

/// A running reflector.
pub struct Server {
    registry: Registry,
    ports: Vec<u16>,
    channel: Option<Channel>,
    threads: Vec<JoinHandle<Result<(), ServeError>>>,
    liveness: Liveness,
    stop: Arc<AtomicBool>,
}

struct Slot {
    sock: UdpSocket,
    group: Group,
    counters: Arc<GroupCounters>,
    /// Set while a fan-out of this group waits; its socket is not read then.
    waiting: Option<Wake>,
    /// Datagrams received after the one whose fan-out is waiting, in order
    /// (copied: the receive buffers are reused). Empty unless a wait
    /// happened in the middle of a batch.
    backlog: VecDeque<(SocketAddr, Vec<u8>)>,
}

impl Server {
    /// Binds every group port (so configuration errors surface here), then
    /// starts the event loops.
    pub fn start(mut cfg: ServerConfig, stop: Arc<AtomicBool>) -> Result<Server, ServeError> {
        let ck_listener = match &cfg.checkpoint {
            Some(ck) => {
                let addr = SocketAddr::new(cfg.bind, ck.port);
                let l = TcpListener::bind(addr).map_err(|source| ServeError::BindCheckpoint { addr, source })?;
                cfg.policy.checkpoint_port = l
                    .local_addr()
                    .map_err(|source| ServeError::BindCheckpoint { addr, source })?
                    .port();
                Some(l)
            }
            None => None,
        };
        let mut socks = Vec::with_capacity(cfg.ports.len());
        let mut ports = Vec::with_capacity(cfg.ports.len());
        for &p in &cfg.ports {
            let addr = SocketAddr::new(cfg.bind, p);
            let sock = UdpSocket::bind(addr).map_err(|source| ServeError::Bind { addr, source })?;
            let port = sock
                .local_addr()
                .map_err(|source| ServeError::Setup {
                    port: p,
                    call: "getsockname",
                    source,
                })?
                .port();
            sock.set_nonblocking(true).map_err(|source| ServeError::Setup {
                port,
                call: "fcntl(O_NONBLOCK)",
                source,
            })?;
            sendpath::set_recverr(sock.as_fd(), cfg.bind).map_err(|source| ServeError::Setup {
                port,
                call: "setsockopt(IP_RECVERR)",
                source,
            })?;
            oskit::sockopt::set_buffers(&sock, cfg.rcvbuf, cfg.sndbuf).map_err(|e| ServeError::Setup {
                port,
                call: "setsockopt(SO_RCVBUF/SO_SNDBUF)",
                source: e.into(),
            })?;
            socks.push(sock);
            ports.push(port);
        }
        let caps = RateCaps {
            pps: cfg.policy.member_pps,
            bytes_per_s: u32::try_from(cfg.policy.member_bytes_per_s).unwrap_or(u32::MAX),
        };
        let backend = Backend::start(cfg.backend, cfg.bind, caps, cfg.fallback).map_err(ServeError::Config)?;
        let registry = Registry::new(backend.kind().name(), &ports);
        let mut watch = Watch::new();
        if backend.resends() {
            let mut targets = Vec::with_capacity(socks.len());
            for (sock, (port, counters)) in socks.iter().zip(&registry.groups) {
                let sock = sock.try_clone().map_err(|source| ServeError::Setup {
                    port: *port,
                    call: "dup",
                    source,
                })?;
                targets.push(ResendTarget {
                    port: *port,
                    sock,
                    counters: Arc::clone(counters),
                });
            }
            backend.start_resend(targets, &mut watch).map_err(ServeError::Loop)?;
        }
        let board = cfg
            .checkpoint
            .map(|ck| Arc::new(crate::checkpoint::Board::new(ck, &registry)));
        let channel = match (ck_listener, &board) {
            (Some(l), Some(b)) => {
                Some(Channel::start(l, Arc::clone(b), Arc::clone(&stop), &mut watch).map_err(ServeError::Loop)?)
            }
            _ => None,
        };
        let nthreads = cfg.threads.clamp(1, socks.len().max(1));
        let mut per_thread: Vec<Vec<Slot>> = (0..nthreads).map(|_| Vec::new()).collect();
        for (i, sock) in socks.into_iter().enumerate() {
            let (port, counters) = (registry.groups[i].0, Arc::clone(&registry.groups[i].1));
            let mut group = Group::new(port);
            if let Some(&(_, on)) = cfg.group_tags.iter().find(|(p, _)| *p == port) {
                group.set_tags(on);
            }
            if let Some(&(_, on)) = cfg.group_instance.iter().find(|(p, _)| *p == port) {
                group.set_instance(on);
            }
            per_thread[i % nthreads].push(Slot {
                sock,
                group,
                counters,
                waiting: None,
                backlog: VecDeque::new(),
            });
        }
        let mut threads = Vec::new();
        for (t, slots) in per_thread.into_iter().enumerate() {
            let (keys, policy, stop2) = (cfg.keys.clone(), cfg.policy, Arc::clone(&stop));
            let board = board.clone();
            let fanout = backend.for_loop();
            let h = watch.spawn(&format!("reflector-{t}"), move || {
                event_loop(slots, &keys, &policy, fanout, board, &stop2)
            });
            match h {
                Ok(h) => threads.push(h),
                Err(e) => {
                    // Do not leave the loops already started serving their ports.
                    stop.store(true, Relaxed);
                    for h in threads {
                        let _ = h.join();
                    }
                    if let Some(c) = channel {
                        c.join();
                    }
                    return Err(ServeError::Loop(e));
                }
            }
        }
        Ok(Server {
            registry,
            ports,
            channel,
            threads,
            liveness: watch.liveness(),
            stop,
        })
    }

    /// Whether every thread of the reflector still runs (`/healthz`): the
    /// event loops, the checkpoint channel's, the kernel path's resender.
    pub fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// The bound group ports, in the order given.
    pub fn ports(&self) -> &[u16] {
        &self.ports
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The checkpoint channel's TCP port, if it has one.
    pub fn checkpoint_port(&self) -> Option<u16> {
        self.channel.as_ref().map(Channel::port)
    }

    /// Asks the loops to stop (they notice within 100 ms).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// Waits for every loop to finish; returns the final counters.
    pub fn join(self) -> Result<Registry, ServeError> {
        let mut first_err = None;
        if let Some(c) = self.channel {
            self.stop.store(true, Relaxed);
            c.join();
        }
        for h in self.threads {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(ServeError::Config("an event-loop thread panicked".into()));
                }
            }
        }
        first_err.map_or(Ok(self.registry), Err)
    }
}

/// Batches one socket may receive before the loop serves the others.
const RECV_BATCHES: usize = 4;
/// Datagrams per `recvmmsg`.
const RECV_BATCH: usize = 32;
/// Expiry sweep interval.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// The epoll token of the loop's back-off timer.
const TIMER_TOKEN: u64 = u64::MAX;

/// One event loop: its groups, the backend that fans out for them, and the
/// timer that wakes fan-outs waiting out a full device queue.
struct Loop<'a> {
    slots: Vec<Slot>,
    keys: &'a Keys,
    policy: &'a Policy,
    fanout: Box<dyn Fanout>,
    epoll: Epoll,
    timer: TimerFd,
    /// The checkpoint board, if checkpoints are on.
    board: Option<Arc<Board>>,
    /// Replies nobody can verify, for all this loop's groups
    /// ([`Policy::replies_per_s`]).
    unverified: ReplyBudget,
}

fn loop_err(e: impl Into<io::Error>) -> ServeError {
    ServeError::Loop(e.into())
}

fn event_loop(
    slots: Vec<Slot>,
    keys: &Keys,
    policy: &Policy,
    mut fanout: Box<dyn Fanout>,
    board: Option<Arc<Board>>,
    stop: &AtomicBool,
) -> Result<(), ServeError> {
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(loop_err)?;
    let timer = TimerFd::new(
        ClockId::CLOCK_MONOTONIC,
        TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
    )
    .map_err(loop_err)?;
    epoll
        .add(timer.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TIMER_TOKEN))
        .map_err(loop_err)?;
    for (i, s) in slots.iter().enumerate() {
        epoll
            .add(s.sock.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(loop_err)?;
        fanout
            .attach(i, s.sock.as_fd(), s.group.port(), s.group.tags_on(policy))
            .map_err(ServeError::Loop)?;
    }
    let mut lp = Loop {
        slots,
        keys,
        policy,
        fanout,
        epoll,
        timer,
        board,
        unverified: ReplyBudget::full(policy.replies_per_s, mono_now_ms()),
    };
    lp.run(stop)
}

impl Loop<'_> {
    fn run(&mut self, stop: &AtomicBool) -> Result<(), ServeError> {
        let mut batch = RecvBatch::new(RECV_BATCH, MAX_DATAGRAM + 1);
        let mut events = vec![EpollEvent::empty(); (self.slots.len() + 1).clamp(2, 256)];
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        while !stop.load(Relaxed) {
            let n = match self.epoll.wait(&mut events, EpollTimeout::from(100u16)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(loop_err(e)),
            };
            for ev in &events[..n] {
                if ev.data() == TIMER_TOKEN {
                    // Reading resets the timer's readiness; waiting fan-outs
                    // due now are resumed below.
                    let _ = self.timer.wait();
                    continue;
                }
                let i = ev.data() as usize;
                if i >= self.slots.len() {
                    continue;
                }
                let flags = ev.events();
                if flags.contains(EpollFlags::EPOLLERR) {
                    self.read_error_queue(i);
                }
                if self.slots[i].waiting == Some(Wake::Writable)
                    && flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR)
                {
                    self.resume(i)?;
                }
                if self.slots[i].waiting.is_none() && flags.contains(EpollFlags::EPOLLIN) {
                    self.serve_socket(i, &mut batch)?;
                }
            }
            self.resume_due()?;
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + SWEEP_EVERY;
            }
        }
        // Shutdown: one last try for fan-outs still waiting, then they are
        // given up and counted.
        for i in 0..self.slots.len() {
            if self.slots[i].waiting.is_some() {
                let c = Arc::clone(&self.slots[i].counters);
                if self.fanout.resume(i, self.slots[i].sock.as_fd(), &c) != Progress::Done {
                    self.fanout.abandon(i, &c);
                }
            }
        }
        // The backend's last counters (the kernel path's), so the summary
        // counts everything that went out.
        for (i, s) in self.slots.iter().enumerate() {
            self.fanout.sync(i, &s.counters, &mut |_| {});
        }
        Ok(())
    }

    /// Resumes the fan-outs whose back-off time has come, and re-arms the
    /// timer for the next one.
    fn resume_due(&mut self) -> Result<(), ServeError> {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].waiting, Some(Wake::At(t)) if t <= now) {
                self.resume(i)?;
            }
        }
        let next = self
            .slots
            .iter()
            .filter_map(|s| match s.waiting {
                Some(Wake::At(t)) => Some(t),
                _ => None,
            })
            .min();
        let r = match next {
            Some(t) => {
                // A zero expiry would disarm the timer: at least 1 ns.
                let d = t.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
                self.timer.set(
                    Expiration::OneShot(TimeSpec::from_duration(d)),
                    TimerSetTimeFlags::empty(),
                )
            }
            None => self.timer.unset(),
        };
        r.map_err(loop_err)
    }

    /// Sets what the loop waits for on slot `i`'s socket: datagrams when it
    /// is ready, writability when its fan-out waits for the socket buffer,
    /// nothing (errors only) when it waits on the timer.
    fn set_waiting(&mut self, i: usize, waiting: Option<Wake>) -> Result<(), ServeError> {
        if self.slots[i].waiting == waiting {
            return Ok(());
        }
        let flags = match waiting {
            None => EpollFlags::EPOLLIN,
            Some(Wake::Writable) => EpollFlags::EPOLLOUT,
            Some(Wake::At(_)) => EpollFlags::empty(),
        };
        let s = &mut self.slots[i];
        s.waiting = waiting;
        let mut ev = EpollEvent::new(flags, i as u64);
        self.epoll.modify(s.sock.as_fd(), &mut ev).map_err(loop_err)
    }

    /// Continues slot `i`'s waiting fan-out; once it is done, the datagrams
    /// that queued behind it are handled, in order.
    fn resume(&mut self, i: usize) -> Result<(), ServeError> {
        let c = Arc::clone(&self.slots[i].counters);
        match self.fanout.resume(i, self.slots[i].sock.as_fd(), &c) {
            Progress::Pending(w) => return self.set_waiting(i, Some(w)),
            Progress::Done => self.set_waiting(i, None)?,
        }
        let now = crate::now();
        while let Some((src, d)) = self.slots[i].backlog.pop_front() {
            let mut d = d;
            if let Progress::Pending(w) = self.handle(i, now, src, &mut d) {
                return self.set_waiting(i, Some(w));
            }
        }
        Ok(())
    }

    /// Receives and handles datagrams on slot `i` until its socket is empty,
    /// its budget is spent, or a fan-out has to wait.
    fn serve_socket(&mut self, i: usize, batch: &mut RecvBatch) -> Result<(), ServeError> {
        for _ in 0..RECV_BATCHES {
            let n = match batch.recv(self.slots[i].sock.as_fd()) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.fanout.idle(i);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // A queued ICMP error surfaces here as ECONNREFUSED & co.
                    self.read_error_queue(i);
                    continue;
                }
            };
            // Both clocks read once per batch, not per datagram.
            let now = crate::now();
            for k in 0..n {
                let Some((d, Some(src), _)) = batch.get_mut(k) else {
                    continue;
                };
                if let Progress::Pending(w) = self.handle(i, now, src, d) {
                    // The rest of this batch waits its turn, in order.
                    for k2 in k + 1..n {
                        if let Some((d, Some(src), _)) = batch.get(k2) {
                            self.slots[i].backlog.push_back((src, d.to_vec()));
                        }
                    }
                    return self.set_waiting(i, Some(w));
                }
            }
            if n < batch.capacity() {
                // A short batch: the socket was empty.
                self.fanout.idle(i);
                return Ok(());
            }
        }
        Ok(())
    }

    /// One datagram: the membership decision, the changes it made handed to
    /// the backend, then the fan-out (tag field zeroed, so every member gets
    /// the same bytes whatever the backend) or the reply.
    fn handle(&mut self, i: usize, now: Now, src: SocketAddr, datagram: &mut [u8]) -> Progress {
        let (keys, policy) = (self.keys, self.policy);
        // Before the core judges it: a valid LEAVE removes the member.
        let fenced = self.fanout.leave_arrived(i, src, datagram);
        let slot = &mut self.slots[i];
        let c = &slot.counters;
        let len = datagram.len();
        c.received.fetch_add(1, Relaxed);
        c.bytes_in.fetch_add(len as u64, Relaxed);
        let mut outcome = slot.group.handle(keys, policy, now, src, datagram);
        // Replies nobody can verify come out of the loop's one budget.
        self.unverified.admit(policy.replies_per_s, now.mono_ms, &mut outcome);
        if let Event::Dropped(DropReason::Malformed(ParseError::BadVersion(_))) = outcome.event {
            c.version_errors.fetch_add(1, Relaxed);
            if let Some(e) = version1_error(datagram) {
                if !self.unverified.take(policy.replies_per_s, now.mono_ms) {
                    c.error_replies_suppressed.fetch_add(1, Relaxed);
                    c.replies_suppressed.fetch_add(1, Relaxed);
                } else if SendOne::send(slot.sock.as_fd(), &e, src).is_ok() {
                    c.error_replies.fetch_add(1, Relaxed);
                    c.reply_bytes_out.fetch_add(e.len() as u64, Relaxed);
                }
            }
        }
        let fanout = &mut self.fanout;
        slot.group.take_changes(|ch, m| match ch {
            Change::Added(a) => fanout.member_added(i, a, m),
            Change::Removed(a) => fanout.member_removed(i, a),
        });
        if fenced {
            fanout.leave_judged(i);
        }
        match outcome.event {
            Event::Forward { from } => {
                if !fanout.accept_data(i, from, datagram) {
                    // Its sequence number went through the kernel path.
                    c.replays.fetch_add(1, Relaxed);
                    return Progress::Done;
                }
                c.forwarded.fetch_add(1, Relaxed);
                strip_tag(datagram);
                return fanout.fanout(i, slot.sock.as_fd(), datagram, from, c);
            }
            Event::Refreshed => return Progress::Done,
            Event::Probed { rtt_us } => {
                c.probe_replies.fetch_add(1, Relaxed);
                c.rtt.observe_us(rtt_us);
                return Progress::Done;
            }
            Event::Rebound { .. } => c.rebinds.fetch_add(1, Relaxed),
            Event::Held => c.occupancy_kept.fetch_add(1, Relaxed),
            Event::Renewed => c.renewals.fetch_add(1, Relaxed),
            // Counted below, as answered or suppressed.
            Event::Echoed => 0,
            Event::Replaced => {
                // A new key and membership id for the channel.
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                c.replaced.fetch_add(1, Relaxed)
            }
            // Counted below, as sent or suppressed.
            Event::Challenged => 0,
            Event::Joined { rejoin } => {
                // The channel knows the member (and its key) before the
                // JOIN_ACK is out, so a joiner may fetch at once.
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                if rejoin {
                    c.rejoins.fetch_add(1, Relaxed)
                } else {
                    c.joins.fetch_add(1, Relaxed)
                }
            }
            Event::Left => {
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                c.leaves.fetch_add(1, Relaxed)
            }
            Event::Dropped(reason) => {
                if matches!(reason, DropReason::BadMac) && datagram.get(3) == Some(&(Kind::Leave as u8)) {
                    c.forged_leaves.fetch_add(1, Relaxed);
                }
                count_drop(c, reason)
            }
        };
        c.control_bytes_in.fetch_add(len as u64, Relaxed);
        c.members.store(slot.group.len() as u64, Relaxed);
        if let Some(kind) = outcome.suppressed {
            c.replies_suppressed.fetch_add(1, Relaxed);
            match kind {
                Kind::JoinChallenge => c.challenges_suppressed.fetch_add(1, Relaxed),
                Kind::Probe => c.rebind_probes_suppressed.fetch_add(1, Relaxed),
                Kind::Error => c.error_replies_suppressed.fetch_add(1, Relaxed),
                Kind::EchoReply => c.echo_suppressed.fetch_add(1, Relaxed),
                _ => 0,
            };
        }
        if let Some(reply) = outcome.reply {
            // Replies are best effort: a lost one is recovered by the
            // client's retry, and we never wait on a possibly spoofed peer.
            if SendOne::send(slot.sock.as_fd(), reply.as_bytes(), src).is_ok() {
                c.reply_bytes_out.fetch_add(reply.len() as u64, Relaxed);
                match outcome.reply_kind() {
                    Some(Kind::JoinChallenge) => c.challenges.fetch_add(1, Relaxed),
                    Some(Kind::Probe) => c.rebind_probes.fetch_add(1, Relaxed),
                    Some(Kind::Error) => c.error_replies.fetch_add(1, Relaxed),
                    Some(Kind::EchoReply) => c.echo_replies.fetch_add(1, Relaxed),
                    _ => 0,
                };
            }
        }
        Progress::Done
    }

    /// Reads slot `i`'s error queue: ICMP errors are counted and noted
    /// against the member they are about (which removes nobody by itself),
    /// every entry goes to the backend.
    fn read_error_queue(&mut self, i: usize) {
        let now_ms = mono_now_ms();
        let slot = &mut self.slots[i];
        let (group, c, fanout) = (&mut slot.group, &slot.counters, &mut self.fanout);
        sendpath::errqueue::read(slot.sock.as_fd(), |e: ErrEntry| {
            if let ErrKind::Icmp { .. } = e.kind {
                c.icmp_errors.fetch_add(1, Relaxed);
                if let Some(dest) = e.dest {
                    group.note_unreachable(dest, now_ms);
                }
            }
            fanout.error_entry(i, &e);
        });
    }

    /// Expiry: silent members, and members an ICMP error was about that have
    /// been silent since; the backend reports its counters.
    fn sweep(&mut self) {
        let now = crate::now();
        let now_ms = now.mono_ms;
        let mut probes = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            // Signs of life and counters from the backend first (the kernel
            // path's DATA), so its members are not expired for silence.
            let group = &mut s.group;
            self.fanout.sync(i, &s.counters, &mut |addr| {
                group.heard_from(addr, now_ms);
            });
            let gone = s.group.expire(self.policy, now);
            // Each member's RTT, measured by the reflector itself.
            probes.clear();
            let probed = s.group.probes(self.keys, self.policy, now, &mut probes);
            s.counters
                .occupancy_checks
                .fetch_add(probed.checks_started as u64, Relaxed);
            for (to, p) in &probes {
                if SendOne::send(s.sock.as_fd(), p.as_bytes(), *to).is_ok() {
                    s.counters.probes_sent.fetch_add(1, Relaxed);
                }
            }
            let fanout = &mut self.fanout;
            s.group.take_changes(|ch, m| match ch {
                Change::Added(a) => fanout.member_added(i, a, m),
                Change::Removed(a) => fanout.member_removed(i, a),
            });
            if let Some(b) = &self.board {
                if gone.total() > 0 {
                    b.set_roster(s.group.port(), s.group.members());
                }
                // Paper 000 §3: the game state, asked of one member.
                if let Some(m) = b.due_source(s.group.port(), s.group.members(), now_ms) {
                    if let Some((to, nonce, d)) = s.group.checkpoint_request(self.keys, m, now_ms) {
                        if SendOne::send(s.sock.as_fd(), d.as_bytes(), to).is_ok() {
                            b.requested(s.group.port(), &s.group.members()[m], nonce, now_ms);
                        }
                    }
                }
            }
            if gone.total() > 0 {
                s.counters.expired.fetch_add(gone.silent as u64, Relaxed);
                s.counters.expired_tokens.fetch_add(gone.tokens as u64, Relaxed);
                s.counters
                    .unreachable_removed
                    .fetch_add(gone.unreachable as u64, Relaxed);
                s.counters.occupancy_removed.fetch_add(gone.occupied as u64, Relaxed);
                s.counters.members.store(s.group.len() as u64, Relaxed);
            }
        }
    }
}

fn count_drop(c: &GroupCounters, reason: DropReason) -> u64 {
    use reflector_proto::auth::TokenError;
    let counter = match reason {
        DropReason::Malformed(_) => &c.malformed,
        DropReason::WrongGroup => &c.wrong_group,
        DropReason::NotMember => &c.dropped_non_member,
        DropReason::StaleMembership => &c.stale_membership,
        DropReason::BadMac => &c.bad_mac,
        DropReason::BadTag => &c.bad_tag,
        DropReason::Replay => &c.replays,
        DropReason::Unvalidated => &c.unvalidated,
        DropReason::OlderToken => &c.older_tokens,
        DropReason::Token(TokenError::Expired) => &c.expired_token,
        DropReason::Token(_) => &c.bad_token,
        DropReason::BadCookie => &c.bad_cookie,
        DropReason::GroupFull => &c.group_full,
        DropReason::Occupied => &c.occupied,
        DropReason::AddressLimit => &c.address_limit,
        DropReason::RateLimited => &c.rate_limited,
        DropReason::Unexpected(_) => &c.unexpected,
    };
    counter.fetch_add(1, Relaxed)
}

/// Binds the metrics listener (before the server starts, so a taken
/// address fails early and leaves nothing running).
pub fn bind_metrics(addr: SocketAddr) -> Result<std::net::TcpListener, CliError> {
    reflector_http::bind(addr).map_err(|e| format!("cannot serve metrics: {e}").into())
}

/// Serves `/metrics` (the classic text format, or OpenMetrics when the
/// scraper's `Accept` asks for it) and `/healthz` until `stop` is set.
/// `alive` answers `/healthz`: `Err(why)` names the threads that ended.
pub fn serve_metrics(
    listener: std::net::TcpListener,
    limits: reflector_http::Limits,
    tls: Option<reflector_http::Tls>,
    exposition: crate::metrics::Exposition,
    alive: Arc<dyn Fn() -> Result<(), String> + Send + Sync>,
    stop: Arc<AtomicBool>,
) -> Result<reflector_http::HttpServer, CliError> {
    let handler: reflector_http::Handler =
        Arc::new(
            move |req: &reflector_http::Request<'_>| match (req.method, req.target.split('?').next()) {
                ("GET", Some("/metrics")) => {
                    let format = reflector_http::expo::Format::negotiate(req.accept);
                    reflector_http::Response {
                        status: 200,
                        content_type: format.content_type(),
                        body: exposition.encode(format).into(),
                        retry_after_s: None,
                    }
                }
                ("GET", Some("/healthz")) => match alive() {
                    Ok(()) => reflector_http::Response::text(200, "ok\n"),
                    Err(dead) => reflector_http::Response::text(503, format!("{dead}\n")),
                },
                ("GET", _) => reflector_http::Response::text(404, "not found: try /metrics or /healthz\n"),
                (m, _) => reflector_http::Response::text(405, format!("method {m} not allowed: use GET /metrics\n")),
            },
        );
    Ok(reflector_http::HttpServer::start_on(
        "metrics", listener, limits, tls, handler, stop,
    )?)
}

/// `reflector serve`.
pub fn run(args: ServeArgs, stop: Arc<AtomicBool>) -> Result<(), CliError> {
    let token_secret = reflector_proto::auth::SecretRing::from_file(&args.secret_file)?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    let backend = match args.backend {
        Some(b) => b,
        None => {
            let b = BackendKind::best();
            tracing::info!("backend {b} chosen (the best this kernel supports; --backend to override)");
            b
        }
    };
    if args.checkpoint_port.is_some() && args.checkpoint_memory < args.checkpoint_max_bytes {
        return Err(format!(
            "--checkpoint-memory ({}) must be at least --checkpoint-max-bytes ({}): no upload of the largest size could be stored",
            args.checkpoint_memory, args.checkpoint_max_bytes
        )
        .into());
    }
    let cfg = ServerConfig {
        bind: args.bind,
        ports: args.ports.0.clone(),
        keys: Keys {
            token_secret,
            reflector_id: args.reflector_id,
            cookie_key: Secret::random(),
        },
        policy: Policy {
            member_timeout_ms: millis(args.member_timeout()),
            max_members: args.max_members as usize,
            keepalive_ms: u16::try_from((millis(args.member_timeout()) / 4).clamp(50, 60_000)).unwrap_or(u16::MAX),
            replies_per_s: args.replies_per_s,
            player_replies_per_s: args.player_replies_per_s,
            member_replies_per_s: args.member_replies_per_s,
            data_tags: args.data_tags == Toggle::On,
            data_instance: args.data_instance == Toggle::On,
            checkpoint_port: 0,
            max_per_ip: args.max_per_ip as usize,
            member_pps: args.member_rate_pps,
            member_bytes_per_s: args.member_rate_bytes,
        },
        backend,
        fallback: !args.strict_backend,
        threads,
        rcvbuf: args.rcvbuf,
        sndbuf: args.sndbuf,
        group_tags: args.group_data_tags.clone(),
        group_instance: args.group_data_instance.clone(),
        checkpoint: args.checkpoint_port.map(|port| CheckpointConfig {
            port,
            every_ms: millis(args.checkpoint_every()),
            max_bytes: args.checkpoint_max_bytes,
            timeout: args.checkpoint_timeout(),
            hello_timeout: args.checkpoint_hello_timeout(),
            memory: args.checkpoint_memory,
            max_conns: args.checkpoint_conns as usize,
            max_conns_per_ip: args.checkpoint_conns_per_ip as usize,
            fetch_every_ms: millis(args.checkpoint_fetch_every()),
            zero_copy: args.checkpoint_zerocopy == Toggle::On,
        }),
    };
    // Certificate problems are reported before anything starts.
    let tls = args.http.tls()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let http = args.metrics.map(bind_metrics).transpose()?;
    let server = Server::start(cfg, Arc::clone(&stop))?;
    let ports = server.ports();
    if let Some(p) = server.checkpoint_port() {
        tracing::info!(
            "checkpoint channel on tcp {}:{p}: one request per group every {:?}",
            args.bind,
            args.checkpoint_every()
        );
    }
    tracing::info!(
        "reflector {} serving {} group(s) on {}:{}-{} with backend {} on {} thread(s)",
        args.reflector_id,
        ports.len(),
        args.bind,
        ports.first().copied().unwrap_or(0),
        ports.last().copied().unwrap_or(0),
        server.registry().backend,
        threads.min(ports.len())
    );
    let metrics = match http {
        Some(listener) => {
            if let Some(addr) = args.metrics {
                tracing::info!("metrics at {scheme}://{addr}/metrics");
            }
            let liveness = server.liveness();
            Some(serve_metrics(
                listener,
                args.http.limits(),
                tls,
                crate::metrics::Exposition::new(server.registry().clone(), args.metrics_per_group),
                Arc::new(move || liveness.check()),
                Arc::clone(&stop),
            )?)
        }
        None => None,
    };
    let deadline = args.duration.map(|d| Instant::now() + d);
    while !stop.load(Relaxed) {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    server.stop();
    let registry = server.join()?;
    if let Some(m) = metrics {
        m.stop();
    }
    print!("{}", registry.summary_table());
    if let Some(path) = &args.summary_json {
        std::fs::write(path, serde_json::to_string_pretty(&registry.to_json())?)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_failures_name_their_cause() {
        let at: SocketAddr = "10.9.9.9:4000".parse().unwrap();
        let hint = |errno| bind_hint(&at, &io::Error::from_raw_os_error(errno));
        let h = hint(libc::EADDRNOTAVAIL);
        assert!(
            h.contains("10.9.9.9 is not an address of this host") && h.contains("--bind"),
            "{h}"
        );
        assert!(!h.contains("another reflector"), "{h}");
        assert!(hint(libc::EADDRINUSE).contains("another reflector"));
        assert!(hint(libc::EACCES).contains("CAP_NET_BIND_SERVICE"));
    }

    #[test]
    fn group_tags() {
        assert_eq!(parse_group_tags("4001=off"), Ok((4001, false)));
        assert_eq!(parse_group_tags(" 4002 = on "), Ok((4002, true)));
        assert!(parse_group_tags("4001").unwrap_err().contains("PORT=on"));
        assert!(parse_group_tags("4001=maybe").unwrap_err().contains("maybe"));
        assert!(parse_group_tags("x=on").unwrap_err().contains("not a port"));
    }
}
