//! The lab as data: nodes, links and their parameters. No I/O here.

use crate::error::ModelError;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What a node is, which decides how it is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// A network namespace with its interfaces and a default route.
    Host,
    /// A Linux bridge (layer 2), living in the run's fabric namespace.
    Switch,
    /// A namespace with forwarding on and static (ECMP) routes.
    Router,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub kind: NodeKind,
    /// Optional CPU list (taskset syntax, e.g. "0" or "0-1") for processes
    /// started in this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
}

/// Link parameters, applied in each direction (as Mininet does): a link with
/// 1 ms delay has a 2 ms round trip.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkParams {
    /// Rate limit in bits per second (HTB); `None` is unshaped.
    pub bw_bps: Option<u64>,
    pub delay_ns: u64,
    /// Uniform jitter in +/- nanoseconds around `delay_ns`.
    pub jitter_ns: u64,
    /// Loss probability in parts per million.
    pub loss_ppm: u32,
    /// Queue length in packets (the HTB leaf fifo, or the delay line buffer).
    pub queue: Option<u32>,
}

pub const MIN_RATE_BPS: u64 = 10_000;
pub const MAX_RATE_BPS: u64 = 100_000_000_000;
pub const MAX_DELAY_NS: u64 = 10_000_000_000;
pub const MAX_QUEUE: u32 = 1_000_000;

impl LinkParams {
    /// True when the link needs more than a rate limit: delay, jitter or loss.
    pub fn needs_delay_stage(&self) -> bool {
        self.delay_ns > 0 || self.jitter_ns > 0 || self.loss_ppm > 0
    }

    pub fn validate(&self, item: &str) -> Result<(), ModelError> {
        if let Some(bw) = self.bw_bps {
            if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&bw) {
                return Err(ModelError::OutOfRange {
                    item: format!("{item}.bw"),
                    value: crate::units::fmt_rate(bw),
                    range: "between 10kbit and 100gbit".into(),
                });
            }
        }
        for (n, v) in [("delay", self.delay_ns), ("jitter", self.jitter_ns)] {
            if v > MAX_DELAY_NS {
                return Err(ModelError::OutOfRange {
                    item: format!("{item}.{n}"),
                    value: crate::units::fmt_duration(v),
                    range: "at most 10s".into(),
                });
            }
        }
        if self.jitter_ns > self.delay_ns {
            return Err(ModelError::OutOfRange {
                item: format!("{item}.jitter"),
                value: crate::units::fmt_duration(self.jitter_ns),
                range: format!(
                    "at most the delay ({}) so that no frame leaves before it arrived",
                    crate::units::fmt_duration(self.delay_ns)
                ),
            });
        }
        if self.loss_ppm > 1_000_000 {
            return Err(ModelError::OutOfRange {
                item: format!("{item}.loss"),
                value: format!("{}%", self.loss_ppm as f64 / 1e4),
                range: "between 0% and 100%".into(),
            });
        }
        if let Some(q) = self.queue {
            if q == 0 || q > MAX_QUEUE {
                return Err(ModelError::OutOfRange {
                    item: format!("{item}.queue"),
                    value: q.to_string(),
                    range: format!("between 1 and {MAX_QUEUE} packets"),
                });
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Link {
    pub a: String,
    pub b: String,
    #[serde(default)]
    pub params: LinkParams,
}

/// A whole topology. Built-in generators produce one; a scenario may also
/// list nodes and links itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub name: String,
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// Settings of single devices that no `ip` or `tc` command makes
    /// (receive packet steering), applied once the devices are up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_settings: Vec<DeviceSetting>,
    /// More addresses on a host's device, routed from the link's other end.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub address_blocks: Vec<AddressBlock>,
    /// Devices that discard what is sent to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub discard_devices: Vec<DiscardDevice>,
}

/// A setting of one device of a host or router, written to the device's
/// files under `/sys/class/net` inside the node's namespace once the device
/// is up (the plan's [`Op::Sysfs`](crate::plan::Op::Sysfs)). Nothing to
/// undo: the device, and what was written to it, go with the namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSetting {
    /// The host or router the device belongs to.
    pub node: String,
    /// The device as the plan names it: a node's device on its k-th link
    /// (in the order of the topology's links) is `eth<k>`.
    pub dev: String,
    pub set: Sysfs,
}

/// What a [`DeviceSetting`] writes: typed settings with fixed files and
/// checked values, never a free path or a shell line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sysfs {
    /// Receive packet steering (RPS): the receive softirq of every receive
    /// queue of the device runs on these CPUs (`queues/rx-*/rps_cpus`).
    RpsCpus(CpuList),
}

