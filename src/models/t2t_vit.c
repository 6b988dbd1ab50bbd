/*
 * t2t_vit.c — T2T-ViT (yitu-opensource/T2T-ViT, the source of seed 003's
 * Attention): its tokens_to_token module in place of the patch embedding,
 * then the one ViT encoder of vit.c (timm-named pre-norm blocks, LayerNorm
 * eps 1e-5, attention scale qk_scale or head_dim^-0.5):
 *
 *   x = unfold(images, k 7, s 4, pad 2)          [B, (H/4)^2, in*49]
 *   x = attention1(x)                            [B, (H/4)^2, T]
 *   x = unfold(x as [B, T, H/4, W/4], 3, 2, 1)   [B, (H/8)^2, 9T]
 *   x = attention2(x)                            [B, (H/8)^2, T]
 *   x = unfold(x as [B, T, H/8, W/8], 3, 2, 1)   [B, (H/16)^2, 9T]
 *   x = project(x)                               [B, (H/16)^2, C]
 *   then [cls, x] + pos_embed (the sinusoid table the checkpoint holds),
 *   the blocks, norm, head(x[:, 0])   (vit.c)
 *
 * A stage is a Token_transformer (tokens_type "transformer", t2t_vit_t_*):
 *   x = Attention(norm1(x))  the engine's T2TAttention (src/layers): qkv
 *                            without bias, softmax(q k^T dim^-0.5) v, proj,
 *                            + v (the V skip: the width changes dim -> T)
 *   x = x + mlp(norm2(x))    fc1, GELU, fc2 (mlp_ratio 1)
 * or a Token_performer ("performer", t2t_vit_*), one head of random-feature
 * attention:
 *   k, q, v = split(kqv(norm1(x)))                [B, L, T] each, that order
 *   phi(u) = exp(u w^T - |u|^2 / 2) / sqrt(m)     w [m, T] (stored), m = T/2
 *   y = phi(q) (phi(k)^T v) / (phi(q) . sum_t phi(k)_t + 1e-8)
 *   x = v + proj(y);  x = x + mlp(norm2(x))       mlp.0, GELU, mlp.2
 *
 * The checkpoint keeps its own names (tokens_to_token.attention1...,
 * blocks.N...); vitc.config holds T2T_ViT's constructor arguments.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../layers/layers.h"
#include "vit_internal.h"

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

const char *vitc__t2t_name(int role, vitc__vit_naming naming, char *buf, size_t cap) {
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

int vitc__t2t_has_row(const vitc_vit *m, int role) {
    if (!m->t2t || role < VIT_P_T2T0)
        return 0;
    if (role >= VIT_P_T2T_PROJ_W)
        return 1;
    int r = (role - VIT_P_T2T0) % VIT_T2T_NROLE;
    return (r != VIT_T2T_QKV_B && r != VIT_T2T_PRM) || m->t2t == VIT_NAMES_T2T_PERFORMER;
}

size_t vitc__t2t_slot(int role) {
    if (role >= VIT_P_T2T_PROJ_W)
        return role == VIT_P_T2T_PROJ_W ? offsetof(vitc__vit_w, t2t_proj_w)
                                        : offsetof(vitc__vit_w, t2t_proj_b);
    int s = (role - VIT_P_T2T0) / VIT_T2T_NROLE, r = (role - VIT_P_T2T0) % VIT_T2T_NROLE;
    return offsetof(vitc__vit_w, t2t) + (size_t)s * sizeof(vitc__t2t_stage) + t2t_stage_slot[r];
}

/* Input width of stage s: in*7*7 for attention1, T*3*3 for attention2. */
static int64_t t2t_stage_dim(const vitc_vit *m, int s) {
    return s ? 9 * (int64_t)m->t2t_dim : 49 * (int64_t)m->cfg.in_channels;
}

