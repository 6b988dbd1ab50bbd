/*
 * gemm_lp_avx512.c — bf16 (AVX512-BF16 vdpbf16ps) and int8 (AVX512-VNNI
 * vpdpbusd) microkernels, 12 x 32, and their activation converters. Built
 * with -mavx512bf16 -mavx512vnni (Makefile); only called when cpuid has
 * them (dispatch.c). Each gives gemm_lp.c's reference numbers bit for bit:
 * the same per-lane operation order, and an epilogue of the same roundings.
 */
#include <immintrin.h>

#include "../gemm_lp.h"
#include "vmath_avx512.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR

/* The tile's output rows, asked for before the loop so their misses
 * overlap the sums: with a row stride that is a multiple of 4 KB
 * (N = 3072) the twelve rows share L1 sets, and stores that miss at the
 * end cost batch 8's fc1 a third of its speed. The residual's rows are
 * asked for one row per iteration of the loop's first twelve (LP_LOOP):
 * asked for with the output's, 48 prefetches at once, they still missed
 * at the epilogue, which cost batch 8's out_proj 13% (bf16) and 20%
 * (int8) of its time. */
static inline void vitc__lp_prefetch(float *C, int64_t ldc, int64_t mr) {
    for (int64_t i = 0; i < mr; i++) {
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
    }
}

static inline __mmask16 vitc__m16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* ---- the microkernels: one body, two dot products ------------------------
 *
 * Both are the fp32 kernel's 12 x 32 tile: 24 accumulators, B strip words
 * b0, b1 loaded once per p, row i's word of A broadcast. The epilogue runs
 * in two phases over the tile in registers: first every row gets its
 * dequantization (int8), bias and residual (the residual loads all issued
 * before any store of the tile, so none waits behind a masked store);
 * then GELU and the stores. Measured as fast as the per-row epilogue it
 * replaced (GELU's v_phi is most of the epilogue's time). */

#define LP_DECL(T, z)                                                                   \
    T c00 = z, c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00; \
    T c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00; \
    T c80 = c00, c81 = c00, c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00
#define LP_ROW(DP, i)                                                               \
    do {                                                                            \
        __m512i a = _mm512_set1_epi32((int)pa[i]);                                  \
        c##i##0 = DP(c##i##0, a, b0);                                               \
        c##i##1 = DP(c##i##1, a, b1);                                               \
    } while (0)
#define LP_LOOP(DP)                                                                 \
    int64_t pf_n = mr < kg ? mr : kg;                                               \
    const char *pb_start = (const char *)pb;                                        \
    for (int64_t p = 0; p < pf_n; p++) { /* residual row p asked for */             \
        if (e->res) {                                                               \
            _mm_prefetch((const char *)(e->res + p * e->ldr), _MM_HINT_T0);         \
            _mm_prefetch((const char *)(e->res + p * e->ldr + 16), _MM_HINT_T0);    \
        }                                                                           \
        LP_BODY(DP)                                                                 \
    }                                                                               \
    int64_t tail = kg - pf_n < 32 ? kg - pf_n : 32;                                 \
    /* the driver's next weight strip, a line a step: 64 prefetches at once   \
     * before the tile stalled (2% of int8 batch 1) */                          \
    const char *pf = e->pf;                                                     \
    int64_t pf_end = pf_n + e->pf_lines;                                        \
    _Pragma("GCC unroll 4") for (int64_t p = pf_n; p < kg - tail; p++) {            \
        if (p < pf_end) _mm_prefetch(pf + (p - pf_n) * 64, _MM_HINT_T1);         \
        LP_BODY(DP)                                                             \
    }                                                                           \
    for (int64_t p = kg - tail > pf_n ? kg - tail : pf_n; p < pf_end; p++) /* more \
        lines than steps (few A strips): the rest at once */                    \
        _mm_prefetch(pf + (p - pf_n) * 64, _MM_HINT_T1);                        \
    /* The next tile (the next A strip) starts this B strip over: its first       \
     * lines, evicted from L1 by the rest of the strip (48 KB at K = 768), are    \
     * asked for again (a tile's first loads stalled on them: 3% of fc1). So      \
     * are the output's lines, a line an iteration: fc1's rows, 12 KB apart in   \
     * the same L1 sets, were evicted again before the stores (batch 8 fc1:       \
     * -6% bf16, -17% int8). */                                                   \
    _Pragma("GCC unroll 4") for (int64_t p = 0; p < tail; p++) {                    \
        _mm_prefetch(pb_start + p * 64, _MM_HINT_T0);                               \
        if (p < 2 * mr) _mm_prefetch((const char *)(C + (p >> 1) * ldc + (p & 1) * 16), _MM_HINT_T0); \
        LP_BODY(DP)                                                                 \
    }
