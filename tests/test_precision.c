/* test_precision.c — packed fp32, bf16 and int8 Linear layers: every kernel
 * this CPU has against the portable reference (the same bits), the
 * reference against float64 (within the precision's error bound), and the
 * fused GELU against GELU after the GEMM. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/gemm_lp.h"
#include "kernels/kernels.h"
#include "testutil.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) { /* [-1, 1) */
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) / 8388608.0 - 1.0);
}
static float *rnd(size_t n, float amp) {
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = amp * frand();
    return p;
}

typedef struct { int64_t M, N, K; } shape;
static const shape shapes[] = {
    {1, 1, 1}, {13, 50, 37}, {12, 32, 64}, {25, 70, 1100}, {197, 96, 768}, {3, 200, 130},
    {30, 420, 1100}, /* several B blocks of the bf16 / int8 driver */
    {197, 300, 200}, {300, 330, 100}, /* columns split: A converted in the region, 2 / 3 blocks */
    {150, 100, 1700}, /* rows longer than 768 bf16 (both precisions): several A blocks of fewer rows */

};

/* Activation act (VITC__ACT_*) as a pass of its own. */
static void act_after(int act, float *y, int64_t n) {
    if (act == VITC__ACT_GELU) vitc__gelu(y, n);
    if (act == VITC__ACT_QUICK_GELU) vitc__quick_gelu(y, n);
    if (act == VITC__ACT_TANH_GELU) vitc__tanh_gelu(y, n);
}

/* The layer scale in the epilogue (vitc__linear_pw_scaled) gives the
 * product without it, then vitc__scale_add with the residual: bitwise. */
static void check_scaled(const char *what, const float *x, const vitc__pweight *pw, const float *W,
                         const float *b, const float *r, float *y0, float *y1, int64_t M,
                         int64_t N, int64_t K) {
    float *g = rnd((size_t)N, 0.3f);
    for (int with_r = 0; with_r < 2; with_r++) {
        const float *res = with_r ? r : NULL;
        assert_int_equal(vitc__linear_pw(y0, N, x, K, pw, W, b, NULL, 0, M, N, K, 0), VITC_OK);
        vitc__scale_add(y0, N, g, res, N, M, N);
        assert_int_equal(vitc__linear_pw_scaled(y1, N, x, K, pw, W, b, g, res, N, M, N, K),
                         VITC_OK);
        if (memcmp(y0, y1, (size_t)(M * N) * 4))
            fail_msg("%s %lldx%lldx%lld: layer scale in the epilogue differs (residual %d)", what,
                     (long long)M, (long long)N, (long long)K, with_r);
    }
    free(g);
}

/* Packed fp32 panels give the unpacked GEMM's bits; a fused activation
 * (erf, quick or tanh GELU) gives it after; on every path, with and
 * without bias / residual. */
static void test_fp32_packed_same_bits(void **state) {
    (void)state;
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch_best(a)) != VITC_OK) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
            float *x = rnd((size_t)(M * K), 1.0f), *W = rnd((size_t)(N * K), 0.1f);
            float *b = rnd((size_t)N, 0.5f), *r = rnd((size_t)(M * N), 1.0f);
            float *y0 = calloc((size_t)(M * N), 4), *y1 = calloc((size_t)(M * N), 4);
            vitc__pweight pw;
            assert_int_equal(vitc__pweight_pack(&pw, W, N, K, VITC_PRECISION_FP32), VITC_OK);
            for (int gelu = 0; gelu < 4; gelu++) {
                vitc__linear(y0, N, x, K, W, b, gelu ? NULL : r, N, M, N, K);
                act_after(gelu, y0, M * N);
                assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, W, b, gelu ? NULL : r, N, M, N,
                                                 K, gelu),
                                 VITC_OK);
                if (memcmp(y0, y1, (size_t)(M * N) * 4))
                    fail_msg("%s fp32 packed %lldx%lldx%lld gelu=%d differs", tu_arch_best(a),
                             (long long)M, (long long)N, (long long)K, gelu);
            }
            check_scaled(tu_arch_best(a), x, &pw, W, b, r, y0, y1, M, N, K); /* packed */
            check_scaled(tu_arch_best(a), x, NULL, W, b, r, y0, y1, M, N, K); /* row-major */
            if (vitc_set_gemm_backend("openblas") == VITC_OK) { /* a pass after its GEMM */
                check_scaled("openblas", x, &pw, W, b, r, y0, y1, M, N, K);
                vitc_set_gemm_backend(NULL);
            }
            vitc__pweight_free(&pw);
            free(x), free(W), free(b), free(r), free(y0), free(y1);
        }
    }
    vitc_set_arch(NULL);
}

/* The reference kernel's bf16 / int8 number of y = x W^T + b against
 * float64, within the error of the precision: bf16 rounds each operand
 * (relative 2^-8) and sums in float; int8 rounds each operand to half its
 * scale. */
static void check_vs_f64(vitc_precision p, const float *x, const float *W, const float *b,
                         const float *y, int64_t M, int64_t N, int64_t K) {
    for (int64_t i = 0; i < M; i++) {
        float mn = 0, mx = 0;
        for (int64_t k = 0; k < K; k++) {
            mn = fminf(mn, x[i * K + k]);
            mx = fmaxf(mx, x[i * K + k]);
        }
        double sa = (mx - mn) / 255.0;
        for (int64_t j = 0; j < N; j++) {
            double ref = b[j], mag = fabs(b[j]), bound = 0, amax = 0;
            for (int64_t k = 0; k < K; k++) amax = fmax(amax, fabs(W[j * K + k]));
            double sw = amax / 127.0;
            for (int64_t k = 0; k < K; k++) {
                double xv = x[i * K + k], wv = W[j * K + k];
                ref += xv * wv;
                mag += fabs(xv * wv);
                bound += p == VITC_PRECISION_BF16
                             ? fabs(xv * wv) * (2.0 / 256 + 1e-6)
                             : 0.5001 * (fabs(xv) * sw + fabs(wv) * sa) + 0.2501 * sa * sw;
            }
            bound += mag * 1e-6 * (double)K; /* the float sums */
            if (fabs(y[i * N + j] - ref) > bound + 1e-30)
                fail_msg("%s y[%lld,%lld] = %.9g, float64 %.9g, bound %.3g",
                         vitc_precision_name(p), (long long)i, (long long)j, y[i * N + j], ref,
                         bound);
        }
    }
}

/* bf16 y1 against y0 (the reference) where the kernels add the same exact
 * products in another order (AMX's tdpbf16ps: per tile, even and odd
 * halves of the pairs in two partial sums): each is within gamma_n S of the
 * exact sum (S = sum |x w|, n ~ 2 kg + 2 additions, u = 2^-24), so they
 * differ by at most twice that; then the epilogue's roundings (bias,
 * residual: an ulp each) and GELU (slope below 1.13). Returns how many
 * outputs differ at all. */
static int64_t check_bf16_close(const char *what, const float *x, const float *W, const float *y0,
                                const float *y1, int64_t M, int64_t N, int64_t K, int gelu) {
    int64_t ndiff = 0;
    double n = 2.0 * (double)((K + 1) / 2) + 2.0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double S = 0;
            for (int64_t k = 0; k < K; k++) S += fabs((double)x[i * K + k] * W[j * K + k]);
            double bound = 1.2 * (2.0 * n * 0x1p-24 * S * 1.02) + 4.0 * 0x1p-24 * fabs(y0[i * N + j]) + 1e-30;
            double d = fabs((double)y1[i * N + j] - y0[i * N + j]);
            ndiff += y1[i * N + j] != y0[i * N + j];
            if (!(d <= bound))
                fail_msg("%s bf16 %lldx%lldx%lld gelu=%d: y[%lld,%lld] = %.9g, reference %.9g, "
                         "bound %.3g", what, (long long)M, (long long)N, (long long)K, gelu,
                         (long long)i, (long long)j, y1[i * N + j], y0[i * N + j], bound);
        }
    return ndiff;
}

/* Is the kernel of p on the current path an AMX one (bf16: another order
 * of the fp32 sums than the reference's)? */
