/*
 * Test program for the vtime shim: performs one timed wait of a given
 * virtual duration through one interface and reports what it saw.
 *
 *   waits MODE SECONDS
 *
 * Prints "ready" when set up, waits for a line on stdin ("go"), then does the
 * wait and prints "done OUTCOME VIRT_NS CPU_US",
 * where OUTCOME is "timeout" when the call reported its timeout as it should,
 * VIRT_NS the elapsed CLOCK_MONOTONIC (as the program sees it) and CPU_US the
 * process CPU time (user + system) spent in the wait. The test measures the
 * real time between the two lines.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

static int64_t now(clockid_t c) {
    struct timespec t;
    clock_gettime(c, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static struct timespec ts_of(int64_t ns) {
    struct timespec t = {ns / 1000000000, ns % 1000000000};
    return t;
}

static int64_t cpu_us(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (int64_t)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static void *hold_forever(void *arg) {
    (void)arg;
    pthread_mutex_lock(&held);
    pause();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: waits MODE SECONDS\n");
        return 2;
    }
    const char *m = argv[1];
    int64_t d = (int64_t)(atof(argv[2]) * 1e9);
    int ok = 0;

    /* Set-up that must not count in the measured wait. */
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, NULL);
    /* Timer signals are blocked and taken with sigwaitinfo. */
    sigset_t timer_sigs;
    sigemptyset(&timer_sigs);
    sigaddset(&timer_sigs, SIGALRM);
    sigaddset(&timer_sigs, SIGUSR2);
    sigprocmask(SIG_BLOCK, &timer_sigs, NULL);
    timer_t ptimer;
    struct sigevent sev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGUSR2};
    timer_create(CLOCK_MONOTONIC, &sev, &ptimer);
    int pfd[2];
    if (pipe(pfd) != 0)
        return 3;
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    epoll_ctl(ep, EPOLL_CTL_ADD, pfd[0], &ev);
    int tfd = timerfd_create(CLOCK_MONOTONIC, 0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_t cond_rt, cond_mono;
    pthread_cond_init(&cond_rt, NULL);
    pthread_cond_init(&cond_mono, &ca);
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    sem_t sem;
    sem_init(&sem, 0, 0);
    pthread_t holder;
    if (strcmp(m, "mutex") == 0) {
        pthread_create(&holder, NULL, hold_forever, NULL);
        while (pthread_mutex_trylock(&held) == 0) /* wait until the holder has it */
            pthread_mutex_unlock(&held), usleep(1000);
    }
    uint32_t futex_word = 0;
    /* A UDP socket on loopback that nobody else sends to. */
    int us = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    bind(us, (struct sockaddr *)&sa, sizeof sa);
    getsockname(us, (struct sockaddr *)&sa, &sl);

    printf("ready\n");
    fflush(stdout);
    /* Start when the test says go (a line on stdin; end of input also counts). */
    for (int ch = getchar(); ch != EOF && ch != '\n'; ch = getchar())
        ;
    int64_t c0 = cpu_us(), v0 = now(CLOCK_MONOTONIC);

    if (strcmp(m, "nanosleep") == 0) {
        struct timespec t = ts_of(d);
        ok = nanosleep(&t, NULL) == 0;
    } else if (strcmp(m, "clock_nanosleep_abs") == 0) {
        struct timespec t = ts_of(now(CLOCK_MONOTONIC) + d);
        ok = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == 0;
    } else if (strcmp(m, "usleep") == 0) {
        ok = usleep((useconds_t)(d / 1000)) == 0;
    } else if (strcmp(m, "poll") == 0) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        ok = poll(&p, 1, (int)(d / 1000000)) == 0;
    } else if (strcmp(m, "ppoll") == 0) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        struct timespec t = ts_of(d);
        ok = ppoll(&p, 1, &t, NULL) == 0;
    } else if (strcmp(m, "select") == 0) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(pfd[0], &r);
        struct timeval tv = {d / 1000000000, (d % 1000000000) / 1000};
        ok = select(pfd[0] + 1, &r, NULL, NULL, &tv) == 0 && !FD_ISSET(pfd[0], &r);
    } else if (strcmp(m, "epoll") == 0) {
        struct epoll_event out;
        ok = epoll_wait(ep, &out, 1, (int)(d / 1000000)) == 0;
    } else if (strcmp(m, "timerfd") == 0) {
        struct itimerspec its = {.it_value = ts_of(d)};
        uint64_t n = 0;
        ok = timerfd_settime(tfd, 0, &its, NULL) == 0 && read(tfd, &n, sizeof n) == sizeof n && n == 1;
    } else if (strcmp(m, "timerfd_abs") == 0) {
        struct itimerspec its = {.it_value = ts_of(now(CLOCK_MONOTONIC) + d)};
        uint64_t n = 0;
        ok = timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0 && read(tfd, &n, sizeof n) == sizeof n && n == 1;
    } else if (strcmp(m, "posix_timer") == 0) {
        struct itimerspec its = {.it_value = ts_of(d)}, left;
        ok = timer_settime(ptimer, 0, &its, NULL) == 0 && timer_gettime(ptimer, &left) == 0 &&
             left.it_value.tv_sec <= its.it_value.tv_sec && (left.it_value.tv_sec > 0 || left.it_value.tv_nsec > 900000000) &&
             sigwaitinfo(&timer_sigs, NULL) == SIGUSR2;
    } else if (strcmp(m, "alarm") == 0) {
        alarm((unsigned)(d / 1000000000));
        ok = sigwaitinfo(&timer_sigs, NULL) == SIGALRM;
    } else if (strcmp(m, "setitimer") == 0) {
        struct itimerval itv = {.it_value = {d / 1000000000, (d % 1000000000) / 1000}}, left;
        ok = setitimer(ITIMER_REAL, &itv, NULL) == 0 && getitimer(ITIMER_REAL, &left) == 0 &&
             left.it_value.tv_sec <= itv.it_value.tv_sec && sigwaitinfo(&timer_sigs, NULL) == SIGALRM;
    } else if (strcmp(m, "cond_realtime") == 0) {
        struct timespec t = ts_of(now(CLOCK_REALTIME) + d);
        pthread_mutex_lock(&mu);
        ok = pthread_cond_timedwait(&cond_rt, &mu, &t) == ETIMEDOUT;
        pthread_mutex_unlock(&mu);
    } else if (strcmp(m, "cond_monotonic") == 0) {
        struct timespec t = ts_of(now(CLOCK_MONOTONIC) + d);
        pthread_mutex_lock(&mu);
        ok = pthread_cond_timedwait(&cond_mono, &mu, &t) == ETIMEDOUT;
        pthread_mutex_unlock(&mu);
    } else if (strcmp(m, "sem") == 0) {
        struct timespec t = ts_of(now(CLOCK_REALTIME) + d);
        ok = sem_timedwait(&sem, &t) == -1 && errno == ETIMEDOUT;
    } else if (strcmp(m, "mutex") == 0) {
        struct timespec t = ts_of(now(CLOCK_REALTIME) + d);
        ok = pthread_mutex_timedlock(&held, &t) == ETIMEDOUT;
    } else if (strcmp(m, "sigtimedwait") == 0) {
        struct timespec t = ts_of(d);
        ok = sigtimedwait(&usr1, NULL, &t) == -1 && errno == EAGAIN;
    } else if (strcmp(m, "futex") == 0) {
        struct timespec t = ts_of(now(CLOCK_MONOTONIC) + d);
        ok = syscall(SYS_futex, &futex_word, FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, 0, &t, NULL,
                     FUTEX_BITSET_MATCH_ANY) == -1 &&
             errno == ETIMEDOUT;
    } else if (strcmp(m, "monotonic") == 0) {
        /* Read the clocks in a tight loop while the test changes the TDF
           under us: no reading may be lower than the one before. */
        int64_t last_m = now(CLOCK_MONOTONIC), last_r = now(CLOCK_REALTIME), back = 0;
        for (long i = 0; i < (long)(d / 1000); i++) {
            int64_t a = now(CLOCK_MONOTONIC), b = now(CLOCK_REALTIME);
            back += (a < last_m) + (b < last_r);
            last_m = a;
            last_r = b;
        }
        if (back != 0)
            fprintf(stderr, "waits: clock went back %lld times\n", (long long)back);
        ok = back == 0;
    } else if (strcmp(m, "io_uring") == 0) {
        /* No wait: the shim must warn that io_uring timeouts are not dilated. */
        unsigned char params[120];
        memset(params, 0, sizeof params);
        long fd = syscall(SYS_io_uring_setup, 4, params);
        if (fd >= 0)
            close((int)fd);
        ok = 1;
    } else if (strcmp(m, "rcvtimeo") == 0) {
        struct timeval tv = {d / 1000000000, (d % 1000000000) / 1000}, back;
        socklen_t bl = sizeof back;
        char b[8];
        setsockopt(us, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        getsockopt(us, SOL_SOCKET, SO_RCVTIMEO, &back, &bl);
        ok = recv(us, b, sizeof b, 0) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK) &&
             back.tv_sec == tv.tv_sec && labs(back.tv_usec - tv.tv_usec) <= 1;
    } else if (strcmp(m, "rx_timestamp") == 0) {
        /* Sleep first so virtual and real wall clocks are far apart, then
           check that the kernel's receive timestamp reads as virtual time. */
        struct timespec t = ts_of(d);
        nanosleep(&t, NULL);
        int on = 1;
        setsockopt(us, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on);
        sendto(us, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa);
        char b[8], ctl[256];
        struct iovec iov = {b, sizeof b};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl};
        int64_t stamp = -1;
        if (recvmsg(us, &mh, 0) == 1)
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                    struct timespec ts;
                    memcpy(&ts, CMSG_DATA(c), sizeof ts);
                    stamp = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
                }
        int64_t diff = now(CLOCK_REALTIME) - stamp;
        ok = diff >= 0 && diff < 50000000; /* within 50 ms of the virtual wall clock */
    } else {
        fprintf(stderr, "waits: unknown mode %s\n", m);
        return 2;
    }

    int64_t v = now(CLOCK_MONOTONIC) - v0, c = cpu_us() - c0;
    printf("done %s %lld %lld\n", ok ? "timeout" : "wrong-result", (long long)v, (long long)c);
    fflush(stdout);
    return 0;
}
