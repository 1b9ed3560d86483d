//! Per-player move windows: from the moment a player's group is lost or
//! asked to move (a MOVED received, or the client's decision that the
//! reflector went silent or forgot it), or the player's own move to a cell
//! of another group, to the first DATA delivered through the group it is
//! in after that, with the cause. The fleet lab compares
//! them with its events and splits the owed loss by them.
//!
//! The end is the first DATA delivered through the player's new
//! membership, either way: one it receives from a group mate on the same
//! reflector and group, or one it sent that a group mate received. A
//! player alone in its new group has nothing delivered: its window ends at
//! the JOIN_ACK of the new membership instead (`end_by: joined`), if no
//! delivery came before the run ended.
//!
//! Times are CLOCK_REALTIME ns: under the lab's virtual time (the vtime
//! shim) that clock is the lab's virtual one, which its orchestrator reads
//! from the same clock domain to stamp its events.

use super::MemId;
use serde::{Deserialize, Serialize};

/// Why a move window opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowCause {
    /// The reflector sent MOVED (draining, or the cell re-placed).
    Moved,
    /// The reflector went silent for the client's silence rule.
    Silent,
    /// The reflector said this player is no member (ERROR(NotMember)).
    NotMember,
    /// The player crossed into a cell of another group (its own move,
    /// make-before-break): the grant handed to its client.
    Cell,
}

/// How a move window ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WindowEnd {
    /// A group mate's DATA received through the new membership.
    Received,
    /// The player's own DATA through the new membership, received by a
    /// group mate.
    Delivered,
    /// Nothing was delivered before the run ended: the new membership's
    /// JOIN_ACK (a player alone in its group).
    Joined,
}

/// An owed DATA that did not arrive (see [`crate::Ledger::lost_sends`]),
/// by player.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostDatagram {
    pub sender: u32,
    pub receiver: u32,
    /// CLOCK_REALTIME ns of its send (0: not known).
    pub sent_ns: u64,
}

/// One player's move window, as the bots report it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveWindow {
    pub player: u32,
    pub cause: WindowCause,
    /// CLOCK_REALTIME ns (the lab's virtual clock under its shim).
    pub start_ns: u64,
    /// None: the player never had a datagram delivered again, nor joined.
    pub end_ns: Option<u64>,
    pub end_by: Option<WindowEnd>,
    /// The reflector (address:group port) it was on, and the one it ended on.
    pub from: Option<String>,
    pub to: Option<String>,
}

#[derive(Debug)]
struct Open {
    cause: WindowCause,
    start_ns: u64,
    /// The membership the player sent through when it opened.
    from: Option<MemId>,
    from_group: Option<std::net::SocketAddr>,
    /// The new membership's JOIN_ACK, once it has one.
    joined: Option<(u64, MemId)>,
}

/// Every bot's windows: the open one and those closed.
#[derive(Debug, Default)]
pub struct Windows {
    open: Vec<Option<Open>>,
    /// The ledger membership each bot sends through now, and its group.
    sending: Vec<Option<MemId>>,
    sending_group: Vec<Option<std::net::SocketAddr>>,
    done: Vec<MoveWindow>,
    players: Vec<u32>,
}

/// At most this many windows are kept (a run that churns without end
/// should not grow the report without bound); `dropped` counts the rest.
pub const MAX_WINDOWS: usize = 100_000;

impl Windows {
    pub fn new(players: Vec<u32>) -> Windows {
        Windows {
            open: (0..players.len()).map(|_| None).collect(),
            sending: vec![None; players.len()],
            sending_group: vec![None; players.len()],
            done: Vec::new(),
            players,
        }
    }

    /// Opens bot `bot`'s window (one already open goes on: its first cause
    /// stands). It starts from the membership the bot sent through until
    /// now (the client may have replaced it already: a rejoin).
    pub fn open(&mut self, bot: usize, cause: WindowCause, now_ns: u64) {
        let Some(slot) = self.open.get_mut(bot) else { return };
        if slot.is_none() {
            *slot = Some(Open {
                cause,
                start_ns: now_ns,
                from: self.sending[bot],
                from_group: self.sending_group[bot],
                joined: None,
            });
        }
    }

    /// Bot `bot` sends through `mem` (in `group`) now (`active`: it has
    /// its JOIN_ACK).
    pub fn sending(
        &mut self,
        bot: usize,
        mem: Option<MemId>,
        group: Option<std::net::SocketAddr>,
        active: bool,
        now_ns: u64,
    ) {
        let Some(s) = self.sending.get_mut(bot) else { return };
        *s = mem;
        self.sending_group[bot] = group;
        if let (Some(Some(o)), Some(m)) = (self.open.get_mut(bot), mem) {
            if active && o.from != Some(m) && o.joined.is_none() {
                o.joined = Some((now_ns, m));
            }
        }
    }

