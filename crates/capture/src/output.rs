//! Output files: pcap and pcapng record encoding (pure), optional
//! compression, and a file that stays readable while it is written.
//!
//! The named file is written from the start and made readable up to a sync
//! point after every batch (uncompressed), at least once a second (gzip
//! members and zstd frames end there) and, packet-buffered, after every
//! packet: a crash or `kill -9` leaves a file that reads up to its last sync
//! point. Special files (`/dev/null`, FIFOs) and `-` (stdout) work the same.

use std::borrow::Cow;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use byteorder_slice::LittleEndian;
use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::blocks::interface_statistics::{InterfaceStatisticsBlock, InterfaceStatisticsOption};
use pcap_file::pcapng::blocks::section_header::{SectionHeaderBlock, SectionHeaderOption};
use pcap_file::pcapng::Block;
use pcap_file::{DataLink, Endianness, TsResolution};

use crate::error::{CaptureError, Result};
use crate::filter::LinkType;
use crate::source::PacketView;

/// File format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Pcap,
    PcapNg,
}

/// Compression of the written stream (the paper's packzip load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    /// gzip container, deflate at level 0..=9.
    Zlib(u32),
    /// zstd at level 1..=22 (0 means zstd's default).
    Zstd(i32),
}

impl FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (alg, level) = s.split_once(':').unwrap_or((s, ""));
        let bad = || format!("bad compression '{s}': use zlib:LEVEL (0-9) or zstd:LEVEL (1-22)");
        match alg {
            "none" if level.is_empty() => Ok(Compression::None),
            "zlib" | "gzip" => {
                let l: u32 = if level.is_empty() {
                    6
                } else {
                    level.parse().map_err(|_| bad())?
                };
                if l > 9 {
                    return Err(bad());
                }
                Ok(Compression::Zlib(l))
            }
            "zstd" => {
                let l: i32 = if level.is_empty() {
                    3
                } else {
                    level.parse().map_err(|_| bad())?
                };
                if !(0..=22).contains(&l) {
                    return Err(bad());
                }
                Ok(Compression::Zstd(l))
            }
            _ => Err(bad()),
        }
    }
}

/// How records are encoded: format, link type, snaplen, timestamp precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub format: Format,
    pub link: LinkType,
    pub snaplen: u32,
    pub nano: bool,
}

impl Encoding {
    fn datalink(&self) -> DataLink {
        DataLink::from(self.link.pcap_number())
    }

    fn ts_res(&self) -> TsResolution {
        if self.nano {
            TsResolution::NanoSecond
        } else {
            TsResolution::MicroSecond
        }
    }

    /// File preamble: the pcap global header, or pcapng SHB + IDB.
    pub fn header(&self, ifname: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        match self.format {
            Format::Pcap => {
                let h = PcapHeader {
                    version_major: 2,
                    version_minor: 4,
                    ts_correction: 0,
                    ts_accuracy: 0,
                    snaplen: self.snaplen,
                    datalink: self.datalink(),
                    ts_resolution: self.ts_res(),
                    endianness: Endianness::Little,
                };
                // Writing into a Vec cannot fail.
                let _ = h.write_to(&mut out);
            }
            Format::PcapNg => {
                let shb = SectionHeaderBlock {
                    endianness: Endianness::Little,
                    major_version: 1,
                    minor_version: 0,
                    section_length: -1,
                    options: vec![SectionHeaderOption::UserApplication(Cow::Borrowed("capture"))],
                };
                let idb = InterfaceDescriptionBlock {
                    linktype: self.datalink(),
                    snaplen: self.snaplen,
                    options: vec![
                        InterfaceDescriptionOption::IfName(Cow::Owned(ifname.to_string())),
                        InterfaceDescriptionOption::IfTsResol(if self.nano { 9 } else { 6 }),
                    ],
                };
                let _ = Block::SectionHeader(shb).write_to::<LittleEndian, _>(&mut out);
                let _ = Block::InterfaceDescription(idb).write_to::<LittleEndian, _>(&mut out);
            }
        }
        out
    }

