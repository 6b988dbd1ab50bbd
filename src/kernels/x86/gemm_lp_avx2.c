/*
 * gemm_lp_avx2.c — the int8 microkernel for CPUs with AVX-VNNI but without
 * AVX-512 (vpdpbusd on ymm: Alder Lake and later, Zen 5 on the avx2 path).
 * Built with -mavx2 -mfma -mavxvnni (Makefile); chosen only when cpuid has
 * AVX-VNNI (dispatch.c). Same packed layouts as the AVX-512 kernel (12-row
 * A strips, 32-column B strips): 16 ymm registers hold 3 rows x 32 columns
 * of int32 sums, so the 12 x 32 tile runs as four 3-row passes over the
 * same B strip (L1-resident). Same numbers as the reference: the sums are
 * exact integers and the epilogue does the reference's roundings.
 */
#include <immintrin.h>

#include "../gemm_lp.h"
#include "vmath_avx2.h"

#define MR VITC_LP_MR
#define NR VITC_LP_NR
#define RB 3 /* rows per pass */

/* One row of the epilogue: 4 x 8 columns, masked to nr. */
static void vitc__row_out8(float *c, const __m256i acc[4], int64_t i, int64_t nr,
                           const vitc__lp_epi *e) {
    __m256i z = _mm256_set1_epi32(e->azp[i]);
    __m256 s = _mm256_set1_ps(e->ascale[i]);
    for (int q = 0; q < 4; q++) {
        __m256i m = v_lanes_any(nr - 8 * q);
        __m256i ws = _mm256_maskload_epi32(e->wsum + 8 * q, m);
        __m256 sc = _mm256_maskload_ps(e->wscale + 8 * q, m);
        __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[q], _mm256_mullo_epi32(z, ws)));
        v = _mm256_mul_ps(v, _mm256_mul_ps(s, sc));
        if (e->bias) v = _mm256_add_ps(v, _mm256_maskload_ps(e->bias + 8 * q, m));
        if (e->ls) v = _mm256_mul_ps(_mm256_maskload_ps(e->ls + 8 * q, m), v);
        if (e->res) v = _mm256_add_ps(v, _mm256_maskload_ps(e->res + i * e->ldr + 8 * q, m));
        _mm256_maskstore_ps(c + 8 * q, m, v);
    }
}

static void vitc__ukr_int8_avxvnni(int64_t kg, const uint32_t *pa, const uint32_t *pb, float *C,
                                   int64_t ldc, int64_t mr, int64_t nr, const vitc__lp_epi *e) {
    for (int64_t r0 = 0; r0 < mr; r0 += RB) {
        __m256i c0[4], c1[4], c2[4];
        for (int q = 0; q < 4; q++) c0[q] = c1[q] = c2[q] = _mm256_setzero_si256();
        const uint32_t *a = pa + r0, *b = pb;
        for (int64_t p = 0; p < kg; p++) {
            __m256i b0 = _mm256_load_si256((const __m256i *)b);
            __m256i b1 = _mm256_load_si256((const __m256i *)(b + 8));
            __m256i b2 = _mm256_load_si256((const __m256i *)(b + 16));
            __m256i b3 = _mm256_load_si256((const __m256i *)(b + 24));
            __m256i a0 = _mm256_set1_epi32((int)a[0]), a1 = _mm256_set1_epi32((int)a[1]);
            __m256i a2 = _mm256_set1_epi32((int)a[2]);
            c0[0] = _mm256_dpbusd_avx_epi32(c0[0], a0, b0);
            c0[1] = _mm256_dpbusd_avx_epi32(c0[1], a0, b1);
            c0[2] = _mm256_dpbusd_avx_epi32(c0[2], a0, b2);
            c0[3] = _mm256_dpbusd_avx_epi32(c0[3], a0, b3);
            c1[0] = _mm256_dpbusd_avx_epi32(c1[0], a1, b0);
            c1[1] = _mm256_dpbusd_avx_epi32(c1[1], a1, b1);
            c1[2] = _mm256_dpbusd_avx_epi32(c1[2], a1, b2);
            c1[3] = _mm256_dpbusd_avx_epi32(c1[3], a1, b3);
            c2[0] = _mm256_dpbusd_avx_epi32(c2[0], a2, b0);
            c2[1] = _mm256_dpbusd_avx_epi32(c2[1], a2, b1);
            c2[2] = _mm256_dpbusd_avx_epi32(c2[2], a2, b2);
            c2[3] = _mm256_dpbusd_avx_epi32(c2[3], a2, b3);
            a += MR;
            b += NR;
        }
        vitc__row_out8(C + r0 * ldc, c0, r0, nr, e);
        if (r0 + 1 < mr) vitc__row_out8(C + (r0 + 1) * ldc, c1, r0 + 1, nr, e);
        if (r0 + 2 < mr) vitc__row_out8(C + (r0 + 2) * ldc, c2, r0 + 2, nr, e);
    }
}

/* The rows are converted by the reference (a few percent of the time). */
const vitc__lp_kernel vitc__lp_int8_avxvnni = {"avx-vnni", vitc__ukr_int8_avxvnni, NULL, NULL, NULL, NULL, 0,
                                               MR, 0, NULL, NULL, 0, NULL, NULL, NULL, 0, 0};
