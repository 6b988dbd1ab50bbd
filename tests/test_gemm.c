/* test_gemm.c — every GEMM path this machine runs against a float64 product. */
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

static uint64_t rng = 88172645463325252ull;
static float frand(void) { /* uniform in [-1, 1) */
    return (float)(tu_drand(&rng) * 2.0 - 1.0);
}

static float *rand_buf(size_t n) {
    float *p = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

/* A path: backend x arch x threads. */
typedef struct {
    const char *backend, *arch;
    int threads;
} path;

static path paths[16];
static int npaths;

static void collect_paths(void) {
    const char *backends[] = {"builtin", "openblas"};
    npaths = 0;
    for (int b = 0; b < 2; b++) {
        if (vitc_set_gemm_backend(backends[b]) != VITC_OK) continue;
        for (int a = 0; a < TU_NARCH; a++) {
            if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
            /* The arch does not change OpenBLAS: one arch is enough there. */
            if (b == 1 && a != 0) continue;
            for (int t = 1; t <= 2; t++) paths[npaths++] = (path){backends[b], tu_arch(a), t};
        }
    }
    vitc_set_arch(NULL);
    vitc_set_gemm_backend(NULL);
    assert_true(npaths >= 2);
    static int shown;
    if (!shown++) {
        printf("# gemm paths:");
        for (int i = 0; i < npaths; i++) printf(" %s/%s/%dt", paths[i].backend, paths[i].arch, paths[i].threads);
        printf("\n");
    }
}

static void use_path(const path *p) {
    assert_int_equal(vitc_set_gemm_backend(p->backend), VITC_OK);
    assert_int_equal(vitc_set_arch(p->arch), VITC_OK);
    vitc_set_num_threads(p->threads);
}

static void restore(void) {
    vitc_set_gemm_backend(NULL);
    vitc_set_arch(NULL);
    vitc_set_num_threads(0);
}

/* float64 reference and a bound on the float32 rounding error of each
 * element: |err| <= tol * (|alpha| sum |a||b| + |beta c|). */
static void ref64(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, const float *C0,
                  int64_t ldc, double *R, double *mag) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = 0.0, m = 0.0;
            for (int64_t p = 0; p < K; p++) {
                double a = ta ? A[p * lda + i] : A[i * lda + p];
                double b = tb ? B[j * ldb + p] : B[p * ldb + j];
                acc += a * b;
                m += fabs(a * b);
            }
            double c = beta == 0.0f ? 0.0 : (double)beta * C0[i * ldc + j];
            R[i * N + j] = alpha * acc + c;
            mag[i * N + j] = fabs(alpha) * m + fabs(c);
        }
}

static void check_close(const float *C, int64_t ldc, const double *R, const double *mag, int64_t M,
                        int64_t N, const char *what) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double err = fabs((double)C[i * ldc + j] - R[i * N + j]);
            double bound = 2e-6 * mag[i * N + j] + 1e-30;
            if (!(err <= bound)) {
                fprintf(stderr, "%s: C[%lld,%lld] = %.9g, want %.9g (err %.3g > %.3g)\n", what,
                        (long long)i, (long long)j, C[i * ldc + j], R[i * N + j], err, bound);
                fail();
            }
        }
}

/* Under `make valgrind` (which sets VALGRIND) the largest products would
 * take most of an hour: those are left to the native and ASan runs. */
static int too_big(int64_t M, int64_t N, int64_t K) {
    return getenv("VALGRIND") && (double)M * (double)N * (double)K > 2e7;
}

