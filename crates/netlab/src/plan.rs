//! Turning a topology into the list of ip/tc/sysctl/sysfs operations that builds
//! it. Pure: the plan is data, unit-tested as data, and applied elsewhere.

use crate::addr::{mac_of, plan_addressing_from, Addressing, DEFAULT_FIRST_SUBNET};
use crate::error::ModelError;
use crate::model::{LinkParams, NodeKind, Sysfs, Topology};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Every namespace of ours starts with this, so that `netlab clean` can find
/// what a crashed run left behind.
pub const NS_PREFIX: &str = "netlab-";

/// Names of everything a run creates, all under its per-run prefix so that
/// concurrent runs never collide.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Naming {
    pub run_id: String,
}

impl Naming {
    pub fn new(run_id: impl Into<String>) -> Self {
        Naming { run_id: run_id.into() }
    }
    pub fn prefix(&self) -> String {
        format!("{NS_PREFIX}{}-", self.run_id)
    }
    /// Namespace of a host or router.
    pub fn ns(&self, node: &str) -> String {
        format!("{}{node}", self.prefix())
    }
    /// Namespace holding the bridges and delay-line ports; node names cannot
    /// start with '-', so this never collides with a node.
    pub fn fabric(&self) -> String {
        format!("{}-fabric", self.prefix())
    }
}

/// How link delay, jitter and loss are emulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayBackend {
    /// The kernel's netem qdisc (not in every kernel).
    Netem,
    /// Our own user-space delay line between two veth pairs.
    DelayLine,
}

impl fmt::Display for DelayBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DelayBackend::Netem => "netem",
            DelayBackend::DelayLine => "delay-line",
        })
    }
}

/// The seam for virtual time: every rate and every delay given to the kernel
/// passes through here. With a time dilation factor of N, a process sees
/// time run N times slower, so a link must run N times slower in real time
/// (rate / N) and its delay must be N times longer in real time.
/// The factor is vtime's [`Tdf`] (a ratio such as 4, 2.5 or 3/2) end to
/// end: the lab's clock, its links and its state carry the same value.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dilation {
    #[serde(with = "tdf_serde")]
    pub tdf: Tdf,
}

impl Default for Dilation {
    fn default() -> Self {
        Dilation { tdf: Tdf::ONE }
    }
}

impl Dilation {
    /// `bps / tdf`, at least 1.
    pub fn rate(&self, bps: u64) -> u64 {
        let (n, d) = (u128::from(self.tdf.num()), u128::from(self.tdf.den()));
        (u128::from(bps) * d / n).clamp(1, u128::from(u64::MAX)) as u64
    }
    /// `ns * tdf`, rounded up.
    pub fn delay(&self, ns: u64) -> u64 {
        self.tdf.virtual_to_real(ns.min(i64::MAX as u64) as i64).max(0) as u64
    }
    /// Whether time runs slower than real time in the lab.
    pub fn dilated(&self) -> bool {
        self.tdf > Tdf::ONE
    }
}

pub use vtime::Tdf;

/// The largest TDF a lab takes (and the smallest is 1: a lab never runs
/// faster than real time, which its links could not do).
pub const TDF_MAX: u64 = 1000;

/// Checks that `t` is within `1..=TDF_MAX`, naming `item` if not.
pub fn check_tdf(item: &str, t: Tdf) -> Result<Tdf, crate::error::ModelError> {
    if t < Tdf::ONE || t > Tdf::new(TDF_MAX, 1).expect("a valid bound") {
        return Err(crate::error::ModelError::OutOfRange {
            item: item.into(),
            value: t.to_string(),
            range: format!("between 1 and {TDF_MAX}"),
        });
    }
    Ok(t)
}

/// Parses a TDF as the command line writes it (`4`, `2.5`, `3/2`) and
/// checks it is within `1..=TDF_MAX`.
pub fn parse_tdf(s: &str) -> Result<Tdf, String> {
    let t: Tdf = s.parse().map_err(|e| format!("'{s}': {e}"))?;
    check_tdf("TDF", t).map_err(|e| e.to_string())
}

