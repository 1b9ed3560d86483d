//! What the membership core is told (policy, keys, the time) and what it
//! answers (an outcome: an event, a reply and who pays for it).

use reflector_proto::auth::{Secret, SecretRing, TokenError};
use reflector_proto::protocol::{Kind, ParseError, SmallDatagram};
use std::net::SocketAddr;

/// Membership policy.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A member that gives no sign of life for this long is removed.
    pub member_timeout_ms: u64,
    /// Members per group; further joins get ERROR(GroupFull).
    pub max_members: usize,
    /// Keepalive interval announced in JOIN_ACK; members are probed about
    /// as often.
    pub keepalive_ms: u16,
    /// Replies nobody can verify (errors to non-members, to bad tokens, MACs
    /// and cookies, version errors) per second, with a burst of as many: one
    /// budget per event loop, which the caller applies
    /// ([`ReplyBudget::admit`]). Replies are never larger than their
    /// request, but a spoofed flood would still be reflected one for one onto
    /// its victim; this caps that, and nothing else draws on it.
    pub replies_per_s: u32,
    /// Replies per second (burst as many) to one verified player that is not
    /// a member, in one group: JOIN_CHALLENGEs (sent only after the token and
    /// the JOIN's MAC verified), refusals after its cookie, ERROR(Retry) and
    /// the occupancy checks it causes. A valid JOIN replayed from many
    /// addresses drains only its own player's share.
    pub player_replies_per_s: u32,
    /// Replies per second (burst as many) a member's own datagrams may
    /// cause: rebinding PROBEs (at most one a second in any case), the
    /// JOIN_CHALLENGE and JOIN_ACK of a re-JOIN, ERROR(Retry) and the
    /// occupancy checks it causes. Nothing a non-member sends touches it.
    pub member_replies_per_s: u32,
    /// DATA tags for groups that do not say otherwise ([`Group::set_tags`]).
    pub data_tags: bool,
    /// The instance flag (JOIN_ACK flag bit 1: every DATA's game payload
    /// starts with the sender's instance id) for groups that do not say
    /// otherwise ([`Group::set_instance`]). Only announced, never read.
    pub data_instance: bool,
    /// Sealed payloads (JOIN_ACK flag bit 2, always with the instance flag,
    /// bit 1: every DATA's game payload is sealed end to end under epoch
    /// keys the control servers hand to players) for groups that do not say
    /// otherwise ([`Group::set_sealed`]). Only announced: the reflector
    /// never holds the keys and never reads a sealed payload.
    pub data_sealed: bool,
    /// TCP port of the checkpoint channel announced in JOIN_ACK (0: none).
    pub checkpoint_port: u16,
    /// Members per source IP address in one group: one host cannot fill a
    /// group (and turn each of its datagrams into a thousand copies), while
    /// a household behind one NAT still fits.
    pub max_per_ip: usize,
    /// DATA per second one member may have fanned out (a token bucket with a
    /// second's burst); 0: no cap.
    pub member_pps: u32,
    /// DATA bytes per second one member may have fanned out; 0: no cap.
    pub member_bytes_per_s: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            member_timeout_ms: 10_000,
            max_members: 1024,
            keepalive_ms: 2_000,
            replies_per_s: 200,
            player_replies_per_s: 5,
            member_replies_per_s: 5,
            data_tags: true,
            data_instance: false,
            data_sealed: false,
            checkpoint_port: 0,
            max_per_ip: 32,
            member_pps: 500,
            member_bytes_per_s: 1_000_000,
        }
    }
}

/// What a reflector needs to check joins: the secret shared with the
/// control server (to verify tokens and derive session keys), its own id in
/// the control server's map (tokens name it), and its private key for
/// cookies, membership ids and probe nonces.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The secret shared with the control server (and, during a rollover,
    /// the previous one while it is still accepted).
    pub token_secret: SecretRing,
    pub reflector_id: u16,
    pub cookie_key: Secret,
}

/// The two clocks the decisions need, read once by the caller: wall-clock
/// time for token expiry and cookie slots (shared with other hosts), and a
/// monotonic clock for member liveness, so that a step of the system clock
/// neither expires every member at once nor keeps dead ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    pub unix_ms: u64,
    pub mono_ms: u64,
    /// The monotonic clock in microseconds (the same instant as `mono_ms`):
    /// PROBE round trips are timed with it.
    pub mono_us: u64,
}