#define LP_BODY(DP)                                                                 \
    {                                                                               \
        __m512i b0 = _mm512_load_si512((const void *)pb);                           \
        __m512i b1 = _mm512_load_si512((const void *)(pb + 16));                    \
        LP_ROW(DP, 0); LP_ROW(DP, 1); LP_ROW(DP, 2); LP_ROW(DP, 3);                 \
        LP_ROW(DP, 4); LP_ROW(DP, 5);                                               \
        if (R > 6) {                                                                \
            LP_ROW(DP, 6); LP_ROW(DP, 7); LP_ROW(DP, 8); LP_ROW(DP, 9);             \
            LP_ROW(DP, 10); LP_ROW(DP, 11);                                         \
        }                                                                           \
        pa += MR;                                                                   \
        pb += NR;                                                                   \
    }
/* Phase 1 of row i: v##i##0/1 = DQ(accumulators) + bias + residual. */
#define LP_FIN(DQ, i)                                                               \
    __m512 v##i##0 = DQ(c##i##0, i, sc0, ws0), v##i##1 = DQ(c##i##1, i, sc1, ws1);  \
    if (i < R && i < mr) {                                                          \
        if (e->bias) v##i##0 = _mm512_add_ps(v##i##0, bi0), v##i##1 = _mm512_add_ps(v##i##1, bi1); \
        if (e->ls) v##i##0 = _mm512_mul_ps(ls0, v##i##0), v##i##1 = _mm512_mul_ps(ls1, v##i##1); \
        if (e->res) {                                                               \
            v##i##0 = _mm512_add_ps(v##i##0, _mm512_maskz_loadu_ps(m0, e->res + (i) * e->ldr));      \
            v##i##1 = _mm512_add_ps(v##i##1, _mm512_maskz_loadu_ps(m1, e->res + (i) * e->ldr + 16)); \
        }                                                                           \
    }
#define LP_STORE(i)                                                                 \
    if (i < R && i < mr) {                                                          \
        if (e->gelu) {                                                              \
            gt[2 * (i)] = v##i##0, gt[2 * (i) + 1] = v##i##1;                       \
        } else {                                                                    \
            _mm512_mask_storeu_ps(C + (i) * ldc, m0, v##i##0);                      \
            _mm512_mask_storeu_ps(C + (i) * ldc + 16, m1, v##i##1);                 \
        }                                                                           \
    }
#define LP_EPILOGUE(DQ)                                                             \
    __mmask16 m0 = vitc__m16(nr), m1 = vitc__m16(nr - 16);                          \
    __m512 bi0 = _mm512_setzero_ps(), bi1 = bi0;                                    \
    if (e->bias) bi0 = _mm512_maskz_loadu_ps(m0, e->bias), bi1 = _mm512_maskz_loadu_ps(m1, e->bias + 16); \
    __m512 ls0 = _mm512_setzero_ps(), ls1 = ls0;                                    \
    if (e->ls) ls0 = _mm512_maskz_loadu_ps(m0, e->ls), ls1 = _mm512_maskz_loadu_ps(m1, e->ls + 16); \
    LP_FIN(DQ, 0) LP_FIN(DQ, 1) LP_FIN(DQ, 2) LP_FIN(DQ, 3) LP_FIN(DQ, 4) LP_FIN(DQ, 5) \
    LP_FIN(DQ, 6) LP_FIN(DQ, 7) LP_FIN(DQ, 8) LP_FIN(DQ, 9) LP_FIN(DQ, 10) LP_FIN(DQ, 11) \
    __m512 gt[2 * MR];                                                              \
    LP_STORE(0); LP_STORE(1); LP_STORE(2); LP_STORE(3); LP_STORE(4); LP_STORE(5);   \
    LP_STORE(6); LP_STORE(7); LP_STORE(8); LP_STORE(9); LP_STORE(10); LP_STORE(11); \
    if (e->gelu) vitc__v_act_tile(C, ldc, gt, mr < R ? mr : R, m0, m1, e->gelu)

/* bf16: the sums are the values. */
#define BF_DP(c, a, b) _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
#define BF_DQ(c, i, sc, ws) (c)

__attribute__((always_inline)) static inline void
vitc__ukr_bf16_rows(const int R, int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                    int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    LP_DECL(__m512, _mm512_setzero_ps());
    vitc__lp_prefetch(C, ldc, mr);
    LP_LOOP(BF_DP)
    LP_EPILOGUE(BF_DQ);
}

/* The kernel of one precision from its rows body: the last strip of an M
 * that is not a multiple of 12 (ViT's 197 rows: 5) runs the 6-row body,
 * half the products of the 12-row one with still 12 independent
 * accumulators to cover the dot products' latency. Each width is its own
 * function: inlined into one, GCC's allocator spilled and copied int8
 * accumulators inside the 12-row loop. */
#define LP_UKR_WIDTHS(T)                                                                       \
    __attribute__((noinline)) static void vitc__ukr_##T##_6(                                    \
        int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C, int64_t ldc, int64_t mr, \
        int64_t nr, const vitc__lp_epi *e) {                                                   \
        vitc__ukr_##T##_rows(6, kg, pa, pb, C, ldc, mr, nr, e);                                \
    }                                                                                          \
    __attribute__((noinline)) static void vitc__ukr_##T##_12(                                   \
        int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C, int64_t ldc, int64_t mr, \
        int64_t nr, const vitc__lp_epi *e) {                                                   \
        vitc__ukr_##T##_rows(MR, kg, pa, pb, C, ldc, mr, nr, e);                               \
    }                                                                                          \
    static void vitc__ukr_##T##_avx512(int64_t kg, const uint32_t *pa, const uint32_t *pb,     \
                                       float *C, int64_t ldc, int64_t mr, int64_t nr,          \
                                       const vitc__lp_epi *e) {                                \
        (mr <= 6 ? vitc__ukr_##T##_6 : vitc__ukr_##T##_12)(kg, pa, pb, C, ldc, mr, nr, e);     \
    }

LP_UKR_WIDTHS(bf16)

/* int8: (float)(acc - azp[i] wsum[j]) * (ascale[i] wscale[j]), the
 * reference's roundings. Rows past mr read no azp / ascale (unused). */
#define I8_DQ(c, i, sc, ws)                                                         \
    (i < R && i < mr ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(                    \
                                c, _mm512_mullo_epi32(_mm512_set1_epi32(e->azp[i]), ws))), \
                            _mm512_mul_ps(_mm512_set1_ps(e->ascale[i]), sc))        \
            : _mm512_setzero_ps())

