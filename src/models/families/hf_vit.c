/*
 * hf_vit.c — transformers' ViT and DeiT (model_type "vit", "deit"):
 * ViTModel / ViTForImageClassification, DeiTModel / DeiTForImageClassification
 * / ...WithTeacher (class + distillation tokens; with teacher, the mean of
 * the class and distillation heads). Separate query/key/value fused into
 * the [3C, C] in_proj rows, eps from the config (1e-12 by default), the
 * position grid resampled as transformers does (hub.c reads them).
 */
#include "../family.h"

static const char *const vit_layer[VIT_L_COUNT] = {
    VITC__BLOCK_NAMES("layernorm_before", "attention.attention.%s.weight",
                      "attention.attention.%s.bias", "attention.output.dense",
                      "layernorm_after", "intermediate.dense", "output.dense"),
};

static const vitc__hub_names hf_vit_types[] = {
    {.type = "vit", .family = "hf-vit", .prefix = "vit.", .kind = HUB_KIND_VIT,
     .model = vitc__hf_vit_model_names, .layer = vit_layer, .layer_fmt = "encoder.layer.%d.",
     .qkv = vitc__qkv_long, .eps = 1e-12f, .patch = 16, .pos = VIT_POS_HALF_PIXEL},
    {.type = "deit", .family = "hf-deit", .prefix = "deit.", .kind = HUB_KIND_VIT,
     .model = vitc__hf_vit_model_names, .layer = vit_layer, .layer_fmt = "encoder.layer.%d.",
     .qkv = vitc__qkv_long, .eps = 1e-12f, .patch = 16, .dist = 1, .pos = VIT_POS_HALF_PIXEL},
};

/* the m->family strings of a saved model (vitc.family) */
static const char *const saved_names[] = {"hf-vit", "hf-deit", NULL};

/* ViTModel -> ViTForImageClassification (classifier on the final-normed
 * class token); DeiT with teacher keeps both heads, both fresh. */
static vitc__vit_head hf_vit_new_head(const vitc_vit *m) {
    return m->head == VIT_HEAD_MEAN2 ? VIT_HEAD_MEAN2 : VIT_HEAD_CLS;
}

/* _init_weights: Linear weight normal_(0, initializer_range = 0.02, the
 * configs' default), bias zeros. */
const vitc__family vitc__family_hf_vit = {
    .name = "hf-vit",
    VITC__HUB_FAMILY(hf_vit_types, saved_names),
    .new_head = hf_vit_new_head,
    .head_std = 0.02,
};