/// A TDF in JSON state and plans as its text (`"4"`, `"2.5"`, `"3/2"`);
/// a plain number (what older state files hold) is read too.
pub mod tdf_serde {
    use super::Tdf;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Tdf, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Whole(u64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tdf, D::Error> {
        match Either::deserialize(d)? {
            Either::Whole(n) => Tdf::new(n, 1).map_err(serde::de::Error::custom),
            Either::Text(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    pub delay_backend: DelayBackend,
    pub dilation: Dilation,
    /// Fixed ECMP hash seed (reproducible path choice): router i gets
    /// seed + i + 1; `None` leaves the kernel's per-namespace random seed.
    pub ecmp_seed: Option<u32>,
    /// Where the lab's subnets start (see [`plan_addressing_from`]).
    #[serde(default = "default_first_subnet")]
    pub first_subnet: std::net::Ipv4Addr,
}

fn default_first_subnet() -> std::net::Ipv4Addr {
    DEFAULT_FIRST_SUBNET
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            delay_backend: DelayBackend::DelayLine,
            dilation: Dilation::default(),
            ecmp_seed: None,
            first_subnet: DEFAULT_FIRST_SUBNET,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tool {
    Ip,
    Tc,
}

/// One step of building a lab.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Op {
    AddNetns(String),
    /// A sysctl inside a namespace (`key` in dotted form).
    Sysctl {
        ns: String,
        key: String,
        value: String,
    },
    /// An `ip` or `tc` command, run in `ns` (or the caller's namespace).
    Cmd {
        ns: Option<String>,
        tool: Tool,
        args: Vec<String>,
    },
    /// An `ethtool` command on a device of namespace `ns` (offload
    /// settings; ethtool has no `-n`, so it runs under `ip netns exec`).
    Ethtool {
        ns: String,
        args: Vec<String>,
    },
    /// A device setting no `ip` or `tc` command makes (receive packet
    /// steering), written to device `dev`'s files under `/sys/class/net`
    /// inside namespace `ns` and read back: in-process, from a thread that
    /// entered the namespace with the namespace's own sysfs mounted (the
    /// caller's `/sys` shows the caller's devices). Planned after the
    /// device is up; nothing to undo, the device goes with the namespace.
    Sysfs {
        ns: String,
        dev: String,
        set: Sysfs,
    },
    /// A delay-line process moving frames between ports `a` and `b` of the
    /// fabric namespace.
    DelayLine {
        ns: String,
        link: usize,
        a: String,
        b: String,
        params: LinkParams,
        seed: u64,
    },
}

impl fmt::Display for Op {
    /// Shows the op as the shell command that would do the same.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::AddNetns(n) => write!(f, "ip netns add {n}"),
            Op::Sysctl { ns, key, value } => write!(f, "ip netns exec {ns} sysctl -qw {key}={value}"),
            Op::Ethtool { ns, args } => write!(f, "ip netns exec {ns} ethtool {}", args.join(" ")),
            Op::Sysfs { ns, dev, set } => write!(
                f,
                "ip netns exec {ns} sh -c 'echo {} | tee /sys/class/net/{dev}/{} >/dev/null'",
                set.value(),
                set.files()
            ),
            Op::Cmd { ns, tool, args } => {
                let t = match tool {
                    Tool::Ip => "ip",
                    Tool::Tc => "tc",
                };
                match ns {
                    Some(ns) => write!(f, "{t} -n {ns} {}", args.join(" ")),
                    None => write!(f, "{t} {}", args.join(" ")),
                }
            }
            Op::DelayLine {
                ns,
                link,
                a,
                b,
                params,
                seed,
            } => write!(
                f,
                "ip netns exec {ns} netlab delay-line --link {link} --a {a} --b {b} {} --seed {seed}",
                delay_line_args(params).join(" ")
            ),
        }
    }
}

/// Command-line arguments of the delay-line process for these parameters.
pub fn delay_line_args(p: &LinkParams) -> Vec<String> {
    let mut v = vec![
        "--delay-ns".to_string(),
        p.delay_ns.to_string(),
        "--jitter-ns".into(),
        p.jitter_ns.to_string(),
        "--loss-ppm".into(),
        p.loss_ppm.to_string(),
    ];
    if let Some(q) = p.queue {
        v.push("--limit".into());
        v.push(q.to_string());
    }
    v
}

/// A plan: the ops, the addressing it realises, and what it will create.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub naming: Naming,
    pub options: PlanOptions,
    pub addressing: Addressing,
    pub namespaces: Vec<String>,
    pub ops: Vec<Op>,
    /// Every device with an HTB rate limit, for re-rating on a TDF change.
    pub shaped: Vec<Shaped>,
}

/// A device shaped to a link's configured (undilated) rate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shaped {
    pub ns: String,
    pub dev: String,
    pub bw_bps: u64,
}

/// The op that sets a shaped device's HTB class to its rate under `d`
/// (the paper's HTB fix for a TDF change, done from user space).
pub fn htb_rate_change(s: &Shaped, d: Dilation) -> Op {
    let rate = d.rate(s.bw_bps);
    tc(
        &s.ns,
        vec![
            "class".into(),
            "change".into(),
            "dev".into(),
            s.dev.clone(),
            "parent".into(),
            "1:".into(),
            "classid".into(),
            "1:1".into(),
            "htb".into(),
            "rate".into(),
            format!("{rate}bit"),
            "burst".into(),
            format!("{}b", htb_burst(rate)),
            "cburst".into(),
            format!("{}b", htb_burst(rate)),
            "quantum".into(),
            htb_quantum(rate).to_string(),
        ],
    )
}

fn ip(ns: &str, args: &[&str]) -> Op {
    Op::Cmd {
        ns: Some(ns.to_string()),
        tool: Tool::Ip,
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}
fn tc(ns: &str, args: Vec<String>) -> Op {
    Op::Cmd {
        ns: Some(ns.to_string()),
        tool: Tool::Tc,
        args,
    }
}
fn sysctl(ns: &str, key: &str, value: &str) -> Op {
    Op::Sysctl {
        ns: ns.into(),
        key: key.into(),
        value: value.into(),
    }
}

/// HTB bucket size: 4 ms worth of the rate, at least two full frames, so
/// that short bursts are smoothed but the long-run rate is exact.
pub fn htb_burst(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 250).max(3028)
}

/// HTB quantum inside the range HTB accepts without complaining.
pub fn htb_quantum(rate_bps: u64) -> u64 {
    (rate_bps / 8 / 10).clamp(1514, 200_000)
}

