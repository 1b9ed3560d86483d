/*
 * vtime benchmark probe: CPU time per clock_gettime(CLOCK_MONOTONIC) call.
 *
 *   vtime_clock CALLS
 *
 * Prints "CALLS CPU_NS". CPU time comes from getrusage (user + system), which
 * no clock shim dilates, so the same figure is comparable with no shim, with
 * vtime and with libfaketime.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static long long cpu_ns(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return (long long)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000000000LL +
           (long long)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1000LL;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000000;
    volatile long sink = 0;
    struct timespec t;
    for (long i = 0; i < n / 100 + 1; i++) /* warm up: resolve symbols, fault pages */
        clock_gettime(CLOCK_MONOTONIC, &t);
    long long c0 = cpu_ns();
    for (long i = 0; i < n; i++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        sink += t.tv_nsec;
    }
    long long c1 = cpu_ns();
    printf("%ld %lld\n", n, c1 - c0);
    return sink == 42 ? 1 : 0;
}