    /// DATA of sender membership `tx` (of bot `sender`, group `group`)
    /// received by bot `receiver`, whose own membership is in that group.
    pub fn delivered(&mut self, receiver: usize, sender: usize, tx: MemId, now_ns: u64, group: std::net::SocketAddr) {
        // The receiver: its new membership is in this group.
        if let Some(Some(o)) = self.open.get(receiver) {
            if let Some(rx) = self.sending.get(receiver).copied().flatten() {
                // (A group being left still delivers until its LEAVE.)
                let same_group = self.sending_group[receiver] == Some(group);
                if same_group && o.from != Some(rx) && o.joined.is_some_and(|(_, m)| m == rx) {
                    self.close(receiver, now_ns, WindowEnd::Received, Some(group));
                }
            }
        }
        // The sender: this is its new membership's DATA.
        if let Some(Some(o)) = self.open.get(sender) {
            if o.from != Some(tx) && self.sending.get(sender).copied().flatten() == Some(tx) {
                self.close(sender, now_ns, WindowEnd::Delivered, Some(group));
            }
        }
    }

    fn close(&mut self, bot: usize, end_ns: u64, by: WindowEnd, to: Option<std::net::SocketAddr>) {
        let Some(o) = self.open.get_mut(bot).and_then(Option::take) else {
            return;
        };
        if self.done.len() < MAX_WINDOWS {
            self.done.push(MoveWindow {
                player: self.players[bot],
                cause: o.cause,
                start_ns: o.start_ns,
                end_ns: Some(end_ns),
                end_by: Some(by),
                from: o.from_group.map(|g| g.to_string()),
                to: to.map(|g| g.to_string()),
            });
        }
    }

    /// The run is over: windows still open end at their JOIN_ACK if they
    /// had one, else stay open (`end_ns: None`). `group_of` names a
    /// membership's group.
    pub fn finish(mut self, group_of: impl Fn(MemId) -> Option<std::net::SocketAddr>) -> Vec<MoveWindow> {
        for bot in 0..self.open.len() {
            let Some(o) = self.open[bot].take() else { continue };
            if self.done.len() >= MAX_WINDOWS {
                break;
            }
            self.done.push(MoveWindow {
                player: self.players[bot],
                cause: o.cause,
                start_ns: o.start_ns,
                end_ns: o.joined.map(|(t, _)| t),
                end_by: o.joined.map(|_| WindowEnd::Joined),
                from: o.from_group.map(|g| g.to_string()),
                to: o.joined.and_then(|(_, m)| group_of(m)).map(|g| g.to_string()),
            });
        }
        self.done.sort_by_key(|w| (w.start_ns, w.player));
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn g(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], port))
    }

    #[test]
    fn a_window_runs_from_its_cause_to_the_first_delivery_through_the_new_membership() {
        let mut w = Windows::new(vec![70, 71, 72]);
        // Bots 0 and 1 in group A (memberships 0, 1); bot 2 in group B (2).
        w.sending(0, Some(0), Some(g(4000)), true, 10);
        w.sending(1, Some(1), Some(g(4000)), true, 10);
        w.sending(2, Some(2), Some(g(4001)), true, 10);
        w.open(0, WindowCause::Silent, 100);
        w.open(0, WindowCause::Moved, 150);
        // DATA through the old membership ends nothing.
        w.delivered(1, 0, 0, 160, g(4000));
        // Bot 0 joins group B (membership 3): a group mate's DATA ends it.
        w.sending(0, Some(3), Some(g(4001)), false, 170);
        w.delivered(0, 2, 2, 175, g(4001));
        w.sending(0, Some(3), Some(g(4001)), true, 180);
        // DATA of the group being left ends nothing.
        w.delivered(0, 1, 1, 185, g(4000));
        w.delivered(0, 2, 2, 190, g(4001));
        // Bot 2's window ends when a mate receives its new membership's DATA.
        w.open(2, WindowCause::Moved, 200);
        w.sending(2, Some(4), Some(g(4001)), true, 210);
        w.delivered(0, 2, 2, 215, g(4001));
        w.delivered(0, 2, 4, 220, g(4001));
        // Bot 1 alone after its move: ends at its JOIN_ACK.
        w.open(1, WindowCause::NotMember, 300);
        w.sending(1, Some(5), Some(g(4002)), true, 320);
        let got = w.finish(|m| (m == 5).then(|| g(4002)));
        let brief: Vec<_> = got
            .iter()
            .map(|x| (x.player, x.cause, x.start_ns, x.end_ns, x.end_by))
            .collect();
        assert_eq!(
            brief,
            [
                (70, WindowCause::Silent, 100, Some(190), Some(WindowEnd::Received)),
                (72, WindowCause::Moved, 200, Some(220), Some(WindowEnd::Delivered)),
                (71, WindowCause::NotMember, 300, Some(320), Some(WindowEnd::Joined)),
            ]
        );
        assert_eq!(got[0].from.as_deref(), Some("10.0.0.1:4000"));
        assert_eq!(got[2].to.as_deref(), Some("10.0.0.1:4002"));
    }
}
