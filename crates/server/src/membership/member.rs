//! A member: its address, keys, replay window, budgets and pending PROBEs;
//! the changes and expiries a group reports.

use super::budget::ReplyBudget;
use super::types::Policy;
use reflector_proto::protocol::{Header, Kind, ReplayWindow, SessionKeys, TOKEN_LEN};
use std::net::SocketAddr;

/// Verified players that are not members, with a reply budget each, per
/// group: bounded; beyond it their replies fall to the global budget.
pub(super) const MAX_PLAYER_BUDGETS: usize = 4096;

/// Occupancy checks: the holder of a wanted address is PROBEd twice, this
/// far apart (the server's sweep runs every 500 ms), and removed this long
/// after the second PROBE if it answered neither.
pub(super) const OCCUPANCY_PROBE_GAP_MS: u64 = 500;

/// Rebinding PROBEs per member: at most one per this interval, and a
/// pending one is not replaced sooner.
pub(super) const REBIND_PROBE_EVERY_MS: u64 = 1000;

/// ECHO_REPLYs per member per second (a burst of as many): a member's
/// echoes beyond it refresh it but are not answered.
pub const ECHO_REPLIES_PER_S: u32 = 4;

/// A check that a member still holds its address, because someone else
/// wants it: PROBEs under the member's own key (paid by whoever wants it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OccupancyCheck {
    /// The PROBEs' nonce (both carry it), 0 until the first is sent.
    pub nonce: u64,
    /// PROBEs sent so far (0, 1 or 2).
    pub probes: u8,
    /// When the last one went (or the check began, before the first).
    pub sent_ms: u64,
}

/// What one [`Group::probes`] call sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Probed {
    /// RTT PROBEs.
    pub rtt: usize,
    /// Occupancy-check PROBEs.
    pub occupancy: usize,
    /// Occupancy checks begun (their first PROBE).
    pub checks_started: usize,
}

/// A PROBE on its way: to which address, with which nonce, when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingProbe {
    pub addr: SocketAddr,
    pub nonce: u64,
    pub sent_ms: u64,
    /// When it went, monotonic microseconds ([`Now::mono_us`]).
    pub sent_us: u64,
}

#[derive(Debug, Clone, Copy)]
pub struct Member {
    pub addr: SocketAddr,
    pub sender: u32,
    /// The random id of this membership (in JOIN_ACK and every later MAC).
    pub membership: u32,
    pub keys: SessionKeys,
    /// The token the membership was made with (whose keys it uses); a
    /// renewal does not change it.
    pub token: [u8; TOKEN_LEN],
    /// Wall-clock ms ([`Now::unix_ms`]) at which the membership ends: its
    /// latest token's expiry (the token is valid while now is earlier).
    pub expires_unix_ms: u64,
    /// The player's sequence numbers seen.
    pub window: ReplayWindow,
    /// The reflector's own sequence number for this membership.
    pub tx_seq: u64,
    /// DATA must carry a valid tag.
    pub tags: bool,
    /// Monotonic milliseconds ([`Now::mono_ms`]) of the last sign of life.
    pub last_seen_ms: u64,
    /// When the first ICMP error about this address arrived since it was
    /// last heard from (monotonic ms).
    pub unreachable_since_ms: Option<u64>,
    /// The last PROBE to the member's address (RTT), if unanswered.
    pub probe: Option<PendingProbe>,
    /// The last PROBE to a new address (rebinding), if unanswered.
    pub rebind: Option<PendingProbe>,
    /// When the last rebinding PROBE went (monotonic ms): one a second.
    pub rebind_sent_ms: Option<u64>,
    /// The highest sequence number that caused a rebinding PROBE: only a
    /// later one may cause another (a captured datagram causes one at most).
    pub rebind_seq: u64,
    /// Someone else wants this member's address: it is being PROBEd.
    pub check: Option<OccupancyCheck>,
    /// Replies this member's own datagrams may cause.
    pub replies: ReplyBudget,
    /// ECHO_REPLYs it may have ([`ECHO_REPLIES_PER_S`]).
    pub echo: ReplyBudget,
    /// Smoothed round-trip time (ms, 1/8 gain), once measured.
    pub rtt_ms: Option<f64>,
    /// When the member was last probed (monotonic ms).
    pub probed_ms: u64,
    /// Its DATA rate cap: packets and bytes.
    pub rate: RateBucket,
}

/// A member's DATA allowance: packet and byte tokens, refilled at the
/// policy's rates up to a second's worth.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RateBucket {
    packets: f64,
    bytes: f64,
    last_ms: u64,
}

impl RateBucket {
    pub(super) fn full(policy: &Policy, now_ms: u64) -> RateBucket {
        RateBucket {
            packets: f64::from(policy.member_pps),
            bytes: policy.member_bytes_per_s as f64,
            last_ms: now_ms,
        }
    }

    /// Takes one datagram of `len` bytes if both caps allow it.
    pub(super) fn take(&mut self, policy: &Policy, len: usize, now_ms: u64) -> bool {
        let dt = now_ms.saturating_sub(self.last_ms) as f64 / 1000.0;
        self.last_ms = now_ms;
        let (pps, bps) = (f64::from(policy.member_pps), policy.member_bytes_per_s as f64);
        self.packets = (self.packets + dt * pps).min(pps);
        self.bytes = (self.bytes + dt * bps).min(bps);
        let pk_ok = policy.member_pps == 0 || self.packets >= 1.0;
        let by_ok = policy.member_bytes_per_s == 0 || self.bytes >= len as f64;
        if !(pk_ok && by_ok) {
            return false;
        }
        self.packets -= 1.0;
        self.bytes -= len as f64;
        true
    }
}

impl Member {
    pub(super) fn next_header(&mut self, kind: Kind, port: u16) -> Header {
        self.tx_seq += 1;
        Header {
            kind,
            group: port,
            sender: self.sender,
            membership: self.membership,
            seq: self.tx_seq,
        }
    }
}

/// A change of membership, for the fan-out backend's destination set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Added(SocketAddr),
    Removed(SocketAddr),
}

/// Members removed by one sweep, by rule.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Expired {
    /// Silent for longer than the member timeout.
    pub silent: usize,
    /// Silent since an ICMP error about them, for two keepalive intervals.
    pub unreachable: usize,
    /// Held an address someone else wanted and answered neither PROBE of
    /// the occupancy check.
    pub occupied: usize,
    /// Their token expired (wall clock) and they had not renewed it.
    pub tokens: usize,
}

impl Expired {
    /// Members removed, all rules together.
    pub fn total(&self) -> usize {
        self.silent + self.unreachable + self.occupied + self.tokens
    }
}
