/*
 * mha.c — torch.nn.MultiheadAttention: its parameter table, and its forward
 * (torch 1.13's multi_head_attention_forward: masks, key padding,
 * need_weights) and backward, both as the full vitc_mha_* calls and as a
 * layer kind (self-attention of one input). The attention itself is
 * vitc__sdpa, reading the projected q, k, v in place through strides.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

#define S(field) VITC__SLOT(field)

static const char *shp_of(char *buf, size_t cap, int ndim, const int64_t *shape) {
    return vitc__shape_str(buf, cap, ndim < 0 || ndim > 8 ? 0 : ndim, shape);
}

static const char *shp(char *buf, size_t cap, const vitc_tensor_view *t) {
    return shp_of(buf, cap, t->ndim, t->shape);
}

/* ---- parameter table ------------------------------------------------- */

vitc_status vitc__mha_build(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    char msg[160];
    int64_t E = c->embed_dim, H = c->num_heads;
    int64_t kd = c->kdim ? c->kdim : E, vd = c->vdim ? c->vdim : E;
    if (c->in_channels && c->in_channels != c->embed_dim) {
        snprintf(msg, sizeof msg, "in_channels %d differs from embed_dim %d (leave it 0)",
                 c->in_channels, c->embed_dim);
        return vitc__layer_bad_config(l, msg);
    }
    if (E < 1)
        return vitc__layer_bad_config(l, "embed_dim must be >= 1");
    if (!(c->dropout >= 0.0f && c->dropout <= 1.0f))
        return vitc__layer_bad_config(l, "dropout must be in [0, 1]");
    if (E % H) {
        snprintf(msg, sizeof msg, "embed_dim %lld is not divisible by num_heads %lld",
                 (long long)E, (long long)H);
        return vitc__layer_bad_config(l, msg);
    }
    *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE,
                      kd == E && vd == E ? VITC__QKV_FUSED : VITC__QKV_SEPARATE,
                      VITC__HEADS_GROUPED, VITC__OUT_LINEAR, VITC__RES_NONE, E, E, E, E, H,
                      (float)(1.0 / sqrt((double)(E / H)))};
    if (p->qkv == VITC__QKV_FUSED) {
        vitc__layer_add_param(l, "in_proj_weight", NULL, S(w_qkv), VITC__INIT_XAVIER, E, 3 * E, 2, 3 * E, E,
                  0, 0);
    } else {
        vitc__layer_add_param(l, "q_proj_weight", NULL, S(w_q), VITC__INIT_XAVIER, E, E, 2, E, E, 0, 0);
        vitc__layer_add_param(l, "k_proj_weight", NULL, S(w_k), VITC__INIT_XAVIER, kd, E, 2, E, kd, 0, 0);
        vitc__layer_add_param(l, "v_proj_weight", NULL, S(w_v), VITC__INIT_XAVIER, vd, E, 2, E, vd, 0, 0);
    }
    if (c->bias)
        vitc__layer_add_param(l, "in_proj_bias", NULL, S(b_qkv), VITC__INIT_ZERO, 0, 0, 1, 3 * E, 0, 0, 0);
    if (c->add_bias_kv) {
        /* xavier_normal_ of [1, 1, E]: fan_in = fan_out = E */
        vitc__layer_add_param(l, "bias_k", NULL, S(bias_k), VITC__INIT_NORMAL, E, E, 3, 1, 1, E, 0);
        l->params[l->nparams - 1].init_std = sqrt(1.0 / (double)E);
        vitc__layer_add_param(l, "bias_v", NULL, S(bias_v), VITC__INIT_NORMAL, E, E, 3, 1, 1, E, 0);
        l->params[l->nparams - 1].init_std = sqrt(1.0 / (double)E);
    }
    vitc__layer_add_param(l, "out_proj.weight", NULL, S(w_o), VITC__INIT_KAIMING, E, E, 2, E, E, 0, 0);
    if (c->bias)
        vitc__layer_add_param(l, "out_proj.bias", NULL, S(b_o), VITC__INIT_ZERO, 0, 0, 1, E, 0, 0, 0);
    return VITC_OK;
}

