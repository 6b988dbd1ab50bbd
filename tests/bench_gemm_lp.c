/*
 * bench_gemm_lp.c — the four linear layers of a ViT-B block (qkv, out_proj
 * with its residual, fc1 with GELU, fc2 with its residual) through
 * vitc__linear_pw with packed weights, one precision (not a test).
 *
 *   make build/bench_gemm_lp && build/bench_gemm_lp [reps] [threads] [M] [fp32|bf16|int8]
 *
 * M = 197 is ViT-B/16 at batch 1, 1576 batch 8. Prints each product's
 * median time and its fraction of the precision's nominal per-core peak on
 * this project's Zen 5 (FMA 266, vdpbf16ps 532, vpdpbusd 1,070 GFLOP/s per
 * core; the fractions are only meaningful there). VITC_BENCH_WARM=n runs n
 * untimed calls of each product first (default 3), and the first product
 * warms up for 0.3 s besides: a pool that has just started its threads
 * ran its first tens of milliseconds at one thread's speed.
 * Run it with OPENBLAS_NUM_THREADS=1 (see bench_gemm.c).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kernels/kernels.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 9, nt = argc > 2 ? atoi(argv[2]) : 2;
    int64_t M = argc > 3 ? atoll(argv[3]) : 1576;
    const char *pn = argc > 4 ? argv[4] : "bf16";
    const char *wv = getenv("VITC_BENCH_WARM");
    int warm = wv ? atoi(wv) : 3;
    if (reps < 1 || reps > 1000 || nt < 1 || M < 1 || warm < 0) {
        fprintf(stderr, "usage: bench_gemm_lp [reps 1..1000] [threads] [M] [fp32|bf16|int8]\n");
        return 2;
    }
    vitc_precision pr = strcmp(pn, "int8") == 0   ? VITC_PRECISION_INT8
                        : strcmp(pn, "fp32") == 0 ? VITC_PRECISION_FP32
                                                  : VITC_PRECISION_BF16;
    double peak = (pr == VITC_PRECISION_INT8 ? 1070.0 : pr == VITC_PRECISION_BF16 ? 532.0 : 266.0) * nt;
    vitc_set_num_threads(nt);
    /* N, K, what follows the product: 0 nothing, 1 the residual, 2 GELU */
    const int64_t shapes[4][3] = {{2304, 768, 0}, {768, 768, 1}, {3072, 768, 2}, {768, 3072, 1}};
    const char *names[4] = {"qkv", "out_proj+res", "fc1+gelu", "fc2+res"};
    double *t = malloc((size_t)reps * sizeof *t), total = 0.0;
    printf("%s, %d thread(s), M = %lld, median of %d\n", vitc_precision_name(pr), nt, (long long)M, reps);
    for (int s = 0; s < 4; s++) {
        int64_t N = shapes[s][0], K = shapes[s][1];
        float *W = vitc__alloc((size_t)(N * K) * 4), *x = vitc__alloc((size_t)(M * K) * 4);
        float *y = vitc__alloc((size_t)(M * N) * 4), *b = vitc__alloc((size_t)N * 4);
        float *r = vitc__alloc((size_t)(M * N) * 4);
        vitc__pweight pw;
        memset(&pw, 0, sizeof pw);
        if (!t || !W || !x || !y || !b || !r) return fprintf(stderr, "out of memory\n"), 1;
        uint32_t seed = 1;
        for (int64_t i = 0; i < N * K; i++) W[i] = ((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-24f * 0.05f - 0.025f;
        for (int64_t i = 0; i < M * K; i++) x[i] = ((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-24f - 0.5f;
        for (int64_t i = 0; i < N; i++) b[i] = 0.1f;
        for (int64_t i = 0; i < M * N; i++) r[i] = 0.2f;
        if (vitc__pweight_pack(&pw, W, N, K, pr) != VITC_OK) return fprintf(stderr, "%s\n", vitc_last_error()), 1;
        /* the first product also warms up for 0.3 s: the pool's threads */
        for (double t_warm = now_s(); s == 0 && now_s() - t_warm < 0.3;)
            if (vitc__linear_pw(y, N, x, K, &pw, W, b, NULL, N, M, N, K, VITC__ACT_NONE) != VITC_OK)
                return fprintf(stderr, "%s\n", vitc_last_error()), 1;
        for (int k = 0; k < warm + reps; k++) {
            double t0 = now_s();
            vitc_status st = vitc__linear_pw(y, N, x, K, &pw, W, b, shapes[s][2] == 1 ? r : NULL, N, M, N, K,
                                             shapes[s][2] == 2 ? VITC__ACT_GELU : VITC__ACT_NONE);
            if (st != VITC_OK) return fprintf(stderr, "%s\n", vitc_last_error()), 1;
            if (k >= warm) t[k - warm] = now_s() - t0;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_d);
        double med = t[reps / 2], gf = 2.0 * (double)M * (double)N * (double)K / med * 1e-9;
        total += med;
        printf("%-13s N %5lld K %5lld: %8.3f ms %7.0f GFLOP/s %5.1f%% of peak\n", names[s], (long long)N,
               (long long)K, med * 1e3, gf, 100.0 * gf / peak);
        vitc__pweight_free(&pw);
        vitc__free(W), vitc__free(x), vitc__free(y), vitc__free(b), vitc__free(r);
    }
    printf("a block's four: %.2f ms (x 12 layers: %.1f ms)\n", total * 1e3, total * 12e3);
    free(t);
    return 0;
}
