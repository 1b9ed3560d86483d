//! Where a client's join token comes from: handed in by the game (its
//! backend fetched it), or asked of the control server over HTTPS (feature
//! `http`; plain HTTP only when asked for) with the player's ticket from
//! the game backend. Either way one grant of the control server's `/join`
//! answer becomes a [`Token`] through [`Token::from_grant`] (and its
//! checkpoint certificate through [`GrantSigning::from_grant`]), with or
//! without feature `http`.

use reflector_proto::control::{EpochKeyGrant, KeyedGrant};
use reflector_proto::protocol::{SESSION_KEY_LEN, TOKEN_LEN};
use reflector_proto::sealed::checkpoint::{verify_certificate, Certificate, PUBLIC_KEY_LEN, SIGNATURE_LEN};
use reflector_proto::sealed::{CellId, EpochKey, WorldId, CELL_ID_LEN, KEY_LEN};
use std::sync::{Arc, Mutex};

/// Why one grant of the control server's `/join` answer is not a usable
/// token ([`Token::from_grant`], [`GrantSigning::from_grant`]): each case
/// names the field of the answer that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// `player` is not the player asked for.
    #[error("a token for player {granted}, not {asked}")]
    OtherPlayer { granted: u32, asked: u32 },
    /// A hex field (`what`: the token, the session key, control_public,
    /// the certificate) that is not hex or not `len` bytes.
    #[error("{what} is not {len} hex bytes")]
    Hex { what: &'static str, len: usize },
    /// An entry of `keys` that is not a usable epoch key
    /// ([`CellKey::from_grant`] says why).
    #[error("{0}")]
    Key(String),
    /// `control_public` without `certificate`, or the reverse: a grant
    /// carries both (asked with `sign_key`, from a control server with a
    /// sealing secret) or neither.
    #[error("{present} without {missing}")]
    HalfSigning {
        present: &'static str,
        missing: &'static str,
    },
    /// The certificate does not verify under `control_public` for the
    /// world of the grant's keys, our `sign_key`, the grant's player and
    /// its expiry.
    #[error("the certificate does not verify under control_public for our sign_key")]
    Certificate,
}

/// `N` bytes from the hex of a grant's field `what`, or the error naming
/// it and its length.
fn hex_field<const N: usize>(hex: &str, what: &'static str) -> Result<[u8; N], GrantError> {
    hex::decode(hex)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or(GrantError::Hex { what, len: N })
}

/// One sealing epoch key of a cell, as a control server with a sealing
/// secret hands it out with each grant (docs/protocol.md, "Handing out
/// keys"): the key of (cell, epoch) and when that epoch starts and ends,
/// Unix seconds. Its `Debug` never shows the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellKey {
    /// `[column, row]` of the cell.
    pub cell: [u32; 2],
    /// The key, with its cell id and epoch.
    pub key: EpochKey,
    pub starts_unix_s: u64,
    pub ends_unix_s: u64,
}

impl CellKey {
    /// A key of the control server's JSON (`keys` of a grant or of a
    /// `/keys` answer), checked: a cell id of 8 hex bytes, a key of 32,
    /// an epoch that ends after it starts.
    pub fn from_grant(g: &EpochKeyGrant) -> Result<CellKey, String> {
        let cell_id: [u8; CELL_ID_LEN] = hex_field(&g.cell_id, "a key's cell id").map_err(|e| e.to_string())?;
        let key: [u8; KEY_LEN] = hex_field(&g.key, "a key").map_err(|e| e.to_string())?;
        CellKey::new(g.cell, cell_id, g.epoch, key, g.starts_unix_s, g.ends_unix_s)
    }

    /// A key from its parts (a grant's `keys` entry, decoded: `cell`,
    /// `cell_id`, `epoch`, `key`, `starts_unix_s`, `ends_unix_s`), for a
    /// game that reads the control server's answer itself and hands the
    /// keys in ([`crate::Client::set_epoch_keys`]). Checked: the epoch
    /// ends after it starts.
    pub fn new(
        cell: [u32; 2],
        cell_id: [u8; CELL_ID_LEN],
        epoch: u32,
        key: [u8; KEY_LEN],
        starts_unix_s: u64,
        ends_unix_s: u64,
    ) -> Result<CellKey, String> {
        if ends_unix_s <= starts_unix_s {
            return Err(format!(
                "the key of cell {cell:?} epoch {epoch} ends ({ends_unix_s}) before it starts ({starts_unix_s})"
            ));
        }
        Ok(CellKey {
            cell,
            key: EpochKey::from_bytes(CellId(cell_id), epoch, key),
            starts_unix_s,
            ends_unix_s,
        })
    }
}

