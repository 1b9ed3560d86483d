//! `serve --registry`: the reflector in a fleet. It registers in Redis
//! before it serves (the id its tokens must name comes from there), then a
//! thread of its own heartbeats its load and whether it drains, signed with
//! the secret in force, and removes the entry on a clean stop so its cells
//! are placed elsewhere at once. A Redis outage costs heartbeats only: the
//! reflector keeps serving, and writes its entry again when Redis is back.

use super::secret::SharedSecret;
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
}

impl Heartbeats {
    pub(crate) fn start(
        mut registrar: Registrar,
        every: Duration,
        counters: Registry,
        draining: Arc<AtomicBool>,
        secret: Arc<SharedSecret>,
    ) -> std::io::Result<Heartbeats> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new().name("registry".into()).spawn(move || {
            let mut seen = 0;
            let mut last = (Instant::now(), fanned_out(&counters));
            let mut failing = false;
            let mut next = Instant::now();
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
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("registry reachable again: heartbeats resumed");
                    }
                    Ok(()) => {}
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
        })
    }

    /// Stops heartbeating and removes the entry.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn fanned_out(r: &Registry) -> u64 {
    r.groups.iter().map(|(_, c)| c.fanned_out.load(Relaxed)).sum()
}
