/* test_ops.c — softmax, LayerNorm, GroupNorm and GELU on every arch vs float64. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#include "testutil.h"


static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double drand(void) { /* uniform [0, 1) */
    return tu_drand(&rng);
}
static double nrand(void) {
    double u = drand() + 1e-300, v = drand();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double gelu64(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }

/* GELU within 1e-6 of erf's scale: an erf error d moves GELU by |x| d / 2;
 * the final products add a few float roundings of the result. */
static void check_gelu(const float *in, const float *out, int64_t n, const char *arch) {
    for (int64_t i = 0; i < n; i++) {
        double x = in[i], want = gelu64(x);
        if (isnan(x)) {
            assert_true(isnan(out[i]));
            continue;
        }
        if (isinf(x)) {
            if (x > 0) assert_true(out[i] == INFINITY);
            continue;
        }
        double bound = 0.5e-6 * fabs(x) + 3e-7 * fabs(want) + 1e-38;
        if (!(fabs(out[i] - want) <= bound)) {
            fprintf(stderr, "%s: gelu(%.9g) = %.9g, want %.9g\n", arch, x, out[i], want);
            fail();
        }
    }
}

static void test_gelu(void **state) {
    int64_t n = 400000 + 13;
    float *in = malloc((size_t)n * sizeof(float)), *out = malloc((size_t)n * sizeof(float));
    float *out2 = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < 200000; i++) in[i] = (float)(-12.0 + 24.0 * i / 200000.0); /* dense */
    for (int64_t i = 200000; i < n; i++) in[i] = (float)(nrand() * pow(10.0, 4.0 * drand() - 3.0));
    float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-8f, 0.5f, -0.5f, 0.49999997f, 100.0f,
                       -100.0f, INFINITY, -INFINITY, NAN};
    memcpy(in + 1000, special, sizeof special);
    memcpy(out, in, (size_t)n * sizeof(float));
    vitc__gelu_ref(out, n);
    check_gelu(in, out, n, "ref");
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (int t = 1; t <= 2; t++) {
            vitc_set_num_threads(t);
            float *o = t == 1 ? out : out2;
            memcpy(o, in, (size_t)n * sizeof(float));
            vitc__gelu(o, n);
            check_gelu(in, o, n, tu_arch(a));
            /* odd lengths: the vector tails */
            for (int64_t m = 1; m < 40; m += 3) {
                float tmp[40];
                memcpy(tmp, in + 1000, (size_t)m * sizeof(float));
                vitc__gelu(tmp, m);
                check_gelu(in + 1000, tmp, m, tu_arch(a));
            }
        }
        assert_memory_equal(out, out2, (size_t)n * sizeof(float));
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
    free(in), free(out), free(out2);
}

/* quick-GELU x sigmoid(1.702 x) on every path against float64 (from the
 * float product 1.702 x, which torch rounds too): exp within a few ulp, then
 * the add and the division round. */
static void test_quick_gelu(void **state) {
    (void)state;
    int64_t n = 100000 + 7;
    float *in = malloc((size_t)n * sizeof(float)), *o = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) in[i] = (float)(-60.0 + 120.0 * i / (double)n);
    float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 100.0f, -100.0f, 1e4f, -1e4f};
    memcpy(in + 500, special, sizeof special);
    for (int a = -1; a < TU_NARCH; a++) {
        if (a >= 0 && vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        memcpy(o, in, (size_t)n * sizeof(float));
        if (a < 0)
            vitc__quick_gelu_ref(o, n);
        else
            vitc__quick_gelu(o, n);
        for (int64_t i = 0; i < n; i++) {
            double x = in[i], want = x / (1.0 + exp((double)(-1.702f * in[i])));
            /* below 1e-30 the float exp overflows first (x / inf = -0), as in torch */
            if (!(fabs(o[i] - want) <= 1e-6 * fabs(want) + 1e-30)) {
                fprintf(stderr, "%s: quick_gelu(%.9g) = %.9g, want %.9g\n",
                        a < 0 ? "ref" : tu_arch(a), x, o[i], want);
                fail();
            }
        }
    }
    vitc_set_arch(NULL);
    free(in), free(o);
}