void vitc__t2t_row(vitc__param *e, const vitc_vit *m) {
    int64_t T = m->t2t_dim, C = m->cfg.hidden_dim, s[2] = {0, 0};
    int nd = 1;
    e->init = VITC__INIT_ZERO;
    if (e->role >= VIT_P_T2T_PROJ_W) {
        s[0] = C;
        if (e->role == VIT_P_T2T_PROJ_W)
            nd = 2, s[1] = 9 * T;
    } else {
        int st = (e->role - VIT_P_T2T0) / VIT_T2T_NROLE, r = (e->role - VIT_P_T2T0) % VIT_T2T_NROLE;
        int64_t dim = t2t_stage_dim(m, st);
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

vitc_status vitc__t2t_configure(vitc_vit *m, const vitc_safetensors *st, const char *arch,
                                int *is_t2t) {
    *is_t2t = 0;
    const char *meta = vitc_safetensors_get_metadata(st, "vitc.config");
    json_t *root = NULL;
    if (meta) {
        json_error_t jerr;
        if (vitc__json_items(meta, strlen(meta)) <= 4096)
            root = json_loads(meta, 0, &jerr);
        json_t *ja = json_object_get(root, "arch");
        if (!json_is_string(ja) || strcmp(json_string_value(ja), "t2t_vit") != 0) {
            json_decref(root); /* another model's vitc.config (or none vit_load reads) */
            root = NULL;
        }
    }
    const t2t_preset *preset = arch && *arch ? t2t_find_preset(arch) : NULL;
    int file_t2t = vitc_safetensors_find(st, "tokens_to_token.project.weight") >= 0 ||
                   vitc_safetensors_find(st, "tokens_to_token.attention1.norm1.weight") >= 0;
    if (!root && !preset && !file_t2t) {
        if (arch && !strncmp(arch, "t2t_vit", 7))
            return t2t_unknown_arch(arch);
        return VITC_OK; /* another family: vit_load.c's path */
    }
    if (arch && *arch && !preset) {
        json_decref(root);
        return t2t_unknown_arch(arch);
    }
    *is_t2t = 1;
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
    return VITC_OK;
}

/* ------------------------------------------------------------------ */
/* Forward                                                            */
/* ------------------------------------------------------------------ */

/* The stages run on nn/attn.c and nn/mlp.c (transformer mode) at the
 * model's parameters; no engine layers. */
vitc_status vitc__t2t_ready(vitc_vit *m) {
    (void)m;
    return VITC_OK;
}

void vitc__t2t_free(vitc_vit *m) {
    for (int s = 0; s < 2; s++) {
        vitc_layer_free(m->t2t_attn[s]);
        m->t2t_attn[s] = NULL;
    }
}

/* Token_performer's attention on kqv [B, L, 3T] (rows k | q | v) into
 * out [B*L, T] = v + proj(y); fp scratch: kp, qp [B*L, m], ksum [m],
 * D [L], kptv [T, m], y [B*L, T]. */
static void t2t_performer(const vitc__t2t_stage *w, const float *kqv, int64_t B, int64_t L,
                          int64_t T, float *kp, float *qp, float *ksum, float *D, float *kptv,
                          float *y, float *out) {
    int64_t mm = T / 2, M = B * L, W3 = 3 * T;
    const float *k = kqv, *q = kqv + T, *v = kqv + 2 * T; /* [M, T] at stride 3T */
    float sqrt_m = (float)sqrt((double)mm);
    /* phi(u) = exp(u w^T - |u|^2 / 2) / sqrt(m), as prm_exp computes it */
    for (int pass = 0; pass < 2; pass++) {
        const float *u = pass ? q : k;
        float *ph = pass ? qp : kp; /* [M, m] */
        vitc__linear(ph, mm, u, W3, w->prm, NULL, NULL, 0, M, mm, T);
        for (int64_t r = 0; r < M; r++) {
            float xd = 0.0f;
            for (int64_t j = 0; j < T; j++) xd += u[r * W3 + j] * u[r * W3 + j];
            xd /= 2.0f;
            for (int64_t j = 0; j < mm; j++) ph[r * mm + j] = expf(ph[r * mm + j] - xd) / sqrt_m;
        }
    }
    for (int64_t b = 0; b < B; b++) {
        const float *kb = kp + b * L * mm, *qb = qp + b * L * mm; /* [L, m] */
        const float *vb = v + b * L * W3;                         /* [L, T] at stride 3T */
        float *yb = y + b * L * T;                                /* [L, T] */
        for (int64_t j = 0; j < mm; j++) ksum[j] = 0.0f;
        for (int64_t t = 0; t < L; t++)
            for (int64_t j = 0; j < mm; j++) ksum[j] += kb[t * mm + j];
        for (int64_t t = 0; t < L; t++) { /* D = phi(q) . sum_t phi(k) */
            float d = 0.0f;
            for (int64_t j = 0; j < mm; j++) d += qb[t * mm + j] * ksum[j];
            D[t] = d;
        }
        /* kptv [T, m] = v^T phi(k); y [L, T] = phi(q) kptv^T / (D + eps) */
        vitc__gemm(1, 0, T, mm, L, 1.0f, vb, W3, kb, mm, 0.0f, kptv, mm);
        vitc__gemm(0, 1, L, T, mm, 1.0f, qb, mm, kptv, mm, 0.0f, yb, T);
        for (int64_t t = 0; t < L; t++) {
            float den = D[t] + 1e-8f;
            for (int64_t j = 0; j < T; j++) yb[t * T + j] /= den;
        }
    }
    vitc__linear(out, T, y, T, w->proj_w, w->proj_b, v, W3, M, T, T); /* v + proj(y) */
}

/* One stage's activations: its input rows (an unfold) cols [B*L, dim],
 * norm1's ln [B*L, dim], the attention's qkv [B*L, 3T], o [B*L, T], lse
 * [B, L] (training), a = its output with the V skip [B*L, T], norm2's h,
 * the MLP's hpre / hact (the same in inference), out [B*L, T]; and the
 * performer's kqv, phi(k), phi(q) [B*L, m], ksum [m], D [L], kptv [T, m]. */
typedef struct t2t_acts {
    float *cols, *ln, *qkv, *o, *lse, *a, *h, *hpre, *hact, *out;
    float *kqv, *kp, *qp, *ksum, *D, *kptv;
} t2t_acts;

static vitc__nn_attn t2t_attn(const vitc_vit *m, const vitc__t2t_stage *w, int s, int64_t B,
                              int64_t L) {
    /* Token_transformer's Attention: head_dim = dim // num_heads of the
     * *input* width, so the scale is dim^-0.5, not T^-0.5; one head. */
    int64_t dim = t2t_stage_dim(m, s), T = m->t2t_dim;
    vitc__nn_attn p = {.qkv_w = w->qkv_w, .out_w = w->proj_w, .out_b = w->proj_b, .B = B,
                       .N = L, .Cin = dim, .D = T, .Cout = T, .H = 1,
                       .scale = (float)pow((double)dim, -0.5), .v_skip = 1};
    return p;
}

static vitc__nn_mlp t2t_mlp(const vitc_vit *m, const vitc__t2t_stage *w) {
    vitc__nn_mlp p = {.fc1_w = w->fc1_w, .fc1_b = w->fc1_b, .fc2_w = w->fc2_w, .fc2_b = w->fc2_b,
                      .C = m->t2t_dim, .M = m->t2t_dim, .act = VITC__NN_GELU};
    return p;
}

/* One stage on t->cols [B, L, dim] into t->out [B*L, T]. */
static vitc_status t2t_stage(const vitc_vit *m, vitc__session *ss, int s, int64_t B, int64_t L,
                             const t2t_acts *t) {
    const vitc__t2t_stage *w = &m->w.t2t[s];
    int64_t dim = t2t_stage_dim(m, s), T = m->t2t_dim, M = B * L;
    vitc__layernorm(t->ln, t->cols, w->n1_w, w->n1_b, M, dim, m->cfg.norm_eps);
    if (m->t2t == VIT_NAMES_T2T_TRANSFORMER) {
        vitc__nn_attn p = t2t_attn(m, w, s, B, L);
        vitc__nn_attn_rec r = {t->qkv, t->o, t->lse};
        VITC_TRY(vitc__nn_attn_forward(&p, t->a, t->ln, &r, &ss->mask_buf));
    } else {
        vitc__linear(t->kqv, 3 * T, t->ln, dim, w->qkv_w, w->qkv_b, NULL, 0, M, 3 * T, dim);
        t2t_performer(w, t->kqv, B, L, T, t->kp, t->qp, t->ksum, t->D, t->kptv, t->hpre, t->a);
    }
    /* x = a + fc2(gelu(fc1(norm2(a)))) */
    vitc__layernorm(t->h, t->a, w->n2_w, w->n2_b, M, T, m->cfg.norm_eps);
    vitc__nn_mlp f = t2t_mlp(m, w);
    vitc__nn_mlp_forward(&f, t->out, t->h, t->a, M, t->hpre, t->hact);
    return VITC_OK;
}

/* The unfolds' geometry for H x W images: stage s reads L[s] rows of
 * width d[s] on a grid gh[s] x gw[s] (s = 2: project's input). */
typedef struct t2t_geo {
    int64_t gh[4], gw[4], L[3], d[3];
} t2t_geo;

static t2t_geo t2t_geometry(const vitc_vit *m, int64_t H, int64_t W) {
    t2t_geo g;
    int64_t T = m->t2t_dim;
    g.gh[0] = H, g.gw[0] = W;
    g.gh[1] = vitc__nn_unfold_out(H, 7, 4, 2), g.gw[1] = vitc__nn_unfold_out(W, 7, 4, 2);
    for (int i = 2; i < 4; i++) {
        g.gh[i] = vitc__nn_unfold_out(g.gh[i - 1], 3, 2, 1);
        g.gw[i] = vitc__nn_unfold_out(g.gw[i - 1], 3, 2, 1);
    }
    for (int i = 0; i < 3; i++) g.L[i] = g.gh[i + 1] * g.gw[i + 1];
    g.d[0] = 49 * m->cfg.in_channels, g.d[1] = g.d[2] = 9 * T;
    return g;
}

/* Carves ss->t2t_buf: inference one set of stage regions (stage 1 the
 * longest) shared by both stages, cols also holding the later unfolds;
 * training (record, transformer mode) each stage its own, and cols3. */
static vitc_status t2t_carve(const vitc_vit *m, vitc__session *ss, int64_t B, const t2t_geo *g,
                             int record, t2t_acts t[2], float **cols3) {
    int64_t T = m->t2t_dim, mm = T / 2;
    int perf = m->t2t == VIT_NAMES_T2T_PERFORMER;
    size_t off[2][16] = {{0}}, o3 = 0;
    vitc__carve cv = {0, 1};
    for (int s = 0; s < (record ? 2 : 1); s++) {
        size_t rows = (size_t)(B * g->L[s]);
        size_t widest = record ? (size_t)g->d[s] : (size_t)(g->d[0] > g->d[1] ? g->d[0] : g->d[1]);
        size_t *o = off[s];
        o[0] = vitc__take(&cv, rows, widest), o[1] = vitc__take(&cv, rows, widest);
        o[2] = vitc__take(&cv, rows, 3 * (size_t)T), o[3] = vitc__take(&cv, rows, (size_t)T);
        o[4] = record ? vitc__take(&cv, rows, 1) : 0;
        o[5] = vitc__take(&cv, rows, (size_t)T), o[6] = vitc__take(&cv, rows, (size_t)T);
        o[7] = vitc__take(&cv, rows, (size_t)T);
        o[8] = record ? vitc__take(&cv, rows, (size_t)T) : o[7];
        o[9] = vitc__take(&cv, rows, (size_t)T);
        if (perf) {
            o[10] = vitc__take(&cv, rows, (size_t)(3 * T));
            o[11] = vitc__take(&cv, rows, (size_t)mm), o[12] = vitc__take(&cv, rows, (size_t)mm);
            o[13] = vitc__take(&cv, 1, (size_t)mm), o[14] = vitc__take(&cv, (size_t)g->L[s], 1);
            o[15] = vitc__take(&cv, (size_t)T, (size_t)mm);
        }
    }
    if (record)
        o3 = vitc__take(&cv, (size_t)(B * g->L[2]), (size_t)g->d[2]);
    if (!cv.ok)
        return vitc__err(VITC_ERR_NOMEM, "T2T-ViT tokens for [%lld, %lld, %lld, %lld] overflow",
                         (long long)B, (long long)m->cfg.in_channels, (long long)g->gh[0],
                         (long long)g->gw[0]);
    VITC_TRY(vitc__buf_reserve(&ss->t2t_buf, cv.used));
    float *base = ss->t2t_buf.p;
    for (int s = 0; s < 2; s++) {
        const size_t *o = off[record ? s : 0];
        float **dst[16] = {&t[s].cols, &t[s].ln, &t[s].qkv, &t[s].o, &t[s].lse, &t[s].a, &t[s].h,
                           &t[s].hpre, &t[s].hact, &t[s].out, &t[s].kqv, &t[s].kp, &t[s].qp,
                           &t[s].ksum, &t[s].D, &t[s].kptv};
        for (int k = 0; k < 16; k++) *dst[k] = base + o[k];
        if (!record)
            t[s].lse = NULL;
    }
    *cols3 = record ? base + o3 : t[0].cols;
    return VITC_OK;
}

vitc_status vitc__t2t_tokens(const vitc_vit *m, vitc__session *ss, const float *images, int64_t B,
                             int64_t H, int64_t W, float *out) {
    int64_t Cin = m->cfg.in_channels, T = m->t2t_dim, C = m->cfg.hidden_dim;
    t2t_geo g = t2t_geometry(m, H, W);
    /* A training forward keeps every stage for vitc__t2t_tokens_backward. */
    int record = ss->a.training && m->t2t == VIT_NAMES_T2T_TRANSFORMER;
    t2t_acts t[2];
    float *cols3;
    VITC_TRY(t2t_carve(m, ss, B, &g, record, t, &cols3));
    vitc__nn_unfold(t[0].cols, images, 0, B, Cin, H, W, 7, 4, 2);               /* soft_split0 */
    VITC_TRY(t2t_stage(m, ss, 0, B, g.L[0], &t[0]));                                /* attention1 */
    vitc__nn_unfold(t[1].cols, t[0].out, 1, B, T, g.gh[1], g.gw[1], 3, 2, 1);     /* soft_split1 */
    VITC_TRY(t2t_stage(m, ss, 1, B, g.L[1], &t[1]));                                /* attention2 */
    vitc__nn_unfold(cols3, t[1].out, 1, B, T, g.gh[2], g.gw[2], 3, 2, 1);         /* soft_split2 */
    vitc__linear(out, C, cols3, g.d[2], m->w.t2t_proj_w, m->w.t2t_proj_b, NULL, 0, B * g.L[2], C,
                 g.d[2]);
    return VITC_OK;
}

/* One transformer-mode stage backward: dx [B*L, dim] from dout [B*L, T];
 * sc: dh, dhid, da, datt [B*L, T], dqkv [B*L, 3T], dln [B*L, dim], stats. */
static vitc_status t2t_stage_backward(vitc_vit *m, vitc__session *ss, int s, int64_t B, int64_t L,
                                      const t2t_acts *t, const float *dout, float *dx, float *sc) {
    const vitc__t2t_stage *w = &m->w.t2t[s];
    vitc__t2t_stage *gw = &m->g.t2t[s];
    int64_t dim = t2t_stage_dim(m, s), T = m->t2t_dim, M = B * L;
    float *dh = sc, *dhid = dh + M * T, *da = dhid + M * T, *datt = da + M * T;
    float *dqkv = datt + M * T, *dln = dqkv + 3 * M * T, *stats = dln + M * dim;
    vitc__nn_mlp f = t2t_mlp(m, w), gf = t2t_mlp(m, gw);
    vitc__nn_mlp_backward(&f, &gf, dh, 0.0f, dout, t->h, t->hpre, t->hact, M, dhid);
    vitc__layernorm_backward_res(da, dout, gw->n2_w, gw->n2_b, dh, t->a, w->n2_w, M, T,
                                 m->cfg.norm_eps, stats);
    vitc__nn_attn p = t2t_attn(m, w, s, B, L), gp = t2t_attn(m, gw, s, B, L);
    vitc__nn_attn_rec r = {t->qkv, t->o, t->lse};
    VITC_TRY(vitc__nn_attn_backward(&p, &gp, dln, da, t->ln, &r, datt, dqkv, &ss->mask_buf));
    memset(dx, 0, (size_t)(M * dim) * sizeof(float));
    vitc__layernorm_backward(dx, gw->n1_w, gw->n1_b, dln, t->cols, w->n1_w, M, dim,
                             m->cfg.norm_eps, stats);
    return VITC_OK;
}

vitc_status vitc__t2t_tokens_backward(vitc_vit *m, vitc__session *ss, const float *dout, int64_t B,
                                      int64_t H, int64_t W) {
    if (m->t2t != VIT_NAMES_T2T_TRANSFORMER)
        return vitc__err(VITC_ERR_UNSUPPORTED, "vitc_vit_backward: T2T-ViT's Token_performer "
                         "stages (tokens_type \"performer\") have no backward; the transformer "
                         "mode (t2t_vit_t_*) trains");
    int64_t T = m->t2t_dim, C = m->cfg.hidden_dim;
    t2t_geo g = t2t_geometry(m, H, W);
    t2t_acts t[2];
    float *cols3;
    VITC_TRY(t2t_carve(m, ss, B, &g, 1, t, &cols3)); /* the recorded regions (same sizes: no move) */
    /* Scratch: dcols [B*L0, max d], d(stage out) [B*L0, T], the stage's (9 T + 2 dim + 2) rows. */
    int64_t M0 = B * g.L[0], dmax = g.d[0] > g.d[1] ? g.d[0] : g.d[1];
    size_t n;
    if (!vitc__mul_size((size_t)M0, (size_t)(3 * dmax + 8 * T + 2), &n))
        return vitc__err(VITC_ERR_NOMEM, "T2T-ViT backward overflows");
    vitc__buf buf = {0};
    VITC_TRY(vitc__buf_reserve(&buf, n));
    float *dcols = buf.p, *dx = dcols + M0 * dmax, *sc = dx + M0 * T;
    vitc_status st = VITC_OK;
    /* project: dcols3 = dout W; the rows fold back onto stage 2's tokens */
    vitc__linear_backward(dcols, g.d[2], 0.0f, m->g.t2t_proj_w, m->g.t2t_proj_b, dout, C, cols3,
                          g.d[2], m->w.t2t_proj_w, B * g.L[2], C, g.d[2]);
    for (int s = 1; s >= 0 && st == VITC_OK; s--) {
        memset(dx, 0, (size_t)(B * g.L[s] * T) * sizeof(float));
        vitc__nn_fold(dx, dcols, 1, B, T, g.gh[s + 1], g.gw[s + 1], 3, 2, 1);
        st = t2t_stage_backward(m, ss, s, B, g.L[s], &t[s], dx, dcols, sc);
    }
    vitc__buf_free(&buf);
    return st;
}
