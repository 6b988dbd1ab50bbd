/*
 * bench_attention.c — speed of the fused attention kernel (vitc__sdpa) on
 * the standard shapes, against this machine's measured FP32 FMA peak.
 *
 *   make bench-attention   (or: make build/bench_attention && build/bench_attention ...)
 *   build/bench_attention && build/bench_attention [-t THREADS] [-r REPS]
 *        [-a ARCH] [B,H,N,D[,Dv] ...]
 *
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

static double run_shape(const shape *s, int reps, double peak, int threads) {
    int64_t B = s->B, H = s->H, N = s->N, D = s->D, Dv = s->Dv;
    size_t nq = (size_t)(B * H * N * D), nv = (size_t)(B * H * N * Dv);
    float *q = malloc(nq * 4), *k = malloc(nq * 4), *v = malloc(nv * 4), *o = malloc(nv * 4);
    if (!q || !k || !v || !o) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    srand(1);
    for (size_t i = 0; i < nq; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nq; i++) k[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nv; i++) v[i] = (float)rand() / RAND_MAX - 0.5f;
    memset(o, 0, nv * 4);
    vitc__sdpa_desc d = {0};
    d.B = B, d.H = H, d.L = N, d.S = N, d.D = D, d.Dv = Dv;
    d.q = q, d.q_sb = H * N * D, d.q_sh = N * D, d.q_sr = D;
    d.k = k, d.k_sb = H * N * D, d.k_sh = N * D, d.k_sr = D;
    d.v = v, d.v_sb = H * N * Dv, d.v_sh = N * Dv, d.v_sr = Dv;
    d.o = o, d.o_sb = H * N * Dv, d.o_sh = N * Dv, d.o_sr = Dv;
    d.scale = 1.0f / sqrtf((float)D);
    long rss0 = maxrss_kb();
    if (vitc__sdpa(&d) != VITC_OK) {
        fprintf(stderr, "sdpa failed: %s\n", vitc_last_error());
        exit(1);
    }
    long rss1 = maxrss_kb();
    double flop = 2.0 * (double)(B * H) * (double)N * (double)N * (double)(D + Dv);
    /* At least ~0.3 s per measurement set, at least reps runs. */
    double t0 = now();
    vitc__sdpa(&d);
    double one = now() - t0;
    int n = reps;
    if (one * n < 0.3) n = (int)(0.3 / one) + 1;
    if (n > 200) n = 200;
    double *ts = malloc((size_t)n * sizeof(double)), *cs = malloc((size_t)n * sizeof(double));
    for (int i = 0; i < n; i++) {
        double c0 = cpu_now();
        t0 = now();
        vitc__sdpa(&d);
        ts[i] = now() - t0;
        cs[i] = (cpu_now() - c0) / threads;
    }
    qsort(ts, (size_t)n, sizeof(double), cmp_double);
    qsort(cs, (size_t)n, sizeof(double), cmp_double);
    double t = ts[n / 2], tc = cs[n / 2];
    double gf = flop / t * 1e-9, gfc = flop / tc * 1e-9;
    printf("[%lld,%lld,%lld,%lld] Dv=%-4lld %-7s thr=%d  wall %9.3f ms %7.1f GFLOP/s (%5.1f%% of "
           "peak/core)  cpu/thr %9.3f ms %7.1f GFLOP/s (%5.1f%%)  scratch %.1f MB/thread (rss +%.1f MB)\n",
           (long long)B, (long long)H, (long long)N, (long long)D, (long long)Dv, vitc_get_arch(),
           threads, t * 1e3, gf, peak > 0 ? 100.0 * gf / (peak * threads) : 0.0, tc * 1e3, gfc,
           peak > 0 ? 100.0 * gfc / (peak * threads) : 0.0,
           (double)vitc__sdpa_scratch_bytes(&d) / 1048576.0, (double)(rss1 - rss0) / 1024.0);
    free(cs);
    fflush(stdout);
    free(ts);
    free(q), free(k), free(v), free(o);
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
