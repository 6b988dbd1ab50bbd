/*
 * gemm_lp_avx512.c — bf16 (AVX512-BF16 vdpbf16ps) and int8 (AVX512-VNNI
 * vpdpbusd) microkernels, 12 x 32, and their activation converters. Built
 * with -mavx512bf16 -mavx512vnni (Makefile); only called when cpuid has
 * them (dispatch.c). Each gives gemm_lp.c's reference numbers bit for bit:
 * the same per-lane operation order, and an epilogue of the same roundings.
 */
#include <immintrin.h>

#include "gemm_lp.h"
#include "vmath_avx512.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR

/* The tile's output (and residual) rows, asked for before the loop so
 * their misses overlap the sums: with a row stride that is a multiple of
 * 4 KB (N = 3072) the twelve rows share L1 sets, and stores that miss at
 * the end cost batch 8's fc1 a third of its speed. */
static inline void vitc__lp_prefetch(float *C, int64_t ldc, int64_t mr, const vitc__lp_epi *e) {
    for (int64_t i = 0; i < mr; i++) {
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        if (e->res) {
            _mm_prefetch((const char *)(e->res + i * e->ldr), _MM_HINT_T0);
            _mm_prefetch((const char *)(e->res + i * e->ldr + 16), _MM_HINT_T0);
        }
    }
}

static inline __mmask16 vitc__m16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* GELU as vitc__gelu_avx512 computes it, operation for operation (x Phi(x)). */
static inline __m512 vitc__lp_gelu(__m512 v) { return _mm512_mul_ps(v, v_phi(v)); }

/* bias and residual (then GELU), then the store (the epilogue's common tail). */
static inline void vitc__lp_out(float *c, __m512 v0, __m512 v1, __mmask16 m0, __mmask16 m1,
                                const vitc__lp_epi *e, int64_t i) {
    if (e->bias) {
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, e->bias));
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, e->bias + 16));
    }
    if (e->res) {
        const float *r = e->res + i * e->ldr;
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, r));
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, r + 16));
    }
    if (e->gelu) {
        v0 = vitc__lp_gelu(v0);
        v1 = vitc__lp_gelu(v1);
    }
    _mm512_mask_storeu_ps(c, m0, v0);
    _mm512_mask_storeu_ps(c + 16, m1, v1);
}

/* ---- bf16 ---------------------------------------------------------------- */

#define BF_ROW(i)                                                                   \
    do {                                                                            \
        __m512i a = _mm512_set1_epi32((int)pa[i]);                                  \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, (__m512bh)a, (__m512bh)b0);             \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, (__m512bh)a, (__m512bh)b1);             \
    } while (0)
