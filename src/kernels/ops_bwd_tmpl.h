/*
 * ops_bwd_tmpl.h — the row ops of the backward pass written once over the
 * vector vocabulary of vmath_*.h (VT, VW, v_*), instantiated per CPU path
 * by ops_backward_avx2.c and ops_backward_avx512.c with BWD_FN(name)
 * naming the functions; the scalar references are in ops_backward.c.
 */

/* dx = dy * (Phi(x) + x * phi(x)), the derivative of x * Phi(x). */
void BWD_FN(gelu_backward)(float *dx, const float *dy, const float *x, int64_t n) {
    const VT rs2 = v_set1(0.70710678118654752f), half = v_set1(0.5f), one = v_set1(1.0f);
    const VT k = v_set1(0.39894228040143268f), mhalf = v_set1(-0.5f);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VT v = v_loadu(x + i);
        VT cdf = v_mul(half, v_add(one, v_erf(v_mul(v, rs2))));
        VT pdf = v_mul(k, v_exp(v_mul(mhalf, v_mul(v, v))));
        v_storeu(dx + i, v_mul(v_loadu(dy + i), v_fma(v, pdf, cdf)));
    }
    if (i < n) {
        int r = (int)(n - i);
        VT v = v_loadu_n(x + i, r);
        VT cdf = v_mul(half, v_add(one, v_erf(v_mul(v, rs2))));
        VT pdf = v_mul(k, v_exp(v_mul(mhalf, v_mul(v, v))));
        v_storeu_n(dx + i, v_mul(v_loadu_n(dy + i, r), v_fma(v, pdf, cdf)), r);
    }
}

/* One LayerNorm row: dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 * g = dy * w, xhat = (x - mean) * rstd. */
void BWD_FN(layernorm_backward_row)(float *dx, const float *dy, const float *x, const float *w,
                                    int64_t C, float mean, float rstd) {
    const VT mu = v_set1(mean), rs = v_set1(rstd);
    VT sg = v_zero(), sgx = v_zero();
    int64_t c = 0;
    for (; c + VW <= C; c += VW) {
        VT g = v_mul(v_loadu(dy + c), v_loadu(w + c));
        VT xh = v_mul(v_sub(v_loadu(x + c), mu), rs);
        sg = v_add(sg, g);
        sgx = v_fma(g, xh, sgx);
    }
    if (c < C) { /* masked loads are 0 past the row: g = 0 adds nothing */
        int r = (int)(C - c);
        VT g = v_mul(v_loadu_n(dy + c, r), v_loadu_n(w + c, r));
        VT xh = v_mul(v_sub(v_loadu_n(x + c, r), mu), rs);
        sg = v_add(sg, g);
        sgx = v_fma(g, xh, sgx);
    }
    const VT mg = v_set1(v_hsum(sg) / (float)C), mgx = v_set1(v_hsum(sgx) / (float)C);
    for (c = 0; c + VW <= C; c += VW) {
        VT g = v_mul(v_loadu(dy + c), v_loadu(w + c));
        VT xh = v_mul(v_sub(v_loadu(x + c), mu), rs);
        VT d = v_mul(rs, v_sub(v_sub(g, mg), v_mul(xh, mgx)));
        v_storeu(dx + c, v_add(v_loadu(dx + c), d));
    }
    if (c < C) {
        int r = (int)(C - c);
        VT g = v_mul(v_loadu_n(dy + c, r), v_loadu_n(w + c, r));
        VT xh = v_mul(v_sub(v_loadu_n(x + c, r), mu), rs);
        VT d = v_mul(rs, v_sub(v_sub(g, mg), v_mul(xh, mgx)));
        v_storeu_n(dx + c, v_add(v_loadu_n(dx + c, r), d), r);
    }
}
