//! `reflector control`'s command line: its options and their value
//! parsers, the start-up checks, and [`run`], which turns them into a
//! running [`ControlServer`]. Kept apart from the server so that the
//! server and the world map stay usable (and tested) without a CLI; this
//! module uses them, they never use it.

use crate::secret::{self, SecretCell};
use crate::world::{Assign, ReflectorSpec, World};
use crate::{fleet, sealing, CliError, ControlConfig, ControlServer};
use reflector_proto::auth::Secret;
use reflector_proto::control::parse_ports;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Endpoints (GET, JSON answers):\n  \
/join?player=ID&x=X&y=Y  the player's cell, its reflector ip:port and group, a signed token \
valid for --token-ttl; needs `Authorization: Bearer <ticket>` unless --anonymous-joins; \
&area=1 or 2 also grants every other group within 1 or 2 cells (one request, one rate-limit unit); \
with --sealing-secret-file each grant has `keys`, the epoch keys of its group's cells, and with \
&sign_key=HEX (the player's Ed25519 public key) `control_public` and `certificate`\n  \
/keys?token=T&at=A&mac=M  with --sealing-secret-file: those keys again, for the holder of a current \
token T (hex) and its session key: A its Unix seconds, M = HMAC(mac key, \"reflector-keys-v1\" || \
token || A as u64)[..16] (hex); 401 bad token/MAC or A off by over 60 s, 429 beyond \
--refresh-rate-player\n  \
/world                   the grid and the cell -> group mapping\n  \
/healthz                 liveness\n  \
/metrics                 Prometheus metrics (text 0.0.4; OpenMetrics if Accept asks for it)\n\
Bad parameters get 400 with {\"error\": \"...\"} naming the problem.\n\n\
Example (a shared secret and a development ticket key file first; `reflector ticket --help`):\n  \
od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > secret\n  \
reflector ticket --ticket-keys tickets.toml > /dev/null\n  \
reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml --grid 8x8\n\n\
Sealed groups (their reflectors run `serve --data-sealed on`): a second, separate secret that no \
reflector gets, and the world's name:\n  \
od -An -tx1 -N32 /dev/urandom | tr -d ' \\n' > sealing-secret\n  \
reflector control --secret-file secret --reflector 127.0.0.1:4000-4015 --ticket-keys tickets.toml \
--sealing-secret-file sealing-secret --world my-world")]
pub struct ControlArgs {
    /// HTTP address to listen on.
    #[arg(long, default_value = "127.0.0.1:8700")]
    pub listen: SocketAddr,
    /// File with the secret shared with the reflectors (hex, or a passphrase of 16+ bytes).
    #[arg(long)]
    pub secret_file: PathBuf,
    /// A reflector and its group ports, as clients reach it: IP:PORTS, e.g.
    /// 127.0.0.1:4000-4015 or 10.0.0.2:4000,4002. Repeat for several reflectors.
    #[arg(long = "reflector", required_unless_present = "registry", conflicts_with = "registry", value_parser = parse_reflector)]
    pub reflectors: Vec<ReflectorSpec>,
    /// A fleet instead of --reflector: place cells on the live reflectors registered in this
    /// Redis (redis://[user@]host:port, or rediss:// for TLS) by `serve --registry`. Several
    /// control servers with the same registry agree on every placement.
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
    /// Prefix of the registry's keys (the reflectors' --registry-prefix).
    #[arg(long, value_name = "PREFIX", default_value = "reflector")]
    pub registry_prefix: String,
    /// World grid, COLSxROWS cells.
    #[arg(long, default_value = "8x8", value_parser = parse_grid)]
    pub grid: (u32, u32),
    /// Side of one square cell, in world units.
    #[arg(long, default_value_t = 100.0)]
    pub cell_size: f64,
    /// How cells map onto (reflector, port) targets: round-robin (neighbours on
    /// different groups) or blocks (contiguous runs of cells per group).
    #[arg(long, value_enum, default_value_t = Assign::RoundRobin)]
    pub assign: Assign,
    /// Lifetime of issued join tokens (e.g. 5m; a bare number is seconds), from 1s to a day;
    /// whole seconds.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = token_ttl)]
    pub token_ttl: std::time::Duration,
    /// Serve plain HTTP on a non-loopback --listen address. The control server hands out
    /// join tokens, so anywhere but loopback it wants --tls-cert/--tls-key; say this only
    /// where the network is yours (a lab's private links, a test).
    #[arg(long)]
    pub insecure_http: bool,
    /// Key file of the game backend's player tickets (TOML, keys by kid: HS256 secrets,
    /// EdDSA/ES256 public keys; re-read when it changes). /join then needs
    /// `Authorization: Bearer <ticket>` and issues tokens only for the ticket's player.
    #[arg(long, required_unless_present = "anonymous_joins")]
    pub ticket_keys: Option<PathBuf>,
    /// Issue join tokens to anyone for any player id (no tickets): for a closed test network
    /// only, since then anybody can take over any player's membership.
    #[arg(long, conflicts_with = "ticket_keys")]
    pub anonymous_joins: bool,
    /// Tickets accepted per second per player (bursts of five times as many).
    #[arg(long, default_value_t = 2.0)]
    pub ticket_rate_player: f64,
    /// Requests accepted per second per source address (bursts of twice as many): enough for a
    /// household behind one NAT, not for a flood.
    #[arg(long, default_value_t = 20.0)]
    pub ticket_rate_ip: f64,
    /// Sealed groups: file with the master secret of the world's epoch keys (hex, or 32+ bytes;
    /// one line, never rolled over). Only control servers hold it, never a reflector, and it is
    /// not --secret-file. With it every grant carries `keys` (the epoch keys of the cells its
    /// group serves) and GET /keys refreshes them; without it answers have no `keys`.
    #[arg(long, value_name = "FILE", requires = "world")]
    pub sealing_secret_file: Option<PathBuf>,
    /// The world's name (with --sealing-secret-file): cell ids, and so every epoch key, start
    /// with its hash. Every control server of a fleet gives the same one; worlds that share a
    /// master secret need distinct names.
    #[arg(long, value_name = "NAME", requires = "sealing_secret_file")]
    pub world: Option<String>,
    /// Length L of a sealing epoch (keys rotate once per epoch and cell), from 2m to a day;
    /// fixed for the life of the master secret.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = epoch_length)]
    pub epoch_length: Duration,
    /// Bound J of the jitter that spreads the cells' rotations (at most half of
    /// --epoch-length); fixed for the life of the master secret.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = epoch_jitter)]
    pub epoch_jitter: Duration,
    /// GET /keys requests accepted per second per player (bursts of five times as many): a
    /// client asks about once an epoch and after each MOVED.
    #[arg(long, default_value_t = 1.0)]
    pub refresh_rate_player: f64,
    #[command(flatten)]
    pub http: reflector_http::HttpArgs,
}

/// `--epoch-length`: twice the overlap (2 minutes) to a day, whole seconds.
fn epoch_length(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(
        Duration::from_secs(sealing::MIN_EPOCH_LENGTH_S),
        Duration::from_secs(86_400),
    )(s)
}

/// `--epoch-jitter`: up to half a day (and half the epoch, checked with it).
fn epoch_jitter(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(Duration::ZERO, Duration::from_secs(43_200))(s)
}

/// The sealing configuration of `control`'s options, if it has a sealing
/// secret.
fn sealing_of(
    args: &ControlArgs,
    tokens: &reflector_proto::auth::SecretRing,
) -> Result<Option<sealing::Sealing>, CliError> {
    let Some(path) = &args.sealing_secret_file else {
        return Ok(None);
    };
    let world = args.world.as_deref().unwrap_or_default().trim();
    if world.is_empty() {
        return Err("--world: give the world a name (its cells' ids, and so their keys, derive from it)".into());
    }
    let (length_s, jitter_s) = (args.epoch_length.as_secs(), args.epoch_jitter.as_secs());
    let schedule = reflector_proto::sealed::Schedule::new(length_s, jitter_s)
        .map_err(|_| format!("--epoch-jitter {jitter_s} s is more than half of --epoch-length {length_s} s"))?;
    let rate = args.refresh_rate_player;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(
            format!("--refresh-rate-player must be a positive number of requests per second, got {rate}").into(),
        );
    }
    let master = sealing::read_master_secret(path, tokens)?;
    Ok(Some(sealing::Sealing::new(master, world, schedule, rate)))
}