static int lp_is_amx(vitc_precision p) {
    const vitc__lp_kernel *k = vitc__lp_kernel_for(p);
#if defined(VITC_KERNELS_X86) /* the x86 kernels are in this build */
    if (k == &vitc__lp_bf16_amx) return 1;
#endif
    return k == &vitc__lp_bf16_amx_emul;
}

/* Every path's kernel against the reference (VITC_ARCH=generic selects it),
 * bit for bit (bf16 on AMX: within the reordering bound); the reference
 * against float64. */
/* LayerNorm computed by the threads converting A (vitc__linear_pw_ln), on
 * 1 to 3 threads, columns claimed in chunks: the bits of LayerNorm and then
 * the GEMM on one thread, ln->y included. */
static void check_ln_threads(const char *arch, const float *x, const vitc__pweight *pw,
                             const float *b, int64_t M, int64_t N, int64_t K) {
    float *lw = rnd((size_t)K, 1.0f), *lb = rnd((size_t)K, 0.5f);
    float *h0 = calloc((size_t)(M * K), 4), *h1 = calloc((size_t)(M * K), 4);
    float *y0 = calloc((size_t)(M * N), 4), *y1 = calloc((size_t)(M * N), 4);
    vitc_set_num_threads(1);
    vitc__layernorm(h0, x, lw, lb, M, K, 1e-6f);
    assert_int_equal(vitc__linear_pw(y0, N, h0, K, pw, NULL, b, NULL, 0, M, N, K, VITC__ACT_GELU),
                     VITC_OK);
    for (int nt = 1; nt <= 3; nt++) {
        vitc_set_num_threads(nt);
        memset(h1, 0, (size_t)(M * K) * 4), memset(y1, 0, (size_t)(M * N) * 4);
        vitc__ln_pre ln = {h1, x, lw, lb, 1e-6f, 0};
        assert_int_equal(vitc__linear_pw_ln(y1, N, &ln, pw, NULL, b, M, N, K, VITC__ACT_GELU),
                         VITC_OK);
        if (memcmp(h0, h1, (size_t)(M * K) * 4) || memcmp(y0, y1, (size_t)(M * N) * 4))
            fail_msg("%s on %s: LayerNorm + GEMM %lldx%lldx%lld on %d threads differs",
                     vitc_precision_name(pw->prec), arch, (long long)M, (long long)N, (long long)K, nt);
        /* y_unused: the same output, and strips of rows that fit the stack
         * scratch (12 x 1,024) never written to ln->y */
        memset(h1, 0, (size_t)(M * K) * 4), memset(y1, 0, (size_t)(M * N) * 4);
        ln.y_unused = 1;
        assert_int_equal(vitc__linear_pw_ln(y1, N, &ln, pw, NULL, b, M, N, K, VITC__ACT_GELU),
                         VITC_OK);
        int written = 0;
        for (int64_t i = 0; i < M * K; i++) written |= h1[i] != 0.0f;
        if (memcmp(y0, y1, (size_t)(M * N) * 4) || (K <= 1024 && written))
            fail_msg("%s on %s: LayerNorm + GEMM %lldx%lldx%lld on %d threads, y unused: %s",
                     vitc_precision_name(pw->prec), arch, (long long)M, (long long)N, (long long)K,
                     nt, written ? "ln->y written" : "the output differs");
    }
    vitc_set_num_threads(0);
    free(lw), free(lb), free(h0), free(h1), free(y0), free(y1);
}

static void lp_case(vitc_precision p) {
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
        float *x = rnd((size_t)(M * K), 2.0f), *W = rnd((size_t)(N * K), 0.1f);
        float *b = rnd((size_t)N, 0.5f), *r = rnd((size_t)(M * N), 1.0f);
        float *y0 = calloc((size_t)(M * N), 4), *y1 = calloc((size_t)(M * N), 4);
        vitc__pweight pw;
        assert_int_equal(vitc__pweight_pack(&pw, W, N, K, p), VITC_OK);
        assert_int_equal(vitc_set_arch("generic"), VITC_OK);
        assert_int_equal(vitc__linear_pw(y0, N, x, K, &pw, NULL, b, NULL, 0, M, N, K, 0), VITC_OK);
        check_vs_f64(p, x, W, b, y0, M, N, K);
        for (int gelu = 0; gelu < 2; gelu++)
            for (int a = 0; a < TU_NARCH; a++) {
                if (vitc_set_arch(tu_arch_best(a)) != VITC_OK) continue;
                const float *res = gelu ? NULL : r;
                assert_int_equal(vitc__linear_pw(y0, N, x, K, &pw, NULL, b, res, N, M, N, K, 0),
                                 VITC_OK);
                if (gelu) vitc__gelu(y0, M * N);
                assert_int_equal(vitc_set_arch("generic"), VITC_OK);
                assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, NULL, b, res, N, M, N, K, 0),
                                 VITC_OK);
                assert_int_equal(vitc_set_arch(tu_arch_best(a)), VITC_OK);
                if (gelu) vitc__gelu(y1, M * N); /* the path's own GELU */
                if (p == VITC_PRECISION_BF16 && lp_is_amx(p))
                    check_bf16_close(tu_arch_best(a), x, W, y1, y0, M, N, K, gelu);
                else if (memcmp(y0, y1, (size_t)(M * N) * 4))
                    fail_msg("%s on %s (%s) %lldx%lldx%lld differs from the reference",
                             vitc_precision_name(p), tu_arch_best(a), vitc_get_precision_paths(),
                             (long long)M, (long long)N, (long long)K);
                /* fused GELU == GELU after; so do quick-GELU (in registers
                 * too) and tanh-GELU (on each finished tile) */
                for (int act = gelu; act && act < 4; act++) {
                    assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, NULL, b, NULL, 0, M, N, K,
                                                     act),
                                     VITC_OK);
                    if (act > VITC__ACT_GELU) {
                        assert_int_equal(vitc__linear_pw(y0, N, x, K, &pw, NULL, b, NULL, 0, M, N,
                                                         K, 0),
                                         VITC_OK);
                        act_after(act, y0, M * N);
                    }
                    if (memcmp(y0, y1, (size_t)(M * N) * 4))
                        fail_msg("%s on %s: fused activation %d differs",
                                 vitc_precision_name(p), tu_arch_best(a), act);
                }
                if (!gelu) {
                    check_scaled(vitc_precision_name(p), x, &pw, NULL, b, r, y0, y1, M, N, K);
                    check_ln_threads(tu_arch_best(a), x, &pw, b, M, N, K);
                }
            }
        vitc__pweight_free(&pw);
        free(x), free(W), free(b), free(r), free(y0), free(y1);
    }
    vitc_set_arch(NULL);
}

static void test_bf16(void **state) {
    (void)state;
    lp_case(VITC_PRECISION_BF16);
}
static void test_int8(void **state) {
    (void)state;
    lp_case(VITC_PRECISION_INT8);
}

/* The converters on awkward values: subnormals, NaN, infinities, ties,
 * huge and tiny numbers; the SIMD one must write the reference's words. */
