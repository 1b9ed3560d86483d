/*
 * What the vtime shim's two files share: the real functions (resolved once),
 * the domain's record, and the clock model that maps real time to virtual
 * time and back. vtime_shim.c defines the state and interposes clock reads,
 * sleeps, polls and timed waits; vtime_timers.c interposes kernel timers,
 * socket timeouts and timestamps, io_uring set-up and syscall(). Every symbol
 * here is hidden (the shim is built with -fvisibility=hidden): only the
 * EXPORTed interposers are seen by the program.
 */
#ifndef VTIME_SHIM_H
#define VTIME_SHIM_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "vtime_record.h"


#define EXPORT __attribute__((visibility("default")))
#if defined(__x86_64__) || defined(__i386__)
#define cpu_relax() __builtin_ia32_pause()
#else
#define cpu_relax() __asm__ __volatile__("" ::: "memory")
#endif
#define NS_PER_SEC 1000000000LL
/* Longest real-time wait between two readings of the record. */
#define SLICE_NS 50000000LL

#ifndef SO_TIMESTAMP_NEW
#define SO_TIMESTAMP_NEW 63
#endif
#ifndef SO_TIMESTAMPNS_NEW
#define SO_TIMESTAMPNS_NEW 64
#endif
#ifndef SO_TIMESTAMPING_NEW
#define SO_TIMESTAMPING_NEW 65
#endif
#ifndef SO_RCVTIMEO_NEW
#define SO_RCVTIMEO_NEW 66
#endif
#ifndef SO_SNDTIMEO_NEW
#define SO_SNDTIMEO_NEW 67
#endif
#define VT_SO_RCVTIMEO_OLD 20
#define VT_SO_SNDTIMEO_OLD 21
#define VT_SO_TIMESTAMP_OLD 29
#define VT_SO_TIMESTAMPNS_OLD 35
#define VT_SO_TIMESTAMPING_OLD 37

/* ---------------------------------------------------------------- real functions */

