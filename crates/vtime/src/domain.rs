//! Clock domains: creating, opening, changing and listing records.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::Error;
use crate::model::{ClockBase, Tdf};
use crate::record::{Snapshot, FLAG_MANAGED};
use crate::sys::{self, Mapping, MAP_LEN};

/// Environment variable that overrides where records live.
pub const DIR_ENV: &str = "VTIME_DIR";
/// Environment variable through which the shim finds its record.
pub const RECORD_ENV: &str = "VTIME_RECORD";
const PREFIX: &str = "vtime-";
const SUFFIX: &str = ".rec";

/// Where records live: `$VTIME_DIR`, or `/dev/shm` (memory, not disk).
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => PathBuf::from("/dev/shm"),
    }
}

/// A domain name becomes part of a file name, so it is kept to a safe alphabet.
pub fn validate_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::BadName(name.to_string()))
    }
}

fn record_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{PREFIX}{name}{SUFFIX}"))
}

/// One clock domain's record, mapped. A domain made by [`Domain::create`]
/// removes its file when dropped; one made by [`Domain::open`] does not.
pub struct Domain {
    name: String,
    path: PathBuf,
    file: File,
    map: Mapping,
    owned: bool,
}

impl Domain {
    /// Creates domain `name` in `dir` with factor `tdf`, its virtual clocks
    /// starting at the real ones. Refuses a name in use by a live process;
    /// takes over one left behind by a dead one.
    pub fn create(dir: &Path, name: &str, tdf: Tdf) -> Result<Domain, Error> {
        Domain::create_with(dir, name, tdf, 0)
    }

    /// [`Domain::create`] for a program that changes more than the clock
    /// when the factor changes (a netlab lab re-rates its links): the record
    /// says so ([`FLAG_MANAGED`]), and [`Domain::set_tdf_from_outside`]
    /// refuses to change the clock alone unless forced.
    pub fn create_managed(dir: &Path, name: &str, tdf: Tdf) -> Result<Domain, Error> {
        Domain::create_with(dir, name, tdf, FLAG_MANAGED)
    }