    /// Appends one packet record to `out`. A VLAN tag the kernel stripped is
    /// put back into the frame, as on the wire; `scratch` avoids an
    /// allocation per tagged packet.
    pub fn record(&self, out: &mut Vec<u8>, p: &PacketView<'_>, scratch: &mut Vec<u8>) {
        let (data, wire) = match (p.cooked, p.vlan, self.link) {
            // `-i any`: the cooked header in front of the packet.
            (Some(h), _, _) => {
                scratch.clear();
                scratch.extend_from_slice(&h);
                scratch.extend_from_slice(p.data);
                (&scratch[..], p.wire_len + h.len() as u32)
            }
            (None, Some((tpid, tci)), LinkType::Ethernet) if p.data.len() >= 12 => {
                scratch.clear();
                scratch.extend_from_slice(&p.data[..12]);
                scratch.extend_from_slice(&tpid.to_be_bytes());
                scratch.extend_from_slice(&tci.to_be_bytes());
                scratch.extend_from_slice(&p.data[12..]);
                (&scratch[..], p.wire_len + 4)
            }
            _ => (p.data, p.wire_len),
        };
        let caplen = data.len().min(self.snaplen as usize);
        let data = &data[..caplen];
        let wire = wire.max(caplen as u32);
        let ts = Duration::from_nanos(p.ts_ns);
        match self.format {
            Format::Pcap => {
                let pkt = PcapPacket::new(ts, wire, data);
                // Cannot fail: caplen <= snaplen and caplen <= wire by construction, and
                // timestamps fit u32 seconds until 2106.
                let _ = pkt.write_to::<_, LittleEndian>(out, self.ts_res(), self.snaplen);
            }
            Format::PcapNg => {
                // The EPB timestamp is in units of the IDB's if_tsresol.
                let units = if self.nano { p.ts_ns } else { p.ts_ns / 1000 };
                let epb = EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: Duration::from_nanos(units),
                    original_len: wire,
                    data: Cow::Borrowed(data),
                    options: vec![],
                };
                let _ = Block::EnhancedPacket(epb).write_to::<LittleEndian, _>(out);
            }
        }
    }

    /// pcapng footer: an Interface Statistics Block with the final counters
    /// (pcap has no place for them).
    pub fn footer(&self, now_ns: u64, stats: &FooterStats) -> Vec<u8> {
        let mut out = Vec::new();
        if self.format == Format::PcapNg {
            let units = if self.nano { now_ns } else { now_ns / 1000 };
            let isb = InterfaceStatisticsBlock {
                interface_id: 0,
                // pcapng stores a 64-bit timestamp as two 32-bit words, the
                // high one first, each in the section's byte order; the crate
                // writes the field as one little-endian u64 (low word first),
                // so swap the halves to get the spec's layout.
                timestamp: units.rotate_left(32),
                options: vec![
                    InterfaceStatisticsOption::IsbFilterAccept(stats.filter_accept),
                    InterfaceStatisticsOption::IsbOsDrop(stats.os_drop),
                    InterfaceStatisticsOption::IsbUsrDeliv(stats.delivered),
                ],
            };
            let _ = Block::InterfaceStatistics(isb).write_to::<LittleEndian, _>(&mut out);
        }
        out
    }
}

/// Counters written into the pcapng footer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FooterStats {
    pub filter_accept: u64,
    pub os_drop: u64,
    pub delivered: u64,
}

enum Stream {
    Plain(BufWriter<File>),
    Gz(flate2::write::GzEncoder<BufWriter<File>>, u32),
    Zstd(zstd::stream::write::Encoder<'static, BufWriter<File>>, i32),
}

impl Stream {
    fn writer(&mut self) -> &mut dyn Write {
        match self {
            Stream::Plain(w) => w,
            Stream::Gz(w, _) => w,
            Stream::Zstd(w, _) => w,
        }
    }

    fn finish(self) -> io::Result<File> {
        let buf = match self {
            Stream::Plain(w) => w,
            Stream::Gz(w, _) => w.finish()?,
            Stream::Zstd(w, _) => w.finish()?,
        };
        buf.into_inner().map_err(|e| e.into_error())
    }

    /// Makes everything written so far readable from the file by anyone:
    /// a compressed stream ends its member (gzip) or frame (zstd) and starts
    /// a new one (concatenated members and frames are one valid stream, so
    /// `gzip -dc` and `zstd -dc` read it whole), and the buffer goes to the
    /// kernel. After `kill -9` the file reads cleanly up to here.
    fn sync_point(self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Plain(mut w) => {
                w.flush()?;
                Stream::Plain(w)
            }
            Stream::Gz(w, level) => {
                let mut buf = w.finish()?;
                buf.flush()?;
                Stream::Gz(
                    flate2::write::GzEncoder::new(buf, flate2::Compression::new(level)),
                    level,
                )
            }
            Stream::Zstd(w, level) => {
                let mut buf = w.finish()?;
                buf.flush()?;
                Stream::Zstd(zstd::stream::write::Encoder::new(buf, level)?, level)
            }
        })
    }
}