/* One problem on every path; padding columns of C must stay untouched. */
static void run_case(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                     int64_t pad) {
    if (too_big(M, N, K)) return;
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = rand_buf((size_t)(ar * lda)), *B = rand_buf((size_t)(br * ldb));
    float *C0 = rand_buf((size_t)(M * ldc)), *C = malloc((size_t)(M * ldc) * sizeof(float) + 1);
    double *R = malloc((size_t)(M * N) * sizeof(double) + 1);
    double *mag = malloc((size_t)(M * N) * sizeof(double) + 1);
    ref64(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C0, ldc, R, mag);
    char what[160];
    for (int p = 0; p < npaths; p++) {
        use_path(&paths[p]);
        memcpy(C, C0, (size_t)(M * ldc) * sizeof(float));
        vitc__gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        snprintf(what, sizeof what, "%s/%s/%dt ta=%d tb=%d M=%lld N=%lld K=%lld a=%g b=%g pad=%lld",
                 paths[p].backend, paths[p].arch, paths[p].threads, ta, tb, (long long)M,
                 (long long)N, (long long)K, alpha, beta, (long long)pad);
        check_close(C, ldc, R, mag, M, N, what);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = N; j < ldc; j++) assert_true(C[i * ldc + j] == C0[i * ldc + j]);
    }
    restore();
    free(A), free(B), free(C0), free(C), free(R), free(mag);
}

static void test_small_all_transposes(void **state) {
    collect_paths();
    int64_t dims[] = {1, 2, 5, 12, 13, 31, 33, 47};
    int nd = sizeof dims / sizeof *dims;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int x = 0; x < nd; x++)
                for (int y = 0; y < nd; y += 2)
                    for (int z = 0; z < nd; z += 3)
                        run_case(ta, tb, dims[x], dims[(y + x) % nd], dims[(z + 2 * x) % nd],
                                 1.0f, 0.0f, (x + y) % 3);
}

static void test_alpha_beta(void **state) {
    collect_paths();
    float ab[][2] = {{1.0f, 1.0f}, {-0.5f, 0.25f}, {2.0f, 0.0f}, {0.0f, 0.5f}, {0.0f, 0.0f}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int i = 0; i < 5; i++) run_case(ta, tb, 29, 37, 41, ab[i][0], ab[i][1], 3);
}

/* Blocking edges: K past one KC block, M past MC, N past NR multiples. */
static void test_medium_shapes(void **state) {
    collect_paths();
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            run_case(ta, tb, 197, 97, 300, 1.0f, 0.0f, 0);
            run_case(ta, tb, 151, 257, 263, 0.75f, 1.0f, 5);
        }
    run_case(0, 1, 400, 64, 600, 1.0f, 0.0f, 0); /* few columns: threads split rows */
    run_case(0, 0, 3, 1000, 17, 1.0f, 0.5f, 0);
    run_case(1, 0, 100, 50, 1100, 1.0f, 1.0f, 2); /* weight gradient: deep K in small blocks */
}

/* ViT-B shapes (the attention / MLP projections). */
static void test_vit_shapes(void **state) {
    collect_paths();
    run_case(0, 1, 197, 768, 768, 1.0f, 0.0f, 0);
    run_case(0, 1, 197, 2304, 768, 1.0f, 0.0f, 0);
    run_case(0, 1, 50, 3072, 768, 1.0f, 0.0f, 0);
    run_case(0, 1, 197, 768, 3072, 1.0f, 0.0f, 0);
    run_case(0, 0, 197, 64, 197, 1.0f, 0.0f, 0); /* attn @ v */
    run_case(0, 1, 197, 197, 64, 0.125f, 0.0f, 2240); /* q @ k^T inside a [197, 2304] qkv */
}

static void test_nan_in_c_beta0(void **state) {
    collect_paths();
    int64_t M = 37, N = 45, K = 19;
    float *A = rand_buf((size_t)(M * K)), *B = rand_buf((size_t)(K * N));
    float *C = malloc((size_t)(M * N) * sizeof(float));
    for (int p = 0; p < npaths; p++) {
        use_path(&paths[p]);
        for (int64_t i = 0; i < M * N; i++) C[i] = (i % 2) ? NAN : INFINITY;
        vitc__gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
        for (int64_t i = 0; i < M * N; i++) assert_true(isfinite(C[i]));
        for (int64_t i = 0; i < M * N; i++) C[i] = NAN;
        vitc__gemm(0, 0, M, N, 0, 1.0f, A, K, B, N, 0.0f, C, N); /* K = 0: C = 0 */
        for (int64_t i = 0; i < M * N; i++) assert_true(C[i] == 0.0f);
    }
    restore();
    free(A), free(B), free(C);
}

