/*
 * attention_bwd_tmpl.h — the fused attention backward (FlashAttention-2's
 * algorithm), written once over the vector vocabulary of vmath_*.h and
 * instantiated next to the forward (attention_{generic,avx2,avx512}.c). The
 * including file defines MR_S, MR_PV, NV_PV (as for attention_tmpl.h) and
 * ATB_FN, the name of the vitc__attn_bwd_fn it produces.
 *
 * With S = scale q k^T + mask and P = softmax(S) (all natural log):
 *   D_i = rowsum(dO o O),  dV = P^T dO,  dP = dO V^T,  dS = P o (dP - D),
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * P is recomputed per tile from the forward's log-sum-exp, P = 2^(S2 - lse2)
 * with S2 = S log2(e) (q is packed times scale log2(e), as in the forward).
 *
 * A task packs its query rows once (Q^T, dO^T for the tile products, Q and
 * dO rows for the dK and dV products), then walks key blocks of Bc; for each
 * it sweeps the query rows in blocks of Br:
 *   P^T  = 2^(K Qs^T + mask - lse2)          [Bc, Br]   (vectors over query rows,
 *   dS^T = P^T o (V dO^T - D)                [Bc, Br]    so the softmax needs no
 *   dV  += P^T dO,  dK += dS^T Q             [Bc, Dv], [Bc, D]   horizontal op)
 *   dQ  += dS K                               [Br, D]
 * Five products of 2 Br Bc d flops each. Every sum has a fixed order (keys
 * ascending for dQ, query rows ascending for dK and dV), so the result does
 * not depend on how tasks are spread over threads. Extra memory is O(L d)
 * per thread; no L x S buffer exists.
 */

#include "attention_common_tmpl.h"

#define BRG ATT_PW /* query rows per tile microkernel: two vectors */
/* The rows of D and Dv values (Q, dO, K, dQ, dK, dV) padded to whole
 * vectors of this path, not to the plan's 16 that sizes the scratch: a
 * head of 24 (a small ViT's) then does 24 columns of work on AVX2, not 32. */
#define ATB_VPAD(n) (((n) + VW - 1) / VW * VW)

/* What the tile microkernel does with its dot products before storing. */
enum { ATB_RAW = 0, ATB_P = 1, ATB_DS = 2 };

/* out[j][0:BRG] = epi(sum_c a[j][c] bt[c][0:BRG]) for j < mk, where epi is
 * nothing (ATB_RAW), 2^(x - rv) (ATB_P: rv = lse2) or pt[j] o (x - rv)
 * (ATB_DS: rv = D, pt = P^T). a is read in place (K or V rows, any stride). */
static inline __attribute__((always_inline)) void atb_t_kernel(int mk, int epi, int64_t K,
                                                               const float *a, /* [mk, lda] */
                                                               int64_t lda,
                                                               const float *bt, /* [K, ldb] */
                                                               int64_t ldb,
                                                               const float *rv, /* [BRG] */
                                                               const float *pt, /* [mk, ldo] */
                                                               float *out, /* [mk, ldo] */
                                                               int64_t ldo) {
    VT a0[MR_S], a1[MR_S];
    att_tile2(mk, 0, K, a, lda, bt, ldb, a0, a1);
    VT r0 = v_zero(), r1 = v_zero();
    if (epi != ATB_RAW) r0 = v_load(rv), r1 = v_load(rv + VW);
    ATT_UNROLL
    for (int r = 0; r < MR_S; r++)
        if (r < mk) {
            if (epi == ATB_P) {
                a0[r] = v_exp2(v_sub(a0[r], r0));
                a1[r] = v_exp2(v_sub(a1[r], r1));
            } else if (epi == ATB_DS) {
                a0[r] = v_mul(v_load(pt + r * ldo), v_sub(a0[r], r0));
                a1[r] = v_mul(v_load(pt + r * ldo + VW), v_sub(a1[r], r1));
            }
            v_store(out + r * ldo, a0[r]);
            v_store(out + r * ldo + VW, a1[r]);
        }
}

