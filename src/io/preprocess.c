/*
 * preprocess.c — an image into a model's input, the two ways vitc knows:
 *
 *   torchvision's ImageClassification transform (vitc checkpoints, timm):
 *   antialiased bilinear resize in float32, torch's centre crop, ToTensor,
 *   Normalize;
 *   a Hugging Face image processor's slow (PIL) path (Hub models): PIL's
 *   uint8 resize, transformers' numpy centre crop, rescale, normalise.
 *
 * Both compute only the crop's window of the resize (the taps of the kept
 * rows and columns, the first pass over just the input rows those rows
 * read), under one budget, VITC_IMAGE_MAX_RESIZE_BYTES, counted before
 * anything is allocated: an image is untrusted, and a 138-byte 20000x1 PNG
 * resized whole to a 224 short side is 3 GB. Every kept sample is the full
 * resize's bit for bit, since both libraries derive an output's taps from
 * its own index alone.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Preprocessing's own buffers (taps and the resize's intermediates for the
 * crop's window) are refused beyond this: docs/limits.md, Images. */
#define VITC_IMAGE_MAX_RESIZE_BYTES ((size_t)1 << 30)

static vitc_status over_budget(int64_t w, int64_t h, int64_t nw, int64_t nh, int crop_w,
                               int crop_h) {
    char crop[32];
    if (crop_w == crop_h)
        snprintf(crop, sizeof crop, "%d", crop_w);
    else
        snprintf(crop, sizeof crop, "%dx%d", crop_w, crop_h);
    return vitc__err(VITC_ERR_INVALID_ARG,
                     "image resize: %lldx%lld to %lldx%lld, crop %s needs over %d MiB of "
                     "intermediates (the limit); use a smaller or less elongated image",
                     (long long)w, (long long)h, (long long)nw, (long long)nh, crop,
                     (int)(VITC_IMAGE_MAX_RESIZE_BYTES >> 20));
}

/* Bytes of the taps of n outputs of an n_in -> n_out resize whose filter
 * reaches support0 input samples (times the downscale factor) each side, with
 * the per-output bounds; n_in 0: no resize on this axis. An upper bound of
 * both libraries' ksize = ceil(support) * 2 + 1; 0 on overflow. */
static int taps_fit(int64_t n_in, int64_t n_out, int64_t n, double support0, size_t elem,
                    size_t *bytes) {
    *bytes = 0;
    if (n_in <= 0 || n <= 0)
        return 1;
    double scale = (double)n_in / (double)n_out, k = ceil(support0 * (scale < 1.0 ? 1.0 : scale));
    double total = (k * 2.0 + 3.0) * (double)elem * (double)n + 2.0 * 8.0 * (double)n +
                   (k * 2.0 + 3.0) * 8.0;
    if (!(total <= (double)VITC_IMAGE_MAX_RESIZE_BYTES))
        return 0;
    *bytes = (size_t)total;
    return 1;
}

/* ------------------------------------------------------------------ */
/* Preprocessing: torchvision's ImageClassification transform         */
/* ------------------------------------------------------------------ */

/*
 * One pass of torch's _upsample_bilinear2d_aa (antialiased bilinear,
 * align_corners=False) along one axis, float32 throughout with torch's order
 * of operations, so that after rounding to uint8 the result is torch's:
 * the filter widens with the downscale factor, taps outside the image are
 * dropped and the remaining weights renormalised.
 *
 * in: n_in samples along the axis, each `stride` floats apart, for `count`
 * independent lines `line_in` / `line_out` floats apart.
 */
typedef struct aa_taps {
    int64_t *xmin, *xsize;
    float *w; /* [n_out, ksize] */
    int ksize;
} aa_taps;

/* Taps for outputs [i0, i1) only: torch computes each output's weights from
 * its own index, so a window's taps equal the full resize's. Entry k is
 * output i0 + k. */
