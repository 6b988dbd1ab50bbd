/*
 * gemm_lp_madd_avx2.c — the int8 kernels for CPUs with AVX2 and no VNNI
 * (AMD Zen 2 and 3, Intel before Ice Lake).
 *
 * avx2, the default: vpmaddwd on int16 words (gemm_lp.h, i16), the exact
 * products, so the same numbers as the reference and as vpdpbusd. Why
 * int16 words and not vpdpbusd's four bytes: vpmaddubsw (u8 x s8) can
 * saturate its int16 pair sums (255 * 127 * 2 > 32767), and widening the
 * bytes inside the loop cost more than it saved: on a Zen 3, a 6 x 16
 * tile ran at 80-87 GOP/s widening both operands in the loop and 134-150
 * with both widened when packed, against 83-98 GFLOP/s of fp32 FMA on the
 * same core. The tile: the driver's 12 x 32 as four 6 x 16 passes (12 ymm
 * accumulators, two of B, one broadcast of A); a 16-column half of a B
 * strip (64 bytes a word row) is 24 KB at K = 768, which L1 keeps for the
 * second pass.
 *
 * avx2-w7, opted into (VITC_LP_KERNEL): weights on [-64, 64] (wmax), where
 * vpmaddubsw cannot saturate, on vpdpbusd's words: vpmaddubsw, vpmaddwd
 * against ones, vpaddd. On the Zen 3 that triple runs 1.27x the pair's
 * multiply-adds (197 against 155 GOP/s a core), and a weight is one byte.
 * Its attention panels (K's rows, V's column quads, P's rows) are here too.
 */
#include <immintrin.h>

#include "../gemm_lp.h"
#include "vmath_avx2.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR

/* gemm_lp.h's int8 epilogue on columns j..j+7 of the tile's rows (masked
 * to n), the reference's operations in its order, GELU fused (fused_gelu);
 * the columns' operands loaded once for every row. */
static inline void vitc__out8(float *C, int64_t ldc, const int32_t *acc, int64_t mr, int64_t j,
                              int64_t n, const vitc__lp_epi *e) {
    const __m256i m = v_lanes_any(n);
    const __m256i ws = n >= 8 ? _mm256_loadu_si256((const __m256i *)(e->wsum + j))
                              : _mm256_maskload_epi32(e->wsum + j, m);
    const __m256 sc = vitc__v_ld8(e->wscale + j, n, m);
    const __m256 bias = e->bias ? vitc__v_ld8(e->bias + j, n, m) : _mm256_setzero_ps();
    const __m256 ls = e->ls ? vitc__v_ld8(e->ls + j, n, m) : _mm256_setzero_ps();
    for (int64_t i = 0; i < mr; i++) {
        __m256i a = _mm256_load_si256((const __m256i *)(acc + i * NR + j));
        __m256 v = _mm256_cvtepi32_ps(
            _mm256_sub_epi32(a, _mm256_mullo_epi32(_mm256_set1_epi32(e->azp[i]), ws)));
        v = _mm256_mul_ps(v, _mm256_mul_ps(_mm256_set1_ps(e->ascale[i]), sc));
        if (e->bias) v = _mm256_add_ps(v, bias);
        if (e->ls) v = _mm256_mul_ps(ls, v);
        if (e->res) v = _mm256_add_ps(v, vitc__v_ld8(e->res + i * e->ldr + j, n, m));
        /* the operations of ops_tmpl.h's gelu_to / quick_gelu on this path,
         * lane by lane: the bits of the row pass they replace (fc1's GELU
         * had been 3% of the int8 forward as a pass over each tile) */
        if (e->gelu == VITC__ACT_GELU)
            v = v_mul(v, v_phi(v));
        else if (e->gelu == VITC__ACT_QUICK_GELU)
            v = v_div(v, v_add(v_set1(1.0f), v_exp(v_mul(v, v_set1(-1.702f)))));
        if (n >= 8)
            _mm256_storeu_ps(C + i * ldc + j, v);
        else
            _mm256_maskstore_ps(C + i * ldc + j, m, v);
    }
}

#define VITC_DECL(i) __m256i c##i##0 = _mm256_setzero_si256(), c##i##1 = c##i##0;
#define VITC_ROW(i)                                                                        \
    do {                                                                                   \
        __m256i a = _mm256_set1_epi32((int)a0[i]);                                         \
        c##i##0 = _mm256_add_epi32(c##i##0, _mm256_madd_epi16(a, b0));                     \
        c##i##1 = _mm256_add_epi32(c##i##1, _mm256_madd_epi16(a, b1));                     \
    } while (0)
