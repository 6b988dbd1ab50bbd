/*
 * dense.c — the image-shaped layers of dense.h on channels-last maps:
 * 2-D convolution, transposed convolution, bilinear resampling, and their
 * backwards.
 *
 * Each op has a reference (the definition as plain loops, kept as the
 * ground truth the tests compare against) and a fast path (im2col + GEMM,
 * one GEMM + scatter, bilinear vectorised over C). VITC_DENSE=ref, read
 * once, forces the references.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"

/* ---- which path --------------------------------------------------- */

static int dense_forced = -1; /* -1 unread, 0 fast, 1 reference */
static pthread_once_t dense_env_once = PTHREAD_ONCE_INIT;

static void dense_env(void) {
    /* Unknown values mean the default: the environment cannot fail. */
    const char *env = getenv("VITC_DENSE");
    int v = env && strcmp(env, "ref") == 0 ? 1 : 0;
    int expect = -1; /* vitc__nn_dense_force may have been first */
    __atomic_compare_exchange_n(&dense_forced, &expect, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static int dense_ref(void) {
    int v = __atomic_load_n(&dense_forced, __ATOMIC_ACQUIRE);
    if (v < 0) {
        pthread_once(&dense_env_once, dense_env);
        v = __atomic_load_n(&dense_forced, __ATOMIC_ACQUIRE);
    }
    return v == 1;
}

const char *vitc__nn_dense_path(void) { return dense_ref() ? "ref" : "fast"; }

vitc_status vitc__nn_dense_force(const char *name) {
    int v;
    if (!name || !*name || strcmp(name, "auto") == 0 || strcmp(name, "fast") == 0)
        v = 0;
    else if (strcmp(name, "ref") == 0)
        v = 1;
    else
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "unknown dense-layer path \"%s\" (expected ref, fast or auto)", name);
    pthread_once(&dense_env_once, dense_env); /* so that a later first read cannot undo it */
    __atomic_store_n(&dense_forced, v, __ATOMIC_RELEASE);
    return VITC_OK;
}

/* ---- packing ------------------------------------------------------ */

void vitc__nn_conv_pack(float *dst, const float *src, int64_t O, int64_t C, int64_t kh,
                        int64_t kw) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++)
                    dst[((o * kh + i) * kw + j) * C + c] = src[((o * C + c) * kh + i) * kw + j];
}

void vitc__nn_conv_unpack(float *dst, const float *src, int64_t O, int64_t C, int64_t kh,
                          int64_t kw) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++)
                    dst[((o * C + c) * kh + i) * kw + j] = src[((o * kh + i) * kw + j) * C + c];
}

void vitc__nn_convt_pack(float *dst, const float *src, int64_t C, int64_t O, int64_t kh,
                         int64_t kw) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++)
                    dst[((i * kw + j) * O + o) * C + c] = src[((c * O + o) * kh + i) * kw + j];
}

void vitc__nn_convt_unpack(float *dst, const float *src, int64_t C, int64_t O, int64_t kh,
                           int64_t kw) {
    for (int64_t c = 0; c < C; c++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++)
                    dst[((c * O + o) * kh + i) * kw + j] = src[((i * kw + j) * O + o) * C + c];
}

/* ---- argument checks ---------------------------------------------- */

static vitc_status conv_check(const char *who, const float *w, int64_t C, int64_t O, int64_t kh,
                              int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                              int64_t B, int64_t H, int64_t W) {
    if (C <= 0 || O <= 0 || kh <= 0 || kw <= 0 || sh <= 0 || sw <= 0 || ph < 0 || pw < 0)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: C %lld, O %lld, kernel %lld x %lld, stride %lld x %lld, padding "
                         "%lld x %lld: channels, kernel and stride must be positive, padding "
                         "not negative",
                         who, (long long)C, (long long)O, (long long)kh, (long long)kw,
                         (long long)sh, (long long)sw, (long long)ph, (long long)pw);
    if (!w) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL weight; pass the packed weight", who);
    if (B < 0 || H <= 0 || W <= 0)
        return vitc__err(VITC_ERR_SHAPE,
                         "%s: batch %lld of %lld x %lld maps: the batch must not be negative "
                         "and the maps at least 1 x 1",
                         who, (long long)B, (long long)H, (long long)W);
    return VITC_OK;
}

static vitc_status conv_check_full(const vitc__nn_conv *p, const char *who, int64_t B, int64_t H,
                                   int64_t W, int64_t *oh, int64_t *ow) {
    if (!p) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL descriptor", who);
    VITC_TRY(conv_check(who, p->w, p->C, p->O, p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, B, H, W));
    if (H + 2 * p->ph < p->kh || W + 2 * p->pw < p->kw)
        return vitc__err(VITC_ERR_SHAPE,
                         "%s: a %lld x %lld map padded by %lld x %lld is smaller than the %lld x "
                         "%lld kernel, so there is no output; pass a larger map or more padding",
                         who, (long long)H, (long long)W, (long long)p->ph, (long long)p->pw,
                         (long long)p->kh, (long long)p->kw);
    *oh = vitc__nn_conv_out(H, p->kh, p->sh, p->ph);
    *ow = vitc__nn_conv_out(W, p->kw, p->sw, p->pw);
    return VITC_OK;
}

static vitc_status convt_check_full(const vitc__nn_convt *p, const char *who, int64_t B, int64_t H,
                                    int64_t W, int64_t *oh, int64_t *ow) {
    if (!p) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL descriptor", who);
    VITC_TRY(conv_check(who, p->w, p->C, p->O, p->kh, p->kw, p->sh, p->sw, p->ph, p->pw, B, H, W));
    *oh = (H - 1) * p->sh - 2 * p->ph + p->kh;
    *ow = (W - 1) * p->sw - 2 * p->pw + p->kw;
    if (*oh <= 0 || *ow <= 0)
        return vitc__err(VITC_ERR_SHAPE,
                         "%s: a %lld x %lld map with kernel %lld x %lld, stride %lld x %lld and "
                         "padding %lld x %lld gives a %lld x %lld output; use less padding",
                         who, (long long)H, (long long)W, (long long)p->kh, (long long)p->kw,
                         (long long)p->sh, (long long)p->sw, (long long)p->ph, (long long)p->pw,
                         (long long)*oh, (long long)*ow);
    return VITC_OK;
}

static vitc_status scratch_check(const char *who, int64_t need, const float *scratch,
                                 int64_t len) {
    if (need > 0 && (!scratch || len < need))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "%s: scratch of %lld floats, %lld needed; size it with the layer's "
                         "_scratch function",
                         who, scratch ? (long long)len : 0LL, (long long)need);
    return VITC_OK;
}

/* ---- references: the definitions as loops ------------------------- */

static void conv_fwd_ref(const vitc__nn_conv *p, float *y, const float *x, int64_t B, int64_t H,
                         int64_t W, int64_t oh, int64_t ow, int relu_in, const float *res) {
    const int64_t C = p->C, O = p->O;
    for (int64_t b = 0; b < B; b++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                float *yo = y + ((b * oh + oy) * ow + ox) * O; /* [O] */
                for (int64_t o = 0; o < O; o++) {
                    double s = p->b ? p->b[o] : 0.0;
                    for (int64_t i = 0; i < p->kh; i++) {
                        int64_t iy = oy * p->sh - p->ph + i;
                        if (iy < 0 || iy >= H) continue;
                        for (int64_t j = 0; j < p->kw; j++) {
                            int64_t ix = ox * p->sw - p->pw + j;
                            if (ix < 0 || ix >= W) continue;
                            const float *xi = x + ((b * H + iy) * W + ix) * C;        /* [C] */
                            const float *wi = p->w + ((o * p->kh + i) * p->kw + j) * C; /* [C] */
                            for (int64_t c = 0; c < C; c++)
                                s += (double)wi[c] * (relu_in && xi[c] < 0.0f ? 0.0f : xi[c]);
                        }
                    }
                    /* res may be y: element o is read before it is written */
                    yo[o] = (float)(res ? s + res[yo - y + o] : s);
                }
            }
}

static void conv_bwd_ref(const vitc__nn_conv *p, float *dx, float *dw, float *db, const float *dy,
                         const float *x, int64_t B, int64_t H, int64_t W, int64_t oh,
                         int64_t ow) {
    const int64_t C = p->C, O = p->O;
    if (dx) memset(dx, 0, (size_t)(B * H * W * C) * sizeof(float));
    for (int64_t b = 0; b < B; b++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                const float *g = dy + ((b * oh + oy) * ow + ox) * O; /* [O] */
                for (int64_t o = 0; o < O; o++) {
                    if (db) db[o] += g[o];
                    for (int64_t i = 0; i < p->kh; i++) {
                        int64_t iy = oy * p->sh - p->ph + i;
                        if (iy < 0 || iy >= H) continue;
                        for (int64_t j = 0; j < p->kw; j++) {
                            int64_t ix = ox * p->sw - p->pw + j;
                            if (ix < 0 || ix >= W) continue;
                            int64_t xo = ((b * H + iy) * W + ix) * C,
                                    wo = ((o * p->kh + i) * p->kw + j) * C;
                            if (dx)
                                for (int64_t c = 0; c < C; c++) dx[xo + c] += g[o] * p->w[wo + c];
                            if (dw)
                                for (int64_t c = 0; c < C; c++) dw[wo + c] += g[o] * x[xo + c];
                        }
                    }
                }
            }
}

