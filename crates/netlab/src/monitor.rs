//! Monitor ports: a copy of every frame a lab node's interfaces send and
//! receive, on a veth pair in the node's namespace (`NAME-tx` sends, `NAME`
//! receives), for `capture -i NAME` or any other capture. Built and removed
//! as plan operations ([`add_ops`], [`remove_ops`]), so `netlab plan`'s
//! shell rendering, the trace and the error reports cover them like every
//! other step of a lab.
//!
//! Mirroring is a tc `mirred` action on the ingress and egress of every
//! other interface of the node, in its clsact qdisc (added where there is
//! none, kept where there is one), at one priority ([`MIRROR_PREF`]) so
//! removal finds exactly these filters. `u32 match u32 0 0` matches every
//! frame: this kernel has no `matchall`. VLAN offload is off on the sending
//! end so tags travel in the frame (an XDP capture sees no VLAN metadata).
//! IPv6 needs no step: the lab's namespaces default it off, so the pair
//! gets no address and sends nothing of its own.

use crate::error::LabError;
use crate::lab::RunState;
use crate::netns;
use crate::plan::{Op, Tool};

/// The tc priority of the mirroring filters.
pub const MIRROR_PREF: &str = "49000";

/// What the node's namespace holds now: the interfaces to mirror and which
/// of them already have a clsact qdisc (and, for removal, our filters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Iface {
    pub name: String,
    pub has_clsact: bool,
    pub has_mirror: bool,
}

/// Checks a monitor port's name: the sending end adds `-tx`, and an
/// interface name has at most 15 bytes.
pub fn check_name(name: &str) -> Result<(), LabError> {
    if name.is_empty() || name.len() > 12 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(LabError::Monitor(format!(
            "--name '{name}': use 1 to 12 letters, digits or '-' (the sending end adds '-tx')"
        )));
    }
    Ok(())
}

fn tx(name: &str) -> String {
    format!("{name}-tx")
}

fn cmd(ns: &str, tool: Tool, args: &[&str]) -> Op {
    Op::Cmd {
        ns: Some(ns.to_string()),
        tool,
        args: args.iter().map(|a| a.to_string()).collect(),
    }
}

/// The operations that make monitor port `name` in namespace `ns`, whose
/// other interfaces are `ifaces`.
pub fn add_ops(ns: &str, name: &str, ifaces: &[Iface]) -> Vec<Op> {
    let t = tx(name);
    let mut ops = vec![
        cmd(ns, Tool::Ip, &["link", "add", &t, "type", "veth", "peer", "name", name]),
        cmd(ns, Tool::Ip, &["link", "set", &t, "up"]),
        cmd(ns, Tool::Ip, &["link", "set", name, "up"]),
        Op::Ethtool {
            ns: ns.to_string(),
            args: vec!["-K".into(), t.clone(), "txvlan".into(), "off".into()],
        },
    ];
    for i in ifaces {
        if !i.has_clsact {
            ops.push(cmd(ns, Tool::Tc, &["qdisc", "add", "dev", &i.name, "clsact"]));
        }
        for hook in ["ingress", "egress"] {
            ops.push(cmd(
                ns,
                Tool::Tc,
                &[
                    "filter",
                    "add",
                    "dev",
                    &i.name,
                    hook,
                    "pref",
                    MIRROR_PREF,
                    "u32",
                    "match",
                    "u32",
                    "0",
                    "0",
                    "action",
                    "mirred",
                    "egress",
                    "mirror",
                    "dev",
                    &t,
                ],
            ));
        }
    }
    ops
}

/// The operations that remove monitor port `name`: the mirroring filters
/// where they are, then the pair (its peer goes with it).
pub fn remove_ops(ns: &str, name: &str, ifaces: &[Iface]) -> Vec<Op> {
    let mut ops = vec![];
    for i in ifaces.iter().filter(|i| i.has_mirror) {
        for hook in ["ingress", "egress"] {
            ops.push(cmd(
                ns,
                Tool::Tc,
                &["filter", "del", "dev", &i.name, hook, "pref", MIRROR_PREF],
            ));
        }
    }
    ops.push(cmd(ns, Tool::Ip, &["link", "del", &tx(name)]));
    ops
}

