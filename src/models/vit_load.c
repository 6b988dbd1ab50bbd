/*
 * vit_load.c — a Vision Transformer from a safetensors checkpoint.
 *
 * The architecture comes from __metadata__["vitc.config"] when the file has
 * it, else from a named preset (torchvision or timm), else from the
 * tensors' names and shapes. Then one table of {name, shape} generated from
 * that config is checked against the file, tensor by tensor, before the one
 * parameter allocation is made: a missing, unexpected or mis-shaped tensor
 * is an error naming it and both shapes.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "../train/train.h"
#include "vit_config.h"
#include "vit_internal.h"

/* Sanity bounds on a config read from a file: far above any real ViT, low
 * enough that the table and the size math cannot run away. */
#define VIT_MAX_DIM (1 << 20)
#define VIT_MAX_DEPTH 4096
/* vitc.config's values, labels included: ImageNet-21k's 21,843 labels fit
 * six times over, and jansson's tree for the most stays near 15 MB. */
#define VIT_MAX_CONFIG_ITEMS (1 << 17)

/* ------------------------------------------------------------------ */
/* Names                                                              */
/* ------------------------------------------------------------------ */

#define VIT_MAP_NAMES                                                                          \
    "attn_pool.latent", "attn_pool.qkv.weight", "attn_pool.qkv.bias", "attn_pool.proj.weight",   \
        "attn_pool.proj.bias", "attn_pool.norm.weight", "attn_pool.norm.bias",                   \
        "attn_pool.mlp.fc1.weight", "attn_pool.mlp.fc1.bias", "attn_pool.mlp.fc2.weight",        \
        "attn_pool.mlp.fc2.bias"
static const char *const vit_model_names[3][VIT_P_COUNT] = {
    {"class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding", "dist_token",
     "reg_token", "ln_pre.weight", "ln_pre.bias", "encoder.ln.weight", "encoder.ln.bias",
     "heads.head.weight", "heads.head.bias", "heads.head_dist.weight", "heads.head_dist.bias",
     VIT_MAP_NAMES},
    {"class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding", "dist_token",
     "reg_token", "ln_pre.weight", "ln_pre.bias", "encoder.ln.weight", "encoder.ln.bias",
     "heads.head.weight", "heads.head.bias", "heads.head_dist.weight", "heads.head_dist.bias",
     VIT_MAP_NAMES},
    {"cls_token", "patch_embed.proj.weight", "patch_embed.proj.bias", "pos_embed", "dist_token",
     "reg_token", "norm_pre.weight", "norm_pre.bias", "norm.weight", "norm.bias", "head.weight",
     "head.bias", "head_dist.weight", "head_dist.bias", VIT_MAP_NAMES},
};

static const char *const vit_layer_prefix[3] = {"encoder.layers.encoder_layer_%d.",
                                                "encoder.layers.encoder_layer_%d.", "blocks.%d."};

static const char *const vit_layer_names[3][VIT_L_COUNT] = {
    {"ln_1.weight", "ln_1.bias", "self_attention.in_proj_weight", "self_attention.in_proj_bias",
     "self_attention.out_proj.weight", "self_attention.out_proj.bias", "ln_2.weight", "ln_2.bias",
     "mlp.0.weight", "mlp.0.bias", "mlp.3.weight", "mlp.3.bias", "ls1.gamma", "ls2.gamma"},
    {"ln_1.weight", "ln_1.bias", "self_attention.in_proj_weight", "self_attention.in_proj_bias",
     "self_attention.out_proj.weight", "self_attention.out_proj.bias", "ln_2.weight", "ln_2.bias",
     "mlp.linear_1.weight", "mlp.linear_1.bias", "mlp.linear_2.weight", "mlp.linear_2.bias",
     "ls1.gamma", "ls2.gamma"},
    {"norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
     "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
     "mlp.fc2.weight", "mlp.fc2.bias", "ls1.gamma", "ls2.gamma"},
};

const char *vitc__vit_entry_name(const vitc__param *e, vitc__vit_naming naming, char *buf,
                                 size_t cap) {
    if (e->layer < 0 && e->role >= VIT_P_T2T0)
        return vitc__t2t_name(e->role, naming, buf, cap);
    if (naming > VIT_NAMES_TIMM) /* T2T-ViT's encoder has timm's names */
        naming = VIT_NAMES_TIMM;
    if (e->layer < 0) {
        snprintf(buf, cap, "%s", vit_model_names[naming][e->role]);
    } else {
        int n = snprintf(buf, cap, vit_layer_prefix[naming], e->layer);
        if (n >= 0 && (size_t)n < cap)
            snprintf(buf + n, cap - (size_t)n, "%s", vit_layer_names[naming][e->role]);
    }
    return buf;
}

