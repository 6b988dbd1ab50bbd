/*
 * test_dense.c — the dense layers (src/nn/dense.h): conv2d, conv-transpose2d
 * and bilinear resampling, forward and backward, against PyTorch's float64
 * autograd (tests/reference/gen_dense.py writes tests/reference/dense/),
 * on the reference path and on the fast path; the fast path against the
 * reference on larger random shapes; LayerNorm2d as the row LayerNorm;
 * VITC_DENSE=ref; the errors.
 * Tolerance: max|got - want| <= 2e-5 * max(1, max|want|).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include "nn/dense.h"

#include "testutil.h"

#define TOL 2e-5

static vitc_safetensors *st_conv, *st_convt, *st_bil, *st_ln;

static int load_one(const char *name, vitc_safetensors **st) {
    char path[256];
    snprintf(path, sizeof path, "tests/reference/dense/%s.safetensors", name);
    if (access(path, R_OK) != 0)
        snprintf(path, sizeof path, "../tests/reference/dense/%s.safetensors", name);
    return tu_ref_load("test_dense", path, st);
}

static int setup(void **state) {
    (void)state;
    vitc_set_num_threads(2);
    if (load_one("conv", &st_conv) || load_one("convt", &st_convt) ||
        load_one("bilinear", &st_bil) || load_one("layernorm2d", &st_ln))
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    vitc_safetensors_free(st_conv);
    vitc_safetensors_free(st_convt);
    vitc_safetensors_free(st_bil);
    vitc_safetensors_free(st_ln);
    return 0;
}

/* Tensor case.name of st, with n values (0: any). */
static const float *get(const vitc_safetensors *st, const char *c, const char *name, size_t n) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", c, name);
    int nd;
    const int64_t *shape;
    const float *d = tu_tensor(st, full, &nd, &shape);
    if (n && (size_t)tu_numel(nd, shape) != n)
        fail_msg("%s: %lld values, expected %zu", full, (long long)tu_numel(nd, shape), n);
    return d;
}

static int has(const vitc_safetensors *st, const char *c, const char *name) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", c, name);
    return vitc_safetensors_find(st, full) >= 0;
}

/* max|got - want| <= tol * max(1, max|want|). */
static void close_to(const float *got, const float *want, size_t n, double tol, const char *c,
                     const char *what) {
    double mx = 1.0, err = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs(want[i]) > mx) mx = fabs(want[i]);
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= err)) err = e;
    }
    if (!(err <= tol * mx))
        fail_msg("%s %s (%s path): max error %g > %g", c, what, vitc__nn_dense_path(), err,
                 tol * mx);
}

/* Under valgrind (50x slower) the shapes of several row blocks are skipped. */
static int quick(void) { return RUNNING_ON_VALGRIND || getenv("VALGRIND") != NULL; }

static float *scratch_of(int64_t n) { return n > 0 ? tu_falloc((size_t)n) : NULL; }

/* ---- conv2d ------------------------------------------------------- */

static const char *const conv_cases[] = {"k3p1", "k3s2p1", "k3s2p1_odd", "k1", "k1_nobias",
                                         "k1s2", "k2x3",   "k4s3p2",     "k3_wide"};
static const char *const convt_cases[] = {"k2s2",   "k4s4",   "k2x3s2x3", "k3s2p1",
                                          "k4s2p1", "k3s1p1", "k2s2_wide"};
static const char *const bil_cases[] = {"up",     "up_ac",  "down",     "down_ac", "x4_c1",
                                        "wide_c", "from1", "from1_ac", "to1_ac"};
#define NCASES(a) (sizeof a / sizeof a[0])

