//! Fan-out backends: how one datagram reaches every other member.
//!
//! One contract ([`Fanout`]), several backends chosen at run time
//! (`--backend`): `sendto`, the paper's user-space loop (§4.1), and
//! `sendmmsg`, the same copies with one syscall per batch of members. An
//! in-kernel backend plugs in at the same seam: it gets every group's socket
//! ([`Fanout::attach`]), every membership change ([`Fanout::member_added`],
//! [`Fanout::member_removed`]), the error-queue entries of its sockets, and
//! reports its counters at every sweep ([`Fanout::sync_counters`]).
//!
//! This module is the registry: [`BackendKind`] names every backend and
//! probes it, [`Backend`] sets one up for a server (whatever it needs
//! beyond a fan-out object, such as the eBPF program) and builds each event
//! loop's fan-out, so the server names a kind and nothing else; the contract and the user-space backends are in
//! [`user`], the in-kernel one in [`crate::kfanout`] (which depends on
//! `user` only, so the registry is the one place that knows them all).
//!
//! Contract: a fan-out either completes ([`Progress::Done`]: every other
//! member has the datagram, or was given up for a counted reason) or is
//! [`Progress::Pending`]: the socket buffer or the device queue is full, and
//! the event loop resumes it ([`Fanout::resume`]) when the socket is
//! writable or the back-off timer fires, serving its other groups meanwhile.
//! A full queue is never a reason to drop: with `IP_RECVERR` the kernel
//! reports it as ENOBUFS, and we wait and resend (paper §4.1). A pending
//! fan-out keeps a snapshot of the destinations it still owes and the
//! datagram's receive buffer ([`crate::receive::RecvBuf`], owned: no copy),
//! so members joining or leaving before it resumes change nothing for it.

pub mod user;

pub use user::*;

use crate::kfanout::fanout::EbpfFanout;
use crate::kfanout::{KernelPath, RateCaps, ResendTarget};
use crate::liveness::Watch;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use user::{Mode, UserFanout};

/// The fan-out backends.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// One `sendmmsg` per batch of members.
    Sendmmsg,
    /// One `sendto` per member (the paper's user-space loop).
    Sendto,
    /// Replication inside the kernel: a TC program clones each member's
    /// DATA to every other member (paper 000 §4.2 on a stock kernel); what
    /// it leaves to user space goes through `sendmmsg`.
    Ebpf,
}

impl BackendKind {
    /// The user-space backends, best first: what the default picks from
    /// and what the loopback test matrix runs.
    pub const ALL: [BackendKind; 2] = [BackendKind::Sendmmsg, BackendKind::Sendto];
    /// Every backend, for names.
    pub const NAMED: [BackendKind; 3] = [BackendKind::Ebpf, BackendKind::Sendmmsg, BackendKind::Sendto];

    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sendmmsg => "sendmmsg",
            BackendKind::Sendto => "sendto",
            BackendKind::Ebpf => "ebpf",
        }
    }

    /// Asks the kernel, without sending anything. For `ebpf` this loads the
    /// program (the verifier's verdict and the privileges) and unloads it.
    pub fn probe(self) -> Support {
        match self {
            BackendKind::Sendto => Support::Supported,
            BackendKind::Sendmmsg => match sendpath::probe_sendmmsg() {
                Ok(()) => Support::Supported,
                Err(e) => Support::Unsupported(format!("sendmmsg is not available: {e}")),
            },
            BackendKind::Ebpf => crate::kfanout::probe(),
        }
    }

    /// The best user-space backend the probe allows.
    pub fn best() -> BackendKind {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.probe() == Support::Supported)
            .unwrap_or(BackendKind::Sendto)
    }

    /// A user-space backend; `ebpf` is built by [`crate::kfanout`] around
    /// the program the server loaded, and asks for `sendmmsg` here for what
    /// it passes up.
    pub fn build(self) -> Box<dyn Fanout> {
        Box::new(UserFanout::new(match self {
            BackendKind::Sendto => Mode::Sendto,
            BackendKind::Sendmmsg | BackendKind::Ebpf => Mode::Sendmmsg,
        }))
    }
}