static void convt_fwd_ref(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                          int64_t H, int64_t W, int64_t oh, int64_t ow) {
    const int64_t C = p->C, O = p->O;
    for (int64_t b = 0; b < B; b++)
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                float *yo = y + ((b * oh + oy) * ow + ox) * O; /* [O] */
                for (int64_t o = 0; o < O; o++) {
                    double s = p->b ? p->b[o] : 0.0;
                    /* Input row iy reaches output row iy*sh - ph + i. */
                    for (int64_t i = 0; i < p->kh; i++) {
                        int64_t t = oy + p->ph - i;
                        if (t < 0 || t % p->sh) continue;
                        int64_t iy = t / p->sh;
                        if (iy >= H) continue;
                        for (int64_t j = 0; j < p->kw; j++) {
                            int64_t u = ox + p->pw - j;
                            if (u < 0 || u % p->sw) continue;
                            int64_t ix = u / p->sw;
                            if (ix >= W) continue;
                            const float *xi = x + ((b * H + iy) * W + ix) * C;      /* [C] */
                            const float *wi = p->w + ((i * p->kw + j) * O + o) * C; /* [C] */
                            for (int64_t c = 0; c < C; c++) s += (double)wi[c] * xi[c];
                        }
                    }
                    yo[o] = (float)s;
                }
            }
}

static void convt_bwd_ref(const vitc__nn_convt *p, float *dx, float *dw, float *db,
                          const float *dy, const float *x, int64_t B, int64_t H, int64_t W,
                          int64_t oh, int64_t ow) {
    const int64_t C = p->C, O = p->O;
    if (dx) memset(dx, 0, (size_t)(B * H * W * C) * sizeof(float));
    if (db)
        for (int64_t r = 0; r < B * oh * ow; r++)
            for (int64_t o = 0; o < O; o++) db[o] += dy[r * O + o];
    for (int64_t b = 0; b < B; b++)
        for (int64_t iy = 0; iy < H; iy++)
            for (int64_t ix = 0; ix < W; ix++) {
                int64_t xo = ((b * H + iy) * W + ix) * C;
                for (int64_t i = 0; i < p->kh; i++) {
                    int64_t oy = iy * p->sh - p->ph + i;
                    if (oy < 0 || oy >= oh) continue;
                    for (int64_t j = 0; j < p->kw; j++) {
                        int64_t ox = ix * p->sw - p->pw + j;
                        if (ox < 0 || ox >= ow) continue;
                        const float *g = dy + ((b * oh + oy) * ow + ox) * O; /* [O] */
                        for (int64_t o = 0; o < O; o++) {
                            int64_t wo = ((i * p->kw + j) * O + o) * C;
                            if (dx)
                                for (int64_t c = 0; c < C; c++) dx[xo + c] += g[o] * p->w[wo + c];
                            if (dw)
                                for (int64_t c = 0; c < C; c++) dw[wo + c] += g[o] * x[xo + c];
                        }
                    }
                }
            }
}

/* torch's bilinear source index (area_pixel_compute_scale and
 * compute_indices_weights_linear, in float as for float tensors): output
 * index i reads i0 and i0 + d with weights l0, l1. */
typedef struct bil_ix {
    int64_t i0, d;
    float l0, l1;
} bil_ix;

static void bil_index(bil_ix *t, int64_t in, int64_t out, int ac) {
    float scale;
    if (ac)
        scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    else
        scale = (float)in / (float)out;
    for (int64_t i = 0; i < out; i++) {
        float r;
        if (ac) {
            r = scale * (float)i;
        } else {
            r = scale * ((float)i + 0.5f) - 0.5f;
            if (r < 0.0f) r = 0.0f;
        }
        int64_t i0 = (int64_t)r;
        if (i0 > in - 1) i0 = in - 1;
        float l1 = r - (float)i0;
        if (l1 < 0.0f) l1 = 0.0f;
        if (l1 > 1.0f) l1 = 1.0f;
        t[i].i0 = i0;
        t[i].d = i0 < in - 1 ? 1 : 0;
        t[i].l1 = l1;
        t[i].l0 = 1.0f - l1;
    }
}

static vitc_status bil_check(const char *who, const float *y, const float *x, int64_t B,
                             int64_t C, int64_t ih, int64_t iw, int64_t oh, int64_t ow) {
    if (B < 0 || C <= 0 || ih <= 0 || iw <= 0 || oh <= 0 || ow <= 0)
        return vitc__err(VITC_ERR_SHAPE,
                         "%s: batch %lld, %lld channels, %lld x %lld to %lld x %lld: the batch "
                         "must not be negative, channels and sizes at least 1",
                         who, (long long)B, (long long)C, (long long)ih, (long long)iw,
                         (long long)oh, (long long)ow);
    if (B > 0 && (!x || !y))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL input or output map", who);
    return VITC_OK;
}

static void bil_fwd_ref(float *y, const float *x, int64_t B, int64_t C, int64_t ih, int64_t iw,
                        int64_t oh, int64_t ow, const bil_ix *th, const bil_ix *tw) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t oy = 0; oy < oh; oy++) {
            const bil_ix *h = th + oy;
            const float *r0 = x + (b * ih + h->i0) * iw * C;  /* [iw, C] */
            const float *r1 = r0 + h->d * iw * C;             /* [iw, C] */
            for (int64_t ox = 0; ox < ow; ox++) {
                const bil_ix *w = tw + ox;
                float *yo = y + ((b * oh + oy) * ow + ox) * C; /* [C] */
                int64_t a = w->i0 * C, e = (w->i0 + w->d) * C;
                for (int64_t c = 0; c < C; c++)
                    yo[c] = h->l0 * (w->l0 * r0[a + c] + w->l1 * r0[e + c]) +
                            h->l1 * (w->l0 * r1[a + c] + w->l1 * r1[e + c]);
            }
        }
}

static void bil_bwd_ref(float *dx, const float *dy, int64_t B, int64_t C, int64_t ih, int64_t iw,
                        int64_t oh, int64_t ow, const bil_ix *th, const bil_ix *tw) {
    for (int64_t b = 0; b < B; b++)
        for (int64_t oy = 0; oy < oh; oy++) {
            const bil_ix *h = th + oy;
            float *r0 = dx + (b * ih + h->i0) * iw * C; /* [iw, C] */
            float *r1 = r0 + h->d * iw * C;             /* [iw, C] */
            for (int64_t ox = 0; ox < ow; ox++) {
                const bil_ix *w = tw + ox;
                const float *g = dy + ((b * oh + oy) * ow + ox) * C; /* [C] */
                int64_t a = w->i0 * C, e = (w->i0 + w->d) * C;
                for (int64_t c = 0; c < C; c++) {
                    r0[a + c] += h->l0 * w->l0 * g[c];
                    r0[e + c] += h->l0 * w->l1 * g[c];
                    r1[a + c] += h->l1 * w->l0 * g[c];
                    r1[e + c] += h->l1 * w->l1 * g[c];
                }
            }
        }
}

/* ---- fast paths ---------------------------------------------------- */

/* Floats of one scratch buffer a row block may use: 8 MiB keeps the
 * im2col block and the GEMM's reuse of it in the last-level cache, and a
 * block of ~900 rows of a 3x3x256 kernel is GEMM-shaped enough to run at
 * the GEMM's speed. */
#define DENSE_BLOCK_FLOATS ((int64_t)1 << 21)
/* Channels a task of the col2im passes takes (the convolution's backward,
 * the overlapping transposed convolution): their taps add into shared
 * pixels, so threads split the channels, never the pixels. */
#define DENSE_CCHUNK 32

/* Rows per block for rows of k floats, out of R rows. */
static int64_t dense_block_rows(int64_t k, int64_t R) {
    int64_t rb = DENSE_BLOCK_FLOATS / (k > 0 ? k : 1);
    if (rb < 64) rb = 64;
    return rb < R ? rb : R;
}

static int conv_is_1x1(const vitc__nn_conv *p) {
    return p->kh == 1 && p->kw == 1 && p->sh == 1 && p->sw == 1 && p->ph == 0 && p->pw == 0;
}

static int convt_is_tiling(const vitc__nn_convt *p) {
    return p->kh == p->sh && p->kw == p->sw && p->ph == 0 && p->pw == 0;
}

/* The im2col of rows [r0, r0 + n) of the output grid, tasks over rows. */
typedef struct im2col_ctx {
    const vitc__nn_conv *p;
    float *cols;      /* [n, kh*kw*C] */
    const float *x;   /* [B, H, W, C] */
    int64_t H, W, oh, ow, r0;
} im2col_ctx;

