/*
 * file_config.c — the config of a single-file ViT checkpoint in torchvision's
 * or timm's names (vitc writes these too): inferred from the tensors'
 * shapes, then a named preset's structure (torchvision's vit_b_16 ...,
 * timm's vit_base_patch16_224 ...), then the file's own vitc.config, field
 * by field. The families torchvision.c and timm.c give their names.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "family.h"
#include "vit_config.h"

/* vitc.config's values, labels included: ImageNet-21k's 21,843 labels fit
 * six times over, and jansson's tree for the most stays near 15 MB. */
#define VIT_MAX_CONFIG_ITEMS (1 << 17)

/* The first MLP Linear's weight, which the depth and mlp_dim are read from. */
static const char *ckpt_fc1(const vitc__ckpt_names *n) {
    return n->fc1_w ? n->fc1_w : n->layer[VIT_L_FC1_W];
}

/* "blocks.%d." + tail of layer l into buf. */
static const char *ckpt_layer(const vitc__ckpt_names *n, int l, const char *tail, char *buf,
                              size_t cap) {
    int k = snprintf(buf, cap, n->layer_fmt, l);
    if (k >= 0 && (size_t)k < cap)
        snprintf(buf + k, cap - (size_t)k, "%s", tail);
    return buf;
}

/* The named architectures (--arch), torchvision's and timm's. */
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

/* Fill what the tensors tell: every field but num_heads (left 0) and the
 * eps/mean/std defaults of the spelling. A field whose tensor is missing or
 * odd stays 0; the table check later names that tensor. n_prefix: the
 * position rows before the patch grid (2 with DeiT's distillation token). */
static void vit_infer(const vitc_safetensors *st, const vitc__ckpt_names *nm, int n_prefix,
                      vitc_vit_config *c) {
    char name[160];
    const int64_t *s;
    memset(c, 0, sizeof *c);
    c->norm_eps = 1e-6f;
    vit_set_norm(c, nm->timm);
    if ((s = vitc__vit_file_shape(st, nm->model[VIT_P_CLS], 3)))
        c->hidden_dim = (int)s[2];
    if ((s = vitc__vit_file_shape(st, nm->model[VIT_P_CONV_W], 4))) {
        c->in_channels = (int)s[1];
        c->patch_size = (int)s[2];
        if (!c->hidden_dim)
            c->hidden_dim = (int)s[0];
    }
    if ((s = vitc__vit_file_shape(st, nm->model[VIT_P_POS], 3)) && c->patch_size) {
        int64_t g = (int64_t)llround(sqrt((double)(s[1] - n_prefix)));
        if (g * g == s[1] - n_prefix && g * c->patch_size <= VIT_MAX_DIM)
            c->image_size = (int)(g * c->patch_size);
    }
    if ((s = vitc__vit_file_shape(st, nm->model[VIT_P_HEAD_W], 2)))
        c->num_classes = (int)s[0];
    if ((s = vitc__vit_file_shape(st, ckpt_layer(nm, 0, ckpt_fc1(nm), name, sizeof name), 2)))
        c->mlp_dim = (int)s[0];
    int d = 0;
    while (d < VIT_MAX_DEPTH &&
           vitc_safetensors_find(st, ckpt_layer(nm, d, nm->layer[VIT_L_QKV_W], name,
                                                sizeof name)) >= 0)
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

/* Keep the labels array (checked against num_classes). */
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

vitc_status vitc__ckpt_metadata(vitc_vit *m, const char *text) {
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

static int vit_preset_fits(const vit_preset *p, const vitc_vit_config *c) {
    return p->patch_size == c->patch_size && p->hidden_dim == c->hidden_dim &&
           p->depth == c->depth && p->num_heads == c->num_heads && p->mlp_dim == c->mlp_dim &&
           c->in_channels == 3;
}

/* The name a person would use for this config, or "custom". vit_b_16 and
 * vit_base_patch16_224 share shapes: the asked name, else the one of the
 * file's key spelling. */
static void vit_name_arch(vitc_vit *m, const vit_preset *asked, int timm) {
    snprintf(m->arch, sizeof m->arch, "custom");
    if (m->n_prefix != 1 || m->layer_scale || m->head != VIT_HEAD_CLS)
        return; /* the presets have one class token, a head and no layer scale */
    if (asked && vit_preset_fits(asked, &m->cfg)) {
        snprintf(m->arch, sizeof m->arch, "%s", asked->name);
        return;
    }
    for (int i = 0; i < VIT_N_PRESETS; i++) {
        const vit_preset *p = &vit_presets[i];
        if (vit_preset_fits(p, &m->cfg) && p->timm == timm) {
            snprintf(m->arch, sizeof m->arch, "%s", p->name);
            return;
        }
    }
}

/* ------------------------------------------------------------------ */
/* Loading                                                            */
/* ------------------------------------------------------------------ */

/* The options the names show, as timm writes them: DeiT's distillation
 * token (its position row before the grid) with head_dist, whose eval
 * logits are the mean of both heads; layer scale (ls1/ls2: DINOv2 and
 * timm's init_values models); no head tensors at all (num_classes=0, a
 * backbone whose output is the embedding). */
static void vit_detect_options(vitc_vit *m, const vitc_safetensors *st,
                               const vitc__ckpt_names *n) {
    char name[160];
    m->n_dist = vitc_safetensors_find(st, n->model[VIT_P_DIST]) >= 0;
    m->n_prefix = m->n_cls + m->n_dist;
    m->layer_scale = vitc_safetensors_find(st, ckpt_layer(n, 0, n->layer[VIT_L_LS1], name,
                                                              sizeof name)) >= 0;
    if (vitc_safetensors_find(st, n->model[VIT_P_HEAD_W]) < 0 &&
        vitc_safetensors_find(st, n->model[VIT_P_HEAD_B]) < 0)
        m->head = VIT_HEAD_NONE;
    else
        m->head = m->n_dist ? VIT_HEAD_MEAN2 : VIT_HEAD_CLS;
}

/* Config: inferred from the tensors, then a preset's structure, then the
 * file's own vitc.config, field by field. */
static vitc_status vit_resolve_config(vitc_vit *m, const vitc_safetensors *st, const char *arch,
                                      const vitc__ckpt_names *n,
                                      const vit_preset **asked) {
    vitc_vit_config *c = &m->cfg;
    int headless = m->head == VIT_HEAD_NONE;
    vit_infer(st, n, m->n_prefix, c);
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
        const int64_t *s = vitc__vit_file_shape(st, n->model[VIT_P_POS], 3);
        int64_t g = s ? (int64_t)llround(sqrt((double)(s[1] - m->n_prefix))) : 0;
        c->image_size =
            g > 0 && g * g == s[1] - m->n_prefix ? (int)(g * p->patch_size) : p->image_size;
        if (!c->num_classes && !headless)
            c->num_classes = 1000;
        vit_set_norm(c, p->timm);
        c->norm_eps = 1e-6f;
    }
    if (meta) {
        vitc_status s = vitc__ckpt_metadata(m, meta);
        if (s != VITC_OK)
            return s;
    }
    /* The tensors of a missing field's source name it; say which. */
    char name[160];
    if (!c->hidden_dim || !c->patch_size || !c->in_channels)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer the patch "
                         "embedding)", n->model[VIT_P_CONV_W]);
    if (!c->image_size)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer image_size)",
                         n->model[VIT_P_POS]);
    if (!c->num_classes && !headless)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer num_classes)",
                         n->model[VIT_P_HEAD_W]);
    if (!c->depth || !c->mlp_dim)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer the blocks)",
                         ckpt_layer(n, 0, c->depth ? ckpt_fc1(n) : n->layer[VIT_L_QKV_W], name,
                                        sizeof name));
    if (!c->num_heads) {
        if (c->hidden_dim % 64)
            return vitc__err(VITC_ERR_INVALID_ARG,
                             "cannot infer num_heads for hidden_dim %d (not a multiple of 64): "
                             "give an architecture or a vitc.config", c->hidden_dim);
        c->num_heads = c->hidden_dim / 64;
    }
    return vitc__vit_check_config(c, headless);
}

