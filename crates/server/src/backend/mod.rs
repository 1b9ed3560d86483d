//! Fan-out backends: how one datagram reaches every other member.
//!
//! One contract ([`Fanout`], in [`user`] with the user-space sending it
//! shares), backends chosen at run time (`--backend`): `sendto`, the paper's
//! user-space loop (§4.1); `sendmmsg`, the same copies with one syscall per
//! batch of members; `ebpf`, replication inside the kernel
//! ([`crate::kfanout`]). An in-kernel backend plugs in at the same seam: it
//! gets every group's socket ([`Fanout::attach`]), every membership change
//! ([`Fanout::member_added`], [`Fanout::member_removed`]), the error-queue
//! entries of its sockets, and reports its counters at every sweep
//! ([`Fanout::sync`]).
//!
//! Adding a backend costs its file in this folder, where its type
//! implements [`FanoutBackend`] (and the fan-out of one event loop,
//! [`Fanout`]), and its line in the registry list below
//! (`fanout_backends!`). The module, the [`BackendKind`] variant,
//! `--backend`'s value and help, the capabilities `serve` checks for it, the
//! default choice, the fallback, the test matrix, the demo's and the
//! benchmarks' lists all come from that line.
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

use crate::liveness::Watch;
use oskit::caps::Cap;
use std::io;
use std::net::IpAddr;
use std::sync::Arc;

/// What each fan-out backend's file states about it; the registry line
/// names the type, and [`BackendKind`] is built from these.
pub trait FanoutBackend: 'static {
    /// Its `--backend` value, and its name in logs, metrics and benches.
    const NAME: &'static str;
    /// What `--help` says about the value (clap's convention: the final
    /// period is not shown).
    const HELP: &'static str;
    /// What it needs beyond a plain socket, each with why: `reflector
    /// serve` names a missing one before it starts when this backend is
    /// asked for with `--strict-backend` (without it, a backend that cannot
    /// run falls back to user space).
    const CAPS: &'static [(Cap, &'static str)] = &[];

    /// Whether this kernel and these privileges can run it, asked without
    /// sending anything.
    fn probe() -> Support;

    /// Sets it up for a reflector bound to `bind`, once for all its event
    /// loops, in the caller's network namespace; `caps` are each member's
    /// DATA caps, for a backend that forwards DATA the membership core does
    /// not see. The error says why it cannot run.
    fn start(bind: IpAddr, caps: RateCaps) -> Result<Arc<dyn Started>, String>;
}

/// A backend set up for one reflector, shared by its event loops.
pub trait Started: Send + Sync {
    /// One event loop's fan-out, built on the loop's own thread.
    fn for_loop(&self) -> Box<dyn Fanout>;

    /// Whether it sends, from a thread of its own, what it could not send
    /// itself (the kernel path's refused copies): then
    /// [`Backend::start_resend`] wants each group's socket.
    fn resends(&self) -> bool {
        false
    }

    /// Starts that thread, watched by `watch`.
    fn start_resend(&self, _targets: Vec<ResendTarget>, _watch: &mut Watch) -> io::Result<()> {
        Ok(())
    }
}

/// The registry of fan-out backends: one line per backend as
/// `(Variant, name, module::Type, where)`: the [`BackendKind`] variant, the
/// name of its tests in the matrix of `backend_matrix!` (feature
/// `testing`), its file (`module.rs` in this folder, declared from here)
/// with the type that implements [`FanoutBackend`], and where it runs:
/// `loopback` (anywhere, loopback included, without privileges: the
/// default picks the first of these the kernel supports, the loopback test
/// matrix runs them, a `device` backend that cannot run falls back to
/// them) or `device` (on network devices, with privileges: tested in the
/// lab by its own tests, and in the demo's lab run).
///
/// `fanout_backends!((callback) args...)` expands to
/// `callback! { args... [list] }`, as `receive_backends!` does. Exported
/// only for the test matrix.
///
/// `cargo fmt` does not reach files whose `mod` a macro declares: `make
/// lint` checks this folder's files by name, and `rustfmt --edition 2021
/// crates/server/src/backend/*.rs` formats them.
#[doc(hidden)]
#[macro_export]
macro_rules! fanout_backends {
    (($($callback:tt)*) $($args:tt)*) => {
        $($callback)*! { $($args)* [
            (Ebpf, ebpf, ebpf::Ebpf, device),
            (Sendmmsg, sendmmsg, sendmmsg::Sendmmsg, loopback),
            (Sendto, sendto, sendto::Sendto, loopback),
        ] }
    };
}