static void test_row_converters(void **state) {
    (void)state;
    const vitc__lp_kernel *fast[2] = {NULL, NULL}, *ref[2] = {&vitc__lp_bf16_ref, &vitc__lp_int8_ref};
    if (vitc_set_arch("avx512") == VITC_OK) {
        fast[0] = vitc__lp_kernel_for(VITC_PRECISION_BF16);
        fast[1] = vitc__lp_kernel_for(VITC_PRECISION_INT8);
    }
    vitc_set_arch(NULL);
    float x[77];
    for (int i = 0; i < 77; i++) x[i] = 3.0f * frand();
    uint32_t tie = 0x3F808000u, tie2 = 0x3F818000u, sub = 0x00012345u, nsub = 0x80400000u;
    memcpy(&x[1], &tie, 4);
    memcpy(&x[2], &tie2, 4);
    memcpy(&x[3], &sub, 4);
    memcpy(&x[4], &nsub, 4);
    x[5] = 3.0e38f, x[6] = -0.0f, x[7] = 1e-30f;
    /* bf16 of specials (NaN, inf) checked on their own row: int8 is not
     * defined bitwise for them (min/max of NaN differ) */
    float sp[5] = {NAN, INFINITY, -INFINITY, -NAN, 1.0f};
    for (int c = 0; c < 2; c++) {
        if (!fast[c] || fast[c] == ref[c] || !fast[c]->row) continue; /* amx-emulated: the reference rows */
        for (int K = 1; K <= 77; K += 19) {
            uint32_t a[80 * 12], b[80 * 12];
            memset(a, 0xAB, sizeof a), memset(b, 0xAB, sizeof b);
            float s0 = 0, s1 = 0;
            int32_t z0 = 0, z1 = 0;
            /* bf16 reads scale as a multiplier (the attention's 1 / sum) */
            ref[c]->row(a, 12, x, K, c ? &s0 : NULL, &z0);
            fast[c]->row(b, 12, x, K, c ? &s1 : NULL, &z1);
            assert_memory_equal(a, b, sizeof a);
            assert_true(s0 == s1 && z0 == z1);
            if (c == 0) {
                for (int m = 0; m < 3; m++) {
                    float mul = (float[]){0.37f, 1.0f / 197.0f, 1e-30f}[m], mul1 = mul;
                    memset(a, 0xAB, sizeof a), memset(b, 0xAB, sizeof b);
                    ref[c]->row(a, 12, x, K, &mul, NULL);
                    fast[c]->row(b, 12, x, K, &mul1, NULL);
                    assert_memory_equal(a, b, sizeof a);
                    for (int p = 0; 2 * p < K; p++) /* the product's rounding, not x's */
                        assert_int_equal(a[p * 12] & 0xFFFFu, vitc__bf16_rne(x[2 * p] * mul));
                }
            }
        }
        /* the strip converter (12 rows at once, transposed in registers)
         * against the reference's rows, for tails of K and of the rows */
        if (fast[c]->strip) {
            static float xs[12 * 150];
            for (int i = 0; i < 12 * 150; i++) xs[i] = x[(i * 7) % 77] * (1.0f + (float)(i % 12));
            for (int K = 1; K <= 150; K += 149 / 7) {
                for (int mi = 0; mi < 4; mi++) {
                    const int mr = (int[]){1, 5, 11, 12}[mi];
                    uint32_t a[75 * 12], b[75 * 12];
                    float s0[12] = {0}, s1[12] = {0};
                    int32_t z0[12] = {0}, z1[12] = {0};
                    int64_t kg = c == 0 ? (K + 1) / 2 : (K + 3) / 4;
                    memset(a, 0, sizeof a), memset(b, 0xAB, sizeof b);
                    for (int i = 0; i < mr; i++)
                        ref[c]->row(a + i, 12, xs + i * 150, K, c ? &s0[i] : NULL, &z0[i]);
                    fast[c]->strip(b, 12, 12, xs, 150, mr, K, c ? s1 : NULL, c ? z1 : NULL);
                    if (memcmp(a, b, (size_t)kg * 12 * 4))
                        fail_msg("%s strip K=%d mr=%d differs", c ? "int8" : "bf16", K, mr);
                    assert_memory_equal(s0, s1, sizeof s0);
                    assert_memory_equal(z0, z1, sizeof z0);
                }
            }
        }
        /* bf16 only: 16-row halves of a 32-wide panel (attention_lp.c's
         * K), and the pairs converter (its V), on the same values */
        if (c == 0 && fast[c]->strip) {
            static float xs[16 * 77];
            for (int i = 0; i < 16 * 77; i++) xs[i] = x[(i * 5) % 77] * (float)(1 + i % 16);
            for (int rows = 0; rows <= 16; rows += 5) {
                uint32_t a[39 * 32], b[39 * 32];
                memset(a, 0xAB, sizeof a), memset(b, 0xAB, sizeof b);
                for (int i = 0; i < 16; i++)
                    if (i < rows) ref[c]->row(a + 16 + i, 32, xs + i * 77, 77, NULL, NULL);
                    else for (int q = 0; q < 39; q++) a[q * 32 + 16 + i] = 0;
                fast[c]->strip(b + 16, 32, 16, xs, 77, rows, 77, NULL, NULL);
                assert_memory_equal(a, b, sizeof a);
            }
            for (int n = 1; n <= 76; n += 15) {
                uint32_t a[80], b[80];
                memset(a, 0xAB, sizeof a), memset(b, 0xAB, sizeof b);
                ref[c]->pairs(a, x, x + 1, n), fast[c]->pairs(b, x, x + 1, n);
                assert_memory_equal(a, b, sizeof a);
                ref[c]->pairs(a, sp, NULL, 5), fast[c]->pairs(b, sp, NULL, 5);
                assert_memory_equal(a, b, sizeof a);
            }
        }
        if (c == 0) {
            uint32_t a[12 * 3], b[12 * 3];
            memset(a, 0, sizeof a), memset(b, 0, sizeof b);
            ref[c]->row(a, 12, sp, 5, NULL, NULL);
            fast[c]->row(b, 12, sp, 5, NULL, NULL);
            assert_memory_equal(a, b, sizeof a);
        }
    }
}

/* ---- AMX: the tile instructions' emulation, and the kernels on it ---------- */

/* A palette-1 tile config: tiles 0-2 with rows r[t] and colsb c[t]. */
static void amx_cfg(uint8_t cfg[64], const int r[3], const int c[3]) {
    memset(cfg, 0, 64);
    cfg[0] = 1;
    for (int t = 0; t < 3; t++) cfg[16 + 2 * t] = (uint8_t)c[t], cfg[48 + t] = (uint8_t)r[t];
}

/* tdpbusd and tdpbf16ps of the emulation against the SDM's pseudo-code
 * computed here in float64 / step by step, on tiles narrower than 16 x 64
 * (bytes past colsb and rows past rows must be ignored on load and
 * written as zero); the uses that fault on hardware are counted and do
 * nothing; where the CPU has AMX, the instructions give the emulation's
 * bits. */
