/*
 * test_grad_kernels.c — the backward kernels (ops_backward.c) against
 * central finite differences of an independent float64 forward: for a
 * random cotangent r, the gradient of L = sum(r * f(inputs)) with respect
 * to every input and parameter element, within 1e-4 * max(1, |ref|). Every
 * CPU path (vitc_set_arch), both GEMM backends, 1 and 2 threads; the
 * scalar references too. Odd sizes so SIMD tails are exercised.
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
#include "vitc.h"
#include "testutil.h"

static uint64_t rs = 12345;
static double urand(void) { /* [-1, 1) */
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rs >> 11) / 4503599627370496.0 - 1.0;
}
/* n values scale * urand() as floats, returned, and the same values as
 * doubles into *xd (both malloc'd). */
static float *fill_new(double **xd, size_t n, double scale) {
    float *x = malloc(sizeof(float) * n);
    *xd = malloc(sizeof(double) * n);
    assert_true(x && *xd);
    for (size_t i = 0; i < n; i++) {
        x[i] = (float)(scale * urand());
        (*xd)[i] = x[i];
    }
    return x;
}

static void close_to(const float *got, const double *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++) {
        double tol = 1e-4 * fmax(1.0, fabs(want[i]));
        if (!(fabs(got[i] - want[i]) <= tol)) {
            print_error("%s[%zu]: got %.8g, want %.8g (arch %s, %d threads)\n", what, i,
                        (double)got[i], want[i], vitc_get_arch(), vitc_get_num_threads());
            fail();
        }
    }
}

/* Central difference of loss() in element i of x (float64 all through). */
typedef double (*loss_fn)(void *ctx);
static void fd_grad(double *g, double *x, size_t n, loss_fn f, void *ctx) {
    for (size_t i = 0; i < n; i++) {
        double v = x[i], h = 1e-6 * fmax(1.0, fabs(v));
        x[i] = v + h;
        double lp = f(ctx);
        x[i] = v - h;
        double lm = f(ctx);
        x[i] = v;
        g[i] = (lp - lm) / (2 * h);
    }
}

/* fd_grad into a new array (malloc'd). */
static double *fd_new(double *x, size_t n, loss_fn f, void *ctx) {
    double *g = malloc(sizeof(double) * n);
    assert_non_null(g);
    fd_grad(g, x, n, f, ctx);
    return g;
}

/* Every arch x backend x thread count, calling body(ctx) under each. */
static void each_path(void (*body)(void *), void *ctx) {
    const char *backends[] = {"builtin", "openblas"};
    int ran = 0;
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK)
            continue;
        for (int b = 0; b < 2; b++) {
            if (vitc_set_gemm_backend(backends[b]) != VITC_OK)
                continue;
            for (int t = 1; t <= 2; t++) {
                vitc_set_num_threads(t);
                body(ctx);
                ran++;
            }
        }
    }
    vitc_set_arch(NULL);
    vitc_set_gemm_backend("builtin");
    vitc_set_num_threads(1);
    assert_true(ran >= 2);
}

/* check(ctx) on the scalar reference (*ref = 1), then on every path. */
static void ref_and_paths(void (*check)(void *), void *ctx, int *ref) {
    *ref = 1;
    check(ctx);
    *ref = 0;
    each_path(check, ctx);
}

/* ---- Linear ------------------------------------------------------- */

typedef struct lin {
    int64_t M, N, K;
    double *x, *W, *b, *r; /* [M,K], [N,K], [N], [M,N] */
    float *xf, *Wf, *r_f;
    double *gx, *gW, *gb;
    int ref;
} lin;

static double lin_loss(void *c) {
    const lin *t = c;
    double L = 0;
    for (int64_t i = 0; i < t->M; i++)
        for (int64_t j = 0; j < t->N; j++) {
            double y = t->b[j];
            for (int64_t k = 0; k < t->K; k++) y += t->x[i * t->K + k] * t->W[j * t->K + k];
            L += t->r[i * t->N + j] * y;
        }
    return L;
}

