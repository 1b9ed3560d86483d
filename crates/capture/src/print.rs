//! Printed output, as tcpdump prints it: one summary line per packet with
//! the timestamp in the chosen form (`-t` … `-ttttt`), the packet number
//! (`-#`), the link-level header (`-e`), and hex or ASCII dumps (`-x`, `-xx`,
//! `-X`, `-XX`, `-A`). Pure: bytes and times in, text out.

use crate::decode;
use crate::filter::LinkType;
use crate::source::PacketView;
use std::fmt::Write as _;

/// How timestamps are printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TsFormat {
    /// `HH:MM:SS.frac` (UTC).
    #[default]
    Time,
    /// `-t`: none.
    None,
    /// `-tt`: seconds since the epoch.
    Unix,
    /// `-ttt`: time since the previous packet.
    Delta,
    /// `-tttt`: date and time.
    DateTime,
    /// `-ttttt`: time since the first packet.
    SinceFirst,
}

impl TsFormat {
    /// From the number of `-t` given.
    pub fn from_count(n: u8) -> TsFormat {
        match n {
            0 => TsFormat::Time,
            1 => TsFormat::None,
            2 => TsFormat::Unix,
            3 => TsFormat::Delta,
            4 => TsFormat::DateTime,
            _ => TsFormat::SinceFirst,
        }
    }
}

/// Which dump follows each summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Dump {
    #[default]
    None,
    /// `-x` (`link`: `-xx`, from the link-level header on).
    Hex { link: bool },
    /// `-X` (`-XX`): hex and ASCII.
    HexAscii { link: bool },
    /// `-A`: ASCII.
    Ascii,
}

impl Dump {
    /// From the counts of `-x` and `-X` and whether `-A` was given.
    pub fn from_flags(x: u8, big_x: u8, ascii: bool) -> Dump {
        if big_x > 0 {
            Dump::HexAscii { link: big_x > 1 }
        } else if x > 0 {
            Dump::Hex { link: x > 1 }
        } else if ascii {
            Dump::Ascii
        } else {
            Dump::None
        }
    }
}

/// What the printed lines show.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrintOptions {
    pub ts: TsFormat,
    /// Nanosecond fractions (`--time-stamp-precision=nano`).
    pub nano: bool,
    /// `-#`: the packet's number first.
    pub number: bool,
    /// `-e`: the link-level header (MAC addresses, EtherType, length).
    pub link_header: bool,
    pub dump: Dump,
}

/// Prints packets, keeping what relative timestamps and numbers need.
#[derive(Debug, Clone, Default)]
pub struct Printer {
    pub opts: PrintOptions,
    count: u64,
    first_ns: Option<u64>,
    prev_ns: Option<u64>,
}

impl Printer {
    pub fn new(opts: PrintOptions) -> Printer {
        Printer {
            opts,
            ..Printer::default()
        }
    }

    /// Appends `p`'s line (and dump) to `out`.
    pub fn line(&mut self, out: &mut String, link: LinkType, p: &PacketView<'_>) {
        self.count += 1;
        if self.opts.number {
            let _ = write!(out, "{:5}  ", self.count);
        }
        let first = *self.first_ns.get_or_insert(p.ts_ns);
        let prev = self.prev_ns.replace(p.ts_ns).unwrap_or(p.ts_ns);
        self.timestamp(out, p.ts_ns, prev, first);
        if self.opts.link_header && link == LinkType::Ethernet {
            link_header(out, p);
        }
        // A tag the kernel moved into the metadata is printed as if in the frame.
        if let Some((_, tci)) = p.vlan {
            let _ = write!(out, "vlan {}, ", tci & 0x0fff);
        }
        match p.cooked {
            Some(h) => decode::cooked(out, &h, p.data, p.wire_len),
            None => decode::summarize(out, link, p.data, p.wire_len),
        }
        out.push('\n');
        // The link-level header's length in `data` (a live `-i any`
        // packet's cooked header is apart from it).
        let skip = match link {
            _ if p.cooked.is_some() => 0,
            LinkType::Ethernet => 14,
            LinkType::RawIp => 0,
            LinkType::LinuxSll2 => 20,
        };
        match self.opts.dump {
            Dump::None => {}
            Dump::Hex { link } => hex_dump(
                out,
                if link {
                    p.data
                } else {
                    p.data.get(skip..).unwrap_or(&[])
                },
                false,
            ),
            Dump::HexAscii { link } => hex_dump(
                out,
                if link {
                    p.data
                } else {
                    p.data.get(skip..).unwrap_or(&[])
                },
                true,
            ),
            Dump::Ascii => ascii_dump(out, p.data.get(skip..).unwrap_or(&[])),
        }
    }

