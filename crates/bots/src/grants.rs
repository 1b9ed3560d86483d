//! Join grants from the control server: HTTP on helper threads, so a slow
//! answer never stalls the data path; the answers come back on a channel.

use super::BotsError;
use reflector_client::{GrantError, GrantSigning, Token};
use reflector_proto::control::{JoinGrant, KeyedGrant, WorldInfo};
use reflector_proto::sealed::checkpoint::PUBLIC_KEY_LEN;
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
pub(super) struct Grant(pub(super) KeyedGrant);

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

/// `GET /join?player=..&x=..&y=..&sign_key=..`, and the HTTP status of a
/// refusal. Every `/join` of the bots carries `sign_key` (the bot client's
/// checkpoint signing key), so a control server with a sealing secret
/// certifies it in the grant.
fn fetch_grant_or_status(
    agent: &ureq::Agent,
    control: &str,
    player: u32,
    pos: (f64, f64),
    ticket: Option<&str>,
    sign_key: &[u8; PUBLIC_KEY_LEN],
) -> Result<Grant, (Option<u16>, String)> {
    let mut req = agent.get(&format!("{control}/join"));
    if let Some(t) = ticket {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    req.query("player", &player.to_string())
        .query("x", &pos.0.to_string())
        .query("y", &pos.1.to_string())
        .query("sign_key", &hex::encode(sign_key))
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
    sign_key: &[u8; PUBLIC_KEY_LEN],
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
        let (result, refused) =
            match fetch_grant_any(&agent, &controls, job.player, job.pos, ticket.as_deref(), &job.sign_key) {
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

/// A join grant as the bot client's token and checkpoint certificate,
/// decoded and checked by the client library as it checks the grants it
/// asks for itself ([`Token::from_grant`], then [`GrantSigning::from_grant`]
/// for the bot client's `sign_key`): its epoch keys go with the token, the
/// bot's own cell's first (the client seals under the first), so that in a
/// sealed group the bot seals what it sends and opens what it receives. An
/// error says it is the control server's answer that is bad.
pub(super) fn client_grant(
    g: &Grant,
    player: u32,
    sign_key: &[u8; PUBLIC_KEY_LEN],
) -> Result<(Token, Option<GrantSigning>), String> {
    let bad = |e: GrantError| format!("the control server's /join answer is bad: {e}");
    // The client resolves a name in set_token, on the bots' one event
    // thread: the bots take an address only, so no bot waits on a resolver.
    if g.reflector.parse::<SocketAddr>().is_err() {
        return Err(format!(
            "the control server's /join answer is bad: reflector '{}' is not ip:port",
            g.reflector
        ));
    }
    let token = Token::from_grant(&g.0, player).map_err(bad)?;
    let signing = GrantSigning::from_grant(&g.0, &token, sign_key).map_err(bad)?;
    Ok((token, signing))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGN_KEY: [u8; PUBLIC_KEY_LEN] = [5; PUBLIC_KEY_LEN];

    /// A control server without a sealing secret: no keys, no certificate.
    fn grant() -> Grant {
        Grant(KeyedGrant {
            grant: JoinGrant {
                player: 3,
                cell: [0, 0],
                reflector: "10.0.0.1:4000".into(),
                reflector_id: 0,
                group: 4000,
                token: hex::encode([1u8; 32]),
                session_key: hex::encode([2u8; 32]),
                expires_unix_s: 1_900_000_000,
            },
            keys: Vec::new(),
            control_public: None,
            certificate: None,
        })
    }

    #[test]
    fn a_bad_grant_is_reported_as_the_control_servers_answer() {
        let (t, signing) = client_grant(&grant(), 3, &SIGN_KEY).expect("a good grant");
        assert_eq!((t.group, t.player, t.token, t.session_key), (4000, 3, [1; 32], [2; 32]));
        assert_eq!(signing, None);
        type Spoil = fn(&mut Grant);
        let cases: [(&str, Spoil); 4] = [
            ("the session key is not 32 hex bytes", |g| {
                g.0.grant.session_key.push_str("00")
            }),
            ("certificate without control_public", |g| {
                g.0.certificate = Some(hex::encode([0u8; 64]))
            }),
            ("reflector 'reflector.example:4000' is not ip:port", |g| {
                g.0.grant.reflector = "reflector.example:4000".into()
            }),
            ("a token for player 4, not 3", |g| g.0.grant.player = 4),
        ];
        for (why, spoil) in cases {
            let mut g = grant();
            spoil(&mut g);
            let e = client_grant(&g, 3, &SIGN_KEY).expect_err(why);
            assert_eq!(e, format!("the control server's /join answer is bad: {why}"));
        }
    }
}