#define VITC_PUT(i)                                                                        \
    _mm256_store_si256((__m256i *)(acc + (r0 + i) * NR + j0), c##i##0);                   \
    _mm256_store_si256((__m256i *)(acc + (r0 + i) * NR + j0 + 8), c##i##1);

/* The sums of rows r0..r0+5 x columns j0..j0+15 into acc [MR][NR]: pa
 * [kg][MR], pb [kg][NR] words (the strip's rows past M are zero words, so
 * all six are read). A function of its own, the epilogue apart: inlined
 * beside it, GCC 12 kept one accumulator on the stack, a store and a load
 * on every step's critical path (the whole forward ran at 1.1x fp32). */
__attribute__((noinline)) static void vitc__pass(int64_t kg, const uint32_t *pa,
                                                 const uint32_t *pb, int32_t *acc, int64_t r0,
                                                 int64_t j0) {
    VITC_DECL(0) VITC_DECL(1) VITC_DECL(2) VITC_DECL(3) VITC_DECL(4) VITC_DECL(5)
    const uint32_t *a0 = pa + r0, *b = pb + j0;
    for (int64_t p = 0; p < kg; p++) {
        __m256i b0 = _mm256_load_si256((const __m256i *)b);
        __m256i b1 = _mm256_load_si256((const __m256i *)(b + 8));
        VITC_ROW(0); VITC_ROW(1); VITC_ROW(2); VITC_ROW(3); VITC_ROW(4); VITC_ROW(5);
        a0 += MR;
        b += NR;
    }
    VITC_PUT(0) VITC_PUT(1) VITC_PUT(2) VITC_PUT(3) VITC_PUT(4) VITC_PUT(5)
}

static void vitc__ukr_int8_madd(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    _Alignas(32) int32_t acc[MR * NR]; /* [MR][NR] */
    vitc__lp_pf_tile(C, ldc, mr, nr, e);
    for (int64_t j0 = 0; j0 < nr; j0 += 16)
        for (int64_t r0 = 0; r0 < mr; r0 += 6) vitc__pass(kg, pa, pb, acc, r0, j0);
    for (int64_t j = 0; j < nr; j += 8) vitc__out8(C, ldc, acc, mr, j, nr - j, e);
}

/* ---- vpmaddubsw: bytes, weights in [-64, 64] -------------------------- */

/* c += the word sums of a (u8) x b (s8): pairs summed to int16 by
 * vpmaddubsw, then pairs of those to int32 by vpmaddwd against ones,
 * vpdpbusd's sum of a word in three instructions. Exact when no pair sum
 * saturates: |b| <= 64 makes each at most 255 * 64 * 2 = 32640
 * (gemm_lp.h, wmax). */
#define VITC_U8S8(c, a, b) \
    c = _mm256_add_epi32(c, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one))

/* Rows r0, r0+1 x the tile's 32 columns into acc [MR][NR] from words of
 * four bytes: eight accumulators, the ones, four of B, the broadcast and
 * the product in 15 ymm; two broadcasts for eight products. */
#define VITC_ROWB2(i)                                                                      \
    do {                                                                                   \
        __m256i a = _mm256_set1_epi32((int)a0[i]);                                         \
        VITC_U8S8(c##i##0, a, b0);                                                         \
        VITC_U8S8(c##i##1, a, b1);                                                         \
        VITC_U8S8(c##i##2, a, b2);                                                         \
        VITC_U8S8(c##i##3, a, b3);                                                         \
    } while (0)
__attribute__((noinline)) static void vitc__pass_b(int64_t kg, const uint32_t *pa,
                                                   const uint32_t *pb, int32_t *acc, int64_t r0) {
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c02 = c00, c03 = c00;
    __m256i c10 = c00, c11 = c00, c12 = c00, c13 = c00;
    const __m256i one = _mm256_set1_epi16(1);
    const uint32_t *a0 = pa + r0, *b = pb;
    for (int64_t p = 0; p < kg; p++) {
        __m256i b0 = _mm256_load_si256((const __m256i *)b);
        __m256i b1 = _mm256_load_si256((const __m256i *)(b + 8));
        __m256i b2 = _mm256_load_si256((const __m256i *)(b + 16));
        __m256i b3 = _mm256_load_si256((const __m256i *)(b + 24));
        VITC_ROWB2(0); VITC_ROWB2(1);
        a0 += MR;
        b += NR;
    }
    int32_t *o = acc + r0 * NR;
    _mm256_store_si256((__m256i *)o, c00), _mm256_store_si256((__m256i *)(o + 8), c01);
    _mm256_store_si256((__m256i *)(o + 16), c02), _mm256_store_si256((__m256i *)(o + 24), c03);
    o += NR;
    _mm256_store_si256((__m256i *)o, c10), _mm256_store_si256((__m256i *)(o + 8), c11);
    _mm256_store_si256((__m256i *)(o + 16), c12), _mm256_store_si256((__m256i *)(o + 24), c13);
}

static void vitc__ukr_int8_maddubs(int64_t kg, const uint32_t *pa, const uint32_t *pb,
                                   float *C, int64_t ldc, int64_t mr, int64_t nr,
                                   const vitc__lp_epi *e) {
    _Alignas(32) int32_t acc[MR * NR]; /* [MR][NR] */
    vitc__lp_pf_tile(C, ldc, mr, nr, e);
    for (int64_t r0 = 0; r0 < mr; r0 += 2) vitc__pass_b(kg, pa, pb, acc, r0);
    for (int64_t j = 0; j < nr; j += 8) vitc__out8(C, ldc, acc, mr, j, nr - j, e);
}

/* The row's min and max, the reference's: vminps(v, m) returns m when v
 * is NaN, so a NaN is skipped unless it is x[0] (then it stays, as the
 * reference's comparisons keep it). Four chains. */
static void vitc__minmax(const float *x, int64_t K, float *mn, float *mx) {
    __m256 n0 = _mm256_set1_ps(x[0]), x0 = n0;
    int64_t k = 0;
    if (K >= 32) {
        __m256 n1 = n0, n2 = n0, n3 = n0, x1 = n0, x2 = n0, x3 = n0;
        for (; k + 32 <= K; k += 32) {
            __m256 v0 = _mm256_loadu_ps(x + k), v1 = _mm256_loadu_ps(x + k + 8);
            __m256 v2 = _mm256_loadu_ps(x + k + 16), v3 = _mm256_loadu_ps(x + k + 24);
            n0 = _mm256_min_ps(v0, n0), x0 = _mm256_max_ps(v0, x0);
            n1 = _mm256_min_ps(v1, n1), x1 = _mm256_max_ps(v1, x1);
            n2 = _mm256_min_ps(v2, n2), x2 = _mm256_max_ps(v2, x2);
            n3 = _mm256_min_ps(v3, n3), x3 = _mm256_max_ps(v3, x3);
        }
        n0 = _mm256_min_ps(_mm256_min_ps(n0, n1), _mm256_min_ps(n2, n3));
        x0 = _mm256_max_ps(_mm256_max_ps(x0, x1), _mm256_max_ps(x2, x3));
    }
    for (; k + 8 <= K; k += 8) {
        __m256 v = _mm256_loadu_ps(x + k);
        n0 = _mm256_min_ps(v, n0), x0 = _mm256_max_ps(v, x0);
    }
    _Alignas(32) float ln[8], lx[8];
    _mm256_store_ps(ln, n0), _mm256_store_ps(lx, x0);
    float a = ln[0], b = lx[0];
    for (int l = 1; l < 8; l++) a = ln[l] < a ? ln[l] : a, b = lx[l] > b ? lx[l] : b;
    for (; k < K; k++) a = x[k] < a ? x[k] : a, b = x[k] > b ? x[k] : b;
    *mn = a, *mx = b;
}

/* One row to the reference's vitc__q8 values at dst[p * stride]: int16
 * words (quads 0, two k a word) or vpdpbusd's bytes (quads 1, four). The
 * clamps are saturations, as in the AVX-512 converter: cvtps2dq, packs to
 * int16, the zero point added saturating, then [0, 255]. */
static inline void vitc__row_qv(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                float inv, int32_t zp, int quads) {
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i vz = _mm256_set1_epi16((short)zp), lo = _mm256_setzero_si256(),
                  hi = _mm256_set1_epi16(255);
    const int kw = quads ? 4 : 2;
    _Alignas(32) uint32_t w8[8];
    for (int64_t k = 0; k < K; k += 16) {
        int64_t left = K - k;
        __m256 v0, v1;
        if (left >= 16) {
            v0 = _mm256_loadu_ps(x + k), v1 = _mm256_loadu_ps(x + k + 8);
        } else {
            v0 = _mm256_maskload_ps(x + k, v_lanes_any(left));
            v1 = _mm256_maskload_ps(x + k + 8, v_lanes_any(left - 8));
        }
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, vinv));
        __m256i q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, vinv));
        /* packs interleaves by 128-bit lane; the permute restores k order */
        __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
        w = _mm256_min_epi16(_mm256_max_epi16(_mm256_adds_epi16(w, vz), lo), hi);
        int64_t full = 16 / kw, words = left >= 16 ? full : (left + kw - 1) / kw;
        if (left < 16) { /* k past K is packed as 0 */
            const __m256i kidx = _mm256_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                                   14, 15);
            w = _mm256_and_si256(w, _mm256_cmpgt_epi16(_mm256_set1_epi16((short)left), kidx));
        }
        if (quads) {
            __m128i b = _mm_packus_epi16(_mm256_castsi256_si128(w),
                                         _mm256_extracti128_si256(w, 1));
            if (stride == 1 && words == full) {
                _mm_storeu_si128((__m128i *)(dst + k / 4), b);
                continue;
            }
            _mm_store_si128((__m128i *)w8, b);
        } else {
            if (stride == 1 && words == full) {
                _mm256_storeu_si256((__m256i *)(dst + k / 2), w);
                continue;
            }
            _mm256_store_si256((__m256i *)w8, w);
        }
        for (int64_t q = 0; q < words; q++) dst[(k / kw + q) * stride] = w8[q];
    }
}