impl Sysfs {
    /// The files, relative to the device's directory, as a shell glob.
    pub fn files(&self) -> &'static str {
        match self {
            Sysfs::RpsCpus(_) => "queues/rx-*/rps_cpus",
        }
    }

    /// The text written to each file.
    pub fn value(&self) -> String {
        match self {
            Sysfs::RpsCpus(c) => c.kernel_mask(),
        }
    }

    /// Two settings of the same kind on one device would overwrite each
    /// other.
    fn same_kind(&self, other: &Sysfs) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// Addresses a host holds beyond its link's own: each a /32 on one of its
/// devices, for programs that need many endpoints with addresses of their
/// own behind one link (a benchmark's group members, each at its own
/// address as game clients are). The host at the other end of that link
/// reaches them through a route to `net` over the link and a permanent
/// neighbour entry per address (no ARP before or during a measurement).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddressBlock {
    /// The host that holds the addresses.
    pub node: String,
    /// Its device, named as the plan names it (`eth<k>`, see
    /// [`DeviceSetting::dev`]); the link on it must end at a host or
    /// router (a switch would leave no single peer to route from).
    pub dev: String,
    /// The network every address is in, and the route the peer gets; it
    /// must not overlap the lab's own subnets.
    pub net: std::net::Ipv4Addr,
    pub prefix: u8,
    pub addrs: Vec<std::net::Ipv4Addr>,
}

/// The most addresses one [`AddressBlock`] may hold: as many as a /16.
pub const MAX_BLOCK_ADDRS: usize = 65_536;

impl AddressBlock {
    /// Whether `a` is inside the block's network.
    pub fn contains(&self, a: std::net::Ipv4Addr) -> bool {
        u32::from(a) & prefix_mask(self.prefix) == u32::from(self.net)
    }

    /// Whether the block's network and `net`/`prefix` share an address.
    pub fn overlaps(&self, net: std::net::Ipv4Addr, prefix: u8) -> bool {
        let shorter = prefix_mask(self.prefix.min(prefix));
        u32::from(self.net) & shorter == u32::from(net) & shorter
    }
}

/// The mask of a prefix length (0 to 32).
pub fn prefix_mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0)
}

/// A device of a host or router that discards what is sent through it: a
/// veth whose peer (`<dev>p`, in the same namespace) stays down, so the
/// kernel frees every frame at once. A redirect target for a program that
/// counts and then drops (this kernel has no dummy device).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscardDevice {
    pub node: String,
    pub dev: String,
}

impl DiscardDevice {
    /// The name of the peer that stays down.
    pub fn peer(&self) -> String {
        format!("{}p", self.dev)
    }
}

/// The most CPUs a CPU list may name: the largest `NR_CPUS` the kernel
/// can be built with.
pub const MAX_CPUS: usize = 8192;

/// A non-empty set of CPUs, written as a list in taskset's syntax (`1`,
/// `0-3`, `0,2-3`) and checked when made: ascending ranges, every CPU
/// below [`MAX_CPUS`]. Whether the machine has them is for the kernel to
/// say when the setting is written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CpuList(Vec<usize>);