static const char *vit_layer_name(vitc__vit_naming naming, int layer, int kind, char *buf,
                                  size_t cap) {
    vitc__param e = {.role = kind, .layer = layer};
    return vitc__vit_entry_name(&e, naming, buf, cap);
}

/* ------------------------------------------------------------------ */
/* The parameter table                                                */
/* ------------------------------------------------------------------ */

static void vit_set_shape(vitc__param *e, int ndim, int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t s[4] = {a, b, c, d};
    e->ndim = ndim;
    for (int i = 0; i < 4; i++) e->shape[i] = i < ndim ? s[i] : 0;
}

static const size_t vit_model_slot[VIT_P_COUNT] = {
    offsetof(vitc__vit_w, cls),     offsetof(vitc__vit_w, conv_w),  offsetof(vitc__vit_w, conv_b),
    offsetof(vitc__vit_w, pos),     offsetof(vitc__vit_w, dist),    offsetof(vitc__vit_w, reg),
    offsetof(vitc__vit_w, pre_w),   offsetof(vitc__vit_w, pre_b),   offsetof(vitc__vit_w, ln_w),
    offsetof(vitc__vit_w, ln_b),    offsetof(vitc__vit_w, head_w),  offsetof(vitc__vit_w, head_b),
    offsetof(vitc__vit_w, head2_w), offsetof(vitc__vit_w, head2_b),
    offsetof(vitc__vit_w, map_probe),  offsetof(vitc__vit_w, map_qkv_w),
    offsetof(vitc__vit_w, map_qkv_b),  offsetof(vitc__vit_w, map_proj_w),
    offsetof(vitc__vit_w, map_proj_b), offsetof(vitc__vit_w, map_ln_w),
    offsetof(vitc__vit_w, map_ln_b),   offsetof(vitc__vit_w, map_fc1_w),
    offsetof(vitc__vit_w, map_fc1_b),  offsetof(vitc__vit_w, map_fc2_w),
    offsetof(vitc__vit_w, map_fc2_b)};
static const size_t vit_layer_slot[VIT_L_COUNT] = {
    offsetof(vitc__vit_block, ln1_w),  offsetof(vitc__vit_block, ln1_b),
    offsetof(vitc__vit_block, qkv_w),  offsetof(vitc__vit_block, qkv_b),
    offsetof(vitc__vit_block, proj_w), offsetof(vitc__vit_block, proj_b),
    offsetof(vitc__vit_block, ln2_w),  offsetof(vitc__vit_block, ln2_b),
    offsetof(vitc__vit_block, fc1_w),  offsetof(vitc__vit_block, fc1_b),
    offsetof(vitc__vit_block, fc2_w),  offsetof(vitc__vit_block, fc2_b),
    offsetof(vitc__vit_block, ls1),    offsetof(vitc__vit_block, ls2)};

/* Shape and torchvision's VisionTransformer.__init__ initialisation of a
 * model tensor (conv_proj trunc_normal_(std=sqrt(1/fan_in)), pos_embedding
 * normal_(0.02), class token and head zero). */