/// The keys of a grant, checked, the player's own cell's first (a sealed
/// group's DATA is sealed under the first cell's key, see
/// [`Token::keys`]).
pub fn cell_keys(grants: &[EpochKeyGrant], own_cell: Option<[u32; 2]>) -> Result<Vec<CellKey>, String> {
    let mut keys = grants.iter().map(CellKey::from_grant).collect::<Result<Vec<_>, _>>()?;
    // A stable sort: the control server's order (row order) otherwise.
    keys.sort_by_key(|k| Some(k.cell) != own_cell);
    Ok(keys)
}

/// What a grant says about checkpoint signing (docs/protocol.md, "Player
/// signing keys and certificates"): the control servers' public key and
/// the certificate of our key until the grant's expiry. A game that reads
/// the control server's answer itself hands them to
/// [`crate::Client::set_checkpoint_certificate`] (`control_public`,
/// `certificate.signature`, `certificate.expires_unix_s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantSigning {
    /// The world's control key (the grant's `control_public`).
    pub control_public: [u8; PUBLIC_KEY_LEN],
    /// Our key's certificate: the grant's player, our `sign_key`, the
    /// grant's expiry and the grant's `certificate` (the signature).
    pub certificate: Certificate,
}

impl GrantSigning {
    /// The signing fields of `grant`, whose token is `token` (from
    /// [`Token::from_grant`] of the same grant), asked with `sign_key`:
    /// `None` when the grant has neither `control_public` nor
    /// `certificate` (a control server without a sealing secret, or a
    /// `/join` without `sign_key`). Checked: both or neither, hex of
    /// 32 and 64 bytes, and when the token carries epoch keys, the
    /// certificate verifies under `control_public` for their world, the
    /// token's player and expiry, and `sign_key`.
    pub fn from_grant(
        grant: &KeyedGrant,
        token: &Token,
        sign_key: &[u8; PUBLIC_KEY_LEN],
    ) -> Result<Option<GrantSigning>, GrantError> {
        let (cp, cert) = match (&grant.control_public, &grant.certificate) {
            (None, None) => return Ok(None),
            (Some(cp), Some(cert)) => (cp, cert),
            (Some(_), None) => {
                return Err(GrantError::HalfSigning {
                    present: "control_public",
                    missing: "certificate",
                })
            }
            (None, Some(_)) => {
                return Err(GrantError::HalfSigning {
                    present: "certificate",
                    missing: "control_public",
                })
            }
        };
        let control_public: [u8; PUBLIC_KEY_LEN] = hex_field(cp, "control_public")?;
        let signature: [u8; SIGNATURE_LEN] = hex_field(cert, "the certificate")?;
        let certificate = Certificate {
            player: token.player,
            public_key: *sign_key,
            expires_unix_s: token.expires_unix_s,
            signature,
        };
        // A group's cells are of one world: the first 4 bytes of a cell id.
        // Without keys there is no world to check against (the client
        // checks again when keys come: Client::set_checkpoint_certificate).
        if let Some(k) = token.keys.first() {
            let c = k.key.cell().0;
            let world = WorldId([c[0], c[1], c[2], c[3]]);
            if !verify_certificate(&control_public, world, &certificate) {
                return Err(GrantError::Certificate);
            }
        }
        Ok(Some(GrantSigning {
            control_public,
            certificate,
        }))
    }
}

/// The certificates of a `/join` answer, for the grants' groups: the token
/// request's helper thread puts them here, and the client takes them on
/// its next update (the token channel carries [`AreaTokens`] only, which
/// games build themselves too).
pub(crate) type SigningSink = Arc<Mutex<Vec<(String, u16, GrantSigning)>>>;

/// What a `/join` carries for checkpoint signing: our public key
/// (`sign_key`), and where the answer's certificates go.
#[derive(Clone)]
#[cfg_attr(not(feature = "http"), allow(dead_code, reason = "only the HTTP client asks /join"))]
pub(crate) struct SignRequest {
    pub public_key: [u8; PUBLIC_KEY_LEN],
    pub sink: SigningSink,
}

