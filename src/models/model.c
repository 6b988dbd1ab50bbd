/*
 * model.c — the model core every ViT family shares: allocation, the one
 * parameter table (built from the family's rows and names), labels, the
 * file-shape helper, reading a file in the table's own names (adopting its
 * arena or copying it out, packing for a precision while reading), and
 * vitc_vit_reset_head. Nothing here knows a family by name: a family's
 * differences reach it through m's options and m->fam (family.h).
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../train/train.h"
#include "family.h"
#include "vit_config.h"

/* ------------------------------------------------------------------ */
/* Names                                                              */
/* ------------------------------------------------------------------ */

/* torchvision's keys: the canonical spelling (vitc_vit_create, the Hub
 * families' tables, vitc_vit_save) */
const char *const vitc__canonical_model_names[VIT_P_T2T0] = {
    VITC__MODEL_NAMES("class_token", "conv_proj", "encoder.pos_embedding", "dist_token",
                      "reg_token", "ln_pre", "encoder.ln", "heads.head", "heads.head_dist"),
    VITC__TIMM_MAP_NAMES,
    VITC__WB(VIT_P_CLF, "classifier"),
};
const char *const vitc__canonical_layer_names[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("ln_1", "self_attention.in_proj_weight", "self_attention.in_proj_bias",
                      "self_attention.out_proj", "ln_2", "mlp.0", "mlp.3"),
    [VIT_L_LS1] = "ls1.gamma",
    [VIT_L_LS2] = "ls2.gamma",
};

const char *vitc__vit_canonical_name(const vitc__param *e, char *buf, size_t cap) {
    if (e->layer < 0) {
        snprintf(buf, cap, "%s",
                 e->role < VIT_P_T2T0 ? vitc__canonical_model_names[e->role] : "(none)");
    } else {
        snprintf(buf, cap, "encoder.layers.encoder_layer_%d.%s", e->layer,
                 vitc__canonical_layer_names[e->role]);
    }
    return buf;
}

const char *vitc__vit_entry_name(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap) {
    if (m->fam && m->fam->row_name)
        return m->fam->row_name(m, e, buf, cap);
    return vitc__vit_canonical_name(e, buf, cap);
}

/* ------------------------------------------------------------------ */
/* The parameter table                                                */
/* ------------------------------------------------------------------ */

static void vit_set_shape(vitc__param *e, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t s[4] = {a, b, c, d};
    e->ndim = ndim;
    for (int i = 0; i < 4; i++) e->shape[i] = i < ndim ? s[i] : 0;
}

static const size_t model_slot[VIT_P_T2T0] = {
    [VIT_P_CLS] = offsetof(vitc__vit_w, cls),
    [VIT_P_CONV_W] = offsetof(vitc__vit_w, conv_w),
    [VIT_P_CONV_B] = offsetof(vitc__vit_w, conv_b),
    [VIT_P_POS] = offsetof(vitc__vit_w, pos),
    [VIT_P_DIST] = offsetof(vitc__vit_w, dist),
    [VIT_P_REG] = offsetof(vitc__vit_w, reg),
    [VIT_P_PRE_W] = offsetof(vitc__vit_w, pre_w),
    [VIT_P_PRE_B] = offsetof(vitc__vit_w, pre_b),
    [VIT_P_LN_W] = offsetof(vitc__vit_w, ln_w),
    [VIT_P_LN_B] = offsetof(vitc__vit_w, ln_b),
    [VIT_P_HEAD_W] = offsetof(vitc__vit_w, head_w),
    [VIT_P_HEAD_B] = offsetof(vitc__vit_w, head_b),
    [VIT_P_HEAD2_W] = offsetof(vitc__vit_w, head2_w),
    [VIT_P_HEAD2_B] = offsetof(vitc__vit_w, head2_b),
    [VIT_P_MAP_PROBE] = offsetof(vitc__vit_w, map_probe),
    [VIT_P_MAP_QKV_W] = offsetof(vitc__vit_w, map_qkv_w),
    [VIT_P_MAP_QKV_B] = offsetof(vitc__vit_w, map_qkv_b),
    [VIT_P_MAP_PROJ_W] = offsetof(vitc__vit_w, map_proj_w),
    [VIT_P_MAP_PROJ_B] = offsetof(vitc__vit_w, map_proj_b),
    [VIT_P_MAP_LN_W] = offsetof(vitc__vit_w, map_ln_w),
    [VIT_P_MAP_LN_B] = offsetof(vitc__vit_w, map_ln_b),
    [VIT_P_MAP_FC1_W] = offsetof(vitc__vit_w, map_fc1_w),
    [VIT_P_MAP_FC1_B] = offsetof(vitc__vit_w, map_fc1_b),
    [VIT_P_MAP_FC2_W] = offsetof(vitc__vit_w, map_fc2_w),
    [VIT_P_MAP_FC2_B] = offsetof(vitc__vit_w, map_fc2_b),
    [VIT_P_CLF_W] = offsetof(vitc__vit_w, clf_w),
    [VIT_P_CLF_B] = offsetof(vitc__vit_w, clf_b),
};
static const size_t layer_slot[VIT_L_COUNT] = {
    [VIT_L_LN1_W] = offsetof(vitc__vit_block, ln1_w),
    [VIT_L_LN1_B] = offsetof(vitc__vit_block, ln1_b),
    [VIT_L_QKV_W] = offsetof(vitc__vit_block, qkv_w),
    [VIT_L_QKV_B] = offsetof(vitc__vit_block, qkv_b),
    [VIT_L_PROJ_W] = offsetof(vitc__vit_block, proj_w),
    [VIT_L_PROJ_B] = offsetof(vitc__vit_block, proj_b),
    [VIT_L_LN2_W] = offsetof(vitc__vit_block, ln2_w),
    [VIT_L_LN2_B] = offsetof(vitc__vit_block, ln2_b),
    [VIT_L_FC1_W] = offsetof(vitc__vit_block, fc1_w),
    [VIT_L_FC1_B] = offsetof(vitc__vit_block, fc1_b),
    [VIT_L_FC2_W] = offsetof(vitc__vit_block, fc2_w),
    [VIT_L_FC2_B] = offsetof(vitc__vit_block, fc2_b),
    [VIT_L_LS1] = offsetof(vitc__vit_block, ls1),
    [VIT_L_LS2] = offsetof(vitc__vit_block, ls2),
};

