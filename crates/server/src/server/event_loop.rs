//! One event loop: its groups' sockets, the membership core of each and
//! the backend that fans out for them; a fan-out that has to wait parks its
//! group while the loop serves the others.

use super::secret::SharedSecret;
use super::Drain;
use super::ServeError;
use crate::backend::{Fanout, Progress, Wake};
use crate::checkpoint::Board;
use crate::membership::Group;
use crate::membership::{Change, DropReason, Event, Keys, Now, Policy, ReplyBudget};
use crate::metrics::{GroupCounters, ReceivePoolCounters};
use crate::receive::{Ready, Receive, ReceiveKind, Received, RecvBuf};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use oskit::clock::mono_now_ms;
use reflector_proto::protocol::{strip_tag, version1_error, Kind, MovedReason, ParseError};
use sendpath::errqueue::{ErrEntry, ErrKind};
use sendpath::SendOne;
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::net::UdpSocket;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One group handed to a loop: its socket, membership and counters.
pub(super) struct NewSlot {
    pub(super) sock: UdpSocket,
    pub(super) group: Group,
    pub(super) counters: Arc<GroupCounters>,
}

/// One group of a running loop.
struct Slot {
    sock: UdpSocket,
    group: Group,
    counters: Arc<GroupCounters>,
    /// Set while a fan-out of this group waits; its socket is not read then.
    waiting: Option<Wake>,
    /// Datagrams received after the one whose fan-out is waiting, in order
    /// (their receive buffers, owned: no copy). Empty unless a wait
    /// happened in the middle of a batch (or, with a completion-driven
    /// receive, datagrams arrived before the receive paused).
    backlog: VecDeque<(SocketAddr, RecvBuf)>,
}

/// Batches one socket (or the receive's ring) may deliver before the loop
/// serves the others.
const RECV_BATCHES: usize = 4;
/// Expiry sweep interval.
const SWEEP_EVERY: Duration = Duration::from_millis(500);
/// The epoll token of the loop's back-off timer.
const TIMER_TOKEN: u64 = u64::MAX;
/// The epoll token of the receive's ring, if it has one.
const RING_TOKEN: u64 = u64::MAX - 1;

/// One event loop: its groups, the backend that fans out for them, and the
/// timer that wakes fan-outs waiting out a full device queue.
struct Loop<'a> {
    slots: Vec<Slot>,
    keys: Keys,
    /// Where a new token secret comes from, and the last one taken.
    secret: Arc<SharedSecret>,
    secret_seen: u64,
    drain: Arc<Drain>,
    policy: &'a Policy,
    fanout: Box<dyn Fanout>,
    receive: Box<dyn Receive>,
    /// Where the receive pool's stats are published for `/metrics`.
    pool_counters: Arc<ReceivePoolCounters>,
    /// What the loop waits for on a socket whose group is not waiting:
    /// datagrams, unless the receive has its own ring.
    idle_flags: EpollFlags,
    /// One batch of received datagrams (reused).
    rx: Vec<Received>,
    epoll: Epoll,
    timer: TimerFd,
    /// The checkpoint board, if checkpoints are on.
    board: Option<Arc<Board>>,
    /// Replies nobody can verify, for all this loop's groups
    /// ([`Policy::replies_per_s`]).
    unverified: ReplyBudget,
}

fn loop_err(e: impl Into<io::Error>) -> ServeError {
    ServeError::Loop(e.into())
}

