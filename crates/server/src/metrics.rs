//! Per-group counters, their Prometheus exposition and the final summary.
//!
//! Each group's counters are owned by the one event-loop thread that serves
//! the group, so the relaxed atomic increments are uncontended; the metrics
//! endpoint and the summary only read them.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crate::receive::PoolStats;
use reflector_http::expo::{Format, Histogram};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident $(as $metric:literal)? : $kind:literal, $help:literal; )*) => {
        /// Counters of one group.
        #[derive(Debug, Default)]
        pub struct GroupCounters {
            $( $(#[$doc])* pub $name: AtomicU64, )*
            /// Measured member round-trip times.
            pub rtt: RttHistogram,
        }

        /// A plain copy of [`GroupCounters`] taken at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
        pub struct Snapshot {
            $( pub $name: u64, )*
        }

        impl GroupCounters {
            pub fn snapshot(&self) -> Snapshot {
                Snapshot { $( $name: self.$name.load(Relaxed), )* }
            }
        }

        impl Snapshot {
            /// (metric name, kind, help, value) for every counter.
            pub fn fields(&self) -> Vec<Field> {
                vec![ $( (metric_name!($name $(, $metric)?), $kind, $help, self.$name), )* ]
            }

            pub fn add(&mut self, o: &Snapshot) {
                $( self.$name += o.$name; )*
            }
        }
    };
}

/// A counter's metric name: its field's name unless given (`as "..."`).
macro_rules! metric_name {
    ($name:ident) => {
        stringify!($name)
    };
    ($name:ident, $metric:literal) => {
        $metric
    };
}

counters! {
    received: "counter", "Datagrams received on the group's port.";
    bytes_in as "received_bytes": "counter", "Bytes received on the group's port.";
    forwarded: "counter", "DATA datagrams from members accepted for fan-out.";
    fanned_out: "counter", "Copies sent to members (one per receiver).";
    bytes_out as "fanned_out_bytes": "counter", "Bytes of fan-out copies sent.";
    dropped_non_member: "counter", "DATA, KEEPALIVE, LEAVE or PROBE_REPLY from players that are not members.";
    malformed: "counter", "Datagrams that failed to parse (truncated, bad magic/version/type/length).";
    wrong_group: "counter", "Datagrams whose header names another group than their port.";
    stale_membership: "counter", "Datagrams of a member's player with an earlier membership id.";
    bad_mac: "counter", "JOINs, KEEPALIVEs, LEAVEs and PROBE_REPLYs whose MAC failed under the player's key (spoofed or forged).";
    forged_leaves: "counter", "LEAVEs whose MAC failed under the member's key (forged; also in bad_mac).";
    bad_tag: "counter", "DATA whose tag failed under the member's key (spoofed source), dropped before fan-out.";
    replays: "counter", "Authenticated datagrams with a sequence number seen before (replays), dropped.";
    unvalidated: "counter", "Datagrams of a member from an address it has not validated (a PROBE went there first), dropped.";
    rebinds: "counter", "Members moved to a new address after it answered a PROBE under the key (NAT rebinding).";
    probes_sent: "counter", "PROBEs the sweep sent to members' addresses: RTT, and occupancy checks (rebinding PROBEs are rebind_probes).";
    rebind_probes: "counter", "Rebinding PROBEs sent to a member's new address (at most one a second per member, from the member's own reply budget).";
    rebind_probes_suppressed: "counter", "Rebinding PROBEs not sent: one went to that member within the second, or its reply budget (--member-replies-per-s) was spent.";
    probe_replies: "counter", "PROBE_REPLYs with a measured round-trip time.";
    version_errors: "counter", "Datagrams of another protocol version, answered with ERROR(Version) when no larger.";
    bad_token: "counter", "JOINs whose token failed to verify.";
    expired_token: "counter", "JOINs with an expired token.";
    bad_cookie: "counter", "JOINs echoing a wrong or stale cookie.";
    group_full as "joins_refused_group_full": "counter", "JOINs refused because the group is full.";
    occupied: "counter", "JOINs (answered ERROR(Retry)) and rebinds refused because another member holds the address; that member is checked with PROBEs under its own key.";
    occupancy_checks: "counter", "Occupancy checks begun: a member whose address someone else wanted, PROBEd under its own key.";
    occupancy_kept: "counter", "Occupancy checks the member answered: it kept its address.";
    occupancy_removed: "counter", "Members removed because someone else wanted their address and they answered neither PROBE of the check.";
    address_limit: "counter", "JOINs refused because their address already has --max-per-ip members in the group.";
    rate_limited: "counter", "DATA dropped beyond its member's rate cap (--member-rate-pps, --member-rate-bytes).";
    unexpected: "counter", "Datagrams of a type only the reflector sends.";
    challenges: "counter", "JOIN_CHALLENGE replies sent.";
    challenges_suppressed: "counter", "JOIN_CHALLENGEs not sent: the player's (or the member's) reply budget was spent (--player-replies-per-s, --member-replies-per-s).";
    error_replies: "counter", "ERROR replies sent (version-1 ERROR(Version) included).";
    error_replies_suppressed: "counter", "ERROR replies not sent: their budget was spent (the global one for errors nobody can verify, --replies-per-s).";
    joins: "counter", "Members admitted.";
    rejoins: "counter", "JOINs from existing members, answered again.";
    leaves: "counter", "Members that left with LEAVE.";
    expired: "counter", "Members removed after going silent.";
    expired_tokens: "counter", "Members removed because their token expired (wall clock) and they had not renewed it.";
    renewals: "counter", "Renewals accepted: a member's JOIN with a newer token, under its membership's key; its expiry extended, nothing else changed.";
    replaced: "counter", "Memberships replaced by a JOIN of the same player with another token expiring later (a restarted client).";
    older_tokens: "counter", "JOINs of a member carrying another token that does not expire later than the membership's (a captured older JOIN), dropped.";
    echo_replies: "counter", "ECHO_REPLYs sent to members' ECHOs.";
    echo_suppressed: "counter", "ECHOs not answered: the member's echo budget (4 a second) was spent.";
    moved_sent: "counter", "MOVEDs sent to members while draining (serve --drain-timeout): each member once a second until it leaves or the drain ends.";
    unreachable_removed: "counter", "Members removed because ICMP errors were reported about them and they had sent nothing since, for two keepalive intervals (an ICMP error alone removes nobody).";
    control_bytes_in as "control_received_bytes": "counter", "Bytes of datagrams that were not member traffic (joins, strays, floods).";
    reply_bytes_out as "reply_sent_bytes": "counter", "Bytes of replies (challenge, ack, error); never more than control_received_bytes.";
    replies_suppressed: "counter", "Replies of every kind not sent because their budget was spent (includes challenges_suppressed, error_replies_suppressed, rebind_probes_suppressed).";
    enobufs_waits: "counter", "Sends that hit ENOBUFS (device queue full) and were retried after a wait.";
    eagain_waits: "counter", "Sends that hit EAGAIN (socket buffer full) and waited for POLLOUT.";
    icmp_errors: "counter", "ICMP errors reported on the socket (e.g. a departed member's port unreachable).";
    pending_fanouts: "counter", "Fan-outs that had to wait for the socket buffer or the device queue; the loop served its other groups meanwhile.";
    send_errors: "counter", "Copies not sent because the destination kept failing (unroutable), or abandoned at shutdown.";
    kernel_forwarded: "counter", "DATA fanned out inside the kernel by the eBPF program (also in forwarded).";
    kernel_copies: "counter", "Copies the eBPF program cloned to members (also in fanned_out).";
    kernel_clone_errors: "counter", "Copies the eBPF program's clones could not hand to a device (full qdisc or queue): each is resent from user space (kernel_resent), or counted in send_errors if the resend ring was full.";
    kernel_resent: "counter", "Copies the eBPF program could not send, resent from user space after waiting out the full queue (also in fanned_out).";
    kernel_passed_up: "counter", "Datagrams to the group's port the eBPF program left to user space (control, non-members, fragments, user-space mode).";
    kernel_leave_fences: "counter", "LEAVEs from a member's address with its ids that the eBPF program fenced the group for: the group's DATA went up behind each until user space had judged it.";
    kernel_leave_resyncs: "counter", "LEAVE fences taken down after a drain of the socket because fenced LEAVEs never reached it (a full receive buffer).";
    checkpoint_requests: "counter", "CHECKPOINT_REQUESTs sent (one member per group per --checkpoint-every, lowest RTT first).";
    checkpoints_stored: "counter", "Checkpoint uploads stored (answering the pending request, MAC verified, within the size bound).";
    checkpoint_bytes_stored as "checkpoint_stored_bytes": "counter", "Bytes of game state stored from uploads.";
    checkpoints_served: "counter", "Checkpoints sent whole to members that fetched them (joiners, resyncs).";
    checkpoint_bytes_served as "checkpoint_served_bytes": "counter", "Bytes of game state served.";
    checkpoint_serve_us_sum as "checkpoint_serve_seconds": "counter_us", "Time from a fetch's decision to its last byte handed to the kernel, seconds (divide by checkpoints_served).";
    checkpoint_empty_fetches: "counter", "Fetches answered with 'no checkpoint yet'.";
    checkpoint_refused: "counter", "Checkpoint requests refused: not a member, bad MAC, not requested, too large, fetch too soon, memory bound.";
    checkpoint_memory_refused: "counter", "Checkpoint uploads refused Busy because stored states plus bodies being received would pass --checkpoint-memory (also in checkpoint_refused).";
    checkpoint_timeouts: "counter", "Checkpoint transfers cut off at the deadline (the peer stopped reading).";
    checkpoint_zerocopy_sends: "counter", "Sends of checkpoint state with MSG_ZEROCOPY.";
    checkpoint_copied_sends: "counter", "Sends of checkpoint messages as copies (small pieces, or after the kernel reported it copied anyway).";
    members: "gauge", "Current members.";
}

/// Upper bounds of the RTT histogram's buckets, microseconds (exposed in
/// seconds): loopback and LAN below a millisecond, the Internet above.
pub const RTT_BOUNDS_US: [u64; 10] = [
    100, 500, 1_000, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];
/// [`RTT_BOUNDS_US`] in seconds.
pub const RTT_BOUNDS_S: [f64; 10] = [0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Round-trip times of one group's members, measured in microseconds; one
/// more bucket than [`RTT_BOUNDS_US`] for longer ones.
#[derive(Debug, Default)]
pub struct RttHistogram {
    counts: [AtomicU64; RTT_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
}

impl RttHistogram {
    pub fn observe_us(&self, us: u64) {
        let i = RTT_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(RTT_BOUNDS_US.len());
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    pub fn snapshot(&self) -> Histogram {
        Histogram {
            bounds: &RTT_BOUNDS_S,
            counts: self.counts.iter().map(|c| c.load(Relaxed)).collect(),
            sum: self.sum_us.load(Relaxed) as f64 / 1e6,
        }
    }
}

const RTT_HELP: &str = "Round-trip times of members' PROBE answers, seconds (microsecond resolution).";

/// One row of samples: its labels and a snapshot's fields.
type Row<'a> = (Vec<(&'a str, &'a str)>, Vec<Field>);

/// Writes one snapshot's counters as families `{prefix}{name}`, each with
/// one sample per `(labels, snapshot)`.
fn write_counters(e: &mut reflector_http::expo::Exposition, prefix: &str, rows: &[Row<'_>]) {
    for (i, (name, kind, help, _)) in Snapshot::default().fields().iter().enumerate() {
        let full = format!("{prefix}{name}");
        let mut family = match *kind {
            "gauge" => e.gauge(&full, help),
            _ => e.counter(&full, help),
        };
        for (labels, fields) in rows {
            let v = fields[i].3;
            match *kind {
                // Kept in microseconds, exposed in seconds.
                "counter_us" => family.sample(labels, v as f64 / 1e6),
                _ => family.sample(labels, v),
            }
        }
    }
}

/// The exposition of a reflector's metrics; the counters stay the event
/// loops' own atomics (no lock, no second copy on the data path) and are
/// read at scrape time.
#[derive(Debug, Clone)]
pub struct Exposition {
    registry: Registry,
    per_group: bool,
}

impl Exposition {
    /// Aggregates over all groups (`reflector_*`), and with `per_group`
    /// also families of one series per group (`reflector_group_*{group}`).
    pub fn new(registry: Registry, per_group: bool) -> Exposition {
        Exposition { registry, per_group }
    }

    /// One scrape in `format`.
    pub fn encode(&self, format: Format) -> String {
        let r = &self.registry;
        let mut e = reflector_http::expo::Exposition::new(format);
        reflector_http::expo::build_info(&mut e, "reflector", &[("backend", r.backend)]);
        let snaps: Vec<(String, Snapshot, Histogram)> = r
            .groups
            .iter()
            .map(|(p, g)| (p.to_string(), g.snapshot(), g.rtt.snapshot()))
            .collect();
        let mut total = Snapshot::default();
        let mut rtt = RttHistogram::default().snapshot();
        for (_, s, h) in &snaps {
            total.add(s);
            rtt.add(h);
        }
        write_counters(&mut e, "reflector_", &[(vec![], total.fields())]);
        e.histogram("reflector_rtt_seconds", RTT_HELP).histogram(&[], &rtt);
        let ch = &r.channel;
        for (name, help, v) in [
            (
                "reflector_checkpoint_channel_busy",
                "Checkpoint connections refused at once: too many overall or from one address.",
                &ch.busy,
            ),
            (
                "reflector_checkpoint_channel_malformed",
                "Checkpoint requests that did not decode, were over the size bound, or named no group here.",
                &ch.malformed,
            ),
            (
                "reflector_checkpoint_channel_timeouts",
                "Checkpoint exchanges cut off at their deadline (a peer that stopped reading or writing).",
                &ch.timeouts,
            ),
            (
                "reflector_checkpoint_channel_hello_timeouts",
                "Checkpoint connections closed because no request came within --checkpoint-hello-timeout.",
                &ch.hello_timeouts,
            ),
            (
                "reflector_checkpoint_channel_evicted",
                "Unauthenticated checkpoint connections closed, oldest first, to make room for a new one.",
                &ch.evicted,
            ),
        ] {
            e.counter(name, help).sample(&[], v.load(Relaxed));
        }
        write_receive_pools(&mut e, &r.receive_pools);
        e.counter(
            "reflector_token_secret_reloads",
            "Times serve took a new token secret (the secret file changed, or SIGHUP).",
        )
        .sample(&[], r.secret.reloads.load(Relaxed));
        e.counter(
            "reflector_token_secret_reload_errors",
            "New versions of the secret file that could not be read or parsed: the secret in force was kept (the log says why).",
        )
        .sample(&[], r.secret.reload_errors.load(Relaxed));
        e.gauge(
            "reflector_token_secret_previous_until_seconds",
            "Unix time until which tokens signed with the previous secret are accepted (0: no previous secret).",
        )
        .sample(&[], r.secret.previous_until_s.load(Relaxed));
        e.gauge(
            "reflector_checkpoint_memory_bytes",
            "Bytes of stored checkpoint states plus upload bodies being received (bounded by --checkpoint-memory).",
        )
        .sample(&[], ch.memory_bytes.load(Relaxed));
        if self.per_group {
            let rows: Vec<Row<'_>> = snaps
                .iter()
                .map(|(p, s, _)| (vec![("group", p.as_str())], s.fields()))
                .collect();
            write_counters(&mut e, "reflector_group_", &rows);
            let mut family = e.histogram("reflector_group_rtt_seconds", RTT_HELP);
            for (p, _, h) in &snaps {
                family.histogram(&[("group", p.as_str())], h);
            }
        }
        reflector_http::expo::process(&mut e);
        e.finish()
    }
}

/// The receive pool of one event loop as the loop last published it
/// ([`ReceivePoolCounters::publish`]).
#[derive(Debug, Default)]
pub struct ReceivePoolCounters {
    pub preallocated: AtomicU64,
    pub allocated: AtomicU64,
    pub held: AtomicU64,
    pub handed_out: AtomicU64,
    pub ring_returned: AtomicU64,
}

impl ReceivePoolCounters {
    /// Copies a pool's stats. The pool lives on its loop's thread (no
    /// atomics inside), so the loop publishes them at each sweep rather than
    /// the data path paying for shared counters.
    pub fn publish(&self, s: PoolStats) {
        self.preallocated.store(s.preallocated as u64, Relaxed);
        self.allocated.store(s.allocated as u64, Relaxed);
        self.held.store(s.held as u64, Relaxed);
        self.handed_out.store(s.handed_out, Relaxed);
        self.ring_returned.store(s.ring_returned, Relaxed);
    }

    pub fn snapshot(&self) -> PoolStats {
        PoolStats {
            preallocated: self.preallocated.load(Relaxed) as usize,
            allocated: self.allocated.load(Relaxed) as usize,
            free: 0,
            handed_out: self.handed_out.load(Relaxed),
            held: self.held.load(Relaxed) as usize,
            ring_returned: self.ring_returned.load(Relaxed),
        }
    }
}

/// Writes the receive pools' families, summed over the event loops: an
/// operator asks whether the reflector's pools grow or hold buffers (the
/// groups that stall are in the per-group `pending_fanouts`), and the
/// number of series stays independent of the number of cores.
fn write_receive_pools(e: &mut reflector_http::expo::Exposition, pools: &[Arc<ReceivePoolCounters>]) {
    let mut sum = PoolStats::default();
    for p in pools {
        let s = p.snapshot();
        sum.preallocated += s.preallocated;
        sum.allocated += s.allocated;
        sum.held += s.held;
        sum.handed_out += s.handed_out;
        sum.ring_returned += s.ring_returned;
    }
    let families = [
        (
            "gauge",
            "reflector_receive_buffers_preallocated",
            "Receive buffers the event loops' pools allocated at start (0 for io_uring receives: the kernel's buffer ring is separate).",
            sum.preallocated as u64,
        ),
        (
            "counter",
            "reflector_receive_buffers_allocated",
            "Receive buffers the event loops' pools have allocated, the preallocated ones included; none is freed, so this is also the pools' size.",
            sum.allocated as u64,
        ),
        (
            "counter",
            "reflector_receive_buffers_grown",
            "Receive buffers allocated beyond the preallocation; rising means more datagrams waited at once (fan-outs stalled on full socket buffers or device queues, their groups' backlogs) than the pools had spare.",
            sum.allocated.saturating_sub(sum.preallocated) as u64,
        ),
        (
            "gauge",
            "reflector_receive_buffers_held",
            "Receive buffers held at the last sweep by fan-outs that wait and by parked groups' backlogs; 0 when nothing waits, staying high means groups are stalled.",
            sum.held as u64,
        ),
        (
            "counter",
            "reflector_receive_buffers_handed_out",
            "Datagrams received into the event loops' receive buffers.",
            sum.handed_out,
        ),
        (
            "counter",
            "reflector_receive_ring_buffers_returned",
            "io_uring receives: buffers given back to the kernel's buffer ring once their datagram was handled; lagging reflector_receive_buffers_handed_out means buffers are held and the ring runs short (receives stop until buffers return).",
            sum.ring_returned,
        ),
    ];
    for (kind, name, help, value) in families {
        let mut family = match kind {
            "gauge" => e.gauge(name, help),
            _ => e.counter(name, help),
        };
        family.sample(&[], value);
    }
}

/// One counter: (name, prometheus type, help, value).
pub type Field = (&'static str, &'static str, &'static str, u64);

/// The counters of every group a reflector serves.
#[derive(Debug, Clone)]
pub struct Registry {
    pub backend: &'static str,
    pub groups: Vec<(u16, Arc<GroupCounters>)>,
    /// The checkpoint channel's refusals that name no group.
    pub channel: Arc<ChannelCounters>,
    /// Each event loop's receive pool, in loop order (none until a server
    /// starts its loops).
    pub receive_pools: Vec<Arc<ReceivePoolCounters>>,
    /// Reloads of the token secret (`serve` updates them).
    pub secret: Arc<SecretCounters>,
}

/// The token secret's reloads, for an operator rolling it over: did every
/// reflector take the new file, and until when does it accept the old
/// secret.
#[derive(Debug, Default)]
pub struct SecretCounters {
    pub reloads: AtomicU64,
    pub reload_errors: AtomicU64,
    /// Unix seconds until which the previous secret is accepted (0: none).
    pub previous_until_s: AtomicU64,
}

impl Registry {
    pub fn new(backend: &'static str, ports: &[u16]) -> Registry {
        Registry {
            backend,
            groups: ports.iter().map(|&p| (p, Arc::new(GroupCounters::default()))).collect(),
            channel: Arc::default(),
            receive_pools: Vec::new(),
            secret: Arc::default(),
        }
    }

    pub fn total(&self) -> Snapshot {
        let mut t = Snapshot::default();
        for (_, g) in &self.groups {
            t.add(&g.snapshot());
        }
        t
    }

    /// One scrape in the classic text format: aggregates only, or with
    /// every group's own series too.
    pub fn prometheus(&self, per_group: bool) -> String {
        Exposition::new(self.clone(), per_group).encode(Format::Text)
    }

    /// A human summary: totals, then the groups that saw traffic.
    pub fn summary_table(&self) -> String {
        let mut out = String::new();
        let t = self.total();
        let _ = writeln!(out, "reflector summary (backend {}):", self.backend);
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>8}",
            "group",
            "members",
            "received",
            "forwarded",
            "fanned",
            "nonmember",
            "malformed",
            "joins",
            "leaves",
            "enobufs"
        );
        let row = |out: &mut String, label: &str, s: &Snapshot| {
            let _ = writeln!(
                out,
                "{:>6} {:>8} {:>10} {:>10} {:>10} {:>9} {:>9} {:>7} {:>7} {:>8}",
                label,
                s.members,
                s.received,
                s.forwarded,
                s.fanned_out,
                s.dropped_non_member,
                s.malformed,
                s.joins,
                s.leaves,
                s.enobufs_waits
            );
        };
        for (p, g) in &self.groups {
            let s = g.snapshot();
            if s.received > 0 {
                row(&mut out, &p.to_string(), &s);
            }
        }
        row(&mut out, "total", &t);
        let other = t.wrong_group
            + t.stale_membership
            + t.bad_mac
            + t.bad_tag
            + t.replays
            + t.unvalidated
            + t.bad_token
            + t.expired_token
            + t.bad_cookie
            + t.group_full
            + t.address_limit
            + t.rate_limited
            + t.older_tokens
            + t.unexpected;
        let _ = writeln!(
            out,
            "refused joins/other drops: {other}; icmp errors: {}; eagain waits: {}; send errors: {}; reply bytes {} <= control bytes {}",
            t.icmp_errors, t.eagain_waits, t.send_errors, t.reply_bytes_out, t.control_bytes_in
        );
        let _ = writeln!(
            out,
            "lifetime: {} renewals, {} expired tokens, {} replaced; echo: {} replies, {} suppressed",
            t.renewals, t.expired_tokens, t.replaced, t.echo_replies, t.echo_suppressed
        );
        out
    }

    /// Machine-readable summary.
    pub fn to_json(&self) -> serde_json::Value {
        let groups: serde_json::Map<String, serde_json::Value> = self
            .groups
            .iter()
            .map(|(p, g)| (p.to_string(), serde_json::to_value(g.snapshot()).unwrap_or_default()))
            .collect();
        let ch = &self.channel;
        let channel = serde_json::json!({
            "busy": ch.busy.load(Relaxed),
            "malformed": ch.malformed.load(Relaxed),
            "timeouts": ch.timeouts.load(Relaxed),
            "hello_timeouts": ch.hello_timeouts.load(Relaxed),
            "evicted": ch.evicted.load(Relaxed),
            "memory_bytes": ch.memory_bytes.load(Relaxed),
        });
        serde_json::json!({
            "backend": self.backend,
            "total": self.total(),
            "groups": groups,
            "checkpoint_channel": channel,
        })
    }
}

/// The checkpoint channel's counters that name no group, and the memory
/// it holds (kept here with the other counters; the channel in
/// `checkpoint` updates them).
#[derive(Debug, Default)]
pub struct ChannelCounters {
    /// Connections refused at once: caps reached and every connection held
    /// authenticated.
    pub busy: AtomicU64,
    /// Requests that did not decode or named no group here.
    pub malformed: AtomicU64,
    /// Exchanges that passed their deadline (a peer that stopped reading or writing).
    pub timeouts: AtomicU64,
    /// Connections closed because no REQUEST came within the hello deadline.
    pub hello_timeouts: AtomicU64,
    /// Unauthenticated connections closed to make room for a new one.
    pub evicted: AtomicU64,
    /// Gauge: bytes of stored states plus bodies being received.
    pub memory_bytes: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The samples of a classic-text scrape (lines not starting with '#').
    fn series(text: &str) -> Vec<&str> {
        text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect()
    }

    #[test]
    fn aggregates_by_default_and_groups_on_request() {
        let r = Registry::new("sendto", &[4000, 4001]);
        r.groups[0].1.received.fetch_add(5, Relaxed);
        r.groups[1].1.received.fetch_add(2, Relaxed);
        r.groups[1].1.members.fetch_add(3, Relaxed);
        r.groups[0].1.bytes_in.fetch_add(100, Relaxed);
        r.groups[0].1.checkpoint_serve_us_sum.fetch_add(1_500_000, Relaxed);
        r.groups[0].1.rtt.observe_us(150);
        r.groups[1].1.rtt.observe_us(2_000_000);
        let text = r.prometheus(false);
        assert!(text.contains("\nreflector_received_total 7\n"), "{text}");
        assert!(text.contains("\nreflector_received_bytes_total 100\n"), "{text}");
        assert!(
            text.contains("\nreflector_checkpoint_serve_seconds_total 1.5\n"),
            "{text}"
        );
        assert!(text.contains("\nreflector_members 3\n"), "{text}");
        assert!(text.contains("# TYPE reflector_members gauge"));
        assert!(text.contains("# TYPE reflector_received_total counter"));
        assert!(text.contains("# HELP reflector_received_total Datagrams received on the group's port."));
        assert!(text.contains("reflector_build_info{version=\"") && text.contains("backend=\"sendto\"} 1"));
        assert!(
            text.contains("reflector_rtt_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("reflector_rtt_seconds_bucket{le=\"+Inf\"} 2\n"), "{text}");
        assert!(text.contains("reflector_rtt_seconds_count 2\n"), "{text}");
        assert!(text.contains("reflector_rtt_seconds_sum 2.00015\n"), "{text}");
        assert!(!text.contains("group="), "no per-group series by default:\n{text}");
        // The backend names only the build-info series.
        assert_eq!(text.lines().filter(|l| l.contains("backend=")).count(), 1, "{text}");
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("_us"), "no microsecond names: {text}");

        let per = r.prometheus(true);
        assert!(
            per.contains("reflector_group_received_total{group=\"4000\"} 5\n"),
            "{per}"
        );
        assert!(per.contains("reflector_group_received_total{group=\"4001\"} 2\n"));
        assert!(per.contains("reflector_group_members{group=\"4001\"} 3\n"));
        assert!(
            per.contains("reflector_group_rtt_seconds_count{group=\"4001\"} 1\n"),
            "{per}"
        );
        // Every family is all labelled or all unlabelled (the aggregates
        // stay, under their own names).
        assert!(per.contains("\nreflector_received_total 7\n"));
        for l in series(&per) {
            let name = l.split(['{', ' ']).next().unwrap();
            if name.starts_with("reflector_group_") {
                assert!(l.contains("group=\""), "{l}");
            } else {
                assert!(!l.contains("group="), "{l}");
            }
        }

        let om = Exposition::new(r.clone(), false).encode(Format::OpenMetrics);
        assert!(om.contains("# TYPE reflector_received counter\n"), "{om}");
        assert!(om.contains("\nreflector_received_total 7\n"));
        assert!(om.ends_with("# EOF\n"));

        // The receive pools, summed over the event loops.
        let mut r = r;
        r.receive_pools = vec![Arc::default(), Arc::default()];
        for (p, allocated) in r.receive_pools.iter().zip([64, 70]) {
            p.publish(crate::receive::PoolStats {
                preallocated: 64,
                allocated,
                held: 1,
                handed_out: 9,
                ..Default::default()
            });
        }
        let text = r.prometheus(false);
        for line in [
            "\nreflector_receive_buffers_preallocated 128\n",
            "\nreflector_receive_buffers_allocated_total 134\n",
            "\nreflector_receive_buffers_grown_total 6\n",
            "\nreflector_receive_buffers_held 2\n",
            "\nreflector_receive_buffers_handed_out_total 18\n",
            "\nreflector_receive_ring_buffers_returned_total 0\n",
        ] {
            assert!(text.contains(line), "{line} missing:\n{text}");
        }
        r.channel.busy.fetch_add(4, Relaxed);
        assert!(r
            .prometheus(false)
            .contains("\nreflector_checkpoint_channel_busy_total 4\n"));
        assert_eq!(r.total().received, 7);
        assert_eq!(r.to_json()["total"]["received"], 7);
        assert!(r.summary_table().contains("total"));
        r.groups[0].1.expired_tokens.fetch_add(2, Relaxed);
        assert!(r.summary_table().contains("2 expired tokens"), "{}", r.summary_table());
    }

    #[test]
    fn few_series_at_the_group_cap_unless_per_group() {
        let ports: Vec<u16> = (10_000..10_000 + 4096).collect();
        let mut r = Registry::new("sendmmsg", &ports);
        // As many event loops as a large machine has cores: their receive
        // pools are summed, so they add no series either.
        r.receive_pools = (0..64).map(|_| Arc::default()).collect();
        for (_, g) in &r.groups {
            g.received.fetch_add(1, Relaxed);
            g.rtt.observe_us(300);
        }
        let agg = r.prometheus(false);
        let n = series(&agg).len();
        assert!(n < 120, "{n} series with per-group off:\n{agg}");
        assert!(agg.contains("\nreflector_received_total 4096\n"));
        assert!(agg.contains("\nreflector_rtt_seconds_count 4096\n"));
        let per = r.prometheus(true);
        let groups: std::collections::HashSet<&str> = series(&per)
            .iter()
            .filter_map(|l| l.strip_prefix("reflector_group_received_total{group=\""))
            .map(|l| l.split('"').next().unwrap())
            .collect();
        assert_eq!(groups.len(), 4096);
        assert!(per.contains("reflector_group_received_total{group=\"14095\"} 1\n"));
        assert!(series(&per).len() > 4096 * 80, "{}", series(&per).len());
    }
}
