/*
 * bench_attention.c — speed of the fused attention kernel (vitc__sdpa) and
 * of its backward (vitc__sdpa_backward, -b) on the standard shapes, against
 * this machine's measured FP32 FMA peak.
 *
 *   make bench-attention   (or: make build/bench_attention && build/bench_attention ...)
 *   build/bench_attention && build/bench_attention [-t THREADS] [-r REPS]
 *        [-a ARCH] [-b] [--bf16|--int8] [B,H,N,D[,Dv] ...]
 *
 * --bf16 / --int8 time the forward with q k^T and P v on bf16 / int8
 * operands (vitc__sdpa_desc.prec; the same FLOP count).
 *
 * The backward's GFLOP/s counts its five products, 2*B*H*L*S*(3D+2Dv)
 * (S, dP, dV, dK, dQ; the split plan for fewer than 8 heads recomputes S
 * and dP once more, which is not counted).
 * GFLOP/s counts 4*B*H*L*S*D (the two matrix products, as PyTorch and the
 * FlashAttention papers count), so it is comparable across implementations;
 * for Dv != D it counts 2*B*H*L*S*(D+Dv). Time is the median of REPS runs.
 * "scratch" is what each thread of the kernel holds for the shape; "rss +"
 * the growth of the peak resident set during the first call (pages of the
 * scratch actually touched; the inputs are allocated before).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "kernels/attention_impl.h"
#include "kernels/kernels.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process: with other jobs on the cores, wall time
 * measures the scheduler; CPU time / threads measures the kernel. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static long maxrss_kb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* 12 independent FMA chains in registers (4-cycle latency x 2 ports needs
 * 8; 12 leaves room): the rate one core retires 16-lane FMAs, in GFLOP/s.
 * Best of 3 short runs, taken again before every shape, since other
 * processes share the cores and the clock moves. */
__attribute__((target("avx512f,fma"))) static double fma_peak_avx512(void) {
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
        __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2),
               a3 = _mm512_set1_ps(3), a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5),
               a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7), a8 = _mm512_set1_ps(8),
               a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
        const long iters = 1000000;
        double t0 = now();
        for (long it = 0; it < iters; it++) {
#define F(x) x = _mm512_fmadd_ps(x, m, c)
            F(a0), F(a1), F(a2), F(a3), F(a4), F(a5), F(a6), F(a7), F(a8), F(a9), F(a10), F(a11);
#undef F
            __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5));
        }
        double t = now() - t0;
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
        if (_mm512_reduce_add_ps(s) == 1234.5f) printf(" ");
        double g = (double)iters * 12 * 32 / t * 1e-9;
        if (g > best) best = g;
    }
    return best;
}
#endif

typedef struct shape {
    int64_t B, H, N, D, Dv;
} shape;

static int g_backward; /* -b: time vitc__sdpa_backward instead */
static vitc_precision g_prec; /* --bf16, --int8: q k^T and P v in it (attention_lp.c) */

static vitc_status run_once(vitc__sdpa_bwd_desc *bd) {
    return g_backward ? vitc__sdpa_backward(bd) : vitc__sdpa(&bd->f);
}

