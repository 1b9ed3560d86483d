//! The two-host veth lab of the benchmarks that need real devices: the
//! reflector's host and the clients', one veth between them with permanent
//! neighbour entries (no ARP in the measurements). netlab builds it, records
//! it, removes it on drop (and on Ctrl-C, through the stop flag), and sweeps
//! the labs of killed runs at the next start; processes start in its hosts
//! through netlab's [`Launcher`] (the host's CPU set, the run's clock), and
//! receive packet steering is one of netlab's checked device settings.

use netlab::lab::{sweep, Lab, LabOptions, Launcher, SweepMode};
use netlab::model::{
    AddressBlock, CpuList, DeviceSetting, DiscardDevice, Link, LinkParams, Node, NodeKind, Sysfs, Topology,
};
use oskit::netns::NetNs;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicBool;

/// The lab's host where the implementation under test runs.
pub const REFLECTOR_HOST: &str = "reflector";
/// The lab's host where the clients' sockets live.
pub const CLIENTS_HOST: &str = "clients";

/// What a benchmark asks of its lab.
#[derive(Clone, Debug)]
pub struct VethLabOptions {
    /// The lab's name (`netlab list` shows it).
    pub name: String,
    /// The reflector is 10.`subnet`.0.1, the clients 10.`subnet`.0.2.
    pub subnet: u8,
    /// The CPU list every process started in the reflector's host is
    /// pinned to (taskset syntax), from its first instruction.
    pub reflector_cpus: Option<String>,
    /// Raise `net.core.netdev_max_backlog` to at least this while the lab
    /// is up (restored when the last lab is removed).
    pub netdev_backlog: Option<u64>,
    /// Steer the receive softirq of both ends of the veth to these CPUs
    /// (RPS), written and read back by netlab as the lab is built.
    pub rps_cpus: Option<CpuList>,
    /// More addresses for the clients' host, each a /32 on its veth device,
    /// routed from the reflector's host with a permanent neighbour entry
    /// each (netlab's checked address block).
    pub client_addresses: Option<ClientAddresses>,
    /// Devices of the reflector's host that discard what is sent to them
    /// (a redirect target for a counting sink).
    pub reflector_discard: Vec<String>,
}

/// The clients' extra addresses: every one inside `net`/`prefix`, which
/// must be apart from the lab's own subnet.
#[derive(Clone, Debug)]
pub struct ClientAddresses {
    pub net: Ipv4Addr,
    pub prefix: u8,
    pub addrs: Vec<Ipv4Addr>,
}

/// Each host's device on the veth: netlab names a node's device on its
/// first link `eth0`.
const VETH_DEV: &str = "eth0";

/// The two hosts and the veth between them.
pub struct VethLab {
    lab: Lab,
    /// Namespace names.
    pub r: String,
    pub c: String,
    /// The veth's device on the reflector's side and on the clients'.
    pub r_dev: String,
    pub c_dev: String,
    pub reflector_ip: Ipv4Addr,
    pub client_ip: Ipv4Addr,
}

impl VethLab {
    /// Builds the lab; `stop` (set on Ctrl-C) interrupts the build, which
    /// then removes what it made.
    pub fn new(o: &VethLabOptions, stop: &AtomicBool) -> Result<VethLab, String> {
        let node = |name: &str, cpus: Option<String>| Node {
            name: name.into(),
            kind: NodeKind::Host,
            cpus,
        };
        let topo = Topology {
            name: o.name.clone(),
            nodes: vec![node(REFLECTOR_HOST, o.reflector_cpus.clone()), node(CLIENTS_HOST, None)],
            links: vec![Link {
                a: REFLECTOR_HOST.into(),
                b: CLIENTS_HOST.into(),
                // Unshaped, no delay: a bare veth.
                params: LinkParams::default(),
            }],
            device_settings: o
                .rps_cpus
                .iter()
                .flat_map(|cpus| {
                    [REFLECTOR_HOST, CLIENTS_HOST].map(|host| DeviceSetting {
                        node: host.into(),
                        dev: VETH_DEV.into(),
                        set: Sysfs::RpsCpus(cpus.clone()),
                    })
                })
                .collect(),
            address_blocks: o
                .client_addresses
                .iter()
                .map(|c| AddressBlock {
                    node: CLIENTS_HOST.into(),
                    dev: VETH_DEV.into(),
                    net: c.net,
                    prefix: c.prefix,
                    addrs: c.addrs.clone(),
                })
                .collect(),
            discard_devices: o
                .reflector_discard
                .iter()
                .map(|dev| DiscardDevice {
                    node: REFLECTOR_HOST.into(),
                    dev: dev.clone(),
                })
                .collect(),
        };
        // No delay lines in this lab, so netlab never starts its binary.
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut opts = LabOptions::new(exe);
        opts.scenario = o.name.clone();
        opts.first_subnet = Some(Ipv4Addr::new(10, o.subnet, 0, 0));
        opts.netdev_backlog = o.netdev_backlog;
        // `Lab::up` sweeps too, silently: this says what a killed run left.
        match sweep(&opts.state_dir, SweepMode::DeadOnly) {
            Ok(swept) if !swept.removed.is_empty() => {
                tracing::info!("removed what earlier runs left: {}", swept.removed.join(", "))
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot sweep the labs of earlier runs: {e}"),
        }
        let lab = Lab::up(&topo, &opts, stop).map_err(|e| format!("cannot build the lab: {e}"))?;
        let iface = |host: &str| {
            lab.plan
                .addressing
                .ifaces
                .iter()
                .find(|i| i.node == host)
                .map(|i| (i.ifname.clone(), i.addr))
                .ok_or_else(|| format!("the lab has no interface for host {host}"))
        };
        let ((r_dev, reflector_ip), (c_dev, client_ip)) = (iface(REFLECTOR_HOST)?, iface(CLIENTS_HOST)?);
        let ns = |host: &str| lab.ns_of(host).map(String::from).map_err(|e| e.to_string());
        let (r, c) = (ns(REFLECTOR_HOST)?, ns(CLIENTS_HOST)?);
        Ok(VethLab {
            lab,
            r,
            c,
            r_dev,
            c_dev,
            reflector_ip,
            client_ip,
        })
    }

    /// Starts processes in the lab's hosts.
    pub fn launcher(&self) -> Launcher {
        self.lab.launcher()
    }

    /// Runs `argv` in lab host `host` through the launcher and waits for
    /// it; its stderr is the error.
    pub fn run_in(&self, host: &str, argv: &[&str]) -> Result<(), String> {
        let o = self
            .launcher()
            .command(host, argv)
            .map_err(|e| e.to_string())?
            .output()
            .map_err(|e| format!("cannot run {} in host {host}: {e}", argv.join(" ")))?;
        if !o.status.success() {
            return Err(format!(
                "{} in host {host} failed: {}",
                argv.join(" "),
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(())
    }

    /// The MAC address of the lab's interface with address `ip` (the
    /// permanent neighbour entries name it).
    pub fn mac_of(ip: Ipv4Addr) -> String {
        netlab::addr::mac_of(ip)
    }

    pub fn ns(name: &str) -> Result<NetNs, String> {
        NetNs::open(name).map_err(|e| e.to_string())
    }
}