/* The in-projections' weights and biases for q, k, v, in t (l->w or its
 * gradients l->g): in_proj_weight and in_proj_bias chunked in three, or the
 * separate q/k/v_proj_weight. */
typedef struct mha_in_proj { float *w[3], *b[3]; } mha_in_proj;

static mha_in_proj mha_in_proj_of(const vitc_layer *l, const vitc__layer_w *t) {
    int64_t E = l->cfg.embed_dim;
    int fused = l->plan.qkv == VITC__QKV_FUSED;
    mha_in_proj r;
    for (int i = 0; i < 3; i++) {
        r.w[i] = fused ? t->w_qkv + i * E * E : i == 0 ? t->w_q : i == 1 ? t->w_k : t->w_v;
        r.b[i] = t->b_qkv ? t->b_qkv + i * E : NULL;
    }
    return r;
}

/* ---- shapes -------------------------------------------------------------- */

/* Sizes of one call, checked as torch's _mha_shape_check does. Token (b, l)
 * of a [L, B, E] or [B, L, E] tensor is row b*sb + l*sl. */
typedef struct mha_dims {
    int batched;
    int64_t B, L, S, E, H;
    int64_t S0, nextra;               /* keys given; S = S0 + bias_k row + zero row */
    int64_t q_sb, q_sl, kv_sb, kv_sl; /* in rows; kv for the S keys after projection */
} mha_dims;

/* Query, key and value shapes: nd[i] dims in sh[i] (0 query, 1 key, 2 value). */
static vitc_status mha_dims_of(const vitc_layer *l, const int nd3[3], const int64_t *const sh[3],
                               mha_dims *d) {
    const vitc_layer_config *c = &l->cfg;
    const int64_t *qs = sh[0], *ks = sh[1], *vs = sh[2];
    char s1[96], s2[96], s3[96];
    int64_t E = c->embed_dim, kd = c->kdim ? c->kdim : E, vd = c->vdim ? c->vdim : E;
    int nd = nd3[0];
    if ((nd != 2 && nd != 3) || nd3[1] != nd || nd3[2] != nd)
        return vitc__err(VITC_ERR_SHAPE,
                         "MultiheadAttention: query, key and value must all be 3-D (batched) or "
                         "2-D (unbatched); got query %s, key %s, value %s",
                         shp_of(s1, sizeof s1, nd3[0], qs), shp_of(s2, sizeof s2, nd3[1], ks),
                         shp_of(s3, sizeof s3, nd3[2], vs));
    for (int i = 0; i < nd; i++)
        if (qs[i] < 1 || ks[i] < 1 || vs[i] < 1 || qs[i] > ((int64_t)1 << 40) ||
            ks[i] > ((int64_t)1 << 40) || vs[i] > ((int64_t)1 << 40))
            return vitc__err(VITC_ERR_SHAPE,
                             "MultiheadAttention: every dimension must be >= 1; got query %s, "
                             "key %s, value %s",
                             shp_of(s1, sizeof s1, nd, qs), shp_of(s2, sizeof s2, nd, ks),
                             shp_of(s3, sizeof s3, nd, vs));
    /* At most 2^50 elements each: the products below do not overflow, and
     * the buffers derived from them stay allocatable sizes. */
    for (int i = 0; i < 3; i++) {
        int ok;
        size_t n = vitc__numel(nd, sh[i], &ok);
        if (!ok || n > ((size_t)1 << 50))
            return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: query, key or value too large");
    }
    d->batched = nd == 3;
    d->E = E;
    d->H = c->num_heads;
    int bf = d->batched && c->batch_first;
    int64_t qb = d->batched ? qs[bf ? 0 : 1] : 1, ql = qs[bf ? 1 : 0];
    int64_t kb = d->batched ? ks[bf ? 0 : 1] : 1, kl = ks[bf ? 1 : 0];
    int64_t vb = d->batched ? vs[bf ? 0 : 1] : 1, vl = vs[bf ? 1 : 0];
    if (qs[nd - 1] != E || ks[nd - 1] != kd || vs[nd - 1] != vd || kb != qb || vb != qb || kl != vl)
        return vitc__err(VITC_ERR_SHAPE,
                         "MultiheadAttention(embed_dim=%lld, kdim=%lld, vdim=%lld, batch_first=%d): "
                         "query %s, key %s, value %s do not fit (expected %s)",
                         (long long)E, (long long)kd, (long long)vd, c->batch_first,
                         shp_of(s1, sizeof s1, nd, qs), shp_of(s2, sizeof s2, nd, ks),
                         shp_of(s3, sizeof s3, nd, vs),
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

/* The dimensions of a vitc_mha_forward call's query, key and value. */
static vitc_status mha_args_dims(const vitc_layer *l, const vitc_mha_args *a, mha_dims *d) {
    if (!a->query.data || !a->key.data || !a->value.data)
        return vitc__err(VITC_ERR_INVALID_ARG, "MultiheadAttention: query, key or value is NULL");
    int nd[3] = {a->query.ndim, a->key.ndim, a->value.ndim};
    const int64_t *const sh[3] = {a->query.shape, a->key.shape, a->value.shape};
    return mha_dims_of(l, nd, sh, d);
}

/* The layer form: query = key = value = x of shape [ndim]. */
static vitc_status mha_self_dims(const vitc_layer *l, int ndim, const int64_t *shape,
                                 mha_dims *d) {
    if (ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_SHAPE, "MultiheadAttention: input must be 2-D or 3-D, got %d-D", ndim);
    if (l->cfg.kdim && l->cfg.kdim != l->cfg.embed_dim)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention with kdim %d != embed_dim %d has no self-attention "
                         "form; use vitc_mha_forward", l->cfg.kdim, l->cfg.embed_dim);
    if (l->cfg.vdim && l->cfg.vdim != l->cfg.embed_dim)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention with vdim %d != embed_dim %d has no self-attention "
                         "form; use vitc_mha_forward", l->cfg.vdim, l->cfg.embed_dim);
    int nd[3] = {ndim, ndim, ndim};
    const int64_t *const sh[3] = {shape, shape, shape};
    return mha_dims_of(l, nd, sh, d);
}