static void im2col_rows(void *vc, int64_t t0, int64_t t1, int tid) {
    const im2col_ctx *k = vc;
    const vitc__nn_conv *p = k->p;
    const int64_t C = p->C, K = p->kh * p->kw * C;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = k->r0 + t, b = r / (k->oh * k->ow), oy = r / k->ow % k->oh, ox = r % k->ow;
        float *row = k->cols + t * K; /* [kh, kw, C] */
        /* a kernel row's taps are consecutive pixels of x: one copy of
         * the span inside the map, zeros either side */
        const int64_t ix0 = ox * p->sw - p->pw, jlo = ix0 < 0 ? -ix0 : 0,
                      jhi = k->W - ix0 < p->kw ? k->W - ix0 : p->kw;
        for (int64_t i = 0; i < p->kh; i++) {
            int64_t iy = oy * p->sh - p->ph + i;
            float *d = row + i * p->kw * C; /* [kw, C] */
            if (iy < 0 || iy >= k->H || jhi <= jlo) {
                memset(d, 0, (size_t)(p->kw * C) * sizeof(float));
                continue;
            }
            if (jlo > 0) memset(d, 0, (size_t)(jlo * C) * sizeof(float));
            memcpy(d + jlo * C, k->x + ((b * k->H + iy) * k->W + ix0 + jlo) * C,
                   (size_t)((jhi - jlo) * C) * sizeof(float));
            if (jhi < p->kw)
                memset(d + jhi * C, 0, (size_t)((p->kw - jhi) * C) * sizeof(float));
        }
    }
}

/* dx += col2im(dcols) for rows [r0, r0 + n), tasks over channel chunks. */
typedef struct col2im_ctx {
    const vitc__nn_conv *p;
    const float *dcols; /* [n, kh*kw*C] */
    float *dx;          /* [B, H, W, C] */
    int64_t H, W, oh, ow, r0, n;
} col2im_ctx;

static void col2im_chunks(void *vc, int64_t t0, int64_t t1, int tid) {
    const col2im_ctx *k = vc;
    const vitc__nn_conv *p = k->p;
    const int64_t C = p->C, K = p->kh * p->kw * C;
    const int64_t c0 = t0 * DENSE_CCHUNK, c1 = t1 * DENSE_CCHUNK < C ? t1 * DENSE_CCHUNK : C;
    (void)tid;
    for (int64_t t = 0; t < k->n; t++) {
        int64_t r = k->r0 + t, b = r / (k->oh * k->ow), oy = r / k->ow % k->oh, ox = r % k->ow;
        const float *row = k->dcols + t * K; /* [kh, kw, C] */
        for (int64_t i = 0; i < p->kh; i++) {
            int64_t iy = oy * p->sh - p->ph + i;
            if (iy < 0 || iy >= k->H) continue;
            for (int64_t j = 0; j < p->kw; j++) {
                int64_t ix = ox * p->sw - p->pw + j;
                if (ix < 0 || ix >= k->W) continue;
                const float *s = row + (i * p->kw + j) * C;           /* [C] */
                float *d = k->dx + ((b * k->H + iy) * k->W + ix) * C; /* [C] */
                for (int64_t c = c0; c < c1; c++) d[c] += s[c];
            }
        }
    }
}

/* In place over n floats, in chunks across the threads. */
typedef struct relu_ctx {
    float *x;
    int64_t n;
} relu_ctx;
#define DENSE_RELU_CHUNK ((int64_t)1 << 16)

static void relu_chunk(void *vc, int64_t t, int tid) {
    const relu_ctx *k = vc;
    int64_t i0 = t * DENSE_RELU_CHUNK, i1 = i0 + DENSE_RELU_CHUNK < k->n ? i0 + DENSE_RELU_CHUNK : k->n;
    (void)tid;
    for (int64_t i = i0; i < i1; i++) k->x[i] = k->x[i] > 0.0f ? k->x[i] : 0.0f;
}

static void conv_fwd_im2col(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                            int64_t H, int64_t W, int64_t oh, int64_t ow, int relu_in,
                            const float *res, float *scratch) {
    const int64_t O = p->O, K = p->kh * p->kw * p->C, R = B * oh * ow;
    if (conv_is_1x1(p)) {
        vitc__linear(y, O, x, p->C, p->w, p->b, res, O, R, O, p->C);
        return;
    }
    const int64_t rb = dense_block_rows(K, R);
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        im2col_ctx k = {p, scratch, x, H, W, oh, ow, r0};
        vitc__parallel_range(n, im2col_rows, &k);
        if (relu_in) { /* the padding's zeros are their own ReLU */
            relu_ctx rc = {scratch, n * K};
            vitc__parallel_for((n * K + DENSE_RELU_CHUNK - 1) / DENSE_RELU_CHUNK, relu_chunk, &rc);
        }
        vitc__linear(y + r0 * O, O, scratch, K, p->w, p->b, res ? res + r0 * O : NULL, O, n, O,
                     K);
    }
}

/* ---- the row-wise forward (vitc__nn_conv_prepare) ------------------ */

/* The Winograd forward's tile: 6x6 inputs, 4x4 outputs, 36 products. */
#define WG_T 6
#define WG_P 36

struct vitc__nn_conv_rows {
    float *w;            /* [kh, O, kw*C]: kernel row i's weight, row-major */
    vitc__pweight *pw;   /* [kh]: the same, in the GEMM's panels */
    int64_t kh;
    /* a 3x3 of stride 1, padding 1 (wg_fits): the Winograd F(4x4, 3x3)
     * weight G g G^T, one [O, C] matrix per point of the 6x6 tile */
    float *wgw;          /* [WG_P, O, C] or NULL */
    vitc__pweight *wg;   /* [WG_P]: the same, in the GEMM's panels */
};

/* Whether a convolution takes the Winograd forward: a 3x3 of stride 1
 * and padding 1 (every 3x3 of the DPT neck and head but the reassemble's
 * stride-2 one), channels in fours (the transforms' vectors), at most
 * WG_MAX_C input channels. F(4x4, 3x3) does 36 products per 16 outputs
 * where the direct form does 144: 4x fewer FLOPs in the GEMMs, for
 * transforms whose sums carry a rounding error that grows with the
 * channels summed: against float64 on random maps, at most 7e-6 of the
 * largest output up to C = 128 (2e-6 in the l2 norm), 1.1e-5 at 256 and
 * 2.2e-5 at 1024, where the direct sum stays near 1e-7. Wider inputs (the
 * DPT reassemble's 192 and 384, at 37x37 and 19x19) keep the row-wise
 * forward and the 1e-5 the dense layers are held to. */
#define WG_MAX_C 128
static int wg_fits(const vitc__nn_conv *p) {
    return p->kh == 3 && p->kw == 3 && p->sh == 1 && p->sw == 1 && p->ph == 1 && p->pw == 1 &&
           p->C % 4 == 0 && p->O % 4 == 0 && p->C <= WG_MAX_C;
}

/* rows->wgw [36, O, C] = G g G^T for each (o, c), g the 3x3 kernel and G
 * F(4x4, 3x3)'s [6, 3] (Lavin and Gray's, points 0, +-1, +-2), in double,
 * packed. */
static vitc_status wg_prepare(vitc__nn_conv *p) {
    static const double G[6][3] = {{1.0 / 4, 0, 0},
                                   {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                   {-1.0 / 6, 1.0 / 6, -1.0 / 6},
                                   {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                   {1.0 / 24, -1.0 / 12, 1.0 / 6},
                                   {0, 0, 1}};
    vitc__nn_conv_rows *r = p->rows;
    const int64_t O = p->O, C = p->C;
    r->wg = calloc(WG_P, sizeof *r->wg);
    r->wgw = r->wg ? vitc__alloc((size_t)(WG_P * O * C) * sizeof(float)) : NULL;
    if (!r->wg || !r->wgw) {
        vitc__nn_conv_unprepare(p);
        return vitc__err(VITC_ERR_NOMEM, "conv2d prepare: out of memory for a %lld x %lld "
                         "Winograd weight", (long long)O, (long long)C);
    }
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < C; c++) {
            double t[6][3]; /* G g */
            for (int a = 0; a < 6; a++)
                for (int j = 0; j < 3; j++) {
                    double v = 0;
                    for (int i = 0; i < 3; i++) v += G[a][i] * p->w[((o * 3 + i) * 3 + j) * C + c];
                    t[a][j] = v;
                }
            for (int a = 0; a < 6; a++)
                for (int e = 0; e < 6; e++) {
                    double v = 0;
                    for (int j = 0; j < 3; j++) v += t[a][j] * G[e][j];
                    r->wgw[((a * 6 + e) * O + o) * C + c] = (float)v;
                }
        }
    for (int k = 0; k < WG_P; k++) {
        vitc_status s = vitc__pweight_pack(&r->wg[k], r->wgw + k * O * C, O, C,
                                           VITC_PRECISION_FP32);
        if (s != VITC_OK) {
            vitc__nn_conv_unprepare(p);
            return s;
        }
    }
    return VITC_OK;
}

void vitc__nn_conv_unprepare(vitc__nn_conv *p) {
    if (!p || !p->rows) return;
    for (int64_t i = 0; i < p->rows->kh; i++) vitc__pweight_free(&p->rows->pw[i]);
    if (p->rows->wg)
        for (int k = 0; k < WG_P; k++) vitc__pweight_free(&p->rows->wg[k]);
    free(p->rows->wg);
    vitc__free(p->rows->wgw);
    vitc__free(p->rows->w);
    free(p->rows->pw);
    free(p->rows);
    p->rows = NULL;
}

vitc_status vitc__nn_conv_prepare(vitc__nn_conv *p) {
    if (!p || !p->w || p->C <= 0 || p->O <= 0 || p->kh <= 0 || p->kw <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "conv2d prepare: NULL or empty convolution");
    vitc__nn_conv_unprepare(p);
    if (conv_is_1x1(p)) return VITC_OK; /* one GEMM already, of x as it is */
    const int64_t O = p->O, kh = p->kh, Kr = p->kw * p->C;
    vitc__nn_conv_rows *r = calloc(1, sizeof *r);
    if (r) r->pw = calloc((size_t)kh, sizeof *r->pw);
    if (r && r->pw) r->w = vitc__alloc((size_t)(kh * O * Kr) * sizeof(float));
    if (!r || !r->pw || !r->w) {
        if (r) free(r->pw);
        free(r);
        return vitc__err(VITC_ERR_NOMEM, "conv2d prepare: out of memory for a %lld x %lld x %lld "
                         "x %lld weight", (long long)O, (long long)kh, (long long)p->kw,
                         (long long)p->C);
    }
    r->kh = kh;
    p->rows = r;
    for (int64_t i = 0; i < kh; i++) {
        float *wi = r->w + i * O * Kr; /* [O, kw*C] */
        for (int64_t o = 0; o < O; o++)
            memcpy(wi + o * Kr, p->w + (o * kh + i) * Kr, (size_t)Kr * sizeof(float));
        vitc_status s = vitc__pweight_pack(&r->pw[i], wi, O, Kr, VITC_PRECISION_FP32);
        if (s != VITC_OK) {
            vitc__nn_conv_unprepare(p);
            return s;
        }
    }
    return wg_fits(p) ? wg_prepare(p) : VITC_OK;
}

/* Whether the row-wise forward runs: prepared, and the built-in GEMM (its
 * kernel the one the panels are for) reads A in place from rows that
 * overlap; OpenBLAS's sgemm wants lda >= K. */
static int conv_rowwise(const vitc__nn_conv *p) {
    const struct vitc__gemm_kernel *kn = vitc__gemm_pack_kernel();
    return p->rows && kn && p->rows->pw[0].kern == kn;
}

/* Floats of the row-wise forward's padded copy of x. */
static int64_t conv_pad_len(const vitc__nn_conv *p, int64_t B, int64_t H, int64_t W) {
    return B * H * (W + 2 * p->pw) * p->C;
}

/* xp [B*H, W + 2 pw, C] = x with pw zero pixels either side of each row,
 * ReLU'd when asked; tasks over rows. */
typedef struct pad_ctx {
    float *xp;
    const float *x;
    int64_t W, C, pw;
    int relu;
} pad_ctx;

/* d[i] = max(s[i], 0), four at a time (-O2 leaves the scalar loop as it
 * is: it was 2.5% of a Depth Anything forward). */
typedef float conv_v4 __attribute__((vector_size(16)));
typedef int conv_v4i __attribute__((vector_size(16)));

static void relu_copy(float *d, const float *s, int64_t n) {
    const conv_v4 zero = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        conv_v4 v;
        memcpy(&v, s + i, sizeof v);
        v = (conv_v4)((conv_v4i)v & (v > zero));
        memcpy(d + i, &v, sizeof v);
    }
    for (; i < n; i++) d[i] = s[i] > 0.0f ? s[i] : 0.0f;
}

