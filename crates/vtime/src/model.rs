//! The clock model: pure arithmetic, no system calls.
//!
//! Virtual time is piecewise linear in real time. Times here are nanoseconds
//! *elapsed since the domain was created* on one clock base; a [`Segment`]
//! maps elapsed real time `x` to elapsed virtual time
//! `v0 + floor((x - r0) / tdf)`, and a TDF change starts a new segment at the
//! moment of the change ([`Segment::rebase`]), so virtual clocks stay
//! continuous and monotonic. The C shim computes exactly the same integers
//! (same rounding), which the integration tests rely on.

use std::fmt;
use std::str::FromStr;

pub const NS_PER_SEC: i64 = 1_000_000_000;

/// How far (real ns) a TDF change moves the joint of the two pieces (see
/// [`Segment::rebase`]): well over a reader's reordering window (tens of
/// ns), well under anything a program could notice.
pub const REBASE_GUARD_NS: i64 = 1_000;

/// The largest forward step (virtual ns) a change from `a` to `b` can make.
pub fn max_rebase_step(a: Tdf, b: Tdf) -> i64 {
    a.real_to_virtual(REBASE_GUARD_NS)
        .max(b.real_to_virtual(REBASE_GUARD_NS))
        + 1
}

/// Largest accepted TDF (and smallest, as its inverse): keeps every product in
/// the model far from overflow and every factor meaningful.
pub const TDF_LIMIT: u64 = 1_000_000;

/// A time dilation factor `num / den` (> 0): real time passes `tdf` times
/// faster than virtual time. Kept as a reduced fraction so that integer and
/// decimal factors scale exactly (a 1 s virtual sleep at TDF 4 is 4 s real to
/// the nanosecond).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tdf {
    num: u64,
    den: u64,
}

/// Why a TDF was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TdfError {
    #[error("not a number (write a positive decimal such as 4 or 2.5, or a fraction such as 1/3)")]
    NotANumber,
    #[error("must be greater than 0")]
    NotPositive,
    #[error("must be between 1/{TDF_LIMIT} and {TDF_LIMIT}")]
    OutOfRange,
    #[error("has more than 9 decimal places")]
    TooPrecise,
}

impl Tdf {
    pub const ONE: Tdf = Tdf { num: 1, den: 1 };

    /// `num / den`, reduced; both must be > 0 and the value within the limits.
    pub fn new(num: u64, den: u64) -> Result<Tdf, TdfError> {
        if num == 0 || den == 0 {
            return Err(TdfError::NotPositive);
        }
        let g = gcd(num, den);
        let (num, den) = (num / g, den / g);
        // num/den <= LIMIT and den/num <= LIMIT, in integers.
        if u128::from(num) > u128::from(den) * u128::from(TDF_LIMIT)
            || u128::from(den) > u128::from(num) * u128::from(TDF_LIMIT)
        {
            return Err(TdfError::OutOfRange);
        }
        Ok(Tdf { num, den })
    }

    /// The nearest factor with 6 decimal places (for APIs that compute a TDF,
    /// such as an adaptive controller); NaN, infinities and non-positive
    /// values are refused.
    pub fn from_f64(x: f64) -> Result<Tdf, TdfError> {
        if !x.is_finite() {
            return Err(TdfError::NotANumber);
        }
        if x <= 0.0 {
            return Err(TdfError::NotPositive);
        }
        let scaled = (x * 1e6).round();
        if scaled < 1.0 || scaled > (TDF_LIMIT as f64) * 1e6 {
            return Err(TdfError::OutOfRange);
        }
        // In range by the check above, so the cast is exact.
        Tdf::new(scaled as u64, 1_000_000)
    }

    pub fn num(self) -> u64 {
        self.num
    }

    pub fn den(self) -> u64 {
        self.den
    }

    pub fn as_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    /// Virtual duration for a real one: `floor(real / tdf)`.
    pub fn real_to_virtual(self, real_ns: i64) -> i64 {
        mul_div_floor(real_ns, self.den, self.num)
    }