static void test_amx_instructions(void **state) {
    (void)state;
    uint64_t f0 = vitc__amx_emu_faults();
    uint8_t cfg[64];
    /* c: 5 rows x 6 words; a: 5 rows x 3 words (k); b: 3 rows x 6 words */
    const int rows[3] = {5, 5, 3}, colsb[3] = {24, 12, 24};
    amx_cfg(cfg, rows, colsb);
    uint32_t a[16][16], b[16][16], c[16][16], out[16][16];
    for (int m = 0; m < 16; m++)
        for (int k = 0; k < 16; k++) {
            a[m][k] = (uint32_t)(frand() * 2147483647.0f) * 2654435761u;
            b[m][k] = (uint32_t)(frand() * 2147483647.0f) * 2246822519u;
            c[m][k] = (uint32_t)(int32_t)(frand() * 100000.0f);
        }
    vitc__amx_emu_loadconfig(cfg);
    vitc__amx_emu_load(0, c, 64), vitc__amx_emu_load(1, a, 64), vitc__amx_emu_load(2, b, 64);
    vitc__amx_emu_dpbusd(0, 1, 2);
    memset(out, 0xEE, sizeof out);
    vitc__amx_emu_store(0, out, 64);
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < 16; n++) {
            if (m >= 5 || n >= 6) { /* not stored */
                assert_int_equal(out[m][n], 0xEEEEEEEEu);
                continue;
            }
            int64_t acc = (int32_t)c[m][n];
            for (int k = 0; k < 3; k++)
                for (int q = 0; q < 4; q++)
                    acc += (int64_t)(uint8_t)(a[m][k] >> (8 * q)) * (int8_t)(uint8_t)(b[k][n] >> (8 * q));
            assert_int_equal((int32_t)out[m][n], (int32_t)acc);
        }
    /* tdpbf16ps: the even and the odd halves summed apart over the tile's
     * k (FMA, FTZ), then added. Column 0: a row where that order and
     * vdpbf16ps's (odd then even, pair by pair, into one sum) differ;
     * column 1: a bf16 subnormal (read as zero) times 2^100. */
    const int r2[3] = {1, 1, 4}, c2[3] = {8, 16, 8};
    amx_cfg(cfg, r2, c2);
    const float ev[4] = {1.0f, 0x1p-24f, 0x1p-24f, 0.0f}, od[4] = {0.0f, 0x1p-24f, 0x1p-24f, 0.0f};
    memset(a, 0, sizeof a), memset(b, 0, sizeof b), memset(c, 0, sizeof c);
    for (int k = 0; k < 4; k++) {
        a[0][k] = vitc__bf16_rne(ev[k]) | (uint32_t)vitc__bf16_rne(od[k]) << 16;
        b[k][0] = vitc__bf16_rne(1.0f) | (uint32_t)vitc__bf16_rne(1.0f) << 16;
    }
    a[0][3] |= 0x0040u << 16;                          /* odd half: subnormal 2^-127 */
    b[3][1] = (uint32_t)vitc__bf16_rne(0x1p100f) << 16; /* odd half */
    float want[2];
    for (int n = 0; n < 2; n++) { /* the SDM's order in float; subnormal inputs as 0 */
        float e = 0.0f, o = 0.0f;
        for (int k = 0; k < 4; k++) {
            float x0 = vitc__bf16_to_f((uint16_t)a[0][k]), x1 = vitc__bf16_to_f((uint16_t)(a[0][k] >> 16));
            float y0 = vitc__bf16_to_f((uint16_t)b[k][n]), y1 = vitc__bf16_to_f((uint16_t)(b[k][n] >> 16));
            e = fmaf(fabsf(x0) < 0x1p-126f ? 0.0f : x0, y0, e);
            o = fmaf(fabsf(x1) < 0x1p-126f ? 0.0f : x1, y1, o);
        }
        want[n] = 0.0f + (e + o);
    }
    float pairwise = 0.0f; /* vdpbf16ps's order on column 0: must differ */
    for (int k = 0; k < 4; k++) {
        pairwise += od[k]; /* the products: b is 1 in both halves */
        pairwise += ev[k];
    }
    assert_true(want[0] != pairwise);
    assert_true(want[1] == 0.0f && 0x1p-127f * 0x1p100f != 0.0f); /* DAZ matters */
    vitc__amx_emu_loadconfig(cfg);
    vitc__amx_emu_zero(0);
    vitc__amx_emu_load(1, a, 64), vitc__amx_emu_load(2, b, 64);
    vitc__amx_emu_dpbf16ps(0, 1, 2);
    float got[2];
    vitc__amx_emu_store(0, got, 64);
    for (int n = 0; n < 2; n++)
        if (got[n] != want[n]) fail_msg("tdpbf16ps emulated [0][%d] %.9g, SDM %.9g", n, got[n], want[n]);
    assert_int_equal(vitc__amx_emu_faults(), f0);
    /* faults: shapes that do not fit, a tile used twice, a bad config, no config */
    vitc__amx_emu_dpbf16ps(0, 2, 1); /* c has 1 row, "a" (tile 2) 4 */
    vitc__amx_emu_dpbusd(1, 1, 2);
    cfg[2] = 1;
    vitc__amx_emu_loadconfig(cfg);
    vitc__amx_emu_release();
    vitc__amx_emu_zero(0);
    assert_int_equal(vitc__amx_emu_faults(), f0 + 4);
    /* the instructions against the emulation, where there are any */
    const char *why = NULL;
    if (!vitc__amx_usable(&why)) {
        printf("# AMX instructions not run: %s\n", why);
        return;
    }
#if defined(VITC_KERNELS_X86) /* usable implies built; the symbol needs it */
    for (int int8 = 0; int8 < 2; int8++) {
        float fa[16 * 32], fb[16 * 32];
        for (int i = 0; i < 16 * 32; i++) fa[i] = frand(), fb[i] = frand();
        for (int r = 0; r < 16; r++) {
            vitc__lp_bf16_ref.row(a[r], 1, fa + r * 32, 32, NULL, NULL);
            vitc__lp_bf16_ref.row(b[r], 1, fb + r * 32, 32, NULL, NULL);
            for (int n = 0; n < 16; n++) c[r][n] = int8 ? (uint32_t)n : 0;
        }
        memcpy(out, c, sizeof c);
        vitc__amx_tile_dp_amx(int8, c, a, b);
        vitc__amx_tile_dp_amx_emul(int8, out, a, b);
        if (int8) assert_memory_equal(c, out, sizeof c);
        else if (memcmp(c, out, sizeof c))
            printf("# note: tdpbf16ps on this CPU differs from the SDM's order (emulation)\n");
    }
#endif
    assert_int_equal(vitc__amx_emu_faults(), f0 + 4);
}

/* The AMX kernels (emulated here; the instructions too where the CPU has
 * them) through the driver against the reference kernel: shapes with
 * edges of M (1, 5, 16, 17, 33, 197), N (not multiples of 32) and K (odd,
 * not whole tiles, rows whose stride is padded), with bias + residual, bias + GELU, or nothing. int8
 * bit for bit; bf16 within the reordering bound. */
static void amx_kernel_case(const char *kname) {
    static const int64_t Ms[] = {1, 5, 16, 17, 33, 197}, Ns[] = {1, 33, 70, 96},
                         Ks[] = {1, 3, 37, 64, 130, 771, 1024}; /* 1024: A rows padded (4 KB) */
    int64_t nb = 0, ndiff = 0;
    for (int p = 1; p <= 2; p++)
        for (int im = 0; im < 6; im++)
            for (int ik = 0; ik < 7; ik++) {
                int64_t M = Ms[im], K = Ks[ik], N = Ns[(im + ik + p) % 4];
                if (M * K > 40000 && N > 33) N = 33; /* keep the emulation quick */
                vitc_precision pr = (vitc_precision)p;
                float *x = rnd((size_t)(M * K), 2.0f), *W = rnd((size_t)(N * K), 0.1f);
                float *b = rnd((size_t)N, 0.5f), *r = rnd((size_t)(M * N), 1.0f);
                float *y0 = calloc((size_t)(M * N), 4), *y1 = calloc((size_t)(M * N), 4);
                /* each packed for its kernel: avx2's int8 words are int16;
                 * avx2-w7's weights lie in [-64, 64], which the reference
                 * runs as well (pr0); pr1, packed in [-127, 127], avx2-w7
                 * must hand to the reference */
                vitc__pweight pw, pr0, pr1;
                int w7 = !strcmp(kname, "avx2-w7");
                assert_int_equal(vitc__lp_force("reference"), VITC_OK);
                assert_int_equal(vitc__pweight_pack(&pr1, W, N, K, pr), VITC_OK);
                assert_int_equal(vitc__lp_force(w7 ? kname : "reference"), VITC_OK);
                assert_int_equal(vitc__pweight_pack(&pr0, W, N, K, pr), VITC_OK);
                assert_int_equal(vitc__lp_force(kname), VITC_OK);
                assert_int_equal(vitc__pweight_pack(&pw, W, N, K, pr), VITC_OK);
                /* epi 3: quick-GELU (CLIP's), int8 only (check_bf16_close's
                 * bound is erf GELU's) */
                for (int epi = 0; epi < 4; epi++) {
                    if (epi == 3 && pr != VITC_PRECISION_INT8) continue;
                    const float *bias = epi != 2 ? b : NULL, *res = epi == 0 ? r : NULL;
                    int gelu = epi == 1 ? VITC__ACT_GELU : epi == 3 ? VITC__ACT_QUICK_GELU : 0;
                    assert_int_equal(vitc__lp_force("reference"), VITC_OK);
                    assert_int_equal(
                        vitc__linear_pw(y0, N, x, K, &pr0, NULL, bias, res, N, M, N, K, gelu),
                        VITC_OK);
                    assert_int_equal(vitc__lp_force(kname), VITC_OK);
                    assert_string_equal(vitc__lp_kernel_for(pr)->name,
                                        !strcmp(kname, "amx") ? (p == 1 ? "amx-bf16" : "amx-int8")
                                        : w7 && p == 1        ? "avx2"
                                                              : kname);
                    memset(y1, 0xFF, (size_t)(M * N) * 4);
                    assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, NULL, bias, res, N, M, N, K, gelu),
                                     VITC_OK);
                    if (w7 && pr == VITC_PRECISION_INT8) {
                        float *y2 = calloc((size_t)(M * N), 4), *y3 = calloc((size_t)(M * N), 4);
                        assert_int_equal(vitc__linear_pw(y2, N, x, K, &pr1, NULL, bias, res, N,
                                                         M, N, K, gelu), VITC_OK);
                        assert_int_equal(vitc__lp_force("reference"), VITC_OK);
                        assert_int_equal(vitc__linear_pw(y3, N, x, K, &pr1, NULL, bias, res, N,
                                                         M, N, K, gelu), VITC_OK);
                        assert_int_equal(vitc__lp_force(kname), VITC_OK);
                        if (memcmp(y2, y3, (size_t)(M * N) * 4))
                            fail_msg("avx2-w7 on weights in [-127, 127] differs from the "
                                     "reference");
                        free(y2), free(y3);
                    }
                    /* avx2's bf16 FMA adds in the reference's order: exact too */
                    if (pr == VITC_PRECISION_INT8 || !strncmp(kname, "avx2", 4)) {
                        if (memcmp(y0, y1, (size_t)(M * N) * 4))
                            fail_msg("%s %s %lldx%lldx%lld epilogue %d differs from the reference",
                                     kname, vitc_precision_name(pr), (long long)M, (long long)N,
                                     (long long)K, epi);
                    } else {
                        ndiff += check_bf16_close(kname, x, W, y0, y1, M, N, K, gelu);
                        nb += M * N;
                    }
                }
                vitc__pweight_free(&pw);
                vitc__pweight_free(&pr0);
                vitc__pweight_free(&pr1);
                free(x), free(W), free(b), free(r), free(y0), free(y1);
            }
    assert_int_equal(vitc__lp_force(NULL), VITC_OK);
    if (!strncmp(kname, "avx2", 4))
        printf("# %s: int8 and bf16 = reference bit for bit\n", kname);
    else
        printf("# %s: int8 = reference bit for bit; bf16 within the bound, %lld of %lld outputs "
               "differ in their last bits (the order of the sums)\n", kname, (long long)ndiff,
               (long long)nb);
}