impl CpuList {
    pub fn parse(text: &str) -> Result<CpuList, ModelError> {
        let bad = |why: &str| ModelError::BadValue {
            item: "CPU list".into(),
            value: text.into(),
            expected: format!("a CPU list like 1, 0-3 or 0,2-3 ({why})"),
        };
        let mut cpus = Vec::new();
        for part in text.split(',') {
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let num = |s: &str| {
                if s.is_empty() || !s.chars().all(|c| c.is_ascii_digit()) {
                    return Err(bad("CPUs are numbers"));
                }
                s.parse::<usize>()
                    .ok()
                    .filter(|&c| c < MAX_CPUS)
                    .ok_or_else(|| bad(&format!("CPUs are numbered below {MAX_CPUS}")))
            };
            let (lo, hi) = (num(lo)?, num(hi)?);
            if lo > hi {
                return Err(bad("a range goes up"));
            }
            cpus.extend(lo..=hi);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(CpuList(cpus))
    }

    /// The set of one CPU.
    pub fn one(cpu: usize) -> Result<CpuList, ModelError> {
        CpuList::parse(&cpu.to_string())
    }

    /// The CPUs, ascending.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// The set as the kernel writes CPU masks (`rps_cpus`,
    /// `smp_affinity`): hexadecimal in 32-bit words separated by commas,
    /// the most significant first (the kernel refuses a word of more than
    /// eight digits): CPU 1 is `2`, CPUs 0-35 are `f,ffffffff`.
    pub fn kernel_mask(&self) -> String {
        let top = self.0.last().copied().unwrap_or(0);
        let mut words = vec![0u32; top / 32 + 1];
        for &c in &self.0 {
            words[c / 32] |= 1 << (c % 32);
        }
        let mut text = format!("{:x}", words[words.len() - 1]);
        for w in words.iter().rev().skip(1) {
            text.push_str(&format!(",{w:08x}"));
        }
        text
    }

    /// The CPUs of a kernel CPU mask (as [`kernel_mask`](Self::kernel_mask)
    /// writes it and sysfs shows it, leading zero words and all); `None` if
    /// it is not one.
    pub fn from_kernel_mask(text: &str) -> Option<Vec<usize>> {
        let mut cpus = Vec::new();
        for (i, word) in text.trim().rsplit(',').enumerate() {
            let w = u32::from_str_radix(word, 16).ok()?;
            cpus.extend((0..32).filter(|b| w & (1 << b) != 0).map(|b| i * 32 + b));
        }
        cpus.sort_unstable();
        Some(cpus)
    }
}

impl std::fmt::Display for CpuList {
    /// The shortest list: `0-3,5`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        let mut i = 0;
        while i < self.0.len() {
            let mut j = i;
            while j + 1 < self.0.len() && self.0[j + 1] == self.0[j] + 1 {
                j += 1;
            }
            parts.push(if i == j {
                self.0[i].to_string()
            } else {
                format!("{}-{}", self.0[i], self.0[j])
            });
            i = j + 1;
        }
        f.write_str(&parts.join(","))
    }
}

impl TryFrom<String> for CpuList {
    type Error = ModelError;
    fn try_from(s: String) -> Result<CpuList, ModelError> {
        CpuList::parse(&s)
    }
}

impl From<CpuList> for String {
    fn from(c: CpuList) -> String {
        c.to_string()
    }
}

/// Why the kernel would refuse `dev` as a device name (and a path under
/// `/sys/class/net` would not be that device's), if it would.
pub fn device_name_problem(dev: &str) -> Option<&'static str> {
    if dev.is_empty() || dev.len() > 15 {
        return Some("device names are 1 to 15 bytes");
    }
    if dev == "." || dev == ".." || dev.chars().any(|c| c == '/' || c == ':' || c.is_whitespace()) {
        return Some("device names have no '/', ':' or spaces and are not '.' or '..'");
    }
    None
}

