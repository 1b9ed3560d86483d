/*
 * The shared clock record of a vtime clock domain.
 *
 * One record per domain lives at offset 0 of a shared-memory file (by default
 * /dev/shm/vtime-NAME.rec). The controller (the `vtime` binary or a launcher
 * using the Rust library) writes it; every dilated process maps it read-only
 * and reads it with a seqlock, so readers never take a lock and never block
 * the writer.
 *
 * Virtual time is piecewise linear in real time. For a clock base c (see
 * VTIME_BASE_*), with x = real_c - epoch[c] the real nanoseconds elapsed since
 * the domain was created:
 *
 *     virtual_c = epoch[c] + v0[c] + floor((x - r0[c]) * tdf_den / tdf_num)
 *
 * and a TDF change rebases each base's (r0, v0) to the moment of the change,
 * so every virtual clock stays continuous and monotonic across changes.
 *
 * The layout is mirrored by `RawRecord` in the Rust crate; both sides pin
 * every offset at compile time, so a change on one side alone fails the build.
 */
#ifndef VTIME_RECORD_H
#define VTIME_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define VTIME_MAGIC 0x44524345524d5456ULL /* "VTMRECRD" little-endian */
#define VTIME_VERSION 1u

/* Clock bases: each dilated clock id maps to one of these. */
#define VTIME_BASE_REALTIME 0      /* CLOCK_REALTIME, _COARSE, _ALARM */
#define VTIME_BASE_MONOTONIC 1     /* CLOCK_MONOTONIC, _COARSE */
#define VTIME_BASE_BOOTTIME 2      /* CLOCK_BOOTTIME, _ALARM */
#define VTIME_BASE_MONOTONIC_RAW 3 /* CLOCK_MONOTONIC_RAW */
#define VTIME_BASE_TAI 4           /* CLOCK_TAI */
#define VTIME_NBASES 5
/* The domain's factor is managed by the program that created it, which
   changes more than the clock with it (a netlab lab re-rates its links):
   `vtime set` refuses to change it alone unless forced. */
#define VTIME_FLAG_MANAGED 1u

struct vtime_record {
    uint64_t magic;     /* VTIME_MAGIC once the record is initialised */
    uint32_t version;   /* VTIME_VERSION */
    uint32_t size;      /* sizeof(struct vtime_record) */
    uint64_t seq;       /* seqlock sequence: odd while the writer updates */
    uint64_t tdf_num;   /* TDF = tdf_num / tdf_den, both > 0 */
    uint64_t tdf_den;
    /* Division by tdf_num as a multiply and shifts (Granlund-Montgomery, round-up
       variant), so a clock read costs no divide instruction:
       q = (t + ((n - t) >> 1)) >> div_shift with t = (div_magic * n) >> 64,
       exact for every 64-bit n when tdf_num >= 2; tdf_num == 1 divides by nothing. */
    uint64_t div_magic;
    uint64_t div_shift;
    uint64_t changes;     /* number of TDF changes since creation */
    uint32_t creator_pid; /* the process that created the domain */
    uint32_t flags;       /* VTIME_FLAG_*; the clock reads ignore them */
    int64_t epoch[VTIME_NBASES]; /* each base's real value at creation, ns */
    /* Each base's current piece: real and virtual ns since creation at its
       start. One piece per base, because the bases do not tick together. */
    int64_t r0[VTIME_NBASES];
    int64_t v0[VTIME_NBASES];
};

_Static_assert(offsetof(struct vtime_record, magic) == 0, "layout");
_Static_assert(offsetof(struct vtime_record, version) == 8, "layout");
_Static_assert(offsetof(struct vtime_record, size) == 12, "layout");
_Static_assert(offsetof(struct vtime_record, seq) == 16, "layout");
_Static_assert(offsetof(struct vtime_record, tdf_num) == 24, "layout");
_Static_assert(offsetof(struct vtime_record, tdf_den) == 32, "layout");
_Static_assert(offsetof(struct vtime_record, div_magic) == 40, "layout");
_Static_assert(offsetof(struct vtime_record, div_shift) == 48, "layout");
_Static_assert(offsetof(struct vtime_record, changes) == 56, "layout");
_Static_assert(offsetof(struct vtime_record, creator_pid) == 64, "layout");
_Static_assert(offsetof(struct vtime_record, flags) == 68, "layout");
_Static_assert(offsetof(struct vtime_record, epoch) == 72, "layout");
_Static_assert(offsetof(struct vtime_record, r0) == 112, "layout");
_Static_assert(offsetof(struct vtime_record, v0) == 152, "layout");
_Static_assert(sizeof(struct vtime_record) == 192, "layout");

#endif
