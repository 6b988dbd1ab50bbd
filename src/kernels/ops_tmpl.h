/*
 * ops_tmpl.h — the forward row ops (softmax, LayerNorm, the GELUs, layer
 * scale, GroupNorm's row helpers) and softmax's backward, written once over
 * the vector vocabulary of a vmath header (VT, VW, v_*, vd_*) and
 * instantiated per CPU path (x86/ops_avx2.c, x86/ops_avx512.c) with
 * ISA_FN(name) naming the functions, as ops_bwd_tmpl.h. The generic path
 * runs the plain references in ops.c.
 *
 * Elementwise tails go through v_loadu_n / v_storeu_n: a lane's result
 * does not depend on its neighbours. Where a tail meets a sum or an FMA,
 * V_MASKED_TAIL picks the order each path has always used (masked lanes
 * inside the vector sum, or scalar after it), so each path's bits stay its
 * own.
 */

/* y = EXPR(v) elementwise over n floats (v names the input vector; y may
 * be x). */
#define OPS_MAP(y, x, n, v, EXPR)                                                                \
    do {                                                                                         \
        int64_t i_ = 0;                                                                          \
        for (; i_ + VW <= (n); i_ += VW) {                                                       \
            VT v = v_loadu((x) + i_);                                                            \
            v_storeu((y) + i_, EXPR);                                                            \
        }                                                                                        \
        if (i_ < (n)) {                                                                          \
            int r_ = (int)((n) - i_);                                                            \
            VT v = v_loadu_n((x) + i_, r_);                                                      \
            v_storeu_n((y) + i_, EXPR, r_);                                                      \
        }                                                                                        \
    } while (0)

/* row[j] = EXPR (v the input vector) over the n floats of row, and sum =
 * their sum: the masked tail inside the vector sum (AVX-512), or summed
 * after it in scalar (each path's order since the first softmax). */
#if V_MASKED_TAIL
#define OPS_TAIL_SUM(acc, tail, e, t) ((void)(tail), (acc) = v_add((acc), v_tail((e), (t), 0.0f)))
#else
#define OPS_TAIL_SUM(acc, tail, e, t)                                                            \
    do {                                                                                         \
        float el_[VW];                                                                           \
        v_storeu(el_, (e));                                                                      \
        for (int k_ = 0; k_ < (t); k_++) (tail) += el_[k_];                                      \
    } while (0)
#endif
#define OPS_EXP_SUM(row, n, v, EXPR, sum)                                                        \
    do {                                                                                         \
        VT acc_ = v_zero();                                                                      \
        float tail_ = 0.0f;                                                                      \
        int64_t j_ = 0;                                                                          \
        for (; j_ + VW <= (n); j_ += VW) {                                                       \
            VT v = v_loadu((row) + j_);                                                          \
            VT e_ = EXPR;                                                                        \
            v_storeu((row) + j_, e_);                                                            \
            acc_ = v_add(acc_, e_);                                                              \
        }                                                                                        \
        if (j_ < (n)) {                                                                          \
            int t_ = (int)((n) - j_);                                                            \
            VT v = v_loadu_n((row) + j_, t_);                                                    \
            VT e_ = EXPR;                                                                        \
            v_storeu_n((row) + j_, e_, t_);                                                      \
            OPS_TAIL_SUM(acc_, tail_, e_, t_);                                                   \
        }                                                                                        \
        (sum) = V_MASKED_TAIL ? v_hsum(acc_) : v_hsum(acc_) + tail_;                             \
    } while (0)

/* x Phi(x), Phi from v_phi's table of polynomials: on AVX-512 the sequence
 * of vitc__v_gelu, so the GEMM epilogues' fused GELU gives the same bits. */
void ISA_FN(gelu_to)(float *y, const float *x, int64_t n) {
    OPS_MAP(y, x, n, v, v_mul(v, v_phi(v)));
}

void ISA_FN(gelu)(float *x, int64_t n) { ISA_FN(gelu_to)(x, x, n); }

