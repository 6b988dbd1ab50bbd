/*
 * mha.c — torch.nn.MultiheadAttention's forward (torch 1.13's
 * multi_head_attention_forward: masks, key padding, need_weights), and the
 * free functions scaled_dot_product_attention (torch 2.x semantics) and
 * softmax with temperature. The attention itself is vitc__sdpa, reading the
 * projected q, k, v in place through strides.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"


static const char *shp(char *buf, size_t cap, const vitc_tensor_view *t) {
    return vitc__shape_str(buf, cap, t->ndim < 0 || t->ndim > 8 ? 0 : t->ndim, t->shape);
}

/* ---- MultiheadAttention -------------------------------------------- */

/* Sizes of one call, checked as torch's _mha_shape_check does. Token (b, l)
 * of a [L, B, E] or [B, L, E] tensor is row b*sb + l*sl. */
typedef struct mha_dims {
    int batched;
    int64_t B, L, S, E, H;
    int64_t S0, nextra;               /* keys given; S = S0 + bias_k row + zero row */
    int64_t q_sb, q_sl, kv_sb, kv_sl; /* in rows; kv for the S keys after projection */
} mha_dims;

/* 1 when q, k and v each hold at most 2^50 elements: the product does not
 * overflow, and the buffers derived from them stay allocatable sizes. */
static int qkv_numel_ok(const vitc_tensor_view *q, const vitc_tensor_view *k,
                        const vitc_tensor_view *v) {
    const vitc_tensor_view *t[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        int ok;
        size_t n = vitc__numel(t[i]->ndim, t[i]->shape, &ok);
        if (!ok || n > ((size_t)1 << 50))
            return 0;
    }
    return 1;
}

static vitc_status mha_dims_of(const vitc_layer *l, const vitc_mha_args *a, mha_dims *d) {
    const vitc_layer_config *c = &l->cfg;
    const vitc_tensor_view *q = &a->query, *k = &a->key, *v = &a->value;
    char s1[96], s2[96], s3[96];
    int64_t E = c->embed_dim, kd = c->kdim ? c->kdim : E, vd = c->vdim ? c->vdim : E;
    if (!q->data || !k->data || !v->data)
        return vitc__err(VITC_ERR_INVALID_ARG, "MultiheadAttention: query, key or value is NULL");
    int nd = q->ndim;
    if ((nd != 2 && nd != 3) || k->ndim != nd || v->ndim != nd)
        return vitc__err(VITC_ERR_SHAPE,
                         "MultiheadAttention: query, key and value must all be 3-D (batched) or "
                         "2-D (unbatched); got query %s, key %s, value %s",
                         shp(s1, sizeof s1, q), shp(s2, sizeof s2, k), shp(s3, sizeof s3, v));
    for (int i = 0; i < nd; i++)
        if (q->shape[i] < 1 || k->shape[i] < 1 || v->shape[i] < 1 || q->shape[i] > ((int64_t)1 << 40) ||
            k->shape[i] > ((int64_t)1 << 40) || v->shape[i] > ((int64_t)1 << 40))
            return vitc__err(VITC_ERR_SHAPE,
                             "MultiheadAttention: every dimension must be >= 1; got query %s, "
                             "key %s, value %s",
                             shp(s1, sizeof s1, q), shp(s2, sizeof s2, k), shp(s3, sizeof s3, v));
    if (!qkv_numel_ok(q, k, v))
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: query, key or value too large");
    d->batched = nd == 3;
    d->E = E;
    d->H = c->num_heads;
    int bf = d->batched && c->batch_first;
    int64_t qb = d->batched ? q->shape[bf ? 0 : 1] : 1, ql = q->shape[bf ? 1 : 0];
    int64_t kb = d->batched ? k->shape[bf ? 0 : 1] : 1, kl = k->shape[bf ? 1 : 0];
    int64_t vb = d->batched ? v->shape[bf ? 0 : 1] : 1, vl = v->shape[bf ? 1 : 0];
    if (q->shape[nd - 1] != E || k->shape[nd - 1] != kd || v->shape[nd - 1] != vd || kb != qb ||
        vb != qb || kl != vl)
        return vitc__err(VITC_ERR_SHAPE,
                         "MultiheadAttention(embed_dim=%lld, kdim=%lld, vdim=%lld, batch_first=%d): "
                         "query %s, key %s, value %s do not fit (expected %s)",
                         (long long)E, (long long)kd, (long long)vd, c->batch_first,
                         shp(s1, sizeof s1, q), shp(s2, sizeof s2, k), shp(s3, sizeof s3, v),
                         !d->batched ? "[L, E], [S, kdim], [S, vdim]"
                         : bf        ? "[B, L, E], [B, S, kdim], [B, S, vdim]"
                                     : "[L, B, E], [S, B, kdim], [S, B, vdim]");
    d->B = qb;
    d->L = ql;
    d->S0 = kl;
    d->nextra = (c->add_bias_kv != 0) + (c->add_zero_attn != 0);
    d->S = kl + d->nextra;
    /* The attention weights [B, H, L, S] must be addressable. */
    int64_t bhls;
    if (__builtin_mul_overflow(qb, (int64_t)c->num_heads, &bhls) ||
        __builtin_mul_overflow(bhls, ql, &bhls) || __builtin_mul_overflow(bhls, d->S, &bhls) ||
        bhls > ((int64_t)1 << 56))
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: B*heads*L*S overflows");
    d->q_sb = bf ? ql : 1;
    d->q_sl = bf ? 1 : qb;
    d->kv_sb = bf ? d->S : 1;
    d->kv_sl = bf ? 1 : qb;
    return VITC_OK;
}

/* The mask's shape checks, as torch's (key_padding_mask [B, S] or [S];
 * attn_mask [L, S] or [B*heads, L, S]). */
