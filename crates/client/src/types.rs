//! The client's public types: its configuration, its events and errors,
//! what it hands out (a received datagram, its counters) and its limits.

use crate::checkpoint::{CheckpointError, CheckpointOp};
// Only for the docs' links: the types name the client's methods.
use crate::streams::StreamCounters;
use crate::token::{ControlError, ControlServer, Token};
#[cfg(doc)]
use crate::Client;
use reflector_proto::client::Failure;
use reflector_proto::protocol::{INSTANCE_LEN, MAX_GAME_PAYLOAD};
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// A member rejoins when its reflector has sent nothing authenticated (no
/// PROBE, no ECHO_REPLY) for this many keepalive intervals: the reflector
/// PROBEs every member about once an interval, so three missed in a row is
/// a reflector gone (or restarted without saying so), not a lost datagram.
pub const SILENT_INTERVALS: u32 = 3;

/// A group rejoined because its reflector went silent, whose JOIN has gone
/// unanswered for this many keepalive intervals more, is placed anew: the
/// client asks the control server where its cell is now (the reflector may
/// be dead and its cells moved to another) and follows the answer as a
/// move. A reflector that only restarted answers the rejoin long before.
pub const REPLACE_INTERVALS: u32 = 2;

/// The largest game payload of one DATA when the group does not carry
/// instance ids (docs/protocol.md, "Maximum payload").
pub const MAX_PAYLOAD: usize = MAX_GAME_PAYLOAD;

/// The largest game payload when it does (the instance id takes 8 bytes).
pub const MAX_PAYLOAD_WITH_INSTANCE: usize = MAX_GAME_PAYLOAD - INSTANCE_LEN;

/// The largest game payload in a sealed group (docs/protocol.md, "Sealed
/// payloads"): the sealed header and the AEAD tag take 32 bytes more than
/// the instance id.
pub const MAX_PAYLOAD_SEALED: usize = reflector_proto::sealed::MAX_SEALED_GAME_DATA;

/// How long after a failed token request (or a refused join) the next try
/// waits, unless the control server said longer (`Retry-After`).
pub const TOKEN_RETRY: Duration = Duration::from_secs(1);

/// Where the token comes from.
#[derive(Debug, Clone)]
pub enum TokenSource {
    /// The game hands tokens in: this one now, later ones with
    /// [`Client::set_token`] when [`Event::TokenNeeded`] asks.
    Given(Token),
    /// The game hands tokens in, and has none yet: the client holds no
    /// group (and sends nothing) until the first [`Client::set_token`] or
    /// [`Client::set_area_tokens`]; later ones as for [`TokenSource::Given`].
    /// Its checkpoint signing key exists from the start
    /// ([`Client::checkpoint_signing_key`]), so the game's backend can send
    /// it as `sign_key` on the `/join` that brings the first token, and a
    /// sealed group's certificate comes with that first grant.
    Later,
    /// The client asks the control server itself (feature `http`).
    Control(ControlServer),
}

