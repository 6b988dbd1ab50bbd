/* attention_avx2.c — the tiled attention kernel on AVX2+FMA (8 lanes):
 * S microkernel 6 rows x 16 keys, P V microkernel 6 rows x 16 channels
 * (12 ymm accumulators each, the shape of BLIS's Haswell sgemm). */
#include "attention_impl.h"

/* Not an x86 target: dispatch never picks this path; the symbol stays so
 * the dispatcher links. */
#if !defined(__x86_64__) && !defined(__i386__)
void vitc__attn_rows_avx2(const vitc__attn_plan *p, vitc__attn_ws *ws, int64_t b, int64_t h,
                          int64_t l0, int64_t l1) {
    vitc__attn_rows_generic(p, ws, b, h, l0, l1);
}
#else

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define VT __m256
#define VW 8
#define MR_S 6
#define MR_PV 6
#define ATT_SMALL_DV 8
#define NV_PV 2

/* Lanes [0, n) of a ymm mask: a sliding window over this table. */
static const int32_t att_lane_tbl[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
#define v_lanes(n) _mm256_loadu_si256((const __m256i *)(att_lane_tbl + 8 - (n)))

#define v_zero() _mm256_setzero_ps()
#define v_set1(x) _mm256_set1_ps(x)
#define v_load(p) _mm256_load_ps(p)
#define v_store(p, x) _mm256_store_ps(p, x)
#define v_loadu(p) _mm256_loadu_ps(p)
#define v_storeu(p, x) _mm256_storeu_ps(p, x)
#define v_fma(a, b, c) _mm256_fmadd_ps(a, b, c)
#define v_mul(a, b) _mm256_mul_ps(a, b)
#define v_add(a, b) _mm256_add_ps(a, b)
#define v_sub(a, b) _mm256_sub_ps(a, b)
#define v_max(a, b) _mm256_max_ps(a, b)
#define v_loadu_n(p, n) _mm256_maskload_ps(p, v_lanes(n))
#define v_storeu_n(p, x, n) _mm256_maskstore_ps(p, v_lanes(n), x)
#define v_tail(x, n, f) _mm256_blendv_ps(_mm256_set1_ps(f), x, _mm256_castsi256_ps(v_lanes(n)))
#define v_hmax(x) att_hmax_avx2(x)
#define v_hsum(x) att_hsum_avx2(x)
#define v_exp2(x) att_exp2_avx2(x)
#define s_exp2(x) exp2f(x)

static inline float att_hmax_avx2(__m256 x) {
    __m128 a = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_max_ps(a, _mm_movehl_ps(a, a));
    a = _mm_max_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

static inline float att_hsum_avx2(__m256 x) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* 2^x as in the AVX-512 file, with 2^n built in the exponent field: at the
 * clamp n = -127 that field is 0, so the result is exactly +0. */
static inline __m256 att_exp2_avx2(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-127.0f), x);
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

#include "attention_t8.h"

#define ATT_FN vitc__attn_rows_avx2
#include "attention_tmpl.h"

#endif