static vitc_status aa_taps_make(aa_taps *t, int64_t n_in, int64_t n_out, int64_t i0,
                                int64_t i1) {
    float scale = (float)n_in / (float)n_out;
    float support = (scale >= 1.0f) ? 1.0f * scale : 1.0f;
    float invscale = (scale >= 1.0f) ? (float)(1.0 / scale) : 1.0f;
    size_t n = (size_t)(i1 - i0), nw;
    t->ksize = (int)ceilf(support) * 2 + 1;
    t->xmin = malloc(sizeof *t->xmin * n);
    t->xsize = malloc(sizeof *t->xsize * n);
    if (!vitc__mul_size(n, (size_t)t->ksize, &nw) || !vitc__mul_size(nw, sizeof(float), &nw))
        nw = 0;
    t->w = nw ? malloc(nw) : NULL;
    if (!t->xmin || !t->xsize || !t->w)
        return vitc__err(VITC_ERR_NOMEM, "image resize: out of memory");
    for (int64_t i = i0; i < i1; i++) {
        /* Same mixed float/double expressions as torch's _compute_weights_aa. */
        float center = (float)(scale * (i + 0.5));
        float total = 0.0f;
        int64_t xmin = (int64_t)(center - support + 0.5);
        int64_t xmax = (int64_t)(center + support + 0.5);
        float *w = t->w + (size_t)(i - i0) * t->ksize;
        if (xmin < 0)
            xmin = 0;
        if (xmax > n_in)
            xmax = n_in;
        t->xmin[i - i0] = xmin;
        t->xsize[i - i0] = xmax - xmin;
        for (int64_t j = 0; j < xmax - xmin; j++) {
            float x = (float)(((float)(j + xmin) - center + 0.5) * invscale);
            float f;
            if (x < 0.0f)
                x = -x;
            f = x < 1.0f ? 1.0f - x : 0.0f;
            w[j] = f;
            total += f;
        }
        for (int64_t j = 0; j < xmax - xmin; j++)
            if (total != 0.0f)
                w[j] /= total;
    }
    return VITC_OK;
}

static void aa_taps_free(aa_taps *t) {
    free(t->xmin);
    free(t->xsize);
    free(t->w);
}

/* Both passes accumulate like torch's kernel, which is built with FMA
 * contraction: a product of two floats is exact in double, so the double
 * expression below is fmaf (but for a double-rounding case of probability
 * ~2^-29), and inline. The first pass reads the uint8 pixels directly. */
#define VITC_AA_PASS(NAME, T)                                                                  \
    static void NAME(float *out, const T *in, const aa_taps *t, int64_t n_out,                 \
                     size_t stride_in, size_t stride_out, size_t count, size_t line_in,        \
                     size_t line_out) {                                                        \
        for (size_t l = 0; l < count; l++) {                                                   \
            const T *src = in + l * line_in;                                                   \
            float *dst = out + l * line_out;                                                   \
            for (int64_t i = 0; i < n_out; i++) {                                              \
                const float *w = t->w + (size_t)i * t->ksize;                                  \
                const T *s = src + (size_t)t->xmin[i] * stride_in;                             \
                float acc = (float)s[0] * w[0];                                                \
                for (int64_t j = 1; j < t->xsize[i]; j++)                                      \
                    acc = (float)((double)s[(size_t)j * stride_in] * w[j] + acc);              \
                dst[(size_t)i * stride_out] = acc;                                             \
            }                                                                                  \
        }                                                                                      \
    }
VITC_AA_PASS(aa_pass_u8, uint8_t)
VITC_AA_PASS(aa_pass_f32, float)

/* torchvision's Resize([size]) output size: shorter side = size, longer side
 * = int(size * long / short) (truncated). */
static void resized_size(int h, int w, int size, int64_t *nh, int64_t *nw) {
    int shorter = w <= h ? w : h, longer = w <= h ? h : w;
    int64_t new_long = (int64_t)((double)((int64_t)size * longer) / (double)shorter);
    if (w <= h) {
        *nw = size;
        *nh = new_long;
    } else {
        *nh = size;
        *nw = new_long;
    }
}

/* Python's round(d / 2.0) for an integer d >= 0: half to even. */
static int64_t half_round_even(int64_t d) {
    int64_t k = d / 2;
    if (d % 2 == 0)
        return k;
    return (k % 2 == 0) ? k : k + 1;
}

