//! The in-kernel fan-out (`--backend ebpf`): paper 000's kernel reflector
//! (§4.2-4.4: the member list in the kernel, one packet per member made by
//! rewriting headers) as a TC program on a stock kernel.
//!
//! `ebpf/fanout.bpf.c` replicates each member's DATA inside the kernel; this
//! module is its control plane, the paper's `UDP_MCAST_ADD/DEL`: it loads
//! the program, attaches it with TCX links on the ingress of every IPv4
//! device but loopback (a datagram to the group's address may arrive on any
//! of them), and keeps three maps in step with the membership core: the
//! groups (the socket's address, and each one's destinations: address, port,
//! egress device, source address and Ethernet addresses, resolved over
//! rtnetlink at join and followed in the neighbour table at every sweep),
//! the members (to check a sender: ids, tag key, replay window, a count of
//! its DATA as a sign of life) and per-group counters.
//!
//! The links belong to this process's file descriptors and are not pinned:
//! they go when the process goes, `kill -9` included, so a crash never
//! leaves an amplifier in the kernel and there is nothing to sweep at the
//! next start. Everything the program does not take (control datagrams,
//! non-members, fragments, a group in user-space mode) reaches the socket
//! as before and the membership core judges it; such DATA is fanned out by
//! the `sendmmsg` backend, and its sequence number is checked against the
//! kernel's window too, so neither path can replay what the other accepted.
//!
//! The LEAVE fence: the program cannot check a LEAVE's MAC, so a LEAVE from a
//! member's address with its ids makes it pass the group's DATA up until this
//! module has seen the membership core judge that LEAVE (and, if it was
//! valid, remove the member from the map); DATA that arrived after a LEAVE
//! then queues behind it in the socket and is served in order, so the
//! leaving member gets no copy of it. A fenced LEAVE lost on a full socket
//! buffer holds the group in user space only until the socket is next found
//! empty with no fenced LEAVE for `RESYNC_AGE` (`drained`).

pub mod fanout;
mod resend;
mod route;
mod sys;

use crate::backend::user::{RateCaps, ResendTarget, Support};
use crate::liveness::Watch;
use crate::membership::Member;
use crate::metrics::GroupCounters;
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::links::LinkOrder;
use aya::programs::tc::TcAttachOptions;
use aya::programs::{SchedClassifier, TcAttachType};
use aya::Ebpf;
use reflector_proto::protocol::{field, ReplayWindow};
use route::{NextHop, Resolver, Unresolved};
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;
use sys::{
    Counters, Dest, GroupValue, MemberKey, MemberValue, GROUP_PASS_UP, GROUP_TAGS, MAX_MEMBERS, PROTO_LEAVE,
    PROTO_LEAVE_LEN,
};

use resend::resend_loop;
pub use sys::MAX_MEMBERS as MAX_KERNEL_MEMBERS;

const PROGRAM: &str = "reflector_fanout";
/// `BPF_F_LOCK`, `BPF_EXIST` (uapi): read and write a member under its
/// spin lock, only if it is still there.
const BPF_F_LOCK: u64 = 4;
const BPF_EXIST: u64 = 2;

/// Loads the program (verifier included) and unloads it: whether this
/// kernel and these privileges can run the backend.
pub fn probe() -> Support {
    match load() {
        Ok(_) => Support::Supported,
        Err(e) => Support::Unsupported(e),
    }
}

/// The capabilities loading and attaching the program needs, and which of
/// them this process lacks (none when the set cannot be read).
const NEEDS: [oskit::caps::Cap; 3] = [
    oskit::caps::Cap::Bpf,
    oskit::caps::Cap::NetAdmin,
    oskit::caps::Cap::Perfmon,
];

fn lacking() -> Vec<&'static str> {
    match oskit::caps::effective() {
        Ok(have) => NEEDS.iter().filter(|c| !have.has(**c)).map(|c| c.name()).collect(),
        Err(_) => Vec::new(),
    }
}