static vitc_status mha_check_masks(const vitc_mha_args *a, const mha_dims *d) {
    char s1[96];
    if (a->key_padding_mask.data) {
        const vitc_tensor_view *m = &a->key_padding_mask;
        int ok = d->batched ? m->ndim == 2 && m->shape[0] == d->B && m->shape[1] == d->S0
                            : m->ndim == 1 && m->shape[0] == d->S0;
        if (a->key_padding_mask_type != VITC_MASK_BOOL && a->key_padding_mask_type != VITC_MASK_FLOAT)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "MultiheadAttention: key_padding_mask type must be bool or float");
        if (!ok)
            return vitc__err(VITC_ERR_SHAPE,
                             "MultiheadAttention: key_padding_mask has shape %s, expected [%lld, %lld]",
                             shp(s1, sizeof s1, m), (long long)d->B, (long long)d->S0);
    }
    if (a->attn_mask.data) {
        const vitc_tensor_view *m = &a->attn_mask;
        if (a->attn_mask_type != VITC_MASK_BOOL && a->attn_mask_type != VITC_MASK_FLOAT)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "MultiheadAttention: attn_mask type must be bool or float");
        if (m->ndim == 2) {
            if (m->shape[0] != d->L || m->shape[1] != d->S0)
                return vitc__err(VITC_ERR_SHAPE,
                                 "MultiheadAttention: the 2-D attn_mask has shape %s, expected [%lld, %lld]",
                                 shp(s1, sizeof s1, m), (long long)d->L, (long long)d->S0);
        } else if (m->ndim == 3) {
            if (m->shape[0] != d->B * d->H || m->shape[1] != d->L || m->shape[2] != d->S0)
                return vitc__err(VITC_ERR_SHAPE,
                                 "MultiheadAttention: the 3-D attn_mask has shape %s, expected [%lld, %lld, %lld]",
                                 shp(s1, sizeof s1, m), (long long)(d->B * d->H), (long long)d->L,
                                 (long long)d->S0);
        } else {
            return vitc__err(VITC_ERR_SHAPE,
                             "MultiheadAttention: attn_mask must be 2-D or 3-D, got shape %s",
                             shp(s1, sizeof s1, m));
        }
    }
    return VITC_OK;
}

vitc_status vitc__mha_check_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                  int *out_ndim, int64_t out_shape[8]) {
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    if (ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_SHAPE, "MultiheadAttention: input must be 2-D or 3-D, got %d-D", ndim);
    a.query.data = shape; /* only the shapes are read */
    a.query.ndim = ndim;
    memcpy(a.query.shape, shape, (size_t)ndim * sizeof *shape);
    a.key = a.value = a.query;
    if (l->cfg.kdim && l->cfg.kdim != l->cfg.embed_dim)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention with kdim %d != embed_dim %d has no self-attention "
                         "form; use vitc_mha_forward", l->cfg.kdim, l->cfg.embed_dim);
    if (l->cfg.vdim && l->cfg.vdim != l->cfg.embed_dim)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention with vdim %d != embed_dim %d has no self-attention "
                         "form; use vitc_mha_forward", l->cfg.vdim, l->cfg.embed_dim);
    mha_dims d;
    VITC_TRY(mha_dims_of(l, &a, &d));
    *out_ndim = ndim;
    memcpy(out_shape, shape, (size_t)ndim * sizeof *shape);
    return VITC_OK;
}

vitc_status vitc_mha_output_shapes(const vitc_layer *l, const vitc_mha_args *a, int *out_ndim,
                                   int64_t out_shape[8], int *w_ndim, int64_t w_shape[8]) {
    if (!l || !a || !out_ndim || !out_shape)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_output_shapes: NULL argument");
    if (l->cfg.kind != VITC_MULTIHEAD_ATTENTION)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_output_shapes: not a MultiheadAttention layer");
    mha_dims d;
    VITC_TRY(mha_dims_of(l, a, &d));
    VITC_TRY(mha_check_masks(a, &d));
    *out_ndim = a->query.ndim;
    memcpy(out_shape, a->query.shape, (size_t)a->query.ndim * sizeof(int64_t));
    if (w_ndim && w_shape) {
        int n = 0;
        if (!a->need_weights) {
            *w_ndim = 0;
            return VITC_OK;
        }
        if (d.batched) w_shape[n++] = d.B;
        if (!a->average_attn_weights) w_shape[n++] = d.H;
        w_shape[n++] = d.L;
        w_shape[n++] = d.S;
        *w_ndim = n;
    }
    return VITC_OK;
}

static float mask_val(const void *m, vitc_mask_type t, size_t i) {
    return t == VITC_MASK_BOOL ? (((const uint8_t *)m)[i] ? -INFINITY : 0.0f) : ((const float *)m)[i];
}

/* attn_output_weights.sum(dim=1) / num_heads: each element summed over the
 * heads in torch's order, then divided. One task per (b, query row). */
typedef struct head_mean_ctx {
    float *w;           // [B, L, S]
    const float *probs; // [B, H, L, S]
    int64_t H, L, S;
} head_mean_ctx;

static void head_mean_rows(void *ctx, int64_t r0, int64_t r1, int tid) {
    const head_mean_ctx *t = ctx;
    const int64_t H = t->H, L = t->L, S = t->S;
    (void)tid;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / L, row = r % L;
        float *restrict dst = t->w + r * S;
        for (int64_t j = 0; j < S; j++) dst[j] = 0.0f;
        for (int64_t h = 0; h < H; h++) {
            const float *restrict src = t->probs + ((b * H + h) * L + row) * S;
            for (int64_t j = 0; j < S; j++) dst[j] += src[j];
        }
        for (int64_t j = 0; j < S; j++) dst[j] /= (float)H;
    }
}