vitc_status vitc__ckpt_configure(vitc_vit *m, const vitc_safetensors *st, const char *arch,
                                 const vitc__ckpt_names *n) {
    const vit_preset *asked = NULL;
    vit_detect_options(m, st, n);
    VITC_TRY(vit_resolve_config(m, st, arch, n, &asked));
    vit_name_arch(m, asked, n->timm);
    return VITC_OK;
}

void vitc__ckpt_name_arch(vitc_vit *m, int timm) { vit_name_arch(m, NULL, timm); }

/* ------------------------------------------------------------------ */
/* A saved model of another family (vitc.family)                      */
/* ------------------------------------------------------------------ */

/* vitc.family of st as a JSON object, or NULL. */
static json_t *saved_family(const vitc_safetensors *st) {
    const char *text = st ? vitc_safetensors_get_metadata(st, "vitc.family") : NULL;
    json_error_t jerr;
    json_t *o = text && vitc__json_items(text, strlen(text)) <= 4096 ? json_loads(text, 0, &jerr)
                                                                      : NULL;
    if (o && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

int vitc__ckpt_saved(const vitc__src *src, const char *const *families) {
    json_t *o = saved_family(src->st);
    const char *f = json_string_value(json_object_get(o, "family"));
    int hit = 0;
    for (int i = 0; f && families[i]; i++) hit |= !strcmp(f, families[i]);
    json_decref(o);
    return hit;
}

/* o[key] as an int in [lo, hi] into *v; absent: *v stays. */
static vitc_status saved_int(json_t *o, const char *key, int lo, int hi, int *v) {
    json_t *j = json_object_get(o, key);
    if (!j)
        return VITC_OK;
    if (!json_is_integer(j) || json_integer_value(j) < lo || json_integer_value(j) > hi)
        return vitc__err(VITC_ERR_FORMAT, "vitc.family: \"%s\" must be an integer in [%d, %d]",
                         key, lo, hi);
    *v = (int)json_integer_value(j);
    return VITC_OK;
}

static vitc_status saved_processor(vitc__hf_proc *p, json_t *pp) {
    memset(p, 0, sizeof *p);
    if (!pp)
        return VITC_OK;
    struct { const char *key; int hi; int *v; } f[] = {
        {"convert_rgb", 1, &p->convert_rgb}, {"do_resize", 1, &p->do_resize},
        {"size_h", 16384, &p->size_h}, {"size_w", 16384, &p->size_w},
        {"shortest", 16384, &p->shortest}, {"resample", 3, &p->resample},
        {"do_crop", 1, &p->do_crop}, {"crop_h", 16384, &p->crop_h},
        {"crop_w", 16384, &p->crop_w}, {"do_rescale", 1, &p->do_rescale},
        {"do_normalize", 1, &p->do_normalize},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        VITC_TRY(saved_int(pp, f[i].key, 0, f[i].hi, f[i].v));
    json_t *r = json_object_get(pp, "rescale");
    p->rescale = json_number_value(r);
    p->mean[0] = p->std[0] = NAN;
    vitc__json_floats3(json_object_get(pp, "mean"), p->mean);
    vitc__json_floats3(json_object_get(pp, "std"), p->std);
    if (!(p->rescale > 0.0) || !isfinite(p->rescale))
        return vitc__err(VITC_ERR_FORMAT, "vitc.family: the processor's rescale must be a "
                         "positive number");
    for (int i = 0; i < 3; i++)
        if (!(p->std[i] > 0.0f) || !isfinite(p->mean[i]) || !isfinite(p->std[i]))
            return vitc__err(VITC_ERR_FORMAT, "vitc.family: the processor's mean/std[%d] is "
                             "invalid", i);
    p->present = 1;
    return VITC_OK;
}

vitc_status vitc__ckpt_saved_configure(vitc_vit *m, vitc__src *src) {
    json_t *o = saved_family(src->st);
    const char *meta = vitc_safetensors_get_metadata(src->st, "vitc.config");
    if (!o || !meta) {
        json_decref(o);
        return vitc__err(VITC_ERR_FORMAT, "vitc.family without vitc.config");
    }
    const char *fam = json_string_value(json_object_get(o, "family"));
    const char *arch = json_string_value(json_object_get(o, "arch"));
    vitc__name_copy(m->family, sizeof m->family, fam);
    vitc__name_copy(m->arch, sizeof m->arch, arch ? arch : "custom");
    int head = m->head, embed_head = 0, pos = 0;
    struct { const char *key; int hi; int *v; } f[] = {
        {"n_cls", 1, &m->n_cls}, {"n_dist", 1, &m->n_dist}, {"n_reg", 1024, &m->n_reg},
        {"layer_scale", 1, &m->layer_scale}, {"swiglu", 1, &m->swiglu},
        {"pre_norm", 1, &m->pre_norm}, {"final_cls_only", 1, &m->final_cls_only},
        {"mlp_act", VIT_ACT_QUICK_GELU, &m->mlp_act}, {"head", VIT_HEAD_LINEAR, &head},
        {"embed_head", VIT_HEAD_LINEAR, &embed_head}, {"embed_dim", VIT_MAX_DIM, &m->embed_dim},
        {"pos_rule", VIT_POS_ANTIALIAS, &pos}, {"no_qkv_bias", 1, &m->no_qkv_bias},
    };
    vitc_status s = VITC_OK;
    for (size_t i = 0; s == VITC_OK && i < sizeof f / sizeof f[0]; i++)
        s = saved_int(o, f[i].key, 0, f[i].hi, f[i].v);
    json_t *as = json_object_get(o, "attn_scale");
    m->attn_scale = json_is_number(as) ? (float)json_number_value(as) : 0.0f;
    if (s == VITC_OK)
        s = saved_processor(&m->proc, json_object_get(o, "processor"));
    json_decref(o);
    VITC_TRY(s);
    if (!(m->attn_scale >= 0.0f) || !isfinite(m->attn_scale) ||
        (head == VIT_HEAD_LINEAR && (embed_head == VIT_HEAD_LINEAR || m->embed_dim < 1)))
        return vitc__err(VITC_ERR_FORMAT, "vitc.family: inconsistent head or attention scale");
    m->head = (vitc__vit_head)head;
    m->embed_head = (vitc__vit_head)embed_head;
    m->pos_rule = (vitc__vit_pos_rule)pos;
    m->n_prefix = m->n_cls + m->n_dist + m->n_reg;
    m->naming = VIT_NAMES_TORCHVISION;
    /* the config and labels, every field from vitc.config */
    vitc_vit_config *c = &m->cfg;
    memset(c, 0, sizeof *c);
    VITC_TRY(vitc__ckpt_metadata(m, meta));
    if (m->proc.present) /* the processor's statistics are the model's */
        for (int i = 0; i < 3; i++) c->mean[i] = m->proc.mean[i], c->std[i] = m->proc.std[i];
    return vitc__vit_check_config(c, m->head == VIT_HEAD_NONE || m->head == VIT_HEAD_MAP);
}
