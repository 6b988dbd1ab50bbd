/*
 * vmath_avx512.h — the AVX-512 vector vocabulary (16 float lanes) and its
 * maths: v_exp, v_exp2, v_phi, one polynomial each. Included by the files
 * compiled with the AVX-512 flags (ops_avx512.c, attention_avx512.c); the
 * templates (attention_tmpl.h, attention_bwd_tmpl.h) are written over these
 * names, and vmath_avx2.h / vmath_generic.h define the same set.
 *
 *   VT, VW                 vector type and its float lanes
 *   v_zero() v_set1(x) v_load(p) v_store(p, x)    (p 64-byte aligned)
 *   v_loadu(p) v_storeu(p, x) v_fma(a, b, c) = a*b+c  v_mul v_add v_sub v_max
 *   v_loadu_n(p, n) v_storeu_n(p, x, n)   first n < VW lanes, others 0 / untouched
 *   v_tail(x, n, f)        lanes >= n replaced by f
 *   v_hmax(x) v_hsum(x)    horizontal max / sum to a float
 *   v_exp(x)               e^x, Taylor degree 7 after a two-part ln 2 reduction
 *   v_exp2(x)              2^x, exactly 0 for x <= -127 under FTZ, NaN in -> NaN out
 *   v_phi(x)               the standard normal CDF, 0.5 erfc(-x / sqrt 2) (GELU's)
 *   s_exp2(x)              scalar 2^x
 */
#ifndef VITC_VMATH_AVX512_H
#define VITC_VMATH_AVX512_H

#include <immintrin.h>
#include <math.h>

#define VT __m512
#define VW 16

#define v_zero() _mm512_setzero_ps()
#define v_set1(x) _mm512_set1_ps(x)
#define v_load(p) _mm512_load_ps(p)
#define v_store(p, x) _mm512_store_ps(p, x)
#define v_loadu(p) _mm512_loadu_ps(p)
#define v_storeu(p, x) _mm512_storeu_ps(p, x)
#define v_fma(a, b, c) _mm512_fmadd_ps(a, b, c)
#define v_mul(a, b) _mm512_mul_ps(a, b)
#define v_add(a, b) _mm512_add_ps(a, b)
#define v_sub(a, b) _mm512_sub_ps(a, b)
#define v_max(a, b) _mm512_max_ps(a, b)
#define v_lanes(n) ((__mmask16)((1u << (n)) - 1u))
#define v_loadu_n(p, n) _mm512_maskz_loadu_ps(v_lanes(n), p)
#define v_storeu_n(p, x, n) _mm512_mask_storeu_ps(p, v_lanes(n), x)
#define v_tail(x, n, f) _mm512_mask_blend_ps(v_lanes(n), _mm512_set1_ps(f), x)
#define v_hmax(x) _mm512_reduce_max_ps(x)
#define v_hsum(x) _mm512_reduce_add_ps(x)
#define v_exp(x) vitc__v_exp(x)
#define v_exp2(x) vitc__v_exp2(x)
#define v_phi(x) vitc__v_phi(x)
#define s_exp2(x) exp2f(x)

/* e^x: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), degree-7 Taylor
 * polynomial on |r| <= 0.35 (truncation < 1e-8 relative), 2^n by vscalefps,
 * which also gives correct underflow to denormals and zero. The min/max
 * order keeps NaN: the second operand is returned on NaN. */
static inline __m512 vitc__v_exp(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.72f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723212e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* 2^x = 2^n * 2^f, n = round(x), f in [-1/2, 1/2], 2^f by Cephes' exp2f
 * polynomial (about 2 ulp). The clamp at -127 makes vscalefps produce a
 * denormal that FTZ flushes to 0, so masked keys weigh exactly 0; max(lo, x)
 * returns x when x is NaN, so NaN still propagates. */
static inline __m512 vitc__v_exp2(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.535336188319500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Phi(x) = 0.5 erfc(|x| / sqrt 2) for x < 0, 1 - that for x >= 0, with
 * Numerical Recipes' erfcc (t exp(-z^2 + P(t)), fractional error < 1.2e-7): one branch
 * for every lane instead of an erf's two (a Taylor series for small |x| is
 * needed for erf's relative accuracy near 0, not for Phi's, which is about
 * 1/2 there), and no cancellation in the lower tail. */
static inline __m512 vitc__v_phi(__m512 x) {
    __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(0.70710678118654752f));
    __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f),
                             _mm512_fmadd_ps(_mm512_set1_ps(0.5f), z, _mm512_set1_ps(1.0f)));
    __m512 q = _mm512_set1_ps(0.17087277f);
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.82215223f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.48851587f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-1.13520398f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.27886807f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.18628806f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.09678418f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.37409196f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.00002368f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-1.26551223f));
    q = _mm512_fnmadd_ps(z, z, q);
    __m512 lo = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), t), vitc__v_exp(q)); /* Phi(-|x|) */
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), lo), lo);
}

#endif