static void run_conv_case(const char *c, int transposed) {
    const vitc_safetensors *st = transposed ? st_convt : st_conv;
    const float *cfg = get(st, c, "cfg", 12);
    const int64_t B = (int64_t)cfg[0], H = (int64_t)cfg[1], W = (int64_t)cfg[2],
                  C = (int64_t)cfg[3], O = (int64_t)cfg[4], kh = (int64_t)cfg[5],
                  kw = (int64_t)cfg[6], sh = (int64_t)cfg[7], sw = (int64_t)cfg[8],
                  ph = (int64_t)cfg[9], pw = (int64_t)cfg[10];
    const int bias = cfg[11] != 0.0f;
    const int64_t oh = transposed ? (H - 1) * sh - 2 * ph + kh : vitc__nn_conv_out(H, kh, sh, ph);
    const int64_t ow = transposed ? (W - 1) * sw - 2 * pw + kw : vitc__nn_conv_out(W, kw, sw, pw);
    const size_t nx = (size_t)(B * H * W * C), ny = (size_t)(B * oh * ow * O),
                 nw = (size_t)(O * C * kh * kw);
    const float *x = get(st, c, "x", nx), *wt = get(st, c, "w", nw); /* [B,H,W,C], torch's */
    const float *b = bias ? get(st, c, "b", (size_t)O) : NULL;      /* [O] */
    float *w = tu_falloc(nw), *y = tu_falloc(ny), *dx = tu_falloc(nx), *dw = tu_falloc(nw),
          *dwt = tu_falloc(nw), *db = tu_falloc((size_t)O);
    memset(dw, 0, nw * sizeof(float));
    memset(db, 0, (size_t)O * sizeof(float));
    int64_t ns;
    float *s;
    if (transposed) {
        vitc__nn_convt_pack(w, wt, C, O, kh, kw);
        vitc__nn_convt p = {w, b, C, O, kh, kw, sh, sw, ph, pw};
        ns = vitc__nn_convt_scratch(&p, B, H, W);
        s = scratch_of(ns);
        assert_int_equal(vitc__nn_convt_forward(&p, y, x, B, H, W, s, ns), VITC_OK);
        close_to(y, get(st, c, "y", ny), ny, TOL, c, "y");
        assert_int_equal(vitc__nn_convt_backward(&p, dx, dw, bias ? db : NULL, get(st, c, "dy", ny),
                                                 x, B, H, W, s, ns),
                         VITC_OK);
        vitc__nn_convt_unpack(dwt, dw, C, O, kh, kw);
    } else {
        vitc__nn_conv_pack(w, wt, O, C, kh, kw);
        vitc__nn_conv p = {w, b, C, O, kh, kw, sh, sw, ph, pw, NULL};
        ns = vitc__nn_conv_scratch(&p, B, H, W);
        s = scratch_of(ns);
        assert_int_equal(vitc__nn_conv_forward(&p, y, x, B, H, W, s, ns), VITC_OK);
        close_to(y, get(st, c, "y", ny), ny, TOL, c, "y");
        assert_int_equal(vitc__nn_conv_backward(&p, dx, dw, bias ? db : NULL, get(st, c, "dy", ny),
                                                x, B, H, W, s, ns),
                         VITC_OK);
        vitc__nn_conv_unpack(dwt, dw, O, C, kh, kw);
        /* the row-wise forward of a prepared weight */
        assert_int_equal(vitc__nn_conv_prepare(&p), VITC_OK);
        int64_t np = vitc__nn_conv_scratch(&p, B, H, W);
        float *sp = scratch_of(np);
        memset(y, 0, ny * sizeof(float));
        assert_int_equal(vitc__nn_conv_forward(&p, y, x, B, H, W, sp, np), VITC_OK);
        close_to(y, get(st, c, "y", ny), ny, TOL, c, "prepared y");
        vitc__nn_conv_unprepare(&p);
        assert_null(p.rows);
        free(sp);
    }
    close_to(dx, get(st, c, "dx", nx), nx, TOL, c, "dx");
    close_to(dwt, get(st, c, "dw", nw), nw, TOL, c, "dw");
    if (bias) close_to(db, get(st, c, "db", (size_t)O), (size_t)O, TOL, c, "db");
    else assert_false(has(st, c, "db"));
    free(w), free(y), free(dx), free(dw), free(dwt), free(db), free(s);
}