static void atb_t_rows(int mk, int epi, int64_t K, const float *a, int64_t lda, const float *bt,
                       int64_t ldb, const float *rv, const float *pt, float *out, int64_t ldo) {
#define ATB_T_EPI(n)                                                            \
    case n:                                                                     \
        if (epi == ATB_P) atb_t_kernel(n, ATB_P, K, a, lda, bt, ldb, rv, pt, out, ldo);      \
        else if (epi == ATB_DS) atb_t_kernel(n, ATB_DS, K, a, lda, bt, ldb, rv, pt, out, ldo); \
        else atb_t_kernel(n, ATB_RAW, K, a, lda, bt, ldb, rv, pt, out, ldo);  \
        break;
    switch (mk) {
        ATT_MRS_CASES(ATB_T_EPI)
    default: break;
    }
#undef ATB_T_EPI
}

/* A [nk, ld] tile over nk keys and nrp (a multiple of BRG) query rows; bt
 * holds the rows' BRG-wide panels, [nrp / BRG][K][BRG]. */
static void atb_tile(int epi, int64_t nk, int64_t nrp, int64_t K, const float *a, int64_t lda,
                     const float *bt, const float *rv, const float *pt, float *out, int64_t ld) {
    for (int64_t j = 0, mk; j < nk; j += mk) {
        mk = att_rows(nk - j, MR_S);
        for (int64_t g = 0; g < nrp; g += BRG)
            atb_t_rows((int)mk, epi, K, a + j * lda, lda, bt + g * K, BRG, rv + g,
                       pt ? pt + j * ld + g : NULL, out + j * ld + g, ld);
    }
}

/* c[r][0:nv VW] += sum_{k < nk} a[r ars + k aks] bm[k][0:nv VW] for r < mr:
 * the products whose output rows are keys (dV, dK: a = P^T or dS^T) or
 * query rows (dQ: a = dS read through dS^T, ars = 1). */
static inline __attribute__((always_inline)) void atb_mm_kernel(int mr, int nv, int64_t nk,
                                                                const float *a, int64_t ars,
                                                                int64_t aks,
                                                                const float *bm, /* [nk, ldb] */
                                                                int64_t ldb,
                                                                float *c, /* [mr, ldc] */
                                                                int64_t ldc) {
    VT acc[MR_PV][NV_PV];
    ATT_UNROLL
    for (int r = 0; r < MR_PV; r++)
        if (r < mr) {
            ATT_UNROLL
            for (int x = 0; x < NV_PV; x++)
                if (x < nv) acc[r][x] = v_load(c + r * ldc + x * VW);
        }
    att_tile_rv(mr, nv, nk, a, ars, aks, bm, ldb, acc);
    ATT_UNROLL
    for (int r = 0; r < MR_PV; r++)
        if (r < mr) {
            ATT_UNROLL
            for (int x = 0; x < NV_PV; x++)
                if (x < nv) v_store(c + r * ldc + x * VW, acc[r][x]);
        }
}

static void atb_mm_rows(int mr, int nv, int64_t nk, const float *a, int64_t ars, int64_t aks,
                        const float *bm, int64_t ldb, float *c, int64_t ldc) {
#define ATB_MM_CALL(m, n) atb_mm_kernel(m, n, nk, a, ars, aks, bm, ldb, c, ldc)
    ATT_MR_NV_SWITCH(ATB_MM_CALL)
#undef ATB_MM_CALL
}

/* c[0:m][0:ncols] += A[m, nk] bm[nk, ncols]; ncols a multiple of VW. */
static void atb_mm(int64_t m, int64_t ncols, int64_t nk, const float *a, int64_t ars, int64_t aks,
                   const float *bm, int64_t ldb, float *c, int64_t ldc) {
    const int64_t chunk = (int64_t)NV_PV * VW;
    for (int64_t c0 = 0; c0 < ncols; c0 += chunk) {
        int nv = (int)((ncols - c0 < chunk ? ncols - c0 : chunk) / VW);
        for (int64_t r = 0, mr; r < m; r += mr) {
            mr = att_rows(m - r, MR_PV);
            atb_mm_rows((int)mr, nv, nk, a + r * ars, ars, aks, bm + c0, ldb, c + r * ldc + c0,
                        ldc);
        }
    }
}