/* Where the crop lies along one axis of an n-sample (resized) image.
 * torchvision's center_crop zero-pads where the crop is larger (the smaller
 * half before), then cuts at round((padded - crop) / 2). Samples [a0, a1) of
 * the image are the ones kept; sample a0 lands at crop position d0. */
typedef struct crop_axis {
    int64_t a0, a1, d0;
} crop_axis;

static crop_axis crop_axis_make(int64_t n, int crop) {
    int64_t pad = crop > n ? (crop - n) / 2 : 0, padded = crop > n ? crop : n;
    int64_t off = half_round_even(padded - crop) - pad; /* image sample at crop position 0 */
    crop_axis r;
    r.a0 = off > 0 ? off : 0;
    r.a1 = off + crop < n ? off + crop : n;
    r.d0 = r.a0 - off;
    return r;
}

/* torchvision's rgb_to_grayscale on a uint8 tensor: 0.2989 r + 0.587 g +
 * 0.114 b in float32, summed left to right, truncated to uint8. The
 * products come from tables (each rounded once from an exact double
 * product), so no compiler contraction can change the float32 result. */
static void rgb_to_gray(const uint8_t *rgb, size_t n, uint8_t *gray) {
    float lr[256], lg[256], lb[256];
    for (int v = 0; v < 256; v++) {
        lr[v] = (float)((double)0.2989f * v);
        lg[v] = (float)((double)0.587f * v);
        lb[v] = (float)((double)0.114f * v);
    }
    for (size_t i = 0; i < n; i++) {
        float l = lr[rgb[3 * i]] + lg[rgb[3 * i + 1]];
        l += lb[rgb[3 * i + 2]];
        gray[i] = (uint8_t)l;
    }
}

/*
 * Resize, crop and normalise in one pass over the crop's window. Only the
 * resized samples the crop keeps are computed (taps for those rows and
 * columns, the width pass only over the input rows those rows read), so the
 * memory is bounded by the window, not by the resized image: a 100000x1
 * image resized to 256 is 256 x 25.6M pixels, of which the crop needs
 * 224 x 224. Each kept sample is computed exactly as the full resize would
 * compute it (torch's taps depend on the output index alone).
 *
 * src: [h, w, ch] uint8; the resized image is [nh, nw, ch] (nh == h and
 * nw == w: no resize). out: [ch, crop, crop].
 */
