/*
 * bench_peak.c — the peaks `vitc bench` puts its workloads next to: the
 * fp32 FMA peak, the bf16 dot-product peak (vdpbf16ps: each fp32 lane adds
 * two bf16 products, 4 flops; AMX tdpbf16ps where the CPU and the OS allow
 * tiles) and the int8 one (vpdpbusd: four u8 x s8 products per int32 lane,
 * 8 ops; AVX-VNNI's ymm form; AMX tdpbusd; without VNNI, AVX2's
 * vpmaddubsw, vpmaddwd and vpaddd). Counted as the workloads are, 2 per multiply-add, so a
 * forward's "% of peak" in bf16 or int8 is over its own precision's
 * ceiling, not over fp32's.
 *
 * Each loop runs independent accumulator chains, enough to cover the
 * instruction's latency times the vector pipes on current x86 cores, from
 * distinct starting values read through a volatile (equal chains would be
 * merged into one by the compiler) and summed at the end (none is dead code).
 */
#include "bench_peak.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "cli.h"
#include "kernels/gemm_lp.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define BENCH_X86 1
/* The bf16 / VNNI / AMX intrinsics and target names: GCC 11, clang 12. */
#if defined(__clang__) ? __clang_major__ >= 12 : __GNUC__ >= 11
#define BENCH_X86_LP 1
#endif
#if defined(BENCH_X86_LP) && defined(__x86_64__)
#define BENCH_AMX 1
#endif
#endif

#define BENCH_REP10(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9)
#define BENCH_REP12(X) BENCH_REP10(X) X(10) X(11)
#define BENCH_REP16(X) BENCH_REP12(X) X(12) X(13) X(14) X(15)

typedef double (*bench_peak_fn)(long iters); /* returns the operations done */

/* ---- fp32 ---------------------------------------------------------- */

/* a = a*m + c converges to 1 and never leaves the normal range. 16 chains:
 * FMA latency (4-5 cycles) times two FMA pipes. */
#ifdef BENCH_X86
__attribute__((target("avx512f,fma"))) static double bench_fma_avx512(long iters) {
    volatile float init = 1.0f;
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f), e = _mm512_set1_ps(init);
    __m512 s = _mm512_setzero_ps();
#define D(j) __m512 a##j = _mm512_mul_ps(e, _mm512_set1_ps((float)(j + 1)));
    BENCH_REP16(D)
#undef D
    for (long i = 0; i < iters; i++) {
#define S(j) a##j = _mm512_fmadd_ps(a##j, m, c);
        BENCH_REP16(S)
#undef S
    }
#define A(j) s = _mm512_add_ps(s, a##j);
    BENCH_REP16(A)
#undef A
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16 * 16 * 2;
}

/* 12 chains: AVX2 has 16 ymm registers, and the loop needs two more. */
__attribute__((target("avx2,fma"))) static double bench_fma_avx2(long iters) {
    volatile float init = 1.0f;
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f), e = _mm256_set1_ps(init);
    __m256 s = _mm256_setzero_ps();
#define D(j) __m256 a##j = _mm256_mul_ps(e, _mm256_set1_ps((float)(j + 1)));
    BENCH_REP12(D)
#undef D
    for (long i = 0; i < iters; i++) {
#define S(j) a##j = _mm256_fmadd_ps(a##j, m, c);
        BENCH_REP12(S)
#undef S
    }
#define A(j) s = _mm256_add_ps(s, a##j);
    BENCH_REP12(A)
#undef A
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    volatile float sink = lanes[0] + lanes[7];
    (void)sink;
    return (double)iters * 12 * 8 * 2;
}
#endif

/* Without SIMD the compiler may still vectorise this; it is a floor, and
 * only used where neither x86 path exists. */
static double bench_fma_scalar(long iters) {
    volatile float init = 1.0f;
    float a[16];
    for (int j = 0; j < 16; j++)
        a[j] = init + (float)j;
    for (long i = 0; i < iters; i++)
        for (int j = 0; j < 16; j++)
            a[j] = fmaf(a[j], 0.999999f, 1e-6f);
    volatile float sink = a[0] + a[15];
    (void)sink;
    return (double)iters * 16 * 2;
}

/* ---- bf16 and int8 on vectors --------------------------------------- */

#ifdef BENCH_X86_LP
/* a += x.x with x = 2^-10: each step adds 2^-19, so over any run's length
 * the chains stay far inside fp32's normal range. */