__attribute__((always_inline)) static inline void
vitc__ukr_int8_rows(const int R, int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                    int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    LP_DECL(__m512i, _mm512_setzero_si512());
    vitc__lp_prefetch(C, ldc, mr);
    LP_LOOP(_mm512_dpbusd_epi32)
    __mmask16 n0 = vitc__m16(nr), n1 = vitc__m16(nr - 16);
    __m512i ws0 = _mm512_maskz_loadu_epi32(n0, e->wsum), ws1 = _mm512_maskz_loadu_epi32(n1, e->wsum + 16);
    __m512 sc0 = _mm512_maskz_loadu_ps(n0, e->wscale), sc1 = _mm512_maskz_loadu_ps(n1, e->wscale + 16);
    LP_EPILOGUE(I8_DQ);
}

LP_UKR_WIDTHS(int8)

/* ---- the epilogue of sums in memory (the AMX kernels' tiles) ------------
 *
 * Twelve rows at a time, loaded into the accumulators of the kernels
 * above and finished by the same LP_EPILOGUE code (the same bits; GELU
 * fused). Rows past mr are neither read nor stored. */
#define LP_LD(i)                                                                    \
    if (i < mr) c##i##0 = LD(a + (i) * lda), c##i##1 = LD(a + (i) * lda + 16);
#define LP_LD_ALL                                                                   \
    LP_LD(0) LP_LD(1) LP_LD(2) LP_LD(3) LP_LD(4) LP_LD(5) LP_LD(6) LP_LD(7) LP_LD(8) \
    LP_LD(9) LP_LD(10) LP_LD(11)

__attribute__((noinline)) static void vitc__lp_epi12_bf16(const float *a, int64_t lda, float *C,
                                                         int64_t ldc, int64_t mr, int64_t nr,
                                                         const vitc__lp_epi *e) {
    const int R = MR;
    LP_DECL(__m512, _mm512_setzero_ps());
#define LD(p) _mm512_load_ps(p)
    LP_LD_ALL
#undef LD
    LP_EPILOGUE(BF_DQ);
}

__attribute__((noinline)) static void vitc__lp_epi12_int8(const int32_t *a, int64_t lda, float *C,
                                                         int64_t ldc, int64_t mr, int64_t nr,
                                                         const vitc__lp_epi *e) {
    const int R = MR;
    LP_DECL(__m512i, _mm512_setzero_si512());
#define LD(p) _mm512_load_si512((const void *)(p))
    LP_LD_ALL
#undef LD
    __mmask16 n0 = vitc__m16(nr), n1 = vitc__m16(nr - 16);
    __m512i ws0 = _mm512_maskz_loadu_epi32(n0, e->wsum), ws1 = _mm512_maskz_loadu_epi32(n1, e->wsum + 16);
    __m512 sc0 = _mm512_maskz_loadu_ps(n0, e->wscale), sc1 = _mm512_maskz_loadu_ps(n1, e->wscale + 16);
    LP_EPILOGUE(I8_DQ);
}

/* acc rows 64-byte aligned (lda a multiple of 16), nr <= 32. */
void vitc__lp_epi_avx512(vitc_precision p, const void *acc, int64_t lda, float *C, int64_t ldc,
                         int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    for (int64_t i = 0; i < mr; i += MR) {
        vitc__lp_epi ei = *e; /* rows i.. of the tile */
        if (ei.res) ei.res += i * ei.ldr;
        if (ei.ascale) ei.ascale += i, ei.azp += i;
        int64_t m = mr - i < MR ? mr - i : MR;
        if (p == VITC_PRECISION_INT8)
            vitc__lp_epi12_int8((const int32_t *)acc + i * lda, lda, C + i * ldc, ldc, m, nr, &ei);
        else
            vitc__lp_epi12_bf16((const float *)acc + i * lda, lda, C + i * ldc, ldc, m, nr, &ei);
    }
}

