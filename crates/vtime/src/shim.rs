//! The embedded LD_PRELOAD shim and writing it to a private file.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::sys;

/// The shim shared object, built from `shim/vtime_shim.c` by build.rs.
pub static SHIM_SO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libvtime_shim.so"));

/// File name of an installed shim (how a vtime shim is recognised in `LD_PRELOAD`).
pub const SHIM_FILE_NAME: &str = "libvtime.so";

/// The C header describing the shared record (for other programs).
pub static RECORD_HEADER: &str = include_str!("../shim/vtime_record.h");

/// A shim file ready for `LD_PRELOAD`. One written by [`InstalledShim::install`]
/// lives in a private directory removed on drop.
pub struct InstalledShim {
    path: PathBuf,
    private_dir: Option<PathBuf>,
}

impl InstalledShim {
    /// Writes the embedded shim to a fresh private directory (mode 0700) and
    /// checks that the dynamic loader accepts it. Tries the temporary
    /// directory, then `$XDG_RUNTIME_DIR`, then `/dev/shm`: a directory on a
    /// `noexec` mount cannot hold a loadable library.
    pub fn install() -> Result<InstalledShim, Error> {
        let mut reasons = Vec::new();
        for parent in shim_parents() {
            match Self::install_in(&parent) {
                Ok(s) => return Ok(s),
                Err(e) => reasons.push(e.to_string()),
            }
        }
        Err(Error::ShimLoad {
            path: PathBuf::from(SHIM_FILE_NAME),
            reason: format!("no directory could hold it: {}", reasons.join("; ")),
        })
    }

    /// As [`install`](Self::install), under `parent`.
    pub fn install_in(parent: &Path) -> Result<InstalledShim, Error> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!("vtime-{}-{nanos:09}", std::process::id()));
        DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(Error::io("mkdir", &dir))?;
        // From here on the directory is ours: drop removes it on every error.
        let shim = InstalledShim {
            path: dir.join(SHIM_FILE_NAME),
            private_dir: Some(dir),
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&shim.path)
            .map_err(Error::io("create", &shim.path))?;
        f.write_all(SHIM_SO).map_err(Error::io("write", &shim.path))?;
        drop(f);
        shim.verify()?;
        Ok(shim)
    }

    /// Uses a shim file given by the user (kept on drop), after the same check.
    pub fn from_path(path: &Path) -> Result<InstalledShim, Error> {
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::env::current_dir().map_err(Error::io("getcwd", path))?.join(path)
        };
        let shim = InstalledShim {
            path,
            private_dir: None,
        };
        shim.verify()?;
        Ok(shim)
    }

    fn verify(&self) -> Result<(), Error> {
        sys::check_loadable(&self.path).map_err(|reason| Error::ShimLoad {
            path: self.path.clone(),
            reason,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Where private shim directories are made, in order of preference.
pub fn shim_parents() -> Vec<PathBuf> {
    let mut v = vec![std::env::temp_dir()];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|x| !x.is_empty()) {
        v.push(PathBuf::from(x));
    }
    v.push(PathBuf::from("/dev/shm"));
    v.dedup();
    v
}

/// Removes, in every place [`InstalledShim::install`] uses, private shim
/// directories left by processes that are gone; returns how many.
pub fn remove_stale() -> usize {
    shim_parents().iter().map(|p| remove_stale_in(p)).sum()
}

/// Removes private shim directories under `parent` left by processes that
/// are gone (killed before they could clean up); returns how many.
pub fn remove_stale_in(parent: &Path) -> usize {
    let Ok(rd) = fs::read_dir(parent) else { return 0 };
    let mut n = 0;
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(stale_pid) else {
            continue;
        };
        if !sys::pid_alive(pid) && fs::remove_dir_all(e.path()).is_ok() {
            n += 1;
        }
    }
    n
}

/// The pid in a private shim directory name `vtime-PID-NNNNNNNNN`, and only
/// in such a name.
fn stale_pid(name: &str) -> Option<u32> {
    let (pid, nanos) = name.strip_prefix("vtime-")?.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && nanos.len() == 9 && digits(nanos)).then(|| pid.parse().ok())?
}

impl Drop for InstalledShim {
    fn drop(&mut self) {
        if let Some(d) = &self.private_dir {
            let _ = fs::remove_dir_all(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installs_loads_and_cleans_up() {
        let s = InstalledShim::install().unwrap();
        let dir = s.path().parent().unwrap().to_path_buf();
        assert_eq!(fs::read(s.path()).unwrap(), SHIM_SO);
        drop(s);
        assert!(!dir.exists(), "private directory removed");
    }

    #[test]
    fn only_private_shim_directories_match() {
        assert_eq!(stale_pid("vtime-123-000000042"), Some(123));
        for other in [
            "vtime-123",
            "vtime-waits-123",
            "vtime-123-42",
            "vtime-x-000000042",
            "other-1-000000001",
        ] {
            assert_eq!(stale_pid(other), None, "{other}");
        }
    }

    #[test]
    fn garbage_is_refused_with_the_loader_reason() {
        let p = std::env::temp_dir().join(format!("vtime-garbage-{}.so", std::process::id()));
        fs::write(&p, b"not an ELF file").unwrap();
        let e = InstalledShim::from_path(&p).err().expect("garbage must be refused");
        let _ = fs::remove_file(&p);
        assert!(matches!(e, Error::ShimLoad { .. }), "{e}");
        assert!(e.to_string().contains("cannot be loaded"), "{e}");
    }
}