fn load() -> Result<Ebpf, String> {
    // A verifier log is no way to learn that a capability is missing (the
    // kernel refuses pointer arithmetic without CAP_PERFMON, say): named first.
    let missing = lacking();
    if !missing.is_empty() {
        return Err(format!(
            "the eBPF fan-out needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON; this process lacks {} \
             (run as root, or grant them: setcap, or AmbientCapabilities= as in deploy/systemd/reflector-ebpf.service)",
            missing.join(", ")
        ));
    }
    let mut ebpf = Ebpf::load(sys::object()).map_err(|e| {
        let why = match &e {
            aya::EbpfError::MapError(_) => ": creating maps needs CAP_BPF and CAP_NET_ADMIN (root)",
            _ => "",
        };
        format!("cannot load the eBPF fan-out's object ({e}){why}")
    })?;
    let prog: &mut SchedClassifier = ebpf
        .program_mut(PROGRAM)
        .ok_or_else(|| format!("the eBPF object has no program {PROGRAM}"))?
        .try_into()
        .map_err(|e| format!("{PROGRAM} is not a TC program: {e}"))?;
    prog.load().map_err(|e| match e {
        aya::programs::ProgramError::LoadError { io_error, verifier_log } => {
            // The verifier's verdict is at the end of its log.
            let log = verifier_log.to_string();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            format!("the kernel refused the eBPF fan-out program ({io_error}); end of the verifier's log:\n{tail}")
        }
        e => format!("cannot load the eBPF fan-out program: {e}"),
    })?;
    Ok(ebpf)
}

/// `net.core.netdev_max_backlog`: every clone waits in the sending CPU's
/// backlog queue, which a large group overflows unless it is raised. The
/// setting exists only in the initial network namespace; `None` elsewhere.
pub fn netdev_max_backlog() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/net/core/netdev_max_backlog")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Ports, addresses and ids as the program reads them from the packet.
fn be_ip(ip: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(ip.octets())
}

fn be_port(port: u16) -> u16 {
    u16::from_ne_bytes(port.to_be_bytes())
}

fn member_key(group: u16, addr: SocketAddrV4) -> MemberKey {
    MemberKey {
        ip: be_ip(*addr.ip()),
        port: be_port(addr.port()),
        group: be_port(group),
    }
}

/// A destination; its source is the bound address, or for a socket bound
/// to any address the one the kernel would pick towards the member.
fn dest(a: SocketAddrV4, hop: &NextHop, bind: Option<Ipv4Addr>) -> Option<Dest> {
    Some(Dest {
        ip: be_ip(*a.ip()),
        port: be_port(a.port()),
        pad: 0,
        ifindex: hop.ifindex,
        sip: be_ip(bind.or(hop.src)?),
        dmac: hop.dmac,
        smac: hop.smac,
    })
}

/// The union of two windows of one membership (each holds sequence
/// numbers the other may not have seen).
fn merge(a: ReplayWindow, b: ReplayWindow) -> ReplayWindow {
    let (hi, lo) = if a.highest >= b.highest { (a, b) } else { (b, a) };
    let shift = hi.highest - lo.highest;
    let lo_bits = if shift >= 64 { 0 } else { lo.bitmap << shift };
    ReplayWindow {
        highest: hi.highest,
        bitmap: hi.bitmap | lo_bits,
    }
}

/// One group as the kernel path knows it.
struct KGroup {
    id: u32,
    tags: bool,
    /// Members the program replicates to, in map order, with their next
    /// hop's address (to follow its neighbour entry).
    dests: Vec<(SocketAddrV4, Dest, Ipv4Addr)>,
    /// Members it cannot reach yet (no neighbour entry) or ever (not behind
    /// an Ethernet device): while any exists the group is served in user
    /// space, where every member is a plain destination.
    unresolved: Vec<(SocketAddr, Unresolved)>,
    /// Each kernel member's DATA count at the last sync.
    data_in: HashMap<SocketAddrV4, u64>,
    /// The per-CPU counters summed at the last sync.
    seen: Counters,
    warned: bool,
    /// What this module last wrote to `leave_done`.
    leave_done: u64,
    /// `leave_seen` as read when the socket was found empty, and when: if
    /// it is still the same at a later drain at least `RESYNC_AGE` on, every
    /// LEAVE it counts has reached the socket and been judged, or was lost.
    resync: Option<(u64, Instant)>,
    /// Resynchronisations not yet added to the group's counters.
    resyncs: u64,
}

