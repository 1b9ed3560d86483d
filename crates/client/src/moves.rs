//! Tokens, areas and moves: what the client does with a token or an area's
//! tokens from the control server (renew the memberships it has, join the
//! groups it lacks, leave the others once the new ones are members), and
//! when it asks for new ones.

use crate::*;

impl<D: Driver> Client<D> {
    /// A new token (one group, radius 0): renews the membership of the
    /// same group, else joins (leaving the old group first).
    pub(crate) fn take_token(&mut self, t: Token, now: Instant) -> Result<(), Error> {
        let received = reflector_proto::unix_now_ms();
        let local = self.sock.local_addr().map_err(|e| Error::socket("getsockname", e))?;
        let reflector = resolve(&t.reflector, local)?;
        self.token_needed_said = false;
        let key = (reflector, t.group);
        let req = join_request(reflector, &t, self.next_seq);
        let keys = req.keys;
        self.held = Some(Held {
            received_unix_ms: received,
        });
        self.sealing.add(key, &t.keys, true);
        let cell = self.cell.and_then(|k| self.find(k));
        match cell {
            Some(i) if self.cell == Some(key) && self.memberships[i].session.is_member() => {
                let m = &mut self.memberships[i];
                m.session.advance_seq(self.next_seq);
                if m.session.renew(req.token, keys, received, now) {
                    self.flush(i);
                }
            }
            Some(_) if self.cell != Some(key) => {
                self.leave_quietly();
                self.stats.rejoins += 1;
                self.events.push_back(Event::Rejoining {
                    group: t.group,
                    reason: RejoinReason::NewGroup,
                });
                self.cell = Some(key);
                self.start(None, req, reflector, true, now);
            }
            _ => {
                let rejoin = self.stats.joins > 0;
                self.cell = Some(key);
                self.start(cell, req, reflector, rejoin, now);
            }
        }
        self.renewal_settled(now);
        Ok(())
    }

    /// The tokens of an area: renews the groups held that are in it, joins
    /// the others, and marks the groups out of it to be left once the new
    /// ones are members ([`Client::settle_move`]).
    pub(crate) fn take_area(&mut self, area: AreaTokens, now: Instant) -> Result<(), Error> {
        let received = reflector_proto::unix_now_ms();
        let local = self.sock.local_addr().map_err(|e| Error::socket("getsockname", e))?;
        // Every name resolved first: one that does not resolve changes
        // nothing.
        let mut grants = Vec::with_capacity(1 + area.area.len());
        for t in std::iter::once(&area.cell).chain(&area.area) {
            grants.push((resolve(&t.reflector, local)?, t));
        }
        self.token_needed_said = false;
        self.moving = false;
        self.held = Some(Held {
            received_unix_ms: received,
        });
        for m in self.memberships.iter_mut() {
            m.wanted = false;
        }
        for &(reflector, t) in &grants {
            self.sealing.add((reflector, t.group), &t.keys, true);
            let req = join_request(reflector, t, self.next_seq);
            let keys = req.keys;
            match self.find((reflector, t.group)) {
                Some(i) => {
                    let m = &mut self.memberships[i];
                    m.wanted = true;
                    match m.session.phase() {
                        session::Phase::Member => {
                            m.session.advance_seq(self.next_seq);
                            if m.session.renew(t.token, keys, received, now) {
                                self.flush(i);
                            }
                        }
                        // Ended on its token (expired, refused): the new one.
                        session::Phase::Done => {
                            self.stats.rejoins += 1;
                            self.start(Some(i), req, reflector, true, now);
                        }
                        // Joining: it goes on with the token it holds, and
                        // asks again if that one is refused.
                        session::Phase::Challenging | session::Phase::Echoing => {}
                    }
                }
                None => self.start(None, req, reflector, false, now),
            }
        }
        self.cell = Some((grants[0].0, grants[0].1.group));
        if self.memberships.iter().any(|m| m.live() && !m.wanted) {
            self.break_by = Some(now + MOVE_BREAK_AFTER);
        }
        self.settle_move(now);
        self.renewal_settled(now);
        Ok(())
    }