/// How often what is written reaches the file at the latest.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// An output file being written. It is the named file from the start (as
/// tcpdump's is), made readable up to a sync point after every batch of
/// packets the kernel hands over (uncompressed), at least once a second
/// (compressed: each sync point ends a frame), and with `packet_buffered`
/// after every packet; so after a crash or `kill -9` it reads cleanly up to
/// its last sync point (after a power cut, up to what the kernel had
/// written back; the finished file is fsync'ed).
pub struct FileOutput {
    path: PathBuf,
    /// `-G/-C/-W`: how and when to move on to a new file.
    rotation: Option<RotationState>,
    /// Regular files are fsync'ed when finished.
    regular: bool,
    stream: Option<Stream>,
    last_sync: Instant,
    /// Bytes written since the last sync point.
    unsynced: usize,
    /// Sync after every write (tcpdump's `-U`).
    pub packet_buffered: bool,
    pub encoding: Encoding,
}

impl std::fmt::Debug for FileOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileOutput").field("path", &self.path).finish()
    }
}

impl FileOutput {
    /// Creates (or truncates) the file and writes the header.
    pub fn create(path: &Path, encoding: Encoding, compression: Compression, ifname: &str) -> Result<FileOutput> {
        let (stream, regular) = open_stream(path, compression)?;
        let mut out = FileOutput {
            rotation: None,
            path: path.to_path_buf(),
            regular,
            stream: Some(stream),
            last_sync: Instant::now(),
            unsynced: 0,
            packet_buffered: false,
            encoding,
        };
        out.write_chunk(&encoding.header(ifname))?;
        out.sync()?;
        Ok(out)
    }
}

/// Opens (or truncates) `path` for writing through `compression`; true if
/// it is a regular file (synced to disk when finished).
fn open_stream(path: &Path, compression: Compression) -> Result<(Stream, bool)> {
    let err = |source: io::Error| CaptureError::Output {
        path: path.to_path_buf(),
        source,
    };
    let special = path == Path::new("-") || fs::metadata(path).map(|m| !m.is_file()).unwrap_or(false);
    let file = if path == Path::new("-") {
        File::from(io::stdout().lock().try_clone_fd().map_err(err)?)
    } else if special {
        OpenOptions::new().write(true).open(path).map_err(err)?
    } else {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(err)?
    };
    let buf = BufWriter::with_capacity(1 << 20, file);
    let stream = match compression {
        Compression::None => Stream::Plain(buf),
        Compression::Zlib(l) => Stream::Gz(flate2::write::GzEncoder::new(buf, flate2::Compression::new(l)), l),
        Compression::Zstd(l) => Stream::Zstd(zstd::stream::write::Encoder::new(buf, l).map_err(err)?, l),
    };
    Ok((stream, !special))
}

impl FileOutput {
    fn err(&self, source: io::Error) -> CaptureError {
        CaptureError::Output {
            path: self.path.clone(),
            source,
        }
    }

    /// Output that moves on to a new file as `rot` says: the first file is
    /// named from `template` now, each next one when its time or size has
    /// come (checked before each chunk is written, so a file may exceed
    /// `-C` by one chunk of records).
    pub fn create_rotating(
        template: &Path,
        rot: Rotation,
        encoding: Encoding,
        compression: Compression,
        ifname: &str,
    ) -> Result<FileOutput> {
        let now = std::time::SystemTime::now();
        let name = rot.name(template, 0, now)?;
        let mut f = FileOutput::create(&name, encoding, compression, ifname)?;
        f.rotation = Some(RotationState {
            rot,
            template: template.to_path_buf(),
            compression,
            ifname: ifname.to_string(),
            opened: Instant::now(),
            bytes: 0,
            files: 1,
        });
        Ok(f)
    }

    /// True once `-G` with `-W` has written its last file: the capture ends
    /// (tcpdump exits then).
    pub fn exhausted(&self) -> bool {
        self.rotation.as_ref().is_some_and(|r| r.exhausted())
    }

