/*
 * vmath_avx512.h — the AVX-512 vector vocabulary (16 float lanes) and its
 * maths: v_exp, v_exp2 (one polynomial each), v_phi (a table of them).
 * Included by the files compiled with the AVX-512 flags (ops_avx512.c,
 * attention_avx512.c, ...); the templates in src/kernels/ (attention_tmpl.h,
 * attention_bwd_tmpl.h, ops_tmpl.h, ops_bwd_tmpl.h) are written over these
 * names, and vmath_avx2.h defines the same set (vmath_generic.h the part
 * the generic attention uses, plus v_div, v_zero_gt, V_MASKED_TAIL).
 *
 *   VT, VW                 vector type and its float lanes
 *   v_zero() v_set1(x) v_load(p) v_store(p, x)    (p 64-byte aligned)
 *   v_loadu(p) v_storeu(p, x) v_fma(a, b, c) = a*b+c  v_mul v_add v_sub v_max
 *   v_loadu_n(p, n) v_storeu_n(p, x, n)   first n < VW lanes, others 0 / untouched
 *   v_tail(x, n, f)        lanes >= n replaced by f
 *   v_hmax(x) v_hsum(x)    horizontal max / sum to a float
 *   v_hsum_lanes(v)        v an array of VW vectors: lane i = v_hsum(v[i])
 *   v_exp(x)               e^x, Taylor degree 7 after a two-part ln 2 reduction
 *   v_exp2(x)              2^x, exactly 0 for x <= -127 under FTZ, NaN in -> NaN out
 *   v_phi(x)               the standard normal CDF, 0.5 erfc(-x / sqrt 2) (GELU's),
 *                          from a table of polynomials (vmath_phi_tab.h)
 *   vitc__v_gelu(x)        exact-erf GELU, x Phi(x): the one sequence of operations
 *                          every AVX-512 GELU runs (row op and GEMM epilogues), so
 *                          fused and unfused GELU give the same bits
 *   vitc__v_gelu_tile(...) GELU and masked stores of a finished GEMM tile
 *   s_exp2(x)              scalar 2^x
 *   v_div(a, b)            a / b
 *   v_zero_gt(x, z, f)     x with +0 in the lanes where z > f (not NaN z)
 *   V_MASKED_TAIL          1: a row's tail is one masked vector inside the
 *                          vector sums (AVX-512); 0: scalar or padded, summed
 *                          after them (AVX2). ops_tmpl.h keeps each path's order.
 *   VTD vd_zero() vd_set1(x) vd_add vd_sub vd_fma vd_hsum(x)   double lanes
 *   vd_cvt_lo(v) vd_cvt_hi(v)   the low / high VW/2 floats of v as doubles
 */
#ifndef VITC_VMATH_AVX512_H
#define VITC_VMATH_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "../vmath_phi_tab.h"
_Static_assert(VITC_PHI_DEG == 5, "vitc__v_phi evaluates degree 5: regenerate or edit both");

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
#define v_hsum_lanes(v) vitc__v_hsum16(v)
#define v_exp(x) vitc__v_exp(x)
#define v_exp2(x) vitc__v_exp2(x)
#define v_exp2_lp(x) vitc__v_exp2_lp(x)
#define v_phi(x) vitc__v_phi(x)
#define s_exp2(x) exp2f(x)
#define v_div(a, b) _mm512_div_ps(a, b)
#define v_zero_gt(x, z, f) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(z, _mm512_set1_ps(f), _CMP_NGT_UQ), x)
#define V_MASKED_TAIL 1
#define VTD __m512d
#define vd_zero() _mm512_setzero_pd()
#define vd_set1(x) _mm512_set1_pd(x)
#define vd_add(a, b) _mm512_add_pd(a, b)
#define vd_sub(a, b) _mm512_sub_pd(a, b)
#define vd_fma(a, b, c) _mm512_fmadd_pd(a, b, c)
#define vd_hsum(x) _mm512_reduce_add_pd(x)
#define vd_cvt_lo(v) _mm512_cvtps_pd(_mm512_castps512_ps256(v))
#define vd_cvt_hi(v) _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))

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