/* The same sums from row-major A: each row's word p broadcast from a_i[p].
 * R rows (6 or 12) by W vectors (1 or 2: 16 or 32 columns) of C: the
 * attention's edges (ViT's 197 keys are 6 strips and 5 columns, its 197
 * queries 16 tiles and 5 rows) run the narrower bodies instead of a
 * whole 12 x 32 tile of zeros. */
#define BF_ROW_RM(i)                                                                \
    if (i < R) {                                                                    \
        __m512i a = _mm512_set1_epi32((int)a##i[p]);                                \
        c##i##0 = _mm512_dpbf16_ps(c##i##0, (__m512bh)a, (__m512bh)b0);             \
        if (W == 2) c##i##1 = _mm512_dpbf16_ps(c##i##1, (__m512bh)a, (__m512bh)b1); \
    }
#define BF_OUT_RM(i)                                                                \
    if (i < R && i < mr) {                                                          \
        _mm512_mask_storeu_ps(C + (i) * ldc, m0, c##i##0);                          \
        if (W == 2) _mm512_mask_storeu_ps(C + (i) * ldc + 16, m1, c##i##1);         \
    }

__attribute__((always_inline)) static inline void
vitc__ukr_bf16_rm_t(const int R, const int W, int64_t kg, const uint32_t *a, int64_t lda,
                    const uint32_t *pb, float *C, int64_t ldc, int64_t mr, int64_t nr) {
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    const uint32_t *a0 = a, *a1 = a + lda, *a2 = a + 2 * lda, *a3 = a + 3 * lda;
    const uint32_t *a4 = a + 4 * lda, *a5 = a + 5 * lda, *a6 = a + 6 * lda, *a7 = a + 7 * lda;
    const uint32_t *a8 = a + 8 * lda, *a9 = a + 9 * lda, *a10 = a + 10 * lda, *a11 = a + 11 * lda;
#pragma GCC unroll 4
    for (int64_t p = 0; p < kg; p++) {
        __m512i b0 = _mm512_load_si512((const void *)pb), b1 = b0;
        if (W == 2) b1 = _mm512_load_si512((const void *)(pb + 16));
        BF_ROW_RM(0); BF_ROW_RM(1); BF_ROW_RM(2); BF_ROW_RM(3); BF_ROW_RM(4); BF_ROW_RM(5);
        BF_ROW_RM(6); BF_ROW_RM(7); BF_ROW_RM(8); BF_ROW_RM(9); BF_ROW_RM(10); BF_ROW_RM(11);
        pb += NR;
    }
    __mmask16 m0 = vitc__m16(nr), m1 = vitc__m16(nr - 16);
    BF_OUT_RM(0); BF_OUT_RM(1); BF_OUT_RM(2); BF_OUT_RM(3); BF_OUT_RM(4); BF_OUT_RM(5);
    BF_OUT_RM(6); BF_OUT_RM(7); BF_OUT_RM(8); BF_OUT_RM(9); BF_OUT_RM(10); BF_OUT_RM(11);
}

#define BF_RM_BODY(R, W)                                                                      \
    __attribute__((noinline)) static void vitc__ukr_bf16_rm_##R##x##W(                        \
        int64_t kg, const uint32_t *a, int64_t lda, const uint32_t *pb, float *C, int64_t ldc, \
        int64_t mr, int64_t nr) {                                                            \
        vitc__ukr_bf16_rm_t(R, W, kg, a, lda, pb, C, ldc, mr, nr);                            \
    }
BF_RM_BODY(12, 2)
BF_RM_BODY(12, 1)
BF_RM_BODY(6, 2)
BF_RM_BODY(6, 1)

void vitc__ukr_bf16_rm_avx512(int64_t kg, const uint32_t *a, int64_t lda,
                                     const uint32_t *pb, float *C, int64_t ldc, int64_t mr,
                                     int64_t nr) {
    if (mr <= 6)
        (nr <= 16 ? vitc__ukr_bf16_rm_6x1 : vitc__ukr_bf16_rm_6x2)(kg, a, lda, pb, C, ldc, mr, nr);
    else
        (nr <= 16 ? vitc__ukr_bf16_rm_12x1 : vitc__ukr_bf16_rm_12x2)(kg, a, lda, pb, C, ldc, mr, nr);
}

/* ---- activation converters ---------------------------------------------- */

/* 32 floats (x[0..left), zeros past it) as 16 words of bf16 pairs. */
static inline __m512i vitc__bf16x32(const float *x, int64_t left) {
    __m512 x0 = _mm512_maskz_loadu_ps(vitc__m16(left), x);
    __m512 x1 = _mm512_maskz_loadu_ps(vitc__m16(left - 16), x + 16);
    return (__m512i)_mm512_cvtne2ps_pbh(x1, x0); /* low half from x0 */
}

/* The same of x[k] * s (the product rounded to float first, as the reference). */
static inline __m512i vitc__bf16x32_mul(const float *x, int64_t left, __m512 s) {
    __m512 x0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left), x), s);
    __m512 x1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left - 16), x + 16), s);
    return (__m512i)_mm512_cvtne2ps_pbh(x1, x0);
}

