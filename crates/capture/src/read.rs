//! `-r FILE`: reading a capture file back (pcap or pcapng, plain, gzip or
//! zstd), filtering it with a tcpdump expression, then printing or writing
//! what passes, as tcpdump does.
//!
//! libpcap itself reads the file and applies the filter, so the formats it
//! reads and the filter's meaning (wire length included) are exactly
//! tcpdump's. A compressed file is decompressed on a thread into a pipe
//! that libpcap reads as `/dev/fd/N`: nothing is unpacked to disk and no
//! `unsafe` is needed.

use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::output::{Compression, Encoding, FileOutput, FooterStats, Format};
use crate::print::{PrintOptions, Printer};
use crate::session::print_lines;
use crate::source::PacketView;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Where the packets that pass go.
#[derive(Debug, Clone)]
pub enum ReadSink {
    Count,
    Print(PrintOptions),
    File {
        path: PathBuf,
        format: Format,
        compression: Compression,
        nano: bool,
        /// Also print each packet (`--print`).
        print: Option<PrintOptions>,
    },
}

/// What a read did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Packets the filter passed (libpcap filters as it reads), printed or
    /// written; at most the count asked for.
    pub passed: u64,
}

impl std::fmt::Display for ReadReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "read: {} packets passed the filter", self.passed)
    }
}

/// How a file to read is packed, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Packing {
    Plain,
    Gzip,
    Zstd,
}

fn sniff(path: &Path) -> Result<Packing> {
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| CaptureError::Input {
        path: path.to_path_buf(),
        source: e,
    })?;
    let n = f.read(&mut magic).unwrap_or(0);
    Ok(match &magic[..n.min(4)] {
        [0x1f, 0x8b, ..] => Packing::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => Packing::Zstd,
        _ => Packing::Plain,
    })
}

/// Opens `path` with libpcap, through a decompressing pipe if it is
/// compressed. The pipe's read end (kept open while libpcap reads it) and
/// the thread feeding it come back with the handle.
type Opened = (
    pcap::Capture<pcap::Offline>,
    Option<OwnedFd>,
    Option<std::thread::JoinHandle<()>>,
);

fn open(path: &Path) -> Result<Opened> {
    let err = |m: String| CaptureError::Config(format!("-r {}: {m}", path.display()));
    let packing = sniff(path)?;
    let precision = pcap::Precision::Nano;
    if packing == Packing::Plain {
        let c = pcap::Capture::from_file_with_precision(path, precision).map_err(|e| err(e.to_string()))?;
        return Ok((c, None, None));
    }
    let (rd, wr) = nix::unistd::pipe().map_err(|e| err(format!("pipe: {e}")))?;
    let file = std::fs::File::open(path).map_err(|e| err(e.to_string()))?;
    let feeder = std::thread::spawn(move || {
        let mut out = std::fs::File::from(wr);
        // A reader that stops early (a count reached) closes the pipe: the
        // copy then ends with EPIPE, which is not an error here.
        let _ = match packing {
            Packing::Gzip => std::io::copy(&mut flate2::read::MultiGzDecoder::new(file), &mut out),
            Packing::Zstd => match zstd::stream::read::Decoder::new(file) {
                Ok(mut d) => std::io::copy(&mut d, &mut out),
                Err(e) => Err(e),
            },
            Packing::Plain => std::io::copy(&mut { file }, &mut out),
        };
        let _ = out.flush();
    });
    let dev = format!("/dev/fd/{}", rd.as_raw_fd());
    let c = pcap::Capture::from_file_with_precision(&dev, precision).map_err(|e| err(e.to_string()))?;
    Ok((c, Some(rd), Some(feeder)))
}

/// Reads `path`, keeps what `filter` passes (at most `count`), and hands it
/// to `sink`.
pub fn read_file(path: &Path, filter: Option<&str>, count: Option<u64>, sink: ReadSink) -> Result<ReadReport> {
    let (mut cap, pipe, feeder) = open(path)?;
    let link = match cap.get_datalink().0 {
        1 => LinkType::Ethernet,
        12 | 101 => LinkType::RawIp,
        276 => LinkType::LinuxSll2,
        other => {
            return Err(CaptureError::Config(format!(
                "-r {}: link type {other} is not one this tool prints or writes (Ethernet, raw IP, Linux cooked v2)",
                path.display()
            )))
        }
    };
    if let Some(expr) = filter {
        cap.filter(expr, true).map_err(|e| CaptureError::Filter {
            expr: expr.to_string(),
            message: match e {
                pcap::Error::PcapError(m) => m,
                other => other.to_string(),
            },
        })?;
    }
    let (mut printer, mut out, mut file) = match sink {
        ReadSink::Count => (None, String::new(), None),
        ReadSink::Print(o) => (Some(Printer::new(o)), String::new(), None),
        ReadSink::File {
            path,
            format,
            compression,
            nano,
            print,
        } => {
            let enc = Encoding {
                format,
                link,
                // libpcap does not say the file's snapshot length; the
                // largest one a capture here writes.
                snaplen: 262_144,
                nano,
            };
            let f = FileOutput::create(&path, enc, compression, "file")?;
            (
                print.map(Printer::new),
                String::new(),
                Some((f, enc, Vec::new(), Vec::new())),
            )
        }
    };
    let mut report = ReadReport::default();
    loop {
        if count.is_some_and(|c| report.passed >= c) {
            break;
        }
        let p = match cap.next_packet() {
            Ok(p) => p,
            Err(pcap::Error::NoMorePackets) => break,
            Err(e) => {
                return Err(CaptureError::Config(format!("-r {}: {e}", path.display())));
            }
        };
        report.passed += 1;
        let ts_ns = (p.header.ts.tv_sec as u64) * 1_000_000_000 + p.header.ts.tv_usec as u64;
        let view = PacketView {
            ts_ns,
            wire_len: p.header.len,
            data: p.data,
            vlan: None,
            cooked: None,
        };
        if let Some(pr) = printer.as_mut() {
            pr.line(&mut out, link, &view);
            if out.len() > 64 << 10 {
                print_lines(&mut out)?;
            }
        }
        if let Some((f, enc, buf, scratch)) = file.as_mut() {
            enc.record(buf, &view, scratch);
            if buf.len() > 256 << 10 {
                f.write_chunk(buf)?;
                buf.clear();
            }
        }
    }
    print_lines(&mut out)?;
    if let Some((mut f, enc, buf, _)) = file {
        f.write_chunk(&buf)?;
        let footer = enc.footer(
            oskit::clock::realtime_ns(),
            &FooterStats {
                filter_accept: report.passed,
                os_drop: 0,
                delivered: report.passed,
            },
        );
        f.finish(&footer)?;
    }
    // libpcap's read end first, then the feeder (which ends on EOF or EPIPE).
    drop(cap);
    drop(pipe);
    if let Some(h) = feeder {
        let _ = h.join();
    }
    Ok(report)
}