/// What a client needs.
#[derive(Debug, Clone)]
pub struct Config {
    pub token: TokenSource,
    /// The local address to bind, `host:port` (port 0: any).
    pub local: String,
    /// A JOIN step unanswered this long is sent again.
    pub join_retry: Duration,
    /// A sender unheard this long is reported ([`Event::SenderSilent`]).
    pub sender_silent_after: Duration,
    /// Senders tracked at once (memory is taken at start).
    pub max_senders: usize,
    /// Received DATA held until [`Client::recv`] takes it; beyond that new
    /// DATA is dropped and counted (`Stats::inbox_full`).
    pub inbox: usize,
    /// Fetch the group's latest checkpoint by itself after each JOIN_ACK
    /// (first join and rejoins) that announces a checkpoint channel, and
    /// report it as a [`CheckpointEvent`]. On by default: a joiner needs the
    /// game state before the DATA that follows it makes sense.
    pub checkpoint_fetch_on_join: bool,
    /// The deadline of one checkpoint exchange (upload or fetch), from the
    /// connect to the last byte; past it the exchange fails
    /// ([`CheckpointError::TimedOut`]).
    pub checkpoint_timeout: Duration,
    /// The largest checkpoint state this client accepts from a fetch.
    pub checkpoint_max_bytes: u64,
    /// Where the checkpoint channel is, when not at the reflector's address
    /// with the JOIN_ACK's port (a reflector behind a TCP forwarder).
    /// Used only for groups whose JOIN_ACK announces a channel.
    pub checkpoint_addr: Option<SocketAddr>,
    /// The area of interest, in cells around the player's (0, the default:
    /// its cell's group only). With R > 0 the client asks the control
    /// server for the cell and the groups within R cells of it in one
    /// request (`/join?...&area=R`; the control server takes R <= 2) and
    /// is a member of each: it hears its neighbours, sends to its cell
    /// only, and moves make-before-break ([`crate::Client::set_position`]).
    /// Used with [`TokenSource::Control`]; a game that hands tokens in
    /// gives the area with [`crate::Client::set_area_tokens`].
    pub area_radius: u8,
    /// How often [`Client::next_update`] asks for an `update` while work
    /// runs that a loop watching only the UDP socket cannot see: a token
    /// request on its helper thread, a checkpoint exchange on its TCP
    /// socket. `None` (the default): every [`crate::FETCH_POLL`] (10 ms)
    /// and [`crate::CHECKPOINT_POLL`] (5 ms) respectively, and not at all
    /// in the tokio driver's loop, which is woken by that work itself.
    /// `Some(d)`: every `d` in either (for the tokio loop a fallback only;
    /// a game loop that calls `update` every frame needs none).
    pub background_poll: Option<Duration>,
    /// For a game that hands tokens in ([`TokenSource::Given`]): the
    /// control server to ask `GET /keys` (docs/protocol.md, "Handing out
    /// keys") when a sealed group's newest key nears its end, with the
    /// membership's newest token, as a [`TokenSource::Control`] client
    /// does with its own. `None` (the default): the keys come only with
    /// the tokens handed in, or from [`crate::Client::set_epoch_keys`]; a
    /// game whose renewals are further apart than the overlap then misses
    /// the next epoch's key. Only its URLs, CA file and plain-HTTP consent
    /// are used (no ticket goes with `/keys`).
    pub keys_from: Option<ControlServer>,
}

impl Config {
    /// A client with `token`, bound to any local port, with the bots'
    /// retry timing.
    pub fn new(token: TokenSource) -> Config {
        Config {
            token,
            local: "0.0.0.0:0".into(),
            join_retry: Duration::from_millis(250),
            sender_silent_after: Duration::from_secs(3),
            max_senders: 1024,
            inbox: 256,
            checkpoint_fetch_on_join: true,
            checkpoint_timeout: Duration::from_secs(10),
            checkpoint_max_bytes: 16 << 20,
            checkpoint_addr: None,
            area_radius: 0,
            background_poll: None,
            keys_from: None,
        }
    }
}

/// Why something went wrong, reported as [`Event::Error`] or returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{call} failed: {message}")]
    Socket { call: &'static str, message: String },
    #[error("cannot resolve reflector address '{addr}': {message}")]
    Resolve { addr: String, message: String },
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("join of group {group} refused: {failure}")]
    JoinRefused { group: u16, failure: Failure },
    #[error("no group {group} is held: hand in its token first (set_token), then its keys and certificate")]
    NoSuchGroup { group: u16 },
    /// A checkpoint certificate handed in for `group`
    /// ([`Client::set_checkpoint_certificate`]) that does not verify under
    /// the `control_public` given, for the world of the group's epoch keys,
    /// this client's signing key, `player` and `expires_unix_s`.
    #[error(
        "the checkpoint certificate for group {group} does not verify under control_public for this client's \
         signing key, player {player} and expiry {expires_unix_s}: ask /join with sign_key set to this client's \
         key and hand in that answer's control_public, certificate and expires_unix_s"
    )]
    BadCertificate {
        group: u16,
        player: u32,
        expires_unix_s: u64,
    },
}