__attribute__((target("avx512f,avx512bf16"))) static double bench_bf16_avx512(long iters) {
    volatile float init = 0x1p-10f;
    __m512 e = _mm512_set1_ps(init), s = _mm512_setzero_ps();
    __m512bh x = _mm512_cvtne2ps_pbh(e, e);
#define D(j) __m512 a##j = _mm512_mul_ps(e, _mm512_set1_ps((float)(j + 1)));
    BENCH_REP16(D)
#undef D
    for (long i = 0; i < iters; i++) {
#define S(j) a##j = _mm512_dpbf16_ps(a##j, x, x);
        BENCH_REP16(S)
#undef S
    }
#define A(j) s = _mm512_add_ps(s, a##j);
    BENCH_REP16(A)
#undef A
    volatile float sink = _mm512_reduce_add_ps(s);
    (void)sink;
    return (double)iters * 16 * 16 * 2 * 2;
}

/* int32 accumulators wrap harmlessly (vpdpbusd does not saturate). */
__attribute__((target("avx512f,avx512vnni"))) static double bench_int8_avx512(long iters) {
    volatile int init = 1;
    __m512i x = _mm512_set1_epi8((char)init), s = _mm512_setzero_si512();
#define D(j) __m512i a##j = _mm512_set1_epi32(init + j);
    BENCH_REP16(D)
#undef D
    for (long i = 0; i < iters; i++) {
#define S(j) a##j = _mm512_dpbusd_epi32(a##j, x, x);
        BENCH_REP16(S)
#undef S
    }
#define A(j) s = _mm512_add_epi32(s, a##j);
    BENCH_REP16(A)
#undef A
    volatile int sink = _mm512_reduce_add_epi32(s);
    (void)sink;
    return (double)iters * 16 * 16 * 4 * 2;
}

/* AVX-VNNI (VEX-encoded, ymm0-15 only): 12 chains as the AVX2 fp32 loop. */
__attribute__((target("avx2,avxvnni"))) static double bench_int8_avxvnni(long iters) {
    volatile int init = 1;
    __m256i x = _mm256_set1_epi8((char)init), s = _mm256_setzero_si256();
#define D(j) __m256i a##j = _mm256_set1_epi32(init + j);
    BENCH_REP12(D)
#undef D
    for (long i = 0; i < iters; i++) {
#define S(j) a##j = _mm256_dpbusd_avx_epi32(a##j, x, x);
        BENCH_REP12(S)
#undef S
    }
#define A(j) s = _mm256_add_epi32(s, a##j);
    BENCH_REP12(A)
#undef A
    int lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, s);
    volatile int sink = lanes[0] + lanes[7];
    (void)sink;
    return (double)iters * 12 * 8 * 4 * 2;
}

/* Without VNNI: vpmaddubsw (u8 x s8, 32 multiply-adds summed in int16
 * pairs), vpmaddwd against ones (the pairs summed into int32) and the
 * vpaddd that accumulates: the three instructions of the int8 kernel of
 * such CPUs (gemm_lp_madd_avx2.c, avx2-w7), whose ceiling is their rate
 * together. Six products of two rows by three columns, as the kernel's
 * tile has them: only the vpaddd is on a chain. The empty asm tells the
 * compiler the rows change every step, so nothing is loop-invariant.
 * Chained through the multiplies instead (a = a + f(a), as the loops
 * above), 10 chains ran 8% slower on a Zen 3 (latency-bound) than this
 * loop and the kernel. */
__attribute__((target("avx2"))) static double bench_int8_avx2(long iters) {
    volatile int init = 1;
    __m256i x0 = _mm256_set1_epi8((char)init), x1 = _mm256_set1_epi8((char)(init + 1));
    __m256i w0 = _mm256_set1_epi8((char)(init + 2)), w1 = _mm256_set1_epi8((char)(init + 3));
    __m256i w2 = _mm256_set1_epi8((char)(init + 4)), one = _mm256_set1_epi16(1);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
    for (long i = 0; i < iters; i++) {
#define M(c, x, w) c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(x, w), one));
        M(c0, x0, w0) M(c1, x0, w1) M(c2, x0, w2) M(c3, x1, w0) M(c4, x1, w1) M(c5, x1, w2)
#undef M
        __asm__ volatile("" : "+x"(x0), "+x"(x1));
    }
    __m256i s = _mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3));
    s = _mm256_add_epi32(s, _mm256_add_epi32(c4, c5));
    int lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, s);
    volatile int sink = lanes[0] + lanes[7];
    (void)sink;
    return (double)iters * 6 * 32 * 2;
}

/* AVX-VNNI: cpuid leaf 7, subleaf 1, EAX bit 4 (GCC 12's
 * __builtin_cpu_supports does not know it). */
