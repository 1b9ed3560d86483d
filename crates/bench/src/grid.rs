//! The measurement grid (paper 000 §5): datagram sizes x receiver counts x
//! implementations, and the order the runs are made in. Pure: no I/O.

use reflector_server::backend::BackendKind;
use reflector_server::receive::ReceiveKind;
use std::fmt;

/// The paper's datagram sizes, bytes of UDP payload.
pub const PAPER_SIZES: [usize; 4] = [50, 100, 500, 1000];
/// The paper's receiver counts.
pub const PAPER_RECEIVERS: [usize; 4] = [3, 30, 60, 90];
/// `--quick`: the grid's corners.
pub const QUICK_SIZES: [usize; 2] = [50, 1000];
pub const QUICK_RECEIVERS: [usize; 2] = [3, 90];
/// Fewest datagrams the sender sends in one measured phase, whatever the
/// copy target, so that no run is too short to measure.
pub const MIN_DATAGRAMS: u64 = 1_000;

/// An implementation under test: the anchor, or the reflector with one
/// backend of each of the server's registries (loopback fan-out backends
/// only: reflector-bench runs on loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Impl {
    /// The anchor: recv, then one `sendto` per fixed destination; nothing else.
    RawLoop,
    /// `reflector serve --backend B --receive R --data-tags on|off`, named
    /// `B`, `B+R` when R is not the default receive, and `-untagged` after
    /// either with tags off (what the tags cost).
    Reflector {
        backend: BackendKind,
        receive: ReceiveKind,
        tags: bool,
    },
}

const UNTAGGED: &str = "-untagged";

impl Impl {
    /// Every implementation: the anchor, then every loopback fan-out
    /// backend with every receive backend, tags on, then the same with
    /// tags off.
    pub fn all() -> Vec<Impl> {
        let mut out = vec![Impl::RawLoop];
        for tags in [true, false] {
            for receive in ReceiveKind::ALL {
                for backend in BackendKind::ALL {
                    out.push(Impl::Reflector { backend, receive, tags });
                }
            }
        }
        out
    }

    pub fn name(self) -> String {
        match self {
            Impl::RawLoop => "raw-loop".into(),
            Impl::Reflector { backend, receive, tags } => {
                let mut n = backend.to_string();
                if receive != ReceiveKind::default() {
                    n = format!("{n}+{receive}");
                }
                if !tags {
                    n.push_str(UNTAGGED);
                }
                n
            }
        }
    }

    pub fn parse(s: &str) -> Option<Impl> {
        if s == "raw-loop" {
            return Some(Impl::RawLoop);
        }
        let (base, tags) = match s.strip_suffix(UNTAGGED) {
            Some(base) => (base, false),
            None => (s, true),
        };
        let (backend, receive) = reflector_impl(base)?;
        backend.loopback().then_some(Impl::Reflector { backend, receive, tags })
    }

    /// The reflector's `--backend`, `None` for the anchor.
    pub fn backend(self) -> Option<BackendKind> {
        match self {
            Impl::RawLoop => None,
            Impl::Reflector { backend, .. } => Some(backend),
        }
    }

    /// The reflector's `--receive`.
    pub fn receive(self) -> ReceiveKind {
        match self {
            Impl::RawLoop => ReceiveKind::default(),
            Impl::Reflector { receive, .. } => receive,
        }
    }