static void run_bil_case(const char *c) {
    const float *cfg = get(st_bil, c, "cfg", 7);
    const int64_t B = (int64_t)cfg[0], C = (int64_t)cfg[1], ih = (int64_t)cfg[2],
                  iw = (int64_t)cfg[3], oh = (int64_t)cfg[4], ow = (int64_t)cfg[5];
    const int ac = cfg[6] != 0.0f;
    const size_t nx = (size_t)(B * ih * iw * C), ny = (size_t)(B * oh * ow * C);
    float *y = tu_falloc(ny), *dx = tu_falloc(nx);
    assert_int_equal(vitc__nn_bilinear(y, get(st_bil, c, "x", nx), B, C, ih, iw, oh, ow, ac),
                     VITC_OK);
    close_to(y, get(st_bil, c, "y", ny), ny, TOL, c, "y");
    /* accumulates: start from 1 and take it off again */
    for (size_t i = 0; i < nx; i++) dx[i] = 1.0f;
    assert_int_equal(
        vitc__nn_bilinear_backward(dx, get(st_bil, c, "dy", ny), B, C, ih, iw, oh, ow, ac),
        VITC_OK);
    for (size_t i = 0; i < nx; i++) dx[i] -= 1.0f;
    close_to(dx, get(st_bil, c, "dx", nx), nx, TOL, c, "dx");
    free(y), free(dx);
}

static void torch_all(void) {
    for (size_t i = 0; i < NCASES(conv_cases); i++) run_conv_case(conv_cases[i], 0);
    for (size_t i = 0; i < NCASES(convt_cases); i++) run_conv_case(convt_cases[i], 1);
    for (size_t i = 0; i < NCASES(bil_cases); i++) run_bil_case(bil_cases[i]);
}

static void test_torch_ref(void **state) {
    (void)state;
    assert_int_equal(vitc__nn_dense_force("ref"), VITC_OK);
    assert_string_equal(vitc__nn_dense_path(), "ref");
    torch_all();
    assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
}

static void test_torch_fast(void **state) {
    (void)state;
    assert_int_equal(vitc__nn_dense_force("fast"), VITC_OK);
    assert_string_equal(vitc__nn_dense_path(), "fast");
    torch_all();
    assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
}

/* ---- LayerNorm2d: the row LayerNorm over B*H*W pixels -------------- */

static void test_layernorm2d(void **state) {
    (void)state;
    const char *const cases[] = {"sam_neck", "odd"};
    for (size_t i = 0; i < NCASES(cases); i++) {
        const char *c = cases[i];
        const float *cfg = get(st_ln, c, "cfg", 4);
        const int64_t B = (int64_t)cfg[0], C = (int64_t)cfg[1],
                      M = B * (int64_t)cfg[2] * (int64_t)cfg[3];
        const size_t n = (size_t)(M * C);
        const float *x = get(st_ln, c, "x", n), *w = get(st_ln, c, "w", (size_t)C),
                    *b = get(st_ln, c, "b", (size_t)C);
        float *y = tu_falloc(n), *dx = tu_falloc(n), *dw = tu_falloc((size_t)C),
              *db = tu_falloc((size_t)C), *stats = tu_falloc((size_t)(2 * M));
        vitc__layernorm(y, x, w, b, M, C, 1e-6f);
        close_to(y, get(st_ln, c, "y", n), n, TOL, c, "layernorm2d y");
        memset(dx, 0, n * sizeof(float));
        memset(dw, 0, (size_t)C * sizeof(float));
        memset(db, 0, (size_t)C * sizeof(float));
        vitc__layernorm_backward(dx, dw, db, get(st_ln, c, "dy", n), x, w, M, C, 1e-6f, stats);
        close_to(dx, get(st_ln, c, "dx", n), n, TOL, c, "layernorm2d dx");
        close_to(dw, get(st_ln, c, "dw", (size_t)C), (size_t)C, TOL, c, "layernorm2d dw");
        close_to(db, get(st_ln, c, "db", (size_t)C), (size_t)C, TOL, c, "layernorm2d db");
        free(y), free(dx), free(dw), free(db), free(stats);
    }
}