/* 64 floats (x[0..left)) as 16 words of four u8: the reference's vitc__q8,
 * lane by lane; bytes past left are 0, as the reference packs k past K.
 * zp16: the zero point in every 16-bit lane. The clamps are the packs'
 * saturations: to int16, then (after the zero point, saturating) to
 * [0, 255], which give the reference's bytes (its [-256, 511] clamp only
 * keeps the add from wrapping) in a third of the operations. The packs
 * interleave the four vectors by 128-bit lane (lane k: dwords 4k..4k+3 of
 * q0, q1, q2, q3); a dword permute puts each vector's 16 bytes together. */
static inline __m512i vitc__q8x64(const float *x, int64_t left, __m512 inv, __m512i zp16) {
    __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left), x), inv));
    __m512i q1 = _mm512_cvtps_epi32(
        _mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left - 16), x + 16), inv));
    __m512i q2 = _mm512_cvtps_epi32(
        _mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left - 32), x + 32), inv));
    __m512i q3 = _mm512_cvtps_epi32(
        _mm512_mul_ps(_mm512_maskz_loadu_ps(vitc__m16(left - 48), x + 48), inv));
    __m512i w01 = _mm512_adds_epi16(_mm512_packs_epi32(q0, q1), zp16);
    __m512i w23 = _mm512_adds_epi16(_mm512_packs_epi32(q2, q3), zp16);
    __m512i w = _mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
        _mm512_packus_epi16(w01, w23));
    __mmask64 bytes = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
    return _mm512_maskz_mov_epi8(bytes, w);
}

/* The row's min and max, lane by lane (mn, mx: 16 partial results). */
static inline void vitc__q8_minmax(const float *x, int64_t K, __m512 *mn, __m512 *mx) {
    __m512 vmn = _mm512_set1_ps(x[0]), vmx = vmn;
    int64_t k = 0;
    if (K >= 64) { /* four chains each: one min and one max chain ran at 1 vector / 2 cycles */
        __m512 n1 = vmn, n2 = vmn, n3 = vmn, x1 = vmn, x2 = vmn, x3 = vmn;
        for (; k + 64 <= K; k += 64) {
            __m512 v0 = _mm512_loadu_ps(x + k), v1 = _mm512_loadu_ps(x + k + 16);
            __m512 v2 = _mm512_loadu_ps(x + k + 32), v3 = _mm512_loadu_ps(x + k + 48);
            vmn = _mm512_min_ps(vmn, v0), vmx = _mm512_max_ps(vmx, v0);
            n1 = _mm512_min_ps(n1, v1), x1 = _mm512_max_ps(x1, v1);
            n2 = _mm512_min_ps(n2, v2), x2 = _mm512_max_ps(x2, v2);
            n3 = _mm512_min_ps(n3, v3), x3 = _mm512_max_ps(x3, v3);
        }
        vmn = _mm512_min_ps(_mm512_min_ps(vmn, n1), _mm512_min_ps(n2, n3));
        vmx = _mm512_max_ps(_mm512_max_ps(vmx, x1), _mm512_max_ps(x2, x3));
    }
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
    *mn = vmn, *mx = vmx;
}

/* The row's quantization parameters (vitc__q8_params of its min and max). */
static void vitc__q8_row(const float *x, int64_t K, float *scale, float *inv, int32_t *zp) {
    __m512 vmn, vmx;
    vitc__q8_minmax(x, K, &vmn, &vmx);
    vitc__q8_params(_mm512_reduce_min_ps(vmn), _mm512_reduce_max_ps(vmx), scale, inv, zp);
}

/* The same for rows x[i * ldx], i < rows <= 16, at once: their min and max
 * reduced across lanes together (vitc__v_red16), then vitc__q8_params lane
 * by lane (the same operations: the same scale, inverse and zero point).
 * The attention's rows of q (64 values) had spent more in two horizontal
 * reductions and the scalar parameters each than in their loads. */