/// The tc ops that shape one device's egress.
fn shaping_ops(ns: &str, dev: &str, p: &LinkParams, o: &PlanOptions) -> Vec<Op> {
    let mut v = vec![];
    let netem = o.delay_backend == DelayBackend::Netem && p.needs_delay_stage();
    let s = |x: &str| x.to_string();
    let netem_args = |parent: &[&str]| {
        let mut a: Vec<String> = vec![s("qdisc"), s("add"), s("dev"), s(dev)];
        a.extend(parent.iter().map(|x| s(x)));
        a.push(s("netem"));
        a.extend([s("delay"), format!("{}us", o.dilation.delay(p.delay_ns) / 1000)]);
        if p.jitter_ns > 0 {
            a.push(format!("{}us", o.dilation.delay(p.jitter_ns) / 1000));
        }
        if p.loss_ppm > 0 {
            a.extend([s("loss"), format!("{}%", p.loss_ppm as f64 / 1e4)]);
        }
        if let Some(q) = p.queue {
            a.extend([s("limit"), q.to_string()]);
        }
        a
    };
    if let Some(bw) = p.bw_bps {
        let rate = o.dilation.rate(bw);
        v.push(tc(
            ns,
            [
                s("qdisc"),
                s("add"),
                s("dev"),
                s(dev),
                s("root"),
                s("handle"),
                s("1:"),
                s("htb"),
                s("default"),
                s("1"),
            ]
            .into(),
        ));
        v.push(tc(
            ns,
            vec![
                s("class"),
                s("add"),
                s("dev"),
                s(dev),
                s("parent"),
                s("1:"),
                s("classid"),
                s("1:1"),
                s("htb"),
                s("rate"),
                format!("{rate}bit"),
                s("burst"),
                format!("{}b", htb_burst(rate)),
                s("cburst"),
                format!("{}b", htb_burst(rate)),
                s("quantum"),
                htb_quantum(rate).to_string(),
            ],
        ));
        if netem {
            v.push(tc(ns, netem_args(&["parent", "1:1", "handle", "10:"])));
        } else if let Some(q) = p.queue {
            v.push(tc(
                ns,
                vec![
                    s("qdisc"),
                    s("add"),
                    s("dev"),
                    s(dev),
                    s("parent"),
                    s("1:1"),
                    s("handle"),
                    s("10:"),
                    s("pfifo"),
                    s("limit"),
                    q.to_string(),
                ],
            ));
        }
    } else if netem {
        v.push(tc(ns, netem_args(&["root"])));
    } else if let Some(q) = p.queue {
        v.push(tc(
            ns,
            vec![
                s("qdisc"),
                s("add"),
                s("dev"),
                s(dev),
                s("root"),
                s("pfifo"),
                s("limit"),
                q.to_string(),
            ],
        ));
    }
    v
}

/// Ops sorted into phases so that the batch applier needs few processes:
/// all namespaces, then their sysctls, bridges, veth pairs, then per
/// namespace its `ip` ops (addresses, links up, routes) and its `tc` ops,
/// the devices' sysfs settings, and the delay lines last. Within a namespace the order of creation is
/// kept, which is all that the dependencies between ops need.
#[derive(Default)]
struct Buckets {
    netns: Vec<Op>,
    sysctl: Vec<Op>,
    bridges: Vec<Op>,
    veths: Vec<Op>,
    ns_ip: Vec<(String, Vec<Op>)>,
    ns_tc: Vec<(String, Vec<Op>)>,
    sysfs: Vec<Op>,
    delay: Vec<Op>,
}

impl Buckets {
    fn add(&mut self, op: Op) {
        fn to_ns(v: &mut Vec<(String, Vec<Op>)>, ns: &str, op: Op) {
            match v.iter_mut().find(|(n, _)| n == ns) {
                Some((_, ops)) => ops.push(op),
                None => v.push((ns.to_string(), vec![op])),
            }
        }
        match &op {
            Op::AddNetns(_) => self.netns.push(op),
            Op::Sysctl { .. } | Op::Ethtool { .. } => self.sysctl.push(op),
            Op::Sysfs { .. } => self.sysfs.push(op),
            Op::DelayLine { .. } => self.delay.push(op),
            Op::Cmd { ns: None, .. } => self.veths.push(op),
            Op::Cmd {
                ns: Some(ns),
                tool: Tool::Tc,
                ..
            } => {
                let ns = ns.clone();
                to_ns(&mut self.ns_tc, &ns, op)
            }
            Op::Cmd { ns: Some(ns), args, .. } => {
                if args.len() > 1 && args[0] == "link" && args[1] == "add" {
                    self.bridges.push(op)
                } else {
                    let ns = ns.clone();
                    to_ns(&mut self.ns_ip, &ns, op)
                }
            }
        }
    }

    fn finish(self) -> Vec<Op> {
        let mut v = self.netns;
        v.extend(self.sysctl);
        v.extend(self.bridges);
        v.extend(self.veths);
        v.extend(self.ns_ip.into_iter().flat_map(|(_, o)| o));
        v.extend(self.ns_tc.into_iter().flat_map(|(_, o)| o));
        v.extend(self.sysfs);
        v.extend(self.delay);
        v
    }
}

