/*
 * sam_post.c — SAM's masks from the decoder's low-resolution logits to the
 * original image's size, as SamProcessor.post_process_masks computes them
 * (binarize=False): bilinear to the input side, cropped to the resized
 * image, bilinear to the original size. The two resamplings are composed
 * per axis, so the input-sized map is never formed. Binarized (logit > 0,
 * as SamPredictor's masks) row by row when asked: a byte a pixel is
 * written instead of the float.
 */
#include <stdint.h>
#include <stdlib.h>

#include "../kernels/kernels.h"
#include "sam.h"

/* F.interpolate(bilinear, align_corners=False) taps of output index i:
 * rows idx[0], idx[1] of the input with weights w[0], w[1]. */
static void bil_taps(int64_t in, int64_t outn, int64_t i, int64_t idx[2], float w[2]) {
    const float scale = (float)in / (float)outn;
    float src = scale * ((float)i + 0.5f) - 0.5f;
    if (src < 0.0f)
        src = 0.0f;
    int64_t i0 = (int64_t)src;
    if (i0 > in - 1)
        i0 = in - 1;
    float l1 = src - (float)i0;
    if (l1 > 1.0f)
        l1 = 1.0f;
    idx[0] = i0, idx[1] = i0 + (i0 < in - 1 ? 1 : 0);
    w[0] = 1.0f - l1, w[1] = l1;
}

/* post_process_masks along one axis: low-res n -> input side S, the first
 * R kept, -> out. The two resamplings composed: output index i reads
 * low-res rows base[i], base[i] + 1, base[i] + 2 with weights w[3i..3i+2].
 * (Its two input-side rows are adjacent, each two low-res taps a quarter
 * apart at S = 4n: three rows at most, two when both fall in one interval,
 * against four taps uncomposed; each row's weights summed in double.) */
static void axis_taps(int64_t n, int64_t S, int64_t R, int64_t out, int64_t *base, float *w) {
    for (int64_t i = 0; i < out; i++) {
        int64_t r[2], q[4];
        float a[2], b[2];
        double wq[4];
        bil_taps(R, out, i, r, a);
        for (int k = 0; k < 2; k++) {
            int64_t qq[2];
            bil_taps(n, S, r[k], qq, b);
            for (int j = 0; j < 2; j++) q[2 * k + j] = qq[j], wq[2 * k + j] = (double)a[k] * b[j];
        }
        int64_t lo = q[0];
        for (int j = 1; j < 4; j++) lo = q[j] < lo ? q[j] : lo;
        if (lo > n - 3) /* near the end: the three rows end at n - 1 */
            lo = n - 3 > 0 ? n - 3 : 0;
        double t[3] = {0, 0, 0};
        for (int j = 0; j < 4; j++) t[q[j] - lo] += wq[j];
        base[i] = lo;
        for (int j = 0; j < 3; j++) w[3 * i + j] = (float)t[j];
    }
}

typedef struct post_ctx {
    const float *low; /* [n, lh, lw] */
    float *tmp;       /* [n, lh, ow] rows resampled along x */
    float *out;       /* [n, oh, ow], or NULL: */
    unsigned char *bin; /* [n, oh, ow] out > 0 instead */
    int64_t lh, lw, oh, ow;
    int64_t y0, ny; /* the low-res rows the y taps read: [y0, y0 + ny) */
    const int64_t *xi, *yi;
    const float *xw, *yw;
    int64_t rows; /* of the pass running */
    void (*fn)(void *c, int64_t b, int64_t e, int tid);
} post_ctx;

static void post_rows_x(void *vc, int64_t b, int64_t e, int tid) {
    (void)tid;
    const post_ctx *c = vc;
    for (int64_t t = b; t < e; t++) {
        const int64_t r = t / c->ny * c->lh + c->y0 + t % c->ny; /* mask t / ny's row */
        const float *src = c->low + r * c->lw;
        float *dst = c->tmp + r * c->ow;
        for (int64_t x = 0; x < c->ow; x++) {
            const float *s = src + c->xi[x], *wx = c->xw + 3 * x;
            dst[x] = wx[0] * s[0] + wx[1] * s[1] + wx[2] * s[2];
        }
    }
}

/* dst = w0 t0 + w1 t1 (+ w2 t2 when w2 is not 0) over n floats, thresholded
 * into bytes (dst > 0: 1, NaN 0) when bin: blocks of a fixed 16 (and no
 * aliasing) so that the compiler vectorises them at -O2. */
