//! Least privilege: what each command needs, checked at start.
//!
//! The reflector, the control server and the bots run as an ordinary user.
//! A configuration needs a capability only for the reasons listed here;
//! each is checked before anything starts, and a missing one is named with
//! the setting that needs it and how to grant it, instead of an `EPERM`
//! from deep inside. `deploy/systemd/` grants exactly these through
//! `AmbientCapabilities` with a matching `CapabilityBoundingSet`.
//!
//! | command | needs | when |
//! | --- | --- | --- |
//! | `serve` | none | group ports and `--metrics` at or above the unprivileged start (1024) |
//! | `serve` | `CAP_NET_BIND_SERVICE` | a group port or `--metrics` port below it |
//! | `serve` | `CAP_BPF`, `CAP_NET_ADMIN`, `CAP_PERFMON` | `--backend ebpf --strict-backend` (without `--strict-backend` a missing one makes it fall back to user space, saying which) |
//! | `control` | `CAP_NET_BIND_SERVICE` | `--listen` port below it (e.g. 443 with TLS) |
//! | `bots` | `CAP_SYS_ADMIN` | `--netns` (entering a namespace is `setns`) |
//!
//! Socket buffers above `net.core.rmem_max`/`wmem_max` would need
//! `CAP_NET_ADMIN`; without it the reflector takes the capped size and
//! reports the size it got, so that is not a requirement.

use oskit::caps::{Cap, CapSet};
use reflector_server::backend::BackendKind;
use std::net::SocketAddr;

/// One capability a configuration needs, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Need {
    pub cap: Cap,
    pub why: String,
}

/// What binding these ports needs, given the unprivileged port start.
fn ports_need(what: &str, ports: impl IntoIterator<Item = u16>, unprivileged_from: u16) -> Option<Need> {
    let low: Vec<u16> = ports
        .into_iter()
        .filter(|p| *p != 0 && *p < unprivileged_from)
        .collect();
    let first = *low.first()?;
    let more = if low.len() > 1 {
        format!(" (and {} more)", low.len() - 1)
    } else {
        String::new()
    };
    Some(Need {
        cap: Cap::NetBindService,
        why: format!("{what} port {first}{more} is below net.ipv4.ip_unprivileged_port_start ({unprivileged_from})"),
    })
}

/// `reflector serve`: group ports, the metrics listener, and the kernel
/// fan-out when it must run (`ebpf_strict`: `--backend ebpf
/// --strict-backend`; otherwise a lack makes it fall back, not fail).
pub fn for_serve(
    ports: &[u16],
    metrics: Option<SocketAddr>,
    unprivileged_from: u16,
    strict_backend: Option<BackendKind>,
) -> Vec<Need> {
    let mut needs: Vec<Need> = ports_need("group", ports.iter().copied(), unprivileged_from)
        .into_iter()
        .collect();
    needs.extend(ports_need("--metrics", metrics.map(|m| m.port()), unprivileged_from));
    if let Some(b) = strict_backend {
        for &(cap, why) in b.caps() {
            needs.push(Need {
                cap,
                why: format!("--backend {b} --strict-backend: {why}"),
            });
        }
    }
    needs
}

/// `reflector control`: its HTTP(S) listener.
pub fn for_control(listen: SocketAddr, unprivileged_from: u16) -> Vec<Need> {
    ports_need("--listen", [listen.port()], unprivileged_from)
        .into_iter()
        .collect()
}

/// `reflector bots`: entering the lab's namespaces.
pub fn for_bots(netns: &[String]) -> Vec<Need> {
    match netns.first() {
        Some(ns) => vec![Need {
            cap: Cap::SysAdmin,
            why: format!("--netns {ns}: entering a network namespace (setns) needs it"),
        }],
        None => vec![],
    }
}

/// The needs that `have` does not cover, as one message that names each
/// missing capability, the setting that needs it and how to grant it.
pub fn missing(command: &str, needs: &[Need], have: CapSet) -> Result<(), String> {
    let lacking: Vec<&Need> = needs.iter().filter(|n| !have.has(n.cap)).collect();
    if lacking.is_empty() {
        return Ok(());
    }
    let mut msg = format!("reflector {command} lacks a capability its configuration needs:");
    for n in &lacking {
        msg.push_str(&format!("\n  {}: {}", n.cap, n.why));
    }
    let names: Vec<String> = lacking.iter().map(|n| n.cap.name().to_lowercase()).collect();
    msg.push_str(&format!(
        "\nrun as root, or grant only what is needed: `setcap {}+ep $(command -v reflector)`, \
         or AmbientCapabilities= in its systemd unit (deploy/systemd/); or change the setting",
        names.join(",")
    ));
    Err(msg)
}

/// Checks this process's effective capabilities against `needs`.
pub fn check(command: &str, needs: &[Need]) -> Result<(), String> {
    if needs.is_empty() {
        return Ok(());
    }
    let have = oskit::caps::effective().map_err(|e| format!("cannot read this process's capabilities: {e}"))?;
    missing(command, needs, have)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn high_ports_need_nothing_and_low_ports_name_the_capability() {
        assert!(for_serve(&[4000, 4001], Some("127.0.0.1:9100".parse().unwrap()), 1024, None).is_empty());
        let n = for_serve(&[53, 80, 4000], None, 1024, None);
        assert_eq!(n.len(), 1);
        assert_eq!(n[0].cap, Cap::NetBindService);
        assert!(n[0].why.contains("group port 53 (and 1 more)"), "{}", n[0].why);
        let n = for_serve(&[4000], Some("0.0.0.0:80".parse().unwrap()), 1024, None);
        assert!(n[0].why.contains("--metrics port 80"));
        // A lowered unprivileged start (as some distributions set) needs nothing.
        assert!(for_serve(&[80], None, 0, None).is_empty());
        // The kernel fan-out, when it may not fall back: its three.
        let caps: Vec<Cap> = for_serve(&[4000], None, 1024, Some(BackendKind::Ebpf))
            .iter()
            .map(|n| n.cap)
            .collect();
        assert_eq!(caps, [Cap::Bpf, Cap::NetAdmin, Cap::Perfmon]);
        // Port 0 means "any free port", which is never privileged.
        assert!(for_control("127.0.0.1:0".parse().unwrap(), 1024).is_empty());
        assert_eq!(for_control("0.0.0.0:443".parse().unwrap(), 1024).len(), 1);
        assert_eq!(for_bots(&["lab-h1".into()])[0].cap, Cap::SysAdmin);
        assert!(for_bots(&[]).is_empty());
    }

    #[test]
    fn the_message_names_what_is_missing_and_how_to_grant_it() {
        let needs = for_serve(&[80], None, 1024, None);
        assert!(missing("serve", &needs, CapSet(1 << Cap::NetBindService.number())).is_ok());
        let err = missing("serve", &needs, CapSet(0)).unwrap_err();
        assert!(err.contains("CAP_NET_BIND_SERVICE: group port 80"), "{err}");
        assert!(err.contains("setcap cap_net_bind_service+ep"), "{err}");
        assert!(missing("serve", &[], CapSet(0)).is_ok());
    }
}
