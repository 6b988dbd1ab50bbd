/*
 * ops_backward.c — the backward of the row ops and of nn.Linear, each a
 * scalar reference beside the dispatching version. Parameter gradients
 * accumulate (+=), so a second backward before zero_grad adds, as in torch.
 *
 * LayerNorm recomputes each row's mean and rstd from its input instead of
 * the forward saving them: two extra reads of a row that backward reads
 * anyway, and the forward kernels stay as they are for inference.
 */
#include <math.h>
#include <string.h>

#include "ops_simd.h"

/* ---- nn.Linear ---------------------------------------------------- */

typedef struct colsum_ctx {
    float *db;
    const float *dy;
    int64_t lddy, M, N;
} colsum_ctx;

/* Columns per task: 16 keeps narrow layers (C = 96) evenly split over
 * threads; a thread's tasks are contiguous and its kernel call takes them
 * in one pass of up to 64 columns. */
#define COLS 16

void vitc__colsum_ref(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0, int64_t j1) {
    for (int64_t i = 0; i < M; i++) {
        const float *r = dy + i * lddy;
        for (int64_t j = j0; j < j1; j++) db[j] += r[j];
    }
}

/* db[j] += sum_i dy[i][j] over the columns of tasks [t0, t1), rows in order. */
static void colsum_part(void *c, int64_t t0, int64_t t1, int tid) {
    const colsum_ctx *k = c;
    (void)tid;
    int64_t j0 = t0 * COLS, j1 = t1 * COLS < k->N ? t1 * COLS : k->N;
    vitc__kern()->colsum(k->db, k->dy, k->lddy, k->M, j0, j1);
}

void vitc__colsum(float *db, const float *dy, int64_t lddy, int64_t M, int64_t N) {
    colsum_ctx k = {db, dy, lddy, M, N};
    vitc__parallel_range((N + COLS - 1) / COLS, colsum_part, &k);
}

/* The reference (ref: scalar GEMM, one thread) or the dispatching version;
 * every db[j] is summed over rows in order in both. */
static void linear_backward(int ref, float *dx, int64_t lddx, float dx_beta, float *dW, float *db,
                            const float *dy, int64_t lddy, const float *x, int64_t ldx,
                            const float *W, int64_t M, int64_t N, int64_t K) {
    void (*gemm)(int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                 const float *, int64_t, float, float *, int64_t) = ref ? vitc__gemm_ref
                                                                        : vitc__gemm;
    if (dx)
        gemm(0, 0, M, K, N, 1.0f, dy, lddy, W, K, dx_beta, dx, lddx);
    /* db from the dW GEMM's packing of dy when it can (no pass of its own) */
    if (dW && db && !ref && vitc__gemm_tn_asum(N, K, M, dy, lddy, x, ldx, 1.0f, dW, K, db))
        return;
    if (dW)
        gemm(1, 0, N, K, M, 1.0f, dy, lddy, x, ldx, 1.0f, dW, K);
    if (db) {
        if (ref)
            vitc__colsum_ref(db, dy, lddy, M, 0, N);
        else
            vitc__colsum(db, dy, lddy, M, N);
    }
}

void vitc__linear_backward_ref(float *dx, int64_t lddx, float dx_beta, float *dW, float *db,
                               const float *dy, int64_t lddy, const float *x, int64_t ldx,
                               const float *W, int64_t M, int64_t N, int64_t K) {
    linear_backward(1, dx, lddx, dx_beta, dW, db, dy, lddy, x, ldx, W, M, N, K);
}

void vitc__linear_backward(float *dx, int64_t lddx, float dx_beta, float *dW, float *db,
                           const float *dy, int64_t lddy, const float *x, int64_t ldx,
                           const float *W, int64_t M, int64_t N, int64_t K) {
    linear_backward(0, dx, lddx, dx_beta, dW, db, dy, lddy, x, ldx, W, M, N, K);
}

/* ---- LayerNorm ---------------------------------------------------- */

/* Mean and rstd of a row exactly as vitc__layernorm_ref computes them. */
static void ln_stats(const float *xr, int64_t C, float eps, float *mean, float *rstd) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; c++) mu += xr[c];
    mu /= (double)C;
    for (int64_t c = 0; c < C; c++) {
        double t = xr[c] - mu;
        var += t * t;
    }
    var /= (double)C;
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(var + eps));
}

/* dx += rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w. */
void vitc__layernorm_backward_row_ref(float *dx, const float *dy, const float *xr, const float *w,
                                      int64_t C, float mean, float rstd) {
    float sg = 0.0f, sgx = 0.0f;
    for (int64_t c = 0; c < C; c++) {
        float g = dy[c] * w[c], xh = (xr[c] - mean) * rstd;
        sg += g;
        sgx += g * xh;
    }
    float mg = sg / (float)C, mgx = sgx / (float)C;
    for (int64_t c = 0; c < C; c++) {
        float xh = (xr[c] - mean) * rstd;
        dx[c] += rstd * (dy[c] * w[c] - mg - xh * mgx);
    }
}

