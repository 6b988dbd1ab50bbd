/*
 * kinds.c — the kind table: for each vitc_layer_kind its vitc__layer_ops
 * (name, parameter table, shapes, forward, backward), and the public calls
 * that differ by kind, which dispatch through the layer's entry. The
 * presets' entries share the engine's shapes, forward and backward;
 * MultiheadAttention is one more entry.
 */
#include <string.h>

#include "layers.h"

#define ENGINE(name, build)                                                                      \
    {name, build, vitc__engine_output_shape, vitc__engine_forward, vitc__engine_backward}

static const vitc__layer_ops attention_block = ENGINE("AttentionBlock", vitc__engine_build_attention_block);
static const vitc__layer_ops conv_sa_block = ENGINE("ConvSABlock", vitc__engine_build_conv_sa);
static const vitc__layer_ops self_attention_group =
    ENGINE("SelfAttention(norm=group)", vitc__engine_build_self_attention);
static const vitc__layer_ops self_attention_batch =
    ENGINE("SelfAttention(norm=batch)", vitc__engine_build_self_attention);
static const vitc__layer_ops self_attention_multihead =
    ENGINE("SelfAttentionMultiHead", vitc__engine_build_self_attention);
static const vitc__layer_ops t2t_attention = ENGINE("T2TAttention", vitc__engine_build_t2t);
static const vitc__layer_ops single_head_attention =
    ENGINE("SingleHeadAttention", vitc__engine_build_single_head);
static const vitc__layer_ops multihead_attention = {
    "MultiheadAttention", vitc__mha_build, vitc__mha_self_output_shape, vitc__mha_self_forward,
    vitc__mha_self_backward};

/* NULL for a kind out of the enum's range. */
static const vitc__layer_ops *ops_of(vitc_layer_kind k) {
    switch (k) {
    case VITC_ATTENTION_BLOCK: return &attention_block;
    case VITC_CONV_SA_BLOCK: return &conv_sa_block;
    case VITC_SELF_ATTENTION_GROUP: return &self_attention_group;
    case VITC_SELF_ATTENTION_BATCH: return &self_attention_batch;
    case VITC_SELF_ATTENTION_MULTIHEAD: return &self_attention_multihead;
    case VITC_MULTIHEAD_ATTENTION: return &multihead_attention;
    case VITC_T2T_ATTENTION: return &t2t_attention;
    case VITC_SINGLE_HEAD_ATTENTION: return &single_head_attention;
    }
    return NULL;
}

vitc_layer_config vitc_layer_default_config(vitc_layer_kind kind) {
    vitc_layer_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.num_heads = 1;
    c.eps = 1e-5f;
    c.momentum = 0.1f;
    switch (kind) {
    case VITC_ATTENTION_BLOCK:
        c.in_channels = 3;
        c.patch_size = 4;
        c.embed_dim = 64;
        break;
    case VITC_MULTIHEAD_ATTENTION:
        c.bias = 1;
        break;
    default:
        break;
    }
    return c;
}


vitc_status vitc_layer_create(const vitc_layer_config *cfg, vitc_layer **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_create: out is NULL");
    *out = NULL;
    if (!cfg)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_create: cfg is NULL");
    const vitc__layer_ops *ops = ops_of(cfg->kind);
    if (!ops)
        return vitc__err(VITC_ERR_INVALID_ARG, "unknown layer kind %d", (int)cfg->kind);
    vitc_layer *l;
    VITC_TRY(vitc__layer_alloc(cfg, ops, &l));
    vitc_status st = ops->build(l);
    if (st == VITC_OK)
        st = vitc__layer_finish(l);
    if (st != VITC_OK) {
        vitc_layer_free(l);
        return st;
    }
    *out = l;
    return VITC_OK;
}

vitc_status vitc_layer_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                    int *out_ndim, int64_t out_shape[8]) {
    if (!l || !shape || !out_ndim || !out_shape || ndim < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_output_shape: NULL argument");
    return l->ops->output_shape(l, ndim, shape, out_ndim, out_shape);
}

vitc_status vitc_layer_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                               float *out) {
    if (!l || !x || !shape || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_forward: NULL argument");
    return l->ops->forward(l, x, ndim, shape, out);
}

vitc_status vitc_layer_backward(vitc_layer *l, const float *dy, int ndim, const int64_t *shape,
                                float *dx) {
    if (!l || !dy || !shape || !dx)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_backward: NULL argument");
    return l->ops->backward(l, dy, ndim, shape, dx);
}
