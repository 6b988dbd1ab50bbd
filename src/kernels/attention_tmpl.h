/*
 * attention_tmpl.h — the tiled online-softmax attention kernel, written once
 * over the vector vocabulary of vmath_{avx512,avx2,generic}.h (VT, VW,
 * v_load, v_fma, v_exp2, ...) and instantiated per ISA. The including file
 * also defines:
 *
 *   ATT_FN                 name of the vitc__attn_rows_fn it produces
 *   MR_S                   query rows of the S = Q K^T microkernel (2 vectors of keys wide)
 *   MR_PV, NV_PV           rows x vectors of the O += P V microkernel
 *   ATT_SMALL_DV           0, or the largest Dv given the fused small-Dv path
 *
 * Algorithm (FlashAttention-2, base 2): Q is packed once per task, already
 * multiplied by scale*log2(e), so a score is directly a base-2 logit; a mask
 * value is multiplied by log2(e) as it is added. For each key block:
 * S = Qs K^T (packed K^T panels, so the microkernel reads contiguous rows),
 * m' = max(m, rowmax S), P = 2^(S - m'), l = l*2^(m - m') + sum P,
 * O = O*2^(m - m') + P V. At the end O/l. A row whose scores are all -inf
 * keeps m = -inf and comes out NaN, as torch 1.13's softmax does.
 */

#include "attention_common_tmpl.h"

#define NR ATT_PW /* S microkernel / K panel width in keys */
/* Query rows taken from scores to P V at a time: a multiple of both
 * microkernels' rows (MR_S is one of MR_PV on every path). */
#ifndef ATT_RG
#define ATT_RG (2 * MR_S)
#endif

/* lse[r] = ln(sum_j e^s_j) of rows [0, nr) from the base-2 running max m and
 * sum l: m ln 2 + ln l; -inf for a row that never saw a finite score. */
static void att_store_lse(float *lse, const float *m, const float *l, int64_t nr) {
    for (int64_t r = 0; r < nr; r++)
        lse[r] = m[r] == -INFINITY ? -INFINITY : m[r] * 0.693147180559945309f + logf(l[r]);
}

/* s[r][0:NR] = q[r][0:D] . kt[0:D][0:NR] for r < mr; only the first VW
 * columns when half (a last panel with <= VW keys left). With rmax, also
 * rmax[r] = max(rmax[r], the row's scores of its first nk keys): the row
 * max on the way out, where the max instructions overlap the FMA-bound
 * product, instead of a pass of its own over the tile afterwards (that
 * pass, latency bound, cost 4.5 % of a ViT-B head). */
static inline __attribute__((always_inline)) void att_s_kernel(int mr, int half, int64_t D,
                                                               const float *q, /* [mr, D] */
                                                               const float *kt, /* [D, NR] */
                                                               float *s, /* [mr, lds] */
                                                               int64_t lds,
                                                               VT *rmax, /* [mr] or NULL */
                                                               int64_t nk) {
    VT a0[MR_S], a1[MR_S];
    att_tile2(mr, half, D, q, D, kt, NR, a0, a1);
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mr) {
            v_store(s + r * lds, a0[r]);
            if (!half) v_store(s + r * lds + VW, a1[r]);
        }
    if (!rmax) return;
    if (nk >= NR) {
        ATT_UNROLL
        for (int r = 0; r < MR_S; r++)
            if (r < mr) rmax[r] = v_max(rmax[r], v_max(a0[r], a1[r]));
    } else if (half || nk <= VW) { /* the zero columns past nk score 0, not -inf: masked out */
        ATT_UNROLL
        for (int r = 0; r < MR_S; r++)
            if (r < mr) rmax[r] = v_max(rmax[r], v_tail(a0[r], nk, -INFINITY));
    } else {
        ATT_UNROLL
        for (int r = 0; r < MR_S; r++)
            if (r < mr) rmax[r] = v_max(rmax[r], v_max(a0[r], v_tail(a1[r], nk - VW, -INFINITY)));
    }
}

static void att_s_rows(int mr, int half, int64_t D, const float *q, const float *kt, float *s,
                       int64_t lds, VT *rmax, int64_t nk) {
    switch (mr) {
#define ATT_S_CASE(n)                                                \
    case n:                                                          \
        if (half) att_s_kernel(n, 1, D, q, kt, s, lds, rmax, nk);    \
        else att_s_kernel(n, 0, D, q, kt, s, lds, rmax, nk);         \
        break;
        ATT_MRS_CASES(ATT_S_CASE)
#undef ATT_S_CASE
    default: break;
    }
}

/* o[r][0:nv*VW] = (init ? 0 : o[r]*alpha[r]) + sum_j p[r][j] * v[j][0:nv*VW], r < mr.
 * Folding the online-softmax rescale into the accumulator load saves a pass
 * over O per key block. With fo (the last key block), the sum goes times
 * osc[r] to fo[r] instead: the caller's output, the same product the final
 * pass over O would make, without reading O back. */
