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
                         int64_t W, int64_t oh, int64_t ow) {
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
                            for (int64_t c = 0; c < C; c++) s += (double)wi[c] * xi[c];
                        }
                    }
                    yo[o] = (float)s;
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
                            int64_t xo = ((b * H + iy) * W + ix) * C, wo = ((o * p->kh + i) * p->kw + j) * C;
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
                            const float *xi = x + ((b * H + iy) * W + ix) * C;            /* [C] */
                            const float *wi = p->w + ((i * p->kw + j) * O + o) * C;         /* [C] */
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

/* ---- public entry points ------------------------------------------ */

int64_t vitc__nn_conv_scratch(const vitc__nn_conv *p, int64_t B, int64_t H, int64_t W) {
    (void)p;
    (void)B;
    (void)H;
    (void)W;
    return 0;
}

vitc_status vitc__nn_conv_forward(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                                  int64_t H, int64_t W, float *scratch, int64_t scratch_len) {
    static const char who[] = "conv2d forward";
    int64_t oh, ow;
    VITC_TRY(conv_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_conv_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!x || !y)) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL x or y", who);
    conv_fwd_ref(p, y, x, B, H, W, oh, ow);
    return VITC_OK;
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
    conv_bwd_ref(p, dx, dw, db, dy, x, B, H, W, oh, ow);
    return VITC_OK;
}

int64_t vitc__nn_convt_scratch(const vitc__nn_convt *p, int64_t B, int64_t H, int64_t W) {
    (void)p;
    (void)B;
    (void)H;
    (void)W;
    return 0;
}

vitc_status vitc__nn_convt_forward(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                                   int64_t H, int64_t W, float *scratch, int64_t scratch_len) {
    static const char who[] = "conv-transpose2d forward";
    int64_t oh, ow;
    VITC_TRY(convt_check_full(p, who, B, H, W, &oh, &ow));
    VITC_TRY(scratch_check(who, vitc__nn_convt_scratch(p, B, H, W), scratch, scratch_len));
    if (B > 0 && (!x || !y)) return vitc__err(VITC_ERR_INVALID_ARG, "%s: NULL x or y", who);
    convt_fwd_ref(p, y, x, B, H, W, oh, ow);
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
    convt_bwd_ref(p, dx, dw, db, dy, x, B, H, W, oh, ow);
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
    bil_fwd_ref(y, x, B, C, ih, iw, oh, ow, th, tw);
    free(th);
    return VITC_OK;
}

vitc_status vitc__nn_bilinear_backward(float *dx, const float *dy, int64_t B, int64_t C,
                                       int64_t ih, int64_t iw, int64_t oh, int64_t ow, int ac) {
    static const char who[] = "bilinear backward";
    VITC_TRY(bil_check(who, dy, dx, B, C, ih, iw, oh, ow));
    bil_ix *th, *tw;
    VITC_TRY(bil_tables(&th, &tw, ih, iw, oh, ow, ac, who));
    bil_bwd_ref(dx, dy, B, C, ih, iw, oh, ow, th, tw);
    free(th);
    return VITC_OK;
}
