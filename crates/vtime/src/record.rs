//! The shared record (`shim/vtime_record.h`) and its seqlock, in safe Rust.
//!
//! Every field is an atomic, so the record can be read and written through a
//! shared reference while other processes do the same; the seqlock makes a
//! multi-field read consistent. Writers are serialised by a file lock held by
//! the caller (see [`crate::Domain::set_tdf`]).

use std::mem::{offset_of, size_of};
use std::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

use crate::model::{Divider, Segment, Tdf, Timeline, NBASES};

pub const MAGIC: u64 = 0x4452_4345_524d_5456; // "VTMRECRD" little-endian, as VTIME_MAGIC
pub const VERSION: u32 = 1;

/// Mirror of `struct vtime_record`.
#[repr(C)]
pub struct RawRecord {
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub size: AtomicU32,
    pub seq: AtomicU64,
    pub tdf_num: AtomicU64,
    pub tdf_den: AtomicU64,
    pub div_magic: AtomicU64,
    pub div_shift: AtomicU64,
    pub changes: AtomicU64,
    pub creator_pid: AtomicU32,
    pub flags: AtomicU32,
    pub epoch: [AtomicI64; NBASES],
    pub r0: [AtomicI64; NBASES],
    pub v0: [AtomicI64; NBASES],
}

// The same offsets the C header pins with _Static_assert.
const _: () = {
    assert!(offset_of!(RawRecord, magic) == 0);
    assert!(offset_of!(RawRecord, version) == 8);
    assert!(offset_of!(RawRecord, size) == 12);
    assert!(offset_of!(RawRecord, seq) == 16);
    assert!(offset_of!(RawRecord, tdf_num) == 24);
    assert!(offset_of!(RawRecord, tdf_den) == 32);
    assert!(offset_of!(RawRecord, div_magic) == 40);
    assert!(offset_of!(RawRecord, div_shift) == 48);
    assert!(offset_of!(RawRecord, changes) == 56);
    assert!(offset_of!(RawRecord, creator_pid) == 64);
    assert!(offset_of!(RawRecord, flags) == 68);
    assert!(offset_of!(RawRecord, epoch) == 72);
    assert!(offset_of!(RawRecord, r0) == 112);
    assert!(offset_of!(RawRecord, v0) == 152);
    assert!(size_of::<RawRecord>() == 192);
};

pub const RECORD_SIZE: usize = size_of::<RawRecord>();

/// The domain's factor is managed by the program that created it, which
/// changes more than the clock with it (a netlab lab re-rates its links):
/// `vtime set` refuses to change it alone unless forced.
/// (`VTIME_FLAG_MANAGED` in the C header.)
pub const FLAG_MANAGED: u32 = 1;

/// A consistent copy of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub timeline: Timeline,
    pub creator_pid: u32,
    /// [`FLAG_MANAGED`] and any later flags.
    pub flags: u32,
    pub changes: u64,
}

