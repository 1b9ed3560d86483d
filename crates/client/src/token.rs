//! Where a client's join token comes from: handed in by the game (its
//! backend fetched it), or asked of the control server over HTTP (feature
//! `http`) with the player's ticket from the game backend.

use reflector_proto::protocol::{SESSION_KEY_LEN, TOKEN_LEN};

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
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("reflector", &self.reflector)
            .field("group", &self.group)
            .field("player", &self.player)
            .field("expires_unix_s", &self.expires_unix_s)
            .finish_non_exhaustive()
    }
}

/// How to ask the control server for a token.
#[derive(Clone, PartialEq)]
pub struct ControlServer {
    /// `http://host:port` of the control server.
    pub url: String,
    /// The player's ticket from the game backend (a JWT), sent as
    /// `Authorization: Bearer`; `None` for a control server with anonymous
    /// joins (closed test networks).
    pub ticket: Option<String>,
    /// The player id: sent as `player=` (which must match the ticket's).
    pub player: u32,
    /// The player's position in the world: it picks the cell, so the group.
    pub position: (f64, f64),
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer")
            .field("url", &self.url)
            .field("player", &self.player)
            .field("position", &self.position)
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
}

#[cfg(feature = "http")]
mod http {
    use super::{ControlError, ControlServer, Token};
    use reflector_proto::protocol::{SESSION_KEY_LEN, TOKEN_LEN};
    use std::time::Duration;

    /// The control server's `/join` answer (fields this crate reads).
    #[derive(serde::Deserialize)]
    struct Answer {
        player: u32,
        reflector: String,
        group: u16,
        token: String,
        session_key: String,
        expires_unix_s: u64,
    }

    #[derive(serde::Deserialize)]
    struct Refusal {
        error: String,
    }

    /// `GET /join` with short timeouts: it runs on a helper thread, but a
    /// renewal must not wait a long time on a dead server either.
    pub fn fetch(c: &ControlServer) -> Result<Token, ControlError> {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build();
        let mut req = agent
            .get(&format!("{}/join", c.url.trim_end_matches('/')))
            .query("player", &c.player.to_string())
            .query("x", &c.position.0.to_string())
            .query("y", &c.position.1.to_string());
        if let Some(t) = &c.ticket {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        let answer: Answer = match req.call() {
            Ok(resp) => resp
                .into_json()
                .map_err(|e| ControlError::BadAnswer(format!("not the /join JSON: {e}")))?,
            Err(ureq::Error::Status(status, resp)) => {
                let retry_after_s = resp
                    .header("Retry-After")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(1);
                let body = resp.into_string().unwrap_or_default();
                let message = serde_json::from_str::<Refusal>(&body)
                    .map(|r| r.error)
                    .unwrap_or_else(|_| body.trim().to_string());
                return Err(match status {
                    401 => ControlError::Unauthorized { message },
                    403 => ControlError::Forbidden { message },
                    429 => ControlError::RateLimited { retry_after_s, message },
                    _ => ControlError::Status { status, message },
                });
            }
            Err(ureq::Error::Transport(t)) => {
                return Err(ControlError::Unreachable {
                    url: c.url.clone(),
                    reason: t.to_string(),
                })
            }
        };
        if answer.player != c.player {
            return Err(ControlError::BadAnswer(format!(
                "a token for player {}, not {}",
                answer.player, c.player
            )));
        }
        let token: [u8; TOKEN_LEN] = hex::decode(&answer.token)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| ControlError::BadAnswer(format!("the token is not {TOKEN_LEN} hex bytes")))?;
        let session_key: [u8; SESSION_KEY_LEN] = hex::decode(&answer.session_key)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| ControlError::BadAnswer(format!("the session key is not {SESSION_KEY_LEN} hex bytes")))?;
        Ok(Token {
            reflector: answer.reflector,
            group: answer.group,
            player: answer.player,
            token,
            session_key,
            expires_unix_s: answer.expires_unix_s,
        })
    }
}

/// Asks the control server for a token (blocking; the client calls it on
/// a helper thread).
pub fn fetch(c: &ControlServer) -> Result<Token, ControlError> {
    #[cfg(feature = "http")]
    return http::fetch(c);
    #[cfg(not(feature = "http"))]
    {
        let _ = c;
        Err(ControlError::NoHttp)
    }
}