impl Error {
    pub(crate) fn socket(call: &'static str, e: io::Error) -> Error {
        Error::Socket {
            call,
            message: e.to_string(),
        }
    }
}

/// Why [`Client::send`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("payload of {len} bytes is larger than the {max} a DATA may carry here (one Ethernet frame): split it")]
    TooLarge { len: usize, max: usize },
    #[error("not a member of a group yet (wait for Event::Joined)")]
    NotMember,
    #[error("sendto failed: {0}")]
    Io(String),
    #[error(
        "group {group} is sealed and no sealing key is held for its cell now: nothing was sent \
         (the control server needs --sealing-secret-file, or the game hands keys in with set_epoch_keys)"
    )]
    NoSealingKey { group: u16 },
    #[error("group {group}'s JOIN_ACK flags {flags:#04x} say sealed without the instance id: the reflector is misconfigured, nothing is sent there")]
    SealedWithoutInstance { group: u16, flags: u8 },
}

/// Why the client is joining again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejoinReason {
    /// `ERROR(NotMember)`: the reflector forgot us (or someone forged it).
    NotMember,
    /// Nothing authenticated from the reflector for [`SILENT_INTERVALS`]
    /// keepalive intervals.
    ReflectorSilent,
    /// The join was refused for something a retry may cure.
    Refused,
    /// A new token for another group (the player moved).
    NewGroup,
}

/// Something the game may want to know; from [`Client::poll_event`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A member of `group` (the first time, or again after a rejoin).
    Joined {
        group: u16,
        members: u16,
        rejoin: bool,
    },
    /// Joining `group` again with the token and key held, for `reason`
    /// (for [`RejoinReason::NewGroup`], `group` is the new group). With an
    /// area each group rejoins on its own, so the event names which.
    Rejoining {
        group: u16,
        reason: RejoinReason,
    },
    /// The membership of `group` now lasts until `expires_unix_s` (Unix
    /// s). With an area one request renews every group, and each says so.
    Renewed {
        group: u16,
        expires_unix_s: u64,
    },
    /// Asking the control server for a token.
    TokenRequested,
    /// The game hands tokens in and a new one is needed (renewal is due,
    /// or the reflector refused the held one): call [`Client::set_token`].
    TokenNeeded,
    /// The first DATA of a sender (or the first since it went silent).
    SenderHeard {
        player: u32,
        instance: u64,
    },
    /// A sender unheard for [`Config::sender_silent_after`].
    SenderSilent {
        player: u32,
        instance: u64,
    },
    /// [`Client::send`] goes to `to` from now on, the player's new cell,
    /// whose JOIN_ACK has just arrived (a move, [`Client::set_position`]);
    /// it went to `from`.
    Moved {
        from: u16,
        to: u16,
    },
    /// A group out of the new area was left (its LEAVE sent) after the
    /// new area's groups became members (make-before-break). Its DATA
    /// already on the way is still delivered for
    /// [`crate::LEAVE_LINGER`].
    LeftGroup {
        group: u16,
    },
    /// The reflector of `group` said, in a MOVED under this client's key,
    /// that it stops serving the membership within `within_ms` (`reason`:
    /// 1 draining, 2 the cell placed elsewhere, 3 shutting down). The
    /// client asks the control server where to go and joins there before
    /// it leaves here ([`Event::Moved`] and [`Event::LeftGroup`] follow if
    /// the placement changed); a game that hands tokens in gets
    /// [`Event::TokenNeeded`] as well.
    MoveAsked {
        group: u16,
        reason: u16,
        within_ms: u16,
    },
    /// Every membership was left ([`Client::leave`]).
    Left,
    Error(Error),
}