/// Why the kernel would refuse `n` as a switch (a bridge device in the
/// lab's fabric namespace, beside the generated port devices), if it would.
pub fn switch_name_problem(n: &str) -> Option<&'static str> {
    // IFNAMSIZ is 16 bytes with the terminating NUL.
    if n.len() > 15 {
        return Some("a switch is a network device, and device names are at most 15 bytes");
    }
    if n == "lo" {
        return Some("'lo' is the loopback device every namespace already has");
    }
    let generated = |prefix: char| {
        n.strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(['a', 'b']))
            .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
    };
    if generated('p') || generated('d') {
        return Some("names like p3a or d0b are the link ports netlab generates beside the switches");
    }
    None
}

pub fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && n.len() <= 24
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Topology {
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    pub fn hosts(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.kind == NodeKind::Host)
    }

    /// Checks everything that can be checked before touching the kernel.
    pub fn validate(&self) -> Result<(), ModelError> {
        let mut seen = std::collections::HashSet::new();
        for n in &self.nodes {
            if !valid_name(&n.name) {
                return Err(ModelError::BadName(n.name.clone()));
            }
            if n.kind == NodeKind::Switch {
                if let Some(rule) = switch_name_problem(&n.name) {
                    return Err(ModelError::BadSwitchName {
                        name: n.name.clone(),
                        rule,
                    });
                }
            }
            if !seen.insert(n.name.as_str()) {
                return Err(ModelError::DuplicateNode(n.name.clone()));
            }
            if let Some(c) = &n.cpus {
                if c.is_empty() || !c.chars().all(|ch| ch.is_ascii_digit() || ch == ',' || ch == '-') {
                    return Err(ModelError::BadValue {
                        item: format!("node {}.cpus", n.name),
                        value: c.clone(),
                        expected: "a CPU list like 0 or 0-1 or 0,2".into(),
                    });
                }
            }
        }
        for (i, l) in self.links.iter().enumerate() {
            for end in [&l.a, &l.b] {
                if !seen.contains(end.as_str()) {
                    return Err(ModelError::UnknownNode {
                        index: i,
                        a: l.a.clone(),
                        b: l.b.clone(),
                        missing: end.clone(),
                    });
                }
            }
            if l.a == l.b {
                return Err(ModelError::SelfLink {
                    index: i,
                    node: l.a.clone(),
                });
            }
            l.params.validate(&format!("link {} ({} - {})", i, l.a, l.b))?;
        }
        self.check_switch_loops()?;
        self.check_device_settings()?;
        self.check_extras()?;
        segments(self).map(|_| ())
    }

    /// Device settings name a host or router and a possible device name,
    /// one setting of each kind per device (whether the plan has that
    /// device is checked with the plan: it names the devices).
    fn check_device_settings(&self) -> Result<(), ModelError> {
        for (i, d) in self.device_settings.iter().enumerate() {
            let item = format!("device setting {i} ({}:{})", d.node, d.dev);
            match self.node(&d.node).map(|n| n.kind) {
                None => {
                    return Err(ModelError::BadValue {
                        item,
                        value: d.node.clone(),
                        expected: "the name of a host or router of the topology".into(),
                    })
                }
                Some(NodeKind::Switch) => {
                    return Err(ModelError::BadValue {
                        item,
                        value: d.node.clone(),
                        expected: "a host or router (a switch is a bridge, and its ports are the fabric's)".into(),
                    })
                }
                Some(_) => {}
            }
            if let Some(rule) = device_name_problem(&d.dev) {
                return Err(ModelError::BadValue {
                    item,
                    value: d.dev.clone(),
                    expected: format!("a device name: {rule}"),
                });
            }
            if self.device_settings[..i]
                .iter()
                .any(|e| e.node == d.node && e.dev == d.dev && e.set.same_kind(&d.set))
            {
                return Err(ModelError::BadValue {
                    item,
                    value: d.set.files().into(),
                    expected: "one setting of each kind per device (a second would overwrite the first)".into(),
                });
            }
        }
        Ok(())
    }

    /// Address blocks and discard devices name a host (or, for a discard
    /// device, a router) and a possible device name; a block's addresses are
    /// unique and inside its network, and blocks do not overlap (whether the
    /// plan has the device and where its link ends is checked with the plan).
    fn check_extras(&self) -> Result<(), ModelError> {
        let kind_of =
            |item: &str, node: &str, allowed: &[NodeKind], expected: &str| match self.node(node).map(|n| n.kind) {
                Some(k) if allowed.contains(&k) => Ok(()),
                _ => Err(ModelError::BadValue {
                    item: item.to_string(),
                    value: node.to_string(),
                    expected: expected.to_string(),
                }),
            };
        for (i, b) in self.address_blocks.iter().enumerate() {
            let item = format!("address block {i} ({}:{})", b.node, b.dev);
            let bad = |value: String, expected: &str| ModelError::BadValue {
                item: item.clone(),
                value,
                expected: expected.to_string(),
            };
            kind_of(&item, &b.node, &[NodeKind::Host], "the name of a host of the topology")?;
            if let Some(rule) = device_name_problem(&b.dev) {
                return Err(bad(b.dev.clone(), &format!("a device name: {rule}")));
            }
            if b.prefix == 0 || b.prefix > 32 || u32::from(b.net) & !prefix_mask(b.prefix) != 0 {
                return Err(bad(
                    format!("{}/{}", b.net, b.prefix),
                    "a network with a prefix of 1 to 32 bits and no host bits set",
                ));
            }
            if b.addrs.is_empty() || b.addrs.len() > MAX_BLOCK_ADDRS {
                return Err(bad(
                    format!("{} addresses", b.addrs.len()),
                    &format!("1 to {MAX_BLOCK_ADDRS} addresses"),
                ));
            }
            let mut seen = std::collections::HashSet::new();
            for a in &b.addrs {
                if !b.contains(*a) {
                    return Err(bad(a.to_string(), &format!("an address inside {}/{}", b.net, b.prefix)));
                }
                if !seen.insert(*a) {
                    return Err(bad(a.to_string(), "each address once"));
                }
            }
            if let Some(o) = self.address_blocks[..i].iter().find(|o| o.overlaps(b.net, b.prefix)) {
                return Err(bad(
                    format!("{}/{}", b.net, b.prefix),
                    &format!("a network apart from the earlier block's {}/{}", o.net, o.prefix),
                ));
            }
        }
        for (i, d) in self.discard_devices.iter().enumerate() {
            let item = format!("discard device {i} ({}:{})", d.node, d.dev);
            kind_of(
                &item,
                &d.node,
                &[NodeKind::Host, NodeKind::Router],
                "the name of a host or router of the topology",
            )?;
            // Its peer `<dev>p` must be a device name too, and neither may
            // be one the plan gives a link (`eth<k>`) or the loopback.
            let problem = device_name_problem(&d.dev)
                .or_else(|| device_name_problem(&d.peer()))
                .or_else(|| {
                    (d.dev.starts_with("eth") || d.dev == "lo")
                        .then_some("eth<k> are the links' devices and lo the loopback")
                });
            if let Some(rule) = problem {
                return Err(ModelError::BadValue {
                    item,
                    value: d.dev.clone(),
                    expected: format!("a device name of at most 14 bytes (its peer adds a 'p'): {rule}"),
                });
            }
            if self.discard_devices[..i]
                .iter()
                .any(|e| e.node == d.node && e.dev == d.dev)
            {
                return Err(ModelError::BadValue {
                    item,
                    value: d.dev.clone(),
                    expected: "each device once per node".into(),
                });
            }
        }
        Ok(())
    }

    fn check_switch_loops(&self) -> Result<(), ModelError> {
        let mut uf = UnionFind::new(self.nodes.len());
        for l in &self.links {
            let (a, b) = (self.index_of(&l.a), self.index_of(&l.b));
            let (Some(a), Some(b)) = (a, b) else { continue };
            if self.nodes[a].kind == NodeKind::Switch && self.nodes[b].kind == NodeKind::Switch && !uf.union(a, b) {
                return Err(ModelError::SwitchLoop(format!("{} and {}", l.a, l.b)));
            }
        }
        Ok(())
    }
}