vitc_status vitc__mha_self_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                        int *out_ndim, int64_t out_shape[8]) {
    mha_dims d;
    VITC_TRY(mha_self_dims(l, ndim, shape, &d));
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
    VITC_TRY(mha_args_dims(l, a, &d));
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

/* The forward of a checked call (d from mha_dims_of, masks checked). */
static vitc_status mha_run(vitc_layer *l, const vitc_mha_args *a, const mha_dims *dp, float *out,
                           float *weights) {
    const mha_dims d = *dp;
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
    vitc__carve sc = {0, 1};
    size_t o_q = vitc__take(&sc, (size_t)(L * B), (size_t)(self ? 3 * E : E));
    size_t o_k = self ? 0 : vitc__take(&sc, (size_t)(S * B), (size_t)E);
    size_t o_v = self ? 0 : vitc__take(&sc, (size_t)(S * B), (size_t)E);
    size_t o_o = vitc__take(&sc, (size_t)(L * B), (size_t)E);
    /* The merged mask keeps only the dims that vary: [B*H | B | 1, L | 1, S]. */
    int64_t mb = 1, mh = 1, ml = 1;
    size_t o_mask = 0;
    if (merge) {
        if (am->data && am->ndim == 3) { mb = B; mh = H; }
        else if (kpm->data) mb = B;
        if (am->data) ml = L;
        o_mask = vitc__take(&sc, (size_t)(mb * mh), (size_t)(ml * S));
    }
    /* Head-averaged weights go through per-head probabilities a few batch
     * items at a time, so that scratch stays near 16 MB instead of
     * [B, heads, L, S]. */
    int64_t chunk = B, per_b = H * L * S;
    size_t o_probs = 0;
    if (a->need_weights && a->average_attn_weights) {
        chunk = ((int64_t)4 << 20) / per_b;
        chunk = chunk < 1 ? 1 : chunk > B ? B : chunk;
        o_probs = vitc__take(&sc, (size_t)chunk, (size_t)per_b);
    }
    /* Training: copies of the inputs, which the weight gradients read, and
     * each attention row's log-sum-exp. */
    size_t nxq = 0, nxk = 0, nxv = 0, o_xq = 0, o_xk = 0, o_xv = 0, o_lse = 0;
    if (l->training) {
        nxq = (size_t)(L * B) * (size_t)E;
        nxk = self ? 0 : (size_t)(S0 * B) * (size_t)kd;
        nxv = self ? 0 : (size_t)(S0 * B) * (size_t)vd;
        o_xq = vitc__take(&sc, nxq, 1);
        o_xk = vitc__take(&sc, nxk, 1);
        o_xv = vitc__take(&sc, nxv, 1);
        o_lse = vitc__take(&sc, (size_t)(B * H), (size_t)L);
    }
    /* Dropout on the weights (training): the kept mask [B, H, L, S] bytes, and
     * one head's probabilities. */
    int drop = l->training && l->cfg.dropout > 0.0f;
    size_t o_keep = 0, o_P = 0;
    if (drop) {
        size_t nkeep = 0;
        if (!vitc__mul_size((size_t)(B * H), (size_t)(L * S), &nkeep))
            sc.ok = 0;
        o_keep = vitc__take(&sc, (nkeep + 3) / 4, 1);
        o_P = vitc__take(&sc, (size_t)L, (size_t)S);
    }
    if (!sc.ok)
        return vitc__err(VITC_ERR_NOMEM, "MultiheadAttention: scratch size overflows");
    VITC_TRY(vitc__buf_reserve(&l->scratch, sc.used));
    float *s = l->scratch.p;
    float *qb = s + o_q;                       // [L*B, E] or packed [L*B, 3E]
    float *kb = s + o_k;                       // [S*B, E]
    float *vb = s + o_v;                       // [S*B, E]
    float *o = s + o_o;                        // [L*B, E], in query's token order
    float *mask = s + o_mask;                  // [mb*mh, ml, S]
    float *probs = s + o_probs;                // [chunk, H, L, S]
    float *cq = s + o_xq;                      // [L*B, E] training copy of query
    float *ck = s + o_xk;                      // [S0*B, kdim]
    float *cv = s + o_xv;                     // [S0*B, vdim]
    float *lse = s + o_lse;                    // [B, H, L] training: each row's log-sum-exp
    uint8_t *keep = (uint8_t *)(s + o_keep);   // [B, H, L, S] dropout's kept weights
    float *P = s + o_P;                        // [L, S] dropout: one head's probabilities
    if (l->training) {
        memcpy(cq, xq, nxq * sizeof(float));
        memcpy(ck, xk, nxk * sizeof(float));
        memcpy(cv, xv, nxv * sizeof(float));
    }

    /* In-projection: _in_projection_packed / _in_projection. */
    mha_in_proj ip = mha_in_proj_of(l, &l->w);
    const float *wq = ip.w[0], *wk = ip.w[1], *wv = ip.w[2];
    const float *bq = ip.b[0], *bk = ip.b[1], *bv = ip.b[2];
    int64_t ldq = E, ldk = E, ldv = E;
    if (self) {
        vitc__linear(qb, 3 * E, xq, E, l->w.w_qkv, l->w.b_qkv, NULL, 0, L * B, 3 * E, E);
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
                    kb[row + e] = bias ? l->w.bias_k[e] : 0.0f;
                    vb[row + e] = bias ? l->w.bias_v[e] : 0.0f;
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
    vitc__linear(out, E, o, E, l->w.w_o, l->w.b_o, NULL, 0, L * B, E, E);
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

vitc_status vitc_mha_forward(vitc_layer *l, const vitc_mha_args *a, float *out, float *weights) {
    if (!l || !a || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: NULL argument");
    if (l->cfg.kind != VITC_MULTIHEAD_ATTENTION)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: not a MultiheadAttention layer");
    l->mrec.valid = 0; /* any forward, failed ones included, replaces the record */
    if (a->need_weights && !weights)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_mha_forward: need_weights set but weights is NULL");
    mha_dims d;
    VITC_TRY(mha_args_dims(l, a, &d));
    VITC_TRY(mha_check_masks(a, &d));
    return mha_run(l, a, &d, out, weights);
}

vitc_status vitc__mha_self_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                   float *out) {
    l->mrec.valid = 0;
    mha_dims d;
    VITC_TRY(mha_self_dims(l, ndim, shape, &d));
    vitc_mha_args a;
    memset(&a, 0, sizeof a);
    a.query.data = x;
    a.query.ndim = ndim;
    memcpy(a.query.shape, shape, (size_t)ndim * sizeof *shape);
    a.key = a.value = a.query;
    return mha_run(l, &a, &d, out, NULL);
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
    vitc__linear_backward(dO, E, 0.0f, l->g.w_o, l->g.b_o,
                          dout->data, E, f->o, E, l->w.w_o, L * B, E, E);
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
    mha_in_proj ip = mha_in_proj_of(l, &l->w), gp = mha_in_proj_of(l, &l->g);
    const float *wq = ip.w[0], *wk = ip.w[1], *wv = ip.w[2];
    vitc__linear_backward(d_query, E, 0.0f, gp.w[0], gp.b[0], dq, ld, r->xq, E, wq, L * B, E, E);
    if (S > S0 && r->kv_sl == 1) { /* batch_first with extra keys: item by item */
        for (int64_t b = 0; b < B; b++) {
            vitc__linear_backward(d_key + b * S0 * kd, kd, 0.0f, gp.w[1], gp.b[1], dk + b * S * ld,
                                  ld, r->xk + b * S0 * kd, kd, wk, S0, E, kd);
            vitc__linear_backward(d_value + b * S0 * vd, vd, 0.0f, gp.w[2], gp.b[2],
                                  dv + b * S * ld, ld, r->xv + b * S0 * vd, vd, wv, S0, E, vd);
        }
    } else {
        vitc__linear_backward(d_key, kd, 0.0f, gp.w[1], gp.b[1], dk, ld, r->xk, kd, wk, S0 * B, E,
                              kd);
        vitc__linear_backward(d_value, vd, 0.0f, gp.w[2], gp.b[2], dv, ld, r->xv, vd, wv, S0 * B,
                              E, vd);
    }
    if (l->cfg.add_bias_kv) { /* key S0 of every item was bias_k (bias_v) */
        float *gk = l->g.bias_k, *gv = l->g.bias_v; // [E], [E]
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

/* vitc_layer_forward's MultiheadAttention is self-attention of x: its
 * gradient is d_query + d_key + d_value. */
vitc_status vitc__mha_self_backward(vitc_layer *l, const float *dy, int ndim,
                                    const int64_t *shape, float *dx) {
    const vitc__mha_record *r = &l->mrec;
    if (!r->valid)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "MultiheadAttention: backward needs a training-mode forward first");
    for (int i = 0; i < r->ndim; i++)
        if (r->kshape[i] != r->qshape[i] || r->vshape[i] != r->qshape[i])
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "MultiheadAttention: the recorded forward had a key or value unlike "
                             "the query; use vitc_mha_backward");
    vitc_tensor_view d = {dy, ndim, {0}};
    if (ndim < 0 || ndim > 8)
        return vitc__err(VITC_ERR_SHAPE, "backward: dy has %d dimensions", ndim);
    memcpy(d.shape, shape, (size_t)ndim * sizeof *shape);
    int ok;
    size_t n = vitc__numel(r->ndim, r->qshape, &ok);
    VITC_TRY(vitc__buf_reserve(&l->xscratch, 2 * n));
    float *dk = l->xscratch.p, *dv = dk + n; // [n], [n]
    VITC_TRY(vitc_mha_backward(l, &d, dx, dk, dv));
    for (size_t i = 0; i < n; i++) dx[i] += dk[i] + dv[i];
    return VITC_OK;
}