static inline __attribute__((always_inline)) void att_pv_kernel(int mr, int nv, int init,
                                                                int64_t nkv,
                                                                const float *p, /* [mr, ldp] */
                                                                int64_t ldp,
                                                                const float *v, /* [nkv, ldv] */
                                                                int64_t ldv,
                                                                float *o, /* [mr, ldo] */
                                                                int64_t ldo,
                                                                const float *alpha, /* [mr] */
                                                                float *fo, /* [mr, ldfo] or NULL */
                                                                int64_t ldfo,
                                                                const float *osc /* [mr] */) {
    VT acc[MR_PV][NV_PV];
    ATT_UNROLL
    for (int r = 0; r < MR_PV; r++)
        if (r < mr) {
            VT a = v_set1(init ? 0.0f : alpha[r]);
            ATT_UNROLL
            for (int x = 0; x < NV_PV; x++)
                if (x < nv) acc[r][x] = init ? v_zero() : v_mul(v_load(o + r * ldo + x * VW), a);
        }
    att_tile_rv(mr, nv, nkv, p, ldp, 1, v, ldv, acc);
    ATT_UNROLL
    for (int r = 0; r < MR_PV; r++)
        if (r < mr) {
            if (fo) {
                VT sc = v_set1(osc[r]);
                ATT_UNROLL
                for (int x = 0; x < NV_PV; x++)
                    if (x < nv) v_storeu(fo + r * ldfo + x * VW, v_mul(acc[r][x], sc));
            } else {
                ATT_UNROLL
                for (int x = 0; x < NV_PV; x++)
                    if (x < nv) v_store(o + r * ldo + x * VW, acc[r][x]);
            }
        }
}

static void att_pv_rows(int mr, int nv, int init, int64_t nkv, const float *p, int64_t ldp,
                        const float *v, int64_t ldv, float *o, int64_t ldo, const float *alpha,
                        float *fo, int64_t ldfo, const float *osc) {
#define ATT_PV_CALL(m, n) att_pv_kernel(m, n, init, nkv, p, ldp, v, ldv, o, ldo, alpha, fo, ldfo, osc)
    ATT_MR_NV_SWITCH(ATT_PV_CALL)
#undef ATT_PV_CALL
}

/* Key columns [j0, j0+n) of head (b, h) into K^T panels at kt and padded V
 * rows at vp; the panel columns past n are zero so no NaN leaks from them.
 * Panel by panel, asking for what comes next into L2 meanwhile: the next
 * panel's K rows, this panel's V rows and the query rows [ql0, ql1) of
 * the same indices. A head's rows are short (D floats, 256 bytes in
 * ViT-B) and far apart, which the hardware prefetcher does not follow, and
 * they come from L3 (the qkv GEMM just wrote them, partly on another core):
 * at batch 1 the first loads of Q, K and V stalled for ~10% of the kernel. */
static void att_pack_kv(const vitc__sdpa_desc *d, int64_t Dvp, int64_t b, int64_t h, int64_t j0,
                        int64_t n, float *kt, /* [ceil(n/NR)][D][NR] */
                        float *vp /* [n, Dvp] */, int64_t ql0, int64_t ql1) {
    const int64_t D = d->D, Dv = d->Dv;
    const float *k = d->k + b * d->k_sb + h * d->k_sh + j0 * d->k_sr; /* [n, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh + j0 * d->v_sr; /* [n, Dv] */
    const float *q = d->q + b * d->q_sb + h * d->q_sh;                /* [L, D] */
    for (int64_t p0 = 0; p0 < n; p0 += NR) {
        int64_t rows = n - p0 < NR ? n - p0 : NR;
        if (p0 + NR < n)
            att_prefetch_rows(k + (p0 + NR) * d->k_sr, d->k_sr, n - p0 - NR < NR ? n - p0 - NR : NR, D);
        att_prefetch_rows(v + p0 * d->v_sr, d->v_sr, rows, Dv);
        int64_t q0 = j0 + p0 > ql0 ? j0 + p0 : ql0, q1 = j0 + p0 + rows < ql1 ? j0 + p0 + rows : ql1;
        if (q0 < q1) att_prefetch_rows(q + q0 * d->q_sr, d->q_sr, q1 - q0, D);
        att_pack_panels(k + p0 * d->k_sr, d->k_sr, rows, D, NR, kt + p0 * D);
    }
    if (!vp) return; /* V is read in place */
    for (int64_t j = 0; j < n; j++) att_copy_pad(vp + j * Dvp, v + j * d->v_sr, Dv, Dvp);
}

/* Adds the mask (times log2 e) to s[0:n] in place and returns the max
 * (without a mask, att_s_kernel takes the max). */
static float att_mask_max(float *s, /* [>= roundup(n, VW)] */
                          const float *mrow, /* [n] */ int64_t n) {
    VT mx = v_set1(-INFINITY);
    VT l2e = v_set1(att_log2e);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) {
        VT x = v_fma(v_loadu(mrow + j), l2e, v_load(s + j));
        v_store(s + j, x);
        mx = v_max(mx, x);
    }
    if (j < n) {
        VT x = v_fma(v_loadu_n(mrow + j, n - j), l2e, v_load(s + j));
        v_store(s + j, x);
        mx = v_max(mx, v_tail(x, n - j, -INFINITY));
    }
    return v_hmax(mx);
}

/* Adds row l's decomposed relative-position bias (times log2 e) to the
 * scores of keys [j0, j0+n) in place: key j is at grid row j / kw and
 * column j % kw, so the block is cut into runs of one grid row, each
 * adding the constant rh[row] plus a slice of rw. */
static void att_rel_add(float *s, /* [>= roundup(n, VW)] */
                        const float *rh, /* [kh] */ const float *rw, /* [kw] */
                        int64_t kw, int64_t j0, int64_t n) {
    const VT l2e = v_set1(att_log2e);
    for (int64_t j = 0; j < n;) {
        const int64_t a = (j0 + j) / kw, c = (j0 + j) % kw;
        const int64_t len = kw - c < n - j ? kw - c : n - j;
        const VT hv = v_set1(rh[a]);
        int64_t t = 0;
        for (; t + VW <= len; t += VW)
            v_storeu(s + j + t, v_fma(v_add(hv, v_loadu(rw + c + t)), l2e, v_loadu(s + j + t)));
        if (t < len)
            v_storeu_n(s + j + t,
                       v_fma(v_add(hv, v_loadu_n(rw + c + t, len - t)), l2e,
                             v_loadu_n(s + j + t, len - t)),
                       len - t);
        j += len;
    }
}