/* ---- the fast path against the reference on shapes of several row
 * blocks (dense.c's 8 MiB blocks), the gradients accumulated twice ------ */

typedef struct cshape {
    int64_t B, H, W, C, O, kh, kw, sh, sw, ph, pw;
    int transposed, bias;
} cshape;

/* Forward y and gradients dx, dw (+= twice from 0.5), db on path `path`. */
static void conv_run(const cshape *c, const char *path, const float *x, const float *w,
                     const float *b, const float *dy, float *y, float *dx, float *dw, float *db,
                     int want_dx) {
    assert_int_equal(vitc__nn_dense_force(path), VITC_OK);
    const int64_t nw = c->O * c->C * c->kh * c->kw;
    for (int64_t i = 0; i < nw; i++) dw[i] = 0.5f;
    for (int64_t i = 0; i < c->O; i++) db[i] = 0.5f;
    for (int rep = 0; rep < 2; rep++) {
        if (c->transposed) {
            vitc__nn_convt p = {w, b, c->C, c->O, c->kh, c->kw, c->sh, c->sw, c->ph, c->pw};
            int64_t ns = vitc__nn_convt_scratch(&p, c->B, c->H, c->W);
            float *s = scratch_of(ns);
            assert_int_equal(vitc__nn_convt_forward(&p, y, x, c->B, c->H, c->W, s, ns), VITC_OK);
            assert_int_equal(vitc__nn_convt_backward(&p, want_dx ? dx : NULL, dw, b ? db : NULL,
                                                     dy, x, c->B, c->H, c->W, s, ns),
                             VITC_OK);
            free(s);
        } else {
            vitc__nn_conv p = {w, b, c->C, c->O, c->kh, c->kw, c->sh, c->sw, c->ph, c->pw, NULL};
            int64_t ns = vitc__nn_conv_scratch(&p, c->B, c->H, c->W);
            float *s = scratch_of(ns);
            assert_int_equal(vitc__nn_conv_forward(&p, y, x, c->B, c->H, c->W, s, ns), VITC_OK);
            assert_int_equal(vitc__nn_conv_backward(&p, want_dx ? dx : NULL, dw, b ? db : NULL,
                                                    dy, x, c->B, c->H, c->W, s, ns),
                             VITC_OK);
            free(s);
        }
    }
    assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
}

static void fast_vs_ref(const cshape *c, int want_dx) {
    uint64_t rs = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->C * 131 + c->O);
    const int64_t oh = c->transposed ? (c->H - 1) * c->sh - 2 * c->ph + c->kh
                                     : vitc__nn_conv_out(c->H, c->kh, c->sh, c->ph);
    const int64_t ow = c->transposed ? (c->W - 1) * c->sw - 2 * c->pw + c->kw
                                     : vitc__nn_conv_out(c->W, c->kw, c->sw, c->pw);
    const size_t nx = (size_t)(c->B * c->H * c->W * c->C), ny = (size_t)(c->B * oh * ow * c->O),
                 nw = (size_t)(c->O * c->C * c->kh * c->kw), no = (size_t)c->O;
    float *x = tu_falloc(nx), *w = tu_falloc(nw), *b = tu_falloc(no), *dy = tu_falloc(ny);
    tu_fill(&rs, x, nx, 1.0f);
    tu_fill(&rs, w, nw, 0.1f);
    tu_fill(&rs, b, no, 1.0f);
    tu_fill(&rs, dy, ny, 1.0f);
    float *y[2], *dx[2], *dw[2], *db[2];
    for (int k = 0; k < 2; k++) {
        y[k] = tu_falloc(ny), dx[k] = tu_falloc(nx), dw[k] = tu_falloc(nw), db[k] = tu_falloc(no);
        conv_run(c, k ? "fast" : "ref", x, w, c->bias ? b : NULL, dy, y[k], dx[k], dw[k], db[k],
                 want_dx);
    }
    const char *what = c->transposed ? "convt" : "conv";
    close_to(y[1], y[0], ny, 1e-5, what, "fast y");
    if (want_dx) close_to(dx[1], dx[0], nx, 1e-5, what, "fast dx");
    close_to(dw[1], dw[0], nw, 1e-5, what, "fast dw");
    if (c->bias) close_to(db[1], db[0], no, 1e-5, what, "fast db");
    for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]), free(dw[k]), free(db[k]);
    free(x), free(w), free(b), free(dy);
}

