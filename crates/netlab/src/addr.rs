//! Addressing and routing, computed from the topology alone.
//!
//! Every layer-2 segment (a switch component with its attached interfaces, or
//! a direct link between two non-switches) gets one IPv4 subnet from
//! 10.0.0.0/8, just big enough. Routers get a route to every subnet that has
//! a host on it, with *all* equal-cost next hops (ECMP); hosts get a default
//! route through a router on their segment.

use crate::error::ModelError;
use crate::model::{segments, NodeKind, Topology};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

/// One IP interface of a host or a router.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Iface {
    pub node: String,
    pub link: usize,
    pub ifname: String,
    pub addr: Ipv4Addr,
    pub prefix: u8,
    pub segment: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    pub net: Ipv4Addr,
    pub prefix: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub node: String,
    pub net: Ipv4Addr,
    pub prefix: u8,
    /// (gateway, device); more than one means an ECMP route.
    pub nexthops: Vec<(Ipv4Addr, String)>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Addressing {
    pub ifaces: Vec<Iface>,
    pub segments: Vec<Segment>,
    pub routes: Vec<Route>,
    /// Names of the routers (a segment's hub is its first router).
    #[serde(default)]
    pub routers: Vec<String>,
}

/// Segments with at most this many interfaces get a permanent neighbour
/// entry for every pair (see [`Addressing::static_neighbours`]).
pub const STATIC_NEIGH_ALL_MAX: u64 = 300;

/// The MAC address of the lab interface with address `a`: locally
/// administered (`02:`), then `4e` ('N'), then the four bytes of the
/// address, so every interface of a lab has its own and the plan knows it
/// without asking the kernel. Different labs reuse them, each on its own
/// bridges.
pub fn mac_of(a: Ipv4Addr) -> String {
    let [b0, b1, b2, b3] = a.octets();
    format!("02:4e:{b0:02x}:{b1:02x}:{b2:02x}:{b3:02x}")
}

impl Addressing {
    /// Neighbour (ARP) entries needed if every interface talks to every other
    /// on its segment: sum of m(m-1) over segments with m interfaces.
    pub fn neighbour_entries_all_pairs(&self) -> u64 {
        let mut per_seg = vec![0u64; self.segments.len()];
        for i in &self.ifaces {
            per_seg[i.segment] += 1;
        }
        per_seg.iter().map(|m| m * m.saturating_sub(1)).sum()
    }

    /// The neighbour entries the plan makes permanent (see
    /// [`static_neighbours`](Self::static_neighbours)): `(at, of)` as
    /// indices into `ifaces`, an entry in interface `at` for the address of
    /// interface `of`. On a segment of at most [`STATIC_NEIGH_ALL_MAX`]
    /// interfaces every pair; on a bigger one each interface and the
    /// segment's hub (its first router, else its first interface), both
    /// ways, since all pairs would cost the kernel about half a kilobyte per
    /// entry, n² of them.
    pub fn static_neighbours(&self) -> Vec<(usize, usize)> {
        let mut on_seg: Vec<Vec<usize>> = vec![vec![]; self.segments.len()];
        for (k, i) in self.ifaces.iter().enumerate() {
            on_seg[i.segment].push(k);
        }
        let mut out = vec![];
        for members in &on_seg {
            if members.len() as u64 <= STATIC_NEIGH_ALL_MAX {
                for &a in members {
                    out.extend(members.iter().filter(|&&b| b != a).map(|&b| (a, b)));
                }
            } else {
                let hub = self.hub_of(members);
                for &m in members.iter().filter(|&&m| m != hub) {
                    out.push((m, hub));
                    out.push((hub, m));
                }
            }
        }
        out
    }

    /// The node whose interface is the hub of the biggest segment with more
    /// than [`STATIC_NEIGH_ALL_MAX`] interfaces, if there is one: every
    /// other interface there has a permanent entry for it and it for them.
    pub fn big_segment_hub(&self) -> Option<&str> {
        let mut on_seg: Vec<Vec<usize>> = vec![vec![]; self.segments.len()];
        for (k, i) in self.ifaces.iter().enumerate() {
            on_seg[i.segment].push(k);
        }
        let biggest = on_seg.iter().max_by_key(|m| m.len())?;
        (biggest.len() as u64 > STATIC_NEIGH_ALL_MAX).then(|| self.ifaces[self.hub_of(biggest)].node.as_str())
    }

    /// The hub of a segment's members (indices into `ifaces`): its first
    /// router, else its first interface.
    fn hub_of(&self, members: &[usize]) -> usize {
        members
            .iter()
            .copied()
            .find(|&k| self.routers.contains(&self.ifaces[k].node))
            .unwrap_or(members[0])
    }