/// Segment membership of each link end: `seg[link][side]` is the segment of
/// the interface at that end, or `None` if that end is a switch.
pub(crate) struct SegmentMap {
    pub count: usize,
    pub of_link: Vec<usize>,
}

/// Groups links into layer-2 segments.
pub(crate) fn segments(t: &Topology) -> Result<SegmentMap, ModelError> {
    let idx: HashMap<&str, usize> = t.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let is_sw = |name: &str| t.nodes[idx[name]].kind == NodeKind::Switch;
    let mut uf = UnionFind::new(t.nodes.len());
    for l in &t.links {
        if is_sw(&l.a) && is_sw(&l.b) {
            uf.union(idx[l.a.as_str()], idx[l.b.as_str()]);
        }
    }
    let mut key_to_seg: HashMap<(bool, usize), usize> = HashMap::new();
    let mut of_link = Vec::with_capacity(t.links.len());
    let mut members: HashMap<usize, Vec<&str>> = HashMap::new();
    for (i, l) in t.links.iter().enumerate() {
        let key = if is_sw(&l.a) {
            (true, uf.find(idx[l.a.as_str()]))
        } else if is_sw(&l.b) {
            (true, uf.find(idx[l.b.as_str()]))
        } else {
            (false, i)
        };
        let n = key_to_seg.len();
        let seg = *key_to_seg.entry(key).or_insert(n);
        of_link.push(seg);
        for end in [&l.a, &l.b] {
            if !is_sw(end) {
                let m = members.entry(seg).or_default();
                if m.contains(&end.as_str()) {
                    return Err(ModelError::HostTwiceOnSegment(end.clone()));
                }
                m.push(end);
            }
        }
    }
    Ok(SegmentMap {
        count: key_to_seg.len(),
        of_link,
    })
}

