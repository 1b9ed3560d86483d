//! Where the bots walk: a seedable generator, steps inside the world, and
//! the cell of a position as the control server computes it. Pure.

use reflector_proto::control::WorldInfo;

/// splitmix64: small, seedable, good enough for positions and phases.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(super) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Where a bot goes next: a step of up to one cell per axis, kept inside
/// the world. Pure, so it is tested without sockets.
pub(super) fn step(pos: (f64, f64), world: &WorldInfo, r1: f64, r2: f64) -> (f64, f64) {
    let clamp = |v: f64, limit: f64| v.clamp(0.0, limit * (1.0 - 1e-9));
    (
        clamp(pos.0 + (2.0 * r1 - 1.0) * world.cell_size, world.size[0]),
        clamp(pos.1 + (2.0 * r2 - 1.0) * world.cell_size, world.size[1]),
    )
}

/// The cell of a position, as the control server computes it.
pub(super) fn cell_of(pos: (f64, f64), world: &WorldInfo) -> [u32; 2] {
    let c = |v: f64, n: u32| ((v / world.cell_size).max(0.0) as u32).min(n.saturating_sub(1));
    [c(pos.0, world.grid[0]), c(pos.1, world.grid[1])]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> WorldInfo {
        WorldInfo {
            grid: [4, 2],
            cell_size: 10.0,
            size: [40.0, 20.0],
        }
    }

    #[test]
    fn steps_stay_in_the_world_and_cells_match_the_control_server() {
        let w = world();
        let mut rng = Rng(7);
        let mut p = (0.0, 0.0);
        for _ in 0..10_000 {
            p = step(p, &w, rng.unit(), rng.unit());
            assert!((0.0..40.0).contains(&p.0) && (0.0..20.0).contains(&p.1), "{p:?}");
            let c = cell_of(p, &w);
            assert!(c[0] < 4 && c[1] < 2);
        }
        assert_eq!(step((0.0, 0.0), &w, 0.0, 1.0), (0.0, 10.0));
        assert_eq!(cell_of((39.999, 19.999), &w), [3, 1]);
        assert_eq!(cell_of((10.0, 0.0), &w), [1, 0]);
    }

    #[test]
    fn rng_is_uniform_enough_and_repeatable() {
        let mut a = Rng(1);
        let mut b = Rng(1);
        let xs: Vec<f64> = (0..10_000).map(|_| a.unit()).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert_eq!(b.unit(), xs[0]);
    }
}
