/* attention_t8.h — an 8 x 8 float transpose in AVX registers, for packing
 * K^T panels and the AVX2 GEMM's panels (included by the AVX2 and AVX-512
 * kernels, built with -mavx2). */
#ifndef VITC_ATTENTION_T8_H
#define VITC_ATTENTION_T8_H

#include <immintrin.h>
#include <stdint.h>

/* r[i][j] becomes r[j][i]: the 8 x 8 transpose in ymm registers (the
 * attention's K^T panels, gemm_avx2.c's packers). */
static inline __attribute__((always_inline)) void vitc__tr8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* dst[i][0:8] = src[0:8][i]. */
#define ATT_HAVE_T8 1
static inline void att_transpose8(const float *src, int64_t lds, float *dst, int64_t ldd) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(src + i * lds);
    vitc__tr8(r);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) _mm256_storeu_ps(dst + i * ldd, r[i]);
}

#endif