/// `--token-ttl`: 1 s to a day (tokens carry whole seconds).
fn token_ttl(s: &str) -> Result<Duration, String> {
    oskit::units::secs_or_duration_in(Duration::from_secs(1), Duration::from_secs(86_400))(s)
}

/// Refuses plain HTTP on an address others can reach unless told
/// `--insecure-http`: tokens (and, with protocol v2, session keys) would
/// cross the network in the clear.
pub fn check_transport(listen: SocketAddr, tls: bool, insecure_http: bool) -> Result<(), String> {
    if tls || insecure_http || listen.ip().is_loopback() {
        return Ok(());
    }
    Err(format!(
        "refusing to serve join tokens over plain HTTP on {listen}, which is not a loopback address: \
         give --tls-cert and --tls-key, listen on 127.0.0.1, or say --insecure-http if the network is yours"
    ))
}

/// Parses `IP:PORTS` where PORTS is what `reflector serve --ports` takes.
pub fn parse_reflector(s: &str) -> Result<ReflectorSpec, String> {
    let (ip, ports) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}' is not IP:PORTS (e.g. 127.0.0.1:4000-4015)"))?;
    let ip = ip.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = ip
        .parse()
        .map_err(|_| format!("'{ip}' in '{s}' is not an IP address (e.g. 127.0.0.1:4000-4015)"))?;
    if ip.is_unspecified() {
        return Err(format!(
            "'{s}': give the address clients use to reach the reflector, not {ip}"
        ));
    }
    Ok(ReflectorSpec {
        ip,
        ports: parse_ports(ports)?.0,
    })
}