vitc_status vitc_mha_forward(vitc_layer *l, const vitc_mha_args *a, float *out, float *weights) {
    if (!l || !a || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: NULL argument");
    if (l->cfg.kind != VITC_MULTIHEAD_ATTENTION)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: not a MultiheadAttention layer");
    l->mrec.valid = 0; /* any forward, failed ones included, replaces the record */
    if (a->need_weights && !weights)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: need_weights set but weights is NULL");
    mha_dims d;
    VITC_TRY(mha_dims_of(l, a, &d));
    VITC_TRY(mha_check_masks(a, &d));
    const vitc__plan *p = &l->plan;
    int64_t B = d.B, L = d.L, S = d.S, S0 = d.S0, E = d.E, H = d.H, hd = E / H;
    int64_t kd = l->cfg.kdim ? l->cfg.kdim : E, vd = l->cfg.vdim ? l->cfg.vdim : E;
    const float *xq = a->query.data, *xk = a->key.data, *xv = a->value.data;
    /* One GEMM for all three when it is self-attention with the packed weight. */
    int self = p->qkv == VITC__QKV_FUSED && xq == xk && xk == xv && L == S && d.nextra == 0;

    /* Scratch: q/k/v (or packed qkv), o, merged mask, head-summed probs. */
    const vitc_tensor_view *am = &a->attn_mask, *kpm = &a->key_padding_mask;
    /* Training keeps its own copy of every mask: backward runs after the
     * caller's arrays may be gone. */
    int merge = kpm->data ||
                (am->data && (a->attn_mask_type == VITC_MASK_BOOL || l->training || d.nextra));
    size_t nq = 0, nkv = 0, no = 0, nmask = 0, nprob = 0;
    int ok = vitc__mul_size((size_t)(L * B), (size_t)(self ? 3 * E : E), &nq) &&
             vitc__mul_size((size_t)(S * B), (size_t)(self ? 0 : 2 * E), &nkv) &&
             vitc__mul_size((size_t)(L * B), (size_t)E, &no);
    /* The merged mask keeps only the dims that vary: [B*H | B | 1, L | 1, S]. */
    int64_t mb = 1, mh = 1, ml = 1;
    if (merge) {
        if (am->data && am->ndim == 3) { mb = B; mh = H; }
        else if (kpm->data) mb = B;
        if (am->data) ml = L;
        ok = ok && vitc__mul_size((size_t)(mb * mh), (size_t)(ml * S), &nmask);
    }
    /* Head-averaged weights go through per-head probabilities a few batch
     * items at a time, so that scratch stays near 16 MB instead of
     * [B, heads, L, S]. */
    int64_t chunk = B, per_b = H * L * S;
    if (a->need_weights && a->average_attn_weights) {
        chunk = ((int64_t)4 << 20) / per_b;
        chunk = chunk < 1 ? 1 : chunk > B ? B : chunk;
        ok = ok && vitc__mul_size((size_t)chunk, (size_t)per_b, &nprob);
    }
    /* Training: copies of the inputs, which the weight gradients read. */
    size_t nxq = 0, nxk = 0, nxv = 0, nlse = 0;
    if (l->training)
        ok = ok && vitc__mul_size((size_t)(B * H), (size_t)L, &nlse) &&
             vitc__mul_size((size_t)(L * B), (size_t)E, &nxq) &&
             vitc__mul_size((size_t)(S0 * B), self ? 0 : (size_t)kd, &nxk) &&
             vitc__mul_size((size_t)(S0 * B), self ? 0 : (size_t)vd, &nxv);
    /* Dropout on the weights (training): the kept mask [B, H, L, S] bytes, and
     * one head's probabilities. */
    int drop = l->training && l->cfg.dropout > 0.0f;
    size_t nkeep = 0, nP = 0;
    if (drop)
        ok = ok && vitc__mul_size((size_t)(B * H), (size_t)(L * S), &nkeep) &&
             vitc__mul_size((size_t)L, (size_t)S, &nP);
    nkeep = (nkeep + 3) / 4;
    size_t total = 0;
    ok = ok && vitc__add_size(total, nkeep, &total) && vitc__add_size(total, nP, &total) &&
         vitc__add_size(total, nq, &total) && vitc__add_size(total, nkv, &total) &&
         vitc__add_size(total, no, &total) &&
         vitc__add_size(total, nmask, &total) && vitc__add_size(total, nprob, &total) &&
         vitc__add_size(total, nxq, &total) && vitc__add_size(total, nxk, &total) &&
         vitc__add_size(total, nxv, &total) && vitc__add_size(total, nlse, &total);
    if (!ok)
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: scratch size overflows");
    VITC_TRY(vitc__buf_reserve(&l->scratch, total));
    float *qb = l->scratch.p;         // [L*B, E] or packed [L*B, 3E]
    float *kb = qb + nq;              // [S*B, E]
    float *vb = kb + nkv / 2;         // [S*B, E]
    float *o = qb + nq + nkv;         // [L*B, E], in query's token order
    float *mask = o + no;             // [mb*mh, ml, S]
    float *probs = mask + nmask;      // [B, H, L, S]
    float *cq = probs + nprob;        // [L*B, E] training copy of query
    float *ck = cq + nxq;             // [S*B, kdim]
    float *cv = ck + nxk;             // [S*B, vdim]
    float *lse = cv + nxv;            // [B, H, L] training: each row's log-sum-exp
    uint8_t *keep = (uint8_t *)(lse + nlse); // [B, H, L, S] dropout's kept weights
    float *P = lse + nlse + nkeep;    // [L, S] dropout: one head's probabilities
    if (l->training) {
        memcpy(cq, xq, nxq * sizeof(float));
        memcpy(ck, xk, nxk * sizeof(float));
        memcpy(cv, xv, nxv * sizeof(float));
    }

    /* In-projection: _in_projection_packed / _in_projection. */
    const float *wq = p->qkv == VITC__QKV_FUSED ? l->w_qkv : l->w_q;
    const float *wk = p->qkv == VITC__QKV_FUSED ? l->w_qkv + E * E : l->w_k;
    const float *wv = p->qkv == VITC__QKV_FUSED ? l->w_qkv + 2 * E * E : l->w_v;
    const float *bq = l->b_qkv, *bk = l->b_qkv ? l->b_qkv + E : NULL, *bv = l->b_qkv ? l->b_qkv + 2 * E : NULL;
    int64_t ldq = E, ldk = E, ldv = E;
    if (self) {
        vitc__linear(qb, 3 * E, xq, E, l->w_qkv, l->b_qkv, NULL, 0, L * B, 3 * E, E);
        kb = qb + E;
        vb = qb + 2 * E;
        ldq = ldk = ldv = 3 * E;
    } else {
        vitc__linear(qb, E, xq, E, wq, bq, NULL, 0, L * B, E, E);
        if (d.nextra && d.kv_sl == 1) {
            /* batch_first: each item's keys make room for its extra rows */
            for (int64_t b = 0; b < B; b++) {
                vitc__linear(kb + b * S * E, E, xk + b * S0 * kd, kd, wk, bk, NULL, 0, S0, E, kd);
                vitc__linear(vb + b * S * E, E, xv + b * S0 * vd, vd, wv, bv, NULL, 0, S0, E, vd);
            }
        } else {
            vitc__linear(kb, E, xk, kd, wk, bk, NULL, 0, S0 * B, E, kd);
            vitc__linear(vb, E, xv, vd, wv, bv, NULL, 0, S0 * B, E, vd);
        }
        /* add_bias_kv, then add_zero_attn: keys S0 and S0 + 1 of every item */
        for (int64_t b = 0; b < B; b++)
            for (int64_t x = 0; x < d.nextra; x++) {
                size_t row = (size_t)(b * d.kv_sb + (S0 + x) * d.kv_sl) * (size_t)E;
                int bias = x == 0 && l->cfg.add_bias_kv;
                for (int64_t e = 0; e < E; e++) {
                    kb[row + e] = bias ? l->bias_k[e] : 0.0f;
                    vb[row + e] = bias ? l->bias_v[e] : 0.0f;
                }
            }
    }

    /* Masks, merged as torch 2.x does: each made float (bool True -> -inf),
     * then added (1.13 or-ed a float key_padding_mask into a bool attn_mask). */
    const float *mp = NULL;
    int64_t m_sb = 0, m_sh = 0, m_sr = 0;
    if (merge) {
        for (int64_t bi = 0; bi < mb; bi++)
            for (int64_t hi = 0; hi < mh; hi++)
                for (int64_t li = 0; li < ml; li++) {
                    float *row = mask + ((bi * mh + hi) * ml + li) * S;
                    for (int64_t j = 0; j < S; j++) {
                        float v = 0.0f;
                        if (j >= S0) { /* the extra keys are never masked (torch pads with 0) */
                            row[j] = 0.0f;
                            continue;
                        }
                        if (am->data) {
                            size_t ai = (size_t)(((am->ndim == 3 ? bi * H + hi : 0) * L + li) * S0 + j);
                            v = mask_val(am->data, a->attn_mask_type, ai);
                        }
                        if (kpm->data)
                            v += mask_val(kpm->data, a->key_padding_mask_type, (size_t)(bi * S0 + j));
                        row[j] = v;
                    }
                }
        mp = mask;
        m_sb = mb > 1 ? mh * ml * S : 0;
        m_sh = mh > 1 ? ml * S : 0;
        m_sr = ml > 1 ? S : 0;
    } else if (am->data) {
        mp = am->data;
        m_sb = am->ndim == 3 ? H * L * S : 0;
        m_sh = am->ndim == 3 ? L * S : 0;
        m_sr = S;
    }

    vitc__sdpa_desc sd = {0};
    sd.B = B; sd.H = H; sd.L = L; sd.S = S; sd.D = hd; sd.Dv = hd;
    sd.q = qb; sd.q_sb = d.q_sb * ldq; sd.q_sh = hd; sd.q_sr = d.q_sl * ldq;
    sd.k = kb; sd.k_sb = d.kv_sb * ldk; sd.k_sh = hd; sd.k_sr = d.kv_sl * ldk;
    sd.v = vb; sd.v_sb = d.kv_sb * ldv; sd.v_sh = hd; sd.v_sr = d.kv_sl * ldv;
    sd.o = o; sd.o_sb = d.q_sb * E; sd.o_sh = hd; sd.o_sr = d.q_sl * E;
    sd.scale = p->scale;
    sd.mask = mp; sd.m_sb = m_sb; sd.m_sh = m_sh; sd.m_sr = m_sr;
    if (l->training) {
        sd.lse = lse; sd.lse_sb = H * L; sd.lse_sh = L;
    }
    if (a->need_weights) {
        sd.probs = a->average_attn_weights ? probs : weights;
        sd.p_sb = H * L * S; sd.p_sh = L * S; sd.p_sr = S;
    }
    if (a->need_weights && a->average_attn_weights) {
        for (int64_t b0 = 0; b0 < B; b0 += chunk) {
            vitc__sdpa_desc part = sd;
            part.B = B - b0 < chunk ? B - b0 : chunk;
            part.q += b0 * sd.q_sb;
            part.k += b0 * sd.k_sb;
            part.v += b0 * sd.v_sb;
            part.o += b0 * sd.o_sb;
            if (part.mask) part.mask += b0 * sd.m_sb;
            if (part.lse) part.lse += b0 * sd.lse_sb;
            if (drop)
                vitc__sdpa_dropout_forward(&part, keep + b0 * per_b, l->cfg.dropout, &l->rng, P);
            else
                VITC_TRY(vitc__sdpa(&part));
            head_mean_ctx hm = {weights + b0 * L * S, probs, H, L, S};
            vitc__parallel_range(part.B * L, head_mean_rows, &hm);
        }
    } else if (drop) {
        vitc__sdpa_dropout_forward(&sd, keep, l->cfg.dropout, &l->rng, P);
    } else {
        VITC_TRY(vitc__sdpa(&sd));
    }
    vitc__linear(out, E, o, E, l->w_o, l->b_o, NULL, 0, L * B, E, E);
    if (l->training) {
        vitc__mha_record *r = &l->mrec;
        r->self = self;
        r->ndim = a->query.ndim;
        memcpy(r->qshape, a->query.shape, 3 * sizeof(int64_t));
        memcpy(r->kshape, a->key.shape, 3 * sizeof(int64_t));
        memcpy(r->vshape, a->value.shape, 3 * sizeof(int64_t));
        r->sd = sd;
        r->sd.probs = NULL;
        r->xq = cq;
        r->xk = self ? cq : ck;
        r->xv = self ? cq : cv;
        r->ldqkv = ldq;
        r->S0 = S0;
        r->kv_sl = d.kv_sl;
        r->keep = drop ? keep : NULL;
        r->valid = 1;
    }
    return VITC_OK;
}

vitc_status vitc_mha_backward(vitc_layer *l, const vitc_tensor_view *dout, float *d_query,
                              float *d_key, float *d_value) {
    if (!l || !dout || !dout->data || !d_query || !d_key || !d_value)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_backward: NULL argument");
    if (l->cfg.kind != VITC_MULTIHEAD_ATTENTION)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_backward: not a MultiheadAttention layer");
    const vitc__mha_record *r = &l->mrec;
    if (!r->valid)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention: backward needs a training-mode forward first (none "
                         "recorded since the last eval-mode or failed forward)");
    int same = dout->ndim == r->ndim;
    for (int i = 0; same && i < r->ndim; i++) same = dout->shape[i] == r->qshape[i];
    if (!same) {
        char s1[96], s2[96];
        return vitc__err(VITC_ERR_SHAPE,
                         "MultiheadAttention: d_out has shape %s, the forward's output was %s",
                         shp(s1, sizeof s1, dout), vitc__shape_str(s2, sizeof s2, r->ndim, r->qshape));
    }
    const vitc__sdpa_desc *f = &r->sd;
    int64_t B = f->B, L = f->L, S = f->S, S0 = r->S0, E = l->cfg.embed_dim;
    int64_t kd = l->cfg.kdim ? l->cfg.kdim : E, vd = l->cfg.vdim ? l->cfg.vdim : E;
    int64_t ld = r->ldqkv;
    /* Regions: dO, then dq/dk/dv of the projections in the forward's layout. */
    vitc__carve cv = {0, 1};
    size_t o_do = vitc__take(&cv, (size_t)(L * B), (size_t)E);
    size_t o_dq = vitc__take(&cv, (size_t)(L * B), (size_t)(r->self ? 3 * E : E));
    size_t o_dk = r->self ? 0 : vitc__take(&cv, (size_t)(S * B), (size_t)E);
    size_t o_dv = r->self ? 0 : vitc__take(&cv, (size_t)(S * B), (size_t)E);
    size_t o_P = r->keep ? vitc__take(&cv, (size_t)L, (size_t)S) : 0;
    size_t o_dP = r->keep ? vitc__take(&cv, (size_t)L, (size_t)S) : 0;
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: backward scratch size overflows");
    VITC_TRY(vitc__buf_reserve(&l->bscratch, cv.used));
    VITC_TRY(vitc__layer_ensure_grad(l));
    float *g = l->bscratch.p;
    float *dO = g + o_do;                                   // [L*B, E], o's token order
    float *dq = g + o_dq;                                   // [L*B, E] (packed [L*B, 3E] when self)
    float *dk = r->self ? dq + E : g + o_dk;                // [S*B, E]
    float *dv = r->self ? dq + 2 * E : g + o_dv;            // [S*B, E]

    /* out = o W_o^T + b_o */
    vitc__linear_backward(dO, E, 0.0f, vitc__grad_of(l, l->w_o), vitc__grad_of(l, l->b_o),
                          dout->data, E, f->o, E, l->w_o, L * B, E, E);
    /* The gradients share the forward's layouts (dq with q's strides, ...). */
    if (r->keep) {
        vitc__sdpa_desc gd = *f;
        gd.q = dq;
        gd.k = dk;
        gd.v = dv;
        gd.o = dO;
        vitc__sdpa_dropout_backward(f, &gd, r->keep, l->cfg.dropout, g + o_P, g + o_dP);
    } else {
        VITC_TRY(vitc__sdpa_backward(&(vitc__sdpa_bwd_desc){
            *f, dO, f->o_sb, f->o_sh, f->o_sr, dq, f->q_sb, f->q_sh, f->q_sr, dk, f->k_sb,
            f->k_sh, f->k_sr, dv, f->v_sb, f->v_sh, f->v_sr}));
    }

    /* The in-projections, each into its own input's gradient. */
    int fused = l->plan.qkv == VITC__QKV_FUSED;
    const float *wq = fused ? l->w_qkv : l->w_q;
    const float *wk = fused ? l->w_qkv + E * E : l->w_k;
    const float *wv = fused ? l->w_qkv + 2 * E * E : l->w_v;
    const float *bq = l->b_qkv, *bk = l->b_qkv ? l->b_qkv + E : NULL;
    const float *bv = l->b_qkv ? l->b_qkv + 2 * E : NULL;
    vitc__linear_backward(d_query, E, 0.0f, vitc__grad_of(l, wq), vitc__grad_of(l, bq), dq, ld,
                          r->xq, E, wq, L * B, E, E);
    if (S > S0 && r->kv_sl == 1) { /* batch_first with extra keys: item by item */
        for (int64_t b = 0; b < B; b++) {
            vitc__linear_backward(d_key + b * S0 * kd, kd, 0.0f, vitc__grad_of(l, wk),
                                  vitc__grad_of(l, bk), dk + b * S * ld, ld, r->xk + b * S0 * kd, kd,
                                  wk, S0, E, kd);
            vitc__linear_backward(d_value + b * S0 * vd, vd, 0.0f, vitc__grad_of(l, wv),
                                  vitc__grad_of(l, bv), dv + b * S * ld, ld, r->xv + b * S0 * vd, vd,
                                  wv, S0, E, vd);
        }
    } else {
        vitc__linear_backward(d_key, kd, 0.0f, vitc__grad_of(l, wk), vitc__grad_of(l, bk), dk, ld,
                              r->xk, kd, wk, S0 * B, E, kd);
        vitc__linear_backward(d_value, vd, 0.0f, vitc__grad_of(l, wv), vitc__grad_of(l, bv), dv,
                              ld, r->xv, vd, wv, S0 * B, E, vd);
    }
    if (l->cfg.add_bias_kv) { /* key S0 of every item was bias_k (bias_v) */
        float *gk = vitc__grad_of(l, l->bias_k), *gv = vitc__grad_of(l, l->bias_v); // [E], [E]
        int64_t kv_sb = r->kv_sl == 1 ? S : 1;
        for (int64_t b = 0; b < B; b++) {
            const float *rk = dk + (b * kv_sb + S0 * r->kv_sl) * ld; // [E]
            const float *rv = dv + (b * kv_sb + S0 * r->kv_sl) * ld;
            for (int64_t e = 0; e < E; e++) {
                gk[e] += rk[e];
                gv[e] += rv[e];
            }
        }
    }
    return VITC_OK;
}

vitc_status vitc__mha_self_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                   float *out) {
    int ond;
    int64_t os[8];
    l->mrec.valid = 0;
    VITC_TRY(vitc__mha_check_shape(l, ndim, shape, &ond, os));
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    a.query.data = x;
    a.query.ndim = ndim;
    memcpy(a.query.shape, shape, (size_t)ndim * sizeof *shape);
    a.key = a.value = a.query;
    return vitc_mha_forward(l, &a, out, NULL);
}

