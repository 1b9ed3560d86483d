//! The interface facts a capture needs, from the kernel's interface index
//! and sysfs (`/sys/class/net`): index, link type, MTU, loopback.

use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::sys;

const ARPHRD_LOOPBACK: u32 = 772;

/// Interface facts the capture needs.
#[derive(Debug, Clone, Copy)]
pub struct IfaceInfo {
    pub index: u32,
    pub link: LinkType,
    pub mtu: u32,
    /// The loopback device: every packet crosses it twice (sent, then
    /// received), so the capture keeps only the received copy.
    pub loopback: bool,
}

/// Looks an interface up (index, link type, MTU).
pub fn iface_info(name: &str) -> Result<IfaceInfo> {
    if name == "any" {
        // Every interface: cooked packets, frames as large as the largest MTU.
        let mtu = std::fs::read_dir("/sys/class/net")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| std::fs::read_to_string(e.path().join("mtu")).ok())
                    .filter_map(|s| s.trim().parse::<u32>().ok())
                    .max()
                    .unwrap_or(1500)
            })
            .unwrap_or(1500);
        return Ok(IfaceInfo {
            index: 0,
            link: LinkType::LinuxSll2,
            mtu,
            loopback: false,
        });
    }
    let index = sys::if_index(name).ok_or_else(|| CaptureError::NoSuchInterface(name.to_string()))?;
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{name}/{f}"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
    };
    let arphrd = read("type").unwrap_or(1);
    let link = LinkType::from_arphrd(arphrd).ok_or_else(|| {
        CaptureError::Config(format!(
            "interface {name} has link type ARPHRD {arphrd}, which capture does not handle (Ethernet, loopback and tun do)"
        ))
    })?;
    Ok(IfaceInfo {
        index,
        link,
        mtu: read("mtu").unwrap_or(1500),
        loopback: arphrd == ARPHRD_LOOPBACK,
    })
}