    /// Moves to the next file if its time or size has come (also called
    /// when idle, so `-G` files follow the clock without traffic).
    pub fn rotate_if_due(&mut self) -> Result<()> {
        let Some(r) = self.rotation.as_ref() else {
            return Ok(());
        };
        let by_time = r.rot.every.is_some_and(|e| r.opened.elapsed() >= e);
        let by_size = r.rot.max_bytes.is_some_and(|m| r.bytes >= m);
        if !(by_time || by_size) || r.exhausted() {
            return Ok(());
        }
        let name = r.rot.name(&r.template, r.files, std::time::SystemTime::now())?;
        let (compression, ifname) = (r.compression, r.ifname.clone());
        // The file just ended is complete and readable on its own.
        if let Some(s) = self.stream.take() {
            let f = s.finish().map_err(|e| self.err(e))?;
            if self.regular {
                f.sync_all().map_err(|e| self.err(e))?;
            }
        }
        let (stream, regular) = open_stream(&name, compression)?;
        self.path = name;
        self.regular = regular;
        self.stream = Some(stream);
        if let Some(r) = self.rotation.as_mut() {
            r.opened = Instant::now();
            r.bytes = 0;
            r.files += 1;
        }
        // The new file's header (the rotation is not due again now).
        self.write_chunk(&self.encoding.header(&ifname))?;
        self.sync()
    }

    /// Appends already-encoded records.
    pub fn write_chunk(&mut self, bytes: &[u8]) -> Result<()> {
        self.rotate_if_due()?;
        if let Some(r) = self.rotation.as_mut() {
            r.bytes += bytes.len() as u64;
        }
        let r = match self.stream.as_mut() {
            Some(s) => s.writer().write_all(bytes),
            None => Ok(()),
        };
        r.map_err(|e| self.err(e))?;
        self.unsynced += bytes.len();
        Ok(())
    }

    /// A sync point now (see [`FileOutput`]).
    pub fn sync(&mut self) -> Result<()> {
        if let Some(s) = self.stream.take() {
            let s = s.sync_point().map_err(|e| self.err(e))?;
            self.stream = Some(s);
        }
        self.last_sync = Instant::now();
        self.unsynced = 0;
        Ok(())
    }

    /// A sync point if anything is unsynced and one is due: at once with
    /// `force` or `packet_buffered`, and for an uncompressed file at every
    /// call (a write of what the last batch added: each block the kernel
    /// hands over reaches the file); a compressed one, whose sync points end
    /// a frame, once [`SYNC_EVERY`] has passed.
    pub fn sync_if_due(&mut self, force: bool) -> Result<()> {
        let plain = matches!(self.stream, Some(Stream::Plain(_)));
        if self.unsynced > 0 && (force || plain || self.packet_buffered || self.last_sync.elapsed() >= SYNC_EVERY) {
            self.sync()?;
        }
        Ok(())
    }

    /// Writes the footer, ends the compressed stream and, for a regular
    /// file, syncs it to disk.
    pub fn finish(mut self, footer: &[u8]) -> Result<()> {
        self.write_chunk(footer)?;
        if let Some(s) = self.stream.take() {
            let f = s.finish().map_err(|e| self.err(e))?;
            if self.regular {
                f.sync_all().map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }
}

impl Drop for FileOutput {
    fn drop(&mut self) {
        // Ended early (an error elsewhere): keep what was written, readable.
        if let Some(s) = self.stream.take() {
            let _ = s.finish();
        }
    }
}

/// tcpdump's `-G SECS`, `-C MB` and `-W COUNT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rotation {
    /// `-G`: a new file every this long, its name from the `-w` template
    /// through strftime.
    pub every: Option<std::time::Duration>,
    /// `-C`: a new file once this many bytes (tcpdump's unit: 1,000,000) are
    /// in the current one; the files are numbered.
    pub max_bytes: Option<u64>,
    /// `-W`: with `-C`, a ring of this many files (numbers wrap, zero-padded
    /// to its width); with `-G` alone, stop after this many files.
    pub files: Option<u32>,
}

impl Rotation {
    pub fn is_on(&self) -> bool {
        self.every.is_some() || self.max_bytes.is_some()
    }