/* The AMX kernels' epilogue on the instructions is the AVX-512 kernels'
 * code run over stored sums (vitc__lp_epi_avx512): it must give the
 * reference epilogue's bits (GELU fused: those of the path's GELU after),
 * for tiles cut anywhere; and its A strips come from the AVX-512 row
 * converters with stride 1 (the reference's words). Run here, where AMX
 * is not. */
static void test_amx_epilogue(void **state) {
    (void)state;
#if !defined(VITC_KERNELS_X86)
    printf("# AMX epilogue not checked: no x86 kernels in this build\n");
#else
    __builtin_cpu_init();
    if (vitc_set_arch("avx512") != VITC_OK || !__builtin_cpu_supports("avx512bf16") ||
        !__builtin_cpu_supports("avx512vnni")) {
        printf("# AMX epilogue not checked: no AVX512-BF16 here\n");
        vitc_set_arch(NULL);
        return;
    }
    static const int64_t mrs[] = {1, 5, 12, 13, 17, 32}, nrs[] = {1, 16, 17, 32};
    alignas(64) uint32_t acc[32 * 32];
    float bias[32], ls[32], res[32 * 40], ascale[32], wscale[32], y0[32 * 40], y1[32 * 40];
    int32_t azp[32], wsum[32];
    for (int i = 0; i < 32; i++) {
        bias[i] = frand(), ls[i] = 0.5f * frand();
        ascale[i] = 0.01f * (1.5f + frand()), wscale[i] = 0.02f * (1.5f + frand());
        azp[i] = (int32_t)(128 + 100 * frand()), wsum[i] = (int32_t)(3000 * frand());
    }
    for (int i = 0; i < 32 * 40; i++) res[i] = frand();
    for (int p = 1; p <= 2; p++)
        for (int im = 0; im < 6; im++)
            for (int in = 0; in < 4; in++)
                for (int epi = 0; epi < 8; epi++) {
                    int64_t mr = mrs[im], nr = nrs[in];
                    for (int i = 0; i < 32 * 32; i++) {
                        float v = 3.0f * frand();
                        if (p == 1) memcpy(&acc[i], &v, 4);
                        else acc[i] = (uint32_t)(int32_t)(40000.0f * frand());
                    }
                    vitc__lp_epi e = {.bias = epi & 1 ? bias : NULL, .res = epi & 2 ? res : NULL,
                                      .ls = epi & 4 ? ls : NULL,
                                      .ldr = 40, .ascale = ascale, .azp = azp, .wscale = wscale,
                                      .wsum = wsum};
                    for (int gelu = 0; gelu < 2; gelu++) {
                        memset(y0, 0, sizeof y0), memset(y1, 0, sizeof y1);
                        vitc__lp_epi_ref((vitc_precision)p, acc, 32, y0, 40, mr, nr, &e);
                        if (gelu)
                            for (int64_t i = 0; i < mr; i++) vitc__gelu(y0 + i * 40, nr);
                        e.gelu = gelu;
                        vitc__lp_epi_avx512((vitc_precision)p, acc, 32, y1, 40, mr, nr, &e);
                        e.gelu = 0;
                        if (memcmp(y0, y1, sizeof y0))
                            fail_msg("%s epilogue from memory, %lldx%lld, epilogue %d gelu %d, "
                                     "differs from the reference's",
                                     vitc_precision_name((vitc_precision)p), (long long)mr,
                                     (long long)nr, epi, gelu);
                    }
                }
    /* stride-1 rows (the AMX strips) from the AVX-512 converters */
    float x[150];
    for (int i = 0; i < 150; i++) x[i] = 4.0f * frand();
    for (int K = 1; K <= 150; K += 149 / 6) {
        uint32_t w0[80], w1[80];
        float s0 = 0, s1 = 0;
        int32_t z0 = 0, z1 = 0;
        memset(w0, 0xAB, sizeof w0), memset(w1, 0xAB, sizeof w1);
        vitc__lp_int8_ref.row(w0, 1, x, K, &s0, &z0);
        vitc__row_int8_avx512(w1, 1, x, K, &s1, &z1);
        assert_memory_equal(w0, w1, sizeof w0);
        assert_true(s0 == s1 && z0 == z1);
        vitc__lp_bf16_ref.row(w0, 1, x, K, NULL, NULL);
        vitc__row_bf16_avx512(w1, 1, x, K, NULL, NULL);
        assert_memory_equal(w0, w1, sizeof w0);
    }
    vitc_set_arch(NULL);
#endif
}

static void test_amx_kernels(void **state) {
    (void)state;
    uint64_t f0 = vitc__amx_emu_faults();
    amx_kernel_case("amx-emulated");
    assert_int_equal(vitc__amx_emu_faults(), f0);
    const char *why = NULL;
    if (vitc__amx_usable(&why)) amx_kernel_case("amx");
    else printf("# AMX kernels not run on the instructions: %s\n", why);
    assert_int_equal(vitc__lp_force("no-such-kernel"), VITC_ERR_INVALID_ARG);
}

/* AVX2's kernels for CPUs without AVX512-BF16 / VNNI (int8: int16 words
 * and vpmaddwd; bf16: widened for FMA): their row converters give the
 * references' words (stride 1 and a strip's stride, K with tails, zeros,
 * huge values, NaN, infinities, denormals, rounding ties; bf16 with and
 * without a scale), and through the driver the references' outputs bit
 * for bit, the int8 weights of each packed in its own layout. */