/* Same inputs, 1 and 2 threads: the built-in GEMM cuts threads at tile
 * boundaries, so every element is computed the same way. */
static void test_builtin_thread_invariant(void **state) {
    int64_t M = 197, N = getenv("VALGRIND") ? 96 : 2304, K = 768;
    float *A = rand_buf((size_t)(M * K)), *B = rand_buf((size_t)(N * K));
    float *C1 = malloc((size_t)(M * N) * sizeof(float)), *C2 = malloc((size_t)(M * N) * sizeof(float));
    assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
    for (int a = 0; a < TU_NARCH; a++) {
        if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
        vitc_set_num_threads(1);
        vitc__gemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C1, N);
        vitc_set_num_threads(2);
        vitc__gemm(0, 1, M, N, K, 1.0f, A, K, B, K, 0.0f, C2, N);
        assert_memory_equal(C1, C2, (size_t)(M * N) * sizeof(float));
        /* Threads splitting rows share one packing of op(B) (both layouts,
         * K past one KC block): still the 1-thread bits. */
        int64_t m2 = 600, n2 = 96, k2 = 1100;
        float *A2 = rand_buf((size_t)(m2 * k2)), *B2 = rand_buf((size_t)(n2 * k2));
        float *D1 = malloc((size_t)(m2 * n2) * sizeof(float)), *D2 = malloc((size_t)(m2 * n2) * sizeof(float));
        for (int tb = 0; tb < 2; tb++) {
            vitc_set_num_threads(1);
            vitc__gemm(0, tb, m2, n2, k2, 1.0f, A2, k2, B2, tb ? k2 : n2, 0.0f, D1, n2);
            vitc_set_num_threads(2);
            vitc__gemm(0, tb, m2, n2, k2, 1.0f, A2, k2, B2, tb ? k2 : n2, 0.0f, D2, n2);
            assert_memory_equal(D1, D2, (size_t)(m2 * n2) * sizeof(float));
        }
        free(A2), free(B2), free(D1), free(D2);
        /* Threads splitting columns pack op(A) strips into one shared copy
         * as they go, whichever thread comes first (both layouts, three K
         * blocks, a short last strip, 2 and 3 threads): still the 1-thread
         * bits. */
        int64_t m3 = 151, n3 = 1200, k3 = 2100;
        float *A3 = rand_buf((size_t)(m3 * k3)), *B3 = rand_buf((size_t)(n3 * k3));
        float *E1 = malloc((size_t)(m3 * n3) * sizeof(float)), *E2 = malloc((size_t)(m3 * n3) * sizeof(float));
        for (int ta = 0; ta < 2; ta++) {
            vitc_set_num_threads(1);
            vitc__gemm(ta, 1, m3, n3, k3, 1.0f, A3, ta ? m3 : k3, B3, k3, 0.0f, E1, n3);
            for (int t = 2; t <= 3; t++) {
                vitc_set_num_threads(t);
                vitc__gemm(ta, 1, m3, n3, k3, 1.0f, A3, ta ? m3 : k3, B3, k3, 0.0f, E2, n3);
                assert_memory_equal(E1, E2, (size_t)(m3 * n3) * sizeof(float));
            }
        }
        free(A3), free(B3), free(E1), free(E2);
    }
    restore();
    free(A), free(B), free(C1), free(C2);
}

/* A shallow untransposed A read in place instead of packed (gemm.c's
 * direct path): the same FMAs in the same order, so bitwise the packed
 * result, with edges (rows not a multiple of 12 or of MC, the short tiles
 * of 4, 6 and 8 rows, columns not of 32, padded lda and ldb) and the Linear epilogue; transposed A (weight
 * gradients, K past one KC block) must not change with the switch. */