static void test_fast_vs_ref(void **state) {
    (void)state;
    const cshape cases[] = {
        /* 3x3 / 1 / 1 at K = 2304: 1024 rows, two blocks */
        {1, 32, 32, 256, 8, 3, 3, 1, 1, 1, 1, 0, 1},
        /* 3x3 / 2 / 1, odd map, two images, no bias */
        {2, 23, 21, 64, 12, 3, 3, 2, 2, 1, 1, 0, 0},
        /* 1x1: one GEMM */
        {2, 17, 19, 40, 24, 1, 1, 1, 1, 0, 0, 0, 1},
        /* tiling 2x2 / 2 at N = 1024: 2304 rows, two blocks */
        {1, 48, 48, 8, 256, 2, 2, 2, 2, 0, 0, 1, 1},
        /* tiling 4x4 / 4 */
        {2, 7, 9, 24, 16, 4, 4, 4, 4, 0, 0, 1, 1},
        /* overlapping transposed: GEMM + col2im, at N = 1152: two blocks */
        {1, 44, 44, 4, 128, 3, 3, 2, 2, 1, 1, 1, 1},
        {2, 6, 5, 8, 6, 4, 4, 2, 2, 1, 1, 1, 0},
    };
    for (size_t i = 0; i < NCASES(cases); i++) {
        const cshape *c = &cases[i];
        if (quick() && c->B * c->H * c->W * c->kh * c->kw * c->C * c->O > ((int64_t)1 << 22))
            continue;
        fast_vs_ref(&cases[i], 1);
        fast_vs_ref(&cases[i], 0);
    }
}

/* forward_rows' fn: copies each row where it belongs in a second map. */
typedef struct row_copy {
    float *out; /* [B, oh, ow, O] */
    int64_t oh, n;
} row_copy;

static void copy_row(void *ctx, int64_t b, int64_t oy, const float *row) {
    const row_copy *k = ctx;
    memcpy(k->out + (b * k->oh + oy) * k->n, row, (size_t)k->n * sizeof(float));
}

/* vitc__nn_conv_forward_ex (the ReLU'd input, the residual, the residual
 * being y itself), prepared (row-wise) and not (im2col), on the fast path
 * against the reference: shapes of the DPT head's, strided, a kernel row
 * deeper than the in-place GEMM reads (3 x 128 = 384 floats), a kernel of
 * one row whose padding rows leave some outputs nothing but the bias;
 * vitc__nn_conv_forward_rows' rows, with y and without. */
