//! The bots' game state and the checkpoint channel's jobs.
//!
//! Each bot keeps what a game client keeps: the positions of the players in
//! its group, from their DATA (every DATA carries its sender's position and
//! move count). When the reflector asks, the bot uploads that view as the
//! group's checkpoint; when a bot joins a group that has a checkpoint
//! channel, it fetches the checkpoint and checks it against what it then
//! receives: for each player in it, the first DATA from that player must
//! show the same position if the player has not moved since (same move
//! count), a later move count if it has, never an earlier one. TCP
//! exchanges run on helper threads (in the bot's network namespace), never
//! on the data path's loop.

use bytes::Bytes;
use oskit::netns::NetNs;
use reflector_proto::checkpoint::{self as channel, ChannelError, Member};
use reflector_proto::protocol::SessionKeys;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// Exchange timeout (each read and write).
const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest checkpoint a bot accepts.
const MAX_STATE: u64 = 64 << 20;

/// What a checkpoint helper thread does for a bot.
pub(super) struct CkJob {
    pub(super) bot: usize,
    /// The bot's membership (the ledger's id) when the job was made: a
    /// result for an older one is ignored.
    pub(super) mem: u32,
    pub(super) addr: SocketAddr,
    pub(super) group: u16,
    pub(super) player: u32,
    pub(super) membership: u32,
    pub(super) keys: SessionKeys,
    pub(super) op: CkOp,
}

pub(super) enum CkOp {
    /// `tick`: the game step the state is from (the bot's move count).
    Upload {
        nonce: u64,
        tick: u64,
        state: Bytes,
    },
    Fetch,
}

pub(super) struct CkResult {
    pub(super) bot: usize,
    pub(super) mem: u32,
    pub(super) fetch: bool,
    pub(super) took: Duration,
    pub(super) outcome: Result<CkDone, ChannelError>,
}

pub(super) enum CkDone {
    Uploaded,
    Fetched(Option<channel::Fetched>),
}

/// Runs checkpoint jobs until the job channel closes. `namespaces`: the
/// bots' network namespaces (bot i's is `i % len`), empty for this one.
pub(super) fn ck_worker(
    namespaces: Arc<Vec<NetNs>>,
    jobs: Arc<Mutex<mpsc::Receiver<CkJob>>>,
    results: mpsc::Sender<CkResult>,
) {
    loop {
        let job = match jobs.lock() {
            Ok(rx) => match rx.recv() {
                Ok(j) => j,
                Err(_) => return,
            },
            Err(_) => return,
        };
        let t0 = Instant::now();
        let outcome = run_job(&namespaces, &job);
        let r = CkResult {
            bot: job.bot,
            mem: job.mem,
            fetch: matches!(job.op, CkOp::Fetch),
            took: t0.elapsed(),
            outcome,
        };
        if results.send(r).is_err() {
            return;
        }
    }
}

fn run_job(namespaces: &[NetNs], job: &CkJob) -> Result<CkDone, ChannelError> {
    // The socket is made in the bot's namespace; it stays there.
    let stream = match namespaces.get(job.bot % namespaces.len().max(1)) {
        Some(ns) => ns
            .run(|| channel::connect(job.addr, TIMEOUT))
            .map_err(|e| ChannelError::Io {
                addr: job.addr,
                call: "setns",
                message: e.to_string(),
            })?,
        None => channel::connect(job.addr, TIMEOUT),
    }?;
    let who = Member {
        group: job.group,
        player: job.player,
        membership: job.membership,
        keys: &job.keys,
    };
    match &job.op {
        CkOp::Upload { nonce, tick, state } => {
            channel::upload_on(&stream, job.addr, who, *nonce, *tick, state.clone(), TIMEOUT).map(|_| CkDone::Uploaded)
        }
        CkOp::Fetch => channel::fetch_on(&stream, job.addr, who, MAX_STATE, TIMEOUT).map(CkDone::Fetched),
    }
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
    pub fetch_errors: u64,
    pub bytes_fetched: u64,
    /// Fetch time (connect to last byte), milliseconds.
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
        let b = Bytes::from(wire::to_archive(&s).unwrap().to_vec());
        assert_eq!(wire::from_bytes::<GameState>(&b).unwrap(), s);
    }
}