/* tanh-GELU on every path against float64 of the exact function,
 * x / (1 + e^(-2u)) = 0.5 x (1 + tanh u), u = sqrt(2/pi) (x + 0.044715 x^3).
 * The vector paths round u (a few ulp of it, relative error |2u| times
 * that in the result); the reference is torch's float formula, whose
 * 1 + tanh(u) cancels for negative x (an ulp of 1, times x / 2). */
static void test_tanh_gelu(void **state) {
    (void)state;
    int64_t n = 100000 + 7;
    float *in = malloc((size_t)n * sizeof(float)), *o = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) in[i] = (float)(-30.0 + 60.0 * i / (double)n);
    float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 100.0f, -100.0f, 1e4f, -1e4f, 1e20f, -1e20f};
    memcpy(in + 500, special, sizeof special);
    for (int a = -1; a < TU_NARCH; a++) {
        if (a >= 0 && vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (int t = 1; t <= 2; t++) {
            vitc_set_num_threads(t);
            int ref = a < 0 || vitc__kern()->tanh_gelu == vitc__tanh_gelu_ref; /* generic */
            memcpy(o, in, (size_t)n * sizeof(float));
            if (a < 0)
                vitc__tanh_gelu_ref(o, n);
            else if (t == 1)
                vitc__tanh_gelu(o, n);
            else /* odd lengths through the threaded launcher: the vector tails */
                for (int64_t s = 0, m = 1; s < n; s += m, m = m % 37 + 1)
                    vitc__tanh_gelu(o + s, s + m <= n ? m : n - s);
            for (int64_t i = 0; i < n; i++) {
                double x = in[i], z = -1.5957691216057308 * (x + 0.044715 * x * x * x);
                double want = z > 700.0 ? (x < 0 ? -0.0 : 0.0) : x / (1.0 + exp(z));
                double tol = ref ? 1e-6 * fabs(want) + 1.2e-7 * fabs(x)
                                   : (1e-6 + 3e-7 * fabs(z)) * fabs(want) + 1e-30;
                if (!(fabs(o[i] - want) <= tol)) {
                    fprintf(stderr, "%s (%d threads): tanh_gelu(%.9g) = %.9g, want %.9g\n",
                            a < 0 ? "ref" : tu_arch(a), t, x, o[i], want);
                    fail();
                }
            }
        }
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
    free(in), free(o);
}

/* Layer scale y = r + g * y: the float product then the float add, on every
 * path and thread count (the product rounded in float64 is exact for the
 * float result's rounding: float64 holds a float product exactly), with
 * and without r, odd lengths for the tails. */
static void test_scale_add(void **state) {
    (void)state;
    int64_t M = 37, N = 203;
    float *y0 = malloc((size_t)(M * N) * sizeof(float)), *y = malloc((size_t)(M * N) * sizeof(float));
    float *r = malloc((size_t)(M * 2 * N) * sizeof(float)), *g = malloc((size_t)N * sizeof(float));
    for (int64_t i = 0; i < M * N; i++) y0[i] = (float)sin(0.37 * (double)i) * 3.0f;
    for (int64_t i = 0; i < 2 * M * N; i++) r[i] = (float)cos(0.11 * (double)i) * 2.0f;
    for (int64_t j = 0; j < N; j++) g[j] = (float)(1e-3 * (double)(j - 100));
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (int t = 1; t <= 2; t++) {
            vitc_set_num_threads(t);
            for (int with_r = 0; with_r < 2; with_r++)
                for (int64_t n = N - 2; n <= N; n++) { /* tails of 8 and 16 lanes */
                    memcpy(y, y0, (size_t)(M * N) * sizeof(float));
                    vitc__scale_add(y, N, g, with_r ? r : NULL, 2 * N, M, n);
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) {
                            float p = (float)((double)g[j] * (double)y0[i * N + j]);
                            float want = j >= n ? y0[i * N + j]
                                         : with_r ? (float)((double)r[i * 2 * N + j] + (double)p)
                                                  : p;
                            if (memcmp(&want, &y[i * N + j], sizeof want)) {
                                fprintf(stderr, "%s: scale_add [%lld, %lld] = %.9g, want %.9g\n",
                                        tu_arch(a), (long long)i, (long long)j, y[i * N + j], want);
                                fail();
                            }
                        }
                }
        }
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
    free(y0), free(y), free(r), free(g);
}