    fn timestamp(&self, out: &mut String, ts: u64, prev: u64, first: u64) {
        let frac = |out: &mut String, ns: u64| {
            if self.opts.nano {
                let _ = write!(out, ".{:09}", ns % 1_000_000_000);
            } else {
                let _ = write!(out, ".{:06}", (ns % 1_000_000_000) / 1000);
            }
        };
        let clock = |out: &mut String, ns: u64| {
            let secs = ns / 1_000_000_000;
            let day = secs % 86_400;
            let _ = write!(out, "{:02}:{:02}:{:02}", day / 3600, (day / 60) % 60, day % 60);
            frac(out, ns);
        };
        match self.opts.ts {
            TsFormat::None => return,
            TsFormat::Time => clock(out, ts),
            TsFormat::Unix => {
                let _ = write!(out, "{}", ts / 1_000_000_000);
                frac(out, ts);
            }
            TsFormat::Delta => clock(out, ts.saturating_sub(prev)),
            TsFormat::SinceFirst => clock(out, ts.saturating_sub(first)),
            TsFormat::DateTime => {
                let (y, m, d) = civil_from_days((ts / 1_000_000_000 / 86_400) as i64);
                let _ = write!(out, "{y:04}-{m:02}-{d:02} ");
                clock(out, ts);
            }
        }
        out.push(' ');
    }
}

/// `-e`: source and destination MAC, EtherType, frame length.
fn link_header(out: &mut String, p: &PacketView<'_>) {
    let d = p.data;
    if d.len() < 14 {
        return;
    }
    let mac = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":");
    let ethertype = u16::from_be_bytes([d[12], d[13]]);
    let name = match ethertype {
        0x0800 => "IPv4",
        0x86dd => "IPv6",
        0x0806 => "ARP",
        0x8100 => "802.1Q",
        _ => "unknown",
    };
    let _ = write!(
        out,
        "{} > {}, ethertype {name} (0x{ethertype:04x}), length {}: ",
        mac(&d[6..12]),
        mac(&d[0..6]),
        p.wire_len
    );
}

/// tcpdump's hex layout: 16 bytes a line in 2-byte groups, offset first,
/// and with `ascii` the printable bytes beside.
fn hex_dump(out: &mut String, data: &[u8], ascii: bool) {
    for (i, chunk) in data.chunks(16).enumerate() {
        let _ = write!(out, "\t0x{:04x}:  ", i * 16);
        let mut hex = String::with_capacity(40);
        for pair in chunk.chunks(2) {
            for b in pair {
                let _ = write!(hex, "{b:02x}");
            }
            hex.push(' ');
        }
        if ascii {
            let _ = write!(out, "{hex:<40} ");
            out.extend(chunk.iter().map(|&b| printable(b)));
        } else {
            out.push_str(hex.trim_end());
        }
        out.push('\n');
    }
}

fn ascii_dump(out: &mut String, data: &[u8]) {
    out.extend(data.iter().map(|&b| if b == b'\n' { '\n' } else { printable(b) }));
    out.push('\n');
}