static void pad_rows(void *vc, int64_t t0, int64_t t1, int tid) {
    const pad_ctx *k = vc;
    const int64_t C = k->C, Wp = k->W + 2 * k->pw;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        float *d = k->xp + t * Wp * C;         /* [Wp, C] */
        const float *s = k->x + t * k->W * C; /* [W, C] */
        memset(d, 0, (size_t)(k->pw * C) * sizeof(float));
        if (k->relu)
            relu_copy(d + k->pw * C, s, k->W * C);
        else
            memcpy(d + k->pw * C, s, (size_t)(k->W * C) * sizeof(float));
        memset(d + (k->pw + k->W) * C, 0, (size_t)(k->pw * C) * sizeof(float));
    }
}

/* Output row (b, oy): the product of each kernel row i that lands inside
 * the map (the padding rows add nothing), accumulated through the GEMM's
 * residual (y itself after the first), the bias and res with the first. */
typedef struct rows_ctx {
    const vitc__nn_conv *p;
    float *y;          /* [B, oh, ow, O], or NULL: rows in rowbuf */
    float *rowbuf;     /* [threads, ow, O]: each thread's row when y is NULL */
    const float *xp;   /* [B, H, W + 2 pw, C] */
    const float *res;  /* [B, oh, ow, O] or NULL */
    int64_t H, W, oh, ow;
    vitc__nn_row_fn fn; /* or NULL */
    void *fn_ctx;
} rows_ctx;

static void conv_row(void *vc, int64_t t, int tid) {
    const rows_ctx *k = vc;
    const vitc__nn_conv *p = k->p;
    const int64_t O = p->O, C = p->C, Kr = p->kw * C, Wp = k->W + 2 * p->pw;
    const int64_t b = t / k->oh, oy = t % k->oh;
    float *yr = k->y ? k->y + t * k->ow * O : k->rowbuf + tid * k->ow * O; /* [ow, O] */
    const float *rr = k->res ? k->res + t * k->ow * O : NULL; /* [ow, O] */
    int first = 1;
    for (int64_t i = 0; i < p->kh; i++) {
        int64_t iy = oy * p->sh - p->ph + i;
        if (iy < 0 || iy >= k->H) continue;
        const float *a = k->xp + (b * k->H + iy) * Wp * C; /* [ow, kw*C], rows sw*C apart */
        /* cannot fail: the weight is prepacked for these sizes, W given */
        (void)vitc__linear_pw(yr, O, a, p->sw * C, &p->rows->pw[i], p->rows->w + i * O * Kr,
                              first ? p->b : NULL, first ? rr : yr, O, k->ow, O, Kr,
                              VITC__ACT_NONE);
        first = 0;
    }
    if (first) /* every kernel row in the padding */
        for (int64_t j = 0; j < k->ow; j++)
            for (int64_t o = 0; o < O; o++)
                yr[j * O + o] = (p->b ? p->b[o] : 0.0f) + (rr ? rr[j * O + o] : 0.0f);
    if (k->fn) k->fn(k->fn_ctx, b, oy, yr);
}

static void conv_fwd_rows(const vitc__nn_conv *p, float *y, const float *x, int64_t B, int64_t H,
                          int64_t W, int64_t oh, int64_t ow, int relu_in, const float *res,
                          vitc__nn_row_fn fn, void *fn_ctx, float *scratch) {
    pad_ctx pk = {scratch, x, W, p->C, p->pw, relu_in};
    vitc__parallel_range(B * H, pad_rows, &pk);
    rows_ctx k = {p, y, scratch + conv_pad_len(p, B, H, W), scratch, res, H, W, oh, ow, fn,
                  fn_ctx};
    /* rows claimed as threads come free: a row is a few GEMM tiles wide,
     * and a shared machine slows one thread now and then */
    vitc__parallel_for_dynamic(B * oh, 1, conv_row, &k);
}

/* ---- the Winograd forward (wg_fits, prepared) ----------------------- */

/* Tiles per GEMM call: a thread's transformed input and products, 36 x
 * nt x (C + O) floats, stay near half of a 1 MiB L2. */
#define WG_TILE_FLOATS ((int64_t)1 << 17)
/* The 36 matrices of a chunk lie nt x C + WG_SKEW floats apart: at a
 * power-of-two distance the transforms' streams of loads or stores share
 * one set of the 8-way L1 and evict each other. */
#define WG_SKEW 16

/* The GEMM's row tile (12 on AVX-512; AVX2's 6 divides it): a chunk of
 * tiles that is not a multiple of it pays for the rest of its last one. */
#define WG_MR 12

static int64_t wg_chunk(const vitc__nn_conv *p, int64_t ow) {
    int64_t nt = WG_TILE_FLOATS / (WG_P * (p->C + p->O)), ntx = (ow + 3) / 4;
    if (nt < WG_MR) nt = WG_MR;
    if (nt >= ntx) return ntx;
    /* the row's tiles in equal chunks of whole row tiles */
    int64_t nch = (ntx + nt - 1) / nt, per = (ntx + nch - 1) / nch;
    return (per + WG_MR - 1) / WG_MR * WG_MR;
}

/* Floats of each thread's part of the scratch: the chunk's transformed
 * input [36, nt, C] and products [36, nt, O], four output rows [4, ow, O],
 * an edge tile's inputs [6, 6, C]. */
static int64_t wg_thread_len(const vitc__nn_conv *p, int64_t ow) {
    return WG_P * (wg_chunk(p, ow) * (p->C + p->O) + 2 * WG_SKEW) + 4 * ow * p->O +
           WG_P * p->C;
}

static int conv_wg(const vitc__nn_conv *p) {
    return conv_rowwise(p) && p->rows->wg && p->rows->wg[0].kern == p->rows->pw[0].kern;
}

/* Output rows 4 ty .. 4 ty + 3 of image b: each 6x6 input tile d to V =
 * B^T d B, 36 GEMMs M_k [nt, O] = V_k [nt, C] U_k^T, then Y = A^T M A
 * plus the bias and the residual (Lavin and Gray's F(4x4, 3x3)):
 *   B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0;
 *          0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
 *   A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1] */
typedef struct wg_ctx {
    const vitc__nn_conv *p;
    float *y;          /* [B, oh, ow, O], or NULL: rows in the thread's part */
    float *tbuf;       /* [threads, wg_thread_len] */
    const float *x;    /* [B, H, W, C] */
    const float *zrow; /* [W, C] zeros: the padding rows */
    const float *res;  /* [B, oh, ow, O] or NULL */
    int64_t H, W, oh, ow, nty;
    int relu;
    vitc__nn_row_fn fn; /* or NULL */
    void *fn_ctx;
} wg_ctx;