    fn create_with(dir: &Path, name: &str, tdf: Tdf, flags: u32) -> Result<Domain, Error> {
        validate_name(name)?;
        let path = record_path(dir, name);
        // Made under a private name and linked into place, so nobody ever
        // opens a half-initialised record, and two creators cannot both win.
        let tmp = dir.join(format!(".{PREFIX}{name}.{}.tmp", std::process::id()));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)
            .map_err(Error::io("create", &tmp))?;
        let made = (|| {
            file.set_len(MAP_LEN as u64).map_err(Error::io("resize", &tmp))?;
            let map = Mapping::new(&file).map_err(Error::io("mmap", &tmp))?;
            map.record().init(sys::now_all(), tdf, std::process::id(), flags);
            for attempt in 0..2 {
                match fs::hard_link(&tmp, &path) {
                    Ok(()) => return Ok(map),
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt == 0 => {
                        match Domain::open(dir, name) {
                            Ok(other) => {
                                let pid = other.snapshot().creator_pid;
                                if sys::pid_alive(pid) {
                                    return Err(Error::InUse {
                                        name: name.to_string(),
                                        pid,
                                    });
                                }
                            }
                            Err(Error::UnknownDomain { .. }) => continue,
                            Err(_) => {} // damaged: replace it
                        }
                        // Left behind by a process that is gone: take it over.
                        let _ = fs::remove_file(&path);
                    }
                    Err(e) => {
                        return Err(Error::Io {
                            call: "link",
                            path: path.clone(),
                            source: e,
                        })
                    }
                }
            }
            Err(Error::Io {
                call: "link",
                path: path.clone(),
                source: io::Error::from(io::ErrorKind::AlreadyExists),
            })
        })();
        let _ = fs::remove_file(&tmp);
        let map = made?;
        Ok(Domain {
            name: name.to_string(),
            path,
            file,
            map,
            owned: true,
        })
    }

    /// Opens an existing domain.
    pub fn open(dir: &Path, name: &str) -> Result<Domain, Error> {
        validate_name(name)?;
        let path = record_path(dir, name);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::UnknownDomain {
                    name: name.to_string(),
                    dir: dir.to_path_buf(),
                })
            }
            Err(e) => {
                return Err(Error::Io {
                    call: "open",
                    path,
                    source: e,
                })
            }
        };
        let len = file.metadata().map_err(Error::io("stat", &path))?.len();
        if len < MAP_LEN as u64 {
            return Err(Error::BadRecord {
                path,
                why: format!("{len} bytes long, expected {MAP_LEN}"),
            });
        }
        let map = Mapping::new(&file).map_err(Error::io("mmap", &path))?;
        if let Err(why) = map.record().check() {
            return Err(Error::BadRecord { path, why });
        }
        Ok(Domain {
            name: name.to_string(),
            path,
            file,
            map,
            owned: false,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The record file (what `VTIME_RECORD` names).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A consistent copy of the record (lock-free).
    pub fn snapshot(&self) -> Snapshot {
        self.map.record().snapshot()
    }

    /// Virtual value of a clock base now, in ns.
    pub fn virtual_now(&self, base: ClockBase) -> i64 {
        self.snapshot().timeline.virtual_now(base, sys::now_ns(base))
    }

    /// Changes the factor now. Virtual clocks continue from where they are;
    /// waits in progress in dilated processes follow within one slice.
    /// [`Domain::set_tdf`] by someone other than the domain's creator (`vtime
    /// set`): refused for a managed domain unless `force`, since its
    /// creator changes more than the clock with the factor.
    pub fn set_tdf_from_outside(&self, tdf: Tdf, force: bool) -> Result<Snapshot, Error> {
        let now = self.snapshot();
        if now.flags & FLAG_MANAGED != 0 && !force {
            return Err(Error::Managed {
                name: self.name.clone(),
                pid: now.creator_pid,
            });
        }
        self.set_tdf(tdf)
    }

    pub fn set_tdf(&self, tdf: Tdf) -> Result<Snapshot, Error> {
        // Writers are serialised by a lock on the file; readers never lock.
        let dup = self.file.try_clone().map_err(Error::io("dup", &self.path))?;
        let _lock = Flock::lock(dup, FlockArg::LockExclusive).map_err(|(_, e)| Error::Io {
            call: "flock",
            path: self.path.clone(),
            source: e.into(),
        })?;
        Ok(self.map.record().rebase(tdf, sys::now_all))
    }

    /// The variables a launcher adds to a child's environment so that it,
    /// and every process it starts, runs on this domain's clock: the shim in
    /// `LD_PRELOAD` (ahead of what is already there) and the record path.
    pub fn child_env(&self, shim: &Path) -> Vec<(OsString, OsString)> {
        let preload = preload_value(shim, std::env::var_os("LD_PRELOAD"));
        vec![
            (OsString::from("LD_PRELOAD"), preload),
            (OsString::from(RECORD_ENV), self.path.as_os_str().to_os_string()),
        ]
    }
}

/// `LD_PRELOAD` for a child: our shim first, then what was there, minus any
/// vtime shim already present (a launcher itself run under vtime), which
/// would stack a second dilation on top of ours.
fn preload_value(shim: &Path, old: Option<OsString>) -> OsString {
    let mut preload = shim.as_os_str().to_os_string();
    if let Some(old) = old {
        for entry in std::env::split_paths(&old) {
            let ours = entry.file_name().is_some_and(|n| n == crate::shim::SHIM_FILE_NAME);
            if !entry.as_os_str().is_empty() && !ours {
                preload.push(":");
                preload.push(entry);
            }
        }
    }
    preload
}

impl Drop for Domain {
    fn drop(&mut self) {
        if self.owned {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// Removes the records in `dir` whose creator is gone (a `vtime run` or a
/// launcher killed before it could clean up), and returns their names. A
/// record whose creator's pid was reused by another process is kept: safe,
/// and `vtime status` shows it.
pub fn remove_stale(dir: &Path) -> Result<Vec<String>, Error> {
    let mut removed = Vec::new();
    for (name, d) in list_domains(dir)? {
        let Ok(d) = d else { continue };
        if !sys::pid_alive(d.snapshot().creator_pid) {
            fs::remove_file(d.path()).map_err(Error::io("remove", d.path()))?;
            removed.push(name);
        }
    }
    Ok(removed)
}

/// A domain found in a directory: its name, and the domain or why it could not be opened.
pub type Listed = (String, Result<Domain, Error>);

/// Every domain in `dir`, by name, each opened (or the reason it could not be).
pub fn list_domains(dir: &Path) -> Result<Vec<Listed>, Error> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(Error::Io {
                call: "list",
                path: dir.to_path_buf(),
                source: e,
            })
        }
    };
    let mut out = Vec::new();
    for entry in rd.flatten() {
        let file_name = entry.file_name();
        let Some(n) = file_name.to_str() else { continue };
        if let Some(name) = n.strip_prefix(PREFIX).and_then(|r| r.strip_suffix(SUFFIX)) {
            out.push((name.to_string(), Domain::open(dir, name)));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::NS_PER_SEC;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vtime-unit-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn preload_keeps_others_and_drops_an_outer_vtime_shim() {
        let shim = Path::new("/run/a/libvtime.so");
        assert_eq!(preload_value(shim, None), "/run/a/libvtime.so");
        assert_eq!(
            preload_value(shim, Some("/x/libother.so:/tmp/vtime-1/libvtime.so::/y/l.so".into())),
            "/run/a/libvtime.so:/x/libother.so:/y/l.so"
        );
    }

    #[test]
    fn names_are_checked() {
        for ok in ["lab1", "a.b_c-d", "X"] {
            validate_name(ok).unwrap();
        }
        for bad in ["", ".hidden", "a/b", "with space", &"x".repeat(65)] {
            assert!(matches!(validate_name(bad), Err(Error::BadName(_))), "{bad:?}");
        }
    }

    #[test]
    fn create_open_set_list_remove() {
        let dir = tmpdir("cosl");
        let d = Domain::create(&dir, "lab", Tdf::new(4, 1).unwrap()).unwrap();
        // A live owner keeps the name.
        assert!(matches!(
            Domain::create(&dir, "lab", Tdf::ONE),
            Err(Error::InUse { .. })
        ));
        let o = Domain::open(&dir, "lab").unwrap();
        let before = o.virtual_now(ClockBase::Monotonic);
        let s = o.set_tdf(Tdf::new(2, 1).unwrap()).unwrap();
        assert_eq!(d.snapshot(), s);
        assert!(d.virtual_now(ClockBase::Monotonic) >= before);
        let listed = list_domains(&dir).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, "lab");
        let env = d.child_env(Path::new("/x/libvtime.so"));
        assert!(env.iter().any(|(k, v)| k == RECORD_ENV && v == d.path().as_os_str()));
        drop(o);
        drop(d);
        assert!(list_domains(&dir).unwrap().is_empty(), "the owner removes its record");
        assert!(matches!(Domain::open(&dir, "lab"), Err(Error::UnknownDomain { .. })));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_managed_domain_is_changed_from_outside_only_when_forced() {
        let dir = tmpdir("managed");
        let d = Domain::create_managed(&dir, "lab", Tdf::new(4, 1).unwrap()).unwrap();
        let o = Domain::open(&dir, "lab").unwrap();
        assert!(matches!(
            o.set_tdf_from_outside(Tdf::new(2, 1).unwrap(), false),
            Err(Error::Managed { .. })
        ));
        assert_eq!(o.snapshot().timeline.tdf(), Tdf::new(4, 1).unwrap());
        let s = o.set_tdf_from_outside(Tdf::new(2, 1).unwrap(), true).unwrap();
        assert_eq!(s.timeline.tdf(), Tdf::new(2, 1).unwrap());
        assert_eq!(s.flags, FLAG_MANAGED, "a change keeps the flag");
        // Its creator changes it as it likes, and a plain domain is open to all.
        d.set_tdf(Tdf::new(3, 1).unwrap()).unwrap();
        let plain = Domain::create(&dir, "plain", Tdf::ONE).unwrap();
        Domain::open(&dir, "plain")
            .unwrap()
            .set_tdf_from_outside(Tdf::new(2, 1).unwrap(), false)
            .unwrap();
        drop((o, d, plain));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn virtual_clock_runs_slower() {
        let dir = tmpdir("slow");
        let d = Domain::create(&dir, "slow", Tdf::new(1000, 1).unwrap()).unwrap();
        let v = d.virtual_now(ClockBase::Realtime) - sys::now_ns(ClockBase::Realtime);
        // Just created: virtual realtime is within a second of real.
        assert!(v.abs() < NS_PER_SEC, "{v}");
        drop(d);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stale_records_are_removed() {
        let dir = tmpdir("rmstale");
        let live = Domain::create(&dir, "live", Tdf::ONE).unwrap();
        let mut dead = Domain::create(&dir, "dead", Tdf::ONE).unwrap();
        dead.map
            .record()
            .creator_pid
            .store(u32::MAX, std::sync::atomic::Ordering::Relaxed);
        dead.owned = false;
        drop(dead);
        assert_eq!(remove_stale(&dir).unwrap(), vec!["dead".to_string()]);
        let names: Vec<String> = list_domains(&dir).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["live".to_string()]);
        drop(live);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stale_record_is_taken_over() {
        let dir = tmpdir("stale");
        let d = Domain::create(&dir, "s", Tdf::ONE).unwrap();
        // Pretend its creator died: a pid that cannot exist.
        d.map
            .record()
            .creator_pid
            .store(u32::MAX, std::sync::atomic::Ordering::Relaxed);
        let mut d = d;
        d.owned = false;
        drop(d);
        let again = Domain::create(&dir, "s", Tdf::new(3, 1).unwrap()).unwrap();
        assert_eq!(again.snapshot().timeline.tdf(), Tdf::new(3, 1).unwrap());
        drop(again);
        fs::remove_dir_all(&dir).unwrap();
    }
}
