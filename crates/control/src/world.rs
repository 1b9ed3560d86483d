//! The world map: the grid of cells, the (reflector, group) targets and
//! the rule that maps one onto the other. Kept apart from the HTTP layer
//! because it is pure and is what every answer is computed from; the
//! server and the command line build on it, never the other way round.

use crate::{fleet, sealing};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// One reflector as clients reach it, and its group ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReflectorSpec {
    pub ip: IpAddr,
    pub ports: Vec<u16>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    RoundRobin,
    Blocks,
}

impl fmt::Display for Assign {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Assign::RoundRobin => "round-robin",
            Assign::Blocks => "blocks",
        })
    }
}

/// Why a position cannot be mapped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MapError {
    #[error("{axis}={value} is not a finite number")]
    NotFinite { axis: &'static str, value: f64 },
    #[error("{axis}={value} is outside the world [0, {limit})")]
    Outside { axis: &'static str, value: f64, limit: f64 },
}

/// The world grid and its cell → (reflector, group) mapping. Pure.
#[derive(Debug, Clone, PartialEq)]
pub struct World {
    pub cols: u32,
    pub rows: u32,
    pub cell_size: f64,
    pub assign: Assign,
    /// Every (reflector, port) pair in mapping order (none in a fleet).
    pub targets: Vec<Target>,
    /// In a fleet (`--registry`): the placements of the registry instead.
    pub fleet: Option<fleet::Fleet>,
    /// With a sealing secret: grants carry the epoch keys of their group's
    /// cells, and `/keys` serves them ([`World::with_sealing`]).
    pub sealing: Option<Arc<sealing::Sealing>>,
}

/// One group on one reflector. The reflector id is the position of its
/// `--reflector` option (0, 1, ...); the reflector must be started with the
/// same `--reflector-id`, and tokens are bound to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub reflector_id: u16,
    pub addr: SocketAddr,
}

impl Target {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

/// `/world` lists every cell's group only up to this many cells; beyond it
/// the rule (assignment and targets) is enough to compute any cell, and an
/// unauthenticated request must not make the server build a huge answer.
const WORLD_LISTING_MAX_CELLS: u64 = 4096;

/// A grid of at least one cell of a positive, finite size.
fn check_grid(cols: u32, rows: u32, cell_size: f64) -> Result<(), String> {
    if !(cell_size.is_finite() && cell_size > 0.0) {
        return Err(format!("cell size must be a positive number, got {cell_size}"));
    }
    if cols == 0 || rows == 0 {
        return Err(format!("grid {cols}x{rows} has no cells"));
    }
    Ok(())
}

impl World {
    pub fn new(
        cols: u32,
        rows: u32,
        cell_size: f64,
        assign: Assign,
        reflectors: &[ReflectorSpec],
    ) -> Result<World, String> {
        check_grid(cols, rows, cell_size)?;
        if reflectors.len() > usize::from(u16::MAX) {
            return Err(format!("{} reflectors; at most {}", reflectors.len(), u16::MAX));
        }
        let targets: Vec<Target> = reflectors
            .iter()
            .enumerate()
            .flat_map(|(id, r)| {
                // id < u16::MAX, checked above.
                let reflector_id = id as u16;
                r.ports.iter().map(move |&p| Target {
                    reflector_id,
                    addr: SocketAddr::new(r.ip, p),
                })
            })
            .collect();
        if targets.is_empty() {
            return Err("no reflector ports to map cells onto (give --reflector IP:PORTS)".into());
        }
        Ok(World {
            cols,
            rows,
            cell_size,
            assign,
            targets,
            fleet: None,
            sealing: None,
        })
    }

    /// A world whose cells the fleet's registry places (`--registry`).
    pub fn for_fleet(cols: u32, rows: u32, cell_size: f64, fleet: fleet::Fleet) -> Result<World, String> {
        check_grid(cols, rows, cell_size)?;
        Ok(World {
            cols,
            rows,
            cell_size,
            assign: Assign::RoundRobin,
            targets: Vec::new(),
            fleet: Some(fleet),
            sealing: None,
        })
    }

    /// This world with sealing: its grants carry epoch keys. A static
    /// world whose groups would serve more than
    /// [`sealing::MAX_SEALED_CELLS_PER_GROUP`] cells each is refused (a
    /// fleet's placements are checked per answer).
    pub fn with_sealing(self, s: Arc<sealing::Sealing>) -> Result<World, String> {
        let most = self.most_cells_per_group();
        if most > sealing::MAX_SEALED_CELLS_PER_GROUP as u64 {
            return Err(format!(
                "with a sealing secret a group may serve at most {} cells (each grant carries their keys), \
                 but {}x{} cells onto {} group(s) puts {most} on one: give more group ports",
                sealing::MAX_SEALED_CELLS_PER_GROUP,
                self.cols,
                self.rows,
                self.targets.len()
            ));
        }
        Ok(World {
            sealing: Some(s),
            ..self
        })
    }