// The loop's parts, each from a different owner (config, backend, metrics,
// checkpoints): a struct for them would only be built to be taken apart here.
#[allow(clippy::too_many_arguments)]
pub(super) fn event_loop(
    slots: Vec<NewSlot>,
    keys: Keys,
    secret: Arc<SharedSecret>,
    drain: Arc<Drain>,
    policy: &Policy,
    backend: crate::backend::Backend,
    receive: ReceiveKind,
    pool_counters: Arc<ReceivePoolCounters>,
    board: Option<Arc<Board>>,
    stop: &AtomicBool,
) -> Result<(), ServeError> {
    // Built here: they hold this loop's receive buffers, which stay on its
    // thread.
    let slots: Vec<Slot> = slots
        .into_iter()
        .map(|s| Slot {
            sock: s.sock,
            group: s.group,
            counters: s.counters,
            waiting: None,
            backlog: VecDeque::new(),
        })
        .collect();
    let mut fanout = backend.for_loop();
    let mut receive = receive.build().map_err(loop_err)?;
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(loop_err)?;
    let timer = TimerFd::new(
        ClockId::CLOCK_MONOTONIC,
        TimerFlags::TFD_CLOEXEC | TimerFlags::TFD_NONBLOCK,
    )
    .map_err(loop_err)?;
    epoll
        .add(timer.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TIMER_TOKEN))
        .map_err(loop_err)?;
    let idle_flags = match receive.ring_fd() {
        Some(ring) => {
            epoll
                .add(ring, EpollEvent::new(EpollFlags::EPOLLIN, RING_TOKEN))
                .map_err(loop_err)?;
            // Errors (EPOLLERR) are reported whatever is asked.
            EpollFlags::empty()
        }
        None => EpollFlags::EPOLLIN,
    };
    for (i, s) in slots.iter().enumerate() {
        epoll
            .add(s.sock.as_fd(), EpollEvent::new(idle_flags, i as u64))
            .map_err(loop_err)?;
        receive.attach(i, s.sock.as_fd()).map_err(ServeError::Loop)?;
        fanout
            .attach(i, s.sock.as_fd(), s.group.port(), s.group.tags_on(policy))
            .map_err(ServeError::Loop)?;
    }
    let mut lp = Loop {
        slots,
        keys,
        secret,
        secret_seen: 0,
        drain,
        policy,
        fanout,
        rx: Vec::with_capacity(receive.batch()),
        receive,
        pool_counters,
        idle_flags,
        epoll,
        timer,
        board,
        unverified: ReplyBudget::full(policy.replies_per_s, mono_now_ms()),
    };
    lp.publish_pool();
    lp.run(stop)
}

