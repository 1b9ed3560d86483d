/*
 * vtime LD_PRELOAD shim: every way a dynamically linked program reads time or
 * waits for it is seen through the virtual clock of one clock domain.
 *
 * The domain's record (vtime_record.h) is named by VTIME_RECORD in the
 * environment. Without it the shim passes every call through unchanged.
 *
 * Design notes (why, not what):
 * - glibc reads the clock from the vDSO without a system call, so the shim
 *   interposes the public symbols (clock_gettime, gettimeofday, time, ...).
 *   The real functions are resolved once with dlsym(RTLD_NEXT) under
 *   pthread_once; a call that arrives before our constructor ran (another
 *   library's constructor) resolves them on the spot.
 * - Waits are done in bounded real-time slices (SLICE_NS) against a virtual
 *   deadline, re-reading the record between slices, so a wait in progress
 *   follows a TDF change and ends at the right real time.
 * - Programs that compute an absolute deadline from the (dilated) clock and
 *   hand it to the kernel (futex waits from Rust std and tokio through
 *   syscall(), pthread_cond_clockwait, sem_clockwait) are converted too:
 *   undilated, such a deadline lies in the real past and the wait spins.
 * - Process and thread CPU-time clocks are not dilated: they count CPU the
 *   process consumed, they do not advance while it waits, and the kernel's
 *   own accounting (getrusage, /proc, RLIMIT_CPU) reports the same real
 *   figures; dilating them would make those disagree and hide real load.
 *   ITIMER_VIRTUAL/ITIMER_PROF count CPU time too and stay real likewise.
 * - Kernel timers armed once (timerfd, POSIX timers, alarm, setitimer,
 *   SO_RCVTIMEO/SO_SNDTIMEO) are converted when armed and keep that factor
 *   if the TDF changes afterwards.
 */
#define _GNU_SOURCE
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