/// Minimal union-find over node indices.
pub(crate) struct UnionFind(Vec<usize>);

impl UnionFind {
    pub fn new(n: usize) -> Self {
        UnionFind((0..n).collect())
    }
    pub fn find(&mut self, mut x: usize) -> usize {
        while self.0[x] != x {
            self.0[x] = self.0[self.0[x]];
            x = self.0[x];
        }
        x
    }
    /// Joins the sets of `a` and `b`; false if they were already one set.
    pub fn union(&mut self, a: usize, b: usize) -> bool {
        let (ra, rb) = (self.find(a), self.find(b));
        if ra == rb {
            return false;
        }
        self.0[ra] = rb;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, kind: NodeKind) -> Node {
        Node {
            name: name.into(),
            kind,
            cpus: None,
        }
    }
    fn l(a: &str, b: &str) -> Link {
        Link {
            a: a.into(),
            b: b.into(),
            params: LinkParams::default(),
        }
    }

    #[test]
    fn rejects_duplicates_unknowns_and_loops() {
        let mut t = Topology {
            name: "t".into(),
            nodes: vec![n("h1", NodeKind::Host), n("h1", NodeKind::Host)],
            links: vec![],
            device_settings: vec![],
            address_blocks: vec![],
            discard_devices: vec![],
        };
        assert!(matches!(t.validate(), Err(ModelError::DuplicateNode(x)) if x == "h1"));
        t.nodes[1].name = "s1".into();
        t.nodes[1].kind = NodeKind::Switch;
        t.links.push(l("h1", "s9"));
        assert!(matches!(t.validate(), Err(ModelError::UnknownNode { missing, .. }) if missing == "s9"));
        t.links[0] = l("s1", "s1");
        assert!(matches!(t.validate(), Err(ModelError::SelfLink { .. })));
        t.nodes.push(n("s2", NodeKind::Switch));
        t.links = vec![l("s1", "s2"), l("s2", "s1")];
        assert!(matches!(t.validate(), Err(ModelError::SwitchLoop(_))));
        t.links = vec![l("s1", "s2"), l("h1", "s1")];
        t.validate().unwrap();
    }