    /// Real duration for a virtual one: `ceil(virtual * tdf)`, so a wait never
    /// ends early.
    pub fn virtual_to_real(self, virtual_ns: i64) -> i64 {
        mul_div_ceil(virtual_ns, self.num, self.den)
    }
}

impl PartialOrd for Tdf {
    fn partial_cmp(&self, other: &Tdf) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tdf {
    /// By value (a/b against c/d as a*d against c*b).
    fn cmp(&self, other: &Tdf) -> std::cmp::Ordering {
        (u128::from(self.num) * u128::from(other.den)).cmp(&(u128::from(other.num) * u128::from(self.den)))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl FromStr for Tdf {
    type Err = TdfError;

    /// Accepts `4`, `2.5`, `0.25` and `1/3`; refuses NaN, infinities,
    /// exponents, signs and zero with a reason.
    fn from_str(s: &str) -> Result<Tdf, TdfError> {
        let s = s.trim();
        if let Some((n, d)) = s.split_once('/') {
            let n = parse_decimal(n.trim())?;
            let d = parse_decimal(d.trim())?;
            // (a/b) / (c/e) = a*e / (b*c)
            let num = n.0.checked_mul(d.1).ok_or(TdfError::OutOfRange)?;
            let den = n.1.checked_mul(d.0).ok_or(TdfError::OutOfRange)?;
            return Tdf::new(num, den);
        }
        let (num, den) = parse_decimal(s)?;
        Tdf::new(num, den)
    }
}

/// A non-negative decimal as `(num, den)` with `den` a power of ten.
fn parse_decimal(s: &str) -> Result<(u64, u64), TdfError> {
    if s.starts_with('-') && s.len() > 1 && s[1..].bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(TdfError::NotPositive);
    }
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(TdfError::NotANumber);
    }
    if frac.len() > 9 {
        return Err(TdfError::TooPrecise);
    }
    let den = 10u64.pow(frac.len() as u32);
    let int_v: u64 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| TdfError::OutOfRange)?
    };
    let frac_v: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| TdfError::NotANumber)?
    };
    let num = int_v
        .checked_mul(den)
        .and_then(|v| v.checked_add(frac_v))
        .ok_or(TdfError::OutOfRange)?;
    if num == 0 {
        return Err(TdfError::NotPositive);
    }
    Ok((num, den))
}

impl fmt::Display for Tdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            return write!(f, "{}", self.num);
        }
        // Exact decimal when the denominator divides a power of ten.
        let mut scale = 1u64;
        for places in 1..=9 {
            scale *= 10;
            if scale % self.den == 0 {
                let v = u128::from(self.num) * u128::from(scale / self.den);
                let int = v / u128::from(scale);
                let frac = v % u128::from(scale);
                let s = format!("{int}.{frac:0places$}");
                return f.write_str(s.trim_end_matches('0'));
            }
        }
        write!(f, "{}/{}", self.num, self.den)
    }
}

fn clamp(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

/// `floor(a * m / d)` for `d > 0`, saturating.
pub fn mul_div_floor(a: i64, m: u64, d: u64) -> i64 {
    clamp((i128::from(a) * i128::from(m)).div_euclid(i128::from(d)))
}

/// `ceil(a * m / d)` for `d > 0`, saturating.
pub fn mul_div_ceil(a: i64, m: u64, d: u64) -> i64 {
    if a == i64::MIN {
        return i64::MIN;
    }
    -mul_div_floor(-a, m, d)
}

/// Division by a fixed divisor as a multiply and two shifts (Granlund and
/// Montgomery, "Division by invariant integers using multiplication", the
/// round-up method for 64-bit words). The writer computes it once per TDF
/// change and stores it in the record; the shim divides with it on every
/// clock read, since a 64-bit divide instruction alone costs several ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divider {
    pub divisor: u64,
    pub magic: u64,
    pub shift: u64,
}