/* sum_c a[c] b[c], in VW lanes. */
static float atb_dot(const float *a, const float *b, int64_t n) {
    VT acc = v_zero();
    int64_t c = 0;
    for (; c + VW <= n; c += VW) acc = v_fma(v_loadu(a + c), v_loadu(b + c), acc);
    if (c < n) acc = v_fma(v_loadu_n(a + c, n - c), v_loadu_n(b + c, n - c), acc);
    return v_hsum(acc);
}

/* dst[0:n] = src[0:n] * s. */
static void atb_scale_row(float *dst, const float *src, int64_t n, float s) {
    const VT vs = v_set1(s);
    int64_t c = 0;
    for (; c + VW <= n; c += VW) v_storeu(dst + c, v_mul(v_loadu(src + c), vs));
    if (c < n) v_storeu_n(dst + c, v_mul(v_loadu_n(src + c, n - c), vs), n - c);
}

/* Query rows [l0, l1) of head (b, h) into the task's packed forms, with
 * D_i = rowsum(dO o O) and lse2; padding rows get what makes their P 0. */
static void atb_pack_rows(const vitc__attn_bwd_plan *pl, vitc__attn_bwd_ws *w, int64_t b,
                          int64_t h, int64_t l0, int64_t l1) {
    const vitc__sdpa_bwd_desc *bd = pl->d;
    const vitc__sdpa_desc *d = &bd->f;
    const int64_t D = d->D, Dv = d->Dv, Dp = ATB_VPAD(D), Dvp = ATB_VPAD(Dv), Lp = w->Lp;
    const int64_t nr = l1 - l0;
    const float *q = d->q + b * d->q_sb + h * d->q_sh + l0 * d->q_sr;          /* [nr, D] */
    const float *o = d->o + b * d->o_sb + h * d->o_sh + l0 * d->o_sr;          /* [nr, Dv] */
    const float *dO = bd->dout + b * bd->do_sb + h * bd->do_sh + l0 * bd->do_sr; /* [nr, Dv] */
    const float *lse = d->lse + b * d->lse_sb + h * d->lse_sh + l0;            /* [nr] */
    att_pack_panels(q, d->q_sr, nr, D, Lp, w->qt);
    const VT qs = v_set1(pl->qscale);
    for (int64_t i = 0; i < Lp * D; i += VW) v_store(w->qt + i, v_mul(v_load(w->qt + i), qs));
    att_pack_panels(dO, bd->do_sr, nr, Dv, Lp, w->dot);
    for (int64_t r = 0; r < Lp; r++) {
        float *qr = w->qr + r * Dp, *dor = w->dor + r * Dvp; /* [Dp], [Dvp] */
        if (r < nr) {
            const float *ds = dO + r * bd->do_sr, *os = o + r * d->o_sr;
            att_copy_pad(qr, q + r * d->q_sr, D, Dp);
            att_copy_pad(dor, ds, Dv, Dvp);
            w->dd[r] = atb_dot(ds, os, Dv);
            /* no allowed key (lse -inf): the row's output is a constant 0
             * (torch 2.x), +inf makes every p of it 0 */
            w->lse2[r] = lse[r] == -INFINITY ? INFINITY : lse[r] * att_log2e;
        } else {
            memset(qr, 0, (size_t)Dp * sizeof(float));
            memset(dor, 0, (size_t)Dvp * sizeof(float));
            w->dd[r] = 0.0f;
            w->lse2[r] = INFINITY;
        }
    }
}

