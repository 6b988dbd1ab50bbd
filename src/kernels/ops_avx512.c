/*
 * ops_avx512.c — AVX-512 row ops: softmax, LayerNorm, exact-erf GELU. The
 * maths (v_exp, v_phi) is vmath_avx512.h's, shared with the attention
 * kernels; both stay within 1e-6 relative of expf/erff (tests/test_ops.c
 * checks it on a dense grid).
 */
#include <immintrin.h>
#include <math.h>

#include "ops_simd.h"
#include "vmath_avx512.h"

/* x Phi(x) (vitc__v_gelu, as the GEMM epilogues), Phi from v_phi's table of
 * polynomials; y may be x. */
void vitc__gelu_to_avx512(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        _mm512_mask_storeu_ps(y + i, m, vitc__v_gelu(v));
    }
}

void vitc__gelu_avx512(float *x, int64_t n) { vitc__gelu_to_avx512(x, x, n); }

/* x / (1 + e^(-1.702 x)): v_exp overflows to +inf for very negative x,
 * giving -0 as the reference's expf does. */
void vitc__quick_gelu_avx512(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 e = v_exp(_mm512_mul_ps(v, _mm512_set1_ps(-1.702f)));
        _mm512_mask_storeu_ps(x + i, m, _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
}

/* tanh-GELU as x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))) (kernels.h).
 * v_exp saturates rather than overflowing, so lanes whose exponent is past
 * 88 (x below ~-9.5: results under 1e-37, or x huge) are set to 0. */
void vitc__tanh_gelu_avx512(float *x, int64_t n) {
    const __m512 k2 = _mm512_set1_ps(-1.5957691216057308f), kk = _mm512_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __m512 u = _mm512_fmadd_ps(_mm512_mul_ps(kk, v), _mm512_mul_ps(v, v), v);
        __m512 z = _mm512_mul_ps(u, k2);
        __mmask16 ok = _mm512_cmp_ps_mask(z, _mm512_set1_ps(88.0f), _CMP_NGT_UQ); /* NaN kept */
        __m512 e = v_exp(z);
        _mm512_mask_storeu_ps(x + i, m,
                              _mm512_maskz_div_ps(ok, v, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
    }
}

/* y = r + g * y, the product rounded first (no FMA), as the reference. */
void vitc__scale_add_avx512(float *y, const float *g, const float *r, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, y + i));
        if (r)
            v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, r + i), v);
        _mm512_mask_storeu_ps(y + i, m, v);
    }
}

static inline float vitc__hmax16(__m512 v) { return _mm512_reduce_max_ps(v); }

void vitc__softmax_rows_avx512(float *x, int64_t rows, int64_t n, float inv_temperature) {
    const __m512 it = _mm512_set1_ps(inv_temperature);
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        __m512 mx = _mm512_set1_ps(-INFINITY);
        int64_t j = 0;
        for (; j + 16 <= n; j += 16) {
            __m512 v = _mm512_mul_ps(_mm512_loadu_ps(row + j), it);
            _mm512_storeu_ps(row + j, v);
            /* NaN loses here as in the scalar loop; its exp makes the row NaN */
            mx = _mm512_max_ps(v, mx);
        }
        if (j < n) {
            __mmask16 m = (__mmask16)((1u << (n - j)) - 1);
            __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), it);
            _mm512_mask_storeu_ps(row + j, m, v);
            mx = _mm512_mask_max_ps(mx, m, v, mx);
        }
        float mxs = vitc__hmax16(mx);
        __m512 vm = _mm512_set1_ps(mxs);
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            __m512 e = v_exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + j), vm));
            _mm512_mask_storeu_ps(row + j, m, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(m, e));
        }
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
        for (j = 0; j < n; j += 16) {
            __mmask16 m = n - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            _mm512_mask_storeu_ps(row + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + j), inv));
        }
    }
}

/* Stats in one pass, in double, shifted by the row's first element so that
 * E[d^2] - E[d]^2 does not cancel when the mean is large against the spread. */
void vitc__layernorm_avx512(float *y, const float *x, const float *w, const float *b, int64_t M,
                            int64_t C, float eps) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * C;
        float *yr = y + i * C;
        double x0 = xr[0], st[2];
        vitc__row_stats_avx512(xr, C, x0, st);
        double s = st[0], q = st[1];
        double md = s / (double)C;
        double var = q / (double)C - md * md;
        if (var < 0.0) var = 0.0;
        float rstd = (float)(1.0 / sqrt(var + (double)eps));
        /* x - mean as (x - x0) - md: the first difference is exact for data
         * near x0, so a large mean loses no more than the spread's bits. */
        __m512 v0 = _mm512_set1_ps(xr[0]), vm = _mm512_set1_ps((float)md), vr = _mm512_set1_ps(rstd);
        for (int64_t c = 0; c < C; c += 16) {
            __mmask16 m = C - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (C - c)) - 1);
            __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, xr + c), v0);
            __m512 v = _mm512_mul_ps(_mm512_sub_ps(d, vm), vr);
            if (w) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, w + c));
            if (b) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b + c));
            _mm512_mask_storeu_ps(yr + c, m, v);
        }
    }
}

void vitc__row_stats_avx512(const float *x, int64_t n, double shift, double *o) {
    __m512d sh = _mm512_set1_pd(shift);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, q0 = s0, q1 = s0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 v = _mm512_loadu_ps(x + c);
        __m512d d0 = _mm512_sub_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(v)), sh);
        __m512d d1 = _mm512_sub_pd(_mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)), sh);
        s0 = _mm512_add_pd(s0, d0);
        s1 = _mm512_add_pd(s1, d1);
        q0 = _mm512_fmadd_pd(d0, d0, q0);
        q1 = _mm512_fmadd_pd(d1, d1, q1);
    }
    double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
    double q = _mm512_reduce_add_pd(_mm512_add_pd(q0, q1));
    for (; c < n; c++) {
        double d = (double)x[c] - shift;
        s += d;
        q += d * d;
    }
    o[0] = s, o[1] = q;
}

void vitc__row_norm_avx512(float *y, const float *x, int64_t n, float mean, float sc, float sh) {
    __m512 vm = _mm512_set1_ps(mean), vs = _mm512_set1_ps(sc), vb = _mm512_set1_ps(sh);
    for (int64_t c = 0; c < n; c += 16) {
        __mmask16 m = n - c >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - c)) - 1);
        __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + c), vm);
        _mm512_mask_storeu_ps(y + c, m, _mm512_fmadd_ps(v, vs, vb));
    }
}

#define OPS_SUFFIX avx512
#include "ops_tmpl.h"