/* The max of s[0:n] (a row whose scores were changed after the S kernel). */
static float att_row_max(const float *s, /* [>= roundup(n, VW)] */ int64_t n) {
    VT mx = v_set1(-INFINITY);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) mx = v_max(mx, v_load(s + j));
    if (j < n) mx = v_max(mx, v_tail(v_load(s + j), n - j, -INFINITY));
    return v_hmax(mx);
}

/* s[j] = 2^(s[j] - m) for j < n; returns their sum. With store == 0 only the
 * sum is wanted (first pass of the probs path). */
static float att_exp_sum(float *s, int64_t n, float m, int store) {
    VT vm = v_set1(m), sum = v_zero(), sum1 = v_zero();
    int64_t j = 0;
    /* Two sums: one sum after another is latency bound (a row is only ~13
     * vectors, too short for the next row to overlap it). */
    for (; j + 2 * VW <= n; j += 2 * VW) {
        VT e0 = v_exp2(v_sub(v_load(s + j), vm));
        VT e1 = v_exp2(v_sub(v_load(s + j + VW), vm));
        if (store) v_store(s + j, e0), v_store(s + j + VW, e1);
        sum = v_add(sum, e0);
        sum1 = v_add(sum1, e1);
    }
    sum = v_add(sum, sum1);
    for (; j + VW <= n; j += VW) {
        VT e = v_exp2(v_sub(v_load(s + j), vm));
        if (store) v_store(s + j, e);
        sum = v_add(sum, e);
    }
    if (j < n) {
        VT e = v_tail(v_exp2(v_sub(v_load(s + j), vm)), n - j, 0.0f);
        if (store) v_store(s + j, e);
        sum = v_add(sum, e);
    }
    return v_hsum(sum);
}

#if ATT_SMALL_DV > 0
/* ATT_SDV_CASES(C): C(1) ... C(ATT_SMALL_DV), the switch cases that make a
 * run-time Dv a compile-time one on the small-Dv paths. */
#if ATT_SMALL_DV > 8
#define ATT_SDV_CASES(C) \
    C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8) C(9) C(10) C(11) C(12) C(13) C(14) C(15) C(16)
#else
#define ATT_SDV_CASES(C) C(1) C(2) C(3) C(4) C(5) C(6) C(7) C(8)
#endif

/* The small-Dv path (d = 8 layers: ConvSABlock, SelfAttentionMultiHead).
 * With Dv <= one vector, P V as "broadcast P, FMA a V row" wastes lanes and
 * is latency bound; instead V is packed transposed, vt[c][j], and each P
 * vector is consumed in registers right after its exp2: Dv accumulators of
 * VW keys, reduced once per row and key block. P never goes to memory. */
static inline __attribute__((always_inline)) float att_row_small_k(int DV, const float *s,
                                                                   int64_t n, float mu,
                                                                   const float *vt, /* [DV, ldvt] */
                                                                   int64_t ldvt, float *o, float a,
                                                                   int init) {
    VT acc[ATT_SMALL_DV];
    ATT_UNROLL
    for (int c = 0; c < ATT_SMALL_DV; c++)
        if (c < DV) acc[c] = v_zero();
    VT vm = v_set1(mu), sum = v_zero();
    int64_t j = 0;
    /* Two independent exp2 chains per step: one alone is latency bound. */
    for (; j + 2 * VW <= n; j += 2 * VW) {
        VT e0 = v_exp2(v_sub(v_load(s + j), vm));
        VT e1 = v_exp2(v_sub(v_load(s + j + VW), vm));
        sum = v_add(sum, v_add(e0, e1));
        ATT_UNROLL
        for (int c = 0; c < ATT_SMALL_DV; c++)
            if (c < DV)
                acc[c] = v_fma(e1, v_loadu(vt + c * ldvt + j + VW),
                               v_fma(e0, v_loadu(vt + c * ldvt + j), acc[c]));
    }
    for (; j + VW <= n; j += VW) {
        VT e = v_exp2(v_sub(v_load(s + j), vm));
        sum = v_add(sum, e);
        ATT_UNROLL
        for (int c = 0; c < ATT_SMALL_DV; c++)
            if (c < DV) acc[c] = v_fma(e, v_loadu(vt + c * ldvt + j), acc[c]);
    }
    if (j < n) { /* vt is zero padded past n, so only e needs its tail cleared */
        VT e = v_tail(v_exp2(v_sub(v_load(s + j), vm)), n - j, 0.0f);
        sum = v_add(sum, e);
        ATT_UNROLL
        for (int c = 0; c < ATT_SMALL_DV; c++)
            if (c < DV) acc[c] = v_fma(e, v_loadu(vt + c * ldvt + j), acc[c]);
    }
    ATT_UNROLL
    for (int c = 0; c < ATT_SMALL_DV; c++)
        if (c < DV) o[c] = (init ? 0.0f : o[c] * a) + v_hsum(acc[c]);
    return v_hsum(sum);
}

static float att_row_small(int64_t Dv, const float *s, int64_t n, float mu, const float *vt,
                           int64_t ldvt, float *o, float a, int init) {
    switch (Dv) {
#define ATT_SM(k) \
    case k: return att_row_small_k(k, s, n, mu, vt, ldvt, o, a, init);
        ATT_SDV_CASES(ATT_SM)
#undef ATT_SM
    default: return 0.0f;
    }
}