/* softmax(x * it) in float64 from the float logits the kernels see: they
 * round x * it and x * it - max to float (so does torch), the rest is
 * what is being checked. */
static void softmax64(const float *x, int64_t n, float it, double *p) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        if (x[j] * it > mx) mx = x[j] * it;
    double s = 0.0;
    for (int64_t j = 0; j < n; j++) s += exp((double)(x[j] * it - mx));
    for (int64_t j = 0; j < n; j++) p[j] = exp((double)(x[j] * it - mx)) / s;
}

static void test_softmax(void **state) {
    int64_t ns[] = {1, 7, 16, 17, 31, 197, 1000, 4097};
    float temps[] = {1.0f, 0.5f, 3.0f};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
            for (size_t it = 0; it < 3; it++) {
                int64_t n = ns[in], rows = 40;
                float *x = malloc((size_t)(rows * n) * sizeof(float));
                float *y1 = malloc((size_t)(rows * n) * sizeof(float));
                float *y2 = malloc((size_t)(rows * n) * sizeof(float));
                double *p = malloc((size_t)n * sizeof(double));
                for (int64_t r = 0; r < rows; r++) {
                    double scale = r % 4 == 0 ? 3000.0 : r % 4 == 1 ? 1.0 : r % 4 == 2 ? 100.0 : 0.0;
                    for (int64_t j = 0; j < n; j++) x[r * n + j] = (float)(nrand() * scale + (r % 3) * 1000.0);
                    if (r % 5 == 4) x[r * n + n / 2] = -INFINITY; /* a masked key */
                }
                float inv_t = 1.0f / temps[it];
                for (int t = 1; t <= 2; t++) {
                    float *y = t == 1 ? y1 : y2;
                    vitc_set_num_threads(t);
                    memcpy(y, x, (size_t)(rows * n) * sizeof(float));
                    vitc__softmax_rows(y, rows, n, inv_t);
                }
                assert_memory_equal(y1, y2, (size_t)(rows * n) * sizeof(float));
                for (int64_t r = 0; r < rows; r++) {
                    softmax64(x + r * n, n, inv_t, p);
                    for (int64_t j = 0; j < n; j++) {
                        if (isnan(p[j])) { /* n == 1 and its only key masked */
                            assert_true(isnan(y1[r * n + j]));
                            continue;
                        }
                        double err = fabs(y1[r * n + j] - p[j]);
                        /* float sums of up to 4097 terms; the AVX2 exp flushes below FLT_MIN */
                        if (!(err <= (n <= 32 ? 1e-6 : 1e-5) * p[j] + 1.2e-38)) {
                            fprintf(stderr, "%s n=%lld row %lld [%lld] = %.9g want %.9g\n", tu_arch(a),
                                    (long long)n, (long long)r, (long long)j, y1[r * n + j], p[j]);
                            fail();
                        }
                    }
                }
                free(x), free(y1), free(y2), free(p);
            }
        /* every key masked: NaN (torch 1.13), and a NaN logit poisons its row */
        float allm[19], nanrow[19];
        for (int j = 0; j < 19; j++) allm[j] = -INFINITY, nanrow[j] = (float)j;
        nanrow[3] = NAN;
        vitc__softmax_rows(allm, 1, 19, 1.0f);
        vitc__softmax_rows(nanrow, 1, 19, 1.0f);
        for (int j = 0; j < 19; j++) assert_true(isnan(allm[j]) && isnan(nanrow[j]));
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
}

/* The low-precision attentions' unnormalised softmax (softmax_rows_exp2)
 * on every path: 2^(x s - max) times the returned 1 / sum against
 * float64's 2^(x s - max) / sum, the scale s as the attention passes it (a
 * temperature times log2 e), within v_exp2_lp's 3e-6 on the value and on
 * the sum, and the roundings; rows in pairs and one alone (12 and 13); a
 * row with every key masked gives NaN. */
