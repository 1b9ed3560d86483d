//! One checkpoint exchange on the channel, version 2 (docs/protocol.md,
//! "Checkpoints" and "The channel, version 2"), advanced without blocking
//! by the client's own [`crate::Client::update`]: a non-blocking TCP
//! connect, then HELLO in, REQUEST out, REPLY in, and the state (out for an
//! upload, in for a fetch), each piece read or written as far as the
//! socket takes it now (`WouldBlock` leaves it for the next update). The
//! wire format is `reflector_proto::checkpoint`'s; this module only moves
//! bytes and checks what the codec decoded.

use reflector_proto::checkpoint::{
    body_mac, digest, Answer, DecodeError, Hello, Member, Op, Reply, Request, Stored, HELLO_LEN, REPLY_LEN, REQUEST_LEN,
};
use reflector_proto::protocol::{SessionKeys, MAC_LEN};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

/// The most one read or write moves: an update hands the game loop back
/// after at most [`PASSES`] of these per transfer.
const PIECE: usize = 64 * 1024;
/// Reads or writes per transfer per update.
const PASSES: usize = 16;

/// Why a checkpoint exchange failed (in [`crate::CheckpointEvent::Failed`])
/// or could not start: the channel's own error type, shared with the
/// blocking exchanges of `reflector_proto::checkpoint`. A socket error is
/// [`CheckpointError::Io`] (its call and message); the deadline is
/// [`crate::Config::checkpoint_timeout`], the fetch bound
/// [`crate::Config::checkpoint_max_bytes`].
pub type CheckpointError = reflector_proto::checkpoint::ChannelError;
pub use reflector_proto::checkpoint::CheckpointOp;

/// What an exchange ended with.
pub(crate) enum Done {
    Stored(Stored),
    Fetched {
        stored: Stored,
        age_ms: u32,
        /// Our clock when the CHECKPOINT REPLY arrived, Unix ms.
        received_unix_ms: u64,
        state: Vec<u8>,
    },
    Empty,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Connecting,
    Hello,
    Request,
    /// Upload: waiting for CONTINUE.
    Continue,
    /// Upload: the state and its MAC going out.
    Body,
    /// The final REPLY (STORED; or CHECKPOINT, EMPTY).
    Reply,
    /// Fetch: the state coming in.
    State,
}

/// Which way an exchange waits on its socket now: what an event-driven
/// loop watches it for (the tokio driver's) so that the next `update`
/// comes when the socket can move the exchange on, not on a poll.
#[cfg_attr(
    not(feature = "tokio"),
    allow(dead_code, reason = "only the tokio loop watches the socket")
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waits {
    /// Bytes to read (HELLO, a REPLY, the state).
    Read,
    /// The connect to complete, or room to write (REQUEST, the state).
    Write,
}

/// The member an exchange speaks for, taken when it starts.
#[derive(Clone, Copy)]
pub(crate) struct Who {
    pub group: u16,
    pub player: u32,
    pub membership: u32,
    pub keys: SessionKeys,
}

/// One exchange in progress.
pub(crate) struct Transfer {
    pub op: CheckpointOp,
    pub group: u16,
    /// A fetch from a sealed group: what it brings is an envelope to
    /// check and open for that group.
    pub sealed: Option<crate::GroupKey>,
    /// Upload: what sealing added to the game's state (0 in a clear
    /// group), so that a state too large says the game's size and bound.
    overhead: u64,
    /// Fetch: our clock when the CHECKPOINT REPLY arrived, Unix ms.
    reply_unix_ms: u64,
    addr: SocketAddr,
    stream: TcpStream,
    deadline: Instant,
    who: Who,
    step: Step,
    /// Upload: the nonce, tick and the state followed by its body MAC
    /// (appended once CONTINUE came); the state's digest.
    nonce: u64,
    tick: u64,
    out: Vec<u8>,
    state_len: usize,
    state_digest: [u8; 32],
    sent: usize,
    /// What is being read: `inbuf[..want]`, `have` of it so far.
    inbuf: Vec<u8>,
    want: usize,
    have: usize,
    /// Fetch: the bound on the state.
    max_state: u64,
    challenge: u64,
    req_mac: [u8; MAC_LEN],
    /// Fetch: the CHECKPOINT reply whose state is coming.
    fetched: Option<(Stored, u32)>,
    /// The REQUEST going out, and how much of it is out.
    pending_request: Option<[u8; REQUEST_LEN]>,
    req_sent: usize,
}

