/*
 * embed.c — the patch embedding's pieces with their adjoints: nn.Unfold
 * (im2col; a ViT's conv with kernel = stride = patch is one GEMM over its
 * rows) and the position table's bicubic resampling (torchvision's
 * align_corners, HF's half-pixel to a size, antialiased for DINOv2 with
 * registers), each with the transpose that carries gradients back.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

/* ---- nn.Unfold ------------------------------------------------------ */

typedef struct nn_unfold_ctx {
    float *dst;
    const float *src;
    int64_t C, h, w, k, s, p, oh, ow;
    int tokens;
} nn_unfold_ctx;

/* Row i = (image b, output row oy) of the unfold. A ViT's patches (k = s,
 * no padding, an image) copy runs of k floats. */
static void nn_unfold_task(void *ctx, int64_t i, int tid) {
    const nn_unfold_ctx *u = ctx;
    (void)tid;
    int64_t b = i / u->oh, oy = i % u->oh, k = u->k, K = u->C * k * k;
    for (int64_t ox = 0; ox < u->ow; ox++) {
        float *d = u->dst + ((b * u->oh + oy) * u->ow + ox) * K; /* [C, k, k] */
        for (int64_t c = 0; c < u->C; c++)
            for (int64_t ky = 0; ky < k; ky++) {
                int64_t y = oy * u->s - u->p + ky;
                if (!u->tokens && u->p == 0 && u->s == k) {
                    memcpy(d + (c * k + ky) * k,
                           u->src + ((b * u->C + c) * u->h + y) * u->w + ox * k,
                           (size_t)k * sizeof(float));
                    continue;
                }
                for (int64_t kx = 0; kx < k; kx++) {
                    int64_t x = ox * u->s - u->p + kx;
                    float v = 0.0f;
                    if (y >= 0 && y < u->h && x >= 0 && x < u->w)
                        v = u->tokens ? u->src[((b * u->h + y) * u->w + x) * u->C + c]
                                      : u->src[((b * u->C + c) * u->h + y) * u->w + x];
                    d[(c * k + ky) * k + kx] = v;
                }
            }
    }
}

void vitc__nn_unfold(float *dst, const float *src, int tokens, int64_t B, int64_t C, int64_t h,
                     int64_t w, int64_t k, int64_t s, int64_t p) {
    nn_unfold_ctx u = {dst, src, C, h, w, k, s, p, vitc__nn_unfold_out(h, k, s, p),
                       vitc__nn_unfold_out(w, k, s, p), tokens};
    vitc__parallel_for(B * u.oh, nn_unfold_task, &u);
}

/* Per image in order (images are independent: threaded over them). */
static void nn_fold_task(void *ctx, int64_t b, int tid) {
    const nn_unfold_ctx *u = ctx;
    (void)tid;
    int64_t k = u->k, K = u->C * k * k;
    float *dimg = (float *)u->src; /* the gradient being added to */
    for (int64_t oy = 0; oy < u->oh; oy++)
        for (int64_t ox = 0; ox < u->ow; ox++) {
            const float *d = u->dst + ((b * u->oh + oy) * u->ow + ox) * K;
            for (int64_t c = 0; c < u->C; c++)
                for (int64_t ky = 0; ky < k; ky++) {
                    int64_t y = oy * u->s - u->p + ky;
                    for (int64_t kx = 0; kx < k; kx++) {
                        int64_t x = ox * u->s - u->p + kx;
                        if (y >= 0 && y < u->h && x >= 0 && x < u->w)
                            dimg[u->tokens ? ((b * u->h + y) * u->w + x) * u->C + c
                                           : ((b * u->C + c) * u->h + y) * u->w + x] +=
                                d[(c * k + ky) * k + kx];
                    }
                }
        }
}

void vitc__nn_fold(float *dsrc, const float *ddst, int tokens, int64_t B, int64_t C, int64_t h,
                   int64_t w, int64_t k, int64_t s, int64_t p) {
    nn_unfold_ctx u = {(float *)ddst, dsrc, C, h, w, k, s, p, vitc__nn_unfold_out(h, k, s, p),
                       vitc__nn_unfold_out(w, k, s, p), tokens};
    vitc__parallel_for(B, nn_fold_task, &u);
}

