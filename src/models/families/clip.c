/*
 * clip.c — CLIP's vision tower in its three spellings: transformers'
 * (model_type "clip" with vision_config, or "clip_vision_model"),
 * open_clip's and OpenAI's (visual.*, a file or open_clip's Hub layout
 * with open_clip_config.json), and timm's (vit_base_patch16_clip_224.*:
 * norm_pre, blocks.N, head = the projection transposed). The embedding is
 * the projection of the post-normed class token (the pre-norm on the
 * embeddings: ln_pre / pre_layrnorm / norm_pre).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../family.h"

/* The rows every CLIP spelling has (a "%s" takes the tower's prefix). */
#define CLIP_NAMES(cls, conv_w, pos, pre, ln, proj)                                           \
    [VIT_P_CLS] = cls, [VIT_P_CONV_W] = conv_w, [VIT_P_POS] = pos, VITC__WB(VIT_P_PRE, pre), \
        VITC__WB(VIT_P_LN, ln), [VIT_P_HEAD_W] = proj

static const char *const clip_model[VIT_P_T2T0] = {
    CLIP_NAMES("%sembeddings.class_embedding", "%sembeddings.patch_embedding.weight",
               "%sembeddings.position_embedding.weight", "%spre_layrnorm", "%spost_layernorm",
               "visual_projection.weight"),
};

/* open_clip's (and OpenAI's) names, visual.*; its proj is [width, embed],
 * applied as x @ proj. No patch-conv bias, no projection bias: zeros. */
static const char *const openclip_model[VIT_P_T2T0] = {
    CLIP_NAMES("%sclass_embedding", "%sconv1.weight", "%spositional_embedding", "%sln_pre",
               "%sln_post", "%sproj"),
};
static const char *const openclip_layer[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("ln_1", "attn.in_proj_weight", "attn.in_proj_bias", "attn.out_proj",
                      "ln_2", "mlp.c_fc", "mlp.c_proj"),
};
/* ... and timm's (vit_base_patch16_clip_224.openai: _convert_openai_clip's
 * renames; head = proj transposed, its bias zeros). */
static const char *const timmclip_model[VIT_P_T2T0] = {
    CLIP_NAMES("%scls_token", "%spatch_embed.proj.weight", "%spos_embed", "%snorm_pre",
               "%snorm", "%shead.weight"),
    [VIT_P_HEAD_B] = "%shead.bias",
};

/* CLIPModel's file nests its config in vision_config; "vision_model." is a
 * module name, not a stripped prefix. */
static const vitc__hub_names clip_types[] = {
    {.type = "clip", .vision_type = "clip_vision_model", .family = "hf-clip",
     .prefix = "vision_model.", .kind = HUB_KIND_CLIP, .model = clip_model,
     .layer = vitc__hf_clip_layer_names, .layer_fmt = "encoder.layers.%d.",
     .qkv = vitc__qkv_short, .eps = 1e-5f, .patch = 32, .pos = VIT_POS_HALF_PIXEL},
};
static const vitc__hub_names openclip = {
    .type = "open_clip", .family = "open-clip", .prefix = "visual.", .kind = HUB_KIND_CLIP,
    .model = openclip_model, .layer = openclip_layer, .layer_fmt = "transformer.resblocks.%d.",
    .eps = 1e-5f, .patch = 16, .pos = VIT_POS_HALF_PIXEL, .proj_t = 1};
static const vitc__hub_names timmclip = {
    .type = "timm_clip", .family = "timm-clip", .prefix = "", .kind = HUB_KIND_CLIP,
    .model = timmclip_model, .layer = vitc__timm_layer_names, .layer_fmt = "blocks.%d.",
    .eps = 1e-5f, .patch = 16, .pos = VIT_POS_HALF_PIXEL};

/* A single file in open_clip's / OpenAI's names (visual.*): 1; in timm's
 * (norm_pre, blocks.N): 2; else 0. */
static int clip_names(const vitc_safetensors *st) {
    if (!st)
        return 0;
    if (vitc_safetensors_find(st, "visual.conv1.weight") >= 0)
        return 1;
    if (vitc_safetensors_find(st, "norm_pre.weight") >= 0 &&
        vitc_safetensors_find(st, "cls_token") >= 0 &&
        vitc_safetensors_find(st, "blocks.0.attn.qkv.weight") >= 0)
        return 2;
    return 0;
}