static void test_direct_equals_packed(void **state) {
    int64_t shapes[][4] = {{157, 97, 96, 0}, {6400 / 50, 288, 96, 0}, {77, 33, 300, 0},
                           {13, 5, 7, 0},    {288, 96, 1500, 1},      {100, 70, 2100, 1},
                           {7, 33, 40, 1},   {7, 70, 16, 0},          {4, 40, 33, 0},
                           {18, 33, 20, 0},  {12, 16, 40, 0},         {7, 16, 300, 0},
                           {11, 9, 20, 0}};
    assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        int ta = (int)shapes[s][3];
        int64_t lda = (ta ? M : K) + (int64_t)s, ldb = N + 3; /* B [K, ldb] or [N, K] */
        float *A = rand_buf((size_t)((ta ? K : M) * lda)), *B = rand_buf((size_t)(K * ldb + N * K));
        float *bias = rand_buf((size_t)N), *res = rand_buf((size_t)(M * N));
        float *C1 = malloc((size_t)(M * N) * sizeof(float)), *C2 = malloc((size_t)(M * N) * sizeof(float));
        for (int a = 0; a < TU_NARCH; a++) {
            if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
            for (int t = 1; t <= 2; t++) {
                vitc_set_num_threads(t);
                for (int tb = 0; tb < 2; tb++) {
                    for (int beta = 0; beta < 2; beta++) {
                        for (int64_t i = 0; i < M * N; i++) C1[i] = C2[i] = res[i];
                        vitc__gemm_set_direct(1);
                        vitc__gemm(ta, tb, M, N, K, 0.5f, A, lda, B, tb ? K : ldb, (float)beta, C1, N);
                        vitc__gemm_set_direct(0);
                        vitc__gemm(ta, tb, M, N, K, 0.5f, A, lda, B, tb ? K : ldb, (float)beta, C2, N);
                        assert_memory_equal(C1, C2, (size_t)(M * N) * sizeof(float));
                    }
                }
                if (ta) continue;
                vitc__gemm_set_direct(1);
                vitc__linear(C1, N, A, lda, B, bias, res, N, M, N, K);
                vitc__gemm_set_direct(0);
                vitc__linear(C2, N, A, lda, B, bias, res, N, M, N, K);
                assert_memory_equal(C1, C2, (size_t)(M * N) * sizeof(float));
            }
        }
        vitc__gemm_set_direct(1);
        free(A), free(B), free(bias), free(res), free(C1), free(C2);
    }
    restore();
}

/* vitc__gemm_tn_asum: C bitwise vitc__gemm's A^T B, and the column sums
 * of A bitwise a plain loop over its rows (k ascending), on every built-in
 * path and thread count; rows split (M > N) and columns split (N > M). */
static void test_gemm_tn_asum(void **state) {
    int64_t shapes[][3] = {{97, 40, 1500}, {290, 96, 700}, {30, 300, 1100}, {5, 3, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], lda = M + 1;
        float *A = rand_buf((size_t)(K * lda)), *B = rand_buf((size_t)(K * N));
        float *C0 = rand_buf((size_t)(M * N)), *s0 = rand_buf((size_t)M);
        float *C1 = malloc((size_t)(M * N) * sizeof(float)), *C2 = malloc((size_t)(M * N) * sizeof(float));
        float *s1 = malloc((size_t)M * sizeof(float)), *s2 = malloc((size_t)M * sizeof(float));
        memcpy(s2, s0, (size_t)M * sizeof(float));
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < M; i++) s2[i] += A[k * lda + i];
        assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
        for (int a = 0; a < TU_NARCH; a++) {
            if (vitc_set_arch(tu_arch(a)) != VITC_OK) continue;
            for (int t = 1; t <= 2; t++) {
                vitc_set_num_threads(t);
                memcpy(C1, C0, (size_t)(M * N) * sizeof(float));
                memcpy(C2, C0, (size_t)(M * N) * sizeof(float));
                memcpy(s1, s0, (size_t)M * sizeof(float));
                assert_int_equal(vitc__gemm_tn_asum(M, N, K, A, lda, B, N, 1.0f, C1, N, s1), 1);
                vitc__gemm(1, 0, M, N, K, 1.0f, A, lda, B, N, 1.0f, C2, N);
                assert_memory_equal(C1, C2, (size_t)(M * N) * sizeof(float));
                assert_memory_equal(s1, s2, (size_t)M * sizeof(float));
            }
        }
#ifdef VITC_HAVE_OPENBLAS
        assert_int_equal(vitc_set_gemm_backend("openblas"), VITC_OK);
        assert_int_equal(vitc__gemm_tn_asum(M, N, K, A, lda, B, N, 1.0f, C1, N, s1), 0);
#endif
        restore();
        free(A), free(B), free(C0), free(s0), free(C1), free(C2), free(s1), free(s2);
    }
}