void ATB_FN(const vitc__attn_bwd_plan *pl, float *scratch, int64_t b, int64_t h, int64_t l0,
            int64_t l1, int64_t s0, int64_t s1, int what) {
    const vitc__sdpa_bwd_desc *bd = pl->d;
    const vitc__sdpa_desc *d = &bd->f;
    const int64_t D = d->D, Dv = d->Dv, Dp = ATB_VPAD(D), Dvp = ATB_VPAD(Dv), Bc = pl->Bc;
    const int64_t Br = pl->Br;
    const int64_t nr = l1 - l0, ldt = pl->ldt;
    vitc__attn_bwd_ws w;
    vitc__attn_bwd_carve(pl, nr, scratch, &w);
    const int64_t Lp = w.Lp;
    if (b + 1 < d->B &&
        d->H * (d->L * (D + 2 * Dv) + d->S * (D + Dv)) <= ATT_PREFETCH_MAX_FLOATS) {
        /* q, o, dO rows and k, v rows of (b + 1, h): see att_prefetch_rows */
        const int64_t nb = b + 1;
        att_prefetch_rows(d->q + nb * d->q_sb + h * d->q_sh + l0 * d->q_sr, d->q_sr, nr, D);
        att_prefetch_rows(d->o + nb * d->o_sb + h * d->o_sh + l0 * d->o_sr, d->o_sr, nr, Dv);
        att_prefetch_rows(bd->dout + nb * bd->do_sb + h * bd->do_sh + l0 * bd->do_sr, bd->do_sr,
                          nr, Dv);
        att_prefetch_rows(d->k + nb * d->k_sb + h * d->k_sh + s0 * d->k_sr, d->k_sr, s1 - s0, D);
        att_prefetch_rows(d->v + nb * d->v_sb + h * d->v_sh + s0 * d->v_sr, d->v_sr, s1 - s0, Dv);
    }
    atb_pack_rows(pl, &w, b, h, l0, l1);
    const int do_kv = what & VITC_ATTN_BWD_DKV, do_q = what & VITC_ATTN_BWD_DQ;
    if (do_q) memset(w.dq, 0, (size_t)(Lp * Dp) * sizeof(float));

    const float *k = d->k + b * d->k_sb + h * d->k_sh; /* [S, D] */
    const float *v = d->v + b * d->v_sb + h * d->v_sh; /* [S, Dv] */
    const float *mbase = d->mask ? d->mask + b * d->m_sb + h * d->m_sh + l0 * d->m_sr : NULL;
    /* [nr, kh], [nr, kw] or NULL */
    const float *rhbase = d->rel_h ? d->rel_h + b * d->rh_sb + h * d->rh_sh + l0 * d->rh_sr : NULL;
    const float *rwbase = d->rel_h ? d->rel_w + b * d->rw_sb + h * d->rw_sh + l0 * d->rw_sr : NULL;
    /* The bias gradients sum over all keys of a row, which only the query
     * tasks (do_q) walk: [nr, kh], [nr, kw] or NULL. */
    const vitc__sdpa_rel_grad *rg = pl->rg;
    float *drh = rhbase && do_q && rg && rg->drel_h
                     ? rg->drel_h + b * rg->drh_sb + h * rg->drh_sh + l0 * rg->drh_sr : NULL;
    float *drw = rhbase && do_q && rg && rg->drel_w
                     ? rg->drel_w + b * rg->drw_sb + h * rg->drw_sh + l0 * rg->drw_sr : NULL;
    for (int64_t r = 0; r < nr; r++) {
        if (drh) memset(drh + r * rg->drh_sr, 0, (size_t)d->kh * sizeof(float));
        if (drw) memset(drw + r * rg->drw_sr, 0, (size_t)d->kw * sizeof(float));
    }
    const float l2e = att_log2e;
    for (int64_t j0 = s0; j0 < s1; j0 += Bc) {
        const int64_t nk = s1 - j0 < Bc ? s1 - j0 : Bc;
        if (do_q)
            for (int64_t j = 0; j < nk; j++) att_copy_pad(w.kr + j * Dp, k + (j0 + j) * d->k_sr, D, Dp);
        if (do_kv) {
            memset(w.dk, 0, (size_t)(nk * Dp) * sizeof(float));
            memset(w.dv, 0, (size_t)(nk * Dvp) * sizeof(float));
        }
        for (int64_t i0 = 0; i0 < nr; i0 += Br) {
            const int64_t nb = nr - i0 < Br ? nr - i0 : Br;
            const int64_t nbp = (nb + BRG - 1) / BRG * BRG;
            /* P^T: with a mask, the raw scores first, then the mask (read
             * transposed, a scalar pass) and 2^(s - lse2). */
            if (mbase || rhbase) {
                atb_tile(ATB_RAW, nk, nbp, D, k + j0 * d->k_sr, d->k_sr, w.qt + i0 * D, NULL, NULL,
                         w.pt, ldt);
                for (int64_t j = 0; j < nk; j++) {
                    float *row = w.pt + j * ldt;
                    if (mbase) {
                        const float *mc = mbase + i0 * d->m_sr + j0 + j; /* column j0+j of the mask */
                        for (int64_t r = 0; r < nb; r++) row[r] += mc[r * d->m_sr] * l2e;
                    }
                    if (rhbase) { /* columns (j0+j) / kw of rel_h and (j0+j) % kw of rel_w */
                        const float *hc = rhbase + i0 * d->rh_sr + (j0 + j) / d->kw;
                        const float *wc = rwbase + i0 * d->rw_sr + (j0 + j) % d->kw;
                        for (int64_t r = 0; r < nb; r++)
                            row[r] += (hc[r * d->rh_sr] + wc[r * d->rw_sr]) * l2e;
                    }
                    for (int64_t r = 0; r < nbp; r += VW)
                        v_store(row + r, v_exp2(v_sub(v_load(row + r), v_loadu(w.lse2 + i0 + r))));
                }
            } else {
                atb_tile(ATB_P, nk, nbp, D, k + j0 * d->k_sr, d->k_sr, w.qt + i0 * D, w.lse2 + i0,
                         NULL, w.pt, ldt);
            }
            /* dS^T = P^T o (V dO^T - D) */
            atb_tile(ATB_DS, nk, nbp, Dv, v + j0 * d->v_sr, d->v_sr, w.dot + i0 * Dv, w.dd + i0,
                     w.pt, w.dst, ldt);
            /* d rel_h[i][a] += dS[i][j] for key j on grid row a, d rel_w by
             * column; keys ascending, so the sums have a fixed order. A
             * scalar scatter: O(Bc Br) adds next to the five O(Bc Br d)
             * products. */
            if (drh || drw)
                for (int64_t j = 0; j < nk; j++) {
                    const float *row = w.dst + j * ldt;
                    if (drh) {
                        float *hc = drh + i0 * rg->drh_sr + (j0 + j) / d->kw;
                        for (int64_t r = 0; r < nb; r++) hc[r * rg->drh_sr] += row[r];
                    }
                    if (drw) {
                        float *wc = drw + i0 * rg->drw_sr + (j0 + j) % d->kw;
                        for (int64_t r = 0; r < nb; r++) wc[r * rg->drw_sr] += row[r];
                    }
                }
            if (do_kv) {
                atb_mm(nk, Dvp, nb, w.pt, ldt, 1, w.dor + i0 * Dvp, Dvp, w.dv, Dvp); /* dV += P^T dO */
                atb_mm(nk, Dp, nb, w.dst, ldt, 1, w.qr + i0 * Dp, Dp, w.dk, Dp);    /* dK += dS^T Q */
            }
            if (do_q) atb_mm(nb, Dp, nk, w.dst, 1, ldt, w.kr, Dp, w.dq + i0 * Dp, Dp); /* dQ += dS K */
        }
        if (do_kv) {
            float *dk = bd->dk + b * bd->dk_sb + h * bd->dk_sh + j0 * bd->dk_sr; /* [nk, D] */
            float *dv = bd->dv + b * bd->dv_sb + h * bd->dv_sh + j0 * bd->dv_sr; /* [nk, Dv] */
            for (int64_t j = 0; j < nk; j++) {
                atb_scale_row(dk + j * bd->dk_sr, w.dk + j * Dp, D, d->scale);
                att_copy(dv + j * bd->dv_sr, w.dv + j * Dvp, Dv);
            }
        }
    }
    if (do_q) {
        float *dq = bd->dq + b * bd->dq_sb + h * bd->dq_sh + l0 * bd->dq_sr; /* [nr, D] */
        for (int64_t r = 0; r < nr; r++) atb_scale_row(dq + r * bd->dq_sr, w.dq + r * Dp, D, d->scale);
    }
}

#undef BRG
#undef ATB_VPAD
