/*
 * ops_layers.h — data moves used only by the attention layers (ops_layers.c).
 * Argument order as in kernels.h: outputs, inputs, sizes.
 */
#ifndef VITC_OPS_LAYERS_H
#define VITC_OPS_LAYERS_H

#include "kernels.h"

/* Patches of a stride = kernel = p conv as GEMM rows: x [B,C,H,W] ->
 * cols [B, (H/p)*(W/p), C*p*p], each row in the conv weight's (c, ki, kj)
 * order, rows in the order of conv(x).flatten(2).transpose(1, 2). */
void vitc__patchify(float *cols, const float *x, int64_t B, int64_t C, int64_t H, int64_t W,
                    int64_t p);
/* Per-channel mean and biased variance of x [B, C, HW] over B and HW. */
void vitc__channel_stats(float *mean, float *var, const float *x, int64_t B, int64_t C,
                         int64_t HW);
/* y = (x - mean) / sqrt(var + eps) * w + bias per channel of [B, C, HW]. */
void vitc__batchnorm_apply(float *y, const float *x, const float *mean, const float *var,
                           const float *w, const float *bias, float eps, int64_t B, int64_t C,
                           int64_t HW);
/* x [B, C, HW] -> y [B, HW, C] (an image's pixels as tokens), threaded and
 * blocked for the cache. */
void vitc__channels_to_tokens(float *y, const float *x, int64_t B, int64_t C, int64_t HW);
/* GroupNorm's affine applied on the way to the tokens: channel c of image b
 * (row r = b*C + c, group g = r / cg) becomes (x - stat[2g]) * (stat[2g+1]
 * * w[c]) + b[c]. stat [B*G][2]: mean and rstd. */
typedef struct vitc__c2t_norm {
    const float *stat, *w, *b;
    int64_t cg;
} vitc__c2t_norm;
/* vitc__channels_to_tokens with gn's affine (gn NULL: a plain copy), in
 * the caller's thread unless par. */
void vitc__channels_to_tokens_norm(float *y, const float *x, int64_t B, int64_t C, int64_t HW,
                                   const vitc__c2t_norm *gn, int par);
/* out[b,c,n] = alpha * y[b,n,c] + x[b,c,n]: tokens back to channels first,
 * plus the block's input. out [B,C,N], y [B,N,C], x [B,C,N]. */
void vitc__transpose_add(float *out, const float *y, const float *x, float alpha, int64_t B,
                         int64_t C, int64_t N);

#endif