static vitc_status crop_window(const uint8_t *src, int64_t h, int64_t w, int ch, int64_t nh,
                               int64_t nw, int crop, const float *mean, const float *std,
                               float *out) {
    const crop_axis ry = crop_axis_make(nh, crop), rx = crop_axis_make(nw, crop);
    const int resize_w = nw != w, resize_h = nh != h;
    const size_t cw = (size_t)(rx.a1 - rx.a0), row_len = cw * (size_t)ch;
    const size_t plane = (size_t)crop * (size_t)crop;
    aa_taps tw = {0}, th = {0};
    float *mid = NULL, *acc = NULL; /* [y_hi - y_lo, cw, ch], [cw, ch] */
    uint8_t *row = NULL;            /* [cw, ch] */
    int64_t y_lo = ry.a0, y_hi = ry.a1;
    size_t n_mid = 0, bytes = 0, taps = 0;
    vitc_status st = VITC_OK;

    /* The taps first: a huge downscale makes wide filters (a 10^8-sample
     * axis into 1 is a 10^8-tap filter), counted before they exist. */
    if (!taps_fit(resize_h ? h : 0, nh, ry.a1 - ry.a0, 1.0, sizeof(float), &taps) ||
        !taps_fit(resize_w ? w : 0, nw, rx.a1 - rx.a0, 1.0, sizeof(float), &bytes) ||
        !vitc__add_size(taps, bytes, &taps) || taps > VITC_IMAGE_MAX_RESIZE_BYTES) {
        st = over_budget(w, h, nw, nh, crop, crop);
        goto done;
    }
    if (resize_h) {
        if ((st = aa_taps_make(&th, h, nh, ry.a0, ry.a1)) != VITC_OK)
            goto done;
        y_lo = th.xmin[0];
        y_hi = 0;
        for (int64_t i = 0; i < ry.a1 - ry.a0; i++)
            if (th.xmin[i] + th.xsize[i] > y_hi)
                y_hi = th.xmin[i] + th.xsize[i];
        for (int64_t i = 0; i < ry.a1 - ry.a0; i++)
            th.xmin[i] -= y_lo; /* rows of mid, which starts at input row y_lo */
    }
    if (resize_w && (st = aa_taps_make(&tw, w, nw, rx.a0, rx.a1)) != VITC_OK)
        goto done;
    if (resize_w || resize_h) {
        /* The buffers the window needs (taps aside, which are smaller):
         * refused over the documented cap rather than attempted. */
        if (!vitc__mul_size((size_t)(y_hi - y_lo), row_len, &n_mid) ||
            !vitc__add_size(n_mid, row_len, &bytes) ||
            !vitc__mul_size(bytes, sizeof(float), &bytes) ||
            !vitc__add_size(bytes, taps, &bytes) || bytes > VITC_IMAGE_MAX_RESIZE_BYTES) {
            st = over_budget(w, h, nw, nh, crop, crop);
            goto done;
        }
        mid = malloc(sizeof(float) * n_mid);
        acc = malloc(sizeof(float) * row_len);
        row = malloc(row_len);
        if (!mid || !acc || !row) {
            st = vitc__err(VITC_ERR_NOMEM, "image resize: out of memory");
            goto done;
        }
        if (resize_w) {
            /* each (input row, channel) is a line of w samples ch apart */
            for (int c = 0; c < ch; c++)
                aa_pass_u8(mid + c, src + (size_t)y_lo * (size_t)w * ch + c, &tw, (int64_t)cw,
                           (size_t)ch, (size_t)ch, (size_t)(y_hi - y_lo), (size_t)w * ch, row_len);
        } else {
            for (int64_t y = y_lo; y < y_hi; y++)
                for (size_t k = 0; k < row_len; k++)
                    mid[(size_t)(y - y_lo) * row_len + k] =
                        (float)src[((size_t)y * (size_t)w + (size_t)rx.a0) * ch + k];
        }
    }
    /* The padding everywhere first (once the work is known to fit); the
     * window then overwrites its part. */
    for (int c = 0; c < ch; c++) {
        float pad_val = (0.0f / 255.0f - mean[c]) / std[c];
        for (size_t i = 0; i < plane; i++)
            out[plane * c + i] = pad_val;
    }
    for (int64_t r = ry.a0; r < ry.a1; r++) {
        const uint8_t *u;
        const int64_t dy = r - ry.a0 + ry.d0;
        if (!resize_w && !resize_h) {
            u = src + ((size_t)r * (size_t)w + (size_t)rx.a0) * ch;
        } else {
            const float *f;
            if (resize_h) {
                /* output row r: each (column, channel) of mid is a line of
                 * samples row_len apart */
                const int64_t i = r - ry.a0;
                aa_taps one = {th.xmin + i, th.xsize + i, th.w + (size_t)i * th.ksize, th.ksize};
                aa_pass_f32(acc, mid, &one, 1, row_len, 1, row_len, 1, 1);
                f = acc;
            } else {
                /* Only here is r a row of mid: with a vertical resize it is
                 * an output row, and mid + (r - y_lo) may lie outside it. */
                f = mid + (size_t)(r - y_lo) * row_len;
            }
            for (size_t k = 0; k < row_len; k++) {
                float v = nearbyintf(f[k]); /* torch.round: half to even */
                row[k] = (uint8_t)(v < 0.0f ? 0.0f : v > 255.0f ? 255.0f : v);
            }
            u = row;
        }
        /* ToTensor and Normalize in float32, in torch's order. */
        for (int c = 0; c < ch; c++) {
            float *o = out + plane * c + (size_t)dy * crop + (size_t)rx.d0;
            for (size_t x = 0; x < cw; x++)
                o[x] = ((float)u[x * ch + c] / 255.0f - mean[c]) / std[c];
        }
    }
done:
    aa_taps_free(&th);
    aa_taps_free(&tw);
    free(mid);
    free(acc);
    free(row);
    return st;
}