static inline void vitc__row_q(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                               float *scale, int32_t *zp, int quads) {
    float mn, mx, inv;
    vitc__minmax(x, K, &mn, &mx);
    vitc__q8_params(mn, mx, scale, &inv, zp);
    vitc__row_qv(dst, stride, x, K, inv, *zp, quads);
}

static void vitc__row_int8_madd(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                float *scale, int32_t *zp) {
    vitc__row_q(dst, stride, x, K, scale, zp, 0);
}

static void vitc__row_int8_quads(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                 float *scale, int32_t *zp) {
    vitc__row_q(dst, stride, x, K, scale, zp, 1);
}

/* ---- the int8 attention's panels on [-64, 64] (gemm_lp.h) ------------- */

/* P's rows (values in [0, 1]): the reference's vitc__q8(x, 255, 0). */
static void vitc__strip_unit_w7(uint32_t *dst, int64_t ldd, int w, const float *x, int64_t ldx,
                                int64_t rows, int64_t K, float *scale, int32_t *zp) {
    (void)scale, (void)zp;
    for (int64_t i = 0; i < w; i++) {
        if (i < rows) {
            vitc__row_qv(dst + i, ldd, x + i * ldx, K, 255.0f, 0, 1);
            continue;
        }
        for (int64_t p = 0; 4 * p < K; p++) dst[p * ldd + i] = 0;
    }
}

