/*
 * gemm_avx512.c — the AVX-512 GEMM microkernel (12 x 32) and B packer.
 *
 * 12 rows x 2 zmm = 24 accumulators; per k: 2 loads of packed B and 12
 * broadcasts of packed A feed 24 FMAs, enough independent chains to cover
 * the 4-cycle FMA latency on two ports (BLIS skx uses the same register
 * shape, transposed). Edges are clipped with store masks, so every tile runs
 * the same code.
 */
#include <immintrin.h>
#include <string.h>

#include "../gemm_ukernels.h"
#include "../ops_simd.h"
#include "vmath_avx512.h"

#define MR 12
#define NR 32


static inline __mmask16 vitc__mask16(int64_t n) {
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* One output row: 32 accumulators' worth, masked to the valid columns.
 * With e->gelu the finished values go to gt[0], gt[1] instead, for
 * vitc__v_gelu_tile to store once the tile is done. */
static inline void vitc__row_out(float *c, __m512 a0, __m512 a1, __mmask16 m0, __mmask16 m1,
                                 const vitc__gemm_epi *e, const float *res, const float *lres,
                                 __m512 *gt) {
    __m512 al = _mm512_set1_ps(e->alpha), v0, v1;
    if (!e->first) {
        v0 = _mm512_fmadd_ps(al, a0, _mm512_maskz_loadu_ps(m0, c));
        v1 = _mm512_fmadd_ps(al, a1, _mm512_maskz_loadu_ps(m1, c + 16));
    } else {
        v0 = _mm512_mul_ps(al, a0), v1 = _mm512_mul_ps(al, a1);
        if (e->beta != 0.0f) {
            __m512 be = _mm512_set1_ps(e->beta);
            v0 = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(m0, c), v0);
            v1 = _mm512_fmadd_ps(be, _mm512_maskz_loadu_ps(m1, c + 16), v1);
        }
        if (e->bias) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, e->bias));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, e->bias + 16));
        }
        if (res) {
            v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, res));
            v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, res + 16));
        }
    }
    if (e->ls) { /* scale_add's operations: r + (ls * C) */
        v0 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m0, e->ls), v0);
        v1 = _mm512_mul_ps(_mm512_maskz_loadu_ps(m1, e->ls + 16), v1);
        if (lres) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, lres), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, lres + 16), v1);
        }
    }
    if (e->gelu) {
        gt[0] = v0, gt[1] = v1;
        return;
    }
    _mm512_mask_storeu_ps(c, m0, v0);
    _mm512_mask_storeu_ps(c + 16, m1, v1);
}

/* The tile's rows of C (and of the residual) asked for at the start, so
 * that the epilogue's loads and stores find them in L1 once the k loop is
 * done: both 64-byte lines of each 32-column row. */
static inline void vitc__prefetch_tile(const float *C, int64_t ldc, int64_t mr, int64_t nr,
                                       const float *res, int64_t ldr) {
    for (int64_t i = 0; i < mr; i++) {
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);
        if (nr > 16) _mm_prefetch((const char *)(C + i * ldc + 16), _MM_HINT_T0);
        if (res) {
            _mm_prefetch((const char *)(res + i * ldr), _MM_HINT_T0);
            if (nr > 16) _mm_prefetch((const char *)(res + i * ldr + 16), _MM_HINT_T0);
        }
    }
}

#define VITC_ROW(i)                                                          \
    do {                                                                     \
        __m512 a = _mm512_set1_ps(pa[i]);                                    \
        c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);                           \
        c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1);                           \
    } while (0)

#define VITC_OUT(i)                                                                          \
    if (i < mr)                                                                              \
    vitc__row_out(C + (i) * ldc, c##i##0, c##i##1, m0, m1, e,                                \
                  e->res ? e->res + (i) * e->ldr : NULL,                                     \
                  e->lres ? e->lres + (i) * e->ldlr : NULL, gt + 2 * (i))

/* A short tile (mr <= R < MR: a 197- or 257-row product's last 5 rows, a
 * class-token row, a 7-token product against an image's 4096 keys; or R =
 * MR with W = 1, below) with R rows of W accumulators instead of 12 x 2:
 * the same FMAs in the same order for the rows it has, so bitwise the full
 * kernel's result, at R/12 (W/2) of its cost. st 0: from packed strips
 * (pa strips of MR, pb of NR, b_ks NR); st 1: A and B read in place as
 * ukr_st reads them (rows past mr re-read row 0, B's columns past nr
 * masked). */