/// A non-blocking connect under way: Unix says EINPROGRESS, Windows
/// WSAEWOULDBLOCK.
fn in_progress(e: &io::Error) -> bool {
    #[cfg(unix)]
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        return true;
    }
    e.kind() == io::ErrorKind::WouldBlock
}

fn connect(addr: SocketAddr) -> Result<TcpStream, CheckpointError> {
    let io = |call, e: io::Error| CheckpointError::Io {
        addr,
        call,
        message: e.to_string(),
    };
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP)).map_err(|e| io("socket", e))?;
    s.set_nonblocking(true).map_err(|e| io("set_nonblocking", e))?;
    s.set_tcp_nodelay(true).map_err(|e| io("setsockopt", e))?;
    match s.connect(&SockAddr::from(addr)) {
        Ok(()) => {}
        Err(e) if in_progress(&e) => {}
        Err(e) => return Err(io("connect", e)),
    }
    Ok(s.into())
}

impl Transfer {
    /// An upload of `state` (the game's snapshot at `tick`) answering the
    /// CHECKPOINT_REQUEST of `nonce`; connects at once (without waiting).
    pub fn upload(
        addr: SocketAddr,
        who: Who,
        nonce: u64,
        tick: u64,
        state: Vec<u8>,
        overhead: usize,
        deadline: Instant,
    ) -> Result<Transfer, CheckpointError> {
        // Hashed before connecting: a large state does not eat into the
        // reflector's deadline for the exchange.
        let state_digest = digest(&state);
        let mut t = Transfer::new(CheckpointOp::Upload, addr, who, deadline)?;
        t.nonce = nonce;
        t.tick = tick;
        t.state_len = state.len();
        t.state_digest = state_digest;
        t.overhead = overhead as u64;
        t.out = state;
        Ok(t)
    }

    /// A FETCH of the group's latest checkpoint (`op` [`CheckpointOp::Fetch`])
    /// or a FETCH_OTHER of the other one kept ([`CheckpointOp::FetchOther`]),
    /// at most `max_state` bytes.
    pub fn fetch(
        op: CheckpointOp,
        addr: SocketAddr,
        who: Who,
        max_state: u64,
        deadline: Instant,
    ) -> Result<Transfer, CheckpointError> {
        debug_assert!(op != CheckpointOp::Upload, "an upload is Transfer::upload");
        let mut t = Transfer::new(op, addr, who, deadline)?;
        t.max_state = max_state;
        Ok(t)
    }

    fn new(op: CheckpointOp, addr: SocketAddr, who: Who, deadline: Instant) -> Result<Transfer, CheckpointError> {
        Ok(Transfer {
            op,
            group: who.group,
            sealed: None,
            overhead: 0,
            reply_unix_ms: 0,
            addr,
            stream: connect(addr)?,
            deadline,
            who,
            step: Step::Connecting,
            nonce: 0,
            tick: 0,
            out: Vec::new(),
            state_len: 0,
            state_digest: [0; 32],
            sent: 0,
            inbuf: vec![0; REPLY_LEN],
            want: HELLO_LEN,
            have: 0,
            max_state: 0,
            challenge: 0,
            req_mac: [0; MAC_LEN],
            fetched: None,
            pending_request: None,
            req_sent: 0,
        })
    }

    /// The exchange's TCP socket, for a loop that waits on it (the tokio
    /// driver's, an event loop's such as the bots').
    pub fn socket(&self) -> &TcpStream {
        &self.stream
    }