extern int (*r_clock_gettime)(clockid_t, struct timespec *);
extern int (*r_gettimeofday)(struct timeval *, void *);
extern time_t (*r_time)(time_t *);
extern int (*r_timespec_get)(struct timespec *, int);
extern int (*r_nanosleep)(const struct timespec *, struct timespec *);
extern int (*r_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
extern int (*r_usleep)(useconds_t);
extern unsigned (*r_sleep)(unsigned);
extern int (*r_poll)(struct pollfd *, nfds_t, int);
extern int (*r_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
extern int (*r_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
extern int (*r_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
extern int (*r_epoll_wait)(int, struct epoll_event *, int, int);
extern int (*r_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
extern int (*r_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
extern int (*r_timerfd_create)(int, int);
extern int (*r_timerfd_settime)(int, int, const struct itimerspec *, struct itimerspec *);
extern int (*r_timerfd_gettime)(int, struct itimerspec *);
extern int (*r_timer_create)(clockid_t, struct sigevent *, timer_t *);
extern int (*r_timer_settime)(timer_t, int, const struct itimerspec *, struct itimerspec *);
extern int (*r_timer_gettime)(timer_t, struct itimerspec *);
extern unsigned (*r_alarm)(unsigned);
extern int (*r_setitimer)(__itimer_which_t, const struct itimerval *, struct itimerval *);
extern int (*r_getitimer)(__itimer_which_t, struct itimerval *);
extern int (*r_cond_init)(pthread_cond_t *, const pthread_condattr_t *);
extern int (*r_cond_destroy)(pthread_cond_t *);
extern int (*r_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
extern int (*r_cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
extern int (*r_sem_timedwait)(sem_t *, const struct timespec *);
extern int (*r_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);
extern int (*r_mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
extern int (*r_mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);
extern int (*r_sigtimedwait)(const sigset_t *, siginfo_t *, const struct timespec *);
extern int (*r_setsockopt)(int, int, int, const void *, socklen_t);
extern int (*r_getsockopt)(int, int, int, void *, socklen_t *);
extern ssize_t (*r_recvmsg)(int, struct msghdr *, int);
extern int (*r_recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
extern long (*r_syscall)(long, ...);
extern int (*r_io_uring_queue_init_params)(unsigned, void *, void *);
extern int (*r_io_uring_queue_init)(unsigned, void *, unsigned);

extern const struct vtime_record *rec; /* NULL: no domain, pass through */
extern int ready;
extern pthread_once_t once;
/* Set on the thread running resolve_all: a call of ours made from inside it
 * (dlsym allocates when a symbol is missing, and an allocator such as
 * jemalloc reads the clock and makes raw system calls) must not wait on the
 * pthread_once that thread holds. */
extern __thread int resolving;

/* Resolves the real functions and attaches the record (once). */
void resolve_all(void);

static inline void ensure(void) {
    if (__builtin_expect(!__atomic_load_n(&ready, __ATOMIC_ACQUIRE), 0) && !resolving)
        pthread_once(&once, resolve_all);
}

/* Symbols a C library or program may lack, resolved at their first use
 * rather than at start (see resolve_optional in vtime_shim.c). */
extern pthread_once_t once_optional;
void resolve_optional(void);
static inline void ensure_optional(void) {
    ensure();
    pthread_once(&once_optional, resolve_optional);
}

static inline void warn_once(int *flag, const char *msg) {
    if (!__atomic_exchange_n(flag, 1, __ATOMIC_RELAXED))
        fprintf(stderr, "vtime: %s\n", msg);
}

/* ---------------------------------------------------------------- clock model */

struct seg {
    uint64_t num, den, magic, shift;
    int64_t r0, v0, epoch;
};

static inline int64_t clamp128(__int128 v) {
    if (v > INT64_MAX)
        return INT64_MAX;
    if (v < INT64_MIN)
        return INT64_MIN;
    return (int64_t)v;
}

/* n / d with the record's precomputed multiplier (see vtime_record.h). */
static inline uint64_t div_magic(uint64_t n, const struct seg *s) {
    if (s->num <= 1)
        return n;
    uint64_t t = (uint64_t)(((unsigned __int128)s->magic * n) >> 64);
    return (t + ((n - t) >> 1)) >> s->shift;
}

/* floor(a * m / d); a zero d (a damaged record) divides by 1. */
static inline int64_t mul_div_floor(int64_t a, uint64_t m, uint64_t d) {
    if (d == 0)
        d = 1;
    __int128 p = (__int128)a * (__int128)m;
    __int128 q = p / (__int128)d;
    if (p % (__int128)d != 0 && p < 0)
        q -= 1;
    return clamp128(q);
}

static inline int64_t mul_div_ceil(int64_t a, uint64_t m, uint64_t d) {
    if (a == INT64_MIN)
        return INT64_MIN;
    return -mul_div_floor(-a, m, d);
}

static inline int64_t ts2ns(const struct timespec *t) { return (int64_t)t->tv_sec * NS_PER_SEC + t->tv_nsec; }

static inline struct timespec ns2ts(int64_t ns) {
    struct timespec t;
    t.tv_sec = ns / NS_PER_SEC;
    t.tv_nsec = ns % NS_PER_SEC;
    if (t.tv_nsec < 0) {
        t.tv_nsec += NS_PER_SEC;
        t.tv_sec -= 1;
    }
    return t;
}

static inline int64_t tv2ns(const struct timeval *t) { return (int64_t)t->tv_sec * NS_PER_SEC + (int64_t)t->tv_usec * 1000; }

static inline struct timeval ns2tv(int64_t ns) {
    struct timespec t = ns2ts(ns);
    struct timeval v = {t.tv_sec, t.tv_nsec / 1000};
    return v;
}

static inline int valid_ts(const struct timespec *t) { return t->tv_nsec >= 0 && t->tv_nsec < NS_PER_SEC; }

/* The base a clock id is dilated on, or -1 for clocks that stay real (CPU clocks). */
static inline int base_of(clockid_t id) {
    switch (id) {
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
    case CLOCK_REALTIME_ALARM:
        return VTIME_BASE_REALTIME;
    case CLOCK_MONOTONIC:
    case CLOCK_MONOTONIC_COARSE:
        return VTIME_BASE_MONOTONIC;
    case CLOCK_BOOTTIME:
    case CLOCK_BOOTTIME_ALARM:
        return VTIME_BASE_BOOTTIME;
    case CLOCK_MONOTONIC_RAW:
        return VTIME_BASE_MONOTONIC_RAW;
    case CLOCK_TAI:
        return VTIME_BASE_TAI;
    default:
        return -1;
    }
}

/*
 * Reads the segment and the real clock inside one seqlock window, so a value
 * read after a rebase is never combined with the segment before it (which
 * could make the clock step back by the width of the window).
 */
static inline __attribute__((always_inline)) int read_clock(clockid_t id, int base, struct seg *s,
                                                            int64_t *real) {
    for (;;) {
        uint64_t s1 = __atomic_load_n(&rec->seq, __ATOMIC_ACQUIRE);
        if (s1 & 1) {
            cpu_relax();
            continue;
        }
        /* The clock first: the vDSO orders its TSC read after every earlier
           load, so loading the record before it would add their latency. */
        struct timespec t;
        int rc = r_clock_gettime(id, &t);
        s->num = __atomic_load_n(&rec->tdf_num, __ATOMIC_RELAXED);
        s->den = __atomic_load_n(&rec->tdf_den, __ATOMIC_RELAXED);
        s->magic = __atomic_load_n(&rec->div_magic, __ATOMIC_RELAXED);
        s->shift = __atomic_load_n(&rec->div_shift, __ATOMIC_RELAXED);
        s->r0 = __atomic_load_n(&rec->r0[base], __ATOMIC_RELAXED);
        s->v0 = __atomic_load_n(&rec->v0[base], __ATOMIC_RELAXED);
        s->epoch = __atomic_load_n(&rec->epoch[base], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&rec->seq, __ATOMIC_RELAXED) != s1)
            continue;
        if (rc != 0)
            return rc;
        *real = ts2ns(&t);
        return 0;
    }
}

static inline int64_t virt_of(const struct seg *s, int64_t real) {
    int64_t x = real - s->epoch - s->r0;
    if (__builtin_expect(x >= 0, 1)) {
        /* The hot path of every clock read: x * den / num without a divide
           instruction while the product fits in 63 bits. */
        if (s->den == 1)
            return s->epoch + s->v0 + (int64_t)div_magic((uint64_t)x, s);
        unsigned __int128 p = (unsigned __int128)(uint64_t)x * s->den;
        if ((uint64_t)(p >> 63) == 0)
            return s->epoch + s->v0 + (int64_t)div_magic((uint64_t)p, s);
    }
    return s->epoch + s->v0 + mul_div_floor(x, s->den, s->num);
}

/* The earliest real time at which the virtual clock reaches `virt`. */
static inline int64_t real_of(const struct seg *s, int64_t virt) {
    return s->epoch + s->r0 + mul_div_ceil(virt - s->epoch - s->v0, s->num, s->den);
}

static inline int64_t vnow(clockid_t id) {
    struct seg s;
    int64_t real;
    if (read_clock(id, base_of(id), &s, &real) != 0)
        return 0;
    return virt_of(&s, real);
}

static inline void cur_tdf(uint64_t *num, uint64_t *den) {
    struct seg s;
    int64_t real;
    read_clock(CLOCK_MONOTONIC, VTIME_BASE_MONOTONIC, &s, &real);
    *num = s.num;
    *den = s.den;
}

static inline int64_t v2r_dur(int64_t d) {
    uint64_t n, m;
    cur_tdf(&n, &m);
    return mul_div_ceil(d, n, m);
}

static inline int64_t r2v_dur(int64_t d) {
    uint64_t n, m;
    cur_tdf(&n, &m);
    return mul_div_floor(d, m, n);
}

/*
 * Real nanoseconds to wait before the virtual clock `id` reaches `vdl`,
 * capped at SLICE_NS; 0 once it has.
 */
static inline int64_t next_slice(clockid_t id, int64_t vdl) {
    struct seg s;
    int64_t real;
    if (read_clock(id, base_of(id), &s, &real) != 0)
        return 0;
    if (virt_of(&s, real) >= vdl)
        return 0;
    int64_t r = real_of(&s, vdl) - real;
    if (r < 1)
        r = 1;
    return r < SLICE_NS ? r : SLICE_NS;
}

static inline int64_t vdeadline_rel(int64_t dur) { return vnow(CLOCK_MONOTONIC) + dur; }

/* An absolute real CLOCK_MONOTONIC deadline `slice` ns from now. */
static inline struct timespec real_mono_in(int64_t slice) {
    struct timespec t;
    r_clock_gettime(CLOCK_MONOTONIC, &t);
    return ns2ts(ts2ns(&t) + slice);
}

static inline int active(void) {
    ensure();
    return rec != NULL;
}

#endif /* VTIME_SHIM_H */