/* The embedding head's output size: the classes, or E under a classifier. */
static int64_t vit_head_rows(const vitc_vit *m) {
    return m->head == VIT_HEAD_LINEAR ? m->embed_dim : m->cfg.num_classes;
}

/* Shape and torchvision's VisionTransformer.__init__ initialisation of a
 * model tensor (conv_proj trunc_normal_(std=sqrt(1/fan_in)), pos_embedding
 * normal_(0.02), class token and head zero). */
static void vit_model_row(vitc__param *e, const vitc_vit *m) {
    const vitc_vit_config *c = &m->cfg;
    int64_t C = c->hidden_dim, g = c->image_size / c->patch_size;
    int64_t fan_in = (int64_t)c->in_channels * c->patch_size * c->patch_size;
    int64_t head_in = (m->head == VIT_HEAD_CLS_MEAN ? 2 : 1) * C;
    e->init = VITC__INIT_ZERO;
    switch (e->role) {
    case VIT_P_CLS:
    case VIT_P_DIST: vit_set_shape(e, 3, 1, 1, C, 0); break;
    case VIT_P_REG: vit_set_shape(e, 3, 1, m->n_reg, C, 0); break;
    case VIT_P_CONV_W:
        vit_set_shape(e, 4, C, c->in_channels, c->patch_size, c->patch_size);
        e->init = VITC__INIT_TRUNC;
        e->init_std = sqrt(1.0 / (double)fan_in);
        break;
    case VIT_P_POS:
        vit_set_shape(e, 3, 1, m->n_prefix - m->n_reg + g * g, C, 0); /* registers have none */
        e->init = VITC__INIT_NORMAL;
        e->init_std = 0.02;
        break;
    case VIT_P_HEAD_W: vit_set_shape(e, 2, vit_head_rows(m), head_in, 0, 0); break;
    case VIT_P_HEAD2_W: vit_set_shape(e, 2, c->num_classes, C, 0, 0); break;
    case VIT_P_HEAD_B: vit_set_shape(e, 1, vit_head_rows(m), 0, 0, 0); break;
    case VIT_P_HEAD2_B:
    case VIT_P_CLF_B: vit_set_shape(e, 1, c->num_classes, 0, 0, 0); break;
    case VIT_P_CLF_W: vit_set_shape(e, 2, c->num_classes, m->embed_dim, 0, 0); break;
    case VIT_P_LN_W:
    case VIT_P_PRE_W:
    case VIT_P_MAP_LN_W: vit_set_shape(e, 1, C, 0, 0, 0); e->init = VITC__INIT_ONE; break;
    case VIT_P_MAP_PROBE: vit_set_shape(e, 3, 1, 1, C, 0); break;
    case VIT_P_MAP_QKV_W: vit_set_shape(e, 2, 3 * C, C, 0, 0); break;
    case VIT_P_MAP_QKV_B: vit_set_shape(e, 1, 3 * C, 0, 0, 0); break;
    case VIT_P_MAP_PROJ_W: vit_set_shape(e, 2, C, C, 0, 0); break;
    case VIT_P_MAP_FC1_W: vit_set_shape(e, 2, c->mlp_dim, C, 0, 0); break;
    case VIT_P_MAP_FC1_B: vit_set_shape(e, 1, c->mlp_dim, 0, 0, 0); break;
    case VIT_P_MAP_FC2_W: vit_set_shape(e, 2, C, c->mlp_dim, 0, 0); break;
    default: vit_set_shape(e, 1, C, 0, 0, 0); break; /* conv bias, final LayerNorm bias */
    }
    e->no_decay = e->ndim == 1 || e->role == VIT_P_CLS || e->role == VIT_P_POS ||
                  e->role == VIT_P_DIST || e->role == VIT_P_REG;
}

