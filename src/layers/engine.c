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
 * Parameters live in one allocation described by a table of {torch name,
 * shape} that drives create, load, reset and state_dict.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/ops_layers.h"
#include "../train/train.h"
#include "layers.h"


static const char *kind_name(vitc_layer_kind k) {
    switch (k) {
    case VITC_ATTENTION_BLOCK: return "AttentionBlock";
    case VITC_CONV_SA_BLOCK: return "ConvSABlock";
    case VITC_SELF_ATTENTION_GROUP: return "SelfAttention(norm=group)";
    case VITC_SELF_ATTENTION_BATCH: return "SelfAttention(norm=batch)";
    case VITC_SELF_ATTENTION_MULTIHEAD: return "SelfAttentionMultiHead";
    case VITC_MULTIHEAD_ATTENTION: return "MultiheadAttention";
    case VITC_T2T_ATTENTION: return "T2TAttention";
    case VITC_SINGLE_HEAD_ATTENTION: return "SingleHeadAttention";
    }
    return "unknown layer";
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

/* ---- parameter table ------------------------------------------------ */

/* A row's slot: where in vitc_layer forward reads the tensor through. */
#define S(field) offsetof(vitc_layer, field)

static void add_param(vitc_layer *l, const char *name, const char *alias, size_t slot,
                      vitc__init init, int64_t fan_in, int64_t fan_out, int ndim, int64_t d0,
                      int64_t d1, int64_t d2, int64_t d3) {
    vitc__param *p = &l->params[l->nparams++];
    p->name = name;
    p->alias = alias;
    p->slot = slot;
    p->layer = -1;
    p->role = l->nparams - 1;
    p->no_decay = ndim <= 1;
    p->init = init;
    p->fan_in = fan_in;
    p->fan_out = fan_out;
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = d2;
    p->shape[3] = d3;
}

/* nn.Linear(in, out, bias) under a prefix ("to_q" -> to_q.weight, to_q.bias). */
#define LINEAR(l, wname, walias, bname, balias, wslot, bslot, in, out, has_bias)                   \
    do {                                                                                         \
        add_param(l, wname, walias, wslot, VITC__INIT_KAIMING, in, out, 2, out, in, 0, 0);       \
        if (has_bias)                                                                            \
            add_param(l, bname, balias, bslot, VITC__INIT_KAIMING, in, out, 1, out, 0, 0, 0);    \
    } while (0)

/* nn.Conv2d(in, out, k) weight [out, in, k, k] and bias. */
#define CONV(l, wname, bname, wslot, bslot, in, out, k)                                          \
    do {                                                                                         \
        add_param(l, wname, NULL, wslot, VITC__INIT_KAIMING, (int64_t)(in) * (k) * (k), out, 4,  \
                  out, in, k, k);                                                                \
        add_param(l, bname, NULL, bslot, VITC__INIT_KAIMING, (int64_t)(in) * (k) * (k), out, 1,  \
                  out, 0, 0, 0);                                                                 \
    } while (0)

static void add_norm(vitc_layer *l, int64_t C, int batch) {
    const char *aw = batch ? NULL : "group_norm.weight", *ab = batch ? NULL : "group_norm.bias";
    add_param(l, "norm.weight", aw, S(norm_w), VITC__INIT_ONE, 0, 0, 1, C, 0, 0, 0);
    add_param(l, "norm.bias", ab, S(norm_b), VITC__INIT_ZERO, 0, 0, 1, C, 0, 0, 0);
    if (batch) {
        add_param(l, "norm.running_mean", NULL, S(run_mean), VITC__INIT_ZERO, 0, 0, 1, C, 0, 0, 0);
        add_param(l, "norm.running_var", NULL, S(run_var), VITC__INIT_ONE, 0, 0, 1, C, 0, 0, 0);
        l->params[l->nparams - 2].buffer = l->params[l->nparams - 1].buffer = 1;
    }
}

static vitc_status bad_config(const vitc_layer_config *c, const char *what) {
    return vitc__err(VITC_ERR_INVALID_ARG, "%s: %s", kind_name(c->kind), what);
}

/* Check the configuration and fill the plan and the parameter table in
 * PyTorch's state_dict order. */
static vitc_status build(vitc_layer *l) {
    const vitc_layer_config *c = &l->cfg;
    vitc__plan *p = &l->plan;
    char msg[160];
    const int64_t big = (int64_t)1 << 24; /* no real layer is wider; keeps size math far from overflow */
    memset(p, 0, sizeof *p);
    p->heads = 1;
    if (c->in_channels < 0 || c->in_channels > big || c->embed_dim < 0 || c->embed_dim > big ||
        c->num_heads < 1 || c->num_heads > big || c->kdim < 0 || c->kdim > big || c->vdim < 0 ||
        c->vdim > big || c->patch_size < 0 || c->patch_size > 4096) {
        snprintf(msg, sizeof msg,
                 "sizes out of range (in_channels %d, embed_dim %d, num_heads %d, kdim %d, "
                 "vdim %d, patch_size %d)",
                 c->in_channels, c->embed_dim, c->num_heads, c->kdim, c->vdim, c->patch_size);
        return bad_config(c, msg);
    }
    if (!(c->eps >= 0.0f) || !(c->momentum >= 0.0f && c->momentum <= 1.0f) || !isfinite(c->qk_scale))
        return bad_config(c, "eps must be >= 0, momentum in [0, 1], qk_scale finite");
    switch (c->kind) {
    case VITC_ATTENTION_BLOCK: {
        int64_t C = c->in_channels, E = c->embed_dim, k = c->patch_size, H = c->num_heads;
        if (C < 1 || E < 1 || k < 1)
            return bad_config(c, "in_channels, embed_dim and patch_size must be >= 1");
        if (E % H) {
            snprintf(msg, sizeof msg, "embed_dim %lld is not divisible by heads %lld", (long long)E,
                     (long long)H);
            return bad_config(c, msg);
        }
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
    case VITC_CONV_SA_BLOCK: {
        int64_t C = c->in_channels, C8 = C / 8;
        if (C < 8) {
            snprintf(msg, sizeof msg, "in_channels %lld < 8 (q and k have in_channels//8 channels)",
                     (long long)C);
            return bad_config(c, msg);
        }
        *p = (vitc__plan){VITC__IN_IMAGE, VITC__NORM_NONE, VITC__QKV_SEPARATE, VITC__HEADS_GROUPED,
                          VITC__OUT_NONE, VITC__RES_INPUT, C, C8, C, C, 1,
                          (float)(1.0 / sqrt((double)C8))};
        /* gamma is the module's own parameter, so torch lists it before the children. */
        add_param(l, "gamma", NULL, S(gamma), VITC__INIT_ZERO, 0, 0, 1, 1, 0, 0, 0);
        CONV(l, "q.weight", "q.bias", S(w_q), S(b_q), C, C8, 1);
        CONV(l, "k.weight", "k.bias", S(w_k), S(b_k), C, C8, 1);
        CONV(l, "v.weight", "v.bias", S(w_v), S(b_v), C, C, 1);
        return VITC_OK;
    }
    case VITC_SELF_ATTENTION_GROUP:
    case VITC_SELF_ATTENTION_BATCH:
    case VITC_SELF_ATTENTION_MULTIHEAD: {
        int64_t C = c->in_channels, H = c->kind == VITC_SELF_ATTENTION_MULTIHEAD ? c->num_heads : 1;
        if (C < 1)
            return bad_config(c, "ni must be >= 1");
        if (C % H) {
            snprintf(msg, sizeof msg, "ni %lld is not divisible by nheads %lld", (long long)C,
                     (long long)H);
            return bad_config(c, msg);
        }
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
    case VITC_MULTIHEAD_ATTENTION: {
        int64_t E = c->embed_dim, H = c->num_heads;
        int64_t kd = c->kdim ? c->kdim : E, vd = c->vdim ? c->vdim : E;
        if (c->in_channels && c->in_channels != c->embed_dim) {
            snprintf(msg, sizeof msg, "in_channels %d differs from embed_dim %d (leave it 0)",
                     c->in_channels, c->embed_dim);
            return bad_config(c, msg);
        }
        if (E < 1)
            return bad_config(c, "embed_dim must be >= 1");
        if (E % H) {
            snprintf(msg, sizeof msg, "embed_dim %lld is not divisible by num_heads %lld",
                     (long long)E, (long long)H);
            return bad_config(c, msg);
        }
        *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE,
                          kd == E && vd == E ? VITC__QKV_FUSED : VITC__QKV_SEPARATE,
                          VITC__HEADS_GROUPED, VITC__OUT_LINEAR, VITC__RES_NONE, E, E, E, E, H,
                          (float)(1.0 / sqrt((double)(E / H)))};
        if (p->qkv == VITC__QKV_FUSED) {
            add_param(l, "in_proj_weight", NULL, S(w_qkv), VITC__INIT_XAVIER, E, 3 * E, 2, 3 * E, E,
                      0, 0);
        } else {
            add_param(l, "q_proj_weight", NULL, S(w_q), VITC__INIT_XAVIER, E, E, 2, E, E, 0, 0);
            add_param(l, "k_proj_weight", NULL, S(w_k), VITC__INIT_XAVIER, kd, E, 2, E, kd, 0, 0);
            add_param(l, "v_proj_weight", NULL, S(w_v), VITC__INIT_XAVIER, vd, E, 2, E, vd, 0, 0);
        }
        if (c->bias)
            add_param(l, "in_proj_bias", NULL, S(b_qkv), VITC__INIT_ZERO, 0, 0, 1, 3 * E, 0, 0, 0);
        add_param(l, "out_proj.weight", NULL, S(w_o), VITC__INIT_KAIMING, E, E, 2, E, E, 0, 0);
        if (c->bias)
            add_param(l, "out_proj.bias", NULL, S(b_o), VITC__INIT_ZERO, 0, 0, 1, E, 0, 0, 0);
        return VITC_OK;
    }
    case VITC_T2T_ATTENTION: {
        int64_t dim = c->in_channels, chan = c->embed_dim, H = c->num_heads;
        if (dim < 1 || chan < 1)
            return bad_config(c, "dim (in_channels) and chan (embed_dim) must be >= 1");
        if (chan % H) {
            snprintf(msg, sizeof msg, "chan %lld is not divisible by num_heads %lld",
                     (long long)chan, (long long)H);
            return bad_config(c, msg);
        }
        /* qk_scale or head_dim ** -0.5: Python's `or` treats 0.0 as absent too. */
        float scale = c->qk_scale != 0.0f ? c->qk_scale : (float)pow((double)(chan / H), -0.5);
        *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE, VITC__QKV_FUSED, VITC__HEADS_GROUPED,
                          VITC__OUT_LINEAR, VITC__RES_V, dim, chan, chan, chan, H, scale};
        LINEAR(l, "qkv.weight", NULL, "qkv.bias", NULL, S(w_qkv), S(b_qkv), dim, 3 * chan,
               c->bias);
        LINEAR(l, "proj.weight", NULL, "proj.bias", NULL, S(w_o), S(b_o), chan, chan, 1);
        return VITC_OK;
    }
    case VITC_SINGLE_HEAD_ATTENTION: {
        int64_t E = c->in_channels, dk = c->embed_dim;
        if (E < 1 || dk < 1)
            return bad_config(c, "embedding_dim (in_channels) and d_k (embed_dim) must be >= 1");
        *p = (vitc__plan){VITC__IN_TOKENS, VITC__NORM_NONE, VITC__QKV_MATMUL, VITC__HEADS_GROUPED,
                          VITC__OUT_MATMUL, VITC__RES_NONE, E, dk, dk, E, 1,
                          (float)(1.0 / sqrt((double)dk))};
        add_param(l, "W_q", NULL, S(w_q), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
        add_param(l, "W_k", NULL, S(w_k), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
        add_param(l, "W_v", NULL, S(w_v), VITC__INIT_NORMAL01, 0, 0, 2, E, dk, 0, 0);
        add_param(l, "W_o", NULL, S(w_o), VITC__INIT_NORMAL01, 0, 0, 2, dk, E, 0, 0);
        return VITC_OK;
    }
    }
    return vitc__err(VITC_ERR_INVALID_ARG, "unknown layer kind %d", (int)c->kind);
}

/* ---- create / free / reset ------------------------------------------ */

vitc_status vitc_layer_reset_parameters(vitc_layer *l, uint64_t seed) {
    if (!l)
        return vitc__err(VITC_ERR_INVALID_ARG, "layer is NULL");
    vitc__params_init(l->params, l->nparams, l->store, seed);
    return VITC_OK;
}

vitc_status vitc_layer_create(const vitc_layer_config *cfg, vitc_layer **out) {
    if (!out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_create: out is NULL");
    *out = NULL;
    if (!cfg)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_create: cfg is NULL");
    vitc_layer *l = calloc(1, sizeof *l);
    if (!l)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a layer");
    l->cfg = *cfg;
    l->training = 1;
    vitc_status st = build(l);
    if (st != VITC_OK) {
        free(l);
        return st;
    }
    size_t total = 0;
    if (vitc__params_layout(l->params, l->nparams, &total) != VITC_OK) {
        vitc__err_prefix(VITC_ERR_NOMEM, "%s", kind_name(cfg->kind));
        free(l);
        return VITC_ERR_NOMEM;
    }
    l->store_len = total;
    l->store = vitc__calloc(total ? total : 1, sizeof(float));
    l->id = vitc__handle_register();
    if (!l->store || !l->id) {
        vitc__free(l->store);
        vitc__handle_unregister(l->id);
        free(l);
        return vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate %zu parameters",
                         kind_name(cfg->kind), total);
    }
    vitc__params_bind(l->params, l->nparams, l->store, l, NULL, 0);
    for (int i = 0; i < l->nparams; i++)
        if (!l->params[i].buffer)
            l->train[l->ntrain++] = l->params[i];
    if (l->plan.qkv == VITC__QKV_SEPARATE && cfg->kind == VITC_MULTIHEAD_ATTENTION && l->b_qkv) {
        /* in_proj_bias.chunk(3) */
        l->b_q = l->b_qkv;
        l->b_k = l->b_qkv + cfg->embed_dim;
        l->b_v = l->b_qkv + 2 * (int64_t)cfg->embed_dim;
    }
    vitc_layer_reset_parameters(l, 0);
    *out = l;
    return VITC_OK;
}

void vitc_layer_free(vitc_layer *l) {
    if (!l)
        return;
    vitc__handle_unregister(l->id);
    vitc__free(l->store);
    vitc__free(l->grad);
    vitc__buf_free(&l->scratch);
    free(l);
}

const vitc_layer_config *vitc_layer_get_config(const vitc_layer *l) { return l ? &l->cfg : NULL; }
int vitc_layer_num_params(const vitc_layer *l) { return l ? l->nparams : 0; }

vitc_status vitc_layer_param(vitc_layer *l, int i, const char **name, int *ndim,
                             const int64_t **shape, float **data) {
    if (!l || i < 0 || i >= l->nparams)
        return vitc__err(VITC_ERR_INVALID_ARG, "parameter index %d out of range [0, %d)", i,
                         l ? l->nparams : 0);
    const vitc__param *p = &l->params[i];
    if (name) *name = p->name;
    if (ndim) *ndim = p->ndim;
    if (shape) *shape = p->shape;
    if (data) *data = l->store + p->offset;
    return VITC_OK;
}

void vitc_layer_set_training(vitc_layer *l, int training) {
    if (l) l->training = training != 0;
}
int vitc_layer_is_training(const vitc_layer *l) { return l ? l->training : 0; }

vitc_status vitc__layer_paramset(vitc_layer *l, int with_grad, vitc__paramset *out) {
    if (!l || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc__layer_paramset: NULL argument");
    if (with_grad && !l->grad) {
        l->grad = vitc__calloc(l->store_len ? l->store_len : 1, sizeof(float));
        if (!l->grad)
            return vitc__err(VITC_ERR_NOMEM, "%s: cannot allocate %zu gradients",
                             kind_name(l->cfg.kind), l->store_len);
    }
    *out = (vitc__paramset){.param = l->store, .grad = l->grad, .n = l->store_len,
                            .seg = l->train, .nseg = l->ntrain, .owner_id = l->id};
    return VITC_OK;
}

/* ---- load_state_dict ------------------------------------------------ */


static int ignorable(const char *name) {
    size_t n = strlen(name), m = strlen("num_batches_tracked");
    return n >= m && strcmp(name + n - m, "num_batches_tracked") == 0;
}

vitc_status vitc_layer_load(vitc_layer *l, int n, const char *const *names, const int *ndims,
                            const int64_t *const *shapes, const float *const *data, int strict) {
    if (!l || n < 0 || (n > 0 && (!names || !ndims || !shapes || !data)))
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_load: NULL layer or arrays");
    const char *kn = kind_name(l->cfg.kind);
    int src[VITC__MAX_PARAMS];
    char a[96], b[96];
    /* Check everything first, so a failed load leaves the weights untouched. */
    for (int i = 0; i < l->nparams; i++) {
        const vitc__param *p = &l->params[i];
        src[i] = -1;
        for (int j = 0; j < n && src[i] < 0; j++) {
            if (!names[j])
                return vitc__err(VITC_ERR_INVALID_ARG, "%s: tensor name %d is NULL", kn, j);
            if (strcmp(names[j], p->name) == 0 || (p->alias && strcmp(names[j], p->alias) == 0))
                src[i] = j;
        }
        if (src[i] < 0)
            return vitc__err(VITC_ERR_KEY, "%s: missing key \"%s\" (expected shape %s)", kn,
                             p->name, vitc__param_shape_str(p, a, sizeof a));
        int j = src[i];
        int same = ndims[j] == p->ndim && (p->ndim == 0 || shapes[j]);
        for (int d = 0; same && d < p->ndim; d++) same = shapes[j][d] == p->shape[d];
        if (!same || !data[j]) {
            if (ndims[j] < 0 || ndims[j] > 8 || (ndims[j] > 0 && !shapes[j]))
                return vitc__err(VITC_ERR_SHAPE, "%s: key \"%s\" has a bad shape (ndim %d)", kn,
                                 names[j], ndims[j]);
            if (!data[j])
                return vitc__err(VITC_ERR_INVALID_ARG, "%s: key \"%s\" has no data", kn, names[j]);
            return vitc__err(VITC_ERR_SHAPE, "%s: key \"%s\" has shape %s, expected %s", kn,
                             names[j], vitc__shape_str(a, sizeof a, ndims[j], shapes[j]),
                             vitc__param_shape_str(p, b, sizeof b));
        }
    }
    for (int j = 0; j < n && strict; j++) {
        int used = ignorable(names[j]);
        for (int i = 0; i < l->nparams && !used; i++) used = src[i] == j;
        if (!used) {
            /* A second spelling of a loaded tensor ("query.weight" beside "q.weight") says so. */
            for (int i = 0; i < l->nparams; i++) {
                const vitc__param *p = &l->params[i];
                if (strcmp(names[j], p->name) == 0 || (p->alias && strcmp(names[j], p->alias) == 0))
                    return vitc__err(VITC_ERR_KEY, "%s: key \"%s\" duplicates \"%s\"", kn, names[j],
                                     names[src[i]]);
            }
            int nd = ndims[j] >= 0 && ndims[j] <= 8 && shapes[j] ? ndims[j] : 0;
            return vitc__err(VITC_ERR_KEY, "%s: unexpected key \"%s\" (shape %s)", kn, names[j],
                             vitc__shape_str(a, sizeof a, nd, shapes[j]));
        }
    }
    for (int i = 0; i < l->nparams; i++)
        memcpy(l->store + l->params[i].offset, data[src[i]], l->params[i].numel * sizeof(float));
    return VITC_OK;
}

vitc_status vitc_layer_load_safetensors(vitc_layer *l, const vitc_safetensors *st,
                                        const char *prefix, int strict) {
    if (!l || !st)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_load_safetensors: NULL argument");
    int total = vitc_safetensors_count(st), n = 0;
    size_t plen = prefix ? strlen(prefix) : 0;
    const char **names = calloc((size_t)total + 1, sizeof *names);
    int *ndims = calloc((size_t)total + 1, sizeof *ndims);
    const int64_t **shapes = calloc((size_t)total + 1, sizeof *shapes);
    const float **data = calloc((size_t)total + 1, sizeof *data);
    vitc_status s = VITC_OK;
    if (!names || !ndims || !shapes || !data) {
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate the tensor list");
        goto done;
    }
    for (int i = 0; i < total; i++) {
        const char *name, *dtype;
        s = vitc_safetensors_tensor(st, i, &name, &dtype, &ndims[n], &shapes[n], &data[n]);
        if (s != VITC_OK)
            goto done;
        /* Only the prefix's tensors belong to this layer; the rest of a file is not unexpected. */
        if (plen && strncmp(name, prefix, plen) != 0)
            continue;
        names[n++] = name + plen;
    }
    s = vitc_layer_load(l, n, names, ndims, shapes, data, strict);
done:
    free(names);
    free(ndims);
    free(shapes);
    free(data);
    return s;
}

/* ---- shapes ---------------------------------------------------------- */

static vitc_status shape_err(const vitc_layer *l, int ndim, const int64_t *shape,
                             const char *expected) {
    char a[160];
    return vitc__err(VITC_ERR_SHAPE, "%s: input has shape %s, expected %s", kind_name(l->cfg.kind),
                     vitc__shape_str(a, sizeof a, ndim > 8 ? 8 : ndim, shape), expected);
}

vitc_status vitc_layer_output_shape(const vitc_layer *l, int ndim, const int64_t *shape,
                                    int *out_ndim, int64_t out_shape[8]) {
    if (!l || !shape || !out_ndim || !out_shape || ndim < 0)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_output_shape: NULL argument");
    const vitc__plan *p = &l->plan;
    char want[128];
    if (l->cfg.kind == VITC_MULTIHEAD_ATTENTION)
        return vitc__mha_check_shape(l, ndim, shape, out_ndim, out_shape);
    for (int i = 0; i < ndim && i < 8; i++)
        if (shape[i] < 1 || shape[i] > ((int64_t)1 << 40))
            return shape_err(l, ndim, shape, "every dimension >= 1");
    if (p->in == VITC__IN_TOKENS) {
        snprintf(want, sizeof want, "[B, N, %lld]", (long long)p->cin);
        if (ndim != 3 || shape[2] != p->cin)
            return shape_err(l, ndim, shape, want);
        *out_ndim = 3;
        out_shape[0] = shape[0];
        out_shape[1] = shape[1];
        out_shape[2] = p->cout;
    } else {
        int64_t C = l->cfg.in_channels;
        snprintf(want, sizeof want, "[B, %lld, H, W]", (long long)C);
        if (ndim != 4 || shape[1] != C)
            return shape_err(l, ndim, shape, want);
        if (p->in == VITC__IN_PATCHES) {
            int64_t k = l->cfg.patch_size;
            if (shape[2] % k || shape[3] % k) {
                snprintf(want, sizeof want, "H and W divisible by patch_size %lld", (long long)k);
                return shape_err(l, ndim, shape, want);
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
        return vitc__err(VITC_ERR_NOMEM, "%s: input too large", kind_name(l->cfg.kind));
    return VITC_OK;
}

/* ---- forward --------------------------------------------------------- */

/* Scratch carve-out: consecutive regions of one buffer, sizes checked. */
typedef struct { size_t used; int ok; } carve;
static size_t take(carve *c, size_t a, size_t b) {
    size_t n, at = c->used;
    if (!vitc__mul_size(a, b, &n) || !vitc__add_size(n, 15, &n))
        c->ok = 0;
    n &= ~(size_t)15;
    if (!vitc__add_size(c->used, n, &c->used))
        c->ok = 0;
    return at;
}

vitc_status vitc_layer_forward(vitc_layer *l, const float *x, int ndim, const int64_t *shape,
                               float *out) {
    if (!l || !x || !shape || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_layer_forward: NULL argument");
    if (l->cfg.kind == VITC_MULTIHEAD_ATTENTION)
        return vitc__mha_self_forward(l, x, ndim, shape, out);
    int ond;
    int64_t oshape[8];
    VITC_TRY(vitc_layer_output_shape(l, ndim, shape, &ond, oshape));
    const vitc__plan *p = &l->plan;
    const char *kn = kind_name(l->cfg.kind);
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

    /* Regions: normed image, patch columns, tokens, qkv, o, y, statistics. */
    carve cv = {0, 1};
    size_t o_norm = 0, o_cols = 0, o_tok = 0, o_y = 0, o_stat = 0;
    if (p->norm != VITC__NORM_NONE) o_norm = take(&cv, (size_t)B * C, (size_t)HW);
    if (p->in == VITC__IN_PATCHES) o_cols = take(&cv, (size_t)M, (size_t)C * l->cfg.patch_size * l->cfg.patch_size);
    if (p->in != VITC__IN_TOKENS) o_tok = take(&cv, (size_t)M, (size_t)p->cin);
    size_t o_qkv = take(&cv, (size_t)M, (size_t)W3);
    size_t o_o = take(&cv, (size_t)M, (size_t)p->dv);
    if (p->res == VITC__RES_INPUT && p->outp != VITC__OUT_NONE)
        o_y = take(&cv, (size_t)M, (size_t)p->cout);
    if (p->norm == VITC__NORM_BATCH) o_stat = take(&cv, 2, (size_t)C);
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "%s: scratch size for this input overflows", kn);
    VITC_TRY(vitc__buf_reserve(&l->scratch, cv.used));
    float *s = l->scratch.p;

    /* 1. Tokens [B, N, cin]. */
    const float *tok = x; // [B, N, cin]
    const float *img = x; // [B, C, HW] after the norm
    if (p->norm == VITC__NORM_GROUP) {
        vitc__groupnorm(s + o_norm, x, l->norm_w, l->norm_b, B, C, HW, 1, l->cfg.eps);
        img = s + o_norm;
    } else if (p->norm == VITC__NORM_BATCH) {
        float *mean = s + o_stat, *var = mean + C; // [C], [C]
        const float *m = l->run_mean, *v = l->run_var;
        if (l->training) {
            /* torch normalises with the batch's biased variance (the running
             * statistics take the unbiased one, at the end of the call). */
            vitc__channel_stats(mean, var, x, B, C, HW);
            m = mean;
            v = var;
        }
        vitc__batchnorm_apply(s + o_norm, x, m, v, l->norm_w, l->norm_b, l->cfg.eps, B, C, HW);
        img = s + o_norm;
    }
    if (p->in == VITC__IN_IMAGE) {
        vitc__channels_to_tokens(s + o_tok, img, B, C, HW);
        tok = s + o_tok;
    } else if (p->in == VITC__IN_PATCHES) {
        int64_t k = l->cfg.patch_size, K = C * k * k;
        vitc__patchify(s + o_cols, x, B, C, shape[2], shape[3], k);
        vitc__linear(s + o_tok, p->cin, s + o_cols, K, l->w_patch, l->b_patch, NULL, 0, M, p->cin, K);
        tok = s + o_tok;
    }

    /* 2. q, k, v packed per token: [B, N, 2*dq + dv]. */
    float *qkv = s + o_qkv; // [B, N, W3]
    switch (p->qkv) {
    case VITC__QKV_SEPARATE:
        vitc__linear(qkv, W3, tok, p->cin, l->w_q, l->b_q, NULL, 0, M, p->dq, p->cin);
        vitc__linear(qkv + p->dq, W3, tok, p->cin, l->w_k, l->b_k, NULL, 0, M, p->dq, p->cin);
        vitc__linear(qkv + 2 * p->dq, W3, tok, p->cin, l->w_v, l->b_v, NULL, 0, M, p->dv, p->cin);
        break;
    case VITC__QKV_FUSED:
        vitc__linear(qkv, W3, tok, p->cin, l->w_qkv, l->b_qkv, NULL, 0, M, W3, p->cin);
        break;
    case VITC__QKV_MATMUL:
        vitc__gemm(0, 0, M, p->dq, p->cin, 1.0f, tok, p->cin, l->w_q, p->dq, 0.0f, qkv, W3);
        vitc__gemm(0, 0, M, p->dq, p->cin, 1.0f, tok, p->cin, l->w_k, p->dq, 0.0f, qkv + p->dq, W3);
        vitc__gemm(0, 0, M, p->dv, p->cin, 1.0f, tok, p->cin, l->w_v, p->dv, 0.0f,
                   qkv + 2 * p->dq, W3);
        break;
    }

    /* 3. Attention, reading q, k, v where the projection left them. */
    int64_t H = p->heads, d = p->dq / H, dv = p->dv / H;
    float *o = s + o_o; // [B, N, H, dv]
    vitc__sdpa_desc sd = {0};
    sd.B = B; sd.H = H; sd.L = N; sd.S = N; sd.D = d; sd.Dv = dv;
    sd.q_sb = sd.k_sb = sd.v_sb = N * W3;
    sd.q_sr = sd.k_sr = sd.v_sr = W3;
    if (p->layout == VITC__HEADS_GROUPED) {
        sd.q = qkv; sd.k = qkv + p->dq; sd.v = qkv + 2 * p->dq;
        sd.q_sh = sd.k_sh = d;
        sd.v_sh = dv;
    } else {
        sd.q = qkv; sd.k = qkv + d; sd.v = qkv + 2 * d;
        sd.q_sh = sd.k_sh = sd.v_sh = 3 * d;
    }
    sd.o = o; sd.o_sb = N * p->dv; sd.o_sh = dv; sd.o_sr = p->dv;
    sd.scale = p->scale;
    VITC_TRY(vitc__sdpa(&sd));

    /* 4. Output projection (+ the V skip of T2T), then back to the input's layout. */
    float *y = p->res == VITC__RES_INPUT ? s + o_y : out; // [B, N, cout]
    if (p->outp == VITC__OUT_MATMUL)
        vitc__gemm(0, 0, M, p->cout, p->dv, 1.0f, o, p->dv, l->w_o, p->cout, 0.0f, y, p->cout);
    else if (p->res == VITC__RES_V)
        vitc__linear(y, p->cout, o, p->dv, l->w_o, l->b_o, qkv + 2 * p->dq, W3, M, p->cout, p->dv);
    else if (p->outp == VITC__OUT_NONE)
        y = o; /* ConvSA: the attention-weighted v is the output */
    else
        vitc__linear(y, p->cout, o, p->dv, l->w_o, l->b_o, NULL, 0, M, p->cout, p->dv);
    if (p->res == VITC__RES_INPUT)
        vitc__transpose_add(out, y, x, l->gamma ? l->gamma[0] : 1.0f, B, C, N);

    /* 5. BatchNorm's running statistics move only once the call has succeeded. */
    if (p->norm == VITC__NORM_BATCH && l->training) {
        const float *mean = s + o_stat, *var = mean + C; // [C], [C]
        double cnt = (double)B * (double)HW, mom = l->cfg.momentum;
        for (int64_t c = 0; c < C; c++) {
            l->run_mean[c] = (float)((1.0 - mom) * l->run_mean[c] + mom * mean[c]);
            l->run_var[c] = (float)((1.0 - mom) * l->run_var[c] + mom * var[c] * cnt / (cnt - 1.0));
        }
    }
    return VITC_OK;
}
