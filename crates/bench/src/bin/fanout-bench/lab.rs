//! The veth lab the benchmark runs in, and its members: the sender and the
//! receivers of each implementation (reflector members with real tokens,
//! raw-loop receivers, multicast group members).

use bench::lab::{ClientAddresses, VethLab, VethLabOptions};
use netlab::model::CpuList;
use oskit::netns::NetNs;
use reflector_proto::auth::{Secret, TokenClaims};
use reflector_proto::blocking;
use reflector_proto::client::{Config as ClientConfig, JoinRequest, Session};
use reflector_proto::protocol::SessionKeys;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

pub(crate) const REFLECTOR_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 1);
pub(crate) const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 210, 0, 2);
/// Every member has an address of its own, as game clients do (so each copy
/// changes the destination address and its checksums, not only the port):
/// member `i`'s is 10.211.(i / 250).(1 + i % 250), routed over the veth.
pub(crate) const MEMBER_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 211, 0, 0), 16);

pub(crate) fn member_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 211, (i / 250) as u8, (1 + i % 250) as u8)
}

/// The reflector host's device that frees what the egress sink counted.
pub(crate) const SINK_DEVICE: &str = "sinkd";
pub(crate) const MCAST: Ipv4Addr = Ipv4Addr::new(239, 210, 0, 1);
pub(crate) const PORT: u16 = 4600;

/// The port of the `k`th implementation of a run: each has its own, so that
/// with `--interleave` all of them can be up at once (10 apart: clear of the
/// multicast group's port).
pub(crate) fn port_of(k: usize) -> u16 {
    PORT + 10 * k as u16
}
pub(crate) const MCAST_PORT: u16 = 4601;

/// The lab's hosts and veth ([`VethLab`]) and a device that frees what the
/// egress sink redirects to it.
pub(crate) struct Lab {
    pub(crate) veth: VethLab,
}

/// Every clone waits in the sending CPU's backlog: a 256-member group
/// overflows the default 1,000 (the setting lives in the initial namespace
/// only; netlab raises it while the lab is up and restores it).
pub(crate) const BACKLOG: u64 = 30_000;

impl Lab {
    /// The lab, with addresses for `members` members; every process started
    /// in the reflector's host is pinned to the measured CPU `cpu`, and with
    /// `rps` the receive softirq of both ends of the veth is steered there
    /// too (RPS: netlab writes both devices' `rps_cpus` in their hosts'
    /// namespaces and reads them back). `stop` interrupts the build.
    pub(crate) fn new(members: usize, cpu: usize, rps: bool, stop: &AtomicBool) -> Result<Lab, String> {
        let rps_cpus = if rps {
            Some(CpuList::one(cpu).map_err(|e| format!("--cpu {cpu}: {e}"))?)
        } else {
            None
        };
        let veth = VethLab::new(
            &VethLabOptions {
                name: "fanout-bench".into(),
                subnet: 210,
                reflector_cpus: Some(cpu.to_string()),
                netdev_backlog: Some(BACKLOG),
                rps_cpus,
                // Member addresses on the clients' side; on the reflector's
                // a route to them and static neighbours (the clients' MAC).
                client_addresses: Some(ClientAddresses {
                    net: MEMBER_NET.0,
                    prefix: MEMBER_NET.1,
                    addrs: (0..members).map(member_ip).collect(),
                }),
                // Where the egress sink sends what it counted: a device that
                // frees it at once.
                reflector_discard: vec![SINK_DEVICE.into()],
            },
            stop,
        )?;
        if (veth.reflector_ip, veth.client_ip) != (REFLECTOR_IP, CLIENT_IP) {
            return Err(format!(
                "the lab's hosts are at {} and {}, not {REFLECTOR_IP} and {CLIENT_IP}",
                veth.reflector_ip, veth.client_ip
            ));
        }
        Ok(Lab { veth })
    }

    pub(crate) fn ns(name: &str) -> Result<NetNs, String> {
        VethLab::ns(name)
    }
}

/// The sender member: its socket and session (none for multicast), where
/// it sends.
pub(crate) struct Sender {
    pub(crate) sock: UdpSocket,
    pub(crate) session: Option<Session>,
    pub(crate) to: SocketAddr,
    pub(crate) seq: u64,
}