/* vt[c][j] = v[j0 + j][c] for j < n, zero up to the panel edge. */
static void att_pack_vt(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t j0, int64_t n,
                        float *vt, /* [Dv, ldvt], at column j0 */
                        int64_t ldvt) {
    const float *v = d->v + b * d->v_sb + h * d->v_sh + j0 * d->v_sr; /* [n, Dv] */
    int64_t np = (n + NR - 1) / NR * NR;
    for (int64_t c = 0; c < d->Dv; c++) {
        float *row = vt + c * ldvt;
        for (int64_t j = 0; j < n; j++) row[j] = v[j * d->v_sr + c];
        for (int64_t j = n; j < np; j++) row[j] = 0.0f;
    }
}
#endif

#if ATT_SMALL_DV > 0
/* ---- transposed small-Dv path (no mask, no probs) ------------------------
 * Vectors run over query rows instead of keys: S^T[j][r] = K[j] . Qs^T[:, r].
 * The softmax is then along the non-vector dimension, so the row max and
 * sum are plain vertical max/add with no horizontal reductions, and
 * O^T[c][r] += P^T[j][r] * V[j][c] takes V as a broadcast straight from the
 * caller's rows. K and V need no packing at all. Per 16 scores: D FMAs, one
 * exp2, Dv FMAs. */
#define RG (2 * VW) /* query rows per S^T microkernel */

/* st[j][0:RG] = k[j][0:D] . qt[0:D][0:RG] for j < mk; mx[0:2] takes the
 * running column max on the way out (saves a pass over the tile). */
static inline __attribute__((always_inline)) void att_st_kernel(int mk, int64_t D,
                                                                const float *k, /* [mk, ldk] */
                                                                int64_t ldk,
                                                                const float *qt, /* [D, ldq] */
                                                                int64_t ldq,
                                                                float *st, /* [mk, RG] */
                                                                VT *mx) {
    VT a0[MR_S], a1[MR_S];
    att_tile2(mk, 0, D, k, ldk, qt, ldq, a0, a1);
    VT m0 = mx[0], m1 = mx[1];
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mk) {
            v_store(st + r * RG, a0[r]);
            v_store(st + r * RG + VW, a1[r]);
            m0 = v_max(m0, a0[r]);
            m1 = v_max(m1, a1[r]);
        }
    mx[0] = m0, mx[1] = m1;
}

static void att_st_rows(int mk, int64_t D, const float *k, int64_t ldk, const float *qt,
                        int64_t ldq, float *st, VT *mx) {
    switch (mk) {
#define ATT_ST_CASE(n) \
    case n: att_st_kernel(n, D, k, ldk, qt, ldq, st, mx); break;
        ATT_MRS_CASES(ATT_ST_CASE)
#undef ATT_ST_CASE
    default: break;
    }
}

/* For VW query rows: ot[c][:] = (init ? 0 : ot[c][:]*a) + sum_j 2^(st[j] - mu) v[j][c];
 * returns sum_j 2^(st[j] - mu). */
static inline __attribute__((always_inline)) VT att_tpv_k(int DV, const float *st, /* [nkv, RG] */
                                                          int64_t nkv, VT mu,
                                                          const float *v, /* [nkv, ldv] */
                                                          int64_t ldv,
                                                          float *ot, /* [DV, VW] */
                                                          VT a, int init) {
    VT acc[ATT_SMALL_DV];
    ATT_UNROLL
    for (int c = 0; c < ATT_SMALL_DV; c++)
        if (c < DV) acc[c] = init ? v_zero() : v_mul(v_load(ot + c * VW), a);
    VT sum0 = v_zero(), sum1 = v_zero();
    int64_t j = 0;
    /* Two keys per step: two independent exp2 chains. */
    for (; j + 2 <= nkv; j += 2) {
        VT p0 = v_exp2(v_sub(v_load(st + j * RG), mu));
        VT p1 = v_exp2(v_sub(v_load(st + (j + 1) * RG), mu));
        sum0 = v_add(sum0, p0);
        sum1 = v_add(sum1, p1);
        ATT_UNROLL
        for (int c = 0; c < ATT_SMALL_DV; c++)
            if (c < DV)
                acc[c] = v_fma(p1, v_set1(v[(j + 1) * ldv + c]),
                               v_fma(p0, v_set1(v[j * ldv + c]), acc[c]));
    }
    if (j < nkv) {
        VT p0 = v_exp2(v_sub(v_load(st + j * RG), mu));
        sum0 = v_add(sum0, p0);
        ATT_UNROLL
        for (int c = 0; c < ATT_SMALL_DV; c++)
            if (c < DV) acc[c] = v_fma(p0, v_set1(v[j * ldv + c]), acc[c]);
    }
    ATT_UNROLL
    for (int c = 0; c < ATT_SMALL_DV; c++)
        if (c < DV) v_store(ot + c * VW, acc[c]);
    return v_add(sum0, sum1);
}

static VT att_tpv(int64_t Dv, const float *st, int64_t nkv, VT mu, const float *v, int64_t ldv,
                  float *ot, VT a, int init) {
    switch (Dv) {
#define ATT_TP(n) \
    case n: return att_tpv_k(n, st, nkv, mu, v, ldv, ot, a, init);
        ATT_SDV_CASES(ATT_TP)
#undef ATT_TP
    default: return v_zero();
    }
}

/* Rows [l0, l1) of head (b, h) on the transposed path. Scratch: qp holds
 * Qs^T [D, nrp], st the S^T tile of one row group [Bc, RG], ot O^T per
 * VW rows [nrp/VW][Dv][VW], mrow/lrow the running max and sum [nrp]. */
