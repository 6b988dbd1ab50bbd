/* test_zero_shot.c — zero-shot's arithmetic (src/text/zeroshot.c): the
 * template sets, the class embeddings (normalise, average, normalise) and
 * the probabilities (softmax, sigmoid) against float64 computed here, the
 * extremes (a huge scale, an all-zero embedding) and bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "vitc.h"

static void test_templates(void **st) {
    (void)st;
    int n = -1;
    const char *const *t = vitc_zero_shot_templates("imagenet80", &n);
    assert_non_null(t);
    assert_int_equal(n, 80);
    assert_string_equal(t[0], "a bad photo of a {}.");
    assert_string_equal(t[79], "a tattoo of the {}.");
    for (int i = 0; i < n; i++) assert_non_null(strstr(t[i], "{}"));
    t = vitc_zero_shot_templates("simple", &n);
    assert_int_equal(n, 7);
    assert_string_equal(t[0], "itap of a {}.");
    assert_null(vitc_zero_shot_templates("openai", &n));
    assert_int_equal(n, 0);
    assert_null(vitc_zero_shot_templates(NULL, NULL));
}

static void test_classes(void **st) {
    (void)st;
    enum { K = 3, T = 2, D = 4 };
    const float text[K * T * D] = {3, 0, 4, 0,  0, 1, 0, 0,   /* class 0 */
                                   1, 1, 1, 1,  2, 2, 2, 2,   /* class 1: one direction */
                                   -1, 0, 0, 0, 0, 0, 0, 5};  /* class 2 */
    float got[K * D];
    assert_int_equal(vitc_zero_shot_classes(text, K, T, D, got), VITC_OK);
    for (int k = 0; k < K; k++) {
        double m[D] = {0}, s = 0;
        for (int t = 0; t < T; t++) {
            const float *x = text + (k * T + t) * D;
            double nx = 0;
            for (int i = 0; i < D; i++) nx += (double)x[i] * x[i];
            for (int i = 0; i < D; i++) m[i] += x[i] / sqrt(nx) / T;
        }
        for (int i = 0; i < D; i++) s += m[i] * m[i];
        for (int i = 0; i < D; i++) assert_true(fabs(got[k * D + i] - m[i] / sqrt(s)) < 1e-7);
    }
    assert_true(fabs(got[1 * D] - 0.5) < 1e-7);
    /* an all-zero prompt stays zero (F.normalize's eps), no NaN */
    const float zero[D] = {0};
    assert_int_equal(vitc_zero_shot_classes(zero, 1, 1, D, got), VITC_OK);
    for (int i = 0; i < D; i++) assert_true(got[i] == 0.0f);
    assert_int_equal(vitc_zero_shot_classes(text, K, 0, D, got), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_zero_shot_classes(NULL, K, T, D, got), VITC_ERR_INVALID_ARG);
}

static void test_probs(void **st) {
    (void)st;
    enum { B = 2, K = 3, D = 2 };
    const float cls[K * D] = {1, 0, 0, 1, (float)M_SQRT1_2, (float)M_SQRT1_2};
    const float img[B * D] = {2, 0, -1, 3};
    float p[B * K];
    const double scale = 100.0, bias = -10.0;
    for (int sig = 0; sig < 2; sig++) {
        assert_int_equal(vitc_zero_shot_probs(img, B, cls, K, D, (float)scale, (float)bias, sig, p),
                         VITC_OK);
        for (int b = 0; b < B; b++) {
            double z[K], n = hypot(img[b * D], img[b * D + 1]), mx = -1e300, sum = 0;
            for (int k = 0; k < K; k++) {
                z[k] = scale * (img[b * D] * (double)cls[k * D] +
                                img[b * D + 1] * (double)cls[k * D + 1]) / n;
                if (sig)
                    z[k] += bias;
                mx = z[k] > mx ? z[k] : mx;
            }
            for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
            for (int k = 0; k < K; k++) {
                double want = sig ? 1 / (1 + exp(-z[k])) : exp(z[k] - mx) / sum;
                assert_true(fabs(p[b * K + k] - want) < 1e-7);
            }
        }
    }
    /* a huge scale: no overflow, the softmax one-hot, the sigmoid 0 or 1 */
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, K, D, 1e30f, 0, 0, p), VITC_OK);
    assert_true(p[0] == 1.0f && p[1] == 0.0f && p[2] == 0.0f);
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, K, D, 1e30f, 0, 1, p), VITC_OK);
    assert_true(p[0] == 1.0f && p[1] == 0.5f && p[2] == 1.0f);
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, K, D, 1e30f, -1e30f, 1, p), VITC_OK);
    assert_true(p[0] == 0.5f && p[1] == 0.0f && isfinite(p[2]));
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, 0, D, 1, 0, 0, p), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, K, D, NAN, 0, 0, p), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_zero_shot_probs(img, 1, cls, K, D, 1, INFINITY, 1, p),
                     VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc_zero_shot_probs(img, 0, NULL, K, D, 1, 0, 0, NULL), VITC_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_templates),
        cmocka_unit_test(test_classes),
        cmocka_unit_test(test_probs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