/// A join token for one group with its session key, as the control server
/// hands them out (`GET /join`, docs/protocol.md).
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The reflector as clients reach it, `host:port` (resolved with the
    /// system resolver, so a name works as well as an address).
    pub reflector: String,
    /// The group (the reflector port the token is for).
    pub group: u16,
    pub player: u32,
    pub token: [u8; TOKEN_LEN],
    /// The session key: it MACs every datagram of the membership, so it is
    /// never logged (see the `Debug` impl).
    pub session_key: [u8; SESSION_KEY_LEN],
    pub expires_unix_s: u64,
    /// The sealing epoch keys of the cells the group serves (empty from a
    /// control server without a sealing secret). In a sealed group the
    /// client seals what it sends under the key of the first cell here,
    /// so the player's own cell comes first: [`Token::from_grant`] puts
    /// it first, and a game that builds a token from its parts does the
    /// same ([`cell_keys`]).
    pub keys: Vec<CellKey>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("reflector", &self.reflector)
            .field("group", &self.group)
            .field("player", &self.player)
            .field("expires_unix_s", &self.expires_unix_s)
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// The token of one grant of the control server's `/join` answer
    /// (the cell's, or one of an area's), for `player`, checked: the
    /// grant is `player`'s, the token and the session key are 32 hex
    /// bytes each, and every epoch key decodes ([`CellKey::from_grant`]),
    /// the grant's own cell's first ([`cell_keys`]). For a game whose
    /// backend fetches tokens and hands them in
    /// ([`crate::Client::set_token`]); the client reads its own `/join`
    /// answers with it too. `reflector` is taken as it is (a name or an
    /// address, resolved when the client joins).
    pub fn from_grant(grant: &KeyedGrant, player: u32) -> Result<Token, GrantError> {
        let g = &grant.grant;
        if g.player != player {
            return Err(GrantError::OtherPlayer {
                granted: g.player,
                asked: player,
            });
        }
        Ok(Token {
            reflector: g.reflector.clone(),
            group: g.group,
            player,
            token: hex_field(&g.token, "the token")?,
            session_key: hex_field(&g.session_key, "the session key")?,
            expires_unix_s: g.expires_unix_s,
            keys: cell_keys(&grant.keys, Some(g.cell)).map_err(GrantError::Key)?,
        })
    }
}

/// The tokens of an area of interest, from one `GET /join?...&area=R`
/// (docs/protocol.md, "Area of interest"): the player's own cell's, and
/// one for each other group serving a cell within R cells of it, nearest
/// first. A plain join (R = 0) has an empty `area`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AreaTokens {
    /// The player's own cell: where [`crate::Client::send`] goes.
    pub cell: Token,
    /// The other groups of the area (never the cell's group again).
    pub area: Vec<Token>,
}

/// How to ask the control server for a token.
#[derive(Clone, PartialEq)]
pub struct ControlServer {
    /// `https://host:port` of the control server (`http://` only with
    /// [`ControlServer::allow_plain_http`]). A name with several addresses
    /// is tried address by address.
    pub url: String,
    /// More control servers of the same world, tried in turn after `url`
    /// (see [`ControlServer::urls`]).
    pub fallback_urls: Vec<String>,
    /// The player's ticket from the game backend (a JWT), sent as
    /// `Authorization: Bearer`; `None` for a control server with anonymous
    /// joins (closed test networks).
    pub ticket: Option<String>,
    /// The player id: sent as `player=` (which must match the ticket's).
    pub player: u32,
    /// The player's position in the world: it picks the cell, so the group.
    pub position: (f64, f64),
    /// A PEM file of CA certificates to trust instead of the built-in roots
    /// (Mozilla's, from webpki-roots): a studio's private CA, or a test's.
    pub ca_file: Option<std::path::PathBuf>,
    /// Plain HTTP: the ticket and the session key cross the network in
    /// clear, so anyone on the path can take the membership. Only for
    /// closed labs; off by default, and an `http://` URL is refused then.
    pub allow_plain_http: bool,
}

impl ControlServer {
    /// A control server at `url` (HTTPS, trusting the built-in roots), no
    /// ticket: set the fields for more.
    pub fn new(url: impl Into<String>, player: u32, position: (f64, f64)) -> ControlServer {
        ControlServer {
            url: url.into(),
            fallback_urls: Vec::new(),
            ticket: None,
            player,
            position,
            ca_file: None,
            allow_plain_http: false,
        }
    }
}

impl ControlServer {
    /// Every control server, in the order they are tried: `url`, then the
    /// fallbacks. A request goes to the next one (and to the next address
    /// of a name) only when this one could not answer: a connect error, a
    /// timeout, or a 5xx. A refusal (401, 403, 429), a bad answer or a
    /// TLS failure is the answer, and is not retried elsewhere.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.fallback_urls.iter().map(String::as_str))
    }
}

/// A bad grant is a bad answer of the control server.
impl From<GrantError> for ControlError {
    fn from(e: GrantError) -> ControlError {
        ControlError::BadAnswer(e.to_string())
    }
}

impl ControlError {
    /// Whether another control server (or another address of the same
    /// name) may answer where this one could not.
    pub fn fails_over(&self) -> bool {
        matches!(self, ControlError::Unreachable { .. })
            || matches!(self, ControlError::Status { status, .. } if *status >= 500)
    }
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("url", &self.url)
            .field("fallback_urls", &self.fallback_urls)
            .field("player", &self.player)
            .field("position", &self.position)
            .field("ca_file", &self.ca_file)
            .field("allow_plain_http", &self.allow_plain_http)
            .finish_non_exhaustive()
    }
}