/* ---- scaled_dot_product_attention ------------------------------------ */

/* The gradient of a forward described by sd (o, lse set): dout, dq, dk, dv
 * contiguous like o, q, k, v. */
static vitc_status sdpa_grad(vitc__sdpa_desc *sd, int saved, const float *dout, float *dq,
                             float *dk, float *dv) {
    if (!saved) /* o and the log-sum-exp the backward recomputes P from */
        VITC_TRY(vitc__sdpa(sd));
    vitc__sdpa_bwd_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.f = *sd;
    bd.dout = dout, bd.do_sb = sd->o_sb, bd.do_sh = sd->o_sh, bd.do_sr = sd->o_sr;
    bd.dq = dq, bd.dq_sb = sd->q_sb, bd.dq_sh = sd->q_sh, bd.dq_sr = sd->q_sr;
    bd.dk = dk, bd.dk_sb = sd->k_sb, bd.dk_sh = sd->k_sh, bd.dk_sr = sd->k_sr;
    bd.dv = dv, bd.dv_sb = sd->v_sb, bd.dv_sh = sd->v_sh, bd.dv_sr = sd->v_sr;
    return vitc__sdpa_backward(&bd);
}

/* vitc_sdpa (writing lse [B*H*L] too when given), and with dout set its
 * backward (lse then required): after computing out and lse, or from the
 * caller's (saved: out and lse are only read). */