static inline __attribute__((always_inline)) void
vitc__ukr_short_w(const int R, const int st, const int W, int64_t kc, const float *A,
                  int64_t a_ks, int64_t a_rs, const float *B, int64_t b_ks, float *C,
                  int64_t ldc, int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    __m512 c[MR][2];
    const float *r[MR];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++) {
        c[i][0] = c[i][1] = _mm512_setzero_ps();
        r[i] = A + (i < mr ? i : 0) * a_rs;
    }
    __mmask16 m0 = vitc__mask16(nr), m1 = vitc__mask16(nr - 16);
    vitc__prefetch_tile(C, ldc, mr, nr, e->res ? e->res : e->lres, e->res ? e->ldr : e->ldlr);
    const char *pf = e->pf;
    int64_t pfn = e->pf_lines;
    const int64_t pfs = VITC_PF_STEP(pfn, kc);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = st ? _mm512_maskz_loadu_ps(m0, B) : _mm512_load_ps(B);
        __m512 b1 = W == 1 ? b0 : st ? _mm512_maskz_loadu_ps(m1, B + 16) : _mm512_load_ps(B + 16);
        for (int64_t l = 0; l < pfs && pfn > 0; l++) _mm_prefetch(pf, _MM_HINT_T1), pf += 64, pfn--;
#pragma GCC unroll 12
        for (int i = 0; i < R; i++) {
            __m512 a = _mm512_set1_ps(st ? r[i][0] : A[i]);
            c[i][0] = _mm512_fmadd_ps(a, b0, c[i][0]);
            if (W == 2) c[i][1] = _mm512_fmadd_ps(a, b1, c[i][1]);
            if (st) r[i] += a_ks;
        }
        if (!st) A += a_ks;
        B += b_ks;
    }
    __m512 gt[2 * MR];
#pragma GCC unroll 12
    for (int i = 0; i < R; i++)
        if (i < mr)
            vitc__row_out(C + i * ldc, c[i][0], c[i][1], m0, m1, e,
                          e->res ? e->res + i * e->ldr : NULL,
                          e->lres ? e->lres + i * e->ldlr : NULL, gt + 2 * i);
    if (e->gelu) vitc__v_gelu_tile(C, ldc, gt, mr, m0, m1);
}

/* W = 1 when the tile has 16 columns or fewer (a head's 16 values against
 * an image's keys, [T, 4096] x [4096, 16]): the second vector's FMAs, all
 * on zero columns, are left out. Its columns' FMAs are the same, in the
 * same order: the same bits. */
