/*
 * ops_avx2.c — AVX2/FMA row ops: softmax, LayerNorm, exact-erf GELU.
 * The same algorithms as ops_avx512.c (see there), 8 lanes wide; 2^n is
 * built in the exponent bits, so arguments below -87.3 (where 2^n would
 * leave the normal range) are flushed to 0 explicitly. Tails go through a
 * zero-padded 8-float buffer.
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "ops_simd.h"

static inline __m256 vitc__exp8(__m256 x) {
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    /* max/min order keeps NaN: the second operand is returned on NaN. */
    x = _mm256_min_ps(_mm256_set1_ps(88.37f), _mm256_max_ps(_mm256_set1_ps(-87.33f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860682030941723212e-6f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(under, y);
}

static inline __m256 vitc__erf8(__m256 x) {
    __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
    __m256 z = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    __m256 s = _mm256_mul_ps(z, z);
    __m256 ps = _mm256_set1_ps(1.0f / 75600.0f);
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(-1.0f / 9360.0f));
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(1.0f / 1320.0f));
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(-1.0f / 216.0f));
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(1.0f / 42.0f));
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(-1.0f / 10.0f));
    ps = _mm256_fmadd_ps(ps, s, _mm256_set1_ps(1.0f / 3.0f));
    ps = _mm256_fnmadd_ps(ps, s, _mm256_set1_ps(1.0f));
    __m256 small = _mm256_mul_ps(_mm256_mul_ps(ps, z), _mm256_set1_ps(1.12837916709551257f));
    __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f),
                             _mm256_fmadd_ps(_mm256_set1_ps(0.5f), z, _mm256_set1_ps(1.0f)));
    __m256 q = _mm256_set1_ps(0.17087277f);
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.82215223f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.48851587f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-1.13520398f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.27886807f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.18628806f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.09678418f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.37409196f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.00002368f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-1.26551223f));
    q = _mm256_fnmadd_ps(z, z, q);
    __m256 large = _mm256_fnmadd_ps(t, vitc__exp8(q), _mm256_set1_ps(1.0f));
    __m256 is_small = _mm256_cmp_ps(z, _mm256_set1_ps(0.5f), _CMP_LT_OQ);
    return _mm256_or_ps(_mm256_blendv_ps(large, small, is_small), sign);
}

static inline __m256 vitc__gelu8(__m256 v) {
    __m256 e = vitc__erf8(_mm256_mul_ps(v, _mm256_set1_ps(0.70710678118654752f)));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), v), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

void vitc__gelu_avx2(float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, vitc__gelu8(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, (size_t)(n - i) * sizeof(float));
        _mm256_storeu_ps(t, vitc__gelu8(_mm256_loadu_ps(t)));
        memcpy(x + i, t, (size_t)(n - i) * sizeof(float));
    }
}

static inline float vitc__hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
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
            __m256 e = vitc__exp8(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
            _mm256_storeu_ps(row + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        float tail = 0.0f;
        if (j < n) {
            float t[8];
            for (int k = 0; k < 8; k++) t[k] = j + k < n ? row[j + k] : -INFINITY;
            _mm256_storeu_ps(t, vitc__exp8(_mm256_sub_ps(_mm256_loadu_ps(t), vm)));
            for (int64_t k = 0; j + k < n; k++) row[j + k] = t[k], tail += t[k];
        }
        __m256 inv = _mm256_set1_ps(1.0f / (vitc__hsum8(sum) + tail));
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