static void test_lp_avx2(void **state) {
    (void)state;
    if (vitc__lp_force("avx2") != VITC_OK || strcmp(vitc__lp_kernel_for(VITC_PRECISION_INT8)->name,
                                                    "avx2")) {
        assert_int_equal(vitc__lp_force(NULL), VITC_OK);
        printf("# avx2 bf16 / int8 kernels not run: no AVX2 here\n");
        return;
    }
    const vitc__lp_kernel *k = vitc__lp_kernel_for(VITC_PRECISION_INT8);
    const vitc__lp_kernel *kb = vitc__lp_kernel_for(VITC_PRECISION_BF16);
    assert_int_equal(k->i16, 1);
    assert_string_equal(kb->name, "avx2");
    /* avx2-w7: vpdpbusd's words (the reference's converter), its weights
     * in [-64, 64] */
    assert_int_equal(vitc__lp_force("avx2-w7"), VITC_OK);
    const vitc__lp_kernel *k7 = vitc__lp_kernel_for(VITC_PRECISION_INT8);
    assert_string_equal(k7->name, "avx2-w7");
    assert_int_equal(k7->wmax, 64);
    for (int K = 1; K <= 77; K += (K < 20 ? 1 : 19)) {
        float x[77];
        for (int i = 0; i < K; i++) x[i] = 3.0f * frand();
        if (K > 9) x[3] = 1e30f, x[4] = -0.0f, x[7] = NAN, x[9] = INFINITY;
        uint32_t w0[39 * 12], w1[39 * 12];
        for (int stride = 1; stride <= 12; stride += 11) {
            memset(w0, 0xAB, sizeof w0), memset(w1, 0xAB, sizeof w1);
            float s0, s1;
            int32_t z0, z1;
            vitc__lp_int8p_ref.row(w0, stride, x, K, &s0, &z0);
            k->row(w1, stride, x, K, &s1, &z1);
            if (memcmp(w0, w1, sizeof w0) || memcmp(&s0, &s1, 4) || z0 != z1)
                fail_msg("avx2 int8 row converter differs from the reference at K = %d, stride %d",
                         K, stride);
            memset(w0, 0xAB, sizeof w0), memset(w1, 0xAB, sizeof w1);
            vitc__lp_int8_ref.row(w0, stride, x, K, &s0, &z0);
            k7->row(w1, stride, x, K, &s1, &z1);
            if (memcmp(w0, w1, sizeof w0) || memcmp(&s0, &s1, 4) || z0 != z1)
                fail_msg("avx2-w7 row converter differs from the reference at K = %d, "
                         "stride %d", K, stride);
            uint32_t tie = 0x3F808000u, sub = 0x00012345u;
            if (K > 12) memcpy(&x[11], &tie, 4), memcpy(&x[12], &sub, 4);
            for (int sc = 0; sc < 2; sc++) {
                float f0 = 0.37f, f1 = 0.37f;
                memset(w0, 0xAB, sizeof w0), memset(w1, 0xAB, sizeof w1);
                vitc__lp_bf16_ref.row(w0, stride, x, K, sc ? &f0 : NULL, NULL);
                kb->row(w1, stride, x, K, sc ? &f1 : NULL, NULL);
                if (memcmp(w0, w1, sizeof w0))
                    fail_msg("avx2 bf16 row converter differs from the reference at K = %d, "
                             "stride %d, scale %d", K, stride, sc);
            }
        }
    }
    assert_int_equal(vitc__lp_force("avx2"), VITC_OK);
    amx_kernel_case("avx2");
    assert_int_equal(vitc__lp_force("avx2-w7"), VITC_OK);
    /* its attention panels: K's rows, V's column quads and P's rows, on
     * [-64, 64] as the reference's (vitc__lp_int8_ref7) */
    for (int64_t K = 1; K <= 70; K += 23) {
        float *x = rnd((size_t)(16 * 72), 2.0f);
        x[5] = NAN, x[72 + 3] = INFINITY, x[2 * 72] = -1e30f, x[3 * 72 + 1] = -0.0f;
        for (int64_t rows = 1; rows <= 16; rows += 15) {
            uint32_t d0[18 * 16], d1[18 * 16];
            float s0[16], s1[16];
            int32_t t0[16], t1[16];
            memset(d0, 0xAB, sizeof d0), memset(d1, 0xAB, sizeof d1);
            vitc__lp_int8_ref7.s8_rows(d0, 16, x, 72, rows, K, s0, t0);
            k7->s8_rows(d1, 16, x, 72, rows, K, s1, t1);
            if (memcmp(d0, d1, sizeof d0) || memcmp(s0, s1, (size_t)rows * 4) ||
                memcmp(t0, t1, (size_t)rows * 4))
                fail_msg("avx2-w7 s8_rows differs from the reference: K %lld, rows %lld",
                         (long long)K, (long long)rows);
            memset(d0, 0xAB, sizeof d0), memset(d1, 0xAB, sizeof d1);
            vitc__lp_int8_ref7.strip_unit(d0, 12, 12, x, 72, rows < 12 ? rows : 12, K, NULL,
                                          NULL);
            k7->strip_unit(d1, 12, 12, x, 72, rows < 12 ? rows : 12, K, NULL, NULL);
            if (memcmp(d0, d1, sizeof d0))
                fail_msg("avx2-w7 strip_unit differs from the reference: K %lld", (long long)K);
        }
        for (int64_t n = 1; n <= 32; n += 13) { /* S = K rows of 72, n columns */
            uint32_t d0[18 * 32], d1[18 * 32];
            float s0[32], s1[32];
            int32_t t0[32], t1[32];
            int64_t S = K < 16 ? K : 16;
            memset(d0, 0xAB, sizeof d0), memset(d1, 0xAB, sizeof d1);
            vitc__lp_int8_ref7.s8_quads(d0, x, 72, S, n, s0, t0);
            k7->s8_quads(d1, x, 72, S, n, s1, t1);
            if (memcmp(d0, d1, (size_t)((S + 3) / 4 * 32 * 4)) || memcmp(s0, s1, (size_t)n * 4) ||
                memcmp(t0, t1, (size_t)n * 4))
                fail_msg("avx2-w7 s8_quads differs from the reference: S %lld, n %lld",
                         (long long)S, (long long)n);
        }
        free(x);
    }
    float W[3 * 5] = {1.0f, -0.5f, 0.25f, 0.126f, -0.0f, 0, 0, 0, 0, 0, -3, 1, 2, 0.01f, 3};
    vitc__pweight pw;
    assert_int_equal(vitc__pweight_pack(&pw, W, 3, 5, VITC_PRECISION_INT8), VITC_OK);
    assert_int_equal(pw.wmax, 64);
    float back[3 * 5];
    vitc__pweight_unpack(&pw, back);
    for (int i = 0; i < 15; i++) {
        float s = pw.wscale[i / 5], q = back[i] / s;
        assert_true(fabsf(q) <= 64.0f && fabsf(q - nearbyintf(q)) < 1e-3f);
        assert_true(fabsf(back[i] - W[i]) <= 0.5f * s * 1.0001f);
    }
    assert_float_equal(pw.wscale[0], 1.0f / 64, 1e-9);
    vitc__pweight_free(&pw);
    amx_kernel_case("avx2-w7");
}

/* A small random ViT (2 threads: the pool's threads each configure their
 * tiles) with VITC_LP_KERNEL=amx-emulated against the default path: int8
 * logits bit for bit (exact sums, the same epilogue and GELU bits), bf16
 * close (another order of the fp32 sums, then bf16 roundings of the next
 * layer's activations, the patch embedding's included since it runs in
 * bf16: a quarter of bf16's own error against fp32 at most; 0.14 of it
 * seen against the reference kernel, 2e-5 against AVX-512's). */