impl Divider {
    pub fn new(divisor: u64) -> Divider {
        if divisor <= 1 {
            return Divider {
                divisor,
                magic: 0,
                shift: 0,
            };
        }
        // l = ceil(log2 d); magic = floor(2^64 * (2^l - d) / d) + 1, < 2^64.
        let l = 64 - (divisor - 1).leading_zeros();
        let d = u128::from(divisor);
        let magic = ((1u128 << 64) * ((1u128 << l) - d)) / d + 1;
        Divider {
            divisor,
            magic: magic as u64,
            shift: u64::from(l - 1),
        }
    }

    /// `n / divisor`, exactly, for every `n` (what the C shim computes).
    pub fn div(&self, n: u64) -> u64 {
        if self.divisor <= 1 {
            return n;
        }
        let t = ((u128::from(self.magic) * u128::from(n)) >> 64) as u64;
        (t + ((n - t) >> 1)) >> self.shift
    }
}

/// One linear piece of the virtual clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub tdf: Tdf,
    /// Elapsed real ns at the start of this piece.
    pub r0: i64,
    /// Elapsed virtual ns at the start of this piece.
    pub v0: i64,
}

impl Segment {
    /// The first piece of a new domain: both clocks start together.
    pub fn start(tdf: Tdf) -> Segment {
        Segment { tdf, r0: 0, v0: 0 }
    }

    /// Elapsed virtual time at elapsed real time `x`.
    pub fn virtual_at(&self, x: i64) -> i64 {
        self.v0
            .saturating_add(self.tdf.real_to_virtual(x.saturating_sub(self.r0)))
    }

    /// The earliest elapsed real time at which the virtual time reaches `v`
    /// (on this piece): a deadline converted with it is never early.
    pub fn real_at(&self, v: i64) -> i64 {
        self.r0
            .saturating_add(self.tdf.virtual_to_real(v.saturating_sub(self.v0)))
    }

    /// The piece with factor `tdf` that continues this one from a change
    /// made at elapsed real time `x`.
    ///
    /// The joint is not placed exactly at `x` but `REBASE_GUARD_NS` later
    /// when the clock slows down and that much earlier when it speeds up.
    /// Then on the whole interval `x ± REBASE_GUARD_NS` the new piece is at or
    /// above the old one, so a reader whose clock reading and record reading
    /// straddle the change by less than the guard (the CPU may reorder them by
    /// a few ns) never sees the clock go back. The new piece starts 1 ns
    /// above the old one, because both round down: without it a value of the
    /// new piece could fall 1 ns below one of the old. The price is a forward
    /// step at the change of at most 1 ns plus the guard times
    /// |1/old - 1/new|. The same factor again changes nothing.
    pub fn rebase(&self, x: i64, tdf: Tdf) -> Segment {
        let r0 = match tdf.cmp(&self.tdf) {
            std::cmp::Ordering::Greater => x.saturating_add(REBASE_GUARD_NS),
            std::cmp::Ordering::Less => x.saturating_sub(REBASE_GUARD_NS),
            std::cmp::Ordering::Equal => return *self,
        };
        Segment {
            tdf,
            r0,
            v0: self.virtual_at(r0).saturating_add(1),
        }
    }
}

/// The clock bases the shim dilates; every dilated clock id maps to one.
/// Indices match `VTIME_BASE_*` in the C header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockBase {
    Realtime = 0,
    Monotonic = 1,
    Boottime = 2,
    MonotonicRaw = 3,
    Tai = 4,
}

pub const NBASES: usize = 5;

impl ClockBase {
    pub const ALL: [ClockBase; NBASES] = [
        ClockBase::Realtime,
        ClockBase::Monotonic,
        ClockBase::Boottime,
        ClockBase::MonotonicRaw,
        ClockBase::Tai,
    ];

