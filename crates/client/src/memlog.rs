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
            .map(|t| t.stream().as_fd())
    }
}

#[cfg(unix)]
impl<D: Driver + std::os::fd::AsFd> std::os::fd::AsFd for Client<D> {
    /// The UDP socket's descriptor (it changes on [`Client::rebind`]).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.sock.as_fd()
    }
}