static void lin_check(void *c) {
    lin *t = c;
    int64_t M = t->M, N = t->N, K = t->K;
    float *dx = malloc(sizeof(float) * (size_t)(M * K)), *dW = malloc(sizeof(float) * (size_t)(N * K));
    float *db = malloc(sizeof(float) * (size_t)N);
    /* Accumulation: dW, db start at 1 and must end at 1 + grad; dx with
     * beta 1 likewise. */
    for (int64_t i = 0; i < M * K; i++) dx[i] = 1.0f;
    for (int64_t i = 0; i < N * K; i++) dW[i] = 1.0f;
    for (int64_t i = 0; i < N; i++) db[i] = 1.0f;
    (t->ref ? vitc__linear_backward_ref : vitc__linear_backward)(dx, K, 1.0f, dW, db, t->r_f, N,
                                                                 t->xf, K, t->Wf, M, N, K);
    double *w1 = malloc(sizeof(double) * (size_t)(N * K + M * K + N));
    for (int64_t i = 0; i < M * K; i++) w1[i] = 1.0 + t->gx[i];
    close_to(dx, w1, (size_t)(M * K), "linear dx");
    for (int64_t i = 0; i < N * K; i++) w1[i] = 1.0 + t->gW[i];
    close_to(dW, w1, (size_t)(N * K), "linear dW");
    for (int64_t i = 0; i < N; i++) w1[i] = 1.0 + t->gb[i];
    close_to(db, w1, (size_t)N, "linear db");
    /* beta 0 overwrites whatever was there (NaN included). */
    for (int64_t i = 0; i < M * K; i++) dx[i] = NAN;
    vitc__linear_backward(dx, K, 0.0f, NULL, NULL, t->r_f, N, t->xf, K, t->Wf, M, N, K);
    close_to(dx, t->gx, (size_t)(M * K), "linear dx (beta 0)");
    free(w1);
    free(dx);
    free(dW);
    free(db);
}

static void test_linear_backward(void **state) {
    (void)state;
    int64_t sizes[][3] = {{1, 3, 5}, {7, 19, 33}, {37, 70, 17}};
    for (int s = 0; s < 3; s++) {
        lin t = {.M = sizes[s][0], .N = sizes[s][1], .K = sizes[s][2]};
        size_t MK = (size_t)(t.M * t.K), NK = (size_t)(t.N * t.K), N = (size_t)t.N;
        t.xf = fill_new(&t.x, MK, 1.0);
        t.Wf = fill_new(&t.W, NK, 0.5);
        float *bf = fill_new(&t.b, N, 0.5);
        t.r_f = fill_new(&t.r, (size_t)(t.M * t.N), 1.0);
        t.gx = fd_new(t.x, MK, lin_loss, &t);
        t.gW = fd_new(t.W, NK, lin_loss, &t);
        t.gb = fd_new(t.b, N, lin_loss, &t);
        ref_and_paths(lin_check, &t, &t.ref);
        free(t.x), free(t.W), free(t.b), free(t.r), free(t.xf), free(t.Wf), free(t.r_f), free(bf);
        free(t.gx), free(t.gW), free(t.gb);
    }
}

/* ---- LayerNorm ---------------------------------------------------- */

typedef struct lnt {
    int64_t M, C;
    double eps;
    double *x, *w, *b, *r;
    float *xf, *wf, *rf;
    double *gx, *gw, *gb;
    int ref;
} lnt;

static double ln_loss(void *c) {
    const lnt *t = c;
    double L = 0;
    for (int64_t i = 0; i < t->M; i++) {
        const double *xr = t->x + i * t->C;
        double mu = 0, var = 0;
        for (int64_t j = 0; j < t->C; j++) mu += xr[j];
        mu /= (double)t->C;
        for (int64_t j = 0; j < t->C; j++) var += (xr[j] - mu) * (xr[j] - mu);
        var /= (double)t->C;
        for (int64_t j = 0; j < t->C; j++)
            L += t->r[i * t->C + j] * ((xr[j] - mu) / sqrt(var + t->eps) * t->w[j] + t->b[j]);
    }
    return L;
}

