/*
 * engine.c — the attention engine: one layer object whose configuration
 * picks each stage (tokens in, norm, q/k/v projection and head layout,
 * attention, output projection, residual), with the seed blocks as presets.
 *
 * Every preset's forward reads like its seed's PyTorch forward:
 *
 *   tokens = in-stage(norm(x))           [B, N, cin]
 *   qkv    = projection(tokens)          [B, N, 2*dq + dv], heads laid out per preset
 *   o      = sdpa(q, k, v) * scale       [B, N, dv], q/k/v read in place through strides
 *   y      = out-projection(o) (+ v)     [B, N, cout]
 *   out    = y, or channels-first y*gamma + x
 *
 * Each preset's parameter table is built here (vitc__engine_build_*); the
 * table's storage, load and gradients are the layer core's (layer.c), the
 * backward is engine_backward.c's.
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops_layers.h"
#include "layers.h"


/* ---- parameter table ------------------------------------------------ */

/* A row's slot: where in vitc_layer forward reads the tensor through. */
#define S(field) VITC__SLOT(field)

/* nn.Linear(in, out, bias) under a prefix ("to_q" -> to_q.weight, to_q.bias). */
#define LINEAR(l, wname, walias, bname, balias, wslot, bslot, in, out, has_bias)                   \
    do {                                                                                         \
        vitc__layer_add_param(l, wname, walias, wslot, VITC__INIT_KAIMING, in, out, 2, out, in, 0, 0);       \
        if (has_bias)                                                                            \
            vitc__layer_add_param(l, bname, balias, bslot, VITC__INIT_KAIMING, in, out, 1, out, 0, 0, 0);    \
    } while (0)

/* nn.Conv2d(in, out, k) weight [out, in, k, k] and bias. */
#define CONV(l, wname, bname, wslot, bslot, in, out, k)                                          \
    do {                                                                                         \
        vitc__layer_add_param(l, wname, NULL, wslot, VITC__INIT_KAIMING, (int64_t)(in) * (k) * (k), out, 4,  \
                  out, in, k, k);                                                                \
        vitc__layer_add_param(l, bname, NULL, bslot, VITC__INIT_KAIMING, (int64_t)(in) * (k) * (k), out, 1,  \
                  out, 0, 0, 0);                                                                 \
    } while (0)

static void add_norm(vitc_layer *l, int64_t C, int batch) {
    const char *aw = batch ? NULL : "group_norm.weight", *ab = batch ? NULL : "group_norm.bias";
    vitc__layer_add_param(l, "norm.weight", aw, S(norm_w), VITC__INIT_ONE, 0, 0, 1, C, 0, 0, 0);
    vitc__layer_add_param(l, "norm.bias", ab, S(norm_b), VITC__INIT_ZERO, 0, 0, 1, C, 0, 0, 0);
    if (batch) {
        vitc__layer_add_param(l, "norm.running_mean", NULL, S(run_mean), VITC__INIT_ZERO, 0, 0, 1, C, 0, 0, 0);
        vitc__layer_add_param(l, "norm.running_var", NULL, S(run_var), VITC__INIT_ONE, 0, 0, 1, C, 0, 0, 0);
        l->params[l->nparams - 2].buffer = l->params[l->nparams - 1].buffer = 1;
    }
}

/* The presets' plans and parameter tables, in PyTorch's state_dict order. */

/* The bad-config error of l with a message of numbers (its what). */
static vitc_status engine_bad(const vitc_layer *l, const char *fmt, ...) {
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return vitc__layer_bad_config(l, msg);
}

