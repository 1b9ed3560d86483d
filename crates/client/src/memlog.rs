//! What a caller that accounts for every datagram needs beyond a game's
//! API: a log of each membership's life (when its confirming JOIN went
//! out, its JOIN_ACK, its end), the membership [`Client::send`] goes to,
//! the descriptors an event loop watches, a send failure with its
//! `io::ErrorKind`, and a receive that leaves datagrams in the socket
//! while the inbox is full. The reflector's bots use it to know exactly
//! which datagrams each of them is owed; a game needs none of it.
//!
//! The log is off until [`Client::log_memberships`]; then every record is
//! kept until [`Client::poll_membership`] takes it, so a caller polls
//! after each call into the client (a handful per membership).

use crate::*;

/// One change in a membership's life, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipChange {
    /// A join began (its first JOIN is being sent): the membership's id
    /// is new. Not a member yet.
    Started,
    /// The JOIN echoing the reflector's cookie went out (again, on a
    /// retry): from now on the reflector may count it as a member.
    ConfirmSent,
    /// Its JOIN_ACK arrived: a member for sure.
    Joined,
    /// The cookie went stale (a slow round trip): the join starts over
    /// from its first JOIN, under the same id. Whatever a confirming JOIN
    /// sent before did, it did not make a member.
    Restarted,
    /// The join was refused, or the token expired: not a member.
    Failed,
    /// Its LEAVE was sent (a move, [`Client::leave`]).
    Left,
    /// Given up without a LEAVE: replaced by a new join (a rejoin after
    /// `ERROR(NotMember)` or a silent reflector, or a join after a
    /// refusal); a [`MembershipChange::Started`] with a new id follows.
    Lost,
}

/// One entry of the membership log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MembershipRecord {
    /// The client's number for the membership (from 1, never reused).
    pub id: u64,
    pub reflector: SocketAddr,
    pub group: u16,
    pub change: MembershipChange,
}

/// Why [`Client::try_send`] sent nothing.
#[derive(Debug, thiserror::Error)]
pub enum TrySendError {
    /// Refused before any socket call (too large, not a member).
    #[error(transparent)]
    Refused(#[from] SendError),
    /// The socket's own error: `ErrorKind::WouldBlock` is a full send
    /// buffer (send again later).
    #[error("sendto failed: {0}")]
    Io(io::Error),
}

impl<D: Driver> Client<D> {
    /// Starts keeping the membership log ([`Client::poll_membership`]).
    /// The memberships already started are not in it.
    pub fn log_memberships(&mut self) {
        if self.memlog.is_none() {
            self.memlog = Some(VecDeque::with_capacity(16));
        }
    }

    /// The oldest record of the membership log not taken yet.
    pub fn poll_membership(&mut self) -> Option<MembershipRecord> {
        self.memlog.as_mut()?.pop_front()
    }

    pub(crate) fn log_membership(&mut self, i: usize, change: MembershipChange) {
        if let Some(log) = self.memlog.as_mut() {
            let m = &self.memberships[i];
            log.push_back(MembershipRecord {
                id: m.id,
                reflector: m.reflector,
                group: m.session.request().group,
                change,
            });
        }
    }

    /// The id (as in the membership log) of the membership
    /// [`Client::send`] goes to now.
    pub fn sending_membership(&self) -> Option<u64> {
        self.sending_index().map(|i| self.memberships[i].id)
    }

    /// The socket's driver (an event loop watches its descriptor).
    pub fn driver(&self) -> &D {
        &self.sock
    }

    /// With `on`, `update` stops receiving once the inbox is full and
    /// leaves the rest in the socket's buffer ([`Client::inbox_held`]),
    /// rather than dropping new DATA (`Stats::inbox_full`). For a caller
    /// that takes everything with [`Client::recv`] after each `update` and
    /// then updates again while the inbox was held: PROBEs behind the held
    /// DATA wait with it.
    pub fn hold_when_inbox_full(&mut self, on: bool) {
        self.hold_when_full = on;
    }

    /// The last `update` stopped receiving at a full inbox (with
    /// [`Client::hold_when_inbox_full`]): more may be waiting.
    pub fn inbox_held(&self) -> bool {
        self.inbox_held
    }

    /// The TCP sockets of the checkpoint exchanges under way, for an event
    /// loop to watch (readable and writable) next to the UDP socket, so
    /// that it calls `update` as soon as one can move on instead of every
    /// [`CHECKPOINT_POLL`]. Each closes when its exchange ends.
    #[cfg(unix)]
    pub fn checkpoint_fds(&self) -> impl Iterator<Item = std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        [&self.ck_upload, &self.ck_fetch]
            .into_iter()
            .flatten()
            .map(|t| t.socket().as_fd())
    }
}

#[cfg(unix)]
impl<D: Driver + std::os::fd::AsFd> std::os::fd::AsFd for Client<D> {
    /// The UDP socket's descriptor (it changes on [`Client::rebind`]).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reflector_proto::auth::{Secret, TokenClaims};
    use reflector_proto::protocol::{emit_in_place, Header, JoinAck, SmallDatagram, COOKIE_LEN};

    const REFLECTOR: ([u8; 4], u16) = ([127, 0, 0, 1], 4000);
    const SESSION_KEY: [u8; 32] = [2; 32];

    /// A network in memory whose send buffer can be full.
    #[derive(Default)]
    struct Mem {
        sent: Vec<Vec<u8>>,
        inbox: VecDeque<Vec<u8>>,
        send_full: bool,
    }