static void vitc__q8_rows(const float *x, int64_t ldx, int64_t rows, int64_t K, float *scale,
                          float *inv, int32_t *zp) {
    __m512 mn[16], mx[16];
    for (int64_t i = 0; i < 16; i++) {
        if (i < rows)
            vitc__q8_minmax(x + i * ldx, K, &mn[i], &mx[i]);
        else
            mn[i] = mx[i] = _mm512_setzero_ps();
    }
    const __m512 zero = _mm512_setzero_ps();
    /* if (mn > 0) mn = 0, if (mx < 0) mx = 0: vminps returns its second
     * operand for NaN and for equal zeros, as the comparisons keep mn */
    __m512 vmn = _mm512_min_ps(zero, vitc__v_red16(mn, VITC_RED_MIN));
    __m512 vmx = _mm512_max_ps(zero, vitc__v_red16(mx, VITC_RED_MAX));
    __m512 s = _mm512_div_ps(_mm512_sub_ps(vmx, vmn), _mm512_set1_ps(255.0f));
    __mmask16 ok = _mm512_cmp_ps_mask(s, zero, _CMP_GT_OQ) &
                   _mm512_cmp_ps_mask(s, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    s = _mm512_mask_blend_ps(ok, _mm512_set1_ps(1.0f), s);
    __m512 iv = _mm512_div_ps(_mm512_set1_ps(1.0f), s);
    __m512 z = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_xor_ps(vmn, _mm512_set1_ps(-0.0f)), iv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512i q = _mm512_cvtps_epi32(_mm512_min_ps(z, _mm512_set1_ps(255.0f)));
    q = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(z, zero, _CMP_GT_OQ), q); /* NaN, <= 0: 0 */
    const __mmask16 m = vitc__m16(rows);
    _mm512_mask_storeu_ps(scale, m, s);
    _mm512_mask_storeu_ps(inv, m, iv);
    _mm512_mask_storeu_epi32(zp, m, q);
}

/* Word p of the row to dst[p * stride]: stored as they are when the stride
 * is 1, else scattered down the strip (the attention's K and V panels). */
void vitc__row_bf16_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                  float *scale, int32_t *zp) {
    (void)zp;
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)stride));
    const __m512 s = _mm512_set1_ps(scale ? *scale : 1.0f);
    for (int64_t k = 0; k < K; k += 32) {
        __m512i w = scale ? vitc__bf16x32_mul(x + k, K - k, s) : vitc__bf16x32(x + k, K - k);
        if (stride == 1)
            _mm512_mask_storeu_epi32(dst + k / 2, vitc__m16((K - k + 1) / 2), w);
        else
            _mm512_mask_i32scatter_epi32(dst + (k / 2) * stride, vitc__m16((K - k + 1) / 2), idx, w, 4);
    }
}

void vitc__row_int8_avx512(uint32_t *dst, int64_t stride, const float *x, int64_t K,
                                  float *scale, int32_t *zp) {
    float inv;
    vitc__q8_row(x, K, scale, &inv, zp);
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512i vz = _mm512_set1_epi16((short)*zp);
    const __m512i idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32((int)stride));
    for (int64_t k = 0; k < K; k += 64) {
        __m512i w = vitc__q8x64(x + k, K - k, vinv, vz);
        __mmask16 m = vitc__m16((K - k + 3) / 4);
        if (stride == 1)
            _mm512_mask_storeu_epi32(dst + k / 4, m, w);
        else
            _mm512_mask_i32scatter_epi32(dst + (k / 4) * stride, m, idx, w, 4);
    }
}

/* r[i] lane j <-> r[j] lane i (16 x 16 words): 32-bit then 64-bit unpacks
 * transpose the 4 x 4 blocks inside each 128-bit lane, two rounds of
 * vshufi32x4 move the blocks. */
__attribute__((always_inline)) static inline void vitc__tr16(__m512i r[16]) {
    __m512i t[16], s[16];
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
        t[i + 2] = _mm512_unpacklo_epi32(r[i + 2], r[i + 3]);
        t[i + 3] = _mm512_unpackhi_epi32(r[i + 2], r[i + 3]);
        s[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);     /* columns 0, 4, 8, 12 */
        s[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]); /* 1, 5, 9, 13 */
        s[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        s[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512i ul = _mm512_shuffle_i32x4(s[k], s[4 + k], 0x88); /* cols k, k + 8; rows 0-7 */
        __m512i uh = _mm512_shuffle_i32x4(s[k], s[4 + k], 0xDD); /* cols k + 4, k + 12 */
        __m512i wl = _mm512_shuffle_i32x4(s[8 + k], s[12 + k], 0x88); /* rows 8-15 */
        __m512i wh = _mm512_shuffle_i32x4(s[8 + k], s[12 + k], 0xDD);
        r[k] = _mm512_shuffle_i32x4(ul, wl, 0x88);
        r[k + 8] = _mm512_shuffle_i32x4(ul, wl, 0xDD);
        r[k + 4] = _mm512_shuffle_i32x4(uh, wh, 0x88);
        r[k + 12] = _mm512_shuffle_i32x4(uh, wh, 0xDD);
    }
}

/* Words p0 .. p0 + np of the strip from r (row i in r[i]): transposed, word
 * p's w rows stored together at dst[p * ldd]. Replaces a scatter per row
 * (microcoded) by shuffles and plain stores. */
__attribute__((always_inline)) static inline void vitc__strip_store(uint32_t *dst, int64_t ldd,
                                                                  int w, __m512i r[16],
                                                                  int64_t np) {
    vitc__tr16(r);
    const __mmask16 m = vitc__m16(w);
#pragma GCC unroll 16
    for (int64_t c = 0; c < np; c++) _mm512_mask_storeu_epi32(dst + c * ldd, m, r[c]);
}

/* The rows' next lines, four chunks ahead: twelve or sixteen rows far
 * apart outrun the hardware prefetcher. */