static void att_small_rows(const vitc__attn_plan *pl, vitc__attn_ws *ws, int64_t b, int64_t h,
                           int64_t l0, int64_t l1) {
    const vitc__sdpa_desc *d = pl->d;
    const int64_t D = d->D, Dv = d->Dv, S = d->S, Bc = pl->Bc;
    const int64_t nr = l1 - l0, nrp = (nr + RG - 1) / RG * RG;
    const float *q = d->q + b * d->q_sb + h * d->q_sh + l0 * d->q_sr; /* [nr, D] */
    const float *k = d->k + b * d->k_sb + h * d->k_sh;                /* [S, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh;                /* [S, Dv] */
    float *qt = ws->qp, *st = ws->st, *ot = ws->ot, *m = ws->mrow, *l = ws->lrow;
    int64_t r = 0;
#ifdef ATT_HAVE_T8
    for (; r + 8 <= nr; r += 8) {
        int64_t c = 0;
        for (; c + 8 <= D; c += 8) att_transpose8(q + r * d->q_sr + c, d->q_sr, qt + c * nrp + r, nrp);
        for (; c < D; c++)
            for (int64_t i = 0; i < 8; i++) qt[c * nrp + r + i] = q[(r + i) * d->q_sr + c];
    }
#endif
    for (; r < nrp; r++)
        for (int64_t c = 0; c < D; c++) qt[c * nrp + r] = r < nr ? q[r * d->q_sr + c] : 0.0f;
    const VT qs = v_set1(pl->qscale);
    for (int64_t i = 0; i < D * nrp; i += VW) v_store(qt + i, v_mul(v_load(qt + i), qs));
    for (int64_t g = 0; g < nrp; g += RG) {
        for (int64_t kb = 0; kb < pl->nkb; kb++) {
            const int64_t j0 = kb * Bc;
            const int64_t nkv = S - j0 < Bc ? S - j0 : Bc;
            VT bmax[2] = {v_set1(-INFINITY), v_set1(-INFINITY)};
            for (int64_t j = 0, mk; j < nkv; j += mk) {
                mk = att_rows(nkv - j, MR_S);
                att_st_rows((int)mk, D, k + (j0 + j) * d->k_sr, d->k_sr, qt + g, nrp, st + j * RG,
                            bmax);
            }
            for (int64_t x = 0; x < RG; x += VW) {
                const int64_t r0 = g + x;
                VT mx = bmax[x / VW];
                /* Without a mask a -inf max needs -inf inputs, and then
                 * torch's NaN comes out of 2^(-inf - -inf) by itself. */
                VT mold = kb == 0 ? v_set1(-INFINITY) : v_load(m + r0);
                VT mn = v_max(mold, mx);
                VT a = v_exp2(v_sub(mold, mn));
                VT sum = att_tpv(Dv, st + x, nkv, mn, v + j0 * d->v_sr, d->v_sr,
                                 ot + r0 * Dv, a, kb == 0);
                v_store(m + r0, mn);
                v_store(l + r0, kb == 0 ? sum : v_fma(v_load(l + r0), a, sum));
            }
        }
    }
    if (d->lse) att_store_lse(d->lse + b * d->lse_sb + h * d->lse_sh + l0, m, l, nr);
    float *o = d->o + b * d->o_sb + h * d->o_sh + l0 * d->o_sr; /* [nr, Dv] */
    for (int64_t r = 0; r < nr; r++) {
        float inv = 1.0f / l[r];
        const float *src = ot + (r / VW) * VW * Dv + r % VW; /* column r of O^T */
        for (int64_t c = 0; c < Dv; c++) o[r * d->o_sr + c] = src[c * VW] * inv;
    }
}
#undef RG
#endif

/* S tile for key block [j0, j0+nkv): st[r][0:nkv] for r < nr; with rmax,
 * each row's max over the nkv keys to rmax[r] (lanes to reduce). */
static void att_scores(const float *qp, int64_t D, int64_t nr, const float *kt, int64_t nkv,
                       float *st, int64_t Bcp, VT *rmax /* [nr] or NULL */) {
    if (rmax)
        for (int64_t r = 0; r < nr; r++) rmax[r] = v_set1(-INFINITY);
    for (int64_t p0 = 0; p0 < nkv; p0 += NR) {
        const float *panel = kt + (p0 / NR) * D * NR;
        int half = VW > 1 && nkv - p0 <= VW;
        for (int64_t r = 0, mr; r < nr; r += mr) {
            mr = att_rows(nr - r, MR_S);
            att_s_rows((int)mr, half, D, qp + r * D, panel, st + r * Bcp + p0, Bcp,
                       rmax ? rmax + r : NULL, nkv - p0);
        }
    }
}

/* Large Dv: V packed once per head into column panels of ATT_PW,
 * [Dv / ATT_PW][kv_cols][ATT_PW], the layout of K^T's panels, and P V run
 * by the S microkernel's MR_S x 2-vector tile. The 6 x 4-vector tile
 * streams twice the V bytes per FMA out of L2 (a 256-key block of 512
 * channels is 512 KB), and the V rows' chunks lie a row stride apart,
 * which the L1 sets and prefetcher take badly. */
#define ATT_VPAN(pl)                                                                  \
    (VW >= 8 && (pl)->whole_head && (pl)->d->Dv >= 256 && (pl)->d->Dv % ATT_PW == 0 && \
     (pl)->d->Dv == (pl)->Dvp)

