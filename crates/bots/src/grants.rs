//! Join grants from the control server: HTTP on helper threads, so a slow
//! answer never stalls the data path; the answers come back on a channel.

use super::BotsError;
use reflector_client::{cell_keys, Token};
use reflector_proto::control::{JoinGrant, KeyedGrant, WorldInfo};
use reflector_proto::protocol::{SESSION_KEY_LEN, TOKEN_LEN};
use reflector_proto::sealed::checkpoint::{PUBLIC_KEY_LEN, SIGNATURE_LEN};
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) struct Job {
    pub(super) bot: usize,
    pub(super) gen: u64,
    pub(super) player: u32,
    pub(super) pos: (f64, f64),
    /// The bot client's checkpoint signing key, sent as `sign_key`.
    pub(super) sign_key: [u8; PUBLIC_KEY_LEN],
}

pub(super) struct JobResult {
    pub(super) bot: usize,
    pub(super) gen: u64,
    pub(super) result: Result<Grant, String>,
    /// The control server refused the player ticket (401, or 403 for
    /// another player's ticket): the status. Every bot's tickets are made
    /// alike, so the run cannot succeed and is not retried.
    pub(super) refused: Option<u16>,
}

/// A `/join` answer as the bots read it: the grant, and the sealing epoch
/// keys of its group's cells (none from a control server without a sealing
/// secret). It reads as the grant it carries, so code that only needs the
/// grant's fields does not see the keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant(pub KeyedGrant);

impl Deref for Grant {
    type Target = JoinGrant;

    fn deref(&self) -> &JoinGrant {
        &self.0.grant
    }
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .build()
}

fn http_error(e: ureq::Error) -> String {
    match e {
        ureq::Error::Status(code, resp) => {
            let body = resp.into_string().unwrap_or_default();
            format!("answered {code}: {}", body.trim())
        }
        ureq::Error::Transport(t) => format!("unreachable: {t}"),
    }
}

/// Whether another control server should be asked after this failure: it
/// could not answer (unreachable, timed out, 5xx). A refusal or a bad answer
/// is the answer.
fn ask_next(status: Option<u16>) -> bool {
    status.is_none_or(|s| (500..600).contains(&s))
}

/// Asks `ask` of each of `controls` in turn, as the client library moves
/// on: the next only after one could not answer (see [`ask_next`]). A
/// refusal or a bad answer ends it: `Err` with its status and its error
/// alone; when none answered, the last one's status and every error, in
/// the order asked.
fn ask_each<T, E>(
    controls: &[String],
    mut ask: impl FnMut(&str) -> Result<T, (Option<u16>, E)>,
) -> Result<T, (Option<u16>, Vec<E>)> {
    let mut status = None;
    let mut tried = Vec::new();
    for c in controls {
        match ask(c) {
            Ok(v) => return Ok(v),
            Err((s, e)) if ask_next(s) => {
                status = s;
                tried.push(e);
            }
            Err((s, e)) => return Err((s, vec![e])),
        }
    }
    Err((status, tried))
}

/// `GET /world` from the first of `controls` that can answer.
pub fn fetch_world_any(controls: &[String]) -> Result<WorldInfo, BotsError> {
    ask_each(controls, fetch_world_or_status).map_err(|(_, mut e)| {
        e.pop()
            .unwrap_or_else(|| BotsError::Config("no control server given".into()))
    })
}

/// `GET /world`.
pub fn fetch_world(control: &str) -> Result<WorldInfo, BotsError> {
    fetch_world_or_status(control).map_err(|(_, e)| e)
}

fn fetch_world_or_status(control: &str) -> Result<WorldInfo, (Option<u16>, BotsError)> {
    let url = format!("{control}/world");
    let err = |msg: String| BotsError::Control {
        url: control.to_string(),
        msg,
    };
    agent()
        .get(&url)
        .call()
        .map_err(|e| {
            let status = match &e {
                ureq::Error::Status(code, _) => Some(*code),
                ureq::Error::Transport(_) => None,
            };
            (status, err(http_error(e)))
        })?
        .into_json::<WorldInfo>()
        .map_err(|e| (Some(200), err(format!("bad /world answer: {e}"))))
}

/// `GET /join?player=..&x=..&y=..`.
pub fn fetch_grant(
    agent: &ureq::Agent,
    control: &str,
    player: u32,
    pos: (f64, f64),
    ticket: Option<&str>,
) -> Result<Grant, String> {
    fetch_grant_or_status(agent, control, player, pos, ticket, None).map_err(|(_, msg)| msg)
}

