//! Built-in, parameterised topologies. Each is a pure generator of a
//! [`Topology`]; the same link parameters are given to every link.

use crate::error::ModelError;
use crate::model::{Link, LinkParams, Node, NodeKind, Topology};

pub const MAX_HOSTS: i64 = 1000;
pub const MAX_SWITCHES: i64 = 1000;
pub const MAX_FATTREE_K: i64 = 8;

/// A built-in topology and its size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Builtin {
    /// Two hosts on one direct link.
    Pair,
    /// `hosts` hosts on one switch.
    Star { hosts: usize },
    /// `switches` switches in a line, one host on each.
    Linear { switches: usize },
    /// Two hosts through `switches` switches in a line (paper 003 fig. 3a).
    Chain { switches: usize },
    /// k-ary fat tree of routers with ECMP (paper 003 fig. 7).
    FatTree { k: usize },
}

fn range(item: &str, v: i64, lo: i64, hi: i64) -> Result<usize, ModelError> {
    if v < lo || v > hi {
        return Err(ModelError::OutOfRange {
            item: item.into(),
            value: v.to_string(),
            range: format!("between {lo} and {hi}"),
        });
    }
    Ok(v as usize)
}

impl Builtin {
    /// Builds a topology kind from its name and the size parameters given in a
    /// scenario or on the command line, rejecting absurd sizes.
    pub fn from_parts(
        kind: &str,
        hosts: Option<i64>,
        switches: Option<i64>,
        k: Option<i64>,
    ) -> Result<Self, ModelError> {
        let need = |p: Option<i64>, name: &str, hint: &str| {
            p.ok_or_else(|| ModelError::MissingParam {
                topo: kind.into(),
                param: name.into(),
                hint: hint.into(),
            })
        };
        Ok(match kind {
            "pair" => Builtin::Pair,
            "star" => Builtin::Star {
                hosts: range(
                    "topology.hosts",
                    need(hosts, "hosts", "the number of hosts, e.g. hosts = 4")?,
                    1,
                    MAX_HOSTS,
                )?,
            },
            "linear" => Builtin::Linear {
                switches: range(
                    "topology.switches",
                    need(switches, "switches", "the number of switches, e.g. switches = 10")?,
                    1,
                    MAX_SWITCHES,
                )?,
            },
            "chain" => Builtin::Chain {
                switches: range(
                    "topology.switches",
                    need(switches, "switches", "the number of switches, e.g. switches = 10")?,
                    1,
                    MAX_SWITCHES,
                )?,
            },
            "fattree" => {
                let k = need(k, "k", "the fat tree arity, an even number like k = 4")?;
                let ku = range("topology.k", k, 2, MAX_FATTREE_K)?;
                if ku % 2 != 0 {
                    return Err(ModelError::OutOfRange {
                        item: "topology.k".into(),
                        value: k.to_string(),
                        range: format!("an even number between 2 and {MAX_FATTREE_K}"),
                    });
                }
                Builtin::FatTree { k: ku }
            }
            other => return Err(ModelError::UnknownTopology(other.into())),
        })
    }