/// Why the control server gave no token. Each case calls for something
/// else: wait and retry, get a new ticket, or fix the configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("control server {url} is unreachable ({reason}): is it running, and is the URL right?")]
    Unreachable { url: String, reason: String },
    #[error("control server refused the ticket (401: {message}): get a fresh ticket from the game backend")]
    Unauthorized { message: String },
    #[error("control server forbids this (403: {message}): the ticket is for another player than the one asked for")]
    Forbidden { message: String },
    #[error("control server is rate limiting (429: {message}): asking again in {retry_after_s} s")]
    RateLimited { retry_after_s: u64, message: String },
    #[error("control server answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("control server's answer is not a usable token: {0}")]
    BadAnswer(String),
    #[error("this build has no HTTP client (feature `http` is off): hand tokens in with Client::set_token")]
    NoHttp,
    #[error(
        "refusing plain HTTP to {url}: the ticket and session key would cross the network in clear; use https://, \
         or set allow_plain_http for a closed lab"
    )]
    PlainHttp { url: String },
    #[error("control server URL {url} is neither https:// nor http://")]
    BadUrl { url: String },
    #[error("TLS with control server {url} failed ({reason}): is its certificate signed by a CA this client trusts (ControlServer::ca_file)?")]
    Tls { url: String, reason: String },
    #[error("cannot use the CA file {path}: {reason}")]
    BadCaFile { path: String, reason: String },
}

#[cfg(feature = "http")]
mod http {
    use super::{AreaTokens, CellKey, ControlError, ControlServer, GrantSigning, SignRequest, Token};
    use reflector_proto::control::{KeyedAreaGrant, KeyedGrant, KeysAnswer};
    use reflector_proto::protocol::TOKEN_LEN;
    use std::net::{SocketAddr, ToSocketAddrs};
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    #[derive(serde::Deserialize)]
    struct Refusal {
        error: String,
    }