static void vit_model_row(vitc__param *e, const vitc_vit_config *c, int n_prefix, int n_reg,
                          int head_in) {
    int64_t C = c->hidden_dim, g = c->image_size / c->patch_size;
    int64_t fan_in = (int64_t)c->in_channels * c->patch_size * c->patch_size;
    e->init = VITC__INIT_ZERO;
    switch (e->role) {
    case VIT_P_CLS:
    case VIT_P_DIST: vit_set_shape(e, 3, 1, 1, C, 0); break;
    case VIT_P_REG: vit_set_shape(e, 3, 1, n_reg, C, 0); break;
    case VIT_P_CONV_W:
        vit_set_shape(e, 4, C, c->in_channels, c->patch_size, c->patch_size);
        e->init = VITC__INIT_TRUNC;
        e->init_std = sqrt(1.0 / (double)fan_in);
        break;
    case VIT_P_POS:
        vit_set_shape(e, 3, 1, n_prefix - n_reg + g * g, C, 0); /* registers have none */
        e->init = VITC__INIT_NORMAL;
        e->init_std = 0.02;
        break;
    case VIT_P_HEAD_W: vit_set_shape(e, 2, c->num_classes, head_in, 0, 0); break;
    case VIT_P_HEAD2_W: vit_set_shape(e, 2, c->num_classes, C, 0, 0); break;
    case VIT_P_HEAD_B:
    case VIT_P_HEAD2_B: vit_set_shape(e, 1, c->num_classes, 0, 0, 0); break;
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

/* Whether the model has the row of role i (vit_internal.h). */
static int vit_has_row(const vitc_vit *m, int i) {
    if (i >= VIT_P_T2T0)
        return vitc__t2t_has_row(m, i);
    if (i == VIT_P_CLS)
        return m->n_cls;
    if (i == VIT_P_CONV_W || i == VIT_P_CONV_B) /* T2T's token module replaces conv_proj */
        return !m->t2t;
    if (i >= VIT_P_MAP_PROBE)
        return m->head == VIT_HEAD_MAP;
    if (i == VIT_P_DIST)
        return m->n_dist;
    if (i == VIT_P_REG)
        return m->n_reg > 0;
    if (i == VIT_P_PRE_W || i == VIT_P_PRE_B)
        return m->pre_norm;
    if (i == VIT_P_HEAD_W || i == VIT_P_HEAD_B)
        return m->head != VIT_HEAD_NONE && m->head != VIT_HEAD_MAP;
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
    for (int i = VIT_P_T2T0; i < VIT_P_COUNT; i++) /* T2T's token module first */
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
        bytes += strlen(vitc__vit_entry_name(&t[i], m->naming, buf, sizeof buf)) + 1;
    char *names = malloc(bytes), *at = names;
    if (!names) {
        free(t);
        free(blocks);
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate the parameter names (%zu bytes)", bytes);
    }
    for (int i = 0; i < n; i++) {
        size_t len = strlen(vitc__vit_entry_name(&t[i], m->naming, buf, sizeof buf)) + 1;
        memcpy(at, buf, len);
        t[i].name = at;
        at += len;
        if (t[i].layer < 0 && t[i].role >= VIT_P_T2T0) {
            vitc__t2t_row(&t[i], m);
            t[i].slot = vitc__t2t_slot(t[i].role);
        } else if (t[i].layer < 0) {
            vit_model_row(&t[i], c, m->n_prefix, m->n_reg,
                          (m->head == VIT_HEAD_CLS_MEAN ? 2 : 1) * c->hidden_dim);
            t[i].slot = vit_model_slot[t[i].role];
        } else {
            vit_layer_row(&t[i], c, m->swiglu);
            t[i].slot = vit_layer_slot[t[i].role];
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
/* Architectures                                                      */
/* ------------------------------------------------------------------ */

typedef struct vit_preset {
    const char *name;
    int timm; /* 1: timm names, mean/std 0.5 */
    int image_size, patch_size, hidden_dim, depth, num_heads, mlp_dim;
} vit_preset;

static const vit_preset vit_presets[] = {
    {"vit_b_16", 0, 224, 16, 768, 12, 12, 3072},
    {"vit_b_32", 0, 224, 32, 768, 12, 12, 3072},
    {"vit_l_16", 0, 224, 16, 1024, 24, 16, 4096},
    {"vit_l_32", 0, 224, 32, 1024, 24, 16, 4096},
    {"vit_h_14", 0, 224, 14, 1280, 32, 16, 5120},
    {"vit_tiny_patch16_224", 1, 224, 16, 192, 12, 3, 768},
    {"vit_small_patch16_224", 1, 224, 16, 384, 12, 6, 1536},
    {"vit_base_patch16_224", 1, 224, 16, 768, 12, 12, 3072},
};
#define VIT_N_PRESETS ((int)(sizeof vit_presets / sizeof vit_presets[0]))

static const float vit_imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
static const float vit_imagenet_std[3] = {0.229f, 0.224f, 0.225f};

static void vit_set_norm(vitc_vit_config *c, int timm) {
    for (int i = 0; i < 3; i++) {
        c->mean[i] = timm ? 0.5f : vit_imagenet_mean[i];
        c->std[i] = timm ? 0.5f : vit_imagenet_std[i];
    }
}

/* The file's tensor `name` when it has `ndim` dims, each in [1, 2^20]
 * (a checkpoint's config is guessed from these shapes), else NULL. */
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

/* Fill what the tensors tell: every field but num_heads (left 0) and the
 * eps/mean/std defaults of the naming. A field whose tensor is missing or
 * odd stays 0; the table check later names that tensor. n_prefix: the
 * position rows before the patch grid (2 with DeiT's distillation token). */
static void vit_infer(const vitc_safetensors *st, vitc__vit_naming nm, int n_prefix,
                      vitc_vit_config *c) {
    char name[160];
    const int64_t *s;
    memset(c, 0, sizeof *c);
    c->norm_eps = 1e-6f;
    vit_set_norm(c, nm == VIT_NAMES_TIMM);
    if ((s = vitc__vit_file_shape(st, vit_model_names[nm][VIT_P_CLS], 3)))
        c->hidden_dim = (int)s[2];
    if ((s = vitc__vit_file_shape(st, vit_model_names[nm][VIT_P_CONV_W], 4))) {
        c->in_channels = (int)s[1];
        c->patch_size = (int)s[2];
        if (!c->hidden_dim)
            c->hidden_dim = (int)s[0];
    }
    if ((s = vitc__vit_file_shape(st, vit_model_names[nm][VIT_P_POS], 3)) && c->patch_size) {
        int64_t g = (int64_t)llround(sqrt((double)(s[1] - n_prefix)));
        if (g * g == s[1] - n_prefix && g * c->patch_size <= VIT_MAX_DIM)
            c->image_size = (int)(g * c->patch_size);
    }
    if ((s = vitc__vit_file_shape(st, vit_model_names[nm][VIT_P_HEAD_W], 2)))
        c->num_classes = (int)s[0];
    if ((s = vitc__vit_file_shape(st, vit_layer_name(nm, 0, VIT_L_FC1_W, name, sizeof name), 2)))
        c->mlp_dim = (int)s[0];
    int d = 0;
    while (d < VIT_MAX_DEPTH &&
           vitc_safetensors_find(st, vit_layer_name(nm, d, VIT_L_QKV_W, name, sizeof name)) >= 0)
        d++;
    c->depth = d;
}

static vitc_status vit_json_int(json_t *obj, const char *key, int *out) {
    json_t *v = json_object_get(obj, key);
    if (!v)
        return VITC_OK;
    double x = json_is_integer(v) ? (double)json_integer_value(v)
               : json_is_real(v)  ? json_real_value(v)
                                  : NAN;
    if (!(x >= 1 && x <= VIT_MAX_DIM) || x != floor(x))
        return vitc__err(VITC_ERR_FORMAT, "vitc.config: \"%s\" must be an integer in [1, %d]", key,
                         VIT_MAX_DIM);
    *out = (int)x;
    return VITC_OK;
}

static vitc_status vit_json_floats(json_t *obj, const char *key, float *out, int n) {
    json_t *v = json_object_get(obj, key);
    if (!v)
        return VITC_OK;
    if (n == 1 && json_is_number(v)) {
        out[0] = (float)json_number_value(v);
        return VITC_OK;
    }
    /* A one-value array serves every channel: what a gray model's
     * Normalize([m], [s]) has. */
    int len = json_is_array(v) ? (int)json_array_size(v) : -1;
    if (n == 1 || (len != n && len != 1))
        return vitc__err(VITC_ERR_FORMAT, "vitc.config: \"%s\" must be %s", key,
                         n == 1 ? "a number" : "an array of 1 or 3 numbers");
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)(len == 1 ? 0 : i));
        if (!json_is_number(e))
            return vitc__err(VITC_ERR_FORMAT, "vitc.config: \"%s\"[%d] is not a number", key,
                             len == 1 ? 0 : i);
        out[i] = (float)json_number_value(e);
    }
    return VITC_OK;
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

/* Keep the labels array (checked against num_classes later). */
static vitc_status vit_json_labels(vitc_vit *m, json_t *arr) {
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) || n > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_FORMAT, "vitc.config: \"labels\" must be an array of strings");
    for (size_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(arr, i)))
            return vitc__err(VITC_ERR_FORMAT, "vitc.config: labels[%zu] is not a string", i);
    VITC_TRY(vitc__vit_keep_labels(m, arr, "vitc.config"));
    m->cfg.num_classes = m->cfg.num_classes ? m->cfg.num_classes : (int)n;
    return (int)n == m->cfg.num_classes
               ? VITC_OK
               : vitc__err(VITC_ERR_FORMAT, "vitc.config: %zu labels for %d classes", n,
                           m->cfg.num_classes);
}

