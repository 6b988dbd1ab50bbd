/*
 * ops_layers_backward.h — backward of the norms and data moves the attention
 * layers use (ops_layers_backward.c). Argument order as in kernels.h: outputs,
 * inputs, sizes. Input gradients are overwritten; parameter gradients
 * (dw, db) accumulate, as torch's .grad does.
 */
#ifndef VITC_OPS_LAYERS_BACKWARD_H
#define VITC_OPS_LAYERS_BACKWARD_H

#include "kernels.h"

/* GroupNorm(G, C) of x [B, C, HW]: dx [B, C, HW] from dy [B, C, HW];
 * dw, db [C] accumulate (either may be NULL). Statistics are recomputed
 * from x in double, as the forward computes them. */
void vitc__groupnorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *w, int64_t B, int64_t C, int64_t HW, int64_t G,
                              float eps);
void vitc__groupnorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *w, int64_t B, int64_t C,
                                  int64_t HW, int64_t G, float eps);

/* BatchNorm2d of x [B, C, HW] normalised with mean, var [C] (biased).
 * training = 1: mean and var are the batch's own statistics, so their
 * gradients flow back into dx (torch's training mode); training = 0: they
 * are constants (the running statistics of eval mode). */
void vitc__batchnorm_backward(float *dx, float *dw, float *db, const float *dy, const float *x,
                              const float *mean, const float *var, const float *w, float eps,
                              int training, int64_t B, int64_t C, int64_t HW);
void vitc__batchnorm_backward_ref(float *dx, float *dw, float *db, const float *dy,
                                  const float *x, const float *mean, const float *var,
                                  const float *w, float eps, int training, int64_t B, int64_t C,
                                  int64_t HW);

/* The adjoint of vitc__patchify: dcols [B, (H/p)*(W/p), C*p*p] -> dx
 * [B, C, H, W] (patches do not overlap, so this is a scatter; H and W are
 * multiples of p). */
void vitc__unpatchify(float *dx, const float *dcols, int64_t B, int64_t C, int64_t H, int64_t W,
                      int64_t p);

#endif