/* Keys [j0, j0+n) of head (b, h)'s V into the panels at vp (already offset
 * to key j0; panel stride ldp keys). */
static void att_pack_vpan(const vitc__sdpa_desc *d, int64_t b, int64_t h, int64_t j0, int64_t n,
                          float *vp, int64_t ldp) {
    const float *v = d->v + b * d->v_sb + h * d->v_sh + j0 * d->v_sr; /* [n, Dv] */
    for (int64_t j = 0; j < n; j++)
        for (int64_t c = 0; c < d->Dv; c += ATT_PW) {
            float *dst = vp + (c / ATT_PW) * ldp * ATT_PW + j * ATT_PW; /* [ATT_PW] */
            v_store(dst, v_loadu(v + j * d->v_sr + c));
            v_store(dst + VW, v_loadu(v + j * d->v_sr + c + VW));
        }
}

/* o[r][0:2VW] = (init ? 0 : o[r] alpha[r]) + sum_j p[r][j] vt[j][0:2VW],
 * r < mr <= MR_S, from one V panel; with fo, times osc[r] to fo instead
 * (as att_pv_kernel). */
static inline __attribute__((always_inline)) void att_pvp_kernel(int mr, int init, int64_t nkv,
                                                                 const float *p, /* [mr, ldp] */
                                                                 int64_t ldp,
                                                                 const float *vt, /* [nkv, ATT_PW] */
                                                                 float *o, /* [mr, ldo] */
                                                                 int64_t ldo, const float *alpha,
                                                                 float *fo, /* [mr, ldfo] or NULL */
                                                                 int64_t ldfo, const float *osc) {
    VT a0[MR_S], a1[MR_S];
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mr) {
            VT a = v_set1(init ? 0.0f : alpha[r]);
            a0[r] = init ? v_zero() : v_mul(v_load(o + r * ldo), a);
            a1[r] = init ? v_zero() : v_mul(v_load(o + r * ldo + VW), a);
        }
    for (int64_t j = 0; j < nkv; j++) {
        VT b0 = v_load(vt + j * ATT_PW), b1 = v_load(vt + j * ATT_PW + VW);
        ATT_UNROLL
        for (int r = 0; r < MR_S; r++)
            if (r < mr) {
                VT x = v_set1(p[r * ldp + j]);
                a0[r] = v_fma(x, b0, a0[r]);
                a1[r] = v_fma(x, b1, a1[r]);
            }
    }
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mr) {
            if (fo) {
                VT sc = v_set1(osc[r]);
                v_storeu(fo + r * ldfo, v_mul(a0[r], sc));
                v_storeu(fo + r * ldfo + VW, v_mul(a1[r], sc));
            } else {
                v_store(o + r * ldo, a0[r]);
                v_store(o + r * ldo + VW, a1[r]);
            }
        }
}

static void att_pvp_rows(int mr, int init, int64_t nkv, const float *p, int64_t ldp,
                         const float *vt, float *o, int64_t ldo, const float *alpha, float *fo,
                         int64_t ldfo, const float *osc) {
    switch (mr) {
#define ATT_PVP_CASE(n)                                                                       \
    case n:                                                                                   \
        if (init) att_pvp_kernel(n, 1, nkv, p, ldp, vt, o, ldo, alpha, fo, ldfo, osc);        \
        else att_pvp_kernel(n, 0, nkv, p, ldp, vt, o, ldo, alpha, fo, ldfo, osc);             \
        break;
        ATT_MRS_CASES(ATT_PVP_CASE)
#undef ATT_PVP_CASE
    default: break;
    }
}

/* att_pv on V panels (ATT_VPAN): vp at the key block's first key, panel
 * stride ldk keys. */
static void att_pv_pan(int64_t nr, int64_t nkv, const float *p, /* [nr, Bcp] */
                       const float *vp, int64_t ldk, int64_t Dv, int64_t Bcp,
                       float *ot, /* [nr, Dvp] */
                       int64_t Dvp, int init, const float *alpha, /* [nr] */
                       float *fo, int64_t ldfo, const float *osc /* [nr] */) {
    for (int64_t c0 = 0; c0 < Dv; c0 += ATT_PW) {
        const float *vt = vp + c0 * ldk; /* [nkv, ATT_PW] */
        for (int64_t r = 0, mr; r < nr; r += mr) {
            mr = att_rows(nr - r, MR_S);
            att_pvp_rows((int)mr, init, nkv, p + r * Bcp, Bcp, vt, ot + r * Dvp + c0, Dvp,
                         alpha + r, fo ? fo + r * ldfo + c0 : NULL, ldfo, osc + r);
        }
    }
}

/* O[:, 0:ncols] (+)= P V; ncols is a multiple of VW: Dv when V is read in
 * place, else the padded Dvp. fo: the final block's output rows (see
 * att_pv_kernel), ncols == Dv. */
static void att_pv(int64_t nr, int64_t nkv, const float *p, /* [nr, Bcp] */
                   const float *vp, int64_t ldv, int64_t ncols, int64_t Bcp,
                   float *ot, /* [nr, Dvp] */
                   int64_t Dvp, int init, const float *alpha, /* [nr] */
                   float *fo, int64_t ldfo, const float *osc /* [nr] */) {
    const int64_t chunk = (int64_t)NV_PV * VW;
    for (int64_t c0 = 0; c0 < ncols; c0 += chunk) {
        int nv = (int)((ncols - c0 < chunk ? ncols - c0 : chunk) / VW);
        for (int64_t r = 0, mr; r < nr; r += mr) {
            mr = att_rows(nr - r, MR_PV);
            att_pv_rows((int)mr, nv, init, nkv, p + r * Bcp, Bcp, vp + c0, ldv, ot + r * Dvp + c0,
                        Dvp, alpha + r, fo ? fo + r * ldfo + c0 : NULL, ldfo, osc + r);
        }
    }
}