static vitc_status vit_apply_metadata(vitc_vit *m, const char *text) {
    json_error_t jerr;
    if (vitc__json_items(text, strlen(text)) > VIT_MAX_CONFIG_ITEMS)
        return vitc__err(VITC_ERR_FORMAT, "vitc.config holds more than %d JSON values (vitc's "
                         "limit; each label is one)", VIT_MAX_CONFIG_ITEMS);
    json_t *root = json_loads(text, 0, &jerr);
    if (!root)
        return vitc__err(VITC_ERR_FORMAT, "vitc.config is not JSON (%s, column %d)", jerr.text,
                         jerr.column);
    vitc_status s = VITC_OK;
    vitc_vit_config *c = &m->cfg;
    if (!json_is_object(root))
        s = vitc__err(VITC_ERR_FORMAT, "vitc.config is not a JSON object");
    struct { const char *key; int *field; } ints[] = {
        {"image_size", &c->image_size}, {"patch_size", &c->patch_size},
        {"in_channels", &c->in_channels}, {"hidden_dim", &c->hidden_dim},
        {"depth", &c->depth}, {"num_heads", &c->num_heads},
        {"mlp_dim", &c->mlp_dim}, {"num_classes", &c->num_classes},
    };
    for (size_t i = 0; s == VITC_OK && i < sizeof ints / sizeof ints[0]; i++)
        s = vit_json_int(root, ints[i].key, ints[i].field);
    if (s == VITC_OK)
        s = vit_json_floats(root, "norm_eps", &c->norm_eps, 1);
    if (s == VITC_OK)
        s = vit_json_floats(root, "mean", c->mean, 3);
    if (s == VITC_OK)
        s = vit_json_floats(root, "std", c->std, 3);
    json_t *labels = json_object_get(root, "labels");
    if (s == VITC_OK && labels && !json_is_null(labels))
        s = vit_json_labels(m, labels);
    json_decref(root);
    return s;
}