static double run_shape(const shape *s, int reps, double peak, int threads) {
    int64_t B = s->B, H = s->H, N = s->N, D = s->D, Dv = s->Dv;
    size_t nq = (size_t)(B * H * N * D), nv = (size_t)(B * H * N * Dv);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *o = malloc(nv * 4);
    float *lse = malloc((size_t)(B * H * N) * 4), *dout = NULL, *g = NULL;
    if (g_backward) {
        dout = malloc(nv * 4);
        g = malloc((2 * nq + nv) * 4);
    }
    if (!q || !k || !v || !o || !lse || (g_backward && (!dout || !g))) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    srand(1);
    for (size_t i = 0; i < nq; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nq; i++) k[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nv; i++) v[i] = (float)rand() / RAND_MAX - 0.5f;
    if (dout)
        for (size_t i = 0; i < nv; i++) dout[i] = (float)rand() / RAND_MAX - 0.5f;
    memset(o, 0, nv * 4);
    if (g) memset(g, 0, (2 * nq + nv) * 4); /* so "rss +" shows the scratch only */
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    vitc__sdpa_desc *dp = &bd.f;
    dp->B = B, dp->H = H, dp->L = N, dp->S = N, dp->D = D, dp->Dv = Dv;
    dp->q = q, dp->q_sb = H * N * D, dp->q_sh = N * D, dp->q_sr = D;
    dp->k = k, dp->k_sb = H * N * D, dp->k_sh = N * D, dp->k_sr = D;
    dp->v = v, dp->v_sb = H * N * Dv, dp->v_sh = N * Dv, dp->v_sr = Dv;
    dp->o = o, dp->o_sb = H * N * Dv, dp->o_sh = N * Dv, dp->o_sr = Dv;
    dp->scale = 1.0f / sqrtf((float)D);
    dp->prec = g_prec;
    if (g_backward) {
        dp->lse = lse, dp->lse_sb = H * N, dp->lse_sh = N;
        if (vitc__sdpa(dp) != VITC_OK) { /* the training forward: o and lse */
            fprintf(stderr, "sdpa failed: %s\n", vitc_last_error());
            exit(1);
        }
        bd.dout = dout, bd.do_sb = dp->o_sb, bd.do_sh = dp->o_sh, bd.do_sr = dp->o_sr;
        bd.dq = g, bd.dq_sb = dp->q_sb, bd.dq_sh = dp->q_sh, bd.dq_sr = D;
        bd.dk = g + nq, bd.dk_sb = dp->k_sb, bd.dk_sh = dp->k_sh, bd.dk_sr = D;
        bd.dv = g + 2 * nq, bd.dv_sb = dp->v_sb, bd.dv_sh = dp->v_sh, bd.dv_sr = Dv;
    }
    long rss0 = maxrss_kb();
    if (run_once(&bd) != VITC_OK) {
        fprintf(stderr, "sdpa%s failed: %s\n", g_backward ? " backward" : "", vitc_last_error());
        exit(1);
    }
    long rss1 = maxrss_kb();
    double flop = g_backward ? 2.0 * (double)(B * H) * (double)N * (double)N * (double)(3 * D + 2 * Dv)
                             : 2.0 * (double)(B * H) * (double)N * (double)N * (double)(D + Dv);
    /* At least ~0.3 s per measurement set, at least reps runs. */
    double t0 = now();
    run_once(&bd);
    double one = now() - t0;
    int n = reps;
    if (one * n < 0.3) n = (int)(0.3 / one) + 1;
    if (n > 200) n = 200;
    double *ts = malloc((size_t)n * sizeof(double)), *cs = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) {
        double c0 = cpu_now();
        t0 = now();
        run_once(&bd);
        ts[i] = now() - t0;
        cs[i] = (cpu_now() - c0) / threads;
    }
    qsort(ts, (size_t)n, sizeof(double), cmp_double);
    qsort(cs, (size_t)n, sizeof(double), cmp_double);
    double t = ts[n / 2], tc = cs[n / 2];
    double gf = flop / t * 1e-9, gfc = flop / tc * 1e-9;
    size_t scratch = g_backward ? vitc__sdpa_backward_scratch_bytes(&bd) : vitc__sdpa_scratch_bytes(dp);
    printf("%s[%lld,%lld,%lld,%lld] Dv=%-4lld %-7s thr=%d  wall %9.3f ms %7.1f GFLOP/s (%5.1f%% of "
           "peak/core)  cpu/thr %9.3f ms %7.1f GFLOP/s (%5.1f%%)  scratch %.1f MB/thread (rss +%.1f MB)\n",
           g_backward ? "bwd " : "", (long long)B, (long long)H, (long long)N, (long long)D,
           (long long)Dv, vitc_get_arch(), threads, t * 1e3, gf,
           peak > 0 ? 100.0 * gf / (peak * threads) : 0.0, tc * 1e3, gfc,
           peak > 0 ? 100.0 * gfc / (peak * threads) : 0.0, (double)scratch / 1048576.0,
           (double)(rss1 - rss0) / 1024.0);
    free(cs);
    fflush(stdout);
    free(ts);
    free(q), free(k), free(v), free(o), free(lse), free(dout), free(g);
    return gf;
}

int main(int argc, char **argv) {
    int threads = 1, reps = 7;
    const char *arch = NULL;
    shape shapes[32];
    int ns = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-a") && i + 1 < argc) arch = argv[++i];
        else if (!strcmp(argv[i], "-b")) g_backward = 1;
        else if (!strcmp(argv[i], "--bf16")) g_prec = VITC_PRECISION_BF16;
        else if (!strcmp(argv[i], "--int8")) g_prec = VITC_PRECISION_INT8;
        else if (ns < 32) {
            long long b, h, n, dd, dv = -1;
            int got = sscanf(argv[i], "%lld,%lld,%lld,%lld,%lld", &b, &h, &n, &dd, &dv);
            if (got < 4) {
                fprintf(stderr, "bad shape %s (want B,H,N,D[,Dv])\n", argv[i]);
                return 2;
            }
            shapes[ns++] = (shape){b, h, n, dd, got == 5 ? dv : dd};
        }
    }
    if (ns == 0) {
        const shape def[] = {{1, 8, 4096, 64, 64},  {1, 12, 197, 64, 64}, {8, 1, 1024, 8, 64},
                             {256, 1, 256, 8, 8},   {1, 1, 4096, 512, 512}};
        for (int i = 0; i < 5; i++) shapes[ns++] = def[i];
    }
    if (arch && vitc_set_arch(arch) != VITC_OK) {
        fprintf(stderr, "%s\n", vitc_last_error());
        return 2;
    }
    vitc_set_num_threads(threads);
    double peak = 0;
#if defined(__x86_64__)
    if (vitc__cpu_has(VITC_ARCH_AVX512)) {
        peak = fma_peak_avx512();
        printf("FMA peak (AVX-512, 1 core): %.1f GFLOP/s\n", peak);
    }
#endif
    for (int i = 0; i < ns; i++) {
#if defined(__x86_64__)
        if (peak > 0) peak = fma_peak_avx512();
#endif
        run_shape(&shapes[i], reps, peak, threads);
    }
    return 0;
}
