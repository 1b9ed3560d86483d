//! A file a long-running server re-reads when it changes (a secret rolled
//! over, a key file replaced): polled, since a server's loop already wakes
//! often and a poll needs no inotify descriptor that a file replaced by
//! rename (the usual way to write a secret atomically) would leave watching
//! the old inode.

use crate::SysError;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// What identifies one version of the file: a rewrite in place changes the
/// modification time or the length, a rename over it the inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    dev: u64,
    ino: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// Watches one file by polling its metadata at most once per period.
#[derive(Debug)]
pub struct FileWatch {
    path: PathBuf,
    every: Duration,
    seen: Option<Stamp>,
    checked: Instant,
}

impl FileWatch {
    /// Starts watching `path` as it is now (the caller has just read it).
    pub fn new(path: &Path, every: Duration) -> FileWatch {
        FileWatch {
            path: path.to_path_buf(),
            every,
            seen: stamp(path),
            checked: Instant::now(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's new text if it changed since the last call (looked at
    /// no more than once per period), or at once when `force` (a SIGHUP:
    /// the operator says it changed, even within one timestamp tick).
    /// `None`: unchanged, or not looked at yet. A file that cannot be read
    /// is an error each time its metadata changes (and on each `force`),
    /// not on every poll.
    pub fn poll(&mut self, force: bool) -> Option<Result<String, SysError>> {
        if !force && self.checked.elapsed() < self.every {
            return None;
        }
        self.checked = Instant::now();
        let now = stamp(&self.path);
        if !force && now == self.seen {
            return None;
        }
        self.seen = now;
        Some(std::fs::read_to_string(&self.path).map_err(|e| SysError::new(format!("read {}", self.path.display()), e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("oskit-watch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_change_is_seen_once_and_a_rename_over_the_file_too() {
        let d = scratch("change");
        let f = d.join("secret");
        std::fs::write(&f, "one").unwrap();
        let mut w = FileWatch::new(&f, Duration::ZERO);
        assert!(w.poll(false).is_none(), "unchanged");
        std::fs::write(&f, "two!").unwrap();
        assert_eq!(w.poll(false).unwrap().unwrap(), "two!");
        assert!(w.poll(false).is_none(), "reported once");
        // Same length, written by rename: a new inode.
        let tmp = d.join("secret.new");
        std::fs::write(&tmp, "thr3").unwrap();
        std::fs::rename(&tmp, &f).unwrap();
        assert_eq!(w.poll(false).unwrap().unwrap(), "thr3");
        // Forced: read again whatever the metadata says.
        assert_eq!(w.poll(true).unwrap().unwrap(), "thr3");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_period_limits_polls_and_a_missing_file_is_an_error_once() {
        let d = scratch("period");
        let f = d.join("secret");
        std::fs::write(&f, "one").unwrap();
        let mut slow = FileWatch::new(&f, Duration::from_secs(3600));
        std::fs::write(&f, "changed").unwrap();
        assert!(slow.poll(false).is_none(), "not looked at within the period");
        assert_eq!(slow.poll(true).unwrap().unwrap(), "changed", "but forced");
        let mut w = FileWatch::new(&f, Duration::ZERO);
        std::fs::remove_file(&f).unwrap();
        let e = w.poll(false).unwrap().unwrap_err();
        assert!(e.to_string().contains("secret"), "{e}");
        assert!(w.poll(false).is_none(), "the same missing file is not reported again");
        let _ = std::fs::remove_dir_all(&d);
    }
}