static void ln_check(void *c) {
    lnt *t = c;
    int64_t M = t->M, C = t->C;
    float *dx = malloc(sizeof(float) * (size_t)(M * C)), *dw = malloc(sizeof(float) * (size_t)C);
    float *db = malloc(sizeof(float) * (size_t)C), *stats = malloc(sizeof(float) * (size_t)(2 * M));
    double *want = malloc(sizeof(double) * (size_t)(M * C));
    for (int64_t i = 0; i < M * C; i++) dx[i] = 0.5f;
    for (int64_t i = 0; i < C; i++) dw[i] = db[i] = 0.25f;
    if (t->ref)
        vitc__layernorm_backward_ref(dx, dw, db, t->rf, t->xf, t->wf, M, C, (float)t->eps);
    else
        vitc__layernorm_backward(dx, dw, db, t->rf, t->xf, t->wf, M, C, (float)t->eps, stats);
    for (int64_t i = 0; i < M * C; i++) want[i] = 0.5 + t->gx[i];
    close_to(dx, want, (size_t)(M * C), "layernorm dx");
    for (int64_t i = 0; i < C; i++) want[i] = 0.25 + t->gw[i];
    close_to(dw, want, (size_t)C, "layernorm dw");
    for (int64_t i = 0; i < C; i++) want[i] = 0.25 + t->gb[i];
    close_to(db, want, (size_t)C, "layernorm db");
    free(dx), free(dw), free(db), free(stats), free(want);
}

static void test_layernorm_backward(void **state) {
    (void)state;
    int64_t sizes[][2] = {{1, 7}, {5, 33}, {67, 130}};
    for (int s = 0; s < 3; s++) {
        lnt t = {.M = sizes[s][0], .C = sizes[s][1], .eps = 1e-6};
        size_t MC = (size_t)(t.M * t.C), C = (size_t)t.C;
        t.xf = fill_new(&t.x, MC, 2.0);
        t.rf = fill_new(&t.r, MC, 1.0);
        t.wf = fill_new(&t.w, C, 1.5);
        float *bf = fill_new(&t.b, C, 1.0);
        t.gx = fd_new(t.x, MC, ln_loss, &t);
        t.gw = fd_new(t.w, C, ln_loss, &t);
        t.gb = fd_new(t.b, C, ln_loss, &t);
        ref_and_paths(ln_check, &t, &t.ref);
        free(t.x), free(t.r), free(t.w), free(t.b), free(t.xf), free(t.rf), free(t.wf), free(bf);
        free(t.gx), free(t.gw), free(t.gb);
    }
}

/* ---- GELU --------------------------------------------------------- */

typedef struct gt {
    int64_t n;
    double *x, *r;
    float *xf, *rf;
    double *gx;
    int ref;
} gt;

static void gelu_check(void *c) {
    gt *t = c;
    float *dx = malloc(sizeof(float) * (size_t)t->n);
    (t->ref ? vitc__gelu_backward_ref : vitc__gelu_backward)(dx, t->rf, t->xf, t->n);
    close_to(dx, t->gx, (size_t)t->n, "gelu dx");
    /* In place: dx may be dy. */
    memcpy(dx, t->rf, sizeof(float) * (size_t)t->n);
    vitc__gelu_backward(dx, dx, t->xf, t->n);
    close_to(dx, t->gx, (size_t)t->n, "gelu dx in place");
    free(dx);
}

static void test_gelu_backward(void **state) {
    (void)state;
    gt t = {.n = 9001};
    size_t n = (size_t)t.n;
    t.xf = fill_new(&t.x, n, 6.0);
    t.rf = fill_new(&t.r, n, 1.0);
    t.gx = malloc(sizeof(double) * n);
    assert_non_null(t.gx);
    for (size_t i = 0; i < n; i++) { /* FD of the elementwise map, element by element */
        double v = t.x[i], h = 1e-6 * fmax(1.0, fabs(v));
        double fp = 0.5 * (v + h) * (1.0 + erf((v + h) / sqrt(2.0)));
        double fm = 0.5 * (v - h) * (1.0 + erf((v - h) / sqrt(2.0)));
        t.gx[i] = t.r[i] * (fp - fm) / (2 * h);
    }
    ref_and_paths(gelu_check, &t, &t.ref);
    free(t.x), free(t.r), free(t.xf), free(t.rf), free(t.gx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_backward),
        cmocka_unit_test(test_layernorm_backward),
        cmocka_unit_test(test_gelu_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