static inline __attribute__((always_inline)) void
vitc__ukr_short(const int R, const int st, int64_t kc, const float *A, int64_t a_ks, int64_t a_rs,
                const float *B, int64_t b_ks, float *C, int64_t ldc, int64_t mr, int64_t nr,
                const vitc__gemm_epi *e) {
    if (nr <= 16)
        vitc__ukr_short_w(R, st, 1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
    else
        vitc__ukr_short_w(R, st, 2, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
}

static void vitc__ukr_avx512(int64_t kc, const float *pa, const float *pb, float *C, int64_t ldc,
                             int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    if (mr <= 4) {
        vitc__ukr_short(4, 0, kc, pa, MR, 1, pb, NR, C, ldc, mr, nr, e);
        return;
    }
    if (mr <= 6) { /* 12 chains still cover the FMA latency */
        vitc__ukr_short(6, 0, kc, pa, MR, 1, pb, NR, C, ldc, mr, nr, e);
        return;
    }
    if (mr <= 8) {
        vitc__ukr_short(8, 0, kc, pa, MR, 1, pb, NR, C, ldc, mr, nr, e);
        return;
    }
    if (nr <= 16) { /* 12 rows of one vector: 12 chains */
        vitc__ukr_short_w(12, 0, 1, kc, pa, MR, 1, pb, NR, C, ldc, mr, nr, e);
        return;
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
    /* As in the bf16 / int8 kernel (gemm_lp_avx512.c): C's rows asked for
     * at the start and again a line a step over the loop's last 2 mr
     * steps; the residual's (read in the first K block) a row a step over
     * its first mr steps. All at the start, the epilogue still missed. */
    vitc__prefetch_tile(C, ldc, mr, nr, NULL, 0);
    const char *pf = e->pf;
    int64_t pfn = e->pf_lines;
    const int64_t pfs = VITC_PF_STEP(pfn, kc);
    /* the residual added in this K block: the first's, or the layer
     * scale's on the last */
    const float *res = e->first && e->res ? e->res : e->ls ? e->lres : NULL;
    const int64_t ldr = e->first && e->res ? e->ldr : e->ldlr;
    int64_t k1 = mr < kc ? mr : kc, tail = kc - k1 < 2 * mr ? kc - k1 : 2 * mr;
#define VITC_STEP                                                                 \
    {                                                                             \
        __m512 b0 = _mm512_load_ps(pb), b1 = _mm512_load_ps(pb + 16);             \
        for (int64_t l = 0; l < pfs && pfn > 0; l++)                              \
            _mm_prefetch(pf, _MM_HINT_T1), pf += 64, pfn--;                       \
        VITC_ROW(0); VITC_ROW(1); VITC_ROW(2); VITC_ROW(3); VITC_ROW(4); VITC_ROW(5); \
        VITC_ROW(6); VITC_ROW(7); VITC_ROW(8); VITC_ROW(9); VITC_ROW(10); VITC_ROW(11); \
        pa += MR;                                                                 \
        pb += NR;                                                                 \
    }
    for (int64_t k = 0; k < k1; k++) {
        if (res) {
            _mm_prefetch((const char *)(res + k * ldr), _MM_HINT_T0);
            _mm_prefetch((const char *)(res + k * ldr + 16), _MM_HINT_T0);
        }
        VITC_STEP
    }
#pragma GCC unroll 4
    for (int64_t k = k1; k < kc - tail; k++) VITC_STEP
#pragma GCC unroll 4
    for (int64_t k = 0; k < tail; k++) {
        _mm_prefetch((const char *)(C + (k >> 1) * ldc + (k & 1) * 16), _MM_HINT_T0);
        VITC_STEP
    }
#undef VITC_STEP
    __mmask16 m0 = vitc__mask16(nr), m1 = vitc__mask16(nr - 16);
    __m512 gt[2 * MR];
    VITC_OUT(0); VITC_OUT(1); VITC_OUT(2); VITC_OUT(3); VITC_OUT(4); VITC_OUT(5);
    VITC_OUT(6); VITC_OUT(7); VITC_OUT(8); VITC_OUT(9); VITC_OUT(10); VITC_OUT(11);
    if (e->gelu) vitc__v_gelu_tile(C, ldc, gt, mr, m0, m1);
}

/* The same tile with A and B read in place (gemm_ukernels.h): element
 * (r, k) of A at a[k * a_ks + r * a_rs], row k of B's strip at b + k * b_ks,
 * loaded under the nr mask (nothing past the matrix is read). Rows past mr
 * re-read row 0 and are never stored. The same FMAs in the same order as
 * the packed kernel above: bitwise its result. */
#define VITC_ROW_ST(i)                                                       \
    do {                                                                     \
        __m512 a = _mm512_set1_ps(r##i[0]);                                  \
        c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);                           \
        c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1);                           \
    } while (0)

static void vitc__ukr_st_avx512(int64_t kc, const float *A, int64_t a_ks, int64_t a_rs,
                                const float *B, int64_t b_ks, float *C, int64_t ldc, int64_t mr,
                                int64_t nr, const vitc__gemm_epi *e) {
    if (mr <= 4) {
        vitc__ukr_short(4, 1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
        return;
    }
    if (mr <= 6) {
        vitc__ukr_short(6, 1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
        return;
    }
    if (mr <= 8) {
        vitc__ukr_short(8, 1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
        return;
    }
    if (nr <= 16) {
        vitc__ukr_short_w(12, 1, 1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
        return;
    }
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m512 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    __m512 c60 = c00, c61 = c00, c70 = c00, c71 = c00, c80 = c00, c81 = c00;
    __m512 c90 = c00, c91 = c00, c100 = c00, c101 = c00, c110 = c00, c111 = c00;
#define VITC_RP(i) const float *r##i = A + ((i) < mr ? (i) : 0) * a_rs
    VITC_RP(0); VITC_RP(1); VITC_RP(2); VITC_RP(3); VITC_RP(4); VITC_RP(5);
    VITC_RP(6); VITC_RP(7); VITC_RP(8); VITC_RP(9); VITC_RP(10); VITC_RP(11);
#undef VITC_RP
    __mmask16 m0 = vitc__mask16(nr), m1 = vitc__mask16(nr - 16);
    vitc__prefetch_tile(C, ldc, mr, nr, e->res ? e->res : e->lres, e->res ? e->ldr : e->ldlr);
    const char *pf = e->pf;
    int64_t pfn = e->pf_lines;
    const int64_t pfs = VITC_PF_STEP(pfn, kc);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m512 b0 = _mm512_maskz_loadu_ps(m0, B), b1 = _mm512_maskz_loadu_ps(m1, B + 16);
        for (int64_t l = 0; l < pfs && pfn > 0; l++) _mm_prefetch(pf, _MM_HINT_T1), pf += 64, pfn--;
        VITC_ROW_ST(0); VITC_ROW_ST(1); VITC_ROW_ST(2); VITC_ROW_ST(3); VITC_ROW_ST(4);
        VITC_ROW_ST(5); VITC_ROW_ST(6); VITC_ROW_ST(7); VITC_ROW_ST(8); VITC_ROW_ST(9);
        VITC_ROW_ST(10); VITC_ROW_ST(11);
        r0 += a_ks, r1 += a_ks, r2 += a_ks, r3 += a_ks, r4 += a_ks, r5 += a_ks;
        r6 += a_ks, r7 += a_ks, r8 += a_ks, r9 += a_ks, r10 += a_ks, r11 += a_ks;
        B += b_ks;
    }
    __m512 gt[2 * MR];
    VITC_OUT(0); VITC_OUT(1); VITC_OUT(2); VITC_OUT(3); VITC_OUT(4); VITC_OUT(5);
    VITC_OUT(6); VITC_OUT(7); VITC_OUT(8); VITC_OUT(9); VITC_OUT(10); VITC_OUT(11);
    if (e->gelu) vitc__v_gelu_tile(C, ldc, gt, mr, m0, m1);
}

/* In-register transpose of 16 rows of 16 (unpack, 128-bit-lane shuffles).
 * The unroll pragmas here and in the packers matter: -O2 does not unroll,
 * and loops over arrays of vectors left rolled keep r[] and t[] on the
 * stack (a store and a reload per shuffle): the A packer ran 2.7x slower
 * (1 cycle a float against 0.37, measured at 197 x 768). */
static inline __attribute__((always_inline)) void vitc__tr16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88);
        t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
        r[8 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD);
        r[4 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
        r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD);
    }
}

/* B transposed (a Linear's W [N, K]) is the common case and the packing
 * reads it across rows: full 32-column strips go through 16 x 16 register
 * transposes; anything else takes the portable packer. */
static void vitc__packb_avx512(float *pb, const float *B, int64_t ldb, int trans, int64_t k0,
                               int64_t kc, int64_t j0, int64_t nc) {
    if (!trans) {
        for (int64_t s = 0; s + NR <= nc; s += NR) {
            float *dst = pb + s * kc;
            const float *src = B + k0 * ldb + j0 + s;
            for (int64_t k = 0; k < kc; k++) {
                _mm512_store_ps(dst + k * NR, _mm512_loadu_ps(src + k * ldb));
                _mm512_store_ps(dst + k * NR + 16, _mm512_loadu_ps(src + k * ldb + 16));
            }
        }
    } else {
        for (int64_t s = 0; s + NR <= nc; s += NR) {
            float *dst = pb + s * kc;
            for (int h = 0; h < 2; h++) {
                const float *src = B + (j0 + s + 16 * h) * ldb + k0;
                int64_t k = 0;
                for (; k + 16 <= kc; k += 16) {
                    __m512 r[16];
                    /* 16 row streams: prefetch as in the A packer */
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++)
                        _mm_prefetch((const char *)(src + i * ldb + k + 64), _MM_HINT_T0);
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src + i * ldb + k);
                    vitc__tr16(r);
#pragma GCC unroll 16
                    for (int i = 0; i < 16; i++) _mm512_store_ps(dst + (k + i) * NR + 16 * h, r[i]);
                }
                for (; k < kc; k++)
                    for (int i = 0; i < 16; i++) dst[k * NR + 16 * h + i] = src[i * ldb + k];
            }
        }
    }
    int64_t full = nc / NR * NR;
    if (full < nc)
        vitc__gemm_packb_generic(pb + full * kc, NR, B, ldb, trans, k0, kc, j0 + full, nc - full);
}