/// Builds the plan. Validates the topology first, so a plan always describes
/// a buildable lab.
pub fn build_plan(t: &Topology, naming: &Naming, o: &PlanOptions) -> Result<Plan, ModelError> {
    t.validate()?;
    let addressing = plan_addressing_from(t, o.first_subnet)?;
    let fab = naming.fabric();
    let mut ops = Buckets::default();
    let mut shaped = Vec::new();
    let mut namespaces = vec![fab.clone()];

    // Namespaces first; IPv6 off before any interface exists so that no
    // router solicitations or DAD traffic disturb counts and measurements.
    let mut node_ns = vec![fab.clone()];
    for n in &t.nodes {
        if n.kind != NodeKind::Switch {
            node_ns.push(naming.ns(&n.name));
        }
    }
    for ns in &node_ns {
        ops.add(Op::AddNetns(ns.clone()));
        ops.add(sysctl(ns, "net.ipv6.conf.all.disable_ipv6", "1"));
        ops.add(sysctl(ns, "net.ipv6.conf.default.disable_ipv6", "1"));
        ops.add(ip(ns, &["link", "set", "lo", "up"]));
    }
    namespaces.extend(node_ns.iter().skip(1).cloned());
    for (ri, n) in t.nodes.iter().filter(|n| n.kind == NodeKind::Router).enumerate() {
        let ns = naming.ns(&n.name);
        ops.add(sysctl(&ns, "net.ipv4.ip_forward", "1"));
        // Layer-4 hash: flows between the same two hosts may take different
        // paths, as in the data centre ECMP of paper 003 section 5.
        ops.add(sysctl(&ns, "net.ipv4.fib_multipath_hash_policy", "1"));
        if let Some(seed) = o.ecmp_seed {
            // A different seed per router: with one seed everywhere every
            // router makes the same choice for a flow ("hash polarisation")
            // and half of the fat tree's core would stay idle. 0 would ask
            // the kernel for a random seed, so it is skipped.
            let own = seed.wrapping_add(ri as u32 + 1).max(1);
            ops.add(sysctl(&ns, "net.ipv4.fib_multipath_hash_seed", &own.to_string()));
        }
    }
    for n in t.nodes.iter().filter(|n| n.kind == NodeKind::Switch) {
        ops.add(ip(&fab, &["link", "add", &n.name, "type", "bridge"]));
        ops.add(ip(&fab, &["link", "set", &n.name, "up"]));
    }

    let kind = |name: &str| t.node(name).map(|n| n.kind).unwrap_or(NodeKind::Host);
    for (i, l) in t.links.iter().enumerate() {
        // Where each end of the link lives: (namespace, device, bridge,
        // address, MAC); an addressed end gets the MAC the plan's static
        // neighbour entries name.
        let end = |name: &str, side: &str| {
            if kind(name) == NodeKind::Switch {
                (fab.clone(), format!("p{i}{side}"), Some(name.to_string()), None, None)
            } else {
                let ifc = addressing.ifaces.iter().find(|f| f.link == i && f.node == name);
                let ifname = ifc.map(|f| f.ifname.clone()).unwrap_or_default();
                (
                    naming.ns(name),
                    ifname,
                    None,
                    ifc.map(|f| format!("{}/{}", f.addr, f.prefix)),
                    ifc.map(|f| mac_of(f.addr)),
                )
            }
        };
        let ea = end(&l.a, "a");
        let eb = end(&l.b, "b");
        let delay_line = o.delay_backend == DelayBackend::DelayLine && l.params.needs_delay_stage();
        if delay_line {
            let (da, db) = (format!("d{i}a"), format!("d{i}b"));
            ops.add(veth((&ea.0, &ea.1, ea.4.as_deref()), (&fab, &da, None)));
            ops.add(veth((&eb.0, &eb.1, eb.4.as_deref()), (&fab, &db, None)));
            ops.add(ip(&fab, &["link", "set", &da, "up"]));
            ops.add(ip(&fab, &["link", "set", &db, "up"]));
        } else {
            ops.add(veth((&ea.0, &ea.1, ea.4.as_deref()), (&eb.0, &eb.1, eb.4.as_deref())));
        }
        for (ns, dev, bridge, addr, _) in [&ea, &eb] {
            if let Some(br) = bridge {
                ops.add(ip(ns, &["link", "set", dev, "master", br]));
            }
            if let Some(a) = addr {
                ops.add(ip(ns, &["addr", "add", a, "dev", dev]));
            }
            ops.add(ip(ns, &["link", "set", dev, "up"]));
            for op in shaping_ops(ns, dev, &l.params, o) {
                ops.add(op);
            }
            if let Some(bw_bps) = l.params.bw_bps {
                shaped.push(Shaped {
                    ns: ns.clone(),
                    dev: dev.clone(),
                    bw_bps,
                });
            }
        }
        if delay_line {
            let mut params = l.params.clone();
            params.delay_ns = o.dilation.delay(params.delay_ns);
            params.jitter_ns = o.dilation.delay(params.jitter_ns);
            ops.add(Op::DelayLine {
                ns: fab.clone(),
                link: i,
                a: format!("d{i}a"),
                b: format!("d{i}b"),
                params,
                seed: 0x6e65_746c_6162 ^ i as u64,
            });
        }
    }

    // Permanent neighbour entries: no ARP (and no ARP broadcast flooding a
    // big segment) where the plan knows the answer, and entries the kernel
    // never counts against its shared table's gc_thresh3, so a check needs
    // none of the table and cannot overflow it, also in a container where
    // the table cannot be raised.
    for (at, of) in addressing.static_neighbours() {
        let (me, other) = (&addressing.ifaces[at], &addressing.ifaces[of]);
        ops.add(neighbour(
            &naming.ns(&me.node),
            &me.ifname,
            other.addr,
            &mac_of(other.addr),
        ));
    }

    for r in &addressing.routes {
        let ns = naming.ns(&r.node);
        let dest = if r.prefix == 0 {
            "default".to_string()
        } else {
            format!("{}/{}", r.net, r.prefix)
        };
        let mut args = vec!["route".to_string(), "add".into(), dest];
        if let [(gw, dev)] = r.nexthops.as_slice() {
            args.extend(["via".into(), gw.to_string(), "dev".into(), dev.clone()]);
        } else {
            for (gw, dev) in &r.nexthops {
                args.extend([
                    "nexthop".into(),
                    "via".into(),
                    gw.to_string(),
                    "dev".into(),
                    dev.clone(),
                ]);
            }
        }
        ops.add(Op::Cmd {
            ns: Some(ns),
            tool: Tool::Ip,
            args,
        });
    }

    for (index, d) in t.device_settings.iter().enumerate() {
        ops.add(device_setting(&addressing, naming, index, d)?);
    }
    for (index, b) in t.address_blocks.iter().enumerate() {
        for op in address_block_ops(t, &addressing, naming, index, b)? {
            ops.add(op);
        }
    }
    // A veth in the node's namespace whose peer stays down: what is sent
    // through it is freed at once.
    for d in &t.discard_devices {
        let ns = naming.ns(&d.node);
        ops.add(ip(
            &ns,
            &["link", "add", &d.dev, "type", "veth", "peer", "name", &d.peer()],
        ));
        ops.add(ip(&ns, &["link", "set", &d.dev, "up"]));
    }

    Ok(Plan {
        shaped,
        naming: naming.clone(),
        options: o.clone(),
        addressing,
        namespaces,
        ops: ops.finish(),
    })
}