static const vit_preset *vit_find_preset(const char *name) {
    for (int i = 0; i < VIT_N_PRESETS; i++)
        if (strcmp(vit_presets[i].name, name) == 0)
            return &vit_presets[i];
    return NULL;
}

/* The presets for other users (vitc train --arch): one table, here. */
int vitc__vit_preset_config(const char *name, vitc_vit_config *c) {
    const vit_preset *p = name ? vit_find_preset(name) : NULL;
    if (!p)
        return 0;
    *c = vitc_vit_default_config();
    c->image_size = p->image_size;
    c->patch_size = p->patch_size;
    c->in_channels = 3;
    c->hidden_dim = p->hidden_dim;
    c->depth = p->depth;
    c->num_heads = p->num_heads;
    c->mlp_dim = p->mlp_dim;
    c->num_classes = 1000;
    c->norm_eps = 1e-6f;
    vit_set_norm(c, p->timm);
    return 1;
}

const char *vitc__vit_preset_name(int i) {
    return i >= 0 && i < VIT_N_PRESETS ? vit_presets[i].name : NULL;
}

/* headless: a backbone (no head tensors), whose num_classes is 0. */
static vitc_status vit_check_config(const vitc_vit_config *c, int headless) {
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

static int vit_preset_fits(const vit_preset *p, const vitc_vit_config *c) {
    return p->patch_size == c->patch_size && p->hidden_dim == c->hidden_dim &&
           p->depth == c->depth && p->num_heads == c->num_heads && p->mlp_dim == c->mlp_dim &&
           c->in_channels == 3;
}

/* The name a person would use for this config, or "custom". vit_b_16 and
 * vit_base_patch16_224 share shapes: the asked name, else the one of the
 * file's key spelling. */
static void vit_name_arch(vitc_vit *m, const vit_preset *asked) {
    snprintf(m->arch, sizeof m->arch, "custom");
    if (m->n_prefix != 1 || m->layer_scale || m->head != VIT_HEAD_CLS)
        return; /* the presets have one class token, a head and no layer scale */
    if (asked && vit_preset_fits(asked, &m->cfg)) {
        snprintf(m->arch, sizeof m->arch, "%s", asked->name);
        return;
    }
    for (int i = 0; i < VIT_N_PRESETS; i++) {
        const vit_preset *p = &vit_presets[i];
        if (vit_preset_fits(p, &m->cfg) && p->timm == (m->naming == VIT_NAMES_TIMM)) {
            snprintf(m->arch, sizeof m->arch, "%s", p->name);
            return;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

static vitc_status vit_detect_naming(const vitc_safetensors *st, vitc__vit_naming *out) {
    char name[160];
    if (vitc_safetensors_find(st, "cls_token") >= 0 ||
        vitc_safetensors_find(st, "patch_embed.proj.weight") >= 0) {
        *out = VIT_NAMES_TIMM;
    } else if (vitc_safetensors_find(st, "class_token") >= 0 ||
               vitc_safetensors_find(st, "conv_proj.weight") >= 0) {
        *out = VIT_NAMES_TORCHVISION;
        if (vitc_safetensors_find(st, vit_layer_name(VIT_NAMES_TORCHVISION_V1, 0, VIT_L_FC1_W, name,
                                                     sizeof name)) >= 0)
            *out = VIT_NAMES_TORCHVISION_V1;
    } else {
        return vitc__err(VITC_ERR_KEY,
                         "not a Vision Transformer checkpoint: no class_token or cls_token "
                         "(torchvision or timm names)");
    }
    return VITC_OK;
}

/* The options the names show, as timm writes them: DeiT's distillation
 * token (its position row before the grid) with head_dist, whose eval
 * logits are the mean of both heads; layer scale (ls1/ls2: DINOv2 and
 * timm's init_values models); no head tensors at all (num_classes=0, a
 * backbone whose output is the embedding). */
static void vit_detect_options(vitc_vit *m, const vitc_safetensors *st) {
    const char *const *n = vit_model_names[m->naming];
    char name[160];
    m->n_dist = vitc_safetensors_find(st, n[VIT_P_DIST]) >= 0;
    m->n_prefix = m->n_cls + m->n_dist;
    m->layer_scale = vitc_safetensors_find(st, vit_layer_name(m->naming, 0, VIT_L_LS1, name,
                                                              sizeof name)) >= 0;
    if (vitc_safetensors_find(st, n[VIT_P_HEAD_W]) < 0 &&
        vitc_safetensors_find(st, n[VIT_P_HEAD_B]) < 0)
        m->head = VIT_HEAD_NONE;
    else
        m->head = m->n_dist ? VIT_HEAD_MEAN2 : VIT_HEAD_CLS;
}

/* Config: inferred from the tensors, then a preset's structure, then the
 * file's own vitc.config, field by field. */
static vitc_status vit_resolve_config(vitc_vit *m, const vitc_safetensors *st, const char *arch,
                                      const vit_preset **asked) {
    vitc_vit_config *c = &m->cfg;
    int headless = m->head == VIT_HEAD_NONE;
    vit_infer(st, m->naming, m->n_prefix, c);
    *asked = NULL;
    const char *meta = vitc_safetensors_get_metadata(st, "vitc.config");
    if (arch && *arch) {
        const vit_preset *p = vit_find_preset(arch);
        if (!p) {
            char list[512] = "";
            for (int i = 0; i < VIT_N_PRESETS; i++) {
                strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
                strncat(list, vit_presets[i].name, sizeof list - strlen(list) - 1);
            }
            return vitc__err(VITC_ERR_INVALID_ARG, "unknown ViT architecture \"%s\" (known: %s)",
                             arch, list);
        }
        *asked = p;
    }
    if (*asked && !meta) {
        /* The preset fixes the encoder; the image size (as torchvision's
         * builders take image_size, e.g. vit_h_14 at 518) and the classes
         * come from the file when it tells them. */
        const vit_preset *p = *asked;
        c->patch_size = p->patch_size;
        c->hidden_dim = p->hidden_dim;
        c->depth = p->depth;
        c->num_heads = p->num_heads;
        c->mlp_dim = p->mlp_dim;
        c->in_channels = 3;
        const int64_t *s = vitc__vit_file_shape(st, vit_model_names[m->naming][VIT_P_POS], 3);
        int64_t g = s ? (int64_t)llround(sqrt((double)(s[1] - m->n_prefix))) : 0;
        c->image_size =
            g > 0 && g * g == s[1] - m->n_prefix ? (int)(g * p->patch_size) : p->image_size;
        if (!c->num_classes && !headless)
            c->num_classes = 1000;
        vit_set_norm(c, p->timm);
        c->norm_eps = 1e-6f;
    }
    if (meta) {
        vitc_status s = vit_apply_metadata(m, meta);
        if (s != VITC_OK)
            return s;
    }
    /* The tensors of a missing field's source name it; say which. */
    char name[160];
    if (!c->hidden_dim || !c->patch_size || !c->in_channels)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer the patch "
                         "embedding)", vit_model_names[m->naming][VIT_P_CONV_W]);
    if (!c->image_size)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer image_size)",
                         vit_model_names[m->naming][VIT_P_POS]);
    if (!c->num_classes && !headless)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer num_classes)",
                         vit_model_names[m->naming][VIT_P_HEAD_W]);
    if (!c->depth || !c->mlp_dim)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer the blocks)",
                         vit_layer_name(m->naming, 0, c->depth ? VIT_L_FC1_W : VIT_L_QKV_W, name,
                                        sizeof name));
    if (!c->num_heads) {
        if (c->hidden_dim % 64)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "cannot infer num_heads for hidden_dim %d (not a multiple of 64): "
                             "give an architecture or a vitc.config", c->hidden_dim);
        c->num_heads = c->hidden_dim / 64;
    }
    return vit_check_config(c, headless);
}

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

