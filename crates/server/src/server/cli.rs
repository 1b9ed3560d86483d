//! `reflector serve`: its command line (flags, units, their old spellings)
//! and `run`, which turns the flags into a [`ServerConfig`], starts the
//! server and the metrics listener and prints the summary on the way out.

use super::http::{bind_metrics, serve_metrics};
use super::{Server, ServerConfig};
use crate::backend::BackendKind;
use crate::checkpoint::CheckpointConfig;
use crate::membership::{Keys, Policy};
use crate::receive::ReceiveKind;
use crate::CliError;
use oskit::units::{duration_in, secs_or_duration_in};
use reflector_proto::auth::Secret;
use reflector_proto::control::{parse_ports, PortList};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to bind the group ports on.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Group ports: a range `4000-4015`, a list `4000,4002`, or both. Each port is one group.
    #[arg(long, default_value = "4000-4015", value_parser = parse_ports)]
    pub ports: PortList,
    /// File with the secret shared with the control server (hex, or a passphrase of 16+ bytes),
    /// optionally followed by a line `previous SECRET until UNIX_SECONDS` accepted during a
    /// rollover. Re-read when it changes (checked every second) or on SIGHUP; a version that
    /// does not parse is logged and the secret in force kept.
    #[arg(long)]
    pub secret_file: PathBuf,
    /// Fan-out backend: how each DATA reaches the other members (each value's help says what it
    /// does). Default: the best user-space backend this kernel supports. If one that needs
    /// devices (ebpf) cannot run, the reflector says why and falls back to the best user-space
    /// backend, unless --strict-backend.
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Refuse to start if the --backend asked for cannot run, instead of falling back.
    #[arg(long)]
    pub strict_backend: bool,
    /// How datagrams are received: the receive backend (each value's help says what it does). Whichever
    /// it is, a datagram stays in its receive buffer until its fan-out is done. If the one
    /// chosen cannot run here, the reflector refuses to start and says why.
    #[arg(long, value_enum, default_value_t = ReceiveKind::default())]
    pub receive: ReceiveKind,
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
    /// Sealed groups: announce (JOIN_ACK flag bit 2, with the instance flag, bit 1, which it
    /// implies) that every DATA's game payload is sealed end to end under epoch keys the control
    /// servers hand to players (`control --sealing-secret-file`). The reflector never holds those
    /// keys nor reads a sealed payload, so a copy costs what it did; turn it on once the
    /// deployment's control servers hand out keys and its clients seal.
    #[arg(long, value_enum, default_value_t = Toggle::Off)]
    pub data_sealed: Toggle,
    /// Sealing of one group, unlike --data-sealed: PORT=on or PORT=off (repeatable).
    #[arg(long = "group-data-sealed", value_name = "PORT=on|off", value_parser = parse_group_tags)]
    pub group_data_sealed: Vec<(u16, bool)>,
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
    /// Join a fleet: register in this Redis (redis://[user@]host:port, or rediss:// for TLS)
    /// and heartbeat there, so control servers started with the same --registry place cells
    /// here. The id tokens must name then comes from the registry, unless --reflector-id is
    /// nonzero (refused if a live reflector holds it). The password goes in
    /// --registry-password-file, never in the URL.
    #[arg(long, value_name = "URL")]
    pub registry: Option<String>,
    /// File with the registry's password (one line).
    #[arg(long, value_name = "FILE", requires = "registry")]
    pub registry_password_file: Option<PathBuf>,
    /// PEM file of the CA that signed the registry's certificate (a rediss:// URL): the server
    /// is checked against it instead of the system's roots.
    #[arg(long, value_name = "FILE", requires = "registry")]
    pub registry_ca_file: Option<PathBuf>,
    /// PEM client certificate for a registry that requires one (redis.conf tls-auth-clients
    /// yes, its default), with --registry-key-file.
    #[arg(long, value_name = "FILE", requires_all = ["registry", "registry_key_file"])]
    pub registry_cert_file: Option<PathBuf>,
    /// PEM private key of --registry-cert-file.
    #[arg(long, value_name = "FILE", requires = "registry_cert_file")]
    pub registry_key_file: Option<PathBuf>,
    /// Prefix of the registry's keys (several fleets can share one Redis).
    #[arg(long, value_name = "PREFIX", default_value = "reflector")]
    pub registry_prefix: String,
    /// How long the registry keeps this reflector without a heartbeat (it heartbeats every
    /// third of it): the cells of a reflector that died move after this.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = duration_in(ms(300), ms(600_000)))]
    pub registry_ttl: Duration,
    /// The address members reach this reflector at, as the registry announces it. Default:
    /// --bind (which must then be a specific address).
    #[arg(long, value_name = "IP", requires = "registry")]
    pub advertise: Option<IpAddr>,
    /// On SIGTERM or Ctrl-C, drain for at most this long before stopping: /readyz answers 503,
    /// every member is told once a second, with a MOVED under its key, that this reflector stops
    /// serving it (its client asks the control server where to go), and the reflector stops as
    /// soon as the last member has left, or at the deadline. 0 (the default): stop at once. A
    /// second signal exits at once (status 1).
    #[arg(long, value_name = "DURATION", default_value = "0s", value_parser = duration_in(Duration::ZERO, DAY))]
    pub drain_timeout: Duration,
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