static void test_softmax_exp2(void **state) {
    (void)state;
    const int64_t ns[] = {1, 5, 16, 17, 197, 257, 1370};
    const float temps[] = {0.125f, 1.0f, 0.04419417f};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        void (*f)(float *, int64_t, int64_t, float, float *) = vitc__kern()->softmax_rows_exp2;
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
            for (size_t it = 0; it < 3; it++) {
                const int64_t n = ns[in], rows = 12 + (int64_t)(it == 1);
                const float s = temps[it] * 1.44269504088896341f;
                float *x = malloc((size_t)(rows * n) * sizeof(float));
                float *y = malloc((size_t)(rows * n) * sizeof(float));
                float inv[13];
                for (int64_t i = 0; i < rows * n; i++) x[i] = (float)(nrand() * (i % 3 ? 8.0 : 80.0));
                x[3 * n + n / 2] = -INFINITY; /* a masked key */
                memcpy(y, x, (size_t)(rows * n) * sizeof(float));
                f(y, rows, n, s, inv);
                /* row 0 went in a pair; alone, it has the same bits */
                float *y0 = malloc((size_t)n * sizeof(float)), inv0;
                memcpy(y0, x, (size_t)n * sizeof(float));
                f(y0, 1, n, s, &inv0);
                assert_memory_equal(y0, y, (size_t)n * sizeof(float));
                assert_memory_equal(&inv0, inv, sizeof inv0);
                free(y0);
                for (int64_t r = 0; r < rows; r++) {
                    const float *xr = x + r * n;
                    float mx = -INFINITY;
                    for (int64_t j = 0; j < n; j++)
                        if (xr[j] * s > mx) mx = xr[j] * s;
                    double sum = 0.0;
                    for (int64_t j = 0; j < n; j++) sum += exp2((double)xr[j] * s - mx);
                    for (int64_t j = 0; j < n; j++) {
                        double want = exp2((double)xr[j] * s - mx) / sum;
                        double got = (double)y[r * n + j] * inv[r];
                        if (n == 1 && r == 3) { /* its only key masked */
                            assert_true(isnan(got));
                            continue;
                        }
                        if (!(fabs(got - want) <= 8e-6 * want + 1e-6 / (double)n + 1e-38)) {
                            fprintf(stderr, "%s n=%lld row %lld [%lld] = %.9g want %.9g\n",
                                    tu_arch(a), (long long)n, (long long)r, (long long)j, got,
                                    want);
                            fail();
                        }
                    }
                }
                free(x), free(y);
            }
        float allm[19], one = 0.0f;
        for (int j = 0; j < 19; j++) allm[j] = -INFINITY;
        f(allm, 1, 19, 1.0f, &one);
        assert_true(isnan(one) || isnan(allm[0]));
    }
    vitc_set_arch(NULL);
}

/* softmax(scale x) down columns (each path's kernel on widths around its
 * vector, a row stride wider than the columns) and the short-row softmax
 * built on it (block edges, the thread pool), against float64. */
static void check_cols64(const float *x0, const float *y, int64_t n, int64_t L, int64_t ld,
                         double scale, const char *what) {
    for (int64_t j = 0; j < L; j++) {
        double mx = -INFINITY, sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            if ((double)x0[i * ld + j] * scale > mx) mx = (double)x0[i * ld + j] * scale;
        for (int64_t i = 0; i < n; i++) sum += exp((double)x0[i * ld + j] * scale - mx);
        for (int64_t i = 0; i < n; i++) {
            const double want = exp((double)x0[i * ld + j] * scale - mx) / sum;
            const double got = y[i * ld + j];
            if (!(fabs(got - want) <= 2e-6 * want + 1e-7)) {
                fprintf(stderr, "%s n=%lld L=%lld [%lld, %lld] = %.9g want %.9g\n", what,
                        (long long)n, (long long)L, (long long)i, (long long)j, got, want);
                fail();
            }
        }
    }
}