    pub fn build(&self, params: &LinkParams) -> Topology {
        let mut t = Topology {
            name: self.label(),
            nodes: vec![],
            links: vec![],
            device_settings: vec![],
            address_blocks: vec![],
            discard_devices: vec![],
        };
        let node = |t: &mut Topology, name: String, kind| t.nodes.push(Node { name, kind, cpus: None });
        let link = |t: &mut Topology, a: String, b: String| {
            t.links.push(Link {
                a,
                b,
                params: params.clone(),
            })
        };
        match *self {
            Builtin::Pair => {
                node(&mut t, "h1".into(), NodeKind::Host);
                node(&mut t, "h2".into(), NodeKind::Host);
                link(&mut t, "h1".into(), "h2".into());
            }
            Builtin::Star { hosts } => {
                node(&mut t, "s1".into(), NodeKind::Switch);
                for i in 1..=hosts {
                    node(&mut t, format!("h{i}"), NodeKind::Host);
                    link(&mut t, format!("h{i}"), "s1".into());
                }
            }
            Builtin::Linear { switches } => {
                for i in 1..=switches {
                    node(&mut t, format!("s{i}"), NodeKind::Switch);
                    node(&mut t, format!("h{i}"), NodeKind::Host);
                    link(&mut t, format!("h{i}"), format!("s{i}"));
                    if i > 1 {
                        link(&mut t, format!("s{}", i - 1), format!("s{i}"));
                    }
                }
            }
            Builtin::Chain { switches } => {
                node(&mut t, "h1".into(), NodeKind::Host);
                node(&mut t, "h2".into(), NodeKind::Host);
                for i in 1..=switches {
                    node(&mut t, format!("s{i}"), NodeKind::Switch);
                    let prev = if i == 1 {
                        "h1".to_string()
                    } else {
                        format!("s{}", i - 1)
                    };
                    link(&mut t, prev, format!("s{i}"));
                }
                link(&mut t, format!("s{switches}"), "h2".into());
            }
            Builtin::FatTree { k } => {
                let half = k / 2;
                for c in 0..half * half {
                    node(&mut t, format!("c{}", c + 1), NodeKind::Router);
                }
                let mut h = 0;
                for pod in 0..k {
                    for i in 0..half {
                        node(&mut t, format!("a{pod}_{i}"), NodeKind::Router);
                        node(&mut t, format!("e{pod}_{i}"), NodeKind::Router);
                    }
                    for e in 0..half {
                        for _ in 0..half {
                            h += 1;
                            node(&mut t, format!("h{h}"), NodeKind::Host);
                            link(&mut t, format!("h{h}"), format!("e{pod}_{e}"));
                        }
                        for a in 0..half {
                            link(&mut t, format!("e{pod}_{e}"), format!("a{pod}_{a}"));
                        }
                    }
                    for a in 0..half {
                        for j in 0..half {
                            link(&mut t, format!("a{pod}_{a}"), format!("c{}", a * half + j + 1));
                        }
                    }
                }
            }
        }
        t
    }

    pub fn label(&self) -> String {
        match self {
            Builtin::Pair => "pair".into(),
            Builtin::Star { hosts } => format!("star({hosts})"),
            Builtin::Linear { switches } => format!("linear({switches})"),
            Builtin::Chain { switches } => format!("chain({switches})"),
            Builtin::FatTree { k } => format!("fattree(k={k})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(t: &Topology, k: NodeKind) -> usize {
        t.nodes.iter().filter(|n| n.kind == k).count()
    }

    #[test]
    fn sizes() {
        let p = LinkParams::default();
        let t = Builtin::Star { hosts: 5 }.build(&p);
        assert_eq!(
            (count(&t, NodeKind::Host), count(&t, NodeKind::Switch), t.links.len()),
            (5, 1, 5)
        );
        let t = Builtin::Linear { switches: 10 }.build(&p);
        assert_eq!(
            (count(&t, NodeKind::Host), count(&t, NodeKind::Switch), t.links.len()),
            (10, 10, 19)
        );
        let t = Builtin::Chain { switches: 3 }.build(&p);
        assert_eq!(
            (count(&t, NodeKind::Host), count(&t, NodeKind::Switch), t.links.len()),
            (2, 3, 4)
        );
        let t = Builtin::FatTree { k: 4 }.build(&p);
        // k^3/4 hosts, 5k^2/4 routers, 3k^3/4 links.
        assert_eq!(
            (count(&t, NodeKind::Host), count(&t, NodeKind::Router), t.links.len()),
            (16, 20, 48)
        );
        for b in [
            Builtin::Pair,
            Builtin::Star { hosts: 3 },
            Builtin::Linear { switches: 4 },
            Builtin::Chain { switches: 2 },
            Builtin::FatTree { k: 6 },
        ] {
            b.build(&p).validate().unwrap();
        }
    }

    #[test]
    fn bad_parameters_are_named() {
        let e = Builtin::from_parts("star", Some(-3), None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("topology.hosts = -3"), "{e}");
        let e = Builtin::from_parts("fattree", None, None, Some(5))
            .unwrap_err()
            .to_string();
        assert!(e.contains("even"), "{e}");
        let e = Builtin::from_parts("torus", None, None, None).unwrap_err().to_string();
        assert!(e.contains("unknown topology 'torus'"), "{e}");
        let e = Builtin::from_parts("linear", None, None, None).unwrap_err().to_string();
        assert!(e.contains("needs 'switches'"), "{e}");
        assert!(Builtin::from_parts("star", Some(1_000_000), None, None).is_err());
    }
}