vitc_status vitc__engine_build_attention_block(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    int64_t C = c->in_channels, E = c->embed_dim, k = c->patch_size, H = c->num_heads;
    if (C < 1 || E < 1 || k < 1)
        return vitc__layer_bad_config(l, "in_channels, embed_dim and patch_size must be >= 1");
    if (E % H)
        return engine_bad(l, "embed_dim %lld is not divisible by heads %lld", (long long)E,
                          (long long)H);
    *p = (vitc__plan){VITC__IN_PATCHES, VITC__NORM_NONE, VITC__QKV_SEPARATE, VITC__HEADS_GROUPED,
                      VITC__OUT_LINEAR, VITC__RES_NONE, E, E, E, E, H,
                      (float)(1.0 / sqrt((double)(E / H)))};
    CONV(l, "proj.weight", "proj.bias", S(w_patch), S(b_patch), C, E, k);
    LINEAR(l, "to_q.weight", NULL, "to_q.bias", NULL, S(w_q), S(b_q), E, E, 1);
    LINEAR(l, "to_k.weight", NULL, "to_k.bias", NULL, S(w_k), S(b_k), E, E, 1);
    LINEAR(l, "to_v.weight", NULL, "to_v.bias", NULL, S(w_v), S(b_v), E, E, 1);
    LINEAR(l, "to_out.weight", NULL, "to_out.bias", NULL, S(w_o), S(b_o), E, E, 1);
    return VITC_OK;
}

vitc_status vitc__engine_build_conv_sa(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    int64_t C = c->in_channels, C8 = C / 8;
    if (C < 8)
        return engine_bad(l, "in_channels %lld < 8 (q and k have in_channels//8 channels)",
                          (long long)C);
    *p = (vitc__plan){VITC__IN_IMAGE, VITC__NORM_NONE, VITC__QKV_SEPARATE, VITC__HEADS_GROUPED,
                      VITC__OUT_NONE, VITC__RES_INPUT, C, C8, C, C, 1,
                      (float)(1.0 / sqrt((double)C8))};
    /* gamma is the module's own parameter, so torch lists it before the children. */
    vitc__layer_add_param(l, "gamma", NULL, S(gamma), VITC__INIT_ZERO, 0, 0, 1, 1, 0, 0, 0);
    CONV(l, "q.weight", "q.bias", S(w_q), S(b_q), C, C8, 1);
    CONV(l, "k.weight", "k.bias", S(w_k), S(b_k), C, C8, 1);
    CONV(l, "v.weight", "v.bias", S(w_v), S(b_v), C, C, 1);
    return VITC_OK;
}

/* SelfAttention with GroupNorm, BatchNorm, or BatchNorm and heads. */
vitc_status vitc__engine_build_self_attention(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    int64_t C = c->in_channels, H = c->kind == VITC_SELF_ATTENTION_MULTIHEAD ? c->num_heads : 1;
    if (C < 1)
        return vitc__layer_bad_config(l, "ni must be >= 1");
    if (C % H)
        return engine_bad(l, "ni %lld is not divisible by nheads %lld", (long long)C,
                          (long long)H);
    int group = c->kind == VITC_SELF_ATTENTION_GROUP;
    *p = (vitc__plan){VITC__IN_IMAGE,
                      group ? VITC__NORM_GROUP : VITC__NORM_BATCH,
                      group ? VITC__QKV_SEPARATE : VITC__QKV_FUSED,
                      H > 1 ? VITC__HEADS_PER_HEAD : VITC__HEADS_GROUPED,
                      VITC__OUT_LINEAR, VITC__RES_INPUT, C, C, C, C, H,
                      (float)(1.0 / sqrt((double)C / (double)H))};
    add_norm(l, C, !group);
    if (group) {
        LINEAR(l, "q.weight", "query.weight", "q.bias", "query.bias", S(w_q), S(b_q), C, C, 1);
        LINEAR(l, "k.weight", "key.weight", "k.bias", "key.bias", S(w_k), S(b_k), C, C, 1);
        LINEAR(l, "v.weight", "value.weight", "v.bias", "value.bias", S(w_v), S(b_v), C, C, 1);
        LINEAR(l, "proj.weight", "proj_attn.weight", "proj.bias", "proj_attn.bias", S(w_o),
               S(b_o), C, C, 1);
    } else {
        LINEAR(l, "qkv.weight", NULL, "qkv.bias", NULL, S(w_qkv), S(b_qkv), C, 3 * C, 1);
        LINEAR(l, "proj.weight", NULL, "proj.bias", NULL, S(w_o), S(b_o), C, C, 1);
    }
    return VITC_OK;
}