    /// The rustls configuration trusting exactly the CAs of a PEM file
    /// (on ring, as the rest of the workspace).
    fn tls_config(path: &Path) -> Result<Arc<rustls::ClientConfig>, ControlError> {
        use rustls_pki_types::pem::PemObject;
        let bad = |reason: String| ControlError::BadCaFile {
            path: path.display().to_string(),
            reason,
        };
        let mut roots = rustls::RootCertStore::empty();
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(path).map_err(|e| bad(e.to_string()))?;
        for c in certs {
            roots
                .add(c.map_err(|e| bad(e.to_string()))?)
                .map_err(|e| bad(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(bad("no certificate in it".into()));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth(),
        ))
    }

    /// A TLS failure somewhere in a transport error's causes.
    fn tls_failure(t: &ureq::Transport) -> Option<String> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
        while let Some(e) = cause {
            if let Some(r) = e.downcast_ref::<rustls::Error>() {
                return Some(r.to_string());
            }
            if let Some(inner) = e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
                if let Some(r) = inner.downcast_ref::<rustls::Error>() {
                    return Some(r.to_string());
                }
            }
            cause = e.source();
        }
        None
    }

    /// `GET /join` of each control server in turn ([`ControlServer::urls`]),
    /// each address of its name in turn, until one answers (see
    /// [`ControlError::fails_over`]). Every URL is checked before anything
    /// is sent, so a bad one is a configuration error, not a skipped server.
    /// `radius` > 0 asks for the area around the player's cell too.
    /// With `sign`, the request carries `sign_key` and each grant's
    /// certificate goes to its sink.
    pub fn fetch(
        c: &ControlServer,
        radius: u8,
        held: Option<&[u8; 32]>,
        sign: Option<&SignRequest>,
    ) -> Result<AreaTokens, ControlError> {
        over_servers(c, |agent, url| {
            let mut req = agent
                .get(&format!("{}/join", url.trim_end_matches('/')))
                .query("player", &c.player.to_string())
                .query("x", &c.position.0.to_string())
                .query("y", &c.position.1.to_string());
            // Without `area` the request is exactly the plain join's.
            if radius > 0 {
                req = req.query("area", &radius.to_string());
            }
            // The token held now: a re-placement is charged to this player's
            // rate limit only, not to its address's (many players behind one
            // NAT recovering at once from a reflector's failure).
            if let Some(h) = held {
                req = req.query("held", &hex::encode(h));
            }
            if let Some(s) = sign {
                req = req.query("sign_key", &hex::encode(s.public_key));
            }
            if let Some(t) = &c.ticket {
                req = req.set("Authorization", &format!("Bearer {t}"));
            }
            // The answer's grants (the cell's, then the area's, each with
            // the same fields), decoded as a game that hands tokens in
            // decodes them: Token::from_grant, GrantSigning::from_grant.
            let answer: KeyedAreaGrant = call_json(req, url, "/join")?;
            let mut signing = Vec::new();
            let mut grant = |g: &KeyedGrant| -> Result<Token, ControlError> {
                let t = Token::from_grant(g, c.player)?;
                if let Some(s) = sign {
                    if let Some(gs) = GrantSigning::from_grant(g, &t, &s.public_key)? {
                        signing.push((t.reflector.clone(), t.group, gs));
                    }
                }
                Ok(t)
            };
            let cell = grant(&answer.cell)?;
            let area = answer.area.iter().map(&mut grant).collect::<Result<Vec<_>, _>>()?;
            if area
                .iter()
                .any(|t| t.reflector == cell.reflector && t.group == cell.group)
            {
                return Err(ControlError::BadAnswer(
                    "the area names the cell's own group again".into(),
                ));
            }
            if let Some(s) = sign {
                // A poisoned lock only means another thread panicked
                // while pushing: the list is still a list.
                s.sink.lock().unwrap_or_else(|e| e.into_inner()).extend(signing);
            }
            Ok(AreaTokens { cell, area })
        })
    }

    /// `GET /keys?token=T&at=A&mac=M` (docs/protocol.md, "Handing out
    /// keys"), over the control servers as [`fetch`] goes: the epoch keys
    /// of the cells the token's group serves now, in the server's order.
    pub fn fetch_keys(
        c: &ControlServer,
        player: u32,
        token: &[u8; TOKEN_LEN],
        at_unix_s: u64,
        mac: &[u8; 16],
    ) -> Result<Vec<CellKey>, ControlError> {
        over_servers(c, |agent, url| {
            let req = agent
                .get(&format!("{}/keys", url.trim_end_matches('/')))
                .query("token", &hex::encode(token))
                .query("at", &at_unix_s.to_string())
                .query("mac", &hex::encode(mac));
            let answer: KeysAnswer = call_json(req, url, "/keys")?;
            if answer.player != player {
                return Err(ControlError::BadAnswer(format!(
                    "keys for player {}, not {player}",
                    answer.player
                )));
            }
            super::cell_keys(&answer.keys, None).map_err(ControlError::BadAnswer)
        })
    }

    /// Runs `attempt` against each control server in turn and each address
    /// of its name, until one answers (see [`ControlError::fails_over`]).
    fn over_servers<T>(
        c: &ControlServer,
        attempt: impl Fn(&ureq::Agent, &str) -> Result<T, ControlError>,
    ) -> Result<T, ControlError> {
        for url in c.urls() {
            if url.starts_with("http://") {
                if !c.allow_plain_http {
                    return Err(ControlError::PlainHttp { url: url.to_string() });
                }
            } else if !url.starts_with("https://") {
                return Err(ControlError::BadUrl { url: url.to_string() });
            }
        }
        let tls = match &c.ca_file {
            Some(path) => Some(tls_config(path)?),
            None => None,
        };
        let mut failed: Vec<String> = Vec::new();
        let mut last = None;
        for url in c.urls() {
            for addr in addresses(url) {
                let answer = agent_for(url, addr.clone(), tls.clone()).and_then(|agent| attempt(&agent, url));
                match answer {
                    Err(e) if e.fails_over() => {
                        failed.push(match addr {
                            Ok(a) => format!("{url} at {a}: {e}"),
                            Err(_) => e.to_string(),
                        });
                        last = Some(e);
                    }
                    answer => return answer,
                }
            }
        }
        Err(match last {
            // Several tried: say so, with each one's reason.
            Some(ControlError::Unreachable { url, .. }) if failed.len() > 1 => ControlError::Unreachable {
                url,
                reason: format!("all {} tried: {}", failed.len(), failed.join("; ")),
            },
            Some(e) => e,
            None => ControlError::Unreachable {
                url: c.url.clone(),
                reason: "no address".into(),
            },
        })
    }

    /// The addresses of `url`'s host from the system resolver (so a name
    /// with several A/AAAA records gives each), or the resolver's error as
    /// the one entry (then ureq's own resolution reports it).
    fn addresses(url: &str) -> Vec<Result<SocketAddr, String>> {
        let netloc = ureq::get(url).request_url().ok().and_then(|u| {
            let u = u.as_url();
            Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?))
        });
        let Some(netloc) = netloc else {
            return vec![Err(format!("no host in {url}"))];
        };
        match netloc.to_socket_addrs() {
            Ok(a) => {
                let a: Vec<_> = a.map(Ok).collect();
                if a.is_empty() {
                    vec![Err(format!("{netloc} has no address"))]
                } else {
                    a
                }
            }
            Err(e) => vec![Err(format!("cannot resolve {netloc}: {e}"))],
        }
    }

    /// An agent for `url` that connects to `addr` (the name stays in the
    /// request and in TLS's server name).
    fn agent_for(
        url: &str,
        addr: Result<SocketAddr, String>,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> Result<ureq::Agent, ControlError> {
        let mut builder = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(5));
        if let Some(tls) = tls {
            builder = builder.tls_config(tls);
        }
        match addr {
            Ok(a) => builder = builder.resolver(move |_: &str| Ok(vec![a])),
            Err(reason) => {
                return Err(ControlError::Unreachable {
                    url: url.to_string(),
                    reason,
                })
            }
        }
        Ok(builder.build())
    }

    /// Sends `req` and reads its JSON answer (`what` names the request in
    /// an error), a refusal as the [`ControlError`] its status says.
    fn call_json<T: serde::de::DeserializeOwned>(req: ureq::Request, url: &str, what: &str) -> Result<T, ControlError> {
        match req.call() {
            Ok(resp) => resp
                .into_json()
                .map_err(|e| ControlError::BadAnswer(format!("not the {what} JSON: {e}"))),
            Err(ureq::Error::Status(status, resp)) => {
                let retry_after_s = resp
                    .header("Retry-After")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(1);
                let body = resp.into_string().unwrap_or_default();
                let message = serde_json::from_str::<Refusal>(&body)
                    .map(|r| r.error)
                    .unwrap_or_else(|_| body.trim().to_string());
                Err(match status {
                    401 => ControlError::Unauthorized { message },
                    403 => ControlError::Forbidden { message },
                    429 => ControlError::RateLimited { retry_after_s, message },
                    _ => ControlError::Status { status, message },
                })
            }
            Err(ureq::Error::Transport(t)) => Err(match tls_failure(&t) {
                Some(reason) => ControlError::Tls {
                    url: url.to_string(),
                    reason,
                },
                None => ControlError::Unreachable {
                    url: url.to_string(),
                    reason: t.to_string(),
                },
            }),
        }
    }
}