static int (*r_clock_gettime)(clockid_t, struct timespec *);
static int (*r_gettimeofday)(struct timeval *, void *);
static time_t (*r_time)(time_t *);
static int (*r_timespec_get)(struct timespec *, int);
static int (*r_nanosleep)(const struct timespec *, struct timespec *);
static int (*r_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
static int (*r_usleep)(useconds_t);
static unsigned (*r_sleep)(unsigned);
static int (*r_poll)(struct pollfd *, nfds_t, int);
static int (*r_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
static int (*r_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
static int (*r_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
static int (*r_epoll_wait)(int, struct epoll_event *, int, int);
static int (*r_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
static int (*r_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
static int (*r_timerfd_create)(int, int);
static int (*r_timerfd_settime)(int, int, const struct itimerspec *, struct itimerspec *);
static int (*r_timerfd_gettime)(int, struct itimerspec *);
static int (*r_timer_create)(clockid_t, struct sigevent *, timer_t *);
static int (*r_timer_settime)(timer_t, int, const struct itimerspec *, struct itimerspec *);
static int (*r_timer_gettime)(timer_t, struct itimerspec *);
static unsigned (*r_alarm)(unsigned);
static int (*r_setitimer)(__itimer_which_t, const struct itimerval *, struct itimerval *);
static int (*r_getitimer)(__itimer_which_t, struct itimerval *);
static int (*r_cond_init)(pthread_cond_t *, const pthread_condattr_t *);
static int (*r_cond_destroy)(pthread_cond_t *);
static int (*r_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
static int (*r_cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
static int (*r_sem_timedwait)(sem_t *, const struct timespec *);
static int (*r_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);
static int (*r_mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
static int (*r_mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);
static int (*r_sigtimedwait)(const sigset_t *, siginfo_t *, const struct timespec *);
static int (*r_setsockopt)(int, int, int, const void *, socklen_t);
static int (*r_getsockopt)(int, int, int, void *, socklen_t *);
static ssize_t (*r_recvmsg)(int, struct msghdr *, int);
static int (*r_recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
static long (*r_syscall)(long, ...);
static int (*r_io_uring_queue_init_params)(unsigned, void *, void *);
static int (*r_io_uring_queue_init)(unsigned, void *, unsigned);

static const struct vtime_record *rec; /* NULL: no domain, pass through */
static int ready;
static pthread_once_t once = PTHREAD_ONCE_INIT;

#define RESOLVE(var, name) (var = (__typeof__(var))dlsym(RTLD_NEXT, name))

static void attach_record(void) {
    const char *path = getenv("VTIME_RECORD");
    if (path == NULL || path[0] == '\0')
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "vtime: cannot open clock record %s: %s; this process runs in REAL time\n",
                path, strerror(errno));
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(struct vtime_record)) {
        fprintf(stderr, "vtime: clock record %s is too short; this process runs in REAL time\n", path);
        close(fd);
        return;
    }
    void *p = mmap(NULL, sizeof(struct vtime_record), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "vtime: cannot map clock record %s: %s; this process runs in REAL time\n",
                path, strerror(errno));
        return;
    }
    const struct vtime_record *r = p;
    if (__atomic_load_n(&r->magic, __ATOMIC_ACQUIRE) != VTIME_MAGIC || r->version != VTIME_VERSION ||
        r->size != sizeof(struct vtime_record)) {
        fprintf(stderr, "vtime: %s is not a version-%u clock record; this process runs in REAL time\n",
                path, VTIME_VERSION);
        munmap(p, sizeof(struct vtime_record));
        return;
    }
    rec = r;
}

static void resolve_all(void) {
    RESOLVE(r_clock_gettime, "clock_gettime");
    RESOLVE(r_gettimeofday, "gettimeofday");
    RESOLVE(r_time, "time");
    RESOLVE(r_timespec_get, "timespec_get");
    RESOLVE(r_nanosleep, "nanosleep");
    RESOLVE(r_clock_nanosleep, "clock_nanosleep");
    RESOLVE(r_usleep, "usleep");
    RESOLVE(r_sleep, "sleep");
    RESOLVE(r_poll, "poll");
    RESOLVE(r_ppoll, "ppoll");
    RESOLVE(r_select, "select");
    RESOLVE(r_pselect, "pselect");
    RESOLVE(r_epoll_wait, "epoll_wait");
    RESOLVE(r_epoll_pwait, "epoll_pwait");
    RESOLVE(r_epoll_pwait2, "epoll_pwait2");
    RESOLVE(r_timerfd_create, "timerfd_create");
    RESOLVE(r_timerfd_settime, "timerfd_settime");
    RESOLVE(r_timerfd_gettime, "timerfd_gettime");
    RESOLVE(r_timer_create, "timer_create");
    RESOLVE(r_timer_settime, "timer_settime");
    RESOLVE(r_timer_gettime, "timer_gettime");
    RESOLVE(r_alarm, "alarm");
    RESOLVE(r_setitimer, "setitimer");
    RESOLVE(r_getitimer, "getitimer");
    RESOLVE(r_cond_init, "pthread_cond_init");
    RESOLVE(r_cond_destroy, "pthread_cond_destroy");
    RESOLVE(r_cond_timedwait, "pthread_cond_timedwait");
    RESOLVE(r_cond_clockwait, "pthread_cond_clockwait");
    RESOLVE(r_sem_timedwait, "sem_timedwait");
    RESOLVE(r_sem_clockwait, "sem_clockwait");
    RESOLVE(r_mutex_timedlock, "pthread_mutex_timedlock");
    RESOLVE(r_mutex_clocklock, "pthread_mutex_clocklock");
    RESOLVE(r_sigtimedwait, "sigtimedwait");
    RESOLVE(r_setsockopt, "setsockopt");
    RESOLVE(r_getsockopt, "getsockopt");
    RESOLVE(r_recvmsg, "recvmsg");
    RESOLVE(r_recvmmsg, "recvmmsg");
    RESOLVE(r_syscall, "syscall");
    RESOLVE(r_io_uring_queue_init_params, "io_uring_queue_init_params");
    RESOLVE(r_io_uring_queue_init, "io_uring_queue_init");
    attach_record();
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

static inline void ensure(void) {
    if (__builtin_expect(!__atomic_load_n(&ready, __ATOMIC_ACQUIRE), 0))
        pthread_once(&once, resolve_all);
}

__attribute__((constructor)) static void vtime_ctor(void) { ensure(); }

static void warn_once(int *flag, const char *msg) {
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
static int64_t mul_div_floor(int64_t a, uint64_t m, uint64_t d) {
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

static int64_t vnow(clockid_t id) {
    struct seg s;
    int64_t real;
    if (read_clock(id, base_of(id), &s, &real) != 0)
        return 0;
    return virt_of(&s, real);
}

static void cur_tdf(uint64_t *num, uint64_t *den) {
    struct seg s;
    int64_t real;
    read_clock(CLOCK_MONOTONIC, VTIME_BASE_MONOTONIC, &s, &real);
    *num = s.num;
    *den = s.den;
}

static int64_t v2r_dur(int64_t d) {
    uint64_t n, m;
    cur_tdf(&n, &m);
    return mul_div_ceil(d, n, m);
}

static int64_t r2v_dur(int64_t d) {
    uint64_t n, m;
    cur_tdf(&n, &m);
    return mul_div_floor(d, m, n);
}

/*
 * Real nanoseconds to wait before the virtual clock `id` reaches `vdl`,
 * capped at SLICE_NS; 0 once it has.
 */
static int64_t next_slice(clockid_t id, int64_t vdl) {
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
static struct timespec real_mono_in(int64_t slice) {
    struct timespec t;
    r_clock_gettime(CLOCK_MONOTONIC, &t);
    return ns2ts(ts2ns(&t) + slice);
}

static inline int active(void) {
    ensure();
    return rec != NULL;
}

/* ---------------------------------------------------------------- clock reads */

EXPORT int clock_gettime(clockid_t id, struct timespec *ts) {
    ensure();
    int b = base_of(id);
    if (rec == NULL || b < 0)
        return r_clock_gettime(id, ts);
    struct seg s;
    int64_t real;
    int rc = read_clock(id, b, &s, &real);
    if (rc != 0)
        return rc;
    *ts = ns2ts(virt_of(&s, real));
    return 0;
}

EXPORT int gettimeofday(struct timeval *tv, void *tz) {
    /* glibc declares tv nonnull, so a NULL check here would be compiled away. */
    if (!active())
        return r_gettimeofday(tv, tz);
    if (tz != NULL)
        r_gettimeofday(NULL, tz);
    *tv = ns2tv(vnow(CLOCK_REALTIME));
    return 0;
}

EXPORT time_t time(time_t *t) {
    if (!active())
        return r_time(t);
    struct timespec ts = ns2ts(vnow(CLOCK_REALTIME));
    if (t != NULL)
        *t = ts.tv_sec;
    return ts.tv_sec;
}

EXPORT int timespec_get(struct timespec *ts, int base) {
    if (!active() || base != TIME_UTC)
        return r_timespec_get(ts, base);
    *ts = ns2ts(vnow(CLOCK_REALTIME));
    return base;
}

/* ---------------------------------------------------------------- sleeps */

/*
 * Sleeps until virtual clock `id` reaches `vdl`. Returns 0 or an errno value;
 * on EINTR stores the virtual time left in *rem (if given).
 */
static int sleep_until(clockid_t id, int64_t vdl, struct timespec *rem) {
    for (;;) {
        int64_t sl = next_slice(id, vdl);
        if (sl == 0)
            return 0;
        struct timespec t = ns2ts(sl);
        int e = r_clock_nanosleep(CLOCK_MONOTONIC, 0, &t, NULL);
        if (e == EINTR && rem != NULL) {
            int64_t left = vdl - vnow(id);
            *rem = ns2ts(left > 0 ? left : 0);
        }
        if (e != 0)
            return e;
    }
}

EXPORT int clock_nanosleep(clockid_t id, int flags, const struct timespec *req, struct timespec *rem) {
    if (!active() || base_of(id) < 0 || req == NULL || !valid_ts(req))
        return r_clock_nanosleep(id, flags, req, rem);
    if (flags & TIMER_ABSTIME)
        return sleep_until(id, ts2ns(req), NULL);
    return sleep_until(id, vnow(id) + ts2ns(req), rem);
}

EXPORT int nanosleep(const struct timespec *req, struct timespec *rem) {
    if (!active() || req == NULL || !valid_ts(req) || req->tv_sec < 0)
        return r_nanosleep(req, rem);
    int e = sleep_until(CLOCK_MONOTONIC, vdeadline_rel(ts2ns(req)), rem);
    if (e != 0) {
        errno = e;
        return -1;
    }
    return 0;
}

EXPORT int usleep(useconds_t us) {
    if (!active())
        return r_usleep(us);
    int e = sleep_until(CLOCK_MONOTONIC, vdeadline_rel((int64_t)us * 1000), NULL);
    if (e != 0) {
        errno = e;
        return -1;
    }
    return 0;
}

EXPORT unsigned sleep(unsigned secs) {
    if (!active())
        return r_sleep(secs);
    struct timespec rem = {0, 0};
    if (sleep_until(CLOCK_MONOTONIC, vdeadline_rel((int64_t)secs * NS_PER_SEC), &rem) == 0)
        return 0;
    return (unsigned)rem.tv_sec + (rem.tv_nsec > 0);
}

/* ---------------------------------------------------------------- poll family */

static int ppoll_v(struct pollfd *fds, nfds_t n, int64_t vdl, const sigset_t *mask) {
    for (;;) {
        int64_t sl = next_slice(CLOCK_MONOTONIC, vdl);
        if (sl == 0)
            return 0;
        struct timespec t = ns2ts(sl);
        int rc = r_ppoll(fds, n, &t, mask);
        if (rc != 0)
            return rc;
    }
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout_ms) {
    if (!active() || timeout_ms <= 0)
        return r_poll(fds, n, timeout_ms);
    return ppoll_v(fds, n, vdeadline_rel((int64_t)timeout_ms * 1000000), NULL);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *tmo, const sigset_t *mask) {
    if (!active() || tmo == NULL || !valid_ts(tmo) || ts2ns(tmo) <= 0)
        return r_ppoll(fds, n, tmo, mask);
    return ppoll_v(fds, n, vdeadline_rel(ts2ns(tmo)), mask);
}

/* select() clears the sets on timeout, so each slice starts from a saved copy. */
static int pselect_v(int n, fd_set *r, fd_set *w, fd_set *e, int64_t vdl, const sigset_t *mask,
                     struct timeval *tv_out) {
    size_t bytes = n <= 0 ? 0 : ((size_t)n + 7) / 8;
    if (bytes > sizeof(fd_set))
        bytes = sizeof(fd_set);
    fd_set sr, sw, se;
    if (r)
        memcpy(&sr, r, bytes);
    if (w)
        memcpy(&sw, w, bytes);
    if (e)
        memcpy(&se, e, bytes);
    for (;;) {
        int64_t sl = next_slice(CLOCK_MONOTONIC, vdl);
        if (sl == 0) {
            if (tv_out)
                tv_out->tv_sec = tv_out->tv_usec = 0;
            return 0; /* the last slice timed out, so the kernel cleared the sets */
        }
        if (r)
            memcpy(r, &sr, bytes);
        if (w)
            memcpy(w, &sw, bytes);
        if (e)
            memcpy(e, &se, bytes);
        struct timespec t = ns2ts(sl);
        int rc = r_pselect(n, r, w, e, &t, mask);
        if (rc != 0) {
            if (tv_out) {
                int64_t left = vdl - vnow(CLOCK_MONOTONIC);
                *tv_out = ns2tv(left > 0 ? left : 0);
            }
            return rc;
        }
    }
}

EXPORT int select(int n, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv) {
    /* Sets larger than fd_set (n > FD_SETSIZE) are passed through undilated. */
    if (!active() || tv == NULL || tv2ns(tv) <= 0 || n > FD_SETSIZE)
        return r_select(n, r, w, e, tv);
    return pselect_v(n, r, w, e, vdeadline_rel(tv2ns(tv)), NULL, tv);
}

EXPORT int pselect(int n, fd_set *r, fd_set *w, fd_set *e, const struct timespec *ts, const sigset_t *mask) {
    if (!active() || ts == NULL || !valid_ts(ts) || ts2ns(ts) <= 0 || n > FD_SETSIZE)
        return r_pselect(n, r, w, e, ts, mask);
    return pselect_v(n, r, w, e, vdeadline_rel(ts2ns(ts)), mask, NULL);
}

static int no_epoll_pwait2; /* the kernel said ENOSYS once */

static int epoll_v(int ep, struct epoll_event *ev, int max, int64_t vdl, const sigset_t *mask) {
    for (;;) {
        int64_t sl = next_slice(CLOCK_MONOTONIC, vdl);
        if (sl == 0)
            return 0;
        int rc = -1;
        /* epoll_pwait2 (ns timeouts) needs Linux 5.11; older kernels get
           epoll_pwait with the slice rounded up to whole ms. */
        if (r_epoll_pwait2 != NULL && !__atomic_load_n(&no_epoll_pwait2, __ATOMIC_RELAXED)) {
            struct timespec t = ns2ts(sl);
            rc = r_epoll_pwait2(ep, ev, max, &t, mask);
            if (rc == -1 && errno == ENOSYS)
                __atomic_store_n(&no_epoll_pwait2, 1, __ATOMIC_RELAXED);
        }
        if (r_epoll_pwait2 == NULL || __atomic_load_n(&no_epoll_pwait2, __ATOMIC_RELAXED))
            rc = r_epoll_pwait(ep, ev, max, (int)((sl + 999999) / 1000000), mask);
        if (rc != 0)
            return rc;
    }
}

EXPORT int epoll_wait(int ep, struct epoll_event *ev, int max, int timeout_ms) {
    if (!active() || timeout_ms <= 0)
        return r_epoll_wait(ep, ev, max, timeout_ms);
    return epoll_v(ep, ev, max, vdeadline_rel((int64_t)timeout_ms * 1000000), NULL);
}

EXPORT int epoll_pwait(int ep, struct epoll_event *ev, int max, int timeout_ms, const sigset_t *mask) {
    if (!active() || timeout_ms <= 0)
        return r_epoll_pwait(ep, ev, max, timeout_ms, mask);
    return epoll_v(ep, ev, max, vdeadline_rel((int64_t)timeout_ms * 1000000), mask);
}

EXPORT int epoll_pwait2(int ep, struct epoll_event *ev, int max, const struct timespec *tmo, const sigset_t *mask) {
    ensure();
    if (r_epoll_pwait2 == NULL) {
        errno = ENOSYS;
        return -1;
    }
    if (rec == NULL || tmo == NULL || !valid_ts(tmo) || ts2ns(tmo) <= 0)
        return r_epoll_pwait2(ep, ev, max, tmo, mask);
    return epoll_v(ep, ev, max, vdeadline_rel(ts2ns(tmo)), mask);
}

EXPORT int sigtimedwait(const sigset_t *set, siginfo_t *info, const struct timespec *tmo) {
    if (!active() || tmo == NULL || !valid_ts(tmo) || ts2ns(tmo) <= 0)
        return r_sigtimedwait(set, info, tmo);
    int64_t vdl = vdeadline_rel(ts2ns(tmo));
    for (;;) {
        int64_t sl = next_slice(CLOCK_MONOTONIC, vdl);
        if (sl == 0) {
            errno = EAGAIN;
            return -1;
        }
        struct timespec t = ns2ts(sl);
        int rc = r_sigtimedwait(set, info, &t);
        if (rc >= 0 || errno != EAGAIN)
            return rc;
    }
}

/* ---------------------------------------------------------------- timed locks and waits */

/*
 * Conditions created with a CLOCK_MONOTONIC attribute: pthread_cond_timedwait
 * interprets its deadline on the condition's clock, which glibc does not
 * expose, so the shim remembers which conditions were made monotonic.
 */
#define COND_SLOTS 4096
#define COND_TOMB ((uintptr_t)1)
static uintptr_t cond_mono[COND_SLOTS];
static int cond_full_warned;

static size_t cond_hash(const void *c) { return ((uintptr_t)c >> 4) * 0x9E3779B97F4A7C15ULL >> 52; }

static void cond_forget(const void *c) {
    size_t h = cond_hash(c);
    for (size_t i = 0; i < COND_SLOTS; i++) {
        uintptr_t *slot = &cond_mono[(h + i) % COND_SLOTS];
        uintptr_t v = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if (v == 0)
            return;
        if (v == (uintptr_t)c) {
            __atomic_store_n(slot, COND_TOMB, __ATOMIC_RELEASE);
            return;
        }
    }
}

static void cond_remember(const void *c) {
    size_t h = cond_hash(c);
    for (size_t i = 0; i < COND_SLOTS; i++) {
        uintptr_t *slot = &cond_mono[(h + i) % COND_SLOTS];
        uintptr_t v = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
        if ((v == 0 || v == COND_TOMB) &&
            __atomic_compare_exchange_n(slot, &v, (uintptr_t)c, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return;
    }
    warn_once(&cond_full_warned, "too many CLOCK_MONOTONIC condition variables; further ones are "
                                 "treated as CLOCK_REALTIME by pthread_cond_timedwait");
}

static clockid_t cond_clock(const void *c) {
    size_t h = cond_hash(c);
    for (size_t i = 0; i < COND_SLOTS; i++) {
        uintptr_t v = __atomic_load_n(&cond_mono[(h + i) % COND_SLOTS], __ATOMIC_ACQUIRE);
        if (v == 0)
            break;
        if (v == (uintptr_t)c)
            return CLOCK_MONOTONIC;
    }
    return CLOCK_REALTIME;
}

EXPORT int pthread_cond_init(pthread_cond_t *c, const pthread_condattr_t *attr) {
    ensure();
    int rc = r_cond_init(c, attr);
    if (rc != 0)
        return rc;
    clockid_t clk = CLOCK_REALTIME;
    if (attr != NULL)
        pthread_condattr_getclock(attr, &clk);
    cond_forget(c);
    if (clk == CLOCK_MONOTONIC)
        cond_remember(c);
    return 0;
}

EXPORT int pthread_cond_destroy(pthread_cond_t *c) {
    ensure();
    cond_forget(c);
    return r_cond_destroy(c);
}

/* Kinds of timed wait that take an absolute deadline on some clock. */
enum wait_kind { W_COND, W_SEM, W_MUTEX };

/*
 * Waits in slices until the object is acquired or virtual clock `clk` reaches
 * the absolute deadline `abs`. Returns 0 or an errno value (ETIMEDOUT, ...).
 */
static int timed_wait_v(enum wait_kind kind, void *obj, pthread_mutex_t *m, clockid_t clk,
                        const struct timespec *abs) {
    int64_t vdl = ts2ns(abs);
    for (;;) {
        int64_t sl = next_slice(clk, vdl);
        if (sl == 0)
            return ETIMEDOUT;
        struct timespec rdl = real_mono_in(sl);
        int e;
        switch (kind) {
        case W_COND:
            e = r_cond_clockwait(obj, m, CLOCK_MONOTONIC, &rdl);
            break;
        case W_SEM:
            e = r_sem_clockwait(obj, CLOCK_MONOTONIC, &rdl) == 0 ? 0 : errno;
            break;
        default:
            e = r_mutex_clocklock(obj, CLOCK_MONOTONIC, &rdl);
            break;
        }
        if (e != ETIMEDOUT)
            return e;
    }
}

static int dilatable(clockid_t clk, const struct timespec *abs) {
    return active() && base_of(clk) >= 0 && abs != NULL && valid_ts(abs) && r_cond_clockwait != NULL &&
           r_sem_clockwait != NULL && r_mutex_clocklock != NULL;
}

EXPORT int pthread_cond_timedwait(pthread_cond_t *c, pthread_mutex_t *m, const struct timespec *abs) {
    clockid_t clk = cond_clock(c);
    if (!dilatable(clk, abs))
        return r_cond_timedwait(c, m, abs);
    return timed_wait_v(W_COND, c, m, clk, abs);
}

EXPORT int pthread_cond_clockwait(pthread_cond_t *c, pthread_mutex_t *m, clockid_t clk, const struct timespec *abs) {
    if (!dilatable(clk, abs))
        return r_cond_clockwait(c, m, clk, abs);
    return timed_wait_v(W_COND, c, m, clk, abs);
}

static int sem_result(int e) {
    if (e == 0)
        return 0;
    errno = e;
    return -1;
}

EXPORT int sem_timedwait(sem_t *s, const struct timespec *abs) {
    if (!dilatable(CLOCK_REALTIME, abs))
        return r_sem_timedwait(s, abs);
    return sem_result(timed_wait_v(W_SEM, s, NULL, CLOCK_REALTIME, abs));
}

EXPORT int sem_clockwait(sem_t *s, clockid_t clk, const struct timespec *abs) {
    if (!dilatable(clk, abs))
        return r_sem_clockwait(s, clk, abs);
    return sem_result(timed_wait_v(W_SEM, s, NULL, clk, abs));
}

EXPORT int pthread_mutex_timedlock(pthread_mutex_t *m, const struct timespec *abs) {
    if (!dilatable(CLOCK_REALTIME, abs))
        return r_mutex_timedlock(m, abs);
    return timed_wait_v(W_MUTEX, m, NULL, CLOCK_REALTIME, abs);
}

EXPORT int pthread_mutex_clocklock(pthread_mutex_t *m, clockid_t clk, const struct timespec *abs) {
    if (!dilatable(clk, abs))
        return r_mutex_clocklock(m, clk, abs);
    return timed_wait_v(W_MUTEX, m, NULL, clk, abs);
}

/* ---------------------------------------------------------------- kernel timers */

/* Which base each timerfd was created on (for TFD_TIMER_ABSTIME), by fd. */
#define TRACKED_FDS 65536
static signed char timerfd_clock[TRACKED_FDS];

EXPORT int timerfd_create(int clk, int flags) {
    ensure();
    int fd = r_timerfd_create(clk, flags);
    if (fd >= 0 && fd < TRACKED_FDS)
        timerfd_clock[fd] = (signed char)(clk + 1);
    return fd;
}

static clockid_t timerfd_clk(int fd) {
    if (fd >= 0 && fd < TRACKED_FDS && timerfd_clock[fd] != 0)
        return timerfd_clock[fd] - 1;
    return CLOCK_MONOTONIC;
}

/* Converts a virtual itimerspec to real; absolute values on clock `clk`. */
static struct itimerspec its_to_real(const struct itimerspec *v, int abs, clockid_t clk) {
    struct itimerspec r = *v;
    r.it_interval = ns2ts(v2r_dur(ts2ns(&v->it_interval)));
    int64_t val = ts2ns(&v->it_value);
    if (val == 0)
        return r; /* disarm */
    if (abs && base_of(clk) >= 0) {
        struct seg s;
        int64_t real;
        read_clock(clk, base_of(clk), &s, &real);
        int64_t rd = real_of(&s, val);
        r.it_value = ns2ts(rd > 0 ? rd : 1);
    } else {
        r.it_value = ns2ts(v2r_dur(val));
    }
    return r;
}

static void its_to_virtual(struct itimerspec *r) {
    int64_t val = ts2ns(&r->it_value);
    r->it_interval = ns2ts(r2v_dur(ts2ns(&r->it_interval)));
    /* A running timer with less than one virtual ns left must still read as armed. */
    int64_t v = r2v_dur(val);
    r->it_value = ns2ts(val > 0 && v == 0 ? 1 : v);
}

static int its_ok(const struct itimerspec *v) { return v != NULL && valid_ts(&v->it_value) && valid_ts(&v->it_interval); }

EXPORT int timerfd_settime(int fd, int flags, const struct itimerspec *nv, struct itimerspec *old) {
    if (!active() || !its_ok(nv))
        return r_timerfd_settime(fd, flags, nv, old);
    struct itimerspec r = its_to_real(nv, flags & TFD_TIMER_ABSTIME, timerfd_clk(fd));
    int rc = r_timerfd_settime(fd, flags, &r, old);
    if (rc == 0 && old != NULL)
        its_to_virtual(old);
    return rc;
}

EXPORT int timerfd_gettime(int fd, struct itimerspec *cur) {
    int rc = r_timerfd_gettime(fd, cur);
    if (rc == 0 && active())
        its_to_virtual(cur);
    return rc;
}

/* POSIX timers: clock per timer id, for TIMER_ABSTIME. */
#define TIMER_SLOTS 256
static struct {
    timer_t id;
    clockid_t clk;
    int used;
} timers[TIMER_SLOTS];
static pthread_mutex_t timers_lock = PTHREAD_MUTEX_INITIALIZER;

EXPORT int timer_create(clockid_t clk, struct sigevent *sev, timer_t *id) {
    ensure();
    int rc = r_timer_create(clk, sev, id);
    if (rc == 0) {
        pthread_mutex_lock(&timers_lock);
        for (int i = 0; i < TIMER_SLOTS; i++) {
            if (!timers[i].used || timers[i].id == *id) {
                timers[i].id = *id;
                timers[i].clk = clk;
                timers[i].used = 1;
                break;
            }
        }
        pthread_mutex_unlock(&timers_lock);
    }
    return rc;
}

static clockid_t timer_clk(timer_t id) {
    clockid_t clk = CLOCK_REALTIME;
    pthread_mutex_lock(&timers_lock);
    for (int i = 0; i < TIMER_SLOTS; i++)
        if (timers[i].used && timers[i].id == id) {
            clk = timers[i].clk;
            break;
        }
    pthread_mutex_unlock(&timers_lock);
    return clk;
}

EXPORT int timer_settime(timer_t id, int flags, const struct itimerspec *nv, struct itimerspec *old) {
    if (!active() || !its_ok(nv))
        return r_timer_settime(id, flags, nv, old);
    clockid_t clk = timer_clk(id);
    if (base_of(clk) < 0) /* CPU-time timers stay real */
        return r_timer_settime(id, flags, nv, old);
    struct itimerspec r = its_to_real(nv, flags & TIMER_ABSTIME, clk);
    int rc = r_timer_settime(id, flags, &r, old);
    if (rc == 0 && old != NULL)
        its_to_virtual(old);
    return rc;
}

EXPORT int timer_gettime(timer_t id, struct itimerspec *cur) {
    int rc = r_timer_gettime(id, cur);
    if (rc == 0 && active() && base_of(timer_clk(id)) >= 0)
        its_to_virtual(cur);
    return rc;
}

EXPORT unsigned alarm(unsigned secs) {
    if (!active())
        return r_alarm(secs);
    int64_t real = secs == 0 ? 0 : v2r_dur((int64_t)secs * NS_PER_SEC);
    unsigned rs = (unsigned)((real + NS_PER_SEC - 1) / NS_PER_SEC);
    unsigned prev = r_alarm(rs);
    if (prev == 0)
        return 0;
    int64_t v = r2v_dur((int64_t)prev * NS_PER_SEC);
    return (unsigned)((v + NS_PER_SEC - 1) / NS_PER_SEC);
}

static void itv_to_virtual(struct itimerval *r) {
    int64_t val = tv2ns(&r->it_value), v = r2v_dur(val);
    r->it_value = ns2tv(val > 0 && v < 1000 ? 1000 : v);
    r->it_interval = ns2tv(r2v_dur(tv2ns(&r->it_interval)));
}

EXPORT int setitimer(__itimer_which_t which, const struct itimerval *restrict nv, struct itimerval *restrict old) {
    if (!active() || which != ITIMER_REAL || nv == NULL)
        return r_setitimer(which, nv, old);
    struct itimerval r;
    r.it_value = ns2tv(v2r_dur(tv2ns(&nv->it_value)));
    r.it_interval = ns2tv(v2r_dur(tv2ns(&nv->it_interval)));
    int rc = r_setitimer(which, &r, old);
    if (rc == 0 && old != NULL)
        itv_to_virtual(old);
    return rc;
}

EXPORT int getitimer(__itimer_which_t which, struct itimerval *cur) {
    int rc = r_getitimer(which, cur);
    if (rc == 0 && which == ITIMER_REAL && active())
        itv_to_virtual(cur);
    return rc;
}

/* ---------------------------------------------------------------- sockets */

static int is_sock_timeo(int level, int name) {
    return level == SOL_SOCKET && (name == VT_SO_RCVTIMEO_OLD || name == VT_SO_SNDTIMEO_OLD ||
                                   name == SO_RCVTIMEO_NEW || name == SO_SNDTIMEO_NEW);
}

/* On 64-bit Linux both the old and the new option take {int64 sec, int64 usec}. */
EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
    if (!active() || !is_sock_timeo(level, name) || val == NULL || len < sizeof(struct timeval))
        return r_setsockopt(fd, level, name, val, len);
    struct timeval tv;
    memcpy(&tv, val, sizeof tv);
    if (tv.tv_sec > 0 || tv.tv_usec > 0)
        tv = ns2tv(v2r_dur(tv2ns(&tv)));
    return r_setsockopt(fd, level, name, &tv, sizeof tv);
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len) {
    int rc = r_getsockopt(fd, level, name, val, len);
    if (rc == 0 && active() && is_sock_timeo(level, name) && val != NULL && len != NULL &&
        *len >= sizeof(struct timeval)) {
        struct timeval tv;
        memcpy(&tv, val, sizeof tv);
        tv = ns2tv(r2v_dur(tv2ns(&tv)));
        memcpy(val, &tv, sizeof tv);
    }
    return rc;
}

/* Kernel receive timestamps are CLOCK_REALTIME; show them on the virtual clock. */
static void virtualize_cmsgs(struct msghdr *msg) {
    if (msg->msg_control == NULL || msg->msg_controllen == 0)
        return;
    struct seg s;
    int64_t real;
    read_clock(CLOCK_REALTIME, VTIME_BASE_REALTIME, &s, &real);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET)
            continue;
        size_t len = c->cmsg_len - CMSG_LEN(0);
        unsigned char *d = CMSG_DATA(c);
        if ((c->cmsg_type == VT_SO_TIMESTAMP_OLD || c->cmsg_type == SO_TIMESTAMP_NEW) &&
            len >= sizeof(struct timeval)) {
            struct timeval tv;
            memcpy(&tv, d, sizeof tv);
            tv = ns2tv(virt_of(&s, tv2ns(&tv)));
            memcpy(d, &tv, sizeof tv);
        } else if ((c->cmsg_type == VT_SO_TIMESTAMPNS_OLD || c->cmsg_type == SO_TIMESTAMPNS_NEW ||
                    c->cmsg_type == VT_SO_TIMESTAMPING_OLD || c->cmsg_type == SO_TIMESTAMPING_NEW) &&
                   len >= sizeof(struct timespec)) {
            /* For SO_TIMESTAMPING only the first (software) stamp is the system clock. */
            struct timespec ts;
            memcpy(&ts, d, sizeof ts);
            if (ts.tv_sec != 0 || ts.tv_nsec != 0) {
                ts = ns2ts(virt_of(&s, ts2ns(&ts)));
                memcpy(d, &ts, sizeof ts);
            }
        }
    }
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
    ssize_t rc = r_recvmsg(fd, msg, flags);
    if (rc >= 0 && active())
        virtualize_cmsgs(msg);
    return rc;
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned int n, int flags, struct timespec *tmo) {
    if (!active())
        return r_recvmmsg(fd, v, n, flags, tmo);
    struct timespec rt, *rp = tmo;
    if (tmo != NULL && valid_ts(tmo)) {
        rt = ns2ts(v2r_dur(ts2ns(tmo)));
        rp = &rt;
    }
    int rc = r_recvmmsg(fd, v, n, flags, rp);
    for (int i = 0; i < rc; i++)
        virtualize_cmsgs(&v[i].msg_hdr);
    return rc;
}

/* ---------------------------------------------------------------- io_uring */

static int uring_warned;
static const char uring_msg[] = "this program uses io_uring: its timeouts (IORING_OP_TIMEOUT, linked "
                                "timeouts, wait timeouts) run in REAL time, not dilated";

EXPORT int io_uring_queue_init_params(unsigned entries, void *ring, void *p) {
    ensure();
    if (rec != NULL)
        warn_once(&uring_warned, uring_msg);
    if (r_io_uring_queue_init_params == NULL)
        return -ENOSYS;
    return r_io_uring_queue_init_params(entries, ring, p);
}

EXPORT int io_uring_queue_init(unsigned entries, void *ring, unsigned flags) {
    ensure();
    if (rec != NULL)
        warn_once(&uring_warned, uring_msg);
    if (r_io_uring_queue_init == NULL)
        return -ENOSYS;
    return r_io_uring_queue_init(entries, ring, flags);
}

/* ---------------------------------------------------------------- syscall() */

#ifndef FUTEX_CMD_MASK
#define FUTEX_CMD_MASK ~(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME)
#endif

static long futex_v(long a[6]) {
    int op = (int)a[1];
    int cmd = op & FUTEX_CMD_MASK;
    const struct timespec *tmo = (const struct timespec *)a[3];
    /* Only the wait commands carry a timespec in the fourth argument; for the
       others (FUTEX_WAKE, FUTEX_REQUEUE, ...) it is a count or garbage, and
       must not be read. */
    if ((cmd != FUTEX_WAIT && cmd != FUTEX_WAIT_BITSET) || tmo == NULL || !valid_ts(tmo))
        return r_syscall(SYS_futex, a[0], a[1], a[2], a[3], a[4], a[5]);
    /* FUTEX_WAIT's timeout is relative (on CLOCK_MONOTONIC); FUTEX_WAIT_BITSET's is
       absolute on CLOCK_MONOTONIC, or CLOCK_REALTIME with FUTEX_CLOCK_REALTIME. */
    clockid_t clk = (cmd == FUTEX_WAIT_BITSET && (op & FUTEX_CLOCK_REALTIME)) ? CLOCK_REALTIME : CLOCK_MONOTONIC;
    int64_t vdl = cmd == FUTEX_WAIT ? vdeadline_rel(ts2ns(tmo)) : ts2ns(tmo);
    for (;;) {
        int64_t sl = next_slice(clk, vdl);
        if (sl == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct timespec t;
        if (cmd == FUTEX_WAIT) {
            t = ns2ts(sl);
        } else {
            r_clock_gettime(clk, &t);
            t = ns2ts(ts2ns(&t) + sl);
        }
        long rc = r_syscall(SYS_futex, a[0], a[1], a[2], (long)&t, a[4], a[5]);
        if (rc != -1 || errno != ETIMEDOUT)
            return rc;
    }
}

static int errno_result(int e) {
    if (e == 0)
        return 0;
    errno = e;
    return -1;
}

/*
 * Stable Rust cannot define a variadic function, which is why this part of
 * the shim must be C. Reading six arguments whatever the call passed is what
 * glibc's own syscall() does.
 */
EXPORT long syscall(long nr, ...) {
    va_list ap;
    long a[6];
    va_start(ap, nr);
    for (int i = 0; i < 6; i++)
        a[i] = va_arg(ap, long);
    va_end(ap);
    ensure();
    if (rec != NULL) {
        switch (nr) {
        case SYS_futex:
            return futex_v(a);
        case SYS_clock_gettime:
            return clock_gettime((clockid_t)a[0], (struct timespec *)a[1]);
        case SYS_gettimeofday:
            return gettimeofday((struct timeval *)a[0], (void *)a[1]);
#ifdef SYS_time
        case SYS_time:
            return (long)time((time_t *)a[0]);
#endif
        case SYS_nanosleep:
            return nanosleep((const struct timespec *)a[0], (struct timespec *)a[1]);
        case SYS_clock_nanosleep:
            return errno_result(clock_nanosleep((clockid_t)a[0], (int)a[1], (const struct timespec *)a[2],
                                                (struct timespec *)a[3]));
#ifdef SYS_io_uring_setup
        case SYS_io_uring_setup:
            warn_once(&uring_warned, uring_msg);
            break;
#endif
        default:
            break;
        }
    }
    return r_syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}