impl KGroup {
    fn pass_up(&self) -> bool {
        !self.unresolved.is_empty() || self.dests.len() > MAX_MEMBERS
    }
}

/// The loaded program, its links and maps: one per server, shared by its
/// event loops.
pub struct KernelPath {
    /// Holds the program and its TCX links: dropping it detaches them.
    _ebpf: Ebpf,
    groups_map: BpfHashMap<MapData, u16, GroupValue>,
    members_map: BpfHashMap<MapData, MemberKey, MemberValue>,
    counters_map: PerCpuArray<MapData, Counters>,
    resolver: Resolver,
    /// The group sockets' address, `None` for any.
    bind: Option<Ipv4Addr>,
    caps: RateCaps,
    devices: Vec<String>,
    groups: HashMap<u16, KGroup>,
    /// Windows of members just removed, by (group, membership id): a
    /// rebinding removes and re-adds the same membership, which must keep
    /// what the kernel accepted.
    removed: HashMap<(u16, u32), ReplayWindow>,
    backlog: Option<u64>,
    /// The ring of copies the program could not send, until the resend
    /// thread takes it.
    ring: Option<RingBuf<MapData>>,
    /// How many of each group's handed-up copies the resend thread dealt
    /// with (the program compares it with its own count of them).
    resent: Option<Array<MapData, u64>>,
    held: Array<MapData, u64>,
    /// The LEAVE fence: the program counts fenced LEAVEs in `leave_seen`,
    /// this module the judged ones in `leave_done`.
    leave_seen: Array<MapData, u64>,
    leave_done: Array<MapData, u64>,
    resender: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

/// How long a fenced LEAVE counted by the program may still be on its way
/// to the socket: the stack takes microseconds from TC to the socket's
/// queue, so a count unchanged for this long across a drain is complete.
const RESYNC_AGE: Duration = Duration::from_millis(1);

impl Drop for KernelPath {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.resender.take() {
            stop.store(true, Relaxed);
            let _ = h.join();
        }
    }
}

pub type SharedKernel = Arc<Mutex<KernelPath>>;

/// One second's worth of tokens, in the program's 1e-9 units.
const NS_PER_S: u64 = 1_000_000_000;