/* 2^x = 2^n * 2^f, n = round(x), f in [-1/2, 1/2], 2^f by a polynomial:
 * lp 0, Cephes' exp2f (degree 6, about 2 ulp: v_exp2); lp 1, a degree-4
 * fit to 3e-6 relative (v_exp2_lp: the low-precision attentions' softmax,
 * whose probabilities are then rounded to bf16, 2^-9, or to steps of
 * 1/255; two FMAs fewer on its critical pipe). The clamp at -127 makes
 * vscalefps produce a denormal that FTZ flushes to 0, so masked keys weigh
 * exactly 0; max(lo, x) returns x when x is NaN, so NaN still propagates.
 * lp is a constant where inlined. */
static inline __attribute__((always_inline)) __m512 vitc__v_exp2_deg(__m512 x, const int lp) {
    x = _mm512_max_ps(_mm512_set1_ps(-127.0f), x);
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n), p;
    if (lp) {
        p = _mm512_set1_ps(9.582852945e-03f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.590642616e-02f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402409911e-01f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931241751e-01f));
    } else {
        p = _mm512_set1_ps(1.535336188319500e-4f);
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.339887440266574e-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618437357674640e-3f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550332471162809e-2f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402264791363012e-1f));
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931472028550421e-1f));
    }
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}
static inline __m512 vitc__v_exp2(__m512 x) { return vitc__v_exp2_deg(x, 0); }
static inline __m512 vitc__v_exp2_lp(__m512 x) { return vitc__v_exp2_deg(x, 1); }

/* Phi(x): p = Phi(-|x|) from a table of 31 degree-5 polynomials, one per
 * quarter of a = |x| in [0, 7.625) (vmath_phi_tab.h; row 31, a beyond, is
 * 0: Phi(-7.625) = 1.2e-14), then Phi(x) = p for x < 0, 1 - p otherwise.
 * The row is a lane's k = round(4a), the coefficients one vpermt2ps each
 * from two registers: no division and no exp, against Numerical Recipes'
 * erfcc (a division, 10 terms and an exp) that this replaced, 2.5x faster,
 * and within 2 ulp of Phi(-a) wherever |GELU| > 1e-3 (erfcc: 20 ulp near
 * x = -3.3, from rounding z^2 inside its exp). k comes from the 1.5 * 2^23
 * trick: s + magic rounds s to an integer in the low mantissa bits, which
 * vpermt2ps reads as the index (its low 5 bits). NaN: min() returns its
 * second operand, so the lane reads row 31 and x * Phi(x) stays NaN. */
static inline __m512 vitc__v_phi(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 s = _mm512_min_ps(_mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps(4.0f)),
                             _mm512_set1_ps(31.0f));
    __m512 m = _mm512_add_ps(s, magic);
    __m512i k = _mm512_castps_si512(m);
    __m512 u = _mm512_sub_ps(s, _mm512_sub_ps(m, magic)); /* [-1/2, 1/2] */
#define VITC_PHI_C(j)                                                                   \
    _mm512_permutex2var_ps(_mm512_load_ps(vitc__phi_tab[j]), k,                         \
                           _mm512_load_ps(vitc__phi_tab[j] + 16))
    __m512 p = VITC_PHI_C(5);
    p = _mm512_fmadd_ps(p, u, VITC_PHI_C(4));
    p = _mm512_fmadd_ps(p, u, VITC_PHI_C(3));
    p = _mm512_fmadd_ps(p, u, VITC_PHI_C(2));
    p = _mm512_fmadd_ps(p, u, VITC_PHI_C(1));
    p = _mm512_fmadd_ps(p, u, VITC_PHI_C(0)); /* Phi(-|x|) */
#undef VITC_PHI_C
    __mmask16 neg = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mask_blend_ps(neg, _mm512_sub_ps(_mm512_set1_ps(1.0f), p), p);
}

static inline __m512 vitc__v_gelu(__m512 x) { return _mm512_mul_ps(x, vitc__v_phi(x)); }