/// Everything the registry list determines here: the modules, the enum and
/// its lookups.
macro_rules! define_backend_kinds {
    (@loopback loopback) => { true };
    (@loopback device) => { false };
    ([$(($variant:ident, $test:ident, $module:ident :: $ty:ident, $where:ident)),+ $(,)?]) => {
        $(pub mod $module;)+

        /// The fan-out backends, from the registry list: `--backend`'s
        /// values.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum BackendKind {
            $(
                #[doc = concat!("[`", stringify!($module), "::", stringify!($ty), "`]")]
                $variant,
            )+
        }

        /// Every backend in the registry's order.
        const REGISTRY: [BackendKind; [$(BackendKind::$variant),+].len()] = [$(BackendKind::$variant),+];
        /// Which of them run on loopback (the line's `where`).
        const LOOPBACK: [bool; REGISTRY.len()] = [$(define_backend_kinds!(@loopback $where)),+];

        impl BackendKind {
            pub fn name(self) -> &'static str {
                match self {
                    $(BackendKind::$variant => <$module::$ty as FanoutBackend>::NAME,)+
                }
            }

            /// What `--help` says about it.
            pub fn help(self) -> &'static str {
                match self {
                    $(BackendKind::$variant => <$module::$ty as FanoutBackend>::HELP,)+
                }
            }

            /// What it needs beyond a plain socket, each with why
            /// ([`FanoutBackend::CAPS`]).
            pub fn caps(self) -> &'static [(Cap, &'static str)] {
                match self {
                    $(BackendKind::$variant => <$module::$ty as FanoutBackend>::CAPS,)+
                }
            }

            /// Asks the kernel, without sending anything. For `ebpf` this
            /// loads the program (the verifier's verdict and the privileges)
            /// and unloads it.
            pub fn probe(self) -> Support {
                match self {
                    $(BackendKind::$variant => <$module::$ty as FanoutBackend>::probe(),)+
                }
            }

            fn start(self, bind: IpAddr, caps: RateCaps) -> Result<Arc<dyn Started>, String> {
                match self {
                    $(BackendKind::$variant => <$module::$ty as FanoutBackend>::start(bind, caps),)+
                }
            }
        }
    };
}

fanout_backends!((define_backend_kinds));

/// How many backends run on loopback.
const LOOPBACK_COUNT: usize = {
    let (mut n, mut i) = (0, 0);
    while i < LOOPBACK.len() {
        if LOOPBACK[i] {
            n += 1;
        }
        i += 1;
    }
    n
};

impl BackendKind {
    /// The backends that run on loopback without privileges, in the
    /// registry's order (best first): what the default picks from, what the
    /// loopback test matrix and the demo on loopback run.
    pub const ALL: [BackendKind; LOOPBACK_COUNT] = {
        let mut out = [REGISTRY[0]; LOOPBACK_COUNT];
        let (mut i, mut k) = (0, 0);
        while i < REGISTRY.len() {
            if LOOPBACK[i] {
                out[k] = REGISTRY[i];
                k += 1;
            }
            i += 1;
        }
        out
    };
    /// Every backend, in the registry's order: for names, and what the
    /// demo runs in its lab.
    pub const NAMED: [BackendKind; REGISTRY.len()] = REGISTRY;

    /// Whether it runs on loopback without privileges (the registry line's
    /// `where`); the others need network devices.
    pub fn loopback(self) -> bool {
        LOOPBACK[self as usize]
    }

    /// The best backend that runs on loopback the probe allows.
    pub fn best() -> BackendKind {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.probe() == Support::Supported)
            .unwrap_or(BackendKind::ALL[BackendKind::ALL.len() - 1])
    }
}

