/*
 * ops.c — softmax, norms, GELU, layout moves. The *_ref functions are the
 * plain reference kernels (kept, and what tests compare the fast paths
 * with); softmax, LayerNorm and GELU run the kernel table's version
 * (dispatch.c: x86/ops_avx512.c, x86/ops_avx2.c or the reference) and spread large inputs over the pool by rows (chunks for
 * GELU). Each row is computed by one thread with the same code whatever
 * the thread count, so results do not depend on it.
 */
#include <math.h>
#include <stdlib.h>

#include "ops_layers.h"
#include "ops_simd.h"

void vitc__softmax_rows_ref(float *x, int64_t rows, int64_t n, float inv_temperature) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            row[j] *= inv_temperature;
            if (row[j] > mx) mx = row[j];
        }
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < n; j++) row[j] *= inv;
    }
}

void vitc__softmax_rows_exp2_ref(float *x, int64_t rows, int64_t n, float s, float *inv) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++)
            if (row[j] * s > mx) mx = row[j] * s;
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            row[j] = exp2f(fmaf(row[j], s, -mx));
            sum += row[j];
        }
        inv[r] = 1.0f / sum;
    }
}

void vitc__softmax_cols_ref(float *x, int64_t n, int64_t L, int64_t ld, float scale) {
    for (int64_t j = 0; j < L; j++) {
        float *c = x + j;
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            c[i * ld] *= scale;
            if (c[i * ld] > mx) mx = c[i * ld];
        }
        float sum = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            c[i * ld] = expf(c[i * ld] - mx);
            sum += c[i * ld];
        }
        float inv = 1.0f / sum;
        for (int64_t i = 0; i < n; i++) c[i * ld] *= inv;
    }
}

/* The dot product in double: it is the one reduction, and torch's float
 * result is within an ulp of it. */
void vitc__softmax_rows_backward_ref(float *dx, const float *y, const float *dy, int64_t rows,
                                     int64_t n, float inv_temperature) {
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *gr = dy + r * n;
        float *xr = dx + r * n;
        double dot = 0.0;
        for (int64_t j = 0; j < n; j++) dot += (double)gr[j] * yr[j];
        float d = (float)dot;
        for (int64_t j = 0; j < n; j++) xr[j] = inv_temperature * yr[j] * (gr[j] - d);
    }
}

/* Mean and variance in double: a float running sum drifts on 4096-long rows. */
void vitc__layernorm_ref(float *y, const float *x, const float *w, const float *b, int64_t M,
                         int64_t C, float eps, float *stats) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * C;
        float *yr = y ? y + i * C : NULL;
        double mean = 0.0, var = 0.0;
        for (int64_t c = 0; c < C; c++) mean += xr[c];
        mean /= (double)C;
        for (int64_t c = 0; c < C; c++) {
            double t = xr[c] - mean;
            var += t * t;
        }
        var /= (double)C;
        float rstd = (float)(1.0 / sqrt(var + eps));
        float m = (float)mean;
        if (stats)
            stats[2 * i] = m, stats[2 * i + 1] = rstd;
        if (y)
            for (int64_t c = 0; c < C; c++) yr[c] = (xr[c] - m) * rstd * w[c] + b[c];
    }
}

void vitc__groupnorm_ref(float *y, const float *x, const float *w, const float *b, int64_t B,
                         int64_t C, int64_t HW, int64_t G, float eps) {
    int64_t cg = C / G;
    for (int64_t n = 0; n < B; n++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + (n * C + g * cg) * HW;
            float *yg = y + (n * C + g * cg) * HW;
            int64_t cnt = cg * HW;
            double mean = 0.0, var = 0.0;
            for (int64_t i = 0; i < cnt; i++) mean += xg[i];
            mean /= (double)cnt;
            for (int64_t i = 0; i < cnt; i++) {
                double t = xg[i] - mean;
                var += t * t;
            }
            var /= (double)cnt;
            float rstd = (float)(1.0 / sqrt(var + eps));
            float m = (float)mean;
            for (int64_t c = 0; c < cg; c++) {
                float sc = rstd * w[g * cg + c], sh = b[g * cg + c];
                for (int64_t i = 0; i < HW; i++)
                    yg[c * HW + i] = (xg[c * HW + i] - m) * sc + sh;
            }
        }
    }
}