/* Allocate (or adopt) the flat parameter array and bind the weight structs;
 * also registers the model. */
static vitc_status vit_bind(vitc_vit *m) {
    vitc__params_bind(m->table, m->n_entries, m->params, &m->w, m->blocks, sizeof *m->blocks);
    if (!m->id && !(m->id = vitc__handle_register()))
        return vitc__err(VITC_ERR_NOMEM, "cannot register the model");
    return VITC_OK;
}

/* adopt: the file's converted tensors (one arena, exactly the table's
 * tensors since every one is used) become the flat array, offsets measured
 * from its start; the caller hands st to the model. */
static vitc_status vit_build(const vitc_safetensors *st, const char *arch, int *adopt,
                             vitc_vit *m) {
    const vit_preset *asked = NULL;
    int t2t = 0;
    VITC_TRY(vitc__t2t_configure(m, st, arch, &t2t));
    if (!t2t) {
        VITC_TRY(vit_detect_naming(st, &m->naming));
        vit_detect_options(m, st);
        VITC_TRY(vit_resolve_config(m, st, arch, &asked));
    } else if (adopt) { /* rows the file lacks (a qkv bias of zeros): copied out */
        *adopt = 0;
    }
    VITC_TRY(vitc__vit_table_build(m));
    const float **src = calloc((size_t)m->n_entries, sizeof *src);
    if (!src)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate %d pointers", m->n_entries);
    int n_extra = 0;
    vitc_status s = vit_check_tensors(m, st, src, &n_extra);
    size_t bytes = 0;
    /* The adopted span must hold model tensors only: with training state
     * in the file the weights are copied out instead. */
    if (adopt && n_extra)
        *adopt = 0;
    if (s == VITC_OK && adopt && *adopt) {
        const float *lo = src[0], *hi = src[0];
        for (int i = 0; i < m->n_entries; i++) {
            if (src[i] < lo) lo = src[i];
            if (src[i] + m->table[i].numel > hi) hi = src[i] + m->table[i].numel;
        }
        m->params = (float *)lo;
        m->n_params = (size_t)(hi - lo);
        for (int i = 0; i < m->n_entries; i++) m->table[i].offset = (size_t)(src[i] - lo);
    } else if (s == VITC_OK) {
        /* A lazily read file (vit_load_any): its tensors in memory first.
         * st is the loader's own then, so writing its data is allowed. */
        if (adopt)
            s = vitc__safetensors_read_rest((vitc_safetensors *)st);
        if (s != VITC_OK)
            ;
        else if (!vitc__mul_size(m->n_params, sizeof(float), &bytes))
            s = vitc__err(VITC_ERR_NOMEM, "ViT parameters: %zu floats overflow", m->n_params);
        else if (!(m->params = vitc__calloc(m->n_params, sizeof(float))))
            s = vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu bytes of ViT parameters", bytes);
        for (int i = 0; s == VITC_OK && i < m->n_entries; i++)
            if (src[i]) /* else a row of zeros the file does not hold */
                memcpy(m->params + m->table[i].offset, src[i], m->table[i].numel * sizeof(float));
    }
    if (s == VITC_OK)
        s = vit_bind(m);
    free(src);
    if (t2t) {
        snprintf(m->family, sizeof m->family, "t2t-vit");
        return s == VITC_OK ? vitc__t2t_ready(m) : s;
    }
    if (s == VITC_OK)
        vit_name_arch(m, asked);
    snprintf(m->family, sizeof m->family, m->naming == VIT_NAMES_TIMM ? "timm" : "torchvision");
    return s;
}

