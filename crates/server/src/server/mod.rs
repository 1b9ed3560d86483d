//! The reflector server: one UDP socket per group port, groups spread over
//! one event loop per core (each loop owns its groups outright, so there is
//! no shared mutable state and no lock on the data path).
//!
//! Per batch of datagrams the hot path does one `recvmmsg` into buffers of
//! the loop's receive pool (or takes what io_uring's multishot receives put
//! in its buffer ring: `--receive`); per datagram one membership decision
//! (no allocation for DATA) and the backend's sends of that same buffer:
//! nothing is copied or allocated in user space, and a fan-out that waits
//! keeps the buffer itself. A fan-out that has to wait (full socket buffer
//! or device queue) parks its group — the group's socket is not read until
//! it completes, so its datagrams stay in order — while the loop goes on
//! serving its other groups; it resumes on `EPOLLOUT` or a timer.
//!
//! Submodules: [`cli`] (`reflector serve`'s flags and `run`), `event_loop`
//! (one loop's groups, sockets and backend), [`http`] (the metrics
//! listener) and the start-up errors; this file starts and stops the server.

pub mod cli;
mod error;
mod event_loop;
mod fleet;
pub mod http;
mod secret;

pub use error::{bind_hint, ServeError};
use event_loop::{event_loop, NewSlot};
use secret::SharedSecret;

use crate::backend::{Backend, BackendKind};
use crate::backend::{RateCaps, ResendTarget};
use crate::checkpoint::{Channel, CheckpointConfig};
use crate::liveness::{Liveness, Watch};
use crate::membership::{Group, Keys, Policy};
use crate::metrics::Registry;
use crate::receive::{ReceiveKind, Support};
use reflector_proto::auth::{Secret, SecretRing};
use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

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
    /// How the event loops receive datagrams.
    pub receive: ReceiveKind,
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
    /// Groups whose sealed flag differs from [`Policy::data_sealed`]:
    /// (port, on).
    pub group_sealed: Vec<(u16, bool)>,
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
            receive: ReceiveKind::default(),
            fallback: false,
            threads: 1,
            rcvbuf: 4 << 20,
            sndbuf: 4 << 20,
            group_tags: Vec::new(),
            group_instance: Vec::new(),
            group_sealed: Vec::new(),
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
    secret: Arc<SharedSecret>,
    drain: Arc<Drain>,
}

/// A drain under way: until when (monotonic ms; 0: not draining) the
/// loops keep serving while they tell every member to move (MOVED).
#[derive(Debug, Default)]
pub(crate) struct Drain {
    until_mono_ms: AtomicU64,
    /// Groups no cell is placed on any more (the fleet moved their cells
    /// elsewhere): their members are told to move, reason `reassigned`.
    reassigned: std::sync::Mutex<Vec<u16>>,
    /// In a fleet a drain tells a group's members only once its cells are
    /// placed elsewhere (in `reassigned`), so they find the new placement
    /// at the first ask; alone, every group at once.
    fleet: AtomicBool,
}

impl Drain {
    /// The deadline, if draining.
    pub(crate) fn until_mono_ms(&self) -> Option<u64> {
        Some(self.until_mono_ms.load(Relaxed)).filter(|&t| t != 0)
    }