static int bench_has_avxvnni(void) {
    unsigned a, b, c, d;
    return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           ((a >> 4) & 1u);
}
#endif

/* ---- AMX tiles ------------------------------------------------------ */

#ifdef BENCH_AMX
/* ldtilecfg's 64 bytes, palette 1: byte 0 palette, 16.. colsb of tiles
 * 0-15 (u16), 48.. rows (u8); tiles 0-7 16 x 64 bytes. A constant, as the
 * library's kernels keep theirs: GCC 12's _tile_loadconfig does not tell
 * the compiler that it reads its operand, so the stores that filled a
 * config on the stack were deleted as dead and ldtilecfg read garbage
 * (an illegal instruction at the first tile operation on real AMX, seen on
 * an Emerald Rapids; the emulation never runs this). */
static const _Alignas(64) uint8_t bench_amx_cfg[64] = {
    1, 0, [16] = 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
    [48] = 16, 16, 16, 16, 16, 16, 16, 16};

/* Eight 16 x 64-byte tiles: four accumulators (tmm0-3: tdp* latency is
 * ~16 cycles at one per 16 cycles, so four keep the unit busy, as Intel's
 * own kernels do) from two A tiles (tmm4-5) and two B tiles (tmm6-7). Each
 * thread configures and releases its own tiles. */
__attribute__((target("amx-tile"))) static void bench_amx_begin(uint16_t word) {
    _Alignas(64) uint16_t src[16 * 32];
    for (int i = 0; i < 16 * 32; i++)
        src[i] = word;
    _tile_loadconfig(bench_amx_cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, src, 64);
    _tile_loadd(5, src, 64);
    _tile_loadd(6, src, 64);
    _tile_loadd(7, src, 64);
}

__attribute__((target("amx-tile"))) static void bench_amx_end(void) {
    _Alignas(64) float out[16 * 16];
    _tile_stored(0, out, 64);
    _tile_release();
    volatile float sink = out[0];
    (void)sink;
}

/* 16 x 16 fp32 += (16 x 32 bf16) . (32 x 16 bf16): 8,192 multiply-adds;
 * bf16 2^-10 as A and B (0x3a80). */
__attribute__((target("amx-tile,amx-bf16"))) static double bench_bf16_amx(long iters) {
    bench_amx_begin(0x3a80);
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    bench_amx_end();
    return (double)iters * 4 * 16 * 16 * 32 * 2;
}

/* 16 x 16 int32 += (16 x 64 u8) . (64 x 16 s8): 16,384 multiply-adds. */
__attribute__((target("amx-tile,amx-int8"))) static double bench_int8_amx(long iters) {
    bench_amx_begin(0x0101);
    for (long i = 0; i < iters; i++) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    bench_amx_end();
    return (double)iters * 4 * 16 * 16 * 64 * 2;
}
#endif

/* ---- threads -------------------------------------------------------- */

typedef struct bench_peak_arg {
    bench_peak_fn fn;
    long iters;
    int *go; /* 0: wait, 1: start, -1: give up (not every thread started) */
    double flops, seconds;
} bench_peak_arg;

static void *bench_peak_thread(void *p) {
    bench_peak_arg *a = p;
    double t0;
    int go;
    a->fn(a->iters / 20); /* wakes the core up to its vector clock */
    /* A flag rather than a barrier: a thread that could not be created
     * must not leave the others waiting for it. */
    while (!(go = __atomic_load_n(a->go, __ATOMIC_ACQUIRE)))
        sched_yield();
    if (go < 0)
        return NULL;
    t0 = cli_now();
    a->flops = a->fn(a->iters);
    a->seconds = cli_now() - t0;
    return NULL;
}

/* Total G(FL)OP/s of nt threads running the loop at once, best of 5 (the
 * best is the peak; the others were disturbed); 0 when the threads could
 * not be started. */