impl RawRecord {
    /// Whether the header says this is a record we understand.
    pub fn check(&self) -> Result<(), String> {
        let magic = self.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(format!("bad magic {magic:#x}"));
        }
        let v = self.version.load(Ordering::Relaxed);
        let s = self.size.load(Ordering::Relaxed);
        if v != VERSION || s as usize != RECORD_SIZE {
            return Err(format!(
                "version {v} size {s}, this build reads version {VERSION} size {RECORD_SIZE}"
            ));
        }
        Ok(())
    }

    /// Fills a fresh (zeroed, not yet visible) record; the magic is stored
    /// last so a reader never accepts a half-made one.
    pub fn init(&self, epochs: [i64; NBASES], tdf: Tdf, creator_pid: u32, flags: u32) {
        self.seq.store(0, Ordering::Relaxed);
        self.store_timeline(&Timeline::start(epochs, tdf));
        for (slot, e) in self.epoch.iter().zip(epochs) {
            slot.store(e, Ordering::Relaxed);
        }
        self.creator_pid.store(creator_pid, Ordering::Relaxed);
        self.flags.store(flags, Ordering::Relaxed);
        self.changes.store(0, Ordering::Relaxed);
        self.version.store(VERSION, Ordering::Relaxed);
        self.size.store(RECORD_SIZE as u32, Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// Stores the factor and every base's piece (not the epochs, which never change).
    fn store_timeline(&self, t: &Timeline) {
        let tdf = t.tdf();
        let d = Divider::new(tdf.num());
        self.tdf_num.store(tdf.num(), Ordering::Relaxed);
        self.tdf_den.store(tdf.den(), Ordering::Relaxed);
        self.div_magic.store(d.magic, Ordering::Relaxed);
        self.div_shift.store(d.shift, Ordering::Relaxed);
        for (i, seg) in t.segs.iter().enumerate() {
            self.r0[i].store(seg.r0, Ordering::Relaxed);
            self.v0[i].store(seg.v0, Ordering::Relaxed);
        }
    }

    /// Seqlock read: retries while a writer is active or was active meanwhile.
    pub fn snapshot(&self) -> Snapshot {
        loop {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let snap = self.load_fields();
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == s1 {
                return snap;
            }
        }
    }

    fn load_fields(&self) -> Snapshot {
        // A record is only ever written with a valid factor; fall back to 1
        // rather than divide by zero if the file was damaged.
        let tdf = Tdf::new(
            self.tdf_num.load(Ordering::Relaxed),
            self.tdf_den.load(Ordering::Relaxed),
        )
        .unwrap_or(Tdf::ONE);
        let epochs = std::array::from_fn(|i| self.epoch[i].load(Ordering::Relaxed));
        let segs = std::array::from_fn(|i| Segment {
            tdf,
            r0: self.r0[i].load(Ordering::Relaxed),
            v0: self.v0[i].load(Ordering::Relaxed),
        });
        Snapshot {
            timeline: Timeline { epochs, segs },
            creator_pid: self.creator_pid.load(Ordering::Relaxed),
            flags: self.flags.load(Ordering::Relaxed),
            changes: self.changes.load(Ordering::Relaxed),
        }
    }

    /// Seqlock write of a TDF change. The caller holds the writers' lock.
    ///
    /// The clocks are read (`now`) only after the odd sequence is globally
    /// visible (a full fence drains the store buffer), so a reader whose
    /// clock reading is later than the writer's sees the odd or new sequence
    /// and retries; the guard of [`Segment::rebase`] covers what the CPU
    /// reorders on the reader's side. Returns the new state.
    pub fn rebase(&self, tdf: Tdf, now: impl FnOnce() -> [i64; NBASES]) -> Snapshot {
        let cur = self.load_fields();
        let s = self.seq.load(Ordering::Relaxed);
        // An odd value means a writer died mid-update; continue from it.
        let odd = s | 1;
        self.seq.store(odd, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let timeline = cur.timeline.rebase(now(), tdf);
        self.store_timeline(&timeline);
        self.changes.fetch_add(1, Ordering::Relaxed);
        self.seq.store(odd.wrapping_add(1), Ordering::Release);
        Snapshot {
            timeline,
            creator_pid: cur.creator_pid,
            flags: cur.flags,
            changes: cur.changes + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClockBase, NS_PER_SEC, REBASE_GUARD_NS};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn blank() -> RawRecord {
        RawRecord {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            size: AtomicU32::new(0),
            seq: AtomicU64::new(0),
            tdf_num: AtomicU64::new(0),
            tdf_den: AtomicU64::new(0),
            div_magic: AtomicU64::new(0),
            div_shift: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            creator_pid: AtomicU32::new(0),
            flags: AtomicU32::new(0),
            epoch: Default::default(),
            r0: Default::default(),
            v0: Default::default(),
        }
    }

    #[test]
    fn init_check_and_rebase() {
        let r = blank();
        assert!(r.check().is_err(), "a zeroed record must be refused");
        let mut epochs = [0; NBASES];
        epochs[ClockBase::Monotonic as usize] = 100 * NS_PER_SEC;
        let four = Tdf::new(4, 1).unwrap();
        r.init(epochs, four, 7, 0);
        r.check().unwrap();
        let s = r.snapshot();
        assert_eq!(s.timeline, Timeline::start(epochs, four));
        assert_eq!(s.creator_pid, 7);
        // 8 s real later: 2 s virtual; change to TDF 2 (faster), so the
        // joint is placed one guard earlier.
        let mut now = epochs;
        for e in now.iter_mut() {
            *e += 8 * NS_PER_SEC;
        }
        let after = r.rebase(Tdf::new(2, 1).unwrap(), || now);
        let m = after.timeline.segs[ClockBase::Monotonic as usize];
        assert_eq!(m.r0, 8 * NS_PER_SEC - REBASE_GUARD_NS);
        assert_eq!(m.v0, 2 * NS_PER_SEC - REBASE_GUARD_NS / 4 + 1);
        assert_eq!(r.snapshot(), after);
        assert_eq!(r.seq.load(Ordering::Relaxed) % 2, 0);
        assert_eq!(after.changes, 1);
        assert_eq!(after.timeline.tdf(), Tdf::new(2, 1).unwrap());
    }

    /// Readers racing a writer always see one of the states the writer
    /// published, never a mix.
    #[test]
    fn seqlock_readers_never_see_torn_state() {
        let r = Arc::new(blank());
        r.init([0; NBASES], Tdf::ONE, 1, 0);
        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (r, stop) = (r.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) || n < 1000 {
                    let s = r.snapshot();
                    // The writer below rebases at "now" = tdf * 1_000_000 on
                    // every base, so r0 is that plus or minus the guard.
                    let t = s.timeline.tdf().num() as i64 * 1_000_000;
                    for seg in s.timeline.segs {
                        assert!(seg.r0 == 0 || (seg.r0 - t).abs() <= REBASE_GUARD_NS, "torn: {s:?}");
                    }
                    n += 1;
                }
            })
        };
        for i in 0..20_000u64 {
            let tdf = Tdf::new(1 + i % 50, 1).unwrap();
            r.rebase(tdf, || [tdf.num() as i64 * 1_000_000; NBASES]);
        }
        stop.store(true, Ordering::Relaxed);
        reader.join().unwrap();
    }
}