    /// At membership `i`'s renewal moment, asks for new tokens (one
    /// request renews every group), unless a renewal that brought no
    /// later expiry is still backing off ([`Client::renewal_settled`]).
    pub(crate) fn renew_if_due(&mut self, i: usize, now: Instant) {
        if self.renew_not_before.is_some_and(|t| now < t) {
            return;
        }
        let at = self.memberships[i].session.renew_at();
        if at.is_some_and(|at| reflector_proto::unix_now_ms() >= at) {
            self.need_token(now);
        }
    }

    /// After a grant: a member it was for that is still past its renewal
    /// moment got no token expiring later than the one it holds (the
    /// control server answered within the second of its last grant, or
    /// will not go past an expiry of its own). Asked again at once, it
    /// would give the same answer on every update until the second rolls
    /// over, or for good: the next renewal request waits
    /// [`token::renewal_backoff`] (the game's [`Event::TokenNeeded`] too).
    fn renewal_settled(&mut self, now: Instant) {
        let now_ms = reflector_proto::unix_now_ms();
        let unrenewed = self
            .memberships
            .iter()
            .filter(|m| m.live() && m.wanted)
            .filter(|m| m.session.renew_at().is_some_and(|at| now_ms >= at))
            .map(|m| m.session.expires_unix_s())
            .min();
        self.renew_not_before = unrenewed.map(|expires| now + token::renewal_backoff(expires, now_ms));
    }

    /// Carries a move on: [`Client::send`] follows the cell once it is a
    /// member, and the groups out of the area are left once every group of
    /// the area is a member (or at [`MOVE_BREAK_AFTER`]), not before.
    pub(crate) fn settle_move(&mut self, now: Instant) {
        if let Some(cell) = self.cell {
            let cell_member = self.find(cell).is_some_and(|i| self.memberships[i].session.is_member());
            if cell_member && self.sending != Some(cell) {
                if let Some((_, from)) = self.sending.replace(cell) {
                    self.events.push_back(Event::Moved { from, to: cell.1 });
                }
            }
        }
        let stale = |m: &Membership| m.live() && !m.wanted;
        if !self.memberships.iter().any(stale) {
            self.break_by = None;
        } else {
            let made = self
                .memberships
                .iter()
                .filter(|m| m.live() && m.wanted)
                .all(|m| m.session.is_member());
            if made || self.break_by.is_some_and(|t| now >= t) {
                for i in 0..self.memberships.len() {
                    let m = &mut self.memberships[i];
                    if !stale(m) {
                        continue;
                    }
                    m.session.advance_seq(self.next_seq);
                    if let Some(t) = m.session.leave() {
                        let _ = self.sock.send_to(t.datagram.as_bytes(), t.to);
                    }
                    self.next_seq = self.next_seq.max(m.session.next_seq());
                    m.left_at = Some(now);
                    self.events.push_back(Event::LeftGroup {
                        group: m.session.request().group,
                    });
                    self.log_membership(i, MembershipChange::Left);
                }
                if self.ck_nonce.is_some_and(|(k, _)| self.find(k).is_none()) {
                    self.ck_nonce = None;
                }
                self.break_by = None;
            }
        }
        // Without allocating: the few left ones drop out once their
        // linger is over.
        self.memberships.retain(|m| {
            m.left_at
                .is_none_or(|t| now.saturating_duration_since(t) < LEAVE_LINGER)
        });
    }

    /// The reflector of membership `i` is ending it (MOVED, MAC-checked by
    /// the session): a new placement for the same position, followed like
    /// a move (make-before-break); while the answers keep the cell where it
    /// was, followed less and less often ([`MOVE_FOLLOW_MAX`]).
    pub(crate) fn move_asked(&mut self, i: usize, m: reflector_proto::protocol::Moved, now: Instant) {
        let ms = &mut self.memberships[i];
        ms.last_heard = now;
        let group = ms.session.request().group;
        // Its cells may be served elsewhere now: their keys asked again.
        self.sealing.moved(ms.key());
        self.stats.moves_asked += 1;
        self.events.push_back(Event::MoveAsked {
            group,
            reason: m.reason.map_or_else(|raw| raw, |r| r as u16),
            within_ms: m.within_ms,
        });
        if let Some((at, cell)) = self.move_followed {
            if now.saturating_duration_since(at) < self.move_follow_wait {
                return;
            }
            // The last answer kept the cell where it was: wait longer.
            self.move_follow_wait = if cell == self.cell {
                (self.move_follow_wait * 2).min(MOVE_FOLLOW_MAX)
            } else {
                Duration::from_secs(1)
            };
        }
        self.move_followed = Some((now, self.cell));
        match &self.cfg.token {
            TokenSource::Control(_) => {
                self.move_pending = true;
                self.request_token(now);
            }
            TokenSource::Given(_) | TokenSource::Later => {
                self.token_needed_said = false;
                self.need_token(now);
            }
        }
    }

