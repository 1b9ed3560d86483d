//! Shared helpers of the root-only integration tests.
#![expect(dead_code, reason = "each test file uses a part of the helpers")]

use netlab::lab::{Lab, LabOptions};
use netlab::model::Topology;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

pub use oskit::testing::root_or_skip as need_root;

pub fn opts() -> LabOptions {
    LabOptions::new(env!("CARGO_BIN_EXE_netlab"))
}

/// Builds a lab; the returned `Lab` is the RAII guard that removes every
/// namespace of the run when dropped, also when the test panics.
pub fn up(t: &Topology, o: &LabOptions) -> Lab {
    static NEVER: AtomicBool = AtomicBool::new(false);
    Lab::up(t, o, &NEVER).unwrap_or_else(|e| panic!("building {}: {e}", t.name))
}

/// Namespaces that carry a run's prefix.
pub fn namespaces_of(run_id: &str) -> Vec<String> {
    let p = netlab::plan::Naming::new(run_id).prefix();
    netlab::netns::our_namespaces()
        .into_iter()
        .filter(|n| n.starts_with(&p))
        .collect()
}

/// Polls `f` until it returns Some or the deadline passes.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