static vitc_vit *small_vit(void);
static void logits(vitc_vit *m, const float *x, float *out, int training);
static void test_amx_vit(void **state) {
    (void)state;
    uint64_t f0 = vitc__amx_emu_faults();
    vitc_set_num_threads(2);
    float *x = rnd(3 * 3 * 32 * 32, 1.0f), f[3 * 40], a[3 * 40], b[3 * 40];
    for (int p = 1; p <= 2; p++) {
        vitc_vit *m = small_vit();
        logits(m, x, f, 0);
        assert_int_equal(vitc_vit_set_precision(m, (vitc_precision)p), VITC_OK);
        /* the GEMMs compared: avx2-w7's int8 attention (panels in [-64,
         * 64]) is not amx-emulated's (test_attention_lp has both) */
        assert_int_equal(vitc_vit_set_attention_precision(m, VITC_PRECISION_FP32), VITC_OK);
        logits(m, x, a, 0);
        assert_int_equal(vitc__lp_force("amx-emulated"), VITC_OK);
        assert_non_null(strstr(vitc_get_precision_paths(), "amx-emulated"));
        logits(m, x, b, 0);
        assert_int_equal(vitc__lp_force(NULL), VITC_OK);
        double d2 = 0, e2 = 0, den = 0;
        for (int k = 0; k < 3 * 40; k++) {
            d2 += (a[k] - b[k]) * (double)(a[k] - b[k]);
            e2 += (a[k] - f[k]) * (double)(a[k] - f[k]);
            den += f[k] * (double)f[k];
        }
        printf("# small ViT %s, amx-emulated against %s: relative logits difference %.3g "
               "(against fp32: %.3g)\n", vitc_precision_name((vitc_precision)p),
               vitc__lp_kernel_for((vitc_precision)p)->name, sqrt(d2 / den), sqrt(e2 / den));
        if (p == VITC_PRECISION_INT8) assert_memory_equal(a, b, sizeof a);
        else assert_true(sqrt(d2 / den) < 0.25 * sqrt(e2 / den));
        vitc_vit_free(m);
    }
    free(x);
    assert_int_equal(vitc__amx_emu_faults(), f0);
}

/* A small random ViT with a random head (vitc_vit_create zeroes it). */
static vitc_vit *small_vit(void) {
    vitc_vit_config c = vitc_vit_default_config();
    c.image_size = 32, c.patch_size = 8, c.hidden_dim = 64, c.depth = 2, c.num_heads = 4;
    c.mlp_dim = 96, c.num_classes = 40;
    vitc_vit *m = NULL;
    assert_int_equal(vitc_vit_create(&c, 7, &m), VITC_OK);
    int i = vitc_vit_find_param(m, "heads.head.weight");
    assert_true(i >= 0);
    float *w;
    assert_int_equal(vitc_vit_param(m, i, NULL, NULL, NULL, &w, NULL), VITC_OK);
    for (int k = 0; k < 40 * 64; k++) w[k] = 0.3f * frand();
    return m;
}

#define NIMG 3
static void logits(vitc_vit *m, const float *x, float *out, int training) {
    vitc_vit_set_training(m, training);
    assert_int_equal(vitc_vit_forward(m, x, NIMG, 32, 32, out), VITC_OK);
    vitc_vit_set_training(m, 0);
}

/* fp32 inference on packed weights gives the unpacked (training-mode)
 * forward's logits bit for bit, on every path, after an arch switch, after
 * a weight write and after an optimizer step; the parameters read back
 * after a forward are the weights, bit for bit. */
static void test_vit_fp32_packed(void **state) {
    (void)state;
    /* OpenBLAS (the avx2 path's default) blocks differently per call shape */
    assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
    vitc_vit *m = small_vit();
    float *x = rnd(NIMG * 3 * 32 * 32, 1.0f), a[NIMG * 40], b[NIMG * 40];
    int np = vitc_vit_num_params(m);
    float *copy[64] = {0};
    size_t len[64];
    assert_true(np < 64);
    for (int i = 0; i < np; i++) {
        const int64_t *shape;
        int nd;
        float *d;
        assert_int_equal(vitc_vit_param(m, i, NULL, &nd, &shape, &d, NULL), VITC_OK);
        len[i] = 1;
        for (int k = 0; k < nd; k++) len[i] *= (size_t)shape[k];
        copy[i] = malloc(len[i] * 4);
        memcpy(copy[i], d, len[i] * 4);
    }
    for (int a_ = 0; a_ < TU_NARCH; a_++) {
        if (vitc_set_arch(tu_arch_best(a_)) != VITC_OK) continue;
        logits(m, x, a, 0); /* packs for this arch's kernel */
        logits(m, x, b, 1);
        if (memcmp(a, b, sizeof a)) fail_msg("%s: packed fp32 logits differ", tu_arch_best(a_));
        logits(m, x, a, 0);
        for (int i = 0; i < np; i++) { /* unpacked exactly */
            float *d;
            assert_int_equal(vitc_vit_param(m, i, NULL, NULL, NULL, &d, NULL), VITC_OK);
            assert_memory_equal(d, copy[i], len[i] * 4);
        }
    }
    vitc_set_arch(NULL);
    /* a write through vitc_vit_param is seen by the next inference forward */
    logits(m, x, a, 0);
    int fc1 = vitc_vit_find_param(m, "encoder.layers.encoder_layer_1.mlp.0.weight");
    float *w;
    assert_int_equal(vitc_vit_param(m, fc1, NULL, NULL, NULL, &w, NULL), VITC_OK);
    for (int k = 0; k < 96 * 64; k++) w[k] *= -1.5f;
    logits(m, x, b, 0);
    assert_true(memcmp(a, b, sizeof a) != 0);
    logits(m, x, a, 1);
    assert_memory_equal(a, b, sizeof a);
    /* an optimizer step after an inference forward (the packs go stale) */
    vitc_optim_config oc = vitc_optim_default_config(VITC_OPTIM_SGD);
    vitc_optimizer *o = NULL;
    assert_int_equal(vitc_optimizer_create_vit(m, &oc, &o), VITC_OK);
    float dl[NIMG * 40];
    for (int k = 0; k < NIMG * 40; k++) dl[k] = frand();
    logits(m, x, a, 1);
    vitc_vit_set_training(m, 1);
    assert_int_equal(vitc_vit_forward(m, x, NIMG, 32, 32, a), VITC_OK);
    assert_int_equal(vitc_vit_backward(m, dl), VITC_OK);
    vitc_vit_set_training(m, 0);
    logits(m, x, b, 0); /* packs (a model with gradients keeps its row-major copy) */
    assert_int_equal(vitc_optimizer_step(o), VITC_OK);
    logits(m, x, a, 0);
    logits(m, x, b, 1);
    assert_memory_equal(a, b, sizeof a);
    float *d;
    assert_int_equal(vitc_vit_param(m, fc1, NULL, NULL, NULL, &d, NULL), VITC_OK);
    int moved = 0;
    for (int k = 0; k < 96 * 64; k++) moved |= d[k] != copy[fc1][k] * -1.5f;
    assert_true(moved);
    for (int k = 0; k < 96 * 64; k++) assert_true(fabsf(d[k]) < 10.0f); /* not zeroed pages */
    vitc_optimizer_free(o);
    for (int i = 0; i < np; i++) free(copy[i]);
    free(x);
    vitc_vit_free(m);
    vitc_set_gemm_backend("auto");
}

/* bf16 / int8 logits close to fp32, and to the generic path's (whose
 * LayerNorm, softmax and GELU differ in the last bits, so int8 may round a
 * few activations the other way: the kernels' own bitwise equality is
 * tested above). */