static vitc_status sdpa_impl(const vitc_tensor_view *q, const vitc_tensor_view *k,
                             const vitc_tensor_view *v, const vitc_tensor_view *mask,
                             vitc_mask_type mask_type, float scale, float *out, float *lse,
                             int saved, const float *dout, float *dq, float *dk, float *dv) {
    char s1[96], s2[96], s3[96], s4[96];
    if (!q || !k || !v || !out || !q->data || !k->data || !v->data)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: NULL q, k, v or out");
    /* Checked before the "<= 0 means default" rule below, which NaN would
     * otherwise fall into silently; an infinite scale makes every output NaN. */
    if (!isfinite(scale))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "scaled_dot_product_attention: scale %g is not finite (give a finite scale "
                         "> 0, or 0 for the default 1/sqrt(d))",
                         (double)scale);
    int nd = q->ndim;
    int ok = nd >= 2 && nd <= 8 && k->ndim == nd && v->ndim == nd;
    for (int i = 0; ok && i < nd; i++)
        ok = q->shape[i] >= 1 && k->shape[i] >= 1 && v->shape[i] >= 1 &&
             q->shape[i] <= ((int64_t)1 << 40) && k->shape[i] <= ((int64_t)1 << 40) &&
             v->shape[i] <= ((int64_t)1 << 40) &&
             (i >= nd - 2 || (k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i]));
    ok = ok && k->shape[nd - 1] == q->shape[nd - 1] && v->shape[nd - 2] == k->shape[nd - 2];
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE,
                         "scaled_dot_product_attention: q %s, k %s, v %s do not fit "
                         "(expected [..., L, d], [..., S, d], [..., S, dv] with equal leading dims, "
                         "every dim >= 1)",
                         shp(s1, sizeof s1, q), shp(s2, sizeof s2, k), shp(s3, sizeof s3, v));
    int64_t L = q->shape[nd - 2], D = q->shape[nd - 1], S = k->shape[nd - 2], Dv = v->shape[nd - 1];
    /* Leading dims: the last one is the kernel's H, the rest flatten into its B. */
    int nlead = nd - 2;
    int64_t H = nlead ? q->shape[nd - 3] : 1, B = 1;
    for (int i = 0; i < nlead - 1; i++) B *= q->shape[i];
    if (!qkv_numel_ok(q, k, v))
        return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: q, k or v too large");

    vitc__sdpa_desc sd = {0};
    sd.B = B; sd.H = H; sd.L = L; sd.S = S; sd.D = D; sd.Dv = Dv;
    sd.q = q->data; sd.q_sb = H * L * D; sd.q_sh = L * D; sd.q_sr = D;
    sd.k = k->data; sd.k_sb = H * S * D; sd.k_sh = S * D; sd.k_sr = D;
    sd.v = v->data; sd.v_sb = H * S * Dv; sd.v_sh = S * Dv; sd.v_sr = Dv;
    sd.o = out; sd.o_sb = H * L * Dv; sd.o_sh = L * Dv; sd.o_sr = Dv;
    sd.scale = scale > 0.0f ? scale : (float)(1.0 / sqrt((double)D));

    float *tmp = NULL;
    if (mask && mask->data && mask_type != VITC_MASK_NONE) {
        if (mask_type != VITC_MASK_BOOL && mask_type != VITC_MASK_FLOAT)
            return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: bad mask type %d",
                             (int)mask_type);
        /* Right-align the mask's shape with [..., L, S]; every dim 1 or equal. */
        int mn = mask->ndim;
        int64_t full[8], ms[8];
        for (int i = 0; i < nlead; i++) full[i] = q->shape[i];
        full[nd - 2] = L;
        full[nd - 1] = S;
        int good = mn >= 0 && mn <= nd;
        for (int i = 0; good && i < nd; i++) {
            int j = i - (nd - mn);
            ms[i] = j < 0 ? 1 : mask->shape[j];
            good = ms[i] == 1 || ms[i] == full[i];
        }
        if (!good)
            return vitc__err(VITC_ERR_SHAPE,
                             "scaled_dot_product_attention: mask %s does not broadcast to %s",
                             shp(s1, sizeof s1, mask), vitc__shape_str(s4, sizeof s4, nd, full));
        /* The kernel wants a contiguous S and one stride over the flattened
         * outer dims: copy into that form when the mask is not already in it
         * (and always for bool, which becomes 0 / -inf). */
        int outer_ones = 1, outer_full = 1;
        for (int i = 0; i < nlead - 1; i++) {
            outer_ones = outer_ones && ms[i] == 1;
            outer_full = outer_full && ms[i] == full[i];
        }
        int64_t ts[8];
        for (int i = 0; i < nd; i++) ts[i] = ms[i];
        if (!outer_ones && !outer_full)
            for (int i = 0; i < nlead - 1; i++) ts[i] = full[i];
        ts[nd - 1] = S;
        int direct = mask_type == VITC_MASK_FLOAT && ms[nd - 1] == S && (outer_ones || outer_full);
        int ts_ok;
        size_t ts_n = vitc__numel(nd, ts, &ts_ok);
        if (!ts_ok || ts_n > ((size_t)1 << 56))
            return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: mask too large");
        int64_t st[8], acc = 1; /* contiguous strides of ts */
        for (int i = nd - 1; i >= 0; i--) {
            st[i] = acc;
            acc *= ts[i];
        }
        if (!direct) {
            size_t bytes;
            if (!vitc__mul_size((size_t)acc, sizeof(float), &bytes) || !(tmp = vitc__alloc(bytes)))
                return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention: cannot allocate the mask");
            /* Source strides of the mask in the right-aligned frame, 0 where it broadcasts. */
            int64_t sst[8], sacc = 1;
            for (int i = nd - 1; i >= 0; i--) {
                sst[i] = ms[i] == 1 ? 0 : sacc;
                sacc *= ms[i];
            }
            for (int64_t e = 0; e < acc; e++) {
                int64_t rem = e, si = 0;
                for (int i = 0; i < nd; i++) {
                    int64_t idx = rem / st[i];
                    rem %= st[i];
                    si += idx * sst[i];
                }
                if (mask_type == VITC_MASK_BOOL)
                    tmp[e] = ((const uint8_t *)mask->data)[si] ? 0.0f : -INFINITY;
                else
                    tmp[e] = ((const float *)mask->data)[si];
            }
        }
        sd.mask = direct ? mask->data : tmp;
        sd.m_sr = ts[nd - 2] == 1 ? 0 : st[nd - 2];
        sd.m_sh = nlead == 0 || ts[nd - 3] == 1 ? 0 : st[nd - 3];
        sd.m_sb = nlead < 2 || (outer_ones && ts[nlead - 2] == 1) ? 0 : st[nlead - 2];
    }
    vitc_status s;
    if (lse) sd.lse = lse, sd.lse_sb = H * L, sd.lse_sh = L;
    if (dout) {
        s = sdpa_grad(&sd, saved, dout, dq, dk, dv);
    } else {
        s = vitc__sdpa(&sd);
    }
    vitc__free(tmp);
    return s;
}