/// The op of device setting `index`, once the plan's addressing shows that
/// its node has that device (the topology's validation checked the rest).
fn device_setting(
    addressing: &Addressing,
    naming: &Naming,
    index: usize,
    d: &crate::model::DeviceSetting,
) -> Result<Op, ModelError> {
    if !addressing.ifaces.iter().any(|i| i.node == d.node && i.ifname == d.dev) {
        return Err(unknown_device(
            addressing,
            format!("device setting {index}"),
            &d.node,
            &d.dev,
        ));
    }
    Ok(Op::Sysfs {
        ns: naming.ns(&d.node),
        dev: d.dev.clone(),
        set: d.set.clone(),
    })
}

/// The error for a device `node` does not have in the plan, listing those
/// it has.
fn unknown_device(addressing: &Addressing, item: String, node: &str, dev: &str) -> ModelError {
    let devices: Vec<&str> = addressing
        .ifaces
        .iter()
        .filter(|i| i.node == node)
        .map(|i| i.ifname.as_str())
        .collect();
    ModelError::UnknownDevice {
        item,
        node: node.to_string(),
        dev: dev.to_string(),
        known: if devices.is_empty() {
            "it is on no link, so it has none".into()
        } else {
            format!("its devices: {}", devices.join(", "))
        },
    }
}

/// The ops of address block `index`: its addresses on the host's device
/// and, on the node at the other end of that device's link, a route to the
/// block's network over the link and a permanent neighbour entry for each
/// address (the host device's MAC), once the plan shows that the device
/// exists, that its link ends at a host or router, and that the block is
/// apart from the lab's subnets.
fn address_block_ops(
    t: &Topology,
    addressing: &Addressing,
    naming: &Naming,
    index: usize,
    b: &crate::model::AddressBlock,
) -> Result<Vec<Op>, ModelError> {
    let item = format!("address block {index} ({}:{})", b.node, b.dev);
    let Some(me) = addressing.ifaces.iter().find(|i| i.node == b.node && i.ifname == b.dev) else {
        return Err(unknown_device(addressing, item, &b.node, &b.dev));
    };
    let link = &t.links[me.link];
    let peer_node = if link.a == b.node { &link.b } else { &link.a };
    let Some(peer) = addressing
        .ifaces
        .iter()
        .find(|i| i.link == me.link && i.node == *peer_node)
    else {
        return Err(ModelError::BadValue {
            item,
            value: peer_node.clone(),
            expected: "a link that ends at a host or router (a switch leaves no single peer to route from)".into(),
        });
    };
    if let Some(s) = addressing.segments.iter().find(|s| b.overlaps(s.net, s.prefix)) {
        return Err(ModelError::BadValue {
            item,
            value: format!("{}/{}", b.net, b.prefix),
            expected: format!("a network apart from the lab's subnet {}/{}", s.net, s.prefix),
        });
    }
    let (ns, peer_ns, mac) = (naming.ns(&b.node), naming.ns(&peer.node), mac_of(me.addr));
    let mut ops = Vec::with_capacity(2 * b.addrs.len() + 1);
    for a in &b.addrs {
        ops.push(ip(&ns, &["addr", "add", &format!("{a}/32"), "dev", &b.dev]));
    }
    let net = format!("{}/{}", b.net, b.prefix);
    ops.push(ip(&peer_ns, &["route", "add", &net, "dev", &peer.ifname]));
    for a in &b.addrs {
        ops.push(neighbour(&peer_ns, &peer.ifname, *a, &mac));
    }
    Ok(ops)
}

/// A veth pair created straight into the two namespaces (from the caller's
/// namespace, where nothing of it ever appears); each end is (namespace,
/// device, MAC if the plan chooses it).
fn veth(a: (&str, &str, Option<&str>), b: (&str, &str, Option<&str>)) -> Op {
    let mut args = vec!["link", "add", a.1];
    if let Some(mac) = a.2 {
        args.extend(["address", mac]);
    }
    args.extend(["netns", a.0, "type", "veth", "peer", "name", b.1]);
    if let Some(mac) = b.2 {
        args.extend(["address", mac]);
    }
    args.extend(["netns", b.0]);
    Op::Cmd {
        ns: None,
        tool: Tool::Ip,
        args: args.iter().map(|s| s.to_string()).collect(),
    }
}