static inline void vitc__strip_prefetch(const float *x, int64_t k, int64_t K) {
    if (k + 144 < K) {
        _mm_prefetch((const char *)(x + k + 128), _MM_HINT_T0);
        _mm_prefetch((const char *)(x + k + 144), _MM_HINT_T0);
    }
}

/* The converters' bodies for a width W known when compiled (MR or 16), so
 * that r[] stays in registers and the rows past W fold away. */
__attribute__((always_inline)) static inline void
vitc__strip_bf16_w(uint32_t *dst, int64_t ldd, const int W, const float *x, int64_t ldx,
                   int64_t rows, int64_t K) {
    const int64_t kg = (K + 1) / 2;
    for (int64_t k = 0; k < K; k += 32) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            r[i] = _mm512_setzero_si512();
            if (i < W && i < rows) {
                vitc__strip_prefetch(x + i * ldx, k, K);
                r[i] = vitc__bf16x32(x + i * ldx + k, K - k);
            }
        }
        vitc__strip_store(dst + (k / 2) * ldd, ldd, W, r, kg - k / 2 < 16 ? kg - k / 2 : 16);
    }
}

void vitc__strip_bf16_avx512(uint32_t *dst, int64_t ldd, int w, const float *x,
                                    int64_t ldx, int64_t rows, int64_t K, float *scale,
                                    int32_t *zp) {
    (void)scale, (void)zp;
    if (w == MR)
        vitc__strip_bf16_w(dst, ldd, MR, x, ldx, rows, K);
    else
        vitc__strip_bf16_w(dst, ldd, 16, x, ldx, rows, K);
}

__attribute__((always_inline)) static inline void
vitc__strip_int8_w(uint32_t *dst, int64_t ldd, const int W, const float *x, int64_t ldx,
                   int64_t rows, int64_t K, float *scale, int32_t *zp) {
    const int64_t kg = (K + 3) / 4;
    float inv[16];
    int32_t unit_zp[16];
    if (!scale) zp = unit_zp; /* strip_unit: values in [0, 1], scale 1/255 */
    if (scale)
        vitc__q8_rows(x, ldx, rows, K, scale, inv, zp);
    else
        for (int64_t i = 0; i < rows; i++) inv[i] = 255.0f, zp[i] = 0;
    for (int64_t k = 0; k < K; k += 64) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            r[i] = _mm512_setzero_si512();
            if (i < W && i < rows)
                r[i] = vitc__q8x64(x + i * ldx + k, K - k, _mm512_set1_ps(inv[i]),
                                   _mm512_set1_epi16((short)zp[i]));
        }
        vitc__strip_store(dst + (k / 4) * ldd, ldd, W, r, kg - k / 4 < 16 ? kg - k / 4 : 16);
    }
}

void vitc__strip_int8_avx512(uint32_t *dst, int64_t ldd, int w, const float *x,
                                    int64_t ldx, int64_t rows, int64_t K, float *scale,
                                    int32_t *zp) {
    if (w == MR)
        vitc__strip_int8_w(dst, ldd, MR, x, ldx, rows, K, scale, zp);
    else
        vitc__strip_int8_w(dst, ldd, 16, x, ldx, rows, K, scale, zp);
}

/* 16 floats to s8 in int32 lanes: the reference's vitc__s8, lane by lane. */
static inline __m512i vitc__s8x16(__m512 x, __m512 inv) {
    __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(x, inv)); /* MXCSR: nearest even */
    return _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
}

/* vitc__s8_params lane by lane (the same division and checks). */
static inline __m512 vitc__s8_inv(__m512 amax, __m512 *scale) {
    __m512 s = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
    __mmask16 ok = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ) &
                   _mm512_cmp_ps_mask(s, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
    s = _mm512_mask_blend_ps(ok, _mm512_set1_ps(1.0f), s);
    *scale = s;
    return _mm512_div_ps(_mm512_set1_ps(1.0f), s);
}

/* max(|x|, m): a NaN x leaves m, as the reference's comparison does. */
static inline __m512 vitc__amax16(__m512 x, __m512 m) { return _mm512_max_ps(_mm512_abs_ps(x), m); }

