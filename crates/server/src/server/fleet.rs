//! `serve --registry`: the reflector in a fleet. It registers in Redis
//! before it serves (the id its tokens must name comes from there), then a
//! thread of its own heartbeats its load and whether it drains, signed with
//! the secret in force, and removes the entry on a clean stop so its cells
//! are placed elsewhere at once. A Redis outage costs heartbeats only: the
//! reflector keeps serving, and writes its entry again when Redis is back.

use super::secret::SharedSecret;
use super::Drain;
use crate::liveness::{Liveness, Watch};
use crate::metrics::Registry;
use reflector_proto::auth::SecretRing;
use reflector_registry::{Registrar, RegistryConfig, RegistryError};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Registers the reflector: its id (`id` if nonzero, else a new one).
pub(crate) fn register(
    cfg: &RegistryConfig,
    ring: &SecretRing,
    id: u16,
    addr: IpAddr,
    ports: &[u16],
    capacity: u64,
) -> Result<Registrar, RegistryError> {
    let r = Registrar::register(cfg, ring, (id != 0).then_some(id), addr, ports, capacity)?;
    tracing::info!(
        "registered in the fleet's registry {} as reflector {} ({addr}, {} port(s))",
        reflector_registry::redacted(&cfg.url),
        r.id(),
        ports.len()
    );
    Ok(r)
}

/// The heartbeat thread; stopping it removes the entry.
pub(crate) struct Heartbeats {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    /// The thread's liveness, for `/healthz`: a reflector whose heartbeats
    /// stopped leaves the registry when its entry expires, while its loops
    /// still serve.
    liveness: Liveness,
}

impl Heartbeats {
    // The thread's inputs, each from its own owner.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        mut registrar: Registrar,
        every: Duration,
        ttl: Duration,
        ports: Vec<u16>,
        counters: Registry,
        draining: Arc<AtomicBool>,
        secret: Arc<SharedSecret>,
        drain: Arc<Drain>,
    ) -> std::io::Result<Heartbeats> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let mut watch = Watch::new();
        let handle = watch.spawn("registry", move || {
            let mut seen = 0;
            let mut last = (Instant::now(), fanned_out(&counters));
            let mut failing = false;
            let mut next = Instant::now();
            let mut orphans = Orphans::new(ports, 2 * ttl);
            drain.set_fleet();
            while !stop2.load(Relaxed) {
                if Instant::now() < next {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                next += every;
                if let Some(ring) = secret.newer(&mut seen) {
                    registrar.set_secret(ring);
                }
                let now = (Instant::now(), fanned_out(&counters));
                let dt = now.0.duration_since(last.0).as_secs_f64().max(1e-3);
                let rate = (now.1.saturating_sub(last.1) as f64 / dt) as u64;
                last = now;
                let members = counters.groups.iter().map(|(_, c)| c.members.load(Relaxed)).sum();
                match registrar.heartbeat(members, rate, draining.load(Relaxed)) {
                    Ok(()) => {
                        if failing {
                            failing = false;
                            tracing::info!("registry reachable again: heartbeats resumed");
                        }
                        if let Ok((placed, any)) = registrar.placed_ports() {
                            // Draining, this reflector knows why its cells
                            // went: no need to wait for a restart to settle.
                            orphans.after = if draining.load(Relaxed) {
                                Duration::ZERO
                            } else {
                                2 * ttl
                            };
                            if let Some(ports) = orphans.update(&placed, any, Instant::now()) {
                                drain.reassign(ports);
                            }
                        }
                    }
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!("{e}; serving on, heartbeats retried");
                    }
                    Err(_) => {}
                }
            }
            if let Err(e) = registrar.deregister() {
                tracing::warn!("{e}; the entry expires by itself");
            }
        })?;
        Ok(Heartbeats {
            stop,
            handle: Some(handle),
            liveness: watch.liveness(),
        })
    }

    /// Whether the heartbeat thread still runs.
    pub(crate) fn liveness(&self) -> Liveness {
        self.liveness.clone()
    }

    /// Stops heartbeating and removes the entry.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// This reflector's groups that no cell is placed on: after `after` of it
/// (a Redis that restarted is refilled by the control servers meanwhile),
/// their members are told to move. Split brain while cut off from the
/// registry is accepted: members keep playing here, new players go where
/// the control servers say, and this heals it once the registry is back.
struct Orphans {
    ports: Vec<u16>,
    after: Duration,
    since: std::collections::HashMap<u16, Instant>,
    told: Vec<u16>,
}

impl Orphans {
    fn new(ports: Vec<u16>, after: Duration) -> Orphans {
        Orphans {
            ports,
            after,
            since: Default::default(),
            told: Vec::new(),
        }
    }

    /// The groups to tell now, if that changed.
    fn update(&mut self, placed: &std::collections::HashSet<u16>, any: bool, now: Instant) -> Option<Vec<u16>> {
        for &p in &self.ports {
            if any && !placed.contains(&p) {
                self.since.entry(p).or_insert(now);
            } else {
                self.since.remove(&p);
            }
        }
        let mut due: Vec<u16> = self
            .since
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= self.after)
            .map(|(p, _)| *p)
            .collect();
        due.sort_unstable();
        if due == self.told {
            return None;
        }
        if !due.is_empty() {
            tracing::info!("no cell is placed on group(s) {due:?} here any more: their members are told to move");
        }
        self.told = due.clone();
        Some(due)
    }
}

fn fanned_out(r: &Registry) -> u64 {
    r.groups.iter().map(|(_, c)| c.fanned_out.load(Relaxed)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_group_is_told_only_after_it_stayed_unplaced() {
        let t0 = Instant::now();
        let s = |ms| t0 + Duration::from_millis(ms);
        let mut o = Orphans::new(vec![4000, 4001], Duration::from_secs(2));
        let placed: HashSet<u16> = [4000].into();
        assert_eq!(o.update(&placed, true, s(0)), None, "4001 unplaced, not long enough");
        // An empty registry (restarted) says nothing about anyone.
        assert_eq!(o.update(&HashSet::new(), false, s(1_000)), None);
        assert_eq!(o.update(&placed, true, s(1_500)), None, "the clock started again");
        assert_eq!(o.update(&placed, true, s(3_600)), Some(vec![4001]));
        assert_eq!(o.update(&placed, true, s(4_000)), None, "said once");
        let both: HashSet<u16> = [4000, 4001].into();
        assert_eq!(
            o.update(&both, true, s(5_000)),
            Some(vec![]),
            "placed again: no more MOVED"
        );
    }
}