    /// The most cells one group of a static world serves (0 in a fleet):
    /// both assignments spread the cells as evenly as they divide.
    fn most_cells_per_group(&self) -> u64 {
        match self.targets.len() as u64 {
            0 => 0,
            n => self.cells().div_ceil(n),
        }
    }

    /// The cells the group `port` of reflector `reflector_id` serves now,
    /// row by row (none for a group the world does not map).
    pub fn cells_of_group(&self, reflector_id: u16, port: u16) -> Vec<(u32, u32)> {
        let at = |idx: u64| ((idx % u64::from(self.cols)) as u32, (idx / u64::from(self.cols)) as u32);
        if let Some(f) = &self.fleet {
            let v = f.view();
            let mut cells: Vec<(u32, u32)> = v
                .cells
                .iter()
                .filter(|(_, p)| p.reflector == reflector_id && p.port == port)
                .map(|(&c, _)| c)
                .collect();
            cells.sort_unstable_by_key(|&(x, y)| (y, x));
            return cells;
        }
        let Some(t) = self
            .targets
            .iter()
            .position(|t| t.reflector_id == reflector_id && t.port() == port)
        else {
            return Vec::new();
        };
        let (t, n, cells) = (t as u64, self.targets.len() as u64, self.cells());
        // The inverses of target_of's two rules.
        match self.assign {
            Assign::RoundRobin => (t..cells).step_by(n as usize).map(at).collect(),
            Assign::Blocks => ((t * cells).div_ceil(n)..((t + 1) * cells).div_ceil(n))
                .map(at)
                .collect(),
        }
    }

    /// Every cell, row by row.
    pub fn all_cells(&self) -> Vec<(u32, u32)> {
        (0..self.rows)
            .flat_map(|y| (0..self.cols).map(move |x| (x, y)))
            .collect()
    }

    pub fn cells(&self) -> u64 {
        u64::from(self.cols) * u64::from(self.rows)
    }

    /// World extent (width, height) in world units.
    pub fn size(&self) -> (f64, f64) {
        (
            f64::from(self.cols) * self.cell_size,
            f64::from(self.rows) * self.cell_size,
        )
    }

    /// The cell holding position (x, y).
    pub fn cell_of(&self, x: f64, y: f64) -> Result<(u32, u32), MapError> {
        let (w, h) = self.size();
        let axis = |name: &'static str, v: f64, limit: f64, n: u32| {
            if !v.is_finite() {
                return Err(MapError::NotFinite { axis: name, value: v });
            }
            if !(0.0..limit).contains(&v) {
                return Err(MapError::Outside {
                    axis: name,
                    value: v,
                    limit,
                });
            }
            // v < limit = n*cell_size, but rounding could still give n.
            Ok(((v / self.cell_size) as u32).min(n - 1))
        };
        Ok((axis("x", x, w, self.cols)?, axis("y", y, h, self.rows)?))
    }

    /// The (reflector, port) that serves a cell; `cell` must be in the grid.
    /// The cells within `r` cells of `cell` (the square of side 2r+1
    /// around it, cut at the world's edges), `cell` itself left out,
    /// nearest first (Chebyshev distance), then by row, then column.
    pub fn area_of(&self, cell: (u32, u32), r: u32) -> Vec<(u32, u32)> {
        reflector_proto::control::area_cells([self.cols, self.rows], [cell.0, cell.1], r)
            .into_iter()
            .map(|[x, y]| (x, y))
            .collect()
    }

    /// The (reflector, port) that serves a cell: `None` only in a fleet,
    /// for a cell no live reflector has taken yet.
    pub fn target_of(&self, cell: (u32, u32)) -> Option<Target> {
        if let Some(f) = &self.fleet {
            return f.target(cell).map(|(reflector_id, addr)| Target { reflector_id, addr });
        }
        let idx = u64::from(cell.1.min(self.rows - 1)) * u64::from(self.cols) + u64::from(cell.0.min(self.cols - 1));
        let n = self.targets.len() as u64;
        let t = match self.assign {
            Assign::RoundRobin => idx % n,
            Assign::Blocks => idx * n / self.cells(),
        };
        // t < n by construction in both arms.
        self.targets.get(t as usize).copied()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let (w, h) = self.size();
        let mapping: Vec<serde_json::Value> = if self.cells() <= WORLD_LISTING_MAX_CELLS {
            (0..self.rows)
                .flat_map(|cy| (0..self.cols).map(move |cx| (cx, cy)))
                .map(|c| match self.target_of(c) {
                    Some(t) => serde_json::json!({"cell": [c.0, c.1], "reflector": t.to_string(), "reflector_id": t.reflector_id, "group": t.port()}),
                    None => serde_json::json!({"cell": [c.0, c.1], "reflector": null}),
                })
                .collect()
        } else {
            Vec::new()
        };
        serde_json::json!({
            "grid": [self.cols, self.rows],
            "cell_size": self.cell_size,
            "size": [w, h],
            "assign": self.assign.to_string(),
            "targets": self.targets.iter().map(|t| serde_json::json!({"reflector_id": t.reflector_id, "addr": t.to_string()})).collect::<Vec<_>>(),
            "cells": mapping,
        })
    }
}
