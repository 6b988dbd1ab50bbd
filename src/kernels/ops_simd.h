/*
 * ops_simd.h — the per-ISA row ops behind the dispatchers in ops.c
 * (instances of ops_tmpl.h / ops_bwd_tmpl.h in x86/), which the kernel
 * table (dispatch.c) points at. Private to those files and their tests.
 * Same contracts as the kernels.h functions of the same name.
 */
#ifndef VITC_OPS_SIMD_H
#define VITC_OPS_SIMD_H

#include "kernels.h"

/* The generic GroupNorm helpers (the scalar loops; ops.c). */
void vitc__row_stats_ref(const float *x, int64_t n, double shift, double *o);
void vitc__row_norm_ref(float *y, const float *x, int64_t n, float mean, float sc, float sh);
void vitc__dot_rows_ref(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                        int64_t n, int64_t K, int64_t rows);
void vitc__dot_rows_avx512(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                           int64_t n, int64_t K, int64_t rows);
void vitc__dot_rows_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                         int64_t n, int64_t K, int64_t rows);

void vitc__gelu_avx512(float *x, int64_t n);
/* y = GELU(x) out of place (y may be x); the _ref one is in ops.c. */
void vitc__gelu_to_ref(float *y, const float *x, int64_t n);
void vitc__gelu_to_avx512(float *y, const float *x, int64_t n);
void vitc__gelu_to_avx2(float *y, const float *x, int64_t n);
void vitc__softmax_rows_avx512(float *x, int64_t rows, int64_t n, float inv_temperature);
void vitc__softmax_rows_exp2_avx512(float *x, int64_t rows, int64_t n, float s, float *inv);
void vitc__softmax_cols_avx512(float *x, int64_t n, int64_t L, int64_t ld, float scale);
void vitc__layernorm_avx512(float *y, const float *x, const float *w, const float *b, int64_t M,
                            int64_t C, float eps, float *stats);

/* GroupNorm helpers: o[0], o[1] = sum of (x - shift) and of its square,
 * in double; y = (x - mean) * sc + sh. */
void vitc__row_stats_avx512(const float *x, int64_t n, double shift, double *o);
void vitc__row_norm_avx512(float *y, const float *x, int64_t n, float mean, float sc, float sh);
void vitc__row_stats_avx2(const float *x, int64_t n, double shift, double *o);
void vitc__row_norm_avx2(float *y, const float *x, int64_t n, float mean, float sc, float sh);

void vitc__softmax_rows_backward_avx512(float *dx, const float *y, const float *dy, int64_t rows,
                                        int64_t n, float inv_temperature);
void vitc__softmax_rows_backward_avx2(float *dx, const float *y, const float *dy, int64_t rows,
                                      int64_t n, float inv_temperature);

void vitc__gelu_avx2(float *x, int64_t n);
void vitc__softmax_rows_avx2(float *x, int64_t rows, int64_t n, float inv_temperature);
void vitc__softmax_rows_exp2_avx2(float *x, int64_t rows, int64_t n, float s, float *inv);
void vitc__softmax_cols_avx2(float *x, int64_t n, int64_t L, int64_t ld, float scale);
void vitc__layernorm_avx2(float *y, const float *x, const float *w, const float *b, int64_t M,
                          int64_t C, float eps, float *stats);

/* Backward row ops (ops_bwd_tmpl.h; the _ref ones in ops_backward.c). */
void vitc__layernorm_backward_row_ref(float *dx, const float *dy, const float *x, const float *w,
                                      int64_t C, float mean, float rstd);
void vitc__gelu_backward_avx2(float *dx, const float *dy, const float *x, int64_t n);
void vitc__gelu_backward_avx512(float *dx, const float *dy, const float *x, int64_t n);
void vitc__layernorm_backward_row_avx2(float *dx, const float *dy, const float *x, const float *w,
                                       int64_t C, float mean, float rstd);
void vitc__layernorm_backward_row_avx512(float *dx, const float *dy, const float *x,
                                         const float *w, int64_t C, float mean, float rstd);
/* Column sums of the backward (ops_backward.c's refs; kernels.h table). */
void vitc__colsum_ref(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0, int64_t j1);
void vitc__colsum_avx2(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0, int64_t j1);
void vitc__colsum_avx512(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0,
                         int64_t j1);
void vitc__layernorm_backward_cols_ref(float *dw, float *db, const float *dy, const float *x,
                                       const float *stats, int64_t M, int64_t C, int64_t j0,
                                       int64_t j1);
void vitc__layernorm_backward_cols_avx2(float *dw, float *db, const float *dy, const float *x,
                                        const float *stats, int64_t M, int64_t C, int64_t j0,
                                        int64_t j1);
void vitc__layernorm_backward_cols_avx512(float *dw, float *db, const float *dy, const float *x,
                                          const float *stats, int64_t M, int64_t C, int64_t j0,
                                          int64_t j1);

#endif
