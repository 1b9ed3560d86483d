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
        segments(self).map(|_| ())
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
