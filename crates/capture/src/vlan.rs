//! The VLAN tag as the kernel reports it beside a packet (in a ring frame's
//! header or a socket's auxdata), not in the frame: read by both the safe
//! ring readers and the `sys` layer, so it depends on neither.

const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;
const ETH_P_8021Q: u16 = 0x8100;

/// The (TPID, TCI) the kernel reports with `status`, if it reports one; a
/// TPID it leaves out is 802.1Q's.
pub(crate) fn vlan_of(status: u32, tci: u16, tpid: u16) -> Option<(u16, u16)> {
    if status & TP_STATUS_VLAN_VALID == 0 {
        return None;
    }
    let tpid = if status & TP_STATUS_VLAN_TPID_VALID != 0 && tpid != 0 {
        tpid
    } else {
        ETH_P_8021Q
    };
    Some((tpid, tci))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vlan_metadata() {
        assert_eq!(vlan_of(0, 5, 0), None);
        assert_eq!(vlan_of(TP_STATUS_VLAN_VALID, 5, 0), Some((0x8100, 5)));
        assert_eq!(
            vlan_of(TP_STATUS_VLAN_VALID | TP_STATUS_VLAN_TPID_VALID, 5, 0x88a8),
            Some((0x88a8, 5))
        );
    }
}