    pub(crate) fn leave_quietly(&mut self) {
        for i in 0..self.memberships.len() {
            let m = &mut self.memberships[i];
            if !m.live() {
                continue;
            }
            m.session.advance_seq(self.next_seq);
            if let Some(t) = m.session.leave() {
                let _ = self.sock.send_to(t.datagram.as_bytes(), t.to);
            }
            self.next_seq = self.next_seq.max(m.session.next_seq());
            self.log_membership(i, MembershipChange::Left);
        }
        self.memberships.clear();
        self.sending = None;
        self.break_by = None;
    }

    /// A group whose reflector went silent did not answer its rejoin (see
    /// [`REPLACE_INTERVALS`](crate::REPLACE_INTERVALS)): where the cell is
    /// now, asked like a MOVED asks (a new placement for the same
    /// position, followed as a move, make-before-break).
    pub(crate) fn replace_silent(&mut self, now: Instant) {
        // Told as the token request it makes: `TokenRequested`, or
        // `TokenNeeded` for a game that hands tokens in.
        self.stats.replacements += 1;
        match &self.cfg.token {
            TokenSource::Control(_) => {
                self.move_pending = true;
                self.request_token(now);
            }
            TokenSource::Given(_) | TokenSource::Later => {
                self.token_needed_said = false;
                self.need_token(now);
            }
        }
    }

    pub(crate) fn need_token(&mut self, now: Instant) {
        match &self.cfg.token {
            TokenSource::Control(_) => self.request_token(now),
            TokenSource::Given(_) | TokenSource::Later => {
                if !self.token_needed_said {
                    self.token_needed_said = true;
                    self.events.push_back(Event::TokenNeeded);
                }
            }
        }
    }

    pub(crate) fn request_token(&mut self, now: Instant) {
        let TokenSource::Control(c) = &self.cfg.token else {
            return;
        };
        if self.fetching.is_some() || self.fetch_not_before.is_some_and(|t| now < t) {
            return;
        }
        let c = c.clone();
        let radius = self.cfg.area_radius;
        // The cell's newest token, while it is good: proof that this is a
        // player being re-placed or renewed, not a stranger.
        let held = self
            .cell
            .and_then(|k| self.find(k))
            .filter(|&i| self.memberships[i].session.is_member())
            .map(|i| self.memberships[i].session.rejoin_request().token);
        // Every /join says our checkpoint signing key (renewals and
        // re-placements too): each grant then certifies it.
        let sign = self.sealing.checkpoints.sign_request();
        let (tx, rx) = mpsc::channel();
        let signal = crate::wake::SignalOnDrop(std::sync::Arc::clone(&self.wake));
        std::thread::spawn(move || {
            // Dropped last, after the answer is sent (or on a panic).
            let _signal = signal;
            let _ = tx.send(token::fetch_area_holding(&c, radius, held, Some(&sign)));
        });
        self.fetching = Some(rx);
        // This request carries the position the game gave last.
        if self.move_pending {
            self.move_pending = false;
            self.moving = true;
        }
        self.stats.token_requests += 1;
        self.events.push_back(Event::TokenRequested);
    }
}

/// The JOIN a grant opens: its token and session key, sequence numbers
/// going on from the client-wide counter.
fn join_request(reflector: SocketAddr, t: &Token, first_seq: u64) -> JoinRequest {
    JoinRequest {
        reflector,
        group: t.group,
        player: t.player,
        token: t.token,
        keys: SessionKeys::from_session(t.session_key),
        first_seq,
    }
}