/* A model with torchvision's family options (a loader changes them). */
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

vitc_status vitc_vit_create(const vitc_vit_config *cfg, uint64_t seed, vitc_vit **out) {
    if (!cfg || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_create: NULL argument");
    *out = NULL;
    VITC_TRY(vit_check_config(cfg, 0));
    vitc_vit *m = vitc__vit_alloc();
    if (!m)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    m->cfg = *cfg;
    m->naming = VIT_NAMES_TORCHVISION;
    vitc_status s = vitc__vit_table_build(m);
    if (s == VITC_OK && !(m->params = vitc__calloc(m->n_params, sizeof(float))))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate %zu ViT parameters", m->n_params);
    if (s == VITC_OK)
        s = vit_bind(m);
    if (s != VITC_OK) {
        vitc_vit_free(m);
        return s;
    }
    vitc__params_init(m->table, m->n_entries, m->params, seed);
    /* Dropout masks continue from a stream of their own, decorrelated from init. */
    m->rng.s = seed ^ 0xD1B54A32D192ED03ull;
    vit_name_arch(m, NULL);
    snprintf(m->family, sizeof m->family, "torchvision");
    *out = m;
    return VITC_OK;
}

vitc_status vitc_vit_from_safetensors(const vitc_safetensors *st, const char *arch,
                                      vitc_vit **out) {
    if (!st || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_from_safetensors: NULL argument");
    *out = NULL;
    vitc_vit *m = vitc__vit_alloc();
    if (!m)
        return vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    vitc_status s = vit_build(st, arch, NULL, m);
    if (s != VITC_OK) {
        vitc_vit_free(m);
        return s;
    }
    *out = m;
    return VITC_OK;
}

/* A Hub model at path: a directory, an index .json, or a file with a
 * config.json holding "model_type" beside it. *dir: path's directory
 * (malloc'd) when so. */
static int vit_is_hub(const char *path, char **dir) {
    struct stat sb;
    *dir = NULL;
    if (stat(path, &sb) != 0)
        return 0;
    size_t len = strlen(path);
    if (S_ISDIR(sb.st_mode)) {
        *dir = malloc(len + 1);
        if (*dir)
            memcpy(*dir, path, len + 1);
        return *dir != NULL;
    }
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 1;
    char *d = malloc(dlen + 1), *cfg = malloc(dlen + 16);
    if (!d || !cfg) {
        free(d);
        free(cfg);
        return 0;
    }
    memcpy(d, slash ? path : ".", dlen);
    d[dlen] = '\0';
    snprintf(cfg, dlen + 16, "%s/config.json", d);
    int hub = len >= 5 && !strcmp(path + len - 5, ".json");
    FILE *f;
    uint64_t size;
    if (!hub && stat(cfg, &sb) == 0 && vitc__open_regular(cfg, 1 << 24, &f, &size) == VITC_OK) {
        json_error_t jerr;
        json_t *root = json_loadf(f, 0, &jerr);
        fclose(f);
        hub = json_is_string(json_object_get(root, "model_type"));
        json_decref(root);
    }
    free(cfg);
    if (hub)
        *dir = d;
    else
        free(d);
    return hub;
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

vitc_status vitc__vit_load_prec(const char *path, const char *arch, int prec, vitc_vit **out) {
    if (!path || !out)
        return vitc__err(VITC_ERR_INVALID_ARG, "vitc_vit_load: NULL argument");
    *out = NULL;
    char *dir;
    if (vit_is_hub(path, &dir)) {
        struct stat sb;
        int is_dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
        vitc_status hs = vitc__vit_load_hub(dir, is_dir ? NULL : path, prec, out);
        free(dir);
        return hs;
    }
    vitc_safetensors *st = NULL;
    vitc_vit *m = NULL;
    /* With a precision the file is read lazily, tensor by tensor. */
    vitc_status s = vitc__safetensors_load_flags(path, prec >= 0 ? VITC__ST_LAZY : 0, &st);
    int clip = s == VITC_OK ? vitc__vit_clip_names(st) : 0;
    if (clip) { /* a CLIP tower in open_clip's or timm's names: the Hub loader's CLIP path */
        vitc_safetensors_free(st);
        const char *slash = strrchr(path, '/');
        size_t dlen = slash ? (size_t)(slash - path) : 1;
        char *d = malloc(dlen + 1);
        if (!d)
            return vitc__err(VITC_ERR_NOMEM, "out of memory");
        memcpy(d, slash ? path : ".", dlen);
        d[dlen] = '\0';
        s = vitc__vit_load_clip_names(d, path, clip == 2, prec, out);
        free(d);
        return s;
    }
    if (s == VITC_OK && !(m = vitc__vit_alloc()))
        s = vitc__err(VITC_ERR_NOMEM, "cannot allocate a ViT");
    int adopted = 1;
    if (s == VITC_OK)
        s = vit_build(st, arch, &adopted, m);
    if (s == VITC_OK && prec >= 0) {
        if (adopted && !m->t2t)
            s = vit_read_packing(m, st, (vitc_precision)prec);
        else /* copied out, st read whole: packed the usual way */
            s = vitc_vit_set_precision(m, (vitc_precision)prec);
    }
    if (s != VITC_OK) {
        if (m && m->params && adopted)
            m->params = NULL; /* adopted: st's arena, freed below */
        vitc_vit_free(m);
        vitc_safetensors_free(st);
        if (!strstr(vitc_last_error(), path))
            vitc__err_prefix(s, "%s", path);
        return s;
    }
    /* Weights copied out (a training checkpoint): the file is not needed. */
    if (adopted)
        m->weights_file = st;
    else
        vitc_safetensors_free(st);
    *out = m;
    return VITC_OK;
}

vitc_status vitc_vit_load(const char *path, const char *arch, vitc_vit **out) {
    return vitc__vit_load_prec(path, arch, -1, out);
}

vitc_status vitc_vit_load_precision(const char *path, const char *arch, vitc_precision precision,
                                    vitc_vit **out) {
    if (out)
        *out = NULL;
    if (!vitc_precision_name(precision))
        return vitc__err(VITC_ERR_INVALID_ARG,
                         "vitc_vit_load_precision: unknown precision %d (expected fp32, bf16 or "
                         "int8)", (int)precision);
    return vitc__vit_load_prec(path, arch, (int)precision, out);
}