static double bench_peak_run(bench_peak_fn fn, int nt) {
    enum { MAXT = 64 };
    pthread_t th[MAXT];
    bench_peak_arg arg[MAXT];
    double best = 0;
    long iters = 1 << 10;
    if (nt > MAXT)
        nt = MAXT;
    /* Size the loop to ~0.1 s on one core. */
    for (;;) {
        double t0 = cli_now();
        fn(iters);
        if (cli_now() - t0 > 0.02 || iters > (1L << 40))
            break;
        iters *= 2;
    }
    iters *= 5;
    for (int rep = 0; rep < 5; rep++) {
        double flops = 0, secs = 0;
        int started = 1, go = 0;
        for (int t = 0; t < nt; t++)
            arg[t] = (bench_peak_arg){fn, iters, &go, 0, 0};
        while (started < nt && !pthread_create(&th[started], NULL, bench_peak_thread,
                                               &arg[started]))
            started++;
        if (started < nt) {
            __atomic_store_n(&go, -1, __ATOMIC_RELEASE);
            for (int t = 1; t < started; t++)
                pthread_join(th[t], NULL);
            return 0;
        }
        arg[0].fn(arg[0].iters / 20);
        __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
        {
            double t0 = cli_now();
            arg[0].flops = fn(iters);
            arg[0].seconds = cli_now() - t0;
        }
        for (int t = 1; t < nt; t++)
            pthread_join(th[t], NULL);
        for (int t = 0; t < nt; t++) {
            flops += arg[t].flops;
            if (arg[t].seconds > secs)
                secs = arg[t].seconds;
        }
        if (secs > 0 && flops / secs * 1e-9 > best)
            best = flops / secs * 1e-9;
    }
    return best;
}

/* ---- per precision -------------------------------------------------- */

/* The vector loop for precision p, NULL with *why when the CPU has none. */
static bench_peak_fn bench_peak_vector(bench_peak_prec p, const char **isa, const char **why) {
#ifdef BENCH_X86
    __builtin_cpu_init();
#endif
    *why = NULL;
    if (p == BENCH_PEAK_FP32) {
#ifdef BENCH_X86
        if (__builtin_cpu_supports("avx512f")) {
            *isa = "avx512";
            return bench_fma_avx512;
        }
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            *isa = "avx2";
            return bench_fma_avx2;
        }
#endif
        *isa = "scalar";
        return bench_fma_scalar;
    }
#ifdef BENCH_X86_LP
    if (p == BENCH_PEAK_BF16 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bf16")) {
        *isa = "avx512_bf16";
        return bench_bf16_avx512;
    }
    if (p == BENCH_PEAK_INT8 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512vnni")) {
        *isa = "avx512_vnni";
        return bench_int8_avx512;
    }
    if (p == BENCH_PEAK_INT8 && bench_has_avxvnni()) {
        *isa = "avx_vnni";
        return bench_int8_avxvnni;
    }
    if (p == BENCH_PEAK_INT8 && __builtin_cpu_supports("avx2")) {
        *isa = "avx2_vpmaddubsw";
        return bench_int8_avx2;
    }
    *why = p == BENCH_PEAK_BF16 ? "no AVX512-BF16 (vdpbf16ps) on this CPU"
                                : "no AVX512-VNNI, AVX-VNNI (vpdpbusd) or AVX2 on this CPU";
#else
    *why = "no bf16 / int8 dot-product loop in this build (x86-64 with GCC 11 or clang 12 "
           "and later)";
#endif
    *isa = NULL;
    return NULL;
}

void bench_peak_measure(bench_peak_prec p, int threads, void (*progress)(const char *what),
                        bench_peak *out) {
    const char *isa = NULL, *why = NULL;
    bench_peak_fn vec = bench_peak_vector(p, &isa, &why);
    char what[96];
    memset(out, 0, sizeof *out);
    out->why = why;
    if (vec) {
        if (progress) {
            snprintf(what, sizeof what, "the %s peak (%s)", bench_peak_name(p), isa);
            progress(what);
        }
        out->isa = isa;
        out->one = bench_peak_run(vec, 1);
        out->all = threads > 1 ? bench_peak_run(vec, threads) : out->one;
    }
#ifdef BENCH_AMX
    /* Tiles where cpuid, XCR0 and Linux allow them (vitc's own probe,
     * which also asks Linux for the tile data permission): the
     * precision's peak is then the tiles', the vector loop's kept beside. */
    if (p != BENCH_PEAK_FP32 && vitc__amx_usable(NULL)) {
        bench_peak_fn tile = p == BENCH_PEAK_BF16 ? bench_bf16_amx : bench_int8_amx;
        if (progress) {
            snprintf(what, sizeof what, "the %s peak (amx)", bench_peak_name(p));
            progress(what);
        }
        out->vec_isa = out->isa;
        out->vec_one = out->one;
        out->vec_all = out->all;
        out->isa = "amx";
        out->why = NULL;
        out->one = bench_peak_run(tile, 1);
        out->all = threads > 1 ? bench_peak_run(tile, threads) : out->one;
    }
#endif
}

const char *bench_peak_name(bench_peak_prec p) {
    return p == BENCH_PEAK_BF16 ? "bf16" : p == BENCH_PEAK_INT8 ? "int8" : "fp32";
}

const char *bench_peak_unit(bench_peak_prec p) {
    return p == BENCH_PEAK_INT8 ? "GOP/s" : "GFLOP/s";
}