vitc_status vitc_image_preprocess_channels(const vitc_image *img, int resize, int crop,
                                           int channels, const float *mean, const float *std,
                                           float *out) {
    const uint8_t *px;
    uint8_t *gray = NULL; /* [h, w] */
    int64_t nh, nw;
    size_t n_px;
    vitc_status st;

    if (!img || !img->rgb || !mean || !std || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: NULL argument");
    if (img->width <= 0 || img->height <= 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: empty image");
    if (channels != 1 && channels != 3)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_image_preprocess: %d channels (images make 1: luminance, or "
                         "3: RGB)", channels);
    if (crop <= 0 || resize < 0 || crop > 65536 || resize > 65536)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_image_preprocess: crop %d / resize %d out of range (crop 1..65536, "
                         "resize 0..65536)", crop, resize);
    for (int c = 0; c < channels; c++)
        if (!(std[c] != 0.0f) || !isfinite(std[c]) || !isfinite(mean[c]))
            return vitc__err(VITC_ERR_INVALID_ARG, "vitc_image_preprocess: invalid mean/std");
    nh = img->height;
    nw = img->width;
    if (resize > 0) {
        resized_size(img->height, img->width, resize, &nh, &nw);
        if (nh <= 0 || nw <= 0)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "vitc_image_preprocess: resizing %dx%d to shorter side %d leaves "
                             "an empty image", img->width, img->height, resize);
        if (nh > INT32_MAX || nw > INT32_MAX)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "vitc_image_preprocess: resizing %dx%d to shorter side %d makes "
                             "%lldx%lld, over %d pixels on a side", img->width, img->height,
                             resize, (long long)nw, (long long)nh, INT32_MAX);
    }
    px = img->rgb;
    if (channels == 1) {
        /* Grayscale before Resize, as a gray model's transform has it. */
        n_px = (size_t)img->width * (size_t)img->height;
        if (!(gray = malloc(n_px)))
            return vitc__err(VITC_ERR_NOMEM, "vitc_image_preprocess: out of memory for a %dx%d "
                             "gray image", img->width, img->height);
        rgb_to_gray(img->rgb, n_px, gray);
        px = gray;
    }
    st = crop_window(px, img->height, img->width, channels, nh, nw, crop, mean, std, out);
    free(gray);
    return st;
}

vitc_status vitc_image_preprocess(const vitc_image *img, int resize, int crop,
                                  const float mean[3], const float std[3], float *out) {
    return vitc_image_preprocess_channels(img, resize, crop, 3, mean, std, out);
}

/* ------------------------------------------------------------------ */
/* Hugging Face image processors: the slow (PIL) path                  */
/* ------------------------------------------------------------------ */

/*
 * Resize with PIL (Image.resize((w, h), resample)): separable, horizontal
 * pass then vertical, each rounded to uint8 with PIL's 22-bit fixed-point
 * coefficients (Resample.c: precompute_coeffs, normalize_coeffs_8bpc,
 * ImagingResample{Horizontal,Vertical}_8bpc), so the uint8 pixels are PIL's
 * bit for bit; centre crop with floor offsets (a crop larger than the image
 * pads it with zeros, as transformers' numpy center_crop); x * rescale_factor
 * in double then float32; (x - mean) / std in float32.
 */

#define PIL_PRECISION_BITS (32 - 8 - 2)

static double pil_bilinear(double x) {
    x = x < 0.0 ? -x : x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

static double pil_bicubic(double x) {
    const double a = -0.5;
    x = x < 0.0 ? -x : x;
    if (x < 1.0)
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0)
        return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
    return 0.0;
}

static double pil_support(int resample) { return resample == 2 ? 1.0 : 2.0; }

typedef struct pil_coeffs {
    int ksize;
    int *bounds; /* [n][2]: xmin, count */
    int *k;      /* [n][ksize] fixed point */
} pil_coeffs;

static void pil_coeffs_free(pil_coeffs *c) {
    free(c->bounds);
    free(c->k);
}