/* vitc__linear_act: y as vitc__linear gives it and act = GELU(y) as
 * vitc__gelu gives it (both elementwise: bitwise), on every path. */
static void test_linear_act(void **state) {
    collect_paths();
    int64_t shapes[][3] = {{157, 97, 96}, {30, 192, 70}, {5, 7, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], ld = N + (int64_t)s;
        float *x = rand_buf((size_t)(M * K)), *W = rand_buf((size_t)(N * K)), *b = rand_buf((size_t)N);
        float *y = malloc((size_t)(M * ld) * sizeof(float)), *act = malloc((size_t)(M * ld) * sizeof(float));
        float *y2 = malloc((size_t)(M * ld) * sizeof(float));
        for (int p = 0; p < npaths; p++) {
            use_path(&paths[p]);
            vitc__linear_act(y, ld, act, ld, x, K, W, b, M, N, K);
            vitc__linear(y2, ld, x, K, W, b, NULL, 0, M, N, K);
            for (int64_t i = 0; i < M; i++)
                assert_memory_equal(y + i * ld, y2 + i * ld, (size_t)N * sizeof(float));
            for (int64_t i = 0; i < M; i++) vitc__gelu(y2 + i * ld, N);
            for (int64_t i = 0; i < M; i++)
                assert_memory_equal(act + i * ld, y2 + i * ld, (size_t)N * sizeof(float));
        }
        restore();
        free(x), free(W), free(b), free(y), free(act), free(y2);
    }
}

/* vitc__linear_pw_ln bitwise vitc__layernorm then vitc__linear_pw, output
 * and the normalised rows, on every path, row-major and packed weights:
 * one K block (threads splitting columns normalise as they pack), two
 * (a pass first), rows split, tiny. */