/* x / (1 + e^(-1.702 x)) */
void ISA_FN(quick_gelu)(float *x, int64_t n) {
    OPS_MAP(x, x, n, v, v_div(v, v_add(v_set1(1.0f), v_exp(v_mul(v, v_set1(-1.702f))))));
}

/* tanh-GELU as x / (1 + e^(-2 sqrt(2/pi) (x + 0.044715 x^3))) (kernels.h).
 * v_exp saturates rather than overflowing, so lanes whose exponent is past
 * 88 (x below ~-9.5: results under 1e-37, or x huge) are set to 0; NaN is
 * kept. */
static inline VT ISA_FN(tanh_gelu_v)(VT v) {
    VT u = v_fma(v_mul(v_set1(0.044715f), v), v_mul(v, v), v);
    VT z = v_mul(u, v_set1(-1.5957691216057308f));
    return v_zero_gt(v_div(v, v_add(v_set1(1.0f), v_exp(z))), z, 88.0f);
}

void ISA_FN(tanh_gelu)(float *x, int64_t n) { OPS_MAP(x, x, n, v, ISA_FN(tanh_gelu_v)(v)); }

/* y = r + g * y, the product rounded first (no FMA), as the reference. */
void ISA_FN(scale_add)(float *y, const float *g, const float *r, int64_t n) {
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        VT v = v_mul(v_loadu(g + i), v_loadu(y + i));
        v_storeu(y + i, r ? v_add(v_loadu(r + i), v) : v);
    }
    if (i < n) {
        int t = (int)(n - i);
        VT v = v_mul(v_loadu_n(g + i, t), v_loadu_n(y + i, t));
        v_storeu_n(y + i, r ? v_add(v_loadu_n(r + i, t), v) : v, t);
    }
}

#if !V_MASKED_TAIL
/* mx's largest lane, NaN lanes passed over (the scalar loops' order). */
static inline float ISA_FN(lane_max)(VT mx) {
    float ml[VW];
    v_storeu(ml, mx);
    float m = -INFINITY;
    for (int k = 0; k < VW; k++)
        if (ml[k] > m) m = ml[k];
    return m;
}
#endif

void ISA_FN(softmax_rows)(float *x, int64_t rows, int64_t n, float inv_temperature) {
    const VT it = v_set1(inv_temperature);
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        VT mx = v_set1(-INFINITY);
        int64_t j = 0;
        for (; j + VW <= n; j += VW) {
            VT v = v_mul(v_loadu(row + j), it);
            v_storeu(row + j, v);
            /* NaN loses here as in the scalar loop; its exp makes the row NaN */
            mx = v_max(v, mx);
        }
#if V_MASKED_TAIL
        if (j < n) {
            int t = (int)(n - j);
            VT v = v_mul(v_loadu_n(row + j, t), it);
            v_storeu_n(row + j, v, t);
            mx = v_max(v_tail(v, t, -INFINITY), mx);
        }
        float mxs = v_hmax(mx);
#else
        float mxs = ISA_FN(lane_max)(mx);
        for (; j < n; j++) {
            row[j] *= inv_temperature;
            if (row[j] > mxs) mxs = row[j];
        }
#endif
        const VT vm = v_set1(mxs);
        float sum;
        OPS_EXP_SUM(row, n, v, v_exp(v_sub(v, vm)), sum);
        const VT inv = v_set1(1.0f / sum);
        for (j = 0; j + VW <= n; j += VW) v_storeu(row + j, v_mul(v_loadu(row + j), inv));
        if (j < n) v_storeu_n(row + j, v_mul(v_loadu_n(row + j, (int)(n - j)), inv), (int)(n - j));
    }
}

/* max_j x_j s over the row's tail from j (vector part mx): each path's
 * order, as in softmax_rows. */
static inline float ISA_FN(sm_tail_max)(VT mx, const float *row, int64_t j, int64_t n, float s) {
#if V_MASKED_TAIL
    if (j < n) {
        const int t = (int)(n - j);
        mx = v_max(v_tail(v_mul(v_loadu_n(row + j, t), v_set1(s)), t, -INFINITY), mx);
    }
    return v_hmax(mx);
#else
    float mxs = ISA_FN(lane_max)(mx);
    for (; j < n; j++)
        if (row[j] * s > mxs) mxs = row[j] * s;
    return mxs;
#endif
}

