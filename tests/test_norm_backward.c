/* test_norm_backward.c — GroupNorm and BatchNorm2d backward (training and
 * eval statistics), the patch scatter, against central finite
 * differences of a float64 forward, on every arch path and 1 and 2 threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops_layers_backward.h"
#include "kernels/ops_layers.h"

#include "testutil.h"


static uint64_t rng = 0x2545F4914F6CDD1Dull;
static double drand(void) {
    return tu_drand(&rng);
}
static void fill(float *a, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) a[i] = (float)(lo + (hi - lo) * drand());
}

/* loss = sum(dy * norm(x)) in float64. kind 0: GroupNorm(G); 1: BatchNorm
 * with batch statistics; 2: BatchNorm with the fixed mean/var given. */
static double norm_loss(int kind, const double *x, const double *w, const double *b,
                        const float *dy, const float *mean, const float *var, int64_t B,
                        int64_t C, int64_t HW, int64_t G, double eps) {
    double loss = 0.0;
    if (kind == 0) {
        int64_t cg = C / G, n = cg * HW;
        for (int64_t r = 0; r < B * G; r++) {
            const double *xg = x + r * n;
            double m = 0.0, v = 0.0;
            for (int64_t i = 0; i < n; i++) m += xg[i];
            m /= n;
            for (int64_t i = 0; i < n; i++) v += (xg[i] - m) * (xg[i] - m);
            double rs = 1.0 / sqrt(v / n + eps);
            for (int64_t i = 0; i < n; i++) {
                int64_t c = (r % G) * cg + i / HW;
                loss += dy[r * n + i] * ((xg[i] - m) * rs * w[c] + b[c]);
            }
        }
        return loss;
    }
    for (int64_t c = 0; c < C; c++) {
        double m = 0.0, v = 0.0, n = (double)B * HW;
        if (kind == 1) {
            for (int64_t bb = 0; bb < B; bb++)
                for (int64_t i = 0; i < HW; i++) m += x[(bb * C + c) * HW + i];
            m /= n;
            for (int64_t bb = 0; bb < B; bb++)
                for (int64_t i = 0; i < HW; i++) {
                    double d = x[(bb * C + c) * HW + i] - m;
                    v += d * d;
                }
            v /= n;
        } else {
            m = mean[c];
            v = var[c];
        }
        double rs = 1.0 / sqrt(v + eps);
        for (int64_t bb = 0; bb < B; bb++)
            for (int64_t i = 0; i < HW; i++) {
                int64_t k = (bb * C + c) * HW + i;
                loss += dy[k] * ((x[k] - m) * rs * w[c] + b[c]);
            }
    }
    return loss;
}

/* d loss / d a[i] by central differences (step scaled to the value). */
static double fd(int kind, double *a, int64_t i, const double *x, const double *w, const double *b,
                 const float *dy, const float *mean, const float *var, int64_t B, int64_t C,
                 int64_t HW, int64_t G, double eps) {
    double keep = a[i], h = 1e-6 * (fabs(keep) > 1.0 ? fabs(keep) : 1.0);
    a[i] = keep + h;
    double lp = norm_loss(kind, x, w, b, dy, mean, var, B, C, HW, G, eps);
    a[i] = keep - h;
    double lm = norm_loss(kind, x, w, b, dy, mean, var, B, C, HW, G, eps);
    a[i] = keep;
    return (lp - lm) / (2 * h);
}

static void close_to(const char *what, const float *got, const double *want, int64_t n,
                     double tol) {
    double scale = 1.0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(want[i]));
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * scale)) {
            fprintf(stderr, "%s[%lld] = %.9g, want %.9g\n", what, (long long)i, got[i], want[i]);
            fail();
        }
}