static void test_softmax_cols(void **state) {
    (void)state;
    const int64_t ns[] = {1, 2, 7, 16}, Ls[] = {1, 7, 8, 15, 16, 17, 33, 200};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (size_t in = 0; in < sizeof ns / sizeof *ns; in++)
            for (size_t il = 0; il < sizeof Ls / sizeof *Ls; il++) {
                const int64_t n = ns[in], L = Ls[il], ld = L + 3;
                float *x = malloc((size_t)(n * ld) * sizeof(float));
                float *y = malloc((size_t)(n * ld) * sizeof(float));
                for (int64_t i = 0; i < n * ld; i++) x[i] = (float)(nrand() * (i % 3 ? 4.0 : 40.0));
                memcpy(y, x, (size_t)(n * ld) * sizeof(float));
                vitc__kern()->softmax_cols(y, n, L, ld, 0.25f);
                check_cols64(x, y, n, L, ld, 0.25, tu_arch(a));
                for (int64_t i = 0; i < n; i++) /* the stride's gap untouched */
                    for (int64_t j = L; j < ld; j++) assert_true(y[i * ld + j] == x[i * ld + j]);
                free(x), free(y);
            }
        /* rows of n: 16-row blocks, a partial last one, and enough rows
         * for the pool; n past the short limit goes to softmax_rows */
        const int64_t rn[] = {1, 7, 16, 17}, rr[] = {1, 5, 16, 37, 6000};
        for (size_t in = 0; in < sizeof rn / sizeof *rn; in++)
            for (size_t ir = 0; ir < sizeof rr / sizeof *rr; ir++) {
                const int64_t n = rn[in], rows = rr[ir];
                float *x = malloc((size_t)(rows * n) * sizeof(float));
                float *y = malloc((size_t)(rows * n) * sizeof(float));
                for (int64_t i = 0; i < rows * n; i++) x[i] = (float)(nrand() * 6.0);
                memcpy(y, x, (size_t)(rows * n) * sizeof(float));
                vitc__softmax_rows_short(y, rows, n);
                for (int64_t r = 0; r < rows; r++)
                    check_cols64(x + r * n, y + r * n, n, 1, 1, 1.0, "rows_short");
                free(x), free(y);
            }
        /* a column of -inf but one, and one all -inf (NaN, as softmax_rows) */
        float c[3 * 2] = {-INFINITY, -INFINITY, 1.0f, -INFINITY, -INFINITY, -INFINITY};
        vitc__kern()->softmax_cols(c, 3, 2, 2, 1.0f); /* [3, 2]: column 0 is -inf, 1, -inf */
        assert_true(c[2] == 1.0f && c[0] == 0.0f && c[4] == 0.0f);
        assert_true(isnan(c[1]));
    }
    vitc_set_arch(NULL);
}

/* Mean and 1/sqrt(biased variance + eps) of x[0..n), in float64: the
 * normalisation LayerNorm and GroupNorm apply. */
static void moments64(const float *x, int64_t n, double eps, double *mean, double *rstd) {
    double m = 0.0, var = 0.0;
    for (int64_t i = 0; i < n; i++) m += x[i];
    m /= (double)n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - m) * (x[i] - m);
    var /= (double)n;
    *mean = m;
    *rstd = 1.0 / sqrt(var + eps);
}

/* Many short dot products side by side, every path against float64: row
 * counts around the vector widths (the transposed sums and the row tail),
 * K under, at and over them (the masked K tail), a padded ldx and ldy.
 * Bound: K float roundings of the products' absolute sum. */