/* The row's tail from j of the exponential pass (acc its vector sum), and
 * the row's sum: OPS_EXP_SUM's last steps. */
static inline float ISA_FN(sm_tail_sum)(VT acc, float *row, int64_t j, int64_t n, VT vs, VT nm) {
    float tail = 0.0f;
    if (j < n) {
        int t = (int)(n - j);
        VT e = v_exp2_lp(v_fma(v_loadu_n(row + j, t), vs, nm));
        v_storeu_n(row + j, e, t);
        OPS_TAIL_SUM(acc, tail, e, t);
    }
    return V_MASKED_TAIL ? v_hsum(acc) : v_hsum(acc) + tail;
}

/* The low-precision attentions' softmax (attention_lp.c), without its last
 * pass: x = 2^(x s - m), m = max_j x_j s, and inv[r] = 1 / sum_j x_j. The
 * caller scales by inv[r] as it rounds P (to bf16, or to steps of 1/255),
 * which saves the normalising pass over the row and its store. s carries
 * log2 e (the scale times log2 e), so the exponential is v_exp2_lp, to
 * 3e-6: P's rounding is far coarser. A row whose every x s is -inf gives
 * NaN, as softmax_rows. Rows go in pairs: one row's max and sum chains,
 * over ViT's 197 keys, waited on their own latency (the pair: the int8
 * attention 3% faster); each row's operations and their order are the
 * single row's, so its bits do not depend on the pairing. */
void ISA_FN(softmax_rows_exp2)(float *x, int64_t rows, int64_t n, float s, float *inv) {
    const VT vs = v_set1(s);
    int64_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        float *a = x + r * n, *b = a + n; /* [n] each */
        VT ma = v_set1(-INFINITY), mb = ma;
        int64_t j = 0;
        for (; j + VW <= n; j += VW) {
            ma = v_max(v_mul(v_loadu(a + j), vs), ma);
            mb = v_max(v_mul(v_loadu(b + j), vs), mb);
        }
        const VT na = v_set1(-ISA_FN(sm_tail_max)(ma, a, j, n, s));
        const VT nb = v_set1(-ISA_FN(sm_tail_max)(mb, b, j, n, s));
        VT sa = v_zero(), sb = v_zero();
        for (j = 0; j + VW <= n; j += VW) {
            VT ea = v_exp2_lp(v_fma(v_loadu(a + j), vs, na));
            VT eb = v_exp2_lp(v_fma(v_loadu(b + j), vs, nb));
            v_storeu(a + j, ea);
            v_storeu(b + j, eb);
            sa = v_add(sa, ea);
            sb = v_add(sb, eb);
        }
        inv[r] = 1.0f / ISA_FN(sm_tail_sum)(sa, a, j, n, vs, na);
        inv[r + 1] = 1.0f / ISA_FN(sm_tail_sum)(sb, b, j, n, vs, nb);
    }
    for (; r < rows; r++) {
        float *row = x + r * n; /* [n] */
        VT mx = v_set1(-INFINITY);
        int64_t j = 0;
        for (; j + VW <= n; j += VW) mx = v_max(v_mul(v_loadu(row + j), vs), mx);
        const VT nm = v_set1(-ISA_FN(sm_tail_max)(mx, row, j, n, s));
        VT acc = v_zero();
        for (j = 0; j + VW <= n; j += VW) {
            VT e = v_exp2_lp(v_fma(v_loadu(row + j), vs, nm));
            v_storeu(row + j, e);
            acc = v_add(acc, e);
        }
        inv[r] = 1.0f / ISA_FN(sm_tail_sum)(acc, row, j, n, vs, nm);
    }
}

/* softmax(scale x) down the columns of x [n, ld], VW columns a vector
 * (the last ones masked): each column's scale, max, exp(x - max), sum and
 * 1 / sum in the order of softmax_rows' scalar reference. */
