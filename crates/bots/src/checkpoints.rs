//! The bots' game state and what they do with checkpoints.
//!
//! Each bot keeps what a game client keeps: the positions of the players in
//! its group, from their DATA (every DATA carries its sender's position and
//! move count). When the reflector asks, the bot uploads that view as the
//! group's checkpoint; when a bot joins a group that has a checkpoint
//! channel, it fetches the checkpoint and checks it against what it then
//! receives: for each player in it, the first DATA from that player must
//! show the same position if the player has not moved since (same move
//! count), a later move count if it has, never an earlier one. The
//! exchanges themselves are the client's (the channel, version 2, moved on
//! by its `update` on the bots' loop; their sockets are made in the bot's
//! network namespace).

use serde::{Deserialize, Serialize};

/// One player's entry in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PlayerState {
    pub player: u32,
    pub x: f32,
    pub y: f32,
    /// How many moves the player had made (positions differ only across moves).
    pub moves: u32,
}

/// A group's game state, as a bot uploads it (encoded with `wire`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GameState {
    pub group: u16,
    pub players: Vec<PlayerState>,
}

/// What the bots did with checkpoints, in the report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CheckpointTally {
    /// CHECKPOINT_REQUESTs received (each answered with an upload).
    pub requested: u64,
    pub uploaded: u64,
    pub upload_errors: u64,
    /// Uploads refused because the bot had left that membership since it
    /// was asked (not an error: it moved on).
    pub uploads_overtaken: u64,
    /// Fetches after a join: with a checkpoint, empty (none yet), failed.
    pub fetched: u64,
    pub fetched_empty: u64,
    /// Fetched checkpoints of sealed groups whose uploader's signature and
    /// certificate the client checked (signed by one member, or verified
    /// by two): every fetch in a sealed group, none in a clear one.
    #[serde(default)]
    pub fetched_signed: u64,
    pub fetch_errors: u64,
    /// Fetches refused because the bot had left that membership since it
    /// asked (a re-placement or a move came first: not an error, the new
    /// membership fetches its own).
    #[serde(default)]
    pub fetches_overtaken: u64,
    pub bytes_fetched: u64,
    /// Fetch time (the fetch started, so connect, to the state checked and
    /// handed to the bot), milliseconds.
    pub fetch_ms_mean: f64,
    pub fetch_ms_max: f64,
    /// Checkpoint entries compared with the first DATA then received from
    /// that player: same move count and same position, or moved since.
    pub entries_matched: u64,
    pub entries_moved: u64,
    /// Entries that contradict what the player sent (a different position
    /// at the same move count, or a move count from the future), and
    /// checkpoints that did not decode or named another group.
    pub mismatched: u64,
    /// Entries never compared (the player left before sending again).
    pub entries_unconfirmed: u64,
}

/// A bot's comparison of one checkpoint entry with the player's DATA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Matched,
    Moved,
    Mismatched,
}

/// Compares a checkpoint entry with what the player then sent.
pub(super) fn compare(entry: &PlayerState, x: f32, y: f32, moves: u32) -> Verdict {
    use std::cmp::Ordering::*;
    match moves.cmp(&entry.moves) {
        Equal if x.to_bits() == entry.x.to_bits() && y.to_bits() == entry.y.to_bits() => Verdict::Matched,
        Greater => Verdict::Moved,
        _ => Verdict::Mismatched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_checked_exactly() {
        let e = PlayerState {
            player: 1,
            x: 1.5,
            y: 2.5,
            moves: 3,
        };
        assert_eq!(compare(&e, 1.5, 2.5, 3), Verdict::Matched);
        assert_eq!(compare(&e, 1.5, 2.6, 3), Verdict::Mismatched);
        assert_eq!(compare(&e, 9.0, 9.0, 4), Verdict::Moved);
        assert_eq!(compare(&e, 1.5, 2.5, 2), Verdict::Mismatched);
    }

    #[test]
    fn a_state_round_trips_through_wire() {
        let s = GameState {
            group: 4000,
            players: vec![PlayerState {
                player: 7,
                x: 0.25,
                y: -3.0,
                moves: 2,
            }],
        };
        let b = bytes::Bytes::from(wire::to_archive(&s).unwrap().to_vec());
        assert_eq!(wire::from_bytes::<GameState>(&b).unwrap(), s);
    }
}
