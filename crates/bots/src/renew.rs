//! Renewal: a member asks the control server for a fresh token at its
//! session's renewal moment (the same grant request a join makes) and
//! renews its membership with it (`docs/protocol.md`, "Membership lifetime
//! and renewal"), so no bot loses its membership to its token's expiry.
//! The session sends the renewal JOIN and resends it until its JOIN_ACK;
//! nothing else changes, so DATA flows on throughout.

use super::player::{Bot, Ctx, Edge, State};
use super::GRANT_RETRY;
use reflector_proto::client::{JoinRequest, Session};
use std::time::{Duration, Instant};

impl<E: Edge> Ctx<'_, E> {
    fn wall_ms(&self) -> u64 {
        self.edge.wall_ns() / 1_000_000
    }

    /// A member's renewal timers: a renewal JOIN unanswered for the retry
    /// interval goes again, and at the renewal moment a grant is asked for
    /// (again after [`GRANT_RETRY`] if that fails). Returns when the bot
    /// next needs attention for them.
    pub(super) fn renew_tick(
        &mut self,
        idx: usize,
        bot: &mut Bot,
        session: &mut Session,
        now: Instant,
    ) -> Option<Instant> {
        let mut next = None;
        if let Some(due) = session.poll_timeout() {
            if now >= due {
                session.handle_timeout(now);
                if let Some(tx) = session.poll_transmit() {
                    self.send_small(bot, &tx);
                }
            }
            next = session.poll_timeout();
        }
        if let Some(at_ms) = session.renew_at() {
            let wall_ms = self.wall_ms();
            let due = now + Duration::from_millis(at_ms.saturating_sub(wall_ms));
            let due = bot.renew_ask_at.map_or(due, |t| t.max(due));
            if now >= due && !bot.http_busy {
                self.ask_grant(idx, bot);
                bot.renew_ask_at = Some(now + GRANT_RETRY);
            } else {
                next = Some(next.map_or(due, |n: Instant| n.min(due)));
            }
        }
        next
    }

    /// A grant for the group the bot is a member of: once the renewal
    /// moment has come, the membership is renewed with its token (a grant
    /// asked for a move within the group is not needed before then).
    pub(super) fn renew_with(&mut self, bot: &mut Bot, target: &JoinRequest, now: Instant) {
        let wall_ms = self.wall_ms();
        let State::InGroup { session, .. } = &mut bot.state else {
            return;
        };
        if session.renew_at().is_none_or(|at| wall_ms < at) {
            return;
        }
        if session.renew(target.token, target.keys, wall_ms, now) {
            self.flush(bot);
        }
    }

    /// A new session's token was received now (a rejoin's earlier: it then
    /// renews early, never late).
    pub(super) fn token_received(&mut self, bot: &mut Bot) {
        let wall_ms = self.wall_ms();
        if let State::InGroup { session, .. } = &mut bot.state {
            session.set_token_received(wall_ms);
        }
    }
}