/* the m->family strings of a saved model (vitc.family) */
static const char *const saved_names[] = {"hf-clip", "open-clip", "timm-clip", NULL};

static int clip_detect(const vitc__src *src) {
    return vitc__hub_family_detect(&vitc__family_clip, src) || src->open_clip_dir ||
           (src->path && clip_names(src->st));
}

static vitc_status clip_names_build(vitc_vit *m, vitc__src *src, int timm) {
    const char *dir = src->dir;
    json_t *cfg = src->aux;
    vitc__shards *h = &src->shards;
    const vitc__hub_names *fam = timm ? &timmclip : &openclip;
    const char *pre = fam->prefix;
    vitc_vit_config *c = &m->cfg;
    char name[200];
    const float *d;
    int nd;
    const int64_t *sh;
    memset(c, 0, sizeof *c);
    snprintf(name, sizeof name, fam->model[VIT_P_CONV_W], pre);
    if (!vitc__shards_find(h, name, &d, &nd, &sh) || nd != 4 || sh[2] != sh[3] || sh[0] < 1 ||
        sh[0] > VIT_MAX_DIM || sh[1] < 1 || sh[1] > 64 || sh[2] < 1 || sh[2] > 4096)
        return vitc__err(VITC_ERR_SHAPE, "missing or malformed tensor %s (expected [width, "
                         "channels, patch, patch])", name);
    c->hidden_dim = (int)sh[0], c->in_channels = (int)sh[1], c->patch_size = (int)sh[2];
    snprintf(name, sizeof name, fam->model[VIT_P_POS], pre);
    int64_t n = 0, g = 0;
    if (vitc__shards_find(h, name, &d, &nd, &sh) && (nd == 2 || nd == 3) && sh[nd - 2] > 1 &&
        sh[nd - 2] <= VIT_MAX_DIM) {
        n = sh[nd - 2] - 1;
        g = (int64_t)llround(sqrt((double)n));
    }
    if (!g || g * g != n || g * c->patch_size > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_SHAPE, "missing or malformed tensor %s (expected [1 + g*g, "
                         "%d] positions of a square grid)", name, c->hidden_dim);
    c->image_size = (int)(g * c->patch_size);
    int depth = 0;
    for (;; depth++) {
        int k = snprintf(name, sizeof name, "%s", pre);
        k += snprintf(name + k, sizeof name - (size_t)k, fam->layer_fmt, depth);
        snprintf(name + k, sizeof name - (size_t)k, "%s", fam->layer[VIT_L_QKV_W]);
        if (depth >= VIT_MAX_DEPTH || !vitc__shards_find(h, name, &d, &nd, &sh))
            break;
    }
    int k = snprintf(name, sizeof name, "%s", pre);
    k += snprintf(name + k, sizeof name - (size_t)k, fam->layer_fmt, 0);
    snprintf(name + k, sizeof name - (size_t)k, "%s", fam->layer[VIT_L_FC1_W]);
    if (!depth || !vitc__shards_find(h, name, &d, &nd, &sh) || nd != 2 || sh[0] < 1 || sh[0] > VIT_MAX_DIM)
        return vitc__err(VITC_ERR_KEY, "missing or malformed tensor %s (cannot infer the blocks)",
                         name);
    c->depth = depth, c->mlp_dim = (int)sh[0];
    json_t *mc = json_object_get(cfg, "model_cfg"), *pc = json_object_get(cfg, "pretrained_cfg");
    json_t *hw = json_object_get(json_object_get(mc, "vision_cfg"), "head_width");
    int64_t head_width = json_is_integer(hw) ? json_integer_value(hw) : 64;
    if (head_width < 1 || c->hidden_dim % head_width)
        return vitc__err(VITC_ERR_SHAPE, "CLIP width %d is not a multiple of the head width "
                         "%lld (open_clip's head_width, 64 unless its config says)", c->hidden_dim,
                         (long long)head_width);
    c->num_heads = (int)(c->hidden_dim / head_width);
    c->norm_eps = fam->eps;
    int quick = 1;
    if (cfg && !timm) {
        quick = json_is_true(json_object_get(mc, "quick_gelu"));
    } else if (cfg) {
        json_t *a = json_object_get(cfg, "architecture"), *t = json_object_get(pc, "tag");
        quick = (json_is_string(a) && strstr(json_string_value(a), "quickgelu")) ||
                (json_is_string(t) && strstr(json_string_value(t), "openai"));
    }
    m->mlp_act = quick ? VIT_ACT_QUICK_GELU : VIT_ACT_GELU;
    m->n_cls = m->n_prefix = 1;
    m->pre_norm = 1;
    m->final_cls_only = !timm; /* open_clip's ln_post acts on the pooled token; timm's norm on all */
    m->pos_rule = fam->pos;
    m->naming = VIT_NAMES_TORCHVISION;
    snprintf(m->family, sizeof m->family, "%s", fam->family);
    snprintf(name, sizeof name, fam->model[VIT_P_HEAD_W], pre);
    m->head = VIT_HEAD_NONE;
    if (vitc__shards_find(h, name, &d, &nd, &sh)) {
        int64_t C = c->hidden_dim, K = nd == 2 ? sh[fam->proj_t ? 1 : 0] : 0;
        if (nd != 2 || sh[fam->proj_t ? 0 : 1] != C || K < 1 || K > VIT_MAX_DIM)
            return vitc__err(VITC_ERR_SHAPE, "tensor %s: expected %s", name,
                             fam->proj_t ? "[width, embed_dim]" : "[embed_dim, width]");
        c->num_classes = (int)K;
        m->head = VIT_HEAD_PROJ;
    }
    VITC_TRY(vitc__hub_processor(m, dir));
    /* CLIP's processor at the model's own size, with the config's statistics */
    vitc__hf_proc *p = &m->proc;
    char *pp = vitc__hub_join(dir, "preprocessor_config.json");
    int has_pp = pp && vitc__hub_exists(pp);
    free(pp);
    if (!has_pp) {
        /* open_clip's transform ends in convert("RGB"): alpha dropped */
        p->convert_rgb = 0;
        p->shortest = p->crop_h = p->crop_w = c->image_size;
        json_t *src = timm ? pc : json_object_get(cfg, "preprocess_cfg");
        vitc__json_floats3(json_object_get(src, "mean"), p->mean);
        vitc__json_floats3(json_object_get(src, "std"), p->std);
        for (int i = 0; i < 3; i++) {
            if (!(p->std[i] > 0.0f) || !isfinite(p->mean[i]))
                return vitc__err(VITC_ERR_FORMAT, "the config's mean/std[%d] = %g/%g is invalid",
                                 i, (double)p->mean[i], (double)p->std[i]);
            c->mean[i] = p->mean[i], c->std[i] = p->std[i];
        }
    }
    src->names = fam;
    src->pre = pre;
    src->mean2 = 0;
    src->qkv_bias = 1;
    json_t *a = json_object_get(cfg, "architecture");
    vitc__name_copy(m->arch, sizeof m->arch,
                    timm && json_is_string(a) ? json_string_value(a) : fam->type);
    return VITC_OK;
}


