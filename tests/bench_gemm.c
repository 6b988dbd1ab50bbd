/*
 * bench_gemm.c — GFLOP/s of the GEMM backends at ViT-B shapes (not a test).
 *
 *   make build/bench_gemm && build/bench_gemm [reps]
 *
 * y = x W^T (nn.Linear, what the ViT runs) for M in {197, 1576} (batch 1
 * and 8) and (N, K) in the four projections of a ViT-B block, on 1 and 2
 * threads. Backends are measured interleaved (A B A B ...) so that the noise
 * of a shared machine hits both alike; the median of the reps is printed.
 * VITC_BENCH_CLOCK=cpu times with the process CPU clock instead of the wall
 * clock: on a machine shared with other jobs this removes the time the
 * process was not running, which makes 1-thread numbers comparable (for 2
 * threads it also counts the caller's wait, so use the wall clock there).
 * Run it with OPENBLAS_NUM_THREADS=1 (make bench-gemm does): the pthread
 * OpenBLAS starts its own threads when loaded, and they spin for a while,
 * taking CPU from whatever runs next, although vitc never lets OpenBLAS use
 * them.
 * VITC_BENCH_STAT=min reports the fastest rep instead of the median: with
 * other jobs on the cores, the fastest rep is the one least disturbed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"

static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    const char *ck = getenv("VITC_BENCH_CLOCK");
    if (ck && strcmp(ck, "cpu") == 0) bench_clock = CLOCK_PROCESS_CPUTIME_ID;
    const char *st = getenv("VITC_BENCH_STAT");
    int use_min = st && strcmp(st, "min") == 0;
    const char *only = argc > 2 ? argv[2] : NULL; /* "builtin" or "openblas" */
    int64_t Ms[] = {197, 1576};
    int64_t NK[][2] = {{768, 768}, {2304, 768}, {3072, 768}, {768, 3072}};
    const char *backends[] = {"builtin", "openblas"};
    int nb = 0, bidx[2];
    for (int b = 0; b < 2; b++)
        if ((!only || strcmp(only, backends[b]) == 0) && vitc_set_gemm_backend(backends[b]) == VITC_OK)
            bidx[nb++] = b;
    printf("arch %s, %s of %d, %s clock\n", vitc_get_arch(), use_min ? "best" : "median", reps,
           bench_clock == CLOCK_MONOTONIC ? "wall" : "process CPU");
    printf("%6s %6s %6s %3s", "M", "N", "K", "thr");
    for (int b = 0; b < nb; b++) printf(" %10s", backends[bidx[b]]);
    if (nb == 2) printf(" %8s", "ratio");
    printf("   GFLOP/s\n");
    double *t = malloc((size_t)reps * 2 * sizeof(double));
    for (int mi = 0; mi < 2; mi++)
        for (int s = 0; s < 4; s++) {
            int64_t M = Ms[mi], N = NK[s][0], K = NK[s][1];
            float *x = vitc__alloc((size_t)(M * K) * sizeof(float));
            float *W = vitc__alloc((size_t)(N * K) * sizeof(float));
            float *y = vitc__alloc((size_t)(M * N) * sizeof(float));
            for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
            for (int64_t i = 0; i < N * K; i++) W[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
            double flops = 2.0 * (double)M * (double)N * (double)K;
            for (int thr = 1; thr <= 2; thr++) {
                vitc_set_num_threads(thr);
                for (int b = 0; b < nb; b++) { /* warm-up: packing buffers, workers */
                    vitc_set_gemm_backend(backends[bidx[b]]);
                    vitc__linear(y, N, x, K, W, NULL, NULL, 0, M, N, K);
                }
                for (int r = 0; r < reps; r++)
                    for (int b = 0; b < nb; b++) {
                        vitc_set_gemm_backend(backends[bidx[b]]);
                        double t0 = now_s();
                        vitc__linear(y, N, x, K, W, NULL, NULL, 0, M, N, K);
                        t[b * reps + r] = now_s() - t0;
                    }
                printf("%6lld %6lld %6lld %3d", (long long)M, (long long)N, (long long)K, thr);
                double g[2];
                for (int b = 0; b < nb; b++) {
                    qsort(t + b * reps, (size_t)reps, sizeof(double), cmp_d);
                    g[b] = flops / t[b * reps + (use_min ? 0 : reps / 2)] * 1e-9;
                    printf(" %10.1f", g[b]);
                }
                if (nb == 2) printf(" %8.2f", g[0] / g[1]);
                printf("\n");
                fflush(stdout);
            }
            vitc__free(x), vitc__free(W), vitc__free(y);
        }
    free(t);
    return 0;
}