/* The same for a block tensor: MHA's in_proj xavier_uniform_ and zero biases,
 * out_proj.weight nn.Linear's default, MLPBlock's xavier_uniform_ weights
 * and normal_(std=1e-6) biases, LayerNorms one and zero. */
static void vit_layer_row(vitc__param *e, const vitc_vit_config *c, int swiglu) {
    int64_t C = c->hidden_dim, M = c->mlp_dim;
    e->init = VITC__INIT_ZERO;
    switch (e->role) {
    case VIT_L_QKV_W:
        vit_set_shape(e, 2, 3 * C, C, 0, 0);
        e->init = VITC__INIT_XAVIER, e->fan_in = C, e->fan_out = 3 * C;
        break;
    case VIT_L_QKV_B: vit_set_shape(e, 1, 3 * C, 0, 0, 0); break;
    case VIT_L_PROJ_W:
        vit_set_shape(e, 2, C, C, 0, 0);
        e->init = VITC__INIT_KAIMING, e->fan_in = C, e->fan_out = C;
        break;
    case VIT_L_FC1_W:
        vit_set_shape(e, 2, M, C, 0, 0);
        e->init = VITC__INIT_XAVIER, e->fan_in = C, e->fan_out = M;
        break;
    case VIT_L_FC2_W: /* SwiGLU: fc2 reads the gated half */
        vit_set_shape(e, 2, C, swiglu ? M / 2 : M, 0, 0);
        e->init = VITC__INIT_XAVIER, e->fan_in = swiglu ? M / 2 : M, e->fan_out = C;
        break;
    case VIT_L_FC1_B:
    case VIT_L_FC2_B:
        vit_set_shape(e, 1, e->role == VIT_L_FC1_B ? M : C, 0, 0, 0);
        e->init = VITC__INIT_NORMAL, e->init_std = 1e-6;
        break;
    case VIT_L_LN1_W:
    case VIT_L_LN2_W:
    case VIT_L_LS1:
    case VIT_L_LS2: vit_set_shape(e, 1, C, 0, 0, 0); e->init = VITC__INIT_ONE; break;
    default: vit_set_shape(e, 1, C, 0, 0, 0); break;
    }
    e->no_decay = e->ndim == 1;
}

/* Whether the model has the row of role i (vit_internal.h); the family's
 * own rows (T2T's token module) by its answer. */
static int vit_has_row(const vitc_vit *m, int i) {
    vitc__vit_head emb = m->head == VIT_HEAD_LINEAR ? m->embed_head : m->head;
    if (i >= VIT_P_T2T0)
        return m->fam && m->fam->has_row ? m->fam->has_row(m, i) : 0;
    if (i == VIT_P_CLS)
        return m->n_cls;
    if (i == VIT_P_CONV_W || i == VIT_P_CONV_B) /* an embed hook replaces conv_proj */
        return !(m->fam && m->fam->embed);
    if (i == VIT_P_CLF_W || i == VIT_P_CLF_B)
        return m->head == VIT_HEAD_LINEAR;
    if (i >= VIT_P_MAP_PROBE)
        return emb == VIT_HEAD_MAP;
    if (i == VIT_P_DIST)
        return m->n_dist;
    if (i == VIT_P_REG)
        return m->n_reg > 0;
    if (i == VIT_P_PRE_W || i == VIT_P_PRE_B)
        return m->pre_norm;
    if (i == VIT_P_HEAD_W || i == VIT_P_HEAD_B)
        return emb != VIT_HEAD_NONE && emb != VIT_HEAD_MAP;
    if (i == VIT_P_HEAD2_W || i == VIT_P_HEAD2_B)
        return m->head == VIT_HEAD_MEAN2;
    return 1;
}

