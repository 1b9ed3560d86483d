//! What the developer examples share: the DATA header they measure with
//! and the median of their rounds.

#![allow(dead_code, reason = "each example uses a part of it")]

use reflector_proto::protocol::{Header, Kind};

/// The DATA header of every example's datagrams, with sequence `seq`.
pub fn header(seq: u64) -> Header {
    Header {
        kind: Kind::Data,
        group: 40_000,
        sender: 1001,
        membership: 0x5eed_1234,
        seq,
    }
}

/// The median of `v` (sorted in place; NaN when empty).
pub fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