/// Why a datagram was dropped. Each maps to a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    Malformed(ParseError),
    /// Header names another group than the port it arrived on.
    WrongGroup,
    /// From a player that is not a member.
    NotMember,
    /// A member's player id with another membership id (an old membership).
    StaleMembership,
    /// The MAC does not verify under the member's (or the token's) key.
    BadMac,
    /// DATA whose tag does not verify.
    BadTag,
    /// A sequence number seen before, or older than the window.
    Replay,
    /// Authenticated, but from an address the member has not validated yet
    /// (a PROBE went there, or the datagram could not be authenticated).
    Unvalidated,
    /// A member's JOIN carrying another valid token of the player that
    /// does not expire later than the token the membership was made with
    /// (a captured older JOIN): it replaces nothing.
    OlderToken,
    Token(TokenError),
    BadCookie,
    GroupFull,
    /// A JOIN or rebind onto an address another member holds: refused
    /// (ERROR(Retry)) or not moved, while that member is checked.
    Occupied,
    /// The source address has [`Policy::max_per_ip`] members in the group.
    AddressLimit,
    /// DATA beyond the member's rate cap ([`Policy::member_pps`],
    /// [`Policy::member_bytes_per_s`]).
    RateLimited,
    /// A type only the reflector sends.
    Unexpected(Kind),
}

/// What happened to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Fan the datagram out (tag field zeroed) to every member but its sender.
    Forward {
        from: SocketAddr,
    },
    Challenged,
    /// Admitted; `rejoin` if the player was a member already.
    Joined {
        rejoin: bool,
    },
    Left,
    Refreshed,
    /// A PROBE_REPLY from the member's address: its RTT was measured, in
    /// microseconds.
    Probed {
        rtt_us: u64,
    },
    /// A PROBE_REPLY from a new address under the key: the member moved.
    Rebound {
        from: SocketAddr,
        to: SocketAddr,
    },
    /// A PROBE_REPLY answered an occupancy check: the member keeps its
    /// address, whoever else wanted it.
    Held,
    /// A renewal from the member's address with a valid token: its expiry
    /// is the newer token's (if later); keys, window and id are unchanged.
    Renewed,
    /// A JOIN with cookie carrying another token of the player, expiring
    /// later than the membership's own: a restarted client; the membership
    /// is replaced (new id, the new token's keys, a fresh window).
    Replaced,
    /// An ECHO from the member's address: a sign of life, answered with
    /// ECHO_REPLY unless its echo budget is spent.
    Echoed,
    Dropped(DropReason),
}

/// Whose budget a reply comes from: whoever caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payer {
    /// No budget: no reply, or a JOIN_ACK admitting a new member (its cookie
    /// proved the address, its MAC the player; bounded by the group's size).
    Nobody,
    /// Nobody could be verified: the caller's global budget
    /// ([`ReplyBudget::admit`], [`Policy::replies_per_s`]).
    Unverified,
    /// A verified player that is not a member
    /// ([`Policy::player_replies_per_s`]); already paid.
    Player,
    /// A member ([`Policy::member_replies_per_s`]); already paid.
    Member,
}

/// The decision for one datagram: an event and maybe a reply to its source.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub event: Event,
    pub reply: Option<SmallDatagram>,
    /// Whose budget pays for the reply.
    pub payer: Payer,
    /// The type of a reply that was due but not sent: its payer's budget
    /// was spent (or, for a rebinding PROBE, one went within the second).
    pub suppressed: Option<Kind>,
}

impl Outcome {
    pub(super) fn silent(event: Event) -> Outcome {
        Outcome {
            event,
            reply: None,
            payer: Payer::Nobody,
            suppressed: None,
        }
    }

    pub(super) fn drop(reason: DropReason) -> Outcome {
        Outcome::silent(Event::Dropped(reason))
    }

    /// The one place replies are allowed out: never larger than the request.
    pub(super) fn with_reply(event: Event, reply: SmallDatagram, request_len: usize, payer: Payer) -> Outcome {
        Outcome {
            event,
            reply: (reply.len() <= request_len).then_some(reply),
            payer,
            suppressed: None,
        }
    }

    /// A reply of `kind` was due, but `payer`'s budget is spent.
    pub(super) fn withheld(event: Event, kind: Kind, payer: Payer) -> Outcome {
        Outcome {
            event,
            reply: None,
            payer,
            suppressed: Some(kind),
        }
    }

    /// `reply` as `paid` says: sent, withheld, or (`None`: the payer has no
    /// budget of its own here) left to the caller's global budget.
    pub(super) fn paid(
        event: Event,
        reply: SmallDatagram,
        request_len: usize,
        payer: Payer,
        paid: Option<bool>,
    ) -> Outcome {
        match paid {
            Some(true) => Outcome::with_reply(event, reply, request_len, payer),
            Some(false) => Outcome::withheld(event, reply_kind(&reply), payer),
            None => Outcome::with_reply(event, reply, request_len, Payer::Unverified),
        }
    }

    /// The type of the reply, if there is one.
    pub fn reply_kind(&self) -> Option<Kind> {
        self.reply.as_ref().map(reply_kind)
    }
}

/// The type of a datagram the reflector built (a header always leads it).
pub(super) fn reply_kind(r: &SmallDatagram) -> Kind {
    r.as_bytes()
        .get(3)
        .and_then(|&t| Kind::from_u8(t))
        .unwrap_or(Kind::Error)
}