vitc_status vitc_sdpa(const vitc_tensor_view *q, const vitc_tensor_view *k, const vitc_tensor_view *v,
                      const vitc_tensor_view *mask, vitc_mask_type mask_type, float scale, float *out) {
    return sdpa_impl(q, k, v, mask, mask_type, scale, out, NULL, 0, NULL, NULL, NULL, NULL);
}

vitc_status vitc_sdpa_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                          const vitc_tensor_view *v, const vitc_tensor_view *mask,
                          vitc_mask_type mask_type, float scale, float *out, float *lse) {
    if (!lse)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention: NULL lse");
    return sdpa_impl(q, k, v, mask, mask_type, scale, out, lse, 0, NULL, NULL, NULL, NULL);
}

vitc_status vitc_sdpa_backward_lse(const vitc_tensor_view *q, const vitc_tensor_view *k,
                                   const vitc_tensor_view *v, const vitc_tensor_view *mask,
                                   vitc_mask_type mask_type, float scale, const float *out,
                                   const float *lse, const float *dout, float *dq, float *dk,
                                   float *dv) {
    if (!out || !lse || !dout || !dq || !dk || !dv)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention backward: NULL "
                                               "out, lse, dout, dq, dk or dv");
    /* The backward only reads out and lse (the descriptor's fields are
     * writable because the forward fills them). */
    return sdpa_impl(q, k, v, mask, mask_type, scale, (float *)out, (float *)lse, 1, dout, dq, dk,
                     dv);
}

