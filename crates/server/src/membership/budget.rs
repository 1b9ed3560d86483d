//! Reply budgets: token buckets of replies, per member, per verified player
//! and one global for replies nobody can verify.

use super::types::{reply_kind, Outcome, Payer};

/// A token bucket of replies: `per_s` a second, with a burst of as many.
/// The caller keeps one for replies nobody can verify ([`Payer::Unverified`]);
/// each member has one, and each verified player that is not a member one
/// per group.
#[derive(Debug, Clone, Copy)]
pub struct ReplyBudget {
    pub(super) tokens: u64,
    last_ms: u64,
}

impl ReplyBudget {
    /// A full budget at `now_ms`.
    pub fn full(per_s: u32, now_ms: u64) -> ReplyBudget {
        ReplyBudget {
            tokens: u64::from(per_s),
            last_ms: now_ms,
        }
    }

    pub(super) fn refill(&mut self, per_s: u32, now_ms: u64) {
        let per_s = u64::from(per_s);
        if per_s == 0 {
            self.tokens = 0;
            self.last_ms = now_ms;
            return;
        }
        let add = now_ms.saturating_sub(self.last_ms).saturating_mul(per_s) / 1000;
        if add > 0 {
            self.tokens = self.tokens.saturating_add(add).min(per_s);
            // Whole tokens only; the remainder of the time counts next time.
            self.last_ms = if self.tokens == per_s {
                now_ms
            } else {
                self.last_ms + add * 1000 / per_s
            };
        }
    }

    /// Takes `n` tokens if there are as many.
    pub fn take_n(&mut self, n: u64, per_s: u32, now_ms: u64) -> bool {
        self.refill(per_s, now_ms);
        if self.tokens < n {
            return false;
        }
        self.tokens -= n;
        true
    }

    pub fn take(&mut self, per_s: u32, now_ms: u64) -> bool {
        self.take_n(1, per_s, now_ms)
    }

    /// Whether the budget is back to full (it can be forgotten).
    pub(super) fn is_full(&mut self, per_s: u32, now_ms: u64) -> bool {
        self.refill(per_s, now_ms);
        self.tokens >= u64::from(per_s)
    }

    /// Pays for `o`'s reply if nobody could be verified for it: withholds
    /// the reply once this budget is spent. Other replies were paid already.
    pub fn admit(&mut self, per_s: u32, now_ms: u64, o: &mut Outcome) {
        if o.payer != Payer::Unverified {
            return;
        }
        if let Some(r) = o.reply {
            if !self.take(per_s, now_ms) {
                o.reply = None;
                o.suppressed = Some(reply_kind(&r));
            }
        }
    }
}
