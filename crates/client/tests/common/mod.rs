//! Test helpers. Every use of the `reflector` crate (the server under
//! test) is in this one module, so that when the server moves to its own
//! crate only this file changes.

#![allow(dead_code, reason = "each test file uses a part of the helpers")]

pub mod net;

use reflector_client::{Client, Config, Event, Token, TokenSource};
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::protocol::SessionKeys;
use reflector_server::backend::BackendKind;
use reflector_server::checkpoint::CheckpointConfig;
use reflector_server::membership::Policy;
use reflector_server::metrics::Snapshot;
use reflector_server::server::{Server, ServerConfig};
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The secret the reflectors and the tests' tokens share.
pub const SECRET: [u8; 32] = [0x3c; 32];

/// The keepalive interval the test reflectors announce: short, so
/// rejoins and rebinding happen within a test's time.
pub const KEEPALIVE_MS: u16 = 500;

/// A reflector on 127.0.0.1 with one group.
pub struct Reflector {
    server: Server,
    pub port: u16,
}

/// What a test reflector serves; each `Reflector::start*` names one.
struct Spec {
    ports: Vec<u16>,
    keepalive_ms: u16,
    instance: bool,
    sealed: bool,
    checkpoint: Option<CheckpointConfig>,
}

impl Spec {
    /// `groups` groups on free ports, instance ids on, clear, no channel.
    fn groups(groups: usize) -> Spec {
        Spec {
            ports: vec![0; groups],
            keepalive_ms: KEEPALIVE_MS,
            instance: true,
            sealed: false,
            checkpoint: None,
        }
    }
}

impl Reflector {
    /// Starts `spec` on 127.0.0.1 with DATA tags on (the default policy).
    fn launch(spec: Spec) -> Reflector {
        let channel = spec.checkpoint.is_some();
        let cfg = ServerConfig {
            ports: spec.ports,
            policy: Policy {
                keepalive_ms: spec.keepalive_ms,
                data_instance: spec.instance,
                data_sealed: spec.sealed,
                ..Policy::default()
            },
            checkpoint: spec.checkpoint,
            ..ServerConfig::new(
                [127, 0, 0, 1].into(),
                Secret::new(&SECRET).expect("a valid secret"),
                BackendKind::Sendto,
            )
        };
        let server = Server::start(cfg, Arc::new(AtomicBool::new(false))).expect("the reflector starts");
        if channel {
            assert!(server.checkpoint_port().is_some_and(|p| p != 0), "the channel is bound");
        }
        let port = server.ports()[0];
        Reflector { server, port }
    }

    /// One group on `port` (0: any), DATA tags on, instance ids on or off.
    pub fn start(port: u16, instance: bool) -> Reflector {
        Reflector::launch(Spec {
            ports: vec![port],
            instance,
            ..Spec::groups(1)
        })
    }

    /// One group with the checkpoint channel on (`ck`), instance ids on.
    pub fn start_checkpoints(ck: CheckpointConfig) -> Reflector {
        Reflector::launch(Spec {
            checkpoint: Some(ck),
            ..Spec::groups(1)
        })
    }

    /// One group (instance ids on) announcing a keepalive of
    /// `keepalive_ms`, with the checkpoint channel `ck` if given: a long
    /// keepalive makes a quiet reflector (its PROBEs and the client's
    /// ECHOs as rare as that), so a test sees what wakes a client besides.
    pub fn start_keepalive(keepalive_ms: u16, ck: Option<CheckpointConfig>) -> Reflector {
        Reflector::launch(Spec {
            keepalive_ms,
            checkpoint: ck,
            ..Spec::groups(1)
        })
    }

    /// `groups` groups on free ports, DATA tags and instance ids on: the
    /// cells of an area (see [`area_control_server`]).
    pub fn start_groups(groups: usize) -> Reflector {
        Reflector::launch(Spec::groups(groups))
    }

    /// One sealed group (`serve --data-sealed on`: JOIN_ACK flag bit 2 with
    /// the instance flag), DATA tags on.
    pub fn start_sealed() -> Reflector {
        Reflector::start_sealed_groups(1)
    }

    /// `groups` sealed groups on free ports (as [`Reflector::start_sealed`]):
    /// the cells of a sealed area.
    pub fn start_sealed_groups(groups: usize) -> Reflector {
        Reflector::launch(Spec {
            sealed: true,
            ..Spec::groups(groups)
        })
    }

    /// One sealed group (as [`Reflector::start_sealed`]) with the
    /// checkpoint channel on (`ck`).
    pub fn start_sealed_checkpoints(ck: CheckpointConfig) -> Reflector {
        Reflector::launch(Spec {
            sealed: true,
            checkpoint: Some(ck),
            ..Spec::groups(1)
        })
    }

