/*
 * gemm_avx2.c — the AVX2/FMA GEMM microkernel, 6 x 16.
 *
 * 6 rows x 2 ymm = 12 accumulators, 2 B loads and 6 broadcasts per k: the
 * classic Haswell shape (BLIS haswell sgemm is 6 x 16), which leaves room
 * in the 16 ymm registers for B and a broadcast. Full tiles apply the
 * epilogue in registers; edge tiles spill to a small buffer.
 *
 * The packers and the in-place kernel (ukr_st) are here for the products
 * of width 96 to 288 a small ViT trains on: a Fashion-MNIST training step
 * on a Zen 3 spent 27% of its time in the portable packers.
 */
#include <immintrin.h>

#include "../gemm_ukernels.h"
#include "attention_t8.h"
#include "vmath_avx2.h"

#define MR 6
#define NR 16

static inline void vitc__row_out8(float *c, __m256 a, const vitc__gemm_epi *e, const float *bias,
                                  const float *res) {
    __m256 al = _mm256_set1_ps(e->alpha);
    if (!e->first) {
        _mm256_storeu_ps(c, _mm256_fmadd_ps(al, a, _mm256_loadu_ps(c)));
        return;
    }
    __m256 v = _mm256_mul_ps(al, a);
    if (e->beta != 0.0f) v = _mm256_fmadd_ps(_mm256_set1_ps(e->beta), _mm256_loadu_ps(c), v);
    if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias));
    if (res) v = _mm256_add_ps(v, _mm256_loadu_ps(res));
    _mm256_storeu_ps(c, v);
}

/* The finished tile: a full one through the epilogue in registers, an
 * edge one spilled to a buffer for the portable epilogue. */
static inline __attribute__((always_inline)) void vitc__tile_out(__m256 acc[MR][2], float *C,
                                                                 int64_t ldc, int64_t mr,
                                                                 int64_t nr,
                                                                 const vitc__gemm_epi *e) {
    if (mr == MR && nr == NR) {
        for (int i = 0; i < MR; i++) {
            const float *res = e->res ? e->res + i * e->ldr : NULL;
            vitc__row_out8(C + i * ldc, acc[i][0], e, e->bias, res);
            vitc__row_out8(C + i * ldc + 8, acc[i][1], e, e->bias ? e->bias + 8 : NULL,
                           res ? res + 8 : NULL);
        }
        return;
    }
    _Alignas(32) float tile[MR * NR];
    for (int i = 0; i < MR; i++) {
        _mm256_store_ps(tile + i * NR, acc[i][0]);
        _mm256_store_ps(tile + i * NR + 8, acc[i][1]);
    }
    vitc__gemm_epilogue_tile(C, ldc, tile, NR, mr, nr, e);
}

#define VITC_ROW(i)                                                          \
    do {                                                                     \
        __m256 a = _mm256_broadcast_ss(pa + (i));                            \
        c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                           \
        c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);                           \
    } while (0)

static void vitc__ukr_avx2(int64_t kc, const float *pa, const float *pb, float *C, int64_t ldc,
                           int64_t mr, int64_t nr, const vitc__gemm_epi *e) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_load_ps(pb), b1 = _mm256_load_ps(pb + 8);
        VITC_ROW(0); VITC_ROW(1); VITC_ROW(2); VITC_ROW(3); VITC_ROW(4); VITC_ROW(5);
        pa += MR;
        pb += NR;
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    vitc__tile_out(acc, C, ldc, mr, nr, e);
}

/* The packed kernel's tile with A and B read in place (gemm_ukernels.h):
 * row r of A from A + r * a_rs stepping a_ks, B's row k at B + k * b_ks.
 * Rows past mr re-read row 0 and are never stored; with full 0, B's
 * columns past nr are masked loads (nothing past the matrix is read). The
 * same FMAs in the same order as vitc__ukr_avx2: bitwise its result. */
static inline __attribute__((always_inline)) void
vitc__ukr_st_t(const int full, int64_t kc, const float *A, int64_t a_ks, int64_t a_rs,
               const float *B, int64_t b_ks, float *C, int64_t ldc, int64_t mr, int64_t nr,
               const vitc__gemm_epi *e) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    const float *r0 = A, *r1 = A + (1 < mr ? 1 : 0) * a_rs, *r2 = A + (2 < mr ? 2 : 0) * a_rs;
    const float *r3 = A + (3 < mr ? 3 : 0) * a_rs, *r4 = A + (4 < mr ? 4 : 0) * a_rs;
    const float *r5 = A + (5 < mr ? 5 : 0) * a_rs;
    const __m256i m0 = v_lanes_any(nr), m1 = v_lanes_any(nr - 8);
    const char *pf = e->pf;
    int64_t pfn = e->pf_lines;
    const int64_t pfs = VITC_PF_STEP(pfn, kc);
#define VITC_ROW_ST(i)                                                       \
    do {                                                                     \
        __m256 a = _mm256_broadcast_ss(r##i);                                \
        c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                           \
        c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1);                           \
        r##i += a_ks;                                                        \
    } while (0)
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = full ? _mm256_loadu_ps(B) : _mm256_maskload_ps(B, m0);
        __m256 b1 = full ? _mm256_loadu_ps(B + 8) : _mm256_maskload_ps(B + 8, m1);
        for (int64_t l = 0; l < pfs && pfn > 0; l++) _mm_prefetch(pf, _MM_HINT_T1), pf += 64, pfn--;
        VITC_ROW_ST(0); VITC_ROW_ST(1); VITC_ROW_ST(2); VITC_ROW_ST(3); VITC_ROW_ST(4);
        VITC_ROW_ST(5);
        B += b_ks;
    }