static void test_dot_rows(void **state) {
    (void)state;
    const int64_t rows_[] = {1, 7, 8, 16, 17, 35, 512};
    const int64_t Ks[] = {1, 5, 8, 16, 32, 33, 70};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (size_t ir = 0; ir < sizeof rows_ / sizeof *rows_; ir++)
            for (size_t ik = 0; ik < sizeof Ks / sizeof *Ks; ik++) {
                const int64_t rows = rows_[ir], K = Ks[ik], n = 3, ldx = K + 3, ldy = rows + 5;
                float *x = malloc((size_t)(rows * ldx) * sizeof(float));
                float *w = malloc((size_t)(n * K) * sizeof(float));
                float *y = malloc((size_t)(n * ldy) * sizeof(float));
                for (int64_t i = 0; i < rows * ldx; i++) x[i] = (float)nrand();
                for (int64_t i = 0; i < n * K; i++) w[i] = (float)nrand();
                for (int64_t i = 0; i < n * ldy; i++) y[i] = 12345.0f;
                vitc__dot_rows(y, ldy, x, ldx, w, n, K, rows);
                for (int64_t m = 0; m < n; m++) {
                    for (int64_t r = 0; r < rows; r++) {
                        double want = 0.0, mag = 0.0;
                        for (int64_t k = 0; k < K; k++) {
                            want += (double)x[r * ldx + k] * w[m * K + k];
                            mag += fabs((double)x[r * ldx + k] * w[m * K + k]);
                        }
                        if (!(fabs(y[m * ldy + r] - want) <= (double)K * 6e-8 * mag + 1e-30)) {
                            fprintf(stderr, "%s rows=%lld K=%lld y[%lld][%lld] = %.9g want %.9g\n",
                                    tu_arch(a), (long long)rows, (long long)K, (long long)m,
                                    (long long)r, y[m * ldy + r], want);
                            fail();
                        }
                    }
                    for (int64_t r = rows; r < ldy; r++) assert_true(y[m * ldy + r] == 12345.0f);
                }
                free(x), free(w), free(y);
            }
    }
    vitc_set_arch(NULL);
}

static void test_layernorm(void **state) {
    int64_t Cs[] = {1, 3, 16, 17, 64, 768, 1000};
    double means[] = {0.0, 3.0, 1000.0};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (size_t ic = 0; ic < sizeof Cs / sizeof *Cs; ic++)
            for (size_t im = 0; im < 3; im++) {
                /* 400 x 768 is past the size where rows go to the pool */
                int64_t C = Cs[ic], M = C == 768 ? 400 : 70;
                float *x = malloc((size_t)(M * C) * sizeof(float)), *w = malloc((size_t)C * sizeof(float));
                float *b = malloc((size_t)C * sizeof(float));
                float *y1 = malloc((size_t)(M * C) * sizeof(float)), *y2 = malloc((size_t)(M * C) * sizeof(float));
                for (int64_t i = 0; i < M * C; i++) x[i] = (float)(means[im] + nrand() * (1 + i % 3));
                for (int64_t c = 0; c < C; c++) w[c] = (float)(1.0 + 0.5 * nrand()), b[c] = (float)nrand();
                float *st = malloc((size_t)(2 * M) * sizeof(float));
                for (int t = 1; t <= 2; t++) {
                    vitc_set_num_threads(t);
                    vitc__layernorm(t == 1 ? y1 : y2, x, w, b, M, C, 1e-6f);
                }
                assert_memory_equal(y1, y2, (size_t)(M * C) * sizeof(float));
                /* with its statistics: the same numbers, and the mean and
                 * 1 / std it normalised by */
                vitc__layernorm_stats(y2, x, w, b, M, C, 1e-6f, st);
                assert_memory_equal(y1, y2, (size_t)(M * C) * sizeof(float));
                /* the stats alone (y NULL): the same stats */
                float *st2 = malloc((size_t)(2 * M) * sizeof(float));
                vitc__layernorm_stats(NULL, x, w, b, M, C, 1e-6f, st2);
                assert_memory_equal(st, st2, (size_t)(2 * M) * sizeof(float));
                free(st2);
                for (int64_t i = 0; i < M; i++) {
                    const float *xr = x + i * C;
                    double mean, rstd;
                    moments64(xr, C, 1e-6, &mean, &rstd);
                    if (!(fabs(st[2 * i] - mean) <= 1e-6 * (1.0 + fabs(mean)) + 1e-6 / rstd &&
                          fabs(st[2 * i + 1] - rstd) <= 2e-6 * rstd)) {
                        fprintf(stderr, "%s C=%lld row %lld: stats %.9g %.9g want %.9g %.9g\n",
                                tu_arch(a), (long long)C, (long long)i, st[2 * i], st[2 * i + 1],
                                mean, rstd);
                        fail();
                    }
                    for (int64_t c = 0; c < C; c++) {
                        double want = (xr[c] - mean) * rstd * w[c] + b[c];
                        /* float x near a large mean carries |mean| * 2^-24 of
                         * rounding relative to the spread; allow for it */
                        double tol = 2e-6 * (1.0 + fabs(want)) + 1e-7 * fabs(means[im]) * rstd * fabs(w[c]);
                        if (!(fabs(y1[i * C + c] - want) <= tol)) {
                            fprintf(stderr, "%s C=%lld mean=%g y[%lld,%lld] = %.9g want %.9g\n", tu_arch(a),
                                    (long long)C, means[im], (long long)i, (long long)c, y1[i * C + c], want);
                            fail();
                        }
                    }
                }
                free(x), free(w), free(b), free(y1), free(y2), free(st);
            }
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
}