static void test_conv_ex(void **state) {
    (void)state;
    const cshape cases[] = {
        {2, 13, 17, 64, 64, 3, 3, 1, 1, 1, 1, 0, 1},
        {1, 15, 12, 32, 32, 3, 3, 2, 2, 1, 1, 0, 1},
        {1, 9, 10, 128, 20, 3, 3, 1, 1, 1, 1, 0, 0},
        {2, 3, 5, 8, 40, 1, 3, 1, 1, 1, 1, 0, 1},
        {1, 7, 6, 12, 5, 2, 4, 3, 1, 2, 0, 0, 1},
        /* Winograd F(2x2, 3x3) forwards: vectors of 8 in and out, even
         * sizes; a row of several chunks of tiles (odd width); channels
         * not in fours (the row-wise forward instead) */
        {1, 8, 6, 8, 24, 3, 3, 1, 1, 1, 1, 0, 1},
        {1, 6, 9, 20, 12, 3, 3, 1, 1, 1, 1, 0, 1}, /* vectors of 4 in and out */
        {1, 3, 151, 64, 64, 3, 3, 1, 1, 1, 1, 0, 0},
        {2, 5, 7, 6, 10, 3, 3, 1, 1, 1, 1, 0, 1},
        /* the DPT reassemble's deepest 3x3: 384 channels, more than the
         * Winograd forward takes (its error would be 1.1e-5 of the
         * largest output); and 128, the most it takes */
        {1, 19, 19, 128, 64, 3, 3, 1, 1, 1, 1, 0, 1},
        {1, 19, 19, 384, 64, 3, 3, 1, 1, 1, 1, 0, 0},
    };
    for (size_t i = 0; i < NCASES(cases); i++) {
        const cshape *c = &cases[i];
        uint64_t rs = 0x2545f4914f6cdd1dull + i;
        const int64_t oh = vitc__nn_conv_out(c->H, c->kh, c->sh, c->ph),
                      ow = vitc__nn_conv_out(c->W, c->kw, c->sw, c->pw);
        const size_t nx = (size_t)(c->B * c->H * c->W * c->C), ny = (size_t)(c->B * oh * ow * c->O),
                     nw = (size_t)(c->O * c->C * c->kh * c->kw);
        float *x = tu_falloc(nx), *w = tu_falloc(nw), *b = tu_falloc((size_t)c->O),
              *r = tu_falloc(ny), *want = tu_falloc(ny), *got = tu_falloc(ny);
        tu_fill(&rs, x, nx, 1.0f);
        tu_fill(&rs, w, nw, 0.1f);
        tu_fill(&rs, b, (size_t)c->O, 1.0f);
        tu_fill(&rs, r, ny, 1.0f);
        for (int mode = 0; mode < 4; mode++) { /* relu_in, res: none, res, res = y */
            int relu = mode & 1, res = mode >> 1;
            vitc__nn_conv p = {w, c->bias ? b : NULL, c->C, c->O, c->kh, c->kw,
                               c->sh, c->sw, c->ph, c->pw, NULL};
            for (int prep = 0; prep < 3; prep++) { /* ref, im2col, prepared */
                if (prep == 2) assert_int_equal(vitc__nn_conv_prepare(&p), VITC_OK);
                assert_int_equal(vitc__nn_dense_force(prep ? "fast" : "ref"), VITC_OK);
                int64_t ns = vitc__nn_conv_scratch(&p, c->B, c->H, c->W);
                float *s = scratch_of(ns), *out = prep ? got : want;
                /* mode 3: the residual is y's old contents */
                if (res) memcpy(out, r, ny * sizeof(float));
                const float *rr = !res ? NULL : mode == 3 ? out : r;
                assert_int_equal(vitc__nn_conv_forward_ex(&p, out, x, c->B, c->H, c->W, relu, rr,
                                                          s, ns),
                                 VITC_OK);
                if (prep) close_to(got, want, ny, 1e-5, prep == 2 ? "prepared" : "im2col",
                                   relu ? (res ? "relu res" : "relu") : (res ? "res" : "plain"));
                free(s);
            }
            vitc__nn_conv_unprepare(&p);
        }
        /* forward_rows: fn sees every row, as final as y's (NaN elsewhere) */
        vitc__nn_conv p = {w, c->bias ? b : NULL, c->C, c->O, c->kh, c->kw,
                           c->sh, c->sw, c->ph, c->pw, NULL};
        float *rows = tu_falloc(ny);
        row_copy rc = {rows, oh, ow * c->O};
        for (int prep = 0; prep < 3; prep++) {
            if (prep == 2) assert_int_equal(vitc__nn_conv_prepare(&p), VITC_OK);
            assert_int_equal(vitc__nn_dense_force(prep ? "fast" : "ref"), VITC_OK);
            int64_t ns = vitc__nn_conv_scratch(&p, c->B, c->H, c->W);
            float *s = scratch_of(ns);
            for (size_t k = 0; k < ny; k++) rows[k] = NAN;
            assert_int_equal(vitc__nn_conv_forward_rows(&p, got, x, c->B, c->H, c->W, 1,
                                                        copy_row, &rc, s, ns),
                             VITC_OK);
            assert_memory_equal(rows, got, ny * sizeof(float));
            /* without y: the rows only fn's, the same numbers */
            for (size_t k = 0; k < ny; k++) rows[k] = NAN;
            assert_int_equal(vitc__nn_conv_forward_rows(&p, NULL, x, c->B, c->H, c->W, 1,
                                                        copy_row, &rc, s, ns),
                             VITC_OK);
            assert_memory_equal(rows, got, ny * sizeof(float));
            free(s);
        }
        vitc__nn_conv_unprepare(&p);
        free(rows);
        assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
        free(x), free(w), free(b), free(r), free(want), free(got);
    }
    /* a 1x1 convolution has no copy of x to ReLU */
    float w1[2] = {1, 1}, x1[2] = {1, 1}, y1[1];
    vitc__nn_conv p1 = {w1, NULL, 2, 1, 1, 1, 1, 1, 0, 0, NULL};
    assert_int_equal(vitc__nn_conv_forward_ex(&p1, y1, x1, 1, 1, 1, 1, NULL, NULL, 0),
                     VITC_ERR_INVALID_ARG);
    tu_assert_message_has("1x1");
}