impl Loop<'_> {
    fn run(&mut self, stop: &AtomicBool) -> Result<(), ServeError> {
        let mut events = vec![EpollEvent::empty(); (self.slots.len() + 1).clamp(2, 256)];
        let mut next_sweep = Instant::now() + SWEEP_EVERY;
        while !stop.load(Relaxed) {
            let n = match self.epoll.wait(&mut events, EpollTimeout::from(100u16)) {
                Ok(n) => n,
                Err(nix::errno::Errno::EINTR) => 0,
                Err(e) => return Err(loop_err(e)),
            };
            if let Some(ring) = self.secret.newer(&mut self.secret_seen) {
                self.keys.token_secret = ring;
            }
            for ev in &events[..n] {
                if ev.data() == TIMER_TOKEN {
                    // Reading resets the timer's readiness; waiting fan-outs
                    // due now are resumed below.
                    let _ = self.timer.wait();
                    continue;
                }
                if ev.data() == RING_TOKEN {
                    self.serve_ring()?;
                    continue;
                }
                let i = ev.data() as usize;
                if i >= self.slots.len() {
                    continue;
                }
                let flags = ev.events();
                if flags.contains(EpollFlags::EPOLLERR) {
                    self.read_error_queue(i);
                }
                if self.slots[i].waiting == Some(Wake::Writable)
                    && flags.intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR)
                {
                    self.resume(i)?;
                }
                if self.slots[i].waiting.is_none() && flags.contains(EpollFlags::EPOLLIN) {
                    self.serve_socket(i)?;
                }
            }
            self.resume_due()?;
            self.receive.flush().map_err(loop_err)?;
            if Instant::now() >= next_sweep {
                self.sweep();
                next_sweep = Instant::now() + SWEEP_EVERY;
            }
        }
        // Shutdown: one last try for fan-outs still waiting, then they are
        // given up and counted.
        for i in 0..self.slots.len() {
            if self.slots[i].waiting.is_some() {
                let c = Arc::clone(&self.slots[i].counters);
                if self.fanout.resume(i, self.slots[i].sock.as_fd(), &c) != Progress::Done {
                    self.fanout.abandon(i, &c);
                }
            }
        }
        // The backend's last counters (the kernel path's), so the summary
        // counts everything that went out.
        for (i, s) in self.slots.iter().enumerate() {
            self.fanout.sync(i, &s.counters, &mut |_| {});
        }
        self.publish_pool();
        Ok(())
    }

    /// The receive pool's stats for `/metrics`.
    fn publish_pool(&self) {
        self.pool_counters.publish(self.receive.pool().stats());
    }

    /// Resumes the fan-outs whose back-off time has come, and re-arms the
    /// timer for the next one.
    fn resume_due(&mut self) -> Result<(), ServeError> {
        let now = Instant::now();
        for i in 0..self.slots.len() {
            if matches!(self.slots[i].waiting, Some(Wake::At(t)) if t <= now) {
                self.resume(i)?;
            }
        }
        let next = self
            .slots
            .iter()
            .filter_map(|s| match s.waiting {
                Some(Wake::At(t)) => Some(t),
                _ => None,
            })
            .min();
        let r = match next {
            Some(t) => {
                // A zero expiry would disarm the timer: at least 1 ns.
                let d = t.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
                self.timer.set(
                    Expiration::OneShot(TimeSpec::from_duration(d)),
                    TimerSetTimeFlags::empty(),
                )
            }
            None => self.timer.unset(),
        };
        r.map_err(loop_err)
    }

    /// Sets what the loop waits for on slot `i`'s socket: datagrams when it
    /// is ready, writability when its fan-out waits for the socket buffer,
    /// nothing (errors only) when it waits on the timer.
    fn set_waiting(&mut self, i: usize, waiting: Option<Wake>) -> Result<(), ServeError> {
        if self.slots[i].waiting == waiting {
            return Ok(());
        }
        match waiting {
            None => self.receive.unpause(i),
            Some(_) => self.receive.pause(i),
        }
        let flags = match waiting {
            None => self.idle_flags,
            Some(Wake::Writable) => EpollFlags::EPOLLOUT,
            Some(Wake::At(_)) => EpollFlags::empty(),
        };
        let s = &mut self.slots[i];
        s.waiting = waiting;
        let mut ev = EpollEvent::new(flags, i as u64);
        self.epoll.modify(s.sock.as_fd(), &mut ev).map_err(loop_err)
    }

    /// Continues slot `i`'s waiting fan-out; once it is done, the datagrams
    /// that queued behind it are handled, in order.
    fn resume(&mut self, i: usize) -> Result<(), ServeError> {
        let c = Arc::clone(&self.slots[i].counters);
        match self.fanout.resume(i, self.slots[i].sock.as_fd(), &c) {
            Progress::Pending(w) => return self.set_waiting(i, Some(w)),
            Progress::Done => self.set_waiting(i, None)?,
        }
        let now = crate::now();
        while let Some((src, d)) = self.slots[i].backlog.pop_front() {
            if let Progress::Pending(w) = self.handle(i, now, src, d) {
                return self.set_waiting(i, Some(w));
            }
        }
        Ok(())
    }

    /// Receives and handles datagrams on slot `i` until its socket is empty,
    /// its budget is spent, or a fan-out has to wait.
    fn serve_socket(&mut self, i: usize) -> Result<(), ServeError> {
        for _ in 0..RECV_BATCHES {
            let r = self
                .receive
                .recv(Ready::Socket(i, self.slots[i].sock.as_fd()), &mut self.rx);
            let n = match r {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.fanout.idle(i);
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // A queued ICMP error surfaces here as ECONNREFUSED & co.
                    self.read_error_queue(i);
                    continue;
                }
            };
            self.deliver()?;
            if self.slots[i].waiting.is_some() {
                return Ok(());
            }
            if n < self.receive.batch() {
                // A short batch: the socket was empty.
                self.fanout.idle(i);
                return Ok(());
            }
        }
        Ok(())
    }

    /// Takes what the receive's ring holds for any group, up to the budget.
    fn serve_ring(&mut self) -> Result<(), ServeError> {
        for _ in 0..RECV_BATCHES {
            match self.receive.recv(Ready::Ring, &mut self.rx) {
                Ok(n) => {
                    self.deliver()?;
                    if n < self.receive.batch() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(loop_err(e)),
            }
        }
        Ok(())
    }

    /// Handles the batch just received, in order; a datagram of a group
    /// whose fan-out waits joins its backlog.
    fn deliver(&mut self) -> Result<(), ServeError> {
        // Both clocks read once per batch, not per datagram.
        let now = crate::now();
        let mut rx = std::mem::take(&mut self.rx);
        let mut r = Ok(());
        for d in rx.drain(..) {
            let Some(slot) = self.slots.get_mut(d.group) else {
                continue;
            };
            if slot.waiting.is_some() {
                slot.backlog.push_back((d.src, d.buf));
                continue;
            }
            match self.handle(d.group, now, d.src, d.buf) {
                Progress::Pending(w) => {
                    if r.is_ok() {
                        r = self.set_waiting(d.group, Some(w));
                    }
                }
                Progress::Done if d.drained && self.receive.ring_fd().is_some() => self.fanout.idle(d.group),
                Progress::Done => {}
            }
        }
        self.rx = rx;
        r
    }

    /// One datagram: the membership decision, the changes it made handed to
    /// the backend, then the fan-out (tag field zeroed, so every member gets
    /// the same bytes whatever the backend) or the reply.
    fn handle(&mut self, i: usize, now: Now, src: SocketAddr, mut buf: RecvBuf) -> Progress {
        let (keys, policy) = (&self.keys, self.policy);
        let datagram: &mut [u8] = &mut buf;
        // Before the core judges it: a valid LEAVE removes the member.
        let fenced = self.fanout.leave_arrived(i, src, datagram);
        let slot = &mut self.slots[i];
        let c = &slot.counters;
        let len = datagram.len();
        c.received.fetch_add(1, Relaxed);
        c.bytes_in.fetch_add(len as u64, Relaxed);
        let mut outcome = slot.group.handle(keys, policy, now, src, datagram);
        // Replies nobody can verify come out of the loop's one budget.
        self.unverified.admit(policy.replies_per_s, now.mono_ms, &mut outcome);
        if let Event::Dropped(DropReason::Malformed(ParseError::BadVersion(_))) = outcome.event {
            c.version_errors.fetch_add(1, Relaxed);
            if let Some(e) = version1_error(datagram) {
                if !self.unverified.take(policy.replies_per_s, now.mono_ms) {
                    c.error_replies_suppressed.fetch_add(1, Relaxed);
                    c.replies_suppressed.fetch_add(1, Relaxed);
                } else if SendOne::send(slot.sock.as_fd(), &e, src).is_ok() {
                    c.error_replies.fetch_add(1, Relaxed);
                    c.reply_bytes_out.fetch_add(e.len() as u64, Relaxed);
                }
            }
        }
        let fanout = &mut self.fanout;
        slot.group.take_changes(|ch, m| match ch {
            Change::Added(a) => fanout.member_added(i, a, m),
            Change::Removed(a) => fanout.member_removed(i, a),
        });
        if fenced {
            fanout.leave_judged(i);
        }
        match outcome.event {
            Event::Forward { from } => {
                if !fanout.accept_data(i, from, datagram) {
                    // Its sequence number went through the kernel path.
                    c.replays.fetch_add(1, Relaxed);
                    return Progress::Done;
                }
                c.forwarded.fetch_add(1, Relaxed);
                strip_tag(datagram);
                return fanout.fanout(i, slot.sock.as_fd(), buf, from, c);
            }
            Event::Refreshed => return Progress::Done,
            Event::Probed { rtt_us } => {
                c.probe_replies.fetch_add(1, Relaxed);
                c.rtt.observe_us(rtt_us);
                return Progress::Done;
            }
            Event::Rebound { .. } => c.rebinds.fetch_add(1, Relaxed),
            Event::Held => c.occupancy_kept.fetch_add(1, Relaxed),
            Event::Renewed => c.renewals.fetch_add(1, Relaxed),
            // Counted below, as answered or suppressed.
            Event::Echoed => 0,
            Event::Replaced => {
                // A new key and membership id for the channel.
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                c.replaced.fetch_add(1, Relaxed)
            }
            // Counted below, as sent or suppressed.
            Event::Challenged => 0,
            Event::Joined { rejoin } => {
                // The channel knows the member (and its key) before the
                // JOIN_ACK is out, so a joiner may fetch at once.
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                if rejoin {
                    c.rejoins.fetch_add(1, Relaxed)
                } else {
                    c.joins.fetch_add(1, Relaxed)
                }
            }
            Event::Left => {
                if let Some(b) = &self.board {
                    b.set_roster(slot.group.port(), slot.group.members());
                }
                c.leaves.fetch_add(1, Relaxed)
            }
            Event::Dropped(reason) => {
                if matches!(reason, DropReason::BadMac) && datagram.get(3) == Some(&(Kind::Leave as u8)) {
                    c.forged_leaves.fetch_add(1, Relaxed);
                }
                count_drop(c, reason)
            }
        };
        c.control_bytes_in.fetch_add(len as u64, Relaxed);
        c.members.store(slot.group.len() as u64, Relaxed);
        if let Some(kind) = outcome.suppressed {
            c.replies_suppressed.fetch_add(1, Relaxed);
            match kind {
                Kind::JoinChallenge => c.challenges_suppressed.fetch_add(1, Relaxed),
                Kind::Probe => c.rebind_probes_suppressed.fetch_add(1, Relaxed),
                Kind::Error => c.error_replies_suppressed.fetch_add(1, Relaxed),
                Kind::EchoReply => c.echo_suppressed.fetch_add(1, Relaxed),
                _ => 0,
            };
        }
        if let Some(reply) = outcome.reply {
            // Replies are best effort: a lost one is recovered by the
            // client's retry, and we never wait on a possibly spoofed peer.
            if SendOne::send(slot.sock.as_fd(), reply.as_bytes(), src).is_ok() {
                c.reply_bytes_out.fetch_add(reply.len() as u64, Relaxed);
                match outcome.reply_kind() {
                    Some(Kind::JoinChallenge) => c.challenges.fetch_add(1, Relaxed),
                    Some(Kind::Probe) => c.rebind_probes.fetch_add(1, Relaxed),
                    Some(Kind::Error) => c.error_replies.fetch_add(1, Relaxed),
                    Some(Kind::EchoReply) => c.echo_replies.fetch_add(1, Relaxed),
                    _ => 0,
                };
            }
        }
        Progress::Done
    }

    /// Reads slot `i`'s error queue: ICMP errors are counted and noted
    /// against the member they are about (which removes nobody by itself),
    /// every entry goes to the backend.
    fn read_error_queue(&mut self, i: usize) {
        let now_ms = mono_now_ms();
        let slot = &mut self.slots[i];
        let (group, c, fanout) = (&mut slot.group, &slot.counters, &mut self.fanout);
        sendpath::errqueue::read(slot.sock.as_fd(), |e: ErrEntry| {
            if let ErrKind::Icmp { .. } = e.kind {
                c.icmp_errors.fetch_add(1, Relaxed);
                if let Some(dest) = e.dest {
                    group.note_unreachable(dest, now_ms);
                }
            }
            fanout.error_entry(i, &e);
        });
    }

    /// Expiry: silent members, and members an ICMP error was about that have
    /// been silent since; the backend reports its counters.
    fn sweep(&mut self) {
        self.publish_pool();
        let now = crate::now();
        let now_ms = now.mono_ms;
        let mut probes = Vec::new();
        let mut moved = Vec::new();
        let drain_until = self.drain.until_mono_ms();
        let reassigned = self.drain.reassigned();
        let in_fleet = self.drain.in_fleet();
        for (i, s) in self.slots.iter_mut().enumerate() {
            // Signs of life and counters from the backend first (the kernel
            // path's DATA), so its members are not expired for silence.
            let group = &mut s.group;
            self.fanout.sync(i, &s.counters, &mut |addr| {
                group.heard_from(addr, now_ms);
            });
            let gone = s.group.expire(self.policy, now);
            // Each member's RTT, measured by the reflector itself.
            probes.clear();
            let probed = s.group.probes(&self.keys, self.policy, now, &mut probes);
            s.counters
                .occupancy_checks
                .fetch_add(probed.checks_started as u64, Relaxed);
            for (to, p) in &probes {
                if SendOne::send(s.sock.as_fd(), p.as_bytes(), *to).is_ok() {
                    s.counters.probes_sent.fetch_add(1, Relaxed);
                }
            }
            let fanout = &mut self.fanout;
            s.group.take_changes(|ch, m| match ch {
                Change::Added(a) => fanout.member_added(i, a, m),
                Change::Removed(a) => fanout.member_removed(i, a),
            });
            let placed_elsewhere = reassigned.contains(&s.group.port());
            let told = match drain_until {
                // What is left of the drain, in the field's unit (a longer
                // drain says 65.5 s until less is left). In a fleet, once
                // the group's cells are placed elsewhere.
                Some(until) if placed_elsewhere || !in_fleet => Some((
                    MovedReason::Draining,
                    u16::try_from(until.saturating_sub(now_ms)).unwrap_or(u16::MAX),
                )),
                Some(_) => None,
                // Served on as long as members stay: the longest the field says.
                None if placed_elsewhere => Some((MovedReason::Reassigned, u16::MAX)),
                None => None,
            };
            if let Some((reason, within)) = told {
                moved.clear();
                s.group.moved_all(reason, within, now_ms, &mut moved);
                for (to, d) in &moved {
                    if SendOne::send(s.sock.as_fd(), d.as_bytes(), *to).is_ok() {
                        s.counters.moved_sent.fetch_add(1, Relaxed);
                    }
                }
            }
            if let Some(b) = &self.board {
                if gone.total() > 0 {
                    b.set_roster(s.group.port(), s.group.members());
                }
                // Paper 000 §3: the game state, asked of one member.
                if let Some(m) = b.due_source(s.group.port(), s.group.members(), now_ms) {
                    if let Some((to, nonce, d)) = s.group.checkpoint_request(&self.keys, m, now_ms) {
                        let port = s.group.port();
                        // Recorded first: the upload may reach the lobby
                        // before this loop runs again.
                        if let Some(asked) = b.requested(port, &s.group.members()[m], nonce, now_ms) {
                            if SendOne::send(s.sock.as_fd(), d.as_bytes(), to).is_ok() {
                                b.request_sent(port);
                            } else {
                                b.withdraw(port, &asked);
                            }
                        }
                    }
                }
            }
            if gone.total() > 0 {
                s.counters.expired.fetch_add(gone.silent as u64, Relaxed);
                s.counters.expired_tokens.fetch_add(gone.tokens as u64, Relaxed);
                s.counters
                    .unreachable_removed
                    .fetch_add(gone.unreachable as u64, Relaxed);
                s.counters.occupancy_removed.fetch_add(gone.occupied as u64, Relaxed);
                s.counters.members.store(s.group.len() as u64, Relaxed);
            }
        }
    }
}

fn count_drop(c: &GroupCounters, reason: DropReason) -> u64 {
    use reflector_proto::auth::TokenError;
    let counter = match reason {
        DropReason::Malformed(_) => &c.malformed,
        DropReason::WrongGroup => &c.wrong_group,
        DropReason::NotMember => &c.dropped_non_member,
        DropReason::StaleMembership => &c.stale_membership,
        DropReason::BadMac => &c.bad_mac,
        DropReason::BadTag => &c.bad_tag,
        DropReason::Replay => &c.replays,
        DropReason::Unvalidated => &c.unvalidated,
        DropReason::OlderToken => &c.older_tokens,
        DropReason::Token(TokenError::Expired) => &c.expired_token,
        DropReason::Token(_) => &c.bad_token,
        DropReason::BadCookie => &c.bad_cookie,
        DropReason::GroupFull => &c.group_full,
        DropReason::Occupied => &c.occupied,
        DropReason::AddressLimit => &c.address_limit,
        DropReason::RateLimited => &c.rate_limited,
        DropReason::Unexpected(_) => &c.unexpected,
    };
    counter.fetch_add(1, Relaxed)
}