    /// The reflector's `--data-tags` setting.
    pub fn data_tags(self) -> &'static str {
        match self {
            Impl::Reflector { tags: false, .. } => "off",
            _ => "on",
        }
    }

    /// The same implementation with DATA tags off, if it has tags.
    pub fn untagged(self) -> Option<Impl> {
        match self {
            Impl::Reflector {
                backend,
                receive,
                tags: true,
            } => Some(Impl::Reflector {
                backend,
                receive,
                tags: false,
            }),
            _ => None,
        }
    }

    /// How progress lines name it.
    pub fn describe(self) -> String {
        match self {
            Impl::RawLoop => "raw sendto loop (anchor)".into(),
            Impl::Reflector { backend, receive, tags } => {
                let mut d = format!("reflector --backend {backend}");
                if receive != ReceiveKind::default() {
                    d.push_str(&format!(" --receive {receive}"));
                }
                if !tags {
                    d.push_str(" --data-tags off");
                }
                d
            }
        }
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A reflector implementation's name as fanout-bench takes it: its
/// `--backend`, then `+` and its `--receive` unless that is the default
/// (`sendmmsg`, `sendmmsg+io-uring`), both from the server's registries.
pub fn reflector_impl(name: &str) -> Option<(BackendKind, ReceiveKind)> {
    let (b, r) = name.split_once('+').unwrap_or((name, ReceiveKind::default().name()));
    Some((b.parse().ok()?, r.parse().ok()?))
}

/// Every reflector implementation fanout-bench knows, from the registries.
pub fn reflector_impls() -> Vec<String> {
    let mut out = Vec::new();
    for r in ReceiveKind::ALL {
        for b in BackendKind::NAMED {
            out.push(if r == ReceiveKind::default() {
                b.name().to_string()
            } else {
                format!("{b}+{r}")
            });
        }
    }
    out
}

/// One point of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    /// Bytes of UDP payload per datagram (our 32-byte DATA header included, so
    /// every implementation moves exactly the same bytes).
    pub size: usize,
    pub receivers: usize,
}

/// One measurement to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub cell: Cell,
    pub imp: Impl,
    /// 0-based repetition of this (cell, implementation).
    pub rep: usize,
}

/// How long a measured phase lasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Amount {
    /// About this many copies (a fixed datagram count: reproducible work).
    Copies(u64),
    /// About this many seconds, at the rate the warm-up measured (a
    /// predictable run time whatever the machine's speed).
    Seconds(f64),
}

impl Amount {
    /// Datagrams to send to `receivers` receivers, given the copy rate the
    /// warm-up achieved.
    pub fn datagrams(self, receivers: usize, warmup_copies_per_s: f64) -> u64 {
        match self {
            Amount::Copies(c) => datagrams_for(c, receivers),
            Amount::Seconds(s) => {
                let copies = if warmup_copies_per_s.is_finite() {
                    warmup_copies_per_s * s
                } else {
                    0.0
                };
                datagrams_for(copies as u64, receivers)
            }
        }
    }
}

/// Datagrams for a run that should deliver about `copies` copies.
pub fn datagrams_for(copies: u64, receivers: usize) -> u64 {
    (copies / receivers.max(1) as u64).max(MIN_DATAGRAMS)
}

/// Every run, in measuring order: cell by cell, and inside a cell the
/// implementations alternate per repetition, so slow drift of the machine
/// (other load, thermal state) hits all of them alike instead of whichever
/// happened to run last.
pub fn plan(sizes: &[usize], receivers: &[usize], imps: &[Impl], reps: usize) -> Vec<Run> {
    let mut runs = Vec::new();
    for &size in sizes {
        for &r in receivers {
            let cell = Cell { size, receivers: r };
            for rep in 0..reps {
                for &imp in imps {
                    runs.push(Run { cell, imp, rep });
                }
            }
        }
    }
    runs
}

/// Parses a comma-separated list of positive integers in `lo..=hi`.
pub fn parse_list(s: &str, what: &str, lo: usize, hi: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v: usize = part.parse().map_err(|_| format!("{what}: '{part}' is not a number"))?;
        if !(lo..=hi).contains(&v) {
            return Err(format!("{what}: {v} is outside {lo}..={hi}"));
        }
        out.push(v);
    }
    if out.is_empty() {
        return Err(format!("{what}: empty list"));
    }
    Ok(out)
}