void ISA_FN(softmax_cols)(float *x, int64_t n, int64_t L, int64_t ld, float scale) {
    const VT vs = v_set1(scale);
    for (int64_t j = 0; j < L; j += VW) {
        const int t = L - j < VW ? (int)(L - j) : VW;
        float *c = x + j;
#define OPS_LD(p) (t == VW ? v_loadu(p) : v_loadu_n((p), t))
#define OPS_ST(p, v) (t == VW ? v_storeu((p), (v)) : v_storeu_n((p), (v), t))
        VT mx = v_set1(-INFINITY);
        for (int64_t i = 0; i < n; i++) {
            VT v = v_mul(OPS_LD(c + i * ld), vs);
            OPS_ST(c + i * ld, v);
            mx = v_max(v, mx); /* NaN loses here; its exp makes the column NaN */
        }
        VT sum = v_zero();
        for (int64_t i = 0; i < n; i++) {
            VT e = v_exp(v_sub(OPS_LD(c + i * ld), mx));
            OPS_ST(c + i * ld, e);
            sum = v_add(sum, e);
        }
        const VT inv = v_div(v_set1(1.0f), sum);
        for (int64_t i = 0; i < n; i++) OPS_ST(c + i * ld, v_mul(OPS_LD(c + i * ld), inv));
#undef OPS_LD
#undef OPS_ST
    }
}

/* vitc__dot_rows: VW rows at a time, each row's products with w_m in a
 * vector of its own, the VW vectors' sums transposed into one vector
 * (v_hsum_lanes) and stored as VW consecutive results; rows past the last
 * whole VW one at a time. */
void ISA_FN(dot_rows)(float *y, int64_t ldy, const float *x, int64_t ldx, const float *w,
                      int64_t n, int64_t K, int64_t rows) {
    const int64_t Kv = K / VW * VW;
    const int kt = (int)(K - Kv);
    int64_t r0 = 0;
    for (; r0 + VW <= rows; r0 += VW)
        for (int64_t m = 0; m < n; m++) {
            const float *wm = w + m * K, *xr = x + r0 * ldx;
            VT acc[VW];
#pragma GCC unroll 16
            for (int i = 0; i < VW; i++) acc[i] = v_zero();
            for (int64_t k = 0; k < Kv; k += VW) {
                const VT wv = v_loadu(wm + k);
#pragma GCC unroll 16
                for (int i = 0; i < VW; i++) acc[i] = v_fma(v_loadu(xr + i * ldx + k), wv, acc[i]);
            }
            if (kt) {
                const VT wv = v_loadu_n(wm + Kv, kt);
#pragma GCC unroll 16
                for (int i = 0; i < VW; i++)
                    acc[i] = v_fma(v_loadu_n(xr + i * ldx + Kv, kt), wv, acc[i]);
            }
            v_storeu(y + m * ldy + r0, v_hsum_lanes(acc));
        }
    for (; r0 < rows; r0++)
        for (int64_t m = 0; m < n; m++) {
            const float *wm = w + m * K, *xr = x + r0 * ldx;
            VT acc = v_zero();
            for (int64_t k = 0; k < Kv; k += VW) acc = v_fma(v_loadu(xr + k), v_loadu(wm + k), acc);
            if (kt) acc = v_fma(v_loadu_n(xr + Kv, kt), v_loadu_n(wm + Kv, kt), acc);
            y[m * ldy + r0] = v_hsum(acc);
        }
}

/* GroupNorm's (and LayerNorm's) statistics: the sums of x - shift and of
 * its square, in double. */
void ISA_FN(row_stats)(const float *x, int64_t n, double shift, double *o) {
    const VTD sh = vd_set1(shift);
    VTD s0 = vd_zero(), s1 = s0, q0 = s0, q1 = s0;
    int64_t c = 0;
    for (; c + VW <= n; c += VW) {
        VT v = v_loadu(x + c);
        VTD d0 = vd_sub(vd_cvt_lo(v), sh);
        VTD d1 = vd_sub(vd_cvt_hi(v), sh);
        s0 = vd_add(s0, d0);
        s1 = vd_add(s1, d1);
        q0 = vd_fma(d0, d0, q0);
        q1 = vd_fma(d1, d1, q1);
    }
    double s = vd_hsum(vd_add(s0, s1)), q = vd_hsum(vd_add(q0, q1));
    for (; c < n; c++) {
        double d = (double)x[c] - shift;
        s += d;
        q += d * d;
    }
    o[0] = s, o[1] = q;
}