/// The longest a renewal that brought no later expiry waits before the
/// next ([`renewal_backoff`]).
pub(crate) const RENEWAL_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// How long the client waits before asking again after a renewal that
/// brought no token expiring later than the one held (`expires_unix_s`),
/// at `now_unix_ms`: a quarter of the time left before that expiry, at
/// least [`crate::TOKEN_RETRY`] (an expiry is in whole seconds: a second
/// later the control server's answer can differ) and at most
/// [`RENEWAL_BACKOFF_MAX`]. The tries thin out as the expiry nears and
/// never come on every update: 16 over the last third of a
/// 300 s token whose expiry the control server will not extend.
pub(crate) fn renewal_backoff(expires_unix_s: u64, now_unix_ms: u64) -> std::time::Duration {
    let left = std::time::Duration::from_millis(expires_unix_s.saturating_mul(1000).saturating_sub(now_unix_ms));
    (left / 4).clamp(crate::TOKEN_RETRY, RENEWAL_BACKOFF_MAX)
}

/// `GET /keys` of the control server for the group of `token` (blocking;
/// the client calls it on a helper thread): `mac` is
/// [`reflector_proto::sealed::keys_request_mac`] of (token, `at_unix_s`).
pub(crate) fn fetch_keys(
    c: &ControlServer,
    player: u32,
    token: &[u8; TOKEN_LEN],
    at_unix_s: u64,
    mac: &[u8; 16],
) -> Result<Vec<CellKey>, ControlError> {
    #[cfg(feature = "http")]
    return http::fetch_keys(c, player, token, at_unix_s, mac);
    #[cfg(not(feature = "http"))]
    {
        let _ = (c, player, token, at_unix_s, mac);
        Err(ControlError::NoHttp)
    }
}

/// Asks the control server for a token (blocking; the client calls it on
/// a helper thread).
pub fn fetch(c: &ControlServer) -> Result<Token, ControlError> {
    fetch_area(c, 0).map(|a| a.cell)
}

/// Asks the control server for the tokens of the area within `radius`
/// cells of the player's (one request; `radius` 0 is the plain join,
/// sent without `area`; the control server takes at most 2). Blocking.
pub fn fetch_area(c: &ControlServer, radius: u8) -> Result<AreaTokens, ControlError> {
    fetch_area_holding(c, radius, None, None)
}

