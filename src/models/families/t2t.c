/*
 * t2t.c — the T2T-ViT family (yitu-opensource/T2T-ViT): its registry's
 * presets, T2T_ViT's constructor arguments in vitc.config, its names
 * (tokens_to_token.attention1/2 in the stage's spelling, timm's blocks.N
 * for the encoder) and its token module's rows. The forward of that module
 * is t2t_vit.c's; it is this family's embed hook.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../family.h"

#define T2T_MAX_DIM (1 << 20)
#define T2T_MAX_DEPTH 4096

/* ------------------------------------------------------------------ */
/* Architectures: the original registry                               */
/* ------------------------------------------------------------------ */

/* models/t2t_vit.py's @register_model functions. Their pretrained weights
 * were trained with qk_scale = scale_dim ** -0.5 (the registry's
 * setdefault), not head_dim ** -0.5: a preset carries it. */
typedef struct t2t_preset {
    const char *name;
    int performer, embed_dim, depth, num_heads;
    double mlp_ratio;
    int scale_dim;
} t2t_preset;

static const t2t_preset t2t_presets[] = {
    {"t2t_vit_7", 1, 256, 7, 4, 2.0, 256},      {"t2t_vit_10", 1, 256, 10, 4, 2.0, 256},
    {"t2t_vit_12", 1, 256, 12, 4, 2.0, 256},    {"t2t_vit_14", 1, 384, 14, 6, 3.0, 384},
    {"t2t_vit_19", 1, 448, 19, 7, 3.0, 448},    {"t2t_vit_24", 1, 512, 24, 8, 3.0, 512},
    {"t2t_vit_t_14", 0, 384, 14, 6, 3.0, 384},  {"t2t_vit_t_19", 0, 448, 19, 7, 3.0, 448},
    {"t2t_vit_t_24", 0, 512, 24, 8, 3.0, 512},
    {"t2t_vit_14_resnext", 1, 384, 14, 32, 3.0, 384},
    {"t2t_vit_14_wide", 1, 768, 4, 12, 3.0, 512},
};
#define T2T_N_PRESETS ((int)(sizeof t2t_presets / sizeof t2t_presets[0]))

/* T2T_ViT.__init__'s arguments (its defaults until something says more). */
typedef struct t2t_args {
    int performer, img_size, in_chans, embed_dim, depth, num_heads, qkv_bias, token_dim;
    int num_classes;
    double mlp_ratio; /* < 0: the tensors' mlp_dim stands */
    int mlp_dim;
    double qk_scale;  /* 0: None */
} t2t_args;

/* ------------------------------------------------------------------ */
/* Names, shapes, slots                                               */
/* ------------------------------------------------------------------ */

static const char *const t2t_names[2][VIT_T2T_NROLE] = {
    {"norm1.weight", "norm1.bias", "attn.qkv.weight", NULL, "attn.proj.weight", "attn.proj.bias",
     "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight",
     "mlp.fc2.bias", NULL},
    {"norm1.weight", "norm1.bias", "kqv.weight", "kqv.bias", "proj.weight", "proj.bias",
     "norm2.weight", "norm2.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
     "w"},
};

static const size_t t2t_stage_slot[VIT_T2T_NROLE] = {
    offsetof(vitc__t2t_stage, n1_w),   offsetof(vitc__t2t_stage, n1_b),
    offsetof(vitc__t2t_stage, qkv_w),  offsetof(vitc__t2t_stage, qkv_b),
    offsetof(vitc__t2t_stage, proj_w), offsetof(vitc__t2t_stage, proj_b),
    offsetof(vitc__t2t_stage, n2_w),   offsetof(vitc__t2t_stage, n2_b),
    offsetof(vitc__t2t_stage, fc1_w),  offsetof(vitc__t2t_stage, fc1_b),
    offsetof(vitc__t2t_stage, fc2_w),  offsetof(vitc__t2t_stage, fc2_b),
    offsetof(vitc__t2t_stage, prm)};

static const char *t2t_stage_name(int role, vitc__vit_naming naming, char *buf, size_t cap) {
    if (role >= VIT_P_T2T_PROJ_W) {
        snprintf(buf, cap, "tokens_to_token.project.%s",
                 role == VIT_P_T2T_PROJ_W ? "weight" : "bias");
        return buf;
    }
    int s = (role - VIT_P_T2T0) / VIT_T2T_NROLE, r = (role - VIT_P_T2T0) % VIT_T2T_NROLE;
    const char *n = t2t_names[naming == VIT_NAMES_T2T_PERFORMER][r];
    snprintf(buf, cap, "tokens_to_token.attention%d.%s", s + 1, n ? n : "(none)");
    return buf;
}