static void vitc__s8_rows_avx512(uint32_t *dst, int64_t ldd, const float *x, int64_t ldx,
                                 int64_t rows, int64_t K, float *scale, int32_t *sum) {
    const int64_t kg = (K + 3) / 4;
    float inv[16];
    for (int64_t i = 0; i < rows; i++) {
        const float *xi = x + i * ldx; /* [K] */
        __m512 m = _mm512_setzero_ps();
        for (int64_t k = 0; k < K; k += 16)
            m = vitc__amax16(_mm512_maskz_loadu_ps(vitc__m16(K - k), xi + k), m);
        vitc__s8_params(_mm512_reduce_max_ps(m), &scale[i], &inv[i]);
        sum[i] = 0;
    }
    for (int64_t k = 0; k < K; k += 64) {
        __m512i r[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            r[i] = _mm512_setzero_si512();
            if (i < rows) {
                const float *xi = x + i * ldx + k;
                const __m512 vi = _mm512_set1_ps(inv[i]);
                __m512i q0 = vitc__s8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k), xi), vi);
                __m512i q1 = vitc__s8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 16), xi + 16), vi);
                __m512i q2 = vitc__s8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 32), xi + 32), vi);
                __m512i q3 = vitc__s8x16(_mm512_maskz_loadu_ps(vitc__m16(K - k - 48), xi + 48), vi);
                sum[i] += _mm512_reduce_add_epi32(
                    _mm512_add_epi32(_mm512_add_epi32(q0, q1), _mm512_add_epi32(q2, q3)));
                __m512i w = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(q0));
                w = _mm512_inserti32x4(w, _mm512_cvtepi32_epi8(q1), 1);
                w = _mm512_inserti32x4(w, _mm512_cvtepi32_epi8(q2), 2);
                r[i] = _mm512_inserti32x4(w, _mm512_cvtepi32_epi8(q3), 3);
            }
        }
        vitc__strip_store(dst + (k / 4) * ldd, ldd, 16, r, kg - k / 4 < 16 ? kg - k / 4 : 16);
    }
}

static void vitc__s8_quads_avx512(uint32_t *dst, const float *x, int64_t ldx, int64_t S,
                                  int64_t n, float *scale, int32_t *sum) {
    const __mmask16 m0 = vitc__m16(n), m1 = vitc__m16(n - 16);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, s0, s1;
    for (int64_t j = 0; j < S; j++) {
        a0 = vitc__amax16(_mm512_maskz_loadu_ps(m0, x + j * ldx), a0);
        a1 = vitc__amax16(_mm512_maskz_loadu_ps(m1, x + j * ldx + 16), a1);
    }
    const __m512 i0 = vitc__s8_inv(a0, &s0), i1 = vitc__s8_inv(a1, &s1);
    const __m512i low = _mm512_set1_epi32(0xFF);
    __m512i t0 = _mm512_setzero_si512(), t1 = t0;
    for (int64_t p = 0; 4 * p < S; p++) {
        __m512i w0 = _mm512_setzero_si512(), w1 = w0;
        for (int q = 0; q < 4 && 4 * p + q < S; q++) {
            const float *xj = x + (4 * p + q) * ldx;
            __m512i q0 = vitc__s8x16(_mm512_maskz_loadu_ps(m0, xj), i0);
            __m512i q1 = vitc__s8x16(_mm512_maskz_loadu_ps(m1, xj + 16), i1);
            t0 = _mm512_add_epi32(t0, q0), t1 = _mm512_add_epi32(t1, q1);
            w0 = _mm512_or_si512(w0, _mm512_slli_epi32(_mm512_and_si512(q0, low), 8 * q));
            w1 = _mm512_or_si512(w1, _mm512_slli_epi32(_mm512_and_si512(q1, low), 8 * q));
        }
        _mm512_storeu_si512((void *)(dst + p * NR), w0);
        _mm512_storeu_si512((void *)(dst + p * NR + 16), w1);
    }
    _mm512_mask_storeu_ps(scale, m0, s0), _mm512_mask_storeu_ps(scale + 16, m1, s1);
    _mm512_mask_storeu_epi32(sum, m0, t0), _mm512_mask_storeu_epi32(sum + 16, m1, t1);
}

/* dst[c] = bf16(x0[c]) | bf16(x1[c]) << 16 (x1 NULL: 0), c < n. */
void vitc__pairs_bf16_avx512(uint32_t *dst, const float *x0, const float *x1, int64_t n) {
    for (int64_t c = 0; c < n; c += 16) {
        __mmask16 m = vitc__m16(n - c);
        __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x0 + c)));
        __m512i hi = _mm512_setzero_si512();
        if (x1)
            hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x1 + c)));
        _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

static void vitc__strip_unit_avx512(uint32_t *dst, int64_t ldd, int w, const float *x,
                                    int64_t ldx, int64_t rows, int64_t K, float *scale,
                                    int32_t *zp) {
    (void)scale, (void)zp;
    if (w == MR)
        vitc__strip_int8_w(dst, ldd, MR, x, ldx, rows, K, NULL, NULL);
    else
        vitc__strip_int8_w(dst, ldd, 16, x, ldx, rows, K, NULL, NULL);
}

const vitc__lp_kernel vitc__lp_bf16_avx512 = {"avx512-bf16", vitc__ukr_bf16_avx512,
                                              vitc__row_bf16_avx512, vitc__strip_bf16_avx512,
                                              vitc__ukr_bf16_rm_avx512, vitc__pairs_bf16_avx512, 1,
                                              MR, 0, NULL, NULL, 1, NULL, NULL, NULL, 0, 0};
const vitc__lp_kernel vitc__lp_int8_avx512 = {"avx512-vnni", vitc__ukr_int8_avx512,
                                              vitc__row_int8_avx512, vitc__strip_int8_avx512,
                                              NULL, NULL, 1, MR, 0, NULL, NULL, 1,
                                              vitc__s8_rows_avx512, vitc__s8_quads_avx512,
                                              vitc__strip_unit_avx512, 0, 0};
