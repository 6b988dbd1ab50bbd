/*
 * bench_gemm_lp.c — the four linear layers of a ViT-B block (qkv with its
 * LayerNorm, out_proj with its residual, fc1 with its LayerNorm and GELU,
 * fc2 with its residual) through the forward's own calls, one precision,
 * and (--bound) the per-stage profile of a whole ViT-B/16 forward with the
 * bound it puts on the forward's fraction of peak (not a test).
 *
 *   make build/bench_gemm_lp && build/bench_gemm_lp [reps] [threads] [M] [fp32|bf16|int8]
 *   build/bench_gemm_lp --bound [reps] [threads] [batch] [bf16|int8|fp32] [fp32|bf16|int8 attention]
 *   make bench-lowp        (--bound: bf16 and int8, batch 1 and 8, 1 and 2 threads)
 *
 * M = 197 is ViT-B/16 at batch 1, 1576 batch 8. Times are the minimum and
 * the median over reps (on a machine shared with other jobs the minimum is
 * the one to read); with one thread the process's CPU time, which other
 * jobs on the machine do not lengthen (VITC_BENCH_CLOCK=wall|cpu
 * overrides). Fractions are of the peak of the precision's instruction
 * measured here on as many threads at once (vfmadd231ps, vdpbf16ps,
 * vpdpbusd on zmm, 24 independent sums, per CPU second of each thread;
 * AVX-512 CPUs only, else no fractions). VITC_BENCH_WARM=n runs n untimed calls of each
 * product first (default 3), and the first product warms up for 0.3 s
 * besides: a pool that has just started its threads ran its first tens of
 * milliseconds at one thread's speed. Run it with OPENBLAS_NUM_THREADS=1
 * (see bench_gemm.c).
 *
 * --bound: the forward (vitc_vit_forward, random-init ViT-B/16 at 224 px)
 * and each stage alone at the forward's shapes, in turns, in the block's
 * order and data flow: the patch embedding's product, the four
 * products as the block calls them, the attention (vitc__sdpa); then, for
 * scale, the work the products fuse timed unfused (LayerNorm, the
 * activations' conversion to bf16 / uint8, GELU, a residual add). "The
 * rest" is the forward less those stages (the head, the final LayerNorm,
 * what the forward does between calls; below 0 when the stages alone ran
 * slower than inside the forward). The bound:
 *   max % of peak = FLOP / peak / (GEMM FLOP / (peak x e) + attention + patch embedding)
 * with e the microkernel's own efficiency (one 12 x 32 tile over K = 768,
 * its A strip in L1 and its weight strip in L2, as the GEMM's blocking
 * leaves them; no conversion, no epilogue): the forward's fraction if every
 * product ran at the microkernel's own speed and the attention at its
 * kernel's present speed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kernels/gemm_lp.h"
#include "kernels/kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#endif

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static float frand(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) * 0x1p-24f;
}

/* ---- the instruction's peak ---------------------------------------------- */

#define PEAK_ITERS 200000

#ifdef BENCH_X86
#define PEAK_LOOP(T, SETUP, OP)                                                                  \
    T a0 = SETUP, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,       \
      a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0, a16 = a0, a17 = a0,  \
      a18 = a0, a19 = a0, a20 = a0, a21 = a0, a22 = a0, a23 = a0;                               \
    for (int i = 0; i < PEAK_ITERS; i++) {                                                       \
        a0 = OP(a0), a1 = OP(a1), a2 = OP(a2), a3 = OP(a3), a4 = OP(a4), a5 = OP(a5);            \
        a6 = OP(a6), a7 = OP(a7), a8 = OP(a8), a9 = OP(a9), a10 = OP(a10), a11 = OP(a11);        \
        a12 = OP(a12), a13 = OP(a13), a14 = OP(a14), a15 = OP(a15), a16 = OP(a16);               \
        a17 = OP(a17), a18 = OP(a18), a19 = OP(a19), a20 = OP(a20), a21 = OP(a21);               \
        a22 = OP(a22), a23 = OP(a23);                                                            \
        /* every sum opaque, else the compiler computes the equal ones once */                 \
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),       \
                         "+v"(a6), "+v"(a7), "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11));         \
        __asm__ volatile("" : "+v"(a12), "+v"(a13), "+v"(a14), "+v"(a15), "+v"(a16), "+v"(a17), \
                         "+v"(a18), "+v"(a19), "+v"(a20), "+v"(a21), "+v"(a22), "+v"(a23));    \
    }                                                                                            \
    T s = a0;                                                                                    \
    s = ADD(s, a1), s = ADD(s, a2), s = ADD(s, a3), s = ADD(s, a4), s = ADD(s, a5);              \
    s = ADD(s, a6), s = ADD(s, a7), s = ADD(s, a8), s = ADD(s, a9), s = ADD(s, a10);             \
    s = ADD(s, a11), s = ADD(s, a12), s = ADD(s, a13), s = ADD(s, a14), s = ADD(s, a15);         \
    s = ADD(s, a16), s = ADD(s, a17), s = ADD(s, a18), s = ADD(s, a19), s = ADD(s, a20);         \
    s = ADD(s, a21), s = ADD(s, a22), s = ADD(s, a23);