void vitc__gelu_to_ref(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void vitc__gelu_ref(float *x, int64_t n) { vitc__gelu_to_ref(x, x, n); }

/* As torch writes it for OpenAI CLIP: x * torch.sigmoid(1.702 * x). */
void vitc__quick_gelu_ref(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / (1.0f + expf(-1.702f * x[i]));
}

/* tanh-GELU (gelu_pytorch_tanh, SigLIP) as torch writes it in float:
 * 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void vitc__tanh_gelu_ref(float *x, int64_t n) {
    const float kb = 0.7978845608028654f, kk = 0.044715f;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        x[i] = 0.5f * v * (1.0f + tanhf(kb * (v + kk * v * v * v)));
    }
}

void vitc__scale_add_ref(float *y, const float *g, const float *r, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float v = g[i] * y[i]; /* rounded before the add, as torch does */
        y[i] = r ? r[i] + v : v;
    }
}

void vitc__dot_rows_ref(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                        int64_t n, int64_t K, int64_t rows) {
    for (int64_t m = 0; m < n; m++)
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++) acc += x[r * ldx + k] * w[m * K + k];
            y[m * ldy + r] = acc;
        }
}

void vitc__dot_rows(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w, int64_t n,
                    int64_t K, int64_t rows) {
    if (n > 0 && rows > 0) vitc__kern()->dot_rows(y, ldy, x, ldx, w, n, K, rows);
}

void vitc__row_stats_ref(const float *x, int64_t n, double shift, double *o) {
    double s = 0.0, q = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - shift;
        s += d;
        q += d * d;
    }
    o[0] = s, o[1] = q;
}

void vitc__row_norm_ref(float *y, const float *x, int64_t n, float mean, float sc, float sh) {
    for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mean) * sc + sh;
}

/* ---- dispatch ------------------------------------------------------ */

/* Below this many elements a parallel region costs more than it saves. */
#define VITC_OPS_PAR_ELEMS 32768

/* fn over units [0, units): over the pool when there are several units
 * and at least min_elems elements of work (below, a region costs more
 * than it saves), else on this thread. */
static void vitc__ops_split(int64_t units, int64_t elems, int64_t min_elems, vitc__range_fn fn,
                            void *ctx) {
    if (units > 1 && elems >= min_elems)
        vitc__parallel_range(units, fn, ctx);
    else
        fn(ctx, 0, units, 0);
}

typedef struct {
    float *y;
    const float *x, *w, *b;
    int64_t n; /* row length */
    float f;   /* eps or inv_temperature */
    const vitc__kernels *kt;
    float *stats; /* layernorm: [rows, 2] or NULL */
} vitc__rows_ctx;

static void vitc__softmax_part(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__rows_ctx *k = c;
    float *x = k->y + r0 * k->n;
    (void)tid;
    k->kt->softmax_rows(x, r1 - r0, k->n, k->f);
}

void vitc__softmax_rows(float *x, int64_t rows, int64_t n, float inv_temperature) {
    vitc__rows_ctx k = {x, NULL, NULL, NULL, n, inv_temperature, vitc__kern(), NULL};
    if (rows <= 0 || n <= 0) return;
    vitc__ops_split(rows, rows * n, VITC_OPS_PAR_ELEMS, vitc__softmax_part, &k);
}

/* Columns per task of vitc__softmax_cols: 64-byte lines whole. */
#define VITC_COLS_BLOCK 64

typedef struct {
    float *x;
    int64_t n, L, ld;
    float scale;
    const vitc__kernels *kt;
} vitc__cols_ctx;

static void vitc__cols_part(void *c, int64_t b, int64_t e, int tid) {
    const vitc__cols_ctx *k = c;
    const int64_t j0 = b * VITC_COLS_BLOCK;
    const int64_t j1 = e * VITC_COLS_BLOCK < k->L ? e * VITC_COLS_BLOCK : k->L;
    (void)tid;
    k->kt->softmax_cols(k->x + j0, k->n, j1 - j0, k->ld, k->scale);
}