vitc_status vitc__vit_table_build(vitc_vit *m) {
    const vitc_vit_config *c = &m->cfg;
    int per_layer = VIT_L_COUNT - (m->layer_scale ? 0 : 2);
    int n = c->depth * per_layer; /* depth <= VIT_MAX_DEPTH: no overflow */
    for (int i = 0; i < VIT_P_COUNT; i++) n += vit_has_row(m, i);
    vitc__param *t = calloc((size_t)n, sizeof *t);
    vitc__vit_block *blocks = calloc((size_t)(c->depth > 0 ? c->depth : 1), sizeof *blocks);
    if (!t || !blocks) {
        free(t);
        free(blocks);
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate the parameter table (%d entries)", n);
    }
    int k = 0;
    for (int i = VIT_P_T2T0; i < VIT_P_COUNT; i++) /* a family's token module first */
        if (vit_has_row(m, i))
            t[k++] = (vitc__param){.role = i, .layer = -1};
    for (int i = VIT_P_CLS; i <= VIT_P_PRE_B; i++)
        if (vit_has_row(m, i))
            t[k++] = (vitc__param){.role = i, .layer = -1};
    for (int l = 0; l < c->depth; l++)
        for (int i = 0; i < per_layer; i++) t[k++] = (vitc__param){.role = i, .layer = l};
    for (int i = VIT_P_LN_W; i < VIT_P_T2T0; i++)
        if (vit_has_row(m, i))
            t[k++] = (vitc__param){.role = i, .layer = -1};
    /* Names, in the file's spelling, in one buffer (each under 160 bytes). */
    char buf[160];
    size_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += strlen(vitc__vit_entry_name(m, &t[i], buf, sizeof buf)) + 1;
    char *names = malloc(bytes), *at = names;
    if (!names) {
        free(t);
        free(blocks);
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate the parameter names (%zu bytes)", bytes);
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(vitc__vit_entry_name(m, &t[i], buf, sizeof buf)) + 1;
        memcpy(at, buf, len);
        t[i].name = at;
        at += len;
        if (t[i].layer < 0 && t[i].role >= VIT_P_T2T0) {
            m->fam->row(&t[i], m); /* shape, init and slot */
        } else if (t[i].layer < 0) {
            vit_model_row(&t[i], m);
            t[i].slot = model_slot[t[i].role];
        } else {
            vit_layer_row(&t[i], c, m->swiglu);
            t[i].slot = layer_slot[t[i].role];
        }
    }
    size_t total;
    vitc_status s = vitc__params_layout(t, n, &total);
    if (s != VITC_OK) {
        free(t);
        free(blocks);
        free(names);
        return vitc__err(VITC_ERR_NOMEM, "ViT parameters: size overflows");
    }
    free(m->table);
    free(m->names);
    free(m->blocks);
    m->table = t;
    m->names = names;
    m->blocks = blocks;
    m->n_entries = n;
    m->n_params = total;
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Config, labels, shapes                                             */
/* ------------------------------------------------------------------ */

vitc_vit *vitc__vit_alloc(void) {
    vitc_vit *m = calloc(1, sizeof *m);
    if (m) {
        m->n_prefix = 1;
        m->n_cls = 1;
        m->head = VIT_HEAD_CLS;
        m->pos_rule = VIT_POS_ALIGN_CORNERS;
    }
    return m;
}

const int64_t *vitc__vit_file_shape(const vitc_safetensors *st, const char *name, int ndim) {
    int i = vitc_safetensors_find(st, name);
    const char *nm, *dt;
    int nd;
    const int64_t *shape;
    const float *data;
    if (i < 0 || vitc_safetensors_tensor(st, i, &nm, &dt, &nd, &shape, &data) != VITC_OK ||
        nd != ndim)
        return NULL;
    for (int k = 0; k < nd; k++)
        if (shape[k] <= 0 || shape[k] > VIT_MAX_DIM)
            return NULL;
    return shape;
}

vitc_status vitc__vit_keep_labels(vitc_vit *m, json_t *arr, const char *what) {
    size_t n = json_array_size(arr), bytes = 0;
    for (size_t i = 0; i < n; i++)
        if (!vitc__add_size(bytes, json_string_length(json_array_get(arr, i)) + 1, &bytes))
            return vitc__err(VITC_ERR_NOMEM, "%s: labels too long", what);
    m->label_text = malloc(bytes ? bytes : 1);
    m->labels = calloc(n ? n : 1, sizeof *m->labels);
    if (!m->label_text || !m->labels)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu labels", n);
    char *p = m->label_text;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_array_get(arr, i);
        size_t len = json_string_length(s);
        memcpy(p, json_string_value(s), len);
        p[len] = '\0';
        m->labels[i] = p;
        p += len + 1;
    }
    return VITC_OK;
}