static void test_vit_lp(void **state) {
    (void)state;
    vitc_vit *m = small_vit();
    float *x = rnd(NIMG * 3 * 32 * 32, 1.0f), f[NIMG * 40], a[NIMG * 40], b[NIMG * 40];
    assert_int_equal(vitc_vit_set_precision(NULL, VITC_PRECISION_BF16), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_vit_set_precision(m, (vitc_precision)5), VITC_ERR_INVALID_ARG);
    /* A default int8 kernel with weights in [-64, 64] (avx2-w7) packs
     * other values than the generic path's reference: the paths are
     * compared with [-127, 127] on both (avx2), and p = 3 is int8 on the
     * default kernel against fp32 alone. */
    int narrow = vitc__lp_kernel_for(VITC_PRECISION_INT8)->wmax != 0;
    for (int p = 1; p <= 3; p++) {
        if (p == 3 && !narrow) break;
        vitc_precision pr = p == 3 ? VITC_PRECISION_INT8 : (vitc_precision)p;
        assert_int_equal(vitc__lp_force(p == 2 && narrow ? "avx2" : NULL), VITC_OK);
        vitc_vit *q = small_vit();
        logits(q, x, f, 0);
        assert_int_equal(vitc_vit_set_precision(q, pr), VITC_OK);
        assert_int_equal(vitc_vit_get_precision(q), pr);
        if (p == 3) {
            logits(q, x, b, 0);
            double e2 = 0, n2 = 0;
            for (int k = 0; k < NIMG * 40; k++)
                e2 += (b[k] - f[k]) * (double)(b[k] - f[k]), n2 += f[k] * (double)f[k];
            printf("# small ViT int8 on %s: relative logits error %.4g\n",
                   vitc__lp_kernel_for(pr)->name, sqrt(e2 / n2));
            assert_true(sqrt(e2 / n2) > 0 && sqrt(e2 / n2) < 0.05);
            vitc_vit_free(q);
            break;
        }
        /* generic: the reference, repacked from those values */
        assert_int_equal(vitc__lp_force(NULL), VITC_OK);
        assert_int_equal(vitc_set_arch("generic"), VITC_OK);
        logits(q, x, a, 0);
        vitc_set_arch(NULL);
        assert_int_equal(vitc__lp_force(p == 2 && narrow ? "avx2" : NULL), VITC_OK);
        logits(q, x, b, 0);
        double num = 0, den = 0, d2 = 0;
        for (int k = 0; k < NIMG * 40; k++) {
            num += (a[k] - f[k]) * (double)(a[k] - f[k]);
            d2 += (a[k] - b[k]) * (double)(a[k] - b[k]);
            den += f[k] * (double)f[k];
        }
        assert_true(sqrt(d2 / den) < 0.005);
        double rel = sqrt(num / den);
        printf("# small ViT %s: relative logits error %.4g\n", vitc_precision_name((vitc_precision)p), rel);
        assert_true(rel > 0 && rel < (p == 1 ? 0.015 : 0.05));
        vitc_vit_free(q);
    }
    assert_int_equal(vitc__lp_force(NULL), VITC_OK);
    free(x);
    vitc_vit_free(m);
}


/* vitc_vit_load_precision (weights packed while read) gives the logits of
 * vitc_vit_load + vitc_vit_set_precision bit for bit, in every precision
 * on every path this CPU has (generic: the portable reference); in fp32 its
 * parameters read back are the file's, bit for bit (the row-major
 * contract), and a training forward gives the same logits. */
static void test_vit_load_precision(void **state) {
    (void)state;
    assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
    char dir[] = "/tmp/vitc_test_loadprec_XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    vitc_vit *src = small_vit();
    assert_int_equal(vitc_vit_save(src, path), VITC_OK);
    float *x = rnd(NIMG * 3 * 32 * 32, 1.0f), a[NIMG * 40], b[NIMG * 40];
    for (int ar = 0; ar < TU_NARCH; ar++) {
        if (vitc_set_arch(tu_arch_best(ar)) != VITC_OK)
            continue;
        for (int p = 0; p < 3; p++) {
            vitc_vit *m1 = NULL, *m2 = NULL;
            assert_int_equal(vitc_vit_load(path, NULL, &m1), VITC_OK);
            assert_int_equal(vitc_vit_set_precision(m1, (vitc_precision)p), VITC_OK);
            assert_int_equal(vitc_vit_load_precision(path, NULL, (vitc_precision)p, &m2), VITC_OK);
            assert_int_equal(vitc_vit_get_precision(m2), p);
            logits(m1, x, a, 0);
            logits(m2, x, b, 0);
            if (memcmp(a, b, sizeof a))
                fail_msg("%s %s: load_precision logits differ from load + set_precision",
                         tu_arch_best(ar), vitc_precision_name((vitc_precision)p));
            if (p == VITC_PRECISION_FP32) {
                for (int i = 0; i < vitc_vit_num_params(m2); i++) {
                    const int64_t *shape;
                    int nd;
                    float *d1, *d2;
                    assert_int_equal(vitc_vit_param(src, i, NULL, &nd, &shape, &d1, NULL), VITC_OK);
                    assert_int_equal(vitc_vit_param(m2, i, NULL, NULL, NULL, &d2, NULL), VITC_OK);
                    size_t n = 1;
                    for (int k = 0; k < nd; k++) n *= (size_t)shape[k];
                    assert_memory_equal(d1, d2, n * 4);
                }
                logits(m2, x, a, 1);
                logits(m2, x, b, 0);
                assert_memory_equal(a, b, sizeof a);
            }
            vitc_vit_free(m1);
            vitc_vit_free(m2);
        }
    }
    vitc_set_arch(NULL);
    /* errors as values, *out NULL */
    vitc_vit *m = (vitc_vit *)1;
    assert_int_equal(vitc_vit_load_precision(path, NULL, (vitc_precision)3, &m), VITC_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(vitc_last_error(), "precision 3"));
    assert_int_equal(vitc_vit_load_precision(NULL, NULL, VITC_PRECISION_INT8, &m), VITC_ERR_INVALID_ARG);
    snprintf(path, sizeof path, "%s/none.safetensors", dir);
    assert_int_not_equal(vitc_vit_load_precision(path, NULL, VITC_PRECISION_INT8, &m), VITC_OK);
    assert_null(m);
    /* a file cut short: the lazy read fails with a message naming the file */
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    char cut[64];
    snprintf(cut, sizeof cut, "%s/cut.safetensors", dir);
    FILE *f = fopen(path, "rb"), *g = fopen(cut, "wb");
    assert_non_null(f);
    assert_non_null(g);
    char buf[4096];
    size_t got, total = 0;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        fwrite(buf, 1, got, g);
        total += got;
    }
    fclose(f);
    fclose(g);
    assert_int_equal(truncate(cut, (off_t)(total - 100)), 0);
    assert_int_not_equal(vitc_vit_load_precision(cut, NULL, VITC_PRECISION_INT8, &m), VITC_OK);
    assert_null(m);
    assert_non_null(strstr(vitc_last_error(), "cut.safetensors"));
    unlink(cut);
    unlink(path);
    rmdir(dir);
    free(x);
    vitc_vit_free(src);
    vitc_set_gemm_backend("auto");
}

static void test_precision_api(void **state) {
    (void)state;
    assert_string_equal(vitc_precision_name(VITC_PRECISION_INT8), "int8");
    assert_null(vitc_precision_name((vitc_precision)7));
    assert_int_equal(vitc_precision_parse("bf16"), VITC_PRECISION_BF16);
    assert_int_equal(vitc_precision_parse("fp16"), -1);
    assert_non_null(strstr(vitc_get_precision_paths(), "bf16: "));
    vitc__pweight pw;
    float w[4] = {1, 2, 3, 4};
    assert_int_equal(vitc__pweight_pack(&pw, w, 2, 2, (vitc_precision)9), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc__pweight_pack(&pw, NULL, 2, 2, VITC_PRECISION_BF16), VITC_ERR_INVALID_ARG);
    float *big = calloc(33001, sizeof(float));
    assert_int_equal(vitc__pweight_pack(&pw, big, 1, 33001, VITC_PRECISION_INT8), VITC_ERR_UNSUPPORTED);
    assert_int_equal(vitc__pweight_pack(&pw, big, 1, 33000, VITC_PRECISION_INT8), VITC_OK);
    vitc__pweight_free(&pw);
    free(big);
}

int main(void) {
    printf("# %s\n", vitc_get_precision_paths());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precision_api),
        cmocka_unit_test(test_fp32_packed_same_bits),
        cmocka_unit_test(test_row_converters),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_int8),
        cmocka_unit_test(test_vit_fp32_packed),
        cmocka_unit_test(test_vit_lp),
        cmocka_unit_test(test_vit_load_precision),
        cmocka_unit_test(test_amx_instructions),
        cmocka_unit_test(test_amx_epilogue),
        cmocka_unit_test(test_amx_kernels),
        cmocka_unit_test(test_lp_avx2),
        cmocka_unit_test(test_amx_vit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
