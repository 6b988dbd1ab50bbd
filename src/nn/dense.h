/*
 * dense.h — the image-shaped layers of the dense heads (SAM's neck, prompt
 * encoder and mask decoder, the DPT neck and head of Depth Anything):
 * 2-D convolution, transposed convolution, bilinear resampling and
 * LayerNorm2d, each with its backward (dense.c).
 *
 * Maps are channels-last, x [B, H, W, C]: the layout of the encoders'
 * tokens, so a 1x1 convolution is one GEMM, LayerNorm2d is the row
 * LayerNorm (vitc__layernorm over B*H*W rows), and a k x k convolution is
 * an im2col into rows [B*oh*ow, kh*kw*C] and one GEMM. torch's NCHW
 * tensors are permuted at the edges (loading weights, returning results).
 *
 * Every fast path has a reference (plain loops, the definition) that
 * tests compare against; VITC_DENSE=ref forces the references.
 */
#ifndef VITC_NN_DENSE_H
#define VITC_NN_DENSE_H

#include "../internal.h"
#include "../kernels/kernels.h"

/* Output length of a convolution over n: (n + 2p - k) / s + 1. */
static inline int64_t vitc__nn_conv_out(int64_t n, int64_t k, int64_t s, int64_t p) {
    return (n + 2 * p - k) / s + 1;
}

/* nn.Conv2d(C, O, (kh, kw), stride (sh, sw), padding (ph, pw)), no groups
 * or dilation. */
typedef struct vitc__nn_conv_rows vitc__nn_conv_rows;
typedef struct vitc__nn_conv {
    const float *w; /* [O, kh, kw, C] (vitc__nn_conv_pack from torch's [O, C, kh, kw]) */
    const float *b; /* [O] or NULL */
    int64_t C, O, kh, kw, sh, sw, ph, pw;
    /* NULL, or vitc__nn_conv_prepare's copy of w for the row-wise forward */
    vitc__nn_conv_rows *rows;
} vitc__nn_conv;
/* torch's Conv2d weight [O, C, kh, kw] -> [O, kh, kw, C] (and back: _unpack). */
void vitc__nn_conv_pack(float *dst, const float *src, int64_t O, int64_t C, int64_t kh, int64_t kw);
void vitc__nn_conv_unpack(float *dst, const float *src, int64_t O, int64_t C, int64_t kh,
                          int64_t kw);
/* Scratch floats conv_forward / conv_backward need for B images of H x W
 * (0 for a 1x1 convolution of stride 1 without padding). */
int64_t vitc__nn_conv_scratch(const vitc__nn_conv *p, int64_t B, int64_t H, int64_t W);
/* y [B, oh, ow, O] = conv(x [B, H, W, C]). Errors: sizes that give no
 * output, a scratch too small. */
vitc_status vitc__nn_conv_forward(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                                  int64_t H, int64_t W, float *scratch, int64_t scratch_len);
/* y = conv(relu_in ? relu(x) : x) + res (res [B, oh, ow, O] or NULL; it may
 * be y itself): a pre-activation residual unit's ReLU and sum without
 * passes of their own. relu_in needs a kernel larger than 1x1 (the ReLU is
 * applied while x is copied into the scratch). */
vitc_status vitc__nn_conv_forward_ex(const vitc__nn_conv *p, float *y, const float *x, int64_t B,
                                     int64_t H, int64_t W, int relu_in, const float *res,
                                     float *scratch, int64_t scratch_len);
/* vitc__nn_conv_forward_ex, then fn(ctx, b, oy, row [ow, O]) on each
 * output row of y as soon as it is final (the row-wise forward: while it
 * is in cache, on the thread that computed it; else after the whole
 * forward), from several threads at once: a following per-pixel layer
 * without another pass over y from memory. y may be NULL: the rows are
 * then only fn's to read (the row-wise forward keeps one per thread in
 * the scratch; the others allocate the map for the call). */
typedef void (*vitc__nn_row_fn)(void *ctx, int64_t b, int64_t oy, const float *row);
vitc_status vitc__nn_conv_forward_rows(const vitc__nn_conv *p, float *y, const float *x,
                                       int64_t B, int64_t H, int64_t W, int relu_in,
                                       vitc__nn_row_fn fn, void *ctx, float *scratch,
                                       int64_t scratch_len);