static int t2t_has_row(const vitc_vit *m, int role) {
    if (!m->t2t || role < VIT_P_T2T0)
        return 0;
    if (role >= VIT_P_T2T_PROJ_W)
        return 1;
    int r = (role - VIT_P_T2T0) % VIT_T2T_NROLE;
    return (r != VIT_T2T_QKV_B && r != VIT_T2T_PRM) || m->t2t == VIT_NAMES_T2T_PERFORMER;
}

static size_t t2t_slot(int role) {
    if (role >= VIT_P_T2T_PROJ_W)
        return role == VIT_P_T2T_PROJ_W ? offsetof(vitc__vit_w, t2t_proj_w)
                                        : offsetof(vitc__vit_w, t2t_proj_b);
    int s = (role - VIT_P_T2T0) / VIT_T2T_NROLE, r = (role - VIT_P_T2T0) % VIT_T2T_NROLE;
    return offsetof(vitc__vit_w, t2t) + (size_t)s * sizeof(vitc__t2t_stage) + t2t_stage_slot[r];
}


/* A token-module row's shape, init (T2T's _init_weights) and slot. */
static void t2t_row(vitc__param *e, const vitc_vit *m) {
    int64_t T = m->t2t_dim, C = m->cfg.hidden_dim, s[2] = {0, 0};
    int nd = 1;
    e->init = VITC__INIT_ZERO;
    if (e->role >= VIT_P_T2T_PROJ_W) {
        s[0] = C;
        if (e->role == VIT_P_T2T_PROJ_W)
            nd = 2, s[1] = 9 * T;
    } else {
        int st = (e->role - VIT_P_T2T0) / VIT_T2T_NROLE, r = (e->role - VIT_P_T2T0) % VIT_T2T_NROLE;
        int64_t dim = vitc__t2t_stage_dim(m, st);
        switch (r) {
        case VIT_T2T_N1_W: e->init = VITC__INIT_ONE; /* fall through */
        case VIT_T2T_N1_B: s[0] = dim; break;
        case VIT_T2T_QKV_W: nd = 2, s[0] = 3 * T, s[1] = dim; break;
        case VIT_T2T_QKV_B: s[0] = 3 * T; break;
        case VIT_T2T_PROJ_W:
        case VIT_T2T_FC1_W:
        case VIT_T2T_FC2_W: nd = 2, s[0] = T, s[1] = T; break;
        case VIT_T2T_PRM: nd = 2, s[0] = T / 2, s[1] = T; break; /* m = int(T * 0.5) */
        case VIT_T2T_N2_W: e->init = VITC__INIT_ONE; /* fall through */
        default: s[0] = T; break;
        }
    }
    e->ndim = nd;
    memset(e->shape, 0, sizeof e->shape);
    e->shape[0] = s[0];
    e->shape[1] = s[1];
    e->no_decay = nd == 1;
    e->slot = t2t_slot(e->role);
}

/* ------------------------------------------------------------------ */
/* Configuration                                                      */
/* ------------------------------------------------------------------ */


/* What the tensors tell; a field they do not tell keeps its default, and
 * the table check later names any tensor that disagrees. */
static void t2t_infer(const vitc_safetensors *st, t2t_args *a) {
    const int64_t *s;
    char name[64];
    if (vitc_safetensors_find(st, "tokens_to_token.attention1.w") >= 0)
        a->performer = 1;
    else if (vitc_safetensors_find(st, "tokens_to_token.attention1.attn.qkv.weight") >= 0)
        a->performer = 0;
    if ((s = vitc__vit_file_shape(st, "tokens_to_token.project.weight", 2)) && s[1] % 9 == 0)
        a->embed_dim = (int)s[0], a->token_dim = (int)(s[1] / 9);
    if ((s = vitc__vit_file_shape(st, "tokens_to_token.attention1.norm1.weight", 1)) && s[0] % 49 == 0)
        a->in_chans = (int)(s[0] / 49);
    if ((s = vitc__vit_file_shape(st, "pos_embed", 3)) && s[1] > 1) {
        int64_t g = (int64_t)llround(sqrt((double)(s[1] - 1)));
        if (g * g == s[1] - 1 && g <= T2T_MAX_DIM / 16)
            a->img_size = (int)(16 * g);
    }
    int d = 0;
    for (;; d++) {
        snprintf(name, sizeof name, "blocks.%d.attn.qkv.weight", d);
        if (d >= T2T_MAX_DEPTH || vitc_safetensors_find(st, name) < 0)
            break;
    }
    if (d)
        a->depth = d;
    if ((s = vitc__vit_file_shape(st, "blocks.0.mlp.fc1.weight", 2)))
        a->mlp_dim = (int)s[0], a->mlp_ratio = -1.0;
    a->qkv_bias = vitc_safetensors_find(st, "blocks.0.attn.qkv.bias") >= 0;
    s = vitc__vit_file_shape(st, "head.weight", 2);
    a->num_classes = s ? (int)s[0] : 0; /* num_classes 0: head = Identity */
}