vitc_status vitc_sdpa_backward(const vitc_tensor_view *q, const vitc_tensor_view *k,
                               const vitc_tensor_view *v, const vitc_tensor_view *mask,
                               vitc_mask_type mask_type, float scale, const float *dout, float *dq,
                               float *dk, float *dv) {
    if (!q || !v || !dout || !dq || !dk || !dv)
        return vitc__err(VITC_ERR_INVALID_ARG, "scaled_dot_product_attention backward: NULL "
                                               "q, v, dout, dq, dk or dv");
    /* The forward's o [..., L, dv] and lse [..., L]; sdpa_impl checks the
     * shapes in full before either is touched. */
    int nd = q->ndim, ok = nd >= 2 && nd <= 8 && v->ndim == nd;
    for (int i = 0; ok && i < nd; i++) ok = q->shape[i] >= 1 && v->shape[i] >= 1;
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "scaled_dot_product_attention backward: q (%dD) and v "
                                         "(%dD) need equal ranks in [2, 8] and dims >= 1",
                         q->ndim, v->ndim);
    size_t rows = 1, no = 0, bytes_o, bytes_l;
    for (int i = 0; ok && i < nd - 1; i++) ok = vitc__mul_size(rows, (size_t)q->shape[i], &rows);
    ok = ok && vitc__mul_size(rows, (size_t)v->shape[nd - 1], &no) &&
         vitc__mul_size(no, sizeof(float), &bytes_o) && vitc__mul_size(rows, sizeof(float), &bytes_l);
    if (!ok) return vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention backward: sizes too large");
    float *o = vitc__alloc(bytes_o), *lse = vitc__alloc(bytes_l); /* [..., L, dv], [..., L] */
    vitc_status s = o && lse ? sdpa_impl(q, k, v, mask, mask_type, scale, o, lse, 0, dout, dq, dk, dv)
                             : vitc__err(VITC_ERR_NOMEM, "scaled_dot_product_attention backward: "
                                                         "cannot allocate the forward's output");
    vitc__free(o);
    vitc__free(lse);
    return s;
}