static vitc_status clip_configure(vitc_vit *m, vitc__src *src) {
    if (vitc__hub_family_detect(&vitc__family_clip, src))
        return vitc__hub_family_configure(&vitc__family_clip, m, src);
    int timm = !src->open_clip_dir && clip_names(src->st) == 2;
    if (!src->shards.n) {
        /* The file again as the Hub reads it (OpenAI's int tensors listed,
         * each tensor read when taken): its names are not the table's. */
        vitc_safetensors_free(src->own);
        src->own = NULL, src->st = NULL, src->adopt = 0;
        VITC_TRY(vitc__shards_open(&src->shards, src->dir, src->weights));
    }
    /* the config beside the file: timm's config.json, open_clip_config.json */
    char *cp = vitc__hub_join(src->dir, timm ? "config.json" : "open_clip_config.json");
    vitc_status s = cp ? VITC_OK : vitc__err(VITC_ERR_NOMEM, "out of memory");
    if (s == VITC_OK && vitc__hub_exists(cp))
        s = vitc__hub_read_json(cp, &src->aux);
    free(cp);
    return s == VITC_OK ? clip_names_build(m, src, timm) : s;
}

/* A fresh head: a linear classifier over the (projected) embedding, its
 * weight normal_(0, 0.02), bias zeros. */
const vitc__family vitc__family_clip = {
    .name = "clip",
    .detect = clip_detect,
    .configure = clip_configure,
    VITC__HUB_FAMILY(clip_types, saved_names),
    .fresh_head = VIT_HEAD_LINEAR,
    .head_std = 0.02,
};