/// [`fetch_area`], saying which token the client holds now (`held`), and
/// with `sign` our signing key (`sign_key`), the certificates to its sink.
pub(crate) fn fetch_area_holding(
    c: &ControlServer,
    radius: u8,
    held: Option<[u8; 32]>,
    sign: Option<&SignRequest>,
) -> Result<AreaTokens, ControlError> {
    #[cfg(feature = "http")]
    return http::fetch(c, radius, held.as_ref(), sign);
    #[cfg(not(feature = "http"))]
    {
        let _ = (c, radius, held, sign);
        Err(ControlError::NoHttp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::control::JoinGrant;
    use reflector_proto::sealed::checkpoint::ControlSigner;
    use reflector_proto::sealed::MasterSecret;
    use std::time::Duration;

    const PLAYER: u32 = 7;
    const EXPIRES: u64 = 1_900_000_000;
    /// The client's checkpoint signing key, as its `/join` sent it.
    const SIGN_KEY: [u8; PUBLIC_KEY_LEN] = [5; PUBLIC_KEY_LEN];

    fn master() -> MasterSecret {
        MasterSecret::new(&[9; 32]).expect("a long enough secret")
    }

    fn world() -> WorldId {
        WorldId::from_name("grant-parser-test")
    }

    fn control() -> ControlSigner {
        ControlSigner::derive(&master(), world())
    }

    fn key_grant(cell: [u32; 2]) -> EpochKeyGrant {
        let id = CellId::new(world(), cell[0], cell[1]).expect("a small cell");
        EpochKeyGrant {
            cell,
            cell_id: hex::encode(id.0),
            epoch: 3,
            key: hex::encode(master().epoch_key(id, 3).as_bytes()),
            starts_unix_s: EXPIRES - 600,
            ends_unix_s: EXPIRES,
        }
    }

    /// What a control server with a sealing secret answers player 7 at
    /// cell (1, 0), asked with `sign_key` = [`SIGN_KEY`]: keys in row
    /// order (the player's cell second), and a certificate of the key.
    fn good() -> KeyedGrant {
        KeyedGrant {
            grant: JoinGrant {
                player: PLAYER,
                cell: [1, 0],
                reflector: "127.0.0.1:4000".into(),
                reflector_id: 0,
                group: 4000,
                token: hex::encode([1u8; TOKEN_LEN]),
                session_key: hex::encode([2u8; SESSION_KEY_LEN]),
                expires_unix_s: EXPIRES,
            },
            keys: vec![key_grant([0, 0]), key_grant([1, 0])],
            control_public: Some(hex::encode(control().public_key())),
            certificate: Some(hex::encode(control().certify(PLAYER, &SIGN_KEY, EXPIRES).signature)),
        }
    }

    /// The grant as the client reads it: its token, then its signing.
    fn parse(g: &KeyedGrant) -> Result<(Token, Option<GrantSigning>), GrantError> {
        let t = Token::from_grant(g, PLAYER)?;
        let s = GrantSigning::from_grant(g, &t, &SIGN_KEY)?;
        Ok((t, s))
    }

    #[test]
    fn a_good_grant_is_a_token_and_its_certificate() {
        let (t, s) = parse(&good()).expect("a good grant");
        assert_eq!(
            (t.reflector.as_str(), t.group, t.player, t.expires_unix_s),
            ("127.0.0.1:4000", 4000, PLAYER, EXPIRES)
        );
        assert_eq!((t.token, t.session_key), ([1; TOKEN_LEN], [2; SESSION_KEY_LEN]));
        // The player's own cell's key first (DATA is sealed under it),
        // then the server's order.
        assert_eq!(t.keys.iter().map(|k| k.cell).collect::<Vec<_>>(), [[1, 0], [0, 0]]);
        let id = CellId::new(world(), 1, 0).expect("a small cell");
        assert_eq!(t.keys[0].key.as_bytes(), master().epoch_key(id, 3).as_bytes());
        assert_eq!(
            s,
            Some(GrantSigning {
                control_public: control().public_key(),
                certificate: control().certify(PLAYER, &SIGN_KEY, EXPIRES),
            })
        );
        // A control server without a sealing secret: no keys, no signing.
        let plain = KeyedGrant {
            keys: Vec::new(),
            control_public: None,
            certificate: None,
            ..good()
        };
        let (t, s) = parse(&plain).expect("a grant without sealing");
        assert!(t.keys.is_empty() && s.is_none());
    }

    #[test]
    fn each_hex_field_too_short_too_long_or_not_hex_is_named_with_its_length() {
        type Field = fn(&mut KeyedGrant) -> &mut String;
        let fields: [(Field, &str); 4] = [
            (|g| &mut g.grant.token, "the token is not 32 hex bytes"),
            (|g| &mut g.grant.session_key, "the session key is not 32 hex bytes"),
            (
                |g| g.control_public.as_mut().expect("in the good grant"),
                "control_public is not 32 hex bytes",
            ),
            (
                |g| g.certificate.as_mut().expect("in the good grant"),
                "the certificate is not 64 hex bytes",
            ),
        ];
        let keys: [(Field, &str); 2] = [
            (|g| &mut g.keys[1].cell_id, "a key's cell id is not 8 hex bytes"),
            (|g| &mut g.keys[1].key, "a key is not 32 hex bytes"),
        ];
        type Spoil = fn(&mut String);
        let spoils: [(&str, Spoil); 5] = [
            ("a byte short", |h| h.truncate(h.len() - 2)),
            ("a byte long", |h| h.push_str("00")),
            ("not hex", |h| h.replace_range(..1, "z")),
            ("an odd length", |h| h.truncate(h.len() - 1)),
            ("empty", |h| h.clear()),
        ];
        for (field, want) in fields.into_iter().chain(keys) {
            for (how, spoil) in spoils {
                let mut g = good();
                spoil(field(&mut g));
                let e = parse(&g).expect_err(want);
                assert_eq!(e.to_string(), want, "{how}");
                assert!(matches!(e, GrantError::Hex { .. } | GrantError::Key(_)), "{how}: {e:?}");
                // Through the HTTP client: the control server's answer.
                let c = ControlError::from(e).to_string();
                assert!(c.starts_with("control server's answer") && c.ends_with(want), "{c}");
            }
        }
    }

    #[test]
    fn a_grant_for_another_player_is_refused() {
        let e = Token::from_grant(&good(), PLAYER + 1).expect_err("player 7's grant");
        assert_eq!(
            e,
            GrantError::OtherPlayer {
                granted: PLAYER,
                asked: PLAYER + 1
            }
        );
        assert_eq!(e.to_string(), "a token for player 7, not 8");
    }

    #[test]
    fn control_public_and_certificate_come_together_or_not_at_all() {
        let mut g = good();
        g.certificate = None;
        assert_eq!(
            parse(&g).expect_err("control_public alone").to_string(),
            "control_public without certificate"
        );
        let mut g = good();
        g.control_public = None;
        assert_eq!(
            parse(&g).expect_err("certificate alone").to_string(),
            "certificate without control_public"
        );
    }

    #[test]
    fn a_certificate_that_does_not_verify_is_refused() {
        let stranger = ControlSigner::derive(&MasterSecret::new(&[0x42; 32]).expect("long enough"), world());
        let other_world = ControlSigner::derive(&master(), WorldId::from_name("another world"));
        let signed = |signer: &ControlSigner, player: u32, key: &[u8; PUBLIC_KEY_LEN], expires: u64| {
            let mut g = good();
            g.control_public = Some(hex::encode(signer.public_key()));
            g.certificate = Some(hex::encode(signer.certify(player, key, expires).signature));
            g
        };
        let mut later = good();
        later.grant.expires_unix_s += 1;
        let mut flipped = good();
        flipped.certificate = Some(hex::encode([0u8; SIGNATURE_LEN]));
        // Signed by another key than the control_public it comes with.
        let mut mixed = good();
        mixed.certificate = Some(hex::encode(stranger.certify(PLAYER, &SIGN_KEY, EXPIRES).signature));
        for (why, g) in [
            (
                "another sign_key's",
                signed(&control(), PLAYER, &[6; PUBLIC_KEY_LEN], EXPIRES),
            ),
            ("another player's", signed(&control(), PLAYER + 1, &SIGN_KEY, EXPIRES)),
            ("another expiry's", signed(&control(), PLAYER, &SIGN_KEY, EXPIRES + 1)),
            ("the grant's expiry changed", later),
            ("another control key's", mixed),
            ("another world's", signed(&other_world, PLAYER, &SIGN_KEY, EXPIRES)),
            ("zero signature", flipped),
        ] {
            let e = parse(&g).expect_err(why);
            assert_eq!(e, GrantError::Certificate, "{why}");
            assert!(e.to_string().contains("does not verify under control_public"), "{why}");
        }
        // Without keys there is no world to check it against: taken as it
        // is (Client::set_checkpoint_certificate checks it once keys come).
        let mut g = signed(&stranger, PLAYER, &SIGN_KEY, EXPIRES);
        g.keys.clear();
        assert!(parse(&g).expect("no keys, not checked").1.is_some());
    }

    #[test]
    fn a_renewal_without_a_later_expiry_backs_off_a_quarter_of_the_time_left() {
        let exp = 1_000_000;
        let at = |left_ms: u64| renewal_backoff(exp, exp * 1000 - left_ms);
        // The renewal moment of a 300 s token (100 s left): 25 s.
        assert_eq!(at(100_000), Duration::from_secs(25));
        // Never more than a minute (an hour's token renews 20 min early).
        assert_eq!(at(1_200_000), RENEWAL_BACKOFF_MAX);
        // Never less than a second: the expiry's own resolution, so the
        // same second's answer is not asked for again.
        assert_eq!(at(10_000), Duration::from_millis(2_500));
        assert_eq!(at(2_000), crate::TOKEN_RETRY);
        assert_eq!(
            renewal_backoff(exp, exp * 1000 + 5_000),
            crate::TOKEN_RETRY,
            "expired already"
        );
        // A token whose expiry is never extended is asked about a few
        // times over the last third of its life, not on every update.
        let (mut now, end, mut asks) = (exp * 1000 - 100_000, exp * 1000, 0);
        while now < end {
            now += renewal_backoff(exp, now).as_millis() as u64;
            asks += 1;
        }
        assert_eq!(asks, 16, "requests over the last 100 s");
    }
}
