//! Scenarios in TOML: a topology, link parameters, and the commands to run
//! in which hosts, when.
//!
//! ```toml
//! name = "two hosts"
//! [topology]
//! kind = "star"          # pair | star | linear | chain | fattree | custom
//! hosts = 4              # star
//! [link]                 # every link (custom links may override)
//! bw = "100mbit"
//! delay = "1ms"
//! [[command]]
//! host = "h2"
//! cmd = "echo hello from $NETLAB_HOST"
//! at = "0s"
//! ```

use crate::error::ModelError;
use crate::model::{Link, LinkParams, Node, NodeKind, Topology};
use crate::topo::Builtin;
use crate::units::{parse_duration, parse_loss, parse_rate};
use serde::Deserialize;
use std::collections::HashMap;
use std::time::Duration;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    topology: TopoSpec,
    #[serde(default)]
    link: LinkSpec,
    #[serde(default)]
    options: Options,
    /// node name -> CPU list
    #[serde(default)]
    cpus: HashMap<String, String>,
    #[serde(default)]
    command: Vec<CommandSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopoSpec {
    kind: String,
    hosts: Option<i64>,
    switches: Option<i64>,
    k: Option<i64>,
    #[serde(default)]
    node: Vec<NodeSpec>,
    #[serde(default)]
    link: Vec<CustomLink>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeSpec {
    name: String,
    kind: NodeKind,
    cpus: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CustomLink {
    a: String,
    b: String,
    #[serde(flatten)]
    params: LinkSpec,
}

/// Link parameters as written; any of them may be absent.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSpec {
    pub bw: Option<String>,
    pub delay: Option<String>,
    pub jitter: Option<String>,
    pub loss: Option<toml::Value>,
    pub queue: Option<i64>,
}

impl LinkSpec {
    /// Applies the fields that are set on top of `base`.
    pub fn apply_to(&self, item: &str, base: &LinkParams) -> Result<LinkParams, ModelError> {
        let mut p = base.clone();
        if let Some(bw) = &self.bw {
            p.bw_bps = if bw == "none" {
                None
            } else {
                Some(parse_rate(&format!("{item}.bw"), bw)?)
            };
        }
        if let Some(d) = &self.delay {
            p.delay_ns = parse_duration(&format!("{item}.delay"), d)?;
        }
        if let Some(j) = &self.jitter {
            p.jitter_ns = parse_duration(&format!("{item}.jitter"), j)?;
        }
        if let Some(l) = &self.loss {
            let s = match l {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => other.to_string(),
            };
            p.loss_ppm = parse_loss(&format!("{item}.loss"), &s)?;
        }
        if let Some(q) = self.queue {
            if q < 1 || q > crate::model::MAX_QUEUE as i64 {
                return Err(ModelError::OutOfRange {
                    item: format!("{item}.queue"),
                    value: q.to_string(),
                    range: format!("between 1 and {} packets", crate::model::MAX_QUEUE),
                });
            }
            p.queue = Some(q as u32);
        }
        p.validate(item)?;
        Ok(p)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    delay_backend: Option<String>,
    ecmp_seed: Option<i64>,
    /// A number (4, 2.5) or a string ("3/2").
    tdf: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandSpec {
    host: String,
    cmd: String,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    timeout: Option<String>,
}

/// A command of a scenario, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HostCommand {
    pub host: String,
    /// Run with `sh -c`.
    pub cmd: String,
    pub at: Duration,
    /// Left running; killed when the lab is removed. Otherwise the run waits
    /// for it, and a non-zero exit fails the run.
    pub background: bool,
    pub timeout: Duration,
}

pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A checked scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub topology: Topology,
    pub commands: Vec<HostCommand>,
    pub delay_backend: Option<crate::plan::DelayBackend>,
    pub ecmp_seed: Option<u32>,
    pub tdf: Option<crate::plan::Tdf>,
}

pub fn parse_delay_backend(s: &str) -> Result<Option<crate::plan::DelayBackend>, ModelError> {
    use crate::plan::DelayBackend;
    match s {
        "auto" => Ok(None),
        "netem" => Ok(Some(DelayBackend::Netem)),
        "delay-line" => Ok(Some(DelayBackend::DelayLine)),
        other => Err(ModelError::BadValue {
            item: "delay_backend".into(),
            value: other.into(),
            expected: "auto, netem or delay-line".into(),
        }),
    }
}

impl Scenario {
    pub fn from_toml(path: &str, text: &str) -> Result<Self, ModelError> {
        let f: File = toml::from_str(text).map_err(|e| ModelError::Scenario {
            path: path.into(),
            msg: e.to_string().trim().to_string(),
        })?;
        let params = f.link.apply_to("link", &LinkParams::default())?;
        let mut topology = if f.topology.kind == "custom" {
            if f.topology.node.is_empty() {
                return Err(ModelError::MissingParam {
                    topo: "custom".into(),
                    param: "node".into(),
                    hint: "list nodes as [[topology.node]] name = \"h1\", kind = \"host\"".into(),
                });
            }
            let nodes = f
                .topology
                .node
                .iter()
                .map(|n| Node {
                    name: n.name.clone(),
                    kind: n.kind,
                    cpus: n.cpus.clone(),
                })
                .collect();
            let mut links = vec![];
            for (i, l) in f.topology.link.iter().enumerate() {
                links.push(Link {
                    a: l.a.clone(),
                    b: l.b.clone(),
                    params: l.params.apply_to(&format!("topology.link[{i}]"), &params)?,
                });
            }
            Topology {
                name: "custom".into(),
                nodes,
                links,
                device_settings: vec![],
                address_blocks: vec![],
                discard_devices: vec![],
            }
        } else {
            Builtin::from_parts(&f.topology.kind, f.topology.hosts, f.topology.switches, f.topology.k)?.build(&params)
        };
        for (node, cpus) in &f.cpus {
            let Some(n) = topology.nodes.iter_mut().find(|n| &n.name == node) else {
                return Err(ModelError::BadValue {
                    item: format!("cpus.{node}"),
                    value: cpus.clone(),
                    expected: "the name of a node of the topology".into(),
                });
            };
            n.cpus = Some(cpus.clone());
        }
        topology.validate()?;
        let mut commands = vec![];
        for (i, c) in f.command.iter().enumerate() {
            match topology.node(&c.host) {
                Some(n) if n.kind != NodeKind::Switch => {}
                _ => {
                    return Err(ModelError::CommandHost {
                        index: i,
                        host: c.host.clone(),
                    })
                }
            }
            let at = match &c.at {
                Some(s) => Duration::from_nanos(parse_duration(&format!("command[{i}].at"), s)?),
                None => Duration::ZERO,
            };
            let timeout = match &c.timeout {
                Some(s) => Duration::from_nanos(parse_duration(&format!("command[{i}].timeout"), s)?),
                None => DEFAULT_TIMEOUT,
            };
            if timeout.is_zero() {
                return Err(ModelError::OutOfRange {
                    item: format!("command[{i}].timeout"),
                    value: "0".into(),
                    range: "more than 0".into(),
                });
            }
            commands.push(HostCommand {
                host: c.host.clone(),
                cmd: c.cmd.clone(),
                at,
                background: c.background,
                timeout,
            });
        }
        commands.sort_by_key(|c| c.at);
        let o = &f.options;
        let delay_backend = match &o.delay_backend {
            Some(s) => parse_delay_backend(s)?,
            None => None,
        };
        let ecmp_seed = match o.ecmp_seed {
            Some(s) if !(0..=u32::MAX as i64).contains(&s) => {
                return Err(ModelError::OutOfRange {
                    item: "options.ecmp_seed".into(),
                    value: s.to_string(),
                    range: "between 0 and 4294967295".into(),
                })
            }
            s => s.map(|s| s as u32),
        };
        let tdf = match &o.tdf {
            None => None,
            Some(v) => {
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let bad = |reason: String| ModelError::BadValue {
                    item: "options.tdf".into(),
                    value: text.clone(),
                    expected: reason,
                };
                let t: crate::plan::Tdf = text.parse().map_err(|e: vtime::TdfError| bad(e.to_string()))?;
                Some(crate::plan::check_tdf("options.tdf", t)?)
            }
        };
        Ok(Scenario {
            name: f.name.unwrap_or_else(|| path.to_string()),
            topology,
            commands,
            delay_backend,
            ecmp_seed,
            tdf,
        })
    }

    pub fn load(path: &str) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Scenario {
            path: path.into(),
            msg: format!("cannot read: {e}"),
        })?;
        Scenario::from_toml(path, &text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_scenario() {
        let s = Scenario::from_toml(
            "t.toml",
            r#"
            name = "demo"
            [topology]
            kind = "star"
            hosts = 3
            [link]
            bw = "100mbit"
            delay = "1ms"
            loss = 0.5
            queue = 200
            [options]
            delay_backend = "delay-line"
            ecmp_seed = 3
            [cpus]
            h1 = "0"
            [[command]]
            host = "h2"
            cmd = "sleep 1"
            at = "2s"
            [[command]]
            host = "h1"
            cmd = "true"
            background = true
            "#,
        )
        .unwrap();
        assert_eq!(s.name, "demo");
        assert_eq!(s.topology.links.len(), 3);
        let p = &s.topology.links[0].params;
        assert_eq!(
            (p.bw_bps, p.delay_ns, p.loss_ppm, p.queue),
            (Some(100_000_000), 1_000_000, 5000, Some(200))
        );
        assert_eq!(s.commands[0].host, "h1");
        assert_eq!(s.commands[1].at, Duration::from_secs(2));
        assert_eq!(s.topology.node("h1").unwrap().cpus.as_deref(), Some("0"));
        assert_eq!(s.ecmp_seed, Some(3));
    }

    #[test]
    fn custom_topology_with_per_link_override() {
        let s = Scenario::from_toml(
            "t.toml",
            r#"
            [topology]
            kind = "custom"
            node = [ { name = "a", kind = "host" }, { name = "r", kind = "router" }, { name = "b", kind = "host" } ]
            link = [ { a = "a", b = "r", bw = "10mbit" }, { a = "r", b = "b" } ]
            [link]
            bw = "1gbit"
            "#,
        )
        .unwrap();
        assert_eq!(s.topology.links[0].params.bw_bps, Some(10_000_000));
        assert_eq!(s.topology.links[1].params.bw_bps, Some(1_000_000_000));
    }

    #[test]
    fn bad_input_names_the_item() {
        let err = |t: &str| Scenario::from_toml("x.toml", t).unwrap_err().to_string();
        assert!(err("[topology]\nkind = \"ring\"").contains("unknown topology 'ring'"));
        assert!(err("[topology]\nkind = \"star\"\nhosts = -2").contains("topology.hosts = -2"));
        assert!(err("[topology]\nkind = \"pair\"\n[link]\nbw = \"-1mbit\"").contains("link.bw"));
        assert!(err("[topology]\nkind = \"pair\"\n[link]\nqueue = 0").contains("link.queue"));
        assert!(
            err("[topology]\nkind = \"pair\"\n[[command]]\nhost = \"h9\"\ncmd = \"x\"").contains("unknown host 'h9'")
        );
        assert!(err("[topology]\nkind = \"pair\"\nbogus = 1").contains("x.toml"));
        let e = err("[topology]\nkind = \"custom\"\nnode = [ { name = \"a\", kind = \"host\" }, { name = \"a\", kind = \"host\" } ]");
        assert!(e.contains("duplicate node name 'a'"), "{e}");
    }
}
