/* test_dropout.c — the shared generator (src/rng.h) and dropout / drop path
 * (src/train/dropout.c): the splitmix64 stream, kept fraction, 1/(1-p)
 * scaling, p = 0 and p = 1, reproducibility, gradient only through kept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng.h"

/* The published splitmix64 sequence for seed 1234567 (Rosetta Code,
 * "Pseudo-random numbers/Splitmix64"): the engine must stay splitmix64 so
 * that layer initialisation keeps its values. */
static void test_splitmix64_stream(void **st) {
    (void)st;
    static const uint64_t want[5] = {6457827717110365317ull, 3203168211198807973ull,
                                     9817491932198370423ull, 4593380528125082431ull,
                                     16408922859458223821ull};
    vitc__rng r = {1234567};
    for (int i = 0; i < 5; i++)
        assert_true(vitc__rng_next(&r) == want[i]);
    vitc__rng a = {99}, b = {99};
    for (int i = 0; i < 1000; i++) {
        double u = vitc__rng_uniform(&a);
        assert_true(u >= 0.0 && u < 1.0);
        assert_true(u * 16777216.0 == floor(u * 16777216.0)); /* 24 bits */
        double w = vitc__rng_uniform53(&b);
        assert_true(w >= 0.0 && w < 1.0);
    }
}

static void test_dropout_fraction_and_scale(void **st) {
    (void)st;
    const int64_t n = 200000;
    uint8_t *keep = malloc((size_t)n);
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    assert_non_null(keep);
    assert_non_null(x);
    assert_non_null(y);
    vitc__rng g = {7};
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(2.0 * vitc__rng_uniform(&g) - 1.0);
    const float ps[] = {0.1f, 0.3f, 0.5f, 0.9f};
    for (size_t t = 0; t < sizeof ps / sizeof *ps; t++) {
        float p = ps[t];
        vitc__rng r = {42 + t};
        vitc__dropout_mask(keep, n, p, &r);
        vitc__dropout_apply(y, x, keep, n, p);
        int64_t kept = 0;
        double sx = 0.0, sy = 0.0;
        for (int64_t i = 0; i < n; i++) {
            kept += keep[i];
            if (keep[i])
                assert_true(y[i] == x[i] * (1.0f / (1.0f - p)));
            else
                assert_true(y[i] == 0.0f);
            sx += fabs(x[i]);
            sy += fabs(y[i]);
        }
        /* Binomial(n, 1-p): within 5 standard deviations. */
        double mean = n * (1.0 - p), sd = sqrt(n * p * (1.0 - p));
        assert_true(fabs((double)kept - mean) < 5.0 * sd);
        /* Inverted scaling keeps the expected magnitude: E|y| = E|x|. */
        assert_true(fabs(sy / sx - 1.0) < 5.0 * sqrt(p / ((1.0 - p) * n)) * 2.0);
        /* Same seed, same mask. */
        uint8_t *k2 = malloc((size_t)n);
        assert_non_null(k2);
        vitc__rng r2 = {42 + t};
        vitc__dropout_mask(k2, n, p, &r2);
        assert_memory_equal(keep, k2, (size_t)n);
        free(k2);
    }
    free(keep), free(x), free(y);
}

static void test_dropout_p0_p1(void **st) {
    (void)st;
    enum { N = 1000 };
    uint8_t keep[N];
    float x[N], y[N];
    vitc__rng g = {3};
    for (int i = 0; i < N; i++)
        x[i] = (float)(vitc__rng_uniform(&g) * 100.0 - 50.0);
    vitc__rng r = {5};
    vitc__dropout_mask(keep, N, 0.0f, &r);
    vitc__dropout_apply(y, x, keep, N, 0.0f);
    assert_memory_equal(x, y, sizeof x); /* p = 0: identical, bit for bit */
    vitc__dropout_mask(keep, N, 1.0f, &r);
    vitc__dropout_apply(y, x, keep, N, 1.0f);
    for (int i = 0; i < N; i++)
        assert_true(keep[i] == 0 && y[i] == 0.0f);
    /* In place. */
    float z[N];
    memcpy(z, x, sizeof z);
    vitc__dropout_mask(keep, N, 0.25f, &r);
    vitc__dropout_apply(y, x, keep, N, 0.25f);
    vitc__dropout_apply(z, z, keep, N, 0.25f);
    assert_memory_equal(y, z, sizeof z);
}

/* Backward is the apply on dy: the gradient of sum(w * dropout(x)) is
 * w * keep / (1 - p), checked against a float64 finite difference. */
static void test_dropout_gradient(void **st) {
    (void)st;
    enum { N = 64 };
    uint8_t keep[N];
    float x[N], w[N], g[N];
    vitc__rng r = {11};
    for (int i = 0; i < N; i++)
        x[i] = (float)vitc__rng_uniform(&r), w[i] = (float)(vitc__rng_uniform(&r) - 0.5);
    vitc__dropout_mask(keep, N, 0.4f, &r);
    vitc__dropout_apply(g, w, keep, N, 0.4f);
    for (int i = 0; i < N; i++) {
        float xp[N], yp[N], ym[N];
        const float h = 1e-2f;
        memcpy(xp, x, sizeof xp);
        xp[i] = x[i] + h;
        vitc__dropout_apply(yp, xp, keep, N, 0.4f);
        xp[i] = x[i] - h;
        vitc__dropout_apply(ym, xp, keep, N, 0.4f);
        double d = 0.0;
        for (int j = 0; j < N; j++)
            d += (double)w[j] * ((double)yp[j] - (double)ym[j]);
        d /= 2.0 * h;
        assert_true(fabs(d - g[i]) < 1e-5 * fmax(1.0, fabs(d)));
        if (!keep[i])
            assert_true(g[i] == 0.0f);
    }
}

static void test_drop_path(void **st) {
    (void)st;
    enum { B = 4000, P = 3 };
    static uint8_t keep[B];
    static float x[B * P], y[B * P], res[B * P];
    vitc__rng r = {17};
    for (int i = 0; i < B * P; i++)
        x[i] = (float)(vitc__rng_uniform(&r) + 0.5), res[i] = (float)i;
    const float p = 0.2f;
    vitc__dropout_mask(keep, B, p, &r);
    vitc__drop_path_apply(y, x, keep, B, P, p, 0);
    int kept = 0;
    for (int b = 0; b < B; b++) {
        kept += keep[b];
        for (int i = 0; i < P; i++) /* the whole sample is kept or dropped */
            assert_true(y[b * P + i] == (keep[b] ? x[b * P + i] * (1.0f / (1.0f - p)) : 0.0f));
    }
    assert_true(fabs(kept - B * (1.0 - p)) < 5.0 * sqrt(B * p * (1.0 - p)));
    /* Residual form: res += drop_path(x). */
    vitc__drop_path_apply(res, x, keep, B, P, p, 1);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < P; i++)
            assert_true(res[b * P + i] == (float)(b * P + i) + y[b * P + i]);
    /* p = 0 is the identity. */
    vitc__dropout_mask(keep, B, 0.0f, &r);
    vitc__drop_path_apply(y, x, keep, B, P, 0.0f, 0);
    assert_memory_equal(x, y, sizeof x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_splitmix64_stream),
        cmocka_unit_test(test_dropout_fraction_and_scale),
        cmocka_unit_test(test_dropout_p0_p1),
        cmocka_unit_test(test_dropout_gradient),
        cmocka_unit_test(test_drop_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