static void test_linear_ln(void **state) {
    collect_paths();
    int64_t shapes[][3] = {{197, 768, 768}, {151, 1200, 1100}, {400, 64, 96}, {5, 7, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        if (too_big(M, N, K)) continue;
        float *x = rand_buf((size_t)(M * K)), *W = rand_buf((size_t)(N * K)), *b = rand_buf((size_t)N);
        float *lw = rand_buf((size_t)K), *lb = rand_buf((size_t)K);
        float *ln = malloc((size_t)(M * K) * sizeof(float)), *ln2 = malloc((size_t)(M * K) * sizeof(float));
        float *y = malloc((size_t)(M * N) * sizeof(float)), *y2 = malloc((size_t)(M * N) * sizeof(float));
        for (int p = 0; p < npaths; p++) {
            use_path(&paths[p]);
            vitc__pweight pw = {0};
            assert_int_equal(vitc__pweight_pack(&pw, W, N, K, VITC_PRECISION_FP32), VITC_OK);
            for (int packed = 0; packed < 2; packed++) {
                int act = packed ? VITC__ACT_GELU : VITC__ACT_NONE;
                vitc__layernorm(ln2, x, lw, lb, M, K, 1e-6f);
                assert_int_equal(vitc__linear_pw(y2, N, ln2, K, packed ? &pw : NULL, W, b, NULL, 0,
                                                 M, N, K, act), VITC_OK);
                for (int64_t i = 0; i < M * K; i++) ln[i] = NAN;
                vitc__ln_pre pre = {ln, x, lw, lb, 1e-6f, 0};
                assert_int_equal(vitc__linear_pw_ln(y, N, &pre, packed ? &pw : NULL, W, b, M, N, K,
                                                    act), VITC_OK);
                assert_memory_equal(ln, ln2, (size_t)(M * K) * sizeof(float));
                assert_memory_equal(y, y2, (size_t)(M * N) * sizeof(float));
                /* y_unused: the rows may go to the packers' scratch instead
                 * of ln; the output keeps its bits */
                for (int64_t i = 0; i < M * N; i++) y[i] = NAN;
                pre.y_unused = 1;
                assert_int_equal(vitc__linear_pw_ln(y, N, &pre, packed ? &pw : NULL, W, b, M, N, K,
                                                    act), VITC_OK);
                assert_memory_equal(y, y2, (size_t)(M * N) * sizeof(float));
            }
            vitc__pweight_free(&pw);
        }
        restore();
        free(x), free(W), free(b), free(lw), free(lb), free(ln), free(ln2), free(y), free(y2);
    }
}

/* y = x W^T + b + residual, against float64; also y aliasing the residual. */
static void test_linear_epilogue(void **state) {
    collect_paths();
    int64_t shapes[][3] = {{1, 1, 1}, {5, 7, 3}, {197, 768, 768}, {13, 50, 300}, {64, 35, 640}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        if (too_big(M, N, K)) continue;
        int64_t ldx = K + 3, ldy = N + 2, ldr = N + 1;
        float *x = rand_buf((size_t)(M * ldx)), *W = rand_buf((size_t)(N * K));
        float *bias = rand_buf((size_t)N), *res = rand_buf((size_t)(M * ldr));
        float *y = malloc((size_t)(M * ldy) * sizeof(float));
        float *yr = malloc((size_t)(M * N) * sizeof(float));
        double *R = malloc((size_t)(M * N) * sizeof(double)), *mag = malloc((size_t)(M * N) * sizeof(double));
        for (int variant = 0; variant < 4; variant++) {
            const float *b = (variant & 1) ? bias : NULL;
            const float *r = (variant & 2) ? res : NULL;
            ref64(0, 1, M, N, K, 1.0f, x, ldx, W, K, 0.0f, NULL, 0, R, mag);
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    double add = (b ? b[j] : 0.0) + (r ? r[i * ldr + j] : 0.0);
                    R[i * N + j] += add;
                    mag[i * N + j] += fabs(add);
                }
            for (int p = 0; p < npaths; p++) {
                use_path(&paths[p]);
                for (int64_t i = 0; i < M * ldy; i++) y[i] = NAN;
                vitc__linear(y, ldy, x, ldx, W, b, r, ldr, M, N, K);
                check_close(y, ldy, R, mag, M, N, paths[p].backend);
                if (r) { /* in place: the residual is the output */
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t j = 0; j < N; j++) yr[i * N + j] = r[i * ldr + j];
                    vitc__linear(yr, N, x, ldx, W, b, yr, N, M, N, K);
                    check_close(yr, N, R, mag, M, N, paths[p].arch);
                }
            }
        }
        restore();
        free(x), free(W), free(bias), free(res), free(y), free(yr), free(R), free(mag);
    }
}

static void test_backend_api(void **state) {
    assert_int_equal(vitc_set_gemm_backend("builtin"), VITC_OK);
    assert_string_equal(vitc_get_gemm_backend(), "builtin");
    assert_int_equal(vitc_set_gemm_backend("nonsense"), VITC_ERR_INVALID_ARG);
    assert_string_equal(vitc_get_gemm_backend(), "builtin");
#ifdef VITC_HAVE_OPENBLAS
    assert_int_equal(vitc_set_gemm_backend("openblas"), VITC_OK);
    assert_string_equal(vitc_get_gemm_backend(), "openblas");
#else
    assert_int_equal(vitc_set_gemm_backend("openblas"), VITC_ERR_UNSUPPORTED);
#endif
    assert_int_equal(vitc_set_gemm_backend(NULL), VITC_OK);
    assert_int_equal(vitc_set_arch("vax"), VITC_ERR_INVALID_ARG);
}