fn printable(b: u8) -> char {
    if (0x20..0x7f).contains(&b) {
        b as char
    } else {
        '.'
    }
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (the
/// well-known civil-from-days algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame() -> Vec<u8> {
        let spec = crate::gen::FrameSpec {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src: "10.0.0.1:4000".parse().unwrap(),
            dst: "10.0.0.2:5000".parse().unwrap(),
            frame_len: 60,
            vlan: None,
        };
        crate::gen::build_udp_frame(&spec, 7)
    }

    fn print(opts: PrintOptions, ts: &[u64]) -> String {
        let f = frame();
        let mut p = Printer::new(opts);
        let mut out = String::new();
        for &t in ts {
            p.line(
                &mut out,
                LinkType::Ethernet,
                &PacketView {
                    ts_ns: t,
                    wire_len: f.len() as u32,
                    data: &f,
                    vlan: None,
                    cooked: None,
                },
            );
        }
        out
    }

    const T: u64 = 1_700_000_000_123_456_789; // 2023-11-14 22:13:20.123456789 UTC

    #[test]
    fn timestamps_in_each_of_tcpdumps_forms() {
        let first = |o: PrintOptions| print(o, &[T, T + 1_500_000]).lines().next().unwrap().to_string();
        let second = |o: PrintOptions| print(o, &[T, T + 1_500_000]).lines().nth(1).unwrap().to_string();
        let with = |ts| PrintOptions {
            ts,
            ..PrintOptions::default()
        };
        assert!(first(with(TsFormat::Time)).starts_with("22:13:20.123456 IP "));
        assert!(first(with(TsFormat::None)).starts_with("IP 10.0.0.1.4000 > 10.0.0.2.5000"));
        assert!(first(with(TsFormat::Unix)).starts_with("1700000000.123456 IP "));
        assert!(second(with(TsFormat::Delta)).starts_with("00:00:00.001500 IP "));
        assert!(first(with(TsFormat::DateTime)).starts_with("2023-11-14 22:13:20.123456 IP "));
        assert!(second(with(TsFormat::SinceFirst)).starts_with("00:00:00.001500 IP "));
        let nano = PrintOptions {
            nano: true,
            ..PrintOptions::default()
        };
        assert!(first(nano).starts_with("22:13:20.123456789 IP "));
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_675), (2023, 11, 14));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn numbers_link_headers_and_dumps() {
        let o = PrintOptions {
            number: true,
            link_header: true,
            ..PrintOptions::default()
        };
        let l = print(o, &[T]);
        assert!(
            l.starts_with(
                "    1  22:13:20.123456 02:00:00:00:00:01 > 02:00:00:00:00:02, ethertype IPv4 (0x0800), length 60: IP "
            ),
            "{l}"
        );
        let hex = print(
            PrintOptions {
                dump: Dump::Hex { link: false },
                ..PrintOptions::default()
            },
            &[T],
        );
        let dump: Vec<&str> = hex.lines().skip(1).collect();
        assert!(dump[0].starts_with("\t0x0000:  4500 002e"), "{hex}");
        assert_eq!(dump.len(), 3, "46 bytes of IP packet: three lines");
        let hex_link = print(
            PrintOptions {
                dump: Dump::Hex { link: true },
                ..PrintOptions::default()
            },
            &[T],
        );
        assert!(
            hex_link
                .lines()
                .nth(1)
                .unwrap()
                .starts_with("\t0x0000:  0200 0000 0002 0200"),
            "{hex_link}"
        );
        let xa = print(
            PrintOptions {
                dump: Dump::HexAscii { link: false },
                ..PrintOptions::default()
            },
            &[T],
        );
        let line = xa.lines().nth(1).unwrap();
        assert!(line.starts_with("\t0x0000:  4500 002e") && line.len() > 60, "{line}");
        let a = print(
            PrintOptions {
                dump: Dump::Ascii,
                ..PrintOptions::default()
            },
            &[T],
        );
        assert!(a.lines().nth(1).unwrap().starts_with("E..."), "{a}");
        assert_eq!(Dump::from_flags(2, 0, false), Dump::Hex { link: true });
        assert_eq!(Dump::from_flags(1, 1, true), Dump::HexAscii { link: false });
        assert_eq!(TsFormat::from_count(3), TsFormat::Delta);
    }
}