void vitc__softmax_cols(float *x, int64_t n, int64_t L, int64_t ld, float scale) {
    vitc__cols_ctx k = {x, n, L, ld, scale, vitc__kern()};
    if (n <= 0 || L <= 0) return;
    const int64_t blocks = (L + VITC_COLS_BLOCK - 1) / VITC_COLS_BLOCK;
    vitc__ops_split(blocks, n * L, VITC_OPS_PAR_ELEMS, vitc__cols_part, &k);
}

/* Rows per block of vitc__softmax_rows_short: a block's transpose is
 * [n][16], at most 1 KB on the stack. */
#define VITC_SHORT_BLOCK 16

typedef struct {
    float *x;
    int64_t rows, n;
    const vitc__kernels *kt;
} vitc__short_ctx;

static void vitc__short_part(void *c, int64_t b, int64_t e, int tid) {
    const vitc__short_ctx *k = c;
    const int64_t n = k->n;
    float buf[VITC_SOFTMAX_SHORT * VITC_SHORT_BLOCK]; /* [n][VITC_SHORT_BLOCK] */
    (void)tid;
    for (int64_t blk = b; blk < e; blk++) {
        const int64_t r0 = blk * VITC_SHORT_BLOCK;
        const int64_t m = k->rows - r0 < VITC_SHORT_BLOCK ? k->rows - r0 : VITC_SHORT_BLOCK;
        float *x = k->x + r0 * n; /* [m, n] */
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < m; i++) buf[t * VITC_SHORT_BLOCK + i] = x[i * n + t];
        k->kt->softmax_cols(buf, n, m, VITC_SHORT_BLOCK, 1.0f);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < m; i++) x[i * n + t] = buf[t * VITC_SHORT_BLOCK + i];
    }
}

void vitc__softmax_rows_short(float *x, int64_t rows, int64_t n) {
    if (n > VITC_SOFTMAX_SHORT) {
        vitc__softmax_rows(x, rows, n, 1.0f);
        return;
    }
    vitc__short_ctx k = {x, rows, n, vitc__kern()};
    if (rows <= 0 || n <= 0) return;
    const int64_t blocks = (rows + VITC_SHORT_BLOCK - 1) / VITC_SHORT_BLOCK;
    vitc__ops_split(blocks, rows * n, VITC_OPS_PAR_ELEMS, vitc__short_part, &k);
}

typedef struct {
    float *dx;
    const float *y, *dy;
    int64_t n;
    float it;
    const vitc__kernels *kt;
} vitc__softmax_bwd_ctx;

static void vitc__softmax_bwd_part(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__softmax_bwd_ctx *k = c;
    (void)tid;
    k->kt->softmax_rows_backward(k->dx + r0 * k->n, k->y + r0 * k->n, k->dy + r0 * k->n, r1 - r0,
                                 k->n, k->it);
}

void vitc__softmax_rows_backward(float *dx, const float *y, const float *dy, int64_t rows,
                                 int64_t n, float inv_temperature) {
    vitc__softmax_bwd_ctx k = {dx, y, dy, n, inv_temperature, vitc__kern()};
    if (rows <= 0 || n <= 0) return;
    vitc__ops_split(rows, rows * n, VITC_OPS_PAR_ELEMS, vitc__softmax_bwd_part, &k);
}

static void vitc__layernorm_part(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__rows_ctx *k = c;
    float *y = k->y ? k->y + r0 * k->n : NULL;
    const float *x = k->x + r0 * k->n;
    (void)tid;
    k->kt->layernorm(y, x, k->w, k->b, r1 - r0, k->n, k->f, k->stats ? k->stats + 2 * r0 : NULL);
}

void vitc__layernorm(float *y, const float *x, const float *w, const float *b, int64_t M,
                     int64_t C, float eps) {
    vitc__layernorm_stats(y, x, w, b, M, C, eps, NULL);
}

float *vitc__ln_strip(const vitc__ln_pre *ln, int64_t i, int64_t mr, int64_t K, float *tmp) {
    float *y = ln->y_unused && mr * K <= VITC_LN_STRIP ? tmp : ln->y + i * K; /* [mr, K] */
    vitc__kern()->layernorm(y, ln->x + i * K, ln->w, ln->b, mr, K, ln->eps, NULL);
    return y;
}