    /// The name of file number `n` (0 the first) opened at `now`.
    pub fn name(&self, template: &Path, n: u32, now: std::time::SystemTime) -> Result<PathBuf> {
        let mut base = template.to_string_lossy().to_string();
        if self.every.is_some() {
            let secs = now
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            base = crate::sys::strftime_local(&base, secs).ok_or_else(|| {
                CaptureError::Config(format!("-G: the file name {base} does not format with strftime"))
            })?;
        }
        if self.max_bytes.is_some() {
            match self.files {
                Some(w) => {
                    let width = w.saturating_sub(1).max(1).to_string().len();
                    base.push_str(&format!("{:0width$}", n % w.max(1)));
                }
                None if n > 0 => base.push_str(&n.to_string()),
                None => {}
            }
        }
        Ok(PathBuf::from(base))
    }
}

#[derive(Debug)]
struct RotationState {
    rot: Rotation,
    template: PathBuf,
    compression: Compression,
    ifname: String,
    opened: Instant,
    /// Record bytes in the current file (before compression).
    bytes: u64,
    /// Files opened so far.
    files: u32,
}

impl RotationState {
    fn exhausted(&self) -> bool {
        self.rot.max_bytes.is_none()
            && self.rot.every.is_some()
            && self.rot.files.is_some_and(|w| self.files >= w)
            && self.opened.elapsed() >= self.rot.every.unwrap_or_default()
    }
}

trait TryCloneFd {
    fn try_clone_fd(&self) -> io::Result<std::os::fd::OwnedFd>;
}

impl TryCloneFd for io::StdoutLock<'_> {
    fn try_clone_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_file_names_follow_tcpdump() {
        let t = Path::new("/x/cap.pcap");
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let size = Rotation {
            max_bytes: Some(1),
            ..Rotation::default()
        };
        assert_eq!(size.name(t, 0, now).unwrap(), Path::new("/x/cap.pcap"));
        assert_eq!(size.name(t, 2, now).unwrap(), Path::new("/x/cap.pcap2"));
        let ring = Rotation {
            files: Some(12),
            ..size
        };
        assert_eq!(ring.name(t, 5, now).unwrap(), Path::new("/x/cap.pcap05"));
        assert_eq!(ring.name(t, 13, now).unwrap(), Path::new("/x/cap.pcap01"), "wraps");
        let timed = Rotation {
            every: Some(std::time::Duration::from_secs(60)),
            ..Rotation::default()
        };
        let year = timed.name(Path::new("/x/%Y.pcap"), 0, now).unwrap();
        assert!(year.to_string_lossy().starts_with("/x/2027"), "{year:?}");
        assert!(!timed.name(t, 3, now).unwrap().to_string_lossy().ends_with('3'));
    }
    use pcap_file::pcap::PcapReader;
    use pcap_file::pcapng::PcapNgReader;