/// A permanent neighbour entry: in `ns`, `addr` is at `mac` behind `dev`.
pub fn neighbour(ns: &str, dev: &str, addr: std::net::Ipv4Addr, mac: &str) -> Op {
    ip(
        ns,
        &[
            "neigh",
            "replace",
            &addr.to_string(),
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_tdf_scales_rates_and_delays_and_reads_old_state() {
        let d = Dilation {
            tdf: parse_tdf("2.5").unwrap(),
        };
        assert_eq!(d.rate(100_000_000), 40_000_000);
        assert_eq!(d.delay(1_000_000), 2_500_000);
        let third = Dilation {
            tdf: parse_tdf("4/3").unwrap(),
        };
        assert_eq!(third.rate(4_000), 3_000);
        assert_eq!(third.delay(3), 4);
        assert!(parse_tdf("0.5").unwrap_err().contains("between 1 and 1000"));
        assert!(parse_tdf("1001").is_err() && parse_tdf("x").is_err());
        // State files: the text form, and the whole numbers older ones hold.
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, r#"{"tdf":"2.5"}"#);
        assert_eq!(serde_json::from_str::<Dilation>(&json).unwrap(), d);
        let old: Dilation = serde_json::from_str(r#"{"tdf":4}"#).unwrap();
        assert_eq!(old.tdf, Tdf::new(4, 1).unwrap());
    }

    #[test]
    fn a_tdf_change_rerates_every_shaped_device() {
        let s = Shaped {
            ns: "netlab-r1-h1".into(),
            dev: "eth0".into(),
            bw_bps: 100_000_000,
        };
        assert_eq!(
            htb_rate_change(&s, Dilation { tdf: Tdf::new(4, 1).unwrap() }).to_string(),
            "tc -n netlab-r1-h1 class change dev eth0 parent 1: classid 1:1 htb rate 25000000bit burst 12500b cburst 12500b quantum 200000"
        );
        let t = crate::topo::Builtin::Star { hosts: 2 }.build(&LinkParams {
            bw_bps: Some(10_000_000),
            ..Default::default()
        });
        let plan = build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap();
        // Both ends of both links.
        assert_eq!(plan.shaped.len(), 4);
        assert!(plan.shaped.iter().all(|s| s.bw_bps == 10_000_000));
    }
    use crate::topo::Builtin;

    fn render(p: &Plan) -> Vec<String> {
        p.ops.iter().map(|o| o.to_string()).collect()
    }

    #[test]
    fn pair_plan_is_exact() {
        let t = Builtin::Pair.build(&LinkParams {
            bw_bps: Some(100_000_000),
            ..Default::default()
        });
        let p = build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap();
        let ops = render(&p);
        let want = [
            "ip netns add netlab-r1--fabric",
            "ip netns add netlab-r1-h1",
            "ip netns add netlab-r1-h2",
            "ip netns exec netlab-r1--fabric sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
            "ip netns exec netlab-r1--fabric sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
            "ip netns exec netlab-r1-h1 sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
            "ip netns exec netlab-r1-h1 sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
            "ip netns exec netlab-r1-h2 sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
            "ip netns exec netlab-r1-h2 sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
            "ip link add eth0 address 02:4e:0a:00:00:01 netns netlab-r1-h1 type veth peer name eth0 address 02:4e:0a:00:00:02 netns netlab-r1-h2",
            "ip -n netlab-r1--fabric link set lo up",
            "ip -n netlab-r1-h1 link set lo up",
            "ip -n netlab-r1-h1 addr add 10.0.0.1/30 dev eth0",
            "ip -n netlab-r1-h1 link set eth0 up",
            "ip -n netlab-r1-h1 neigh replace 10.0.0.2 lladdr 02:4e:0a:00:00:02 dev eth0 nud permanent",
            "ip -n netlab-r1-h2 link set lo up",
            "ip -n netlab-r1-h2 addr add 10.0.0.2/30 dev eth0",
            "ip -n netlab-r1-h2 link set eth0 up",
            "ip -n netlab-r1-h2 neigh replace 10.0.0.1 lladdr 02:4e:0a:00:00:01 dev eth0 nud permanent",
            "tc -n netlab-r1-h1 qdisc add dev eth0 root handle 1: htb default 1",
            "tc -n netlab-r1-h1 class add dev eth0 parent 1: classid 1:1 htb rate 100000000bit burst 50000b cburst 50000b quantum 200000",
            "tc -n netlab-r1-h2 qdisc add dev eth0 root handle 1: htb default 1",
            "tc -n netlab-r1-h2 class add dev eth0 parent 1: classid 1:1 htb rate 100000000bit burst 50000b cburst 50000b quantum 200000",
        ];
        assert_eq!(ops, want);
        assert_eq!(p.namespaces, ["netlab-r1--fabric", "netlab-r1-h1", "netlab-r1-h2"]);
    }

    #[test]
    fn star_ports_join_the_bridge() {
        let t = Builtin::Star { hosts: 2 }.build(&LinkParams::default());
        let ops = render(&build_plan(&t, &Naming::new("x"), &PlanOptions::default()).unwrap());
        assert!(ops.contains(&"ip -n netlab-x--fabric link add s1 type bridge".to_string()));
        assert!(ops.contains(
            &"ip link add eth0 address 02:4e:0a:00:00:02 netns netlab-x-h2 type veth peer name p1b netns netlab-x--fabric"
                .to_string()
        ));
        // Every host knows every other: no ARP in a small lab.
        assert!(ops.contains(
            &"ip -n netlab-x-h2 neigh replace 10.0.0.1 lladdr 02:4e:0a:00:00:01 dev eth0 nud permanent".to_string()
        ));
        assert!(ops.contains(&"ip -n netlab-x--fabric link set p1b master s1".to_string()));
        assert!(!ops.iter().any(|o| o.contains("tc ")));
    }

    #[test]
    fn delay_uses_the_chosen_backend_and_dilation() {
        let params = LinkParams {
            bw_bps: Some(10_000_000),
            delay_ns: 2_000_000,
            queue: Some(50),
            ..Default::default()
        };
        let t = Builtin::Pair.build(&params);
        let mut o = PlanOptions {
            dilation: Dilation {
                tdf: Tdf::new(2, 1).unwrap(),
            },
            ..Default::default()
        };
        let ops = render(&build_plan(&t, &Naming::new("x"), &o).unwrap());
        assert!(ops.contains(
            &"ip link add eth0 address 02:4e:0a:00:00:01 netns netlab-x-h1 type veth peer name d0a netns netlab-x--fabric"
                .to_string()
        ));
        assert!(ops.iter().any(|o| o.starts_with(
            "ip netns exec netlab-x--fabric netlab delay-line --link 0 --a d0a --b d0b --delay-ns 4000000 --jitter-ns 0 --loss-ppm 0 --limit 50 --seed "
        )));
        assert!(ops.iter().any(|o| o.contains("htb rate 5000000bit")));
        assert!(ops.iter().any(|o| o.ends_with("pfifo limit 50")));
        o.delay_backend = DelayBackend::Netem;
        let ops = render(&build_plan(&t, &Naming::new("x"), &o).unwrap());
        assert!(!ops.iter().any(|o| o.contains("delay-line")));
        assert!(ops.contains(
            &"tc -n netlab-x-h1 qdisc add dev eth0 parent 1:1 handle 10: netem delay 4000us limit 50".to_string()
        ));
    }

    #[test]
    fn fattree_routers_get_ecmp_routes() {
        let t = Builtin::FatTree { k: 4 }.build(&LinkParams::default());
        let o = PlanOptions {
            ecmp_seed: Some(7),
            ..Default::default()
        };
        let p = build_plan(&t, &Naming::new("f"), &o).unwrap();
        let ops = render(&p);
        assert_eq!(p.namespaces.len(), 1 + 16 + 20);
        assert!(ops.contains(&"ip netns exec netlab-f-c1 sysctl -qw net.ipv4.fib_multipath_hash_policy=1".to_string()));
        assert!(ops.contains(&"ip netns exec netlab-f-c1 sysctl -qw net.ipv4.fib_multipath_hash_seed=8".to_string()));
        let multipath = ops.iter().filter(|o| o.contains(" nexthop via ")).count();
        // Edge routers: 14 remote host subnets, 2 next hops each (8 routers);
        // aggregation routers: 12 other-pod subnets via 2 cores (8 routers).
        assert_eq!(multipath, 8 * 14 + 8 * 12);
        assert!(ops.contains(&"ip -n netlab-f-h1 route add default via 10.0.0.2 dev eth0".to_string()));
    }

    #[test]
    fn a_big_star_has_permanent_neighbours_to_its_hub_only() {
        let t = Builtin::Star { hosts: 301 }.build(&LinkParams::default());
        let ops = render(&build_plan(&t, &Naming::new("b"), &PlanOptions::default()).unwrap());
        let neigh: Vec<&String> = ops.iter().filter(|o| o.contains(" neigh replace ")).collect();
        assert_eq!(neigh.len(), 2 * 300);
        assert!(ops.contains(
            &"ip -n netlab-b-h1 neigh replace 10.0.1.45 lladdr 02:4e:0a:00:01:2d dev eth0 nud permanent".to_string()
        ));
        assert!(ops.contains(
            &"ip -n netlab-b-h301 neigh replace 10.0.0.1 lladdr 02:4e:0a:00:00:01 dev eth0 nud permanent".to_string()
        ));
        assert!(!ops
            .iter()
            .any(|o| o.starts_with("ip -n netlab-b-h2 neigh replace 10.0.0.3 ")));
    }

    #[test]
    fn a_device_setting_is_planned_after_its_device_is_up_and_checked_against_the_plan() {
        use crate::model::{CpuList, DeviceSetting};
        let mut t = Builtin::Pair.build(&LinkParams {
            bw_bps: Some(10_000_000),
            delay_ns: 1_000_000,
            ..Default::default()
        });
        let rps = |node: &str, dev: &str, cpus: &str| DeviceSetting {
            node: node.into(),
            dev: dev.into(),
            set: Sysfs::RpsCpus(CpuList::parse(cpus).unwrap()),
        };
        t.device_settings = vec![rps("h1", "eth0", "1,3"), rps("h2", "eth0", "0")];
        let p = build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap();
        let ops = render(&p);
        let at = |line: &str| {
            ops.iter()
                .position(|o| o == line)
                .unwrap_or_else(|| panic!("no {line} in {ops:#?}"))
        };
        let h1 =
            at("ip netns exec netlab-r1-h1 sh -c 'echo a | tee /sys/class/net/eth0/queues/rx-*/rps_cpus >/dev/null'");
        let h2 =
            at("ip netns exec netlab-r1-h2 sh -c 'echo 1 | tee /sys/class/net/eth0/queues/rx-*/rps_cpus >/dev/null'");
        assert_eq!(
            p.ops[h1],
            Op::Sysfs {
                ns: "netlab-r1-h1".into(),
                dev: "eth0".into(),
                set: Sysfs::RpsCpus(CpuList::parse("1,3").unwrap()),
            }
        );
        // After the device exists, is up and is shaped; before the delay
        // lines, which are processes (the last phase).
        assert!(h1 > at("ip -n netlab-r1-h1 link set eth0 up"));
        assert!(ops[..h1].iter().any(|o| o.starts_with("tc -n netlab-r1-h2 ")));
        assert_eq!((h2, ops.len()), (h1 + 1, h1 + 3));
        assert!(ops[h1 + 2].contains("delay-line"));
        // A device the plan does not make is refused, naming the node's.
        t.device_settings = vec![rps("h1", "eth1", "0")];
        let e = build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device setting 0: h1 has no device 'eth1' in the plan (its devices: eth0)"
        );
        // Nodes, device names and repeats are the topology's to check.
        for (bad, why) in [
            (vec![rps("h9", "eth0", "0")], "h9"),
            (vec![rps("h1", "../lo", "0")], "no '/'"),
            (
                vec![rps("h1", "eth0", "0"), rps("h1", "eth0", "1")],
                "one setting of each kind",
            ),
        ] {
            t.device_settings = bad;
            let e = build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        let mut star = Builtin::Star { hosts: 2 }.build(&LinkParams::default());
        star.device_settings = vec![rps("s1", "eth0", "0")];
        let e = build_plan(&star, &Naming::new("r1"), &PlanOptions::default()).unwrap_err();
        assert!(e.to_string().contains("a switch is a bridge"), "{e}");
    }

    #[test]
    fn an_address_block_is_planned_with_its_route_and_neighbours_and_checked() {
        use crate::model::{AddressBlock, DiscardDevice};
        use std::net::Ipv4Addr;
        let mut t = Builtin::Pair.build(&LinkParams::default());
        let block = |addrs: Vec<Ipv4Addr>| AddressBlock {
            node: "h2".into(),
            dev: "eth0".into(),
            net: Ipv4Addr::new(10, 211, 0, 0),
            prefix: 16,
            addrs,
        };
        let (m1, m2) = (Ipv4Addr::new(10, 211, 0, 1), Ipv4Addr::new(10, 211, 1, 7));
        t.address_blocks = vec![block(vec![m1, m2])];
        t.discard_devices = vec![DiscardDevice {
            node: "h1".into(),
            dev: "sinkd".into(),
        }];
        let ops = render(&build_plan(&t, &Naming::new("r1"), &PlanOptions::default()).unwrap());
        let at = |line: &str| {
            ops.iter()
                .position(|o| o == line)
                .unwrap_or_else(|| panic!("no {line} in {ops:#?}"))
        };
        // The addresses on h2's device once it is up; h1 routes the block
        // over the link and knows h2's MAC for each address.
        let up = at("ip -n netlab-r1-h2 link set eth0 up");
        let first = at("ip -n netlab-r1-h2 addr add 10.211.0.1/32 dev eth0");
        assert_eq!(at("ip -n netlab-r1-h2 addr add 10.211.1.7/32 dev eth0"), first + 1);
        assert!(first > up);
        let route = at("ip -n netlab-r1-h1 route add 10.211.0.0/16 dev eth0");
        let mac = crate::addr::mac_of(Ipv4Addr::new(10, 0, 0, 2));
        for m in [m1, m2] {
            let n = at(&format!(
                "ip -n netlab-r1-h1 neigh replace {m} lladdr {mac} dev eth0 nud permanent"
            ));
            assert!(n > route);
        }
        // The discard device: a veth in h1's namespace, up, its peer down.
        let add = at("ip -n netlab-r1-h1 link add sinkd type veth peer name sinkdp");
        assert!(at("ip -n netlab-r1-h1 link set sinkd up") > add);
        assert!(!ops.iter().any(|o| o.contains("link set sinkdp up")));

        // What the plan refuses, naming the problem.
        let refused = |t: &Topology| {
            build_plan(t, &Naming::new("r1"), &PlanOptions::default())
                .unwrap_err()
                .to_string()
        };
        for (b, why) in [
            (block(vec![]), "1 to 65536 addresses"),
            (block(vec![m1, m1]), "each address once"),
            (
                block(vec![Ipv4Addr::new(10, 212, 0, 1)]),
                "an address inside 10.211.0.0/16",
            ),
            (
                AddressBlock {
                    net: Ipv4Addr::new(10, 211, 0, 1),
                    ..block(vec![m1])
                },
                "no host bits set",
            ),
            (
                AddressBlock {
                    dev: "eth1".into(),
                    ..block(vec![m1])
                },
                "address block 0 (h2:eth1): h2 has no device 'eth1' in the plan (its devices: eth0)",
            ),
            (
                AddressBlock {
                    net: Ipv4Addr::new(10, 0, 0, 0),
                    prefix: 8,
                    addrs: vec![Ipv4Addr::new(10, 9, 0, 1)],
                    ..block(vec![])
                },
                "apart from the lab's subnet 10.0.0.0/",
            ),
        ] {
            t.address_blocks = vec![b];
            let e = refused(&t);
            assert!(e.contains(why), "{why}: {e}");
        }
        t.address_blocks = vec![block(vec![m1]), block(vec![m2])];
        assert!(refused(&t).contains("apart from the earlier block's 10.211.0.0/16"));
        t.address_blocks = vec![];
        for (dev, why) in [
            ("eth5", "links' devices"),
            ("fifteen_bytes_x", "at most 14 bytes"),
            ("lo", "loopback"),
        ] {
            t.discard_devices = vec![DiscardDevice {
                node: "h1".into(),
                dev: dev.into(),
            }];
            let e = refused(&t);
            assert!(e.contains(why), "{dev}: {e}");
        }
        // A block behind a switch has no single peer to route from.
        let mut star = Builtin::Star { hosts: 2 }.build(&LinkParams::default());
        star.address_blocks = vec![block(vec![m1])];
        assert!(refused(&star).contains("a switch leaves no single peer"));
    }

    #[test]
    fn dilation_scales_rate_down_and_delay_up() {
        let d = Dilation {
            tdf: Tdf::new(4, 1).unwrap(),
        };
        assert_eq!(d.rate(100_000_000), 25_000_000);
        assert_eq!(d.delay(1_000_000), 4_000_000);
    }
}