/* The transforms of n tiles, one vector of channels at a time: in, V
 * [36, lv] from the six input rows rp, a tile's first column at px0 + 4 i
 * C (relu: max(x, 0) as it is read); out, rows yr (NULL: past the map) =
 * A^T M A + bias + rr (NULL: none) from M [36, lm], ox0 the first tile's
 * output column. Made for vectors of 4 (SSE), 8 (AVX2) and 16 (AVX-512)
 * floats: at 4 the transforms took as long as the GEMMs. */
#define WG_TRANSFORMS(SUF, VL, ATTR)                                                              \
    typedef float wg_v##SUF __attribute__((vector_size(4 * VL)));                                \
    typedef int wg_i##SUF __attribute__((vector_size(4 * VL)));                                  \
    ATTR static void wg_in_##SUF(float *V, int64_t lv, const float *const *rp, int64_t px0,       \
                                 int64_t n, int64_t C, int relu) {                               \
        const wg_v##SUF z = {0};                                                                  \
        for (int64_t i = 0; i < n; i++) {                                                         \
            const int64_t px = px0 + 4 * i * C;                                                   \
            for (int64_t c = 0; c < C; c += VL) {                                                 \
                wg_v##SUF t[6][6]; /* d B, row by row */                                          \
                for (int r = 0; r < 6; r++) {                                                     \
                    wg_v##SUF d[6];                                                               \
                    for (int e = 0; e < 6; e++) {                                                 \
                        memcpy(&d[e], rp[r] + px + e * C + c, sizeof d[e]);                       \
                        if (relu) d[e] = (wg_v##SUF)((wg_i##SUF)d[e] & (d[e] > z));               \
                    }                                                                             \
                    t[r][0] = 4 * d[0] - 5 * d[2] + d[4];                                         \
                    t[r][1] = d[3] + d[4] - 4 * (d[1] + d[2]);                                    \
                    t[r][2] = d[4] - d[3] + 4 * (d[1] - d[2]);                                    \
                    t[r][3] = d[4] - d[2] + 2 * (d[3] - d[1]);                                    \
                    t[r][4] = d[4] - d[2] - 2 * (d[3] - d[1]);                                    \
                    t[r][5] = 4 * d[1] - 5 * d[3] + d[5];                                         \
                }                                                                                 \
                float *v = V + i * C + c;                                                         \
                for (int e = 0; e < 6; e++) {                                                     \
                    wg_v##SUF w[6];                                                               \
                    w[0] = 4 * t[0][e] - 5 * t[2][e] + t[4][e];                                   \
                    w[1] = t[3][e] + t[4][e] - 4 * (t[1][e] + t[2][e]);                           \
                    w[2] = t[4][e] - t[3][e] + 4 * (t[1][e] - t[2][e]);                           \
                    w[3] = t[4][e] - t[2][e] + 2 * (t[3][e] - t[1][e]);                           \
                    w[4] = t[4][e] - t[2][e] - 2 * (t[3][e] - t[1][e]);                           \
                    w[5] = 4 * t[1][e] - 5 * t[3][e] + t[5][e];                                   \
                    for (int r = 0; r < 6; r++) memcpy(v + (6 * r + e) * lv, &w[r], sizeof w[r]);  \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    ATTR static void wg_out_##SUF(float *const *yr, const float *const *rr, const float *bias,    \
                                  const float *M, int64_t lm, int64_t ox0, int64_t n, int64_t O,  \
                                  int64_t ow) {                                                   \
        for (int64_t i = 0; i < n; i++) {                                                         \
            const int64_t ox = ox0 + 4 * i;                                                       \
            const int64_t nc = ow - ox < 4 ? ow - ox : 4; /* columns inside the map */          \
            for (int64_t o = 0; o < O; o += VL) {                                                 \
                wg_v##SUF s[4][6], bv = {0};                                                      \
                const float *mp = M + i * O + o;                                                  \
                for (int e = 0; e < 6; e++) { /* A^T M, column by column */                       \
                    wg_v##SUF m[6];                                                               \
                    for (int r = 0; r < 6; r++) memcpy(&m[r], mp + (6 * r + e) * lm, sizeof m[r]); \
                    wg_v##SUF a1 = m[1] + m[2], a2 = m[1] - m[2], a3 = m[3] + m[4],               \
                              a4 = m[3] - m[4];                                                   \
                    s[0][e] = m[0] + a1 + a3;                                                     \
                    s[1][e] = a2 + 2 * a4;                                                        \
                    s[2][e] = a1 + 4 * a3;                                                        \
                    s[3][e] = a2 + 8 * a4 + m[5];                                                 \
                }                                                                                 \
                if (bias) memcpy(&bv, bias + o, sizeof bv);                                       \
                for (int a = 0; a < 4; a++) {                                                     \
                    if (!yr[a]) continue;                                                         \
                    const wg_v##SUF *q = s[a];                                                    \
                    wg_v##SUF a1 = q[1] + q[2], a2 = q[1] - q[2], a3 = q[3] + q[4],               \
                              a4 = q[3] - q[4], yv[4];                                            \
                    yv[0] = q[0] + a1 + a3 + bv;                                                  \
                    yv[1] = a2 + 2 * a4 + bv;                                                     \
                    yv[2] = a1 + 4 * a3 + bv;                                                     \
                    yv[3] = a2 + 8 * a4 + q[5] + bv;                                              \
                    for (int64_t e = 0; e < nc; e++) {                                            \
                        if (rr[a]) {                                                              \
                            wg_v##SUF r0;                                                         \
                            memcpy(&r0, rr[a] + (ox + e) * O + o, sizeof r0);                     \
                            yv[e] += r0;                                                          \
                        }                                                                         \
                        memcpy(yr[a] + (ox + e) * O + o, &yv[e], sizeof yv[e]);                   \
                    }                                                                             \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }

WG_TRANSFORMS(4, 4, )
#if defined(__x86_64__) && defined(__GNUC__)
WG_TRANSFORMS(8, 8, __attribute__((target("avx2"))))
WG_TRANSFORMS(16, 16, __attribute__((target("avx512f"))))
/* The widest vector of the library's CPU path (VITC_ARCH, vitc_set_arch)
 * that divides the channels. */
static int wg_width(int64_t c) {
    const vitc__arch a = vitc__get_arch();
    const int w = a == VITC_ARCH_AVX512 ? 16 : a == VITC_ARCH_AVX2 ? 8 : 4;
    return c % 16 == 0 && w >= 16 ? 16 : c % 8 == 0 && w >= 8 ? 8 : 4;
}
#define WG_CALL(w, fn, ...)                                                                       \
    ((w) == 16 ? fn##_16(__VA_ARGS__) : (w) == 8 ? fn##_8(__VA_ARGS__) : fn##_4(__VA_ARGS__))
#else
static int wg_width(int64_t c) { (void)c; return 4; }
#define WG_CALL(w, fn, ...) fn##_4(__VA_ARGS__)
#endif

static void wg_rows(void *vc, int64_t t, int tid) {
    const wg_ctx *k = vc;
    const vitc__nn_conv *p = k->p;
    const int64_t C = p->C, O = p->O, W = k->W, ow = k->ow, ntx = (ow + 3) / 4;
    const int64_t nt = wg_chunk(p, ow), b = t / k->nty, ty = t % k->nty;
    const int64_t lv = nt * C + WG_SKEW, lm = nt * O + WG_SKEW;
    float *V = k->tbuf + tid * wg_thread_len(p, ow); /* [36, lv]: [nt, C] each */
    float *M = V + WG_P * lv;                         /* [36, lm]: [nt, O] each */
    float *rb = M + WG_P * lm;                        /* [4, ow, O] */
    float *et = rb + 4 * ow * O;                      /* [6, 6, C] an edge tile */
    const float *rp[WG_T]; /* input rows 4 ty - 1 .. 4 ty + 4, [W, C] */
    for (int i = 0; i < WG_T; i++) {
        int64_t iy = 4 * ty - 1 + i;
        rp[i] = iy >= 0 && iy < k->H ? k->x + (b * k->H + iy) * W * C : k->zrow;
    }
    float *yr[4]; /* [ow, O], NULL past the last row */
    const float *rr[4];
    for (int a = 0; a < 4; a++) {
        int64_t oy = 4 * ty + a;
        yr[a] = oy >= k->oh ? NULL : k->y ? k->y + (b * k->oh + oy) * ow * O : rb + a * ow * O;
        rr[a] = oy < k->oh && k->res ? k->res + (b * k->oh + oy) * ow * O : NULL;
    }
    const int wi = wg_width(C), wo = wg_width(O);
    /* tiles whose six columns 4 tx - 1 .. 4 tx + 4 lie inside the map */
    const int64_t in0 = 1, in1 = (W - 5) / 4 + 1 > in0 ? (W - 5) / 4 + 1 : in0;
    for (int64_t tx0 = 0; tx0 < ntx; tx0 += nt) {
        const int64_t n = ntx - tx0 < nt ? ntx - tx0 : nt;
        int64_t i = 0;
        while (i < n) {
            const int64_t tx = tx0 + i;
            if (tx >= in0 && tx < in1) { /* a run of inner tiles, read in place */
                int64_t m = (in1 < tx0 + n ? in1 : tx0 + n) - tx;
                WG_CALL(wi, wg_in, V + i * C, lv, rp, (4 * tx - 1) * C, m, C, k->relu);
                i += m;
                continue;
            }
            /* an edge tile: its columns copied, zeros outside the map */
            const float *ep[WG_T];
            for (int r = 0; r < WG_T; r++) {
                float *d = et + r * WG_T * C;
                for (int e = 0; e < WG_T; e++) {
                    int64_t ix = 4 * tx - 1 + e;
                    if (ix >= 0 && ix < W)
                        memcpy(d + e * C, rp[r] + ix * C, (size_t)C * sizeof(float));
                    else
                        memset(d + e * C, 0, (size_t)C * sizeof(float));
                }
                ep[r] = d;
            }
            WG_CALL(wi, wg_in, V + i * C, lv, ep, 0, 1, C, k->relu);
            i++;
        }
        for (int q = 0; q < WG_P; q++) /* cannot fail: the weight is prepacked for these sizes */
            (void)vitc__linear_pw(M + q * lm, O, V + q * lv, C, &p->rows->wg[q],
                                  p->rows->wgw + q * O * C, NULL, NULL, O, n, O, C,
                                  VITC__ACT_NONE);
        WG_CALL(wo, wg_out, yr, rr, p->b, M, lm, 4 * tx0, n, O, ow);
    }
    if (k->fn)
        for (int a = 0; a < 4; a++)
            if (yr[a]) k->fn(k->fn_ctx, b, 4 * ty + a, yr[a]);
}

static void conv_fwd_wg(const vitc__nn_conv *p, float *y, const float *x, int64_t B, int64_t H,
                        int64_t W, int64_t oh, int64_t ow, int relu_in, const float *res,
                        vitc__nn_row_fn fn, void *fn_ctx, float *scratch) {
    float *zrow = scratch; /* [W, C] */
    memset(zrow, 0, (size_t)(W * p->C) * sizeof(float));
    const int64_t nty = (oh + 3) / 4;
    wg_ctx k = {p, y, zrow + W * p->C, x, zrow, res, H, W, oh, ow, nty, relu_in, fn, fn_ctx};
    vitc__parallel_for_dynamic(B * nty, 1, wg_rows, &k);
}

/* The rows' fn after a forward that had none. */
typedef struct rowfn_ctx {
    const float *y; /* [B, oh, ow, O] */
    int64_t oh, ow, O;
    vitc__nn_row_fn fn;
    void *fn_ctx;
} rowfn_ctx;

static void rowfn_task(void *vc, int64_t t, int tid) {
    const rowfn_ctx *k = vc;
    (void)tid;
    k->fn(k->fn_ctx, t / k->oh, t % k->oh, k->y + t * k->ow * k->O);
}

/* Whether the row-wise forward takes fn itself (1), else the caller runs it. */
static int conv_fwd_fast(const vitc__nn_conv *p, float *y, const float *x, int64_t B, int64_t H,
                         int64_t W, int64_t oh, int64_t ow, int relu_in, const float *res,
                         vitc__nn_row_fn fn, void *fn_ctx, float *scratch) {
    if (!conv_is_1x1(p) && conv_wg(p)) {
        conv_fwd_wg(p, y, x, B, H, W, oh, ow, relu_in, res, fn, fn_ctx, scratch);
        return 1;
    }
    if (!conv_is_1x1(p) && conv_rowwise(p)) {
        conv_fwd_rows(p, y, x, B, H, W, oh, ow, relu_in, res, fn, fn_ctx, scratch);
        return 1;
    }
    conv_fwd_im2col(p, y, x, B, H, W, oh, ow, relu_in, res, scratch);
    return 0;
}

static void conv_bwd_fast(const vitc__nn_conv *p, float *dx, float *dw, float *db, const float *dy,
                          const float *x, int64_t B, int64_t H, int64_t W, int64_t oh, int64_t ow,
                          float *scratch) {
    const int64_t C = p->C, O = p->O, K = p->kh * p->kw * C, R = B * oh * ow;
    if (conv_is_1x1(p)) {
        vitc__linear_backward(dx, C, 0.0f, dw, db, dy, O, x, C, p->w, R, O, C);
        return;
    }
    const int64_t rb = dense_block_rows(K, R);
    float *cols = scratch, *dcols = scratch + rb * K; /* [rb, K], [rb, K] */
    if (dx) memset(dx, 0, (size_t)(B * H * W * C) * sizeof(float));
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        const float *g = dy + r0 * O; /* [n, O] */
        if (dw) {
            im2col_ctx k = {p, cols, x, H, W, oh, ow, r0};
            vitc__parallel_range(n, im2col_rows, &k);
        }
        vitc__linear_backward(dx ? dcols : NULL, K, 0.0f, dw, db, g, O, cols, K, p->w, n, O, K);
        if (dx) {
            col2im_ctx k = {p, dcols, dx, H, W, oh, ow, r0, n};
            vitc__parallel_range((C + DENSE_CCHUNK - 1) / DENSE_CCHUNK, col2im_chunks, &k);
        }
    }
}

/* The tiling transposed convolution (k == s, p == 0): input pixel (iy, ix)
 * alone writes the kh x kw tile at (iy kh, ix kw), so y is the GEMM
 * z [rows, kh*kw*O] = x W^T (W [kh*kw*O, C], the packed weight as it is)
 * scattered without overlap. */
typedef struct tile_ctx {
    const vitc__nn_convt *p;
    float *z;        /* [n, kh*kw*O] */
    float *y;        /* [B, oh, ow, O] (forward) or const dy (backward) */
    int64_t H, W, r0;
    int gather;      /* 1: z = tiles of y (backward) */
} tile_ctx;

static void tile_rows(void *vc, int64_t t0, int64_t t1, int tid) {
    const tile_ctx *k = vc;
    const vitc__nn_convt *p = k->p;
    const int64_t O = p->O, N = p->kh * p->kw * O, oh = k->H * p->kh, ow = k->W * p->kw;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = k->r0 + t, b = r / (k->H * k->W), iy = r / k->W % k->H, ix = r % k->W;
        float *zr = k->z + t * N; /* [kh, kw, O] */
        for (int64_t i = 0; i < p->kh; i++) {
            float *yr = k->y + ((b * oh + iy * p->kh + i) * ow + ix * p->kw) * O; /* [kw, O] */
            float *zi = zr + i * p->kw * O;                                       /* [kw, O] */
            if (k->gather) {
                memcpy(zi, yr, (size_t)(p->kw * O) * sizeof(float));
            } else if (!p->b) {
                memcpy(yr, zi, (size_t)(p->kw * O) * sizeof(float));
            } else {
                for (int64_t j = 0; j < p->kw; j++)
                    for (int64_t o = 0; o < O; o++) yr[j * O + o] = zi[j * O + o] + p->b[o];
            }
        }
    }
}

static void convt_fwd_fast(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                           int64_t H, int64_t W, float *scratch) {
    const int64_t N = p->kh * p->kw * p->O, R = B * H * W, rb = dense_block_rows(N, R);
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        vitc__linear(scratch, N, x + r0 * p->C, p->C, p->w, NULL, NULL, 0, n, N, p->C);
        tile_ctx k = {p, scratch, y, H, W, r0, 0};
        vitc__parallel_range(n, tile_rows, &k);
    }
}

static void convt_bwd_fast(const vitc__nn_convt *p, float *dx, float *dw, float *db,
                           const float *dy, const float *x, int64_t B, int64_t H, int64_t W,
                           float *scratch) {
    const int64_t C = p->C, O = p->O, N = p->kh * p->kw * O, R = B * H * W,
                  rb = dense_block_rows(N, R);
    if (db) vitc__colsum(db, dy, O, R * p->kh * p->kw, O);
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        tile_ctx k = {p, scratch, (float *)(uintptr_t)dy, H, W, r0, 1};
        vitc__parallel_range(n, tile_rows, &k);
        vitc__linear_backward(dx ? dx + r0 * C : NULL, C, 0.0f, dw, NULL, scratch, N,
                              x ? x + r0 * C : NULL, C, p->w, n, N, C);
    }
}

/* Any other transposed convolution: the same GEMM, then a col2im that
 * adds each row's kh x kw taps into y (tiles overlap when k > s: threads
 * split the channels); the backward gathers dy's taps into z's layout
 * (zeros outside the map: what padding removed) for the Linear backward. */
typedef struct tgen_ctx {
    const vitc__nn_convt *p;
    float *z;        /* [n, kh*kw*O] */
    float *y;        /* [B, oh, ow, O]: forward's y, or the backward's dy */
    int64_t H, W, oh, ow, r0, n;
} tgen_ctx;

static void tgen_scatter(void *vc, int64_t t0, int64_t t1, int tid) {
    const tgen_ctx *k = vc;
    const vitc__nn_convt *p = k->p;
    const int64_t O = p->O, N = p->kh * p->kw * O;
    const int64_t c0 = t0 * DENSE_CCHUNK, c1 = t1 * DENSE_CCHUNK < O ? t1 * DENSE_CCHUNK : O;
    (void)tid;
    for (int64_t t = 0; t < k->n; t++) {
        int64_t r = k->r0 + t, b = r / (k->H * k->W), iy = r / k->W % k->H, ix = r % k->W;
        const float *zr = k->z + t * N; /* [kh, kw, O] */
        for (int64_t i = 0; i < p->kh; i++) {
            int64_t oy = iy * p->sh - p->ph + i;
            if (oy < 0 || oy >= k->oh) continue;
            for (int64_t j = 0; j < p->kw; j++) {
                int64_t ox = ix * p->sw - p->pw + j;
                if (ox < 0 || ox >= k->ow) continue;
                const float *zs = zr + (i * p->kw + j) * O;              /* [O] */
                float *d = k->y + ((b * k->oh + oy) * k->ow + ox) * O; /* [O] */
                for (int64_t c = c0; c < c1; c++) d[c] += zs[c];
            }
        }
    }
}

static void tgen_gather(void *vc, int64_t t0, int64_t t1, int tid) {
    const tgen_ctx *k = vc;
    const vitc__nn_convt *p = k->p;
    const int64_t O = p->O, N = p->kh * p->kw * O;
    (void)tid;
    for (int64_t t = t0; t < t1; t++) {
        int64_t r = k->r0 + t, b = r / (k->H * k->W), iy = r / k->W % k->H, ix = r % k->W;
        float *zr = k->z + t * N; /* [kh, kw, O] */
        for (int64_t i = 0; i < p->kh; i++) {
            int64_t oy = iy * p->sh - p->ph + i;
            for (int64_t j = 0; j < p->kw; j++) {
                int64_t ox = ix * p->sw - p->pw + j;
                float *d = zr + (i * p->kw + j) * O; /* [O] */
                if (oy < 0 || oy >= k->oh || ox < 0 || ox >= k->ow)
                    memset(d, 0, (size_t)O * sizeof(float));
                else
                    memcpy(d, k->y + ((b * k->oh + oy) * k->ow + ox) * O,
                           (size_t)O * sizeof(float));
            }
        }
    }
}

static void convt_fwd_general(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                              int64_t H, int64_t W, int64_t oh, int64_t ow, float *scratch) {
    const int64_t O = p->O, N = p->kh * p->kw * O, R = B * H * W, rb = dense_block_rows(N, R);
    for (int64_t r = 0; r < B * oh * ow; r++) {
        if (p->b)
            memcpy(y + r * O, p->b, (size_t)O * sizeof(float));
        else
            memset(y + r * O, 0, (size_t)O * sizeof(float));
    }
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        vitc__linear(scratch, N, x + r0 * p->C, p->C, p->w, NULL, NULL, 0, n, N, p->C);
        tgen_ctx k = {p, scratch, y, H, W, oh, ow, r0, n};
        vitc__parallel_range((O + DENSE_CCHUNK - 1) / DENSE_CCHUNK, tgen_scatter, &k);
    }
}

static void convt_bwd_general(const vitc__nn_convt *p, float *dx, float *dw, float *db,
                              const float *dy, const float *x, int64_t B, int64_t H, int64_t W,
                              int64_t oh, int64_t ow, float *scratch) {
    const int64_t C = p->C, O = p->O, N = p->kh * p->kw * O, R = B * H * W,
                  rb = dense_block_rows(N, R);
    if (db) vitc__colsum(db, dy, O, B * oh * ow, O);
    for (int64_t r0 = 0; r0 < R; r0 += rb) {
        int64_t n = R - r0 < rb ? R - r0 : rb;
        tgen_ctx k = {p, scratch, (float *)(uintptr_t)dy, H, W, oh, ow, r0, n};
        vitc__parallel_range(n, tgen_gather, &k);
        vitc__linear_backward(dx ? dx + r0 * C : NULL, C, 0.0f, dw, NULL, scratch, N,
                              x ? x + r0 * C : NULL, C, p->w, n, N, C);
    }
}

/* Bilinear, threaded over output rows (forward) or input rows (backward,
 * below), the channel loop in 4-wide vectors (the baseline SIMD width of
 * every target; the pass is bound by memory, not arithmetic): the
 * reference's operations in its order, so the same numbers. */
typedef float dense_v4 __attribute__((vector_size(16)));

static inline dense_v4 v4_load(const float *p) {
    dense_v4 v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void v4_store(float *p, dense_v4 v) { memcpy(p, &v, sizeof v); }

typedef struct bil_ctx {
    float *y;        /* forward: y; backward: dx */
    const float *x;  /* forward: x; backward: dy */
    int64_t B, C, ih, iw, oh, ow;
    const bil_ix *th, *tw;
} bil_ctx;

static void bil_fwd_row(void *vc, int64_t t, int tid) {
    const bil_ctx *k = vc;
    const int64_t C = k->C, b = t / k->oh, oy = t % k->oh;
    const bil_ix *h = k->th + oy;
    const float *r0 = k->x + (b * k->ih + h->i0) * k->iw * C; /* [iw, C] */
    const float *r1 = r0 + h->d * k->iw * C;                  /* [iw, C] */
    (void)tid;
    for (int64_t ox = 0; ox < k->ow; ox++) {
        const bil_ix *w = k->tw + ox;
        float *yo = k->y + (t * k->ow + ox) * C; /* [C] */
        const int64_t a = w->i0 * C, e = (w->i0 + w->d) * C;
        int64_t c = 0;
        if (C >= 4) {
            const dense_v4 hl0 = {h->l0, h->l0, h->l0, h->l0}, hl1 = {h->l1, h->l1, h->l1, h->l1};
            const dense_v4 wl0 = {w->l0, w->l0, w->l0, w->l0}, wl1 = {w->l1, w->l1, w->l1, w->l1};
            for (; c + 4 <= C; c += 4)
                v4_store(yo + c, hl0 * (wl0 * v4_load(r0 + a + c) + wl1 * v4_load(r0 + e + c)) +
                                     hl1 * (wl0 * v4_load(r1 + a + c) + wl1 * v4_load(r1 + e + c)));
        }
        for (; c < C; c++)
            yo[c] = h->l0 * (w->l0 * r0[a + c] + w->l1 * r0[e + c]) +
                    h->l1 * (w->l0 * r1[a + c] + w->l1 * r1[e + c]);
    }
}

/* dx row r += weight * (the adjoint of the width pass of dy row g) for
 * every output column, in the reference's order. */
static inline void bil_bwd_row(float *r, const float *g, const bil_ix *tw, int64_t ow, int64_t C,
                               float hl) {
    for (int64_t ox = 0; ox < ow; ox++, g += C) {
        const bil_ix *w = tw + ox;
        float *ra = r + w->i0 * C, *re = r + (w->i0 + w->d) * C; /* [C], [C] */
        const float w0 = hl * w->l0, w1 = hl * w->l1;
        int64_t c = 0;
        if (C >= 4) {
            const dense_v4 v0 = {w0, w0, w0, w0}, v1 = {w1, w1, w1, w1};
            for (; c + 4 <= C; c += 4) {
                v4_store(ra + c, v4_load(ra + c) + v0 * v4_load(g + c));
                v4_store(re + c, v4_load(re + c) + v1 * v4_load(g + c));
            }
        }
        for (; c < C; c++) {
            ra[c] += w0 * g[c];
            re[c] += w1 * g[c];
        }
    }
}

/* The backward splits by input row: the output rows that read input row
 * g first (i0 == g) are a contiguous run [first[g], first[g + 1]), and
 * each writes rows g and g + d. Phase 0 adds every run's share into its
 * lower row g + 1, phase 1 into its own row g: distinct rows within a
 * phase, and each element still gets its terms in ascending output order,
 * so the result is the reference's bits. */
typedef struct bil_bwd_ctx {
    float *dx;       /* [B, ih, iw, C] */
    const float *dy; /* [B, oh, ow, C] */
    int64_t C, ih, iw, oh, ow;
    const bil_ix *th, *tw;
    const int64_t *first; /* [ih + 1] */
    int phase;
} bil_bwd_ctx;

static void bil_bwd_run(void *vc, int64_t t, int tid) {
    const bil_bwd_ctx *k = vc;
    const int64_t C = k->C, b = t / k->ih, g = t % k->ih, rowlen = k->iw * C;
    (void)tid;
    float *r0 = k->dx + (b * k->ih + g) * rowlen; /* [iw, C] */
    for (int64_t oy = k->first[g]; oy < k->first[g + 1]; oy++) {
        const bil_ix *h = k->th + oy;
        const float *gy = k->dy + (b * k->oh + oy) * k->ow * C; /* [ow, C] */
        if (h->d == 0) { /* both weights on row g: the reference's order, in phase 1 */
            if (k->phase == 1) {
                for (int64_t ox = 0; ox < k->ow; ox++) {
                    const bil_ix *w = k->tw + ox;
                    const float *gg = gy + ox * C;
                    float *ra = r0 + w->i0 * C, *re = r0 + (w->i0 + w->d) * C;
                    for (int64_t c = 0; c < C; c++) {
                        ra[c] += h->l0 * w->l0 * gg[c];
                        re[c] += h->l0 * w->l1 * gg[c];
                        ra[c] += h->l1 * w->l0 * gg[c];
                        re[c] += h->l1 * w->l1 * gg[c];
                    }
                }
            }
        } else if (k->phase == 0) {
            bil_bwd_row(r0 + rowlen, gy, k->tw, k->ow, C, h->l1);
        } else {
            bil_bwd_row(r0, gy, k->tw, k->ow, C, h->l0);
        }
    }
}

/* ---- public entry points ------------------------------------------ */

int64_t vitc__nn_conv_scratch(const vitc__nn_conv *p, int64_t B, int64_t H, int64_t W) {
    if (!p || conv_is_1x1(p) || p->kh <= 0 || p->kw <= 0 || p->sh <= 0 || p->sw <= 0 || B <= 0)
        return 0;
    const int64_t oh = vitc__nn_conv_out(H, p->kh, p->sh, p->ph),
                  ow = vitc__nn_conv_out(W, p->kw, p->sw, p->pw), K = p->kh * p->kw * p->C;
    if (oh <= 0 || ow <= 0 || K <= 0) return 0;
    /* the backward's im2col block and its gradient; the im2col forward
     * uses the first, the row-wise one a padded copy of x and a row per
     * thread (forward_rows without y) */
    int64_t n = 2 * dense_block_rows(K, B * oh * ow) * K,
            fwd = conv_pad_len(p, B, H, W) + (int64_t)vitc__num_threads() * ow * p->O;
    if (p->rows && p->rows->wg) { /* the Winograd forward: a zero row, each thread's tiles */
        int64_t wg = W * p->C + (int64_t)vitc__num_threads() * wg_thread_len(p, ow);
        fwd = wg > fwd ? wg : fwd;
    }
    return p->rows && fwd > n ? fwd : n;
}

static vitc_status conv_forward_any(const vitc__nn_conv *p, float *y, const float *x,
                                    int64_t B, int64_t H, int64_t W, int relu_in,
                                    const float *res, vitc__nn_row_fn fn, void *fn_ctx,
                                    float *scratch, int64_t scratch_len) {
    static const char who[] = "conv2d forward";
    int64_t oh, ow;
    VITC_TRY(conv_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_conv_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!x || (!y && !fn)))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL x or y", who);
    if (relu_in && conv_is_1x1(p))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: a ReLU'd input needs a kernel larger than "
                         "1x1 (apply the ReLU to x first)", who);
    if (B == 0) return VITC_OK;
    int rowwise = !dense_ref() && !conv_is_1x1(p) && conv_rowwise(p);
    float *tmp = NULL; /* [B, oh, ow, O]: y for fn on a path that needs the whole map */
    if (!y && !rowwise) {
        size_t n;
        if (!vitc__mul_size((size_t)(B * oh), (size_t)(ow * p->O), &n) ||
            !vitc__mul_size(n, sizeof(float), &n) || !(tmp = vitc__alloc(n)))
            return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for a %lld x %lld x %lld map",
                             who, (long long)(B * oh), (long long)ow, (long long)p->O);
        y = tmp;
    }
    int done = 0;
    if (dense_ref())
        conv_fwd_ref(p, y, x, B, H, W, oh, ow, relu_in, res);
    else
        done = conv_fwd_fast(p, y, x, B, H, W, oh, ow, relu_in, res, fn, fn_ctx, scratch);
    if (fn && !done) {
        rowfn_ctx k = {y, oh, ow, p->O, fn, fn_ctx};
        vitc__parallel_for(B * oh, rowfn_task, &k);
    }
    vitc__free(tmp);
    return VITC_OK;
}

vitc_status vitc__nn_conv_forward_ex(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                                     int64_t H, int64_t W, int relu_in, const float *res,
                                     float *scratch, int64_t scratch_len) {
    return conv_forward_any(p, y, x, B, H, W, relu_in, res, NULL, NULL, scratch, scratch_len);
}

vitc_status vitc__nn_conv_forward_rows(const vitc__nn_conv *p, float *y, const float *x,
                                       int64_t B, int64_t H, int64_t W, int relu_in,
                                       vitc__nn_row_fn fn, void *ctx, float *scratch,
                                       int64_t scratch_len) {
    return conv_forward_any(p, y, x, B, H, W, relu_in, NULL, fn, ctx, scratch, scratch_len);
}

vitc_status vitc__nn_conv_forward(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                                  int64_t H, int64_t W, float *scratch, int64_t scratch_len) {
    return vitc__nn_conv_forward_ex(p, y, x, B, H, W, 0, NULL, scratch, scratch_len);
}

vitc_status vitc__nn_conv_backward(const vitc__nn_conv *p, float *dx, float *dw, float *db,
                                   const float *dy, const float *x, int64_t B, int64_t H,
                                   int64_t W, float *scratch, int64_t scratch_len) {
    static const char who[] = "conv2d backward";
    int64_t oh, ow;
    VITC_TRY(conv_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_conv_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!dy || (dw && !x)))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL dy, or NULL x with dw wanted", who);
    if (B == 0) return VITC_OK;
    if (dense_ref())
        conv_bwd_ref(p, dx, dw, db, dy, x, B, H, W, oh, ow);
    else
        conv_bwd_fast(p, dx, dw, db, dy, x, B, H, W, oh, ow, scratch);
    return VITC_OK;
}

