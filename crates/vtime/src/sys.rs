//! Everything that touches raw memory or makes a call nix does not wrap
//! safely: the shared mapping of a record, and loading the shim to check it.
//!
//! Safety contract: the mapping is created, handed out as `&RawRecord` (all
//! atomics, so concurrent writers in other processes are defined behaviour)
//! for no longer than it lives, and unmapped once; `dlopen`'s handle is
//! closed before returning and nothing from the library is used.
#![expect(
    unsafe_code,
    reason = "the fenced unsafe layer: each unsafe block states its contract"
)]

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;

use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use nix::time::{clock_gettime, ClockId};

use crate::model::{ClockBase, NBASES};
use crate::record::{RawRecord, RECORD_SIZE};

/// Bytes mapped for a record: one page, of which the record uses the start.
pub const MAP_LEN: usize = 4096;
const _: () = assert!(RECORD_SIZE <= MAP_LEN);

/// A shared, writable mapping of a record file.
pub struct Mapping {
    ptr: NonNull<libc::c_void>,
    len: NonZeroUsize,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics.
unsafe impl Send for Mapping {}
// SAFETY: as above; `record()` hands out shared references to atomics only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `MAP_LEN` bytes of `file` shared and writable. The file
    /// must be at least that long (the caller sizes or checks it).
    pub fn new(file: &File) -> io::Result<Mapping> {
        let len = NonZeroUsize::new(MAP_LEN).expect("MAP_LEN is not zero");
        // SAFETY: a fresh mapping chosen by the kernel (no address hint), so it
        // aliases no Rust object; the file is at least `len` bytes long.
        let ptr = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                file,
                0,
            )
        }
        .map_err(io::Error::from)?;
        Ok(Mapping { ptr, len })
    }

    /// The record at offset 0.
    ///
    /// Contract: the mapping is page-aligned (so aligned for the record) and
    /// at least `RECORD_SIZE` long, and lives as long as `self`. Every field
    /// of `RawRecord` is an atomic, so other processes writing the same
    /// memory concurrently is defined behaviour. A process that shrinks the
    /// file under us would make an access fault (SIGBUS); only vtime writes
    /// these files, and it never shrinks them.
    pub fn record(&self) -> &RawRecord {
        // SAFETY: see the contract above.
        unsafe { self.ptr.cast::<RawRecord>().as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own this mapping; no reference from `record()` outlives
        // `self` (they borrow it).
        let _ = unsafe { munmap(self.ptr, self.len.get()) };
    }
}

/// Current real value of a clock base, in ns.
pub fn now_ns(base: ClockBase) -> i64 {
    let id = match base {
        ClockBase::Realtime => ClockId::CLOCK_REALTIME,
        ClockBase::Monotonic => ClockId::CLOCK_MONOTONIC,
        ClockBase::Boottime => ClockId::CLOCK_BOOTTIME,
        ClockBase::MonotonicRaw => ClockId::CLOCK_MONOTONIC_RAW,
        ClockBase::Tai => ClockId::CLOCK_TAI,
    };
    // These clocks exist on every Linux this crate supports; a failure would
    // be a kernel bug, so fall back to 0 rather than abort a controller.
    clock_gettime(id)
        .map(|t| t.tv_sec() * 1_000_000_000 + t.tv_nsec())
        .unwrap_or(0)
}

/// Every base's real value now.
pub fn now_all() -> [i64; NBASES] {
    ClockBase::ALL.map(now_ns)
}

/// Whether process `pid` exists (signal 0).
pub fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// Loads the shim with `dlopen(RTLD_NOW | RTLD_LOCAL)` and unloads it, to
/// find out before starting a program whether the dynamic loader can use it
/// (ld.so only prints a warning and runs the program undilated when an
/// LD_PRELOAD object cannot be loaded). RTLD_LOCAL keeps its symbols from
/// interposing on this process.
pub fn check_loadable(path: &Path) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| "path contains a NUL byte".to_string())?;
    // SAFETY: `c` is a valid C string. The shim's constructor only resolves
    // symbols and maps the record named by VTIME_RECORD, if any.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns NULL or a valid C string owned by libc,
        // copied before any other dl call.
        let msg = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown dlopen error".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        return Err(msg);
    }
    // SAFETY: `h` came from dlopen above and nothing from it is in use.
    unsafe { libc::dlclose(h) };
    Ok(())
}
