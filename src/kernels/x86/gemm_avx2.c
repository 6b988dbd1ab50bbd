/*
 * gemm_avx2.c — the AVX2/FMA GEMM microkernel, 6 x 16.
 *
 * 6 rows x 2 ymm = 12 accumulators, 2 B loads and 6 broadcasts per k: the
 * classic Haswell shape (BLIS haswell sgemm is 6 x 16), which leaves room
 * in the 16 ymm registers for B and a broadcast. Full tiles apply the
 * epilogue in registers; edge tiles spill to a small buffer.
 */
#include <immintrin.h>

#include "../gemm_ukernels.h"

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
    if (mr == MR && nr == NR) {
        __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21},
                             {c30, c31}, {c40, c41}, {c50, c51}};
        for (int i = 0; i < MR; i++) {
            const float *res = e->res ? e->res + i * e->ldr : NULL;
            vitc__row_out8(C + i * ldc, acc[i][0], e, e->bias, res);
            vitc__row_out8(C + i * ldc + 8, acc[i][1], e, e->bias ? e->bias + 8 : NULL,
                           res ? res + 8 : NULL);
        }
        return;
    }
    _Alignas(32) float tile[MR * NR];
    _mm256_store_ps(tile + 0, c00), _mm256_store_ps(tile + 8, c01);
    _mm256_store_ps(tile + 16, c10), _mm256_store_ps(tile + 24, c11);
    _mm256_store_ps(tile + 32, c20), _mm256_store_ps(tile + 40, c21);
    _mm256_store_ps(tile + 48, c30), _mm256_store_ps(tile + 56, c31);
    _mm256_store_ps(tile + 64, c40), _mm256_store_ps(tile + 72, c41);
    _mm256_store_ps(tile + 80, c50), _mm256_store_ps(tile + 88, c51);
    vitc__gemm_epilogue_tile(C, ldc, tile, NR, mr, nr, e);
}

/* Blocks as for AVX-512 (see gemm_avx512.c): a deep KC measured best. */
const vitc__gemm_kernel vitc__gemm_kernel_avx2 = {
    MR, NR, 1024, 72, 2048, vitc__ukr_avx2, NULL, NULL, NULL, 0, NULL, 0,
};