int64_t vitc__nn_convt_scratch(const vitc__nn_convt *p, int64_t B, int64_t H, int64_t W) {
    if (!p || B <= 0 || H <= 0 || W <= 0 || p->O <= 0 || p->kh <= 0 || p->kw <= 0)
        return 0;
    const int64_t N = p->kh * p->kw * p->O;
    return dense_block_rows(N, B * H * W) * N;
}

vitc_status vitc__nn_convt_forward(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                                   int64_t H, int64_t W, float *scratch, int64_t scratch_len) {
    static const char who[] = "conv-transpose2d forward";
    int64_t oh, ow;
    VITC_TRY(convt_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_convt_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!x || !y)) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL x or y", who);
    if (B == 0) return VITC_OK;
    if (dense_ref())
        convt_fwd_ref(p, y, x, B, H, W, oh, ow);
    else if (convt_is_tiling(p))
        convt_fwd_fast(p, y, x, B, H, W, scratch);
    else
        convt_fwd_general(p, y, x, B, H, W, oh, ow, scratch);
    return VITC_OK;
}

vitc_status vitc__nn_convt_backward(const vitc__nn_convt *p, float *dx, float *dw, float *db,
                                    const float *dy, const float *x, int64_t B, int64_t H,
                                    int64_t W, float *scratch, int64_t scratch_len) {
    static const char who[] = "conv-transpose2d backward";
    int64_t oh, ow;
    VITC_TRY(convt_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_convt_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!dy || (dw && !x)))
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL dy, or NULL x with dw wanted", who);
    if (B == 0) return VITC_OK;
    if (dense_ref())
        convt_bwd_ref(p, dx, dw, db, dy, x, B, H, W, oh, ow);
    else if (convt_is_tiling(p))
        convt_bwd_fast(p, dx, dw, db, dy, x, B, H, W, scratch);
    else
        convt_bwd_general(p, dx, dw, db, dy, x, B, H, W, oh, ow, scratch);
    return VITC_OK;
}