/* ---- position table resampling -------------------------------------- */

/* PyTorch's cubic convolution kernel, A = -0.75 (UpSample.h). */
static void nn_cubic_weights(float w[4], float t) {
    const float A = -0.75f;
    float x1 = t + 1.0f, x2 = 1.0f - t, x3 = 2.0f - t;
    w[0] = ((A * x1 - 5.0f * A) * x1 + 8.0f * A) * x1 - 4.0f * A;
    w[1] = ((A + 2.0f) * t - (A + 3.0f)) * t * t + 1.0f;
    w[2] = ((A + 2.0f) * x2 - (A + 3.0f)) * x2 * x2 + 1.0f;
    w[3] = ((A * x3 - 5.0f * A) * x3 + 8.0f * A) * x3 - 4.0f * A;
}

/* Taps and weights at source coordinate real; taps past the edge are
 * clamped, as upsample_get_value_bounded does. */
static void nn_cubic_at(float real, int64_t in, int64_t idx[4], float w[4]) {
    int64_t i0 = (int64_t)floorf(real);
    nn_cubic_weights(w, real - (float)i0);
    for (int k = 0; k < 4; k++) {
        int64_t i = i0 - 1 + k;
        idx[k] = i < 0 ? 0 : i >= in ? in - 1 : i;
    }
}

/* Source taps and weights of output index o, align_corners=True. */
static void nn_cubic_taps(int64_t o, int64_t in, int64_t out, int64_t idx[4], float w[4]) {
    float scale = out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    float real = scale * (float)o;
    nn_cubic_at(real, in, idx, w);
}

/* The same with align_corners=False and an output size (no scale factor):
 * source (o + 0.5) * in/out - 0.5, not clamped (cubic), as
 * area_pixel_compute_source_index computes it; HF's ViT family resamples
 * its position grid so (transformers >= 4.45). */
static void nn_cubic_taps_hp(int64_t o, int64_t in, float scale, int64_t idx[4], float w[4]) {
    nn_cubic_at(scale * ((float)o + 0.5f) - 0.5f, in, idx, w);
}

/* The taps of output o by mode: 0 align_corners=True; 1 half-pixel to a
 * size (scale = in / out). */
static void nn_bicubic_taps(int64_t o, int64_t in, int64_t out, float scale, int mode,
                            int64_t idx[4], float w[4]) {
    if (mode)
        nn_cubic_taps_hp(o, in, scale, idx, w);
    else
        nn_cubic_taps(o, in, out, idx, w);
}

/* mode: as nn_bicubic_taps. */
static void nn_bicubic(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw,
                       int64_t oh, int64_t ow, int mode) {
    float sy = (float)ih / (float)oh, sx = (float)iw / (float)ow;
    for (int64_t y = 0; y < oh; y++) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        nn_bicubic_taps(y, ih, oh, sy, mode, ys, wy);
        for (int64_t x = 0; x < ow; x++) {
            nn_bicubic_taps(x, iw, ow, sx, mode, xs, wx);
            float *d = dst + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int a = 0; a < 4; a++) {
                    const float *row = src + ys[a] * iw * C + c;
                    float r = 0.0f;
                    for (int b = 0; b < 4; b++) r += wx[b] * row[xs[b] * C];
                    acc += wy[a] * r;
                }
                d[c] = acc;
            }
        }
    }
}

void vitc__bicubic_ac(float *dst, const float *src, int64_t C, int64_t ih, int64_t iw, int64_t oh,
                      int64_t ow) {
    nn_bicubic(dst, src, C, ih, iw, oh, ow, 0);
}

/* Keys' cubic with a = -0.5, the kernel of PyTorch's antialiased bicubic
 * (and PIL's). */
static double nn_keys(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
}

/* One axis of F.interpolate(mode="bicubic", antialias=True,
 * align_corners=False): output o reads inputs lo[o] .. lo[o] + n[o] - 1 with
 * weights w[o * taps ..], normalised to sum 1 (the support widens with the
 * downscale factor, as PIL's filters). taps: the most any output reads. */
