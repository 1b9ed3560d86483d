/*
 * A program whose allocator reads the clock and makes raw system calls, as
 * jemalloc does (Redis links it): malloc, calloc and realloc here call
 * clock_gettime and syscall(SYS_getpid). Under the shim, the first of them
 * can arrive while the shim is still resolving the real functions (dlsym
 * allocates when a symbol is missing), on the same thread, and its first
 * call must not be re-entered (see `starting`). It prints "ok", the virtual
 * milliseconds a 100 ms sleep took and how often the allocator read the
 * clock.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static unsigned char arena[8 << 20];
static size_t used;
static volatile long clock_reads;

static void touch_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    syscall(SYS_getpid);
    clock_reads++;
}

/* jemalloc holds a non-recursive lock while it starts, and reads the clock
 * and makes system calls meanwhile: being entered again then hangs it.
 * Here it is reported and the program stops. */
static int starting, started;

void *malloc(size_t n) {
    if (!started) {
        if (starting) {
            static const char msg[] = "alloc_clock: the allocator was re-entered while it was starting\n";
            if (write(2, msg, sizeof msg - 1) < 0) {
            }
            _exit(3);
        }
        starting = 1;
        touch_clock();
        starting = 0;
        started = 1;
    }
    touch_clock();
    size_t at = (used + 15) & ~(size_t)15;
    if (at + n + 16 > sizeof arena)
        return NULL;
    *(size_t *)(arena + at) = n; /* the size, for realloc */
    used = at + 16 + n;
    return arena + at + 16;
}

void free(void *p) { (void)p; }

void *calloc(size_t k, size_t n) {
    void *p = malloc(k * n);
    if (p != NULL)
        memset(p, 0, k * n);
    return p;
}

void *realloc(void *p, size_t n) {
    void *q = malloc(n);
    if (q != NULL && p != NULL) {
        size_t old = *(size_t *)((unsigned char *)p - 16);
        memcpy(q, p, old < n ? old : n);
    }
    return q;
}

int main(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    usleep(100000);
    clock_gettime(CLOCK_MONOTONIC, &b);
    long ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
    free(malloc(64)); /* at least one allocation, whatever the C library did */
    printf("ok %ld %ld\n", ms, clock_reads);
    return 0;
}
