/*
 * ops_layers.c — the small data moves the attention layers need around the
 * kernels of kernels.h: patch extraction for a stride = kernel conv,
 * BatchNorm statistics, a per-channel affine map, and the "back to channels
 * first, then add the input" epilogue. Reference C, clear first.
 */
#include <math.h>

#include "ops_layers.h"
#include "ops_layers_backward.h"

/* ---- patches: gather (forward) and scatter (backward) ------------------ */

typedef struct patch_ctx {
    float *dst;
    const float *src;
    int to_image; /* 0: image -> patch rows (patchify); 1: patch rows -> image */
    int64_t C, H, W, p, nh, nw;
} patch_ctx;

/* One task per row of patches (b, i); the image [B, C, H, W] and the patch
 * rows [B * nh * nw, C * p * p] swap roles between the two directions. */
static void patch_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const patch_ctx *t = ctx;
    int64_t p = t->p, K = t->C * p * p;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / t->nh, i = r % t->nh;
        for (int64_t j = 0; j < t->nw; j++) {
            int64_t row = (r * t->nw + j) * K;
            for (int64_t c = 0; c < t->C; c++)
                for (int64_t ki = 0; ki < p; ki++) {
                    int64_t io = ((b * t->C + c) * t->H + i * p + ki) * t->W + j * p;
                    int64_t co = row + (c * p + ki) * p;
                    float *dst = t->dst + (t->to_image ? io : co);
                    const float *src = t->src + (t->to_image ? co : io);
                    for (int64_t kj = 0; kj < p; kj++) dst[kj] = src[kj];
                }
        }
    }
}

static void patch_move(float *dst, const float *src, int to_image, int64_t B, int64_t C,
                       int64_t H, int64_t W, int64_t p) {
    patch_ctx t = {dst, src, to_image, C, H, W, p, H / p, W / p};
    vitc__parallel_range(B * t.nh, patch_rows, &t);
}

void vitc__patchify(float *cols, const float *x, int64_t B, int64_t C, int64_t H, int64_t W,
                    int64_t p) {
    patch_move(cols, x, 0, B, C, H, W, p);
}

/* The scatter that is patchify's backward (declared in ops_layers_backward.h). */
void vitc__unpatchify(float *dx, const float *dcols, int64_t B, int64_t C, int64_t H, int64_t W,
                      int64_t p) {
    patch_move(dx, dcols, 1, B, C, H, W, p);
}

typedef struct stats_ctx {
    float *mean, *var;
    const float *x;
    int64_t B, C, HW;
} stats_ctx;

static void stats_channels(void *ctx, int64_t c0, int64_t c1, int tid) {
    const stats_ctx *t = ctx;
    double cnt = (double)t->B * (double)t->HW;
    (void)tid;
    for (int64_t c = c0; c < c1; c++) {
        double s = 0.0;
        for (int64_t b = 0; b < t->B; b++) {
            const float *xc = t->x + (b * t->C + c) * t->HW;
            for (int64_t i = 0; i < t->HW; i++) s += xc[i];
        }
        double m = s / cnt, v = 0.0;
        for (int64_t b = 0; b < t->B; b++) {
            const float *xc = t->x + (b * t->C + c) * t->HW;
            for (int64_t i = 0; i < t->HW; i++) {
                double d = xc[i] - m;
                v += d * d;
            }
        }
        t->mean[c] = (float)m;
        t->var[c] = (float)(v / cnt);
    }
}

void vitc__channel_stats(float *mean, float *var, const float *x, int64_t B, int64_t C,
                         int64_t HW) {
    stats_ctx t = {mean, var, x, B, C, HW};
    vitc__parallel_range(C, stats_channels, &t);
}

typedef struct bn_ctx {
    float *y;
    const float *x, *mean, *var, *w, *bias;
    float eps;
    int64_t C, HW;
} bn_ctx;

static void bn_planes(void *ctx, int64_t r0, int64_t r1, int tid) {
    const bn_ctx *t = ctx;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t c = r % t->C;
        /* torch's CPU kernel folds the norm into one multiply-add the same way. */
        float inv = 1.0f / sqrtf(t->var[c] + t->eps);
        float sc = t->w[c] * inv, sh = t->bias[c] - t->mean[c] * sc;
        const float *xc = t->x + r * t->HW;
        float *yc = t->y + r * t->HW;
        for (int64_t i = 0; i < t->HW; i++) yc[i] = xc[i] * sc + sh;
    }
}

