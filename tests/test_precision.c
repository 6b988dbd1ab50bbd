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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_lp.h"
#include "kernels/kernels.h"

static const char *const archs[] = {"avx512", "avx2", "generic"};

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
};

/* Packed fp32 panels give the unpacked GEMM's bits; fused GELU gives GELU
 * after it; on every path, with and without bias / residual. */
static void test_fp32_packed_same_bits(void **state) {
    (void)state;
    for (int a = 0; a < 3; a++) {
        if (vitc_set_arch(archs[a]) != VITC_OK) continue;
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
            float *x = rnd((size_t)(M * K), 1.0f), *W = rnd((size_t)(N * K), 0.1f);
            float *b = rnd((size_t)N, 0.5f), *r = rnd((size_t)(M * N), 1.0f);
            float *y0 = calloc((size_t)(M * N), 4), *y1 = calloc((size_t)(M * N), 4);
            vitc__pweight pw;
            assert_int_equal(vitc__pweight_pack(&pw, W, N, K, VITC_PRECISION_FP32), VITC_OK);
            for (int gelu = 0; gelu < 2; gelu++) {
                vitc__linear(y0, N, x, K, W, b, gelu ? NULL : r, N, M, N, K);
                if (gelu) vitc__gelu(y0, M * N);
                assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, W, b, gelu ? NULL : r, N, M, N,
                                                 K, gelu),
                                 VITC_OK);
                if (memcmp(y0, y1, (size_t)(M * N) * 4))
                    fail_msg("%s fp32 packed %lldx%lldx%lld gelu=%d differs", archs[a],
                             (long long)M, (long long)N, (long long)K, gelu);
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

/* Every path's kernel against the reference (VITC_ARCH=generic selects it),
 * bit for bit; the reference against float64. */
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
            for (int a = 0; a < 3; a++) {
                if (vitc_set_arch(archs[a]) != VITC_OK) continue;
                const float *res = gelu ? NULL : r;
                assert_int_equal(vitc__linear_pw(y0, N, x, K, &pw, NULL, b, res, N, M, N, K, 0),
                                 VITC_OK);
                if (gelu) vitc__gelu(y0, M * N);
                assert_int_equal(vitc_set_arch("generic"), VITC_OK);
                assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, NULL, b, res, N, M, N, K, 0),
                                 VITC_OK);
                assert_int_equal(vitc_set_arch(archs[a]), VITC_OK);
                if (gelu) vitc__gelu(y1, M * N); /* the path's own GELU */
                if (memcmp(y0, y1, (size_t)(M * N) * 4))
                    fail_msg("%s on %s (%s) %lldx%lldx%lld differs from the reference",
                             vitc_precision_name(p), archs[a], vitc_get_precision_paths(),
                             (long long)M, (long long)N, (long long)K);
                /* fused GELU == GELU after */
                if (gelu) {
                    assert_int_equal(vitc__linear_pw(y1, N, x, K, &pw, NULL, b, NULL, 0, M, N, K, 1),
                                     VITC_OK);
                    if (memcmp(y0, y1, (size_t)(M * N) * 4))
                        fail_msg("%s on %s: fused GELU differs", vitc_precision_name(p), archs[a]);
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
        if (!fast[c] || fast[c] == ref[c]) continue;
        for (int K = 1; K <= 77; K += 19) {
            uint32_t a[80 * 12], b[80 * 12];
            memset(a, 0xAB, sizeof a), memset(b, 0xAB, sizeof b);
            float s0 = 0, s1 = 0;
            int32_t z0 = 0, z1 = 0;
            ref[c]->row(a, 12, x, K, &s0, &z0);
            fast[c]->row(b, 12, x, K, &s1, &z1);
            assert_memory_equal(a, b, sizeof a);
            assert_true(s0 == s1 && z0 == z1);
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
}

int main(void) {
    printf("# %s\n", vitc_get_precision_paths());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_precision_api),
        cmocka_unit_test(test_fp32_packed_same_bits),
        cmocka_unit_test(test_row_converters),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_int8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
