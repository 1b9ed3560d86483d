//! The replay window: sequence numbers seen in one direction of a membership.

/// Sequence numbers seen in one direction of one membership: the highest
/// accepted and a bitmap of the 64 up to it (bit i: highest − i).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    pub highest: u64,
    pub bitmap: u64,
}

impl ReplayWindow {
    /// Whether `seq` would be accepted (new, or inside the window and unseen).
    pub fn fresh(&self, seq: u64) -> bool {
        if seq == 0 {
            return false;
        }
        if seq > self.highest {
            return true;
        }
        let back = self.highest - seq;
        back < 64 && self.bitmap & (1u64 << back) == 0
    }

    /// Accepts `seq` if fresh (call only once the datagram's MAC or tag
    /// verified, from the member's validated address); false for a replay.
    pub fn accept(&mut self, seq: u64) -> bool {
        if !self.fresh(seq) {
            return false;
        }
        if seq > self.highest {
            let shift = seq - self.highest;
            self.bitmap = if shift >= 64 { 0 } else { self.bitmap << shift };
            self.bitmap |= 1;
            self.highest = seq;
        } else {
            self.bitmap |= 1u64 << (self.highest - seq);
        }
        true
    }
}