void vitc__batchnorm_apply(float *y, const float *x, const float *mean, const float *var,
                           const float *w, const float *bias, float eps, int64_t B, int64_t C,
                           int64_t HW) {
    bn_ctx t = {y, x, mean, var, w, bias, eps, C, HW};
    vitc__parallel_range(B * C, bn_planes, &t);
}

typedef struct tadd_ctx {
    float *out;
    const float *y, *x;
    float alpha;
    int64_t C, N, ct; /* ct: channel tiles per image */
} tadd_ctx;

/* Blocks of 16 channels x 16 tokens go through a transposed copy in L1, so
 * both the reads of y and the writes of out run along contiguous rows (and
 * the second loop vectorises). */
static void tadd_tiles(void *ctx, int64_t r0, int64_t r1, int tid) {
    const tadd_ctx *t = ctx;
    /* Locals, so the compiler knows the stores to out cannot change them. */
    float *out = t->out;
    const float *y = t->y, *x = t->x;
    const float alpha = t->alpha;
    const int64_t C = t->C, N = t->N, ct = t->ct;
    float blk[16][16]; // [channel, token]
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / ct, c0 = (r % ct) * 16, cc = C - c0 < 16 ? C - c0 : 16;
        const float *yb = y + b * N * C + c0;
        for (int64_t n0 = 0; n0 < N; n0 += 16) {
            int64_t nn = N - n0 < 16 ? N - n0 : 16;
            for (int64_t i = 0; i < nn; i++)
                for (int64_t j = 0; j < cc; j++) blk[j][i] = yb[(n0 + i) * C + j];
            for (int64_t j = 0; j < cc; j++) {
                int64_t o = (b * C + c0 + j) * N + n0;
                float *restrict orow = out + o;
                const float *restrict xrow = x + o;
                for (int64_t i = 0; i < nn; i++) orow[i] = alpha * blk[j][i] + xrow[i];
            }
        }
    }
}

void vitc__transpose_add(float *out, const float *y, const float *x, float alpha, int64_t B,
                         int64_t C, int64_t N) {
    tadd_ctx t = {out, y, x, alpha, C, N, (C + 15) / 16};
    vitc__parallel_range(B * t.ct, tadd_tiles, &t);
}

typedef struct c2t_ctx {
    float *y;
    const float *x;
    int64_t C, HW, ct; /* ct: token tiles per image */
    const vitc__c2t_norm *gn;
} c2t_ctx;

/* 16 tokens x 16 channels per block through L1, as the epilogue above. */
static void c2t_tiles(void *ctx, int64_t r0, int64_t r1, int tid) {
    const c2t_ctx *t = ctx;
    float *y = t->y;
    const float *x = t->x;
    const int64_t C = t->C, HW = t->HW, ct = t->ct;
    float blk[16][16]; // [token, channel]
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / ct, i0 = (r % ct) * 16, ii = HW - i0 < 16 ? HW - i0 : 16;
        for (int64_t c0 = 0; c0 < C; c0 += 16) {
            int64_t cc = C - c0 < 16 ? C - c0 : 16;
            for (int64_t j = 0; j < cc; j++) {
                const float *xr = x + (b * C + c0 + j) * HW + i0;
                const vitc__c2t_norm *gn = t->gn;
                if (!gn) {
                    for (int64_t i = 0; i < ii; i++) blk[i][j] = xr[i];
                    continue;
                }
                int64_t grp = (b * C + c0 + j) / gn->cg;
                float mean = gn->stat[2 * grp], sc = gn->stat[2 * grp + 1] * gn->w[c0 + j];
                float sh = gn->b[c0 + j];
                for (int64_t i = 0; i < ii; i++) blk[i][j] = (xr[i] - mean) * sc + sh;
            }
            for (int64_t i = 0; i < ii; i++) {
                float *restrict yr = y + (b * HW + i0 + i) * C + c0;
                for (int64_t j = 0; j < cc; j++) yr[j] = blk[i][j];
            }
        }
    }
}

void vitc__channels_to_tokens_norm(float *y, const float *x, int64_t B, int64_t C, int64_t HW,
                                   const vitc__c2t_norm *gn, int par) {
    c2t_ctx t = {y, x, C, HW, (HW + 15) / 16, gn};
    if (par && B * t.ct > 1)
        vitc__parallel_range(B * t.ct, c2t_tiles, &t);
    else
        c2t_tiles(&t, 0, B * t.ct, 0);
}

void vitc__channels_to_tokens(float *y, const float *x, int64_t B, int64_t C, int64_t HW) {
    vitc__channels_to_tokens_norm(y, x, B, C, HW, NULL, 1);
}