static void mix3(float *restrict dst, unsigned char *restrict bin, const float *restrict t0,
                 const float *restrict t1, const float *restrict t2, const float *w,
                 int64_t n) {
    const float w0 = w[0], w1 = w[1], w2 = w[2];
    int64_t x = 0;
#define MIX(v) (w2 != 0.0f ? w0 * t0[v] + w1 * t1[v] + w2 * t2[v] : w0 * t0[v] + w1 * t1[v])
    if (w2 != 0.0f && dst)
        for (; x + 16 <= n; x += 16)
            for (int k = 0; k < 16; k++)
                dst[x + k] = w0 * t0[x + k] + w1 * t1[x + k] + w2 * t2[x + k];
    else if (dst)
        for (; x + 16 <= n; x += 16)
            for (int k = 0; k < 16; k++) dst[x + k] = w0 * t0[x + k] + w1 * t1[x + k];
    else if (w2 != 0.0f)
        for (; x + 16 <= n; x += 16)
            for (int k = 0; k < 16; k++)
                bin[x + k] = w0 * t0[x + k] + w1 * t1[x + k] + w2 * t2[x + k] > 0.0f;
    else
        for (; x + 16 <= n; x += 16)
            for (int k = 0; k < 16; k++) bin[x + k] = w0 * t0[x + k] + w1 * t1[x + k] > 0.0f;
    for (; x < n; x++) {
        if (dst)
            dst[x] = MIX(x);
        else
            bin[x] = MIX(x) > 0.0f;
    }
#undef MIX
}

static void post_rows_y(void *vc, int64_t b, int64_t e, int tid) {
    (void)tid;
    const post_ctx *c = vc;
    for (int64_t r = b; r < e; r++) {
        int64_t m = r / c->oh, y = r % c->oh;
        const float *t = c->tmp + (m * c->lh + c->yi[y]) * c->ow;
        mix3(c->out ? c->out + r * c->ow : NULL, c->out ? NULL : c->bin + r * c->ow, t,
             t + c->ow, t + 2 * c->ow, c->yw + 3 * y, c->ow);
    }
}

static void post_block(void *vc, int64_t i, int tid) {
    const post_ctx *c = vc;
    c->fn(vc, 16 * i, 16 * i + 16 < c->rows ? 16 * i + 16 : c->rows, tid);
}

vitc_status vitc__sam_post_masks(float *masks, unsigned char *bin, const float *low, int64_t n,
                                 int64_t lo, int input_size, int resized_w, int resized_h,
                                 int64_t ow, int64_t oh) {
    int64_t *xi = malloc((size_t)(ow + oh) * sizeof(int64_t));
    float *xw = malloc((size_t)(3 * (ow + oh) + n * lo * ow) * sizeof(float));
    if (!xi || !xw) {
        free(xi), free(xw);
        return vitc__err(VITC_ERR_NOMEM, "out of memory for SAM's %lldx%lld masks",
                         (long long)ow, (long long)oh);
    }
    int64_t *yi = xi + ow;
    float *yw = xw + 3 * ow, *tmp = yw + 3 * oh;
    axis_taps(lo, input_size, resized_w, ow, xi, xw);
    axis_taps(lo, input_size, resized_h, oh, yi, yw);
    post_ctx c = {.low = low, .tmp = tmp, .out = masks, .bin = bin, .lh = lo, .lw = lo,
                  .oh = oh, .ow = ow, .xi = xi, .yi = yi, .xw = xw, .yw = yw};
    /* the crop to the resized image leaves the low-res rows below it
     * unread (a third of them for a 3:2 photo): not resampled. Each output
     * row reads three (a zero weight times a row still reads it). */
    int64_t y1 = 0;
    c.y0 = lo;
    for (int64_t k = 0; k < oh; k++) {
        c.y0 = yi[k] < c.y0 ? yi[k] : c.y0;
        y1 = yi[k] + 2 > y1 ? yi[k] + 2 : y1;
    }
    if (y1 > lo - 1)
        y1 = lo - 1;
    c.ny = y1 - c.y0 + 1;
    /* blocks of 16 rows claimed as threads come free (a thread held up by
     * another process leaves its rows to the other) */
    c.rows = n * c.ny, c.fn = post_rows_x;
    vitc__parallel_for_dynamic((c.rows + 15) / 16, 1, post_block, &c);
    c.rows = n * oh, c.fn = post_rows_y;
    vitc__parallel_for_dynamic((c.rows + 15) / 16, 1, post_block, &c);
    free(xi), free(xw);
    return VITC_OK;
}