/// [`fetch_grant`], and the HTTP status of a refusal. With `sign_key`
/// (the bot client's checkpoint signing key) the request carries it, and a
/// control server with a sealing secret certifies it in the grant.
fn fetch_grant_or_status(
    agent: &ureq::Agent,
    control: &str,
    player: u32,
    pos: (f64, f64),
    ticket: Option<&str>,
    sign_key: Option<&[u8; PUBLIC_KEY_LEN]>,
) -> Result<Grant, (Option<u16>, String)> {
    let mut req = agent.get(&format!("{control}/join"));
    if let Some(t) = ticket {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    if let Some(k) = sign_key {
        req = req.query("sign_key", &hex::encode(k));
    }
    req.query("player", &player.to_string())
        .query("x", &pos.0.to_string())
        .query("y", &pos.1.to_string())
        .call()
        .map_err(|e| {
            let status = match &e {
                ureq::Error::Status(code, _) => Some(*code),
                ureq::Error::Transport(_) => None,
            };
            (status, format!("control server {control}: /join {}", http_error(e)))
        })?
        .into_json::<KeyedGrant>()
        .map(Grant)
        .map_err(|e| (None, format!("control server {control}: bad /join answer: {e}")))
}

/// Player tickets live this long: a minute, as a game backend would hand out.
const TICKET_TTL_S: u64 = 60;

/// [`fetch_grant_or_status`] from the first of `controls` that can
/// answer; when none can, every one's error.
fn fetch_grant_any(
    agent: &ureq::Agent,
    controls: &[String],
    player: u32,
    pos: (f64, f64),
    ticket: Option<&str>,
    sign_key: Option<&[u8; PUBLIC_KEY_LEN]>,
) -> Result<Grant, (Option<u16>, String)> {
    ask_each(controls, |c| {
        fetch_grant_or_status(agent, c, player, pos, ticket, sign_key)
    })
    .map_err(|(status, msgs)| (status, msgs.join("; ")))
}

pub(super) fn http_worker(
    controls: Vec<String>,
    minter: Option<Arc<reflector_proto::ticket::TicketMinter>>,
    jobs: Arc<Mutex<mpsc::Receiver<Job>>>,
    results: mpsc::Sender<JobResult>,
) {
    let agent = agent();
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(j) => j,
                Err(_) => return, // the event loop is done
            },
            Err(_) => return,
        };
        let ticket = minter
            .as_ref()
            .map(|m| m.mint(job.player, reflector_proto::unix_now_ms() / 1000, TICKET_TTL_S));
        let (result, refused) = match fetch_grant_any(
            &agent,
            &controls,
            job.player,
            job.pos,
            ticket.as_deref(),
            Some(&job.sign_key),
        ) {
            Ok(g) => (Ok(g), None),
            Err((status, msg)) => (Err(msg), status.filter(|s| matches!(s, 401 | 403))),
        };
        if results
            .send(JobResult {
                bot: job.bot,
                gen: job.gen,
                result,
                refused,
            })
            .is_err()
        {
            return;
        }
    }
}

/// A join grant as the client's token: checked here, so a bad answer is
/// reported as the control server's. Its epoch keys go with it, the bot's
/// own cell's first (the client seals under the first), so that in a sealed
/// group the bot seals what it sends and opens what it receives.
pub(super) fn client_token(g: &Grant, player: u32) -> Result<Token, String> {
    let t: &JoinGrant = g;
    t.reflector
        .parse::<SocketAddr>()
        .map_err(|_| format!("control server gave reflector '{}', not ip:port", t.reflector))?;
    if t.player != player {
        return Err(format!(
            "control server gave a token for player {}, not {player}",
            t.player
        ));
    }
    let token: [u8; TOKEN_LEN] = hex::decode(&t.token)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| format!("control server gave a token that is not {TOKEN_LEN} hex bytes"))?;
    let session_key: [u8; SESSION_KEY_LEN] = hex::decode(&t.session_key)
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| format!("control server gave a session key that is not {SESSION_KEY_LEN} hex bytes"))?;
    Ok(Token {
        reflector: t.reflector.clone(),
        group: t.group,
        player,
        token,
        session_key,
        expires_unix_s: t.expires_unix_s,
        keys: cell_keys(&g.0.keys, Some(t.cell)).map_err(|e| format!("control server gave bad sealing keys: {e}"))?,
    })
}

/// A grant's checkpoint certificate, decoded: the control servers' public
/// key and the signature over the bot client's `sign_key`.
pub(super) type GrantCertificate = ([u8; PUBLIC_KEY_LEN], [u8; SIGNATURE_LEN]);

/// A grant's [`GrantCertificate`] (none from a control server without a
/// sealing secret). One field without the other, or either of the wrong
/// length, is the control server's fault.
pub(super) fn grant_certificate(g: &Grant) -> Result<Option<GrantCertificate>, String> {
    fn decode<const N: usize>(v: &str, what: &str) -> Result<[u8; N], String> {
        hex::decode(v)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| format!("control server gave a {what} that is not {N} hex bytes"))
    }
    match (&g.0.control_public, &g.0.certificate) {
        (None, None) => Ok(None),
        (Some(p), Some(c)) => Ok(Some((decode(p, "control_public")?, decode(c, "certificate")?))),
        _ => Err("control server gave control_public or certificate without the other".into()),
    }
}