    /// What the exchange waits for on its socket now.
    #[cfg_attr(
        not(feature = "tokio"),
        allow(dead_code, reason = "only the tokio loop watches the socket")
    )]
    pub fn waits(&self) -> Waits {
        match self.step {
            Step::Connecting | Step::Request | Step::Body => Waits::Write,
            Step::Hello | Step::Continue | Step::Reply | Step::State => Waits::Read,
        }
    }

    /// The channel's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// When the exchange fails if it has not ended (`TimedOut`).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    fn member(&self) -> Member<'_> {
        Member {
            group: self.who.group,
            player: self.who.player,
            membership: self.who.membership,
            keys: &self.who.keys,
        }
    }

    fn io(&self, call: &'static str, e: io::Error) -> CheckpointError {
        CheckpointError::Io {
            addr: self.addr,
            call,
            message: e.to_string(),
        }
    }

    fn malformed(&self, what: DecodeError) -> CheckpointError {
        CheckpointError::Malformed { addr: self.addr, what }
    }

    /// Reads towards `inbuf[..want]`; `Ok(true)` once it is all there.
    fn fill(&mut self, passes: &mut usize) -> Result<bool, CheckpointError> {
        while self.have < self.want {
            if *passes == 0 {
                return Ok(false);
            }
            *passes -= 1;
            let end = self.want.min(self.have + PIECE);
            match self.stream.read(&mut self.inbuf[self.have..end]) {
                Ok(0) => return Err(CheckpointError::Closed { addr: self.addr }),
                Ok(n) => self.have += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("read", e)),
            }
        }
        Ok(true)
    }

    /// Writes `out[sent..]`; `Ok(true)` once it is all out.
    fn drain(&mut self, passes: &mut usize) -> Result<bool, CheckpointError> {
        while self.sent < self.out.len() {
            if *passes == 0 {
                return Ok(false);
            }
            *passes -= 1;
            let end = self.out.len().min(self.sent + PIECE);
            match self.stream.write(&self.out[self.sent..end]) {
                Ok(0) => return Err(CheckpointError::Closed { addr: self.addr }),
                Ok(n) => self.sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io("write", e)),
            }
        }
        Ok(true)
    }

    fn expect(&mut self, n: usize) {
        if self.inbuf.len() < n {
            self.inbuf.resize(n, 0);
        }
        self.want = n;
        self.have = 0;
    }

    /// The REPLY in `inbuf`, only if its MAC verifies under our key; a
    /// REFUSED becomes an error naming its code.
    fn reply(&self) -> Result<Answer, CheckpointError> {
        let mut b = [0u8; REPLY_LEN];
        b.copy_from_slice(&self.inbuf[..REPLY_LEN]);
        let r = Reply::decode(&b).map_err(|e| self.malformed(e))?;
        let addr = self.addr;
        if r.is_unauthenticated() {
            let refusal = match r.answer {
                Answer::Refused(c) => Some(c),
                _ => None,
            };
            return Err(CheckpointError::Unauthenticated { addr, refusal });
        }
        if !r.verify(&self.who.keys, self.challenge, &self.req_mac) {
            return Err(CheckpointError::BadMac { addr });
        }
        match r.answer {
            Answer::Refused(code) => Err(CheckpointError::Refused { addr, code }),
            a => Ok(a),
        }
    }

    fn unexpected(&self, a: Answer) -> CheckpointError {
        CheckpointError::Unexpected {
            addr: self.addr,
            status: a.status(),
        }
    }

    /// Moves the exchange on as far as the socket allows now. `Ok(None)`:
    /// not finished; the deadline is checked first.
    pub fn advance(&mut self, now: Instant) -> Result<Option<Done>, CheckpointError> {
        if now >= self.deadline {
            return Err(CheckpointError::TimedOut { addr: self.addr });
        }
        let mut passes = PASSES;
        loop {
            match self.step {
                Step::Connecting => {
                    if let Some(e) = self.stream.take_error().map_err(|e| self.io("getsockopt", e))? {
                        return Err(self.io("connect", e));
                    }
                    match self.stream.peer_addr() {
                        Ok(_) => self.step = Step::Hello,
                        Err(e) if e.kind() == io::ErrorKind::NotConnected => return Ok(None),
                        Err(e) => return Err(self.io("connect", e)),
                    }
                }
                Step::Hello => {
                    if !self.fill(&mut passes)? {
                        return Ok(None);
                    }
                    let mut b = [0u8; HELLO_LEN];
                    b.copy_from_slice(&self.inbuf[..HELLO_LEN]);
                    let hello = Hello::decode(&b).map_err(|e| self.malformed(e))?;
                    self.challenge = hello.challenge;
                    let req = match self.op {
                        CheckpointOp::Upload => {
                            let len = self.state_len as u64;
                            if len > hello.max_state {
                                // In a sealed group: the game's state
                                // against what remains of the bound after
                                // the envelope's overhead.
                                return Err(CheckpointError::TooLarge {
                                    addr: self.addr,
                                    len: len - self.overhead,
                                    max: hello.max_state.saturating_sub(self.overhead),
                                });
                            }
                            Request::upload(&self.member(), hello.challenge, self.nonce, len, self.tick)
                        }
                        CheckpointOp::Fetch => Request::fetch(&self.member(), hello.challenge, Op::Fetch),
                        CheckpointOp::FetchOther => Request::fetch(&self.member(), hello.challenge, Op::FetchOther),
                    };
                    self.req_mac = req.mac;
                    // The state waits behind the request in `out` for an
                    // upload: the request goes first, from its own buffer.
                    self.step = Step::Request;
                    self.pending_request = Some(req.encode());
                    self.req_sent = 0;
                }
                Step::Request => {
                    let Some(req) = self.pending_request else {
                        return Err(self.io("write", io::Error::other("no request")));
                    };
                    while self.req_sent < req.len() {
                        if passes == 0 {
                            return Ok(None);
                        }
                        passes -= 1;
                        match self.stream.write(&req[self.req_sent..]) {
                            Ok(0) => return Err(CheckpointError::Closed { addr: self.addr }),
                            Ok(n) => self.req_sent += n,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(self.io("write", e)),
                        }
                    }
                    self.pending_request = None;
                    self.expect(REPLY_LEN);
                    self.step = match self.op {
                        CheckpointOp::Upload => Step::Continue,
                        CheckpointOp::Fetch | CheckpointOp::FetchOther => Step::Reply,
                    };
                }
                Step::Continue => {
                    if !self.fill(&mut passes)? {
                        return Ok(None);
                    }
                    match self.reply()? {
                        Answer::Continue => {}
                        other => return Err(self.unexpected(other)),
                    }
                    let mac = body_mac(
                        &self.who.keys,
                        self.challenge,
                        &self.req_mac,
                        &self.out[..self.state_len],
                    );
                    self.out.extend_from_slice(&mac);
                    self.sent = 0;
                    self.step = Step::Body;
                }
                Step::Body => {
                    if !self.drain(&mut passes)? {
                        return Ok(None);
                    }
                    self.out = Vec::new();
                    self.expect(REPLY_LEN);
                    self.step = Step::Reply;
                }
                Step::Reply => {
                    if !self.fill(&mut passes)? {
                        return Ok(None);
                    }
                    let a = self.reply()?;
                    return match (self.op, a) {
                        (CheckpointOp::Upload, Answer::Stored(st)) => {
                            if st.digest != self.state_digest {
                                return Err(CheckpointError::Mismatch {
                                    addr: self.addr,
                                    what: "STORED names another state's digest",
                                });
                            }
                            if st.tick != self.tick || st.from_player != self.who.player {
                                return Err(CheckpointError::Mismatch {
                                    addr: self.addr,
                                    what: "STORED names another tick or player",
                                });
                            }
                            Ok(Some(Done::Stored(st)))
                        }
                        (CheckpointOp::Fetch | CheckpointOp::FetchOther, Answer::Empty) => Ok(Some(Done::Empty)),
                        (
                            CheckpointOp::Fetch | CheckpointOp::FetchOther,
                            Answer::Checkpoint {
                                stored,
                                body_len,
                                age_ms,
                            },
                        ) => {
                            if body_len > self.max_state {
                                return Err(CheckpointError::TooLarge {
                                    addr: self.addr,
                                    len: body_len,
                                    max: self.max_state,
                                });
                            }
                            self.fetched = Some((stored, age_ms));
                            self.reply_unix_ms = reflector_proto::unix_now_ms();
                            // body_len <= max_state, which the game chose to hold.
                            self.inbuf = Vec::new();
                            self.expect(body_len as usize);
                            self.step = Step::State;
                            continue;
                        }
                        (_, other) => Err(self.unexpected(other)),
                    };
                }
                Step::State => {
                    if !self.fill(&mut passes)? {
                        return Ok(None);
                    }
                    let Some((stored, age_ms)) = self.fetched else {
                        return Err(self.io("read", io::Error::other("no reply")));
                    };
                    let state = std::mem::take(&mut self.inbuf);
                    if digest(&state) != stored.digest {
                        return Err(CheckpointError::Mismatch {
                            addr: self.addr,
                            what: "the state's SHA-256 is not the REPLY's digest",
                        });
                    }
                    return Ok(Some(Done::Fetched {
                        stored,
                        age_ms,
                        received_unix_ms: self.reply_unix_ms,
                        state,
                    }));
                }
            }
        }
    }
}

