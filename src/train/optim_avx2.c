/*
 * optim_avx2.c — AdamW's update (optim.c's vitc__adamw_ref) 4 elements at
 * a time in double, the AVX2 half of optim_avx512.c: every operation is
 * the reference's, in its order, with IEEE rounding (no FMA contraction
 * under -std=c11), so the parameters and states are bitwise the scalar
 * loop's. The scalar loop's double divisions and square roots had been 1%
 * of a Fashion-MNIST training step on a Zen 3.
 */
#include <stddef.h>

#include "../kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

void vitc__adamw_avx2(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                      const vitc__adamw_coef *c) {
    const __m256d shrink = _mm256_set1_pd(c->shrink), ss = _mm256_set1_pd(c->step_size);
    const __m256d b1 = _mm256_set1_pd(c->b1), omb1 = _mm256_set1_pd(1.0 - c->b1);
    const __m256d b2 = _mm256_set1_pd(c->b2), omb2 = _mm256_set1_pd(1.0 - c->b2);
    const __m256d eps = _mm256_set1_pd(c->eps), bc2 = _mm256_set1_pd(c->bc2_sqrt);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const __m256d gi = _mm256_cvtps_pd(_mm_loadu_ps(g + i));
        const __m256d pi = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(p + i)), shrink);
        const __m128 mi = _mm256_cvtpd_ps(_mm256_add_pd(
            _mm256_mul_pd(b1, _mm256_cvtps_pd(_mm_loadu_ps(m + i))), _mm256_mul_pd(omb1, gi)));
        const __m128 vi = _mm256_cvtpd_ps(
            _mm256_add_pd(_mm256_mul_pd(b2, _mm256_cvtps_pd(_mm_loadu_ps(v + i))),
                          _mm256_mul_pd(_mm256_mul_pd(omb2, gi), gi)));
        _mm_storeu_ps(m + i, mi);
        _mm_storeu_ps(v + i, vi);
        __m128 vd = vi;
        if (vmax) { /* max(a, b) is a > b ? a : b, as the reference's select */
            vd = _mm_max_ps(_mm_loadu_ps(vmax + i), vi);
            _mm_storeu_ps(vmax + i, vd);
        }
        const __m256d denom =
            _mm256_add_pd(_mm256_div_pd(_mm256_sqrt_pd(_mm256_cvtps_pd(vd)), bc2), eps);
        const __m256d upd = _mm256_div_pd(_mm256_mul_pd(ss, _mm256_cvtps_pd(mi)), denom);
        _mm_storeu_ps(p + i, _mm256_cvtpd_ps(_mm256_sub_pd(pi, upd)));
    }
    if (i < n) vitc__adamw_ref(p + i, m + i, v + i, vmax ? vmax + i : NULL, g + i, n - i, c);
}
#else
void vitc__adamw_avx2(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                      const vitc__adamw_coef *c) {
    vitc__adamw_ref(p, m, v, vmax, g, n, c);
}
#endif