__attribute__((target("avx512f,avx512bf16"))) static float peak_bf16(void) {
    __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = x;
#define OP(a) _mm512_dpbf16_ps(a, x, y)
#define ADD(a, b) _mm512_add_ps(a, b)
    PEAK_LOOP(__m512, _mm512_setzero_ps(), OP)
#undef OP
#undef ADD
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512vnni"))) static float peak_int8(void) {
    __m512i x = _mm512_set1_epi32(0x01010101), y = x;
#define OP(a) _mm512_dpbusd_epi32(a, x, y)
#define ADD(a, b) _mm512_add_epi32(a, b)
    PEAK_LOOP(__m512i, _mm512_setzero_si512(), OP)
#undef OP
#undef ADD
    return (float)_mm512_reduce_add_epi32(s);
}

__attribute__((target("avx512f"))) static float peak_fp32(void) {
    __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0x1p-20f);
#define OP(a) _mm512_fmadd_ps(x, y, a)
#define ADD(a, b) _mm512_add_ps(a, b)
    PEAK_LOOP(__m512, _mm512_setzero_ps(), OP)
#undef OP
#undef ADD
    return _mm512_reduce_add_ps(s);
}
#endif

static volatile float peak_sink;

/* this thread's CPU time: a rate per CPU second is the core's own, however
 * many other jobs share the machine (wall time is not, on a shared one) */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct peak_ctx {
    vitc_precision p;
    double t[64]; /* each task's CPU seconds */
} peak_ctx;

static void peak_task(void *ctx, int64_t t, int tid) {
    peak_ctx *c = ctx;
    (void)tid;
    double t0 = cpu_s();
#ifdef BENCH_X86
    peak_sink = c->p == VITC_PRECISION_INT8 ? peak_int8() : c->p == VITC_PRECISION_BF16 ? peak_bf16() : peak_fp32();
#endif
    if (t < 64) c->t[t] = cpu_s() - t0;
}

/* GFLOP/s (GOP/s for int8) of nt threads at once running the precision's
 * instruction back to back: nt times the best per-thread rate per CPU
 * second over 15 runs (all threads at once, so shared units would show);
 * 0 where the precision's kernel here is not the AVX-512 one. */
static double measure_peak(vitc_precision p, int nt) {
    const char *kn = vitc__lp_kernel_for(p)->name;
    if (p != VITC_PRECISION_FP32 && strncmp(kn, "avx512", 6) != 0) return 0.0;
    if (nt > 64) return 0.0;
#ifdef BENCH_X86
    if (p == VITC_PRECISION_FP32 && !__builtin_cpu_supports("avx512f")) return 0.0;
    peak_ctx c = {.p = p};
    double best = 1e30;
    for (int r = 0; r < 15; r++) {
        vitc__parallel_for(nt, peak_task, &c);
        for (int t = 0; t < nt; t++) best = c.t[t] > 0.0 && c.t[t] < best ? c.t[t] : best;
    }
    /* per instruction: 16 lanes of 1 FMA, 2 bf16 or 4 int8 products, 2 ops each */
    double per = p == VITC_PRECISION_INT8 ? 128.0 : p == VITC_PRECISION_BF16 ? 64.0 : 32.0;
    return 24.0 * PEAK_ITERS * per * nt / best * 1e-9;
#else
    return 0.0;
#endif
}

/* the 1-minute load average (Linux), to be printed beside the times */
static const char *load_avg(void) {
    static char buf[32] = "?";
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%31s", buf) != 1) strcpy(buf, "?");
        fclose(f);
    }
    return buf;
}