    /// The checkpoint channel's address (with the channel on).
    pub fn checkpoint_addr(&self) -> SocketAddr {
        let port = self.server.checkpoint_port().expect("the checkpoint channel is on");
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// Every group port, in the order the groups were given.
    pub fn ports(&self) -> Vec<u16> {
        self.server.ports().to_vec()
    }

    /// The reflector's counters, summed over its groups.
    pub fn counters(&self) -> Snapshot {
        self.server.registry().total()
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Drains (`serve --drain-timeout`): MOVED to every member.
    pub fn drain(&self, within: Duration) {
        self.server.drain(within);
    }

    /// Stops it and waits until its sockets are closed (the port is free).
    pub fn stop(self) {
        self.server.stop();
        self.server.join().expect("the reflector stops cleanly");
    }
}

/// A token for `player` in `group`, valid `ttl_s`, as the control server
/// would issue it, naming `reflector` as the address to send to.
pub fn token(player: u32, group: u16, reflector: SocketAddr, ttl_s: u64) -> Token {
    let secret = Secret::new(&SECRET).expect("a valid secret");
    let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + ttl_s;
    let token = TokenClaims {
        player,
        reflector: 0,
        group,
        expires_unix_s,
    }
    .sign(&secret);
    Token {
        reflector: reflector.to_string(),
        group,
        player,
        token,
        session_key: SessionKeys::derive(&secret, &token).session,
        expires_unix_s,
        keys: Vec::new(),
    }
}

/// A client on 127.0.0.1 with a token handed in.
pub fn client(player: u32, r: &Reflector) -> Client {
    let cfg = Config {
        local: "127.0.0.1:0".into(),
        ..Config::new(TokenSource::Given(token(player, r.port, r.addr(), 300)))
    };
    Client::new(cfg).expect("the client starts")
}

/// Updates `clients` every millisecond until `done` holds, collecting
/// their events; panics after `within`.
pub fn pump_until(
    clients: &mut [&mut Client],
    within: Duration,
    events: &mut Vec<(usize, Event)>,
    mut done: impl FnMut(&mut [&mut Client], &[(usize, Event)]) -> bool,
) {
    let deadline = Instant::now() + within;
    loop {
        for (i, c) in clients.iter_mut().enumerate() {
            c.update(Instant::now());
            while let Some(e) = c.poll_event() {
                events.push((i, e));
            }
        }
        if done(clients, events) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not done within {within:?}; events: {events:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Pumps until every client is a member.
pub fn join_all(clients: &mut [&mut Client]) -> Vec<(usize, Event)> {
    let mut ev = Vec::new();
    pump_until(clients, Duration::from_secs(5), &mut ev, |cs, _| {
        cs.iter().all(|c| c.is_member())
    });
    ev
}

/// A real control server (anonymous joins, tokens for 300 s) whose one
/// cell is `r`'s group; over TLS when `tls` is given.
pub fn control_server(r: &Reflector, tls: Option<reflector_http::Tls>) -> reflector_control::ControlServer {
    world_control_server(vec![r.port], 1, 1, tls)
}

/// A real control server over plain HTTP (anonymous joins, tokens for
/// 300 s) for a world of `cols` x `rows` cells of 100 units, cell i (row
/// by row) served by `r`'s group i.
pub fn area_control_server(r: &Reflector, cols: u32, rows: u32) -> reflector_control::ControlServer {
    let ports = r.ports();
    assert_eq!(ports.len(), (cols * rows) as usize, "one group per cell");
    world_control_server(ports, cols, rows, None)
}

/// The master secret of [`sealing_control_server`]'s world.
pub const SEALING_MASTER: [u8; 32] = [0x5e; 32];
/// Its world name.
pub const SEALING_WORLD: &str = "client tests";

/// A real control server over plain HTTP (anonymous joins, tokens for 300
/// s) whose one cell is `r`'s group, with a sealing secret: its grants
/// carry epoch keys and it serves `/keys` (the default schedule: epochs of
/// 600 s, 60 s of jitter). The sealing state is returned too, for its
/// counters.
pub fn sealing_control_server(
    r: &Reflector,
) -> (
    reflector_control::ControlServer,
    Arc<reflector_control::sealing::Sealing>,
) {
    use reflector_proto::sealed::{MasterSecret, Schedule};
    let sealing = Arc::new(reflector_control::sealing::Sealing::new(
        MasterSecret::new(&SEALING_MASTER).expect("a long enough master secret"),
        SEALING_WORLD,
        Schedule::new(600, 60).expect("a valid schedule"),
        100.0,
    ));
    let s = Arc::clone(&sealing);
    let server = world_control_server_with(vec![r.port], 1, 1, None, move |w| {
        w.with_sealing(s).expect("one cell per group")
    });
    (server, sealing)
}

fn world_control_server(
    ports: Vec<u16>,
    cols: u32,
    rows: u32,
    tls: Option<reflector_http::Tls>,
) -> reflector_control::ControlServer {
    world_control_server_with(ports, cols, rows, tls, |w| w)
}

fn world_control_server_with(
    ports: Vec<u16>,
    cols: u32,
    rows: u32,
    tls: Option<reflector_http::Tls>,
    world_with: impl FnOnce(reflector_control::World) -> reflector_control::World,
) -> reflector_control::ControlServer {
    use reflector_control::{Assign, ControlConfig, ReflectorSpec, World};
    let world = World::new(
        cols,
        rows,
        100.0,
        Assign::RoundRobin,
        &[ReflectorSpec {
            ip: [127, 0, 0, 1].into(),
            ports,
        }],
    )
    .expect("a world");
    let world = world_with(world);
    reflector_control::ControlServer::start_with(
        ControlConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            world,
            secret: Secret::new(&SECRET).expect("a valid secret").into(),
            token_ttl_s: 300,
            auth: None,
        },
        reflector_http::Limits::default(),
        tls,
        Arc::new(AtomicBool::new(false)),
    )
    .expect("the control server starts")
}