void vitc__layernorm_stats(float *y, const float *x, const float *w, const float *b, int64_t M,
                           int64_t C, float eps, float *stats) {
    vitc__rows_ctx k = {y, x, w, b, C, eps, vitc__kern(), stats};
    if (M <= 0 || C <= 0) return;
    /* A row costs ~0.1 us here (768 floats): a region pays only on large
     * inputs (measured: 197 x 768 is faster on one thread). */
    vitc__ops_split(M, M * C, 8 * VITC_OPS_PAR_ELEMS, vitc__layernorm_part, &k);
}

/* GELU is elementwise: chunks of 4096, so that the cut between threads
 * never splits a SIMD vector differently from a serial run. */
#define VITC_GELU_CHUNK 4096

typedef struct vitc__elementwise_ctx {
    float *x;
    int64_t n;
    void (*f)(float *x, int64_t n); /* the kernel table's in-place op */
} vitc__elementwise_ctx;

static void vitc__elementwise_part(void *c, int64_t c0, int64_t c1, int tid) {
    const vitc__elementwise_ctx *k = c;
    int64_t b = c0 * VITC_GELU_CHUNK, e = c1 * VITC_GELU_CHUNK;
    if (e > k->n) e = k->n;
    (void)tid;
    k->f(k->x + b, e - b);
}

/* f over x[n] in chunks, threaded once n is large enough to pay a region. */
static void vitc__elementwise(float *x, int64_t n, void (*f)(float *x, int64_t n)) {
    vitc__elementwise_ctx k = {x, n, f};
    if (n <= 0) return;
    int64_t chunks = (n + VITC_GELU_CHUNK - 1) / VITC_GELU_CHUNK;
    vitc__ops_split(chunks, n, VITC_OPS_PAR_ELEMS, vitc__elementwise_part, &k);
}

void vitc__gelu(float *x, int64_t n) { vitc__elementwise(x, n, vitc__kern()->gelu); }

void vitc__quick_gelu(float *x, int64_t n) { vitc__elementwise(x, n, vitc__kern()->quick_gelu); }

void vitc__tanh_gelu(float *x, int64_t n) { vitc__elementwise(x, n, vitc__kern()->tanh_gelu); }

typedef struct vitc__scale_add_ctx {
    float *y;
    const float *g, *r;
    int64_t ldy, ldr, N;
    void (*f)(float *y, const float *g, const float *r, int64_t n);
} vitc__scale_add_ctx;

static void vitc__scale_add_part(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__scale_add_ctx *k = c;
    (void)tid;
    for (int64_t i = r0; i < r1; i++)
        k->f(k->y + i * k->ldy, k->g, k->r ? k->r + i * k->ldr : NULL, k->N);
}

void vitc__scale_add(float *y, int64_t ldy, const float *g, const float *r, int64_t ldr, int64_t M,
                     int64_t N) {
    vitc__scale_add_ctx k = {y, g, r, ldy, ldr, N, vitc__kern()->scale_add};
    if (M <= 0 || N <= 0) return;
    vitc__ops_split(M, M * N, VITC_OPS_PAR_ELEMS, vitc__scale_add_part, &k);
}

/* ---- GroupNorm: per-channel partial sums, then one affine pass ------- */

/* Channel rows (n, c) of HW floats are the unit of work in both passes, so
 * the pool splits them the same way whatever G is; the per-channel sums are
 * combined in channel order, which keeps results independent of the thread
 * count. Sums are in double, shifted by the group's first element (see
 * vitc__layernorm_avx512). Channel rows are handled VITC_GN_BATCH at a
 * time so that the partial sums live on the stack. */
#define VITC_GN_BATCH 2048

typedef struct {
    float *y;
    const float *x, *w, *b;
    int64_t C, HW, cg, row0;
    double *sq;        /* [rows][2]: sum and sum of squares, shifted */
    const float *stat; /* [B*G][2]: mean and rstd, for the affine pass */
    const vitc__kernels *kt;
} vitc__gn_ctx;