vitc_status vitc__engine_build_t2t(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    int64_t dim = c->in_channels, chan = c->embed_dim, H = c->num_heads;
    if (dim < 1 || chan < 1)
        return vitc__layer_bad_config(l, "dim (in_channels) and chan (embed_dim) must be >= 1");
    if (chan % H)
        return engine_bad(l, "chan %lld is not divisible by num_heads %lld",
                          (long long)chan, (long long)H);
    /* qk_scale or head_dim ** -0.5: Python's `or` treats 0.0 as absent too. */
    float scale = c->qk_scale != 0.0f ? c->qk_scale : (float)pow((double)(chan / H), -0.5);
    *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE, VITC__QKV_FUSED, VITC__HEADS_GROUPED,
                      VITC__OUT_LINEAR, VITC__RES_V, dim, chan, chan, chan, H, scale};
    LINEAR(l, "qkv.weight", NULL, "qkv.bias", NULL, S(w_qkv), S(b_qkv), dim, 3 * chan,
           c->bias);
    LINEAR(l, "proj.weight", NULL, "proj.bias", NULL, S(w_o), S(b_o), chan, chan, 1);
    return VITC_OK;
}

vitc_status vitc__engine_build_single_head(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    int64_t E = c->in_channels, dk = c->embed_dim;
    if (E < 1 || dk < 1)
        return vitc__layer_bad_config(l, "embedding_dim (in_channels) and d_k (embed_dim) must be >= 1");
    *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE, VITC__QKV_MATMUL, VITC__HEADS_GROUPED,
                      VITC__OUT_MATMUL, VITC__RES_NONE, E, dk, dk, E, 1,
                      (float)(1.0 / sqrt((double)dk))};
    vitc__layer_add_param(l, "W_q", NULL, S(w_q), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
    vitc__layer_add_param(l, "W_k", NULL, S(w_k), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
    vitc__layer_add_param(l, "W_v", NULL, S(w_v), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
    vitc__layer_add_param(l, "W_o", NULL, S(w_o), VITC__INIT_NORMAL01, 0, 0, 2, dk, E, 0, 0);
    return VITC_OK;
}

/* ---- shapes ---------------------------------------------------------- */

vitc_status vitc__engine_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                      int *out_ndim, int64_t out_shape[8]) {
    const vitc__plan *p = &l->plan;
    char want[128];
    if (ndim < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "%s: ndim %d < 0", l->ops->name, ndim);
    for (int i = 0; i < ndim && i < 8; i++)
        if (shape[i] < 1 || shape[i] > ((int64_t)1 << 40))
            return vitc__layer_shape_err(l, ndim, shape, "every dimension >= 1");
    if (p->in == VITC__IN_TOKENS) {
        snprintf(want, sizeof want, "[B, N, %lld]", (long long)p->cin);
        if (ndim != 3 || shape[2] != p->cin)
            return vitc__layer_shape_err(l, ndim, shape, want);
        *out_ndim = 3;
        out_shape[0] = shape[0];
        out_shape[1] = shape[1];
        out_shape[2] = p->cout;
    } else {
        int64_t C = l->cfg.in_channels;
        snprintf(want, sizeof want, "[B, %lld, H, W]", (long long)C);
        if (ndim != 4 || shape[1] != C)
            return vitc__layer_shape_err(l, ndim, shape, want);
        if (p->in == VITC__IN_PATCHES) {
            int64_t k = l->cfg.patch_size;
            if (shape[2] % k || shape[3] % k) {
                snprintf(want, sizeof want, "H and W divisible by patch_size %lld", (long long)k);
                return vitc__layer_shape_err(l, ndim, shape, want);
            }
            *out_ndim = 3;
            out_shape[0] = shape[0];
            out_shape[1] = (shape[2] / k) * (shape[3] / k);
            out_shape[2] = p->cout;
        } else {
            *out_ndim = 4;
            memcpy(out_shape, shape, 4 * sizeof *shape);
        }
    }
    int ok;
    size_t n = vitc__numel(ndim, shape, &ok);
    /* Every later product (tokens x widths) stays far below int64's range. */
    if (!ok || n > ((size_t)1 << 50))
        return vitc__err(VITC_ERR_NOMEM, "%s: input too large", l->ops->name);
    return VITC_OK;
}

/* ---- forward --------------------------------------------------------- */


void vitc__engine_sdpa_desc(const vitc__plan *p, vitc__sdpa_desc *sd, float *qkv, float *o,
                            int64_t B, int64_t N) {
    int64_t H = p->heads, d = p->dq / H, dv = p->dv / H, W3 = 2 * p->dq + p->dv;
    memset(sd, 0, sizeof *sd);
    sd->B = B; sd->H = H; sd->L = N; sd->S = N; sd->D = d; sd->Dv = dv;
    sd->q_sb = sd->k_sb = sd->v_sb = N * W3;
    sd->q_sr = sd->k_sr = sd->v_sr = W3;
    if (p->layout == VITC__HEADS_GROUPED) {
        sd->q = qkv; sd->k = qkv + p->dq; sd->v = qkv + 2 * p->dq;
        sd->q_sh = sd->k_sh = d;
        sd->v_sh = dv;
    } else {
        sd->q = qkv; sd->k = qkv + d; sd->v = qkv + 2 * d;
        sd->q_sh = sd->k_sh = sd->v_sh = 3 * d;
    }
    sd->o = o; sd->o_sb = N * p->dv; sd->o_sh = dv; sd->o_sr = p->dv;
    sd->scale = p->scale;
}

vitc_status vitc__engine_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                                 float *out) {
    l->rec.valid = 0; /* any forward, failed ones included, replaces the record */
    int ond;
    int64_t oshape[8];
    VITC_TRY(vitc__engine_output_shape(l, ndim, shape, &ond, oshape));
    const vitc__plan *p = &l->plan;
    const char *kn = l->ops->name;
    int64_t B = shape[0], N, C = 0, HW = 0;
    if (p->in == VITC__IN_TOKENS) {
        N = shape[1];
    } else {
        C = shape[1];
        HW = shape[2] * shape[3];
        N = p->in == VITC__IN_PATCHES ? oshape[1] : HW;
    }
    if (p->norm == VITC__NORM_BATCH && l->training && B * HW < 2)
        return vitc__err(VITC_ERR_SHAPE,
                         "%s: BatchNorm in training mode needs more than 1 value per channel "
                         "(input [%lld, %lld, %lld, %lld]); call eval() first",
                         kn, (long long)shape[0], (long long)shape[1], (long long)shape[2],
                         (long long)shape[3]);
    int64_t M = B * N, W3 = 2 * p->dq + p->dv;

    /* Regions: normed image, patch columns, tokens, qkv, o, y, statistics;
     * in training, a copy of the input the norm's backward reads. */
    vitc__carve cv = {0, 1};
    size_t o_norm = 0, o_cols = 0, o_tok = 0, o_y = 0, o_stat = 0, o_x = 0;
    if (p->norm != VITC__NORM_NONE) o_norm = vitc__take(&cv, (size_t)B * C, (size_t)HW);
    /* Backward reads the input itself where it feeds a norm or the projections. */
    int keep_x = l->training && (p->norm != VITC__NORM_NONE || p->in == VITC__IN_TOKENS);
    size_t numel_x = p->in == VITC__IN_TOKENS ? (size_t)M * (size_t)p->cin : (size_t)B * C * HW;
    if (keep_x) o_x = vitc__take(&cv, numel_x, 1);
    if (p->in == VITC__IN_PATCHES) o_cols = vitc__take(&cv, (size_t)M, (size_t)C * l->cfg.patch_size * l->cfg.patch_size);
    if (p->in != VITC__IN_TOKENS) o_tok = vitc__take(&cv, (size_t)M, (size_t)p->cin);
    size_t o_qkv = vitc__take(&cv, (size_t)M, (size_t)W3);
    size_t o_o = vitc__take(&cv, (size_t)M, (size_t)p->dv);
    if (p->res == VITC__RES_INPUT && p->outp != VITC__OUT_NONE)
        o_y = vitc__take(&cv, (size_t)M, (size_t)p->cout);
    if (p->norm == VITC__NORM_BATCH) o_stat = vitc__take(&cv, 2, (size_t)C);
    /* Training: each attention row's log-sum-exp, from which backward recomputes P. */
    size_t o_lse = l->training ? vitc__take(&cv, (size_t)(B * p->heads), (size_t)N) : 0;
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "%s: scratch size for this input overflows", kn);
    VITC_TRY(vitc__buf_reserve(&l->scratch, cv.used));
    float *s = l->scratch.p;

    if (keep_x) /* before anything is written: out may be x */
        memcpy(s + o_x, x, numel_x * sizeof(float));

    /* 1. Tokens [B, N, cin]. */
    const float *tok = x; // [B, N, cin]
    const float *img = x; // [B, C, HW] after the norm
    int tokens_done = 0;
    if (p->norm == VITC__NORM_GROUP) {
        /* Inference straight to tokens; training keeps the normalised image,
         * which the norm's backward reads. */
        if (!l->training && p->in == VITC__IN_IMAGE)
            tokens_done = vitc__groupnorm_tokens(s + o_tok, x, l->w.norm_w, l->w.norm_b, B, C,
                                                 HW, 1, l->cfg.eps);
        if (!tokens_done)
            vitc__groupnorm(s + o_norm, x, l->w.norm_w, l->w.norm_b, B, C, HW, 1, l->cfg.eps);
        img = s + o_norm;
    } else if (p->norm == VITC__NORM_BATCH) {
        float *mean = s + o_stat, *var = mean + C; // [C], [C]
        const float *m = l->w.run_mean, *v = l->w.run_var;
        if (l->training) {
            /* torch normalises with the batch's biased variance (the running
             * statistics take the unbiased one, at the end of the call). */
            vitc__channel_stats(mean, var, x, B, C, HW);
            m = mean;
            v = var;
        }
        vitc__batchnorm_apply(s + o_norm, x, m, v, l->w.norm_w, l->w.norm_b, l->cfg.eps, B, C, HW);
        img = s + o_norm;
    }
    if (p->in == VITC__IN_IMAGE) {
        if (!tokens_done) vitc__channels_to_tokens(s + o_tok, img, B, C, HW);
        tok = s + o_tok;
    } else if (p->in == VITC__IN_PATCHES) {
        int64_t k = l->cfg.patch_size, K = C * k * k;
        vitc__patchify(s + o_cols, x, B, C, shape[2], shape[3], k);
        vitc__linear(s + o_tok, p->cin, s + o_cols, K, l->w.w_patch, l->w.b_patch, NULL, 0, M, p->cin, K);
        tok = s + o_tok;
    }

    /* 2. q, k, v packed per token: [B, N, 2*dq + dv]. */
    float *qkv = s + o_qkv; // [B, N, W3]
    switch (p->qkv) {
    case VITC__QKV_SEPARATE:
        vitc__linear(qkv, W3, tok, p->cin, l->w.w_q, l->w.b_q, NULL, 0, M, p->dq, p->cin);
        vitc__linear(qkv + p->dq, W3, tok, p->cin, l->w.w_k, l->w.b_k, NULL, 0, M, p->dq, p->cin);
        vitc__linear(qkv + 2 * p->dq, W3, tok, p->cin, l->w.w_v, l->w.b_v, NULL, 0, M, p->dv, p->cin);
        break;
    case VITC__QKV_FUSED:
        vitc__linear(qkv, W3, tok, p->cin, l->w.w_qkv, l->w.b_qkv, NULL, 0, M, W3, p->cin);
        break;
    case VITC__QKV_MATMUL:
        vitc__gemm(0, 0, M, p->dq, p->cin, 1.0f, tok, p->cin, l->w.w_q, p->dq, 0.0f, qkv, W3);
        vitc__gemm(0, 0, M, p->dq, p->cin, 1.0f, tok, p->cin, l->w.w_k, p->dq, 0.0f, qkv + p->dq, W3);
        vitc__gemm(0, 0, M, p->dv, p->cin, 1.0f, tok, p->cin, l->w.w_v, p->dv, 0.0f,
                   qkv + 2 * p->dq, W3);
        break;
    }

    /* 3. Attention, reading q, k, v where the projection left them. */
    float *o = s + o_o; // [B, N, H, dv]
    vitc__sdpa_desc sd;
    vitc__engine_sdpa_desc(p, &sd, qkv, o, B, N);
    if (l->training) {
        sd.lse = s + o_lse; // [B, H, N]
        sd.lse_sb = p->heads * N;
        sd.lse_sh = N;
    }
    VITC_TRY(vitc__sdpa(&sd));

    /* 4. Output projection (+ the V skip of T2T), then back to the input's layout. */
    float *y = p->res == VITC__RES_INPUT ? s + o_y : out; // [B, N, cout]
    if (p->outp == VITC__OUT_MATMUL)
        vitc__gemm(0, 0, M, p->cout, p->dv, 1.0f, o, p->dv, l->w.w_o, p->cout, 0.0f, y, p->cout);
    else if (p->res == VITC__RES_V)
        vitc__linear(y, p->cout, o, p->dv, l->w.w_o, l->w.b_o, qkv + 2 * p->dq, W3, M, p->cout, p->dv);
    else if (p->outp == VITC__OUT_NONE)
        y = o; /* ConvSA: the attention-weighted v is the output */
    else
        vitc__linear(y, p->cout, o, p->dv, l->w.w_o, l->w.b_o, NULL, 0, M, p->cout, p->dv);
    if (p->res == VITC__RES_INPUT)
        vitc__transpose_add(out, y, x, l->w.gamma ? l->w.gamma[0] : 1.0f, B, C, N);

    /* 5. What backward reads: the regions above stay until the next forward. */
    if (l->training) {
        vitc__record r = {1, ndim, ond, {0}, {0}, o_x, o_norm, o_cols, o_tok, o_qkv, o_o,
                          o_y, o_stat, o_lse};
        memcpy(r.shape, shape, (size_t)ndim * sizeof *shape);
        memcpy(r.out_shape, oshape, (size_t)ond * sizeof *oshape);
        l->rec = r;
    }

    /* 6. BatchNorm's running statistics move only once the call has succeeded. */
    if (p->norm == VITC__NORM_BATCH && l->training) {
        const float *mean = s + o_stat, *var = mean + C; // [C], [C]
        double cnt = (double)B * (double)HW, mom = l->cfg.momentum;
        for (int64_t c = 0; c < C; c++) {
            l->w.run_mean[c] = (float)((1.0 - mom) * l->w.run_mean[c] + mom * mean[c]);
            l->w.run_var[c] = (float)((1.0 - mom) * l->w.run_var[c] + mom * var[c] * cnt / (cnt - 1.0));
        }
    }
    return VITC_OK;
}