/// A sealed group announces the instance flag too (a sealed payload starts
/// with the instance id): refuses a group whose instance flag is turned off
/// while it is sealed, rather than announce what the option said not to.
pub fn check_sealed_needs_instance(
    sealed_default: bool,
    group_sealed: &[(u16, bool)],
    group_instance: &[(u16, bool)],
) -> Result<(), String> {
    for &(port, instance) in group_instance {
        let sealed = group_sealed
            .iter()
            .find(|(p, _)| *p == port)
            .map_or(sealed_default, |&(_, on)| on);
        if sealed && !instance {
            return Err(format!(
                "--group-data-instance {port}=off, but group {port} is sealed (--data-sealed or \
                 --group-data-sealed): a sealed payload starts with the instance id, so a sealed group \
                 announces it; drop that option or say --group-data-sealed {port}=off"
            ));
        }
    }
    Ok(())
}

/// The warning for a reflector that serves sealed groups checkpoints too
/// rarely (docs/protocol.md, "Sealed checkpoints"): a joiner opens a
/// checkpoint only with the keys of its own grant, which are sure to fit
/// one younger than the overlap window. `None` when all is well.
pub fn sealed_checkpoint_warning(
    sealed_default: bool,
    group_sealed: &[(u16, bool)],
    checkpoints: bool,
    every: Duration,
) -> Option<String> {
    let any_sealed = sealed_default || group_sealed.iter().any(|&(_, on)| on);
    let overlap = Duration::from_secs(reflector_proto::sealed::OVERLAP_S);
    (any_sealed && checkpoints && every >= overlap).then(|| {
        format!(
            "--checkpoint-every {every:?} is not below the sealing overlap window ({overlap:?}): a joiner \
             of a sealed group may fetch a checkpoint sealed under an epoch its grant no longer carries \
             and refuse it (checkpoint_no_key) until the next upload; ask more often (the default is 5s)"
        )
    })
}

#[cfg(test)]
mod sealed_option_tests {
    use super::{check_sealed_needs_instance, sealed_checkpoint_warning};
    use std::time::Duration;

    #[test]
    fn rare_checkpoints_in_sealed_groups_are_warned_about() {
        let s = Duration::from_secs;
        assert_eq!(sealed_checkpoint_warning(true, &[], true, s(5)), None);
        assert_eq!(
            sealed_checkpoint_warning(false, &[], true, s(600)),
            None,
            "no sealed group"
        );
        assert_eq!(
            sealed_checkpoint_warning(true, &[], false, s(600)),
            None,
            "no checkpoint port"
        );
        let w = sealed_checkpoint_warning(false, &[(4000, true)], true, s(60)).expect("one sealed group");
        assert!(w.contains("checkpoint_no_key") && w.contains("60s"), "{w}");
    }