/* Stats in one pass, in double, shifted by the row's first element so that
 * E[d^2] - E[d]^2 does not cancel when the mean is large against the spread. */
void ISA_FN(layernorm)(float *y, const float *x, const float *w, const float *b, int64_t M,
                       int64_t C, float eps, float *stats) {
    for (int64_t i = 0; i < M; i++) {
        const float *xr = x + i * C;
        float *yr = y ? y + i * C : NULL;
        double x0 = xr[0], st[2];
        ISA_FN(row_stats)(xr, C, x0, st);
        double s = st[0], q = st[1];
        double md = s / (double)C;
        double var = q / (double)C - md * md;
        if (var < 0.0) var = 0.0;
        float rstd = (float)(1.0 / sqrt(var + (double)eps));
        if (stats)
            stats[2 * i] = (float)(x0 + md), stats[2 * i + 1] = rstd;
        if (!yr)
            continue;
        /* x - mean as (x - x0) - md: the first difference is exact for data
         * near x0, so a large mean loses no more than the spread's bits. */
        const VT v0 = v_set1(xr[0]), vm = v_set1((float)md), vr = v_set1(rstd);
        int64_t c = 0;
        for (; c + VW <= C; c += VW) {
            VT v = v_mul(v_sub(v_sub(v_loadu(xr + c), v0), vm), vr);
            if (w) v = v_mul(v, v_loadu(w + c));
            if (b) v = v_add(v, v_loadu(b + c));
            v_storeu(yr + c, v);
        }
        if (c < C) {
            int t = (int)(C - c);
            VT v = v_mul(v_sub(v_sub(v_loadu_n(xr + c, t), v0), vm), vr);
            if (w) v = v_mul(v, v_loadu_n(w + c, t));
            if (b) v = v_add(v, v_loadu_n(b + c, t));
            v_storeu_n(yr + c, v, t);
        }
    }
}

/* y = (x - mean) * sc + sh, fused; the unmasked paths' tail is the
 * reference's unfused expression (their bits since the first version). */
void ISA_FN(row_norm)(float *y, const float *x, int64_t n, float mean, float sc, float sh) {
    const VT vm = v_set1(mean), vs = v_set1(sc), vb = v_set1(sh);
    int64_t c = 0;
    for (; c + VW <= n; c += VW) v_storeu(y + c, v_fma(v_sub(v_loadu(x + c), vm), vs, vb));
#if V_MASKED_TAIL
    if (c < n) {
        int t = (int)(n - c);
        v_storeu_n(y + c, v_fma(v_sub(v_loadu_n(x + c, t), vm), vs, vb), t);
    }
#else
    for (; c < n; c++) y[c] = (x[c] - mean) * sc + sh;
#endif
}

/* dx = it * y o (dy - d), d = rowsum(dy o y): the VW products of a block
 * summed in float, the blocks in double (the reference sums in double). */
void ISA_FN(softmax_rows_backward)(float *dx, const float *y, const float *dy, int64_t rows,
                                   int64_t n, float inv_temperature) {
    const VT it = v_set1(inv_temperature);
    for (int64_t r = 0; r < rows; r++) {
        const float *yr = y + r * n, *gr = dy + r * n;
        float *xr = dx + r * n;
        double dot = 0.0;
        int64_t j = 0;
        for (; j + VW <= n; j += VW) dot += (double)v_hsum(v_mul(v_loadu(gr + j), v_loadu(yr + j)));
        for (; j < n; j++) dot += (double)(gr[j] * yr[j]);
        const VT d = v_set1((float)dot);
        for (j = 0; j + VW <= n; j += VW)
            v_storeu(xr + j, v_mul(v_mul(it, v_loadu(yr + j)), v_sub(v_loadu(gr + j), d)));
        for (; j < n; j++) xr[j] = inv_temperature * yr[j] * (gr[j] - (float)dot);
    }
}

#undef OPS_MAP
