//! The [`client::Session`](crate::client::Session) driven over a blocking
//! [`UdpSocket`], for simple clients (tests, benchmarks, tools): send what
//! is due, wait for an answer until the next timer, repeat.
//!
//! [`join`] does the whole handshake with a deadline. [`Joiner::step`] does
//! one round of it, for callers that must check something between rounds
//! (a child process still alive, a stop flag).

use crate::client::{Config, Event, Failure, JoinRequest, Session};
use crate::protocol::{JoinAck, Packet, HEADER_LEN, TOKEN_LEN};
use std::io;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Why a blocking join did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("{call} failed: {source}")]
    Io {
        call: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("player {player} joining group {group}: {failure}")]
    Failed { player: u32, group: u16, failure: Failure },
    #[error("player {player} joining group {group}: the reflector says this player is not a member")]
    MembershipLost { player: u32, group: u16 },
}

/// A handshake in progress on a socket. The socket must be in blocking
/// mode; its read timeout is used for the waits and restored on drop.
pub struct Joiner<'a> {
    sock: &'a UdpSocket,
    session: Session,
    saved_timeout: Option<Option<Duration>>,
    /// Replies to a JOIN are at most as large as a JOIN.
    buf: [u8; HEADER_LEN + 2 * TOKEN_LEN],
}

impl<'a> Joiner<'a> {
    pub fn new(sock: &'a UdpSocket, req: JoinRequest, cfg: Config) -> Joiner<'a> {
        Joiner {
            sock,
            session: Session::new(req, cfg, Instant::now()),
            saved_timeout: None,
            buf: [0; HEADER_LEN + 2 * TOKEN_LEN],
        }
    }

    /// One round: sends what is due, then waits for one datagram or until
    /// the next timer. `Ok(Some(ack))` once admitted. Send errors (e.g. a
    /// reflector not listening yet) and stray datagrams only cost a round.
    pub fn step(&mut self) -> Result<Option<JoinAck>, JoinError> {
        if let Some(ack) = self.session.ack() {
            return Ok(Some(ack));
        }
        let now = Instant::now();
        if self.session.poll_timeout().is_some_and(|t| now >= t) {
            if let Some(ev) = self.session.handle_timeout(now) {
                self.event(ev)?;
            }
        }
        if let Some(t) = self.session.poll_transmit() {
            // Lost or refused sends are retried on the session's timer.
            let _ = self.sock.send_to(t.datagram.as_bytes(), t.to);
        }
        let Some(due) = self.session.poll_timeout() else {
            return Ok(self.session.ack());
        };
        let wait = due.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Ok(None);
        }
        if self.saved_timeout.is_none() {
            self.saved_timeout = Some(self.sock.read_timeout().map_err(|source| JoinError::Io {
                call: "getsockopt(SO_RCVTIMEO)",
                source,
            })?);
        }
        self.sock.set_read_timeout(Some(wait)).map_err(|source| JoinError::Io {
            call: "setsockopt(SO_RCVTIMEO)",
            source,
        })?;
        match self.sock.recv_from(&mut self.buf) {
            Ok((n, src)) => {
                if let Ok(p) = Packet::parse(&self.buf[..n]) {
                    if let Some(ev) = self.session.handle(Instant::now(), src, &p) {
                        self.event(ev)?;
                    }
                }
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A queued ICMP error (connection refused: nothing listens on
            // the port yet) fails the receive at once; wait out the timer
            // rather than spin.
            Err(_) => std::thread::sleep(wait),
        }
        Ok(self.session.ack())
    }

    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The session, to send KEEPALIVE, DATA and LEAVE with later.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.session
    }

    fn event(&self, ev: Event) -> Result<(), JoinError> {
        let (player, group) = (self.session.request().player, self.session.request().group);
        match ev {
            Event::Failed(failure) => Err(JoinError::Failed { player, group, failure }),
            Event::MembershipLost => Err(JoinError::MembershipLost { player, group }),
            // A checkpoint request during the join cannot be answered by a
            // blocking joiner; the reflector asks again later. A MOVED is
            // the caller's to follow once it has the session.
            Event::Retransmitted
            | Event::Restarted
            | Event::Joined(_)
            | Event::Probed
            | Event::Renewed
            | Event::CheckpointRequested { .. }
            | Event::Moved(_) => Ok(()),
        }
    }
}

impl Drop for Joiner<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.saved_timeout {
            let _ = self.sock.set_read_timeout(t);
        }
    }
}

