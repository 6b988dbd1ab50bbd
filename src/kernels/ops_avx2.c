/*
 * ops_avx2.c — AVX2/FMA row ops: softmax, LayerNorm, exact-erf GELU.
 * The same algorithms as ops_avx512.c, 8 lanes wide, with the maths of
 * vmath_avx2.h. Tails go through a zero-padded 8-float buffer.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops_simd.h"
#include "vmath_avx2.h"

static inline __m256 vitc__gelu8(__m256 v) { return _mm256_mul_ps(v, v_phi(v)); }

/* y = f(x) elementwise, 8 lanes at a time, the tail through a zero-padded
 * buffer; y may be x. Inlined with f, so each caller gets its own loop. */
static inline void vitc__map8(float *y, const float *x, int64_t n, __m256 (*f)(__m256)) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, f(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(t, f(_mm256_loadu_ps(t)));
        memcpy(y + i, t, (size_t)(n - i) * sizeof(float));
    }
}

void vitc__gelu_to_avx2(float *y, const float *x, int64_t n) { vitc__map8(y, x, n, vitc__gelu8); }

void vitc__gelu_avx2(float *x, int64_t n) { vitc__gelu_to_avx2(x, x, n); }

static inline __m256 vitc__qgelu8(__m256 v) {
    __m256 e = v_exp(_mm256_mul_ps(v, _mm256_set1_ps(-1.702f)));
    return _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void vitc__quick_gelu_avx2(float *x, int64_t n) { vitc__map8(x, x, n, vitc__qgelu8); }

/* tanh-GELU as ops_avx512.c computes it. This v_exp saturates at e^88.37
 * instead of overflowing, so lanes past that (x below ~-9.5, where the
 * result is under 1e-37 or x is huge) are set to 0 explicitly. */
static inline __m256 vitc__tgelu8(__m256 v) {
    __m256 u = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), v), _mm256_mul_ps(v, v), v);
    __m256 z = _mm256_mul_ps(u, _mm256_set1_ps(-1.5957691216057308f));
    __m256 y = _mm256_div_ps(v, _mm256_add_ps(_mm256_set1_ps(1.0f), v_exp(z)));
    return _mm256_andnot_ps(_mm256_cmp_ps(z, _mm256_set1_ps(88.0f), _CMP_GT_OQ), y); /* NaN kept */
}

void vitc__tanh_gelu_avx2(float *x, int64_t n) { vitc__map8(x, x, n, vitc__tgelu8); }

/* y = r + g * y, the product rounded first (no FMA), as the reference. */
void vitc__scale_add_avx2(float *y, const float *g, const float *r, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(y + i));
        _mm256_storeu_ps(y + i, r ? _mm256_add_ps(_mm256_loadu_ps(r + i), v) : v);
    }
    vitc__scale_add_ref(y + i, g + i, r ? r + i : NULL, n - i);
}

void vitc__softmax_rows_avx2(float *x, int64_t rows, int64_t n, float inv_temperature) {
    const __m256 it = _mm256_set1_ps(inv_temperature);
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(row + j), it);
            _mm256_storeu_ps(row + j, v);
            mx = _mm256_max_ps(v, mx); /* NaN loses, as in the scalar loop */
        }
        float m8[8];
        _mm256_storeu_ps(m8, mx);
        float mxs = -INFINITY;
        for (int k = 0; k < 8; k++) if (m8[k] > mxs) mxs = m8[k];
        for (; j < n; j++) {
            row[j] *= inv_temperature;
            if (row[j] > mxs) mxs = row[j];
        }
        __m256 vm = _mm256_set1_ps(mxs), sum = _mm256_setzero_ps();
        for (j = 0; j + 8 <= n; j += 8) {
            __m256 e = v_exp(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
            _mm256_storeu_ps(row + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        float tail = 0.0f;
        if (j < n) {
            float t[8];
            for (int k = 0; k < 8; k++) t[k] = j + k < n ? row[j + k] : -INFINITY;
            _mm256_storeu_ps(t, v_exp(_mm256_sub_ps(_mm256_loadu_ps(t), vm)));
            for (int64_t k = 0; j + k < n; k++) row[j + k] = t[k], tail += t[k];
        }
        __m256 inv = _mm256_set1_ps(1.0f / (v_hsum(sum) + tail));
        for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(row + j, _mm256_mul_ps(_mm256_loadu_ps(row + j), inv));
        float invs = _mm256_cvtss_f32(inv);
        for (; j < n; j++) row[j] *= invs;
    }
}

void vitc__layernorm_avx2(float *y, const float *x, const float *w, const float *b, int64_t M,
                          int64_t C, float eps) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * C;
        float *yr = y + i * C;
        double x0 = xr[0], st[2];
        vitc__row_stats_avx2(xr, C, x0, st);
        double s = st[0], q = st[1];
        int64_t c;
        double md = s / (double)C;
        double var = q / (double)C - md * md;
        if (var < 0.0) var = 0.0;
        float rstd = (float)(1.0 / sqrt(var + (double)eps));
        /* x - mean as (x - x0) - md: see ops_avx512.c */
        float mdf = (float)md;
        __m256 v0 = _mm256_set1_ps(xr[0]), vm = _mm256_set1_ps(mdf), vr = _mm256_set1_ps(rstd);
        for (c = 0; c + 8 <= C; c += 8) {
            __m256 d = _mm256_sub_ps(_mm256_loadu_ps(xr + c), v0);
            __m256 v = _mm256_mul_ps(_mm256_sub_ps(d, vm), vr);
            if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + c));
            if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + c));
            _mm256_storeu_ps(yr + c, v);
        }
        for (; c < C; c++) {
            float v = ((xr[c] - xr[0]) - mdf) * rstd;
            if (w) v *= w[c];
            if (b) v += b[c];
            yr[c] = v;
        }
    }
}

void vitc__row_stats_avx2(const float *x, int64_t n, double shift, double *o) {
    __m256d sh = _mm256_set1_pd(shift);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 v = _mm256_loadu_ps(x + c);
        __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), sh);
        __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), sh);
        s0 = _mm256_add_pd(s0, d0);
        s1 = _mm256_add_pd(s1, d1);
        q0 = _mm256_fmadd_pd(d0, d0, q0);
        q1 = _mm256_fmadd_pd(d1, d1, q1);
    }
    double sv[4], qv[4];
    _mm256_storeu_pd(sv, _mm256_add_pd(s0, s1));
    _mm256_storeu_pd(qv, _mm256_add_pd(q0, q1));
    double s = (sv[0] + sv[1]) + (sv[2] + sv[3]), q = (qv[0] + qv[1]) + (qv[2] + qv[3]);
    for (; c < n; c++) {
        double d = (double)x[c] - shift;
        s += d;
        q += d * d;
    }
    o[0] = s, o[1] = q;
}

void vitc__row_norm_avx2(float *y, const float *x, int64_t n, float mean, float sc, float sh) {
    __m256 vm = _mm256_set1_ps(mean), vs = _mm256_set1_ps(sc), vb = _mm256_set1_ps(sh);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8)
        _mm256_storeu_ps(y + c, _mm256_fmadd_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), vm), vs, vb));
    for (; c < n; c++) y[c] = (x[c] - mean) * sc + sh;
}

#define OPS_SUFFIX avx2
#include "ops_tmpl.h"