/// One implementation's clients.
pub(crate) struct Clients {
    pub(crate) sender: Sender,
    pub(crate) receivers: Vec<UdpSocket>,
}

pub(crate) fn join_all(lab: &Lab, secret: &Secret, receivers: usize, port: u16) -> Result<Clients, String> {
    let socks = member_sockets(lab, receivers)?;
    let to = SocketAddr::from((REFLECTOR_IP, port));
    let mut sessions = Vec::new();
    for (i, s) in socks.iter().enumerate() {
        let player = i as u32 + 1;
        let token = TokenClaims {
            player,
            reflector: 0,
            group: port,
            expires_unix_s: reflector_proto::unix_now_ms() / 1000 + 3600,
        }
        .sign(secret);
        let req = JoinRequest {
            reflector: to,
            group: port,
            player,
            token,
            keys: SessionKeys::derive(secret, &token),
            first_seq: 1,
        };
        let cfg = ClientConfig {
            give_up: Some(Duration::from_secs(5)),
            ..ClientConfig::default()
        };
        let (session, _) = blocking::join(s, req, cfg).map_err(|e| format!("join of player {player}: {e:?}"))?;
        sessions.push(session);
    }
    let mut socks = socks.into_iter();
    let sock = socks.next().ok_or("no sender")?;
    Ok(Clients {
        sender: Sender {
            sock,
            session: sessions.into_iter().next(),
            to,
            seq: 0,
        },
        receivers: socks.collect(),
    })
}

/// The sender's socket and `receivers` more, each at a member address of
/// its own in the clients' namespace.
pub(crate) fn member_sockets(lab: &Lab, receivers: usize) -> Result<Vec<UdpSocket>, String> {
    Lab::ns(&lab.veth.c)?
        .run(|| {
            (0..=receivers)
                .map(|i| {
                    let s = UdpSocket::bind(SocketAddr::from((member_ip(i), 0)))?;
                    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20));
                    Ok(s)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())
}

/// The raw loop's clients: the same member sockets as [`join_all`]'s, no
/// JOIN (the loop has no membership); the sender's DATA is not sealed.
pub(crate) fn raw_clients(lab: &Lab, receivers: usize, port: u16) -> Result<Clients, String> {
    let mut socks = member_sockets(lab, receivers)?.into_iter();
    let sock = socks.next().ok_or("no sender")?;
    Ok(Clients {
        sender: Sender {
            sock,
            session: None,
            to: SocketAddr::from((REFLECTOR_IP, port)),
            seq: 0,
        },
        receivers: socks.collect(),
    })
}

/// Receive buffer of a multicast receiver in delivery phases (they read
/// as the copies come; CPU phases shrink it to the minimum).
pub(crate) const MCAST_RCVBUF: usize = 2 << 20;

pub(crate) fn mcast_clients(lab: &Lab, receivers: usize, rcvbuf: usize, port: u16) -> Result<Clients, String> {
    let c = Lab::ns(&lab.veth.c)?;
    let (sender, receivers) = c
        .run(|| -> std::io::Result<(UdpSocket, Vec<UdpSocket>)> {
            let sender = UdpSocket::bind(SocketAddr::from((CLIENT_IP, 0)))?;
            let mut rs = Vec::new();
            for _ in 0..receivers {
                let s = socket2_reuse(MCAST_PORT)?;
                s.join_multicast_v4(&MCAST, &CLIENT_IP)?;
                nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBufForce, &rcvbuf)?;
                rs.push(s);
            }
            Ok((sender, rs))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    Ok(Clients {
        sender: Sender {
            sock: sender,
            session: None,
            to: SocketAddr::from((REFLECTOR_IP, port)),
            seq: 0,
        },
        receivers,
    })
}

/// A UDP socket on `port` that shares it with the other receivers (each
/// gets every multicast datagram).
pub(crate) fn socket2_reuse(port: u16) -> std::io::Result<UdpSocket> {
    use nix::sys::socket::{bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::new(0, 0, 0, 0, port))?;
    Ok(UdpSocket::from(fd))
}