static void vitc__gn_stats(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__gn_ctx *k = c;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t row = k->row0 + r, grp = row / k->cg;
        const float *xr = k->x + row * k->HW;
        double shift = k->x[grp * k->cg * k->HW];
        k->kt->row_stats(xr, k->HW, shift, k->sq + 2 * r);
    }
}

static void vitc__gn_apply(void *c, int64_t r0, int64_t r1, int tid) {
    const vitc__gn_ctx *k = c;
    (void)tid;
    for (int64_t row = r0; row < r1; row++) {
        int64_t grp = row / k->cg, ch = row % k->C;
        float mean = k->stat[2 * grp], rstd = k->stat[2 * grp + 1];
        float sc = rstd * k->w[ch], sh = k->b[ch];
        const float *xr = k->x + row * k->HW;
        k->kt->row_norm(k->y + row * k->HW, xr, k->HW, mean, sc, sh);
    }
}

static int vitc__groupnorm_run(float *y, const float *x, const float *w, const float *b,
                               int64_t B, int64_t C, int64_t HW, int64_t G, float eps,
                               int tokens) {
    if (B <= 0 || C <= 0 || HW <= 0 || G <= 0 || C % G != 0) return 1;
    int64_t cg = C / G, rows = B * C, groups = B * G;
    double sq[2 * VITC_GN_BATCH];
    vitc__gn_ctx k = {y, x, w, b, C, HW, cg, 0, sq, NULL, vitc__kern()};
    int par = rows * HW >= VITC_OPS_PAR_ELEMS;
    /* Sum the channel rows of whole groups, VITC_GN_BATCH rows at a time
     * (a group larger than that is summed over several batches). */
    float *stat = NULL;
    float stat_small[2 * 64];
    if (groups <= 64)
        stat = stat_small;
    else if (!(stat = malloc((size_t)groups * 2 * sizeof(float)))) {
        if (tokens) return 0; /* the caller takes the two-pass way */
        vitc__groupnorm_ref(y, x, w, b, B, C, HW, G, eps); /* no memory: the slow path */
        return 1;
    }
    double gs = 0.0, gq = 0.0;
    for (int64_t r0 = 0; r0 < rows; r0 += VITC_GN_BATCH) {
        int64_t n = rows - r0 < VITC_GN_BATCH ? rows - r0 : VITC_GN_BATCH;
        k.row0 = r0;
        if (par && n > 1)
            vitc__parallel_range(n, vitc__gn_stats, &k);
        else
            vitc__gn_stats(&k, 0, n, 0);
        for (int64_t r = 0; r < n; r++) {
            int64_t row = r0 + r;
            gs += sq[2 * r], gq += sq[2 * r + 1];
            if ((row + 1) % cg == 0) { /* the group's last channel */
                double cnt = (double)(cg * HW), md = gs / cnt, var = gq / cnt - md * md;
                if (var < 0.0) var = 0.0;
                int64_t grp = row / cg;
                stat[2 * grp] = (float)((double)x[grp * cg * HW] + md);
                stat[2 * grp + 1] = (float)(1.0 / sqrt(var + (double)eps));
                gs = gq = 0.0;
            }
        }
    }
    k.stat = stat;
    if (tokens) { /* the normalised [B, C, HW] image is never written */
        const vitc__c2t_norm gn = {stat, w, b, cg};
        vitc__channels_to_tokens_norm(y, x, B, C, HW, &gn, par);
    } else if (par && rows > 1)
        vitc__parallel_range(rows, vitc__gn_apply, &k);
    else
        vitc__gn_apply(&k, 0, rows, 0);
    if (stat != stat_small) free(stat);
    return 1;
}

void vitc__groupnorm(float *y, const float *x, const float *w, const float *b, int64_t B,
                     int64_t C, int64_t HW, int64_t G, float eps) {
    (void)vitc__groupnorm_run(y, x, w, b, B, C, HW, G, eps, 0);
}

int vitc__groupnorm_tokens(float *y, const float *x, const float *w, const float *b, int64_t B,
                           int64_t C, int64_t HW, int64_t G, float eps) {
    return vitc__groupnorm_run(y, x, w, b, B, C, HW, G, eps, 1);
}
