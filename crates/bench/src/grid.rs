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

/// An implementation under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Impl {
    /// The anchor: recv, then one `sendto` per fixed destination; nothing else.
    RawLoop,
    /// `reflector serve --backend sendto`.
    Sendto,
    /// `reflector serve --backend sendmmsg` (DATA tags on, the default).
    Sendmmsg,
    /// `reflector serve --backend sendmmsg --data-tags off`: what the tags cost.
    SendmmsgUntagged,
    /// `reflector serve --backend sendmmsg --receive io-uring`: multishot
    /// receives against `recvmmsg`.
    SendmmsgUring,
}

impl Impl {
    pub const ALL: [Impl; 5] = [
        Impl::RawLoop,
        Impl::Sendto,
        Impl::Sendmmsg,
        Impl::SendmmsgUntagged,
        Impl::SendmmsgUring,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Impl::RawLoop => "raw-loop",
            Impl::Sendto => "sendto",
            Impl::Sendmmsg => "sendmmsg",
            Impl::SendmmsgUntagged => "sendmmsg-untagged",
            Impl::SendmmsgUring => "sendmmsg+io-uring",
        }
    }

    pub fn parse(s: &str) -> Option<Impl> {
        Impl::ALL.into_iter().find(|i| i.name() == s)
    }

    /// The `--backend` name of the reflector, `None` for the anchor.
    pub fn backend(self) -> Option<&'static str> {
        match self {
            Impl::RawLoop => None,
            Impl::Sendto => Some("sendto"),
            Impl::Sendmmsg | Impl::SendmmsgUntagged | Impl::SendmmsgUring => Some("sendmmsg"),
        }
    }

    /// The reflector's `--receive`, from the receive registry.
    pub fn receive(self) -> ReceiveKind {
        match self {
            Impl::SendmmsgUring => ReceiveKind::IoUring,
            _ => ReceiveKind::default(),
        }
    }

    /// The reflector's `--data-tags` setting.
    pub fn data_tags(self) -> &'static str {
        match self {
            Impl::SendmmsgUntagged => "off",
            _ => "on",
        }
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
                Impl::ALL.map(Impl::name).join(", ")
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

    #[test]
    fn full_grid_has_every_cell_and_implementation() {
        let runs = plan(&PAPER_SIZES, &PAPER_RECEIVERS, &Impl::ALL, 2);
        assert_eq!(runs.len(), 4 * 4 * Impl::ALL.len() * 2);
        for s in PAPER_SIZES {
            for r in PAPER_RECEIVERS {
                for i in Impl::ALL {
                    let n = runs
                        .iter()
                        .filter(|x| x.cell == Cell { size: s, receivers: r } && x.imp == i)
                        .count();
                    assert_eq!(n, 2);
                }
            }
        }
        // Implementations alternate inside a cell.
        let n = Impl::ALL.len();
        let want: Vec<(Impl, usize)> = (0..2).flat_map(|rep| Impl::ALL.map(|i| (i, rep))).collect();
        assert_eq!(runs[..2 * n].iter().map(|r| (r.imp, r.rep)).collect::<Vec<_>>(), want);
        assert_eq!(want[..2], [(Impl::RawLoop, 0), (Impl::Sendto, 0)]);
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
        assert_eq!(parse_impls("sendto").unwrap(), vec![Impl::RawLoop, Impl::Sendto]);
        assert_eq!(
            parse_impls("raw-loop,sendmmsg,sendmmsg").unwrap(),
            vec![Impl::RawLoop, Impl::Sendmmsg]
        );
        assert!(parse_impls("ebpf").unwrap_err().contains("unknown"));
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
        // reflector-bench's rows name the same implementations.
        for imp in Impl::ALL {
            if let Some(b) = imp.backend() {
                let name = match imp.receive() {
                    r if r == ReceiveKind::default() => b.to_string(),
                    r => format!("{b}+{r}"),
                };
                assert!(reflector_impl(&name).is_some(), "{imp}");
            }
        }
        assert_eq!(Impl::SendmmsgUring.name(), "sendmmsg+io-uring");
    }
}