/* Inside a pool task a GEMM runs serially on that thread, and still right. */
typedef struct {
    const float *A, *B;
    float *C; /* [4][16*16] */
} nested_ctx;

static void nested_task(void *c, int64_t i, int tid) {
    nested_ctx *nc = c;
    vitc__gemm(0, 0, 16, 16, 16, 1.0f, nc->A, 16, nc->B, 16, 0.0f, nc->C + i * 256, 16);
}

static void test_gemm_in_pool_task(void **state) {
    float *A = rand_buf(256), *B = rand_buf(256), *C = malloc(4 * 256 * sizeof(float));
    double R[256], mag[256];
    ref64(0, 0, 16, 16, 16, 1.0f, A, 16, B, 16, 0.0f, NULL, 0, R, mag);
    vitc_set_num_threads(2);
    nested_ctx nc = {A, B, C};
    vitc__parallel_for(4, nested_task, &nc);
    for (int i = 0; i < 4; i++) check_close(C + i * 256, 16, R, mag, 16, 16, "nested");
    restore();
    free(A), free(B), free(C);
}

/* The GEMMs' chunk table (vitc__chunks_init): the chunks cover [0, total)
 * in order, none larger than chunk, each a multiple of unit but the last;
 * guided, they shrink at the end to a share of what is left (the last
 * 2 nparts at most a unit more than what is left / (2 nparts)); past the
 * table's size, whole chunks. */
static void test_chunks(void **state) {
    (void)state;
    static const int64_t cases[][4] = {
        /* total, chunk, unit, nparts */
        {72, 3, 1, 2}, {2304, 96, 32, 2}, {24, 1, 1, 2}, {1, 5, 1, 2},   {96, 4, 1, 3},
        {1000, 7, 1, 16}, {5, 64, 32, 2}, {100000, 10, 1, 64}, {0, 4, 1, 2},
    };
    vitc__chunks c;
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        const int64_t total = cases[k][0], chunk = cases[k][1], unit = cases[k][2];
        const int nparts = (int)cases[k][3];
        vitc__chunks_init(&c, total, chunk, unit, nparts);
        assert_int_equal(vitc__chunk_at(&c, 0), 0);
        assert_int_equal(vitc__chunk_at(&c, c.n), total);
        for (int64_t i = 0; i < c.n; i++) {
            int64_t b = vitc__chunk_at(&c, i), e = vitc__chunk_at(&c, i + 1);
            assert_true(b < e && e - b <= chunk);
            if (e < total) assert_int_equal((e - b) % unit, 0);
            if (c.guided) /* at most the share of what is left, a unit up */
                assert_true(e - b <= ((total - b + 2 * nparts - 1) / (2 * nparts) + unit - 1) /
                                         unit * unit);
        }
        /* small products are guided: the last chunk is one unit at most */
        if (total > 0 && total <= 2304) {
            assert_true(c.guided);
            assert_true(vitc__chunk_at(&c, c.n) - vitc__chunk_at(&c, c.n - 1) <= unit);
        }
        if (total == 100000) assert_false(c.guided); /* 10000 chunks: whole ones */
    }
}

int main(void) {
#ifndef VITC_HAVE_OPENBLAS
    printf("test_gemm: built without OpenBLAS (NO_BLAS=1 or not found): its backend checked to "
           "be refused, the comparisons with it skipped\n");
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backend_api),
        cmocka_unit_test(test_small_all_transposes),
        cmocka_unit_test(test_alpha_beta),
        cmocka_unit_test(test_medium_shapes),
        cmocka_unit_test(test_vit_shapes),
        cmocka_unit_test(test_nan_in_c_beta0),
        cmocka_unit_test(test_builtin_thread_invariant),
        cmocka_unit_test(test_direct_equals_packed),
        cmocka_unit_test(test_linear_act),
        cmocka_unit_test(test_gemm_tn_asum),
        cmocka_unit_test(test_linear_epilogue),
        cmocka_unit_test(test_linear_ln),
        cmocka_unit_test(test_gemm_in_pool_task),
        cmocka_unit_test(test_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