/// The namespace's interfaces other than loopback and the port itself.
fn interfaces(ns: &str, name: &str) -> Result<(Vec<Iface>, bool), LabError> {
    let t = tx(name);
    let mut names: Vec<String> = netns::link_counters(ns)?.into_keys().collect();
    names.sort();
    let exists = names.iter().any(|n| *n == t || n == name);
    let mut out = vec![];
    for n in names.into_iter().filter(|n| n != "lo" && n != name && *n != t) {
        let qdiscs = tc_show(ns, &["qdisc", "show", "dev", &n])?;
        let filters = tc_show(ns, &["filter", "show", "dev", &n, "ingress"])?;
        out.push(Iface {
            has_clsact: qdiscs.contains("clsact"),
            has_mirror: filters.contains(&format!("pref {MIRROR_PREF} ")),
            name: n,
        });
    }
    Ok((out, exists))
}

fn tc_show(ns: &str, args: &[&str]) -> Result<String, LabError> {
    let what = format!("tc -n {ns} {}", args.join(" "));
    let out = std::process::Command::new("tc")
        .args(["-n", ns])
        .args(args)
        .output()
        .map_err(|e| LabError::io(what.clone(), e))?;
    if !out.status.success() {
        return Err(LabError::Monitor(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ns_of<'a>(st: &'a RunState, host: &str) -> Result<&'a str, LabError> {
    st.hosts
        .iter()
        .find(|h| h.name == host)
        .map(|h| h.ns.as_str())
        .ok_or_else(|| LabError::UnknownHost {
            host: host.into(),
            run: st.run_id.clone(),
            known: st.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>().join(", "),
        })
}

/// Gives `host` of a running lab monitor port `name`.
pub fn add(st: &RunState, host: &str, name: &str) -> Result<(), LabError> {
    check_name(name)?;
    let ns = ns_of(st, host)?;
    let (ifaces, exists) = interfaces(ns, name)?;
    if exists {
        return Err(LabError::Monitor(format!(
            "'{host}' already has a monitor port {name} (or an interface of that name); \
             remove it with --remove or choose another --name"
        )));
    }
    let ops = add_ops(ns, name, &ifaces);
    crate::apply::run_ops_batched(&ops).inspect_err(|_| {
        // Half a port is worse than none: take back what was made.
        let (now, _) = interfaces(ns, name).unwrap_or_default();
        let _ = crate::apply::run_ops_batched(&remove_ops(ns, name, &now));
    })
}

/// Removes monitor port `name` from `host` of a running lab.
pub fn remove(st: &RunState, host: &str, name: &str) -> Result<(), LabError> {
    check_name(name)?;
    let ns = ns_of(st, host)?;
    let (ifaces, exists) = interfaces(ns, name)?;
    if !exists {
        return Err(LabError::Monitor(format!("'{host}' has no monitor port {name}")));
    }
    crate::apply::run_ops_batched(&remove_ops(ns, name, &ifaces))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_mirror_every_other_interface_and_keep_an_existing_clsact() {
        let ifaces = [
            Iface {
                name: "eth0".into(),
                has_clsact: false,
                has_mirror: false,
            },
            Iface {
                name: "eth1".into(),
                has_clsact: true,
                has_mirror: true,
            },
        ];
        let text: Vec<String> = add_ops("ns1", "mon0", &ifaces).iter().map(|o| o.to_string()).collect();
        assert_eq!(text[0], "ip -n ns1 link add mon0-tx type veth peer name mon0");
        assert!(text.contains(&"ip netns exec ns1 ethtool -K mon0-tx txvlan off".to_string()));
        assert!(text.contains(&"tc -n ns1 qdisc add dev eth0 clsact".to_string()));
        assert!(!text.iter().any(|t| t.contains("qdisc add dev eth1")), "{text:?}");
        let mirrors = text
            .iter()
            .filter(|t| t.contains("mirred egress mirror dev mon0-tx"))
            .count();
        assert_eq!(mirrors, 4, "ingress and egress of both: {text:?}");
        let rm: Vec<String> = remove_ops("ns1", "mon0", &ifaces)
            .iter()
            .map(|o| o.to_string())
            .collect();
        assert_eq!(
            rm,
            [
                "tc -n ns1 filter del dev eth1 ingress pref 49000",
                "tc -n ns1 filter del dev eth1 egress pref 49000",
                "ip -n ns1 link del mon0-tx",
            ]
        );
        assert!(check_name("mon0").is_ok() && check_name("a-very-long-name").is_err() && check_name("m 0").is_err());
    }
}