    fn pkt(data: &[u8], ts_ns: u64) -> PacketView<'_> {
        PacketView {
            ts_ns,
            wire_len: data.len() as u32 + 10,
            data,
            vlan: None,
            cooked: None,
        }
    }

    fn enc(format: Format, nano: bool) -> Encoding {
        Encoding {
            format,
            link: LinkType::Ethernet,
            snaplen: 65535,
            nano,
        }
    }

    #[test]
    fn pcap_round_trip() {
        for nano in [false, true] {
            let e = enc(Format::Pcap, nano);
            let mut buf = e.header("eth0");
            let mut scratch = Vec::new();
            let data: Vec<u8> = (0..60u8).collect();
            e.record(&mut buf, &pkt(&data, 1_700_000_000_123_456_789), &mut scratch);
            e.record(&mut buf, &pkt(&data[..20], 1_700_000_001_000_000_000), &mut scratch);
            let mut r = PcapReader::new(&buf[..]).expect("header");
            let p1 = r.next_packet().expect("one").expect("valid");
            assert_eq!(&p1.data[..], &data[..]);
            assert_eq!(p1.orig_len, 70);
            let want = if nano { 123_456_789 } else { 123_456_000 };
            assert_eq!(p1.timestamp, Duration::new(1_700_000_000, want));
            let p2 = r.next_packet().expect("two").expect("valid");
            assert_eq!(p2.data.len(), 20);
            assert!(r.next_packet().is_none());
        }
    }

    #[test]
    fn statistics_block_timestamp_is_high_word_first() {
        // pcapng: Timestamp (High), then Timestamp (Low), 32 bits each.
        let e = enc(Format::PcapNg, false);
        let now_ns = 1_764_000_000_123_456_000u64; // late 2025
        let isb = e.footer(now_ns, &FooterStats::default());
        // Block type, total length, interface id (32 bits each), then the timestamp.
        assert_eq!(u32::from_le_bytes(isb[0..4].try_into().unwrap()), 5);
        let high = u32::from_le_bytes(isb[12..16].try_into().unwrap()) as u64;
        let low = u32::from_le_bytes(isb[16..20].try_into().unwrap()) as u64;
        assert_eq!((high << 32) | low, now_ns / 1000);
    }

    #[test]
    fn pcapng_round_trip_with_footer() {
        let e = enc(Format::PcapNg, false);
        let mut buf = e.header("veth0");
        let mut scratch = Vec::new();
        let data = [7u8; 61];
        e.record(&mut buf, &pkt(&data, 5_000_001_000), &mut scratch);
        buf.extend(e.footer(
            6_000_000_000,
            &FooterStats {
                filter_accept: 3,
                os_drop: 2,
                delivered: 1,
            },
        ));
        let mut r = PcapNgReader::new(&buf[..]).expect("shb");
        let mut epbs = 0;
        let mut isb = false;
        while let Some(b) = r.next_block() {
            match b.expect("valid block") {
                Block::EnhancedPacket(p) => {
                    epbs += 1;
                    assert_eq!(&p.data[..], &data[..]);
                    assert_eq!(p.original_len, 71);
                }
                Block::InterfaceStatistics(s) => {
                    isb = true;
                    assert!(s.options.contains(&InterfaceStatisticsOption::IsbOsDrop(2)));
                }
                _ => {}
            }
        }
        assert_eq!(epbs, 1);
        assert!(isb);
    }

    #[test]
    fn vlan_tag_is_reinserted_and_snaplen_applied() {
        let mut e = enc(Format::Pcap, false);
        e.snaplen = 16;
        let mut buf = Vec::new();
        let mut scratch = Vec::new();
        let data: Vec<u8> = (0..40u8).collect();
        let mut p = pkt(&data, 0);
        p.vlan = Some((0x8100, 0x0123));
        e.record(&mut buf, &p, &mut scratch);
        // 16-byte record header, then 16 bytes of frame.
        assert_eq!(buf.len(), 32);
        assert_eq!(&buf[16 + 12..16 + 16], &[0x81, 0x00, 0x01, 0x23]);
        // incl_len 16, orig_len = 50 + 4.
        assert_eq!(u32::from_le_bytes(buf[8..12].try_into().expect("4")), 16);
        assert_eq!(u32::from_le_bytes(buf[12..16].try_into().expect("4")), 54);
    }

    #[test]
    fn compression_parses() {
        assert_eq!("zlib:0".parse(), Ok(Compression::Zlib(0)));
        assert_eq!("zstd:19".parse(), Ok(Compression::Zstd(19)));
        assert_eq!("none".parse(), Ok(Compression::None));
        assert!("zlib:10".parse::<Compression>().is_err());
        assert!("lz4:1".parse::<Compression>().is_err());
    }

    #[test]
    fn the_named_file_is_readable_at_every_sync_point_and_when_finished() {
        let dir = std::env::temp_dir().join(format!("capture-out-test-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("tmp dir");
        let path = dir.join("x.pcap");
        let decode = |c: Compression, raw: Vec<u8>| match c {
            Compression::None => raw,
            Compression::Zlib(_) => {
                let mut v = Vec::new();
                io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&raw[..]), &mut v).expect("gunzip");
                v
            }
            Compression::Zstd(_) => zstd::decode_all(&raw[..]).expect("unzstd"),
        };
        for c in [Compression::None, Compression::Zlib(1), Compression::Zstd(1)] {
            // Never finished (as after kill -9): readable up to the last sync point.
            let mut o = FileOutput::create(&path, enc(Format::Pcap, false), c, "lo").expect("create");
            o.write_chunk(&[1; 40]).expect("write");
            o.sync_if_due(true).expect("sync");
            o.write_chunk(&[2; 40]).expect("write");
            let at_crash = fs::read(&path).expect("file");
            assert_eq!(
                decode(c, at_crash).len(),
                24 + 40,
                "{c:?}: readable up to the sync point"
            );
            std::mem::forget(o);
        }
        for c in [Compression::None, Compression::Zlib(1), Compression::Zstd(1)] {
            let o = FileOutput::create(&path, enc(Format::Pcap, false), c, "lo").expect("create");
            o.finish(&[]).expect("finish");
            let raw = fs::read(&path).expect("file");
            let plain = decode(c, raw);
            assert_eq!(plain.len(), 24);
            fs::remove_file(&path).expect("rm");
        }
        fs::remove_dir(&dir).expect("rmdir");
    }

    #[test]
    fn unwritable_directory_is_a_clear_error() {
        let e = FileOutput::create(
            Path::new("/nonexistent-dir-for-capture/x.pcap"),
            enc(Format::Pcap, false),
            Compression::None,
            "lo",
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("cannot write /nonexistent-dir-for-capture/x.pcap"),
            "{e}"
        );
    }
}