static vitc_status bil_tables(bil_ix **th, bil_ix **tw, int64_t ih, int64_t iw, int64_t oh,
                              int64_t ow, int ac, const char *who) {
    *th = malloc((size_t)(oh + ow) * sizeof(bil_ix));
    if (!*th)
        return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for the %lld + %lld index tables",
                         who, (long long)oh, (long long)ow);
    *tw = *th + oh;
    bil_index(*th, ih, oh, ac);
    bil_index(*tw, iw, ow, ac);
    return VITC_OK;
}

vitc_status vitc__nn_bilinear(float *y, const float *x, int64_t B, int64_t C, int64_t ih,
                              int64_t iw, int64_t oh, int64_t ow, int ac) {
    static const char who[] = "bilinear";
    VITC_TRY(bil_check(who, y, x, B, C, ih, iw, oh, ow));
    bil_ix *th, *tw;
    VITC_TRY(bil_tables(&th, &tw, ih, iw, oh, ow, ac, who));
    if (dense_ref()) {
        bil_fwd_ref(y, x, B, C, ih, iw, oh, ow, th, tw);
    } else {
        bil_ctx k = {y, x, B, C, ih, iw, oh, ow, th, tw};
        vitc__parallel_for(B * oh, bil_fwd_row, &k);
    }
    free(th);
    return VITC_OK;
}