    pub(crate) fn reassigned(&self) -> Vec<u16> {
        self.reassigned.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn reassign(&self, ports: Vec<u16>) {
        *self.reassigned.lock().unwrap_or_else(|p| p.into_inner()) = ports;
    }

    pub(crate) fn set_fleet(&self) {
        self.fleet.store(true, Relaxed);
    }

    pub(crate) fn in_fleet(&self) -> bool {
        self.fleet.load(Relaxed)
    }
}

impl Server {
    /// Binds every group port (so configuration errors surface here), then
    /// starts the event loops.
    pub fn start(mut cfg: ServerConfig, stop: Arc<AtomicBool>) -> Result<Server, ServeError> {
        if let Support::Unsupported(why) = cfg.receive.probe() {
            return Err(ServeError::Config(format!("receive {}: {why}", cfg.receive)));
        }
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
        let nthreads = cfg.threads.clamp(1, socks.len().max(1));
        let mut registry = Registry::new(backend.kind().name(), &ports);
        registry.receive_pools = (0..nthreads).map(|_| Arc::default()).collect();
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
        let mut per_thread: Vec<Vec<NewSlot>> = (0..nthreads).map(|_| Vec::new()).collect();
        for (i, sock) in socks.into_iter().enumerate() {
            let (port, counters) = (registry.groups[i].0, Arc::clone(&registry.groups[i].1));
            let mut group = Group::new(port);
            if let Some(&(_, on)) = cfg.group_tags.iter().find(|(p, _)| *p == port) {
                group.set_tags(on);
            }
            if let Some(&(_, on)) = cfg.group_instance.iter().find(|(p, _)| *p == port) {
                group.set_instance(on);
            }
            if let Some(&(_, on)) = cfg.group_sealed.iter().find(|(p, _)| *p == port) {
                group.set_sealed(on);
            }
            per_thread[i % nthreads].push(NewSlot { sock, group, counters });
        }
        let secret = SharedSecret::new(cfg.keys.token_secret.clone());
        let drain = Arc::new(Drain::default());
        let mut threads = Vec::new();
        for (t, slots) in per_thread.into_iter().enumerate() {
            let (keys, policy, stop2) = (cfg.keys.clone(), cfg.policy, Arc::clone(&stop));
            let (secret, drain) = (Arc::clone(&secret), Arc::clone(&drain));
            let board = board.clone();
            let (backend, receive) = (backend.clone(), cfg.receive);
            let pool_counters = Arc::clone(&registry.receive_pools[t]);
            let h = watch.spawn(&format!("reflector-{t}"), move || {
                event_loop(
                    slots,
                    keys,
                    secret,
                    drain,
                    &policy,
                    backend,
                    receive,
                    pool_counters,
                    board,
                    &stop2,
                )
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
            secret,
            drain,
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

    /// Replaces the secret joins are checked with (a rollover: the new
    /// secret, with the old one as `previous` until the tokens it signed
    /// have expired). Every event loop uses it from its next wake-up, within
    /// 100 ms; members already admitted keep their session keys.
    pub fn set_token_secret(&self, ring: SecretRing) {
        self.secret.replace(ring);
    }

    /// Starts draining (fleet drain, `serve --drain-timeout`): the loops
    /// keep serving, and tell every member once a second, with MOVED under
    /// its key, that this reflector stops serving it within `within`
    /// (counted in `moved_sent`). Stopping stays the caller's: when the
    /// members are gone ([`Server::members`]) or at the deadline.
    pub fn drain(&self, within: std::time::Duration) {
        let until = oskit::clock::mono_now_ms()
            .saturating_add(within.as_millis() as u64)
            .max(1);
        self.drain.until_mono_ms.store(until, Relaxed);
    }

    /// The drain and reassignment state the loops read.
    pub(crate) fn drain_state(&self) -> Arc<Drain> {
        Arc::clone(&self.drain)
    }

    /// Where new token secrets come from, for the registry's heartbeats.
    pub(crate) fn shared_secret(&self) -> Arc<SharedSecret> {
        Arc::clone(&self.secret)
    }

    /// The groups on `ports` are served elsewhere now (the fleet placed
    /// their cells on another reflector, e.g. while this one was cut off
    /// from the registry): their members are told so once a second with a
    /// MOVED (reason `reassigned`), and follow it. Replaces the previous set.
    pub fn reassign(&self, ports: Vec<u16>) {
        self.drain.reassign(ports);
    }

    /// Whether [`Server::drain`] was called.
    pub fn draining(&self) -> bool {
        self.drain.until_mono_ms().is_some()
    }

    /// Members of all groups now (as the loops last published them).
    pub fn members(&self) -> u64 {
        self.registry.groups.iter().map(|(_, c)| c.members.load(Relaxed)).sum()
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