// The client's side of the channel: its transfers, run from `update`.
impl<D: crate::Driver> crate::Client<D> {
    /// Who speaks on membership `i`'s channel, and where it is.
    pub(crate) fn channel(&self, i: usize) -> Result<(Who, SocketAddr), CheckpointError> {
        let m = &self.memberships[i];
        if !m.session.is_member() {
            return Err(CheckpointError::NotMember);
        }
        let membership = m.session.membership().ok_or(CheckpointError::NotMember)?;
        let addr = self.checkpoint_addr_of(i).ok_or(CheckpointError::NoChannel)?;
        let r = m.session.request();
        Ok((
            Who {
                group: r.group,
                player: r.player,
                membership,
                keys: r.keys,
            },
            addr,
        ))
    }

    /// Starts a fetch on membership `i`'s channel: `op` is
    /// [`CheckpointOp::Fetch`] (the latest) or [`CheckpointOp::FetchOther`].
    /// One of each may run at once (the reflector paces them apart).
    pub(crate) fn start_fetch(&mut self, i: usize, op: CheckpointOp, now: Instant) -> Result<(), CheckpointError> {
        let in_flight = match op {
            CheckpointOp::Upload => return Err(CheckpointError::InFlight(op)),
            CheckpointOp::Fetch => self.ck_fetch.is_some(),
            CheckpointOp::FetchOther => self.ck_fetch_other.is_some(),
        };
        if in_flight {
            return Err(CheckpointError::InFlight(op));
        }
        let (who, addr) = self.channel(i)?;
        let deadline = now + self.cfg.checkpoint_timeout;
        let mut t = Transfer::fetch(op, addr, who, self.cfg.checkpoint_max_bytes, deadline)?;
        // Anything but a clear group is checked as sealed: a misconfigured
        // one (sealed without instance ids) never hands a state over
        // unchecked either.
        if self.memberships[i].sealing != crate::sealing::GroupSealing::Clear {
            t.sealed = Some(self.memberships[i].key());
        }
        match op {
            CheckpointOp::FetchOther => self.ck_fetch_other = Some(t),
            _ => self.ck_fetch = Some(t),
        }
        Ok(())
    }