    #[test]
    fn switch_names_the_kernel_would_refuse_are_rejected_at_read_time() {
        for (name, ok) in [
            ("s1", true),
            ("core_switch_15b", true),
            ("core_switch_16by", false),
            ("lo", false),
            ("p1a", false),
            ("d12b", false),
            ("p1c", true),
            ("pa", true),
            ("lo2", true),
        ] {
            let t = Topology {
                name: "t".into(),
                nodes: vec![n("h1", NodeKind::Host), n(name, NodeKind::Switch)],
                links: vec![l("h1", name)],
                device_settings: vec![],
                address_blocks: vec![],
                discard_devices: vec![],
            };
            let r = t.validate();
            assert_eq!(r.is_ok(), ok, "{name}: {r:?}");
            if !ok {
                let msg = r.unwrap_err().to_string();
                assert!(msg.contains(name) && msg.contains(':'), "{msg}");
            }
        }
        // Hosts are namespaces, not devices: a long host name is fine.
        assert!(switch_name_problem("p1a").is_some() && valid_name("p1a"));
    }

    #[test]
    fn cpu_lists_are_checked_and_written_as_the_kernel_reads_masks() {
        let c = CpuList::parse("5,0-3,2").unwrap();
        assert_eq!(c.cpus(), [0, 1, 2, 3, 5]);
        assert_eq!(c.to_string(), "0-3,5");
        assert_eq!(c.kernel_mask(), "2f");
        assert_eq!(CpuList::one(1).unwrap().kernel_mask(), "2");
        // 32-bit words, most significant first, the kernel's limit of
        // eight digits each.
        assert_eq!(CpuList::parse("0-35").unwrap().kernel_mask(), "f,ffffffff");
        assert_eq!(CpuList::one(32).unwrap().kernel_mask(), "1,00000000");
        assert_eq!(CpuList::one(8191).unwrap().kernel_mask().split(',').count(), 256);
        // What sysfs shows back, leading zero words and all.
        assert_eq!(CpuList::from_kernel_mask("00000000,00000002\n"), Some(vec![1]));
        assert_eq!(CpuList::from_kernel_mask("f,ffffffff"), Some((0..36).collect()));
        assert_eq!(CpuList::from_kernel_mask("0"), Some(vec![]));
        assert_eq!(CpuList::from_kernel_mask("xyz"), None);
        let too_big = "99999999999999999999999";
        for bad in ["", "a", "1,,2", "3-1", "-1", "1-", "8192", "0-8192", too_big] {
            let e = CpuList::parse(bad).unwrap_err().to_string();
            assert!(e.contains("a CPU list like"), "{bad}: {e}");
        }
        // Serialized as its list, checked when read.
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(json, r#""0-3,5""#);
        assert_eq!(serde_json::from_str::<CpuList>(&json).unwrap(), c);
        assert!(serde_json::from_str::<CpuList>(r#""2-1""#).is_err());
    }

    #[test]
    fn rejects_bad_params_and_names() {
        let p = LinkParams {
            bw_bps: Some(1),
            ..Default::default()
        };
        assert!(p.validate("x").is_err());
        let p = LinkParams {
            delay_ns: 1000,
            jitter_ns: 2000,
            ..Default::default()
        };
        assert!(p.validate("x").is_err());
        let p = LinkParams {
            queue: Some(0),
            ..Default::default()
        };
        assert!(p.validate("x").is_err());
        assert!(!valid_name("1abc"));
        assert!(!valid_name("a-b"));
        assert!(valid_name("h12"));
    }
}