/* Inference's forward for a fixed weight: w (and kh, kw, C, O) must not
 * change until vitc__nn_conv_unprepare. A k x k convolution then runs
 * without im2col: each output row is kh products of ow rows with kernel
 * row i's weight [O, kw*C] (packed once, here, in the GEMM's panels),
 * whose operand rows are read in place from a copy of x padded left and
 * right (stride sw*C apart: consecutive taps of a kernel row are
 * consecutive pixels of channels-last x). A 3x3 of stride 1 and padding
 * 1 with channels in fours, at most 128 input channels, runs as Winograd
 * F(4x4, 3x3) instead (its transformed weight also made here: 36 GEMMs of
 * [tiles, C] x [C, O] per 4x4 outputs, 4x fewer FLOPs, within 7e-6 of the
 * largest output where the direct sum is within 1e-7). Without it, or on
 * a GEMM that cannot read its operand in place (OpenBLAS), the im2col
 * forward runs. A 1x1 convolution needs nothing (it is one GEMM).
 * Errors: out of memory. */
vitc_status vitc__nn_conv_prepare(vitc__nn_conv *p);
void vitc__nn_conv_unprepare(vitc__nn_conv *p);
/* dx [B, H, W, C] (overwritten; NULL: not wanted) from dy [B, oh, ow, O];
 * dw [O, kh, kw, C] and db [O] accumulated (+=) when not NULL. */
vitc_status vitc__nn_conv_backward(const vitc__nn_conv *p, float *dx, float *dw, float *db,
                                   const float *dy, const float *x, int64_t B, int64_t H,
                                   int64_t W, float *scratch, int64_t scratch_len);

/* nn.ConvTranspose2d(C, O, (kh, kw), stride (sh, sw), padding (ph, pw)):
 * oh = (H - 1) sh - 2 ph + kh. The fast path is kh == sh, kw == sw,
 * padding 0 (SAM's 2x2 / 2, the DPT reassemble's 4x4 / 4 and 2x2 / 2): one
 * GEMM and a scatter with no overlap; any other is the same GEMM and a
 * col2im that adds the overlapping taps. */
typedef struct vitc__nn_convt {
    const float *w; /* [kh, kw, O, C] (vitc__nn_convt_pack from torch's [C, O, kh, kw]) */
    const float *b; /* [O] or NULL */
    int64_t C, O, kh, kw, sh, sw, ph, pw;
} vitc__nn_convt;
void vitc__nn_convt_pack(float *dst, const float *src, int64_t C, int64_t O, int64_t kh,
                         int64_t kw);
/* [kh, kw, O, C] -> torch's [C, O, kh, kw] (a gradient handed back). */
void vitc__nn_convt_unpack(float *dst, const float *src, int64_t C, int64_t O, int64_t kh,
                           int64_t kw);
int64_t vitc__nn_convt_scratch(const vitc__nn_convt *p, int64_t B, int64_t H, int64_t W);
/* y [B, oh, ow, O] from x [B, H, W, C]. */
vitc_status vitc__nn_convt_forward(const vitc__nn_convt *p, float *y, const float *x, int64_t B,
                                   int64_t H, int64_t W, float *scratch, int64_t scratch_len);
vitc_status vitc__nn_convt_backward(const vitc__nn_convt *p, float *dx, float *dw, float *db,
                                    const float *dy, const float *x, int64_t B, int64_t H,
                                    int64_t W, float *scratch, int64_t scratch_len);

/* F.interpolate(mode="bilinear", align_corners=ac, antialias=False) of x
 * [B, ih, iw, C] to y [B, oh, ow, C] (C = 1: a stack of single-channel
 * maps, which is also NCHW's layout). */
vitc_status vitc__nn_bilinear(float *y, const float *x, int64_t B, int64_t C, int64_t ih,
                              int64_t iw, int64_t oh, int64_t ow, int ac);
/* Its adjoint: dx [B, ih, iw, C] += R^T dy. */
vitc_status vitc__nn_bilinear_backward(float *dx, const float *dy, int64_t B, int64_t C,
                                       int64_t ih, int64_t iw, int64_t oh, int64_t ow, int ac);

/* Which path the dense layers take: "fast", or "ref" when VITC_DENSE=ref
 * (read once) or vitc__nn_dense_force("ref") forces the references. */
const char *vitc__nn_dense_path(void);
/* "ref", "fast" or NULL / "auto" (the environment's choice, else fast);
 * an unknown name is VITC_ERR_INVALID_ARG. For tests and benchmarks. */
vitc_status vitc__nn_dense_force(const char *name);

/* LayerNorm2d (SAM's, normalising each pixel's C channels): on
 * channels-last maps it is vitc__layernorm over B*H*W rows of C, and its
 * backward vitc__layernorm_backward; no function of its own. */

#endif