/// By hand rather than derived, so that the values and their help come
/// from the registry list.
impl clap::ValueEnum for BackendKind {
    fn value_variants<'a>() -> &'a [BackendKind] {
        &BackendKind::NAMED
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        // As clap's derive shows a one-line doc comment: without its final period.
        let help = self.help().strip_suffix('.').unwrap_or(self.help());
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}

/// The backend a server runs, set up once before its event loops and then
/// asked for one fan-out per loop: whatever a kind needs beyond a fan-out
/// object (the eBPF program loaded and attached once for all loops, its
/// resend thread) is done by its [`FanoutBackend::start`], so the server
/// only names a kind. Cloned into each loop's thread, which builds its
/// fan-out there ([`Backend::for_loop`]).
#[derive(Clone)]
pub struct Backend {
    kind: BackendKind,
    started: Arc<dyn Started>,
}

impl Backend {
    /// Sets up `kind` for a reflector bound to `bind` (see
    /// [`FanoutBackend::start`]). When a backend that needs devices cannot
    /// run and `fallback` is set, the best loopback backend is used instead
    /// (with a warning naming why); otherwise the error names why.
    pub fn start(kind: BackendKind, bind: IpAddr, caps: RateCaps, fallback: bool) -> Result<Backend, String> {
        match kind.start(bind, caps) {
            Ok(started) => Ok(Backend { kind, started }),
            Err(why) if fallback && !kind.loopback() => {
                let best = BackendKind::best();
                tracing::warn!("backend {kind} cannot run here: {why}; using {best} instead");
                let started = best.start(bind, caps).map_err(|e| format!("backend {best}: {e}"))?;
                Ok(Backend { kind: best, started })
            }
            Err(why) => Err(format!("backend {kind}: {why}")),
        }
    }

    /// The backend running (after any fallback).
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// See [`Started::resends`].
    pub fn resends(&self) -> bool {
        self.started.resends()
    }

    /// Starts the resend thread of a backend that [`resends`](Backend::resends),
    /// watched by `watch`; nothing for the others.
    pub fn start_resend(&self, targets: Vec<ResendTarget>, watch: &mut Watch) -> io::Result<()> {
        self.started.start_resend(targets, watch)
    }

    /// One event loop's fan-out.
    pub fn for_loop(&self) -> Box<dyn Fanout> {
        self.started.for_loop()
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
        for b in BackendKind::NAMED {
            assert_eq!(b.name().parse::<BackendKind>(), Ok(b));
        }
        // What the registry's `where` makes of the three.
        assert_eq!(BackendKind::ALL, [BackendKind::Sendmmsg, BackendKind::Sendto]);
        assert_eq!(
            BackendKind::NAMED,
            [BackendKind::Ebpf, BackendKind::Sendmmsg, BackendKind::Sendto]
        );
        assert!(!BackendKind::Ebpf.loopback());
        assert!(BackendKind::ALL.iter().all(|b| b.loopback() && b.caps().is_empty()));
        let ebpf_caps: Vec<Cap> = BackendKind::Ebpf.caps().iter().map(|c| c.0).collect();
        assert_eq!(ebpf_caps, [Cap::Bpf, Cap::NetAdmin, Cap::Perfmon]);
        // Linux has had sendmmsg since 3.0.
        assert_eq!(BackendKind::Sendmmsg.probe(), Support::Supported);
        assert_eq!(BackendKind::best(), BackendKind::Sendmmsg);
    }

    #[test]
    fn loopback_backends_start_and_build_their_fanout() {
        let any: IpAddr = [127, 0, 0, 1].into();
        for (k, b) in BackendKind::NAMED.into_iter().enumerate() {
            assert!(
                BackendKind::NAMED[..k].iter().all(|o| o.name() != b.name()),
                "{b} twice"
            );
            assert!(!b.help().is_empty(), "{b}");
            let value = clap::ValueEnum::to_possible_value(&b).unwrap();
            assert_eq!(value.get_name(), b.name());
        }
        for b in BackendKind::ALL {
            let backend = Backend::start(b, any, RateCaps::default(), false).unwrap();
            assert_eq!(backend.kind(), b);
            assert!(!backend.resends());
            assert_eq!(backend.for_loop().name(), b.name());
        }
    }

    #[test]
    fn a_device_backend_that_cannot_run_falls_back_only_when_asked() {
        // The kernel path handles IPv4 only: on an IPv6 address it cannot
        // run anywhere, root or not.
        let v6: IpAddr = "::1".parse().unwrap();
        let e = Backend::start(BackendKind::Ebpf, v6, RateCaps::default(), false)
            .err()
            .unwrap();
        assert!(e.starts_with("backend ebpf: ") && e.contains("IPv4"), "{e}");
        let b = Backend::start(BackendKind::Ebpf, v6, RateCaps::default(), true).unwrap();
        assert_eq!(b.kind(), BackendKind::best());
        assert_eq!(b.for_loop().name(), BackendKind::best().name());
    }
}