/// Joins over `sock` (blocking mode), retrying every `cfg.retry` until
/// admitted or until `cfg.give_up` (which a blocking caller should set:
/// without it an unanswered join waits forever). Returns the session (for
/// LEAVE and KEEPALIVE) and the reflector's JOIN_ACK.
pub fn join(sock: &UdpSocket, req: JoinRequest, cfg: Config) -> Result<(Session, JoinAck), JoinError> {
    let mut j = Joiner::new(sock, req, cfg);
    loop {
        if let Some(ack) = j.step()? {
            return Ok((j.session, ack));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ErrorCode, Header, Kind, SessionKeys, SmallDatagram};

    fn keys() -> SessionKeys {
        SessionKeys::from_session([8; 32])
    }

    fn reply_header(kind: Kind, group: u16, player: u32) -> Header {
        Header {
            kind,
            group,
            sender: player,
            membership: 9,
            seq: 1,
        }
    }

    /// Player 3 joining the group served at `reflector`.
    fn request(reflector: std::net::SocketAddr) -> JoinRequest {
        JoinRequest {
            reflector,
            group: reflector.port(),
            player: 3,
            token: [1; TOKEN_LEN],
            keys: keys(),
            first_seq: 1,
        }
    }

    fn config(retry_ms: u64, give_up_ms: u64) -> Config {
        Config {
            retry: Duration::from_millis(retry_ms),
            give_up: Some(Duration::from_millis(give_up_ms)),
        }
    }

    /// A scripted reflector on loopback: answers the first JOIN with a
    /// challenge, ignores the first echo (so the client must retry), and
    /// acknowledges the second.
    #[test]
    fn joins_a_scripted_reflector_with_one_lost_reply() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = server.local_addr().unwrap();
        let group = addr.port();
        let script = std::thread::spawn(move || {
            let mut buf = [0u8; 128];
            let mut echoes = 0;
            server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            loop {
                let (n, from) = server.recv_from(&mut buf).unwrap();
                let p = Packet::parse(&buf[..n]).unwrap();
                assert_eq!(p.kind(), Kind::Join);
                match p.join_cookie() {
                    None => {
                        assert!(keys().verify(&p), "the JOIN carries our MAC");
                        let h = reply_header(Kind::JoinChallenge, group, p.sender());
                        let c = SmallDatagram::challenge(&h, &[5; 16], &keys());
                        server.send_to(c.as_bytes(), from).unwrap();
                    }
                    Some(c) => {
                        assert_eq!(c, &[5; 16]);
                        echoes += 1;
                        if echoes == 2 {
                            let a = JoinAck {
                                members: 1,
                                keepalive_ms: 1000,
                                flags: 0,
                                checkpoint_port: 0,
                            };
                            let h = reply_header(Kind::JoinAck, group, p.sender());
                            server
                                .send_to(SmallDatagram::join_ack(&h, a, &keys()).as_bytes(), from)
                                .unwrap();
                            return echoes;
                        }
                    }
                }
            }
        });
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(7))).unwrap();
        let (session, ack) = join(&sock, request(addr), config(50, 10_000)).unwrap();
        assert_eq!(ack.keepalive_ms, 1000);
        assert!(session.is_member());
        assert_eq!(script.join().unwrap(), 2);
        assert_eq!(
            sock.read_timeout().unwrap(),
            Some(Duration::from_secs(7)),
            "timeout restored"
        );
    }

    #[test]
    fn refusal_and_silence_are_errors_that_say_which() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Nobody answers: a timeout after give_up.
        let err = join(&sock, request(server.local_addr().unwrap()), config(20, 200)).unwrap_err();
        assert!(matches!(
            err,
            JoinError::Failed {
                failure: Failure::TimedOut(_),
                ..
            }
        ));
        // A refusal ends the join at once, naming the code.
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let req = request(server.local_addr().unwrap());
        let refuse = std::thread::spawn(move || {
            let mut buf = [0u8; 128];
            let (n, from) = server.recv_from(&mut buf).unwrap();
            let p = Packet::parse(&buf[..n]).unwrap();
            let e = SmallDatagram::error(p.group(), p.sender(), 0, ErrorCode::GroupFull);
            server.send_to(e.as_bytes(), from).unwrap();
        });
        let err = join(&sock, req, config(20, 10_000)).unwrap_err();
        refuse.join().unwrap();
        assert!(err.to_string().contains("GroupFull"), "{err}");
    }
}