void vitc__layernorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *w, int64_t M, int64_t C, float eps) {
    for (int64_t i = 0; i < M; i++) {
        float mean, rstd;
        ln_stats(x + i * C, C, eps, &mean, &rstd);
        for (int64_t c = 0; c < C; c++) {
            dw[c] += dy[i * C + c] * (x[i * C + c] - mean) * rstd;
            db[c] += dy[i * C + c];
        }
        vitc__layernorm_backward_row_ref(dx + i * C, dy + i * C, x + i * C, w, C, mean, rstd);
    }
}

typedef struct ln_bwd_ctx {
    float *dx, *dw, *db, *stats;
    const float *dy, *x, *w, *res; /* res: dx's starting value, or NULL for dx itself */
    int64_t M, C;
    float eps;
} ln_bwd_ctx;

void vitc__layernorm_backward_cols_ref(float *dw, float *db, const float *dy, const float *x,
                                       const float *stats, int64_t M, int64_t C, int64_t j0,
                                       int64_t j1) {
    for (int64_t i = 0; i < M; i++) {
        const float *d = dy + i * C, *xr = x + i * C;
        float mean = stats[2 * i], rstd = stats[2 * i + 1];
        for (int64_t j = j0; j < j1; j++) {
            dw[j] += d[j] * (xr[j] - mean) * rstd;
            db[j] += d[j];
        }
    }
}

/* Mean and rstd from one pass in double shifted by the row's first
 * element (the forward kernels' way), with the path's row_stats. */
static void ln_bwd_rows(void *c, int64_t r0, int64_t r1, int tid) {
    const ln_bwd_ctx *k = c;
    (void)tid;
    const vitc__kernels *kt = vitc__kern();
    for (int64_t i = r0; i < r1; i++) {
        const float *xr = k->x + i * k->C;
        float *st = k->stats + 2 * i;
        double o[2], x0 = xr[0];
        kt->row_stats(xr, k->C, x0, o);
        double md = o[0] / (double)k->C, var = o[1] / (double)k->C - md * md;
        if (var < 0.0) var = 0.0;
        st[0] = (float)(x0 + md);
        st[1] = (float)(1.0 / sqrt(var + (double)k->eps));
        if (k->res && k->res != k->dx)
            memcpy(k->dx + i * k->C, k->res + i * k->C, (size_t)k->C * sizeof(float));
        kt->layernorm_backward_row(k->dx + i * k->C, k->dy + i * k->C, xr, k->w, k->C, st[0],
                                   st[1]);
    }
}

/* dw, db: column sums over the rows, split by column blocks so no two
 * threads write one gradient. */
static void ln_bwd_cols(void *c, int64_t t0, int64_t t1, int tid) {
    const ln_bwd_ctx *k = c;
    (void)tid;
    int64_t j0 = t0 * COLS, j1 = t1 * COLS < k->C ? t1 * COLS : k->C;
    vitc__kern()->layernorm_backward_cols(k->dw, k->db, k->dy, k->x, k->stats, k->M, k->C, j0, j1);
}

void vitc__layernorm_backward_res(float *dx, const float *res, float *dw, float *db,
                                  const float *dy, const float *x, const float *w, int64_t M,
                                  int64_t C, float eps, float *stats) {
    ln_bwd_ctx k = {dx, dw, db, stats, dy, x, w, res, M, C, eps};
    vitc__parallel_range(M, ln_bwd_rows, &k);
    vitc__parallel_range((C + COLS - 1) / COLS, ln_bwd_cols, &k);
}

void vitc__layernorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *w, int64_t M, int64_t C, float eps, float *stats) {
    vitc__layernorm_backward_res(dx, NULL, dw, db, dy, x, w, M, C, eps, stats);
}

/* ---- GELU (erf) --------------------------------------------------- */

/* d/dx x * Phi(x) = Phi(x) + x * phi(x). */
void vitc__gelu_backward_ref(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f));
        float pdf = 0.39894228040143268f * expf(-0.5f * v * v);
        dx[i] = dy[i] * (cdf + v * pdf);
    }
}

typedef struct gelu_bwd_ctx {
    float *dx;
    const float *dy, *x;
    int64_t n;
} gelu_bwd_ctx;

#define GELU_CHUNK 4096

static void gelu_bwd_part(void *c, int64_t t0, int64_t t1, int tid) {
    const gelu_bwd_ctx *k = c;
    (void)tid;
    int64_t b = t0 * GELU_CHUNK, e = t1 * GELU_CHUNK < k->n ? t1 * GELU_CHUNK : k->n;
    vitc__kern()->gelu_backward(k->dx + b, k->dy + b, k->x + b, e - b);
}

void vitc__gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    gelu_bwd_ctx k = {dx, dy, x, n};
    vitc__parallel_range((n + GELU_CHUNK - 1) / GELU_CHUNK, gelu_bwd_part, &k);
}
