/*
 * optim_avx512.c — AdamW's update (optim.c's vitc__adamw_ref) 8 elements at
 * a time in double. Every operation is the reference's, in its order, with
 * IEEE rounding (sqrt and division included; the build's -std=c11 forbids
 * contracting a multiply and an add into an FMA), so the parameters and
 * states are bitwise the scalar loop's.
 */
#include <stddef.h>

#include "../kernels/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

void vitc__adamw_avx512(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                        const vitc__adamw_coef *c) {
    const __m512d shrink = _mm512_set1_pd(c->shrink), ss = _mm512_set1_pd(c->step_size);
    const __m512d b1 = _mm512_set1_pd(c->b1), omb1 = _mm512_set1_pd(1.0 - c->b1);
    const __m512d b2 = _mm512_set1_pd(c->b2), omb2 = _mm512_set1_pd(1.0 - c->b2);
    const __m512d eps = _mm512_set1_pd(c->eps), bc2 = _mm512_set1_pd(c->bc2_sqrt);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m512d gi = _mm512_cvtps_pd(_mm256_loadu_ps(g + i));
        const __m512d pi = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(p + i)), shrink);
        const __m256 mi = _mm512_cvtpd_ps(_mm512_add_pd(
            _mm512_mul_pd(b1, _mm512_cvtps_pd(_mm256_loadu_ps(m + i))), _mm512_mul_pd(omb1, gi)));
        const __m256 vi = _mm512_cvtpd_ps(
            _mm512_add_pd(_mm512_mul_pd(b2, _mm512_cvtps_pd(_mm256_loadu_ps(v + i))),
                          _mm512_mul_pd(_mm512_mul_pd(omb2, gi), gi)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        __m256 vd = vi;
        if (vmax) { /* max(a, b) is a > b ? a : b, as the reference's select */
            vd = _mm256_max_ps(_mm256_loadu_ps(vmax + i), vi);
            _mm256_storeu_ps(vmax + i, vd);
        }
        const __m512d denom =
            _mm512_add_pd(_mm512_div_pd(_mm512_sqrt_pd(_mm512_cvtps_pd(vd)), bc2), eps);
        const __m512d upd = _mm512_div_pd(_mm512_mul_pd(ss, _mm512_cvtps_pd(mi)), denom);
        _mm256_storeu_ps(p + i, _mm512_cvtpd_ps(_mm512_sub_pd(pi, upd)));
    }
    if (i < n) vitc__adamw_ref(p + i, m + i, v + i, vmax ? vmax + i : NULL, g + i, n - i, c);
}
#else
void vitc__adamw_avx512(float *p, float *m, float *v, float *vmax, const float *g, size_t n,
                        const vitc__adamw_coef *c) {
    vitc__adamw_ref(p, m, v, vmax, g, n, c);
}
#endif