/* ---- timing helpers ------------------------------------------------------ */

typedef vitc_status (*bench_fn)(void *ctx);

/* 1: times are the process's CPU time (one thread: the time its work took
 * whatever else runs on the machine), 0: wall time (several threads) */
static int use_cpu;

static double proc_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* min and median of reps calls after warm untimed ones; 0 on failure */
static int time_it(bench_fn fn, void *ctx, int warm, int reps, double *mn, double *med) {
    double *t = malloc((size_t)reps * sizeof *t);
    if (!t) return 0;
    for (int k = 0; k < warm + reps; k++) {
        double t0 = use_cpu ? proc_s() : now_s();
        if (fn(ctx) != VITC_OK) return free(t), fprintf(stderr, "%s\n", vitc_last_error()), 0;
        if (k >= warm) t[k - warm] = (use_cpu ? proc_s() : now_s()) - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    *mn = t[0], *med = t[reps / 2];
    free(t);
    return 1;
}

/* One product as the block's forward calls it: N, K, and what goes with
 * it (0 nothing, 1 the residual, 2 LayerNorm in front and GELU after,
 * 3 LayerNorm in front). */
typedef struct prod_ctx {
    int64_t M, N, K;
    int kind;
    vitc__pweight pw;
    float *W, *x, *xn, *y, *b, *r, *lw, *lb;
} prod_ctx;

static vitc_status prod_run(void *ctx) {
    prod_ctx *c = ctx;
    if (c->kind >= 2) {
        vitc__ln_pre ln = {c->xn, c->x, c->lw, c->lb, 1e-6f, 1};
        return vitc__linear_pw_ln(c->y, c->N, &ln, &c->pw, c->W, c->b, c->M, c->N, c->K,
                                  c->kind == 2 ? VITC__ACT_GELU : VITC__ACT_NONE);
    }
    return vitc__linear_pw(c->y, c->N, c->x, c->K, &c->pw, c->W, c->b, c->kind == 1 ? c->r : NULL,
                           c->N, c->M, c->N, c->K, VITC__ACT_NONE);
}

static void prod_free(prod_ctx *c) {
    vitc__pweight_free(&c->pw);
    vitc__free(c->W), vitc__free(c->x), vitc__free(c->xn), vitc__free(c->y);
    vitc__free(c->b), vitc__free(c->r), vitc__free(c->lw), vitc__free(c->lb);
}

static int prod_init(prod_ctx *c, int64_t M, int64_t N, int64_t K, int kind, vitc_precision pr) {
    memset(c, 0, sizeof *c);
    c->M = M, c->N = N, c->K = K, c->kind = kind;
    c->W = vitc__alloc((size_t)(N * K) * 4), c->x = vitc__alloc((size_t)(M * K) * 4);
    c->xn = vitc__alloc((size_t)(M * K) * 4), c->y = vitc__alloc((size_t)(M * N) * 4);
    c->b = vitc__alloc((size_t)N * 4), c->r = vitc__alloc((size_t)(M * N) * 4);
    c->lw = vitc__alloc((size_t)K * 4), c->lb = vitc__alloc((size_t)K * 4);
    if (!c->W || !c->x || !c->xn || !c->y || !c->b || !c->r || !c->lw || !c->lb)
        return fprintf(stderr, "out of memory\n"), 0;
    uint32_t seed = 1;
    for (int64_t i = 0; i < N * K; i++) c->W[i] = frand(&seed) * 0.05f - 0.025f;
    for (int64_t i = 0; i < M * K; i++) c->x[i] = frand(&seed) - 0.5f;
    memcpy(c->xn, c->x, (size_t)(M * K) * 4);
    for (int64_t i = 0; i < N; i++) c->b[i] = 0.1f;
    for (int64_t i = 0; i < M * N; i++) c->r[i] = 0.2f;
    for (int64_t i = 0; i < K; i++) c->lw[i] = 1.0f + 0.01f * (float)(i % 7), c->lb[i] = 0.01f;
    if (vitc__pweight_pack(&c->pw, c->W, N, K, pr) != VITC_OK)
        return fprintf(stderr, "%s\n", vitc_last_error()), 0;
    return 1;
}

/* the four products of a ViT-B block: N, K, kind */
static const int64_t shapes[4][3] = {{2304, 768, 3}, {768, 768, 1}, {3072, 768, 2}, {768, 3072, 1}};
static const char *names[4] = {"qkv (+LN)", "out_proj+res", "fc1 (+LN, GELU)", "fc2+res"};

static void spin_task(void *ctx, int64_t t, int tid) { /* scalar work, any CPU */
    (void)ctx, (void)t, (void)tid;
    volatile double x = 1.0;
    for (int i = 0; i < 1000000; i++) x = x * 0.999999 + 1e-9;
}

static void warm_pool(void) { /* a pool that has just started runs at one thread's speed */
    peak_ctx c = {.p = VITC_PRECISION_FP32};
    int nt = vitc__num_threads() < 64 ? vitc__num_threads() : 64;
#ifdef BENCH_X86
    int zmm = __builtin_cpu_supports("avx512f"); /* the peak loop is AVX-512's */
#else
    int zmm = 0;
#endif
    for (double t0 = now_s(); now_s() - t0 < 0.3;)
        vitc__parallel_for(nt, zmm ? peak_task : spin_task, &c);
}

/* Times the four products at M rows; ms[s] their minima. 0 on failure. */
static int time_products(vitc_precision pr, int64_t M, int warm, int reps, double peak, double *ms) {
    for (int s = 0; s < 4; s++) {
        prod_ctx c;
        if (!prod_init(&c, M, shapes[s][0], shapes[s][1], (int)shapes[s][2], pr)) return prod_free(&c), 0;
        double mn, med;
        if (!time_it(prod_run, &c, warm, reps, &mn, &med)) return prod_free(&c), 0;
        double gf = 2.0 * (double)M * (double)c.N * (double)c.K * 1e-9;
        ms[s] = mn * 1e3;
        printf("  %-16s N %5lld K %5lld: min %8.3f ms (median %8.3f) %6.0f GFLOP/s", names[s],
               (long long)c.N, (long long)c.K, mn * 1e3, med * 1e3, gf / mn);
        if (peak > 0.0) printf(" %5.1f%% of peak", 100.0 * gf / mn / peak);
        printf("\n");
        prod_free(&c);
    }
    return 1;
}

/* ---- --bound: the forward's stages --------------------------------------- */

typedef struct fwd_ctx {
    vitc_vit *m;
    float *img, *out;
    int B;
} fwd_ctx;

static vitc_status fwd_run(void *ctx) {
    fwd_ctx *c = ctx;
    return vitc_vit_forward(c->m, c->img, c->B, 224, 224, c->out);
}

typedef struct attn_ctx {
    vitc__sdpa_desc d;
} attn_ctx;

static vitc_status attn_run(void *ctx) { return vitc__sdpa(&((attn_ctx *)ctx)->d); }

typedef struct op_ctx {
    int what; /* 0 LayerNorm, 1 GELU, 2 residual add, 3 conversion */
    int64_t M, K;
    float *x, *y, *w, *b;
    uint32_t *dst;
    float *scale;
    int32_t *zp;
    vitc_precision pr;
} op_ctx;

static void op_conv_task(void *ctx, int64_t t, int tid) {
    op_ctx *c = ctx;
    (void)tid;
    const vitc__lp_kernel *kn = vitc__lp_kernel_for(c->pr);
    const int kw = vitc__lp_kw(kn, c->pr);
    int64_t kg = (c->K + kw - 1) / kw, i0 = t * VITC_LP_MR;
    int64_t rows = c->M - i0 < VITC_LP_MR ? c->M - i0 : VITC_LP_MR;
    vitc__lp_strip(kn, c->pr, c->dst + t * kg * VITC_LP_MR, VITC_LP_MR, VITC_LP_MR, c->x + i0 * c->K, c->K,
                   rows, c->K, c->scale + i0, c->zp + i0);
}

static void op_rows_task(void *ctx, int64_t t, int tid) {
    op_ctx *c = ctx;
    (void)tid;
    int64_t i0 = t * 16, rows = c->M - i0 < 16 ? c->M - i0 : 16;
    if (c->what == 0) {
        vitc__layernorm(c->y + i0 * c->K, c->x + i0 * c->K, c->w, c->b, rows, c->K, 1e-6f);
    } else if (c->what == 1) {
        vitc__gelu(c->y + i0 * c->K, rows * c->K);
    } else {
        float *y = c->y + i0 * c->K; /* [rows, K] */
        const float *x = c->x + i0 * c->K;
        for (int64_t i = 0; i < rows * c->K; i++) y[i] += x[i];
    }
}

/* the unfused op over M rows of K, threads over row blocks as the forward's would be */
static vitc_status op_run(void *ctx) {
    op_ctx *c = ctx;
    if (c->what == 3)
        vitc__parallel_for((c->M + VITC_LP_MR - 1) / VITC_LP_MR, op_conv_task, c);
    else
        vitc__parallel_for((c->M + 15) / 16, op_rows_task, c);
    return VITC_OK;
}

static double time_op(int what, int64_t M, int64_t K, vitc_precision pr, int warm, int reps) {
    op_ctx c = {.what = what, .M = M, .K = K, .pr = pr};
    c.x = vitc__alloc((size_t)(M * K) * 4), c.y = vitc__alloc((size_t)(M * K) * 4);
    c.w = vitc__alloc((size_t)K * 4), c.b = vitc__alloc((size_t)K * 4);
    c.dst = vitc__alloc((size_t)((M + VITC_LP_MR) * K) * 4);
    c.scale = vitc__alloc((size_t)(M + VITC_LP_MR) * 4), c.zp = vitc__alloc((size_t)(M + VITC_LP_MR) * 4);
    double mn = -1.0, med;
    if (c.x && c.y && c.w && c.b && c.dst && c.scale && c.zp) {
        uint32_t seed = 7;
        for (int64_t i = 0; i < M * K; i++) c.x[i] = frand(&seed) - 0.5f, c.y[i] = 0.25f;
        for (int64_t i = 0; i < K; i++) c.w[i] = 1.0f, c.b[i] = 0.0f;
        if (!time_it(op_run, &c, warm, reps, &mn, &med)) mn = -1.0;
    }
    vitc__free(c.x), vitc__free(c.y), vitc__free(c.w), vitc__free(c.b), vitc__free(c.dst);
    vitc__free(c.scale), vitc__free(c.zp);
    return mn * 1e3;
}

/* The microkernel alone: one converted A strip (12 rows; AMX: 32, row-major
 * with its padded stride, its tiles configured around the calls as the
 * driver does) times one 32-column weight strip of K = 768, on every
 * thread at once, its own buffers; the fraction of peak it reaches. */
typedef struct ukr_ctx {
    vitc_precision p;
    int64_t kg, iters;
    uint32_t *pa[64], *pb[64];
    float *C[64];
    double t[64]; /* each task's CPU seconds */
} ukr_ctx;

static void ukr_task(void *ctx, int64_t t, int tid) {
    ukr_ctx *c = ctx;
    (void)tid;
    const vitc__lp_kernel *kn = vitc__lp_kernel_for(c->p);
    vitc__lp_epi e;
    memset(&e, 0, sizeof e);
    static const float zf[32] = {0}; /* [max(mr, NR)] */
    static const int32_t zi[32] = {0};
    if (c->p == VITC_PRECISION_INT8) e.ascale = zf, e.azp = zi, e.wscale = zf, e.wsum = zi;
    if (kn->begin) kn->begin();
    double t0 = cpu_s();
    for (int64_t i = 0; i < c->iters; i++)
        kn->ukr(c->kg, c->pa[t], c->pb[t], c->C[t], VITC_LP_NR, kn->mr, VITC_LP_NR, &e);
    c->t[t] = cpu_s() - t0;
    if (kn->end) kn->end();
}

/* The microkernel alone, its fraction of peak per CPU second (as the peak). */
static double ukr_efficiency(vitc_precision p, int nt, double peak) {
    const vitc__lp_kernel *kn = vitc__lp_kernel_for(p);
    const int kw = vitc__lp_kw(kn, p); /* K = 768 */
    ukr_ctx c = {.p = p, .kg = 768 / kw, .iters = 300};
    const int64_t mr = kn->mr, lda = kn->a_kpad ? vitc__lp_a_ld(kn->a_kpad, c.kg) : c.kg;
    int ok = nt <= 64 && mr <= 32;
    for (int t = 0; ok && t < nt; t++) {
        c.pa[t] = vitc__alloc((size_t)(lda * mr) * 4);
        c.pb[t] = vitc__alloc((size_t)(c.kg * VITC_LP_NR) * 4);
        c.C[t] = vitc__alloc((size_t)(mr * VITC_LP_NR) * 4);
        ok = c.pa[t] && c.pb[t] && c.C[t];
        /* bf16 pairs of 1.0 and 2^-7, bytes 1..4: no subnormals, no overflow */
        for (int64_t i = 0; ok && i < lda * mr; i++)
            c.pa[t][i] = p == VITC_PRECISION_BF16 ? 0x3F803F80u
                         : kn->i16                ? 0x00020001u
                                                  : 0x04030201u;
        for (int64_t i = 0; ok && i < c.kg * VITC_LP_NR; i++)
            c.pb[t][i] = p == VITC_PRECISION_BF16 ? 0x3C003C00u
                         : kn->i16                ? 0x00030004u
                                                  : 0x01020304u;
    }
    double best = 1e30;
    for (int r = 0; ok && r < 15; r++) {
        vitc__parallel_for(nt, ukr_task, &c);
        for (int t = 0; t < nt; t++) best = c.t[t] > 0.0 && c.t[t] < best ? c.t[t] : best;
    }
    for (int t = 0; t < nt && t < 64; t++) vitc__free(c.pa[t]), vitc__free(c.pb[t]), vitc__free(c.C[t]);
    if (!ok || peak <= 0.0) return 0.0;
    double ops = 2.0 * (double)mr * VITC_LP_NR * (double)c.kg * kw * (double)c.iters;
    return ops / best * 1e-9 * nt / peak;
}

/* The forward and its stages, timed in turns (each round times every one
 * once, so a busy spell on the machine does not fall on one stage only);
 * each stage's minimum over the rounds. */
static int bound(int reps, int nt, int B, vitc_precision pr, vitc_precision ap) {
    const int64_t N = 197, C = 768, H = 12, M = (int64_t)B * N;
    double peak = measure_peak(pr, nt);
    double e = pr == VITC_PRECISION_FP32 ? 0.0 : ukr_efficiency(pr, nt, peak);
    printf("ViT-B/16 224 px, batch %d, %s weights, %s attention, %d thread(s), min of %d, %s time (load %s)\n", B,
           vitc_precision_name(pr), vitc_precision_name(ap), nt, reps, use_cpu ? "CPU" : "wall", load_avg());
    if (peak > 0.0)
        printf("  peak of the %s instruction, %d thread(s) at once: %.0f G%s/s; the microkernel alone %.1f%% of it\n",
               pr == VITC_PRECISION_INT8 ? "vpdpbusd" : pr == VITC_PRECISION_BF16 ? "vdpbf16ps" : "vfmadd231ps", nt,
               peak, pr == VITC_PRECISION_INT8 ? "OP" : "FLOP", 100.0 * e);
    /* the forward */
    vitc_vit_config cfg = vitc_vit_default_config();
    fwd_ctx f = {.B = B};
    if (vitc_vit_create(&cfg, 1, &f.m) != VITC_OK || vitc_vit_set_precision(f.m, pr) != VITC_OK ||
        vitc_vit_set_attention_precision(f.m, ap) != VITC_OK)
        return fprintf(stderr, "%s\n", vitc_last_error()), 1;
    f.img = malloc((size_t)B * 3 * 224 * 224 * 4), f.out = malloc((size_t)B * 1000 * 4);
    if (!f.img || !f.out) return fprintf(stderr, "out of memory\n"), 1;
    uint32_t seed = 5;
    for (int64_t i = 0; i < (int64_t)B * 3 * 224 * 224; i++) f.img[i] = 2.0f * frand(&seed) - 1.0f;
    /* the products as the block calls them; the patch embedding's (the model's precision) */
    prod_ctx pc[5];
    for (int s = 0; s < 4; s++)
        if (!prod_init(&pc[s], M, shapes[s][0], shapes[s][1], (int)shapes[s][2], pr)) return 1;
    if (!prod_init(&pc[4], (int64_t)B * 196, C, C, 0, pr)) return 1;
    /* The block's data flow, so that each stage finds its input where the
     * forward leaves it (in cache or not): qkv writes the attention's q, k, v
     * (block.c's layout), the attention out_proj's input, out_proj fc1's
     * LayerNorm input and fc2's residual, fc1 fc2's input, fc2 qkv's
     * LayerNorm input. The buffers' own pointers are kept for freeing. */
    float *own[4][3];
    for (int s = 0; s < 4; s++) own[s][0] = pc[s].x, own[s][1] = pc[s].y, own[s][2] = pc[s].r;
    float *qkv = pc[0].y, *o = pc[1].x;
    pc[2].x = pc[1].y, pc[3].x = pc[2].y, pc[3].r = pc[1].y, pc[0].x = pc[3].y;
    attn_ctx a;
    memset(&a, 0, sizeof a);
    a.d = (vitc__sdpa_desc){
        .B = B, .H = H, .L = N, .S = N, .D = C / H, .Dv = C / H,
        .q = qkv, .q_sb = N * 3 * C, .q_sh = C / H, .q_sr = 3 * C,
        .k = qkv + C, .k_sb = N * 3 * C, .k_sh = C / H, .k_sr = 3 * C,
        .v = qkv + 2 * C, .v_sb = N * 3 * C, .v_sh = C / H, .v_sr = 3 * C,
        .o = o, .o_sb = N * C, .o_sh = C / H, .o_sr = C,
        .scale = 0.125f, .prec = ap,
    };
    /* 0 forward, 1..4 products, 5 patch embedding, 6 attention; run in the
     * forward's order: forward, patch embedding, qkv, attention, out_proj,
     * fc1, fc2 */
    bench_fn fn[7] = {fwd_run, prod_run, prod_run, prod_run, prod_run, prod_run, attn_run};
    void *cx[7] = {&f, &pc[0], &pc[1], &pc[2], &pc[3], &pc[4], &a};
    static const int order[7] = {0, 5, 1, 6, 2, 3, 4};
    double mn[7], med, t;
    for (int i = 0; i < 7; i++) mn[i] = 1e30;
    for (int r = -2; r < reps; r++) /* two untimed rounds */
        for (int k = 0; k < 7; k++) {
            int i = order[k];
            if (!time_it(fn[i], cx[i], 0, 1, &t, &med)) return 1;
            if (r >= 0 && t < mn[i]) mn[i] = t;
        }
    for (int i = 0; i < 7; i++) mn[i] *= 1e3;
    vitc_vit_free(f.m), free(f.img), free(f.out);
    for (int s = 0; s < 4; s++) pc[s].x = own[s][0], pc[s].y = own[s][1], pc[s].r = own[s][2];
    for (int s = 0; s < 5; s++) prod_free(&pc[s]);
    /* FLOP as bench/bench.py and vitc bench count them */
    double P = 196.0, Nd = 197.0, D = 768.0, Mm = 3072.0;
    double per_block = 2 * Nd * D * 3 * D + 4 * Nd * Nd * D + 2 * Nd * D * D + 4 * Nd * D * Mm;
    double flop = B * (2 * P * D * 3 * 256 + 12 * per_block + 2 * D * 1000) * 1e-9;
    double gflop = B * 12 * 2 * Nd * D * (3 * D + D + 2 * Mm) * 1e-9;
    double fwd = mn[0], at = 12.0 * mn[6], pe = mn[5], gemm = 0.0;
    printf("  forward: %.1f ms, %.0f GFLOP/s", fwd, flop / fwd * 1e3);
    if (peak > 0.0) printf(", %.1f%% of peak", 100.0 * flop / fwd * 1e3 / peak);
    printf("\n  per forward (12 blocks; each stage alone at the forward's shapes), ms, %% of the forward:\n");
    const char *lab[4] = {"qkv+LN", "out_proj+res", "fc1+LN+GELU", "fc2+res"};
    for (int s = 0; s < 4; s++) {
        double g = 2.0 * (double)M * (double)shapes[s][0] * (double)shapes[s][1] * 1e-9, ms = 12.0 * mn[1 + s];
        gemm += ms;
        printf("    %-13s %7.1f ms %5.1f%%", lab[s], ms, 100.0 * ms / fwd);
        if (peak > 0.0) printf("  (%.1f%% of peak)", 100.0 * 12.0 * g / ms * 1e3 / peak);
        printf("\n");
    }
    printf("    %-13s %7.1f ms %5.1f%%\n", "attention", at, 100.0 * at / fwd);
    printf("    %-13s %7.1f ms %5.1f%%\n", "patch embed", pe, 100.0 * pe / fwd);
    double rest = fwd - gemm - at - pe;
    printf("    %-13s %7.1f ms %5.1f%%  (head, final LayerNorm, between calls; < 0: the stages alone were slower)\n",
           "the rest", rest, 100.0 * rest / fwd);
    /* what the products fuse, timed unfused for scale (inside the products' times above) */
    const int warm = 1;
    double ln = 24.0 * time_op(0, M, C, pr, warm, reps), ge = 12.0 * time_op(1, M, 4 * C, pr, warm, reps);
    double ra = 24.0 * time_op(2, M, C, pr, warm, reps);
    double cv = pr == VITC_PRECISION_FP32 ? 0.0
                                          : 12.0 * (3.0 * time_op(3, M, C, pr, warm, reps) +
                                                    time_op(3, M, 4 * C, pr, warm, reps));
    printf("  inside the products, each timed alone (unfused) for scale: LayerNorm %.1f ms, conversion to %s %.1f ms, "
           "GELU %.1f ms, residual adds %.1f ms\n",
           ln, pr == VITC_PRECISION_INT8 ? "uint8" : pr == VITC_PRECISION_BF16 ? "bf16" : "-", cv, ge, ra);
    if (peak > 0.0 && e > 0.0) {
        /* what is not the four products: the attention (at its kernel's
         * speed, after the qkv product as in the forward) and the patch
         * embedding; the head and the final LayerNorm (~0.1%) left out */
        double other = at + pe, floor_ms = gflop / (peak * e) * 1e3, lo = floor_ms + other;
        printf("  bound: products at the microkernel's own %.1f%% %.1f ms + attention and patch embedding %.1f ms "
               "= %.1f ms => at most %.1f%% of peak (now %.1f%%; the products alone at %.1f%%)\n",
               100.0 * e, floor_ms, other, lo, 100.0 * flop / peak / lo * 1e3, 100.0 * flop / fwd * 1e3 / peak,
               100.0 * gflop / gemm * 1e3 / peak);
    }
    return 0;
}

int main(int argc, char **argv) {
    int bnd = argc > 1 && strcmp(argv[1], "--bound") == 0;
    if (bnd) argv++, argc--;
    int reps = argc > 1 ? atoi(argv[1]) : 9, nt = argc > 2 ? atoi(argv[2]) : 2;
    int64_t M = argc > 3 ? atoll(argv[3]) : bnd ? 1 : 1576;
    const char *pn = argc > 4 ? argv[4] : "bf16", *an = argc > 5 ? argv[5] : "fp32";
    const char *wv = getenv("VITC_BENCH_WARM");
    int warm = wv ? atoi(wv) : 3;
    if (reps < 1 || reps > 1000 || nt < 1 || M < 1 || warm < 0 || (bnd && M > 64)) {
        fprintf(stderr, "usage: bench_gemm_lp [reps 1..1000] [threads] [M] [fp32|bf16|int8]\n"
                        "       bench_gemm_lp --bound [reps] [threads] [batch 1..64] [bf16|int8|fp32] [fp32|bf16|int8]\n");
        return 2;
    }
    vitc_precision pr = strcmp(pn, "int8") == 0   ? VITC_PRECISION_INT8
                        : strcmp(pn, "fp32") == 0 ? VITC_PRECISION_FP32
                                                  : VITC_PRECISION_BF16;
    vitc_set_num_threads(nt);
    const char *ck = getenv("VITC_BENCH_CLOCK");
    use_cpu = ck ? strcmp(ck, "cpu") == 0 : nt == 1;
    warm_pool();
    if (bnd)
        return bound(reps, nt, (int)M, pr,
                     strcmp(an, "bf16") == 0   ? VITC_PRECISION_BF16
                     : strcmp(an, "int8") == 0 ? VITC_PRECISION_INT8
                                               : VITC_PRECISION_FP32);
    double peak = measure_peak(pr, nt), ms[4];
    printf("%s, %d thread(s), M = %lld, %d reps, %s time (load %s)", vitc_precision_name(pr), nt, (long long)M,
           reps, use_cpu ? "CPU" : "wall", load_avg());
    if (peak > 0.0) printf(", peak measured here %.0f G%s/s", peak, pr == VITC_PRECISION_INT8 ? "OP" : "FLOP");
    printf("\n");
    if (!time_products(pr, M, warm, reps, peak, ms)) return 1;
    double total = ms[0] + ms[1] + ms[2] + ms[3];
    printf("a block's four: %.2f ms (x 12 layers: %.1f ms)\n", total, total * 12.0);
    return 0;
}