/// Parses `raw-loop,sendto,...`; the anchor is always measured, so it is
/// added if missing.
pub fn parse_impls(s: &str) -> Result<Vec<Impl>, String> {
    let mut out = vec![Impl::RawLoop];
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let imp = Impl::parse(part).ok_or_else(|| {
            format!(
                "unknown implementation '{part}'; choose from: {}",
                Impl::all().into_iter().map(Impl::name).collect::<Vec<_>>().join(", ")
            )
        })?;
        if !out.contains(&imp) {
            out.push(imp);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn imp(name: &str) -> Impl {
        Impl::parse(name).unwrap()
    }

    #[test]
    fn full_grid_has_every_cell_and_implementation() {
        let all = Impl::all();
        let runs = plan(&PAPER_SIZES, &PAPER_RECEIVERS, &all, 2);
        assert_eq!(runs.len(), 4 * 4 * all.len() * 2);
        for s in PAPER_SIZES {
            for r in PAPER_RECEIVERS {
                for &i in &all {
                    let n = runs
                        .iter()
                        .filter(|x| x.cell == Cell { size: s, receivers: r } && x.imp == i)
                        .count();
                    assert_eq!(n, 2);
                }
            }
        }
        // Implementations alternate inside a cell.
        let n = all.len();
        let want: Vec<(Impl, usize)> = (0..2).flat_map(|rep| all.iter().map(move |&i| (i, rep))).collect();
        assert_eq!(runs[..2 * n].iter().map(|r| (r.imp, r.rep)).collect::<Vec<_>>(), want);
        assert_eq!(want[..2], [(Impl::RawLoop, 0), (imp("sendmmsg"), 0)]);
    }

    #[test]
    fn datagram_counts() {
        assert_eq!(datagrams_for(900_000, 90), 10_000);
        assert_eq!(datagrams_for(900_000, 3), 300_000);
        assert_eq!(datagrams_for(1_000, 90), MIN_DATAGRAMS);
        assert_eq!(datagrams_for(1_000, 0), MIN_DATAGRAMS);
        assert_eq!(Amount::Copies(900_000).datagrams(90, 1.0), 10_000);
        assert_eq!(Amount::Seconds(2.0).datagrams(30, 600_000.0), 40_000);
        assert_eq!(Amount::Seconds(2.0).datagrams(30, f64::NAN), MIN_DATAGRAMS);
    }

    #[test]
    fn list_parsing() {
        assert_eq!(parse_list("50, 100", "sizes", 16, 1400).unwrap(), vec![50, 100]);
        assert!(parse_list("10", "sizes", 16, 1400).unwrap_err().contains("outside"));
        assert!(parse_list("x", "sizes", 16, 1400).unwrap_err().contains("not a number"));
        assert!(parse_list("", "sizes", 16, 1400).is_err());
        assert_eq!(parse_impls("sendto").unwrap(), vec![Impl::RawLoop, imp("sendto")]);
        assert_eq!(
            parse_impls("raw-loop,sendmmsg,sendmmsg").unwrap(),
            vec![Impl::RawLoop, imp("sendmmsg")]
        );
        // The in-kernel backend needs devices: not on reflector-bench's loopback.
        let e = parse_impls("ebpf").unwrap_err();
        assert!(e.contains("unknown") && e.contains("sendmmsg-untagged"), "{e}");
    }

    #[test]
    fn reflector_impls_come_from_the_registries() {
        for name in reflector_impls() {
            assert!(reflector_impl(&name).is_some(), "{name}");
        }
        assert_eq!(
            reflector_impl("sendmmsg+io-uring"),
            Some((BackendKind::Sendmmsg, ReceiveKind::IoUring))
        );
        assert_eq!(
            reflector_impl("sendto"),
            Some((BackendKind::Sendto, ReceiveKind::Recvmmsg))
        );
        assert_eq!(reflector_impl("sendmmsg+xdp"), None);
        // reflector-bench's rows name the same implementations, and every
        // name it gives parses back.
        for i in Impl::all() {
            assert_eq!(Impl::parse(&i.name()), Some(i), "{i}");
            if let Some(b) = i.backend() {
                let base = i.name().trim_end_matches(UNTAGGED).to_string();
                assert_eq!(reflector_impl(&base), Some((b, i.receive())), "{i}");
            }
        }
        let uring = imp("sendmmsg+io-uring-untagged");
        assert_eq!(
            (uring.backend(), uring.receive(), uring.data_tags()),
            (Some(BackendKind::Sendmmsg), ReceiveKind::IoUring, "off")
        );
        assert_eq!(
            uring.describe(),
            "reflector --backend sendmmsg --receive io-uring --data-tags off"
        );
        assert_eq!(imp("sendto").untagged(), Some(imp("sendto-untagged")));
        assert_eq!(Impl::RawLoop.untagged(), None);
    }
}
