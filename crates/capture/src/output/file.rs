//! The output file: written through optional compression, kept readable
//! up to its last sync point, and rotated by time or size (`-G/-C/-W`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{Compression, Encoding};
use crate::error::{CaptureError, Result};

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
    use crate::output::tests::enc;
    use crate::output::Format;

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