    /// Neighbour entries that are not permanent and that all-pairs traffic
    /// would make the kernel resolve (ARP): those of the segments bigger
    /// than [`STATIC_NEIGH_ALL_MAX`], less their hub entries.
    pub fn neighbour_entries_dynamic(&self) -> u64 {
        let mut per_seg = vec![0u64; self.segments.len()];
        for i in &self.ifaces {
            per_seg[i.segment] += 1;
        }
        per_seg
            .iter()
            .filter(|&&m| m > STATIC_NEIGH_ALL_MAX)
            .map(|m| m * (m - 1) - 2 * (m - 1))
            .sum()
    }

    /// The per-CPU backlog (`net.core.netdev_max_backlog`) a big segment
    /// needs, if any: an ARP request there is a broadcast that the bridge
    /// floods to every port at once, m-1 clones queued on one CPU's backlog
    /// (1000 by default), so a few concurrent resolutions overflow it and
    /// the requests are lost (measured on a star of 1,000: 200,000 drops
    /// and 0.8 % of a sample's pairs unreachable; none with 16,384). Room
    /// for 16 floods of the biggest segment whose neighbours are resolved
    /// by ARP; small segments have permanent entries and no such floods.
    pub fn flood_backlog(&self) -> Option<u64> {
        let mut per_seg = vec![0u64; self.segments.len()];
        for i in &self.ifaces {
            per_seg[i.segment] += 1;
        }
        per_seg
            .into_iter()
            .filter(|&m| m > STATIC_NEIGH_ALL_MAX)
            .max()
            .map(|m| (m * 16).next_power_of_two())
    }

    /// The first address of a node (what probes and `NETLAB_IP_<host>` use).
    pub fn addr_of(&self, node: &str) -> Option<Ipv4Addr> {
        self.ifaces.iter().find(|i| i.node == node).map(|i| i.addr)
    }
}

/// Where subnets are allocated from unless a lab asks otherwise.
pub const DEFAULT_FIRST_SUBNET: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 0);

/// Computes interfaces, subnets and routes, subnets from 10.0.0.0 on.
pub fn plan_addressing(t: &Topology) -> Result<Addressing, ModelError> {
    plan_addressing_from(t, DEFAULT_FIRST_SUBNET)
}

/// Computes interfaces, subnets and routes, subnets from `first` on (within
/// 10.0.0.0/8): a program that builds a small lab and hard-codes where its
/// hosts are (a benchmark whose figures must stay comparable with earlier
/// runs) chooses the addresses, e.g. 10.210.0.0 gives a two-host pair
/// 10.210.0.1 and 10.210.0.2.
pub fn plan_addressing_from(t: &Topology, first: Ipv4Addr) -> Result<Addressing, ModelError> {
    if first.octets()[0] != 10 {
        return Err(ModelError::BadValue {
            item: "first subnet".into(),
            value: first.to_string(),
            expected: "an address in 10.0.0.0/8, where lab subnets are allocated".into(),
        });
    }
    let segs = segments(t)?;
    let kind: HashMap<&str, NodeKind> = t.nodes.iter().map(|n| (n.name.as_str(), n.kind)).collect();

    // Interfaces in link order; each node numbers its own eth0, eth1, ...
    let mut next_if: HashMap<&str, usize> = HashMap::new();
    let mut pending: Vec<(String, usize, String, usize)> = vec![];
    let mut seg_size = vec![0usize; segs.count];
    for (i, l) in t.links.iter().enumerate() {
        for end in [&l.a, &l.b] {
            if kind[end.as_str()] == NodeKind::Switch {
                continue;
            }
            let n = next_if.entry(end.as_str()).or_insert(0);
            pending.push((end.clone(), i, format!("eth{n}"), segs.of_link[i]));
            *n += 1;
            seg_size[segs.of_link[i]] += 1;
        }
    }

    // Subnets: aligned bump allocation, smallest power of two that fits the
    // members plus network and broadcast addresses.
    let mut next: u64 = u32::from(first) as u64;
    let end: u64 = u32::from(Ipv4Addr::new(11, 0, 0, 0)) as u64;
    let mut segments_out = Vec::with_capacity(segs.count);
    for &n in &seg_size {
        let size = (n as u64 + 2).next_power_of_two().max(4);
        next = next.div_ceil(size) * size;
        if next + size > end {
            return Err(ModelError::AddressSpace);
        }
        segments_out.push(Segment {
            net: Ipv4Addr::from(next as u32),
            prefix: 32 - size.trailing_zeros() as u8,
        });
        next += size;
    }
    let mut used = vec![0u32; segs.count];
    let ifaces: Vec<Iface> = pending
        .into_iter()
        .map(|(node, link, ifname, seg)| {
            used[seg] += 1;
            Iface {
                node,
                link,
                ifname,
                addr: Ipv4Addr::from(u32::from(segments_out[seg].net) + used[seg]),
                prefix: segments_out[seg].prefix,
                segment: seg,
            }
        })
        .collect();

    let routes = plan_routes(t, &ifaces, &segments_out, &kind);
    let routers = t
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Router)
        .map(|n| n.name.clone())
        .collect();
    Ok(Addressing {
        ifaces,
        segments: segments_out,
        routes,
        routers,
    })
}