/* Coefficients of outputs [o0, o1) of an in -> out resize; entry i is
 * output o0 + i. The caller has counted them against the budget. */
static vitc_status pil_coeffs_make(int64_t in, int64_t out, int resample, int64_t o0, int64_t o1,
                                   pil_coeffs *c) {
    double (*filter)(double) = resample == 2 ? pil_bilinear : pil_bicubic;
    double scale = (double)in / (double)out, fs = scale < 1.0 ? 1.0 : scale;
    double support = pil_support(resample) * fs;
    size_t n = (size_t)(o1 - o0), nk;
    double *pre = NULL; /* [ksize] */
    c->ksize = (int)ceil(support) * 2 + 1;
    c->bounds = malloc(2 * n * sizeof(int));
    c->k = vitc__mul_size(n, (size_t)c->ksize, &nk) ? malloc(nk * sizeof(int)) : NULL;
    pre = malloc((size_t)c->ksize * sizeof(double));
    if (!c->bounds || !c->k || !pre) {
        free(pre);
        return vitc__err(VITC_ERR_NOMEM, "image resize %lld -> %lld: out of memory",
                         (long long)in, (long long)out);
    }
    for (int64_t xx = o0; xx < o1; xx++) {
        double center = ((double)xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int64_t xmin = (int64_t)(center - support + 0.5), xmax = (int64_t)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in)
            xmax = in;
        xmax -= xmin;
        for (int64_t x = 0; x < xmax; x++) {
            double w = filter(((double)(x + xmin) - center + 0.5) * ss);
            pre[x] = w;
            ww += w;
        }
        int *k = c->k + (size_t)(xx - o0) * (size_t)c->ksize;
        for (int x = 0; x < c->ksize; x++) {
            double v = x < xmax && ww != 0.0 ? pre[x] / ww : 0.0;
            k[x] = v < 0 ? (int)(-0.5 + v * (1 << PIL_PRECISION_BITS))
                         : (int)(0.5 + v * (1 << PIL_PRECISION_BITS));
        }
        c->bounds[2 * (xx - o0)] = (int)xmin;
        c->bounds[2 * (xx - o0) + 1] = (int)xmax;
    }
    free(pre);
    return VITC_OK;
}

static uint8_t pil_clip8(int in) {
    if (in >= (1 << PIL_PRECISION_BITS << 8))
        return 255;
    if (in <= 0)
        return 0;
    return (uint8_t)(in >> PIL_PRECISION_BITS);
}

/* One output sample of channel ch: n taps of k over src, `step` bytes apart. */
static uint8_t pil_tap(const uint8_t *src, size_t step, const int *k, int n) {
    int ss = 1 << (PIL_PRECISION_BITS - 1);
    for (int t = 0; t < n; t++)
        ss += src[(size_t)t * step] * k[t];
    return pil_clip8(ss);
}

vitc_status vitc__hf_output_size(const vitc__hf_proc *p, int w, int h, int *oh, int *ow,
                                 int *rh, int *rw) {
    double dh = h, dw = w;
    if (p->do_resize) {
        if (p->shortest > 0) { /* short side = s, long = int(s * long / short) */
            double s = p->shortest;
            if (w <= h)
                dw = s, dh = floor(s * h / w);
            else
                dh = s, dw = floor(s * w / h);
        } else {
            dh = p->size_h, dw = p->size_w;
        }
    }
    if (dh < 1 || dw < 1)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d resizes to nothing", w, h);
    if (dh > INT32_MAX || dw > INT32_MAX)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "image %dx%d resizes to %.0fx%.0f, over %d pixels on a side; use a less "
                         "elongated image", w, h, dw, dh, INT32_MAX);
    *rh = (int)dh, *rw = (int)dw;
    *oh = *rh, *ow = *rw;
    if (p->do_crop)
        *oh = p->crop_h, *ow = p->crop_w;
    /* The caller allocates the output: without a crop it is the whole
     * resized image, held to the same budget. */
    if ((double)*oh * (double)*ow * 3.0 * sizeof(float) > (double)VITC_IMAGE_MAX_RESIZE_BYTES)
        return over_budget(w, h, *rw, *rh, *ow, *oh);
    return VITC_OK;
}