#define BF_OUT(i) \
    if (i < mr) vitc__lp_out(C + (i) * ldc, c##i##0, c##i##1, m0, m1, e, i)

static void vitc__ukr_bf16_avx512(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                  int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    vitc__lp_prefetch(C, ldc, mr, e);
#pragma GCC unroll 4
    for (int64_t p = 0; p < kg; p++) {
        __m512i b0 = _mm512_load_si512((const void *)pb), b1 = _mm512_load_si512((const void *)(pb + 16));
        BF_ROW(0); BF_ROW(1); BF_ROW(2); BF_ROW(3); BF_ROW(4); BF_ROW(5);
        BF_ROW(6); BF_ROW(7); BF_ROW(8); BF_ROW(9); BF_ROW(10); BF_ROW(11);
        pa += MR;
        pb += NR;
    }
    __mmask16 m0 = vitc__m16(nr), m1 = vitc__m16(nr - 16);
    BF_OUT(0); BF_OUT(1); BF_OUT(2); BF_OUT(3); BF_OUT(4); BF_OUT(5);
    BF_OUT(6); BF_OUT(7); BF_OUT(8); BF_OUT(9); BF_OUT(10); BF_OUT(11);
}

/* The same sums from row-major A: each row's word p broadcast from a_i[p]. */
#define BF_ROW_RM(i)                                                                \
    do {                                                                            \
        __m512i a = _mm512_set1_epi32((int)a##i[p]);                                \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, (__m512bh)a, (__m512bh)b0);             \
        c##i##1 = _mm512_dpbf16_ps(c##i##1, (__m512bh)a, (__m512bh)b1);             \
    } while (0)
#define BF_OUT_RM(i)                                                                \
    if (i < mr) {                                                                   \
        _mm512_mask_storeu_ps(C + (i) * ldc, m0, c##i##0);                          \
        _mm512_mask_storeu_ps(C + (i) * ldc + 16, m1, c##i##1);                     \
    }

static void vitc__ukr_bf16_rm_avx512(int64_t kg, const uint32_t *a, int64_t lda,
                                     const uint32_t *pb, float *C, int64_t ldc, int64_t mr,
                                     int64_t nr) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    const uint32_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const uint32_t *a4 = a + 4 * lda, *a5 = a + 5 * lda, *a6 = a + 6 * lda, *a7 = a + 7 * lda;
    const uint32_t *a8 = a + 8 * lda, *a9 = a + 9 * lda, *a10 = a + 10 * lda, *a11 = a + 11 * lda;
#pragma GCC unroll 4
    for (int64_t p = 0; p < kg; p++) {
        __m512i b0 = _mm512_load_si512((const void *)pb), b1 = _mm512_load_si512((const void *)(pb + 16));
        BF_ROW_RM(0); BF_ROW_RM(1); BF_ROW_RM(2); BF_ROW_RM(3); BF_ROW_RM(4); BF_ROW_RM(5);
        BF_ROW_RM(6); BF_ROW_RM(7); BF_ROW_RM(8); BF_ROW_RM(9); BF_ROW_RM(10); BF_ROW_RM(11);
        pb += NR;
    }
    __mmask16 m0 = vitc__m16(nr), m1 = vitc__m16(nr - 16);
    BF_OUT_RM(0); BF_OUT_RM(1); BF_OUT_RM(2); BF_OUT_RM(3); BF_OUT_RM(4); BF_OUT_RM(5);
    BF_OUT_RM(6); BF_OUT_RM(7); BF_OUT_RM(8); BF_OUT_RM(9); BF_OUT_RM(10); BF_OUT_RM(11);
}

/* Word p (x[2p], x[2p+1] as bf16) to dst[p * stride]: 32 floats become one
 * zmm of 16 words, scattered down the strip (stored as they are when the
 * stride is 1). */
static void vitc__row_bf16_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                  float *scale, int32_t *zp) {
    (void)scale, (void)zp;
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)stride));
    for (int64_t k = 0; k < K; k += 32) {
        __m512 x0 = _mm512_maskz_loadu_ps(vitc__m16(K - k), x + k);
        __m512 x1 = _mm512_maskz_loadu_ps(vitc__m16(K - k - 16), x + k + 16);
        __m512i w = (__m512i)_mm512_cvtne2ps_pbh(x1, x0); /* low half from x0 */
        if (stride == 1) {
            _mm512_mask_storeu_epi32(dst + k / 2, vitc__m16((K - k + 1) / 2), w);
            continue;
        }
        _mm512_mask_i32scatter_epi32(dst + (k / 2) * stride, vitc__m16((K - k + 1) / 2), idx, w, 4);
    }
}

/* ---- int8 ---------------------------------------------------------------- */

#define I8_ROW(i)                                                                   \
    do {                                                                            \
        __m512i a = _mm512_set1_epi32((int)pa[i]);                                  \
        c##i##0 = _mm512_dpbusd_epi32(c##i##0, a, b0);                              \
        c##i##1 = _mm512_dpbusd_epi32(c##i##1, a, b1);                              \
    } while (0)
