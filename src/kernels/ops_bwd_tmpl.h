/*
 * ops_bwd_tmpl.h — the row ops of the backward pass written once over the
 * vector vocabulary of a vmath header (VT, VW, v_*), instantiated per CPU
 * path (x86/ops_backward_avx2.c, x86/ops_backward_avx512.c) with
 * ISA_FN(name) naming the functions, as ops_tmpl.h; the scalar references
 * are in ops_backward.c.
 */

/* dx = dy * (Phi(x) + x * phi(x)), the derivative of x * Phi(x). */
void ISA_FN(gelu_backward)(float *dx, const float *dy, const float *x, int64_t n) {
    const VT k = v_set1(0.39894228040143268f), mhalf = v_set1(-0.5f);
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VT v = v_loadu(x + i);
        VT cdf = v_phi(v);
        VT pdf = v_mul(k, v_exp(v_mul(mhalf, v_mul(v, v))));
        v_storeu(dx + i, v_mul(v_loadu(dy + i), v_fma(v, pdf, cdf)));
    }
    if (i < n) {
        int r = (int)(n - i);
        VT v = v_loadu_n(x + i, r);
        VT cdf = v_phi(v);
        VT pdf = v_mul(k, v_exp(v_mul(mhalf, v_mul(v, v))));
        v_storeu_n(dx + i, v_mul(v_loadu_n(dy + i, r), v_fma(v, pdf, cdf)), r);
    }
}

/* One LayerNorm row: dx += rstd * (g - mean(g) - xhat * mean(g * xhat)),
 * g = dy * w, xhat = (x - mean) * rstd. */
void ISA_FN(layernorm_backward_row)(float *dx, const float *dy, const float *x, const float *w,
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

/* db[j] += sum_i dy[i][j] for j in [j0, j1), rows in order: 4 vectors of
 * columns stay in registers over all M rows, so each column sees the same
 * additions in the same order as the scalar loop (bitwise equal). */
void ISA_FN(colsum)(float *db, const float *dy, int64_t lddy, int64_t M, int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j += 4 * VW) {
        int n[4];
        for (int v = 0; v < 4; v++) {
            int64_t r = j1 - j - v * VW;
            n[v] = r <= 0 ? 0 : r >= VW ? VW : (int)r;
        }
        VT a0 = v_loadu_n(db + j, n[0]), a1 = v_loadu_n(db + j + VW, n[1]);
        VT a2 = v_loadu_n(db + j + 2 * VW, n[2]), a3 = v_loadu_n(db + j + 3 * VW, n[3]);
        for (int64_t i = 0; i < M; i++) {
            const float *r = dy + i * lddy + j;
            a0 = v_add(a0, v_loadu_n(r, n[0]));
            a1 = v_add(a1, v_loadu_n(r + VW, n[1]));
            a2 = v_add(a2, v_loadu_n(r + 2 * VW, n[2]));
            a3 = v_add(a3, v_loadu_n(r + 3 * VW, n[3]));
        }
        v_storeu_n(db + j, a0, n[0]);
        v_storeu_n(db + j + VW, a1, n[1]);
        v_storeu_n(db + j + 2 * VW, a2, n[2]);
        v_storeu_n(db + j + 3 * VW, a3, n[3]);
    }
}

/* LayerNorm's dw[j] += dy * (x - mean) * rstd and db[j] += dy over the
 * rows in order, columns [j0, j1); stats [M][2] = mean, rstd. The same
 * operations in the same order as the scalar loop: bitwise equal. */
void ISA_FN(layernorm_backward_cols)(float *dw, float *db, const float *dy, const float *x,
                                     const float *stats, int64_t M, int64_t C, int64_t j0,
                                     int64_t j1) {
    for (int64_t j = j0; j < j1; j += 2 * VW) {
        int n0 = j1 - j >= VW ? VW : (int)(j1 - j);
        int n1 = j1 - j - VW >= VW ? VW : j1 - j - VW <= 0 ? 0 : (int)(j1 - j - VW);
        VT w0 = v_loadu_n(dw + j, n0), w1 = v_loadu_n(dw + j + VW, n1);
        VT b0 = v_loadu_n(db + j, n0), b1 = v_loadu_n(db + j + VW, n1);
        for (int64_t i = 0; i < M; i++) {
            const float *d = dy + i * C + j, *xr = x + i * C + j;
            VT mu = v_set1(stats[2 * i]), rs = v_set1(stats[2 * i + 1]);
            VT d0 = v_loadu_n(d, n0), d1 = v_loadu_n(d + VW, n1);
            w0 = v_add(w0, v_mul(v_mul(d0, v_sub(v_loadu_n(xr, n0), mu)), rs));
            w1 = v_add(w1, v_mul(v_mul(d1, v_sub(v_loadu_n(xr + VW, n1), mu)), rs));
            b0 = v_add(b0, d0);
            b1 = v_add(b1, d1);
        }
        v_storeu_n(dw + j, w0, n0);
        v_storeu_n(dw + j + VW, w1, n1);
        v_storeu_n(db + j, b0, n0);
        v_storeu_n(db + j + VW, b1, n1);
    }
}