    /// The base a clock id is dilated on, as the shim does it. `None` for the
    /// process and thread CPU-time clocks (and any other id): they count CPU
    /// consumed, not time passing, so they stay real and agree with getrusage.
    pub fn of_clock_id(id: libc::clockid_t) -> Option<ClockBase> {
        match id {
            libc::CLOCK_REALTIME | libc::CLOCK_REALTIME_COARSE | libc::CLOCK_REALTIME_ALARM => {
                Some(ClockBase::Realtime)
            }
            libc::CLOCK_MONOTONIC | libc::CLOCK_MONOTONIC_COARSE => Some(ClockBase::Monotonic),
            libc::CLOCK_BOOTTIME | libc::CLOCK_BOOTTIME_ALARM => Some(ClockBase::Boottime),
            libc::CLOCK_MONOTONIC_RAW => Some(ClockBase::MonotonicRaw),
            libc::CLOCK_TAI => Some(ClockBase::Tai),
            _ => None,
        }
    }
}

/// A domain's whole clock state: each base's real value at creation and its
/// current piece. Absolute clock values in, absolute clock values out.
///
/// Each base has its own piece because the bases do not tick together
/// exactly (NTP slews REALTIME, BOOTTIME includes suspend, RAW is not
/// adjusted) and are read one after the other: a change placed at one
/// instant measured on MONOTONIC would land a little off on the others and
/// could step them back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeline {
    pub epochs: [i64; NBASES],
    pub segs: [Segment; NBASES],
}

impl Timeline {
    /// A new domain's clocks: virtual equals real at `epochs`.
    pub fn start(epochs: [i64; NBASES], tdf: Tdf) -> Timeline {
        Timeline {
            epochs,
            segs: [Segment::start(tdf); NBASES],
        }
    }

    /// The current factor.
    pub fn tdf(&self) -> Tdf {
        self.segs[ClockBase::Monotonic as usize].tdf
    }

    /// The clocks after a change to `tdf` made when the bases read `now`.
    pub fn rebase(&self, now: [i64; NBASES], tdf: Tdf) -> Timeline {
        let mut segs = self.segs;
        for (i, seg) in segs.iter_mut().enumerate() {
            *seg = seg.rebase(now[i].saturating_sub(self.epochs[i]), tdf);
        }
        Timeline {
            epochs: self.epochs,
            segs,
        }
    }

    /// Virtual value of clock `base` when its real value is `real`.
    pub fn virtual_now(&self, base: ClockBase, real: i64) -> i64 {
        let e = self.epochs[base as usize];
        e.saturating_add(self.segs[base as usize].virtual_at(real.saturating_sub(e)))
    }