fn plan_routes(t: &Topology, ifaces: &[Iface], segments: &[Segment], kind: &HashMap<&str, NodeKind>) -> Vec<Route> {
    let mut on_seg: Vec<Vec<&Iface>> = vec![vec![]; segments.len()];
    for i in ifaces {
        on_seg[i.segment].push(i);
    }
    let is_router = |n: &str| kind[n] == NodeKind::Router;
    let mut routes = vec![];

    // Hosts: default route through the first router on their first segment
    // that has one.
    for h in t.hosts() {
        let gw = ifaces.iter().filter(|i| i.node == h.name).find_map(|mine| {
            on_seg[mine.segment]
                .iter()
                .find(|o| is_router(&o.node))
                .map(|r| (r.addr, mine.ifname.clone()))
        });
        if let Some(gw) = gw {
            routes.push(Route {
                node: h.name.clone(),
                net: Ipv4Addr::UNSPECIFIED,
                prefix: 0,
                nexthops: vec![gw],
            });
        }
    }

    // Routers: breadth-first search from each host subnet over the router
    // graph; every neighbour one step closer is an equal-cost next hop.
    let routers: Vec<&str> = t
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Router)
        .map(|n| n.name.as_str())
        .collect();
    if routers.is_empty() {
        return routes;
    }
    for (d, seg) in segments.iter().enumerate() {
        if !on_seg[d].iter().any(|i| kind[i.node.as_str()] == NodeKind::Host) {
            continue;
        }
        let mut dist: HashMap<&str, usize> = HashMap::new();
        let mut q = VecDeque::new();
        for i in &on_seg[d] {
            if is_router(&i.node) && !dist.contains_key(i.node.as_str()) {
                dist.insert(i.node.as_str(), 0);
                q.push_back(i.node.as_str());
            }
        }
        while let Some(r) = q.pop_front() {
            let dr = dist[r];
            for mine in ifaces.iter().filter(|i| i.node == r) {
                for other in &on_seg[mine.segment] {
                    if is_router(&other.node) && !dist.contains_key(other.node.as_str()) {
                        dist.insert(other.node.as_str(), dr + 1);
                        q.push_back(other.node.as_str());
                    }
                }
            }
        }
        for r in &routers {
            let Some(&dr) = dist.get(r) else { continue };
            if dr == 0 {
                continue;
            }
            let mut nexthops = vec![];
            for mine in ifaces.iter().filter(|i| i.node == *r) {
                for other in &on_seg[mine.segment] {
                    if other.node != *r && is_router(&other.node) && dist.get(other.node.as_str()) == Some(&(dr - 1)) {
                        nexthops.push((other.addr, mine.ifname.clone()));
                    }
                }
            }
            routes.push(Route {
                node: r.to_string(),
                net: seg.net,
                prefix: seg.prefix,
                nexthops,
            });
        }
    }
    routes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LinkParams;
    use crate::topo::Builtin;

    #[test]
    fn star_is_one_subnet() {
        let t = Builtin::Star { hosts: 3 }.build(&LinkParams::default());
        let a = plan_addressing(&t).unwrap();
        assert_eq!(
            a.segments,
            vec![Segment {
                net: Ipv4Addr::new(10, 0, 0, 0),
                prefix: 29
            }]
        );
        assert_eq!(a.addr_of("h1"), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(a.addr_of("h3"), Some(Ipv4Addr::new(10, 0, 0, 3)));
        assert!(a.routes.is_empty());
        assert!(a.ifaces.iter().all(|i| i.ifname == "eth0"));
        assert_eq!(a.neighbour_entries_all_pairs(), 6);
    }

    #[test]
    fn a_lab_may_choose_where_its_subnets_start() {
        let t = Builtin::Pair.build(&LinkParams::default());
        let a = plan_addressing_from(&t, Ipv4Addr::new(10, 210, 0, 0)).unwrap();
        assert_eq!(
            a.segments,
            [Segment {
                net: Ipv4Addr::new(10, 210, 0, 0),
                prefix: 30
            }]
        );
        assert_eq!(a.addr_of("h1"), Some(Ipv4Addr::new(10, 210, 0, 1)));
        assert_eq!(a.addr_of("h2"), Some(Ipv4Addr::new(10, 210, 0, 2)));
        // An unaligned start is rounded up to the subnet's size.
        let a = plan_addressing_from(&t, Ipv4Addr::new(10, 210, 0, 1)).unwrap();
        assert_eq!(a.addr_of("h1"), Some(Ipv4Addr::new(10, 210, 0, 5)));
        // Outside 10.0.0.0/8, and past its end, there is no room.
        assert!(matches!(
            plan_addressing_from(&t, Ipv4Addr::new(192, 168, 0, 0)),
            Err(ModelError::BadValue { .. })
        ));
        assert!(matches!(
            plan_addressing_from(&t, Ipv4Addr::new(10, 255, 255, 254)),
            Err(ModelError::AddressSpace)
        ));
    }

    #[test]
    fn big_star_gets_a_bigger_subnet() {
        let t = Builtin::Star { hosts: 300 }.build(&LinkParams::default());
        let a = plan_addressing(&t).unwrap();
        assert_eq!(a.segments[0].prefix, 23);
        assert_eq!(a.addr_of("h300"), Some(Ipv4Addr::new(10, 0, 1, 44)));
    }

    #[test]
    fn fattree_has_ecmp_towards_other_pods() {
        let t = Builtin::FatTree { k: 4 }.build(&LinkParams::default());
        let a = plan_addressing(&t).unwrap();
        // 16 host links + 32 router links, each its own /30.
        assert_eq!(a.segments.len(), 48);
        assert!(a.segments.iter().all(|s| s.prefix == 30));
        // h1 sits on e0_0; its default route goes there.
        let h1 = a.routes.iter().find(|r| r.node == "h1").unwrap();
        assert_eq!(h1.prefix, 0);
        // An edge router reaches a host of another pod through both of its
        // aggregation routers, an aggregation router through both its cores,
        // and a core router through exactly one aggregation router.
        let h16_net = a.ifaces.iter().find(|i| i.node == "h16").unwrap();
        let seg = &a.segments[h16_net.segment];
        let find = |n: &str| a.routes.iter().find(|r| r.node == n && r.net == seg.net).unwrap();
        assert_eq!(find("e0_0").nexthops.len(), 2);
        assert_eq!(find("a0_0").nexthops.len(), 2);
        assert_eq!(find("c1").nexthops.len(), 1);
        // Within the destination pod the aggregation router has one way down.
        assert_eq!(find("a3_0").nexthops.len(), 1);
        // Every router has a route to each of the 16 host subnets but its own.
        let n_e00 = a.routes.iter().filter(|r| r.node == "e0_0").count();
        assert_eq!(n_e00, 14);
        let n_c1 = a.routes.iter().filter(|r| r.node == "c1").count();
        assert_eq!(n_c1, 16);
    }

    #[test]
    fn small_segments_get_every_neighbour_big_ones_their_hub() {
        assert_eq!(mac_of(Ipv4Addr::new(10, 0, 1, 44)), "02:4e:0a:00:01:2c");
        let a = plan_addressing(&Builtin::Star { hosts: 3 }.build(&LinkParams::default())).unwrap();
        assert_eq!(a.static_neighbours(), [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]);
        assert_eq!(a.neighbour_entries_dynamic(), 0);
        let n = STATIC_NEIGH_ALL_MAX as usize;
        let a = plan_addressing(&Builtin::Star { hosts: n }.build(&LinkParams::default())).unwrap();
        assert_eq!(a.static_neighbours().len(), n * (n - 1));
        assert_eq!(a.neighbour_entries_dynamic(), 0);
        assert_eq!(a.flood_backlog(), None);
        // One more: h1 is the hub, every other host has it and it has them.
        let a = plan_addressing(&Builtin::Star { hosts: n + 1 }.build(&LinkParams::default())).unwrap();
        let s = a.static_neighbours();
        assert_eq!(s.len(), 2 * n);
        assert!(s.iter().all(|&(x, y)| (x == 0) != (y == 0)));
        assert_eq!(a.big_segment_hub(), Some("h1"));
        let m = n as u64 + 1;
        assert_eq!(a.neighbour_entries_dynamic(), m * (m - 1) - 2 * n as u64);
        assert_eq!(a.flood_backlog(), Some(8192));
        // A fat tree's links are pairs: both ends know each other.
        let a = plan_addressing(&Builtin::FatTree { k: 4 }.build(&LinkParams::default())).unwrap();
        assert_eq!(a.static_neighbours().len(), 2 * 48);
    }

    #[test]
    fn host_twice_on_a_segment_is_refused() {
        let mut t = Builtin::Star { hosts: 2 }.build(&LinkParams::default());
        t.links.push(t.links[0].clone());
        assert!(matches!(plan_addressing(&t), Err(ModelError::HostTwiceOnSegment(h)) if h == "h1"));
    }
}