vitc_status vitc__vit_check_config(const vitc_vit_config *c, int headless) {
    if (headless && c->num_classes)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT config: num_classes = %d for a model "
                         "without head tensors", c->num_classes);
    struct { const char *key; int v; } f[] = {
        {"image_size", c->image_size}, {"patch_size", c->patch_size},
        {"in_channels", c->in_channels}, {"hidden_dim", c->hidden_dim},
        {"depth", c->depth}, {"num_heads", c->num_heads},
        {"mlp_dim", c->mlp_dim}, {"num_classes", headless ? 1 : c->num_classes},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v < 1 || f[i].v > VIT_MAX_DIM)
            return vitc__err(VITC_ERR_INVALID_ARG, "ViT config: %s = %d is out of range [1, %d]",
                             f[i].key, f[i].v, VIT_MAX_DIM);
    if (c->depth > VIT_MAX_DEPTH)
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT config: depth %d is over %d", c->depth,
                         VIT_MAX_DEPTH);
    if (c->hidden_dim % c->num_heads)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "ViT config: hidden_dim %d is not divisible by num_heads %d",
                         c->hidden_dim, c->num_heads);
    if (c->image_size % c->patch_size)
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "ViT config: image_size %d is not a multiple of patch_size %d",
                         c->image_size, c->patch_size);
    if (!(c->norm_eps >= 0.0f && c->norm_eps < 1.0f))
        return vitc__err(VITC_ERR_INVALID_ARG, "ViT config: norm_eps %g is out of range [0, 1)",
                         (double)c->norm_eps);
    for (int i = 0; i < 3; i++)
        if (!(c->std[i] > 0.0f) || !isfinite(c->mean[i]) || !isfinite(c->std[i]))
            return vitc__err(VITC_ERR_INVALID_ARG, "ViT config: mean/std[%d] = %g/%g is invalid", i,
                             (double)c->mean[i], (double)c->std[i]);
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Reading a file in the table's names                                */
/* ------------------------------------------------------------------ */

/* Tensors named "vitc.*" are a training checkpoint's state (optimizer
 * moments, written by `vitc train`), not model weights: the model ignores
 * them, so a checkpoint loads as a model everywhere. */
static int vit_is_train_state(const char *name) { return strncmp(name, "vitc.", 5) == 0; }

/* Every table entry present with its shape; every file tensor used, except
 * training state, counted in *n_extra. */
static vitc_status vit_check_tensors(const vitc_vit *m, const vitc_safetensors *st,
                                     const float **src, int *n_extra) {
    int n = vitc_safetensors_count(st);
    unsigned char *used = calloc((size_t)(n > 0 ? n : 1), 1);
    if (!used)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %d flags", n);
    char name[160], want[96], have[96];
    vitc_status s = VITC_OK;
    for (int i = 0; i < m->n_entries && s == VITC_OK; i++) {
        const vitc__param *e = &m->table[i];
        snprintf(name, sizeof name, "%s", e->name);
        int j = vitc_safetensors_find(st, name);
        const char *nm, *dt;
        int nd;
        const int64_t *shape;
        if (j < 0 && m->no_qkv_bias && e->layer >= 0 && e->role == VIT_L_QKV_B)
            continue; /* qkv_bias false (T2T-ViT): zeros, src[i] NULL */
        if (j < 0) {
            s = vitc__err(VITC_ERR_KEY, "missing tensor %s (expected %s)", name,
                          vitc__shape_str(want, sizeof want, e->ndim, e->shape));
            break;
        }
        s = vitc_safetensors_tensor(st, j, &nm, &dt, &nd, &shape, &src[i]);
        if (s != VITC_OK)
            break;
        int same = nd == e->ndim;
        for (int k = 0; same && k < nd; k++) same = shape[k] == e->shape[k];
        if (!same)
            s = vitc__err(VITC_ERR_SHAPE, "tensor %s: expected %s, file has %s", name,
                          vitc__shape_str(want, sizeof want, e->ndim, e->shape),
                          vitc__shape_str(have, sizeof have, nd, shape));
        used[j] = 1;
    }
    for (int j = 0; j < n && s == VITC_OK; j++) {
        const char *nm, *dt;
        int nd;
        const int64_t *shape;
        const float *data;
        if (used[j] || vitc_safetensors_tensor(st, j, &nm, &dt, &nd, &shape, &data) != VITC_OK)
            continue;
        if (vit_is_train_state(nm)) {
            ++*n_extra;
            continue;
        }
        s = vitc__err(VITC_ERR_KEY, "unexpected tensor %s %s in a %s-named ViT checkpoint", nm,
                      vitc__shape_str(have, sizeof have, nd, shape),
                      m->t2t ? "T2T-ViT" : m->naming == VIT_NAMES_TIMM ? "timm" : "torchvision");
    }
    free(used);
    return s;
}