/* ---- softmax -------------------------------------------------------- */

vitc_status vitc_softmax(const float *x, int ndim, const int64_t *shape, int dim, float temperature,
                         float *out) {
    char s1[96];
    if (!x || !out || (ndim > 0 && !shape) || ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: NULL argument or ndim %d out of [0, 8]", ndim);
    if (temperature == 0.0f || !isfinite(temperature))
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: temperature %g must be finite and non-zero",
                         (double)temperature);
    int nd = ndim ? ndim : 1;
    if (dim < -nd || dim >= nd)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax: dim %d out of range for shape %s", dim,
                         vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (dim < 0) dim += nd;
    int ok;
    size_t total = vitc__numel(ndim, shape, &ok);
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "softmax: bad shape %s", vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (total == 0)
        return VITC_OK;
    int64_t n = ndim ? shape[dim] : 1, inner = 1;
    for (int i = dim + 1; i < ndim; i++) inner *= shape[i];
    int64_t outer = (int64_t)total / (n * inner);
    /* x / temperature, divided as torch does (a multiply by 1/t would move
     * logits in the thousands by an ulp, and their softmax visibly). */
    if (inner == 1) {
        for (size_t i = 0; i < total; i++) out[i] = x[i] / temperature;
        vitc__softmax_rows(out, outer, n, 1.0f);
        return VITC_OK;
    }
    float *row = vitc__alloc((size_t)n * sizeof(float)); // [n]
    if (!row)
        return vitc__err(VITC_ERR_NOMEM, "softmax: cannot allocate a row of %lld", (long long)n);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *xs = x + o * n * inner + i;
            float *os = out + o * n * inner + i;
            for (int64_t j = 0; j < n; j++) row[j] = xs[j * inner] / temperature;
            vitc__softmax_rows(row, 1, n, 1.0f);
            for (int64_t j = 0; j < n; j++) os[j * inner] = row[j];
        }
    vitc__free(row);
    return VITC_OK;
}

vitc_status vitc_softmax_backward(const float *y, const float *dy, int ndim, const int64_t *shape,
                                  int dim, float temperature, float *dx) {
    char s1[96];
    if (!y || !dy || !dx || (ndim > 0 && !shape) || ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "softmax backward: NULL argument or ndim %d out of [0, 8]", ndim);
    if (temperature == 0.0f || !isfinite(temperature))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "softmax backward: temperature %g must be finite and non-zero",
                         (double)temperature);
    int nd = ndim ? ndim : 1;
    if (dim < -nd || dim >= nd)
        return vitc__err(VITC_ERR_INVALID_ARG, "softmax backward: dim %d out of range for shape %s",
                         dim, vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (dim < 0) dim += nd;
    int ok;
    size_t total = vitc__numel(ndim, shape, &ok);
    if (!ok)
        return vitc__err(VITC_ERR_SHAPE, "softmax backward: bad shape %s",
                         vitc__shape_str(s1, sizeof s1, ndim, shape));
    if (total == 0) return VITC_OK;
    int64_t n = ndim ? shape[dim] : 1, inner = 1;
    for (int i = dim + 1; i < ndim; i++) inner *= shape[i];
    int64_t outer = (int64_t)total / (n * inner);
    /* d(x / t) / dx = 1 / t: the division's gradient, as torch's autograd
     * takes it (1/t rounded once, applied as a multiply). */
    float it = 1.0f / temperature;
    if (inner == 1) {
        vitc__softmax_rows_backward(dx, y, dy, outer, n, it);
        return VITC_OK;
    }
    float *buf = vitc__alloc((size_t)n * 3 * sizeof(float)); // [3, n]: y, dy, dx of one row
    if (!buf)
        return vitc__err(VITC_ERR_NOMEM, "softmax backward: cannot allocate a row of %lld",
                         (long long)n);
    float *yr = buf, *gr = buf + n, *xr = buf + 2 * n;
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            size_t base = (size_t)(o * n * inner + i);
            for (int64_t j = 0; j < n; j++) {
                yr[j] = y[base + (size_t)(j * inner)];
                gr[j] = dy[base + (size_t)(j * inner)];
            }
            vitc__softmax_rows_backward(xr, yr, gr, 1, n, it);
            for (int64_t j = 0; j < n; j++) dx[base + (size_t)(j * inner)] = xr[j];
        }
    vitc__free(buf);
    return VITC_OK;
}