fn take_map(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map, String> {
    ebpf.take_map(name)
        .ok_or_else(|| format!("the eBPF object has no map {name}"))
}

impl KernelPath {
    /// Loads the program and attaches it to the ingress of every Ethernet
    /// device that carries `bind` (every one with an IPv4 address if `bind`
    /// is unspecified), in the calling thread's network namespace.
    pub fn start(bind: IpAddr, caps: RateCaps) -> Result<KernelPath, String> {
        let IpAddr::V4(bind) = bind else {
            return Err(format!(
                "the eBPF fan-out handles IPv4 only; {bind} needs a user-space backend"
            ));
        };
        let devices = devices_with(bind)?;
        let mut ebpf = load()?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| format!("the eBPF object has no TC program {PROGRAM}"))?;
        for dev in &devices {
            prog.attach_with_options(
                dev,
                TcAttachType::Ingress,
                TcAttachOptions::TcxOrder(LinkOrder::default()),
            )
            .map_err(|e| {
                format!("cannot attach the eBPF fan-out to {dev} with a TCX link ({e}): TCX needs Linux 6.6 or newer")
            })?;
        }
        let groups_map =
            BpfHashMap::try_from(take_map(&mut ebpf, "groups")?).map_err(|e| format!("map groups: {e}"))?;
        let members_map =
            BpfHashMap::try_from(take_map(&mut ebpf, "members")?).map_err(|e| format!("map members: {e}"))?;
        let counters_map =
            PerCpuArray::try_from(take_map(&mut ebpf, "counters")?).map_err(|e| format!("map counters: {e}"))?;
        let ring = RingBuf::try_from(take_map(&mut ebpf, "resend")?).map_err(|e| format!("map resend: {e}"))?;
        let resent = Array::try_from(take_map(&mut ebpf, "resent")?).map_err(|e| format!("map resent: {e}"))?;
        let held = Array::try_from(take_map(&mut ebpf, "held")?).map_err(|e| format!("map held: {e}"))?;
        let leave_seen =
            Array::try_from(take_map(&mut ebpf, "leave_seen")?).map_err(|e| format!("map leave_seen: {e}"))?;
        let leave_done =
            Array::try_from(take_map(&mut ebpf, "leave_done")?).map_err(|e| format!("map leave_done: {e}"))?;
        let resolver = Resolver::new().map_err(|e| format!("cannot open rtnetlink: {e}"))?;
        let backlog = netdev_max_backlog();
        Ok(KernelPath {
            _ebpf: ebpf,
            groups_map,
            members_map,
            counters_map,
            resolver,
            bind: (!bind.is_unspecified()).then_some(bind),
            caps,
            devices,
            groups: HashMap::new(),
            removed: HashMap::new(),
            backlog,
            ring: Some(ring),
            resent: Some(resent),
            held,
            leave_seen,
            leave_done,
            resender: None,
        })
    }

    /// Starts the thread that resends what the program could not (a full
    /// qdisc or device queue): it waits on the ring buffer and sends each
    /// copy through its group's socket, waiting out EAGAIN and ENOBUFS as
    /// the user-space backends do, so a full queue loses nothing in the
    /// kernel path either.
    pub fn start_resend(&mut self, targets: Vec<ResendTarget>, watch: &mut Watch) -> io::Result<()> {
        let (Some(ring), Some(resent)) = (self.ring.take(), self.resent.take()) else {
            return Ok(());
        };
        // Group ids now, so the thread knows each target's counter slot;
        // the event loops set each group's tags when they attach it.
        let ids: Vec<u32> = targets.iter().map(|t| self.group_id(t.port)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let h = watch.spawn("reflector-resend", move || {
            resend_loop(ring, resent, &targets, &ids, &stop2)
        })?;
        self.resender = Some((stop, h));
        Ok(())
    }

    /// The devices the program is attached to.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// `net.core.netdev_max_backlog` as read at start, if visible here.
    pub fn backlog(&self) -> Option<u64> {
        self.backlog
    }

    /// The group's index into the per-group arrays, made on first use.
    fn group_id(&mut self, port: u16) -> u32 {
        let next = self.groups.len() as u32;
        self.groups
            .entry(port)
            .or_insert_with(|| KGroup {
                id: next,
                tags: false,
                dests: Vec::new(),
                unresolved: Vec::new(),
                data_in: HashMap::new(),
                seen: Counters::default(),
                warned: false,
                leave_done: 0,
                resync: None,
                resyncs: 0,
            })
            .id
    }

    fn add_group(&mut self, port: u16, tags: bool) -> io::Result<()> {
        self.group_id(port);
        if let Some(g) = self.groups.get_mut(&port) {
            g.tags = tags;
        }
        self.write_group(port)
    }

    /// Replaces the group's map value whole (see the map's comment in the
    /// program: a running fan-out keeps the list it started with).
    fn write_group(&mut self, port: u16) -> io::Result<()> {
        let Some(g) = self.groups.get(&port) else {
            return Ok(());
        };
        let mut v = Box::new(GroupValue {
            id: g.id,
            flags: if g.tags { GROUP_TAGS } else { 0 },
            count: 0,
            addr: self.bind.map_or(0, be_ip),
            pps: self.caps.pps,
            bps: self.caps.bytes_per_s,
            dest: [Dest::default(); MAX_MEMBERS],
        });
        if g.pass_up() {
            v.flags |= GROUP_PASS_UP;
        } else {
            for (slot, (_, d, _)) in v.dest.iter_mut().zip(&g.dests) {
                *slot = *d;
            }
            v.count = g.dests.len() as u32;
        }
        self.groups_map
            .insert(be_port(port), *v, 0)
            .map_err(|e| io::Error::other(format!("updating group {port} in the kernel: {e}")))
    }

    fn member_added(&mut self, port: u16, addr: SocketAddr, m: &Member) {
        let SocketAddr::V4(a4) = addr else {
            self.unresolved(port, addr, Unresolved::NotEthernet("an IPv6 member".into()));
            return;
        };
        let Some(g) = self.groups.get(&port) else {
            return;
        };
        let tags = g.tags;
        let tag = m.keys.tag_key();
        let mut window = m.window;
        if let Some(w) = self.removed.remove(&(port, m.membership)) {
            window = merge(window, w);
        }
        let value = MemberValue {
            player: m.sender.to_be(),
            membership: m.membership.to_be(),
            k0: u64::from_le_bytes(tag[..8].try_into().unwrap_or_default()),
            k1: u64::from_le_bytes(tag[8..].try_into().unwrap_or_default()),
            highest: window.highest,
            bitmap: window.bitmap,
            // Full buckets, as the membership core starts them.
            rate_pkts: u64::from(self.caps.pps) * NS_PER_S,
            rate_bytes: u64::from(self.caps.bytes_per_s) * NS_PER_S,
            ..MemberValue::default()
        };
        if tags != m.tags {
            // The membership core gives every member the group's setting;
            // a mismatch would let the program judge it by the wrong rule.
            tracing::warn!(
                "member {addr} of group {port} has DATA tags {} unlike its group",
                m.tags
            );
        }
        if let Err(e) = self.members_map.insert(member_key(port, a4), value, 0) {
            tracing::warn!("group {port}: cannot add member {addr} to the kernel ({e}); served in user space");
            self.unresolved(port, addr, Unresolved::NotEthernet(format!("member map full: {e}")));
            return;
        }
        match self.resolver.resolve(*a4.ip()) {
            Ok(Ok(hop)) => {
                let Some(d) = dest(a4, &hop, self.bind) else {
                    self.unresolved(
                        port,
                        addr,
                        Unresolved::NotEthernet("no source address towards it".into()),
                    );
                    return;
                };
                if let Some(g) = self.groups.get_mut(&port) {
                    g.dests.push((a4, d, hop.hop));
                    g.data_in.insert(a4, 0);
                }
                self.write_group_logged(port);
            }
            Ok(Err(why)) => self.unresolved(port, addr, why),
            Err(e) => self.unresolved(port, addr, Unresolved::NotEthernet(format!("rtnetlink: {e}"))),
        }
    }

    fn unresolved(&mut self, port: u16, addr: SocketAddr, why: Unresolved) {
        tracing::info!("group {port}: member {addr} is served in user space for now: {why:?}");
        if let Some(g) = self.groups.get_mut(&port) {
            g.unresolved.push((addr, why));
        }
        self.write_group_logged(port);
    }

    fn write_group_logged(&mut self, port: u16) {
        if let Err(e) = self.write_group(port) {
            tracing::warn!("{e}");
        }
    }

    fn member_removed(&mut self, port: u16, addr: SocketAddr) {
        let Some(g) = self.groups.get_mut(&port) else {
            return;
        };
        g.unresolved.retain(|(a, _)| *a != addr);
        if let SocketAddr::V4(a4) = addr {
            g.dests.retain(|(a, _, _)| *a != a4);
            g.data_in.remove(&a4);
            let key = member_key(port, a4);
            if let Ok(v) = self.members_map.get(&key, BPF_F_LOCK) {
                let w = ReplayWindow {
                    highest: v.highest,
                    bitmap: v.bitmap,
                };
                self.removed.insert((port, u32::from_be(v.membership)), w);
                let _ = self.members_map.remove(&key);
            }
        }
        self.write_group_logged(port);
    }

    /// Members whose neighbour was not resolved yet get another try.
    fn retry_unresolved(&mut self, port: u16) {
        let Some(g) = self.groups.get_mut(&port) else {
            return;
        };
        let waiting: Vec<(SocketAddr, Ipv4Addr)> = g
            .unresolved
            .iter()
            .filter_map(|(a, why)| match (a, why) {
                (SocketAddr::V4(a4), Unresolved::Neighbour(_)) => Some((*a, *a4.ip())),
                _ => None,
            })
            .collect();
        let mut changed = false;
        for (addr, ip) in waiting {
            if let Ok(Ok(hop)) = self.resolver.resolve(ip) {
                let SocketAddr::V4(a4) = addr else { continue };
                let Some(d) = dest(a4, &hop, self.bind) else { continue };
                let Some(g) = self.groups.get_mut(&port) else { return };
                g.unresolved.retain(|(a, _)| *a != addr);
                g.dests.push((a4, d, hop.hop));
                g.data_in.insert(a4, 0);
                changed = true;
            }
        }
        // Next hops whose neighbour entry changed (a new MAC) or went away
        // (back to user space, which makes the kernel resolve it again).
        if self.groups.get(&port).is_some_and(|g| !g.dests.is_empty()) {
            match self.resolver.neighbours() {
                Ok(table) => {
                    let Some(g) = self.groups.get_mut(&port) else { return };
                    let mut gone = Vec::new();
                    for (a, d, hop) in g.dests.iter_mut() {
                        match table.get(&(d.ifindex, *hop)) {
                            Some(mac) if *mac != d.dmac => {
                                d.dmac = *mac;
                                changed = true;
                            }
                            Some(_) => {}
                            None => gone.push((*a, *hop)),
                        }
                    }
                    for (a, hop) in gone {
                        g.dests.retain(|(x, _, _)| *x != a);
                        g.unresolved.push((SocketAddr::V4(a), Unresolved::Neighbour(hop)));
                        changed = true;
                    }
                }
                Err(e) => tracing::warn!("group {port}: cannot read the neighbour table: {e}"),
            }
        }
        if changed {
            self.write_group_logged(port);
        }
    }

    fn sync(&mut self, port: u16, c: &GroupCounters, heard: &mut dyn FnMut(SocketAddr)) {
        self.retry_unresolved(port);
        // Rebindings are paired within one batch of changes: what is left
        // here belongs to memberships that ended.
        self.removed.retain(|(p, _), _| *p != port);
        let backlog = self.backlog;
        let Some(g) = self.groups.get_mut(&port) else {
            return;
        };
        if let Ok(per_cpu) = self.counters_map.get(&g.id, 0) {
            let mut sum = Counters::default();
            for v in per_cpu.iter() {
                sum.forwarded += v.forwarded;
                sum.copies += v.copies;
                sum.bytes_out += v.bytes_out;
                sum.clone_errors += v.clone_errors;
                sum.bad_tag += v.bad_tag;
                sum.replays += v.replays;
                sum.passed_up += v.passed_up;
                sum.bytes_in += v.bytes_in;
                sum.queued += v.queued;
                sum.lost += v.lost;
                sum.rate_limited += v.rate_limited;
                sum.leave_fences += v.leave_fences;
            }
            let d = |now: u64, then: u64| now.saturating_sub(then);
            let s = g.seen;
            let forwarded = d(sum.forwarded, s.forwarded);
            let (bad_tag, replays) = (d(sum.bad_tag, s.bad_tag), d(sum.replays, s.replays));
            let limited = d(sum.rate_limited, s.rate_limited);
            c.received.fetch_add(forwarded + bad_tag + replays + limited, Relaxed);
            c.bytes_in.fetch_add(d(sum.bytes_in, s.bytes_in), Relaxed);
            c.forwarded.fetch_add(forwarded, Relaxed);
            c.kernel_forwarded.fetch_add(forwarded, Relaxed);
            c.fanned_out.fetch_add(d(sum.copies, s.copies), Relaxed);
            c.kernel_copies.fetch_add(d(sum.copies, s.copies), Relaxed);
            c.bytes_out.fetch_add(d(sum.bytes_out, s.bytes_out), Relaxed);
            c.send_errors.fetch_add(d(sum.lost, s.lost), Relaxed);
            c.kernel_clone_errors
                .fetch_add(d(sum.clone_errors, s.clone_errors), Relaxed);
            c.bad_tag.fetch_add(bad_tag, Relaxed);
            c.rate_limited.fetch_add(d(sum.rate_limited, s.rate_limited), Relaxed);
            c.replays.fetch_add(replays, Relaxed);
            c.kernel_passed_up.fetch_add(d(sum.passed_up, s.passed_up), Relaxed);
            c.kernel_leave_fences
                .fetch_add(d(sum.leave_fences, s.leave_fences), Relaxed);
            g.seen = sum;
        }
        c.kernel_leave_resyncs
            .fetch_add(std::mem::take(&mut g.resyncs), Relaxed);
        for (addr, last) in g.data_in.iter_mut() {
            if let Ok(v) = self.members_map.get(&member_key(port, *addr), 0) {
                if v.data_in > *last {
                    *last = v.data_in;
                    heard(SocketAddr::V4(*addr));
                }
            }
        }
        let size = g.dests.len() + g.unresolved.len();
        if !g.warned {
            if size > MAX_MEMBERS {
                g.warned = true;
                tracing::warn!(
                    "group {port} has {size} members, more than the {MAX_MEMBERS} the kernel path holds: it is served in user space"
                );
            } else if let Some(b) = backlog.filter(|&b| size as u64 > b) {
                g.warned = true;
                tracing::warn!(
                    "group {port} has {size} members but net.core.netdev_max_backlog is {b}: every copy waits in that queue, so raise it above the largest group (copies beyond it are dropped by the kernel)"
                );
            }
        }
    }

    /// Holds the group's DATA in user space (`on`) or gives it back to the
    /// program.
    fn hold(&mut self, port: u16, on: bool) {
        let id = self.group_id(port);
        if let Err(e) = self.held.set(id, u64::from(on), 0) {
            tracing::warn!(
                "group {port}: cannot {} the kernel path: {e}",
                if on { "hold" } else { "release" }
            );
        }
    }

    /// Whether the program fenced the group for `datagram` from `from`:
    /// its own test (see `leave_seen` in fanout.h) against the member map as
    /// it is now, before the membership core judges the datagram. The map
    /// can have changed since the LEAVE passed the program: a duplicate
    /// LEAVE or an expiry in between leaves a LEAVE counted but not judged,
    /// a member rebound to the LEAVE's address one judged but not counted.
    /// Either makes the counts differ, which holds the group in user space
    /// until `drained` puts them right; only the second, offsetting a LEAVE
    /// still queued, could let the program resume before that one is judged.
    fn fenced_leave(&self, port: u16, from: SocketAddr, datagram: &[u8]) -> bool {
        let SocketAddr::V4(a4) = from else {
            return false;
        };
        let Some(h) = datagram
            .get(..PROTO_LEAVE_LEN)
            .filter(|_| datagram.len() == PROTO_LEAVE_LEN)
        else {
            return false;
        };
        let length = (PROTO_LEAVE_LEN - reflector_proto::protocol::HEADER_LEN) as u16;
        if h[field::MAGIC] != reflector_proto::protocol::MAGIC.to_be_bytes()
            || h[field::VERSION] != reflector_proto::protocol::VERSION
            || h[field::KIND] != PROTO_LEAVE
            || h[field::GROUP] != port.to_be_bytes()
            || h[field::LENGTH] != length.to_be_bytes()
        {
            return false;
        }
        let Ok(v) = self.members_map.get(&member_key(port, a4), 0) else {
            return false;
        };
        // Both as they sit in the packet.
        h[field::SENDER] == v.player.to_ne_bytes() && h[field::MEMBERSHIP] == v.membership.to_ne_bytes()
    }

    /// A fenced LEAVE was judged (the member removed first if it was
    /// valid): once all are, the program takes the group back.
    fn leave_judged(&mut self, port: u16) {
        let Some(g) = self.groups.get_mut(&port) else {
            return;
        };
        g.leave_done += 1;
        if let Err(e) = self.leave_done.set(g.id, g.leave_done, 0) {
            tracing::warn!("group {port}: cannot count a judged LEAVE: {e}");
        }
    }

    /// The group's socket was found empty. A fenced LEAVE that never reached
    /// it (dropped on a full receive buffer, which anyone on the path can
    /// cause) would hold the group in user space for ever: when the
    /// program's count differs from the judged one and has not moved since
    /// a drain at least `RESYNC_AGE` ago, every LEAVE it counts has been
    /// judged or lost, so the judged count becomes the program's.
    fn drained(&mut self, port: u16) {
        let Some(g) = self.groups.get_mut(&port) else {
            return;
        };
        let Ok(seen) = self.leave_seen.get(&g.id, 0) else {
            return;
        };
        if seen == g.leave_done {
            g.resync = None;
            return;
        }
        match g.resync {
            Some((s, at)) if s == seen => {
                if at.elapsed() >= RESYNC_AGE {
                    g.resync = None;
                    g.leave_done = seen;
                    g.resyncs += 1;
                    if let Err(e) = self.leave_done.set(g.id, seen, 0) {
                        tracing::warn!("group {port}: cannot resynchronise the LEAVE fence: {e}");
                    }
                }
            }
            _ => g.resync = Some((seen, Instant::now())),
        }
    }

    fn accept_data(&mut self, port: u16, from: SocketAddr, datagram: &[u8]) -> bool {
        let SocketAddr::V4(a4) = from else {
            return true;
        };
        let Some(seq) = datagram
            .get(field::SEQ)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
        else {
            return true;
        };
        let key = member_key(port, a4);
        let Ok(mut v) = self.members_map.get(&key, BPF_F_LOCK) else {
            return true;
        };
        let mut w = ReplayWindow {
            highest: v.highest,
            bitmap: v.bitmap,
        };
        if !w.accept(seq) {
            return false;
        }
        // Between this read and the write below the program may accept
        // another sequence number of the same member; losing that bit only
        // makes the kernel's window forget one datagram it forwarded, and
        // this path is taken only by the rare DATA the program passes up.
        v.highest = w.highest;
        v.bitmap = w.bitmap;
        let _ = self.members_map.insert(key, v, BPF_F_LOCK | BPF_EXIST);
        true
    }
}

/// Every device with an IPv4 address but loopback (a copy cannot be
/// cloned to a loopback peer): a datagram to the group's address may arrive
/// on any of them. `bind`, unless unspecified, must be on one.
fn devices_with(bind: Ipv4Addr) -> Result<Vec<String>, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("cannot list interfaces: {e}"))?;
    let mut devs = Vec::new();
    let mut bound = bind.is_unspecified();
    for ifa in addrs {
        let Some(ip) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()).map(|s| s.ip()) else {
            continue;
        };
        if ifa.flags.contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK) {
            continue;
        }
        bound |= ip == bind;
        if !devs.contains(&ifa.interface_name) {
            devs.push(ifa.interface_name);
        }
    }
    if !bound || devs.is_empty() {
        return Err(format!(
            "no Ethernet device carries {bind}: the eBPF fan-out replicates on devices, not on loopback"
        ));
    }
    Ok(devs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_passes_the_verifier() {
        if !oskit::testing::root_or_skip("the_program_passes_the_verifier") {
            return;
        }
        assert_eq!(probe(), Support::Supported);
    }

    #[test]
    fn windows_merge_as_sets() {
        let mut a = ReplayWindow::default();
        let mut b = ReplayWindow::default();
        for s in [1, 2, 5] {
            a.accept(s);
        }
        for s in [3, 70] {
            b.accept(s);
        }
        let m = merge(a, b);
        assert_eq!(m.highest, 70);
        // 5 is 65 back from 70: outside the window, as old as a replay.
        for s in [3, 70] {
            assert!(!m.fresh(s), "{s} was seen");
        }
        assert!(m.fresh(69) && m.fresh(7) && !m.fresh(5));
        assert_eq!(merge(b, a), m);
        let mut c = ReplayWindow::default();
        for s in [60, 61] {
            c.accept(s);
        }
        let m2 = merge(a, c);
        for s in [5, 60, 61] {
            assert!(!m2.fresh(s));
        }
        assert!(m2.fresh(3) && m2.fresh(62));
    }

    #[test]
    fn addresses_and_ports_in_packet_order() {
        let k = member_key(4000, "10.0.0.2:1234".parse().unwrap());
        assert_eq!(k.ip.to_ne_bytes(), [10, 0, 0, 2]);
        assert_eq!(k.port.to_ne_bytes(), 1234u16.to_be_bytes());
        assert_eq!(k.group.to_ne_bytes(), 4000u16.to_be_bytes());
    }
}