vitc_status vitc__vit_bind(vitc_vit *m) {
    vitc__params_bind(m->table, m->n_entries, m->params, &m->w, m->blocks, sizeof *m->blocks);
    if (!m->id && !(m->id = vitc__handle_register()))
        return vitc__err(VITC_ERR_NOMEM, "cannot register the model");
    return VITC_OK;
}

/* The adopted file's tensors read one at a time in table order, each
 * Linear weight packed (and its pages given back) before the next is
 * read: the peak holds the converted model plus about one fp32 matrix. */
static vitc_status vit_read_packing(vitc_vit *m, vitc_safetensors *st, vitc_precision prec) {
    vitc_status s = vitc__vit_load_pack_begin(m, prec);
    for (int i = 0; s == VITC_OK && i < m->n_entries; i++) {
        s = vitc__safetensors_read_at(st, m->params + m->table[i].offset);
        if (s == VITC_OK)
            s = vitc__vit_load_pack_row(m, i);
    }
    if (s == VITC_OK)
        s = vitc__safetensors_read_rest(st); /* nothing left: closes the file */
    return vitc__vit_load_pack_end(m, s);
}

/* adopt: the file's converted tensors (one arena, exactly the table's
 * tensors since every one is used) become the flat array, offsets measured
 * from its start; the router hands the file to the model then. */
vitc_status vitc__vit_read_file(vitc_vit *m, vitc__src *src) {
    const vitc_safetensors *st = src->st;
    const float **p = calloc((size_t)m->n_entries, sizeof *p);
    if (!p)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %d pointers", m->n_entries);
    int n_extra = 0;
    vitc_status s = vit_check_tensors(m, st, p, &n_extra);
    size_t bytes = 0;
    /* The adopted span must hold model tensors only: with training state
     * in the file the weights are copied out instead. */
    if (n_extra)
        src->adopt = 0;
    if (s == VITC_OK && src->adopt) {
        const float *lo = p[0], *hi = p[0];
        for (int i = 0; i < m->n_entries; i++) {
            if (p[i] < lo) lo = p[i];
            if (p[i] + m->table[i].numel > hi) hi = p[i] + m->table[i].numel;
        }
        m->params = (float *)lo;
        m->n_params = (size_t)(hi - lo);
        for (int i = 0; i < m->n_entries; i++) m->table[i].offset = (size_t)(p[i] - lo);
    } else if (s == VITC_OK) {
        /* A lazily read file: its tensors in memory first. The file is the
         * router's own then, so writing its data is allowed. */
        if (src->own)
            s = vitc__safetensors_read_rest(src->own);
        if (s != VITC_OK)
            ;
        else if (!vitc__mul_size(m->n_params, sizeof(float), &bytes))
            s = vitc__err(VITC_ERR_NOMEM, "ViT parameters: %zu floats overflow", m->n_params);
        else if (!(m->params = vitc__calloc(m->n_params, sizeof(float))))
            s = vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu bytes of ViT parameters", bytes);
        for (int i = 0; s == VITC_OK && i < m->n_entries; i++)
            if (p[i]) /* else a row of zeros the file does not hold */
                memcpy(m->params + m->table[i].offset, p[i], m->table[i].numel * sizeof(float));
    }
    free(p);
    if (s == VITC_OK)
        s = vitc__vit_bind(m);
    if (s == VITC_OK && src->prec >= 0) {
        if (src->adopt)
            s = vit_read_packing(m, src->own, (vitc_precision)src->prec);
        else /* copied out, the file read whole: packed the usual way */
            s = vitc_vit_set_precision(m, (vitc_precision)src->prec);
    }
    return s;
}

/* ------------------------------------------------------------------ */
/* A fresh classification head                                        */
/* ------------------------------------------------------------------ */

/* The rows a new head replaces: the classifier's, not an embedding head's. */
static int vit_is_new_head_row(const vitc_vit *m, const vitc__param *e) {
    if (e->layer >= 0)
        return 0;
    if (m->head == VIT_HEAD_LINEAR)
        return e->role == VIT_P_CLF_W || e->role == VIT_P_CLF_B;
    return e->role == VIT_P_HEAD_W || e->role == VIT_P_HEAD_B || e->role == VIT_P_HEAD2_W ||
           e->role == VIT_P_HEAD2_B;
}

/* The family's init of the new head rows, from one stream of seed in table
 * order: std < 0: nn.Linear's default (weight and bias U(+-1/sqrt(in)));
 * else the weight normal_(std) (trunc_normal_ with head_trunc; zeros at
 * std 0) and the bias zeros. */