/* The fast bilinear is the reference's operations in the same order: the
 * same bits, on more channels than one task's chunk. */
static void test_bilinear_fast_bitwise(void **state) {
    (void)state;
    const int64_t shapes[][6] = {{2, 40, 9, 11, 31, 17}, {3, 1, 16, 16, 64, 64},
                                 {1, 67, 20, 13, 7, 6}};
    uint64_t rs = 77;
    for (size_t s = 0; s < NCASES(shapes); s++)
        for (int ac = 0; ac < 2; ac++) {
            const int64_t *d = shapes[s];
            const size_t nx = (size_t)(d[0] * d[1] * d[2] * d[3]),
                         ny = (size_t)(d[0] * d[1] * d[4] * d[5]);
            float *x = tu_falloc(nx), *dy = tu_falloc(ny), *y[2], *dx[2];
            tu_fill(&rs, x, nx, 1.0f);
            tu_fill(&rs, dy, ny, 1.0f);
            for (int k = 0; k < 2; k++) {
                assert_int_equal(vitc__nn_dense_force(k ? "fast" : "ref"), VITC_OK);
                y[k] = tu_falloc(ny), dx[k] = tu_falloc(nx);
                memset(dx[k], 0, nx * sizeof(float));
                assert_int_equal(vitc__nn_bilinear(y[k], x, d[0], d[1], d[2], d[3], d[4], d[5], ac),
                                 VITC_OK);
                assert_int_equal(vitc__nn_bilinear_backward(dx[k], dy, d[0], d[1], d[2], d[3], d[4],
                                                             d[5], ac),
                                 VITC_OK);
            }
            assert_int_equal(vitc__nn_dense_force("auto"), VITC_OK);
            assert_memory_equal(y[0], y[1], ny * sizeof(float));
            assert_memory_equal(dx[0], dx[1], nx * sizeof(float));
            for (int k = 0; k < 2; k++) free(y[k]), free(dx[k]);
            free(x), free(dy);
        }
}

/* ---- VITC_DENSE=ref, read once: a fresh process (this binary, run with
 * --env-child) sees it ------------------------------------------------- */

/* This binary's path, read at start: under valgrind, exec'ing
 * /proc/self/exe would run valgrind's launcher, not the test. */
static char self_path[4096];

static int env_child(void) {
    int ok = strcmp(vitc__nn_dense_path(), "ref") == 0 &&
             strstr(vitc_get_precision_paths(), "dense layers: reference (VITC_DENSE=ref)");
    unsetenv("VITC_DENSE"); /* read once: unsetting it later changes nothing */
    ok = ok && strcmp(vitc__nn_dense_path(), "ref") == 0;
    ok = ok && vitc__nn_dense_force("fast") == VITC_OK &&
         strcmp(vitc__nn_dense_path(), "fast") == 0;
    return ok ? 0 : 1;
}