/* One strip of a row-major A: rows (<= MR) rows from src, the rest of the
 * strip zero as in the portable packer. Always inlined: the full strips
 * get rows = MR as a constant, so no per-row test is left in them. */
static inline __attribute__((always_inline)) void vitc__packa_strip(float *dst, const float *src,
                                                                    int64_t lda, int rows,
                                                                    int64_t kc) {
    const __mmask16 m12 = 0x0FFF;
    int64_t k = 0;
    for (; k + 16 <= kc; k += 16) {
        __m512 r[16];
        /* 12 row streams at once are more than the hardware prefetcher
         * follows well: ask for the lines 4 chunks ahead. */
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++)
            if (i < rows) _mm_prefetch((const char *)(src + i * lda + k + 64), _MM_HINT_T0);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            r[i] = i < rows ? _mm512_loadu_ps(src + i * lda + k) : _mm512_setzero_ps();
        vitc__tr16(r);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(dst + (k + i) * MR, m12, r[i]);
    }
    for (; k < kc; k++)
        for (int i = 0; i < MR; i++) dst[k * MR + i] = i < rows ? src[i * lda + k] : 0.0f;
}

/* A row-major (activations) is read across MR rows per k: strips go
 * through the 16 x 16 transpose (4 zero rows) and 12-lane masked stores,
 * the last, short one too (a ViT's 197 rows end in 5). */