    /// The exchanges under way (an upload, a fetch, a fetch of the other).
    pub(crate) fn transfers(&self) -> impl Iterator<Item = &Transfer> {
        [&self.ck_upload, &self.ck_fetch, &self.ck_fetch_other]
            .into_iter()
            .filter_map(Option::as_ref)
    }

    pub(crate) fn checkpoint_failed(&mut self, op: CheckpointOp, reason: CheckpointError) {
        self.stats.checkpoint_failures += 1;
        let group = self.group().unwrap_or(0);
        self.ck_events
            .push_back(crate::CheckpointEvent::Failed { group, op, reason });
    }

    /// Carries the exchanges under way as far as their sockets allow.
    pub(crate) fn checkpoints(&mut self, now: Instant) {
        self.take_certificates();
        for op in [CheckpointOp::Upload, CheckpointOp::Fetch, CheckpointOp::FetchOther] {
            let slot = match op {
                CheckpointOp::Upload => &mut self.ck_upload,
                CheckpointOp::Fetch => &mut self.ck_fetch,
                CheckpointOp::FetchOther => &mut self.ck_fetch_other,
            };
            let Some(t) = slot.as_mut() else { continue };
            let (group, sealed, addr) = (t.group, t.sealed, t.addr());
            let res = t.advance(now);
            if matches!(res, Ok(None)) {
                continue;
            }
            // Ended: the slot is free (and no longer borrowed).
            *slot = None;
            let ev = match res {
                Ok(None) => continue,
                Ok(Some(Done::Stored(st))) => {
                    self.stats.checkpoints_uploaded += 1;
                    crate::CheckpointEvent::Uploaded {
                        group,
                        number: st.number,
                        tick: st.tick,
                    }
                }
                Ok(Some(Done::Empty)) => {
                    self.stats.checkpoints_fetched += 1;
                    crate::CheckpointEvent::Empty { group, op }
                }
                Ok(Some(Done::Fetched {
                    stored,
                    age_ms,
                    received_unix_ms,
                    state,
                })) => {
                    let opened = match sealed {
                        None => Ok((state, crate::Verification::Clear)),
                        Some(key) => {
                            let reply = reflector_proto::sealed::checkpoint::FetchedReply {
                                tick: stored.tick,
                                from_player: stored.from_player,
                                age_ms: u64::from(age_ms),
                                received_unix_ms,
                            };
                            self.open_fetched(key, addr, op, &reply, state)
                        }
                    };
                    match opened {
                        Ok((bytes, verification)) => {
                            self.stats.checkpoints_fetched += 1;
                            crate::CheckpointEvent::Checkpoint {
                                group,
                                op,
                                number: stored.number,
                                tick: stored.tick,
                                from_player: stored.from_player,
                                age_ms,
                                bytes,
                                verification,
                            }
                        }
                        Err(reason) => {
                            self.stats.checkpoint_failures += 1;
                            crate::CheckpointEvent::Failed { group, op, reason }
                        }
                    }
                }
                Err(reason) => {
                    self.stats.checkpoint_failures += 1;
                    crate::CheckpointEvent::Failed { group, op, reason }
                }
            };
            self.ck_events.push_back(ev);
        }
    }
}