vitc_status vitc__nn_bilinear_backward(float *dx, const float *dy, int64_t B, int64_t C,
                                       int64_t ih, int64_t iw, int64_t oh, int64_t ow, int ac) {
    static const char who[] = "bilinear backward";
    VITC_TRY(bil_check(who, dy, dx, B, C, ih, iw, oh, ow));
    bil_ix *th, *tw;
    VITC_TRY(bil_tables(&th, &tw, ih, iw, oh, ow, ac, who));
    if (dense_ref()) {
        bil_bwd_ref(dx, dy, B, C, ih, iw, oh, ow, th, tw);
    } else {
        int64_t *first = malloc((size_t)(ih + 1) * sizeof(int64_t));
        if (!first) {
            free(th);
            return vitc__err(VITC_ERR_NOMEM, "%s: out of memory for %lld row starts", who,
                             (long long)ih + 1);
        }
        for (int64_t g = 0, oy = 0; g <= ih; g++) {
            while (oy < oh && th[oy].i0 < g) oy++;
            first[g] = oy;
        }
        bil_bwd_ctx k = {dx, dy, C, ih, iw, oh, ow, th, tw, first, 0};
        vitc__parallel_for(B * ih, bil_bwd_run, &k);
        k.phase = 1;
        vitc__parallel_for(B * ih, bil_bwd_run, &k);
        free(first);
    }
    free(th);
    return VITC_OK;
}
