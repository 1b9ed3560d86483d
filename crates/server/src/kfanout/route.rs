//! Where a copy for a member leaves and with which Ethernet header: the
//! route to the member (egress device, gateway) and the next hop's link
//! address, asked of the kernel over rtnetlink when the member joins.
//!
//! The program cannot ask itself: `bpf_fib_lookup` answers `FWD_DISABLED` on
//! a device with IP forwarding off, the default in a namespace, and a
//! reflector is not a router. The socket lives in the network namespace of
//! the thread that made it, the reflector's.

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;

/// How a copy reaches one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextHop {
    pub ifindex: u32,
    /// The next hop's link address: the member on a shared segment, else
    /// its gateway.
    pub dmac: [u8; 6],
    /// The egress device's own address.
    pub smac: [u8; 6],
    /// The next hop's IPv4 address (the member, or its gateway), to find
    /// its neighbour entry again when it changes.
    pub hop: Ipv4Addr,
    /// The source address the kernel would pick towards the member.
    pub src: Option<Ipv4Addr>,
}

/// Why a member cannot be served in the kernel (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The next hop has no usable neighbour entry yet (retried later).
    Neighbour(Ipv4Addr),
    /// Not reachable through an Ethernet device (a local address, loopback,
    /// a route of another type): the user-space path serves it for good.
    NotEthernet(String),
}

pub struct Resolver {
    sock: Socket,
    seq: u32,
    /// Own link addresses, by device.
    own: HashMap<u32, [u8; 6]>,
}

impl Resolver {
    pub fn new() -> io::Result<Resolver> {
        let mut sock = Socket::new(NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&SocketAddr::new(0, 0))?;
        Ok(Resolver {
            sock,
            seq: 0,
            own: HashMap::new(),
        })
    }

    /// Route, then neighbour: the egress device and both link addresses.
    pub fn resolve(&mut self, dst: Ipv4Addr) -> io::Result<Result<NextHop, Unresolved>> {
        let mut rt = RouteMessage::default();
        rt.header.address_family = AddressFamily::Inet;
        rt.header.destination_prefix_length = 32;
        rt.attributes.push(RouteAttribute::Destination(RouteAddress::Inet(dst)));
        let replies = self.request(RouteNetlinkMessage::GetRoute(rt), 0)?;
        let Some(route) = replies.into_iter().find_map(|m| match m {
            RouteNetlinkMessage::NewRoute(r) => Some(r),
            _ => None,
        }) else {
            return Ok(Err(Unresolved::NotEthernet(format!("no route to {dst}"))));
        };
        if route.header.kind != RouteType::Unicast {
            return Ok(Err(Unresolved::NotEthernet(format!(
                "{dst} is reached by a {:?} route, not through a device",
                route.header.kind
            ))));
        }
        let mut oif = None;
        let mut hop = dst;
        let mut src = None;
        for a in &route.attributes {
            match a {
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(RouteAddress::Inet(g)) => hop = *g,
                RouteAttribute::PrefSource(RouteAddress::Inet(s)) => src = Some(*s),
                _ => {}
            }
        }
        let Some(ifindex) = oif else {
            return Ok(Err(Unresolved::NotEthernet(format!(
                "the route to {dst} names no device"
            ))));
        };
        let Some(smac) = self.own_mac(ifindex)? else {
            return Ok(Err(Unresolved::NotEthernet(format!(
                "device {ifindex} (towards {dst}) has no Ethernet address"
            ))));
        };
        match self.neighbours()?.get(&(ifindex, hop)) {
            Some(&dmac) => Ok(Ok(NextHop {
                ifindex,
                dmac,
                smac,
                hop,
                src,
            })),
            None => Ok(Err(Unresolved::Neighbour(hop))),
        }
    }

    fn own_mac(&mut self, ifindex: u32) -> io::Result<Option<[u8; 6]>> {
        if let Some(m) = self.own.get(&ifindex) {
            return Ok(Some(*m));
        }
        let mut lk = LinkMessage::default();
        lk.header.index = ifindex;
        let replies = self.request(RouteNetlinkMessage::GetLink(lk), 0)?;
        let mac = replies.iter().find_map(|m| match m {
            RouteNetlinkMessage::NewLink(l) => l.attributes.iter().find_map(|a| match a {
                LinkAttribute::Address(b) => <[u8; 6]>::try_from(b.as_slice()).ok(),
                _ => None,
            }),
            _ => None,
        });
        // Loopback has an all-zero address: not a device a copy can leave by.
        let mac = mac.filter(|m| *m != [0; 6]);
        if let Some(m) = mac {
            self.own.insert(ifindex, m);
        }
        Ok(mac)
    }

    /// Every usable IPv4 neighbour entry: (device, address) -> link address.
    pub fn neighbours(&mut self) -> io::Result<HashMap<(u32, Ipv4Addr), [u8; 6]>> {
        let mut nb = NeighbourMessage::default();
        nb.header.family = AddressFamily::Inet;
        let replies = self.request(RouteNetlinkMessage::GetNeighbour(nb), NLM_F_DUMP)?;
        let mut out = HashMap::new();
        for m in &replies {
            let RouteNetlinkMessage::NewNeighbour(n) = m else {
                continue;
            };
            let usable = matches!(
                n.header.state,
                NeighbourState::Reachable
                    | NeighbourState::Stale
                    | NeighbourState::Delay
                    | NeighbourState::Probe
                    | NeighbourState::Permanent
            );
            if !usable {
                continue;
            }
            let mut ip = None;
            let mut mac = None;
            for a in &n.attributes {
                match a {
                    NeighbourAttribute::Destination(NeighbourAddress::Inet(d)) => ip = Some(*d),
                    NeighbourAttribute::LinkLayerAddress(b) => mac = <[u8; 6]>::try_from(b.as_slice()).ok(),
                    _ => {}
                }
            }
            if let (Some(ip), Some(mac)) = (ip, mac) {
                out.insert((n.header.ifindex, ip), mac);
            }
        }
        Ok(out)
    }

    /// One request and all its replies (a dump ends with DONE, a get with
    /// its one answer).
    fn request(&mut self, msg: RouteNetlinkMessage, extra: u16) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | extra;
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf, 0)?;
        let dump = extra & NLM_F_DUMP == NLM_F_DUMP;
        let mut out = Vec::new();
        loop {
            let (data, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off < data.len() {
                let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&data[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("rtnetlink reply: {e}")))?;
                let len = m.header.length as usize;
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
                if m.header.sequence_number != self.seq {
                    continue;
                }
                match m.payload {
                    NetlinkPayload::Done(_) => return Ok(out),
                    NetlinkPayload::Error(e) => {
                        return match e.code {
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                            None => Ok(out),
                        };
                    }
                    NetlinkPayload::InnerMessage(inner) => {
                        out.push(inner);
                        if !dump {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