static void check_norm(int kind, int64_t B, int64_t C, int64_t HW, int64_t G) {
    int64_t n = B * C * HW;
    float eps = 1e-5f;
    float *x = malloc(n * sizeof(float)), *dy = malloc(n * sizeof(float));
    float *dx = malloc(n * sizeof(float)), *dx_ref = malloc(n * sizeof(float));
    float w[64], b[64], mean[64], var[64], dw[64], db[64], dw_ref[64], db_ref[64];
    double *xd = malloc(n * sizeof(double)), *want = malloc(n * sizeof(double));
    double wd[64], bd[64], wantw[64], wantb[64];
    fill(x, n, -2.0, 3.0);
    fill(dy, n, -1.0, 1.0);
    fill(w, C, 0.5, 1.5);
    fill(b, C, -0.5, 0.5);
    for (int64_t i = 0; i < n; i++) xd[i] = x[i];
    for (int64_t c = 0; c < C; c++) wd[c] = w[c], bd[c] = b[c];
    if (kind == 1)
        vitc__channel_stats(mean, var, x, B, C, HW);
    else
        fill(mean, C, -0.3, 0.3), fill(var, C, 0.5, 2.0);
    for (int64_t i = 0; i < n; i++)
        want[i] = fd(kind, xd, i, xd, wd, bd, dy, mean, var, B, C, HW, G, eps);
    for (int64_t c = 0; c < C; c++) {
        wantw[c] = fd(kind, wd, c, xd, wd, bd, dy, mean, var, B, C, HW, G, eps) + 0.25;
        wantb[c] = fd(kind, bd, c, xd, wd, bd, dy, mean, var, B, C, HW, G, eps) + 0.25;
    }
    /* Parameter gradients accumulate: start them at 0.25. */
    for (int64_t c = 0; c < C; c++) dw_ref[c] = db_ref[c] = 0.25f;
    if (kind == 0)
        vitc__groupnorm_backward_ref(dx_ref, dw_ref, db_ref, dy, x, w, B, C, HW, G, eps);
    else
        vitc__batchnorm_backward_ref(dx_ref, dw_ref, db_ref, dy, x, mean, var, w, eps, kind == 1,
                                     B, C, HW);
    close_to("dx ref", dx_ref, want, n, 2e-5);
    close_to("dw ref", dw_ref, wantw, C, 2e-5);
    close_to("db ref", db_ref, wantb, C, 2e-5);
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (int t = 1; t <= 2; t++) {
            vitc_set_num_threads(t);
            for (int64_t c = 0; c < C; c++) dw[c] = db[c] = 0.25f;
            if (kind == 0)
                vitc__groupnorm_backward(dx, dw, db, dy, x, w, B, C, HW, G, eps);
            else
                vitc__batchnorm_backward(dx, dw, db, dy, x, mean, var, w, eps, kind == 1, B, C, HW);
            /* Same per-group code in the same order: identical to the reference. */
            assert_memory_equal(dx, dx_ref, n * sizeof(float));
            assert_memory_equal(dw, dw_ref, C * sizeof(float));
            assert_memory_equal(db, db_ref, C * sizeof(float));
        }
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
    free(x), free(dy), free(dx), free(dx_ref), free(xd), free(want);
}

static void test_groupnorm_backward(void **state) {
    (void)state;
    check_norm(0, 1, 1, 1, 1);
    check_norm(0, 3, 6, 5, 1);  /* GroupNorm(1, C) as SelfAttention uses it */
    check_norm(0, 2, 6, 7, 3);
    check_norm(0, 5, 8, 3, 8);  /* InstanceNorm-like */
}

static void test_batchnorm_backward_training(void **state) {
    (void)state;
    check_norm(1, 2, 1, 1, 1); /* two values per channel: the smallest torch accepts */
    check_norm(1, 3, 5, 7, 1);
    check_norm(1, 1, 4, 9, 1);
}

static void test_batchnorm_backward_eval(void **state) {
    (void)state;
    check_norm(2, 1, 1, 1, 1);
    check_norm(2, 3, 5, 7, 1);
}

/* unpatchify is patchify's adjoint: <patchify(x), c> == <x, unpatchify(c)>,
 * and with patches covering the image it is patchify's inverse. */
static void test_unpatchify(void **state) {
    (void)state;
    int64_t B = 2, C = 3, H = 6, W = 10, p = 2, N = (H / p) * (W / p), K = C * p * p;
    int64_t n = B * C * H * W;
    float *x = malloc(n * sizeof(float)), *cols = malloc(n * sizeof(float));
    float *back = malloc(n * sizeof(float));
    fill(x, n, -1, 1);
    for (int t = 1; t <= 2; t++) {
        vitc_set_num_threads(t);
        vitc__patchify(cols, x, B, C, H, W, p);
        memset(back, 0xff, n * sizeof(float));
        vitc__unpatchify(back, cols, B, C, H, W, p);
        assert_memory_equal(back, x, n * sizeof(float));
    }
    assert_int_equal(B * N * K, n);
    vitc_set_num_threads(0);
    free(x), free(cols), free(back);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_groupnorm_backward),
        cmocka_unit_test(test_batchnorm_backward_training),
        cmocka_unit_test(test_batchnorm_backward_eval),
        cmocka_unit_test(test_unpatchify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