static void vit_init_head(vitc_vit *m, uint64_t seed) {
    vitc__param rows[4];
    int n = 0;
    for (int i = 0; i < m->n_entries && n < 4; i++) {
        if (!vit_is_new_head_row(m, &m->table[i]))
            continue;
        vitc__param e = m->table[i];
        int weight = e.ndim == 2;
        int64_t fan_in = e.role == VIT_P_CLF_W || e.role == VIT_P_CLF_B ? m->embed_dim
                         : e.role == VIT_P_HEAD_W || e.role == VIT_P_HEAD_B
                             ? (m->head == VIT_HEAD_CLS_MEAN ? 2 : 1) * (int64_t)m->cfg.hidden_dim
                             : m->cfg.hidden_dim;
        e.fan_in = fan_in, e.fan_out = m->cfg.num_classes;
        if (m->fam->head_std < 0.0) {
            e.init = VITC__INIT_KAIMING;
        } else if (weight && m->fam->head_std > 0.0) {
            e.init = m->fam->head_trunc ? VITC__INIT_TRUNC : VITC__INIT_NORMAL;
            e.init_std = m->fam->head_std;
        } else {
            e.init = VITC__INIT_ZERO;
        }
        rows[n++] = e;
    }
    vitc__params_init(rows, n, m->params, seed);
}

vitc__vit_head vitc__vit_head_kept(const vitc_vit *m) {
    return m->head == VIT_HEAD_NONE ? VIT_HEAD_CLS : m->head;
}

vitc_status vitc_vit_reset_head(vitc_vit *m, int num_classes, const char *const *labels,
                                uint64_t seed) {
    if (!m)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_reset_head: NULL model");
    if (num_classes < 1 || num_classes > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_reset_head: num_classes %d is out of "
                         "range [1, %d]", num_classes, VIT_MAX_DIM);
    if (!m->fam || (!m->fam->new_head && m->fam->fresh_head == VIT_HEAD_NONE))
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_reset_head: a %s model has no "
                         "classification head layout", m->family);
    /* Labels first: nothing changes when they cannot be kept. */
    size_t bytes = 0;
    for (int i = 0; labels && i < num_classes; i++)
        if (!vitc__add_size(bytes, strlen(labels[i] ? labels[i] : "") + 1, &bytes))
            return vitc__err(VITC_ERR_NOMEM, "vitc_vit_reset_head: labels too long");
    char *text = labels ? malloc(bytes ? bytes : 1) : NULL;
    char **lab = labels ? calloc((size_t)num_classes, sizeof *lab) : NULL;
    if (labels && (!text || !lab)) {
        free(text);
        free(lab);
        return vitc__err(VITC_ERR_NOMEM, "vitc_vit_reset_head: cannot allocate %d labels",
                         num_classes);
    }
    size_t at = 0;
    for (int i = 0; labels && i < num_classes; i++) {
        size_t len = strlen(labels[i] ? labels[i] : "") + 1;
        memcpy(text + at, labels[i] ? labels[i] : "", len);
        lab[i] = text + at;
        at += len;
    }
    /* The row-major weights are the ones copied (packs dropped, rebuilt at
     * the next inference forward for the new table). */
    vitc__vit_rowmajor(m);
    vitc_vit old = *m;
    vitc__vit_head nh = m->fam->new_head ? m->fam->new_head(m) : m->fam->fresh_head;
    if (nh == VIT_HEAD_LINEAR && m->head != VIT_HEAD_LINEAR) {
        /* the embedding head stays under the classifier: CLIP's projection
         * gives num_classes (its projection_dim) floats, SigLIP's MAP head C */
        m->embed_head = m->head;
        m->embed_dim = m->head == VIT_HEAD_PROJ ? m->cfg.num_classes : m->cfg.hidden_dim;
    }
    m->head = nh;
    m->cfg.num_classes = num_classes;
    m->table = NULL, m->names = NULL, m->blocks = NULL, m->params = NULL;
    vitc_status s = vitc__vit_table_build(m);
    if (s == VITC_OK && !(m->params = vitc__calloc(m->n_params, sizeof(float))))
        s = vitc__err(VITC_ERR_NOMEM, "vitc_vit_reset_head: cannot allocate %zu parameters",
                      m->n_params);
    if (s != VITC_OK) { /* back to the model as it was */
        free(m->table);
        free(m->names);
        free(m->blocks);
        vitc__free(m->params);
        *m = old;
        free(text);
        free(lab);
        return s;
    }
    /* Every other row keeps its values: the same (role, layer) of the old table. */
    for (int i = 0, j = 0; i < m->n_entries; i++) {
        const vitc__param *e = &m->table[i];
        if (vit_is_new_head_row(m, e))
            continue;
        for (int k = 0; k < old.n_entries; k++, j = (j + 1) % old.n_entries) {
            const vitc__param *o = &old.table[j];
            if (o->role == e->role && o->layer == e->layer && o->numel == e->numel) {
                memcpy(m->params + e->offset, old.params + o->offset, e->numel * sizeof(float));
                break;
            }
        }
    }
    vit_init_head(m, seed);
    if (old.weights_file) /* the parameters lived in the file's arena */
        vitc_safetensors_free(old.weights_file);
    else
        vitc__free(old.params);
    m->weights_file = NULL;
    free(old.table);
    free(old.names);
    free(old.blocks);
    /* Gradients and a recorded forward belong to the old table. */
    vitc__free(m->grad);
    free(m->gblocks);
    m->grad = NULL, m->gblocks = NULL;
    if (m->own)
        m->own->recorded = 0;
    memset(&m->g, 0, sizeof m->g);
    memset(&m->w, 0, sizeof m->w);
    s = vitc__vit_bind(m);
    m->wversion++;
    free(m->labels);
    free(m->label_text);
    m->labels = lab, m->label_text = text;
    return s;
}