/* Where the crop's first row (column) lies in the resized image of n: floor
 * centering, or, when the crop is larger, the image placed ceil((c - n) / 2)
 * into zeros, as transformers' numpy center_crop pads. */
static int64_t hf_crop_offset(int64_t n, int64_t c) {
    return c <= n ? (n - c) / 2 : -((c - n + 1) / 2);
}

/*
 * The crop's window [y0, y1) x [x0, x1) of the resized image only: the
 * horizontal pass over the input rows the window's rows read ([y_lo, y_hi)),
 * for the window's columns, into mid; the vertical pass for the window's
 * rows. PIL's passes work the same way (its vertical pass's input box), and
 * a column's or row's coefficients depend on its own index alone.
 */
vitc_status vitc__hf_preprocess(const vitc__hf_proc *p, const vitc_image *img, float *out) {
    return vitc__hf_preprocess_channels(p, img, 3, out);
}

/* channels 1: the image as PIL's convert("L") makes it (ITU-R 601-2 in
 * 16-bit fixed point, as PIL rounds it), then the same processor on the one
 * plane with the first mean and std: what transformers' processors compute
 * on a gray image (as many planes as the image has). Every resize and crop
 * works per channel, so the luminance is made row by row, as the rows are
 * read, into all three channels of a row buffer: nothing else changes. */