static void t2t_apply_preset(t2t_args *a, const t2t_preset *p) {
    a->performer = p->performer;
    a->embed_dim = p->embed_dim;
    a->depth = p->depth;
    a->num_heads = p->num_heads;
    a->mlp_ratio = p->mlp_ratio;
    a->qk_scale = pow((double)p->scale_dim, -0.5);
}

static vitc_status t2t_json_int(json_t *o, const char *key, int lo, int *out) {
    json_t *v = json_object_get(o, key);
    if (!v)
        return VITC_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > T2T_MAX_DIM)
        return vitc__err(VITC_ERR_FORMAT, "vitc.config: T2T-ViT's \"%s\" must be an integer in "
                         "[%d, %d]", key, lo, T2T_MAX_DIM);
    *out = (int)json_integer_value(v);
    return VITC_OK;
}

/* vitc.config of a T2T-ViT: T2T_ViT's constructor arguments, by name. */
static vitc_status t2t_apply_json(t2t_args *a, json_t *o) {
    json_t *v = json_object_get(o, "tokens_type");
    if (v) {
        const char *t = json_is_string(v) ? json_string_value(v) : "";
        if (!strcmp(t, "performer") || !strcmp(t, "transformer"))
            a->performer = t[0] == 'p';
        else
            return vitc__err(VITC_ERR_UNSUPPORTED, "vitc.config: T2T-ViT tokens_type \"%.40s\" is "
                             "not supported (vitc reads \"transformer\" and \"performer\"; the "
                             "original's \"convolution\" is a comparison baseline)", t);
    }
    struct { const char *key; int lo; int *f; } ints[] = {
        {"img_size", 16, &a->img_size}, {"in_chans", 1, &a->in_chans},
        {"embed_dim", 1, &a->embed_dim}, {"depth", 1, &a->depth},
        {"num_heads", 1, &a->num_heads}, {"token_dim", 2, &a->token_dim},
        {"num_classes", 0, &a->num_classes}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        VITC_TRY(t2t_json_int(o, ints[i].key, ints[i].lo, ints[i].f));
    if ((v = json_object_get(o, "mlp_ratio"))) {
        if (!json_is_number(v) || !(json_number_value(v) > 0.0 && json_number_value(v) < 1e4))
            return vitc__err(VITC_ERR_FORMAT, "vitc.config: mlp_ratio must be a positive number");
        a->mlp_ratio = json_number_value(v);
    }
    if ((v = json_object_get(o, "qkv_bias"))) {
        if (!json_is_boolean(v))
            return vitc__err(VITC_ERR_FORMAT, "vitc.config: qkv_bias must be true or false");
        a->qkv_bias = json_is_true(v);
    }
    if ((v = json_object_get(o, "qk_scale"))) {
        if (!json_is_null(v) && (!json_is_number(v) || !(json_number_value(v) >= 0.0) ||
                                 !isfinite(json_number_value(v))))
            return vitc__err(VITC_ERR_FORMAT, "vitc.config: qk_scale must be null or a number");
        a->qk_scale = json_is_null(v) ? 0.0 : json_number_value(v);
    }
    return VITC_OK;
}

static const t2t_preset *t2t_find_preset(const char *name) {
    for (int i = 0; name && i < T2T_N_PRESETS; i++)
        if (!strcmp(t2t_presets[i].name, name))
            return &t2t_presets[i];
    return NULL;
}

static vitc_status t2t_unknown_arch(const char *arch) {
    char list[400] = "";
    for (int i = 0; i < T2T_N_PRESETS; i++) {
        strncat(list, i ? ", " : "", sizeof list - strlen(list) - 1);
        strncat(list, t2t_presets[i].name, sizeof list - strlen(list) - 1);
    }
    return vitc__err(VITC_ERR_INVALID_ARG, "this is a T2T-ViT checkpoint: architecture \"%.40s\" "
                     "is not one of its presets (%s)", arch, list);
}

/* The preset a config is: structure and qk_scale equal, or NULL. */
static const t2t_preset *t2t_match(const t2t_args *a, int mlp_dim) {
    for (int i = 0; i < T2T_N_PRESETS; i++) {
        const t2t_preset *p = &t2t_presets[i];
        if (p->performer == a->performer && p->embed_dim == a->embed_dim &&
            p->depth == a->depth && p->num_heads == a->num_heads &&
            (int)(p->embed_dim * p->mlp_ratio) == mlp_dim &&
            fabs(a->qk_scale - pow((double)p->scale_dim, -0.5)) < 1e-12)
            return p;
    }
    return NULL;
}

/* vitc.config of a T2T-ViT (arch "t2t_vit"), or NULL. */
static json_t *t2t_config(const vitc_safetensors *st) {
    const char *meta = vitc_safetensors_get_metadata(st, "vitc.config");
    json_t *root = NULL;
    if (meta) {
        json_error_t jerr;
        if (vitc__json_items(meta, strlen(meta)) <= 4096)
            root = json_loads(meta, 0, &jerr);
        json_t *ja = json_object_get(root, "arch");
        if (!json_is_string(ja) || strcmp(json_string_value(ja), "t2t_vit") != 0) {
            json_decref(root); /* another model's vitc.config (or none) */
            root = NULL;
        }
    }
    return root;
}

static int t2t_file(const vitc_safetensors *st) {
    return vitc_safetensors_find(st, "tokens_to_token.project.weight") >= 0 ||
           vitc_safetensors_find(st, "tokens_to_token.attention1.norm1.weight") >= 0;
}

/* Its vitc.config, its preset named, its tensors; or a t2t_vit* name
 * (that configure refuses when it is no preset). */
static int t2t_detect(const vitc__src *src) {
    if (!src->st)
        return 0;
    if (t2t_file(src->st) || (src->arch && !strncmp(src->arch, "t2t_vit", 7)))
        return 1;
    json_t *root = t2t_config(src->st);
    json_decref(root);
    return root != NULL;
}

/* m's config, options and arch name from the file's vitc.config, the
 * preset, then its tensors. */
static vitc_status t2t_configure(vitc_vit *m, vitc__src *src) {
    const vitc_safetensors *st = src->st;
    const char *arch = src->arch;
    json_t *root = t2t_config(st);
    const t2t_preset *preset = arch && *arch ? t2t_find_preset(arch) : NULL;
    int file_t2t = t2t_file(st);
    if (!root && !preset && !file_t2t) {
        if (arch && !strncmp(arch, "t2t_vit", 7))
            return t2t_unknown_arch(arch);
        return vitc__err(VITC_ERR_INVALID_ARG, "not a T2T-ViT checkpoint");
    }
    if (arch && *arch && !preset) {
        json_decref(root);
        return t2t_unknown_arch(arch);
    }
    t2t_args a = {1, 224, 3, 768, 12, 12, 0, 64, 1000, 4.0, 0, 0.0};
    t2t_infer(st, &a);
    vitc_status s = VITC_OK;
    if (preset)
        t2t_apply_preset(&a, preset);
    if (root)
        s = t2t_apply_json(&a, root);
    json_decref(root);
    VITC_TRY(s);
    int mlp = a.mlp_ratio < 0.0 ? a.mlp_dim : (int)(a.embed_dim * a.mlp_ratio);
    if (!preset && !root) {
        /* Tensors alone: the heads (and the released weights' qk_scale)
         * come from the preset of these shapes. */
        for (int i = 0; i < T2T_N_PRESETS && !preset; i++) {
            const t2t_preset *p = &t2t_presets[i];
            if (p->performer == a.performer && p->embed_dim == a.embed_dim &&
                p->depth == a.depth && (int)(p->embed_dim * p->mlp_ratio) == mlp)
                preset = p;
        }
        if (!preset)
            return vitc__err(VITC_ERR_INVALID_ARG, "a T2T-ViT checkpoint without vitc.config "
                             "whose shapes (embed_dim %d, depth %d, mlp %d) are no preset's: give "
                             "--arch or write vitc.config (tools/convert_t2t.py)", a.embed_dim,
                             a.depth, mlp);
        a.num_heads = preset->num_heads;
        a.qk_scale = pow((double)preset->scale_dim, -0.5);
    }
    if (a.embed_dim % a.num_heads || mlp < 1 || mlp > T2T_MAX_DIM || a.depth > T2T_MAX_DEPTH ||
        a.img_size < 16 || a.token_dim < 2)
        return vitc__err(VITC_ERR_INVALID_ARG, "T2T-ViT config: embed_dim %d, num_heads %d, mlp "
                         "%d, depth %d, img_size %d, token_dim %d is inconsistent", a.embed_dim,
                         a.num_heads, mlp, a.depth, a.img_size, a.token_dim);
    const t2t_preset *named = t2t_match(&a, mlp);
    snprintf(m->arch, sizeof m->arch, "%s", named ? named->name : "t2t_vit");
    vitc_vit_config *c = &m->cfg;
    static const float mean[3] = {0.485f, 0.456f, 0.406f}, stdv[3] = {0.229f, 0.224f, 0.225f};
    memset(c, 0, sizeof *c);
    /* Three soft splits of stride 4, 2, 2: 16 pixels per token; the
     * sinusoid table has (img_size // 16)^2 + 1 rows. */
    c->image_size = a.img_size / 16 * 16;
    c->patch_size = 16;
    c->in_channels = a.in_chans;
    c->hidden_dim = a.embed_dim;
    c->depth = a.depth;
    c->num_heads = a.num_heads;
    c->mlp_dim = mlp;
    c->num_classes = a.num_classes;
    c->norm_eps = 1e-5f; /* nn.LayerNorm's default */
    for (int i = 0; i < 3; i++) c->mean[i] = mean[i], c->std[i] = stdv[i];
    m->t2t = a.performer ? VIT_NAMES_T2T_PERFORMER : VIT_NAMES_T2T_TRANSFORMER;
    m->naming = (vitc__vit_naming)m->t2t;
    m->t2t_dim = a.token_dim;
    m->no_qkv_bias = !a.qkv_bias;
    m->attn_scale = (float)a.qk_scale; /* Python's `qk_scale or ...`: 0 is the default */
    m->n_prefix = m->n_cls = 1;
    m->head = a.num_classes ? VIT_HEAD_CLS : VIT_HEAD_NONE;
    m->mlp_act = VIT_ACT_GELU;
    snprintf(m->family, sizeof m->family, "t2t-vit");
    src->adopt = 0; /* rows the file lacks (a qkv bias of zeros): copied out */
    return VITC_OK;
}


/* The encoder in timm's names (the original's modules are timm's). */
static const char *const t2t_model[VIT_P_T2T0] = {
    [VIT_P_CLS] = "cls_token", [VIT_P_POS] = "pos_embed",
    VITC__WB(VIT_P_LN, "norm"), VITC__WB(VIT_P_HEAD, "head"),
};

static const char *t2t_row_name(const vitc_vit *m, const vitc__param *e, char *buf, size_t cap) {
    if (e->layer < 0 && e->role >= VIT_P_T2T0)
        return t2t_stage_name(e->role, m->naming, buf, cap);
    if (e->layer >= 0)
        snprintf(buf, cap, "blocks.%d.%s", e->layer, vitc__timm_layer_names[e->role]);
    else
        snprintf(buf, cap, "%s", t2t_model[e->role] ? t2t_model[e->role] : "(none)");
    return buf;
}

/* T2T_ViT._init_weights: trunc_normal_(std=.02) Linear weights, zero biases. */
/* Token_performer's random-feature attention has no backward here. */
static int t2t_can_train(const vitc_vit *m, char *why, size_t cap) {
    if (m->t2t != VIT_NAMES_T2T_PERFORMER)
        return 1;
    snprintf(why, cap, "T2T-ViT's Token_performer stages (tokens_type \"performer\") have no "
             "backward; the transformer mode (t2t_vit_t_*) trains");
    return 0;
}

const vitc__family vitc__family_t2t = {
    .name = "t2t-vit",
    .detect = t2t_detect,
    .configure = t2t_configure,
    .row_name = t2t_row_name,
    .has_row = t2t_has_row,
    .row = t2t_row,
    .can_train = t2t_can_train,
    .embed = vitc__t2t_tokens,
    .embed_backward = vitc__t2t_tokens_backward,
    .fresh_head = VIT_HEAD_CLS,
    .head_std = 0.02,
    .head_trunc = 1,
};
