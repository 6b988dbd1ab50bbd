/*
 * gemm_lp_bf16_avx2.c — bf16 on CPUs without AVX512-BF16 (AVX2 and FMA:
 * AMD Zen 2 and 3, Intel before Cooper Lake): each bf16 widened to fp32 (a
 * shift or a mask) and multiplied with vfmadd231ps. Half of fp32's weight
 * memory at about fp32's speed, where the reference was scalar.
 *
 * The reference's numbers: vdpbf16ps adds the high products, rounded, then
 * the low ones, rounded; a product of two bf16 is exact in fp32, so one FMA
 * rounds as that add does. Its denormal rules (bf16 inputs read as zero,
 * results flushed) are MXCSR's DAZ and FTZ, set around the tile.
 *
 * The tile: the driver's 12 x 32 as six 4 x 16 passes (8 ymm accumulators,
 * four of B's halves, two of A's): the widening needs registers that a
 * 6 x 16 pass (12 accumulators) does not leave.
 */
#include <immintrin.h>

#include "../gemm_lp.h"
#include "vmath_avx2.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR
#define RB 4 /* rows a pass */

#define VITC_HI(w) _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)))
#define VITC_LO(w) _mm256_castsi256_ps(_mm256_slli_epi32(w, 16))

#define VITC_DECL(i) __m256 c##i##0 = _mm256_setzero_ps(), c##i##1 = c##i##0;
#define VITC_ROW(i)                                                                        \
    do {                                                                                   \
        __m256i a = _mm256_set1_epi32((int)a0[i]);                                         \
        __m256 ah = VITC_HI(a), al = VITC_LO(a);                                           \
        c##i##0 = _mm256_fmadd_ps(al, b0l, _mm256_fmadd_ps(ah, b0h, c##i##0));             \
        c##i##1 = _mm256_fmadd_ps(al, b1l, _mm256_fmadd_ps(ah, b1h, c##i##1));             \
    } while (0)
#define VITC_PUT(i)                                                                        \
    _mm256_store_ps(acc + (r0 + i) * NR + j0, c##i##0);                                    \
    _mm256_store_ps(acc + (r0 + i) * NR + j0 + 8, c##i##1);

/* Sums of rows r0..r0+3 x columns j0..j0+15 into acc [MR][NR] (a function
 * of its own, as in gemm_lp_madd_avx2.c: no accumulator spilled). */
__attribute__((noinline)) static void vitc__pass_bf16(int64_t kg, const uint32_t *pa,
                                                      const uint32_t *pb, float *acc, int64_t r0,
                                                      int64_t j0) {
    VITC_DECL(0) VITC_DECL(1) VITC_DECL(2) VITC_DECL(3)
    const uint32_t *a0 = pa + r0, *b = pb + j0;
    for (int64_t p = 0; p < kg; p++) {
        __m256i w0 = _mm256_load_si256((const __m256i *)b);
        __m256i w1 = _mm256_load_si256((const __m256i *)(b + 8));
        __m256 b0h = VITC_HI(w0), b0l = VITC_LO(w0), b1h = VITC_HI(w1), b1l = VITC_LO(w1);
        VITC_ROW(0); VITC_ROW(1); VITC_ROW(2); VITC_ROW(3);
        a0 += MR;
        b += NR;
    }
    VITC_PUT(0) VITC_PUT(1) VITC_PUT(2) VITC_PUT(3)
}

static void vitc__ukr_bf16_fma(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                               int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    _Alignas(32) float acc[MR * NR]; /* [MR][NR] */
    vitc__lp_pf_tile(C, ldc, mr, nr, e);
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ, DAZ: vdpbf16ps's denormals */
    for (int64_t j0 = 0; j0 < nr; j0 += 16)
        for (int64_t r0 = 0; r0 < mr; r0 += RB) vitc__pass_bf16(kg, pa, pb, acc, r0, j0);
    _mm_setcsr(csr);
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j += 8) {
            int64_t n = nr - j;
            __m256i m = v_lanes_any(n);
            __m256 v = _mm256_load_ps(acc + i * NR + j);
            if (e->bias) v = _mm256_add_ps(v, vitc__v_ld8(e->bias + j, n, m));
            if (e->ls) v = _mm256_mul_ps(vitc__v_ld8(e->ls + j, n, m), v);
            if (e->res) v = _mm256_add_ps(v, vitc__v_ld8(e->res + i * e->ldr + j, n, m));
            if (n >= 8)
                _mm256_storeu_ps(C + i * ldc + j, v);
            else
                _mm256_maskstore_ps(C + i * ldc + j, m, v);
        }
}

/* 8 floats to bf16 (vitc__bf16_rne lane by lane: nearest even, NaN kept
 * quiet, denormals to a zero of their sign), in the low half of each lane. */
static inline __m256i vitc__bf16x8(__m256 x) {
    const __m256i u = _mm256_castps_si256(x), e = _mm256_set1_epi32(0x7F800000);
    __m256i ex = _mm256_and_si256(u, e);
    __m256i nan = _mm256_andnot_si256(
        _mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x007FFFFF)),
                           _mm256_setzero_si256()),
        _mm256_cmpeq_epi32(ex, e));
    __m256i den = _mm256_cmpeq_epi32(ex, _mm256_setzero_si256());
    __m256i r = _mm256_add_epi32(
        u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
                            _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    r = _mm256_srli_epi32(r, 16);
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i sz = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
    r = _mm256_blendv_epi8(r, qn, nan);
    return _mm256_blendv_epi8(r, sz, den);
}

/* One row to words of bf16 pairs at dst[p * stride] (x[k] * *scale when
 * scale is not NULL: the float product, then the rounding). */
static void vitc__row_bf16_fma(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                               float *scale, int32_t *zp) {
    (void)zp;
    const __m256 s = _mm256_set1_ps(scale ? *scale : 1.0f);
    const __m256i odd = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    _Alignas(32) uint32_t w8[8];
    for (int64_t k = 0; k < K; k += 8) {
        int64_t left = K - k;
        __m256 v = left >= 8 ? _mm256_loadu_ps(x + k)
                             : _mm256_maskload_ps(x + k, v_lanes_any(left));
        if (scale) v = _mm256_mul_ps(v, s); /* x * 1 would be x: skipped */
        __m256i h = vitc__bf16x8(v); /* lanes: bf16 of x[k + l] */
        /* lane 2p | lane 2p + 1 << 16: the pairs' words (k past K: 0) */
        h = _mm256_and_si256(h, v_lanes_any(left));
        __m256i w = _mm256_or_si256(h, _mm256_srli_epi64(h, 16));
        w = _mm256_permutevar8x32_epi32(w, odd); /* words in lanes 0..3 */
        int64_t words = left >= 8 ? 4 : (left + 1) / 2;
        _mm256_store_si256((__m256i *)w8, w);
        for (int64_t q = 0; q < words; q++) dst[(k / 2 + q) * stride] = w8[q];
    }
}

/* Not for the attention (ukr_rm, pairs NULL: the reference's there). */
const vitc__lp_kernel vitc__lp_bf16_avx2 = {"avx2", vitc__ukr_bf16_fma, vitc__row_bf16_fma,
                                            NULL, NULL, NULL, 0, MR, 0, NULL, NULL, 0,
                                            NULL, NULL, NULL, 0, 0};