vitc_status vitc__hf_preprocess_channels(const vitc__hf_proc *p, const vitc_image *img,
                                         int channels, float *out) {
    if (!p || !img || !img->rgb || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "preprocess: NULL image or output");
    if (channels != 1 && channels != 3)
        return vitc__err(VITC_ERR_UNSUPPORTED, "preprocess: a model of %d input channels (the "
                         "image processor makes 1: luminance, or 3: RGB)", channels);
    if (img->width < 1 || img->height < 1)
        return vitc__err(VITC_ERR_INVALID_ARG, "preprocess: empty image");
    int oh, ow, rh, rw;
    VITC_TRY(vitc__hf_output_size(p, img->width, img->height, &oh, &ow, &rh, &rw));
    const int64_t h = img->height, w = img->width;
    const int64_t top = hf_crop_offset(rh, oh), left = hf_crop_offset(rw, ow);
    const int64_t y0 = top > 0 ? top : 0, y1 = top + oh < rh ? top + oh : rh;
    const int64_t x0 = left > 0 ? left : 0, x1 = left + ow < rw ? left + ow : rw;
    const int resize_w = rw != w, resize_h = rh != h;
    const size_t cw = (size_t)(x1 - x0), row_len = cw * 3;
    const size_t plane = (size_t)oh * (size_t)ow;
    pil_coeffs cx = {0}, cy = {0};
    uint8_t *mid = NULL; /* [y_hi - y_lo, cw, 3] */
    uint8_t *row = NULL; /* [cw, 3] */
    uint8_t *gray = NULL; /* [w, 3]: one input row as luminance (channels 1) */
    int64_t y_lo = y0, y_hi = y1;
    size_t taps = 0, bytes = 0;
    vitc_status st = VITC_OK;

    if (!taps_fit(resize_h ? h : 0, rh, y1 - y0, pil_support(p->resample), sizeof(int), &taps) ||
        !taps_fit(resize_w ? w : 0, rw, x1 - x0, pil_support(p->resample), sizeof(int), &bytes) ||
        !vitc__add_size(taps, bytes, &taps) || taps > VITC_IMAGE_MAX_RESIZE_BYTES) {
        st = over_budget(w, h, rw, rh, ow, oh);
        goto done;
    }
    if (resize_h) {
        if ((st = pil_coeffs_make(h, rh, p->resample, y0, y1, &cy)) != VITC_OK)
            goto done;
        y_lo = cy.bounds[0];
        y_hi = 0;
        for (int64_t i = 0; i < y1 - y0; i++)
            if (cy.bounds[2 * i] + cy.bounds[2 * i + 1] > y_hi)
                y_hi = cy.bounds[2 * i] + cy.bounds[2 * i + 1];
    }
    if (resize_w && (st = pil_coeffs_make(w, rw, p->resample, x0, x1, &cx)) != VITC_OK)
        goto done;
    if (!vitc__mul_size((size_t)(y_hi - y_lo), row_len, &bytes) ||
        !vitc__add_size(bytes, row_len, &bytes) || !vitc__add_size(bytes, taps, &bytes) ||
        bytes > VITC_IMAGE_MAX_RESIZE_BYTES) {
        st = over_budget(w, h, rw, rh, ow, oh);
        goto done;
    }
    mid = malloc((size_t)(y_hi - y_lo) * row_len + 1);
    row = malloc(row_len + 1);
    if (channels == 1)
        gray = malloc((size_t)w * 3); /* smaller than the image itself */
    if (!mid || !row || (channels == 1 && !gray)) {
        st = vitc__err(VITC_ERR_NOMEM, "preprocess: out of memory for a %dx%d image",
                       img->width, img->height);
        goto done;
    }
    for (int64_t y = y_lo; y < y_hi; y++) {
        const uint8_t *s = img->rgb + (size_t)y * (size_t)w * 3;
        uint8_t *d = mid + (size_t)(y - y_lo) * row_len;
        if (gray) {
            for (int64_t x = 0; x < w; x++) {
                const uint8_t *px = s + 3 * x;
                uint8_t l = (uint8_t)((px[0] * 19595u + px[1] * 38470u + px[2] * 7471u +
                                       0x8000u) >> 16);
                gray[3 * x] = gray[3 * x + 1] = gray[3 * x + 2] = l;
            }
            s = gray;
        }
        if (!resize_w) {
            memcpy(d, s + (size_t)x0 * 3, row_len);
            continue;
        }
        for (size_t x = 0; x < cw; x++) {
            const int *k = cx.k + x * (size_t)cx.ksize;
            const uint8_t *sx = s + (size_t)cx.bounds[2 * x] * 3;
            for (int c = 0; c < 3; c++)
                d[x * 3 + (size_t)c] = pil_tap(sx + c, 3, k, cx.bounds[2 * x + 1]);
        }
    }
    /* Everything padding first (a crop larger than the image), then the
     * window's pixels. */
    float mean[3], sd[3];
    for (int c = 0; c < 3; c++) mean[c] = p->mean[c], sd[c] = p->std[c];
    for (int c = 0; c < channels; c++) {
        float f = 0.0f; /* a zero pixel, through the same arithmetic */
        if (p->do_rescale)
            f = (float)(0.0 * p->rescale);
        if (p->do_normalize)
            f = (f - mean[c]) / sd[c];
        for (size_t i = 0; i < plane; i++) out[plane * (size_t)c + i] = f;
    }
    for (int64_t r = y0; r < y1; r++) {
        const uint8_t *u;
        if (resize_h) {
            const int64_t i = r - y0;
            const int *k = cy.k + (size_t)i * (size_t)cy.ksize;
            const uint8_t *s = mid + (size_t)(cy.bounds[2 * i] - y_lo) * row_len;
            for (size_t j = 0; j < row_len; j++)
                row[j] = pil_tap(s + j, row_len, k, cy.bounds[2 * i + 1]);
            u = row;
        } else {
            u = mid + (size_t)(r - y_lo) * row_len;
        }
        const size_t dy = (size_t)(r - top), dx = (size_t)(x0 - left);
        for (int c = 0; c < channels; c++) {
            float *o = out + plane * (size_t)c + dy * (size_t)ow + dx;
            for (size_t x = 0; x < cw; x++) {
                uint8_t v = u[x * 3 + (size_t)c];
                float f = p->do_rescale ? (float)((double)v * p->rescale) : (float)v;
                if (p->do_normalize)
                    f = (f - mean[c]) / sd[c];
                o[x] = f;
            }
        }
    }
done:
    pil_coeffs_free(&cx);
    pil_coeffs_free(&cy);
    free(mid);
    free(row);
    free(gray);
    return st;
}