/// What happened with checkpoints; from [`Client::poll_checkpoint`] (a
/// queue of its own, so the states they carry stay off [`Event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointEvent {
    /// The reflector asked this member for the group's state (an
    /// authenticated CHECKPOINT_REQUEST): answer with
    /// [`Client::provide_checkpoint`].
    Requested { group: u16 },
    /// The state provided was stored by the reflector (its authenticated
    /// STORED named our state's digest, tick and player).
    Uploaded { group: u16, number: u64, tick: u64 },
    /// A checkpoint of the group, its SHA-256 checked against the
    /// authenticated REPLY: the latest, or the other one kept.
    Checkpoint {
        group: u16,
        /// Which one: [`CheckpointOp::Fetch`], the latest (also the fetch on
        /// join), or [`CheckpointOp::FetchOther`], the other one kept
        /// ([`Client::fetch_checkpoint_other`]).
        op: CheckpointOp,
        /// The checkpoint's number in its group.
        number: u64,
        /// The game tick its uploader gave.
        tick: u64,
        /// Who uploaded it.
        from_player: u32,
        /// How old it was when served.
        age_ms: u32,
        /// The game's state: in a sealed group, opened from its envelope
        /// after every check passed.
        bytes: Vec<u8>,
        /// How far it can be trusted: [`Verification::Clear`] in a clear
        /// group; in a sealed group signed by one member, or verified by
        /// (or disputed between) two.
        verification: Verification,
    },
    /// The group has no checkpoint yet (`op` [`CheckpointOp::Fetch`]), or
    /// fewer than two, so no other one (`op` [`CheckpointOp::FetchOther`]).
    Empty { group: u16, op: CheckpointOp },
    /// An exchange failed (nothing in it was taken as a checkpoint); see
    /// [`CheckpointError::refusal`] for the reflector's reason.
    Failed {
        group: u16,
        op: CheckpointOp,
        reason: CheckpointError,
    },
}

/// How far a fetched checkpoint can be trusted (docs/protocol.md,
/// "Sealed checkpoints").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verification {
    /// A clear group: the state is as the reflector served it (its SHA-256
    /// checked against the authenticated REPLY), nothing more.
    Clear,
    /// A sealed group: sealed under the group's key and signed by the
    /// certified key of `player`, who uploaded it (one member's word).
    SignedByOne { player: u32 },
    /// Both snapshots the reflector keeps (FETCH and FETCH_OTHER), of the
    /// same tick, passed every check and are the same state, uploaded by
    /// two members.
    VerifiedByTwo { players: [u32; 2] },
    /// Both snapshots passed every check, of the same tick, but the two
    /// members' states differ: which to load is the game's policy (each
    /// event carries its own state).
    Disagree { players: [u32; 2] },
}

/// One received DATA, borrowed from the client until the next call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub group: u16,
    pub sender: u32,
    /// The sender's client instance id (0 if the group does not carry it).
    pub instance: u64,
    /// The sender's client-wide sequence number.
    pub seq: u64,
    pub payload: &'a [u8],
}