#undef VITC_ROW_ST
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    vitc__tile_out(acc, C, ldc, mr, nr, e);
}

static void vitc__ukr_st_avx2(int64_t kc, const float *A, int64_t a_ks, int64_t a_rs,
                              const float *B, int64_t b_ks, float *C, int64_t ldc, int64_t mr,
                              int64_t nr, const vitc__gemm_epi *e) {
    if (nr == NR)
        vitc__ukr_st_t(1, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
    else
        vitc__ukr_st_t(0, kc, A, a_ks, a_rs, B, b_ks, C, ldc, mr, nr, e);
}

/* op(B) into 16-column strips: B row-major (dY in dX = dY W, X in a weight
 * gradient) is two vector copies a row; B transposed (a Linear's W [N, K])
 * goes through 8 x 8 register transposes, 8 columns at a time. Partial
 * strips take the portable packer. */
static void vitc__packb_avx2(float *pb, const float *B, int64_t ldb, int trans, int64_t k0,
                             int64_t kc, int64_t j0, int64_t nc) {
    int64_t full = nc / NR * NR;
    for (int64_t s = 0; s < full; s += NR) {
        float *dst = pb + s * kc; /* strip s/NR: [kc][NR] */
        if (!trans) {
            const float *src = B + k0 * ldb + j0 + s;
            for (int64_t k = 0; k < kc; k++) {
                _mm256_storeu_ps(dst + k * NR, _mm256_loadu_ps(src + k * ldb));
                _mm256_storeu_ps(dst + k * NR + 8, _mm256_loadu_ps(src + k * ldb + 8));
            }
            continue;
        }
        for (int h = 0; h < 2; h++) {
            const float *src = B + (j0 + s + 8 * h) * ldb + k0; /* 8 columns, K contiguous */
            int64_t k = 0;
            for (; k + 8 <= kc; k += 8) att_transpose8(src + k, ldb, dst + k * NR + 8 * h, NR);
            for (; k < kc; k++)
                for (int i = 0; i < 8; i++) dst[k * NR + 8 * h + i] = src[i * ldb + k];
        }
    }
    if (full < nc)
        vitc__gemm_packb_generic(pb + full * kc, NR, B, ldb, trans, k0, kc, j0 + full, nc - full);
}

/* One 6-row strip [kc][6] of a row-major A from rows (<= 6) rows at src:
 * 8 x 8 transposes with two zero rows, each k's 6 values stored as 4 + 2
 * (an 8-wide store would write into the next strip, which another thread
 * may be packing). */
static inline __attribute__((always_inline)) void vitc__packa_strip(float *dst, const float *src,
                                                                    int64_t lda, int rows,
                                                                    int64_t kc) {
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 r[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            r[i] = i < rows ? _mm256_loadu_ps(src + i * lda + k) : _mm256_setzero_ps();
        vitc__tr8(r);
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            _mm_storeu_ps(dst + (k + i) * MR, _mm256_castps256_ps128(r[i]));
            _mm_storel_pi((__m64 *)(dst + (k + i) * MR + 4), _mm256_extractf128_ps(r[i], 1));
        }
    }
    for (; k < kc; k++)
        for (int i = 0; i < MR; i++) dst[k * MR + i] = i < rows ? src[i * lda + k] : 0.0f;
}

/* op(A) into 6-row strips. A row-major (activations, dY) through the
 * transposes above; A transposed (dY^T in a weight gradient) is 6
 * contiguous values a k, with asum's adds in the portable packer's order
 * (k ascending, one add a value): the same bits. */
static void vitc__packa_avx2(float *pa, const float *A, int64_t lda, int trans, int64_t i0,
                             int64_t mc, int64_t k0, int64_t kc, float *asum) {
    int64_t s = 0;
    for (; s + MR <= mc; s += MR) {
        float *dst = pa + s * kc;
        if (!trans) {
            vitc__packa_strip(dst, A + (i0 + s) * lda + k0, lda, MR, kc);
            continue;
        }
        const float *src = A + k0 * lda + i0 + s;
        __m128 a4 = asum ? _mm_loadu_ps(asum + s) : _mm_setzero_ps();
        __m128 a2 = asum ? _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(asum + s + 4))
                         : _mm_setzero_ps();
        for (int64_t k = 0; k < kc; k++) {
            __m128 x4 = _mm_loadu_ps(src + k * lda);
            __m128 x2 = _mm_loadl_pi(_mm_setzero_ps(), (const __m64 *)(src + k * lda + 4));
            _mm_storeu_ps(dst + k * MR, x4);
            _mm_storel_pi((__m64 *)(dst + k * MR + 4), x2);
            if (asum) a4 = _mm_add_ps(a4, x4), a2 = _mm_add_ps(a2, x2);
        }
        if (asum) {
            _mm_storeu_ps(asum + s, a4);
            _mm_storel_pi((__m64 *)(asum + s + 4), a2);
        }
    }
    if (s < mc && !trans)
        vitc__packa_strip(pa + s * kc, A + (i0 + s) * lda + k0, lda, (int)(mc - s), kc);
    else if (s < mc)
        vitc__gemm_packa_generic(pa + s * kc, MR, A, lda, trans, i0 + s, mc - s, k0, kc,
                                 asum ? asum + s : NULL);
}

/* Blocks as for AVX-512 (see gemm_avx512.c): a deep KC measured best. A
 * is read in place up to K = 320 as there: 6 rows of it are then at most
 * 7.5 KB of L1 beside the B micro-panel. */
const vitc__gemm_kernel vitc__gemm_kernel_avx2 = {
    MR, NR, 1024, 72, 2048, vitc__ukr_avx2, vitc__packb_avx2, vitc__packa_avx2,
    vitc__ukr_st_avx2, 320, NULL, 0,
};