static void test_groupnorm(void **state) {
    /* B, C, HW, G; the last has groups of 2050 channels, more than the
     * kernel sums in one batch */
    int64_t shapes[][4] = {{2, 6, 7, 3}, {1, 512, 4096, 1}, {3, 32, 256, 8}, {1, 4, 1, 2},
                           {2, 4100, 3, 2}, {2, 64, 1024, 32}};
    double means[] = {0.0, 100.0};
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        for (size_t is = 0; is < sizeof shapes / sizeof *shapes; is++)
            for (size_t im = 0; im < 2; im++) {
                int64_t B = shapes[is][0], C = shapes[is][1], HW = shapes[is][2], G = shapes[is][3];
                int64_t n = B * C * HW, cg = C / G;
                float *x = malloc((size_t)n * sizeof(float)), *w = malloc((size_t)C * sizeof(float));
                float *b = malloc((size_t)C * sizeof(float));
                float *y1 = malloc((size_t)n * sizeof(float)), *y2 = malloc((size_t)n * sizeof(float));
                for (int64_t i = 0; i < n; i++) x[i] = (float)(means[im] + nrand() * (1 + (i / HW) % 3));
                for (int64_t c = 0; c < C; c++) w[c] = (float)(1.0 + 0.5 * nrand()), b[c] = (float)nrand();
                for (int t = 1; t <= 2; t++) {
                    vitc_set_num_threads(t);
                    vitc__groupnorm(t == 1 ? y1 : y2, x, w, b, B, C, HW, G, 1e-5f);
                }
                assert_memory_equal(y1, y2, (size_t)n * sizeof(float));
                for (int64_t bg = 0; bg < B * G; bg++) {
                    const float *xg = x + bg * cg * HW;
                    int64_t cnt = cg * HW;
                    double mean, rstd;
                    moments64(xg, cnt, 1e-5, &mean, &rstd);
                    for (int64_t i = 0; i < cnt; i++) {
                        int64_t ch = (bg % G) * cg + i / HW;
                        double want = (xg[i] - mean) * rstd * w[ch] + b[ch];
                        double tol = 2e-6 * (1.0 + fabs(want)) + 1e-7 * fabs(means[im]) * rstd * fabs(w[ch]);
                        float got = y1[bg * cnt + i];
                        if (!(fabs(got - want) <= tol)) {
                            fprintf(stderr, "%s groupnorm B=%lld C=%lld HW=%lld G=%lld [%lld] = %.9g want %.9g\n",
                                    tu_arch(a), (long long)B, (long long)C, (long long)HW, (long long)G,
                                    (long long)(bg * cnt + i), got, want);
                            fail();
                        }
                    }
                }
                free(x), free(w), free(b), free(y1), free(y2);
            }
    }
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_quick_gelu),
        cmocka_unit_test(test_tanh_gelu),
        cmocka_unit_test(test_scale_add),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_softmax_exp2),
        cmocka_unit_test(test_softmax_cols),
        cmocka_unit_test(test_dot_rows),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_groupnorm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