static void nn_aa_axis(int64_t in, int64_t out, int64_t taps, int64_t *lo, int64_t *n, float *w) {
    double scale = (double)in / (double)out, sup = scale > 1.0 ? scale : 1.0;
    double support = 2.0 * sup;
    for (int64_t o = 0; o < out; o++) {
        double center = scale * ((double)o + 0.5), total = 0.0, ws[64];
        int64_t a = (int64_t)(center - support + 0.5), b = (int64_t)(center + support + 0.5);
        if (a < 0)
            a = 0;
        if (b > in)
            b = in;
        if (b - a > taps)
            b = a + taps;
        for (int64_t j = a; j < b; j++) total += ws[j - a] = nn_keys(((double)j - center + 0.5) / sup);
        lo[o] = a;
        n[o] = b - a;
        for (int64_t j = a; j < b; j++)
            w[o * taps + j - a] = (float)(total != 0.0 ? ws[j - a] / total : 0.0);
    }
}

/* The most taps an antialiased output reads (grids bounded by the caller). */
#define NN_AA_TAPS 64

/* Both axes' taps (width [0], height [1]) for an ih x iw -> oh x ow
 * resampling: w[a] [out * NN_AA_TAPS], freed by the caller. */
static vitc_status nn_aa_weights(int64_t ih, int64_t iw, int64_t oh, int64_t ow,
                                 int64_t lo[2][1024], int64_t n[2][1024], float *w[2]) {
    w[0] = malloc((size_t)(ow * NN_AA_TAPS) * sizeof(float));
    w[1] = malloc((size_t)(oh * NN_AA_TAPS) * sizeof(float));
    if (!w[0] || !w[1]) {
        free(w[0]);
        free(w[1]);
        return vitc__err(VITC_ERR_NOMEM, "antialiased resampling weights");
    }
    nn_aa_axis(iw, ow, NN_AA_TAPS, lo[0], n[0], w[0]);
    nn_aa_axis(ih, oh, NN_AA_TAPS, lo[1], n[1], w[1]);
    return VITC_OK;
}

/* Antialiased bicubic of src [ih*iw, C] into dst [oh*ow, C], width first
 * then height (PyTorch's separable order), through tmp [ih*ow, C]. Grids
 * are bounded (taps <= 64: a position grid shrinking by over 15x is
 * refused by the caller). */