/* vitc__s8_q(x, inv, 64) on eight lanes: cvtps2dq rounds as nearbyintf
 * does and gives INT_MIN where that returns it (NaN, out of range) */
static inline __m256i vitc__s7(__m256 x, __m256 inv) {
    __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(x, inv));
    return _mm256_min_epi32(_mm256_max_epi32(q, _mm256_set1_epi32(-64)), _mm256_set1_epi32(64));
}

/* |x| lanes' max with m; a NaN lane keeps m (vmaxps returns its second
 * operand), as the reference's comparison skips it */
static inline __m256 vitc__absmax(__m256 x, __m256 m) {
    return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), x), m);
}

static inline float vitc__hmax8(__m256 m) {
    _Alignas(32) float l[8];
    _mm256_store_ps(l, m);
    float a = l[0];
    for (int i = 1; i < 8; i++) a = l[i] > a ? l[i] : a;
    return a;
}

/* vitc__s8_rows_qref(..., 64): K's panels */
static void vitc__s8_rows_w7(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx,
                             int64_t rows, int64_t K, float *scale, int32_t *sum) {
    _Alignas(16) uint32_t w4[4];
    for (int64_t i = 0; i < 16; i++) {
        if (i >= rows) {
            for (int64_t p = 0; 4 * p < K; p++) dst[p * ldd + i] = 0;
            continue;
        }
        const float *xi = x + i * ldx; /* [K] */
        __m256 m = _mm256_setzero_ps();
        for (int64_t k = 0; k < K; k += 8)
            m = vitc__absmax(vitc__v_ld8(xi + k, K - k, v_lanes_any(K - k)), m);
        float inv;
        vitc__s8_params_q(vitc__hmax8(m), 64, &scale[i], &inv);
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i t = _mm256_setzero_si256();
        for (int64_t k = 0; k < K; k += 16) {
            int64_t left = K - k;
            __m256i q0 = vitc__s7(vitc__v_ld8(xi + k, left, v_lanes_any(left)), vinv);
            __m256i q1 = vitc__s7(vitc__v_ld8(xi + k + 8, left - 8, v_lanes_any(left - 8)),
                                  vinv);
            t = _mm256_add_epi32(t, _mm256_add_epi32(q0, q1));
            /* int16 in k order (packs interleaves by 128-bit lane), then bytes */
            __m256i h = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
            _mm_store_si128((__m128i *)w4, _mm_packs_epi16(_mm256_castsi256_si128(h),
                                                           _mm256_extracti128_si256(h, 1)));
            for (int64_t q = 0; q < 4 && 4 * q < left; q++) dst[(k / 4 + q) * ldd + i] = w4[q];
        }
        _Alignas(32) int32_t l[8];
        _mm256_store_si256((__m256i *)l, t);
        sum[i] = l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
    }
}