/// Parses `8x8` into (cols, rows).
pub fn parse_grid(s: &str) -> Result<(u32, u32), String> {
    let (c, r) = s
        .split_once(['x', 'X'])
        .ok_or_else(|| format!("grid '{s}' is not COLSxROWS (e.g. 8x8)"))?;
    let num = |t: &str| {
        t.trim()
            .parse::<u32>()
            .ok()
            .filter(|&v| (1..=4096).contains(&v))
            .ok_or_else(|| format!("'{t}' in grid '{s}' is not a number of cells from 1 to 4096"))
    };
    Ok((num(c)?, num(r)?))
}

/// The start-up line's suggestion: a request that gets a join token from
/// this server as configured (with tickets, the ticket comes from
/// `reflector ticket`, which reads the same key file).
pub fn try_hint(url: &str, ticket_keys: Option<&std::path::Path>) -> String {
    let join = format!("'{url}/join?player=1&x=0&y=0'");
    match ticket_keys {
        Some(keys) => format!(
            "curl -s -H \"Authorization: Bearer $(reflector ticket --ticket-keys {} --player 1)\" {join}",
            keys.display()
        ),
        None => format!("curl -s {join}"),
    }
}

/// `reflector control`.
pub fn run(args: ControlArgs, stop: Arc<AtomicBool>) -> Result<(), CliError> {
    let tls = args.http.tls()?;
    check_transport(args.listen, tls.is_some(), args.insecure_http)?;
    let secret = SecretCell::from(Secret::from_file(&args.secret_file)?);
    // SIGHUP re-reads the secret file rather than ending the process.
    let hangup = oskit::signal::flag_on(&[oskit::signal::SIGHUP], oskit::signal::Second::Ignore)
        .map_err(|e| format!("cannot install the SIGHUP handler: {e}"))?;
    let mut secret_file = secret::SecretFile::new(&args.secret_file, secret.clone(), hangup);
    let fleet_cfg = match &args.registry {
        Some(url) => Some(reflector_registry::RegistryConfig {
            url: reflector_registry::RegistryConfig::url_with_password(url, args.registry_password_file.as_deref())?,
            prefix: args.registry_prefix.clone(),
            tls: reflector_registry::RegistryTls {
                ca_file: args.registry_ca_file.clone(),
                client_cert: args.registry_cert_file.clone().zip(args.registry_key_file.clone()),
            },
            ..reflector_registry::RegistryConfig::new(url)
        }),
        None => None,
    };
    let world = match &fleet_cfg {
        Some(_) => World::for_fleet(args.grid.0, args.grid.1, args.cell_size, fleet::Fleet::default()),
        None => World::new(args.grid.0, args.grid.1, args.cell_size, args.assign, &args.reflectors),
    }
    .map_err(|e| format!("bad world: {e}"))?;
    let world = match sealing_of(&args, &secret.ring())? {
        Some(s) => {
            tracing::info!(
                "sealing: grants carry the epoch keys of world '{}' (epochs of {} s, jitter below {} s); GET /keys refreshes them",
                s.world_name(),
                s.schedule().length_s(),
                s.schedule().jitter_bound_s()
            );
            world.with_sealing(Arc::new(s)).map_err(|e| format!("bad world: {e}"))?
        }
        None => world,
    };
    let _poller = match (&fleet_cfg, &world.fleet) {
        (Some(rc), Some(f)) => Some(fleet::Poller::start(
            rc,
            secret.clone(),
            f.clone(),
            world.all_cells(),
            Arc::clone(&stop),
        )?),
        _ => None,
    };
    for (name, v) in [
        ("--ticket-rate-player", args.ticket_rate_player),
        ("--ticket-rate-ip", args.ticket_rate_ip),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(format!("{name} must be a positive number of requests per second, got {v}").into());
        }
    }
    let auth = match &args.ticket_keys {
        Some(path) => {
            let verifier = crate::players::TicketVerifier::from_file(path)?;
            Some(Arc::new(crate::players::JoinAuth::new(
                verifier,
                args.ticket_rate_player,
                args.ticket_rate_ip,
            )))
        }
        None => {
            tracing::warn!("--anonymous-joins: join tokens for any player id, to anyone; never on an open network");
            None
        }
    };
    let cfg = ControlConfig {
        listen: args.listen,
        world,
        secret,
        token_ttl_s: args.token_ttl.as_secs(),
        auth,
    };
    let (cols, rows, ntargets) = (cfg.world.cols, cfg.world.rows, cfg.world.targets.len());
    let onto = match &fleet_cfg {
        Some(rc) => format!(
            "the fleet's live reflectors (registry {})",
            reflector_registry::redacted(&rc.url)
        ),
        None => format!("{ntargets} group(s) ({})", args.assign),
    };
    let server = ControlServer::start_with(cfg, args.http.limits(), tls, Arc::clone(&stop))?;
    tracing::info!(
        "control server at {}: {cols}x{rows} cells of {} units onto {onto}; try: {}",
        server.addr(),
        args.cell_size,
        try_hint(&server.url(), args.ticket_keys.as_deref())
    );
    let started = Instant::now();
    while !stop.load(Relaxed) {
        secret_file.poll();
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = server.stop();
    tracing::info!(
        "control server stopped after {:.1} s, {served} request(s) served",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_reflectors_and_grids() {
        assert_eq!(
            parse_reflector("127.0.0.1:4000-4002").unwrap(),
            ReflectorSpec {
                ip: "127.0.0.1".parse().unwrap(),
                ports: vec![4000, 4001, 4002]
            }
        );
        assert_eq!(parse_reflector("[::1]:7").unwrap().ports, vec![7]);
        assert!(parse_reflector("4000").unwrap_err().contains("IP:PORTS"));
        assert!(parse_reflector("host:4000").unwrap_err().contains("not an IP"));
        assert!(parse_reflector("0.0.0.0:4000").unwrap_err().contains("clients use"));
        assert!(parse_reflector("1.2.3.4:x").is_err());
        assert_eq!(parse_grid("8x4"), Ok((8, 4)));
        assert!(parse_grid("8").is_err());
        assert!(parse_grid("0x4").is_err());
        assert!(parse_grid("ax4").is_err());
    }

    #[test]
    fn plain_http_only_on_loopback_unless_told() {
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert!(check_transport(at("127.0.0.1:8700"), false, false).is_ok());
        assert!(check_transport(at("[::1]:8700"), false, false).is_ok());
        let e = check_transport(at("0.0.0.0:8700"), false, false).unwrap_err();
        assert!(e.contains("--tls-cert") && e.contains("--insecure-http"), "{e}");
        assert!(check_transport(at("10.0.0.1:8700"), false, false).is_err());
        assert!(check_transport(at("10.0.0.1:8700"), true, false).is_ok());
        assert!(check_transport(at("10.0.0.1:8700"), false, true).is_ok());
    }
}
