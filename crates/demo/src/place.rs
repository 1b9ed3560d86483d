//! Where the scenario's processes run: on loopback, or in the hosts of a
//! netlab star, started through the lab's launcher (the only door into a
//! host, so whatever the run decides for its processes reaches them).

use crate::error::DemoError;
use netlab::lab::{Lab, LabOptions};
use netlab::model::LinkParams;
use netlab::topo::Builtin;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;

/// The reflector host of the lab star; the others are clients.
pub const REFLECTOR_HOST: &str = "h1";

/// Which process is being placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The reflector and the control server.
    Reflector,
    /// The one bots process (its sockets are spread over the client hosts).
    Bots,
}

pub enum Placement {
    Loopback,
    Lab {
        lab: Box<Lab>,
        reflector_addr: IpAddr,
        /// Client hosts, in order.
        clients: Vec<String>,
    },
}

/// The lab's shape: a star of `clients` client hosts and one reflector host.
pub struct LabShape {
    pub clients: usize,
    pub link: LinkParams,
    /// The netlab binary (its delay-line processes shape link delay).
    pub netlab_bin: std::path::PathBuf,
    /// Time dilation factor (1: none).
    pub tdf: netlab::plan::Tdf,
}

impl Placement {
    /// Builds the star (netlab's built-in `star`, reflector on
    /// [`REFLECTOR_HOST`]) and places the scenario in it.
    pub fn lab(shape: &LabShape, stop: &AtomicBool) -> Result<Placement, DemoError> {
        let mut topo = Builtin::Star {
            hosts: shape.clients + 1,
        }
        .build(&shape.link);
        topo.name = format!("demo {} ({} clients)", topo.name, shape.clients);
        let mut o = LabOptions::new(&shape.netlab_bin);
        o.scenario = "demo".into();
        o.verbose = true;
        o.dilation.tdf = shape.tdf;
        let lab = Lab::up(&topo, &o, stop)?;
        eprint!("{}", lab.summary());
        let reflector_addr = lab
            .state
            .host(REFLECTOR_HOST)?
            .addr
            .ok_or("the reflector host has no address")?
            .into();
        let clients = (2..=shape.clients + 1).map(|i| format!("h{i}")).collect();
        Ok(Placement::Lab {
            lab: Box::new(lab),
            reflector_addr,
            clients,
        })
    }

    pub fn in_lab(&self) -> bool {
        matches!(self, Placement::Lab { .. })
    }

    /// Where the reflector and control server listen.
    pub fn reflector_addr(&self) -> IpAddr {
        match self {
            Placement::Loopback => IpAddr::from([127, 0, 0, 1]),
            Placement::Lab { reflector_addr, .. } => *reflector_addr,
        }
    }

    /// Namespaces of the client hosts, for the bots' sockets.
    pub fn bots_netns(&self) -> Vec<String> {
        match self {
            Placement::Loopback => vec![],
            Placement::Lab { lab, clients, .. } => clients
                .iter()
                .filter_map(|c| lab.ns_of(c).ok().map(String::from))
                .collect(),
        }
    }

    /// The reflector host's network namespace (lab only), to reach what
    /// listens there from this process.
    pub fn reflector_netns(&self) -> Option<String> {
        match self {
            Placement::Loopback => None,
            Placement::Lab { lab, .. } => lab.ns_of(REFLECTOR_HOST).ok().map(String::from),
        }
    }

    /// `reflector SUB` for `role`, placed: on loopback a plain child; in the
    /// lab through the launcher, the reflector and control server on the
    /// reflector host, the bots process on the first client host.
    pub fn command(&self, role: Role, reflector_bin: &Path, sub: &str) -> Result<Command, DemoError> {
        let mut c = self.program(role, reflector_bin)?;
        c.arg(sub).env("RUST_LOG", "warn").stdin(Stdio::null());
        Ok(c)
    }

    /// `program` placed where `role` runs (see [`Placement::command`]).
    pub fn program(&self, role: Role, program: &Path) -> Result<Command, DemoError> {
        Ok(match self {
            Placement::Loopback => Command::new(program),
            Placement::Lab { lab, clients, .. } => {
                let host = match role {
                    Role::Reflector => REFLECTOR_HOST,
                    Role::Bots => clients.first().ok_or("the lab has no client host")?.as_str(),
                };
                lab.launcher().command(host, &[program.as_os_str()])?
            }
        })
    }

    /// The reflector host's interface towards the switch (lab only).
    pub fn reflector_iface(&self) -> Option<String> {
        match self {
            Placement::Loopback => None,
            Placement::Lab { lab, .. } => lab
                .plan
                .addressing
                .ifaces
                .iter()
                .find(|f| f.node == REFLECTOR_HOST)
                .map(|f| f.ifname.clone()),
        }
    }

    /// Describes the placement for the table's heading.
    pub fn describe(&self) -> String {
        match self {
            Placement::Loopback => "on loopback".into(),
            Placement::Lab { clients, .. } => format!(
                "in the lab (reflector on {REFLECTOR_HOST}, bots over {} client hosts)",
                clients.len()
            ),
        }
    }

    /// Removes the lab, if any, reporting how long it took.
    pub fn finish(self) -> Result<(), DemoError> {
        if let Placement::Lab { lab, .. } = self {
            let t = lab.down()?;
            eprintln!("demo: lab removed in {:.2}s", t.as_secs_f64());
        }
        Ok(())
    }
}