    impl Driver for Mem {
        fn send_to(&mut self, d: &[u8], _: SocketAddr) -> io::Result<usize> {
            if self.send_full {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.sent.push(d.to_vec());
            Ok(d.len())
        }
        fn recv_from(&mut self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
            let d = self.inbox.pop_front().ok_or(io::ErrorKind::WouldBlock)?;
            buf[..d.len()].copy_from_slice(&d);
            Ok((d.len(), SocketAddr::from(REFLECTOR)))
        }
        fn local_addr(&self) -> io::Result<SocketAddr> {
            Ok(SocketAddr::from(([127, 0, 0, 1], 5555)))
        }
        fn rebind(&mut self) -> io::Result<SocketAddr> {
            self.local_addr()
        }
    }

    fn client(inbox: usize) -> Client<Mem> {
        let expires_unix_s = reflector_proto::unix_now_ms() / 1000 + 300;
        let claims = TokenClaims {
            player: 7,
            reflector: 0,
            group: REFLECTOR.1,
            expires_unix_s,
        };
        let token = Token {
            reflector: SocketAddr::from(REFLECTOR).to_string(),
            group: REFLECTOR.1,
            player: 7,
            token: claims.sign(&Secret::new(&[3; 32]).unwrap()),
            session_key: SESSION_KEY,
            expires_unix_s,
            keys: Vec::new(),
        };
        let mut cfg = Config::new(TokenSource::Given(token));
        cfg.inbox = inbox;
        Client::with_driver(cfg, Mem::default()).unwrap()
    }

    fn header(kind: Kind) -> Header {
        Header {
            kind,
            group: REFLECTOR.1,
            sender: 7,
            membership: 0x55,
            seq: 1,
        }
    }

    /// The reflector's two answers to a JOIN, taken in one update each.
    fn join(c: &mut Client<Mem>, now: Instant) {
        let keys = SessionKeys::from_session(SESSION_KEY);
        let h = header(Kind::JoinChallenge);
        c.sock.inbox.push_back(
            SmallDatagram::challenge(&h, &[9; COOKIE_LEN], &keys)
                .as_bytes()
                .to_vec(),
        );
        c.update(now);
        let ack = JoinAck {
            members: 2,
            keepalive_ms: 500,
            flags: 0,
            checkpoint_port: 0,
        };
        c.sock
            .inbox
            .push_back(SmallDatagram::join_ack(&h, ack, &keys).as_bytes().to_vec());
        c.update(now);
        assert!(c.is_member());
    }

    /// DATA from player 8, number `seq`.
    fn data(seq: u64) -> Vec<u8> {
        let h = Header {
            kind: Kind::Data,
            group: REFLECTOR.1,
            sender: 8,
            membership: 0x66,
            seq,
        };
        let mut d = vec![0u8; DATA_PAYLOAD + 4];
        let n = emit_in_place(&h, d.len(), None, &mut d).unwrap();
        d.truncate(n);
        d
    }

    fn log(c: &mut Client<Mem>) -> Vec<(u64, MembershipChange)> {
        std::iter::from_fn(|| c.poll_membership())
            .map(|r| (r.id, r.change))
            .collect()
    }

    #[test]
    fn the_membership_log_names_each_step_of_each_membership() {
        use MembershipChange::*;
        let t0 = Instant::now();
        let mut c = client(8);
        c.log_memberships();
        join(&mut c, t0);
        assert_eq!(log(&mut c), [(1, ConfirmSent), (1, Joined)]);
        assert_eq!(c.sending_membership(), Some(1));
        // A NotMember (unauthenticated) rejoins with the token held: the
        // membership given up, a new one started and confirmed.
        let e = SmallDatagram::error(REFLECTOR.1, 7, 0x55, ErrorCode::NotMember);
        c.sock.inbox.push_back(e.as_bytes().to_vec());
        c.update(t0);
        assert_eq!(log(&mut c), [(1, Lost), (2, Started)]);
        assert_eq!(c.sending_membership(), None, "not a member until the new JOIN_ACK");
        join(&mut c, t0);
        assert_eq!(log(&mut c), [(2, ConfirmSent), (2, Joined)]);
        c.leave();
        assert_eq!(log(&mut c), [(2, Left)]);
    }

    #[test]
    fn a_full_send_buffer_is_told_by_its_kind() {
        let mut c = client(8);
        join(&mut c, Instant::now());
        c.sock.send_full = true;
        match c.try_send(b"state") {
            Err(TrySendError::Io(e)) => assert_eq!(e.kind(), io::ErrorKind::WouldBlock),
            other => panic!("{other:?}"),
        }
        assert!(matches!(c.send(b"state"), Err(SendError::Io(_))));
        assert!(matches!(
            c.try_send(&[0; MAX_PAYLOAD + 1]),
            Err(TrySendError::Refused(SendError::TooLarge { .. }))
        ));
        c.sock.send_full = false;
        assert!(c.try_send(b"state").is_ok());
        assert_eq!(c.stats().data_sent, 1);
    }

    #[test]
    fn a_held_inbox_leaves_datagrams_in_the_socket_and_dropped_data_is_counted() {
        let t0 = Instant::now();
        let mut c = client(2);
        // DATA while joining: not a member, dropped and counted.
        c.sock.inbox.push_back(data(1));
        c.update(t0);
        assert_eq!((c.stats().data_not_member, c.stats().ignored), (1, 1));
        join(&mut c, t0);
        c.hold_when_inbox_full(true);
        for seq in 2..7 {
            c.sock.inbox.push_back(data(seq));
        }
        c.update(t0);
        assert!(c.inbox_held());
        assert_eq!(c.sock.inbox.len(), 3, "the rest waits in the socket");
        let mut got = Vec::new();
        for _ in 0..3 {
            while let Some(d) = c.recv() {
                got.push(d.seq);
            }
            c.update(t0);
        }
        assert_eq!(got, [2, 3, 4, 5, 6]);
        assert!(!c.inbox_held());
        assert_eq!(c.stats().inbox_full, 0);
    }
}
