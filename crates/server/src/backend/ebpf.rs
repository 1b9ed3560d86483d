//! `--backend ebpf`: replication inside the kernel. A TC program clones
//! each member's DATA to every other member (paper 000 §4.2 on a stock
//! kernel); [`crate::kfanout`] is its control plane. Set up once per
//! reflector: the program loaded and attached to the devices that carry the
//! groups' address, and a thread that resends what the program could not
//! send; each event loop's fan-out ([`EbpfFanout`]) keeps the maps in step
//! with its groups and sends what the program passes up with `sendmmsg`.

use super::{Fanout, FanoutBackend, RateCaps, ResendTarget, Started, Support};
use crate::kfanout::{self, fanout::EbpfFanout, KernelPath, SharedKernel};
use crate::liveness::Watch;
use oskit::caps::Cap;
use std::io;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// The kernel path, shared by the reflector's event loops.
pub struct Ebpf(SharedKernel);

impl Ebpf {
    fn kernel(&self) -> std::sync::MutexGuard<'_, KernelPath> {
        // A panic while holding the lock leaves maps that are still valid
        // (each update is one syscall): go on with them.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl FanoutBackend for Ebpf {
    const NAME: &'static str = "ebpf";
    const HELP: &'static str = "Replication inside the kernel: a TC program clones each member's DATA to every other \
member (needs root, Linux 6.6+, IPv4 on Ethernet devices); what it passes up goes through `sendmmsg`.";
    const CAPS: &'static [(Cap, &'static str)] = &[
        (Cap::Bpf, "loading the fan-out program and its maps"),
        (Cap::NetAdmin, "attaching the program to the devices"),
        (
            Cap::Perfmon,
            "the kernel's verifier allows the program's pointer arithmetic only with it",
        ),
    ];

    /// Loads the program (the verifier's verdict and the privileges) and
    /// unloads it.
    fn probe() -> Support {
        kfanout::probe()
    }

    fn start(bind: IpAddr, caps: RateCaps) -> Result<Arc<dyn Started>, String> {
        let k = KernelPath::start(bind, caps)?;
        let devices = k.devices().join(", ");
        match k.backlog() {
            Some(b) => {
                tracing::info!("eBPF fan-out attached to {devices} (TCX ingress); net.core.netdev_max_backlog = {b}")
            }
            None => tracing::info!(
                "eBPF fan-out attached to {devices} (TCX ingress); net.core.netdev_max_backlog is not visible from \
this namespace (it must exceed the largest group)"
            ),
        }
        Ok(Arc::new(Ebpf(Arc::new(Mutex::new(k)))))
    }
}

impl Started for Ebpf {
    fn for_loop(&self) -> Box<dyn Fanout> {
        Box::new(EbpfFanout::new(Arc::clone(&self.0)))
    }

    fn resends(&self) -> bool {
        true
    }

    fn start_resend(&self, targets: Vec<ResendTarget>, watch: &mut Watch) -> io::Result<()> {
        self.kernel().start_resend(targets, watch)
    }
}