static void vitc__packa_avx512(float *pa, const float *A, int64_t lda, int trans, int64_t i0,
                               int64_t mc, int64_t k0, int64_t kc, float *asum) {
    const __mmask16 m12 = 0x0FFF;
    int64_t s = 0;
    for (; s + MR <= mc; s += MR) {
        float *dst = pa + s * kc;
        if (trans) {
            const float *src = A + k0 * lda + i0 + s;
            if (asum) { /* the same adds, k ascending, as a scalar loop */
                __m512 acc = _mm512_maskz_loadu_ps(m12, asum + s);
                for (int64_t k = 0; k < kc; k++) {
                    __m512 x = _mm512_maskz_loadu_ps(m12, src + k * lda);
                    _mm512_mask_storeu_ps(dst + k * MR, m12, x);
                    acc = _mm512_add_ps(acc, x);
                }
                _mm512_mask_storeu_ps(asum + s, m12, acc);
                continue;
            }
            for (int64_t k = 0; k < kc; k++)
                _mm512_mask_storeu_ps(dst + k * MR, m12, _mm512_maskz_loadu_ps(m12, src + k * lda));
            continue;
        }
        vitc__packa_strip(dst, A + (i0 + s) * lda + k0, lda, MR, kc);
    }
    if (s < mc && !trans)
        vitc__packa_strip(pa + s * kc, A + (i0 + s) * lda + k0, lda, (int)(mc - s), kc);
    else if (s < mc)
        vitc__gemm_packa_generic(pa + s * kc, MR, A, lda, trans, i0 + s, mc - s, k0, kc,
                                 asum ? asum + s : NULL);
}

/* Blocks measured on a Zen 5 core (48 KB L1, 1 MB L2), KC from 128 to 1024:
 * a deep KC wins (C is read and written once per KC block, and at K = 768
 * the whole product is one block), even though the 1024 x 32 B micro-panel
 * then streams from L2 rather than sitting in L1. MC x KC (288 KB of A)
 * stays in L2; NC = 1024 keeps the packed B panel at 4 MB per thread.
 * A is read unpacked up to K = VITC_DIRECT_KC: 12 rows of it are then at
 * most 15 KB, an L1 share next to the B micro-panel. */
#define VITC_DIRECT_KC 320
const vitc__gemm_kernel vitc__gemm_kernel_avx512 = {
    MR, NR, 1024, 72, 1024, vitc__ukr_avx512, vitc__packb_avx512, vitc__packa_avx512,
    vitc__ukr_st_avx512, VITC_DIRECT_KC, vitc__gelu_avx512, 1,
};
