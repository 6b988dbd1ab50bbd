/*
 * vmath_avx2.h — the AVX2+FMA vector vocabulary (8 float lanes) and its
 * maths, the same names and contracts as vmath_avx512.h (see there). 2^n is
 * built in the exponent field, so v_exp flushes arguments below -87.3 to 0
 * explicitly, and v_exp2's clamp at -127 gives an exponent field of 0, i.e.
 * exactly +0.
 */
#ifndef VITC_VMATH_AVX2_H
#define VITC_VMATH_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "../vmath_phi_tab.h"
_Static_assert(VITC_PHI8_DEG == 8, "vitc__v_phi evaluates degree 8: regenerate or edit both");

#define VT __m256
#define VW 8

/* Lanes [0, n) of a ymm mask: a sliding window over this table. */
static const int32_t vitc__v_lane_tbl[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define v_lanes(n) _mm256_loadu_si256((const __m256i *)(vitc__v_lane_tbl + 8 - (n)))
/* v_lanes of any n (clamped to [0, 8]): the GEMM epilogues' column tails */
#define v_lanes_any(n) v_lanes((n) < 0 ? 0 : (n) > 8 ? 8 : (n))
/* 8 floats at p, lanes of mask m (v_lanes_any(n)): a plain load when n >= 8 */
static inline __m256 vitc__v_ld8(const float *p, int64_t n, __m256i m) {
    return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}

#define v_zero() _mm256_setzero_ps()
#define v_set1(x) _mm256_set1_ps(x)
#define v_load(p) _mm256_load_ps(p)
#define v_store(p, x) _mm256_store_ps(p, x)
#define v_loadu(p) _mm256_loadu_ps(p)
#define v_storeu(p, x) _mm256_storeu_ps(p, x)
#define v_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define v_mul(a, b) _mm256_mul_ps(a, b)
#define v_add(a, b) _mm256_add_ps(a, b)
#define v_sub(a, b) _mm256_sub_ps(a, b)
#define v_max(a, b) _mm256_max_ps(a, b)
#define v_loadu_n(p, n) _mm256_maskload_ps(p, v_lanes(n))
#define v_storeu_n(p, x, n) _mm256_maskstore_ps(p, v_lanes(n), x)
#define v_tail(x, n, f) _mm256_blendv_ps(_mm256_set1_ps(f), x, _mm256_castsi256_ps(v_lanes(n)))
#define v_hmax(x) vitc__v_hmax(x)
#define v_hsum(x) vitc__v_hsum(x)
#define v_hsum_lanes(v) vitc__v_hsum8(v)
#define v_exp(x) vitc__v_exp(x)
#define v_exp2(x) vitc__v_exp2(x)
#define v_exp2_lp(x) vitc__v_exp2_lp(x)
#define v_phi(x) vitc__v_phi(x)
#define s_exp2(x) exp2f(x)
#define v_div(a, b) _mm256_div_ps(a, b)
#define v_zero_gt(x, z, f) _mm256_andnot_ps(_mm256_cmp_ps(z, _mm256_set1_ps(f), _CMP_GT_OQ), x)
#define V_MASKED_TAIL 0
#define VTD __m256d
#define vd_zero() _mm256_setzero_pd()
#define vd_set1(x) _mm256_set1_pd(x)
#define vd_add(a, b) _mm256_add_pd(a, b)
#define vd_sub(a, b) _mm256_sub_pd(a, b)
#define vd_fma(a, b, c) _mm256_fmadd_pd(a, b, c)
#define vd_hsum(x) vitc__vd_hsum(x)
#define vd_cvt_lo(v) _mm256_cvtps_pd(_mm256_castps256_ps128(v))
#define vd_cvt_hi(v) _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))

static inline float vitc__v_hmax(__m256 x) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* Lane i = the sum of v[i]'s lanes: a transposing tree of adds (pairs
 * within 128-bit lanes, then across them) instead of 8 horizontal sums. */
static inline __attribute__((always_inline)) __m256 vitc__v_hsum8(const __m256 v[8]) {
    __m256 a[4], b[2];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        a[j] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                             _mm256_unpackhi_ps(v[2 * j], v[2 * j + 1]));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) /* a 128-bit lane: v[4j..4j+3]'s partial sums */
        b[j] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * j], a[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(a[2 * j], a[2 * j + 1], 0xEE));
    return _mm256_add_ps(_mm256_permute2f128_ps(b[0], b[1], 0x20),
                         _mm256_permute2f128_ps(b[0], b[1], 0x31));
}

static inline float vitc__v_hsum(__m256 x) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* (a0 + a1) + (a2 + a3), in that order (the row statistics' bits). */
static inline double vitc__vd_hsum(__m256d x) {
    double a[4];
    _mm256_storeu_pd(a, x);
    return (a[0] + a[1]) + (a[2] + a[3]);
}

static inline __m256 vitc__v_exp(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_set1_ps(88.37f), _mm256_max_ps(_mm256_set1_ps(-87.33f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

/* vmath_avx512.h's v_exp2 (lp 0) and v_exp2_lp (lp 1), 2^n built in the
 * exponent field. */
static inline __attribute__((always_inline)) __m256 vitc__v_exp2_deg(__m256 x, const int lp) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n), p;
    if (lp) {
        p = _mm256_set1_ps(9.582852945e-03f);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.590642616e-02f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402409911e-01f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931241751e-01f));
    } else {
        p = _mm256_set1_ps(1.535336188319500e-4f);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    }
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
static inline __m256 vitc__v_exp2(__m256 x) { return vitc__v_exp2_deg(x, 0); }
static inline __m256 vitc__v_exp2_lp(__m256 x) { return vitc__v_exp2_deg(x, 1); }

/* Phi(x), the standard normal CDF, as vmath_avx512.h's vitc__v_phi but with
 * vpermps's 8 rows (vmath_phi_tab.h): 7 degree-8 polynomials of Phi(-a)
 * over a in [0, 5.6), the row k = floor(G a (a + B)) narrowing as a grows,
 * and row 7 (a beyond: |GELU| < 6.1e-8) 0. a is clamped first, so that u
 * stays finite on row 7 (0 * inf is NaN) and NaN reads row 7 (min() returns
 * its second operand); x * Phi(x) stays NaN. Within 3 ulp wherever
 * |GELU| > 1e-3, against erfcc's 20 (it needed a division and an exp). */
static inline __m256 vitc__v_phi(__m256 x) {
    __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x),
                             _mm256_set1_ps(VITC_PHI8_AMAX));
    __m256 s = _mm256_mul_ps(
        _mm256_fmadd_ps(a, _mm256_set1_ps(VITC_PHI8_G), _mm256_set1_ps(VITC_PHI8_GB)), a);
    __m256i k = _mm256_cvttps_epi32(_mm256_min_ps(s, _mm256_set1_ps(7.0f)));
    __m256 u = _mm256_sub_ps(a, _mm256_permutevar8x32_ps(_mm256_load_ps(vitc__phi8_ctr), k));
#define VITC_PHI8_C(j) _mm256_permutevar8x32_ps(_mm256_load_ps(vitc__phi8_tab[j]), k)
    __m256 p = VITC_PHI8_C(8);
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(7));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(6));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(5));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(4));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(3));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(2));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(1));
    p = _mm256_fmadd_ps(p, u, VITC_PHI8_C(0)); /* Phi(-|x|) */
#undef VITC_PHI8_C
    __m256 neg = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), p), p, neg);
}

#endif