static vitc_status nn_bicubic_aa(float *dst, float *tmp, const float *src, int64_t C, int64_t ih,
                                 int64_t iw, int64_t oh, int64_t ow) {
    int64_t lo[2][1024], n[2][1024];
    float *w[2];
    VITC_TRY(nn_aa_weights(ih, iw, oh, ow, lo, n, w));
    for (int64_t y = 0; y < ih; y++)
        for (int64_t x = 0; x < ow; x++) {
            float *d = tmp + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
            for (int64_t k = 0; k < n[0][x]; k++) {
                const float *s = src + (y * iw + lo[0][x] + k) * C;
                float wk = w[0][x * NN_AA_TAPS + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * s[c];
            }
        }
    for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
            float *d = dst + (y * ow + x) * C;
            for (int64_t c = 0; c < C; c++) d[c] = 0.0f;
            for (int64_t k = 0; k < n[1][y]; k++) {
                const float *s = tmp + ((lo[1][y] + k) * ow + x) * C;
                float wk = w[1][y * NN_AA_TAPS + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * s[c];
            }
        }
    free(w[0]);
    free(w[1]);
    return VITC_OK;
}

/* The adjoint of vitc__bicubic_ac: dsrc [ih*iw, C] += the transpose of the
 * resampling applied to ddst [oh*ow, C] (each tap's weight sends ddst back
 * to the clamped source it read). */
static void nn_bicubic_backward(float *dsrc, const float *ddst, int64_t C, int64_t ih,
                                int64_t iw, int64_t oh, int64_t ow, int mode) {
    float sy = (float)ih / (float)oh, sx = (float)iw / (float)ow;
    for (int64_t y = 0; y < oh; y++) {
        int64_t ys[4], xs[4];
        float wy[4], wx[4];
        nn_bicubic_taps(y, ih, oh, sy, mode, ys, wy);
        for (int64_t x = 0; x < ow; x++) {
            nn_bicubic_taps(x, iw, ow, sx, mode, xs, wx);
            const float *g = ddst + (y * ow + x) * C;
            for (int a = 0; a < 4; a++)
                for (int b = 0; b < 4; b++) {
                    float wab = wy[a] * wx[b];
                    float *d = dsrc + (ys[a] * iw + xs[b]) * C;
                    for (int64_t c = 0; c < C; c++) d[c] += wab * g[c];
                }
        }
    }
}

void vitc__bicubic_ac_backward(float *dsrc, const float *ddst, int64_t C, int64_t ih, int64_t iw,
                               int64_t oh, int64_t ow) {
    nn_bicubic_backward(dsrc, ddst, C, ih, iw, oh, ow, 0);
}

/* The adjoint of nn_bicubic_aa: the height pass's transpose into tmp
 * [ih*ow, C] (zeroed here), then the width pass's into dsrc (+=). */
static vitc_status nn_bicubic_aa_backward(float *dsrc, float *tmp, const float *ddst, int64_t C,
                                          int64_t ih, int64_t iw, int64_t oh, int64_t ow) {
    int64_t lo[2][1024], n[2][1024];
    float *w[2];
    VITC_TRY(nn_aa_weights(ih, iw, oh, ow, lo, n, w));
    memset(tmp, 0, (size_t)(ih * ow * C) * sizeof(float));
    for (int64_t y = 0; y < oh; y++)
        for (int64_t x = 0; x < ow; x++) {
            const float *g = ddst + (y * ow + x) * C;
            for (int64_t k = 0; k < n[1][y]; k++) {
                float *d = tmp + ((lo[1][y] + k) * ow + x) * C;
                float wk = w[1][y * NN_AA_TAPS + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * g[c];
            }
        }
    for (int64_t y = 0; y < ih; y++)
        for (int64_t x = 0; x < ow; x++) {
            const float *g = tmp + (y * ow + x) * C;
            for (int64_t k = 0; k < n[0][x]; k++) {
                float *d = dsrc + (y * iw + lo[0][x] + k) * C;
                float wk = w[0][x * NN_AA_TAPS + k];
                for (int64_t c = 0; c < C; c++) d[c] += wk * g[c];
            }
        }
    free(w[0]);
    free(w[1]);
    return VITC_OK;
}


vitc_status vitc__nn_resample(int rule, float *dst, float *tmp, const float *src, int64_t C,
                              int64_t ih, int64_t iw, int64_t oh, int64_t ow) {
    if (rule == VITC__NN_RESAMPLE_ANTIALIAS)
        return nn_bicubic_aa(dst, tmp, src, C, ih, iw, oh, ow);
    nn_bicubic(dst, src, C, ih, iw, oh, ow, rule == VITC__NN_RESAMPLE_HALF_PIXEL);
    return VITC_OK;
}

vitc_status vitc__nn_resample_backward(int rule, float *dsrc, const float *ddst, int64_t C,
                                       int64_t ih, int64_t iw, int64_t oh, int64_t ow) {
    if (rule != VITC__NN_RESAMPLE_ANTIALIAS) {
        nn_bicubic_backward(dsrc, ddst, C, ih, iw, oh, ow, rule == VITC__NN_RESAMPLE_HALF_PIXEL);
        return VITC_OK;
    }
    vitc__buf tmp = {0};
    size_t n;
    if (!vitc__mul_size((size_t)(ih * ow), (size_t)C, &n))
        return vitc__err(VITC_ERR_NOMEM, "position embedding backward overflows");
    VITC_TRY(vitc__buf_reserve(&tmp, n));
    vitc_status st = nn_bicubic_aa_backward(dsrc, tmp.p, ddst, C, ih, iw, oh, ow);
    vitc__buf_free(&tmp);
    return st;
}
