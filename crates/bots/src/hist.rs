//! A fixed-size latency histogram with about 1.6 % relative precision:
//! exact below 128 ns, then 64 sub-buckets per power of two. Recording is
//! an index computation and an increment, so it can sit in the receive path.

/// Sub-buckets per power of two (2^6).
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
/// Enough buckets for any u64.
const BUCKETS: usize = (64 - SUB_BITS as usize) * SUB + 2 * SUB;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < (2 * SUB) as u64 {
        return v as usize;
    }
    let msb = 63 - v.leading_zeros();
    let shift = msb - SUB_BITS;
    // top is in [SUB, 2*SUB).
    let top = (v >> shift) as usize;
    shift as usize * SUB + top
}

/// Smallest value that falls in bucket `i`.
fn lower_bound(i: usize) -> u64 {
    if i < 2 * SUB {
        return i as u64;
    }
    let shift = i / SUB - 1;
    ((i % SUB + SUB) as u64) << shift
}

impl Histogram {
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.total += o.total;
        self.max = self.max.max(o.max);
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The value at quantile `q` (0..=1), as the lower bound of its bucket
    /// (never above the true maximum); 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return lower_bound(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..100_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let i = index(v);
            assert!(i >= last && i < BUCKETS, "{v}");
            last = i;
            let lb = lower_bound(i);
            assert!(lb <= v, "{v}: {lb}");
            assert!(v - lb <= v / 64, "{v}: {lb}");
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!((490_000..=500_000).contains(&p50), "{p50}");
        let p99 = h.quantile(0.99);
        assert!((975_000..=990_000).contains(&p99), "{p99}");
        assert_eq!(h.max(), 1_000_000);
        assert!(h.quantile(1.0) <= 1_000_000);
        let mut g = Histogram::default();
        g.record(5);
        g.merge(&h);
        assert_eq!(g.count(), 1001);
        assert_eq!(g.quantile(0.0), 5);
    }
}