static void test_env(void **state) {
    (void)state;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv("VITC_DENSE", "ref", 1);
        char *argv[] = {"test_dense", "--env-child", NULL};
        execv(self_path, argv);
        _exit(2);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_null(strstr(vitc_get_precision_paths(), "VITC_DENSE"));
    assert_int_equal(vitc__nn_dense_force("bogus"), VITC_ERR_INVALID_ARG);
    tu_assert_message_has("bogus");
}

/* ---- errors --------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    float w[4 * 3 * 3 * 2] = {0}, x[2 * 2 * 2] = {0}, y[64] = {0};
    vitc__nn_conv p = {w, NULL, 2, 4, 3, 3, 1, 1, 0, 0, NULL};
    /* a 2 x 2 map is smaller than the 3 x 3 kernel without padding */
    assert_int_equal(vitc__nn_conv_forward(&p, y, x, 1, 2, 2, NULL, 0), VITC_ERR_SHAPE);
    tu_assert_message_has("smaller than");
    assert_int_equal(vitc__nn_conv_backward(&p, x, NULL, NULL, y, x, 1, 2, 2, NULL, 0),
                     VITC_ERR_SHAPE);
    p.sh = 0;
    assert_int_equal(vitc__nn_conv_forward(&p, y, x, 1, 2, 2, NULL, 0), VITC_ERR_INVALID_ARG);
    p.sh = 1, p.ph = p.pw = 1;
    int64_t ns = vitc__nn_conv_scratch(&p, 1, 2, 2);
    if (ns > 0) {
        assert_int_equal(vitc__nn_conv_forward(&p, y, x, 1, 2, 2, NULL, 0), VITC_ERR_INVALID_ARG);
        tu_assert_message_has("scratch");
    }
    p.w = NULL;
    assert_int_equal(vitc__nn_conv_forward(&p, y, x, 1, 2, 2, NULL, 0), VITC_ERR_INVALID_ARG);
    assert_int_equal(vitc__nn_conv_forward(NULL, y, x, 1, 2, 2, NULL, 0), VITC_ERR_INVALID_ARG);
    vitc__nn_convt t = {w, NULL, 2, 4, 3, 3, 1, 1, 2, 2}; /* 1 x 1 -> 3 - 4 = -1 */
    assert_int_equal(vitc__nn_convt_forward(&t, y, x, 1, 1, 1, NULL, 0), VITC_ERR_SHAPE);
    tu_assert_message_has("less padding");
    assert_int_equal(vitc__nn_convt_backward(&t, x, NULL, NULL, y, x, 1, 1, 1, NULL, 0),
                     VITC_ERR_SHAPE);
    assert_int_equal(vitc__nn_bilinear(y, x, 1, 2, 2, 2, 0, 3, 0), VITC_ERR_SHAPE);
    assert_int_equal(vitc__nn_bilinear(y, x, 1, 0, 2, 2, 3, 3, 0), VITC_ERR_SHAPE);
    assert_int_equal(vitc__nn_bilinear_backward(x, y, 1, 2, 2, 2, 3, -1, 1), VITC_ERR_SHAPE);
    assert_int_equal(vitc__nn_bilinear(NULL, x, 1, 2, 2, 2, 3, 3, 0), VITC_ERR_INVALID_ARG);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--env-child") == 0) return env_child();
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0) snprintf(self_path, sizeof self_path, "%s", argv[0]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_ref),
        cmocka_unit_test(test_torch_fast),
        cmocka_unit_test(test_layernorm2d),
        cmocka_unit_test(test_fast_vs_ref),
        cmocka_unit_test(test_conv_ex),
        cmocka_unit_test(test_bilinear_fast_bitwise),
        cmocka_unit_test(test_env),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
