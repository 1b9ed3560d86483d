//! `control --registry`: cells placed on the fleet's live reflectors. A
//! thread polls the registry (Redis) every second and keeps every cell of
//! the world placed on a live reflector that is not draining (atomic
//! claims: several control servers agree); `/join` answers from the last
//! view, so it keeps answering while Redis is down, and says 503 only for a
//! cell no live reflector has taken yet.

use crate::secret::SecretCell;
use reflector_registry::{Directory, RegistryConfig, RegistryError, View};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the registry is polled: a dead reflector's cells move within
/// its entry's TTL plus this.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// The placements a control server answers from, shared with its poller.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    view: Arc<RwLock<View>>,
    /// Whether the last poll reached Redis.
    up: Arc<AtomicBool>,
    polls_failed: Arc<AtomicU64>,
}

impl PartialEq for Fleet {
    fn eq(&self, other: &Fleet) -> bool {
        Arc::ptr_eq(&self.view, &other.view)
    }
}

impl Fleet {
    pub fn view(&self) -> View {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Where `cell` is served now.
    pub fn target(&self, cell: (u32, u32)) -> Option<(u16, std::net::SocketAddr)> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).target(cell)
    }

    pub fn registry_up(&self) -> bool {
        self.up.load(Relaxed)
    }

    pub fn polls_failed(&self) -> u64 {
        self.polls_failed.load(Relaxed)
    }
}

/// The poller; stops with the control server.
pub struct Poller {
    handle: Option<JoinHandle<()>>,
}

impl Poller {
    /// Connects (a bad URL is an error here) and polls until `stop`.
    pub fn start(
        cfg: &RegistryConfig,
        secret: SecretCell,
        fleet: Fleet,
        cells: Vec<(u32, u32)>,
        stop: Arc<AtomicBool>,
    ) -> Result<Poller, RegistryError> {
        let mut dir = Directory::new(cfg, &secret.ring())?;
        let url = reflector_registry::redacted(&cfg.url);
        // A wrong certificate, CA file or scheme never heals by itself:
        // stop here, naming it. An unreachable Redis may come back: the
        // poller goes on, and /join answers once cells are placed.
        match dir.check() {
            Err(e) if e.is_misconfigured() => return Err(e),
            Err(e) => tracing::warn!("fleet: {e}; polling on until it answers"),
            Ok(()) => {}
        }
        let handle = std::thread::Builder::new()
            .name("registry".into())
            .spawn(move || {
                let mut next = Instant::now();
                let mut known: Vec<u16> = Vec::new();
                while !stop.load(Relaxed) {
                    if Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    next += POLL_EVERY;
                    dir.set_secret(secret.ring());
                    match dir.refresh(&cells) {
                        Ok(v) => {
                            let ids: Vec<u16> = v.reflectors.keys().copied().collect();
                            if ids != known {
                                tracing::info!(
                                    "fleet: {} live reflector(s) {ids:?}, {} of {} cells placed",
                                    ids.len(),
                                    v.cells.len(),
                                    cells.len()
                                );
                                known = ids;
                            }
                            *fleet.view.write().unwrap_or_else(|p| p.into_inner()) = v.clone();
                            if !fleet.up.swap(true, Relaxed) {
                                tracing::info!("fleet: registry {url} reachable");
                            }
                        }
                        Err(e) => {
                            fleet.polls_failed.fetch_add(1, Relaxed);
                            if fleet.up.swap(false, Relaxed) {
                                tracing::warn!("fleet: {e}; answering from the last placements");
                            }
                        }
                    }
                }
            })
            .map_err(|e| RegistryError::Bad(format!("cannot start the registry thread: {e}")))?;
        Ok(Poller { handle: Some(handle) })
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// The fleet's series for `/metrics`.
pub fn write_metrics(e: &mut reflector_http::expo::Exposition, fleet: &Fleet) {
    let v = fleet.view();
    e.gauge(
        "reflector_control_fleet_reflectors",
        "Live reflectors in the registry (signed entries within their TTL), draining ones included.",
    )
    .sample(&[], v.reflectors.len() as u64);
    e.gauge(
        "reflector_control_fleet_cells_placed",
        "Cells of the world placed on a live reflector.",
    )
    .sample(&[], v.cells.len() as u64);
    e.gauge(
        "reflector_control_fleet_registry_up",
        "1 if the last poll of the registry reached it.",
    )
    .sample(&[], u64::from(fleet.registry_up()));
    e.counter(
        "reflector_control_fleet_claims",
        "Cells this control server placed or moved (atomic claims it won).",
    )
    .sample(&[], v.claims);
    e.counter(
        "reflector_control_fleet_rogue_entries",
        "Registry entries refused: not signed with the fleet's secret, expired, or malformed.",
    )
    .sample(&[], v.rogue);
    e.counter(
        "reflector_control_fleet_polls_failed",
        "Polls of the registry that failed (Redis unreachable).",
    )
    .sample(&[], fleet.polls_failed());
}