#define I8_OUT(i)                                                                            \
    if (i < mr) {                                                                            \
        __m512i z = _mm512_set1_epi32(e->azp[i]);                                            \
        __m512 s = _mm512_set1_ps(e->ascale[i]);                                             \
        __m512 v0 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c##i##0, _mm512_mullo_epi32(z, ws0))); \
        __m512 v1 = _mm512_cvtepi32_ps(_mm512_sub_epi32(c##i##1, _mm512_mullo_epi32(z, ws1))); \
        v0 = _mm512_mul_ps(v0, _mm512_mul_ps(s, sc0));                                       \
        v1 = _mm512_mul_ps(v1, _mm512_mul_ps(s, sc1));                                       \
        vitc__lp_out(C + (i) * ldc, v0, v1, m0, m1, e, i);                                   \
    }

static void vitc__ukr_int8_avx512(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                  int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    __m512i c00 = _mm512_setzero_si512(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512i c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512i c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512i c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    vitc__lp_prefetch(C, ldc, mr, e);
#pragma GCC unroll 4
    for (int64_t p = 0; p < kg; p++) {
        __m512i b0 = _mm512_load_si512((const void *)pb), b1 = _mm512_load_si512((const void *)(pb + 16));
        I8_ROW(0); I8_ROW(1); I8_ROW(2); I8_ROW(3); I8_ROW(4); I8_ROW(5);
        I8_ROW(6); I8_ROW(7); I8_ROW(8); I8_ROW(9); I8_ROW(10); I8_ROW(11);
        pa += MR;
        pb += NR;
    }
    __mmask16 m0 = vitc__m16(nr), m1 = vitc__m16(nr - 16);
    __m512i ws0 = _mm512_maskz_loadu_epi32(m0, e->wsum), ws1 = _mm512_maskz_loadu_epi32(m1, e->wsum + 16);
    __m512 sc0 = _mm512_maskz_loadu_ps(m0, e->wscale), sc1 = _mm512_maskz_loadu_ps(m1, e->wscale + 16);
    I8_OUT(0); I8_OUT(1); I8_OUT(2); I8_OUT(3); I8_OUT(4); I8_OUT(5);
    I8_OUT(6); I8_OUT(7); I8_OUT(8); I8_OUT(9); I8_OUT(10); I8_OUT(11);
}

/* 16 floats to 16 bytes: the reference's vitc__q8, lane by lane. */
static inline __m128i vitc__q8x16(__m512 x, __m512 inv, __m512i zp) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv)); /* MXCSR: nearest even */
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-256)), _mm512_set1_epi32(511));
    q = _mm512_add_epi32(q, zp);
    q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_setzero_si512()), _mm512_set1_epi32(255));
    return _mm512_cvtepi32_epi8(q);
}

static void vitc__row_int8_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                  float *scale, int32_t *zp) {
    __m512 vmn = _mm512_set1_ps(x[0]), vmx = vmn;
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        __m512 v = _mm512_loadu_ps(x + k);
        vmn = _mm512_min_ps(vmn, v);
        vmx = _mm512_max_ps(vmx, v);
    }
    if (k < K) {
        __mmask16 m = vitc__m16(K - k);
        __m512 v = _mm512_maskz_loadu_ps(m, x + k);
        vmn = _mm512_mask_min_ps(vmn, m, vmn, v);
        vmx = _mm512_mask_max_ps(vmx, m, vmx, v);
    }
    float inv;
    vitc__q8_params(_mm512_reduce_min_ps(vmn), _mm512_reduce_max_ps(vmx), scale, &inv, zp);
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i vz = _mm512_set1_epi32(*zp);
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)stride));
    for (k = 0; k < K; k += 64) {
        __m512i w = _mm512_castsi128_si512(
            vitc__q8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k), x + k), vinv, vz));
        w = _mm512_inserti32x4(w, vitc__q8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 16), x + k + 16), vinv, vz), 1);
        w = _mm512_inserti32x4(w, vitc__q8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 32), x + k + 32), vinv, vz), 2);
        w = _mm512_inserti32x4(w, vitc__q8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 48), x + k + 48), vinv, vz), 3);
        int64_t left = K - k;
        __mmask64 bytes = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
        w = _mm512_maskz_mov_epi8(bytes, w); /* k past K packs as 0, as the reference does */
        _mm512_mask_i32scatter_epi32(dst + (k / 4) * stride, vitc__m16((left + 3) / 4), idx, w, 4);
    }
}

const vitc__lp_kernel vitc__lp_bf16_avx512 = {"avx512-bf16", vitc__ukr_bf16_avx512,
                                              vitc__row_bf16_avx512, vitc__ukr_bf16_rm_avx512, 1};
const vitc__lp_kernel vitc__lp_int8_avx512 = {"avx512-vnni", vitc__ukr_int8_avx512,
                                              vitc__row_int8_avx512, NULL, 1};