    #[test]
    fn a_sealed_group_cannot_turn_its_instance_flag_off() {
        assert!(check_sealed_needs_instance(true, &[], &[]).is_ok());
        assert!(check_sealed_needs_instance(true, &[], &[(4000, true)]).is_ok());
        let e = check_sealed_needs_instance(true, &[], &[(4000, false)]).unwrap_err();
        assert!(e.contains("4000=off") && e.contains("sealed"), "{e}");
        assert!(check_sealed_needs_instance(true, &[(4000, false)], &[(4000, false)]).is_ok());
        assert!(check_sealed_needs_instance(false, &[(4001, true)], &[(4000, false)]).is_ok());
        assert!(check_sealed_needs_instance(false, &[(4000, true)], &[(4000, false)]).is_err());
    }
}

/// An option that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    On,
    Off,
}

/// `reflector serve`.
pub fn run(args: ServeArgs, stop: Arc<AtomicBool>) -> Result<(), CliError> {
    let token_ring = reflector_proto::auth::SecretRing::from_file(&args.secret_file)?;
    // SIGHUP re-reads the secret file rather than ending the process.
    let hangup = oskit::signal::flag_on(&[oskit::signal::SIGHUP], oskit::signal::Second::Ignore)
        .map_err(|e| format!("cannot install the SIGHUP handler: {e}"))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    check_sealed_needs_instance(
        args.data_sealed == Toggle::On,
        &args.group_data_sealed,
        &args.group_data_instance,
    )?;
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
    // In a fleet the id tokens name is the registry's: registered first.
    let registrar = match &args.registry {
        Some(url) => {
            let rcfg = reflector_registry::RegistryConfig {
                url: reflector_registry::RegistryConfig::url_with_password(
                    url,
                    args.registry_password_file.as_deref(),
                )?,
                prefix: args.registry_prefix.clone(),
                ttl: args.registry_ttl,
                tls: reflector_registry::RegistryTls {
                    ca_file: args.registry_ca_file.clone(),
                    client_cert: args.registry_cert_file.clone().zip(args.registry_key_file.clone()),
                },
            };
            let advertise = args.advertise.unwrap_or(args.bind);
            if advertise.is_unspecified() {
                return Err(
                    "--registry: give --advertise, the address members reach this reflector at (--bind is a wildcard)"
                        .into(),
                );
            }
            if args.ports.0.contains(&0) {
                return Err("--registry: give the group ports (port 0 cannot be announced)".into());
            }
            let capacity = args.max_members * args.ports.0.len() as u64;
            let r = super::fleet::register(
                &rcfg,
                &token_ring,
                args.reflector_id,
                advertise,
                &args.ports.0,
                capacity,
            )?;
            Some((r, rcfg.heartbeat_every()))
        }
        None => None,
    };
    let reflector_id = registrar.as_ref().map_or(args.reflector_id, |(r, _)| r.id());
    let cfg = ServerConfig {
        bind: args.bind,
        ports: args.ports.0.clone(),
        keys: Keys {
            token_secret: token_ring.clone(),
            reflector_id,
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
            data_sealed: args.data_sealed == Toggle::On,
            checkpoint_port: 0,
            max_per_ip: args.max_per_ip as usize,
            member_pps: args.member_rate_pps,
            member_bytes_per_s: args.member_rate_bytes,
        },
        backend,
        receive: args.receive,
        fallback: !args.strict_backend,
        threads,
        rcvbuf: args.rcvbuf,
        sndbuf: args.sndbuf,
        group_tags: args.group_data_tags.clone(),
        group_instance: args.group_data_instance.clone(),
        group_sealed: args.group_data_sealed.clone(),
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
    // The loops and the metrics listener stop when this run says, not on
    // the signal itself: a drain keeps them serving after it.
    let serving_stop = Arc::new(AtomicBool::new(false));
    let server = match Server::start(cfg, Arc::clone(&serving_stop)) {
        Ok(s) => s,
        Err(e) => {
            if let Some((mut r, _)) = registrar {
                let _ = r.deregister();
            }
            return Err(e.into());
        }
    };
    let ports = server.ports();
    if let Some(w) = sealed_checkpoint_warning(
        args.data_sealed == Toggle::On,
        &args.group_data_sealed,
        server.checkpoint_port().is_some(),
        args.checkpoint_every(),
    ) {
        tracing::warn!("{w}");
    }
    if let Some(p) = server.checkpoint_port() {
        tracing::info!(
            "checkpoint channel on tcp {}:{p}: one request per group every {:?}",
            args.bind,
            args.checkpoint_every()
        );
    }
    tracing::info!(
        "reflector {} serving {} group(s) on {}:{}-{} with backend {} (receive {}) on {} thread(s)",
        reflector_id,
        ports.len(),
        args.bind,
        ports.first().copied().unwrap_or(0),
        ports.last().copied().unwrap_or(0),
        server.registry().backend,
        args.receive,
        threads.min(ports.len())
    );
    let draining = Arc::new(AtomicBool::new(false));
    let heartbeats = match registrar {
        Some((r, every)) => Some(
            super::fleet::Heartbeats::start(
                r,
                every,
                args.registry_ttl,
                server.ports().to_vec(),
                server.registry().clone(),
                Arc::clone(&draining),
                server.shared_secret(),
                server.drain_state(),
            )
            .map_err(|e| format!("cannot start the registry's heartbeat thread: {e}"))?,
        ),
        None => None,
    };
    let metrics = match http {
        Some(listener) => {
            if let Some(addr) = args.metrics {
                tracing::info!("metrics at {scheme}://{addr}/metrics");
            }
            let liveness = match &heartbeats {
                Some(h) => server.liveness().and(&h.liveness()),
                None => server.liveness(),
            };
            let (alive, draining) = (liveness.clone(), Arc::clone(&draining));
            Some(serve_metrics(
                listener,
                args.http.limits(),
                tls,
                crate::metrics::Exposition::new(server.registry().clone(), args.metrics_per_group),
                Arc::new(move || alive.check()),
                Arc::new(move || {
                    if draining.load(Relaxed) {
                        return Err("draining".into());
                    }
                    liveness.check()
                }),
                Arc::clone(&serving_stop),
            )?)
        }
        None => None,
    };
    let mut secret_file = super::secret::SecretFile::new(&args.secret_file, &token_ring, hangup, &server);
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut drain_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break;
        }
        if stop.load(Relaxed) {
            if args.drain_timeout.is_zero() {
                break;
            }
            match drain_until {
                None => {
                    draining.store(true, Relaxed);
                    server.drain(args.drain_timeout);
                    drain_until = Some(now + args.drain_timeout);
                    tracing::info!(
                        "draining: {} member(s) told to move; stopping when the last has left, within {:?}",
                        server.members(),
                        args.drain_timeout
                    );
                }
                Some(until) if now >= until => {
                    tracing::warn!("drain timeout: stopping with {} member(s) still here", server.members());
                    break;
                }
                Some(_) if server.members() == 0 => {
                    tracing::info!("drained: every member has left; stopping");
                    break;
                }
                Some(_) => {}
            }
        }
        secret_file.poll(&server);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Out of the registry first: the control servers place the cells
    // elsewhere while this one finishes.
    if let Some(h) = heartbeats {
        h.stop();
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
    fn group_tags() {
        assert_eq!(parse_group_tags("4001=off"), Ok((4001, false)));
        assert_eq!(parse_group_tags(" 4002 = on "), Ok((4002, true)));
        assert!(parse_group_tags("4001").unwrap_err().contains("PORT=on"));
        assert!(parse_group_tags("4001=maybe").unwrap_err().contains("maybe"));
        assert!(parse_group_tags("x=on").unwrap_err().contains("not a port"));
    }
}
