/*
 * image_hf.c — Hugging Face image processors' slow (PIL) path, exactly:
 *
 *   resize with PIL (Image.resize((w, h), resample)): separable, horizontal
 *   pass then vertical, each rounded to uint8 with PIL's 22-bit fixed-point
 *   coefficients; center crop with floor offsets (a crop larger than the
 *   image pads it with zeros, as transformers' numpy center_crop);
 *   x * rescale_factor in double then float32; (x - mean) / std in float32.
 *
 * The coefficient code follows PIL's Resample.c (precompute_coeffs,
 * normalize_coeffs_8bpc, ImagingResample{Horizontal,Vertical}_8bpc), so the
 * uint8 pixels are PIL's bit for bit.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

typedef struct pil_coeffs {
    int ksize;
    int *bounds; /* [out][2]: xmin, count */
    int *k;      /* [out][ksize] fixed point */
} pil_coeffs;

static vitc_status pil_coeffs_make(int in, int out, int resample, pil_coeffs *c) {
    double support0 = resample == 2 ? 1.0 : 2.0;
    double (*filter)(double) = resample == 2 ? pil_bilinear : pil_bicubic;
    double scale = (double)in / out, fs = scale < 1.0 ? 1.0 : scale;
    double support = support0 * fs;
    c->ksize = (int)ceil(support) * 2 + 1;
    size_t n;
    c->bounds = NULL;
    c->k = NULL;
    double *pre = NULL;
    if (!vitc__mul_size((size_t)out, (size_t)c->ksize, &n) ||
        !(c->bounds = malloc(2 * (size_t)out * sizeof(int))) || !(c->k = malloc(n * sizeof(int))) ||
        !(pre = malloc((size_t)c->ksize * sizeof(double)))) {
        free(c->bounds);
        free(c->k);
        return vitc__err(VITC_ERR_NOMEM, "image resize %d -> %d: out of memory", in, out);
    }
    for (int xx = 0; xx < out; xx++) {
        double center = (xx + 0.5) * scale, ww = 0.0, ss = 1.0 / fs;
        int xmin = (int)(center - support + 0.5), xmax = (int)(center + support + 0.5);
        if (xmin < 0)
            xmin = 0;
        if (xmax > in)
            xmax = in;
        xmax -= xmin;
        for (int x = 0; x < xmax; x++) {
            double w = filter((x + xmin - center + 0.5) * ss);
            pre[x] = w;
            ww += w;
        }
        int *k = c->k + (size_t)xx * (size_t)c->ksize;
        for (int x = 0; x < c->ksize; x++) {
            double v = x < xmax && ww != 0.0 ? pre[x] / ww : 0.0;
            k[x] = v < 0 ? (int)(-0.5 + v * (1 << PIL_PRECISION_BITS))
                         : (int)(0.5 + v * (1 << PIL_PRECISION_BITS));
        }
        c->bounds[2 * xx] = xmin;
        c->bounds[2 * xx + 1] = xmax;
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

/* One pass over RGB rows: along x (step 3) when horizontal, else along y. */
static void pil_pass(const uint8_t *src, int sh, int sw, uint8_t *dst, int dh, int dw,
                     const pil_coeffs *c, int horizontal) {
    for (int y = 0; y < dh; y++)
        for (int x = 0; x < dw; x++) {
            int o = horizontal ? x : y, xmin = c->bounds[2 * o], cnt = c->bounds[2 * o + 1];
            const int *k = c->k + (size_t)o * (size_t)c->ksize;
            for (int ch = 0; ch < 3; ch++) {
                int ss = 1 << (PIL_PRECISION_BITS - 1);
                for (int t = 0; t < cnt; t++) {
                    size_t at = horizontal ? ((size_t)y * (size_t)sw + (size_t)(xmin + t))
                                           : ((size_t)(xmin + t) * (size_t)sw + (size_t)x);
                    ss += src[at * 3 + (size_t)ch] * k[t];
                }
                dst[((size_t)y * (size_t)dw + (size_t)x) * 3 + (size_t)ch] = pil_clip8(ss);
            }
        }
    (void)sh;
}

/* PIL's Image.resize((w, h), resample) of RGB src [sh, sw, 3] into dst. */
static vitc_status pil_resize(const uint8_t *src, int sh, int sw, uint8_t *dst, int dh, int dw,
                              int resample) {
    size_t n;
    uint8_t *tmp = NULL;
    const uint8_t *cur = src;
    int ch = sh, cw = sw;
    vitc_status s = VITC_OK;
    if (dw != sw) { /* horizontal first, as PIL */
        pil_coeffs c;
        if (!vitc__mul_size((size_t)sh * 3, (size_t)dw, &n) || !(tmp = malloc(n)))
            return vitc__err(VITC_ERR_NOMEM, "image resize: out of memory");
        VITC_TRY(pil_coeffs_make(sw, dw, resample, &c));
        pil_pass(src, sh, sw, tmp, sh, dw, &c, 1);
        free(c.bounds);
        free(c.k);
        cur = tmp;
        cw = dw;
    }
    if (dh != sh) {
        pil_coeffs c;
        s = pil_coeffs_make(sh, dh, resample, &c);
        if (s == VITC_OK) {
            pil_pass(cur, ch, cw, dst, dh, dw, &c, 0);
            free(c.bounds);
            free(c.k);
        }
    } else {
        memcpy(dst, cur, (size_t)dh * (size_t)dw * 3);
    }
    free(tmp);
    return s;
}

vitc_status vitc__hf_output_size(const vitc__hf_proc *p, int w, int h, int *oh, int *ow,
                                 int *rh, int *rw) {
    *rh = h, *rw = w;
    if (p->do_resize) {
        if (p->shortest > 0) { /* short side = s, long = int(s * long / short) */
            int s = p->shortest;
            if (w <= h)
                *rw = s, *rh = (int)((double)s * h / w);
            else
                *rh = s, *rw = (int)((double)s * w / h);
        } else {
            *rh = p->size_h, *rw = p->size_w;
        }
    }
    if (*rh < 1 || *rw < 1)
        return vitc__err(VITC_ERR_SHAPE, "image %dx%d resizes to nothing", w, h);
    *oh = *rh, *ow = *rw;
    if (p->do_crop)
        *oh = p->crop_h, *ow = p->crop_w;
    return VITC_OK;
}

/* Where the crop's first row (column) lies in the resized image of n: floor
 * centering, or, when the crop is larger, the image placed ceil((c - n) / 2)
 * into zeros, as transformers' numpy center_crop pads. */
static int crop_offset(int n, int c) { return c <= n ? (n - c) / 2 : -((c - n + 1) / 2); }

vitc_status vitc__hf_preprocess(const vitc__hf_proc *p, const vitc_image *img, float *out) {
    if (!img || !img->rgb || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "preprocess: NULL image or output");
    int oh, ow, rh, rw;
    VITC_TRY(vitc__hf_output_size(p, img->width, img->height, &oh, &ow, &rh, &rw));
    size_t n;
    uint8_t *rs = NULL;
    const uint8_t *px = img->rgb;
    if (rh != img->height || rw != img->width) {
        if (!vitc__mul_size((size_t)rh * 3, (size_t)rw, &n) || !(rs = malloc(n)))
            return vitc__err(VITC_ERR_NOMEM, "preprocess: %dx%d image too large", rw, rh);
        vitc_status s = pil_resize(img->rgb, img->height, img->width, rs, rh, rw, p->resample);
        if (s != VITC_OK) {
            free(rs);
            return s;
        }
        px = rs;
    }
    int top = crop_offset(rh, oh), left = crop_offset(rw, ow);
    float mean[3], inv[3];
    for (int c = 0; c < 3; c++) mean[c] = p->mean[c], inv[c] = p->std[c];
    for (int c = 0; c < 3; c++)
        for (int y = 0; y < oh; y++)
            for (int x = 0; x < ow; x++) {
                int sy = top + y, sx = left + x;
                uint8_t v = sy < 0 || sy >= rh || sx < 0 || sx >= rw
                                ? 0
                                : px[((size_t)sy * (size_t)rw + (size_t)sx) * 3 + (size_t)c];
                float f = p->do_rescale ? (float)((double)v * p->rescale) : (float)v;
                if (p->do_normalize)
                    f = (f - mean[c]) / inv[c];
                out[((size_t)c * (size_t)oh + (size_t)y) * (size_t)ow + (size_t)x] = f;
            }
    free(rs);
    return VITC_OK;
}