/* vitc__s8_quads_qref(..., 64): V's panels, eight columns at a time; the
 * four keys of a word are four rows, one byte each */
static void vitc__s8_quads_w7(uint32_t *dst, const float *x, int64_t ldx, int64_t S, int64_t n,
                              float *scale, int32_t *sum) {
    for (int64_t c = 0; c < NR; c += 8) {
        const __m256i mk = v_lanes_any(n - c);
        if (c >= n) {
            for (int64_t p = 0; 4 * p < S; p++)
                _mm256_storeu_si256((__m256i *)(dst + p * NR + c), _mm256_setzero_si256());
            continue;
        }
        __m256 m = _mm256_setzero_ps();
        for (int64_t j = 0; j < S; j++)
            m = vitc__absmax(vitc__v_ld8(x + j * ldx + c, n - c, mk), m);
        _Alignas(32) float am[8], iv[8];
        _mm256_store_ps(am, m);
        for (int l = 0; l < 8; l++) {
            float sc;
            vitc__s8_params_q(am[l], 64, &sc, &iv[l]);
            if (c + l < n) scale[c + l] = sc;
        }
        const __m256 vinv = _mm256_load_ps(iv), z = _mm256_setzero_ps();
        const __m256i byte = _mm256_set1_epi32(0xFF);
        __m256i t = _mm256_setzero_si256();
        for (int64_t p = 0; 4 * p < S; p++) {
            __m256i w = _mm256_setzero_si256();
            for (int r = 0; r < 4; r++) {
                int64_t j = 4 * p + r;
                __m256i q = vitc__s7(j < S ? vitc__v_ld8(x + j * ldx + c, n - c, mk) : z, vinv);
                t = _mm256_add_epi32(t, q);
                w = _mm256_or_si256(w, _mm256_slli_epi32(_mm256_and_si256(q, byte), 8 * r));
            }
            _mm256_storeu_si256((__m256i *)(dst + p * NR + c), w);
        }
        _Alignas(32) int32_t l[8];
        _mm256_store_si256((__m256i *)l, t);
        for (int k = 0; k < 8 && c + k < n; k++) sum[c + k] = l[k];
    }
}

/* Not for the attention (s8_rows NULL): its panels are vpdpbusd's words. */
const vitc__lp_kernel vitc__lp_int8_avx2 = {"avx2", vitc__ukr_int8_madd, vitc__row_int8_madd,
                                            NULL, NULL, NULL, 1, MR, 0, NULL, NULL, 0,
                                            NULL, NULL, NULL, 1, 0};

/* Weights packed in [-64, 64] (wmax), vpdpbusd's words: any int8 kernel
 * gives its sums exactly; this one only on such weights. Its attention
 * panels of K and V lie in [-64, 64] too. */
const vitc__lp_kernel vitc__lp_int8_avx2_w7 = {"avx2-w7", vitc__ukr_int8_maddubs,
                                               vitc__row_int8_quads, NULL, NULL, NULL, 1, MR,
                                               0, NULL, NULL, 0, vitc__s8_rows_w7,
                                               vitc__s8_quads_w7, vitc__strip_unit_w7, 0, 64};
