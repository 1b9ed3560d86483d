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
#include "vtime_shim.h"

/* ---------------------------------------------------------------- real functions */

int (*r_clock_gettime)(clockid_t, struct timespec *);
int (*r_gettimeofday)(struct timeval *, void *);
time_t (*r_time)(time_t *);
int (*r_timespec_get)(struct timespec *, int);
int (*r_nanosleep)(const struct timespec *, struct timespec *);
int (*r_clock_nanosleep)(clockid_t, int, const struct timespec *, struct timespec *);
int (*r_usleep)(useconds_t);
unsigned (*r_sleep)(unsigned);
int (*r_poll)(struct pollfd *, nfds_t, int);
int (*r_ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
int (*r_select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
int (*r_pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
int (*r_epoll_wait)(int, struct epoll_event *, int, int);
int (*r_epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
int (*r_epoll_pwait2)(int, struct epoll_event *, int, const struct timespec *, const sigset_t *);
int (*r_timerfd_create)(int, int);
int (*r_timerfd_settime)(int, int, const struct itimerspec *, struct itimerspec *);
int (*r_timerfd_gettime)(int, struct itimerspec *);
int (*r_timer_create)(clockid_t, struct sigevent *, timer_t *);
int (*r_timer_settime)(timer_t, int, const struct itimerspec *, struct itimerspec *);
int (*r_timer_gettime)(timer_t, struct itimerspec *);
unsigned (*r_alarm)(unsigned);
int (*r_setitimer)(__itimer_which_t, const struct itimerval *, struct itimerval *);
int (*r_getitimer)(__itimer_which_t, struct itimerval *);
int (*r_cond_init)(pthread_cond_t *, const pthread_condattr_t *);
int (*r_cond_destroy)(pthread_cond_t *);
int (*r_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
int (*r_cond_clockwait)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const struct timespec *);
int (*r_sem_timedwait)(sem_t *, const struct timespec *);
int (*r_sem_clockwait)(sem_t *, clockid_t, const struct timespec *);
int (*r_mutex_timedlock)(pthread_mutex_t *, const struct timespec *);
int (*r_mutex_clocklock)(pthread_mutex_t *, clockid_t, const struct timespec *);
int (*r_sigtimedwait)(const sigset_t *, siginfo_t *, const struct timespec *);
int (*r_setsockopt)(int, int, int, const void *, socklen_t);
int (*r_getsockopt)(int, int, int, void *, socklen_t *);
ssize_t (*r_recvmsg)(int, struct msghdr *, int);
int (*r_recvmmsg)(int, struct mmsghdr *, unsigned int, int, struct timespec *);
long (*r_syscall)(long, ...);
int (*r_io_uring_queue_init_params)(unsigned, void *, void *);
int (*r_io_uring_queue_init)(unsigned, void *, unsigned);

const struct vtime_record *rec; /* NULL: no domain, pass through */
int ready;
pthread_once_t once = PTHREAD_ONCE_INIT;
__thread int resolving;

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

/* Symbols a C library may lack (glibc before 2.30 has no
 * pthread_cond_clockwait, before 2.35 no epoll_pwait2; liburing is seldom
 * loaded). A failed dlsym allocates its error message, and an allocator that
 * is itself starting up cannot take that: jemalloc reads the clock and makes
 * raw system calls while holding its init lock, so resolving these from
 * there would wait on that lock forever. They are looked up at their first
 * use instead, when the allocator is long up. */
pthread_once_t once_optional = PTHREAD_ONCE_INIT;

void resolve_optional(void) {
    RESOLVE(r_epoll_pwait2, "epoll_pwait2");
    RESOLVE(r_cond_clockwait, "pthread_cond_clockwait");
    RESOLVE(r_sem_clockwait, "sem_clockwait");
    RESOLVE(r_mutex_clocklock, "pthread_mutex_clocklock");
    RESOLVE(r_io_uring_queue_init_params, "io_uring_queue_init_params");
    RESOLVE(r_io_uring_queue_init, "io_uring_queue_init");
}

void resolve_all(void) {
    resolving = 1;
    /* First what an allocator calls (jemalloc: the clock, raw system calls). */
    RESOLVE(r_clock_gettime, "clock_gettime");
    RESOLVE(r_syscall, "syscall");
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
    RESOLVE(r_sem_timedwait, "sem_timedwait");
    RESOLVE(r_mutex_timedlock, "pthread_mutex_timedlock");
    RESOLVE(r_sigtimedwait, "sigtimedwait");
    RESOLVE(r_setsockopt, "setsockopt");
    RESOLVE(r_getsockopt, "getsockopt");
    RESOLVE(r_recvmsg, "recvmsg");
    RESOLVE(r_recvmmsg, "recvmmsg");
    attach_record();
    resolving = 0;
    __atomic_store_n(&ready, 1, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void vtime_ctor(void) { ensure(); }

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
    ensure_optional();
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
    ensure_optional();
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
    ensure_optional();
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

