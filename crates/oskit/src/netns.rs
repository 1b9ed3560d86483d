//! Network namespaces: code runs inside one on a fresh thread, so the
//! calling thread's own namespace is never changed and a multi-threaded
//! program (tests run in parallel threads) cannot end up with a thread
//! stranded in a lab. Sockets stay in the namespace they were created in,
//! whichever thread uses them later.

use crate::SysError;
use std::fs::File;
use std::path::{Path, PathBuf};

/// Where `ip netns add` puts named namespaces.
pub const NETNS_DIR: &str = "/run/netns";

/// A network namespace, opened by name (under [`NETNS_DIR`]) or by path.
#[derive(Debug)]
pub struct NetNs {
    path: PathBuf,
    file: File,
}

impl NetNs {
    pub fn open(name_or_path: &str) -> Result<NetNs, SysError> {
        let path = path_of(name_or_path);
        let file = File::open(&path).map_err(|e| SysError::new(format!("open {}", path.display()), e))?;
        Ok(NetNs { path, file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on a fresh thread that has entered this namespace and waits
    /// for it; a panic in `f` is reported as an error.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, SysError> {
        std::thread::scope(|s| {
            s.spawn(|| {
                self.enter_this_thread()?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(SysError::new(
                    format!("thread in {}", self.path.display()),
                    std::io::Error::other("panicked"),
                ))
            })
        })
    }

    /// Like [`NetNs::run`], but returns at once with the thread's handle;
    /// a failure to enter comes back as the caller's error type.
    pub fn spawn<T, E>(self, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<Result<T, E>>
    where
        T: Send + 'static,
        E: From<SysError> + Send + 'static,
    {
        std::thread::spawn(move || {
            self.enter_this_thread().map_err(E::from)?;
            Ok(f())
        })
    }

    /// Like [`NetNs::run`], with this namespace's own sysfs on `/sys` for
    /// `f`, as `ip netns exec` gives a command: sysfs shows the devices of
    /// the namespace of whoever mounted it, so a thread that only entered
    /// the namespace would still see, and write to, the caller's devices
    /// under `/sys/class/net`. The fresh thread first takes a mount
    /// namespace of its own (`unshare(CLONE_NEWNS)`, which moves this
    /// thread alone; its mounts made slaves, so nothing it mounts reaches
    /// the caller's), enters the network namespace, and mounts sysfs over
    /// `/sys`. When the thread ends its mount namespace and the mount go
    /// with it; the caller's `/sys` is never touched. Needs
    /// `CAP_SYS_ADMIN`.
    pub fn run_with_sysfs<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, SysError> {
        use nix::mount::{mount, umount2, MntFlags, MsFlags};
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(|e| SysError::new("unshare(CLONE_NEWNS)", e))?;
                let slaves = MsFlags::MS_REC | MsFlags::MS_SLAVE;
                mount(None::<&str>, "/", None::<&str>, slaves, None::<&str>)
                    .map_err(|e| SysError::new("mount --make-rslave /", e))?;
                self.enter_this_thread()?;
                // As `ip netns exec`: the old sysfs out of the way if it can
                // be; where it cannot, the new one goes over it, read-only
                // if the old one is (a read-only mount cannot be shadowed
                // by a writable one).
                let mut flags = MsFlags::empty();
                if umount2("/sys", MntFlags::MNT_DETACH).is_err()
                    && nix::sys::statvfs::statvfs("/sys")
                        .is_ok_and(|v| v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY))
                {
                    flags |= MsFlags::MS_RDONLY;
                }
                mount(Some("sysfs"), "/sys", Some("sysfs"), flags, None::<&str>)
                    .map_err(|e| SysError::new(format!("mount sysfs of {} on /sys", self.path.display()), e))?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(SysError::new(
                    format!("thread in {}", self.path.display()),
                    std::io::Error::other("panicked"),
                ))
            })
        })
    }

    /// Moves the calling thread itself into this namespace (`setns`): the
    /// sockets it makes from now on are made here. For a thread of its own
    /// that makes sockets in several namespaces in turn, where a fresh
    /// thread per socket ([`NetNs::run`]) would stall it (the bots' event
    /// loop); any other caller wants [`NetNs::run`], which never changes
    /// the caller's namespace.
    pub fn enter_on_this_thread(&self) -> Result<(), SysError> {
        self.enter_this_thread()
    }

    fn enter_this_thread(&self) -> Result<(), SysError> {
        nix::sched::setns(&self.file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| SysError::new(format!("setns({})", self.path.display()), e))
    }
}

/// `name` under [`NETNS_DIR`], or `name` itself when it is a path.
pub fn path_of(name_or_path: &str) -> PathBuf {
    if name_or_path.contains('/') {
        PathBuf::from(name_or_path)
    } else {
        Path::new(NETNS_DIR).join(name_or_path)
    }
}

/// Writes a sysctl (`net.ipv4.ip_forward`) inside a namespace: /proc/sys/net
/// shows the namespace of the thread that opens it.
pub fn sysctl(ns: &NetNs, key: &str, value: &str) -> Result<(), SysError> {
    let path = format!("/proc/sys/{}", key.replace('.', "/"));
    ns.run(|| std::fs::write(&path, value))?
        .map_err(|e| SysError::new(format!("sysctl {key}={value} in {}", ns.path.display()), e))
}