void ATT_FN(const vitc__attn_plan *pl, vitc__attn_ws *ws, int64_t b, int64_t h, int64_t l0,
            int64_t l1) {
    const vitc__sdpa_desc *d = pl->d;
    const int64_t D = d->D, Dv = d->Dv, S = d->S, Bc = pl->Bc, Bcp = pl->Bcp, Dvp = pl->Dvp;
    const int64_t nr = l1 - l0;
    const float *mbase = d->mask ? d->mask + b * d->m_sb + h * d->m_sh + l0 * d->m_sr : NULL;
    /* [nr, kh] and [nr, kw], or NULL */
    const float *rhbase = d->rel_h ? d->rel_h + b * d->rh_sb + h * d->rh_sh + l0 * d->rh_sr : NULL;
    const float *rwbase = d->rel_h ? d->rel_w + b * d->rw_sb + h * d->rw_sh + l0 * d->rw_sr : NULL;
    if (b + 1 < d->B && l0 == 0 &&
        d->H * (d->L * D + S * (D + Dv)) <= ATT_PREFETCH_MAX_FLOATS) {
        /* (b + 1, h)'s q, k, v rows: see att_prefetch_rows */
        att_prefetch_rows(d->q + (b + 1) * d->q_sb + h * d->q_sh, d->q_sr, d->L, D);
        att_prefetch_rows(d->k + (b + 1) * d->k_sb + h * d->k_sh, d->k_sr, S, D);
        att_prefetch_rows(d->v + (b + 1) * d->v_sb + h * d->v_sh, d->v_sr, S, Dv);
    }
#if ATT_SMALL_DV > 0
    if (Dv <= ATT_SMALL_DV && !d->mask && !d->rel_h && !d->probs) {
        att_small_rows(pl, ws, b, h, l0, l1);
        return;
    }
#endif

    const float *q = d->q + b * d->q_sb + h * d->q_sh + l0 * d->q_sr; /* [nr, D] */
    int q_ready = 0; /* Qs is packed after the first K/V block: its rows arrive meanwhile */

    if (pl->whole_head && !(ws->kv_gen == pl->gen && ws->kv_b == b && ws->kv_h == h)) {
        ws->kv_gen = pl->gen;
        ws->kv_b = b;
        ws->kv_h = h;
        ws->kv_done = 0;
    }
    float *m = ws->mrow, *l = ws->lrow, *alpha = ws->arow;
    /* Rows of whole vectors need no padding: the P V kernel reads the
     * caller's V rows directly. */
    const int v_inplace = Dv % VW == 0;
    const float *vbase = d->v + b * d->v_sb + h * d->v_sh; /* [S, Dv] */
    const int64_t ldv = v_inplace ? d->v_sr : Dvp;
#if ATT_SMALL_DV > 0
    const int small = Dv <= ATT_SMALL_DV && !d->probs;
#else
    const int small = 0;
#endif
    const int vpan = ATT_VPAN(pl) && !small;
    float *obase = d->o + b * d->o_sb + h * d->o_sh + l0 * d->o_sr; /* [nr, Dv] */
    /* Whole vectors of output: the last key block's P V writes it (att_pv_kernel). */
    const int fuse_out = v_inplace && !small;
    for (int64_t r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }

    /* Pass 1 of the probs path only needs m and l; pass 2 (or the one pass
     * otherwise) also accumulates O. */
    const int passes = d->probs ? 2 : 1;
    for (int pass = passes == 2 ? 0 : 1; pass < 2; pass++) {
        for (int64_t kb = 0; kb < pl->nkb; kb++) {
            const int64_t j0 = kb * Bc;
            const int64_t nkv = S - j0 < Bc ? S - j0 : Bc;
            float *kt, *vp;
            if (pl->whole_head) {
                kt = ws->kt + j0 * D;
                vp = v_inplace ? NULL : ws->vp + j0 * Dvp;
                if (small) vp = ws->vp + j0;
                if (vpan) vp = ws->vp + j0 * ATT_PW;
                if (kb >= ws->kv_done) { /* this and the head's later query rows come next */
                    att_pack_kv(d, Dvp, b, h, j0, nkv, kt, small || vpan ? NULL : vp, l0, d->L);
                    if (vpan) att_pack_vpan(d, b, h, j0, nkv, vp, pl->kv_cols);
#if ATT_SMALL_DV > 0
                    if (small) att_pack_vt(d, b, h, j0, nkv, vp, pl->kv_cols);
#endif
                    ws->kv_done = kb + 1;
                }
            } else {
                kt = ws->kt;
                vp = v_inplace && !small ? NULL : ws->vp;
                att_pack_kv(d, Dvp, b, h, j0, nkv, kt, small ? NULL : vp, l0, l1);
#if ATT_SMALL_DV > 0
                if (small) att_pack_vt(d, b, h, j0, nkv, vp, pl->kv_cols);
#endif
            }
            const float *vsrc = v_inplace ? vbase + j0 * d->v_sr : vp; /* [nkv, ldv] */
            if (!q_ready) {
                const VT qs = v_set1(pl->qscale);
                for (int64_t r = 0; r < nr; r++) {
                    const float *src = q + r * d->q_sr;
                    float *dst = ws->qp + r * D;
                    int64_t c = 0;
                    for (; c + VW <= D; c += VW) v_storeu(dst + c, v_mul(v_loadu(src + c), qs));
                    if (c < D) v_storeu_n(dst + c, v_mul(v_loadu_n(src + c, D - c), qs), D - c);
                }
                /* the output rows, written at the end: asked for now, for writing */
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t c = 0; c < Dv; c += 16) __builtin_prefetch(obase + r * d->o_sr + c, 1, 3);
                q_ready = 1;
            }
            /* A group of rows at a time from scores to P V, so that their
             * S tile stays in L1 from the S kernel through the softmax to
             * the P V kernel (all Br rows' tile is about L1's size, and
             * the exps then waited on L2). */
            const int last = kb == pl->nkb - 1;
            for (int64_t g0 = 0; g0 < nr; g0 += ATT_RG) {
                const int64_t ng = nr - g0 < ATT_RG ? nr - g0 : ATT_RG;
                float *st = ws->st; /* [ng, Bcp]: the same lines for every group */
                /* Every row's max first, then the exps: a row's exps then
                 * wait on no reduction, so consecutive rows overlap. With
                 * a mask it is added first, in a pass of its own. */
                VT rmax[ATT_RG];
                att_scores(ws->qp + g0 * D, D, ng, kt, nkv, st, Bcp, mbase || rhbase ? NULL : rmax);
                if (mbase || rhbase) {
                    for (int64_t i = 0; i < ng; i++) {
                        float *srow = st + i * Bcp;
                        if (rhbase)
                            att_rel_add(srow, rhbase + (g0 + i) * d->rh_sr,
                                        rwbase + (g0 + i) * d->rw_sr, d->kw, j0, nkv);
                        alpha[g0 + i] = mbase ? att_mask_max(srow, mbase + (g0 + i) * d->m_sr + j0, nkv)
                                              : att_row_max(srow, nkv);
                    }
                } else {
                    for (int64_t i = 0; i < ng; i++) alpha[g0 + i] = v_hmax(rmax[i]);
                }
                for (int64_t i = 0; i < ng; i++) {
                    const int64_t r = g0 + i;
                    float *srow = st + i * Bcp;
                    float bm = alpha[r];
                    if (pass == 0 || !d->probs) {
                        float mn = bm > m[r] ? bm : m[r];
                        /* All -inf so far: subtract 0 so exp2 gives 0, not NaN. */
                        float mu = mn == -INFINITY ? 0.0f : mn;
                        float a = s_exp2(m[r] - mu);
                        float sum;
#if ATT_SMALL_DV > 0
                        if (small)
                            sum = att_row_small(Dv, srow, nkv, mu, vp, pl->kv_cols, ws->ot + r * Dvp,
                                                a, kb == 0);
                        else
#endif
                            sum = att_exp_sum(srow, nkv, mu, pass == 1);
                        l[r] = l[r] * a + sum;
                        m[r] = mn;
                        alpha[r] = a;
                    } else {
                        /* Normalised probabilities; -inf max gives NaN, as torch. */
                        float inv = 1.0f / l[r];
                        float *prow = d->probs + b * d->p_sb + h * d->p_sh + (l0 + r) * d->p_sr + j0;
                        VT vm = v_set1(m[r]), vi = v_set1(inv);
                        int64_t j = 0;
                        for (; j + VW <= nkv; j += VW) {
                            VT e = v_mul(v_exp2(v_sub(v_load(srow + j), vm)), vi);
                            v_store(srow + j, e);
                            v_storeu(prow + j, e);
                        }
                        if (j < nkv) {
                            VT e = v_mul(v_exp2(v_sub(v_load(srow + j), vm)), vi);
                            v_store(srow + j, e);
                            v_storeu_n(prow + j, e, nkv - j);
                        }
                        alpha[r] = 1.0f;
                    }
                    if (fuse_out && last)
                        ws->orow[r] = m[r] == -INFINITY ? (d->probs ? NAN : 0.0f) : d->probs ? 1.0f : 1.0f / l[r];
                }
                if (pass == 1 && vpan)
                    att_pv_pan(ng, nkv, st, vp, pl->kv_cols, Dv, Bcp, ws->ot + g0 * Dvp, Dvp, kb == 0,
                               alpha + g0, fuse_out && last ? obase + g0 * d->o_sr : NULL, d->o_sr,
                               ws->orow + g0);
                else if (pass == 1 && !small)
                    att_pv(ng, nkv, st, vsrc, ldv, v_inplace ? Dv : Dvp, Bcp, ws->ot + g0 * Dvp, Dvp,
                           kb == 0, alpha + g0, fuse_out && last ? obase + g0 * d->o_sr : NULL,
                           d->o_sr, ws->orow + g0);
            }
        }
    }

    if (d->lse) att_store_lse(d->lse + b * d->lse_sb + h * d->lse_sh + l0, m, l, nr);
    if (fuse_out) return;
    float *o = obase;
    for (int64_t r = 0; r < nr; r++) {
        float inv = d->probs ? 1.0f : 1.0f / l[r];
        /* torch 2.x: a row with no allowed key gives 0 (its SDPA), NaN when
         * the weights are returned (softmax over -inf) */
        if (m[r] == -INFINITY) inv = d->probs ? NAN : 0.0f;
        VT vi = v_set1(inv);
        const float *src = ws->ot + r * Dvp;
        float *dst = o + r * d->o_sr;
        int64_t c = 0;
        for (; c + VW <= Dv; c += VW) v_storeu(dst + c, v_mul(v_load(src + c), vi));
        if (c < Dv) v_storeu_n(dst + c, v_mul(v_load(src + c), vi), Dv - c);
    }
}

#undef NR
#undef ATT_RG
#undef ATT_VPAN
