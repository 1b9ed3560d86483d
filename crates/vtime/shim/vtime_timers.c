/*
 * vtime LD_PRELOAD shim, second part: kernel timers (timerfd, POSIX timers,
 * alarm, setitimer), socket timeouts and receive timestamps, io_uring set-up
 * and syscall() (futex waits with absolute deadlines). The shared state and
 * the clock model are in vtime_shim.h; the design notes head vtime_shim.c.
 */
#include "vtime_shim.h"

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
    ensure_optional();
    if (rec != NULL)
        warn_once(&uring_warned, uring_msg);
    if (r_io_uring_queue_init_params == NULL)
        return -ENOSYS;
    return r_io_uring_queue_init_params(entries, ring, p);
}

EXPORT int io_uring_queue_init(unsigned entries, void *ring, unsigned flags) {
    ensure_optional();
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