/* ------------------------------------------------------------------ */
/* A saved model's family                                             */
/* ------------------------------------------------------------------ */

vitc_status vitc__vit_family_json(const vitc_vit *m, char **out) {
    *out = NULL;
    /* torchvision's and timm's names with vitc.config say everything */
    if (!m->fam || m->fam == &vitc__family_torchvision || m->fam == &vitc__family_timm)
        return VITC_OK;
    json_t *o = json_object();
    int bad = !o;
    struct { const char *key; int v; } ints[] = {
        {"n_cls", m->n_cls}, {"n_dist", m->n_dist}, {"n_reg", m->n_reg},
        {"layer_scale", m->layer_scale}, {"swiglu", m->swiglu}, {"pre_norm", m->pre_norm},
        {"final_cls_only", m->final_cls_only}, {"mlp_act", m->mlp_act}, {"head", (int)m->head},
        {"embed_head", (int)m->embed_head}, {"embed_dim", m->embed_dim},
        {"pos_rule", (int)m->pos_rule}, {"no_qkv_bias", m->no_qkv_bias},
    };
    bad |= json_object_set_new(o, "family", json_string(m->family));
    bad |= json_object_set_new(o, "arch", json_string(m->arch));
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        bad |= json_object_set_new(o, ints[i].key, json_integer(ints[i].v));
    bad |= json_object_set_new(o, "attn_scale", json_real(m->attn_scale));
    if (m->proc.present) {
        const vitc__hf_proc *p = &m->proc;
        json_t *pp = json_object(), *mean = json_array(), *std = json_array();
        struct { const char *key; int v; } pi[] = {
            {"convert_rgb", p->convert_rgb}, {"do_resize", p->do_resize}, {"size_h", p->size_h},
            {"size_w", p->size_w}, {"shortest", p->shortest}, {"resample", p->resample},
            {"do_crop", p->do_crop}, {"crop_h", p->crop_h}, {"crop_w", p->crop_w},
            {"do_rescale", p->do_rescale}, {"do_normalize", p->do_normalize},
        };
        for (size_t i = 0; i < sizeof pi / sizeof pi[0]; i++)
            bad |= json_object_set_new(pp, pi[i].key, json_integer(pi[i].v));
        bad |= json_object_set_new(pp, "rescale", json_real(p->rescale));
        for (int i = 0; i < 3; i++) {
            bad |= json_array_append_new(mean, json_real(p->mean[i]));
            bad |= json_array_append_new(std, json_real(p->std[i]));
        }
        bad |= json_object_set_new(pp, "mean", mean);
        bad |= json_object_set_new(pp, "std", std);
        bad |= json_object_set_new(o, "processor", pp);
    }
    *out = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(o);
    return *out ? VITC_OK : vitc__err(VITC_ERR_NOMEM, "vitc_vit_save: out of memory");
}

/* f [3] from a JSON array of three numbers (a mean or std); anything else
 * leaves f as it is. Shared by the Hub and single-file config readers. */
void vitc__json_floats3(json_t *a, float *f) {
    if (!json_is_array(a) || json_array_size(a) != 3)
        return;
    for (int i = 0; i < 3; i++)
        if (!json_is_number(json_array_get(a, (size_t)i)))
            return;
    for (int i = 0; i < 3; i++) f[i] = (float)json_number_value(json_array_get(a, (size_t)i));
}
