/*
 * test_softmax_backward.c — the softmax-with-temperature backward kernel
 * (vitc__softmax_rows_backward) on every CPU path and its reference, against
 * float64; 1 vs 2 threads bitwise; finite differences through the forward;
 * and the public vitc_softmax_backward over a non-last dim.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/kernels.h"

#include "testutil.h"


static uint64_t rng_state = 0x853c49e6748fea9bull;

/* y = softmax(x * it) rows in float64, then dx in float64. */
static void reference(double *dx, float *y, const float *x, const float *dy, int64_t rows, int64_t n,
                      float it) {
    for (int64_t r = 0; r < rows; r++) {
        double mx = -INFINITY, sum = 0.0, dot = 0.0;
        for (int64_t j = 0; j < n; j++) mx = fmax(mx, (double)x[r * n + j] * it);
        double *e = dx + r * n;
        for (int64_t j = 0; j < n; j++) sum += (e[j] = exp((double)x[r * n + j] * it - mx));
        for (int64_t j = 0; j < n; j++) {
            e[j] /= sum;
            y[r * n + j] = (float)e[j];
            dot += e[j] * dy[r * n + j];
        }
        for (int64_t j = 0; j < n; j++) e[j] = it * e[j] * (dy[r * n + j] - dot);
    }
}

static void test_paths_vs_float64(void **state) {
    (void)state;
    static const int64_t ns[] = {1, 3, 8, 15, 16, 17, 197, 1000, 4096};
    static const float its[] = {1.0f, 2.0f, 0.25f};
    double worst[TU_NARCH + 1] = {0}; /* each path, then the reference */
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (size_t b = 0; b < 3; b++) {
            int64_t n = ns[a], rows = n > 1000 ? 3 : 11;
            size_t tot = (size_t)(rows * n);
            float *x = malloc(tot * 4), *y = malloc(tot * 4), *dy = malloc(tot * 4), *dx = malloc(tot * 4);
            double *ref = malloc(tot * 8);
            assert_true(x && y && dy && dx && ref);
            for (size_t i = 0; i < tot; i++) x[i] = 4.0f * tu_urand(&rng_state), dy[i] = tu_urand(&rng_state);
            reference(ref, y, x, dy, rows, n, its[b]);
            for (int p = 0; p <= TU_NARCH; p++) {
                if (p < TU_NARCH) {
                    if (!vitc__cpu_has((vitc__arch)p)) continue;
                    assert_int_equal(vitc_set_arch(tu_arch(p)), VITC_OK);
                    for (size_t i = 0; i < tot; i++) dx[i] = NAN;
                    vitc__softmax_rows_backward(dx, y, dy, rows, n, its[b]);
                } else {
                    vitc__softmax_rows_backward_ref(dx, y, dy, rows, n, its[b]);
                }
                for (size_t i = 0; i < tot; i++) {
                    double e = fabs(dx[i] - ref[i]) / fmax(1.0, fabs(ref[i]));
                    if (!(e <= worst[p])) worst[p] = e;
                }
                if (!(worst[p] <= 1e-5))
                    fail_msg("%s: n %lld it %g: error %.3g", p < TU_NARCH ? tu_arch(p) : "reference",
                             (long long)n, (double)its[b], worst[p]);
            }
            assert_int_equal(vitc_set_arch("auto"), VITC_OK);
            free(x), free(y), free(dy), free(dx), free(ref);
        }
    printf("    worst error:");
    for (int p = 0; p < TU_NARCH; p++) printf(" %s %.2e", tu_arch(p), worst[p]);
    printf(" reference %.2e\n", worst[TU_NARCH]);
}

/* In place (dx = dy), many rows over the pool: the same bits on 1 and 2
 * threads, on every path. */
static void test_threads_and_in_place(void **state) {
    (void)state;
    int64_t rows = 300, n = 333;
    size_t tot = (size_t)(rows * n);
    float *y = malloc(tot * 4), *dy = malloc(tot * 4), *a = malloc(tot * 4), *b = malloc(tot * 4);
    assert_true(y && dy && a && b);
    for (size_t i = 0; i < tot; i++) y[i] = 0.5f + 0.5f * tu_urand(&rng_state), dy[i] = tu_urand(&rng_state);
    int saved = vitc_get_num_threads();
    for (int p = 0; p < TU_NARCH; p++) {
        if (!vitc__cpu_has((vitc__arch)p)) continue;
        assert_int_equal(vitc_set_arch(tu_arch(p)), VITC_OK);
        vitc_set_num_threads(1);
        vitc__softmax_rows_backward(a, y, dy, rows, n, 0.5f);
        vitc_set_num_threads(2);
        memcpy(b, dy, tot * 4);
        vitc__softmax_rows_backward(b, y, b, rows, n, 0.5f);
        assert_memory_equal(a, b, tot * 4);
    }
    vitc_set_num_threads(saved);
    assert_int_equal(vitc_set_arch("auto"), VITC_OK);
    free(y), free(dy), free(a), free(b);
}

/* The public function along dim 1 of [2, 5, 3] against central differences
 * of sum(dy * softmax(x / t)) through vitc_softmax. */
static void test_public_finite_differences(void **state) {
    (void)state;
    const int64_t shape[3] = {2, 5, 3};
    float x[30], dy[30], y[30], dx[30], yp[30];
    for (int i = 0; i < 30; i++) x[i] = 2.0f * tu_urand(&rng_state), dy[i] = tu_urand(&rng_state);
    const float t = 0.7f;
    assert_int_equal(vitc_softmax(x, 3, shape, 1, t, y), VITC_OK);
    assert_int_equal(vitc_softmax_backward(y, dy, 3, shape, 1, t, dx), VITC_OK);
    for (int i = 0; i < 30; i++) {
        double f[2];
        for (int s = 0; s < 2; s++) {
            float keep = x[i];
            x[i] = keep + (s ? -1e-2f : 1e-2f);
            assert_int_equal(vitc_softmax(x, 3, shape, 1, t, yp), VITC_OK);
            x[i] = keep;
            f[s] = 0.0;
            for (int j = 0; j < 30; j++) f[s] += (double)dy[j] * yp[j];
        }
        double fd = (f[0] - f[1]) / 2e-2;
        if (!(fabs(fd - dx[i]) <= 1e-3)) fail_msg("dx[%d]: %g, finite difference %g", i, dx[i], fd);
    }
    /* Bad arguments are errors, not crashes. */
    assert_int_equal(vitc_softmax_backward(NULL, dy, 3, shape, 1, t, dx), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_softmax_backward(y, dy, 3, shape, 3, t, dx), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_softmax_backward(y, dy, 3, shape, 1, 0.0f, dx), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_softmax_backward(y, dy, 9, shape, 1, t, dx), VITC_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_vs_float64),
        cmocka_unit_test(test_threads_and_in_place),
        cmocka_unit_test(test_public_finite_differences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