/* GELU over a finished GEMM tile kept in memory (v: rows x 2 vectors, the
 * microkernel's 32 columns), stored to C (row stride ldc) under the column
 * masks. One call per tile rather than GELU in each row's epilogue: v_phi's
 * table loads are hoisted once, the rows' chains overlap, and the
 * microkernel's register allocation is not disturbed. noinline: one copy
 * per file that uses it, outside the kernels' loops (unused: no warning in
 * the files that do not). */
__attribute__((noinline, unused)) static void vitc__v_gelu_tile(float *C, int64_t ldc,
                                                                const __m512 *v, int64_t rows,
                                                                __mmask16 m0, __mmask16 m1) {
    for (int64_t i = 0; i < rows; i++) {
        _mm512_mask_storeu_ps(C + i * ldc, m0, vitc__v_gelu(v[2 * i]));
        _mm512_mask_storeu_ps(C + i * ldc + 16, m1, vitc__v_gelu(v[2 * i + 1]));
    }
}

/* OpenAI CLIP's quick-GELU, x / (1 + e^(-1.702 x)): ops_tmpl.h's
 * quick_gelu, operation for operation, so the fused one has its bits. */
static inline __m512 vitc__v_quick_gelu(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                          vitc__v_exp(_mm512_mul_ps(x, _mm512_set1_ps(-1.702f)))));
}

/* The tile's activation, kind 2 quick-GELU (VITC__ACT_QUICK_GELU), else
 * GELU (vitc__v_gelu_tile). */
__attribute__((noinline, unused)) static void vitc__v_act_tile(float *C, int64_t ldc,
                                                               const __m512 *v, int64_t rows,
                                                               __mmask16 m0, __mmask16 m1, int kind) {
    if (kind != 2) {
        vitc__v_gelu_tile(C, ldc, v, rows, m0, m1);
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        _mm512_mask_storeu_ps(C + i * ldc, m0, vitc__v_quick_gelu(v[2 * i]));
        _mm512_mask_storeu_ps(C + i * ldc + 16, m1, vitc__v_quick_gelu(v[2 * i + 1]));
    }
}

/* The operation of a lane reduction (vitc__v_red16): float sum, min,
 * max, or int32 sum (the vectors' bits read as epi32). */
enum { VITC_RED_ADD, VITC_RED_MIN, VITC_RED_MAX, VITC_RED_IADD };

static inline __attribute__((always_inline)) __m512 vitc__v_red_op(__m512 a, __m512 b, int op) {
    return op == VITC_RED_ADD   ? _mm512_add_ps(a, b)
           : op == VITC_RED_MIN ? _mm512_min_ps(a, b)
           : op == VITC_RED_MAX ? _mm512_max_ps(a, b)
                                : _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a),
                                                                       _mm512_castps_si512(b)));
}

/* Lane i = v[i]'s lanes reduced by op (a constant where inlined): a
 * transposing tree (pairs within 128-bit lanes, then across the four
 * lanes) instead of 16 horizontal reductions. Min and max are exact, so
 * any order gives a row's own result (NaN aside). */
static inline __attribute__((always_inline)) __m512 vitc__v_red16(const __m512 v[16], int op) {
    __m512 a[8], b[4];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++)
        a[j] = vitc__v_red_op(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                              _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]), op);
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) /* each 128-bit lane: v[4j..4j+3]'s partial results */
        b[j] = vitc__v_red_op(_mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0x44),
                              _mm512_shuffle_ps(a[2 * j], a[2 * j + 1], 0xEE), op);
    const __m512 d0 = vitc__v_red_op(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                     _mm512_shuffle_f32x4(b[0], b[1], 0xDD), op);
    const __m512 d1 = vitc__v_red_op(_mm512_shuffle_f32x4(b[2], b[3], 0x88),
                                     _mm512_shuffle_f32x4(b[2], b[3], 0xDD), op);
    return vitc__v_red_op(_mm512_shuffle_f32x4(d0, d1, 0x88), _mm512_shuffle_f32x4(d0, d1, 0xDD),
                          op);
}

/* Lane i = the sum of v[i]'s lanes. */
static inline __attribute__((always_inline)) __m512 vitc__v_hsum16(const __m512 v[16]) {
    return vitc__v_red16(v, VITC_RED_ADD);
}

#endif