/// Counters since the client started.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub data_sent: u64,
    pub bytes_sent: u64,
    pub data_received: u64,
    pub bytes_received: u64,
    pub streams: StreamCounters,
    /// DATA dropped because the inbox was full (the game did not `recv`).
    pub inbox_full: u64,
    /// DATA larger than [`MAX_DATAGRAM_KERNEL`](reflector_proto::protocol::MAX_DATAGRAM_KERNEL), dropped.
    pub oversize: u64,
    /// Datagrams that did not parse, or came from elsewhere than the reflector.
    pub ignored: u64,
    /// DATA of a group this client is not a member of now (joining, or
    /// its join refused) nor has just left: dropped (also in `ignored`).
    pub data_not_member: u64,
    /// JOIN steps sent again: unanswered for [`Config::join_retry`], or
    /// started over on a stale cookie.
    pub join_retries: u64,
    pub probes_answered: u64,
    pub echoes_sent: u64,
    pub echoes_answered: u64,
    /// The last ECHO round trip.
    pub rtt_last: Option<Duration>,
    /// Smoothed round trip (RFC 6298's 1/8 gain).
    pub rtt_smoothed: Option<Duration>,
    pub rtt_min: Option<Duration>,
    pub joins: u64,
    pub rejoins: u64,
    pub renewals: u64,
    pub token_requests: u64,
    /// MOVEDs received (each reflector repeats it every second until the
    /// member is gone; see [`crate::MOVE_FOLLOW_MAX`] for how often the
    /// client follows them).
    pub moves_asked: u64,
    /// Placements asked anew because a silent reflector did not answer the
    /// rejoin ([`crate::REPLACE_INTERVALS`]).
    pub replacements: u64,
    /// CHECKPOINT_REQUESTs received.
    pub checkpoints_requested: u64,
    /// Uploads the reflector stored.
    pub checkpoints_uploaded: u64,
    /// Fetches that ended with a checkpoint or with none (EMPTY).
    pub checkpoints_fetched: u64,
    /// Exchanges that failed (uploads and fetches).
    pub checkpoint_failures: u64,
    /// Sealed groups' DATA that passed every receiving step and opened
    /// (its game data then goes on as a clear DATA's would).
    pub sealed_opened: u64,
    /// Sealed groups' DATA dropped by the receiving steps
    /// (docs/protocol.md, "Receiving"), one counter per step: not a sealed
    /// DATA (too short, or clear DATA in a sealed group) ...
    pub sealed_malformed: u64,
    /// ... a sealed version this client does not read ...
    pub sealed_version: u64,
    /// ... no epoch key held for its cell and epoch (keys not handed out
    /// or not refreshed yet, or the sender's clock far off) ...
    pub sealed_no_key: u64,
    /// ... a sequence already seen from that sender instance: the same
    /// sealed datagram again (a replay) ...
    pub sealed_replay: u64,
    /// ... and does not open under the sender's key: forged or altered.
    pub sealed_bad: u64,
    /// Sealed DATA dropped as duplicate deliveries, not counted above: an
    /// authentic copy of a sequence already opened that the sender sealed
    /// for another group (a sender in two groups of this client's area
    /// sending one datagram to both; docs/protocol.md, "Duplicate
    /// deliveries"). The game got the first copy; this is no attack.
    pub sealed_duplicate: u64,
    /// Sealed groups' fetched checkpoints refused by the joiner's checks
    /// (docs/protocol.md, "Sealed checkpoints"), one counter per check,
    /// named as the document names it; a refused state never reaches the
    /// game (the fetch ends in [`CheckpointEvent::Failed`]). Not a
    /// checkpoint envelope (too short, wrong magic or reserved bytes) ...
    pub checkpoint_malformed: u64,
    /// ... an envelope version this client does not read ...
    pub checkpoint_version: u64,
    /// ... sealed for a cell not of the group fetched from (another
    /// group's or world's checkpoint) ...
    pub checkpoint_wrong_cell: u64,
    /// ... the REPLY's tick or uploader differ from the envelope's ...
    pub checkpoint_mismatch: u64,
    /// ... the uploader's certificate does not verify under the grant's
    /// `control_public` ...
    pub checkpoint_bad_certificate: u64,
    /// ... it had expired when the state was uploaded ...
    pub checkpoint_expired_certificate: u64,
    /// ... the envelope's signature does not verify ...
    pub checkpoint_bad_signature: u64,
    /// ... no epoch key held for its cell and epoch (fetch again later) ...
    pub checkpoint_no_key: u64,
    /// ... and the state does not open under the checkpoint key: garbage
    /// or forged.
    pub checkpoint_bad: u64,
    /// `/keys` requests sent (key refreshes, docs/protocol.md "Handing
    /// out keys").
    pub keys_requests: u64,
    /// `/keys` answers received (each adds the keys it brings).
    pub keys_refreshes: u64,
    /// `/keys` requests that failed (unreachable, refused, 429): retried
    /// with backoff, a 429's `Retry-After` honoured.
    pub keys_refresh_failures: u64,
}
