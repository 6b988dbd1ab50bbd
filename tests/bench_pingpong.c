/*
 * bench_pingpong.c — the round trip of one cache line between two threads
 * pinned to CPUs A and B (default 0 and 1), in ns, once or every second.
 *
 * A driver, not a test. It tells where a VM's two vCPUs sit on the host
 * right now: on the 2-vCPU Zen 4 VM the benchmarks run on, the round trip
 * is 50-105 ns most of the time and 330-400 ns in stretches. In those
 * stretches memory-bound work is slower on either vCPU, and 2-thread work
 * whose threads read each other's data more so (docs/bench.md, "Reading
 * the numbers"). The FMA peak does not move, so it cannot show this.
 *
 *   build/bench_pingpong [-n ITERS] [-r SECONDS] [CPU_A CPU_B]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_setaffinity_np */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Alignas(128) _Atomic long pp_flag;
/* Apart from pp_flag: a failure written there could be overwritten by the
 * caller's first store and never seen. */
static _Alignas(128) _Atomic int pp_failed;
static long pp_iters = 100000;

static int pp_pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    return pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static double pp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The other side: answers each odd value with the next even one. */
static void *pp_echo(void *arg) {
    int cpu = *(const int *)arg;
    if (pp_pin(cpu) != 0) {
        atomic_store(&pp_failed, 1);
        return NULL;
    }
    for (long i = 0; i < pp_iters; i++) {
        while (atomic_load_explicit(&pp_flag, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&pp_flag, 2 * i + 2, memory_order_release);
    }
    return NULL;
}

/* One measurement: the mean round trip in ns, or < 0 when a thread could
 * not be started or pinned. */
static double pp_once(int a, int b) {
    pthread_t th;
    atomic_store(&pp_flag, 0);
    atomic_store(&pp_failed, 0);
    if (pp_pin(a) != 0) return -1;
    if (pthread_create(&th, NULL, pp_echo, &b) != 0) return -1;
    double t0 = pp_now();
    for (long i = 0; i < pp_iters; i++) {
        atomic_store_explicit(&pp_flag, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&pp_flag, memory_order_acquire) != 2 * i + 2) {
            if (atomic_load_explicit(&pp_failed, memory_order_relaxed)) { /* not pinned */
                pthread_join(th, NULL);
                return -1;
            }
        }
    }
    double t = pp_now() - t0;
    pthread_join(th, NULL);
    return t / (double)pp_iters * 1e9;
}

int main(int argc, char **argv) {
    int cpu[2] = {0, 1}, ncpu = 0;
    double every = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            pp_iters = atol(argv[++i]);
        } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            every = atof(argv[++i]);
        } else if (ncpu < 2 && argv[i][0] >= '0' && argv[i][0] <= '9') {
            cpu[ncpu++] = atoi(argv[i]);
        } else {
            fprintf(stderr, "usage: %s [-n ITERS] [-r SECONDS] [CPU_A CPU_B]\n", argv[0]);
            return 2;
        }
    }
    if (pp_iters < 1 || pp_iters > 100000000L) {
        fprintf(stderr, "bench_pingpong: -n wants 1..100000000 iterations\n");
        return 2;
    }
    double t_end = pp_now() + every;
    do {
        double ns = pp_once(cpu[0], cpu[1]);
        if (ns < 0) {
            fprintf(stderr, "bench_pingpong: could not run a thread on each of CPUs %d and %d "
                            "(are both online and allowed?)\n", cpu[0], cpu[1]);
            return 1;
        }
        printf("CPUs %d and %d: round trip %.1f ns (mean of %ld)\n", cpu[0], cpu[1], ns, pp_iters);
        fflush(stdout);
        if (every > 0) sleep(1);
    } while (every > 0 && pp_now() < t_end);
    return 0;
}