    /// The real value clock `base` must reach for its virtual value to reach
    /// the absolute virtual deadline `deadline` (valid until the next TDF change).
    pub fn real_deadline(&self, base: ClockBase, deadline: i64) -> i64 {
        let e = self.epochs[base as usize];
        e.saturating_add(self.segs[base as usize].real_at(deadline.saturating_sub(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tdf(s: &str) -> Tdf {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_prints_factors() {
        assert_eq!(tdf("4"), Tdf::new(4, 1).unwrap());
        assert_eq!(tdf("2.5"), Tdf::new(5, 2).unwrap());
        assert_eq!(tdf("0.25"), Tdf::new(1, 4).unwrap());
        assert_eq!(tdf("1/3"), Tdf::new(1, 3).unwrap());
        assert_eq!(tdf(" 10 "), Tdf::new(10, 1).unwrap());
        for (s, shown) in [
            ("4", "4"),
            ("2.5", "2.5"),
            ("0.125", "0.125"),
            ("1/3", "1/3"),
            ("4.000", "4"),
        ] {
            assert_eq!(tdf(s).to_string(), shown);
        }
        for (s, e) in [
            ("0", TdfError::NotPositive),
            ("0.0", TdfError::NotPositive),
            ("-1", TdfError::NotPositive),
            ("nan", TdfError::NotANumber),
            ("NaN", TdfError::NotANumber),
            ("inf", TdfError::NotANumber),
            ("1e3", TdfError::NotANumber),
            ("", TdfError::NotANumber),
            (".", TdfError::NotANumber),
            ("4/0", TdfError::NotPositive),
            ("2000000", TdfError::OutOfRange),
            ("0.0000001", TdfError::OutOfRange),
            ("1.0000000001", TdfError::TooPrecise),
        ] {
            assert_eq!(s.parse::<Tdf>(), Err(e), "{s:?}");
        }
        assert_eq!(Tdf::from_f64(f64::NAN), Err(TdfError::NotANumber));
        assert_eq!(Tdf::from_f64(-2.0), Err(TdfError::NotPositive));
        assert_eq!(Tdf::from_f64(2.5), Ok(Tdf::new(5, 2).unwrap()));
    }

    #[test]
    fn integer_factor_scales_exactly() {
        let s = Segment::start(tdf("4"));
        assert_eq!(s.virtual_at(4 * NS_PER_SEC), NS_PER_SEC);
        assert_eq!(s.real_at(NS_PER_SEC), 4 * NS_PER_SEC);
        assert_eq!(s.virtual_at(3), 0);
        assert_eq!(s.real_at(1), 4);
    }

    #[test]
    fn divider_edge_cases() {
        for d in [1u64, 2, 3, 4, 5, 7, 10, 1_000_000, u64::MAX / 3, u64::MAX] {
            let div = Divider::new(d);
            for n in [0u64, 1, d - 1, d, d.saturating_add(1), u64::MAX - 1, u64::MAX] {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn cpu_clocks_are_not_dilated() {
        assert_eq!(ClockBase::of_clock_id(libc::CLOCK_PROCESS_CPUTIME_ID), None);
        assert_eq!(ClockBase::of_clock_id(libc::CLOCK_THREAD_CPUTIME_ID), None);
        assert_eq!(
            ClockBase::of_clock_id(libc::CLOCK_MONOTONIC_COARSE),
            Some(ClockBase::Monotonic)
        );
        assert_eq!(ClockBase::of_clock_id(libc::CLOCK_BOOTTIME), Some(ClockBase::Boottime));
    }

    #[test]
    fn timeline_converts_absolute_deadlines_per_base() {
        let mut epochs = [0; NBASES];
        epochs[ClockBase::Realtime as usize] = 1_700_000_000 * NS_PER_SEC;
        epochs[ClockBase::Monotonic as usize] = 5 * NS_PER_SEC;
        let t = Timeline::start(epochs, tdf("4"));
        // 8 s of real time after creation: 2 s of virtual time on every base.
        assert_eq!(t.virtual_now(ClockBase::Monotonic, 13 * NS_PER_SEC), 7 * NS_PER_SEC);
        assert_eq!(
            t.virtual_now(ClockBase::Realtime, epochs[0] + 8 * NS_PER_SEC),
            epochs[0] + 2 * NS_PER_SEC
        );
        assert_eq!(t.real_deadline(ClockBase::Monotonic, 7 * NS_PER_SEC), 13 * NS_PER_SEC);
    }

    fn arb_tdf() -> impl Strategy<Value = Tdf> {
        prop_oneof![
            (1u64..=64).prop_map(|n| Tdf::new(n, 1).unwrap()),
            (1u64..=100_000, 1u64..=100_000).prop_map(|(n, d)| Tdf::new(n, d).unwrap()),
        ]
    }

    proptest! {
        /// The shim's multiply-and-shift division equals true division.
        #[test]
        fn divider_is_exact(d in 1u64..=2 * TDF_LIMIT * 1_000_000_000, n in any::<u64>(), small in 0u64..1_000_000) {
            let div = Divider::new(d);
            prop_assert_eq!(div.div(n), n / d);
            prop_assert_eq!(div.div(small), small / d);
            prop_assert_eq!(div.div(u64::MAX), u64::MAX / d);
            let near = (n / d).saturating_mul(d);
            prop_assert_eq!(div.div(near), near / d);
            prop_assert_eq!(div.div(near.saturating_sub(1)), near.saturating_sub(1) / d);
        }

        /// Across any sequence of TDF changes at increasing real times, the
        /// virtual clock never goes back and never jumps at a change.
        #[test]
        fn monotonic_and_continuous_across_changes(
            first in arb_tdf(),
            changes in prop::collection::vec((0i64..10 * NS_PER_SEC, arb_tdf()), 0..20),
            probes in prop::collection::vec(0i64..12 * NS_PER_SEC, 1..20),
        ) {
            let mut seg = Segment::start(first);
            let mut x = 0i64;
            let mut last_v = seg.virtual_at(0);
            for (dx, tdf) in changes {
                let before = seg;
                // Probe inside the piece, in order.
                let mut ps: Vec<i64> = probes.iter().map(|p| x + p % (dx + 1)).collect();
                ps.sort_unstable();
                for p in ps {
                    let v = seg.virtual_at(p);
                    prop_assert!(v >= last_v, "clock went back: {v} < {last_v}");
                    last_v = v;
                }
                x += dx;
                seg = seg.rebase(x, tdf);
                // Continuous up to the guard's forward step, and never below
                // the old piece anywhere near the change (stale readers).
                let step = seg.virtual_at(x) - before.virtual_at(x);
                prop_assert!((0..=max_rebase_step(before.tdf, tdf)).contains(&step), "step {step} at a change");
                for y in [x - REBASE_GUARD_NS, x - 1, x, x + 1, x + REBASE_GUARD_NS] {
                    prop_assert!(seg.virtual_at(y) >= before.virtual_at(y), "new piece below old at {y}");
                }
                prop_assert!(seg.virtual_at(x) >= last_v);
                last_v = seg.virtual_at(x);
            }
        }

        /// Per-base rebasing keeps every base continuous even when the bases
        /// were read at different instants.
        #[test]
        fn timeline_rebase_per_base(
            skew in prop::collection::vec(-1_000_000i64..1_000_000, NBASES),
            x in 0i64..100 * NS_PER_SEC,
            a in arb_tdf(),
            b in arb_tdf(),
        ) {
            let t0 = Timeline::start([0; NBASES], a);
            let now: [i64; NBASES] = std::array::from_fn(|i| x + skew[i]);
            let t1 = t0.rebase(now, b);
            for base in ClockBase::ALL {
                let r = now[base as usize];
                let step = t1.virtual_now(base, r) - t0.virtual_now(base, r);
                prop_assert!((0..=max_rebase_step(a, b)).contains(&step), "{base:?}: step {step}");
                let (lo, hi) = (r - REBASE_GUARD_NS, r + REBASE_GUARD_NS);
                prop_assert!(t1.virtual_now(base, lo) >= t0.virtual_now(base, lo));
                prop_assert!(t1.virtual_now(base, hi) >= t0.virtual_now(base, hi));
            }
            prop_assert_eq!(t1.tdf(), b);
        }

        /// Exact scaling: k*d of real time is exactly d of virtual time at
        /// integer TDF k, and d/tdf within one ns at any factor.
        #[test]
        fn exact_scaling(k in 1u64..1000, d in 0i64..1_000_000 * NS_PER_SEC, r0 in 0i64..NS_PER_SEC, v0 in 0i64..NS_PER_SEC) {
            let seg = Segment { tdf: Tdf::new(k, 1).unwrap(), r0, v0 };
            prop_assert_eq!(seg.virtual_at(r0 + k as i64 * d) - v0, d);
            prop_assert_eq!(seg.real_at(v0 + d) - r0, k as i64 * d);
        }

        /// A converted deadline is the earliest real time that reaches it.
        #[test]
        fn deadline_round_trip(tdf in arb_tdf(), r0 in 0i64..NS_PER_SEC, v0 in 0i64..NS_PER_SEC, v in 0i64..100 * NS_PER_SEC) {
            let seg = Segment { tdf, r0, v0 };
            let x = seg.real_at(v);
            prop_assert!(seg.virtual_at(x) >= v);
            prop_assert!(seg.virtual_at(x - 1) < v || x <= r0);
            // Durations: converting there and back never gains time.
            prop_assert!(tdf.real_to_virtual(tdf.virtual_to_real(v)) >= v);
            prop_assert!(tdf.virtual_to_real(tdf.real_to_virtual(v)) <= v);
        }
    }
}