/// The backend a server runs, set up once before its event loops and then
/// asked for one fan-out per loop: whatever a kind needs beyond a fan-out
/// object (the eBPF program loaded and attached once for all loops, its
/// resend thread) is done here, so the server only names a kind. Cloned
/// into each loop's thread, which builds its fan-out there
/// ([`Backend::for_loop`]).
#[derive(Clone)]
pub struct Backend {
    kind: BackendKind,
    kernel: Option<Arc<Mutex<KernelPath>>>,
}

impl Backend {
    /// Sets up `kind` for a reflector bound to `bind`. For `ebpf`, in the
    /// caller's network namespace: the program is attached to the devices
    /// that carry `bind`, with `caps` per member. When it cannot run and
    /// `fallback` is set, the best user-space backend is used instead (with
    /// a warning naming why); otherwise the error names why.
    pub fn start(kind: BackendKind, bind: IpAddr, caps: RateCaps, fallback: bool) -> Result<Backend, String> {
        if kind != BackendKind::Ebpf {
            return match kind.probe() {
                Support::Supported => Ok(Backend { kind, kernel: None }),
                Support::Unsupported(why) => Err(format!("backend {kind}: {why}")),
            };
        }
        match KernelPath::start(bind, caps) {
            Ok(k) => {
                let devices = k.devices().join(", ");
                match k.backlog() {
                    Some(b) => tracing::info!(
                        "eBPF fan-out attached to {devices} (TCX ingress); net.core.netdev_max_backlog = {b}"
                    ),
                    None => tracing::info!(
                        "eBPF fan-out attached to {devices} (TCX ingress); net.core.netdev_max_backlog is not visible from this namespace (it must exceed the largest group)"
                    ),
                }
                Ok(Backend {
                    kind,
                    kernel: Some(Arc::new(Mutex::new(k))),
                })
            }
            Err(why) if fallback => {
                let best = BackendKind::best();
                tracing::warn!("backend ebpf cannot run here: {why}; using {best} instead");
                Ok(Backend {
                    kind: best,
                    kernel: None,
                })
            }
            Err(why) => Err(format!("backend ebpf: {why}")),
        }
    }

    /// The backend running (after any fallback).
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// Whether this backend resends what it could not send itself through
    /// each group's socket (the kernel path does): then
    /// [`Backend::start_resend`] wants those sockets.
    pub fn resends(&self) -> bool {
        self.kernel.is_some()
    }

    /// Starts the resend thread of a backend that [`resends`](Backend::resends),
    /// watched by `watch`; nothing for the others.
    pub fn start_resend(&self, targets: Vec<ResendTarget>, watch: &mut Watch) -> std::io::Result<()> {
        match &self.kernel {
            Some(k) => k.lock().unwrap_or_else(|p| p.into_inner()).start_resend(targets, watch),
            None => Ok(()),
        }
    }

    /// One event loop's fan-out.
    pub fn for_loop(&self) -> Box<dyn Fanout> {
        match &self.kernel {
            Some(k) => Box::new(EbpfFanout::new(Arc::clone(k))),
            None => self.kind.build(),
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    fn from_str(s: &str) -> Result<BackendKind, String> {
        BackendKind::NAMED.into_iter().find(|b| b.name() == s).ok_or_else(|| {
            let names: Vec<&str> = BackendKind::NAMED.iter().map(|b| b.name()).collect();
            format!("unknown backend '{s}'; choose one of: {}", names.join(", "))
        })
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_by_name_and_probe() {
        let e = "dpdk".parse::<BackendKind>().unwrap_err();
        assert!(
            e.contains("sendmmsg") && e.contains("sendto") && e.contains("ebpf"),
            "{e}"
        );
        for b in BackendKind::ALL {
            assert_eq!(b.name().parse::<BackendKind>(), Ok(b));
            assert_eq!(b.build().name(), b.name());
        }
        assert_eq!("ebpf".parse::<BackendKind>(), Ok(BackendKind::Ebpf));
        // Linux has had sendmmsg since 3.0.
        assert_eq!(BackendKind::Sendmmsg.probe(), Support::Supported);
        assert_eq!(BackendKind::best(), BackendKind::Sendmmsg);
    }
}
